//! The embedding API as a plugin host uses it: a Tether built from code, its MCP endpoint
//! mounted in the host's own axum router, typed status, reconnect, reload, a policy swap, the
//! observer, the admin API, and a shutdown that leaves no child behind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use tether::admin::api;
use tether::policy::{PolicySource, ServerState, SwapPath};
use tether::{AdminOptions, Error, Event, ServerProblem, Tether};

use crate::common::*;

/// Shuts `tether` down, failing the test if that takes longer than 30 s.
async fn shut_down(tether: Tether) {
    tokio::time::timeout(
        Duration::from_secs(30),
        tether.shutdown(Duration::from_secs(5)),
    )
    .await
    .expect("shutdown completes");
}

async fn state_of(tether: &Tether, server: &str) -> Option<ServerState> {
    let status = tether.status().await;
    status
        .servers
        .iter()
        .find(|s| s.name == server)
        .map(|s| s.state)
}

/// Waits, on its lifecycle events, until `server` is healthy.
async fn wait_healthy(tether: &Tether, server: &str) {
    // Subscribed before the first look: a change after it is never missed.
    let mut changes = tether.events();
    let healthy = async {
        while state_of(tether, server).await != Some(ServerState::Healthy) {
            let _ = changes.next().await;
        }
    };
    if tokio::time::timeout(PATIENCE, healthy).await.is_err() {
        panic!(
            "{server} did not become healthy: {:?}",
            tether.status().await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_embeds_tether_mounts_its_mcp_endpoint_and_shuts_it_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        StateDir(path)
    };
    let (alpha, beta) = (state("alpha"), state("beta"));
    let heard: Arc<Mutex<Vec<Event>>> = Arc::default();
    let observer = heard.clone();
    let tether = Tether::builder()
        .server(stdio_fixture("alpha", &alpha, &[]))
        .server(stdio_fixture("beta", &beta, &[]))
        .policy_settings(FAST_POLICY)
        .log_dir(dir.path().join("logs"))
        .observer(move |event| observer.lock().unwrap().push(event.clone()))
        .admin(AdminOptions {
            bind: "127.0.0.1:0".parse().unwrap(),
            allow_remote: false,
            token: Some("embedded-token".into()),
        })
        .start()
        .await
        .expect("Tether starts");
    wait_healthy(&tether, "alpha").await;
    wait_healthy(&tether, "beta").await;

    // The MCP endpoint in the embedder's own router, beside its own route.
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .merge(tether.http_router(Default::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move { axum::serve(listener, app).await });
    let health = reqwest::get(format!("http://{addr}/health")).await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    let transport =
        rmcp::transport::StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
    let client = ().serve(transport).await.expect("an MCP session on the mounted endpoint");
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "alpha__echo"), "{tools:?}");
    let result = client
        .call_tool(
            CallToolRequestParams::new("alpha__echo")
                .with_arguments(args(serde_json::json!({"text": "through the embedder"})).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(text(&result), "through the embedder");

    // Typed operations and their errors.
    let alpha_pid = alpha.pid().expect("alpha runs");
    tether.reconnect("alpha").unwrap();
    assert!(matches!(tether.reconnect("nope"), Err(Error::UnknownServer(name)) if name == "nope"));
    assert!(matches!(tether.reload().await, Err(Error::NoConfigFile)));
    wait_until("alpha has a new child", || {
        alpha.pid().is_some_and(|pid| pid != alpha_pid)
    })
    .await;
    wait_healthy(&tether, "alpha").await;
    let refused = tether
        .reload_servers(vec![tether::config::ServerSpec::stdio(
            "no spaces",
            "true",
            &[],
        )])
        .await;
    assert!(
        matches!(&refused, Err(Error::Server { problems, .. })
            if matches!(&problems[..], [ServerProblem::BadName { server, .. }] if server == "no spaces")),
        "{refused:?}"
    );
    let beta_pid = beta.pid().expect("beta runs");
    let report = tether
        .reload_servers(vec![stdio_fixture("alpha", &alpha, &[])])
        .await
        .unwrap();
    assert_eq!(report.removed, ["beta"]);
    assert_eq!(report.unchanged, ["alpha"]);
    wait_until("beta's child is reaped", || !process_alive(beta_pid)).await;

    tether
        .set_policy_settings(r#"{"breaker": {"open_ms": 432}}"#)
        .await
        .unwrap();
    let settings = tether.status().await.policy.settings;
    assert_eq!(settings["breaker"]["open_ms"], 432, "{settings}");
    let refused = tether
        .set_policy_settings(r#"{"reconnect_budget": 0}"#)
        .await;
    assert!(matches!(refused, Err(Error::Policy(_))), "{refused:?}");

    let swap = tether
        .swap_policy(PolicySource::File(tether_tests::components::OTHER.into()))
        .await
        .unwrap();
    assert_eq!(swap.path, SwapPath::Handover);
    assert_eq!(tether.status().await.policy.name, swap.info.name);
    let bad = tether
        .swap_policy(PolicySource::Bytes {
            label: "not-a-policy".into(),
            bytes: b"\0asm nonsense".to_vec(),
        })
        .await;
    assert!(
        matches!(&bad, Err(Error::Policy(e)) if e.to_string().contains("not-a-policy")),
        "{bad:?}"
    );

    // The admin API answers with the same types.
    let admin = tether.admin_addr().expect("the admin API runs");
    let status: api::Status = reqwest::Client::new()
        .get(format!("http://{admin}/status"))
        .bearer_auth(tether.admin_token().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status.servers.len(), 1);
    assert_eq!(status.servers[0].name, "alpha");

    // The observer heard the lifecycle, the tools and the swap, in order.
    wait_until("the observer heard the swap", || {
        heard
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, Event::Policy { .. }))
    })
    .await;
    {
        let heard = heard.lock().unwrap();
        let first_healthy = heard.iter().position(|e| {
            matches!(e, Event::Lifecycle(c) if c.server == "beta" && c.state == ServerState::Healthy)
        });
        let stopped = heard.iter().position(|e| {
            matches!(e, Event::Lifecycle(c) if c.server == "beta" && c.state == ServerState::Stopped)
        });
        assert!(first_healthy.is_some() && stopped.is_some() && first_healthy < stopped);
        assert!(heard.iter().any(
            |e| matches!(e, Event::Tools(c) if c.server == "alpha" && c.added.contains(&"alpha__echo".to_string()))
        ));
    }

    let alpha_pid = alpha.pid().unwrap();
    shut_down(tether).await;
    assert!(!process_alive(alpha_pid), "alpha's child is reaped");
    // The mounted endpoint's sessions were closed: the client's session ends.
    let ended = tokio::time::timeout(Duration::from_secs(10), client.list_all_tools()).await;
    assert!(
        matches!(ended, Ok(Err(_))),
        "the session is closed: {ended:?}"
    );
    served.abort();
    assert!(
        reqwest::get(format!("http://{admin}/status"))
            .await
            .is_err(),
        "the admin API is closed"
    );
}

/// A Tether given a config file and servers in code: reloading the file keeps the servers
/// given in code (they are not the file's to remove), as at the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_servers_given_in_code() {
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        StateDir(path)
    };
    let (alpha, beta) = (state("alpha"), state("beta"));
    let config = dir.path().join("tether.toml");
    let file = |extra: &str| {
        format!(
            "[servers.alpha]\ncommand = {FIXTURE:?}\nargs = [\"--transport\", \"stdio\", \"--state-dir\", {:?}]\n{extra}",
            alpha.path_str()
        )
    };
    std::fs::write(&config, file("")).unwrap();
    let tether = Tether::builder()
        .config_file(&config)
        .server(stdio_fixture("beta", &beta, &[]))
        .policy_settings(FAST_POLICY)
        .log_dir(dir.path().join("logs"))
        .start()
        .await
        .expect("Tether starts");
    wait_healthy(&tether, "beta").await;
    let beta_pid = beta.pid().expect("beta runs");
    let report = tether.reload().await.unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(report.unchanged, ["alpha", "beta"]);
    // A file server named as one given in code is refused, as at the start.
    std::fs::write(&config, file("[servers.beta]\ncommand = \"true\"\n")).unwrap();
    let refused = tether.reload().await;
    assert!(
        matches!(&refused, Err(Error::Server { problems, .. })
            if matches!(&problems[..], [ServerProblem::Duplicate { server }] if server == "beta")),
        "{refused:?}"
    );
    assert_eq!(beta.pid(), Some(beta_pid), "beta was not touched");
    shut_down(tether).await;
}

/// A reload applies a config file's changed top-level `policy` (settings changed at runtime
/// stay while the file's do not change), says what the file has that Tether ignores, and
/// changes nothing when the policy refuses the new settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_the_files_changed_policy_settings_and_says_what_it_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let alpha = StateDir(dir.path().join("alpha"));
    std::fs::create_dir_all(&alpha.0).unwrap();
    let config = dir.path().join("tether.toml");
    let file = |top: &str| {
        format!(
            "{top}\n[servers.alpha]\ncommand = {FIXTURE:?}\nargs = [\"--transport\", \"stdio\", \"--state-dir\", {:?}]\n",
            alpha.path_str()
        )
    };
    std::fs::write(&config, file("[policy]\nbreaker = { open_ms = 300 }")).unwrap();
    let start = |settings: Option<&str>| {
        let mut builder = Tether::builder()
            .config_file(&config)
            .log_dir(dir.path().join("logs"));
        if let Some(settings) = settings {
            builder = builder.policy_settings(settings);
        }
        builder.start()
    };
    let tether = start(None).await.expect("Tether starts");
    wait_healthy(&tether, "alpha").await;
    let open_ms = |settings: serde_json::Value| settings["breaker"]["open_ms"].clone();
    assert_eq!(open_ms(tether.status().await.policy.settings), 300);

    // Changed at runtime, kept by a reload of an unchanged file.
    tether
        .set_policy_settings(r#"{"breaker": {"open_ms": 555}}"#)
        .await
        .unwrap();
    let report = tether.reload().await.unwrap();
    assert!(
        !report.policy_settings_changed && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_eq!(open_ms(tether.status().await.policy.settings), 555);

    // The file's changed: applied, and what it has that Tether ignores is reported.
    std::fs::write(
        &config,
        file("colour = \"blue\"\n[policy]\nbreaker = { open_ms = 432 }"),
    )
    .unwrap();
    let report = tether.reload().await.unwrap();
    assert!(report.policy_settings_changed, "{report:?}");
    assert_eq!(report.unchanged, ["alpha"]);
    assert!(
        report.warnings.iter().any(|w| w.contains("colour")),
        "{report:?}"
    );
    assert_eq!(open_ms(tether.status().await.policy.settings), 432);

    // Refused: an error naming the file, the settings as they were.
    let pid = alpha.pid();
    std::fs::write(&config, file("[policy]\nreconnect_budget = 0")).unwrap();
    let refused = tether.reload().await;
    assert!(
        matches!(&refused, Err(Error::Settings { origin, .. }) if origin.ends_with("tether.toml")),
        "{refused:?}"
    );
    assert_eq!(open_ms(tether.status().await.policy.settings), 432);
    assert_eq!(alpha.pid(), pid, "alpha was not touched");
    shut_down(tether).await;

    // Settings given in code win over the file's, on a reload as at the start.
    std::fs::write(&config, file("[policy]\nbreaker = { open_ms = 300 }")).unwrap();
    let tether = start(Some(r#"{"breaker": {"open_ms": 777}}"#))
        .await
        .expect("Tether starts");
    std::fs::write(&config, file("[policy]\nbreaker = { open_ms = 432 }")).unwrap();
    let report = tether.reload().await.unwrap();
    assert!(!report.policy_settings_changed, "{report:?}");
    assert!(
        report.warnings.iter().any(|w| w.contains("not used")),
        "{report:?}"
    );
    assert_eq!(open_ms(tether.status().await.policy.settings), 777);
    shut_down(tether).await;
}

/// A Tether supervising the fixture `alpha`, serving MCP over HTTP with sessions that end
/// after `idle` unused, and a client of its endpoint that speaks raw JSON-RPC.
async fn alpha_over_http(dir: &std::path::Path, idle: Duration) -> (Tether, RawHttp) {
    let alpha = StateDir(dir.join("alpha"));
    std::fs::create_dir_all(&alpha.0).unwrap();
    let tether = Tether::builder()
        .server(stdio_fixture("alpha", &alpha, &[]))
        .policy_settings(FAST_POLICY)
        .log_dir(dir.join("logs"))
        .start()
        .await
        .expect("Tether starts");
    wait_healthy(&tether, "alpha").await;
    let options = tether::gateway::HttpOptions {
        session_idle: Some(idle),
        ..Default::default()
    };
    let addr = tether
        .serve_http("127.0.0.1:0".parse().unwrap(), options)
        .await
        .unwrap();
    let client = RawHttp {
        http: reqwest::Client::new(),
        url: format!("http://{addr}/mcp"),
    };
    (tether, client)
}

/// JSON-RPC POSTed as a 2025-11-25 client does, answers read whole.
struct RawHttp {
    http: reqwest::Client,
    url: String,
}

impl RawHttp {
    async fn post(
        &self,
        message: serde_json::Value,
        session: Option<&str>,
    ) -> (reqwest::StatusCode, reqwest::header::HeaderMap, String) {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let response = request
            .json(&message)
            .send()
            .await
            .expect("the gateway answers");
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, response.text().await.unwrap_or_default())
    }

    /// A session, initialized.
    async fn session(&self) -> String {
        let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "caller", "version": "1"}}});
        let (_, headers, _) = self.post(initialize, None).await;
        let session = headers["mcp-session-id"].to_str().unwrap().to_string();
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(initialized, Some(&session)).await;
        // rmcp handles `initialized` on its own task, after the 202: until then a call goes to
        // rmcp, as it may (calls.rs takes a session's calls once it is up).
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.echo(&session, 0, "up?").await;
            assert!(status.is_success(), "{status}: {body}");
            if body.contains("id: t") {
                return session;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the session's calls were never taken past rmcp: {body}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn echo(&self, session: &str, id: u64, text: &str) -> (reqwest::StatusCode, String) {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "alpha__echo", "arguments": {"text": text}}});
        let (status, _, body) = self.post(call, Some(session)).await;
        (status, body)
    }

    async fn list_tools(&self, session: &str) -> (reqwest::StatusCode, String) {
        let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let (status, _, body) = self.post(list, Some(session)).await;
        (status, body)
    }
}

/// A session quiet for most of its idle time, then used by a tool call served past rmcp's
/// session machinery, lives another idle time from that call, as with rmcp alone (the tend
/// that tells rmcp's worker may come only after the worker's keep-alive has run out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_late_in_a_sessions_idle_time_keeps_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_secs(2);
    let (tether, client) = alpha_over_http(dir.path(), idle).await;
    let session = client.session().await;
    let quiet_since = std::time::Instant::now();

    // Between two tends (every quarter of the idle time): none follows the call before the
    // idle time from the session's start has run out.
    tokio::time::sleep(idle * 13 / 16).await;
    let (status, body) = client.echo(&session, 1, "late").await;
    assert!(
        status.is_success() && body.contains("late"),
        "{status}: {body}"
    );
    assert!(body.contains("id: t"), "served past rmcp: {body}");
    assert!(
        quiet_since.elapsed() < idle,
        "the call came within the idle time (a machine this slow proves nothing)"
    );

    // Past the idle time counted from the session's start, within the one from the call.
    tokio::time::sleep_until((quiet_since + idle * 5 / 4).into()).await;
    let (status, body) = client.list_tools(&session).await;
    assert!(
        status.is_success() && body.contains("alpha__echo"),
        "the session lives: {status} {body}"
    );
    shut_down(tether).await;
}

/// An HTTP session whose tool calls are all served past rmcp's session machinery
/// (`gateway/http/calls.rs`) lives as long as it is used: rmcp, which ends a session it has not
/// heard from for `session_idle`, is told it is in use. Unused, it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_session_used_only_for_tool_calls_lives_while_used_and_ends_idle() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_millis(400);
    let (tether, client) = alpha_over_http(dir.path(), idle).await;
    let session = client.session().await;

    // Calls for three times the idle time, none of them seen by rmcp.
    let started = std::time::Instant::now();
    let mut id = 1;
    while started.elapsed() < idle * 3 {
        id += 1;
        let (status, body) = client.echo(&session, id, "still here").await;
        assert!(status.is_success(), "{status}: {body}");
        assert!(body.contains("id: t"), "served past rmcp: {body}");
        assert!(body.contains("still here"), "{body}");
        tokio::time::sleep(idle / 8).await;
    }
    let (status, body) = client.list_tools(&session).await;
    assert!(
        status.is_success() && body.contains("alpha__echo"),
        "the session lives: {status} {body}"
    );

    tokio::time::sleep(idle * 3).await;
    let (status, body) = client.list_tools(&session).await;
    assert_eq!(
        status,
        reqwest::StatusCode::NOT_FOUND,
        "the unused session ended: {body}"
    );
    shut_down(tether).await;
}

#[tokio::test]
async fn a_bad_config_is_an_error_naming_the_file_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("servers.json");
    std::fs::write(&path, r#"{"mcpServers": {"a": {"command": 7}}}"#).unwrap();
    let error = Tether::builder()
        .config_file(&path)
        .start()
        .await
        .err()
        .expect("a bad config is refused");
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    assert!(
        error.to_string().starts_with(&path.display().to_string()),
        "{error}"
    );

    let duplicate = Tether::builder()
        .server(tether::config::ServerSpec::stdio("twin", "true", &[]))
        .server(tether::config::ServerSpec::stdio("twin", "true", &[]))
        .log_dir(dir.path())
        .start()
        .await
        .err()
        .expect("two servers of one name are refused");
    assert!(
        matches!(&duplicate, Error::Server { problems, .. }
            if matches!(&problems[..], [ServerProblem::Duplicate { server }] if server == "twin")),
        "{duplicate:?}"
    );
}
