//! `ibal pingpong --loopback`: the main job.
//!
//! Two soft HCAs on the embedded in-process fabric; a listener on the
//! second; a connection from the first through the connection manager (REQ,
//! REP, RTU as real 256-byte MADs on QP1); an RDMA WRITE + SEND ping-pong of
//! N iterations with the data checked byte for byte; disconnect (DREQ,
//! DREP, timewait); destroy; and a check that nothing is left live.

use std::path::PathBuf;
use std::sync::{Arc as StdArc, Condvar as StdCondvar, Mutex as StdMutex};
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, AcceptReply, CmHandler, ConnectRequest, ListenHandler};
use cep::proto::Event;
use hca::provider::{Access, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use hca::verbs::{self, Cq, Mr, Pd};
use hca::RegisteredBuffer;
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};

use crate::capture::FabricCapture;
use crate::devinfo;

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
    pub rtt_median_us: f64,
    pub rtt_p99_us: f64,
    /// Payload bytes moved (both directions) per second.
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
            "\n  round trip (WRITE + SEND each way): median {:.2} us, p99 {:.2} us\n",
            self.rtt_median_us, self.rtt_p99_us
        ));
        out.push_str(&format!(
            "  bandwidth: {:.1} MB/s of payload\n",
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
    let provider = devinfo::default_provider();
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
    for guid in devinfo::DEFAULT_NODE_GUIDS {
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
        &ConnectRequest::new(SERVICE_ID, devinfo::DEFAULT_LIDS[1]),
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
    let pattern = |i: u32, side: u8| -> Vec<u8> {
        (0..size)
            .map(|k| {
                (k as u32)
                    .wrapping_mul(31)
                    .wrapping_add(i)
                    .wrapping_add(side as u32) as u8
            })
            .collect()
    };
    for i in 0..config.iterations {
        let start = Instant::now();
        for (from, to, side) in [(0usize, 1usize, 0u8), (1, 0, 1)] {
            let (src, dst) = (&nodes[from], &nodes[to]);
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
            if i == 0 || i + 1 == config.iterations {
                src.buf.write(0, &pattern(i, side)).map_err(err)?;
            }
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
            if i == 0 || i + 1 == config.iterations {
                let got = dst.buf.to_vec();
                if got[..size] != pattern(i, side)[..] {
                    return Err(format!("iteration {i}: RDMA WRITE data differs"));
                }
            }
        }
        rtts.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let elapsed = t.elapsed().as_secs_f64();
    rtts.sort_by(|a, b| a.total_cmp(b));
    let median = rtts[rtts.len() / 2];
    let p99 = rtts[((rtts.len() * 99) / 100).min(rtts.len() - 1)];
    let bandwidth = 2.0 * size as f64 * config.iterations as f64 / elapsed / 1e6;
    step(
        "ping-pong",
        t,
        format!(
            "{} round trips, data checked byte for byte",
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
    fn bad_settings_are_refused() {
        assert!(run(&PingPongConfig {
            iterations: 0,
            size: 10,
            capture: None,
        })
        .is_err());
    }
}
