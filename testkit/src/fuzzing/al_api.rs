//! `al_api`: bounded sequences of access-layer and CM calls on two soft
//! HCAs with CM faults, checked against what each call documents.

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
    use hca::verbs::{self, Ca, Cq, Mr, Pd};
    use ibal::verbs::{FaultConfig, SoftProvider};
    use provider::RegisteredBuffer;
    use provider::{Access, QpType};
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
