//! A tool call's result reaching an agent on Streamable HTTP as its server sent it: the HTTP
//! agent's side of `transport/lines/raw.rs` (`direct.rs` is the stdio agent's).
//!
//! rmcp's HTTP service writes every answer itself, so Tether cannot write the bytes in its
//! stead. Instead each POST carries a slot ([`Posted`]); when a result went to it, the call's
//! handler answers with a stand-in ([`stand_in`]) and the POST's response is watched for it
//! ([`Watching::watch`]): the one event that carries the stand-in is written again with the
//! result's bytes in its place. Only the POST's own response is watched. An agent whose POST's
//! connection closed while its call ran may pick the stream up again (a GET with
//! `Last-Event-ID`), where rmcp sends the answer: a call answered once its POST's response is
//! gone gets its result decoded (the typed way). One gap is left: an agent that picks its stream
//! up between the handler's answer and that answer's event gets the stand-in, an error saying
//! the result could not be delivered, never an empty success.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header, request::Parts};
use axum::response::Response;
use futures::StreamExt;
use memchr::memmem;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Extensions, ResultType};

use crate::transport::lines::raw::{self, RawResult, is_placeholder};

/// What the stand-in says, should it reach an agent: one that picked its stream up again (a GET
/// with `Last-Event-ID`) just as its call was answered.
const PASSED_ON: &str = "The tool answered, but Tether could not deliver its result on this \
stream and keeps no copy. Check the tool's effect before calling it again.";

/// The stand-in, for an agent of either generation (with `resultType` for a 2026-07-28 one).
pub(in crate::gateway) fn stand_in_result(complete: bool) -> CallToolResult {
    let mut passed = CallToolResult::error(vec![ContentBlock::text(PASSED_ON)]);
    passed.result_type = complete.then_some(ResultType::COMPLETE);
    passed
}

/// The stand-in as rmcp writes it in an answer (`serde_json`, compact), for either generation
/// (`true`: a 2026-07-28 agent's): found by its bytes, without parsing the event.
static WRITTEN: LazyLock<[(memmem::Finder<'static>, bool); 2]> = LazyLock::new(|| {
    [false, true].map(|complete| {
        let written = serde_json::to_vec(&stand_in_result(complete)).unwrap_or_default();
        (memmem::Finder::new(&written).into_owned(), complete)
    })
});

/// A POST's slot for its tool call's result, and whether the POST's response is still there
/// to carry the bytes.
pub(in crate::gateway) struct Posted {
    slot: Arc<RawResult>,
    watched: AtomicBool,
}

impl Posted {
    /// Gives a POST the slot its tool call's result may go to (in its extensions, which rmcp
    /// hands the handler as the request's HTTP parts); the POST is watched until what is
    /// returned is dropped (its response, once [`Watching::watch`] has it).
    pub(in crate::gateway) fn give(request: &mut Request) -> Option<Watching> {
        if request.method() != Method::POST {
            return None;
        }
        let posted = Arc::new(Posted {
            slot: Arc::default(),
            watched: AtomicBool::new(true),
        });
        request.extensions_mut().insert(posted.clone());
        Some(Watching(posted))
    }
}

/// A POST whose response can still carry its result's bytes; dropped, it can no longer.
pub(in crate::gateway) struct Watching(Arc<Posted>);

impl Watching {
    /// `response`, with the event (or JSON body) that carries the stand-in written again
    /// around the result's bytes. Only an event stream and a JSON answer can carry one: any
    /// other response, and this one once dropped, leaves the result to be decoded.
    pub(in crate::gateway) fn watch(self, response: Response) -> Response {
        let media = response.headers().get(header::CONTENT_TYPE);
        let media = media.map(|value| value.as_bytes()).unwrap_or_default();
        let json = media.starts_with(b"application/json");
        if response.status() != StatusCode::OK || !(json || media.starts_with(b"text/event-stream"))
        {
            return response;
        }
        let (parts, body) = response.into_parts();
        let body = body.into_data_stream().flat_map(move |frame| {
            let pieces = match &frame {
                Ok(event) => replace(event, json, &self.0.slot),
                Err(_) => None,
            };
            match pieces {
                Some(pieces) => futures::stream::iter(pieces.map(Ok)).left_stream(),
                None => futures::stream::once(std::future::ready(frame)).right_stream(),
            }
        });
        Response::from_parts(parts, Body::from_stream(body))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.watched.store(false, Ordering::Release);
    }
}

/// The slot of the request whose extensions are `extensions`: one a stdio agent's call carries
/// (`direct.rs`), or the one its POST carries ([`Posted::give`]).
pub(in crate::gateway) fn slot_in(extensions: &Extensions) -> Option<&Arc<RawResult>> {
    extensions
        .get::<Arc<RawResult>>()
        .or_else(|| Some(&posted(extensions)?.slot))
}

/// The POST whose request has `extensions` (rmcp hands the handler its HTTP parts), for
/// [`stand_in`].
pub(in crate::gateway) fn posted(extensions: &Extensions) -> Option<&Arc<Posted>> {
    extensions.get::<Parts>()?.extensions.get::<Arc<Posted>>()
}

/// An HTTP agent's answer: a placeholder whose result waits in its POST's slot becomes the
/// stand-in the POST's response is watched for, or, once that response is gone, the result
/// decoded.
pub(in crate::gateway) fn stand_in(
    mut response: Result<CallToolResponse, rmcp::ErrorData>,
    posted: Option<&Posted>,
) -> Result<CallToolResponse, rmcp::ErrorData> {
    if let (Some(posted), Ok(CallToolResponse::Complete(result))) = (posted, &mut response)
        && is_placeholder(result)
        && posted.slot.is_filled()
    {
        let complete = result.result_type.is_some();
        if posted.watched.load(Ordering::Acquire) {
            *result = stand_in_result(complete);
        } else if let Some(bytes) = posted.slot.take() {
            *result = raw::typed(&bytes).unwrap_or_else(|| {
                CallToolResult::error(vec![ContentBlock::text(
                    "The tool answered with a result Tether could not read.",
                )])
            });
            result.result_type = complete.then_some(ResultType::COMPLETE);
        }
    }
    response
}

/// `frame` (events of a POST's response, or its JSON body: `json`) with the answer that
/// carries the stand-in written again around the result in `slot`, in three pieces (the result's
/// bytes are not copied); `None` if it carries none.
fn replace(frame: &[u8], json: bool, slot: &RawResult) -> Option<[Bytes; 3]> {
    // The slot is filled as the answer arrives: the events before it are let through here.
    if !slot.is_filled() {
        return None;
    }
    let (at, len, complete) = WRITTEN.iter().find_map(|(finder, complete)| {
        Some((finder.find(frame)?, finder.needle().len(), *complete))
    })?;
    // The answer: `{"jsonrpc":"2.0","id":…,"result":STAND-IN}`, the whole JSON body or an
    // event's `data` line (rmcp writes it whole on one line). The id is kept as rmcp wrote it.
    let end = at + len;
    let line_start = match json {
        true => 0,
        false => memchr::memrchr(b'\n', &frame[..at]).map_or(0, |newline| newline + 1),
    };
    let (prefix, after): (&[u8], &[u8]) = match json {
        true => (b"{\"jsonrpc\":\"2.0\",\"id\":", b"}"),
        false => (b"data: {\"jsonrpc\":\"2.0\",\"id\":", b"}\n"),
    };
    let before = &frame[line_start..at];
    let whole = before.starts_with(prefix)
        && before.ends_with(b",\"result\":")
        && frame[end..].starts_with(after)
        && (!json || end + after.len() == frame.len());
    if !whole {
        return None;
    }
    let bytes = slot.take()?;
    let mut opening = Vec::with_capacity(at + 32);
    opening.extend_from_slice(&frame[..at]);
    let mut skipped = 0;
    if complete {
        // The result has members (it has `content`): the discriminator goes first.
        opening.extend_from_slice(b"{\"resultType\":\"complete\",");
        skipped = 1;
    }
    Some([
        Bytes::from(opening),
        bytes.into_bytes().slice(skipped..),
        Bytes::copy_from_slice(&frame[end..]),
    ])
}

#[cfg(test)]
mod tests {
    use rmcp::model::{JsonRpcMessage, RequestId, ServerJsonRpcMessage, ServerResult};

    use super::*;
    use crate::transport::lines::raw::RawBytes;

    const RESULT: &str = r#"{"content":[{"type":"text","text":"caf\u00e9 \/"}],"x":1.50}"#;

    fn filled() -> RawResult {
        let slot = RawResult::default();
        let line = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{RESULT}}}"#).into_bytes();
        let at = line.len() - RESULT.len() - 1;
        slot.fill(RawBytes::new(line, at..at + RESULT.len(), false).unwrap());
        slot
    }

    /// A POST with a result in its slot, and what watches its response.
    fn posted() -> (Arc<Posted>, Watching) {
        let mut request = Request::post("/mcp").body(Body::empty()).unwrap();
        let watching = Posted::give(&mut request).expect("a POST's slot");
        let posted = request.extensions().get::<Arc<Posted>>().unwrap().clone();
        posted.slot.fill(filled().take().unwrap());
        (posted, watching)
    }

    /// What the handler answers for a placeholder when `posted` has the bytes.
    fn answered(posted: &Posted, complete: bool) -> CallToolResult {
        let mut placeholder = raw::placeholder();
        placeholder.result_type = complete.then_some(ResultType::COMPLETE);
        let response = stand_in(Ok(CallToolResponse::Complete(placeholder)), Some(posted));
        let Ok(CallToolResponse::Complete(result)) = response else {
            panic!("a result");
        };
        result
    }

    /// The event rmcp writes for the stand-in answering `id` (a 2026-07-28 agent's: `complete`).
    fn event(id: RequestId, complete: bool) -> Vec<u8> {
        let (posted, _watching) = posted();
        let result = answered(&posted, complete);
        assert_eq!(result.is_error, Some(true));
        let message: ServerJsonRpcMessage =
            JsonRpcMessage::response(ServerResult::CallToolResult(result), id);
        let data = serde_json::to_string(&message).unwrap();
        format!("data: {data}\nid: 0/1\n\n").into_bytes()
    }

    #[tokio::test]
    async fn a_watched_posts_response_carries_the_bytes_and_an_unwatched_ones_result_is_decoded() {
        let (posted, watching) = posted();
        let stand_in = answered(&posted, false);
        let message: ServerJsonRpcMessage =
            JsonRpcMessage::response(ServerResult::CallToolResult(stand_in), RequestId::Number(3));
        let event = format!("data: {}\n\n", serde_json::to_string(&message).unwrap());
        let response = Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from(format!("data: \nretry: 3000\n\n{event}")))
            .unwrap();
        let body = watching.watch(response).into_body();
        assert!(
            posted.watched.load(Ordering::Acquire),
            "watched while its body is there"
        );
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        assert!(
            !posted.watched.load(Ordering::Acquire),
            "unwatched once it is gone"
        );
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            format!(
                "data: \nretry: 3000\n\ndata: {{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{RESULT}}}\n\n"
            )
        );
        // Its response gone (the connection closed while the call ran), a POST's result is
        // answered decoded, for rmcp to send wherever the agent picks its stream up.
        let (posted, watching) = self::posted();
        drop(watching);
        let result = answered(&posted, true);
        assert_eq!(result.is_error, None);
        assert_eq!(result.result_type, Some(ResultType::COMPLETE));
        assert_eq!(result.content[0].as_text().unwrap().text, "café /");
        assert!(!posted.slot.is_filled());
        // Other responses are not watched: a 202, plain text, each as it came.
        let (posted, watching) = self::posted();
        let accepted = Response::builder().status(StatusCode::ACCEPTED);
        let accepted = watching.watch(accepted.body(Body::empty()).unwrap());
        assert_eq!(accepted.status(), StatusCode::ACCEPTED);
        assert!(!posted.watched.load(Ordering::Acquire), "unwatched at once");
        let (posted, watching) = self::posted();
        let text = Response::builder().header(header::CONTENT_TYPE, "text/plain");
        let text = watching.watch(text.body(Body::from(event.clone())).unwrap());
        assert!(!posted.watched.load(Ordering::Acquire));
        let text = axum::body::to_bytes(text.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&text[..], event.as_bytes());
        assert!(posted.slot.is_filled());
    }

    #[test]
    fn the_stand_ins_event_carries_the_result_as_the_server_sent_it() {
        for (id, complete) in [
            (RequestId::Number(3), false),
            (RequestId::String("a\"b".into()), true),
        ] {
            let slot = filled();
            let frame = event(id.clone(), complete);
            let written = replace(&frame, false, &slot)
                .expect("the stand-in's event")
                .concat();
            let written = String::from_utf8(written).unwrap();
            let id = serde_json::to_string(&id).unwrap();
            let result = match complete {
                true => RESULT.replacen('{', r#"{"resultType":"complete","#, 1),
                false => RESULT.to_string(),
            };
            assert_eq!(
                written,
                format!(
                    "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}\nid: 0/1\n\n"
                )
            );
            // The bytes went: a replay of the same event is the stand-in.
            assert!(replace(&frame, false, &slot).is_none());
        }
    }

    #[test]
    fn only_the_stand_ins_answer_is_replaced() {
        let slot = filled();
        let progress = b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n";
        assert!(replace(progress, false, &slot).is_none());
        let other = format!(
            "data: {}\n\n",
            r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"no"}],"isError":true}}"#
        );
        assert!(replace(other.as_bytes(), false, &slot).is_none());
        assert!(slot.is_filled(), "the bytes wait for their own answer");
        // An empty slot replaces nothing, and a JSON body is read whole.
        let frame = event(RequestId::Number(3), false);
        let body = &frame[b"data: ".len()..frame.len() - b"\nid: 0/1\n\n".len()];
        assert!(replace(body, true, &RawResult::default()).is_none());
        let written = replace(body, true, &slot)
            .expect("the stand-in's answer")
            .concat();
        assert_eq!(
            &written[..],
            format!(r#"{{"jsonrpc":"2.0","id":3,"result":{RESULT}}}"#).as_bytes()
        );
    }
}
