//! The check behind the `roce_receive` fuzz target: arbitrary datagrams
//! from chosen sources through the receive stage
//! ([`crate::receive_segment()`], as a datagram or as one segment of a
//! coalesced GRO buffer) against a port with a few QPs whose filters the
//! input also chooses.
//! Replayed by `cargo test` (`tests/fuzz_corpus.rs`). Panics when an
//! invariant breaks.
//!
//! Input: 8 bytes per QP filter for three QPs (type, state, port, P_Key,
//! Q_Key, which peer its path names, QPN), then records until the input
//! ends: a flags byte (source, whether to sign the datagram with a valid
//! ICRC for its flow and with which IPv4 identification, kernel
//! truncation, its index in a GRO buffer: 0, 1, 7 or 0x1234), a time
//! step, a length byte and that many bytes of datagram. A signed packet
//! at index k carries identification k (a GSO segment's), or, with the
//! identification flag, 0x1234 at index 0 (a hashed one, as Linux rxe
//! writes) or 0 at a later index (a plain datagram the kernel coalesced).
//!
//! Checked for every datagram:
//!
//! * nothing panics;
//! * an accepted datagram names a QP of this port that [`crate::admit`]
//!   takes; a connected (RC, UC) QP's came from the GID of its path and
//!   to its own; its ICRC is right for the flow the stage returns, whose
//!   identification is the packet's index unless the stage says it
//!   solved for it (IPv4 only);
//! * a datagram the codec cannot parse is never accepted, and is dropped
//!   for its shape (oversized, truncated or malformed), not for anything
//!   a QP decides;
//! * a datagram signed with a valid ICRC for its flow (the identification
//!   its index says), naming a QP of this port that [`crate::admit`] takes, from that
//!   QP's peer if it is connected (from anyone if it is UD or GSI), no
//!   longer than the port's MTU allows, is accepted (the stage refuses
//!   nothing it should take).

use std::net::SocketAddr;
use std::time::Duration;

use provider::{Mtu, QpState, QpType};
use roce::{Endpoints, Packet};

use crate::receive::{admit, receive_segment, Discard, PathGids, Port, QpFilter, SolverGate};

/// The port's address, and the addresses a datagram may come from.
const LOCAL: &str = "10.0.0.1:4791";
const SOURCES: [&str; 4] = [
    "10.0.0.2:49152",  // the peer most QPs name
    "10.0.0.3:50000",  // the other peer
    "10.0.0.77:7",     // a stranger
    "[fe80::2]:49152", // another family: no flow to this IPv4 port
];

/// What a run did, for the seeds' test.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveOutcome {
    /// Datagrams accepted.
    pub accepted: u32,
    /// Of those, with a solved IPv4 identification.
    pub solved: u32,
    /// Datagrams dropped, by reason, in [`Discard::ALL`]'s order.
    pub discarded: [u32; Discard::ALL.len()],
}

/// The check (see the module documentation).
pub fn roce_receive(data: &[u8]) -> ReceiveOutcome {
    let mut out = ReceiveOutcome::default();
    let Some((head, mut rest)) = data.split_first_chunk::<24>() else {
        return out;
    };
    let port = Port {
        num: 1,
        local: LOCAL.parse().expect("literal"),
        mtu: Mtu::Mtu1024,
    };
    let local_gid = roce::gid_of(port.local.ip());
    let gid_of = |s: &str| roce::gid_of(s.parse::<SocketAddr>().expect("literal").ip());
    let filters: Vec<QpFilter> = head
        .chunks_exact(8)
        .map(|b| {
            let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi][usize::from(b[0] % 4)];
            let state = [
                QpState::Rts,
                QpState::Rtr,
                QpState::Sqd,
                QpState::Sqe,
                QpState::Init,
                QpState::Err,
                QpState::Reset,
                QpState::Rts,
            ][usize::from(b[1] % 8)];
            let qpn = if qp_type == QpType::Gsi {
                1
            } else {
                u32::from_be_bytes([0, b[5], b[6], b[7]]) | 2
            };
            let path = match b[0] >> 6 {
                0 | 1 => Some(PathGids {
                    remote: gid_of(SOURCES[0]),
                    local: local_gid,
                }),
                2 => Some(PathGids {
                    remote: gid_of(SOURCES[1]),
                    local: local_gid,
                }),
                _ => None,
            };
            QpFilter {
                qpn,
                qp_type,
                port: 1 + (b[2] & 1),
                state,
                pkey: if b[3] & 1 == 0 { 0xffff } else { 0x8001 },
                qkey: u32::from(b[4]) << 8,
                path: path.filter(|_| matches!(qp_type, QpType::Rc | QpType::Uc)),
            }
        })
        .collect();
    let mut gate = SolverGate::default();
    let mut now = Duration::ZERO;
    while let Some((&[flags, step, len], tail)) = rest.split_first_chunk::<3>() {
        let len = usize::from(len).min(tail.len());
        let (body, next) = tail.split_at(len);
        rest = next;
        now += Duration::from_micros(u64::from(step) * 50);
        let src: SocketAddr = SOURCES[usize::from(flags & 3)].parse().expect("literal");
        let mut bytes = body.to_vec();
        let sign = flags & 4 != 0;
        let index: u16 = [0, 1, 7, 0x1234][usize::from(flags >> 6)];
        let id = match (flags & 8 != 0, index) {
            (false, k) => k,
            (true, 0) => 0x1234,
            (true, _) => 0,
        };
        if sign {
            if let Ok(Endpoints::V4(mut v4)) = Endpoints::new(src, port.local) {
                v4.identification = id;
                if let Ok(crc) = roce::icrc::icrc(&Endpoints::V4(v4), &bytes) {
                    bytes.extend_from_slice(&roce::icrc::to_wire(crc));
                }
            }
        }
        let truncated = flags & 0x10 != 0;
        let src_opt = (flags & 0x20 == 0).then_some(src);
        let find = |qpn: u32| filters.iter().find(|f| f.qpn == qpn).map(|f| (*f, *f));
        let verdict = receive_segment(
            &port, &bytes, src_opt, truncated, index, now, &mut gate, find,
        );
        let parses = Packet::decode_without_icrc(&bytes).is_ok();
        match verdict {
            Ok(a) => {
                out.accepted += 1;
                out.solved += u32::from(a.solved);
                let f = a.qp;
                assert!(parses && !truncated && src_opt.is_some(), "{bytes:02x?}");
                assert_eq!(f.port, port.num);
                assert_eq!(admit(&f, &a.packet), Ok(()));
                if matches!(f.qp_type, QpType::Rc | QpType::Uc) {
                    let path = f.path.expect("a connected QP without a path took a packet");
                    assert_eq!(path.remote, roce::gid_of(src.ip()));
                    assert_eq!(path.local, local_gid);
                }
                assert!(
                    Packet::decode(&bytes, &a.endpoints).is_ok(),
                    "accepted with an ICRC wrong for its flow"
                );
                match a.endpoints {
                    Endpoints::V4(v4) => assert_eq!(v4.identification == index, !a.solved),
                    Endpoints::V6(_) => assert!(!a.solved),
                }
            }
            Err(why) => {
                let i = Discard::ALL.iter().position(|d| *d == why).expect("listed");
                out.discarded[i] += 1;
                if !parses && !truncated {
                    assert!(
                        matches!(
                            why,
                            Discard::Oversized | Discard::Truncated | Discard::Malformed
                        ),
                        "{why:?} for a datagram that does not parse"
                    );
                }
                // What the stage must take: a signed datagram from the
                // peer of a connected QP in RTS naming it, that it admits.
                if sign && id == index && !truncated && src_opt.is_some() && parses {
                    let pkt = Packet::decode_without_icrc(&bytes).expect("parses");
                    let named = filters.iter().find(|f| f.qpn == pkt.headers.bth.dest_qp);
                    let signed = Endpoints::new(src, port.local).is_ok();
                    if let (Some(f), true) = (named, signed) {
                        let from_peer = match f.qp_type {
                            QpType::Rc | QpType::Uc => {
                                f.path.is_some_and(|p| p.remote == roce::gid_of(src.ip()))
                            }
                            QpType::Ud | QpType::Gsi => true,
                        };
                        let fits = bytes.len() <= port.max_packet();
                        if f.port == port.num && from_peer && fits && admit(f, &pkt).is_ok() {
                            panic!("refused ({why:?}) what its QP takes: {bytes:02x?}");
                        }
                    }
                }
            }
        }
    }
    out
}
