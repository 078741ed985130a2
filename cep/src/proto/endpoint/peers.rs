//! Who may speak for a connection: a MAD that names a live connection is
//! taken only from that connection's peer (its port's address; on a
//! GID-routed RoCE port, its GID), and what a GID-routed port cannot do
//! (load alternate paths). `docs/cm-protocol.md`, "Who may speak for a
//! connection".

use super::{Conn, Endpoint};
use crate::proto::{PeerAddr, State};

impl Endpoint {
    /// Whether this port is routed by GID only (RoCE: LID 0), where LIDs
    /// mean nothing and no alternate path can be loaded.
    fn gid_routed(&self) -> bool {
        matches!(self.config.local_port, Some(p) if p.lid == 0)
    }

    /// Whether a MAD from `from` may come from `peer`, the port a
    /// connection talks to: on a GID-routed port the source GID (on RoCEv2
    /// the packet's IP source) must be the peer's; elsewhere the source LID
    /// must be, and the GIDs too when both the MAD (its GRH) and the peer
    /// carry one. The port, not the QP or UDP port: the UDP source port is
    /// entropy.
    fn is_peer(&self, peer: &PeerAddr, from: &PeerAddr) -> bool {
        const NO_GID: [u8; 16] = [0; 16];
        if self.gid_routed() {
            return from.gid == peer.gid;
        }
        from.lid == peer.lid && (from.gid == NO_GID || peer.gid == NO_GID || from.gid == peer.gid)
    }

    /// Whether `from` may speak for the CEP our comm id `local` names:
    /// anyone for an id that names nothing or a listener (the MAD finds no
    /// connection there anyway), only the peer for any other CEP. A MAD
    /// from anyone else is counted, and the caller handles it as naming no
    /// CEP, so its sender learns nothing, not even whether the id is live.
    /// (Linux's CM matches by comm id alone.)
    pub(super) fn source_may_name(&mut self, local: u32, from: PeerAddr) -> bool {
        let Some(c) = self.conns.get(local) else {
            return true;
        };
        if c.state == State::Listen || self.is_peer(&c.peer, &from) {
            return true;
        }
        self.not_from_peer += 1;
        false
    }

    /// Whether the CEP `id` exists and a MAD from `from` came from its peer.
    pub(super) fn came_from_peer(&self, id: u32, from: PeerAddr) -> bool {
        self.conns
            .get(id)
            .is_some_and(|c| self.is_peer(&c.peer, &from))
    }

    /// Looks up a CEP by the local id a message names, if the sender may
    /// name it (`source_may_name`), and checks the sender's comm id against
    /// what we know (an unknown remote id always matches).
    pub(super) fn lookup(&mut self, from: PeerAddr, local: u32, remote: u32) -> Option<&Conn> {
        if !self.source_may_name(local, from) {
            return None;
        }
        let c = self.conns.get(local)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == remote).then_some(c)
    }

    // -----------------------------------------------------------------------
    // Received MADs

    /// Whether this endpoint's port can load alternate paths (LAP/APR):
    /// not a RoCE port (LID 0, routed by GID only).
    pub(super) fn alternate_paths(&self) -> bool {
        !self.gid_routed()
    }
}
