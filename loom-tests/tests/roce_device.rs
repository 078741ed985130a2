//! loom models of a whole RoCEv2 device (`roce-provider`) on the fake
//! network that replaces its UDP socket under `--cfg ibal_loom`
//! (`roce_provider::model::device`): the device's own receive and timer
//! threads, its reaper, and the application's threads, through the public
//! verbs API. The peer is a fake-network address the model sends hand-built
//! RoCEv2 packets from (its ACKs are dropped: nothing is bound there).
//!
//! loom allows five threads per execution: the model's main thread, one
//! more model thread, and the device's receive, timer and reaper threads.
#![cfg(ibal_loom)]

use std::net::SocketAddr;

use loom::thread;

use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Mtu, Provider, QpCaps, QpInit, QpModify, QpState,
    QpType, RecvWr, Wc, WcStatus,
};
use roce_provider::model::{clock, device as fake};
use roce_provider::{DeviceConfig, PortConfig, RoceCq, RoceDevice, RocePd, RoceProvider, RoceQp};

#[allow(dead_code)]
mod common;

/// Preemption bound of these models: at most 2. A whole device (its open
/// and its QP's setup alone are thousands of loom operations, and its
/// receive loop, poll path and shutdown run in every execution) at bound
/// 3 did not finish model (a) in 10 minutes; at bound 2 each model takes
/// under a minute (docs/verification.md, "Whole-device models").
const BOUND: usize = 2;

/// [`common::model_bounded`] at [`BOUND`].
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    common::model_bounded(name, Some(BOUND), f);
}

/// The peer's address (nothing bound there: what the device sends it is
/// dropped).
fn peer() -> SocketAddr {
    "127.0.0.2:4791".parse().unwrap()
}

/// The peer's QP number.
const PEER_QPN: u32 = 0x11;
/// The first PSN each way.
const PSN: u32 = 7;

struct World {
    dev: RoceDevice,
    pd: RocePd,
    cq: RoceCq,
    qp: RoceQp,
    qpn: u32,
    local: SocketAddr,
}

/// A device with one port (no extra send sockets) and an RC QP in RTS
/// connected to [`peer`], with `recvs` receives posted.
fn world(recvs: u64) -> World {
    let port = PortConfig::new("127.0.0.1:0".parse().unwrap()).source_ports(0);
    let dev = RoceProvider::new(vec![DeviceConfig::new("m", 1, vec![port]).first_qpn(0x40)])
        .open(1)
        .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev
        .create_cq(CqInit {
            capacity: 8,
            ..CqInit::default()
        })
        .unwrap();
    let qp = dev
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap();
    let av = AvAttr {
        grh: Some(GrhAttr {
            dgid: roce::gid_of(peer().ip()),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }),
        ..AvAttr::lid(1, 0)
    };
    let m = QpModify::to;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    dev.modify_qp(&qp, &m(QpState::Init).pkey_index(0).port(1).access(all))
        .unwrap();
    dev.modify_qp(
        &qp,
        &m(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(PEER_QPN)
            .rq_psn(PSN)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    dev.modify_qp(
        &qp,
        &m(QpState::Rts)
            .sq_psn(PSN)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    )
    .unwrap();
    for wr_id in 0..recvs {
        dev.post_recv(
            &qp,
            &[RecvWr {
                wr_id,
                sg_list: &[],
            }],
        )
        .unwrap();
    }
    let qpn = dev.qp_num(&qp);
    let local = dev.local_addr(1).unwrap();
    World {
        dev,
        pd,
        cq,
        qp,
        qpn,
        local,
    }
}

/// Destroys the objects and closes the device; returns once its threads
/// are joined.
fn close(w: World) {
    let World {
        dev, pd, cq, qp, ..
    } = w;
    drop((qp, cq, pd));
    let watch = dev.close_watch();
    drop(dev);
    assert!(
        watch.wait(std::time::Duration::from_secs(1)).is_some(),
        "the reaper finished"
    );
}

/// Polls `cq` (each empty poll makes progress on the port) until `n`
/// completions came.
fn poll_until(dev: &RoceDevice, cq: &RoceCq, n: usize) -> Vec<Wc> {
    let mut got = Vec::new();
    let mut wc = [Wc::default(); 4];
    while got.len() < n {
        let k = dev.poll_cq(cq, &mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if k == 0 {
            thread::yield_now();
        }
    }
    got
}

/// (a) The port's receive thread and an application poller take the same
/// port's datagrams: the peer sends two SENDs; the poller gets exactly two
/// receive completions, in order, each datagram counted once. The device
/// starts busy-polled (its receive thread, once it comes back from its
/// socket, naps) and the clock moves past the pollers' window once the
/// poller has its first completion (the receive thread takes the socket
/// back): both branches of the step-aside, and a receive thread blocked in
/// the socket still wakes for a SEND (or leaves it to the poller) and for
/// the close.
///
/// The peer's sends are made by the poller's thread itself (loom's five
/// threads: this one, the device's receive, timer and reaper threads).
#[test]
fn receive_thread_vs_poller_feed_each_datagram_once() {
    model("receive_thread_vs_poller_feed_each_datagram_once", || {
        let w = world(2);
        fake::mark_busy_polled(&w.dev);
        fake::send_imm(peer(), w.local, w.qpn, PSN, 1);
        fake::send_imm(peer(), w.local, w.qpn, PSN + 1, 2);
        let mut got = poll_until(&w.dev, &w.cq, 1);
        clock::advance(1_000_000);
        got.extend(poll_until(&w.dev, &w.cq, 2 - got.len()));
        let seen: Vec<(u64, WcStatus, Option<u32>)> =
            got.iter().map(|c| (c.wr_id, c.status, c.imm)).collect();
        assert_eq!(
            seen,
            [
                (0, WcStatus::Success, Some(1)),
                (1, WcStatus::Success, Some(2))
            ],
            "each SEND completes once, in order"
        );
        let kept = fake::keep(&w.dev);
        close(w);
        assert_eq!(
            kept.fed_counters(1),
            (2, 2),
            "datagrams and packets counted once each"
        );
    });
}

/// (b) Teardown vs a receive thread inside the QP: the peer sends a SEND
/// while the application destroys the QP, then its CQ, then closes the
/// device. Whatever the interleaving: once the QP's destroy returned, no
/// completion reaches its CQ (the one the SEND may make is there before,
/// or never), none reaches the destroyed CQ, every datagram taken is
/// either passed to a QP or dropped and counted, the close returns with
/// the device's threads joined, and (loom's own check) nothing leaks.
#[test]
fn qp_and_cq_destroy_vs_receive_thread() {
    model("qp_and_cq_destroy_vs_receive_thread", || {
        let w = world(1);
        let (qpn, local) = (w.qpn, w.local);
        let sender = thread::spawn(move || {
            fake::send_imm(peer(), local, qpn, PSN, 1);
        });
        let kept = fake::keep(&w.dev);
        let World {
            dev, pd, cq, qp, ..
        } = w;
        dev.destroy_qp(qp).unwrap();
        // What the SEND completed before the destroy returned (taking
        // the datagram here too if it is queued: the QP is gone).
        let mut wc = [Wc::default(); 2];
        let before = dev.poll_cq(&cq, &mut wc).unwrap();
        assert!(before <= 1);
        let queue = fake::keep_cq(&cq);
        dev.destroy_cq(cq).unwrap();
        dev.dealloc_pd(pd).unwrap();
        sender.join().unwrap();
        let watch = dev.close_watch();
        drop(dev);
        assert!(
            watch.wait(std::time::Duration::from_secs(1)).is_some(),
            "the reaper finished"
        );
        assert!(
            queue.is_empty(),
            "a completion reached the QP's CQ after the QP's destroy"
        );
        let (datagrams, packets) = kept.fed_counters(1);
        assert!(datagrams <= 1 && packets <= datagrams);
    });
}
