//! The Streamable HTTP endpoint: where it listens, how it protects itself, and a drain that
//! lets answers in flight go out before it closes.
//!
//! Browsers' `Origin` must be a loopback origin or one the operator allowed (DNS-rebinding
//! protection, checked by rmcp before any session sees the request), and an optional bearer
//! token is required on every request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::Gateway;

pub(super) mod calls;
pub(super) mod results;

impl Gateway {
    /// Serves Streamable HTTP at `http://ADDR/mcp` until [`HttpServer::close`].
    pub(crate) async fn serve_http(
        self,
        bind: SocketAddr,
        mut options: HttpOptions,
    ) -> Result<HttpServer, crate::Error> {
        let listen_error = |cause| crate::Error::Listen { addr: bind, cause };
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(listen_error)?;
        let addr = listener.local_addr().map_err(listen_error)?;
        // A deliberate non-loopback bind serves other hosts' names too.
        if !addr.ip().to_canonical().is_loopback() {
            options.hosts = Hosts::Any;
        }
        let (app, endpoint) = self.http_router(options);
        let stop_accepting = Arc::new(Notify::new());
        let stop = stop_accepting.clone();
        let task = tokio::spawn(async move {
            // Made into a service once: a router served as it is is rebuilt for every
            // connection (axum's `with_state`), and rmcp's clients open one for every request.
            if let Err(error) = axum::serve(listener, app.into_make_service())
                .with_graceful_shutdown(async move { stop.notified().await })
                .await
            {
                tracing::error!("MCP over HTTP stopped: {error}");
            }
        });
        Ok(HttpServer {
            addr,
            stop_accepting,
            endpoint,
            task,
        })
    }

    /// The Streamable HTTP endpoint as a router serving `/mcp`, for mounting in an embedder's
    /// own axum stack (`Router::merge`), with the [`McpEndpoint`] that closes its sessions.
    /// Requests must be addressed to a loopback host name unless `options.hosts` says any.
    pub(crate) fn http_router(mut self, options: HttpOptions) -> (axum::Router, McpEndpoint) {
        // rmcp checks Origin (scheme, host, port per RFC 6454; no Origin passes) before any
        // session handling, and answers 403.
        let mut config = StreamableHttpServerConfig::default().with_allowed_origins(
            LOOPBACK_ORIGINS
                .iter()
                .map(|origin| origin.to_string())
                .chain(options.allowed_origins),
        );
        if options.hosts == Hosts::Any {
            config = config.disable_allowed_hosts();
        }
        let sessions = config.cancellation_token.clone();
        let mut manager = LocalSessionManager::default();
        if let Some(idle) = options.session_idle {
            manager.session_config.keep_alive = Some(idle);
        }
        let manager = Arc::new(manager);
        let settings = calls::Settings {
            hosts: options.hosts,
            max_body: config.max_request_body_bytes,
            sse_retry: manager.session_config.sse_retry,
            sse_keep_alive: config.sse_keep_alive,
        };
        let calls = Arc::new(calls::HttpCalls::new(manager.clone(), settings));
        self.http_calls = Some(Arc::downgrade(&calls));
        calls.serve_modern_agents_with(self.clone());
        let service = StreamableHttpService::new(move || Ok(self.clone()), manager, config);
        let answering = Arc::new(Answering::default());
        let shared = Shared {
            service: Arc::new(service),
            calls: calls.clone(),
        };
        let mut app = axum::Router::new()
            .nest_service("/mcp", shared)
            .layer(middleware::from_fn_with_state(
                answering.clone(),
                track_answers,
            ))
            .layer(middleware::from_fn(session_closed_is_ok));
        if let Some(token) = options.token {
            // Outermost: nothing reaches rmcp (or a session) without the token.
            app = app.layer(middleware::from_fn_with_state(
                Arc::new(token),
                require_token,
            ));
        }
        (
            app,
            McpEndpoint {
                sessions,
                answering,
                calls,
            },
        )
    }
}

/// rmcp's service behind an `Arc`. axum clones a route's service for every request (three times),
/// and rmcp's clones its whole configuration (the allowed hosts and origins, strings each):
/// ~39 k instructions a request, 7 % of forwarding a call over HTTP (docs/BENCHMARKS.md). Tool
/// calls it need not see are served beside it (`calls.rs`).
struct Shared<S> {
    service: Arc<S>,
    calls: Arc<calls::HttpCalls>,
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            calls: self.calls.clone(),
        }
    }
}

impl<H, M> tower_service::Service<Request> for Shared<StreamableHttpService<H, M>>
where
    H: rmcp::ServerHandler + Send + 'static,
    M: rmcp::transport::streamable_http_server::SessionManager,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let service = self.service.clone();
        let rmcp = move |mut request: Request| -> BoxFuture<'static, Response> {
            let watching = results::Posted::give(&mut request);
            Box::pin(async move {
                let response = service.handle(request).await.map(Body::new);
                match watching {
                    Some(watching) => watching.watch(response),
                    None => response,
                }
            })
        };
        let calls = self.calls.clone();
        let taken = calls.take(&request);
        Box::pin(async move { Ok(calls.serve(taken, request, rmcp).await) })
    }
}

/// The sessions of a Streamable HTTP endpoint, to end them at shutdown.
pub struct McpEndpoint {
    sessions: tokio_util::sync::CancellationToken,
    answering: Arc<Answering>,
    calls: Arc<calls::HttpCalls>,
}

impl McpEndpoint {
    /// Waits up to `grace` for answers still being written (POST responses not yet finished),
    /// then closes every session, ending their event streams.
    pub async fn close(&self, grace: Duration) {
        if !self.answering.wait_idle(grace).await {
            tracing::warn!(
                "{} MCP requests still unanswered after {grace:?}; closing them",
                self.answering.count.load(Ordering::SeqCst)
            );
        }
        self.calls.close();
        self.sessions.cancel();
    }
}

/// Origins of browser pages on this machine: always accepted. Requests without an `Origin` pass
/// too: browsers send one on every cross-origin request, so only non-browser clients omit it.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

/// How the Streamable HTTP endpoint is exposed beyond its defaults.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Browser origins accepted besides loopback ones, as [`parse_allowed_origin`] makes them.
    pub allowed_origins: Vec<String>,
    /// Which `Host` names requests may be addressed to. `serve_http` on an address beyond
    /// loopback accepts any.
    pub hosts: Hosts,
    /// The bearer token every request must carry, if any.
    pub token: Option<McpToken>,
    /// How long a session may go without a request before it ends (its client must then
    /// start a new one); `None`: 5 minutes.
    pub session_idle: Option<Duration>,
}

/// Which `Host` names the MCP endpoint answers (a guard against DNS rebinding: a page of another
/// site that resolves its name to 127.0.0.1 reaches a loopback listener with its own `Host`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Hosts {
    /// `localhost`, `127.0.0.1` and `[::1]` only: for a listener on loopback.
    #[default]
    Loopback,
    /// Any host name: for a listener reachable beyond loopback, under its own names.
    Any,
}

/// A bearer token for the MCP endpoint. Only its SHA-256 digest is kept, and compared in
/// constant time whatever the length of the guess.
#[derive(Clone)]
pub struct McpToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for McpToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpToken(<redacted>)")
    }
}

impl McpToken {
    /// A token must be sendable in a header: non-empty printable ASCII without spaces.
    pub fn new(token: &str) -> Result<Self, &'static str> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the MCP token must be non-empty printable ASCII without spaces");
        }
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    fn accepts(&self, given: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        digest.ct_eq(&self.digest).into()
    }
}

/// Parses an `--allow-origin` value into the form rmcp matches exactly: `scheme://host:port`,
/// `scheme://host:*` (any port) or `null`. Without a port, `http` and `https` mean their
/// default port (what a browser omits); other schemes (extensions, webviews) any port.
pub fn parse_allowed_origin(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Ok("null".into());
    }
    let wrong = |why: &str| {
        format!("{value:?} is not an origin like https://app.example.com[:PORT|:*] ({why})")
    };
    let (base, any_port) = match value.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (value, false),
    };
    let uri: http::Uri = base.parse().map_err(|_| wrong("cannot parse it"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(wrong("it needs a scheme and a host"));
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(wrong("an origin has no path or query"));
    }
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(wrong("an origin has a host and no user"));
    }
    let scheme = scheme.to_ascii_lowercase();
    let port = match (authority.port_u16(), any_port) {
        (Some(_), true) => return Err(wrong("a port and :*")),
        (Some(port), false) => port.to_string(),
        (None, true) => "*".into(),
        (None, false) => match scheme.as_str() {
            "http" => "80".into(),
            "https" => "443".into(),
            _ => "*".into(),
        },
    };
    Ok(format!(
        "{scheme}://{}:{port}",
        authority.host().to_ascii_lowercase()
    ))
}

/// The running Streamable HTTP endpoint.
pub struct HttpServer {
    /// The address it listens on.
    pub addr: SocketAddr,
    stop_accepting: Arc<Notify>,
    endpoint: McpEndpoint,
    task: JoinHandle<()>,
}

/// How long [`HttpServer::close`] waits for connections to end once the sessions are closed.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

impl HttpServer {
    /// Stops accepting connections. Open sessions go on, so calls in flight can be answered.
    pub fn stop_accepting(&self) {
        self.stop_accepting.notify_one();
    }

    /// Waits up to `grace` for answers still being written (POST responses not yet finished),
    /// then closes every session (ending their event streams) and stops.
    pub async fn close(self, grace: Duration) {
        self.stop_accepting();
        self.endpoint.close(grace).await;
        let mut task = self.task;
        if tokio::time::timeout(CLOSE_GRACE, &mut task).await.is_err() {
            tracing::debug!("MCP connections still open after {CLOSE_GRACE:?}; dropping them");
            task.abort();
        }
    }
}

/// POST requests whose responses are still being written: a call's answer travels in its
/// POST's response (an event stream that ends after the answer), so this reaching zero means
/// every answer went out.
#[derive(Default)]
struct Answering {
    count: AtomicUsize,
    idle: Notify,
}

struct Unanswered(Arc<Answering>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Answering {
    fn enter(self: &Arc<Self>) -> Unanswered {
        self.count.fetch_add(1, Ordering::SeqCst);
        Unanswered(self.clone())
    }

    /// True once nothing is being answered; false if `within` passes first.
    async fn wait_idle(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return false;
            }
        }
    }
}

/// Counts a POST as unanswered until its response body has been sent (or dropped).
async fn track_answers(
    State(answering): State<Arc<Answering>>,
    request: Request,
    next: Next,
) -> Response {
    // A `subscriptions/listen` stream lasts as long as the client wants: it is no answer to
    // wait for (closing the sessions ends it).
    let listen = request
        .headers()
        .get("mcp-method")
        .is_some_and(|method| method.as_bytes() == b"subscriptions/listen");
    if request.method() != Method::POST || listen {
        return next.run(request).await;
    }
    let unanswered = answering.enter();
    let (parts, body) = next.run(request).await.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &unanswered;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case), if any.
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// A session a client closes with DELETE is answered 200 (rmcp answers 202 Accepted, which the
/// official SDKs take as a failed termination: "Session termination failed: 202").
async fn session_closed_is_ok(request: Request, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// Refuses, with 401, every request without `Authorization: Bearer <the token>`.
async fn require_token(
    State(token): State<Arc<McpToken>>,
    request: Request,
    next: Next,
) -> Response {
    let refusal = match bearer_token(request.headers()) {
        Some(given) if token.accepts(given) => return next.run(request).await,
        Some(_) => "the MCP bearer token is wrong",
        None => "this MCP endpoint needs a bearer token: send `Authorization: Bearer <token>`",
    };
    tracing::debug!("refused an MCP request: {refusal}");
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"tether mcp\""),
        )],
        refusal,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_origins_are_made_exact() {
        let ok = |value: &str| parse_allowed_origin(value).unwrap();
        assert_eq!(ok("https://App.Example.com"), "https://app.example.com:443");
        assert_eq!(ok("http://example.com/"), "http://example.com:80");
        assert_eq!(ok("https://example.com:8443"), "https://example.com:8443");
        assert_eq!(ok("http://example.com:*"), "http://example.com:*");
        assert_eq!(ok("http://[::1]:3000"), "http://[::1]:3000");
        assert_eq!(
            ok("chrome-extension://abcdef"),
            "chrome-extension://abcdef:*"
        );
        assert_eq!(ok("null"), "null");
        for bad in [
            "example.com",
            "https://example.com/path",
            "https://example.com?q=1",
            "https://user@example.com",
            "https://example.com:1:*",
            "*",
            "",
        ] {
            assert!(parse_allowed_origin(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tokens_are_checked_by_digest_and_never_shown() {
        let token = McpToken::new("s3cret-token").unwrap();
        assert!(token.accepts("s3cret-token"));
        assert!(!token.accepts("s3cret-tokem"));
        assert!(!token.accepts(""));
        assert!(!format!("{token:?}").contains("s3cret"));
        assert!(McpToken::new("").is_err());
        assert!(McpToken::new("has space").is_err());
    }
}
