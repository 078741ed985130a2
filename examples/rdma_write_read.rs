//! RDMA WRITE with immediate data and RDMA READ on a connected RC pair:
//! A writes into B's buffer and B learns of it from the immediate in its
//! receive completion; then A reads B's second half back.
//!
//! `cargo run --example rdma_write_read`

mod common;
use common::{connect, end, one_completion, two_hcas};
use ibal::prelude::*;

fn main() -> Result<()> {
    let provider = two_hcas()?;
    let al = Al::open()?;
    let a = end(&al, &provider, 0xa, 256, |cq| QpCreate::new(QpType::Rc, cq))?;
    let b = end(&al, &provider, 0xb, 256, |cq| QpCreate::new(QpType::Rc, cq))?;
    let cep = connect(&al, &a, &b, 0x1000_0000_0000_0101)?;

    // WRITE with immediate: the data lands in B's buffer at offset 0 and
    // consumes one receive, whose completion carries the immediate.
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 7,
            sg_list: &[],
        }],
    )?;
    a.buf.fill(0x11)?;
    let write = SendOp::WriteImm {
        remote_addr: 0,
        rkey: b.rkey,
        imm: 0xfeed,
    };
    a.qp.post_send(&al, &[SendWr::new(1, write, &a.sge(0, 128))])?;
    one_completion(&al, a.cq)?;
    let wc = one_completion(&al, b.cq)?;
    assert_eq!((wc.wr_id, wc.imm), (7, Some(0xfeed)));
    assert!(b.buf.to_vec()[..128].iter().all(|&x| x == 0x11));
    println!("WRITE with immediate {:#x}: 128 bytes landed", 0xfeed);

    // READ: B's second half (which B fills) comes back into A's.
    b.buf.write(128, &[0x22; 128])?;
    let read = SendOp::Read {
        remote_addr: 128,
        rkey: b.rkey,
    };
    a.qp.post_send(&al, &[SendWr::new(2, read, &a.sge(128, 128))])?;
    let wc = one_completion(&al, a.cq)?;
    assert_eq!(wc.byte_len, 128);
    assert!(a.buf.to_vec()[128..].iter().all(|&x| x == 0x22));
    println!("READ: 128 bytes came back");

    cep.disconnect(&al, &[])?;
    assert!(al.close()?.is_clean());
    Ok(())
}
