//! Shared helpers: machine info, sibling binaries, scratch dirs, processes, tables.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{NotificationContext, Peer, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Policy settings in milliseconds so that recoveries play out quickly (no jitter: replayable).
pub const FAST_POLICY: &str = r#"{"backoff": {"base_ms": 50, "cap_ms": 200, "jitter": "none"}}"#;

pub fn print_machine_info() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
        })
        .unwrap_or_default();
    println!("machine: nproc={nproc}, cpu={cpu}, mem={mem} kB, {rustc}");
}

/// A binary built next to this one (mcp-fixture, tether-cli).
pub fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe.parent().expect("exe dir").join(name);
    assert!(
        path.exists(),
        "{} not built; build it with tether-bench",
        path.display()
    );
    path
}

pub fn fixture() -> String {
    sibling("mcp-fixture").display().to_string()
}

/// Where this run's scratch directories live.
fn scratch_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("tether-bench-{}", std::process::id()))
}

/// Removes this run's scratch directories (fixture state and logs).
pub fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch_base());
}

/// A fresh scratch directory, on tmpfs when there is one: the fixture fsyncs `calls.log` on
/// every call, which on a disk would dominate (and serialize) every measured call.
pub fn scratch(name: &str) -> PathBuf {
    let dir = scratch_base().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Writes an `mcpServers` config with one stdio fixture server `up`.
/// The fixture serving `transport` ("http" or "sse") on a free port with `extra` flags, and its
/// base URL.
pub async fn fixture_listening(transport: &str, state: &Path, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(fixture())
        .args(["--transport", transport, "--state-dir"])
        .arg(state)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fixture starts");
    let addr = word_after(child.stdout.take().unwrap(), "listening on ").await;
    (child, format!("http://{addr}"))
}

/// A loopback port free now, for a program that does not say which one `:0` gave it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// `mcp-fixture` on stdio with its stdin/stdout piped for a client.
pub fn spawn_stdio_fixture(state: &Path) -> Child {
    Command::new(fixture())
        .args(["--transport", "stdio", "--state-dir"])
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fixture starts")
}

/// An MCP client session over a child's piped stdin/stdout.
pub async fn serve_over_stdio<H: ClientHandler>(
    child: &mut Child,
    handler: H,
) -> RunningService<RoleClient, H> {
    let io = (
        child.stdout.take().expect("stdout piped"),
        child.stdin.take().expect("stdin piped"),
    );
    handler.serve(io).await.expect("MCP over stdio")
}

pub fn stdio_config(dir: &Path, state: &Path) -> PathBuf {
    let path = dir.join("servers.json");
    let config = serde_json::json!({"mcpServers": {"up": {
        "command": fixture(),
        "args": ["--transport", "stdio", "--state-dir", state.display().to_string()],
    }}});
    std::fs::write(&path, config.to_string()).expect("config");
    path
}

/// `tether serve` with stdin/stdout piped and stderr (the log) to `dir/serve.log`, or piped.
pub fn tether_serve(
    dir: &Path,
    config: &Path,
    extra: &[&str],
    log: &str,
    stderr_piped: bool,
) -> Child {
    tether_serve_with(
        &sibling("tether-cli"),
        dir,
        config,
        extra,
        log,
        stderr_piped,
    )
}

/// [`tether_serve`] with another build of `tether-cli` (a baseline to compare against).
pub fn tether_serve_with(
    binary: &Path,
    dir: &Path,
    config: &Path,
    extra: &[&str],
    log: &str,
    stderr_piped: bool,
) -> Child {
    Command::new(binary)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .args(["--policy-settings", FAST_POLICY])
        .args(extra)
        .env("RUST_LOG", log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(if stderr_piped {
            Stdio::piped()
        } else {
            Stdio::from(std::fs::File::create(dir.join("serve.log")).expect("log file"))
        })
        .kill_on_drop(true)
        .spawn()
        .expect("tether serve starts")
}

/// Reads stderr (or stdout) until a line containing `marker`, and returns the word after it.
pub async fn word_after<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    reader: R,
    marker: &str,
) -> String {
    word_after_within(reader, marker, Duration::from_secs(30)).await
}

/// [`word_after`], waiting up to `within` (a program under valgrind starts slowly).
pub async fn word_after_within<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    reader: R,
    marker: &str,
    within: Duration,
) -> String {
    let mut lines = BufReader::new(reader).lines();
    let found = tokio::time::timeout(within, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split(marker).nth(1) {
                return Some(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("no line with {marker:?}"));
    // Keep draining so the writer never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found
}

/// An rmcp client that stamps every `notifications/tools/list_changed`.
#[derive(Clone, Default)]
pub struct Agent {
    pub list_changes: std::sync::Arc<std::sync::Mutex<Vec<std::time::SystemTime>>>,
    /// Whether it declares sampling, elicitation and roots, as agents that take servers'
    /// requests do (it answers none: the benchmarks' servers ask nothing).
    pub askable: bool,
}

impl ClientHandler for Agent {
    #[allow(deprecated)] // sampling and roots: deprecated by SEP-2577, still declared by agents
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        if self.askable {
            info.capabilities = rmcp::model::ClientCapabilities::builder()
                .enable_sampling()
                .enable_elicitation()
                .enable_roots()
                .build();
        }
        info
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changes
            .lock()
            .unwrap()
            .push(std::time::SystemTime::now());
    }
}

pub fn echo_params(tool: &str) -> CallToolRequestParams {
    let args = serde_json::json!({"text": "hi"});
    CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().unwrap().clone())
}

/// Calls `tool` (echo); true when it answered without error.
pub async fn echo_ok(peer: &Peer<RoleClient>, tool: &str) -> bool {
    matches!(peer.call_tool(echo_params(tool)).await, Ok(r) if r.is_error != Some(true))
}

/// Waits (polling `tools/list` every `poll`) until the gateway lists `tool`; panics after `within`.
pub async fn wait_for_tool(peer: &Peer<RoleClient>, tool: &str, within: Duration, poll: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !tool_names(peer).await.iter().any(|t| t == tool) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway never listed {tool}"
        );
        tokio::time::sleep(poll).await;
    }
}

pub async fn tool_names(peer: &Peer<RoleClient>) -> Vec<String> {
    peer.list_all_tools()
        .await
        .map(|tools| tools.into_iter().map(|t| t.name.into_owned()).collect())
        .unwrap_or_default()
}

pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a pid we started; no memory is involved.
    unsafe { libc::kill(pid as i32, signal) };
}

/// Prints a table: a header row and rows of cells, columns padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(header.iter().map(|s| s.to_string()).collect());
    println!(
        "|{}|",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in rows {
        line(row.clone());
    }
    println!();
}

pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "-".into()
    } else {
        format!("{:.2}×", a / b)
    }
}
