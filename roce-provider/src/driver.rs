//! The driver: one receive thread per port. Each blocks on its socket
//! with a short timeout, decodes and checks every datagram, hands it to
//! the QP its BTH names, and between datagrams runs the timers of the
//! port's QPs whose deadline passed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roce::{DecodeError, Endpoints, Packet};

use crate::device::{DevShared, PortShared};
use crate::qp::{QpInner, GSI_KEY, NO_DEADLINE};

/// How long a receive thread blocks before it looks at its stop flag and
/// its timers.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// Receive buffer: larger than any valid packet, so an oversized
/// datagram is seen as such (the kernel truncates to the buffer).
const RX_BUF: usize = 8192;

/// The largest packet a port of MTU `mtu` takes: payload, the longest
/// header chain (BTH + AtomicETH = 40 bytes), pad and ICRC, rounded up.
fn max_packet(mtu: usize) -> usize {
    mtu + 64
}

/// The receive loop of port `idx` until `stop` is set.
pub(crate) fn run_port(dev: Arc<DevShared>, idx: usize, stop: Arc<AtomicBool>) {
    let port = &dev.ports[idx];
    let mut buf = vec![0u8; RX_BUF];
    let mut last_scan = Duration::ZERO;
    while !stop.load(Ordering::Acquire) {
        if let Ok((n, src)) = port.socket.recv_from(&mut buf) {
            handle_datagram(&dev, port, &buf[..n], src);
        }
        let now = dev.now();
        // The first port's thread runs every QP's timers.
        if idx == 0 && now.saturating_sub(last_scan) >= POLL_INTERVAL {
            last_scan = now;
            run_timers(&dev, now);
        }
    }
}

/// Run the transport timers of the QPs whose deadline is at or before
/// `now`.
fn run_timers(dev: &DevShared, now: Duration) {
    let now_ns = now.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64;
    let due: Vec<Arc<QpInner>> = dev
        .qps
        .read()
        .values()
        .filter(|q| q.deadline.load(Ordering::Acquire) <= now_ns)
        .cloned()
        .collect();
    for qp in due {
        qp.on_timer();
    }
}

/// One datagram from `src`: checked, decoded, delivered or dropped and
/// counted. Nothing here panics on any input.
pub(crate) fn handle_datagram(dev: &DevShared, port: &PortShared, bytes: &[u8], src: SocketAddr) {
    let c = &port.counters;
    c.add(&c.rx_datagrams, 1);
    c.add(&c.rx_bytes, bytes.len() as u64);
    if bytes.len() > max_packet(port.cfg.mtu.bytes()) {
        c.add(&c.rx_oversized, 1);
        return;
    }
    let Ok(ep) = Endpoints::new(src, port.local) else {
        c.add(&c.rx_decode_error, 1);
        return;
    };
    let pkt = match Packet::decode(bytes, &ep) {
        Ok(p) => p,
        Err(DecodeError::IcrcMismatch { .. }) => {
            c.add(&c.rx_bad_icrc, 1);
            return;
        }
        Err(DecodeError::Truncated { .. }) => {
            c.add(&c.rx_truncated, 1);
            return;
        }
        Err(_) => {
            c.add(&c.rx_decode_error, 1);
            return;
        }
    };
    let dqp = pkt.headers.bth.dest_qp;
    let key = if dqp == 1 {
        GSI_KEY | u32::from(port.num)
    } else {
        dqp
    };
    let qp = if dqp == 0 {
        None
    } else {
        dev.qps.read().get(&key).cloned()
    };
    let Some(qp) = qp else {
        c.add(&c.rx_unknown_qpn, 1);
        return;
    };
    c.add(&c.rx_packets, 1);
    qp.on_packet(port, &ep, &pkt);
}
