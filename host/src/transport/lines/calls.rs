//! The `tools/call` requests Tether sent a stdio server that await their answer, and the
//! caller's own way to send one ([`CallSender`]).
//!
//! A request sent through rmcp takes its client service loop: a channel to the loop, a task
//! spawned to write it, a pending-request map, and the answer handed back over a oneshot, on
//! top of the reader's own work; about a fifth of what forwarding a call cost. A tool call
//! on stdio is written by its caller instead: the write starts in the caller's task (one that
//! cannot finish at once goes on in a task of its own, so a line is never cut short, and the
//! caller can give up meanwhile), the call is remembered here with a oneshot, and the reader
//! hands the answer straight to it. It never reaches rmcp's loop. Everything else a session
//! sends still goes through rmcp.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::FutureExt;
use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, ClientRequest, ErrorData, JsonRpcMessage,
    RequestId, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::raw::RawResult;
use crate::transport::wire::{FIRST_STRAIGHT_ID, same_id};
use crate::upstream::route;

/// A call's answer: its result, or the error the server answered with.
pub type Answered = Result<ServerResult, ErrorData>;

/// Why a call written by its caller got no answer.
#[derive(Debug)]
pub enum NoAnswer {
    /// Its line could not be written: the call did not leave.
    Unwritten(std::io::Error),
    /// The server's side of the transport ended first.
    Ended,
}

/// How many calls nobody waits on (sent through rmcp, whose loop waits) are remembered: one
/// that is never answered is forgotten once this many newer ones went out, and its late answer
/// then takes rmcp's decoder, with the same result. A call whose caller waits is remembered
/// until it is answered or its caller stops waiting, whatever their number.
const CALLS_REMEMBERED: usize = 256;


pub(super) struct InFlight {
    id: RequestId,
    /// Where the result's bytes may go ([`super::raw`]).
    slot: Option<Arc<RawResult>>,
    /// The caller waiting for the answer, for a call sent by [`CallSender`].
    caller: Option<oneshot::Sender<Answered>>,
}

/// The calls in flight, by id (see the module documentation). Shared by the reader and the
/// callers; each holds the lock for a lookup, never across an await or a parse.
#[derive(Default)]
pub struct CallsInFlight {
    calls: VecDeque<InFlight>,
    /// How many of them have a slot.
    slots: usize,
    /// The reader is done: nothing will be answered any more.
    closed: bool,
}

impl CallsInFlight {
    pub(super) fn insert(&mut self, id: RequestId, slot: Option<Arc<RawResult>>) {
        self.remember(InFlight {
            id,
            slot,
            caller: None,
        });
    }

    fn remember(&mut self, call: InFlight) {
        if self.calls.len() >= CALLS_REMEMBERED
            && let Some(oldest) = self.calls.iter().position(|call| call.caller.is_none())
        {
            self.forget(oldest);
        }
        self.slots += usize::from(call.slot.is_some());
        self.calls.push_back(call);
    }

    /// Forgets the call answer `id` answers; what was remembered of it, if it was in flight.
    pub(super) fn remove(&mut self, id: &RequestId) -> Option<InFlight> {
        let at = self.calls.iter().position(|call| same_id(&call.id, id))?;
        self.forget(at)
    }

    fn forget(&mut self, at: usize) -> Option<InFlight> {
        let call = self.calls.remove(at)?;
        self.slots -= usize::from(call.slot.is_some());
        Some(call)
    }

    /// How many calls are in flight, and how many of them have a slot.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.calls.len(), self.slots)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    pub(super) fn has_slots(&self) -> bool {
        self.slots > 0
    }

    /// Forgets the call answer `id` answers if it has a slot; what was remembered of it.
    pub(super) fn remove_with_slot(&mut self, id: &RequestId) -> Option<InFlight> {
        let at = (self.calls.iter()).position(|call| call.slot.is_some() && same_id(&call.id, id))?;
        self.forget(at)
    }

    /// Nothing will be answered any more: callers waiting learn it, and no call is taken.
    fn close(&mut self) {
        self.closed = true;
        self.calls.retain(|call| call.caller.is_none());
        self.slots = self.calls.iter().filter(|call| call.slot.is_some()).count();
    }
}

/// What the reader and the callers of one transport share.
#[derive(Default)]
struct Shared {
    calls: Mutex<CallsInFlight>,
    next_id: AtomicI64,
}

/// The reader's side of the calls in flight (a line transport's memory, [`super::LineRole`]): what the
/// line just decoded owes to a slot or a caller. Closed when the server's side ends and when it
/// is dropped with the transport: calls still waiting then fail, and no call is taken any more.
pub struct CallsReader {
    shared: Arc<Shared>,
    /// The result in the line just decoded that goes to its slot.
    pub(super) kept: Option<super::Kept>,
    /// The caller the message just decoded answers.
    caller: Option<oneshot::Sender<Answered>>,
}

impl Default for CallsReader {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                calls: Mutex::default(),
                next_id: AtomicI64::new(FIRST_STRAIGHT_ID),
            }),
            kept: None,
            caller: None,
        }
    }
}

impl CallsReader {
    pub(super) fn lock(&self) -> MutexGuard<'_, CallsInFlight> {
        lock(&self.shared.calls)
    }

    /// Notes that the message being decoded answers `call`; its slot.
    pub(super) fn answering(&mut self, call: InFlight) -> Option<Arc<RawResult>> {
        self.caller = call.caller;
        call.slot
    }

    /// Hands `message` to the caller it answers, if one waits for it; else it goes on.
    pub(super) fn hand_over(
        &mut self,
        message: RxJsonRpcMessage<RoleClient>,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        let Some(caller) = self.caller.take() else {
            return Some(message);
        };
        let answer = match message {
            JsonRpcMessage::Response(response) => Ok(response.result),
            JsonRpcMessage::Error(error) => Err(error.error),
            other => return Some(other),
        };
        // A caller that stopped waiting has gone: nothing to tell.
        let _ = caller.send(answer);
        None
    }

    /// The server's side ended (or the transport went).
    pub(super) fn close(&self) {
        self.lock().close();
    }

    /// A caller's way to send calls that this reader answers, written by `write`.
    pub(super) fn sender(&self, write: WriteMessage) -> CallSender {
        CallSender {
            shared: self.shared.clone(),
            write,
        }
    }
}

impl Drop for CallsReader {
    fn drop(&mut self) {
        self.close();
    }
}

/// Writes one message (the transport's write path).
pub(super) type WriteMessage =
    Arc<dyn Fn(TxJsonRpcMessage<RoleClient>) -> BoxFuture<'static, std::io::Result<()>> + Send + Sync>;

/// Sends tool calls the way the module documentation says, for one session.
pub struct CallSender {
    shared: Arc<Shared>,
    write: WriteMessage,
}

impl CallSender {
    /// The id for the next call (see [`FIRST_STRAIGHT_ID`]).
    pub fn next_id(&self) -> RequestId {
        RequestId::Number(self.shared.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Starts writing call `id`; its answer then comes to the [`PendingCall`]. Its route, if it
    /// has one, gets its arguments back once the line is encoded, or at once when the
    /// transport is closed ([`route::hand_back`]).
    pub fn send(&self, id: RequestId, call: CallToolRequest) -> std::io::Result<PendingCall> {
        let message = JsonRpcMessage::request(ClientRequest::CallToolRequest(call), id.clone());
        let (caller, answer) = oneshot::channel();
        let mut pending = {
            let mut calls = lock(&self.shared.calls);
            if calls.closed {
                drop(calls);
                route::hand_back(message);
                return Err(std::io::ErrorKind::NotConnected.into());
            }
            let JsonRpcMessage::Request(request) = &message else {
                unreachable!("made as a request just above")
            };
            calls.remember(InFlight {
                id: id.clone(),
                slot: route::raw_slot(&request.request),
                caller: Some(caller),
            });
            PendingCall {
                id,
                writing: None,
                answer,
                answered: false,
                shared: self.shared.clone(),
            }
        };
        // Written here if the pipe takes it at once (nearly always); else the task it goes on
        // in is spawned before anything else runs, so it has no other waker to lose.
        let mut write = (self.write)(message);
        match write.poll_unpin(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(written) => written?,
            Poll::Pending => pending.writing = Some(tokio::spawn(write)),
        }
        Ok(pending)
    }
}

/// A call on its way, waiting for its answer. Dropped before it came, the call is forgotten
/// (a write under way still ends its line).
pub struct PendingCall {
    id: RequestId,
    /// The write, where it could not finish at once.
    writing: Option<JoinHandle<std::io::Result<()>>>,
    answer: oneshot::Receiver<Answered>,
    /// The answer (or the session's end) came: the reader forgot the call.
    answered: bool,
    shared: Arc<Shared>,
}

impl PendingCall {
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The call's answer, once its write ended.
    pub async fn answer(mut self) -> Result<Answered, NoAnswer> {
        if let Some(writing) = self.writing.as_mut() {
            match writing.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(NoAnswer::Unwritten(error)),
                Err(error) => return Err(NoAnswer::Unwritten(std::io::Error::other(error))),
            }
        }
        let answer = (&mut self.answer).await.map_err(|_| NoAnswer::Ended);
        self.answered = true;
        answer
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if !self.answered {
            lock(&self.shared.calls).remove(&self.id);
        }
    }
}

fn lock(calls: &Mutex<CallsInFlight>) -> MutexGuard<'_, CallsInFlight> {
    calls.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::lines::Lines;
    use crate::upstream::route::CallRoute;
    use rmcp::model::{CallToolRequestParams, JsonObject};
    use rmcp::transport::Transport;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

    type ClientLines =
        Lines<RoleClient, tokio::io::ReadHalf<DuplexStream>, tokio::io::WriteHalf<DuplexStream>>;

    /// A line transport to a "server" whose lines the test reads and writes (`buffer` bytes of
    /// pipe between them).
    fn connected(buffer: usize) -> (ClientLines, BufReader<DuplexStream>) {
        let (ours, theirs) = tokio::io::duplex(buffer);
        let (read, write) = tokio::io::split(ours);
        (Lines::new(read, write, 1 << 20), BufReader::new(theirs))
    }

    fn call(arguments: &str) -> CallToolRequest {
        let arguments: JsonObject = serde_json::from_str(arguments).unwrap();
        CallToolRequest::new(CallToolRequestParams::new("t").with_arguments(arguments))
    }

    /// The next line the server reads, whole (a deadline: a half line would wait for ever).
    async fn next_line(server: &mut BufReader<DuplexStream>) -> serde_json::Value {
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(10), server.read_line(&mut line))
            .await
            .expect("a line within the deadline")
            .unwrap();
        serde_json::from_str(&line).expect("a whole JSON line")
    }

    async fn answer(pending: PendingCall) -> Result<Answered, NoAnswer> {
        tokio::time::timeout(Duration::from_secs(10), pending.answer())
            .await
            .expect("an outcome within the deadline")
    }

    #[tokio::test]
    async fn a_call_written_by_its_caller_is_answered_to_it_not_to_the_service_loop() {
        let (mut lines, mut server) = connected(1 << 16);
        let sender = lines.call_sender();
        let (first, second) = (sender.next_id(), sender.next_id());
        assert_eq!(first, RequestId::Number(FIRST_STRAIGHT_ID));
        assert_eq!(second, RequestId::Number(FIRST_STRAIGHT_ID + 1));
        let answered = sender.send(first.clone(), call(r#"{"n":1}"#)).unwrap();
        let refused = sender.send(second.clone(), call(r#"{"n":2}"#)).unwrap();
        for (id, n) in [(&first, 1), (&second, 2)] {
            let line = next_line(&mut server).await;
            assert_eq!(line["method"], "tools/call");
            assert_eq!(serde_json::to_value(id).unwrap(), line["id"]);
            assert_eq!(line["params"]["arguments"]["n"], n);
        }
        // The second answer echoes its id as a string, as some servers do (rmcp takes it).
        let answers = format!(
            concat!(
                r#"{{"jsonrpc":"2.0","id":"{}","error":{{"code":-32602,"message":"no"}}}}"#,
                "\n",
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"hi"}}]}}}}"#,
                "\n",
                r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}}"#,
                "\n",
            ),
            FIRST_STRAIGHT_ID + 1,
            FIRST_STRAIGHT_ID
        );
        server.get_mut().write_all(answers.as_bytes()).await.unwrap();
        // Both answers went to their callers: the loop gets the notification after them.
        let Some(JsonRpcMessage::Notification(_)) = lines.receive().await else {
            panic!("the notification, and nothing before it")
        };
        let Ok(Ok(ServerResult::CallToolResult(result))) = answer(answered).await else {
            panic!("the call's result")
        };
        assert_eq!(result.content[0].as_text().unwrap().text, "hi");
        let Ok(Err(error)) = answer(refused).await else {
            panic!("the server's error")
        };
        assert_eq!(error.message, "no");
        assert_eq!(lines.memory.lock().counts(), (0, 0));
    }

    #[tokio::test]
    async fn when_the_server_side_ends_calls_waiting_learn_it_and_new_ones_do_not_leave() {
        let (mut lines, server) = connected(1 << 16);
        let sender = lines.call_sender();
        let waiting = sender.send(sender.next_id(), call("{}")).unwrap();
        // The server closes its side: the reader sees the end, the transport is still there.
        let (mut theirs_read, mut theirs_write) = tokio::io::split(server.into_inner());
        theirs_write.shutdown().await.unwrap();
        assert!(lines.receive().await.is_none());
        assert!(matches!(answer(waiting).await, Err(NoAnswer::Ended)));
        let route = Arc::new(CallRoute::default());
        let mut late = call(r#"{"n":3}"#);
        late.extensions.insert(route::RouteTag(route.clone()));
        assert!(sender.send(sender.next_id(), late).is_err());
        let back = route.take_back().expect("handed back").expect("arguments");
        assert_eq!(back["n"], 3);
        // Only the first call was ever written (the pipe closes with its last writer).
        drop((lines, sender));
        let mut rest = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut theirs_read, &mut rest)
            .await
            .unwrap();
        assert_eq!(rest.lines().count(), 1, "{rest}");
    }

    #[tokio::test]
    async fn when_the_transport_goes_calls_waiting_learn_it() {
        let (lines, _server) = connected(1 << 16);
        let sender = lines.call_sender();
        let waiting = sender.send(sender.next_id(), call("{}")).unwrap();
        drop(lines);
        assert!(matches!(answer(waiting).await, Err(NoAnswer::Ended)));
        assert!(sender.send(sender.next_id(), call("{}")).is_err());
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_forgets_its_call_and_its_answer_goes_on() {
        let (mut lines, mut server) = connected(1 << 16);
        let sender = lines.call_sender();
        let id = sender.next_id();
        drop(sender.send(id.clone(), call("{}")).unwrap());
        assert_eq!(lines.memory.lock().counts(), (0, 0));
        next_line(&mut server).await;
        let answer = format!(r#"{{"jsonrpc":"2.0","id":{FIRST_STRAIGHT_ID},"result":{{}}}}"#);
        let answer = format!("{answer}\n");
        server.get_mut().write_all(answer.as_bytes()).await.unwrap();
        let Some(JsonRpcMessage::Response(response)) = lines.receive().await else {
            panic!("the late answer, for rmcp to drop")
        };
        assert_eq!(response.id, id);
    }

    /// A write the pipe cannot take at once goes on by itself: the caller may give up meanwhile,
    /// and the server still gets the whole line.
    #[tokio::test]
    async fn a_line_begun_is_ended_whatever_its_caller_does() {
        let (lines, mut server) = connected(1024);
        let sender = lines.call_sender();
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(64 << 10));
        let pending = sender.send(sender.next_id(), call(&big)).unwrap();
        assert!(pending.writing.is_some(), "the pipe is full: the write goes on");
        drop(pending);
        assert_eq!(lines.memory.lock().counts(), (0, 0), "nobody waits for it");
        let line = next_line(&mut server).await;
        assert_eq!(line["params"]["arguments"]["text"].as_str().unwrap().len(), 64 << 10);
    }

    #[test]
    fn calls_nobody_waits_on_are_forgotten_past_the_bound_those_a_caller_waits_on_never() {
        let mut calls = CallsInFlight::default();
        let (caller, _answer) = oneshot::channel();
        calls.remember(InFlight {
            id: RequestId::Number(-2),
            slot: None,
            caller: Some(caller),
        });
        for id in 0..(CALLS_REMEMBERED as i64 + 10) {
            calls.insert(RequestId::Number(id), None);
        }
        assert_eq!(calls.calls.len(), CALLS_REMEMBERED);
        calls.insert(RequestId::Number(-1), Some(Arc::default()));
        assert_eq!(calls.slots, 1);
        assert!(calls.remove(&RequestId::Number(0)).is_none());
        assert!(calls.remove(&RequestId::Number(CALLS_REMEMBERED as i64 + 9)).is_some());
        for id in 1000..1000 + CALLS_REMEMBERED as i64 {
            calls.insert(RequestId::Number(id), None);
        }
        assert_eq!(calls.slots, 0, "the slot of a call forgotten is forgotten with it");
        assert!(calls.remove(&RequestId::Number(-2)).is_some(), "its caller still waits");
    }
}
