//! What the supervision tests share: a host on a fast policy, fixture servers, condition waits.
#![allow(dead_code)] // Each test binary uses a different part of this.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tether::config::{ServerSpec, Timeouts, TransportSpec};
use tether::policy::{PolicyEngine, PolicyRuntime, RuntimeOptions};
use tether::supervisor::Supervisor;

#[allow(unused_imports)] // Each test binary uses a different part of this too.
pub use tether_tests::{process_alive, text};

pub const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture");

/// Policy settings in milliseconds so lifecycles play out in a test's time.
pub const FAST_POLICY: &str = r#"{
    "backoff": {"base_ms": 20, "cap_ms": 100, "jitter": "none"},
    "park": {"probe_initial_ms": 300, "probe_max_ms": 600},
    "breaker": {"failure_threshold": 3, "open_ms": 300, "open_max_ms": 600}
}"#;

/// Fast backoff, but self-probes ten minutes away: a parked server stays parked in a test
/// unless something revives it.
pub const PARKED_STAYS_PARKED: &str = r#"{
    "backoff": {"base_ms": 20, "cap_ms": 100, "jitter": "none"},
    "park": {"probe_initial_ms": 600000, "probe_max_ms": 600000}
}"#;

/// How long any condition may take on a loaded 2-core machine before a test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// One policy engine for the whole test binary: components compile once.
pub fn shared_engine() -> Arc<PolicyEngine> {
    static ENGINE: OnceLock<Arc<PolicyEngine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| PolicyEngine::new(None).expect("engine"))
        .clone()
}

/// RUST_LOG=tether=debug shows the host's log in a failing test's output.
pub fn test_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A supervisor on the embedded policy with `settings`, logging into a temp dir.
pub struct Host {
    pub supervisor: Supervisor,
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn start(settings: &str) -> Host {
        Host::start_with(RuntimeOptions {
            settings: settings.to_string(),
            ..RuntimeOptions::default()
        })
    }

    /// A host on `settings` whose policy records every decision in `recording`.
    pub fn recording(settings: &str, recording: &Path) -> Host {
        Host::start_with(RuntimeOptions {
            settings: settings.to_string(),
            record: Some(recording.to_path_buf()),
            ..RuntimeOptions::default()
        })
    }

    /// A supervisor on a policy runtime started with `options` (on the shared engine).
    pub fn start_with(options: RuntimeOptions) -> Host {
        test_logging();
        let policy = PolicyRuntime::start(RuntimeOptions {
            engine: Some(shared_engine()),
            ..options
        })
        .expect("policy starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let supervisor = Supervisor::start(policy, dir.path().join("logs"));
        Host { supervisor, dir }
    }

    pub fn fast() -> Host {
        Host::start(FAST_POLICY)
    }

    pub fn state_dir(&self, server: &str) -> StateDir {
        let path = self.dir.path().join("state").join(server);
        std::fs::create_dir_all(&path).unwrap();
        StateDir(path)
    }

    /// Visible advertised tool names of `server`.
    pub fn tools(&self, server: &str) -> Vec<String> {
        self.supervisor.registry().server_tools(server)
    }

    pub fn view(&self, server: &str) -> tether::supervisor::ServerView {
        self.supervisor
            .views()
            .into_iter()
            .find(|v| v.name == server)
            .expect("server supervised")
    }
}

/// Fast timeouts for tests.
pub fn test_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(10),
        call: Duration::from_secs(10),
        call_max: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(3600),
        keepalive_deadline: Duration::from_secs(5),
        reconnect_wait: Duration::from_secs(10),
        stop_grace: Duration::from_millis(500),
        max_tool_pages: 10,
    }
}

/// A stdio fixture server named `name` with `flags`.
pub fn stdio_fixture(name: &str, state: &StateDir, flags: &[&str]) -> ServerSpec {
    let mut args = vec!["--transport", "stdio", "--state-dir", state.path_str()];
    args.extend_from_slice(flags);
    let mut spec = ServerSpec::stdio(name, FIXTURE, &args);
    spec.timeouts = test_timeouts();
    spec
}

pub fn with_env(mut spec: ServerSpec, key: &str, value: &str) -> ServerSpec {
    if let TransportSpec::Stdio { env, .. } = &mut spec.transport {
        env.insert(key.into(), value.into());
    }
    spec
}

/// The fixture's state directory (persists across respawns).
pub struct StateDir(pub PathBuf);

impl StateDir {
    pub fn path_str(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }

    fn counter(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.0.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn starts(&self) -> u64 {
        self.counter("starts")
    }

    /// `initialize` requests seen, across restarts (failed ones too).
    pub fn initializes(&self) -> u64 {
        self.counter("initializes")
    }

    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.0.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Executed calls, one line each: `<tool> <arguments-json>`.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Tool calls the fixture saw cancelled by their client.
    pub fn cancelled(&self) -> u64 {
        self.counter("cancelled")
    }

    /// `setLevel <level>` for each `logging/setLevel`, in order.
    pub fn log_levels(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("logging.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `subscribe <uri>` / `unsubscribe <uri>` lines, in order.
    pub fn subscriptions(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("subscriptions.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn calls_of(&self, tool: &str) -> usize {
        self.calls()
            .iter()
            .filter(|l| l.split(' ').next() == Some(tool))
            .count()
    }

    /// Replaces control.json atomically (the fixture polls it).
    pub fn control(&self, json: serde_json::Value) {
        let tmp = self.0.join("control.json.tmp");
        std::fs::write(&tmp, json.to_string()).unwrap();
        std::fs::rename(tmp, self.0.join("control.json")).unwrap();
    }
}

/// Waits until `condition` holds, failing the test with `what` after [`PATIENCE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

pub fn kill(pid: u32, signal: i32) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status();
}

pub fn args(json: serde_json::Value) -> Option<serde_json::Map<String, serde_json::Value>> {
    json.as_object().cloned()
}

pub fn is_error(result: &rmcp::model::CallToolResult) -> bool {
    result.is_error == Some(true)
}

/// A fixture serving HTTP (`--transport http|sse`) as a separate process.
pub struct HttpFixture {
    pub child: tokio::process::Child,
    pub addr: std::net::SocketAddr,
}

impl HttpFixture {
    /// Starts the fixture on `bind` (port 0: any) and waits for its `listening on` line.
    pub async fn start(
        transport: &str,
        state: &StateDir,
        bind: &str,
        flags: &[&str],
    ) -> HttpFixture {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(FIXTURE)
            .args([
                "--transport",
                transport,
                "--bind",
                bind,
                "--state-dir",
                state.path_str(),
            ])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("fixture starts");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        tokio::time::timeout(
            PATIENCE,
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("fixture announces its address")
        .expect("reading the fixture's stdout");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("an address");
        HttpFixture { child, addr }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// An HTTP server spec for the supervisor.
pub fn http_spec(name: &str, url: String, transport: TransportSpec) -> ServerSpec {
    let transport = match transport {
        TransportSpec::Http {
            headers,
            sse_fallback,
            ..
        } => TransportSpec::Http {
            url,
            headers,
            sse_fallback,
        },
        TransportSpec::Sse { headers, .. } => TransportSpec::Sse { url, headers },
        stdio => stdio,
    };
    let mut spec = ServerSpec::new(name, transport);
    spec.timeouts = test_timeouts();
    spec
}

/// Waits until the policy reports `server`'s breaker in `state` (e.g. half-open once the
/// cooldown has passed: the policy computes it from time, no event announces it).
pub async fn wait_for_breaker(host: &Host, server: &str, state: tether::policy::BreakerState) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = host.supervisor.policy_status().await;
        if status
            .iter()
            .any(|s| s.server == server && s.breaker == state)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {server}'s breaker to be {state:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether this process should run the test `name` (`module::test`) itself. The first time, it
/// does not: it runs the test again in a fresh process of this binary, alone, asserts that it
/// passed, and answers false. In that process it answers true. For tests that measure the whole
/// process (resident memory), which other tests running beside them in this binary would skew.
pub fn in_own_process(name: &str) -> bool {
    in_own_process_with(name, &[])
}

/// [`in_own_process`], the fresh process started with `env` added to its environment (a test
/// must never set the environment of this one: other tests spawn processes meanwhile).
pub fn in_own_process_with(name: &str, env: &[(&str, &str)]) -> bool {
    const MARK: &str = "TETHER_TEST_OWN_PROCESS";
    if std::env::var(MARK).as_deref() == Ok(name) {
        return true;
    }
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(MARK, name)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name} failed in its own process:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

/// A virtualenv under the build's temp dir with `requirement` installed from PyPI, every
/// dependency pinned by `constraints` (a file in `tests/python/`); made on first use, other test
/// processes wait on a lock meanwhile. Needs `python3` with `venv`.
pub fn python_venv(name: &str, requirement: &str, constraints: &str) -> PathBuf {
    use std::process::Command as StdCommand;
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-sdk");
    std::fs::create_dir_all(&root).unwrap();
    let lock = std::fs::File::create(root.join(".lock")).unwrap();
    lock.lock().expect("locking the virtualenv directory");
    let venv = root.join(name);
    let ready = venv.join(".installed");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        let run = |command: &mut StdCommand, what: &str| {
            let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                output.status.success(),
                "{what} failed (needs python3 with venv and PyPI):\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        run(
            StdCommand::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
        let constraints = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join(constraints);
        run(
            StdCommand::new(venv.join("bin").join("python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg(requirement)
                .arg("-c")
                .arg(constraints),
            &format!("pip install {requirement}"),
        );
        std::fs::File::create(&ready).unwrap();
    }
    venv
}

/// Agents calling an echo tool in a loop, counting the calls and those that failed.
pub struct EchoCallers {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl EchoCallers {
    pub fn start(
        supervisor: &tether::supervisor::Supervisor,
        tool: &'static str,
        n: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks = (0..n)
            .map(|worker| {
                let (supervisor, stop, done, failed) = (
                    supervisor.clone(),
                    stop.clone(),
                    done.clone(),
                    failed.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let text = format!("w{worker}");
                        let result = supervisor
                            .call_tool(tool, args(serde_json::json!({"text": text})))
                            .await
                            .unwrap();
                        if is_error(&result) || tether_tests::text(&result) != text {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        EchoCallers {
            stop,
            done,
            failed,
            tasks,
        }
    }

    /// Waits until ten more calls have finished.
    pub async fn flowing(&self) {
        let before = self.done.load(Ordering::Relaxed);
        wait_until("calls keep flowing", || {
            self.done.load(Ordering::Relaxed) > before + 10
        })
        .await;
    }

    /// Stops the callers, asserts that no call failed, and returns how many were made.
    pub async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let done = self.done.load(Ordering::Relaxed);
        assert_eq!(self.failed.load(Ordering::Relaxed), 0, "of {done} calls");
        done
    }
}
