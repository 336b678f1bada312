//! The default policy as the SDK exports it (guest/default/component builds the component).

use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model;

use crate::Policy;

impl PolicyLogic for Policy {
    fn info() -> model::PolicyInfo {
        Policy::info()
    }
    fn create(settings_json: &str) -> Result<Self, String> {
        Policy::new(settings_json)
    }
    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        Policy::restore(snapshot)
    }
    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        Policy::set_settings(self, settings_json)
    }
    fn handle(&mut self, event: model::Event) -> Vec<model::Action> {
        Policy::handle(self, event)
    }
    fn admit(&mut self, request: model::CallRequest) -> model::Admission {
        Policy::admit(self, request)
    }
    fn status(&self, now: model::Millis) -> Vec<model::ServerStatus> {
        Policy::status_at(self, now)
    }
    fn snapshot(&self) -> Vec<u8> {
        Policy::snapshot(self)
    }
    fn take_over(&mut self, handover: model::Handover) -> Result<Vec<model::Action>, String> {
        Policy::take_over(self, handover)
    }
    fn take_logs(&mut self) -> Vec<(model::LogLevel, String)> {
        Policy::take_logs(self)
    }
    fn set_naming(&mut self, naming: model::Naming) {
        Policy::set_naming(self, naming)
    }
    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<model::NamedPrompt> {
        Policy::name_prompts(self, server, originals)
    }
    fn authorization_required(&mut self, server: &str, what_to_do: &str) {
        Policy::authorization_required(self, server, what_to_do)
    }
}
