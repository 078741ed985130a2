//! The heap a connected RC QP of the provider holds, with 4-deep queues
//! and its receives posted (issue 28: a connection end should fit in
//! 3 KiB, all layers together), counted by a global allocator that adds
//! up the bytes asked for and given back.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use provider::{CqInit, Device, QpCaps, QpInit, QpType, RecvWr, RegisteredBuffer, Sge};

use common::{connect, devices, ALL};

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to `System` with the caller's arguments
// unchanged; the counter only observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is `System`'s.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `System` with layout `l` (every block
        // does: this allocator hands out only `System`'s).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as `dealloc` for `p` and `l`; `new` is the caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Heap bytes per connected RC QP (4-deep queues, 4 receives posted),
/// one end, the CQ and MR shared: 1,216 bytes, at most 1,250 (1,408
/// before the QP stopped keeping a copy of its transport's counters, its
/// SQD and READ queues became lazy and the transport's shared empty
/// message was made on first use).
#[test]
fn a_connected_qp_with_4_deep_queues_holds_little_heap() {
    const PAIRS: usize = 500;
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cq_init = CqInit {
        capacity: 4 * 2 * PAIRS as u32,
        ..CqInit::default()
    };
    let (ca, cb) = (
        a.create_cq(cq_init.clone()).unwrap(),
        b.create_cq(cq_init).unwrap(),
    );
    let buf = RegisteredBuffer::new(64);
    let (ma, mb) = (
        a.register_mr(&pa, &buf, 0, 64, 0, ALL).unwrap(),
        b.register_mr(&pb, &buf, 0, 64, 0, ALL).unwrap(),
    );
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let pair = || {
        let init = |cq| QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps,
            sq_sig_all: false,
        };
        let qa = a.create_qp(&pa, &init(&ca)).unwrap();
        let qb = b.create_qp(&pb, &init(&cb)).unwrap();
        connect(&a, &qa, &b, b.qp_num(&qb));
        connect(&b, &qb, &a, a.qp_num(&qa));
        for (d, q, key) in [(&a, &qa, a.mr_keys(&ma).0), (&b, &qb, b.mr_keys(&mb).0)] {
            let sg = [Sge {
                addr: 0,
                length: 64,
                lkey: key,
            }];
            let wrs: Vec<RecvWr> = (0..4)
                .map(|i| RecvWr {
                    wr_id: i,
                    sg_list: &sg,
                })
                .collect();
            d.post_recv(q, &wrs).unwrap();
        }
        (qa, qb)
    };
    // Warm up what grows once (maps, thread-local buffers).
    let warm: Vec<_> = (0..PAIRS).map(|_| pair()).collect();
    drop(warm);
    let before = LIVE.load(Ordering::Relaxed);
    let held: Vec<_> = (0..PAIRS).map(|_| pair()).collect();
    let per_end = (LIVE.load(Ordering::Relaxed) - before) / (2 * PAIRS as isize);
    eprintln!("heap per connected QP end: {per_end} bytes");
    assert!(per_end <= 1_250, "{per_end} bytes per QP end");
    // The provider's own accounting (`Device::qp_footprint`, what `perf
    // scale` reports) explains what one more connected pair takes: 3,056
    // bytes asked for, i.e. 1,528 per end, more than the average above,
    // which profits from what the 500 destroyed before left for reuse
    // (maps grown, buffers kept). The footprint counts glibc's blocks
    // (requests rounded up), hence the band.
    let before_one = LIVE.load(Ordering::Relaxed);
    let one = pair();
    let one_end = (LIVE.load(Ordering::Relaxed) - before_one) / 2;
    let footprint = a.qp_footprint(&one.0) as isize;
    eprintln!("one more connected QP end: {one_end} bytes; qp_footprint: {footprint} bytes");
    assert!(
        one_end <= footprint && footprint <= one_end * 115 / 100,
        "qp_footprint {footprint} bytes for {one_end} bytes measured"
    );
    drop(one);
    drop(held);
}
