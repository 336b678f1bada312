//! The gateway: one MCP server (stdio or Streamable HTTP) whose tools are the live registry.
//! Every registry change is announced to every downstream session with
//! `notifications/tools/list_changed` (to 2026-07-28 clients on their `subscriptions/listen`
//! streams), so a connected agent sees tools go and come back without reconnecting. Calls go through the supervisor's call path (admission, one call, report).
//!
//! Over HTTP the endpoint protects itself: browsers' `Origin` must be a loopback origin or one
//! the operator allowed (DNS-rebinding protection, checked by rmcp before any session sees the
//! request), and an optional bearer token is required on every request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler, ServiceExt};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::calls::CallError;
use crate::registry::Route;
use crate::supervisor::Supervisor;

/// Downstream sessions to notify of tool list changes, by protocol generation: sessions of
/// 2025-11-25 and older (registered when initialized) get unscoped notifications; 2026-07-28
/// clients get them on the `subscriptions/listen` streams they opened.
#[derive(Clone, Default)]
struct Downstream {
    peers: Arc<Mutex<Vec<Peer<RoleServer>>>>,
    listeners: Arc<Mutex<Vec<(u64, SubscriptionSink)>>>,
    next_listener: Arc<std::sync::atomic::AtomicU64>,
}

impl Downstream {
    fn register(&self, peer: Peer<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|p| !p.is_transport_closed());
        peers.push(peer);
    }

    fn add_listener(&self, sink: SubscriptionSink) -> u64 {
        let id = self.next_listener.fetch_add(1, Ordering::Relaxed);
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, sink));
        id
    }

    fn remove_listener(&self, id: u64) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(listener, _)| *listener != id);
    }

    fn notify_tools_changed(&self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|p| !p.is_transport_closed());
        for peer in peers.clone() {
            // One task per session: a stalled client must not delay the others.
            tokio::spawn(async move {
                if let Err(error) = peer.notify_tool_list_changed().await {
                    tracing::debug!("could not notify a downstream session: {error}");
                }
            });
        }
        drop(peers);
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (_, sink) in listeners {
            tokio::spawn(async move {
                if let Err(error) = sink.notify_tool_list_changed().await {
                    tracing::debug!("could not notify a downstream subscription: {error}");
                }
            });
        }
    }
}

/// The MCP server agents talk to.
#[derive(Clone)]
pub struct Gateway {
    supervisor: Supervisor,
    downstream: Downstream,
}

impl Gateway {
    /// Builds the gateway and starts announcing registry changes downstream.
    pub fn new(supervisor: Supervisor) -> (Self, JoinHandle<()>) {
        let downstream = Downstream::default();
        let mut changes = supervisor.registry().subscribe();
        let announcer = downstream.clone();
        let task = tokio::spawn(async move {
            loop {
                match changes.recv().await {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        announcer.notify_tools_changed();
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        (
            Self {
                supervisor,
                downstream,
            },
            task,
        )
    }

    /// Serves one session over this process's stdin/stdout until the client leaves.
    pub async fn serve_stdio(self) -> Result<(), String> {
        let service = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| format!("MCP over stdio: {e}"))?;
        service
            .waiting()
            .await
            .map(drop)
            .map_err(|e| format!("MCP over stdio: {e}"))
    }

    /// Serves Streamable HTTP at `http://ADDR/mcp` until [`HttpServer::close`].
    pub async fn serve_http(
        self,
        bind: SocketAddr,
        options: HttpOptions,
    ) -> Result<HttpServer, String> {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        // rmcp checks Origin (scheme, host, port per RFC 6454; no Origin passes) before any
        // session handling, and answers 403.
        let mut config = StreamableHttpServerConfig::default().with_allowed_origins(
            LOOPBACK_ORIGINS
                .iter()
                .map(|origin| origin.to_string())
                .chain(options.allowed_origins),
        );
        if !addr.ip().to_canonical().is_loopback() {
            // A deliberate non-loopback bind serves other hosts' names too.
            config = config.disable_allowed_hosts();
        }
        let sessions = config.cancellation_token.clone();
        let service = StreamableHttpService::new(
            move || Ok(self.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let answering = Arc::new(Answering::default());
        let mut app = axum::Router::new().nest_service("/mcp", service).layer(
            middleware::from_fn_with_state(answering.clone(), track_answers),
        );
        if let Some(token) = options.token {
            // Outermost: nothing reaches rmcp (or a session) without the token.
            app = app.layer(middleware::from_fn_with_state(
                Arc::new(token),
                require_token,
            ));
        }
        let stop_accepting = Arc::new(Notify::new());
        let stop = stop_accepting.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.notified().await })
                .await
            {
                tracing::error!("MCP over HTTP stopped: {error}");
            }
        });
        Ok(HttpServer {
            addr,
            stop_accepting,
            close_sessions: Box::new(move || sessions.cancel()),
            answering,
            task,
        })
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
    /// The bearer token every request must carry, if any.
    pub token: Option<McpToken>,
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
    close_sessions: Box<dyn FnOnce() + Send>,
    answering: Arc<Answering>,
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
        if !self.answering.wait_idle(grace).await {
            tracing::warn!(
                "{} MCP requests still unanswered after {grace:?}; closing them",
                self.answering.count.load(Ordering::SeqCst)
            );
        }
        (self.close_sessions)();
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

/// The MCP view of a routed tool.
fn tool_for_agents(route: &Route) -> Tool {
    let schema: JsonObject = serde_json::from_str(&route.tool.input_schema).unwrap_or_default();
    let mut tool = Tool::new_with_raw(
        route.tool.advertised.clone(),
        route.tool.description.clone().map(Into::into),
        schema,
    );
    if route.tool.read_only {
        tool.annotations = Some(ToolAnnotations::new().read_only(true));
    }
    tool
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("tether", env!("CARGO_PKG_VERSION")))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.downstream.register(context.peer);
    }

    /// 2026-07-28 clients hear of tool list changes on `subscriptions/listen`.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let id = self.downstream.add_listener(context.sink().clone());
        context.cancelled().await;
        self.downstream.remove_listener(id);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let (_, routes) = self.supervisor.registry().snapshot();
        Ok(ListToolsResult::with_all_items(
            routes.iter().map(tool_for_agents).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        match self
            .supervisor
            .call_tool(&request.name, request.arguments)
            .await
        {
            Ok(mut result) => {
                // Upstreams of the older generation send no `resultType`; 2026-07-28 clients
                // require it. rmcp strips "complete" again for older clients.
                result
                    .result_type
                    .get_or_insert(rmcp::model::ResultType::COMPLETE);
                Ok(result.into())
            }
            Err(CallError::UnknownTool(name)) => Err(McpError::invalid_params(
                format!("unknown tool {name:?}: it is not in tools/list"),
                None,
            )),
        }
    }
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
