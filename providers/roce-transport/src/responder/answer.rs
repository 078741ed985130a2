//! The responder's packets: the next queued answer (ACK, NAK, READ
//! response, atomic ACK) as a packet, and the GRH bytes a UD receive
//! starts with.

use provider::{QpState, GRH_SIZE};
use roce::{Aeth, AtomicAckEth, Bth, Frame, Headers, IpHeader, NakCode, Opcode, Packet, Syndrome};

use super::state::{Job, NO_CREDITS};
use crate::memory::Memory;
use crate::psn;
use crate::transport::{Source, Transmit, Transport};

impl<R: Clone> Transport<R> {
    /// The next responder packet, if any.
    pub(crate) fn responder_transmit<M: Memory>(&mut self, mem: &mut M) -> Option<Transmit<R>> {
        let job = self.resp.out.front_mut()?;
        let dest = self.cfg.dest_qpn;
        let mtu = self.mtu;
        let (headers, payload, done) = match job {
            Job::Ack { psn, syndrome, msn } => {
                let mut h = Headers::new(Bth::new(Opcode::RcAck, dest, *psn));
                h.aeth = Some(Aeth {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                (h, Vec::new(), true)
            }
            Job::Atomic { psn, orig, msn, .. } => {
                let mut h = Headers::new(Bth::new(Opcode::RcAtomicAck, dest, *psn));
                h.aeth = Some(Aeth {
                    syndrome: Syndrome::Ack {
                        credits: NO_CREDITS,
                    },
                    msn: *msn,
                });
                h.atomic_ack_eth = Some(AtomicAckEth { original: *orig });
                (h, Vec::new(), true)
            }
            Job::Read {
                first_psn,
                rkey,
                va,
                len,
                next,
                npkts,
                msn,
                ..
            } => {
                let k = *next;
                let off = k * mtu;
                let size = (*len - off.min(*len)).min(mtu) as usize;
                let mut data = mem.packet_buffer(size);
                let p = psn::add(*first_psn, k);
                if size > 0
                    && mem
                        .read_remote(*rkey, va.wrapping_add(u64::from(off)), &mut data)
                        .is_err()
                {
                    // The region went away under the READ (deregistered
                    // since the request was checked): the class C error
                    // the check would have found, so NAK remote access and
                    // go to ERR, as after any such NAK. The requester goes
                    // to ERR on the NAK; a responder left in RTS would go
                    // on serving a peer that can no longer talk to it.
                    let msn = *msn;
                    if let Some(job) = self.resp.out.pop_front() {
                        self.resp.job_done(&job);
                    }
                    self.counters.naks_sent += 1;
                    crate::trace::nak_sent(&self.cfg, p, Syndrome::Nak(NakCode::RemoteAccessError));
                    if self.state == QpState::Rts {
                        self.enter_error(None, "remote access error NAK sent");
                    }
                    let mut h = Headers::new(Bth::new(Opcode::RcAck, dest, p));
                    h.aeth = Some(Aeth {
                        syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                        msn,
                    });
                    return Some(self.respond(h, Vec::new()));
                }
                let opcode = match (k, *npkts) {
                    (_, 1) => Opcode::RcReadResponseOnly,
                    (0, _) => Opcode::RcReadResponseFirst,
                    (k, n) if k + 1 == n => Opcode::RcReadResponseLast,
                    _ => Opcode::RcReadResponseMiddle,
                };
                let mut h = Headers::new(Bth::new(opcode, dest, p));
                if opcode.layout().aeth {
                    h.aeth = Some(Aeth {
                        syndrome: Syndrome::Ack {
                            credits: NO_CREDITS,
                        },
                        msn: *msn,
                    });
                }
                *next += 1;
                (h, data, *next >= *npkts)
            }
        };
        if done {
            if let Some(job) = self.resp.out.pop_front() {
                self.resp.job_done(&job);
            }
        }
        Some(self.respond(headers, payload))
    }

    fn respond(&self, mut h: Headers, payload: Vec<u8>) -> Transmit<R> {
        h.bth.pkey = self.cfg.pkey;
        Transmit {
            headers: h,
            payload: payload.into(),
            route: None,
        }
    }
}

/// The 40 bytes a UD receive buffer starts with: for IPv6 the IPv6 header,
/// for IPv4 twenty zero bytes and then the IPv4 header, as Linux rxe fills
/// them (`union rdma_network_hdr` in `include/rdma/ib_verbs.h`; rxe's
/// `send_data_in` copies the received IP header there).
pub fn grh_bytes(src: &Source, pkt: &Packet<'_>) -> [u8; GRH_SIZE] {
    let mut out = [0u8; GRH_SIZE];
    let frame = Frame {
        ip: src.ip,
        src_port: src.src_port,
        dst_port: src.dst_port,
        udp_checksum: false,
        packet: *pkt,
    };
    if let Ok(bytes) = frame.encode() {
        match src.ip {
            IpHeader::V4(_) => out[20..40].copy_from_slice(&bytes[..20]),
            IpHeader::V6(_) => out.copy_from_slice(&bytes[..40]),
        }
    }
    out
}
