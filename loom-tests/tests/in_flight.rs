//! loom models of buffers in flight (`docs/memory.md`): an application
//! write that the library accepted is never overwritten afterwards by a
//! receive that was posted over the same bytes, on the real soft provider
//! (both send paths) compiled with loom's primitives.
#![cfg(ibal_loom)]

use loom::thread;

use al::Error;
use provider::RegisteredBuffer;
use provider::{
    Access, AvAttr, CqInit, Mtu, QpCaps, QpInit, QpModify, QpState, QpType, RecvWr, SendOp, SendWr,
    Sge,
};
use soft_provider::{Fabric, HcaConfig, SoftHca, SoftQp};

mod common;
use common::model;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

fn rc_qp(hca: &SoftHca, pd: &soft_provider::SoftPd) -> SoftQp {
    let cq = || {
        hca.create_cq(CqInit {
            capacity: 4,
            ..CqInit::default()
        })
        .unwrap()
    };
    let (scq, rcq) = (cq(), cq());
    hca.create_qp(
        pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        },
    )
    .unwrap()
}

fn connect(qp: &SoftQp, dlid: u16, dqpn: u32) {
    qp.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(ALL),
    )
    .unwrap();
    qp.modify(
        &QpModify::to(QpState::Rtr)
            .av(AvAttr::lid(1, dlid))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(dqpn)
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    qp.modify(
        &QpModify::to(QpState::Rts)
            .sq_psn(0)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    )
    .unwrap();
}

/// A SEND races the application's write over the bytes its receive names:
/// if the write was accepted, the bytes are the application's at the end;
/// if it was refused (the receive was still posted), they are the SEND's.
fn write_vs_delivery(batched: bool) {
    let fabric = Fabric::new();
    fabric.set_batched_sends(batched);
    let a = fabric.add_hca(HcaConfig::new(0xa0, &[1])).unwrap();
    let b = fabric.add_hca(HcaConfig::new(0xb0, &[2])).unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (qa, qb) = (rc_qp(&a, &pda), rc_qp(&b, &pdb));
    connect(&qa, 2, qb.qpn());
    connect(&qb, 1, qa.qpn());
    let src = RegisteredBuffer::from_vec(vec![0xaa; 8]);
    let smr = pda.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(8);
    let dmr = pdb.register(&dst, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 8)],
    }])
    .unwrap();
    let sge: Sge = smr.sge(0, 8);
    let sender = thread::spawn(move || {
        qa.post_send(&[SendWr::new(2, SendOp::Send, &[sge])])
            .unwrap();
        qa
    });
    let wrote = dst.write(0, &[0x55; 8]);
    let _qa = sender.join().unwrap();
    let end = dst.to_vec();
    match wrote {
        Ok(()) => assert_eq!(end, [0x55; 8], "an accepted write was overwritten"),
        Err(Error::ResourceBusy(_)) => assert_eq!(end, [0xaa; 8], "the SEND did not land"),
        Err(e) => panic!("unexpected error {e}"),
    }
    drop((qb, smr, dmr));
}

#[test]
fn app_write_vs_receive_batched_path() {
    model("app_write_vs_receive_batched_path", || {
        write_vs_delivery(true)
    });
}

#[test]
fn app_write_vs_receive_general_path() {
    model("app_write_vs_receive_general_path", || {
        write_vs_delivery(false)
    });
}
