//! Streamable HTTP at `/mcp`: rmcp's `StreamableHttpService` under axum, behind a guard that
//! injects the HTTP-level faults rmcp would never produce (500 on initialize, an error status
//! for a tool call on a live session, 400 without an id for an unknown session).

use std::{io::Write, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    body::to_bytes,
    extract::{Request, State},
    http::{Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use rmcp::transport::{
    StreamableHttpServerConfig, StreamableHttpService,
    streamable_http_server::{SessionManager, session::local::LocalSessionManager},
};

use crate::{cli::UnknownSession, fixture::Fixture, handler::Handler};

/// Largest request body the guard buffers (it must read bodies to spot `initialize`).
const MAX_BODY: usize = 4 * 1024 * 1024;
/// What a widely used SDK's catch-all answers a request that failed with (its status a 5xx):
/// a JSON-RPC error that names no request.
const FAILED_BODY: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"Internal server error"},"id":null}"#;
/// What a widely used SDK answers for an unknown session: 400 and a JSON-RPC error with no
/// id, which a naive client cannot match to its request (and so waits forever).
const NO_SESSION_BODY: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#;

#[derive(Clone)]
struct Guard {
    fixture: Arc<Fixture>,
    sessions: Arc<LocalSessionManager>,
}

pub async fn serve(fixture: Arc<Fixture>, bind: SocketAddr) -> Result<(), String> {
    let sessions = Arc::new(LocalSessionManager::default());
    let handler_fixture = fixture.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(Handler::new(handler_fixture.clone())),
        sessions.clone(),
        // Tests may bind any address; Host checks would only get in the way.
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_json_response(fixture.settings().json_response),
    );
    let app = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            Guard { fixture, sessions },
            guard,
        ));
    let listener = bind_and_announce(bind).await?;
    // Built once: served as it is, axum rebuilds the router for every connection.
    axum::serve(listener, app.into_make_service())
        .await
        .map_err(|error| format!("http server: {error}"))
}

/// Binds, then prints `listening on ADDR` as the first line of stdout (flushed), so tests
/// that asked for port 0 can find the server.
pub async fn bind_and_announce(bind: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|error| format!("binding {bind}: {error}"))?;
    let address = listener
        .local_addr()
        .map_err(|error| format!("local address: {error}"))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {address}")
        .and_then(|()| stdout.flush())
        .map_err(|error| format!("announcing the address: {error}"))?;
    Ok(listener)
}

async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let settings = guard.fixture.settings();
    if let Some(status) = settings.http_reject_sessions
        && request.headers().contains_key("mcp-session-id")
    {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        return (status, "fixture: rejecting the session").into_response();
    }
    if settings.http_unknown_session == UnknownSession::BadRequest
        && let Some(id) = request
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        && !guard
            .sessions
            .has_session(&id.into())
            .await
            .unwrap_or(false)
    {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            NO_SESSION_BODY,
        )
            .into_response();
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    // Read the body to see whether this is an `initialize`, then hand it on unchanged.
    let (parts, body) = request.into_parts();
    let bytes = match to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("reading body: {error}")).into_response();
        }
    };
    let methods = methods(&bytes);
    let names = |wanted: &str| methods.iter().any(|method| method == wanted);
    if names("initialize") && !guard.fixture.record_initialize() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "fixture: failing initialize",
        )
            .into_response();
    }
    if names("tools/call")
        && let Some(status) = guard.fixture.fails_posted_call(&settings)
    {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            FAILED_BODY,
        )
            .into_response();
    }
    if names("ping")
        && let Some(status) = guard.fixture.fails_posted_ping(&settings)
    {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            status,
            [(header::CONTENT_TYPE, "text/html")],
            format!("<html><body><h1>{status}</h1></body></html>"),
        )
            .into_response();
    }
    crate::garbage::forward(&settings, parts, bytes, next).await
}

/// Whether a JSON-RPC body is (or, batched, contains) an `initialize` request.
pub fn is_initialize(body: &[u8]) -> bool {
    methods(body).iter().any(|method| method == "initialize")
}

/// The methods a JSON-RPC body (one message or a batch) names.
fn methods(body: &[u8]) -> Vec<String> {
    let method = |message: &serde_json::Value| {
        message
            .get("method")
            .and_then(|m| m.as_str())
            .map(str::to_owned)
    };
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(batch)) => batch.iter().filter_map(method).collect(),
        Ok(message) => method(&message).into_iter().collect(),
        Err(_) => Vec::new(),
    }
}
