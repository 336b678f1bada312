//! A tool call's result passed through as the server wrote it.
//!
//! Decoding a result into rmcp's types and encoding it again for the agent is most of what a
//! forwarded call costs once the result is more than a few hundred bytes: each string is
//! unescaped, copied and escaped again, each content block buffered by serde on the way in.
//! When the agent's answer would carry the result unchanged, the bytes can go instead. That
//! holds for an agent on `tether serve`'s own stdio (`gateway/direct.rs` writes its answers)
//! and a server on stdio, for a result of the shape every generation agrees on (see
//! [`passes_unchanged`]): whatever else Tether does to a result (words for a failure, a result
//! the policy must read) takes the typed way as before.
//!
//! The agent's side hands a [`RawResult`] slot down with the call; the server's side fills it
//! with the validated bytes of the answer and gives rmcp a placeholder (an empty result), so
//! the call path runs unchanged: the policy hears a success, deadlines and cancellation hold.
//! The writer of the answer finds the slot full and the placeholder still empty, and writes the
//! bytes.

use std::sync::Mutex;

use rmcp::model::{CallToolResult, JsonRpcVersion2_0, RequestId};
use serde::Deserialize;
use sonic_rs::LazyValue;

/// Where a call's result bytes wait for the agent's answer (one per call).
#[derive(Default)]
pub struct RawResult(Mutex<Option<Vec<u8>>>);

impl RawResult {
    pub fn fill(&self, bytes: Vec<u8>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
    }

    /// The result's bytes, if the server's answer came as bytes.
    pub fn take(&self) -> Option<Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// What rmcp gets for a result that went to its slot: a success with nothing in it.
pub fn placeholder() -> CallToolResult {
    let mut result = CallToolResult::default();
    result.result_type = None;
    result
}

/// Whether `result` is still what [`placeholder`] made, as the agent's answer is about to be
/// written (rmcp adds `resultType` for a 2026-07-28 agent, which the writer adds to the bytes).
pub fn is_placeholder(result: &CallToolResult) -> bool {
    result.content.is_empty()
        && result.structured_content.is_none()
        && result.is_error.is_none()
        && result.meta.is_none()
}

/// The result in `bytes` as rmcp's type, for an answer that cannot carry the bytes after all.
pub fn typed(bytes: &[u8]) -> Option<CallToolResult> {
    serde_json::from_slice(bytes).ok()
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[allow(dead_code)]
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[serde(borrow)]
    result: LazyValue<'a>,
}

/// The members of a result that decide whether it passes unchanged.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shape<'a> {
    #[serde(borrow)]
    content: Option<LazyValue<'a>>,
    is_error: Option<bool>,
    #[serde(borrow)]
    result_type: Option<LazyValue<'a>>,
    #[serde(borrow)]
    structured_content: Option<LazyValue<'a>>,
    #[serde(rename = "_meta", borrow)]
    meta: Option<LazyValue<'a>>,
}

/// The `_meta` member Tether drops from results (it names the server behind the gateway).
const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The id of the answer on `line` and its result's bytes, if it is a valid JSON-RPC answer with
/// a result.
pub(super) fn read(line: &[u8]) -> Option<(RequestId, LazyValue<'_>)> {
    let envelope: Envelope = sonic_rs::from_slice(line).ok()?;
    Some((envelope.id, envelope.result))
}

/// Whether the agent gets `result` (already validated JSON) exactly as the typed way would give
/// it, up to the order of members and members neither generation defines: content and no more
/// of what Tether or rmcp change — no error (the policy reads its words), no `resultType`
/// (dropped for older agents), structured content only as an object (older agents get any
/// other in the content), `_meta` without the server's identity.
pub(super) fn passes_unchanged(result: &str) -> bool {
    let Ok(shape) = sonic_rs::from_str::<Shape>(result) else {
        return false;
    };
    let starts = |value: &Option<LazyValue>, with: u8| {
        value
            .as_ref()
            .is_none_or(|value| value.as_raw_str().as_bytes().first() == Some(&with))
    };
    shape.content.is_some()
        && starts(&shape.content, b'[')
        && shape.is_error != Some(true)
        && shape.result_type.is_none()
        && starts(&shape.structured_content, b'{')
        && shape.meta.as_ref().is_none_or(|meta| {
            sonic_rs::from_str::<std::collections::HashMap<String, serde::de::IgnoredAny>>(
                meta.as_raw_str(),
            )
            .is_ok_and(|members| !members.is_empty() && !members.contains_key(SERVER_INFO))
        })
}

/// Writes the answer `id` to a tool call whose result is `result`'s bytes, as one line, with
/// `"resultType":"complete"` first when the agent speaks 2026-07-28 (`complete`).
pub fn answer_line<'a>(
    id: &RequestId,
    result: &'a [u8],
    complete: bool,
) -> (Vec<u8>, &'a [u8], &'static [u8]) {
    let mut head = Vec::with_capacity(64);
    head.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    // An id is a number or a string: sonic writes it as serde_json would.
    let _ = sonic_rs::to_writer(&mut head, id);
    head.extend_from_slice(b",\"result\":");
    let mut body = result;
    if complete {
        // `result` is an object with members (it has `content`): the discriminator goes first.
        head.extend_from_slice(b"{\"resultType\":\"complete\",");
        body = &result[1..];
    }
    (head, body, b"}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes(result: &str) -> bool {
        passes_unchanged(result)
    }

    #[test]
    fn a_plain_result_passes_and_what_tether_would_change_does_not() {
        assert!(passes(r#"{"content":[{"type":"text","text":"hi"}]}"#));
        assert!(passes(r#"{"content":[],"isError":false,"structuredContent":{"a":1}}"#));
        assert!(passes(r#"{"content":[],"_meta":{"x":1}}"#));
        // The policy reads an error's words; older agents get other structured content as text.
        assert!(!passes(r#"{"content":[],"isError":true}"#));
        assert!(!passes(r#"{"content":[],"structuredContent":[1]}"#));
        assert!(!passes(r#"{"content":[],"resultType":"complete"}"#));
        assert!(!passes(r#"{"isError":false}"#));
        assert!(!passes(r#"{"content":{}}"#));
        assert!(!passes(r#"{"content":[],"_meta":{}}"#));
        assert!(!passes(&format!(r#"{{"content":[],"_meta":{{"{SERVER_INFO}":{{}}}}}}"#)));
        assert!(!passes("[]"));
    }

    #[test]
    fn only_a_valid_answer_is_read() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a\"b"}]}}"#;
        let (id, result) = read(line).unwrap();
        let result = result.as_raw_str();
        assert_eq!(id, RequestId::Number(7));
        assert_eq!(result, r#"{"content":[{"type":"text","text":"a\"b"}]}"#);
        assert!(passes_unchanged(result));
        assert!(read(br#"{"jsonrpc":"2.0","id":7,"result":{"content":[}}"#).is_none());
        assert!(read(br#"{"jsonrpc":"1.0","id":7,"result":{"content":[]}}"#).is_none());
        assert!(read(br#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#).is_none());
    }

    #[test]
    fn the_answer_line_is_the_json_the_typed_way_writes() {
        let result = br#"{"content":[{"type":"text","text":"hi"}]}"#;
        for (id, complete) in [
            (RequestId::Number(3), false),
            (RequestId::String("a\"b".into()), true),
        ] {
            let (head, body, tail) = answer_line(&id, result, complete);
            let line = [head.as_slice(), body, tail].concat();
            assert_eq!(line.last(), Some(&b'\n'));
            let written: serde_json::Value = serde_json::from_slice(&line).unwrap();
            let mut typed: CallToolResult = serde_json::from_slice(result).unwrap();
            typed.result_type = complete.then_some(rmcp::model::ResultType::COMPLETE);
            let expected = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": typed});
            assert_eq!(written, expected);
        }
    }
}
