//! Memory bounded by configuration, never by the upstream: the largest message (`max_message`)
//! an upstream may make Tether buffer.
//!
//! [`FrameLimiter`] is a sans-IO filter over the bytes a server sends, framed as lines (stdio,
//! fed by the line transport as it reads) or as server-sent events (legacy SSE; on Streamable
//! HTTP a tool call's streamed answer and the GET streams). Frames within the limit pass
//! unchanged. An oversized frame is cut off where it crosses the limit (what already passed is
//! made unparsable, so the reader skips it) and dropped to its end; only its first and last
//! bytes are kept. If it was the answer to one of our requests (its id is found in those
//! bytes), the filter puts in its place a JSON-RPC error for that id that says "too large"
//! ([`TOO_LARGE`]), so the one call waiting for it fails at once with a clear message instead
//! of waiting for its deadline. A request from the server is replaced by a small one of the
//! same id ([`TOO_LARGE_REQUEST`]), which the upstream's handler answers with a "too large"
//! error: the server is not left waiting. Oversized notifications are dropped; everything
//! dropped is counted. An oversized event's own `id` and `retry` lines (written after its data
//! by rmcp's servers) still reach the reader, so a stream picked up again starts after it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;

/// The JSON-RPC error code of a synthesized "answer too large" error (implementation-defined
/// server error range). Its `data` carries `{"tetherTooLarge": {"size": N, "limit": L}}`.
pub const TOO_LARGE: i32 = -32099;

/// The method of the request that stands in for a server's request over the limit; the
/// upstream's handler answers it with a [`TOO_LARGE`] error. Its params: `{"size", "limit"}`.
pub const TOO_LARGE_REQUEST: &str = "tether/requestTooLarge";

/// How much of an oversized frame's start and end is kept to find its id.
const KEEP: usize = 512;

/// Messages dropped because they were over the limit and answered nothing of ours.
static OVERSIZED_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Answers replaced by a "too large" error.
static OVERSIZED_ANSWERS: AtomicU64 = AtomicU64::new(0);

/// (answers replaced by a "too large" error, other oversized messages dropped), since start.
pub fn oversized_counts() -> (u64, u64) {
    (
        OVERSIZED_ANSWERS.load(Ordering::Relaxed),
        OVERSIZED_DROPPED.load(Ordering::Relaxed),
    )
}

/// The size and limit of a synthesized "too large" error, if `data` is one.
pub fn too_large(code: i32, data: Option<&serde_json::Value>) -> Option<(u64, u64)> {
    if code != TOO_LARGE {
        return None;
    }
    let info = data?.get("tetherTooLarge")?;
    Some((info.get("size")?.as_u64()?, info.get("limit")?.as_u64()?))
}

/// The `data` of a "too large" error, as [`too_large`] reads it.
pub fn too_large_data(size: u64, limit: u64) -> serde_json::Value {
    serde_json::json!({"tetherTooLarge": {"size": size, "limit": limit}})
}

/// The "too large" error answering the request `id`; `size` 0: not known.
pub fn too_large_error(id: impl serde::Serialize, size: u64, limit: u64) -> serde_json::Value {
    let what = match size {
        0 => "the answer".to_string(),
        size => format!("the answer ({})", describe_size(size)),
    };
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": TOO_LARGE,
            "message": format!("{what} is larger than the limit ({})", describe_size(limit)),
            "data": too_large_data(size, limit),
        }
    })
}

/// Sizes in words: "16 MiB", "512 KiB", "2.9 MiB".
pub fn describe_size(bytes: u64) -> String {
    match bytes {
        0 => "0 B".into(),
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => bytesize::ByteSize::b(b).display().iec().to_string(),
    }
}

/// Whether an event's data is what the filter left of an event it cut off: the part that had
/// already passed, made unparsable by a NUL at its end.
pub fn spoiled(data: &str) -> bool {
    data.ends_with('\0')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Newline-delimited JSON-RPC (stdio).
    Lines,
    /// Server-sent events: lines, an empty line ends an event (legacy SSE, a tool call's
    /// streamed answer on Streamable HTTP).
    SseEvents,
}

/// Raised when a frame crosses the limit, for a reader that waits on one frame in particular
/// (legacy SSE's `endpoint` event) and must not wait for a frame that will never come.
#[derive(Debug, Default)]
pub struct Oversized {
    seen: std::sync::atomic::AtomicBool,
    raised: tokio::sync::Notify,
}

impl Oversized {
    fn raise(&self) {
        self.seen.store(true, Ordering::SeqCst);
        self.raised.notify_waiters();
    }

    /// Resolves once a frame crossed the limit.
    pub async fn seen(&self) {
        loop {
            let raised = self.raised.notified();
            if self.seen.load(Ordering::SeqCst) {
                return;
            }
            raised.await;
        }
    }
}

/// What [`FrameLimiter::feed_frame`] did with a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the chunk it took.
    pub taken: usize,
    /// Whether they ended a frame.
    pub ended: bool,
    /// Whether what it appended is exactly those bytes.
    pub unchanged: bool,
}

/// See the module documentation. Feed it bytes in order; it appends what to pass on.
#[derive(Debug)]
pub struct FrameLimiter {
    framing: Framing,
    limit: usize,
    /// Bytes of the current frame seen so far (passed or dropped).
    frame_len: usize,
    /// Whether what passed of the current frame ends with a line's end.
    passed_line_end: bool,
    /// The first [`KEEP`] bytes of the current frame.
    head: Vec<u8>,
    /// While dropping an oversized frame: its last [`KEEP`] bytes so far.
    tail: Option<Vec<u8>>,
    /// Whether the oversized frame was already answered (its id was at its start).
    answered: bool,
    /// The previous byte, for `\r\n` and for empty lines across chunks.
    prev: u8,
    /// SSE: whether the current line is empty so far.
    line_empty: bool,
    /// Told when a frame crosses the limit.
    oversized: std::sync::Arc<Oversized>,
}

impl FrameLimiter {
    pub fn new(framing: Framing, limit: usize) -> Self {
        Self {
            framing,
            limit: limit.max(1),
            frame_len: 0,
            passed_line_end: false,
            head: Vec::new(),
            tail: None,
            answered: false,
            prev: b'\n',
            line_empty: true,
            oversized: Default::default(),
        }
    }

    /// Filters `chunk`, appending what the reader should see to `out`.
    #[cfg(test)]
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) {
        while !chunk.is_empty() {
            let fed = self.feed_frame(chunk, out);
            chunk = &chunk[fed.taken..];
        }
    }

    /// Filters `chunk` up to the end of the current frame (all of it if the frame goes on),
    /// appending what the reader should see to `out`.
    pub fn feed_frame(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> Fed {
        self.filter_frame(chunk, out, true)
    }

    /// [`Self::feed_frame`] for bytes already where the reader will take them: what passes
    /// unchanged stays there and nothing is appended; what replaces the frame (when `unchanged`
    /// is false, none of `chunk` passed) is appended to `replacement`.
    pub fn check_frame(&mut self, chunk: &[u8], replacement: &mut Vec<u8>) -> Fed {
        self.filter_frame(chunk, replacement, false)
    }

    /// [`Self::feed_frame`]; with `copy_passed` false, a frame that passes unchanged is not
    /// appended (the caller passes those bytes itself): only what replaces a frame is.
    fn filter_frame(&mut self, chunk: &[u8], out: &mut Vec<u8>, copy_passed: bool) -> Fed {
        let end = self.frame_end(chunk);
        let piece = &chunk[..end.unwrap_or(chunk.len())];
        let mut unchanged = self.take(piece, out, copy_passed);
        if end.is_some() {
            unchanged &= self.end_frame(out);
        }
        Fed {
            taken: piece.len(),
            ended: end.is_some(),
            unchanged,
        }
    }

    /// Where the current frame ends in `chunk` (exclusive), if it does.
    fn frame_end(&mut self, chunk: &[u8]) -> Option<usize> {
        match self.framing {
            Framing::Lines => memchr::memchr(b'\n', chunk).map(|i| i + 1),
            Framing::SseEvents => {
                let mut at = 0;
                while let Some(found) = memchr::memchr2(b'\r', b'\n', &chunk[at..]) {
                    let i = at + found;
                    if i > at {
                        // A line's text: the line is not empty.
                        self.line_empty = false;
                        self.prev = chunk[i - 1];
                    }
                    let byte = chunk[i];
                    let prev = std::mem::replace(&mut self.prev, byte);
                    // The `\n` of a `\r\n` ends nothing new.
                    if !(byte == b'\n' && prev == b'\r') {
                        if self.line_empty {
                            // A `\r\n` ending the event belongs to it (when in this chunk).
                            if byte == b'\r' && chunk.get(i + 1) == Some(&b'\n') {
                                self.prev = b'\n';
                                return Some(i + 2);
                            }
                            return Some(i + 1);
                        }
                        self.line_empty = true;
                    }
                    at = i + 1;
                }
                if at < chunk.len() {
                    self.line_empty = false;
                    self.prev = chunk[chunk.len() - 1];
                }
                None
            }
        }
    }

    /// Passes `piece` on, or keeps what is needed of it; true when it passed.
    fn take(&mut self, piece: &[u8], out: &mut Vec<u8>, copy_passed: bool) -> bool {
        let mut passed = false;
        if self.head.len() < KEEP {
            let room = KEEP - self.head.len();
            self.head.extend_from_slice(&piece[..piece.len().min(room)]);
        }
        if let Some(tail) = &mut self.tail {
            keep_tail(tail, piece);
        } else if self.frame_len + piece.len() > self.limit {
            // Crossing the limit: spoil what already passed, drop the rest of the frame.
            if self.frame_len > 0 {
                out.extend_from_slice(match self.framing {
                    Framing::Lines => b"\0\n",
                    // A line's end first only where the passed part stops inside a line: an
                    // empty line there would end the event early.
                    Framing::SseEvents if self.passed_line_end => b"data: \0\n\n",
                    // The cut line ends with a NUL too: readers ignore an `id:` or `retry:`
                    // holding one (it would name the wrong event), and cut data stays spoiled.
                    Framing::SseEvents => b"\0\ndata: \0\n\n",
                });
            }
            let mut tail = Vec::new();
            keep_tail(&mut tail, piece);
            self.tail = Some(tail);
            self.oversized.raise();
            // With the id at its start, the waiting call fails now, not when (if ever) it ends.
            if let Head::Answer(Some(id)) = read_head(&self.head) {
                self.answered = true;
                self.answer_too_large(id, 0, &mut Vec::new(), out);
            }
        } else {
            if copy_passed {
                out.extend_from_slice(piece);
            }
            self.passed_line_end = matches!(piece.last(), Some(b'\n' | b'\r'));
            passed = true;
        }
        self.frame_len += piece.len();
        passed
    }

    /// Ends the current frame; true when it was within the limit (nothing to add).
    fn end_frame(&mut self, out: &mut Vec<u8>) -> bool {
        let within = self.tail.is_none();
        if let Some(tail) = self.tail.take() {
            // An event's own `id:` and `retry:` lines, written as they came (one per line).
            let (message_end, mut fields) = match self.framing {
                Framing::Lines => (tail.len(), Vec::new()),
                Framing::SseEvents => event_fields(&self.head, &tail),
            };
            if !std::mem::take(&mut self.answered) {
                let (from_server, id) = match read_head(&self.head) {
                    Head::Answer(id) => (false, id),
                    Head::FromServer(id) => (true, id),
                };
                match (from_server, id.or_else(|| id_at_end(&tail[..message_end]))) {
                    (false, Some(id)) => {
                        self.answer_too_large(id, self.frame_len, &mut fields, out);
                    }
                    (from_server, request) => {
                        OVERSIZED_DROPPED.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            size = self.frame_len,
                            limit = self.limit,
                            from_server,
                            "dropped a message larger than max_message that answers no request"
                        );
                        // A request of the server's: it is told why no answer comes.
                        if let Some(id) = request {
                            self.request_too_large(id, self.frame_len, &mut fields, out);
                        }
                    }
                }
            }
            // Not carried by an event that replaced this one: an event of their own. A stream
            // picked up again then starts after this event, not with it.
            if !fields.is_empty() {
                out.extend_from_slice(&fields);
                out.push(b'\n');
            }
        }
        self.frame_len = 0;
        self.head.clear();
        within
    }

    /// Puts in the output, in place of the server's request `id` that was too large, a request
    /// of the same id that the upstream's handler answers with a "too large" error
    /// ([`TOO_LARGE_REQUEST`]): the server hears why, instead of waiting for an answer.
    fn request_too_large(
        &self,
        id: serde_json::Value,
        size: usize,
        fields: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) {
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": TOO_LARGE_REQUEST,
            "params": {"size": size, "limit": self.limit},
        });
        self.put(&request.to_string(), fields, out);
    }

    /// Puts a "too large" error for `id` in the output; `size` 0: not known yet.
    fn answer_too_large(
        &self,
        id: serde_json::Value,
        size: usize,
        fields: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) {
        OVERSIZED_ANSWERS.fetch_add(1, Ordering::Relaxed);
        let error = too_large_error(id, size as u64, self.limit as u64);
        self.put(&error.to_string(), fields, out);
    }

    /// Puts one JSON-RPC message in the output, framed; an event takes `fields` (the `id:` and
    /// `retry:` lines of the event it replaces).
    fn put(&self, json: &str, fields: &mut Vec<u8>, out: &mut Vec<u8>) {
        match self.framing {
            Framing::Lines => {
                out.extend_from_slice(json.as_bytes());
                out.push(b'\n');
            }
            Framing::SseEvents => {
                out.extend_from_slice(b"event: message\n");
                out.append(fields);
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(json.as_bytes());
                out.extend_from_slice(b"\n\n");
            }
        }
    }
}

fn keep_tail(tail: &mut Vec<u8>, piece: &[u8]) {
    if piece.len() >= KEEP {
        tail.clear();
        tail.extend_from_slice(&piece[piece.len() - KEEP..]);
    } else {
        tail.extend_from_slice(piece);
        if tail.len() > KEEP {
            tail.drain(..tail.len() - KEEP);
        }
    }
}

/// What the start of an oversized frame says about it.
enum Head {
    /// A top-level `method`: a request or notification from the server, not an answer; a
    /// request's id when the start names it.
    FromServer(Option<serde_json::Value>),
    /// An answer; its id when the start names it.
    Answer(Option<serde_json::Value>),
}

/// Serializers put the top-level `id` either before `result`/`error`
/// (`{"jsonrpc":"2.0","id":7,"result":…`) or last (`{"result":…,"jsonrpc":"2.0","id":7}`);
/// top-level keys are those before the first nested value opens.
fn read_head(head: &[u8]) -> Head {
    let Some(start) = head.iter().position(|&b| b == b'{') else {
        return Head::Answer(None);
    };
    let top = &head[start + 1..];
    let nested = top
        .iter()
        .position(|&b| b == b'{' || b == b'[')
        .unwrap_or(top.len());
    let top_level = &top[..nested];
    let id = find(top_level, b"\"id\"")
        .and_then(|key| id_value(&top_level[key + 4..]))
        // Digits that run to where the kept start ends may be cut short: `1073741830` kept as
        // `10737418` would fail another call.
        .filter(|(_, rest)| !rest.is_empty() || nested < top.len())
        .map(|(id, _)| id);
    // Only requests and notifications have `method` and `params`: a server that writes its
    // params before its method has the params open the first nested value.
    let from_server = find(top_level, b"\"method\"").is_some()
        || find(top_level, b"\"params\"").is_some();
    match from_server {
        true => Head::FromServer(id),
        false => Head::Answer(id),
    }
}

/// The top-level id written last, just before the closing brace.
fn id_at_end(tail: &[u8]) -> Option<serde_json::Value> {
    let end = tail.iter().rposition(|b| !b.is_ascii_whitespace())?;
    let tail = &tail[..=end];
    let key = rfind(tail, b"\"id\"")?;
    let (id, rest) = id_value(&tail[key + 4..])?;
    (rest
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .eq(*b"}"))
    .then_some(id)
}

/// What a line of an event is to [`event_fields`].
enum EventLine {
    Data,
    /// `id:` or `retry:`: passed on even when the event is dropped.
    Kept,
    Other,
}

fn event_line(line: &[u8]) -> EventLine {
    if line.starts_with(b"data:") || line == b"data" {
        EventLine::Data
    } else if line.starts_with(b"id:") || line.starts_with(b"retry:") {
        EventLine::Kept
    } else {
        EventLine::Other
    }
}

/// Of an oversized event, from its kept start and end: where its message ends in `tail` (after
/// its last data line, where a JSON-RPC id written last is), and its `id:` and `retry:` lines
/// before its first data line (as the TypeScript SDK writes them) and after its last (as rmcp's
/// `sse-stream` writes them), each ending with a line feed. A line cut off where the kept bytes
/// end is not read: the last of `head`, the first of `tail` (which counts as data).
fn event_fields(head: &[u8], tail: &[u8]) -> (usize, Vec<u8>) {
    let is_line_end = |byte: &u8| matches!(byte, b'\r' | b'\n');
    let mut fields = Vec::new();
    let whole = head.iter().rposition(is_line_end).map_or(&head[..0], |end| &head[..end]);
    for line in whole.split(is_line_end) {
        match event_line(line) {
            EventLine::Data => break,
            EventLine::Kept => fields.extend_from_slice(line),
            EventLine::Other => continue,
        }
        fields.push(b'\n');
    }
    // From the end back to the last data line.
    let mut after = Vec::new();
    let mut end = tail.len();
    let message_end = loop {
        let line_end = tail[..end].iter().rposition(|b| !is_line_end(b)).map_or(0, |i| i + 1);
        let start = tail[..line_end].iter().rposition(is_line_end).map_or(0, |i| i + 1);
        let line = &tail[start..line_end];
        match (start, event_line(line)) {
            (0, _) | (_, EventLine::Data) => break line_end,
            (_, EventLine::Kept) => after.push(line),
            (_, EventLine::Other) => {}
        }
        end = start;
    };
    for line in after.iter().rev() {
        fields.extend_from_slice(line);
        fields.push(b'\n');
    }
    (message_end, fields)
}

/// `: 7` or `: "abc"` at the start of `text`: the id and what follows it.
fn id_value(text: &[u8]) -> Option<(serde_json::Value, &[u8])> {
    let text = trim_start(text).strip_prefix(b":")?;
    let text = trim_start(text);
    if let Some(rest) = text.strip_prefix(b"\"") {
        let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
        (rest[end] == b'"').then_some(())?;
        let id = std::str::from_utf8(&rest[..end]).ok()?;
        return Some((serde_json::Value::String(id.into()), &rest[end + 1..]));
    }
    let end = text
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'-'))
        .unwrap_or(text.len());
    // `1.5` or `1e3` is no id of ours: read as 1, it could fail another call.
    let rest = &text[end..];
    if !rest
        .first()
        .is_none_or(|b| matches!(b, b',' | b'}') || b.is_ascii_whitespace())
    {
        return None;
    }
    let number: i64 = std::str::from_utf8(&text[..end]).ok()?.parse().ok()?;
    Some((number.into(), rest))
}

fn trim_start(text: &[u8]) -> &[u8] {
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    &text[start..]
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// An SSE body with its events bounded (see [`FrameLimiter`]).
pub struct BoundedEvents<S> {
    inner: S,
    limiter: FrameLimiter,
}

impl<S> BoundedEvents<S> {
    pub fn new(inner: S, limit: usize) -> Self {
        Self {
            inner,
            limiter: FrameLimiter::new(Framing::SseEvents, limit),
        }
    }

    /// Told when an event crosses the limit.
    pub fn oversized(&self) -> std::sync::Arc<Oversized> {
        self.limiter.oversized.clone()
    }
}

impl<S, E> Stream for BoundedEvents<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match std::task::ready!(Pin::new(&mut this.inner).poll_next(cx)) {
                Some(Ok(chunk)) => {
                    // Events within the limit pass as they came, without a copy; a chunk is
                    // rebuilt only where an event in it was cut off or replaced.
                    let mut rebuilt: Option<Vec<u8>> = None;
                    let mut replacement = Vec::new();
                    let mut at = 0;
                    while at < chunk.len() {
                        let fed = this.limiter.filter_frame(&chunk[at..], &mut replacement, false);
                        let piece = &chunk[at..at + fed.taken];
                        match (&mut rebuilt, fed.unchanged) {
                            (None, true) => {}
                            (Some(rebuilt), true) => rebuilt.extend_from_slice(piece),
                            (rebuilt, false) => rebuilt
                                .get_or_insert_with(|| chunk[..at].to_vec())
                                .append(&mut replacement),
                        }
                        replacement.clear();
                        at += fed.taken;
                    }
                    match rebuilt {
                        None if !chunk.is_empty() => return Poll::Ready(Some(Ok(chunk))),
                        Some(rebuilt) if !rebuilt.is_empty() => {
                            return Poll::Ready(Some(Ok(Bytes::from(rebuilt))));
                        }
                        _ => {}
                    }
                }
                other => return Poll::Ready(other),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(framing: Framing, limit: usize, chunks: &[&[u8]]) -> String {
        let mut limiter = FrameLimiter::new(framing, limit);
        let mut out = Vec::new();
        for chunk in chunks {
            limiter.feed(chunk, &mut out);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn big(n: usize) -> String {
        "x".repeat(n)
    }

    #[test]
    fn lines_within_the_limit_pass_unchanged_in_any_chunking() {
        let text = "{\"id\":1}\n{\"id\":2}\n";
        for split in 0..text.len() {
            let (a, b) = text.as_bytes().split_at(split);
            assert_eq!(run(Framing::Lines, 64, &[a, b]), text);
        }
    }

    #[test]
    fn a_frame_at_a_time_says_where_it_ended_and_whether_it_passed_unchanged() {
        let mut limiter = FrameLimiter::new(Framing::Lines, 16);
        let mut out = Vec::new();
        let fed = |taken, ended, unchanged| Fed {
            taken,
            ended,
            unchanged,
        };
        let chunk = b"{\"id\":1}\n{\"id\"";
        assert_eq!(limiter.feed_frame(chunk, &mut out), fed(9, true, true));
        assert_eq!(limiter.feed_frame(&chunk[9..], &mut out), fed(5, false, true));
        let long = b":2,\"result\":\"long enough\"}\n";
        assert_eq!(limiter.feed_frame(long, &mut out), fed(long.len(), true, false));
        assert_eq!(limiter.feed_frame(b"{}\n", &mut out), fed(3, true, true));
    }

    #[test]
    fn an_oversized_answer_becomes_a_too_large_error_for_its_id() {
        let answer = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"text\":\"{}\"}}}}\n",
            big(5000)
        );
        let (start, rest) = answer.as_bytes().split_at(100);
        let out = run(Framing::Lines, 1024, &[start, rest, b"{\"id\":8}\n"]);
        let lines: Vec<&str> = out.lines().collect();
        // The first line is the spoiled prefix (never valid JSON), then the error, then the next.
        assert!(serde_json::from_str::<serde_json::Value>(lines[0]).is_err());
        let error: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["code"], TOO_LARGE);
        let data = error["error"].get("data");
        // The id was at the start: answered as soon as the limit was crossed, size unknown.
        assert_eq!(too_large(TOO_LARGE, data), Some((0, 1024)));
        assert_eq!(lines[2], "{\"id\":8}");
    }

    /// An id whose digits run past the start kept of an oversized answer is not read from
    /// the cut digits, which could name another call.
    #[test]
    fn an_id_cut_by_the_kept_start_names_no_call() {
        let prefix = "{\"jsonrpc\":\"2.0\",\"pad\":\"";
        // The kept start ends three digits into the id.
        let pad = big(KEEP - prefix.len() - "\",\"id\":".len() - 3);
        let answer = format!(
            "{prefix}{pad}\",\"id\":1073741830,\"result\":{{\"text\":\"{}\"}}}}\n",
            big(3000)
        );
        assert_eq!(&answer[KEEP - 3..KEEP], "107");
        let out = run(Framing::Lines, 1000, &[answer.as_bytes()]);
        for line in out.lines() {
            let message = serde_json::from_str::<serde_json::Value>(line).unwrap_or_default();
            assert_ne!(message["id"], 107, "{line}");
        }
    }

    #[test]
    fn the_id_is_found_at_the_end_too() {
        let answer = format!(
            "{{\"result\":{{\"content\":[{{\"id\":99,\"text\":\"{}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":\"abc\"}}\r\n",
            big(3000)
        );
        // One byte at a time: the frame crosses the limit mid-chunk anywhere.
        let bytes: Vec<&[u8]> = answer.as_bytes().chunks(1).collect();
        let out = run(Framing::Lines, 1000, &bytes);
        let error: serde_json::Value = serde_json::from_str(out.lines().nth(1).unwrap()).unwrap();
        assert_eq!(error["id"], "abc");
    }

    #[test]
    fn oversized_notifications_and_unknown_frames_are_dropped() {
        let notification = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{}\",\"id\":3}}}}\n",
            big(4000)
        );
        let out = run(Framing::Lines, 1000, &[notification.as_bytes()]);
        assert_eq!(out, "");
        let endless = big(10_000);
        let out = run(
            Framing::Lines,
            1000,
            &[b"{", endless.as_bytes(), b"\n", b"{}\n"],
        );
        assert_eq!(out, "{\0\n{}\n");
    }

    #[test]
    fn a_line_without_end_holds_only_the_kept_bytes() {
        let mut limiter = FrameLimiter::new(Framing::Lines, 1000);
        let chunk = big(64 << 10);
        let mut out = Vec::new();
        for _ in 0..100 {
            limiter.feed(chunk.as_bytes(), &mut out);
            out.clear();
        }
        assert!(limiter.head.capacity() <= 4 * KEEP);
        assert!(limiter.tail.as_ref().unwrap().capacity() <= 4 * KEEP + (64 << 10));
    }

    #[test]
    fn sse_events_are_bounded_and_answered() {
        let small = "event: message\ndata: {\"id\":1}\n\n";
        assert_eq!(run(Framing::SseEvents, 100, &[small.as_bytes()]), small);
        // A multi-line event over the limit, with CRLF line ends.
        let event = format!(
            "event: message\r\ndata: {{\"jsonrpc\":\"2.0\",\"id\":4,\r\ndata: \"result\":\"{}\"}}\r\n\r\n",
            big(500)
        );
        let (start, rest) = event.as_bytes().split_at(60);
        let out = run(Framing::SseEvents, 200, &[start, rest, small.as_bytes()]);
        let events: Vec<&str> = out.split("\n\n").collect();
        assert!(events[0].ends_with("data: \0"), "{:?}", events[0]);
        let data = events[1].strip_prefix("event: message\ndata: ").unwrap();
        let error: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(error["id"], 4);
        assert_eq!(format!("{}\n\n", events[2]), small);
    }

    /// Where events end in `text` fed in two chunks split at `split`, as offsets into it.
    fn event_ends(text: &[u8], split: usize) -> Vec<usize> {
        let mut limiter = FrameLimiter::new(Framing::SseEvents, 1 << 20);
        let mut ends = Vec::new();
        let mut offset = 0;
        for mut chunk in [&text[..split], &text[split..]] {
            while !chunk.is_empty() {
                let fed = limiter.feed_frame(chunk, &mut Vec::new());
                offset += fed.taken;
                if fed.ended {
                    ends.push(offset);
                }
                chunk = &chunk[fed.taken..];
            }
        }
        ends
    }

    #[test]
    fn sse_events_end_at_empty_lines_of_every_kind_in_any_chunking() {
        // LF, CRLF and lone CR line ends; a comment; an event of an empty data line.
        let text = b"data: a\n\nid: 2\r\ndata: b\r\n\r\n: comment\rdata: c\r\rdata:\n\n";
        for split in 0..=text.len() {
            // The `\r\n` that ends an event belongs to it unless a chunk ends between the two.
            let expected = match split {
                26 => vec![9, 26, 46, 53],
                _ => vec![9, 27, 46, 53],
            };
            assert_eq!(event_ends(text, split), expected, "split at {split}");
        }
    }

    /// The byte-at-a-time search `frame_end` replaced, as a reference: (prev, line_empty) in,
    /// where the frame ends out.
    fn frame_end_byte_by_byte(state: &mut (u8, bool), chunk: &[u8]) -> Option<usize> {
        for (i, &byte) in chunk.iter().enumerate() {
            let prev = std::mem::replace(&mut state.0, byte);
            match byte {
                b'\n' if prev == b'\r' => {}
                b'\r' | b'\n' => {
                    if state.1 {
                        if byte == b'\r' && chunk.get(i + 1) == Some(&b'\n') {
                            state.0 = b'\n';
                            return Some(i + 2);
                        }
                        return Some(i + 1);
                    }
                    state.1 = true;
                }
                _ => state.1 = false,
            }
        }
        None
    }

    #[test]
    fn sse_event_ends_are_those_of_a_byte_by_byte_search() {
        // Every text of up to 7 bytes of `a`, CR and LF, cut at every point.
        for length in 0..=7u32 {
            for code in 0..3usize.pow(length) {
                let text: Vec<u8> = (0..length)
                    .map(|digit| b"a\r\n"[code / 3usize.pow(digit) % 3])
                    .collect();
                for cut in 0..=text.len() {
                    let mut ours = FrameLimiter::new(Framing::SseEvents, 1 << 20);
                    let mut reference = (b'\n', true);
                    for mut chunk in [&text[..cut], &text[cut..]] {
                        while !chunk.is_empty() {
                            let end = ours.frame_end(chunk);
                            let expected = frame_end_byte_by_byte(&mut reference, chunk);
                            assert_eq!(end, expected, "{text:?} cut at {cut}");
                            assert_eq!((ours.prev, ours.line_empty), reference, "{text:?} at {cut}");
                            chunk = &chunk[end.unwrap_or(chunk.len())..];
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_event_cut_off_after_a_whole_line_is_not_ended_early() {
        // The passed part ends with a line's end: the spoiler must not add an empty line.
        let start = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\n";
        let rest = format!("data: \"result\":\"{}\"}}\n\n", big(300));
        let out = run(Framing::SseEvents, 100, &[start.as_bytes(), rest.as_bytes()]);
        let events: Vec<&str> = out.split("\n\n").collect();
        assert!(events[0].starts_with(start) && events[0].ends_with("\ndata: \0"), "{out:?}");
        assert!(events[1].contains("\"id\":3"), "{out:?}");
    }

    async fn bounded(chunks: Vec<Bytes>, limit: usize) -> Vec<Bytes> {
        use futures::StreamExt;
        let source = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        BoundedEvents::new(source, limit).collect::<Vec<_>>().await
            .into_iter()
            .map(Result::unwrap)
            .collect()
    }

    #[tokio::test]
    async fn events_within_the_limit_pass_without_a_copy() {
        let chunk = Bytes::from_static(b"data: {\"id\":1}\n\ndata: {\"id\":2,");
        let out = bounded(vec![chunk.clone(), Bytes::from_static(b"\"x\":0}\n\n")], 64).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ptr(), chunk.as_ptr(), "the same bytes, not a copy");
        assert_eq!(out[0], chunk);
    }

    /// A request of the server's over the limit is replaced by the stand-in of the same id
    /// (id first or last, in lines or events); a notification is only dropped.
    #[test]
    fn an_oversized_request_from_the_server_becomes_a_stand_in_of_the_same_id() {
        let params = format!("{{\"text\":\"{}\"}}", big(2000));
        let first = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"s-1\",\"method\":\"sampling/createMessage\",\"params\":{params}}}");
        let last = format!("{{\"method\":\"elicitation/create\",\"params\":{params},\"jsonrpc\":\"2.0\",\"id\":9}}");
        let notice = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{params}}}");
        // Params first: nothing names the method before the first nested value.
        let params_first = format!("{{\"params\":{params},\"method\":\"roots/list\",\"jsonrpc\":\"2.0\",\"id\":4}}");
        // The id first, then the params, the method last: the id is the server's, not an
        // answer's (a "too large" answer would fail Tether's own request 5).
        let method_last = format!("{{\"jsonrpc\":\"2.0\",\"id\":5,\"params\":{params},\"method\":\"sampling/createMessage\"}}");
        let cases = [
            (&first, Some(json!("s-1"))),
            (&last, Some(json!(9))),
            (&params_first, Some(json!(4))),
            (&method_last, Some(json!(5))),
            (&notice, None),
        ];
        for (message, id) in cases {
            let line = format!("{message}\n");
            let event = format!("data: {message}\nid: 3\n\n");
            for (framing, text) in [(Framing::Lines, line), (Framing::SseEvents, event)] {
                let out = run(framing, 500, &[&text.as_bytes()[..300], &text.as_bytes()[300..]]);
                let stand_in = out
                    .split(['\n'])
                    .map(|line| line.strip_prefix("data: ").unwrap_or(line))
                    .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                    .find(|message| message["method"] == TOO_LARGE_REQUEST);
                // Never a "too large" answer: that would fail a call of Tether's with the id.
                assert!(!out.contains(&TOO_LARGE.to_string()), "{framing:?}: {out:?}");
                match &id {
                    Some(id) => {
                        let stand_in = stand_in.unwrap_or_else(|| panic!("{framing:?}: {out:?}"));
                        assert_eq!(&stand_in["id"], id);
                        assert_eq!(stand_in["params"]["limit"], 500);
                        assert!(stand_in["params"]["size"].as_u64().unwrap() > 2000);
                    }
                    None => assert!(stand_in.is_none(), "{framing:?}: {out:?}"),
                }
            }
        }
    }

    /// As servers on rmcp's `sse-stream` write an event: the data, then its id. The answer's
    /// JSON-RPC id written last is still found, and the event's own id and retry interval
    /// reach the reader (a stream picked up again after it must not start with it again).
    #[tokio::test]
    async fn an_oversized_events_own_id_still_reaches_the_reader() {
        let answer = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"result\":\"{}\",\"id\":7}}\nid: e43\nretry: 5\n\n",
            big(3000)
        );
        let notice = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":\"{}\"}}\r\nid: e44\r\n\r\n",
            big(3000)
        );
        let small = "data: {\"id\":1}\nid: e45\n\n";
        let events = read_bounded(&format!("{answer}{notice}{small}"), 700, 1000).await;
        let ids: Vec<_> = events.iter().map(|event| event.id.as_deref()).collect();
        let error = events
            .iter()
            .filter_map(|event| serde_json::from_str::<serde_json::Value>(event.data.as_deref()?).ok())
            .find(|message| message["error"]["code"] == TOO_LARGE)
            .expect("a too-large answer");
        assert_eq!(error["id"], 7);
        assert_eq!(ids.iter().flatten().copied().collect::<Vec<_>>(), ["e43", "e44", "e45"]);
        assert!(events.iter().any(|event| event.retry == Some(5)));
        assert_eq!(events.last().unwrap().data.as_deref(), Some("{\"id\":1}"));
    }

    /// The events a reader makes of `text` bounded to `limit`, fed in chunks of `chunk` bytes.
    async fn read_bounded(text: &str, chunk: usize, limit: usize) -> Vec<sse_stream::Sse> {
        use futures::StreamExt;
        let chunks: Vec<_> = text
            .as_bytes()
            .chunks(chunk)
            .map(|piece| Ok::<_, std::io::Error>(Bytes::copy_from_slice(piece)))
            .collect();
        let body = BoundedEvents::new(futures::stream::iter(chunks), limit);
        crate::transport::event_stream::events(body)
            .map(|event| event.unwrap())
            .collect()
            .await
    }

    /// The TypeScript SDK writes an event's id before its data: when the event's first bytes
    /// already cross the limit, that id still reaches the reader. An `id:` line cut where the
    /// limit was crossed reaches no reader as an id (it would name another event), and a
    /// number id that is not an integer fails no call.
    #[tokio::test]
    async fn an_oversized_events_id_before_its_data_is_kept_and_a_cut_one_is_not_taken() {
        let notice = format!(
            "event: message\nid: ts-7\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":\"{}\"}}\n\n",
            big(3000)
        );
        let events = read_bounded(&format!("{notice}data: {{\"id\":1}}\n\n"), 4096, 1000).await;
        let ids: Vec<_> = events.iter().filter_map(|event| event.id.as_deref()).collect();
        assert_eq!(ids, ["ts-7"], "{events:?}");
        assert_eq!(events.last().unwrap().data.as_deref(), Some("{\"id\":1}"));
        // Crossed inside the id line: the part that passed is `id: abc`, not the event's id.
        let long_id = format!("data: {{\"jsonrpc\":\"2.0\",\"method\":\"n\"}}\nid: abc{}\n\n", big(3000));
        let events = read_bounded(&long_id, 500, 1000).await;
        assert!(events.iter().all(|event| event.id.is_none()), "{events:?}");
        // An id of 1.5 is not read as 1.
        let decimal = format!("data: {{\"jsonrpc\":\"2.0\",\"id\":1.5,\"result\":\"{}\"}}\n\n", big(3000));
        let out = run(Framing::SseEvents, 1000, &[decimal.as_bytes()]);
        assert!(!out.contains(&TOO_LARGE.to_string()), "{out:?}");
    }

    #[tokio::test]
    async fn an_oversized_event_inside_a_chunk_is_replaced_and_the_rest_passes() {
        let small = "data: {\"id\":1}\n\n";
        let oversized = format!("data: {{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\"{}\"}}\n\n", big(300));
        let chunk = Bytes::from(format!("{small}{oversized}{small}"));
        let out = bounded(vec![chunk], 100).await.concat();
        let out = String::from_utf8(out).unwrap();
        let events: Vec<&str> = out.split("\n\n").collect();
        assert_eq!(format!("{}\n\n", events[0]), small);
        let data = events[1].strip_prefix("event: message\ndata: ").unwrap();
        let error: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!((error["id"].clone(), error["error"]["code"].clone()), (7.into(), TOO_LARGE.into()));
        assert_eq!(format!("{}\n\n", events[2]), small);
        assert_eq!(events.len(), 4, "{out:?}");
    }
}
