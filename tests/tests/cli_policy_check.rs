//! `tether policy check` as a user runs it.

use std::process::Command;

use tether_tests::components;

/// `tether policy check ARGS`, without the user's compile cache unless ARGS name one.
fn policy_check(args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tether-cli"));
    command.args(["policy", "check"]).args(args);
    if !args.contains(&"--cache-dir") {
        command.arg("--no-cache");
    }
    let output = command.output().expect("tether runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_default_policy_passes_every_scenario() {
    let (code, stdout, stderr) = policy_check(&[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ok    exactly-one-half-open-probe"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn a_wrong_policy_fails_naming_the_scenario_and_what_differed() {
    let (code, stdout, stderr) = policy_check(&[components::WRONG]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("FAIL  handshake-alone-does-not-reset-the-budget"))
        .unwrap_or_else(|| panic!("no failure line for the scenario:\n{stdout}"));
    assert!(line.contains("respawn storm"), "{line}");
    assert!(stdout.contains(" failed"), "{stdout}");
    // It keeps the contract: only an invariant fails, in its own section.
    let (contract, invariants) = stdout
        .split_once("Tether's invariants")
        .expect("two sections");
    assert!(
        contract.contains("the contract") && contract.contains("0 failed"),
        "{stdout}"
    );
    assert!(invariants.contains("FAIL  handshake-alone"), "{stdout}");
}

#[test]
fn another_implementation_keeps_the_contract_including_the_handover() {
    let (code, stdout, stderr) = policy_check(&[components::OTHER]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for scenario in [
        "ok    takes-over-another-policy-keeping-sessions",
        "ok    decisions-are-deterministic",
        "ok    state-survives-snapshot-and-restore",
    ] {
        assert!(stdout.contains(scenario), "{stdout}");
    }
}

#[test]
fn an_incompatible_or_broken_component_is_refused_before_any_scenario() {
    let (code, stdout, stderr) = policy_check(&[components::INCOMPATIBLE]);
    assert_eq!(code, Some(4), "{stdout}\n{stderr}");
    assert!(stderr.contains("tether:policy@0.3.0"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm junk").unwrap();
    let (code, _, stderr) = policy_check(&[junk.to_str().unwrap()]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("junk.wasm") && stderr.contains("not a valid wasm component"),
        "{stderr}"
    );

    let (code, _, stderr) = policy_check(&["/nonexistent/policy.wasm"]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("cannot read policy /nonexistent/policy.wasm"),
        "{stderr}"
    );
}

#[test]
fn a_second_check_of_a_component_skips_compiling_it() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        components::OTHER,
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let (code, stdout, first) = policy_check(&args);
    assert_eq!(code, Some(0), "{stdout}\n{first}");
    assert!(
        first.contains("compiled in") && first.contains("for the next check"),
        "{first}"
    );
    let (code, stdout, second) = policy_check(&args);
    assert_eq!(code, Some(0), "{stdout}\n{second}");
    assert!(second.contains("loaded without compiling"), "{second}");
}

#[test]
fn results_are_available_as_json_for_scripts() {
    let (code, stdout, _) = policy_check(&["--json"]);
    assert_eq!(code, Some(0));
    let results: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let results = results.as_array().expect("a list");
    assert!(results.iter().all(|r| r["failure"].is_null()), "{stdout}");
    assert!(
        results
            .iter()
            .any(|r| r["name"] == "state-survives-snapshot-and-restore")
    );
}

#[test]
fn settings_the_policy_refuses_are_one_clear_error_before_any_scenario() {
    for json in [false, true] {
        let mut args = vec!["--settings", r#"{"frob":1}"#];
        if json {
            args.push("--json");
        }
        let (code, stdout, stderr) = policy_check(&args);
        assert_eq!(code, Some(4), "{stdout}\n{stderr}");
        // No scenario ran: nothing about scenarios on stdout, one error on stderr.
        assert!(stdout.trim().is_empty(), "{stdout}");
        let errors: Vec<_> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        // It names the settings and carries the policy's own refusal.
        assert!(
            errors[0].contains("refused the settings") && errors[0].contains(r#"{"frob":1}"#),
            "{stderr}"
        );
        assert!(errors[0].contains("unknown setting `frob`"), "{stderr}");
    }
    // Settings the policy accepts still run the suite.
    let (code, stdout, stderr) = policy_check(&["--settings", r#"{"reconnect_budget":9}"#]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ok    exactly-one-half-open-probe"),
        "{stdout}"
    );
}
