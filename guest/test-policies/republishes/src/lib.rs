//! A policy of another design than the default in what it tells the host about tools: it keeps
//! no memory of what the host shows. On every event it withdraws every configured server's
//! tools and publishes again those of each live session, as the default logic (which decides
//! everything else, and which tools under which names) would show them now.
//!
//! What agents see is always right, so it keeps the contract; it breaks the invariants about
//! quiet tool actions (a withdrawal of nothing, a republication of an unchanged list), which the
//! conformance tests assert exactly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tether_policy::Policy;
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{
    Action, Admission, CallRequest, Event, EventKind, Handover, LogLevel, Millis, NamedPrompt,
    Naming, PolicyInfo, Publication, ServerStatus,
};

struct Republishes {
    policy: Policy,
    state: Shown,
}

/// What the default logic would show: its publication per server, and the servers there are.
#[derive(Default, Serialize, Deserialize)]
struct Shown {
    configured: BTreeSet<String>,
    publications: BTreeMap<String, Publication>,
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    policy: Vec<u8>,
    state: Shown,
}

impl Republishes {
    /// The default's actions, with its tool actions replaced by the whole picture for every
    /// server in `servers`: withdrawn, and published again where there is something to show.
    fn rewrite(&mut self, actions: Vec<Action>, servers: &BTreeSet<String>) -> Vec<Action> {
        let mut out = Vec::new();
        for action in actions {
            match action {
                Action::PublishTools(publication) => {
                    self.state
                        .publications
                        .insert(publication.server.clone(), publication);
                }
                Action::WithdrawTools(server) => {
                    self.state.publications.remove(&server);
                }
                other => out.push(other),
            }
        }
        for server in servers {
            out.push(Action::WithdrawTools(server.clone()));
            if let Some(publication) = self.state.publications.get(server) {
                out.push(Action::PublishTools(publication.clone()));
            }
        }
        out
    }
}

impl PolicyLogic for Republishes {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "republishes-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        Ok(Self {
            policy: Policy::new(settings_json)?,
            state: Shown::default(),
        })
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        let snapshot: Snapshot = serde_json::from_slice(snapshot)
            .map_err(|e| format!("not a snapshot of this policy: {e}"))?;
        Ok(Self {
            policy: Policy::restore(&snapshot.policy)?,
            state: snapshot.state,
        })
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        self.policy.set_settings(settings_json)
    }

    fn handle(&mut self, event: Event) -> Vec<Action> {
        if let EventKind::ServerConfigured(config) = &event.kind {
            self.state.configured.insert(config.name.clone());
        }
        // A removed server is withdrawn once more, in the answer to its removal.
        let servers = self.state.configured.clone();
        if let EventKind::ServerRemoved(server) = &event.kind {
            self.state.configured.remove(server);
        }
        let actions = self.policy.handle(event);
        self.rewrite(actions, &servers)
    }

    fn admit(&mut self, request: CallRequest) -> Admission {
        self.policy.admit(request)
    }

    fn status(&self, now: Millis) -> Vec<ServerStatus> {
        self.policy.status_at(now)
    }

    fn snapshot(&self) -> Vec<u8> {
        let snapshot = Snapshot {
            policy: self.policy.snapshot(),
            state: Shown {
                configured: self.state.configured.clone(),
                publications: self.state.publications.clone(),
            },
        };
        serde_json::to_vec(&snapshot).expect("the state serializes")
    }

    fn take_over(&mut self, handover: Handover) -> Result<Vec<Action>, String> {
        let servers: BTreeSet<String> = handover
            .servers
            .iter()
            .map(|s| s.config.name.clone())
            .collect();
        let actions = self.policy.take_over(handover)?;
        self.state.configured = servers.clone();
        Ok(self.rewrite(actions, &servers))
    }

    fn take_logs(&mut self) -> Vec<(LogLevel, String)> {
        self.policy.take_logs()
    }

    fn set_naming(&mut self, naming: Naming) {
        self.policy.set_naming(naming)
    }

    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<NamedPrompt> {
        self.policy.name_prompts(server, originals)
    }
}

tether_policy_sdk::export_policy_logic!(Republishes);
