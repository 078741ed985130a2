// NOT BUILT HERE. The program of `examples/rc_pingpong.rs`, written against the API as it
// was before issue 13 (commit 27b5989), kept to show what the facade changed. It builds and
// runs at that commit: `git worktree add /tmp/old 27b5989`, copy this file to
// `/tmp/old/examples/`, then `cargo run --example rc_pingpong_old_api` there.
//
//! An RC ping-pong over the connection manager, written against the
//! layer crates' free functions: two soft HCAs, a listen on B that accepts,
//! a connect from A that answers the reply with the RTU, one SEND each way
//! with the data checked, disconnect, and a close that finds nothing left.
//!
//! `cargo run --example rc_pingpong_old_api`

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ibal::cep::cm::{self, AcceptReply, CmHandler, ConnectRequest, ListenHandler};
use ibal::cep::proto::Event;
use ibal::hca::verbs::{self, Cq};
use ibal::hca::{
    Access, Fabric, HcaConfig, QpType, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, SoftProvider,
    Wc, WcStatus,
};
use ibal::qp::{create_qp, post_recv, post_send, QpCreate};
use ibal::{Al, Error, Handle, Result};

const SERVICE: u64 = 0x1000_0000_0000_0042;

/// Poll `cq` until one completion arrives (or two seconds pass).
fn one_completion(al: &Al, cq: Handle<Cq>) -> Result<Wc> {
    let mut wc = [Wc::default()];
    let deadline = Instant::now() + Duration::from_secs(2);
    while verbs::poll_cq(al, cq, &mut wc)? == 0 {
        if Instant::now() > deadline {
            return Err(Error::Timeout("no completion".into()));
        }
        std::thread::yield_now();
    }
    Ok(wc[0])
}

fn main() -> Result<()> {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
    fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
    let provider = SoftProvider::new(fabric);
    let al = Al::open()?;

    // One side per HCA: a CA, a PD, a CQ, an RC QP and a registered buffer.
    let side = |guid| -> Result<_> {
        let ca = verbs::open_ca(al.instance(), &provider, guid)?;
        let pd = verbs::alloc_pd(al.instance(), ca)?;
        let cq = verbs::create_cq(al.instance(), ca, 16, None, None)?;
        let qp = create_qp(al.instance(), pd, QpCreate::new(QpType::Rc, cq))?;
        let buf = RegisteredBuffer::new(64);
        let mr = verbs::register_mr(al.instance(), pd, &buf, 0, 64, 0, Access::LOCAL_WRITE)?;
        Ok((ca, cq, qp, buf, al.resolve(mr)?.lkey()))
    };
    let (_ca_a, cq_a, qp_a, buf_a, lkey_a) = side(0xa)?;
    let (ca_b, cq_b, qp_b, buf_b, lkey_b) = side(0xb)?;

    // B listens and accepts on its QP; both sides report "Established".
    let (tx, established) = mpsc::channel::<&'static str>();
    let (inst, tx_b) = (Arc::clone(al.instance()), tx.clone());
    let on_request: ListenHandler = Arc::new(move |_listen, cep, _request| {
        let reply = AcceptReply {
            private_data: b"welcome".to_vec(),
            ..AcceptReply::default()
        };
        cm::accept(&inst, cep, qp_b, &reply).expect("accept");
    });
    let passive: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send("B");
        }
    });
    cm::listen(al.instance(), ca_b, 1, SERVICE, on_request, passive)?;

    // A connects to B's port (LID 2) and sends the RTU on the reply.
    let inst = Arc::clone(al.instance());
    let active: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => cm::rtu(&inst, cep, b"thanks").expect("rtu"),
        Event::Established { .. } => {
            let _ = tx.send("A");
        }
        _ => {}
    });
    let request = ConnectRequest {
        private_data: b"hello".to_vec(),
        ..ConnectRequest::new(SERVICE, 2)
    };
    let cep = cm::connect(al.instance(), qp_a, &request, active)?;
    for _ in 0..2 {
        let who = established
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| Error::Timeout("no connection".into()))?;
        println!("{who}: established");
    }

    // A SEND from A to B, then one back, each checked byte for byte.
    for (from, to, src, dst, lkey_src, lkey_dst, cq_src, cq_dst, byte) in [
        (
            qp_a, qp_b, &buf_a, &buf_b, lkey_a, lkey_b, cq_a, cq_b, 0xa5u8,
        ),
        (qp_b, qp_a, &buf_b, &buf_a, lkey_b, lkey_a, cq_b, cq_a, 0x5a),
    ] {
        src.fill(byte);
        let recv = [Sge {
            addr: 0,
            length: 64,
            lkey: lkey_dst,
        }];
        post_recv(
            &al,
            to,
            &[RecvWr {
                wr_id: 2,
                sg_list: &recv,
            }],
        )?;
        let send = [Sge {
            addr: 0,
            length: 64,
            lkey: lkey_src,
        }];
        post_send(&al, from, &[SendWr::new(1, SendOp::Send, &send)])?;
        let wc = one_completion(&al, cq_dst)?;
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        assert!(dst.to_vec().iter().all(|&b| b == byte), "data differs");
        one_completion(&al, cq_src)?;
        println!("{byte:#04x}: 64 bytes sent and checked");
    }

    cm::disconnect(&al, cep, b"bye")?;
    let stats = al.close()?;
    println!("closed: {stats}");
    assert!(stats.is_clean());
    Ok(())
}
