//! The device's limits on PDs, CQs, SRQs and AVs: what exists now, and an
//! object's place in its limit ([`Charge`]), given back when it drops.

use al::sync::atomic::{AtomicU32, Ordering};
use al::sync::Arc;

use al::{Error, Result};
use provider::DeviceAttr;

/// Which limit a [`Charge`] counts against.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Pd = 0,
    Cq = 1,
    Srq = 2,
    Av = 3,
}

/// PDs, CQs, SRQs and AVs that exist now (against their limits).
#[derive(Default)]
pub(crate) struct Usage([Arc<AtomicU32>; 4]);

impl Usage {
    /// Take one place of `kind`'s limit in `attr` (`InsufficientResources`
    /// when none is left).
    pub(crate) fn charge(&self, attr: &DeviceAttr, kind: Kind) -> Result<Charge> {
        let (max, what) = match kind {
            Kind::Pd => (attr.max_pd, "max_pd"),
            Kind::Cq => (attr.max_cq, "max_cq"),
            Kind::Srq => (attr.max_srq, "max_srq"),
            Kind::Av => (attr.max_av, "max_av"),
        };
        let c = &self.0[kind as usize];
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .map_err(|_| {
            Error::insufficient_resources(format!("{what} reached: the device allows {max}"))
        })?;
        Ok(Charge(c.clone()))
    }
}

/// An object's place in its device's limit, given back on drop.
pub(crate) struct Charge(Arc<AtomicU32>);

impl Drop for Charge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Charge")
    }
}
