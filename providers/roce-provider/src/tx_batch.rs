//! Sending: packets encoded onto a thread's reusable buffer and sent with
//! one `sendmmsg` per batch ([`TxBatch`]), the ACKs held on a port leading
//! them (`HeldAcks`).

use std::net::SocketAddr;
#[cfg(not(ibal_loom))]
use std::net::UdpSocket;

use roce::{Endpoints, Headers, Packet};
use roce_transport::{Leased, LeasedEncodeError, MemError, Memory};

use al::sync::atomic::Ordering;

#[cfg(all(target_os = "linux", not(ibal_loom)))]
use crate::gso;
use crate::held_acks::{encode_onto, is_positive_ack, HeldList, HOLDING_ACKS};
use crate::port::PortShared;
#[cfg(ibal_loom)]
use crate::port::UdpSocket;

/// Most packets one `sendmmsg` carries.
pub(crate) const TX_BATCH: usize = 32;

/// Most packets one `sendmmsg` carries when the port sends GSO
/// super-datagrams (each message up to `gso::MAX_SEGMENTS` packets): a
/// window's worth at MTU 4096, two at 1024.
const TX_BATCH_GSO: usize = 128;

/// Encoded datagrams back to back, and (destination, start, length) of
/// each.
type Encoded = (Vec<u8>, Vec<(SocketAddr, usize, usize)>);

al::thread_local_value! {
    /// Each sending thread's encoding buffers, reused batch after batch
    /// (no allocation and no zeroing of a fresh buffer per packet).
    static TX_SCRATCH: std::cell::RefCell<Encoded> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Packets being encoded for one source socket (see [`PortShared::batch`]).
pub(crate) struct TxBatch<'p> {
    port: &'p PortShared,
    socket: &'p UdpSocket,
    /// Which of the port's send sockets `socket` is ([`PortShared::batch`]).
    sock: usize,
    /// The QP whose packets these are (its ACKs replace each other while
    /// held).
    qpn: u32,
    from: SocketAddr,
    /// The encoded datagrams back to back, and (destination, start, len)
    /// of each: taken from the thread's scratch, given back at drop.
    bytes: Vec<u8>,
    msgs: Vec<(SocketAddr, usize, usize)>,
}

impl<'p> TxBatch<'p> {
    /// The port it sends from.
    pub(crate) fn port(&self) -> &'p PortShared {
        self.port
    }

    /// The flow from this port to `to`, or None (counted, traced).
    fn flow(&self, to: SocketAddr) -> Option<Endpoints> {
        let c = &self.port.counters;
        let ep = Endpoints::new(self.from, to).ok();
        if ep.is_none() {
            c.add(&c.tx_errors, 1);
            crate::trace::not_sent(self.qpn, Some(to), "no flow from this port to the address");
        }
        ep
    }

    /// Encodes a packet of `headers` whose payload `leased` is read from
    /// `mem` straight into the batch's buffer (one copy: the region's
    /// bytes to the datagram, then the ICRC over them while in cache);
    /// sends the batch when full. Fails, with nothing encoded, only when
    /// the memory could not be read (the MR went away).
    pub(crate) fn push_leased(
        &mut self,
        to: SocketAddr,
        headers: Headers,
        leased: &Leased,
        mem: &mut impl Memory,
    ) -> Result<(), MemError> {
        let Some(ep) = self.flow(to) else {
            return Ok(());
        };
        self.scratch();
        let start = self.bytes.len();
        match leased.encode_append(headers, &ep, mem, &mut self.bytes) {
            Ok(n) => self.msgs.push((to, start, n)),
            Err(LeasedEncodeError::Memory(e)) => {
                crate::trace::not_sent(self.qpn, Some(to), "its memory went away");
                return Err(e);
            }
            Err(LeasedEncodeError::Encode(_)) => {
                let c = &self.port.counters;
                c.add(&c.tx_errors, 1);
                crate::trace::not_sent(self.qpn, Some(to), "the packet does not encode");
            }
        }
        if self.msgs.len() >= self.limit() {
            self.flush();
        }
        Ok(())
    }

    /// Encodes `pkt` for the flow to `to`; sends the batch when full.
    pub(crate) fn push(&mut self, to: SocketAddr, pkt: &Packet<'_>) {
        let c = &self.port.counters;
        let Some(ep) = self.flow(to) else {
            return;
        };
        if HOLDING_ACKS.with(|h| h.get()) && is_positive_ack(pkt) && pkt.payload.is_empty() {
            self.port
                .held
                .hold(self.qpn, self.sock, to, ep, pkt.headers);
            return;
        }
        self.scratch();
        match encode_onto(&mut self.bytes, pkt, &ep) {
            Some((start, n)) => self.msgs.push((to, start, n)),
            None => {
                c.add(&c.tx_errors, 1);
                crate::trace::not_sent(self.qpn, Some(to), "the packet does not encode");
            }
        }
        if self.msgs.len() >= self.limit() {
            self.flush();
        }
    }

    /// Packets a batch holds before it is sent.
    fn limit(&self) -> usize {
        if self.port.gso.load(Ordering::Relaxed) {
            TX_BATCH_GSO
        } else {
            TX_BATCH
        }
    }

    /// Takes the thread's reusable buffers if this batch has none yet.
    fn scratch(&mut self) {
        if self.msgs.is_empty() && self.bytes.capacity() == 0 {
            TX_SCRATCH.with(|cell| {
                let (b, m) = &mut *cell.borrow_mut();
                std::mem::swap(&mut self.bytes, b);
                std::mem::swap(&mut self.msgs, m);
            });
            self.bytes.clear();
            self.msgs.clear();
        }
    }

    /// Sends what is encoded. ACKs held for other QPs of the port go
    /// before it; this QP's own stays held (it leaves at the poller's next
    /// progress, after the answer this batch may carry: `HeldAcks`).
    pub(crate) fn flush(&mut self) {
        if !self.msgs.is_empty() {
            self.send();
        }
    }

    /// Sends what is encoded, the ACKs held for other QPs of the port
    /// first.
    fn send(&mut self) {
        if !self.port.held.only(self.sock, self.qpn) {
            // A packet of another QP (a DREQ on QP1) must not overtake the
            // ACK of a request the application already saw complete: held
            // ACKs on other sockets go first by their own sockets, those of
            // other QPs on this one lead this batch, and the list stays
            // locked until all of it left (`HeldList`).
            let mut held = self.port.held.lock();
            while let Some(sock) = held.other_socket(self.sock) {
                self.port.send_held_on(&mut held, sock);
            }
            self.scratch();
            let qpn = self.qpn;
            let (first, failed) =
                held.take_for(self.sock, |q| q != qpn, &mut self.bytes, &mut self.msgs);
            self.port
                .counters
                .add(&self.port.counters.tx_errors, failed);
            self.msgs.rotate_right(first);
            self.transmit();
            return;
        }
        self.transmit();
    }

    /// Sends what is encoded, as it is.
    fn transmit(&mut self) {
        if self.msgs.is_empty() {
            return;
        }
        #[cfg(all(target_os = "linux", not(ibal_loom)))]
        if self.msgs.len() > 1 && self.port.gso.load(Ordering::Relaxed) {
            self.transmit_gso();
            self.msgs.clear();
            self.bytes.clear();
            return;
        }
        let c = &self.port.counters;
        #[cfg_attr(ibal_loom, allow(unused_mut))]
        let mut sent = 0;
        // One packet (an ACK, a ping-pong's SEND) goes by `send_to` below:
        // `sendmmsg` would only add the four header vectors' allocations.
        #[cfg(all(target_os = "linux", not(ibal_loom)))]
        if self.msgs.len() > 1 {
            use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
            let addrs: Vec<SocketAddrAny> =
                self.msgs.iter().map(|m| SocketAddrAny::from(m.0)).collect();
            let iovs: Vec<[std::io::IoSlice<'_>; 1]> = self
                .msgs
                .iter()
                .map(|&(_, at, n)| [std::io::IoSlice::new(&self.bytes[at..at + n])])
                .collect();
            let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = (0..self.msgs.len())
                .map(|_| SendAncillaryBuffer::default())
                .collect();
            let mut hdrs: Vec<MMsgHdr<'_>> = addrs
                .iter()
                .zip(&iovs)
                .zip(controls.iter_mut())
                .map(|((a, iov), ctl)| MMsgHdr::new_with_addr(a, iov, ctl))
                .collect();
            // A short count means the rest could not go now (a full socket
            // buffer): they are sent one by one below, as before.
            while sent < hdrs.len() {
                match sendmmsg(self.socket, &mut hdrs[sent..], SendFlags::empty()) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => sent += k,
                }
            }
        }
        for &(_, _, n) in &self.msgs[..sent] {
            c.add(&c.tx_packets, 1);
            c.add(&c.tx_bytes, n as u64);
        }
        for &(to, at, n) in &self.msgs[sent..] {
            match send_one(self.socket, &self.bytes[at..at + n], to) {
                Ok(_) => {
                    c.add(&c.tx_packets, 1);
                    c.add(&c.tx_bytes, n as u64);
                }
                Err(e) => {
                    c.add(&c.tx_errors, 1);
                    crate::trace::send_failed(to, &e);
                }
            }
        }
        self.msgs.clear();
        self.bytes.clear();
    }
}

#[cfg(all(target_os = "linux", not(ibal_loom)))]
impl TxBatch<'_> {
    /// Sends what is encoded as GSO super-datagrams where packets run to
    /// one peer (`gso::plan`), each segment's ICRC moved to the
    /// identification the kernel will give it, with as few `sendmmsg`
    /// calls as the kernel takes. A super-datagram the kernel refuses goes
    /// packet by packet, its ICRCs moved back, and if the refusal is for
    /// good the port stops using GSO.
    fn transmit_gso(&mut self) {
        let mut scratch = GSO_SCRATCH.with(|s| s.take());
        let GsoScratch { icrcs, plan } = &mut scratch;
        gso::plan(&self.msgs, plan);
        for m in plan.iter() {
            icrcs.for_segments(&mut self.bytes, m);
        }
        let c = &self.port.counters;
        let mut i = 0;
        while i < plan.len() {
            match gso::send_messages(self.socket, &self.bytes, &plan[i..]) {
                Ok(k) if k > 0 => {
                    for m in &plan[i..(i + k).min(plan.len())] {
                        c.add(&c.tx_packets, m.segments as u64);
                        c.add(&c.tx_bytes, m.len as u64);
                        if m.segments > 1 {
                            c.add(&c.tx_gso_sends, 1);
                            c.add(&c.tx_gso_segments, m.segments as u64);
                        }
                    }
                    i += k;
                }
                r => {
                    let m = plan[i];
                    if m.segments > 1 {
                        icrcs.for_alone(&mut self.bytes, &m);
                        if let Err(e) = &r {
                            if gso::is_refusal(e) && self.port.gso.swap(false, Ordering::Relaxed) {
                                crate::trace::gso_refused(self.port.num, m.to, e);
                            }
                        }
                        c.add(&c.tx_gso_refused, 1);
                    }
                    self.send_alone(&m);
                    i += 1;
                }
            }
        }
        GSO_SCRATCH.with(|s| s.replace(scratch));
    }

    /// Sends the packets of `m` one datagram each.
    fn send_alone(&self, m: &gso::Message) {
        let c = &self.port.counters;
        let (mut at, end) = (m.start, m.start + m.len);
        while at < end {
            let n = m.seg.min(end - at);
            match send_one(self.socket, &self.bytes[at..at + n], m.to) {
                Ok(_) => {
                    c.add(&c.tx_packets, 1);
                    c.add(&c.tx_bytes, n as u64);
                }
                Err(e) => {
                    c.add(&c.tx_errors, 1);
                    crate::trace::send_failed(m.to, &e);
                }
            }
            at += n;
        }
    }
}

/// A sending thread's GSO plan and ICRC patches, reused batch after batch.
#[cfg(all(target_os = "linux", not(ibal_loom)))]
#[derive(Default)]
struct GsoScratch {
    icrcs: gso::SegmentIcrcs,
    plan: Vec<gso::Message>,
}

#[cfg(all(target_os = "linux", not(ibal_loom)))]
al::thread_local_value! {
    static GSO_SCRATCH: std::cell::RefCell<GsoScratch> = std::cell::RefCell::new(GsoScratch::default());
}

/// One datagram to `to`. On Linux a plain `sendto` system call (rustix):
/// glibc's wrapper, which `std` calls, also marks a thread-cancellation
/// point around it, a cost on every packet this provider sends alone.
fn send_one(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) -> std::io::Result<usize> {
    #[cfg(all(target_os = "linux", not(ibal_loom)))]
    return rustix::net::sendto(socket, bytes, rustix::net::SendFlags::empty(), &to)
        .map_err(std::io::Error::from);
    #[cfg(any(not(target_os = "linux"), ibal_loom))]
    socket.send_to(bytes, to)
}

impl Drop for TxBatch<'_> {
    fn drop(&mut self) {
        if self.bytes.capacity() == 0 && self.msgs.capacity() == 0 {
            return; // nothing was encoded (an ACK held, a drive with nothing to send)
        }
        self.flush();
        let (bytes, msgs) = (
            std::mem::take(&mut self.bytes),
            std::mem::take(&mut self.msgs),
        );
        // Give the buffers back for the thread's next batch (a nested
        // batch, if any, keeps its own).
        let _ = TX_SCRATCH.try_with(|cell| {
            if let Ok(mut slot) = cell.try_borrow_mut() {
                if slot.0.capacity() < bytes.capacity() {
                    *slot = (bytes, msgs);
                }
            }
        });
    }
}

impl PortShared {
    /// A batch of packets leaving from the source port QP `qpn` uses:
    /// encoded as they are pushed, sent with one `sendmmsg` per
    /// [`TX_BATCH`] packets (and at [`TxBatch::flush`] or drop).
    pub(crate) fn batch(&self, qpn: u32) -> TxBatch<'_> {
        let sock = match self.tx.len() {
            0 => 0,
            n => qpn as usize % n,
        };
        self.batch_on(sock, qpn)
    }

    /// A batch on send socket `sock` (an index `batch` gave).
    fn batch_on(&self, sock: usize, qpn: u32) -> TxBatch<'_> {
        let (socket, from) = match self.tx.get(sock) {
            Some((s, a)) => (s, *a),
            None => (&self.socket, self.local),
        };
        TxBatch {
            port: self,
            socket,
            sock,
            qpn,
            from,
            bytes: Vec::new(),
            msgs: Vec::new(),
        }
    }

    /// Sends every ACK held on this port (`HeldAcks`).
    pub(crate) fn flush_held(&self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = self.held.lock();
        for sock in held.sockets() {
            self.send_held_on(&mut held, sock);
        }
    }

    /// Sends the ACKs held for send socket `sock`, the list locked (they
    /// have left before anyone sees them gone: `HeldList`).
    fn send_held_on(&self, held: &mut HeldList<'_>, sock: usize) {
        let mut b = self.batch_on(sock, u32::MAX);
        b.scratch();
        let (_, failed) = held.take_for(sock, |_| true, &mut b.bytes, &mut b.msgs);
        self.counters.add(&self.counters.tx_errors, failed);
        b.transmit();
    }
}
