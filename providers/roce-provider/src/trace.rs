//! What a port tells a `tracing` subscriber (`docs/tracing.md`): each
//! datagram the receive stage drops, with its reason, and each packet
//! that could not be sent (target `ibal::roce::drop`, level `debug`).
//! The counters ([`crate::PortCounters`]) count the same drops; these
//! events say which datagram it was.
//!
//! A flood of hostile datagrams goes through here: with no subscriber (or
//! none at `debug` for the target) an event costs the one check of a
//! global level the macro makes first; nothing is formatted or allocated.

use std::net::SocketAddr;

use provider::trace::Hex;
use roce_transport::Discard;

/// The destination QPN in a datagram's BTH (bytes 5..8 of the UDP
/// payload), when it is long enough to have one.
fn dest_qpn(bytes: &[u8]) -> Option<u32> {
    let b = bytes.get(5..8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// The receive stage dropped a datagram of `bytes` from `src` on port
/// `port` for `why`.
pub(crate) fn discarded(port: u8, why: Discard, src: Option<SocketAddr>, bytes: &[u8]) {
    tracing::debug!(
        target: "ibal::roce::drop",
        port,
        reason = ?why,
        why = %why,
        src = src.map(tracing::field::display),
        dest_qpn = dest_qpn(bytes).map(|q| tracing::field::display(Hex(q))),
        len = bytes.len(),
        "datagram dropped"
    );
}

/// A packet of QP `qpn` for `to` could not be encoded or sent.
pub(crate) fn not_sent(qpn: u32, to: Option<SocketAddr>, reason: &'static str) {
    tracing::debug!(
        target: "ibal::roce::drop",
        qpn = %Hex(qpn),
        to = to.map(tracing::field::display),
        reason,
        "packet not sent"
    );
}

/// A send on the socket failed.
pub(crate) fn send_failed(to: SocketAddr, error: &std::io::Error) {
    tracing::debug!(
        target: "ibal::roce::drop",
        to = %to,
        error = %error,
        "packet not sent"
    );
}

/// The kernel refused a GSO super-datagram: its packets went one by one
/// and the port sends no more super-datagrams.
#[cfg_attr(any(not(target_os = "linux"), ibal_loom), allow(dead_code))]
pub(crate) fn gso_refused(port: u8, to: SocketAddr, error: &std::io::Error) {
    tracing::info!(
        target: "ibal::roce",
        port,
        to = %to,
        error = %error,
        "UDP GSO refused by the kernel: this port sends one datagram per packet from now on"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_destination_qpn_is_read_from_the_bth() {
        let bth = [0x04, 0, 0xff, 0xff, 0, 0x12, 0x34, 0x56, 0, 0, 0, 7];
        assert_eq!(super::dest_qpn(&bth), Some(0x12_3456));
        assert_eq!(super::dest_qpn(&bth[..7]), None);
    }
}
