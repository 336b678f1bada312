//! Policies in other languages and the policy in other hosts, with the real toolchains (pinned,
//! from PyPI and npm, installed by the projects' own scripts): the Python and JavaScript
//! policies pass both levels of the conformance suite, `tether policy new` writes starters that
//! build and pass its contract level, and the Python and JavaScript hosts run the exported
//! scenarios with transcripts identical to Tether's, byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

use tether::policy::conformance::{self, Level, ScenarioResult};
use tether::policy::{EMBEDDED_DEFAULT_POLICY, PolicyEngine, PolicySource};

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

/// Runs `command` to success; returns its stdout, or fails the test with its output.
fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
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
    run(
        Command::new("bash").arg(project.join("build.sh")).arg(out),
        &format!("{}/build.sh", project.display()),
    );
    assert!(out.metadata().is_ok_and(|m| m.len() > 0), "no component");
}

#[test]
fn the_python_policy_passes_both_levels() {
    let out = scratch("python-policy").join("policy.wasm");
    build(&repo().join("guest/python"), &out);
    let results = check(&out);
    assert_eq!(results.len(), conformance::scenarios().len());
    assert_eq!(failures(&results, None), Vec::<String>::new());
}

#[test]
fn the_javascript_policy_passes_both_levels() {
    let out = scratch("js-policy").join("policy.wasm");
    build(&repo().join("guest/js"), &out);
    let results = check(&out);
    assert_eq!(results.len(), conformance::scenarios().len());
    assert_eq!(failures(&results, None), Vec::<String>::new());
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
    let again = Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(["policy", "new", "--lang", lang])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not empty"));
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

/// Every file of `dir`, by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(entry.path()).unwrap())
        })
        .collect();
    all.sort();
    all
}

#[test]
fn three_hosts_give_the_default_policy_identical_transcripts() {
    let dir = scratch("three-hosts");
    let component = dir.join("default-policy.wasm");
    std::fs::write(&component, EMBEDDED_DEFAULT_POLICY).unwrap();

    let rust = dir.join("rust");
    let results = check(&component);
    assert_eq!(failures(&results, None), Vec::<String>::new());
    conformance::write_transcripts(&rust, &results).unwrap();

    let python = dir.join("python");
    let said = run(
        Command::new("python3")
            .arg(repo().join("host/python/conformance.py"))
            .arg(&component)
            .arg("--transcripts")
            .arg(&python),
        "host/python/conformance.py",
    );
    assert!(said.contains("20 passed, 0 failed"), "{said}");

    let js = dir.join("js");
    let said = run(
        Command::new("node")
            .arg(repo().join("host/js/conformance.mjs"))
            .arg(&component)
            .arg("--transcripts")
            .arg(&js),
        "host/js/conformance.mjs",
    );
    assert!(said.contains("20 passed, 0 failed"), "{said}");

    let expected = files(&rust);
    assert_eq!(expected.len(), conformance::scenarios().len());
    for (host, transcripts) in [("python", files(&python)), ("js", files(&js))] {
        for ((name, want), (got_name, got)) in expected.iter().zip(&transcripts) {
            assert_eq!(name, got_name, "{host} wrote other files");
            assert!(
                want == got,
                "{host}'s transcript of {name} differs from Tether's:\n{}\nvs\n{}",
                String::from_utf8_lossy(want),
                String::from_utf8_lossy(got)
            );
        }
        assert_eq!(
            expected.len(),
            transcripts.len(),
            "{host} wrote other files"
        );
    }
}

#[test]
fn the_python_and_javascript_unit_tests_pass() {
    let root = repo();
    for dir in ["guest/python/tests", "host/python/tests"] {
        run(
            Command::new("python3")
                .args(["-m", "unittest", "discover", "-s"])
                .arg(root.join(dir)),
            &format!("python3 -m unittest discover -s {dir}"),
        );
    }
    for dir in ["guest/js/test", "host/js/test"] {
        run(
            Command::new("node").arg("--test").arg(root.join(dir)),
            &format!("node --test {dir}"),
        );
    }
}
