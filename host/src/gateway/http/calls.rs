//! A Streamable HTTP agent's tool calls, served past rmcp's session machinery.
//!
//! rmcp serves a POST by decoding it into its message enum (`serde_json`, variant after
//! variant), handing it to the session's worker task, which hands it to the service loop, which
//! spawns a task for the handler; the answer goes back the same way and is written as an event
//! of the POST's stream: about a third of what forwarding a call over HTTP costs the gateway.
//! A tool call that needs none of that is served here instead, as `direct.rs` serves a stdio
//! agent's: decoded straight into its type, run in one task through the very handler rmcp's
//! loop would, its answer written as an event of the POST's own stream.
//!
//! What rmcp would give such a call, it gets here too: a priming event that names where to
//! pick the stream up again (a GET with `Last-Event-ID`, answered here for these streams, the
//! answer kept as long as rmcp keeps one), keep-alive comments while it runs, cancellation by
//! `notifications/cancelled` (then no answer, and the stream ends), the session's end. A call
//! is taken only when nothing could need rmcp's routing: a session of a 2025 protocol version
//! whose client declared nothing a server may ask it (sampling, elicitation, roots), a call
//! without a progress token, and a request whose headers rmcp would accept as they are (no
//! `Origin`, a loopback `Host` where only loopback names are served, the session's protocol
//! version, a JSON body of known length within rmcp's limit). Everything else goes to rmcp,
//! unchanged. rmcp ends a session its worker has not heard from for its keep-alive; calls
//! served here tell it the session is in use (a no-op event) a few times a keep-alive.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use futures::future::BoxFuture;
use memchr::memmem;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, JsonRpcMessage, JsonRpcNotification, JsonRpcVersion2_0, ProgressNotification,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId, RequestMetaObject,
    ServerNotification, ServerResult,
};
use rmcp::service::NotificationContext;
use rmcp::service::TxJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use tokio::sync::watch;

use super::super::Gateway;
use super::super::direct::Direct;
use super::Hosts;
use crate::transport::lines::raw;
use crate::transport::lines::{Answer, Answers, DirectCalls};
use crate::transport::wire;
use crate::upstream::route::ProgressForward;

/// How often, as a share of rmcp's keep-alive (5 minutes by default), a session whose calls
/// are served here tells rmcp's worker it is in use.
const TOUCHES_PER_KEEP_ALIVE: u32 = 4;

/// An SSE comment while a call runs, as rmcp sends one: proxies keep the stream open.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);

/// Where this module's streams are named in their event ids: rmcp's are `<index>/<number>`,
/// which never starts with this.
const OURS: &str = "t";

/// The tool calls of an endpoint's sessions that are served here.
pub(in crate::gateway) struct HttpCalls {
    sessions: Mutex<HashMap<String, Arc<CallSession>, foldhash::fast::RandomState>>,
    manager: Arc<LocalSessionManager>,
    hosts: Hosts,
    /// rmcp's limit on a request's body.
    max_body: usize,
    next_stream: AtomicU64,
    /// What the ages below count from.
    epoch: Instant,
    /// How long an answer is kept for a stream picked up again (rmcp's figure).
    keep_answers: Duration,
    /// How often a session in use here is said to be in use to rmcp's worker, in ms.
    touch_every_ms: u64,
}

/// A session whose calls are served here.
pub(in crate::gateway) struct CallSession {
    direct: Direct,
    /// The protocol version its requests name in their header.
    version: HeaderValue,
    /// Its streams' answers, for picking a stream up again.
    streams: Mutex<HashMap<u64, Arc<Stream>, foldhash::fast::RandomState>>,
    /// When `streams` was last rid of the ones kept long enough, in ms from `epoch`.
    swept_ms: AtomicU64,
    /// When rmcp's worker last heard that the session is in use, in ms from `epoch`.
    touched_ms: AtomicU64,
}

/// One call's stream: its events so far (progress, then the answer), each in pieces (a
/// result's bytes are not copied), and whether it has ended.
struct Stream {
    events: Mutex<Events>,
    /// Bumped at every event and at the end: what readers wait on.
    changed: watch::Sender<()>,
    /// When it ended, in ms from `epoch` (0: still running).
    ended_ms: AtomicU64,
}

#[derive(Default)]
struct Events {
    /// Event `i + 1` of the stream (0 is the priming event).
    sent: Vec<Arc<[Bytes]>>,
    ended: bool,
    /// Where the answer is in `sent`, and what takes its place once it has gone out.
    answer: Option<(usize, Arc<[Bytes]>)>,
}

/// What a request to the endpoint is, for this module.
pub(in crate::gateway) enum Taken {
    /// A POST this module may serve (if its body is a call it can take).
    Post(Arc<CallSession>),
    /// A GET that picks one of this module's streams up again: which, after which event.
    Resume(Arc<CallSession>, (u64, usize)),
    /// rmcp's.
    Rmcp,
}

impl HttpCalls {
    pub(in crate::gateway) fn new(
        manager: Arc<LocalSessionManager>,
        hosts: Hosts,
        max_body: usize,
    ) -> Self {
        Self {
            sessions: Mutex::default(),
            keep_answers: manager.session_config.completed_cache_ttl,
            touch_every_ms: manager.session_config.keep_alive.map_or(u64::MAX, |idle| {
                (idle / TOUCHES_PER_KEEP_ALIVE).as_millis() as u64
            }),
            manager,
            hosts,
            max_body,
            next_stream: AtomicU64::new(1),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A session is up (`notifications/initialized`): its calls are served here from now on,
    /// if nothing in them could need rmcp's routing.
    pub(in crate::gateway) fn register(
        &self,
        gateway: Gateway,
        context: &NotificationContext<RoleServer>,
    ) {
        let Some(parts) = context.extensions.get::<axum::http::request::Parts>() else {
            return;
        };
        let Some(id) = parts
            .headers
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok())
        else {
            return;
        };
        let Some(client) = context.peer.peer_info() else {
            return;
        };
        let declared = &client.capabilities;
        let version = client.protocol_version.as_str();
        if version >= ProtocolVersion::V_2026_07_28.as_str()
            || declared.sampling.is_some()
            || declared.elicitation.is_some()
            || declared.roots.is_some()
        {
            return;
        }
        let Ok(version) = HeaderValue::from_str(version) else {
            return;
        };
        let direct = Direct::new(gateway);
        direct.serving(context.peer.clone());
        let session = Arc::new(CallSession {
            direct,
            version,
            streams: Mutex::default(),
            swept_ms: AtomicU64::new(0),
            touched_ms: AtomicU64::new(self.now_ms()),
        });
        let mut sessions = lock(&self.sessions);
        // Sessions rmcp has ended since (idle, or closed by their client) go.
        sessions.retain(|_, session| {
            let live = !session.direct.peer_closed();
            if !live {
                session.direct.closed();
            }
            live
        });
        sessions.insert(id.to_string(), session);
    }

    /// Whether `request` is one this module serves, by its headers.
    pub(in crate::gateway) fn take(&self, request: &Request) -> Taken {
        let headers = request.headers();
        let method = request.method();
        if method == Method::DELETE {
            self.forget(headers);
            return Taken::Rmcp;
        }
        if (method != Method::POST && method != Method::GET)
            || headers.contains_key(header::ORIGIN)
            || !self.host_is_served(headers)
        {
            return Taken::Rmcp;
        }
        let Some(session) = self.session(headers) else {
            return Taken::Rmcp;
        };
        if headers.get("mcp-protocol-version") != Some(&session.version) {
            return Taken::Rmcp;
        }
        let accepts = |media: &str| {
            headers
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .any(|value| value.contains(media) && !value.contains("q=0"))
        };
        if method == Method::GET {
            let stream = headers
                .get("last-event-id")
                .and_then(|id| id.to_str().ok())
                .and_then(our_stream);
            return match stream {
                Some(stream) if accepts("text/event-stream") => Taken::Resume(session, stream),
                _ => Taken::Rmcp,
            };
        }
        let json = headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|media| media.as_bytes().starts_with(b"application/json"));
        let length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok()?.parse::<usize>().ok());
        if json
            && length.is_some_and(|length| length <= self.max_body)
            && accepts("application/json")
            && accepts("text/event-stream")
        {
            Taken::Post(session)
        } else {
            Taken::Rmcp
        }
    }

    /// The live session a request names.
    fn session(&self, headers: &HeaderMap) -> Option<Arc<CallSession>> {
        let id = headers.get("mcp-session-id")?.to_str().ok()?;
        let mut sessions = lock(&self.sessions);
        let session = sessions.get(id)?;
        if session.direct.peer_closed() {
            session.direct.closed();
            sessions.remove(id);
            return None;
        }
        Some(session.clone())
    }

    /// The client closed its session: calls still running here are cancelled.
    fn forget(&self, headers: &HeaderMap) {
        let id = headers
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok());
        if let Some(session) = id.and_then(|id| lock(&self.sessions).remove(id)) {
            session.direct.closed();
        }
    }

    /// The endpoint closes: every call still running here is cancelled.
    pub(in crate::gateway) fn close(&self) {
        for (_, session) in lock(&self.sessions).drain() {
            session.direct.closed();
        }
    }

    /// rmcp checks `Host` against the names served before anything else (DNS rebinding):
    /// a request this module takes must pass that check as it stands.
    fn host_is_served(&self, headers: &HeaderMap) -> bool {
        if self.hosts == Hosts::Any {
            return true;
        }
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let name = match host.rsplit_once(':') {
            Some((name, port)) if !port.contains(']') => name,
            _ => host,
        };
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .any(|served| name.eq_ignore_ascii_case(served))
    }

    /// Serves a POST `Taken::Post` chose: a tool call it can take here, or (told of a
    /// cancellation) anything else through `rmcp`.
    pub(in crate::gateway) async fn serve_post(
        self: Arc<Self>,
        session: Arc<CallSession>,
        request: Request,
        rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
    ) -> Response {
        let (parts, body) = request.into_parts();
        let body = match axum::body::to_bytes(body, self.max_body).await {
            Ok(body) => body,
            Err(error) => {
                tracing::debug!("an MCP POST's body could not be read: {error}");
                return status(StatusCode::BAD_REQUEST);
            }
        };
        static TOOLS_CALL: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"\"tools/call\""));
        static CANCELLED: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"\"notifications/cancelled\""));
        if TOOLS_CALL.find(&body).is_some()
            && let Some((id, call)) = wire::Shallow::new(&body).and_then(wire::read_call)
            && needs_no_routing(&call)
        {
            let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
            let stream = session.open(number, &self);
            let mut call = call;
            let token = call
                .extensions
                .get::<RequestMetaObject>()
                .and_then(|meta| meta.get_progress_token());
            if let Some(token) = token {
                let progress = StreamProgress {
                    token,
                    stream: stream.clone(),
                    number,
                    last: Mutex::new(f64::NEG_INFINITY),
                };
                call.extensions.insert(ProgressTo(Arc::new(progress)));
            }
            let answers = answering(stream.clone(), number, self.clone());
            match session.direct.call(id, call, &answers) {
                None => {
                    drop(answers);
                    self.touch(&session, &parts.headers);
                    return event_stream(number, stream, None);
                }
                // Not taken (the session is ending): rmcp answers as it would.
                Some(_) => lock(&session.streams).remove(&number),
            };
        } else if CANCELLED.find(&body).is_some()
            && let Some(id) = cancelled_request(&body)
        {
            // rmcp is told too: it ignores a request it never saw.
            session.direct.cancelled(&id);
        }
        rmcp(Request::from_parts(parts, Body::from(body))).await
    }

    /// Tells rmcp's worker the session is in use, a few times a keep-alive at most: a request
    /// to close a stream that does not exist, which resets its keep-alive and does nothing.
    fn touch(&self, session: &CallSession, headers: &HeaderMap) {
        let now = self.now_ms();
        let touched = session.touched_ms.load(Ordering::Relaxed);
        if now.saturating_sub(touched) < self.touch_every_ms
            || session
                .touched_ms
                .compare_exchange(touched, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Some(id) = headers
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok())
        else {
            return;
        };
        let (manager, id) = (self.manager.clone(), Arc::<str>::from(id));
        tokio::spawn(async move {
            let handle = manager.sessions.read().await.get(&*id).cloned();
            if let Some(handle) = handle {
                let _ = handle.close_request_wise_channel(u64::MAX).await;
            }
        });
    }

    /// Serves a GET `Taken::Resume` chose: the stream's answer, once there.
    pub(in crate::gateway) fn resume(
        &self,
        session: &CallSession,
        (number, seen): (u64, usize),
    ) -> Response {
        match lock(&session.streams).get(&number) {
            Some(stream) => event_stream(number, stream.clone(), Some(seen)),
            None => status(StatusCode::NOT_FOUND),
        }
    }
}

impl CallSession {
    /// A new stream, numbered `number`; streams that ended longer ago than answers are kept go.
    fn open(&self, number: u64, calls: &HttpCalls) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            events: Mutex::default(),
            changed: watch::Sender::new(()),
            ended_ms: AtomicU64::new(0),
        });
        let now = calls.now_ms();
        let keep = calls.keep_answers.as_millis() as u64;
        let mut streams = lock(&self.streams);
        // Swept a few times a keep: a pass over every stream kept is not paid by every call.
        if now.saturating_sub(self.swept_ms.load(Ordering::Relaxed)) >= keep / 4 {
            self.swept_ms.store(now, Ordering::Relaxed);
            streams.retain(|_, stream| {
                let ended = stream.ended_ms.load(Ordering::Relaxed);
                ended == 0 || now.saturating_sub(ended) < keep
            });
        }
        streams.insert(number, stream.clone());
        stream
    }
}

impl Stream {
    /// Adds the event `event` makes of its number (from 1), unless the stream has ended.
    fn push(&self, event: impl FnOnce(usize) -> Vec<Bytes>) {
        let mut events = lock(&self.events);
        if events.ended {
            return;
        }
        let pieces = event(events.sent.len() + 1);
        if !pieces.is_empty() {
            events.sent.push(pieces.into());
            drop(events);
            self.changed.send_replace(());
        }
    }

    fn end(&self, calls: &HttpCalls) {
        let mut events = lock(&self.events);
        if events.ended {
            return;
        }
        events.ended = true;
        drop(events);
        // Never 0, which means running.
        self.ended_ms
            .store(calls.now_ms().max(1), Ordering::Relaxed);
        self.changed.send_replace(());
    }

    /// Adds the answer, which `event` makes of its number, and what takes its place once it
    /// has gone out (`stand_in`, of the same number), and ends the stream.
    fn answer(
        &self,
        event: impl FnOnce(usize) -> Vec<Bytes>,
        stand_in: impl FnOnce(usize) -> Vec<Bytes>,
        calls: &HttpCalls,
    ) {
        let mut events = lock(&self.events);
        if !events.ended {
            let index = events.sent.len() + 1;
            let pieces = event(index);
            if !pieces.is_empty() {
                events.sent.push(pieces.into());
                let stand_in = stand_in(index);
                if !stand_in.is_empty() {
                    events.answer = Some((index - 1, stand_in.into()));
                }
            }
        }
        drop(events);
        self.end(calls);
    }

    /// The events after the first `seen`, and whether the stream has ended. The answer, once
    /// read, is not kept: a stream picked up again after it gets the stand-in in its place (as
    /// from rmcp's streams, whose answers carry a result's bytes only on their way out).
    fn after(&self, seen: usize) -> (Vec<Arc<[Bytes]>>, bool) {
        let mut events = lock(&self.events);
        let read = events.sent.get(seen..).unwrap_or_default().to_vec();
        if events
            .answer
            .as_ref()
            .is_some_and(|(at, _)| *at >= seen && *at < events.sent.len())
            && let Some((at, stand_in)) = events.answer.take()
        {
            events.sent[at] = stand_in;
        }
        (read, events.ended)
    }
}

/// Ends its stream when dropped: after the answer, or without one (the call was cancelled, or
/// its session ended).
struct Answering {
    stream: Arc<Stream>,
    number: u64,
    calls: Arc<HttpCalls>,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.stream.end(&self.calls);
    }
}

/// Where `direct.rs` writes the call's answer: as the event of stream `number`.
fn answering(stream: Arc<Stream>, number: u64, calls: Arc<HttpCalls>) -> Answers {
    let answering = Answering {
        stream,
        number,
        calls,
    };
    Arc::new(
        move |answer: Answer| -> BoxFuture<'static, std::io::Result<()>> {
            let number = answering.number;
            let id = match &answer {
                Answer::Raw { id, .. } => Some(id.clone()),
                Answer::Message(JsonRpcMessage::Response(response)) => Some(response.id.clone()),
                Answer::Message(_) => None,
            };
            answering.stream.answer(
                |index| answer_event(number, index, answer),
                |index| match id {
                    Some(id) => stand_in_event(number, index, id),
                    // An error: small, kept as it is.
                    None => Vec::new(),
                },
                &answering.calls,
            );
            Box::pin(std::future::ready(Ok(())))
        },
    )
}

/// The answer as one SSE event, `id: t<number>/<index>`, in pieces.
fn answer_event(number: u64, index: usize, answer: Answer) -> Vec<Bytes> {
    let head = format!("id: {OURS}{number}/{index}\ndata: ");
    match answer {
        Answer::Raw {
            id,
            result,
            complete,
        } => {
            // The head as the line writer makes it (the result's own `{` is replaced by one
            // that opens `resultType` first when `complete`).
            let (start, _, _) = raw::answer_line(&id, b"{", complete);
            let skip = usize::from(complete);
            let result = result.into_bytes().slice(skip..);
            let mut pieces = vec![Bytes::from([head.as_bytes(), &start].concat())];
            // A line break inside the result (JSON allows one between tokens) would end the
            // event's data: each line goes on a `data:` line of its own, which SSE joins again
            // with a line break.
            if memchr::memchr2(b'\n', b'\r', &result).is_some() {
                pieces.push(Bytes::from(data_lines(&result)));
            } else {
                pieces.push(result);
            }
            pieces.push(Bytes::from_static(b"}\n\n"));
            pieces
        }
        Answer::Message(message) => {
            let mut event = head.into_bytes();
            // As rmcp's own writer, which cannot fail on a message it made either.
            if let Err(error) = sonic_rs::to_writer(&mut event, &message) {
                tracing::warn!("an answer could not be written: {error}");
                return Vec::new();
            }
            event.extend_from_slice(b"\n\n");
            vec![Bytes::from(event)]
        }
    }
}

/// What a stream picked up again after its answer went out gets in its place: the words of
/// `results.rs`'s stand-in (the tool answered; Tether keeps no copy of the result).
fn stand_in_event(number: u64, index: usize, id: RequestId) -> Vec<Bytes> {
    let result = ServerResult::CallToolResult(super::results::stand_in_result(false));
    let message: TxJsonRpcMessage<RoleServer> = JsonRpcMessage::response(result, id);
    let mut event = format!("id: {OURS}{number}/{index}\ndata: ").into_bytes();
    match sonic_rs::to_writer(&mut event, &message) {
        Ok(()) => {
            event.extend_from_slice(b"\n\n");
            vec![Bytes::from(event)]
        }
        Err(_) => Vec::new(),
    }
}

/// `bytes` with every line break (CR, LF or CRLF) followed by `data: `.
fn data_lines(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 64);
    let mut rest = bytes;
    while let Some(at) = memchr::memchr2(b'\n', b'\r', rest) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(b"\ndata: ");
        let skip = if rest[at] == b'\r' && rest.get(at + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[at + skip..];
    }
    out.extend_from_slice(rest);
    out
}

/// Stream `number` as an event stream from after event `seen`: its priming event (on the POST
/// that opened it), then its events as they come, with keep-alive comments while its call
/// runs, until it ends.
fn event_stream(number: u64, stream: Arc<Stream>, seen: Option<usize>) -> Response {
    let retry = SessionConfig::DEFAULT_SSE_RETRY.as_millis();
    let priming = seen
        .is_none()
        .then(|| Bytes::from(format!("id: {OURS}{number}/0\nretry: {retry}\ndata: \n\n")));
    let changed = stream.changed.subscribe();
    let events = futures::stream::unfold((seen.unwrap_or(0), false), move |(seen, ended)| {
        let stream = stream.clone();
        let mut changed = changed.clone();
        async move {
            if ended {
                return None;
            }
            let keep_alive = tokio::time::sleep(KEEP_ALIVE_EVERY);
            tokio::pin!(keep_alive);
            loop {
                changed.mark_unchanged();
                let (events, ended) = stream.after(seen);
                if !events.is_empty() || ended {
                    let seen = seen + events.len();
                    let pieces: Vec<Bytes> = events
                        .iter()
                        .flat_map(|event| event.iter().cloned())
                        .collect();
                    return Some((pieces, (seen, ended)));
                }
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = &mut keep_alive => {
                        return Some((vec![Bytes::from_static(b":\n\n")], (seen, false)));
                    }
                }
            }
        }
    })
    .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok::<_, Infallible>)));
    let body = futures::stream::iter(priming.map(Ok)).chain(events);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR))
}

fn status(code: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    response
}

/// The stream a `Last-Event-ID` of this module's names, and the event.
fn our_stream(last_event_id: &str) -> Option<(u64, usize)> {
    let (stream, index) = last_event_id.strip_prefix(OURS)?.split_once('/')?;
    Some((stream.parse().ok()?, index.parse().ok()?))
}

/// A call that names no protocol version of its own (a 2026-07-28 request's).
fn needs_no_routing(call: &CallToolRequest) -> bool {
    call.extensions
        .get::<RequestMetaObject>()
        .is_none_or(|meta| !meta.contains_key(super::super::client::PROTOCOL_VERSION_KEY))
}

/// Where a call served here sends its progress (read by `client::call_context`).
#[derive(Clone)]
pub(in crate::gateway) struct ProgressTo(pub Arc<dyn ProgressForward>);

/// A call's progress as events of its own stream, under the client's token, in the order it
/// came and never backwards (as `client::Forwarder` passes it to rmcp).
struct StreamProgress {
    token: ProgressToken,
    stream: Arc<Stream>,
    number: u64,
    last: Mutex<f64>,
}

impl ProgressForward for StreamProgress {
    fn forward(&self, upstream: ProgressNotificationParam) {
        let mut last = lock(&self.last);
        if upstream.progress <= *last {
            return;
        }
        *last = upstream.progress;
        let mut update = ProgressNotificationParam::new(self.token.clone(), upstream.progress);
        update.total = upstream.total;
        update.message = upstream.message;
        let message: TxJsonRpcMessage<RoleServer> =
            JsonRpcMessage::Notification(JsonRpcNotification {
                jsonrpc: JsonRpcVersion2_0,
                notification: ServerNotification::ProgressNotification(ProgressNotification::new(
                    update,
                )),
            });
        self.stream.push(|index| {
            let mut event = format!("id: {OURS}{}/{index}\ndata: ", self.number).into_bytes();
            match sonic_rs::to_writer(&mut event, &message) {
                Ok(()) => {
                    event.extend_from_slice(b"\n\n");
                    vec![Bytes::from(event)]
                }
                Err(_) => Vec::new(),
            }
        });
    }

    /// Each update is an event of the stream the moment it is taken.
    fn flush(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// The request a `notifications/cancelled` names.
fn cancelled_request(body: &[u8]) -> Option<RequestId> {
    #[derive(serde::Deserialize)]
    struct Cancelled {
        method: String,
        params: Params,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        request_id: RequestId,
    }
    let cancelled: Cancelled = sonic_rs::from_slice(body).ok()?;
    (cancelled.method == "notifications/cancelled").then_some(cancelled.params.request_id)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_breaks_in_a_result_become_data_lines() {
        assert_eq!(
            data_lines(b"{\"a\":\n1,\r\n\"b\":\r2}"),
            b"{\"a\":\ndata: 1,\ndata: \"b\":\ndata: 2}"
        );
        assert_eq!(data_lines(b"{}"), b"{}");
    }

    #[test]
    fn only_this_modules_event_ids_are_its_own() {
        assert_eq!(our_stream("t17/0"), Some((17, 0)));
        assert_eq!(our_stream("t17/3"), Some((17, 3)));
        assert_eq!(our_stream("0/17"), None);
        assert_eq!(our_stream("17"), None);
        assert_eq!(our_stream("t/1"), None);
    }

    #[test]
    fn a_cancellation_names_its_request() {
        let body = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#;
        assert_eq!(cancelled_request(body), Some(RequestId::Number(7)));
        let other =
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"requestId":7}}"#;
        assert_eq!(cancelled_request(other), None);
    }
}
