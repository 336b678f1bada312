//! The gateway: one MCP server (stdio or Streamable HTTP) whose tools are the live registry.
//! Every registry change is announced to every downstream session with
//! `notifications/tools/list_changed`, so a connected agent sees tools go and come back without
//! reconnecting. Calls go through the supervisor's call path (admission, one call, report).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler, ServiceExt};
use tokio::task::JoinHandle;

use crate::calls::CallError;
use crate::registry::Route;
use crate::supervisor::Supervisor;

/// Downstream sessions to notify of tool list changes.
#[derive(Clone, Default)]
struct Downstream {
    peers: Arc<Mutex<Vec<Peer<RoleServer>>>>,
}

impl Downstream {
    fn register(&self, peer: Peer<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|p| !p.is_transport_closed());
        peers.push(peer);
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

    /// Serves Streamable HTTP at `http://ADDR/mcp` until `shutdown` resolves.
    pub async fn serve_http(
        self,
        bind: SocketAddr,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(SocketAddr, JoinHandle<()>), String> {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let mut config = StreamableHttpServerConfig::default();
        if !addr.ip().is_loopback() {
            // A deliberate non-loopback bind serves other hosts' names too.
            config = config.disable_allowed_hosts();
        }
        let service = StreamableHttpService::new(
            move || Ok(self.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let app = axum::Router::new().nest_service("/mcp", service);
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!("MCP over HTTP stopped: {error}");
            }
        });
        Ok((addr, task))
    }
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
            Ok(result) => Ok(result.into()),
            Err(CallError::UnknownTool(name)) => Err(McpError::invalid_params(
                format!("unknown tool {name:?}: it is not in tools/list"),
                None,
            )),
        }
    }
}
