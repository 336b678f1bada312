//! The policy runtime with real components: the default policy end to end, hostile components
//! contained, swaps that keep state, version checks and the artifact cache.

use std::sync::{Arc, OnceLock};

use tether::policy::{
    Action, Admission, BreakerState, CallOutcome, CallReport, CallRequest, DEFAULT_INLINE_FUEL,
    Event, EventKind, Fault, Limits, PolicyEngine, PolicyError, PolicyFault, PolicyNotice,
    PolicyRuntime, PolicySource, RuntimeOptions, ServerState, ServerTools, SessionInfo, TimerFired,
    Tool, conformance,
};
use tether_tests::{
    component, components, configured, connect_failed, connected, disconnected, has_connect, tool,
};

/// One engine for the whole test binary: each component is compiled once.
fn engine() -> Arc<PolicyEngine> {
    static ENGINE: OnceLock<Arc<PolicyEngine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| PolicyEngine::new(None).expect("engine"))
        .clone()
}

fn start(
    source: PolicySource,
    settings: &str,
    checkpoint_every: usize,
    fallback: bool,
) -> PolicyRuntime {
    start_with(
        source,
        settings,
        checkpoint_every,
        fallback,
        DEFAULT_INLINE_FUEL,
    )
}

fn start_with(
    source: PolicySource,
    settings: &str,
    checkpoint_every: usize,
    fallback: bool,
    inline_fuel: u64,
) -> PolicyRuntime {
    PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine()),
        source,
        settings: settings.into(),
        checkpoint_every,
        fallback_to_default: fallback,
        inline_fuel,
        ..RuntimeOptions::default()
    })
    .expect("runtime starts")
}

/// The hostile component, every input decided on the policy thread (its misdeeds count an
/// instance's calls, so an inline attempt cut short would move them to another instance).
fn hostile(misdeed: &str, checkpoint_every: usize, fallback: bool) -> PolicyRuntime {
    hostile_inline(misdeed, checkpoint_every, fallback, 0)
}

/// The runtime recovered the failing instance itself: no fallback to the default policy.
fn assert_recovered_in_place(seen: &[PolicyNotice]) {
    assert!(
        seen.iter()
            .any(|n| matches!(n, PolicyNotice::Recovered { .. })),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|n| matches!(n, PolicyNotice::FellBack { .. })),
        "{seen:?}"
    );
}

fn hostile_inline(
    misdeed: &str,
    checkpoint_every: usize,
    fallback: bool,
    inline_fuel: u64,
) -> PolicyRuntime {
    start_with(
        component(components::HOSTILE),
        &format!(r#"{{"hostile":{{{misdeed}}}}}"#),
        checkpoint_every,
        fallback,
        inline_fuel,
    )
}

fn event(rt: &PolicyRuntime, now: u64, kind: EventKind) -> Result<Vec<Action>, PolicyError> {
    rt.handle(Event { now, kind }).wait()
}

fn admit(rt: &PolicyRuntime, now: u64, call_id: u64, server: &str) -> Admission {
    rt.admit(CallRequest {
        now,
        call_id,
        server: server.into(),
        tool: "work".into(),
    })
    .wait()
    .expect("admission")
}

fn transport_failure(rt: &PolicyRuntime, now: u64, call_id: u64, server: &str) {
    assert_eq!(admit(rt, now, call_id, server), Admission::Allow);
    event(
        rt,
        now,
        EventKind::CallFinished(CallReport {
            server: server.into(),
            call_id,
            outcome: CallOutcome::TransportError(Fault::TransportClosed("broken pipe".into())),
            duration_ms: 1,
        }),
    )
    .expect("call report");
}

/// Brings `server` to a proven session and opens its breaker with three transport failures.
fn open_breaker(rt: &PolicyRuntime, server: &str) {
    event(rt, 10, configured(server)).unwrap();
    event(rt, 20, connected(server, &["work"])).unwrap();
    event(rt, 30, EventKind::KeepaliveOk(server.into())).unwrap();
    for call in 1..=3 {
        transport_failure(rt, 40 + call, call, server);
    }
    let status = server_status(rt, server);
    assert_eq!(status.breaker, BreakerState::Open, "{status:?}");
}

fn server_status(rt: &PolicyRuntime, server: &str) -> tether::policy::ServerStatus {
    rt.status()
        .wait()
        .unwrap()
        .into_iter()
        .find(|s| s.server == server)
        .expect("server listed")
}

fn notices(rx: &mut tokio::sync::broadcast::Receiver<PolicyNotice>) -> Vec<PolicyNotice> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[test]
fn default_policy_passes_the_conformance_suite() {
    let results = conformance::run(&engine(), &PolicySource::Embedded, "{}");
    let failures: Vec<_> = results.iter().filter(|r| r.failure.is_some()).collect();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(results.len() >= 18);
}

#[test]
fn wrong_policy_fails_the_conformance_suite_naming_the_scenario() {
    let results = conformance::run(&engine(), &component(components::WRONG), "{}");
    let failed: Vec<_> = results
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.name)
        .collect();
    assert!(
        failed.contains(&"handshake-alone-does-not-reset-the-budget"),
        "{results:#?}"
    );
    let why = results
        .iter()
        .find(|r| r.name == "handshake-alone-does-not-reset-the-budget")
        .and_then(|r| r.failure.clone())
        .unwrap();
    assert!(why.contains("respawn storm"), "{why}");
}

#[test]
fn endless_loop_is_stopped_and_a_fresh_instance_takes_over() {
    let rt = hostile(r#""loop_on_event":3"#, 1, true);
    let mut rx = rt.notices();
    assert!(has_connect(&event(&rt, 1, configured("a")).unwrap(), "a"));
    event(&rt, 2, configured("b")).unwrap();
    // Third event loops forever inside the guest: fuel stops it, the answer still comes.
    let actions = event(&rt, 3, configured("c")).expect("contained");
    assert!(has_connect(&actions, "c"), "{actions:?}");
    let seen = notices(&mut rx);
    assert!(
        seen.iter()
            .any(|n| matches!(n, PolicyNotice::Fault { policy, error }
            if policy.contains("tether_policy_hostile") && error.contains("ran out of fuel"))),
        "{seen:?}"
    );
    assert_recovered_in_place(&seen);
    // The same component keeps deciding, with all three servers known.
    assert!(rt.running().label.contains("tether_policy_hostile"));
    assert_eq!(rt.status().wait().unwrap().len(), 3);
}

#[test]
fn a_decision_over_the_inline_budget_is_decided_again_on_the_policy_thread() {
    // The full budget is far above the inline one. The third `handle` of an instance loops: the
    // inline attempt runs out of its budget, and the policy thread decides the event on a fresh
    // instance (whose count starts again), so the event is answered and no fault is reported.
    let rt = hostile_inline(r#""loop_on_event":3"#, 1, true, DEFAULT_INLINE_FUEL);
    let mut rx = rt.notices();
    event(&rt, 1, configured("a")).unwrap();
    event(&rt, 2, configured("b")).unwrap();
    let actions = event(&rt, 3, configured("c")).expect("answered");
    assert!(has_connect(&actions, "c"), "{actions:?}");
    assert_eq!(notices(&mut rx), []);
    assert_eq!(
        rt.stats().faults.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert!(rt.running().label.contains("tether_policy_hostile"));
    assert_eq!(rt.status().wait().unwrap().len(), 3);
    assert!(has_connect(&event(&rt, 4, configured("d")).unwrap(), "d"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_writing_output_during_an_inline_decision_on_a_tokio_worker_is_answered() {
    // The guest's panic message goes to WASI stderr, whose sync binding panics on a tokio
    // worker. The policy thread, where WASI works, decides the event instead.
    let rt = hostile_inline(r#""panic_on_event":2"#, 1, true, DEFAULT_INLINE_FUEL);
    let handle = |now, kind| rt.handle(Event { now, kind });
    handle(1, configured("a")).await.unwrap();
    let actions = handle(2, connected("a", &["echo"]))
        .await
        .expect("answered");
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::PublishTools(p) if p.server == "a")),
        "{actions:?}"
    );
    assert!(rt.running().label.contains("tether_policy_hostile"));
    let status = rt.status().await.unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].state, ServerState::Connected, "{status:?}");
}

#[test]
fn memory_blow_up_is_capped_and_contained() {
    let rt = hostile(r#""grow_on_event":2"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("a")).unwrap();
    let actions = event(&rt, 2, configured("b")).expect("contained");
    assert!(has_connect(&actions, "b"));
    let seen = notices(&mut rx);
    assert!(
        seen.iter().any(
            |n| matches!(n, PolicyNotice::Fault { error, .. } if error.contains("memory limit"))
        ),
        "{seen:?}"
    );
}

#[test]
fn panic_on_the_nth_event_is_contained() {
    let rt = hostile(r#""panic_on_event":2"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("a")).unwrap();
    let actions = event(&rt, 2, connected("a", &["echo"])).expect("contained");
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::PublishTools(p) if p.server == "a")),
        "{actions:?}"
    );
    let seen = notices(&mut rx);
    assert!(
        seen.iter().any(|n| matches!(n, PolicyNotice::Fault { .. })),
        "{seen:?}"
    );
    assert_eq!(
        rt.stats().faults.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        rt.stats()
            .recoveries
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn a_flood_of_actions_is_refused_as_invalid_output() {
    let rt = hostile(r#""flood_on_event":2"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("a")).unwrap();
    let actions = event(&rt, 2, configured("b")).expect("contained");
    assert!(
        actions.len() < 10,
        "the flood must not reach the host: {}",
        actions.len()
    );
    let seen = notices(&mut rx);
    assert!(
        seen.iter().any(
            |n| matches!(n, PolicyNotice::Fault { error, .. } if error.contains("50000 actions"))
        ),
        "{seen:?}"
    );
}

#[test]
fn nonsensical_actions_are_refused_as_invalid_output() {
    // Decided on the policy thread, and inline: a fault found inline counts like any other.
    for inline_fuel in [0, DEFAULT_INLINE_FUEL] {
        let rt = hostile_inline(r#""nonsense_on_event":2"#, 1, true, inline_fuel);
        let mut rx = rt.notices();
        event(&rt, 1, configured("a")).unwrap();
        let actions = event(&rt, 2, configured("b")).expect("contained");
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::Connect(s) if s.contains("nobody"))),
            "{actions:?}"
        );
        assert!(has_connect(&actions, "b"), "{actions:?}");
        let seen = notices(&mut rx);
        // (A 0.2 policy's publication is checked first for tools its server offers.)
        assert!(
            seen.iter()
                .any(|n| matches!(n, PolicyNotice::Fault { error, .. }
                if error.contains("never configured") || error.contains("does not offer"))),
            "inline fuel {inline_fuel}: {seen:?}"
        );
        assert_eq!(
            rt.stats().faults.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "inline fuel {inline_fuel}"
        );
    }
}

#[test]
fn a_policy_that_keeps_failing_is_replaced_by_the_default_keeping_its_state() {
    // With a long journal the retry replays into the same fault, so recovery cannot help.
    let rt = hostile(r#""loop_on_event":8"#, 64, true);
    let mut rx = rt.notices();
    open_breaker(&rt, "a"); // events 1..=6
    event(&rt, 50, connect_failed("zzz")).unwrap(); // 7: unknown server, ignored
    let actions = event(&rt, 60, configured("b")).expect("the default answers"); // 8: loops
    assert!(has_connect(&actions, "b"), "{actions:?}");
    let seen = notices(&mut rx);
    assert!(
        seen.iter()
            .any(|n| matches!(n, PolicyNotice::FellBack { from, .. } if from.contains("hostile"))),
        "{seen:?}"
    );
    assert_eq!(rt.running().label, PolicySource::Embedded.label());
    // The breaker the hostile policy opened is still open under the default.
    let status = server_status(&rt, "a");
    assert_eq!(status.breaker, BreakerState::Open, "{status:?}");
    assert!(
        matches!(admit(&rt, 61, 99, "a"), Admission::Reject(m) if m.contains("\"a\"") || m.contains("a"))
    );
}

#[test]
fn a_policy_that_traps_in_restore_is_replaced_by_the_default() {
    // The panic forces a recovery; recovery needs restore, which traps too.
    let rt = hostile(r#""panic_on_event":7,"trap_in_restore":true"#, 1, true);
    let mut rx = rt.notices();
    open_breaker(&rt, "a"); // events 1..=6
    let actions = event(&rt, 60, configured("b")).expect("the default answers"); // 7: panics
    assert!(has_connect(&actions, "b"), "{actions:?}");
    let seen = notices(&mut rx);
    assert!(
        seen.iter()
            .any(|n| matches!(n, PolicyNotice::Fault { error, .. } if error.contains("restore"))),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|n| matches!(n, PolicyNotice::FellBack { .. })),
        "{seen:?}"
    );
    assert_eq!(rt.running().label, PolicySource::Embedded.label());
    assert_eq!(server_status(&rt, "a").breaker, BreakerState::Open);
}

#[test]
fn a_swap_into_a_component_whose_restore_traps_is_refused() {
    let rt = hostile(r#""trap_in_restore":true"#, 64, true);
    open_breaker(&rt, "a");
    let error = rt
        .swap_blocking(&component(components::HOSTILE))
        .expect_err("restore traps, so the swap must be refused")
        .to_string();
    assert!(
        error.contains("tether_policy_hostile") && error.contains("restore"),
        "{error}"
    );
    // The old instance keeps deciding with its state.
    assert_eq!(server_status(&rt, "a").breaker, BreakerState::Open);
    assert!(has_connect(&event(&rt, 99, configured("b")).unwrap(), "b"));
}

#[test]
fn without_fallback_a_persistent_fault_is_reported_naming_the_culprit() {
    let rt = hostile(r#""loop_on_event":2"#, 64, false);
    event(&rt, 1, configured("a")).unwrap();
    let error = event(&rt, 2, configured("b")).unwrap_err();
    match &error {
        PolicyError::Fault { policy, fault, .. } => {
            assert!(policy.contains("tether_policy_hostile"), "{policy}");
            assert!(matches!(fault, PolicyFault::OutOfFuel(_)), "{fault:?}");
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    // The runtime is still alive and answers.
    assert_eq!(rt.status().wait().unwrap().len(), 1);
}

#[test]
fn swap_between_different_components_keeps_breaker_and_budget_state() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    open_breaker(&rt, "a");
    event(&rt, 100, configured("b")).unwrap();
    event(&rt, 110, connect_failed("b")).unwrap();
    let before = rt.status().wait().unwrap();
    let report = rt
        .swap_blocking(&component(components::WRONG))
        .expect("swap");
    assert_eq!(report.info.name, "wrong-test-policy");
    // Another implementation: the state moves by handover, and all of it arrives.
    assert_eq!(report.path, tether::policy::SwapPath::Handover);
    assert!(report.not_carried.is_empty(), "{:?}", report.not_carried);
    let after = rt.status().wait().unwrap();
    assert_eq!(before, after, "state must survive the swap");
    assert_eq!(server_status(&rt, "a").breaker, BreakerState::Open);
    assert_eq!(server_status(&rt, "b").failures, 1);
    // And it really is a different policy now: it trusts handshakes, so a flapping server never
    // parks (the bug the conformance suite catches).
    let mut now = 200;
    for _ in 0..30 {
        now += 100_000;
        event(&rt, now, connected("b", &["x"])).unwrap();
        event(&rt, now + 1, disconnected("b")).unwrap();
    }
    assert_ne!(server_status(&rt, "b").state, ServerState::Parked);
}

#[test]
fn a_refused_swap_leaves_the_old_policy_running() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    open_breaker(&rt, "a");
    let running = rt.running();
    let incompatible = rt
        .swap_blocking(&component(components::INCOMPATIBLE))
        .unwrap_err();
    assert!(
        matches!(incompatible, PolicyError::Incompatible { .. }),
        "{incompatible:?}"
    );
    let garbage = rt
        .swap_blocking(&PolicySource::Bytes {
            label: "upload.wasm".into(),
            bytes: b"definitely not wasm".to_vec(),
        })
        .unwrap_err();
    assert!(garbage.to_string().contains("upload.wasm"), "{garbage}");
    assert_eq!(rt.running(), running);
    assert_eq!(server_status(&rt, "a").breaker, BreakerState::Open);
    assert!(has_connect(&event(&rt, 500, configured("c")).unwrap(), "c"));
}

#[test]
fn a_newer_compatible_minor_version_loads_and_an_incompatible_one_is_refused() {
    let rt = start(component(components::NEXT_MINOR), "{}", 64, false);
    assert_eq!(rt.running().contract, "0.1.1");
    assert!(has_connect(&event(&rt, 1, configured("a")).unwrap(), "a"));
    assert_eq!(admit(&rt, 2, 1, "a"), Admission::Allow);

    let error = PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine()),
        source: component(components::INCOMPATIBLE),
        ..RuntimeOptions::default()
    })
    .err()
    .expect("refused");
    let message = error.to_string();
    assert!(
        message.contains("tether:policy@0.3.0")
            && message.contains("0.2.x")
            && message.contains("0.1.x"),
        "{message}"
    );
    assert!(message.contains("tether_policy_incompatible"), "{message}");
}

#[test]
fn settings_are_validated_and_changed_without_losing_state() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    open_breaker(&rt, "a");
    let refused = rt
        .set_settings(r#"{"no_such_setting":1}"#.into())
        .wait()
        .unwrap_err();
    assert!(
        matches!(refused, PolicyError::Refused { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("no_such_setting"), "{refused}");
    rt.set_settings(r#"{"reconnect_budget":9}"#.into())
        .wait()
        .expect("accepted");
    assert_eq!(rt.running().settings, r#"{"reconnect_budget":9}"#);
    assert_eq!(server_status(&rt, "a").breaker, BreakerState::Open);
}

#[test]
fn the_embedded_policy_loads_precompiled_without_compiling() {
    let engine = PolicyEngine::new(None).expect("engine");
    let policy = engine.load(&PolicySource::Embedded).expect("loads");
    assert_eq!(
        engine.compilations(),
        0,
        "the embedded policy was compiled at load"
    );
    // The artifact is the real policy: it passes the conformance suite on this engine.
    assert!(policy.label().contains("embedded"), "{}", policy.label());
    let results = conformance::run(&engine, &PolicySource::Embedded, "{}");
    assert!(results.iter().all(|r| r.failure.is_none()), "{results:#?}");
    assert_eq!(engine.compilations(), 0);
    // Any other component is compiled.
    engine.load(&component(components::WRONG)).expect("loads");
    assert_eq!(engine.compilations(), 1);
}

#[test]
fn compiled_policies_are_cached_by_engine_compatibility() {
    let cache = tempfile::tempdir().unwrap();
    // A component from a file: the embedded one comes precompiled.
    let options = RuntimeOptions {
        source: component(components::WRONG),
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeOptions::default()
    };
    PolicyRuntime::start(options.clone()).expect("first start compiles");
    let artifacts: Vec<_> = walk(cache.path())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    let rt = PolicyRuntime::start(options.clone()).expect("second start loads the artifact");
    assert!(has_connect(&event(&rt, 1, configured("a")).unwrap(), "a"));
    // A damaged artifact is ignored and replaced, never trusted.
    std::fs::write(&artifacts[0], b"garbage").unwrap();
    let rt = PolicyRuntime::start(options).expect("recompiles");
    assert!(has_connect(&event(&rt, 1, configured("a")).unwrap(), "a"));
    assert_ne!(std::fs::read(&artifacts[0]).unwrap(), b"garbage");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

// ----- tool data: the sandbox is sized from the data it holds -----

const MB: usize = 1 << 20;

/// A tool whose description is `bytes` long, as text with the quotes, tabs and newlines real
/// descriptions have (each escaped in JSON), and a real schema.
fn big_tool(name: &str, bytes: usize) -> Tool {
    let line = format!("{name}: reads \"the thing\" and returns\tits contents.\n");
    let mut description = line.repeat(bytes / line.len() + 1);
    description.truncate(bytes);
    Tool {
        name: name.into(),
        description: Some(description),
        input_schema: format!(
            r#"{{"type":"object","properties":{{"path":{{"type":"string","description":"what {name} reads"}}}},"required":["path"]}}"#
        ),
        read_only: true,
        extra: String::new(),
    }
}

/// `count` tools named `{prefix}_{i}`, each with a description of `bytes`.
fn big_tools(prefix: &str, count: usize, bytes: usize) -> Vec<Tool> {
    (0..count)
        .map(|i| big_tool(&format!("{prefix}_{i}"), bytes))
        .collect()
}

fn session(server: &str, tools: Vec<Tool>) -> EventKind {
    EventKind::Connected(SessionInfo {
        server: server.into(),
        server_info: "big 1.0".into(),
        tools,
    })
}

fn tools_changed(server: &str, tools: Vec<Tool>) -> EventKind {
    EventKind::ToolsChanged(ServerTools {
        server: server.into(),
        tools,
    })
}

/// Asserts that `actions` publish exactly `tools` for `server`, descriptions and schemas intact.
fn assert_publishes(actions: &[Action], server: &str, tools: &[Tool]) {
    let publication = actions
        .iter()
        .rev()
        .find_map(|a| match a {
            Action::PublishTools(p) if p.server == server => Some(p),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{server}'s tools were not published"));
    assert_eq!(publication.tools.len(), tools.len(), "{server}");
    for tool in tools {
        let published = publication
            .tools
            .iter()
            .find(|p| p.original == tool.name)
            .unwrap_or_else(|| panic!("{} was not published", tool.name));
        assert!(
            published.description == tool.description
                && published.input_schema == tool.input_schema,
            "{} was published altered",
            tool.name
        );
    }
}

/// Asserts that nothing went wrong in the sandbox: no fault, no recovery, no fallback.
fn assert_no_faults(rt: &PolicyRuntime, rx: &mut tokio::sync::broadcast::Receiver<PolicyNotice>) {
    let seen = notices(rx);
    assert!(
        !seen.iter().any(|n| matches!(
            n,
            PolicyNotice::Fault { .. }
                | PolicyNotice::Recovered { .. }
                | PolicyNotice::FellBack { .. }
        )),
        "{seen:?}"
    );
    assert_eq!(
        rt.stats().faults.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// The `wake-at` in `actions`, as the timer event it asks for.
fn timer_of(actions: &[Action]) -> (u64, EventKind) {
    actions
        .iter()
        .find_map(|a| match a {
            Action::WakeAt(w) => Some((
                w.at,
                EventKind::Timer(TimerFired {
                    server: w.server.clone(),
                    token: w.token,
                }),
            )),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no timer armed: {actions:?}"))
}

#[test]
fn fourteen_tools_of_a_megabyte_each_connect_and_are_published() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("big")).unwrap();
    let tools = big_tools("t", 14, MB);
    let actions = event(&rt, 2, session("big", tools.clone())).expect("answered");
    assert_publishes(&actions, "big", &tools);
    assert_eq!(server_status(&rt, "big").state, ServerState::Connected);
    assert_eq!(server_status(&rt, "big").published_tools, 14);
    assert_no_faults(&rt, &mut rx);
}

#[test]
fn a_reconnect_with_ten_megabytes_of_tools_is_published() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("big")).unwrap();
    let first = big_tools("first", 14, MB);
    assert_publishes(
        &event(&rt, 2, session("big", first)).unwrap(),
        "big",
        &big_tools("first", 14, MB),
    );
    event(&rt, 3, EventKind::KeepaliveOk("big".into())).unwrap();
    let mut now = 4;
    for round in 0..2 {
        let actions = event(&rt, now, disconnected("big")).unwrap();
        let (at, timer) = timer_of(&actions);
        now = at.max(now + 1);
        assert!(has_connect(&event(&rt, now, timer).unwrap(), "big"));
        let tools = big_tools(&format!("again{round}"), 10, MB);
        now += 1;
        let actions = event(&rt, now, session("big", tools.clone())).expect("answered");
        assert_publishes(&actions, "big", &tools);
        now += 1;
        event(&rt, now, EventKind::KeepaliveOk("big".into())).unwrap();
        now += 1;
    }
    assert_eq!(server_status(&rt, "big").state, ServerState::Healthy);
    assert_no_faults(&rt, &mut rx);
}

#[test]
fn five_servers_of_three_megabytes_each_are_published() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    let mut rx = rt.notices();
    for (i, server) in ["s1", "s2", "s3", "s4", "s5"].into_iter().enumerate() {
        let now = 10 * i as u64;
        event(&rt, now + 1, configured(server)).unwrap();
        let tools = big_tools(server, 3, MB);
        let actions = event(&rt, now + 2, session(server, tools.clone())).expect("answered");
        assert_publishes(&actions, server, &tools);
    }
    let status = rt.status().wait().unwrap();
    assert_eq!(status.len(), 5);
    assert!(
        status
            .iter()
            .all(|s| s.state == ServerState::Connected && s.published_tools == 3),
        "{status:?}"
    );
    assert_no_faults(&rt, &mut rx);
}

#[test]
fn a_tool_list_growing_through_tools_changed_is_republished() {
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("grows")).unwrap();
    let tools = big_tools("t", 2, MB);
    assert_publishes(
        &event(&rt, 2, session("grows", tools.clone())).unwrap(),
        "grows",
        &tools,
    );
    for (step, count) in [5, 9, 14].into_iter().enumerate() {
        let tools = big_tools("t", count, MB);
        let actions =
            event(&rt, 3 + step as u64, tools_changed("grows", tools.clone())).expect("answered");
        assert_publishes(&actions, "grows", &tools);
    }
    assert_eq!(server_status(&rt, "grows").published_tools, 14);
    assert_no_faults(&rt, &mut rx);
}

/// Five servers of 3 MB each, proven: 15 MB of tool data in the policy's state.
fn load_five_servers(rt: &PolicyRuntime) {
    for (i, server) in ["s1", "s2", "s3", "s4", "s5"].into_iter().enumerate() {
        let now = 10 * i as u64;
        event(rt, now + 1, configured(server)).unwrap();
        event(rt, now + 2, session(server, big_tools(server, 3, MB))).unwrap();
        event(rt, now + 3, EventKind::KeepaliveOk(server.into())).unwrap();
    }
}

#[test]
fn descriptions_stay_in_the_host_through_snapshots_and_swaps() {
    // A checkpoint after every input. 15 MB of descriptions and schemas, but a 0.2 policy is
    // handed names only: its snapshots stay small, and publications get the text from the host.
    let rt = start(PolicySource::Embedded, "{}", 1, true);
    let mut rx = rt.notices();
    load_five_servers(&rt);
    let before = rt.status().wait().unwrap();
    let snapshot = rt.snapshot().wait().expect("snapshot");
    assert!(snapshot.len() < 64 << 10, "{}", snapshot.len());
    // A swap restores the snapshot into a fresh instance (of the same component, then another).
    rt.swap_blocking(&PolicySource::Embedded).expect("swap");
    assert_eq!(rt.status().wait().unwrap(), before);
    rt.swap_blocking(&component(components::HOSTILE))
        .expect("swap to another component");
    assert_eq!(rt.status().wait().unwrap(), before);
    // Still working with all that data: a server reconnects with a fresh 3 MB list.
    let actions = event(&rt, 100, disconnected("s3")).unwrap();
    let (at, timer) = timer_of(&actions);
    assert!(has_connect(&event(&rt, at, timer).unwrap(), "s3"));
    let tools = big_tools("s3_again", 3, MB);
    assert_publishes(
        &event(&rt, at + 1, session("s3", tools.clone())).unwrap(),
        "s3",
        &tools,
    );
    assert_no_faults(&rt, &mut rx);
}

#[test]
fn recovery_restores_that_much_data_into_a_fresh_instance() {
    // A checkpoint every 4 inputs: recovery restores a snapshot of 12 MB, then replays 3 MB.
    // The hostile component runs the default logic and panics on its 16th event.
    let rt = hostile(r#""panic_on_event":16"#, 4, true);
    let mut rx = rt.notices();
    load_five_servers(&rt); // events 1..=15
    let before = rt.status().wait().unwrap();
    let actions = event(&rt, 100, disconnected("s2")).expect("contained"); // 16: panics
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::WithdrawTools(s) if s == "s2")),
        "{actions:?}"
    );
    let seen = notices(&mut rx);
    assert_recovered_in_place(&seen);
    assert_eq!(
        rt.stats().faults.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "{seen:?}"
    );
    assert!(rt.running().label.contains("tether_policy_hostile"));
    let after = rt.status().wait().unwrap();
    for (b, a) in before.iter().zip(&after) {
        if a.server != "s2" {
            assert_eq!(a, b);
        }
    }
}

#[test]
fn seventy_five_megabytes_of_descriptions_never_reach_the_policy() {
    // Five servers of 15 MB: under contract 0.1 a snapshot carried some 160 MB, more than the
    // 128 MiB wasmtime lets one call hand the host by default. Under 0.2 it carries names.
    let rt = start(PolicySource::Embedded, "{}", 64, true);
    let mut rx = rt.notices();
    for (i, server) in ["s1", "s2", "s3", "s4", "s5"].into_iter().enumerate() {
        let now = 10 * i as u64;
        event(&rt, now + 1, configured(server)).unwrap();
        let tools = big_tools(server, 15, MB);
        assert_publishes(
            &event(&rt, now + 2, session(server, tools.clone())).unwrap(),
            server,
            &tools,
        );
    }
    let before = rt.status().wait().unwrap();
    let snapshot = rt.snapshot().wait().expect("snapshot");
    assert!(snapshot.len() < 64 << 10, "{}", snapshot.len());
    drop(snapshot);
    rt.swap_blocking(&PolicySource::Embedded).expect("swap");
    assert_eq!(rt.status().wait().unwrap(), before);
    assert_no_faults(&rt, &mut rx);
}

/// The memory limit a fault notice names, in bytes.
fn memory_limit_in(seen: &[PolicyNotice]) -> usize {
    seen.iter()
        .find_map(|n| match n {
            PolicyNotice::Fault { error, .. } => error
                .split("memory limit of ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no memory fault: {seen:?}"))
}

#[test]
fn a_leaking_policy_still_hits_a_cap_that_follows_the_data() {
    // 14 MB of descriptions are not the policy's data (a 0.2 policy gets names): a leak on the
    // 3rd event runs into the base cap plus the names' share.
    // (A checkpoint after every input: the recovered instance counts its events from zero.)
    let rt = hostile(r#""grow_on_event":3"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("big")).unwrap();
    let tools = big_tools("t", 14, MB);
    assert_publishes(
        &event(&rt, 2, session("big", tools)).unwrap(),
        "big",
        &big_tools("t", 14, MB),
    );
    event(&rt, 3, EventKind::KeepaliveOk("big".into())).expect("contained");
    let seen = notices(&mut rx);
    let limit = memory_limit_in(&seen);
    let base = Limits::default().memory_bytes;
    assert!(
        limit > base && limit < base + MB,
        "a cap of {limit} bytes for 14 tools of 1 MB"
    );
    assert_recovered_in_place(&seen);

    // What a 0.2 policy does hold, tool names, moves the cap: 20 000 tools.
    let rt = hostile(r#""grow_on_event":3"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("many")).unwrap();
    let many: Vec<Tool> = (0..20_000).map(|i| tool(&format!("tool_{i}"))).collect();
    event(&rt, 2, session("many", many)).unwrap();
    event(&rt, 3, EventKind::KeepaliveOk("many".into())).expect("contained");
    let seen = notices(&mut rx);
    let limit = memory_limit_in(&seen);
    assert!(
        limit > base + 5 * MB && limit < 1024 * MB,
        "a cap of {limit} bytes for 20 000 tools"
    );
    assert_recovered_in_place(&seen);
    assert!(rt.running().label.contains("tether_policy_hostile"));
    assert_eq!(server_status(&rt, "many").state, ServerState::Healthy);

    // Once the server is removed, its data no longer counts: the cap is the base again.
    let rt = hostile(r#""grow_on_event":4"#, 1, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("big")).unwrap();
    event(&rt, 2, session("big", big_tools("t", 14, MB))).unwrap();
    event(&rt, 3, EventKind::ServerRemoved("big".into())).unwrap();
    let actions = event(&rt, 4, configured("small")).expect("contained");
    assert!(has_connect(&actions, "small"), "{actions:?}");
    let seen = notices(&mut rx);
    assert_eq!(memory_limit_in(&seen), Limits::default().memory_bytes);
}

#[test]
fn a_policy_printing_during_inline_decisions_on_async_workers_stays_inline() {
    // Decided inline on tokio workers: the guest's stdout/stderr writes must work there (they
    // go to the host log), not panic and push every decision to the policy thread.
    let rt = hostile_inline(r#""print_from_event":1"#, 64, false, DEFAULT_INLINE_FUEL);
    let mut rx = rt.notices();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = rt.clone();
    tokio.block_on(async move {
        tokio::spawn(async move {
            for (now, name) in [(1, "a"), (2, "b"), (3, "c")] {
                let actions = handle
                    .handle(Event {
                        now,
                        kind: configured(name),
                    })
                    .await
                    .expect("decided");
                assert!(has_connect(&actions, name), "{actions:?}");
            }
        })
        .await
        .unwrap();
    });
    let stats = rt.stats();
    assert_eq!(
        stats
            .inline_misses
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(stats.faults.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(notices(&mut rx).is_empty());
}

#[test]
fn recovery_replays_a_journal_that_removed_a_server() {
    // A checkpoint every 2 inputs: after the server is configured and connected. The journal
    // then holds its removal; the 4th event panics, and the fresh instance replays the removal
    // (whose actions act on a server the live ledger has forgotten) before retrying it.
    let rt = hostile(r#""panic_on_event":4"#, 2, true);
    let mut rx = rt.notices();
    event(&rt, 1, configured("gone")).unwrap();
    event(&rt, 2, connected("gone", &["x"])).unwrap();
    event(&rt, 3, EventKind::ServerRemoved("gone".into())).unwrap();
    let actions = event(&rt, 4, configured("next")).expect("contained");
    assert!(has_connect(&actions, "next"), "{actions:?}");
    let seen = notices(&mut rx);
    assert_recovered_in_place(&seen);
    assert!(
        rt.running().label.contains("tether_policy_hostile"),
        "{seen:?}"
    );
}
