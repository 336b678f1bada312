//! Streamable HTTP at `/mcp`: rmcp's `StreamableHttpService` with a `LocalSessionManager`
//! under axum. rmcp routes each POST itself: `initialize` and requests without per-request
//! `_meta` go to 2025-11-25 sessions, requests carrying 2026-07-28 `_meta` are served
//! statelessly. It also validates Host (DNS rebinding), the version header against `_meta`,
//! and maps 2026 error codes to HTTP statuses.
//!
//! A middleware adds what rmcp 3.11 does not do:
//! * on the 2026-07-28 wire `initialize` is a removed method and must get HTTP 404 with
//!   JSON-RPC -32601, but rmcp routes every `initialize` to the session path, where one
//!   without 2025 params gets 400 "session id required" (`logging/setLevel`, which rmcp
//!   still dispatches, is refused by the handler; rmcp maps that -32601 to 404);
//! * `test_reconnection` (SEP-1699 polling): the server closes the call's SSE stream after
//!   its priming event and answers on the stream the client resumes with `GET` +
//!   `Last-Event-ID`. rmcp can close a request's stream (`close_sse_stream`) but never does
//!   so by itself, and only the HTTP layer sees which stream a call got.

use std::{io::Write, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    body::{Body, to_bytes},
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use rmcp::transport::{
    StreamableHttpServerConfig, StreamableHttpService,
    streamable_http_server::session::local::LocalSessionManager,
};
use serde_json::{Value, json};

use crate::{handler::Handler, state::Shared};

/// Largest request body the middleware buffers (rmcp's own default limit).
const MAX_BODY: usize = 4 * 1024 * 1024;
/// The `retry:` of priming events: how long a client waits before resuming a closed stream.
const SSE_RETRY: Duration = Duration::from_millis(500);
const MODERN: &str = "2026-07-28";

/// What the middleware needs: the shared state, and rmcp's sessions to close a stream in.
#[derive(Clone)]
struct Gaps {
    shared: Arc<Shared>,
    sessions: Arc<LocalSessionManager>,
}

pub async fn serve(shared: Arc<Shared>, bind: SocketAddr) -> Result<(), String> {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.sse_retry = Some(SSE_RETRY);
    let sessions = Arc::new(sessions);
    let factory_shared = shared.clone();
    // The default config keeps rmcp's Host allow-list (localhost, 127.0.0.1, ::1), which is
    // what `dns-rebinding-protection` checks: a foreign Host gets 403.
    let mcp = StreamableHttpService::new(
        move || Ok(Handler::new(factory_shared.clone())),
        sessions.clone(),
        StreamableHttpServerConfig::default().with_sse_retry(Some(SSE_RETRY)),
    );
    let app = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            Gaps { shared, sessions },
            fill_gaps,
        ));
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|error| format!("binding {bind}: {error}"))?;
    let address = listener
        .local_addr()
        .map_err(|error| format!("local address: {error}"))?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening http://{address}/mcp")
            .and_then(|()| stdout.flush())
            .map_err(|error| format!("announcing the address: {error}"))?;
    }
    axum::serve(listener, app)
        .await
        .map_err(|error| format!("http server: {error}"))
}

async fn fill_gaps(State(gaps): State<Gaps>, request: Request, next: Next) -> Response {
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    match *request.method() {
        Method::POST => {}
        Method::GET => {
            let resumed = last_event_stream(request.headers());
            let response = next.run(request).await;
            // rmcp has re-attached the stream by now, so the tool's answer will follow it.
            if let (Some(session), Some(http_request_id)) = (session, resumed) {
                gaps.shared.reconnections.resumed(&session, http_request_id);
            }
            return response;
        }
        _ => return next.run(request).await,
    }
    let (parts, body) = request.into_parts();
    let bytes = match to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("reading the body: {error}"),
            )
                .into_response();
        }
    };
    let message: Option<Value> = serde_json::from_slice(&bytes).ok();
    let method = message
        .as_ref()
        .and_then(|m| m.get("method"))
        .and_then(Value::as_str);
    if session.is_none()
        && is_modern(&parts.headers, message.as_ref())
        && method == Some("initialize")
    {
        let id = message
            .as_ref()
            .and_then(|m| m.get("id"))
            .cloned()
            .unwrap_or(Value::Null);
        return method_not_found(id, "initialize");
    }
    let reconnecting = session.filter(|_| {
        method == Some("tools/call")
            && message
                .as_ref()
                .and_then(|m| m.pointer("/params/name"))
                .and_then(Value::as_str)
                == Some("test_reconnection")
    });
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    match reconnecting {
        Some(session) if is_event_stream(response.headers()) => {
            close_after_priming(gaps, session, response)
        }
        _ => response,
    }
}

/// Whether a session-less POST speaks 2026-07-28: by its version header or its `_meta`.
fn is_modern(headers: &HeaderMap, message: Option<&Value>) -> bool {
    let header = headers
        .get("mcp-protocol-version")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|version| version >= MODERN);
    let meta = message
        .and_then(|m| m.pointer("/params/_meta"))
        .and_then(Value::as_object)
        .is_some_and(|meta| meta.contains_key("io.modelcontextprotocol/protocolVersion"));
    header || meta
}

fn method_not_found(id: Value, method: &str) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32601, "message": format!("Method not found: {method} was removed in {MODERN}")},
    });
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}

/// The HTTP request id in rmcp's request-stream event ids (`<index>/<http request id>`).
fn stream_of(event_id: &str) -> Option<u64> {
    event_id.split_once('/')?.1.trim().parse().ok()
}

fn last_event_stream(headers: &HeaderMap) -> Option<u64> {
    stream_of(headers.get("last-event-id")?.to_str().ok()?)
}

/// Passes the response through; once its first event (rmcp's priming event, whose id names
/// the stream) has gone out, asks the session to close the stream, leaving the call running.
fn close_after_priming(gaps: Gaps, session: String, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let mut seen: Vec<u8> = Vec::new();
    let mut pending = Some((gaps, session));
    let stream = body.into_data_stream().inspect(move |chunk| {
        let (Ok(chunk), Some(_)) = (chunk, pending.as_ref()) else {
            return;
        };
        seen.extend_from_slice(chunk);
        let Some(end) = find(&seen, b"\n\n") else {
            return;
        };
        let first_event = String::from_utf8_lossy(&seen[..end]).into_owned();
        let Some((gaps, session)) = pending.take() else {
            return;
        };
        let Some(http_request_id) = first_event
            .lines()
            .find_map(|line| line.strip_prefix("id:"))
            .and_then(|id| stream_of(id.trim()))
        else {
            eprintln!("conformance-fixture: test_reconnection: the first event has no stream id: {first_event:?}");
            return;
        };
        tokio::spawn(close_stream(gaps, session, http_request_id));
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

async fn close_stream(gaps: Gaps, session: String, http_request_id: u64) {
    let handle = gaps
        .sessions
        .sessions
        .read()
        .await
        .get(session.as_str())
        .cloned();
    let Some(handle) = handle else {
        eprintln!("conformance-fixture: test_reconnection: session {session} is gone");
        return;
    };
    // Recorded first: the client may resume as soon as the stream ends.
    gaps.shared.reconnections.closed(&session, http_request_id);
    if let Err(error) = handle
        .close_sse_stream(http_request_id, Some(SSE_RETRY))
        .await
    {
        eprintln!(
            "conformance-fixture: test_reconnection: closing stream {http_request_id}: {error}"
        );
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
