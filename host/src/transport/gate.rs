//! The one wrapper around every upstream transport: it ends the session as soon as the transport
//! recorded why it ended ([`SessionEnd`]), and it bounds what a chatty server can make Tether do.
//!
//! rmcp spawns a task for every notification it receives; a server flooding `notifications/message`
//! would keep the host busy and its allocator bloated long after the flood. Notifications other
//! than list changes pass a token bucket per session; the rest are dropped before rmcp sees them
//! and counted ([`dropped_notifications`]). List changes always pass: the supervisor coalesces
//! them (one refresh in flight, one pending). It also corrects the one answer to a
//! `server/discover` probe that rmcp misreads (see [`super::generation`]).
//!
//! It is where a client's request and what the server sends for it meet ([`Routes`]): a request
//! rmcp sends with a route is registered before it is written (a stdio tool call Tether writes
//! itself is registered by its session, and its answer does not pass here: `lines/calls.rs`);
//! progress for it is handed to its client here, in arrival order and before the answer that
//! follows it (rmcp would handle each notification on a task of its own, in no particular order,
//! after the answer), and moves its request's idle deadline, so rmcp never sees it; and each
//! server-to-client request is tagged with the request it belongs to.
//!
//! A Streamable HTTP tool call Tether POSTs itself (`http/posted.rs`) comes back here when its
//! answer does not come as the POST's first message: the rest of its stream is handed in
//! beside the transport ([`Beside`]) and passes the same checks, and an answer to such a call,
//! on its stream or on the session's GET stream, goes to the call waiting for it
//! ([`Awaited`]) instead of to rmcp, which never saw the call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{
    GetExtensions, GetMeta, JsonRpcMessage, JsonRpcNotification, RequestId, ServerNotification,
};
use rmcp::service::{InboundStreamOrigin, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::SessionEnd;
use crate::upstream::route::{Belongs, RouteTag, Routes};

/// How long requests in flight may still be answered once the session ended.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Notifications a session may burst before the rate applies.
const BURST: f64 = 200.0;
/// Notifications per second a session may send in the long run.
const RATE: f64 = 100.0;

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Notifications dropped over the rate, since start (all servers).
pub fn dropped_notifications() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A token bucket: sans-IO, the caller passes the time.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
    burst: f64,
    rate: f64,
}

impl TokenBucket {
    pub fn new(burst: f64, rate: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            last: now,
            burst,
            rate,
        }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The calls sent past rmcp that wait for an answer the gate may see (see the module
/// documentation), by id. Closed with the gate: nothing will be answered any more.
pub struct Awaited {
    /// `None` once closed.
    calls: Mutex<Option<HashMap<RequestId, oneshot::Sender<RxJsonRpcMessage<RoleClient>>>>>,
    closed: CancellationToken,
}

impl Default for Awaited {
    /// Open: waiting for nothing yet.
    fn default() -> Self {
        Self {
            calls: Mutex::new(Some(HashMap::new())),
            closed: CancellationToken::new(),
        }
    }
}

impl Awaited {

    /// Waits for the answer to call `id`; `None` once closed.
    pub fn wait(&self, id: RequestId) -> Option<oneshot::Receiver<RxJsonRpcMessage<RoleClient>>> {
        let (answer, answered) = oneshot::channel();
        self.lock().as_mut()?.insert(id, answer);
        Some(answered)
    }

    /// Stops waiting for call `id`.
    pub fn forget(&self, id: &RequestId) {
        if let Some(calls) = self.lock().as_mut() {
            calls.remove(id);
        }
    }

    /// Resolves once the gate is gone: no answer will come through it any more.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Hands `message` to the call it answers, or gives it back.
    fn answer(
        &self,
        message: RxJsonRpcMessage<RoleClient>,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        let Some(id) = super::wire::answered_id(&message) else {
            return Some(message);
        };
        let waiting = self.lock().as_mut().and_then(|calls| {
            // A server may echo a number as a string (`wire::same_id`).
            let number = match id {
                RequestId::String(text) => text.parse().ok().map(RequestId::Number),
                RequestId::Number(_) => None,
            };
            calls
                .remove(id)
                .or_else(|| calls.remove(&number?))
        });
        match waiting {
            Some(waiting) => {
                // A caller that left meanwhile drops its answer, as rmcp would.
                let _ = waiting.send(message);
                None
            }
            None => Some(message),
        }
    }

    fn close(&self) {
        self.lock().take();
        self.closed.cancel();
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<HashMap<RequestId, oneshot::Sender<RxJsonRpcMessage<RoleClient>>>>>
    {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What reaches a session beside its transport: messages the server sent on the stream of a
/// call Tether POSTed itself, and the calls that wait for their answers.
pub struct Beside {
    pub messages: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    pub awaited: Arc<Awaited>,
}

/// Wraps a client transport: see the module documentation.
pub struct Guarded<T> {
    inner: T,
    /// Resolves once the session's end is recorded. Made once and polled by every receive:
    /// rmcp's loop drops and remakes its receive future on each of its events, several a call.
    end_recorded: BoxFuture<'static, ()>,
    routes: Option<Arc<Routes>>,
    /// Once the session ended: until when requests in flight may still be answered.
    ending: Option<tokio::time::Instant>,
    bucket: TokenBucket,
    /// When the last "dropping" warning was logged (one per burst, not one per message).
    warned: Option<Instant>,
    beside: Option<Beside>,
}

impl<T> Guarded<T> {
    pub fn new(inner: T, end: SessionEnd) -> Self {
        Self {
            inner,
            end_recorded: Box::pin(async move { end.recorded().await }),
            routes: None,
            ending: None,
            bucket: TokenBucket::new(BURST, RATE, Instant::now()),
            warned: None,
            beside: None,
        }
    }

    /// Takes what reaches the session beside the transport too (see [`Beside`]).
    pub fn with_beside(mut self, beside: Beside) -> Self {
        self.beside = Some(beside);
        self
    }

    /// Routes what the server sends for a client's request to that request (see [`Routes`]).
    pub fn with_routes(mut self, routes: Arc<Routes>) -> Self {
        self.routes = Some(routes);
        self
    }

    /// Registers a request that leaves with a route, before it is written.
    fn leaving(&self, item: &TxJsonRpcMessage<RoleClient>) {
        let (Some(routes), JsonRpcMessage::Request(request)) = (&self.routes, item) else {
            return;
        };
        if let Some(RouteTag(route)) = request.request.extensions().get::<RouteTag>() {
            let token = request.request.get_meta().get_progress_token();
            routes.register(request.id.clone(), token, route.clone());
        }
    }

    /// Hands progress to its request's client and tags server requests with their request;
    /// forgets a request once its answer is here.
    fn arriving(&self, message: &mut RxJsonRpcMessage<RoleClient>) {
        let Some(routes) = &self.routes else {
            return;
        };
        match message {
            JsonRpcMessage::Notification(notification) => {
                if let ServerNotification::ProgressNotification(progress) =
                    &notification.notification
                {
                    routes.progress(&progress.params);
                }
            }
            JsonRpcMessage::Request(request) => {
                let origin = request
                    .request
                    .extensions()
                    .get::<InboundStreamOrigin>()
                    .cloned();
                let belongs: Belongs = routes.owner(origin.as_ref());
                request.request.extensions_mut().insert(belongs);
            }
            JsonRpcMessage::Response(response) => routes.unregister(&response.id),
            JsonRpcMessage::Error(error) => {
                if let Some(id) = &error.id {
                    routes.unregister(id);
                }
            }
        }
    }

    fn admit(&mut self, message: &RxJsonRpcMessage<RoleClient>) -> bool {
        let JsonRpcMessage::Notification(notification) = message else {
            return true;
        };
        if matches!(
            notification.notification,
            ServerNotification::ToolListChangedNotification(_)
                | ServerNotification::PromptListChangedNotification(_)
                | ServerNotification::ResourceListChangedNotification(_)
                | ServerNotification::CancelledNotification(_)
        ) {
            return true;
        }
        let now = Instant::now();
        if self.bucket.take(now) {
            return true;
        }
        DROPPED.fetch_add(1, Ordering::Relaxed);
        if self
            .warned
            .is_none_or(|at| now.duration_since(at) > Duration::from_secs(10))
        {
            self.warned = Some(now);
            tracing::warn!(
                "an upstream sends more than {RATE} notifications per second; dropping the excess"
            );
        }
        false
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Guarded<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.leaving(&item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = match self.ending {
                None => tokio::select! {
                    biased;
                    message = next_message(&mut self.inner, &mut self.beside) => message?,
                    () = &mut self.end_recorded => {
                        self.ending = Some(tokio::time::Instant::now() + ANSWER_GRACE);
                        continue;
                    }
                },
                // The session ended (the server forgot it, a stream broke for good): requests
                // in flight still get their own answers for a moment — a 404 to a request
                // proves it did not run, where the end alone proves nothing about it.
                Some(until) => {
                    let routes = self.routes.clone()?;
                    let next = next_message(&mut self.inner, &mut self.beside);
                    tokio::select! {
                        biased;
                        message = tokio::time::timeout_at(until, next) => match message {
                            Ok(Some(message)) => message,
                            _ => return None,
                        },
                        () = routes.idle() => return None,
                    }
                }
            };
            let mut message = message;
            super::generation::legacy_only_rejection(&mut message);
            self.arriving(&mut message);
            let message = match &self.beside {
                Some(beside) => match beside.awaited.answer(message) {
                    Some(message) => message,
                    None => continue,
                },
                None => message,
            };
            // Progress is its request's (its client, its deadline: `upstream/route.rs`): rmcp
            // has no use for it, and would spend a task and a token of the rate on each.
            if self.routes.is_some()
                && let JsonRpcMessage::Notification(notification) = &message
                && let ServerNotification::ProgressNotification(_) = notification.notification
            {
                continue;
            }
            if !self.admit(&message) {
                continue;
            }
            // So are log messages, given on here in the order they came (rmcp's loop would hand
            // each to a task of its own, and a burst would come out of order).
            #[allow(deprecated)] // logging: 2026-07-28 deprecates it, servers still send it
            match (&self.routes, message) {
                (
                    Some(routes),
                    JsonRpcMessage::Notification(JsonRpcNotification {
                        notification: ServerNotification::LoggingMessageNotification(log),
                        ..
                    }),
                ) => routes.log(log.params),
                (_, message) => return Some(message),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        if let Some(beside) = &self.beside {
            beside.awaited.close();
        }
    }
}

/// The next message from the transport or from beside it; `None` when the transport ended.
async fn next_message<T: Transport<RoleClient>>(
    inner: &mut T,
    beside: &mut Option<Beside>,
) -> Option<RxJsonRpcMessage<RoleClient>> {
    loop {
        let Some(messages) = beside.as_mut().map(|beside| &mut beside.messages) else {
            return inner.receive().await;
        };
        // Unbiased: a flood on the transport does not starve the calls' streams.
        tokio::select! {
            message = inner.receive() => return message,
            message = messages.recv() => match message {
                Some(message) => return Some(message),
                // Nothing more can come beside: the transport alone from now on.
                None => {
                    if let Some(beside) = beside.take() {
                        beside.awaited.close();
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: RequestId) -> RxJsonRpcMessage<RoleClient> {
        serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}}))
            .unwrap()
    }

    #[test]
    fn an_answer_goes_to_the_call_waiting_for_it_even_with_its_number_as_a_string() {
        let awaited = Awaited::default();
        let mut first = awaited.wait(RequestId::Number(7)).unwrap();
        let mut second = awaited.wait(RequestId::Number(8)).unwrap();
        assert!(awaited.answer(answer(RequestId::String("7".into()))).is_none());
        assert!(first.try_recv().is_ok());
        // Not waited for: it goes on to rmcp.
        assert!(awaited.answer(answer(RequestId::Number(9))).is_some());
        awaited.forget(&RequestId::Number(8));
        assert!(awaited.answer(answer(RequestId::Number(8))).is_some());
        assert!(second.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_closed_gate_ends_every_wait() {
        let awaited = Awaited::default();
        let waiting = awaited.wait(RequestId::Number(1)).unwrap();
        awaited.close();
        assert!(waiting.await.is_err());
        assert!(awaited.wait(RequestId::Number(2)).is_none());
        awaited.closed().await;
        assert!(awaited.answer(answer(RequestId::Number(1))).is_some());
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(3.0, 10.0, start);
        assert!((0..3).all(|_| bucket.take(start)));
        assert!(!bucket.take(start));
        // 10 per second: one more after 100 ms, never more than the burst after a long pause.
        assert!(bucket.take(start + Duration::from_millis(100)));
        assert!(!bucket.take(start + Duration::from_millis(100)));
        let later = start + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| bucket.take(later)).count(), 3);
    }
}
