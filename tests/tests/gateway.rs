//! `tether serve` end to end: a real MCP client on the gateway (stdio and Streamable HTTP)
//! follows an upstream through death, park and revival via `notifications/tools/list_changed`;
//! graceful shutdown answers in-flight calls and reaps every child; config errors are clear.

mod dashboard;
mod oauth;
mod openapi;
mod python;
mod relay;
mod surface;
mod tls;
mod traces;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Polls until `condition` holds for what `read` returns.
async fn wait_for<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    mut read: impl FnMut() -> F,
    condition: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let value = read().await;
        if condition(&value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}; last: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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

/// `tether serve` on `config` with this test's state file, log dir and fast policy, not started.
fn serve_command(dir: &Path, config: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tether-cli"));
    command
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
        .env_remove("TETHER_MCP_TOKEN")
        .env_remove("TETHER_ADMIN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs `tether serve`; its stderr goes to `stderr_to`, or to a pipe the caller must drain.
fn serve(dir: &Path, config: &Path, extra: &[&str], stderr_to: Option<&Path>) -> Child {
    let mut command = serve_command(dir, config, extra);
    if let Some(path) = stderr_to {
        command.stderr(Stdio::from(std::fs::File::create(path).unwrap()));
    }
    command.spawn().expect("tether serve starts")
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

/// The upstream's tools are listed through `client`, and a call reaches it.
async fn assert_serves_the_upstream(client: &RunningService<RoleClient, Agent>) {
    wait_for_tools(client, "the upstream's tools are listed", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    assert_eq!(
        text(&call(client, "up__echo", json!({"text": "hi"})).await),
        "hi"
    );
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
    // The log went to a file, not a terminal: plain text, one line per lifecycle step.
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(!log.contains('\x1b'), "colour codes in a log file");
    assert!(
        !log.contains("parked: parked:"),
        "a lifecycle step logged twice"
    );
}

/// The agent closes its side of stdio: the gateway exits, successfully, within [`PATIENCE`].
async fn agent_leaves_and_gateway_exits<S: rmcp::service::Service<RoleClient>>(
    client: RunningService<RoleClient, S>,
    tether: &mut Child,
) {
    client.cancel().await.unwrap();
    let status = tokio::time::timeout(PATIENCE, tether.wait())
        .await
        .expect("the gateway ends when its agent leaves")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// A running `tether serve --http`.
struct HttpGateway {
    tether: Child,
    /// The MCP URL it announced, on a loopback address.
    url: String,
    /// Everything it wrote to stderr so far.
    stderr: Arc<Mutex<String>>,
}

/// Starts `command` (a `tether serve --http`) and waits for it to announce its MCP URL.
async fn start_http(mut command: Command) -> HttpGateway {
    let mut tether = command.spawn().expect("tether serve starts");
    let mut lines = BufReader::new(tether.stderr.take().unwrap()).lines();
    let stderr = Arc::new(Mutex::new(String::new()));
    let seen = stderr.clone();
    let url = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(rest) = line.split("serving MCP at ").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!(
            "tether serve ended without announcing its address:\n{}",
            seen.lock().unwrap()
        );
    })
    .await
    .expect("tether announces its MCP address");
    // Keep draining stderr so the gateway never blocks on a full pipe.
    let seen = stderr.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    HttpGateway {
        tether,
        url: url.replace("://0.0.0.0:", "://127.0.0.1:"),
        stderr,
    }
}

/// Starts `tether serve --http` on loopback and returns it with its MCP URL.
async fn serve_http(dir: &Path, config: &Path) -> (Child, String) {
    let gateway = start_http(serve_command(dir, config, &["--http", "127.0.0.1:0"])).await;
    (gateway.tether, gateway.url)
}

/// `--session-idle` sets how long an HTTP session lives unused; none at all is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_sessions_idle_time_is_set_on_the_command_line() {
    let (dir, _state, config) = one_upstream();
    let refused = serve_command(
        dir.path(),
        &config,
        &["--http", "127.0.0.1:0", "--session-idle", "0s"],
    )
    .output()
    .await
    .expect("tether runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--session-idle") && stderr.contains("idle time"),
        "{stderr}"
    );

    let idle = Duration::from_millis(400);
    let gateway = start_http(serve_command(
        dir.path(),
        &config,
        &["--http", "127.0.0.1:0", "--session-idle", "400ms"],
    ))
    .await;
    let http = reqwest::Client::new();
    let post = |message: serde_json::Value, session: Option<&str>| {
        let mut request = http
            .post(&gateway.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.json(&message).send()
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "idle", "version": "1"}}});
    let started = post(initialize, None).await.expect("an answer");
    let session = started.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(initialized, Some(&session)).await.expect("an answer");
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let used = post(list.clone(), Some(&session)).await.expect("an answer");
    assert!(used.status().is_success(), "{}", used.status());
    // Each probe uses the session, so each waits a few idle times untouched first.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        tokio::time::sleep(idle * 3).await;
        let unused = post(list.clone(), Some(&session)).await.expect("an answer");
        if unused.status() == reqwest::StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never ended: {}",
            unused.status()
        );
    }
    assert!(terminate(gateway.tether).await.success());
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

/// Where the kernel backs memory with huge pages only when asked (`madvise`, Debian's
/// default), `tether` asks for none. Its allocator would (mimalloc does by default), and an
/// idle gateway would then hold 14 MB of huge pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_asks_the_kernel_for_no_huge_pages() {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if !mode.is_ok_and(|mode| mode.contains("[madvise]")) {
        eprintln!("skipped: the kernel does not give huge pages only when asked");
        return;
    }
    let (dir, _state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
    let client = Agent::default()
        .serve(transport)
        .await
        .expect("MCP over HTTP");
    assert_serves_the_upstream(&client).await;
    let pid = tether.id().expect("tether runs");
    let Ok(memory) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        eprintln!("skipped: no /proc/PID/smaps_rollup (Linux before 4.14)");
        return;
    };
    let huge = memory
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))
        .expect("smaps_rollup counts huge pages");
    assert_eq!(huge.trim(), "0 kB", "tether holds huge pages:\n{memory}");
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
    // A config that cannot be used exits 4 (bad config), not 2 (usage).
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("bad.json") && stderr.contains("files") && stderr.contains("command"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing but MCP may go to stdout");
}

/// Per-server policy overrides, over-long server names and invalid filters are found when the
/// config is read: `serve` refuses to start, naming the file, the server and the reason.
#[tokio::test]
async fn invalid_server_names_and_policy_overrides_stop_serve_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let long = "n".repeat(300);
    for (name, server, words) in [
        (
            "override.json",
            json!({"files": {"command": FIXTURE, "policy": {"breaker": {"failure_threshold": "three"}}}}),
            vec![
                "files",
                "the policy refuses its configuration",
                "failure_threshold",
            ],
        ),
        (
            "unknown-key.json",
            json!({"files": {"command": FIXTURE, "policy": {"frob": 1}}}),
            vec!["files", "the policy refuses its configuration", "frob"],
        ),
        (
            "long.json",
            json!({long.clone(): {"command": FIXTURE}}),
            vec!["invalid server name", "at most 48 characters"],
        ),
    ] {
        let config = dir.path().join(name);
        std::fs::write(&config, json!({"mcpServers": server}).to_string()).unwrap();
        let started = Instant::now();
        let output = serve(dir.path(), &config, &[], None)
            .wait_with_output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(4), "{name}: {stderr}");
        assert!(stderr.contains(name), "{name}: {stderr}");
        for word in words {
            assert!(stderr.contains(word), "{name}: no {word:?} in {stderr}");
        }
        assert!(started.elapsed() < PATIENCE);
    }
}

/// `tether config check` finds what `serve` would refuse, every bad server at once, and exits 4;
/// a usable config exits 0 and lists its servers and policy. Nothing is ever started: the
/// servers' command would leave a mark.
#[tokio::test]
async fn config_check_finds_what_serve_would_refuse_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("started");
    let marker = json!({"command": "sh", "args": ["-c", format!("touch {}", mark.display())]});
    let check = |config: &Path, json: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"));
        command.args(["config", "check"]).arg(config);
        command.arg("--cache-dir").arg(dir.path().join("cache"));
        if json {
            command.arg("--json");
        }
        let output = command.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };

    let good = dir.path().join("good.json");
    let servers = json!({"files": marker, "web": {"url": "http://127.0.0.1:9/mcp"}});
    std::fs::write(&good, json!({"mcpServers": servers}).to_string()).unwrap();
    let (code, stdout, stderr) = check(&good, false);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("usable") && stdout.contains("files (stdio)"),
        "{stdout}"
    );
    let (code, stdout, _) = check(&good, true);
    assert_eq!(code, Some(0));
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["servers"][1]["name"], "web");
    assert_eq!(answer["servers"][1]["transport"], "Streamable HTTP");
    assert!(answer["policy"]["name"].is_string(), "{answer}");

    // Two servers the policy refuses: both named, in one answer.
    let bad = dir.path().join("bad.json");
    let mut one = marker.clone();
    one["policy"] = json!({"frob": 1});
    let mut two = marker.clone();
    two["policy"] = json!({"breaker": {"failure_threshold": "three"}});
    std::fs::write(
        &bad,
        json!({"mcpServers": {"one": one, "two": two}}).to_string(),
    )
    .unwrap();
    let (code, _, stderr) = check(&bad, false);
    assert_eq!(code, Some(4), "{stderr}");
    for word in ["bad.json", "`one`", "frob", "`two`", "failure_threshold"] {
        assert!(stderr.contains(word), "no {word:?} in {stderr}");
    }
    let (code, stdout, _) = check(&bad, true);
    assert_eq!(code, Some(4));
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (answer["ok"].clone(), answer["kind"].clone()),
        (json!(false), json!("server"))
    );

    // A file that is not a config at all.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, r#"{"mcpServers": {"files": {"command": 42}}}"#).unwrap();
    let (code, _, stderr) = check(&broken, false);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("broken.json") && stderr.contains("command"),
        "{stderr}"
    );

    assert!(!mark.exists(), "config check started a server");
}

/// Logs as JSON lines for a pipeline (`--log-format json`), fewer with `-q`; shell completions
/// and the man page come from the same definition as the parser.
#[test]
fn json_logs_quiet_completions_and_the_man_page() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("odd.json");
    let odd = json!({"mcpServers": {"files": {"command": "true", "frobnicate": 1}}});
    std::fs::write(&config, odd.to_string()).unwrap();
    let tether = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let path = config.to_str().unwrap();
    let (code, _, stderr) = tether(&["--log-format", "json", "config", "check", path]);
    assert_eq!(code, Some(0), "{stderr}");
    let warning = stderr
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect(line))
        .find(|line| line["level"] == "WARN")
        .unwrap_or_else(|| panic!("no warning in {stderr}"));
    let message = warning["message"].as_str().unwrap();
    assert!(message.contains("frobnicate"), "{warning}");
    assert!(warning["timestamp"].is_string() && warning["target"].is_string());

    let (code, _, stderr) = tether(&["config", "check", path, "-q"]);
    assert_eq!(code, Some(0));
    assert!(
        !stderr.contains("frobnicate"),
        "-q keeps warnings out: {stderr}"
    );

    let (code, script, _) = tether(&["completions", "bash"]);
    assert_eq!(code, Some(0));
    assert!(
        script.contains("_tether") && script.contains("config"),
        "{script}"
    );
    let (code, page, _) = tether(&["manpage"]);
    assert_eq!(code, Some(0));
    assert!(
        page.starts_with(".ie") || page.contains(".TH tether"),
        "{page}"
    );
}

/// An orchestrator's probes answer without a token on their own listener: live, ready (the
/// config loaded, the policy answering) and, when asked, the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_without_a_token_on_their_own_listener() {
    let (dir, _state, config) = one_upstream();
    let extra = [
        "--http",
        "127.0.0.1:0",
        "--probes",
        "127.0.0.1:0",
        "--probe-metrics",
    ];
    let mut gateway = start_http(serve_command(dir.path(), &config, &extra)).await;
    let probes = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let seen = gateway.stderr.lock().unwrap().clone();
            let addr = seen
                .lines()
                .filter(|line| line.contains("probes listening"))
                .find_map(|line| line.split("addr=").nth(1))
                .map(|rest| rest.split_whitespace().next().unwrap().to_string());
            if let Some(addr) = addr {
                break addr;
            }
            assert!(Instant::now() < deadline, "no probe address in {seen}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let get = |path: &str| {
        let url = format!("http://{probes}{path}");
        async move {
            let response = reqwest::get(&url).await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    assert_eq!(get("/livez").await, (200, "ok\n".to_string()));
    assert_eq!(get("/readyz").await, (200, "ready\n".to_string()));
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("tether_server_state{"), "{metrics}");
    // What build serves, and the process's own series.
    let build = metrics
        .lines()
        .find(|line| line.starts_with("tether_build_info{"))
        .unwrap_or_else(|| panic!("no build info in {metrics}"));
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && build.contains("wasmtime=\"48.")
            && build.ends_with(" 1"),
        "{build}"
    );
    for series in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        let value: f64 = metrics
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series} in {metrics}"))
            .parse()
            .unwrap();
        assert!(value >= 0.0, "{series} {value}");
        if series != "process_cpu_seconds_total" {
            assert!(value > 0.0, "{series} {value}");
        }
    }
    // Only probes there: the admin API's operations are not.
    assert_eq!(get("/status").await.0, 404);
    gateway.tether.kill().await.unwrap();
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

    // `tether reload` says what the file has that Tether ignores.
    let mut odd = both.clone();
    odd["colour"] = json!("blue");
    std::fs::write(&config, odd.to_string()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(["reload", "--state-file"])
        .arg(dir.path().join("state.json"))
        .env_remove("TETHER_ADMIN_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("warning: ") && l.contains("colour")),
        "{stdout}"
    );
    assert!(terminate(tether).await.success());
}

/// A Streamable HTTP client transport for `url` sending `token` as a bearer token and, if
/// given, an `Origin` header (as a browser would).
fn http_transport(
    url: &str,
    token: Option<&str>,
    origin: Option<&str>,
) -> StreamableHttpClientTransport<reqwest::Client> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    if let Some(origin) = origin {
        config = config.custom_headers(
            [(
                reqwest::header::ORIGIN,
                reqwest::header::HeaderValue::from_str(origin).unwrap(),
            )]
            .into(),
        );
    }
    StreamableHttpClientTransport::from_config(config)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

/// POSTs one JSON-RPC message to the MCP endpoint the way an MCP client (or a browser page)
/// would, with extra `headers`.
async fn post_mcp(url: &str, headers: &[(&str, &str)], body: &str) -> reqwest::Response {
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("the gateway answers HTTP")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origins_get_403_before_any_session_and_loopback_or_allowed_ones_pass() {
    let (dir, state, config) = one_upstream();
    let gateway = start_http(serve_command(
        dir.path(),
        &config,
        &[
            "--http",
            "127.0.0.1:0",
            "--allow-origin",
            "https://app.example.com",
        ],
    ))
    .await;
    let url = gateway.url.as_str();
    // A real MCP client from a page on this machine.
    let client = Agent::default()
        .serve(http_transport(url, None, Some("http://localhost:5173")))
        .await
        .expect("MCP over HTTP with a loopback Origin");
    assert_serves_the_upstream(&client).await;

    for origin in [
        "https://evil.example",
        "http://localhost.evil.example",
        "http://127.0.0.1.nip.io:8080",
        "null",
        "https://app.example.com:8443",
        "http://app.example.com",
    ] {
        let response = post_mcp(url, &[("origin", origin)], INITIALIZE).await;
        assert_eq!(response.status(), 403, "Origin {origin}");
    }
    for origin in [
        None,
        Some("http://localhost"),
        Some("http://127.0.0.1:8080"),
        Some("https://[::1]:3000"),
        Some("https://app.example.com"),
        Some("https://app.example.com:443"),
    ] {
        let headers: Vec<(&str, &str)> = origin.iter().map(|o| ("origin", *o)).collect();
        let response = post_mcp(url, &headers, INITIALIZE).await;
        assert_eq!(response.status(), 200, "Origin {origin:?}");
    }

    // With a live session's id, a foreign page's call still never reaches the session.
    let response = post_mcp(url, &[], INITIALIZE).await;
    assert_eq!(response.status(), 200);
    let session = response
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_string();
    drop(response);
    let headers = [("mcp-session-id", session.as_str())];
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(
        post_mcp(url, &headers, initialized)
            .await
            .status()
            .is_success()
    );
    let echo = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"up__echo","arguments":{"text":"from a page"}}}"#;
    let foreign = [
        ("mcp-session-id", session.as_str()),
        ("origin", "https://evil.example"),
    ];
    let response = post_mcp(url, &foreign, echo).await;
    assert_eq!(response.status(), 403);
    assert_eq!(state.calls_of("echo"), 1, "the foreign call never ran");
    let local = [
        ("mcp-session-id", session.as_str()),
        ("origin", "http://localhost:5173"),
    ];
    let response = post_mcp(url, &local, echo).await;
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(PATIENCE, response.text())
        .await
        .expect("the call is answered")
        .unwrap();
    assert!(body.contains("from a page"), "{body}");
    assert_eq!(state.calls_of("echo"), 2);

    // A client closing its session gets 200, which the official SDKs take as success.
    let closed = reqwest::Client::new()
        .delete(url)
        .header("mcp-session-id", session.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    assert_eq!(
        post_mcp(url, &headers, echo).await.status(),
        404,
        "the session is gone"
    );

    let stderr = gateway.stderr.lock().unwrap().clone();
    assert!(
        !stderr.contains("WARNING"),
        "loopback is not exposed: {stderr}"
    );
    drop(client);
    assert!(terminate(gateway.tether).await.success());
}

/// Writes `token` to a 0600 file in `dir`.
fn token_file(dir: &Path, token: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("mcp-token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Without the token (or with a wrong one, or another scheme) the endpoint answers 401.
async fn assert_token_required(url: &str, token: &str) {
    let wrong = format!("Bearer {token}x");
    let basic = format!("Basic {token}");
    for authorization in [None, Some(wrong.as_str()), Some(basic.as_str())] {
        let headers: Vec<(&str, &str)> = authorization
            .iter()
            .map(|a| ("authorization", *a))
            .collect();
        let response = post_mcp(url, &headers, INITIALIZE).await;
        assert_eq!(response.status(), 401, "{authorization:?}");
        let challenge = response.headers()["www-authenticate"].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
    }
    let right = format!("Bearer {token}");
    let response = post_mcp(url, &[("authorization", right.as_str())], INITIALIZE).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_guards_the_endpoint_and_a_network_bind_is_warned_about() {
    let (dir, _state, config) = one_upstream();
    let token = "mcp-test-token-8c1e2a";
    let file = token_file(dir.path(), token);
    let gateway = start_http(serve_command(
        dir.path(),
        &config,
        &[
            "--http",
            "0.0.0.0:0",
            "--mcp-token-file",
            file.to_str().unwrap(),
        ],
    ))
    .await;
    let url = gateway.url.as_str();
    {
        let stderr = gateway.stderr.lock().unwrap();
        let warning = stderr
            .lines()
            .find(|l| l.starts_with("tether: WARNING:"))
            .unwrap_or_else(|| panic!("no warning line on stderr:\n{stderr}"));
        assert!(
            warning.contains("0.0.0.0") && warning.contains("served to the network"),
            "{warning}"
        );
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("WARN") && l.contains("serving MCP to the network")),
            "the log warns too:\n{stderr}"
        );
    }
    assert_token_required(url, token).await;
    // An MCP client without the token cannot even start.
    assert!(
        Agent::default()
            .serve(http_transport(url, None, None))
            .await
            .is_err()
    );
    let client = Agent::default()
        .serve(http_transport(url, Some(token), None))
        .await
        .expect("MCP over HTTP with the token");
    assert_serves_the_upstream(&client).await;
    drop(client);
    assert!(terminate(gateway.tether).await.success());
    let stderr = gateway.stderr.lock().unwrap().clone();
    assert!(!stderr.contains(token), "the token is never logged");
}

/// Runs `tether serve` to its end; answers its exit code and stderr.
async fn serve_to_end(mut command: Command) -> (Option<i32>, String) {
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("tether serve ends")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Whoever started Tether on stdio learns from its exit code whether the session failed: a
/// client that leaves before a session began has ended it (0); one that opens with an answer to
/// a request never made has failed it (1), and stderr says how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stdio_session_exits_with_an_error_and_a_client_that_left_does_not() {
    let (dir, _state, config) = one_upstream();
    let mut left = serve_command(dir.path(), &config, &[]);
    left.stdin(Stdio::null());
    let (code, stderr) = serve_to_end(left).await;
    assert_eq!(code, Some(0), "{stderr}");

    let mut tether = serve_command(dir.path(), &config, &[]).spawn().unwrap();
    let mut stdin = tether.stdin.take().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(PATIENCE, tether.wait_with_output())
        .await
        .expect("tether serve ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: MCP over stdio: expect initialized request"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_may_come_from_the_environment_and_bad_tokens_or_origins_are_refused() {
    let (dir, _state, config) = one_upstream();
    let token = "env-token-5a9d";
    let mut command = serve_command(dir.path(), &config, &["--http", "127.0.0.1:0"]);
    command.env("TETHER_MCP_TOKEN", token);
    let gateway = start_http(command).await;
    assert_token_required(&gateway.url, token).await;
    let client = Agent::default()
        .serve(http_transport(&gateway.url, Some(token), None))
        .await
        .expect("MCP over HTTP with the token");
    assert!(client.peer().list_all_tools().await.is_ok());
    drop(client);
    assert!(terminate(gateway.tether).await.success());
    assert!(!gateway.stderr.lock().unwrap().contains(token));

    // A token that is there but unusable is an error, not an open endpoint.
    let empty = token_file(dir.path(), "  ");
    let (code, stderr) = serve_to_end(serve_command(
        dir.path(),
        &config,
        &[
            "--http",
            "127.0.0.1:0",
            "--mcp-token-file",
            empty.to_str().unwrap(),
        ],
    ))
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("MCP token") && stderr.contains(empty.to_str().unwrap()),
        "{stderr}"
    );
    let mut command = serve_command(dir.path(), &config, &["--http", "127.0.0.1:0"]);
    command.env("TETHER_MCP_TOKEN", "");
    let (code, stderr) = serve_to_end(command).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("TETHER_MCP_TOKEN"), "{stderr}");
    // Origins must be origins; HTTP-only flags need --http.
    let (code, stderr) = serve_to_end(serve_command(
        dir.path(),
        &config,
        &[
            "--http",
            "127.0.0.1:0",
            "--allow-origin",
            "https://x.example/path",
        ],
    ))
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--allow-origin"), "{stderr}");
    let (code, stderr) = serve_to_end(serve_command(
        dir.path(),
        &config,
        &["--allow-origin", "https://x.example"],
    ))
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--http"), "{stderr}");
}

/// Runs the real `tether status` (with `extra` arguments) against a state file.
async fn status(state_file: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .arg("status")
        .args(extra)
        .arg("--state-file")
        .arg(state_file)
        .env_remove("TETHER_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_state_file_is_refused_and_a_crashed_ones_is_not() {
    let (dir, state, config) = one_upstream();
    let state_file = dir.path().join("state.json");
    let (mut first, url) = serve_http(dir.path(), &config).await;
    let first_pid = first.id().unwrap();
    wait_until("the first gateway started its server", || {
        state.pid().is_some()
    })
    .await;
    let written = std::fs::read(&state_file).expect("the first gateway wrote its state file");

    let (code, stderr) = serve_to_end(serve_command(
        dir.path(),
        &config,
        &["--http", "127.0.0.1:0"],
    ))
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("already running")
            && stderr.contains(state_file.to_str().unwrap())
            && stderr.contains(&format!("pid {first_pid}")),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&state_file).unwrap(),
        written,
        "the first gateway's state file is untouched"
    );
    assert_eq!(state.starts(), 1, "the refused gateway started no servers");
    let (code, stdout, stderr) = status(&state_file, &[]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l.starts_with("up ")), "{stdout}");
    let client = Agent::default()
        .serve(http_transport(&url, None, None))
        .await
        .expect("the first gateway still serves MCP");
    wait_for_tools(&client, "the first gateway's tools", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    drop(client);

    // A crashed gateway leaves its files behind, but not its lock.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    assert!(state_file.exists());
    let (third, _) = serve_http(dir.path(), &config).await;
    let (code, stdout, stderr) = status(&state_file, &[]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let owner: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    assert_eq!(owner["pid"], third.id().unwrap());
    assert!(terminate(third).await.success());
    assert!(
        !state_file.exists(),
        "a clean shutdown removes the state file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_hung_call_drains_once_within_the_drain_timeout() {
    const DRAIN: Duration = Duration::from_secs(2);
    let (dir, state, config) = one_upstream();
    let gateway = start_http(serve_command(
        dir.path(),
        &config,
        &["--http", "127.0.0.1:0", "--drain-timeout", "2s"],
    ))
    .await;
    let mut tether = gateway.tether;
    let client = Agent::default()
        .serve(http_transport(&gateway.url, None, None))
        .await
        .unwrap();
    wait_for_tools(&client, "tools listed", |t| {
        t.contains(&"up__hang".to_string())
    })
    .await;
    let child = state.pid().unwrap();
    let hung = tokio::spawn(async move {
        let result = client
            .peer()
            .call_tool(CallToolRequestParams::new("up__hang"))
            .await;
        (client, result)
    });
    wait_until("the hung call reached the upstream", || {
        state.calls_of("hang") == 1
    })
    .await;

    let signalled = Instant::now();
    kill(tether.id().unwrap(), 15);
    let status = tokio::time::timeout(DRAIN + Duration::from_secs(10), tether.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "tether still running {:?} after SIGTERM:\n{}",
                DRAIN + Duration::from_secs(10),
                gateway.stderr.lock().unwrap()
            )
        })
        .unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took >= DRAIN, "the drain waited for the call: {took:?}");
    let (_client, result) = tokio::time::timeout(PATIENCE, hung).await.unwrap().unwrap();
    let result = result.expect("the hung call is answered, not cut off");
    assert!(
        is_error(&result) && text(&result).contains("\"up\""),
        "the answer says what happened: {result:?}"
    );
    assert!(!process_exists(child), "the upstream is reaped");
    let stderr = gateway.stderr.lock().unwrap().clone();
    assert_eq!(
        stderr.matches("draining in-flight calls").count(),
        1,
        "one drain:\n{stderr}"
    );
    assert_eq!(
        stderr.matches("calls still in flight after").count(),
        1,
        "one drain:\n{stderr}"
    );
}

/// A client of protocol 2026-07-28 (no `initialize`: `server/discover`, per-request metadata)
/// calls tools through the gateway — results carry `resultType` — and hears of tool list
/// changes on its `subscriptions/listen` stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_client_calls_tools_and_hears_list_changes_on_its_subscription() {
    use rmcp::model::{ProtocolVersion, ResultType, ServerNotification, SubscriptionFilter};
    use rmcp::{ClientLifecycleMode, ClientServiceExt};

    let (dir, _state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let client = ()
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(url),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("a 2026-07-28 session");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let tools = client.peer().list_all_tools().await.unwrap_or_default();
        if tools.iter().any(|t| t.name == "up__echo") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tools: {tools:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut subscription = client
        .peer()
        .listen(SubscriptionFilter::builder().tools_list_changed().build())
        .await
        .expect("subscriptions/listen is served");
    assert_eq!(subscription.acknowledged().tools_list_changed, Some(true));

    let params = CallToolRequestParams::new("up__echo")
        .with_arguments(args(json!({"text": "new generation"})).unwrap());
    let result = client.peer().call_tool(params).await.expect("the call");
    assert_eq!(text(&result), "new generation");
    assert_eq!(result.result_type, Some(ResultType::COMPLETE));

    // The upstream dies: the withdrawal reaches the subscription.
    let _ = client
        .peer()
        .call_tool(
            CallToolRequestParams::new("up__exit_now")
                .with_arguments(args(json!({"code": 9})).unwrap()),
        )
        .await;
    let notification = tokio::time::timeout(PATIENCE, subscription.next())
        .await
        .expect("a notification in time")
        .expect("the subscription stays open")
        .expect("a notification");
    assert!(
        matches!(
            notification,
            ServerNotification::ToolListChangedNotification(_)
        ),
        "{notification:?}"
    );
    assert!(terminate(tether).await.success());
}

/// `tether` with its default state directory under `state_home` (`XDG_STATE_HOME`).
fn tether_in(state_home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tether-cli"));
    command
        .args(args)
        .env("XDG_STATE_HOME", state_home)
        .env("RUST_LOG", "tether=debug")
        .env_remove("TETHER_MCP_TOKEN")
        .env_remove("TETHER_ADMIN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Starts `tether ARGS` on stdio as an agent would, and waits until it serves `up__echo`.
async fn stdio_agent(home: &Path, args: &[&str]) -> (Child, RunningService<RoleClient, Agent>) {
    let mut tether = tether_in(home, args)
        .stderr(Stdio::null())
        .spawn()
        .expect("tether serve starts");
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let client = Agent::default().serve(io).await.expect("MCP over stdio");
    wait_for_tools(&client, "the gateway serves its tools", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    (tether, client)
}

/// The quickstarts' stdio entries (docs/QUICKSTART.md: Claude Desktop and Cursor's
/// `mcpServers`, VS Code's `servers`, `claude mcp add … -- COMMAND`) start Tether as those clients
/// would: the entry's command and arguments, with this build's binary and a test config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstarts_stdio_entries_start_tether_as_their_clients_would() {
    let (dir, _state, config) = one_upstream();
    let home = dir.path().join("state-home");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/QUICKSTART.md"),
    )
    .unwrap();
    let mut entries: Vec<Vec<String>> = Vec::new();
    for block in text.split("```json").skip(1) {
        let block = block.split("```").next().unwrap();
        let parsed: serde_json::Value = serde_json::from_str(block).expect(block);
        let entry = parsed
            .get("mcpServers")
            .or_else(|| parsed.get("servers"))
            .map(|servers| servers["tether"].clone())
            .unwrap();
        let Some(command) = entry["command"].as_str() else {
            continue; // an HTTP entry: a URL only
        };
        assert!(command.ends_with("/tether"), "{block}");
        let args = entry["args"].as_array().unwrap();
        entries.push(
            args.iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect(),
        );
    }
    let claude = text
        .lines()
        .find(|line| line.starts_with("claude mcp add tether -- "))
        .expect("the Claude Code stdio line");
    let words: Vec<String> = claude.split_whitespace().map(String::from).collect();
    assert!(words[5].ends_with("/tether"), "{claude}");
    entries.push(words[6..].to_vec());
    assert_eq!(
        entries.len(),
        3,
        "Claude Desktop/Cursor, VS Code, Claude Code"
    );
    for args in entries {
        // The user's config path becomes the test's.
        let at = args.iter().position(|a| a == "--config").unwrap();
        let mut args = args.clone();
        args[at + 1] = config.to_str().unwrap().to_string();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (mut tether, client) = stdio_agent(&home, &args).await;
        drop(client);
        let _ = tether.kill().await;
    }
}

/// `examples/servers.toml` is a config `serve` would take (checked without starting its npx and
/// uvx servers); an entry that runs Tether itself is left out with a warning, not started.
#[test]
fn the_example_config_is_usable_and_an_entry_that_runs_tether_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let check = |config: &Path| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(["config", "check", "--json"])
            .arg(config)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .output()
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&output.stderr)));
        (output.status.code(), answer)
    };
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers.toml");
    let (code, answer) = check(&example);
    assert_eq!(code, Some(0), "{answer}");
    let names: Vec<&str> = answer["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["everything", "files", "memory", "fetch", "time"]);

    // A client's config that lists Tether itself, given to Tether.
    let client_config = dir.path().join("claude_desktop_config.json");
    let config = json!({"mcpServers": {
        "tether": {"command": env!("CARGO_BIN_EXE_tether-cli"), "args": ["serve", "--config", "x.json"]},
        "files": {"command": FIXTURE, "args": ["--transport", "stdio"]},
    }});
    std::fs::write(&client_config, config.to_string()).unwrap();
    let (code, answer) = check(&client_config);
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer["servers"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(answer["servers"][0]["name"], "files");
    let warnings = answer["warnings"].to_string();
    assert!(
        warnings.contains("`tether` runs Tether itself"),
        "{warnings}"
    );
}

/// Two agents each start their own gateway on stdio with the default flags (Claude Desktop and
/// Claude Code, say): both run, each with its own state file; `tether gateways` lists them, the
/// admin commands ask which one when there are several and take `--pid`; an HTTP gateway keeps
/// its single owner, and the refusal is printed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_agents_start_their_own_gateways_on_stdio_side_by_side() {
    let (dir, _state, config) = one_upstream();
    let home = dir.path().join("state-home");
    let config = config.to_str().unwrap();
    let mut agents = Vec::new();
    for _ in 0..2 {
        agents.push(stdio_agent(&home, &["serve", "--config", config]).await);
    }
    let pids: Vec<u32> = agents.iter().map(|(t, _)| t.id().unwrap()).collect();
    // What a SIGKILLed gateway leaves, its pid since taken by a live process (this one).
    let stale = home
        .join("tether")
        .join("stdio")
        .join(format!("{}.json", std::process::id()));
    std::fs::write(
        &stale,
        json!({"addr": "127.0.0.1:9", "token": "t", "pid": std::process::id(), "serves": "stdio"})
            .to_string(),
    )
    .unwrap();
    std::fs::write(stale.with_extension("json.lock"), "1\n").unwrap();

    let listed = tether_in(&home, &["gateways", "--json"])
        .output()
        .await
        .unwrap();
    assert!(listed.status.success());
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let mut seen: Vec<u32> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            assert_eq!(g["serves"], "stdio", "{g}");
            g["pid"].as_u64().unwrap() as u32
        })
        .collect();
    seen.sort();
    let mut expected = pids.clone();
    expected.sort();
    assert_eq!(seen, expected, "{listed}");
    assert!(!stale.exists(), "the leftover state file is removed");

    // Two are running: the admin commands do not guess.
    let ambiguous = tether_in(&home, &["status"]).output().await.unwrap();
    assert_eq!(ambiguous.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&ambiguous.stderr);
    assert!(
        stderr.contains("2 gateways are running") && stderr.contains("--pid"),
        "{stderr}"
    );
    for pid in &pids {
        let picked = tether_in(&home, &["status", "--pid", &pid.to_string()])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&picked.stdout);
        assert!(picked.status.success(), "{stdout}");
        assert!(stdout.lines().any(|l| l.starts_with("up ")), "{stdout}");
    }
    // The address and token given: no state file is consulted, however many run. A token in
    // the environment for some other gateway does not override a state file's.
    let first = &listed[0];
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(first["state_file"].as_str().unwrap()).unwrap())
            .unwrap();
    let admin = first["admin"].as_str().unwrap();
    let token = written["token"].as_str().unwrap();
    let pid = first["pid"].to_string();
    for args in [
        &["status", "--admin", admin, "--token", token][..],
        &["status", "--admin", admin],
    ] {
        let output = tether_in(&home, args).output().await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {stdout}");
    }
    let output = tether_in(&home, &["status", "--pid", &pid])
        .env("TETHER_ADMIN_TOKEN", "for-another-gateway")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // One HTTP gateway owns the default state file; a second is refused, saying so once.
    let http = start_http({
        let mut command = tether_in(
            &home,
            &["serve", "--config", config, "--http", "127.0.0.1:0"],
        );
        command.stdin(Stdio::null());
        command
    })
    .await;
    let (code, stderr) = serve_to_end({
        let mut command = tether_in(
            &home,
            &["serve", "--config", config, "--http", "127.0.0.1:0"],
        );
        command.stdin(Stdio::null());
        command
    })
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("already running").count(),
        1,
        "the error is printed once:\n{stderr}"
    );
    assert!(terminate(http.tether).await.success());

    for (tether, client) in agents {
        drop(client);
        let _ = terminate(tether).await;
    }
    // Each removed its own state file on the way out.
    let left = std::fs::read_dir(home.join("tether").join("stdio"))
        .map(|entries| entries.flatten().count())
        .unwrap_or(0);
    assert_eq!(left, 0, "no stdio state file is left behind");
}

/// An agent that starts Tether with a socket pair for its stdio (libuv does, so Node agents) is
/// served as one with pipes is; and closing its end ends the gateway.
#[tokio::test]
async fn an_agent_on_a_socket_pair_is_served_like_one_on_pipes() {
    let (dir, _state, config) = one_upstream();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let theirs: std::os::fd::OwnedFd = theirs.into();
    let mut command = serve_command(dir.path(), &config, &[]);
    command
        .stdin(Stdio::from(theirs.try_clone().unwrap()))
        .stdout(Stdio::from(theirs))
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("stderr")).unwrap(),
        ));
    let mut tether = command.spawn().expect("tether serve starts");
    ours.set_nonblocking(true).unwrap();
    let (read, write) = tokio::net::UnixStream::from_std(ours).unwrap().into_split();
    let client = Agent::default()
        .serve((read, write))
        .await
        .expect("the gateway answers the handshake on a socket");
    assert_serves_the_upstream(&client).await;
    agent_leaves_and_gateway_exits(client, &mut tether).await;
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(!stderr.contains("stdio not polled"), "{stderr}");
}

/// An agent that closes `tether serve`'s stdin while its tool calls run (a script piping its
/// requests in) gets the answers that come within the time rmcp's loop gives its own handlers
/// (5 s), as from an rmcp server; a call still running then is cancelled, unanswered, and the
/// gateway exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_running_when_an_agent_closes_stdin_are_answered_before_the_gateway_exits() {
    let (dir, state, config) = one_upstream();
    let mut tether = serve(dir.path(), &config, &[], Some(&dir.path().join("stderr")));
    let mut stdin = tether.stdin.take().unwrap();
    let mut stdout = BufReader::new(tether.stdout.take().unwrap()).lines();
    let mut send = async |message: serde_json::Value| {
        let line = message.to_string() + "\n";
        stdin.write_all(line.as_bytes()).await.unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "script", "version": "1"}}}),
    )
    .await;
    let answered = tokio::time::timeout(PATIENCE, stdout.next_line()).await;
    assert!(answered.unwrap().unwrap().unwrap().contains("\"id\":1"));
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    // Once tools are listed the session is up: its calls are served past rmcp's loop.
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let listed = loop {
        let line = tokio::time::timeout(PATIENCE, stdout.next_line()).await;
        let line = line.expect("tools listed").unwrap().expect("an answer");
        if line.contains("\"id\":2") {
            break line;
        }
    };
    assert!(listed.contains("up__slow"), "{listed}");
    let call = |id: u32, tool: &str, arguments: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}})
    };
    // The slow call reports progress every 100 ms, before and after the input ends (rmcp's
    // loop, which passes progress on, stops then): its answer must not wait for that.
    let mut slow = call(3, "up__slow", json!({"ms": 700}));
    slow["params"]["_meta"] = json!({"progressToken": "slow"});
    send(slow).await;
    send(call(4, "up__hang", json!({}))).await;
    wait_until("both calls reached the upstream", || {
        state.calls_of("slow") == 1 && state.calls_of("hang") == 1
    })
    .await;
    let input_ended = Instant::now();
    drop(stdin);
    let mut rest = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, stdout.next_line())
        .await
        .expect("the gateway ends its output")
        .unwrap()
    {
        rest.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    let status = tokio::time::timeout(PATIENCE, tether.wait())
        .await
        .expect("the gateway exits")
        .unwrap();
    // The call that never ends is given rmcp's 5 s, and no more than that (with room for a
    // loaded machine to end the server).
    let exited_after = input_ended.elapsed();
    assert!(
        (Duration::from_millis(4_900)..Duration::from_secs(12)).contains(&exited_after),
        "{exited_after:?}"
    );
    let answers: Vec<_> = rest.iter().filter(|m| m.get("id").is_some()).collect();
    assert_eq!(answers.len(), 1, "{rest:?}");
    assert_eq!(answers[0]["id"], 3);
    assert_eq!(answers[0]["result"]["content"][0]["text"], "slept 700 ms");
    assert!(status.success(), "{status:?}");
}
