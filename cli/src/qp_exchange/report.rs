//! What a run of `ibal qp-exchange` reports, in the tools' words and as
//! JSON, and how a failed run's AL closed.

use crate::oob::Dest;

/// What a `--rdma-bulk` run did.
#[derive(Clone, Debug, Default)]
pub struct BulkReport {
    /// Bytes written and bytes read.
    pub size: usize,
    /// Client: seconds from posting the WRITE to its completion.
    pub write_seconds: f64,
    /// Client: seconds from posting the READ to its completion.
    pub read_seconds: f64,
    /// Bytes of the READ checked (client) or of the WRITE (server).
    pub checked: usize,
    /// Packets each way at the path MTU (ceil(size / MTU)).
    pub packets: usize,
    /// The verdict line the peer (server) sent back, or the one we sent.
    pub verdict: String,
    /// Client: the peer's buffer address and R_Key (our WRITE's RETH
    /// carries them; the READ's address is `size` further).
    pub peer_buffer: (u64, u32),
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct QpxReport {
    /// `rc` or `ud`.
    pub mode: &'static str,
    /// `server` or `client`.
    pub role: &'static str,
    /// `ibal` (extension seen) or `ibv` (plain ibv_*_pingpong peer).
    pub peer: &'static str,
    /// Our address.
    pub local: Dest,
    /// The peer's address.
    pub remote: Dest,
    /// Round trips done.
    pub iters: u32,
    /// Message size.
    pub size: usize,
    /// SEND payload bytes moved both ways (the tools' count).
    pub bytes: u64,
    /// RDMA WRITEs received and checked.
    pub writes_checked: u32,
    /// Messages received and checked byte for byte.
    pub messages_checked: u32,
    /// Seconds from the first SEND to the last completion.
    pub seconds: f64,
    /// With `--write`: the R_Key of our WRITE target (the peer's RETHs
    /// carry it) and the peer's (ours carry it); 0 otherwise.
    pub write_rkeys: (u32, u32),
    /// The AL's object counts at close.
    pub close_stats: String,
    /// `--rdma-bulk`: what moved.
    pub bulk: Option<BulkReport>,
}

impl QpxReport {
    /// Megabits per second as the ibv tools print it.
    pub fn mbit_per_sec(&self) -> f64 {
        self.bytes as f64 * 8.0 / (self.seconds * 1e6)
    }

    /// Megabytes (10^6) per second.
    pub fn mbyte_per_sec(&self) -> f64 {
        self.bytes as f64 / (self.seconds * 1e6)
    }

    /// Microseconds per round trip.
    pub fn usec_per_iter(&self) -> f64 {
        self.seconds * 1e6 / f64::from(self.iters.max(1))
    }

    /// Human-readable, in the tools' words.
    pub fn to_text(&self) -> String {
        if let Some(b) = &self.bulk {
            return self.bulk_text(b);
        }
        let d = |x: &Dest| {
            format!(
                "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
                x.lid,
                x.qpn,
                x.psn,
                std::net::Ipv6Addr::from(x.gid)
            )
        };
        let mut s = String::new();
        s += &format!("  local address:  {}\n", d(&self.local));
        s += &format!("  remote address: {}\n", d(&self.remote));
        s += &format!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec ({:.2} MB/s)\n",
            self.bytes,
            self.seconds,
            self.mbit_per_sec(),
            self.mbyte_per_sec()
        );
        s += &format!(
            "{} iters in {:.2} seconds = {:.2} usec/iter\n",
            self.iters,
            self.seconds,
            self.usec_per_iter()
        );
        s += &format!(
            "checked: {} {} messages from an {} peer byte for byte{}\n",
            self.messages_checked,
            self.mode.to_uppercase(),
            self.peer,
            if self.writes_checked > 0 {
                format!(", and {} RDMA WRITEs", self.writes_checked)
            } else {
                String::new()
            }
        );
        s += &format!("closed: {}\n", self.close_stats);
        s
    }

    fn bulk_text(&self, b: &BulkReport) -> String {
        let mut s = format!(
            "  local address:  QPN 0x{:06x}, PSN 0x{:06x}\n  remote address: QPN 0x{:06x}, PSN 0x{:06x}\n",
            self.local.qpn, self.local.psn, self.remote.qpn, self.remote.psn
        );
        if self.role == "client" {
            let rate = |secs: f64| b.size as f64 / (secs.max(1e-9) * 1e6);
            s += &format!(
                "RDMA WRITE {} bytes ({} packets) in {:.3} s = {:.2} MB/s\n",
                b.size,
                b.packets,
                b.write_seconds,
                rate(b.write_seconds)
            );
            s += &format!(
                "RDMA READ  {} bytes ({} packets) in {:.3} s = {:.2} MB/s, {} bytes checked\n",
                b.size,
                b.packets,
                b.read_seconds,
                rate(b.read_seconds),
                b.checked
            );
            s += &format!("peer's verdict on our WRITE: {}\n", b.verdict);
        } else {
            s += &format!("checked the peer's RDMA WRITE: {}\n", b.verdict);
        }
        s += &format!("closed: {}\n", self.close_stats);
        s
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let bulk = match &self.bulk {
            Some(b) => format!(
                concat!(
                    ",\"bulk\":{{\"size\":{},\"packets\":{},\"write_seconds\":{:.6},",
                    "\"read_seconds\":{:.6},\"checked\":{},\"peer_addr\":{},\"peer_rkey\":{},",
                    "\"verdict\":\"{}\"}}"
                ),
                b.size,
                b.packets,
                b.write_seconds,
                b.read_seconds,
                b.checked,
                b.peer_buffer.0,
                b.peer_buffer.1,
                json_escape(&b.verdict)
            ),
            None => String::new(),
        };
        format!(
            concat!(
                "{{\"command\":\"qp-exchange\",\"mode\":\"{}\",\"role\":\"{}\",\"peer\":\"{}\",",
                "\"local\":{{\"qpn\":{},\"psn\":{},\"gid\":\"{}\"}},",
                "\"remote\":{{\"qpn\":{},\"psn\":{},\"gid\":\"{}\"}},",
                "\"iters\":{},\"size\":{},\"bytes\":{},\"messages_checked\":{},",
                "\"writes_checked\":{},\"local_write_rkey\":{},\"remote_write_rkey\":{},",
                "\"seconds\":{:.6},\"mbit_per_sec\":{:.3},",
                "\"mbyte_per_sec\":{:.3},\"usec_per_iter\":{:.3}{},\"clean\":true}}"
            ),
            self.mode,
            self.role,
            self.peer,
            self.local.qpn,
            self.local.psn,
            std::net::Ipv6Addr::from(self.local.gid),
            self.remote.qpn,
            self.remote.psn,
            std::net::Ipv6Addr::from(self.remote.gid),
            self.iters,
            self.size,
            self.bytes,
            self.messages_checked,
            self.writes_checked,
            self.write_rkeys.0,
            self.write_rkeys.1,
            self.seconds,
            self.mbit_per_sec(),
            self.mbyte_per_sec(),
            self.usec_per_iter(),
            bulk,
        )
    }
}

/// How the AL closed after a failed run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The run failed before the AL was opened.
    NotOpened,
    /// Nothing was left live (the AL's object counts).
    Clean(String),
    /// Objects were left live (the AL's object counts).
    Leaked(String),
    /// The close itself failed (its error).
    Failed(String),
}

/// A failed run: what went wrong, and how the AL closed afterwards (a
/// failure is never mistaken for a leak, and a leak never hides behind a
/// failure).
#[derive(Clone, Debug)]
pub struct QpxFailure {
    /// What went wrong (empty when only the close went wrong).
    pub error: String,
    /// The close.
    pub closed: Closed,
}

impl QpxFailure {
    pub(super) fn before_open(error: impl Into<String>) -> QpxFailure {
        QpxFailure {
            error: error.into(),
            closed: Closed::NotOpened,
        }
    }

    /// Whether nothing was left live.
    pub fn clean(&self) -> bool {
        matches!(self.closed, Closed::NotOpened | Closed::Clean(_))
    }

    /// One JSON object: `error`, `close` (`not-opened`, `clean`, `leaked`
    /// or `failed`), `close_detail` and `clean`.
    pub fn to_json(&self) -> String {
        let (close, detail) = match &self.closed {
            Closed::NotOpened => ("not-opened", ""),
            Closed::Clean(s) => ("clean", s.as_str()),
            Closed::Leaked(s) => ("leaked", s.as_str()),
            Closed::Failed(s) => ("failed", s.as_str()),
        };
        format!(
            "{{\"command\":\"qp-exchange\",\"error\":\"{}\",\"close\":\"{close}\",\"close_detail\":\"{}\",\"clean\":{}}}",
            json_escape(&self.error),
            json_escape(detail),
            self.clean()
        )
    }
}

impl std::fmt::Display for QpxFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)?;
        let sep = if self.error.is_empty() { "" } else { "\n" };
        match &self.closed {
            Closed::NotOpened => Ok(()),
            Closed::Clean(s) => write!(f, "{sep}closed: no objects left live ({s})"),
            Closed::Leaked(s) => write!(f, "{sep}objects left live at close: {s}"),
            Closed::Failed(s) => write!(f, "{sep}closing the AL: {s}"),
        }
    }
}

/// `s` as the inside of a JSON string.
fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_how_the_al_closed_in_text_and_json() {
        let f = QpxFailure {
            error: "bad message from the peer: expected \"done\\0\"".into(),
            closed: Closed::Clean("PD: 0 live / 1 created".into()),
        };
        assert!(f.clean());
        assert_eq!(
            f.to_string(),
            "bad message from the peer: expected \"done\\0\"\nclosed: no objects left live (PD: 0 live / 1 created)"
        );
        assert_eq!(
            f.to_json(),
            r#"{"command":"qp-exchange","error":"bad message from the peer: expected \"done\\0\"","close":"clean","close_detail":"PD: 0 live / 1 created","clean":true}"#
        );
        let leak = QpxFailure {
            error: String::new(),
            closed: Closed::Leaked("QP: 1 live / 1 created".into()),
        };
        assert!(!leak.clean());
        assert_eq!(
            leak.to_string(),
            "objects left live at close: QP: 1 live / 1 created"
        );
        assert!(leak.to_json().ends_with(
            r#""close":"leaked","close_detail":"QP: 1 live / 1 created","clean":false}"#
        ));
        let early = QpxFailure::before_open("--write needs --mode rc");
        assert_eq!(early.to_string(), "--write needs --mode rc");
        assert!(early.to_json().contains(r#""close":"not-opened""#));
    }
}
