//! The responder's state ([`Responder`]): the expected PSN and MSN, the
//! message being received, the receive queue, the answers waiting to be
//! sent (coalesced ACKs, NAKs, READ responses, atomic ACKs) and the replay
//! cache of `max_dest_rd_atomic` entries (IBTA vol. 1 §9.7.5.1.2,
//! "responder resources").

use std::collections::VecDeque;

use roce::Syndrome;

use crate::config::Config;
use crate::wqe::RecvWqe;

/// Credit count sent in ACKs: "no credit information" (end-to-end flow
/// control is not implemented, IBTA §9.7.7.2).
pub(crate) const NO_CREDITS: u8 = Syndrome::INVALID_CREDITS;

/// A message being received (multi-packet SEND or WRITE).
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u32,
    },
    Write {
        rkey: u32,
        va: u64,
        offset: u32,
        total: u32,
    },
}

/// An answer waiting to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    /// ACK, RNR NAK or NAK of `psn`.
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
    },
    /// READ response packets `next..npkts` of a READ at `first_psn`
    /// (the point a resumed READ asked for), part of the READ first
    /// executed at `origin`.
    Read {
        first_psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
        next: u32,
        npkts: u32,
        msn: u32,
        origin: u32,
        replay: bool,
    },
    /// Atomic ACK of `psn` with the original value.
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
        replay: bool,
    },
}

impl Job {
    /// Whether this job answers a duplicate request from the replay
    /// cache (`Some(true)`), a request executed now (`Some(false)`), or
    /// is an ACK (`None`).
    pub(crate) fn replay(&self) -> Option<bool> {
        match *self {
            Job::Ack { .. } => None,
            Job::Read { replay, .. } | Job::Atomic { replay, .. } => Some(replay),
        }
    }
}

/// A READ or atomic served, kept to answer its duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    Read {
        first_psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
        npkts: u32,
        msn: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
    },
}

/// Responder state.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: u32,
    /// Messages completed (24 bits).
    pub msn: u32,
    /// A PSN sequence NAK (or RNR NAK) was sent for the current gap.
    pub nak_sent: bool,
    /// UC: drop packets until the next first/only.
    pub uc_dropping: bool,
    pub cur: Option<InMsg>,
    pub rq: VecDeque<RecvWqe>,
    pub out: VecDeque<Job>,
    pub replay: VecDeque<Replay>,
    /// READ/atomic jobs in `out` for requests executed (not replays):
    /// a requester within its `max_rd_atomic` never has more than
    /// `resources` of these waiting, since each is a READ or atomic it has
    /// not had the whole answer to.
    pub rd_jobs: usize,
    /// Jobs in `out` that answer duplicates from the replay cache: at most
    /// one per cached request, so at most `resources`. They are not
    /// counted against the requester's limit: a late duplicate may be
    /// replayed after the requester has its answer and moved on.
    pub replay_jobs: usize,
    /// Size of the replay cache and of the READ/atomic job limit
    /// (`max_dest_rd_atomic`; 0: READs and atomics are refused).
    pub resources: usize,
}

impl Responder {
    pub(crate) fn new(cfg: &Config) -> Responder {
        Responder {
            epsn: cfg.rq_psn,
            msn: 0,
            nak_sent: false,
            uc_dropping: false,
            cur: None,
            rq: VecDeque::new(),
            out: VecDeque::new(),
            replay: VecDeque::new(),
            rd_jobs: 0,
            replay_jobs: 0,
            // 0 is none (IBTA): every READ and atomic is then NAKed as an
            // invalid request, as a responder that offered no resources.
            resources: usize::from(cfg.max_dest_rd_atomic),
        }
    }

    pub(crate) fn take_current_recv(&mut self) -> Option<RecvWqe> {
        match self.cur.take() {
            Some(InMsg::Send { wqe, .. }) => Some(wqe),
            _ => None,
        }
    }

    /// Queues an ACK of `psn`, merged with a queued ACK just before it.
    pub(crate) fn ack(&mut self, psn: u32) {
        let msn = self.msn;
        if let Some(Job::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.out.back_mut()
        {
            *p = psn;
            *m = msn;
            return;
        }
        self.out.push_back(Job::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credits: NO_CREDITS,
            },
            msn,
        });
    }

    pub(crate) fn nak(&mut self, psn: u32, syndrome: Syndrome) {
        let msn = self.msn;
        self.out.push_back(Job::Ack { psn, syndrome, msn });
    }

    /// Takes a READ/atomic job out of the counts when it leaves `out`.
    pub(crate) fn job_done(&mut self, job: &Job) {
        match job.replay() {
            Some(false) => self.rd_jobs = self.rd_jobs.saturating_sub(1),
            Some(true) => self.replay_jobs = self.replay_jobs.saturating_sub(1),
            None => {}
        }
    }

    /// Queues a replay of a cached READ or atomic. A job already queued
    /// for the same request is restarted at the point the duplicate asks
    /// for, as rxe does with its responder resource, rather than queued
    /// twice; otherwise a new job is queued if fewer than `resources`
    /// replays wait. Returns false when the duplicate is dropped.
    pub(crate) fn replay_job(&mut self, job: Job) -> bool {
        let same = |queued: &Job| match (queued, &job) {
            (Job::Read { origin: a, .. }, Job::Read { origin: b, .. }) => a == b,
            (Job::Atomic { psn: a, .. }, Job::Atomic { psn: b, .. }) => a == b,
            _ => false,
        };
        if let Some(queued) = self.out.iter_mut().find(|q| same(q)) {
            if let (Job::Read { replay: was, .. }, Job::Read { .. }) = (*queued, job) {
                // Restarted in its place (PSN order holds); it keeps the
                // count it was queued under.
                *queued = job;
                if let Job::Read { replay, .. } = queued {
                    *replay = was;
                }
            }
            // An atomic's answer is the same value: the queued one serves.
            return true;
        }
        if self.replay_jobs >= self.resources {
            return false;
        }
        self.replay_jobs += 1;
        self.out.push_back(job);
        true
    }

    pub(crate) fn remember(&mut self, r: Replay) {
        if self.replay.len() >= self.resources {
            self.replay.pop_front();
        }
        self.replay.push_back(r);
    }
}
