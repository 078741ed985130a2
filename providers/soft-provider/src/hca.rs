//! A soft HCA's handle and its verbs that create objects (PD, CQ, SRQ, AV,
//! QP); the objects' own handles are in `pd.rs`, `handles.rs` and
//! `qp_handle.rs`, the [`provider::Device`] implementation in `device.rs`.

use crate::config::GSI_KEY;
use crate::cq::CqInner;
use crate::handles::{SoftAv, SoftCq, SoftSrq};
use crate::hca_core::{Charge, Counted, HcaCore, HcaUsage};
use crate::identity::new_identity;
use crate::node::{FabricInner, HcaNode};
use crate::pd::SoftPd;
use crate::qp::{QpInner, SrqInner, PSN_MASK};
use crate::qp_handle::SoftQp;
use al::sync::atomic::Ordering;
use al::sync::Arc;
use al::{Error, Result};
use provider::{AvAttr, CqInit, DeviceAttr, PortAttr, PortState, QpInit, QpType, SrqInit};

/// A soft HCA on a [`Fabric`](crate::Fabric). Cloning gives another handle to the same
/// HCA.
#[derive(Clone)]
pub struct SoftHca {
    pub(crate) fabric: Arc<FabricInner>,
    pub(crate) node: Arc<HcaNode>,
}

impl SoftHca {
    /// Identifies this device among the open devices of the process (two
    /// handles to one soft HCA answer the same; HCAs of different fabrics
    /// differ even when their node GUIDs are equal). Stable while any handle
    /// to the HCA lives.
    pub fn instance_key(&self) -> usize {
        Arc::as_ptr(&self.node) as *const () as usize
    }
}

impl std::fmt::Debug for SoftHca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftHca")
            .field(
                "node_guid",
                &format_args!("{:#x}", self.node.core.attr.node_guid),
            )
            .finish()
    }
}

fn core_of(node: &HcaNode) -> &HcaCore {
    &node.core
}

impl SoftHca {
    fn core(&self) -> &HcaCore {
        core_of(&self.node)
    }

    pub(crate) fn check_pd(&self, pd: &SoftPd) -> Result<()> {
        if !std::ptr::eq(&*pd.core, self.core()) {
            return Err(Error::invalid_parameter("the PD belongs to another HCA"));
        }
        Ok(())
    }

    /// Node GUID.
    pub fn node_guid(&self) -> u64 {
        self.core().attr.node_guid
    }

    /// How many PDs, CQs, QPs, SRQs, AVs and MRs the HCA holds now (what
    /// its limits are checked against; all 0 once every user is gone).
    pub fn usage(&self) -> HcaUsage {
        self.core().usage()
    }

    /// Device attributes.
    pub fn query(&self) -> DeviceAttr {
        self.core().attr.clone()
    }

    /// Attributes of port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.core()
            .port(port)
            .map(|p| p.attr())
            .ok_or_else(|| Error::NotFound(format!("port {port}").into()))
    }

    /// Change a port's state (packets flow only between active ports).
    pub fn set_port_state(&self, port: u8, state: PortState) -> Result<()> {
        self.core()
            .port(port)
            .ok_or_else(|| Error::NotFound(format!("port {port}").into()))?
            .set_state(state);
        Ok(())
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            _charge: HcaCore::charge(&self.node.core, Counted::Pd)?,
            id: new_identity(),
            core: self.node.core.clone(),
        })
    }

    /// Create a completion queue.
    pub fn create_cq(&self, init: CqInit) -> Result<SoftCq> {
        let max = self.core().attr.max_cqe;
        if init.capacity == 0 || init.capacity > max {
            return Err(Error::invalid_parameter(format!(
                "CQ capacity {} must be 1..={max}",
                init.capacity
            )));
        }
        let charge = HcaCore::charge(&self.node.core, Counted::Cq)?;
        Ok(SoftCq {
            _charge: charge,
            inner: Arc::new(CqInner::new(
                self.core().id,
                init.capacity as usize,
                init.on_completion,
                init.on_async_error,
            )),
        })
    }

    /// Create a shared receive queue.
    pub fn create_srq(&self, pd: &SoftPd, init: SrqInit) -> Result<SoftSrq> {
        self.check_pd(pd)?;
        let a = &self.core().attr;
        if init.max_wr == 0 || init.max_wr > a.max_srq_wr || init.max_sge > a.max_sge {
            return Err(Error::invalid_parameter(format!(
                "SRQ sizes {init:?} out of range (max_wr 1..={}, max_sge <= {})",
                a.max_srq_wr, a.max_sge
            )));
        }
        let charge = HcaCore::charge(&self.node.core, Counted::Srq)?;
        Ok(SoftSrq {
            fabric: self.fabric.clone(),
            _charge: charge,
            inner: Arc::new(SrqInner::new(
                pd.id,
                self.node.core.clone(),
                init.max_sge as usize,
                init.max_wr as usize,
            )),
        })
    }

    /// Create an address vector.
    pub fn create_av(&self, pd: &SoftPd, attr: &AvAttr) -> Result<SoftAv> {
        self.check_pd(pd)?;
        self.core().check_av(attr, "AV")?;
        Ok(SoftAv {
            _charge: HcaCore::charge(&self.node.core, Counted::Av)?,
            attr: *attr,
            pd: pd.id,
        })
    }

    fn check_caps(&self, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<()> {
        let a = &self.core().attr;
        let c = init.caps;
        if c.max_send_wr > a.max_qp_wr
            || c.max_recv_wr > a.max_qp_wr
            || c.max_send_sge > a.max_sge
            || c.max_recv_sge > a.max_sge
        {
            return Err(Error::invalid_parameter(format!(
                "QP caps {c:?} exceed the device (max_qp_wr {}, max_sge {})",
                a.max_qp_wr, a.max_sge
            )));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn make_qp(
        &self,
        pd: &SoftPd,
        qpn: u32,
        key: u32,
        qp_type: QpType,
        gsi_port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
        charge: Charge,
    ) -> Result<SoftQp> {
        for (cq, which) in [(init.send_cq, "send"), (init.recv_cq, "receive")] {
            if cq.inner.device != self.core().id {
                return Err(Error::invalid_parameter(format!(
                    "the {which} CQ belongs to another HCA"
                )));
            }
        }
        if let Some(srq) = init.srq {
            // PD identities are unique across devices: this also refuses
            // an SRQ of another HCA.
            if srq.inner.pd != pd.id {
                return Err(Error::invalid_parameter(
                    "the SRQ belongs to another PD (or another HCA)",
                ));
            }
        }
        let inner = Arc::new(QpInner::new(
            qpn,
            qp_type,
            pd.id,
            self.node.core.clone(),
            init.send_cq.inner.clone(),
            init.recv_cq.inner.clone(),
            init.srq.map(|s| s.inner.clone()),
            init.caps,
            init.sq_sig_all,
            gsi_port,
        ));
        let mut qps = self.node.qps.write();
        if qps.contains_key(&key) {
            return Err(Error::busy(format!("port {gsi_port} already has a GSI QP")));
        }
        qps.insert(key, inner.clone());
        Ok(SoftQp {
            _charge: charge,
            inner,
            fabric: self.fabric.clone(),
            node: self.node.clone(),
            key,
        })
    }

    /// Create an RC, UC or UD queue pair (in RESET).
    pub fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<SoftQp> {
        self.check_pd(pd)?;
        if init.qp_type == QpType::Gsi {
            return Err(Error::invalid_parameter(
                "GSI QPs are created with create_gsi_qp",
            ));
        }
        self.check_caps(init)?;
        // Charged before a QP number is looked for: with at most max_qp
        // (< 2^24 - 2) QPs a free number always exists.
        let charge = HcaCore::charge(&self.node.core, Counted::Qp)?;
        let qpn = loop {
            let n = self.core().next_qpn.fetch_add(1, Ordering::Relaxed) & PSN_MASK;
            if n > 1 && !self.node.qps.read().contains_key(&n) {
                break n;
            }
        };
        self.make_qp(pd, qpn, qpn, init.qp_type, 0, init, charge)
    }

    /// Create port `port`'s GSI QP (QP1, in RESET): a UD QP that carries
    /// 256-byte MADs, accepts only Q_Key 0x80010000 and any P_Key of the
    /// port's table. One per port at a time (`ResourceBusy` otherwise).
    pub fn create_gsi_qp(
        &self,
        pd: &SoftPd,
        port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
    ) -> Result<SoftQp> {
        self.check_pd(pd)?;
        if self.core().port(port).is_none() {
            return Err(Error::NotFound(format!("port {port}").into()));
        }
        self.check_caps(init)?;
        let key = GSI_KEY | port as u32;
        let charge = HcaCore::charge(&self.node.core, Counted::Qp)?;
        self.make_qp(pd, key, key, QpType::Gsi, port, init, charge)
    }
}
