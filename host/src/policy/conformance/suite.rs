//! The scenarios, written once as data. They check behaviour, not one policy's parameters: they
//! use the policy's own settings, fire every timer it asks for, and allow generous bounds
//! ("parks within 25 attempts").
//!
//! A contract scenario asserts its own rule and nothing else, over whatever the policy does: it
//! reaches its point with events any policy answers alike, bounds its loops by steps (never by
//! the policy parking or its breaker opening), and asks nothing of backoff, parking, the
//! breaker or attempt counts. Those are Tether's invariants, a level of their own.

use super::script::{AdmissionCase, Level, Predicate, Scenario, Step};
use crate::policy::types::{
    BreakerState, CallOutcome, EventKind, Fault, Handover, LiveSession, Naming, PolicyInfo,
    ReconnectRequest, ReconnectSource, ServerConfig, ServerFault, ServerHandover, ServerState,
    ServerTools, SessionInfo, Tool, TransportKind,
};

/// Attempts within which a failing server must be parked.
const PARK_WITHIN: u32 = 25;
/// Failed attempts a contract scenario feeds a server that keeps retrying: enough to see a
/// pattern, bounded whatever the policy does (one that retries forever included).
const ATTEMPTS: u32 = 10;
/// Consecutive transport failures within which the breaker must open.
const BREAKER_WITHIN: u32 = 10;
/// Virtual time far beyond any sane cooldown or backoff.
const LONG_MS: u64 = 24 * 3600 * 1000;

/// Every scenario, in order: the contract's, then the invariants'.
pub fn scenarios() -> Vec<Scenario> {
    use Level::{Contract, Invariant};
    let scenario = |name, level, summary, steps| Scenario {
        name,
        level,
        summary,
        since: None,
        steps,
    };
    vec![
        scenario(
            "session-publishes-usable-tool-names",
            Contract,
            "A session's tools are published under usable, unique names that keep the originals, and can be called.",
            session_publishes_usable_tool_names(),
        ),
        scenario(
            "lost-session-withdraws-its-tools",
            Contract,
            "A session's end withdraws its tools, and none are shown again while the server has no session.",
            lost_session_withdraws_its_tools(),
        ),
        scenario(
            "removal-withdraws-and-forgets",
            Contract,
            "A removed server is withdrawn, disconnected and its calls refused.",
            removal_withdraws_and_forgets(),
        ),
        scenario(
            "shutdown-withdraws-every-server",
            Contract,
            "Shutdown withdraws every server's tools.",
            shutdown_withdraws_every_server(),
        ),
        scenario(
            "changed-tools-are-republished",
            Contract,
            "A changed tool list, or a changed tool, is republished as exactly the new tools.",
            changed_tools_are_republished(),
        ),
        scenario(
            "include-and-exclude-filter-tools",
            Contract,
            "The include and exclude globs decide which tools are published.",
            include_and_exclude_filter_tools(),
        ),
        scenario(
            "decisions-are-deterministic",
            Contract,
            "The same inputs give the same outputs in a fresh instance.",
            decisions_are_deterministic(),
        ),
        scenario(
            "state-survives-snapshot-and-restore",
            Contract,
            "A fresh instance restored from a snapshot reports the same status and decides as the original.",
            state_survives_snapshot_and_restore(),
        ),
        scenario(
            "takes-over-another-policy-keeping-sessions",
            Contract,
            "A handover from another implementation is adopted without reconnecting live sessions.",
            takes_over_another_policy_keeping_sessions(),
        ),
        Scenario {
            name: "names-follow-the-operators-naming",
            level: Contract,
            summary: "Tools and prompts are named as the operator asked: a server's own names, or a prefix.",
            since: Some("0.2.1"),
            steps: names_follow_the_operators_naming(),
        },
        scenario(
            "configured-server-connects",
            Invariant,
            "A configured server is connected.",
            vec![
                configure("alpha"),
                expect(connects("alpha"), "expected connect(alpha)"),
            ],
        ),
        scenario(
            "transient-failure-retries-after-a-backoff",
            Invariant,
            "A transient failure is retried, after a backoff.",
            transient_failure_retries_after_a_backoff(),
        ),
        scenario(
            "permanent-fault-parks-at-once",
            Invariant,
            "A permanent fault parks the server at once, with a self-probe armed.",
            permanent_fault_parks_at_once(),
        ),
        scenario(
            "failing-server-parks-and-keeps-a-self-probe",
            Invariant,
            "A failing server parks, and its self-probe keeps trying forever.",
            failing_server_parks_and_keeps_a_self_probe(),
        ),
        scenario(
            "handshake-alone-does-not-reset-the-budget",
            Invariant,
            "A server that initializes and dies at once parks: a handshake is no proof.",
            handshake_alone_does_not_reset_the_budget(),
        ),
        scenario(
            "proven-sessions-never-park",
            Invariant,
            "A server whose sessions are proven never parks.",
            proven_sessions_never_park(),
        ),
        scenario(
            "reconnect-request-revives-a-parked-server",
            Invariant,
            "A reconnect request connects a parked server at once.",
            reconnect_request_revives_a_parked_server(),
        ),
        scenario(
            "breaker-opens-and-fails-fast",
            Invariant,
            "Consecutive transport failures open the breaker, which refuses calls.",
            [healthy("alpha", &["work"]), open_breaker("alpha")].concat(),
        ),
        scenario(
            "exactly-one-half-open-probe",
            Invariant,
            "After the cooldown exactly one call probes; its success closes the breaker.",
            exactly_one_half_open_probe(),
        ),
        scenario(
            "probe-without-session-signals-reconnect",
            Invariant,
            "A probe that finds no live session signals a reconnect.",
            probe_without_session_signals_reconnect(),
        ),
        scenario(
            "tools-are-withdrawn-exactly-once",
            Invariant,
            "A dead session's tools are withdrawn once, however many attempts fail after it.",
            tools_are_withdrawn_exactly_once(),
        ),
        scenario(
            "tools-changed-republishes-only-on-difference",
            Invariant,
            "An unchanged tool list is not published again.",
            tools_changed_republishes_only_on_difference(),
        ),
        scenario(
            "tool-errors-do-not-open-the-breaker",
            Invariant,
            "Tool errors never open the breaker.",
            [
                healthy("alpha", &["work"]),
                vec![repeat(
                    3 * BREAKER_WITHIN,
                    vec![
                        call("alpha", CallOutcome::ToolError("invalid arguments".into())),
                        expect(
                            admission(AdmissionCase::Allow),
                            "tool errors must not open the breaker",
                        ),
                    ],
                    None,
                )],
            ]
            .concat(),
        ),
    ]
}

// Steps.

fn event(kind: EventKind) -> Step {
    Step::Event { kind }
}

fn config(server: &str, include: &[&str], exclude: &[&str]) -> ServerConfig {
    ServerConfig {
        name: server.into(),
        transport: TransportKind::Stdio,
        include: include.iter().map(|s| s.to_string()).collect(),
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
        settings: String::new(),
        prefix: None,
    }
}

fn configure(server: &str) -> Step {
    event(EventKind::ServerConfigured(config(server, &[], &[])))
}

fn tool(name: &str) -> Tool {
    Tool {
        name: name.into(),
        description: Some(format!("the {name} tool")),
        input_schema: r#"{"type":"object"}"#.into(),
        extra: String::new(),
        read_only: false,
    }
}

/// `name` as [`tool`] makes it, with another description (so another revision).
fn tool_described(name: &str, description: &str) -> Tool {
    Tool {
        description: Some(description.into()),
        ..tool(name)
    }
}

fn tools(names: &[&str]) -> Vec<Tool> {
    names.iter().map(|name| tool(name)).collect()
}

fn connected(server: &str, names: &[&str]) -> Step {
    event(EventKind::Connected(SessionInfo {
        server: server.into(),
        server_info: "conformance 1.0".into(),
        tools: tools(names),
    }))
}

fn connect_failed(server: &str, fault: Fault) -> Step {
    event(EventKind::ConnectFailed(ServerFault {
        server: server.into(),
        fault,
    }))
}

fn disconnected(server: &str) -> Step {
    event(EventKind::Disconnected(ServerFault {
        server: server.into(),
        fault: Fault::ProcessExited(Some(1)),
    }))
}

fn keepalive_ok(server: &str) -> Step {
    event(EventKind::KeepaliveOk(server.into()))
}

fn reconnect(server: &str, source: ReconnectSource) -> Step {
    event(EventKind::ReconnectRequested(ReconnectRequest {
        server: server.into(),
        source,
    }))
}

fn fire_timer(server: &str) -> Step {
    Step::FireTimer {
        server: server.into(),
        optional: false,
    }
}

fn fire_timer_if_armed(server: &str) -> Step {
    Step::FireTimer {
        server: server.into(),
        optional: true,
    }
}

fn admit(server: &str, tool: &str) -> Step {
    Step::Admit {
        server: server.into(),
        tool: tool.into(),
        name: None,
    }
}

fn call(server: &str, outcome: CallOutcome) -> Step {
    Step::Call {
        server: server.into(),
        tool: "work".into(),
        outcome,
    }
}

fn expect(that: Predicate, otherwise: &str) -> Step {
    Step::Expect {
        that,
        otherwise: otherwise.into(),
    }
}

fn stop_if(that: Predicate) -> Step {
    Step::StopIf { that }
}

fn repeat(times: u32, steps: Vec<Step>, otherwise: Option<String>) -> Step {
    Step::Repeat {
        times,
        steps,
        otherwise,
    }
}

// Predicates.

fn connects(server: &str) -> Predicate {
    Predicate::Connects(server.into())
}

fn publishes(server: &str) -> Predicate {
    Predicate::Publishes(server.into())
}

fn publishes_originals(server: &str, originals: &[&str]) -> Predicate {
    Predicate::PublishesOriginals {
        server: server.into(),
        originals: originals.iter().map(|s| s.to_string()).collect(),
    }
}

fn admission(case: AdmissionCase) -> Predicate {
    Predicate::Admission(case)
}

fn refused_naming(server: &str) -> Predicate {
    Predicate::RefusedNaming(server.into())
}

fn state_in(server: &str, states: &[ServerState]) -> Predicate {
    Predicate::State {
        server: server.into(),
        states: states.to_vec(),
    }
}

fn published(server: &str) -> Predicate {
    Predicate::Published(server.into())
}

fn redundant(server: &str) -> Predicate {
    Predicate::Redundant(server.into())
}

fn attempting(server: &str) -> Predicate {
    Predicate::Attempting(server.into())
}

fn parked(server: &str) -> Predicate {
    state_in(server, &[ServerState::Parked])
}

fn not(predicate: Predicate) -> Predicate {
    Predicate::Not(Box::new(predicate))
}

// Building blocks.

/// Brings `server` to a connected, proven session with `names` as its tools.
fn healthy(server: &str, names: &[&str]) -> Vec<Step> {
    vec![
        configure(server),
        connected(server, names),
        keepalive_ok(server),
    ]
}

/// Fails connection attempts with `fault` (firing each backoff timer) until the server parks,
/// within `within` attempts.
fn fail_until_parked(server: &str, fault: Fault, within: u32, otherwise: &str) -> Step {
    repeat(
        within,
        vec![
            connect_failed(server, fault),
            Step::Status,
            stop_if(parked(server)),
            fire_timer(server),
            expect(
                connects(server),
                &format!("after the backoff the policy must connect {server}"),
            ),
        ],
        Some(otherwise.into()),
    )
}

/// Fails the server's attempts, at most `times`: fires whatever timer the policy armed, fails the
/// attempt it then has in flight, and checks `after` after each of those events. Ends early when
/// no attempt is in flight (the policy gave up), so it holds as well for a policy that retries
/// forever as for one that stops, whatever their backoff.
fn failing_attempts(server: &str, times: u32, after: Vec<Step>) -> Step {
    let mut steps = vec![fire_timer_if_armed(server)];
    steps.extend(after.iter().cloned());
    steps.push(stop_if(not(attempting(server))));
    steps.push(connect_failed(server, Fault::HandshakeTimedOut));
    steps.extend(after);
    repeat(times, steps, None)
}

/// Fails calls with transport errors until the breaker refuses one, naming the server.
fn open_breaker(server: &str) -> Vec<Step> {
    let broken = || CallOutcome::TransportError(Fault::TransportClosed("broken pipe".into()));
    vec![
        // BREAKER_WITHIN failures, then the admission that must be refused.
        repeat(
            BREAKER_WITHIN + 1,
            vec![
                call(server, broken()),
                stop_if(not(admission(AdmissionCase::Allow))),
            ],
            None,
        ),
        expect(
            refused_naming(server),
            &format!(
                "the breaker did not open after {BREAKER_WITHIN} consecutive transport failures \
                 (or its refusal does not name {server})"
            ),
        ),
        admit(server, "work"),
        expect(
            refused_naming(server),
            "an open breaker must refuse calls, naming the server",
        ),
    ]
}

// The scenarios' steps.

fn session_publishes_usable_tool_names() -> Vec<Step> {
    let long = "x".repeat(100);
    vec![
        configure("files.v2"),
        connected("files.v2", &["read file", "write", &long]),
        expect(
            publishes_originals("files.v2", &["read file", "write", &long]),
            "the three tools must be published, keeping their original names for routing",
        ),
        expect(
            Predicate::PublishesUsableNames("files.v2".into()),
            "advertised names must match [A-Za-z0-9_-]{1,64} and be unique",
        ),
        admit("files.v2", "write"),
        expect(
            admission(AdmissionCase::Allow),
            "a fresh session must allow calls",
        ),
    ]
}

fn lost_session_withdraws_its_tools() -> Vec<Step> {
    vec![
        configure("alpha"),
        connected("alpha", &["echo"]),
        disconnected("alpha"),
        expect(
            not(published("alpha")),
            "a dead session's tools must be withdrawn at once",
        ),
        failing_attempts(
            "alpha",
            ATTEMPTS,
            vec![expect(
                not(published("alpha")),
                "no tools may be shown for a server without a session",
            )],
        ),
    ]
}

fn removal_withdraws_and_forgets() -> Vec<Step> {
    vec![
        configure("alpha"),
        connected("alpha", &["echo"]),
        event(EventKind::ServerRemoved("alpha".into())),
        expect(not(published("alpha")), "removal must withdraw the tools"),
        expect(
            Predicate::Disconnects("alpha".into()),
            "removal must disconnect the server",
        ),
        admit("alpha", "echo"),
        expect(
            admission(AdmissionCase::Reject),
            "a removed server's calls must be refused",
        ),
    ]
}

fn shutdown_withdraws_every_server() -> Vec<Step> {
    vec![
        configure("alpha"),
        connected("alpha", &["echo"]),
        configure("beta"),
        connected("beta", &["echo"]),
        event(EventKind::Shutdown),
        expect(
            not(published("alpha")),
            "shutdown must withdraw alpha's tools",
        ),
        expect(
            not(published("beta")),
            "shutdown must withdraw beta's tools",
        ),
    ]
}

fn tools_changed(server: &str, tools: Vec<Tool>) -> Step {
    event(EventKind::ToolsChanged(ServerTools {
        server: server.into(),
        tools,
    }))
}

fn changed_tools_are_republished() -> Vec<Step> {
    let exactly = "a changed tool list must be republished as exactly the new tools";
    vec![
        configure("alpha"),
        connected("alpha", &["one", "two"]),
        tools_changed("alpha", tools(&["one", "three"])),
        expect(publishes_originals("alpha", &["one", "three"]), exactly),
        tools_changed(
            "alpha",
            vec![
                tool_described("one", "the one tool, revised"),
                tool("three"),
            ],
        ),
        expect(
            publishes_originals("alpha", &["one", "three"]),
            "a tool whose description changed must be republished (agents would read the old one)",
        ),
    ]
}

fn include_and_exclude_filter_tools() -> Vec<Step> {
    vec![
        event(EventKind::ServerConfigured(config(
            "alpha",
            &["read_*"],
            &["read_secret"],
        ))),
        connected("alpha", &["read_file", "read_secret", "write_file"]),
        expect(
            publishes_originals("alpha", &["read_file"]),
            "include read_* minus read_secret must publish only read_file",
        ),
    ]
}

/// A fixed story: a server that fails, backs off, comes up, answers and fails calls, is proven,
/// dies.
fn story() -> Vec<Step> {
    let reset = || Fault::TransportClosed("reset".into());
    vec![
        configure("alpha"),
        connect_failed("alpha", reset()),
        fire_timer_if_armed("alpha"),
        connected("alpha", &["work", "read"]),
        call("alpha", CallOutcome::Ok),
        call("alpha", CallOutcome::TransportError(reset())),
        call("alpha", CallOutcome::Timeout),
        call("alpha", CallOutcome::ToolError("bad".into())),
        keepalive_ok("alpha"),
        disconnected("alpha"),
        fire_timer_if_armed("alpha"),
        Step::Status,
    ]
}

fn decisions_are_deterministic() -> Vec<Step> {
    vec![Step::Twice { steps: story() }]
}

fn state_survives_snapshot_and_restore() -> Vec<Step> {
    let broken = || CallOutcome::TransportError(Fault::TransportClosed("broken pipe".into()));
    vec![
        // State worth keeping, whatever the policy makes of it: failed calls on a live session,
        // a failed attempt on another server.
        configure("alpha"),
        connected("alpha", &["work"]),
        keepalive_ok("alpha"),
        repeat(3, vec![call("alpha", broken())], None),
        configure("beta"),
        failing_attempts("beta", 1, vec![]),
        // The restored instance must report the same status and answer what follows as the
        // original does: calls, attempts, a session's end, time passing.
        Step::SnapshotRestore {
            steps: vec![
                call("alpha", CallOutcome::Ok),
                call("alpha", broken()),
                admit("alpha", "work"),
                failing_attempts("beta", 3, vec![]),
                disconnected("alpha"),
                fire_timer_if_armed("alpha"),
                Step::Advance { ms: LONG_MS },
                admit("alpha", "work"),
            ],
        },
    ]
}

fn takes_over_another_policy_keeping_sessions() -> Vec<Step> {
    // What Tether hands over when it swaps from its default policy with alpha up and proven,
    // and beta backing off after a failed attempt.
    let handover = Handover {
        now: 1_000,
        servers: vec![
            ServerHandover {
                config: config("alpha", &[], &[]),
                session: Some(LiveSession {
                    server_info: "conformance 1.0".into(),
                    tools: tools(&["work"]),
                    proven: true,
                }),
                connecting: false,
                state: ServerState::Healthy,
                breaker: BreakerState::Closed,
                breaker_until: None,
                failures: 0,
                breaker_failures: 0,
                tool_errors: 0,
                last_fault: None,
                since: 990,
                next_attempt_at: None,
            },
            ServerHandover {
                config: config("beta", &[], &[]),
                session: None,
                connecting: false,
                state: ServerState::BackingOff,
                breaker: BreakerState::Closed,
                breaker_until: None,
                failures: 1,
                breaker_failures: 0,
                tool_errors: 0,
                last_fault: Some(Fault::HandshakeTimedOut.to_string()),
                since: 995,
                next_attempt_at: Some(1_015),
            },
        ],
        previous: PolicyInfo {
            name: "tether-default".into(),
            version: "0.2.0".into(),
        },
    };
    vec![
        Step::TakeOver {
            handover,
            namings: None,
        },
        expect(
            not(connects("alpha")),
            "alpha's session is live: the handover must not connect it again",
        ),
        Step::Status,
        expect(
            Predicate::Lists("alpha".into()),
            "after the handover, status() must list alpha",
        ),
        expect(
            Predicate::Lists("beta".into()),
            "after the handover, status() must list beta",
        ),
        expect(
            state_in("alpha", &[ServerState::Connected, ServerState::Healthy]),
            "alpha's live session must be kept",
        ),
        admit("alpha", "work"),
        expect(
            admission(AdmissionCase::Allow),
            "a kept session must allow calls",
        ),
    ]
}

fn naming(server: &str, prefix: &str) -> Naming {
    Naming {
        server: server.into(),
        prefix: Some(prefix.into()),
    }
}

fn pairs(names: &[(&str, &str)]) -> Vec<(String, String)> {
    names
        .iter()
        .map(|(original, advertised)| (original.to_string(), advertised.to_string()))
        .collect()
}

fn publishes_advertised(server: &str, names: &[(&str, &str)]) -> Predicate {
    Predicate::PublishesAdvertised {
        server: server.into(),
        names: pairs(names),
    }
}

fn name_prompts(server: &str, originals: &[&str]) -> Step {
    Step::NamePrompts {
        server: server.into(),
        originals: originals.iter().map(|s| s.to_string()).collect(),
    }
}

fn names_follow_the_operators_naming() -> Vec<Step> {
    let own = "with prefix \"\" the server's own (usable) names must be published";
    let prefixed = "with prefix \"x-\" each name must be published as x-<name>";
    let handover = Handover {
        now: 1_000,
        servers: vec![ServerHandover {
            config: config("beta", &[], &[]),
            session: Some(LiveSession {
                server_info: "conformance 1.0".into(),
                tools: tools(&["read_file", "list"]),
                proven: true,
            }),
            connecting: false,
            state: ServerState::Healthy,
            breaker: BreakerState::Closed,
            breaker_until: None,
            failures: 0,
            breaker_failures: 0,
            tool_errors: 0,
            last_fault: None,
            since: 990,
            next_attempt_at: None,
        }],
        previous: PolicyInfo {
            name: "tether-default".into(),
            version: "0.2.1".into(),
        },
    };
    vec![
        Step::SetNaming {
            naming: naming("beta", ""),
        },
        configure("beta"),
        Step::SetNaming {
            naming: naming("gamma", "x-"),
        },
        configure("gamma"),
        connected("beta", &["read_file", "write_file"]),
        expect(
            publishes_advertised(
                "beta",
                &[("read_file", "read_file"), ("write_file", "write_file")],
            ),
            own,
        ),
        connected("gamma", &["read"]),
        expect(
            publishes_advertised("gamma", &[("read", "x-read")]),
            prefixed,
        ),
        name_prompts("beta", &["summarize", "review"]),
        expect(
            Predicate::NamesPrompts(pairs(&[("summarize", "summarize"), ("review", "review")])),
            "prompts must be named by the rule of the server's tools (its own names)",
        ),
        name_prompts("gamma", &["summarize"]),
        expect(
            Predicate::NamesPrompts(pairs(&[("summarize", "x-summarize")])),
            "prompts must be named by the rule of the server's tools (prefix x-)",
        ),
        Step::SnapshotRestore { steps: vec![] },
        name_prompts("beta", &["summarize"]),
        expect(
            Predicate::NamesPrompts(pairs(&[("summarize", "summarize")])),
            "the naming (the server's own names) must survive snapshot and restore",
        ),
        name_prompts("gamma", &["summarize"]),
        expect(
            Predicate::NamesPrompts(pairs(&[("summarize", "x-summarize")])),
            "the naming (prefix x-) must survive snapshot and restore",
        ),
        Step::TakeOver {
            handover,
            namings: Some(vec![naming("beta", "")]),
        },
        expect(
            publishes_advertised("beta", &[("read_file", "read_file"), ("list", "list")]),
            "a policy taking over must name a live server's tools as the operator asked",
        ),
    ]
}

fn transient_failure_retries_after_a_backoff() -> Vec<Step> {
    vec![
        configure("alpha"),
        connect_failed("alpha", Fault::TransportClosed("connection reset".into())),
        expect(
            not(connects("alpha")),
            "a failed attempt must not be retried without a backoff",
        ),
        expect(
            Predicate::TimerArmed("alpha".into()),
            "expected a backoff timer after a transient failure",
        ),
        expect(
            Predicate::TimerNotInThePast("alpha".into()),
            "the backoff timer must not be in the past",
        ),
        fire_timer("alpha"),
        expect(connects("alpha"), "the backoff timer must connect"),
    ]
}

fn permanent_fault_parks_at_once() -> Vec<Step> {
    vec![
        configure("alpha"),
        connect_failed(
            "alpha",
            Fault::SpawnFailed("No such file or directory".into()),
        ),
        Step::Status,
        expect(parked("alpha"), "a permanent fault must park at once"),
        expect(
            Predicate::TimerArmed("alpha".into()),
            "a parked server must keep a self-probe armed",
        ),
    ]
}

fn failing_server_parks_and_keeps_a_self_probe() -> Vec<Step> {
    vec![
        configure("alpha"),
        fail_until_parked(
            "alpha",
            Fault::HandshakeTimedOut,
            PARK_WITHIN,
            &format!("alpha was not parked after {PARK_WITHIN} failed attempts"),
        ),
        admit("alpha", "echo"),
        expect(
            refused_naming("alpha"),
            "a parked server's calls must be refused, naming the server",
        ),
        // Parked is never the end: the self-probe keeps firing, forever.
        repeat(
            5,
            vec![
                fire_timer("alpha"),
                expect(connects("alpha"), "the self-probe must connect"),
                connect_failed("alpha", Fault::HandshakeTimedOut),
                Step::Status,
                expect(parked("alpha"), "a failed self-probe must park again"),
            ],
            None,
        ),
        fire_timer("alpha"),
        expect(connects("alpha"), "the self-probe must connect"),
        connected("alpha", &["echo"]),
        expect(
            publishes("alpha"),
            "a revived server must publish its tools",
        ),
    ]
}

fn handshake_alone_does_not_reset_the_budget() -> Vec<Step> {
    vec![
        configure("flappy"),
        repeat(
            PARK_WITHIN,
            vec![
                connected("flappy", &["echo"]),
                disconnected("flappy"),
                Step::Status,
                stop_if(parked("flappy")),
                fire_timer("flappy"),
                expect(
                    connects("flappy"),
                    "after the backoff the policy must connect",
                ),
            ],
            Some(format!(
                "a server that initializes and dies at once must park within {PARK_WITHIN} \
                 cycles (respawn storm)"
            )),
        ),
    ]
}

fn proven_sessions_never_park() -> Vec<Step> {
    vec![
        configure("steady"),
        repeat(
            2 * PARK_WITHIN,
            vec![
                connected("steady", &["echo"]),
                keepalive_ok("steady"),
                disconnected("steady"),
                Step::Status,
                expect(
                    not(parked("steady")),
                    "a server whose sessions are proven must never park",
                ),
                fire_timer("steady"),
            ],
            None,
        ),
    ]
}

fn reconnect_request_revives_a_parked_server() -> Vec<Step> {
    vec![
        configure("alpha"),
        connect_failed("alpha", Fault::AuthRequired(401)),
        Step::Status,
        expect(parked("alpha"), "auth required must park"),
        reconnect("alpha", ReconnectSource::Operator),
        expect(
            connects("alpha"),
            "a reconnect request must connect a parked server at once",
        ),
        connected("alpha", &["echo"]),
        expect(publishes("alpha"), "its tools must come back"),
    ]
}

fn exactly_one_half_open_probe() -> Vec<Step> {
    [
        healthy("alpha", &["work"]),
        open_breaker("alpha"),
        vec![
            Step::Advance { ms: LONG_MS },
            Step::Admit {
                server: "alpha".into(),
                tool: "work".into(),
                name: Some("probe".into()),
            },
            expect(
                admission(AdmissionCase::Probe),
                "after the cooldown one call must probe",
            ),
            admit("alpha", "work"),
            expect(
                refused_naming("alpha"),
                "a second call during the probe must be refused, naming the server",
            ),
            Step::Finish {
                server: "alpha".into(),
                call: Some("probe".into()),
                outcome: CallOutcome::Ok,
            },
            admit("alpha", "work"),
            expect(
                admission(AdmissionCase::Allow),
                "a successful probe must close the breaker",
            ),
        ],
    ]
    .concat()
}

fn probe_without_session_signals_reconnect() -> Vec<Step> {
    [
        healthy("alpha", &["work"]),
        open_breaker("alpha"),
        vec![
            disconnected("alpha"),
            Step::Advance { ms: LONG_MS },
            admit("alpha", "work"),
            expect(
                admission(AdmissionCase::Reconnect),
                "a probe that finds no live session must signal a reconnect",
            ),
            expect(
                refused_naming("alpha"),
                "the message for the model must name the server",
            ),
            reconnect("alpha", ReconnectSource::Probe),
            expect(connects("alpha"), "the probe's reconnect must connect"),
            connected("alpha", &["work"]),
            admit("alpha", "work"),
            expect(
                admission(AdmissionCase::Allow),
                "a new session must close the breaker",
            ),
        ],
    ]
    .concat()
}

fn tools_are_withdrawn_exactly_once() -> Vec<Step> {
    let once = "tools must be withdrawn exactly once";
    vec![
        configure("alpha"),
        connected("alpha", &["echo"]),
        disconnected("alpha"),
        expect(not(redundant("alpha")), once),
        failing_attempts(
            "alpha",
            PARK_WITHIN,
            vec![expect(not(redundant("alpha")), once)],
        ),
    ]
}

fn tools_changed_republishes_only_on_difference() -> Vec<Step> {
    vec![
        configure("alpha"),
        connected("alpha", &["one", "two"]),
        tools_changed("alpha", tools(&["two", "one"])),
        expect(
            not(publishes("alpha")),
            "an unchanged tool list must not be republished",
        ),
    ]
}
