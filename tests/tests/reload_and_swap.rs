//! Operations on a live host: config reloads that touch only what changed, and policy swaps
//! under continuous calls.

use std::sync::atomic::Ordering;

use crate::common::*;
use serde_json::json;
use tether::policy::{BreakerState, PolicySource, ServerState, ServerStatus, SwapPath};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_starts_added_stops_removed_restarts_changed_and_leaves_the_rest_alone() {
    let host = Host::fast();
    let (keep, drop_me, change) = (
        host.state_dir("keep"),
        host.state_dir("dropme"),
        host.state_dir("change"),
    );
    let keep_spec = stdio_fixture("keep", &keep, &[]);
    let drop_spec = stdio_fixture("dropme", &drop_me, &[]);
    let change_spec = stdio_fixture("change", &change, &[]);
    for spec in [keep_spec.clone(), drop_spec, change_spec.clone()] {
        host.supervisor.add_server(spec).unwrap();
    }
    for name in ["keep", "dropme", "change"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    let (keep_pid, drop_pid, change_pid) = (
        keep.pid().unwrap(),
        drop_me.pid().unwrap(),
        change.pid().unwrap(),
    );

    let added = host.state_dir("added");
    let mut changed = change_spec.clone();
    changed.exclude = vec!["exit_now".into()];
    let report = host
        .supervisor
        .reload(vec![
            keep_spec,
            changed,
            stdio_fixture("added", &added, &[]),
        ])
        .await;
    assert_eq!(report.added, ["added"]);
    assert_eq!(report.removed, ["dropme"]);
    assert_eq!(report.restarted, ["change"]);
    assert_eq!(report.unchanged, ["keep"]);

    wait_until("the added server is up", || !host.tools("added").is_empty()).await;
    wait_until("the changed server is back", || {
        !host.tools("change").is_empty()
    })
    .await;
    assert!(host.tools("dropme").is_empty());
    assert!(
        !process_exists(drop_pid),
        "a removed server's process is reaped"
    );
    assert_ne!(change.pid(), Some(change_pid), "a changed server restarts");
    assert!(
        !host
            .tools("change")
            .contains(&"change__exit_now".to_string())
    );
    assert_eq!(
        keep.pid(),
        Some(keep_pid),
        "an unchanged server keeps its process"
    );
    assert_eq!(keep.starts(), 1);
    host.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_swap_under_continuous_calls_fails_no_call_and_keeps_breaker_state() {
    // A long cooldown: the breaker must still be open after the swaps.
    let host = Host::start(r#"{"breaker": {"open_ms": 600000, "open_max_ms": 600000}}"#);
    let (busy, broken) = (host.state_dir("busy"), host.state_dir("broken"));
    host.supervisor
        .add_server(stdio_fixture("busy", &busy, &[]))
        .unwrap();
    let mut broken_spec = stdio_fixture("broken", &broken, &[]);
    broken_spec.timeouts.call = std::time::Duration::from_millis(100);
    host.supervisor.add_server(broken_spec).unwrap();
    for name in ["busy", "broken"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    // Open the breaker of one server with three timeouts.
    for _ in 0..3 {
        host.supervisor
            .call_tool("broken__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
    }
    let breaker = |status: Vec<tether::policy::ServerStatus>| {
        status
            .into_iter()
            .find(|s| s.server == "broken")
            .map(|s| s.breaker)
    };
    assert_eq!(
        breaker(host.supervisor.policy_status().await),
        Some(BreakerState::Open)
    );

    let callers = EchoCallers::start(&host.supervisor, "busy__echo", 4);
    let wrong = PolicySource::File(tether_tests::components::WRONG.into());
    for round in 0..6 {
        let target = if round % 2 == 0 {
            wrong.clone()
        } else {
            PolicySource::Embedded
        };
        host.supervisor.swap_policy(target).await.expect("swap");
        callers.flowing().await;
    }
    let done = callers.stop().await;
    assert!(done > 60);
    assert_eq!(
        breaker(host.supervisor.policy_status().await),
        Some(BreakerState::Open),
        "breaker state survives swaps"
    );
    assert_eq!(
        host.supervisor
            .policy()
            .stats()
            .swaps
            .load(Ordering::Relaxed),
        6
    );
    host.supervisor.shutdown().await;
}

/// A swap to another implementation, and back, announces nothing to agents: the incoming
/// policy's take-over publishes the live sessions' tools as they are shown, which changes
/// nothing and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_that_shows_the_same_tools_announces_nothing() {
    let host = Host::fast();
    let (alpha, beta) = (host.state_dir("alpha"), host.state_dir("beta"));
    for (name, state) in [("alpha", &alpha), ("beta", &beta)] {
        host.supervisor
            .add_server(stdio_fixture(name, state, &[]))
            .unwrap();
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    let generation = host.supervisor.registry().generation();
    let mut changes = host.supervisor.registry().subscribe();
    let fixed = PolicySource::File(tether_tests::components::FIXED_INTERVAL.into());
    for (round, target) in [fixed, PolicySource::Embedded].into_iter().enumerate() {
        let report = host.supervisor.swap_policy(target).await.expect("swap");
        assert_eq!(report.path, SwapPath::Handover);
        // One publication per live server, each of what was shown.
        assert_eq!(host.supervisor.redundant_actions(), 2 * (round as u64 + 1));
        assert_eq!(host.supervisor.registry().generation(), generation);
        assert!(changes.try_recv().is_err(), "no change to announce");
    }
    host.supervisor.shutdown().await;
}

/// What a swap must carry of a server's state, as the policy reports it.
fn carried(status: &[ServerStatus]) -> Vec<(String, ServerState, BreakerState, u32, u32)> {
    status
        .iter()
        .map(|s| {
            (
                s.server.clone(),
                s.state,
                s.breaker,
                s.failures,
                s.breaker_failures,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_across_implementations_and_contract_versions_keep_sessions_calls_and_state() {
    // Long cooldowns and self-probes: an open breaker and a parked server stay so for the test.
    let host = Host::start(
        r#"{"breaker": {"open_ms": 600000, "open_max_ms": 600000},
            "park": {"probe_initial_ms": 600000, "probe_max_ms": 600000}}"#,
    );
    let (busy, broken) = (host.state_dir("busy"), host.state_dir("broken"));
    host.supervisor
        .add_server(stdio_fixture("busy", &busy, &[]))
        .unwrap();
    let mut broken_spec = stdio_fixture("broken", &broken, &[]);
    broken_spec.timeouts.call = std::time::Duration::from_millis(100);
    host.supervisor.add_server(broken_spec).unwrap();
    let mut missing = stdio_fixture("missing", &host.state_dir("missing"), &[]);
    if let tether::config::TransportSpec::Stdio { command, .. } = &mut missing.transport {
        *command = "/nonexistent/tether-test-server".into();
    }
    host.supervisor.add_server(missing).unwrap();
    for name in ["busy", "broken"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    wait_until("the missing server is parked", || {
        host.view("missing").state == ServerState::Parked
    })
    .await;
    for _ in 0..3 {
        host.supervisor
            .call_tool("broken__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
    }
    let pids = (busy.pid().unwrap(), broken.pid().unwrap());

    let callers = EchoCallers::start(&host.supervisor, "busy__echo", 4);
    // Answered calls prove busy's session: its state is steady from here on. Broken's calls
    // all timed out: its keepalive proves it, and its state is steady once that has happened.
    callers.flowing().await;
    wait_until("broken's keepalive proves its session", || {
        host.view("broken").state == ServerState::Healthy
    })
    .await;
    let before = carried(&host.supervisor.policy_status().await);
    let broken_state = (BreakerState::Open, 0, 3);
    assert!(
        before.iter().any(
            |(name, _, breaker, failures, breaker_failures)| name == "broken"
                && (*breaker, *failures, *breaker_failures) == broken_state
        ),
        "{before:?}"
    );
    assert!(
        before.contains(&(
            "busy".into(),
            ServerState::Healthy,
            BreakerState::Closed,
            0,
            0
        )),
        "{before:?}"
    );
    assert!(
        before.contains(&(
            "missing".into(),
            ServerState::Parked,
            BreakerState::Closed,
            1,
            0
        )),
        "{before:?}"
    );
    let other = PolicySource::File(tether_tests::components::OTHER.into());
    let next_minor = PolicySource::File(tether_tests::components::NEXT_MINOR.into());
    // (next-minor is built for tether:policy@0.1.1.)

    // Default -> another implementation (its own state format) -> default: handovers that
    // carry everything, both ways.
    for (target, name) in [
        (other.clone(), "other-test-policy"),
        (PolicySource::Embedded, "tether-default-policy"),
    ] {
        let report = host.supervisor.swap_policy(target).await.expect("swap");
        assert_eq!(report.info.name, name);
        assert_eq!(report.path, SwapPath::Handover);
        assert!(report.not_carried.is_empty(), "{:?}", report.not_carried);
        assert_eq!(carried(&host.supervisor.policy_status().await), before);
        callers.flowing().await;
    }
    // The same implementation again: its own snapshot.
    let report = host
        .supervisor
        .swap_policy(PolicySource::Embedded)
        .await
        .expect("swap");
    assert_eq!(report.path, SwapPath::Snapshot);
    assert_eq!(carried(&host.supervisor.policy_status().await), before);

    // 0.2 -> 0.1 -> 0.2: the 0.1 policy is taught the servers and sessions as events and
    // keeps the sessions; the swap says what it could not be told.
    let report = host
        .supervisor
        .swap_policy(next_minor.clone())
        .await
        .expect("swap");
    assert_eq!(report.path, SwapPath::Events);
    assert_eq!(host.supervisor.policy().running().contract, "0.1.1");
    let lost = report.not_carried.join("\n");
    assert!(
        lost.contains("broken: breaker open") && lost.contains("missing: parked"),
        "{lost}"
    );
    callers.flowing().await;
    let report = host
        .supervisor
        .swap_policy(PolicySource::Embedded)
        .await
        .expect("swap");
    assert_eq!(report.path, SwapPath::Handover);
    assert_eq!(host.supervisor.policy().running().contract, "0.2.2");
    callers.flowing().await;
    // And back to 0.1: 0.1 -> 0.2 -> 0.1 as well.
    let report = host.supervisor.swap_policy(next_minor).await.expect("swap");
    assert_eq!(report.path, SwapPath::Events);
    callers.flowing().await;

    callers.stop().await;
    assert_eq!(
        (busy.pid().unwrap(), broken.pid().unwrap()),
        pids,
        "no session was replaced"
    );
    assert_eq!((busy.starts(), broken.starts()), (1, 1));
    assert!(!host.tools("busy").is_empty());
    host.supervisor.shutdown().await;
}

fn tether_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(args)
        .output()
        .expect("tether runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_replays_exactly_with_its_policy_and_shows_where_another_differs() {
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("decisions.jsonl");
    let host = Host::recording(FAST_POLICY, &recording);
    // A server that fails its first handshake, one that answers calls, dies and comes back.
    let (flaky, steady) = (host.state_dir("flaky"), host.state_dir("steady"));
    host.supervisor
        .add_server(stdio_fixture("flaky", &flaky, &["--fail-initializes", "1"]))
        .unwrap();
    host.supervisor
        .add_server(stdio_fixture("steady", &steady, &[]))
        .unwrap();
    for name in ["flaky", "steady"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    for text in ["a", "b", "c"] {
        let result = host
            .supervisor
            .call_tool("steady__echo", args(json!({"text": text})))
            .await
            .unwrap();
        assert_eq!(crate::common::text(&result), text);
    }
    let pid = steady.pid().unwrap();
    kill(pid, 9);
    wait_until("steady is back", || {
        steady.pid().is_some_and(|p| p != pid) && !host.tools("steady").is_empty()
    })
    .await;
    host.supervisor.shutdown().await;

    let recorded = std::fs::read_to_string(&recording).unwrap();
    assert!(recorded.lines().count() > 10, "{recorded}");
    // Descriptions and schemas are digests; no command line or path is in it.
    assert!(!recorded.contains(FIXTURE) && !recorded.contains(steady.path_str()));
    assert!(recorded.contains("digest:"), "{recorded}");

    let path = recording.to_str().unwrap();
    let (code, stdout, stderr) = tether_cli(&["policy", "replay", path]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 differ"), "{stdout}");

    // A policy that trusts bare handshakes decides otherwise as soon as a session opens.
    let wrong = tether_tests::components::WRONG;
    let (code, stdout, stderr) = tether_cli(&["policy", "replay", path, wrong]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("connected actions"), "{stdout}");
    assert!(
        stdout.contains("first on flaky") && stdout.contains("first on steady"),
        "{stdout}"
    );
    let (_, json_out, _) = tether_cli(&["policy", "replay", path, wrong, "--json"]);
    let report: serde_json::Value = serde_json::from_str(&json_out).unwrap();
    assert!(report["divergences"].as_u64().unwrap() >= 2, "{report}");
}
