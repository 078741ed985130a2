//! The driver: one receive thread per port and one timer thread per
//! device.
//!
//! * A receive thread blocks in `recvmmsg`, checks and decodes each
//!   datagram and hands it to the QP its BTH names. It blocks with no
//!   timeout: an idle device's receive threads never wake; closing the
//!   device wakes them with an empty datagram to their own sockets.
//! * The timer thread sleeps (`park_timeout`, microsecond precision) until
//!   the earliest entry of the timer heap (`timers`), runs the transports
//!   whose deadline passed, and sleeps again; with nothing armed it parks
//!   with no timeout. A QP that sets a deadline earlier than the one the
//!   thread sleeps towards wakes it (`Timers::arm`).

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::Arc;
use std::net::SocketAddr;
use std::time::Duration;

use crate::cq::Deferred;
use crate::feed::Feeding;
use crate::held_acks::holding_acks;
use crate::mmsg::{RecvBatch, Segment};
use crate::port::PortShared;
use crate::qp::{Dev, QpInner, GSI_KEY};

/// Receive buffer of one datagram: larger than any valid packet, so an
/// oversized datagram is seen as such (the kernel truncates to the
/// buffer and says so).
const RX_BUF: usize = 8192;

/// Most datagrams one turn of a receive thread (or of a poller's
/// [`progress`]) takes before it lets the QPs they reached answer.
const RX_BATCH: usize = crate::mmsg::MAX_BATCH;

/// With GRO, buffers a receive thread's turn takes: each slot is a whole
/// coalesced buffer (`mmsg::GRO_SLOT`, 64 KiB, up to ~60 packets at MTU
/// 1024), as many slots as a plain batch has datagrams: a sender without
/// GSO (a peer with offloads off, a stranger's flood) fills one slot per
/// datagram, and fewer slots would mean more system calls per datagram
/// (with 4 and 8 a flooded ping-pong's median was 2.9-3.3x its quiet one,
/// with 32 1.9-2.6x: docs/benchmarks.md). 2 MiB of address space per
/// port; only what datagrams fill is touched (a flood of 1000-byte
/// datagrams: a page per slot).
const RX_GRO_BATCH: usize = 32;

/// With GRO, buffers of a polling thread's scratch batch ([`progress`]):
/// as [`RX_GRO_BATCH`] (every thread that polls a CQ has one).
const RX_GRO_SCRATCH: usize = 32;

/// A receive batch for `port`: with GRO, `gro_slots` whole coalesced
/// buffers; without, [`RX_BATCH`] datagrams of [`RX_BUF`].
fn batch_for(port: &PortShared, gro_slots: usize) -> RecvBatch {
    if port.gro {
        RecvBatch::with_gro(gro_slots)
    } else {
        RecvBatch::new(RX_BATCH, RX_BUF)
    }
}

/// A device whose CQs were polled this recently has active pollers.
const POLLERS_ACTIVE: Duration = Duration::from_micros(200);

/// A receive thread's first nap while pollers are active ([`run_port`]).
const NAP_FIRST: Duration = Duration::from_micros(100);

/// Its longest: each nap in a row doubles, up to this. A held ACK waits at
/// most this once its poller stops (`HeldAcks`): far below an RC ACK
/// timeout a LAN uses (14: 67 ms; the relay tests' 11: 8.4 ms).
const NAP_MAX: Duration = Duration::from_micros(1600);

/// The nap after `nap` while the pollers stay active.
fn next_nap(nap: Duration) -> Duration {
    (nap * 2).min(NAP_MAX)
}

/// The receive loop of port `idx` until `stop` is set.
///
/// A turn blocks for one datagram and takes whatever else is already
/// queued (up to [`RX_BATCH`]) in the same `recvmmsg` (`MSG_WAITFORONE`),
/// and only then lets each QP the datagrams reached send and complete
/// (`QpInner::drive`): a burst of requests is acknowledged by one
/// coalesced ACK, and its completions land together, instead of one ACK
/// datagram and one CQ update per packet. A lone datagram is answered at
/// once, as before.
pub(crate) fn run_port(dev: Arc<Dev>, idx: usize, stop: Arc<AtomicBool>) {
    let (port, feed_lock) = (&dev.ports[idx], &dev.feed_locks[idx]);
    let mut batch = batch_for(port, RX_GRO_BATCH);
    let mut reached: Vec<Arc<QpInner>> = Vec::with_capacity(RX_BATCH);
    let mut nap = NAP_FIRST;
    // Block with no timeout (the socket was bound with a read timeout,
    // `port::RECV_TIMEOUT`, which woke every idle device's receive threads
    // ten times a second for nothing): the device's close wakes the thread
    // with a datagram (`shutdown::signal_stop`), and the ACKs pollers hold
    // are sent before the thread blocks (below). If the timeout cannot be
    // lifted the thread still works, waking at the timeout's pace.
    let _ = port.socket.set_read_timeout(None);
    loop {
        // While an application polls the device's CQs, the pollers take
        // the datagrams (`progress`); a receive thread blocked in the
        // socket would be woken for each one only to find it gone, and
        // its wake-ups cost the pollers their cores. It naps instead, and
        // takes over within a nap of the polling's end.
        // ACKs a poller held go now if nobody sent them since (they are
        // never later than one nap).
        // The naps double while the polling goes on (100 us, 200 us, ...
        // 1.6 ms): every wake-up of this thread takes a CPU from a poller
        // for tens of microseconds on a VM, and at 100 us apart they put
        // one round trip in ten of a ping-pong above 20 us (`perf
        // send-lat`, docs/benchmarks.md); a short burst of polling still
        // hands the socket back within 100-300 us.
        port.flush_held();
        if dev.polled_within(POLLERS_ACTIVE) {
            port.counters.add(&port.counters.rx_thread_naps, 1);
            crate::delay::point(crate::delay::Point::NapBefore);
            al::sync::thread::sleep(nap);
            crate::delay::point(crate::delay::Point::NapAfter);
            nap = next_nap(nap);
            if stop.load(Ordering::Acquire) {
                break;
            }
            continue;
        }
        nap = NAP_FIRST;
        // The port's feeding lock is held across the blocking receive, so
        // a poller cannot feed a later datagram of this port while this
        // thread holds an earlier one it has not fed yet (that reordered
        // READ responses). Pollers only try the lock: while this thread
        // waits in the socket they leave the port to it.
        #[cfg(not(ibal_mutant = "feed_no_lock_across_recv"))]
        let mut feeding = feed_lock.feeding(port);
        crate::delay::point(crate::delay::Point::FeedLocked);
        // A poller may have held an ACK after the flush above, before this
        // thread had the lock; none can while it has it (only the port's
        // feeder holds ACKs). Sent now, nothing is held while the thread
        // blocks, so no wake-up is ever needed to send it.
        port.flush_held();
        let n = batch.recv(&port.socket, RX_BATCH, true);
        // The mistake: the lock taken only once a datagram is in hand.
        #[cfg(ibal_mutant = "feed_no_lock_across_recv")]
        let mut feeding = feed_lock.feeding(port);
        crate::delay::point(crate::delay::Point::RxReceived);
        port.counters.add(&port.counters.rx_thread_wakeups, 1);
        if stop.load(Ordering::Acquire) {
            break;
        }
        // Callbacks the datagrams cause (a CM event on QP1, a completion
        // hook's) run here once the port is released, if their AL's
        // executor is idle, instead of waking its thread (one wake-up per
        // CM message: `al::executor::inline`).
        let callbacks = al::executor::InlineScope::enter();
        feed(
            &dev,
            &mut feeding,
            &batch,
            n,
            &mut Reached::Later(&mut reached),
        );
        crate::delay::point(crate::delay::Point::RxFed);
        for qp in reached.drain(..) {
            qp.drive_now();
        }
        drop(feeding);
        // The mistake: this thread's datagrams counted after it released
        // the feeding lock, by a load and a store (`feed` left them out).
        #[cfg(ibal_mutant = "feed_counter_unlocked")]
        {
            let c = &port.counters.rx_datagrams;
            c.store(c.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
        }
        callbacks.run();
    }
}

/// What becomes of a QP a datagram reached.
pub(crate) enum Reached<'a> {
    /// Listed (once), for the caller to drive when its batch is done (one
    /// drive per QP per batch).
    Later(&'a mut Vec<Arc<QpInner>>),
    /// Driven at once, under the lock its packet was taken with (a lone
    /// datagram); the hooks go on the [`Deferred`], for the caller to run
    /// once it holds no receive buffer.
    Now(&'a mut Deferred),
}

/// What [`feed`] did with a batch.
struct Fed {
    /// Packets the receive stage passed.
    accepted: usize,
    /// The clock when the batch was fed.
    at: Duration,
}

/// Feeds the `n` datagrams of `batch` to their QPs: each packet of each,
/// a buffer the kernel coalesced (GRO) cut into its packets.
fn feed(
    dev: &Dev,
    fed: &mut Feeding<'_, QpInner>,
    batch: &RecvBatch,
    n: usize,
    reached: &mut Reached<'_>,
) -> Fed {
    // Every packet and its bytes, counted once per batch (`rx_datagrams`
    // counts the packets of a coalesced buffer one by one, as they would
    // have arrived without GRO); one clock reading for the batch (they
    // arrived together).
    let (mut datagrams, mut bytes, mut accepted) = (0u64, 0u64, 0);
    let (mut gro_buffers, mut gro_segments) = (0u64, 0u64);
    let now = dev.now();
    for d in (0..n).filter_map(|i| batch.get(i)) {
        let mut segments = 0u64;
        for seg in d.segments() {
            segments += 1;
            bytes += seg.bytes.len() as u64;
            accepted += usize::from(handle_datagram(dev, fed, seg, d.from, now, reached));
        }
        datagrams += segments;
        if segments > 1 {
            gro_buffers += 1;
            gro_segments += segments;
        }
    }
    #[cfg(ibal_mutant = "feed_counter_unlocked")]
    let datagrams = if crate::provider_threads::on_provider_thread() {
        0 // counted by `run_port`, after the lock
    } else {
        datagrams
    };
    fed.count(|c| &c.rx_datagrams, datagrams);
    fed.count(|c| &c.rx_bytes, bytes);
    fed.count(|c| &c.rx_gro_buffers, gro_buffers);
    fed.count(|c| &c.rx_gro_segments, gro_segments);
    Fed { accepted, at: now }
}

/// Most batches one poller's progress takes from a port in a row while
/// each is full and holds nothing the receive stage passes.
const DRAIN_BATCHES: usize = 8;

/// A polling thread's receive buffers for [`progress`], made when first
/// needed: one batch for ports without GRO, one for ports with it.
struct Scratch {
    plain: Option<RecvBatch>,
    gro: Option<RecvBatch>,
}

impl Scratch {
    /// The batch for `port`.
    fn batch(&mut self, port: &PortShared) -> &mut RecvBatch {
        let slot = if port.gro {
            &mut self.gro
        } else {
            &mut self.plain
        };
        slot.get_or_insert_with(|| batch_for(port, RX_GRO_SCRATCH))
    }
}

al::thread_local_value! {
    /// A polling thread's receive buffers for [`progress`].
    static RX_SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new(Scratch { plain: None, gro: None }) };
}
al::thread_local_value! {
    /// Whether this poller's next receive asks for a whole batch
    /// ([`poller_batch`]).
    static RX_WIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
al::thread_local_value! {
    /// A polling thread's list of the QPs its [`progress`] reached.
    static REACHED: std::cell::Cell<Vec<Arc<QpInner>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// How many datagrams a poller's receive asks for: one, unless its last
/// receive filled what it asked for or took more than one (a stream: then
/// [`RX_BATCH`], until a receive finds fewer). One at a time is a
/// `recvfrom` (`RecvBatch::recv`), where a batch's `recvmmsg` cost
/// 0.93-0.97 us with data against `recvfrom`'s 0.75-0.77 (syscall
/// tracepoints, `perf send-lat`): in a ping-pong the poller takes one
/// datagram per poll, and that receive is on the round trip's path.
fn poller_batch() -> usize {
    if RX_WIDE.with(|w| w.get()) {
        RX_BATCH
    } else {
        1
    }
}

/// Notes that a poller's receive asked for `asked` datagrams and took
/// `took`.
fn poller_took(asked: usize, took: usize) {
    RX_WIDE.with(|w| w.set(took > 1 || (took > 0 && took == asked)));
}

/// Progress on the calling thread (a poller of an empty CQ): whatever has
/// already arrived on the device's ports is fed to its QPs and the QPs it
/// reached are driven, as a receive thread would, without waiting for one
/// to wake. A port whose receive thread (or another poller) is busy
/// feeding it is skipped. Returns when the first datagram taken was fed
/// (the device's clock), or None if none was taken.
pub(crate) fn progress(dev: &Dev) -> Option<Duration> {
    // The thread's list from its last progress (no allocation per poll
    // that takes a datagram); a nested progress (a CQ hook that polls)
    // finds it taken and uses a new one.
    let mut reached = REACHED.with(|r| r.take());
    let first = progress_with(dev, &mut reached);
    reached.clear();
    REACHED.with(|r| r.set(reached));
    first
}

fn progress_with(dev: &Dev, reached: &mut Vec<Arc<QpInner>>) -> Option<Duration> {
    let mut first: Option<Duration> = None;
    for (port, feed_lock) in dev.ports.iter().zip(&dev.feed_locks) {
        // What the last progress held back goes before anything new.
        port.flush_held();
        let Some(mut feeding) = feed_lock.try_feeding(port) else {
            continue;
        };
        crate::delay::point(crate::delay::Point::PollFeedLocked);
        // A lone datagram's QP is driven as the packet is taken, a
        // batch's QPs once the batch is fed; either way the completion
        // hooks run only once the scratch buffers are released: a hook
        // may poll (and so come back here, or take them in another
        // device's progress).
        let mut hooks = Deferred::default();
        let taken = RX_SCRATCH.with(|cell| {
            let scratch = &mut *cell.borrow_mut();
            let batch = scratch.batch(port);
            // What a call can take at most (fewer, larger slots with GRO).
            let wide = batch.capacity();
            let mut asked = poller_batch().min(wide);
            let mut first: Option<Duration> = None;
            for _ in 0..DRAIN_BATCHES {
                let n = batch.recv(&port.socket, asked, false);
                poller_took(asked, n);
                if n == 0 {
                    break;
                }
                // (A coalesced buffer is a batch of packets: fed as one.)
                if batch.lone_packet(n) {
                    // A lone datagram (a ping-pong's): its QP is driven as
                    // it takes the packet, its positive ACK held as below.
                    let fed = holding_acks(|| {
                        feed(dev, &mut feeding, batch, n, &mut Reached::Now(&mut hooks))
                    });
                    first.get_or_insert(fed.at);
                    break;
                }
                let fed = feed(dev, &mut feeding, batch, n, &mut Reached::Later(reached));
                first.get_or_insert(fed.at);
                // A full batch of which the receive stage took nothing (a
                // stranger's flood, or any junk) says nothing to the
                // application: take the next at once rather than return to
                // it empty-handed, so a packet queued behind the junk is
                // not left there for another poll (each a yield or more:
                // a flooded ping-pong's median went from 24 to 58-92 us).
                if n < asked || fed.accepted > 0 {
                    break;
                }
                asked = wide;
            }
            first
        });
        hooks.run();
        // Ports are taken in turn: the first that had a datagram had it
        // first.
        first = first.or(taken);
        crate::delay::point(crate::delay::Point::PollFed);
        // The positive ACKs these drives produce are held: the caller's
        // application is about to see the completions and often answers
        // at once, and its packets take the ACKs along (`HeldAcks`).
        holding_acks(|| {
            for qp in reached.drain(..) {
                qp.drive_now();
            }
        });
    }
    first
}

/// One packet `seg` from `src` (a datagram, or a segment of a coalesced
/// buffer; already counted as a datagram by [`feed`]), taken at `now`:
/// through the receive stage ([`roce_transport::receive_segment()`]:
/// shape, destination QP on this port, opcode, state, keys, the
/// connection's addresses, ICRC for the identification its place in the
/// buffer says a GSO sender gave it), then to its QP, or dropped and
/// counted by reason. Nothing here panics on any input, and nothing of a
/// QP but its filter is read before the stage has passed the packet.
///
/// The QP the packet reached is driven or listed as `reached` says.
/// Returns whether the stage passed the datagram.
fn handle_datagram(
    dev: &Dev,
    fed: &mut Feeding<'_, QpInner>,
    seg: Segment<'_>,
    src: Option<SocketAddr>,
    now: Duration,
    reached: &mut Reached<'_>,
) -> bool {
    let bytes = seg.bytes;
    let port = fed.port();
    let (memo, gate) = fed.rx_state();
    let find = |dqp: u32| {
        let key = if dqp == 1 {
            GSI_KEY | u32::from(port.num)
        } else {
            dqp
        };
        let qp = dev.qps.find(key, memo)?;
        let filter = qp.filter();
        Some((qp, filter))
    };
    let accepted = match roce_transport::receive_segment(
        &port.view,
        bytes,
        src,
        seg.truncated,
        seg.index,
        now,
        gate,
        find,
    ) {
        Ok(a) => a,
        Err(why) => {
            fed.count(|c| c.discarded(why), 1);
            crate::trace::discarded(port.num, why, src, bytes);
            return false;
        }
    };
    if accepted.solved {
        fed.count(|c| &c.rx_ipv4_id_solved, 1);
    }
    fed.count(|c| &c.rx_packets, 1);
    let (qp, ep, pkt) = (accepted.qp, accepted.endpoints, accepted.packet);
    match reached {
        Reached::Now(hooks) => qp.on_packet_and_drive(port, &ep, &pkt, hooks, now),
        Reached::Later(list) => {
            if qp.on_packet(port, &ep, &pkt, now) && !list.iter().any(|q| Arc::ptr_eq(q, &qp)) {
                list.push(qp);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_double_up_to_a_bound_far_below_an_ack_timeout() {
        let mut naps = vec![NAP_FIRST];
        while naps.len() < 10 {
            naps.push(next_nap(*naps.last().unwrap()));
        }
        let us: Vec<u128> = naps.iter().map(|d| d.as_micros()).collect();
        assert_eq!(us, [100, 200, 400, 800, 1600, 1600, 1600, 1600, 1600, 1600]);
        // 4.096 us * 2^11, the shortest ACK timeout the two-process tests use.
        assert!(NAP_MAX * 4 < Duration::from_nanos(4096 << 11));
    }

    #[test]
    fn a_poller_asks_for_one_datagram_until_one_is_not_enough() {
        // Each test runs on its own thread: the rule's state starts fresh.
        assert_eq!(poller_batch(), 1, "a ping-pong's poller");
        poller_took(1, 0);
        assert_eq!(poller_batch(), 1, "found nothing");
        poller_took(1, 1);
        assert_eq!(poller_batch(), RX_BATCH, "filled its one: maybe a stream");
        poller_took(RX_BATCH, 5);
        assert_eq!(poller_batch(), RX_BATCH, "a stream");
        poller_took(RX_BATCH, 1);
        assert_eq!(poller_batch(), 1, "one of many asked: back to one");
        poller_took(1, 1);
        poller_took(RX_BATCH, 0);
        assert_eq!(poller_batch(), 1, "an empty poll ends the stream");
    }
}
