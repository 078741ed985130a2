//! Both IB atomics on a connected RC pair: fetch-and-add and
//! compare-and-swap on an 8-byte counter in B's memory; each returns the
//! value it found into A's buffer.
//!
//! `cargo run --example atomics`

mod common;
use common::{connect, end, one_completion, two_hcas};
use ibal::prelude::*;

fn main() -> Result<()> {
    let provider = two_hcas()?;
    let al = Al::open()?;
    let a = end(&al, &provider, 0xa, 64, |cq| QpCreate::new(QpType::Rc, cq))?;
    let b = end(&al, &provider, 0xb, 64, |cq| QpCreate::new(QpType::Rc, cq))?;
    let cep = connect(&al, &a, &b, 0x1000_0000_0000_0102)?;
    let counter = |buf: &RegisteredBuffer| {
        let bytes: [u8; 8] = buf.to_vec()[..8].try_into().expect("8 bytes");
        u64::from_ne_bytes(bytes)
    };
    b.buf.write(0, &40u64.to_ne_bytes())?;

    let add = SendOp::FetchAdd {
        remote_addr: 0,
        rkey: b.rkey,
        add: 2,
    };
    a.qp.post_send(&al, &[SendWr::new(1, add, &a.sge(0, 8))])?;
    one_completion(&al, a.cq)?;
    assert_eq!((counter(&a.buf), counter(&b.buf)), (40, 42));
    println!("fetch-and-add 2: found 40, now 42");

    let cas = SendOp::CompareSwap {
        remote_addr: 0,
        rkey: b.rkey,
        compare: 42,
        swap: 7,
    };
    a.qp.post_send(&al, &[SendWr::new(2, cas, &a.sge(0, 8))])?;
    one_completion(&al, a.cq)?;
    assert_eq!((counter(&a.buf), counter(&b.buf)), (42, 7));
    println!("compare-and-swap 42 -> 7: found 42, now 7");

    cep.disconnect(&al, &[])?;
    assert!(al.close()?.is_clean());
    Ok(())
}
