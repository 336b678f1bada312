//! Every server's state and the running policy, as [`crate::Tether::status`] gives them and the
//! admin API's `GET /status` sends them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::policy::{BreakerState, PolicyRuntime, ServerState, TransportKind};
use crate::supervisor::Supervisor;

/// `GET /status`: the running policy and every server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Status {
    /// The policy deciding now.
    pub policy: RunningPolicy,
    /// Every supervised server, by name.
    pub servers: Vec<ServerRow>,
}

/// The policy deciding now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunningPolicy {
    /// A name for the component (its file name, or `embedded`).
    pub label: String,
    /// The name the policy gives itself.
    pub name: String,
    /// The version the policy gives itself.
    pub version: String,
    /// The contract line it implements (`0.2`).
    pub contract: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// Its settings: the JSON object, or the text when it is not JSON.
    pub settings: serde_json::Value,
}

/// One server: the host's view merged with the policy's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerRow {
    /// The server's name in the config.
    pub name: String,
    /// Its state.
    pub state: ServerState,
    /// How it is reached.
    pub transport: TransportKind,
    /// The child's process id (stdio servers that run).
    pub pid: Option<u32>,
    /// Tools it has published.
    pub tools: usize,
    /// The policy's breaker for it (absent when the policy does not know the server).
    pub breaker: Option<BreakerState>,
    /// Consecutive failures the policy counts.
    pub failures: Option<u32>,
    /// Failures counted toward the breaker.
    pub breaker_failures: Option<u32>,
    /// Tool calls that ended in an error.
    pub tool_errors: Option<u32>,
    /// The last fault, as the policy tells it (the host's account when the policy has none).
    pub last_fault: Option<String>,
    /// When the state was entered (RFC 3339).
    pub since: String,
    /// What the state means now, in words.
    pub detail: String,
    /// Connection attempts started, the first included.
    pub reconnects: u64,
    /// Times the server was parked.
    pub parks: u64,
    /// What of its offer agents cannot see although its filters allow it: tools the policy
    /// withholds (with the default policy: another tool or server claims the same name) and
    /// prompts whose name another prompt claims, as `tool NAME` and `prompt NAME`.
    #[serde(default)]
    pub withheld: Vec<String>,
}

impl Status {
    /// The status of `supervisor`'s servers and policy now.
    pub(crate) async fn collect(supervisor: &Supervisor) -> Self {
        let statuses = supervisor.policy_status().await;
        let servers = supervisor
            .views()
            .into_iter()
            .map(|view| {
                let status = statuses.iter().find(|s| s.server == view.name);
                let withheld = withheld(supervisor, &view);
                ServerRow {
                    withheld,
                    tools: supervisor.registry().server_tools(&view.name).len(),
                    breaker: status.map(|s| s.breaker),
                    failures: status.map(|s| s.failures),
                    breaker_failures: status.map(|s| s.breaker_failures),
                    tool_errors: status.map(|s| s.tool_errors),
                    // The policy's account when it knows the server (it clears it once
                    // healthy); what to do about a missing authorization only the host knows.
                    last_fault: match (&view.authorization, status) {
                        (Some(words), _) => Some(words.clone()),
                        (None, Some(status)) => status.last_fault.clone(),
                        (None, None) => view.last_fault,
                    },
                    since: rfc3339(view.since),
                    name: view.name,
                    state: view.state,
                    transport: view.transport,
                    pid: view.pid,
                    detail: view.detail,
                    reconnects: view.reconnects,
                    parks: view.parks,
                }
            })
            .collect();
        Self {
            policy: RunningPolicy::of(supervisor.policy()),
            servers,
        }
    }
}

/// What of a live server's offer agents cannot see although its filters allow it.
fn withheld(supervisor: &Supervisor, view: &crate::supervisor::ServerView) -> Vec<String> {
    if !matches!(view.state, ServerState::Connected | ServerState::Healthy) {
        return Vec::new();
    }
    let spec = supervisor.specs().into_iter().find(|s| s.name == view.name);
    let filters = spec.and_then(|spec| {
        tether_policy::registry::Filters::compile(&spec.include, &spec.exclude).ok()
    });
    let published = supervisor.registry().server_originals(&view.name);
    let mut withheld: Vec<String> = view
        .offered
        .iter()
        .filter(|tool| filters.as_ref().is_none_or(|f| f.allows(tool)))
        .filter(|tool| !published.contains(*tool))
        .map(|tool| format!("tool {tool}"))
        .collect();
    let catalog = supervisor.catalog().view();
    withheld.extend(
        catalog
            .collided_prompts(&view.name)
            .iter()
            .map(|prompt| format!("prompt {prompt}")),
    );
    withheld
}

impl RunningPolicy {
    /// What `policy` runs now.
    pub(crate) fn of(policy: &PolicyRuntime) -> Self {
        let running = policy.running();
        Self {
            label: running.label,
            name: running.name,
            version: running.version,
            contract: running.contract,
            digest: running.digest,
            settings: settings_json(&running.settings),
        }
    }
}

/// Settings text as JSON: the object itself when it parses, else the text.
pub(crate) fn settings_json(settings: &str) -> serde_json::Value {
    match serde_json::from_str(settings) {
        Ok(value) => value,
        Err(_) if settings.trim().is_empty() => serde_json::json!({}),
        Err(_) => serde_json::Value::String(settings.to_string()),
    }
}

/// A time as the admin API writes it: RFC 3339 in UTC, milliseconds.
pub(crate) fn rfc3339(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}
