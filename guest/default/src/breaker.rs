//! A per-server circuit breaker over tool-call transport failures.
//!
//! Closed -> (threshold consecutive failures) -> Open -> (cooldown, computed lazily) -> HalfOpen
//! -> one probe -> Closed (answered) or Open with a doubled cooldown (failed).

use serde::{Deserialize, Serialize};

use crate::model::{BreakerState, Millis};
use crate::settings::BreakerSettings;

/// The single call (or reconnect) allowed through a half-open breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// A tool call, by the host's call id.
    Call(u64),
    /// No live session was there to probe: a reconnect was signalled instead.
    Reconnect,
}

/// Why the breaker is open (for the words to the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenReason {
    /// This many consecutive transport failures.
    Failures(u32),
    /// The half-open probe call failed.
    ProbeFailed,
    /// The reconnect signalled instead of a probe failed.
    ReconnectFailed,
}

/// A change worth reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened { for_ms: Millis, reason: OpenReason },
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    pub state: BreakerState,
    /// Consecutive transport failures.
    pub failures: u32,
    /// While open: when it turns half-open.
    pub open_until: Millis,
    /// Length of the latest opening; 0 when none since the last close (next opening uses
    /// `open_ms`, each re-open doubles it).
    pub last_open_ms: Millis,
    pub reason: OpenReason,
    pub probe: Option<Probe>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: BreakerState::Closed,
            failures: 0,
            open_until: 0,
            last_open_ms: 0,
            reason: OpenReason::Failures(0),
            probe: None,
        }
    }
}

impl Breaker {
    /// A fresh session closes the breaker on every transport, growth included.
    pub fn reset(&mut self) {
        *self = Breaker::default();
    }

    /// The call was answered (ok or tool error): the transport works.
    pub fn on_answer(&mut self, call_id: u64) -> Option<Transition> {
        self.failures = 0;
        if self.state == BreakerState::HalfOpen && self.probe == Some(Probe::Call(call_id)) {
            self.reset();
            return Some(Transition::Closed);
        }
        None
    }

    /// The call was cancelled by its agent: if it was the probe, another call may probe.
    pub fn on_cancelled(&mut self, call_id: u64) {
        if self.state == BreakerState::HalfOpen && self.probe == Some(Probe::Call(call_id)) {
            self.probe = None;
        }
    }

    /// The call failed in transport or timed out.
    pub fn on_failure(
        &mut self,
        now: Millis,
        call_id: u64,
        settings: &BreakerSettings,
    ) -> Option<Transition> {
        self.failures = self.failures.saturating_add(1);
        match self.state {
            BreakerState::Closed if self.failures >= settings.failure_threshold => {
                Some(self.open(now, settings, OpenReason::Failures(self.failures)))
            }
            BreakerState::HalfOpen if self.probe == Some(Probe::Call(call_id)) => {
                Some(self.open(now, settings, OpenReason::ProbeFailed))
            }
            // Late reports of calls admitted before the breaker opened change nothing.
            _ => None,
        }
    }

    /// A connection attempt failed; if it was the reconnect signalled in place of a probe, the
    /// breaker re-opens as if the probe had failed.
    pub fn on_connect_failed(
        &mut self,
        now: Millis,
        settings: &BreakerSettings,
    ) -> Option<Transition> {
        if self.state == BreakerState::HalfOpen && self.probe == Some(Probe::Reconnect) {
            return Some(self.open(now, settings, OpenReason::ReconnectFailed));
        }
        None
    }

    fn open(&mut self, now: Millis, settings: &BreakerSettings, reason: OpenReason) -> Transition {
        let for_ms = if self.last_open_ms == 0 {
            settings.open_ms
        } else {
            self.last_open_ms
                .saturating_mul(2)
                .clamp(settings.open_ms, settings.open_max_ms)
        };
        self.state = BreakerState::Open;
        self.open_until = now.saturating_add(for_ms);
        self.last_open_ms = for_ms;
        self.reason = reason;
        self.probe = None;
        Transition::Opened { for_ms, reason }
    }

    /// Open -> HalfOpen once the cooldown is over; true if it turned half-open now.
    pub fn refresh(&mut self, now: Millis) -> bool {
        if self.state == BreakerState::Open && now >= self.open_until {
            self.state = BreakerState::HalfOpen;
            self.probe = None;
            return true;
        }
        false
    }

    /// The state `refresh` would give at `now`, without changing anything (for status).
    pub fn state_at(&self, now: Millis) -> BreakerState {
        if self.state == BreakerState::Open && now >= self.open_until {
            BreakerState::HalfOpen
        } else {
            self.state
        }
    }

    /// Claims the single half-open probe; false if the breaker is not half-open or the probe is
    /// taken.
    pub fn claim_probe(&mut self, probe: Probe) -> bool {
        if self.state == BreakerState::HalfOpen && self.probe.is_none() {
            self.probe = Some(probe);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings::default()
    }

    fn opened(b: &mut Breaker, now: Millis) -> Option<Transition> {
        let s = settings();
        let mut last = None;
        for id in 0..s.failure_threshold {
            last = b.on_failure(now, u64::from(id), &s);
        }
        last
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let s = settings();
        let mut b = Breaker::default();
        assert_eq!(b.on_failure(0, 1, &s), None);
        assert_eq!(b.on_failure(0, 2, &s), None);
        assert_eq!(
            b.on_failure(10, 3, &s),
            Some(Transition::Opened {
                for_ms: 60_000,
                reason: OpenReason::Failures(3)
            })
        );
        assert_eq!(b.state, BreakerState::Open);
        assert_eq!(b.open_until, 60_010);
    }

    #[test]
    fn an_answer_resets_the_failure_count() {
        let s = settings();
        let mut b = Breaker::default();
        b.on_failure(0, 1, &s);
        b.on_failure(0, 2, &s);
        assert_eq!(b.on_answer(3), None);
        assert_eq!(b.on_failure(0, 4, &s), None);
        assert_eq!(b.state, BreakerState::Closed);
    }

    #[test]
    fn turns_half_open_only_after_the_cooldown() {
        let mut b = Breaker::default();
        opened(&mut b, 0);
        assert!(!b.refresh(59_999));
        assert_eq!(b.state_at(60_000), BreakerState::HalfOpen);
        assert!(b.refresh(60_000));
        assert_eq!(b.state, BreakerState::HalfOpen);
    }

    #[test]
    fn exactly_one_probe_is_claimed() {
        let mut b = Breaker::default();
        opened(&mut b, 0);
        assert!(!b.claim_probe(Probe::Call(7)));
        b.refresh(60_000);
        assert!(b.claim_probe(Probe::Call(7)));
        assert!(!b.claim_probe(Probe::Call(8)));
    }

    #[test]
    fn probe_success_closes_and_resets_the_growth() {
        let s = settings();
        let mut b = Breaker::default();
        opened(&mut b, 0);
        b.refresh(60_000);
        b.claim_probe(Probe::Call(7));
        // Another call's answer does not close it.
        assert_eq!(b.on_answer(6), None);
        assert_eq!(b.on_answer(7), Some(Transition::Closed));
        assert_eq!(b, Breaker::default());
        assert_eq!(
            opened(&mut b, 100),
            Some(Transition::Opened {
                for_ms: s.open_ms,
                reason: OpenReason::Failures(3)
            })
        );
    }

    #[test]
    fn probe_failure_reopens_with_doubled_duration_up_to_the_max() {
        let s = settings();
        let mut b = Breaker::default();
        opened(&mut b, 0);
        let mut expected = 60_000;
        let mut now = b.open_until;
        for _ in 0..6 {
            now = now.max(b.open_until);
            b.refresh(now);
            b.claim_probe(Probe::Call(99));
            expected = (expected * 2).min(s.open_max_ms);
            assert_eq!(
                b.on_failure(now, 99, &s),
                Some(Transition::Opened {
                    for_ms: expected,
                    reason: OpenReason::ProbeFailed
                })
            );
        }
        assert_eq!(expected, 600_000);
        assert_eq!(b.open_until, now + 600_000);
    }

    #[test]
    fn a_failed_reconnect_probe_reopens() {
        let s = settings();
        let mut b = Breaker::default();
        opened(&mut b, 0);
        assert_eq!(b.on_connect_failed(10, &s), None);
        b.refresh(60_000);
        assert!(b.claim_probe(Probe::Reconnect));
        assert_eq!(
            b.on_connect_failed(61_000, &s),
            Some(Transition::Opened {
                for_ms: 120_000,
                reason: OpenReason::ReconnectFailed
            })
        );
    }

    #[test]
    fn late_failures_while_open_do_not_extend_it() {
        let s = settings();
        let mut b = Breaker::default();
        opened(&mut b, 0);
        assert_eq!(b.on_failure(5_000, 50, &s), None);
        assert_eq!(b.open_until, 60_000);
    }
}
