//! The `tools/call` requests Tether POSTs to a Streamable HTTP server itself, past rmcp's
//! client loop ([`PostedCalls`]).
//!
//! A request sent through rmcp goes over a channel to its service loop, over another to its
//! HTTP worker, whose one task polls every POST of the session, and its answer comes back the
//! same two ways: four hand-offs between tasks a call, and every call of a session polled by one
//! task. A tool call is POSTed by its caller instead, through the same client rmcp's worker
//! uses (`GuardedClient`: deadlines, OAuth signing, what a failure does to the session, a
//! streamed answer read up to its first message), with the session's id and headers as the
//! worker sent them last. Its answer comes back to the caller.
//!
//! When the answer is not the POST's first message (progress first, a question for the client,
//! a stream that breaks), the caller reads the rest of the stream as rmcp's worker would: a
//! message event at a time, resuming a stream that broke or ended with `Last-Event-ID` once the
//! server gave an event id, on the session's retry schedule. What it reads goes to the gate
//! beside the transport (`gate.rs`, [`Beside`]), so it passes the gate's checks and reaches
//! rmcp as if rmcp had read it; the gate hands the answer back to the call, whether it came on
//! this stream or on the session's GET stream (a server may answer `202 Accepted` and send the
//! answer there).
//!
//! A call whose caller gives up closes its POST at once, before Tether tells the server
//! `notifications/cancelled` (rmcp keeps the stream open until then): the server sees the
//! connection close first, as it always did for a call answered with JSON. A stream that cannot
//! be picked up again within the session's retry schedule (`StreamRetry`) fails its call and
//! nothing else (rmcp ends the session only when its GET stream cannot be picked up again); a
//! stream given back that ends or breaks before a new event counts as a failure too (rmcp would
//! ask again for it until the call's deadline).
//!
//! Only for a session of the classic generation with its handshake done: a 2026-07-28 server
//! names the call in headers of the POST (rmcp's worker writes them), and may ask the client
//! something only while a request rmcp itself sent is in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, ClientJsonRpcMessage, ClientRequest, GetExtensions, JsonRpcMessage,
    RequestId, ServerJsonRpcMessage,
};
use rmcp::service::{InboundStreamOrigin, RxJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;
use tokio::sync::{mpsc, oneshot};

use super::{GuardedClient, HttpError, StreamRetry};
use crate::transport::gate::{Awaited, Beside};
use crate::transport::limit;
use crate::transport::wire::FIRST_STRAIGHT_ID;

type Rejected = StreamableHttpError<HttpError>;
type Events = BoxStream<'static, Result<Sse, SseError>>;

/// Messages of calls' streams that may wait for the gate at once, per session.
const BESIDE_CAPACITY: usize = 64;

/// The session's id and the headers rmcp's worker sends with it, as it sent them with the
/// handshake's last message (`notifications/initialized`).
#[derive(Debug, Clone)]
pub(super) struct SessionHeaders {
    pub id: Option<Arc<str>>,
    pub headers: HashMap<HeaderName, HeaderValue>,
}

/// Where `GuardedClient` records [`SessionHeaders`] once the handshake is done.
pub(super) type Recorded = Arc<OnceLock<SessionHeaders>>;

/// Posts one session's tool calls (see the module documentation).
pub struct PostedCalls {
    shared: Arc<Shared>,
    next_id: AtomicI64,
}

/// What every call of the session POSTs with.
struct Shared {
    client: GuardedClient,
    uri: Arc<str>,
    limits: StreamableHttpResponseLimits,
    beside: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
    awaited: Arc<Awaited>,
}

/// Why a posted call got no answer.
#[derive(Debug)]
pub enum NotAnswered {
    /// The POST failed, as rmcp's worker would have failed it.
    Failed(Rejected),
    /// The session closed first, or the answer's stream closed before the answer and could not
    /// be resumed.
    Closed,
}

impl PostedCalls {
    /// Calls for the session `client` serves at `uri`, and what the session's gate takes beside
    /// its transport for them.
    pub(super) fn new(
        client: GuardedClient,
        uri: Arc<str>,
        limits: StreamableHttpResponseLimits,
    ) -> (Self, Beside) {
        let (beside, messages) = mpsc::channel(BESIDE_CAPACITY);
        let awaited = Arc::new(Awaited::default());
        let shared = Shared {
            client,
            uri,
            limits,
            beside,
            awaited: awaited.clone(),
        };
        let calls = Self {
            shared: Arc::new(shared),
            next_id: AtomicI64::new(FIRST_STRAIGHT_ID),
        };
        (calls, Beside { messages, awaited })
    }

    /// Whether calls can be posted: the handshake is done and rmcp's worker has shown what a
    /// POST of this session carries.
    pub fn ready(&self) -> bool {
        self.shared.client.session.get().is_some()
    }

    /// The id for the next call (see `wire::FIRST_STRAIGHT_ID`).
    pub fn next_id(&self) -> RequestId {
        RequestId::Number(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Call `id`, to be POSTed when its answer is awaited ([`PendingPost::answer`]); `None` if
    /// the session is closed or its handshake not done (the call did not leave). Its route, if
    /// it has one, gets its arguments back once the body is written, or at once if it did not
    /// leave.
    pub fn send(&self, id: RequestId, call: CallToolRequest) -> Option<PendingPost> {
        let message = JsonRpcMessage::request(ClientRequest::CallToolRequest(call), id.clone());
        // Waited for before the POST leaves: the answer may come on the GET stream first.
        let through_gate = match self.ready() {
            true => self.shared.awaited.wait(id.clone()),
            false => None,
        };
        let Some(through_gate) = through_gate else {
            crate::upstream::route::hand_back(message);
            return None;
        };
        let post = Post {
            shared: self.shared.clone(),
            id: id.clone(),
            through_gate: Some(through_gate),
        };
        Some(PendingPost {
            id,
            answer: post.answer(message).boxed(),
        })
    }
}

/// A posted call: its POST goes out once its answer is awaited, and is cancelled (its
/// connection closed) if it is dropped before.
pub struct PendingPost {
    id: RequestId,
    answer: BoxFuture<'static, Result<ServerJsonRpcMessage, NotAnswered>>,
}

impl PendingPost {
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The server's answer: its response or its error.
    pub async fn answer(self) -> Result<ServerJsonRpcMessage, NotAnswered> {
        self.answer.await
    }
}

/// One call's POST and the reading of its answer. Dropped, however the call ends, it stops
/// waiting for the answer through the gate.
struct Post {
    shared: Arc<Shared>,
    id: RequestId,
    through_gate: Option<oneshot::Receiver<RxJsonRpcMessage<RoleClient>>>,
}

impl Drop for Post {
    fn drop(&mut self) {
        self.shared.awaited.forget(&self.id);
    }
}

impl Post {
    async fn answer(
        mut self,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, NotAnswered> {
        let shared = self.shared.clone();
        // Both set when the post was made (`PostedCalls::send`).
        let (Some(session), Some(mut through_gate)) =
            (shared.client.session.get(), self.through_gate.take())
        else {
            return Err(NotAnswered::Closed);
        };
        // Boxed, as the reading of a stream below: this future is boxed and moved whole, and
        // would otherwise carry both inline (17 KB).
        let post = Box::pin(shared.client.post_message_with_response_limits(
            shared.uri.clone(),
            message,
            session.id.clone(),
            None,
            session.headers.clone(),
            shared.limits,
        ));
        let posted = tokio::select! {
            biased;
            posted = post => posted.map_err(NotAnswered::Failed)?,
            // A server may answer on the session's GET stream while the POST's stream is
            // still silent.
            answer = &mut through_gate => return answer.map_err(|_| NotAnswered::Closed),
            () = shared.awaited.closed() => return Err(NotAnswered::Closed),
        };
        match posted {
            StreamableHttpPostResponse::Json(answer, _) => Ok(answer),
            StreamableHttpPostResponse::Sse(events, _) => {
                Box::pin(self.read_stream(session, events, through_gate)).await
            }
            // `Accepted`: the answer comes on the session's GET stream.
            _ => through_gate.await.map_err(|_| NotAnswered::Closed),
        }
    }

    /// Reads the call's stream into the gate until its answer is read (see the module
    /// documentation). A stream that ends or breaks before, and cannot be resumed, fails the
    /// call as rmcp fails it: the transport closed before the answer.
    async fn read_stream(
        &self,
        session: &SessionHeaders,
        mut events: Events,
        mut through_gate: oneshot::Receiver<RxJsonRpcMessage<RoleClient>>,
    ) -> Result<ServerJsonRpcMessage, NotAnswered> {
        let mut resume = Resume::default();
        loop {
            let event = tokio::select! {
                biased;
                answer = &mut through_gate => return answer.map_err(|_| NotAnswered::Closed),
                event = events.next() => event,
            };
            let broke = match event {
                Some(Ok(sse)) => {
                    resume.saw(&sse);
                    let Some((message, answers)) = message_of(&sse, &self.id) else {
                        continue;
                    };
                    self.hand_to_gate(message).await?;
                    if answers {
                        // The gate hands it back, after what came before it.
                        super::streamed::drain(events);
                        return through_gate.await.map_err(|_| NotAnswered::Closed);
                    }
                    continue;
                }
                Some(Err(_)) => true,
                None => false,
            };
            let reopened = match resume.last_event_id.is_some() {
                true => tokio::select! {
                    biased;
                    answer = &mut through_gate => return answer.map_err(|_| NotAnswered::Closed),
                    reopened = self.reopen(session, &mut resume, broke) => reopened,
                },
                false => None,
            };
            events = match reopened {
                Some(events) => events,
                // Unless the answer came on the session's GET stream meanwhile.
                None => return through_gate.try_recv().map_err(|_| NotAnswered::Closed),
            };
        }
    }

    /// The stream again from after the last event read, on the retry schedule of the session's
    /// streams: at once after a break, after the server's `retry` interval (or the schedule's
    /// first delay) after a clean end. A reopened stream that ends or breaks before a new event
    /// counts as a failure, as a GET that fails does, so a server that gives the stream and
    /// drops it again and again is asked on the schedule and given up at its end. `None`:
    /// given up.
    async fn reopen(
        &self,
        session: &SessionHeaders,
        resume: &mut Resume,
        broke: bool,
    ) -> Option<Events> {
        let shared = &*self.shared;
        match std::mem::take(&mut resume.progressed) {
            true => resume.failures = 0,
            false => resume.failures += 1,
        }
        let mut wait = match (resume.failures, broke) {
            (0, true) => None,
            // The server's `retry` stays in force for every later reconnection (SSE).
            (0, false) => resume.server_retry.or_else(|| StreamRetry::delay(0)),
            (failures, _) => Some(resume.delay(StreamRetry::delay(failures)?)),
        };
        loop {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            let reopened = shared
                .client
                .get_stream_with_max_sse_event_size(
                    shared.uri.clone(),
                    session.id.clone(),
                    resume.last_event_id.clone(),
                    None,
                    session.headers.clone(),
                    shared.limits.max_sse_event_size,
                )
                .await;
            match reopened {
                Ok(events) => return Some(events),
                // Asking again cannot give SSE or mend credentials.
                Err(
                    error @ (StreamableHttpError::ServerDoesNotSupportSse
                    | StreamableHttpError::AuthRequired(_)
                    | StreamableHttpError::InsufficientScope(_)),
                ) => {
                    tracing::debug!("a call's stream cannot be picked up again: {error}");
                    return None;
                }
                Err(error) => tracing::debug!("a call's stream was not picked up again: {error}"),
            }
            resume.failures += 1;
            wait = Some(resume.delay(StreamRetry::delay(resume.failures)?));
        }
    }

    /// Hands a message of the call's stream to the gate; a request the server asks within the
    /// call is marked as the call's, as rmcp's worker marks it.
    async fn hand_to_gate(&self, mut message: ServerJsonRpcMessage) -> Result<(), NotAnswered> {
        if let JsonRpcMessage::Request(request) = &mut message {
            request
                .request
                .extensions_mut()
                .insert(InboundStreamOrigin::OutboundRequest(self.id.clone()));
        }
        self.shared
            .beside
            .send(message)
            .await
            .map_err(|_| NotAnswered::Closed)
    }
}

/// Where a stream can be picked up again, and how often it failed to be since it last moved.
#[derive(Default)]
struct Resume {
    last_event_id: Option<String>,
    server_retry: Option<Duration>,
    /// Whether an event with an id came since the stream was last opened.
    progressed: bool,
    /// Failures to pick the stream up again (a GET that failed, or a stream that gave no new
    /// event) since an event last came.
    failures: usize,
}

impl Resume {
    fn saw(&mut self, sse: &Sse) {
        if let Some(retry) = sse.retry {
            self.server_retry = Some(Duration::from_millis(retry));
        }
        if let Some(id) = &sse.id {
            self.last_event_id = Some(id.clone());
            self.progressed = true;
        }
    }

    /// The schedule's `delay`, or the server's `retry` interval if longer.
    fn delay(&self, delay: Duration) -> Duration {
        self.server_retry.map_or(delay, |server| server.max(delay))
    }
}

/// The JSON-RPC message an event carries, as rmcp reads one (only message events, no event
/// name or `message`; data that does not parse is skipped), and whether it answers call `id`
/// (read as a call's answer, as `streamed.rs` reads one).
fn message_of(sse: &Sse, id: &RequestId) -> Option<(ServerJsonRpcMessage, bool)> {
    if !matches!(sse.event.as_deref(), None | Some("" | "message")) {
        return None;
    }
    let data = sse.data.as_deref()?;
    // What the size filter left of an event it cut off: the "too large" answer follows.
    if data.trim().is_empty() || limit::spoiled(data) {
        return None;
    }
    if let Some(answer) = super::streamed::answer_to(data, id, true) {
        return Some((answer, true));
    }
    match serde_json::from_str(data) {
        Ok(message) => Some((message, false)),
        Err(error) => {
            tracing::debug!("an event of a call's stream is not JSON-RPC: {error}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use rmcp::model::{CallToolRequestParams, ServerResult};
    use serde_json::{Value, json};
    use tokio::sync::broadcast;

    use super::*;
    use crate::transport::http::{HttpFlavor, HttpOptions, HttpSession, connect_session};

    /// The largest message the test's sessions take.
    const MAX_MESSAGE: usize = 1 << 20;

    /// A server played by the test: what it was asked for, and the session's GET stream.
    #[derive(Clone)]
    struct Script {
        /// The `Last-Event-ID` of each request to pick a stream up again, and when it came.
        resumed_after: Arc<Mutex<Vec<(String, std::time::Instant)>>>,
        /// The id of the call whose stream is resumed.
        resumed_call: Arc<Mutex<Value>>,
        get_stream: broadcast::Sender<String>,
        /// The session's GET streams opened (not picked up again after an event).
        gets: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Script {
        /// The `Last-Event-ID`s the streams were picked up again after.
        fn resumed_after(&self) -> Vec<String> {
            let resumed = self.resumed_after.lock().unwrap();
            resumed.iter().map(|(after, _)| after.clone()).collect()
        }
    }

    fn event_stream(body: String) -> Response {
        ([("content-type", "text/event-stream")], body).into_response()
    }

    fn answer(id: &Value, text: &str) -> String {
        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
            .to_string()
    }

    fn progress(token: &Value, progress: u32) -> String {
        let params = json!({"progressToken": token, "progress": progress});
        json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}).to_string()
    }

    async fn post(State(script): State<Script>, body: String) -> Response {
        let message: Value = serde_json::from_str(&body).unwrap();
        let id = &message["id"];
        let result = json!({
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "scripted", "version": "1"},
        });
        match (message["method"].as_str().unwrap(), message["params"]["name"].as_str()) {
            ("initialize", _) => (
                [("content-type", "application/json"), ("mcp-session-id", "s1")],
                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
            )
                .into_response(),
            ("tools/call", Some("json")) => (
                [("content-type", "application/json")],
                answer(id, "json"),
            )
                .into_response(),
            // Progress three times, then the answer, in one body.
            ("tools/call", Some("progress")) => {
                let events: String = (1..=3)
                    .map(|n| format!("data: {}\n\n", progress(id, n)))
                    .chain([format!("data: {}\n\n", answer(id, "progress"))])
                    .collect();
                event_stream(events)
            }
            // Progress first, then the stream ends: the answer is there once resumed.
            ("tools/call", Some("resumed")) => {
                *script.resumed_call.lock().unwrap() = id.clone();
                let progress = progress(id, 1);
                event_stream(format!("id: e1\nretry: 5\ndata: {progress}\n\n"))
            }
            // Progress, then the stream ends; picked up again, it ends at once every time.
            ("tools/call", Some("fruitless")) => {
                let progress = progress(id, 1);
                event_stream(format!("id: f1\ndata: {progress}\n\n"))
            }
            // The same, with the server's own reconnection time.
            ("tools/call", Some("fruitless-slow")) => {
                let progress = progress(id, 1);
                event_stream(format!("id: f1\nretry: 60\ndata: {progress}\n\n"))
            }
            // Progress, then the stream ends; picked up again, the answer is over the limit.
            ("tools/call", Some("huge")) => {
                *script.resumed_call.lock().unwrap() = id.clone();
                let progress = progress(id, 1);
                event_stream(format!("id: h1\ndata: {progress}\n\n"))
            }
            ("tools/call", Some("refused")) => (
                [("content-type", "application/json")],
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "no"}})
                    .to_string(),
            )
                .into_response(),
            // Progress, then the stream ends, with no event id to resume after.
            ("tools/call", Some("cut")) => {
                let progress = progress(id, 1);
                event_stream(format!("data: {progress}\n\n"))
            }
            // Accepted: the answer comes on the session's GET stream (after a log message over
            // the session's limit, when asked for).
            ("tools/call", Some(name @ ("accepted" | "accepted-after-huge"))) => {
                let mut messages = vec![answer(id, "accepted")];
                if name == "accepted-after-huge" {
                    let data = "x".repeat(MAX_MESSAGE + 1);
                    let params = json!({"level": "info", "data": data});
                    let huge = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": params});
                    messages.insert(0, huge.to_string());
                }
                let stream = script.get_stream.clone();
                tokio::spawn(async move {
                    // Until the session's GET stream listens (the test fails at its own
                    // deadline if it never does).
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while stream.receiver_count() == 0 {
                        if tokio::time::Instant::now() > deadline {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for message in messages {
                        let _ = stream.send(message);
                    }
                });
                StatusCode::ACCEPTED.into_response()
            }
            _ => StatusCode::ACCEPTED.into_response(),
        }
    }

    async fn get(State(script): State<Script>, headers: HeaderMap) -> Response {
        if let Some(last) = headers.get("last-event-id") {
            script
                .resumed_after
                .lock()
                .unwrap()
                .push((last.to_str().unwrap().to_owned(), std::time::Instant::now()));
            if last == "f1" {
                return event_stream(String::new());
            }
            let resumed = script.resumed_call.lock().unwrap().clone();
            if last == "h1" {
                let answer = answer(&resumed, &"x".repeat(MAX_MESSAGE + 1));
                return event_stream(format!("id: h2\ndata: {answer}\n\n"));
            }
            let answer = answer(&resumed, "resumed");
            return event_stream(format!("id: e2\ndata: {answer}\n\n"));
        }
        script.gets.fetch_add(1, Ordering::SeqCst);
        let answers = script.get_stream.subscribe();
        let events = futures::stream::unfold(answers, |mut answers| async move {
            let answer = answers.recv().await.ok()?;
            Some((Ok::<_, std::convert::Infallible>(format!("data: {answer}\n\n")), answers))
        });
        ([("content-type", "text/event-stream")], axum::body::Body::from_stream(events))
            .into_response()
    }

    /// Counts the progress passed on.
    #[derive(Default)]
    struct Counted(std::sync::atomic::AtomicUsize);

    impl crate::upstream::route::ProgressForward for Counted {
        fn forward(&self, _update: rmcp::model::ProgressNotificationParam) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn flush(&self) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    fn call(name: &str) -> CallToolRequest {
        CallToolRequest::new(CallToolRequestParams::new(name.to_owned()))
    }

    fn text(answer: ServerJsonRpcMessage) -> String {
        let JsonRpcMessage::Response(response) = answer else {
            panic!("not an answer: {answer:?}");
        };
        let ServerResult::CallToolResult(result) = response.result else {
            panic!("not a call's result: {:?}", response.result);
        };
        result.content[0].as_text().unwrap().text.clone()
    }

    /// A session with the scripted server.
    async fn scripted(routes: Option<Arc<crate::upstream::route::Routes>>) -> (Script, HttpSession<()>) {
        let script = Script {
            resumed_after: Arc::default(),
            resumed_call: Arc::default(),
            get_stream: broadcast::channel(4).0,
            gets: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/mcp", axum::routing::post(post).get(get))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let options = HttpOptions {
            headers: Default::default(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_message: MAX_MESSAGE,
            keep_connections: false,
            lifecycle: rmcp::ClientLifecycleMode::Initialize,
            routes,
            auth: None,
        };
        let session = connect_session(&url, Some(HttpFlavor::Streamable), &options, || ())
            .await
            .expect("a session");
        (script, session)
    }

    /// A call waiting for its answer when the session closes fails as the session's end (it
    /// may have run); one sent after does not leave.
    #[tokio::test]
    async fn a_closed_session_ends_the_calls_waiting_and_sends_no_more() {
        let (_script, session) = scripted(None).await;
        let calls = session.calls.expect("Streamable HTTP posts its calls");
        let silent = calls.send(calls.next_id(), call("silent")).unwrap();
        let waiting = tokio::spawn(silent.answer());
        session.service.cancel().await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        assert!(matches!(outcome.unwrap().unwrap(), Err(NotAnswered::Closed)));
        assert!(calls.send(calls.next_id(), call("json")).is_none());
    }

    /// A server that gives a call's stream back on every `Last-Event-ID` and ends it at once,
    /// never with the answer (as rmcp's server does when it cannot replay it): the stream is
    /// asked for again on the session's retry schedule, not in a loop, and the call fails when
    /// the schedule ends; the session and its other calls go on.
    #[tokio::test]
    async fn a_stream_given_back_empty_again_and_again_is_given_up_on_the_schedule() {
        let (script, session) = scripted(None).await;
        let calls = session.calls.as_ref().expect("Streamable HTTP posts its calls");
        let started = std::time::Instant::now();
        let fruitless = calls.send(calls.next_id(), call("fruitless")).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), fruitless.answer()).await;
        let outcome = outcome.expect("given up within the schedule");
        assert!(matches!(outcome, Err(NotAnswered::Closed)), "{outcome:?}");
        let at: Vec<std::time::Instant> =
            script.resumed_after.lock().unwrap().iter().map(|(_, at)| *at).collect();
        assert_eq!(script.resumed_after(), vec!["f1"; StreamRetry::ATTEMPTS]);
        // The schedule's delays were kept: the first before the first time the stream was
        // asked for again, then twice, four and eight times it between the next ones.
        let first = StreamRetry::FIRST_DELAY;
        assert!(at[0] - started >= first);
        let gaps: Vec<Duration> = at.windows(2).map(|pair| pair[1] - pair[0]).collect();
        for (gap, times) in gaps.iter().zip([2, 4, 8]) {
            assert!(*gap >= first * times, "{gaps:?}");
        }
        let next = calls.send(calls.next_id(), call("json"));
        let next = next.expect("the session goes on").answer();
        let answered = tokio::time::timeout(Duration::from_secs(10), next).await;
        assert!(matches!(answered, Ok(Ok(_))), "{answered:?}");
    }

    /// The server's `retry` interval stays in force for every time its stream is asked for
    /// again (as SSE says), not only the first: the schedule's shorter delays do not apply.
    #[tokio::test]
    async fn the_servers_reconnection_time_holds_for_every_attempt() {
        let (script, session) = scripted(None).await;
        let calls = session.calls.as_ref().expect("Streamable HTTP posts its calls");
        let started = std::time::Instant::now();
        let fruitless = calls.send(calls.next_id(), call("fruitless-slow")).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), fruitless.answer()).await;
        assert!(matches!(outcome.expect("given up"), Err(NotAnswered::Closed)));
        let at: Vec<std::time::Instant> =
            script.resumed_after.lock().unwrap().iter().map(|(_, at)| *at).collect();
        assert_eq!(at.len(), StreamRetry::ATTEMPTS);
        let server = Duration::from_millis(60);
        assert!(at[0] - started >= server);
        let gaps: Vec<Duration> = at.windows(2).map(|pair| pair[1] - pair[0]).collect();
        assert!(gaps.iter().all(|gap| *gap >= server), "{gaps:?}");
    }

    /// A call whose stream, picked up again after its last event, brings an answer over the
    /// session's limit: the call fails at once, saying so, and the stream is not asked for
    /// again (rmcp's reader broke the stream on such an event, and the stream picked up again
    /// after the last event began with it again, until the retry schedule ended the session).
    #[tokio::test]
    async fn an_answer_over_the_limit_on_a_stream_picked_up_again_fails_its_call_as_too_large() {
        let (script, session) = scripted(None).await;
        let calls = session.calls.as_ref().expect("Streamable HTTP posts its calls");
        let huge = calls.send(calls.next_id(), call("huge")).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), huge.answer()).await;
        let answer = outcome.expect("answered within its deadline").unwrap();
        let JsonRpcMessage::Error(error) = answer else {
            panic!("not an error: {answer:?}");
        };
        let (size, limit) = limit::too_large(error.error.code.0, error.error.data.as_ref())
            .expect("Tether's too-large error");
        assert_eq!(limit, MAX_MESSAGE as u64);
        // 0: answered as soon as the id was read, before the event's end.
        assert!(size == 0 || size > limit, "{size}");
        assert_eq!(script.resumed_after(), ["h1"]);
        assert!(!session.service.is_closed(), "the session stays");
    }

    /// A message over the session's limit on the session's GET stream is dropped and the
    /// stream goes on: the answer after it arrives, on the stream opened once. (rmcp's reader
    /// ended the session's stream for good on such a message: the answer was lost.)
    #[tokio::test]
    async fn a_message_over_the_limit_on_the_sessions_stream_is_dropped_and_the_stream_goes_on() {
        let (script, session) = scripted(None).await;
        let calls = session.calls.as_ref().expect("Streamable HTTP posts its calls");
        let (_, dropped_before) = limit::oversized_counts();
        let accepted = calls.send(calls.next_id(), call("accepted-after-huge")).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), accepted.answer()).await;
        assert_eq!(text(outcome.expect("answered").unwrap()), "accepted");
        // Dropped by Tether's bound (other tests may drop more meanwhile).
        assert!(limit::oversized_counts().1 > dropped_before);
        assert_eq!(script.gets.load(Ordering::SeqCst), 1, "the stream was opened once");
        assert!(!session.service.is_closed(), "the session stays");
    }

    /// A call answered with JSON, one whose answer follows progress on its stream, one whose
    /// stream ends after progress and is resumed with `Last-Event-ID`, and one the server
    /// accepts and answers on the session's GET stream: each gets its answer, past rmcp's loop,
    /// and progress is passed on before the answer it came before. A stream that ends with
    /// nothing to resume after fails its call; an error answers as one. (On one thread, so an answer
    /// handed back before the gate passed the progress on would show.)
    #[tokio::test]
    async fn posted_calls_get_their_answers_however_the_server_sends_them() {
        let routes = Arc::new(crate::upstream::route::Routes::default());
        let (script, session) = scripted(Some(routes.clone())).await;
        let calls = session.calls.as_ref().expect("Streamable HTTP posts its calls");
        // The handshake's last POST went out before the session was handed over.
        assert!(calls.ready(), "the session's headers are known once it is connected");
        let within = |pending: PendingPost| {
            tokio::time::timeout(Duration::from_secs(10), pending.answer())
        };
        let send = |name: &str| calls.send(calls.next_id(), call(name)).expect("a ready session");
        let resumed = send("resumed");
        assert_eq!(resumed.id(), &RequestId::Number(FIRST_STRAIGHT_ID));
        assert_eq!(text(within(resumed).await.unwrap().unwrap()), "resumed");
        assert_eq!(script.resumed_after(), ["e1"]);
        let id = calls.next_id();
        let counted = Arc::new(Counted::default());
        let route = crate::upstream::route::CallRoute {
            progress: Some(counted.clone()),
            ..Default::default()
        };
        let token = rmcp::model::ProgressToken(id.clone());
        routes.register(id.clone(), Some(token), Arc::new(route));
        let progress = calls.send(id, call("progress")).unwrap();
        assert_eq!(text(within(progress).await.unwrap().unwrap()), "progress");
        assert_eq!(counted.0.load(Ordering::SeqCst), 3, "progress before its answer");
        let json = send("json");
        assert_eq!(text(within(json).await.unwrap().unwrap()), "json");
        // As rmcp fails it: the transport closed before the answer.
        let cut = send("cut");
        assert!(matches!(within(cut).await.unwrap(), Err(NotAnswered::Closed)));
        let accepted = send("accepted");
        assert_eq!(text(within(accepted).await.unwrap().unwrap()), "accepted");
        let refused = within(send("refused")).await.unwrap().unwrap();
        assert!(matches!(refused, JsonRpcMessage::Error(error) if error.error.message == "no"));
    }
}
