//! One side of the ping-pong: its verbs objects (PD, CQ, RC QP, one MR)
//! and the round trips on them, every byte checked, on any provider.

use std::time::{Duration, Instant};

use al::{Al, Handle};
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use provider::RegisteredBuffer;
use provider::{Access, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus};
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};

use super::config::IpPingPongConfig;
use crate::pingpong::pattern_byte;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// One side's verbs objects. The MR: `[0, size)` where the peer writes,
/// `[size, 2 size)` what we write, `[2 size, +8)` where the peer's SEND
/// lands, `[2 size + 8, +8)` our SEND.
pub(crate) struct Side {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    pub(crate) qp: Handle<Qp>,
    mr: Handle<Mr>,
    buf: RegisteredBuffer,
    lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) size: usize,
    /// Completions taken by a poll that waited for another one.
    early: std::cell::RefCell<Vec<u64>>,
}

impl Side {
    pub(crate) fn open(al: &Al, ca: Handle<Ca>, size: usize) -> Result<Side, String> {
        let e = |e: al::Error| e.to_string();
        let inst = al.instance();
        let pd = verbs::alloc_pd(inst, ca).map_err(e)?;
        let cq = verbs::create_cq(inst, ca, 64, None, None).map_err(e)?;
        let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).map_err(e)?;
        let len = 2 * size + 16;
        let buf = RegisteredBuffer::new(len);
        let mr = verbs::register_mr(inst, pd, &buf, 0, len, 0, ALL).map_err(e)?;
        let (lkey, rkey) = {
            let m = al.resolve(mr).map_err(e)?;
            (m.lkey(), m.rkey())
        };
        Ok(Side {
            pd,
            cq,
            qp,
            mr,
            buf,
            lkey,
            rkey,
            size,
            early: std::cell::RefCell::new(Vec::new()),
        })
    }

    pub(crate) fn destroy(&self, al: &Al) -> Result<(), String> {
        for r in [
            al.destroy_sync(self.qp),
            al.destroy_sync(self.mr),
            al.destroy_sync(self.cq),
            al.destroy_sync(self.pd),
        ] {
            r.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Opens a side on `ca`, runs `job` with it, and destroys it whatever
    /// the job's outcome (the job's error first, then the destroy's).
    pub(crate) fn with<T>(
        al: &Al,
        ca: Handle<Ca>,
        size: usize,
        job: impl FnOnce(&Side) -> Result<T, String>,
    ) -> Result<T, String> {
        let side = Side::open(al, ca, size)?;
        let r = job(&side);
        let d = side.destroy(al);
        let report = r?;
        d?;
        Ok(report)
    }

    /// The connecting side's round trips: WRITE + SEND, then take the
    /// peer's answer; the round-trip times in microseconds.
    pub(crate) fn lead_round_trips(
        &self,
        al: &Al,
        iterations: u32,
        peer_buf: (u64, u32),
        timeout: Duration,
    ) -> Result<Vec<f64>, String> {
        let mut rtts = Vec::with_capacity(iterations as usize);
        for i in 0..iterations {
            let start = Instant::now();
            if i > 0 {
                self.post_seq_recv(al, i)?;
            }
            self.write_and_send(al, i, 0, peer_buf, Instant::now() + timeout)?;
            self.take(al, i, 1, Instant::now() + timeout)?;
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(rtts)
    }

    /// The listening side's round trips: take the peer's WRITE + SEND, then
    /// answer with ours; the round-trip times in microseconds, and whether
    /// the peer's DREQ already came. A failed take names the CM events seen
    /// (`cm_events`). The last SEND flushed is handed to `last_flushed`:
    /// the peer checked it and sent its DREQ at once, and the DREQ (which
    /// moves our QP to ERR) overtook the SEND's ACK (a dropped or held ACK;
    /// docs/capture.md, "Known flake"). The peer disconnects only after
    /// checking our last SEND (or after failing, which it reports itself),
    /// so `last_flushed` waits for that DREQ; without it the flush stands
    /// (its error).
    pub(crate) fn answer_round_trips(
        &self,
        al: &Al,
        iterations: u32,
        peer_buf: (u64, u32),
        timeout: Duration,
        cm_events: impl Fn() -> String,
        mut last_flushed: impl FnMut(String) -> Result<(), String>,
    ) -> Result<(Vec<f64>, bool), String> {
        let mut rtts = Vec::with_capacity(iterations as usize);
        let mut dreq_first = false;
        for i in 0..iterations {
            let start = Instant::now();
            if let Err(e) = self.take(al, i, 0, Instant::now() + timeout) {
                return Err(format!("{e} [CM events: {}]", cm_events()));
            }
            if i + 1 < iterations {
                self.post_seq_recv(al, i + 1)?;
            }
            match self.write_and_send(al, i, 1, peer_buf, Instant::now() + timeout) {
                Err(e) if i + 1 == iterations && e.contains("WrFlushError") => {
                    last_flushed(e)?;
                    dreq_first = true;
                }
                r => r?,
            }
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok((rtts, dreq_first))
    }

    pub(crate) fn post_seq_recv(&self, al: &Al, i: u32) -> Result<(), String> {
        let sge = [Sge {
            addr: 2 * self.size as u64,
            length: 8,
            lkey: self.lkey,
        }];
        post_recv(
            al,
            self.qp,
            &[RecvWr {
                wr_id: RECV_BASE + u64::from(i),
                sg_list: &sge,
            }],
        )
        .map_err(|e| format!("post_recv: {e}"))
    }

    /// Fills our write area with iteration `i`'s pattern of `side`, then
    /// WRITEs it to the peer's `(addr, rkey)` and SENDs `i`.
    pub(crate) fn write_and_send(
        &self,
        al: &Al,
        i: u32,
        side: u8,
        peer: (u64, u32),
        deadline: Instant,
    ) -> Result<(), String> {
        let n = self.size;
        self.buf
            .with_range_mut(n, n, |b| {
                for (k, out) in b.iter_mut().enumerate() {
                    *out = pattern_byte(k, i, side);
                }
            })
            .map_err(|e| format!("fill the write area: {e}"))?;
        self.buf
            .write(2 * n + 8, &u64::from(i).to_le_bytes())
            .map_err(|e| e.to_string())?;
        let ws = [Sge {
            addr: n as u64,
            length: n as u32,
            lkey: self.lkey,
        }];
        let ss = [Sge {
            addr: 2 * n as u64 + 8,
            length: 8,
            lkey: self.lkey,
        }];
        let write = SendOp::Write {
            remote_addr: peer.0,
            rkey: peer.1,
        };
        post_send(
            al,
            self.qp,
            &[
                SendWr::new(WRITE_ID, write, &ws).unsignaled(),
                SendWr::new(SEND_ID, SendOp::Send, &ss),
            ],
        )
        .map_err(|e| format!("post_send: {e}"))?;
        self.wait_for(al, SEND_ID, deadline, i)
    }

    /// Waits for the peer's SEND `i` and checks it and the WRITE before it
    /// (the peer's `side` pattern of iteration `i`).
    pub(crate) fn take(&self, al: &Al, i: u32, side: u8, deadline: Instant) -> Result<(), String> {
        self.wait_for(al, RECV_BASE + u64::from(i), deadline, i)?;
        let mut seq = [0u8; 8];
        self.buf
            .read(2 * self.size, &mut seq)
            .map_err(|e| e.to_string())?;
        if u64::from_le_bytes(seq) != u64::from(i) {
            return Err(format!(
                "iteration {i}: the SEND carried {} instead of {i}",
                u64::from_le_bytes(seq)
            ));
        }
        let bad = self.buf.with(|b| {
            b[..self.size]
                .iter()
                .enumerate()
                .find(|(k, &v)| v != pattern_byte(*k, i, side))
                .map(|(k, &v)| (k, v))
        });
        if let Some((k, v)) = bad {
            return Err(format!(
                "iteration {i}: RDMA WRITE data differs at byte {k}: {v:#04x}, expected {:#04x}",
                pattern_byte(k, i, side)
            ));
        }
        Ok(())
    }

    /// One poll of the CQ, keeping what it finds for later waits. On a
    /// RoCEv2 port it also sends the positive ACKs the last polls held
    /// back (they otherwise leave at the receive thread's next turn, which
    /// a loaded machine can delay), so that the connection is idle, with
    /// nothing unacknowledged, when `--hold` says so.
    fn settle(&self, al: &Al) {
        let mut wc = [provider::Wc::default(); 4];
        if let Ok(n) = verbs::poll_cq(al, self.cq, &mut wc) {
            let mut early = self.early.borrow_mut();
            early.extend(
                wc[..n]
                    .iter()
                    .filter(|w| w.wr_id != WRITE_ID)
                    .map(|w| w.wr_id),
            );
        }
    }

    pub(crate) fn wait_for(
        &self,
        al: &Al,
        wr_id: u64,
        deadline: Instant,
        i: u32,
    ) -> Result<(), String> {
        // The peer's SEND can complete before our own: a completion that
        // is not the one waited for is kept for its own wait.
        let mut early = self.early.borrow_mut();
        if let Some(at) = early.iter().position(|&w| w == wr_id) {
            early.swap_remove(at);
            return Ok(());
        }
        let mut wc = [provider::Wc::default(); 4];
        loop {
            let n = verbs::poll_cq(al, self.cq, &mut wc).map_err(|e| e.to_string())?;
            // The first failure names the cause (flushes follow it).
            if let Some(w) = wc[..n]
                .iter()
                .find(|w| !matches!(w.status, WcStatus::Success | WcStatus::WrFlushError))
                .or_else(|| wc[..n].iter().find(|w| w.status != WcStatus::Success))
            {
                return Err(format!(
                    "iteration {i}: work request {} completed with {:?}",
                    w.wr_id, w.status
                ));
            }
            let mut found = false;
            for w in &wc[..n] {
                if w.wr_id == wr_id {
                    found = true;
                } else if w.wr_id != WRITE_ID {
                    early.push(w.wr_id);
                }
            }
            if found {
                return Ok(());
            }
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!(
                        "iteration {i}: the peer stopped answering (no completion in time)"
                    ));
                }
                std::thread::yield_now();
            }
        }
    }
}

const WRITE_ID: u64 = 1;
const SEND_ID: u64 = 2;
const RECV_BASE: u64 = 1 << 32;

/// `--hold`: keep the connection up, saying so on stderr (a test waits
/// for the line to kill this process in the window).
pub(crate) fn hold(cfg: &IpPingPongConfig, al: &Al, side: &Side) {
    if !cfg.hold.is_zero() {
        side.settle(al);
        eprintln!(
            "pingpong: holding the connection for {:.1} s",
            cfg.hold.as_secs_f64()
        );
        std::thread::sleep(cfg.hold);
    }
}
