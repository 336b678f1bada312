//! The POST of a `tools/call` to a Streamable HTTP server, sent and read by Tether (over kept
//! connections where they serve, [`super::kept`]), and the GET of a stream (the session's, or a
//! call's picked up again after its last event); every other exchange is rmcp's reqwest
//! client's.
//!
//! rmcp's client checks the size of each event of a streamed answer before parsing it by looking
//! at every byte (about 21 instructions a byte: 42 M of the 93 M instructions a 2 MB answer cost
//! the gateway), reads a JSON answer by trying one result type after another, and serializes
//! the call through a `serde_json::Value` copy (its worker still makes one to name the call in
//! 2026-07-28's headers). Here the call is written in one pass
//! ([`wire::write_call`]), a JSON answer is read in one typed pass ([`wire::read_answer_to_call`]),
//! and a streamed answer is bounded by [`BoundedEvents`] and read by [`event_stream`], both
//! finding line ends with `memchr` (`sse-stream`, rmcp's reader, costs 8 instructions a byte
//! more), the bounding without copying events within the limit. An event over the limit that
//! answers the call becomes a "too large" error for it ([`limit`]), so the call fails at once
//! with Tether's words and nothing reconnects to fetch it again. A GET's stream is read the
//! same way. rmcp's reader ends a stream on an event over the limit: the session's GET stream
//! for good (every later notification and request of the server on it lost), and a call's
//! stream that Tether picks up again (`http/posted.rs`) began again with the same event.
//!
//! A JSON answer whose result the agent gets unchanged goes to the call's slot as the server
//! wrote it, the body's buffer moved there (`lines/raw.rs`, [`raw::answer_into`]).
//!
//! What the server's answer means is decided as rmcp's client decides it (its statuses,
//! challenges, content types and limits), so rmcp's worker, the OAuth signer above this client
//! and `GuardedClient` see the same values from either path.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue, StatusCode, header};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use super::event_stream;
use super::kept::{KeptConnections, KeptFailed};
use super::limit::BoundedEvents;
use super::lines::raw::{self, RawResult};
use super::redirect;
use super::wire;
use crate::upstream::route;

type Failed = StreamableHttpError<reqwest::Error>;

/// The longest `Retry-After` value kept (rmcp's bound).
const MAX_RETRY_AFTER: usize = 128;

/// What a POST or a GET accepts (`text/event-stream`, `application/json`), as rmcp's client.
const ACCEPT: &str = "text/event-stream, application/json";

/// rmcp's reqwest client, with Tether's POST for tool calls.
#[derive(Clone, Debug)]
pub(crate) struct Posting {
    client: reqwest::Client,
    /// Where tool calls go when it serves the endpoint (`kept.rs`).
    kept: Option<KeptConnections>,
    /// The endpoint last posted to, parsed: a session posts every call to the same one, and
    /// reqwest parses a URL given as text on every request (~18 k instructions a call).
    endpoint: Arc<Mutex<Option<Arc<Endpoint>>>>,
}

/// An endpoint as rmcp's worker gives it, and parsed.
#[derive(Clone, Debug)]
struct Endpoint {
    text: Arc<str>,
    url: reqwest::Url,
    /// Set where the kept connections serve it.
    kept: Option<http::Uri>,
}

impl Posting {
    pub(crate) fn new(client: reqwest::Client) -> Self {
        Self {
            client,
            kept: None,
            endpoint: Arc::default(),
        }
    }

    /// Tool calls to the endpoints `kept` serves go over its connections.
    pub(crate) fn keeping(client: reqwest::Client, kept: Option<KeptConnections>) -> Self {
        Self {
            kept,
            ..Self::new(client)
        }
    }

    /// `uri` parsed, from the last call's parse when it is the same; `None` if it does not
    /// parse (reqwest then fails the request as it would have).
    fn endpoint(&self, uri: &Arc<str>) -> Option<Arc<Endpoint>> {
        let mut last = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(endpoint) = last.as_ref()
            && endpoint.text == *uri
        {
            return Some(endpoint.clone());
        }
        let url = reqwest::Url::parse(uri).ok()?;
        let kept = self.kept.as_ref().and_then(|kept| kept.serves(&url));
        let endpoint = Arc::new(Endpoint {
            text: uri.clone(),
            url,
            kept,
        });
        *last = Some(endpoint.clone());
        Some(endpoint)
    }
}

/// rmcp's worker (and its OAuth client above this one) posts only through
/// `post_message_with_response_limits`; `post_message_with_max_sse_event_size` is left to the
/// trait, as for every client of Tether's.
impl StreamableHttpClient for Posting {
    type Error = reqwest::Error;

    forms_without_limits!(Failed);

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
            let mut body = Vec::with_capacity(256);
            // Cannot fail for a message rmcp could hold (string keys, finite numbers).
            let written = wire::write_call(&request.id, call, &mut body);
            // The call (a copy where rmcp's worker POSTs it: the worker keeps the original) is
            // no longer needed once written: its arguments go back to the call's route.
            let raw = route::raw_slot(&request.request).map(|slot| (request.id.clone(), slot));
            route::hand_back(message);
            written.map_err(|error| StreamableHttpError::Io(std::io::Error::other(error)))?;
            let post = Post {
                uri: &uri,
                endpoint: self.endpoint(&uri),
                session_id: session_id.as_deref(),
                auth_header,
                custom_headers,
                limits,
                raw,
            };
            // Boxed, as rmcp's client below: the layers above (and rmcp's worker, which moves
            // the whole future) then carry a pointer, not kilobytes of reqwest's state.
            return Box::pin(post.send(self, body)).await;
        }
        let post = self.client.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        );
        Box::pin(post).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failed> {
        self.client
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    /// The session's stream, or a call's stream picked up again after `last_event_id`, read as
    /// a call's streamed answer is: bounded by [`BoundedEvents`], so an event over the limit is
    /// dropped (an answer becomes its request's "too large" error) and the stream goes on, where
    /// rmcp's reader would end the stream (see the module documentation). Statuses and content types
    /// mean what they mean to rmcp's client.
    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failed> {
        let mut headers = request_headers(
            auth_header.as_deref(),
            &custom_headers,
            session_id.as_deref(),
        )?;
        if let Some(last_event_id) = last_event_id {
            let value = HeaderValue::try_from(last_event_id)
                .map_err(|_| unsendable("the last event's id"))?;
            headers.insert(HEADER_LAST_EVENT_ID, value);
        }
        let request = match self.endpoint(&uri) {
            Some(endpoint) => self.client.get(endpoint.url.clone()),
            None => self.client.get(uri.as_ref()),
        };
        let response = request.headers(headers).send().await?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
            && let Some(challenge) = response.headers().get(header::WWW_AUTHENTICATE)
        {
            return Err(refused(status, challenge)?);
        }
        if let Some(error) = status_error(status, response.headers()) {
            return Err(error.into());
        }
        let response = response.error_for_status()?;
        let content_type = response.headers().get(header::CONTENT_TYPE);
        // rmcp's client takes a JSON content type here too, and reads the body as events.
        if Media::of(content_type) == Media::Other {
            let content_type =
                content_type.map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
            return Err(StreamableHttpError::UnexpectedContentType(content_type));
        }
        Ok(events(response, max_sse_event_size))
    }
}

/// One POST of a tool call, with what rmcp's worker gave for it.
struct Post<'a> {
    uri: &'a str,
    /// `uri` parsed, where it parses.
    endpoint: Option<Arc<Endpoint>>,
    session_id: Option<&'a str>,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
    limits: StreamableHttpResponseLimits,
    /// The call's id and where its result may go as the server's bytes.
    raw: Option<(RequestId, Arc<RawResult>)>,
}

impl Post<'_> {
    /// Sends the call written as `body` and reads what the answer means.
    async fn send(
        mut self,
        clients: &Posting,
        body: Vec<u8>,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let body = Bytes::from(body);
        let endpoint = self.endpoint.take();
        let response = match (&clients.kept, endpoint.as_deref()) {
            (Some(kept), Some(Endpoint { url, kept: Some(uri), .. })) => {
                self.post_kept(kept, url, uri.clone(), body).await?
            }
            (_, endpoint) => {
                let request = match endpoint {
                    Some(endpoint) => clients.client.post(endpoint.url.clone()),
                    None => clients.client.post(self.uri),
                };
                request.headers(self.headers()?).body(body).send().await?
            }
        };
        answer(response, self.session_id.is_some(), self.limits, self.raw).await
    }

    /// Sends over the kept connections, following redirects as reqwest's client does.
    async fn post_kept(
        &self,
        kept: &KeptConnections,
        first: &reqwest::Url,
        mut uri: http::Uri,
        body: Bytes,
    ) -> Result<reqwest::Response, Failed> {
        // Carried to `http.rs` in an IO error, the one variant of rmcp's error that holds
        // another error than reqwest's.
        let failed = |error: KeptFailed| StreamableHttpError::Io(std::io::Error::other(error));
        // Where the POST went last, once redirected.
        let (mut redirected, mut referer): (Option<reqwest::Url>, _) = (None, None);
        for _ in 0..=redirect::MAX_REDIRECTS {
            let mut headers = self.headers()?;
            if let Some(referer) = referer.take() {
                headers.insert(header::REFERER, referer);
            }
            let response = kept.post(uri, headers, body.clone()).await.map_err(failed)?;
            let current = redirected.as_ref().unwrap_or(first);
            // A target these connections do not serve (credentials in its URL) is not followed.
            let Some((next, next_uri)) = redirect::next(first, current, &response)
                .and_then(|next| kept.serves(&next).map(|uri| (next, uri)))
            else {
                return Ok(response);
            };
            referer = redirect::referer(current);
            (redirected, uri) = (Some(next), next_uri);
        }
        Err(failed(KeptFailed::TooManyRedirects))
    }

    /// The headers of the POST: what MCP asks for, the token, the configured ones and the
    /// session's id.
    fn headers(&self) -> Result<http::HeaderMap, Failed> {
        let mut headers = request_headers(
            self.auth_header.as_deref(),
            &self.custom_headers,
            self.session_id,
        )?;
        // A configured one is kept, as rmcp's client keeps it for the other requests.
        headers
            .entry(header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static(JSON_MIME_TYPE));
        Ok(headers)
    }
}

/// The headers of a POST or GET: what it accepts, the token, the configured ones and the
/// session's id.
fn request_headers(
    auth_header: Option<&str>,
    custom_headers: &HashMap<HeaderName, HeaderValue>,
    session_id: Option<&str>,
) -> Result<http::HeaderMap, Failed> {
    let mut headers = http::HeaderMap::with_capacity(5 + custom_headers.len());
    headers.insert(header::ACCEPT, HeaderValue::from_static(ACCEPT));
    if let Some(token) = auth_header {
        let mut value = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| unsendable("the access token"))?;
        value.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, value);
    }
    for (name, value) in custom_headers {
        if reserved(name) {
            return Err(StreamableHttpError::ReservedHeaderConflict(name.to_string()));
        }
        headers.append(name, value.clone());
    }
    if let Some(session_id) = session_id {
        let value = HeaderValue::from_str(session_id).map_err(|_| unsendable("the session id"))?;
        headers.insert(HEADER_SESSION_ID, value);
    }
    Ok(headers)
}

/// `what` has characters a header cannot carry (`http.rs` reads the kind).
fn unsendable(what: &str) -> Failed {
    let words = format!("{what} cannot be sent in a header");
    StreamableHttpError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, words))
}

/// Headers the transport sets itself, which a configured header may not replace (rmcp's list
/// but the protocol version, which rmcp's worker passes as a custom header).
fn reserved(name: &HeaderName) -> bool {
    [header::ACCEPT.as_str(), HEADER_SESSION_ID, HEADER_LAST_EVENT_ID]
        .iter()
        .any(|reserved| name.as_str().eq_ignore_ascii_case(reserved))
}

/// The `scope` a `WWW-Authenticate` challenge names, quoted or not.
fn scope(challenge: &str) -> Option<String> {
    let start = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let value = &challenge[start..];
    let scope = match value.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => value
            .split(|c: char| c == ',' || c == ';' || c.is_whitespace())
            .next()
            .unwrap_or_default(),
    };
    (!scope.is_empty()).then(|| scope.to_string())
}

/// A 401 or 403 `status` with its `WWW-Authenticate` challenge, as rmcp's client reads it:
/// authorization required, or a scope missing (`Err` if the challenge is not text).
fn refused(status: StatusCode, challenge: &HeaderValue) -> Result<Failed, Failed> {
    let challenge = challenge.to_str().map_err(|_| {
        StreamableHttpError::UnexpectedServerResponse(Cow::Borrowed(
            "invalid www-authenticate header value",
        ))
    })?;
    Ok(match status {
        StatusCode::UNAUTHORIZED => {
            StreamableHttpError::AuthRequired(AuthRequiredError::new(challenge.to_string()))
        }
        _ => StreamableHttpError::InsufficientScope(InsufficientScopeError::new(
            challenge.to_string(),
            scope(challenge),
        )),
    })
}

/// A failure status a client may retry after (429 and 5xx), with a bounded `Retry-After`.
fn status_error(status: StatusCode, headers: &http::HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .filter(|value| value.len() <= MAX_RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// What a `Content-Type` announces, read as rmcp reads it: the part before any `;`, without
/// spaces and tabs around it, in any case.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Media {
    Json,
    Events,
    Other,
}

impl Media {
    fn of(content_type: Option<&HeaderValue>) -> Self {
        let essence = content_type
            .and_then(|value| value.as_bytes().split(|byte| *byte == b';').next())
            .and_then(|essence| std::str::from_utf8(essence).ok())
            .map(|essence| essence.trim_matches([' ', '\t']));
        let is = |expected: &str| essence.is_some_and(|media| media.eq_ignore_ascii_case(expected));
        if is(JSON_MIME_TYPE) {
            Self::Json
        } else if is(EVENT_STREAM_MIME_TYPE) {
            Self::Events
        } else {
            Self::Other
        }
    }
}

/// The events of a streamed body, each bounded to `max` bytes (see the module documentation).
fn events(response: reqwest::Response, max: usize) -> BoxStream<'static, Result<Sse, SseError>> {
    event_stream::events(BoundedEvents::new(response.bytes_stream().boxed(), max))
}

/// What the server's answer to a tool call's POST means.
async fn answer(
    response: reqwest::Response,
    on_session: bool,
    limits: StreamableHttpResponseLimits,
    raw: Option<(RequestId, Arc<RawResult>)>,
) -> Result<StreamableHttpPostResponse, Failed> {
    let status = response.status();
    let headers = response.headers();
    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        && let Some(challenge) = headers.get(header::WWW_AUTHENTICATE)
    {
        return Err(refused(status, challenge)?);
    }
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && on_session {
        return Err(StreamableHttpError::SessionExpired);
    }
    let media = Media::of(headers.get(header::CONTENT_TYPE));
    let (json, events) = (media == Media::Json, media == Media::Events);
    let session = headers
        .get(HEADER_SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let status_error = status_error(status, headers);
    if !status.is_success() {
        // A JSON-RPC error in a failure's JSON body is the call's answer; anything else, the
        // status.
        let auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if json && !auth_failure && status != StatusCode::TOO_MANY_REQUESTS {
            match read_body(response, limits.max_json_response_size).await {
                Ok(body) => {
                    // Read as text first, as rmcp does (invalid UTF-8 replaced).
                    let body = String::from_utf8_lossy(&body);
                    if let Ok(JsonRpcMessage::Error(error)) =
                        serde_json::from_str::<ServerJsonRpcMessage>(&body)
                        // Unlike rmcp: an error naming no request in a 5xx's body (a widely
                        // used SDK's catch-all) says no more than the status, which is kept: the
                        // request may have run, and the session lives on.
                        && (error.id.is_some() || status_error.is_none())
                    {
                        let error = JsonRpcMessage::Error(error);
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
        let events = self::events(response, limits.max_sse_event_size);
        return Ok(StreamableHttpPostResponse::Sse(events, session));
    }
    if !json {
        let content_type = (response.headers().get(header::CONTENT_TYPE))
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        return Err(StreamableHttpError::UnexpectedContentType(content_type));
    }
    let mut body = read_body(response, limits.max_json_response_size).await?;
    if let Some((id, slot)) = raw {
        match raw::answer_into(body, |answered| wire::same_id(&id, answered), &slot) {
            Ok(placeholder) => return Ok(StreamableHttpPostResponse::Json(placeholder, session)),
            Err(unchanged) => body = unchanged,
        }
    }
    let message = wire::read_answer_to_call(&body).map_err(|error| {
        StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
            "could not parse the JSON answer as JSON-RPC: {error}"
        )))
    })?;
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

#[cfg(test)]
mod tests {
    use axum::extract::{Path, State};
    use axum::response::Response;
    use rmcp::model::{CallToolRequest, CallToolRequestParams, JsonRpcRequest, RequestId};

    use super::*;

    /// A content type is read as rmcp reads it: its parameters, the spaces and tabs around it
    /// and its case do not matter; anything unreadable is neither JSON nor events.
    #[test]
    fn a_content_type_is_read_for_its_media_type_alone() {
        let of = |value: &[u8]| Media::of(Some(&HeaderValue::from_bytes(value).unwrap()));
        assert_eq!(Media::of(None), Media::Other);
        assert_eq!(of(b"application/json"), Media::Json);
        assert_eq!(of(b" Application/JSON ; charset=utf-8"), Media::Json);
        assert_eq!(of(b"\ttext/event-stream;x=y"), Media::Events);
        assert_eq!(of(b"TEXT/EVENT-STREAM"), Media::Events);
        assert_eq!(of(b"application/jsonx"), Media::Other);
        assert_eq!(of(b"text/plain"), Media::Other);
        assert_eq!(of(b"application/json\xff"), Media::Other);
    }

    /// What a server answers in each case: status, headers, body.
    fn case(number: usize) -> (u16, Vec<(&'static str, &'static str)>, String) {
        let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no"}}"#;
        let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}"#;
        let json = ("content-type", "application/json");
        let text = ("content-type", "text/plain");
        match number {
            0 => (401, vec![("www-authenticate", r#"Bearer resource_metadata="m""#), json], error.into()),
            1 => (403, vec![("www-authenticate", r#"Bearer error="insufficient_scope", scope="a b""#)], String::new()),
            2 => (403, vec![("www-authenticate", "Bearer scope=files:read, error=x")], String::new()),
            3 => (401, vec![text], "who are you".into()),
            4 => (401, vec![json], error.into()),
            5 => (202, vec![], String::new()),
            6 => (204, vec![], String::new()),
            7 => (404, vec![text], "gone".into()),
            8 => (429, vec![("retry-after", "5"), text], "slow down".into()),
            9 => (429, vec![json], error.into()),
            10 => (500, vec![json], error.into()),
            11 => (500, vec![text], "broken".into()),
            12 => (503, vec![json], r#"{"not":"json-rpc"}"#.into()),
            13 => (400, vec![json], r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}"#.into()),
            14 => (400, vec![text], "bad".into()),
            15 => (200, vec![], answer.into()),
            16 => (200, vec![("content-type", "Application/JSON ; charset=utf-8")], answer.into()),
            17 => (200, vec![json, ("mcp-session-id", "s2")], answer.into()),
            18 => (200, vec![json], r#"{"x":1}"#.into()),
            19 => (200, vec![json], format!(r#"{{"pad":"{}"}}"#, "x".repeat(2000))),
            20 => (200, vec![("content-type", "text/html")], "<html>".into()),
            21 => (200, vec![("content-type", "text/event-stream"), ("mcp-session-id", "s3")],
                format!("id: 0\nretry: 10\ndata:\n\nevent: message\ndata: {answer}\n\n")),
            22 => (307, vec![("location", "/case/17")], String::new()),
            23 => (307, vec![("location", "http://localhost:1/case/17")], String::new()),
            LOOP => (308, vec![("location", "/case/24")], String::new()),
            NAMELESS_500 => (500, vec![json], r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal server error"}}"#.into()),
            _ => (301, vec![("location", "/case/17")], String::new()),
        }
    }

    const CASES: usize = 27;
    /// A 5xx whose JSON-RPC error names no request: rmcp passes the error on, Tether the status.
    const NAMELESS_500: usize = 26;

    /// The case that redirects to itself.
    const LOOP: usize = 24;

    type Seen = Arc<Mutex<Vec<(Vec<(String, String)>, serde_json::Value)>>>;

    async fn respond(
        State(seen): State<Seen>,
        Path(number): Path<usize>,
        request: axum::extract::Request,
    ) -> Response {
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let mut headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .filter(|(name, _)| !matches!(name.as_str(), "host" | "content-length"))
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_string()))
            .collect();
        headers.sort();
        let body = serde_json::from_slice(&body).unwrap_or_default();
        seen.lock().unwrap().push((headers, body));
        let (status, headers, body) = case(number);
        let mut response = Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(name, value);
        }
        response.body(axum::body::Body::from(body)).unwrap()
    }

    /// An outcome in words, what the worker and `GuardedClient` act on.
    async fn describe(outcome: Result<StreamableHttpPostResponse, Failed>) -> String {
        match outcome {
            Ok(StreamableHttpPostResponse::Accepted) => "accepted".into(),
            Ok(StreamableHttpPostResponse::Json(message, session)) => {
                format!("json {} {session:?}", serde_json::to_string(&message).unwrap())
            }
            Ok(StreamableHttpPostResponse::Sse(events, session)) => {
                let events: Vec<_> = events.map(|event| format!("{:?}", event.ok())).collect().await;
                format!("sse {events:?} {session:?}")
            }
            Ok(other) => format!("{other:?}"),
            Err(StreamableHttpError::AuthRequired(error)) => {
                format!("auth {}", error.www_authenticate_header)
            }
            Err(StreamableHttpError::InsufficientScope(error)) => format!(
                "scope {} {:?}",
                error.www_authenticate_header, error.required_scope
            ),
            Err(StreamableHttpError::HttpStatus(error)) => {
                format!("status {} {:?}", error.status, error.retry_after)
            }
            // GuardedClient keeps the status of "HTTP <status>: …" and nothing else.
            Err(StreamableHttpError::UnexpectedServerResponse(text)) => {
                format!("unexpected {:?}", text.strip_prefix("HTTP ").map(|rest| &rest[..3]))
            }
            Err(StreamableHttpError::Client(error)) => format!("client {:?}", error.status()),
            Err(other) => format!("{other}"),
        }
    }

    /// Tether's POST decides as rmcp's reqwest client does, and sends what it sends.
    #[tokio::test]
    async fn a_call_is_sent_and_its_answer_read_as_rmcp_does() {
        let seen = Seen::default();
        let app = axum::Router::new()
            .route("/case/{number}", axum::routing::post(respond))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let call = CallToolRequest::new(
            CallToolRequestParams::new("echo")
                .with_arguments(serde_json::json!({"text": "é"}).as_object().unwrap().clone()),
        );
        let message = ClientJsonRpcMessage::Request(JsonRpcRequest::new(
            RequestId::Number(1),
            ClientRequest::CallToolRequest(call),
        ));
        let headers = HashMap::from([(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static("2025-11-25"),
        )]);
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_json_response_size = 1024;
        let client = reqwest::Client::new();
        let same_origin = reqwest::Client::builder()
            .redirect(redirect::same_origin())
            .build()
            .unwrap();
        let kept = KeptConnections::without_proxies(std::time::Duration::from_secs(5));
        for number in 0..CASES {
            let uri: Arc<str> = format!("http://{address}/case/{number}").into();
            // The outcome in words, and every request the server saw (a redirect's too).
            let post = |posting: Option<Posting>| {
                let (uri, message, headers) = (uri.clone(), message.clone(), headers.clone());
                let seen = seen.clone();
                async move {
                    let sent = match posting {
                        Some(posting) => posting.post_message_with_response_limits(
                            uri, message, Some("s1".into()), Some("token".into()), headers, limits,
                        ).await,
                        None => reqwest::Client::new().post_message_with_response_limits(
                            uri, message, Some("s1".into()), Some("token".into()), headers, limits,
                        ).await,
                    };
                    let outcome = describe(sent).await;
                    (outcome, std::mem::take(&mut *seen.lock().unwrap()))
                }
            };
            let theirs = post(None).await;
            let ours = post(Some(Posting::new(client.clone()))).await;
            if number == NAMELESS_500 {
                assert!(theirs.0.starts_with("json "), "{theirs:?}");
                assert_eq!(ours.0, "status 500 None");
                assert_eq!(ours.1, theirs.1, "the request sent");
                continue;
            }
            assert_eq!(ours, theirs, "case {number}: {:?}", case(number));
            // Over kept connections as over reqwest's, with the session's redirect rule.
            let reqwests = post(Some(Posting::new(same_origin.clone()))).await;
            let kept = post(Some(Posting::keeping(same_origin.clone(), Some(kept.clone())))).await;
            if number == LOOP {
                // Both give up after as many redirects, each in its own error.
                assert_eq!(kept.1, reqwests.1, "the requests of a redirect loop");
                assert_eq!(reqwests.0, "client None");
                assert_eq!(kept.0, "Io error: more than 10 redirects");
            } else {
                assert_eq!(kept, reqwests, "case {number} kept: {:?}", case(number));
            }
        }
    }

    /// Tether's GET of a stream decides as rmcp's reqwest client does (statuses, challenges,
    /// content types, redirects), sends what it sends, and reads the same events.
    #[tokio::test]
    async fn a_stream_is_asked_for_and_its_answer_read_as_rmcp_does() {
        let seen = Seen::default();
        let app = axum::Router::new()
            .route("/case/{number}", axum::routing::get(respond))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let headers = HashMap::from([(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static("2025-11-25"),
        )]);
        for number in 0..CASES {
            let uri: Arc<str> = format!("http://{address}/case/{number}").into();
            let get = |ours: bool| {
                let (uri, headers, seen) = (uri.clone(), headers.clone(), seen.clone());
                async move {
                    let (session, last, token) =
                        (Some("s1".into()), Some("e7".to_string()), Some("token".to_string()));
                    let opened = match ours {
                        true => Posting::new(reqwest::Client::new())
                            .get_stream_with_max_sse_event_size(
                                uri, session, last, token, headers, 1 << 20,
                            )
                            .await,
                        false => reqwest::Client::new()
                            .get_stream_with_max_sse_event_size(
                                uri, session, last, token, headers, 1 << 20,
                            )
                            .await,
                    };
                    let outcome = match opened {
                        Ok(events) => {
                            let events: Vec<_> =
                                events.map(|event| format!("{:?}", event.ok())).collect().await;
                            format!("events {events:?}")
                        }
                        Err(error) => describe(Err(error)).await,
                    };
                    (outcome, std::mem::take(&mut *seen.lock().unwrap()))
                }
            };
            let theirs = get(false).await;
            let ours = get(true).await;
            assert_eq!(ours, theirs, "case {number}: {:?}", case(number));
        }
    }

    /// The call's route gets its arguments back from the POST whether the server was reached
    /// (a second try of a read-only tool lost later may use them) or not (a call that never
    /// left may go out again): the call path keeps no copy of its own.
    #[tokio::test]
    async fn a_posted_call_hands_its_arguments_back_whether_or_not_the_server_was_reached() {
        let app = axum::Router::new()
            .route("/case/{number}", axum::routing::post(respond))
            .with_state(Seen::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let down = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let arguments = serde_json::json!({"text": "é"}).as_object().unwrap().clone();
        for (uri, answered) in [
            (format!("http://{up}/case/16"), true),
            (format!("http://{down}/mcp"), false),
        ] {
            let route = Arc::new(crate::upstream::route::CallRoute::default());
            let mut call = CallToolRequest::new(
                CallToolRequestParams::new("echo").with_arguments(arguments.clone()),
            );
            call.extensions
                .insert(crate::upstream::route::RouteTag(route.clone()));
            let message = ClientJsonRpcMessage::Request(JsonRpcRequest::new(
                RequestId::Number(1),
                ClientRequest::CallToolRequest(call),
            ));
            let kept = KeptConnections::without_proxies(std::time::Duration::from_secs(5));
            for (posting, over_kept) in [
                (Posting::new(reqwest::Client::new()), false),
                (Posting::keeping(reqwest::Client::new(), Some(kept)), true),
            ] {
                let sent = posting
                    .post_message(uri.as_str().into(), message.clone(), None, None, HashMap::new())
                    .await;
                // The kept connections' refusal reads as nothing sent (`http.rs` lets such a
                // call go out again).
                if over_kept && !answered {
                    let Err(StreamableHttpError::Io(error)) = &sent else {
                        panic!("{}", describe(sent).await);
                    };
                    let kept = error.get_ref().and_then(|e| e.downcast_ref::<KeptFailed>());
                    assert!(kept.is_some_and(KeptFailed::sent_nothing), "{error}");
                }
                assert_eq!(sent.is_ok(), answered, "{}", describe(sent).await);
                assert_eq!(route.take_back(), Some(Some(arguments.clone())));
            }
        }
    }

    #[test]
    fn the_endpoint_is_parsed_once_while_it_stays_the_same() {
        let posting = Posting::new(reqwest::Client::new());
        let first: Arc<str> = "http://127.0.0.1:1/mcp".into();
        assert_eq!(posting.endpoint(&first).unwrap().url.as_str(), &*first);
        let cached = posting.endpoint.lock().unwrap().clone().unwrap();
        // The same text, another allocation: the parse is reused.
        let again: Arc<str> = "http://127.0.0.1:1/mcp".into();
        assert!(Arc::ptr_eq(&posting.endpoint(&again).unwrap(), &cached));
        assert!(Arc::ptr_eq(&posting.endpoint.lock().unwrap().as_ref().unwrap().text, &first));
        // Another endpoint replaces it; one that does not parse is left to reqwest.
        let other: Arc<str> = "http://127.0.0.1:2/other".into();
        assert_eq!(posting.endpoint(&other).unwrap().url.as_str(), &*other);
        assert!(posting.endpoint(&"not a url".into()).is_none());
        assert_eq!(posting.endpoint.lock().unwrap().as_ref().unwrap().text, other);
    }

    #[test]
    fn tool_calls_go_over_kept_connections_where_they_serve() {
        let kept = KeptConnections::without_proxies(std::time::Duration::from_secs(1));
        let posting = Posting::keeping(reqwest::Client::new(), Some(kept));
        let plain = posting.endpoint(&"http://127.0.0.1:1/mcp".into()).unwrap();
        assert_eq!(plain.kept.as_ref().unwrap(), "http://127.0.0.1:1/mcp");
        let tls = posting.endpoint(&"https://127.0.0.1:1/mcp".into()).unwrap();
        assert_eq!(tls.kept.as_ref().unwrap(), "https://127.0.0.1:1/mcp");
        let secret = posting.endpoint(&"http://u:p@127.0.0.1:1/mcp".into()).unwrap();
        assert!(secret.kept.is_none());
        let unkept = Posting::new(reqwest::Client::new());
        assert!(unkept.endpoint(&"http://127.0.0.1:1/mcp".into()).unwrap().kept.is_none());
    }

    /// A JSON answer with `body`, as reqwest hands it over.
    fn json_answer(body: &str) -> reqwest::Response {
        let response = http::Response::builder()
            .header("content-type", "application/json")
            .body(body.to_string())
            .unwrap();
        reqwest::Response::from(response)
    }

    #[tokio::test]
    async fn a_json_answer_whose_result_passes_unchanged_goes_to_the_calls_slot() {
        use crate::transport::lines::raw::is_placeholder;
        use rmcp::model::ServerResult;

        let limits = StreamableHttpResponseLimits::default();
        let call = |body: &str, id: RequestId| {
            let slot = Arc::new(RawResult::default());
            let raw = Some((id, slot.clone()));
            let read = answer(json_answer(body), true, limits, raw);
            async move {
                let Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Response(answer), _)) =
                    read.await
                else {
                    panic!("a JSON answer");
                };
                let ServerResult::CallToolResult(result) = answer.result else {
                    panic!("a call's result");
                };
                (result, slot.take().map(|bytes| bytes.as_slice().to_vec()))
            }
        };
        // A 2026-07-28 server's result, its id echoed as a string: the bytes, `resultType` out.
        let modern = r#"{"jsonrpc":"2.0","id":"5","result":{"resultType":"complete","content":[],"x":1.50}}"#;
        let (result, bytes) = call(modern, RequestId::Number(5)).await;
        assert!(is_placeholder(&result));
        assert_eq!(bytes.as_deref(), Some(&br#"{"content":[],"x":1.50}"#[..]));
        // An error result, whose words the policy reads, and another request's answer: decoded.
        let error = r#"{"jsonrpc":"2.0","id":5,"result":{"content":[],"isError":true}}"#;
        let (result, bytes) = call(error, RequestId::Number(5)).await;
        assert_eq!((result.is_error, bytes), (Some(true), None));
        let other = r#"{"jsonrpc":"2.0","id":6,"result":{"content":[{"type":"text","text":"six"}]}}"#;
        let (result, bytes) = call(other, RequestId::Number(5)).await;
        assert_eq!(bytes, None, "not kept");
        assert_eq!(result.content[0].as_text().unwrap().text, "six", "decoded");
    }

    #[test]
    fn a_challenges_scope_is_read_quoted_or_not() {
        assert_eq!(scope(r#"Bearer error="insufficient_scope", scope="a b""#).as_deref(), Some("a b"));
        assert_eq!(scope("Bearer Scope=files:read, error=x").as_deref(), Some("files:read"));
        assert_eq!(scope("Bearer error=x"), None);
    }
}
