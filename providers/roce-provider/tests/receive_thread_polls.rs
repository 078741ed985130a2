//! A port's receive thread steps aside (naps) while an application
//! busy-polls the device's CQs, leaving the datagrams to the poller. Polls
//! made on the provider's own threads must never count as that: a
//! completion hook or a CM round served on the receive thread polls a CQ
//! or two per message and then goes back to its socket. Counted, a stream
//! of messages made the receive thread nap for a poller that was not
//! there, and the next message waited out the nap (100 us to 1.6 ms).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use provider::{CompletionHook, CqArm, Device, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use roce_provider::{RoceCq, RoceDevice};

use common::{cq, devices, hooked_pair, wait, HookedPair};

/// Empty polls the hook makes per completion: more than a run the
/// provider takes for busy-polling.
const EMPTY_POLLS: usize = 64;

fn naps(d: &RoceDevice) -> u64 {
    d.port_counters(1).unwrap().rx_thread_naps
}

#[test]
fn polls_made_on_a_receive_thread_never_make_it_step_aside() {
    let (a, b) = devices();
    // The hook polls an empty CQ of B many times in a row, as fast as it
    // can: what a busy poller looks like, but on the receive thread that
    // delivered the completion.
    let target: Arc<OnceLock<(RoceDevice, RoceCq)>> = Arc::new(OnceLock::new());
    let fired = Arc::new(AtomicUsize::new(0));
    let threads = Arc::new(Mutex::new(Vec::<String>::new()));
    let hook: CompletionHook = {
        let (target, fired, threads) = (target.clone(), fired.clone(), threads.clone());
        Arc::new(move || {
            if let Some((dev, empty)) = target.get() {
                let mut wc = [Wc::default(); 4];
                for _ in 0..EMPTY_POLLS {
                    assert_eq!(dev.poll_cq(empty, &mut wc).unwrap(), 0);
                }
                let name = std::thread::current().name().unwrap_or("").to_string();
                threads.lock().unwrap().push(name);
            }
            fired.fetch_add(1, Ordering::SeqCst);
        })
    };
    let HookedPair {
        ca,
        cb,
        qa,
        qb,
        lkeys: [la, lb],
        mrs,
    } = hooked_pair(&a, &b, hook);
    let _ = target.set((b.clone(), cq(&b)));
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: 64,
            lkey,
        }]
    };

    let naps_before = naps(&b);
    const ROUNDS: u64 = 20;
    for round in 0..ROUNDS {
        let rsge = sge(lb);
        b.post_recv(
            &qb,
            &[RecvWr {
                wr_id: round,
                sg_list: &rsge,
            }],
        )
        .unwrap();
        b.arm_cq(&cb, CqArm::NextCompletion).unwrap();
        let before = fired.load(Ordering::SeqCst);
        let ssge = sge(la);
        a.post_send::<()>(&qa, &[SendWr::new(round, SendOp::Send, &ssge)], &|_| None)
            .unwrap();
        // This thread polls B only once the hook has run, and then finds
        // the completion at once (a poll that finds something never
        // counts as busy-polling).
        let end = Instant::now() + Duration::from_secs(10);
        while fired.load(Ordering::SeqCst) == before {
            assert!(Instant::now() < end, "round {round}: the hook never ran");
            std::thread::sleep(Duration::from_micros(50));
        }
        let mut wc = [Wc::default(); 1];
        assert_eq!(b.poll_cq(&cb, &mut wc).unwrap(), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(wait(&a, &ca, 1)[0].status, WcStatus::Success);
    }
    // The premise: the hook ran on B's receive thread every time.
    let names = threads.lock().unwrap().clone();
    assert_eq!(names.len(), ROUNDS as usize);
    assert!(
        names.iter().all(|n| n.starts_with("roce-b-p")),
        "the hook ran on {names:?}"
    );
    assert_eq!(
        naps(&b) - naps_before,
        0,
        "B's receive thread stepped aside for polls made on itself"
    );
    drop(mrs);
}

#[test]
fn an_application_busy_polling_makes_the_receive_thread_step_aside() {
    // The other side of the rule above (and proof that the counter
    // counts): an application thread spinning on an empty CQ of B.
    // The receive thread blocks in its socket with no timeout, so it
    // sees the polling when a datagram wakes it: one (any: an empty one,
    // dropped as truncated) every 20 ms while the thread has not napped.
    let (_a, b) = devices();
    let c = cq(&b);
    let poke = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = b.local_addr(1).unwrap();
    let before = naps(&b);
    let end = Instant::now() + Duration::from_secs(10);
    let mut poked = Instant::now();
    let mut wc = [Wc::default(); 1];
    while naps(&b) == before {
        assert!(
            Instant::now() < end,
            "B's receive thread never stepped aside"
        );
        assert_eq!(b.poll_cq(&c, &mut wc).unwrap(), 0);
        if poked.elapsed() > Duration::from_millis(20) {
            poke.send_to(&[], to).unwrap();
            poked = Instant::now();
        }
        std::thread::yield_now();
    }
    // And it takes the socket back once the polling stops.
    std::thread::sleep(Duration::from_millis(10));
    let settled = naps(&b);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(naps(&b), settled, "still napping 20 ms after the polling");
}
