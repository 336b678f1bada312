//! Supervision over HTTP: servers that restart (and forget their sessions) are recovered on
//! Streamable HTTP (answering 404 or the id-less 400) and on legacy SSE.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use tether::config::TransportSpec;

fn streamable() -> TransportSpec {
    TransportSpec::Http {
        url: String::new(),
        headers: BTreeMap::new(),
        sse_fallback: true,
    }
}

fn legacy_sse() -> TransportSpec {
    TransportSpec::Sse {
        url: String::new(),
        headers: BTreeMap::new(),
    }
}

/// Connects `name`, restarts its server on the same address, and checks tools and calls recover.
async fn survives_a_restart(transport: &str, path: &str, kind: TransportSpec, flags: &[&str]) {
    let host = Host::fast();
    let state = host.state_dir("web");
    let server = HttpFixture::start(transport, &state, "127.0.0.1:0", flags).await;
    let addr = server.addr;
    let mut spec = http_spec("web", format!("http://{addr}{path}"), kind);
    spec.timeouts.keepalive_interval = Duration::from_millis(100);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || {
        host.tools("web").contains(&"web__echo".to_string())
    })
    .await;
    let first = host
        .supervisor
        .call_tool("web__echo", args(json!({"text": "before"})))
        .await
        .unwrap();
    assert_eq!(text(&first), "before");

    let generation = host.supervisor.registry().generation();
    server.kill().await;
    let restarted = HttpFixture::start(transport, &state, &addr.to_string(), flags).await;
    wait_until("the tools were withdrawn and came back", || {
        host.supervisor.registry().generation() >= generation + 2 && !host.tools("web").is_empty()
    })
    .await;
    let after = host
        .supervisor
        .call_tool("web__echo", args(json!({"text": "after"})))
        .await
        .unwrap();
    assert_eq!(text(&after), "after", "{after:?}");
    assert_eq!(state.calls_of("echo"), 2, "each call executed exactly once");
    host.supervisor.shutdown().await;
    restarted.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_streamable_http_server_answering_404_is_recovered() {
    survives_a_restart("http", "/mcp", streamable(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_streamable_http_server_answering_400_without_id_is_recovered() {
    survives_a_restart(
        "http",
        "/mcp",
        streamable(),
        &["--http-unknown-session", "400"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_legacy_sse_server_is_recovered() {
    survives_a_restart("sse", "/sse", legacy_sse(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_only_server_configured_as_http_falls_back_and_remembers_it() {
    let host = Host::fast();
    let state = host.state_dir("old");
    let server = HttpFixture::start("sse", &state, "127.0.0.1:0", &[]).await;
    let spec = http_spec("old", format!("http://{}/sse", server.addr), streamable());
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !host.tools("old").is_empty()).await;
    assert_eq!(
        host.view("old").transport,
        tether::policy::TransportKind::Sse
    );
    host.supervisor.shutdown().await;
    server.kill().await;
}

/// A server that ends a live session (HTTP 404: it forgot the session; 401: the credentials
/// were revoked) is reported with that cause, not as a closed connection: a revoked token parks
/// the server at once instead of costing another attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_by_the_server_is_reported_with_its_cause() {
    for (status, words) in [
        (404, "the server no longer knows the session"),
        (401, "the server requires authorization (HTTP 401)"),
    ] {
        let host = Host::start(PARKED_STAYS_PARKED);
        let state = host.state_dir("web");
        let server = HttpFixture::start("http", &state, "127.0.0.1:0", &[]).await;
        let mut spec = http_spec("web", format!("http://{}/mcp", server.addr), streamable());
        spec.timeouts.keepalive_interval = Duration::from_millis(100);
        host.supervisor.add_server(spec).unwrap();
        wait_until("tools visible", || !host.tools("web").is_empty()).await;
        let mut lifecycle = host.supervisor.lifecycle();
        state.control(json!({"http_reject_sessions": status}));
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let first = loop {
            let event = tokio::time::timeout_at(deadline, lifecycle.recv())
                .await
                .expect("a lifecycle event in time")
                .expect("the lifecycle stream");
            if event.state != tether::policy::ServerState::Healthy {
                break event;
            }
        };
        assert!(first.detail.contains(words), "{status}: {first:?}");
        if status == 401 {
            assert_eq!(
                first.state,
                tether::policy::ServerState::Parked,
                "{first:?}"
            );
        }
        host.supervisor.shutdown().await;
        server.kill().await;
    }
}

/// A read-only call that finds its session expired (the server restarted and answers 404) is
/// retried once, on a session opened after the failure — never on the stale one, which may
/// still look alive for a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_call_on_an_expired_session_is_retried_on_a_fresh_one() {
    let host = Host::fast();
    let state = host.state_dir("web");
    let mut server = HttpFixture::start("http", &state, "127.0.0.1:0", &[]).await;
    let addr = server.addr;
    // No keepalive in the way: the call itself finds the session gone.
    let spec = http_spec("web", format!("http://{addr}/mcp"), streamable());
    host.supervisor.add_server(spec).unwrap();
    for round in 0..5 {
        wait_until("tools visible", || {
            host.tools("web").contains(&"web__add".to_string())
        })
        .await;
        server.kill().await;
        server = HttpFixture::start("http", &state, &addr.to_string(), &[]).await;
        let result = host
            .supervisor
            .call_tool("web__add", args(json!({"a": 2, "b": 3})))
            .await
            .unwrap();
        assert_eq!(text(&result), "5", "round {round}: {result:?}");
    }
    host.supervisor.shutdown().await;
    server.kill().await;
}

/// A read-only call whose server dies while running it goes out once more on a fresh session,
/// over Streamable HTTP and legacy SSE: the POST handed its arguments back to the call (no try
/// keeps a copy), and the call ran on the dead server and once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_call_lost_mid_flight_is_retried_once_on_a_fresh_session() {
    for (transport, path, kind) in [
        ("http", "/mcp", streamable()),
        ("sse", "/sse", legacy_sse()),
    ] {
        let host = Host::fast();
        let state = host.state_dir("web");
        // Each server process dies during its second call: the retry is the new one's first.
        let flags = ["--crash-after-calls", "2"];
        let server = HttpFixture::start(transport, &state, "127.0.0.1:0", &flags).await;
        let addr = server.addr;
        let spec = http_spec("web", format!("http://{addr}{path}"), kind);
        host.supervisor.add_server(spec).unwrap();
        wait_until("tools visible", || {
            host.tools("web").contains(&"web__add".to_string())
        })
        .await;
        let warmup = host
            .supervisor
            .call_tool("web__echo", args(json!({"text": "x"})))
            .await
            .unwrap();
        assert_eq!(text(&warmup), "x", "{transport}");
        // Another server takes the address once the first has died.
        let successor = {
            let state = StateDir(state.0.clone());
            let mut dying = server.child;
            tokio::spawn(async move {
                let _ = dying.wait().await;
                HttpFixture::start(transport, &state, &addr.to_string(), &flags).await
            })
        };
        let result = host
            .supervisor
            .call_tool("web__add", args(json!({"a": 2, "b": 3})))
            .await
            .unwrap();
        assert_eq!(text(&result), "5", "{transport}: {result:?}");
        assert_eq!(
            state.calls_of("add"),
            2,
            "{transport}: ran on the dead server and once more"
        );
        host.supervisor.shutdown().await;
        successor.await.unwrap().kill().await;
    }
}

/// A call the server refused before running it — HTTP 404 for the session it forgot when it
/// restarted, or a 400 naming no request — provably did not run: it is sent once more on a
/// fresh session whatever the tool does (here a tool with side effects), runs exactly once,
/// and is counted; the agent never hears "it may or may not have run".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_before_it_ran_is_sent_again_whatever_the_tool() {
    for flags in [&[][..], &["--http-unknown-session", "400"][..]] {
        let host = Host::fast();
        let state = host.state_dir("web");
        let mut server = HttpFixture::start("http", &state, "127.0.0.1:0", flags).await;
        let addr = server.addr;
        let mut spec = http_spec("web", format!("http://{addr}/mcp"), streamable());
        // Sessions, which a restarted server forgets (2026-07-28 has none to forget).
        spec.protocol = tether::config::ProtocolChoice::Legacy;
        host.supervisor.add_server(spec).unwrap();
        for round in 0..3 {
            wait_until("tools visible", || {
                host.tools("web").contains(&"web__side_effect".to_string())
            })
            .await;
            server.kill().await;
            server = HttpFixture::start("http", &state, &addr.to_string(), flags).await;
            let resent = tether::calls::resent_calls();
            let result = host
                .supervisor
                .call_tool(
                    "web__side_effect",
                    args(json!({"label": format!("round {round}")})),
                )
                .await
                .unwrap();
            assert_eq!(text(&result), "done", "{flags:?} round {round}: {result:?}");
            assert_eq!(
                state.calls_of("side_effect"),
                round + 1,
                "{flags:?}: each call ran exactly once"
            );
            assert!(tether::calls::resent_calls() > resent, "{flags:?}: counted");
        }
        // The server is down when the call goes out (the connection is refused, or the
        // session is already known gone): the call waits for the server and runs once.
        server.kill().await;
        let supervisor = host.supervisor.clone();
        let call = tokio::spawn(async move {
            supervisor
                .call_tool("web__side_effect", args(json!({"label": "while down"})))
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server = HttpFixture::start("http", &state, &addr.to_string(), flags).await;
        let result = call.await.unwrap().unwrap();
        assert_eq!(text(&result), "done", "{flags:?} while down: {result:?}");
        assert_eq!(state.calls_of("side_effect"), 4, "{flags:?}: ran once");
        host.supervisor.shutdown().await;
        server.kill().await;
    }
}

/// A keepalive a proxy answers with HTTP 502 and a page of its own (the server restarting
/// behind it) is asked again a few seconds later: answered then, the session and its tools stay,
/// with no new session and no reconnect.
#[tokio::test]
async fn a_keepalive_a_proxy_failed_once_keeps_the_session() {
    let host = Host::fast();
    let state = host.state_dir("web");
    let flags = ["--http-fail-pings", "1", "--http-fail-status", "502"];
    let server = HttpFixture::start("http", &state, "127.0.0.1:0", &flags).await;
    let mut spec = http_spec("web", format!("http://{}/mcp", server.addr), streamable());
    // The first keepalive, and the one asked again after it, come at the 5 s floor.
    spec.timeouts.keepalive_interval = Duration::from_secs(3600);
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || {
        host.tools("web").contains(&"web__add".to_string())
    })
    .await;
    let reconnects = host.view("web").reconnects;
    wait_until("the session proven", || {
        host.view("web").state == tether::policy::ServerState::Healthy
    })
    .await;
    let view = host.view("web");
    let fault = view.last_fault.unwrap_or_default();
    assert!(
        fault.contains("502"),
        "the failed keepalive was noted: {fault}"
    );
    assert_eq!(view.reconnects, reconnects, "no reconnect");
    assert_eq!(state.initializes(), 1, "no new session");
    assert!(host.tools("web").contains(&"web__add".to_string()));
    let sum = host
        .supervisor
        .call_tool("web__add", args(json!({"a": 2, "b": 3})))
        .await
        .unwrap();
    assert_eq!(text(&sum), "5");
}

/// The fixture's flags for a 2025-11-25 session and for 2026-07-28.
const BOTH_GENERATIONS: [&[&str]; 2] = [&[], &["--modern-only"]];

/// A host supervising the fixture over Streamable HTTP as `web` (2026-07-28 with
/// `--modern-only`, otherwise 2025-11-25), its tools visible.
async fn web_fixture(flags: &[&str]) -> (Host, StateDir, HttpFixture) {
    let host = Host::fast();
    let state = host.state_dir("web");
    let server = HttpFixture::start("http", &state, "127.0.0.1:0", flags).await;
    let mut spec = http_spec("web", format!("http://{}/mcp", server.addr), streamable());
    spec.protocol = match flags.contains(&"--modern-only") {
        true => tether::config::ProtocolChoice::Auto,
        false => tether::config::ProtocolChoice::Legacy,
    };
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || {
        host.tools("web").contains(&"web__slow".to_string())
    })
    .await;
    (host, state, server)
}

/// A 1.5 s call on `web`'s session, running at the server when this returns.
async fn slow_call_running(
    host: &Host,
    state: &StateDir,
) -> tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, tether::calls::CallError>> {
    let supervisor = host.supervisor.clone();
    let slow = tokio::spawn(async move {
        supervisor
            .call_tool("web__slow", args(json!({"ms": 1500})))
            .await
    });
    wait_until("the slow call runs", || state.calls_of("slow") == 1).await;
    slow
}

/// The slow call was answered on its session, and no other session was opened: no
/// `initialize`, and no connection attempt (2026-07-28 has no `initialize`).
async fn the_session_stayed(
    host: &Host,
    state: &StateDir,
    slow: tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, tether::calls::CallError>>,
    (initializes, reconnects): (u64, u64),
    flags: &[&str],
) {
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(
        text(&slow),
        "slept 1500 ms",
        "{flags:?}: the call on the session lived: {slow:?}"
    );
    assert_eq!(
        state.initializes(),
        initializes,
        "{flags:?}: no new session"
    );
    assert_eq!(
        host.view("web").reconnects,
        reconnects,
        "{flags:?}: no reconnect"
    );
}

/// `web`'s `add` of 2 and 3, as an agent's request gets it.
async fn add_2_and_3(
    host: &Host,
) -> Result<rmcp::model::CallToolResponse, tether::calls::CallError> {
    let arguments = args(json!({"a": 2, "b": 3}));
    (host.supervisor)
        .call_tool_in("web__add", arguments, Default::default())
        .await
}

/// A call a server refuses with HTTP 400 while its session still answers (a request it will not
/// take, not a session it forgot, which some SDKs also answer with 400) is answered with the
/// refusal and not sent again; the session stays, with the call running on it. Over a
/// 2025-11-25 session and on 2026-07-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_with_400_by_a_session_that_still_answers_keeps_the_session() {
    for flags in BOTH_GENERATIONS {
        let (host, state, server) = web_fixture(flags).await;
        let (initializes, reconnects) = (state.initializes(), host.view("web").reconnects);
        let slow = slow_call_running(&host, &state).await;

        // The slow call's POST was the first; the next is refused.
        state.control(json!({"http_fail_calls": 2, "http_fail_status": 400}));
        let refused = add_2_and_3(&host).await;
        let words = match refused {
            Err(error @ tether::calls::CallError::Rejected { .. }) => error.to_string(),
            Err(other) => panic!("{flags:?}: the refusal, as the server gave it: {other}"),
            Ok(_) => panic!("{flags:?}: answered, not refused"),
        };
        assert!(
            words.contains("JSON-RPC error (code -32603)") && words.contains("still answers"),
            "{flags:?}: {words}"
        );
        assert_eq!(state.calls_of("add"), 0, "{flags:?}: not run");

        the_session_stayed(&host, &state, slow, (initializes, reconnects), flags).await;

        // Three refusals in a row (POSTs 3 to 5; the slow call's answer came after the first):
        // a 2025-11-25 session that answers its keepalive and refuses every request is
        // replaced, and the third call, which never ran, runs on the new one. 2026-07-28 keeps
        // no session a new one could mend.
        state.control(json!({"http_fail_calls": 5, "http_fail_status": 400}));
        for refused in 0..2 {
            let answer = add_2_and_3(&host).await;
            assert!(
                matches!(answer, Err(tether::calls::CallError::Rejected { .. })),
                "{flags:?}: refusal {refused}: {answer:?}"
            );
            assert_eq!(host.view("web").reconnects, reconnects, "{flags:?}");
        }
        let modern = flags.contains(&"--modern-only");
        let third = add_2_and_3(&host).await;
        match third {
            Ok(rmcp::model::CallToolResponse::Complete(third)) if !modern => {
                assert_eq!(text(&third), "5", "{flags:?}: {third:?}");
                assert_eq!(state.calls_of("add"), 1, "{flags:?}: run once");
                assert_eq!(
                    host.view("web").reconnects,
                    reconnects + 1,
                    "{flags:?}: replaced"
                );
            }
            Err(tether::calls::CallError::Rejected { .. }) if modern => {
                assert_eq!(host.view("web").reconnects, reconnects, "{flags:?}");
            }
            other => panic!("{flags:?}: {other:?}"),
        }
        server.kill().await;
    }
}

/// A request other than a tool call (nothing sends it again) refused with a 400 naming no
/// request, by a server that restarted and forgot the session: the session, asked again, does
/// not answer either, and ends there rather than at its next keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_a_refused_request_finds_forgotten_ends_at_once() {
    use rmcp::model::{ClientRequest, ListToolsRequest};
    use tether::upstream::{CallFailure, ListChanges, Remembered, Session};

    let host = Host::fast();
    let state = host.state_dir("web");
    let flags = ["--http-unknown-session", "400"];
    let server = HttpFixture::start("http", &state, "127.0.0.1:0", &flags).await;
    let addr = server.addr;
    let mut spec = http_spec("web", format!("http://{addr}/mcp"), streamable());
    spec.protocol = tether::config::ProtocolChoice::Legacy;
    let session = Session::open(
        &spec,
        &mut Remembered::default(),
        std::sync::Arc::new(ListChanges::default()),
        tokio::sync::broadcast::channel(8).0,
        &host.dir.path().join("logs"),
        None,
    )
    .await
    .expect("opens");
    let list = || ClientRequest::ListToolsRequest(ListToolsRequest::with_param(Default::default()));
    let context = tether::upstream::CallContext::default();
    session
        .exchange("tools/list", list(), &spec.timeouts, &context)
        .await
        .expect("answered");
    server.kill().await;
    let server = HttpFixture::start("http", &state, &addr.to_string(), &flags).await;
    let refused = session
        .exchange("tools/list", list(), &spec.timeouts, &context)
        .await;
    assert!(
        matches!(refused, Err(CallFailure::NotSent(_))),
        "never ran: {refused:?}"
    );
    let end = session.recorded_end().map(|fault| fault.to_string());
    assert!(
        end.as_deref()
            .is_some_and(|end| end.contains("no longer answers")),
        "the session's end is recorded at once: {end:?}"
    );
    session.close(spec.timeouts.stop_grace).await;
    server.kill().await;
}

/// A server (or a proxy in front of it) that fails one request with HTTP 500 keeps its session:
/// a read-only call goes out once more on it and is answered, a call with side effects is
/// answered as uncertain, and a call running on the session meanwhile is not lost to a
/// reconnect. Over a 2025-11-25 session and on 2026-07-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_failed_keeps_the_session_and_the_calls_on_it() {
    for flags in BOTH_GENERATIONS {
        let (host, state, server) = web_fixture(flags).await;
        let (initializes, reconnects, generation) = (
            state.initializes(),
            host.view("web").reconnects,
            host.supervisor.registry().generation(),
        );
        // The fixture counts tool call POSTs from its start and fails those numbered up to
        // `http_fail_calls`: the slow call's is the first.
        let slow = slow_call_running(&host, &state).await;

        state.control(json!({"http_fail_calls": 2}));
        let read = host
            .supervisor
            .call_tool("web__add", args(json!({"a": 2, "b": 3})))
            .await
            .unwrap();
        assert_eq!(
            text(&read),
            "5",
            "{flags:?}: sent once more on the session: {read:?}"
        );

        state.control(json!({"http_fail_calls": 4}));
        let write = host
            .supervisor
            .call_tool("web__side_effect", args(json!({"label": "once"})))
            .await
            .unwrap();
        let words = text(&write);
        assert_eq!(write.is_error, Some(true), "{flags:?}: {words}");
        assert!(
            words.contains("HTTP 500") && words.contains("uncertain"),
            "{flags:?}: {words}"
        );
        assert_eq!(
            state.calls_of("side_effect"),
            0,
            "{flags:?}: never replayed"
        );

        the_session_stayed(&host, &state, slow, (initializes, reconnects), flags).await;
        assert_eq!(
            host.supervisor.registry().generation(),
            generation,
            "{flags:?}: the tools stayed"
        );
        host.supervisor.shutdown().await;
        server.kill().await;
    }
}

/// One call the server never answers blocks neither the other calls nor the keepalive of the
/// same session — on 2026-07-28, where each request is its own POST, and on a 2025-11-25
/// session, where they share one. With JSON answers, the stuck POST gets not even headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_call_blocks_neither_other_calls_nor_the_keepalive() {
    for flags in [
        &["--modern-only", "--json-response"][..],
        &["--json-response"][..],
        &[][..],
    ] {
        let host = Host::fast();
        let state = host.state_dir("web");
        let server = HttpFixture::start("http", &state, "127.0.0.1:0", flags).await;
        let mut spec = http_spec("web", format!("http://{}/mcp", server.addr), streamable());
        // A keepalive held behind the stuck call would fail within its deadline.
        spec.timeouts.keepalive_interval = Duration::from_millis(100);
        spec.timeouts.keepalive_deadline = Duration::from_millis(400);
        spec.timeouts.call = Duration::from_secs(60);
        host.supervisor.add_server(spec).unwrap();
        wait_until("tools visible", || {
            host.tools("web").contains(&"web__hang".to_string())
        })
        .await;
        let mut lifecycle = host.supervisor.lifecycle();
        let supervisor = host.supervisor.clone();
        let stuck =
            tokio::spawn(async move { supervisor.call_tool("web__hang", args(json!({}))).await });
        wait_until("the server runs the stuck call", || {
            state.calls_of("hang") == 1
        })
        .await;
        // Several keepalive deadlines pass while calls keep answering.
        let started = tokio::time::Instant::now();
        let mut answered = 0;
        while started.elapsed() < Duration::from_millis(1500) {
            let answer = tokio::time::timeout(
                Duration::from_secs(5),
                host.supervisor
                    .call_tool("web__echo", args(json!({"text": "still here"}))),
            )
            .await
            .unwrap_or_else(|_| panic!("{flags:?}: a call waited behind the stuck one"))
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            assert_eq!(text(&answer), "still here");
            answered += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(answered >= 5, "{flags:?}: {answered}");
        // The session stayed healthy throughout: no keepalive failed, nothing reconnected.
        while let Ok(event) = lifecycle.try_recv() {
            assert_eq!(
                event.state,
                tether::policy::ServerState::Healthy,
                "{flags:?}: {event:?}"
            );
        }
        assert_eq!(host.view("web").state, tether::policy::ServerState::Healthy);
        assert!(!stuck.is_finished(), "{flags:?}: {:?}", stuck.await);
        stuck.abort();
        host.supervisor.shutdown().await;
        server.kill().await;
    }
}

/// Sessions share TLS set up once per process. reqwest's own set-up reads every root
/// certificate of the system for each client it builds (Debian: about 150 files, 3 ms of CPU),
/// and Tether built one for every session: each reconnect read them again. Counted in the bytes
/// this process reads (`/proc/self/io`, in a process of its own so that no other test's reads
/// count), against what building one client of reqwest's own reads here: sessions to eight
/// servers, and their reconnects after the server restarts, read them at most once. (A server
/// that may use OAuth also has rmcp's OAuth manager, which reads them itself, twice, once a
/// server; these servers are not set up for OAuth.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_to_many_http_servers_read_the_systems_root_certificates_once() {
    const SERVERS: usize = 8;
    if !in_own_process(
        "supervision_http::sessions_to_many_http_servers_read_the_systems_root_certificates_once",
    ) {
        return;
    }
    let start = bytes_read();
    drop(reqwest::Client::new());
    let one_client = bytes_read() - start;
    let host = Host::fast();
    let state = host.state_dir("web");
    let server = HttpFixture::start("http", &state, "127.0.0.1:0", &[]).await;
    let addr = server.addr;
    let names: Vec<String> = (0..SERVERS).map(|i| format!("web{i}")).collect();
    let before = bytes_read();
    for name in &names {
        let mut spec = http_spec(name, format!("http://{addr}/mcp"), streamable());
        spec.timeouts.keepalive_interval = Duration::from_millis(100);
        host.supervisor.add_server(spec).unwrap();
    }
    let all_visible = || names.iter().all(|name| !host.tools(name).is_empty());
    wait_until("every server's tools are visible", all_visible).await;
    let opening = bytes_read() - before;

    let generation = host.supervisor.registry().generation();
    let before = bytes_read();
    server.kill().await;
    let restarted = HttpFixture::start("http", &state, &addr.to_string(), &[]).await;
    wait_until("every server was withdrawn and came back", || {
        host.supervisor.registry().generation() >= generation + 2 * SERVERS as u64 && all_visible()
    })
    .await;
    let reopening = bytes_read() - before;
    // The roots once (opening), plus what the sessions themselves read from their sockets.
    assert!(
        one_client > 10_000,
        "building a client read only {one_client} bytes: no roots to count?"
    );
    assert!(
        opening < 2 * one_client && reopening < one_client,
        "{SERVERS} sessions read {opening} bytes opening and {reopening} reopening; one client \
         of reqwest's own reads {one_client}"
    );
    host.supervisor.shutdown().await;
    restarted.kill().await;
}

/// Bytes this process has read so far, files and sockets (`rchar`).
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|line| line.strip_prefix("rchar: "))
        .and_then(|count| count.trim().parse().ok())
        .expect("rchar in /proc/self/io")
}

/// A server that announces a new tool list, then answers the session's requests with HTTP 400
/// (some SDKs say so of a session they forgot, as of a request they will not take): the list it
/// failed to give makes Tether ask the session at once, which is refused too, so the session is
/// given up now, its tools withdrawn, instead of an hour later at its next keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgotten_when_its_tools_are_read_again_is_given_up_at_once() {
    let host = Host::fast();
    let state = host.state_dir("web");
    let server = HttpFixture::start("http", &state, "127.0.0.1:0", &[]).await;
    let mut spec = http_spec("web", format!("http://{}/mcp", server.addr), streamable());
    // Sessions, which a server forgets (2026-07-28 has none to forget).
    spec.protocol = tether::config::ProtocolChoice::Legacy;
    host.supervisor.add_server(spec).unwrap();
    wait_until("the session is proven", || {
        host.view("web").state == tether::policy::ServerState::Healthy
    })
    .await;
    assert!(!host.tools("web").is_empty());
    state.control(json!({"http_reject_sessions": 400, "tools": ["echo", "slow"]}));
    wait_until("the forgotten session's tools are withdrawn", || {
        host.tools("web").is_empty()
    })
    .await;
    state.control(json!({"tools": ["echo", "slow"]}));
    wait_until("a new session's tools", || {
        host.tools("web") == ["web__echo", "web__slow"]
    })
    .await;
    host.supervisor.shutdown().await;
    server.kill().await;
}
