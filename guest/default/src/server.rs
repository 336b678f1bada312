//! The supervision state of one server.

use rand_pcg::Pcg32;
use serde::{Deserialize, Serialize};

use crate::backoff::seeded_rng;
use crate::breaker::Breaker;
use crate::model::{BreakerState, Fault, Millis, ServerConfig, ServerState, ServerStatus, Tool};
use crate::registry::Filters;
use crate::settings::Settings;
use crate::words::{self, fault_phrase};

/// Why a server is parked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParkReason {
    /// A fault another attempt cannot fix (spawn failed, auth required, not MCP).
    Permanent(Fault),
    /// The attempt budget ran out.
    Exhausted { failures: u32, fault: Fault },
    /// A single revival attempt from parked failed.
    RevivalFailed(Fault),
    /// The server's own configuration (overrides, globs) is invalid.
    Config(String),
    /// Parked by the policy this one took over from.
    HandedOver,
    /// It needs an authorization only a person or the operator can give (contract 0.2.2);
    /// the host's words say how. Not probed: attempts are refused until it is given.
    Authorization(String),
}

impl ParkReason {
    /// For operators (may include the host's fault text).
    pub fn detail(&self) -> String {
        match self {
            ParkReason::Permanent(fault) => format!("permanent fault: {fault}"),
            ParkReason::Exhausted { failures, fault } => {
                format!("{failures} consecutive failed attempts (last: {fault})")
            }
            ParkReason::RevivalFailed(fault) => format!("revival attempt failed: {fault}"),
            ParkReason::Config(error) => format!("configuration error: {error}"),
            ParkReason::HandedOver => "parked by the previous policy".into(),
            ParkReason::Authorization(what_to_do) => what_to_do.clone(),
        }
    }

    /// For the model: categories only, nothing from the host's fault text or the settings.
    pub fn model_words(&self) -> String {
        match self {
            ParkReason::Permanent(fault) => format!("parked: {}", fault_phrase(fault)),
            ParkReason::Exhausted { failures, fault } => format!(
                "parked after {failures} failed connection attempts; last: {}",
                fault_phrase(fault)
            ),
            ParkReason::RevivalFailed(fault) => format!(
                "parked after repeated connection failures; last: {}",
                fault_phrase(fault)
            ),
            ParkReason::Config(_) => "parked: its configuration is invalid".into(),
            ParkReason::HandedOver => "parked after repeated connection failures".into(),
            ParkReason::Authorization(_) => {
                "parked: it needs an authorization (a login) from the user or the operator".into()
            }
        }
    }

    /// For the model: what to do about it. Only a login revives a server parked for one.
    pub fn model_advice(&self, server: &str) -> String {
        match self {
            ParkReason::Authorization(_) => words::login_advice(server),
            _ => words::RECONNECT_ADVICE.into(),
        }
    }
}

/// A pending `WakeAt`; only the latest one per server counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingWake {
    pub token: u64,
    pub at: Millis,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Server {
    pub config: ServerConfig,
    /// Global settings with this server's overrides merged in.
    pub settings: Settings,
    /// Set while the server's own configuration is invalid (it then stays parked).
    pub config_error: Option<String>,
    pub state: ServerState,
    /// When the current state was entered.
    pub since: Millis,
    /// Consecutive failures without a proven session.
    pub failures: u32,
    /// The current session answered a keepalive or a call.
    pub proven: bool,
    /// A session is up.
    pub live: bool,
    /// Some session was ever established (budget is `reconnect_budget` from then on).
    pub ever_connected: bool,
    /// The current attempt is a single revival from parked.
    pub reviving: bool,
    /// Base of the next parked self-probe delay (before jitter).
    pub probe_delay_ms: Millis,
    pub wake: Option<PendingWake>,
    pub breaker: Breaker,
    /// Consecutive tool errors (never open the breaker).
    pub tool_errors: u32,
    pub last_fault: Option<Fault>,
    pub park_reason: Option<ParkReason>,
    /// Jitter generator; its state is part of snapshots so replays continue identically.
    pub rng: Pcg32,
    /// Previous backoff delay of the current run of failures (decorrelated jitter).
    pub prev_backoff: Option<Millis>,
    /// The tools of the current (or last) session, as the server advertised them.
    pub tools: Vec<Tool>,
    /// The last fault as another implementation described it, when this policy took over.
    #[serde(default)]
    pub handed_fault: Option<String>,
    /// What gives the authorization the host says the server needs (contract 0.2.2), until
    /// the fault that follows is handled.
    #[serde(default)]
    pub awaiting_authorization: Option<String>,
}

impl Server {
    pub fn new(config: ServerConfig, settings: Settings, now: Millis) -> Server {
        Server {
            rng: seeded_rng(settings.seed, &config.name),
            probe_delay_ms: settings.park.probe_initial_ms,
            config,
            settings,
            config_error: None,
            state: ServerState::Connecting,
            since: now,
            failures: 0,
            proven: false,
            live: false,
            ever_connected: false,
            reviving: false,
            wake: None,
            breaker: Breaker::default(),
            tool_errors: 0,
            last_fault: None,
            park_reason: None,
            prev_backoff: None,
            tools: Vec::new(),
            handed_fault: None,
            awaiting_authorization: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Consecutive failures allowed before parking in the current phase.
    pub fn limit(&self) -> u32 {
        if self.ever_connected {
            self.settings.reconnect_budget
        } else {
            self.settings.initial_attempts
        }
    }

    /// Enters `state`; true if it is a transition (then `since` moves).
    pub fn enter(&mut self, state: ServerState, now: Millis) -> bool {
        if self.state == state {
            return false;
        }
        self.state = state;
        self.since = now;
        if state != ServerState::Parked {
            self.park_reason = None;
        }
        true
    }

    pub fn status(&self, now: Millis, published_tools: u32) -> ServerStatus {
        ServerStatus {
            server: self.config.name.clone(),
            state: self.state,
            breaker: self.breaker.state_at(now),
            failures: self.failures,
            breaker_failures: self.breaker.failures,
            tool_errors: self.tool_errors,
            last_fault: self
                .last_fault
                .as_ref()
                .map(ToString::to_string)
                .or_else(|| self.handed_fault.clone()),
            since: self.since,
            published_tools,
            next_attempt_at: self
                .wake
                .filter(|_| matches!(self.state, ServerState::BackingOff | ServerState::Parked))
                .map(|wake| wake.at),
            breaker_until: (self.breaker.state_at(now) == BreakerState::Open)
                .then_some(self.breaker.open_until),
        }
    }
}

/// The effective settings of a server: `global` with its overrides merged in, after checking its
/// globs too. Errors are readable and name the problem.
pub fn effective_settings(global: &Settings, config: &ServerConfig) -> Result<Settings, String> {
    let settings = global
        .merged(&config.settings)
        .map_err(|e| format!("invalid settings override: {e}"))?;
    Filters::compile(&config.include, &config.exclude)?;
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TransportKind;

    fn config(settings: &str) -> ServerConfig {
        ServerConfig {
            name: "s".into(),
            transport: TransportKind::Stdio,
            include: vec![],
            exclude: vec![],
            settings: settings.into(),
        }
    }

    #[test]
    fn overrides_merge_over_the_global_settings() {
        let global = Settings::from_json(r#"{"reconnect_budget": 9}"#).unwrap();
        let s = effective_settings(&global, &config(r#"{"backoff": {"base_ms": 10}}"#)).unwrap();
        assert_eq!(s.reconnect_budget, 9);
        assert_eq!(s.backoff.base_ms, 10);
        assert_eq!(s.backoff.cap_ms, 60_000);
    }

    #[test]
    fn bad_overrides_and_bad_globs_are_errors() {
        let global = Settings::default();
        let e = effective_settings(&global, &config(r#"{"bogus": 1}"#)).unwrap_err();
        assert_eq!(e, "invalid settings override: unknown setting `bogus`");
        let mut c = config("");
        c.exclude = vec!["[".into()];
        assert!(
            effective_settings(&global, &c)
                .unwrap_err()
                .contains("exclude pattern")
        );
    }

    #[test]
    fn the_budget_depends_on_whether_a_session_ever_existed() {
        let mut s = Server::new(config(""), Settings::default(), 0);
        assert_eq!(s.limit(), 4);
        s.ever_connected = true;
        assert_eq!(s.limit(), 5);
    }

    #[test]
    fn park_reasons_for_the_model_leave_out_the_fault_text() {
        let fault = Fault::SpawnFailed("/secret/path: not found".into());
        let words = ParkReason::Permanent(fault.clone()).model_words();
        assert_eq!(words, "parked: its process could not be started");
        assert!(
            ParkReason::Permanent(fault)
                .detail()
                .contains("/secret/path")
        );
    }
}
