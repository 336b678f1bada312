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
//! pick the stream up again (a GET with `Last-Event-ID`, answered here for these streams: the
//! newest reader takes the stream over, as in rmcp), keep-alive comments while it runs, its
//! progress on its stream before the answer, cancellation by `notifications/cancelled` (then no
//! answer, and the stream ends; the POST that carries it is read here, whether it says its
//! length or comes in chunks, and passed on to rmcp whole), the session's end. What a server
//! asks the client during the call (sampling, an elicitation, roots) rides the call's own
//! stream, where rmcp puts a request that belongs to a client's request (on rmcp's standalone
//! stream, as rmcp falls back, once the call's has ended), and the client's answer, POSTed to
//! the session, is taken here. A call is taken only when nothing could need rmcp's routing: a
//! session of a 2025 protocol version, and a request whose headers rmcp would accept as they are
//! (no `Origin`, a loopback `Host` where only loopback names are served, the session's protocol
//! version, a JSON body within rmcp's limit, whether it says its length or comes in chunks).
//! Everything else goes to rmcp, unchanged. rmcp ends a session its worker has not heard from
//! for its keep-alive: a task tends the sessions served here a few times a keep-alive, telling
//! rmcp's worker of the ones in use (a no-op event), ending the calls of the ones rmcp has
//! ended, and dropping the streams kept long enough.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use futures::future::BoxFuture;
use memchr::memmem;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, ClientJsonRpcMessage, ClientResult, ErrorData, JsonRpcError, JsonRpcMessage,
    JsonRpcNotification, JsonRpcVersion2_0, ProgressNotification, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, RequestId, RequestMetaObject, ServerNotification,
    ServerRequest, ServerResult,
};
use rmcp::service::NotificationContext;
use rmcp::service::TxJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::super::Gateway;
use super::super::direct::Direct;
use super::Hosts;
use crate::transport::lines::raw;
use crate::transport::lines::{Answer, Answers, DirectCalls};
use crate::transport::wire;
use crate::upstream::route::ProgressForward;

mod modern;

pub(in crate::gateway) use modern::LogTo;

/// How often, as a share of rmcp's keep-alive (5 minutes by default) and of how long answers
/// are kept (1 minute), the sessions served here are tended.
const TENDS_PER_PERIOD: u32 = 4;

/// The events a stream keeps once read, for a reader picking it up again (rmcp keeps 16).
const KEPT_EVENTS: usize = 64;

/// The progress a stream holds for a reader too slow to take it (as `client::Forwarder`
/// holds for an rmcp stream): past it, a slow reader misses some; the answer always comes.
const UNREAD_EVENTS: usize = 4096;

/// Where this module's streams are named in their event ids: rmcp's are `<index>/<number>`,
/// which never starts with this.
const OURS: &str = "t";

/// What the ids of the requests this module sends a client start with: rmcp numbers its own,
/// so the two never meet.
const ASKED: &str = "tether-asked-";

/// The tool calls of an endpoint's sessions that are served here.
pub(in crate::gateway) struct HttpCalls {
    sessions: Mutex<HashMap<String, Arc<CallSession>, foldhash::fast::RandomState>>,
    manager: Arc<LocalSessionManager>,
    settings: Settings,
    next_stream: AtomicU64,
    /// What the ages below count from.
    epoch: Instant,
    /// How long an answer is kept for a stream picked up again (rmcp's figure), in ms.
    keep_answers_ms: u64,
    /// How often the sessions are tended.
    tend_every: Duration,
    /// Whether the task that tends them runs.
    tending: AtomicBool,
    /// The gateway 2026-07-28 agents' calls are served by (see `modern.rs`), once given.
    gateway: OnceLock<Arc<Gateway>>,
    /// The peer their calls' contexts name, once one came.
    modern: OnceLock<modern::Modern>,
    /// Cancelled when the endpoint closes: ends the calls served here without a session.
    closing: CancellationToken,
}

/// What rmcp's endpoint is configured with that this module must match.
pub(in crate::gateway) struct Settings {
    pub hosts: Hosts,
    /// rmcp's limit on a request's body.
    pub max_body: usize,
    /// The `retry` of a priming event.
    pub sse_retry: Option<Duration>,
    /// How often a comment keeps a quiet stream open.
    pub sse_keep_alive: Option<Duration>,
}

/// A session whose calls are served here.
pub(in crate::gateway) struct CallSession {
    /// Its `Mcp-Session-Id`.
    id: Arc<str>,
    direct: Direct,
    /// The protocol version its requests name in their header.
    version: HeaderValue,
    /// Its streams' answers, for picking a stream up again.
    streams: Mutex<HashMap<u64, Arc<Stream>, foldhash::fast::RandomState>>,
    /// When a call was last served here, and when rmcp's worker last heard that the session
    /// is in use, in ms from `epoch`.
    used_ms: AtomicU64,
    touched_ms: AtomicU64,
    /// Whether its client declared anything a server may ask it (sampling, elicitation, roots).
    askable: bool,
    /// What its calls asked the client and wait for an answer to, by the id the client sees.
    asked: Mutex<HashMap<RequestId, Answered>>,
    next_asked: AtomicU64,
}

/// Where the client's answer to a request it was sent goes.
type Answered = oneshot::Sender<Result<ClientResult, ErrorData>>;

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
    /// Events `dropped + 1` onwards (0 is the priming event).
    sent: VecDeque<Arc<[Bytes]>>,
    /// The oldest events no longer kept.
    dropped: usize,
    /// The last event the current reader has taken.
    read: usize,
    ended: bool,
    /// The answer's event number, and what takes its place once it has gone out.
    answer: Option<(usize, Arc<[Bytes]>)>,
    /// The reader the stream is read by (each pick-up takes it over).
    reader: u64,
}

/// What a reader of a stream takes at once.
struct Read {
    events: Vec<Arc<[Bytes]>>,
    /// The number of the last event read so far.
    last: usize,
    ended: bool,
}

/// What a request to the endpoint is, for this module.
pub(in crate::gateway) enum Taken {
    /// A POST whose body this module reads first.
    Read(ReadFirst),
    /// A GET that picks one of this module's streams up again: which, after which event.
    Resume(Arc<CallSession>, (u64, usize)),
    /// The client ends a session served here.
    Delete(Arc<CallSession>),
    /// rmcp's.
    Rmcp,
}

/// A POST this module reads whole before it decides.
pub(in crate::gateway) enum ReadFirst {
    /// One this module may serve (if its body is a call it can take).
    Post(Arc<CallSession>),
    /// Another POST of a session served here (it may cancel a call served here).
    Other(Arc<CallSession>),
    /// One of a 2026-07-28 agent (no session) this module may serve, if its body is a call
    /// it can take (see `modern.rs`).
    Modern,
}

impl HttpCalls {
    pub(in crate::gateway) fn new(manager: Arc<LocalSessionManager>, settings: Settings) -> Self {
        let config = &manager.session_config;
        let keep_answers = config.completed_cache_ttl;
        let period = config
            .keep_alive
            .map_or(keep_answers, |idle| idle.min(keep_answers));
        Self {
            sessions: Mutex::default(),
            keep_answers_ms: keep_answers.as_millis() as u64,
            tend_every: (period / TENDS_PER_PERIOD).max(Duration::from_millis(1)),
            tending: AtomicBool::new(false),
            manager,
            settings,
            next_stream: AtomicU64::new(1),
            epoch: Instant::now(),
            gateway: OnceLock::new(),
            modern: OnceLock::new(),
            closing: CancellationToken::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A session is up (`notifications/initialized`): its calls are served here from now on,
    /// if nothing in them could need rmcp's routing.
    pub(in crate::gateway) fn register(
        self: &Arc<Self>,
        gateway: Gateway,
        context: &NotificationContext<RoleServer>,
    ) {
        let Some(parts) = context.extensions.get::<Parts>() else {
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
        if version >= ProtocolVersion::V_2026_07_28.as_str() {
            return;
        }
        let askable = declared.sampling.is_some()
            || declared.elicitation.is_some()
            || declared.roots.is_some();
        let Ok(version) = HeaderValue::from_str(version) else {
            return;
        };
        let direct = Direct::new(gateway);
        direct.serving(context.peer.clone());
        let now = self.now_ms();
        let session = Arc::new(CallSession {
            id: Arc::from(id),
            direct,
            version,
            streams: Mutex::default(),
            used_ms: AtomicU64::new(now),
            touched_ms: AtomicU64::new(now),
            askable,
            asked: Mutex::default(),
            next_asked: AtomicU64::new(1),
        });
        lock(&self.sessions).insert(id.to_string(), session);
        if !self.tending.swap(true, Ordering::Relaxed) {
            tokio::spawn(tend(Arc::downgrade(self)));
        }
    }

    /// Whether `request` is one this module serves, by its headers.
    pub(in crate::gateway) fn take(&self, request: &Request) -> Taken {
        let headers = request.headers();
        let method = request.method();
        if method == Method::DELETE {
            return match self.session(headers) {
                Some(session) => Taken::Delete(session),
                None => Taken::Rmcp,
            };
        }
        if method != Method::POST && method != Method::GET {
            return Taken::Rmcp;
        }
        if method == Method::POST && !headers.contains_key("mcp-session-id") {
            return match self.takes_modern(headers) {
                true => Taken::Read(ReadFirst::Modern),
                false => Taken::Rmcp,
            };
        }
        let Some(session) = self.session(headers) else {
            return Taken::Rmcp;
        };
        let guards = self.passes_rmcps_guards(headers);
        if method == Method::GET {
            let stream = headers
                .get("last-event-id")
                .and_then(|id| id.to_str().ok())
                .and_then(our_stream);
            // rmcp takes a GET without the version header, or with any it knows of for a
            // session; it could not resume a stream of Tether's (its answer would be lost).
            let takes_get = guards && to_a_session(headers);
            return match stream {
                Some(stream) if takes_get && accepts(headers, "text/event-stream") => {
                    Taken::Resume(session, stream)
                }
                _ => Taken::Rmcp,
            };
        }
        let as_rmcp_takes = guards && headers.get("mcp-protocol-version") == Some(&session.version);
        if as_rmcp_takes && self.plain_json_post(headers) {
            Taken::Read(ReadFirst::Post(session))
        } else if guards && acceptable_post(headers) {
            // It may cancel a call served here (whether or not it says its length).
            Taken::Read(ReadFirst::Other(session))
        } else {
            // rmcp refuses it by its headers alone, before reading its body.
            Taken::Rmcp
        }
    }

    /// The length a POST's body says it has, if within rmcp's limit.
    fn length(&self, headers: &HeaderMap) -> Option<usize> {
        headers
            .get(header::CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok()?.parse::<usize>().ok())
            .filter(|length| *length <= self.settings.max_body)
    }

    /// Whether a request passes as it stands what rmcp checks before anything else: no
    /// `Origin` (a browser's, which rmcp judges), a `Host` it serves.
    fn passes_rmcps_guards(&self, headers: &HeaderMap) -> bool {
        !headers.contains_key(header::ORIGIN) && self.host_is_served(headers)
    }

    /// Whether a POST is one rmcp takes as it is: a JSON body that says no length past its
    /// limit (one in chunks is read up to it), for a client that accepts both JSON and event
    /// streams.
    fn plain_json_post(&self, headers: &HeaderMap) -> bool {
        let within =
            !headers.contains_key(header::CONTENT_LENGTH) || self.length(headers).is_some();
        within && acceptable_post(headers)
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

    /// Serves a DELETE `Taken::Delete` chose, through `rmcp`: once rmcp has closed the
    /// session, calls still running here are cancelled.
    async fn serve_delete(
        self: Arc<Self>,
        session: Arc<CallSession>,
        request: Request,
        rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
    ) -> Response {
        let response = rmcp(request).await;
        if response.status().is_success() {
            lock(&self.sessions).retain(|_, kept| !Arc::ptr_eq(kept, &session));
            session.direct.closed();
        }
        response
    }

    /// The endpoint closes: every call still running here is cancelled.
    pub(in crate::gateway) fn close(&self) {
        self.closing.cancel();
        for (_, session) in lock(&self.sessions).drain() {
            session.direct.closed();
        }
    }

    /// rmcp checks `Host` against the names served before anything else (DNS rebinding):
    /// a request this module takes must pass that check as it stands.
    fn host_is_served(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let Ok(authority) = host.parse::<axum::http::uri::Authority>() else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false;
        }
        self.settings.hosts == Hosts::Any
            || ["localhost", "127.0.0.1", "[::1]"]
                .iter()
                .any(|served| authority.host().eq_ignore_ascii_case(served))
    }

    /// Serves a request as `take` chose, through `rmcp` where it is rmcp's.
    pub(in crate::gateway) async fn serve(
        self: Arc<Self>,
        taken: Taken,
        request: Request,
        rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
    ) -> Response {
        let read = match taken {
            Taken::Rmcp => return rmcp(request).await,
            Taken::Resume(session, stream) => {
                self.used(&session);
                return self.resume(&session, stream);
            }
            Taken::Delete(session) => return self.serve_delete(session, request, rmcp).await,
            Taken::Read(read) => read,
        };
        let (parts, body) = request.into_parts();
        let body = match read_within(body, self.settings.max_body).await {
            Ok(body) => body,
            // Broken, or longer than rmcp takes: rmcp's to answer, as it came.
            Err(body) => return rmcp(Request::from_parts(parts, body)).await,
        };
        match read {
            ReadFirst::Post(session) => self.serve_post(session, parts, body, rmcp).await,
            // A cancellation that rmcp accepts cancels the call here too (rmcp ignores one
            // of a request it never saw).
            ReadFirst::Other(session) => pass_on(&session, parts, body, rmcp).await,
            ReadFirst::Modern => self.serve_modern(parts, body, rmcp).await,
        }
    }

    /// Serves a POST `ReadFirst::Post` chose, read whole: a tool call it can take here, or
    /// anything else through `rmcp`.
    async fn serve_post(
        self: Arc<Self>,
        session: Arc<CallSession>,
        parts: Parts,
        body: Bytes,
        rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
    ) -> Response {
        static TOOLS_CALL: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"\"tools/call\""));
        if TOOLS_CALL.find(&body).is_some()
            && let Some((id, call)) = wire::Shallow::new(&body).and_then(wire::read_call)
            && needs_no_routing(&call)
        {
            let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
            let stream = session.open(number);
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
            if session.askable {
                call.extensions.insert(AskOn {
                    session: Arc::downgrade(&session),
                    stream: stream.clone(),
                    number,
                });
            }
            let answers = answering(stream.clone(), number, self.clone());
            match session.direct.call(id, call, &answers) {
                None => {
                    drop(answers);
                    self.used(&session);
                    return event_stream(number, stream, None, &self.settings);
                }
                // Not taken (the session is ending): rmcp answers as it would.
                Some(_) => lock(&session.streams).remove(&number),
            };
        }
        pass_on(&session, parts, body, rmcp).await
    }

    /// Tends the sessions: the calls of a session rmcp has ended are cancelled and it goes;
    /// rmcp's worker hears of a session in use here since it last heard, or with a call still
    /// running (a request to close a stream that does not exist, which resets its keep-alive
    /// and does nothing else); streams that ended longer ago than answers are kept go.
    async fn tend_once(&self) {
        let live: Vec<(String, Arc<CallSession>)> = {
            let mut sessions = lock(&self.sessions);
            sessions.retain(|_, session| {
                let ended = session.direct.peer_closed();
                if ended {
                    session.direct.closed();
                }
                !ended
            });
            let sessions = sessions.iter();
            sessions
                .map(|(id, session)| (id.clone(), session.clone()))
                .collect()
        };
        let now = self.now_ms();
        let mut touches = Vec::new();
        for (id, session) in live {
            let running = {
                let mut streams = lock(&session.streams);
                streams.retain(|_, stream| {
                    let ended = stream.ended_ms.load(Ordering::Relaxed);
                    ended == 0 || now.saturating_sub(ended) < self.keep_answers_ms
                });
                streams
                    .values()
                    .any(|stream| stream.ended_ms.load(Ordering::Relaxed) == 0)
            };
            let used = session.used_ms.load(Ordering::Relaxed);
            if running || used > session.touched_ms.load(Ordering::Relaxed) {
                session.touched_ms.store(now, Ordering::Relaxed);
                touches.push(self.touch(id));
            }
        }
        // At once, each bounded: a worker stuck on a client that reads nothing must not keep
        // the others' sessions from being tended.
        futures::future::join_all(touches).await;
    }

    /// A request of `session` was served here: rmcp's worker, which ends a session it has not
    /// heard from for its keep-alive, hears of it now if the last tend may not have told it
    /// (a tend may come only after the keep-alive has run out, as rmcp counts from the last
    /// request it saw).
    fn used(self: &Arc<Self>, session: &CallSession) {
        let now = self.now_ms();
        session.used_ms.store(now, Ordering::Relaxed);
        let touched = session.touched_ms.load(Ordering::Relaxed);
        if now.saturating_sub(touched) >= self.tend_every.as_millis() as u64
            && session
                .touched_ms
                .compare_exchange(touched, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let calls = self.clone();
            let id = session.id.to_string();
            tokio::spawn(async move { calls.touch(id).await });
        }
    }

    /// Tells rmcp's worker that session `id` is in use (a request to close a stream that does
    /// not exist, which resets its keep-alive and does nothing else), waiting at most a tend.
    async fn touch(&self, id: String) {
        let handle = self.manager.sessions.read().await.get(id.as_str()).cloned();
        if let Some(handle) = handle {
            let touched = handle.close_request_wise_channel(u64::MAX);
            let _ = tokio::time::timeout(self.tend_every, touched).await;
        }
    }

    /// Serves a GET `Taken::Resume` chose: the stream's answer, once there.
    fn resume(&self, session: &CallSession, (number, seen): (u64, usize)) -> Response {
        let stream = lock(&session.streams).get(&number).cloned();
        match stream {
            Some(stream) => event_stream(number, stream, Some(seen), &self.settings),
            // Gone, or never there: an empty stream, as rmcp answers (a 404 would say the
            // session is gone).
            None => event_stream(number, Arc::new(Stream::ended()), Some(0), &self.settings),
        }
    }
}

impl CallSession {
    /// Takes the client's answer to a request a call served here sent it (accepted as rmcp
    /// accepts an answer: 202, no body); `None` if `body` is no such answer.
    fn take_answer(&self, body: &[u8]) -> Option<Response> {
        if lock(&self.asked).is_empty() {
            return None;
        }
        // Decoded as rmcp decodes it, so the answer is what rmcp would have passed on.
        let (id, answer) = match serde_json::from_slice::<ClientJsonRpcMessage>(body).ok()? {
            JsonRpcMessage::Response(response) => (response.id, Ok(response.result)),
            JsonRpcMessage::Error(JsonRpcError {
                id: Some(id),
                error,
                ..
            }) => (id, Err(error)),
            _ => return None,
        };
        let waiting = lock(&self.asked).remove(&id)?;
        let _ = waiting.send(answer);
        Some(status(StatusCode::ACCEPTED))
    }

    /// A new stream, numbered `number`.
    fn open(&self, number: u64) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            events: Mutex::default(),
            changed: watch::Sender::new(()),
            ended_ms: AtomicU64::new(0),
        });
        lock(&self.streams).insert(number, stream.clone());
        stream
    }
}

impl Stream {
    /// A stream that has ended with nothing in it.
    fn ended() -> Self {
        let events = Events {
            ended: true,
            ..Events::default()
        };
        Self {
            events: Mutex::new(events),
            changed: watch::Sender::new(()),
            ended_ms: AtomicU64::new(1),
        }
    }

    /// Adds the event `event` makes of its number (from 1), unless the stream has ended (or,
    /// unless it is the answer, `answer`, its reader is too far behind); the number, if it was
    /// added. Events read are kept up to [`KEPT_EVENTS`], the oldest going first.
    fn push(&self, answer: bool, event: impl FnOnce(usize) -> Vec<Bytes>) -> Option<usize> {
        let mut events = lock(&self.events);
        if events.ended {
            return None;
        }
        while events.sent.len() >= KEPT_EVENTS && events.dropped < events.read {
            events.sent.pop_front();
            events.dropped += 1;
        }
        if !answer && events.sent.len() >= UNREAD_EVENTS {
            return None;
        }
        let number = events.dropped + events.sent.len() + 1;
        let pieces = event(number);
        if pieces.is_empty() {
            return None;
        }
        events.sent.push_back(pieces.into());
        drop(events);
        self.changed.send_replace(());
        Some(number)
    }

    /// Adds the answer, which `event` makes of its number, and what takes its place once it
    /// has gone out (`stand_in`, of the same number), and ends the stream.
    fn answer(
        &self,
        event: impl FnOnce(usize) -> Vec<Bytes>,
        stand_in: impl FnOnce(usize) -> Vec<Bytes>,
        calls: &HttpCalls,
    ) {
        if let Some(number) = self.push(true, event) {
            let stand_in = stand_in(number);
            if !stand_in.is_empty() {
                lock(&self.events).answer = Some((number, stand_in.into()));
            }
        }
        self.end(calls);
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

    /// A reader picks the stream up: the one before stops reading it.
    fn take_over(&self) -> u64 {
        let mut events = lock(&self.events);
        events.reader += 1;
        let reader = events.reader;
        drop(events);
        self.changed.send_replace(());
        reader
    }

    /// For `reader`, the events after event `seen` (those still kept), the last one's number,
    /// and whether the stream has ended; `None` once another reader has taken the stream over.
    /// A large result's bytes, once read, are not kept: a stream picked up again after them
    /// gets the stand-in in their place (see [`given_way`]).
    fn after(&self, seen: usize, reader: u64) -> Option<Read> {
        let mut events = lock(&self.events);
        if events.reader != reader {
            return None;
        }
        let skip = seen.saturating_sub(events.dropped);
        let read: Vec<_> = events.sent.iter().skip(skip).cloned().collect();
        let last = events.dropped + events.sent.len();
        if let Some((at, _)) = events.answer
            && at > seen
            && at <= last
            && let Some((at, stand_in)) = events.answer.take()
        {
            let slot = at - events.dropped - 1;
            events.sent[slot] = stand_in;
        }
        events.read = events.read.max(last);
        Some(Read {
            events: read,
            last: last.max(seen),
            ended: events.ended,
        })
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
            let id = given_way(&answer);
            answering.stream.answer(
                |index| answer_event(&event_head(number, index), answer),
                |index| match id {
                    Some(id) => stand_in_event(number, index, id),
                    None => Vec::new(),
                },
                &answering.calls,
            );
            Box::pin(std::future::ready(Ok(())))
        },
    )
}

/// A result this small is kept, once read, for a reader that picks its stream up again (the
/// connection it was written to may have died with it), as rmcp keeps its answers.
const KEEP_READ_RESULT: usize = 64 << 10;

/// For an answer that gives way to the stand-in once read, its id: a larger result as the
/// server's bytes, which Tether keeps no copy of (as rmcp, whose answers get a result's bytes
/// only on their way out). Typed answers and errors are kept as they are.
fn given_way(answer: &Answer) -> Option<RequestId> {
    match answer {
        Answer::Raw { id, result, .. } if result.as_slice().len() > KEEP_READ_RESULT => {
            Some(id.clone())
        }
        _ => None,
    }
}

/// The answer as one SSE event that starts with `head` (up to its data), in pieces.
fn answer_event(head: &str, answer: Answer) -> Vec<Bytes> {
    match answer {
        // The result's bytes hold no line break (`raw.rs` passes none), so they go on the
        // event's one `data` line as they are.
        Answer::Raw {
            id,
            result,
            complete,
        } => {
            // The head as the line writer makes it (the result's own `{` is replaced by one
            // that opens `resultType` first when `complete`).
            let (start, _, _) = raw::answer_line(&id, b"{", complete);
            let head = [head.as_bytes(), &start].concat();
            let result = result.into_bytes().slice(usize::from(complete)..);
            vec![Bytes::from(head), result, Bytes::from_static(b"}\n\n")]
        }
        Answer::Message(message) => message_event(head, &message),
    }
}

/// What a stream picked up again after its answer went out gets in its place: the words of
/// `results.rs`'s stand-in (the tool answered; Tether keeps no copy of the result).
fn stand_in_event(number: u64, index: usize, id: RequestId) -> Vec<Bytes> {
    let result = ServerResult::CallToolResult(super::results::stand_in_result(false));
    message_event(
        &event_head(number, index),
        &JsonRpcMessage::response(result, id),
    )
}

fn event_head(number: u64, index: usize) -> String {
    format!("id: {OURS}{number}/{index}\ndata: ")
}

/// `message` as an event that starts with `head` (none if it cannot be written, which rmcp's
/// own writer does not expect either).
fn message_event(head: &str, message: &TxJsonRpcMessage<RoleServer>) -> Vec<Bytes> {
    let mut event = head.as_bytes().to_vec();
    if let Err(error) = sonic_rs::to_writer(&mut event, message) {
        tracing::warn!("a message could not be written: {error}");
        return Vec::new();
    }
    event.extend_from_slice(b"\n\n");
    vec![Bytes::from(event)]
}

/// Stream `number` as an event stream from after event `seen`: its priming event (on the POST
/// that opened it, `seen` `None`), then its events as they come, with keep-alive comments while
/// its call runs, until it ends or another reader picks it up.
fn event_stream(
    number: u64,
    stream: Arc<Stream>,
    seen: Option<usize>,
    settings: &Settings,
) -> Response {
    let priming = seen.is_none().then(|| {
        let retry = settings
            .sse_retry
            .map(|retry| format!("retry: {}\n", retry.as_millis()))
            .unwrap_or_default();
        Bytes::from(format!("id: {OURS}{number}/0\n{retry}data: \n\n"))
    });
    let reader = match seen {
        Some(_) => stream.take_over(),
        None => 0,
    };
    let keep_alive = settings.sse_keep_alive;
    let changed = stream.changed.subscribe();
    let events = futures::stream::unfold((seen.unwrap_or(0), false), move |(seen, ended)| {
        let stream = stream.clone();
        let mut changed = changed.clone();
        async move {
            if ended {
                return None;
            }
            let quiet = quiet_for(keep_alive);
            tokio::pin!(quiet);
            loop {
                changed.mark_unchanged();
                let Read {
                    events,
                    last,
                    ended,
                } = stream.after(seen, reader)?;
                if !events.is_empty() || ended {
                    let seen = last;
                    let pieces: Vec<Bytes> = events
                        .iter()
                        .flat_map(|event| event.iter().cloned())
                        .collect();
                    return Some((pieces, (seen, ended)));
                }
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = &mut quiet => {
                        return Some((vec![Bytes::from_static(KEEP_ALIVE)], (seen, false)));
                    }
                }
            }
        }
    })
    .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok::<_, Infallible>)));
    let body = futures::stream::iter(priming.map(Ok)).chain(events);
    event_stream_response(Body::from_stream(body))
}

/// What keeps a quiet event stream open: a comment, as rmcp sends it.
const KEEP_ALIVE: &[u8] = b":\n\n";

/// Resolves once a stream has been quiet for `keep_alive` (never, without one).
async fn quiet_for(keep_alive: Option<Duration>) {
    match keep_alive {
        Some(every) => tokio::time::sleep(every).await,
        None => std::future::pending().await,
    }
}

/// An event stream's response, with rmcp's headers.
fn event_stream_response(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR))
}

/// The POST `parts` with `body`, through `rmcp`; a cancellation rmcp accepts cancels the call
/// here too (rmcp ignores one of a request it never saw).
async fn pass_on(
    session: &CallSession,
    parts: Parts,
    body: Bytes,
    rmcp: impl FnOnce(Request) -> BoxFuture<'static, Response>,
) -> Response {
    static CANCELLED: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"notifications/cancelled\""));
    // rmcp routes an answer or a notification to the session only for a protocol version
    // before 2026-07-28; it ignores a cancellation of a later version.
    let to_session = to_a_session(&parts.headers);
    if to_session && let Some(accepted) = session.take_answer(&body) {
        return accepted;
    }
    let cancelled = CANCELLED
        .find(&body)
        .filter(|_| to_session)
        .and_then(|_| cancelled_request(&body));
    let response = rmcp(Request::from_parts(parts, Body::from(body))).await;
    if let Some(id) = cancelled
        && response.status().is_success()
    {
        session.direct.cancelled(&id);
    }
    response
}

/// A body read whole if it is within `max` bytes; else one that gives what was read and then
/// the rest (or the error that broke it), as the original would have.
async fn read_within(body: Body, max: usize) -> Result<Bytes, Body> {
    let mut data = body.into_data_stream();
    let mut read: Vec<Bytes> = Vec::new();
    let mut length = 0;
    while let Some(chunk) = data.next().await {
        let again = |read: Vec<Bytes>| futures::stream::iter(read.into_iter().map(Ok));
        match chunk {
            Ok(chunk) => {
                length += chunk.len();
                read.push(chunk);
                if length > max {
                    return Err(Body::from_stream(again(read).chain(data)));
                }
            }
            Err(error) => {
                let broken = futures::stream::once(std::future::ready(Err(error)));
                return Err(Body::from_stream(again(read).chain(broken)));
            }
        }
    }
    Ok(match read.len() {
        1 => read.remove(0),
        _ => Bytes::from(read.concat()),
    })
}

/// Keeps the sessions of `calls` tended while it is there.
async fn tend(calls: Weak<HttpCalls>) {
    loop {
        let Some(every) = calls.upgrade().map(|calls| calls.tend_every) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(calls) = calls.upgrade() else {
            return;
        };
        calls.tend_once().await;
    }
}

/// Whether rmcp reads a POST with these headers (a JSON body, from a client that accepts both
/// JSON and event streams) rather than refusing it as they are.
fn acceptable_post(headers: &HeaderMap) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|media| media.to_str().ok())
        .is_some_and(|media| essence(media).eq_ignore_ascii_case("application/json"));
    json && accepts(headers, "application/json") && accepts(headers, "text/event-stream")
}

/// The media type of a `Content-Type` or `Accept` entry, without its parameters.
fn essence(media: &str) -> &str {
    media.split(';').next().unwrap_or_default().trim()
}

/// Whether `Accept` takes `media` exactly, as rmcp reads it: entries and their parameters split
/// outside quoted strings, an entry left out only for a weight of zero (a weight RFC 9110
/// does not admit is ignored).
fn accepts(headers: &HeaderMap, media: &str) -> bool {
    let values = headers.get_all(header::ACCEPT).iter();
    let mut entries = values
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| outside_quotes(value, ','));
    entries.any(|entry| {
        let mut parts = outside_quotes(entry, ';');
        let essence = parts.next().unwrap_or_default().trim();
        essence.eq_ignore_ascii_case(media)
            && parts.all(|parameter| match parameter.split_once('=') {
                Some((name, weight)) if name.trim().eq_ignore_ascii_case("q") => {
                    !zero_weight(weight.trim())
                }
                _ => true,
            })
    })
}

/// `value` split at `delimiter` where it is outside a quoted string (`\` escapes in one).
fn outside_quotes(value: &str, delimiter: char) -> impl Iterator<Item = &str> {
    let (mut quoted, mut escaped) = (false, false);
    value.split(move |character| match character {
        _ if escaped => {
            escaped = false;
            false
        }
        '\\' if quoted => {
            escaped = true;
            false
        }
        '"' => {
            quoted = !quoted;
            false
        }
        other => !quoted && other == delimiter,
    })
}

/// Whether a weight is zero as RFC 9110 writes one (`0`, `0.`, up to three zeros after the
/// point).
fn zero_weight(weight: &str) -> bool {
    let (whole, fraction) = weight.split_once('.').unwrap_or((weight, ""));
    whole == "0" && fraction.len() <= 3 && fraction.bytes().all(|digit| digit == b'0')
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

/// Where a call served here sends what a server asks its client during it (read by
/// `client::Client::of`): events of the call's own stream, numbered `number`.
#[derive(Clone)]
pub(in crate::gateway) struct AskOn {
    session: Weak<CallSession>,
    stream: Arc<Stream>,
    number: u64,
}

impl AskOn {
    /// Sends `request` to the client on the call's stream (however far behind its reader is,
    /// as the answer): the client's answer, once it POSTs it to the session. The request back
    /// if the stream has ended (or its session), for rmcp to send as it would.
    pub(in crate::gateway) fn ask(
        &self,
        request: ServerRequest,
    ) -> Result<BoxFuture<'static, Result<ClientResult, ErrorData>>, Box<ServerRequest>> {
        let Some(session) = self.session.upgrade() else {
            return Err(Box::new(request));
        };
        let number = session.next_asked.fetch_add(1, Ordering::Relaxed);
        let id = RequestId::String(format!("{ASKED}{number}").into());
        let (answer, answered) = oneshot::channel();
        lock(&session.asked).insert(id.clone(), answer);
        // The question goes when its asker gives up (the server cancelled its request).
        let waiting = Waiting {
            session: self.session.clone(),
            id: id.clone(),
        };
        let message: TxJsonRpcMessage<RoleServer> = JsonRpcMessage::request(request, id);
        let event = |index| message_event(&event_head(self.number, index), &message);
        if self.stream.push(true, event).is_none() {
            drop(waiting);
            let JsonRpcMessage::Request(asked) = message else {
                unreachable!("made a request above")
            };
            return Err(Box::new(asked.request));
        }
        Ok(Box::pin(async move {
            let _waiting = waiting;
            answered.await.unwrap_or_else(|_| {
                let why = "the client did not answer: its session ended before it answered";
                Err(ErrorData::internal_error(why, None))
            })
        }))
    }
}

/// A request to the client that waits for its answer; gone from the session when dropped.
struct Waiting {
    session: Weak<CallSession>,
    id: RequestId,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(session) = self.session.upgrade() {
            lock(&session.asked).remove(&self.id);
        }
    }
}

/// Whether a POST's protocol version header sends it to a session, as rmcp reads it: none
/// (2025-03-26), or a version rmcp knows from before 2026-07-28.
fn to_a_session(headers: &HeaderMap) -> bool {
    let Some(version) = headers.get("mcp-protocol-version") else {
        return true;
    };
    let Ok(version) = version.to_str() else {
        return false;
    };
    version < ProtocolVersion::V_2026_07_28.as_str()
        && ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .any(|known| known.as_str() == version)
}

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
        let Some(message) = progress_message(&self.token, &self.last, upstream) else {
            return;
        };
        let number = self.number;
        self.stream.push(false, |index| {
            message_event(&event_head(number, index), &message)
        });
    }

    /// Each update is an event of the stream the moment it is taken.
    fn flush(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// A server's progress update as the client's, under its `token`; none if it would go
/// backwards from the `last` one passed on (which it then becomes).
fn progress_message(
    token: &ProgressToken,
    last: &Mutex<f64>,
    upstream: ProgressNotificationParam,
) -> Option<TxJsonRpcMessage<RoleServer>> {
    let mut last = lock(last);
    if upstream.progress <= *last {
        return None;
    }
    *last = upstream.progress;
    let mut update = ProgressNotificationParam::new(token.clone(), upstream.progress);
    update.total = upstream.total;
    update.message = upstream.message;
    Some(JsonRpcMessage::Notification(JsonRpcNotification {
        jsonrpc: JsonRpcVersion2_0,
        notification: ServerNotification::ProgressNotification(ProgressNotification::new(update)),
    }))
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
    fn only_this_modules_event_ids_are_its_own() {
        assert_eq!(our_stream("t17/0"), Some((17, 0)));
        assert_eq!(our_stream("t17/3"), Some((17, 3)));
        assert_eq!(our_stream("0/17"), None);
        assert_eq!(our_stream("17"), None);
        assert_eq!(our_stream("t/1"), None);
    }

    /// A typed answer or a small result is kept once read, for a reader that picks the stream
    /// up again; a large result's bytes give way to the stand-in.
    #[test]
    fn only_a_large_results_bytes_give_way_once_read() {
        use crate::transport::lines::raw::RawBytes;
        let raw = |size: usize| {
            let result = RawBytes::new(vec![b' '; size], 0..size, false).unwrap();
            let id = RequestId::Number(7);
            Answer::Raw {
                id,
                result,
                complete: false,
            }
        };
        assert_eq!(given_way(&raw(100)), None);
        assert_eq!(given_way(&raw(KEEP_READ_RESULT)), None);
        assert_eq!(
            given_way(&raw(KEEP_READ_RESULT + 1)),
            Some(RequestId::Number(7))
        );
        let typed = rmcp::model::ServerJsonRpcMessage::response(
            rmcp::model::ServerResult::empty(()),
            RequestId::Number(8),
        );
        assert_eq!(given_way(&Answer::Message(typed)), None);
    }

    #[test]
    fn a_reader_gets_every_event_once_in_order_and_only_read_ones_are_let_go() {
        let stream = Stream {
            events: Mutex::default(),
            changed: watch::Sender::new(()),
            ended_ms: AtomicU64::new(0),
        };
        let (mut seen, mut got) = (0, Vec::new());
        for i in 1..=300 {
            stream.push(false, |n| vec![Bytes::from(n.to_string())]);
            // A slow reader: 100 events come between its reads, more than are kept once read.
            if i % 100 == 0 {
                let read = stream.after(seen, 0).unwrap();
                got.extend(read.events.iter().map(|event| event[0].clone()));
                seen = read.last;
            }
        }
        let expected: Vec<Bytes> = (1..=300)
            .map(|n: usize| Bytes::from(n.to_string()))
            .collect();
        assert_eq!(got, expected);
        stream.push(false, |n| vec![Bytes::from(n.to_string())]);
        assert_eq!(lock(&stream.events).sent.len(), KEPT_EVENTS);
        // Picked up from the start: what is still kept, from event 238 on.
        let reader = stream.take_over();
        let again = stream.after(0, reader).unwrap();
        assert_eq!(
            again.events.first().map(|e| e[0].clone()),
            Some(Bytes::from("238"))
        );
        assert_eq!(again.last, 301);
        assert!(stream.after(0, 0).is_none(), "the reader before stops");
    }

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_limit_and_given_on_whole_past_it() {
        let chunks = || {
            let pieces = ["{\"a\":", "1", "}"].map(|piece| Ok::<_, Infallible>(Bytes::from(piece)));
            Body::from_stream(futures::stream::iter(pieces))
        };
        assert_eq!(
            read_within(chunks(), 7).await.ok(),
            Some(Bytes::from("{\"a\":1}"))
        );
        let past = read_within(chunks(), 5).await.expect_err("past the limit");
        let again = axum::body::to_bytes(past, usize::MAX).await.unwrap();
        assert_eq!(again, Bytes::from("{\"a\":1}"), "nothing lost");
    }

    /// A call's stream while its call runs quietly: its priming event, then a comment each
    /// keep-alive period, then its answer, and it ends.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_is_kept_alive_with_comments_until_its_answer() {
        let settings = || Settings {
            hosts: Hosts::Loopback,
            max_body: 1 << 20,
            sse_retry: Some(Duration::from_millis(3000)),
            sse_keep_alive: Some(Duration::from_secs(15)),
        };
        let calls = HttpCalls::new(Arc::new(LocalSessionManager::default()), settings());
        let stream = Arc::new(Stream {
            events: Mutex::default(),
            changed: watch::Sender::new(()),
            ended_ms: AtomicU64::new(0),
        });
        let mut body = event_stream(7, stream.clone(), None, &settings())
            .into_body()
            .into_data_stream();
        let mut next = async || String::from_utf8(body.next().await.unwrap().unwrap().to_vec());
        assert_eq!(next().await.unwrap(), "id: t7/0\nretry: 3000\ndata: \n\n");
        let start = tokio::time::Instant::now();
        for period in 1..=3 {
            assert_eq!(next().await.unwrap(), ":\n\n");
            assert_eq!(start.elapsed(), Duration::from_secs(15 * period));
        }
        stream.answer(
            |n| vec![Bytes::from(format!("id: t7/{n}\ndata: {{}}\n\n"))],
            |_| Vec::new(),
            &calls,
        );
        assert_eq!(next().await.unwrap(), "id: t7/1\ndata: {}\n\n");
        assert!(body.next().await.is_none(), "it ends with the answer");
    }

    #[test]
    fn accept_is_read_as_rmcp_reads_it() {
        let accepts_with = |values: &[&str], media| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(header::ACCEPT, HeaderValue::from_str(value).unwrap());
            }
            accepts(&headers, media)
        };
        let both = "application/json, text/event-stream";
        assert!(accepts_with(&[both], "application/json"));
        assert!(accepts_with(&[both], "text/event-stream"));
        assert!(accepts_with(
            &["application/json", "TEXT/Event-Stream"],
            "text/event-stream"
        ));
        // A comma or semicolon in a quoted parameter splits nothing, escaped quotes included.
        let quoted = r#"application/json;profile="a,text/event-stream", text/plain"#;
        assert!(!accepts_with(&[quoted], "text/event-stream"));
        let escaped = r#"application/json;p="a\",text/event-stream""#;
        assert!(!accepts_with(&[escaped], "text/event-stream"));
        let weight_in_quotes = r#"application/json;profile="a;q=0""#;
        assert!(accepts_with(&[weight_in_quotes], "application/json"));
        // Only a weight of zero leaves an entry out; one RFC 9110 does not admit is ignored.
        for (weight, kept) in [
            ("0", false),
            ("0.", false),
            ("0.0", false),
            ("0.000", false),
            (" 0 ", false),
            ("0.001", true),
            ("1", true),
            ("abc", true),
            ("0.0000", true),
            ("0.5", true),
        ] {
            let value = format!("text/event-stream;q={weight}");
            assert_eq!(
                accepts_with(&[&value], "text/event-stream"),
                kept,
                "q={weight}"
            );
        }
        assert!(
            !accepts_with(&["*/*"], "text/event-stream"),
            "rmcp wants it named"
        );
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
