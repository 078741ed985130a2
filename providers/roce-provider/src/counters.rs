//! Per-port packet counters.

use al::sync::atomic::{AtomicU64, Ordering};

use roce_transport::Discard;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A snapshot of one port's counters
        /// ([`crate::RoceDevice::port_counters`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct PortCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl PortCounters {
            /// Every counter with its name, in declaration order (for
            /// reports: `ibal devinfo --roce ... --json`, the RoCEv2
            /// commands' `--json`).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }

            /// What every counter gained since the snapshot `earlier`
            /// (the counters are monotonic; an earlier snapshot taken
            /// later gives 0, not a wrap).
            pub fn since(&self, earlier: &PortCounters) -> PortCounters {
                PortCounters {
                    $($name: self.$name.saturating_sub(earlier.$name),)*
                }
            }
        }

        #[derive(Debug, Default)]
        pub(crate) struct AtomicCounters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl AtomicCounters {
            pub(crate) fn snapshot(&self) -> PortCounters {
                PortCounters {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counters!(
    /// Datagrams received on the port's socket.
    rx_datagrams,
    /// Packets delivered to a QP's transport.
    rx_packets,
    /// Bytes of the datagrams received.
    rx_bytes,
    /// Packets sent.
    tx_packets,
    /// Bytes sent.
    tx_bytes,
    /// Packets that could not be encoded or sent (no route, address
    /// family mismatch, socket error).
    tx_errors,
    /// Dropped: ICRC mismatch.
    rx_bad_icrc,
    /// IPv4 packets whose ICRC was right only with a non-zero IP
    /// identification (found by
    /// `roce::icrc::solve_ipv4_identification_from`): what other senders
    /// (Linux rxe) write. Accepted.
    rx_ipv4_id_solved,
    /// Dropped: ICRC wrong with identification 0, and the identification
    /// solver was not run: the source is unknown and the port's
    /// first-contact budget spent (`roce_transport::SolverGate`).
    rx_icrc_unsolved,
    /// Dropped: datagram too short for its headers.
    rx_truncated,
    /// Dropped: datagram longer than any packet of the port's MTU.
    rx_oversized,
    /// Dropped: not a well-formed RoCEv2 packet (unknown opcode,
    /// misaligned, bad pad, ...).
    rx_decode_error,
    /// Dropped: no QP with the destination QPN.
    rx_unknown_qpn,
    /// Dropped: the destination QP lives on another port of the device.
    rx_wrong_port,
    /// Dropped: the opcode does not belong to the QP's type.
    rx_bad_opcode,
    /// Dropped: the QP does not receive in its state (RESET, INIT, ERR).
    /// Also counts a packet already in `rx_packets` whose QP was destroyed
    /// or modified before it took the packet.
    rx_bad_state,
    /// Dropped: P_Key mismatch.
    rx_bad_pkey,
    /// Dropped: Q_Key mismatch (UD, GSI).
    rx_bad_qkey,
    /// Dropped: a packet for a connected (RC, UC) QP from an address that
    /// is not its peer's: a stranger's.
    rx_wrong_source,
    /// Dropped: a packet for a connected QP to an address that is not the
    /// QP's own.
    rx_wrong_destination,
    /// Requests outside the PSN window (RC NAKed once per gap; UC dropped).
    rx_out_of_sequence,
    /// Duplicate requests (re-ACKed or replayed).
    rx_duplicates,
    /// Messages dropped for lack of a receive (UC, UD).
    rx_no_receive,
    /// Naps of the port's receive thread: it stepped aside (100 us to
    /// 1.6 ms at a time) because an application busy-polled the device's
    /// CQs and takes the datagrams itself.
    rx_thread_naps,
    /// Returns of the port's receive thread from its blocking receive
    /// (with datagrams, or woken by the device's close). It blocks with no
    /// timeout: on an idle port this stays 0.
    rx_thread_wakeups,
    /// Responses the requester ignored (stale, unexpected, malformed).
    rx_ignored_responses,
    /// NAKs sent other than RNR (includes remote access errors: bad
    /// R_Key or range).
    naks_sent,
    /// RNR NAKs sent.
    rnr_naks_sent,
    /// Transport retries (timeouts, sequence NAKs).
    retries,
    /// RNR retries.
    rnr_retries,
    /// Requests dropped because responder READ/atomic resources were busy.
    resources_busy,
    /// GSO super-datagrams sent (`UDP_SEGMENT`): each carried
    /// `tx_gso_segments / tx_gso_sends` packets on average (all of them
    /// also in `tx_packets`).
    tx_gso_sends,
    /// Packets sent as segments of GSO super-datagrams.
    tx_gso_segments,
    /// GSO super-datagrams the kernel refused (no checksum offload on the
    /// route's device, a segment above the route's MTU, a kernel without
    /// `UDP_SEGMENT`): their packets went one by one, and the port stopped
    /// using GSO.
    tx_gso_refused,
    /// Coalesced buffers received with GRO (`UDP_GRO`): each holds several
    /// packets, which `rx_datagrams` counts one by one.
    rx_gro_buffers,
    /// Packets received inside coalesced GRO buffers.
    rx_gro_segments,
);

impl AtomicCounters {
    /// The counter of datagrams the receive stage drops for `why`.
    pub(crate) fn discarded(&self, why: Discard) -> &AtomicU64 {
        match why {
            Discard::Oversized => &self.rx_oversized,
            Discard::Truncated => &self.rx_truncated,
            Discard::Malformed => &self.rx_decode_error,
            Discard::UnknownQp => &self.rx_unknown_qpn,
            Discard::WrongPort => &self.rx_wrong_port,
            Discard::BadOpcode => &self.rx_bad_opcode,
            Discard::BadState => &self.rx_bad_state,
            Discard::BadPkey => &self.rx_bad_pkey,
            Discard::BadQkey => &self.rx_bad_qkey,
            Discard::WrongSource => &self.rx_wrong_source,
            Discard::WrongDestination => &self.rx_wrong_destination,
            Discard::BadIcrc => &self.rx_bad_icrc,
            Discard::IcrcUnsolved => &self.rx_icrc_unsolved,
        }
    }

    pub(crate) fn add(&self, c: &AtomicU64, n: u64) {
        let _ = self;
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Add what a transport counted since its counters were last taken
    /// (`Transport::take_counters`).
    pub(crate) fn add_transport(&self, gained: &roce_transport::Counters) {
        self.add(&self.rx_bad_opcode, gained.bad_opcode);
        self.add(&self.rx_bad_pkey, gained.bad_pkey);
        self.add(&self.rx_bad_qkey, gained.bad_qkey);
        self.add(&self.rx_out_of_sequence, gained.out_of_sequence);
        self.add(&self.rx_duplicates, gained.duplicates);
        self.add(&self.rnr_naks_sent, gained.rnr_naks_sent);
        self.add(&self.naks_sent, gained.naks_sent);
        self.add(&self.rx_no_receive, gained.no_receive);
        self.add(&self.rx_ignored_responses, gained.ignored_responses);
        self.add(&self.retries, gained.retries);
        self.add(&self.rnr_retries, gained.rnr_retries);
        self.add(&self.resources_busy, gained.resources_busy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_every_field_s_gain_and_never_wraps() {
        let earlier = PortCounters {
            rx_datagrams: 10,
            rx_wrong_source: 3,
            retries: 9,
            ..PortCounters::default()
        };
        let later = PortCounters {
            rx_datagrams: 25,
            rx_wrong_source: 3,
            retries: 4,
            tx_packets: 7,
            ..PortCounters::default()
        };
        let d = later.since(&earlier);
        assert_eq!(
            (d.rx_datagrams, d.rx_wrong_source, d.retries, d.tx_packets),
            (15, 0, 0, 7)
        );
        assert!(later.since(&later).fields().iter().all(|(_, v)| *v == 0));
    }
}
