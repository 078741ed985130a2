//! The listening end: a listen whose request callback creates the
//! connection's QP and accepts on it, as a server does; a DREQ is answered.
//! The first connection accepted is the ping-pong's, which [`Echo`]
//! answers while the active end measures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use al::{AlInstance, Handle};
use cep::cm::{self, AcceptReply, CmHandler, ListenHandler};
use cep::proto::Event;
use cep::wire::ip_cm::PortSpace;
use hca::verbs::{Cq, Pd};
use ibal::prelude::*;

use super::config::{SERVICE_ID, WAIT};
use super::end::{rc_qp, End};
use crate::{al_err, BenchResult};

/// What the listen's callbacks count.
#[derive(Default)]
pub(crate) struct PassiveCounts {
    pub(crate) accepted: AtomicU64,
    pub(crate) established: AtomicU64,
    pub(crate) disconnect_requests: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// The first error, in words.
    pub(crate) first_error: OnceLock<String>,
    /// The QP of the last connection accepted (raw handle; 0: none): an
    /// idle one, unlike the ping-pong's, for the footprint.
    pub(crate) last_qp: AtomicU64,
}

impl PassiveCounts {
    fn error(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_error.set(e);
    }
}

/// The listening end.
pub(crate) struct Passive {
    pub(crate) end: End,
    pub(crate) counts: Arc<PassiveCounts>,
    /// The ping-pong's QP: the first one accepted.
    echo_qp: Arc<OnceLock<Handle<Qp>>>,
}

impl Passive {
    /// Listens on `end`: for [`SERVICE_ID`] on the soft fabric, or at
    /// `ip_listen` (rdma_cm's TCP port space) over RoCEv2.
    pub(crate) fn listen(
        end: End,
        ip_listen: Option<std::net::SocketAddr>,
    ) -> BenchResult<Passive> {
        let counts = Arc::new(PassiveCounts::default());
        let echo_qp = Arc::new(OnceLock::new());
        let inst = end.al.instance().clone();
        let (on_request, handler) = handlers(&inst, end.pd, end.cq, &counts, &echo_qp);
        match ip_listen {
            Some(addr) => cep::ip::listen(&inst, end.ca, addr, PortSpace::Tcp, on_request, handler),
            None => cm::listen(&inst, end.ca, 1, SERVICE_ID, on_request, handler),
        }
        .map_err(al_err("listen"))?;
        Ok(Passive {
            end,
            counts,
            echo_qp,
        })
    }

    /// The footprint of the last QP accepted (an idle connection's; the
    /// ping-pong's keeps packet buffers for reuse): (access layer,
    /// provider) bytes.
    pub(crate) fn qp_footprint(&self) -> BenchResult<(usize, usize)> {
        match self.counts.last_qp.load(Ordering::Relaxed) {
            0 => Err("no connection accepted yet".into()),
            raw => self
                .end
                .qp_footprint(Handle::from_raw(al::RawHandle::from_u64(raw))),
        }
    }

    /// What answers the ping-pong (once the first connection is accepted).
    pub(crate) fn echo(&self) -> BenchResult<Echo> {
        let qp = *self
            .echo_qp
            .get()
            .ok_or("no connection accepted yet: nothing to echo on")?;
        Ok(Echo {
            al: self.end.al.instance().clone(),
            qp,
            cq: self.end.cq,
            send_sge: self.end.send_sge,
            recv_sge: self.end.recv_sge,
        })
    }
}

/// The request callback (a QP per request, accepted at once) and the
/// connections' handler.
fn handlers(
    inst: &Arc<AlInstance>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    counts: &Arc<PassiveCounts>,
    echo_qp: &Arc<OnceLock<Handle<Qp>>>,
) -> (ListenHandler, CmHandler) {
    let (i, c, e) = (inst.clone(), counts.clone(), echo_qp.clone());
    let on_request: ListenHandler = Arc::new(move |_listen, cep, ev| {
        if !matches!(ev, Event::ConnectRequest { .. }) {
            return;
        }
        let qp = match rc_qp(&i, pd, cq) {
            Ok(qp) => qp,
            Err(err) => {
                c.error(err);
                let _ = cm::reject(&i, cep, RejectReason::NoResources, &[]);
                return;
            }
        };
        match cm::accept(&i, cep, qp, &AcceptReply::default()) {
            Ok(()) => {
                c.accepted.fetch_add(1, Ordering::Relaxed);
                c.last_qp.store(qp.raw().as_u64(), Ordering::Relaxed);
                let _ = e.set(qp);
            }
            Err(err) => c.error(format!("accept: {err}")),
        }
    });
    let (i, c) = (inst.clone(), counts.clone());
    let handler: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::Established { .. } => {
            c.established.fetch_add(1, Ordering::Relaxed);
        }
        Event::DisconnectRequest { .. } => {
            c.disconnect_requests.fetch_add(1, Ordering::Relaxed);
            if let Err(err) = cm::disconnect_reply(&i, cep, &[]) {
                c.error(format!("disconnect_reply: {err}"));
            }
        }
        _ => {}
    });
    (on_request, handler)
}

/// The passive half of the ping-pong: every 64-byte SEND received on the
/// ping QP is answered with one.
pub(crate) struct Echo {
    al: Arc<AlInstance>,
    qp: Handle<Qp>,
    cq: Handle<Cq>,
    send_sge: [Sge; 1],
    recv_sge: [Sge; 1],
}

impl Echo {
    /// Posts the receives the first `iters` pings need (one per ping, up
    /// to the queue's depth; each is posted again when used).
    pub(crate) fn post_receives(&self, depth: u32) -> BenchResult<()> {
        for i in 0..depth {
            self.qp
                .post_recv(&self.al, &[recv_wr(&self.recv_sge, u64::from(i))])
                .map_err(al_err("post_recv"))?;
        }
        Ok(())
    }

    /// Answers `iters` pings, busy-polling the CQ (the active end
    /// busy-polls too).
    pub(crate) fn run(&self, iters: u32) -> BenchResult<()> {
        let mut wc = [Wc::default(); 4];
        let (mut received, mut sent) = (0u32, 0u32);
        let deadline = Instant::now() + WAIT;
        while received < iters || sent < received {
            let n = self.qp_cq_poll(&mut wc)?;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    return Err(format!("echo: a completion with {:?}", w.status));
                }
                match w.opcode {
                    WcOpcode::Recv => {
                        received += 1;
                        self.qp
                            .post_recv(&self.al, &[recv_wr(&self.recv_sge, w.wr_id)])
                            .map_err(al_err("post_recv"))?;
                        self.qp
                            .post_send(&self.al, &[SendWr::new(1, SendOp::Send, &self.send_sge)])
                            .map_err(al_err("post_send"))?;
                    }
                    _ => sent += 1,
                }
            }
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!("echo: {received} of {iters} pings in {WAIT:?}"));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn qp_cq_poll(&self, wc: &mut [Wc]) -> BenchResult<usize> {
        self.cq.poll(&self.al, wc).map_err(al_err("poll_cq"))
    }
}

pub(crate) fn recv_wr(sge: &[Sge; 1], wr_id: u64) -> RecvWr<'_> {
    RecvWr {
        wr_id,
        sg_list: sge,
    }
}
