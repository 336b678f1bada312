//! A candidate policy running beside the live one on the live inputs, acting on nothing, and
//! how its decisions compare.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use serde_json::Value;

use crate::policy::PolicyError;
use crate::policy::engine::LoadedPolicy;
use crate::policy::instance::PolicyInstance;
use crate::policy::ledger::Ledger;
use crate::policy::record::{Divergence, event_name, redact_actions};

use super::input::{Input, Output};
use super::reports::PolicyNotice;
use super::swap::{Prepared, SwapPath};

/// Fuel for one decision of a shadow policy (the default's take a few thousand units).
const SHADOW_FUEL: u64 = 50_000_000;

/// How a shadow policy's decisions compare with the live policy's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ShadowReport {
    /// Where the shadow policy came from (file path or other label).
    pub label: String,
    /// Its implementation name.
    pub name: String,
    /// Its implementation version.
    pub version: String,
    /// How it was given the live state.
    pub path: SwapPath,
    /// What it could not be given of the live state, in words for operators.
    pub not_carried: Vec<String>,
    /// Live decisions it made too (events and admissions).
    pub decisions: usize,
    /// Those it made differently.
    pub divergences: usize,
    /// Divergences by kind.
    pub by_kind: BTreeMap<String, usize>,
    /// The first divergence on each server (`recorded` is the live decision; `line` counts
    /// decisions since the shadow started).
    pub first_per_server: BTreeMap<String, Divergence>,
}

/// A candidate running beside the live policy.
pub(crate) struct Shadow {
    pub(crate) policy: Arc<LoadedPolicy>,
    instance: PolicyInstance,
    pub(crate) report: ShadowReport,
}

impl Shadow {
    /// The candidate `policy`, given the live state (`prepared` as a swap would).
    pub(crate) fn start(policy: Arc<LoadedPolicy>, prepared: Prepared) -> Self {
        let Prepared {
            instance, report, ..
        } = prepared;
        Self {
            report: ShadowReport {
                label: policy.label().to_string(),
                name: report.info.name,
                version: report.info.version,
                path: report.path,
                not_carried: report.not_carried,
                decisions: 0,
                divergences: 0,
                by_kind: BTreeMap::new(),
                first_per_server: BTreeMap::new(),
            },
            policy,
            instance,
        }
    }

    /// Decides the input the live policy just decided (`live`), and compares: the notice of a
    /// server's first divergence, if this is one. An error means the candidate failed (it
    /// looped, trapped or a host function panicked under it) and is to be dropped.
    pub(crate) fn follow(
        &mut self,
        input: &Input,
        live: &Output,
        ledger: &Ledger,
    ) -> Result<Option<PolicyNotice>, PolicyError> {
        if !matches!(
            input,
            Input::Event(_) | Input::Admit(_) | Input::Settings(_)
        ) {
            return Ok(None);
        }
        let lookup = |server: &str, original: &str| ledger.tool(server, original);
        let instance = &mut self.instance;
        // A small budget, and panics caught: a candidate that loops or breaks is dropped
        // without holding up the live policy for long.
        let decided = std::panic::catch_unwind(AssertUnwindSafe(|| {
            instance.with_fuel(SHADOW_FUEL, |instance| match (input, live) {
                (Input::Event(event), Output::Actions(live)) => {
                    instance.handle_with(event, &lookup).map(|mut actions| {
                        let mut live = live.clone();
                        redact_actions(&mut live);
                        redact_actions(&mut actions);
                        let server = event.kind.server().unwrap_or("(all)").to_string();
                        let kind = format!("{} actions", event_name(&event.kind));
                        (server, kind, to_value(&live), to_value(&actions))
                    })
                }
                (Input::Admit(request), Output::Admission(live)) => {
                    instance.admit(request).map(|admission| {
                        (
                            request.server.clone(),
                            "admission".to_string(),
                            to_value(live),
                            to_value(&admission),
                        )
                    })
                }
                (Input::Settings(settings), _) => instance
                    .set_settings(settings)
                    .map(|()| (String::new(), String::new(), Value::Null, Value::Null)),
                _ => Ok((String::new(), String::new(), Value::Null, Value::Null)),
            })
        }))
        .unwrap_or_else(|_| {
            Err(PolicyError::Engine(
                "a host function panicked under the shadow policy".into(),
            ))
        });
        let (server, kind, live, candidate) = decided?;
        if matches!(input, Input::Settings(_)) {
            return Ok(None);
        }
        let report = &mut self.report;
        report.decisions += 1;
        if live == candidate {
            return Ok(None);
        }
        report.divergences += 1;
        *report.by_kind.entry(kind.clone()).or_default() += 1;
        if report.first_per_server.contains_key(&server) {
            return Ok(None);
        }
        let divergence = Divergence {
            line: report.decisions,
            server: server.clone(),
            kind: kind.clone(),
            recorded: live,
            candidate,
        };
        report.first_per_server.insert(server.clone(), divergence);
        let policy = report.label.clone();
        tracing::info!(shadow = %policy, server = %server, "the shadow policy decided otherwise ({kind})");
        Ok(Some(PolicyNotice::ShadowDiverged {
            policy,
            server,
            decision: kind,
        }))
    }
}

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}
