//! A live MCP session with one upstream server, whatever its transport: opening it, reading its
//! tools, prompts and resources, keepalives, requests with deadlines (tool calls and what the
//! gateway forwards), progress and cancellation, noticing its end and closing it.

mod listen;
pub mod route;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

#[allow(deprecated)] // sampling and logging types: see the handler
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ClientResult, CreateMessageRequest, CreateMessageRequestParams,
    CreateMessageResult, CustomRequest, ElicitRequest, ElicitRequestParams, ElicitResult,
    ErrorCode, ErrorData, GetExtensions, Implementation, InputRequiredResult, InputResponses,
    JsonObject, JsonRpcMessage, ListPromptsRequest, ListResourceTemplatesRequest, ListResourcesRequest,
    ListRootsRequest, ListRootsResult, ListToolsRequest, LoggingMessageNotificationParam,
    PaginatedRequestParams, PingRequest, ProtocolVersion, ResourceUpdatedNotificationParam,
    ProgressToken, RequestId, RequestMetaObject, ServerCapabilities, ServerRequest, ServerResult,
    SetLevelRequest, SetLevelRequestParams, SubscribeRequest, SubscribeRequestParams,
    UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, RequestContext, RequestHandle, RunningService,
    ServiceError,
};
use rmcp::transport::DynamicTransportError;
use rmcp::{ClientHandler, Peer, RoleClient};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::catalog::ServerCatalog;
use crate::config::{ServerSpec, Timeouts, TransportSpec};
use crate::policy::{Fault, Tool, TransportKind};
use crate::transport::{SessionEnd, session_closed};
use crate::transport::generation::{self, Generation};
use crate::transport::http::{
    self, HttpFlavor, HttpOptions, NotAnswered, PendingPost, PostedCalls, RequestFailure,
};
use crate::transport::limit;
use crate::transport::lines::{CallSender, NoAnswer, PendingCall};
use crate::transport::stdio::{self, ChildProcess};
use route::{Belongs, Deadlines, RouteTag, Routes};
pub use route::{CallArguments, CallRoute, ClientAsk, ProgressForward};

/// Which of a server's lists it said changed, coalesced: however many notices arrive while a
/// refresh runs, one more refresh of each list follows.
#[derive(Default)]
pub struct ListChanges {
    pending: AtomicU8,
    wake: Notify,
}

/// The lists [`ListChanges::next`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changed {
    pub tools: bool,
    /// Prompts, resources or resource templates.
    pub catalog: bool,
}

pub(crate) const TOOLS_CHANGED: u8 = 1;
pub(crate) const CATALOG_CHANGED: u8 = 2;

impl ListChanges {
    pub(crate) fn raise(&self, bits: u8) {
        self.pending.fetch_or(bits, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Waits for changes not yet reported, and takes them.
    pub async fn next(&self) -> Changed {
        loop {
            let bits = self.pending.swap(0, Ordering::SeqCst);
            if bits != 0 {
                return Changed {
                    tools: bits & TOOLS_CHANGED != 0,
                    catalog: bits & CATALOG_CHANGED != 0,
                };
            }
            self.wake.notified().await;
        }
    }
}

/// What an upstream said outside any request that clients may want: resource updates and log
/// messages, tagged with the server they came from.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    ResourceUpdated {
        server: String,
        uri: String,
    },
    #[allow(deprecated)] // logging is deprecated in 2026-07-28 but servers still log
    Log {
        server: String,
        message: LoggingMessageNotificationParam,
    },
}

/// Receives the log messages that belong to an upstream call (see [`CallContext::log`]).
#[allow(deprecated)] // logging is deprecated in 2026-07-28 but clients still opt in
pub type LogSink = Arc<dyn Fn(LoggingMessageNotificationParam) + Send + Sync>;

/// What a caller gives a request besides its parameters: a way to cancel it, where its
/// progress goes if it asked, the client the server may ask for input during it, and for a
/// retry after a server's request for input, the answers and the server's request state.
#[derive(Clone, Default)]
pub struct CallContext {
    /// Cancelled when the caller gives up (`notifications/cancelled`, a closed stream).
    pub cancel: CancellationToken,
    pub progress: Option<Arc<dyn ProgressForward>>,
    pub input_responses: Option<InputResponses>,
    pub request_state: Option<String>,
    /// The level of log messages the caller wants (a 2026-07-28 caller's `_meta` `logLevel`,
    /// or an older client's `logging/setLevel`): passed on to a 2026-07-28 server, which logs
    /// only when asked.
    #[allow(deprecated)]
    pub log_level: Option<rmcp::model::LoggingLevel>,
    /// A 2026-07-28 caller's own stream for the server's log messages during the call.
    pub log: Option<LogSink>,
    /// The client, for what the server asks of it during the call (sampling, elicitation,
    /// roots); its capabilities go to a 2026-07-28 server with the request.
    pub client: Option<Arc<dyn ClientAsk>>,
    /// The request's trace: what it records, and the trace context sent upstream with it.
    pub(crate) trace: Option<Arc<crate::telemetry::RequestTrace>>,
    /// Where a tool call's result may go as the server's bytes (see [`CallRoute::raw`]).
    pub(crate) raw: Option<Arc<crate::transport::lines::raw::RawResult>>,
}

/// The client side of a session: tells the supervisor of list changes, the gateway of events,
/// and passes what the server asks of a client to the client whose request it belongs to.
#[derive(Clone)]
pub struct UpstreamHandler {
    server: Arc<str>,
    changes: Arc<ListChanges>,
    events: broadcast::Sender<ServerEvent>,
    routes: Arc<Routes>,
}

impl UpstreamHandler {
    /// The client a server-to-client request is for, if it can be asked for `what`.
    fn client_for(
        &self,
        context: &RequestContext<RoleClient>,
        what: &str,
        declared: impl Fn(&rmcp::model::ClientCapabilities) -> bool,
    ) -> Result<Arc<dyn ClientAsk>, ErrorData> {
        let refuse = |why: String| {
            tracing::debug!(server = %self.server, "refusing the server's {what} request: {why}");
            Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("{what} through Tether is refused: {why}"),
                None,
            ))
        };
        let client = match context.extensions.get::<Belongs>() {
            Some(Belongs::To(route)) => route.client.clone(),
            Some(Belongs::Nowhere(why)) => {
                return refuse(format!("{why}, so no client can answer it"));
            }
            None => None,
        };
        let Some(client) = client else {
            return refuse("no client's request is waiting for it".into());
        };
        if !declared(&client.capabilities()) {
            return refuse(format!("the client did not declare the {what} capability"));
        }
        Ok(client)
    }

    /// Asks the client `request` on the server's behalf.
    async fn ask_client(
        &self,
        context: &RequestContext<RoleClient>,
        what: &str,
        declared: impl Fn(&rmcp::model::ClientCapabilities) -> bool,
        request: ServerRequest,
    ) -> Result<ClientResult, ErrorData> {
        let client = self.client_for(context, what, declared)?;
        tokio::select! {
            answer = client.ask(request) => answer,
            // The server gave up (it sent notifications/cancelled for its request).
            () = context.ct.cancelled() => Err(ErrorData::internal_error(
                format!("the server cancelled its {what} request"),
                None,
            )),
        }
    }
}

impl ClientHandler for UpstreamHandler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.raise(TOOLS_CHANGED);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.raise(CATALOG_CHANGED);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.raise(CATALOG_CHANGED);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.events.send(ServerEvent::ResourceUpdated {
            server: self.server.to_string(),
            uri: params.uri,
        });
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        message: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Only when the transport did not take it first (see `transport::gate`). A 2026-07-28
        // client asked for the log messages of its call; older clients get the server's
        // messages by their session's level.
        self.routes.log(message);
    }

    // Progress is handed to its client by the transport (`transport::gate`), in order.

    /// Passed on to the client whose request it came with (see [`route`]).
    #[allow(deprecated)] // sampling is deprecated (SEP-2577), but servers still ask for it
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self
            .ask_client(&context, "sampling", |c| c.sampling.is_some(), request)
            .await?
        {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            _ => Err(wrong_answer("sampling/createMessage")),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self
            .ask_client(
                &context,
                "elicitation",
                |c| c.elicitation.is_some(),
                request,
            )
            .await?
        {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(wrong_answer("elicitation/create")),
        }
    }

    #[allow(deprecated)] // roots: deprecated by SEP-2577, still asked for
    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        match self
            .ask_client(&context, "roots", |c| c.roots.is_some(), request)
            .await?
        {
            ClientResult::ListRootsResult(result) => Ok(result),
            _ => Err(wrong_answer("roots/list")),
        }
    }

    /// A request of the server's that was over `max_message` arrives as the small stand-in the
    /// size filter put in its place (`transport/limit.rs`): the server is told why it gets no
    /// answer. Other methods are unknown to Tether's clients, as rmcp's handler says.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        if request.method != crate::transport::limit::TOO_LARGE_REQUEST {
            return Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, request.method, None));
        }
        let params = request.params.unwrap_or_default();
        let size = |key: &str| params.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let (size, limit) = (size("size"), size("limit"));
        let message = format!(
            "Tether dropped this request unread: it ({}) is larger than Tether's limit of {} for \
             this server (max_message)",
            crate::transport::limit::describe_size(size),
            crate::transport::limit::describe_size(limit),
        );
        let data = crate::transport::limit::too_large_data(size, limit);
        Err(ErrorData::new(
            ErrorCode(crate::transport::limit::TOO_LARGE),
            message,
            Some(data),
        ))
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        info.client_info = Implementation::new("tether", env!("CARGO_PKG_VERSION"));
        // What `initialize` offers; 2026-07-28 is negotiated by `server/discover`.
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        // What Tether passes on to its clients; each request is checked against what its own
        // client declared (and a 2026-07-28 server is told that client's capabilities).
        info.capabilities = passed_on_capabilities();
        info
    }
}

/// What Tether can pass on to a client, as it declares it upstream: sampling (with tools),
/// elicitation (form and URL) and roots.
#[allow(deprecated)] // sampling and roots: deprecated by SEP-2577, still asked for
pub(crate) fn passed_on_capabilities() -> rmcp::model::ClientCapabilities {
    let mut capabilities = rmcp::model::ClientCapabilities::default();
    let mut sampling = rmcp::model::SamplingCapability::default();
    sampling.tools = Some(JsonObject::new());
    capabilities.sampling = Some(sampling);
    let mut elicitation = rmcp::model::ElicitationCapability::default();
    elicitation.form = Some(Default::default());
    elicitation.url = Some(Default::default());
    capabilities.elicitation = Some(elicitation);
    capabilities.roots = Some(rmcp::model::RootsCapabilities::default());
    capabilities
}

fn wrong_answer(method: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("the client gave an answer of the wrong kind to {method}"),
        None,
    )
}

/// Forgets a request's route when its exchange ends, however it ends (the transport also does
/// when the answer arrives).
struct Unroute<'a> {
    routes: &'a Routes,
    id: rmcp::model::RequestId,
}

impl Drop for Unroute<'_> {
    fn drop(&mut self) {
        self.routes.unregister(&self.id);
    }
}

/// Why a request in flight stopped waiting for its answer.
enum GaveUp {
    Cancelled,
    /// The timeout that ran out, and the reason the server is given (rmcp's words).
    OutOfTime(Duration, &'static str),
}

/// A request on its way: through rmcp, or a tool call its caller wrote ([`CallSender`]) or
/// POSTed ([`PostedCalls`]).
enum Sent {
    Rmcp(RequestHandle<RoleClient>),
    Straight(PendingCall),
    Posted(PendingPost),
}

impl Sent {
    fn id(&self) -> &RequestId {
        match self {
            Sent::Rmcp(handle) => &handle.id,
            Sent::Straight(pending) => pending.id(),
            Sent::Posted(pending) => pending.id(),
        }
    }

    async fn answer(self) -> Result<ServerResult, ServiceError> {
        match self {
            Sent::Rmcp(handle) => handle.await_response().await,
            Sent::Straight(pending) => match pending.answer().await {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(error)) => Err(ServiceError::McpError(error)),
                // As rmcp words a write that failed: the call did not leave.
                Err(NoAnswer::Unwritten(error)) => Err(send_failed::<CallSender>("stdio", error)),
                Err(NoAnswer::Ended) => Err(ServiceError::TransportClosed),
            },
            // As rmcp's worker and service loop hand the answer or the failure on.
            Sent::Posted(pending) => match pending.answer().await {
                Ok(JsonRpcMessage::Response(response)) => Ok(response.result),
                Ok(JsonRpcMessage::Error(error)) => Err(ServiceError::McpError(error.error)),
                Ok(_) => Err(ServiceError::UnexpectedResponse),
                Err(NotAnswered::Failed(error)) => {
                    Err(send_failed::<PostedCalls>("streamable-http", error))
                }
                Err(NotAnswered::Closed) => Err(ServiceError::TransportClosed),
            },
        }
    }
}

/// A request that failed on `transport` (sent by `T`), worded as rmcp words a transport's
/// failure to send, so it is classified the same way.
fn send_failed<T: 'static>(
    transport: &'static str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> ServiceError {
    ServiceError::TransportSend(DynamicTransportError::from_parts(
        transport,
        std::any::TypeId::of::<T>(),
        Box::new(error),
    ))
}

/// Where a session's tool calls go past rmcp's loop.
enum StraightCalls {
    /// Written on a stdio server's stdin.
    Lines(CallSender),
    /// POSTed to a Streamable HTTP server.
    Posts(PostedCalls),
}

impl StraightCalls {
    /// Whether a call can go this way now (an HTTP session's headers are known once its
    /// handshake is done).
    fn ready(&self) -> bool {
        match self {
            StraightCalls::Lines(_) => true,
            StraightCalls::Posts(posts) => posts.ready(),
        }
    }

    fn next_id(&self) -> RequestId {
        match self {
            StraightCalls::Lines(lines) => lines.next_id(),
            StraightCalls::Posts(posts) => posts.next_id(),
        }
    }

    /// Sends call `id`; `None` if it could not leave (the session's transport is closed).
    fn send(&self, id: RequestId, call: CallToolRequest) -> Option<Sent> {
        match self {
            StraightCalls::Lines(lines) => match lines.send(id, call) {
                Ok(pending) => Some(Sent::Straight(pending)),
                Err(error) => {
                    tracing::debug!("a tool call could not be written: {error}");
                    None
                }
            },
            StraightCalls::Posts(posts) => posts.send(id, call).map(Sent::Posted),
        }
    }
}

/// How a call failed when it did not produce a result.
#[derive(Debug, Clone)]
pub enum CallFailure {
    /// No answer within the deadline; the server may still be working on it.
    TimedOut(Duration),
    /// The session ended while the call was in flight: it may or may not have run.
    Lost(Fault),
    /// The request never left (no live session): it certainly did not run.
    NotSent(Fault),
    /// The server, or a proxy in front of it, answered this one request with an HTTP error
    /// status (5xx, 408, 425, 429): the call may or may not have run, and the session lives on.
    HttpStatus(u16),
    /// The server answered with a JSON-RPC error (e.g. unknown tool, invalid params).
    Protocol(ErrorData),
    /// The server answered, but the answer was larger than `max_message` (its size in bytes
    /// when known, and the limit): it was dropped unread. The call did run.
    TooLarge { size: u64, limit: u64 },
    /// The caller cancelled it; the server was told (`notifications/cancelled`).
    Cancelled,
    /// Not a failure: the server (2026-07-28) needs input from the client first, then a retry
    /// with the answers and its request state.
    InputRequired(Box<InputRequiredResult>),
}

/// Why a keepalive did not prove its session.
#[derive(Debug, Clone, PartialEq)]
pub enum KeepaliveFailure {
    /// No valid answer (the session closed, the deadline passed, the answer made no sense):
    /// the session is given up.
    Unanswered(Fault),
    /// The server, or a proxy in front of it, answered this one request with an HTTP error
    /// status (5xx, 408, 425, 429), as it may answer a tool call: the request failed, the
    /// session may still work.
    HttpStatus(Fault),
    /// The server refused it with HTTP 400 or a JSON-RPC error naming no request: a session it
    /// forgot (some SDKs answer so), or a failure (a widely used SDK's catch-all answer to a
    /// 5xx, whose status rmcp's client drops). Answered, but no proof of a live session.
    Refused(Fault),
}

impl KeepaliveFailure {
    /// What the policy and the operator are told.
    pub fn fault(&self) -> &Fault {
        match self {
            KeepaliveFailure::Unanswered(fault)
            | KeepaliveFailure::HttpStatus(fault)
            | KeepaliveFailure::Refused(fault) => fault,
        }
    }
}

/// An initialized session.
pub struct Session {
    server: String,
    peer: Peer<RoleClient>,
    cancel: std::sync::Mutex<Option<rmcp::service::RunningServiceCancellationToken>>,
    process: Option<ChildProcess>,
    transport: TransportKind,
    server_info: String,
    ping_unsupported: AtomicBool,
    /// Requests refused in a row although the session answered its keepalive after each
    /// ([`Session::ask_after_refusal`]).
    refusals: AtomicU32,
    /// The session's end with its cause, set by the transport the moment it knows (the child's
    /// exit, HTTP 404: the server forgot the session, 401/403: credentials revoked).
    end: SessionEnd,
    max_message: usize,
    routes: Arc<Routes>,
    generation: Generation,
    /// Where tool calls go rather than through rmcp's loop (stdio, Streamable HTTP).
    calls: Option<StraightCalls>,
    /// Resource URIs clients want updates of; a 2026-07-28 session listens for them.
    resource_uris: watch::Sender<BTreeSet<String>>,
}

/// What a server showed on earlier connects, for the next one: its HTTP flavor and protocol
/// generation. Forgotten when a connect fails (the server may have been replaced).
#[derive(Debug, Clone, Copy, Default)]
pub struct Remembered {
    pub flavor: Option<HttpFlavor>,
    pub generation: Option<Generation>,
}

impl Session {
    /// Connects to `spec` and completes the MCP handshake within the connect timeout.
    /// `flavor` remembers, across reconnects, which HTTP flavor the server speaks.
    /// List changes go to `changes`, resource updates and log messages to `events`.
    pub async fn open(
        spec: &ServerSpec,
        remembered: &mut Remembered,
        changes: Arc<ListChanges>,
        events: broadcast::Sender<ServerEvent>,
        log_dir: &Path,
        auth: Option<Arc<crate::auth::Authorizer>>,
    ) -> Result<Session, Fault> {
        let routes = Arc::new(Routes::default());
        let handler = UpstreamHandler {
            server: spec.name.as_str().into(),
            changes: changes.clone(),
            events: events.clone(),
            routes: routes.clone(),
        };
        let (server, log_events) = (handler.server.clone(), events.clone());
        routes.tap_logs(Box::new(move |message| {
            let server = server.to_string();
            let _ = log_events.send(ServerEvent::Log { server, message });
        }));
        let lifecycle = generation::lifecycle(spec.protocol, remembered.generation);
        let mut calls = None;
        let (service, process, transport, end) = match &spec.transport {
            TransportSpec::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let child = stdio::Spawn {
                    server: &spec.name,
                    command,
                    args,
                    env,
                    cwd: cwd.as_deref(),
                    log_dir,
                };
                let session = stdio::connect_session(
                    &child,
                    spec,
                    lifecycle,
                    routes.clone(),
                    handler.clone(),
                )
                .await?;
                calls = Some(StraightCalls::Lines(session.calls));
                (
                    session.service,
                    Some(session.process),
                    TransportKind::Stdio,
                    session.end,
                )
            }
            TransportSpec::Http {
                url,
                headers,
                sse_fallback,
            } => {
                // Once a flavor worked it is remembered; without fallback it is always Streamable.
                let wanted = match (remembered.flavor, sse_fallback) {
                    (Some(known), _) => Some(known),
                    (None, false) => Some(HttpFlavor::Streamable),
                    (None, true) => None,
                };
                let options = http_options(headers, spec, lifecycle, &routes, auth.clone());
                let session =
                    http::connect_session(url, wanted, &options, || handler.clone()).await?;
                calls = session.calls.map(StraightCalls::Posts);
                remembered.flavor = Some(session.flavor);
                let kind = match session.flavor {
                    HttpFlavor::Streamable => TransportKind::StreamableHttp,
                    HttpFlavor::Sse => TransportKind::Sse,
                };
                (session.service, None, kind, session.end)
            }
            TransportSpec::Sse { url, headers } => {
                let options = http_options(
                    headers,
                    spec,
                    rmcp::ClientLifecycleMode::Initialize,
                    &routes,
                    auth.clone(),
                );
                let session =
                    http::connect_session(url, Some(HttpFlavor::Sse), &options, || handler.clone())
                        .await?;
                (session.service, None, TransportKind::Sse, session.end)
            }
        };
        let mut session = Self::from_service(&spec.name, service, process, transport, end);
        session.max_message = spec.max_message;
        session.routes = routes;
        // Not for a 2026-07-28 server: rmcp lets such a server ask the client something (roots,
        // sampling, elicitation) only while a request rmcp itself sent is in flight, and refuses
        // the question otherwise.
        session.calls = calls.filter(|_| session.generation == Generation::Legacy);
        remembered.generation = Some(session.generation);
        if session.generation == Generation::Modern {
            listen::spawn(listen::Listener {
                server: spec.name.clone(),
                peer: session.peer.clone(),
                capabilities: session.capabilities(),
                changes,
                events,
                uris: session.resource_uris.subscribe(),
                ended: session.end.clone(),
            });
        }
        Ok(session)
    }

    fn from_service(
        server: &str,
        service: RunningService<RoleClient, UpstreamHandler>,
        process: Option<ChildProcess>,
        transport: TransportKind,
        end: SessionEnd,
    ) -> Session {
        let peer = service.peer().clone();
        let generation = peer.peer_info().map_or(Generation::Legacy, |info| {
            Generation::of(&info.protocol_version)
        });
        let server_info = peer
            .peer_info()
            .and_then(|info| {
                info.server_info
                    .as_ref()
                    .map(|i| format!("{} {}", i.name, i.version))
            })
            .unwrap_or_default();
        let cancel = std::sync::Mutex::new(Some(service.cancellation_token()));
        let exit = process.as_ref().map(ChildProcess::exit_watch);
        crate::transport::watch_service(service, exit, transport, end.clone());
        Session {
            server: server.to_string(),
            peer,
            cancel,
            process,
            transport,
            server_info,
            ping_unsupported: AtomicBool::new(false),
            refusals: AtomicU32::new(0),
            end,
            max_message: ServerSpec::DEFAULT_MAX_MESSAGE,
            routes: Arc::default(),
            generation,
            calls: None,
            resource_uris: watch::channel(BTreeSet::new()).0,
        }
    }

    pub fn transport(&self) -> TransportKind {
        self.transport
    }

    pub fn server_info(&self) -> &str {
        &self.server_info
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildProcess::pid)
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The protocol generation this session speaks.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    fn capabilities(&self) -> ServerCapabilities {
        self.peer
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default()
    }

    /// Whether the server offers resource subscriptions: `resources.subscribe` (2025-11-25 and
    /// older); on 2026-07-28 any server with resources takes them on its `subscriptions/listen`
    /// stream, where one it does not honour is simply never updated.
    pub fn offers_resource_subscriptions(&self) -> bool {
        self.capabilities()
            .resources
            .is_some_and(|r| r.subscribe == Some(true) || self.generation == Generation::Modern)
    }

    /// Asks the server for updates of `uri` (`wanted`), or to stop them: `resources/subscribe`
    /// and `unsubscribe` on 2025-11-25 and older, the URIs of the session's
    /// `subscriptions/listen` stream on 2026-07-28.
    #[allow(deprecated)] // resources/subscribe is legacy-only, and legacy servers need it
    pub async fn subscribe_resource(
        &self,
        uri: &str,
        wanted: bool,
        timeouts: &Timeouts,
    ) -> Result<(), CallFailure> {
        if self.generation == Generation::Modern {
            self.resource_uris.send_if_modified(|uris| match wanted {
                true => uris.insert(uri.to_string()),
                false => uris.remove(uri),
            });
            return Ok(());
        }
        let (method, request) = match wanted {
            true => (
                "resources/subscribe",
                ClientRequest::SubscribeRequest(SubscribeRequest::new(
                    SubscribeRequestParams::new(uri),
                )),
            ),
            false => (
                "resources/unsubscribe",
                ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                    UnsubscribeRequestParams::new(uri),
                )),
            ),
        };
        self.exchange(method, request, timeouts, &CallContext::default())
            .await
            .map(drop)
    }

    /// Asks a server of 2025-11-25 or older that offers logging to send its log messages at
    /// `level` and above (`logging/setLevel`). A 2026-07-28 server takes a level with each
    /// request, and one without logging has no level to set: both are left alone (`false`).
    #[allow(deprecated)] // logging/setLevel is legacy-only, and legacy servers need it
    pub async fn set_log_level(
        &self,
        level: rmcp::model::LoggingLevel,
        timeouts: &Timeouts,
    ) -> Result<bool, CallFailure> {
        if self.generation == Generation::Modern || self.capabilities().logging.is_none() {
            return Ok(false);
        }
        let request =
            ClientRequest::SetLevelRequest(SetLevelRequest::new(SetLevelRequestParams::new(level)));
        self.exchange("logging/setLevel", request, timeouts, &CallContext::default())
            .await
            .map(|_| true)
    }

    /// Whether requests can still go out: the session has not ended and its process lives.
    /// Once false, the session's end follows promptly (see [`SessionEnd`]).
    pub fn is_alive(&self) -> bool {
        !self.end.has_ended()
            && !self.peer.is_transport_closed()
            && self.process.as_ref().is_none_or(ChildProcess::is_alive)
    }

    /// Resolves when the session has ended, with why: the child's exit, what the transport
    /// recorded (HTTP 404, 401/403, a broken stream), else "the session ended".
    pub async fn ended(&self) -> Fault {
        self.end.ended().await;
        self.recorded_end()
            .unwrap_or_else(|| session_closed(self.transport))
    }

    /// Why the session ends, once the transport knows (it may not have ended yet).
    pub fn recorded_end(&self) -> Option<Fault> {
        self.end.fault()
    }

    /// Why a request found the session closed: its end, which follows a closed transport
    /// within the stop grace; the bound only guards against a transport that never closes.
    pub async fn end_fault(&self) -> Fault {
        if let Some(fault) = self.end.fault() {
            return fault;
        }
        match tokio::time::timeout(END_SETTLES_WITHIN, self.ended()).await {
            Ok(fault) => fault,
            Err(_) => session_closed(self.transport),
        }
    }

    /// The full tool list, following pagination up to `max_tool_pages`, in at most
    /// `max_message` bytes in all. Invalid tools (no name, an empty name) are skipped with a
    /// warning; the others are kept.
    pub async fn list_tools(&self, timeouts: &Timeouts) -> Result<Vec<Tool>, Fault> {
        let mut tools = Vec::new();
        let mut total = 0usize;
        let mut cursor = None;
        for _ in 0..timeouts.max_tool_pages.max(1) {
            let mut params = PaginatedRequestParams::default();
            params.cursor = cursor;
            let request = ClientRequest::ListToolsRequest(ListToolsRequest::with_param(params));
            let page = match self.request(request, timeouts.keepalive_deadline).await {
                Ok(ServerResult::ListToolsResult(page)) => ToolPage {
                    tools: page.tools.into_iter().map(Ok).collect(),
                    next_cursor: page.next_cursor,
                },
                // One bad tool makes rmcp read the page as an untyped result: read it per tool.
                Ok(ServerResult::CustomResult(raw)) => {
                    ToolPage::lenient(raw.0).ok_or_else(|| {
                        Fault::HandshakeFailed(
                            "the answer to tools/list has no `tools` list".into(),
                        )
                    })?
                }
                Ok(_) => {
                    return Err(Fault::HandshakeFailed(
                        "unexpected answer to tools/list".into(),
                    ));
                }
                Err(ServiceError::McpError(error))
                    if limit::too_large(error.code.0, error.data.as_ref()).is_some() =>
                {
                    return Err(Fault::HandshakeFailed(format!(
                        "its tools/list answer is larger than max_message ({})",
                        limit::describe_size(self.max_message as u64)
                    )));
                }
                Err(error) => return Err(self.request_fault("tools/list", error).await),
            };
            for tool in page.tools {
                match tool {
                    Ok(tool) if tool.name.trim().is_empty() => {
                        self.skip_tool("it has an empty name")
                    }
                    Ok(tool) => {
                        let tool = tool_from_rmcp(tool);
                        total += tool.name.len()
                            + tool.description.as_ref().map_or(0, String::len)
                            + tool.input_schema.len();
                        if total > self.max_message {
                            return Err(Fault::HandshakeFailed(format!(
                                "its tool list is larger than max_message ({}) in all",
                                limit::describe_size(self.max_message as u64)
                            )));
                        }
                        tools.push(tool);
                    }
                    Err(reason) => self.skip_tool(&reason),
                }
            }
            match page.next_cursor {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        tracing::warn!(server = %self.server, pages = timeouts.max_tool_pages, "tools/list has more pages than the cap; using the first ones");
        Ok(tools)
    }

    fn skip_tool(&self, reason: &str) {
        INVALID_TOOLS.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(server = %self.server, "skipping an invalid tool in tools/list: {reason}");
    }

    /// Proves the session: `ping`, or `tools/list` for servers that do not implement ping; on
    /// 2026-07-28, which has no ping, `server/discover` (sent as is, never from a cache).
    pub async fn keepalive(&self, timeouts: &Timeouts) -> Result<(), KeepaliveFailure> {
        let failed = |error: &ServiceError| {
            let fault = Fault::KeepaliveFailed(describe_service_error(error));
            match http::request_failure(error) {
                Some(RequestFailure::Status(_)) => KeepaliveFailure::HttpStatus(fault),
                Some(RequestFailure::Refused(_)) => KeepaliveFailure::Refused(fault),
                _ => KeepaliveFailure::Unanswered(fault),
            }
        };
        if self.generation == Generation::Modern {
            // As a plain request: rmcp's Streamable HTTP client makes a typed `server/discover`
            // wait for every request in flight (it may change the protocol version), so one
            // long request — a `subscriptions/listen` stream answered as JSON — would stall
            // the keepalive and every request after it.
            let discover = ClientRequest::CustomRequest(CustomRequest::new(
                "server/discover",
                Some(serde_json::json!({})),
            ));
            return match self.request(discover, timeouts.keepalive_deadline).await {
                Ok(_) => Ok(()),
                Err(error) => Err(failed(&error)),
            };
        }
        if !self.ping_unsupported.load(Ordering::Relaxed) {
            let ping = ClientRequest::PingRequest(PingRequest::default());
            match self.request(ping, timeouts.keepalive_deadline).await {
                Ok(_) => return Ok(()),
                Err(ServiceError::McpError(error)) if error.code == ErrorCode::METHOD_NOT_FOUND => {
                    self.ping_unsupported.store(true, Ordering::Relaxed);
                }
                Err(error) => return Err(failed(&error)),
            }
        }
        // No ping: the first page of its tools, whose answer is the proof.
        let first_page = ClientRequest::ListToolsRequest(ListToolsRequest::with_param(
            PaginatedRequestParams::default(),
        ));
        match self.request(first_page, timeouts.keepalive_deadline).await {
            Ok(_) => Ok(()),
            Err(error) => Err(failed(&error)),
        }
    }

    /// Calls a tool once; never retried here. The call takes its arguments; a call that fails
    /// puts back those its transport handed back (see [`CallArguments`]).
    pub async fn call(
        &self,
        tool: &str,
        arguments: &mut CallArguments,
        timeouts: &Timeouts,
        context: &CallContext,
    ) -> Result<CallToolResult, CallFailure> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Some(arguments) = arguments.take() {
            params = params.with_arguments(arguments);
        }
        params.input_responses = context.input_responses.clone();
        params.request_state = context.request_state.clone();
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        match self
            .send("tools/call", request, timeouts, context, Some(arguments))
            .await?
        {
            ServerResult::CallToolResult(result) => Ok(result),
            ServerResult::InputRequiredResult(input) => {
                Err(CallFailure::InputRequired(Box::new(input)))
            }
            _ => Err(CallFailure::Protocol(ErrorData::internal_error(
                "unexpected answer to tools/call",
                None,
            ))),
        }
    }

    /// Sends one request a client made (a tool call, `prompts/get`, `resources/read`, ...)
    /// and waits for its answer within the call deadlines (progress resets the first), unless
    /// the caller cancels it first. Never retried here.
    pub async fn exchange(
        &self,
        method: &str,
        request: ClientRequest,
        timeouts: &Timeouts,
        context: &CallContext,
    ) -> Result<ServerResult, CallFailure> {
        self.send(method, request, timeouts, context, None).await
    }

    /// [`Self::exchange`]; the arguments of a tool call that failed, if its transport handed
    /// them back, go back to `arguments`.
    async fn send(
        &self,
        method: &str,
        mut request: ClientRequest,
        timeouts: &Timeouts,
        context: &CallContext,
        arguments: Option<&mut CallArguments>,
    ) -> Result<ServerResult, CallFailure> {
        if !self.is_alive() {
            // Never sent: a tool call's arguments go back to its caller.
            if let (Some(arguments), ClientRequest::CallToolRequest(call)) = (arguments, request) {
                arguments.put_back(call.params.arguments);
            }
            return Err(CallFailure::NotSent(self.end_fault().await));
        }
        // The deadlines are kept by the route (`await_answer`), not by rmcp: its way costs every
        // request an async lock, a channel and a second timer.
        let mut options = PeerRequestOptions::no_options();
        if self.generation == Generation::Modern {
            // A 2026-07-28 server decides by what the caller can do and wants (per request).
            let mut meta = rmcp::model::RequestMetaObject::new();
            if let Some(level) = context.log_level {
                meta.set_log_level(level);
            }
            if let Some(client) = &context.client {
                meta.set_client_capabilities(client.capabilities());
            }
            options.meta = Some(meta);
        }
        // The trace context travels with the request, whatever the server's generation.
        if let Some(trace) = context.trace.as_ref().map(|t| t.outgoing())
            && !trace.is_empty()
        {
            trace.write_to(options.meta.get_or_insert_default());
        }
        // Registered as the request leaves, by the transport or by `send_straight` (see `route`).
        let route = Arc::new(CallRoute {
            progress: context.progress.clone(),
            log: context.log.clone(),
            client: context.client.clone(),
            raw: context.raw.clone(),
            ..CallRoute::default()
        });
        request.extensions_mut().insert(RouteTag(route.clone()));
        // Boxed: rmcp's futures make this one large, and every future that awaits it inline
        // (the whole call path) would be as large and be copied whole at each move.
        let answer = self.await_answer(method, request, options, &route, timeouts, context);
        let result = Box::pin(answer).await;
        // Whether a failed call may go out again is the caller's to decide (`calls/retry.rs`).
        if let (Err(_), Some(arguments)) = (&result, arguments)
            && let Some(handed_back) = route.take_back()
        {
            arguments.put_back(handed_back);
        }
        result
    }

    /// Sends the request and waits for its answer (see [`Self::exchange`]) within its deadlines
    /// (`route`, [`CallRoute::deadlines`]). A request that runs out of time is cancelled at the
    /// server with the reason rmcp gives.
    async fn await_answer(
        &self,
        method: &str,
        request: ClientRequest,
        options: PeerRequestOptions,
        route: &Arc<CallRoute>,
        timeouts: &Timeouts,
        context: &CallContext,
    ) -> Result<ServerResult, CallFailure> {
        // Set before the request leaves: progress may come before the send returns.
        let now = tokio::time::Instant::now();
        let deadlines = route.deadlines(now, timeouts.call, timeouts.call_max);
        let sent = match (&self.calls, request) {
            (Some(calls), ClientRequest::CallToolRequest(call)) if calls.ready() => {
                self.send_straight(calls, call, options, route)
            }
            (_, request) => (self.peer.send_request_with_option(request, options).await)
                .map(Sent::Rmcp),
        };
        let sent = match sent {
            Ok(sent) => sent,
            Err(error) => {
                return Err(CallFailure::NotSent(
                    self.request_fault(method, error).await,
                ));
            }
        };
        let id = sent.id().clone();
        let _route = Unroute {
            routes: &self.routes,
            id: id.clone(),
        };
        let waited = tokio::select! {
            biased;
            answer = sent.answer() => Ok(answer),
            _ = context.cancel.cancelled() => Err(GaveUp::Cancelled),
            (timeout, reason) = deadlines.out_of_time() => {
                Err(GaveUp::OutOfTime(timeout, reason))
            }
        };
        let answer = match waited {
            Ok(answer) => answer,
            Err(gave_up) => {
                let reason = match gave_up {
                    GaveUp::Cancelled => "the client cancelled the request",
                    GaveUp::OutOfTime(_, reason) => reason,
                };
                let cancelled = CancelledNotificationParam::new(Some(id), Some(reason.into()));
                // Not awaited: a server that stopped reading holds the writer, and the caller
                // must have its answer at the deadline, not when the keepalive gives up.
                let (peer, server) = (self.peer.clone(), self.server.clone());
                tokio::spawn(async move {
                    if let Err(error) = peer.notify_cancelled(cancelled).await {
                        tracing::debug!(%server, "could not pass a cancellation on: {error}");
                    }
                });
                match gave_up {
                    GaveUp::Cancelled => return Err(CallFailure::Cancelled),
                    GaveUp::OutOfTime(timeout, _) => Err(ServiceError::Timeout { timeout }),
                }
            }
        };
        // Progress the server sent before its answer reaches the client before the answer.
        if let Some(progress) = &context.progress {
            progress.flush().await;
        }
        // Read first: a store on every answer would move the line between the cores' caches.
        if matches!(answer, Ok(_) | Err(ServiceError::McpError(_)))
            && self.refusals.load(Ordering::Relaxed) != 0
        {
            self.refusals.store(0, Ordering::Relaxed);
        }
        match answer {
            Ok(result) => Ok(result),
            Err(ServiceError::McpError(error)) => {
                match limit::too_large(error.code.0, error.data.as_ref()) {
                    Some((size, limit)) => Err(CallFailure::TooLarge { size, limit }),
                    None => Err(CallFailure::Protocol(error)),
                }
            }
            Err(ServiceError::Timeout { timeout }) => {
                // A process that died during the call did not time out: say what happened.
                match &self.process {
                    Some(process) if !process.is_alive() => {
                        Err(CallFailure::Lost(self.end_fault().await))
                    }
                    _ => Err(CallFailure::TimedOut(timeout)),
                }
            }
            Err(error) => {
                // An HTTP transport's error says what became of the request; on stdio, one
                // whose write failed (the pipe broke) never left.
                let failure = match self.transport {
                    TransportKind::Stdio => matches!(error, ServiceError::TransportSend(_))
                        .then_some(RequestFailure::SessionGone),
                    _ => http::request_failure(&error),
                };
                match failure {
                    Some(RequestFailure::Status(status)) => Err(CallFailure::HttpStatus(status)),
                    // It certainly did not run.
                    Some(RequestFailure::Refused(refusal)) => {
                        match self
                            .ask_after_refusal(refusal, timeouts, context, &deadlines)
                            .await
                        {
                            Some(failure) => Err(failure),
                            None => Err(CallFailure::NotSent(
                                self.request_fault(method, error).await,
                            )),
                        }
                    }
                    Some(RequestFailure::SessionGone) => Err(CallFailure::NotSent(
                        self.request_fault(method, error).await,
                    )),
                    None => Err(CallFailure::Lost(self.request_fault(method, error).await)),
                }
            }
        }
    }

    /// After a request was refused with HTTP 400 or a JSON-RPC error naming no request, asks
    /// the session again (its keepalive), within the request's deadlines and unless its caller
    /// cancels. A session that answers, even with an HTTP error status, was not forgotten: the
    /// caller gets the refusal, as it would without Tether, and the session stays with the
    /// other requests on it. `None`: the session was forgotten and ends now, not at its next
    /// keepalive; the request, which never ran, goes the way of one never sent. On a 2025-11-25
    /// session a third refusal in a row ends the session as well: a server that restarted
    /// without what the session negotiated, or a replica behind a balancer that never had it,
    /// may answer a keepalive and no request. A caller out of time gets the refusal, and the
    /// session is left for its keepalive to judge.
    async fn ask_after_refusal(
        &self,
        refusal: http::Refusal,
        timeouts: &Timeouts,
        context: &CallContext,
        deadlines: &Deadlines<'_>,
    ) -> Option<CallFailure> {
        const REFUSALS_BEFORE_REPLACING: u32 = 3;
        let refused = |words: String| {
            let code = refusal.code.map_or(ErrorCode::INVALID_REQUEST, ErrorCode);
            Some(CallFailure::Protocol(ErrorData::new(code, words, None)))
        };
        let answers = tokio::select! {
            biased;
            _ = context.cancel.cancelled() => return Some(CallFailure::Cancelled),
            // No time left to tell: the refusal stands, and so does the session.
            _ = deadlines.out_of_time() => {
                return refused(format!(
                    "{} (the session could not be asked again within the request's deadline)",
                    refusal.words
                ));
            }
            asked = self.keepalive(timeouts) => matches!(
                asked,
                Ok(()) | Err(KeepaliveFailure::HttpStatus(_))
            ),
        };
        // A 2026-07-28 server keeps no session to lose: a new one would cost the requests in
        // flight and change nothing.
        let in_a_row = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        if answers
            && (in_a_row < REFUSALS_BEFORE_REPLACING || self.generation == Generation::Modern)
        {
            return refused(format!(
                "{}, and its session still answers: the request itself was refused",
                refusal.words
            ));
        }
        self.end.set(Fault::TransportClosed(match answers {
            true => format!(
                "{} ({in_a_row} requests in a row, although the session answers its keepalive)",
                refusal.words
            ),
            false => format!("{}, and the session no longer answers", refusal.words),
        }));
        None
    }

    /// Sends tool call `call` itself ([`StraightCalls`]) with what rmcp would add to it on a
    /// session with a handshake: the caller's `_meta` (`options`), a progress token. Its route
    /// is registered before it leaves, as the gate does for a request rmcp sends.
    fn send_straight(
        &self,
        calls: &StraightCalls,
        mut call: CallToolRequest,
        options: PeerRequestOptions,
        route: &Arc<CallRoute>,
    ) -> Result<Sent, ServiceError> {
        let id = calls.next_id();
        let token = ProgressToken(id.clone());
        let meta = call.extensions.get_or_insert_default::<RequestMetaObject>();
        if let Some(caller) = options.meta {
            meta.extend(caller);
        }
        meta.set_progress_token(token.clone());
        self.routes.register(id.clone(), Some(token), route.clone());
        let sent = calls.send(id.clone(), call);
        if sent.is_none() {
            self.routes.unregister(&id);
        }
        // As rmcp fails a request on a closed session: it did not leave.
        sent.ok_or(ServiceError::TransportClosed)
    }

    /// The server's prompts, resources and resource templates, each list read if the server
    /// offers it. A list the server fails to give, or one over `max_message`, is left empty
    /// with a warning: it must not cost the server its tools. A transport failure is a fault.
    pub async fn list_catalog(&self, timeouts: &Timeouts) -> Result<ServerCatalog, Fault> {
        let capabilities = self.capabilities();
        let mut catalog = ServerCatalog {
            instructions: (self.peer.peer_info()).and_then(|info| info.instructions.clone()),
            ..ServerCatalog::default()
        };
        if capabilities.prompts.is_some() {
            catalog.prompts = self
                .list_items("prompts/list", "prompts", timeouts, |params| {
                    ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(params))
                })
                .await?;
        }
        if capabilities.resources.is_some() {
            catalog.resources = self
                .list_items("resources/list", "resources", timeouts, |params| {
                    ClientRequest::ListResourcesRequest(ListResourcesRequest::with_param(params))
                })
                .await?;
            catalog.templates = self
                .list_items(
                    "resources/templates/list",
                    "resourceTemplates",
                    timeouts,
                    |params| {
                        ClientRequest::ListResourceTemplatesRequest(
                            ListResourceTemplatesRequest::with_param(params),
                        )
                    },
                )
                .await?;
        }
        Ok(catalog)
    }

    /// Every item of a paginated list, read item by item (one bad item is skipped, not the
    /// list), in at most `max_message` bytes and `max_tool_pages` pages.
    async fn list_items<T: DeserializeOwned>(
        &self,
        method: &str,
        key: &str,
        timeouts: &Timeouts,
        request: impl Fn(PaginatedRequestParams) -> ClientRequest,
    ) -> Result<Vec<T>, Fault> {
        let mut items = Vec::new();
        let mut total = 0usize;
        let mut cursor = None;
        let gave_up = |why: String| {
            tracing::warn!(server = %self.server, "{method}: {why}; serving none of that list");
            Ok(Vec::new())
        };
        for _ in 0..timeouts.max_tool_pages.max(1) {
            let mut params = PaginatedRequestParams::default();
            params.cursor = cursor;
            let page = match self
                .request(request(params), timeouts.keepalive_deadline)
                .await
            {
                Ok(page) => page,
                Err(ServiceError::McpError(error))
                    if limit::too_large(error.code.0, error.data.as_ref()).is_some() =>
                {
                    return gave_up(format!(
                        "the answer is larger than max_message ({})",
                        limit::describe_size(self.max_message as u64)
                    ));
                }
                Err(ServiceError::McpError(error)) => {
                    return gave_up(format!(
                        "the server answered error {}: {}",
                        error.code.0, error.message
                    ));
                }
                Err(error) => return Err(self.request_fault(method, error).await),
            };
            let serde_json::Value::Object(mut page) =
                serde_json::to_value(page).unwrap_or_default()
            else {
                return gave_up("the answer is not an object".into());
            };
            let Some(serde_json::Value::Array(raw)) = page.remove(key) else {
                return gave_up(format!("the answer has no `{key}` list"));
            };
            for item in raw {
                total += item.to_string().len();
                if total > self.max_message {
                    return gave_up(format!(
                        "the list is larger than max_message ({}) in all",
                        limit::describe_size(self.max_message as u64)
                    ));
                }
                match serde_json::from_value::<T>(item) {
                    Ok(item) => items.push(item),
                    Err(error) => {
                        INVALID_ITEMS.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(server = %self.server, "{method}: skipping an invalid item: {error}");
                    }
                }
            }
            match page.get("nextCursor").and_then(|c| c.as_str()) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
                _ => return Ok(items),
            }
        }
        tracing::warn!(server = %self.server, pages = timeouts.max_tool_pages, "{method} has more pages than the cap; using the first ones");
        Ok(items)
    }

    async fn request(
        &self,
        request: ClientRequest,
        deadline: Duration,
    ) -> Result<ServerResult, ServiceError> {
        self.peer
            .send_request_with_option(request, PeerRequestOptions::with_timeout(deadline))
            .await?
            .await_response()
            .await
    }

    async fn request_fault(&self, what: &str, error: ServiceError) -> Fault {
        // The transport's account of a missing authorization says what to do about it.
        if let Some(fault @ Fault::AuthorizationRequired(_)) = self.end.fault() {
            return fault;
        }
        if self.transport != TransportKind::Stdio
            && let Some(fault) = http::classify_service_error(&error)
        {
            return fault;
        }
        match error {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                self.end_fault().await
            }
            ServiceError::Timeout { timeout } => {
                Fault::TransportClosed(format!("{what} got no answer within {timeout:?}"))
            }
            other => {
                Fault::HandshakeFailed(format!("{what} failed: {}", describe_service_error(&other)))
            }
        }
    }

    /// Ends the session: closes the transport (stdin for a child), then stops the process.
    /// A session dropped unclosed (an attempt given up while it listed the server's tools)
    /// ends its service loop in `Drop`.
    pub async fn close(&self, grace: Duration) {
        let token = self.cancel.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(token) = token {
            token.cancel();
        }
        if let Some(process) = &self.process {
            process.terminate(grace).await;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let token = self.cancel.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(token) = token {
            token.cancel();
        }
    }
}

/// How long a request that found its transport closed waits for the session's end to settle.
const END_SETTLES_WITHIN: Duration = Duration::from_secs(5);

fn describe_service_error(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => format!("error {}: {}", error.code.0, error.message),
        other => other.to_string(),
    }
}

fn http_options(
    headers: &std::collections::BTreeMap<String, String>,
    spec: &ServerSpec,
    lifecycle: rmcp::ClientLifecycleMode,
    routes: &Arc<Routes>,
    auth: Option<Arc<crate::auth::Authorizer>>,
) -> HttpOptions {
    HttpOptions {
        headers: headers.clone(),
        connect_timeout: spec.timeouts.connect,
        request_timeout: spec.timeouts.keepalive_deadline,
        max_message: spec.max_message,
        keep_connections: spec.keep_connections,
        lifecycle,
        routes: Some(routes.clone()),
        auth,
    }
}

/// Tools skipped because they were invalid (no name, an empty name), since start.
static INVALID_TOOLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Tools skipped from `tools/list` answers because they were invalid, since start.
pub fn invalid_tools_skipped() -> u64 {
    INVALID_TOOLS.load(Ordering::Relaxed)
}

/// Prompts, resources and templates skipped from list answers because they were invalid.
static INVALID_ITEMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One page of `tools/list`: each tool, or why it could not be read.
struct ToolPage {
    tools: Vec<Result<rmcp::model::Tool, String>>,
    next_cursor: Option<String>,
}

impl ToolPage {
    /// Reads a page that did not parse as a whole, tool by tool.
    fn lenient(raw: serde_json::Value) -> Option<ToolPage> {
        let serde_json::Value::Object(mut page) = raw else {
            return None;
        };
        let serde_json::Value::Array(items) = page.remove("tools")? else {
            return None;
        };
        let tools = items
            .into_iter()
            .map(|item| {
                let name = match item.get("name") {
                    Some(serde_json::Value::String(name)) => Some(bounded(name, (40, 20))),
                    _ => None,
                };
                serde_json::from_value::<rmcp::model::Tool>(item).map_err(|error| {
                    let reason = bounded(&error.to_string(), (120, 80));
                    match name {
                        Some(name) => format!("tool {name:?}: {reason}"),
                        None => reason,
                    }
                })
            })
            .collect();
        let next_cursor = page
            .get("nextCursor")
            .and_then(|cursor| cursor.as_str())
            .map(str::to_string);
        Some(ToolPage { tools, next_cursor })
    }
}

/// Text a server wrote (serde quotes the value it could not read), bounded for a log line: a
/// long one keeps its first `head` and last `tail` characters (the end is where serde says
/// what it expected), cut on characters, never on a byte.
fn bounded(text: &str, (head, tail): (usize, usize)) -> String {
    let count = text.chars().count();
    if count <= head + tail {
        return text.to_string();
    }
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}…[{} characters]…{end}", count - head - tail)
}

/// The host's view of an rmcp tool: what the policy reads (name, read-only) and what agents
/// get (everything else, as the server listed it).
pub fn tool_from_rmcp(tool: rmcp::model::Tool) -> Tool {
    let read_only = tool
        .annotations
        .as_ref()
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false);
    let extra = match serde_json::to_value(&tool) {
        Ok(serde_json::Value::Object(mut all)) => {
            for key in ["name", "description", "inputSchema"] {
                all.remove(key);
            }
            match all.is_empty() {
                true => String::new(),
                false => serde_json::Value::Object(all).to_string(),
            }
        }
        _ => String::new(),
    };
    Tool {
        read_only,
        name: tool.name.into_owned(),
        description: tool.description.map(|d| d.into_owned()),
        input_schema: serde_json::Value::Object((*tool.input_schema).clone()).to_string(),
        extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool that does not parse is skipped with a reason that names it and says what serde
    /// expected, however long the server's text it quotes (cut on characters: a cut on a byte
    /// panicked the server's task).
    #[test]
    fn a_tool_that_does_not_parse_is_named_with_what_was_expected_in_bounded_words() {
        let schema = "中".repeat(500);
        let page = serde_json::json!({"tools": [
            {"name": "good", "inputSchema": {"type": "object"}},
            {"name": "bad", "inputSchema": schema},
            {"name": "b".repeat(1000), "inputSchema": 7},
            {"inputSchema": {"type": "object"}},
        ]});
        let page = ToolPage::lenient(page).expect("a page of tools");
        assert_eq!(page.tools[0].as_ref().map(|tool| tool.name.as_ref()), Ok("good"));
        let reason = page.tools[1].as_ref().expect_err("the schema is no object");
        assert!(reason.starts_with("tool \"bad\": invalid type: string"), "{reason}");
        assert!(reason.ends_with("expected a map"), "{reason}");
        assert!(reason.contains("中…[") && reason.chars().count() < 260, "{reason}");
        let reason = page.tools[2].as_ref().expect_err("the schema is a number");
        assert!(reason.contains("b…[940 characters]…b"), "{reason}");
        assert!(reason.chars().count() < 140, "{reason}");
        assert!(reason.ends_with("expected a map"), "{reason}");
        let reason = page.tools[3].as_ref().expect_err("no name");
        assert!(reason.contains("missing field `name`"), "{reason}");
    }
}
