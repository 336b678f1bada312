//! The default policy: one deterministic state machine supervising every server of a host.
//!
//! Time comes only from events and call requests; nothing here reads a clock, does I/O or
//! iterates a hash map, so the same settings and inputs always give the same outputs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backoff::{backoff_delay, probe_delay};
use crate::breaker::{OpenReason, Probe, Transition};
use crate::model::{
    Action, Admission, BreakerState, CallOutcome, CallReport, CallRequest, Event, EventKind, Fault,
    Handover, Hold, LogLevel, Millis, NamedPrompt, Naming, PolicyInfo, ReconnectRequest,
    ReconnectSource, ServerConfig, ServerFault, ServerHandover, ServerState, ServerStatus,
    SessionInfo, StateChange, TimerFired, Tool, Wake,
};
use crate::registry::{Filters, Plan, Registry};
use crate::server::{ParkReason, PendingWake, Server, effective_settings};
use crate::settings::{MAX_HOLD_MS, Settings};
use crate::words;

/// Identifies snapshots of this policy (another policy's snapshot is refused).
const SNAPSHOT_FORMAT: &str = "tether-default-policy";
/// Bumped on any incompatible change of the serialized state.
const SNAPSHOT_VERSION: u64 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Policy {
    settings: Settings,
    servers: BTreeMap<String, Server>,
    registry: Registry,
    /// Latest host time seen: if time goes backwards we keep this.
    now: Millis,
    /// Tokens are unique across servers, so a timer of a removed server never matches the
    /// token of a re-added one.
    next_token: u64,
    /// The operator's prefix per server (contract 0.2.1 `set-naming`); a server without one is
    /// named `<server>__`. Kept apart from `servers`: it may come before the server does.
    #[serde(default)]
    namings: BTreeMap<String, String>,
    /// Drained by `take_logs`; not part of snapshots.
    #[serde(skip)]
    logs: Vec<(LogLevel, String)>,
}

#[derive(Serialize)]
struct SnapshotOut<'a> {
    format: &'a str,
    version: u64,
    policy: &'a Policy,
}

#[derive(Deserialize)]
struct SnapshotIn {
    policy: Policy,
}

fn change(server: &str, state: ServerState, detail: String) -> Action {
    Action::StateChanged(StateChange {
        server: server.to_string(),
        state,
        detail,
    })
}

impl Policy {
    /// A policy with settings from JSON (`""` or `"{}"`: all defaults; unknown keys: error).
    pub fn new(settings_json: &str) -> Result<Policy, String> {
        Ok(Policy {
            settings: Settings::from_json(settings_json)?,
            servers: BTreeMap::new(),
            registry: Registry::default(),
            now: 0,
            next_token: 0,
            namings: BTreeMap::new(),
            logs: Vec::new(),
        })
    }

    /// The operator's naming of a server (contract 0.2.1), for its next publication: the host
    /// gives it right before the server's configuration.
    pub fn set_naming(&mut self, naming: Naming) {
        match naming.prefix {
            Some(prefix) => self.namings.insert(naming.server, prefix),
            None => self.namings.remove(&naming.server),
        };
    }

    /// A server needs an authorization only a person or the operator can give (contract
    /// 0.2.2; the host says so right before the `auth-required` fault): that fault parks it
    /// without self-probes, which would only be refused, until the host reports the
    /// authorization with `reconnect-requested`.
    pub fn authorization_required(&mut self, server: &str, what_to_do: &str) {
        if let Some(server) = self.servers.get_mut(server) {
            server.awaiting_authorization = Some(what_to_do.chars().take(300).collect());
        }
    }

    /// The names agents see for a server's prompts: the rule its tools are named by. Prompts
    /// that would share a name are all withheld, as tools are.
    pub fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<NamedPrompt> {
        let prefix = self.namings.get(server).map(String::as_str);
        crate::naming::prompt_names(prefix, server, originals)
    }

    pub fn info() -> PolicyInfo {
        PolicyInfo {
            name: "tether-default-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// Replaces the settings, keeping all state; per-server effective settings are recomputed.
    /// Settings that would make a server's overrides invalid are refused (and nothing changes).
    pub fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        let settings = Settings::from_json(settings_json)?;
        let mut effective = Vec::new();
        for (name, server) in &self.servers {
            if server.config_error.is_some() {
                // Re-checked at its next self-probe; meanwhile it runs on the global settings.
                effective.push((name.clone(), settings.clone()));
                continue;
            }
            match effective_settings(&settings, &server.config) {
                Ok(s) => effective.push((name.clone(), s)),
                Err(e) => {
                    return Err(format!(
                        "these settings would make the configuration of server {name:?} invalid: {e}"
                    ));
                }
            }
        }
        self.settings = settings;
        for (name, s) in effective {
            if let Some(server) = self.servers.get_mut(&name) {
                server.settings = s;
            }
        }
        self.log(LogLevel::Info, "settings changed".into());
        Ok(())
    }

    /// Feeds one event; returns the actions to execute, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        self.now = self.now.max(event.now);
        let mut out = Vec::new();
        match event.kind {
            EventKind::ServerConfigured(config) => self.on_configured(config, &mut out),
            EventKind::ServerRemoved(name) => self.on_removed(&name, &mut out),
            EventKind::Connected(session) => self.on_connected(session, &mut out),
            EventKind::ConnectFailed(f) => self.on_connect_failed(f, &mut out),
            EventKind::Disconnected(f) => self.on_disconnected(f, &mut out),
            EventKind::ToolsChanged(t) => self.on_tools_changed(&t.server, t.tools, &mut out),
            EventKind::KeepaliveOk(name) => self.prove(&name, "a keepalive", &mut out),
            EventKind::KeepaliveFailed(f) => self.on_keepalive_failed(f),
            EventKind::CallFinished(report) => self.on_call_finished(report, &mut out),
            EventKind::Timer(t) => self.on_timer(t, &mut out),
            EventKind::ReconnectRequested(r) => self.on_reconnect(r, &mut out),
            EventKind::Shutdown => self.on_shutdown(&mut out),
        }
        out
    }

    /// Decides whether a tool call may be made.
    pub fn admit(&mut self, request: CallRequest) -> Admission {
        self.now = self.now.max(request.now);
        let now = self.now;
        let name = request.server.as_str();
        let Some(server) = self.servers.get_mut(name) else {
            self.logs.push((
                LogLevel::Debug,
                format!(
                    "call {} for unknown server {name:?} rejected",
                    request.call_id
                ),
            ));
            return Admission::Reject(words::unknown(name));
        };
        if server.breaker.refresh(now) {
            self.logs.push((
                LogLevel::Info,
                format!("server {name:?}: circuit breaker half-open; the next call probes"),
            ));
        }
        match server.state {
            ServerState::Stopped => Admission::Reject(words::stopped(name)),
            ServerState::Parked => {
                let reason = server.park_reason.as_ref();
                let why = reason.map_or_else(|| "parked".to_string(), ParkReason::model_words);
                let advice = reason.map_or_else(
                    || words::RECONNECT_ADVICE.to_string(),
                    |reason| reason.model_advice(name),
                );
                Admission::Reject(words::parked(name, &why, &advice))
            }
            ServerState::Connecting | ServerState::BackingOff => {
                let backing_off = server.state == ServerState::BackingOff;
                if backing_off && server.breaker.claim_probe(Probe::Reconnect) {
                    // The probe would find no session: reconnect now instead of writing into
                    // a dead pipe.
                    self.logs.push((
                        LogLevel::Info,
                        format!("server {name:?}: half-open probe found no live session; signalling a reconnect"),
                    ));
                    return Admission::Reconnect(words::reconnecting(
                        name,
                        server.last_fault.as_ref(),
                        None,
                    ));
                }
                let wait = server
                    .wake
                    .filter(|_| backing_off)
                    .map(|w| w.at.saturating_sub(now));
                let message = words::reconnecting(name, server.last_fault.as_ref(), wait);
                // A session is on its way (an attempt in flight, or one due soon): the call
                // waits for it rather than failing.
                let hold = server.settings.hold_ms;
                let hold_for = match wait {
                    _ if hold == 0 => None,
                    None if !backing_off => Some(hold),
                    Some(wait) if wait <= hold => Some(wait.saturating_add(hold).min(MAX_HOLD_MS)),
                    _ => None,
                };
                match hold_for {
                    Some(wait_ms) => Admission::Hold(Hold { wait_ms, message }),
                    None => Admission::Reject(message),
                }
            }
            ServerState::Connected | ServerState::Healthy => match server.breaker.state {
                BreakerState::Closed => Admission::Allow,
                BreakerState::Open => Admission::Reject(words::breaker_open(
                    name,
                    server.breaker.reason,
                    server.breaker.open_until.saturating_sub(now),
                )),
                BreakerState::HalfOpen => {
                    if server.breaker.claim_probe(Probe::Call(request.call_id)) {
                        self.logs.push((
                            LogLevel::Info,
                            format!(
                                "server {name:?}: call {} is the half-open probe",
                                request.call_id
                            ),
                        ));
                        Admission::Probe
                    } else {
                        Admission::Reject(words::breaker_probing(name))
                    }
                }
            },
        }
    }

    /// Every known server's status, sorted by name, at the latest time seen.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.status_at(self.now)
    }

    /// Every known server's status at host time `now` (never before the latest time seen).
    pub fn status_at(&self, now: Millis) -> Vec<ServerStatus> {
        let now = now.max(self.now);
        self.servers
            .iter()
            .map(|(name, server)| server.status(now, self.registry.published_count(name)))
            .collect()
    }

    /// Adopts the state another implementation handed over, on a policy that knows no server
    /// yet. Live sessions are kept (and published), attempts in flight awaited, planned attempts
    /// and self-probes re-armed for when the previous policy planned them; failure counts and
    /// the breaker carry over. Returns the actions that make the host match.
    pub fn take_over(&mut self, handover: Handover) -> Result<Vec<Action>, String> {
        if !self.servers.is_empty() {
            return Err("take-over needs a policy that knows no server yet".into());
        }
        self.now = self.now.max(handover.now);
        let mut out = Vec::new();
        let mut names = BTreeSet::new();
        for server in &handover.servers {
            if !names.insert(server.config.name.as_str()) {
                return Err(format!(
                    "the handover names server {:?} twice",
                    server.config.name
                ));
            }
        }
        self.log(
            LogLevel::Info,
            format!(
                "taking over {} servers from {} {}",
                handover.servers.len(),
                handover.previous.name,
                handover.previous.version
            ),
        );
        for server in handover.servers {
            self.adopt(server, &mut out);
        }
        Ok(out)
    }

    fn adopt(&mut self, h: ServerHandover, out: &mut Vec<Action>) {
        let now = self.now;
        let name = h.config.name.clone();
        let effective = effective_settings(&self.settings, &h.config);
        let settings = effective.clone().unwrap_or_else(|_| self.settings.clone());
        let mut server = Server::new(h.config, settings, h.since.min(now));
        server.failures = h.failures;
        server.tool_errors = h.tool_errors;
        server.handed_fault = h.last_fault;
        server.breaker.failures = h.breaker_failures;
        match h.breaker {
            BreakerState::Closed => {}
            BreakerState::Open => {
                let open_ms = server.settings.breaker.open_ms;
                let until = h.breaker_until.unwrap_or(now.saturating_add(open_ms));
                server.breaker.state = BreakerState::Open;
                server.breaker.open_until = until;
                server.breaker.last_open_ms = until.saturating_sub(now).max(open_ms);
                server.breaker.reason = OpenReason::Failures(h.breaker_failures);
            }
            BreakerState::HalfOpen => {
                server.breaker.state = BreakerState::HalfOpen;
                server.breaker.last_open_ms = server.settings.breaker.open_ms;
                server.breaker.reason = OpenReason::Failures(h.breaker_failures);
            }
        }
        server.ever_connected = h.session.is_some()
            || matches!(h.state, ServerState::Connected | ServerState::Healthy)
            || h.failures > 0;
        if let Err(e) = effective {
            self.servers.insert(name.clone(), server);
            self.park(&name, ParkReason::Config(e.clone()), false, out);
            if let Some(server) = self.servers.get_mut(&name) {
                server.config_error = Some(e);
            }
            return;
        }
        let delay = h.next_attempt_at.map(|at| at.saturating_sub(now));
        if let Some(live) = h.session {
            server.live = true;
            server.proven = live.proven;
            server.tools = live.tools;
            server.state = if live.proven {
                ServerState::Healthy
            } else {
                ServerState::Connected
            };
            self.servers.insert(name.clone(), server);
            self.publish(&name, out);
        } else if h.connecting {
            // Its outcome arrives as an event.
            server.state = ServerState::Connecting;
            self.servers.insert(name.clone(), server);
        } else {
            match h.state {
                ServerState::Stopped => {
                    server.state = ServerState::Stopped;
                    self.servers.insert(name.clone(), server);
                }
                ServerState::Parked => {
                    server.state = ServerState::Parked;
                    server.park_reason = Some(ParkReason::HandedOver);
                    self.servers.insert(name.clone(), server);
                    let delay = delay.unwrap_or_else(|| {
                        self.servers
                            .get(&name)
                            .map_or(0, |s| s.settings.park.probe_initial_ms)
                    });
                    out.extend(self.arm(&name, delay));
                }
                // Waiting to try again (or the previous policy's attempt never went out).
                _ => {
                    server.state = ServerState::BackingOff;
                    self.servers.insert(name.clone(), server);
                    match delay {
                        Some(delay) if delay > 0 => out.extend(self.arm(&name, delay)),
                        _ => {
                            let detail = "taken over; attempting now".to_string();
                            self.start_attempt(&name, detail, out);
                        }
                    }
                }
            }
        }
    }

    /// All state but the log buffer, as versioned JSON.
    pub fn snapshot(&self) -> Vec<u8> {
        let snapshot = SnapshotOut {
            format: SNAPSHOT_FORMAT,
            version: SNAPSHOT_VERSION,
            policy: self,
        };
        // Cannot fail: string keys, finite floats. An empty result would be refused by `restore`.
        serde_json::to_vec(&snapshot).unwrap_or_default()
    }

    /// A policy continuing exactly where the snapshotted one was.
    pub fn restore(snapshot: &[u8]) -> Result<Policy, String> {
        let value: Value = serde_json::from_slice(snapshot)
            .map_err(|e| format!("snapshot is not valid JSON: {e}"))?;
        let obj = value
            .as_object()
            .ok_or("snapshot is not a JSON object; it was not taken by this policy")?;
        match obj.get("format").and_then(Value::as_str) {
            Some(SNAPSHOT_FORMAT) => {}
            Some(other) => {
                return Err(format!(
                    "snapshot is of format {other:?}, not {SNAPSHOT_FORMAT:?}"
                ));
            }
            None => {
                return Err("snapshot has no format field; it was not taken by this policy".into());
            }
        }
        match obj.get("version").and_then(Value::as_u64) {
            Some(SNAPSHOT_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "snapshot version {v} is not supported (this policy reads version {SNAPSHOT_VERSION})"
                ));
            }
            None => return Err("snapshot has no version field".into()),
        }
        let SnapshotIn { policy } =
            serde_json::from_value(value).map_err(|e| format!("snapshot is damaged: {e}"))?;
        policy
            .settings
            .validate()
            .map_err(|e| format!("snapshot is damaged: {e}"))?;
        for (name, server) in &policy.servers {
            if server.name() != name {
                return Err(format!(
                    "snapshot is damaged: server {name:?} is filed under another name"
                ));
            }
            server
                .settings
                .validate()
                .map_err(|e| format!("snapshot is damaged: server {name:?}: {e}"))?;
        }
        Ok(policy)
    }

    /// Drains the log records buffered since the last call.
    pub fn take_logs(&mut self) -> Vec<(LogLevel, String)> {
        std::mem::take(&mut self.logs)
    }

    fn log(&mut self, level: LogLevel, message: String) {
        self.logs.push((level, message));
    }

    fn ignore(&mut self, name: &str, what: &str) {
        self.log(
            LogLevel::Debug,
            format!("ignoring {what} for server {name:?}"),
        );
    }

    // ----- events -----

    fn on_configured(&mut self, config: ServerConfig, out: &mut Vec<Action>) {
        let name = config.name.clone();
        let now = self.now;
        let effective = effective_settings(&self.settings, &config);
        let Some(server) = self.servers.get_mut(&name) else {
            let settings = effective.clone().unwrap_or_else(|_| self.settings.clone());
            let mut server = Server::new(config, settings, now);
            let limit = server.limit();
            match effective {
                Ok(_) => {
                    self.servers.insert(name.clone(), server);
                    // The state change below is the operator's line; this one is for debugging.
                    self.log(
                        LogLevel::Debug,
                        format!("server {name:?} configured; connecting"),
                    );
                    out.push(change(
                        &name,
                        ServerState::Connecting,
                        format!("configured; connecting (attempt 1 of {limit})"),
                    ));
                    out.push(Action::Connect(name));
                }
                Err(e) => {
                    server.config_error = Some(e.clone());
                    self.servers.insert(name.clone(), server);
                    self.log(LogLevel::Error, format!("server {name:?}: {e}"));
                    self.park(&name, ParkReason::Config(e), false, out);
                }
            }
            return;
        };
        if server.state == ServerState::Stopped {
            self.ignore(&name, "a configuration change after shutdown");
            return;
        }
        server.config = config;
        match effective {
            Ok(settings) => {
                server.settings = settings;
                let was_broken = server.config_error.take().is_some();
                if was_broken && server.state == ServerState::Parked {
                    self.log(
                        LogLevel::Info,
                        format!("server {name:?}: configuration fixed"),
                    );
                    self.start_attempt(&name, "configuration fixed; connecting".into(), out);
                } else if server.live {
                    // Include/exclude may have changed; publishes only a difference.
                    self.publish(&name, out);
                }
            }
            Err(e) => {
                if server.state == ServerState::Parked && server.config_error.as_ref() == Some(&e) {
                    return;
                }
                server.config_error = Some(e.clone());
                self.log(LogLevel::Error, format!("server {name:?}: {e}"));
                self.park(&name, ParkReason::Config(e), false, out);
            }
        }
    }

    fn on_removed(&mut self, name: &str, out: &mut Vec<Action>) {
        self.namings.remove(name);
        if !self.servers.contains_key(name) {
            self.ignore(name, "removal");
            return;
        }
        let freed = self.withdraw(name, out);
        out.push(Action::Disconnect(name.to_string()));
        out.push(change(
            name,
            ServerState::Stopped,
            "removed from the configuration".into(),
        ));
        self.servers.remove(name);
        self.log(LogLevel::Info, format!("server {name:?} removed"));
        self.reoffer(freed, out);
    }

    fn on_connected(&mut self, session: SessionInfo, out: &mut Vec<Action>) {
        let SessionInfo {
            server: name,
            server_info,
            tools,
        } = session;
        let now = self.now;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a session");
            return;
        };
        if server.state == ServerState::Stopped || server.config_error.is_some() {
            // Not asked for (stopped, or parked by its own configuration): do not let it linger.
            out.push(Action::Disconnect(name.clone()));
            self.log(
                LogLevel::Warn,
                format!("server {name:?}: closing a session that was not asked for"),
            );
            return;
        }
        server.live = true;
        server.proven = false;
        server.ever_connected = true;
        server.wake = None;
        server.awaiting_authorization = None;
        server.tools = tools;
        // A fresh session closes the breaker on every transport.
        server.breaker.reset();
        let changed = server.enter(ServerState::Connected, now);
        self.publish(&name, out);
        if changed {
            let detail = format!("session established ({server_info}); not yet proven");
            self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
            out.push(change(&name, ServerState::Connected, detail));
        }
    }

    fn on_connect_failed(&mut self, f: ServerFault, out: &mut Vec<Action>) {
        let ServerFault {
            server: name,
            fault,
        } = f;
        let now = self.now;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a connect failure");
            return;
        };
        if server.state != ServerState::Connecting {
            self.ignore(&name, "a connect failure while no attempt is in progress");
            return;
        }
        if let Some(Transition::Opened { for_ms, reason }) = server
            .breaker
            .on_connect_failed(now, &server.settings.breaker)
        {
            let detail = words::breaker_opened_detail(for_ms, reason);
            self.log(LogLevel::Warn, format!("server {name:?}: {detail}"));
        }
        self.fail(&name, fault, out);
    }

    fn on_disconnected(&mut self, f: ServerFault, out: &mut Vec<Action>) {
        let ServerFault {
            server: name,
            fault,
        } = f;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a disconnect");
            return;
        };
        if !server.live {
            self.ignore(&name, "a disconnect without a live session");
            return;
        }
        server.live = false;
        server.proven = false;
        let freed = self.withdraw(&name, out);
        // Proven sessions reset the count, so this is failure #1; an unproven one adds to it.
        self.fail(&name, fault, out);
        self.reoffer(freed, out);
    }

    fn on_tools_changed(&mut self, name: &str, tools: Vec<Tool>, out: &mut Vec<Action>) {
        match self.servers.get_mut(name) {
            Some(server) if server.live => {
                server.tools = tools;
                self.publish(name, out);
            }
            _ => self.ignore(name, "a tool list without a live session"),
        }
    }

    fn on_keepalive_failed(&mut self, f: ServerFault) {
        let Some(server) = self.servers.get_mut(&f.server) else {
            self.ignore(&f.server, "a keepalive failure");
            return;
        };
        // Only noted: the host follows with `disconnected` if it tears the session down.
        let message = format!("server {:?}: {}", f.server, f.fault);
        server.last_fault = Some(f.fault);
        self.log(LogLevel::Info, message);
    }

    fn on_call_finished(&mut self, report: CallReport, out: &mut Vec<Action>) {
        let CallReport {
            server: name,
            call_id,
            outcome,
            ..
        } = report;
        let now = self.now;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a call report");
            return;
        };
        let answered = matches!(outcome, CallOutcome::Ok | CallOutcome::ToolError(_));
        let transition = match outcome {
            CallOutcome::Ok => {
                server.tool_errors = 0;
                server.breaker.on_answer(call_id)
            }
            CallOutcome::ToolError(_) => {
                // The server works; tool errors are the arguments' problem, counted apart.
                server.tool_errors = server.tool_errors.saturating_add(1);
                server.breaker.on_answer(call_id)
            }
            CallOutcome::TransportError(fault) => {
                server.last_fault = Some(fault);
                server
                    .breaker
                    .on_failure(now, call_id, &server.settings.breaker)
            }
            CallOutcome::Timeout => {
                server
                    .breaker
                    .on_failure(now, call_id, &server.settings.breaker)
            }
            // Says nothing of the server; a cancelled probe frees the probe for another call.
            CallOutcome::Cancelled => {
                server.breaker.on_cancelled(call_id);
                None
            }
        };
        let state = server.state;
        match transition {
            Some(Transition::Opened { for_ms, reason }) => {
                let detail = words::breaker_opened_detail(for_ms, reason);
                self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
                out.push(change(&name, state, detail));
            }
            Some(Transition::Closed) => {
                let detail = "circuit breaker closed: its test call was answered".to_string();
                self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
                out.push(change(&name, state, detail));
            }
            None => {}
        }
        if answered {
            self.prove(&name, "an answered call", out);
        }
    }

    fn on_timer(&mut self, t: TimerFired, out: &mut Vec<Action>) {
        let TimerFired {
            server: name,
            token,
        } = t;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a timer");
            return;
        };
        if server.wake.map(|w| w.token) != Some(token) {
            self.ignore(&name, "a stale timer");
            return;
        }
        server.wake = None;
        match server.state {
            ServerState::BackingOff => {
                let detail = format!(
                    "backoff over; attempt {} of {}",
                    server.failures.saturating_add(1),
                    server.limit()
                );
                self.start_attempt(&name, detail, out);
            }
            ServerState::Parked => self.revive(&name, "self-probe", out),
            _ => self.ignore(&name, "a timer in this state"),
        }
    }

    fn on_reconnect(&mut self, r: ReconnectRequest, out: &mut Vec<Action>) {
        let ReconnectRequest {
            server: name,
            source,
        } = r;
        let Some(server) = self.servers.get_mut(&name) else {
            self.ignore(&name, "a reconnect request");
            return;
        };
        let who = words::source(source);
        match server.state {
            ServerState::Parked => {
                self.revive(&name, &format!("reconnect requested by {who}"), out);
            }
            ServerState::BackingOff => {
                let detail = format!(
                    "reconnect requested by {who}; attempt {} of {}",
                    server.failures.saturating_add(1),
                    server.limit()
                );
                self.start_attempt(&name, detail, out);
            }
            ServerState::Connected | ServerState::Healthy if source != ReconnectSource::Agent => {
                // The host tears the old session down before connecting again.
                server.live = false;
                server.proven = false;
                let freed = self.withdraw(&name, out);
                let detail = format!("reconnect requested by {who}; replacing the session");
                self.start_attempt(&name, detail, out);
                self.reoffer(freed, out);
            }
            _ => self.ignore(&name, "a reconnect request in this state"),
        }
    }

    fn on_shutdown(&mut self, out: &mut Vec<Action>) {
        let now = self.now;
        let names: Vec<String> = self.servers.keys().cloned().collect();
        for name in names {
            if self.servers.get(&name).map(|s| s.state) == Some(ServerState::Stopped) {
                continue;
            }
            // No re-offers: every server is going away.
            self.withdraw(&name, out);
            if let Some(server) = self.servers.get_mut(&name) {
                server.live = false;
                server.proven = false;
                server.reviving = false;
                server.wake = None;
                server.enter(ServerState::Stopped, now);
            }
            out.push(Action::Disconnect(name.clone()));
            out.push(change(
                &name,
                ServerState::Stopped,
                "host shutting down".into(),
            ));
        }
        self.log(LogLevel::Info, "shutdown: every server stopped".into());
    }

    // ----- supervision -----

    /// The session answered: the budget resets and any revival succeeded.
    fn prove(&mut self, name: &str, how: &str, out: &mut Vec<Action>) {
        let now = self.now;
        let Some(server) = self.servers.get_mut(name) else {
            self.ignore(name, "a proof");
            return;
        };
        if !server.live {
            return;
        }
        if !server.proven {
            server.proven = true;
            server.failures = 0;
            server.reviving = false;
            server.probe_delay_ms = server.settings.park.probe_initial_ms;
            server.prev_backoff = None;
        }
        if server.enter(ServerState::Healthy, now) {
            let detail = format!("session proven by {how}");
            self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
            out.push(change(name, ServerState::Healthy, detail));
        }
    }

    /// An attempt failed or an (unproven or proven) session died: back off or park.
    fn fail(&mut self, name: &str, fault: Fault, out: &mut Vec<Action>) {
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        server.last_fault = Some(fault.clone());
        server.failures = server.failures.saturating_add(1);
        let failures = server.failures;
        let limit = server.limit();
        let reviving = server.reviving;
        let awaiting = server.awaiting_authorization.take();
        if let (Fault::AuthRequired(_), Some(what_to_do)) = (&fault, awaiting) {
            self.park(name, ParkReason::Authorization(what_to_do), false, out);
        } else if fault.is_permanent() {
            self.park(name, ParkReason::Permanent(fault), reviving, out);
        } else if reviving {
            // A revival is one attempt, not a fresh budget.
            self.park(name, ParkReason::RevivalFailed(fault), true, out);
        } else if failures >= limit {
            self.park(name, ParkReason::Exhausted { failures, fault }, false, out);
        } else {
            self.back_off(name, &fault, out);
        }
    }

    fn back_off(&mut self, name: &str, fault: &Fault, out: &mut Vec<Action>) {
        let now = self.now;
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        let attempt = server.failures;
        let limit = server.limit();
        let delay = backoff_delay(
            &server.settings.backoff,
            attempt,
            &mut server.prev_backoff,
            &mut server.rng,
        );
        server.enter(ServerState::BackingOff, now);
        let detail = format!(
            "attempt {attempt} of {limit} failed: {fault}; next attempt in {}",
            words::secs(delay)
        );
        self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
        out.push(change(name, ServerState::BackingOff, detail));
        out.extend(self.arm(name, delay));
    }

    /// Parks: tools withdrawn, session closed if any, slow self-probe armed. Never final.
    fn park(&mut self, name: &str, reason: ParkReason, grow: bool, out: &mut Vec<Action>) {
        let freed = self.withdraw(name, out);
        let now = self.now;
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        if server.live {
            server.live = false;
            out.push(Action::Disconnect(name.to_string()));
        }
        server.proven = false;
        server.reviving = false;
        let (initial, max) = (
            server.settings.park.probe_initial_ms,
            server.settings.park.probe_max_ms,
        );
        let base = if grow {
            server.probe_delay_ms.saturating_mul(2)
        } else {
            server.probe_delay_ms
        };
        server.probe_delay_ms = base.clamp(initial, max);
        let delay = probe_delay(server.probe_delay_ms, &mut server.rng);
        server.enter(ServerState::Parked, now);
        // Waiting for an authorization: a probe would only be refused; the host reports it.
        let probes = !matches!(reason, ParkReason::Authorization(_));
        let detail = if probes {
            format!(
                "parked: {}; next self-probe in {}",
                reason.detail(),
                words::secs(delay)
            )
        } else {
            server.wake = None;
            format!(
                "parked: {}; no self-probe until it is authorized",
                reason.detail()
            )
        };
        server.park_reason = Some(reason);
        self.log(LogLevel::Debug, format!("server {name:?} {detail}"));
        out.push(change(name, ServerState::Parked, detail));
        if probes {
            out.extend(self.arm(name, delay));
        }
        self.reoffer(freed, out);
    }

    /// Leaves parked: one attempt (or, with a broken configuration, a re-check of it).
    fn revive(&mut self, name: &str, why: &str, out: &mut Vec<Action>) {
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        if server.config_error.is_some() {
            // The global settings may have changed since it was parked.
            match effective_settings(&self.settings, &server.config) {
                Ok(settings) => {
                    server.settings = settings;
                    server.config_error = None;
                    self.log(
                        LogLevel::Info,
                        format!("server {name:?}: configuration is valid now"),
                    );
                    self.start_attempt(
                        name,
                        format!("{why}; configuration valid; connecting"),
                        out,
                    );
                }
                Err(e) => {
                    server.config_error = Some(e.clone());
                    self.park(name, ParkReason::Config(e), true, out);
                }
            }
            return;
        }
        server.reviving = true;
        self.start_attempt(name, format!("{why}; trying to revive (one attempt)"), out);
    }

    fn start_attempt(&mut self, name: &str, detail: String, out: &mut Vec<Action>) {
        let now = self.now;
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        // Invalidates any pending timer of this server.
        server.wake = None;
        server.enter(ServerState::Connecting, now);
        self.log(LogLevel::Debug, format!("server {name:?}: {detail}"));
        out.push(change(name, ServerState::Connecting, detail));
        out.push(Action::Connect(name.to_string()));
    }

    /// A `WakeAt` after `delay`, superseding the server's earlier ones.
    fn arm(&mut self, name: &str, delay: Millis) -> Option<Action> {
        let server = self.servers.get_mut(name)?;
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        let at = self.now.saturating_add(delay);
        server.wake = Some(PendingWake { token, at });
        Some(Action::WakeAt(Wake {
            server: name.to_string(),
            at,
            token,
        }))
    }

    // ----- registry -----

    /// THE withdrawal shared by disconnect, park, removal and shutdown: emits `WithdrawTools`
    /// only if the server shows tools. Returns the names it freed.
    fn withdraw(&mut self, name: &str, out: &mut Vec<Action>) -> BTreeSet<String> {
        let (action, freed) = self.registry.withdraw(name);
        if let Some(action) = action {
            self.log(LogLevel::Debug, format!("server {name:?}: tools withdrawn"));
            out.push(action);
        }
        freed
    }

    /// Recomputes the server's publication (emitting only a difference) and re-offers any
    /// names it gave up.
    fn publish(&mut self, name: &str, out: &mut Vec<Action>) {
        let freed = self.republish(name, out);
        self.reoffer(freed, out);
    }

    fn republish(&mut self, name: &str, out: &mut Vec<Action>) -> BTreeSet<String> {
        let Some(server) = self.servers.get(name) else {
            return BTreeSet::new();
        };
        if !server.live {
            return BTreeSet::new();
        }
        let plan = match Filters::compile(&server.config.include, &server.config.exclude) {
            Ok(filters) => {
                let prefix = self.namings.get(name).map(String::as_str);
                self.registry.plan(name, prefix, &server.tools, &filters)
            }
            Err(e) => {
                // Unreachable in practice (bad globs park first); fail closed anyway.
                self.logs
                    .push((LogLevel::Error, format!("server {name:?}: {e}")));
                Plan {
                    tools: Vec::new(),
                    blocked: BTreeSet::new(),
                    warnings: Vec::new(),
                }
            }
        };
        for warning in &plan.warnings {
            self.logs.push((LogLevel::Warn, warning.clone()));
        }
        let (action, freed) = self.registry.apply(name, plan);
        out.extend(action);
        freed
    }

    /// Offers freed names to live servers that were denied them.
    fn republish_waiting(
        &mut self,
        freed: &BTreeSet<String>,
        out: &mut Vec<Action>,
    ) -> BTreeSet<String> {
        let mut next = BTreeSet::new();
        for name in self.registry.waiting_for(freed) {
            next.extend(self.republish(&name, out));
        }
        next
    }

    fn reoffer(&mut self, freed: BTreeSet<String>, out: &mut Vec<Action>) {
        let mut freed = freed;
        // Re-offers only add names, so this settles at once; the bound is a safety net.
        for _ in 0..=self.servers.len() {
            if freed.is_empty() {
                break;
            }
            freed = self.republish_waiting(&freed, out);
        }
    }
}

#[cfg(test)]
mod tests;
