//! The default policy with one rule of the contract broken, to prove the conformance suite
//! notices: for every contract scenario there is a mutation that breaks its rule and nothing
//! else, and the suite must fail that scenario and no other (docs/CONFORMANCE.md has the
//! table). The settings' `"mutant"` names the mutation; the rest goes to the default logic.
//!
//! The mutation lives in the instance (the host gives a restored instance the same settings
//! first, as it gives them to every fresh one).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tether_policy::Policy;
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{
    Action, Admission, CallRequest, Event, EventKind, Fault, Handover, LogLevel, Millis,
    NamedPrompt, Naming, PolicyInfo, ServerFault, ServerStatus,
};

/// Each mutation, by its name in the settings, with the contract rule it breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    None,
    /// Advertises `<server>__<tool>` as it is, however unusable: `session-publishes-usable-tool-names`.
    UnsanitizedNames,
    /// Leaves a dead session's tools shown: `lost-session-withdraws-its-tools`.
    KeepsToolsOfLostSessions,
    /// Leaves a removed server's tools shown: `removal-withdraws-and-forgets`.
    KeepsToolsOfRemovedServers,
    /// Leaves every tool shown at shutdown: `shutdown-withdraws-every-server`.
    KeepsToolsOnShutdown,
    /// Never hears that a server's tools changed: `changed-tools-are-republished`.
    IgnoresToolChanges,
    /// Publishes every tool, whatever the include and exclude globs: `include-and-exclude-filter-tools`.
    IgnoresFilters,
    /// Adds jitter seeded from the sandbox's randomness at start: `decisions-are-deterministic`.
    OsSeededJitter,
    /// Snapshots its inputs but not the calls' outcomes: `state-survives-snapshot-and-restore`.
    RestoreForgetsCalls,
    /// Adopts a handover's servers but forgets their live sessions:
    /// `takes-over-another-policy-keeping-sessions`.
    TakesOverWithoutSessions,
    /// Names everything its own way, whatever the operator said: `names-follow-the-operators-naming`.
    IgnoresNaming,
}

/// Every mutation by name (the test asserts what each one trips).
const MUTATIONS: [(&str, Mutation); 10] = [
    ("unsanitized-names", Mutation::UnsanitizedNames),
    (
        "keeps-tools-of-lost-sessions",
        Mutation::KeepsToolsOfLostSessions,
    ),
    (
        "keeps-tools-of-removed-servers",
        Mutation::KeepsToolsOfRemovedServers,
    ),
    ("keeps-tools-on-shutdown", Mutation::KeepsToolsOnShutdown),
    ("ignores-tool-changes", Mutation::IgnoresToolChanges),
    ("ignores-filters", Mutation::IgnoresFilters),
    ("os-seeded-jitter", Mutation::OsSeededJitter),
    ("restore-forgets-calls", Mutation::RestoreForgetsCalls),
    (
        "takes-over-without-sessions",
        Mutation::TakesOverWithoutSessions,
    ),
    ("ignores-naming", Mutation::IgnoresNaming),
];

thread_local! {
    static MUTATION: Cell<Mutation> = const { Cell::new(Mutation::None) };
}

fn mutation() -> Mutation {
    MUTATION.with(Cell::get)
}

/// Splits the `mutant` key off the settings, remembering the mutation.
fn take_mutation(settings: &str) -> Result<String, String> {
    let mut value: Value = if settings.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(settings).map_err(|e| e.to_string())?
    };
    let chosen = match value.as_object_mut().and_then(|o| o.remove("mutant")) {
        None => Mutation::None,
        Some(Value::String(name)) => MUTATIONS
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, m)| *m)
            .ok_or_else(|| format!("unknown mutant {name:?}"))?,
        Some(other) => return Err(format!("mutant must be a name, not {other}")),
    };
    MUTATION.with(|m| m.set(chosen));
    Ok(value.to_string())
}

/// What `restore-forgets-calls` keeps instead of a snapshot: its inputs, but no call outcomes.
#[derive(Clone, Serialize, Deserialize)]
enum Input {
    Event(Event),
    Naming(Naming),
    TakeOver(Handover),
}

#[derive(Serialize, Deserialize)]
struct Saved {
    policy: Vec<u8>,
    seed: u64,
    named: BTreeSet<String>,
    settings: String,
    journal: Option<Vec<Input>>,
}

struct Mutant {
    policy: Policy,
    /// `os-seeded-jitter`: drawn from the sandbox's randomness when the instance starts.
    seed: u64,
    /// Servers the operator named (`unsanitized-names` leaves them alone).
    named: BTreeSet<String>,
    settings: String,
    journal: Vec<Input>,
}

impl Mutant {
    fn new(policy: Policy, settings: String) -> Self {
        let seed = if mutation() == Mutation::OsSeededJitter {
            // std seeds its hashers from the host's randomness.
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u8(0);
            hasher.finish()
        } else {
            0
        };
        Self {
            policy,
            seed,
            named: BTreeSet::new(),
            settings,
            journal: Vec::new(),
        }
    }

    fn note(&mut self, input: Input) {
        if mutation() == Mutation::RestoreForgetsCalls {
            self.journal.push(input);
        }
    }

    /// Applies the mutation to the actions answering `event` (or a take-over: `None`).
    fn mutate(&self, event: Option<&EventKind>, mut actions: Vec<Action>) -> Vec<Action> {
        let drop_withdrawals = matches!(
            (mutation(), event),
            (
                Mutation::KeepsToolsOfLostSessions,
                Some(EventKind::Disconnected(_))
            ) | (
                Mutation::KeepsToolsOfRemovedServers,
                Some(EventKind::ServerRemoved(_))
            ) | (Mutation::KeepsToolsOnShutdown, Some(EventKind::Shutdown))
        );
        if drop_withdrawals {
            actions.retain(|a| !matches!(a, Action::WithdrawTools(_)));
        }
        for action in &mut actions {
            match (mutation(), action) {
                (Mutation::UnsanitizedNames, Action::PublishTools(publication))
                    if !self.named.contains(&publication.server) =>
                {
                    for tool in &mut publication.tools {
                        tool.advertised = format!("{}__{}", publication.server, tool.original);
                    }
                }
                (Mutation::OsSeededJitter, Action::WakeAt(wake)) => {
                    wake.at = wake.at.saturating_add(self.seed % 1_000);
                }
                _ => {}
            }
        }
        actions
    }
}

impl PolicyLogic for Mutant {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "mutant-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        let settings = take_mutation(settings_json)?;
        Ok(Self::new(Policy::new(&settings)?, settings))
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        let saved: Saved = serde_json::from_slice(snapshot)
            .map_err(|e| format!("not a snapshot of this policy: {e}"))?;
        let mut restored = match &saved.journal {
            // The inputs again, in order, on a fresh policy: all but the calls' outcomes.
            Some(journal) => {
                let mut policy = Policy::new(&saved.settings)?;
                for input in journal.iter().cloned() {
                    match input {
                        Input::Event(event) => {
                            policy.handle(event);
                        }
                        Input::Naming(naming) => policy.set_naming(naming),
                        Input::TakeOver(handover) => {
                            policy.take_over(handover)?;
                        }
                    }
                }
                let mut restored = Self::new(policy, saved.settings);
                restored.journal = journal.clone();
                restored
            }
            None => Self::new(Policy::restore(&saved.policy)?, saved.settings),
        };
        restored.seed = saved.seed;
        restored.named = saved.named;
        Ok(restored)
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        let settings = take_mutation(settings_json)?;
        self.policy.set_settings(&settings)?;
        self.settings = settings;
        Ok(())
    }

    fn handle(&mut self, mut event: Event) -> Vec<Action> {
        match (mutation(), &mut event.kind) {
            (Mutation::IgnoresToolChanges, EventKind::ToolsChanged(_)) => return Vec::new(),
            (Mutation::IgnoresFilters, EventKind::ServerConfigured(config)) => {
                config.include.clear();
                config.exclude.clear();
            }
            _ => {}
        }
        if !matches!(event.kind, EventKind::CallFinished(_)) {
            self.note(Input::Event(event.clone()));
        }
        let kind = event.kind.clone();
        let actions = self.policy.handle(event);
        self.mutate(Some(&kind), actions)
    }

    fn admit(&mut self, request: CallRequest) -> Admission {
        self.policy.admit(request)
    }

    fn status(&self, now: Millis) -> Vec<ServerStatus> {
        self.policy.status_at(now)
    }

    fn snapshot(&self) -> Vec<u8> {
        let forgetful = mutation() == Mutation::RestoreForgetsCalls;
        let saved = Saved {
            policy: if forgetful {
                Vec::new()
            } else {
                self.policy.snapshot()
            },
            seed: self.seed,
            named: self.named.clone(),
            settings: self.settings.clone(),
            journal: forgetful.then(|| self.journal.clone()),
        };
        serde_json::to_vec(&saved).expect("the state serializes")
    }

    fn take_over(&mut self, handover: Handover) -> Result<Vec<Action>, String> {
        self.note(Input::TakeOver(handover.clone()));
        let live: Vec<String> = handover
            .servers
            .iter()
            .filter(|s| s.session.is_some())
            .map(|s| s.config.name.clone())
            .collect();
        let now = handover.now;
        let actions = self.policy.take_over(handover)?;
        if mutation() == Mutation::TakesOverWithoutSessions {
            // Their tools stay published, but the policy believes them gone.
            for server in live {
                let forgotten = EventKind::Disconnected(ServerFault {
                    server,
                    fault: Fault::TransportClosed("not adopted".into()),
                });
                self.policy.handle(Event {
                    now,
                    kind: forgotten,
                });
            }
        }
        Ok(self.mutate(None, actions))
    }

    fn take_logs(&mut self) -> Vec<(LogLevel, String)> {
        self.policy.take_logs()
    }

    fn set_naming(&mut self, naming: Naming) {
        if mutation() == Mutation::IgnoresNaming {
            return;
        }
        self.note(Input::Naming(naming.clone()));
        match &naming.prefix {
            Some(_) => self.named.insert(naming.server.clone()),
            None => self.named.remove(&naming.server),
        };
        self.policy.set_naming(naming)
    }

    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<NamedPrompt> {
        self.policy.name_prompts(server, originals)
    }
}

tether_policy_sdk::export_policy_logic!(Mutant);
