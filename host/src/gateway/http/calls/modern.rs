//! A 2026-07-28 agent's tool calls over Streamable HTTP, served past rmcp's per-request service.
//!
//! Such an agent has no session: rmcp serves each of its POSTs by decoding the body into its
//! message enum, checking the standard headers against the body written out again as a JSON
//! value, and making a service of the gateway with a transport for that one request, whose loop
//! spawns the handler; the answer comes back over two channels. A call here is decoded straight
//! into its type, checked as rmcp checks it, and run through the very handler in one task (so
//! that it goes on whether or not its agent reads), which hands the answer to the POST's task;
//! its progress and answer are the events of the POST's stream, written as rmcp writes them
//! (`data:` lines, no event ids: such a stream cannot be picked up again), with rmcp's
//! keep-alive comments while it is quiet. The answer decides the status as with rmcp: the
//! errors rmcp answers with 400 or 404 go as a JSON body with that status. An agent that
//! disconnects cancels its call (the server hears of it), as with rmcp.
//!
//! A POST is taken only when rmcp would serve it as it is and give the handler nothing this
//! path does not: no `Origin`, a `Host` rmcp serves, a JSON body within its limit (whether it
//! says its length or comes in chunks), the protocol version 2026-07-28 in the header and in
//! the body's `_meta` with the client's capabilities, `Mcp-Method: tools/call` and an
//! `Mcp-Name` (not Base64-encoded) that names the body's tool, a tool whose input schema
//! promotes no argument to a header (`x-mcp-header`, which rmcp checks against
//! `Mcp-Param-*`). The log messages a call asks for (`logLevel` in `_meta`) are events of its
//! stream, with its progress, as rmcp sends them on the request's stream. Everything else goes
//! to rmcp unchanged.

use std::convert::Infallible;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use futures::future::BoxFuture;
use memchr::memmem;
use rmcp::model::{
    CallToolRequest, ClientCapabilities, ErrorCode, Implementation, InitializeRequestParams,
    JsonRpcMessage, ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId,
    RequestMetaObject, ServerNotification,
};
use rmcp::service::{Peer, RunningService, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServerHandler};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::super::super::Gateway;
use super::super::super::direct;
use super::{
    HttpCalls, KEEP_ALIVE, ProgressTo, UNREAD_EVENTS, answer_event, event_stream_response,
    message_event, progress_message, quiet_for, status,
};
use crate::transport::lines::Answer;
use crate::transport::wire;
use crate::upstream::route::ProgressForward;

/// How rmcp starts a line of an event with no id (`sse-stream`'s writing).
const DATA: &str = "data: ";

/// The peer the contexts of calls served here name, as rmcp makes one for a request without a
/// session: the request's protocol version and no capabilities of its own (a 2026-07-28
/// request carries its client's in its `_meta`). It is never spoken through: what a call
/// sends its agent goes on the POST's stream (its progress, and the log messages it asked for).
pub(super) struct Modern {
    peer: Peer<RoleServer>,
    /// Keeps the peer's service (which serves nothing) running.
    _service: RunningService<RoleServer, Unused>,
}

/// The service behind [`Modern`]'s peer: nothing reaches it.
pub(super) struct Unused;

impl ServerHandler for Unused {}

/// A transport on which nothing comes and whatever goes is let go.
struct Silent;

impl rmcp::transport::Transport<RoleServer> for Silent {
    type Error = std::io::Error;

    fn send(
        &mut self,
        _: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        std::future::ready(Ok(()))
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        std::future::pending()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }
}

impl HttpCalls {
    /// 2026-07-28 agents' calls are served by `gateway` from now on (see the module's words).
    pub(in crate::gateway) fn serve_modern_agents_with(&self, gateway: Gateway) {
        let _ = self.gateway.set(Arc::new(gateway));
    }

    /// Whether a POST without a session is one this module may serve, by its headers.
    pub(super) fn takes_modern(&self, headers: &HeaderMap) -> bool {
        self.gateway.get().is_some()
            && names_a_call(headers)
            && self.passes_rmcps_guards(headers)
            && self.plain_json_post(headers)
    }

    /// Serves a POST `ReadFirst::Modern` chose, read whole: a tool call it can take, or anything
    /// else through `rmcp`.
    pub(super) async fn serve_modern(
        self: Arc<Self>,
        parts: Parts,
        body: Bytes,
        rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
    ) -> Response {
        let taken = self
            .gateway
            .get()
            .and_then(|gateway| Some((gateway, modern_call(&parts.headers, &body, gateway)?)));
        let Some((gateway, (id, mut call))) = taken else {
            return rmcp(Request::from_parts(parts, Body::from(body))).await;
        };
        let peer = &self
            .modern
            .get_or_init(|| {
                let info = InitializeRequestParams::new(
                    ClientCapabilities::default(),
                    Implementation::default(),
                )
                .with_protocol_version(ProtocolVersion::V_2026_07_28);
                let service = rmcp::service::serve_directly(Unused, Silent, Some(info));
                Modern {
                    peer: service.peer().clone(),
                    _service: service,
                }
            })
            .peer;
        let (updates, progress) = mpsc::channel(UNREAD_EVENTS);
        let meta = call.extensions.get::<RequestMetaObject>();
        let token = meta.and_then(|meta| meta.get_progress_token());
        if meta.is_some_and(|meta| meta.log_level().is_some()) {
            call.extensions.insert(LogTo(updates.clone()));
        }
        if let Some(token) = token {
            let to = ModernProgress {
                token,
                last: Mutex::new(f64::NEG_INFINITY),
                updates,
            };
            call.extensions.insert(ProgressTo(Arc::new(to)));
        }
        let cancel = self.closing.child_token();
        let (handling, raw) = direct::handling(gateway.clone(), &id, call, peer, &cancel);
        let (answered, answer) = oneshot::channel();
        let done = cancel.clone();
        tokio::spawn(async move {
            let result = handling.await;
            // Answered: its token goes, as rmcp's loop lets it go.
            done.cancel();
            let _ = answered.send(direct::answer_of(id, result, &raw));
        });
        let mut running = Running {
            answer: Some(answer),
            progress,
            ready: None,
            cancel,
            closing: self.closing.clone(),
        };
        // The status is known only once something comes (as with rmcp).
        let first = match running.next().await {
            Some(Next::Answer(answer)) => match refusal(&answer) {
                Some(refused) => return refused,
                None => Next::Answer(answer).pieces(),
            },
            Some(first) => first.pieces(),
            // The endpoint closed first (or the handler failed): as rmcp answers.
            None => {
                let mut response = Response::new(Body::from(
                    "Encounter an error when empty response: no response message received from handler",
                ));
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return response;
            }
        };
        let events = futures::stream::iter([first])
            .chain(rest_of(running, self.settings.sse_keep_alive))
            .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok::<_, Infallible>)));
        event_stream_response(Body::from_stream(events))
    }
}

/// What a call's stream gives after its first event: the call's events as they come, and a
/// comment (rmcp's keep-alive) each `keep_alive` nothing came.
fn rest_of(
    running: Running,
    keep_alive: Option<Duration>,
) -> impl futures::Stream<Item = Vec<Bytes>> + Send {
    futures::stream::unfold(running, move |mut running| async move {
        tokio::select! {
            next = running.next() => next.map(|next| (next.pieces(), running)),
            _ = quiet_for(keep_alive) => Some((vec![Bytes::from_static(KEEP_ALIVE)], running)),
        }
    })
}

/// The `tools/call` in a POST's `body` this module can serve as rmcp would, with the
/// `headers` it came with: see the module's words.
fn modern_call(
    headers: &HeaderMap,
    body: &[u8],
    gateway: &Gateway,
) -> Option<(RequestId, CallToolRequest)> {
    let (id, call) = checked_call(headers, body)?;
    (!promotes_arguments(gateway, &call.params.name)).then_some((id, call))
}

/// The `tools/call` in `body` if it passes rmcp's checks of a 2026-07-28 request against its
/// `headers` as they are (what its tool's schema asks of them aside).
fn checked_call(headers: &HeaderMap, body: &[u8]) -> Option<(RequestId, CallToolRequest)> {
    static TOOLS_CALL: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"tools/call\""));
    TOOLS_CALL.find(body)?;
    let (id, call) = wire::read_call(wire::Shallow::new(body)?)?;
    let meta = call.extensions.get::<RequestMetaObject>()?;
    let modern = ProtocolVersion::V_2026_07_28;
    let takes = meta
        .protocol_version()
        .is_some_and(|version| version == modern)
        && meta.missing_required_keys(&modern).is_empty()
        && single(headers, "mcp-name") == Some(call.params.name.as_ref());
    takes.then_some((id, call))
}

/// Whether the tool `name` may have arguments promoted to headers (its schema names
/// `x-mcp-header`, or escapes a character, which could spell it).
fn promotes_arguments(gateway: &Gateway, name: &str) -> bool {
    let Some(route) = gateway.supervisor.registry().visible_route(name) else {
        return false;
    };
    let schema = route.tool.input_schema.as_bytes();
    memmem::find(schema, b"x-mcp-header").is_some() || memmem::find(schema, b"\\u").is_some()
}

/// Whether a POST's headers name a 2026-07-28 tool call as rmcp's checks take them: the
/// version, `Mcp-Method` and a plain `Mcp-Name` (compared with the body's tool later), once each.
fn names_a_call(headers: &HeaderMap) -> bool {
    single(headers, "mcp-protocol-version") == Some(ProtocolVersion::V_2026_07_28.as_str())
        && single(headers, "mcp-method") == Some("tools/call")
        && single(headers, "mcp-name").is_some_and(|name| !name.starts_with("=?base64?"))
}

/// The one value of header `name`, if it has exactly one and it is text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values
        .next()
        .is_none()
        .then(|| value.to_str().ok())
        .flatten()
}

/// How rmcp answers a request without a session whose answer is an error it gives a status
/// other than 200: that status, the error as a JSON body.
fn refusal(answer: &Answer) -> Option<Response> {
    let Answer::Message(message) = answer else {
        return None;
    };
    let code = refused_with(message)?;
    let body = serde_json::to_vec(message).unwrap_or_default();
    let response = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body));
    Some(response.unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR)))
}

/// The status other than 200 rmcp gives `message`, if it is an error that has one.
fn refused_with(message: &TxJsonRpcMessage<RoleServer>) -> Option<StatusCode> {
    let JsonRpcMessage::Error(error) = message else {
        return None;
    };
    match error.error.code {
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | ErrorCode::HEADER_MISMATCH => Some(StatusCode::BAD_REQUEST),
        ErrorCode::METHOD_NOT_FOUND => Some(StatusCode::NOT_FOUND),
        _ => None,
    }
}

/// A call served here, as the POST's task sees it: its progress, then its answer.
struct Running {
    /// Until the answer has come.
    answer: Option<oneshot::Receiver<Answer>>,
    progress: mpsc::Receiver<Bytes>,
    /// The answer, once there, until the progress before it has gone out.
    ready: Option<Answer>,
    /// The call's own.
    cancel: CancellationToken,
    closing: CancellationToken,
}

/// What a call served here gives its stream next.
enum Next {
    /// An event, written.
    Progress(Bytes),
    Answer(Box<Answer>),
}

impl Next {
    fn pieces(self) -> Vec<Bytes> {
        match self {
            Next::Progress(event) => vec![event],
            Next::Answer(answer) => answer_event(DATA, *answer),
        }
    }
}

impl Running {
    /// The call's next event: its progress, in order, then its answer; none after that, or
    /// once the endpoint closes.
    async fn next(&mut self) -> Option<Next> {
        loop {
            if self.closing.is_cancelled() {
                return None;
            }
            if let Ok(event) = self.progress.try_recv() {
                return Some(Next::Progress(event));
            }
            if let Some(answer) = self.ready.take() {
                return Some(Next::Answer(Box::new(answer)));
            }
            let Self {
                answer,
                progress,
                closing,
                ..
            } = self;
            let waiting = answer.as_mut()?;
            tokio::select! {
                biased;
                _ = closing.cancelled() => return None,
                Some(event) = progress.recv() => return Some(Next::Progress(event)),
                answered = waiting => {
                    self.answer = None;
                    // None: the handler failed, and no answer comes (as from rmcp).
                    self.ready = Some(answered.ok()?);
                }
            }
        }
    }
}

impl Drop for Running {
    /// The agent left (or the endpoint closed) before the answer: the call is cancelled (its
    /// task runs on until its server has heard so).
    fn drop(&mut self) {
        if self.answer.is_some() {
            self.cancel.cancel();
        }
    }
}

/// A call's progress as events of its POST's stream, under the client's token, in the order it
/// came and never backwards.
struct ModernProgress {
    token: ProgressToken,
    last: Mutex<f64>,
    /// Where the events go; a reader too slow to take them misses some.
    updates: mpsc::Sender<Bytes>,
}

impl ProgressForward for ModernProgress {
    fn forward(&self, upstream: ProgressNotificationParam) {
        let Some(message) = progress_message(&self.token, &self.last, upstream) else {
            return;
        };
        send_event(&self.updates, &message);
    }

    /// Each update is an event the moment it is taken.
    fn flush(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// Where a call served here sends the log messages it asked for (read by `client::call_context`):
/// events of its POST's stream, among its progress; a reader too slow to take them misses some.
#[derive(Clone)]
pub(in crate::gateway) struct LogTo(mpsc::Sender<Bytes>);

#[allow(deprecated)] // logging: deprecated by SEP-2577, still asked for per request
impl LogTo {
    pub(in crate::gateway) fn send(&self, message: rmcp::model::LoggingMessageNotificationParam) {
        let notification = ServerNotification::LoggingMessageNotification(
            rmcp::model::LoggingMessageNotification::new(message),
        );
        send_event(&self.0, &JsonRpcMessage::notification(notification));
    }
}

/// `message` as an event of a call's POST stream, unless its reader is too far behind.
fn send_event(events: &mpsc::Sender<Bytes>, message: &TxJsonRpcMessage<RoleServer>) {
    if let Some(event) = message_event(DATA, message).pop() {
        let _ = events.try_send(event);
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use rmcp::model::{ErrorData, ServerResult};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn only_a_call_named_once_in_plain_headers_of_2026_07_28_is_taken() {
        let call = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ];
        assert!(names_a_call(&headers(&call)));
        let changed = |index: usize, value: &'static str| {
            let mut pairs = call.to_vec();
            pairs[index].1 = value;
            headers(&pairs)
        };
        assert!(!names_a_call(&changed(0, "2025-11-25")));
        assert!(!names_a_call(&changed(1, "tools/list")));
        // Base64-encoded: rmcp decodes it.
        assert!(!names_a_call(&changed(2, "=?base64?ZWNobw==?=")));
        for missing in 0..call.len() {
            let mut pairs = call.to_vec();
            pairs.remove(missing);
            assert!(
                !names_a_call(&headers(&pairs)),
                "without {:?}",
                call[missing]
            );
        }
        // Twice: rmcp refuses it.
        let mut twice = call.to_vec();
        twice.push(("mcp-name", "echo"));
        assert!(!names_a_call(&headers(&twice)));
    }

    #[test]
    fn a_call_is_taken_with_its_log_level_and_only_as_its_headers_name_it() {
        let named = headers(&[("mcp-name", "echo")]);
        let body = |meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"echo","arguments":{{}},"_meta":{{{meta}}}}}}}"#
            )
        };
        let modern = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}"#;
        let leveled = format!(r#"{modern},"io.modelcontextprotocol/logLevel":"warning""#);
        let (id, call) = checked_call(&named, body(&leveled).as_bytes()).expect("taken");
        assert_eq!(id, RequestId::Number(3));
        let meta = call
            .extensions
            .get::<RequestMetaObject>()
            .expect("its _meta");
        assert!(meta.log_level().is_some(), "the level goes along");
        assert!(checked_call(&named, body(modern).as_bytes()).is_some());
        let other = headers(&[("mcp-name", "slow")]);
        assert!(checked_call(&other, body(modern).as_bytes()).is_none());
        let no_capabilities = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28""#;
        assert!(checked_call(&named, body(no_capabilities).as_bytes()).is_none());
    }

    /// A quiet call's stream: a comment each keep-alive period, its progress as it comes, then
    /// its answer, and it ends.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_call_is_kept_alive_with_comments_until_its_answer() {
        let (answered, answer) = oneshot::channel();
        let (updates, progress) = mpsc::channel(4);
        let running = Running {
            answer: Some(answer),
            progress,
            ready: None,
            cancel: CancellationToken::new(),
            closing: CancellationToken::new(),
        };
        let mut rest = Box::pin(rest_of(running, Some(Duration::from_secs(15))));
        let start = tokio::time::Instant::now();
        for period in 1..=2 {
            assert_eq!(rest.next().await, Some(vec![Bytes::from_static(b":\n\n")]));
            assert_eq!(start.elapsed(), Duration::from_secs(15 * period));
        }
        let update = Bytes::from_static(b"data: {}\n\n");
        updates.send(update.clone()).await.unwrap();
        assert_eq!(rest.next().await, Some(vec![update]));
        let result = ServerResult::CallToolResult(rmcp::model::CallToolResult::success(vec![]));
        let answer = Answer::Message(JsonRpcMessage::response(result, RequestId::Number(1)));
        answered.send(answer).ok().unwrap();
        let pieces = rest.next().await.expect("the answer");
        let event = String::from_utf8(pieces.concat()).unwrap();
        assert!(
            event.starts_with("data: {") && event.contains("\"id\":1"),
            "{event}"
        );
        assert_eq!(rest.next().await, None, "it ends with the answer");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(30),
            "no comment came meanwhile"
        );
    }

    #[test]
    fn the_errors_rmcp_answers_with_another_status_get_it_here_too() {
        let error = |code: ErrorCode| -> TxJsonRpcMessage<RoleServer> {
            JsonRpcMessage::error(ErrorData::new(code, "x", None), Some(RequestId::Number(1)))
        };
        assert_eq!(
            refused_with(&error(ErrorCode::METHOD_NOT_FOUND)),
            Some(StatusCode::NOT_FOUND)
        );
        for code in [
            ErrorCode::HEADER_MISMATCH,
            ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
            ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
        ] {
            assert_eq!(refused_with(&error(code)), Some(StatusCode::BAD_REQUEST));
        }
        assert_eq!(refused_with(&error(ErrorCode::INVALID_PARAMS)), None);
        assert_eq!(refused_with(&error(ErrorCode::INTERNAL_ERROR)), None);
    }
}
