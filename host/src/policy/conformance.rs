//! The conformance suite: scripted scenarios (events in, expected actions and admissions out)
//! that any policy component must pass, run through the real runtime. `tether policy check`
//! runs them, after [`preflight`] has made sure the component can be used at all.
//!
//! Scenarios come at two levels ([`Level`]): the *contract* (valid outputs, no tools for a
//! server without a session, withdrawal on removal and shutdown, determinism, the snapshot round
//! trip, a handover taken over), which any policy the host runs must keep, and *Tether's
//! invariants* (never give up — park; the budget resets only on a proven session; one half-open
//! probe; ...), which a policy may break on purpose, and which a swap then names (`--force`).
//! They check behaviour, not one policy's parameters: they use the policy's own default settings
//! (or the settings given), drive virtual time forward freely and fire every timer the policy
//! asks for, and allow generous bounds (e.g. "parks within 25 attempts").

use super::types::{
    Action, Admission, CallOutcome, CallReport, CallRequest, Event, EventKind, Fault,
    ReconnectRequest, ReconnectSource, ServerConfig, ServerFault, ServerState, ServerStatus,
    ServerTools, SessionInfo, TimerFired, Tool, TransportKind,
};
use std::sync::Arc;

use super::PolicyError;
use super::engine::{PolicyEngine, PolicySource};
use super::runtime::{PolicyRuntime, RuntimeOptions};

/// Attempts within which a failing server must be parked.
const PARK_WITHIN: usize = 25;
/// Consecutive transport failures within which the breaker must open.
const BREAKER_WITHIN: usize = 10;
/// Virtual time far beyond any sane cooldown or backoff.
const LONG_MS: u64 = 24 * 3600 * 1000;

/// Which promise a scenario checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// What any policy the host runs must do.
    Contract,
    /// What Tether promises its users; a policy may break it on purpose.
    Invariant,
}

/// One scenario's outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScenarioResult {
    /// The scenario's name (e.g. `tools-are-withdrawn-exactly-once`).
    pub name: &'static str,
    /// Which promise it checks.
    pub level: Level,
    /// `None` when it passed; otherwise what differed.
    pub failure: Option<String>,
}

type Steps = fn(&mut Script) -> Result<(), String>;

/// Every scenario, in order: the contract's, then the invariants'.
pub fn scenarios() -> Vec<(&'static str, Level, Steps)> {
    use Level::{Contract, Invariant};
    vec![
        (
            "session-publishes-usable-tool-names",
            Contract,
            session_publishes_usable_tool_names,
        ),
        (
            "tools-are-withdrawn-exactly-once",
            Contract,
            tools_are_withdrawn_exactly_once,
        ),
        (
            "removal-withdraws-and-forgets",
            Contract,
            removal_withdraws_and_forgets,
        ),
        (
            "shutdown-withdraws-every-server",
            Contract,
            shutdown_withdraws_every_server,
        ),
        (
            "tools-changed-republishes-only-on-difference",
            Contract,
            tools_changed_republishes_only_on_difference,
        ),
        (
            "include-and-exclude-filter-tools",
            Contract,
            include_and_exclude_filter_tools,
        ),
        (
            "decisions-are-deterministic",
            Contract,
            decisions_are_deterministic,
        ),
        (
            "state-survives-snapshot-and-restore",
            Contract,
            state_survives_snapshot_and_restore,
        ),
        (
            "takes-over-another-policy-keeping-sessions",
            Contract,
            takes_over_another_policy_keeping_sessions,
        ),
        (
            "configured-server-connects",
            Invariant,
            configured_server_connects,
        ),
        (
            "transient-failure-retries-after-a-backoff",
            Invariant,
            transient_failure_retries_after_a_backoff,
        ),
        (
            "permanent-fault-parks-at-once",
            Invariant,
            permanent_fault_parks_at_once,
        ),
        (
            "failing-server-parks-and-keeps-a-self-probe",
            Invariant,
            failing_server_parks_and_keeps_a_self_probe,
        ),
        (
            "handshake-alone-does-not-reset-the-budget",
            Invariant,
            handshake_alone_does_not_reset_the_budget,
        ),
        (
            "proven-sessions-never-park",
            Invariant,
            proven_sessions_never_park,
        ),
        (
            "reconnect-request-revives-a-parked-server",
            Invariant,
            reconnect_request_revives_a_parked_server,
        ),
        (
            "breaker-opens-and-fails-fast",
            Invariant,
            breaker_opens_and_fails_fast,
        ),
        (
            "exactly-one-half-open-probe",
            Invariant,
            exactly_one_half_open_probe,
        ),
        (
            "probe-without-session-signals-reconnect",
            Invariant,
            probe_without_session_signals_reconnect,
        ),
        (
            "tool-errors-do-not-open-the-breaker",
            Invariant,
            tool_errors_do_not_open_the_breaker,
        ),
    ]
}

/// Starts `source` with `settings` once, as every scenario does, and says why it cannot be used
/// at all: not loadable, built for an incompatible contract, settings it refuses (in its own
/// words), a fault while starting. Checked before [`run`], so that such a component gets one
/// clear error instead of every scenario failing for the same reason.
pub fn preflight(
    engine: &Arc<PolicyEngine>,
    source: &PolicySource,
    settings: &str,
) -> Result<(), String> {
    match start_runtime(engine, source, settings) {
        Ok(_) => Ok(()),
        Err(PolicyError::Refused {
            policy,
            what: "the settings",
            reason,
        }) => Err(format!(
            "policy {policy} refused the settings {}: {reason}",
            settings.trim()
        )),
        Err(error) => Err(error.to_string()),
    }
}

fn start_runtime(
    engine: &Arc<PolicyEngine>,
    source: &PolicySource,
    settings: &str,
) -> Result<PolicyRuntime, PolicyError> {
    PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine.clone()),
        source: source.clone(),
        settings: settings.to_string(),
        fallback_to_default: false,
        ..RuntimeOptions::default()
    })
}

/// Runs every scenario against `source`, each in a fresh runtime with `settings`. Failures of
/// the component (traps, refusals) are scenario failures, never papered over by a fallback.
pub fn run(
    engine: &Arc<PolicyEngine>,
    source: &PolicySource,
    settings: &str,
) -> Vec<ScenarioResult> {
    scenarios()
        .into_iter()
        .map(|(name, level, steps)| {
            let failure = Script::start(engine, source, settings)
                .and_then(|mut script| steps(&mut script).map_err(|e| script.explain(e)))
                .err();
            ScenarioResult {
                name,
                level,
                failure,
            }
        })
        .collect()
}

/// Drives one runtime through a scenario, keeping virtual time and a step log for messages.
pub struct Script {
    runtime: PolicyRuntime,
    engine: Arc<PolicyEngine>,
    settings: String,
    source: PolicySource,
    now: u64,
    step: usize,
    last: String,
    /// The latest wake-up asked for per server: (at, token).
    wakes: std::collections::BTreeMap<String, (u64, u64)>,
    next_call: u64,
}

impl Script {
    fn start(
        engine: &Arc<PolicyEngine>,
        source: &PolicySource,
        settings: &str,
    ) -> Result<Self, String> {
        let runtime = start_runtime(engine, source, settings).map_err(|e| e.to_string())?;
        Ok(Self {
            runtime,
            engine: engine.clone(),
            settings: settings.to_string(),
            source: source.clone(),
            now: 1_000,
            step: 0,
            last: "start".into(),
            wakes: Default::default(),
            next_call: 1,
        })
    }

    fn explain(&self, failure: String) -> String {
        format!("at step {} ({}): {failure}", self.step, self.last)
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    fn event(&mut self, kind: EventKind) -> Result<Vec<Action>, String> {
        self.step += 1;
        self.last = describe_event(&kind);
        let actions = self
            .runtime
            .handle(Event {
                now: self.now,
                kind,
            })
            .wait()
            .map_err(|e| e.to_string())?;
        for action in &actions {
            if let Action::WakeAt(wake) = action {
                self.wakes
                    .insert(wake.server.clone(), (wake.at, wake.token));
            }
        }
        Ok(actions)
    }

    fn configure(&mut self, server: &str) -> Result<Vec<Action>, String> {
        self.configure_with(server, &[], &[])
    }

    fn configure_with(
        &mut self,
        server: &str,
        include: &[&str],
        exclude: &[&str],
    ) -> Result<Vec<Action>, String> {
        self.event(EventKind::ServerConfigured(ServerConfig {
            name: server.into(),
            transport: TransportKind::Stdio,
            include: include.iter().map(|s| s.to_string()).collect(),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
            settings: String::new(),
        }))
    }

    fn connected(&mut self, server: &str, tools: &[&str]) -> Result<Vec<Action>, String> {
        self.event(EventKind::Connected(SessionInfo {
            server: server.into(),
            server_info: "conformance 1.0".into(),
            tools: tools.iter().map(|name| tool(name)).collect(),
        }))
    }

    fn connect_failed(&mut self, server: &str, fault: Fault) -> Result<Vec<Action>, String> {
        self.event(EventKind::ConnectFailed(ServerFault {
            server: server.into(),
            fault,
        }))
    }

    fn disconnected(&mut self, server: &str) -> Result<Vec<Action>, String> {
        self.event(EventKind::Disconnected(ServerFault {
            server: server.into(),
            fault: Fault::ProcessExited(Some(1)),
        }))
    }

    fn keepalive_ok(&mut self, server: &str) -> Result<Vec<Action>, String> {
        self.event(EventKind::KeepaliveOk(server.into()))
    }

    fn reconnect(&mut self, server: &str, source: ReconnectSource) -> Result<Vec<Action>, String> {
        self.event(EventKind::ReconnectRequested(ReconnectRequest {
            server: server.into(),
            source,
        }))
    }

    /// Fires the server's pending timer (advancing time to it). Fails if none is armed.
    fn fire_timer(&mut self, server: &str) -> Result<Vec<Action>, String> {
        let (at, token) = self
            .wakes
            .remove(server)
            .ok_or_else(|| format!("expected a timer armed for {server}, none is"))?;
        self.now = self.now.max(at);
        self.event(EventKind::Timer(TimerFired {
            server: server.into(),
            token,
        }))
    }

    fn admit(&mut self, server: &str, tool: &str) -> Result<(u64, Admission), String> {
        self.step += 1;
        self.last = format!("admit a call to {server}/{tool}");
        let call_id = self.next_call;
        self.next_call += 1;
        let admission = self
            .runtime
            .admit(CallRequest {
                now: self.now,
                call_id,
                server: server.into(),
                tool: tool.into(),
            })
            .wait()
            .map_err(|e| e.to_string())?;
        Ok((call_id, admission))
    }

    fn finish(
        &mut self,
        server: &str,
        call_id: u64,
        outcome: CallOutcome,
    ) -> Result<Vec<Action>, String> {
        self.event(EventKind::CallFinished(CallReport {
            server: server.into(),
            call_id,
            outcome,
            duration_ms: 5,
        }))
    }

    /// Admits and finishes one call with `outcome`; returns the admission.
    fn call(&mut self, server: &str, outcome: CallOutcome) -> Result<Admission, String> {
        let (call_id, admission) = self.admit(server, "work")?;
        if matches!(admission, Admission::Allow | Admission::Probe) {
            self.finish(server, call_id, outcome)?;
        }
        Ok(admission)
    }

    fn status(&mut self, server: &str) -> Result<ServerStatus, String> {
        let all = self.runtime.status().wait().map_err(|e| e.to_string())?;
        all.into_iter()
            .find(|s| s.server == server)
            .ok_or_else(|| format!("status() does not list {server}"))
    }

    fn state(&mut self, server: &str) -> Result<ServerState, String> {
        Ok(self.status(server)?.state)
    }

    /// Brings `server` to a connected, proven session with `tools`.
    fn healthy(&mut self, server: &str, tools: &[&str]) -> Result<(), String> {
        self.configure(server)?;
        self.connected(server, tools)?;
        self.keepalive_ok(server)?;
        Ok(())
    }

    /// Fails connection attempts (firing each timer) until the server parks; returns attempts.
    fn fail_until_parked(&mut self, server: &str, fault: Fault) -> Result<usize, String> {
        for attempt in 1..=PARK_WITHIN {
            self.connect_failed(server, fault.clone())?;
            if self.state(server)? == ServerState::Parked {
                return Ok(attempt);
            }
            let actions = self.fire_timer(server)?;
            expect(
                has_connect(&actions, server),
                format!("after the backoff the policy must connect {server}; it did {actions:?}"),
            )?;
        }
        Err(format!(
            "{server} was not parked after {PARK_WITHIN} failed attempts"
        ))
    }
}

fn tool(name: &str) -> Tool {
    Tool {
        name: name.into(),
        description: Some(format!("the {name} tool")),
        input_schema: r#"{"type":"object"}"#.into(),
        read_only: false,
    }
}

fn describe_event(kind: &EventKind) -> String {
    match kind {
        EventKind::ServerConfigured(c) => format!("configure {}", c.name),
        EventKind::ServerRemoved(s) => format!("remove {s}"),
        EventKind::Connected(s) => format!("{} connected", s.server),
        EventKind::ConnectFailed(f) => format!("{} failed to connect ({:?})", f.server, f.fault),
        EventKind::Disconnected(f) => format!("{} disconnected ({:?})", f.server, f.fault),
        EventKind::ToolsChanged(t) => format!("{} changed its tools", t.server),
        EventKind::KeepaliveOk(s) => format!("{s} answered a keepalive"),
        EventKind::KeepaliveFailed(f) => format!("{} keepalive failed", f.server),
        EventKind::CallFinished(r) => format!(
            "call {} on {} finished: {:?}",
            r.call_id, r.server, r.outcome
        ),
        EventKind::Timer(t) => format!("timer for {}", t.server),
        EventKind::ReconnectRequested(r) => {
            format!("reconnect {} requested by {:?}", r.server, r.source)
        }
        EventKind::Shutdown => "shutdown".into(),
    }
}

fn expect(ok: bool, failure: impl Into<String>) -> Result<(), String> {
    if ok { Ok(()) } else { Err(failure.into()) }
}

fn has_connect(actions: &[Action], server: &str) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Connect(s) if s == server))
}

fn withdrawals(actions: &[Action], server: &str) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::WithdrawTools(s) if s == server))
        .count()
}

fn publication<'a>(actions: &'a [Action], server: &str) -> Option<&'a super::types::Publication> {
    actions.iter().rev().find_map(|a| match a {
        Action::PublishTools(p) if p.server == server => Some(p),
        _ => None,
    })
}

fn refusal_names_server(admission: &Admission, server: &str) -> Result<(), String> {
    match admission {
        Admission::Reject(message)
        | Admission::Reconnect(message)
        | Admission::Hold(super::types::Hold { message, .. }) => expect(
            message.contains(server),
            format!("the message for the model must name the server {server:?}: {message:?}"),
        ),
        other => Err(format!("expected the call to be refused, got {other:?}")),
    }
}

fn configured_server_connects(s: &mut Script) -> Result<(), String> {
    let actions = s.configure("alpha")?;
    expect(
        has_connect(&actions, "alpha"),
        format!("expected connect(alpha), got {actions:?}"),
    )
}

fn session_publishes_usable_tool_names(s: &mut Script) -> Result<(), String> {
    let long = "x".repeat(100);
    s.configure("files.v2")?;
    let actions = s.connected("files.v2", &["read file", "write", &long])?;
    let published = publication(&actions, "files.v2")
        .ok_or_else(|| format!("expected tools to be published, got {actions:?}"))?;
    expect(
        published.tools.len() == 3,
        format!("expected 3 tools, got {:?}", published.tools),
    )?;
    let mut seen = std::collections::HashSet::new();
    for tool in &published.tools {
        let valid = (1..=64).contains(&tool.advertised.len())
            && tool
                .advertised
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        expect(
            valid,
            format!("unusable advertised name {:?}", tool.advertised),
        )?;
        expect(
            seen.insert(tool.advertised.clone()),
            format!("duplicate name {:?}", tool.advertised),
        )?;
    }
    let originals: std::collections::BTreeSet<_> = published
        .tools
        .iter()
        .map(|t| t.original.as_str())
        .collect();
    expect(
        originals == ["read file", "write", long.as_str()].into_iter().collect(),
        format!("original names must be kept for routing, got {originals:?}"),
    )?;
    let (_, admission) = s.admit("files.v2", "write")?;
    expect(
        admission == Admission::Allow,
        format!("a fresh session must allow calls, got {admission:?}"),
    )
}

fn transient_failure_retries_after_a_backoff(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    let actions = s.connect_failed("alpha", Fault::TransportClosed("connection reset".into()))?;
    expect(
        !has_connect(&actions, "alpha"),
        "a failed attempt must not be retried without a backoff",
    )?;
    let (at, _) = *s
        .wakes
        .get("alpha")
        .ok_or("expected a backoff timer after a transient failure")?;
    expect(at >= s.now, "the backoff timer must not be in the past")?;
    let actions = s.fire_timer("alpha")?;
    expect(
        has_connect(&actions, "alpha"),
        format!("the backoff timer must connect, got {actions:?}"),
    )
}

fn permanent_fault_parks_at_once(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connect_failed(
        "alpha",
        Fault::SpawnFailed("No such file or directory".into()),
    )?;
    let state = s.state("alpha")?;
    expect(
        state == ServerState::Parked,
        format!("a permanent fault must park at once, state is {state:?}"),
    )?;
    expect(
        s.wakes.contains_key("alpha"),
        "a parked server must keep a self-probe armed",
    )
}

fn failing_server_parks_and_keeps_a_self_probe(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.fail_until_parked("alpha", Fault::HandshakeTimedOut)?;
    // Parked is never the end: the self-probe keeps firing, forever.
    for _ in 0..5 {
        let actions = s.fire_timer("alpha")?;
        expect(
            has_connect(&actions, "alpha"),
            format!("the self-probe must connect, got {actions:?}"),
        )?;
        s.connect_failed("alpha", Fault::HandshakeTimedOut)?;
        let state = s.state("alpha")?;
        expect(
            state == ServerState::Parked,
            format!("a failed self-probe must park again, state is {state:?}"),
        )?;
    }
    let actions = s.fire_timer("alpha")?;
    expect(
        has_connect(&actions, "alpha"),
        "the self-probe must connect",
    )?;
    let actions = s.connected("alpha", &["echo"])?;
    expect(
        publication(&actions, "alpha").is_some(),
        "a revived server must publish its tools",
    )
}

fn handshake_alone_does_not_reset_the_budget(s: &mut Script) -> Result<(), String> {
    s.configure("flappy")?;
    for _ in 0..PARK_WITHIN {
        s.connected("flappy", &["echo"])?;
        s.disconnected("flappy")?;
        if s.state("flappy")? == ServerState::Parked {
            return Ok(());
        }
        let actions = s.fire_timer("flappy")?;
        expect(
            has_connect(&actions, "flappy"),
            "after the backoff the policy must connect",
        )?;
    }
    Err(format!(
        "a server that initializes and dies at once must park within {PARK_WITHIN} cycles (respawn storm)"
    ))
}

fn proven_sessions_never_park(s: &mut Script) -> Result<(), String> {
    s.configure("steady")?;
    for _ in 0..(2 * PARK_WITHIN) {
        s.connected("steady", &["echo"])?;
        s.keepalive_ok("steady")?;
        s.disconnected("steady")?;
        let state = s.state("steady")?;
        expect(
            state != ServerState::Parked,
            "a server whose sessions are proven must never park",
        )?;
        s.fire_timer("steady")?;
    }
    Ok(())
}

fn tools_are_withdrawn_exactly_once(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connected("alpha", &["echo"])?;
    let mut withdrawn = withdrawals(&s.disconnected("alpha")?, "alpha");
    for _ in 0..PARK_WITHIN {
        if s.state("alpha")? == ServerState::Parked {
            break;
        }
        withdrawn += withdrawals(&s.fire_timer("alpha")?, "alpha");
        withdrawn += withdrawals(
            &s.connect_failed("alpha", Fault::HandshakeTimedOut)?,
            "alpha",
        );
    }
    expect(
        s.state("alpha")? == ServerState::Parked,
        "the server must park",
    )?;
    expect(
        withdrawn == 1,
        format!("tools must be withdrawn exactly once, were {withdrawn} times"),
    )?;
    let (_, admission) = s.admit("alpha", "echo")?;
    refusal_names_server(&admission, "alpha")
}

fn reconnect_request_revives_a_parked_server(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connect_failed("alpha", Fault::AuthRequired(401))?;
    expect(
        s.state("alpha")? == ServerState::Parked,
        "auth required must park",
    )?;
    let actions = s.reconnect("alpha", ReconnectSource::Operator)?;
    expect(
        has_connect(&actions, "alpha"),
        format!("a reconnect request must connect a parked server at once, got {actions:?}"),
    )?;
    let actions = s.connected("alpha", &["echo"])?;
    expect(
        publication(&actions, "alpha").is_some(),
        "its tools must come back",
    )
}

fn open_breaker(s: &mut Script, server: &str) -> Result<(), String> {
    for _ in 0..BREAKER_WITHIN {
        let admission = s.call(
            server,
            CallOutcome::TransportError(Fault::TransportClosed("broken pipe".into())),
        )?;
        if !matches!(admission, Admission::Allow | Admission::Probe) {
            return refusal_names_server(&admission, server);
        }
    }
    Err(format!(
        "the breaker did not open after {BREAKER_WITHIN} consecutive transport failures"
    ))
}

fn breaker_opens_and_fails_fast(s: &mut Script) -> Result<(), String> {
    s.healthy("alpha", &["work"])?;
    open_breaker(s, "alpha")?;
    let (_, admission) = s.admit("alpha", "work")?;
    refusal_names_server(&admission, "alpha")
}

fn exactly_one_half_open_probe(s: &mut Script) -> Result<(), String> {
    s.healthy("alpha", &["work"])?;
    open_breaker(s, "alpha")?;
    s.advance(LONG_MS);
    let (probe_id, first) = s.admit("alpha", "work")?;
    expect(
        first == Admission::Probe,
        format!("after the cooldown one call must probe, got {first:?}"),
    )?;
    let (_, second) = s.admit("alpha", "work")?;
    refusal_names_server(&second, "alpha")?;
    s.finish("alpha", probe_id, CallOutcome::Ok)?;
    let (_, after) = s.admit("alpha", "work")?;
    expect(
        after == Admission::Allow,
        format!("a successful probe must close the breaker, got {after:?}"),
    )
}

fn probe_without_session_signals_reconnect(s: &mut Script) -> Result<(), String> {
    s.healthy("alpha", &["work"])?;
    open_breaker(s, "alpha")?;
    s.disconnected("alpha")?;
    s.advance(LONG_MS);
    let (_, admission) = s.admit("alpha", "work")?;
    expect(
        matches!(admission, Admission::Reconnect(_)),
        format!("a probe that finds no live session must signal a reconnect, got {admission:?}"),
    )?;
    refusal_names_server(&admission, "alpha")?;
    let actions = s.reconnect("alpha", ReconnectSource::Probe)?;
    expect(
        has_connect(&actions, "alpha"),
        format!("the probe's reconnect must connect, got {actions:?}"),
    )?;
    s.connected("alpha", &["work"])?;
    let (_, admission) = s.admit("alpha", "work")?;
    expect(
        admission == Admission::Allow,
        format!("a new session must close the breaker, got {admission:?}"),
    )
}

fn tool_errors_do_not_open_the_breaker(s: &mut Script) -> Result<(), String> {
    s.healthy("alpha", &["work"])?;
    for _ in 0..(3 * BREAKER_WITHIN) {
        let admission = s.call("alpha", CallOutcome::ToolError("invalid arguments".into()))?;
        expect(
            admission == Admission::Allow,
            format!("tool errors must not open the breaker, got {admission:?}"),
        )?;
    }
    Ok(())
}

fn removal_withdraws_and_forgets(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connected("alpha", &["echo"])?;
    let actions = s.event(EventKind::ServerRemoved("alpha".into()))?;
    expect(
        withdrawals(&actions, "alpha") == 1,
        format!("removal must withdraw the tools once, got {actions:?}"),
    )?;
    expect(
        actions
            .iter()
            .any(|a| matches!(a, Action::Disconnect(s) if s == "alpha")),
        "removal must disconnect the server",
    )?;
    let (_, admission) = s.admit("alpha", "echo")?;
    expect(
        matches!(admission, Admission::Reject(_)),
        format!("a removed server's calls must be refused, got {admission:?}"),
    )
}

fn shutdown_withdraws_every_server(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connected("alpha", &["echo"])?;
    s.configure("beta")?;
    s.connected("beta", &["echo"])?;
    let actions = s.event(EventKind::Shutdown)?;
    for server in ["alpha", "beta"] {
        expect(
            withdrawals(&actions, server) == 1,
            format!("shutdown must withdraw {server}'s tools once, got {actions:?}"),
        )?;
    }
    Ok(())
}

fn tools_changed_republishes_only_on_difference(s: &mut Script) -> Result<(), String> {
    s.configure("alpha")?;
    s.connected("alpha", &["one", "two"])?;
    let same = s.event(EventKind::ToolsChanged(ServerTools {
        server: "alpha".into(),
        tools: vec![tool("two"), tool("one")],
    }))?;
    expect(
        publication(&same, "alpha").is_none(),
        format!("an unchanged tool list must not be republished, got {same:?}"),
    )?;
    let changed = s.event(EventKind::ToolsChanged(ServerTools {
        server: "alpha".into(),
        tools: vec![tool("one"), tool("three")],
    }))?;
    let published =
        publication(&changed, "alpha").ok_or("a changed tool list must be republished")?;
    let originals: Vec<_> = published
        .tools
        .iter()
        .map(|t| t.original.as_str())
        .collect();
    expect(
        originals.contains(&"one") && originals.contains(&"three") && !originals.contains(&"two"),
        format!("the republished set must be exactly the new tools, got {originals:?}"),
    )
}

fn include_and_exclude_filter_tools(s: &mut Script) -> Result<(), String> {
    s.configure_with("alpha", &["read_*"], &["read_secret"])?;
    let actions = s.connected("alpha", &["read_file", "read_secret", "write_file"])?;
    let published = publication(&actions, "alpha").ok_or("expected a publication")?;
    let originals: Vec<_> = published
        .tools
        .iter()
        .map(|t| t.original.as_str())
        .collect();
    expect(
        originals == ["read_file"],
        format!("include read_* minus read_secret must publish only read_file, got {originals:?}"),
    )
}

fn state_survives_snapshot_and_restore(s: &mut Script) -> Result<(), String> {
    // Build up budget and breaker state, move it into a fresh instance, and check it is intact.
    s.healthy("alpha", &["work"])?;
    open_breaker(s, "alpha")?;
    s.configure("beta")?;
    s.connect_failed("beta", Fault::HandshakeTimedOut)?;
    let before = (s.status("alpha")?, s.status("beta")?);
    // A swap to the same component is snapshot() in the old instance, restore() in a new one.
    s.runtime
        .swap_blocking(&s.source)
        .map_err(|e| format!("moving the state into a fresh instance failed: {e}"))?;
    let after = (s.status("alpha")?, s.status("beta")?);
    expect(
        before == after,
        format!("status changed across snapshot/restore: {before:?} -> {after:?}"),
    )?;
    let (_, admission) = s.admit("alpha", "work")?;
    refusal_names_server(&admission, "alpha")?;
    s.advance(LONG_MS);
    let (_, probe) = s.admit("alpha", "work")?;
    expect(
        probe == Admission::Probe,
        format!("the restored breaker must still half-open, got {probe:?}"),
    )?;
    s.fire_timer("beta")?;
    let attempts = s.fail_until_parked("beta", Fault::HandshakeTimedOut)?;
    expect(
        attempts < PARK_WITHIN,
        "the restored budget must still be counting",
    )
}

/// A fixed story: a server that fails, backs off, comes up, answers and fails calls, is proven,
/// dies; every output, in order, as text.
fn story(s: &mut Script) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    out.push(format!("{:?}", s.configure("alpha")?));
    out.push(format!(
        "{:?}",
        s.connect_failed("alpha", Fault::TransportClosed("reset".into()))?
    ));
    if s.wakes.contains_key("alpha") {
        out.push(format!("{:?}", s.fire_timer("alpha")?));
    }
    out.push(format!("{:?}", s.connected("alpha", &["work", "read"])?));
    for outcome in [
        CallOutcome::Ok,
        CallOutcome::TransportError(Fault::TransportClosed("reset".into())),
        CallOutcome::Timeout,
        CallOutcome::ToolError("bad".into()),
    ] {
        out.push(format!("{:?}", s.call("alpha", outcome)?));
    }
    out.push(format!("{:?}", s.keepalive_ok("alpha")?));
    out.push(format!("{:?}", s.disconnected("alpha")?));
    if s.wakes.contains_key("alpha") {
        out.push(format!("{:?}", s.fire_timer("alpha")?));
    }
    out.push(format!("{:?}", s.status("alpha")?));
    Ok(out)
}

fn decisions_are_deterministic(s: &mut Script) -> Result<(), String> {
    let first = story(s)?;
    let mut twin = Script::start(&s.engine.clone(), &s.source.clone(), &s.settings.clone())?;
    let second = story(&mut twin)?;
    match first.iter().zip(&second).position(|(a, b)| a != b) {
        None if first.len() == second.len() => Ok(()),
        at => Err(format!(
            "the same inputs gave other outputs in a fresh instance (output {}): {:?} vs {:?}",
            at.unwrap_or(first.len().min(second.len())) + 1,
            at.map(|i| &first[i]),
            at.map(|i| &second[i])
        )),
    }
}

fn takes_over_another_policy_keeping_sessions(s: &mut Script) -> Result<(), String> {
    // The default policy runs first: alpha up with tools, beta backing off.
    let outgoing = PolicyRuntime::start(RuntimeOptions {
        engine: Some(s.engine.clone()),
        source: PolicySource::Embedded,
        fallback_to_default: false,
        ..RuntimeOptions::default()
    })
    .map_err(|e| format!("the default policy did not start: {e}"))?;
    let event = |now, kind| outgoing.handle(Event { now, kind }).wait();
    let config = |name: &str| ServerConfig {
        name: name.into(),
        transport: TransportKind::Stdio,
        include: vec![],
        exclude: vec![],
        settings: String::new(),
    };
    let setup = (|| {
        event(1, EventKind::ServerConfigured(config("alpha")))?;
        event(
            2,
            EventKind::Connected(SessionInfo {
                server: "alpha".into(),
                server_info: "conformance 1.0".into(),
                tools: vec![tool("work")],
            }),
        )?;
        event(3, EventKind::KeepaliveOk("alpha".into()))?;
        event(4, EventKind::ServerConfigured(config("beta")))?;
        event(
            5,
            EventKind::ConnectFailed(ServerFault {
                server: "beta".into(),
                fault: Fault::HandshakeTimedOut,
            }),
        )
    })();
    setup.map_err(|e| format!("the default policy failed the setup: {e}"))?;
    s.step += 1;
    s.last = "swap from the default policy".into();
    // A take-over that connects alpha again (its session is live) is refused by the runtime.
    let report = outgoing
        .swap_blocking(&s.source)
        .map_err(|e| format!("the handover was refused: {e}"))?;
    let status = outgoing.status().wait().map_err(|e| e.to_string())?;
    let alpha = status
        .iter()
        .find(|st| st.server == "alpha")
        .ok_or("after the handover, status() does not list alpha")?;
    let beta = status.iter().find(|st| st.server == "beta");
    expect(
        beta.is_some(),
        "after the handover, status() does not list beta",
    )?;
    // A 0.1 policy is taught by events and cannot be asked for more.
    if report.path == super::SwapPath::Events {
        return Ok(());
    }
    expect(
        matches!(alpha.state, ServerState::Connected | ServerState::Healthy),
        format!(
            "alpha's live session must be kept, state is {:?}",
            alpha.state
        ),
    )?;
    let admission = outgoing
        .admit(CallRequest {
            now: 10,
            call_id: 1,
            server: "alpha".into(),
            tool: "work".into(),
        })
        .wait()
        .map_err(|e| e.to_string())?;
    expect(
        admission == Admission::Allow,
        format!("a kept session must allow calls, got {admission:?}"),
    )
}
