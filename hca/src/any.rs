//! The device the object layer drives: one enum over every built-in
//! provider, so a CA can be opened from any of them at run time.
//!
//! Why an enum and not `dyn Device`: [`Device::post_send`] is generic over
//! the caller's AV handle type and every object type is an associated type,
//! so the trait is not object-safe; boxing each object and erasing the
//! generic would cost the soft provider's batched fast path an allocation
//! or a virtual call per request. A `match` on a two-variant enum costs a
//! predictable branch, and each arm calls the provider's own generic,
//! inlinable code (`docs/verbs.md`, "Providers at run time").
//!
//! Every object remembers the provider it came from. Handing one provider's
//! object to another provider's device (which the object layer never does:
//! children are created through their parent's device) is refused with
//! `InvalidParameter`, never a panic.
//!
//! The enums are written once, by the `providers!` macro: adding a provider is one
//! line there. A provider behind a cargo feature is written `@cfg(feature = "..")`
//! before its name, and every variant and arm of it is compiled only with the
//! feature (the `rdma` provider is).

use al::{Error, Result};

use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, PortAttr, Provider, QpAttr, QpInit,
    QpModify, RecvWr, SendWr, SrqInit, Wc,
};

fn foreign(what: &str) -> Error {
    Error::invalid_parameter(format!("the {what} belongs to another provider's device"))
}

/// Declares the enums over the providers' devices and objects and the
/// `Device` implementation that dispatches to them.
macro_rules! providers {
    ($(
        $(#[$doc:meta])*
        $(@cfg($cfg:meta))?
        $var:ident => $dev:ty {
            pd: $pd:ty, cq: $cq:ty, mr: $mr:ty, srq: $srq:ty, av: $av:ty, qp: $qp:ty $(,)?
        }
    ),+ $(,)?) => {
        /// A device of any built-in provider.
        #[derive(Clone, Debug)]
        pub enum AnyDevice { $( $(#[$doc])* $( #[cfg($cfg)] )? $var($dev), )+ }
        /// A protection domain of an [`AnyDevice`].
        pub enum AnyPd { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($pd), )+ }
        /// A completion queue of an [`AnyDevice`].
        pub enum AnyCq { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($cq), )+ }
        /// A memory region of an [`AnyDevice`].
        pub enum AnyMr { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($mr), )+ }
        /// A shared receive queue of an [`AnyDevice`].
        pub enum AnySrq { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($srq), )+ }
        /// An address vector of an [`AnyDevice`].
        pub enum AnyAv { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($av), )+ }
        /// A queue pair of an [`AnyDevice`].
        pub enum AnyQp { $( #[allow(missing_docs)] $( #[cfg($cfg)] )? $var($qp), )+ }

        $(
            $( #[cfg($cfg)] )?
            impl From<$dev> for AnyDevice {
                fn from(d: $dev) -> AnyDevice {
                    AnyDevice::$var(d)
                }
            }
        )+

        impl AnyDevice {
            /// The name of the provider the device comes from.
            pub fn provider_name(&self) -> &'static str {
                match self { $( $( #[cfg($cfg)] )? AnyDevice::$var(_) => stringify!($var), )+ }
            }
        }

        // A build with one provider leaves the mismatch arms unreachable.
        #[allow(unreachable_patterns)]
        impl Device for AnyDevice {
            type Pd = AnyPd;
            type Cq = AnyCq;
            type Mr = AnyMr;
            type Srq = AnySrq;
            type Av = AnyAv;
            type Qp = AnyQp;

            fn query(&self) -> DeviceAttr {
                match self { $( $( #[cfg($cfg)] )? AnyDevice::$var(d) => d.query(), )+ }
            }
            fn query_port(&self, port: u8) -> Result<PortAttr> {
                match self { $( $( #[cfg($cfg)] )? AnyDevice::$var(d) => d.query_port(port), )+ }
            }
            fn alloc_pd(&self) -> Result<AnyPd> {
                match self { $( $( #[cfg($cfg)] )? AnyDevice::$var(d) => d.alloc_pd().map(AnyPd::$var), )+ }
            }
            fn dealloc_pd(&self, pd: AnyPd) -> Result<()> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => d.dealloc_pd(p), )+
                    _ => Err(foreign("PD")),
                }
            }
            fn create_cq(&self, init: CqInit) -> Result<AnyCq> {
                match self { $( $( #[cfg($cfg)] )? AnyDevice::$var(d) => d.create_cq(init).map(AnyCq::$var), )+ }
            }
            fn destroy_cq(&self, cq: AnyCq) -> Result<()> {
                match (self, cq) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyCq::$var(c)) => d.destroy_cq(c), )+
                    _ => Err(foreign("CQ")),
                }
            }
            fn arm_cq(&self, cq: &AnyCq, arm: CqArm) -> Result<()> {
                match (self, cq) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyCq::$var(c)) => d.arm_cq(c, arm), )+
                    _ => Err(foreign("CQ")),
                }
            }
            #[inline]
            fn poll_cq(&self, cq: &AnyCq, out: &mut [Wc]) -> Result<usize> {
                match (self, cq) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyCq::$var(c)) => d.poll_cq(c, out), )+
                    _ => Err(foreign("CQ")),
                }
            }
            fn register_mr(
                &self,
                pd: &AnyPd,
                buf: &RegisteredBuffer,
                offset: usize,
                len: usize,
                iova: u64,
                access: Access,
            ) -> Result<AnyMr> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => d
                        .register_mr(p, buf, offset, len, iova, access)
                        .map(AnyMr::$var), )+
                    _ => Err(foreign("PD")),
                }
            }
            fn register_region(
                &self,
                pd: &AnyPd,
                region: RawRegion,
                access: Access,
            ) -> Result<AnyMr> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => {
                        d.register_region(p, region, access).map(AnyMr::$var)
                    } )+
                    _ => Err(foreign("PD")),
                }
            }
            fn mr_keys(&self, mr: &AnyMr) -> (u32, u32) {
                // Keys are the MR's own; any device reads them.
                match mr { $( $( #[cfg($cfg)] )? AnyMr::$var(m) => match self {
                    AnyDevice::$var(d) => d.mr_keys(m),
                    _ => (0, 0),
                }, )+ }
            }
            fn deregister_mr(&self, mr: AnyMr) -> Result<()> {
                match (self, mr) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyMr::$var(m)) => d.deregister_mr(m), )+
                    _ => Err(foreign("MR")),
                }
            }
            fn create_srq(&self, pd: &AnyPd, init: SrqInit) -> Result<AnySrq> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => {
                        d.create_srq(p, init).map(AnySrq::$var)
                    } )+
                    _ => Err(foreign("PD")),
                }
            }
            fn destroy_srq(&self, srq: AnySrq) -> Result<()> {
                match (self, srq) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnySrq::$var(s)) => d.destroy_srq(s), )+
                    _ => Err(foreign("SRQ")),
                }
            }
            #[inline]
            fn post_srq_recv(&self, srq: &AnySrq, wrs: &[RecvWr<'_>]) -> Result<()> {
                match (self, srq) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnySrq::$var(s)) => d.post_srq_recv(s, wrs), )+
                    _ => Err(foreign("SRQ")),
                }
            }
            fn create_av(&self, pd: &AnyPd, attr: &AvAttr) -> Result<AnyAv> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => {
                        d.create_av(p, attr).map(AnyAv::$var)
                    } )+
                    _ => Err(foreign("PD")),
                }
            }
            fn destroy_av(&self, av: AnyAv) -> Result<()> {
                match (self, av) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyAv::$var(a)) => d.destroy_av(a), )+
                    _ => Err(foreign("AV")),
                }
            }
            fn create_qp(
                &self,
                pd: &AnyPd,
                init: &QpInit<'_, AnyCq, AnySrq>,
            ) -> Result<AnyQp> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => {
                        let init = qp_init!($var, init)?;
                        d.create_qp(p, &init).map(AnyQp::$var)
                    } )+
                    _ => Err(foreign("PD")),
                }
            }
            fn create_gsi_qp(
                &self,
                pd: &AnyPd,
                port: u8,
                init: &QpInit<'_, AnyCq, AnySrq>,
            ) -> Result<AnyQp> {
                match (self, pd) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyPd::$var(p)) => {
                        let init = qp_init!($var, init)?;
                        d.create_gsi_qp(p, port, &init).map(AnyQp::$var)
                    } )+
                    _ => Err(foreign("PD")),
                }
            }
            fn qp_num(&self, qp: &AnyQp) -> u32 {
                match qp { $( $( #[cfg($cfg)] )? AnyQp::$var(q) => match self {
                    AnyDevice::$var(d) => d.qp_num(q),
                    _ => 0,
                }, )+ }
            }
            fn modify_qp(&self, qp: &AnyQp, m: &QpModify) -> Result<()> {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.modify_qp(q, m), )+
                    _ => Err(foreign("QP")),
                }
            }
            fn query_qp(&self, qp: &AnyQp) -> Result<QpAttr> {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.query_qp(q), )+
                    _ => Err(foreign("QP")),
                }
            }
            fn qp_footprint(&self, qp: &AnyQp) -> usize {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.qp_footprint(q), )+
                    _ => 0,
                }
            }
            fn destroy_qp(&self, qp: AnyQp) -> Result<()> {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.destroy_qp(q), )+
                    _ => Err(foreign("QP")),
                }
            }
            #[inline]
            fn post_send<'v, H>(
                &self,
                qp: &AnyQp,
                wrs: &[SendWr<'_, H>],
                av_of: &dyn Fn(usize) -> Option<&'v AnyAv>,
            ) -> Result<()> {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.post_send(q, wrs, &|i| {
                        // Another provider's AV resolves to none: the
                        // request fails as one without a destination.
                        match av_of(i) {
                            Some(AnyAv::$var(a)) => Some(a),
                            _ => None,
                        }
                    }), )+
                    _ => Err(foreign("QP")),
                }
            }
            #[inline]
            fn post_recv(&self, qp: &AnyQp, wrs: &[RecvWr<'_>]) -> Result<()> {
                match (self, qp) {
                    $( $( #[cfg($cfg)] )? (AnyDevice::$var(d), AnyQp::$var(q)) => d.post_recv(q, wrs), )+
                    _ => Err(foreign("QP")),
                }
            }
        }
    };
}

/// Rebuilds a `QpInit` over one provider's queues, or fails when a queue
/// belongs to another provider.
macro_rules! qp_init {
    ($var:ident, $init:expr) => {{
        let init = $init;
        #[allow(unreachable_patterns)]
        match (init.send_cq, init.recv_cq, init.srq) {
            (AnyCq::$var(send_cq), AnyCq::$var(recv_cq), None) => Ok(QpInit {
                qp_type: init.qp_type,
                send_cq,
                recv_cq,
                srq: None,
                caps: init.caps,
                sq_sig_all: init.sq_sig_all,
            }),
            (AnyCq::$var(send_cq), AnyCq::$var(recv_cq), Some(AnySrq::$var(srq))) => Ok(QpInit {
                qp_type: init.qp_type,
                send_cq,
                recv_cq,
                srq: Some(srq),
                caps: init.caps,
                sq_sig_all: init.sq_sig_all,
            }),
            (AnyCq::$var(_), AnyCq::$var(_), Some(_)) => Err(foreign("SRQ")),
            _ => Err(foreign("CQ")),
        }
    }};
}

providers! {
    /// The embedded soft provider (an in-process fabric).
    Soft => soft_provider::SoftHca {
        pd: soft_provider::SoftPd,
        cq: soft_provider::SoftCq,
        mr: soft_provider::SoftMr,
        srq: soft_provider::SoftSrq,
        av: soft_provider::SoftAv,
        qp: soft_provider::SoftQp,
    },
    /// The RoCEv2-over-UDP provider (crate `roce-provider`).
    Roce => roce_provider::RoceDevice {
        pd: roce_provider::RocePd,
        cq: roce_provider::RoceCq,
        mr: roce_provider::RoceMr,
        srq: roce_provider::RoceSrq,
        av: roce_provider::RoceAv,
        qp: roce_provider::RoceQp,
    },
    /// Hardware (and Linux rxe/siw) devices through libibverbs (crate
    /// `rdma-provider`, feature `rdma`): every verbs object, through
    /// libibverbs.
    @cfg(feature = "rdma")
    Rdma => rdma_provider::RdmaDevice {
        pd: rdma_provider::RdmaPd,
        cq: rdma_provider::RdmaCq,
        mr: rdma_provider::RdmaMr,
        srq: rdma_provider::RdmaSrq,
        av: rdma_provider::RdmaAv,
        qp: rdma_provider::RdmaQp,
    },
}

impl AnyDevice {
    /// Whether the project's own CM agent may run on this device: it needs
    /// the device's QP1. On an rdma device QP1 belongs to the kernel, so
    /// connections go through librdmacm instead (`ibal::rdma::cm`). Asked
    /// by the CM before anything else, so that such a call fails with this
    /// reason rather than a later, less telling one.
    pub fn check_own_qp1(&self) -> Result<()> {
        #[cfg(feature = "rdma")]
        if matches!(self, AnyDevice::Rdma(_)) {
            return Err(Error::Unsupported(
                "QP1 belongs to the kernel on an rdma CA, so the project's CM cannot run there: \
                 connect and listen through librdmacm (ibal::rdma::cm, crate cep-rdmacm)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Identifies this device among the open devices of the process: two
    /// handles to one device answer the same. Stable while any handle to
    /// the device lives.
    pub fn instance_key(&self) -> usize {
        match self {
            AnyDevice::Soft(d) => d.instance_key(),
            AnyDevice::Roce(d) => d.instance_key(),
            #[cfg(feature = "rdma")]
            AnyDevice::Rdma(d) => d.instance_key(),
        }
    }
}

/// A provider whose devices the object layer can drive: any [`Provider`]
/// whose device converts into an [`AnyDevice`].
pub trait AnyProvider {
    /// Opens the device with node GUID `guid`.
    fn open_any(&self, guid: u64) -> Result<AnyDevice>;
}

impl<P> AnyProvider for P
where
    P: Provider,
    P::Device: Into<AnyDevice>,
{
    fn open_any(&self, guid: u64) -> Result<AnyDevice> {
        self.open(guid).map(Into::into)
    }
}
