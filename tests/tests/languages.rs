//! Policies in other languages and the policy in other hosts, with the real toolchains (pinned,
//! from PyPI and npm, installed by the projects' own scripts): the Python and JavaScript
//! policies pass both levels of the conformance suite, `tether policy new` writes starters that
//! build and pass its contract level, and the Python and JavaScript hosts run the exported
//! scenarios with transcripts identical to Tether's, byte for byte.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tether::policy::conformance::{self, Level, ScenarioResult};
use tether::policy::{EMBEDDED_DEFAULT_POLICY, PolicyEngine, PolicySource};
use tether_tests::components;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A fresh, empty directory for one test under the build's temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("languages")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Longest any one toolchain step may take (installs from PyPI and npm included) on a loaded
/// 2-core machine; past it the step's whole process group is killed and the test fails.
const STEP_LIMIT: Duration = Duration::from_secs(600);

/// Runs `command` in its own process group; returns its exit code, stdout and stderr, or fails
/// the test if it is not done within [`STEP_LIMIT`].
fn outcome(command: &mut Command, what: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let deadline = Instant::now() + STEP_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the group this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!(
                "{what} took longer than {STEP_LIMIT:?}:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    (status.code(), read(&out), read(&err))
}

/// Runs `command` to success; returns its stdout, or fails the test with its output.
fn run(command: &mut Command, what: &str) -> String {
    let (code, stdout, stderr) = outcome(command, what);
    assert_eq!(code, Some(0), "{what} failed:\n{stdout}\n{stderr}");
    stdout
}

/// The conformance suite's results for `component`, compiled once per build (cached).
fn check(component: &Path) -> Vec<ScenarioResult> {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-cache");
    let engine = PolicyEngine::new(Some(cache)).expect("engine");
    let source = PolicySource::File(component.to_path_buf());
    conformance::preflight(&engine, &source, "{}").expect("the component is usable");
    conformance::run(&engine, &source, "{}")
}

fn failures(results: &[ScenarioResult], level: Option<Level>) -> Vec<String> {
    results
        .iter()
        .filter(|r| level.is_none_or(|level| r.level == level))
        .filter_map(|r| Some(format!("{}: {}", r.name, r.failure.as_ref()?)))
        .collect()
}

/// Builds `project` with its `build.sh` into `out`.
fn build(project: &Path, out: &Path) {
    let mut command = Command::new("bash");
    command.arg(project.join("build.sh")).arg(out);
    // As a user runs it: none of the outer cargo's settings for this test (a nested cargo
    // would build for the host with them, or into the outer target dir).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
        {
            command.env_remove(&*key);
        }
    }
    run(&mut command, &format!("{}/build.sh", project.display()));
    assert!(out.metadata().is_ok_and(|m| m.len() > 0), "no component");
}

#[test]
fn the_python_policy_passes_both_levels() {
    let out = scratch("python-policy").join("policy.wasm");
    build(&repo().join("guest/python"), &out);
    assert_eq!(failures(&check(&out), None), Vec::<String>::new());
}

#[test]
fn the_javascript_policy_passes_both_levels() {
    let out = scratch("js-policy").join("policy.wasm");
    build(&repo().join("guest/js"), &out);
    assert_eq!(failures(&check(&out), None), Vec::<String>::new());
}

/// `tether policy new --lang LANG DIR`, built and checked: the contract level passes.
fn starter_passes_the_contract(lang: &str) {
    let dir = scratch(&format!("starter-{lang}")).join("my-policy");
    let said = run(
        Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(["policy", "new", "--lang", lang])
            .arg(&dir),
        "tether policy new",
    );
    assert!(said.contains("build.sh"), "{said}");
    assert!(dir.join("wit/policy.wit").exists());
    let out = dir.join("policy.wasm");
    build(&dir, &out);
    let results = check(&out);
    assert_eq!(
        failures(&results, Some(Level::Contract)),
        Vec::<String>::new()
    );
    // A second `new` into the same, now non-empty, directory is refused and writes nothing.
    let before = files(&dir);
    let (code, _, stderr) = outcome(
        Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(["policy", "new", "--lang", lang])
            .arg(&dir),
        "tether policy new (again)",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is not empty"), "{stderr}");
    assert!(
        files(&dir) == before,
        "a refused `policy new` changed files"
    );
}

#[test]
fn policy_new_rust_builds_and_passes_the_contract() {
    starter_passes_the_contract("rust");
}

#[test]
fn policy_new_python_builds_and_passes_the_contract() {
    starter_passes_the_contract("python");
}

#[test]
fn policy_new_js_builds_and_passes_the_contract() {
    starter_passes_the_contract("js");
}

/// The files directly in `dir`, by name, with their contents.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    all.sort();
    all
}

/// Whether `output` has the summary line `N passed, F failed` for the whole suite.
fn summary(output: &str, failed: usize) -> bool {
    let passed = conformance::scenarios().len() - failed;
    output
        .lines()
        .any(|line| line.trim() == format!("{passed} passed, {failed} failed"))
}

/// The transcripts of `component` written by Tether, the Python host and the JavaScript host,
/// each asserted to end with `failed` failed scenarios.
fn transcripts_in_three_hosts(dir: &Path, component: &Path, failed: usize) -> [PathBuf; 3] {
    let rust = dir.join("rust");
    let results = check(component);
    assert_eq!(failures(&results, None).len(), failed, "{results:#?}");
    conformance::write_transcripts(&rust, &results).unwrap();
    let exit = if failed == 0 { 0 } else { 1 };
    let [python, js] = [
        (
            "python",
            "python3",
            "host/conformance/python/conformance.py",
        ),
        ("js", "node", "host/conformance/js/conformance.mjs"),
    ]
    .map(|(host, program, script)| {
        let transcripts = dir.join(host);
        let (code, said, stderr) = outcome(
            Command::new(program)
                .arg(repo().join(script))
                .arg(component)
                .arg("--transcripts")
                .arg(&transcripts),
            script,
        );
        assert!(
            code == Some(exit) && summary(&said, failed),
            "{said}\n{stderr}"
        );
        transcripts
    });
    [rust, python, js]
}

fn assert_same_transcripts([rust, python, js]: &[PathBuf; 3]) {
    let expected = files(rust);
    assert_eq!(expected.len(), conformance::scenarios().len());
    for (host, dir) in [("python", python), ("js", js)] {
        let transcripts = files(dir);
        let names =
            |all: &[(String, Vec<u8>)]| all.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&transcripts),
            names(&expected),
            "{host} wrote other files"
        );
        for ((name, want), (_, got)) in expected.iter().zip(&transcripts) {
            assert!(
                want == got,
                "{host}'s transcript of {name} differs from Tether's:\n{}\nvs\n{}",
                String::from_utf8_lossy(want),
                String::from_utf8_lossy(got)
            );
        }
    }
}

#[test]
fn three_hosts_give_identical_transcripts_and_their_own_tests_pass() {
    let dir = scratch("three-hosts");
    let component = dir.join("default-policy.wasm");
    std::fs::write(&component, EMBEDDED_DEFAULT_POLICY).unwrap();
    assert_same_transcripts(&transcripts_in_three_hosts(&dir, &component, 0));

    // A policy that fails a scenario fails it alike everywhere, up to the same call.
    let wrong = dir.join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    assert_same_transcripts(&transcripts_in_three_hosts(
        &wrong,
        Path::new(components::WRONG),
        1,
    ));
    // And a policy of another design, which breaks invariants the default keeps (its
    // withdrawals of nothing among them: what the hosts absorb, they count alike).
    let fixed = dir.join("fixed-interval");
    std::fs::create_dir_all(&fixed).unwrap();
    assert_same_transcripts(&transcripts_in_three_hosts(
        &fixed,
        Path::new(components::FIXED_INTERVAL),
        8,
    ));

    // The hosts' own tests, now that the hosts installed their toolchains (wasmtime-py into
    // host/conformance/python/.venv, jco into host/conformance/js/node_modules), against a real component.
    let root = repo();
    let (code, _, said) = outcome(
        Command::new(root.join("host/conformance/python/.venv/bin/python"))
            .args(["-m", "unittest", "discover", "-s"])
            .arg(root.join("host/conformance/python/tests"))
            .env("TETHER_POLICY_WASM", &component)
            .env("TETHER_HOSTILE_POLICY_WASM", components::HOSTILE)
            .env(
                "TETHER_PREVIOUS_MINOR_POLICY_WASM",
                components::PREVIOUS_MINOR,
            ),
        "host/conformance/python's unit tests",
    );
    assert!(code == Some(0) && !said.contains("skipped"), "{said}");
    let said = run(
        Command::new("node")
            .arg("--test")
            .args(test_files(&root.join("host/conformance/js/test")))
            .env("TETHER_POLICY_WASM", &component)
            .env("TETHER_HOSTILE_POLICY_WASM", components::HOSTILE)
            .env(
                "TETHER_PREVIOUS_MINOR_POLICY_WASM",
                components::PREVIOUS_MINOR,
            ),
        "host/conformance/js's unit tests",
    );
    assert!(
        said.contains("# skipped 0"),
        "none may be skipped here:\n{said}"
    );
}

/// The `*.test.mjs` files of `dir` (newer Node versions read a directory argument as a pattern).
fn test_files(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    all.sort();
    assert!(!all.is_empty(), "no tests in {}", dir.display());
    all
}

#[test]
fn the_policies_own_unit_tests_pass() {
    let root = repo();
    run(
        Command::new("python3")
            .args(["-m", "unittest", "discover", "-s"])
            .arg(root.join("guest/python/tests")),
        "guest/python's unit tests",
    );
    run(
        Command::new("node")
            .arg("--test")
            .args(test_files(&root.join("guest/js/test"))),
        "guest/js's unit tests",
    );
}

/// A policy written outside the project, as issue 21 tried it: Python, retry every second
/// forever, no breaker, no parking, a withdrawal on every failure (tests/python/retry_policy.py,
/// built in a `tether policy new --lang python` starter). It keeps the contract and breaks
/// invariants, so it swaps into a running gateway with `--force`, the answer naming them, and
/// its take-over shows agents nothing new; every session is kept (the same child pids) and no
/// call fails; it decides (a crashed server comes back); and the default swaps back the same
/// way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_python_policy_swaps_in_with_force_and_back_keeping_sessions() {
    use crate::admin_api::{Admin, TOKEN, cli, joined};
    use crate::common::{EchoCallers, Host, stdio_fixture, wait_until};

    let dir = scratch("retry-policy");
    let project = dir.join("policy");
    run(
        Command::new(env!("CARGO_BIN_EXE_tether-cli"))
            .args(["policy", "new", "--lang", "python"])
            .arg(&project),
        "tether policy new",
    );
    std::fs::copy(
        repo().join("tests/python/retry_policy.py"),
        project.join("app.py"),
    )
    .unwrap();
    let component = dir.join("retry.wasm");
    let (built, at) = (project.clone(), component.clone());
    tokio::task::spawn_blocking(move || build(&built, &at))
        .await
        .unwrap();
    let default = dir.join("default.wasm");
    std::fs::write(&default, EMBEDDED_DEFAULT_POLICY).unwrap();
    let breaks = [
        "permanent-fault-parks-at-once",
        "failing-server-parks-and-keeps-a-self-probe",
        "handshake-alone-does-not-reset-the-budget",
        "reconnect-request-revives-a-parked-server",
        "breaker-opens-and-fails-fast",
        "exactly-one-half-open-probe",
        "probe-without-session-signals-reconnect",
        "tools-are-withdrawn-exactly-once",
    ];

    let admin = Admin::start(Host::fast()).await;
    let supervisor = admin.host.supervisor.clone();
    let (busy, crashy) = (admin.host.state_dir("busy"), admin.host.state_dir("crashy"));
    for (name, state) in [("busy", &busy), ("crashy", &crashy)] {
        supervisor
            .add_server(stdio_fixture(name, state, &[]))
            .unwrap();
        wait_until("tools visible", || !admin.host.tools(name).is_empty()).await;
    }
    let addr = admin.server.addr.to_string();
    let nowhere = admin.host.dir.path().join("no-state.json");
    let flags = [
        "--admin",
        &addr,
        "--token",
        TOKEN,
        "--state-file",
        nowhere.to_str().unwrap(),
    ];
    fn swap(file: &Path, force: bool) -> Vec<&str> {
        let mut args = vec!["policy", "swap", file.to_str().unwrap()];
        if force {
            args.push("--force");
        }
        args
    }
    let callers = EchoCallers::start(&supervisor, "busy__echo", 4);
    callers.flowing().await;
    let pids = (busy.pid(), crashy.pid());
    let generation = supervisor.registry().generation();

    // Without --force it is refused, naming what it breaks.
    let (code, _, stderr) = cli(&joined(&swap(&component, false), &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--force") && breaks.iter().all(|name| stderr.contains(name)),
        "{stderr}"
    );
    assert!(!stderr.contains("breaks the contract"), "{stderr}");

    // With --force it runs, the answer naming every invariant it breaks, and nothing else.
    let (code, stdout, stderr) = cli(&joined(&swap(&component, true), &flags)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("retry-every-second"), "{stdout}");
    let named: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("warning: it breaks Tether's invariant "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(named, breaks, "{stdout}");
    assert_eq!(supervisor.policy().running().name, "retry-every-second");
    assert_eq!((busy.pid(), crashy.pid()), pids, "sessions are kept");
    assert_eq!(
        supervisor.registry().generation(),
        generation,
        "its take-over publishes what is shown: agents hear of no change"
    );
    callers.flowing().await;

    // It decides: a crashed server is withdrawn and comes back, on its own schedule.
    let crashed = crashy.pid().unwrap();
    crate::common::kill(crashed, 9);
    wait_until("crashy is back", || {
        crashy.pid().is_some_and(|pid| pid != crashed) && !admin.host.tools("crashy").is_empty()
    })
    .await;
    callers.flowing().await;

    // Back to the default the same way (it breaks nothing: no --force needed, none named).
    let pids = (busy.pid(), crashy.pid());
    let generation = supervisor.registry().generation();
    let (code, stdout, stderr) = cli(&joined(&swap(&default, true), &flags)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("breaks Tether's invariant"), "{stdout}");
    assert_eq!(supervisor.policy().running().name, "tether-default-policy");
    assert_eq!((busy.pid(), crashy.pid()), pids, "sessions are kept");
    assert_eq!(supervisor.registry().generation(), generation);
    callers.flowing().await;
    assert!(callers.stop().await > 30);
    admin.stop().await;
}
