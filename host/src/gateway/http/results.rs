//! A tool call's result reaching an agent on Streamable HTTP as its server sent it: the HTTP
//! agent's side of `transport/lines/raw.rs` (`direct.rs` is the stdio agent's).
//!
//! rmcp's HTTP service writes every answer itself, so Tether cannot write the bytes in its
//! stead. Instead each POST carries a slot ([`slot_for`]); when a result went to it, the call's
//! handler answers with a stand-in ([`stand_in`]) and the POST's response is watched for it
//! ([`replace`]): the one event that carries the stand-in is written again with the result's
//! bytes in its place. rmcp keeps a stream's events to replay them to an agent that reconnects
//! with `Last-Event-ID`; what it replays is the stand-in, an error saying the result was passed
//! on once (its bytes are not kept), never an empty success.

use std::sync::{Arc, LazyLock};

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{Method, request::Parts};
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Extensions, ResultType};

use crate::transport::lines::raw::{RawResult, is_placeholder};

/// What the stand-in says, should it ever reach an agent (a replayed stream).
const PASSED_ON: &str = "Tether passed this result on once and keeps no copy: call the tool again.";

/// The longest event that can carry the stand-in (its words, an id, the SSE framing).
const MAX_STAND_IN_EVENT: usize = 1024;

/// The stand-in, for an agent of either generation (with `resultType` for a 2026-07-28 one).
fn stand_in_result(complete: bool) -> CallToolResult {
    let mut passed = CallToolResult::error(vec![ContentBlock::text(PASSED_ON)]);
    passed.result_type = complete.then_some(ResultType::COMPLETE);
    passed
}

/// The stand-in as rmcp writes it in an answer (`serde_json`, compact), for either generation:
/// recognised by its bytes, without parsing the event.
static WRITTEN: LazyLock<[(Vec<u8>, bool); 2]> = LazyLock::new(|| {
    [false, true].map(|complete| {
        let written = serde_json::to_vec(&stand_in_result(complete)).unwrap_or_default();
        (written, complete)
    })
});

/// Gives a POST the slot its tool call's result may go to.
pub(in crate::gateway) fn slot_for(request: &mut Request) -> Option<Arc<RawResult>> {
    if request.method() != Method::POST {
        return None;
    }
    let slot = Arc::new(RawResult::default());
    request.extensions_mut().insert(slot.clone());
    Some(slot)
}

/// The slot of the request whose extensions are `extensions`: one a stdio agent's call carries
/// (`direct.rs`), or the one its POST carries ([`slot_for`]; rmcp hands a handler the request's
/// HTTP parts).
pub(in crate::gateway) fn slot_in(extensions: &Extensions) -> Option<&Arc<RawResult>> {
    extensions.get::<Arc<RawResult>>().or_else(|| {
        extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Arc<RawResult>>())
    })
}

/// The slot of the POST whose request has `extensions`, for [`stand_in`].
pub(in crate::gateway) fn posted_slot(extensions: &Extensions) -> Option<Arc<RawResult>> {
    let parts = extensions.get::<Parts>()?;
    parts.extensions.get::<Arc<RawResult>>().cloned()
}

/// An HTTP agent's answer: a placeholder whose result waits in its POST's slot (`posted`)
/// becomes the stand-in its response is watched for.
pub(in crate::gateway) fn stand_in(
    mut response: Result<CallToolResponse, rmcp::ErrorData>,
    posted: Option<&RawResult>,
) -> Result<CallToolResponse, rmcp::ErrorData> {
    if let (Some(slot), Ok(CallToolResponse::Complete(result))) = (posted, &mut response)
        && is_placeholder(result)
        && slot.is_filled()
    {
        *result = stand_in_result(result.result_type.is_some());
    }
    response
}

/// `frame` (an SSE event of a POST's response, or its JSON body: `json`) with the answer that
/// carries the stand-in written again around the result in `slot`, in three pieces (the result's
/// bytes are not copied); `None` if it carries none.
pub(in crate::gateway) fn replace(
    frame: &[u8],
    json: bool,
    slot: &RawResult,
) -> Option<[Bytes; 3]> {
    // The slot is filled as the answer arrives: the events before it are let through here.
    if frame.len() > MAX_STAND_IN_EVENT || !slot.is_filled() {
        return None;
    }
    // The event's `data` line: rmcp writes it whole on one line, after any `event` line.
    let (data_at, data_end) = match json {
        true => (0, frame.len()),
        false => {
            let start = if frame.starts_with(b"data: ") {
                0
            } else {
                memchr::memmem::find(frame, b"\ndata: ")? + 1
            };
            let value = start + b"data: ".len();
            (value, value + memchr::memchr(b'\n', &frame[value..])?)
        }
    };
    // `{"jsonrpc":"2.0","id":…,"result":STAND-IN}`: the id is kept as rmcp wrote it.
    let data = &frame[data_at..data_end];
    let before_result = data.strip_prefix(b"{\"jsonrpc\":\"2.0\",\"id\":")?;
    let (stand_in, complete) = WRITTEN.iter().find(|(written, _)| {
        before_result
            .strip_suffix(b"}")
            .and_then(|rest| rest.strip_suffix(written.as_slice()))
            .is_some_and(|id| id.ends_with(b",\"result\":"))
    })?;
    let bytes = slot.take()?;
    let result_at = data_end - 1 - stand_in.len();
    let mut opening = Vec::with_capacity(result_at + 32);
    opening.extend_from_slice(&frame[..result_at]);
    let mut skipped = 0;
    if *complete {
        // The result has members (it has `content`): the discriminator goes first.
        opening.extend_from_slice(b"{\"resultType\":\"complete\",");
        skipped = 1;
    }
    Some([
        Bytes::from(opening),
        bytes.into_bytes().slice(skipped..),
        Bytes::copy_from_slice(&frame[data_end - 1..]),
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

    /// The event rmcp writes for the stand-in answering `id` (a 2026-07-28 agent's: `complete`).
    fn event(id: RequestId, complete: bool) -> Vec<u8> {
        let mut placeholder = crate::transport::lines::raw::placeholder();
        if complete {
            placeholder.result_type = Some(rmcp::model::ResultType::COMPLETE);
        }
        let response = stand_in(Ok(CallToolResponse::Complete(placeholder)), Some(&filled()));
        let Ok(CallToolResponse::Complete(result)) = response else {
            panic!("a result");
        };
        assert_eq!(result.is_error, Some(true));
        let message: ServerJsonRpcMessage =
            JsonRpcMessage::response(ServerResult::CallToolResult(result), id);
        let data = serde_json::to_string(&message).unwrap();
        format!("data: {data}\nid: 0/1\n\n").into_bytes()
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
