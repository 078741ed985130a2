//! Helpers the checks share: a side's PD and CQs, memory, QPs brought to
//! RTS, bounded waits. Generic over the [`Fixture`]; no provider named.

use std::time::Instant;

use al::Error;
use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Mtu, QpCaps, QpInit, QpModify, QpState, QpType,
    RecvWr, RegisteredBuffer, SendWr, Sge, SrqInit, UdDest, Wc, WcOpcode, WcStatus,
};

use crate::fixture::{Endpoint, Fixture, Side};

/// Every access right.
pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Capacity of the CQs a [`Node`] creates.
pub const CQ_SIZE: u32 = 256;

/// One side: its device, addressing, a PD and a send and a receive CQ.
pub struct Node<'f, F: Fixture> {
    /// The fixture (for waits).
    pub f: &'f F,
    /// Which side.
    pub side: Side,
    /// The device.
    pub dev: &'f F::Device,
    /// How this side is addressed.
    pub ep: Endpoint,
    /// A protection domain.
    pub pd: Pd<F>,
    /// Send CQ of the QPs [`Node::qp`] makes.
    pub scq: Cq<F>,
    /// Receive CQ of the QPs [`Node::qp`] makes.
    pub rcq: Cq<F>,
}

/// The device type of a fixture.
pub type Dev<F> = <F as Fixture>::Device;
/// The PD type of a fixture's device.
pub type Pd<F> = <Dev<F> as Device>::Pd;
/// The CQ type of a fixture's device.
pub type Cq<F> = <Dev<F> as Device>::Cq;
/// The MR type of a fixture's device.
pub type Mr<F> = <Dev<F> as Device>::Mr;
/// The QP type of a fixture's device.
pub type Qp<F> = <Dev<F> as Device>::Qp;
/// The SRQ type of a fixture's device.
pub type Srq<F> = <Dev<F> as Device>::Srq;
/// The AV type of a fixture's device.
pub type Av<F> = <Dev<F> as Device>::Av;

/// Both sides of a fixture.
pub fn two<F: Fixture>(f: &F) -> (Node<'_, F>, Node<'_, F>) {
    (Node::new(f, Side::A), Node::new(f, Side::B))
}

/// A byte pattern that differs with `seed` and along the buffer.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Memory registered on one side: the buffer, its MR and its names.
pub struct Mem<F: Fixture> {
    /// The memory.
    pub buf: RegisteredBuffer,
    /// The MR (dropped with the `Mem`).
    pub mr: Mr<F>,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// The MR's first address.
    pub iova: u64,
    /// Offset of the MR in `buf`.
    pub offset: usize,
}

impl<F: Fixture> Mem<F> {
    /// The SGE for `len` bytes at `off` from the MR's start.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.iova + off,
            length: len,
            lkey: self.lkey,
        }
    }
    /// `len` bytes at `off` from the MR's start.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.buf.read(self.offset + off, &mut v).unwrap();
        v
    }
    /// Write `data` at `off` from the MR's start.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(self.offset + off, data).unwrap();
    }
    /// The native-endian u64 at `off`.
    pub fn word(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.read(off, 8).try_into().unwrap())
    }
    /// Whether every byte of the whole buffer is `fill`.
    pub fn all(&self, fill: u8) -> bool {
        self.buf.to_vec().iter().all(|&x| x == fill)
    }
}

/// The parameters [`Node::connect`] uses; change a field for a check.
#[derive(Debug, Clone, Copy)]
pub struct Conn {
    /// QP access flags.
    pub access: Access,
    /// PSN this side sends from (the peer's `rq_psn`).
    pub sq_psn: u32,
    /// PSN this side expects.
    pub rq_psn: u32,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// Local ACK timeout (IBTA encoding).
    pub timeout: u8,
    /// Minimum RNR NAK timer (IBTA encoding).
    pub min_rnr_timer: u8,
    /// READs/atomics this side may have outstanding (RC; 0 is none).
    pub max_rd_atomic: u8,
    /// READs/atomics this side serves for its peer (RC; 0 is none).
    pub max_dest_rd_atomic: u8,
}

impl Default for Conn {
    fn default() -> Self {
        Conn {
            access: ALL,
            sq_psn: 0,
            rq_psn: 0,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            min_rnr_timer: 1,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

impl<'f, F: Fixture> Node<'f, F> {
    /// A side with a fresh PD and two CQs of [`CQ_SIZE`] entries.
    pub fn new(f: &'f F, side: Side) -> Self {
        let dev = f.device(side);
        let cq = || {
            dev.create_cq(CqInit {
                capacity: CQ_SIZE,
                ..CqInit::default()
            })
            .unwrap()
        };
        Node {
            f,
            side,
            dev,
            ep: f.endpoint(side),
            pd: dev.alloc_pd().unwrap(),
            scq: cq(),
            rcq: cq(),
        }
    }

    /// Register `len` bytes (filled with `fill`) with `access`; the MR's
    /// iova is a non-trivial address, so a provider that ignores it fails.
    pub fn mem(&self, len: usize, fill: u8, access: Access) -> Mem<F> {
        self.mem_range(len, 0, len, 0x5_0000_0000, fill, access)
    }

    /// Register `len` bytes from `offset` of a new `buf_len`-byte buffer
    /// filled with `fill`, at `iova`.
    pub fn mem_range(
        &self,
        buf_len: usize,
        offset: usize,
        len: usize,
        iova: u64,
        fill: u8,
        access: Access,
    ) -> Mem<F> {
        let buf = RegisteredBuffer::new(buf_len);
        buf.fill(fill).unwrap();
        let mr = self
            .dev
            .register_mr(&self.pd, &buf, offset, len, iova, access)
            .unwrap();
        let (lkey, rkey) = self.dev.mr_keys(&mr);
        Mem {
            buf,
            mr,
            lkey,
            rkey,
            iova,
            offset,
        }
    }

    /// A QP of type `ty` on this side's CQs (RESET).
    pub fn qp(&self, ty: QpType) -> Qp<F> {
        self.qp_with(ty, None, false)
    }

    /// A QP with an SRQ and/or `sq_sig_all`.
    pub fn qp_with(&self, ty: QpType, srq: Option<&Srq<F>>, sq_sig_all: bool) -> Qp<F> {
        self.dev
            .create_qp(
                &self.pd,
                &QpInit {
                    qp_type: ty,
                    send_cq: &self.scq,
                    recv_cq: &self.rcq,
                    srq,
                    caps: QpCaps::default(),
                    sq_sig_all,
                },
            )
            .unwrap()
    }

    /// An SRQ.
    pub fn srq(&self, max_wr: u32, max_sge: u32) -> Srq<F> {
        self.dev
            .create_srq(&self.pd, SrqInit { max_wr, max_sge })
            .unwrap()
    }

    /// The QP number.
    pub fn qpn(&self, qp: &Qp<F>) -> u32 {
        self.dev.qp_num(qp)
    }

    /// The QP's state.
    pub fn state(&self, qp: &Qp<F>) -> QpState {
        self.dev.query_qp(qp).unwrap().state
    }

    /// Modify.
    pub fn modify(&self, qp: &Qp<F>, m: QpModify) -> Result<(), Error> {
        self.dev.modify_qp(qp, &m)
    }

    /// The path MTU both sides' ports support.
    pub fn path_mtu(&self, peer: &Node<'_, F>) -> Mtu {
        let mine = self.dev.query_port(self.ep.port).unwrap().active_mtu;
        let theirs = peer.dev.query_port(peer.ep.port).unwrap().active_mtu;
        mine.min(theirs)
    }

    /// The AV attributes that reach `to`: LID-routed where the provider
    /// routes by LID, else with a GRH naming `to`'s GID.
    pub fn av_attr(&self, to: &Node<'_, F>) -> AvAttr {
        match to.ep.lid {
            Some(lid) if self.f.supports_lid_routing() => AvAttr::lid(self.ep.port, lid),
            _ => self.grh_av_attr(to),
        }
    }

    /// AV attributes with a GRH naming `to`'s GID (and its LID, if any).
    pub fn grh_av_attr(&self, to: &Node<'_, F>) -> AvAttr {
        AvAttr {
            grh: Some(GrhAttr {
                dgid: to.ep.gid,
                sgid_index: self.ep.gid_index,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..AvAttr::lid(self.ep.port, to.ep.lid.unwrap_or(0))
        }
    }

    /// An AV that reaches `to`.
    pub fn av(&self, to: &Node<'_, F>) -> Av<F> {
        self.dev.create_av(&self.pd, &self.av_attr(to)).unwrap()
    }

    /// RESET -> INIT for an RC or UC QP.
    pub fn init(&self, qp: &Qp<F>, access: Access) -> Result<(), Error> {
        self.modify(
            qp,
            QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(self.ep.port)
                .access(access),
        )
    }

    /// The INIT -> RTR request of an RC/UC QP towards `dqpn` on `to`.
    pub fn rtr(&self, qp: &Qp<F>, to: &Node<'_, F>, dqpn: u32, c: &Conn) -> QpModify {
        let m = QpModify::to(QpState::Rtr)
            .av(self.av_attr(to))
            .path_mtu(self.path_mtu(to).min(Mtu::Mtu1024))
            .dest_qpn(dqpn)
            .rq_psn(c.rq_psn);
        if self.dev.query_qp(qp).unwrap().qp_type == QpType::Rc {
            m.max_dest_rd_atomic(c.max_dest_rd_atomic)
                .min_rnr_timer(c.min_rnr_timer)
        } else {
            m
        }
    }

    /// The RTR -> RTS request of an RC/UC QP.
    pub fn rts(&self, qp: &Qp<F>, c: &Conn) -> QpModify {
        let m = QpModify::to(QpState::Rts).sq_psn(c.sq_psn);
        if self.dev.query_qp(qp).unwrap().qp_type == QpType::Rc {
            m.timeout(c.timeout)
                .retry_cnt(c.retry_cnt)
                .rnr_retry(c.rnr_retry)
                .max_rd_atomic(c.max_rd_atomic)
        } else {
            m
        }
    }

    /// Bring an RC/UC QP from RESET to RTS towards `dqpn` on `to`.
    pub fn connect(&self, qp: &Qp<F>, to: &Node<'_, F>, dqpn: u32, c: &Conn) {
        self.init(qp, c.access).unwrap();
        self.modify(qp, self.rtr(qp, to, dqpn, c)).unwrap();
        self.modify(qp, self.rts(qp, c)).unwrap();
    }

    /// A UD QP in RTS with Q_Key `qkey`.
    pub fn ud_qp(&self, qkey: u32) -> Qp<F> {
        let q = self.qp(QpType::Ud);
        self.modify(
            &q,
            QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(self.ep.port)
                .qkey(qkey),
        )
        .unwrap();
        self.modify(&q, QpModify::to(QpState::Rtr)).unwrap();
        self.modify(&q, QpModify::to(QpState::Rts).sq_psn(0))
            .unwrap();
        q
    }

    /// Post sends; each UD request's AV is its own `ud.av`.
    pub fn post_send(&self, qp: &Qp<F>, wrs: &[SendWr<'_, Av<F>>]) -> Result<(), Error> {
        self.dev.post_send(qp, wrs, &|i| {
            wrs.get(i).and_then(|w| w.ud.as_ref().map(|u| u.av))
        })
    }

    /// Post one send.
    pub fn send(&self, qp: &Qp<F>, wr: SendWr<'_, Av<F>>) {
        self.post_send(qp, std::slice::from_ref(&wr)).unwrap()
    }

    /// Post one receive of `sges`.
    pub fn recv(&self, qp: &Qp<F>, wr_id: u64, sges: &[Sge]) {
        self.dev
            .post_recv(
                qp,
                &[RecvWr {
                    wr_id,
                    sg_list: sges,
                }],
            )
            .unwrap()
    }

    /// Wait for exactly `n` completions on `cq` (bounded by the fixture's
    /// deadline); fails the check on a timeout.
    pub fn wait(&self, cq: &Cq<F>, n: usize) -> Vec<Wc> {
        let got = self.f.wait_completions(self.dev, cq, n);
        assert_eq!(
            got.len(),
            n,
            "{:?}: waited {:?} for {n} completions, got {got:#?}",
            self.side,
            self.f.deadline()
        );
        got
    }

    /// Wait for one send completion.
    pub fn wait_send(&self) -> Wc {
        self.wait(&self.scq, 1)[0]
    }

    /// Wait for one receive completion.
    pub fn wait_recv(&self) -> Wc {
        self.wait(&self.rcq, 1)[0]
    }

    /// Poll `cq` once (no progress) and require it empty.
    pub fn assert_empty(&self, cq: &Cq<F>, what: &str) {
        let mut wc = [Wc::default(); 4];
        let n = self.dev.poll_cq(cq, &mut wc).unwrap();
        assert_eq!(n, 0, "{:?}: {what}: unexpected {:#?}", self.side, &wc[..n]);
    }

    /// The UD destination of QP `qpn` through `av`.
    pub fn dest<'a>(&self, av: &'a Av<F>, qpn: u32, qkey: u32) -> UdDest<'a, Av<F>> {
        UdDest {
            av,
            remote_qpn: qpn,
            remote_qkey: qkey,
            pkey_index: 0,
        }
    }
}

/// An RC (or UC) pair `a <-> b`, both in RTS, PSNs exchanged "out of band"
/// (a sends from 0x123456, b from 0xabcdef).
pub fn pair<F: Fixture>(
    a: &Node<'_, F>,
    b: &Node<'_, F>,
    ty: QpType,
    access: Access,
) -> (Qp<F>, Qp<F>) {
    let ca = Conn {
        access,
        sq_psn: 0x12_3456,
        rq_psn: 0xab_cdef,
        ..Conn::default()
    };
    let cb = Conn {
        sq_psn: ca.rq_psn,
        rq_psn: ca.sq_psn,
        ..ca
    };
    pair_with(a, b, ty, &ca, &cb)
}

/// A pair with each side's own connection parameters.
pub fn pair_with<F: Fixture>(
    a: &Node<'_, F>,
    b: &Node<'_, F>,
    ty: QpType,
    ca: &Conn,
    cb: &Conn,
) -> (Qp<F>, Qp<F>) {
    let qa = a.qp(ty);
    let qb = b.qp(ty);
    a.connect(&qa, b, b.qpn(&qb), ca);
    b.connect(&qb, a, a.qpn(&qa), cb);
    (qa, qb)
}

/// Require `wc` to be a successful completion of `wr_id` with `opcode`
/// and `byte_len`.
#[track_caller]
pub fn ok(wc: &Wc, wr_id: u64, opcode: WcOpcode, byte_len: u32) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (wr_id, WcStatus::Success, opcode, byte_len),
        "{wc:#?}"
    );
}

/// Require `wc` to be a completion of `wr_id` with `status`.
#[track_caller]
pub fn failed(wc: &Wc, wr_id: u64, status: WcStatus) {
    assert_eq!((wc.wr_id, wc.status), (wr_id, status), "{wc:#?}");
}

/// Require `r` to be `InvalidParameter`.
#[track_caller]
pub fn invalid<T>(r: Result<T, Error>) {
    match r {
        Err(Error::InvalidParameter(_)) => {}
        Err(e) => panic!("expected InvalidParameter, got {e:?}"),
        Ok(_) => panic!("expected InvalidParameter, got Ok"),
    }
}

/// Require `r` to be `InvalidQpState`.
#[track_caller]
pub fn bad_state<T>(r: Result<T, Error>) {
    match r {
        Err(Error::InvalidQpState(_)) => {}
        Err(e) => panic!("expected InvalidQpState, got {e:?}"),
        Ok(_) => panic!("expected InvalidQpState, got Ok"),
    }
}

/// Drive progress until `mem` holds `expected` at `off` (bounded by the
/// fixture's deadline): how a check sees an RDMA WRITE land without a
/// completion on the target side.
pub fn wait_bytes<F: Fixture>(f: &F, mem: &Mem<F>, off: usize, expected: &[u8]) {
    let end = Instant::now() + f.deadline();
    while mem.read(off, expected.len()) != expected {
        assert!(
            Instant::now() < end,
            "waited {:?} for {} bytes at {off} to land",
            f.deadline(),
            expected.len()
        );
        f.progress();
        std::thread::yield_now();
    }
}
