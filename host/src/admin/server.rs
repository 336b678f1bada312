//! The admin API: a small HTTP server over the supervisor, loopback-only unless allowed
//! otherwise, every request authorized by a bearer token.
//!
//! The requests and answers are the types in [`super::api`]; `docs/admin-openapi.json` describes
//! them (generated from those types). Every error is an [`ApiError`](super::api::ApiError).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use futures::Stream;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::api;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
#[cfg(any(test, feature = "test-support"))]
use utoipa::OpenApi;

use crate::metrics::Metrics;
use crate::policy::{PolicyError, PolicySource, ReconnectSource, SwapReport};
use crate::supervisor::{ReloadReport, Supervisor};

/// The largest policy component `PUT /policy` accepts.
pub const MAX_COMPONENT_BYTES: usize = 64 << 20;
/// The largest settings document `PATCH /policy/settings` accepts.
const MAX_SETTINGS_BYTES: usize = 1 << 20;
/// How often an idle event stream gets a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long [`AdminServer::shutdown`] waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Re-reads the config file and applies it; an error for a bad file (nothing changes then).
pub type ReloadFn =
    Arc<dyn Fn() -> BoxFuture<'static, Result<ReloadReport, crate::Error>> + Send + Sync>;

/// What the admin API works on.
#[derive(Clone)]
pub struct AdminContext {
    /// The servers and policy it operates.
    pub supervisor: Supervisor,
    /// Re-reads the config file and applies it (the embedding [`crate::Tether`] provides it);
    /// an error for a bad file (nothing changes then).
    pub reload: ReloadFn,
    /// What `GET /metrics` renders.
    pub metrics: Arc<Metrics>,
    /// The recent events `GET /history` answers with (record it before servers are added, so
    /// their first states are in it).
    pub history: super::history::History,
}

/// Why the admin API could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A non-loopback address without permission.
    #[error(
        "refusing to serve the admin API on {0}: it is not a loopback address, and anyone who can reach it with the token controls the gateway; pass --admin-allow-remote to allow it"
    )]
    NotLoopback(SocketAddr),
    /// A token that cannot be sent in a header.
    #[error("the admin token must be non-empty printable ASCII without spaces")]
    BadToken,
    /// No randomness for a token.
    #[error("cannot generate an admin token: {0}")]
    Token(String),
    /// The address cannot be listened on.
    // The cause is in the message, not a `source`, so chained reports say it once.
    #[error("cannot listen for the admin API on {addr}: {cause}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why not.
        cause: std::io::Error,
    },
}

/// A running admin API. Dropping it stops the server too (without waiting).
pub struct AdminServer {
    /// The address it listens on (the real port when bound to port 0).
    pub addr: SocketAddr,
    /// The bearer token every request must carry.
    pub token: String,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("addr", &self.addr)
            .field("token", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// Stops accepting requests, ends event streams and waits (briefly) for requests in flight.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
            .await
            .is_err()
        {
            tracing::warn!(
                "admin API requests still running after {SHUTDOWN_GRACE:?}; dropping them"
            );
            task.abort();
        }
    }
}

/// Starts the admin API on `bind`. A non-loopback address is refused unless `allow_remote`.
/// Without a `token` one is generated (256 random bits, hex).
pub async fn start(
    bind: SocketAddr,
    allow_remote: bool,
    token: Option<String>,
    ctx: AdminContext,
) -> Result<AdminServer, AdminError> {
    if !bind.ip().to_canonical().is_loopback() {
        if !allow_remote {
            return Err(AdminError::NotLoopback(bind));
        }
        tracing::warn!(%bind, "the admin API listens on a non-loopback address");
    }
    let token = match token {
        Some(token) if valid_token(&token) => token,
        Some(_) => return Err(AdminError::BadToken),
        None => generate_token()?,
    };
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|cause| AdminError::Bind { addr: bind, cause })?;
    let addr = listener
        .local_addr()
        .map_err(|cause| AdminError::Bind { addr: bind, cause })?;
    let (shutdown, stopping) = watch::channel(false);
    let app = App {
        ctx: Arc::new(ctx),
        token_digest: Sha256::digest(token.as_bytes()).into(),
        stopping: stopping.clone(),
        operations: Arc::new(Mutex::new(())),
    };
    let router = router(app);
    let task = tokio::spawn(async move {
        let mut stopping = stopping;
        let service = router.into_make_service();
        let served = axum::serve(listener, service).with_graceful_shutdown(async move {
            // Also ends when the AdminServer is dropped (the sender closes).
            let _ = stopping.wait_for(|stop| *stop).await;
        });
        if let Err(error) = served.await {
            tracing::error!("the admin API stopped: {error}");
        }
    });
    tracing::info!(%addr, "admin API listening");
    Ok(AdminServer {
        addr,
        token,
        shutdown,
        task,
    })
}

fn valid_token(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic())
}

fn generate_token() -> Result<String, AdminError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| AdminError::Token(e.to_string()))?;
    Ok(hex::encode(bytes))
}

#[derive(Clone)]
struct App {
    ctx: Arc<AdminContext>,
    /// SHA-256 of the token: compared in constant time, whatever the length of the guess.
    token_digest: [u8; 32],
    stopping: watch::Receiver<bool>,
    /// Serializes operations that change things (reload, swap, settings).
    operations: Arc<Mutex<()>>,
}

impl App {
    fn authorized(&self, token: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        digest.ct_eq(&self.token_digest).into()
    }
}

fn router(app: App) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/history", get(history))
        .route("/tools", get(tools))
        .route("/events", get(events))
        .route("/metrics", get(metrics))
        .route("/reconnect/{server}", post(reconnect))
        .route(
            "/policy",
            put(swap_policy).layer(DefaultBodyLimit::max(MAX_COMPONENT_BYTES)),
        )
        .route(
            "/policy/shadow",
            put(start_shadow)
                .get(shadow_report)
                .delete(drop_shadow)
                .layer(DefaultBodyLimit::max(MAX_COMPONENT_BYTES)),
        )
        .route("/policy/promote", post(promote_shadow))
        .route(
            "/policy/settings",
            patch(set_settings).layer(DefaultBodyLimit::max(MAX_SETTINGS_BYTES)),
        )
        .route("/reload", post(reload))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        // The page holds no data: what it shows it asks for with the token.
        .route("/ui", get(dashboard))
        .with_state(app)
}

/// The dashboard: one page, served from the binary, that reads and operates this API.
const DASHBOARD: &str = include_str!("ui.html");

async fn dashboard() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            // Inline script and style only, talking to this origin only, never framed.
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                     img-src data:; connect-src 'self'; form-action 'none'; \
                     frame-ancestors 'none'; base-uri 'none'",
                ),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        DASHBOARD,
    )
        .into_response()
}

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(api::ApiError { error: self.1 })).into_response()
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError(StatusCode::BAD_REQUEST, rejection.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        ApiError(rejection.status(), rejection.body_text())
    }
}

async fn authorize(State(app): State<App>, request: Request, next: Next) -> Response {
    let refusal = match crate::gateway::bearer_token(request.headers()) {
        Some(token) if app.authorized(token) => return next.run(request).await,
        Some(_) => "the admin token is wrong",
        None => "this request needs the admin token: send `Authorization: Bearer <token>`",
    };
    let mut response = ApiError(StatusCode::UNAUTHORIZED, refusal.into()).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tether admin\""),
    );
    response
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not accept {method}", uri.path()),
    )
}

#[utoipa::path(get, path = "/status", tag = "admin",
    responses((status = 200, description = "The running policy and every server", body = api::Status)))]
async fn status(State(app): State<App>) -> axum::Json<api::Status> {
    axum::Json(api::Status::collect(&app.ctx.supervisor).await)
}

#[utoipa::path(get, path = "/history", tag = "admin",
    responses((status = 200, description = "The events of the last hour (at most 20,000), oldest first", body = Vec<api::TimedEvent>)))]
async fn history(State(app): State<App>) -> axum::Json<Vec<api::TimedEvent>> {
    axum::Json(app.ctx.history.events())
}

#[utoipa::path(get, path = "/tools", tag = "admin",
    responses((status = 200, description = "Every tool the servers offer: whether agents see it, under which name, and why", body = Vec<api::ToolRow>)))]
async fn tools(State(app): State<App>) -> axum::Json<Vec<api::ToolRow>> {
    axum::Json(api::ToolRow::collect(&app.ctx.supervisor))
}

#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
async fn metrics(State(app): State<App>) -> Response {
    metrics_response(&app.ctx.metrics, &app.ctx.supervisor).await
}

/// `metrics` rendered as the answer to `GET /metrics` (the admin API's, the probe listener's).
pub(crate) async fn metrics_response(
    metrics: &crate::metrics::Metrics,
    supervisor: &crate::supervisor::Supervisor,
) -> Response {
    let text = metrics.render(supervisor).await;
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response()
}

#[utoipa::path(post, path = "/reconnect/{server}", tag = "admin",
    params(("server" = String, Path, description = "The server's name")),
    responses(
        (status = 200, description = "Reconnect requested", body = api::Reconnecting),
        (status = 404, description = "No such server", body = api::ApiError)))]
async fn reconnect(
    State(app): State<App>,
    Path(server): Path<String>,
) -> Result<axum::Json<api::Reconnecting>, ApiError> {
    if app
        .ctx
        .supervisor
        .request_reconnect(&server, ReconnectSource::Operator)
    {
        tracing::info!(server = %server, "reconnect requested by an operator");
        Ok(axum::Json(api::Reconnecting {
            reconnecting: server,
        }))
    } else {
        Err(ApiError(
            StatusCode::NOT_FOUND,
            crate::Error::UnknownServer(server).to_string(),
        ))
    }
}

/// Runs the conformance suite against a policy about to be swapped in: one that breaks the
/// contract is refused; one that breaks Tether's invariants is refused unless `force`, and
/// then the invariants it breaks are returned for the answer.
async fn vet(app: &App, source: PolicySource, force: bool) -> Result<Vec<String>, ApiError> {
    use crate::policy::conformance::{self, Level};
    let runtime = app.ctx.supervisor.policy();
    let engine = runtime.engine().clone();
    let running = runtime.running().settings;
    let results = tokio::task::spawn_blocking(move || {
        // Settings it refuses are settings the swap would replace with its defaults.
        let settings = match conformance::preflight(&engine, &source, &running) {
            Ok(()) => running,
            Err(_) => "{}".to_string(),
        };
        conformance::preflight(&engine, &source, &settings)?;
        Ok::<_, String>(conformance::run(&engine, &source, &settings))
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|error| ApiError(StatusCode::UNPROCESSABLE_ENTITY, error))?;
    let failed = |level| -> Vec<String> {
        results
            .iter()
            .filter(|r| r.level == level && r.failure.is_some())
            .map(|r| format!("{}: {}", r.name, r.failure.as_deref().unwrap_or_default()))
            .collect()
    };
    let contract = failed(Level::Contract);
    if !contract.is_empty() {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the policy breaks the contract, so it is not swapped in: {}",
                contract.join("; ")
            ),
        ));
    }
    let invariants: Vec<String> = results
        .iter()
        .filter(|r| r.level == Level::Invariant && r.failure.is_some())
        .map(|r| r.name.to_string())
        .collect();
    if !invariants.is_empty() && !force {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the policy breaks Tether's invariants ({}); swap with --force to run it anyway: {}",
                invariants.join(", "),
                failed(Level::Invariant).join("; ")
            ),
        ));
    }
    Ok(invariants)
}

fn policy_error(error: PolicyError) -> ApiError {
    let status = match error {
        PolicyError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
        PolicyError::NoShadow => StatusCode::CONFLICT,
        PolicyError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    ApiError(status, error.to_string())
}

#[utoipa::path(put, path = "/policy", tag = "policy", params(api::UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The policy component (any content type is read as its bytes)"),
    responses(
        (status = 200, description = "The policy was swapped in", body = api::Swapped),
        (status = 400, description = "The query is malformed", body = api::ApiError),
        (status = 422, description = "Not a usable policy, or it breaks the contract or (without force) the invariants", body = api::ApiError)))]
async fn swap_policy(
    State(app): State<App>,
    query: Result<Query<api::UploadQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<api::Swapped>, ApiError> {
    let Query(query) = query?;
    let force = query.force;
    let source = uploaded(query, body)?;
    let _operation = app.operations.lock().await;
    let supervisor = &app.ctx.supervisor;
    // Compiled once: the check and the swap use the same loaded component.
    let policy = supervisor.policy().clone();
    let loaded = tokio::task::spawn_blocking(move || policy.load(&source))
        .await
        .unwrap_or(Err(PolicyError::Stopped))
        .map_err(policy_error)?;
    let broken = vet(&app, PolicySource::Loaded(loaded.clone()), force).await?;
    let report = supervisor
        .swap_policy(PolicySource::Loaded(loaded))
        .await
        .map_err(policy_error)?;
    tracing::info!(name = %report.info.name, version = %report.info.version, path = ?report.path, "policy swapped through the admin API");
    Ok(swap_answer(supervisor, report, broken))
}

/// What a swap answers: the policy now running, how the state moved, what it breaks.
fn swap_answer(
    supervisor: &Supervisor,
    report: SwapReport,
    broken: Vec<String>,
) -> axum::Json<api::Swapped> {
    axum::Json(api::Swapped {
        policy: api::RunningPolicy::of(supervisor.policy()),
        swap: api::SwapOutcome {
            path: report.path,
            not_carried: report.not_carried,
            breaks_invariants: broken,
        },
    })
}

/// A component uploaded in a request body, with its label.
fn uploaded(
    query: api::UploadQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<PolicySource, ApiError> {
    let body = body?;
    if body.is_empty() {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the request has no body: send the policy component's bytes".into(),
        ));
    }
    let label = query
        .label
        .filter(|l| !l.trim().is_empty())
        .unwrap_or_else(|| "uploaded policy".to_string());
    Ok(PolicySource::Bytes {
        label,
        bytes: body.to_vec(),
    })
}

#[utoipa::path(put, path = "/policy/shadow", tag = "policy", params(api::UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The candidate component (any content type is read as its bytes)"),
    responses(
        (status = 200, description = "The shadow runs", body = api::Shadow),
        (status = 400, description = "The query is malformed", body = api::ApiError),
        (status = 422, description = "Not a usable policy", body = api::ApiError)))]
async fn start_shadow(
    State(app): State<App>,
    query: Result<Query<api::UploadQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<api::Shadow>, ApiError> {
    let Query(query) = query?;
    let source = uploaded(query, body)?;
    let _operation = app.operations.lock().await;
    let policy = app.ctx.supervisor.policy().clone();
    let report = tokio::task::spawn_blocking(move || policy.shadow_blocking(&source))
        .await
        .unwrap_or(Err(PolicyError::Stopped))
        .map_err(policy_error)?;
    Ok(axum::Json(api::Shadow {
        shadow: Some(report),
    }))
}

#[utoipa::path(get, path = "/policy/shadow", tag = "policy",
    responses(
        (status = 200, description = "The shadow's report so far (`shadow` is null when none runs)", body = api::Shadow)))]
async fn shadow_report(State(app): State<App>) -> Result<axum::Json<api::Shadow>, ApiError> {
    let report = app
        .ctx
        .supervisor
        .policy()
        .shadow_report()
        .await
        .map_err(policy_error)?;
    Ok(axum::Json(api::Shadow { shadow: report }))
}

#[utoipa::path(delete, path = "/policy/shadow", tag = "policy",
    responses((status = 200, description = "The shadow is stopped", body = api::ShadowDropped)))]
async fn drop_shadow(State(app): State<App>) -> Result<axum::Json<api::ShadowDropped>, ApiError> {
    let _operation = app.operations.lock().await;
    let dropped = app
        .ctx
        .supervisor
        .policy()
        .drop_shadow()
        .await
        .map_err(policy_error)?;
    Ok(axum::Json(api::ShadowDropped { dropped }))
}

#[utoipa::path(post, path = "/policy/promote", tag = "policy", params(api::ForceQuery),
    responses(
        (status = 200, description = "The shadow now decides", body = api::Swapped),
        (status = 400, description = "The query is malformed", body = api::ApiError),
        (status = 409, description = "No shadow runs", body = api::ApiError),
        (status = 422, description = "It breaks the contract or (without force) the invariants", body = api::ApiError)))]
async fn promote_shadow(
    State(app): State<App>,
    query: Result<Query<api::ForceQuery>, QueryRejection>,
) -> Result<axum::Json<api::Swapped>, ApiError> {
    let Query(query) = query?;
    let _operation = app.operations.lock().await;
    let supervisor = &app.ctx.supervisor;
    let shadow = supervisor
        .policy()
        .shadow_policy()
        .await
        .map_err(policy_error)?
        .ok_or_else(|| policy_error(PolicyError::NoShadow))?;
    let broken = vet(&app, PolicySource::Loaded(shadow), query.force).await?;
    let report = supervisor
        .swap_policy_from_shadow()
        .await
        .map_err(policy_error)?;
    tracing::info!(name = %report.info.name, "shadow policy promoted through the admin API");
    Ok(swap_answer(supervisor, report, broken))
}

/// RFC 7396 JSON merge patch: objects merge recursively, `null` removes a key.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[utoipa::path(patch, path = "/policy/settings", tag = "policy",
    request_body(content = Object, description = "A JSON merge patch (RFC 7396) over the running settings"),
    responses(
        (status = 200, description = "The settings now in force", body = api::Settings),
        (status = 422, description = "Not a JSON object, or the policy refuses it", body = api::ApiError)))]
async fn set_settings(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<api::Settings>, ApiError> {
    let body = body?;
    let unprocessable = |message: String| ApiError(StatusCode::UNPROCESSABLE_ENTITY, message);
    let patch: Value = serde_json::from_slice(&body)
        .map_err(|e| unprocessable(format!("the settings are not valid JSON: {e}")))?;
    if !patch.is_object() {
        return Err(unprocessable("the settings must be a JSON object".into()));
    }
    let _operation = app.operations.lock().await;
    // Read, merged and set with no reload in between (see `reload_turn`).
    let _turn = app.ctx.supervisor.reload_turn().await;
    let policy = app.ctx.supervisor.policy();
    let mut settings = match crate::status::settings_json(&policy.running().settings) {
        object @ Value::Object(_) => object,
        _ => json!({}),
    };
    merge_patch(&mut settings, &patch);
    policy
        .set_settings(settings.to_string())
        .await
        .map_err(policy_error)?;
    tracing::info!(%settings, "policy settings changed through the admin API");
    Ok(axum::Json(api::Settings { settings }))
}

#[utoipa::path(post, path = "/reload", tag = "admin",
    responses(
        (status = 200, description = "What the reload changed", body = crate::supervisor::ReloadReport),
        (status = 422, description = "The config file is invalid; nothing changed", body = api::ApiError)))]
async fn reload(State(app): State<App>) -> Result<axum::Json<ReloadReport>, ApiError> {
    let _operation = app.operations.lock().await;
    match (app.ctx.reload)().await {
        Ok(report) => Ok(axum::Json(report)),
        Err(error) => Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            error.to_string(),
        )),
    }
}

#[utoipa::path(get, path = "/events", tag = "admin",
    responses((status = 200, description = "A `text/event-stream`; each `data:` is one JSON TimedEvent",
        content_type = "text/event-stream", body = api::TimedEvent)))]
async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Subscribed before the response goes out: whatever happens after the client sees the
    // headers is delivered.
    let feed = crate::events::Feed::new(&app.ctx.supervisor);
    let stopping = app.stopping.clone();
    let stream = futures::stream::unfold((feed, stopping), |(mut feed, mut stopping)| async move {
        let event = tokio::select! {
            _ = stopping.wait_for(|stop| *stop) => return None,
            event = feed.next() => event?,
        };
        let timed = api::TimedEvent {
            time: crate::status::rfc3339(SystemTime::now()),
            event,
        };
        let data = serde_json::to_string(&timed).unwrap_or_default();
        Some((Ok(Event::default().data(data)), (feed, stopping)))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Tether admin API", description = "Operate a running Tether gateway. Every request needs `Authorization: Bearer <token>` (the token is in the state file `tether serve` writes); a request without it gets 401 with an ApiError."),
    paths(
        status,
        history,
        tools,
        events,
        metrics,
        reconnect,
        swap_policy,
        start_shadow,
        shadow_report,
        drop_shadow,
        promote_shadow,
        set_settings,
        reload
    ),
    modifiers(&BearerAuth, &Refusals),
    security(("bearer" = []))
)]
#[cfg(any(test, feature = "test-support"))]
struct AdminApi;

#[cfg(any(test, feature = "test-support"))]
struct BearerAuth;

/// Every operation can be refused for want of the token (401).
#[cfg(any(test, feature = "test-support"))]
struct Refusals;

#[cfg(any(test, feature = "test-support"))]
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

#[cfg(any(test, feature = "test-support"))]
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

/// The admin API's OpenAPI 3.1 document, generated from the routes above and the types of
/// [`api`]. (Tether's own tests check it against `docs/admin-openapi.json`.)
#[cfg(any(test, feature = "test-support"))]
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
    use super::*;

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
             `TETHER_BLESS=1 cargo test -p tether --lib admin::server` and commit it"
        );
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge_patch(&mut target, &json!({"b": {"c": null, "e": 4}, "f": 5}));
        assert_eq!(target, json!({"a": 1, "b": {"d": 3, "e": 4}, "f": 5}));
    }

    #[test]
    fn generated_tokens_are_256_bit_hex_and_differ() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_must_be_sendable_in_a_header() {
        assert!(valid_token("abc-123_XYZ"));
        assert!(!valid_token(""));
        assert!(!valid_token("with space"));
        assert!(!valid_token("tab\there"));
    }
}
