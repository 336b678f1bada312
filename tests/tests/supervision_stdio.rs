//! Supervision of real stdio child processes: Tether's invariants on the fault-injecting
//! fixture, with millisecond policy settings and condition waits.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use tether::config::ServerSpec;
use tether::policy::{BreakerState, ReconnectSource, ServerState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_first_failure_is_retried_and_then_succeeds() {
    let host = Host::fast();
    let state = host.state_dir("flaky");
    host.supervisor
        .add_server(stdio_fixture("flaky", &state, &["--fail-initializes", "1"]))
        .unwrap();
    wait_until("the tools are visible", || {
        host.tools("flaky").contains(&"flaky__echo".to_string())
    })
    .await;
    assert_eq!(state.starts(), 2, "one failed start, one good one");
    let result = host
        .supervisor
        .call_tool("flaky__echo", args(json!({"text": "hello"})))
        .await
        .unwrap();
    assert_eq!(text(&result), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_spawn_failure_parks_at_once_with_a_clear_reason() {
    let host = Host::fast();
    let mut spec = tether::config::ServerSpec::stdio("ghost", "/nonexistent/mcp-server", &[]);
    spec.timeouts = test_timeouts();
    host.supervisor.add_server(spec).unwrap();
    wait_until("the server parks", || {
        host.view("ghost").state == ServerState::Parked
    })
    .await;
    let view = host.view("ghost");
    let fault = view.last_fault.clone().unwrap_or_default();
    assert!(
        fault.contains("command not found: /nonexistent/mcp-server"),
        "{view:?}"
    );
    assert_eq!(
        view.reconnects, 1,
        "a permanent fault is not retried: {view:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_parks_withdraws_once_and_keeps_probing() {
    let host = Host::fast();
    let state = host.state_dir("dying");
    host.supervisor
        .add_server(stdio_fixture("dying", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !host.tools("dying").is_empty()).await;
    let mut changes = host.supervisor.registry().subscribe();

    // From now on every start crashes; kill the running one.
    state.control(json!({"crash_at_startup": 3}));
    kill(state.pid().unwrap(), 9);
    wait_until("the server parks", || {
        host.view("dying").state == ServerState::Parked
    })
    .await;
    assert!(host.tools("dying").is_empty());
    let starts_at_park = state.starts();
    assert!(
        starts_at_park <= 1 + 5,
        "parked within the budget, started {starts_at_park} times"
    );

    // Supervision goes on: the parked server's self-probe keeps trying.
    wait_until("a self-probe starts it again", || {
        state.starts() > starts_at_park
    })
    .await;
    wait_until("the failed probe parks it again", || {
        host.view("dying").state == ServerState::Parked
    })
    .await;
    let mut withdrawals = 0;
    while let Ok(change) = changes.try_recv() {
        if change.server == "dying" && !change.removed.is_empty() {
            withdrawals += 1;
        }
    }
    assert_eq!(withdrawals, 1, "tools are withdrawn exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_request_revives_a_parked_server_and_its_tools_return() {
    // Self-probes far away, so only the request can revive it.
    let host = Host::start(PARKED_STAYS_PARKED);
    let state = host.state_dir("sleepy");
    state.control(json!({"crash_at_startup": 3}));
    host.supervisor
        .add_server(stdio_fixture("sleepy", &state, &[]))
        .unwrap();
    wait_until("the server parks", || {
        host.view("sleepy").state == ServerState::Parked
    })
    .await;
    assert!(host.tools("sleepy").is_empty());

    state.control(json!({"crash_at_startup": null}));
    assert!(
        host.supervisor
            .request_reconnect("sleepy", ReconnectSource::Operator)
    );
    wait_until("its tools return", || {
        host.tools("sleepy").contains(&"sleepy__echo".to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_probe_revives_a_parked_server_without_any_signal() {
    let host = Host::fast();
    let state = host.state_dir("probed");
    state.control(json!({"crash_at_startup": 3}));
    host.supervisor
        .add_server(stdio_fixture("probed", &state, &[]))
        .unwrap();
    wait_until("the server parks", || {
        host.view("probed").state == ServerState::Parked
    })
    .await;
    state.control(json!({"crash_at_startup": null}));
    wait_until("its tools return", || !host.tools("probed").is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_after_proven_sessions_never_park() {
    let host = Host::fast();
    let state = host.state_dir("steady");
    let mut spec = stdio_fixture("steady", &state, &[]);
    spec.timeouts.keepalive_interval = Duration::from_millis(30);
    host.supervisor.add_server(spec).unwrap();
    for round in 1..=7u64 {
        wait_until("the session is proven", || {
            host.view("steady").state == ServerState::Healthy
        })
        .await;
        let pid = state.pid().unwrap();
        kill(pid, 9);
        wait_until("a new process is started", || {
            state.pid() != Some(pid) && state.starts() > round
        })
        .await;
        assert_ne!(
            host.view("steady").state,
            ServerState::Parked,
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_server_parks_within_the_budget() {
    let host = Host::fast();
    let state = host.state_dir("flappy");
    host.supervisor
        .add_server(stdio_fixture("flappy", &state, &["--flap"]))
        .unwrap();
    wait_until("the server parks", || {
        host.view("flappy").state == ServerState::Parked
    })
    .await;
    let starts = state.starts();
    assert!(
        starts <= 7,
        "no respawn storm: {starts} starts before parking"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_after_three_failures_and_fails_fast_without_touching_the_server() {
    let host = Host::fast();
    let state = host.state_dir("slowpoke");
    let mut spec = stdio_fixture("slowpoke", &state, &[]);
    spec.timeouts.call = Duration::from_millis(100);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("slowpoke").is_empty()).await;
    for _ in 0..3 {
        let result = host
            .supervisor
            .call_tool("slowpoke__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
        assert!(
            text(&result).contains("did not answer within"),
            "{}",
            text(&result)
        );
        assert!(!text(&result).contains("timed out"), "{}", text(&result));
    }
    wait_until("the three calls reached the server", || {
        state.calls_of("slow") == 3
    })
    .await;
    let refused = host
        .supervisor
        .call_tool("slowpoke__echo", args(json!({"text": "x"})))
        .await
        .unwrap();
    assert!(is_error(&refused));
    assert!(
        text(&refused).contains("slowpoke") && text(&refused).contains("not sent"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        state.calls_of("echo"),
        0,
        "an open breaker must not touch the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_half_open_probe_reaches_the_server() {
    let host = Host::fast();
    let state = host.state_dir("probe");
    let mut spec = stdio_fixture("probe", &state, &[]);
    spec.timeouts.call = Duration::from_millis(100);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("probe").is_empty()).await;
    for _ in 0..3 {
        host.supervisor
            .call_tool("probe__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
    }
    // Past the cooldown, several calls at once: one probes, the rest are refused.
    wait_for_breaker(&host, "probe", BreakerState::HalfOpen).await;
    let calls = (0..4).map(|i| {
        host.supervisor
            .call_tool("probe__echo", args(json!({"text": i.to_string()})))
    });
    let results = futures::future::join_all(calls).await;
    let answered = results
        .iter()
        .filter(|r| !is_error(r.as_ref().unwrap()))
        .count();
    assert_eq!(answered, 1, "{results:?}");
    assert_eq!(state.calls_of("echo"), 1);
    // The probe succeeded: the breaker is closed again.
    let after = host
        .supervisor
        .call_tool("probe__echo", args(json!({"text": "again"})))
        .await
        .unwrap();
    assert_eq!(text(&after), "again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_without_a_session_reconnects_and_the_new_session_closes_the_breaker() {
    // Backoff much longer than the breaker cooldown: the probe comes while the server is down.
    let host = Host::start(
        r#"{"backoff": {"base_ms": 600000, "cap_ms": 600000, "jitter": "none"},
            "breaker": {"failure_threshold": 3, "open_ms": 200, "open_max_ms": 400}}"#,
    );
    let state = host.state_dir("gone");
    let mut spec = stdio_fixture("gone", &state, &[]);
    spec.timeouts.call = Duration::from_millis(100);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("gone").is_empty()).await;
    let advertised = host.tools("gone");
    for _ in 0..3 {
        host.supervisor
            .call_tool("gone__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
    }
    let pid = state.pid().unwrap();
    kill(pid, 9);
    wait_until("the server is backing off", || {
        host.view("gone").state == ServerState::BackingOff
    })
    .await;
    // The cooldown ends without an event: the policy's status at the host's time shows it.
    wait_for_breaker(&host, "gone", BreakerState::HalfOpen).await;

    // The tools are withdrawn, but an agent holding the old list calls one: past the cooldown
    // the half-open probe finds no session, so the call is answered "reconnecting" and the
    // server is reconnected at once instead of after its long backoff.
    assert!(host.tools("gone").is_empty());
    let result = host
        .supervisor
        .call_tool("gone__echo", args(json!({"text": "x"})))
        .await
        .unwrap();
    assert!(is_error(&result));
    assert!(
        text(&result).contains("gone") && text(&result).contains("not sent"),
        "{}",
        text(&result)
    );
    assert_eq!(state.calls_of("echo"), 0);
    wait_until("the tools return", || host.tools("gone") == advertised).await;
    let result = host
        .supervisor
        .call_tool("gone__echo", args(json!({"text": "back"})))
        .await
        .unwrap();
    assert_eq!(text(&result), "back", "a new session closes the breaker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_found_dead_before_dispatch_is_respawned_and_the_call_runs_once() {
    let host = Host::fast();
    let state = host.state_dir("fragile");
    host.supervisor
        .add_server(stdio_fixture("fragile", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !host.tools("fragile").is_empty()).await;
    let pid = state.pid().unwrap();
    let session_pid = host.view("fragile").pid;
    let result = host
        .supervisor
        .call_tool_with_hook(
            "fragile__side_effect",
            args(json!({"label": "once"})),
            Default::default(),
            async {
                kill(pid, 9);
                wait_until("the child is gone", || !process_exists(pid)).await;
                // The host learns of the death a moment later (its process guard is reaped
                // after the child): the call must find the session dead, not race the news.
                wait_until("the host saw the child die", || {
                    host.view("fragile").pid != session_pid
                })
                .await;
            },
        )
        .await
        .unwrap();
    assert_eq!(text(&result), "done", "{result:?}");
    assert_eq!(state.calls_of("side_effect"), 1);
    assert_ne!(state.pid(), Some(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_dying_mid_call_fails_fast_as_uncertain_and_is_not_replayed() {
    let host = Host::fast();
    let state = host.state_dir("mortal");
    host.supervisor
        .add_server(stdio_fixture(
            "mortal",
            &state,
            &["--crash-after-calls", "1"],
        ))
        .unwrap();
    wait_until("tools visible", || !host.tools("mortal").is_empty()).await;
    let started = std::time::Instant::now();
    let result = host
        .supervisor
        .call_tool("mortal__side_effect", args(json!({"label": "x"})))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "fails fast, not at the call deadline"
    );
    let words = text(&result);
    assert!(is_error(&result));
    assert!(
        words.contains("mortal") && words.contains("uncertain"),
        "{words}"
    );
    assert!(words.contains("exited with code 4"), "{words}");
    assert!(!words.contains("timed out"), "{words}");
    wait_until("the server is back", || !host.tools("mortal").is_empty()).await;
    assert_eq!(state.calls_of("side_effect"), 1, "never replayed");
}

/// A call whose write to the child's stdin fails (the child closed it and lives on) never
/// left: its arguments come back from the transport, not from a copy, and it runs once, on a
/// fresh session, whatever the tool does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_write_failed_is_sent_again_with_its_arguments() {
    let host = Host::fast();
    let state = host.state_dir("closer");
    let log = state.0.join("calls.log");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/stdin_closer.py");
    let mut spec = ServerSpec::stdio("closer", "python3", &[script, log.to_str().unwrap()]);
    spec.timeouts = test_timeouts();
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("closer").is_empty()).await;
    let first = host
        .supervisor
        .call_tool("closer__record", args(json!({"n": 1})))
        .await
        .unwrap();
    assert_eq!(text(&first), r#"{"n": 1}"#);
    // The child closed its stdin before answering: this write finds no reader.
    let resent = tether::calls::resent_calls();
    let second = host
        .supervisor
        .call_tool(
            "closer__record",
            args(json!({"n": 2, "label": "the second"})),
        )
        .await
        .unwrap();
    assert_eq!(
        text(&second),
        r#"{"label": "the second", "n": 2}"#,
        "{second:?}"
    );
    assert!(
        tether::calls::resent_calls() > resent,
        "sent again, counted"
    );
    let runs = std::fs::read_to_string(&log).unwrap();
    let runs: Vec<(&str, &str)> = runs
        .lines()
        .map(|line| line.split_once(' ').unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "each call ran once: {runs:?}");
    assert_eq!(runs[1].1, r#"{"label": "the second", "n": 2}"#);
    assert_ne!(runs[0].0, runs[1].0, "the second ran in a fresh process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_call_lost_mid_flight_is_retried_once_on_a_fresh_session() {
    let host = Host::fast();
    let state = host.state_dir("reader");
    // Each process dies during its second call: the retry is the new process's first.
    let spec = stdio_fixture("reader", &state, &["--crash-after-calls", "2"]);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("reader").is_empty()).await;
    let warmup = host
        .supervisor
        .call_tool("reader__echo", args(json!({"text": "x"})))
        .await;
    assert_eq!(text(&warmup.unwrap()), "x");
    let result = host
        .supervisor
        .call_tool("reader__add", args(json!({"a": 2, "b": 3})))
        .await
        .unwrap();
    assert_eq!(text(&result), "5", "{result:?} {:?}", state.calls());
    assert_eq!(
        state.calls_of("add"),
        2,
        "executed on the dead session and once more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_list_changed_adds_and_removes_exactly_the_changed_tools() {
    let host = Host::fast();
    let state = host.state_dir("shifty");
    state.control(json!({"tools": ["echo", "add"]}));
    host.supervisor
        .add_server(stdio_fixture("shifty", &state, &[]))
        .unwrap();
    wait_until("tools visible", || host.tools("shifty").len() == 2).await;
    let mut changes = host.supervisor.registry().subscribe();
    state.control(json!({"tools": ["echo", "slow"]}));
    wait_until("the new list is visible", || {
        host.tools("shifty") == ["shifty__echo", "shifty__slow"]
    })
    .await;
    let change = changes.try_recv().expect("one change");
    assert_eq!(change.added, ["shifty__slow"]);
    assert_eq!(change.removed, ["shifty__add"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_child_process_is_left_after_shutdown() {
    let host = Host::fast();
    let mut pids = Vec::new();
    for name in ["one", "two", "three"] {
        let state = host.state_dir(name);
        host.supervisor
            .add_server(stdio_fixture(name, &state, &[]))
            .unwrap();
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
        pids.push(state.pid().unwrap());
    }
    host.supervisor.shutdown().await;
    for pid in pids {
        assert!(
            !process_exists(pid),
            "child {pid} is still there (zombie or alive)"
        );
    }
    assert!(host.supervisor.registry().snapshot().1.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_ignoring_stdin_close_and_sigterm_is_killed_after_the_grace() {
    let host = Host::fast();
    let state = host.state_dir("stubborn");
    let spec = stdio_fixture("stubborn", &state, &["--stubborn"]);
    let grace = spec.timeouts.stop_grace;
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("stubborn").is_empty()).await;
    let pid = state.pid().unwrap();
    let started = std::time::Instant::now();
    assert!(host.supervisor.remove_server("stubborn").await);
    let took = started.elapsed();
    assert!(
        !process_exists(pid),
        "child {pid} is still there (zombie or alive)"
    );
    // Closing stdin, then SIGTERM, each got the grace before SIGKILL.
    assert!(
        took >= grace * 2,
        "removal took {took:?}: the child cannot have been given two graces of {grace:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_goes_to_a_per_server_log_with_a_start_header() {
    let host = Host::fast();
    let state = host.state_dir("chatty");
    host.supervisor
        .add_server(stdio_fixture(
            "chatty",
            &state,
            &["--fail-initializes", "1"],
        ))
        .unwrap();
    wait_until("tools visible", || !host.tools("chatty").is_empty()).await;
    let log = std::fs::read_to_string(host.dir.path().join("logs/chatty.log")).unwrap();
    assert_eq!(log.matches("tether starting chatty").count(), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_extends_a_call_deadline_but_only_up_to_the_maximum() {
    let host = Host::fast();
    let state = host.state_dir("patient");
    let mut spec = stdio_fixture("patient", &state, &[]);
    // `slow` reports progress every 100 ms; without it a call would die after 300 ms.
    spec.timeouts.call = Duration::from_millis(300);
    spec.timeouts.call_max = Duration::from_millis(1500);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("patient").is_empty()).await;
    let kept_alive = host
        .supervisor
        .call_tool("patient__slow", args(json!({"ms": 800})))
        .await
        .unwrap();
    assert!(
        !is_error(&kept_alive),
        "progress resets the deadline: {}",
        text(&kept_alive)
    );
    let started = std::time::Instant::now();
    let too_long = host
        .supervisor
        .call_tool("patient__slow", args(json!({"ms": 5000})))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(is_error(&too_long));
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(4000),
        "the maximum ends it: {took:?}"
    );
    assert!(
        text(&too_long).contains("did not answer within"),
        "{}",
        text(&too_long)
    );
    // The call that ran out of time is cancelled at the server; so is one that reports no
    // progress (`hang`) past the idle deadline.
    wait_until("the server heard the cancellation", || {
        state.cancelled() == 1
    })
    .await;
    let started = std::time::Instant::now();
    let silent = host
        .supervisor
        .call_tool("patient__hang", args(json!({})))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        text(&silent).contains("did not answer within"),
        "{}",
        text(&silent)
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1400),
        "the idle deadline ends it: {took:?}"
    );
    wait_until("the server heard the second cancellation", || {
        state.cancelled() == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_ping_is_proven_by_a_tools_list_keepalive() {
    let host = Host::fast();
    let state = host.state_dir("pingless");
    let mut spec = stdio_fixture("pingless", &state, &["--ping-unsupported"]);
    spec.timeouts.keepalive_interval = Duration::from_millis(50);
    host.supervisor.add_server(spec).unwrap();
    wait_until("the session is proven", || {
        host.view("pingless").state == ServerState::Healthy
    })
    .await;
    // A failed keepalive would have closed the session: still the first process.
    assert_eq!(state.starts(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_pass_through_unchanged_and_never_open_the_breaker() {
    let host = Host::fast();
    let state = host.state_dir("grumpy");
    host.supervisor
        .add_server(stdio_fixture("grumpy", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !host.tools("grumpy").is_empty()).await;
    for _ in 0..5 {
        let result = host
            .supervisor
            .call_tool("grumpy__fail", args(json!({})))
            .await
            .unwrap();
        assert!(is_error(&result));
        assert_eq!(text(&result), "fail tool always fails");
    }
    let fine = host
        .supervisor
        .call_tool("grumpy__echo", args(json!({"text": "still here"})))
        .await
        .unwrap();
    assert_eq!(text(&fine), "still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_tool_lists_are_read_in_full_up_to_the_page_cap() {
    let host = Host::fast();
    let state = host.state_dir("paged");
    host.supervisor
        .add_server(stdio_fixture("paged", &state, &["--page-size", "2"]))
        .unwrap();
    wait_until("all seven tools visible", || host.tools("paged").len() == 7).await;

    let capped_state = host.state_dir("capped");
    let mut capped = stdio_fixture("capped", &capped_state, &["--page-size", "2"]);
    capped.timeouts.max_tool_pages = 2;
    host.supervisor.add_server(capped).unwrap();
    wait_until("the first two pages visible", || {
        host.tools("capped").len() == 4
    })
    .await;
}

/// A client's cancellation reaches the server and never counts against it: more cancelled
/// calls than the breaker's failure threshold leave it closed, its failures at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_reach_the_server_and_never_count_as_its_failures() {
    // Recorded, to see what the policy was told.
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("decisions.jsonl");
    let host = Host::recording(FAST_POLICY, &recording);
    let state = host.state_dir("patient");
    host.supervisor
        .add_server(stdio_fixture("patient", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !host.tools("patient").is_empty()).await;
    // FAST_POLICY's breaker opens after 3 failures.
    for round in 1..=4 {
        let context = tether::upstream::CallContext::default();
        let cancel = context.cancel.clone();
        let call =
            host.supervisor
                .call_tool_in("patient__slow", args(json!({"ms": 20000})), context);
        let canceller = async {
            wait_until("the call runs", || state.calls_of("slow") == round).await;
            cancel.cancel();
        };
        let (response, ()) = tokio::join!(call, canceller);
        let result = tether::calls::complete("patient__slow", response.unwrap());
        assert!(
            text(&result).contains("cancelled by the client"),
            "{}",
            text(&result)
        );
    }
    wait_until("the server heard every cancellation", || {
        state.cancelled() == 4
    })
    .await;
    let status = host.supervisor.policy_status().await;
    let patient = status.iter().find(|s| s.server == "patient").unwrap();
    assert_eq!(patient.breaker, BreakerState::Closed);
    assert_eq!(patient.breaker_failures, 0, "{patient:?}");
    let answer = host
        .supervisor
        .call_tool("patient__echo", args(json!({"text": "still here"})))
        .await
        .unwrap();
    assert_eq!(text(&answer), "still here");
    // The policy (contract 0.2) heard each call end as cancelled.
    let records = tether::policy::record::read(&recording).unwrap();
    let cancelled = records
        .iter()
        .filter(|(_, record)| {
            matches!(record, tether::policy::record::Record::Event { event, .. }
                if matches!(&event.kind, tether::policy::EventKind::CallFinished(report)
                    if report.outcome == tether::policy::CallOutcome::Cancelled))
        })
        .count();
    assert_eq!(cancelled, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_during_a_respawn_waits_for_the_fresh_session_and_runs_once() {
    // The next attempt comes 800 ms after a crash: long enough to call into the gap.
    let host = Host::start(
        r#"{"backoff": {"base_ms": 800, "cap_ms": 800, "jitter": "none"}, "hold_ms": 0}"#,
    );
    let state = host.state_dir("respawn");
    host.supervisor
        .add_server(stdio_fixture("respawn", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !host.tools("respawn").is_empty()).await;
    let crash = |state: &StateDir| {
        let pid = state.pid().unwrap();
        kill(pid, 9);
        pid
    };
    let backing_off = || host.view("respawn").state == ServerState::BackingOff;

    // Holding off: a call into the gap is refused, not sent.
    let first = crash(&state);
    wait_until("the server is backing off", backing_off).await;
    let result = host
        .supervisor
        .call_tool("respawn__side_effect", args(json!({"label": "refused"})))
        .await
        .unwrap();
    assert!(is_error(&result), "{result:?}");
    assert!(text(&result).contains("not sent"), "{}", text(&result));
    assert_eq!(state.calls_of("side_effect"), 0);
    wait_until("the fresh session", || {
        state.pid().is_some_and(|pid| pid != first) && !host.tools("respawn").is_empty()
    })
    .await;

    // The default (holding for up to 2 s): the call waits for the fresh session and runs
    // once on it.
    host.supervisor
        .policy()
        .set_settings(r#"{"backoff": {"base_ms": 800, "cap_ms": 800, "jitter": "none"}}"#.into())
        .await
        .unwrap();
    let second = crash(&state);
    wait_until("the server is backing off", backing_off).await;
    let started = std::time::Instant::now();
    let result = host
        .supervisor
        .call_tool("respawn__side_effect", args(json!({"label": "held"})))
        .await
        .unwrap();
    assert_eq!(text(&result), "done", "{result:?}");
    assert_eq!(state.calls_of("side_effect"), 1);
    let third = state.pid().unwrap();
    assert!(third != second && third != first);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "held for {:?}",
        started.elapsed()
    );
    host.supervisor.shutdown().await;
}

/// A frozen server (SIGSTOP) fails its keepalive: its tools are withdrawn then, while its
/// process is still being torn down (stdin closed, SIGTERM, a grace after each, SIGKILL), not
/// once the teardown is over; and the process is reaped all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_servers_tools_are_withdrawn_before_its_teardown_ends() {
    let host = Host::fast();
    let state = host.state_dir("frozen");
    let mut spec = stdio_fixture("frozen", &state, &[]);
    spec.timeouts.keepalive_interval = Duration::from_millis(200);
    spec.timeouts.keepalive_deadline = Duration::from_millis(300);
    // The teardown of a frozen child takes two graces: 8 s after the failed keepalive.
    spec.timeouts.stop_grace = Duration::from_secs(4);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("frozen").is_empty()).await;
    // A proven session: its failed keepalive alone does not cost it its tools, its end does.
    let answered = host
        .supervisor
        .call_tool("frozen__echo", args(json!({"text": "hi"})))
        .await
        .unwrap();
    assert!(!is_error(&answered));
    wait_until("the session is proven", || {
        host.view("frozen").state == ServerState::Healthy
    })
    .await;
    let pid = state.pid().unwrap();
    kill(pid, libc::SIGSTOP);
    let frozen = std::time::Instant::now();
    wait_until("the frozen server's tools are withdrawn", || {
        host.tools("frozen").is_empty()
    })
    .await;
    let withdrawn = frozen.elapsed();
    assert!(
        process_exists(pid),
        "the tools were withdrawn only after the teardown ({withdrawn:?})"
    );
    // At most the keepalive's interval (its floor) and deadline (virtual time shows there is
    // no wait after it): well before the teardown's two graces are over.
    let detection = tether::config::Timeouts::KEEPALIVE_FLOOR + Duration::from_secs(3);
    assert!(withdrawn < detection, "{withdrawn:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while process_exists(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the frozen child {pid} was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_removed_while_its_new_tools_wait_for_the_policy_leaves_nothing_behind() {
    let host = Host::fast();
    let state = host.state_dir("going");
    state.control(json!({"tools": ["echo", "add"]}));
    host.supervisor
        .add_server(stdio_fixture("going", &state, &[]))
        .unwrap();
    wait_until("tools visible", || host.tools("going").len() == 2).await;
    let pid = state.pid().unwrap();
    // A busy policy: the server's new tool list is queued, not yet decided, when it is removed.
    let policy = host.supervisor.policy();
    let hold = policy.hold();
    state.control(json!({"tools": ["echo", "slow"]}));
    wait_until("the new list waits for the policy", || policy.queued() >= 2).await;
    let removal = host.supervisor.remove_server("going");
    tokio::pin!(removal);
    tokio::select! {
        _ = &mut removal => panic!("the removal ended before the policy decided what it had queued"),
        () = wait_until("the child is gone", || !process_exists(pid)) => {}
    }
    // What the policy decided before it heard of the removal (a publication of the new list)
    // runs before the server is forgotten: the removal waits for it.
    let waited = tokio::time::timeout(Duration::from_millis(200), &mut removal).await;
    assert!(waited.is_err(), "the removal did not wait for the policy");
    drop(hold);
    assert!(removal.await);
    let mut changes = host.supervisor.registry().subscribe();
    host.supervisor.policy().status().await.unwrap();
    for tool in ["going__echo", "going__add", "going__slow"] {
        assert!(
            !host.supervisor.registry().knows(tool),
            "{tool} of the removed server is still known"
        );
    }
    assert!(!host.supervisor.catalog().is_visible("going"));
    assert!(
        changes.try_recv().is_err(),
        "the tools changed after the removal"
    );
}
