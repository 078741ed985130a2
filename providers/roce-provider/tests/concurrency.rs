//! Several threads at once on one pair of devices: each thread its own RC
//! pair, multi-packet SENDs, WRITEs and READs checked byte for byte, while
//! the port threads deliver; then an SRQ shared by QPs fed from two
//! threads. Correctness under concurrency, not speed.

use std::sync::Arc;
use std::time::Duration;

use provider::{
    Device, QpModify, QpState, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, SrqInit, WcOpcode,
    WcStatus,
};
use roce_provider::RoceQp;

mod common;

use common::{connect, cq, devices, pattern, qp, wait, ALL};

#[test]
fn threads_with_their_own_pairs() {
    let (a, b) = devices();
    let (a, b) = (Arc::new(a), Arc::new(b));
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
                let (ca, cb) = (cq(&a), cq(&b));
                let (qa, qb) = (qp(&a, &pa, &ca, None), qp(&b, &pb, &cb, None));
                connect(&a, &qa, &b, b.qp_num(&qb));
                connect(&b, &qb, &a, a.qp_num(&qa));
                const LEN: usize = 5000; // five packets at MTU 1024
                let src = RegisteredBuffer::new(LEN);
                let dst = RegisteredBuffer::new(LEN);
                let back = RegisteredBuffer::new(LEN);
                let ms = a.register_mr(&pa, &src, 0, LEN, 0, ALL).unwrap();
                let mb = a.register_mr(&pa, &back, 0, LEN, 0, ALL).unwrap();
                let md = b.register_mr(&pb, &dst, 0, LEN, 0, ALL).unwrap();
                let (ks, kb, kd) = (a.mr_keys(&ms).0, a.mr_keys(&mb).0, b.mr_keys(&md).0);
                let sg = |k, len| {
                    [Sge {
                        addr: 0,
                        length: len,
                        lkey: k,
                    }]
                };
                for i in 0..40u64 {
                    let data = pattern(LEN - i as usize, w * 1000 + i);
                    src.fill(0).unwrap();
                    src.write(0, &data).unwrap();
                    let n = data.len() as u32;
                    let rs = sg(kd, LEN as u32);
                    if i % 2 == 0 {
                        let r = [RecvWr {
                            wr_id: i,
                            sg_list: &rs,
                        }];
                        b.post_recv(&qb, &r).unwrap();
                    }
                    let ss = sg(ks, n);
                    let op = if i % 2 == 0 {
                        SendOp::Send
                    } else {
                        SendOp::Write {
                            remote_addr: 0,
                            rkey: kd,
                        }
                    };
                    let rsg = sg(kb, n);
                    let wrs = [
                        SendWr::new(i, op, &ss).unsignaled(),
                        SendWr::new(
                            i,
                            SendOp::Read {
                                remote_addr: 0,
                                rkey: kd,
                            },
                            &rsg,
                        ),
                    ];
                    a.post_send::<()>(&qa, &wrs, &|_| None).unwrap();
                    let wc = wait(&a, &ca, 1)[0];
                    assert_eq!(
                        (wc.wr_id, wc.status, wc.opcode),
                        (i, WcStatus::Success, WcOpcode::RdmaRead)
                    );
                    let mut got = vec![0; data.len()];
                    back.read(0, &mut got).unwrap();
                    assert_eq!(got, data, "worker {w} message {i}");
                    if i % 2 == 0 {
                        let r = wait(&b, &cb, 1)[0];
                        assert_eq!((r.wr_id, r.status, r.byte_len), (i, WcStatus::Success, n));
                    }
                }
                // Receives still posted are flushed, in order.
                let rs = sg(kd, 8);
                for id in 100..103 {
                    let r = [RecvWr {
                        wr_id: id,
                        sg_list: &rs,
                    }];
                    b.post_recv(&qb, &r).unwrap();
                }
                a.modify_qp(&qa, &QpModify::to(QpState::Err)).unwrap();
                b.modify_qp(&qb, &QpModify::to(QpState::Err)).unwrap();
                let f: Vec<_> = wait(&b, &cb, 3)
                    .iter()
                    .map(|w| (w.wr_id, w.status))
                    .collect();
                let want: Vec<_> = (100..103).map(|i| (i, WcStatus::WrFlushError)).collect();
                assert_eq!(f, want);
            })
        })
        .collect();
    for h in workers {
        h.join().unwrap();
    }
}

#[test]
fn an_srq_fed_from_two_threads() {
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let srq = b
        .create_srq(
            &pb,
            SrqInit {
                max_wr: 64,
                max_sge: 1,
            },
        )
        .unwrap();
    let pairs: Vec<(RoceQp, RoceQp)> = (0..2)
        .map(|_| {
            let qa = qp(&a, &pa, &ca, None);
            let qb = qp(&b, &pb, &cb, Some(&srq));
            connect(&a, &qa, &b, b.qp_num(&qb));
            connect(&b, &qb, &a, a.qp_num(&qa));
            (qa, qb)
        })
        .collect();
    const N: u64 = 100;
    let dst = RegisteredBuffer::new(64 * 2 * N as usize);
    let md = b.register_mr(&pb, &dst, 0, dst.len(), 0, ALL).unwrap();
    let kd = b.mr_keys(&md).0;
    let src = RegisteredBuffer::from_vec(pattern(64, 3));
    let ms = a.register_mr(&pa, &src, 0, 64, 0, ALL).unwrap();
    let ks = a.mr_keys(&ms).0;
    std::thread::scope(|s| {
        // The receiver keeps the SRQ stocked (RNR covers the gaps).
        s.spawn(|| {
            for i in 0..2 * N {
                let rs = [Sge {
                    addr: i * 64,
                    length: 64,
                    lkey: kd,
                }];
                while b
                    .post_srq_recv(
                        &srq,
                        &[RecvWr {
                            wr_id: i,
                            sg_list: &rs,
                        }],
                    )
                    .is_err()
                {
                    std::thread::yield_now();
                }
            }
        });
        for (qa, _) in &pairs {
            s.spawn(|| {
                let ss = [Sge {
                    addr: 0,
                    length: 64,
                    lkey: ks,
                }];
                for i in 0..N {
                    let wr = [SendWr::new(i, SendOp::Send, &ss).unsignaled()];
                    // A full send queue (sends held by RNR NAKs until the
                    // SRQ is stocked) refuses; try again.
                    loop {
                        match a.post_send::<()>(qa, &wr, &|_| None) {
                            Ok(()) => break,
                            Err(al::Error::InsufficientResources(_)) => {
                                std::thread::sleep(Duration::from_micros(200))
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let got = wait(&b, &cb, 2 * N as usize);
    assert!(got
        .iter()
        .all(|w| w.status == WcStatus::Success && w.byte_len == 64));
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..2 * N).collect::<Vec<_>>(),
        "each SRQ receive used once"
    );
    let all = dst.to_vec();
    for chunk in all.chunks(64) {
        assert_eq!(chunk, &pattern(64, 3)[..]);
    }
    drop(ca);
}
