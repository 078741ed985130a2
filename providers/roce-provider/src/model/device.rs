//! A whole device on the fake network (`fake_net`): datagrams a model
//! sends as a peer would, and what a model reads of the device.

use std::net::SocketAddr;

use crate::RoceDevice;

/// Sends, from `from` to `to` on the fake network, an RC SEND Only with
/// Immediate `imm` for QP `dest_qp` at PSN `psn` (no payload), encoded as
/// a peer would (ICRC for these addresses).
pub fn send_imm(from: SocketAddr, to: SocketAddr, dest_qp: u32, psn: u32, imm: u32) {
    let mut h = roce::Headers::new(roce::Bth::new(roce::Opcode::RcSendOnlyImm, dest_qp, psn));
    h.imm = Some(roce::ImmDt { value: imm });
    let ep = roce::Endpoints::new(from, to).expect("one IP version");
    let bytes = roce::Packet::new(h, &[]).encode(&ep).expect("encodes");
    crate::fake_net::send(from, &bytes, to);
}

/// Makes `dev` look busy-polled by an application now: the run of close
/// empty polls that makes its receive threads step aside
/// (`Dev::note_poll`). With the model's clock standing still it stays so
/// until a model advances the clock past the pollers' window (200 us).
pub fn mark_busy_polled(dev: &RoceDevice) {
    for _ in 0..16 {
        dev.shared.note_poll(0, None);
    }
}

/// A device's shared state kept past its close (its counters stay
/// readable once its threads are joined).
pub struct Kept(al::sync::Arc<crate::qp::Dev>);

/// Keeps `dev`'s shared state.
pub fn keep(dev: &RoceDevice) -> Kept {
    Kept(dev.shared.clone())
}

impl Kept {
    /// Port `port`'s (datagrams, packets passed to QPs) counters. Exact
    /// once nobody feeds the port any more (the device closed).
    pub fn fed_counters(&self, port: u8) -> (u64, u64) {
        let c = self.0.ports[usize::from(port - 1)].counters.snapshot();
        (c.rx_datagrams, c.rx_packets)
    }
}

/// A CQ's completion queue kept past its destroy.
pub struct KeptCq(al::sync::Arc<crate::cq::CqInner>);

/// Keeps `cq`'s queue: what reaches it after the CQ's destroy shows.
pub fn keep_cq(cq: &crate::RoceCq) -> KeptCq {
    KeptCq(cq.inner.clone())
}

impl KeptCq {
    /// Completions queued and not polled.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
