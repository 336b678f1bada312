//! A second policy implementation for swap tests: the default decisions, but its own name and
//! its own state format (a versioned binary envelope the default cannot read, and which it
//! refuses the default's snapshots in). Swapping between it and the default must go through the
//! contract's handover, never through each other's snapshots.

use tether_policy::Policy;
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model;

/// The first bytes of this policy's snapshots.
const MAGIC: &[u8] = b"OTHER-POLICY\x00\x01";

struct Other(Policy);

impl PolicyLogic for Other {
    fn info() -> model::PolicyInfo {
        model::PolicyInfo {
            name: "other-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        Ok(Self(Policy::new(settings_json)?))
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        let inner = snapshot
            .strip_prefix(MAGIC)
            .ok_or("not an other-test-policy snapshot")?;
        let inner: Vec<u8> = inner.iter().map(|b| b ^ 0x5a).collect();
        Ok(Self(Policy::restore(&inner)?))
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        self.0.set_settings(settings_json)
    }

    fn handle(&mut self, event: model::Event) -> Vec<model::Action> {
        self.0.handle(event)
    }

    fn admit(&mut self, request: model::CallRequest) -> model::Admission {
        self.0.admit(request)
    }

    fn status(&self, now: model::Millis) -> Vec<model::ServerStatus> {
        self.0.status_at(now)
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(self.0.snapshot().iter().map(|b| b ^ 0x5a));
        out
    }

    fn take_over(&mut self, handover: model::Handover) -> Result<Vec<model::Action>, String> {
        self.0.take_over(handover)
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

tether_policy_sdk::export_policy_logic!(Other);
