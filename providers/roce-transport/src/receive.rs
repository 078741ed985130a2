//! The receive stage: the one function every datagram a RoCEv2 port takes
//! goes through before any QP's transport sees it ([`receive`]), as Linux
//! rxe's `rxe_rcv` runs `hdr_check` and `check_addr` before the
//! requester, responder and completer, and quinn-proto's
//! `Endpoint::handle` decides a datagram's fate before a connection
//! sees it.
//!
//! Cheap checks first, the ICRC last, per-QP state never:
//!
//! 1. **shape**: no longer than a packet of the port's MTU can be, a BTH
//!    and the extension headers its opcode names, a payload only where
//!    the opcode allows one, a pad that fits, a length a multiple of 4;
//! 2. **destination QP**: a QP with the BTH's destination QPN exists
//!    ([`QpFilter`], which the provider keeps beside each QP and replaces
//!    at every modify) and lives on *this* port;
//! 3. **the QP takes it** ([`admit`]): the opcode belongs to the QP's
//!    type, the QP receives in its state (RTR, RTS, SQD, SQE), the P_Key
//!    matches, and for UD and GSI the DETH's Q_Key is the QP's;
//! 4. **addresses** (RC and UC): the datagram's source IP is the GID of
//!    the QP's primary path (its peer) and its destination IP is the
//!    QP's own GID. The UDP source port is entropy (ECMP) and is not
//!    checked. UD and GSI take datagrams from anyone, by design;
//! 5. **ICRC** over the IP and UDP headers as the socket shows them: for
//!    IPv4 with the identification the sender's kernel wrote if it sent
//!    the packet as segment `k` of a GSO super-datagram (`k`, which the
//!    packet's place in a GRO buffer tells: [`receive_segment`]), else 0
//!    (DF set, unconnected socket); and for IPv4 senders that write
//!    another identification (Linux rxe, NICs), the identification that
//!    makes it right ([`roce::icrc::solve_ipv4_identification_from`]),
//!    found only for sources the [`SolverGate`] lets through.
//!
//! A datagram that fails a check is a [`Discard`] with its reason, for
//! the port's counters; one that passes is [`Accepted`], with its QP and
//! the flow (identification included) its ICRC was verified for. Nothing
//! here panics or allocates on any input.
//!
//! Why addresses: without step 4 anyone who can reach the port's UDP
//! socket and guess a QPN (they are sequential from a random start)
//! could deliver a SEND at the expected PSN into a connected QP, move it
//! to ERR with one out-of-sequence packet, complete a SEND that reached
//! nobody with a forged ACK, or deliver into a UC QP at any PSN. RoCE has
//! no authentication: a sender that spoofs the peer's address (on path,
//! or on a network that lets it) still can, within the PSN window
//! (`docs/security.md`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use provider::{Gid, Mtu, QpState, QpType};
use roce::{DecodeError, Endpoints, Packet, Transport as Service};

/// The port a datagram arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    /// Port number (1-based).
    pub num: u8,
    /// The address its socket is bound to: the destination of every
    /// datagram it takes, and so its GID.
    pub local: SocketAddr,
    /// The port's MTU: no packet is longer than this plus headers.
    pub mtu: Mtu,
}

impl Port {
    /// The longest UDP payload a packet of this port's MTU has: the
    /// payload, the longest header chain (BTH + AtomicETH: 40 bytes), pad
    /// and ICRC, rounded up.
    pub fn max_packet(&self) -> usize {
        self.mtu.bytes() + 64
    }
}

/// The two GIDs of a connected QP's primary path: every packet of the
/// connection comes from `remote` to `local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathGids {
    /// The peer's GID (the path's destination GID).
    pub remote: Gid,
    /// This QP's GID (the path's source GID: its port's).
    pub local: Gid,
}

/// What the receive stage checks a packet against: a QP's identity on the
/// receive side, kept by the provider beside the QP (replaced at every
/// modify) so the check takes no lock of the QP and touches none of its
/// transport state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpFilter {
    /// The QP number packets for it carry (1 for a GSI QP).
    pub qpn: u32,
    /// Its type.
    pub qp_type: QpType,
    /// The port it lives on (1-based).
    pub port: u8,
    /// Its state: it takes packets in RTR, RTS, SQD and SQE.
    pub state: QpState,
    /// Its P_Key.
    pub pkey: u16,
    /// Its Q_Key (UD; a GSI QP's is always `provider::GSI_QKEY`).
    pub qkey: u32,
    /// RC and UC from RTR on: its connection's addresses.
    pub path: Option<PathGids>,
}

/// Why a datagram was dropped: one port counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Discard {
    /// Longer than any packet of the port's MTU (or truncated to the
    /// receive buffer by the kernel).
    Oversized,
    /// Shorter than its headers say.
    Truncated,
    /// Not a well-formed RoCEv2 packet (unknown opcode, payload where
    /// none may be, misaligned, pad too large, no source address).
    Malformed,
    /// No QP with the destination QPN (or QPN 0).
    UnknownQp,
    /// The destination QP lives on another port of the device.
    WrongPort,
    /// The opcode does not belong to the QP's type (or names another QP).
    BadOpcode,
    /// The QP does not take packets in its state (RESET, INIT, ERR).
    BadState,
    /// P_Key mismatch.
    BadPkey,
    /// Q_Key mismatch (UD, GSI).
    BadQkey,
    /// RC/UC: the source address is not the QP's peer.
    WrongSource,
    /// RC/UC: the destination address is not the QP's own.
    WrongDestination,
    /// The ICRC is wrong (for IPv4, for every identification, when the
    /// solver ran).
    BadIcrc,
    /// IPv4: the ICRC is wrong with identification 0, and the solver was
    /// not run: the source is unknown and its first-contact budget spent
    /// ([`SolverGate`]).
    IcrcUnsolved,
}

impl Discard {
    /// Every reason, in the stage's order.
    pub const ALL: [Discard; 13] = [
        Discard::Oversized,
        Discard::Truncated,
        Discard::Malformed,
        Discard::UnknownQp,
        Discard::WrongPort,
        Discard::BadOpcode,
        Discard::BadState,
        Discard::BadPkey,
        Discard::BadQkey,
        Discard::WrongSource,
        Discard::WrongDestination,
        Discard::BadIcrc,
        Discard::IcrcUnsolved,
    ];
}

impl std::fmt::Display for Discard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Discard::Oversized => "longer than any packet of the port's MTU",
            Discard::Truncated => "shorter than its headers",
            Discard::Malformed => "not a well-formed RoCEv2 packet",
            Discard::UnknownQp => "no such QP",
            Discard::WrongPort => "the QP lives on another port",
            Discard::BadOpcode => "opcode of another QP type",
            Discard::BadState => "the QP does not receive in its state",
            Discard::BadPkey => "P_Key mismatch",
            Discard::BadQkey => "Q_Key mismatch",
            Discard::WrongSource => "not from the connection's peer",
            Discard::WrongDestination => "not to the connection's own address",
            Discard::BadIcrc => "ICRC mismatch",
            Discard::IcrcUnsolved => "ICRC mismatch, solver not run for an unknown source",
        })
    }
}

/// A datagram that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted<'a, Q> {
    /// The destination QP, as the lookup gave it.
    pub qp: Q,
    /// The packet.
    pub packet: Packet<'a>,
    /// The flow its ICRC was verified for (for IPv4, with the
    /// identification it was verified with: its index in a GRO buffer,
    /// or the one the solver found when that one had to be solved for).
    pub endpoints: Endpoints,
    /// Whether the IPv4 identification had to be solved for.
    pub solved: bool,
}

/// Whether a QP described by `filter` takes `pkt`: the checks of step 3
/// (opcode against type, state, P_Key, Q_Key), and that the packet names
/// this QP. Shared by [`receive`] and `Transport::handle_packet` (which
/// checks its own view: a transport driven without this stage still
/// refuses what is not its own).
pub fn admit(filter: &QpFilter, pkt: &Packet<'_>) -> Result<(), Discard> {
    let bth = &pkt.headers.bth;
    let service = bth.opcode.transport();
    let fits = matches!(
        (filter.qp_type, service),
        (QpType::Rc, Service::Rc)
            | (QpType::Uc, Service::Uc)
            | (QpType::Ud | QpType::Gsi, Service::Ud)
    );
    if !fits || bth.dest_qp != filter.qpn {
        return Err(Discard::BadOpcode);
    }
    if !filter.state.can_receive() {
        return Err(Discard::BadState);
    }
    if !pkey_match(bth.pkey, filter.pkey) {
        return Err(Discard::BadPkey);
    }
    if let QpType::Ud | QpType::Gsi = filter.qp_type {
        let want = if filter.qp_type == QpType::Gsi {
            provider::GSI_QKEY
        } else {
            filter.qkey
        };
        match pkt.headers.deth {
            Some(deth) if deth.qkey == want => {}
            Some(_) => return Err(Discard::BadQkey),
            None => return Err(Discard::Malformed),
        }
    }
    Ok(())
}

/// The receive stage: `bytes` (a UDP payload from `src`, `truncated` if
/// the kernel cut it to the receive buffer) arrived on `port` at `now`;
/// `find` looks up the QP a destination QPN names on this port (with its
/// [`QpFilter`]); `gate` decides whom the identification solver runs for.
/// See the module documentation for the checks and their order.
///
/// A datagram the kernel did not coalesce: [`receive_segment`] at index 0.
pub fn receive<'a, Q>(
    port: &Port,
    bytes: &'a [u8],
    src: Option<SocketAddr>,
    truncated: bool,
    now: Duration,
    gate: &mut SolverGate,
    find: impl FnOnce(u32) -> Option<(Q, QpFilter)>,
) -> Result<Accepted<'a, Q>, Discard> {
    receive_segment(port, bytes, src, truncated, 0, now, gate, find)
}

/// The receive stage ([`receive`]) for the packet at `index` (from 0) of
/// a buffer the kernel coalesced (UDP GRO), `truncated` if the kernel cut
/// the buffer within or before its end.
///
/// A GSO sender's kernel gives segment `k` of a super-datagram the IPv4
/// identification `k` (DF set, unconnected socket: it counts up from the
/// header's 0), and a receiver's GRO on the same path hands the
/// super-datagram over whole, so the packet's ICRC is checked for
/// identification `index` first; a packet whose ICRC was computed for
/// another identification (a GRO buffer that joined two super-datagrams,
/// or coalesced plain datagrams that all carry 0, or hashed ones) goes to
/// the solver as any other, under the same gate. IPv6 has no
/// identification: `index` plays no part.
// The stage's inputs are the datagram's and the port's, as for `receive`,
// and one more: bundling them would only move the count into a struct
// every caller builds for one call.
#[allow(clippy::too_many_arguments)]
pub fn receive_segment<'a, Q>(
    port: &Port,
    bytes: &'a [u8],
    src: Option<SocketAddr>,
    truncated: bool,
    index: u16,
    now: Duration,
    gate: &mut SolverGate,
    find: impl FnOnce(u32) -> Option<(Q, QpFilter)>,
) -> Result<Accepted<'a, Q>, Discard> {
    // 1. Shape.
    if truncated || bytes.len() > port.max_packet() {
        return Err(Discard::Oversized);
    }
    let src = src.ok_or(Discard::Malformed)?;
    let packet = Packet::decode_without_icrc(bytes).map_err(|e| match e {
        DecodeError::Truncated { .. } => Discard::Truncated,
        _ => Discard::Malformed,
    })?;
    // 2. Destination QP, on this port.
    let dest = packet.headers.bth.dest_qp;
    if dest == 0 {
        return Err(Discard::UnknownQp);
    }
    let (qp, filter) = find(dest).ok_or(Discard::UnknownQp)?;
    if filter.port != port.num {
        return Err(Discard::WrongPort);
    }
    // 3. The QP takes this packet.
    admit(&filter, &packet)?;
    // 4. Addresses of a connection.
    let connected = matches!(filter.qp_type, QpType::Rc | QpType::Uc);
    if connected {
        let path = filter.path.ok_or(Discard::WrongSource)?;
        if roce::gid_of(src.ip()) != path.remote {
            return Err(Discard::WrongSource);
        }
        if roce::gid_of(port.local.ip()) != path.local {
            return Err(Discard::WrongDestination);
        }
    }
    // 5. ICRC, first for the identification the packet's place in a GRO
    // buffer says it has.
    let mut endpoints = Endpoints::new(src, port.local).map_err(|_| Discard::Malformed)?;
    if let Endpoints::V4(v4) = &mut endpoints {
        v4.identification = index;
    }
    let (body, tail) = bytes.split_at(bytes.len() - roce::ICRC_LEN);
    let carried = roce::icrc::from_wire([tail[0], tail[1], tail[2], tail[3]]);
    let computed = roce::icrc::icrc(&endpoints, body).map_err(|_| Discard::Oversized)?;
    let mut solved = false;
    if computed != carried {
        let Endpoints::V4(v4) = &mut endpoints else {
            return Err(Discard::BadIcrc);
        };
        if !gate.allows(*v4.src.ip(), connected, now) {
            return Err(Discard::IcrcUnsolved);
        }
        let id = roce::icrc::solve_ipv4_identification_from(
            computed,
            v4.identification,
            body.len(),
            carried,
        )
        .ok_or(Discard::BadIcrc)?;
        v4.identification = id;
        gate.solved(*v4.src.ip(), now);
        solved = true;
    }
    Ok(Accepted {
        qp,
        packet,
        endpoints,
        solved,
    })
}

/// Most sources a port remembers as needing the identification solver.
pub const SOLVER_PEERS: usize = 64;
/// Solver runs for unknown sources a port allows at once...
pub const FIRST_CONTACT_BURST: u32 = 32;
/// ... and one more per this much time.
pub const FIRST_CONTACT_EVERY: Duration = Duration::from_millis(1);

/// Which IPv4 sources the identification solver runs for, per port.
///
/// A datagram whose ICRC is wrong with identification 0 is either from a
/// sender that writes another identification (Linux rxe, a NIC: the
/// kernel does not show it to a UDP socket) or corrupt or forged. The
/// solver (constant time) finds the one identification that would make
/// it right, if any, which leaves 16 of the ICRC's 32 bits as a check. It
/// runs for:
///
/// * a connected QP's packets whose source is its peer (step 4 passed);
/// * UD and GSI packets from a source whose packets needed it before
///   (remembered, at most [`SOLVER_PEERS`], the least recently seen
///   forgotten first);
/// * other UD and GSI packets (a new peer's first MAD) within a budget of
///   [`FIRST_CONTACT_BURST`] at once and one per [`FIRST_CONTACT_EVERY`],
///   so a flood of bad-ICRC datagrams from strangers buys at most that
///   many solver runs (counted as [`Discard::IcrcUnsolved`] past it).
#[derive(Debug, Clone)]
pub struct SolverGate {
    /// Sources that needed the solver, with when they last did: the
    /// first `known` entries.
    peers: [(Ipv4Addr, Duration); SOLVER_PEERS],
    known: usize,
    /// First-contact runs left, and when the budget was last topped up.
    tokens: u32,
    topped_up: Duration,
}

impl Default for SolverGate {
    fn default() -> Self {
        SolverGate {
            peers: [(Ipv4Addr::UNSPECIFIED, Duration::ZERO); SOLVER_PEERS],
            known: 0,
            tokens: FIRST_CONTACT_BURST,
            topped_up: Duration::ZERO,
        }
    }
}

impl SolverGate {
    /// Whether the solver may run for a packet from `src` at `now`
    /// (`connected`: it is a connected QP's packet from its peer).
    pub fn allows(&mut self, src: Ipv4Addr, connected: bool, now: Duration) -> bool {
        if connected || self.knows(src) {
            return true;
        }
        let periods =
            now.saturating_sub(self.topped_up).as_nanos() / FIRST_CONTACT_EVERY.as_nanos();
        if periods >= u128::from(FIRST_CONTACT_BURST) {
            self.tokens = FIRST_CONTACT_BURST;
            self.topped_up = now;
        } else if periods > 0 {
            // `periods` < the burst: the casts cannot truncate.
            self.tokens = (self.tokens + periods as u32).min(FIRST_CONTACT_BURST);
            self.topped_up += FIRST_CONTACT_EVERY * periods as u32;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Whether `src` needed the solver before (and is remembered).
    pub fn knows(&self, src: Ipv4Addr) -> bool {
        self.peers[..self.known].iter().any(|(ip, _)| *ip == src)
    }

    /// A packet from `src` was accepted with a solved identification at
    /// `now`: remember the source.
    pub fn solved(&mut self, src: Ipv4Addr, now: Duration) {
        let known = &mut self.peers[..self.known];
        if let Some(p) = known.iter_mut().find(|(ip, _)| *ip == src) {
            p.1 = now;
        } else if self.known < SOLVER_PEERS {
            self.peers[self.known] = (src, now);
            self.known += 1;
        } else if let Some(oldest) = self.peers.iter_mut().min_by_key(|(_, at)| *at) {
            *oldest = (src, now);
        }
    }

    /// Sources remembered now.
    pub fn peers(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.peers[..self.known]
            .iter()
            .map(|(ip, _)| IpAddr::V4(*ip))
    }
}

/// P_Key match (IBTA §10.9.3): the low 15 bits agree and at least one of
/// the two is a full member.
pub fn pkey_match(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a | b) & 0x8000 != 0 && (a & 0x7fff) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::{Bth, Deth, Headers, Opcode};

    const PEER: &str = "10.0.0.2:49152";
    const ME: &str = "10.0.0.1:4791";

    fn port() -> Port {
        Port {
            num: 1,
            local: ME.parse().unwrap(),
            mtu: Mtu::Mtu1024,
        }
    }

    fn rc() -> QpFilter {
        let ip = |s: &str| roce::gid_of(s.parse::<SocketAddr>().unwrap().ip());
        QpFilter {
            qpn: 0x11,
            qp_type: QpType::Rc,
            port: 1,
            state: QpState::Rts,
            pkey: 0xffff,
            qkey: 0,
            path: Some(PathGids {
                remote: ip(PEER),
                local: ip(ME),
            }),
        }
    }

    fn ud(qp_type: QpType) -> QpFilter {
        QpFilter {
            qpn: if qp_type == QpType::Gsi { 1 } else { 0x22 },
            qp_type,
            qkey: 0x1234,
            path: None,
            ..rc()
        }
    }

    /// The UDP payload of `h` + `payload` from `from` to [`ME`], with the
    /// IPv4 identification `id` in its ICRC.
    fn datagram(h: Headers, payload: &[u8], from: &str, id: u16) -> Vec<u8> {
        let mut ep = Endpoints::new(from.parse().unwrap(), ME.parse().unwrap()).unwrap();
        if let Endpoints::V4(v4) = &mut ep {
            v4.identification = id;
        }
        Packet::new(h, payload).encode(&ep).unwrap()
    }

    fn send(dest: u32, psn: u32) -> Headers {
        Headers::new(Bth::new(Opcode::RcSendOnly, dest, psn))
    }

    fn ud_send(dest: u32, qkey: u32) -> Headers {
        let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, dest, 0));
        h.deth = Some(Deth { qkey, src_qp: 5 });
        h
    }

    /// The stage's verdict on `bytes` from `from`, with `qps` on the port.
    fn verdict(bytes: &[u8], from: &str, qps: &[QpFilter]) -> Result<(u32, bool), Discard> {
        let mut gate = SolverGate::default();
        verdict_with(bytes, from, qps, &mut gate, Duration::ZERO)
    }

    fn verdict_with(
        bytes: &[u8],
        from: &str,
        qps: &[QpFilter],
        gate: &mut SolverGate,
        now: Duration,
    ) -> Result<(u32, bool), Discard> {
        let find = |qpn: u32| qps.iter().find(|f| f.qpn == qpn).map(|f| (f.qpn, *f));
        receive(
            &port(),
            bytes,
            Some(from.parse().unwrap()),
            false,
            now,
            gate,
            find,
        )
        .map(|a| (a.qp, a.solved))
    }

    #[test]
    fn a_connection_takes_packets_only_from_its_peer_to_its_own_address() {
        let qps = [rc()];
        let good = datagram(send(0x11, 0), b"hello", PEER, 0);
        assert_eq!(verdict(&good, PEER, &qps), Ok((0x11, false)));
        // Another UDP source port of the peer: entropy, accepted.
        let other_port = datagram(send(0x11, 0), b"hello", "10.0.0.2:50000", 0);
        assert_eq!(
            verdict(&other_port, "10.0.0.2:50000", &qps),
            Ok((0x11, false))
        );
        // A stranger's packet, with a valid ICRC for its own flow.
        let forged = datagram(send(0x11, 0), b"hello", "10.0.0.77:49152", 0);
        assert_eq!(
            verdict(&forged, "10.0.0.77:49152", &qps),
            Err(Discard::WrongSource)
        );
        // The same for an ACK (the completer's input) and a UC SEND.
        let mut ack = Headers::new(Bth::new(Opcode::RcAck, 0x11, 0));
        ack.aeth = Some(roce::Aeth {
            syndrome: roce::Syndrome::Ack { credits: 31 },
            msn: 1,
        });
        let forged_ack = datagram(ack, b"", "10.0.0.77:1", 0);
        assert_eq!(
            verdict(&forged_ack, "10.0.0.77:1", &qps),
            Err(Discard::WrongSource)
        );
        let uc = QpFilter {
            qp_type: QpType::Uc,
            ..rc()
        };
        let uc_send = datagram(
            Headers::new(Bth::new(Opcode::UcSendOnly, 0x11, 0x77)),
            b"x",
            "10.0.0.77:1",
            0,
        );
        assert_eq!(
            verdict(&uc_send, "10.0.0.77:1", &[uc]),
            Err(Discard::WrongSource)
        );
        // A QP whose path names another local GID (a port of several
        // addresses) takes nothing sent to this one.
        let elsewhere = QpFilter {
            path: Some(PathGids {
                local: roce::gid_of("10.0.0.9".parse().unwrap()),
                ..rc().path.unwrap()
            }),
            ..rc()
        };
        assert_eq!(
            verdict(&good, PEER, &[elsewhere]),
            Err(Discard::WrongDestination)
        );
        // A connected QP with no path yet takes nothing.
        let pathless = QpFilter { path: None, ..rc() };
        assert_eq!(verdict(&good, PEER, &[pathless]), Err(Discard::WrongSource));
    }

    #[test]
    fn each_check_names_its_reason() {
        let qps = [rc(), ud(QpType::Ud), ud(QpType::Gsi)];
        let good = datagram(send(0x11, 0), b"hello", PEER, 0);
        let cases: Vec<(Vec<u8>, QpFilter, Discard)> = vec![
            (vec![0u8; 2000], rc(), Discard::Oversized),
            (vec![0x04, 0, 0], rc(), Discard::Truncated),
            (vec![0xff; 16], rc(), Discard::Malformed),
            (
                datagram(send(0x99, 0), b"x", PEER, 0),
                rc(),
                Discard::UnknownQp,
            ),
            (
                datagram(send(0, 0), b"x", PEER, 0),
                rc(),
                Discard::UnknownQp,
            ),
            (
                good.clone(),
                QpFilter { port: 2, ..rc() },
                Discard::WrongPort,
            ),
            (
                datagram(
                    Headers::new(Bth::new(Opcode::UcSendOnly, 0x11, 0)),
                    b"x",
                    PEER,
                    0,
                ),
                rc(),
                Discard::BadOpcode,
            ),
            (
                good.clone(),
                QpFilter {
                    state: QpState::Init,
                    ..rc()
                },
                Discard::BadState,
            ),
            (
                good.clone(),
                QpFilter {
                    state: QpState::Err,
                    ..rc()
                },
                Discard::BadState,
            ),
            (
                good.clone(),
                QpFilter {
                    pkey: 0x8001,
                    ..rc()
                },
                Discard::BadPkey,
            ),
            (
                datagram(ud_send(0x22, 0x4321), b"x", PEER, 0),
                ud(QpType::Ud),
                Discard::BadQkey,
            ),
            (
                datagram(ud_send(1, 0x1234), b"x", PEER, 0),
                ud(QpType::Gsi),
                Discard::BadQkey,
            ),
        ];
        for (bytes, filter, why) in cases {
            let mut list = qps.to_vec();
            list.retain(|f| f.qpn != filter.qpn);
            list.push(filter);
            assert_eq!(verdict(&bytes, PEER, &list), Err(why), "{why:?}");
        }
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(verdict(&bad, PEER, &qps), Err(Discard::BadIcrc));
        // Datagrams take packets from anyone, with their Q_Key.
        let gsi = datagram(ud_send(1, provider::GSI_QKEY), b"mad", "10.0.0.77:5", 0);
        assert_eq!(verdict(&gsi, "10.0.0.77:5", &qps), Ok((1, false)));
        let ud_ok = datagram(ud_send(0x22, 0x1234), b"x", "10.0.0.78:5", 0);
        assert_eq!(verdict(&ud_ok, "10.0.0.78:5", &qps), Ok((0x22, false)));
        // No source address (not a UDP datagram) and a kernel-truncated one.
        let mut gate = SolverGate::default();
        let none = receive(
            &port(),
            &good,
            None,
            false,
            Duration::ZERO,
            &mut gate,
            |_| Some(((), rc())),
        );
        assert_eq!(none.map(|_| ()), Err(Discard::Malformed));
        let cut = receive(
            &port(),
            &good,
            Some(PEER.parse().unwrap()),
            true,
            Duration::ZERO,
            &mut gate,
            |_| Some(((), rc())),
        );
        assert_eq!(cut.map(|_| ()), Err(Discard::Oversized));
    }

    #[test]
    fn a_stranger_is_refused_before_its_icrc_is_computed() {
        // A wrong ICRC from a stranger is a wrong source, not a bad ICRC:
        // the address check comes first, so a flood of such datagrams at
        // a connection costs no CRC.
        let mut forged = datagram(send(0x11, 0), &[7; 900], "10.0.0.77:1", 0);
        *forged.last_mut().unwrap() ^= 0xff;
        assert_eq!(
            verdict(&forged, "10.0.0.77:1", &[rc()]),
            Err(Discard::WrongSource)
        );
    }

    #[test]
    fn the_solver_runs_for_a_peer_and_within_a_budget_for_strangers() {
        // A connection's peer writing identifications (Linux rxe): solved.
        let qps = [rc(), ud(QpType::Gsi)];
        let rxe = datagram(send(0x11, 0), b"hello", PEER, 0x3c21);
        assert_eq!(verdict(&rxe, PEER, &qps), Ok((0x11, true)));
        // GSI from an unknown source: within the first-contact budget,
        // then refused until the budget refills; a source that needed it
        // once is solved whatever the budget.
        let mut gate = SolverGate::default();
        let at = |ms: u64| Duration::from_millis(ms);
        let mad = |from: &str, id: u16| datagram(ud_send(1, provider::GSI_QKEY), b"mad", from, id);
        let first = mad(PEER, 0x0101);
        assert_eq!(
            verdict_with(&first, PEER, &qps, &mut gate, at(0)),
            Ok((1, true))
        );
        assert!(gate.knows(
            PEER.parse::<std::net::SocketAddrV4>()
                .unwrap()
                .ip()
                .to_owned()
        ));
        let mut flood = mad("10.0.0.77:9", 0);
        *flood.last_mut().unwrap() ^= 0x5a;
        let mut unsolved = 0;
        for _ in 0..FIRST_CONTACT_BURST + 10 {
            match verdict_with(&flood, "10.0.0.77:9", &qps, &mut gate, at(0)) {
                Err(Discard::IcrcUnsolved) => unsolved += 1,
                Err(Discard::BadIcrc) => {}
                other => panic!("{other:?}"),
            }
        }
        // The budget is FIRST_CONTACT_BURST at once, and the peer's first
        // MAD took one of it.
        assert_eq!(unsolved, 11);
        // The known peer is still solved while the budget is spent.
        let again = mad(PEER, 0x0202);
        assert_eq!(
            verdict_with(&again, PEER, &qps, &mut gate, at(0)),
            Ok((1, true))
        );
        // A new peer at the same moment is not; one period later it is.
        let newcomer = mad("10.0.0.3:7", 0x0303);
        assert_eq!(
            verdict_with(&newcomer, "10.0.0.3:7", &qps, &mut gate, at(0)),
            Err(Discard::IcrcUnsolved)
        );
        assert_eq!(
            verdict_with(&newcomer, "10.0.0.3:7", &qps, &mut gate, at(1)),
            Ok((1, true))
        );
    }

    /// The verdict on segment `index` of a GRO buffer, with the
    /// identification it was verified for.
    fn segment_verdict(
        bytes: &[u8],
        from: &str,
        index: u16,
        qps: &[QpFilter],
        gate: &mut SolverGate,
    ) -> Result<(u32, bool, Option<u16>), Discard> {
        let find = |qpn: u32| qps.iter().find(|f| f.qpn == qpn).map(|f| (f.qpn, *f));
        receive_segment(
            &port(),
            bytes,
            Some(from.parse().unwrap()),
            false,
            index,
            Duration::ZERO,
            gate,
            find,
        )
        .map(|a| {
            let id = match a.endpoints {
                Endpoints::V4(v4) => Some(v4.identification),
                Endpoints::V6(_) => None,
            };
            (a.qp, a.solved, id)
        })
    }

    #[test]
    fn a_gso_segment_verifies_for_its_index_without_the_solver() {
        let qps = [rc(), ud(QpType::Ud)];
        let mut gate = SolverGate::default();
        for k in [0u16, 1, 2, 7, 63, 0x1234] {
            let seg = datagram(send(0x11, u32::from(k)), &[k as u8; 64], PEER, k);
            assert_eq!(
                segment_verdict(&seg, PEER, k, &qps, &mut gate),
                Ok((0x11, false, Some(k))),
                "segment {k}"
            );
            // The same at another index: right only through the solver
            // (a connected QP's peer: always allowed).
            if k != 0 {
                assert_eq!(
                    segment_verdict(&seg, PEER, 0, &qps, &mut gate),
                    Ok((0x11, true, Some(k)))
                );
            }
            // A UD packet from a stranger too: no solver run spent on it.
            let stranger = "10.0.0.99:1";
            let udp = datagram(ud_send(0x22, 0x1234), b"gso", stranger, k);
            let mut fresh = SolverGate::default();
            assert_eq!(
                segment_verdict(&udp, stranger, k, &qps, &mut fresh),
                Ok((0x22, false, Some(k)))
            );
            assert!(fresh.peers().next().is_none(), "the solver did not run");
        }
        assert!(gate.peers().next().is_some());
    }

    /// A buffer the kernel coalesced from datagrams that all carry
    /// identification 0 (plain sends, GRO on a NIC), or one that joined
    /// two super-datagrams: a segment at index k > 0 whose ICRC is for
    /// another identification still verifies through the solver, for a
    /// connection's peer always and for UD within the gate.
    #[test]
    fn a_segment_computed_for_another_identification_goes_through_the_solver() {
        let qps = [rc(), ud(QpType::Ud)];
        let mut gate = SolverGate::default();
        let plain = datagram(send(0x11, 5), b"plain", PEER, 0);
        assert_eq!(
            segment_verdict(&plain, PEER, 3, &qps, &mut gate),
            Ok((0x11, true, Some(0)))
        );
        let second_run = datagram(send(0x11, 6), b"second", PEER, 1);
        assert_eq!(
            segment_verdict(&second_run, PEER, 9, &qps, &mut gate),
            Ok((0x11, true, Some(1)))
        );
        // A UD stranger's: solved within the first-contact budget, then
        // refused until it refills (as a non-coalesced datagram would be).
        let stranger = "10.0.0.99:1";
        let udp = datagram(ud_send(0x22, 0x1234), b"x", stranger, 0);
        let mut gate = SolverGate::default();
        let mut verdicts = Vec::new();
        for _ in 0..FIRST_CONTACT_BURST + 1 {
            verdicts.push(segment_verdict(&udp, stranger, 4, &qps, &mut gate));
        }
        // Solved once, the source is known: every later one passes.
        assert!(verdicts.iter().all(|v| *v == Ok((0x22, true, Some(0)))));
        let mut flood = SolverGate::default();
        let other = datagram(ud_send(0x22, 0x1234), b"x", "10.0.0.98:1", 0);
        let mut bad = other.clone();
        *bad.last_mut().unwrap() ^= 0x5a;
        let refused = (0..FIRST_CONTACT_BURST + 3)
            .filter(|_| {
                segment_verdict(&bad, "10.0.0.98:1", 4, &qps, &mut flood)
                    == Err(Discard::IcrcUnsolved)
            })
            .count();
        assert_eq!(refused, 3);
        // A corrupt segment is still refused.
        let mut corrupt = datagram(send(0x11, 7), b"bad", PEER, 2);
        *corrupt.last_mut().unwrap() ^= 1;
        assert_eq!(
            segment_verdict(&corrupt, PEER, 2, &qps, &mut gate),
            Err(Discard::BadIcrc)
        );
    }

    #[test]
    fn ipv6_segments_ignore_their_index() {
        let six_peer = "[fd00::2]:49152";
        let port6 = Port {
            local: "[fd00::1]:4791".parse().unwrap(),
            ..port()
        };
        let ip = |s: &str| roce::gid_of(s.parse::<SocketAddr>().unwrap().ip());
        let filter = QpFilter {
            path: Some(PathGids {
                remote: ip(six_peer),
                local: ip("[fd00::1]:4791"),
            }),
            ..rc()
        };
        let ep = Endpoints::new(six_peer.parse().unwrap(), port6.local).unwrap();
        let seg = Packet::new(send(0x11, 0), b"six").encode(&ep).unwrap();
        for index in [0u16, 1, 5] {
            let mut gate = SolverGate::default();
            let got = receive_segment(
                &port6,
                &seg,
                Some(six_peer.parse().unwrap()),
                false,
                index,
                Duration::ZERO,
                &mut gate,
                |_| Some(((), filter)),
            )
            .map(|a| (a.solved, a.endpoints == ep));
            assert_eq!(got, Ok((false, true)), "index {index}");
        }
    }

    #[test]
    fn the_gate_remembers_a_bounded_set_of_peers() {
        let mut gate = SolverGate::default();
        let ip = |i: u32| Ipv4Addr::from(0x0a00_0000 + i);
        for i in 0..(SOLVER_PEERS as u32 + 8) {
            gate.solved(ip(i), Duration::from_micros(u64::from(i)));
        }
        assert_eq!(gate.peers().count(), SOLVER_PEERS);
        // The least recently seen went first.
        assert!(!gate.knows(ip(0)) && !gate.knows(ip(7)));
        assert!(gate.knows(ip(8)) && gate.knows(ip(SOLVER_PEERS as u32 + 7)));
        // Refreshing one keeps it.
        gate.solved(ip(8), Duration::from_secs(1));
        gate.solved(ip(1000), Duration::from_secs(2));
        assert!(gate.knows(ip(8)) && !gate.knows(ip(9)));
    }

    #[test]
    fn admit_is_what_a_transport_checks_of_its_own_packets() {
        let pkt_bytes = datagram(send(0x11, 0), b"x", PEER, 0);
        let pkt = Packet::decode_without_icrc(&pkt_bytes).unwrap();
        assert_eq!(admit(&rc(), &pkt), Ok(()));
        assert_eq!(
            admit(&QpFilter { qpn: 0x12, ..rc() }, &pkt),
            Err(Discard::BadOpcode)
        );
        // RTR, SQD and SQE receive; RESET does not.
        for (state, ok) in [
            (QpState::Rtr, true),
            (QpState::Sqd, true),
            (QpState::Sqe, true),
            (QpState::Reset, false),
        ] {
            assert_eq!(
                admit(&QpFilter { state, ..rc() }, &pkt).is_ok(),
                ok,
                "{state}"
            );
        }
    }
}
