//! `ibal perf send-lat|send-rate|write-bw --transport udp`: the RoCEv2
//! provider between two ports on loopback (127.0.0.1 and 127.0.0.2, each
//! its own UDP socket), against raw UDP sockets measured in the same run
//! with the same datagram sizes and the same waiting.
//!
//! How each side waits, so the baseline does the same work the same way:
//! the provider's receive threads block in `recv_from` and the benchmark's
//! threads busy-poll their CQs, so the raw UDP baseline also blocks in
//! `recv_from` (a busy-polled socket would compare a thread wake-up
//! against none). Datagram sizes are those the provider puts on the wire:
//! a 64-byte SEND is BTH 12 + 64 + ICRC 4 = 80 bytes of UDP payload; a
//! WRITE packet at MTU 4096 is 4096 + 12 (+ RETH 16 on the first) + 4.
//!
//! * send-lat: 64-byte RC SEND ping-pong, median and mean round trip,
//!   against a raw UDP ping-pong of 80-byte datagrams (target <= 1.5x).
//! * send-rate: 64-byte RC SENDs streamed from A to B (a window of
//!   outstanding sends, receives replenished), messages per second
//!   completed at B, against 80-byte datagrams streamed between two
//!   sockets, received per second, one per system call (target >= 1.0x
//!   since issue 31, 0.5x before); beside it the same datagrams 32 per
//!   `sendmmsg`/`recvmmsg` (the ceiling).
//! * write-bw: RC WRITEs of 64 KiB and 1 MiB at MTU 1024 and 4096,
//!   against the same packets (1040- and 4112-byte datagrams) streamed
//!   one way, payload received per second: plain (target >= 0.7x at MTU
//!   4096) and with GSO+GRO (`offload`: super-datagrams of up to 64
//!   packets, received coalesced; target >= 0.6x at both MTUs, issue 31).
//!
//! Every streamed row records payload Gbit/s, packets per second and
//! process CPU seconds per GiB (`figures`).
//!
//! Two more raw UDP runs are reported for what they explain, not as the
//! targets' baselines: send-lat's ping-pong with a 20-byte datagram each
//! way after the answer (the ACK an RC responder must send), and
//! write-bw's stream doing the user-space work RoCE cannot skip (each
//! packet copied from a message buffer and CRC-32'd by the sender,
//! CRC-32'd and copied into a destination buffer by the receiver).
//!
//! By job: `ends` opens the two ends (our ports on loopback, or an RDMA
//! device's two contexts) and polls them; `lat` is send-lat, `stream` the
//! one-way streams, `offload` the raw UDP ceilings, `figures` what each
//! stream records, `rate` send-rate and `bw` write-bw over them, `device`
//! the same on an RDMA device with no baseline.

mod bw;
mod device;
mod ends;
mod figures;
mod lat;
#[cfg(target_os = "linux")]
mod offload;
#[cfg(not(target_os = "linux"))]
#[path = "offload_none.rs"]
mod offload;
mod rate;
mod stream;

pub use bw::{run_write_bw, BwPoint, BwReport, UdpBwConfig, TARGET_GSO, TARGET_PLAIN};
pub use device::{run_device_send_lat, run_device_send_rate, run_device_write_bw, DeviceReport};
pub use ends::{
    bench_mtu, offload_name, write_datagram, Target, MSG, SEND_DATAGRAM, WRITE_DATAGRAM,
    WRITE_HEADERS,
};
pub(crate) use ends::{udp_pair, Pair};
pub use figures::Figures;
pub(crate) use lat::{pingpong_pair, roce_pingpong_on, udp_pingpong_on};
pub use lat::{run_send_lat, run_send_lat_one_thread, LatReport, OneThreadReport};
pub use offload::{segments_in, segments_per_send, BATCH, MAX_SEGMENTS, MAX_SUPER};
pub use rate::{run_send_rate, RateReport, TARGET as SEND_RATE_TARGET};
