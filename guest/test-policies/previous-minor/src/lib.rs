//! A minimal policy built against tether:policy@0.2.0 (before `set-naming` and `name-prompts`),
//! to prove that a host speaking 0.2.1 still loads it, names its tools as it publishes them and
//! its prompts as 0.2.0 did. It connects every configured server, publishes every tool of a
//! session as `<server>__<tool>`, withdraws them when the session ends and allows every call.

#[allow(clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/0.2.0", world: "policy-component" });
}

use bindings::exports::tether::policy::policy::Guest;
use bindings::tether::policy::types::{
    Action, Admission, CallRequest, Event, EventKind, Handover, PolicyInfo, Publication,
    PublishedTool, ServerStatus, Tool,
};

struct PreviousMinor;

fn publish(server: &str, tools: &[Tool]) -> Action {
    Action::PublishTools(Publication {
        server: server.to_string(),
        tools: tools
            .iter()
            .map(|tool| PublishedTool {
                advertised: format!("{server}__{}", tool.name),
                original: tool.name.clone(),
                read_only: tool.read_only,
            })
            .collect(),
    })
}

impl Guest for PreviousMinor {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "previous-minor-test-policy".into(),
            version: "0.2.0".into(),
        }
    }
    fn init(_settings: String) -> Result<(), String> {
        Ok(())
    }
    fn set_settings(_settings: String) -> Result<(), String> {
        Ok(())
    }
    fn handle(event: Event) -> Vec<Action> {
        match event.kind {
            EventKind::ServerConfigured(config) => vec![Action::Connect(config.name)],
            EventKind::Connected(session) => vec![publish(&session.server, &session.tools)],
            EventKind::ToolsChanged(change) => vec![publish(&change.server, &change.tools)],
            EventKind::Disconnected(fault) | EventKind::ConnectFailed(fault) => {
                vec![Action::WithdrawTools(fault.server)]
            }
            EventKind::ServerRemoved(server) => vec![Action::WithdrawTools(server)],
            _ => Vec::new(),
        }
    }
    fn admit(_request: CallRequest) -> Admission {
        Admission::Allow
    }
    fn status(_now: u64) -> Vec<ServerStatus> {
        Vec::new()
    }
    fn snapshot() -> Vec<u8> {
        Vec::new()
    }
    fn restore(_snapshot: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
    fn take_over(handover: Handover) -> Result<Vec<Action>, String> {
        Ok(handover
            .servers
            .iter()
            .filter_map(|s| {
                let session = s.session.as_ref()?;
                Some(publish(&s.config.name, &session.tools))
            })
            .collect())
    }
}

bindings::export!(PreviousMinor with_types_in bindings);
