//! What a policy's answers may be. A policy is someone else's code: the host checks every
//! answer before acting on it, and refuses as invalid output what no correct policy produces.
//! The runtime checks with these, and so does the conformance suite, so that a component that
//! passes the check is not refused live.

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

/// Refuses a take-over's actions that would replace what the host keeps: a `connect` or
/// `disconnect` of a server whose session (or attempt) the handover said is live. Such a
/// policy would wait for a session event that never comes.
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
        None => check_actions(actions, ledger),
    }
}
