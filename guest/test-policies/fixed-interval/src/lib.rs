//! A policy of another design than the default, as an operator might write one (issue 21):
//! every failed attempt or lost session is retried after a fixed interval (1 s), forever. No
//! parking, no breaker, no retry budget; the tools of a server are withdrawn on every failure,
//! whether or not any were shown (the host absorbs what changes nothing).
//!
//! It keeps the contract, so `tether policy check` passes its contract level, and breaks the
//! invariants about parking, the budget, the breaker and quiet withdrawals: the conformance
//! tests assert exactly which. Naming, filters and collisions are the default's
//! (`tether_policy::registry`); the decisions about failures are its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tether_policy::naming::prompt_names;
use tether_policy::registry::{Filters, Registry};
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{
    Action, Admission, BreakerState, CallOutcome, CallRequest, Event, EventKind, Handover,
    LogLevel, Millis, NamedPrompt, Naming, PolicyInfo, ServerConfig, ServerState, ServerStatus,
    StateChange, Tool, Wake,
};

/// What an instance is given: one setting, the interval.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_interval")]
    interval_ms: u64,
}

fn default_interval() -> u64 {
    1_000
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Server {
    config: ServerConfig,
    state: ServerState,
    since: Millis,
    /// The live session's tools; `None`: no session.
    session: Option<Vec<Tool>>,
    proven: bool,
    /// The planned attempt: when, and the timer's token.
    wake: Option<(Millis, u64)>,
    failures: u32,
    tool_errors: u32,
    last_fault: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FixedInterval {
    settings: Settings,
    servers: BTreeMap<String, Server>,
    registry: Registry,
    namings: BTreeMap<String, String>,
    now: Millis,
    next_token: u64,
    stopped: bool,
}

fn parse(settings_json: &str) -> Result<Settings, String> {
    let text = if settings_json.trim().is_empty() {
        "{}"
    } else {
        settings_json
    };
    let settings: Settings = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if !(1..=3_600_000).contains(&settings.interval_ms) {
        return Err("interval_ms must be from 1 to 3600000".into());
    }
    Ok(settings)
}

impl FixedInterval {
    fn enter(&mut self, name: &str, state: ServerState, detail: &str, out: &mut Vec<Action>) {
        let now = self.now;
        if let Some(server) = self.servers.get_mut(name)
            && server.state != state
        {
            server.state = state;
            server.since = now;
            out.push(Action::StateChanged(StateChange {
                server: name.into(),
                state,
                detail: detail.into(),
            }));
        }
    }

    fn connect(&mut self, name: &str, out: &mut Vec<Action>) {
        if let Some(server) = self.servers.get_mut(name) {
            server.wake = None;
        }
        self.enter(name, ServerState::Connecting, "connecting", out);
        out.push(Action::Connect(name.into()));
    }

    /// A failed attempt or a lost session: withdraw, try again after the interval.
    fn failed(&mut self, name: &str, fault: String, out: &mut Vec<Action>) {
        let (at, token) = (
            self.now.saturating_add(self.settings.interval_ms),
            self.next_token,
        );
        self.next_token += 1;
        let Some(server) = self.servers.get_mut(name) else {
            return;
        };
        server.session = None;
        server.proven = false;
        server.failures = server.failures.saturating_add(1);
        server.last_fault = Some(fault.clone());
        server.wake = Some((at, token));
        // On every failure, shown or not: the host absorbs a withdrawal of nothing.
        let _ = self.registry.withdraw(name);
        out.push(Action::WithdrawTools(name.into()));
        let detail = format!("{fault}; retry in {} ms", self.settings.interval_ms);
        self.enter(name, ServerState::BackingOff, &detail, out);
        out.push(Action::WakeAt(Wake {
            server: name.into(),
            at,
            token,
        }));
    }

    /// Shows the live session's tools as filtered and named, if they differ from what is shown;
    /// then whatever was waiting for names this freed.
    fn publish(&mut self, name: &str, out: &mut Vec<Action>) {
        let mut pending = vec![name.to_string()];
        while let Some(name) = pending.pop() {
            let Some(server) = self.servers.get(&name) else {
                continue;
            };
            let Some(tools) = &server.session else {
                continue;
            };
            let filters = Filters::compile(&server.config.include, &server.config.exclude)
                .unwrap_or_else(|_| Filters::compile(&[], &["*".into()]).expect("valid"));
            let prefix = self.namings.get(&name).map(String::as_str);
            let plan = self.registry.plan(&name, prefix, tools, &filters);
            let (action, freed) = self.registry.apply(&name, plan);
            out.extend(action);
            pending.extend(self.registry.waiting_for(&freed));
        }
    }

    fn on_event(&mut self, kind: EventKind, out: &mut Vec<Action>) {
        match kind {
            EventKind::Shutdown => {
                self.stopped = true;
                let names: Vec<String> = self.servers.keys().cloned().collect();
                for name in names {
                    let _ = self.registry.withdraw(&name);
                    out.push(Action::WithdrawTools(name.clone()));
                    if let Some(server) = self.servers.get_mut(&name) {
                        server.wake = None;
                        server.session = None;
                    }
                    self.enter(&name, ServerState::Stopped, "host shutting down", out);
                }
            }
            _ if self.stopped => {}
            EventKind::ServerConfigured(config) => {
                let name = config.name.clone();
                match self.servers.get_mut(&name) {
                    Some(server) => {
                        server.config = config;
                        self.publish(&name, out);
                    }
                    None => {
                        self.servers.insert(
                            name.clone(),
                            Server {
                                config,
                                state: ServerState::Connecting,
                                since: self.now,
                                session: None,
                                proven: false,
                                wake: None,
                                failures: 0,
                                tool_errors: 0,
                                last_fault: None,
                            },
                        );
                        out.push(Action::Connect(name));
                    }
                }
            }
            EventKind::ServerRemoved(name) => {
                self.namings.remove(&name);
                if self.servers.remove(&name).is_some() {
                    let (action, freed) = self.registry.withdraw(&name);
                    out.extend(action);
                    out.push(Action::Disconnect(name));
                    for waiting in self.registry.waiting_for(&freed) {
                        self.publish(&waiting, out);
                    }
                }
            }
            EventKind::Connected(session) => {
                let name = session.server;
                let Some(server) = self.servers.get_mut(&name) else {
                    return;
                };
                server.session = Some(session.tools);
                server.wake = None;
                server.failures = 0;
                self.publish(&name, out);
                self.enter(&name, ServerState::Connected, "session established", out);
            }
            EventKind::ConnectFailed(failure) => {
                if self
                    .servers
                    .get(&failure.server)
                    .is_some_and(|s| s.state == ServerState::Connecting)
                {
                    self.failed(&failure.server, failure.fault.to_string(), out);
                }
            }
            EventKind::Disconnected(failure) => {
                if self
                    .servers
                    .get(&failure.server)
                    .is_some_and(|s| s.session.is_some())
                {
                    self.failed(&failure.server, failure.fault.to_string(), out);
                }
            }
            EventKind::ToolsChanged(change) => {
                if let Some(server) = self.servers.get_mut(&change.server)
                    && server.session.is_some()
                {
                    server.session = Some(change.tools);
                    self.publish(&change.server, out);
                }
            }
            EventKind::KeepaliveOk(name) => {
                if let Some(server) = self.servers.get_mut(&name)
                    && server.session.is_some()
                {
                    server.proven = true;
                    self.enter(&name, ServerState::Healthy, "session proven", out);
                }
            }
            EventKind::KeepaliveFailed(_) => {}
            EventKind::CallFinished(report) => {
                if let Some(server) = self.servers.get_mut(&report.server)
                    && matches!(report.outcome, CallOutcome::ToolError(_))
                {
                    server.tool_errors = server.tool_errors.saturating_add(1);
                }
            }
            EventKind::Timer(timer) => {
                let due = self
                    .servers
                    .get(&timer.server)
                    .and_then(|s| s.wake)
                    .is_some_and(|(_, token)| token == timer.token);
                if due {
                    self.connect(&timer.server, out);
                }
            }
            EventKind::ReconnectRequested(request) => {
                let idle = self
                    .servers
                    .get(&request.server)
                    .is_some_and(|s| s.session.is_none() && s.state != ServerState::Connecting);
                if idle {
                    self.connect(&request.server, out);
                }
            }
        }
    }
}

impl PolicyLogic for FixedInterval {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "fixed-interval-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        Ok(Self {
            settings: parse(settings_json)?,
            servers: BTreeMap::new(),
            registry: Registry::default(),
            namings: BTreeMap::new(),
            now: 0,
            next_token: 1,
            stopped: false,
        })
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(snapshot).map_err(|e| format!("not a snapshot of this policy: {e}"))
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        self.settings = parse(settings_json)?;
        Ok(())
    }

    fn handle(&mut self, event: Event) -> Vec<Action> {
        self.now = self.now.max(event.now);
        let mut out = Vec::new();
        self.on_event(event.kind, &mut out);
        out
    }

    fn admit(&mut self, request: CallRequest) -> Admission {
        match self.servers.get(&request.server) {
            Some(server) if server.session.is_some() => Admission::Allow,
            Some(_) => Admission::Reject(format!(
                "Server {} is reconnecting (an attempt every {} ms); the call was not sent.",
                request.server, self.settings.interval_ms
            )),
            None => Admission::Reject(format!(
                "Server {} is not configured; the call was not sent.",
                request.server
            )),
        }
    }

    fn status(&self, now: Millis) -> Vec<ServerStatus> {
        let _ = now;
        self.servers
            .iter()
            .map(|(name, server)| ServerStatus {
                server: name.clone(),
                state: server.state,
                breaker: BreakerState::Closed,
                failures: server.failures,
                breaker_failures: 0,
                tool_errors: server.tool_errors,
                last_fault: server.last_fault.clone(),
                since: server.since,
                published_tools: self.registry.published_count(name),
                next_attempt_at: server.wake.map(|(at, _)| at),
                breaker_until: None,
            })
            .collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the state serializes")
    }

    fn take_over(&mut self, handover: Handover) -> Result<Vec<Action>, String> {
        if !self.servers.is_empty() {
            return Err("take-over needs a fresh instance".into());
        }
        self.now = self.now.max(handover.now);
        let mut out = Vec::new();
        for h in handover.servers {
            let name = h.config.name.clone();
            let proven = h.session.as_ref().is_some_and(|live| live.proven)
                || h.state == ServerState::Healthy;
            let session = h.session.map(|live| live.tools);
            let (state, wake) = if session.is_some() {
                let state = if proven {
                    ServerState::Healthy
                } else {
                    ServerState::Connected
                };
                (state, None)
            } else if h.connecting {
                (ServerState::Connecting, None)
            } else if h.state == ServerState::Stopped {
                (ServerState::Stopped, None)
            } else {
                let token = self.next_token;
                self.next_token += 1;
                let at = h.next_attempt_at.unwrap_or(self.now).max(self.now);
                out.push(Action::WakeAt(Wake {
                    server: name.clone(),
                    at,
                    token,
                }));
                (ServerState::BackingOff, Some((at, token)))
            };
            self.servers.insert(
                name.clone(),
                Server {
                    config: h.config,
                    state,
                    since: h.since.min(self.now),
                    proven: session.is_some() && proven,
                    session,
                    wake,
                    failures: h.failures,
                    tool_errors: h.tool_errors,
                    last_fault: h.last_fault,
                },
            );
            self.publish(&name, &mut out);
        }
        Ok(out)
    }

    fn take_logs(&mut self) -> Vec<(LogLevel, String)> {
        Vec::new()
    }

    fn set_naming(&mut self, naming: Naming) {
        match naming.prefix {
            Some(prefix) => self.namings.insert(naming.server, prefix),
            None => self.namings.remove(&naming.server),
        };
    }

    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<NamedPrompt> {
        prompt_names(
            self.namings.get(server).map(String::as_str),
            server,
            originals,
        )
    }
}

tether_policy_sdk::export_policy_logic!(FixedInterval);
