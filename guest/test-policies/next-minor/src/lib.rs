//! A minimal policy built against tether:policy@0.1.1 (0.1.0 plus an additive function), to
//! prove that a host speaking 0.1.0 loads components of a newer compatible minor version.
//! It connects every configured server and allows every call; it keeps no other state.

#[allow(clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "policy-component" });
}

use bindings::exports::tether::policy::policy::Guest;
use bindings::tether::policy::types::{
    Action, Admission, CallRequest, Event, EventKind, PolicyInfo, ServerStatus,
};

struct NextMinor;

impl Guest for NextMinor {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "next-minor-test-policy".into(),
            version: "0.1.1".into(),
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
            _ => Vec::new(),
        }
    }
    fn admit(_request: CallRequest) -> Admission {
        Admission::Allow
    }
    fn status() -> Vec<ServerStatus> {
        Vec::new()
    }
    fn snapshot() -> Vec<u8> {
        Vec::new()
    }
    fn restore(_snapshot: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
    fn describe() -> String {
        "connects everything, allows everything".into()
    }
}

bindings::export!(NextMinor with_types_in bindings);
