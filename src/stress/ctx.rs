//! One AL instance, the objects the run knows of it, and the CM handlers
//! of its listens and CEPs.

use super::*;

/// The objects of one AL the run knows about (by handle; destroyed ones
/// drop out when a call finds them gone).
#[derive(Default)]
pub(super) struct Objs {
    pub(super) cas: Vec<(Handle<Ca>, usize)>,
    pub(super) pds: Vec<(Handle<Pd>, Handle<Ca>)>,
    pub(super) cqs: Vec<(Handle<Cq>, Handle<Ca>)>,
    pub(super) qps: Vec<(Handle<Qp>, usize)>,
    pub(super) mrs: Vec<Handle<Mr>>,
    pub(super) listens: Vec<Handle<Listen>>,
    pub(super) ceps: Vec<Handle<Cep>>,
    /// Passive CEPs waiting for the worker's accept or reject, with their HCA.
    pub(super) pending: Vec<(Handle<Cep>, usize)>,
}

impl Objs {
    pub(super) fn prune(&mut self, al: &AlInstance) {
        self.cas.retain(|(h, _)| al.resolve(*h).is_ok());
        self.pds.retain(|(h, _)| al.resolve(*h).is_ok());
        self.cqs.retain(|(h, _)| al.resolve(*h).is_ok());
        self.qps.retain(|(h, _)| al.resolve(*h).is_ok());
        self.mrs.retain(|h| al.resolve(*h).is_ok());
        self.listens.retain(|h| al.resolve(*h).is_ok());
        self.ceps.retain(|h| al.resolve(*h).is_ok());
        self.pending.retain(|(h, _)| al.resolve(*h).is_ok());
    }
}

/// One AL instance and what the run knows of its objects; the CM handlers
/// of its listens and CEPs share it.
pub(super) struct AlCtx {
    pub(super) inst: Arc<AlInstance>,
    pub(super) checker: Arc<Checker>,
    pub(super) objs: Mutex<Objs>,
}

impl AlCtx {
    pub(super) fn objs(&self) -> std::sync::MutexGuard<'_, Objs> {
        self.objs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn qp_on(&self, hca: usize, r: u64) -> Option<Handle<Qp>> {
        let o = self.objs();
        let on: Vec<Handle<Qp>> = o
            .qps
            .iter()
            .filter(|(_, h)| *h == hca)
            .map(|(q, _)| *q)
            .collect();
        (!on.is_empty()).then(|| on[(r % on.len() as u64) as usize])
    }

    /// The handler of every CEP of this AL (active and passive).
    pub(super) fn cep_handler(self: &Arc<Self>) -> CmHandler {
        let ctx = self.clone();
        Arc::new(move |cep, ev| {
            let c = &ctx.checker;
            c.guarded("CEP", || {
                c.note_event(cep, ev);
                let r = c.rand() % 100;
                match ev {
                    Event::ReplyReceived { .. } => {
                        if r < 85 {
                            c.record_callback(Op::Rtu, &cm::rtu(&ctx.inst, cep, &[]));
                        } else if r < 93 {
                            let res = cm::reject(&ctx.inst, cep, RejectReason::ConsumerReject, &[]);
                            c.record_callback(Op::Reject, &res);
                        } else if r < 97 {
                            c.record_callback(Op::Mra, &cm::mra(&ctx.inst, cep, 10, &[]));
                        }
                    }
                    Event::DisconnectRequest { .. } if r < 90 => {
                        let res = cm::disconnect_reply(&ctx.inst, cep, &[]);
                        c.record_callback(Op::DisconnectReply, &res);
                    }
                    Event::Established { .. } if r < 5 => {
                        c.record_callback(Op::Disconnect, &cm::disconnect(&ctx.inst, cep, &[]));
                    }
                    _ => {}
                }
            });
        })
    }

    /// The request handler of a listen on `hca`.
    pub(super) fn listen_handler(self: &Arc<Self>, hca: usize) -> ListenHandler {
        let ctx = self.clone();
        Arc::new(move |_listen, cep, ev| {
            let c = &ctx.checker;
            c.guarded("listen", || {
                c.note_event(cep, ev);
                let r = c.rand() % 100;
                if r < 55 {
                    match ctx.qp_on(hca, c.rand()) {
                        Some(qp) => {
                            let res = cm::accept(&ctx.inst, cep, qp, &AcceptReply::default());
                            c.record_callback(Op::Accept, &res);
                            if res.is_ok() {
                                ctx.objs().ceps.push(cep);
                            } else {
                                ctx.objs().pending.push((cep, hca));
                            }
                        }
                        None => ctx.objs().pending.push((cep, hca)),
                    }
                } else if r < 70 {
                    let res = cm::reject(&ctx.inst, cep, RejectReason::ConsumerReject, &[]);
                    c.record_callback(Op::Reject, &res);
                } else if r < 85 {
                    c.record_callback(Op::Mra, &cm::mra(&ctx.inst, cep, 12, &[]));
                    ctx.objs().pending.push((cep, hca));
                } else if r < 95 {
                    ctx.objs().pending.push((cep, hca));
                } else {
                    let res = c.destroy(&ctx.inst, cep);
                    c.record_callback(Op::DestroyCep, &res);
                }
            });
        })
    }
}
