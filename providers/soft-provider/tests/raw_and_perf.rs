//! Zero-copy raw regions (the `unsafe` contract) and speed checks.

mod common;
use common::*;
use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::*;

#[test]
fn raw_region_receives_rdma_write_and_is_released_on_deregistration() {
    let (_f, a, b) = two();
    let (qa, _qb) = rc_pair(&a, &b, ALL);
    let mut target = vec![0u8; 1024];
    // SAFETY: `target` lives until the end of the test, is not moved or
    // resized, does not overlap another region, and is only touched by the
    // provider (through `mr`) until `mr` is dropped below.
    let region = unsafe { RawRegion::new(target.as_mut_ptr(), target.len()) }.unwrap();
    let mr = b.pd.register_region(region, ALL).unwrap();
    assert_eq!(mr.iova(), target.as_ptr() as u64);
    let src = RegisteredBuffer::from_vec(pattern(100, 8));
    let smr = a.pd.register(&src, ALL).unwrap();
    qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: mr.iova() + 500,
            rkey: mr.rkey(),
        },
        &[smr.sge(0, 100)],
    )])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    let mut check = [0u8; 100];
    mr.read(500, &mut check).unwrap();
    assert_eq!(&check[..], &pattern(100, 8)[..]);
    // Out of bounds on the raw MR is refused with nothing written.
    let (qa2, _qb2) = rc_pair(&a, &b, ALL);
    qa2.post_send(&[SendWr::new(
        2,
        SendOp::Write {
            remote_addr: mr.iova() + 1000,
            rkey: mr.rkey(),
        },
        &[smr.sge(0, 100)],
    )])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::RemoteAccessError);
    let rkey = mr.rkey();
    let iova = mr.iova();
    drop(mr);
    // After deregistration the memory is ours again...
    assert_eq!(&target[500..600], &pattern(100, 8)[..]);
    assert!(target[..500].iter().chain(&target[600..]).all(|&x| x == 0));
    // ...and the stale rkey no longer reaches it.
    let (qa3, _qb3) = rc_pair(&a, &b, ALL);
    qa3.post_send(&[SendWr::new(
        3,
        SendOp::Write {
            remote_addr: iova,
            rkey,
        },
        &[smr.sge(0, 100)],
    )])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::RemoteAccessError);
    assert!(target[..500].iter().all(|&x| x == 0));
}

#[test]
fn raw_region_arguments_are_checked() {
    let mut x = [0u8; 4];
    // SAFETY: null pointers are refused before any access.
    assert!(unsafe { RawRegion::new(std::ptr::null_mut(), 4) }.is_err());
    // SAFETY: a zero length is refused before any access.
    assert!(unsafe { RawRegion::new(x.as_mut_ptr(), 0) }.is_err());
    // SAFETY: `x` outlives the region, which is dropped unregistered.
    let r = unsafe { RawRegion::new(x.as_mut_ptr(), 4) }.unwrap();
    assert_eq!(r.len(), 4);
}

#[test]
fn concurrent_writes_in_both_directions_do_not_deadlock() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let abuf = RegisteredBuffer::new(1 << 16);
    let bbuf = RegisteredBuffer::new(1 << 16);
    let amr = a.pd.register(&abuf, ALL).unwrap();
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    std::thread::scope(|s| {
        for (q, from, to, cq) in [(&qa, &amr, &bmr, &a.scq), (&qb, &bmr, &amr, &b.scq)] {
            s.spawn(move || {
                for i in 0..2000u64 {
                    q.post_send(&[SendWr::new(
                        i,
                        SendOp::Write {
                            remote_addr: to.iova(),
                            rkey: to.rkey(),
                        },
                        &[from.sge(0, 1 << 16)],
                    )
                    .unsignaled()])
                        .unwrap();
                    while cq.poll_one().is_some() {}
                }
            });
        }
    });
    assert_eq!(qa.query().state, QpState::Rts);
    assert_eq!(qb.query().state, QpState::Rts);
}

/// Bandwidth and latency against memcpy and an mpsc round trip. Run with
/// `cargo test -p hca --release --test raw_and_perf -- --ignored --nocapture`.
#[test]
#[ignore]
fn speed() {
    use std::time::Instant;
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    for size in [64 << 10, 1 << 20] {
        let src = RegisteredBuffer::from_vec(pattern(size, 1));
        let dst = RegisteredBuffer::new(size);
        let smr = a.pd.register(&src, ALL).unwrap();
        let dmr = b.pd.register(&dst, ALL).unwrap();
        let iters = (1 << 30) / size;
        let t = Instant::now();
        for i in 0..iters {
            qa.post_send(&[SendWr::new(
                i as u64,
                SendOp::Write {
                    remote_addr: 0,
                    rkey: dmr.rkey(),
                },
                &[smr.sge(0, size as u32)],
            )])
            .unwrap();
            poll1(&a.scq);
        }
        let rdma = t.elapsed();
        let s = vec![1u8; size];
        let mut d = vec![0u8; size];
        let t = Instant::now();
        for _ in 0..iters {
            d.copy_from_slice(std::hint::black_box(&s));
            std::hint::black_box(&mut d);
        }
        let memcpy = t.elapsed();
        println!(
            "WRITE {size:>8} B: {:.2} GB/s, memcpy {:.2} GB/s, ratio {:.2}",
            (iters * size) as f64 / rdma.as_secs_f64() / 1e9,
            (iters * size) as f64 / memcpy.as_secs_f64() / 1e9,
            memcpy.as_secs_f64() / rdma.as_secs_f64()
        );
    }
    // 64-byte SEND post + poll (both sides) vs an mpsc round trip.
    let sbuf = RegisteredBuffer::new(64);
    let rbuf = RegisteredBuffer::new(64);
    let smr = a.pd.register(&sbuf, ALL).unwrap();
    let rmr = b.pd.register(&rbuf, ALL).unwrap();
    let n = 200_000;
    let t = Instant::now();
    for i in 0..n {
        qb.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[rmr.sge(0, 64)],
        }])
        .unwrap();
        qa.post_send(&[SendWr::new(i, SendOp::Send, &[smr.sge(0, 64)])])
            .unwrap();
        poll1(&a.scq);
        poll1(&b.rcq);
    }
    let send = t.elapsed() / n as u32;
    let (tx, rx) = std::sync::mpsc::channel::<[u8; 64]>();
    let (tx2, rx2) = std::sync::mpsc::channel::<[u8; 64]>();
    let echo = std::thread::spawn(move || {
        while let Ok(m) = rx.recv() {
            if tx2.send(m).is_err() {
                break;
            }
        }
    });
    let m = 20_000;
    let t = Instant::now();
    for _ in 0..m {
        tx.send([0; 64]).unwrap();
        rx2.recv().unwrap();
    }
    let mpsc = t.elapsed() / m;
    drop(tx);
    echo.join().unwrap();
    println!("64 B SEND post+poll: {send:?}; mpsc round trip: {mpsc:?}");
}
