//! What the examples share: two soft HCAs, and an RC connection between
//! them through the CM (the same calls `rc_pingpong.rs` spells out).
#![allow(dead_code)] // each example uses its own part

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;

/// One end: its CA, PD, CQ, QP, a registered buffer and its MR.
pub struct End {
    pub ca: Handle<Ca>,
    pub pd: Handle<Pd>,
    pub cq: Handle<Cq>,
    pub qp: Handle<Qp>,
    pub buf: RegisteredBuffer,
    pub lkey: u32,
    pub rkey: u32,
}

impl End {
    /// An SGE over `len` bytes of this end's buffer from `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> [Sge; 1] {
        [Sge {
            addr: offset,
            length: len,
            lkey: self.lkey,
        }]
    }
}

/// A fabric of two HCAs (GUIDs 0xa and 0xb, LIDs 1 and 2) and its provider.
pub fn two_hcas() -> Result<SoftProvider> {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
    fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
    Ok(SoftProvider::new(fabric))
}

/// A CA with a PD, a CQ, a QP made by `qp_of`, and a `len`-byte buffer
/// registered with every access right.
pub fn end(
    al: &Al,
    provider: &SoftProvider,
    guid: u64,
    len: usize,
    qp_of: impl FnOnce(Handle<Cq>) -> QpCreate,
) -> Result<End> {
    let ca = al.open_ca(provider, guid)?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, 64)?;
    let qp = pd.create_qp(al, qp_of(cq))?;
    let buf = RegisteredBuffer::new(len);
    let access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);
    let mr = pd.register(al, &buf, access)?;
    let (lkey, rkey) = mr.keys(al)?;
    Ok(End {
        ca,
        pd,
        cq,
        qp,
        buf,
        lkey,
        rkey,
    })
}

/// Connect `a.qp` to `b.qp` through the CM (B listens on `service` and
/// accepts; A sends the RTU). Returns A's CEP once both sides are
/// established.
pub fn connect(al: &Al, a: &End, b: &End, service: u64) -> Result<Handle<Cep>> {
    let (tx, established) = mpsc::channel();
    let (inst, qp_b, tx_b) = (Arc::clone(al), b.qp, tx.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        cep.accept(&inst, qp_b, &AcceptReply::default())
            .expect("accept");
    });
    let passive: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send(());
        }
    });
    b.ca.listen(al, 1, service, on_request, passive)?;
    let inst = Arc::clone(al);
    let active: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => cep.rtu(&inst, &[]).expect("rtu"),
        Event::Established { .. } => {
            let _ = tx.send(());
        }
        _ => {}
    });
    let cep = a.qp.connect(al, &ConnectRequest::new(service, 2), active)?;
    for _ in 0..2 {
        established
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| Error::Timeout("no connection".into()))?;
    }
    Ok(cep)
}

/// Poll `cq` until one completion arrives (at most two seconds).
pub fn one_completion(al: &Al, cq: Handle<Cq>) -> Result<Wc> {
    let mut wc = [Wc::default()];
    let deadline = Instant::now() + Duration::from_secs(2);
    while cq.poll(al, &mut wc)? == 0 {
        if Instant::now() > deadline {
            return Err(Error::Timeout("no completion".into()));
        }
        std::thread::yield_now();
    }
    if wc[0].status != WcStatus::Success {
        return Err(Error::Other(
            format!("completion failed: {:?}", wc[0]).into(),
        ));
    }
    Ok(wc[0])
}

/// Bring a UD QP to RTS with Q_Key `qkey` on port 1. A datagram QP has no
/// peer: INIT takes its port, P_Key index and Q_Key, RTR nothing, RTS its
/// send PSN.
pub fn ud_ready(al: &Al, qp: Handle<Qp>, qkey: u32) -> Result<()> {
    let init = QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(qkey);
    qp.modify(al, &init)?;
    qp.modify(al, &QpModify::to(QpState::Rtr))?;
    qp.modify(al, &QpModify::to(QpState::Rts).sq_psn(0))
}

/// Connect `qp_a` to `qp_b` (of `ca_b`, at LID 2) through the CM, as
/// [`connect`] does for two [`End`]s: B listens on `service` and accepts
/// onto `qp_b`, A sends the RTU. Returns A's CEP once both sides are
/// established.
pub fn connect_qps(
    al: &Al,
    qp_a: Handle<Qp>,
    ca_b: Handle<Ca>,
    qp_b: Handle<Qp>,
    service: u64,
) -> Result<Handle<Cep>> {
    let ignore: CmHandler = Arc::new(|_, _| {});
    connect_qps_with(al, qp_a, ca_b, qp_b, service, ignore.clone(), ignore)
}

/// [`connect_qps`], and every CM event of A's CEP also goes to `also_a`,
/// every one of B's to `also_b` (after the connection's own handling), for
/// what comes after the connection (LAP, APR, DREQ).
pub fn connect_qps_with(
    al: &Al,
    qp_a: Handle<Qp>,
    ca_b: Handle<Ca>,
    qp_b: Handle<Qp>,
    service: u64,
    also_a: CmHandler,
    also_b: CmHandler,
) -> Result<Handle<Cep>> {
    let (tx, established) = mpsc::channel();
    let (inst, tx_b) = (Arc::clone(al), tx.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        cep.accept(&inst, qp_b, &AcceptReply::default())
            .expect("accept");
    });
    let passive: CmHandler = Arc::new(move |cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send(());
        }
        also_b(cep, ev);
    });
    ca_b.listen(al, 1, service, on_request, passive)?;
    let inst = Arc::clone(al);
    let active: CmHandler = Arc::new(move |cep, ev| {
        match ev {
            Event::ReplyReceived { .. } => cep.rtu(&inst, &[]).expect("rtu"),
            Event::Established { .. } => {
                let _ = tx.send(());
            }
            _ => {}
        }
        also_a(cep, ev);
    });
    let cep = qp_a.connect(al, &ConnectRequest::new(service, 2), active)?;
    for _ in 0..2 {
        established
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| Error::Timeout("no connection".into()))?;
    }
    Ok(cep)
}
