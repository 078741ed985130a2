//! The checks behind the fuzz targets in `fuzz/`.
//!
//! They live here, not in `fuzz/`, so that `cargo test` on stable replays
//! every committed corpus entry and crash artifact through the very same code
//! (`tests/fuzz_corpus.rs`), without libFuzzer. Each function panics when an
//! invariant breaks: that is how a fuzzer learns of a bug.

use std::collections::BTreeMap;

use al::{Error, HandleTable, Kind, RawHandle, TableLimits};
use cep::wire;

use al::sync::Arc;

/// `mad_codec`: any bytes either fail to decode or decode to a message that
/// re-encodes to the same defined bits and decodes back to itself.
pub fn mad_codec(data: &[u8]) {
    // Exercise both the exact-length path and whatever length we were given.
    let mut mad = [0u8; wire::MAD_LEN];
    let n = data.len().min(wire::MAD_LEN);
    mad[..n].copy_from_slice(&data[..n]);
    for candidate in [data, &mad[..]] {
        let Ok(decoded) = wire::decode(candidate) else {
            continue;
        };
        let encoded = wire::encode(&decoded).expect("a decoded MAD must re-encode");
        assert_eq!(
            wire::validate(&decoded),
            Ok(()),
            "validate refused what encode took"
        );
        let again = wire::decode(&encoded).expect("a re-encoded MAD must decode");
        assert_eq!(again, decoded, "decode(encode(x)) != x");
        let mask = wire::defined_bits_mask(decoded.message.attribute_id())
            .expect("a decoded attribute has a mask");
        for i in 0..wire::MAD_LEN {
            assert_eq!(
                encoded[i] & mask[i],
                candidate[i] & mask[i],
                "defined bits of byte {i} changed in a round trip"
            );
        }
    }
}

/// `ib_capture`: any bytes, read as an ERF capture and as one InfiniBand
/// packet, either fail cleanly or give packets that re-encode to bytes that
/// decode back to the same packet (reserved bits, which decoding drops, are
/// the only bytes allowed to change).
pub fn ib_capture(data: &[u8]) {
    use ibal::verbs::erf;
    use ibal::verbs::packet::UdPacket;

    fn packet(bytes: &[u8]) {
        let Ok(p) = UdPacket::decode(bytes) else {
            return;
        };
        let encoded = p.encode().expect("a decoded packet must re-encode");
        assert_eq!(encoded.len(), bytes.len(), "re-encoding changed the length");
        let again = UdPacket::decode(&encoded).expect("a re-encoded packet must decode");
        assert_eq!(again, p, "decode(encode(p)) != p");
    }

    packet(data);
    // The same bytes with their CRCs made right, so that every header check
    // behind the CRCs sees arbitrary headers too.
    let mut sealed = data.to_vec();
    if ibal::verbs::packet::refresh_crcs(&mut sealed).is_ok() {
        packet(&sealed);
    }
    if let Ok(records) = erf::read(data) {
        let mut w = erf::ErfWriter::new(Vec::new());
        for r in &records {
            packet(&r.data);
            w.write(r.at, &r.data).expect("a read record must re-write");
        }
        let again = erf::read(&w.finish().expect("writing to a Vec"))
            .expect("a re-written capture must read");
        assert_eq!(again.len(), records.len(), "records lost in a round trip");
        for (a, b) in again.iter().zip(&records) {
            assert_eq!(a.data, b.data, "record data changed in a round trip");
            let drift = a.at.abs_diff(b.at);
            assert!(
                drift < std::time::Duration::from_nanos(2),
                "timestamp drifted {drift:?}"
            );
        }
    }
}

/// `handle_table`: interpret bytes as operations on a small table and check
/// every answer against a map model.
///
/// Each operation is two bytes: an opcode and an argument (which issued
/// handle it names, or the low bits of a forged handle).
pub fn handle_table(data: &[u8]) {
    let table = HandleTable::with_limits(
        Kind::custom(18),
        TableLimits {
            max_slots: 6,
            max_generation: 4,
        },
    );
    let mut issued: Vec<(RawHandle, u32)> = Vec::new();
    let mut live: BTreeMap<RawHandle, u32> = BTreeMap::new();
    let mut held = Vec::new();
    let mut next = 0u32;
    for op in data.chunks_exact(2) {
        let (code, arg) = (op[0] % 6, op[1] as usize);
        let pick = |issued: &Vec<(RawHandle, u32)>| {
            (!issued.is_empty()).then(|| issued[arg % issued.len()])
        };
        match code {
            0 => {
                next += 1;
                match table.insert(Arc::new(next)) {
                    Ok(h) => {
                        assert!(
                            issued.iter().all(|(o, _)| *o != h),
                            "handle {h:?} issued twice"
                        );
                        issued.push((h, next));
                        live.insert(h, next);
                    }
                    Err(Error::InsufficientResources(_)) => assert_eq!(table.allocated(), 6),
                    Err(e) => panic!("insert: unexpected {e}"),
                }
            }
            1 => {
                if let Some((h, v)) = pick(&issued) {
                    match table.get(h) {
                        Ok(r) => assert_eq!((*r, live.get(&h)), (v, Some(&v))),
                        Err(_) => assert!(!live.contains_key(&h), "live handle failed to resolve"),
                    }
                }
            }
            2 => {
                if let Some((h, v)) = pick(&issued) {
                    match table.remove(h) {
                        Ok(owned) => assert_eq!((*owned, live.remove(&h)), (v, Some(v))),
                        Err(_) => assert!(!live.contains_key(&h), "live handle failed to remove"),
                    }
                }
            }
            3 => {
                if let Some((h, v)) = pick(&issued) {
                    if let Ok(r) = table.get(h) {
                        held.push((r, v));
                    }
                }
            }
            4 => {
                if !held.is_empty() {
                    let (r, v) = held.swap_remove(arg % held.len());
                    assert_eq!(*r, v, "a held reference changed under us");
                }
            }
            _ => {
                // A forged handle: the right kind with arbitrary generation
                // and index bits, which must resolve only to a live object.
                let raw = RawHandle::new(Kind::custom(18), (arg >> 4) as u32, (arg & 0xf) as u32);
                if let Ok(r) = table.get(raw) {
                    assert_eq!(
                        live.get(&raw),
                        Some(&*r),
                        "forged handle resolved to a dead object"
                    );
                }
            }
        }
    }
    drop(held);
    assert_eq!(table.occupied(), live.len(), "slots leaked");
}

/// `cm_protocol`: arbitrary sequences of received MADs (delivered, dropped,
/// duplicated, reordered, or made up from the input), user calls and clock
/// steps on two sans-IO CM endpoints. After every step both endpoints'
/// invariants must hold and every MAD they emit must encode; at the end,
/// once every CEP is destroyed and the clock has run past every timer,
/// neither endpoint may hold a connection or a comm id.
pub fn cm_protocol(data: &[u8]) {
    use cep::proto::{ConnId, ConnectParams, Endpoint, EndpointConfig, Event, Nanos, PeerAddr};
    use cep::wire::{CmMad, PathInfo, RejectReason, Rep, Req};

    const SERVICE: u64 = 0x1000_0000_0000_0001;
    let addrs = [
        PeerAddr {
            lid: 1,
            gid: [1; 16],
        },
        PeerAddr {
            lid: 2,
            gid: [2; 16],
        },
    ];
    let mut eps = [
        Endpoint::new(EndpointConfig::new(0xa000)),
        Endpoint::new(EndpointConfig::new(0xb000)),
    ];
    // MADs in flight: (destination endpoint, source address, MAD).
    let mut wire: Vec<(usize, PeerAddr, CmMad)> = Vec::new();
    // CEPs each side has heard of (from its own calls and its events).
    let mut known: [Vec<ConnId>; 2] = [Vec::new(), Vec::new()];
    let mut released: [Vec<ConnId>; 2] = [Vec::new(), Vec::new()];
    let mut now = Nanos(0);
    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next();

    fn drain(
        side: usize,
        ep: &mut Endpoint,
        addrs: &[PeerAddr; 2],
        wire: &mut Vec<(usize, PeerAddr, CmMad)>,
        known: &mut [Vec<ConnId>; 2],
        released: &mut [Vec<ConnId>; 2],
    ) {
        ep.check_invariants()
            .unwrap_or_else(|e| panic!("endpoint {side}: {e}"));
        while let Some(t) = ep.poll_transmit() {
            t.mad.encode().expect("an emitted MAD must encode");
            let to = addrs.iter().position(|a| *a == t.to).unwrap_or(1 - side);
            wire.push((to, addrs[side], t.mad));
        }
        while let Some(ev) = ep.poll_event() {
            let conn = ev.conn();
            assert!(
                !released[side].contains(&conn),
                "endpoint {side}: event after Released: {ev:?}"
            );
            if let Event::Released { .. } = ev {
                released[side].push(conn);
                known[side].retain(|c| *c != conn);
            } else if !known[side].contains(&conn) {
                known[side].push(conn);
            }
        }
    }

    let req_for = |qpn: u32, psn: u32, retries: u8| Req {
        service_id: SERVICE,
        local_qpn: qpn & 0xff_ffff,
        local_qkey: 0x1111,
        starting_psn: psn & 0xff_ffff,
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: 10,
        local_cm_response_timeout: 10,
        max_cm_retries: retries & 0xf,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 5,
        primary_path: PathInfo {
            local_lid: 1,
            remote_lid: 2,
            local_ack_timeout: 12,
            ..PathInfo::default()
        },
        ..Req::default()
    };

    let mut steps = 0;
    while let Some(op) = next() {
        steps += 1;
        if steps > 400 {
            break;
        }
        let side = (op & 1) as usize;
        let arg = next().unwrap_or(0);
        let pick = |known: &[Vec<ConnId>; 2]| {
            (!known[side].is_empty()).then(|| known[side][arg as usize % known[side].len()])
        };
        let ep = &mut eps[side];
        match (op >> 1) % 16 {
            0 => {
                if let Ok(l) = ep.listen(SERVICE) {
                    known[side].push(l);
                }
            }
            1 => {
                let params = ConnectParams::new(
                    addrs[1 - side],
                    req_for(0x100 + arg as u32, arg as u32 * 7, arg % 4),
                );
                if let Ok(c) = ep.connect(now, params) {
                    known[side].push(c);
                }
            }
            2 => {
                if let Some(c) = pick(&known) {
                    let rep = Rep {
                        local_qpn: 0x200 + arg as u32,
                        starting_psn: arg as u32,
                        responder_resources: 4,
                        initiator_depth: 4,
                        target_ack_delay: 8,
                        rnr_retry_count: 7,
                        ..Rep::default()
                    };
                    let _ = ep.accept(now, c, rep);
                }
            }
            3 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.reject(now, c, RejectReason::ConsumerReject, &[], b"no");
                }
            }
            4 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.send_mra(now, c, arg % 32, &[]);
                }
            }
            5 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.send_rtu(c, &[]);
                }
            }
            6 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.established(c);
                }
            }
            7 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.disconnect(now, c, &[]);
                }
            }
            8 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.disconnect_reply(now, c, &[]);
                }
            }
            9 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.destroy(now, c);
                }
            }
            10 => {
                if let Some(c) = pick(&known) {
                    let _ = ep.cancel_listen(c);
                }
            }
            11 | 12 => {
                // Deliver (11) or duplicate-and-deliver (12) one queued MAD.
                if !wire.is_empty() {
                    let i = arg as usize % wire.len();
                    let (to, from, mad) = if op >> 1 & 1 == 0 {
                        wire[i]
                    } else {
                        wire.remove(i)
                    };
                    eps[to].handle_mad(now, from, mad);
                    let (k, r) = (&mut known, &mut released);
                    drain(to, &mut eps[to], &addrs, &mut wire, k, r);
                }
            }
            13 => {
                // Drop one queued MAD.
                if !wire.is_empty() {
                    let i = arg as usize % wire.len();
                    wire.remove(i);
                }
            }
            14 => {
                // A MAD made up from the input, or a queued one with a
                // corrupted byte, delivered as raw bytes.
                let mut raw = match wire.first() {
                    Some((_, _, mad)) if arg & 1 == 0 => mad.encode().unwrap_or([0; 256]),
                    _ => [0u8; 256],
                };
                for b in raw.iter_mut().skip(24).take(arg as usize % 64) {
                    *b = next().unwrap_or(0);
                }
                let at = 24 + arg as usize % 232;
                raw[at] ^= next().unwrap_or(1);
                let _ = ep.handle_datagram(now, addrs[1 - side], &raw);
            }
            _ => {
                // Advance the clock by up to ~2^arg ns and fire timers.
                now = Nanos(now.0.saturating_add(1u64 << (arg % 40)));
                for ep in eps.iter_mut() {
                    ep.handle_timeout(now);
                }
            }
        }
        for (s, ep) in eps.iter_mut().enumerate() {
            drain(s, ep, &addrs, &mut wire, &mut known, &mut released);
        }
    }

    // Wind down: destroy every CEP, deliver what is in flight, and run the
    // clock until no timer is left. Then nothing may remain.
    for round in 0..200 {
        for s in 0..2 {
            for c in known[s].clone() {
                let _ = eps[s].destroy(now, c);
            }
            let (k, r) = (&mut known, &mut released);
            drain(s, &mut eps[s], &addrs, &mut wire, k, r);
        }
        for (to, from, mad) in std::mem::take(&mut wire) {
            eps[to].handle_mad(now, from, mad);
        }
        let next_timer = eps.iter().filter_map(|e| e.next_timeout()).min();
        match next_timer {
            Some(t) => now = Nanos(t.0.max(now.0)),
            None if wire.is_empty() && known.iter().all(|k| k.is_empty()) => break,
            None => {}
        }
        for ep in eps.iter_mut() {
            ep.handle_timeout(now);
        }
        assert!(round < 199, "the endpoints did not wind down");
    }
    for (s, ep) in eps.iter().enumerate() {
        assert_eq!(ep.live_connections(), 0, "endpoint {s} kept a connection");
        assert_eq!(ep.allocated_ids(), 0, "endpoint {s} kept a comm id");
    }
}

/// `al_api`: a bounded sequence of access-layer and CM calls (open/close
/// AL, open/close CA, PD, CQ, QP, MR, listen, connect, accept, reject, MRA,
/// RTU, disconnect, destroy) across two soft HCAs whose CM traffic is
/// dropped, duplicated, reordered and delayed, driven by one thread; the
/// CM agents run on their own threads. Panics when a call fails with an
/// error it does not document ([`crate::stress::Op::allows`]) or panics,
/// when a CEP gets an event after `Released`, when a destroy callback does
/// not run exactly once, or when, after every AL is closed, any object is
/// left live or a CM agent is still running.
///
/// Input: byte 0 sets the fault probabilities (2 bits each: drop,
/// duplicate, reorder, delay, in steps of 5%), byte 1 the fault seed; then
/// (operation, argument) byte pairs, at most [`AL_API_MAX_OPS`] of them.
/// The operation byte modulo 24 is the call, divided by 24 it picks the AL.
pub fn al_api(data: &[u8]) {
    use std::sync::{Arc as StdArc, Mutex as StdMutex};
    use std::time::{Duration, Instant};

    use crate::stress::{self, Checker, Op};
    use al::{Al, AlInstance, Handle};
    use cep::cm::{self, AcceptReply, Cep, CmHandler, ConnectRequest, Listen, ListenHandler};
    use cep::proto::Event;
    use cep::wire::RejectReason;
    use hca::provider::{Access, QpType};
    use hca::verbs::{self, Ca, Cq, Mr, Pd};
    use hca::RegisteredBuffer;
    use ibal::verbs::{FaultConfig, SoftProvider};
    use qp::{create_qp, Qp, QpCreate};

    // The agents are process-wide (one per device port): one input at a time,
    // so the final `active_ports` check sees only this input's agents.
    static SERIAL: StdMutex<()> = StdMutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());

    #[derive(Default)]
    struct Known {
        cas: Vec<(Handle<Ca>, usize)>,
        pds: Vec<(Handle<Pd>, Handle<Ca>)>,
        cqs: Vec<(Handle<Cq>, Handle<Ca>)>,
        qps: Vec<(Handle<Qp>, usize)>,
        mrs: Vec<Handle<Mr>>,
        listens: Vec<Handle<Listen>>,
        ceps: Vec<Handle<Cep>>,
        /// Passive CEPs from the listen callback, with their HCA.
        pending: Vec<(Handle<Cep>, usize)>,
        /// CEPs that got a REP (rtu candidates) and a DREQ (DREP candidates).
        replied: Vec<Handle<Cep>>,
        dreqs: Vec<Handle<Cep>>,
    }
    struct Ctx {
        inst: StdArc<AlInstance>,
        checker: StdArc<Checker>,
        known: StdMutex<Known>,
    }
    impl Ctx {
        fn known(&self) -> std::sync::MutexGuard<'_, Known> {
            self.known.lock().unwrap_or_else(|p| p.into_inner())
        }
    }
    fn cep_handler(ctx: &StdArc<Ctx>) -> CmHandler {
        let ctx = ctx.clone();
        StdArc::new(move |cep, ev| {
            ctx.checker.note_event(cep, ev);
            if std::env::var_os("IBAL_AL_API_TRACE").is_some() {
                eprintln!("al_api: {cep}: {}", ev.name());
            }
            match ev {
                Event::ReplyReceived { .. } => ctx.known().replied.push(cep),
                Event::DisconnectRequest { .. } => ctx.known().dreqs.push(cep),
                _ => {}
            }
            EVENTS.fetch_add(1, std::sync::atomic::Ordering::Release);
        })
    }
    fn listen_handler(ctx: &StdArc<Ctx>, hca: usize) -> ListenHandler {
        let ctx = ctx.clone();
        StdArc::new(move |_l, cep, ev| {
            ctx.checker.note_event(cep, ev);
            if std::env::var_os("IBAL_AL_API_TRACE").is_some() {
                eprintln!("al_api: {cep}: {} (listen)", ev.name());
            }
            ctx.known().pending.push((cep, hca));
            EVENTS.fetch_add(1, std::sync::atomic::Ordering::Release);
        })
    }
    fn pick<T: Copy>(v: &[T], arg: u8) -> Option<T> {
        (!v.is_empty()).then(|| v[arg as usize % v.len()])
    }
    static EVENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    let (b0, seed) = (
        data.first().copied().unwrap_or(0),
        data.get(1).copied().unwrap_or(0),
    );
    let p = |shift: u8| f64::from((b0 >> shift) & 3) * 0.05;
    let fabric = stress::fabric(2, None);
    fabric.set_faults(Some(FaultConfig {
        seed: u64::from(seed),
        drop: p(0),
        duplicate: p(2),
        reorder: p(4),
        delay: p(6),
        max_delay: 3,
    }));
    let provider = SoftProvider::new(fabric.clone());
    let checker = Checker::new(u64::from(seed));
    let ports_before = cm::active_ports();
    let mut als: Vec<(Al, StdArc<Ctx>)> = Vec::new();
    // Waiting (op 21) is bounded per input, so an input stays short.
    let mut wait_budget = Duration::from_millis(60);
    let all = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);

    for op in data.get(2..).unwrap_or(&[]).chunks(2).take(AL_API_MAX_OPS) {
        let (code, arg) = (op[0] % 24, op.get(1).copied().unwrap_or(0));
        if code == 0 {
            if als.len() < 2 {
                let r = Al::open();
                checker.outcome(Op::OpenAl, &r);
                if let Ok(al) = r {
                    let ctx = StdArc::new(Ctx {
                        inst: al.instance().clone(),
                        checker: checker.clone(),
                        known: StdMutex::new(Known::default()),
                    });
                    als.push((al, ctx));
                }
            }
            continue;
        }
        if als.is_empty() {
            continue;
        }
        let which = (op[0] / 24) as usize % als.len();
        let ctx = als[which].1.clone();
        let inst = &ctx.inst;
        let c = &checker;
        match code {
            1 => {
                let (al, _) = als.swap_remove(which);
                checker.close_al(al, arg & 1 == 0, Duration::from_secs(5));
            }
            2 => {
                let hca = arg as usize % 2;
                let r = verbs::open_ca(inst, &provider, stress::node_guid(hca));
                c.outcome(Op::OpenCa, &r);
                if let Ok(ca) = r {
                    ctx.known().cas.push((ca, hca));
                    if arg & 2 == 0 {
                        c.outcome(Op::AttachCm, &cm::attach_ca(inst, ca));
                    }
                }
            }
            3 => {
                let picked = pick(&ctx.known().cas, arg);
                if let Some((ca, _)) = picked {
                    c.outcome(Op::CloseCa, &c.destroy(inst, ca));
                }
            }
            4 => {
                let picked = pick(&ctx.known().cas, arg);
                if let Some((ca, _)) = picked {
                    let r = verbs::alloc_pd(inst, ca);
                    c.outcome(Op::AllocPd, &r);
                    if let Ok(pd) = r {
                        ctx.known().pds.push((pd, ca));
                    }
                }
            }
            5 => {
                let picked = pick(&ctx.known().cas, arg);
                if let Some((ca, _)) = picked {
                    let r = verbs::create_cq(inst, ca, 16, None, None);
                    c.outcome(Op::CreateCq, &r);
                    if let Ok(cq) = r {
                        ctx.known().cqs.push((cq, ca));
                    }
                }
            }
            6 => {
                let (pd, cq, hca) = {
                    let k = ctx.known();
                    let Some((pd, ca)) = pick(&k.pds, arg) else {
                        continue;
                    };
                    let on: Vec<_> = k.cqs.iter().filter(|x| x.1 == ca).map(|x| x.0).collect();
                    let Some(cq) = pick(&on, arg >> 3) else {
                        continue;
                    };
                    let hca = k.cas.iter().find(|x| x.0 == ca).map_or(0, |x| x.1);
                    (pd, cq, hca)
                };
                let qp_type = if arg & 0x80 != 0 {
                    QpType::Ud
                } else {
                    QpType::Rc
                };
                let r = create_qp(inst, pd, QpCreate::new(qp_type, cq));
                c.outcome(Op::CreateQp, &r);
                if let Ok(qp) = r {
                    ctx.known().qps.push((qp, hca));
                }
            }
            7 => {
                let picked = pick(&ctx.known().qps, arg);
                if let Some((qp, _)) = picked {
                    c.outcome(Op::DestroyQp, &c.destroy(inst, qp));
                }
            }
            8 => {
                let picked = pick(&ctx.known().pds, arg);
                if let Some((pd, _)) = picked {
                    let buf = RegisteredBuffer::new(256);
                    let r = verbs::register_mr(inst, pd, &buf, 0, 256, 0, all);
                    c.outcome(Op::RegisterMr, &r);
                    if let Ok(mr) = r {
                        ctx.known().mrs.push(mr);
                    }
                }
            }
            9 => {
                let k = ctx.known();
                let (mr, pd, cq) = (pick(&k.mrs, arg), pick(&k.pds, arg), pick(&k.cqs, arg));
                drop(k);
                match arg % 3 {
                    0 => {
                        if let Some(mr) = mr {
                            c.outcome(Op::DestroyMr, &c.destroy(inst, mr));
                        }
                    }
                    1 => {
                        if let Some((pd, _)) = pd {
                            c.outcome(Op::DestroyPd, &c.destroy(inst, pd));
                        }
                    }
                    _ => {
                        if let Some((cq, _)) = cq {
                            c.outcome(Op::DestroyCq, &c.destroy(inst, cq));
                        }
                    }
                }
            }
            10 => {
                let picked = pick(&ctx.known().cas, arg);
                if let Some((ca, hca)) = picked {
                    let service = stress::service_id(hca, u64::from(arg >> 4) % 2);
                    let (on_req, handler) = (listen_handler(&ctx, hca), cep_handler(&ctx));
                    let r = cm::listen(inst, ca, 1, service, on_req, handler);
                    c.outcome(Op::Listen, &r);
                    if let Ok(l) = r {
                        ctx.known().listens.push(l);
                    }
                }
            }
            11 => {
                let picked = pick(&ctx.known().listens, arg);
                if let Some(l) = picked {
                    c.outcome(Op::DestroyListen, &c.destroy(inst, l));
                }
            }
            12 => {
                let picked = pick(&ctx.known().qps, arg);
                if let Some((qp, _)) = picked {
                    let target = usize::from(arg >> 4) % 2;
                    let mut req = ConnectRequest::new(
                        stress::service_id(target, u64::from(arg >> 5) % 2),
                        stress::lid(target),
                    );
                    req.cm_response_timeout = 7 + (arg >> 6);
                    req.local_ack_timeout = 7 + (arg >> 6);
                    req.max_cm_retries = (arg >> 2) % 3;
                    let r = cm::connect(inst, qp, &req, cep_handler(&ctx));
                    c.outcome(Op::Connect, &r);
                    if let Ok(cep) = r {
                        ctx.known().ceps.push(cep);
                    }
                }
            }
            13 => {
                let (cep, qp) = {
                    let k = ctx.known();
                    let Some((cep, hca)) = pick(&k.pending, arg) else {
                        continue;
                    };
                    let on: Vec<_> = k.qps.iter().filter(|x| x.1 == hca).map(|x| x.0).collect();
                    let Some(qp) = pick(&on, arg >> 4) else {
                        continue;
                    };
                    (cep, qp)
                };
                let r = cm::accept(inst, cep, qp, &AcceptReply::default());
                c.outcome(Op::Accept, &r);
                if r.is_ok() {
                    ctx.known().ceps.push(cep);
                }
            }
            14 | 15 | 17 | 19 => {
                let cep = {
                    let k = ctx.known();
                    let passive: Vec<_> = k.pending.iter().map(|x| x.0).collect();
                    if arg & 1 == 0 && !passive.is_empty() {
                        pick(&passive, arg >> 1)
                    } else {
                        pick(&k.ceps, arg >> 1)
                    }
                };
                let Some(cep) = cep else { continue };
                match code {
                    14 => c.outcome(
                        Op::Reject,
                        &cm::reject(inst, cep, RejectReason::ConsumerReject, b"fuzz"),
                    ),
                    15 => c.outcome(Op::Mra, &cm::mra(inst, cep, arg % 16, &[])),
                    17 => c.outcome(Op::Disconnect, &cm::disconnect(inst, cep, &[])),
                    _ => c.outcome(Op::DestroyCep, &c.destroy(inst, cep)),
                };
            }
            16 | 18 => {
                let cep = {
                    let k = ctx.known();
                    let list = if code == 16 { &k.replied } else { &k.dreqs };
                    pick(list, arg).or_else(|| pick(&k.ceps, arg))
                };
                let Some(cep) = cep else { continue };
                if code == 16 {
                    c.outcome(Op::Rtu, &cm::rtu(inst, cep, &[]));
                } else {
                    c.outcome(Op::DisconnectReply, &cm::disconnect_reply(inst, cep, &[]));
                }
            }
            20 => {
                for _ in 0..=arg % 8 {
                    fabric.progress();
                }
            }
            21 => {
                // Let the agents work: tick the fabric until an event arrives
                // or a few ms pass (bounded by the input's wait budget).
                let limit = Duration::from_micros(500 * (1 + u64::from(arg % 8))).min(wait_budget);
                let (start, seen) = (
                    Instant::now(),
                    EVENTS.load(std::sync::atomic::Ordering::Acquire),
                );
                while start.elapsed() < limit {
                    fabric.progress();
                    if EVENTS.load(std::sync::atomic::Ordering::Acquire) != seen && arg & 0x80 == 0
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                wait_budget = wait_budget.saturating_sub(start.elapsed());
            }
            22 => {
                // Another instance's handles are InvalidHandle here.
                let other = als[(which + 1) % als.len()].1.clone();
                let (cep, qp) = {
                    let k = other.known();
                    (pick(&k.ceps, arg), pick(&k.qps, arg))
                };
                if let (false, Some(cep)) = (StdArc::ptr_eq(&other, &ctx), cep) {
                    let r = cm::disconnect(inst, cep, &[]);
                    assert!(
                        matches!(r, Err(al::Error::InvalidHandle { .. })),
                        "another AL's CEP handle gave {r:?}"
                    );
                }
                if let (false, Some((qp, _))) = (StdArc::ptr_eq(&other, &ctx), qp) {
                    let r = inst.destroy(qp, None);
                    assert!(
                        matches!(r, Err(al::Error::InvalidHandle { .. })),
                        "another AL's QP handle gave {r:?}"
                    );
                }
            }
            _ => {
                // Attach the CM (again) to a CA.
                let picked = pick(&ctx.known().cas, arg);
                if let Some((ca, _)) = picked {
                    c.outcome(Op::AttachCm, &cm::attach_ca(inst, ca));
                }
            }
        }
    }

    // Close every AL (mid-connection, with MADs still queued in the
    // fabric), then everything must be gone.
    for (i, (al, ctx)) in als.into_iter().enumerate() {
        drop(ctx);
        checker.close_al(al, i % 2 == 0, Duration::from_secs(5));
    }
    checker.settle_destroy_callbacks(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
    while cm::active_ports() > ports_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    if cm::active_ports() > ports_before {
        checker.fail(format!(
            "{} CM agents still running after every AL closed",
            cm::active_ports() - ports_before
        ));
    }
    fabric.set_faults(None);
    let failures = checker.failures();
    assert!(
        checker.failure_count() == 0,
        "al_api: {} failures: {failures:#?}",
        checker.failure_count()
    );
}

/// Most (operation, argument) pairs one `al_api` input runs.
pub const AL_API_MAX_OPS: usize = 64;
