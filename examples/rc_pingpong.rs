//! An RC ping-pong over the connection manager, written against the
//! prelude: two soft HCAs, a listen on B that accepts, a connect from A
//! that answers the reply with the RTU, one SEND each way with the data
//! checked, disconnect, and a close that finds nothing left.
//!
//! `cargo run --example rc_pingpong`

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;

const SERVICE: u64 = 0x1000_0000_0000_0042;

/// Poll `cq` until one completion arrives (or two seconds pass).
fn one_completion(al: &Al, cq: Handle<Cq>) -> Result<Wc> {
    let mut wc = [Wc::default()];
    let deadline = Instant::now() + Duration::from_secs(2);
    while cq.poll(al, &mut wc)? == 0 {
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
        let ca = al.open_ca(&provider, guid)?;
        let pd = ca.alloc_pd(&al)?;
        let cq = ca.create_cq(&al, 16)?;
        let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
        let buf = RegisteredBuffer::new(64);
        let mr = pd.register(&al, &buf, Access::LOCAL_WRITE)?;
        Ok((ca, cq, qp, buf, mr.keys(&al)?.0))
    };
    let (_ca_a, cq_a, qp_a, buf_a, lkey_a) = side(0xa)?;
    let (ca_b, cq_b, qp_b, buf_b, lkey_b) = side(0xb)?;

    // B listens and accepts on its QP; both sides report "Established".
    let (tx, established) = mpsc::channel::<&'static str>();
    let (inst, tx_b) = (Arc::clone(&al), tx.clone());
    let on_request: ListenHandler = Arc::new(move |_listen, cep, _request| {
        cep.accept(
            &inst,
            qp_b,
            &AcceptReply::default().private_data(b"welcome"),
        )
        .expect("accept");
    });
    let passive: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send("B");
        }
    });
    ca_b.listen(&al, 1, SERVICE, on_request, passive)?;

    // A connects to B's port (LID 2) and sends the RTU on the reply.
    let inst = Arc::clone(&al);
    let active: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => cep.rtu(&inst, b"thanks").expect("rtu"),
        Event::Established { .. } => {
            let _ = tx.send("A");
        }
        _ => {}
    });
    let request = ConnectRequest::new(SERVICE, 2).private_data(b"hello");
    let cep = qp_a.connect(&al, &request, active)?;
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
        src.fill(byte)?;
        let recv = [Sge {
            addr: 0,
            length: 64,
            lkey: lkey_dst,
        }];
        to.post_recv(
            &al,
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
        from.post_send(&al, &[SendWr::new(1, SendOp::Send, &send)])?;
        let wc = one_completion(&al, cq_dst)?;
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        assert!(dst.to_vec().iter().all(|&b| b == byte), "data differs");
        one_completion(&al, cq_src)?;
        println!("{byte:#04x}: 64 bytes sent and checked");
    }

    cep.disconnect(&al, b"bye")?;
    let stats = al.close()?;
    println!("closed: {stats}");
    assert!(stats.is_clean());
    Ok(())
}
