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
