//! The client a request came from, as an upstream sees it through Tether: where the request's
//! progress and log messages go, what the client can do, and the requests an upstream makes of
//! it during the request (sampling, elicitation, roots).
//!
//! Both ways of asking are carried across generations. A server of 2025-11-25 or older sends
//! its request to Tether, which passes it to the client on the stream of the client's request.
//! A 2026-07-28 server answers with a request for input (`InputRequiredResult`) instead: a
//! 2026-07-28 client gets it as is; an older client is asked each request the old way, and
//! Tether sends the answers back to the server with the retry ([`fulfil`]).

#![allow(deprecated)] // sampling, roots and logging: deprecated by SEP-2577, still in use

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::model::{
    ClientCapabilities, ClientResult, ErrorData, InputRequest, InputRequiredResult, InputResponses,
    LoggingLevel, ProgressNotificationParam, ProgressToken, RequestId, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, RequestContext};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::asking::{Asked, Question, Questions};
use super::downstream;
use crate::upstream::{CallContext, ClientAsk, LogSink, ProgressForward};

/// Most rounds of requests for input one call may take (each answered, then retried).
pub(super) const MAX_INPUT_ROUNDS: usize = 10;

/// Whether the client negotiated protocol 2026-07-28 or later (it answers a server's requests
/// for input as `InputRequiredResult`, and takes no requests from a server).
pub(super) fn modern_client(context: &RequestContext<RoleServer>) -> bool {
    let modern = |version: &str| version >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str();
    // The request's own version read in place (rmcp's reader copies it out); else as rmcp
    // reads it, from the session.
    match context.meta.get(PROTOCOL_VERSION_KEY) {
        Some(serde_json::Value::String(version)) => modern(version),
        _ => context
            .protocol_version()
            .is_some_and(|v| modern(v.as_str())),
    }
}

/// Where a 2026-07-28 request names its protocol version in its `_meta`.
pub(super) const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// What a forwarded request takes along from the client's request: its cancellation,
/// progress, log level (`log_level`: a 2026-07-28 request's own, else what the client's session
/// set), its own log stream (2026-07-28), and the client itself (`client`, of `context`).
pub(super) fn call_context(
    server: &str,
    context: &RequestContext<RoleServer>,
    log_level: Option<LoggingLevel>,
    client: Arc<Client>,
) -> CallContext {
    let modern = client.modern;
    let log_level = if modern {
        context.meta.log_level()
    } else {
        log_level
    };
    CallContext {
        cancel: context.ct.clone(),
        // A Streamable HTTP call served past rmcp writes its progress to its own stream.
        progress: context
            .extensions
            .get::<super::http::calls::ProgressTo>()
            .map(|to| to.0.clone())
            .or_else(|| Forwarder::for_request(context)),
        input_responses: None,
        request_state: None,
        log_level,
        log: log_level
            .filter(|_| modern)
            .map(|level| log_sink(server, level, context)),
        client: Some(client),
        // Started by the gateway, which knows the method and its target.
        trace: None,
        // Given by a client whose answers can carry a result's bytes (`direct.rs` on stdio,
        // `http/results.rs` on Streamable HTTP).
        raw: super::http::results::slot_in(&context.extensions).cloned(),
    }
}

/// Where a 2026-07-28 client's call's log messages go: the call's own stream, at or above the
/// level it asked for, marked with the server.
fn log_sink(server: &str, level: LoggingLevel, context: &RequestContext<RoleServer>) -> LogSink {
    let server = server.to_string();
    // A call served past rmcp (`http/calls/modern.rs`) writes them to its own stream.
    if let Some(to) = context.extensions.get::<super::http::calls::LogTo>() {
        let to = to.clone();
        return Arc::new(move |message| {
            if downstream::severity(message.level) >= downstream::severity(level) {
                to.send(downstream::attributed(&server, message));
            }
        });
    }
    let peer = context.peer.clone();
    let (messages, mut pending) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(message) = pending.recv().await {
            if let Err(error) = peer.notify_logging_message(message).await {
                tracing::debug!("could not pass a log message on: {error}");
                return;
            }
        }
    });
    Arc::new(move |message| {
        if downstream::severity(message.level) >= downstream::severity(level) {
            // A client too slow to read its log misses some; the answer still comes.
            let _ = messages.try_send(downstream::attributed(&server, message));
        }
    })
}

enum Item {
    Update(ProgressNotificationParam),
    Flush(oneshot::Sender<()>),
}

/// Passes an upstream request's progress to its client under the client's own token, in the
/// order it came, never backwards; [`ProgressForward::flush`] lets the answer wait for it.
/// The task that writes it starts with the first update: most calls that carry a token (rmcp
/// clients set one on every request) never report progress.
pub(super) struct Forwarder {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    /// Cancelled once the session's service loop takes no more notifications: for a call
    /// served past it on stdio, when the client's input ends (`direct.rs`). From then on an
    /// update would wait for a loop that is gone, and with it the answer.
    undeliverable: Option<CancellationToken>,
    state: std::sync::Mutex<Progress>,
}

/// Put in a request's extensions by whoever knows when its session's service loop stops
/// taking notifications: that request's progress is not passed on after it.
#[derive(Clone)]
pub(super) struct ProgressUntil(pub(super) CancellationToken);

/// The last progress passed on, and the queue to the writing task once there is one.
struct Progress {
    last: f64,
    items: Option<mpsc::Sender<Item>>,
}

/// Progress notifications of one request waiting for a slow client.
const PROGRESS_BACKLOG: usize = 4096;

impl Forwarder {
    /// A forwarder when the client's request asked for progress (it carries a token).
    fn for_request(context: &RequestContext<RoleServer>) -> Option<Arc<dyn ProgressForward>> {
        Some(Arc::new(Forwarder {
            token: context.meta.get_progress_token()?,
            peer: context.peer.clone(),
            undeliverable: context
                .extensions
                .get::<ProgressUntil>()
                .map(|u| u.0.clone()),
            state: std::sync::Mutex::new(Progress {
                last: f64::NEG_INFINITY,
                items: None,
            }),
        }))
    }

    /// Starts the task that writes progress to the client, in order.
    fn start(&self) -> mpsc::Sender<Item> {
        let peer = self.peer.clone();
        let undeliverable = self.undeliverable.clone().unwrap_or_default();
        // Room for a long burst while the client is slow to read (slots are allocated as
        // used); only a client that stops reading misses some, and memory stays bounded.
        let (items, mut pending) = mpsc::channel(PROGRESS_BACKLOG);
        tokio::spawn(async move {
            let mut broken = false;
            while let Some(item) = pending.recv().await {
                match item {
                    Item::Update(update) if !broken => {
                        let sent = tokio::select! {
                            biased;
                            () = undeliverable.cancelled() => Err("the client's input ended".into()),
                            sent = peer.notify_progress(update) => sent.map_err(|e| e.to_string()),
                        };
                        if let Err(error) = sent {
                            tracing::debug!("could not pass progress on: {error}");
                            broken = true;
                        }
                    }
                    Item::Update(_) => {}
                    Item::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        items
    }
}

impl ProgressForward for Forwarder {
    fn forward(&self, upstream: ProgressNotificationParam) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if upstream.progress <= state.last {
            return;
        }
        state.last = upstream.progress;
        let mut update = ProgressNotificationParam::new(self.token.clone(), upstream.progress);
        update.total = upstream.total;
        update.message = upstream.message;
        let items = state.items.get_or_insert_with(|| self.start());
        // A client too slow to take its progress misses some; the answer still comes.
        let _ = items.try_send(Item::Update(update));
    }

    fn flush(&self) -> BoxFuture<'static, ()> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(items) = state.items.clone() else {
            // Nothing was passed on: nothing to wait for.
            return Box::pin(std::future::ready(()));
        };
        Box::pin(async move {
            let (done, flushed) = oneshot::channel();
            if items.send(Item::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        })
    }
}

/// The client of one request.
pub(super) struct Client {
    peer: Peer<RoleServer>,
    request: RequestId,
    capabilities: ClientCapabilities,
    modern: bool,
    /// For a 2026-07-28 client, where a server's questions go to become a request for input
    /// (see `asking.rs`); without it such a client cannot be asked.
    questions: Option<Questions>,
    /// For a call served past rmcp (`http/calls.rs`), the stream its questions go on.
    ask_on: Option<super::http::calls::AskOn>,
}

impl Client {
    pub(super) fn of(context: &RequestContext<RoleServer>) -> Self {
        Self {
            peer: context.peer.clone(),
            request: context.id.clone(),
            capabilities: context.client_capabilities().unwrap_or_default(),
            modern: modern_client(context),
            questions: None,
            ask_on: context
                .extensions
                .get::<super::http::calls::AskOn>()
                .cloned(),
        }
    }

    /// Whether it speaks protocol 2026-07-28 or later (see [`modern_client`]).
    pub(super) fn is_modern(&self) -> bool {
        self.modern
    }

    /// Makes this client's server questions come to the receiver returned (a 2026-07-28
    /// client's call: see `asking.rs`).
    pub(super) fn open_questions(&mut self) -> Asked {
        let (questions, asked) = mpsc::unbounded_channel();
        self.questions = Some(questions);
        asked
    }
}

impl ClientAsk for Client {
    fn capabilities(&self) -> ClientCapabilities {
        self.capabilities.clone()
    }

    fn ask(
        &self,
        mut request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        if self.modern {
            // Becomes part of a request for input the call answers the client with.
            let questions = self.questions.clone();
            return Box::pin(async move {
                let unasked = || {
                    ErrorData::new(
                        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                        "the client speaks protocol 2026-07-28, which takes requests for input only as a tool call's result",
                        None,
                    )
                };
                let questions = questions.ok_or_else(unasked)?;
                let (answer, answered) = oneshot::channel();
                questions
                    .send(Box::new(Question { request, answer }))
                    .map_err(|_| unasked())?;
                answered.await.unwrap_or_else(|_| {
                    Err(ErrorData::internal_error(
                        "the client never answered: its call ended or waited too long",
                        None,
                    ))
                })
            });
        }
        // On the stream of a call served past rmcp; once that has ended, rmcp's way.
        if let Some(on) = &self.ask_on {
            request = match on.ask(request) {
                Ok(asked) => return asked,
                Err(request) => *request,
            };
        }
        // On the stream of the client's own request (Streamable HTTP): rmcp routes a request
        // that names the request it belongs to there.
        rmcp::model::GetExtensions::extensions_mut(&mut request)
            .insert(OriginatingRequestId(self.request.clone()));
        let peer = self.peer.clone();
        Box::pin(async move {
            peer.send_request(request)
                .await
                .map_err(|error| match error {
                    rmcp::ServiceError::McpError(error) => error,
                    other => ErrorData::internal_error(
                        format!("the client did not answer: {other}"),
                        None,
                    ),
                })
        })
    }
}

/// Whether an older client could answer any request for input (it declared sampling,
/// elicitation or roots).
pub(super) fn can_be_asked(client: &Client) -> bool {
    let declared = &client.capabilities;
    !client.modern
        && (declared.sampling.is_some()
            || declared.elicitation.is_some()
            || declared.roots.is_some())
}

/// One request for input of a 2026-07-28 server as an older client is asked it: what it is
/// called, whether the client declared it, and the request the old way.
fn as_old_request(
    server: &str,
    client: &Client,
    request: &InputRequest,
) -> Result<(&'static str, bool, ServerRequest), McpError> {
    Ok(match request.clone() {
        InputRequest::CreateMessage(request) => (
            "sampling",
            client.capabilities.sampling.is_some(),
            ServerRequest::CreateMessageRequest(request),
        ),
        InputRequest::Elicitation(request) => (
            "elicitation",
            client.capabilities.elicitation.is_some(),
            ServerRequest::ElicitRequest(request),
        ),
        InputRequest::ListRoots(request) => (
            "roots",
            client.capabilities.roots.is_some(),
            ServerRequest::ListRootsRequest(request),
        ),
        #[allow(unreachable_patterns)] // a kind of a later revision
        _ => {
            return Err(McpError::invalid_request(
                format!(
                    "server {server:?} asked the client for input of a kind Tether does not know"
                ),
                None,
            ));
        }
    })
}

fn undeclared(server: &str, what: &str) -> McpError {
    McpError::invalid_request(
        format!(
            "server {server:?} needs {what} from the client, which did not declare that capability"
        ),
        None,
    )
}

/// Why an older client cannot answer `input`: the first request it did not declare (or that
/// Tether does not know).
pub(super) fn unanswerable(server: &str, client: &Client, input: &InputRequiredResult) -> McpError {
    for request in input
        .input_requests
        .iter()
        .flat_map(|requests| requests.values())
    {
        match as_old_request(server, client, request) {
            Err(error) => return error,
            Ok((what, false, _)) => return undeclared(server, what),
            Ok(_) => {}
        }
    }
    McpError::invalid_request(
        format!("server {server:?} asked the client for input it could not give"),
        None,
    )
}

/// Answers a 2026-07-28 server's requests for input by asking an older client each of them the
/// old way; the answers, keyed as the server asked, go back with the retry.
pub(super) async fn fulfil(
    server: &str,
    client: &Client,
    input: &InputRequiredResult,
) -> Result<InputResponses, McpError> {
    let mut responses = InputResponses::new();
    for (key, request) in input.input_requests.iter().flatten() {
        let (what, declared, request) = as_old_request(server, client, request)?;
        if !declared {
            return Err(undeclared(server, what));
        }
        let answer = client.ask(request).await.map_err(|error| {
            McpError::internal_error(
                format!(
                    "server {server:?} asked the client for {what}, which failed: {}",
                    error.message
                ),
                None,
            )
        })?;
        let answer = serde_json::to_value(answer).map_err(|error| {
            McpError::internal_error(format!("the client's {what} answer: {error}"), None)
        })?;
        responses.insert(key.clone(), answer);
    }
    Ok(responses)
}
