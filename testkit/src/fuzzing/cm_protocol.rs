//! `cm_protocol`: two sans-IO CM endpoints driven by arbitrary MADs, user
//! calls and clock steps.

/// `cm_protocol`: arbitrary sequences of received MADs (delivered, dropped,
/// duplicated, reordered, or made up from the input), user calls and clock
/// steps on two sans-IO CM endpoints with a request window of 2. After
/// every step both endpoints' invariants must hold and every MAD they emit
/// must encode; at the end,
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
    // A request window of 2, so that requests wait in line (and leave it
    // every way there is) in most inputs, not only in bursts of 1,024.
    let paced = |guid| EndpointConfig {
        request_window: 2,
        ..EndpointConfig::new(guid)
    };
    let mut eps = [Endpoint::new(paced(0xa000)), Endpoint::new(paced(0xb000))];
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
