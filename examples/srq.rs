//! A shared receive queue: B's two RC QPs receive through one SRQ, so B
//! posts its receives once, to the SRQ, not per QP. A connects a QP to
//! each of them and sends on both; every receive completion names the QP
//! the message came in on (`wc.qp_num`), and each message is checked.
//!
//! `cargo run --example srq`

mod common;
use common::{connect_qps, end, one_completion, two_hcas};
use ibal::prelude::*;

const SLOT: usize = 64;
const MESSAGES: usize = 6;

fn main() -> Result<()> {
    let provider = two_hcas()?;
    let al = Al::open()?;

    // A: two RC QPs on one CA, PD and CQ.
    let a = end(&al, &provider, 0xa, MESSAGES * SLOT, |cq| {
        QpCreate::new(QpType::Rc, cq)
    })?;
    let a_qps = [a.qp, a.pd.create_qp(&al, QpCreate::new(QpType::Rc, a.cq))?];

    // B: one SRQ in its PD, two RC QPs that receive through it.
    let ca_b = al.open_ca(&provider, 0xb)?;
    let pd_b = ca_b.alloc_pd(&al)?;
    let cq_b = ca_b.create_cq(&al, 64)?;
    let srq = pd_b.create_srq(
        &al,
        SrqInit {
            max_wr: 16,
            max_sge: 1,
        },
    )?;
    let with_srq = QpCreate::new(QpType::Rc, cq_b).srq(srq);
    let b_qps = [
        pd_b.create_qp(&al, with_srq)?,
        pd_b.create_qp(&al, with_srq)?,
    ];
    let buf_b = RegisteredBuffer::new(MESSAGES * SLOT);
    let (lkey_b, _) = pd_b.register(&al, &buf_b, Access::LOCAL_WRITE)?.keys(&al)?;

    let ceps = [
        connect_qps(&al, a_qps[0], ca_b, b_qps[0], 0x1000_0000_0000_0201)?,
        connect_qps(&al, a_qps[1], ca_b, b_qps[1], 0x1000_0000_0000_0202)?,
    ];

    // Receives go to the SRQ, once: one slot per message, wr_id = slot.
    let sges: Vec<[Sge; 1]> = (0..MESSAGES)
        .map(|i| {
            [Sge {
                addr: (i * SLOT) as u64,
                length: SLOT as u32,
                lkey: lkey_b,
            }]
        })
        .collect();
    let recvs: Vec<RecvWr> = (0..MESSAGES)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sg_list: &sges[i],
        })
        .collect();
    srq.post_recv(&al, &recvs)?;

    // A sends alternately on its two QPs; message m names its QP.
    let message = |m: usize| format!("message {m} on A's QP {}", m % 2).into_bytes();
    for m in 0..MESSAGES {
        let body = message(m);
        a.buf.write(m * SLOT, &body)?;
        let sge = a.sge((m * SLOT) as u64, body.len() as u32);
        a_qps[m % 2].post_send(&al, &[SendWr::new(m as u64, SendOp::Send, &sge)])?;
        one_completion(&al, a.cq)?;
    }

    // Each completion says which of B's QPs took the message (and so
    // which of A's sent it), and which SRQ slot it landed in.
    let b_qpns = [b_qps[0].query(&al)?.qpn, b_qps[1].query(&al)?.qpn];
    let mut per_qp = [0; 2];
    let mut seen = [false; MESSAGES];
    for _ in 0..MESSAGES {
        let wc = one_completion(&al, cq_b)?;
        assert_eq!(wc.opcode, WcOpcode::Recv);
        let qp = b_qpns
            .iter()
            .position(|&n| n == wc.qp_num)
            .expect("one of B's QPs");
        let slot = wc.wr_id as usize * SLOT;
        let got = buf_b.to_vec()[slot..slot + wc.byte_len as usize].to_vec();
        let text = String::from_utf8(got).expect("text");
        // "message {m} on A's QP {m % 2}": the whole text, byte for byte.
        let m: usize = text
            .split(' ')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .expect("m");
        assert_eq!(text.as_bytes(), message(m), "slot {}", wc.wr_id);
        assert_eq!(m % 2, qp, "message {m} came in on B's QP {qp}");
        assert!(!std::mem::replace(&mut seen[m], true), "message {m} twice");
        per_qp[qp] += 1;
        println!(
            "SRQ slot {}: B's QP {:#x} got \"{text}\"",
            wc.wr_id, wc.qp_num
        );
    }
    assert_eq!(per_qp, [MESSAGES / 2; 2]);

    for cep in ceps {
        cep.disconnect(&al, &[])?;
    }
    assert!(al.close()?.is_clean());
    Ok(())
}
