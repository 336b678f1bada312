//! The legacy HTTP+SSE transport (MCP 2024-11-05), which rmcp no longer ships.
//!
//! `GET /sse` opens a session: its first event is `endpoint` with `/messages?sessionId=<id>`;
//! the client POSTs JSON-RPC messages there (202 Accepted) and every server message comes
//! back as an `event: message` on the stream. Each session runs the same rmcp handler over
//! a pair of channels (rmcp serves any `(Sink, Stream)` of JSON-RPC messages). Closing the
//! stream ends the session; an unknown session id gets 404.

use std::{
    collections::HashMap,
    convert::Infallible,
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, Uri},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use futures::{
    Stream, StreamExt,
    channel::mpsc::{self, UnboundedReceiver, UnboundedSender},
};
use rmcp::{
    ServiceExt,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
};

use crate::{
    fixture::Fixture,
    handler::Handler,
    http::{bind_and_announce, is_initialize},
};

type Sessions = Arc<Mutex<HashMap<String, UnboundedSender<ClientJsonRpcMessage>>>>;

#[derive(Clone)]
struct SseState {
    fixture: Arc<Fixture>,
    sessions: Sessions,
}

pub async fn serve(fixture: Arc<Fixture>, bind: SocketAddr) -> Result<(), String> {
    let state = SseState {
        fixture,
        sessions: Sessions::default(),
    };
    let app = Router::new()
        .route("/sse", get(open_session))
        .route("/messages", post(post_message))
        .with_state(state);
    let listener = bind_and_announce(bind).await?;
    // Built once: served as it is, axum rebuilds the router for every connection.
    axum::serve(listener, app.into_make_service())
        .await
        .map_err(|error| format!("sse server: {error}"))
}

async fn open_session(
    State(state): State<SseState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let id = new_session_id();
    let (to_server, from_client) = mpsc::unbounded::<ClientJsonRpcMessage>();
    let (to_client, from_server) = mpsc::unbounded::<ServerJsonRpcMessage>();
    lock(&state.sessions).insert(id.clone(), to_server);

    let handler = Handler::new(state.fixture.clone());
    tokio::spawn(async move {
        // Ends when the client's stream closes (the session's sender is dropped) or the
        // handshake fails; either way dropping `to_client` ends the SSE stream.
        match handler.serve((to_client, from_client)).await {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(error) => eprintln!("mcp-fixture: sse session handshake: {error}"),
        }
    });

    let endpoint = Event::default()
        .event("endpoint")
        .data(format!("/messages?sessionId={id}"));
    let messages = SessionStream {
        messages: from_server,
        _session: SessionGuard {
            id,
            sessions: state.sessions.clone(),
        },
    }
    .map(|message| {
        let json = serde_json::to_string(&message).expect("JSON-RPC messages serialize");
        // `--garbage`: a marked answer goes out as garbage instead.
        let json = crate::garbage::replacement(&json).unwrap_or(json);
        Ok(Event::default().event("message").data(json))
    });
    Sse::new(futures::stream::once(async { Ok(endpoint) }).chain(messages))
        .keep_alive(KeepAlive::default())
}

async fn post_message(State(state): State<SseState>, uri: Uri, body: Bytes) -> Response {
    let Some(id) = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("sessionId="))
    else {
        return (StatusCode::BAD_REQUEST, "missing sessionId").into_response();
    };
    let Some(session) = lock(&state.sessions).get(id).cloned() else {
        return (StatusCode::NOT_FOUND, "unknown session").into_response();
    };
    let messages = match parse_messages(&body) {
        Ok(messages) => messages,
        Err(error) => return (StatusCode::BAD_REQUEST, error).into_response(),
    };
    if is_initialize(&body) && !state.fixture.record_initialize() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "fixture: failing initialize",
        )
            .into_response();
    }
    for message in messages {
        if session.unbounded_send(message).is_err() {
            return (StatusCode::NOT_FOUND, "session closed").into_response();
        }
    }
    (StatusCode::ACCEPTED, "Accepted").into_response()
}

/// One JSON-RPC message, or a batch of them.
fn parse_messages(body: &[u8]) -> Result<Vec<ClientJsonRpcMessage>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| format!("invalid JSON: {error}"))?;
    let values = match value {
        serde_json::Value::Array(batch) => batch,
        message => vec![message],
    };
    values
        .into_iter()
        .map(|value| {
            serde_json::from_value(value)
                .map_err(|error| format!("invalid JSON-RPC message: {error}"))
        })
        .collect()
}

fn new_session_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let random = RandomState::new().hash_one(NEXT.fetch_add(1, Ordering::Relaxed));
    format!("{random:016x}")
}

fn lock(
    sessions: &Sessions,
) -> std::sync::MutexGuard<'_, HashMap<String, UnboundedSender<ClientJsonRpcMessage>>> {
    sessions.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server's messages for one session; dropping it (the client left) ends the session.
struct SessionStream {
    messages: UnboundedReceiver<ServerJsonRpcMessage>,
    _session: SessionGuard,
}

impl Stream for SessionStream {
    type Item = ServerJsonRpcMessage;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.messages.poll_next_unpin(cx)
    }
}

struct SessionGuard {
    id: String,
    sessions: Sessions,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        // Dropping the sender ends the handler's input, so its rmcp service stops.
        lock(&self.sessions).remove(&self.id);
    }
}
