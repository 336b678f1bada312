//! Moving the live state into another policy: by snapshot between builds of one implementation,
//! otherwise by a handover of what the host knows plus what the outgoing policy reports
//! ([`SwapPath`]). Live sessions are kept either way.

use std::sync::Arc;

use crate::policy::engine::LoadedPolicy;
use crate::policy::instance::{Limits, PolicyInstance};
use crate::policy::ledger::Ledger;
use crate::policy::outputs::{check_actions, check_take_over};
use crate::policy::types::{Action, BreakerState, Millis, PolicyInfo, ServerState, ServerStatus};
use crate::policy::{PolicyError, PolicyFault};

/// How a swap moved the state into the incoming policy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SwapPath {
    /// Same implementation: its own snapshot, which carries everything.
    Snapshot,
    /// Another implementation of contract 0.2: `take-over` of the handover.
    Handover,
    /// A contract 0.1 policy: taught the servers and live sessions as events.
    Events,
}

/// What a swap did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SwapReport {
    /// The incoming policy.
    pub info: PolicyInfo,
    /// How the state was moved into it.
    pub path: SwapPath,
    /// What the incoming policy could not be given, in words for operators.
    pub not_carried: Vec<String>,
    /// What the incoming policy asked the host to do (publications, timers); the caller
    /// executes them. Never a `connect` or `disconnect` of a live session.
    #[serde(skip)]
    pub actions: Vec<Action>,
}

/// An incoming policy, ready to take over.
pub(crate) struct Prepared {
    pub(crate) instance: PolicyInstance,
    pub(crate) settings: String,
    pub(crate) report: SwapReport,
}

/// The policy that runs now, as a swap reads it.
pub(crate) struct Outgoing<'a> {
    pub(crate) policy: &'a LoadedPolicy,
    pub(crate) instance: &'a mut PolicyInstance,
    pub(crate) settings: &'a str,
    /// What the host knows of the servers.
    pub(crate) ledger: &'a Ledger,
    /// Restores the outgoing policy's last good state into an instance of the same
    /// implementation (see [`super::journal::LastGood::restore_into`]).
    pub(crate) restore: &'a dyn Fn(&mut PolicyInstance) -> Result<(), PolicyError>,
}

/// An instance of `policy` in the outgoing policy's state at `now`, and the actions that make
/// the host match it. Changes nothing of the outgoing policy's state.
pub(crate) fn prepare(
    policy: &Arc<LoadedPolicy>,
    limits: &Limits,
    outgoing: Outgoing<'_>,
    now: Millis,
) -> Result<Prepared, PolicyError> {
    let Outgoing {
        policy: outgoing_policy,
        instance: outgoing_instance,
        settings: outgoing_settings,
        ledger,
        restore,
    } = outgoing;
    let outgoing_info = outgoing_instance.info().ok();
    let mut not_carried = Vec::new();
    let fresh = |settings: &str| -> Result<PolicyInstance, PolicyError> {
        let mut instance = PolicyInstance::instantiate(policy, limits)?;
        instance.init(settings)?;
        Ok(instance)
    };
    // Another implementation's settings need not suit it: then it runs on its defaults.
    let (mut incoming, settings) = match fresh(outgoing_settings) {
        Ok(instance) => (instance, outgoing_settings.to_string()),
        Err(refused @ PolicyError::Refused { .. }) => {
            not_carried.push(format!(
                "the settings ({refused}): it runs on its default settings"
            ));
            (fresh("{}")?, "{}".to_string())
        }
        Err(error) => return Err(error),
    };
    let info = incoming.info()?;
    let same_implementation = outgoing_info.as_ref().is_some_and(|o| o.name == info.name)
        && policy.contract() == outgoing_policy.contract()
        && settings == outgoing_settings;
    let mut path = None;
    if same_implementation {
        match restore(&mut incoming) {
            Ok(()) => path = Some(SwapPath::Snapshot),
            // A build of the same implementation with another state format: hand over.
            Err(refused @ PolicyError::Refused { .. }) => {
                tracing::warn!("{refused}; handing the state over instead");
                incoming = fresh(&settings)?;
            }
            Err(error) => return Err(error),
        }
    }
    let mut actions = Vec::new();
    let path = match path {
        Some(path) => path,
        None => {
            // A failing outgoing policy cannot report: the host's own knowledge still goes.
            let status = outgoing_instance.status(now).unwrap_or_else(|error| {
                not_carried.push(format!("the outgoing policy's view ({error})"));
                Vec::new()
            });
            let previous = outgoing_info.unwrap_or_else(|| PolicyInfo {
                name: outgoing_policy.label().to_string(),
                version: String::new(),
            });
            let lookup = |server: &str, original: &str| ledger.tool(server, original);
            let path = if incoming.can_take_over() {
                let handover = ledger.handover(now, &status, previous);
                actions = incoming.take_over(&handover, &lookup)?;
                check_take_over(&actions, ledger)
                    .map_err(|why| policy.fault("take-over", PolicyFault::InvalidOutput(why)))?;
                SwapPath::Handover
            } else {
                for event in ledger.lessons(now, &status) {
                    actions.extend(incoming.handle_with(&event, &lookup)?);
                }
                not_carried.extend(unteachable(&status, ledger));
                SwapPath::Events
            };
            actions = keep_sessions(actions, ledger, &mut not_carried);
            check_actions(&actions, ledger)
                .map_err(|why| policy.fault("take-over", PolicyFault::InvalidOutput(why)))?;
            path
        }
    };
    Ok(Prepared {
        instance: incoming,
        settings,
        report: SwapReport {
            info,
            path,
            not_carried,
            actions,
        },
    })
}

/// Hands what the host knows (and what the failing policy can still report) to `incoming`,
/// a contract 0.2 policy replacing the failing one named `from`; the actions it asks for, live
/// sessions kept.
pub(crate) fn hand_over_from_failing(
    incoming: &mut PolicyInstance,
    failing: &mut PolicyInstance,
    from: &str,
    ledger: &Ledger,
    now: Millis,
) -> Result<Vec<Action>, PolicyError> {
    let status = failing.status(now).unwrap_or_default();
    let previous = PolicyInfo {
        name: from.to_string(),
        version: String::new(),
    };
    let handover = ledger.handover(now, &status, previous);
    let actions =
        incoming.take_over(&handover, &|server, original| ledger.tool(server, original))?;
    Ok(keep_sessions(actions, ledger, &mut Vec::new()))
}

/// Drops an incoming policy's `connect`s and `disconnect`s of servers whose session (or attempt
/// in flight) the host keeps across a swap, noting any that were not just a fresh start.
fn keep_sessions(actions: Vec<Action>, ledger: &Ledger, notes: &mut Vec<String>) -> Vec<Action> {
    actions
        .into_iter()
        .filter(|action| match action {
            Action::Connect(server) => !ledger.is_live(server),
            Action::Disconnect(server) if ledger.is_live(server) => {
                notes.push(format!(
                    "{server}: the incoming policy asked to disconnect its live session; it was kept"
                ));
                false
            }
            _ => true,
        })
        .collect()
}

/// What a policy that knows no handover (contract 0.1) cannot learn from events: per server,
/// the outgoing policy's counts, breaker and parking, in words.
fn unteachable(status: &[ServerStatus], ledger: &Ledger) -> Vec<String> {
    let mut notes = Vec::new();
    for s in status {
        let mut lost = Vec::new();
        if s.state == ServerState::Parked {
            lost.push("parked (it is tried again now)".to_string());
        }
        if s.breaker != BreakerState::Closed {
            lost.push(format!("breaker {:?}", s.breaker).to_lowercase());
        }
        if s.failures > 0 {
            lost.push(format!("{} failed attempts", s.failures));
        }
        if s.breaker_failures > 0 {
            lost.push(format!("{} breaker failures", s.breaker_failures));
        }
        if !lost.is_empty() && ledger.is_configured(&s.server) {
            notes.push(format!(
                "{}: {} (contract 0.1 knows no handover)",
                s.server,
                lost.join(", ")
            ));
        }
    }
    notes
}
