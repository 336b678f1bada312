//! The call path, a service of its own: advertised name → route → admission → exactly one call
//! on a live session (one more only where `retry` allows) → report to the policy. It owns what
//! calls share: their ids, the count in flight (a shutdown drains them), the observer (metrics).
//! It reaches the rest of the host only through [`CallHost`], which the supervisor implements
//! and the tests fake (`tests.rs`, in paused time). Refusals and failures come back as tool
//! errors whose text is meant for the model: it names the server, says whether the call
//! reached it, and what to do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject};
use tokio::sync::{Notify, watch};
// The tokio clock: a test in paused time sees holds and deadlines as they are.
use tokio::time::Instant;

use crate::config::Timeouts;
use crate::policy::{
    Admission, CallOutcome, CallReport, CallRequest, EventKind, Fault, Hold, PolicyError,
    ReconnectRequest, ReconnectSource,
};
use crate::registry::Route;
use crate::telemetry::RequestTrace;
use crate::upstream::{CallArguments, CallContext, CallFailure, Session};

mod retry;

/// How a call ended, for observers (and as the `outcome` label of metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallResultKind {
    /// The server answered with a result that is not an error.
    Ok,
    /// The server answered with an error result or rejected the request.
    ToolError,
    /// The transport failed before an answer arrived.
    TransportError,
    /// No answer within the call deadline.
    Timeout,
    /// Not sent: refused by the policy, shutting down, or no session came up in time.
    Refused,
    /// The client cancelled it while it was in flight; the server was told.
    Cancelled,
}

impl CallResultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::TransportError => "transport_error",
            Self::Timeout => "timeout",
            Self::Refused => "refused",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Hears about every finished call.
pub trait CallObserver: Send + Sync {
    /// `tool` is the tool's name on `server`.
    fn observe(&self, server: &str, tool: &str, result: CallResultKind, duration: Duration);
}

/// Calls sent again because their first try provably never ran (refused by the server before
/// running, or never written), since start.
static RESENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Calls sent again because their first try provably never ran, since start.
pub fn resent_calls() -> u64 {
    RESENT.load(Ordering::Relaxed)
}

/// What is left of a call's deadline after the longest hold: enough to be answered at all.
const MIN_CALL_TIME: Duration = Duration::from_millis(100);

/// Why a call got no admission.
enum Unadmitted {
    /// Its client cancelled it while it was held.
    Cancelled,
    /// The policy could not decide.
    Undecided(PolicyError),
}

/// A call that could not be routed, or that its server refused as a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// The call stopped without an answer for a reason of the host's (its task ended).
    #[error("the call was interrupted: {0}")]
    Interrupted(String),
    /// The server answered with a JSON-RPC error (unknown tool, invalid arguments, a missing
    /// client capability, ...): a client gets it as the server gave it.
    #[error("server {server:?} refused the call: {}", error.message)]
    Rejected {
        /// The server.
        server: String,
        /// Its error, code and data as it sent them.
        error: rmcp::model::ErrorData,
    },
}

/// A session a call can go out on.
pub(crate) trait CallSession: Send + Sync + 'static {
    /// Whether requests can still go out on it.
    fn is_alive(&self) -> bool;
    /// Calls a tool once; never retried here. Takes the arguments; a call that fails puts
    /// back those its transport handed back (see [`CallArguments`]).
    fn call<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a mut CallArguments,
        timeouts: &'a Timeouts,
        context: &'a CallContext,
    ) -> impl Future<Output = Result<CallToolResult, CallFailure>> + Send + 'a;
}

impl CallSession for Session {
    fn is_alive(&self) -> bool {
        Session::is_alive(self)
    }

    fn call<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a mut CallArguments,
        timeouts: &'a Timeouts,
        context: &'a CallContext,
    ) -> impl Future<Output = Result<CallToolResult, CallFailure>> + Send + 'a {
        Session::call(self, tool, arguments, timeouts, context)
    }
}

/// A server's session as a call needs it: the current one (possibly dead), its replacements
/// as they come, and the server's deadlines.
pub(crate) struct Sessions<S> {
    pub(crate) current: Option<Arc<S>>,
    pub(crate) updates: watch::Receiver<Option<Arc<S>>>,
    pub(crate) timeouts: Timeouts,
}

/// What the call path needs of the rest of the host: routes, the policy's admission and its
/// ear, the time, and each server's sessions.
pub(crate) trait CallHost: Send + Sync {
    type Session: CallSession;
    /// The route of a visible tool, or of one withdrawn from a server still configured.
    fn route(&self, advertised: &str) -> Option<Arc<Route>>;
    /// The policy's admission of a call (unchecked answers are the host's concern).
    fn admit(
        &self,
        request: CallRequest,
    ) -> impl Future<Output = Result<Admission, PolicyError>> + Send + '_;
    /// Gives the policy an event (a call's report, a reconnect request).
    fn feed(&self, event: EventKind);
    /// The host's time, as the policy sees it.
    fn now_ms(&self) -> u64;
    /// The sessions of `server`; `None` once it is removed.
    fn sessions(&self, server: &str) -> Option<Sessions<Self::Session>>;
}

/// The call path's own state.
#[derive(Default)]
pub(crate) struct Calls {
    next_call_id: AtomicU64,
    /// Calls between admission and answer; a drain waits for them.
    in_flight: AtomicUsize,
    idle: Notify,
    /// Set once a drain starts: new calls are refused.
    draining: AtomicBool,
    observer: std::sync::RwLock<Option<Arc<dyn CallObserver>>>,
}

impl Calls {
    /// Calls the tool agents know as `advertised` through `host`, awaiting `before_dispatch`
    /// between admission and dispatch (tests make the world change exactly there).
    pub(crate) async fn call<H: CallHost>(
        &self,
        host: &H,
        advertised: &str,
        arguments: Option<JsonObject>,
        context: CallContext,
        before_dispatch: impl std::future::Future<Output = ()>,
    ) -> Result<CallToolResponse, CallError> {
        let trace = context.trace.clone();
        Call {
            calls: self,
            host,
            trace,
        }
        .run(advertised, arguments, context, before_dispatch)
        .await
    }

    /// Refuses new calls and waits up to `within` for the calls in flight to be answered.
    pub(crate) async fn drain(&self, within: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let idle = self.idle.notified();
            let busy = self.in_flight.load(Ordering::SeqCst);
            if busy == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                tracing::warn!("{busy} calls still in flight after {within:?}; stopping anyway");
                return;
            }
        }
    }

    /// Registers the one observer of finished calls (metrics).
    pub(crate) fn observe_calls(&self, observer: Arc<dyn CallObserver>) {
        *self.observer.write().unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    fn next_call_id(&self) -> u64 {
        // Ids start at 1.
        self.next_call_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Counts the call in flight for a drain, or refuses it if one has begun.
    fn enter_call(&self) -> Option<InFlight<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        (!self.draining.load(Ordering::SeqCst)).then_some(guard)
    }

    fn observe(&self, server: &str, tool: &str, result: CallResultKind, duration: Duration) {
        let observer = self
            .observer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(observer) = observer {
            observer.observe(server, tool, result, duration);
        }
    }
}

/// One call on its way: the call path's state and the host it reaches.
struct Call<'a, H> {
    calls: &'a Calls,
    host: &'a H,
    /// What the call's trace records: its route, admission, tries and outcome.
    trace: Option<Arc<RequestTrace>>,
}

impl<H: CallHost> Call<'_, H> {
    async fn run(
        &self,
        advertised: &str,
        arguments: Option<JsonObject>,
        context: CallContext,
        before_dispatch: impl std::future::Future<Output = ()>,
    ) -> Result<CallToolResponse, CallError> {
        let Some(_in_flight) = self.calls.enter_call() else {
            return Ok(refused(
                "Tether is shutting down; the call was not sent. Do not retry it here.".into(),
            ));
        };
        let Some(route) = self.host.route(advertised) else {
            self.trace(|t| t.outcome("unknown_tool", Some("no such tool")));
            return Err(CallError::UnknownTool(advertised.to_string()));
        };
        let server = route.server.clone();
        let tool = route.tool.original.as_str();
        self.trace(|t| {
            t.record("tether.server", server.as_str());
            t.record("tether.tool.original", tool);
        });
        let call_id = self.calls.next_call_id();
        let (admission, held) = match self
            .admit(&server, call_id, &route.tool.original, &context.cancel)
            .await
        {
            Ok(decided) => decided,
            Err(Unadmitted::Cancelled) => {
                self.trace(|t| t.record("tether.admission", "cancelled while held"));
                self.observe(&server, tool, CallResultKind::Cancelled, Duration::ZERO);
                return Ok(refused(
                    "The call was cancelled before it was sent.".to_string(),
                ));
            }
            Err(Unadmitted::Undecided(error)) => {
                self.trace(|t| t.record("tether.admission", "undecided"));
                tracing::error!(server = %server, "admission failed, refusing the call: {error}");
                return Ok(self.refuse(&server, tool, format!(
                    "Tether could not decide whether to call server \"{server}\"; the call was not sent. Wait a few seconds and retry."
                )));
            }
        };
        self.trace(|t| {
            t.record("tether.admission", admission_name(&admission));
            if !held.is_zero() {
                t.record("tether.held_ms", held.as_millis() as u64);
            }
        });
        let context = match admission {
            Admission::Reject(message) | Admission::Hold(Hold { message, .. }) => {
                return Ok(self.refuse(&server, tool, message));
            }
            Admission::Reconnect(message) => {
                self.reconnect_for_call(&server);
                return Ok(self.refuse(&server, tool, message));
            }
            Admission::Allow => context,
            // The policy waits for its probe's outcome: a probe runs to its end even if its
            // client gives up (the client's answer is dropped), so the breaker hears what the
            // server really did, not that someone lost interest.
            Admission::Probe => CallContext {
                cancel: Default::default(),
                ..context
            },
        };
        let Some(Sessions {
            current,
            updates: sessions,
            timeouts: server_timeouts,
        }) = self.host.sessions(&server)
        else {
            return Ok(self.refuse(
                &server,
                tool,
                format!("Server \"{server}\" was removed; the call was not sent. Do not retry it."),
            ));
        };
        // A hold counts against the call's deadline.
        let timeouts = Timeouts {
            call: server_timeouts.call.saturating_sub(held).max(MIN_CALL_TIME),
            call_max: server_timeouts
                .call_max
                .saturating_sub(held)
                .max(MIN_CALL_TIME),
            ..server_timeouts
        };
        before_dispatch.await;
        let started = Instant::now();
        let mut session = current.clone().filter(|s| s.is_alive());
        if session.is_none() {
            // Found dead before dispatch: nothing was sent, so one call on a fresh session is safe.
            self.reconnect_if_current(&server, current.as_ref(), &sessions);
            session =
                wait_for_fresh(sessions.clone(), current.as_ref(), timeouts.reconnect_wait).await;
        }
        let Some(first) = session else {
            self.report(
                &server,
                tool,
                call_id,
                CallOutcome::TransportError(Fault::TransportClosed("no live session".into())),
                started,
            );
            return Ok(refused(format!(
                "Server \"{server}\" is reconnecting; the call was not sent. Wait about {} s and retry.",
                timeouts.reconnect_wait.as_secs().max(1)
            )));
        };
        // One try, and one more only where `retry::after` says the call cannot run twice.
        let mut target = first;
        let mut id = call_id;
        let mut tries = 0;
        // What happened to an earlier try that reached the server (and was reported), in words
        // for the caller: lost, or failed by the server.
        let mut first_failure: Option<String> = None;
        // Whether this try goes to the session the previous one failed on.
        let mut on_same_session = false;
        // A try takes the arguments (rmcp's request owns them) and gets them back from its
        // transport if it fails: no try copies them.
        let mut arguments = CallArguments::new(arguments);
        let (result, reported) = loop {
            let result = target
                .call(&route.tool.original, &mut arguments, &timeouts, &context)
                .await;
            tries += u32::from(retry::counts(&result, on_same_session));
            let retry::Next::Again {
                report_loss,
                same_session,
            } = retry::after(&result, route.tool.read_only, tries, arguments.is_here())
            else {
                break (result, false);
            };
            if report_loss {
                self.report_result(&server, tool, id, &result, started);
                id = self.calls.next_call_id();
                first_failure = Some(match &result {
                    Err(CallFailure::HttpStatus(status)) => {
                        format!("Server \"{server}\" failed the call with HTTP {status}")
                    }
                    _ => format!("The connection to server \"{server}\" was lost during the call"),
                });
            } else {
                RESENT.fetch_add(1, Ordering::Relaxed);
            }
            // The server failed only that request: the session stays, with the other calls on
            // it (replacing it would lose theirs).
            on_same_session = same_session && target.is_alive();
            if on_same_session {
                continue;
            }
            self.reconnect_if_current(&server, Some(&target), &sessions);
            match wait_for_fresh(sessions.clone(), Some(&target), timeouts.reconnect_wait).await {
                Some(fresh) => target = fresh,
                None => break (result, report_loss),
            }
        };
        self.trace(|t| t.record("tether.attempts", tries));
        if !reported {
            self.report_result(&server, tool, id, &result, started);
        }
        Ok(match result {
            // The server's own refusal of the request goes to the client as it sent it.
            Err(CallFailure::Protocol(error)) => {
                return Err(CallError::Rejected { server, error });
            }
            // A retry that never left does not undo the loss before it: the call may have run.
            Err(CallFailure::NotSent(fault)) if let Some(first) = &first_failure => refused(format!(
                "{first}, and the retry could not be sent ({}). The tool is read-only, so retrying is safe: wait a few seconds and retry.",
                fault_words(&fault)
            )),
            Err(CallFailure::Lost(fault)) if let Some(first) = &first_failure => refused(format!(
                "{first}, and the connection was lost during one retry ({}). The tool is read-only, so retrying is safe: wait a few seconds and retry.",
                fault_words(&fault)
            )),
            result => respond(&server, result, route.tool.read_only),
        })
    }

    /// Asks the policy to admit the call. A held call (contract 0.2) waits, within the call
    /// deadline, for a session newer than the one the server has, then is asked about again
    /// with the same id; a hold that runs out is answered with the policy's refusal. Nothing
    /// is sent while held, so the call runs at most once.
    async fn admit(
        &self,
        server: &str,
        call_id: u64,
        tool: &str,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<(Admission, Duration), Unadmitted> {
        let begun = Instant::now();
        // Set at the first hold: the call's deadline, and when that hold ends.
        let mut deadline: Option<Instant> = None;
        let mut asked_again = false;
        loop {
            let request = CallRequest {
                now: self.host.now_ms(),
                call_id,
                server: server.to_string(),
                tool: tool.to_string(),
            };
            let admission = self
                .host
                .admit(request)
                .await
                .map_err(Unadmitted::Undecided)?;
            let Admission::Hold(hold) = &admission else {
                return Ok((admission, begun.elapsed()));
            };
            let Some(lookup) = self.host.sessions(server) else {
                return Ok((admission, begun.elapsed()));
            };
            // A live session seen now may have become visible while the policy decided (it is
            // visible once the policy has heard of it): asked again once, the call need not
            // wait for a session after it.
            let live = lookup.current.as_ref().is_some_and(|s| s.is_alive());
            if live && !std::mem::replace(&mut asked_again, true) {
                continue;
            }
            asked_again = false;
            let deadline = *deadline.get_or_insert(begun + lookup.timeouts.call);
            let until = deadline.min(Instant::now() + Duration::from_millis(hold.wait_ms));
            // A session becomes visible once the policy has heard of it, so the next
            // admission after a fresh one is decided knowing it.
            let fresh = wait_for_fresh(
                lookup.updates,
                lookup.current.as_ref(),
                until.saturating_duration_since(Instant::now()),
            );
            tokio::select! {
                fresh = fresh => if fresh.is_none() {
                    tracing::debug!(server, call_id, "a held call found no fresh session in time");
                    return Ok((admission, begun.elapsed()));
                },
                () = cancel.cancelled() => return Err(Unadmitted::Cancelled),
            }
        }
    }

    /// Asks for a reconnect because a call found `server`'s session dead, unless a newer
    /// session has already replaced it (a stale request would tear down a healthy session).
    fn reconnect_if_current(
        &self,
        server: &str,
        dead: Option<&Arc<H::Session>>,
        sessions: &watch::Receiver<Option<Arc<H::Session>>>,
    ) {
        let replaced = match (&*sessions.borrow(), dead) {
            (Some(current), Some(dead)) => !Arc::ptr_eq(current, dead),
            (Some(current), None) => current.is_alive(),
            (None, _) => false,
        };
        if !replaced {
            self.reconnect_for_call(server);
        }
    }

    fn reconnect_for_call(&self, server: &str) {
        self.host
            .feed(EventKind::ReconnectRequested(ReconnectRequest {
                server: server.to_string(),
                source: ReconnectSource::Probe,
            }));
    }

    /// A refusal for the model, counted as a call that was not sent.
    fn refuse(&self, server: &str, tool: &str, message: String) -> CallToolResponse {
        self.observe(server, tool, CallResultKind::Refused, Duration::ZERO);
        refused(message)
    }

    fn observe(&self, server: &str, tool: &str, result: CallResultKind, duration: Duration) {
        self.calls.observe(server, tool, result, duration);
        self.trace(|t| {
            let failed = (result != CallResultKind::Ok).then_some(result.as_str());
            t.outcome(result.as_str(), failed);
        });
    }

    fn trace(&self, record: impl FnOnce(&RequestTrace)) {
        if let Some(trace) = &self.trace {
            record(trace);
        }
    }

    /// Tells the policy how a call that went out ended. A cancelled call is reported as such
    /// (contract 0.2); the edge of contract 0.1, which has no word for it, drops the report.
    fn report_result(
        &self,
        server: &str,
        tool: &str,
        call_id: u64,
        result: &Result<CallToolResult, CallFailure>,
        started: Instant,
    ) {
        self.report(server, tool, call_id, outcome(result), started);
    }

    /// Tells the policy how a call ended, before the caller gets its answer, so the next
    /// admission counts it. Its actions (a breaker opening: tools withdrawn) run as soon as it
    /// is decided: inline, a few microseconds; queued, on the policy thread.
    fn report(
        &self,
        server: &str,
        tool: &str,
        call_id: u64,
        outcome: CallOutcome,
        started: Instant,
    ) {
        let kind = match &outcome {
            CallOutcome::Ok => CallResultKind::Ok,
            CallOutcome::ToolError(_) => CallResultKind::ToolError,
            CallOutcome::TransportError(_) => CallResultKind::TransportError,
            CallOutcome::Timeout => CallResultKind::Timeout,
            CallOutcome::Cancelled => CallResultKind::Cancelled,
        };
        self.observe(server, tool, kind, started.elapsed());
        self.host.feed(EventKind::CallFinished(CallReport {
            server: server.to_string(),
            call_id,
            outcome,
            duration_ms: started.elapsed().as_millis() as u64,
        }));
    }
}

/// An admission as a trace names it.
fn admission_name(admission: &Admission) -> &'static str {
    match admission {
        Admission::Allow => "allow",
        Admission::Probe => "probe",
        Admission::Reject(_) => "reject",
        Admission::Hold(_) => "hold",
        Admission::Reconnect(_) => "reconnect",
    }
}

/// Marks one call in flight; the last one out wakes a drain.
struct InFlight<'a>(&'a Calls);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Waits up to `within` for a live session other than `failed`: a retry must go to a session
/// opened after the failure, never to the stale one that may still look alive for a moment.
async fn wait_for_fresh<S: CallSession>(
    mut sessions: watch::Receiver<Option<Arc<S>>>,
    failed: Option<&Arc<S>>,
    within: Duration,
) -> Option<Arc<S>> {
    let wait = sessions.wait_for(|s| {
        s.as_ref()
            .is_some_and(|s| s.is_alive() && failed.is_none_or(|failed| !Arc::ptr_eq(s, failed)))
    });
    match tokio::time::timeout(within, wait).await {
        Ok(Ok(session)) => session.clone(),
        _ => None,
    }
}

fn outcome(result: &Result<CallToolResult, CallFailure>) -> CallOutcome {
    match result {
        Ok(result) if result.is_error == Some(true) => CallOutcome::ToolError(text_of(result)),
        Ok(_) => CallOutcome::Ok,
        Err(CallFailure::TimedOut(_)) => CallOutcome::Timeout,
        Err(CallFailure::Lost(fault) | CallFailure::NotSent(fault)) => {
            CallOutcome::TransportError(fault.clone())
        }
        Err(CallFailure::HttpStatus(status)) => CallOutcome::TransportError(
            Fault::TransportClosed(format!("the server answered the call with HTTP {status}")),
        ),
        // The server answered: it works; the request was wrong.
        Err(CallFailure::Protocol(error)) => CallOutcome::ToolError(error.message.to_string()),
        // The server answered too; only its answer could not be taken.
        Err(CallFailure::TooLarge { .. }) => {
            CallOutcome::ToolError("the answer was larger than max_message".into())
        }
        // Reported to 0.2 policies; a 0.1 policy has no word for it and never hears of it.
        Err(CallFailure::Cancelled) => CallOutcome::Cancelled,
        // The server answered: it works, and asks the client for input.
        Err(CallFailure::InputRequired(_)) => CallOutcome::Ok,
    }
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn refusal(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn refused(message: String) -> CallToolResponse {
    refusal(message).into()
}

/// The response for a call that went out: the server's request for input passes on as is (the
/// caller may be able to answer it), everything else is [`answer`]ed.
fn respond(
    server: &str,
    result: Result<CallToolResult, CallFailure>,
    read_only: bool,
) -> CallToolResponse {
    match result {
        Err(CallFailure::InputRequired(request)) => CallToolResponse::InputRequired(*request),
        other => answer(server, other, read_only).into(),
    }
}

#[cfg(any(test, feature = "test-support"))]
/// A call's response as a plain result, for a caller that cannot answer a server's request for
/// input; the server's rejection of the request becomes a tool error with words for the model.
pub(crate) fn as_result(
    advertised: &str,
    response: Result<CallToolResponse, CallError>,
) -> Result<CallToolResult, CallError> {
    match response {
        Ok(response) => Ok(complete(advertised, response)),
        Err(CallError::Rejected { server, error }) => {
            Ok(answer(&server, Err(CallFailure::Protocol(error)), false))
        }
        Err(unknown) => Err(unknown),
    }
}

/// A response as a plain result, for a caller that cannot answer a server's request for input.
pub fn complete(advertised: &str, response: CallToolResponse) -> CallToolResult {
    match response {
        CallToolResponse::Complete(result) => result,
        CallToolResponse::InputRequired(_) => refusal(format!(
            "The tool \"{advertised}\" needs more input from the user before it can finish (the server asked for it the protocol 2026-07-28 way, which this client does not support). The call did not complete; it may be used from a client that supports protocol 2026-07-28."
        )),
        _ => refusal(format!(
            "The tool \"{advertised}\" answered with a kind of result Tether does not pass on."
        )),
    }
}

/// The agent's answer for a call that went out (or tried to).
fn answer(
    server: &str,
    result: Result<CallToolResult, CallFailure>,
    read_only: bool,
) -> CallToolResult {
    match result {
        Ok(result) => result,
        Err(CallFailure::TimedOut(after)) => refusal(format!(
            "Server \"{server}\" did not answer within {} s. The call reached the server and may still be running: the outcome is uncertain. Do not retry it blindly; check its effect first.",
            after.as_secs().max(1)
        )),
        Err(CallFailure::Lost(fault)) if read_only => refusal(format!(
            "The connection to server \"{server}\" was lost during the call ({}), and the call was not run again on a fresh session. The tool is read-only: wait a few seconds and retry.",
            fault_words(&fault)
        )),
        Err(CallFailure::Lost(fault)) => refusal(format!(
            "The connection to server \"{server}\" was lost while the call was in flight ({}). The call may or may not have run: the outcome is uncertain. Do not retry it blindly; check its effect first.",
            fault_words(&fault)
        )),
        Err(CallFailure::NotSent(fault)) => refusal(format!(
            "Server \"{server}\" is reconnecting ({}); the call was not sent. Wait a few seconds and retry.",
            fault_words(&fault)
        )),
        Err(CallFailure::HttpStatus(status)) if retry::asks_for_time(status) => refusal(format!(
            "Server \"{server}\" is too busy to take the call (HTTP {status}) and did not answer it; it most likely did not run. Wait a little before retrying{}.",
            if read_only {
                ""
            } else {
                "; the tool may have side effects, so check first that it did not run"
            }
        )),
        Err(CallFailure::HttpStatus(status)) if read_only => refusal(format!(
            "Server \"{server}\" failed the call with HTTP {status}. The tool is read-only: retrying later is safe."
        )),
        Err(CallFailure::HttpStatus(status)) => refusal(format!(
            "Server \"{server}\" failed the call with HTTP {status}. The call may or may not have run: the outcome is uncertain. Do not retry it blindly; check its effect first."
        )),
        Err(CallFailure::Protocol(error)) => refusal(format!(
            "Server \"{server}\" rejected the call: {}. Fix the arguments before retrying.",
            error.message
        )),
        Err(CallFailure::InputRequired(_)) => refusal(format!(
            "Server \"{server}\" needs more input from the user to finish the call, which this client cannot give."
        )),
        Err(CallFailure::Cancelled) => refusal(format!(
            "The call to server \"{server}\" was cancelled by the client; the server was told to stop. It may or may not have run."
        )),
        Err(CallFailure::TooLarge { size, limit }) => refusal(format!(
            "Server \"{server}\" ran the call, but its answer{} is larger than Tether's limit of {} (max_message), so it was dropped unread. Do not retry it as is: ask for less (narrower arguments, fewer items), or have the operator raise max_message for this server.",
            if size > 0 {
                format!(" ({})", crate::transport::limit::describe_size(size))
            } else {
                String::new()
            },
            crate::transport::limit::describe_size(limit)
        )),
    }
}

/// A short, credential-free account of a fault.
fn fault_words(fault: &Fault) -> String {
    match fault {
        Fault::ProcessExited(Some(code)) => format!("its process exited with code {code}"),
        Fault::ProcessExited(None) => "its process was killed".to_string(),
        Fault::SessionExpired => "the server restarted and forgot the session".to_string(),
        Fault::AuthRequired(code) => format!("it requires authorization, HTTP {code}"),
        Fault::AuthorizationRequired(words) => words.clone(),
        _ => "the connection closed".to_string(),
    }
}

#[cfg(test)]
mod tests;
