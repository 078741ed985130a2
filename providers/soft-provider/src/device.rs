//! The soft HCA as a [`provider::Device`] and the fabric's devices as a
//! [`provider::Provider`] ([`SoftProvider`]).

use crate::fabric::Fabric;
use crate::handles::{SoftAv, SoftCq, SoftSrq};
use crate::hca::SoftHca;
use crate::pd::{SoftMr, SoftPd};
use crate::qp_handle::SoftQp;
use al::{Error, Result};
use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, DeviceInfo, PortAttr, Provider, QpAttr,
    QpInit, QpModify, RecvWr, SendWr, SrqInit, Wc,
};

impl Device for SoftHca {
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Mr = SoftMr;
    type Srq = SoftSrq;
    type Av = SoftAv;
    type Qp = SoftQp;

    fn query(&self) -> DeviceAttr {
        SoftHca::query(self)
    }
    fn query_port(&self, port: u8) -> Result<PortAttr> {
        SoftHca::query_port(self, port)
    }
    fn alloc_pd(&self) -> Result<SoftPd> {
        SoftHca::alloc_pd(self)
    }
    fn dealloc_pd(&self, pd: SoftPd) -> Result<()> {
        self.check_pd(&pd)
    }
    fn create_cq(&self, init: CqInit) -> Result<SoftCq> {
        SoftHca::create_cq(self, init)
    }
    fn destroy_cq(&self, cq: SoftCq) -> Result<()> {
        drop(cq);
        Ok(())
    }
    fn arm_cq(&self, cq: &SoftCq, arm: CqArm) -> Result<()> {
        cq.arm(arm);
        Ok(())
    }
    fn poll_cq(&self, cq: &SoftCq, out: &mut [Wc]) -> Result<usize> {
        Ok(cq.poll(out))
    }
    fn register_mr(
        &self,
        pd: &SoftPd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        self.check_pd(pd)?;
        pd.register_range(buf, offset, len, iova, access)
    }
    fn register_region(&self, pd: &SoftPd, region: RawRegion, access: Access) -> Result<SoftMr> {
        self.check_pd(pd)?;
        pd.register_region(region, access)
    }
    fn mr_keys(&self, mr: &SoftMr) -> (u32, u32) {
        (mr.lkey(), mr.rkey())
    }
    fn deregister_mr(&self, mr: SoftMr) -> Result<()> {
        drop(mr);
        Ok(())
    }
    fn create_srq(&self, pd: &SoftPd, init: SrqInit) -> Result<SoftSrq> {
        SoftHca::create_srq(self, pd, init)
    }
    fn destroy_srq(&self, srq: SoftSrq) -> Result<()> {
        drop(srq);
        Ok(())
    }
    fn post_srq_recv(&self, srq: &SoftSrq, wrs: &[RecvWr<'_>]) -> Result<()> {
        srq.post_recv(wrs)
    }
    fn create_av(&self, pd: &SoftPd, attr: &AvAttr) -> Result<SoftAv> {
        SoftHca::create_av(self, pd, attr)
    }
    fn destroy_av(&self, _av: SoftAv) -> Result<()> {
        Ok(())
    }
    fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<SoftQp> {
        SoftHca::create_qp(self, pd, init)
    }
    fn create_gsi_qp(
        &self,
        pd: &SoftPd,
        port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
    ) -> Result<SoftQp> {
        SoftHca::create_gsi_qp(self, pd, port, init)
    }
    fn qp_num(&self, qp: &SoftQp) -> u32 {
        qp.qpn()
    }
    fn modify_qp(&self, qp: &SoftQp, m: &QpModify) -> Result<()> {
        qp.modify(m)
    }
    fn query_qp(&self, qp: &SoftQp) -> Result<QpAttr> {
        Ok(qp.query())
    }
    fn qp_footprint(&self, qp: &SoftQp) -> usize {
        qp.footprint()
    }
    fn destroy_qp(&self, qp: SoftQp) -> Result<()> {
        drop(qp);
        Ok(())
    }
    fn post_send<'v, H>(
        &self,
        qp: &SoftQp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v SoftAv>,
    ) -> Result<()> {
        qp.post_send_with(wrs, av_of)
    }
    fn post_recv(&self, qp: &SoftQp, wrs: &[RecvWr<'_>]) -> Result<()> {
        qp.post_recv(wrs)
    }
}

/// The soft provider: the devices of one [`Fabric`].
#[derive(Clone, Debug, Default)]
pub struct SoftProvider {
    fabric: Fabric,
}

impl SoftProvider {
    /// A provider over `fabric`.
    pub fn new(fabric: Fabric) -> SoftProvider {
        SoftProvider { fabric }
    }
    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }
}

impl Provider for SoftProvider {
    type Device = SoftHca;
    fn name(&self) -> &str {
        "soft"
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        self.fabric.devices()
    }
    fn open(&self, node_guid: u64) -> Result<SoftHca> {
        self.fabric
            .hca(node_guid)
            .ok_or_else(|| Error::NotFound(format!("HCA {node_guid:#x}").into()))
    }
}
