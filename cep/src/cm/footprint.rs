//! What one connection endpoint costs in host memory (`docs/scale.md`).

use al::footprint::Footprint;

use super::objects::Cep;
use super::routes::Route;
use crate::proto::{ConnId, Endpoint};

/// A CEP's bytes, by where they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CepFootprint {
    /// The access layer's object, slot and child entry.
    pub object: Footprint,
    /// The CM agent's state of the connection ([`Endpoint::connection_bytes`]).
    pub endpoint: usize,
    /// Its entry in its port's route map (comm id -> CEP), hashed at a
    /// load factor of 7/8.
    pub route: usize,
}

impl CepFootprint {
    /// All of it.
    pub fn total(&self) -> usize {
        self.object.total() + self.endpoint + self.route
    }
}

/// The footprint of a connected CEP (every one costs the same; the
/// handler it holds is the caller's `Arc`, shared or not).
pub fn cep_footprint() -> CepFootprint {
    CepFootprint {
        object: al::footprint::footprint::<Cep>(),
        endpoint: Endpoint::connection_bytes(),
        route: (std::mem::size_of::<(ConnId, Route)>() + 1) * 8 / 7,
    }
}
