//! Which client request an upstream message belongs to.
//!
//! A request Tether sends upstream for a client carries its [`CallRoute`] in the request's
//! extensions ([`RouteTag`]). It is registered as the request leaves — by request id and by its
//! progress token — so nothing the server sends for it can arrive first: by the session's
//! transport ([`crate::transport::gate`]) for a request rmcp sends, by the session itself for a
//! tool call it writes (`Session::send_straight`). The transport hands the server's progress
//! to the route in arrival order, on the transport's own task, before the answer that follows
//! it; and it tags each
//! server-to-client request (sampling, elicitation, roots) with the route it belongs to: the
//! request whose stream carried it (Streamable HTTP), or, where the wire names none (stdio,
//! legacy SSE), the only request in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientRequest, ClientResult, ErrorData, JsonObject,
    JsonRpcMessage, ProgressNotificationParam,
    ProgressToken, RequestId, ServerRequest,
};
use rmcp::RoleClient;
use rmcp::service::{InboundStreamOrigin, RequestHandle};
use tokio::time::Instant;

use super::LogSink;
use crate::transport::lines::raw::RawResult;

/// Receives an upstream request's progress, already in its client's terms; `flush` resolves once
/// everything received so far has been passed on.
pub trait ProgressForward: Send + Sync {
    /// Takes one update (never blocks; a client too slow to take its progress misses some).
    fn forward(&self, update: ProgressNotificationParam);
    /// Resolves once every update taken so far went out to the client.
    fn flush(&self) -> BoxFuture<'static, ()>;
}

/// The client a request came from, for what the server asks of it during that request.
pub trait ClientAsk: Send + Sync {
    /// What the client declared it can do (for 2026-07-28 clients, on this request).
    fn capabilities(&self) -> ClientCapabilities;
    /// Sends `request` to the client (on its request's stream where the transport has one)
    /// and waits for its answer.
    fn ask(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
}

/// What a request in flight upstream needs from its session.
#[derive(Default)]
pub struct CallRoute {
    /// Where its progress goes, if its client asked for progress.
    pub progress: Option<Arc<dyn ProgressForward>>,
    /// Where log messages go while it is the only request in flight (a 2026-07-28 caller
    /// that asked for them).
    pub log: Option<LogSink>,
    /// Its client, for the server's requests during it.
    pub client: Option<Arc<dyn ClientAsk>>,
    /// A tool call's arguments, handed back by its transport once done with the request
    /// ([`hand_back`]).
    pub(crate) handed_back: Mutex<Option<Option<JsonObject>>>,
    /// Where a tool call's result may go as the server's bytes, for a client whose answers
    /// can carry them (`transport/lines/raw.rs`).
    pub(crate) raw: Option<Arc<RawResult>>,
    /// Its idle deadline, once its sender set one ([`CallRoute::deadlines`]): progress before
    /// it moves it.
    pub(crate) idle: Mutex<Option<IdleDeadline>>,
}

/// When a request in flight is idle too long, and how long is too long.
#[derive(Clone, Copy)]
pub(crate) struct IdleDeadline {
    at: Instant,
    idle: Duration,
}

impl CallRoute {
    /// Keeps the arguments of a call its transport is done with, for its caller.
    pub(crate) fn give_back(&self, arguments: Option<JsonObject>) {
        *self.handed_back.lock().unwrap_or_else(|e| e.into_inner()) = Some(arguments);
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Option<IdleDeadline>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the request's deadlines at `start`: `idle` after it or after the last progress
    /// that came in time, and `max` after it in all.
    pub(crate) fn deadlines(&self, start: Instant, idle: Duration, max: Duration) -> Deadlines<'_> {
        *self.idle() = Some(IdleDeadline {
            at: start + idle,
            idle,
        });
        Deadlines {
            route: self,
            hard: start + max,
            max,
        }
    }

    /// The server reported progress on the request at `at`: before its idle deadline, that
    /// deadline moves; after it, the request has already run out of time.
    fn progressed(&self, at: Instant) {
        if let Some(deadline) = self.idle().as_mut()
            && at <= deadline.at
        {
            deadline.at = at + deadline.idle;
        }
    }

    /// The arguments a transport handed back, if it did.
    pub(crate) fn take_back(&self) -> Option<Option<JsonObject>> {
        self.handed_back.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A request's deadlines (see [`CallRoute::deadlines`]).
pub(crate) struct Deadlines<'a> {
    route: &'a CallRoute,
    hard: Instant,
    max: Duration,
}

impl Deadlines<'_> {
    /// Resolves once the request runs out of time, with the timeout that ran out and the reason
    /// the server is told (rmcp's words). When both end at once, the idle one is named, as rmcp
    /// does.
    pub(crate) async fn out_of_time(&self) -> (Duration, &'static str) {
        loop {
            let Some(idle) = *self.route.idle() else {
                break;
            };
            if idle.at > self.hard {
                break;
            }
            tokio::time::sleep_until(idle.at).await;
            // Progress that came in time moved it.
            if self.route.idle().is_some_and(|now| now.at <= idle.at) {
                return (idle.idle, RequestHandle::<RoleClient>::REQUEST_TIMEOUT_REASON);
            }
        }
        tokio::time::sleep_until(self.hard).await;
        (
            self.max,
            RequestHandle::<RoleClient>::REQUEST_MAX_TOTAL_TIMEOUT_REASON,
        )
    }
}

/// A tool call's arguments as its tries pass them on: the try that sends them takes them, and
/// the transport hands them back once it has encoded the request, or could not ([`hand_back`]),
/// so a second try, where the retry rules allow one, goes out without a copy made in advance.
/// A request rmcp drops before the transport gets it (its loop or HTTP worker ending at that
/// moment) leaves none: that call is answered, not resent.
#[derive(Debug)]
pub struct CallArguments(Option<Option<JsonObject>>);

impl CallArguments {
    pub fn new(arguments: Option<JsonObject>) -> Self {
        Self(Some(arguments))
    }

    /// Whether they are here to send (not taken by a try that did not give them back).
    pub fn is_here(&self) -> bool {
        self.0.is_some()
    }

    /// Takes them for a request; `None` when they are not here (or there are none).
    pub(crate) fn take(&mut self) -> Option<JsonObject> {
        self.0.take().flatten()
    }

    pub(crate) fn put_back(&mut self, arguments: Option<JsonObject>) {
        self.0 = Some(arguments);
    }
}

/// A request's route, carried in its extensions from the caller to the transport.
#[derive(Clone)]
pub(crate) struct RouteTag(pub Arc<CallRoute>);

/// A transport is done with `message` (it is written, or never will be): a tool call's
/// arguments go back to the call's route, for a second try where the retry rules allow one.
/// Every transport calls it where it drops what it sent: the stdio lines once the line is
/// encoded, Tether's POST once the body is written, the legacy SSE POST once its body is.
pub(crate) fn hand_back(message: ClientJsonRpcMessage) {
    let JsonRpcMessage::Request(request) = message else {
        return;
    };
    let ClientRequest::CallToolRequest(call) = request.request else {
        return;
    };
    if let Some(RouteTag(route)) = call.extensions.get::<RouteTag>() {
        route.give_back(call.params.arguments);
    }
}

/// Where the result of `request`, if it is a tool call, may go as the server's bytes: its
/// route's slot, when its client's answers can carry them (see [`CallRoute::raw`]).
pub(crate) fn raw_slot(request: &ClientRequest) -> Option<Arc<RawResult>> {
    let ClientRequest::CallToolRequest(call) = request else {
        return None;
    };
    let RouteTag(route) = call.extensions.get::<RouteTag>()?;
    route.raw.clone()
}

/// What a server-to-client request found: the route of the request it belongs to, or why none.
#[derive(Clone)]
pub(crate) enum Belongs {
    To(Arc<CallRoute>),
    Nowhere(&'static str),
}

/// Keyed by ids and tokens this session's peer chose, not by anything a server picks:
/// foldhash, several times cheaper than SipHash on every call's register and unregister.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Table {
    by_id: Map<RequestId, (Arc<CallRoute>, Option<ProgressToken>)>,
    by_token: Map<ProgressToken, Arc<CallRoute>>,
}

/// The routes of one session's requests in flight.
#[derive(Default)]
pub struct Routes {
    table: Mutex<Table>,
    /// Told whenever a request ends.
    ended: tokio::sync::Notify,
    /// Where the session's log messages go besides their requests' own ([`Routes::log`]).
    log_tap: std::sync::OnceLock<LogTap>,
}

/// Takes a session's log messages, in the order the server sent them.
#[allow(deprecated)] // logging: 2026-07-28 deprecates it, servers still send it
pub(crate) type LogTap = Box<dyn Fn(rmcp::model::LoggingMessageNotificationParam) + Send + Sync>;

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("in_flight", &self.table().by_id.len())
            .finish()
    }
}

impl Routes {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request `id` (with progress `token`) leaves with `route`.
    pub(crate) fn register(
        &self,
        id: RequestId,
        token: Option<ProgressToken>,
        route: Arc<CallRoute>,
    ) {
        let mut table = self.table();
        if let Some(token) = &token {
            table.by_token.insert(token.clone(), route.clone());
        }
        table.by_id.insert(id, (route, token));
    }

    /// The request `id` ended (answered, cancelled, timed out); later messages for it go nowhere.
    pub(crate) fn unregister(&self, id: &RequestId) {
        let mut table = self.table();
        if let Some((_, Some(token))) = table.by_id.remove(id) {
            table.by_token.remove(&token);
        }
        drop(table);
        self.ended.notify_waiters();
    }

    /// Resolves once no client request is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let ended = self.ended.notified();
            if self.table().by_id.is_empty() {
                return;
            }
            ended.await;
        }
    }

    /// Notes progress on its request (it pushes the request's idle deadline back) and passes it
    /// on to the request's client; false when no request in flight owns it, or its client did
    /// not ask for progress.
    pub(crate) fn progress(&self, update: &ProgressNotificationParam) -> bool {
        let Some(route) = self.table().by_token.get(&update.progress_token).cloned() else {
            return false;
        };
        route.progressed(Instant::now());
        match &route.progress {
            Some(progress) => {
                progress.forward(update.clone());
                true
            }
            None => false,
        }
    }

    /// The request a server-to-client request belongs to: the one whose stream carried it, or
    /// (no stream named) the only one in flight.
    pub(crate) fn owner(&self, origin: Option<&InboundStreamOrigin>) -> Belongs {
        let table = self.table();
        match origin {
            Some(InboundStreamOrigin::OutboundRequest(id)) => match table.by_id.get(id) {
                Some((route, _)) => Belongs::To(route.clone()),
                None => Belongs::Nowhere("the request it came with has ended"),
            },
            Some(InboundStreamOrigin::Unassociated) => {
                Belongs::Nowhere("it came outside any request")
            }
            _ => {
                let mut routes = table.by_id.values();
                match (routes.next(), routes.next()) {
                    (Some((route, _)), None) => Belongs::To(route.clone()),
                    (None, _) => Belongs::Nowhere("no request is in flight"),
                    (Some(_), Some(_)) => Belongs::Nowhere(
                        "several requests are in flight and this transport does not say which one it belongs to",
                    ),
                }
            }
        }
    }

    /// Sets where the session's log messages go (once).
    pub(crate) fn tap_logs(&self, tap: LogTap) {
        let _ = self.log_tap.set(tap);
    }

    /// One of the server's log messages, given in the order the server sent them (by the
    /// transport: rmcp's loop hands each notification to a task of its own, and a burst would
    /// come out of order): to its request's caller ([`Routes::log_sink`]) and to the tap.
    #[allow(deprecated)] // logging: 2026-07-28 deprecates it, servers still send it
    pub(crate) fn log(&self, message: rmcp::model::LoggingMessageNotificationParam) {
        if let Some(sink) = self.log_sink() {
            sink(message.clone());
        }
        if let Some(tap) = self.log_tap.get() {
            tap(message);
        }
    }

    /// Where a log message goes besides the sessions that set a level: upstream notifications
    /// name no request, so to a 2026-07-28 caller only while its request is the only one.
    pub(crate) fn log_sink(&self) -> Option<LogSink> {
        let table = self.table();
        let mut routes = table.by_id.values();
        match (routes.next(), routes.next()) {
            (Some((route, _)), None) => route.log.clone(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(std::sync::atomic::AtomicUsize);

    impl ProgressForward for Counter {
        fn forward(&self, _update: ProgressNotificationParam) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn flush(&self) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    fn update(token: &str) -> ProgressNotificationParam {
        ProgressNotificationParam::new(ProgressToken(RequestId::String(token.into())), 1.0)
    }

    fn token(token: &str) -> ProgressToken {
        ProgressToken(RequestId::String(token.into()))
    }

    #[test]
    fn progress_reaches_the_request_that_owns_its_token_until_it_ends() {
        let routes = Routes::default();
        let counter = Arc::new(Counter(Default::default()));
        let route = Arc::new(CallRoute {
            progress: Some(counter.clone()),
            ..CallRoute::default()
        });
        routes.register(RequestId::Number(1), Some(token("a")), route);
        assert!(routes.progress(&update("a")));
        assert!(!routes.progress(&update("b")), "nobody owns b");
        routes.unregister(&RequestId::Number(1));
        assert!(!routes.progress(&update("a")), "the request ended");
        assert_eq!(counter.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    const IDLE: Duration = Duration::from_millis(300);
    const MAX: Duration = Duration::from_millis(1_000);

    /// What ends a request started now, with progress at each of `progress` (ms from the
    /// start), and when (ms from the start).
    async fn run_out(progress: &[u64], max: Duration) -> ((Duration, &'static str), u128) {
        let routes = Routes::default();
        let route = Arc::new(CallRoute::default());
        routes.register(RequestId::Number(1), Some(token("a")), route.clone());
        let start = Instant::now();
        let deadlines = route.deadlines(start, IDLE, max);
        let reports = async {
            for at in progress {
                tokio::time::sleep_until(start + Duration::from_millis(*at)).await;
                routes.progress(&update("a"));
            }
            std::future::pending::<()>().await
        };
        let ended = tokio::select! {
            ended = deadlines.out_of_time() => ended,
            () = reports => unreachable!(),
        };
        (ended, start.elapsed().as_millis())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_runs_out_of_time_when_idle_or_in_all_whatever_its_progress() {
        let idle = (IDLE, RequestHandle::<RoleClient>::REQUEST_TIMEOUT_REASON);
        let total = (MAX, RequestHandle::<RoleClient>::REQUEST_MAX_TOTAL_TIMEOUT_REASON);
        // No progress: idle after 300 ms.
        assert_eq!(run_out(&[], MAX).await, (idle, 300));
        // Progress at 200 ms: idle 300 ms after it.
        assert_eq!(run_out(&[200], MAX).await, (idle, 500));
        // Progress every 200 ms: the maximum ends it.
        let steady: Vec<u64> = (1..10).map(|i| i * 200).collect();
        assert_eq!(run_out(&steady, MAX).await, (total, 1_000));
        // Progress after the idle deadline passed does not revive it.
        assert_eq!(run_out(&[400], MAX).await, (idle, 300));
        // Both deadlines at once: the idle one is named, as rmcp names it.
        assert_eq!(run_out(&[], IDLE).await, ((IDLE, idle.1), 300));
    }

    #[test]
    fn a_server_request_belongs_to_its_stream_or_to_the_only_request_in_flight() {
        let routes = Routes::default();
        assert!(matches!(routes.owner(None), Belongs::Nowhere(_)));
        routes.register(RequestId::Number(1), None, Arc::default());
        assert!(matches!(routes.owner(None), Belongs::To(_)));
        routes.register(RequestId::Number(2), None, Arc::default());
        assert!(matches!(routes.owner(None), Belongs::Nowhere(why) if why.contains("several")));
        let on_two = InboundStreamOrigin::OutboundRequest(RequestId::Number(2));
        assert!(matches!(routes.owner(Some(&on_two)), Belongs::To(_)));
        let unassociated = InboundStreamOrigin::Unassociated;
        assert!(matches!(
            routes.owner(Some(&unassociated)),
            Belongs::Nowhere(_)
        ));
        routes.unregister(&RequestId::Number(2));
        assert!(matches!(routes.owner(Some(&on_two)), Belongs::Nowhere(_)));
    }
}
