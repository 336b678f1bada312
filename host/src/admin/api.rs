//! The admin API's requests and answers as types: the server (`server.rs`) answers with
//! them, the `tether` CLI reads them, and the OpenAPI document (`server.rs`,
//! checked in as `docs/admin-openapi.json`) is generated from them and the routes' own
//! descriptions.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::events::Event;
use crate::policy::{ServerState, ShadowReport, SwapPath};
use crate::supervisor::Supervisor;

pub use crate::status::{RunningPolicy, ServerRow, Status};

/// One tool a server offers: whether agents see it, under which name, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolRow {
    /// The server that offers it.
    pub server: String,
    /// Its name on the server.
    pub original: String,
    /// The name agents see it by, while they see it.
    pub advertised: Option<String>,
    /// Whether agents see it now.
    pub visible: bool,
    /// Why (not): `published`, `excluded by the server's include/exclude`, `withheld by the
    /// policy (another tool or server claims the name)`, or `the server is not connected`.
    pub why: String,
}

impl ToolRow {
    /// Every tool the servers' latest sessions offer, by server and name.
    pub(crate) fn collect(supervisor: &Supervisor) -> Vec<ToolRow> {
        let specs = supervisor.specs();
        let (_, routes) = supervisor.registry().snapshot();
        let published: std::collections::HashMap<(&str, &str), &str> = routes
            .iter()
            .map(|r| {
                (
                    (r.server.as_str(), r.tool.original.as_str()),
                    r.tool.advertised.as_str(),
                )
            })
            .collect();
        let mut rows = Vec::new();
        for view in supervisor.views() {
            let filters = specs.iter().find(|s| s.name == view.name).and_then(|spec| {
                tether_policy::registry::Filters::compile(&spec.include, &spec.exclude).ok()
            });
            let live = matches!(view.state, ServerState::Connected | ServerState::Healthy);
            for original in &view.offered {
                let advertised = published.get(&(view.name.as_str(), original.as_str()));
                let why = match advertised {
                    Some(_) => "published",
                    None if filters.as_ref().is_some_and(|f| !f.allows(original)) => {
                        "excluded by the server's include/exclude"
                    }
                    None if !live => "the server is not connected",
                    None => "withheld by the policy (another tool or server claims the name)",
                };
                rows.push(ToolRow {
                    server: view.name.clone(),
                    original: original.clone(),
                    advertised: advertised.map(|name| name.to_string()),
                    visible: advertised.is_some(),
                    why: why.to_string(),
                });
            }
        }
        rows
    }
}

/// `POST /reconnect/{server}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reconnecting {
    /// The server asked to reconnect.
    pub reconnecting: String,
}

/// `PUT /policy` and `POST /policy/promote`: the policy now running and how it came in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Swapped {
    /// The policy now running.
    pub policy: RunningPolicy,
    /// How the state moved.
    pub swap: SwapOutcome,
}

/// How a swap moved the state, and what it lost or breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SwapOutcome {
    /// Snapshot, handover or events.
    pub path: SwapPath,
    /// What the incoming policy could not be given, in words.
    pub not_carried: Vec<String>,
    /// Tether's invariants the policy breaks (swapped with `force`).
    pub breaks_invariants: Vec<String>,
}

/// Query of `PUT /policy` and `PUT /policy/shadow`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// A name for the component in status and logs (e.g. its file name).
    pub label: Option<String>,
    /// Swap even if the policy breaks Tether's invariants.
    #[serde(default)]
    pub force: bool,
}

/// Query of `POST /policy/promote`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForceQuery {
    /// Promote even a policy that breaks Tether's invariants.
    #[serde(default)]
    pub force: bool,
}

/// `PUT /policy/shadow` and `GET /policy/shadow`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Shadow {
    /// How the shadow's decisions compare with the live policy's (`null`: no shadow runs).
    pub shadow: Option<ShadowReport>,
}

/// `DELETE /policy/shadow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShadowDropped {
    /// Whether a shadow was running.
    pub dropped: bool,
}

/// `PATCH /policy/settings`: the settings now in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Settings {
    /// The merged settings object.
    pub settings: serde_json::Value,
}

/// One item of `GET /events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TimedEvent {
    /// When the gateway sent it (RFC 3339).
    pub time: String,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// Every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// What went wrong, naming the culprit.
    pub error: String,
}
