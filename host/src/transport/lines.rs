//! Newline-delimited JSON-RPC over a pair of pipes, for both ends Tether speaks stdio on: a
//! server's child process (Tether is the client) and the agent that started `tether serve`
//! (Tether is the server).
//!
//! It reads and writes what rmcp's own line transport does: one message per line, a line no
//! longer than a bound (a longer one is dropped), a line that is not JSON ignored, a JSON value
//! that is not a message answered with Invalid Request, a notification that cannot be read
//! dropped (a notification is never answered). A server's lines are bounded by the limiter of
//! `limit.rs` instead ([`Lines::limited`]): it takes them from the read buffer into the line, so
//! a line is copied once (a long line is read straight into the line and checked there: not
//! copied at all), and an oversized answer fails its call. What differs:
//!
//! - The hot messages decode straight into their type ([`LineRole::decode_hot`]): a
//!   `tools/call` request on the agent's side, the answer to a `tools/call` on the server's.
//!   rmcp decodes a message by trying the variants of its untagged enums in turn (about thirty
//!   `serde_json` errors built per forwarded call); everything else still goes that way. A
//!   `tools/call` request is read and written in one pass ([`wire`]), where rmcp's types buffer
//!   its fields through two `#[serde(flatten)]` layers on the way in and copy its parameters
//!   into a `serde_json::Value` on the way out.
//! - Messages are written with sonic-rs, which escapes strings many bytes at a time where
//!   serde_json takes one; it writes the same bytes (tested below), so nothing else changes. The
//!   hot messages are read with it too (the same values; anything it refuses goes to rmcp's
//!   decoder as before).
//! - The answer to a `tools/call` whose client can take the server's bytes (a slot in its route)
//!   is not decoded at all when the agent would get it unchanged: its bytes go to the slot and
//!   rmcp gets a placeholder ([`raw`]).
//! - A server's `tools/call` may be written by its caller and answered straight to it, past
//!   rmcp's service loop ([`CallSender`], `lines/calls.rs`).
//! - A `tools/call` hands its arguments back through its route once its line is encoded
//!   ([`route::hand_back`]): a call that never left, or a read-only tool's call lost later, may
//!   go out again without its arguments copied before the first try.

use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};

use rmcp::RoleClient;
use rmcp::RoleServer;
use rmcp::model::{
    ClientNotification, ClientRequest, ErrorData, JsonRpcMessage, JsonRpcRequest,
    JsonRpcResponse, RequestId, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use bytes::Buf;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

use super::limit::{Fed, FrameLimiter, Framing};
use super::pipe_size::Pipe;
use super::wire;
use crate::upstream::route;

mod calls;
mod direct;
pub mod raw;
mod surrogates;

pub use calls::{CallSender, CallsReader, NoAnswer, PendingCall};
pub use direct::{Answer, Answers, Direct, DirectCalls};
use raw::RawResult;

/// The line bound where nothing else bounds it (the agent's side): rmcp's own default.
pub use rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH as DEFAULT_MAX_LINE;

/// How a role decodes its hot messages and what it remembers to do so.
pub trait LineRole: ServiceRole {
    /// What the role keeps between sending and receiving.
    type Memory: Default + Send + 'static;
    /// Notes a message about to be written.
    fn sending(item: &TxJsonRpcMessage<Self>, memory: &mut Self::Memory);
    /// The message on `line` if it is a hot one, decoded without rmcp's trials.
    fn decode_hot(line: &[u8], memory: &mut Self::Memory) -> Option<RxJsonRpcMessage<Self>>;
    /// Writes `item` to `out` if it is a hot one (same JSON as rmcp writes); false otherwise.
    fn encode_hot(item: &TxJsonRpcMessage<Self>, out: &mut Vec<u8>) -> sonic_rs::Result<bool>;
    /// Notes a message that arrived (decoded either way).
    fn received(message: &RxJsonRpcMessage<Self>, memory: &mut Self::Memory);
    /// What the service loop gets of `message` once [`Self::decode_hot`] or
    /// [`Self::received`] noted it: nothing when it answers a caller that waits for it itself
    /// (`lines/calls.rs`).
    fn answered(
        message: RxJsonRpcMessage<Self>,
        memory: &mut Self::Memory,
    ) -> Option<RxJsonRpcMessage<Self>> {
        let _ = memory;
        Some(message)
    }
    /// The other side's lines ended (or could not be read): nothing more will arrive.
    fn ended(memory: &mut Self::Memory) {
        let _ = memory;
    }
    /// The transport is done with a message it sent (encoded, or never to be): what it
    /// carried that its sender wants back.
    fn done_with(item: TxJsonRpcMessage<Self>);
    /// A result [`Self::decode_hot`] found in the line that goes to a slot (see [`raw`]).
    fn kept(memory: &mut Self::Memory) -> Option<Kept> {
        let _ = memory;
        None
    }
    /// What the service loop gets of `message` when tool calls go `direct` (`lines/direct.rs`).
    fn divert(message: RxJsonRpcMessage<Self>, direct: &Direct) -> Option<RxJsonRpcMessage<Self>> {
        let _ = direct;
        Some(message)
    }
}

/// A result to keep: its slot, and where it lies (its address in the line and its length).
pub struct Kept {
    slot: Arc<RawResult>,
    at: usize,
    len: usize,
    /// Its first byte stands for the result's `{` (see `raw::Found`).
    rebrace: bool,
}

impl LineRole for RoleClient {
    type Memory = CallsReader;

    fn sending(item: &TxJsonRpcMessage<Self>, calls: &mut CallsReader) {
        match item {
            JsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::CallToolRequest(_)) =>
            {
                let slot = crate::upstream::route::raw_slot(&request.request);
                calls.lock().insert(request.id.clone(), slot);
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    calls.lock().remove(id);
                }
            }
            _ => {}
        }
    }

    fn decode_hot(line: &[u8], reader: &mut CallsReader) -> Option<RxJsonRpcMessage<Self>> {
        // The lock is not held through a parse: callers take it to send.
        let (empty, slots) = {
            let calls = reader.lock();
            (calls.is_empty(), calls.has_slots())
        };
        if empty {
            return None;
        }
        let line = wire::Shallow::new(line)?;
        let kept = match slots {
            true => raw::read(line).and_then(|(id, result)| Some((id, result?))),
            false => None,
        };
        if let Some((id, (bytes, rebrace))) = kept {
            let call = reader.lock().remove_with_slot(&id);
            if let Some(call) = call {
                let (at, len) = (bytes.as_ptr() as usize, bytes.len());
                if let Some(slot) = reader.answering(call) {
                    reader.kept = Some(Kept {
                        slot,
                        at,
                        len,
                        rebrace,
                    });
                }
                return Some(JsonRpcMessage::Response(JsonRpcResponse {
                    jsonrpc: Default::default(),
                    id,
                    result: ServerResult::CallToolResult(raw::placeholder()),
                }));
            }
        }
        // Only an answer to a call of ours is taken as a call's result.
        let response = wire::read_call_answer(line)?;
        let call = reader.lock().remove(&response.id)?;
        reader.answering(call);
        Some(JsonRpcMessage::Response(response))
    }

    fn encode_hot(item: &TxJsonRpcMessage<Self>, out: &mut Vec<u8>) -> sonic_rs::Result<bool> {
        match item {
            JsonRpcMessage::Request(JsonRpcRequest {
                id,
                request: ClientRequest::CallToolRequest(call),
                ..
            }) => wire::write_call(id, call, out).map(|()| true),
            _ => Ok(false),
        }
    }

    fn kept(reader: &mut CallsReader) -> Option<Kept> {
        reader.kept.take()
    }

    fn received(message: &RxJsonRpcMessage<Self>, reader: &mut CallsReader) {
        let id = match message {
            JsonRpcMessage::Response(response) => &response.id,
            JsonRpcMessage::Error(error) => match &error.id {
                Some(id) => id,
                None => return,
            },
            _ => return,
        };
        let call = reader.lock().remove(id);
        if let Some(call) = call {
            reader.answering(call);
        }
    }

    fn answered(
        message: RxJsonRpcMessage<Self>,
        reader: &mut CallsReader,
    ) -> Option<RxJsonRpcMessage<Self>> {
        reader.hand_over(message)
    }

    fn ended(reader: &mut CallsReader) {
        reader.close();
    }

    fn done_with(item: TxJsonRpcMessage<Self>) {
        route::hand_back(item);
    }
}

impl LineRole for RoleServer {
    type Memory = ();

    fn sending(_: &TxJsonRpcMessage<Self>, _: &mut ()) {}

    fn decode_hot(line: &[u8], _: &mut ()) -> Option<RxJsonRpcMessage<Self>> {
        // A byte search first: a failed typed decode of another message costs more. The
        // searcher is made once: making one costs more than searching a short line.
        static TOOLS_CALL: LazyLock<memchr::memmem::Finder<'static>> =
            LazyLock::new(|| memchr::memmem::Finder::new(b"\"tools/call\""));
        TOOLS_CALL.find(line)?;
        let (id, call) = wire::read_call(wire::Shallow::new(line)?)?;
        Some(JsonRpcMessage::Request(JsonRpcRequest::new(
            id,
            ClientRequest::CallToolRequest(call),
        )))
    }

    fn encode_hot(_: &TxJsonRpcMessage<Self>, _: &mut Vec<u8>) -> sonic_rs::Result<bool> {
        Ok(false)
    }

    fn received(_: &RxJsonRpcMessage<Self>, _: &mut ()) {}

    fn done_with(_: TxJsonRpcMessage<Self>) {}

    fn divert(message: RxJsonRpcMessage<Self>, direct: &Direct) -> Option<RxJsonRpcMessage<Self>> {
        direct::divert(message, direct)
    }
}

/// What a line turned out to be.
enum Decoded<Role: ServiceRole> {
    Message(RxJsonRpcMessage<Role>),
    /// Not JSON, or a notification that cannot be read: nothing to answer.
    Ignored,
    /// JSON but not a message of this role: answered with Invalid Request.
    Invalid,
}

fn decode<Role: LineRole>(line: &[u8], memory: &mut Role::Memory) -> Decoded<Role> {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if let Some(message) = Role::decode_hot(line, memory) {
        return Decoded::Message(message);
    }
    decode_typed::<Role>(line, memory)
}

/// `line` decoded into rmcp's types. (Not by the hot path: what it keeps of a line points into
/// the line's own buffer, and a repaired line is a copy.)
fn decode_typed<Role: LineRole>(line: &[u8], memory: &mut Role::Memory) -> Decoded<Role> {
    match serde_json::from_slice::<RxJsonRpcMessage<Role>>(line) {
        Ok(message) => {
            Role::received(&message, memory);
            Decoded::Message(message)
        }
        Err(error) if error.is_syntax() || error.is_eof() => {
            // Read as JavaScript and Python read it, with U+FFFD for what cannot be text.
            if let Some(repaired) = surrogates::replace_lone(line) {
                tracing::debug!("a line with unpaired UTF-16 surrogate escapes, read with U+FFFD");
                return decode_typed::<Role>(&repaired, memory);
            }
            tracing::debug!("ignoring a line that is not JSON: {error}");
            Decoded::Ignored
        }
        Err(error) => {
            let ignored = serde_json::from_slice::<serde_json::Value>(line)
                .is_ok_and(|value| ignored_as_rmcp_ignores_it(&value));
            match ignored {
                true => {
                    tracing::debug!("ignoring a notification that cannot be read: {error}");
                    Decoded::Ignored
                }
                false => {
                    tracing::debug!("not a JSON-RPC message: {error}");
                    Decoded::Invalid
                }
            }
        }
    }
}

/// Whether a message that cannot be read is ignored, as rmcp's line codec ignores it, rather
/// than answered as an invalid request: a notification of a method MCP does not have (another
/// protocol's, such as LSP's), or a message naming a notification MCP does not have.
fn ignored_as_rmcp_ignores_it(message: &serde_json::Value) -> bool {
    let Some(method) = message.get("method").and_then(serde_json::Value::as_str) else {
        return false;
    };
    let notification = message.get("id").is_none();
    (notification && !mcp_method(method))
        || (method.starts_with("notifications/") && !mcp_notification(method))
}

/// The requests and notifications of MCP (both generations).
fn mcp_method(method: &str) -> bool {
    mcp_notification(method)
        || matches!(
            method,
            "initialize"
                | "ping"
                | "server/discover"
                | "prompts/get"
                | "prompts/list"
                | "resources/list"
                | "resources/read"
                | "resources/subscribe"
                | "resources/unsubscribe"
                | "resources/templates/list"
                | "subscriptions/listen"
                | "tools/call"
                | "tools/list"
                | "completion/complete"
                | "elicitation/create"
                | "logging/setLevel"
                | "roots/list"
                | "sampling/createMessage"
        )
}

/// The notifications of MCP (both generations).
fn mcp_notification(method: &str) -> bool {
    matches!(
        method,
        "notifications/cancelled"
            | "notifications/initialized"
            | "notifications/message"
            | "notifications/progress"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated"
            | "notifications/roots/list_changed"
            | "notifications/subscriptions/acknowledged"
            | "notifications/tools/list_changed"
    )
}

/// A line transport over `read` and `write`: see the module documentation.
pub struct Lines<Role: LineRole, R, W> {
    read: BufReader<R>,
    /// Bytes read and kept: the next line is `line[..scanned]` once a newline ends it. With a
    /// limiter, it may hold several lines (a "too large" answer after a cut-off line).
    line: Vec<u8>,
    /// How much of `line` is known to hold no newline, or, after [`Line::Whole`], the length
    /// of the line to take.
    scanned: usize,
    /// The pipe lines are read from, if it is one: it grows to hold the largest line read.
    read_pipe: Option<Pipe>,
    /// A server's lines pass through its limiter (see `limit.rs`) on their way in, with no
    /// copy of their own: an oversized answer becomes a "too large" error for its call.
    limited: Option<Limited>,
    max_line: usize,
    /// Dropping the rest of a line that was too long.
    discarding: bool,
    write: Arc<Writer<W>>,
    /// An Invalid Request answer still to write, and how much of it went out.
    answer: Option<(Vec<u8>, usize)>,
    memory: Role::Memory,
    /// Where the agent's tool calls go instead of the service loop, if anywhere.
    direct: Option<Direct>,
    _role: PhantomData<fn() -> Role>,
}

impl<Role: LineRole, R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Lines<Role, R, W> {
    /// Lines of at most `max_line` bytes (a longer one is dropped with an error logged).
    pub fn new(read: R, write: W, max_line: usize) -> Self {
        Self {
            read: BufReader::with_capacity(64 << 10, read),
            line: Vec::new(),
            scanned: 0,
            read_pipe: None,
            limited: None,
            max_line,
            discarding: false,
            write: Arc::new(Writer {
                out: Mutex::new(Some(write)),
                pipe: None,
            }),
            answer: None,
            memory: Role::Memory::default(),
            direct: None,
            _role: PhantomData,
        }
    }

    /// A server's stdout: lines over `limit` bytes are cut off, and an answer among them
    /// becomes a "too large" error for its request ([`FrameLimiter`]).
    pub fn limited(read: R, write: W, limit: usize) -> Self {
        let mut lines = Self::new(read, write, usize::MAX);
        lines.limited = Some(Limited {
            limiter: FrameLimiter::new(Framing::Lines, limit),
            pending: Vec::new(),
            pending_at: 0,
        });
        lines
    }

    /// Lines read from pipe `read` and written to pipe `write` (where they are pipes): each
    /// grows to hold the largest line it carries (see `pipe_size.rs`). The caller keeps their
    /// file descriptors open as long as this transport reads and writes them.
    pub(crate) fn with_pipes(mut self, read: Option<Pipe>, write: Option<Pipe>) -> Self {
        self.read_pipe = read;
        match Arc::get_mut(&mut self.write) {
            Some(writer) => writer.pipe = write,
            // Cannot be: nothing has the writer before the transport is made.
            None => debug_assert!(false, "a line transport's writer is shared already"),
        }
        self
    }

    /// Reads until `self.line[..self.scanned]` is one whole line. Cancel-safe: a read cut short
    /// leaves its bytes in `self.line` for the next call, and nothing is consumed that was not
    /// kept or dropped.
    async fn read_line(&mut self) -> std::io::Result<Line> {
        loop {
            if let Some(at) = memchr::memchr(b'\n', &self.line[self.scanned..]) {
                self.scanned += at + 1;
                return Ok(Line::Whole);
            }
            self.scanned = self.line.len();
            if let Some(limited) = &mut self.limited {
                match limited.read(&mut self.read, &mut self.line, &mut self.scanned).await? {
                    Some(line) => return Ok(line),
                    None => continue,
                }
            }
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Line::End);
            }
            let newline = memchr::memchr(b'\n', available);
            let take = newline.map_or(available.len(), |at| at + 1);
            let mut outcome = None;
            if self.discarding {
                self.discarding = newline.is_none();
            } else if self.line.len() + take > self.max_line {
                self.line.clear();
                self.scanned = 0;
                self.discarding = newline.is_none();
                outcome = Some(Line::TooLong);
            } else {
                self.line.extend_from_slice(&available[..take]);
                self.scanned = self.line.len();
                outcome = newline.map(|_| Line::Whole);
            }
            self.read.consume(take);
            if let Some(outcome) = outcome {
                return Ok(outcome);
            }
        }
    }

    /// Puts a result of the line just read in its slot: a large one in the line's buffer itself
    /// where the line is all of it (a fresh one of the same size takes its place), else a copy.
    fn keep(&mut self, kept: Kept) {
        /// Below this a copy costs less than a fresh buffer.
        const MOVE_FROM: usize = 16 << 10;
        let start = kept.at.wrapping_sub(self.line.as_ptr() as usize);
        let range = start..start.saturating_add(kept.len);
        let whole = self.scanned == self.line.len() && kept.len * 2 >= self.line.capacity();
        let bytes = match whole && kept.len >= MOVE_FROM {
            true => {
                let buffer = Vec::with_capacity(self.line.capacity());
                raw::RawBytes::new(std::mem::replace(&mut self.line, buffer), range, kept.rebrace)
            }
            false => self.line.get(range)
                .and_then(|bytes| raw::RawBytes::new(bytes.to_vec(), 0..kept.len, kept.rebrace)),
        };
        match bytes {
            Some(bytes) => kept.slot.fill(bytes),
            // Cannot be: the result was found in this very line.
            None => tracing::error!("a result to pass on lies outside its line"),
        }
    }

    /// The other side's output ended: calls waiting for an answer learn it, and the agent's
    /// direct calls still running may yet answer before the transport closes (`close`).
    fn closed(&mut self) {
        Role::ended(&mut self.memory);
        if let Some(direct) = &self.direct {
            direct.calls.input_ended();
        }
    }

    /// Writes the pending Invalid Request answer, resuming where a cancelled try stopped.
    async fn write_answer(&mut self) -> std::io::Result<()> {
        let mut write = self.write.out.lock().await;
        let Some(writer) = write.as_mut() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        while let Some((bytes, written)) = self.answer.as_mut() {
            match *written < bytes.len() {
                true => *written += writer.write(&bytes[*written..]).await?,
                false => {
                    writer.flush().await?;
                    self.answer = None;
                }
            }
        }
        Ok(())
    }
}

enum Line {
    Whole,
    TooLong,
    End,
}

impl<R, W: AsyncWrite + Unpin + Send + 'static> Lines<RoleClient, R, W> {
    /// A way for callers to send tool calls themselves, answered by this transport's reader
    /// (see [`CallSender`]).
    pub fn call_sender(&self) -> CallSender {
        let write = self.write.clone();
        self.memory.sender(Arc::new(move |message| {
            Box::pin(write_message::<RoleClient, W>(write.clone(), message))
        }))
    }
}

impl<R, W: AsyncWrite + Unpin + Send + 'static> Lines<RoleServer, R, W> {
    /// The agent's tool calls go to `calls` once it takes them (see [`DirectCalls`]).
    pub fn with_direct(mut self, calls: Arc<dyn DirectCalls>) -> Self {
        let write = self.write.clone();
        let answers: Answers = Arc::new(move |answer| match answer {
            Answer::Message(message) => {
                Box::pin(write_message::<RoleServer, W>(write.clone(), message))
            }
            Answer::Raw {
                id,
                result,
                complete,
            } => Box::pin(write_raw(write.clone(), id, result, complete)),
        });
        self.direct = Some(Direct { calls, answers });
        self
    }
}

/// A server's line reader's limiter, and what a read straight into the line brought past the
/// line's end (`pending[pending_at..]`), which the limiter takes before anything new is read.
struct Limited {
    limiter: FrameLimiter,
    pending: Vec<u8>,
    pending_at: usize,
}

impl Limited {
    /// One step of [`Lines::read_line`] through the limiter, which bounds what it keeps (no line
    /// bound of our own): `Some` when a line is whole or the stream ended, `None` when the
    /// next turn scans `line` again (for what the limiter put there in place of a line).
    ///
    /// Once a line is long, or lines have been (the line's buffer is large), bytes are read
    /// straight into the line and the limiter checks them in place: a large result is not
    /// copied out of a read buffer. Bytes such a read brings past the line's end wait in
    /// `pending`. Cancel-safe as `read_line` is: a read either put its bytes in `line` or did
    /// not happen.
    async fn read<R: AsyncRead + Unpin>(
        &mut self,
        read: &mut BufReader<R>,
        line: &mut Vec<u8>,
        scanned: &mut usize,
    ) -> std::io::Result<Option<Line>> {
        /// Lines at least this long are read straight into the line, in reads of at least this.
        const STRAIGHT_FROM: usize = 64 << 10;
        /// At most this is read at once (what a pipe holds at most by default, `pipe_size.rs`):
        /// what a read brings past a line's end waits in `pending`, which this bounds.
        const STRAIGHT_AT_MOST: usize = 1 << 20;
        use tokio::io::AsyncReadExt as _;
        if self.pending_at < self.pending.len() {
            let fed = self.limiter.feed_frame(&self.pending[self.pending_at..], line);
            self.pending_at += fed.taken;
            if self.pending_at == self.pending.len() {
                self.pending_at = 0;
                match self.pending.capacity() > STRAIGHT_FROM {
                    // Such bytes are rare: a server's idle memory stays small.
                    true => self.pending = Vec::new(),
                    false => self.pending.clear(),
                }
            }
            return Ok(passed(fed, scanned, line.len()));
        }
        let straight = read.buffer().is_empty()
            && (line.len() >= STRAIGHT_FROM || line.capacity() >= 2 * STRAIGHT_FROM);
        if !straight {
            let available = read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Some(Line::End));
            }
            let fed = self.limiter.feed_frame(available, line);
            read.consume(fed.taken);
            return Ok(passed(fed, scanned, line.len()));
        }
        let start = line.len();
        line.reserve(STRAIGHT_FROM);
        let mut room = bytes::BufMut::limit(&mut *line, STRAIGHT_AT_MOST);
        if read.get_mut().read_buf(&mut room).await? == 0 {
            return Ok(Some(Line::End));
        }
        let mut replacement = Vec::new();
        let fed = self.limiter.check_frame(&line[start..], &mut replacement);
        let end = start + fed.taken;
        if end < line.len() {
            self.pending.extend_from_slice(&line[end..]);
        }
        match fed.unchanged {
            true => line.truncate(end),
            false => {
                // None of the read bytes passed: what stands for them does.
                line.truncate(start);
                line.extend_from_slice(&replacement);
            }
        }
        Ok(passed(fed, scanned, line.len()))
    }
}

/// After the limiter took bytes into a line: where they passed unchanged, the line holds no
/// line end but at its end, so it is scanned to there, and whole if they ended a line.
fn passed(fed: Fed, scanned: &mut usize, line_len: usize) -> Option<Line> {
    if fed.unchanged {
        *scanned = line_len;
        if fed.ended {
            return Some(Line::Whole);
        }
    }
    None
}

/// Writes `item` as one line (the write path of every message this transport sends).
async fn write_message<Role: LineRole, W: AsyncWrite + Unpin + Send + 'static>(
    write: Arc<Writer<W>>,
    item: TxJsonRpcMessage<Role>,
) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(256);
    let encoded = match Role::encode_hot(&item, &mut bytes) {
        Ok(true) => Ok(()),
        Ok(false) => sonic_rs::to_writer(&mut bytes, &item),
        Err(error) => Err(error),
    };
    Role::done_with(item);
    encoded.map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    write_line(&write, bytes.as_slice()).await
}

/// Writes the answer to tool call `id` with the result's bytes as the server wrote them (see
/// [`raw`]): the bytes are not copied again, the line goes out in one vectored write.
async fn write_raw<W: AsyncWrite + Unpin + Send + 'static>(
    write: Arc<Writer<W>>,
    id: RequestId,
    result: raw::RawBytes,
    complete: bool,
) -> std::io::Result<()> {
    let (head, body, tail) = raw::answer_line(&id, result.as_slice(), complete);
    write_line(&write, head.as_slice().chain(body).chain(tail)).await
}

/// Where a transport's lines go, shared by everyone who writes them.
struct Writer<W> {
    out: Mutex<Option<W>>,
    /// The pipe `out` writes to, if it is one: it grows to hold a line before it is written.
    pipe: Option<Pipe>,
}

/// Writes one whole line under the writer's lock, in as few writes as the writer allows.
async fn write_line<W: AsyncWrite + Unpin>(
    write: &Writer<W>,
    mut line: impl Buf,
) -> std::io::Result<()> {
    let mut out = write.out.lock().await;
    match out.as_mut() {
        Some(writer) => {
            // Only while the writer is here: its descriptor is the pipe's.
            if let Some(pipe) = &write.pipe {
                pipe.fit(line.remaining());
            }
            writer.write_all_buf(&mut line).await?;
            writer.flush().await
        }
        None => Err(std::io::ErrorKind::NotConnected.into()),
    }
}

fn invalid_request_answer<Role: ServiceRole>() -> Vec<u8> {
    let answer =
        TxJsonRpcMessage::<Role>::error(ErrorData::invalid_request("Invalid request", None), None);
    let mut bytes = serde_json::to_vec(&answer).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

impl<Role, R, W> Transport<Role> for Lines<Role, R, W>
where
    Role: LineRole,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<Role>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        Role::sending(&item, &mut self.memory);
        write_message::<Role, W>(self.write.clone(), item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<Role>> {
        loop {
            if self.answer.is_some()
                && let Err(error) = self.write_answer().await
            {
                tracing::debug!("could not answer an invalid message: {error}");
                return None;
            }
            match self.read_line().await {
                Ok(Line::Whole) => {}
                Ok(Line::TooLong) => {
                    tracing::error!(
                        max_line = self.max_line,
                        "a message longer than the line limit was dropped"
                    );
                    continue;
                }
                Ok(Line::End) => {
                    self.closed();
                    return None;
                }
                Err(error) => {
                    tracing::error!("reading a line failed: {error}");
                    self.closed();
                    return None;
                }
            }
            if let Some(pipe) = &self.read_pipe {
                pipe.fit(self.scanned);
            }
            let whole = &self.line[..self.scanned];
            let line = whole.strip_suffix(b"\n").unwrap_or(whole);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let decoded = match line.is_empty() {
                true => Decoded::Ignored,
                false => decode::<Role>(line, &mut self.memory),
            };
            // Keeping may take the whole buffer (then nothing is left to drop).
            if let Some(kept) = Role::kept(&mut self.memory) {
                self.keep(kept);
            }
            match self.scanned >= self.line.len() {
                true => self.line.clear(),
                false => drop(self.line.drain(..self.scanned)),
            }
            self.scanned = 0;
            match decoded {
                Decoded::Message(message) => {
                    let Some(message) = Role::answered(message, &mut self.memory) else {
                        continue;
                    };
                    let kept = match &self.direct {
                        Some(direct) => Role::divert(message, direct),
                        None => Some(message),
                    };
                    if kept.is_some() {
                        return kept;
                    }
                }
                Decoded::Ignored => {}
                Decoded::Invalid => self.answer = Some((invalid_request_answer::<Role>(), 0)),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The agent's calls still running answer first, as rmcp's loop lets its handlers do
        // before it closes the transport.
        if let Some(direct) = &self.direct {
            direct.calls.drained().await;
        }
        let writer = self.write.out.lock().await.take();
        match writer {
            Some(mut writer) => writer.shutdown().await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::route::{CallRoute, RouteTag};
    use rmcp::model::{CallToolRequestParams, CallToolResult, GetExtensions, JsonObject};

    fn generic<Role: ServiceRole>(line: &str) -> RxJsonRpcMessage<Role> {
        serde_json::from_str(line).unwrap()
    }

    fn as_json<T: serde::Serialize>(value: &T) -> serde_json::Value {
        serde_json::to_value(value).unwrap()
    }

    /// The ids of the messages `lines` receives until its input ends.
    async fn ids_received<Role: LineRole, R, W>(mut lines: Lines<Role, R, W>) -> Vec<serde_json::Value>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut seen = Vec::new();
        while let Some(message) = lines.receive().await {
            seen.push(as_json(&message)["id"].clone());
        }
        seen
    }

    /// Text and values with every kind of character and number JSON treats specially.
    fn awkward() -> serde_json::Value {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        serde_json::json!({
            "text": format!("{every_ascii} é 😀 \u{2028}\u{2029} \u{7f} {}", "x".repeat(300)),
            "numbers": [0, -1, u64::MAX, i64::MIN, 1.5, 0.1, 1.0, -0.0, 1e300, 5e-324, 123456789.125],
            "nested": {"": null, "t": true, "f": false, "a": [[], {}, [{}]], "\"k\\": "v"},
        })
    }

    #[test]
    fn messages_are_written_byte_for_byte_as_serde_json_writes_them() {
        let value = awkward();
        let text = value["text"].as_str().unwrap().to_string();
        let mut result = CallToolResult::success(vec![rmcp::model::ContentBlock::text(text.clone())]);
        result.structured_content = Some(value.clone());
        let server: Vec<TxJsonRpcMessage<RoleServer>> = vec![
            JsonRpcMessage::response(ServerResult::CallToolResult(result), RequestId::Number(3)),
            JsonRpcMessage::error(ErrorData::invalid_params(text.clone(), Some(value.clone())), None),
            JsonRpcMessage::notification(rmcp::model::ServerNotification::ProgressNotification(
                rmcp::model::ProgressNotification::new(rmcp::model::ProgressNotificationParam::new(
                    rmcp::model::ProgressToken(rmcp::model::NumberOrString::String("p".into())),
                    0.3,
                )),
            )),
        ];
        for message in &server {
            let ours = sonic_rs::to_vec(message).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(message).unwrap()
            );
        }
        let arguments = value.as_object().cloned().unwrap();
        let call = CallToolRequestParams::new("t").with_arguments(arguments);
        let request: TxJsonRpcMessage<RoleClient> = JsonRpcMessage::request(
            ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(call)),
            RequestId::String("r".into()),
        );
        let mut hot = Vec::new();
        assert!(RoleClient::encode_hot(&request, &mut hot).unwrap());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&hot).unwrap(),
            as_json(&request)
        );
        assert_eq!(
            String::from_utf8(sonic_rs::to_vec(&request).unwrap()).unwrap(),
            serde_json::to_string(&request).unwrap()
        );
    }

    #[test]
    fn an_agents_tool_call_decodes_straight_and_as_rmcp_decodes_it() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"},"_meta":{"progressToken":"p1"}}}"#;
        let hot = RoleServer::decode_hot(line.as_bytes(), &mut ()).expect("hot");
        assert_eq!(as_json(&hot), as_json(&generic::<RoleServer>(line)));
        let JsonRpcMessage::Request(request) = hot else {
            panic!("a request")
        };
        let ClientRequest::CallToolRequest(call) = &request.request else {
            panic!("a tool call")
        };
        assert_eq!(call.params.name, "echo");
        // The progress token (in `_meta`) is where rmcp puts it: the request's extensions.
        assert!(
            request
                .request
                .extensions()
                .get::<rmcp::model::RequestMetaObject>()
                .is_some()
        );
    }

    #[test]
    fn other_agent_messages_take_rmcps_decoder() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            // Names a tool call, but is a notification.
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"tools/call"}}"#,
        ] {
            assert!(RoleServer::decode_hot(line.as_bytes(), &mut ()).is_none());
            assert!(matches!(
                decode::<RoleServer>(line.as_bytes(), &mut ()),
                Decoded::Message(_)
            ));
        }
    }

    #[test]
    fn only_the_answer_to_a_call_in_flight_decodes_as_a_call_result() {
        let answer = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#;
        let mut calls = CallsReader::default();
        // Not a call of ours: rmcp decides what it is.
        assert!(RoleClient::decode_hot(answer.as_bytes(), &mut calls).is_none());
        calls.lock().insert(RequestId::Number(3), None);
        let hot = RoleClient::decode_hot(answer.as_bytes(), &mut calls).expect("hot");
        assert_eq!(as_json(&hot), as_json(&generic::<RoleClient>(answer)));
        assert!(matches!(
            hot,
            JsonRpcMessage::Response(JsonRpcResponse {
                result: ServerResult::CallToolResult(_),
                ..
            })
        ));
        assert!(calls.lock().is_empty(), "answered: forgotten");
    }

    #[test]
    fn awkward_hot_messages_decode_as_rmcp_decodes_them() {
        let value = awkward();
        let result = serde_json::json!({
            "content": [{"type": "text", "text": value["text"]}, {"type": "text", "text": "\u{1F600} \\ \" \u{0} é"}],
            "structuredContent": value,
            "isError": false,
        });
        for id in [serde_json::json!(3), serde_json::json!("x\"y"), serde_json::json!(-9)] {
            let answer =
                serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
            // Escapes serde_json never writes: \u sequences, surrogate pairs, \/.
            let answer = answer.replacen("\"isError\"", "\"is\\u0045rror\"", 1).replacen(
                "é",
                "\\u00e9 \\ud83d\\ude00 \\/",
                1,
            );
            let mut calls = CallsReader::default();
            calls.lock().insert(serde_json::from_value(id).unwrap(), None);
            let hot = RoleClient::decode_hot(answer.as_bytes(), &mut calls).expect("hot");
            assert_eq!(as_json(&hot), as_json(&generic::<RoleClient>(&answer)));
        }
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "t\u{0}é", "arguments": awkward(), "_meta": {"progressToken": 1.5}}})
        .to_string();
        let hot = RoleServer::decode_hot(call.as_bytes(), &mut ()).expect("hot");
        assert_eq!(as_json(&hot), as_json(&generic::<RoleServer>(&call)));
        // Not JSON, or not whole: nothing hot.
        let mut calls = CallsReader::default();
        calls.lock().insert(RequestId::Number(3), None);
        for broken in [r#"{"jsonrpc":"2.0","id":3,"result":{"content":[]}} x"#, r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"\x"}]}}"#, r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"\ud800"}]}}"#] {
            assert!(serde_json::from_str::<serde_json::Value>(broken).is_err(), "{broken}");
            assert!(RoleClient::decode_hot(broken.as_bytes(), &mut calls).is_none(), "{broken}");
        }
    }

    #[test]
    fn a_call_answered_with_something_else_takes_rmcps_decoder() {
        let mut calls = CallsReader::default();
        calls.lock().insert(RequestId::Number(4), None);
        // A 2026-07-28 server asking for input instead of answering.
        let input = r#"{"jsonrpc":"2.0","id":4,"result":{"resultType":"input_required","inputRequests":{}}}"#;
        assert!(RoleClient::decode_hot(input.as_bytes(), &mut calls).is_none());
        let error = r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"bad"}}"#;
        let Decoded::Message(message) = decode::<RoleClient>(error.as_bytes(), &mut calls) else {
            panic!("an error answer")
        };
        assert!(matches!(message, JsonRpcMessage::Error(_)));
        assert!(calls.lock().is_empty(), "answered with an error: forgotten");
    }

    #[test]
    fn a_result_that_passes_unchanged_goes_to_its_calls_slot_as_the_servers_bytes() {
        let result = r#"{"content":[{"type":"text","text":"a\u00e9 \"q\""}], "x" : [1.50]}"#;
        let answer = format!(r#"{{"id":5,"jsonrpc":"2.0","result":{result}}}"#);
        let mut calls = CallsReader::default();
        let slot = Arc::new(RawResult::default());
        calls.lock().insert(RequestId::Number(4), Some(Arc::new(RawResult::default())));
        calls.lock().insert(RequestId::Number(5), Some(slot.clone()));
        let hot = RoleClient::decode_hot(answer.as_bytes(), &mut calls).expect("hot");
        let JsonRpcMessage::Response(JsonRpcResponse {
            id,
            result: ServerResult::CallToolResult(placeholder),
            ..
        }) = hot
        else {
            panic!("a call's result")
        };
        assert_eq!(id, RequestId::Number(5));
        assert!(raw::is_placeholder(&placeholder));
        let kept = RoleClient::kept(&mut calls).expect("kept");
        assert!(Arc::ptr_eq(&kept.slot, &slot));
        let at = kept.at - answer.as_ptr() as usize;
        assert_eq!(&answer.as_bytes()[at..at + kept.len], result.as_bytes(), "byte for byte");
        assert_eq!(calls.lock().counts(), (1, 1));
        // An error's words are for the policy: it decodes, and the slot stays empty.
        let slot = Arc::new(RawResult::default());
        calls.lock().insert(RequestId::Number(6), Some(slot.clone()));
        let error = r#"{"jsonrpc":"2.0","id":6,"result":{"content":[],"isError":true}}"#;
        let hot = RoleClient::decode_hot(error.as_bytes(), &mut calls).expect("hot");
        assert_eq!(as_json(&hot), as_json(&generic::<RoleClient>(error)));
        assert!(RoleClient::kept(&mut calls).is_none());
        assert_eq!(calls.lock().counts(), (1, 1));
        // A call without a slot decodes as before.
        calls.lock().insert(RequestId::Number(7), None);
        let plain = answer.replace("\"id\":5", "\"id\":7");
        let hot = RoleClient::decode_hot(plain.as_bytes(), &mut calls).expect("hot");
        assert_eq!(as_json(&hot), as_json(&generic::<RoleClient>(&plain)));
        assert_eq!(calls.lock().counts(), (1, 1));
    }

    #[test]
    fn an_agents_call_nested_deeper_than_serde_json_allows_is_refused_not_recursed_into() {
        let depth = 100_000;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo"}},"x":{}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert!(RoleServer::decode_hot(line.as_bytes(), &mut ()).is_none());
        assert!(!matches!(
            decode::<RoleServer>(line.as_bytes(), &mut ()),
            Decoded::Message(_)
        ));
    }

    #[test]
    fn an_answer_nested_deeper_than_serde_json_allows_is_refused_not_recursed_into() {
        let mut calls = CallsReader::default();
        calls.lock().insert(RequestId::Number(1), Some(Arc::default()));
        let depth = 100_000;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{}{}]}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert!(RoleClient::decode_hot(line.as_bytes(), &mut calls).is_none());
        assert!(!matches!(
            decode::<RoleClient>(line.as_bytes(), &mut calls),
            Decoded::Message(_)
        ));
    }

    #[test]
    fn lines_that_are_not_messages_are_ignored_or_answered_as_invalid() {
        let mut calls = CallsReader::default();
        assert!(matches!(
            decode::<RoleClient>(b"not json", &mut calls),
            Decoded::Ignored
        ));
        assert!(matches!(
            decode::<RoleServer>(br#"{"hello":1}"#, &mut ()),
            Decoded::Invalid
        ));
    }

    /// What an agent's line that is no message gets (nothing, or an Invalid Request answer) is
    /// what rmcp's own line transport gives it, line by line.
    #[tokio::test]
    async fn lines_that_are_not_messages_get_what_rmcps_transport_gives_them() {
        use rmcp::transport::Transport as _;
        use rmcp::transport::async_rw::AsyncRwTransport;
        use tokio::io::AsyncReadExt as _;
        let lines = [
            "not json",
            "{\"jsonrpc\":\"2.0\",\"method\":5}",
            r#"{"hello":1}"#,
            r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":1}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"notifications/whatever"}"#,
            r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"notifications/unknown"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"result":null}"#,
            r#"["2.0",1,"tools/call",{"name":"echo"}]"#,
        ];
        for line in lines {
            let (mut to_rmcp, rmcp_reads) = tokio::io::duplex(1 << 16);
            let (rmcp_writes, mut from_rmcp) = tokio::io::duplex(1 << 16);
            let mut rmcp: AsyncRwTransport<RoleServer, _, _> =
                AsyncRwTransport::new_server(rmcp_reads, rmcp_writes);
            to_rmcp.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            drop(to_rmcp);
            while rmcp.receive().await.is_some() {}
            rmcp.close().await.unwrap();
            drop(rmcp);
            let mut written = Vec::new();
            from_rmcp.read_to_end(&mut written).await.unwrap();
            let answered = matches!(
                decode::<RoleServer>(line.as_bytes(), &mut ()),
                Decoded::Invalid
            );
            assert_eq!(answered, !written.is_empty(), "{line}");
        }
    }

    /// A call's route gets its arguments back once the line is encoded, whether the write
    /// then fails (the call never left: it may go out again) or not (a read-only tool's call
    /// lost later may): no try copies them in advance.
    #[tokio::test]
    async fn a_call_hands_its_arguments_back_whether_or_not_it_could_be_written() {
        for reader_gone in [true, false] {
            let (ours, theirs) = tokio::io::duplex(1024);
            let (read, write) = tokio::io::split(ours);
            let theirs = (!reader_gone).then_some(theirs);
            let mut lines: Lines<RoleClient, _, _> = Lines::new(read, write, 1 << 20);
            let arguments: JsonObject = serde_json::from_str(r#"{"n":1}"#).unwrap();
            let route = Arc::new(CallRoute::default());
            let mut request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
                CallToolRequestParams::new("t").with_arguments(arguments.clone()),
            ));
            request
                .extensions_mut()
                .insert(RouteTag(route.clone()));
            let sent = lines
                .send(JsonRpcMessage::request(request, RequestId::Number(1)))
                .await;
            assert_eq!(sent.is_err(), reader_gone);
            assert_eq!(route.take_back(), Some(Some(arguments)));
            drop(theirs);
        }
    }

    /// A pipe a large line comes on grows to hold it once it is read, a pipe a large line goes
    /// to grows before it is written: the next such line crosses each in one piece.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn pipes_grow_to_hold_the_largest_line_they_carry() {
        use super::super::pipe_size::{growable_default, size_of};
        use tokio::net::unix::pipe;
        let Some(default) = growable_default() else {
            return;
        };
        let (mut theirs_out, ours_in) = pipe::pipe().unwrap();
        let (ours_out, mut theirs_in) = pipe::pipe().unwrap();
        let pipes = (Pipe::of(&ours_in), Pipe::of(&ours_out));
        let mut lines: Lines<RoleServer, _, _> =
            Lines::new(ours_in, ours_out, 1 << 22).with_pipes(pipes.0, pipes.1);
        let small = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";
        theirs_out.write_all(small).await.unwrap();
        assert!(lines.receive().await.is_some());
        assert_eq!(size_of(&theirs_out), default, "a small line changes nothing");

        let large = "x".repeat(default * 3);
        let grown = (default * 3 + 100).next_power_of_two();
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":1,"reason":"{large}"}}}}"#
        );
        let writing = tokio::spawn(async move {
            theirs_out.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            theirs_out
        });
        assert!(lines.receive().await.is_some());
        let theirs_out = writing.await.unwrap();
        assert_eq!(size_of(&theirs_out), grown, "the pipe read from");
        assert_eq!(size_of(&theirs_in), default, "the pipe written to, so far");

        let reading = tokio::spawn(async move {
            let mut line = String::new();
            BufReader::new(&mut theirs_in).read_line(&mut line).await.unwrap();
            (theirs_in, line.len())
        });
        let notification: TxJsonRpcMessage<RoleServer> = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "data": large},
        }))
        .unwrap();
        lines.send(notification).await.unwrap();
        let (theirs_in, read) = reading.await.unwrap();
        assert!(read > default * 3);
        assert_eq!(size_of(&theirs_in), grown, "the pipe written to");
    }

    /// A stdio server's stdout, read through the limiter, grows the same way.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_servers_stdout_grows_through_the_limiter_too() {
        use super::super::pipe_size::{growable_default, size_of};
        use tokio::net::unix::pipe;
        let Some(default) = growable_default() else {
            return;
        };
        let (mut theirs_out, ours_in) = pipe::pipe().unwrap();
        let (ours_out, _theirs_in) = pipe::pipe().unwrap();
        let pipes = (Pipe::of(&ours_in), Pipe::of(&ours_out));
        let mut lines: Lines<RoleClient, _, _> =
            Lines::limited(ours_in, ours_out, 1 << 22).with_pipes(pipes.0, pipes.1);
        let large = "x".repeat(default * 3);
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"{large}"}}}}"#
        );
        let writing = tokio::spawn(async move {
            theirs_out.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            theirs_out
        });
        assert!(lines.receive().await.is_some());
        let theirs_out = writing.await.unwrap();
        assert_eq!(size_of(&theirs_out), (default * 3 + 100).next_power_of_two());
    }

    /// Results passed on as bytes, read through the limiter: a small one with a line after it in
    /// the same read (copied out), a large one as the last line read (its buffer moved), each
    /// exactly as written; and so with lines long enough to be read straight into the line.
    #[tokio::test]
    async fn results_for_slots_are_kept_byte_for_byte_from_the_lines_read() {
        for scale in [5_000, 50_000] {
            let (ours, mut theirs) = tokio::io::duplex(1 << 20);
            let (read, write) = tokio::io::split(ours);
            let mut lines: Lines<RoleClient, _, _> = Lines::limited(read, write, 1 << 20);
            let mut slots = Vec::new();
            for id in [1, 2] {
                let route = Arc::new(CallRoute {
                    raw: Some(Arc::default()),
                    ..CallRoute::default()
                });
                slots.push(route.raw.clone().unwrap());
                let mut request = ClientRequest::CallToolRequest(
                    rmcp::model::CallToolRequest::new(CallToolRequestParams::new("t")),
                );
                request.extensions_mut().insert(RouteTag(route));
                let request = JsonRpcMessage::request(request, RequestId::Number(id));
                lines.send(request).await.expect("the call is written");
            }
            let result = |n: u32| {
                let text = "x".repeat(n as usize * n as usize * scale);
                format!(r#"{{ "content" : [{{"type":"text","text":"\u00e9{text}"}}] }}"#)
            };
            let text = format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}\r\n{{\"id\":2,\"result\":{},\"jsonrpc\":\"2.0\"}}\n",
                result(1),
                result(2)
            );
            theirs.write_all(text.as_bytes()).await.unwrap();
            for (id, slot) in (1..=2).zip(&slots) {
                let Some(JsonRpcMessage::Response(response)) = lines.receive().await else {
                    panic!("an answer")
                };
                assert_eq!(response.id, RequestId::Number(id));
                let ServerResult::CallToolResult(placeholder) = response.result else {
                    panic!("a call's result")
                };
                assert!(raw::is_placeholder(&placeholder));
                let bytes = slot.take().expect("the result's bytes");
                assert_eq!(bytes.as_slice(), result(id as u32).as_bytes(), "scale {scale}");
            }
        }
    }

    /// A server's lines through the limiter: several in one read, one split across reads, blank
    /// lines and `\r\n` endings, each read whole and in order.
    #[tokio::test]
    async fn a_servers_lines_are_read_whole_in_any_chunking() {
        let answer = |id: u32| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#);
        let text = format!(
            "{}\n{}\r\n\n{}\n{}\n",
            answer(1),
            answer(2),
            answer(3),
            answer(4)
        );
        for split in [1, 20, 41, 60, text.len() - 1] {
            let (ours, mut theirs) = tokio::io::duplex(1 << 16);
            let (read, write) = tokio::io::split(ours);
            let lines: Lines<RoleClient, _, _> = Lines::limited(read, write, 1 << 10);
            let (first, second) = text.as_bytes().split_at(split);
            theirs.write_all(first).await.unwrap();
            theirs.flush().await.unwrap();
            let reader = tokio::spawn(ids_received(lines));
            tokio::task::yield_now().await;
            theirs.write_all(second).await.unwrap();
            drop(theirs);
            assert_eq!(reader.await.unwrap(), [1, 2, 3, 4], "split at {split}");
        }
    }

    /// Long lines are read straight into the line: one that follows another in the same read,
    /// small lines behind a long one, oversized ones cut off in the middle of such a read (one
    /// whose id comes first, answered at once, and one whose id comes last, answered at its
    /// end) and the lines behind them, in any chunking; each read whole, in order, with its
    /// bytes.
    #[tokio::test]
    async fn long_lines_read_straight_into_the_line_are_whole_in_any_chunking() {
        let answer = |id: u32, text_len: usize| {
            let text = "x".repeat(text_len);
            let result = format!(r#"{{"content":[{{"type":"text","text":"{text}"}}]}}"#);
            match id {
                6 => format!(r#"{{"result":{result},"jsonrpc":"2.0","id":{id}}}"#),
                _ => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
            }
        };
        let text_lens = [100_000, 10, 200_000, 400_000, 150_000, 400_000, 10, 10];
        let lines_written: Vec<String> =
            (1..).zip(text_lens).map(|(id, len)| answer(id, len)).collect();
        let text = lines_written.join("\n") + "\n";
        for chunk in [1_000, 65_536, 70_001, 300_000, text.len()] {
            let (ours, mut theirs) = tokio::io::duplex(1 << 20);
            let (read, write) = tokio::io::split(ours);
            let mut lines: Lines<RoleClient, _, _> = Lines::limited(read, write, 300_000);
            let bytes = text.clone().into_bytes();
            let server = tokio::spawn(async move {
                for piece in bytes.chunks(chunk) {
                    theirs.write_all(piece).await.unwrap();
                    tokio::task::yield_now().await;
                }
            });
            let mut seen = Vec::new();
            let mut read_behind = false;
            while let Some(message) = lines.receive().await {
                let limited = lines.limited.as_ref().unwrap();
                read_behind |= limited.pending_at < limited.pending.len();
                let message = as_json(&message);
                let id = message["id"].as_u64().unwrap();
                match id {
                    4 | 6 => assert_eq!(message["error"]["code"], super::super::limit::TOO_LARGE),
                    _ => {
                        let text = message["result"]["content"][0]["text"].as_str().unwrap();
                        assert_eq!(text.len(), text_lens[id as usize - 1], "chunks of {chunk}");
                        assert!(text.bytes().all(|b| b == b'x'));
                    }
                }
                seen.push(id);
                if id == 8 {
                    break;
                }
            }
            assert_eq!(seen, [1, 2, 3, 4, 5, 6, 7, 8], "chunks of {chunk}");
            if chunk == text.len() {
                assert!(read_behind, "lines behind a long one came in the same read");
            }
            assert!(lines.line.capacity() < 1 << 20, "the cut-off line was not kept");
            server.await.unwrap();
        }
    }

    /// A server's oversized answer fails its call as soon as its id is read, before the line
    /// ends (if it ever does); the lines after it pass untouched. The pipe is narrow, so the
    /// line's start passes before it crosses the limit and is cut off there.
    #[tokio::test]
    async fn an_oversized_answer_from_a_server_becomes_a_too_large_error_at_once() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let (read, write) = tokio::io::split(ours);
        let mut lines: Lines<RoleClient, _, _> = Lines::limited(read, write, 200);
        let within = |message: Option<RxJsonRpcMessage<RoleClient>>| as_json(&message.unwrap());
        let deadline = std::time::Duration::from_secs(10);
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":5,"result":{{"content":[{{"type":"text","text":"{}"#,
            "x".repeat(1000)
        );
        let (go_on, mark) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            theirs.write_all(huge.as_bytes()).await.unwrap();
            mark.await.unwrap();
            theirs.write_all(&[b'y'; 5000]).await.unwrap();
            theirs.write_all(b"\"}]}}\n").await.unwrap();
            let small = r#"{"jsonrpc":"2.0","id":6,"result":{}}"#;
            for chunk in [&small[..10], &small[10..], "\n"] {
                theirs.write_all(chunk.as_bytes()).await.unwrap();
                tokio::task::yield_now().await;
            }
            theirs
        });
        let answer = within(tokio::time::timeout(deadline, lines.receive()).await.unwrap());
        assert_eq!(answer["id"], 5);
        assert_eq!(answer["error"]["code"], super::super::limit::TOO_LARGE);
        go_on.send(()).unwrap();
        let next = within(tokio::time::timeout(deadline, lines.receive()).await.unwrap());
        assert_eq!(next["id"], 6);
        assert_eq!(next["result"], serde_json::json!({}));
        assert!(lines.line.capacity() < 4096, "the cut-off line was not kept");
        drop(server.await.unwrap());
    }

    /// A last line that no line end closes is not a message at the end of input, as in rmcp's
    /// line transport (`AsyncRwTransport`; only its codec's `decode_eof` would read it).
    #[tokio::test]
    async fn a_last_line_without_a_line_end_is_dropped_as_rmcp_drops_it() {
        use rmcp::transport::Transport as _;
        use rmcp::transport::async_rw::AsyncRwTransport;
        let text = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#
        );
        let (mut theirs, ours) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(ours);
        let reader = tokio::spawn(ids_received(Lines::<RoleServer, _, _>::new(read, write, 200)));
        theirs.write_all(text.as_bytes()).await.unwrap();
        drop(theirs);
        let ours = reader.await.unwrap();
        let (mut theirs, rmcp_reads) = tokio::io::duplex(1 << 16);
        let mut rmcp: AsyncRwTransport<RoleServer, _, _> =
            AsyncRwTransport::new_server(rmcp_reads, tokio::io::sink());
        theirs.write_all(text.as_bytes()).await.unwrap();
        drop(theirs);
        let mut rmcps = Vec::new();
        while let Some(message) = rmcp.receive().await {
            rmcps.push(as_json(&message)["id"].clone());
        }
        assert_eq!(ours, rmcps);
        assert_eq!(ours, [serde_json::json!(1)]);
    }

    /// Lines split across reads, a line over the bound dropped, blank lines skipped.
    #[tokio::test]
    async fn lines_are_read_whole_and_bounded() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(ours);
        let lines: Lines<RoleServer, _, _> = Lines::new(read, write, 200);
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
            "x".repeat(300)
        );
        let reader = tokio::spawn(ids_received(lines));
        theirs.write_all(long.as_bytes()).await.unwrap();
        theirs.write_all(b"\n\n{\"jsonrpc\":\"2.0\",\"id\":2,").await.unwrap();
        theirs.flush().await.unwrap();
        tokio::task::yield_now().await;
        theirs
            .write_all(b"\"method\":\"ping\"}\r\n")
            .await
            .unwrap();
        drop(theirs);
        assert_eq!(reader.await.unwrap(), [serde_json::json!(2)]);
    }
}
