//! The call path on a fake host, in paused time: holds, retries and drains to the millisecond,
//! with no server, no wasm and no thread.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::time::Instant;

use super::*;
use crate::policy::PublishedTool;

/// A session whose answers are scripted; each call takes `delay`.
struct FakeSession {
    alive: AtomicBool,
    answers: Mutex<VecDeque<Result<CallToolResult, CallFailure>>>,
    delay: Duration,
    /// The call deadline each try was given.
    tries: Mutex<Vec<Duration>>,
    /// The arguments each try sent.
    sent: Mutex<Vec<Option<JsonObject>>>,
    /// Whether its transport hands a failed try's arguments back, as every transport of
    /// Tether's does (one that lost them does not).
    gives_back: bool,
}

impl FakeSession {
    fn new(answers: Vec<Result<CallToolResult, CallFailure>>) -> Arc<Self> {
        Self::slow(answers, Duration::ZERO)
    }

    fn slow(answers: Vec<Result<CallToolResult, CallFailure>>, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            alive: AtomicBool::new(true),
            answers: Mutex::new(answers.into()),
            delay,
            tries: Mutex::default(),
            sent: Mutex::default(),
            gives_back: true,
        })
    }

    /// Over a transport that hands a failed try's arguments back or not.
    fn over(answers: Vec<Result<CallToolResult, CallFailure>>, gives_back: bool) -> Arc<Self> {
        let mut session = Arc::into_inner(Self::new(answers)).unwrap();
        session.gives_back = gives_back;
        Arc::new(session)
    }

    fn dead() -> Arc<Self> {
        let session = Self::new(Vec::new());
        session.alive.store(false, Ordering::SeqCst);
        session
    }

    fn tries(&self) -> usize {
        self.tries.lock().unwrap().len()
    }
}

impl CallSession for FakeSession {
    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    async fn call<'a>(
        &'a self,
        _tool: &'a str,
        arguments: &'a mut CallArguments,
        timeouts: &'a Timeouts,
        _context: &'a CallContext,
    ) -> Result<CallToolResult, CallFailure> {
        self.tries.lock().unwrap().push(timeouts.call);
        let sent = arguments.take();
        self.sent.lock().unwrap().push(sent.clone());
        tokio::time::sleep(self.delay).await;
        let answer = self.answers.lock().unwrap().pop_front();
        if let (Some(Err(_)), true) = (&answer, self.gives_back) {
            arguments.put_back(sent);
        }
        answer.unwrap_or_else(|| Ok(CallToolResult::success(vec![ContentBlock::text("done")])))
    }
}

/// One server, `svc`, with tools `write` and `read` (read-only); the policy's admissions are
/// scripted (then `Allow`), and what the call path tells it is kept.
struct FakeHost {
    admissions: Mutex<VecDeque<Admission>>,
    /// The call id of each admission asked for.
    admitted: Mutex<Vec<u64>>,
    fed: Mutex<Vec<EventKind>>,
    /// Made visible while the next admission is decided (a session connecting meanwhile).
    connects_while_deciding: Mutex<Option<Arc<FakeSession>>>,
    sessions: watch::Sender<Option<Arc<FakeSession>>>,
    timeouts: Timeouts,
    start: Instant,
}

impl FakeHost {
    fn new(session: Arc<FakeSession>, admissions: Vec<Admission>) -> Arc<Self> {
        Arc::new(Self {
            admissions: Mutex::new(admissions.into()),
            admitted: Mutex::default(),
            fed: Mutex::default(),
            connects_while_deciding: Mutex::default(),
            sessions: watch::channel(Some(session)).0,
            timeouts: Timeouts {
                call: Duration::from_secs(30),
                reconnect_wait: Duration::from_secs(10),
                ..Timeouts::default()
            },
            start: Instant::now(),
        })
    }

    fn replace(&self, session: Arc<FakeSession>) {
        self.sessions.send_replace(Some(session));
    }

    fn reports(&self) -> Vec<CallReport> {
        let fed = self.fed.lock().unwrap();
        fed.iter()
            .filter_map(|event| match event {
                EventKind::CallFinished(report) => Some(report.clone()),
                _ => None,
            })
            .collect()
    }

    fn reconnects(&self) -> usize {
        let fed = self.fed.lock().unwrap();
        fed.iter()
            .filter(|event| matches!(event, EventKind::ReconnectRequested(_)))
            .count()
    }
}

impl CallHost for FakeHost {
    type Session = FakeSession;

    fn route(&self, advertised: &str) -> Option<Arc<Route>> {
        let (original, read_only) = match advertised {
            "svc__write" => ("write", false),
            "svc__read" => ("read", true),
            _ => return None,
        };
        Some(Arc::new(Route::new(
            "svc".into(),
            PublishedTool {
                advertised: advertised.into(),
                original: original.into(),
                description: None,
                input_schema: "{}".into(),
                read_only,
                extra: String::new(),
            },
        )))
    }

    fn admit(
        &self,
        request: CallRequest,
    ) -> impl Future<Output = Result<Admission, PolicyError>> + Send + '_ {
        self.admitted.lock().unwrap().push(request.call_id);
        if let Some(session) = self.connects_while_deciding.lock().unwrap().take() {
            self.replace(session);
        }
        let next = self.admissions.lock().unwrap().pop_front();
        std::future::ready(Ok(next.unwrap_or(Admission::Allow)))
    }

    fn feed(&self, event: EventKind) {
        self.fed.lock().unwrap().push(event);
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn sessions(&self, server: &str) -> Option<Sessions<FakeSession>> {
        (server == "svc").then(|| Sessions {
            current: self.sessions.borrow().clone(),
            updates: self.sessions.subscribe(),
            timeouts: self.timeouts.clone(),
        })
    }
}

async fn call(calls: &Calls, host: &FakeHost, tool: &str) -> Result<CallToolResult, CallError> {
    call_with(calls, host, tool, None).await
}

async fn call_with(
    calls: &Calls,
    host: &FakeHost,
    tool: &str,
    arguments: Option<JsonObject>,
) -> Result<CallToolResult, CallError> {
    let response = calls
        .call(host, tool, arguments, CallContext::default(), async {})
        .await;
    as_result(tool, response)
}

fn text(result: &CallToolResult) -> String {
    text_of(result)
}

/// Makes `session` the server's live one after `delay`.
fn publish_after(
    host: &Arc<FakeHost>,
    session: &Arc<FakeSession>,
    delay: Duration,
) -> impl Future<Output = ()> + use<> {
    let (host, session) = (host.clone(), session.clone());
    async move {
        tokio::time::sleep(delay).await;
        host.replace(session);
    }
}

fn hold(wait_ms: u64, message: &str) -> Admission {
    Admission::Hold(Hold {
        wait_ms,
        message: message.into(),
    })
}

fn lost() -> Result<CallToolResult, CallFailure> {
    Err(CallFailure::Lost(Fault::ProcessExited(Some(1))))
}

#[tokio::test(start_paused = true)]
async fn a_held_call_waits_for_a_fresh_session_and_runs_once_on_it_within_its_deadline() {
    let old = FakeSession::dead();
    let host = FakeHost::new(old.clone(), vec![hold(10_000, "reconnecting")]);
    let calls = Calls::default();
    let fresh = FakeSession::new(Vec::new());
    let publish = publish_after(&host, &fresh, Duration::from_secs(3));
    let started = Instant::now();
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__write"), publish);
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    // Asked again, as the same call, once the fresh session was there.
    assert_eq!(*host.admitted.lock().unwrap(), [1, 1]);
    assert_eq!((old.tries(), fresh.tries()), (0, 1));
    // The hold counts against the call's deadline.
    assert_eq!(*fresh.tries.lock().unwrap(), [Duration::from_secs(27)]);
    assert_eq!(host.reports().len(), 1);
}

/// The policy holds the call while the server connects, and the session becomes visible before
/// the call looks at it: the call is asked about again at once and runs on it, rather than
/// waiting for a session after it until the hold runs out.
#[tokio::test(start_paused = true)]
async fn a_held_call_does_not_miss_a_session_that_connected_while_the_policy_decided() {
    let old = FakeSession::dead();
    let host = FakeHost::new(old.clone(), vec![hold(10_000, "connecting")]);
    let fresh = FakeSession::new(Vec::new());
    *host.connects_while_deciding.lock().unwrap() = Some(fresh.clone());
    let calls = Calls::default();
    let started = Instant::now();
    let result = call(&calls, &host, "svc__write").await;
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(*host.admitted.lock().unwrap(), [1, 1]);
    assert_eq!((old.tries(), fresh.tries()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_runs_out_is_answered_with_the_policys_words_and_nothing_is_sent() {
    let session = FakeSession::dead();
    let host = FakeHost::new(
        session.clone(),
        vec![hold(2_000, "svc is parked; retry later")],
    );
    let calls = Calls::default();
    let started = Instant::now();
    let result = call(&calls, &host, "svc__write").await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(result.is_error, Some(true));
    assert_eq!(text(&result), "svc is parked; retry later");
    assert_eq!(session.tries(), 0);
    assert!(
        host.reports().is_empty(),
        "a call not sent is not a call's outcome"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_refused_before_it_ran_goes_out_once_more_on_a_fresh_session_for_any_tool() {
    let refused = Err(CallFailure::NotSent(Fault::SessionExpired));
    let first = FakeSession::new(vec![refused]);
    let host = FakeHost::new(first.clone(), Vec::new());
    let calls = Calls::default();
    let second = FakeSession::new(Vec::new());
    let publish = publish_after(&host, &second, Duration::from_millis(1500));
    let resent = resent_calls();
    let started = Instant::now();
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__write"), publish);
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
    assert_eq!((first.tries(), second.tries()), (1, 1));
    assert_eq!(host.reconnects(), 1, "the stale session is replaced");
    assert!(resent_calls() > resent);
    // One call, one outcome: the try that never ran is not a failure of the server's.
    let reports = host.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].outcome, CallOutcome::Ok);
}

/// A call to `svc__write` with arguments whose first try is refused before it ran on a session
/// over a transport that `gives_back` the arguments or not; returns the result and the
/// arguments the fresh session got, if it was tried.
async fn resend_after_refusal(gives_back: bool) -> (CallToolResult, Option<Option<JsonObject>>) {
    let refused = Err(CallFailure::NotSent(Fault::TransportClosed("broken pipe".into())));
    let first = FakeSession::over(vec![refused], gives_back);
    let host = FakeHost::new(first.clone(), Vec::new());
    let second = FakeSession::new(Vec::new());
    let publish = publish_after(&host, &second, Duration::from_millis(100));
    let arguments = serde_json::json!({"path": "/tmp/x", "bytes": 3});
    let arguments = arguments.as_object().cloned();
    let calls = Calls::default();
    let (result, ()) = tokio::join!(
        call_with(&calls, &host, "svc__write", arguments.clone()),
        publish
    );
    assert_eq!(first.sent.lock().unwrap().as_slice(), [arguments]);
    let resent = second.sent.lock().unwrap().first().cloned();
    (result.unwrap(), resent)
}

#[tokio::test(start_paused = true)]
async fn a_call_that_never_left_goes_out_again_with_the_arguments_its_transport_handed_back() {
    let expected = serde_json::json!({"path": "/tmp/x", "bytes": 3});
    let (result, resent) = resend_after_refusal(true).await;
    assert_eq!(text(&result), "done");
    assert_eq!(resent, Some(expected.as_object().cloned()));
}

#[tokio::test(start_paused = true)]
async fn a_try_keeps_no_copy_so_arguments_its_transport_lost_end_the_call() {
    // A transport that did not hand them back: nothing was kept to resend.
    let (result, resent) = resend_after_refusal(false).await;
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).contains("not sent"), "{}", text(&result));
    assert_eq!(resent, None, "no second try without the arguments");
}

#[tokio::test(start_paused = true)]
async fn a_lost_call_is_repeated_only_for_a_read_only_tool_and_its_loss_is_reported_first() {
    // Read-only: the loss is reported (it counts), then the call runs again as a new call.
    let first = FakeSession::new(vec![lost()]);
    let host = FakeHost::new(first.clone(), Vec::new());
    let calls = Calls::default();
    let second = FakeSession::new(Vec::new());
    host.replace(first.clone());
    let publish = publish_after(&host, &second, Duration::from_millis(200));
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__read"), publish);
    assert_eq!(text(&result.unwrap()), "done");
    let reports = host.reports();
    assert_eq!(reports.len(), 2);
    assert!(matches!(reports[0].outcome, CallOutcome::TransportError(_)));
    assert_eq!(reports[1].outcome, CallOutcome::Ok);
    assert_ne!(reports[0].call_id, reports[1].call_id);

    // With side effects possible: never replayed; the answer says the outcome is uncertain.
    let first = FakeSession::new(vec![lost()]);
    let host = FakeHost::new(first.clone(), Vec::new());
    let second = FakeSession::new(Vec::new());
    host.replace(first.clone());
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__write"), async {
        host.replace(second.clone());
    });
    let words = text(&result.unwrap());
    assert!(words.contains("uncertain"), "{words}");
    assert_eq!((first.tries(), second.tries()), (1, 0));
    // Read-only, but its transport did not hand the arguments back: no copy was kept, so no
    // second try.
    let first = FakeSession::over(vec![lost()], false);
    let host = FakeHost::new(first.clone(), Vec::new());
    let second = FakeSession::new(Vec::new());
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__read"), async {
        host.replace(second.clone());
    });
    assert_eq!(result.unwrap().is_error, Some(true));
    assert_eq!((first.tries(), second.tries()), (1, 0));
}

/// A server that failed one request with an HTTP error keeps its session: a read-only call goes
/// out again on it at once, no reconnect is asked for (the other calls on the session live on),
/// and the failure still counts.
#[tokio::test(start_paused = true)]
async fn a_request_the_server_failed_is_repeated_on_its_own_session_without_a_reconnect() {
    let failed = |status| Err(CallFailure::HttpStatus(status));
    let session = FakeSession::new(vec![failed(500)]);
    let host = FakeHost::new(session.clone(), Vec::new());
    let calls = Calls::default();
    let started = Instant::now();
    let result = call(&calls, &host, "svc__read").await;
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(session.tries(), 2);
    assert_eq!(host.reconnects(), 0);
    let reports = host.reports();
    assert_eq!(reports.len(), 2);
    assert!(matches!(&reports[0].outcome, CallOutcome::TransportError(fault) if fault.to_string().contains("HTTP 500")));
    assert_eq!(reports[1].outcome, CallOutcome::Ok);

    // With side effects possible: answered, uncertain, on the session it failed on.
    let session = FakeSession::new(vec![failed(502)]);
    let host = FakeHost::new(session.clone(), Vec::new());
    let words = text(&call(&calls, &host, "svc__write").await.unwrap());
    assert!(words.contains("HTTP 502") && words.contains("uncertain"), "{words}");
    assert_eq!((session.tries(), host.reconnects()), (1, 0));

    // A server that asks for time is not asked again at once, and nothing is reconnected.
    let session = FakeSession::new(vec![failed(429)]);
    let host = FakeHost::new(session.clone(), Vec::new());
    let words = text(&call(&calls, &host, "svc__read").await.unwrap());
    assert!(words.contains("HTTP 429") && words.contains("Wait"), "{words}");
    assert_eq!((session.tries(), host.reconnects()), (1, 0));

    // The session ended during the try: the second waits for a fresh one, as after a loss.
    let first = FakeSession::slow(vec![failed(500)], Duration::from_millis(100));
    let host = FakeHost::new(first.clone(), Vec::new());
    let second = FakeSession::new(Vec::new());
    let publish = {
        let (host, first, second) = (host.clone(), first.clone(), second.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            first.alive.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(150)).await;
            host.replace(second);
        }
    };
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__read"), publish);
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!((first.tries(), second.tries()), (1, 1));

    // The second try on the session never left (it ended meanwhile): the call still gets its
    // try on a fresh session, as a lost call does.
    let gone = || Err(CallFailure::NotSent(Fault::SessionExpired));
    let first = FakeSession::new(vec![failed(500), gone()]);
    let host = FakeHost::new(first.clone(), Vec::new());
    let second = FakeSession::new(Vec::new());
    let publish = publish_after(&host, &second, Duration::from_millis(200));
    let (result, ()) = tokio::join!(call(&calls, &host, "svc__read"), publish);
    assert_eq!(text(&result.unwrap()), "done");
    assert_eq!((first.tries(), second.tries()), (2, 1));
    assert_eq!(host.reports().len(), 2, "the failure and the answer");

    // Failed, then lost on the retry: the answer tells both as they were.
    let session = FakeSession::new(vec![failed(500), lost()]);
    let host = FakeHost::new(session.clone(), Vec::new());
    let words = text(&call(&calls, &host, "svc__read").await.unwrap());
    assert!(
        words.contains("failed the call with HTTP 500, and the connection was lost during one retry"),
        "{words}"
    );
    assert_eq!(session.tries(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_the_calls_in_flight_and_refuses_new_ones() {
    let session = FakeSession::slow(Vec::new(), Duration::from_secs(5));
    let host = FakeHost::new(session.clone(), Vec::new());
    let calls = Calls::default();
    let started = Instant::now();
    let late = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let drained = calls.drain(Duration::from_secs(60));
        let refused = async {
            tokio::task::yield_now().await;
            call(&calls, &host, "svc__write").await
        };
        let ((), refused) = tokio::join!(drained, refused);
        (Instant::now(), refused)
    };
    let (in_flight, (drained_at, refused)) = tokio::join!(call(&calls, &host, "svc__write"), late);
    assert_eq!(
        text(&in_flight.unwrap()),
        "done",
        "a call in flight is answered"
    );
    assert_eq!(drained_at - started, Duration::from_secs(5));
    let words = text(&refused.unwrap());
    assert!(words.contains("shutting down"), "{words}");
    assert_eq!(session.tries(), 1);
}
