//! HTTP upstreams: Streamable HTTP through rmcp's client transport (over a guarded reqwest
//! client), legacy HTTP+SSE through [`super::sse`], and the mapping of their failures to
//! [`Fault`]s.
//!
//! Sessions never re-initialize by themselves: when the server forgets a session (HTTP 404),
//! rejects it without naming a request, or its event stream cannot be reopened, the session
//! *ends* (the [`RunningService`] stops, pending requests fail) and [`SessionEnd::fault`] says
//! why; a request that failed says why through [`classify_service_error`]. Whether and when
//! to reconnect is the policy's decision.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::{
    ClientHandler, ClientServiceExt, RoleClient, ServiceError, ServiceExt,
    model::{
        ClientJsonRpcMessage, ClientNotification, ClientRequest, RequestId, ServerJsonRpcMessage,
    },
    service::{ClientInitializeError, RunningService},
    transport::{
        StreamableHttpClientTransport,
        common::client_side_sse::SseRetryPolicy,
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpClientTransportConfig,
            StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
        },
    },
};
use sse_stream::Sse;
use url::Url;

pub use super::SessionEnd;
pub use super::http_error::HttpError;
use super::http_error::root_cause;
use super::kept::{KeptConnections, KeptFailed};
use super::oauth::Signing;
use super::post::Posting;
use super::redirect;
use super::wire::same_id;
use super::{Fault, gate::Guarded, limit, sse::SseTransport};
use crate::auth::Authorizer;
use crate::upstream::route::Routes;

mod posted;
mod streamed;

pub use posted::{NotAnswered, PendingPost, PostedCalls};

/// Requests rmcp lets run at once on one session. rmcp counts a POST until its answer, or until
/// its answer's stream opens; with a streamed answer read inside the POST up to its first
/// message (`streamed`), a call whose first message is its answer counts until that answer, as
/// one answered with JSON does. rmcp's default (16) would make the 17th request, and every one
/// after it, wait for one of them to finish: a stdio server has no such cap. Each request in
/// flight holds a connection (or an HTTP/2 stream) either way. Tool calls Tether POSTs itself
/// (`posted`) are not counted, nor held by rmcp's ordering barriers (`initialize`,
/// `server/discover`), which only the handshake sends on a session that posts its calls.
const MAX_REQUESTS_IN_FLIGHT: usize = 1024;

#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Sent with every request (e.g. `Authorization`).
    pub headers: BTreeMap<String, String>,
    /// Deadline for the whole handshake (initialize + initialized), and for each TCP connect.
    pub connect_timeout: Duration,
    /// Deadline for each HTTP exchange the transport starts by itself: notifications,
    /// replies, cancellations, the initialize POST, opening an event stream (GET), DELETE, and
    /// every legacy-SSE POST. Not for the POST of a request such as `tools/call`: a server
    /// answering with JSON holds it open for the whole call, so its deadline is the caller's
    /// (`PeerRequestOptions::timeout`, or dropping the call; either cancels the POST).
    pub request_timeout: Duration,
    /// The largest JSON answer or event accepted (see [`limit`]).
    pub max_message: usize,
    /// Whether tool calls keep their connections (`kept.rs`; config key `keep_connections`).
    pub keep_connections: bool,
    /// How Streamable HTTP sessions open (legacy SSE always uses `initialize`).
    pub lifecycle: rmcp::ClientLifecycleMode,
    /// Where what the server sends for a client's request goes (see [`Routes`]).
    pub routes: Option<Arc<Routes>>,
    /// Signs requests for a server that uses OAuth (see `crate::auth`).
    pub auth: Option<Arc<Authorizer>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpFlavor {
    Streamable,
    Sse,
}

/// A connected session with what its supervisor needs besides the service.
pub struct HttpSession<H: ClientHandler> {
    pub service: RunningService<RoleClient, H>,
    pub flavor: HttpFlavor,
    /// Why the transport ended the session, once it has.
    pub end: SessionEnd,
    /// On Streamable HTTP, tool calls may be POSTed here rather than through rmcp's loop.
    pub calls: Option<PostedCalls>,
}

impl HttpError {
    /// The fault of a connect attempt that failed with `self`, and whether the server's answer
    /// suggests a legacy SSE server at the same URL.
    fn handshake_failure(&self, url: &Endpoint) -> Failure {
        let fault = match self {
            Self::Unreachable(cause) => Fault::TransportClosed(format!("{url}: {cause}")),
            Self::CannotConnect(_) => Fault::TransportClosed(format!("{url}: {self}")),
            Self::Status(code @ (401 | 403)) => Fault::AuthRequired(*code),
            Self::Status(code @ (408 | 425 | 429)) | Self::Status(code @ 500..) => {
                Fault::HandshakeFailed(format!("{url} answered the handshake with HTTP {code}"))
            }
            Self::Status(code) => {
                let fault =
                    Fault::NotMcpEndpoint(format!("{url} answered the handshake with HTTP {code}"));
                return Failure {
                    fault,
                    legacy_hint: matches!(code, 400 | 404 | 405 | 406),
                };
            }
            Self::Timeout(_) => Fault::HandshakeTimedOut,
            Self::NotMcp(what) => Fault::NotMcpEndpoint(format!("{url}: {what}")),
            Self::Uncorrelated(_) => {
                return Failure {
                    fault: Fault::HandshakeFailed(format!("{url}: {self} during the handshake")),
                    legacy_hint: true,
                };
            }
            Self::SessionExpired | Self::Other(_) => {
                Fault::HandshakeFailed(format!("{url}: {self} during the handshake"))
            }
            Self::TooLarge { .. } => Fault::HandshakeFailed(format!("{url}: {self}")),
        };
        Failure::new(fault)
    }
}

/// The failures a request on an HTTP session can end with, as the policy sees them.
///
/// `Some` for transport failures (the request may or may not have reached the server);
/// `None` for outcomes that are not the transport's: JSON-RPC errors from the server, local
/// timeouts and cancellations.
pub fn classify_service_error(error: &ServiceError) -> Option<Fault> {
    match error {
        ServiceError::TransportSend(error) => {
            let fault = match find_http_error(error.error.as_ref()) {
                Some(Found::Streamable(error)) => streamable_runtime_fault(error),
                Some(Found::Plain(error)) => error.runtime_fault(),
                None => Fault::TransportClosed("the request could not be sent".into()),
            };
            Some(fault)
        }
        ServiceError::TransportClosed => Some(Fault::TransportClosed(
            "the session closed before the answer arrived".into(),
        )),
        _ => None,
    }
}

/// How an HTTP transport's failure of one request reads, for what follows it.
#[derive(Debug, Clone)]
pub enum RequestFailure {
    /// It never ran, and its session is gone or was never reached: HTTP 404 on a session (the
    /// server forgot it), or no connection made. Safe to send again on a fresh session,
    /// whatever it does.
    SessionGone,
    /// It never ran: HTTP 400, or a JSON-RPC error naming no request. Servers answer so for a
    /// request they will not take, and some SDKs for a session they forgot; only asking the
    /// session again tells which. rmcp's client drops the status of an error answer with a
    /// JSON-RPC body, so a widely used SDK's catch-all answer to a 5xx looks the same here.
    Refused(Refusal),
    /// The server, or a proxy in front of it, failed this request with an HTTP status that
    /// concerns the request, not the session: 408, 425, 429 or 5xx. It may have run; the
    /// session lives on.
    Status(u16),
}

/// A request refused with HTTP 400 or a JSON-RPC error naming no request.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The JSON-RPC error's code, if the answer had one.
    pub code: Option<i32>,
    /// What the server answered, in words.
    pub words: String,
}

/// What an HTTP transport's `error` says of its request (see [`RequestFailure`]); `None` for
/// every other failure (a broken stream, a timeout, credentials): the request may have run.
pub fn request_failure(error: &ServiceError) -> Option<RequestFailure> {
    let ServiceError::TransportSend(error) = error else {
        return None;
    };
    let error = match find_http_error(error.error.as_ref())? {
        Found::Streamable(StreamableHttpError::SessionExpired) => {
            return Some(RequestFailure::SessionGone);
        }
        Found::Streamable(StreamableHttpError::Client(error)) | Found::Plain(error) => error,
        Found::Streamable(_) => return None,
    };
    let refused = |code| {
        RequestFailure::Refused(Refusal {
            code,
            words: error.to_string(),
        })
    };
    Some(match error {
        HttpError::SessionExpired | HttpError::CannotConnect(_) | HttpError::Status(404) => {
            RequestFailure::SessionGone
        }
        HttpError::Status(400) => refused(None),
        HttpError::Uncorrelated(Some(code)) => refused(Some(*code)),
        HttpError::Status(status @ (408 | 425 | 429 | 500..=599)) => {
            RequestFailure::Status(*status)
        }
        _ => return None,
    })
}

enum Found<'a> {
    Streamable(&'a StreamableHttpError<HttpError>),
    Plain(&'a HttpError),
}

fn find_http_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<Found<'a>> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<StreamableHttpError<HttpError>>() {
            return Some(Found::Streamable(found));
        }
        if let Some(found) = error.downcast_ref::<HttpError>() {
            return Some(Found::Plain(found));
        }
        current = error.source();
    }
    None
}

fn streamable_runtime_fault(error: &StreamableHttpError<HttpError>) -> Fault {
    match error {
        StreamableHttpError::Client(error) => error.runtime_fault(),
        StreamableHttpError::SessionExpired => Fault::SessionExpired,
        StreamableHttpError::AuthRequired(_) => Fault::AuthRequired(401),
        StreamableHttpError::InsufficientScope(_) => Fault::AuthRequired(403),
        other => Fault::TransportClosed(category(other)),
    }
}

fn streamable_handshake_failure(error: &StreamableHttpError<HttpError>, url: &Endpoint) -> Failure {
    match error {
        StreamableHttpError::Client(error) => error.handshake_failure(url),
        StreamableHttpError::AuthRequired(_) => Failure::new(Fault::AuthRequired(401)),
        StreamableHttpError::InsufficientScope(_) => Failure::new(Fault::AuthRequired(403)),
        other => Failure::new(Fault::HandshakeFailed(format!(
            "{url}: {} during the handshake",
            category(other)
        ))),
    }
}

/// Names an rmcp error without its payload (bodies may echo anything).
fn category<E: std::error::Error + Send + Sync + 'static>(
    error: &StreamableHttpError<E>,
) -> String {
    match error {
        StreamableHttpError::Sse(_) | StreamableHttpError::Io(_) => "the event stream broke",
        StreamableHttpError::UnexpectedEndOfStream => "the event stream ended early",
        StreamableHttpError::ResponseBodyTooLarge { .. } => "the answer was too large",
        StreamableHttpError::Deserialize(_) => "the answer was not JSON-RPC",
        StreamableHttpError::SessionExpired => "the server no longer knows the session",
        StreamableHttpError::ControlRequestTimeout => "a control message got no answer in time",
        StreamableHttpError::ReservedHeaderConflict(_) => "a configured header is reserved",
        _ => "the transport closed",
    }
    .into()
}

/// What a connect attempt failed with, and whether to try legacy SSE at the same URL.
struct Failure {
    fault: Fault,
    legacy_hint: bool,
}

impl Failure {
    fn new(fault: Fault) -> Self {
        Self {
            fault,
            legacy_hint: false,
        }
    }
}

fn init_failure(error: &ClientInitializeError, url: &Endpoint) -> Failure {
    let fault = match error {
        ClientInitializeError::TransportError { error, .. } => {
            return match find_http_error(error.error.as_ref()) {
                Some(Found::Streamable(error)) => streamable_handshake_failure(error, url),
                Some(Found::Plain(error)) => error.handshake_failure(url),
                None => Failure::new(Fault::HandshakeFailed(format!(
                    "{url}: the transport failed during the handshake"
                ))),
            };
        }
        ClientInitializeError::JsonRpcError(error) => Fault::HandshakeFailed(format!(
            "{url} rejected initialize: JSON-RPC error {}: {}",
            error.code.0,
            truncate(&error.message, 200)
        )),
        // The probe said legacy and `initialize` failed: that failure describes the endpoint.
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => {
            return init_failure(fallback, url);
        }
        ClientInitializeError::ConnectionClosed(_) => {
            Fault::TransportClosed(format!("{url} closed the connection during the handshake"))
        }
        _ => Fault::HandshakeFailed(format!("{url} answered initialize unexpectedly")),
    };
    Failure::new(fault)
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// A server URL, parsed once, with the form that may appear in messages.
struct Endpoint {
    url: Url,
    /// Without userinfo, query or fragment: those may carry credentials.
    shown: String,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Self, Fault> {
        let url = Url::parse(url)
            .map_err(|error| Fault::NotMcpEndpoint(format!("invalid URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Fault::NotMcpEndpoint(format!(
                "unsupported URL scheme {:?}: only http and https",
                url.scheme()
            )));
        }
        let shown = redact(&url);
        Ok(Self { url, shown })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// `url` without userinfo, query and fragment.
pub(crate) fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

#[cfg(any(test, feature = "test-support"))]
pub async fn connect_streamable<H: ClientHandler>(
    url: &str,
    opts: &HttpOptions,
    handler: H,
) -> Result<RunningService<RoleClient, H>, Fault> {
    let url = Endpoint::parse(url)?;
    streamable(&url, opts, handler)
        .await
        .map(|session| session.service)
        .map_err(|failure| failure.fault)
}

#[cfg(any(test, feature = "test-support"))]
pub async fn connect_sse<H: ClientHandler>(
    url: &str,
    opts: &HttpOptions,
    handler: H,
) -> Result<RunningService<RoleClient, H>, Fault> {
    let url = Endpoint::parse(url)?;
    legacy(&url, opts, handler)
        .await
        .map(|session| session.service)
        .map_err(|failure| failure.fault)
}

#[cfg(any(test, feature = "test-support"))]
/// First connect of a server configured as plain "http": try Streamable HTTP; when the
/// initialize POST (before any session exists) is answered with HTTP 400/404/405/406 or an
/// id-less JSON-RPC error, try legacy SSE at the same URL (with its own `connect_timeout`).
/// Returns which flavor worked so the caller remembers it for later reconnects.
pub async fn connect_auto<H: ClientHandler>(
    url: &str,
    opts: &HttpOptions,
    make_handler: impl Fn() -> H,
) -> Result<(RunningService<RoleClient, H>, HttpFlavor), Fault> {
    connect_session(url, None, opts, make_handler)
        .await
        .map(|session| (session.service, session.flavor))
}

/// Like [`connect_streamable`], [`connect_sse`] and (with `flavor: None`) [`connect_auto`],
/// but also returns the [`SessionEnd`] that says why the session ended.
pub async fn connect_session<H: ClientHandler>(
    url: &str,
    flavor: Option<HttpFlavor>,
    opts: &HttpOptions,
    make_handler: impl Fn() -> H,
) -> Result<HttpSession<H>, Fault> {
    let url = Endpoint::parse(url)?;
    let streamable_failure = match flavor {
        Some(HttpFlavor::Sse) => {
            return legacy(&url, opts, make_handler())
                .await
                .map_err(|f| f.fault);
        }
        Some(HttpFlavor::Streamable) => {
            return streamable(&url, opts, make_handler())
                .await
                .map_err(|f| f.fault);
        }
        None => match streamable(&url, opts, make_handler()).await {
            Ok(session) => return Ok(session),
            Err(failure) if failure.legacy_hint => failure,
            Err(failure) => return Err(failure.fault),
        },
    };
    tracing::debug!(%url, fault = ?streamable_failure.fault, "not Streamable HTTP; trying legacy SSE");
    match legacy(&url, opts, make_handler()).await {
        Ok(session) => Ok(session),
        // Neither flavor: the Streamable answer describes the endpoint best.
        Err(Failure {
            fault: Fault::NotMcpEndpoint(_),
            ..
        }) => Err(streamable_failure.fault),
        Err(failure) => Err(failure.fault),
    }
}

async fn streamable<H: ClientHandler>(
    url: &Endpoint,
    opts: &HttpOptions,
    handler: H,
) -> Result<HttpSession<H>, Failure> {
    let end = SessionEnd::new();
    let kept = opts
        .keep_connections
        .then(|| KeptConnections::new(opts.connect_timeout))
        .flatten();
    let http = Posting::keeping(http_client(opts)?, kept);
    let inner = match &opts.auth {
        Some(authorizer) => {
            let signer = authorizer
                .client(http.clone())
                .await
                .map_err(|why| Failure::new(Fault::HandshakeFailed(why)))?;
            Signing::signed(http, signer, authorizer.clone())
        }
        None => Signing::plain(http),
    };
    let client = GuardedClient {
        inner,
        request_timeout: opts.request_timeout,
        end: end.clone(),
        stream_opened: Arc::default(),
        session: Arc::default(),
    };
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.url.as_str())
        .custom_headers(header_map(&opts.headers)?)
        .reinit_on_expired_session(false)
        .control_request_timeout(opts.request_timeout)
        .max_json_response_size(opts.max_message)
        .max_sse_event_size(opts.max_message)
        .max_concurrent_requests(MAX_REQUESTS_IN_FLIGHT);
    config.retry_config = Arc::new(StreamRetry { end: end.clone() });
    let mut limits = StreamableHttpResponseLimits::default();
    limits.max_json_response_size = opts.max_message;
    limits.max_sse_event_size = opts.max_message;
    let (calls, beside) = PostedCalls::new(client.clone(), config.uri.clone(), limits);
    let mut transport = Guarded::new(
        StreamableHttpClientTransport::with_client(client, config),
        end.clone(),
    )
    .with_beside(beside);
    if let Some(routes) = &opts.routes {
        transport = transport.with_routes(routes.clone());
    }
    let opening = handler.serve_with_lifecycle(transport, opts.lifecycle.clone());
    let service = match tokio::time::timeout(opts.connect_timeout, opening).await {
        Err(_) => return Err(Failure::new(Fault::HandshakeTimedOut)),
        Ok(Err(error)) => {
            let mut failure = init_failure(&error, url);
            if let (Fault::AuthRequired(_), Some(authorizer)) = (&failure.fault, &opts.auth) {
                failure.fault = Fault::AuthorizationRequired(authorizer.fault_words());
            }
            return Err(failure);
        }
        Ok(Ok(service)) => service,
    };
    Ok(HttpSession {
        service,
        flavor: HttpFlavor::Streamable,
        end,
        calls: Some(calls),
    })
}

async fn legacy<H: ClientHandler>(
    url: &Endpoint,
    opts: &HttpOptions,
    handler: H,
) -> Result<HttpSession<H>, Failure> {
    let end = SessionEnd::new();
    let client = http_client(opts)?;
    let mut headers: http::HeaderMap = header_map(&opts.headers)?.into_iter().collect();
    // An OAuth server's token is read (refreshed if need be) when the stream opens: legacy
    // SSE has no request of its own to refresh it on.
    if let Some(authorizer) = &opts.auth {
        let signer = authorizer
            .client(Posting::new(client.clone()))
            .await
            .map_err(|why| Failure::new(Fault::HandshakeFailed(why)))?;
        if let Ok(token) = signer.get_access_token().await
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            value.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, value);
        }
    }
    let handshake = async {
        let transport = SseTransport::connect(
            client,
            url.url.clone(),
            headers,
            opts.request_timeout,
            opts.max_message,
            end.clone(),
            opts.auth.clone(),
        )
        .await;
        let transport = match (transport, &opts.auth) {
            (Err(HttpError::Status(401 | 403)), Some(authorizer)) => {
                authorizer.on_unauthorized(None).await;
                return Err(Failure::new(Fault::AuthorizationRequired(
                    authorizer.fault_words(),
                )));
            }
            (transport, _) => transport.map_err(|error| error.handshake_failure(url))?,
        };
        let mut transport = Guarded::new(transport, end.clone());
        if let Some(routes) = &opts.routes {
            transport = transport.with_routes(routes.clone());
        }
        handler
            .serve(transport)
            .await
            .map_err(|error| init_failure(&error, url))
    };
    let service = match tokio::time::timeout(opts.connect_timeout, handshake).await {
        Err(_) => return Err(Failure::new(Fault::HandshakeTimedOut)),
        Ok(result) => result?,
    };
    Ok(HttpSession {
        service,
        flavor: HttpFlavor::Sse,
        end,
        calls: None,
    })
}

fn http_client(opts: &HttpOptions) -> Result<reqwest::Client, Failure> {
    // TLS set up once for every session's client (`tls.rs`), not read again for each.
    super::tls::client_builder()
        .connect_timeout(opts.connect_timeout)
        // As rmcp's default client: no idle connections kept. On a reused connection the
        // delayed ACK holds a Nagle server's answer ~40 ms (measured: +45 ms a call at 100 B;
        // rmcp issue 789). With `keep_connections`, tool calls go over `kept.rs`'s
        // connections, which acknowledge at once.
        .pool_max_idle_per_host(0)
        .redirect(redirect::same_origin())
        .build()
        .map_err(|error| {
            Failure::new(Fault::HandshakeFailed(format!(
                "cannot set up the HTTP client: {}",
                root_cause(&error)
            )))
        })
}

/// Headers the transports set themselves; configuring them would break the protocol.
const RESERVED_HEADERS: &[&str] = &["accept", "content-type", "mcp-session-id", "last-event-id"];

fn header_map(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, Failure> {
    let invalid = |what: String| Failure::new(Fault::HandshakeFailed(what));
    headers
        .iter()
        .map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("invalid header name {name:?}")))?;
            if RESERVED_HEADERS.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "header {name} is set by the transport and cannot be configured"
                )));
            }
            // The value is a secret as far as we know: never echo it.
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                invalid(format!("header {name} has a value that is not valid HTTP"))
            })?;
            value.set_sensitive(true);
            Ok((name, value))
        })
        .collect()
}

/// Bounded reconnects of rmcp's event streams (the session's GET stream and resumed POST
/// answers): a few quick attempts, then the session ends and the policy takes over.
#[derive(Debug)]
struct StreamRetry {
    end: SessionEnd,
}

impl StreamRetry {
    const ATTEMPTS: usize = 4;
    /// The library's unit tests run the schedule a hundred times faster.
    const SPEED_UP: u64 = if cfg!(test) { 100 } else { 1 };
    /// 250 ms, doubled for each failure up to 2 s.
    const FIRST_DELAY: Duration = Duration::from_micros(250_000 / Self::SPEED_UP);
    const MAX_DELAY: Duration = Duration::from_micros(2_000_000 / Self::SPEED_UP);
}

impl StreamRetry {
    /// The wait before attempt `failures + 1` to reopen a stream; `None` past the last. Ends
    /// nothing: a tool call's own stream that cannot be picked up again fails that call only.
    pub(super) fn delay(failures: usize) -> Option<Duration> {
        if failures >= Self::ATTEMPTS {
            return None;
        }
        let factor = 1u32 << failures.min(8);
        Some(
            Self::FIRST_DELAY
                .saturating_mul(factor)
                .min(Self::MAX_DELAY),
        )
    }
}

impl SseRetryPolicy for StreamRetry {
    /// For the session's own streams: giving up ends the session, as in rmcp.
    fn retry(&self, failures: usize) -> Option<Duration> {
        let delay = Self::delay(failures);
        if delay.is_none() {
            self.end.set(Fault::TransportClosed(format!(
                "the session's event stream broke and {} attempts to reopen it failed",
                Self::ATTEMPTS
            )));
        }
        delay
    }
}

/// rmcp's reqwest client with per-request deadlines, and with every answer that would leave
/// a request pending forever turned into an error. Failures that mean the session is gone
/// end it through [`SessionEnd`].
#[derive(Clone)]
struct GuardedClient {
    inner: Signing,
    request_timeout: Duration,
    end: SessionEnd,
    /// Whether the session's GET stream ever opened: only then does a 404 to it mean the
    /// server forgot the session (servers without a GET stream often answer 404, not 405).
    stream_opened: Arc<AtomicBool>,
    /// What rmcp's worker sent with the handshake's last message, for the calls Tether POSTs.
    session: posted::Recorded,
}

type Rejected = StreamableHttpError<HttpError>;

impl GuardedClient {
    /// Ends the session for failures of a session request that the session cannot survive.
    fn on_session_failure(&self, error: Rejected) -> Rejected {
        let authorization = |code: u16| match self.inner.authorizer() {
            Some(authorizer) => Fault::AuthorizationRequired(authorizer.fault_words()),
            None => Fault::AuthRequired(code),
        };
        let fault = match &error {
            StreamableHttpError::SessionExpired => Some(Fault::SessionExpired),
            StreamableHttpError::AuthRequired(_) => Some(authorization(401)),
            StreamableHttpError::InsufficientScope(_) => Some(authorization(403)),
            // Without a challenge (no `WWW-Authenticate`): the same instructions, if any.
            StreamableHttpError::Client(HttpError::Status(code @ (401 | 403))) => {
                Some(authorization(*code))
            }
            // An answer for another request: the session's exchanges are mixed up.
            StreamableHttpError::Client(error @ HttpError::Uncorrelated(None)) => {
                Some(Fault::TransportClosed(error.to_string()))
            }
            // Not a JSON-RPC error naming no request (`Uncorrelated(Some)`): servers answer so
            // for a request they refuse as well as for a session they forgot, and the
            // session's owner asks the session again to tell which (`upstream`, `await_answer`).
            _ => None,
        };
        if let Some(fault) = fault {
            self.end.set(fault);
        }
        error
    }
}

impl StreamableHttpClient for GuardedClient {
    type Error = HttpError;

    forms_without_limits!(Rejected);

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Rejected> {
        let on_session = session_id.is_some();
        if let ClientJsonRpcMessage::Notification(notification) = &message
            && let ClientNotification::InitializedNotification(_) = notification.notification
            && self.session.get().is_none()
        {
            let _ = self.session.set(posted::SessionHeaders {
                id: session_id.clone(),
                headers: custom_headers.clone(),
            });
        }
        let request = match &message {
            ClientJsonRpcMessage::Request(request) => Some(request),
            _ => None,
        };
        let request_id = request.map(|request| request.id.clone());
        let is_call = request
            .is_some_and(|request| matches!(request.request, ClientRequest::CallToolRequest(_)));
        // Where a call's result may go as the server's bytes.
        let raw = request.and_then(|request| crate::upstream::route::raw_slot(&request.request));
        let reads_first_message = streamed::reads_first_message(&message);
        // A request's POST lasts as long as the call when the server answers with JSON, so
        // its deadline is the caller's (rmcp cancels the POST when the request times out or
        // is dropped). Everything else the transport sends gets `request_timeout`.
        let deadline = match &message {
            ClientJsonRpcMessage::Request(request)
                if !matches!(request.request, ClientRequest::InitializeRequest(_)) =>
            {
                None
            }
            _ => Some(self.request_timeout),
        };
        let post = self.inner.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        );
        let answer = match deadline {
            Some(deadline) => match tokio::time::timeout(deadline, post).await {
                Ok(answer) => answer,
                Err(_) => return Err(StreamableHttpError::Client(HttpError::Timeout(deadline))),
            },
            None => post.await,
        };
        // A streamed answer whose first message is the answer goes to rmcp as JSON.
        let answer = match (answer, &request_id) {
            (Ok(StreamableHttpPostResponse::Sse(events, session)), Some(id))
                if reads_first_message =>
            {
                Ok(streamed::first_answer(events, session, id, is_call, raw).await)
            }
            (answer, _) => answer,
        };
        let result = match answer {
            // An answer over the limit fails its request at once, as "too large".
            Err(StreamableHttpError::ResponseBodyTooLarge { max_size }) if request_id.is_some() => {
                Ok(too_large_answer(request_id.as_ref(), max_size))
            }
            // A call the server refused for lack of scope (and no step-up got it): that call
            // fails, saying why; the session and the server's other tools stay.
            Err(StreamableHttpError::InsufficientScope(_))
                if is_call && let Some(authorizer) = self.inner.authorizer() =>
            {
                Ok(refused_answer(
                    request_id.as_ref(),
                    &authorizer.fault_words(),
                ))
            }
            Err(error) => Err(convert(error)),
            Ok(answer) => match uncorrelated(&answer, request_id.as_ref()) {
                Some(error) => Err(StreamableHttpError::Client(error)),
                None => Ok(answer),
            },
        };
        match result {
            // Without a session (2026-07-28), a refused authorization still ends everything.
            Err(error)
                if on_session
                    || matches!(
                        error,
                        StreamableHttpError::AuthRequired(_)
                            | StreamableHttpError::InsufficientScope(_)
                    ) =>
            {
                Err(self.on_session_failure(error))
            }
            result => result,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Rejected> {
        let delete = self
            .inner
            .delete_session(uri, session_id, auth_header, custom_headers);
        match tokio::time::timeout(self.request_timeout, delete).await {
            Err(_) => Err(StreamableHttpError::Client(HttpError::Timeout(
                self.request_timeout,
            ))),
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => match convert(error) {
                // Already gone: nothing to clean up.
                StreamableHttpError::Client(HttpError::Status(404)) => Ok(()),
                error => Err(error),
            },
        }
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Rejected> {
        let on_session = session_id.is_some();
        let get = self.inner.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        );
        let result = match tokio::time::timeout(self.request_timeout, get).await {
            Err(_) => Err(StreamableHttpError::Client(HttpError::Timeout(
                self.request_timeout,
            ))),
            Ok(result) => result.map_err(convert),
        };
        if !on_session {
            return result;
        }
        match result {
            Ok(stream) => {
                self.stream_opened.store(true, Ordering::Relaxed);
                Ok(stream)
            }
            Err(StreamableHttpError::Client(HttpError::Status(404)))
                if self.stream_opened.load(Ordering::Relaxed) =>
            {
                Err(self.on_session_failure(StreamableHttpError::SessionExpired))
            }
            Err(error) => Err(self.on_session_failure(error)),
        }
    }
}

/// The failure to report when the JSON `answer` to a POST carrying `request` (if it carried
/// one) cannot complete it.
fn uncorrelated(
    answer: &StreamableHttpPostResponse,
    request: Option<&RequestId>,
) -> Option<HttpError> {
    let StreamableHttpPostResponse::Json(message, _) = answer else {
        return None;
    };
    match (message, request) {
        (ServerJsonRpcMessage::Response(response), Some(id)) if same_id(id, &response.id) => None,
        (ServerJsonRpcMessage::Error(error), Some(id))
            if error
                .id
                .as_ref()
                .is_some_and(|answered| same_id(id, answered)) =>
        {
            None
        }
        // A JSON-RPC error that names no request is a rejection (of the request, or of the
        // session); one that names another request says the exchanges are mixed up.
        (ServerJsonRpcMessage::Error(error), _) if error.id.is_none() => {
            Some(HttpError::Uncorrelated(Some(error.error.code.0)))
        }
        (ServerJsonRpcMessage::Error(_), _) => Some(HttpError::Uncorrelated(None)),
        // Nothing else comes on this POST, so a request's JSON answer must be its response.
        (_, Some(_)) => Some(HttpError::Uncorrelated(None)),
        // Other JSON to a notification or reply: rmcp forwards it.
        (_, None) => None,
    }
}

/// The "too large" error (see [`limit::TOO_LARGE`]) answering `request`.
fn too_large_answer(request: Option<&RequestId>, limit_bytes: usize) -> StreamableHttpPostResponse {
    let error = limit::too_large_error(request, 0, limit_bytes as u64);
    let message = serde_json::from_value(error).expect("a JSON-RPC error");
    StreamableHttpPostResponse::Json(message, None)
}

/// The JSON-RPC error answering `request` that the server refused before running it (HTTP
/// 403), with `why`.
fn refused_answer(request: Option<&RequestId>, why: &str) -> StreamableHttpPostResponse {
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": request,
        "error": {"code": -32001, "message": why},
    });
    let message = serde_json::from_value(error).expect("a JSON-RPC error");
    StreamableHttpPostResponse::Json(message, None)
}

/// rmcp's reqwest errors in our vocabulary. Variants rmcp's worker acts on by type (session
/// expiry, auth challenges, no SSE support) are kept.
fn convert(error: StreamableHttpError<reqwest::Error>) -> Rejected {
    use StreamableHttpError as E;
    let ours = match error {
        E::SessionExpired => return E::SessionExpired,
        E::AuthRequired(error) => return E::AuthRequired(error),
        E::InsufficientScope(error) => return E::InsufficientScope(error),
        E::ServerDoesNotSupportSse => return E::ServerDoesNotSupportSse,
        E::ServerDoesNotSupportDeleteSession => return E::ServerDoesNotSupportDeleteSession,
        E::Client(error) => HttpError::from_reqwest(&error),
        E::HttpStatus(error) => HttpError::Status(error.status),
        // rmcp words non-2xx answers as "HTTP <status>: <body>"; the status is all we keep.
        E::UnexpectedServerResponse(text) => match text
            .strip_prefix("HTTP ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
        {
            Some(status) => HttpError::Status(status),
            None => HttpError::NotMcp("the answer was not MCP".into()),
        },
        E::UnexpectedContentType(content_type) => HttpError::NotMcp(match content_type {
            Some(content_type) => format!(
                "answered with content type {:?}, not JSON or an event stream",
                truncate(&content_type, 100)
            ),
            None => "answered without a content type".into(),
        }),
        E::Deserialize(_) => HttpError::NotMcp("the answer was not JSON-RPC".into()),
        E::Io(error) => io_failure(&error),
        E::Sse(_) => HttpError::Unreachable("the event stream broke".into()),
        E::ControlRequestTimeout => {
            HttpError::Other("a control message got no answer in time".into())
        }
        other => HttpError::Other(category(&other)),
    };
    E::Client(ours)
}

/// An IO error in our vocabulary: one of the kept connections' (`post.rs`), a header value
/// that cannot be sent, or a broken event stream.
fn io_failure(error: &std::io::Error) -> HttpError {
    let kept = error.get_ref().and_then(|inner| inner.downcast_ref::<KeptFailed>());
    if let Some(failed) = kept {
        let cause = root_cause(failed);
        return if failed.sent_nothing() {
            HttpError::CannotConnect(cause)
        } else {
            HttpError::Unreachable(format!("the request failed: {cause}"))
        };
    }
    match error.kind() {
        std::io::ErrorKind::InvalidInput => HttpError::Other(error.to_string()),
        _ => HttpError::Unreachable("the event stream broke".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_credentials() {
        let url = Url::parse("https://user:secret@example.com:8443/mcp?token=abc#frag").unwrap();
        assert_eq!(redact(&url), "https://example.com:8443/mcp");
    }

    #[test]
    fn invalid_urls_are_not_mcp_endpoints() {
        assert!(matches!(
            Endpoint::parse("not a url"),
            Err(Fault::NotMcpEndpoint(_))
        ));
        assert!(matches!(
            Endpoint::parse("ftp://example.com/"),
            Err(Fault::NotMcpEndpoint(_))
        ));
    }

    #[test]
    fn status_text_of_rmcp_is_parsed() {
        let error = convert(StreamableHttpError::UnexpectedServerResponse(
            "HTTP 405 Method Not Allowed: <html>secret</html>".into(),
        ));
        assert!(matches!(
            error,
            StreamableHttpError::Client(HttpError::Status(405))
        ));
    }

    fn json(answer: serde_json::Value) -> StreamableHttpPostResponse {
        StreamableHttpPostResponse::Json(serde_json::from_value(answer).unwrap(), None)
    }

    /// What the call path and the keepalive make of a request's failure, by what the server
    /// answered: one reading for both.
    #[test]
    fn a_requests_failure_is_read_by_what_the_server_answered() {
        let failed = |error: StreamableHttpError<HttpError>| {
            request_failure(&ServiceError::TransportSend(
                rmcp::transport::DynamicTransportError::from_parts(
                    "test",
                    std::any::TypeId::of::<()>(),
                    Box::new(error),
                ),
            ))
        };
        let client = |error| failed(StreamableHttpError::Client(error));
        for gone in [
            failed(StreamableHttpError::SessionExpired),
            client(HttpError::Status(404)),
            client(HttpError::CannotConnect("refused".into())),
        ] {
            assert!(matches!(gone, Some(RequestFailure::SessionGone)), "{gone:?}");
        }
        assert!(matches!(
            client(HttpError::Status(400)),
            Some(RequestFailure::Refused(Refusal { code: None, .. }))
        ));
        assert!(matches!(
            client(HttpError::Uncorrelated(Some(-32000))),
            Some(RequestFailure::Refused(Refusal {
                code: Some(-32000),
                ..
            }))
        ));
        for status in [408, 425, 429, 500, 502, 503] {
            assert!(matches!(
                client(HttpError::Status(status)),
                Some(RequestFailure::Status(s)) if s == status
            ));
        }
        // May have run: nothing to say of the request.
        for unknown in [
            client(HttpError::Status(409)),
            client(HttpError::Uncorrelated(None)),
            client(HttpError::Unreachable("reset".into())),
            client(HttpError::Timeout(Duration::from_secs(1))),
        ] {
            assert!(unknown.is_none(), "{unknown:?}");
        }
        assert!(request_failure(&ServiceError::TransportClosed).is_none());
    }

    #[test]
    fn answers_that_complete_no_request_are_rejections() {
        let id = RequestId::Number(7);
        let idless = json(serde_json::json!(
            {"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": "Bad Request"}}
        ));
        assert!(matches!(
            uncorrelated(&idless, Some(&id)),
            Some(HttpError::Uncorrelated(Some(-32000)))
        ));
        // Also on a notification's POST: an error there is a rejection too.
        assert!(uncorrelated(&idless, None).is_some());
        let own_error = json(serde_json::json!(
            {"jsonrpc": "2.0", "id": "7", "error": {"code": -32602, "message": "bad params"}}
        ));
        assert!(uncorrelated(&own_error, Some(&id)).is_none());
        let own = json(serde_json::json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
        assert!(uncorrelated(&own, Some(&id)).is_none());
        assert!(uncorrelated(&own, None).is_none());
        let other = json(serde_json::json!({"jsonrpc": "2.0", "id": 8, "result": {}}));
        assert!(matches!(
            uncorrelated(&other, Some(&id)),
            Some(HttpError::Uncorrelated(None))
        ));
        let others_error = json(serde_json::json!(
            {"jsonrpc": "2.0", "id": 8, "error": {"code": -32602, "message": "bad params"}}
        ));
        assert!(matches!(
            uncorrelated(&others_error, Some(&id)),
            Some(HttpError::Uncorrelated(None))
        ));
        assert!(uncorrelated(&StreamableHttpPostResponse::Accepted, Some(&id)).is_none());
    }

    /// A failure of the kept connections reads as nothing sent (so the call may go out again)
    /// only when no connection was made.
    #[tokio::test]
    async fn a_kept_connections_failure_is_worded_by_what_was_sent() {
        let kept = KeptConnections::without_proxies(Duration::from_secs(5));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let url = Url::parse(&format!("http://{closed}/mcp")).unwrap();
        let uri = kept.serves(&url).unwrap();
        let refused = kept
            .post(uri, http::HeaderMap::new(), bytes::Bytes::new())
            .await
            .unwrap_err();
        let worded = |error: KeptFailed| io_failure(&std::io::Error::other(error));
        assert!(matches!(worded(refused), HttpError::CannotConnect(_)));
        let looped = worded(KeptFailed::TooManyRedirects);
        assert_eq!(looped.to_string(), "the request failed: more than 10 redirects");
        let header = std::io::Error::new(std::io::ErrorKind::InvalidInput, "the token …");
        assert!(matches!(io_failure(&header), HttpError::Other(_)));
    }

    #[test]
    fn stream_retries_are_bounded() {
        let end = SessionEnd::new();
        let retry = StreamRetry { end: end.clone() };
        let delays: Vec<Duration> = (0..StreamRetry::ATTEMPTS)
            .map(|n| retry.retry(n).unwrap())
            .collect();
        let first = StreamRetry::FIRST_DELAY;
        assert_eq!(delays, [first, first * 2, first * 4, StreamRetry::MAX_DELAY]);
        // In real time: 250 ms to 2 s, 3.75 s in all.
        let speed_up = StreamRetry::SPEED_UP as u32;
        assert_eq!(first * speed_up, Duration::from_millis(250));
        assert_eq!(StreamRetry::MAX_DELAY * speed_up, Duration::from_secs(2));
        assert!(end.fault().is_none());
        assert_eq!(retry.retry(StreamRetry::ATTEMPTS), None);
        assert!(matches!(end.fault(), Some(Fault::TransportClosed(_))));
    }
}
