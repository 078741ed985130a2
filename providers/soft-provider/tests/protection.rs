//! The soft MR's own accessors stay inside the MR. (The protection errors
//! of work requests are provider-generic and live in the conformance
//! suite, `conformance/src/checks/errors.rs`.)

mod common;
use common::*;
use provider::buffer::RegisteredBuffer;

#[test]
fn soft_mr_accessors_stay_in_the_mr() {
    let (_f, a, _b) = two();
    let buf = RegisteredBuffer::new(100);
    let mr = a.pd.register_range(&buf, 50, 50, 0x1000, ALL).unwrap();
    assert_eq!((mr.iova(), mr.len()), (0x1000, 50));
    mr.write(0, &[1, 2, 3]).unwrap();
    assert!(mr.write(48, &[1, 2, 3]).is_err());
    let mut x = [0; 3];
    assert!(mr.read(48, &mut x).is_err());
    buf.read(50, &mut x).unwrap();
    assert_eq!(x, [1, 2, 3]);
    assert!(buf.read(99, &mut x).is_err());
}
