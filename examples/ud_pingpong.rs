//! UD ping-pong between two soft HCAs: each side has an address vector to
//! the other and both QPs share a Q_Key. A sends a datagram, B sends back
//! exactly the bytes it received, several rounds, every byte checked.
//!
//! A UD receive buffer starts with 40 bytes for the GRH (IBTA 11.4.1.1):
//! the payload lands after them and the completion's length counts them.
//! Here the AVs are LID-routed, so no GRH is written there (`wc.grh` is
//! false) but the space is still taken.
//!
//! `cargo run --example ud_pingpong`

mod common;
use common::{end, one_completion, two_hcas, ud_ready, End};
use ibal::prelude::*;

const QKEY: u32 = 0x0011_2233;
const MSG: usize = 200;
/// Each buffer: the message to send, then a receive area (GRH + message).
const RECV_AT: usize = MSG;
const LEN: usize = MSG + GRH_SIZE + MSG;

/// Post one receive on `to`, send `MSG` bytes from `from`'s send area
/// through `av`, and return the receive's completion.
fn datagram(al: &Al, from: &End, to: &End, av: Handle<Av>) -> Result<Wc> {
    let recv = to.sge(RECV_AT as u64, (GRH_SIZE + MSG) as u32);
    to.qp.post_recv(
        al,
        &[RecvWr {
            wr_id: 20,
            sg_list: &recv,
        }],
    )?;
    let dest = UdDest {
        av: &av,
        remote_qpn: to.qp.query(al)?.qpn,
        remote_qkey: QKEY,
        pkey_index: 0,
    };
    let send = from.sge(0, MSG as u32);
    from.qp
        .post_send(al, &[SendWr::new(10, SendOp::Send, &send).to(dest)])?;
    let sent = one_completion(al, from.cq)?;
    assert_eq!((sent.wr_id, sent.opcode), (10, WcOpcode::Send));
    let wc = one_completion(al, to.cq)?;
    assert_eq!((wc.wr_id, wc.opcode, wc.grh), (20, WcOpcode::Recv, false));
    assert_eq!(wc.byte_len as usize, GRH_SIZE + MSG, "GRH space + payload");
    assert_eq!(wc.src_qp, from.qp.query(al)?.qpn);
    Ok(wc)
}

fn main() -> Result<()> {
    let provider = two_hcas()?;
    let al = Al::open()?;
    let a = end(&al, &provider, 0xa, LEN, |cq| QpCreate::new(QpType::Ud, cq))?;
    let b = end(&al, &provider, 0xb, LEN, |cq| QpCreate::new(QpType::Ud, cq))?;
    ud_ready(&al, a.qp, QKEY)?;
    ud_ready(&al, b.qp, QKEY)?;
    // Address vectors: A's to LID 2 (B), B's to LID 1 (A), each in its PD.
    let to_b = a.pd.create_av(&al, AvAttr::lid(1, 2))?;
    let to_a = b.pd.create_av(&al, AvAttr::lid(1, 1))?;

    for round in 0..8u8 {
        let ping: Vec<u8> = (0..MSG)
            .map(|i| (i as u8).wrapping_mul(31) ^ round)
            .collect();
        a.buf.write(0, &ping)?;
        let wc = datagram(&al, &a, &b, to_b)?;
        let got = b.buf.to_vec();
        assert_eq!(&got[RECV_AT + GRH_SIZE..], &ping[..], "ping {round}");

        // B echoes the payload it received (after the GRH space).
        b.buf.write(0, &got[RECV_AT + GRH_SIZE..])?;
        datagram(&al, &b, &a, to_a)?;
        assert_eq!(
            &a.buf.to_vec()[RECV_AT + GRH_SIZE..],
            &ping[..],
            "pong {round}"
        );
        assert_eq!(wc.slid, 1, "the ping came from A's LID");
        println!("round {round}: {MSG} bytes to B and back, every byte checked");
    }

    assert!(al.close()?.is_clean());
    Ok(())
}
