//! The conformance suite's contract level asks only what the contract asks. It is neutral:
//! policies of designs other than the default's (a fixed interval forever without a breaker,
//! one that gives up and never probes, one that withdraws and republishes on every event) pass
//! it, and fail exactly the invariants they break. It is sensitive: for every contract
//! scenario, a mutant of the default that breaks only that scenario's rule fails that scenario
//! and no other (the table in docs/CONFORMANCE.md).

use std::collections::BTreeSet;

use tether::policy::conformance::{self, Level, ScenarioResult};
use tether::policy::{PolicySource, conformance::Scenario};
use tether_tests::{component, components};

use crate::common::shared_engine;

fn check(source: &PolicySource, settings: &str) -> Vec<ScenarioResult> {
    let engine = shared_engine();
    conformance::preflight(&engine, source, settings).expect("the component is usable");
    conformance::run(&engine, source, settings)
}

/// The names of the failed scenarios, each with why (for the assertion's message).
fn failed(results: &[ScenarioResult]) -> (BTreeSet<&'static str>, String) {
    let names = results
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.name)
        .collect();
    let why = results
        .iter()
        .filter_map(|r| Some(format!("{}: {}\n", r.name, r.failure.as_ref()?)))
        .collect();
    (names, why)
}

fn names(list: &[&'static str]) -> BTreeSet<&'static str> {
    list.iter().copied().collect()
}

fn contract_scenarios() -> Vec<Scenario> {
    conformance::scenarios()
        .into_iter()
        .filter(|s| s.level == Level::Contract)
        .collect()
}

/// Each policy of another design: the invariants it breaks, and nothing else.
#[test]
fn policies_of_other_designs_pass_the_contract_and_fail_exactly_the_invariants_they_break() {
    let never_parks = [
        "permanent-fault-parks-at-once",
        "failing-server-parks-and-keeps-a-self-probe",
        "handshake-alone-does-not-reset-the-budget",
        "reconnect-request-revives-a-parked-server",
    ];
    let no_breaker = [
        "breaker-opens-and-fails-fast",
        "exactly-one-half-open-probe",
        "probe-without-session-signals-reconnect",
    ];
    let cases = [
        (
            "fixed interval, no breaker, a withdrawal on every failure",
            components::FIXED_INTERVAL,
            [
                &never_parks[..],
                &no_breaker[..],
                &["tools-are-withdrawn-exactly-once"],
            ]
            .concat(),
        ),
        (
            "gives up after 3 attempts and never probes",
            components::GIVES_UP,
            [
                &[
                    "permanent-fault-parks-at-once",
                    "failing-server-parks-and-keeps-a-self-probe",
                ][..],
                &no_breaker[..],
            ]
            .concat(),
        ),
        (
            "withdraws and republishes on every event",
            components::REPUBLISHES,
            vec![
                "tools-are-withdrawn-exactly-once",
                "tools-changed-republishes-only-on-difference",
            ],
        ),
    ];
    for (design, path, breaks) in cases {
        let results = check(&component(path), "{}");
        let (failed, why) = failed(&results);
        assert_eq!(failed, names(&breaks), "{design}:\n{why}");
        let contract = results
            .iter()
            .filter(|r| r.level == Level::Contract && r.failure.is_some())
            .count();
        assert_eq!(contract, 0, "{design} keeps the contract:\n{why}");
        // The scenarios that did not apply would hide nothing: all of them ran.
        assert!(results.iter().all(|r| r.applicable), "{design}");
    }
}

/// Each contract scenario with the mutation that breaks its rule (also the table in
/// docs/CONFORMANCE.md).
const MUTANTS: [(&str, &str); 10] = [
    ("session-publishes-usable-tool-names", "unsanitized-names"),
    (
        "lost-session-withdraws-its-tools",
        "keeps-tools-of-lost-sessions",
    ),
    (
        "removal-withdraws-and-forgets",
        "keeps-tools-of-removed-servers",
    ),
    ("shutdown-withdraws-every-server", "keeps-tools-on-shutdown"),
    ("changed-tools-are-republished", "ignores-tool-changes"),
    ("include-and-exclude-filter-tools", "ignores-filters"),
    ("decisions-are-deterministic", "os-seeded-jitter"),
    (
        "state-survives-snapshot-and-restore",
        "restore-forgets-calls",
    ),
    (
        "takes-over-another-policy-keeping-sessions",
        "takes-over-without-sessions",
    ),
    ("names-follow-the-operators-naming", "ignores-naming"),
];

#[test]
fn every_contract_scenario_fails_its_mutant_and_only_it() {
    // Every contract scenario has its mutant.
    let scenarios: BTreeSet<&str> = contract_scenarios().iter().map(|s| s.name).collect();
    let covered: BTreeSet<&str> = MUTANTS.iter().map(|(scenario, _)| *scenario).collect();
    assert_eq!(covered, scenarios, "a contract scenario without a mutant");

    let source = component(components::MUTANT);
    // Without a mutation, the mutant is the default: it passes everything.
    let (failed_plain, why) = failed(&check(&source, "{}"));
    assert!(failed_plain.is_empty(), "{why}");
    for (scenario, mutation) in MUTANTS {
        let settings = format!(r#"{{"mutant": "{mutation}"}}"#);
        let (failed, why) = failed(&check(&source, &settings));
        assert_eq!(
            failed,
            names(&[scenario]),
            "mutant {mutation} must fail {scenario} and nothing else:\n{why}"
        );
    }
}
