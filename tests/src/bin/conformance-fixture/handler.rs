//! The rmcp `ServerHandler`: one per 2025-11-25 session (or stdio connection), one per
//! 2026-07-28 request, all sharing the process-wide [`Shared`].

#![allow(deprecated)] // Logging and resource subscriptions are deprecated by SEP-2577.

use std::sync::{Arc, Mutex};

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
        GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
        ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, LoggingLevel,
        LoggingMessageNotificationParam, PaginatedRequestParams, ProtocolVersion,
        ReadResourceRequestParams, ReadResourceResponse, ServerConfig, SetLevelRequestMethod,
        SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
        UnsubscribeRequestParams,
    },
    service::{NotificationContext, RequestContext, SubscriptionContext},
};
use serde_json::json;

use crate::severity::severity;
use crate::{
    content,
    state::{Shared, lock},
    tools,
};

#[derive(Clone)]
pub struct Handler {
    pub shared: Arc<Shared>,
    /// Distinguishes this session (or request) in the shared subscriber tables.
    id: u64,
    /// The session's `logging/setLevel`; `None` until the client sets one.
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
}

impl Handler {
    pub fn new(shared: Arc<Shared>) -> Self {
        let id = shared.next_id();
        Handler {
            shared,
            id,
            log_level: Arc::default(),
        }
    }

    /// Sends `notifications/message` if the client wants `level`. A 2025-11-25 session hears
    /// everything until it sets a level; a 2026-07-28 request only what its `_meta` logLevel
    /// asks for, and nothing without one (`sep-2575-server-no-log-without-loglevel`).
    pub async fn log(
        &self,
        context: &RequestContext<RoleServer>,
        level: LoggingLevel,
        message: &str,
    ) -> Result<(), McpError> {
        let threshold = if is_modern(context) {
            match context.meta.log_level() {
                Some(threshold) => threshold,
                None => return Ok(()),
            }
        } else {
            lock(&self.log_level).unwrap_or(LoggingLevel::Debug)
        };
        if severity(level) < severity(threshold) {
            return Ok(());
        }
        let mut param = LoggingMessageNotificationParam::new(level, json!(message));
        param.logger = Some("conformance-fixture".to_string());
        context
            .peer
            .notify_logging_message(param)
            .await
            .map_err(|error| tools::internal(format!("sending a log message: {error}")))
    }
}

/// Whether the request came on the 2026-07-28 (stateless, per-request `_meta`) wire.
pub fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

impl ServerHandler for Handler {
    // rmcp's default `supported_protocol_versions` is every version it knows, 2024-11-05
    // through 2026-07-28: both wires on one URL.
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(self.shared.catalog.capabilities.clone())
            .with_server_info(Implementation::new(
                "tether-conformance-fixture",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Implements every server scenario of the MCP conformance suite.".to_string(),
            )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // From now on this session hears about list changes.
        self.shared.add_session(self.id, context.peer);
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Removed in 2026-07-28, but rmcp 3.11 still dispatches it (its -32601 becomes 404).
        if is_modern(&context) {
            return Err(McpError::method_not_found::<SetLevelRequestMethod>());
        }
        *lock(&self.log_level) = Some(request.level);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.shared.tools()))
    }

    /// rmcp's HTTP layer looks tools up here to check `Mcp-Param-*` headers (SEP-2243).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.shared
            .tools()
            .into_iter()
            .find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        tools::call(self, request, context).await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(self.shared.prompts()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let capabilities = context.client_capabilities().unwrap_or_default();
        content::get_prompt(&self.shared, request, &capabilities)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(
            self.shared.catalog.resources.clone(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            self.shared.catalog.templates.clone(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        content::read_resource(&self.shared, &request.uri).map(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        content::complete(&request)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        content::read_resource(&self.shared, &request.uri)?;
        self.shared.subscribe(self.id, context.peer, &request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.shared.unsubscribe(self.id, &request.uri);
        Ok(())
    }

    /// 2026-07-28 `subscriptions/listen`: everything asked for that the capabilities offer
    /// (rmcp intersects with them, acknowledges first and tags every notification with the
    /// subscription id).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        self.shared.add_listener(self.id, context.sink().clone());
        context.cancelled().await;
        self.shared.remove_listener(self.id);
        Ok(())
    }
}
