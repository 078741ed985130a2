//! `ibal overview`: what this build contains, a quick self-check, and the
//! commands.

/// Prints the overview.
pub fn run() -> Result<(), String> {
    out!(
        "ibal {} — the InfiniBand Access Layer object model in Rust\n",
        env!("CARGO_PKG_VERSION")
    );
    out!("Layers (each depends only on those above it):");
    out!("  al   handle tables, object lifecycle, AL instances, callback executor");
    out!("  hca  verbs objects and providers (embedded soft HCA; rdma-core behind `rdma`)");
    out!("  qp   queue pairs, IBTA QP state machine, connection-id slot");
    out!("  cep  IBTA connection manager: MAD codec, protocol core, CEPs");
    out!();
    out!("Self-check on this machine:");
    let t0 = std::time::Instant::now();
    let al = ibal::Al::open().map_err(|e| e.to_string())?;
    out!("  opened AL instance {} (handle {})", al.id(), al.handle());
    let stats = al.close().map_err(|e| e.to_string())?;
    out!("  closed it in {:?}: {stats}", t0.elapsed());
    let mad = cep::wire::CmMad::new(0x1234, cep::wire::Rtu::default());
    let bytes = mad.encode().map_err(|e| e.to_string())?;
    let back = cep::wire::decode(&bytes).map_err(|e| e.to_string())?;
    out!(
        "  CM codec: encoded and decoded a {} MAD of {} bytes",
        back.message_kind(),
        bytes.len()
    );
    out!();
    out!("Commands:");
    out!("  ibal [pingpong --loopback] [--iterations N] [--size S] [--json] [--capture FILE]");
    out!("                                                the main job: connect through the CM, WRITE+SEND ping-pong, disconnect, leak check");
    out!("  ibal rping -s|-c -a ADDR [-p PORT] [-C N] [-S SIZE] [-v] [-V]");
    out!("                                                librdmacm's rping exchange over RoCEv2, against Linux's rping or another ibal");
    out!("  ibal pingpong --listen IP[:PORT] | --connect IP[:PORT] [--local IP]");
    out!("                                                the same job between two processes or hosts over RoCEv2 (rdma_cm addressing)");
    out!("  ibal pingpong --device NAME --listen IP[:PORT] | --connect IP[:PORT]");
    out!("                                                the same job on an RDMA device through librdmacm (build with --features rdma)");
    out!("  ibal devinfo [--roce IP[:PORT]]... [--max-qp N] [--json]");
    out!("                                                devices, limits and ports of the soft fabric and RoCEv2 (like ibv_devinfo -v)");
    out!("  ibal perf lookup [--threads N] [--json]       handle resolve cost vs sharded-slab and locked maps");
    out!("  ibal perf write-bw [--sizes 64K,1M] [--json]  RC RDMA WRITE bandwidth vs copy_from_slice");
    out!("  ibal perf send-rate [--msgs N] [--json]       64-byte RC SEND message rate vs std::sync::mpsc");
    out!("  ibal perf send-lat|send-rate|write-bw|conn-rate --device NAME");
    out!("                                                the RoCEv2 benchmarks on an RDMA device, to compare with perftest (--features rdma)");
    out!("  ibal perf conn-rate [--mode M] [--transport soft|udp] [--json]");
    out!("                                                CM connect latency and rate vs a 256-byte MAD round trip (udp: RoCEv2 on lo vs a UDP round trip)");
    out!("  ibal stress --seconds S --threads T [--drop P] [--dup P] [--reorder P] [--transport soft|udp]");
    out!("                                                random API races with CM fault injection (udp: RoCEv2 on lo, no faults); fails on any leak");
    out!("  ibal qp-exchange --listen PORT|--connect HOST --local IP [--mode rc|ud] [--write]");
    out!("                                                two-process ping-pong over RoCEv2; peers may be ibv_rc/ud_pingpong");
    out!("  ibal --help                                   everything else");
    out!();
    out!("Tests: `cargo test`; loom models: `bash loom-tests/run.sh`. See README.md and docs/.");
    Ok(())
}
