//! The rmcp `ServerHandler`: one per session, all sharing the process-wide [`Fixture`].

use std::{borrow::Cow, sync::Arc, time::Duration};

#[allow(deprecated)] // logging/setLevel: the fixture plays a server of the older generation
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
        CompleteResult, ContentBlock, GetPromptRequestParams, GetPromptResponse, Implementation,
        InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, PingRequestMethod,
        PromptsCapability, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
        ResourcesCapability, ServerCapabilities, ServerConfig, SetLevelRequestParams,
        SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
    },
    service::{NotificationContext, RequestContext, SubscriptionContext},
};
use serde_json::Value;

use crate::{
    catalog,
    cli::{Transport, exit_code},
    fixture::{self, Fixture},
    tools,
};

/// With `flap`: delay between `notifications/initialized` and the exit, so the HTTP
/// transports can still acknowledge that notification (202) before the process dies.
const FLAP_AFTER_INITIALIZED: Duration = Duration::from_millis(20);
/// With `flap`: exit anyway this long after answering initialize if `initialized` never comes.
const FLAP_FALLBACK: Duration = Duration::from_millis(500);

#[derive(Clone)]
pub struct Handler {
    fixture: Arc<Fixture>,
}

impl Handler {
    pub fn new(fixture: Arc<Fixture>) -> Self {
        Self { fixture }
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let settings = self.fixture.settings();
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        // Prompts and resources only when asked for at start, so other tests' fixtures stay
        // tools-only servers.
        if settings.prompts.is_some() {
            let mut prompts = PromptsCapability::default();
            prompts.list_changed = Some(true);
            capabilities.prompts = Some(prompts);
        }
        if settings.resources.is_some() || settings.templates.is_some() {
            let mut resources = ResourcesCapability::default();
            resources.list_changed = Some(true);
            resources.subscribe = Some(true);
            capabilities.resources = Some(resources);
        }
        if settings.prompts.is_some() || settings.templates.is_some() {
            capabilities.completions = Some(Default::default());
        }
        // It sends log messages (`logs`, `debug_logs`), at the level a client sets; the
        // 2026-07-28 revision has no `logging/setLevel`.
        if !settings.modern_only {
            #[allow(deprecated)]
            {
                capabilities.logging = Some(Default::default());
            }
        }
        let config = ServerConfig::new(capabilities).with_server_info(Implementation::new(
            "mcp-fixture",
            env!("CARGO_PKG_VERSION"),
        ));
        match &settings.instructions {
            Some(instructions) => config.with_instructions(instructions.clone()),
            None => config,
        }
    }

    // Only the revisions with an `initialize` handshake: the fixture plays a classic
    // session-based server (and keeps `ping`, which later revisions drop). With
    // `--modern-only`, only 2026-07-28.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.fixture.settings().modern_only {
            return Cow::Owned(vec![ProtocolVersion::V_2026_07_28]);
        }
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    /// 2026-07-28 clients get change notifications on `subscriptions/listen`: everything
    /// they ask for that the fixture offers.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let id = self
            .fixture
            .add_stream(context.sink().clone(), context.accepted().clone());
        context.cancelled().await;
        self.fixture.remove_stream(id);
        Ok(())
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        // The HTTP transports count (and fail) initializes before rmcp sees them, to answer 500.
        if self.fixture.transport == Transport::Stdio && !self.fixture.record_initialize() {
            fixture::exit(exit_code::FAIL_INITIALIZE, "fail initializes");
        }
        if self.fixture.settings().flap {
            tokio::spawn(async {
                tokio::time::sleep(FLAP_FALLBACK).await;
                fixture::exit(exit_code::FLAP, "flap (no initialized notification)");
            });
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if self.fixture.settings().flap {
            tokio::spawn(async {
                tokio::time::sleep(FLAP_AFTER_INITIALIZED).await;
                fixture::exit(exit_code::FLAP, "flap");
            });
        }
        self.fixture.register_peer(context.peer);
    }

    async fn ping(&self, _context: RequestContext<RoleServer>) -> Result<(), McpError> {
        if self.fixture.settings().ping_unsupported {
            Err(McpError::method_not_found::<PingRequestMethod>())
        } else {
            Ok(())
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let settings = self.fixture.settings();
        let tools = tools::definitions(&settings);
        if settings.page_size == 0 {
            return Ok(ListToolsResult::with_all_items(tools));
        }
        // The cursor is the index of the page's first tool.
        let start = match request.and_then(|r| r.cursor) {
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| McpError::invalid_params("bad cursor", None))?,
            None => 0,
        };
        let end = (start + settings.page_size).min(tools.len());
        let mut page =
            ListToolsResult::with_all_items(tools.get(start..end).unwrap_or_default().to_vec());
        if end < tools.len() {
            page.next_cursor = Some(end.to_string());
        }
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let fixture = &self.fixture;
        if fixture.exit_armed() {
            // The process is about to exit: this call must not execute.
            std::future::pending::<()>().await;
        }
        let settings = fixture.settings();
        let Some(name) = tools::resolve(request.name.as_ref(), &settings) else {
            return Err(McpError::invalid_params(
                format!("unknown tool: {}", request.name),
                None,
            ));
        };
        let arguments = request.arguments.clone().unwrap_or_default();
        let call = tools::parse(name, &arguments)
            .map_err(|message| McpError::invalid_params(message, None))?;

        // The trace context each call came with (SEP-414 `_meta`), for the tracing tests.
        let traceparent = context
            .meta
            .get_traceparent()
            .or_else(|| request.meta.as_ref().and_then(|m| m.get_traceparent()));
        if let Some(traceparent) = traceparent {
            let _ = fixture.state.append_line("traceparents.log", traceparent);
        }
        // Recorded before anything can go wrong, so tests can prove "executed exactly once".
        fixture
            .state
            .append_call(name, &Value::Object(arguments))
            .map_err(|error| {
                McpError::internal_error(format!("writing calls.log: {error}"), None)
            })?;
        let number = fixture.next_call_number();
        if settings.crash_after_calls.is_some_and(|n| number >= n) {
            fixture::exit(
                exit_code::CRASH_AFTER_CALLS,
                "crash after calls (during the call)",
            );
        }
        if settings.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(settings.slow_ms)).await;
        }
        if matches!(call, tools::Call::Confirm) {
            return Ok(confirm(request.input_responses, request.request_state));
        }
        let result = tokio::select! {
            result = tools::run(call, &context) => result,
            _ = context.ct.cancelled() => {
                // Recorded so tests can prove the cancellation reached the server.
                if let Err(error) = fixture.state.bump(crate::state::CANCELLED) {
                    eprintln!("mcp-fixture: counting cancellations: {error}");
                }
                CallToolResult::error(vec![ContentBlock::text("cancelled")])
            }
        };
        if crate::garbage::wanted(fixture.transport, &settings, &context) {
            return Ok(crate::garbage::answer(fixture.transport).await.into());
        }
        if settings.crash_after_answers.is_some_and(|n| number >= n) {
            fixture.exit_after_answer(exit_code::CRASH_AFTER_CALLS, "crash after answers");
        }
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(catalog::prompts(
            &self.fixture.settings(),
        )))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        // On 2026-07-28, a prompt named `ask` first asks the client for input, like `confirm`.
        if request.name == "ask" && self.fixture.settings().modern_only {
            return Ok(
                match confirm(request.input_responses, request.request_state) {
                    CallToolResponse::InputRequired(input) => input.into(),
                    CallToolResponse::Complete(result) => {
                        rmcp::model::GetPromptResult::new(vec![rmcp::model::PromptMessage::new(
                            rmcp::model::Role::User,
                            result.content[0].clone(),
                        )])
                        .into()
                    }
                    _ => unreachable!("confirm answers or asks"),
                },
            );
        }
        catalog::get_prompt(
            &self.fixture.settings(),
            &request.name,
            request.arguments.as_ref(),
        )
        .map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(catalog::resources(
            &self.fixture.settings(),
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            catalog::templates(&self.fixture.settings()),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        catalog::read(&self.fixture.settings(), &request.uri).map(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        catalog::complete(&request)
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.fixture.subscribe(context.peer, &request.uri);
        Ok(())
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.fixture.set_log_level(request.level);
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.fixture.unsubscribe(&request.uri);
        Ok(())
    }
}

/// `confirm`: without input responses, asks for a confirmation (an elicitation the client must
/// answer, with opaque state to echo); with them, answers with what the client said.
fn confirm(
    responses: Option<rmcp::model::InputResponses>,
    state: Option<String>,
) -> CallToolResponse {
    match responses {
        None => {
            let ask: rmcp::model::InputRequest = serde_json::from_value(serde_json::json!({
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": "Confirm?",
                    "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
                },
            }))
            .expect("a valid elicitation request");
            rmcp::model::InputRequiredResult::new(
                Some([("confirm".to_string(), ask)].into()),
                Some("state-1".into()),
            )
            .into()
        }
        Some(responses) => CallToolResult::success(vec![ContentBlock::text(format!(
            "confirmed {} with {}",
            responses.get("confirm").cloned().unwrap_or_default(),
            state.unwrap_or_default()
        ))])
        .into(),
    }
}
