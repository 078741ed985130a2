//! `ibal qp-exchange`: a ping-pong between two processes (or hosts) over
//! the RoCEv2 provider, with the QP addresses exchanged over TCP in the
//! format of rdma-core's `ibv_rc_pingpong`/`ibv_ud_pingpong`
//! ([`crate::oob`]), so either side may be one of those tools.
//!
//! One RoCE CA is opened through the object layer (a [`RoceProvider`]
//! device on `--local`), with a PD, a CQ, an RC or UD QP and registered
//! buffers. The loop is the tools' loop: the client posts the first SEND;
//! a side posts its next SEND when its previous SEND completed and a
//! receive arrived; `iters` round trips. Every received message is checked
//! byte for byte: against the peer's pattern when the peer is ibal (it
//! says so in the extension), or against what we sent when the peer is an
//! ibv tool (they receive into the buffer they send from, so they echo;
//! their first message is their buffer's fill byte 0x7b). With `--write`
//! (ibal peers only) each SEND follows an RDMA WRITE into the peer's
//! target buffer, checked when the SEND arrives. At the end everything is
//! destroyed and the AL must report zero live objects.
//!
//! By job: `config` what a run is told, `channel` the TCP side channel
//! (the tools' address messages, our extension and end lines), `side` the
//! verbs objects and their QP's moves, `pingpong` the exchange and its
//! loop, `bulk` the `--rdma-bulk` WRITE and READ, `report` what a run
//! reports and how a failed one closed. This file runs one exchange and
//! closes whatever it opened.

mod bulk;
mod channel;
mod config;
mod pingpong;
mod report;
mod side;

use std::net::SocketAddr;

use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig, RoceProvider};

pub use config::{QpxConfig, Role};
pub use report::{BulkReport, Closed, QpxFailure, QpxReport};

use config::mtu_bytes;
use pingpong::pingpong;
use side::{open_side, random_u32, Layout};

/// Run one exchange. Progress lines go to stderr; the report is returned.
pub fn run(cfg: &QpxConfig) -> Result<QpxReport, QpxFailure> {
    if cfg.size == 0 || cfg.iters == 0 || cfg.rx_depth < 2 {
        return Err(QpxFailure::before_open(
            "--size and --iters must be at least 1 (and rx depth at least 2)",
        ));
    }
    if cfg.ud && cfg.size > mtu_bytes(cfg.mtu) {
        return Err(QpxFailure::before_open(format!(
            "UD messages must fit the MTU: --size {} > --mtu {}",
            cfg.size,
            mtu_bytes(cfg.mtu)
        )));
    }
    if cfg.ud && cfg.write {
        return Err(QpxFailure::before_open("--write needs --mode rc"));
    }
    if let Some(b) = cfg.bulk {
        if cfg.ud || cfg.write || cfg.plain {
            return Err(QpxFailure::before_open(
                "--rdma-bulk needs --mode rc (and neither --write nor --plain)",
            ));
        }
        if b == 0 || b > (1 << 30) {
            return Err(QpxFailure::before_open(
                "--rdma-bulk SIZE must be 1 byte to 1 GiB",
            ));
        }
    }
    let guid = 0x0249_4241_4c00_0000u64 | u64::from(random_u32() & 0xffff);
    let port = PortConfig::new(SocketAddr::new(cfg.local, cfg.udp_port))
        .peer_udp_port(cfg.peer_udp_port)
        .mtu(cfg.mtu);
    let provider = RoceProvider::new(vec![DeviceConfig::new("roce0", guid, vec![port])]);
    let al = Al::open().map_err(|err| QpxFailure::before_open(err.to_string()))?;
    let result = exchange(&al, &provider, guid, cfg);
    // Close whatever happened: a failed run still must not leak.
    let closed = match al.close() {
        Ok(stats) if stats.is_clean() => Closed::Clean(stats.to_string()),
        Ok(stats) => Closed::Leaked(stats.to_string()),
        Err(err) => Closed::Failed(err.to_string()),
    };
    match (result, closed) {
        (Ok(mut report), Closed::Clean(stats)) => {
            report.close_stats = stats;
            Ok(report)
        }
        (Ok(_), closed) => Err(QpxFailure {
            error: String::new(),
            closed,
        }),
        (Err(error), closed) => Err(QpxFailure { error, closed }),
    }
}

fn exchange(
    al: &Al,
    provider: &RoceProvider,
    guid: u64,
    cfg: &QpxConfig,
) -> Result<QpxReport, String> {
    let e = |err: Error| err.to_string();
    let lay = Layout::new(cfg.size, cfg.ud);
    let mut side = open_side(al, provider, guid, cfg, &lay).map_err(e)?;
    let out = pingpong(al, &mut side, cfg, &lay);
    // Tear down in reverse order, whatever happened.
    let destroy = (|| -> Result<(), Error> {
        side.qp.destroy(al)?;
        if let Some(av) = side.av {
            av.destroy(al)?;
        }
        side.wmr.destroy(al)?;
        side.mr.destroy(al)?;
        side.cq.destroy(al)?;
        side.pd.destroy(al)?;
        side.ca.destroy(al)
    })();
    let report = out?;
    destroy.map_err(e)?;
    Ok(report)
}
