//! Time: firing due timers, retrying the request a CEP is waiting on,
//! giving up when the retries are spent, ending a request nobody answered
//! (the answer deadline), and ending TIMEWAIT. `docs/cm-protocol.md`,
//! "Timers".

use super::{trace, Endpoint};
use crate::proto::{ConnId, DisconnectCause, Event, Nanos, State, TimedOut};
use crate::wire::{MessageRejected, PrivateData, RejectReason};

impl Endpoint {
    /// Fires every timer whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, id));
            if let Some(c) = self.conns.get_mut(id) {
                c.timer = None;
            }
            self.on_timer(now, id);
        }
        self.pace(now);
    }

    /// Resends the request being retried if retries are left. Returns false
    /// when the retries are exhausted.
    fn retry(&mut self, now: Nanos, id: u32, state: State) -> bool {
        let Some(c) = self.conns.get_mut(id) else {
            return true;
        };
        let Some(mad) = c.resend.as_deref().copied() else {
            return false;
        };
        if c.retries_left == 0 {
            return false;
        }
        c.retries_left -= 1;
        c.enter(state);
        let used = c.max_retries - c.retries_left;
        let at = now.saturating_add(c.response_wait());
        trace::resend(id, c.peer, mad.message_kind(), used, c.max_retries);
        self.resends.count(state, used);
        self.set_timer(id, at);
        self.send_for(id, mad);
        true
    }

    fn on_timer(&mut self, now: Nanos, id: u32) {
        let Some(state) = self.state(ConnId(id)) else {
            return;
        };
        let retry_state = match state {
            State::ReqRcvd | State::MraReqSent | State::SidrReqRcvd => {
                self.answer_timed_out(now, id, state);
                return;
            }
            State::ReqSent | State::MraReqRcvd => State::ReqSent,
            State::RepSent | State::MraRepRcvd => State::RepSent,
            State::LapSent | State::MraLapRcvd => State::LapSent,
            State::DreqSent | State::SidrReqSent => state,
            State::Timewait => {
                self.free(id);
                return;
            }
            // No other state arms a timer (check_invariants); nothing to do.
            _ => return,
        };
        if self.retry(now, id, retry_state) {
            return;
        }
        // Retries exhausted.
        let conn = ConnId(id);
        match retry_state {
            State::ReqSent | State::RepSent => {
                let message = if retry_state == State::ReqSent {
                    TimedOut::Req
                } else {
                    TimedOut::Rep
                };
                self.emit(Event::Timeout { conn, message });
                self.reject_and_timewait(
                    now,
                    id,
                    RejectReason::Timeout,
                    MessageRejected::Other,
                    PrivateData::zeroed(),
                );
            }
            State::LapSent => {
                self.end_request(id);
                if let Some(c) = self.conns.get_mut(id) {
                    c.resend = None;
                    c.enter(State::Established);
                }
                self.emit(Event::Timeout {
                    conn,
                    message: TimedOut::Lap,
                });
            }
            State::DreqSent => {
                self.emit(Event::Disconnected {
                    conn,
                    cause: DisconnectCause::DreqTimeout,
                    drep: None,
                });
                self.enter_timewait(now, id);
            }
            _ => {
                self.emit(Event::Timeout {
                    conn,
                    message: TimedOut::SidrReq,
                });
                self.free(id);
            }
        }
    }

    /// A received request nobody answered in time (the peer has given up):
    /// REJ(Timeout) and TIMEWAIT for a REQ; a SIDR CEP is simply freed (a
    /// SIDR requester needs no answer to stop).
    fn answer_timed_out(&mut self, now: Nanos, id: u32, state: State) {
        let conn = ConnId(id);
        self.emit(Event::Timeout {
            conn,
            message: TimedOut::Answer,
        });
        if state == State::SidrReqRcvd {
            self.free(id);
        } else {
            self.reject_and_timewait(
                now,
                id,
                RejectReason::Timeout,
                MessageRejected::Req,
                PrivateData::zeroed(),
            );
        }
    }
}
