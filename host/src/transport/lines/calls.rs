//! The `tools/call` requests Tether sent a stdio server that await their answer, and the
//! caller's own way to send one ([`CallSender`]).
//!
//! A request sent through rmcp takes its client service loop: a channel to the loop, a task
//! spawned to write it, a pending-request map, and the answer handed back over a oneshot, on
//! top of the reader's own work; about an eighth of what forwarding a call costs. A tool call
//! on stdio is written by its caller instead: the write is made in the caller's task (a write
//! that cannot finish at once goes on in a task of its own, so a line is never cut short), the
//! call is remembered here with a oneshot, and the reader hands the answer straight to it. It
//! never reaches rmcp's loop. Everything else a session sends still goes through rmcp.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, ClientRequest, ErrorData, GetExtensions, JsonRpcMessage, RequestId,
    ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use tokio::sync::oneshot;

use super::LineRole;
use super::raw::RawResult;
use crate::upstream::route::RouteTag;

/// A call's answer: its result, or the error the server answered with.
pub type Answered = Result<ServerResult, ErrorData>;

/// How many calls nobody waits on are remembered (sent through rmcp: its loop waits): one that
/// is never answered is forgotten once this many newer ones went out, and its late answer then
/// takes rmcp's decoder, with the same result. A call whose caller waits is remembered until it
/// is answered or its caller stops waiting, whatever their number.
const CALLS_REMEMBERED: usize = 256;

/// The first id of a call sent by its caller. rmcp numbers its own requests from 0 in the same
/// session: it would take a billion of them to meet these, and a server that reads ids as
/// 32-bit integers still reads these.
const FIRST_DIRECT_ID: i64 = 1 << 30;

pub(super) struct InFlight {
    id: RequestId,
    /// Where the result's bytes may go ([`super::raw`]).
    slot: Option<Arc<RawResult>>,
    /// The caller waiting for the answer, for a call sent by [`CallSender`].
    caller: Option<oneshot::Sender<Answered>>,
}

/// The calls in flight, by id (see the module documentation). Shared by the reader and the
/// callers; each holds the lock for a lookup, never across an await.
#[derive(Default)]
pub struct CallsInFlight {
    calls: VecDeque<InFlight>,
    /// How many of them have a slot.
    slots: usize,
    /// The reader is gone: nothing will be answered any more.
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

    /// Forgets call `id`; what was remembered of it, if it was in flight.
    pub(super) fn remove(&mut self, id: &RequestId) -> Option<InFlight> {
        let at = self.calls.iter().position(|call| call.id == *id)?;
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

    /// Forgets call `id` if it has a slot; what was remembered of it.
    pub(super) fn remove_with_slot(&mut self, id: &RequestId) -> Option<InFlight> {
        let at = (self.calls.iter()).position(|call| call.id == *id && call.slot.is_some())?;
        self.forget(at)
    }
}

/// The reader's side of the calls in flight (a line transport's memory, [`LineRole`]): what the
/// line just decoded owes to a slot or a caller. Dropped with the transport: calls still
/// waiting then fail (the session ended), and no call is taken any more.
#[derive(Default)]
pub struct CallsReader {
    shared: Arc<Mutex<CallsInFlight>>,
    /// The result in the line just decoded that goes to its slot.
    pub(super) kept: Option<super::Kept>,
    /// The caller the message just decoded answers.
    caller: Option<oneshot::Sender<Answered>>,
}

impl CallsReader {
    pub(super) fn lock(&self) -> MutexGuard<'_, CallsInFlight> {
        lock(&self.shared)
    }

    /// Notes that the message being decoded answers `call`.
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

    /// A caller's way to send calls that this reader answers, written by `write`.
    pub(super) fn sender(&self, write: WriteMessage) -> CallSender {
        CallSender {
            calls: self.shared.clone(),
            write,
            next_id: AtomicI64::new(FIRST_DIRECT_ID),
        }
    }
}

impl Drop for CallsReader {
    fn drop(&mut self) {
        let mut calls = self.lock();
        calls.closed = true;
        // Their callers learn the session ended.
        calls.calls.retain(|call| call.caller.is_none());
    }
}

/// Writes one message (the transport's write path).
pub(super) type WriteMessage =
    Arc<dyn Fn(TxJsonRpcMessage<RoleClient>) -> BoxFuture<'static, std::io::Result<()>> + Send + Sync>;

/// Sends tool calls the way the module documentation says, for one session.
pub struct CallSender {
    calls: Arc<Mutex<CallsInFlight>>,
    write: WriteMessage,
    next_id: AtomicI64,
}

impl CallSender {
    /// The id for the next call (see [`FIRST_DIRECT_ID`]).
    pub fn next_id(&self) -> RequestId {
        RequestId::Number(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Writes call `id`; its answer then comes to the [`PendingCall`]. A call that could not be
    /// written (the transport is closed or the write failed) did not leave: its route, if it
    /// has one, gets its arguments back, as for a call rmcp could not write.
    pub async fn send(&self, id: RequestId, call: CallToolRequest) -> std::io::Result<PendingCall> {
        let message = JsonRpcMessage::request(ClientRequest::CallToolRequest(call), id.clone());
        let (caller, answer) = oneshot::channel();
        let pending = {
            let mut calls = lock(&self.calls);
            if calls.closed {
                drop(calls);
                RoleClient::unsent(message);
                return Err(std::io::ErrorKind::NotConnected.into());
            }
            let JsonRpcMessage::Request(request) = &message else {
                unreachable!("made as a request just above")
            };
            calls.remember(InFlight {
                id: id.clone(),
                slot: slot_of(&request.request),
                caller: Some(caller),
            });
            PendingCall {
                id,
                answer: Some(answer),
                calls: self.calls.clone(),
            }
        };
        let mut write = (self.write)(message);
        let written = match futures::poll!(&mut write) {
            Poll::Ready(written) => written,
            // Finished in a task of its own: a line begun is a line ended, whatever the caller
            // does meanwhile.
            Poll::Pending => tokio::spawn(write)
                .await
                .unwrap_or_else(|error| Err(std::io::Error::other(error))),
        };
        written.map(|()| pending)
    }
}

/// A call written, waiting for its answer. Dropped before it came, the call is forgotten.
pub struct PendingCall {
    id: RequestId,
    answer: Option<oneshot::Receiver<Answered>>,
    calls: Arc<Mutex<CallsInFlight>>,
}

impl PendingCall {
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The call's answer; `None` if the session ended first.
    pub async fn answer(mut self) -> Option<Answered> {
        let answer = self.answer.as_mut()?.await.ok();
        self.answer = None;
        answer
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if self.answer.is_some() {
            lock(&self.calls).remove(&self.id);
        }
    }
}

/// The slot a call's result may go to: its route's.
pub(super) fn slot_of(request: &ClientRequest) -> Option<Arc<RawResult>> {
    let RouteTag(route) = request.extensions().get::<RouteTag>()?;
    route.raw.clone()
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
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

    type ClientLines = Lines<RoleClient, tokio::io::ReadHalf<DuplexStream>, tokio::io::WriteHalf<DuplexStream>>;

    /// A line transport to a "server" whose lines the test reads and writes (`buffer` bytes of
    /// pipe between them).
    fn connected(buffer: usize) -> (ClientLines, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(buffer);
        let (read, write) = tokio::io::split(ours);
        (Lines::new(read, write, 1 << 20), theirs)
    }

    fn call(arguments: &str) -> CallToolRequest {
        let arguments: JsonObject = serde_json::from_str(arguments).unwrap();
        CallToolRequest::new(CallToolRequestParams::new("t").with_arguments(arguments))
    }

    async fn next_line(server: &mut BufReader<DuplexStream>) -> serde_json::Value {
        let mut line = String::new();
        server.read_line(&mut line).await.unwrap();
        serde_json::from_str(&line).expect("a whole JSON line")
    }

    #[tokio::test]
    async fn a_call_written_by_its_caller_is_answered_to_it_not_to_the_service_loop() {
        let (mut lines, theirs) = connected(1 << 16);
        let sender = lines.call_sender();
        let mut server = BufReader::new(theirs);
        let (first, second) = (sender.next_id(), sender.next_id());
        assert_eq!(first, RequestId::Number(FIRST_DIRECT_ID));
        assert_eq!(second, RequestId::Number(FIRST_DIRECT_ID + 1));
        let answered = sender.send(first.clone(), call(r#"{"n":1}"#)).await.unwrap();
        let refused = sender.send(second.clone(), call(r#"{"n":2}"#)).await.unwrap();
        for (id, n) in [(&first, 1), (&second, 2)] {
            let line = next_line(&mut server).await;
            assert_eq!(line["method"], "tools/call");
            assert_eq!(serde_json::to_value(id).unwrap(), line["id"]);
            assert_eq!(line["params"]["arguments"]["n"], n);
        }
        let answers = format!(
            concat!(
                r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"no"}}}}"#, "\n",
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"hi"}}]}}}}"#, "\n",
                r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}}"#, "\n",
            ),
            FIRST_DIRECT_ID + 1,
            FIRST_DIRECT_ID
        );
        server.get_mut().write_all(answers.as_bytes()).await.unwrap();
        // Both answers went to their callers: the loop gets the notification after them.
        let Some(JsonRpcMessage::Notification(_)) = lines.receive().await else {
            panic!("the notification, and nothing before it")
        };
        let Some(Ok(ServerResult::CallToolResult(result))) = answered.answer().await else {
            panic!("the call's result")
        };
        assert_eq!(result.content[0].as_text().unwrap().text, "hi");
        let Some(Err(error)) = refused.answer().await else {
            panic!("the server's error")
        };
        assert_eq!(error.message, "no");
        assert_eq!(lines.memory.lock().counts(), (0, 0));
    }

    #[tokio::test]
    async fn when_the_transport_goes_calls_waiting_learn_it_and_new_ones_do_not_leave() {
        let (lines, theirs) = connected(1 << 16);
        let sender = lines.call_sender();
        let waiting = sender.send(sender.next_id(), call("{}")).await.unwrap();
        drop(lines);
        assert!(waiting.answer().await.is_none(), "the session ended");
        let route = Arc::new(CallRoute::default());
        let mut late = call(r#"{"n":3}"#);
        late.extensions.insert(RouteTag(route.clone()));
        assert!(sender.send(sender.next_id(), late).await.is_err());
        let back = route.take_back().expect("handed back").expect("arguments");
        assert_eq!(back["n"], 3);
        // Only the first call was ever written (the pipe closes with its last writer).
        drop(sender);
        let mut server = BufReader::new(theirs);
        let mut rest = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut server, &mut rest).await.unwrap();
        assert_eq!(rest.lines().count(), 1, "{rest}");
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_forgets_its_call_and_its_answer_goes_on() {
        let (mut lines, theirs) = connected(1 << 16);
        let sender = lines.call_sender();
        let id = sender.next_id();
        drop(sender.send(id.clone(), call("{}")).await.unwrap());
        assert_eq!(lines.memory.lock().counts(), (0, 0));
        let mut server = BufReader::new(theirs);
        next_line(&mut server).await;
        let answer = format!(r#"{{"jsonrpc":"2.0","id":{FIRST_DIRECT_ID},"result":{{}}}}"#);
        server.get_mut().write_all(format!("{answer}\n").as_bytes()).await.unwrap();
        let Some(JsonRpcMessage::Response(response)) = lines.receive().await else {
            panic!("the late answer, for rmcp to drop")
        };
        assert_eq!(response.id, id);
    }

    /// A write the pipe cannot take at once goes on by itself: the caller that stops waiting
    /// does not leave half a line for the server.
    #[tokio::test]
    async fn a_line_begun_is_ended_whatever_its_caller_does() {
        let (lines, theirs) = connected(1024);
        let sender = lines.call_sender();
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(64 << 10));
        let mut sending = Box::pin(sender.send(sender.next_id(), call(&big)));
        assert!(futures::poll!(sending.as_mut()).is_pending(), "the pipe is full");
        drop(sending);
        let line = next_line(&mut BufReader::new(theirs)).await;
        assert_eq!(line["params"]["arguments"]["text"].as_str().unwrap().len(), 64 << 10);
        assert_eq!(lines.memory.lock().counts(), (0, 0), "nobody waits for it");
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
