//! The device-free half of the rdma_cm-backed CEPs: which state a CEP is
//! in, and what each librdmacm event ([`CmEventKind`]) means for it: the
//! next state, what to do to the QP or the id, and which of the CM's
//! [`Event`]s the application sees. Compiled and tested without the
//! `rdma` feature.

use std::net::SocketAddr;

use rdma_provider::cm::{CmEventKind, ConnParam};

use cep::proto::{ConnId, DisconnectCause, Event, RejectOrigin, TimedOut};
use cep::wire::ip_cm::{self, IpCmHeader, PortSpace};
use cep::wire::{Dreq, MessageRejected, PrivateData, Rej, RejectReason, Rep, Req};

/// Where an rdma_cm-backed CEP is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Active: `rdma_resolve_addr` under way.
    AddrResolving,
    /// Active: `rdma_resolve_route` under way.
    RouteResolving,
    /// Active: `rdma_connect` sent the REQ.
    Connecting,
    /// Active: the REP arrived; waiting for `rtu`.
    ReplyReceived,
    /// Passive: a REQ arrived; waiting for `accept` or `reject`.
    RequestReceived,
    /// Passive: `rdma_accept` sent the REP; waiting for the RTU.
    Accepted,
    /// Connected.
    Established,
    /// The peer's DREQ arrived; waiting for `disconnect_reply`.
    PeerDisconnecting,
    /// Our DREQ is out; waiting for the DREP.
    Disconnecting,
    /// Over: the CEP is released (or being released).
    Done,
}

impl Phase {
    /// Whether the REQ is this side's (active).
    fn active(self) -> bool {
        matches!(
            self,
            Phase::AddrResolving | Phase::RouteResolving | Phase::Connecting | Phase::ReplyReceived
        )
    }
}

/// What the CEP does before the application hears of the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// Nothing.
    None,
    /// `rdma_resolve_route`.
    ResolveRoute,
    /// Move the QP to INIT and `rdma_connect`.
    Connect,
    /// Move the QP to RTS (`rdma_init_qp_attr`).
    QpToRts,
    /// Move the QP to ERR.
    QpToErr,
}

/// One event's consequences.
#[derive(Debug)]
pub struct Step {
    /// The state after it.
    pub next: Phase,
    /// What to do first.
    pub reaction: Reaction,
    /// What the application hears (none: the event is internal or late).
    pub event: Option<Event>,
    /// The connection is over: [`Event::Released`] follows and the CEP
    /// goes.
    pub release: bool,
}

impl Step {
    fn quiet(next: Phase, reaction: Reaction) -> Step {
        Step {
            next,
            reaction,
            event: None,
            release: false,
        }
    }
    fn ignore(phase: Phase) -> Step {
        Step::quiet(phase, Reaction::None)
    }
    fn end(event: Event) -> Step {
        Step {
            next: Phase::Done,
            reaction: Reaction::QpToErr,
            event: Some(event),
            release: true,
        }
    }
}

/// The REJ librdmacm reported (reason and private data), as the CM's.
pub fn rej(reason: RejectReason, message: MessageRejected, private_data: &[u8]) -> Rej {
    let n = private_data.len().min(148);
    Rej {
        local_comm_id: 0,
        remote_comm_id: 0,
        message_rejected: message,
        rejected_info_length: 0,
        reason,
        ari: [0; 72],
        private_data: PrivateData::new(&private_data[..n]).unwrap_or_default(),
    }
}

/// A REP as far as rdma_cm reports it (`rdma_conn_param` of the connect
/// response): the peer's QPN, RDMA depths, RNR retry count, SRQ, flow
/// control and private data. rdma_cm does not report the REP's starting
/// PSN, CA GUID or ACK delay (0 here); `rdma_init_qp_attr` applies them.
pub fn rep_of(p: &ConnParam) -> Rep {
    let n = p.private_data.len().min(196);
    Rep {
        local_qpn: p.qp_num,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        end_to_end_flow_control: p.flow_control,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        private_data: PrivateData::new(&p.private_data[..n]).unwrap_or_default(),
        ..Rep::default()
    }
}

/// A REQ as far as rdma_cm reports it: the service id of `dst`'s port in
/// `space`, the peer's QPN and parameters, and private data rebuilt as
/// rdma_cm's header (`src`, `dst`) followed by the application's bytes,
/// so that [`cep::ip::request_info`] reads it as it reads a REQ that
/// came through the project's own CM.
pub fn req_of(p: &ConnParam, src: SocketAddr, dst: SocketAddr, space: PortSpace) -> Req {
    let header = IpCmHeader {
        src: src.ip().to_canonical(),
        src_port: src.port(),
        dst: dst.ip().to_canonical(),
    };
    let user = &p.private_data[..p.private_data.len().min(ip_cm::MAX_REQ_USER_DATA)];
    Req {
        service_id: ip_cm::service_id(space, dst.port()),
        local_qpn: p.qp_num,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        end_to_end_flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        private_data: header
            .private_data::<{ ip_cm::REQ_PRIVATE_DATA_LEN }>(user)
            .unwrap_or_default(),
        ..Req::default()
    }
}

/// The REJ reason a local failure is reported with (`Event::Rejected`
/// with [`RejectOrigin::Local`]; the error itself is kept on the CEP).
pub const LOCAL_FAILURE: RejectReason = RejectReason::Other(0);

/// What `kind` means for a CEP in `phase` whose events name `conn`.
pub fn step(phase: Phase, conn: ConnId, kind: &CmEventKind) -> Step {
    if phase == Phase::Done {
        return Step::ignore(phase);
    }
    let message = if phase.active() {
        MessageRejected::Req
    } else {
        MessageRejected::Rep
    };
    match (phase, kind) {
        (Phase::AddrResolving, CmEventKind::AddrResolved) => {
            Step::quiet(Phase::RouteResolving, Reaction::ResolveRoute)
        }
        (Phase::RouteResolving, CmEventKind::RouteResolved) => {
            Step::quiet(Phase::Connecting, Reaction::Connect)
        }
        (Phase::Connecting, CmEventKind::ConnectResponse(p)) => Step {
            next: Phase::ReplyReceived,
            reaction: Reaction::None,
            event: Some(Event::ReplyReceived {
                conn,
                rep: Box::new(rep_of(p)),
            }),
            release: false,
        },
        (Phase::Accepted, CmEventKind::Established(_)) => Step {
            next: Phase::Established,
            reaction: Reaction::QpToRts,
            event: Some(Event::Established { conn }),
            release: false,
        },
        // The passive side can hear the DREQ before the RTU (the RTU was
        // lost; Linux's CM takes a DREQ in REP_SENT too).
        (Phase::Established | Phase::Accepted, CmEventKind::Disconnected) => Step {
            next: Phase::PeerDisconnecting,
            reaction: Reaction::QpToErr,
            event: Some(Event::DisconnectRequest {
                conn,
                dreq: Box::new(Dreq::default()),
            }),
            release: false,
        },
        (Phase::Disconnecting, CmEventKind::Disconnected) => Step::end(Event::Disconnected {
            conn,
            cause: DisconnectCause::DrepReceived,
            drep: None,
        }),
        (
            _,
            CmEventKind::Rejected {
                reason,
                private_data,
            },
        ) if matches!(
            phase,
            Phase::Connecting | Phase::ReplyReceived | Phase::RequestReceived | Phase::Accepted
        ) =>
        {
            let reason = RejectReason::from_code(*reason);
            Step::end(Event::Rejected {
                conn,
                reason,
                message,
                origin: RejectOrigin::Remote,
                rej: Box::new(rej(reason, message, private_data)),
            })
        }
        (_, CmEventKind::TimedOut { .. }) if phase != Phase::PeerDisconnecting => {
            if phase == Phase::Disconnecting {
                // DREQ_ERROR comes as DISCONNECTED with -ETIMEDOUT; kept
                // here should a kernel report it apart.
                return Step::end(Event::Disconnected {
                    conn,
                    cause: DisconnectCause::DreqTimeout,
                    drep: None,
                });
            }
            Step::end(Event::Timeout {
                conn,
                message: if phase.active() {
                    TimedOut::Req
                } else {
                    TimedOut::Rep
                },
            })
        }
        (_, CmEventKind::Failed { .. }) => Step::end(Event::Rejected {
            conn,
            reason: LOCAL_FAILURE,
            message,
            origin: RejectOrigin::Local,
            rej: Box::new(rej(LOCAL_FAILURE, message, &[])),
        }),
        // The peer went while its DREQ waits for our answer, or events
        // that change nothing here (timewait exit, address change, a
        // late duplicate).
        _ => Step::ignore(phase),
    }
}

/// A local failure (a QP that would not move, a call librdmacm refused)
/// ending the connection, reported as [`step`] reports a failure event.
pub fn local_failure(phase: Phase, conn: ConnId) -> Step {
    step(
        phase,
        conn,
        &CmEventKind::Failed {
            code: u32::MAX,
            errno: 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_provider::cm::event_code;

    const C: ConnId = ConnId::from_comm_id(7);

    fn names(mut phase: Phase, kinds: &[CmEventKind]) -> Vec<(Phase, &'static str, bool)> {
        let mut out = Vec::new();
        for k in kinds {
            let s = step(phase, C, k);
            phase = s.next;
            out.push((phase, s.event.as_ref().map_or("-", |e| e.name()), s.release));
        }
        out
    }

    #[test]
    fn the_active_side_resolves_connects_and_hears_the_reply() {
        let p = ConnParam {
            qp_num: 0x33,
            private_data: b"reply".to_vec(),
            responder_resources: 2,
            ..ConnParam::default()
        };
        let s = step(Phase::AddrResolving, C, &CmEventKind::AddrResolved);
        assert_eq!(
            (s.next, s.reaction),
            (Phase::RouteResolving, Reaction::ResolveRoute)
        );
        let s = step(s.next, C, &CmEventKind::RouteResolved);
        assert_eq!((s.next, s.reaction), (Phase::Connecting, Reaction::Connect));
        assert!(s.event.is_none());
        let s = step(s.next, C, &CmEventKind::ConnectResponse(p));
        assert_eq!(s.next, Phase::ReplyReceived);
        let Some(Event::ReplyReceived { rep, conn }) = s.event else {
            panic!("{:?}", s.event)
        };
        assert_eq!(conn, C);
        assert_eq!(rep.local_qpn, 0x33);
        assert_eq!(rep.responder_resources, 2);
        assert_eq!(&rep.private_data.as_bytes()[..5], b"reply");
    }

    #[test]
    fn the_passive_side_moves_to_rts_on_the_rtu_and_hears_the_peers_dreq() {
        let got = names(
            Phase::Accepted,
            &[
                CmEventKind::Established(ConnParam::default()),
                CmEventKind::Disconnected,
                // After the DREQ, nothing more is reported until the
                // application answers it.
                CmEventKind::TimewaitExit,
            ],
        );
        assert_eq!(
            got,
            vec![
                (Phase::Established, "Established", false),
                (Phase::PeerDisconnecting, "DisconnectRequest", false),
                (Phase::PeerDisconnecting, "-", false),
            ]
        );
        assert_eq!(
            step(
                Phase::Accepted,
                C,
                &CmEventKind::Established(ConnParam::default())
            )
            .reaction,
            Reaction::QpToRts
        );
        assert_eq!(
            step(Phase::Established, C, &CmEventKind::Disconnected).reaction,
            Reaction::QpToErr
        );
        // A DREQ before the RTU: the same.
        let s = step(Phase::Accepted, C, &CmEventKind::Disconnected);
        assert_eq!(s.next, Phase::PeerDisconnecting);
        assert_eq!(s.event.map(|e| e.name()), Some("DisconnectRequest"));
    }

    #[test]
    fn our_disconnect_ends_with_disconnected_and_release() {
        let s = step(Phase::Disconnecting, C, &CmEventKind::Disconnected);
        assert!(s.release);
        assert_eq!(s.reaction, Reaction::QpToErr);
        assert!(matches!(
            s.event,
            Some(Event::Disconnected {
                cause: DisconnectCause::DrepReceived,
                ..
            })
        ));
        // Nothing after the end.
        assert!(step(Phase::Done, C, &CmEventKind::Disconnected)
            .event
            .is_none());
    }

    #[test]
    fn rejects_timeouts_and_failures_end_the_connection() {
        let s = step(
            Phase::Connecting,
            C,
            &CmEventKind::Rejected {
                reason: 8,
                private_data: b"no".to_vec(),
            },
        );
        assert!(s.release);
        let Some(Event::Rejected {
            reason,
            origin,
            message,
            rej,
            ..
        }) = s.event
        else {
            panic!()
        };
        assert_eq!(reason, RejectReason::InvalidServiceId);
        assert_eq!(origin, RejectOrigin::Remote);
        assert_eq!(message, MessageRejected::Req);
        assert_eq!(&rej.private_data.as_bytes()[..2], b"no");

        let s = step(
            Phase::Accepted,
            C,
            &CmEventKind::TimedOut {
                code: event_code::UNREACHABLE,
            },
        );
        assert!(matches!(
            s.event,
            Some(Event::Timeout {
                message: TimedOut::Rep,
                ..
            })
        ));
        let s = step(
            Phase::Connecting,
            C,
            &CmEventKind::TimedOut {
                code: event_code::UNREACHABLE,
            },
        );
        assert!(matches!(
            s.event,
            Some(Event::Timeout {
                message: TimedOut::Req,
                ..
            })
        ));
        let s = step(
            Phase::AddrResolving,
            C,
            &CmEventKind::Failed {
                code: event_code::ADDR_ERROR,
                errno: 113,
            },
        );
        assert!(s.release);
        assert!(matches!(
            s.event,
            Some(Event::Rejected {
                origin: RejectOrigin::Local,
                ..
            })
        ));
        let s = local_failure(Phase::Established, C);
        assert!(s.release && s.reaction == Reaction::QpToErr);
    }

    #[test]
    fn out_of_order_events_change_nothing() {
        for (phase, kind) in [
            (Phase::AddrResolving, CmEventKind::RouteResolved),
            (Phase::Connecting, CmEventKind::AddrResolved),
            (Phase::RequestReceived, CmEventKind::Disconnected),
            (Phase::ReplyReceived, CmEventKind::Disconnected),
            (
                Phase::Established,
                CmEventKind::ConnectResponse(ConnParam::default()),
            ),
            (
                Phase::Established,
                CmEventKind::Rejected {
                    reason: 28,
                    private_data: vec![],
                },
            ),
        ] {
            let s = step(phase, C, &kind);
            assert_eq!(s.next, phase, "{phase:?} {kind:?}");
            assert!(s.event.is_none() && !s.release);
        }
    }

    #[test]
    fn a_request_reads_like_one_from_the_projects_cm() {
        let p = ConnParam {
            qp_num: 0x44,
            private_data: vec![9; 56],
            initiator_depth: 3,
            ..ConnParam::default()
        };
        let src: SocketAddr = "192.168.77.2:40000".parse().unwrap();
        let dst: SocketAddr = "192.168.77.1:7471".parse().unwrap();
        let req = req_of(&p, src, dst, PortSpace::Tcp);
        assert_eq!(req.local_qpn, 0x44);
        let info = cep::ip::request_info(&req).unwrap();
        assert_eq!(info.source, src);
        assert_eq!(info.destination, dst);
        assert_eq!(info.user_data, vec![9; 56]);
    }
}
