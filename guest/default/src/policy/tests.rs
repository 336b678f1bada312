//! Behaviour tests of the default policy, one rule per test.

use std::collections::BTreeMap;

use rand_core::Rng;
use rand_pcg::Pcg32;

use super::*;
use crate::model::{LiveSession, Publication, PublishedTool, ServerTools, Tool, TransportKind};

/// Exact delays: no jitter.
const NO_JITTER: &str = r#"{"backoff": {"jitter": "none"}}"#;

// ----- helpers -----

fn ev(now: Millis, kind: EventKind) -> Event {
    Event { now, kind }
}

fn cfg(name: &str) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: TransportKind::Stdio,
        include: vec![],
        exclude: vec![],
        settings: String::new(),
    }
}

fn configured(name: &str) -> EventKind {
    EventKind::ServerConfigured(cfg(name))
}

fn tool(name: &str) -> Tool {
    Tool {
        name: name.into(),
        read_only: false,
        revision: 1,
    }
}

fn connected(name: &str, tools: &[&str]) -> EventKind {
    EventKind::Connected(SessionInfo {
        server: name.into(),
        server_info: "srv 1.0".into(),
        tools: tools.iter().map(|t| tool(t)).collect(),
    })
}

fn sf(name: &str, fault: Fault) -> ServerFault {
    ServerFault {
        server: name.into(),
        fault,
    }
}

fn connect_failed(name: &str, fault: Fault) -> EventKind {
    EventKind::ConnectFailed(sf(name, fault))
}

fn disconnected(name: &str, fault: Fault) -> EventKind {
    EventKind::Disconnected(sf(name, fault))
}

fn closed() -> Fault {
    Fault::TransportClosed("eof".into())
}

fn keepalive(name: &str) -> EventKind {
    EventKind::KeepaliveOk(name.into())
}

fn call(name: &str, call_id: u64, outcome: CallOutcome) -> EventKind {
    EventKind::CallFinished(CallReport {
        server: name.into(),
        call_id,
        outcome,
        duration_ms: 5,
    })
}

fn transport_error() -> CallOutcome {
    CallOutcome::TransportError(Fault::TransportClosed("reset".into()))
}

fn timer(name: &str, token: u64) -> EventKind {
    EventKind::Timer(TimerFired {
        server: name.into(),
        token,
    })
}

fn reconnect(name: &str, source: ReconnectSource) -> EventKind {
    EventKind::ReconnectRequested(ReconnectRequest {
        server: name.into(),
        source,
    })
}

fn req(now: Millis, call_id: u64, server: &str) -> CallRequest {
    CallRequest {
        now,
        call_id,
        server: server.into(),
        tool: "t".into(),
    }
}

fn sc(server: &str, state: ServerState, detail: &str) -> Action {
    change(server, state, detail.to_string())
}

/// `PublishTools` of simple tool names (given in advertised order).
fn publish(server: &str, originals: &[&str]) -> Action {
    Action::PublishTools(Publication {
        server: server.into(),
        tools: originals
            .iter()
            .map(|o| PublishedTool {
                advertised: format!("{server}__{o}"),
                original: o.to_string(),
                read_only: false,
                revision: 1,
            })
            .collect(),
    })
}

fn wake_of(actions: &[Action]) -> Wake {
    actions
        .iter()
        .find_map(|a| match a {
            Action::WakeAt(w) => Some(w.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no WakeAt in {actions:?}"))
}

fn fire(p: &mut Policy, w: &Wake) -> Vec<Action> {
    p.handle(ev(w.at, timer(&w.server, w.token)))
}

fn detail_of(actions: &[Action], state: ServerState) -> String {
    actions
        .iter()
        .find_map(|a| match a {
            Action::StateChanged(c) if c.state == state => Some(c.detail.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no StateChanged({state:?}) in {actions:?}"))
}

fn status_of(p: &Policy, name: &str) -> ServerStatus {
    p.status()
        .into_iter()
        .find(|s| s.server == name)
        .unwrap_or_else(|| panic!("no status for {name}"))
}

fn count(actions: &[Action], pred: impl Fn(&Action) -> bool) -> usize {
    actions.iter().filter(|a| pred(a)).count()
}

/// A policy with `name` connected, proven and showing `tools`, at time 0.
fn healthy(settings: &str, name: &str, tools: &[&str]) -> Policy {
    let mut p = Policy::new(settings).unwrap();
    p.handle(ev(0, configured(name)));
    p.handle(ev(0, connected(name, tools)));
    p.handle(ev(0, keepalive(name)));
    p.take_logs();
    p
}

/// Parks `name` with a permanent fault at `now`; returns the park actions.
fn park_permanently(p: &mut Policy, name: &str, now: Millis) -> Vec<Action> {
    p.handle(ev(
        now,
        connect_failed(name, Fault::SpawnFailed("not found".into())),
    ))
}

/// Breaks a healthy server's breaker open with three transport failures at `now`.
fn open_breaker(p: &mut Policy, name: &str, now: Millis) -> Vec<Action> {
    p.handle(ev(now, call(name, 1, transport_error())));
    p.handle(ev(now, call(name, 2, transport_error())));
    p.handle(ev(now, call(name, 3, transport_error())))
}

// ----- construction and settings -----

#[test]
fn empty_or_empty_object_settings_mean_all_defaults() {
    for json in ["", "{}"] {
        let p = Policy::new(json).unwrap();
        assert_eq!(p.settings, Settings::default());
    }
}

#[test]
fn unknown_setting_is_rejected_naming_the_key() {
    let e = Policy::new(r#"{"breaker": {"treshold": 2}}"#).unwrap_err();
    assert_eq!(e, "unknown setting `breaker.treshold`");
}

#[test]
fn info_names_the_default_policy_and_its_version() {
    let info = Policy::info();
    assert_eq!(info.name, "tether-default-policy");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
}

#[test]
fn set_settings_keeps_state_and_applies_to_the_next_decision() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let a = p.handle(ev(0, connect_failed("files", closed())));
    p.set_settings(r#"{"initial_attempts": 2, "backoff": {"jitter": "none"}}"#)
        .unwrap();
    assert_eq!(status_of(&p, "files").failures, 1);
    fire(&mut p, &wake_of(&a));
    let a = p.handle(ev(1_000, connect_failed("files", closed())));
    assert!(
        detail_of(&a, ServerState::Parked).starts_with("parked: 2 consecutive failed attempts")
    );
}

#[test]
fn set_settings_error_changes_nothing() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let before = p.snapshot();
    assert!(p.set_settings(r#"{"reconnect_budget": 0}"#).is_err());
    assert!(p.set_settings("not json").is_err());
    assert_eq!(p.snapshot(), before);
}

#[test]
fn set_settings_refuses_settings_that_break_a_server_override() {
    let mut p = Policy::new("").unwrap();
    let mut c = cfg("files");
    c.settings = r#"{"backoff": {"base_ms": 5000}}"#.into();
    p.handle(ev(0, EventKind::ServerConfigured(c)));
    let e = p
        .set_settings(r#"{"backoff": {"cap_ms": 2000}}"#)
        .unwrap_err();
    assert!(e.contains("server \"files\""), "{e}");
    assert!(e.contains("`backoff.base_ms`"), "{e}");
    assert_eq!(p.settings, Settings::default());
}

#[test]
fn per_server_overrides_are_deep_merged_over_global_settings() {
    let mut p = Policy::new(r#"{"backoff": {"jitter": "none", "base_ms": 100}}"#).unwrap();
    let mut c = cfg("files");
    c.settings = r#"{"backoff": {"factor": 3}}"#.into();
    p.handle(ev(0, EventKind::ServerConfigured(c)));
    let a = p.handle(ev(0, connect_failed("files", closed())));
    fire(&mut p, &wake_of(&a));
    let a = p.handle(ev(100, connect_failed("files", closed())));
    // base 100 (global) * factor 3 (override) for the second retry.
    assert_eq!(wake_of(&a).at, 400);
}

// ----- lifecycle -----

#[test]
fn new_server_connects_at_once() {
    let mut p = Policy::new("").unwrap();
    let a = p.handle(ev(10, configured("files")));
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::Connecting,
                "configured; connecting (attempt 1 of 4)"
            ),
            Action::Connect("files".into()),
        ]
    );
    let s = status_of(&p, "files");
    assert_eq!(
        (s.state, s.since, s.failures),
        (ServerState::Connecting, 10, 0)
    );
}

#[test]
fn connected_publishes_tools_but_does_not_reset_failures() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let a = p.handle(ev(0, connect_failed("files", closed())));
    fire(&mut p, &wake_of(&a));
    let a = p.handle(ev(1_100, connected("files", &["write", "read"])));
    assert_eq!(
        a,
        [
            publish("files", &["read", "write"]),
            sc(
                "files",
                ServerState::Connected,
                "session established (srv 1.0); not yet proven"
            ),
        ]
    );
    let s = status_of(&p, "files");
    assert_eq!(
        (s.state, s.failures, s.published_tools),
        (ServerState::Connected, 1, 2)
    );
}

#[test]
fn keepalive_proves_the_session_and_resets_failures() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let a = p.handle(ev(0, connect_failed("files", closed())));
    fire(&mut p, &wake_of(&a));
    p.handle(ev(1_000, connected("files", &["read"])));
    let a = p.handle(ev(2_000, keepalive("files")));
    assert_eq!(
        a,
        [sc(
            "files",
            ServerState::Healthy,
            "session proven by a keepalive"
        )]
    );
    let s = status_of(&p, "files");
    assert_eq!(
        (s.state, s.failures, s.since),
        (ServerState::Healthy, 0, 2_000)
    );
    // Only transitions are reported.
    assert_eq!(p.handle(ev(3_000, keepalive("files"))), []);
}

#[test]
fn answered_calls_prove_the_session_ok_or_tool_error() {
    for outcome in [CallOutcome::Ok, CallOutcome::ToolError("bad args".into())] {
        let mut p = Policy::new("").unwrap();
        p.handle(ev(0, configured("files")));
        p.handle(ev(0, connected("files", &["read"])));
        let a = p.handle(ev(5, call("files", 1, outcome)));
        assert_eq!(
            a,
            [sc(
                "files",
                ServerState::Healthy,
                "session proven by an answered call"
            )]
        );
    }
}

#[test]
fn failed_calls_do_not_prove_the_session() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    p.handle(ev(0, connected("files", &["read"])));
    assert_eq!(p.handle(ev(5, call("files", 1, CallOutcome::Timeout))), []);
    assert_eq!(status_of(&p, "files").state, ServerState::Connected);
}

#[test]
fn permanent_spawn_failure_parks_at_once() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let a = park_permanently(&mut p, "files", 100);
    assert_eq!(a.len(), 2, "{a:?}");
    let detail = detail_of(&a, ServerState::Parked);
    assert!(
        detail.starts_with(
            "parked: permanent fault: could not start the server process: not found; next self-probe in "
        ),
        "{detail}"
    );
    let w = wake_of(&a);
    assert!((100 + 15_000..=100 + 30_000).contains(&w.at), "{w:?}");
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
}

#[test]
fn auth_required_and_not_mcp_endpoint_park_at_once_too() {
    for fault in [
        Fault::AuthRequired(401),
        Fault::NotMcpEndpoint("HTML page".into()),
    ] {
        let mut p = Policy::new("").unwrap();
        p.handle(ev(0, configured("files")));
        let a = p.handle(ev(0, connect_failed("files", fault)));
        assert_eq!(status_of(&p, "files").state, ServerState::Parked, "{a:?}");
    }
}

#[test]
fn a_server_that_needs_a_login_parks_without_probes_until_it_is_authorized() {
    let mut p = healthy(NO_JITTER, "web", &["search"]);
    let login = "authorization required: run `tether auth login web`";
    // The grant was revoked: the session ends, the host says what gives the authorization.
    p.authorization_required("web", login);
    let a = p.handle(ev(10, disconnected("web", Fault::AuthRequired(401))));
    assert_eq!(status_of(&p, "web").state, ServerState::Parked, "{a:?}");
    assert_eq!(
        count(&a, |a| matches!(a, Action::WithdrawTools(_))),
        1,
        "{a:?}"
    );
    assert_eq!(
        count(&a, |a| matches!(a, Action::WakeAt(_))),
        0,
        "no self-probe: {a:?}"
    );
    let detail = detail_of(&a, ServerState::Parked);
    assert!(
        detail.contains(login) && detail.contains("no self-probe"),
        "{detail}"
    );
    // A call meanwhile tells the agent who must act and how, not to have it reconnected.
    assert_eq!(
        p.admit(req(20, 1, "web")),
        Admission::Reject(
            "Server \"web\" is unavailable (parked: it needs an authorization (a login) from the user or the operator); the call was not sent. Ask the user or an operator to log in with `tether auth login web`; the server comes back after the login.".into()
        )
    );
    // A login: the host reports it as the operator's reconnect.
    let a = p.handle(ev(60_000, reconnect("web", ReconnectSource::Operator)));
    assert_eq!(count(&a, |a| matches!(a, Action::Connect(_))), 1, "{a:?}");
    // The login did not take (still refused): parked again, still without probes.
    p.authorization_required("web", login);
    let a = p.handle(ev(60_010, connect_failed("web", Fault::AuthRequired(401))));
    assert_eq!(status_of(&p, "web").state, ServerState::Parked, "{a:?}");
    assert_eq!(count(&a, |a| matches!(a, Action::WakeAt(_))), 0, "{a:?}");
    // It survives a snapshot, and a good session clears it: an ordinary 401 later probes.
    let mut p = Policy::restore(&p.snapshot()).unwrap();
    p.handle(ev(70_000, reconnect("web", ReconnectSource::Operator)));
    p.handle(ev(70_010, connected("web", &["search"])));
    let a = p.handle(ev(80_000, disconnected("web", Fault::AuthRequired(401))));
    assert_eq!(status_of(&p, "web").state, ServerState::Parked, "{a:?}");
    assert_eq!(count(&a, |a| matches!(a, Action::WakeAt(_))), 1, "{a:?}");
}

#[test]
fn connect_failure_backs_off_naming_fault_attempt_and_delay() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let a = p.handle(ev(50, connect_failed("files", Fault::HandshakeTimedOut)));
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::BackingOff,
                "attempt 1 of 4 failed: MCP handshake timed out; next attempt in 1 s"
            ),
            Action::WakeAt(Wake {
                server: "files".into(),
                at: 1_050,
                token: 1
            }),
        ]
    );
}

#[test]
fn initial_phase_parks_after_initial_attempts() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    let mut connects = count(&p.handle(ev(0, configured("files"))), |a| {
        matches!(a, Action::Connect(_))
    });
    let mut now = 0;
    let mut delays = Vec::new();
    loop {
        let a = p.handle(ev(now, connect_failed("files", closed())));
        if status_of(&p, "files").state == ServerState::Parked {
            let detail = detail_of(&a, ServerState::Parked);
            assert!(
                detail.starts_with(
                    "parked: 4 consecutive failed attempts (last: the connection closed: eof)"
                ),
                "{detail}"
            );
            break;
        }
        let w = wake_of(&a);
        delays.push(w.at - now);
        now = w.at;
        connects += count(&fire(&mut p, &w), |a| matches!(a, Action::Connect(_)));
    }
    assert_eq!(connects, 4);
    assert_eq!(delays, [1_000, 2_000, 4_000]);
}

#[test]
fn backoff_is_exponential_and_capped_without_jitter() {
    let mut p = Policy::new(
        r#"{"initial_attempts": 10, "backoff": {"jitter": "none", "base_ms": 500, "cap_ms": 3000, "factor": 2.0}}"#,
    )
    .unwrap();
    p.handle(ev(0, configured("files")));
    let mut now = 0;
    let mut delays = Vec::new();
    for _ in 0..6 {
        let w = wake_of(&p.handle(ev(now, connect_failed("files", closed()))));
        delays.push(w.at - now);
        now = w.at;
        fire(&mut p, &w);
    }
    assert_eq!(delays, [500, 1_000, 2_000, 3_000, 3_000, 3_000]);
}

fn jittered_delays(settings: &str, server: &str) -> Vec<Millis> {
    let mut p = Policy::new(settings).unwrap();
    p.handle(ev(0, configured(server)));
    let mut now = 0;
    let mut delays = Vec::new();
    for _ in 0..8 {
        let w = wake_of(&p.handle(ev(now, connect_failed(server, closed()))));
        delays.push(w.at - now);
        now = w.at;
        fire(&mut p, &w);
    }
    delays
}

#[test]
fn jitter_is_replayable_and_differs_between_servers_and_seeds() {
    for jitter in ["full", "decorrelated"] {
        let s7 = format!(
            r#"{{"seed": 7, "initial_attempts": 20, "backoff": {{"jitter": "{jitter}"}}}}"#
        );
        let s8 = s7.replace("\"seed\": 7", "\"seed\": 8");
        let files = jittered_delays(&s7, "files");
        assert_eq!(files, jittered_delays(&s7, "files"), "{jitter}");
        assert_ne!(files, jittered_delays(&s7, "github"), "{jitter}");
        assert_ne!(files, jittered_delays(&s8, "files"), "{jitter}");
    }
}

#[test]
fn full_jitter_delays_stay_under_the_exponential_curve() {
    let s = r#"{"initial_attempts": 20, "seed": 3}"#;
    let caps = [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000];
    for (d, cap) in jittered_delays(s, "files").into_iter().zip(caps) {
        assert!(d <= cap, "{d} > {cap}");
    }
}

#[test]
fn proven_session_loss_is_failure_number_one() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    // Three failed attempts first.
    for _ in 0..3 {
        let w = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
        fire(&mut p, &w);
    }
    p.handle(ev(10_000, connected("files", &["read"])));
    p.handle(ev(10_000, keepalive("files")));
    let a = p.handle(ev(20_000, disconnected("files", Fault::SessionExpired)));
    assert_eq!(
        detail_of(&a, ServerState::BackingOff),
        "attempt 1 of 5 failed: the server no longer knows the session; next attempt in 1 s"
    );
}

#[test]
fn reconnect_phase_parks_after_reconnect_budget() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    let mut a = p.handle(ev(0, disconnected("files", closed())));
    for attempt in 2..=5 {
        fire(&mut p, &wake_of(&a));
        a = p.handle(ev(0, connect_failed("files", closed())));
        if attempt < 5 {
            assert!(
                detail_of(&a, ServerState::BackingOff)
                    .starts_with(&format!("attempt {attempt} of 5 failed")),
                "{a:?}"
            );
        }
    }
    let detail = detail_of(&a, ServerState::Parked);
    assert!(
        detail.starts_with(
            "parked: 5 consecutive failed attempts (last: the connection closed: eof)"
        ),
        "{detail}"
    );
}

#[test]
fn unproven_session_that_dies_at_once_parks_within_the_budget() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    let mut connects = count(&p.handle(ev(0, configured("files"))), |a| {
        matches!(a, Action::Connect(_))
    });
    let mut now = 0;
    for _ in 0..20 {
        p.handle(ev(now, connected("files", &["read"])));
        let a = p.handle(ev(
            now,
            disconnected("files", Fault::ProcessExited(Some(1))),
        ));
        if status_of(&p, "files").state == ServerState::Parked {
            break;
        }
        let w = wake_of(&a);
        now = w.at;
        connects += count(&fire(&mut p, &w), |a| matches!(a, Action::Connect(_)));
    }
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
    assert_eq!(connects, 5);
}

#[test]
fn disconnect_withdraws_tools_then_backs_off() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    let a = p.handle(ev(7, disconnected("files", closed())));
    assert_eq!(
        a,
        [
            Action::WithdrawTools("files".into()),
            sc(
                "files",
                ServerState::BackingOff,
                "attempt 1 of 5 failed: the connection closed: eof; next attempt in 1 s"
            ),
            Action::WakeAt(Wake {
                server: "files".into(),
                at: 1_007,
                token: 1
            }),
        ]
    );
    // A second disconnect for the gone session changes nothing.
    assert_eq!(p.handle(ev(8, disconnected("files", closed()))), []);
}

#[test]
fn tools_are_withdrawn_exactly_once_across_disconnect_park_removal_and_shutdown() {
    let mut p = healthy(r#"{"reconnect_budget": 2}"#, "files", &["read"]);
    let mut all = p.handle(ev(0, disconnected("files", closed())));
    let w = wake_of(&all);
    all.extend(fire(&mut p, &w));
    all.extend(p.handle(ev(w.at, connect_failed("files", closed()))));
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
    all.extend(p.handle(ev(w.at, EventKind::ServerRemoved("files".into()))));
    all.extend(p.handle(ev(w.at, EventKind::Shutdown)));
    assert_eq!(
        count(&all, |a| matches!(a, Action::WithdrawTools(_))),
        1,
        "{all:?}"
    );
}

#[test]
fn keepalive_failure_only_records_the_fault() {
    let mut p = healthy("", "files", &["read"]);
    let a = p.handle(ev(
        5,
        EventKind::KeepaliveFailed(sf("files", Fault::KeepaliveFailed("no pong".into()))),
    ));
    assert_eq!(a, []);
    let s = status_of(&p, "files");
    assert_eq!(s.state, ServerState::Healthy);
    assert_eq!(s.last_fault.as_deref(), Some("keepalive failed: no pong"));
    assert_eq!(s.breaker, BreakerState::Closed);
}

// ----- park and revival -----

#[test]
fn park_withdraws_tools_and_arms_a_self_probe() {
    let mut p = healthy(r#"{"reconnect_budget": 1}"#, "files", &["read"]);
    let a = p.handle(ev(1_000, disconnected("files", closed())));
    assert_eq!(a.len(), 3, "{a:?}");
    assert_eq!(a[0], Action::WithdrawTools("files".into()));
    assert!(
        matches!(&a[1], Action::StateChanged(c) if c.state == ServerState::Parked
        && c.detail.starts_with("parked: 1 consecutive failed attempts (last: the connection closed: eof); next self-probe in "))
    );
    let w = wake_of(&a);
    assert!((16_000..=31_000).contains(&w.at), "{w:?}");
    assert_eq!(status_of(&p, "files").published_tools, 0);
}

#[test]
fn parked_server_always_has_a_self_probe_armed() {
    // Whatever parks it, a WakeAt comes with it.
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("a")));
    assert!(
        count(&park_permanently(&mut p, "a", 0), |x| matches!(
            x,
            Action::WakeAt(_)
        )) == 1
    );
    let mut c = cfg("b");
    c.exclude = vec!["[".into()];
    let a = p.handle(ev(0, EventKind::ServerConfigured(c)));
    assert_eq!(count(&a, |x| matches!(x, Action::WakeAt(_))), 1, "{a:?}");
}

#[test]
fn parked_timer_starts_a_single_revival_attempt() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&park_permanently(&mut p, "files", 0));
    let a = fire(&mut p, &w);
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::Connecting,
                "self-probe; trying to revive (one attempt)"
            ),
            Action::Connect("files".into()),
        ]
    );
}

#[test]
fn failed_revival_returns_to_parked_without_a_new_budget() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&park_permanently(&mut p, "files", 0));
    fire(&mut p, &w);
    let a = p.handle(ev(w.at, connect_failed("files", closed())));
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
    assert!(
        detail_of(&a, ServerState::Parked).starts_with(
            "parked: revival attempt failed: the connection closed: eof; next self-probe in "
        ),
        "{a:?}"
    );
}

#[test]
fn revival_session_dying_unproven_returns_to_parked() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&park_permanently(&mut p, "files", 0));
    fire(&mut p, &w);
    p.handle(ev(w.at, connected("files", &["read"])));
    let a = p.handle(ev(w.at, disconnected("files", closed())));
    assert_eq!(a[0], Action::WithdrawTools("files".into()));
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
    assert_eq!(count(&a, |x| matches!(x, Action::WakeAt(_))), 1);
}

#[test]
fn parked_self_probe_grows_and_is_capped() {
    let mut p =
        Policy::new(r#"{"park": {"probe_initial_ms": 1000, "probe_max_ms": 4000}}"#).unwrap();
    p.handle(ev(0, configured("files")));
    let mut w = wake_of(&park_permanently(&mut p, "files", 0));
    let mut ranges = vec![(500, 1_000)];
    let mut delays = vec![w.at];
    for _ in 0..4 {
        let now = w.at;
        fire(&mut p, &w);
        w = wake_of(&p.handle(ev(now, connect_failed("files", closed()))));
        delays.push(w.at - now);
    }
    ranges.extend([
        (1_000, 2_000),
        (2_000, 4_000),
        (2_000, 4_000),
        (2_000, 4_000),
    ]);
    for (d, (lo, hi)) in delays.iter().zip(ranges) {
        assert!((lo..=hi).contains(d), "{delays:?}");
    }
}

#[test]
fn proven_revival_resets_failures_and_probe_delay() {
    let mut p = Policy::new(
        r#"{"reconnect_budget": 1, "park": {"probe_initial_ms": 1000, "probe_max_ms": 64000}}"#,
    )
    .unwrap();
    p.handle(ev(0, configured("files")));
    let mut w = wake_of(&park_permanently(&mut p, "files", 0));
    // Two failed revivals grow the probe delay to 4 s.
    for _ in 0..2 {
        fire(&mut p, &w);
        w = wake_of(&p.handle(ev(w.at, connect_failed("files", closed()))));
    }
    let now = w.at;
    fire(&mut p, &w);
    p.handle(ev(now, connected("files", &["read"])));
    p.handle(ev(now, keepalive("files")));
    assert_eq!(status_of(&p, "files").failures, 0);
    // Budget 1: the next loss parks, with the probe delay back at its initial value.
    let a = p.handle(ev(now, disconnected("files", closed())));
    let d = wake_of(&a).at - now;
    assert!((500..=1_000).contains(&d), "{d}");
}

#[test]
fn reconnect_request_revives_a_parked_server_at_once() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let old = wake_of(&park_permanently(&mut p, "files", 0));
    let a = p.handle(ev(10, reconnect("files", ReconnectSource::Agent)));
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::Connecting,
                "reconnect requested by the agent; trying to revive (one attempt)"
            ),
            Action::Connect("files".into()),
        ]
    );
    // The old self-probe is stale now.
    assert_eq!(fire(&mut p, &old), []);
}

#[test]
fn reconnect_request_cuts_a_backoff_short() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let old = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
    let a = p.handle(ev(10, reconnect("files", ReconnectSource::Operator)));
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::Connecting,
                "reconnect requested by an operator; attempt 2 of 4"
            ),
            Action::Connect("files".into()),
        ]
    );
    assert_eq!(fire(&mut p, &old), []);
}

#[test]
fn stale_timer_tokens_are_ignored() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
    assert_eq!(p.handle(ev(w.at, timer("files", w.token + 1))), []);
    assert_eq!(status_of(&p, "files").state, ServerState::BackingOff);
    assert_eq!(fire(&mut p, &w).len(), 2);
    // The same token again is stale.
    assert_eq!(fire(&mut p, &w), []);
}

#[test]
fn backoff_timer_starts_the_next_attempt() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
    assert_eq!(
        fire(&mut p, &w),
        [
            sc(
                "files",
                ServerState::Connecting,
                "backoff over; attempt 2 of 4"
            ),
            Action::Connect("files".into()),
        ]
    );
}

#[test]
fn operator_or_probe_reconnect_replaces_a_live_session() {
    for (source, who) in [
        (ReconnectSource::Operator, "an operator"),
        (ReconnectSource::Probe, "a probe"),
    ] {
        let mut p = healthy("", "files", &["read"]);
        let a = p.handle(ev(5, reconnect("files", source)));
        assert_eq!(
            a,
            [
                Action::WithdrawTools("files".into()),
                sc(
                    "files",
                    ServerState::Connecting,
                    &format!("reconnect requested by {who}; replacing the session")
                ),
                Action::Connect("files".into()),
            ]
        );
    }
}

#[test]
fn agent_reconnect_of_a_live_session_is_ignored() {
    let mut p = healthy("", "files", &["read"]);
    assert_eq!(
        p.handle(ev(5, reconnect("files", ReconnectSource::Agent))),
        []
    );
    assert_eq!(status_of(&p, "files").state, ServerState::Healthy);
}

#[test]
fn reconnect_request_while_connecting_stopped_or_unknown_does_nothing() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    assert_eq!(
        p.handle(ev(1, reconnect("files", ReconnectSource::Operator))),
        []
    );
    assert_eq!(
        p.handle(ev(1, reconnect("ghost", ReconnectSource::Operator))),
        []
    );
    p.handle(ev(2, EventKind::Shutdown));
    assert_eq!(
        p.handle(ev(3, reconnect("files", ReconnectSource::Operator))),
        []
    );
}

#[test]
fn server_removed_withdraws_disconnects_stops_and_forgets() {
    let mut p = healthy("", "files", &["read"]);
    let a = p.handle(ev(9, EventKind::ServerRemoved("files".into())));
    assert_eq!(
        a,
        [
            Action::WithdrawTools("files".into()),
            Action::Disconnect("files".into()),
            sc(
                "files",
                ServerState::Stopped,
                "removed from the configuration"
            ),
        ]
    );
    assert!(p.status().is_empty());
    assert_eq!(p.handle(ev(10, keepalive("files"))), []);
    // Re-adding starts afresh.
    let a = p.handle(ev(11, configured("files")));
    assert_eq!(a[1], Action::Connect("files".into()));
}

#[test]
fn removed_server_timer_does_not_match_a_re_added_one() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let old = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
    p.handle(ev(1, EventKind::ServerRemoved("files".into())));
    p.handle(ev(2, configured("files")));
    let new = wake_of(&p.handle(ev(2, connect_failed("files", closed()))));
    assert_ne!(old.token, new.token);
    assert_eq!(fire(&mut p, &old), []);
}

#[test]
fn shutdown_stops_every_server_once() {
    let mut p = healthy("", "a", &["read"]);
    p.handle(ev(0, configured("b")));
    let a = p.handle(ev(5, EventKind::Shutdown));
    assert_eq!(
        a,
        [
            Action::WithdrawTools("a".into()),
            Action::Disconnect("a".into()),
            sc("a", ServerState::Stopped, "host shutting down"),
            Action::Disconnect("b".into()),
            sc("b", ServerState::Stopped, "host shutting down"),
        ]
    );
    assert_eq!(p.handle(ev(6, EventKind::Shutdown)), []);
    assert!(
        p.status()
            .iter()
            .all(|s| s.state == ServerState::Stopped && s.since == 5)
    );
}

#[test]
fn events_after_shutdown_change_nothing() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("files")));
    let w = wake_of(&p.handle(ev(0, connect_failed("files", closed()))));
    p.handle(ev(1, EventKind::Shutdown));
    assert_eq!(fire(&mut p, &w), []);
    assert_eq!(p.handle(ev(2, connect_failed("files", closed()))), []);
    assert_eq!(p.handle(ev(2, configured("files"))), []);
    // A session nobody asked for is closed.
    assert_eq!(
        p.handle(ev(3, connected("files", &["read"]))),
        [Action::Disconnect("files".into())]
    );
    assert_eq!(status_of(&p, "files").state, ServerState::Stopped);
}

// ----- configuration and publication -----

#[test]
fn tools_changed_publishes_only_differences() {
    let mut p = healthy("", "files", &["read"]);
    let same = EventKind::ToolsChanged(ServerTools {
        server: "files".into(),
        tools: vec![tool("read")],
    });
    assert_eq!(p.handle(ev(1, same)), []);
    let more = EventKind::ToolsChanged(ServerTools {
        server: "files".into(),
        tools: vec![tool("write"), tool("read")],
    });
    assert_eq!(
        p.handle(ev(2, more)),
        [publish("files", &["read", "write"])]
    );
    let none = EventKind::ToolsChanged(ServerTools {
        server: "files".into(),
        tools: vec![],
    });
    assert_eq!(
        p.handle(ev(3, none)),
        [Action::WithdrawTools("files".into())]
    );
}

#[test]
fn reconfigure_recomputes_the_publication_without_reconnecting() {
    let mut p = healthy("", "files", &["read", "write"]);
    let mut c = cfg("files");
    c.exclude = vec!["wr*".into()];
    let a = p.handle(ev(1, EventKind::ServerConfigured(c.clone())));
    assert_eq!(a, [publish("files", &["read"])]);
    assert_eq!(p.handle(ev(2, EventKind::ServerConfigured(c))), []);
    assert_eq!(status_of(&p, "files").state, ServerState::Healthy);
}

#[test]
fn include_limits_publication_and_exclude_wins() {
    let mut p = Policy::new("").unwrap();
    let mut c = cfg("files");
    c.include = vec!["read*".into(), "list".into()];
    c.exclude = vec!["read_secret".into()];
    p.handle(ev(0, EventKind::ServerConfigured(c)));
    let a = p.handle(ev(
        0,
        connected("files", &["read_file", "read_secret", "list", "write"]),
    ));
    assert_eq!(a[0], publish("files", &["list", "read_file"]));
}

#[test]
fn invalid_override_parks_the_server_at_once_fail_closed() {
    let mut p = Policy::new("").unwrap();
    let mut c = cfg("files");
    c.settings = r#"{"backof": {}}"#.into();
    let a = p.handle(ev(0, EventKind::ServerConfigured(c)));
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(
        detail_of(&a, ServerState::Parked).starts_with(
            "parked: configuration error: invalid settings override: unknown setting `backof`; next self-probe in "
        ),
        "{a:?}"
    );
    let logs = p.take_logs();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == LogLevel::Error && m.contains("`backof`")),
        "{logs:?}"
    );
    // A session it did not ask for is closed, not published.
    assert_eq!(
        p.handle(ev(1, connected("files", &["read"]))),
        [Action::Disconnect("files".into())]
    );
    assert_eq!(
        p.admit(req(2, 1, "files")),
        Admission::Reject(
            "Server \"files\" is unavailable (parked: its configuration is invalid); the call was not sent. Ask an operator to reconnect it.".into()
        )
    );
}

#[test]
fn invalid_glob_parks_the_server_and_publishes_nothing() {
    let mut p = healthy("", "files", &["read"]);
    let mut c = cfg("files");
    c.include = vec!["[bad".into()];
    let a = p.handle(ev(1, EventKind::ServerConfigured(c)));
    assert_eq!(a[0], Action::WithdrawTools("files".into()));
    assert_eq!(a[1], Action::Disconnect("files".into()));
    assert!(
        detail_of(&a, ServerState::Parked).contains("invalid include pattern \"[bad\""),
        "{a:?}"
    );
    assert_eq!(status_of(&p, "files").published_tools, 0);
}

#[test]
fn config_error_self_probe_rechecks_and_stays_parked() {
    let mut p = Policy::new("").unwrap();
    let mut c = cfg("files");
    c.exclude = vec!["[".into()];
    let w = wake_of(&p.handle(ev(0, EventKind::ServerConfigured(c))));
    let a = fire(&mut p, &w);
    assert_eq!(count(&a, |x| matches!(x, Action::Connect(_))), 0, "{a:?}");
    assert_eq!(count(&a, |x| matches!(x, Action::WakeAt(_))), 1, "{a:?}");
    assert_eq!(status_of(&p, "files").state, ServerState::Parked);
}

#[test]
fn fixing_the_configuration_of_a_parked_server_connects_it() {
    let mut p = Policy::new("").unwrap();
    let mut c = cfg("files");
    c.settings = r#"{"initial_attempts": 0}"#.into();
    p.handle(ev(0, EventKind::ServerConfigured(c)));
    let a = p.handle(ev(5, configured("files")));
    assert_eq!(
        a,
        [
            sc(
                "files",
                ServerState::Connecting,
                "configuration fixed; connecting"
            ),
            Action::Connect("files".into()),
        ]
    );
}

#[test]
fn cross_server_collision_keeps_the_holder_and_withholds_the_newcomer() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(0, configured("a")));
    p.handle(ev(0, configured("a__b")));
    let a = p.handle(ev(0, connected("a", &["b__c"])));
    assert_eq!(a[0], publish("a", &["b__c"]));
    let a = p.handle(ev(0, connected("a__b", &["c", "d"])));
    assert_eq!(a[0], publish("a__b", &["d"]));
    let logs = p.take_logs();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == LogLevel::Warn && m.contains("already used by server \"a\"")),
        "{logs:?}"
    );
    // When the holder goes, the waiting server gets the name.
    let a = p.handle(ev(1, disconnected("a", closed())));
    assert_eq!(a[0], Action::WithdrawTools("a".into()));
    assert_eq!(a.last(), Some(&publish("a__b", &["c", "d"])));
}

#[test]
fn tools_colliding_within_one_server_are_all_withheld() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("s")));
    let a = p.handle(ev(0, connected("s", &["x.y", "x/y", "z"])));
    assert_eq!(a[0], publish("s", &["z"]));
    assert!(
        p.take_logs()
            .iter()
            .any(|(l, m)| *l == LogLevel::Warn && m.contains("\"s__x_y\""))
    );
}

#[test]
fn long_tool_names_are_published_clamped_to_64_chars() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    let long = "x".repeat(90);
    let a = p.handle(ev(0, connected("files", &[&long])));
    let Action::PublishTools(publication) = &a[0] else {
        panic!("{a:?}")
    };
    assert_eq!(publication.tools[0].advertised.len(), 64);
    assert_eq!(publication.tools[0].original, long);
}

// ----- breaker -----

#[test]
fn breaker_opens_after_three_consecutive_transport_failures() {
    let mut p = healthy("", "files", &["read"]);
    assert_eq!(p.handle(ev(1_000, call("files", 1, transport_error()))), []);
    assert_eq!(
        p.handle(ev(1_000, call("files", 2, CallOutcome::Timeout))),
        []
    );
    let a = p.handle(ev(1_000, call("files", 3, transport_error())));
    assert_eq!(
        a,
        [sc(
            "files",
            ServerState::Healthy,
            "circuit breaker opened for 60 s after 3 consecutive transport failures"
        )]
    );
    // The state change is the operator's line; the policy's own log of it is for debugging.
    assert!(
        p.take_logs()
            .iter()
            .any(|(l, m)| *l == LogLevel::Debug && m.contains("circuit breaker opened"))
    );
    let s = status_of(&p, "files");
    assert_eq!((s.breaker, s.breaker_failures), (BreakerState::Open, 3));
}

#[test]
fn tool_errors_are_counted_apart_and_never_open_the_breaker() {
    let mut p = healthy("", "files", &["read"]);
    for id in 0..5 {
        p.handle(ev(
            1,
            call("files", id, CallOutcome::ToolError("bad".into())),
        ));
    }
    let s = status_of(&p, "files");
    assert_eq!(
        (s.breaker, s.tool_errors, s.breaker_failures),
        (BreakerState::Closed, 5, 0)
    );
    // An answer in between resets the transport count.
    p.handle(ev(1, call("files", 10, transport_error())));
    p.handle(ev(1, call("files", 11, transport_error())));
    p.handle(ev(
        1,
        call("files", 12, CallOutcome::ToolError("bad".into())),
    ));
    p.handle(ev(1, call("files", 13, transport_error())));
    p.handle(ev(1, call("files", 14, transport_error())));
    assert_eq!(status_of(&p, "files").breaker, BreakerState::Closed);
    p.handle(ev(1, call("files", 15, CallOutcome::Ok)));
    assert_eq!(status_of(&p, "files").tool_errors, 0);
}

#[test]
fn open_breaker_rejects_with_seconds_until_half_open() {
    let mut p = healthy("", "files", &["read"]);
    open_breaker(&mut p, "files", 1_000);
    assert_eq!(
        p.admit(req(19_000, 7, "files")),
        Admission::Reject(
            "Server \"files\" is failing (circuit open after 3 consecutive transport failures); the call was not sent. Wait about 42 s and retry.".into()
        )
    );
}

#[test]
fn half_open_admits_exactly_one_probe() {
    let mut p = healthy("", "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    assert_eq!(status_of(&p, "files").breaker, BreakerState::Open);
    assert_eq!(p.admit(req(60_000, 10, "files")), Admission::Probe);
    assert_eq!(
        p.admit(req(60_001, 11, "files")),
        Admission::Reject(
            "Server \"files\" is failing (circuit half-open: a test call is in progress); the call was not sent. Wait a few seconds and retry.".into()
        )
    );
    assert_eq!(status_of(&p, "files").breaker, BreakerState::HalfOpen);
}

#[test]
fn probe_success_closes_the_breaker() {
    let mut p = healthy("", "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    p.admit(req(60_000, 10, "files"));
    let a = p.handle(ev(
        60_100,
        call("files", 10, CallOutcome::ToolError("x".into())),
    ));
    assert_eq!(
        a,
        [sc(
            "files",
            ServerState::Healthy,
            "circuit breaker closed: its test call was answered"
        )]
    );
    assert_eq!(p.admit(req(60_200, 11, "files")), Admission::Allow);
}

#[test]
fn probe_failure_reopens_with_doubled_duration() {
    let mut p = healthy("", "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    p.admit(req(60_000, 10, "files"));
    let a = p.handle(ev(61_000, call("files", 10, CallOutcome::Timeout)));
    assert_eq!(
        a,
        [sc(
            "files",
            ServerState::Healthy,
            "circuit breaker re-opened for 120 s after its test call failed"
        )]
    );
    assert!(matches!(
        p.admit(req(180_999, 11, "files")),
        Admission::Reject(_)
    ));
    assert_eq!(p.admit(req(181_000, 12, "files")), Admission::Probe);
}

#[test]
fn half_open_probe_without_a_live_session_signals_a_reconnect() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    p.handle(ev(0, disconnected("files", closed())));
    // The backoff timer is left pending; the breaker cooldown ends first in admit.
    let a = p.admit(req(60_000, 10, "files"));
    assert_eq!(
        a,
        Admission::Reconnect(
            "Server \"files\" is reconnecting after its connection closed; the call was not sent. Wait a few seconds and retry.".into()
        )
    );
    // Only one reconnect is signalled; the next call waits for its session.
    assert!(matches!(
        p.admit(req(60_001, 11, "files")),
        Admission::Hold(_)
    ));
    let a = p.handle(ev(60_002, reconnect("files", ReconnectSource::Probe)));
    assert_eq!(a[1], Action::Connect("files".into()));
    p.handle(ev(60_100, connected("files", &["read"])));
    assert_eq!(status_of(&p, "files").breaker, BreakerState::Closed);
    assert_eq!(p.admit(req(60_200, 12, "files")), Admission::Allow);
}

#[test]
fn failed_reconnect_probe_reopens_the_breaker() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    p.handle(ev(0, disconnected("files", closed())));
    p.admit(req(60_000, 10, "files"));
    p.handle(ev(60_002, reconnect("files", ReconnectSource::Probe)));
    p.handle(ev(60_100, connect_failed("files", closed())));
    assert_eq!(status_of(&p, "files").breaker, BreakerState::Open);
}

#[test]
fn session_init_closes_the_breaker() {
    let mut p = healthy("", "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    p.handle(ev(1, reconnect("files", ReconnectSource::Operator)));
    p.handle(ev(2, connected("files", &["read"])));
    let s = status_of(&p, "files");
    assert_eq!((s.breaker, s.breaker_failures), (BreakerState::Closed, 0));
    assert_eq!(p.admit(req(3, 1, "files")), Admission::Allow);
}

// ----- admission words -----

#[test]
fn admit_allows_calls_on_a_live_session_with_a_closed_breaker() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    p.handle(ev(0, connected("files", &["read"])));
    assert_eq!(p.admit(req(1, 1, "files")), Admission::Allow);
    p.handle(ev(1, keepalive("files")));
    assert_eq!(p.admit(req(2, 2, "files")), Admission::Allow);
}

#[test]
fn admit_rejects_unknown_servers() {
    let mut p = Policy::new("").unwrap();
    assert_eq!(
        p.admit(req(0, 1, "ghost")),
        Admission::Reject(
            "Server \"ghost\" is not configured; the call was not sent. Do not retry it; use another tool.".into()
        )
    );
}

#[test]
fn admit_rejects_stopped_servers() {
    let mut p = healthy("", "files", &["read"]);
    p.handle(ev(1, EventKind::Shutdown));
    assert_eq!(
        p.admit(req(2, 1, "files")),
        Admission::Reject(
            "Server \"files\" has been stopped; the call was not sent. Do not retry it.".into()
        )
    );
}

#[test]
fn admit_tells_the_model_to_ask_an_operator_when_parked() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    park_permanently(&mut p, "files", 0);
    assert_eq!(
        p.admit(req(1, 1, "files")),
        Admission::Reject(
            "Server \"files\" is unavailable (parked: its process could not be started); the call was not sent. Ask an operator to reconnect it.".into()
        )
    );
}

#[test]
fn admit_holds_a_call_for_an_attempt_due_soon_and_refuses_when_it_is_far() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    let a = p.handle(ev(10_000, disconnected("files", closed())));
    let w = wake_of(&a);
    assert_eq!(w.at, 11_000);
    // The attempt is due in 1 s: wait for it, and for its session (up to `hold_ms`).
    let message = "Server \"files\" is reconnecting after its connection closed; the call was not sent. Wait about 1 s and retry.";
    assert_eq!(
        p.admit(req(9_500, 1, "files")),
        Admission::Hold(Hold {
            wait_ms: 1_000 + 2_000,
            message: message.into()
        })
    );
    // Holding off: refused at once, with the same words.
    let mut p = healthy(
        r#"{"backoff": {"jitter": "none"}, "hold_ms": 0}"#,
        "files",
        &["read"],
    );
    p.handle(ev(10_000, disconnected("files", closed())));
    assert_eq!(
        p.admit(req(9_500, 1, "files")),
        Admission::Reject(message.into())
    );
    // An attempt further away than `hold_ms`: refused, saying how long to wait.
    let mut p = healthy(
        r#"{"backoff": {"jitter": "none", "base_ms": 5000}}"#,
        "files",
        &["read"],
    );
    p.handle(ev(0, disconnected("files", Fault::ProcessExited(Some(3)))));
    assert_eq!(
        p.admit(req(500, 1, "files")),
        Admission::Reject(
            "Server \"files\" is reconnecting after its process exited with code 3; the call was not sent. Wait about 5 s and retry.".into()
        )
    );
}

#[test]
fn admit_while_connecting_holds_the_call_for_the_attempt() {
    let connecting =
        "Server \"files\" is connecting; the call was not sent. Wait a few seconds and retry.";
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    assert_eq!(
        p.admit(req(1, 1, "files")),
        Admission::Hold(Hold {
            wait_ms: 2_000,
            message: connecting.into()
        })
    );
    let mut p = Policy::new(r#"{"hold_ms": 0}"#).unwrap();
    p.handle(ev(0, configured("files")));
    assert_eq!(
        p.admit(req(1, 1, "files")),
        Admission::Reject(connecting.into())
    );
}

#[test]
fn words_for_the_model_never_leak_fault_text_or_say_timed_out_wrongly() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    p.handle(ev(
        0,
        disconnected(
            "files",
            Fault::TransportClosed("token=s3cret timed out".into()),
        ),
    ));
    let (Admission::Reject(m) | Admission::Hold(Hold { message: m, .. })) =
        p.admit(req(1, 1, "files"))
    else {
        panic!()
    };
    assert!(!m.contains("s3cret") && !m.contains("timed out"), "{m}");
    let mut c = cfg("web");
    c.settings = r#"{"seed": 12345}"#.into();
    p.handle(ev(0, EventKind::ServerConfigured(c)));
    p.handle(ev(0, connect_failed("web", Fault::AuthRequired(401))));
    let Admission::Reject(m) = p.admit(req(1, 2, "web")) else {
        panic!()
    };
    assert!(!m.contains("12345") && !m.contains("seed"), "{m}");
}

// ----- status, time, logs -----

#[test]
fn status_lists_every_server_sorted_by_name() {
    let mut p = Policy::new("").unwrap();
    for name in ["zeta", "alpha", "mid"] {
        p.handle(ev(0, configured(name)));
    }
    p.handle(ev(3, connected("mid", &["a", "b"])));
    p.handle(ev(4, connect_failed("zeta", closed())));
    let s = p.status();
    let names: Vec<_> = s.iter().map(|s| s.server.as_str()).collect();
    assert_eq!(names, ["alpha", "mid", "zeta"]);
    assert_eq!(s[1].published_tools, 2);
    assert_eq!(s[1].since, 3);
    assert_eq!(
        s[2].last_fault.as_deref(),
        Some("the connection closed: eof")
    );
    assert_eq!(s[2].failures, 1);
}

#[test]
fn time_going_backwards_is_treated_as_the_latest_seen_time() {
    let mut p = Policy::new(NO_JITTER).unwrap();
    p.handle(ev(10_000, configured("files")));
    let a = p.handle(ev(5_000, connect_failed("files", closed())));
    assert_eq!(wake_of(&a).at, 11_000);
    assert_eq!(status_of(&p, "files").since, 10_000);
}

#[test]
fn events_for_unknown_servers_are_ignored_with_a_debug_log() {
    let mut p = Policy::new("").unwrap();
    let kinds = [
        EventKind::ServerRemoved("ghost".into()),
        connected("ghost", &["a"]),
        connect_failed("ghost", closed()),
        disconnected("ghost", closed()),
        EventKind::ToolsChanged(ServerTools {
            server: "ghost".into(),
            tools: vec![],
        }),
        keepalive("ghost"),
        EventKind::KeepaliveFailed(sf("ghost", closed())),
        call("ghost", 1, CallOutcome::Ok),
        timer("ghost", 1),
        reconnect("ghost", ReconnectSource::Operator),
    ];
    for kind in kinds {
        assert_eq!(p.handle(ev(0, kind.clone())), [], "{kind:?}");
        let logs = p.take_logs();
        assert!(
            logs.iter().all(|(l, _)| *l == LogLevel::Debug) && !logs.is_empty(),
            "{kind:?}: {logs:?}"
        );
    }
    assert!(p.status().is_empty());
}

#[test]
fn take_logs_drains_the_buffer() {
    let mut p = Policy::new("").unwrap();
    p.handle(ev(0, configured("files")));
    assert!(!p.take_logs().is_empty());
    assert!(p.take_logs().is_empty());
}

// ----- snapshots -----

/// One scripted or generated input.
#[derive(Debug, Clone)]
enum Step {
    Event(EventKind),
    /// Fire the latest timer the policy asked for on this server.
    Fire(String),
    Admit(String, u64),
    Advance(Millis),
}

/// Feeds steps, tracking time and the latest `WakeAt` per server like a host would.
#[derive(Debug, Clone, Default)]
struct Driver {
    now: Millis,
    wakes: BTreeMap<String, Wake>,
}

impl Driver {
    fn run(&mut self, p: &mut Policy, step: &Step) -> String {
        match step {
            Step::Event(kind) => self.feed(p, kind.clone()),
            Step::Fire(server) => match self.wakes.get(server).cloned() {
                Some(w) => {
                    self.now = self.now.max(w.at);
                    self.feed(p, timer(&w.server, w.token))
                }
                None => String::new(),
            },
            Step::Admit(server, id) => format!("{:?}", p.admit(req(self.now, *id, server))),
            Step::Advance(ms) => {
                self.now += ms;
                String::new()
            }
        }
    }

    fn feed(&mut self, p: &mut Policy, kind: EventKind) -> String {
        let actions = p.handle(ev(self.now, kind));
        for a in &actions {
            if let Action::WakeAt(w) = a {
                self.wakes.insert(w.server.clone(), w.clone());
            }
        }
        format!("{actions:?} {:?}", p.status())
    }
}

fn scripted_steps() -> Vec<Step> {
    use Step::*;
    let e = |k: EventKind| Event(k);
    let fire = |s: &str| Fire(s.into());
    let admit = |s: &str, id| Admit(s.into(), id);
    let mut web = cfg("web");
    web.settings = r#"{"backoff": {"jitter": "decorrelated"}}"#.into();
    let mut files2 = cfg("files");
    files2.exclude = vec!["write".into()];
    vec![
        e(configured("files")),
        e(EventKind::ServerConfigured(web)),
        e(configured("db")),
        e(connect_failed("files", closed())),
        admit("files", 1),
        fire("files"),
        e(connect_failed("files", Fault::HandshakeTimedOut)),
        fire("files"),
        e(connected("files", &["read", "write"])),
        e(keepalive("files")),
        e(connect_failed("web", closed())),
        fire("web"),
        e(connect_failed("web", closed())),
        fire("web"),
        e(connect_failed("web", Fault::NotMcpEndpoint("html".into()))),
        admit("web", 2),
        e(connected("db", &["query", "x.y", "x_y"])),
        Advance(1_000),
        e(call("files", 3, transport_error())),
        e(call("files", 4, CallOutcome::Timeout)),
        e(call("files", 5, transport_error())),
        admit("files", 6),
        Advance(61_000),
        admit("files", 7),
        admit("files", 8),
        e(call("files", 7, transport_error())),
        Advance(121_000),
        admit("files", 9),
        e(call("files", 9, CallOutcome::Ok)),
        admit("files", 10),
        e(EventKind::ServerConfigured(files2)),
        fire("web"),
        e(connected("web", &["fetch"])),
        e(disconnected("web", closed())),
        fire("web"),
        e(connect_failed("web", closed())),
        e(reconnect("web", ReconnectSource::Operator)),
        e(connected("web", &["fetch"])),
        e(call("web", 11, CallOutcome::ToolError("bad".into()))),
        e(disconnected("db", Fault::ProcessExited(Some(1)))),
        fire("db"),
        e(connected("db", &["query"])),
        e(disconnected("db", Fault::ProcessExited(None))),
        fire("db"),
        e(EventKind::ToolsChanged(ServerTools {
            server: "files".into(),
            tools: vec![tool("read"), tool("list")],
        })),
        e(reconnect("files", ReconnectSource::Probe)),
        e(connected("files", &["read"])),
        e(EventKind::ServerRemoved("db".into())),
        Advance(5_000),
        e(timer("web", 999)),
        admit("web", 12),
        e(EventKind::Shutdown),
        admit("files", 13),
    ]
}

/// Runs `steps` on a policy and, in lockstep, on a twin that is snapshotted and restored before
/// every `every`-th step; both must produce the same outputs and end in the same state.
fn assert_restored_twin_matches(settings: &str, steps: &[Step], every: usize) {
    let mut a = Policy::new(settings).unwrap();
    let mut b = a.clone();
    let (mut da, mut db) = (Driver::default(), Driver::default());
    for (i, step) in steps.iter().enumerate() {
        if i % every == 0 {
            b = Policy::restore(&b.snapshot()).unwrap();
        }
        let out_a = da.run(&mut a, step);
        let out_b = db.run(&mut b, step);
        assert_eq!(out_a, out_b, "step {i}: {step:?}");
    }
    assert_eq!(a.snapshot(), b.snapshot());
}

#[test]
fn restored_policy_replays_a_scripted_sequence_identically() {
    let steps = scripted_steps();
    assert!(steps.len() > 50);
    for every in [1, 3, 7] {
        assert_restored_twin_matches(r#"{"seed": 9}"#, &steps, every);
    }
}

fn random_steps(seed: u64, n: usize) -> Vec<Step> {
    let mut rng = Pcg32::new(seed, 7);
    let servers = ["a", "b", "c", "a__b"];
    let faults = [
        closed(),
        Fault::HandshakeTimedOut,
        Fault::ProcessExited(Some(1)),
        Fault::SessionExpired,
        Fault::SpawnFailed("x".into()),
        Fault::AuthRequired(403),
    ];
    let mut pick = |len: usize| (rng.next_u32() as usize) % len;
    let mut steps = Vec::new();
    for i in 0..n {
        let s = servers[pick(servers.len())].to_string();
        let step = match pick(16) {
            0 => Step::Event(configured(&s)),
            1 => Step::Event(connected(&s, &["b__c", "c", "d"][..1 + pick(3)])),
            2 | 3 => Step::Event(connect_failed(&s, faults[pick(faults.len())].clone())),
            4 => Step::Event(disconnected(&s, faults[pick(faults.len())].clone())),
            5 => Step::Event(keepalive(&s)),
            6 => Step::Event(call(&s, i as u64, transport_error())),
            7 => Step::Event(call(&s, pick(8) as u64, CallOutcome::Ok)),
            8 | 9 => Step::Fire(s),
            10 => Step::Admit(s, pick(8) as u64),
            11 => Step::Event(reconnect(
                &s,
                [
                    ReconnectSource::Agent,
                    ReconnectSource::Operator,
                    ReconnectSource::Probe,
                ][pick(3)],
            )),
            12 => Step::Advance(pick(120_000) as u64),
            13 => Step::Event(EventKind::ServerRemoved(s)),
            14 => Step::Event(timer(&s, pick(50) as u64)),
            _ => Step::Event(if pick(40) == 0 {
                EventKind::Shutdown
            } else {
                EventKind::ToolsChanged(ServerTools {
                    server: s,
                    tools: vec![tool("c"), tool("x")],
                })
            }),
        };
        steps.push(step);
    }
    steps
}

#[test]
fn restored_policy_replays_random_sequences_identically_without_panicking() {
    for seed in 0..8 {
        let steps = random_steps(seed, 400);
        assert_restored_twin_matches(
            r#"{"initial_attempts": 2, "reconnect_budget": 3}"#,
            &steps,
            13,
        );
    }
}

#[test]
fn random_sequences_keep_the_invariants() {
    for seed in 100..110 {
        let mut p = Policy::new(r#"{"seed": 1}"#).unwrap();
        let mut d = Driver::default();
        for step in random_steps(seed, 300) {
            d.run(&mut p, &step);
            for s in p.status() {
                // Parked servers always have a self-probe armed; only live ones show tools.
                let server = &p.servers[&s.server];
                if s.state == ServerState::Parked {
                    assert!(server.wake.is_some(), "{s:?}");
                }
                if s.published_tools > 0 {
                    assert!(server.live, "{s:?}");
                }
            }
        }
    }
}

#[test]
fn snapshot_is_versioned_json_without_logs() {
    let mut p = healthy("", "files", &["read"]);
    p.handle(ev(1, disconnected("files", closed())));
    let bytes = p.snapshot();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["format"], "tether-default-policy");
    assert_eq!(v["version"], 1);
    let mut r = Policy::restore(&bytes).unwrap();
    assert!(r.take_logs().is_empty());
    assert_eq!(r.status(), p.status());
    assert_eq!(r.snapshot(), bytes);
}

#[test]
fn restore_rejects_garbage_and_wrong_versions_with_readable_reasons() {
    let good: Value = serde_json::from_slice(&healthy("", "f", &["a"]).snapshot()).unwrap();
    let with = |key: &str, value: Value| {
        let mut v = good.clone();
        v[key] = value;
        serde_json::to_vec(&v).unwrap()
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\x00\x01garbage".to_vec(), "not valid JSON"),
        (b"[1,2]".to_vec(), "not a JSON object"),
        (b"{}".to_vec(), "no format field"),
        (
            with("format", "other-policy".into()),
            "format \"other-policy\"",
        ),
        (with("version", 2.into()), "version 2 is not supported"),
        (with("policy", 3.into()), "damaged"),
    ];
    for (bytes, expected) in cases {
        let e = Policy::restore(&bytes).unwrap_err();
        assert!(e.contains(expected), "{e}");
    }
    let mut broken = good.clone();
    broken["policy"]["settings"]["initial_attempts"] = 0.into();
    let e = Policy::restore(&serde_json::to_vec(&broken).unwrap()).unwrap_err();
    assert!(e.contains("`initial_attempts`"), "{e}");
}

// ----- contract 0.2: cancelled calls, status at a time, take-over -----

#[test]
fn a_cancelled_call_counts_for_nothing_and_a_cancelled_probe_frees_the_probe() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    for id in 1..=5 {
        assert_eq!(p.admit(req(1, id, "files")), Admission::Allow);
        p.handle(ev(1, call("files", id, CallOutcome::Cancelled)));
    }
    let s = status_of(&p, "files");
    assert_eq!(
        (s.breaker, s.breaker_failures, s.tool_errors),
        (BreakerState::Closed, 0, 0)
    );
    open_breaker(&mut p, "files", 10);
    assert_eq!(p.admit(req(60_010, 20, "files")), Admission::Probe);
    assert!(matches!(
        p.admit(req(60_011, 21, "files")),
        Admission::Reject(_)
    ));
    p.handle(ev(60_012, call("files", 20, CallOutcome::Cancelled)));
    assert_eq!(p.admit(req(60_013, 22, "files")), Admission::Probe);
}

#[test]
fn status_at_a_later_time_shows_half_open_and_the_next_attempt() {
    let mut p = healthy(NO_JITTER, "files", &["read"]);
    open_breaker(&mut p, "files", 0);
    let s = p.status_at(1);
    assert_eq!(
        (s[0].breaker, s[0].breaker_until),
        (BreakerState::Open, Some(60_000))
    );
    let s = p.status_at(60_000);
    assert_eq!(
        (s[0].breaker, s[0].breaker_until),
        (BreakerState::HalfOpen, None)
    );
    let a = p.handle(ev(60_000, disconnected("files", closed())));
    let s = p.status_at(60_001);
    assert_eq!(s[0].next_attempt_at, Some(wake_of(&a).at));
    // Earlier than the latest time seen: the latest counts.
    assert_eq!(p.status_at(0), p.status_at(60_000));
}

fn handover_of(p: &Policy, now: Millis, live: &[(&str, &[&str], bool)]) -> Handover {
    Handover {
        now,
        previous: PolicyInfo {
            name: "another".into(),
            version: "9".into(),
        },
        servers: p
            .status_at(now)
            .into_iter()
            .map(|s| {
                let session =
                    live.iter()
                        .find(|(name, ..)| *name == s.server)
                        .map(|(_, tools, proven)| LiveSession {
                            server_info: "srv 1.0".into(),
                            tools: tools.iter().map(|t| tool(t)).collect(),
                            proven: *proven,
                        });
                ServerHandover {
                    config: cfg(&s.server),
                    connecting: false,
                    session,
                    state: s.state,
                    breaker: s.breaker,
                    breaker_until: s.breaker_until,
                    failures: s.failures,
                    breaker_failures: s.breaker_failures,
                    tool_errors: s.tool_errors,
                    last_fault: s.last_fault,
                    since: s.since,
                    next_attempt_at: s.next_attempt_at,
                }
            })
            .collect(),
    }
}

#[test]
fn take_over_keeps_sessions_breakers_counts_and_plans_without_connecting() {
    // The outgoing side: files healthy with an open breaker, web backing off, db parked.
    let mut old = healthy(NO_JITTER, "files", &["read", "write"]);
    open_breaker(&mut old, "files", 0);
    old.handle(ev(0, configured("web")));
    old.handle(ev(10, connect_failed("web", closed())));
    old.handle(ev(0, configured("db")));
    park_permanently(&mut old, "db", 20);
    let handover = handover_of(&old, 100, &[("files", &["read", "write"], true)]);

    let mut new = Policy::new(NO_JITTER).unwrap();
    let actions = new.take_over(handover).unwrap();
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Connect(_))),
        "no connect: {actions:?}"
    );
    assert!(actions.contains(&publish("files", &["read", "write"])));
    let before = old.status_at(100);
    let after = new.status_at(100);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            (
                &a.server,
                a.state,
                a.breaker,
                a.breaker_until,
                a.failures,
                a.breaker_failures
            ),
            (
                &b.server,
                b.state,
                b.breaker,
                b.breaker_until,
                b.failures,
                b.breaker_failures
            ),
        );
        assert_eq!(a.next_attempt_at, b.next_attempt_at, "{}", a.server);
        assert_eq!(a.last_fault, b.last_fault);
    }
    // The breaker still opens into a single probe at its time; the backoff fires as planned.
    assert!(matches!(
        new.admit(req(59_999, 1, "files")),
        Admission::Reject(_)
    ));
    assert_eq!(new.admit(req(60_000, 2, "files")), Admission::Probe);
    let web = after.iter().find(|s| s.server == "web").unwrap();
    let wake = actions
        .iter()
        .find_map(|a| match a {
            Action::WakeAt(w) if w.server == "web" => Some(w.clone()),
            _ => None,
        })
        .expect("web's attempt re-armed");
    assert_eq!(Some(wake.at), web.next_attempt_at);
    let fired = new.handle(ev(wake.at, timer("web", wake.token)));
    assert!(fired.contains(&Action::Connect("web".into())));
    // Take-over is for a fresh policy only.
    assert!(new.take_over(handover_of(&old, 100, &[])).is_err());
}
