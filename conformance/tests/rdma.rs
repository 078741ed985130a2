//! The conformance suite against real RDMA devices through libibverbs
//! (`rdma-provider`, feature `rdma`), and the rdma-only checks: leases,
//! asynchronous events, teardown that never waits on a provider thread.
//!
//! Side A is `IBAL_RDMA_DEVICE` (a name such as `rxe0`) or the first device
//! listed; side B is `IBAL_RDMA_DEVICE_B`, or A's device opened a second
//! time (two contexts, looping back inside one device, as `ibv_rc_pingpong`
//! does on one host). In the CI's VM (`.ci/rdma-vm.sh`) A is rxe0 on eth0
//! and B rxe1 on eth1, so every packet of the suite crosses a link (the
//! script checks the host saw them). Each side's GID is
//! `IBAL_RDMA_GID_INDEX` or, on an Ethernet port, its first IPv4-mapped
//! GID (RoCEv2 over IPv4), else index 0.
//!
//! With no device, every check passes without running and says so: a
//! `SKIPPED rdma::<check>: <why>` line each and a `SKIPPED: N of N checks`
//! summary on stderr. A device that was asked for and is absent fails.
#![cfg(feature = "rdma")]

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ibal_conformance::{Endpoint, Fixture, Side};
use provider::{Device, LinkLayer, Provider};
use rdma_provider::{DeviceEvent, QpEvent, RdmaDevice, RdmaProvider};

struct RdmaFixture {
    a: RdmaDevice,
    b: RdmaDevice,
    port: u8,
    gid_index: [u8; 2],
    lid_routed: bool,
}

/// The device named by `var`, or, when `var` is unset and `default_first`,
/// the first listed. `Err(why)` when there is none to use; a panic when
/// the device asked for is not there (that is a failure, not a skip).
fn pick_device(
    provider: &RdmaProvider,
    var: &str,
    default_first: bool,
) -> Result<Option<provider::DeviceInfo>, String> {
    let wanted = std::env::var(var).ok();
    let listed = match provider.list() {
        Ok(l) => l,
        Err(e) => {
            assert!(wanted.is_none(), "{var}={wanted:?} asked for, but: {e}");
            return Err(e.to_string());
        }
    };
    match &wanted {
        Some(name) => {
            let found = listed.iter().find(|d| &d.name == name).cloned();
            assert!(found.is_some(), "{var}={name} is not among {listed:?}");
            Ok(found)
        }
        None if !default_first => Ok(None),
        None => listed
            .first()
            .cloned()
            .map(Some)
            .ok_or_else(|| "no RDMA devices found (ibv_get_device_list listed none)".into()),
    }
}

/// The GID index a side uses on `port` of `dev`.
fn gid_index(dev: &RdmaDevice, port: u8) -> (u8, bool) {
    let attr = dev.query_port(port).expect("query port 1");
    let index = match std::env::var("IBAL_RDMA_GID_INDEX") {
        Ok(v) => v.parse().expect("IBAL_RDMA_GID_INDEX is a number"),
        Err(_) if attr.link_layer == LinkLayer::Ethernet => attr
            .gid_table
            .iter()
            .position(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
            .unwrap_or(0) as u8,
        Err(_) => 0,
    };
    (index, attr.link_layer == LinkLayer::InfiniBand)
}

impl RdmaFixture {
    fn new() -> Result<RdmaFixture, String> {
        let provider = RdmaProvider::new();
        let a = pick_device(&provider, "IBAL_RDMA_DEVICE", true)?.expect("a device");
        let b = pick_device(&provider, "IBAL_RDMA_DEVICE_B", false)?.unwrap_or_else(|| a.clone());
        let a = provider.open(a.node_guid).expect("open side A");
        let b = provider.open(b.node_guid).expect("open side B");
        let port = 1;
        let (ga, lid_routed) = gid_index(&a, port);
        let (gb, _) = gid_index(&b, port);
        Ok(RdmaFixture {
            a,
            b,
            port,
            gid_index: [ga, gb],
            lid_routed,
        })
    }
}

impl Fixture for RdmaFixture {
    type Device = RdmaDevice;

    fn device(&self, side: Side) -> &RdmaDevice {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    fn endpoint(&self, side: Side) -> Endpoint {
        let port = self.device(side).query_port(self.port).unwrap();
        let gid_index = self.gid_index[usize::from(side == Side::B)];
        Endpoint {
            port: self.port,
            lid: self.lid_routed.then_some(port.lid),
            gid: port.gid_table[usize::from(gid_index)],
            gid_index,
        }
    }

    /// The device makes progress on its own; waiting only yields.
    fn progress(&self) {
        std::thread::sleep(Duration::from_micros(50));
    }

    fn supports_lid_routing(&self) -> bool {
        self.lid_routed
    }

    /// `ibv_wc` has no solicited flag.
    fn reports_solicited(&self) -> bool {
        false
    }

    /// libibverbs posts a READ or atomic whatever `max_rd_atomic` is;
    /// Linux rxe then never sends it.
    fn refuses_rd_atomic_without_max_rd_atomic(&self) -> bool {
        false
    }

    /// Linux rxe under an emulated CPU (the CI's VM) is slow, and its
    /// retry timers are in the hundreds of milliseconds.
    fn deadline(&self) -> Duration {
        Duration::from_secs(15)
    }
}

ibal_conformance::suite!(rdma, RdmaFixture::new, skip_when_absent);

/// The fixture, or `None` after saying why `test` did not run.
fn fixture(test: &str) -> Option<RdmaFixture> {
    match RdmaFixture::new() {
        Ok(f) => Some(f),
        Err(why) => {
            ibal_conformance::skipped(test, &why);
            None
        }
    }
}

const WAIT: Duration = Duration::from_secs(15);

/// The in-flight rule of `docs/memory.md` on a device: a posted
/// receive's bytes refuse application writes until its completion has
/// been polled, and a send's until its (or a later send's) completion.
#[test]
fn posted_bytes_are_leased_until_polled() {
    use ibal_conformance::harness::{ok, pair, two, ALL};
    use provider::{QpType, SendOp, SendWr, WcOpcode};

    let Some(f) = fixture("posted_bytes_are_leased_until_polled") else {
        return;
    };
    let (a, b) = two(&f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(64, 1, ALL);
    let bm = b.mem(64, 0, ALL);
    b.recv(&qb, 7, &[bm.sge(0, 16)]);
    b.recv(&qb, 8, &[]);
    assert!(
        matches!(bm.buf.write(0, &[9]), Err(al::Error::ResourceBusy(_))),
        "a posted receive's bytes are leased"
    );
    bm.buf
        .write(32, &[9])
        .expect("bytes no request names are free");
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, 16)]).unsignaled(),
    );
    a.send(&qa, SendWr::new(2, SendOp::Send, &[am.sge(16, 0)]));
    ok(&b.wait_recv(), 7, WcOpcode::Recv, 16);
    bm.buf
        .write(0, &[9])
        .expect("released once its completion is polled");
    ok(&a.wait_send(), 2, WcOpcode::Send, 0);
    ok(&b.wait_recv(), 8, WcOpcode::Recv, 0);
    am.buf
        .write(0, &[9])
        .expect("an unsignaled send is released by the later completion");
    assert_eq!((am.buf.in_flight(), bm.buf.in_flight()), (0, 0));
}

/// A hook that sends every event it hears to the returned receiver.
fn qp_hook() -> (rdma_provider::QpEventHook, mpsc::Receiver<QpEvent>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let hook: rdma_provider::QpEventHook = Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    });
    (hook, rx)
}

/// A QP moved to SQD with the notification asked for raises
/// `IBV_EVENT_SQ_DRAINED`; the device's event thread hands it to that QP's
/// hook, and to no other QP's (before: every asynchronous event but a CQ
/// error was dropped). The QP then goes back to RTS and still works.
#[test]
fn sq_drained_reaches_the_qps_own_hook() {
    use ibal_conformance::harness::{ok, pair, two, ALL};
    use provider::{QpModify, QpState, QpType, SendOp, SendWr, WcOpcode};

    let Some(f) = fixture("sq_drained_reaches_the_qps_own_hook") else {
        return;
    };
    let (a, b) = two(&f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let (hook, events) = qp_hook();
    let (other_hook, other_events) = qp_hook();
    f.a.set_qp_event_hook(&qa, Some(hook));
    f.b.set_qp_event_hook(&qb, Some(other_hook));
    a.modify(&qa, QpModify::to(QpState::Sqd).en_sqd_async_notify(true))
        .unwrap();
    assert_eq!(events.recv_timeout(WAIT), Ok(QpEvent::SqDrained));
    a.modify(&qa, QpModify::to(QpState::Rts)).unwrap();
    let am = a.mem(64, 1, ALL);
    let bm = b.mem(64, 0, ALL);
    b.recv(&qb, 7, &[bm.sge(0, 16)]);
    a.send(&qa, SendWr::new(1, SendOp::Send, &[am.sge(0, 16)]));
    ok(&a.wait_send(), 1, WcOpcode::Send, 16);
    ok(&b.wait_recv(), 7, WcOpcode::Recv, 16);
    assert_eq!(
        other_events.try_recv(),
        Err(mpsc::TryRecvError::Empty),
        "the peer QP heard nothing"
    );
}

/// Port events reach the device's hook: side B's link is taken down and up
/// again (`IBAL_RDMA_LINK_DOWN_B` and `IBAL_RDMA_LINK_UP_B`, shell commands;
/// the VM script gives `ip link set eth1 down|up`), and B's context hears
/// `PortDown(1)` then `PortActive(1)`, while A's device (another link)
/// hears neither. Destructive for the link, so it runs only when asked
/// (the VM runs it last, alone).
#[test]
fn port_down_and_up_reach_the_device_hook() {
    let test = "port_down_and_up_reach_the_device_hook";
    let Some(f) = fixture(test) else {
        return;
    };
    let (Ok(down), Ok(up)) = (
        std::env::var("IBAL_RDMA_LINK_DOWN_B"),
        std::env::var("IBAL_RDMA_LINK_UP_B"),
    ) else {
        ibal_conformance::skipped(
            test,
            "IBAL_RDMA_LINK_DOWN_B/IBAL_RDMA_LINK_UP_B unset (the commands that take side B's \
             link down and up)",
        );
        return;
    };
    let hear = |dev: &RdmaDevice| {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        dev.set_device_event_hook(Some(Arc::new(move |e: DeviceEvent| {
            let _ = tx.lock().unwrap().send(e);
        })));
        rx
    };
    let b_events = hear(&f.b);
    let a_events = hear(&f.a);
    let run = |cmd: &str| {
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .status()
            .expect("sh");
        assert!(st.success(), "{cmd}: {st}");
    };
    let until = |rx: &mpsc::Receiver<DeviceEvent>, want: DeviceEvent| {
        let end = std::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(e) if e == want => return seen,
                Ok(e) => seen.push(e),
                Err(_) => break,
            }
        }
        panic!("no {want:?} within {WAIT:?}; heard {seen:?}");
    };
    /// Brings the link back up however the test ends.
    struct Relink<'c>(&'c str);
    impl Drop for Relink<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("sh")
                .arg("-c")
                .arg(self.0)
                .status();
        }
    }
    let relink = Relink(&up);
    run(&down);
    until(&b_events, DeviceEvent::PortDown(1));
    drop(relink);
    until(&b_events, DeviceEvent::PortActive(1));
    if f.a.query().node_guid != f.b.query().node_guid {
        let heard: Vec<_> = a_events.try_iter().collect();
        assert!(
            !heard
                .iter()
                .any(|e| matches!(e, DeviceEvent::PortDown(_) | DeviceEvent::PortActive(_))),
            "side A's device heard {heard:?}"
        );
    }
}

/// Nothing below the top waits: the last handle of a device dropped
/// inside an AL callback (here a job on an AL executor thread) does not
/// join the device's event thread there: the join goes to the reaper, and
/// the callback thread's count of inline waits does not move. Positive
/// control: the same drop on the test's own thread joins inline (count +1).
#[test]
fn the_last_device_dropped_in_a_callback_is_joined_by_the_reaper() {
    let test = "the_last_device_dropped_in_a_callback_is_joined_by_the_reaper";
    let Some(f) = fixture(test) else {
        return;
    };
    let RdmaFixture { a, b, .. } = f;
    let before = rdma_provider::waits_on_this_thread();
    drop(a);
    assert_eq!(
        rdma_provider::waits_on_this_thread(),
        before + 1,
        "on an application thread the drop joins the event thread itself"
    );
    let exec = al::executor::Executor::new(al::ExecutorMode::Thread, "cb".into()).unwrap();
    let (tx, rx) = mpsc::channel();
    let dev = Mutex::new(Some(b));
    exec.post(Box::new(move || {
        let before = rdma_provider::waits_on_this_thread();
        let in_cb = rdma_provider::must_not_wait();
        drop(dev.lock().unwrap().take());
        let _ = tx.send((in_cb, rdma_provider::waits_on_this_thread() - before));
    }));
    let (in_cb, waited) = rx.recv_timeout(WAIT).expect("the callback ran");
    assert!(in_cb, "an executor job is inside a callback");
    assert_eq!(waited, 0, "no join on the callback thread");
}

/// The same on a provider thread: the rdma_cm event thread, inside an id's
/// hook (an address resolved), drops the last handle of a device and the
/// last reference to another rdma_cm id; neither the event-thread join nor
/// `rdma_destroy_id` runs there. Positive control: dropping an id on the
/// test's thread destroys it inline.
#[test]
fn a_cm_hook_drops_a_device_and_an_id_without_waiting() {
    let test = "a_cm_hook_drops_a_device_and_an_id_without_waiting";
    let Some(f) = fixture(test) else {
        return;
    };
    if let Err(e) = rdma_provider::rdma_cm_available() {
        ibal_conformance::skipped(test, &e.to_string());
        return;
    }
    let ep = f.endpoint(Side::A);
    let ip = if ep.gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        std::net::IpAddr::from([ep.gid[12], ep.gid[13], ep.gid[14], ep.gid[15]])
    } else {
        ibal_conformance::skipped(test, "side A has no IPv4 address to resolve");
        return;
    };
    let RdmaFixture { a, b, .. } = f;
    drop(a);
    let nop: rdma_provider::CmHook = Arc::new(|_| {});
    let before = rdma_provider::waits_on_this_thread();
    drop(rdma_provider::CmId::create(nop.clone()).unwrap());
    assert_eq!(
        rdma_provider::waits_on_this_thread(),
        before + 1,
        "on an application thread rdma_destroy_id runs inline"
    );
    let victim = Mutex::new(Some((b, rdma_provider::CmId::create(nop).unwrap())));
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let hook: rdma_provider::CmHook = Arc::new(move |_ev| {
        let Some(v) = victim.lock().unwrap().take() else {
            return;
        };
        let before = rdma_provider::waits_on_this_thread();
        let provider_thread = rdma_provider::must_not_wait();
        drop(v);
        let _ = tx.lock().unwrap().send((
            provider_thread,
            rdma_provider::waits_on_this_thread() - before,
        ));
    });
    let id = rdma_provider::CmId::create(hook).unwrap();
    id.resolve_addr(std::net::SocketAddr::new(ip, 1), 2000)
        .unwrap();
    let (provider_thread, waited) = rx.recv_timeout(WAIT).expect("the id's hook ran");
    assert!(
        provider_thread,
        "the rdma_cm event thread is a provider thread"
    );
    assert_eq!(
        waited, 0,
        "no join and no rdma_destroy_id on the event thread"
    );
    drop(id);
}

/// Not run by default: what asynchronous events rxe raises for a few
/// errors (a probe, printed; `--ignored --nocapture`).
#[test]
#[ignore]
fn probe_async_events() {
    use ibal_conformance::harness::{pair, two, ALL};
    use provider::{QpModify, QpState, QpType, SendOp, SendWr, Sge};

    let Some(f) = fixture("probe_async_events") else {
        return;
    };
    let (a, b) = two(&f);
    let report = |what: &str, rxs: &[(&str, &mpsc::Receiver<QpEvent>)]| {
        std::thread::sleep(Duration::from_secs(2));
        for (name, rx) in rxs {
            let got: Vec<_> = rx.try_iter().collect();
            println!("PROBE {what}: {name} heard {got:?}");
        }
    };
    // A WRITE with a bad rkey.
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let (ha, ea) = qp_hook();
    let (hb, eb) = qp_hook();
    f.a.set_qp_event_hook(&qa, Some(ha));
    f.b.set_qp_event_hook(&qb, Some(hb));
    let am = a.mem(64, 1, ALL);
    let bm = b.mem(64, 0, ALL);
    a.send(
        &qa,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: bm.iova,
                rkey: bm.rkey ^ 0x100,
            },
            &[am.sge(0, 8)],
        ),
    );
    report("bad rkey WRITE", &[("requester", &ea), ("responder", &eb)]);
    // A receive too small (responder length error).
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let (ha, ea) = qp_hook();
    let (hb, eb) = qp_hook();
    f.a.set_qp_event_hook(&qa, Some(ha));
    f.b.set_qp_event_hook(&qb, Some(hb));
    b.recv(&qb, 1, &[bm.sge(0, 4)]);
    a.send(&qa, SendWr::new(2, SendOp::Send, &[am.sge(0, 32)]));
    report(
        "receive too small",
        &[("requester", &ea), ("responder", &eb)],
    );
    // A bad lkey on the requester.
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let (ha, ea) = qp_hook();
    let (hb, eb) = qp_hook();
    f.a.set_qp_event_hook(&qa, Some(ha));
    f.b.set_qp_event_hook(&qb, Some(hb));
    let bad = [Sge {
        lkey: am.lkey ^ 0x100,
        ..am.sge(0, 8)
    }];
    b.recv(&qb, 1, &[bm.sge(0, 64)]);
    a.send(&qa, SendWr::new(3, SendOp::Send, &bad));
    report("bad lkey", &[("requester", &ea), ("responder", &eb)]);
    // A SEND reaching a QP still in RTR (COMM_EST on the responder?).
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    let (ha, ea) = qp_hook();
    let (hb, eb) = qp_hook();
    f.a.set_qp_event_hook(&qa, Some(ha));
    f.b.set_qp_event_hook(&qb, Some(hb));
    let c = ibal_conformance::harness::Conn::default();
    a.connect(&qa, &b, b.qpn(&qb), &c);
    b.init(&qb, ALL).unwrap();
    b.modify(&qb, b.rtr(&qb, &a, a.qpn(&qa), &c)).unwrap();
    b.recv(&qb, 1, &[bm.sge(0, 64)]);
    a.send(&qa, SendWr::new(4, SendOp::Send, &[am.sge(0, 8)]));
    report("SEND into RTR", &[("requester", &ea), ("responder", &eb)]);
    // Modify to ERR.
    a.modify(&qa, QpModify::to(QpState::Err)).unwrap();
    report("modify to ERR", &[("that QP", &ea)]);
}
