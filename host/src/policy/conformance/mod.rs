//! The conformance suite: scenarios (events in, expected actions and admissions out) that any
//! policy component must pass. `tether policy check` runs them here, after [`preflight`] has
//! made sure the component can be used at all.
//!
//! The scenarios are data ([`script`]), written once (`suite.rs`) and run by `interpreter.rs`.
//! [`export`] writes them as JSON (`docs/CONFORMANCE.md`), which hosts other than Tether run
//! (`host/conformance/python`, `host/conformance/js`); each host writes a transcript of every call into the policy, and
//! for the same component those are identical, byte for byte.
//!
//! Scenarios come at two levels ([`Level`]): the *contract* (valid outputs, no tools for a
//! server without a session, withdrawal on removal and shutdown, determinism, the snapshot round
//! trip, a handover taken over), which any policy the host runs must keep, and *Tether's
//! invariants* (never give up — park; the budget resets only on a proven session; one half-open
//! probe; ...), which a policy may break on purpose, and which a swap then names (`--force`).

mod interpreter;
pub mod script;
mod suite;
mod wire;

use std::path::Path;
use std::sync::Arc;

pub use script::{Level, Scenario};
pub use suite::scenarios;

use super::PolicyError;
use super::engine::{PolicyEngine, PolicySource};
use super::runtime::{PolicyRuntime, RuntimeOptions};
use interpreter::Interpreter;

/// One scenario's outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScenarioResult {
    /// The scenario's name (e.g. `tools-are-withdrawn-exactly-once`).
    pub name: &'static str,
    /// Which promise it checks.
    pub level: Level,
    /// `None` when it passed (or did not apply); otherwise what differed.
    pub failure: Option<String>,
    /// False when it checks what the component's contract version lacks (its `since`): it
    /// passes without running, and has no transcript.
    pub applicable: bool,
    /// Every call into the policy and its answer, one JSON line each (`docs/CONFORMANCE.md`).
    #[serde(skip)]
    pub transcript: String,
}

/// Starts `source` with `settings` once, as every scenario does, and says why it cannot be used
/// at all: not loadable, built for an incompatible contract, settings it refuses (in its own
/// words), a fault while starting. Checked before [`run`], so that such a component gets one
/// clear error instead of every scenario failing for the same reason.
pub fn preflight(
    engine: &Arc<PolicyEngine>,
    source: &PolicySource,
    settings: &str,
) -> Result<(), String> {
    let started = PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine.clone()),
        source: source.clone(),
        settings: settings.to_string(),
        fallback_to_default: false,
        ..RuntimeOptions::default()
    });
    match started {
        Ok(_) => Ok(()),
        Err(PolicyError::Refused {
            policy,
            what: "the settings",
            reason,
        }) => Err(format!(
            "policy {policy} refused the settings {}: {reason}",
            settings.trim()
        )),
        Err(error) => Err(error.to_string()),
    }
}

/// Runs every scenario against `source`, each in a fresh instance given `settings`. Failures of
/// the component (traps, refusals) are scenario failures, never papered over by a fallback.
pub fn run(
    engine: &Arc<PolicyEngine>,
    source: &PolicySource,
    settings: &str,
) -> Vec<ScenarioResult> {
    let policy = engine.load(source).map_err(|e| e.to_string());
    scenarios()
        .into_iter()
        .map(|scenario| {
            let mut transcript = String::new();
            let mut applicable = true;
            let failure = policy
                .clone()
                .and_then(|policy| {
                    let mut interpreter = Interpreter::start(&policy, settings)?;
                    if let Some(since) = scenario.since
                        && !interpreter.implements(since)
                    {
                        applicable = false;
                        return Ok(());
                    }
                    let outcome = interpreter.run(&scenario.steps);
                    transcript = interpreter.transcript().to_string();
                    outcome
                })
                .err();
            ScenarioResult {
                name: scenario.name,
                level: scenario.level,
                failure,
                applicable,
                transcript,
            }
        })
        .collect()
}

/// Writes the suite as JSON into `dir`: `index.json` (the names, in order) and `NAME.json` per
/// scenario.
pub fn export(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (file, text) in exported() {
        std::fs::write(dir.join(file), text)?;
    }
    Ok(())
}

/// The files [`export`] writes, with their contents.
pub fn exported() -> Vec<(String, String)> {
    let all = scenarios();
    let names: Vec<&str> = all.iter().map(|s| s.name).collect();
    let mut files = vec![("index.json".to_string(), pretty(&names))];
    files.extend(
        all.iter()
            .map(|scenario| (format!("{}.json", scenario.name), pretty(scenario))),
    );
    files
}

/// Writes each result's transcript into `dir` as `NAME.jsonl`.
pub fn write_transcripts(dir: &Path, results: &[ScenarioResult]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for result in results.iter().filter(|r| r.applicable) {
        std::fs::write(
            dir.join(format!("{}.jsonl", result.name)),
            &result.transcript,
        )?;
    }
    Ok(())
}

fn pretty(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).expect("scenarios serialize") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `host/conformance/scenarios/` is what the suite says, file for file; `TETHER_BLESS=1` rewrites it.
    #[test]
    fn the_checked_in_export_is_the_suite() {
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conformance/scenarios"
        ));
        if std::env::var_os("TETHER_BLESS").is_some() {
            let _ = std::fs::remove_dir_all(dir);
            export(dir).unwrap();
        }
        let expected = exported();
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        on_disk.sort();
        let mut names: Vec<String> = expected.iter().map(|(name, _)| name.clone()).collect();
        names.sort();
        let stale = "host/conformance/scenarios/ is out of date with the suite: run \
                     `TETHER_BLESS=1 cargo test -p tether --lib conformance` and commit it";
        assert_eq!(on_disk, names, "{stale}");
        for (name, text) in expected {
            let checked_in = std::fs::read_to_string(dir.join(&name)).unwrap();
            assert!(checked_in == text, "{name}: {stale}");
        }
    }

    #[test]
    fn values_are_encoded_as_documented() {
        use crate::policy::types::{self as t, Fault};
        let event = t::Event {
            now: u64::MAX,
            kind: t::EventKind::ConnectFailed(t::ServerFault {
                server: "a".into(),
                fault: Fault::HandshakeTimedOut,
            }),
        };
        assert_eq!(
            serde_json::to_string(&wire::Event::from(&event)).unwrap(),
            r#"{"now":18446744073709551615,"kind":{"tag":"connect-failed","val":{"server":"a","fault":{"tag":"handshake-timed-out"}}}}"#
        );
        let status = t::ServerStatus {
            server: "a".into(),
            state: t::ServerState::BackingOff,
            breaker: t::BreakerState::HalfOpen,
            failures: 1,
            breaker_failures: 2,
            tool_errors: 3,
            last_fault: None,
            since: 4,
            published_tools: 5,
            next_attempt_at: Some(6),
            breaker_until: None,
        };
        assert_eq!(
            serde_json::to_string(&wire::statuses(&[status])).unwrap(),
            r#"[{"server":"a","state":"backing-off","breaker":"half-open","failures":1,"breaker-failures":2,"tool-errors":3,"last-fault":null,"since":4,"published-tools":5,"next-attempt-at":6,"breaker-until":null}]"#
        );
        let exited = t::CallOutcome::TransportError(Fault::ProcessExited(None));
        assert_eq!(
            serde_json::to_string(&wire::CallOutcome::from(&exited)).unwrap(),
            r#"{"tag":"transport-error","val":{"tag":"process-exited","val":null}}"#
        );
    }
}

#[cfg(test)]
mod interpreter_tests {
    use super::interpreter::Interpreter;
    use super::script::{Predicate, Step};
    use crate::policy::engine::{PolicyEngine, PolicySource};
    use crate::policy::types::{EventKind, ServerConfig, ServerState, TransportKind};

    fn run(steps: &[Step]) -> (Result<(), String>, String) {
        let engine = PolicyEngine::new(None).unwrap();
        let policy = engine.load(&PolicySource::Embedded).unwrap();
        let mut interpreter = Interpreter::start(&policy, "{}").unwrap();
        let outcome = interpreter.run(steps);
        (outcome, interpreter.transcript().to_string())
    }

    fn configure(name: &str) -> Step {
        Step::Event {
            kind: EventKind::ServerConfigured(ServerConfig {
                name: name.into(),
                transport: TransportKind::Stdio,
                include: vec![],
                exclude: vec![],
                settings: String::new(),
                prefix: None,
            }),
        }
    }

    fn state(server: &str, state: ServerState) -> Predicate {
        Predicate::State {
            server: server.into(),
            states: vec![state],
        }
    }

    #[test]
    fn a_failed_expectation_names_the_call_and_what_it_looked_at() {
        let (outcome, transcript) = run(&[
            configure("alpha"),
            Step::Expect {
                that: Predicate::Connects("beta".into()),
                otherwise: "beta must connect".into(),
            },
        ]);
        let failure = outcome.unwrap_err();
        assert!(
            failure
                .starts_with("at step 1 (configure alpha): beta must connect; the actions were [")
                && failure.contains(r#"{"tag":"connect","val":"alpha"}"#),
            "{failure}"
        );
        assert_eq!(
            transcript.lines().count(),
            2,
            "init and one handle:\n{transcript}"
        );
        assert!(transcript.starts_with("{\"do\":\"init\",\"settings\":\"{}\"}\n"));
    }

    #[test]
    fn repeat_ends_on_stop_if_and_fails_with_its_else_when_it_never_does() {
        let repeat = |until: Predicate, otherwise: Option<&str>| Step::Repeat {
            times: 3,
            steps: vec![Step::Status, Step::StopIf { that: until }],
            otherwise: otherwise.map(str::to_string),
        };
        let connecting = state("alpha", ServerState::Connecting);
        let (outcome, transcript) = run(&[configure("alpha"), repeat(connecting, Some("never"))]);
        assert_eq!(outcome, Ok(()));
        assert_eq!(transcript.matches("\"do\":\"status\"").count(), 1);

        let parked = state("alpha", ServerState::Parked);
        let (outcome, transcript) = run(&[configure("alpha"), repeat(parked.clone(), None)]);
        assert_eq!(outcome, Ok(()), "without an else, running out is fine");
        assert_eq!(transcript.matches("\"do\":\"status\"").count(), 3);
        let (outcome, _) = run(&[configure("alpha"), repeat(parked, Some("never parked"))]);
        assert_eq!(
            outcome.unwrap_err(),
            "at step 1 (configure alpha): never parked"
        );
    }

    #[test]
    fn predicates_about_what_is_not_there_do_not_hold() {
        for that in [
            Predicate::Publishes("alpha".into()),
            Predicate::PublishesUsableNames("alpha".into()),
            Predicate::TimerArmed("alpha".into()),
            Predicate::RefusedNaming("alpha".into()),
        ] {
            let (outcome, _) = run(&[
                configure("alpha"),
                Step::Expect {
                    that: Predicate::Not(Box::new(that.clone())),
                    otherwise: format!("{that:?} held"),
                },
            ]);
            assert_eq!(outcome, Ok(()), "{that:?}");
        }
        let (outcome, _) = run(&[Step::Expect {
            that: state("ghost", ServerState::Parked),
            otherwise: "unreachable".into(),
        }]);
        assert!(
            outcome
                .unwrap_err()
                .contains("status() does not list ghost"),
            "a state of an unlisted server names it"
        );
    }

    fn expect(that: Predicate) -> Step {
        Step::Expect {
            otherwise: format!("{that:?}"),
            that,
        }
    }

    fn not(that: Predicate) -> Predicate {
        Predicate::Not(Box::new(that))
    }

    #[test]
    fn the_host_state_predicates_follow_what_is_shown_and_in_flight() {
        use crate::policy::types::{EventKind, Fault, ServerFault, SessionInfo, Tool};
        let alpha = || "alpha".to_string();
        let (outcome, _) = run(&[
            configure("alpha"),
            expect(Predicate::Attempting(alpha())),
            expect(not(Predicate::Published(alpha()))),
            Step::Event {
                kind: EventKind::Connected(SessionInfo {
                    server: alpha(),
                    server_info: "t".into(),
                    tools: vec![Tool {
                        name: "echo".into(),
                        description: None,
                        input_schema: "{}".into(),
                        extra: String::new(),
                        read_only: false,
                    }],
                }),
            },
            expect(not(Predicate::Attempting(alpha()))),
            expect(Predicate::Published(alpha())),
            expect(not(Predicate::Redundant(alpha()))),
            Step::Event {
                kind: EventKind::Disconnected(ServerFault {
                    server: alpha(),
                    fault: Fault::SessionExpired,
                }),
            },
            expect(not(Predicate::Published(alpha()))),
            expect(not(Predicate::Redundant(alpha()))),
        ]);
        assert_eq!(outcome, Ok(()));
        let (outcome, _) = run(&[configure("alpha"), expect(Predicate::Published(alpha()))]);
        assert!(
            outcome
                .unwrap_err()
                .ends_with("; the host holds publications of []"),
            "what it looked at"
        );
    }

    #[test]
    fn snapshot_restore_with_steps_runs_them_on_both_instances_from_the_same_host_state() {
        let steps = vec![
            Step::FireTimer {
                server: "alpha".into(),
                optional: true,
            },
            Step::Admit {
                server: "alpha".into(),
                tool: "t".into(),
                name: None,
            },
        ];
        let failed = Step::Event {
            kind: EventKind::ConnectFailed(crate::policy::types::ServerFault {
                server: "alpha".into(),
                fault: crate::policy::types::Fault::HandshakeTimedOut,
            }),
        };
        let (outcome, transcript) =
            run(&[configure("alpha"), failed, Step::SnapshotRestore { steps }]);
        assert_eq!(outcome, Ok(()));
        let lines: Vec<&str> = transcript.lines().collect();
        assert_eq!(lines.len(), 3 + 2 + 1 + 2, "{transcript}");
        assert_eq!(lines[5], r#"{"do":"snapshot-restore"}"#);
        // The same timer at the same time, the same call id: the host's state went back.
        assert_eq!(lines[3..5], lines[6..8]);
    }

    #[test]
    fn snapshot_restore_moves_the_state_and_twice_compares_whole_runs() {
        let twice = || Step::Twice {
            steps: vec![configure("beta"), Step::Status],
        };
        let (outcome, transcript) = run(&[
            twice(),
            configure("alpha"),
            Step::SnapshotRestore { steps: vec![] },
        ]);
        assert_eq!(outcome, Ok(()));
        let steps: Vec<&str> = transcript
            .lines()
            .map(|l| l.split('"').nth(3).unwrap())
            .collect();
        assert_eq!(
            steps,
            [
                "init",
                "handle",
                "status",
                "init",
                "handle",
                "status",
                "handle",
                "snapshot-restore"
            ]
        );
        // The second run's instance starts from `init`: state made before the block (alpha)
        // shows as a difference, which is how a policy that remembers across instances would.
        let (outcome, _) = run(&[configure("alpha"), twice()]);
        let failure = outcome.unwrap_err();
        assert!(
            failure.contains("the same inputs gave other outputs in a fresh instance (line 2"),
            "{failure}"
        );
    }
}
