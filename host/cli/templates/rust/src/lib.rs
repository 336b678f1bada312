//! A starter Tether policy in Rust (contract tether:policy@0.2.1, see wit/policy.wit).
//!
//! A policy is a pure, deterministic state machine: the host feeds it events stamped with its
//! time and executes the actions it returns. Rules of the sandbox: no clocks (time comes in the
//! events), no randomness (derive it from the inputs if you need it), no files, network or
//! environment; iterate in a fixed order (`BTreeMap`, never `HashMap`).
//!
//! What it does: connect on configuration; publish `<server>__<tool>` names, or
//! `<prefix><tool>` when the operator gave the server a prefix (`set-naming`; "" for the
//! server's own names), made valid and unique, and name prompts by the same rule; retry with exponential backoff; park (tools withdrawn, slow self-probe) after
//! `max_failures` failures without a proven session, or at once on a permanent fault; a circuit
//! breaker on transport failures of calls, with one half-open probe; hold calls while an attempt
//! is in flight. A server's own `settings` are ignored (yours to add). Build with `./build.sh
//! policy.wasm`, check with `tether policy check policy.wasm`: it passes the contract and
//! Tether's invariants. When you change it, keep the invariants too: a parked server keeps a
//! self-probe timer (never give up); `failures` resets only on a proven session (keepalive-ok or
//! an answered call), never on a bare handshake; every retry waits for a timer; one half-open
//! probe at a time; a half-open breaker without a session answers `reconnect` (that reconnect
//! is the probe: its failure reopens the breaker); tool errors never open the breaker. Compute
//! times with `saturating_add`: host times and settings are large numbers.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

wit_bindgen::generate!({
    path: "wit",
    world: "policy-component",
    // The state keeps some WIT types (`ServerConfig`, `Tool`...): serde puts them in snapshots.
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use exports::tether::policy::policy::Guest;
use tether::policy::log::{Level, log};
use tether::policy::types::*;

/// The settings: `init` and `set-settings` take a JSON object of these keys, each optional.
/// Durations are in milliseconds; `parse_settings` checks each against its range (in brackets).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    backoff_ms: u64,          // first retry delay [1, MAX_MS], doubled per failure...
    backoff_max_ms: u64,      // ...up to this [backoff_ms, MAX_MS]
    max_failures: u32,        // failures without a proven session before parking [1, ...]
    probe_ms: u64,            // self-probe period of a parked server [1000, MAX_MS]
    breaker_threshold: u32,   // consecutive call transport failures that open the breaker [1, ...]
    breaker_cooldown_ms: u64, // how long it stays open before one probe [1, MAX_MS]
    hold_ms: u64,             // how long a call may wait for a coming session [0 = never, 60000]
}

/// The longest duration a setting may give (about 31 years): times stay far from `u64::MAX`.
const MAX_MS: u64 = 1_000_000_000_000;
/// The longest `hold` the contract allows.
const MAX_HOLD_MS: u64 = 60_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff_ms: 1_000,
            backoff_max_ms: 60_000,
            max_failures: 5,
            probe_ms: 300_000,
            breaker_threshold: 3,
            breaker_cooldown_ms: 30_000,
            hold_ms: 2_000,
        }
    }
}

fn parse_settings(json: &str) -> Result<Settings, String> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("settings: {e}"))?;
    if !value.is_object() {
        return Err("settings must be a JSON object".into());
    }
    // `deny_unknown_fields` refuses unknown keys; a missing key keeps its default.
    let s: Settings = serde_json::from_value(value).map_err(|e| format!("settings: {e}"))?;
    // The minimums keep retries off a tight loop (a zero delay would retry at once); the
    // maximums keep host time plus a delay far from overflowing.
    let (failures, threshold) = (s.max_failures.into(), s.breaker_threshold.into());
    let ranges = [
        ("backoff_ms", s.backoff_ms, 1, MAX_MS),
        ("backoff_max_ms", s.backoff_max_ms, s.backoff_ms, MAX_MS),
        ("probe_ms", s.probe_ms, 1_000, MAX_MS),
        ("breaker_cooldown_ms", s.breaker_cooldown_ms, 1, MAX_MS),
        ("hold_ms", s.hold_ms, 0, MAX_HOLD_MS),
        ("max_failures", failures, 1, u32::MAX.into()),
        ("breaker_threshold", threshold, 1, u32::MAX.into()),
    ];
    for (key, value, min, max) in ranges {
        if !(min..=max).contains(&value) {
            return Err(format!(
                "settings: `{key}` must be in [{min}, {max}], not {value}"
            ));
        }
    }
    Ok(s)
}

/// Everything the policy knows; `snapshot` is this as JSON.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    settings: Settings,
    now: u64,   // the latest host time seen
    token: u64, // the last timer token given out
    servers: BTreeMap<String, Server>,
    // The operator's prefix per server (`set-naming`); it may come before the server does.
    // (Absent from a snapshot taken before contract 0.2.1: none then.)
    #[serde(default)]
    namings: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Server {
    config: ServerConfig,
    state: ServerState,
    since: u64, // when it entered `state`
    live: bool, // it has a session (`tools` is its latest list)
    tools: Vec<Tool>,
    published: Option<Vec<(String, Tool)>>, // what agents see, by advertised name (None: nothing)
    failures: u32,
    last_fault: Option<String>,
    wake: Option<(u64, u64)>, // the pending timer: (at, token)
    tool_errors: u32,
    breaker: Breaker,
}

/// The circuit breaker of a server's calls.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Breaker {
    failures: u32,        // consecutive transport failures
    until: Option<u64>,   // open until then, half-open after
    probe: Option<Probe>, // the one half-open probe in flight
}

/// What a half-open breaker let through: a call, or (no session to call) a reconnect.
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Probe {
    Call(u64), // by call id; its report closes or reopens the breaker
    Reconnect, // the next attempt's outcome does (a new session closes it, a failure reopens it)
}

impl Breaker {
    fn half_open(&self, now: u64) -> bool {
        self.until.is_some_and(|until| now >= until)
    }

    fn open(&mut self, now: u64, cooldown_ms: u64) {
        (self.until, self.probe) = (Some(now.saturating_add(cooldown_ms)), None);
    }
}

impl Server {
    fn new(config: ServerConfig, now: u64) -> Server {
        Server {
            config,
            state: ServerState::Connecting,
            since: now,
            live: false,
            tools: Vec::new(),
            published: None,
            failures: 0,
            last_fault: None,
            wake: None,
            tool_errors: 0,
            breaker: Breaker::default(),
        }
    }

    /// THE withdrawal: exactly once, and only when the server shows tools.
    fn withdraw(&mut self, out: &mut Vec<Action>) {
        if self.published.take().is_some() {
            out.push(Action::WithdrawTools(self.config.name.clone()));
        }
    }

    fn enter(&mut self, now: u64, state: ServerState, detail: &str, out: &mut Vec<Action>) {
        if self.state != state {
            (self.state, self.since) = (state, now);
            let (server, detail) = (self.config.name.clone(), detail.to_string());
            out.push(Action::StateChanged(StateChange {
                server,
                state,
                detail,
            }));
        }
    }

    fn visible(&self, tool: &str) -> bool {
        let (include, exclude) = (&self.config.include, &self.config.exclude);
        (include.is_empty() || include.iter().any(|p| glob(p, tool)))
            && !exclude.iter().any(|p| glob(p, tool))
    }
}

/// `*` matches any run of characters, `?` one character; anything else matches itself (no
/// `[...]` classes nor `{a,b}` alternatives: add them if your operators need them).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut i, mut j, mut star) = (0, 0, None);
    while j < t.len() {
        if i < p.len() && p[i] == '*' {
            (star, i) = (Some((i, j)), i + 1); // try the star matching nothing first
        } else if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            (i, j) = (i + 1, j + 1);
        } else if let Some((s, m)) = star {
            (star, i, j) = (Some((s, m + 1)), s + 1, m + 1); // let the star take one more
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// `server__tool` (or the operator's `<prefix><tool>`) with invalid characters replaced, 1 to
/// 64 characters; `n` > 0 gives an alternative (for a name that is taken), with a hash that is
/// the same in every build.
fn advertised_name(prefix: Option<&str>, server: &str, tool: &str, n: u32) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-';
    let text = match prefix {
        Some(prefix) => format!("{prefix}{tool}"),
        None => format!("{server}__{tool}"),
    };
    let name: String = text
        .chars()
        .map(|c| if valid(c) { c } else { '_' })
        .collect();
    if (1..=64).contains(&name.len()) && n == 0 {
        return name;
    }
    let fnv1a = |h: u32, b: u8| (h ^ b as u32).wrapping_mul(0x0100_0193);
    let hash = format!("{server}/{tool}/{n}")
        .bytes()
        .fold(0x811c_9dc5, fnv1a);
    format!("{}_{hash:08x}", &name[..name.len().min(55)])
}

impl State {
    /// Publishes what `srv` should show, only when it differs from what it shows (names,
    /// read-only flags, revisions). `srv` is out of `self.servers` meanwhile.
    fn publish(&self, srv: &mut Server, out: &mut Vec<Action>) {
        let others = self
            .servers
            .values()
            .flat_map(|s| s.published.iter().flatten());
        let mut taken: BTreeSet<String> =
            others.map(|(advertised, _)| advertised.clone()).collect();
        let mut tools: Vec<&Tool> = srv.tools.iter().filter(|t| srv.visible(&t.name)).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name)); // the order of the list does not matter
        tools.dedup_by(|a, b| a.name == b.name);
        let prefix = self.namings.get(&srv.config.name).map(String::as_str);
        let mut shown = Vec::new();
        for tool in tools {
            let mut names = (0..).map(|n| advertised_name(prefix, &srv.config.name, &tool.name, n));
            let advertised = names.find(|a| !taken.contains(a)).expect("a free name");
            taken.insert(advertised.clone());
            shown.push((advertised, tool.clone()));
        }
        if srv.published.as_ref() != Some(&shown) {
            let tools = shown.iter().map(|(advertised, tool)| PublishedTool {
                advertised: advertised.clone(),
                original: tool.name.clone(),
                read_only: tool.read_only,
            });
            let server = srv.config.name.clone();
            out.push(Action::PublishTools(Publication {
                server,
                tools: tools.collect(),
            }));
            srv.published = Some(shown);
        }
    }

    /// The names agents see for a server's prompts, by the rule of its tools (changes nothing).
    fn name_prompts(&self, server: &str, originals: Vec<String>) -> Vec<NamedPrompt> {
        let prefix = self.namings.get(server).map(String::as_str);
        let (mut seen, mut taken, mut named) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
        for original in originals {
            if !seen.insert(original.clone()) {
                continue; // each prompt once
            }
            let mut names = (0..).map(|n| advertised_name(prefix, server, &original, n));
            let advertised = names.find(|a| !taken.contains(a)).expect("a free name");
            taken.insert(advertised.clone());
            named.push(NamedPrompt {
                advertised,
                original,
            });
        }
        named
    }

    fn arm(&mut self, srv: &mut Server, at: u64, out: &mut Vec<Action>) {
        self.token += 1;
        srv.wake = Some((at, self.token));
        let (server, token) = (srv.config.name.clone(), self.token);
        out.push(Action::WakeAt(Wake { server, at, token }));
    }

    fn connect(&self, srv: &mut Server, out: &mut Vec<Action>) {
        srv.wake = None;
        srv.enter(self.now, ServerState::Connecting, "connecting", out);
        out.push(Action::Connect(srv.config.name.clone()));
    }

    /// An attempt failed or a session died: back off, or park (never give up: self-probe).
    fn fail(&mut self, srv: &mut Server, fault: Fault, out: &mut Vec<Action>) {
        let s = &self.settings;
        srv.live = false;
        srv.withdraw(out);
        srv.failures = srv.failures.saturating_add(1);
        if srv.breaker.probe == Some(Probe::Reconnect) {
            srv.breaker.open(self.now, s.breaker_cooldown_ms); // the reconnect probe failed
        }
        let permanent = matches!(
            fault,
            Fault::SpawnFailed(_) | Fault::AuthRequired(_) | Fault::NotMcpEndpoint(_)
        );
        let (state, delay) = if permanent || srv.failures >= s.max_failures {
            (ServerState::Parked, s.probe_ms)
        } else {
            let doubled = s.backoff_ms.saturating_mul(1 << (srv.failures - 1).min(30));
            (ServerState::BackingOff, doubled.min(s.backoff_max_ms))
        };
        srv.last_fault = Some(format!("{fault:?}"));
        let detail = format!("{fault:?}: next attempt in {delay} ms");
        srv.enter(self.now, state, &detail, out);
        self.arm(srv, self.now.saturating_add(delay), out);
    }

    /// The session answered: the failure count starts again.
    fn prove(&self, srv: &mut Server, out: &mut Vec<Action>) {
        if srv.live {
            srv.failures = 0;
            srv.enter(self.now, ServerState::Healthy, "session proven", out);
        }
    }

    fn handle(&mut self, kind: EventKind, out: &mut Vec<Action>) {
        use EventKind as E;
        let name = match &kind {
            E::Shutdown => {
                for srv in self.servers.values_mut() {
                    srv.withdraw(out);
                    (srv.live, srv.wake) = (false, None);
                    srv.enter(self.now, ServerState::Stopped, "host shutting down", out);
                }
                return;
            }
            E::ServerConfigured(config) => config.name.clone(),
            E::ServerRemoved(name) | E::KeepaliveOk(name) => name.clone(),
            E::Connected(session) => session.server.clone(),
            E::ConnectFailed(f) | E::Disconnected(f) | E::KeepaliveFailed(f) => f.server.clone(),
            E::ToolsChanged(t) => t.server.clone(),
            E::CallFinished(report) => report.server.clone(),
            E::Timer(t) => t.server.clone(),
            E::ReconnectRequested(r) => r.server.clone(),
        };
        if let E::ServerRemoved(_) = &kind {
            self.namings.remove(&name); // the operator's naming ends with the server
        }
        let known = self
            .servers
            .get(&name)
            .is_some_and(|s| s.state != ServerState::Stopped);
        if !known {
            if let E::ServerConfigured(config) = kind {
                let mut srv = Server::new(config, self.now);
                self.connect(&mut srv, out);
                self.servers.insert(name, srv);
            }
            return; // otherwise an unknown or stopped server: nothing to do
        }
        // The server is out of the map while deciding, and put back at the end.
        let mut srv = self.servers.remove(&name).expect("a known server");
        let waiting = matches!(srv.state, ServerState::BackingOff | ServerState::Parked);
        match kind {
            E::ServerConfigured(config) => {
                srv.config = config;
                if srv.live {
                    self.publish(&mut srv, out);
                }
            }
            E::ServerRemoved(_) => {
                srv.withdraw(out);
                out.push(Action::Disconnect(name));
                return;
            }
            E::Connected(session) => {
                (srv.live, srv.wake, srv.tools) = (true, None, session.tools);
                srv.breaker = Breaker::default();
                self.publish(&mut srv, out);
                let detail = format!("session up ({})", session.server_info);
                srv.enter(self.now, ServerState::Connected, &detail, out);
            }
            E::ConnectFailed(f) if srv.state == ServerState::Connecting && !srv.live => {
                self.fail(&mut srv, f.fault, out)
            }
            E::Disconnected(f) if srv.live => self.fail(&mut srv, f.fault, out),
            E::ToolsChanged(t) if srv.live => {
                srv.tools = t.tools;
                self.publish(&mut srv, out);
            }
            E::KeepaliveOk(_) => self.prove(&mut srv, out),
            E::CallFinished(report) => self.call_finished(&mut srv, report, out),
            E::Timer(t) if waiting && srv.wake.is_some_and(|(_, token)| token == t.token) => {
                self.connect(&mut srv, out)
            }
            E::ReconnectRequested(_) if srv.state != ServerState::Connecting => {
                srv.live = false; // the host tears a live session down before connecting
                srv.withdraw(out);
                self.connect(&mut srv, out);
            }
            _ => {} // a stale timer, a keepalive failure (`disconnected` follows if it matters)...
        }
        self.servers.insert(name, srv);
    }

    fn call_finished(&mut self, srv: &mut Server, report: CallReport, out: &mut Vec<Action>) {
        let b = &mut srv.breaker;
        match report.outcome {
            // The server answered (a tool error is the arguments' fault): the breaker closes.
            CallOutcome::Ok | CallOutcome::ToolError(_) => {
                srv.tool_errors = match report.outcome {
                    CallOutcome::ToolError(_) => srv.tool_errors.saturating_add(1),
                    _ => 0,
                };
                srv.breaker = Breaker::default();
                self.prove(srv, out);
            }
            CallOutcome::TransportError(_) | CallOutcome::Timeout => {
                b.failures = b.failures.saturating_add(1);
                let probe_failed = b.probe == Some(Probe::Call(report.call_id));
                if probe_failed
                    || (b.until.is_none() && b.failures >= self.settings.breaker_threshold)
                {
                    b.open(self.now, self.settings.breaker_cooldown_ms);
                }
            }
            // A cancelled call says nothing about the server; a cancelled probe frees the probe.
            CallOutcome::Cancelled => {
                if b.probe == Some(Probe::Call(report.call_id)) {
                    b.probe = None;
                }
            }
        }
    }

    fn admit(&mut self, request: CallRequest) -> Admission {
        let (now, name) = (self.now, &request.server);
        let Some(srv) = self.servers.get_mut(name) else {
            return Admission::Reject(format!("Server '{name}' is not configured; call not sent."));
        };
        let half_open = srv.breaker.half_open(now);
        if !srv.live {
            let (state, hold_ms) = (srv.state, self.settings.hold_ms);
            // Backing off, the breaker half-open and no probe yet: a reconnect is the one probe
            // (its attempt's failure reopens the breaker). A parked server is left to its
            // self-probe or an operator; an attempt in flight or claimed is waited for.
            if state == ServerState::BackingOff && half_open && srv.breaker.probe.is_none() {
                srv.breaker.probe = Some(Probe::Reconnect);
                return Admission::Reconnect(format!(
                    "Server '{name}' has no session; reconnecting it. Retry shortly."
                ));
            }
            let message = format!("Server '{name}' has no session ({state:?}); call not sent.");
            // In how long an attempt starts: now when connecting; backing off, at its timer.
            let wait = match state {
                ServerState::Connecting => Some(0),
                ServerState::BackingOff => srv.wake.map(|(at, _)| at.saturating_sub(now)),
                _ => None,
            };
            return match wait {
                // A session is on its way: wait for it, then the host asks again.
                Some(wait) if hold_ms > 0 && wait <= hold_ms => Admission::Hold(Hold {
                    wait_ms: wait.saturating_add(hold_ms).min(MAX_HOLD_MS),
                    message,
                }),
                _ => Admission::Reject(message),
            };
        }
        match srv.breaker.until {
            None => Admission::Allow,
            Some(_) if half_open && srv.breaker.probe.is_none() => {
                srv.breaker.probe = Some(Probe::Call(request.call_id)); // the one half-open probe
                Admission::Probe
            }
            Some(_) => Admission::Reject(format!(
                "Server '{name}' is failing (circuit open); call not sent. Retry later."
            )),
        }
    }

    fn status(&self, now: u64) -> Vec<ServerStatus> {
        let status = |srv: &Server| {
            let breaker = match srv.breaker.until {
                None => BreakerState::Closed,
                Some(until) if now < until => BreakerState::Open,
                Some(_) => BreakerState::HalfOpen,
            };
            let waiting = matches!(srv.state, ServerState::BackingOff | ServerState::Parked);
            ServerStatus {
                server: srv.config.name.clone(),
                state: srv.state,
                breaker,
                failures: srv.failures,
                breaker_failures: srv.breaker.failures,
                tool_errors: srv.tool_errors,
                last_fault: srv.last_fault.clone(),
                since: srv.since,
                published_tools: srv.published.as_ref().map_or(0, |p| p.len() as u32),
                next_attempt_at: srv.wake.filter(|_| waiting).map(|(at, _)| at),
                breaker_until: srv.breaker.until.filter(|_| breaker == BreakerState::Open),
            }
        };
        self.servers.values().map(status).collect()
    }

    /// Adopts another policy's state: keeps live sessions (never connects them) and publishes
    /// their tools, leaves attempts in flight alone, re-arms planned attempts, keeps the counts.
    fn take_over(&mut self, handover: Handover) -> Result<Vec<Action>, String> {
        if !self.servers.is_empty() {
            return Err("take-over needs a fresh instance".into());
        }
        self.now = self.now.max(handover.now);
        let mut out = Vec::new();
        let mut servers = handover.servers;
        servers.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        for h in servers {
            let mut srv = Server::new(h.config, h.since.min(self.now));
            (srv.failures, srv.last_fault, srv.tool_errors) =
                (h.failures, h.last_fault, h.tool_errors);
            srv.breaker.failures = h.breaker_failures;
            if h.breaker != BreakerState::Closed {
                srv.breaker.until = Some(h.breaker_until.unwrap_or(self.now));
            }
            srv.state = match (&h.session, h.connecting, h.state) {
                (Some(session), _, _) if session.proven => ServerState::Healthy,
                (Some(_), _, _) => ServerState::Connected,
                (None, true, _) => ServerState::Connecting, // its outcome arrives as an event
                (None, false, ServerState::Parked | ServerState::Stopped) => h.state,
                (None, false, _) => ServerState::BackingOff,
            };
            if let Some(session) = h.session {
                (srv.live, srv.tools) = (true, session.tools);
                self.publish(&mut srv, &mut out);
            } else if matches!(srv.state, ServerState::BackingOff | ServerState::Parked) {
                let at = h.next_attempt_at.unwrap_or(self.now).max(self.now);
                self.arm(&mut srv, at, &mut out);
            }
            self.servers.insert(srv.config.name.clone(), srv);
        }
        let (count, previous) = (self.servers.len(), handover.previous);
        let message = format!("took over {count} servers from {}", previous.name);
        log(Level::Info, &message);
        Ok(out)
    }
}

thread_local! {
    // A component instance is single-threaded: this is its one state.
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|state| f(&mut state.borrow_mut()))
}

struct Policy;

impl Guest for Policy {
    fn info() -> PolicyInfo {
        // Same name, same implementation: a swap then moves the state by `snapshot`.
        let (name, version) = (env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"));
        let (name, version) = (name.to_string(), version.to_string());
        PolicyInfo { name, version }
    }

    fn init(settings: String) -> Result<(), String> {
        let settings = parse_settings(&settings)?;
        with(|state| {
            *state = State {
                settings,
                ..State::default()
            }
        });
        Ok(())
    }

    fn set_settings(settings: String) -> Result<(), String> {
        let settings = parse_settings(&settings)?;
        with(|state| state.settings = settings);
        Ok(())
    }

    fn handle(event: Event) -> Vec<Action> {
        with(|state| {
            state.now = state.now.max(event.now);
            let mut out = Vec::new();
            state.handle(event.kind, &mut out);
            out
        })
    }

    fn admit(request: CallRequest) -> Admission {
        with(|state| {
            state.now = state.now.max(request.now);
            state.admit(request)
        })
    }

    fn status(now: Millis) -> Vec<ServerStatus> {
        with(|state| state.status(now.max(state.now)))
    }

    fn snapshot() -> Vec<u8> {
        with(|state| serde_json::to_vec(state).expect("the state serializes"))
    }

    fn restore(snapshot: Vec<u8>) -> Result<(), String> {
        let restored: State = serde_json::from_slice(&snapshot)
            .map_err(|e| format!("not a snapshot of this policy: {e}"))?;
        with(|state| *state = restored);
        Ok(())
    }

    fn take_over(handover: Handover) -> Result<Vec<Action>, String> {
        with(|state| state.take_over(handover))
    }

    // The operator's prefix for a server's names (`None`: the default); the host follows with
    // `server-configured`, which republishes a live server under the new names.
    fn set_naming(naming: Naming) {
        with(|state| match naming.prefix {
            Some(prefix) => state.namings.insert(naming.server, prefix),
            None => state.namings.remove(&naming.server),
        });
    }

    fn name_prompts(server: String, originals: Vec<String>) -> Vec<NamedPrompt> {
        with(|state| state.name_prompts(&server, originals))
    }
}

export!(Policy);
