//! `tether serve` end to end: a real MCP client on the gateway (stdio and Streamable HTTP)
//! follows an upstream through death, park and revival via `notifications/tools/list_changed`;
//! graceful shutdown answers in-flight calls and reaps every child; config errors are clear.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// An agent that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct Agent {
    list_changes: Arc<AtomicUsize>,
}

impl ClientHandler for Agent {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changes.fetch_add(1, Ordering::SeqCst);
    }
}

fn write_config(dir: &Path, state: &StateDir) -> std::path::PathBuf {
    let path = dir.join("servers.json");
    let config = json!({"mcpServers": {"up": {
        "command": FIXTURE,
        "args": ["--transport", "stdio", "--state-dir", state.path_str()],
    }}});
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// A temp dir with a config of one fixture upstream named `up`.
fn one_upstream() -> (tempfile::TempDir, StateDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("up"));
    std::fs::create_dir_all(&state.0).unwrap();
    let config = write_config(dir.path(), &state);
    (dir, state, config)
}

/// Runs `tether serve`; its stderr goes to `stderr_to`, or to a pipe the caller must drain.
fn serve(dir: &Path, config: &Path, extra: &[&str], stderr_to: Option<&Path>) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .args(["--policy-settings", FAST_POLICY])
        .args(extra)
        .env("RUST_LOG", "tether=debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(match stderr_to {
            Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
            None => Stdio::piped(),
        })
        .kill_on_drop(true)
        .spawn()
        .expect("tether serve starts")
}

async fn tool_names(client: &RunningService<RoleClient, Agent>) -> Vec<String> {
    client
        .peer()
        .list_all_tools()
        .await
        .map(|tools| tools.into_iter().map(|t| t.name.into_owned()).collect())
        .unwrap_or_default()
}

async fn call(
    client: &RunningService<RoleClient, Agent>,
    tool: &str,
    arguments: serde_json::Value,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Some(arguments) = args(arguments) {
        params = params.with_arguments(arguments);
    }
    client
        .peer()
        .call_tool(params)
        .await
        .expect("the gateway answers")
}

/// Waits (polling tools/list) until `condition` holds for the visible tool names.
async fn wait_for_tools(
    client: &RunningService<RoleClient, Agent>,
    what: &str,
    condition: impl Fn(&[String]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let names = tool_names(client).await;
        if condition(&names) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}; tools: {names:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Kills the upstream so that it cannot come back, waits for the agent to see its tools go,
/// lets it come back, and waits for the agent to see them return.
async fn follow_death_park_and_revival(
    client: &RunningService<RoleClient, Agent>,
    agent: &Agent,
    state: &StateDir,
) {
    wait_for_tools(client, "the upstream's tools are listed", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    assert_eq!(
        text(&call(client, "up__echo", json!({"text": "hi"})).await),
        "hi"
    );
    let changes_before = agent.list_changes.load(Ordering::SeqCst);

    state.control(json!({"crash_at_startup": 3}));
    kill(state.pid().unwrap(), 9);
    wait_for_tools(client, "the dead upstream's tools are gone", |t| {
        t.is_empty()
    })
    .await;
    wait_until("list_changed announced the withdrawal", || {
        agent.list_changes.load(Ordering::SeqCst) > changes_before
    })
    .await;
    let refused = call(client, "up__echo", json!({"text": "x"})).await;
    assert_eq!(
        refused.is_error,
        Some(true),
        "a withdrawn tool answers with words for the model"
    );

    let changes_at_park = agent.list_changes.load(Ordering::SeqCst);
    state.control(json!({"crash_at_startup": null}));
    wait_for_tools(client, "the revived upstream's tools are back", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    wait_until("list_changed announced the return", || {
        agent.list_changes.load(Ordering::SeqCst) > changes_at_park
    })
    .await;
    assert_eq!(
        text(&call(client, "up__echo", json!({"text": "back"})).await),
        "back"
    );
}

async fn terminate(mut tether: Child) -> std::process::ExitStatus {
    kill(tether.id().expect("running"), 15);
    tokio::time::timeout(PATIENCE, tether.wait())
        .await
        .expect("tether exits")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_stdio_follows_an_upstream_through_death_park_and_revival() {
    let (dir, state, config) = one_upstream();
    let mut tether = serve(
        dir.path(),
        &config,
        &[],
        Some(&dir.path().join("serve.log")),
    );
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let agent = Agent::default();
    let client = agent.clone().serve(io).await.expect("MCP over stdio");
    follow_death_park_and_revival(&client, &agent, &state).await;
    let child = state.pid().unwrap();
    assert!(terminate(tether).await.success());
    assert!(!process_exists(child), "the upstream is reaped on shutdown");
}

/// Starts `tether serve --http` and returns it with its MCP URL (read from its stderr).
async fn serve_http(dir: &Path, config: &Path) -> (Child, String) {
    let mut tether = serve(dir, config, &["--http", "127.0.0.1:0"], None);
    let mut lines = BufReader::new(tether.stderr.take().unwrap()).lines();
    let url = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split("serving MCP at ").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("tether serve ended without announcing its address");
    })
    .await
    .expect("tether announces its MCP address");
    // Keep draining stderr so the gateway never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (tether, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_streamable_http_follows_an_upstream_through_death_park_and_revival() {
    let (dir, state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
    let agent = Agent::default();
    let client = agent.clone().serve(transport).await.expect("MCP over HTTP");
    follow_death_park_and_revival(&client, &agent, &state).await;
    assert!(terminate(tether).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_calls_in_flight_and_reaps_every_child() {
    let (dir, state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let client = Agent::default()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url,
        ))
        .await
        .unwrap();
    wait_for_tools(&client, "tools listed", |t| {
        t.contains(&"up__slow".to_string())
    })
    .await;
    let child = state.pid().unwrap();
    let slow = tokio::spawn(async move {
        let result = call(&client, "up__slow", json!({"ms": 1500})).await;
        (client, result)
    });
    wait_until("the slow call reached the upstream", || {
        state.calls_of("slow") == 1
    })
    .await;
    let status = terminate(tether).await;
    let (_client, result) = slow.await.unwrap();
    assert_ne!(
        result.is_error,
        Some(true),
        "the in-flight call was answered: {result:?}"
    );
    assert!(status.success());
    assert!(!process_exists(child), "the upstream is reaped");
}

#[tokio::test]
async fn config_errors_name_the_file_the_server_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.json");
    std::fs::write(&config, r#"{"mcpServers": {"files": {"command": 42}}}"#).unwrap();
    let output = serve(dir.path(), &config, &[], None)
        .wait_with_output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bad.json") && stderr.contains("files") && stderr.contains("command"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing but MCP may go to stdout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_config_without_touching_unchanged_servers() {
    let (dir, state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let client = Agent::default()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url,
        ))
        .await
        .unwrap();
    wait_for_tools(&client, "the first server's tools", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    let first_pid = state.pid().unwrap();

    let second = StateDir(dir.path().join("more"));
    std::fs::create_dir_all(&second.0).unwrap();
    let both = json!({"mcpServers": {
        "up": {"command": FIXTURE, "args": ["--transport", "stdio", "--state-dir", state.path_str()]},
        "more": {"command": FIXTURE, "args": ["--transport", "stdio", "--state-dir", second.path_str()]},
    }});
    std::fs::write(&config, both.to_string()).unwrap();
    kill(tether.id().unwrap(), 1); // SIGHUP
    wait_for_tools(&client, "the added server's tools", |t| {
        t.contains(&"more__echo".to_string())
    })
    .await;
    assert_eq!(
        state.pid(),
        Some(first_pid),
        "the unchanged server keeps its process"
    );
    assert_eq!(state.starts(), 1);
    assert!(terminate(tether).await.success());
}
