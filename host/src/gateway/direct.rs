//! The stdio client's tool calls, served off rmcp's service loop.
//!
//! rmcp serves every request in a task of its own, hands the answer back to its loop over a
//! channel, and spawns one more task to write it: three hand-offs per call, about a tenth of
//! what forwarding a call costs. On `tether serve`'s own stdio the line transport hands a
//! client's `tools/call` here instead, once the session is up: one task runs it through the
//! very handler the loop would (`Service::handle_request`, so everything rmcp checks of a
//! call is checked) and writes the answer itself. As in rmcp's loop, a call is cancelled by
//! `notifications/cancelled` (and then not answered) or by the end of the session; when the
//! client's input ends, calls still running answer first, for as long as rmcp's loop would
//! wait for its own handlers.
//! Everything else, and a call that arrives before the session is up, takes the loop. An HTTP
//! agent's calls are served the same way (`http/calls.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, ClientRequest, ErrorData, Extensions, GetExtensions, GetMeta, JsonRpcMessage,
    RequestId, RequestMetaObject, ServerResult,
};
use rmcp::service::{Peer, RequestContext, Service};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Gateway;
use super::client::ProgressUntil;
use crate::transport::lines::raw::{RawResult, is_placeholder};
use crate::transport::lines::{Answer, Answers, DirectCalls};

/// Calls running, by the client's request id: what cancels each.
type Running = Mutex<RunningCalls>;
type RunningCalls = HashMap<RequestId, CancellationToken, foldhash::fast::RandomState>;

/// How long calls still running may answer once the client's input ended (what rmcp's loop
/// gives its handlers then), and once the transport closes otherwise (at least what rmcp's
/// loop gave its handlers before closing it on a cancellation).
const ANSWERING_AFTER_INPUT_ENDED: Duration = Duration::from_secs(5);
const ANSWERING_AFTER_CANCEL: Duration = Duration::from_secs(2);

pub(super) struct Direct {
    gateway: Arc<Gateway>,
    /// The session's peer, once it is up.
    peer: OnceLock<Peer<RoleServer>>,
    /// Cancelled when the session ends.
    session: CancellationToken,
    running: Arc<Running>,
    /// The calls' tasks (answered or not), waited for when the session closes.
    tasks: TaskTracker,
    /// Until when calls still running may answer, once the client's input ended.
    answering_until: OnceLock<tokio::time::Instant>,
    /// Cancelled when the client's input ends, and with it rmcp's loop, which passes the
    /// calls' progress on: their answers then wait for no more of it.
    input_open: CancellationToken,
}

impl Direct {
    /// Calls served by `gateway`, the same session the service loop serves.
    pub(super) fn new(gateway: Gateway) -> Self {
        Self {
            gateway: Arc::new(gateway),
            peer: OnceLock::new(),
            session: CancellationToken::new(),
            running: Arc::default(),
            tasks: TaskTracker::new(),
            answering_until: OnceLock::new(),
            input_open: CancellationToken::new(),
        }
    }

    /// The session is up: calls are taken from now on.
    pub(super) fn serving(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
    }

    /// Whether the session's service has ended (its peer can send nothing more).
    pub(super) fn peer_closed(&self) -> bool {
        self.peer.get().is_some_and(Peer::is_transport_closed)
    }
}

impl DirectCalls for Direct {
    fn call(
        &self,
        id: RequestId,
        mut call: CallToolRequest,
        answers: &Answers,
    ) -> Option<(RequestId, CallToolRequest)> {
        let Some(peer) = self.peer.get() else {
            return Some((id, call));
        };
        if self.session.is_cancelled() {
            return Some((id, call));
        }
        let cancel = self.session.child_token();
        lock(&self.running).insert(id.clone(), cancel.clone());
        (call.extensions).insert(ProgressUntil(self.input_open.clone()));
        let (handling, raw) = handling(self.gateway.clone(), &id, call, peer, &cancel);
        let (running, answers) = (self.running.clone(), answers.clone());
        self.tasks.spawn(async move {
            let result = handling.await;
            // A cancelled request is not answered (nor is one whose session ended); an
            // answered one's token is cancelled, as rmcp's loop does.
            let Some(cancel) = lock(&running).remove(&id) else {
                return;
            };
            cancel.cancel();
            if let Err(error) = answers(answer_of(id, result, &raw)).await {
                tracing::debug!("could not answer a tool call: {error}");
            }
        });
        None
    }

    fn cancelled(&self, id: &RequestId) {
        if let Some(cancel) = lock(&self.running).remove(id) {
            cancel.cancel();
        }
    }

    fn closed(&self) {
        self.session.cancel();
        lock(&self.running).clear();
    }

    fn input_ended(&self) {
        let _ =
            (self.answering_until).set(tokio::time::Instant::now() + ANSWERING_AFTER_INPUT_ENDED);
        self.input_open.cancel();
    }

    fn drained(&self) -> BoxFuture<'static, ()> {
        let until = (self.answering_until.get().copied())
            .unwrap_or_else(|| tokio::time::Instant::now() + ANSWERING_AFTER_CANCEL);
        self.tasks.close();
        let (tasks, session, running) = (
            self.tasks.clone(),
            self.session.clone(),
            self.running.clone(),
        );
        Box::pin(async move {
            let _ = tokio::time::timeout_at(until, tasks.wait()).await;
            // Those still running are cancelled, unanswered.
            session.cancel();
            lock(&running).clear();
        })
    }
}

/// A tool call's handling by `gateway`, as rmcp's loop would run it for `peer` (the request's
/// `_meta` and extensions move to its context, which `cancel` cancels), and the slot its
/// result's bytes come back in when the result has the right shape.
pub(super) fn handling(
    gateway: Arc<Gateway>,
    id: &RequestId,
    call: CallToolRequest,
    peer: &Peer<RoleServer>,
    cancel: &CancellationToken,
) -> (Handling, Arc<RawResult>) {
    let mut request = ClientRequest::CallToolRequest(call);
    let mut meta = RequestMetaObject::new();
    let mut extensions = Extensions::new();
    std::mem::swap(&mut meta, request.get_meta_mut());
    std::mem::swap(&mut extensions, request.extensions_mut());
    let raw = Arc::new(RawResult::default());
    extensions.insert(raw.clone());
    let mut context = RequestContext::new(id.clone(), peer.clone());
    context.ct = cancel.child_token();
    context.meta = meta;
    context.extensions = extensions;
    // Boxed here: the handler's future is several KB, and a spawned future is moved whole
    // into its task.
    let handling = Box::pin(async move {
        Service::<RoleServer>::handle_request(&*gateway, request, context).await
    });
    (handling, raw)
}

/// A tool call's handling, as [`handling`] makes it.
type Handling = BoxFuture<'static, Result<ServerResult, ErrorData>>;

/// What answers call `id` once its handling gave `result` (its bytes in `raw`).
pub(super) fn answer_of(
    id: RequestId,
    result: Result<ServerResult, ErrorData>,
    raw: &RawResult,
) -> Answer {
    match result {
        // Still the placeholder the bytes stand for: nothing on the way changed it. (A call
        // parked for input leaves its slot alone: the request resuming it moves the bytes
        // over.)
        Ok(ServerResult::CallToolResult(result)) if is_placeholder(&result) => match raw.take() {
            Some(bytes) => Answer::Raw {
                id,
                result: bytes,
                complete: result.result_type.is_some(),
            },
            None => Answer::Message(JsonRpcMessage::response(
                ServerResult::CallToolResult(result),
                id,
            )),
        },
        Ok(result) => Answer::Message(JsonRpcMessage::response(result, id)),
        Err(error) => Answer::Message(JsonRpcMessage::error(error, Some(id))),
    }
}

fn lock(running: &Running) -> std::sync::MutexGuard<'_, RunningCalls> {
    running.lock().unwrap_or_else(|e| e.into_inner())
}
