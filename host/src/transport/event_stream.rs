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
//!
//! A line that spans a few chunks is kept as slices of them and copied once, when it ends: a
//! long `data:` line (a large answer) straight into its event's text. One that spans many, or
//! comes in small pieces, is copied into one buffer as it comes (a `data:` line's value only,
//! which then becomes the text as it is): the slices would keep the HTTP client's whole read
//! buffers alive, not only their bytes.

use std::borrow::Cow;

use bytes::Bytes;
use futures::{Stream, StreamExt, stream::BoxStream};
use sse_stream::{Error as SseError, Sse};

const BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// A byte order mark, `data:` and the space after it: what is looked at before deciding how to
/// copy a line.
const HEAD: usize = 9;

/// A piece of a line shorter than this is copied, not kept as a slice.
const SMALL_PIECE: usize = 4 << 10;

/// Slices kept of one line, at most: each may keep a read buffer of the HTTP client alive (up
/// to ~400 KB), whatever its own length.
const MAX_SLICES: usize = 8;

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
            Ok(chunk) => reader.feed(chunk).into_iter().map(Ok).collect(),
            Err(error) => vec![Err(SseError::Body(Box::new(error)))],
        };
        futures::stream::iter(events)
    })
    .boxed()
}

/// A line that began in an earlier chunk.
enum Partial {
    /// Slices of the chunks (no copy): at most [`MAX_SLICES`], none shorter than
    /// [`SMALL_PIECE`] (and, when the line ends, the piece that ends it).
    Slices(Vec<Bytes>),
    /// Copied into one buffer: only the value when the line is its event's first `data:` line
    /// (`value`), else the whole line.
    Copied { bytes: Vec<u8>, value: bool },
}

/// A sans-IO reader: bytes in, the events they complete out.
#[derive(Default)]
struct EventReader {
    /// The current line so far, when it began in an earlier chunk.
    partial: Option<Partial>,
    /// The event being read, once one of its fields was.
    event: Option<Sse>,
    /// The last chunk ended with a CR: a LF starting the next belongs to it.
    after_cr: bool,
    /// A line was read (the byte order mark can only come first).
    started: bool,
}

impl EventReader {
    fn feed(&mut self, chunk: Bytes) -> Vec<Sse> {
        let mut done = Vec::new();
        let mut at = 0;
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                at = 1;
            }
        }
        while let Some(found) = memchr::memchr2(b'\r', b'\n', &chunk[at..]) {
            let end = at + found;
            match self.partial.take() {
                None => self.read_line(&chunk[at..end], &mut done),
                Some(Partial::Slices(mut pieces)) => {
                    if end > at {
                        pieces.push(chunk.slice(at..end));
                    }
                    self.read_slices(&pieces, &mut done);
                }
                Some(Partial::Copied { mut bytes, value }) => {
                    bytes.extend_from_slice(&chunk[at..end]);
                    match value {
                        true => self.first_data(bytes),
                        false => self.read_line(&bytes, &mut done),
                    }
                }
            }
            let cr = chunk[end] == b'\r';
            at = end + 1;
            if cr {
                match chunk.get(at) {
                    Some(b'\n') => at += 1,
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
        }
        if at < chunk.len() {
            self.keep(chunk.slice(at..));
        }
        done
    }

    /// Keeps a piece of a line that goes on in the next chunk.
    fn keep(&mut self, piece: Bytes) {
        let small = piece.len() < SMALL_PIECE;
        let mut slices = match self.partial.take() {
            None => Vec::new(),
            Some(Partial::Slices(slices)) => slices,
            Some(Partial::Copied { mut bytes, value }) => {
                bytes.extend_from_slice(&piece);
                self.partial = Some(Partial::Copied { bytes, value });
                return;
            }
        };
        slices.push(piece);
        if !small && slices.len() <= MAX_SLICES {
            self.partial = Some(Partial::Slices(slices));
            return;
        }
        // Copied from now on, with room for as much again.
        let len = slices.iter().map(Bytes::len).sum();
        let value = self.value_start(&slices, len);
        let from = value.unwrap_or(0);
        let mut bytes = Vec::with_capacity(2 * (len - from));
        join_into(&slices, from, len - from, &mut bytes);
        self.partial = Some(Partial::Copied {
            bytes,
            value: value.is_some(),
        });
    }

    /// Where the value starts in the line that `pieces` (`len` bytes) begin, if the line is
    /// its event's first `data:` line and enough of it came to tell.
    fn value_start(&self, pieces: &[Bytes], len: usize) -> Option<usize> {
        let mut head = Vec::with_capacity(HEAD);
        join_into(pieces, 0, HEAD.min(len), &mut head);
        let bom = match self.started {
            false if head.starts_with(BYTE_ORDER_MARK) => BYTE_ORDER_MARK.len(),
            _ => 0,
        };
        let first_data = self.event.as_ref().is_none_or(|event| event.data.is_none());
        // Whether a space follows the colon is known only once a byte does.
        (first_data && head[bom..].starts_with(b"data:") && head.len() > bom + 5)
            .then(|| bom + 5 + usize::from(head[bom + 5] == b' '))
    }

    /// Reads a line that came as slices: an event's first `data:` line is copied once, straight
    /// into the event's text; any other line is joined and read as one that came whole.
    fn read_slices(&mut self, pieces: &[Bytes], done: &mut Vec<Sse>) {
        let len = pieces.iter().map(Bytes::len).sum();
        let from = self.value_start(pieces, len);
        let start = from.unwrap_or(0);
        let mut bytes = Vec::with_capacity(len - start);
        join_into(pieces, start, len - start, &mut bytes);
        match from {
            Some(_) => self.first_data(bytes),
            None => self.read_line(&bytes, done),
        }
    }

    /// Takes the value of its event's first `data:` line as the event's text.
    fn first_data(&mut self, value: Vec<u8>) {
        self.started = true;
        self.event.get_or_insert_default().data = Some(owned_text(value));
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

/// Appends `len` bytes of `pieces` from `start` on (at most as many as there are) to `out`.
fn join_into(pieces: &[Bytes], mut start: usize, len: usize, out: &mut Vec<u8>) {
    let end = out.len() + len;
    for piece in pieces {
        let room = end - out.len();
        if room == 0 {
            break;
        }
        if start >= piece.len() {
            start -= piece.len();
            continue;
        }
        let piece = &piece[start..];
        start = 0;
        out.extend_from_slice(&piece[..piece.len().min(room)]);
    }
}

/// `bytes` as text, without a copy when they are valid UTF-8 (checked with SIMD).
fn owned_text(bytes: Vec<u8>) -> String {
    match simdutf8::basic::from_utf8(&bytes) {
        // SAFETY: `bytes` were just checked to be valid UTF-8.
        Ok(_) => unsafe { String::from_utf8_unchecked(bytes) },
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
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
            events.extend(reader.feed(Bytes::copy_from_slice(&text[start..cut])));
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
    fn long_lines_read_the_same_in_any_chunking() {
        // Lines far longer than a chunk: kept as slices, copied as they come, or first one then
        // the other; the BOM, `data:`, a CRLF and characters of several bytes cut anywhere.
        let long = "añ€𝄞z".repeat(2000);
        let text = format!(
            "\u{FEFF}data: {long}\ndata:{long}\r\nid: {long}\revent: e\n\ndata:{long}\n\n"
        );
        let text = text.as_bytes();
        let expected = vec![
            sse(Some("e"), Some(&format!("{long}\n{long}")), Some(&long), None),
            sse(None, Some(&long), None, None),
        ];
        let crlf = text.windows(2).position(|w| w == b"\r\n").unwrap() + 1;
        for step in [SMALL_PIECE - 1, SMALL_PIECE, 5_000, 9_999, text.len()] {
            for first in (0..12).chain([crlf]) {
                let cuts: Vec<usize> = std::iter::once(first)
                    .chain((first..text.len()).step_by(step).skip(1))
                    .collect();
                assert_eq!(read(text, &cuts), expected, "first cut {first}, then every {step}");
            }
        }
        let trickled: Vec<usize> = (1..text.len()).step_by(7).collect();
        assert_eq!(read(text, &trickled), expected);
        // Large pieces, then small ones, then large again.
        let mixed: Vec<usize> = (1..text.len())
            .scan(0, |at, i| {
                *at += if i % 12 < 3 { 6_000 } else { 10 };
                Some(*at)
            })
            .take_while(|&at| at < text.len())
            .collect();
        assert_eq!(read(text, &mixed), expected);
        // Invalid UTF-8 in a long line is replaced, as in a short one, on either way.
        let mut invalid = b"data: ".to_vec();
        invalid.extend_from_slice(long.as_bytes());
        invalid.extend_from_slice(b"\xFF\n\n");
        let replaced = format!("{long}\u{FFFD}");
        for cuts in [&[3, 10_000][..], &[10, 5_000, 10_000, 15_000]] {
            assert_eq!(
                read(&invalid, cuts),
                vec![sse(None, Some(&replaced), None, None)]
            );
        }
    }

    #[test]
    fn a_long_line_keeps_few_slices_then_its_value_copied_as_it_comes() {
        let mut reader = EventReader::default();
        let chunk = Bytes::from(vec![b'x'; 5_000]);
        reader.feed(Bytes::from_static(b"data: "));
        // A small first piece: copied, the value only.
        let Some(Partial::Copied { bytes, value: true }) = &reader.partial else {
            panic!("a small piece is copied")
        };
        assert!(bytes.is_empty());
        reader.partial = None;
        let mut first = b"data: ".to_vec();
        first.extend_from_slice(&chunk);
        reader.feed(Bytes::from(first));
        for kept in 2..=MAX_SLICES {
            reader.feed(chunk.clone());
            let Some(Partial::Slices(slices)) = &reader.partial else {
                panic!("large pieces are kept as slices")
            };
            assert_eq!(slices.len(), kept);
        }
        reader.feed(chunk.clone());
        let Some(Partial::Copied { bytes, value: true }) = &reader.partial else {
            panic!("no more than {MAX_SLICES} slices are kept")
        };
        assert_eq!(bytes.len(), 5_000 * (MAX_SLICES + 1), "the value, not the line");
        assert!(bytes.iter().all(|&b| b == b'x'));
        reader.feed(chunk.clone());
        let events = reader.feed(Bytes::from_static(b"\n\n"));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.as_ref().map(String::len), Some(5_000 * (MAX_SLICES + 2)));
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
