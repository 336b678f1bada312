//! Server-sent events read from a response body, for Tether's own SSE readers (a tool call's
//! streamed answer on Streamable HTTP, legacy SSE), after [`super::limit::BoundedEvents`] has
//! bounded them.
//!
//! The `sse-stream` crate that rmcp uses looks for each line's end one byte at a time (16 M
//! instructions of a 2 MB answer, 8 a byte); this reader finds them with `memchr`. It reads the
//! format as the HTML standard defines it: lines end with CRLF, LF or CR; an empty line ends
//! an event; `:` starts a comment; one space after a field's colon is dropped; a line without a
//! colon is a field with an empty value; unknown fields, a `retry` that is not all digits and an
//! `id` with a NUL are ignored; invalid UTF-8 is replaced. As `sse-stream` does (and rmcp's
//! reconnection needs), an event is delivered when any field was set, data or not, and one
//! left unfinished at the body's end is dropped.

use std::borrow::Cow;

use bytes::Bytes;
use futures::{Stream, StreamExt, stream::BoxStream};
use sse_stream::{Error as SseError, Sse};

const BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// The largest line buffer kept once its line is read.
const KEPT_LINE_CAPACITY: usize = 64 << 10;

/// The events of `body`; a body error is the last item.
pub(crate) fn events<S, E>(body: S) -> BoxStream<'static, Result<Sse, SseError>>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    // Not polled again after an error: the stream ends with it.
    let chunks = futures::stream::unfold(Some(body.boxed()), |body| async move {
        let mut body = body?;
        let chunk = body.next().await?;
        let broken = chunk.is_err();
        Some((chunk, (!broken).then_some(body)))
    });
    let mut reader = EventReader::default();
    chunks
    .flat_map(move |chunk| {
        let events: Vec<Result<Sse, SseError>> = match chunk {
            Ok(chunk) => reader.feed(&chunk).into_iter().map(Ok).collect(),
            Err(error) => vec![Err(SseError::Body(Box::new(error)))],
        };
        futures::stream::iter(events)
    })
    .boxed()
}

/// A sans-IO reader: bytes in, the events they complete out.
#[derive(Default)]
struct EventReader {
    /// The current line's bytes so far, when it began in an earlier chunk.
    line: Vec<u8>,
    /// The event being read, once one of its fields was.
    event: Option<Sse>,
    /// The last chunk ended with a CR: a LF starting the next belongs to it.
    after_cr: bool,
    /// A line was read (the byte order mark can only come first).
    started: bool,
}

impl EventReader {
    fn feed(&mut self, mut chunk: &[u8]) -> Vec<Sse> {
        let mut done = Vec::new();
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            chunk = chunk.strip_prefix(b"\n").unwrap_or(chunk);
        }
        while let Some(end) = memchr::memchr2(b'\r', b'\n', chunk) {
            if self.line.is_empty() {
                self.read_line(&chunk[..end], &mut done);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..end]);
                self.read_line(&line, &mut done);
                // A long line's buffer is not kept for the life of the stream.
                if line.capacity() <= KEPT_LINE_CAPACITY {
                    line.clear();
                    self.line = line;
                }
            }
            let cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
        }
        self.line.extend_from_slice(chunk);
        done
    }

    fn read_line(&mut self, mut line: &[u8], done: &mut Vec<Sse>) {
        if !std::mem::replace(&mut self.started, true) {
            line = line.strip_prefix(BYTE_ORDER_MARK).unwrap_or(line);
        }
        if line.is_empty() {
            done.extend(self.event.take());
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(0) => return,
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                let text = text(value);
                let event = self.event.get_or_insert_default();
                match &mut event.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(&text);
                    }
                    None => event.data = Some(text.into_owned()),
                }
            }
            b"event" => self.event.get_or_insert_default().event = Some(text(value).into_owned()),
            b"id" if !value.contains(&0) => {
                self.event.get_or_insert_default().id = Some(text(value).into_owned());
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Ok(retry) = text(value).parse() {
                    self.event.get_or_insert_default().retry = Some(retry);
                }
            }
            _ => {}
        }
    }
}

/// `bytes` as text, checked with SIMD (std's lossy decoding costs 7 instructions a byte even
/// when there is nothing to replace).
fn text(bytes: &[u8]) -> Cow<'_, str> {
    match simdutf8::basic::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(event: Option<&str>, data: Option<&str>, id: Option<&str>, retry: Option<u64>) -> Sse {
        Sse {
            event: event.map(Into::into),
            data: data.map(Into::into),
            id: id.map(Into::into),
            retry,
        }
    }

    /// What `text` reads as, fed in the chunks cut at `cuts`.
    fn read(text: &[u8], cuts: &[usize]) -> Vec<Sse> {
        let mut reader = EventReader::default();
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain([&text.len()]) {
            events.extend(reader.feed(&text[start..cut]));
            start = cut;
        }
        events
    }

    #[test]
    fn events_read_the_same_in_any_chunking() {
        let text = b"\xEF\xBB\xBFdata: one\n\nid: 7\r\nretry: 3000\r\ndata:\r\n\r\n: a comment\revent: message\rdata: {\"a\":1}\rdata:  two\r\rdata: end\n\n";
        let expected = vec![
            sse(None, Some("one"), None, None),
            sse(None, Some(""), Some("7"), Some(3000)),
            sse(Some("message"), Some("{\"a\":1}\n two"), None, None),
            sse(None, Some("end"), None, None),
        ];
        for first in 0..=text.len() {
            assert_eq!(read(text, &[first]), expected, "cut at {first}");
            for second in first..=text.len() {
                assert_eq!(read(text, &[first, second]), expected, "cuts {first}, {second}");
            }
        }
        // One byte at a time.
        assert_eq!(read(text, &(1..text.len()).collect::<Vec<_>>()), expected);
    }

    #[test]
    fn what_the_standard_ignores_is_ignored() {
        let text = b"data\nunknown: x\nretry: 12a\nid: a\0b\nevent: e\n\n:only a comment\n\ndata: tail";
        // A line without a colon is a field with an empty value; an unfinished event is dropped.
        assert_eq!(read(text, &[]), vec![sse(Some("e"), Some(""), None, None)]);
        let invalid = b"data: \xFF\n\n";
        assert_eq!(read(invalid, &[]), vec![sse(None, Some("\u{FFFD}"), None, None)]);
    }

    #[tokio::test]
    async fn a_broken_body_ends_the_events_with_its_error() {
        let body = futures::stream::iter([
            Ok(Bytes::from_static(b"data: a\n\ndata: b")),
            Err(std::io::Error::other("reset")),
        ])
        .chain(futures::stream::poll_fn(|_| -> std::task::Poll<Option<_>> {
            panic!("the body was polled after its error")
        }));
        let read: Vec<_> = events(body).collect().await;
        assert_eq!(read.len(), 2, "{read:?}");
        assert_eq!(read[0].as_ref().unwrap().data.as_deref(), Some("a"));
        assert!(matches!(read[1], Err(SseError::Body(_))));
    }
}
