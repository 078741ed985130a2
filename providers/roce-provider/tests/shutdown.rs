//! A device's last handle dropped where nothing may wait: inside a
//! completion hook on the device's own receive thread. The drop only
//! signals; a reaper thread joins the device's threads (its name, not the
//! receive thread's, is what the close watch reports), and the same
//! device, on the same fixed UDP port, opens again right after.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connected_qps, cq};
use provider::{CqInit, Device, Provider, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge};
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};

/// A UDP port on 127.0.0.2 that was free a moment ago.
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_last_handle_dropped_on_a_receive_thread_is_reaped_elsewhere() {
    let fixed: SocketAddr = SocketAddr::new("127.0.0.2".parse().unwrap(), free_port());
    let p = RoceProvider::new(vec![
        DeviceConfig::new(
            "a",
            1,
            vec![PortConfig::new("127.0.0.1:0".parse().unwrap())],
        ),
        DeviceConfig::new("b", 2, vec![PortConfig::new(fixed)]),
    ]);
    let a = p.open(1).unwrap();
    let b = p.open(2).unwrap();
    assert_eq!(b.local_addr(1), Some(fixed));
    let watch = b.close_watch();
    // B's only handle goes into its CQ's hook, which drops it when B's
    // first receive completes: on B's receive thread.
    let slot: Arc<Mutex<Option<RoceDevice>>> = Arc::new(Mutex::new(None));
    let dropped_on: Arc<Mutex<Option<String>>> = Arc::default();
    let hook = {
        let (slot, dropped_on) = (slot.clone(), dropped_on.clone());
        Arc::new(move || {
            let dev = slot.lock().unwrap().take();
            if let Some(dev) = dev {
                *dropped_on.lock().unwrap() = std::thread::current().name().map(str::to_string);
                drop(dev);
            }
        })
    };
    let cb = b
        .create_cq(CqInit {
            capacity: 16,
            on_completion: Some(hook),
            ..CqInit::default()
        })
        .unwrap();
    let ca = cq(&a);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (qa, qb) = connected_qps((&a, &pa, &ca), (&b, &pb, &cb));
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, common::ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, common::ALL).unwrap();
    let sg = |lkey| {
        [Sge {
            addr: 0,
            length: 8,
            lkey,
        }]
    };
    b.post_recv(
        &qb,
        &[RecvWr {
            wr_id: 1,
            sg_list: &sg(b.mr_keys(&mb).0),
        }],
    )
    .unwrap();
    // Every object of B goes now but the QP and its CQ, which the hook
    // keeps busy; then the last device handle moves into the hook.
    drop((mb, pb));
    b.arm_cq(&cb, provider::CqArm::NextCompletion).unwrap();
    *slot.lock().unwrap() = Some(b);
    a.post_send::<()>(
        &qa,
        &[SendWr::new(1, SendOp::Send, &sg(a.mr_keys(&ma).0))],
        &|_| None,
    )
    .unwrap();
    let joiner = watch
        .wait(Duration::from_secs(10))
        .expect("the device was reaped");
    let dropper = dropped_on.lock().unwrap().clone().expect("the hook ran");
    assert_eq!(dropper, "roce-b-p1", "dropped on B's receive thread");
    assert_eq!(
        joiner, "roce-b-reaper",
        "joined by the reaper, not by {dropper}"
    );
    // B's remaining objects hold its sockets until they go.
    drop((qb, cb));
    // The same device on the same fixed port opens again at once.
    let again = p.open(2).expect("reopen on the same fixed UDP port");
    assert_eq!(again.local_addr(1), Some(fixed));
    drop((qa, ca, ma, pa));
}

#[test]
fn a_reopen_right_after_close_waits_for_the_reaper() {
    let fixed: SocketAddr = SocketAddr::new("127.0.0.2".parse().unwrap(), free_port());
    let p = RoceProvider::new(vec![DeviceConfig::new(
        "c",
        3,
        vec![PortConfig::new(fixed)],
    )]);
    for round in 0..20 {
        let dev = p.open(3).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(dev.local_addr(1), Some(fixed));
        drop(dev);
    }
    // Another provider's device on the same fixed address, right after.
    let dev = p.open(3).unwrap();
    drop(dev);
    let q = RoceProvider::new(vec![DeviceConfig::new(
        "d",
        4,
        vec![PortConfig::new(fixed)],
    )]);
    let other = q
        .open(4)
        .expect("the address is free once the reaper is done");
    assert_eq!(other.local_addr(1), Some(fixed));
}
