//! One-way streams, timed: RC SENDs or WRITEs between the two ends, and
//! raw UDP datagrams between two sockets (plain, or doing the copies and
//! CRC-32s RoCE cannot skip).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use ibal::prelude::*;
use ibal::roce::UdpOffload;

use super::ends::{
    err, poll_some, recv_wr, udp_pair, write_datagram, Pair, Target, STREAM_WAIT, WRITE_HEADERS,
};
use super::figures::{End, Figures, Moved, Start};
use crate::BenchResult;

/// Streams `count` messages of `size` bytes from A to B (SENDs into
/// posted receives, or WRITEs when `write`) at path MTU `mtu`, the ports
/// using `offload` (`None`: the provider's default); returns the figures
/// timed from the first post to the last completion at B (SEND) or at A
/// (WRITE, whose completion follows the ACK of its last packet). Packets
/// are the data packets from A to B (`size` / MTU per message).
pub(super) fn roce_stream(
    target: &Target,
    count: u64,
    size: usize,
    mtu: Mtu,
    write: bool,
    offload: Option<UdpOffload>,
) -> BenchResult<Figures> {
    const DEPTH: u32 = 512;
    let pair = Pair::on_with(target, mtu, offload, size.max(64), DEPTH)?;
    let Pair { al, ends: [a, b] } = &pair;
    let sge = [Sge {
        addr: 0,
        length: size as u32,
        lkey: a.lkey,
    }];
    let rsge = [Sge {
        addr: 0,
        length: size as u32,
        lkey: b.lkey,
    }];
    let op = if write {
        SendOp::Write {
            remote_addr: 0,
            rkey: b.rkey,
        }
    } else {
        SendOp::Send
    };
    // Receives on B, replenished by a thread that counts completions.
    let done = Arc::new(AtomicBool::new(false));
    let receiver = (!write).then(|| -> BenchResult<_> {
        let wrs: Vec<RecvWr> = (0..DEPTH).map(|i| recv_wr(&rsge, u64::from(i))).collect();
        b.qp.post_recv(al, &wrs).map_err(err("post_recv"))?;
        let (al, qp, cq, done) = (Arc::clone(al), b.qp, b.cq, Arc::clone(&done));
        Ok(std::thread::spawn(move || -> BenchResult<End> {
            let mut wc = [Wc::default(); 64];
            let mut got = 0u64;
            while got < count {
                let n = poll_some(&al, cq, &mut wc, STREAM_WAIT)?;
                got += n as u64;
                let wrs: Vec<RecvWr> = wc[..n].iter().map(|w| recv_wr(&rsge, w.wr_id)).collect();
                qp.post_recv(&al, &wrs).map_err(err("post_recv"))?;
            }
            done.store(true, Ordering::Release);
            Ok(End::now())
        }))
    });
    let receiver = receiver.transpose()?;
    // Signal one request in 16 so the send queue is reaped in batches.
    const SIGNAL: u64 = 16;
    let window = u64::from(DEPTH) / SIGNAL * SIGNAL;
    let mut wc = [Wc::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    let start = Start::now();
    while completed < count {
        while posted < count && posted - completed < window {
            let mut wr = SendWr::new(posted, op, &sge);
            if (posted + 1) % SIGNAL != 0 && posted + 1 != count {
                wr = wr.unsignaled();
            }
            a.qp.post_send(al, &[wr]).map_err(err("post_send"))?;
            posted += 1;
        }
        let n = poll_some(al, a.cq, &mut wc, STREAM_WAIT)?;
        for w in &wc[..n] {
            completed = w.wr_id + 1;
        }
    }
    let end = match receiver {
        Some(h) => h
            .join()
            .map_err(|_| "the receiver panicked".to_string())??,
        None => End::now(),
    };
    let _ = done.load(Ordering::Acquire);
    let packets = count * (size.div_ceil(mtu.bytes()).max(1) as u64);
    Ok(start.figures(Some(end), count * size as u64, packets))
}

/// Streams `count` datagrams of `size` bytes between two sockets, one
/// `send_to` per datagram, one blocking `recv_from` per datagram.
pub(super) fn udp_stream(count: u64, size: usize) -> BenchResult<Moved> {
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(|e| e.to_string())?;
    let ready = Arc::new(Barrier::new(2));
    let receiver = {
        let ready = Arc::clone(&ready);
        std::thread::spawn(move || -> (u64, u64, Option<End>) {
            let mut buf = vec![0u8; size + 64];
            let (mut got, mut bytes, mut last) = (0u64, 0u64, None);
            ready.wait();
            // Ends when everything arrived or after 200 ms of silence
            // (datagrams lost: UDP has no flow control).
            while got < count {
                match b.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        last = Some(Instant::now());
                        got += 1;
                        bytes += n as u64;
                    }
                    Err(_) => break,
                }
            }
            (got, bytes, last.map(End::after))
        })
    };
    let msg = vec![0x5au8; size];
    ready.wait();
    let start = Start::now();
    for _ in 0..count {
        a.send_to(&msg, b_addr).map_err(|e| e.to_string())?;
    }
    let (got, bytes, end) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())?;
    Ok(Moved {
        datagrams: got,
        bytes,
        receives: got,
        start,
        end,
    })
}

/// As [`udp_stream`] with `count` WRITE-sized datagrams at MTU `mtu`
/// carrying messages of `size` bytes, doing per packet the user-space
/// work RoCE must: the sender gathers the packet's payload from its
/// message into the datagram and computes a CRC-32 over it, the receiver
/// computes the CRC-32 and copies the payload to its place in a
/// destination buffer.
pub(super) fn udp_stream_working(count: u64, size: usize, mtu: usize) -> BenchResult<Moved> {
    let datagram_len = write_datagram(mtu);
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(|e| e.to_string())?;
    let ready = Arc::new(Barrier::new(2));
    let size = size.max(mtu);
    let receiver = {
        let ready = Arc::clone(&ready);
        std::thread::spawn(move || -> (u64, u64, Option<End>, u32) {
            let mut buf = vec![0u8; datagram_len + 64];
            let mut dst = vec![0u8; size];
            let (mut got, mut bytes, mut last, mut crcs) = (0u64, 0u64, None, 0u32);
            ready.wait();
            while got < count {
                match b.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        crcs ^= ibal_roce_crc(&buf[..n]);
                        let at = (got as usize * mtu) % size;
                        let len = (n.saturating_sub(WRITE_HEADERS)).min(mtu).min(size - at);
                        dst[at..at + len].copy_from_slice(&buf[12..12 + len]);
                        last = Some(Instant::now());
                        got += 1;
                        bytes += n as u64;
                    }
                    Err(_) => break,
                }
            }
            (got, bytes, last.map(End::after), crcs ^ u32::from(dst[0]))
        })
    };
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut datagram = vec![0u8; datagram_len];
    ready.wait();
    let start = Start::now();
    for k in 0..count {
        let at = (k as usize * mtu) % size;
        let len = mtu.min(size - at);
        datagram[12..12 + len].copy_from_slice(&src[at..at + len]);
        let crc = ibal_roce_crc(&datagram[..datagram_len - 4]);
        datagram[datagram_len - 4..].copy_from_slice(&crc.to_le_bytes());
        a.send_to(&datagram, b_addr).map_err(|e| e.to_string())?;
    }
    let (got, bytes, end, _) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())?;
    Ok(Moved {
        datagrams: got,
        bytes,
        receives: got,
        start,
        end,
    })
}

/// The CRC-32 the ICRC costs (the same routine, `ibal::roce::wire::icrc`).
fn ibal_roce_crc(bytes: &[u8]) -> u32 {
    ibal::roce::wire::icrc::crc32(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short WRITE stream completes at either MTU with the offloads on
    /// or off, and counts its data packets by the MTU.
    #[test]
    fn roce_writes_stream_with_and_without_offloads() {
        for (mtu, offload) in [
            (Mtu::Mtu1024, UdpOffload::OFF),
            (Mtu::Mtu4096, UdpOffload::ON),
        ] {
            let start = Start::now();
            let f =
                roce_stream(&Target::Loopback, 8, 65536, mtu, true, Some(offload)).expect("stream");
            let secs = start
                .figures(Some(End::now()), 1, 1)
                .packets_per_sec
                .recip();
            assert!(f.gbps > 0.0 && f.cpu_s_per_gib > 0.0, "{f:?}");
            // 8 WRITEs of 64 KiB: 512 packets at MTU 1024, 128 at 4096,
            // moved in less than the whole call took.
            let packets = (8 * 65536 / mtu.bytes()) as f64;
            let bytes = 8.0 * 65536.0;
            let ratio = f.packets_per_sec / (f.gbps * 1e9 / 8.0 / bytes);
            assert!((ratio - packets).abs() < 1e-6, "{ratio} vs {packets}");
            assert!(bytes * 8.0 / (f.gbps * 1e9) <= secs);
        }
    }
}
