//! A `tools/call` request as it is on the wire, read and written in one pass, and its answer,
//! read in one.
//!
//! rmcp's `JsonRpcRequest<CallToolRequest>` reads through two `#[serde(flatten)]` layers (the
//! message's, then the one that takes `_meta` out of the parameters), which buffer every field
//! before typing it, and writes the parameters by way of a `serde_json::Value` copy so it can
//! merge `_meta`; it reads the answer as an untagged `ServerResult`, one result type tried after
//! another, an error built for each. These give the same values and the same JSON without any
//! of that; the tests hold them to rmcp's. Both stdio ends (`lines.rs`) and the Streamable HTTP
//! client (`http/streamed.rs`) use them, on messages checked [`Shallow`] first.

use std::borrow::Cow;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, Extensions, InputResponses,
    JsonObject, JsonRpcMessage, JsonRpcResponse, MetaObject, RequestId, RequestMetaObject, ServerJsonRpcMessage,
    ServerResult,
};
use serde::{Deserialize, Serialize};

const VERSION: &str = "2.0";
const METHOD: &str = "tools/call";

/// The nesting serde_json refuses (its recursion limit: 127 levels pass).
const MAX_NESTING: usize = 128;

/// A message sonic-rs may read: one that cannot nest deeper than serde_json allows. sonic-rs
/// skips nested values recursively with no bound; a deeper message takes rmcp's decoder, which
/// refuses it.
#[derive(Clone, Copy)]
pub(crate) struct Shallow<'a> {
    message: &'a [u8],
    /// The message as text, when it was given as such: read without checking its UTF-8 again.
    text: Option<&'a str>,
}

impl<'a> Shallow<'a> {
    pub(crate) fn new(message: &'a [u8]) -> Option<Self> {
        // Brackets counted, not levels: a message with as many could nest as deep.
        let deep = memchr::memchr2_iter(b'[', b'{', message)
            .nth(MAX_NESTING - 1)
            .is_some();
        (!deep).then_some(Self {
            message,
            text: None,
        })
    }

    /// A message already known to be UTF-8 (an SSE event's data).
    pub(crate) fn text(message: &'a str) -> Option<Self> {
        let shallow = Self::new(message.as_bytes())?;
        Some(Self {
            text: Some(message),
            ..shallow
        })
    }

    pub(crate) fn bytes(self) -> &'a [u8] {
        self.message
    }

    /// The message read as a `T` by sonic-rs.
    pub(crate) fn read<T: Deserialize<'a>>(self) -> sonic_rs::Result<T> {
        match self.text {
            Some(text) => sonic_rs::from_str(text),
            None => sonic_rs::from_slice(self.message),
        }
    }
}

/// A server's answer to a tool call, read in one typed pass. `None` for anything but a call's
/// complete result (an error, a result of 2026-07-28's other kinds): rmcp's decoder takes
/// those. Only the answer to a call may be read this way: the answer to another request could
/// read as a call's result too.
pub(crate) fn read_call_answer(message: Shallow) -> Option<JsonRpcResponse<ServerResult>> {
    let answer: JsonRpcResponse<CallToolResult> = message.read().ok()?;
    Some(JsonRpcResponse {
        jsonrpc: answer.jsonrpc,
        id: answer.id,
        result: ServerResult::CallToolResult(answer.result),
    })
}

/// A server's message answering a tool call: a complete result in one typed pass
/// ([`read_call_answer`]), anything else (an error, another kind of result, a message nested
/// too deep for sonic-rs) by rmcp's decoder.
pub(crate) fn read_answer_to_call(message: &[u8]) -> serde_json::Result<ServerJsonRpcMessage> {
    answer_to_call(Shallow::new(message), || serde_json::from_slice(message))
}

/// [`read_answer_to_call`] for a message already known to be UTF-8 (an SSE event's data).
pub(crate) fn read_answer_text_to_call(message: &str) -> serde_json::Result<ServerJsonRpcMessage> {
    answer_to_call(Shallow::text(message), || serde_json::from_str(message))
}

fn answer_to_call(
    message: Option<Shallow>,
    otherwise: impl FnOnce() -> serde_json::Result<ServerJsonRpcMessage>,
) -> serde_json::Result<ServerJsonRpcMessage> {
    match message.and_then(read_call_answer) {
        Some(answer) => Ok(ServerJsonRpcMessage::Response(answer)),
        None => otherwise(),
    }
}

#[derive(Deserialize)]
struct CallIn<'a> {
    #[serde(borrow)]
    jsonrpc: Cow<'a, str>,
    id: RequestId,
    #[serde(borrow)]
    method: Cow<'a, str>,
    params: ParamsIn,
    /// A request that also carries an answer's member is no message to rmcp, which refuses it.
    #[serde(default)]
    result: Present,
    #[serde(default)]
    error: Present,
}

/// Whether a member is there, whatever its value (`null` too).
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(value: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(value).map(|_| Present(true))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ParamsIn {
    #[serde(rename = "_meta")]
    meta: Option<JsonObject>,
    name: String,
    arguments: Option<JsonObject>,
    input_responses: Option<InputResponses>,
    request_state: Option<String>,
}

/// The `tools/call` request on `line`, as rmcp would read it (its `_meta` in the extensions);
/// `None` for anything else, or anything rmcp would refuse.
pub(crate) fn read_call(line: Shallow) -> Option<(RequestId, CallToolRequest)> {
    // rmcp reads a message as a JSON object only; serde would take an array's items in order.
    if line.bytes().trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let call: CallIn = line.read().ok()?;
    if call.jsonrpc != VERSION
        || call.method != METHOD
        || call.result.0
        || call.error.0
    {
        return None;
    }
    let ParamsIn {
        meta,
        name,
        arguments,
        input_responses,
        request_state,
    } = call.params;
    let mut params = CallToolRequestParams::new(name);
    params.arguments = arguments;
    params.input_responses = input_responses;
    params.request_state = request_state;
    let mut request = CallToolRequest::new(params);
    if let Some(meta) = meta {
        request
            .extensions
            .insert(RequestMetaObject(MetaObject(meta)));
    }
    Some((call.id, request))
}

#[derive(Serialize)]
struct CallOut<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    method: &'static str,
    params: ParamsOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ParamsOut<'a> {
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<Cow<'a, JsonObject>>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a JsonObject>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_responses: Option<&'a InputResponses>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_state: Option<&'a str>,
}

/// Writes the `tools/call` request `id` as rmcp writes it.
pub(crate) fn write_call(
    id: &RequestId,
    call: &CallToolRequest,
    out: &mut Vec<u8>,
) -> sonic_rs::Result<()> {
    let params = &call.params;
    let message = CallOut {
        jsonrpc: VERSION,
        id,
        method: METHOD,
        params: ParamsOut {
            meta: meta(params.meta.as_ref().map(|own| &own.0.0), &call.extensions),
            name: &params.name,
            arguments: params.arguments.as_ref(),
            input_responses: params.input_responses.as_ref(),
            request_state: params.request_state.as_deref(),
        },
    };
    sonic_rs::to_writer(out, &message)
}

/// `_meta` as rmcp writes it: the parameters' own, under a legacy `MetaObject` extension, under
/// the typed `RequestMetaObject` one (a later layer wins a key).
fn meta<'a>(own: Option<&'a JsonObject>, extensions: &'a Extensions) -> Option<Cow<'a, JsonObject>> {
    let legacy = extensions.get::<MetaObject>().map(|meta| &meta.0);
    let typed = extensions.get::<RequestMetaObject>().map(|meta| &meta.0.0);
    let mut layers = [own, legacy, typed].into_iter().flatten();
    let mut merged = Cow::Borrowed(layers.next()?);
    for layer in layers {
        merged
            .to_mut()
            .extend(layer.iter().map(|(key, value)| (key.clone(), value.clone())));
    }
    Some(merged)
}

/// The first id of a tool call Tether sends past rmcp's loop (stdio: `lines/calls.rs`,
/// Streamable HTTP: `http/posted.rs`); its progress token is the same number. rmcp numbers its
/// own requests, and its own progress tokens, from 0 in the same session: it would take a
/// billion of them to meet these, and a server that reads ids as 32-bit integers still reads
/// these.
pub(super) const FIRST_STRAIGHT_ID: i64 = 1 << 30;

/// Whether an answer's id names the request; some servers echo numeric ids as strings.
pub(super) fn same_id(request: &RequestId, answer: &RequestId) -> bool {
    request == answer
        || matches!((request, answer), (RequestId::Number(n), RequestId::String(s)) if s.parse::<i64>().ok() == Some(*n))
}

/// The request a server's message answers, if it is an answer (a response, or an error naming
/// a request).
pub(super) fn answered_id(message: &ServerJsonRpcMessage) -> Option<&RequestId> {
    match message {
        JsonRpcMessage::Response(response) => Some(&response.id),
        JsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use rmcp::RoleClient;
    use rmcp::model::{
        ClientRequest, JsonRpcMessage, JsonRpcRequest, NumberOrString, ServerJsonRpcMessage,
    };
    use rmcp::service::TxJsonRpcMessage;
    use serde_json::{Value, json};

    use super::*;

    fn object(value: Value) -> JsonObject {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn ids_match_across_number_and_string() {
        assert!(same_id(
            &RequestId::Number(3),
            &RequestId::String("3".into())
        ));
        assert!(!same_id(&RequestId::Number(3), &RequestId::Number(4)));
    }

    #[test]
    fn a_call_reads_as_rmcp_reads_it() {
        let lines = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}),
            json!({"jsonrpc": "2.0", "id": "a-7", "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": "h\u{e9}llo \"q\"\n",
                "n": [1, -2, 3.5, 1e300, 18446744073709551615u64], "deep": {"x": null, "y": true}}}}),
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"_meta": {"progressToken": 4, "traceparent": "00-ab"}, "name": "slow",
                "arguments": {}}}),
            json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
                "params": {"name": "ask", "arguments": {"q": 1}, "inputResponses": {"r1": {"x": 1}},
                "requestState": "opaque", "_meta": null, "unknown": [1]}, "extra": 2}),
        ];
        for line in lines {
            let bytes = serde_json::to_vec(&line).unwrap();
            let (id, ours) = read_call(Shallow::new(&bytes).unwrap()).expect("a call");
            let theirs: JsonRpcRequest<CallToolRequest> = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(id, theirs.id, "{line}");
            assert_eq!(ours.params, theirs.request.params, "{line}");
            assert_eq!(
                ours.extensions.get::<RequestMetaObject>(),
                theirs.request.extensions.get::<RequestMetaObject>(),
                "{line}"
            );
        }
    }

    #[test]
    fn a_calls_answer_reads_as_rmcp_reads_it_and_nothing_else_reads_as_one() {
        let answers = [
            json!({"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": "h\u{e9} \"q\""}]}}),
            json!({"jsonrpc": "2.0", "id": "s", "result": {"content": [], "structuredContent": {"n": [1, 2.5]},
                "isError": true, "_meta": {"k": 1}, "resultType": "complete", "extra": null}}),
        ];
        for answer in answers {
            let bytes = serde_json::to_vec(&answer).unwrap();
            let ours = read_call_answer(Shallow::new(&bytes).unwrap()).expect("a call's answer");
            let ours = ServerJsonRpcMessage::Response(ours);
            let theirs: ServerJsonRpcMessage = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                serde_json::to_value(&ours).unwrap(),
                serde_json::to_value(&theirs).unwrap(),
                "{answer}"
            );
            // Read as text (an SSE event's data), the same.
            let text = read_answer_text_to_call(std::str::from_utf8(&bytes).unwrap()).unwrap();
            assert_eq!(
                serde_json::to_value(&text).unwrap(),
                serde_json::to_value(&theirs).unwrap()
            );
        }
        let others = [
            json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "no"}}),
            json!({"jsonrpc": "2.0", "id": 3, "result": {"resultType": "input_required",
                "inputRequests": {}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 1}}),
        ];
        for other in others {
            let bytes = serde_json::to_vec(&other).unwrap();
            assert!(read_call_answer(Shallow::new(&bytes).unwrap()).is_none(), "{other}");
            // Taken by rmcp's decoder instead, from text as from bytes.
            let text = read_answer_text_to_call(std::str::from_utf8(&bytes).unwrap()).unwrap();
            let theirs: ServerJsonRpcMessage = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                serde_json::to_value(&text).unwrap(),
                serde_json::to_value(&theirs).unwrap()
            );
        }
        // serde_json reads 127 levels and refuses 128.
        for (levels, shallow) in [(127, true), (128, false)] {
            let nested = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
            let theirs = serde_json::from_str::<Value>(&nested);
            assert_eq!(theirs.is_ok(), shallow, "serde_json at {levels} levels");
            assert_eq!(Shallow::new(nested.as_bytes()).is_some(), shallow, "{levels}");
        }
    }

    #[test]
    fn what_rmcp_refuses_is_not_read_as_a_call() {
        let lines = [
            json!({"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"name": "echo"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}),
            json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo", "arguments": [1]}}),
        ];
        for line in lines {
            let bytes = serde_json::to_vec(&line).unwrap();
            assert!(read_call(Shallow::new(&bytes).unwrap()).is_none(), "{line}");
            assert!(
                serde_json::from_slice::<JsonRpcRequest<CallToolRequest>>(&bytes).is_err(),
                "{line}"
            );
        }
        // Messages rmcp's own reading refuses, though their request would read: one that
        // answers too, and a request's members in an array.
        let refused = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo"}, "result": null}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo"}, "error": {}}),
            json!(["2.0", 1, "tools/call", {"name": "echo"}]),
        ];
        for line in refused {
            let bytes = serde_json::to_vec(&line).unwrap();
            assert!(read_call(Shallow::new(&bytes).unwrap()).is_none(), "{line}");
            assert!(
                serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(&bytes).is_err(),
                "{line}"
            );
        }
    }

    #[test]
    fn a_call_writes_as_rmcp_writes_it() {
        let mut plain = CallToolRequestParams::new("echo");
        plain.arguments = Some(object(json!({"message": "h\u{e9}\"llo\n", "n": [1, 2.5]})));
        let mut full = plain.clone();
        full.meta = Some(RequestMetaObject(MetaObject(object(json!({"a": 1, "b": 1})))));
        full.input_responses = Some([("r1".to_string(), json!({"x": 1}))].into());
        full.request_state = Some("opaque".into());
        let typed = RequestMetaObject(MetaObject(object(json!({"b": 2, "c": 2}))));
        let legacy = MetaObject(object(json!({"c": 3, "d": 3})));
        let cases: Vec<(CallToolRequestParams, Option<RequestMetaObject>, Option<MetaObject>)> = vec![
            (CallToolRequestParams::new("bare"), None, None),
            (plain.clone(), None, None),
            (plain.clone(), Some(typed.clone()), None),
            (plain, None, Some(legacy.clone())),
            (full.clone(), None, None),
            (full.clone(), Some(typed.clone()), None),
            (full, Some(typed), Some(legacy)),
        ];
        for (params, typed, legacy) in cases {
            let mut call = CallToolRequest::new(params);
            if let Some(typed) = typed {
                call.extensions.insert(typed);
            }
            if let Some(legacy) = legacy {
                call.extensions.insert(legacy);
            }
            let id = NumberOrString::Number(7);
            let mut ours = Vec::new();
            write_call(&id, &call, &mut ours).unwrap();
            let message: TxJsonRpcMessage<RoleClient> = JsonRpcMessage::Request(
                JsonRpcRequest::new(id, ClientRequest::CallToolRequest(call)),
            );
            let theirs = serde_json::to_value(&message).unwrap();
            let ours: Value = serde_json::from_slice(&ours).unwrap();
            assert_eq!(ours, theirs);
        }
    }
}
