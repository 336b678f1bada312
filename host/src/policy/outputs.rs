//! What a policy's answers may be. A policy is someone else's code: the host checks every
//! answer before acting on it, and refuses as invalid output what no correct policy produces.
//! An event and an admission take one checked path (`PolicyInstance::decide_event` and
//! `decide_admission`), which the runtime and the conformance suite both use, so that a
//! component that passes the check is not refused live.

use super::ledger::Ledger;
use super::types::{Action, Admission};

/// The longest message for the model a policy may produce.
const MAX_MESSAGE: usize = 4096;

/// The longest a policy may hold a call (the call's own deadline usually ends it sooner).
const MAX_HOLD_MS: u64 = 60_000;

pub(crate) fn check_admission(admission: &Admission) -> Result<(), String> {
    if let Admission::Hold(hold) = admission
        && hold.wait_ms > MAX_HOLD_MS
    {
        return Err(format!(
            "held a call for {} ms (limit {MAX_HOLD_MS})",
            hold.wait_ms
        ));
    }
    match admission {
        Admission::Reject(message)
        | Admission::Reconnect(message)
        | Admission::Hold(super::types::Hold { message, .. }) => {
            if message.trim().is_empty() {
                Err("a refusal without a message for the model".into())
            } else if message.len() > MAX_MESSAGE {
                Err(format!(
                    "a refusal message of {} bytes (limit {MAX_MESSAGE})",
                    message.len()
                ))
            } else {
                Ok(())
            }
        }
        Admission::Allow | Admission::Probe => Ok(()),
    }
}

/// Refuses action lists no correct policy produces: actions about servers the host never
/// configured, and tool names agents could not use or could confuse.
pub(crate) fn check_actions(actions: &[Action], ledger: &Ledger) -> Result<(), String> {
    let is_known = |server: &str| ledger.is_configured(server);
    for action in actions {
        let server = match action {
            Action::Connect(s) | Action::Disconnect(s) | Action::WithdrawTools(s) => s,
            Action::WakeAt(wake) => &wake.server,
            Action::StateChanged(change) => &change.server,
            Action::PublishTools(publication) => {
                let mut names = std::collections::HashSet::new();
                for tool in &publication.tools {
                    if !valid_tool_name(&tool.advertised) {
                        return Err(format!(
                            "published an unusable tool name {:?}",
                            truncate(&tool.advertised)
                        ));
                    }
                    if tool.original.is_empty() {
                        return Err(format!(
                            "published {} without its original name",
                            tool.advertised
                        ));
                    }
                    if !names.insert(tool.advertised.as_str()) {
                        return Err(format!("published {} twice", tool.advertised));
                    }
                }
                &publication.server
            }
        };
        if !is_known(server) {
            return Err(format!(
                "acted on a server the host never configured: {:?}",
                truncate(server)
            ));
        }
    }
    Ok(())
}

pub(crate) fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn truncate(text: &str) -> String {
    text.chars().take(80).collect()
}

/// The rule particular to a take-over's actions (`check_actions` applies as well): no
/// `connect` or `disconnect` of a server whose session (or attempt) the handover said is live.
/// Such a policy would wait for a session event that never comes.
pub(crate) fn check_take_over(actions: &[Action], ledger: &Ledger) -> Result<(), String> {
    let replaced = actions.iter().find_map(|action| match action {
        Action::Connect(server) | Action::Disconnect(server) if ledger.is_live(server) => {
            Some(server)
        }
        _ => None,
    });
    match replaced {
        Some(server) => Err(format!(
            "asked to connect or disconnect {server:?}, whose session (or attempt) the host keeps"
        )),
        None => Ok(()),
    }
}

/// Refuses prompt names no correct policy gives (contract 0.2.1 `name-prompts`): unusable or
/// duplicate advertised names, and originals it was not asked about or named twice.
pub(crate) fn check_prompt_names(
    originals: &[String],
    named: &[super::types::NamedPrompt],
) -> Result<(), String> {
    let asked: std::collections::HashSet<&str> = originals.iter().map(String::as_str).collect();
    let mut advertised = std::collections::HashSet::new();
    let mut seen = std::collections::HashSet::new();
    for prompt in named {
        if !valid_tool_name(&prompt.advertised) {
            return Err(format!(
                "named a prompt with an unusable name {:?}",
                truncate(&prompt.advertised)
            ));
        }
        if !asked.contains(prompt.original.as_str()) {
            return Err(format!(
                "named a prompt it was not asked about: {:?}",
                truncate(&prompt.original)
            ));
        }
        if !seen.insert(prompt.original.as_str()) {
            return Err(format!(
                "named prompt {:?} twice",
                truncate(&prompt.original)
            ));
        }
        if !advertised.insert(prompt.advertised.as_str()) {
            return Err(format!("gave two prompts the name {}", prompt.advertised));
        }
    }
    Ok(())
}
