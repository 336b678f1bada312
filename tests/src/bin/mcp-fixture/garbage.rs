//! `--garbage`: a tool call runs (it is logged in `calls.log` like any other), but its answer
//! never reaches the client. In its place the client gets garbage, in turn: a line that is not
//! JSON, JSON that is not JSON-RPC, and a well-formed answer with an id no request has. The
//! caller must time out or fail the call cleanly, and never take the garbage for a result.
//!
//! - stdio: the handler writes the garbage to stdout itself and never answers.
//! - Streamable HTTP: the guard ([`forward`]) marks a `tools/call` POST with [`MARK_HEADER`]
//!   while `garbage` is set; the handler answers a marked call with a [`SENTINEL`] result, and
//!   the guard sends the garbage (as `application/json`) instead of rmcp's answer.
//! - Legacy SSE: the handler answers with a [`SENTINEL`] result, and the session's event
//!   stream sends the garbage ([`replacement`]) as the event's data instead.
//!
//! Any server message carrying the sentinel text is garbled, so a client must not echo it.

use std::{
    io::Write,
    sync::atomic::{AtomicU64, Ordering},
};

use axum::{
    body::{Body, Bytes, to_bytes},
    extract::Request,
    http::{HeaderValue, StatusCode, header, request::Parts},
    middleware::Next,
    response::{IntoResponse, Response},
};
use rmcp::{
    RoleServer,
    model::{CallToolResult, ContentBlock},
    service::RequestContext,
};

use crate::cli::{Behaviour, Transport};

/// Text of an answer to be garbled, followed by its garbage number.
pub const SENTINEL: &str = "mcp-fixture:garbage:";
/// Set by the HTTP guard on a `tools/call` request whose answer it will garble.
pub const MARK_HEADER: &str = "x-mcp-fixture-garbage";
/// Largest rmcp answer the HTTP guard buffers to look for the sentinel.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

static GARBLED: AtomicU64 = AtomicU64::new(0);

/// Whether this call's answer is to be garbled.
pub fn wanted(
    transport: Transport,
    settings: &Behaviour,
    context: &RequestContext<RoleServer>,
) -> bool {
    match transport {
        // Only a call the guard marked: the guard decided, and it will do the garbling.
        Transport::Http => context
            .extensions
            .get::<Parts>()
            .is_some_and(|parts| parts.headers.contains_key(MARK_HEADER)),
        Transport::Stdio | Transport::Sse => settings.garbage,
    }
}

/// The handler's answer to a call whose answer is garbled (the call has run).
pub async fn answer(transport: Transport) -> CallToolResult {
    let n = GARBLED.fetch_add(1, Ordering::SeqCst) + 1;
    if transport == Transport::Stdio {
        {
            // One write under stdout's lock, so it never lands inside one of rmcp's lines.
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", garbage(n)).and_then(|()| stdout.flush());
        }
        std::future::pending::<()>().await;
    }
    CallToolResult::success(vec![ContentBlock::text(format!("{SENTINEL}{n}"))])
}

/// The `n`th garbage, on one line.
pub fn garbage(n: u64) -> String {
    match n % 3 {
        1 => format!("mcp-fixture garbage {n}: this is not JSON-RPC {{\"id\": "),
        2 => serde_json::json!({"garbage": n, "note": "JSON, but not JSON-RPC"}).to_string(),
        _ => serde_json::json!({
            "jsonrpc": "2.0",
            "id": format!("mcp-fixture-garbage-{n}"),
            "result": {"content": [{"type": "text", "text": "garbage"}], "isError": false},
        })
        .to_string(),
    }
}

/// If a serialized server message is a sentinel answer, the garbage to send instead.
pub fn replacement(serialized: &str) -> Option<String> {
    let start = serialized.find(SENTINEL)? + SENTINEL.len();
    let digits: String = serialized[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().map(garbage)
}

/// Whether a JSON-RPC body is a `tools/call` request.
fn is_tool_call(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|m| m.get("method").and_then(|m| m.as_str()) == Some("tools/call"))
}

/// The HTTP guard's last step: hands the request on, garbling the answer of a `tools/call`
/// when `garbage` is set.
pub async fn forward(settings: &Behaviour, mut parts: Parts, body: Bytes, next: Next) -> Response {
    let garble = settings.garbage && is_tool_call(&body);
    if garble {
        parts
            .headers
            .insert(MARK_HEADER, HeaderValue::from_static("1"));
    }
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    if !garble {
        return response;
    }
    // rmcp's answer stream ends after the call's answer: read it all, then replace it.
    let (parts, body) = response.into_parts();
    let bytes = match to_bytes(body, MAX_ANSWER).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading answer: {error}"),
            )
                .into_response();
        }
    };
    match replacement(&String::from_utf8_lossy(&bytes)) {
        Some(garbage) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            garbage,
        )
            .into_response(),
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_cycles_through_three_kinds_and_is_never_a_valid_answer() {
        assert!(serde_json::from_str::<serde_json::Value>(&garbage(1)).is_err());
        let not_rpc: serde_json::Value = serde_json::from_str(&garbage(2)).unwrap();
        assert!(not_rpc.get("jsonrpc").is_none());
        let wrong_id: serde_json::Value = serde_json::from_str(&garbage(3)).unwrap();
        assert_eq!(wrong_id["id"], "mcp-fixture-garbage-3");
        for n in 1..=3 {
            assert!(!garbage(n).contains('\n'));
        }
    }

    #[test]
    fn only_sentinel_answers_are_replaced() {
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{SENTINEL}5"}}]}}}}"#
        );
        assert_eq!(replacement(&answer), Some(garbage(5)));
        assert_eq!(replacement(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#), None);
    }
}
