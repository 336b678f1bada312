//! The admin API's requests and answers as types: the server ([`super::server`]) answers with
//! them, the `tether` CLI reads them, and the OpenAPI document ([`openapi`]) is generated from
//! them (checked in as `docs/admin-openapi.json`).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::events::Event;
use crate::policy::PolicyRuntime;
use crate::policy::{BreakerState, ServerState, ShadowReport, SwapPath, TransportKind};
use crate::supervisor::{ReloadReport, Supervisor};

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
}

impl Status {
    /// The status of `supervisor`'s servers and policy now.
    pub async fn collect(supervisor: &Supervisor) -> Self {
        let statuses = supervisor.policy_status().await;
        let servers = supervisor
            .views()
            .into_iter()
            .map(|view| {
                let status = statuses.iter().find(|s| s.server == view.name);
                ServerRow {
                    tools: supervisor.registry().server_tools(&view.name).len(),
                    breaker: status.map(|s| s.breaker),
                    failures: status.map(|s| s.failures),
                    breaker_failures: status.map(|s| s.breaker_failures),
                    tool_errors: status.map(|s| s.tool_errors),
                    // The policy's account when it knows the server (it clears it once healthy).
                    last_fault: match status {
                        Some(status) => status.last_fault.clone(),
                        None => view.last_fault,
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

impl RunningPolicy {
    /// What `policy` runs now.
    pub fn of(policy: &PolicyRuntime) -> Self {
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
pub fn rfc3339(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
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

#[utoipa::path(get, path = "/status", tag = "admin",
    responses((status = 200, description = "The running policy and every server", body = Status)))]
#[allow(dead_code)]
fn status() {}

#[utoipa::path(get, path = "/events", tag = "admin",
    responses((status = 200, description = "A `text/event-stream`; each `data:` is one JSON TimedEvent",
        content_type = "text/event-stream", body = TimedEvent)))]
#[allow(dead_code)]
fn events() {}

#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn metrics() {}

#[utoipa::path(post, path = "/reconnect/{server}", tag = "admin",
    params(("server" = String, Path, description = "The server's name")),
    responses(
        (status = 200, description = "Reconnect requested", body = Reconnecting),
        (status = 404, description = "No such server", body = ApiError)))]
#[allow(dead_code)]
fn reconnect() {}

#[utoipa::path(put, path = "/policy", tag = "policy", params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The policy component (any content type is read as its bytes)"),
    responses(
        (status = 200, description = "The policy was swapped in", body = Swapped),
        (status = 400, description = "The query is malformed", body = ApiError),
        (status = 422, description = "Not a usable policy, or it breaks the contract or (without force) the invariants", body = ApiError)))]
#[allow(dead_code)]
fn swap_policy() {}

#[utoipa::path(put, path = "/policy/shadow", tag = "policy", params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The candidate component (any content type is read as its bytes)"),
    responses(
        (status = 200, description = "The shadow runs", body = Shadow),
        (status = 400, description = "The query is malformed", body = ApiError),
        (status = 422, description = "Not a usable policy", body = ApiError)))]
#[allow(dead_code)]
fn start_shadow() {}

#[utoipa::path(get, path = "/policy/shadow", tag = "policy",
    responses(
        (status = 200, description = "The shadow's report so far (`shadow` is null when none runs)", body = Shadow)))]
#[allow(dead_code)]
fn shadow_report() {}

#[utoipa::path(delete, path = "/policy/shadow", tag = "policy",
    responses((status = 200, description = "The shadow is stopped", body = ShadowDropped)))]
#[allow(dead_code)]
fn drop_shadow() {}

#[utoipa::path(post, path = "/policy/promote", tag = "policy", params(ForceQuery),
    responses(
        (status = 200, description = "The shadow now decides", body = Swapped),
        (status = 400, description = "The query is malformed", body = ApiError),
        (status = 409, description = "No shadow runs", body = ApiError),
        (status = 422, description = "It breaks the contract or (without force) the invariants", body = ApiError)))]
#[allow(dead_code)]
fn promote_shadow() {}

#[utoipa::path(patch, path = "/policy/settings", tag = "policy",
    request_body(content = Object, description = "A JSON merge patch (RFC 7396) over the running settings"),
    responses(
        (status = 200, description = "The settings now in force", body = Settings),
        (status = 422, description = "Not a JSON object, or the policy refuses it", body = ApiError)))]
#[allow(dead_code)]
fn set_settings() {}

#[utoipa::path(post, path = "/reload", tag = "admin",
    responses(
        (status = 200, description = "What the reload changed", body = ReloadReport),
        (status = 422, description = "The config file is invalid; nothing changed", body = ApiError)))]
#[allow(dead_code)]
fn reload() {}

#[derive(OpenApi)]
#[openapi(
    info(title = "Tether admin API", description = "Operate a running Tether gateway. Every request needs `Authorization: Bearer <token>` (the token is in the state file `tether serve` writes); a request without it gets 401 with an ApiError."),
    paths(status, events, metrics, reconnect, swap_policy, start_shadow, shadow_report, drop_shadow, promote_shadow, set_settings, reload),
    modifiers(&BearerAuth, &Refusals),
    security(("bearer" = []))
)]
struct AdminApi;

struct BearerAuth;

/// Every operation can be refused for want of the token (401).
struct Refusals;

impl utoipa::Modify for Refusals {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let unauthorized = ResponseBuilder::new()
            .description("No admin token, or a wrong one")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ApiError")))
                    .build(),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            for operation in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.patch,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                operation
                    .responses
                    .responses
                    .insert("401".into(), unauthorized.clone().into());
            }
        }
    }
}

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The admin API's OpenAPI 3.1 document, generated from the types above.
pub fn openapi() -> String {
    let mut document = AdminApi::openapi();
    document.info.version = env!("CARGO_PKG_VERSION").to_string();
    document.info.license = None;
    let mut value = serde_json::to_value(&document).expect("an OpenAPI document serializes");
    // Each server-sent event is an object whose `data` is a TimedEvent in JSON (utoipa has no
    // word for a schema of the text inside a string).
    value["paths"]["/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"] = serde_json::json!({
        "type": "object",
        "description": "One server-sent event: `data` is a TimedEvent in JSON.",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": "#/components/schemas/TimedEvent"}
            },
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"}
        }
    });
    serde_json::to_string_pretty(&value).expect("JSON values serialize") + "\n"
}

#[cfg(test)]
mod tests {
    /// `docs/admin-openapi.json` is what the types say; `TETHER_BLESS=1` rewrites it.
    #[test]
    fn the_checked_in_openapi_document_matches_the_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/admin-openapi.json");
        let generated = super::openapi();
        if std::env::var_os("TETHER_BLESS").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "docs/admin-openapi.json is out of date with host/src/admin/api.rs: run \
             `TETHER_BLESS=1 cargo test -p tether --lib admin::api` and commit it"
        );
    }
}
