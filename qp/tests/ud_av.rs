//! UD sends name their address vector by handle: `qp::post_send` resolves
//! and checks every AV (live, of this AL, in the QP's PD) before it posts
//! anything, so a bad one is a clear error and leaves the queues untouched.

use al::{Al, Error, Handle, Kind};
use hca::verbs::{self, Av, Ca, Cq, Pd};
use provider::RegisteredBuffer;
use provider::{
    Access, AvAttr, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, UdDest, Wc, WcStatus,
    GRH_SIZE,
};
use qp::{create_qp, modify_qp, post_recv, post_send, Qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

const QKEY: u32 = 0x1234_5678;

struct Side {
    ca: Handle<Ca>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

fn side(al: &Al, p: &SoftProvider, guid: u64) -> Side {
    let ca = verbs::open_ca(al, p, guid).unwrap();
    let pd = verbs::alloc_pd(al, ca).unwrap();
    let cq = verbs::create_cq(al, ca, 64, None, None).unwrap();
    let qp = create_qp(al, pd, QpCreate::new(QpType::Ud, cq)).unwrap();
    for m in [
        QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(QKEY),
        QpModify::to(QpState::Rtr),
        QpModify::to(QpState::Rts).sq_psn(0),
    ] {
        modify_qp(al, qp, &m).unwrap();
    }
    let buf = RegisteredBuffer::new(1024);
    let mr = verbs::register_mr(al, pd, &buf, 0, 1024, 0, Access::LOCAL_WRITE).unwrap();
    let lkey = al.resolve(mr).unwrap().lkey();
    Side {
        ca,
        pd,
        cq,
        qp,
        buf,
        lkey,
    }
}

struct World {
    al: Al,
    a: Side,
    b: Side,
    b_qpn: u32,
}

fn world() -> World {
    let f = Fabric::new();
    f.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
    f.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
    let p = SoftProvider::new(f);
    let al = Al::open().unwrap();
    let (a, b) = (side(&al, &p, 0xa000), side(&al, &p, 0xb000));
    let b_qpn = al.resolve(b.qp).unwrap().qpn();
    // One receive on B, so that anything that got through would show.
    let rsge = [Sge {
        addr: 0,
        length: 1024,
        lkey: b.lkey,
    }];
    post_recv(
        &al,
        b.qp,
        &[RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        }],
    )
    .unwrap();
    World { al, a, b, b_qpn }
}

impl World {
    /// Post two sends from A to B: the first through `good`, the second
    /// through `bad`.
    fn post_pair(&self, good: Handle<Av>, bad: Handle<Av>) -> al::Result<()> {
        let sge = [Sge {
            addr: 0,
            length: 16,
            lkey: self.a.lkey,
        }];
        let to = |av| UdDest {
            av,
            remote_qpn: self.b_qpn,
            remote_qkey: QKEY,
            pkey_index: 0,
        };
        post_send(
            &self.al,
            self.a.qp,
            &[
                SendWr::new(1, SendOp::Send, &sge).to(to(&good)),
                SendWr::new(2, SendOp::Send, &sge).to(to(&bad)),
            ],
        )
    }

    /// Nothing was posted: no completion on either side.
    fn assert_nothing_posted(&self) {
        let mut wc = [Wc::default(); 4];
        assert_eq!(verbs::poll_cq(&self.al, self.a.cq, &mut wc).unwrap(), 0);
        assert_eq!(verbs::poll_cq(&self.al, self.b.cq, &mut wc).unwrap(), 0);
    }
}

#[test]
fn a_ud_send_through_an_av_handle_delivers() {
    let w = world();
    let av = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    w.a.buf.write(0, &[0x5a; 16]).unwrap();
    w.post_pair(av, av).unwrap();
    let mut wc = [Wc::default(); 4];
    assert_eq!(verbs::poll_cq(&w.al, w.a.cq, &mut wc).unwrap(), 2);
    assert_eq!(verbs::poll_cq(&w.al, w.b.cq, &mut wc).unwrap(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len as usize, GRH_SIZE + 16);
    assert_eq!(w.b.buf.to_vec()[GRH_SIZE..GRH_SIZE + 16], [0x5a; 16]);
    assert!(w.al.close().unwrap().is_clean());
}

#[test]
fn a_stale_av_handle_fails_and_posts_nothing() {
    let w = world();
    let good = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    let stale = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    w.al.destroy(stale, None).unwrap();
    let e = w.post_pair(good, stale).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidHandle {
                expected: Kind::AV,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.is_gone(Kind::AV));
    w.assert_nothing_posted();
    assert!(w.al.close().unwrap().is_clean());
}

#[test]
fn an_av_of_another_al_instance_fails_and_posts_nothing() {
    let w = world();
    let other = world();
    let good = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    let foreign = verbs::create_av(&other.al, other.a.pd, AvAttr::lid(1, 2)).unwrap();
    let e = w.post_pair(good, foreign).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidHandle {
                expected: Kind::AV,
                ..
            }
        ),
        "{e}"
    );
    w.assert_nothing_posted();
    assert!(other.al.close().unwrap().is_clean());
    assert!(w.al.close().unwrap().is_clean());
}

#[test]
fn an_av_of_another_pd_or_ca_fails_and_posts_nothing() {
    let w = world();
    let good = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    let pd2 = verbs::alloc_pd(&w.al, w.a.ca).unwrap();
    let other_pd = verbs::create_av(&w.al, pd2, AvAttr::lid(1, 2)).unwrap();
    let e = w.post_pair(good, other_pd).unwrap_err();
    assert_eq!(
        e,
        Error::invalid_parameter("send 1: the AV belongs to another PD than the QP")
    );
    w.assert_nothing_posted();

    let other_ca = verbs::create_av(&w.al, w.b.pd, AvAttr::lid(1, 1)).unwrap();
    let e = w.post_pair(good, other_ca).unwrap_err();
    assert_eq!(
        e,
        Error::invalid_parameter("send 1: the AV belongs to another CA than the QP")
    );
    w.assert_nothing_posted();
    assert!(w.al.close().unwrap().is_clean());
}

#[test]
fn a_connected_qp_ignores_a_destination() {
    // RC and UC take no AV: a destination, even a stale one, is ignored
    // (IBTA), and the send goes where the QP is connected (here nowhere:
    // the QP is in RESET, so the provider refuses it for that reason).
    let w = world();
    let rc = create_qp(&w.al, w.a.pd, QpCreate::new(QpType::Rc, w.a.cq)).unwrap();
    let stale = verbs::create_av(&w.al, w.a.pd, AvAttr::lid(1, 2)).unwrap();
    w.al.destroy(stale, None).unwrap();
    let to = UdDest {
        av: &stale,
        remote_qpn: 1,
        remote_qkey: 0,
        pkey_index: 0,
    };
    let e = post_send(&w.al, rc, &[SendWr::new(1, SendOp::Send, &[]).to(to)]).unwrap_err();
    assert!(matches!(e, Error::InvalidQpState(_)), "{e}");
    assert!(w.al.close().unwrap().is_clean());
}
