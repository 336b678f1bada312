//! A policy of another design than the default: it retries a failing server with a doubling
//! backoff, and gives up after a few attempts without a proven session (or at once on a
//! permanent fault, such as a command that does not exist). A server it gave up on stays down,
//! its calls refused, until someone asks to reconnect it: it never probes on its own. No
//! breaker: calls go out while a session is live.
//!
//! It keeps the contract, so `tether policy check` passes its contract level, and breaks the
//! invariants about never giving up and the breaker: the conformance tests assert exactly
//! which. Naming, filters and collisions are the default's (`tether_policy::registry`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tether_policy::naming::prompt_names;
use tether_policy::registry::{Filters, Registry};
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{
    Action, Admission, BreakerState, CallOutcome, CallRequest, Event, EventKind, Fault, Handover,
    LogLevel, Millis, NamedPrompt, Naming, PolicyInfo, ServerConfig, ServerState, ServerStatus,
    StateChange, Tool, Wake,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    /// Attempts without a proven session before giving up.
    max_attempts: u32,
    /// The first retry's delay, doubled for each further one (at most 30 s).
    backoff_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            backoff_ms: 500,
        }
    }
}

const BACKOFF_CAP_MS: u64 = 30_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Server {
    config: ServerConfig,
    state: ServerState,
    since: Millis,
    /// The live session's tools, and whether it answered anything yet.
    session: Option<(Vec<Tool>, bool)>,
    /// Failed attempts (or sessions that ended unproven) since the last proven session.
    attempts: u32,
    /// The planned retry: when, and the timer's token.
    retry: Option<(Millis, u64)>,
    tool_errors: u32,
    last_fault: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GivesUp {
    settings: Settings,
    servers: BTreeMap<String, Server>,
    registry: Registry,
    namings: BTreeMap<String, String>,
    now: Millis,
    tokens: u64,
    shut_down: bool,
}

fn parse(settings_json: &str) -> Result<Settings, String> {
    let settings: Settings = if settings_json.trim().is_empty() {
        Settings::default()
    } else {
        serde_json::from_str(settings_json).map_err(|e| e.to_string())?
    };
    if settings.max_attempts == 0 || !(1..=BACKOFF_CAP_MS).contains(&settings.backoff_ms) {
        return Err("max_attempts must be at least 1, backoff_ms from 1 to 30000".into());
    }
    Ok(settings)
}

impl GivesUp {
    fn server(&mut self, name: &str) -> Option<&mut Server> {
        self.servers.get_mut(name)
    }

    fn set_state(&mut self, name: &str, state: ServerState, detail: String, out: &mut Vec<Action>) {
        let now = self.now;
        if let Some(server) = self.server(name)
            && server.state != state
        {
            server.state = state;
            server.since = now;
            out.push(Action::StateChanged(StateChange {
                server: name.into(),
                state,
                detail,
            }));
        }
    }

    fn attempt(&mut self, name: &str, out: &mut Vec<Action>) {
        if let Some(server) = self.server(name) {
            server.retry = None;
        }
        self.set_state(name, ServerState::Connecting, "connecting".into(), out);
        out.push(Action::Connect(name.into()));
    }

    /// Hides the server's tools (if it shows any), and shows those of servers waiting for the
    /// names this frees.
    fn hide(&mut self, name: &str, out: &mut Vec<Action>) {
        let (action, freed) = self.registry.withdraw(name);
        out.extend(action);
        for waiting in self.registry.waiting_for(&freed) {
            self.show(&waiting, out);
        }
    }

    /// Shows the live session's tools as filtered and named, if that changes what is shown.
    fn show(&mut self, name: &str, out: &mut Vec<Action>) {
        let Some(server) = self.servers.get(name) else {
            return;
        };
        let Some((tools, _)) = &server.session else {
            return;
        };
        let Ok(filters) = Filters::compile(&server.config.include, &server.config.exclude) else {
            return self.hide(name, out);
        };
        let prefix = self.namings.get(name).map(String::as_str);
        let plan = self.registry.plan(name, prefix, tools, &filters);
        let (action, freed) = self.registry.apply(name, plan);
        out.extend(action);
        for waiting in self.registry.waiting_for(&freed) {
            if waiting != name {
                self.show(&waiting, out);
            }
        }
    }

    /// An attempt failed or a session ended before it was proven: retry, or give up.
    fn failed(&mut self, name: &str, fault: &Fault, out: &mut Vec<Action>) {
        self.hide(name, out);
        let (max, base, now, token) = (
            self.settings.max_attempts,
            self.settings.backoff_ms,
            self.now,
            self.tokens,
        );
        let Some(server) = self.server(name) else {
            return;
        };
        server.session = None;
        server.attempts = server.attempts.saturating_add(1);
        server.last_fault = Some(fault.to_string());
        let attempts = server.attempts;
        if fault.is_permanent() || attempts >= max {
            server.retry = None;
            let detail = format!(
                "gave up after {attempts} attempts ({fault}); it is retried only when asked"
            );
            return self.set_state(name, ServerState::Parked, detail, out);
        }
        let delay = base
            .saturating_mul(1 << (attempts - 1).min(16))
            .min(BACKOFF_CAP_MS);
        let at = now.saturating_add(delay);
        server.retry = Some((at, token));
        self.tokens += 1;
        self.set_state(
            name,
            ServerState::BackingOff,
            format!("{fault}; retry in {delay} ms"),
            out,
        );
        out.push(Action::WakeAt(Wake {
            server: name.into(),
            at,
            token,
        }));
    }

    /// The session answered: the attempts start again from zero.
    fn proven(&mut self, name: &str, out: &mut Vec<Action>) {
        if let Some(server) = self.server(name)
            && let Some((_, proven)) = &mut server.session
        {
            *proven = true;
            server.attempts = 0;
            self.set_state(name, ServerState::Healthy, "session proven".into(), out);
        }
    }

    fn on(&mut self, kind: EventKind, out: &mut Vec<Action>) {
        if self.shut_down {
            return;
        }
        match kind {
            EventKind::ServerConfigured(config) => {
                let name = config.name.clone();
                if let Some(server) = self.server(&name) {
                    server.config = config;
                    return self.show(&name, out);
                }
                let server = Server {
                    config,
                    state: ServerState::Connecting,
                    since: self.now,
                    session: None,
                    attempts: 0,
                    retry: None,
                    tool_errors: 0,
                    last_fault: None,
                };
                self.servers.insert(name.clone(), server);
                out.push(Action::Connect(name));
            }
            EventKind::ServerRemoved(name) => {
                self.namings.remove(&name);
                if self.servers.contains_key(&name) {
                    self.hide(&name, out);
                    self.servers.remove(&name);
                    out.push(Action::Disconnect(name));
                }
            }
            EventKind::Connected(session) => {
                let name = session.server;
                if let Some(server) = self.server(&name) {
                    server.session = Some((session.tools, false));
                    server.retry = None;
                    self.show(&name, out);
                    self.set_state(&name, ServerState::Connected, "session opened".into(), out);
                }
            }
            EventKind::ConnectFailed(failure) => {
                let attempting = self
                    .servers
                    .get(&failure.server)
                    .is_some_and(|s| s.state == ServerState::Connecting);
                if attempting {
                    self.failed(&failure.server, &failure.fault, out);
                }
            }
            EventKind::Disconnected(failure) => {
                let live = self
                    .servers
                    .get(&failure.server)
                    .is_some_and(|s| s.session.is_some());
                if live {
                    self.failed(&failure.server, &failure.fault, out);
                }
            }
            EventKind::ToolsChanged(change) => {
                if let Some(server) = self.server(&change.server)
                    && let Some((tools, _)) = &mut server.session
                {
                    *tools = change.tools;
                    self.show(&change.server, out);
                }
            }
            EventKind::KeepaliveOk(name) => self.proven(&name, out),
            EventKind::KeepaliveFailed(_) => {}
            EventKind::CallFinished(report) => match report.outcome {
                CallOutcome::Ok => self.proven(&report.server, out),
                CallOutcome::ToolError(_) => {
                    if let Some(server) = self.server(&report.server) {
                        server.tool_errors = server.tool_errors.saturating_add(1);
                    }
                    self.proven(&report.server, out);
                }
                _ => {}
            },
            EventKind::Timer(timer) => {
                let due = self
                    .servers
                    .get(&timer.server)
                    .and_then(|s| s.retry)
                    .is_some_and(|(_, token)| token == timer.token);
                if due {
                    self.attempt(&timer.server, out);
                }
            }
            EventKind::ReconnectRequested(request) => {
                let name = request.server;
                if let Some(server) = self.server(&name)
                    && server.session.is_none()
                    && server.state != ServerState::Connecting
                {
                    // Someone asked: a fresh start.
                    server.attempts = 0;
                    self.attempt(&name, out);
                }
            }
            EventKind::Shutdown => {
                self.shut_down = true;
                let names: Vec<String> = self.servers.keys().cloned().collect();
                for name in names {
                    self.hide(&name, out);
                    if let Some(server) = self.server(&name) {
                        server.session = None;
                        server.retry = None;
                    }
                    self.set_state(
                        &name,
                        ServerState::Stopped,
                        "host shutting down".into(),
                        out,
                    );
                }
            }
        }
    }
}

impl PolicyLogic for GivesUp {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "gives-up-test-policy".into(),
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
            tokens: 1,
            shut_down: false,
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
        self.on(event.kind, &mut out);
        out
    }

    fn admit(&mut self, request: CallRequest) -> Admission {
        let name = &request.server;
        match self.servers.get(name) {
            Some(server) if server.session.is_some() => Admission::Allow,
            Some(server) if server.state == ServerState::Parked => Admission::Reject(format!(
                "Tether gave up on server {name} after {} failed attempts; an operator can \
                 reconnect it. The call was not sent.",
                server.attempts
            )),
            Some(_) => Admission::Reject(format!(
                "Server {name} is reconnecting; the call was not sent. Retry in a few seconds."
            )),
            None => Admission::Reject(format!(
                "Server {name} is not configured; the call was not sent."
            )),
        }
    }

    fn status(&self, _now: Millis) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|(name, server)| ServerStatus {
                server: name.clone(),
                state: server.state,
                breaker: BreakerState::Closed,
                failures: server.attempts,
                breaker_failures: 0,
                tool_errors: server.tool_errors,
                last_fault: server.last_fault.clone(),
                since: server.since,
                published_tools: self.registry.published_count(name),
                next_attempt_at: server.retry.map(|(at, _)| at),
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
            let mut server = Server {
                config: h.config,
                state: h.state,
                since: h.since.min(self.now),
                session: None,
                attempts: h.failures,
                retry: None,
                tool_errors: h.tool_errors,
                last_fault: h.last_fault,
            };
            if let Some(live) = h.session {
                let proven = live.proven || h.state == ServerState::Healthy;
                server.state = if proven {
                    ServerState::Healthy
                } else {
                    ServerState::Connected
                };
                server.session = Some((live.tools, proven));
            } else if h.connecting {
                server.state = ServerState::Connecting;
            } else if matches!(h.state, ServerState::Parked | ServerState::Stopped) {
                // Given up (or stopped) before: it stays so until asked.
            } else {
                let at = h.next_attempt_at.unwrap_or(self.now).max(self.now);
                server.state = ServerState::BackingOff;
                server.retry = Some((at, self.tokens));
                out.push(Action::WakeAt(Wake {
                    server: name.clone(),
                    at,
                    token: self.tokens,
                }));
                self.tokens += 1;
            }
            self.servers.insert(name.clone(), server);
            self.show(&name, &mut out);
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
        let prefix = self.namings.get(server).map(String::as_str);
        prompt_names(prefix, server, originals)
    }
}

tether_policy_sdk::export_policy_logic!(GivesUp);
