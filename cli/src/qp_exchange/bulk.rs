//! `--rdma-bulk SIZE`: the client RDMA WRITEs SIZE bytes of its pattern
//! into the server's buffer and RDMA READs the server's pattern back, both
//! checked; the side channel carries `bulk-done` and the server's verdict.

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ibal::prelude::*;

use super::channel::{io_err, read_line};
use super::config::{mtu_bytes, QpxConfig};
use super::report::BulkReport;
use super::side::{Side, RECV_WRID, WRITE_IOVA};
use crate::oob::{self, Ext};

const BULK_WRITE_WRID: u64 = 10;
/// Pause between empty polls while a bulk WRITE or READ is in flight.
const BULK_POLL_SLEEP: Duration = Duration::from_millis(2);
/// While a bulk READ's data has not all landed, the CQ is polled only this
/// often: a poll of an empty CQ makes the provider take what has arrived
/// on the port on the polling thread, racing the port's receive thread,
/// and with rxe's 1024-packet READ response burst that lost or reordered
/// a response in 9 of 10 runs when spinning (21 of 24 passed polling
/// every 2 ms); the re-issued READ then never completed
/// (docs/two-process.md, "RDMA WRITE and READ against rxe").
const BULK_FALLBACK_POLL: Duration = Duration::from_millis(250);
const BULK_READ_WRID: u64 = 11;

/// Wait for the completion of `wr_id` (nothing else is outstanding),
/// bounded by `timeout`; returns the seconds it took. With `landed`, the
/// CQ is polled only once `landed()` says the data is there, or every
/// [`BULK_FALLBACK_POLL`] (which still catches a failed completion).
fn wait_one(
    al: &Al,
    side: &Side,
    wr_id: u64,
    what: &str,
    timeout: Duration,
    landed: Option<&dyn Fn() -> bool>,
) -> Result<f64, String> {
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    let mut last_poll = Instant::now();
    let mut seen = false;
    loop {
        if let Some(landed) = landed {
            if !seen && !landed() && last_poll.elapsed() < BULK_FALLBACK_POLL {
                if start.elapsed() > timeout {
                    return Err(format!(
                        "{what}: timed out: no completion for {:.1} s",
                        timeout.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            seen = true;
        }
        last_poll = Instant::now();
        let n = side.cq.poll(al, &mut wcs).map_err(|e| e.to_string())?;
        for wc in &wcs[..n] {
            if wc.wr_id == RECV_WRID {
                return Err(format!(
                    "{what}: a receive completed ({:?}): the peer SENT something, which --rdma-bulk never does",
                    wc.status
                ));
            }
            if wc.status != WcStatus::Success {
                let hint = match wc.status {
                    WcStatus::RetryExceeded => {
                        " (IBV_WC_RETRY_EXC_ERR): retries exhausted: the peer's RoCE stack stopped \
                         answering (it dropped our request packets, or its ACKs/READ responses \
                         did not reach us)"
                    }
                    WcStatus::RemoteAccessError => {
                        " (IBV_WC_REM_ACCESS_ERR): the peer NAKed the R_Key, address or length \
                         (its MR is not open to this access)"
                    }
                    WcStatus::RemoteInvalidRequest => {
                        " (IBV_WC_REM_INV_REQ_ERR): the peer refused the request (its QP \
                         lacks REMOTE_WRITE/REMOTE_READ, or the length is over its limit)"
                    }
                    _ => "",
                };
                return Err(format!(
                    "{what} failed after {:.3} s: {:?}{hint}",
                    start.elapsed().as_secs_f64(),
                    wc.status
                ));
            }
            if wc.wr_id == wr_id {
                return Ok(start.elapsed().as_secs_f64());
            }
        }
        if n == 0 {
            if start.elapsed() > timeout {
                return Err(format!(
                    "{what}: timed out: no completion for {:.1} s",
                    timeout.as_secs_f64()
                ));
            }
            // Not a spin: a poll of an empty CQ makes the provider take
            // what has arrived on the port on this thread, racing its
            // receive thread (docs/two-process.md, "RDMA WRITE and READ
            // against rxe").
            std::thread::sleep(BULK_POLL_SLEEP);
        }
    }
}

/// Where `got` first differs from the [`oob::bulk_pattern`] of `seed`, in
/// words a reader can act on: the offset, the packet at `mtu`, what was
/// there and where those bytes belonged.
fn bulk_mismatch(got: &[u8], seed: u8, mtu: usize) -> Option<String> {
    let at = (0..got.len()).find(|&k| got[k] != oob::bulk_byte(seed, k))?;
    let bad = got[at..]
        .iter()
        .enumerate()
        .filter(|&(i, &g)| g != oob::bulk_byte(seed, at + i))
        .count();
    let w = at & !3;
    let origin = if w + 4 <= got.len() {
        let word = [got[w], got[w + 1], got[w + 2], got[w + 3]];
        if word == [0; 4] {
            "zeros there: nothing was placed".to_string()
        } else {
            match oob::bulk_origin(seed, word) {
                o if (o as usize) < got.len() => format!("the word there belongs at offset {o}"),
                _ => "the word there is not from the pattern".to_string(),
            }
        }
    } else {
        String::new()
    };
    Some(format!(
        "first mismatch at offset {at} (packet {} of {} at MTU {mtu}): got {:#04x}, expected {:#04x}; {origin}; {bad} bytes differ from there on",
        at / mtu,
        got.len().div_ceil(mtu),
        got[at],
        oob::bulk_byte(seed, at)
    ))
}

/// The client's part of `--rdma-bulk`.
pub(super) fn bulk_active(
    al: &Al,
    side: &mut Side,
    sock: &mut TcpStream,
    cfg: &QpxConfig,
    size: usize,
    seed: u8,
    peer: &Ext,
) -> Result<BulkReport, String> {
    let e = |err: Error| err.to_string();
    let (addr, rkey) = peer.write.expect("checked");
    let mtu = mtu_bytes(cfg.mtu);
    let packets = size.div_ceil(mtu);
    let src = [Sge {
        addr: WRITE_IOVA,
        length: size as u32,
        lkey: side.wlkey,
    }];
    let sink = [Sge {
        addr: WRITE_IOVA + size as u64,
        length: size as u32,
        lkey: side.wlkey,
    }];
    // The WRITE carries our pattern (the server checks it with the seed
    // of our extension line); the READ sink starts zeroed.
    side.wbuf
        .write(0, &oob::bulk_pattern(seed, size))
        .map_err(e)?;
    side.wbuf.write(size, &vec![0u8; size]).map_err(e)?;
    eprintln!(
        "qp-exchange: RDMA WRITE of {size} bytes ({packets} packets at MTU {mtu}) to the peer's {addr:#x} R_Key {rkey:#x}"
    );
    let w = SendWr::new(
        BULK_WRITE_WRID,
        SendOp::Write {
            remote_addr: addr,
            rkey,
        },
        &src,
    );
    side.qp.post_send(al, &[w]).map_err(e)?;
    let write_seconds = wait_one(
        al,
        side,
        BULK_WRITE_WRID,
        &format!("RDMA WRITE of {size} bytes ({packets} packets) to the peer"),
        cfg.timeout,
        None,
    )?;
    eprintln!(
        "qp-exchange: RDMA WRITE acknowledged in {write_seconds:.3} s; RDMA READ of {size} bytes from {:#x}",
        addr + size as u64
    );
    let r = SendWr::new(
        BULK_READ_WRID,
        SendOp::Read {
            remote_addr: addr + size as u64,
            rkey,
        },
        &sink,
    );
    // The last aligned word of the READ is known (the peer's pattern):
    // once it is in our sink, the last response has been placed.
    let last = size.saturating_sub(4) & !3;
    let want: Vec<u8> = (last..size.min(last + 4))
        .map(|k| oob::bulk_byte(peer.seed, k))
        .collect();
    let wbuf = &side.wbuf;
    let landed = move || {
        let mut got = vec![0u8; want.len()];
        wbuf.read(size + last, &mut got).is_ok() && got == want
    };
    side.qp.post_send(al, &[r]).map_err(e)?;
    let read_seconds = wait_one(
        al,
        side,
        BULK_READ_WRID,
        &format!("RDMA READ of {size} bytes ({packets} response packets) from the peer"),
        cfg.timeout,
        Some(&landed),
    )?;
    let mut got = vec![0u8; size];
    side.wbuf.read(size, &mut got).map_err(e)?;
    let read_bad = bulk_mismatch(&got, peer.seed, mtu);
    eprintln!(
        "qp-exchange: RDMA READ completed in {read_seconds:.3} s, data {}",
        if read_bad.is_some() {
            "WRONG"
        } else {
            "checked"
        }
    );
    sock.write_all(
        format!(
            "ibal-qpx/1 bulk-done wrote={size} read={size} read_ok={}\n",
            u8::from(read_bad.is_none())
        )
        .as_bytes(),
    )
    .map_err(|err| io_err("sending bulk-done", err))?;
    let verdict = read_line(sock, "reading the peer's verdict on our RDMA WRITE")?;
    let write_ok = verdict.starts_with("ibal-qpx/1 bulk-verdict ok");
    match (read_bad, write_ok) {
        (None, true) => Ok(BulkReport {
            size,
            write_seconds,
            read_seconds,
            checked: size,
            packets,
            verdict,
            peer_buffer: (addr, rkey),
        }),
        (read_bad, _) => {
            let mut err = String::new();
            if let Some(m) = read_bad {
                err += &format!(
                    "the RDMA READ completed but its data is wrong (the peer's responses, or our placement of them): {m}"
                );
            }
            if !write_ok {
                if !err.is_empty() {
                    err += "; ";
                }
                err += &format!(
                    "the peer says our RDMA WRITE (acknowledged) did not land right: {verdict:?}"
                );
            }
            Err(err)
        }
    }
}

/// The server's part of `--rdma-bulk`: wait (polling the CQ, which should
/// stay empty) for the client's `bulk-done`, check the WRITE target, send
/// the verdict.
pub(super) fn bulk_passive(
    al: &Al,
    side: &mut Side,
    sock: &mut TcpStream,
    cfg: &QpxConfig,
    size: usize,
    peer: &Ext,
) -> Result<BulkReport, String> {
    let e = |err: Error| err.to_string();
    // The client gets cfg.timeout per operation; allow for both, and the
    // TCP round trip.
    let limit = cfg.timeout * 3 + Duration::from_secs(5);
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    loop {
        let n = side.cq.poll(al, &mut wcs).map_err(e)?;
        if let Some(wc) = wcs[..n].first() {
            return Err(format!(
                "unexpected completion while the peer did RDMA: {:?} wr_id {}",
                wc.status, wc.wr_id
            ));
        }
        sock.set_nonblocking(true).map_err(|err| err.to_string())?;
        let mut b = [0u8; 1];
        let r = sock.peek(&mut b);
        sock.set_nonblocking(false).map_err(|err| err.to_string())?;
        match r {
            Ok(_) => break, // a line (or EOF: read_line says so)
            Err(err) if err.kind() == ErrorKind::WouldBlock => {}
            Err(err) => return Err(io_err("waiting for the peer's bulk-done", err)),
        }
        if start.elapsed() > limit {
            return Err(format!(
                "timed out: no bulk-done from the peer for {:.1} s",
                limit.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = read_line(sock, "reading the peer's bulk-done")?;
    if !done.starts_with("ibal-qpx/1 bulk-done ") {
        return Err(format!(
            "bad message from the peer: expected bulk-done, got {done:?}"
        ));
    }
    let mut got = vec![0u8; size];
    side.wbuf.read(0, &mut got).map_err(e)?;
    let mtu = mtu_bytes(cfg.mtu);
    let bad = bulk_mismatch(&got, peer.seed, mtu);
    let verdict = match &bad {
        None => format!("ibal-qpx/1 bulk-verdict ok checked={size}"),
        Some(m) => format!("ibal-qpx/1 bulk-verdict FAIL {m}"),
    };
    sock.write_all(format!("{verdict}\n").as_bytes())
        .map_err(|err| io_err("sending our verdict", err))?;
    let read_ok = done.contains("read_ok=1");
    match bad {
        None if read_ok => Ok(BulkReport {
            size,
            write_seconds: 0.0,
            read_seconds: 0.0,
            checked: size,
            packets: size.div_ceil(mtu),
            verdict,
            peer_buffer: (0, 0),
        }),
        None => Err(format!(
            "the peer's RDMA WRITE landed right, but it says its RDMA READ of our buffer did not: {done:?}"
        )),
        Some(m) => Err(format!(
            "the peer's RDMA WRITE (which it saw acknowledged) did not land right in our buffer: {m}{}",
            if read_ok { "" } else { "; and the peer says its RDMA READ was wrong too" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_mismatch_names_offset_packet_and_origin() {
        let size = 8 * 1024;
        let good = oob::bulk_pattern(7, size);
        assert_eq!(bulk_mismatch(&good, 7, 1024), None);
        // Packet 3 never placed.
        let mut hole = good.clone();
        hole[3 * 1024..4 * 1024].fill(0);
        let m = bulk_mismatch(&hole, 7, 1024).unwrap();
        assert!(
            m.starts_with("first mismatch at offset 3072 (packet 3 of 8 at MTU 1024)")
                && m.contains("zeros there: nothing was placed"),
            "{m}"
        );
        // Packet 5's payload placed where packet 2 belongs.
        let mut moved = good.clone();
        moved.copy_within(5 * 1024..6 * 1024, 2 * 1024);
        let m = bulk_mismatch(&moved, 7, 1024).unwrap();
        assert!(
            // (bytes that happen to agree are not counted)
            m.contains("(packet 2 of 8 at MTU 1024)")
                && m.contains("the word there belongs at offset 5120")
                && m.ends_with("bytes differ from there on"),
            "{m}"
        );
        // Another side's pattern (wrong seed).
        let m = bulk_mismatch(&oob::bulk_pattern(8, size), 7, 1024).unwrap();
        assert!(m.contains("offset 0 (packet 0 of 8"), "{m}");
    }
}
