//! The POST of a `tools/call` to a Streamable HTTP server, sent and read by Tether; every other
//! exchange is rmcp's reqwest client's.
//!
//! rmcp's client checks the size of each event of a streamed answer before parsing it by looking
//! at every byte (about 21 instructions a byte: 42 M of the 93 M instructions a 2 MB answer cost
//! the gateway), reads a JSON answer by trying one result type after another, and serializes
//! the call through a `serde_json::Value` copy. Here the call is written in one pass
//! ([`wire::write_call`]), a JSON answer is read in one typed pass ([`wire::read_call_answer`]),
//! and a streamed answer is bounded by [`BoundedEvents`] and read by [`event_stream`], both
//! finding line ends with `memchr` (`sse-stream`, rmcp's reader, costs 8 instructions a byte
//! more), the bounding without copying events within the limit. An event over the limit that
//! answers the call becomes a "too large" error for it ([`limit`]), so the call fails at once
//! with Tether's words and nothing reconnects to fetch it again.
//!
//! What the server's answer means is decided as rmcp's client decides it (its statuses,
//! challenges, content types and limits), so rmcp's worker, the OAuth signer above this client
//! and `GuardedClient` see the same values from either path.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue, StatusCode, header};
use rmcp::model::{
    CallToolRequest, ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
    JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use super::event_stream;
use super::limit::BoundedEvents;
use super::wire::{self, Shallow};

type Failed = StreamableHttpError<reqwest::Error>;

/// The longest `Retry-After` value kept (rmcp's bound).
const MAX_RETRY_AFTER: usize = 128;

/// What a POST accepts (`text/event-stream`, `application/json`).
const ACCEPT: &str = "text/event-stream, application/json";

/// rmcp's reqwest client, with Tether's POST for tool calls.
#[derive(Clone, Debug)]
pub(crate) struct Posting(pub reqwest::Client);

impl StreamableHttpClient for Posting {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        if let ClientJsonRpcMessage::Request(request) = &message
            && let ClientRequest::CallToolRequest(call) = &request.request
        {
            let post = Post {
                uri: &uri,
                session_id: session_id.as_deref(),
                auth_header,
                custom_headers,
                limits,
            };
            return post.call(&self.0, &request.id, call).await;
        }
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failed> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failed> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failed> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// One POST of a tool call, with what rmcp's worker gave for it.
struct Post<'a> {
    uri: &'a str,
    session_id: Option<&'a str>,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
    limits: StreamableHttpResponseLimits,
}

impl Post<'_> {
    async fn call(
        self,
        client: &reqwest::Client,
        id: &RequestId,
        call: &CallToolRequest,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let mut body = Vec::with_capacity(256);
        wire::write_call(id, call, &mut body)
            .map_err(|error| StreamableHttpError::Io(std::io::Error::other(error)))?;
        let mut request = client
            .post(self.uri)
            .header(header::ACCEPT, ACCEPT)
            .header(header::CONTENT_TYPE, JSON_MIME_TYPE)
            .body(body);
        if let Some(token) = self.auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in self.custom_headers {
            if reserved(&name) {
                return Err(StreamableHttpError::ReservedHeaderConflict(name.to_string()));
            }
            request = request.header(name, value);
        }
        if let Some(session_id) = self.session_id {
            request = request.header(HEADER_SESSION_ID, session_id);
        }
        let response = request.send().await?;
        answer(response, self.session_id.is_some(), self.limits).await
    }
}

/// Headers the transport sets itself, which a configured header may not replace (rmcp's list;
/// the protocol version is one the worker passes as a custom header).
fn reserved(name: &HeaderName) -> bool {
    [header::ACCEPT.as_str(), HEADER_SESSION_ID, HEADER_LAST_EVENT_ID]
        .iter()
        .any(|reserved| name.as_str().eq_ignore_ascii_case(reserved))
        && !name.as_str().eq_ignore_ascii_case(HEADER_MCP_PROTOCOL_VERSION)
}

/// What the server's answer to a tool call's POST means.
async fn answer(
    response: reqwest::Response,
    on_session: bool,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Failed> {
    let status = response.status();
    let headers = response.headers();
    if let Some(challenge) = headers.get(header::WWW_AUTHENTICATE)
        && matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        let challenge = challenge.to_str().map_err(|_| {
            StreamableHttpError::UnexpectedServerResponse(Cow::Borrowed(
                "invalid www-authenticate header value",
            ))
        })?;
        return Err(match status {
            StatusCode::UNAUTHORIZED => {
                StreamableHttpError::AuthRequired(AuthRequiredError::new(challenge.to_string()))
            }
            // The scope the challenge names is read by the authorizer from the header.
            _ => StreamableHttpError::InsufficientScope(InsufficientScopeError::new(
                challenge.to_string(),
                None,
            )),
        });
    }
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && on_session {
        return Err(StreamableHttpError::SessionExpired);
    }
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().trim());
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let is = |expected: &str| media_type.is_some_and(|media| media.eq_ignore_ascii_case(expected));
    let (json, events) = (is(JSON_MIME_TYPE), is(EVENT_STREAM_MIME_TYPE));
    let session = headers
        .get(HEADER_SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let status_error = (status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
        .then(|| {
            let retry_after = headers
                .get(header::RETRY_AFTER)
                .filter(|value| value.len() <= MAX_RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string);
            HttpStatusError::new(status.as_u16(), retry_after)
        });
    if !status.is_success() {
        // A JSON-RPC error in a failure's JSON body is the call's answer; anything else, the
        // status.
        let auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if json && !auth_failure && status != StatusCode::TOO_MANY_REQUESTS {
            match read_body(response, limits.max_json_response_size).await {
                Ok(body) => {
                    if let Ok(error @ JsonRpcMessage::Error(_)) =
                        serde_json::from_slice::<ServerJsonRpcMessage>(&body)
                    {
                        return Ok(StreamableHttpPostResponse::Json(error, session));
                    }
                }
                Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. })
                    if status_error.is_none() =>
                {
                    return Err(error);
                }
                Err(_) => {}
            }
        }
        return Err(match status_error {
            Some(error) => error.into(),
            None => StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "HTTP {status}"
            ))),
        });
    }
    if events {
        let body = BoundedEvents::new(response.bytes_stream().boxed(), limits.max_sse_event_size);
        return Ok(StreamableHttpPostResponse::Sse(
            event_stream::events(body),
            session,
        ));
    }
    if !json {
        return Err(StreamableHttpError::UnexpectedContentType(content_type));
    }
    let body = read_body(response, limits.max_json_response_size).await?;
    let message = match Shallow::new(&body).and_then(wire::read_call_answer) {
        Some(answer) => ServerJsonRpcMessage::Response(answer),
        None => serde_json::from_slice(&body).map_err(|error| {
            StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "could not parse the JSON answer as JSON-RPC: {error}"
            )))
        })?,
    };
    Ok(StreamableHttpPostResponse::Json(message, session))
}

/// The body, if it is no larger than `max`.
async fn read_body(response: reqwest::Response, max: usize) -> Result<Vec<u8>, Failed> {
    if response.content_length().is_some_and(|length| length > max as u64) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut chunks = response.bytes_stream();
    let mut body = Vec::new();
    while let Some(chunk) = chunks.try_next().await? {
        if chunk.len() > max - body.len() {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
