//! A 2026-07-28 client asked something by an older server.
//!
//! Such a client takes no requests from servers: it answers a call's request for input
//! (`InputRequiredResult`) and calls again with the answers and the request state. When a
//! server of 2025-11-25 or older sends a request (sampling, an elicitation, roots) during such a
//! client's `tools/call`, Tether keeps the upstream call running, answers the client with the
//! server's requests as a request for input under a request state of its own, and when the
//! client calls again with the answers and that state, hands each answer to the server's
//! waiting request and goes on with the same call. The call runs once; nothing is replayed.
//! The call's progress and log messages go to the request it runs for: none while it is
//! parked, the request that resumed it after.

use crate::transport::lines::raw::RawResult;
use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, ClientResult, ErrorData, InputRequest, InputRequests, InputRequiredResult,
    InputResponses, ServerRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::calls::CallError;
use crate::upstream::{CallContext, LogSink, ProgressForward};

/// How a call through the gateway ends.
pub(super) type CallOutcome = Result<CallToolResponse, CallError>;

/// How long a parked call waits for its client to call again with the answers.
const PARK_FOR: Duration = Duration::from_secs(600);

/// What the request states Tether issues start with (a server's own pass through untouched).
const STATE_PREFIX: &str = "tether-asked:";

/// Where a call's server questions go, and where the call takes them from. Boxed: the channel
/// allocates its first block of 32 slots up front, on every 2026-07-28 client's call, and a
/// slot is then one pointer wide.
pub(super) type Questions = mpsc::UnboundedSender<Box<Question>>;
pub(super) type Asked = mpsc::UnboundedReceiver<Box<Question>>;

/// A server's request for the client, and where its answer goes.
pub(super) struct Question {
    pub(super) request: ServerRequest,
    pub(super) answer: oneshot::Sender<Result<ClientResult, ErrorData>>,
}

/// Which answer a question takes.
#[derive(Clone, Copy)]
enum Kind {
    Sampling,
    Elicitation,
    Roots,
}

/// The call, on the caller's task until it has to outlive the caller's request.
enum Running {
    Here(Pin<Box<dyn Future<Output = CallOutcome> + Send>>),
    Spawned(JoinHandle<CallOutcome>),
}

impl Drop for Asking {
    /// A call running on its own that nobody drives or parks any more (the request driving it
    /// was dropped without its cancellation) is cancelled at the server, as an expired one is.
    fn drop(&mut self) {
        if let Running::Spawned(task) = &self.running
            && !task.is_finished()
        {
            self.cancel.cancel();
        }
    }
}

/// A call that may ask its client something.
pub(super) struct Asking {
    running: Running,
    questions: Asked,
    /// Questions asked and not answered yet, by the key the client sees.
    waiting: BTreeMap<String, (Kind, InputRequest, Box<Question>)>,
    next_key: u64,
    cancel: CancellationToken,
    tool: String,
    expires: Instant,
    /// Where the upstream call's result may come as the server's bytes: the slot of the request
    /// that started it, which a call resumed by another request must move over.
    pub(super) raw: Option<Arc<RawResult>>,
    /// Where its progress and log messages go, if its first request asked for any.
    following: Option<Arc<Following>>,
}

/// The request a call's progress and log messages go to, which changes as the call is parked
/// and resumed.
pub(super) struct Following {
    to: Mutex<Sinks>,
}

/// A request's progress and log sinks.
#[derive(Default)]
struct Sinks {
    progress: Option<Arc<dyn ProgressForward>>,
    log: Option<LogSink>,
}

impl Following {
    /// Puts a relay between `call` and the progress and log sinks of its request, if it has
    /// any (a call whose first request asked for neither has nothing to move).
    pub(super) fn relay(call: &mut CallContext) -> Option<Arc<Following>> {
        if call.progress.is_none() && call.log.is_none() {
            return None;
        }
        let following = Arc::new(Following {
            to: Mutex::new(Sinks {
                progress: call.progress.clone(),
                log: call.log.clone(),
            }),
        });
        if call.progress.is_some() {
            call.progress = Some(following.clone());
        }
        if call.log.is_some() {
            let relay = following.clone();
            call.log = Some(Arc::new(move |message| {
                let log = relay.lock().log.clone();
                if let Some(log) = log {
                    log(message);
                }
            }));
        }
        Some(following)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sinks> {
        self.to.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on to no request; resolves once what went to the last one is written, so that
    /// its progress comes before its answer.
    async fn detach(&self) {
        let last = std::mem::take(&mut *self.lock());
        if let Some(progress) = last.progress {
            progress.flush().await;
        }
    }

    /// From now on, to `call`'s request.
    fn follow(&self, call: &mut CallContext) {
        *self.lock() = Sinks {
            progress: call.progress.take(),
            log: call.log.take(),
        };
    }
}

impl ProgressForward for Following {
    fn forward(&self, update: rmcp::model::ProgressNotificationParam) {
        let to = self.lock().progress.clone();
        if let Some(to) = to {
            to.forward(update);
        }
    }

    fn flush(&self) -> futures::future::BoxFuture<'static, ()> {
        let to = self.lock().progress.clone();
        match to {
            Some(to) => to.flush(),
            None => Box::pin(std::future::ready(())),
        }
    }
}

/// What one turn of a call ends with.
pub(super) enum Turn {
    Done(CallOutcome),
    /// The client must answer this, then call again.
    Ask(InputRequiredResult),
}

impl Asking {
    /// Starts `call` (the upstream call of `tool`, cancelled through `cancel`), whose client's
    /// questions come on `questions`.
    pub(super) fn start(
        call: impl Future<Output = CallOutcome> + Send + 'static,
        questions: Asked,
        cancel: CancellationToken,
        tool: String,
        (raw, following): (Option<Arc<RawResult>>, Option<Arc<Following>>),
    ) -> Self {
        Self {
            raw,
            following,
            running: Running::Here(Box::pin(call)),
            questions,
            waiting: BTreeMap::new(),
            next_key: 1,
            cancel,
            tool,
            expires: Instant::now() + PARK_FOR,
        }
    }

    /// Hands the client's answers to the questions waiting for them; an answer that does not
    /// parse is the client's error for that question. Unanswered questions are asked again.
    fn answer(&mut self, responses: Option<InputResponses>) {
        for (key, response) in responses.into_iter().flatten() {
            let Some((kind, _, question)) = self.waiting.remove(&key) else {
                continue;
            };
            let parsed = match kind {
                Kind::Sampling => serde_json::from_value(response)
                    .map(|result| ClientResult::CreateMessageResult(Box::new(result))),
                Kind::Elicitation => {
                    serde_json::from_value(response).map(ClientResult::ElicitResult)
                }
                Kind::Roots => serde_json::from_value(response).map(ClientResult::ListRootsResult),
            };
            let _ = question.answer.send(parsed.map_err(|error| {
                ErrorData::invalid_params(
                    format!("the client's answer does not parse: {error}"),
                    None,
                )
            }));
        }
    }

    /// Takes a server's question: a request the client can answer as input, or an error.
    fn take(&mut self, question: Box<Question>) {
        let (kind, input) = match &question.request {
            ServerRequest::CreateMessageRequest(request) => {
                (Kind::Sampling, InputRequest::CreateMessage(request.clone()))
            }
            ServerRequest::ElicitRequest(request) => (
                Kind::Elicitation,
                InputRequest::Elicitation(request.clone()),
            ),
            #[allow(deprecated)] // roots: deprecated by SEP-2577, still asked for
            ServerRequest::ListRootsRequest(request) => {
                (Kind::Roots, InputRequest::ListRoots(request.clone()))
            }
            _ => {
                let _ = question.answer.send(Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    "a client of protocol 2026-07-28 answers sampling, elicitation and roots only",
                    None,
                )));
                return;
            }
        };
        let key = format!("tether-{}", self.next_key);
        self.next_key += 1;
        self.waiting.insert(key, (kind, input, question));
    }

    /// The request for input the client gets: every question still waiting.
    fn request_for_input(&self, state: String) -> InputRequiredResult {
        let requests: InputRequests = self
            .waiting
            .iter()
            .map(|(key, (_, input, _))| (key.clone(), input.clone()))
            .collect();
        InputRequiredResult::new(Some(requests), Some(state))
    }
}

/// Calls waiting for their clients to answer, by the request state handed out.
#[derive(Default)]
pub(super) struct Parking {
    parked: Mutex<HashMap<String, Asking>>,
}

impl Parking {
    /// Whether a client's request state is one Tether handed out.
    pub(super) fn issued(state: &str) -> bool {
        state.starts_with(STATE_PREFIX)
    }

    /// The parked call a client calls again with answers for, under `state`, for `tool`.
    /// Its progress and log messages go to `call`'s request from now on.
    pub(super) fn resume(
        &self,
        state: &str,
        tool: &str,
        responses: Option<InputResponses>,
        call: &mut CallContext,
    ) -> Result<Asking, McpError> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut parked);
        let Some(mut asking) = parked.remove(state) else {
            return Err(McpError::invalid_params(
                "requestState names no call waiting for input (it was answered already, or it waited too long); call the tool again",
                None,
            ));
        };
        if asking.tool != tool {
            let message = format!(
                "requestState belongs to a call of {:?}, not {tool:?}",
                asking.tool
            );
            parked.insert(state.to_string(), asking);
            return Err(McpError::invalid_params(message, None));
        }
        drop(parked);
        if let Some(following) = &asking.following {
            following.follow(call);
        }
        asking.answer(responses);
        Ok(asking)
    }

    /// Runs the call until it ends, or until the server asks the client something: then the
    /// call goes on on its own, waiting here for the client's answers, and the client gets
    /// the request for input. A client that cancels cancels the call.
    pub(super) async fn drive(&self, mut asking: Asking, client_gone: &CancellationToken) -> Turn {
        // Questions the client left unanswered are asked again.
        if !asking.waiting.is_empty() {
            return Turn::Ask(self.park_detached(asking).await);
        }
        let mut cancelled = false;
        loop {
            // Polled in place, not boxed each turn.
            let running = &mut asking.running;
            let call = std::future::poll_fn(|cx| match running {
                Running::Here(call) => call.as_mut().poll(cx),
                Running::Spawned(task) => Pin::new(task).poll(cx).map(|joined| {
                    joined.unwrap_or_else(|error| {
                        Err(CallError::Interrupted(format!("its task ended: {error}")))
                    })
                }),
            });
            tokio::select! {
                outcome = call => return Turn::Done(outcome),
                Some(question) = asking.questions.recv() => {
                    asking.take(question);
                    while let Ok(more) = asking.questions.try_recv() {
                        asking.take(more);
                    }
                    if asking.waiting.is_empty() {
                        continue;
                    }
                    return Turn::Ask(self.park_detached(asking).await);
                }
                () = client_gone.cancelled(), if !cancelled => {
                    cancelled = true;
                    asking.cancel.cancel();
                }
            }
        }
    }

    /// [`Parking::park`], once the progress that went to the request being answered is out.
    async fn park_detached(&self, asking: Asking) -> InputRequiredResult {
        if let Some(following) = &asking.following {
            following.detach().await;
        }
        self.park(asking)
    }

    /// Keeps the call running on its own under a fresh request state, and says what to ask.
    fn park(&self, mut asking: Asking) -> InputRequiredResult {
        if let Running::Here(call) = std::mem::replace(
            &mut asking.running,
            Running::Here(Box::pin(std::future::pending())),
        ) {
            asking.running = Running::Spawned(tokio::spawn(call));
        }
        let mut token = [0u8; 16];
        let _ = getrandom::fill(&mut token);
        let state = format!("{STATE_PREFIX}{}", hex::encode(token));
        asking.expires = Instant::now() + PARK_FOR;
        let input = asking.request_for_input(state.clone());
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut parked);
        parked.insert(state, asking);
        input
    }

    /// Gives up the calls whose clients never came back: cancelled, so the server hears of it.
    fn expire(&self, parked: &mut HashMap<String, Asking>) {
        let now = Instant::now();
        parked.retain(|_, asking| {
            let keep = asking.expires > now;
            if !keep {
                asking.cancel.cancel();
            }
            keep
        });
    }
}
