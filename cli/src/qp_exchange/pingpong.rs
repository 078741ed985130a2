//! The exchange after the objects are open: our address and extension,
//! the side channel's handshake, then `--rdma-bulk` or the tools' loop
//! (the client SENDs first; a side SENDs again once its SEND completed and
//! a message arrived), every message and WRITE checked, and the end lines.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::gid_of;

use super::bulk::{bulk_active, bulk_passive};
use super::channel::{handshake, io_err, side_channel_closed};
use super::config::QpxConfig;
use super::report::QpxReport;
use super::side::{connect_qp, random_u32, Layout, Side, RECV_WRID, SEND_WRID, WRITE_IOVA};
use crate::oob::{self, Dest, Ext};

/// Runs the exchange on `side`'s objects; the caller destroys them.
pub(super) fn pingpong(
    al: &Al,
    side: &mut Side,
    cfg: &QpxConfig,
    lay: &Layout,
) -> Result<QpxReport, String> {
    let e = |err: Error| err.to_string();
    let recv_sge = [Sge {
        addr: lay.recv_at as u64,
        length: lay.recv_len as u32,
        lkey: side.lkey,
    }];
    for _ in 0..cfg.rx_depth {
        side.qp
            .post_recv(
                al,
                &[RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &recv_sge,
                }],
            )
            .map_err(e)?;
    }
    let seed = (random_u32() & 0xff) as u8;
    let me = Dest {
        lid: 0,
        qpn: side.qp.query(al).map_err(e)?.qpn,
        psn: random_u32() & 0xff_ffff,
        gid: gid_of(cfg.local),
    };
    let my_ext = Ext {
        ud: cfg.ud,
        size: cfg.size as u32,
        iters: cfg.iters,
        seed,
        write: (cfg.write || cfg.bulk.is_some()).then_some((WRITE_IOVA, side.wrkey)),
        bulk: cfg.bulk.unwrap_or(0) as u64,
    };
    if let Some(b) = cfg.bulk {
        // Our READ source (the peer reads it); the WRITE target is zeroed
        // so that a WRITE that never landed fails the check.
        side.wbuf.write(0, &vec![0u8; b]).map_err(e)?;
        side.wbuf.write(b, &oob::bulk_pattern(seed, b)).map_err(e)?;
    }
    eprintln!(
        "qp-exchange: {} QPN {:#08x} PSN {:#08x} on {}:{} (GID {}, reported as index {})",
        if cfg.ud { "UD" } else { "RC" },
        me.qpn,
        me.psn,
        cfg.local,
        cfg.udp_port,
        std::net::Ipv6Addr::from(me.gid),
        cfg.gid_index
    );

    // The side channel.
    let (mut sock, peer, peer_ext, server) = handshake(cfg, &me, &my_ext, |peer| {
        connect_qp(al, side, cfg, &me, peer)
    })?;
    let peer_is_ibal = peer_ext.is_some();
    eprintln!(
        "qp-exchange: peer QPN {:#08x} PSN {:#08x} GID {} ({})",
        peer.qpn,
        peer.psn,
        std::net::Ipv6Addr::from(peer.gid),
        if peer_is_ibal {
            "ibal"
        } else {
            "plain ibv tool"
        }
    );
    if let Some(b) = cfg.bulk {
        let x = match peer_ext {
            Some(x) if x.bulk == b as u64 && !x.ud && x.write.is_some() => x,
            Some(x) => {
                return Err(format!(
                    "--rdma-bulk {b}: the peer runs mode={} bulk={} write={} (it must run --rdma-bulk {b} too)",
                    if x.ud { "ud" } else { "rc" },
                    x.bulk,
                    u8::from(x.write.is_some())
                ))
            }
            None => {
                return Err(
                    "--rdma-bulk needs a peer that speaks the ibal extension (ibal --rdma-bulk or rdma_peer); the peer is a plain ibv tool"
                        .into(),
                )
            }
        };
        let report = if server {
            bulk_passive(al, side, &mut sock, cfg, b, &x)?
        } else {
            bulk_active(al, side, &mut sock, cfg, b, seed, &x)?
        };
        return Ok(QpxReport {
            mode: "rc",
            role: if server { "server" } else { "client" },
            peer: "ibal",
            local: me,
            remote: peer,
            iters: 0,
            size: b,
            bytes: 2 * b as u64,
            writes_checked: 0,
            messages_checked: 0,
            seconds: report.write_seconds + report.read_seconds,
            write_rkeys: (side.wrkey, x.write.map_or(0, |w| w.1)),
            close_stats: String::new(),
            bulk: Some(report),
        });
    }
    let peer_write = match peer_ext {
        Some(x) => {
            if x.ud != cfg.ud || x.size as usize != cfg.size || x.iters != cfg.iters {
                return Err(format!(
                    "the peer runs mode={} size={} iters={}, we run mode={} size={} iters={}",
                    if x.ud { "ud" } else { "rc" },
                    x.size,
                    x.iters,
                    if cfg.ud { "ud" } else { "rc" },
                    cfg.size,
                    cfg.iters
                ));
            }
            if x.write.is_some() != cfg.write {
                return Err("--write must be given on both sides".into());
            }
            x.write
        }
        None if cfg.write => {
            return Err(
                "--write needs an ibal peer (the peer is a plain ibv tool: no extension)".into(),
            )
        }
        None => None,
    };

    // The loop.
    let send_sge = [Sge {
        addr: 0,
        length: cfg.size as u32,
        lkey: side.lkey,
    }];
    let wsrc_sge = [Sge {
        addr: lay.wsrc_at as u64,
        length: cfg.size as u32,
        lkey: side.lkey,
    }];
    if cfg.plain {
        // As the tools: the side channel is done.
        let _ = sock.shutdown(std::net::Shutdown::Both);
    }
    let echo = std::cell::RefCell::new(vec![oob::IBV_FILL; cfg.size]);
    let post_round = |round: u32| -> Result<(), String> {
        if cfg.plain {
            side.buf.write(0, &echo.borrow()).map_err(e)?;
        } else {
            side.buf
                .write(0, &oob::pattern(seed, round, cfg.size))
                .map_err(e)?;
        }
        if let Some((addr, rkey)) = peer_write {
            side.buf
                .write(
                    lay.wsrc_at,
                    &oob::pattern(oob::write_seed(seed), round, cfg.size),
                )
                .map_err(e)?;
            let w = SendWr::new(
                3,
                SendOp::Write {
                    remote_addr: addr,
                    rkey,
                },
                &wsrc_sge,
            )
            .unsignaled();
            side.qp.post_send(al, &[w]).map_err(e)?;
        }
        let wr = SendWr::new(SEND_WRID, SendOp::Send, &send_sge);
        match side.av {
            Some(av) => {
                let dest = UdDest {
                    av: &av,
                    remote_qpn: peer.qpn,
                    remote_qkey: oob::UD_QKEY,
                    pkey_index: 0,
                };
                side.qp.post_send(al, &[wr.to(dest)]).map_err(e)?;
            }
            None => side.qp.post_send(al, &[wr]).map_err(e)?,
        }
        Ok(())
    };
    let expected = |r: u32| -> Vec<u8> {
        match (&peer_ext, server) {
            (Some(x), _) => oob::pattern(x.seed, r, cfg.size),
            (None, false) => oob::pattern(seed, r, cfg.size),
            (None, true) if r == 0 => vec![oob::IBV_FILL; cfg.size],
            (None, true) => oob::pattern(seed, r - 1, cfg.size),
        }
    };
    let payload_at = lay.recv_at + if cfg.ud { oob::GRH_BYTES } else { 0 };

    let start = Instant::now();
    let (mut scnt, mut rcnt, mut writes_checked) = (0u32, 0u32, 0u32);
    let (mut send_pending, mut recv_pending) = (false, true);
    if !server {
        post_round(0)?;
        send_pending = true;
    }
    let mut wcs = [Wc::default(); 16];
    let mut last_progress = Instant::now();
    // An ibal peer keeps the side channel open until the end lines, so
    // its closing mid-transfer means its process ended (the kernel closes
    // a killed process's sockets): nothing more will arrive.
    let (mut peer_gone, mut last_check) = (false, Instant::now());
    while rcnt < cfg.iters || scnt < cfg.iters {
        let n = side.cq.poll(al, &mut wcs).map_err(e)?;
        if n == 0 {
            if peer_is_ibal && !peer_gone && last_check.elapsed() >= Duration::from_millis(100) {
                last_check = Instant::now();
                peer_gone = side_channel_closed(&sock);
            }
            // With a SEND in flight its completion (RETRY_EXC, within the
            // retry budget) says more; otherwise waiting cannot help.
            if peer_gone && !send_pending {
                return Err(format!(
                    "the peer closed the side channel mid-transfer (sent {scnt}, received {rcnt} of {}): its process ended, nothing more will arrive",
                    cfg.iters
                ));
            }
            if last_progress.elapsed() > cfg.timeout {
                return Err(format!(
                    "timed out: no completion for {:.1} s (sent {scnt}, received {rcnt} of {}); the {} stopped answering",
                    cfg.timeout.as_secs_f64(),
                    cfg.iters,
                    if send_pending && !recv_pending { "peer's RoCE stack (our SEND is not acknowledged)" } else { "peer" }
                ));
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                let hint = match wc.status {
                    WcStatus::RetryExceeded if scnt == 0 && rcnt == 0 => {
                        " (IBV_WC_RETRY_EXC_ERR): the peer's RoCE stack never acknowledged our \
                         SEND: nothing listens on its UDP port, the GID or QPN is wrong, or it \
                         drops our packets (a real RoCE receiver drops a bad ICRC silently)"
                    }
                    WcStatus::RetryExceeded => {
                        " (IBV_WC_RETRY_EXC_ERR): the peer's RoCE stack stopped acknowledging \
                         mid-transfer (retries exhausted): the peer process or the path to it \
                         is gone"
                    }
                    WcStatus::RnrRetryExceeded => {
                        " (IBV_WC_RNR_RETRY_EXC_ERR): the peer had no receive posted"
                    }
                    _ => "",
                };
                let what = match wc.wr_id {
                    SEND_WRID => "SEND",
                    RECV_WRID => "receive",
                    _ => "RDMA WRITE",
                };
                return Err(format!(
                    "completion failed: {:?} for a {what} (wr_id {}; sent {scnt}, received {rcnt} of {}){hint}{}",
                    wc.status,
                    wc.wr_id,
                    cfg.iters,
                    if peer_gone {
                        "; the peer's side channel closed too (its process ended)"
                    } else {
                        ""
                    }
                ));
            }
            match wc.wr_id {
                SEND_WRID => {
                    scnt += 1;
                    send_pending = false;
                }
                RECV_WRID => {
                    if wc.byte_len as usize != lay.recv_len {
                        return Err(format!(
                            "message {rcnt}: {} bytes received, expected {}",
                            wc.byte_len, lay.recv_len
                        ));
                    }
                    let mut got = vec![0u8; cfg.size];
                    side.buf.read(payload_at, &mut got).map_err(e)?;
                    let want = if cfg.plain {
                        got.clone()
                    } else {
                        expected(rcnt)
                    };
                    echo.borrow_mut().copy_from_slice(&got);
                    if let Some(at) = oob::first_difference(&got, &want) {
                        return Err(format!(
                            "message {rcnt} differs at byte {at}: got {:#04x}, expected {:#04x}",
                            got[at], want[at]
                        ));
                    }
                    if let Some(x) = &peer_ext {
                        if x.write.is_some() {
                            let mut w = vec![0u8; cfg.size];
                            side.wbuf.read(0, &mut w).map_err(e)?;
                            let want = oob::pattern(oob::write_seed(x.seed), rcnt, cfg.size);
                            if let Some(at) = oob::first_difference(&w, &want) {
                                return Err(format!(
                                    "RDMA WRITE {rcnt} differs at byte {at}: got {:#04x}, expected {:#04x}",
                                    w[at], want[at]
                                ));
                            }
                            writes_checked += 1;
                        }
                    }
                    rcnt += 1;
                    recv_pending = false;
                    side.qp
                        .post_recv(
                            al,
                            &[RecvWr {
                                wr_id: RECV_WRID,
                                sg_list: &recv_sge,
                            }],
                        )
                        .map_err(e)?;
                }
                other => return Err(format!("completion for unknown wr_id {other}")),
            }
            if scnt < cfg.iters && !send_pending && !recv_pending {
                post_round(scnt)?;
                send_pending = true;
                recv_pending = true;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();

    // ibal peers confirm the end to each other (so neither tears its QP
    // down while the other still waits); plain tools just close.
    if peer_is_ibal {
        sock.write_all(format!("ibal-qpx/1 end received={rcnt}\n").as_bytes())
            .map_err(|err| io_err("sending the end line", err))?;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.len() < 128 {
            match sock.read(&mut b) {
                Ok(0) => break,
                Ok(_) if b[0] == b'\n' => break,
                Ok(_) => line.push(b[0]),
                Err(err) => return Err(io_err("reading the peer's end line", err)),
            }
        }
        let text = String::from_utf8_lossy(&line);
        if line.is_empty() {
            return Err(
                "the peer closed the side channel instead of sending its end line (its process ended)"
                    .into(),
            );
        }
        if text != format!("ibal-qpx/1 end received={}", cfg.iters) {
            return Err(format!("the peer did not finish: {text:?}"));
        }
    } else {
        // Let the last ACK leave before the QP goes.
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(QpxReport {
        mode: if cfg.ud { "ud" } else { "rc" },
        role: if server { "server" } else { "client" },
        peer: if peer_is_ibal { "ibal" } else { "ibv" },
        local: me,
        remote: peer,
        iters: cfg.iters,
        size: cfg.size,
        bytes: cfg.size as u64 * u64::from(cfg.iters) * 2,
        writes_checked,
        messages_checked: if cfg.plain { 0 } else { rcnt },
        seconds,
        write_rkeys: match peer_write {
            Some((_, rkey)) => (side.wrkey, rkey),
            None => (0, 0),
        },
        close_stats: String::new(),
        bulk: None,
    })
}
