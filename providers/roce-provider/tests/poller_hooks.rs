//! A polling thread that takes a lone datagram drives its QP at once
//! (`QpInner::on_packet_and_drive`, called while the thread's receive
//! buffers are borrowed). The completion hooks that drive produces must
//! run only after those buffers are given back: a hook may poll a CQ of
//! another device, whose progress takes the same thread's buffers again.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use provider::{CompletionHook, CqArm, Device, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use roce_provider::{RoceCq, RoceDevice};

use common::{cq, devices, hooked_pair, wait, HookedPair};

#[test]
fn a_completion_hook_that_polls_another_device_runs_after_a_pollers_lone_datagram() {
    let (a, b) = devices();
    // The hook polls A's CQ: progress on A from inside B's poller.
    let target: Arc<OnceLock<(RoceDevice, RoceCq)>> = Arc::new(OnceLock::new());
    let fired = Arc::new(AtomicUsize::new(0));
    let hook: CompletionHook = {
        let (target, fired) = (Arc::clone(&target), Arc::clone(&fired));
        Arc::new(move || {
            if let Some((dev, cq)) = target.get() {
                let mut none = [Wc::default(); 1];
                dev.poll_cq(cq, &mut none).unwrap();
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
    let _ = target.set((a.clone(), cq(&a)));
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: 64,
            lkey,
        }]
    };

    for round in 0..3u64 {
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
        // Both devices busy-polled until their receive threads leave the
        // sockets to the pollers: B's poller takes A's SEND, alone, and
        // the hook's poll of A makes progress on A's port (a receive
        // thread waiting in A's socket would hold that port).
        let quiet = Instant::now() + Duration::from_millis(150);
        let mut none = [Wc::default(); 1];
        while Instant::now() < quiet {
            assert_eq!(b.poll_cq(&cb, &mut none).unwrap(), 0);
            assert_eq!(a.poll_cq(&ca, &mut none).unwrap(), 0);
            std::thread::yield_now();
        }
        let before = fired.load(Ordering::SeqCst);
        let ssge = sge(la);
        a.post_send::<()>(&qa, &[SendWr::new(round, SendOp::Send, &ssge)], &|_| None)
            .unwrap();
        assert_eq!(wait(&b, &cb, 1)[0].status, WcStatus::Success);
        let end = Instant::now() + Duration::from_secs(10);
        while fired.load(Ordering::SeqCst) == before {
            assert!(Instant::now() < end, "round {round}: the hook never ran");
            std::thread::yield_now();
        }
        assert_eq!(wait(&a, &ca, 1)[0].status, WcStatus::Success);
    }
    drop(mrs);
}
