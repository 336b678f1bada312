//! A live MCP session with one upstream server, whatever its transport: opening it, reading its
//! tools, keepalives, tool calls with deadlines, noticing its end and closing it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[allow(deprecated)] // sampling types: see `UpstreamHandler::create_message`
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest,
    CreateMessageRequestParams, CreateMessageResult, ErrorCode, ErrorData, Implementation,
    JsonObject, ListToolsRequest, PaginatedRequestParams, PingRequest, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestContext, RunningService, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use tokio::sync::{mpsc, watch};

use crate::config::{ServerSpec, Timeouts, TransportSpec};
use crate::policy::{Fault, Tool, TransportKind};
use crate::transport::SessionEnd;
use crate::transport::gate::Guarded;
use crate::transport::http::{self, HttpFlavor, HttpOptions};
use crate::transport::limit::{self, BoundedReader};
use crate::transport::stdio::{self, ChildProcess};

/// Something an upstream server told us outside a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamNotice {
    /// `notifications/tools/list_changed`.
    ToolsChanged,
}

/// The client side of a session: forwards server notifications to the supervisor.
#[derive(Clone)]
pub struct UpstreamHandler {
    /// Holds at most one notice: a flood of list changes coalesces into one pending refresh.
    notices: mpsc::Sender<UpstreamNotice>,
}

impl ClientHandler for UpstreamHandler {
    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        let _ = self.notices.try_send(UpstreamNotice::ToolsChanged);
    }

    /// Tether has no model to sample from and does not pass sampling on to its clients:
    /// the server gets a clear refusal instead of waiting for an answer.
    #[allow(deprecated)] // sampling is deprecated (SEP-2577), but servers still ask for it
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "sampling/createMessage is not supported through Tether: it has no model to sample from",
            None,
        ))
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        info.client_info = Implementation::new("tether", env!("CARGO_PKG_VERSION"));
        info
    }
}

/// How a call failed when it did not produce a result.
#[derive(Debug, Clone, PartialEq)]
pub enum CallFailure {
    /// No answer within the deadline; the server may still be working on it.
    TimedOut(Duration),
    /// The session ended while the call was in flight: it may or may not have run.
    Lost(Fault),
    /// The request never left (no live session): it certainly did not run.
    NotSent(Fault),
    /// The server answered with a JSON-RPC error (e.g. unknown tool, invalid params).
    Protocol(String),
    /// The server answered, but the answer was larger than `max_message` (its size in bytes
    /// when known, and the limit): it was dropped unread. The call did run.
    TooLarge { size: u64, limit: u64 },
}

/// An initialized session.
pub struct Session {
    server: String,
    peer: Peer<RoleClient>,
    cancel: std::sync::Mutex<Option<rmcp::service::RunningServiceCancellationToken>>,
    ended: watch::Receiver<bool>,
    process: Option<ChildProcess>,
    transport: TransportKind,
    server_info: String,
    ping_unsupported: AtomicBool,
    /// Why the transport ended the session, when it knows (e.g. HTTP 404: the server forgot
    /// the session; 401/403: credentials revoked).
    end: SessionEnd,
    max_message: usize,
}

impl Session {
    /// Connects to `spec` and completes the MCP handshake within the connect timeout.
    /// `flavor` remembers, across reconnects, which HTTP flavor the server speaks.
    pub async fn open(
        spec: &ServerSpec,
        flavor: &mut Option<HttpFlavor>,
        notices: mpsc::Sender<UpstreamNotice>,
        log_dir: &Path,
    ) -> Result<Session, Fault> {
        let handler = UpstreamHandler { notices };
        let deadline = spec.timeouts.connect;
        let mut end = SessionEnd::new();
        let (service, process, transport) = match &spec.transport {
            TransportSpec::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let (process, stdout, stdin) =
                    stdio::spawn(&spec.name, command, args, env, cwd.as_deref(), log_dir)?;
                // Lines are bounded before rmcp buffers them (see `limit`); rmcp's own cap
                // stays above ours so it never drops a line silently.
                let reader = BoundedReader::lines(stdout, spec.max_message);
                let transport = AsyncRwTransport::new_client(reader, stdin)
                    .with_max_line_length(spec.max_message.saturating_add(2));
                let transport = Guarded::new(transport, end.clone());
                match tokio::time::timeout(deadline, handler.serve(transport)).await {
                    Ok(Ok(service)) => (service, Some(process), TransportKind::Stdio),
                    Ok(Err(error)) => {
                        let fault = match process.wait_exit(Duration::from_millis(200)).await {
                            Some(code) => Fault::ProcessExited(code),
                            None => Fault::HandshakeFailed(error.to_string()),
                        };
                        process.terminate(spec.timeouts.stop_grace).await;
                        return Err(fault);
                    }
                    Err(_) => {
                        process.terminate(spec.timeouts.stop_grace).await;
                        return Err(Fault::HandshakeTimedOut);
                    }
                }
            }
            TransportSpec::Http {
                url,
                headers,
                sse_fallback,
            } => {
                // Once a flavor worked it is remembered; without fallback it is always Streamable.
                let wanted = match (*flavor, sse_fallback) {
                    (Some(known), _) => Some(known),
                    (None, false) => Some(HttpFlavor::Streamable),
                    (None, true) => None,
                };
                let options = http_options(headers, spec);
                let session =
                    http::connect_session(url, wanted, &options, || handler.clone()).await?;
                *flavor = Some(session.flavor);
                let kind = match session.flavor {
                    HttpFlavor::Streamable => TransportKind::StreamableHttp,
                    HttpFlavor::Sse => TransportKind::Sse,
                };
                end = session.end;
                (session.service, None, kind)
            }
            TransportSpec::Sse { url, headers } => {
                let options = http_options(headers, spec);
                let session =
                    http::connect_session(url, Some(HttpFlavor::Sse), &options, || handler.clone())
                        .await?;
                end = session.end;
                (session.service, None, TransportKind::Sse)
            }
        };
        let mut session = Self::from_service(&spec.name, service, process, transport);
        session.end = end;
        session.max_message = spec.max_message;
        Ok(session)
    }

    fn from_service(
        server: &str,
        service: RunningService<RoleClient, UpstreamHandler>,
        process: Option<ChildProcess>,
        transport: TransportKind,
    ) -> Session {
        let peer = service.peer().clone();
        let server_info = peer
            .peer_info()
            .and_then(|info| {
                info.server_info
                    .as_ref()
                    .map(|i| format!("{} {}", i.name, i.version))
            })
            .unwrap_or_default();
        let cancel = std::sync::Mutex::new(Some(service.cancellation_token()));
        let (ended_tx, ended) = watch::channel(false);
        tokio::spawn(async move {
            let _ = service.waiting().await;
            let _ = ended_tx.send(true);
        });
        Session {
            server: server.to_string(),
            peer,
            cancel,
            ended,
            process,
            transport,
            server_info,
            ping_unsupported: AtomicBool::new(false),
            end: SessionEnd::new(),
            max_message: ServerSpec::DEFAULT_MAX_MESSAGE,
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

    /// Whether requests can still go out: the session has not ended and its process lives.
    pub fn is_alive(&self) -> bool {
        !*self.ended.borrow()
            && !self.peer.is_transport_closed()
            && self.process.as_ref().is_none_or(ChildProcess::is_alive)
    }

    /// Resolves when the session has ended (transport closed, process gone).
    pub async fn ended(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|ended| *ended).await;
    }

    /// Resolves when the child process exits (never for HTTP sessions).
    pub async fn process_exited(&self) -> Option<i32> {
        match &self.process {
            Some(process) => loop {
                if let Some(code) = process.wait_exit(Duration::from_secs(3600)).await {
                    return code;
                }
            },
            None => std::future::pending().await,
        }
    }

    /// The fault the transport recorded when it ended the session, if it did.
    pub fn recorded_end(&self) -> Option<Fault> {
        self.end.fault()
    }

    /// Why the session ended, as a fault: what the transport recorded (HTTP 404, 401/403, a
    /// broken stream), else the process's exit, else "the session ended".
    pub async fn end_fault(&self) -> Fault {
        if let Some(fault) = self.end.fault() {
            return fault;
        }
        if let Some(process) = &self.process {
            // The pipe usually closes a moment before the process is reaped.
            if let Some(code) = process.wait_exit(Duration::from_millis(500)).await {
                return Fault::ProcessExited(code);
            }
        }
        Fault::TransportClosed(format!(
            "the {} session ended",
            transport_name(self.transport)
        ))
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

    /// Proves the session: `ping`, or `tools/list` for servers that do not implement ping.
    pub async fn keepalive(&self, timeouts: &Timeouts) -> Result<(), Fault> {
        if !self.ping_unsupported.load(Ordering::Relaxed) {
            let ping = ClientRequest::PingRequest(PingRequest::default());
            match self.request(ping, timeouts.keepalive_deadline).await {
                Ok(_) => return Ok(()),
                Err(ServiceError::McpError(error)) if error.code == ErrorCode::METHOD_NOT_FOUND => {
                    self.ping_unsupported.store(true, Ordering::Relaxed);
                }
                Err(error) => {
                    return Err(Fault::KeepaliveFailed(describe_service_error(&error)));
                }
            }
        }
        let mut single_page = timeouts.clone();
        single_page.max_tool_pages = 1;
        self.list_tools(&single_page)
            .await
            .map(drop)
            .map_err(|fault| Fault::KeepaliveFailed(fault.to_string()))
    }

    /// Calls a tool once; never retried here.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
        timeouts: &Timeouts,
    ) -> Result<CallToolResult, CallFailure> {
        if !self.is_alive() {
            return Err(CallFailure::NotSent(self.end_fault().await));
        }
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut options = PeerRequestOptions::with_timeout(timeouts.call);
        options.reset_timeout_on_progress = true;
        options.max_total_timeout = Some(timeouts.call_max);
        let answer = match self.peer.send_request_with_option(request, options).await {
            Ok(handle) => handle.await_response().await,
            Err(error) => {
                return Err(CallFailure::NotSent(
                    self.request_fault("tools/call", error).await,
                ));
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(CallFailure::Protocol(
                "unexpected answer to tools/call".into(),
            )),
            Err(ServiceError::McpError(error)) => {
                match limit::too_large(error.code.0, error.data.as_ref()) {
                    Some((size, limit)) => Err(CallFailure::TooLarge { size, limit }),
                    None => Err(CallFailure::Protocol(error.message.to_string())),
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
            Err(error) => Err(CallFailure::Lost(
                self.request_fault("tools/call", error).await,
            )),
        }
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

fn transport_name(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Stdio => "stdio",
        TransportKind::StreamableHttp => "Streamable HTTP",
        TransportKind::Sse => "SSE",
    }
}

fn describe_service_error(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => format!("error {}: {}", error.code.0, error.message),
        other => other.to_string(),
    }
}

fn http_options(
    headers: &std::collections::BTreeMap<String, String>,
    spec: &ServerSpec,
) -> HttpOptions {
    HttpOptions {
        headers: headers.clone(),
        connect_timeout: spec.timeouts.connect,
        request_timeout: spec.timeouts.keepalive_deadline,
        max_message: spec.max_message,
    }
}

/// Tools skipped because they were invalid (no name, an empty name), since start.
static INVALID_TOOLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Tools skipped from `tools/list` answers because they were invalid, since start.
pub fn invalid_tools_skipped() -> u64 {
    INVALID_TOOLS.load(Ordering::Relaxed)
}

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
                serde_json::from_value::<rmcp::model::Tool>(item).map_err(|error| {
                    let mut reason = error.to_string();
                    reason.truncate(200);
                    reason
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

/// The policy's view of an rmcp tool.
pub fn tool_from_rmcp(tool: rmcp::model::Tool) -> Tool {
    Tool {
        read_only: tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false),
        name: tool.name.into_owned(),
        description: tool.description.map(|d| d.into_owned()),
        input_schema: serde_json::Value::Object((*tool.input_schema).clone()).to_string(),
    }
}

/// Shared so a call can keep using a session the supervisor has since replaced.
pub type SharedSession = Arc<Session>;
