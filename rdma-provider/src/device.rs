//! [`RdmaProvider`] and [`RdmaDevice`]: the provider interface over
//! libibverbs. Listing, opening and querying work; the verbs objects do
//! not exist yet (see the crate docs).

use std::sync::Arc;

use al::{Error, Result};
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, DeviceInfo, PortAttr, Provider, QpAttr,
    QpInit, QpModify, RawRegion, RecvWr, RegisteredBuffer, SendWr, SrqInit, Wc,
};

use crate::convert::{self, not_yet};
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

struct Inner {
    ctx: Context,
    attr: DeviceAttr,
    fw_ver: String,
    sys_image_guid: u64,
}

/// An open RDMA device. Cheap to clone (the clones share one
/// `ibv_context`, closed when the last goes).
///
/// Device attributes are read once, at open ([`Device::query`] cannot
/// fail); port attributes are queried afresh on each call.
#[derive(Clone)]
pub struct RdmaDevice {
    inner: Arc<Inner>,
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
        let ctx = dev.open()?;
        let raw = ctx.query_device()?;
        // The C device attributes have no message size; take the smallest
        // of the ports' (0 when a port cannot say).
        let mut max_msg = u32::MAX;
        for port in 1..=raw.phys_port_cnt {
            max_msg = max_msg.min(ctx.query_port(port).map_or(0, |p| p.max_msg_sz));
        }
        if raw.phys_port_cnt == 0 {
            max_msg = 0;
        }
        Ok(RdmaDevice {
            inner: Arc::new(Inner {
                attr: convert::device_attr(&name, &raw, max_msg),
                fw_ver: raw.fw_ver,
                sys_image_guid: raw.sys_image_guid,
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
}

/// An uninhabited type: no verbs object of this provider can exist yet.
#[derive(Debug, Clone, Copy)]
enum Never {}

macro_rules! no_objects {
    ($($(#[$doc:meta])* $name:ident),+ $(,)?) => {$(
        $(#[$doc])*
        ///
        /// Not implemented yet: no value of this type can be made (the
        /// verb that would create one answers `Unsupported`).
        #[derive(Debug)]
        pub struct $name {
            never: Never,
        }
    )+};
}

no_objects!(
    /// A protection domain.
    RdmaPd,
    /// A completion queue.
    RdmaCq,
    /// A memory region.
    RdmaMr,
    /// A shared receive queue.
    RdmaSrq,
    /// An address vector (`ibv_ah`).
    RdmaAv,
    /// A queue pair.
    RdmaQp,
);

impl Device for RdmaDevice {
    type Pd = RdmaPd;
    type Cq = RdmaCq;
    type Mr = RdmaMr;
    type Srq = RdmaSrq;
    type Av = RdmaAv;
    type Qp = RdmaQp;

    fn query(&self) -> DeviceAttr {
        self.inner.attr.clone()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let n = self.inner.attr.num_ports;
        if port == 0 || port > n {
            return Err(Error::NotFound(
                format!("{} has ports 1..={n}, not {port}", self.inner.attr.name).into(),
            ));
        }
        let ctx = &self.inner.ctx;
        let raw = ctx.query_port(port)?;
        let gids = (0..raw.gid_tbl_len.max(0))
            .map(|i| ctx.query_gid(port, i))
            .collect::<Result<Vec<_>>>()?;
        let pkeys = (0..i32::from(raw.pkey_tbl_len))
            .map(|i| ctx.query_pkey(port, i))
            .collect::<Result<Vec<_>>>()?;
        convert::port_attr(port, &raw, gids, pkeys)
    }

    fn alloc_pd(&self) -> Result<RdmaPd> {
        Err(not_yet("alloc_pd"))
    }
    fn dealloc_pd(&self, pd: RdmaPd) -> Result<()> {
        match pd.never {}
    }

    fn create_cq(&self, _init: CqInit) -> Result<RdmaCq> {
        Err(not_yet("create_cq"))
    }
    fn destroy_cq(&self, cq: RdmaCq) -> Result<()> {
        match cq.never {}
    }
    fn arm_cq(&self, cq: &RdmaCq, _arm: CqArm) -> Result<()> {
        match cq.never {}
    }
    fn poll_cq(&self, cq: &RdmaCq, _out: &mut [Wc]) -> Result<usize> {
        match cq.never {}
    }

    fn register_mr(
        &self,
        pd: &RdmaPd,
        _buf: &RegisteredBuffer,
        _offset: usize,
        _len: usize,
        _iova: u64,
        _access: Access,
    ) -> Result<RdmaMr> {
        match pd.never {}
    }
    fn register_region(&self, pd: &RdmaPd, _region: RawRegion, _access: Access) -> Result<RdmaMr> {
        match pd.never {}
    }
    fn mr_keys(&self, mr: &RdmaMr) -> (u32, u32) {
        match mr.never {}
    }
    fn deregister_mr(&self, mr: RdmaMr) -> Result<()> {
        match mr.never {}
    }

    fn create_srq(&self, pd: &RdmaPd, _init: SrqInit) -> Result<RdmaSrq> {
        match pd.never {}
    }
    fn destroy_srq(&self, srq: RdmaSrq) -> Result<()> {
        match srq.never {}
    }
    fn post_srq_recv(&self, srq: &RdmaSrq, _wrs: &[RecvWr<'_>]) -> Result<()> {
        match srq.never {}
    }

    fn create_av(&self, pd: &RdmaPd, _attr: &AvAttr) -> Result<RdmaAv> {
        match pd.never {}
    }
    fn destroy_av(&self, av: RdmaAv) -> Result<()> {
        match av.never {}
    }

    fn create_qp(&self, pd: &RdmaPd, _init: &QpInit<'_, RdmaCq, RdmaSrq>) -> Result<RdmaQp> {
        match pd.never {}
    }
    fn create_gsi_qp(
        &self,
        pd: &RdmaPd,
        _port: u8,
        _init: &QpInit<'_, RdmaCq, RdmaSrq>,
    ) -> Result<RdmaQp> {
        match pd.never {}
    }
    fn qp_num(&self, qp: &RdmaQp) -> u32 {
        match qp.never {}
    }
    fn modify_qp(&self, qp: &RdmaQp, _m: &QpModify) -> Result<()> {
        match qp.never {}
    }
    fn query_qp(&self, qp: &RdmaQp) -> Result<QpAttr> {
        match qp.never {}
    }
    fn destroy_qp(&self, qp: RdmaQp) -> Result<()> {
        match qp.never {}
    }
    fn post_send<'v, H>(
        &self,
        qp: &RdmaQp,
        _wrs: &[SendWr<'_, H>],
        _av_of: &dyn Fn(usize) -> Option<&'v RdmaAv>,
    ) -> Result<()> {
        match qp.never {}
    }
    fn post_recv(&self, qp: &RdmaQp, _wrs: &[RecvWr<'_>]) -> Result<()> {
        match qp.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                    assert!(matches!(dev.alloc_pd(), Err(Error::Unsupported(_))));
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
