//! A request's answer that a server streamed (SSE), taken as if it had come as JSON when it is
//! the stream's first message.
//!
//! rmcp's client gives every SSE answer a task of its own, a reconnecting reader and a channel
//! back to its loop, and reads each message by trying one type after another. Most answers to
//! a tool call are a stream of one message: the answer. Reading the stream up to its first
//! message before handing it to rmcp lets that answer go to rmcp as a JSON answer does, a tool
//! call's result read in one typed pass; anything after it is dropped, as rmcp drops it.
//! Anything else first (a progress notification, a question for the client, a control event,
//! a message for another request, a stream that breaks or ends) and rmcp gets the whole stream
//! as it came, the events already read first: its reconnection, ordering and routing stay in
//! charge of those.
//!
//! A tool call's first message whose result the agent gets unchanged goes to the call's slot as
//! the server wrote it, the event's data moved there (`lines/raw.rs`).
//!
//! What else changes: rmcp counts the POST against its cap on concurrent requests until that
//! first message (`connect` raises the cap), and its ordering barriers (`server/discover`, a
//! request naming another protocol version) wait for it too. A call cancelled meanwhile closes
//! its connection before a 2025-11-25 server gets `notifications/cancelled`, as a call to a
//! server that answers with JSON always has (for a 2026-07-28 server, the closed connection is
//! the cancellation).

use std::sync::Arc;

use futures::{FutureExt, StreamExt, stream::BoxStream};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{SseError, StreamableHttpPostResponse};
use sse_stream::Sse;

use crate::transport::wire::same_id;
use crate::transport::limit;
use crate::transport::lines::raw::{self, RawResult};
use crate::transport::wire;

type Events = BoxStream<'static, Result<Sse, SseError>>;

/// How long the rest of a stream is read after its answer (what rmcp's client allows), so the
/// server sees its stream read to its end rather than the connection cut.
const DRAIN: std::time::Duration = std::time::Duration::from_millis(50);

/// Events with no data (or blank data) read before the stream goes to rmcp anyway: a server
/// may send such events without end, and what is read is kept.
const MAX_BEFORE_ANSWER: usize = 4;

/// Whether the answer to `message` is read up to its first message: any request's but
/// `initialize`'s, whose stream rmcp reads itself in its handshake (nothing to gain there).
pub(super) fn reads_first_message(message: &ClientJsonRpcMessage) -> bool {
    matches!(message, ClientJsonRpcMessage::Request(request)
        if !matches!(request.request, ClientRequest::InitializeRequest(_)))
}

/// `events`, the SSE answer to request `id` (`call`: a `tools/call`), as a JSON answer if its
/// first message is that request's answer; else the stream as it came.
pub(super) async fn first_answer(
    mut events: Events,
    session: Option<String>,
    id: &RequestId,
    call: bool,
    raw: Option<Arc<RawResult>>,
) -> StreamableHttpPostResponse {
    let mut read = Vec::new();
    let rest_follows = loop {
        let Some(mut event) = events.next().await else {
            break false;
        };
        let message = match &event {
            // What the size filter left of an event it cut off (`limit::spoiled`) is no
            // message: the "too large" answer that replaces it follows.
            Ok(sse) if matches!(sse.event.as_deref(), None | Some("" | "message")) => sse
                .data
                .as_deref()
                .filter(|data| !data.trim().is_empty() && !limit::spoiled(data)),
            // A control event or a broken stream: rmcp's reader acts on it.
            _ => {
                let broken = event.is_err();
                read.push(event);
                break !broken;
            }
        };
        if message.is_none() {
            // A priming event (an id and a retry interval, no message), or a spoiled one.
            read.push(event);
            match read.len() < MAX_BEFORE_ANSWER {
                true => continue,
                false => break true,
            }
        }
        // A call's result that passes unchanged goes to its slot, the event's data moved there.
        if let (Some(slot), Ok(sse)) = (&raw, &mut event)
            && let Some(data) = sse.data.take()
        {
            match raw::answer_text_into(data, |answered| same_id(id, answered), slot) {
                Ok(answer) => {
                    drain(events);
                    return StreamableHttpPostResponse::Json(answer, session);
                }
                Err(unread) => sse.data = Some(unread),
            }
        }
        if let Ok(Sse {
            data: Some(data), ..
        }) = &event
            && let Some(answer) = answer_to(data, id, call)
        {
            drain(events);
            return StreamableHttpPostResponse::Json(answer, session);
        }
        read.push(event);
        break true;
    };
    let read = futures::stream::iter(read);
    let events = match rest_follows {
        true => read.chain(events).boxed(),
        // Not polled again once it ended or broke.
        false => read.boxed(),
    };
    StreamableHttpPostResponse::Sse(events, session)
}

/// The message in `data` if it is the answer to request `id`.
pub(super) fn answer_to(data: &str, id: &RequestId, call: bool) -> Option<ServerJsonRpcMessage> {
    // Only a call's answer may be read as a call result: another request's could read as one.
    let message = match call {
        true => wire::read_answer_text_to_call(data).ok()?,
        false => serde_json::from_str(data).ok()?,
    };
    wire::answered_id(&message)
        .is_some_and(|answered| same_id(id, answered))
        .then_some(message)
}

/// Reads what follows an answer: nothing when the stream has already ended or broken, else in
/// a task of its own, for at most [`DRAIN`], up to its end or an error. Anything after the
/// answer is dropped, as rmcp drops it.
pub(super) fn drain(mut events: Events) {
    if let Some(None | Some(Err(_))) = events.next().now_or_never() {
        return;
    }
    tokio::spawn(async move {
        let rest = async { while let Some(Ok(_)) = events.next().await {} };
        let _ = tokio::time::timeout(DRAIN, rest).await;
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use rmcp::model::ServerResult;

    use super::*;

    fn event(id: &str, data: &str) -> Result<Sse, SseError> {
        Ok(Sse {
            event: None,
            data: Some(data.to_string()),
            id: Some(id.into()),
            retry: None,
        })
    }

    #[tokio::test]
    async fn an_answer_cut_off_by_the_size_filter_is_answered_by_its_replacement() {
        // What the filter hands on for an oversized answer of which the start had passed.
        let cut = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"";
        let chunks = [
            bytes::Bytes::from(format!("id: 1\n{cut}{}", "x".repeat(200))),
            bytes::Bytes::from("x".repeat(1000)),
        ];
        let source = futures::stream::iter(chunks.map(Ok::<_, std::io::Error>));
        let events = crate::transport::event_stream::events(limit::BoundedEvents::new(source, 400));
        let answer = json(first(events.chain(futures::stream::pending()).boxed(), true).await);
        let ServerJsonRpcMessage::Error(error) = answer else {
            panic!("expected the too-large error, got {answer:?}");
        };
        assert_eq!(error.error.code.0, limit::TOO_LARGE);
    }

    fn priming(id: &str) -> Result<Sse, SseError> {
        Ok(Sse {
            event: None,
            data: Some(String::new()),
            id: Some(id.into()),
            retry: Some(3000),
        })
    }

    const ANSWER: &str =
        r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}"#;
    const PROGRESS: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}"#;

    /// `events`, then the end; polled again after its end or an error, it fails the test (rmcp's
    /// reader never polls a stream again once it ended or broke).
    fn ending(events: Vec<Result<Sse, SseError>>) -> Events {
        let mut events = events.into_iter();
        let mut over = false;
        futures::stream::poll_fn(move |_| {
            assert!(!over, "a stream polled after its end or an error");
            let next = events.next();
            over = next.as_ref().is_none_or(Result::is_err);
            std::task::Poll::Ready(next)
        })
        .boxed()
    }

    /// `events`, then nothing more ever (a server that keeps its stream open).
    fn open(events: Vec<Result<Sse, SseError>>) -> Events {
        futures::stream::iter(events)
            .chain(futures::stream::pending())
            .boxed()
    }

    async fn first(events: Events, call: bool) -> StreamableHttpPostResponse {
        let answer = first_answer(events, Some("s".into()), &RequestId::Number(7), call, None);
        tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("an answer without waiting for the stream to end")
    }

    #[tokio::test]
    async fn a_calls_result_that_passes_unchanged_goes_to_its_slot_as_the_event_carried_it() {
        let slot = Arc::new(RawResult::default());
        let events = open(vec![priming("0"), event("1", ANSWER)]);
        let id = RequestId::Number(7);
        let answer = first_answer(events, Some("s".into()), &id, true, Some(slot.clone())).await;
        let ServerJsonRpcMessage::Response(response) = json(answer) else {
            panic!("a response");
        };
        assert_eq!(response.id, id);
        let ServerResult::CallToolResult(result) = response.result else {
            panic!("a call's result");
        };
        assert!(raw::is_placeholder(&result));
        let bytes = slot.take().expect("the result's bytes");
        assert_eq!(bytes.as_slice(), br#"{"content":[{"type":"text","text":"hi"}]}"#);
        // An error result is the policy's to read: the typed way, the slot left empty.
        let error = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}"#;
        let answer = first_answer(open(vec![event("1", error)]), Some("s".into()), &id, true, Some(slot.clone()));
        let ServerJsonRpcMessage::Response(response) = json(answer.await) else {
            panic!("a response");
        };
        let ServerResult::CallToolResult(result) = response.result else {
            panic!("a call's result");
        };
        assert_eq!(result.is_error, Some(true));
        assert!(!slot.is_filled());
    }

    /// The ids of the events `answer` hands to rmcp, reading `count` of them.
    async fn ids_of(answer: StreamableHttpPostResponse, count: usize) -> Vec<Option<String>> {
        let StreamableHttpPostResponse::Sse(events, session) = answer else {
            panic!("expected the stream, got {answer:?}");
        };
        assert_eq!(session.as_deref(), Some("s"));
        let read = events.take(count).map(|event| event.ok().and_then(|sse| sse.id));
        tokio::time::timeout(Duration::from_secs(5), read.collect())
            .await
            .expect("the events read first, then the stream")
    }

    fn json(answer: StreamableHttpPostResponse) -> ServerJsonRpcMessage {
        match answer {
            StreamableHttpPostResponse::Json(message, session) => {
                assert_eq!(session.as_deref(), Some("s"));
                message
            }
            other => panic!("expected a JSON answer, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stream_whose_first_message_is_the_answer_becomes_a_json_answer_at_once() {
        let typed = json(first(open(vec![priming("0"), event("1", ANSWER)]), true).await);
        let generic = json(first(open(vec![priming("0"), event("1", ANSWER)]), false).await);
        // The typed pass reads what rmcp's decoder reads.
        assert_eq!(
            serde_json::to_value(&typed).unwrap(),
            serde_json::to_value(&generic).unwrap()
        );
        let ServerJsonRpcMessage::Response(response) = typed else {
            panic!("expected a response");
        };
        assert_eq!(response.id, RequestId::Number(7));
        let ServerResult::CallToolResult(result) = response.result else {
            panic!("expected a call's result");
        };
        assert_eq!(result.content.len(), 1);
        // An error answering the request, echoing its numeric id as a string.
        let error = r#"{"jsonrpc":"2.0","id":"7","error":{"code":-32602,"message":"no"}}"#;
        let answer = json(first(ending(vec![event("1", error)]), true).await);
        assert!(matches!(answer, ServerJsonRpcMessage::Error(_)));
    }

    #[tokio::test]
    async fn anything_before_the_answer_leaves_the_stream_to_rmcp_whole_and_in_order() {
        let events = ending(vec![
            priming("0"),
            event("1", PROGRESS),
            event("2", ANSWER),
        ]);
        let ids = ids_of(first(events, true).await, 3).await;
        assert_eq!(ids, [Some("0".into()), Some("1".into()), Some("2".into())]);
        // The answer to another request.
        let other = ANSWER.replace(r#""id":7"#, r#""id":8"#);
        let events = ending(vec![event("1", &other), event("2", ANSWER)]);
        assert_eq!(
            ids_of(first(events, true).await, 2).await,
            [Some("1".into()), Some("2".into())]
        );
        // A control event.
        let control = Ok(Sse {
            event: Some("endpoint".into()),
            data: Some("/x".into()),
            id: Some("1".into()),
            retry: None,
        });
        let events = ending(vec![control, event("2", ANSWER)]);
        assert_eq!(
            ids_of(first(events, true).await, 2).await,
            [Some("1".into()), Some("2".into())]
        );
    }

    /// `events`, counting in `read` how many were taken from it.
    fn counted(events: Vec<Result<Sse, SseError>>, read: &Arc<AtomicUsize>) -> Events {
        let read = read.clone();
        futures::stream::iter(events)
            .inspect(move |_| {
                read.fetch_add(1, Ordering::SeqCst);
            })
            .boxed()
    }

    #[tokio::test]
    async fn a_stream_of_events_without_messages_goes_to_rmcp_after_a_few() {
        let mut events: Vec<_> = (0..MAX_BEFORE_ANSWER * 3)
            .map(|n| priming(&n.to_string()))
            .collect();
        events.push(event("answer", ANSWER));
        let read = Arc::new(AtomicUsize::new(0));
        let answer = first(counted(events, &read), true).await;
        assert_eq!(read.load(Ordering::SeqCst), MAX_BEFORE_ANSWER);
        let ids = ids_of(answer, MAX_BEFORE_ANSWER * 3 + 1).await;
        let mut expected: Vec<_> = (0..MAX_BEFORE_ANSWER * 3)
            .map(|n| Some(n.to_string()))
            .collect();
        expected.push(Some("answer".into()));
        assert_eq!(ids, expected);
    }

    #[tokio::test]
    async fn what_follows_an_answer_is_read_to_its_end_and_dropped() {
        // Ended already: nothing more is asked of the stream.
        let answer = first(ending(vec![event("1", ANSWER)]), true).await;
        json(answer);
        // More to come, later: read by the drain, in its own task, not handed to rmcp.
        let read = Arc::new(AtomicUsize::new(0));
        let later = futures::stream::once(tokio::task::yield_now()).filter_map(|()| async { None });
        let events = futures::stream::iter(vec![event("1", ANSWER)])
            .chain(later)
            .chain(counted(vec![event("2", PROGRESS)], &read));
        json(first(events.boxed(), true).await);
        assert_eq!(read.load(Ordering::SeqCst), 0, "not read before the answer went");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while read.load(Ordering::SeqCst) < 1 {
            assert!(tokio::time::Instant::now() < deadline, "the rest was never read");
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn every_request_but_initialize_has_its_first_message_read() {
        let request = |request: ClientRequest| {
            ClientJsonRpcMessage::Request(rmcp::model::JsonRpcRequest::new(
                RequestId::Number(1),
                request,
            ))
        };
        let call = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
            rmcp::model::CallToolRequestParams::new("echo"),
        ));
        assert!(reads_first_message(&request(call)));
        let ping = ClientRequest::PingRequest(Default::default());
        assert!(reads_first_message(&request(ping)));
        let initialize = ClientRequest::InitializeRequest(rmcp::model::InitializeRequest::new(
            Default::default(),
        ));
        assert!(!reads_first_message(&request(initialize)));
        let initialized = ClientJsonRpcMessage::notification(
            rmcp::model::ClientNotification::InitializedNotification(Default::default()),
        );
        assert!(!reads_first_message(&initialized));
    }

    #[tokio::test]
    async fn a_stream_that_ends_or_breaks_before_its_answer_goes_to_rmcp_as_it_came() {
        let ids = ids_of(first(ending(vec![priming("0")]), true).await, 2).await;
        assert_eq!(ids, [Some("0".into())]);
        for events in [
            vec![priming("0"), Err(SseError::InvalidLine)],
            vec![Err(SseError::InvalidLine)],
        ] {
            let count = events.len();
            let answer = first(ending(events), true).await;
            let StreamableHttpPostResponse::Sse(events, _) = answer else {
                panic!("expected the stream");
            };
            // Read to its end: nothing is asked of the broken stream after its error.
            let events: Vec<_> = events.collect().await;
            assert_eq!(events.len(), count);
            assert!(events.last().is_some_and(Result::is_err));
        }
    }

    #[tokio::test]
    async fn a_result_nested_deeper_than_serde_json_reads_is_not_taken_as_an_answer() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[],"structuredContent":{}1{}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let ids = ids_of(first(ending(vec![event("1", &deep)]), true).await, 1).await;
        assert_eq!(ids, [Some("1".into())]);
    }
}
