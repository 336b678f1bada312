//! How the HTTP transports (Streamable HTTP and legacy SSE) describe what went wrong: without
//! bodies, URLs or header values, so an error can be logged and shown to agents as it is.

use std::time::Duration;

use super::{Fault, limit};

/// Failures of the HTTP transports, described without bodies, URLs or header values.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Refused, reset, DNS, TLS, or the connection broke mid-answer.
    #[error("{0}")]
    Unreachable(String),
    /// No connection could be made: whatever was to be sent was not.
    #[error("cannot connect: {0}")]
    CannotConnect(String),
    #[error("HTTP {0}")]
    Status(u16),
    /// Legacy SSE: the message endpoint answered 404 (Streamable HTTP uses rmcp's own variant).
    #[error("the server no longer knows the session (HTTP 404)")]
    SessionExpired,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer was not MCP (wrong content type, HTML, non-JSON-RPC body, ...).
    #[error("{0}")]
    NotMcp(String),
    /// A JSON answer that completes no request of ours (an id-less error, another id, a
    /// message that is no response): rmcp would pass it on and leave the request pending
    /// forever, so it fails the request instead.
    #[error("the server answered with a JSON-RPC {} that names no pending request", describe_code(*.0))]
    Uncorrelated(Option<i32>),
    /// Legacy SSE: an event over `max_message` came before the stream named its endpoint.
    #[error(
        "its event stream sent a message larger than max_message ({}) before naming its endpoint",
        limit::describe_size(*limit as u64)
    )]
    TooLarge { limit: usize },
    #[error("{0}")]
    Other(String),
}

fn describe_code(code: Option<i32>) -> String {
    match code {
        Some(code) => format!("error (code {code})"),
        None => "message".into(),
    }
}

impl HttpError {
    /// Classifies a reqwest failure by kind; the text is the root cause, which (unlike the
    /// outer error) does not repeat the URL.
    pub(crate) fn from_reqwest(error: &reqwest::Error) -> Self {
        if let Some(status) = error.status() {
            return Self::Status(status.as_u16());
        }
        let cause = root_cause(error);
        if error.is_timeout() {
            Self::Unreachable(format!("timed out: {cause}"))
        } else if error.is_connect() {
            Self::CannotConnect(cause)
        } else if error.is_body() || error.is_decode() {
            Self::Unreachable(format!("the connection broke during the answer: {cause}"))
        } else {
            Self::Unreachable(format!("the request failed: {cause}"))
        }
    }

    pub(crate) fn runtime_fault(&self) -> Fault {
        match self {
            Self::Status(code @ (401 | 403)) => Fault::AuthRequired(*code),
            Self::SessionExpired => Fault::SessionExpired,
            other => Fault::TransportClosed(other.to_string()),
        }
    }
}

pub(crate) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
