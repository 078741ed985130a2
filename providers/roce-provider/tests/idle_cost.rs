//! What idle connections cost a device: nothing per tick. The timer
//! thread examines only the timers that come due, however many QPs are
//! armed (`RoceDevice::timer_stats`), and an idle device's threads do not
//! wake at all (the timer thread's wake-ups, the receive threads'
//! `rx_thread_wakeups`).

mod common;

use std::time::{Duration, Instant};

use provider::{Device, QpType, RecvWr, SendOp, SendWr, WcStatus};
use roce_provider::RoceDevice;

use common::{connect_with_timeout, connected_qps, cq, devices, qp, wait};

fn rx_wakeups(d: &RoceDevice) -> u64 {
    d.port_counters(1).unwrap().rx_thread_wakeups
}

/// Two devices with a connected pair that exchanged a SEND, then idle:
/// over 300 ms neither device's timer thread nor its receive thread wakes.
/// (Before, the timer thread slept at most 100 ms with nothing armed and
/// the receive threads' sockets had a 100 ms read timeout: 3 wake-ups of
/// each per device in 300 ms.)
#[test]
fn an_idle_device_s_threads_do_not_wake() {
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let (qa, qb) = connected_qps((&a, &pa, &ca), (&b, &pb, &cb));
    // A zero-length SEND into a posted receive: it arms A's retransmit
    // timer, and its ACK disarms it.
    b.post_recv(
        &qb,
        &[RecvWr {
            wr_id: 9,
            sg_list: &[],
        }],
    )
    .unwrap();
    let wr = SendWr::<()>::new(1, SendOp::Send, &[]);
    a.post_send(&qa, &[wr], &|_| None).unwrap();
    assert_eq!(wait(&a, &ca, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&b, &cb, 1)[0].status, WcStatus::Success);
    // The entry the SEND pushed (its retransmit deadline, 67 ms out) is
    // popped when it comes due, found disarmed, and not pushed again.
    std::thread::sleep(Duration::from_millis(200));
    let before = [&a, &b].map(|d| (d.timer_stats().wakeups, rx_wakeups(d)));
    std::thread::sleep(Duration::from_millis(300));
    let after = [&a, &b].map(|d| (d.timer_stats().wakeups, rx_wakeups(d)));
    assert_eq!(
        before, after,
        "(timer, receive) thread wake-ups of A and B over 300 ms idle"
    );
    assert_eq!(a.timer_stats().entries, 0, "{:?}", a.timer_stats());
}

/// 20,000 QPs with a retransmit timer armed 17 s out (their SENDs went to
/// a QP number B does not have) and 10 with a 1 ms timeout: over the run
/// the timer thread examines the entries of the 10 (each retransmits up
/// to 7 times, then fails), never the 20,000; re-arming 1,000 of those
/// (another SEND each: the deadline moves later) pushes nothing. With
/// the scan this replaced every wake-up looked at all 20,010 armed QPs.
#[test]
fn twenty_thousand_armed_qps_cost_the_timer_thread_nothing_until_due() {
    const IDLE: usize = 20_000;
    const DUE: usize = 10;
    let (a, b) = devices();
    let pa = a.alloc_pd().unwrap();
    let ca = cq(&a);
    // Nobody answers: B has no QP with this number.
    let nobody = 0x00ab_cdef;
    let send = |q: &roce_provider::RoceQp, id: u64| {
        let wr = SendWr::<()>::new(id, SendOp::Send, &[]);
        a.post_send(q, &[wr], &|_| None).unwrap();
    };
    let t0 = Instant::now();
    let idle: Vec<_> = (0..IDLE)
        .map(|i| {
            let q = qp(&a, &pa, &ca, None);
            connect_with_timeout(&a, &q, &b, nobody, 22); // 17 s
            send(&q, i as u64);
            q
        })
        .collect();
    let made = t0.elapsed();
    let s0 = a.timer_stats();
    assert_eq!((s0.armed, s0.entries), (IDLE as u64, IDLE as u64), "{s0:?}");
    assert_eq!(s0.checks, 0, "nothing came due while they were made");
    for q in &idle[..1_000] {
        send(q, 1);
    }
    assert_eq!(
        a.timer_stats().entries,
        IDLE as u64,
        "a later deadline pushes nothing"
    );
    let retries = a.port_counters(1).unwrap().retries;
    let due: Vec<_> = (0..DUE)
        .map(|i| {
            let q = qp(&a, &pa, &ca, None);
            connect_with_timeout(&a, &q, &b, nobody, 8); // 1 ms, 7 retries
            send(&q, 1_000_000 + i as u64);
            q
        })
        .collect();
    let failed = wait(&a, &ca, DUE);
    assert!(
        failed.iter().all(|w| w.status == WcStatus::RetryExceeded),
        "{failed:?}"
    );
    // The last completion may be seen before the port's counters have
    // what its drive counted: let them settle.
    let settle = Instant::now() + Duration::from_secs(5);
    while a.port_counters(1).unwrap().retries - retries < (DUE * 7) as u64
        && Instant::now() < settle
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s1 = a.timer_stats();
    assert!(
        a.port_counters(1).unwrap().retries - retries >= (DUE * 7) as u64,
        "the short timers retransmitted"
    );
    assert!(s1.fired >= (DUE * 8) as u64, "{s1:?}");
    // Each fired timeout pops its entry once; a few are popped early or
    // twice (a deadline that moved): nowhere near the 20,000 idle ones.
    assert!(
        s1.checks <= (DUE * 8 * 3) as u64,
        "{s1:?} (made the idle QPs in {made:?})"
    );
    assert!(
        made < Duration::from_secs(15),
        "the idle timers must not come due: {made:?}"
    );
    assert_eq!(a.query_qp(&idle[0]).unwrap().qp_type, QpType::Rc);
    drop(due);
}
