//! `ibal stress`: many threads doing random connect, accept, reject,
//! disconnect, QP destroy, CA close and AL close on the soft fabric, with
//! fault injection on the CM traffic; then a leak and invariant check.
//!
//! The fabric has [`StressConfig::hcas`] soft HCAs (one port each). Each
//! worker thread owns one or two AL instances at a time and, driven by its
//! own seeded xorshift generator, picks among: open/close an AL, open a CA
//! (and attach the CM to it), close a CA (cascade), allocate/destroy PDs,
//! CQs, QPs and MRs, listen on a service / cancel it, connect a QP to a
//! service of any HCA, accept or reject a pending request, disconnect, and
//! destroy a CEP. The CM callbacks answer at random too: a listen accepts
//! (on a QP of its AL on its HCA), rejects, sends an MRA or leaves the
//! request for the worker; the active side mostly sends the RTU; DREQs are
//! mostly answered. A ticker thread calls [`Fabric::progress`](ibal::verbs::Fabric::progress), which is the
//! only way faulted (queued) MADs are delivered.
//!
//! Every destroy the run issues carries a destroy callback that counts its
//! calls. At the end every AL is closed and the run fails when:
//! * an AL still has live objects after close (`Stats::is_clean`), or close
//!   did not finish within [`CLOSE_LIMIT`];
//! * a destroy callback ran twice, or not at all;
//! * a CEP got an event after its `Released`, or two `Released`;
//! * a callback panicked (executor counts, or the run's own handlers), or a
//!   library call panicked on a worker thread;
//! * a call failed with an error that is not one of those it documents for
//!   that operation ([`Op::allows`]);
//! * the CM agents did not all shut down (`cep::cm::active_ports`);
//! * a double accept had two winners, or a loser changed its QP or named
//!   a live CEP gone; an accept on an active CEP did not fail with
//!   `InvalidState` or moved its QP's binding;
//! * a SIDR request had no end (reply or timeout), two ends, or its CEP
//!   outlived its `Released`;
//! * a QP's CID slot stayed bound to a CEP that is gone;
//! * a CM port still routed anything but the static listens, or held a
//!   connection or a comm id, once every worker AL was closed;
//! * with [`StressConfig::population`], a held connection the churn
//!   disturbed (not ESTABLISHED with RTS QPs on both sides at the end, or
//!   an ending event while held), or one that never came up or went down.
//!
//! `docs/stress.md` has the details and a recorded run.
//!
//! Files: `ops` (the calls and the errors each documents), `checker` (shared
//! run state and checks), `population` (the held connections), `ctx` (one AL's objects and its CM handlers),
//! `workers` (the random actions), `report` (the summary), `run` (setup,
//! the end of the run and its leak checks).
//!
//! Below them: `config` (the settings), `hcas` (the HCAs, their services
//! and the shared RoCE provider), `rng` (the generators). Each file imports
//! only the files below it; this one declares and re-exports.

mod checker;
mod config;
mod ctx;
mod hcas;
mod ops;
mod population;
mod report;
mod rng;
mod run;
mod workers;

pub use checker::Checker;
pub use config::{StressConfig, CLOSE_LIMIT};
pub use hcas::{
    fabric, gid_of_hca, lid, node_guid, service_id, udp_addr, AnyShared, SharedRoce, Transport,
    SERVICES_PER_HCA,
};
pub use ops::{error_name, says_cep_gone, Op};
pub use population::{population_service, PopulationReport, IN_FLIGHT, QUEUE_DEPTH, STALL_LIMIT};
pub use report::StressReport;
pub use rng::{mix, XorShift};
pub use run::{main, main_on, run, run_on};
pub use workers::STUCK_LIMIT;
