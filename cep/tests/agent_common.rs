//! Helpers shared by the `agent_*` tests (included with `#[path]`; as a
//! test target of its own it has no tests).
#![allow(dead_code)]

use cep::agent::{AgentConfig, CmAgent};
use cep::proto::{ConnectParams, Event, IdKey, Nanos};
use cep::wire::{PathInfo, Rep, Req};
use soft_provider::{Fabric, HcaConfig, SoftHca};

pub type Agent = CmAgent<SoftHca>;

pub const SVC: u64 = 0x1000_0000_0000_0001;
/// PacketLifeTime 10 (4.2 ms), so timewait is about 9.4 ms.
pub const PLT: u8 = 10;
/// Response timeout 12 (16.8 ms).
pub const RESP: u8 = 12;
pub const RETRIES: u8 = 3;
pub const TAD: u8 = 8;
pub const MS: u64 = 1_000_000;

pub const GUID_A: u64 = 0xA0;
pub const GUID_B: u64 = 0xB0;

/// Two soft HCAs (LIDs 1 and 2) on one fabric, one agent on each port 1,
/// with fixed comm id keys: the ids, and so the order of timers that fall
/// due together, are the same every run, so a seeded faulty fabric gives
/// the same run every time.
pub fn pair() -> (Fabric, Agent, Agent) {
    let key = |guid| AgentConfig {
        id_key: Some(IdKey::fixed(guid, 0x1d)),
        ..AgentConfig::default()
    };
    pair_with(key(GUID_A), key(GUID_B))
}

/// [`pair`] with the agents configured by `a` and `b`.
pub fn pair_with(a: AgentConfig, b: AgentConfig) -> (Fabric, Agent, Agent) {
    let f = Fabric::new();
    let ha = f.add_hca(HcaConfig::new(GUID_A, &[1])).unwrap();
    let hb = f.add_hca(HcaConfig::new(GUID_B, &[2])).unwrap();
    let a = CmAgent::new(ha, 1, a).unwrap();
    let b = CmAgent::new(hb, 1, b).unwrap();
    (f, a, b)
}

pub fn req_for(service_id: u64, qpn: u32, from: &Agent, to: &Agent) -> Req {
    Req {
        service_id,
        local_qpn: qpn,
        local_qkey: 0x1111,
        starting_psn: 0x100,
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: RESP,
        local_cm_response_timeout: RESP,
        max_cm_retries: RETRIES,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 5,
        primary_path: PathInfo {
            local_lid: from.local_addr().lid,
            remote_lid: to.local_addr().lid,
            local_ack_timeout: PLT + 1,
            ..PathInfo::default()
        },
        ..Req::default()
    }
}

pub fn connect_params(from: &Agent, to: &Agent, service_id: u64, qpn: u32) -> ConnectParams {
    ConnectParams::new(to.local_addr(), req_for(service_id, qpn, from, to))
}

pub fn rep_for(qpn: u32) -> Rep {
    Rep {
        local_qpn: qpn,
        starting_psn: 0x200,
        target_ack_delay: TAD,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        ..Rep::default()
    }
}

/// Polls every agent at `now` and returns their queued events.
pub fn poll_all(now: Nanos, agents: &[&Agent]) -> Vec<Vec<Event>> {
    agents
        .iter()
        .map(|a| {
            a.poll(now).unwrap();
            a.check_invariants().unwrap();
            a.drain_events()
        })
        .collect()
}
