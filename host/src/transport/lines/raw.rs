//! A tool call's result passed through as the server wrote it.
//!
//! Decoding a result into rmcp's types and encoding it again for the agent is most of what a
//! forwarded call costs once the result is more than a few hundred bytes: each string is
//! unescaped, copied and escaped again, each content block buffered by serde on the way in.
//! When the agent's answer would carry the result unchanged, the bytes can go instead, for a
//! result of the shape every generation agrees on (see [`read`]): whatever else Tether does to
//! a result (words for a failure, a result the policy must read) takes the typed way as before.
//!
//! Where the bytes come from: a server on stdio (its line, `transport/lines.rs`) or on
//! Streamable HTTP (a JSON answer, `transport/post.rs`, or a streamed answer whose first message
//! is the answer, `transport/http/streamed.rs`: [`answer_into`]). Where they go: an agent on
//! `tether serve`'s own stdio (`gateway/direct.rs` writes its answers) or on Streamable HTTP
//! (`gateway/http/results.rs` writes them into rmcp's answer). A legacy SSE server's results,
//! and anything for an agent of rmcp's own stdio loop, take the typed way.
//!
//! The check is of the result's members, not of each content block: a block of a kind rmcp
//! does not know reaches the agent as it would without Tether (the typed way refused the whole
//! result). What is passed is valid JSON on one line: validated whole, its escapes too, with no
//! carriage return or line feed (line readers end a line there, SSE a `data` line). A leading
//! `"resultType":"complete"`, which a 2026-07-28 server writes first, is left out of the bytes
//! (its separator becomes the opening brace), and put back for a 2026-07-28 agent.
//!
//! The agent's side hands a [`RawResult`] slot down with the call; the server's side fills it
//! with the validated bytes of the answer and gives rmcp a placeholder (an empty result), so
//! the call path runs unchanged: the policy hears a success, deadlines and cancellation hold.
//! The writer of the answer finds the slot full and the placeholder still empty, and writes the
//! bytes.

use std::sync::Mutex;

use rmcp::model::{
    CallToolResult, JsonRpcResponse, JsonRpcVersion2_0, RequestId, ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;
use sonic_rs::LazyValue;

use crate::transport::wire::Shallow;

/// Where a call's result bytes wait for the agent's answer (one per call).
#[derive(Default)]
pub struct RawResult(Mutex<Option<RawBytes>>);

impl RawResult {
    pub fn fill(&self, bytes: RawBytes) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
    }

    /// Whether the server's answer came as bytes (not yet taken).
    pub fn is_filled(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The result's bytes, if the server's answer came as bytes.
    pub fn take(&self) -> Option<RawBytes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A result's bytes: the line they came on, moved rather than copied where the line was the
/// whole buffer read, and where they lie in it.
#[derive(Debug)]
pub struct RawBytes {
    buffer: Vec<u8>,
    range: std::ops::Range<usize>,
}

impl RawBytes {
    /// `range` of `buffer`, its first byte made the result's `{` where `rebrace` (see
    /// [`Found`]); `None` if it is not within it.
    pub fn new(mut buffer: Vec<u8>, range: std::ops::Range<usize>, rebrace: bool) -> Option<Self> {
        let first = buffer.get_mut(range.clone())?.first_mut();
        if let (true, Some(first)) = (rebrace, first) {
            *first = b'{';
        }
        Some(Self { buffer, range })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }

    /// The result's bytes as `Bytes`, without a copy.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from(self.buffer).slice(self.range)
    }
}

/// What rmcp gets for a result that went to its slot: a success with nothing in it.
pub fn placeholder() -> CallToolResult {
    let mut result = CallToolResult::default();
    result.result_type = None;
    result
}

/// Whether `result` is still what [`placeholder`] made, as the agent's answer is about to be
/// written (the gateway sets `resultType`, which rmcp strips for an older agent; the writer adds
/// it to the bytes for a 2026-07-28 agent).
pub fn is_placeholder(result: &CallToolResult) -> bool {
    result.content.is_empty()
        && result.structured_content.is_none()
        && result.is_error.is_none()
        && result.meta.is_none()
}

/// The result in `bytes` as rmcp's type, for an answer that cannot carry the bytes after all.
pub fn typed(bytes: &RawBytes) -> Option<CallToolResult> {
    serde_json::from_slice(bytes.as_slice()).ok()
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[allow(dead_code)]
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[serde(borrow)]
    result: Members<'a>,
}

/// What a result's one validated pass finds: whether it passes unchanged, and the two ends that
/// locate it in the line (its first member's name and its last member's value, both borrowed
/// from the line where they hold no escapes).
struct Members<'a> {
    passes: bool,
    first_key: Option<&'a str>,
    last_value: Option<LazyValue<'a>>,
    /// The second member's name, when the first is `"resultType":"complete"`.
    after_type: Option<&'a str>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let members: Members<'de> = deserializer.deserialize_map(MembersVisitor)?;
        Ok(members)
    }
}

struct MembersVisitor;

impl<'de> serde::de::Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a tool call's result")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
        let mut members = Members {
            passes: true,
            first_key: None,
            last_value: None,
            after_type: None,
        };
        let mut content = false;
        // The members read so far, of those checked: a second one is refused, as rmcp's
        // decoder refuses it.
        let mut seen = 0u8;
        // A name with escapes cannot be borrowed: the whole answer then takes the typed way.
        while let Some(key) = map.next_key::<&'de str>()? {
            let value: LazyValue<'de> = map.next_value()?;
            let raw = value.as_raw_str().as_bytes();
            let (bit, passes) = match key {
                "content" => {
                    content = raw.first() == Some(&b'[');
                    (1, content)
                }
                "isError" => (2, raw == b"false"),
                // A 2026-07-28 server's, first as rmcp writes it: left out of the bytes (`read`).
                "resultType" => (4, raw == b"\"complete\"" && members.first_key.is_none()),
                "structuredContent" => (8, raw.first() == Some(&b'{')),
                "_meta" => (16, meta_passes(raw)),
                _ => (0, true),
            };
            members.passes &= passes && seen & bit == 0;
            if seen == 4 && members.after_type.is_none() && bit != 4 {
                members.after_type = Some(key);
            }
            seen |= bit;
            members.first_key.get_or_insert(key);
            members.last_value = Some(value);
        }
        members.passes &= content;
        Ok(members)
    }
}

/// The `_meta` member Tether drops from results (it names the server behind the gateway).
const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// A result's bytes in its line, and whether their first byte stands for the result's `{`: a
/// leading `"resultType":"complete"` (what a 2026-07-28 server writes first) is left out, and
/// the separator before the next member becomes the brace ([`RawBytes::new`]).
pub(super) type Found<'a> = (&'a [u8], bool);

/// The id of the answer on `line`, if it is a valid JSON-RPC answer with a result (validated
/// whole, in one pass), and the result's bytes if the agent gets it exactly as the typed way
/// would give it, up to the order of members and members neither generation defines: content
/// and no more of what Tether or rmcp change — no error (the policy reads its words), no
/// `resultType` but a leading `complete` (left out; the agent's answer adds it back for a
/// 2026-07-28 agent), structured content only as an object (older agents get any other in the
/// content), `_meta` without the server's identity.
pub(super) fn read(line: Shallow<'_>) -> Option<(RequestId, Option<Found<'_>>)> {
    let envelope: Envelope = line.read().ok()?;
    let line = line.bytes();
    let members = envelope.result;
    let found = members.passes.then(|| span(line, &members)).flatten();
    let found = found.and_then(|whole| match members.after_type {
        Some(key) => {
            let end = whole.as_ptr() as usize - line.as_ptr() as usize + whole.len();
            // The separator before the name's opening quote.
            let start = (key.as_ptr() as usize - line.as_ptr() as usize).checked_sub(2)?;
            Some((&line[start..end], true))
        }
        None => Some((whole, false)),
    });
    let found = found.filter(|(bytes, _)| one_line_with_valid_escapes(bytes));
    Some((envelope.id, found))
}

/// The answer to a call in `message`, a whole message as an HTTP server sends it (a JSON body,
/// an SSE event's data), if `ours` says its id is the call's: when its result passes unchanged,
/// the result goes to `slot` (the message's buffer moves there, nothing is copied) and rmcp gets
/// a placeholder in its stead; otherwise the message comes back to be read the typed way.
pub(crate) fn answer_into(
    message: Vec<u8>,
    ours: impl FnOnce(&RequestId) -> bool,
    slot: &RawResult,
) -> Result<ServerJsonRpcMessage, Vec<u8>> {
    match Shallow::new(&message).and_then(|shallow| locate(shallow, ours)) {
        Some(found) => fill(message, found, slot),
        None => Err(message),
    }
}

/// [`answer_into`] for a message already known to be UTF-8 (an SSE event's data), which is not
/// checked again; it comes back as it was when it is to be read the typed way.
pub(crate) fn answer_text_into(
    message: String,
    ours: impl FnOnce(&RequestId) -> bool,
    slot: &RawResult,
) -> Result<ServerJsonRpcMessage, String> {
    match Shallow::text(&message).and_then(|shallow| locate(shallow, ours)) {
        Some(found) => fill(message.into_bytes(), found, slot).map_err(|_| String::new()),
        None => Err(message),
    }
}

/// The answer's id, and where its result lies in the message, if it is the call's and passes
/// unchanged.
fn locate(
    message: Shallow<'_>,
    ours: impl FnOnce(&RequestId) -> bool,
) -> Option<(RequestId, std::ops::Range<usize>, bool)> {
    let start = message.bytes().as_ptr() as usize;
    let (id, found) = read(message)?;
    let (bytes, rebrace) = found.filter(|_| ours(&id))?;
    let at = bytes.as_ptr() as usize - start;
    Some((id, at..at + bytes.len(), rebrace))
}

/// Moves the located result into `slot` and answers rmcp with the placeholder.
fn fill(
    message: Vec<u8>,
    (id, range, rebrace): (RequestId, std::ops::Range<usize>, bool),
    slot: &RawResult,
) -> Result<ServerJsonRpcMessage, Vec<u8>> {
    match RawBytes::new(message, range, rebrace) {
        Some(bytes) => slot.fill(bytes),
        // Cannot be: the range was found in the message. (Read as nothing, it fails the call.)
        None => return Err(Vec::new()),
    }
    Ok(ServerJsonRpcMessage::Response(JsonRpcResponse {
        jsonrpc: JsonRpcVersion2_0,
        id,
        result: ServerResult::CallToolResult(placeholder()),
    }))
}

/// Whether `json` (valid JSON but for its escapes) holds no line's end and only escapes a JSON
/// parser takes, in one pass. sonic-rs skips the four characters of a `\u` escape unchecked,
/// where the agent's parser would refuse a bad digit or a lone surrogate (and the typed way
/// refuses them too). A bare carriage return or line feed (whitespace to JSON) is refused: the
/// bytes go on as one line (stdio) or one SSE `data` line, and line readers that take a
/// carriage return for a line's end would split the answer. (A stdio line holds no line feed.)
fn one_line_with_valid_escapes(json: &[u8]) -> bool {
    // `from_str_radix` alone would take a sign: `\u+041` is no escape to a JSON parser.
    let hex = |at: usize| {
        json.get(at..at + 4)
            .filter(|digits| digits.iter().all(u8::is_ascii_hexdigit))
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u16::from_str_radix(digits, 16).ok())
    };
    let mut at = 0;
    while let Some(found) = memchr::memchr3(b'\\', b'\r', b'\n', &json[at..]) {
        let escape = at + found;
        if json[escape] != b'\\' {
            return false;
        }
        at = escape + 2;
        match json.get(escape + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
            Some(b'u') => {
                let Some(unit) = hex(escape + 2) else {
                    return false;
                };
                at = escape + 6;
                if (0xDC00..0xE000).contains(&unit) {
                    return false;
                }
                if (0xD800..0xDC00).contains(&unit) {
                    let low = (json.get(at..at + 2) == Some(&b"\\u"[..]))
                        .then(|| hex(at + 2))
                        .flatten();
                    if !low.is_some_and(|low| (0xDC00..0xE000).contains(&low)) {
                        return false;
                    }
                    at += 6;
                }
            }
            _ => return false,
        }
    }
    true
}

/// Where the result of `members` lies in `line`: from the `{` before its first member's name to
/// the `}` after its last member's value. `None` where either end is not a slice of the line
/// (a last value that is a string with escapes is a copy).
fn span<'a>(line: &'a [u8], members: &Members) -> Option<&'a [u8]> {
    let offset = |slice: &[u8]| {
        let at = (slice.as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
        (at + slice.len() <= line.len()).then_some(at)
    };
    let key = offset(members.first_key?.as_bytes())?;
    let last = members.last_value.as_ref()?.as_raw_str().as_bytes();
    let end = offset(last)? + last.len();
    // Before the name: its opening quote, then only whitespace back to the brace.
    let before = line[..key.checked_sub(1)?].trim_ascii_end();
    let after = line[end..].trim_ascii_start();
    let open = before.len().checked_sub(1)?;
    let close = line.len() - after.len();
    (line[open] == b'{' && after.first() == Some(&b'}')).then(|| &line[open..=close])
}

/// Whether a result's `_meta` reaches the agent unchanged: an object with members, none of them
/// the server's identity.
fn meta_passes(meta: &[u8]) -> bool {
    sonic_rs::from_slice::<std::collections::HashMap<String, serde::de::IgnoredAny>>(meta)
        .is_ok_and(|members| !members.is_empty() && !members.contains_key(SERVER_INFO))
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

    fn shallow(line: &[u8]) -> Shallow<'_> {
        Shallow::new(line).expect("not nested deep")
    }

    fn passes(result: &str) -> bool {
        let line = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
        // A result that is not an object is no answer this reads: the typed way.
        let found = read(shallow(line.as_bytes())).and_then(|(_, found)| found);
        if let Some((bytes, rebrace)) = found {
            assert!(!rebrace);
            assert_eq!(bytes, result.as_bytes(), "the result's bytes, whole");
        }
        found.is_some()
    }

    /// What an agent gets of `result` in a line, as the slot keeps it.
    fn kept(result: &str) -> Option<String> {
        let line = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).into_bytes();
        let (bytes, rebrace) = read(shallow(&line)).and_then(|(_, found)| found)?;
        let at = bytes.as_ptr() as usize - line.as_ptr() as usize;
        let range = at..at + bytes.len();
        let kept = RawBytes::new(line, range, rebrace).expect("within the line");
        Some(String::from_utf8(kept.as_slice().to_vec()).unwrap())
    }

    #[test]
    fn a_leading_complete_result_type_is_left_out_of_the_bytes() {
        let plain = r#"{"content":[],"x":1}"#;
        assert_eq!(kept(r#"{"resultType":"complete","content":[],"x":1}"#).unwrap(), plain);
        let spaced = r#"{ "resultType" : "complete" ,  "content":[] , "x":1 }"#;
        assert_eq!(kept(spaced).unwrap(), r#"{"content":[] , "x":1 }"#);
        // Anywhere else, twice, or of another kind: the typed way.
        assert_eq!(kept(r#"{"content":[],"resultType":"complete"}"#), None);
        assert_eq!(kept(r#"{"resultType":"complete","resultType":"complete","content":[]}"#), None);
        assert_eq!(kept(r#"{"resultType":"input_required","content":[]}"#), None);
        assert_eq!(kept(plain).unwrap(), plain);
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
        assert!(!passes(r#"{"content":[],"isError":"no"}"#));
        assert!(!passes(r#"{"content":[],"isError":false,"isError":true}"#));
    }

    #[test]
    fn an_http_answer_moves_to_its_slot_only_when_it_is_the_calls() {
        let message = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#.to_vec();
        let slot = RawResult::default();
        let refused = answer_into(message.clone(), |id| *id == RequestId::Number(8), &slot);
        assert_eq!(refused.unwrap_err(), message, "another request's answer: the typed way");
        assert!(!slot.is_filled());
        let spaced = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\n\"content\":[]}}".to_vec();
        assert_eq!(answer_into(spaced.clone(), |_| true, &slot).unwrap_err(), spaced);
        let Ok(ServerJsonRpcMessage::Response(answer)) = answer_into(message, |_| true, &slot)
        else {
            panic!("the placeholder");
        };
        assert_eq!(answer.id, RequestId::Number(7));
        assert!(matches!(answer.result, ServerResult::CallToolResult(ref r) if is_placeholder(r)));
        assert_eq!(slot.take().unwrap().as_slice(), br#"{"content":[]}"#);
        // A 2026-07-28 server's result: its `resultType` left out, in the message's own buffer.
        let modern = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","content":[]}}"#;
        assert!(answer_into(modern.to_vec(), |_| true, &slot).is_ok());
        assert_eq!(slot.take().unwrap().as_slice(), br#"{"content":[]}"#);
    }

    #[test]
    fn an_answer_known_as_text_is_taken_alike_and_comes_back_as_it_was() {
        let slot = RawResult::default();
        let message = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"é"}]}}"#;
        let refused = answer_text_into(message.into(), |id| *id == RequestId::Number(8), &slot);
        assert_eq!(refused.unwrap_err(), message);
        let error = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}"#;
        assert_eq!(answer_text_into(error.into(), |_| true, &slot).unwrap_err(), error);
        assert!(!slot.is_filled());
        let Ok(ServerJsonRpcMessage::Response(answer)) =
            answer_text_into(message.into(), |_| true, &slot)
        else {
            panic!("the placeholder");
        };
        assert_eq!(answer.id, RequestId::Number(7));
        let result = r#"{"content":[{"type":"text","text":"é"}]}"#;
        assert_eq!(slot.take().unwrap().as_slice(), result.as_bytes());
    }

    #[test]
    fn only_a_valid_answer_is_read() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a\"b"}]}}"#;
        let result = r#"{"content":[{"type":"text","text":"a\"b"}]}"#.as_bytes();
        assert_eq!(read(shallow(line)).unwrap(), (RequestId::Number(7), Some((result, false))));
        // Found whatever the spacing and order of the answer's members.
        let spaced = br#" { "result" : {  "x" : "y\"" , "content" : [ ] } , "id" : 7 , "jsonrpc" : "2.0" } "#;
        let result = br#"{  "x" : "y\"" , "content" : [ ] }"#.as_slice();
        assert_eq!(read(shallow(spaced)).unwrap(), (RequestId::Number(7), Some((result, false))));
        // A last value that is a string with escapes is not the line's: the typed way.
        let escaped = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"x":"\u0041"}}"#;
        assert_eq!(read(shallow(escaped)).unwrap(), (RequestId::Number(7), None));
        assert!(read(shallow(br#"{"jsonrpc":"2.0","id":7,"result":{"content":[}}"#)).is_none());
        assert!(read(shallow(br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}} x"#)).is_none());
        // Escapes sonic-rs lets through, a duplicate, a bare carriage return: the typed way.
        for (result, passes) in [
            (r#"{"content":[{"type":"text","text":"\ud83d\ude00 \u00e9 \\u \n"}]}"#, true),
            (r#"{"content":[{"type":"text","text":"\uZZZZ"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\u+041"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\u-041"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\ud800"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\ud800\u0041"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\ude00"}]}"#, false),
            (r#"{"content":[{"type":"text","text":"\u"}],"x":"}]}"#, false),
            (r#"{"content":[],"content":[]}"#, false),
            (r#"{"content":[],"isError":false,"isError":false}"#, false),
            ("{\"content\":[]\r}", false),
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
            let found = read(shallow(line.as_bytes())).and_then(|(_, found)| found);
            assert_eq!(found.is_some(), passes, "{result}");
        }
        assert!(read(shallow(br#"{"jsonrpc":"1.0","id":7,"result":{"content":[]}}"#)).is_none());
        assert!(read(shallow(br#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#)).is_none());
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
