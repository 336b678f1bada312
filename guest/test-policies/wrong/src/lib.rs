//! A deliberately wrong policy for `tether policy check`: it treats a bare handshake as a proven
//! session (the classic respawn-storm bug), so a server that initializes and dies at once is
//! never parked. Everything else is the default logic.

use tether_policy::Policy;
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{self, Event, EventKind};

struct TrustsHandshakes(Policy);

impl PolicyLogic for TrustsHandshakes {
    fn info() -> model::PolicyInfo {
        model::PolicyInfo {
            name: "wrong-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        Ok(Self(Policy::new(settings_json)?))
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        Ok(Self(Policy::restore(snapshot)?))
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        self.0.set_settings(settings_json)
    }

    fn handle(&mut self, event: Event) -> Vec<model::Action> {
        let proof = match &event.kind {
            EventKind::Connected(session) => Some(Event {
                now: event.now,
                kind: EventKind::KeepaliveOk(session.server.clone()),
            }),
            _ => None,
        };
        let mut actions = self.0.handle(event);
        if let Some(proof) = proof {
            actions.extend(self.0.handle(proof));
        }
        actions
    }

    fn admit(&mut self, request: model::CallRequest) -> model::Admission {
        self.0.admit(request)
    }

    fn status(&self, now: model::Millis) -> Vec<model::ServerStatus> {
        self.0.status_at(now)
    }

    fn take_over(&mut self, handover: model::Handover) -> Result<Vec<model::Action>, String> {
        self.0.take_over(handover)
    }

    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }

    fn take_logs(&mut self) -> Vec<(model::LogLevel, String)> {
        self.0.take_logs()
    }

    fn set_naming(&mut self, naming: model::Naming) {
        self.0.set_naming(naming)
    }

    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<model::NamedPrompt> {
        self.0.name_prompts(server, originals)
    }
}

tether_policy_sdk::export_policy_logic!(TrustsHandshakes);
