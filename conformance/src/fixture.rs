//! What a provider gives the suite: the [`Fixture`] contract.

use std::time::{Duration, Instant};

use provider::{Device, Gid, Wc};

/// One of the fixture's two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first device (usually the requester).
    A,
    /// The second device (usually the responder).
    B,
}

/// How the suite addresses one side: the local port it uses and the names
/// a peer builds an address vector from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Local port number (1-based) the suite's QPs use on this side.
    pub port: u8,
    /// The port's LID, when the provider routes by LID (`None` on a
    /// RoCE port, where only GIDs exist).
    pub lid: Option<u16>,
    /// A GID of the port that reaches this side.
    pub gid: Gid,
    /// That GID's index in the port's GID table (the peer's AVs do not
    /// use it; this side uses it as `sgid_index`).
    pub gid_index: u8,
}

/// A provider under test: two devices that reach each other, how to
/// address them, and how to wait for them.
///
/// A fixture is built afresh for every check (the `suite!` macro calls
/// its constructor once per test), so checks never see each other's
/// objects. Everything else the suite needs (limits, MTUs, P_Key tables,
/// atomic support) it reads through the [`Device`] trait itself.
pub trait Fixture {
    /// The provider's device type.
    type Device: Device;

    /// The device on `side`. The two devices must be distinct devices of
    /// the provider (opened through its `Provider`), able to exchange
    /// traffic both ways through [`Endpoint::port`].
    fn device(&self, side: Side) -> &Self::Device;

    /// How `side` is addressed.
    fn endpoint(&self, side: Side) -> Endpoint;

    /// Drive the provider once while the suite waits: deliver queued
    /// packets, run retry timers. A provider whose progress runs on its
    /// own threads may do nothing (or yield). Must not block for long.
    fn progress(&self);

    /// Whether an address vector without a GRH, naming a destination LID,
    /// reaches the peer. InfiniBand providers: yes; RoCE: no (every AV
    /// carries a GRH). When `false` the suite builds every AV with a GRH
    /// and skips the LID-routing checks.
    fn supports_lid_routing(&self) -> bool;

    /// Whether a receive completion says that the sender set the
    /// solicited bit (`Wc::solicited`). The soft and RoCEv2 providers: yes.
    /// A provider over libibverbs: no (`ibv_wc` has no such flag; a
    /// solicited event is seen only through an armed CQ), so the suite
    /// then checks the notification alone.
    fn reports_solicited(&self) -> bool {
        true
    }

    /// Whether `post_send` refuses an RC READ or atomic on a QP whose
    /// `max_rd_atomic` is 0 (IBTA: none may be outstanding), with
    /// `InvalidParameter` and the QP unchanged. The soft and RoCEv2
    /// providers: yes. A provider over libibverbs: no (the post succeeds
    /// and the device never sends the request: Linux rxe waits for a
    /// READ/atomic credit that never comes), so the suite then checks only
    /// the responder's side of "0 is none".
    fn refuses_rd_atomic_without_max_rd_atomic(&self) -> bool {
        true
    }

    /// The longest any single wait may take before the check fails. The
    /// default suits a provider that completes within milliseconds.
    fn deadline(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// Wait for `n` completions on `cq` of `dev`: poll, and between polls
    /// call [`progress`](Self::progress), until `n` arrived or
    /// [`deadline`](Self::deadline) passed. Returns what arrived (fewer
    /// than `n` on a timeout; never more). Never hangs. A provider with a
    /// completion channel may override this to block on it instead.
    fn wait_completions(
        &self,
        dev: &Self::Device,
        cq: &<Self::Device as Device>::Cq,
        n: usize,
    ) -> Vec<Wc> {
        let end = Instant::now() + self.deadline();
        let mut got = Vec::with_capacity(n);
        let mut buf = [Wc::default(); 16];
        loop {
            while got.len() < n {
                let want = (n - got.len()).min(buf.len());
                match dev.poll_cq(cq, &mut buf[..want]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            if got.len() >= n || Instant::now() >= end {
                return got;
            }
            self.progress();
            std::thread::yield_now();
        }
    }
}
