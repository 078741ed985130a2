//! `ibal pingpong --loopback`: the main job.
//!
//! Two soft HCAs on the embedded in-process fabric; a listener on the
//! second; a connection from the first through the connection manager (REQ,
//! REP, RTU as real 256-byte MADs on QP1); an RDMA WRITE + SEND ping-pong of
//! N iterations; disconnect (DREQ, DREP, timewait); destroy; and a check
//! that nothing is left live.
//!
//! Every iteration, each way, checks every byte the WRITE delivered against
//! that iteration's pattern ([`pattern_byte`]) and the SEND's 8-byte
//! sequence number against the iteration number. The pattern differs in
//! every byte from the previous iteration's and from the other side's, so a
//! WRITE that did not land (a stale buffer) fails the check.

use std::path::PathBuf;
use std::sync::{Arc as StdArc, Condvar as StdCondvar, Mutex as StdMutex};
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, AcceptReply, CmHandler, ConnectRequest, ListenHandler};
use cep::proto::Event;
use hca::verbs::{self, Cq, Mr, Pd};
use provider::RegisteredBuffer;
use provider::{Access, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};

use crate::capture::FabricCapture;
use ibal_testkit::devices;

/// The service the passive side listens on.
pub const SERVICE_ID: u64 = 0x0000_0000_1ba1_0001;

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct PingPongConfig {
    /// Round trips.
    pub iterations: u32,
    /// Bytes written each way per round trip.
    pub size: usize,
    /// Capture every datagram (the CM's MADs) into this file
    /// ([`crate::capture`]).
    pub capture: Option<PathBuf>,
}

impl Default for PingPongConfig {
    fn default() -> Self {
        PingPongConfig {
            iterations: 1000,
            size: 4096,
            capture: None,
        }
    }
}

/// Byte `k` of what `side` (0: the active node, 1: the passive one) writes
/// in iteration `i`: `31k + i + 128 side` (mod 256). The payload a buffer
/// must hold differs in every byte from anything it held before: the
/// previous iteration's payload (`i - 1`), and what its own node sent out of
/// the same bytes (the other side's pattern: offset 128, or 127 from the
/// previous iteration).
pub fn pattern_byte(k: usize, i: u32, side: u8) -> u8 {
    (k as u32)
        .wrapping_mul(31)
        .wrapping_add(i)
        .wrapping_add(u32::from(side) * 128) as u8
}

/// One step and how long it took.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: &'static str,
    pub micros: f64,
    pub detail: String,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct PingPongReport {
    pub config: PingPongConfig,
    pub steps: Vec<Step>,
    /// Median round trip (both directions: post, transfer, completion and
    /// the sequence check; filling and checking the payload are not timed).
    pub rtt_median_us: f64,
    pub rtt_p99_us: f64,
    /// Payload bytes moved (both directions) per second of timed transfer
    /// (the data checks are not timed).
    pub bandwidth_mb_s: f64,
    pub cm_mads_sent: u64,
    /// Packets written to the `--capture` file.
    pub captured_packets: Option<u64>,
    pub live_after_close: usize,
}

impl PingPongReport {
    /// Human-readable lines.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "ibal pingpong --loopback: {} iterations of {} bytes each way\n\n",
            self.config.iterations, self.config.size
        );
        for s in &self.steps {
            out.push_str(&format!(
                "  {:<28} {:>10.1} us  {}\n",
                s.name, s.micros, s.detail
            ));
        }
        out.push_str(&format!(
            "\n  round trip (WRITE + SEND each way; data checks not timed): median {:.2} us, p99 {:.2} us\n",
            self.rtt_median_us, self.rtt_p99_us
        ));
        out.push_str(&format!(
            "  bandwidth: {:.1} MB/s of payload, over the timed transfers\n",
            self.bandwidth_mb_s
        ));
        out.push_str(&format!("  CM MADs sent: {}\n", self.cm_mads_sent));
        out.push_str(&format!(
            "  live objects after close: {} ({})\n",
            self.live_after_close,
            if self.live_after_close == 0 {
                "nothing leaked"
            } else {
                "LEAK"
            }
        ));
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{{\"step\":\"{}\",\"us\":{:.3},\"detail\":\"{}\"}}",
                    s.name,
                    s.micros,
                    s.detail.replace('"', "'")
                )
            })
            .collect();
        format!(
            "{{\"job\":\"pingpong\",\"iterations\":{},\"size\":{},\"steps\":[{}],\"rtt_median_us\":{:.3},\"rtt_p99_us\":{:.3},\"bandwidth_mb_s\":{:.3},\"cm_mads_sent\":{},\"captured_packets\":{},\"live_after_close\":{}}}",
            self.config.iterations,
            self.config.size,
            steps.join(","),
            self.rtt_median_us,
            self.rtt_p99_us,
            self.bandwidth_mb_s,
            self.cm_mads_sent,
            self.captured_packets
                .map_or("null".to_string(), |n| n.to_string()),
            self.live_after_close
        )
    }
}

/// Flags the CM callbacks raise and the main thread waits for.
#[derive(Default)]
struct Signals {
    state: StdMutex<Vec<String>>,
    changed: StdCondvar,
}

impl Signals {
    fn raise(&self, what: String) {
        self.state.lock().unwrap().push(what);
        self.changed.notify_all();
    }
    fn wait_for(&self, what: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap();
        while !st.iter().any(|s| s == what) {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("timed out waiting for {what} (seen: {st:?})"));
            }
            st = self.changed.wait_timeout(st, deadline - now).unwrap().0;
        }
        Ok(())
    }
}

struct Node {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    mr: Handle<Mr>,
    lkey: u32,
    rkey: u32,
}

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn poll_until(al: &Al, cq: Handle<Cq>, wr_id: u64) -> Result<Wc, String> {
    let mut wc = [Wc::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = verbs::poll_cq(al, cq, &mut wc).map_err(err)?;
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!("completion {} failed: {:?}", w.wr_id, w.status));
            }
            if w.wr_id == wr_id {
                return Ok(*w);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no completion for work request {wr_id}"));
        }
    }
}

/// Run the ping-pong.
pub fn run(config: &PingPongConfig) -> Result<PingPongReport, String> {
    if config.iterations == 0 || config.size == 0 || config.size > (1 << 26) {
        return Err("--iterations must be >= 1 and --size between 1 and 64 MiB".into());
    }
    let mut steps = Vec::new();
    let mut step = |name: &'static str, t0: Instant, detail: String| {
        steps.push(Step {
            name,
            micros: t0.elapsed().as_secs_f64() * 1e6,
            detail,
        });
    };

    let t = Instant::now();
    let provider = devices::default_provider();
    let capture = match &config.capture {
        Some(path) => Some(FabricCapture::start(provider.fabric(), path)?),
        None => None,
    };
    let al = Al::open().map_err(err)?;
    step("open AL and fabric", t, format!("AL {}", al.handle()));

    let t = Instant::now();
    let size = config.size;
    let mut nodes = Vec::new();
    let mut cas = Vec::new();
    let mut cm_ports = Vec::new();
    for guid in devices::DEFAULT_NODE_GUIDS {
        let ca = verbs::open_ca(al.instance(), &provider, guid).map_err(err)?;
        cm_ports.extend(cm::attach_ca(al.instance(), ca).map_err(err)?);
        let pd = verbs::alloc_pd(al.instance(), ca).map_err(err)?;
        let cq = verbs::create_cq(al.instance(), ca, 1024, None, None).map_err(err)?;
        let qp = create_qp(al.instance(), pd, QpCreate::new(QpType::Rc, cq)).map_err(err)?;
        // [0, size): where the peer writes; [size, size+8): SEND landing area.
        let buf = RegisteredBuffer::new(size + 8);
        let mr = verbs::register_mr(al.instance(), pd, &buf, 0, size + 8, 0, ALL).map_err(err)?;
        let (lkey, rkey) = {
            let m = al.resolve(mr).map_err(err)?;
            (m.lkey(), m.rkey())
        };
        cas.push(ca);
        nodes.push(Node {
            pd,
            cq,
            qp,
            buf,
            mr,
            lkey,
            rkey,
        });
    }
    step(
        "open CAs, PD, CQ, QP, MR",
        t,
        format!("2 HCAs, {} byte MRs", size + 8),
    );

    // Passive side: accept every request on node 1's QP, answer DREQs.
    let signals = StdArc::new(Signals::default());
    let t = Instant::now();
    let (inst, qp_b, s1) = (al.instance().clone(), nodes[1].qp, signals.clone());
    let on_request: ListenHandler = StdArc::new(move |_l, cep, ev| {
        s1.raise(format!("B:{}", ev.name()));
        if let Err(e) = cm::accept(&inst, cep, qp_b, &AcceptReply::default()) {
            s1.raise(format!("B:accept failed: {e}"));
        }
    });
    let (inst, s2) = (al.instance().clone(), signals.clone());
    let passive: CmHandler = StdArc::new(move |cep, ev| {
        s2.raise(format!("B:{}", ev.name()));
        if let Event::DisconnectRequest { .. } = ev {
            let _ = cm::disconnect_reply(&inst, cep, &[]);
        }
    });
    let listen =
        cm::listen(al.instance(), cas[1], 1, SERVICE_ID, on_request, passive).map_err(err)?;
    step(
        "listen",
        t,
        format!("service {SERVICE_ID:#x} on soft1 port 1"),
    );

    // Active side: RTU on the reply.
    let (inst, s3) = (al.instance().clone(), signals.clone());
    let active: CmHandler = StdArc::new(move |cep, ev| {
        s3.raise(format!("A:{}", ev.name()));
        if let Event::ReplyReceived { .. } = ev {
            if let Err(e) = cm::rtu(&inst, cep, &[]) {
                s3.raise(format!("A:rtu failed: {e}"));
            }
        }
    });
    let t = Instant::now();
    let cep = cm::connect(
        al.instance(),
        nodes[0].qp,
        &ConnectRequest::new(SERVICE_ID, devices::DEFAULT_LIDS[1]),
        active,
    )
    .map_err(err)?;
    signals.wait_for("A:Established", Duration::from_secs(10))?;
    signals.wait_for("B:Established", Duration::from_secs(10))?;
    step(
        "connect (REQ/REP/RTU)",
        t,
        "both sides ESTABLISHED, QPs in RTS".into(),
    );

    // Ping-pong.
    let t = Instant::now();
    let mut rtts = Vec::with_capacity(config.iterations as usize);
    // Per side, the pattern of iteration 0; iteration i adds i to each byte
    // (see `pattern_byte`). Filling and checking 2 x `size` bytes per round
    // trip is the application's work, not the transport's, and would be a
    // large part of a microsecond round trip: it is done outside the timed
    // part, which covers post, transfer, completion and the sequence check.
    let base: [Vec<u8>; 2] =
        [0u8, 1].map(|side| (0..size).map(|k| pattern_byte(k, 0, side)).collect());
    let mut transfer_secs = 0.0;
    for i in 0..config.iterations {
        let mut rtt = Duration::ZERO;
        for (from, to, side) in [(0usize, 1usize, 0u8), (1, 0, 1)] {
            let (src, dst) = (&nodes[from], &nodes[to]);
            let shift = i as u8;
            src.buf
                .with_range_mut(0, size, |b| {
                    for (out, p) in b.iter_mut().zip(&base[side as usize]) {
                        *out = p.wrapping_add(shift);
                    }
                })
                .map_err(|e| format!("fill the source buffer: {e}"))?;
            let start = Instant::now();
            // The receiver posts for the SEND that follows the WRITE.
            let rs = [Sge {
                addr: size as u64,
                length: 8,
                lkey: dst.lkey,
            }];
            post_recv(
                &al,
                dst.qp,
                &[RecvWr {
                    wr_id: 100 + i as u64,
                    sg_list: &rs,
                }],
            )
            .map_err(err)?;
            src.buf
                .write(size, &(i as u64).to_le_bytes())
                .map_err(err)?;
            let ws = [Sge {
                addr: 0,
                length: size as u32,
                lkey: src.lkey,
            }];
            let ss = [Sge {
                addr: size as u64,
                length: 8,
                lkey: src.lkey,
            }];
            post_send(
                &al,
                src.qp,
                &[
                    SendWr::new(
                        1,
                        SendOp::Write {
                            remote_addr: 0,
                            rkey: dst.rkey,
                        },
                        &ws,
                    )
                    .unsignaled(),
                    SendWr::new(2, SendOp::Send, &ss),
                ],
            )
            .map_err(err)?;
            let wc = poll_until(&al, dst.cq, 100 + i as u64)?;
            if wc.byte_len != 8 {
                return Err(format!("SEND carried {} bytes, not 8", wc.byte_len));
            }
            poll_until(&al, src.cq, 2)?;
            let mut seq = [0u8; 8];
            dst.buf.read(size, &mut seq).map_err(err)?;
            if u64::from_le_bytes(seq) != i as u64 {
                return Err(format!(
                    "iteration {i}: SEND carried the wrong sequence number"
                ));
            }
            rtt += start.elapsed();
            // OR of the differences: no early exit, so it vectorises.
            let differs = dst.buf.with(|b| {
                b[..size]
                    .iter()
                    .zip(&base[side as usize])
                    .fold(0u8, |acc, (got, p)| acc | (got ^ p.wrapping_add(shift)))
            });
            if differs != 0 {
                let got = dst.buf.to_vec();
                let k = (0..size)
                    .find(|&k| got[k] != pattern_byte(k, i, side))
                    .unwrap_or(0);
                return Err(format!(
                    "iteration {i}: RDMA WRITE data differs at byte {k}: {:#04x}, expected {:#04x}",
                    got[k],
                    pattern_byte(k, i, side)
                ));
            }
        }
        transfer_secs += rtt.as_secs_f64();
        rtts.push(rtt.as_secs_f64() * 1e6);
    }
    rtts.sort_by(|a, b| a.total_cmp(b));
    let median = rtts[rtts.len() / 2];
    let p99 = rtts[((rtts.len() * 99) / 100).min(rtts.len() - 1)];
    // Over the timed transfers only, like the round trips.
    let bandwidth = 2.0 * size as f64 * config.iterations as f64 / transfer_secs / 1e6;
    step(
        "ping-pong",
        t,
        format!(
            "{} round trips, every byte of every WRITE and every SEND's sequence number checked",
            config.iterations
        ),
    );

    let t = Instant::now();
    cm::disconnect(&al, cep, &[]).map_err(err)?;
    signals.wait_for("A:Disconnected", Duration::from_secs(10))?;
    signals.wait_for("A:Released", Duration::from_secs(10))?;
    signals.wait_for("B:Released", Duration::from_secs(10))?;
    step(
        "disconnect (DREQ/DREP, timewait)",
        t,
        "both CEPs released".into(),
    );

    let cm_mads_sent = cm_ports
        .iter()
        .filter_map(|p| al.resolve(*p).ok().map(|p| p.stats().mads_sent))
        .sum();
    let t = Instant::now();
    al.destroy_sync(listen).map_err(err)?;
    for n in &nodes {
        al.destroy_sync(n.qp).map_err(err)?;
        al.destroy_sync(n.mr).map_err(err)?;
        al.destroy_sync(n.cq).map_err(err)?;
        al.destroy_sync(n.pd).map_err(err)?;
    }
    for ca in &cas {
        al.destroy_sync(*ca).map_err(err)?;
    }
    let before_close = al.stats();
    step("destroy", t, format!("left before close: {before_close}"));
    let captured_packets = match (capture, &config.capture) {
        (Some(c), Some(path)) => {
            let t = Instant::now();
            let n = c.finish()?;
            step(
                "write capture",
                t,
                format!("{n} packets to {}", path.display()),
            );
            Some(n)
        }
        _ => None,
    };
    let t = Instant::now();
    let stats = al.close().map_err(err)?;
    step("close AL", t, format!("{stats}"));
    let live = stats.total_live();
    if live != 0 || before_close.total_live() != 0 {
        return Err(format!("objects leaked: {before_close} / {stats}"));
    }
    Ok(PingPongReport {
        config: config.clone(),
        steps,
        rtt_median_us: median,
        rtt_p99_us: p99,
        bandwidth_mb_s: bandwidth,
        cm_mads_sent,
        captured_packets,
        live_after_close: live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_pingpong_connects_moves_data_and_leaks_nothing() {
        let report = run(&PingPongConfig {
            iterations: 20,
            size: 1000,
            capture: None,
        })
        .unwrap();
        assert_eq!(report.live_after_close, 0);
        assert!(report.rtt_median_us > 0.0);
        assert!(report.to_text().contains("nothing leaked"));
        let json = report.to_json();
        assert!(json.starts_with('{') && json.ends_with('}'));
    }

    #[test]
    fn each_iterations_pattern_differs_in_every_byte_from_what_the_buffer_held_before() {
        // What a receiving buffer may still hold if a WRITE did not land: the
        // previous iteration's payload from the same side, or what its own
        // node sent from those bytes (the other side's, this or the last
        // iteration).
        for i in 1..600u32 {
            for side in [0u8, 1] {
                let other = 1 - side;
                for k in 0..512 {
                    let want = pattern_byte(k, i, side);
                    assert_ne!(want, pattern_byte(k, i - 1, side), "i {i} k {k}");
                    assert_ne!(want, pattern_byte(k, i, other), "i {i} k {k}");
                    assert_ne!(want, pattern_byte(k, i - 1, other), "i {i} k {k}");
                }
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(run(&PingPongConfig {
            iterations: 0,
            size: 10,
            capture: None,
        })
        .is_err());
    }
}
