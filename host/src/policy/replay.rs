//! Replaying a recording (see [`super::record`]) through a candidate policy: the candidate is
//! fed the recorded inputs in order and its decisions are compared with the recorded ones.

use std::collections::BTreeMap;

use serde::Serialize;

use super::PolicyError;
use super::engine::PolicySource;
use super::record::{Divergence, Record, event_name, initial_settings, redact_actions};
use super::runtime::{PolicyRuntime, RuntimeOptions};

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Decisions replayed (events and admissions).
    pub decisions: usize,
    /// Decisions the candidate made differently.
    pub divergences: usize,
    /// Divergences by kind.
    pub by_kind: BTreeMap<String, usize>,
    /// The first divergence on each server (later ones may be its consequences).
    pub first_per_server: BTreeMap<String, Divergence>,
    /// Policies the recording changed to (swaps, fallbacks) after its start.
    pub policy_changes: usize,
}

/// Replays `records` (as [`super::record::read`] gives them) through the policy `candidate`,
/// started with `settings` or else with the settings the recording started with, and compares
/// its decisions with the recorded ones. A candidate that fails is not replaced by the default
/// policy: its failure is the answer.
pub fn replay(
    records: &[(usize, Record)],
    candidate: PolicySource,
    settings: Option<String>,
) -> Result<ReplayReport, ReplayError> {
    let settings = settings
        .or_else(|| initial_settings(records).map(str::to_string))
        .unwrap_or_else(|| "{}".to_string());
    let runtime = PolicyRuntime::start(RuntimeOptions {
        source: candidate,
        settings,
        fallback_to_default: false,
        ..RuntimeOptions::default()
    })
    .map_err(ReplayError::Start)?;
    run(records, &runtime).map_err(ReplayError::Failed)
}

/// Why a replay did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The candidate could not start: not loaded, not compiled, or its settings refused.
    #[error("{0}")]
    Start(PolicyError),
    /// The candidate failed during the replay.
    #[error("the candidate failed during the replay: {0}")]
    Failed(PolicyError),
}

/// Feeds a recording's inputs to `candidate`, in order, and compares its decisions with the
/// recorded ones. `candidate` should start as the recording did (same settings).
pub(crate) fn run(
    records: &[(usize, Record)],
    candidate: &PolicyRuntime,
) -> Result<ReplayReport, PolicyError> {
    let mut report = ReplayReport::default();
    let mut seen_policy = false;
    for (line, record) in records {
        let (server, kind, recorded, decided) = match record {
            Record::Policy { .. } => {
                report.policy_changes += usize::from(seen_policy);
                seen_policy = true;
                continue;
            }
            Record::Settings { settings } => {
                candidate.set_settings(settings.clone()).wait()?;
                continue;
            }
            Record::Event { event, actions } => {
                let mut decided = candidate.handle(event.clone()).wait()?;
                redact_actions(&mut decided);
                let server = event.kind.server().unwrap_or("(all)").to_string();
                let kind = format!("{} actions", event_name(&event.kind));
                (server, kind, to_value(actions), to_value(&decided))
            }
            Record::Admit { request, admission } => {
                let decided = candidate.admit(request.clone()).wait()?;
                let kind = "admission".to_string();
                (
                    request.server.clone(),
                    kind,
                    to_value(admission),
                    to_value(&decided),
                )
            }
        };
        report.decisions += 1;
        if recorded == decided {
            continue;
        }
        report.divergences += 1;
        *report.by_kind.entry(kind.clone()).or_default() += 1;
        report
            .first_per_server
            .entry(server.clone())
            .or_insert(Divergence {
                line: *line,
                server,
                kind,
                recorded,
                candidate: decided,
            });
    }
    Ok(report)
}

fn to_value(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}
