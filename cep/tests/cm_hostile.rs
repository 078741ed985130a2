//! Hostile and random input to the CM's public API: forged, stale and
//! mistyped handles to every call, and random connect and accept
//! parameters. Every call answers with a clear error or does what it says;
//! nothing panics, and nothing is left behind (no CEP, no route, no
//! binding). Issue 12, defect classes 1, 2 and 5, from the outside.

use std::sync::{Arc as StdArc, Mutex as StdMutex};

use al::{Al, Error, Handle, Kind, RawHandle};
use cep::cm::{self, AcceptReply, Cep, CmHandler, CmPort, ConnectRequest, ListenHandler};
use cep::proto::{LapParams, SidrReplyParams};
use cep::wire::{ApStatus, RejectReason};
use proptest::prelude::*;
use qp::{CidState, Qp};

mod cm_world;
use cm_world::{new_qp, provider, side, wait, SERVICE};

fn ignore() -> CmHandler {
    StdArc::new(|_, _| {})
}

/// Handles no live CEP has: never issued, of another kind, forged with a
/// wrong generation, and one whose CEP is gone.
fn bad_cep_handles(stale: Handle<Cep>) -> Vec<Handle<Cep>> {
    let some_qp_like = RawHandle::new(Kind::QP, 0, 0);
    vec![
        Handle::from_raw(RawHandle::from_u64(0)),
        Handle::from_raw(RawHandle::from_u64(u64::MAX)),
        Handle::from_raw(some_qp_like),
        Handle::from_raw(RawHandle::new(Kind::CEP, 1_000, 12_345)),
        Handle::from_raw(RawHandle::from_u64(0x0123_4567_89ab_cdef)),
        stale,
    ]
}

#[test]
fn every_call_refuses_bad_cep_handles() {
    let al = Al::open().unwrap();
    let p = provider();
    let a = side(&al, &p, 0xa000);
    let _b = side(&al, &p, 0xb000);
    // A stale handle: a CEP that ended (no listener: REJ, released).
    let stale = cm::connect(
        al.instance(),
        a.qp,
        &ConnectRequest::new(SERVICE, 2),
        ignore(),
    )
    .unwrap();
    wait("the rejected CEP to go", || al.resolve(stale).is_err());
    let inst = al.instance();
    for h in bad_cep_handles(stale) {
        let results = [
            cm::accept(inst, h, a.qp, &AcceptReply::default()).err(),
            cm::rtu(inst, h, b"x").err(),
            cm::reject(inst, h, RejectReason::ConsumerReject, b"x").err(),
            cm::mra(inst, h, 10, b"x").err(),
            cm::disconnect(inst, h, b"x").err(),
            cm::disconnect_reply(inst, h, b"x").err(),
            cm::lap(
                inst,
                h,
                LapParams {
                    alternate_path: Default::default(),
                    private_data: Default::default(),
                },
            )
            .err(),
            cm::apr(inst, h, ApStatus::Success, b"x").err(),
            cm::sidr_reply(inst, h, SidrReplyParams::default()).err(),
            al.destroy(h, None).err(),
        ];
        for (i, r) in results.into_iter().enumerate() {
            let e = r.unwrap_or_else(|| panic!("call {i} accepted {h:?}"));
            assert!(
                matches!(e, Error::InvalidHandle { .. } | Error::Destroying { .. }),
                "call {i} on {h:?}: {e:?}"
            );
        }
    }
    // Bad QP, CA and port handles.
    let bad_qp: Handle<Qp> = Handle::from_raw(RawHandle::new(Kind::QP, 77, 3));
    let e = cm::connect(inst, bad_qp, &ConnectRequest::new(SERVICE, 2), ignore()).unwrap_err();
    assert!(matches!(e, Error::InvalidHandle { .. }), "{e:?}");
    let bad_port: Handle<CmPort> = Handle::from_raw(RawHandle::new(Kind::CM_PORT, 5, 9));
    assert!(cm::poll(inst, bad_port).is_err());
    assert_eq!(al.resolve(a.qp).unwrap().cid().load(), CidState::Unbound);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// The CM request fields the IBTA bounds, and the private data size.
#[derive(Clone, Debug)]
struct ConnectFields {
    retry_count: u8,
    rnr_retry_count: u8,
    max_cm_retries: u8,
    local_ack_timeout: u8,
    cm_response_timeout: u8,
    private_data: usize,
}

fn connect_fields() -> impl Strategy<Value = ConnectFields> {
    // Mostly near the bounds, sometimes anywhere.
    let near = |max: u8| prop_oneof![0..=max.saturating_add(2), any::<u8>()];
    (
        near(7),
        near(7),
        near(15),
        near(31),
        near(31),
        prop_oneof![0usize..=94, 0usize..=300],
    )
        .prop_map(|(rc, rnr, cmr, ack, resp, pd)| ConnectFields {
            retry_count: rc,
            rnr_retry_count: rnr,
            max_cm_retries: cmr,
            local_ack_timeout: ack,
            cm_response_timeout: resp,
            private_data: pd,
        })
}

impl ConnectFields {
    fn in_bounds(&self) -> bool {
        self.retry_count <= 7
            && self.rnr_retry_count <= 7
            && self.max_cm_retries <= 15
            && self.local_ack_timeout <= 31
            && self.cm_response_timeout <= 31
            && self.private_data <= 92
    }

    fn request(&self) -> ConnectRequest {
        let mut r = ConnectRequest::new(SERVICE, 2);
        r.retry_count = self.retry_count;
        r.rnr_retry_count = self.rnr_retry_count;
        r.max_cm_retries = self.max_cm_retries;
        r.local_ack_timeout = self.local_ack_timeout;
        r.cm_response_timeout = self.cm_response_timeout;
        r.private_data = vec![0x5a; self.private_data];
        r
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// connect sends exactly the requests whose fields are in bounds and
    /// refuses the others with `InvalidParameter`, leaving the QP unbound.
    #[test]
    fn connect_refuses_exactly_the_out_of_bound_requests(
        fields in proptest::collection::vec(connect_fields(), 1..6)
    ) {
        let al = Al::open().unwrap();
        let p = provider();
        let a = side(&al, &p, 0xa000);
        let _b = side(&al, &p, 0xb000);
        for f in &fields {
            let qp = new_qp(&al, a.pd, a.cq);
            match cm::connect(al.instance(), qp, &f.request(), ignore()) {
                Ok(_) => prop_assert!(f.in_bounds(), "{f:?} was sent"),
                Err(e) => {
                    prop_assert!(!f.in_bounds(), "{f:?} refused: {e:?}");
                    prop_assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
                    prop_assert_eq!(al.resolve(qp).unwrap().cid().load(), CidState::Unbound);
                }
            }
            // QP destroy ends whatever CEP it bound.
            al.destroy(qp, None).unwrap();
        }
        wait("every CEP to go", || al.stats().live(Kind::CEP) == 0);
        let stats = al.close().unwrap();
        prop_assert!(stats.is_clean(), "{}", stats);
    }

    /// accept with random reply fields: in bounds it connects, out of
    /// bounds it fails with `InvalidParameter` and changes nothing (the
    /// same request is then accepted with a valid reply).
    #[test]
    fn accept_refuses_out_of_bound_replies_and_changes_nothing(
        target_ack_delay in prop_oneof![0u8..=33, any::<u8>()],
        rnr_retry_count in prop_oneof![0u8..=9, any::<u8>()],
        private_data in prop_oneof![0usize..=198, 0usize..=400],
    ) {
        let al = Al::open().unwrap();
        let p = provider();
        let a = side(&al, &p, 0xa000);
        let b = side(&al, &p, 0xb000);
        let requests = StdArc::new(StdMutex::new(Vec::new()));
        let r = requests.clone();
        let on_request: ListenHandler = StdArc::new(move |_l, cep, _ev| r.lock().unwrap().push(cep));
        cm::listen(al.instance(), b.ca, 1, SERVICE, on_request, ignore()).unwrap();
        cm::connect(al.instance(), a.qp, &ConnectRequest::new(SERVICE, 2), ignore()).unwrap();
        wait("the request", || !requests.lock().unwrap().is_empty());
        let passive = requests.lock().unwrap()[0];
        let reply = AcceptReply {
            target_ack_delay,
            rnr_retry_count,
            private_data: vec![0xa5; private_data],
            ..AcceptReply::default()
        };
        let in_bounds = target_ack_delay <= 31 && rnr_retry_count <= 7 && private_data <= 196;
        match cm::accept(al.instance(), passive, b.qp, &reply) {
            Ok(()) => prop_assert!(in_bounds),
            Err(e) => {
                prop_assert!(!in_bounds, "refused: {e:?}");
                prop_assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
                prop_assert_eq!(al.resolve(b.qp).unwrap().cid().load(), CidState::Unbound);
                cm::accept(al.instance(), passive, b.qp, &AcceptReply::default()).unwrap();
            }
        }
        prop_assert_eq!(
            al.resolve(b.qp).unwrap().cid().load(),
            CidState::Bound(passive.raw())
        );
        let stats = al.close().unwrap();
        prop_assert!(stats.is_clean(), "{}", stats);
    }
}
