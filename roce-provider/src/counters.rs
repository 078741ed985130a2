//! Per-port packet counters.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A snapshot of one port's counters
        /// ([`crate::RoceDevice::port_counters`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct PortCounters {
            $($(#[$doc])* pub $name: u64,)*
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
    /// identification (found by `roce::icrc::solve_ipv4_identification`):
    /// what other senders (Linux rxe) write. Accepted.
    rx_ipv4_id_solved,
    /// Dropped: datagram too short for its headers.
    rx_truncated,
    /// Dropped: datagram longer than any packet of the port's MTU.
    rx_oversized,
    /// Dropped: not a well-formed RoCEv2 packet (unknown opcode,
    /// misaligned, bad pad, ...).
    rx_decode_error,
    /// Dropped: no QP with the destination QPN.
    rx_unknown_qpn,
    /// Dropped: the QP cannot receive in its state, or the opcode does
    /// not belong to its type.
    rx_bad_state_or_opcode,
    /// Dropped: P_Key mismatch.
    rx_bad_pkey,
    /// Dropped: Q_Key mismatch (UD, GSI).
    rx_bad_qkey,
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
);

impl AtomicCounters {
    pub(crate) fn add(&self, c: &AtomicU64, n: u64) {
        let _ = self;
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Add the difference of two transport counter snapshots.
    pub(crate) fn add_transport(
        &self,
        before: &roce_transport::Counters,
        after: &roce_transport::Counters,
    ) {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        self.add(
            &self.rx_bad_state_or_opcode,
            d(before.bad_opcode, after.bad_opcode),
        );
        self.add(&self.rx_bad_pkey, d(before.bad_pkey, after.bad_pkey));
        self.add(&self.rx_bad_qkey, d(before.bad_qkey, after.bad_qkey));
        self.add(
            &self.rx_out_of_sequence,
            d(before.out_of_sequence, after.out_of_sequence),
        );
        self.add(&self.rx_duplicates, d(before.duplicates, after.duplicates));
        self.add(
            &self.rnr_naks_sent,
            d(before.rnr_naks_sent, after.rnr_naks_sent),
        );
        self.add(&self.naks_sent, d(before.naks_sent, after.naks_sent));
        self.add(&self.rx_no_receive, d(before.no_receive, after.no_receive));
        self.add(
            &self.rx_ignored_responses,
            d(before.ignored_responses, after.ignored_responses),
        );
        self.add(&self.retries, d(before.retries, after.retries));
        self.add(&self.rnr_retries, d(before.rnr_retries, after.rnr_retries));
        self.add(
            &self.resources_busy,
            d(before.resources_busy, after.resources_busy),
        );
    }
}
