//! [`RdmaProvider`] and [`RdmaDevice`]: the provider interface over
//! libibverbs: listing and opening devices, and what an open one holds.
//! Its verbs are `verbs.rs`, its objects `objects.rs`, its event thread
//! `event_thread.rs`.

use al::sync::Arc;

use al::{Error, Result};
use provider::qp_state::PortLimits;
use provider::{DeviceAttr, DeviceInfo, LinkLayer, Mtu, Provider};

use crate::convert::{self};
use crate::event_thread::Events;
use crate::events::{DeviceEventHook, QpEventHook};
use crate::leases::Leases;
use crate::objects::RdmaQp;
use crate::sys::{Context, DeviceList, ListedDevice};

/// The message of every "no device" answer: what `ibv_devinfo` says as
/// "No IB devices found".
pub const NO_DEVICES: &str = "no RDMA devices found";

/// The provider over libibverbs: the RDMA devices of this machine
/// (InfiniBand HCAs, RoCE NICs, Linux rxe and siw devices), as
/// `ibv_get_device_list` lists them.
#[derive(Debug, Clone, Copy, Default)]
pub struct RdmaProvider;

impl RdmaProvider {
    /// The provider. Creating it touches nothing; each listing asks
    /// libibverbs afresh.
    pub fn new() -> RdmaProvider {
        RdmaProvider
    }

    /// The devices present now, or why none can be listed: `NotFound`
    /// whose message starts with [`NO_DEVICES`] and names the errno when
    /// libibverbs cannot list at all (no RDMA support in the kernel:
    /// `ENOSYS`). An empty list is `Ok(vec![])`.
    ///
    /// [`Provider::devices`] has no error to give; it answers an empty list
    /// in both cases.
    pub fn list(&self) -> Result<Vec<DeviceInfo>> {
        let list = DeviceList::get().map_err(no_devices)?;
        Ok(list
            .iter()
            .map(|d| DeviceInfo {
                name: d.name(),
                node_guid: d.guid(),
            })
            .collect())
    }

    /// Opens the device named `name` (`mlx5_0`, `rxe0`); `NotFound` when
    /// there is none.
    pub fn open_by_name(&self, name: &str) -> Result<RdmaDevice> {
        self.open_where(|d| d.name() == name, &format!("named {name:?}"))
    }

    fn open_where(
        &self,
        pick: impl Fn(&ListedDevice<'_>) -> bool,
        what: &str,
    ) -> Result<RdmaDevice> {
        let list = DeviceList::get().map_err(no_devices)?;
        if list.len() == 0 {
            return Err(Error::NotFound(
                format!("{NO_DEVICES} (ibv_get_device_list listed none): no device {what}").into(),
            ));
        }
        let Some(dev) = list.iter().find(|d| pick(d)) else {
            let names: Vec<String> = list.iter().map(|d| d.name()).collect();
            return Err(Error::NotFound(
                format!("no RDMA device {what}; present: {}", names.join(", ")).into(),
            ));
        };
        RdmaDevice::open(&dev)
    }
}

/// A listing failure as "no devices", naming the call and the errno.
fn no_devices(errno: i32) -> Error {
    Error::NotFound(
        format!(
            "{NO_DEVICES}: {}",
            convert::errno_text("ibv_get_device_list", errno)
        )
        .into(),
    )
}

impl Provider for RdmaProvider {
    type Device = RdmaDevice;

    fn name(&self) -> &str {
        "rdma"
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        self.list().unwrap_or_default()
    }

    fn open(&self, node_guid: u64) -> Result<RdmaDevice> {
        self.open_where(
            |d| d.guid() == node_guid,
            &format!("with node GUID {node_guid:#018x}"),
        )
    }
}

pub(crate) struct Inner {
    // Dropped first: stops the event thread before the context can go.
    pub(crate) events: Arc<Events>,
    /// What posted requests lease in registered memory (`leases.rs`).
    pub(crate) leases: Arc<Leases>,
    pub(crate) ctx: Arc<Context>,
    /// Each port's limits for the modify-QP and AV checks, read at open.
    pub(crate) ports: Vec<PortLimits>,
    pub(crate) attr: DeviceAttr,
    pub(crate) fw_ver: String,
    pub(crate) sys_image_guid: u64,
}

/// An open RDMA device. Cheap to clone (the clones share one
/// `ibv_context`, closed when the last goes).
///
/// Device attributes are read once, at open ([`provider::Device::query`] cannot
/// fail); port attributes are queried afresh on each call.
#[derive(Clone)]
pub struct RdmaDevice {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaDevice")
            .field("name", &self.inner.attr.name)
            .field(
                "node_guid",
                &format_args!("{:#018x}", self.inner.attr.node_guid),
            )
            .finish_non_exhaustive()
    }
}

impl RdmaDevice {
    fn open(dev: &ListedDevice<'_>) -> Result<RdmaDevice> {
        let name = dev.name();
        let ctx = Arc::new(dev.open()?);
        let raw = ctx.query_device()?;
        // The C device attributes have no message size; take the smallest
        // of the ports' (0 when a port cannot say).
        let mut max_msg = u32::MAX;
        let mut ports = Vec::new();
        for port in 1..=raw.phys_port_cnt {
            let p = ctx.query_port(port);
            max_msg = max_msg.min(p.as_ref().map_or(0, |p| p.max_msg_sz));
            let p = p.ok();
            ports.push(PortLimits {
                pkeys: p.as_ref().map_or(0, |p| usize::from(p.pkey_tbl_len)),
                gids: p
                    .as_ref()
                    .map_or(0, |p| usize::try_from(p.gid_tbl_len).unwrap_or(0)),
                mtu: p
                    .as_ref()
                    .and_then(|p| convert::mtu_from_code(p.active_mtu))
                    .unwrap_or(Mtu::Mtu256),
                gid_only: p
                    .as_ref()
                    .and_then(|p| convert::link_layer_from_code(p.link_layer))
                    == Some(LinkLayer::Ethernet),
            });
        }
        if raw.phys_port_cnt == 0 {
            max_msg = 0;
        }
        Ok(RdmaDevice {
            inner: Arc::new(Inner {
                attr: convert::device_attr(&name, &raw, max_msg),
                fw_ver: raw.fw_ver,
                sys_image_guid: raw.sys_image_guid,
                events: Arc::new(Events::start(&ctx, &name)?),
                leases: Arc::new(Leases::default()),
                ports,
                ctx,
            }),
        })
    }

    /// Identifies this device among the open devices of the process: two
    /// clones answer the same.
    pub fn instance_key(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The firmware version (`ibv_device_attr::fw_ver`).
    pub fn fw_ver(&self) -> &str {
        &self.inner.fw_ver
    }

    /// The system image GUID, host order.
    pub fn sys_image_guid(&self) -> u64 {
        self.inner.sys_image_guid
    }

    /// Sets (or, with `None`, clears) the hook that hears `qp`'s
    /// asynchronous events ([`crate::QpEvent`]: fatal, request and access
    /// errors, communication established, SQ drained, path migration,
    /// last WQE reached), on the device's event thread with no provider
    /// lock held. Without a hook they are counted
    /// ([`RdmaDevice::unrouted_async_events`]).
    pub fn set_qp_event_hook(&self, qp: &RdmaQp, hook: Option<QpEventHook>) {
        qp.events.hook.set(hook);
    }

    /// The hook `qp`'s events go to now, if any.
    pub fn qp_event_hook(&self, qp: &RdmaQp) -> Option<QpEventHook> {
        qp.events.hook.get()
    }

    /// Sets (or clears) the hook that hears the device's port events (up,
    /// down, LID/P_Key/SM/GID changes, client reregister) and its fatal
    /// error ([`crate::DeviceEvent`]), on the device's event thread.
    pub fn set_device_event_hook(&self, hook: Option<DeviceEventHook>) {
        self.inner.events.set_device_hook(hook);
    }

    /// Asynchronous events no hook took so far (an SRQ's, an object
    /// without a hook, a code this provider does not know).
    pub fn unrouted_async_events(&self) -> u64 {
        self.inner.events.unrouted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider::Device;

    /// On a machine without RDMA devices (this project's CI host) every
    /// entry point says so, without panicking; with devices, each opens
    /// and its ports query.
    #[test]
    fn listing_and_opening_report_no_devices_cleanly() {
        let p = RdmaProvider::new();
        match p.list() {
            Ok(devices) if !devices.is_empty() => {
                for d in devices {
                    let dev = p.open(d.node_guid).unwrap();
                    let attr = dev.query();
                    assert_eq!(attr.name, d.name);
                    for port in 1..=attr.num_ports {
                        dev.query_port(port).unwrap();
                    }
                    assert!(matches!(dev.query_port(0), Err(Error::NotFound(_))));
                    dev.dealloc_pd(dev.alloc_pd().unwrap()).unwrap();
                }
            }
            listed => {
                if let Err(e) = &listed {
                    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
                    assert!(e.to_string().contains(NO_DEVICES), "{e}");
                    assert!(e.to_string().contains("(errno "), "{e}");
                }
                assert!(p.devices().is_empty());
                let e = p.open(0x0002_c903_0000_0001).unwrap_err();
                assert!(matches!(e, Error::NotFound(_)), "{e:?}");
                assert!(e.to_string().contains(NO_DEVICES), "{e}");
                let e = p.open_by_name("mlx5_0").unwrap_err();
                assert!(e.to_string().contains(NO_DEVICES), "{e}");
            }
        }
    }

    #[test]
    fn a_device_that_is_not_there_is_not_found() {
        let p = RdmaProvider::new();
        let e = p.open_by_name("no-such-device-\u{1}").unwrap_err();
        assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    }
}
