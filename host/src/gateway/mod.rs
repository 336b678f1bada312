//! The gateway: one MCP server (stdio or Streamable HTTP) that serves the visible tools,
//! prompts and resources of every upstream, to clients of both protocol generations
//! (2025-11-25 and older with `initialize` and sessions; 2026-07-28 without).
//!
//! Every change of what is visible is announced downstream (`downstream.rs`), so a connected
//! agent sees a server's tools, prompts and resources go and come back without reconnecting.
//! Tool calls go through the supervisor's call path (admission, one call, report); prompts,
//! resource reads, completions and subscriptions are routed by the catalog to the server that
//! offers them and forwarded on its live session. Results are re-shaped only where the
//! generations differ (`resultType`, cache hints; rmcp strips them for older clients).

mod asking;
mod client;
mod departure;
mod direct;
mod downstream;
mod http;
mod log_levels;

pub(crate) use http::bearer_token;
pub use http::{Hosts, HttpOptions, McpToken, parse_allowed_origin};
insides! { pub use http::{HttpServer, McpEndpoint}; }

#[allow(deprecated)] // logging and resources/subscribe are legacy-only, and still served
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, CompleteRequest, CompleteRequestParams,
    CompleteResult, DiscoverResult, GetPromptRequest, GetPromptRequestParams, GetPromptResponse,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, MetaObject,
    PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse,
    Reference, ResultType, ServerCapabilities, ServerConfig, ServerResult, SetLevelRequestParams,
    SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use crate::calls::CallError;
use crate::catalog::{self, CatalogChange, UriRoute};
use crate::registry::Route;
use crate::supervisor::Supervisor;
use crate::telemetry::RequestTrace;
use crate::transport::lines::Lines;
use crate::transport::lines::raw::{self, RawResult, is_placeholder};
use crate::transport::pipe_size::Pipe;
use crate::upstream::{CallContext, CallFailure, ServerEvent, Session};
use client::{MAX_INPUT_ROUNDS, modern_client};
use downstream::Downstream;

/// Items per page of the merged prompt and resource lists.
const LIST_PAGE: usize = 500;

/// The MCP server agents talk to. Each downstream session gets its own clone (and number).
pub struct Gateway {
    supervisor: Supervisor,
    downstream: Downstream,
    sessions: Arc<AtomicU64>,
    /// This clone's downstream session.
    session: u64,
    /// Releases the session's subscriptions upstream when this handle, the one rmcp serves
    /// the session with, is dropped; `None` in the other handles on the session.
    _departure: Option<departure::Departure>,
    /// The upstream session each server's wanted URIs were last subscribed on (held weakly:
    /// the address of a dropped session is never reused while it is here).
    resubscribed: Arc<std::sync::Mutex<HashMap<String, Weak<Session>>>>,
    /// Calls of 2026-07-28 clients waiting for answers to an older server's requests.
    parking: Arc<asking::Parking>,
    /// The log level older servers were told (the most verbose any client set).
    log_levels: Arc<log_levels::LogLevels>,
    /// For a Streamable HTTP endpoint's sessions: where their tool calls are served (held
    /// weakly: it holds the sessions it serves).
    http_calls: Option<Weak<http::calls::HttpCalls>>,
}

/// A server's live session and its spec.
type LiveSession = (
    Arc<crate::upstream::Session>,
    Arc<crate::config::ServerSpec>,
);

impl Clone for Gateway {
    /// A clone serves a new downstream session (rmcp's HTTP service clones per session).
    fn clone(&self) -> Self {
        let mut clone = Self {
            session: self.sessions.fetch_add(1, Ordering::Relaxed),
            ..self.same_session()
        };
        clone._departure = Some(departure::Departure::session(&clone));
        clone
    }
}

impl Gateway {
    /// Another handle on this very downstream session (a clone serves a new one), which does
    /// not keep the session's subscriptions once rmcp's handle has gone.
    fn same_session(&self) -> Self {
        Self {
            supervisor: self.supervisor.clone(),
            downstream: self.downstream.clone(),
            sessions: self.sessions.clone(),
            session: self.session,
            _departure: None,
            resubscribed: self.resubscribed.clone(),
            parking: self.parking.clone(),
            log_levels: self.log_levels.clone(),
            http_calls: self.http_calls.clone(),
        }
    }

    /// Builds the gateway and starts announcing changes downstream: tool lists (registry),
    /// prompt and resource lists (catalog), resource updates and log messages (upstreams).
    pub(crate) fn new(supervisor: Supervisor) -> (Self, JoinHandle<()>) {
        let downstream = Downstream::default();
        let mut tools = supervisor.registry().subscribe();
        let mut catalog = supervisor.catalog().subscribe();
        let mut events = supervisor.server_events();
        let gateway = Self {
            supervisor,
            downstream,
            sessions: Arc::new(AtomicU64::new(1)),
            session: 0,
            _departure: None,
            resubscribed: Arc::default(),
            parking: Arc::default(),
            log_levels: Arc::default(),
            http_calls: None,
        };
        let announcer = gateway.clone();
        let others = async move {
            loop {
                tokio::select! {
                    change = tools.recv() => match change {
                        Ok(change) => {
                            announcer.downstream.tools_changed();
                            announcer.resubscribe(&change.server);
                            announcer.relevel(Some(change.server));
                        }
                        Err(RecvError::Lagged(_)) => {
                            announcer.downstream.tools_changed();
                            announcer.relevel(None);
                        }
                        Err(RecvError::Closed) => return,
                    },
                    change = catalog.recv() => match change {
                        Ok(change) => {
                            announcer.downstream.catalog_changed(change);
                            // A server with resources but no tools changes no tool list.
                            announcer.resubscribe_owners();
                            announcer.relevel(None);
                        }
                        Err(RecvError::Lagged(_)) => {
                            let both = CatalogChange { prompts: true, resources: true };
                            announcer.downstream.catalog_changed(both);
                            announcer.resubscribe_owners();
                            announcer.relevel(None);
                        }
                        Err(RecvError::Closed) => return,
                    },
                    event = events.recv() => match event {
                        Ok(event) => announcer.pass_on(event),
                        Err(RecvError::Lagged(missed)) => {
                            tracing::debug!("{missed} upstream notifications dropped on the way to clients");
                        }
                        Err(RecvError::Closed) => return,
                    },
                }
            }
        };
        let task = tokio::spawn(others);
        (gateway, task)
    }

    /// After a server's publication changed (`None`: any server's), tells a new session the
    /// log level clients want, if any client set one.
    fn relevel(&self, server: Option<String>) {
        if self.downstream.most_verbose_level().is_none() {
            return;
        }
        let gateway = self.same_session();
        tokio::spawn(async move {
            gateway.tell_log_levels(server.as_deref()).await;
        });
    }

    /// Serves one session over this process's stdin/stdout until the client leaves.
    pub(crate) async fn serve_stdio(self) -> Result<(), crate::Error> {
        let (input, output) = crate::transport::own_stdio::streams();
        let direct = Arc::new(direct::Direct::new(self.same_session()));
        // This process's stdin and stdout stay open as long as it runs.
        let pipes = (Pipe::of(&std::io::stdin()), Pipe::of(&std::io::stdout()));
        let transport: Lines<RoleServer, _, _> =
            Lines::new(input, output, crate::transport::lines::DEFAULT_MAX_LINE)
                .with_pipes(pipes.0, pipes.1)
                .with_direct(direct.clone());
        let service = match self.serve(transport).await {
            Ok(service) => service,
            // The client left before a session began: its end, as closing stdin later is.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
            Err(error) => return Err(crate::Error::Stdio(error.to_string())),
        };
        direct.serving(service.peer().clone());
        let served = service.waiting().await;
        crate::transport::lines::DirectCalls::closed(&*direct);
        match served {
            Ok(rmcp::service::QuitReason::JoinError(error)) | Err(error) => Err(
                crate::Error::Stdio(format!("the session's task failed: {error}")),
            ),
            Ok(_) => Ok(()),
        }
    }

    /// An upstream's resource update or log message, to the clients that asked for it. An
    /// update counts only from the server the URI routes to.
    fn pass_on(&self, event: ServerEvent) {
        match event {
            ServerEvent::ResourceUpdated { server, uri } => {
                if self.supervisor.catalog().view().route_uri(&uri) == UriRoute::Server(server) {
                    self.downstream.resource_updated(&uri);
                }
            }
            ServerEvent::Log { server, message } => {
                if self.supervisor.catalog().is_visible(&server) {
                    self.downstream.log(&server, message);
                }
            }
        }
    }

    /// A 2026-07-28 client's call: an older server's requests during it become a request for
    /// input, and the client's next call with the answers (and Tether's request state) goes
    /// on with the same upstream call (see `asking.rs`). `asked`: where a new call's server
    /// questions come (`None` for a call resumed with answers: its own channel is parked).
    async fn call_for_modern_client(
        &self,
        request: CallToolRequestParams,
        mut call: CallContext,
        asked: Option<asking::Asked>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let asking = match asked {
            // A request state Tether issued (`call_tool` checked): the parked call goes on.
            None => {
                let state = request.request_state.as_deref().unwrap_or_default();
                let responses = request.input_responses;
                self.parking
                    .resume(state, &request.name, responses, &mut call)?
            }
            Some(asked) => {
                // The upstream call may outlive this request: it is cancelled on its own token.
                let cancel = tokio_util::sync::CancellationToken::new();
                call.cancel = cancel.clone();
                // A retry a 2026-07-28 server asked for carries its answers through.
                call.input_responses = request.input_responses;
                call.request_state = request.request_state;
                let supervisor = self.supervisor.clone();
                let (tool, arguments) = (request.name.to_string(), request.arguments);
                let raw = call.raw.clone();
                let following = asking::Following::relay(&mut call);
                let running = async move { supervisor.call_tool_in(&tool, arguments, call).await };
                let tool = request.name.to_string();
                asking::Asking::start(running, asked, cancel, tool, (raw, following))
            }
        };
        let raw = asking.raw.clone();
        match self.parking.drive(asking, &context.ct).await {
            asking::Turn::Done(outcome) => {
                let outcome = raw_to_this_request(outcome, raw, &context.extensions);
                call_answer(&request.name, outcome, true)
            }
            asking::Turn::Ask(input) => Ok(CallToolResponse::InputRequired(input)),
        }
    }

    /// What a forwarded `method` request for `target` (as the client names it) takes along from
    /// the client's request in `context` (`client` is that request's [`client::Client`]), its
    /// trace started (see `client.rs`).
    fn call_context(
        &self,
        server: &str,
        (method, target): (&str, &str),
        context: &RequestContext<RoleServer>,
        client: Arc<client::Client>,
    ) -> CallContext {
        let log_level = self.downstream.log_level(self.session);
        let mut call = client::call_context(server, context, log_level, client);
        call.trace = Some(RequestTrace::start(method, target, &context.meta));
        call
    }

    /// Sends `request` to `server` on its live session, for a client's request in `context`
    /// (its cancellation, progress and log level follow; what the server asks of the client
    /// reaches it). Errors name the server and say whether the request went out.
    async fn forward(
        &self,
        server: &str,
        method: &str,
        request: ClientRequest,
        call: &CallContext,
    ) -> Result<ServerResult, McpError> {
        let trace = call.trace.as_deref();
        if let Some(trace) = trace {
            trace.record("tether.server", server);
        }
        let answer = match self.live_session(server, method) {
            Ok((session, spec)) => session
                .exchange(method, request, &spec.timeouts, call)
                .await
                .map_err(|failure| forward_error(server, method, failure)),
            Err(error) => Err(error),
        };
        if let Some(trace) = trace {
            match &answer {
                Ok(_) => trace.outcome("ok", None),
                Err(error) => trace.outcome("error", Some(&error.message)),
            }
        }
        answer
    }

    /// [`Self::forward`] of the request `make` builds (from the input answers and request state
    /// of a retry, `first` for the first round), answering for an older client what a
    /// 2026-07-28 server asks of it, round after round (see `client.rs`).
    async fn forward_answering(
        &self,
        server: &str,
        (method, target): (&str, &str),
        first: (Option<rmcp::model::InputResponses>, Option<String>),
        make: impl Fn(Option<rmcp::model::InputResponses>, Option<String>) -> ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let asker = Arc::new(client::Client::of(context));
        let call = self.call_context(server, (method, target), context, asker.clone());
        let (mut responses, mut state) = first;
        for _ in 0..MAX_INPUT_ROUNDS {
            match self
                .forward(server, method, make(responses, state), &call)
                .await?
            {
                ServerResult::InputRequiredResult(input) if client::can_be_asked(&asker) => {
                    responses = Some(client::fulfil(server, &asker, &input).await?);
                    state = input.request_state;
                }
                answer => return Ok(answer),
            }
        }
        Err(McpError::internal_error(
            format!(
                "server {server:?} kept asking the client for input: {MAX_INPUT_ROUNDS} rounds"
            ),
            None,
        ))
    }

    /// The live session of `server` and its spec, if it has one.
    fn live(&self, server: &str) -> Option<LiveSession> {
        let lookup = self.supervisor.shared.session(server)?;
        Some((lookup.current.filter(|s| s.is_alive())?, lookup.spec))
    }

    /// The live session of `server`, or the error that says why there is none.
    fn live_session(&self, server: &str, method: &str) -> Result<LiveSession, McpError> {
        if let Some(live) = self.live(server) {
            return Ok(live);
        }
        if self.supervisor.shared.session(server).is_none() {
            return Err(McpError::invalid_params(
                format!("server {server:?} was removed; {method} was not sent"),
                None,
            ));
        }
        Err(McpError::internal_error(
            format!(
                "server {server:?} is reconnecting; {method} was not sent. Retry in a few seconds."
            ),
            None,
        ))
    }

    /// The server a resource URI goes to, or the error that says why none does, worded for a
    /// client of 2026-07-28 (`modern`) or older.
    fn route_uri(&self, uri: &str, modern: bool) -> Result<String, McpError> {
        match self.supervisor.catalog().view().route_uri(uri) {
            UriRoute::Server(server) => Ok(server),
            UriRoute::Ambiguous(servers) => Err(McpError::invalid_params(
                format!(
                    "resource {uri:?} is offered by several servers ({}); Tether does not guess which one",
                    servers.join(", ")
                ),
                None,
            )),
            // The code each generation gives "resource not found" (-32002 up to 2025-11-25,
            // -32602 since 2026-07-28, SEP-2164), with the URI in `data` as both say.
            UriRoute::Unknown => {
                let message = format!("no visible server offers resource {uri:?}");
                let data = Some(serde_json::json!({ "uri": uri }));
                Err(match modern {
                    true => McpError::invalid_params(message, data),
                    false => McpError::resource_not_found(message, data),
                })
            }
        }
    }

    /// Subscribes `server` to `uri` if it offers subscriptions.
    #[allow(deprecated)]
    async fn subscribe_upstream(
        &self,
        server: &str,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if !self.offers_subscriptions(server) {
            return Err(McpError::invalid_params(
                format!("server {server:?} does not offer resource subscriptions"),
                None,
            ));
        }
        let _ = context;
        let (session, spec) = self.live_session(server, "resources/subscribe")?;
        session
            .subscribe_resource(uri, true, &spec.timeouts)
            .await
            .map_err(|failure| forward_error(server, "resources/subscribe", failure))
    }

    fn offers_subscriptions(&self, server: &str) -> bool {
        self.supervisor
            .shared
            .session(server)
            .and_then(|lookup| lookup.current)
            .is_some_and(|session| session.offers_resource_subscriptions())
    }

    /// [`Gateway::resubscribe`] for every server that owns a URI clients want.
    fn resubscribe_owners(&self) {
        let view = self.supervisor.catalog().view();
        let owners: std::collections::BTreeSet<String> = self
            .downstream
            .subscribed_uris()
            .iter()
            .filter_map(|uri| match view.route_uri(uri) {
                UriRoute::Server(server) => Some(server),
                _ => None,
            })
            .collect();
        for server in owners {
            self.resubscribe(&server);
        }
    }

    /// After `server`'s publication changed, if it did on a new session, subscribes it again
    /// to every URI clients still want from it: a new session knows no subscriptions.
    #[allow(deprecated)]
    fn resubscribe(&self, server: &str) {
        let Some((session, spec)) = self
            .supervisor
            .shared
            .session(server)
            .and_then(|lookup| lookup.current.map(|s| (s, lookup.spec)))
            .filter(|(session, _)| session.offers_resource_subscriptions())
        else {
            return;
        };
        {
            let mut done = self.resubscribed.lock().unwrap_or_else(|e| e.into_inner());
            if done
                .get(server)
                .is_some_and(|last| std::ptr::eq(last.as_ptr(), Arc::as_ptr(&session)))
            {
                return;
            }
            done.insert(server.to_string(), Arc::downgrade(&session));
        }
        let view = self.supervisor.catalog().view();
        let wanted: Vec<String> = self
            .downstream
            .subscribed_uris()
            .into_iter()
            .filter(|uri| view.route_uri(uri) == UriRoute::Server(server.to_string()))
            .collect();
        if wanted.is_empty() {
            return;
        }
        let server = server.to_string();
        let downstream = self.downstream.clone();
        tokio::spawn(async move {
            for uri in wanted {
                // One released meanwhile would never be released again.
                if !downstream.wanted(&uri) {
                    continue;
                }
                if let Err(failure) = session.subscribe_resource(&uri, true, &spec.timeouts).await {
                    tracing::warn!(server = %server, %uri, "could not subscribe again: {}", failure_words(&failure));
                }
            }
        });
    }
}

/// A forwarded request's failure as the client's error: the server's own error keeps its code
/// and is attributed; anything else says what happened to the request.
fn forward_error(server: &str, method: &str, failure: CallFailure) -> McpError {
    match failure {
        CallFailure::Protocol(mut error) => {
            error.message = format!("server {server:?}: {}", error.message).into();
            error
        }
        failure => McpError::internal_error(
            format!(
                "server {server:?}: {method} failed: {}",
                failure_words(&failure)
            ),
            None,
        ),
    }
}

/// Words for a failure that is not the server's own error.
fn failure_words(failure: &CallFailure) -> String {
    match failure {
        CallFailure::TimedOut(after) => format!(
            "no answer within {} s; the server may still be working on it",
            after.as_secs().max(1)
        ),
        CallFailure::Lost(fault) => format!("the connection was lost ({fault})"),
        CallFailure::NotSent(fault) => format!("not sent, the server is reconnecting ({fault})"),
        CallFailure::HttpStatus(status) => format!("the server answered HTTP {status}"),
        CallFailure::Protocol(error) => error.message.to_string(),
        CallFailure::TooLarge { limit, .. } => format!(
            "the answer is larger than max_message ({})",
            crate::transport::limit::describe_size(*limit)
        ),
        CallFailure::Cancelled => "cancelled by the client".into(),
        CallFailure::InputRequired(_) => "the server needs input from the user first".into(),
    }
}

/// A server's request for input, for a forwarded `prompts/get` or `resources/read`: passed on
/// to a 2026-07-28 client; an older one that could answer was asked already
/// ([`Gateway::forward_answering`]), so this one gets an error naming what it lacks.
fn input_required(
    server: &str,
    input: rmcp::model::InputRequiredResult,
    context: &RequestContext<RoleServer>,
) -> Result<rmcp::model::InputRequiredResult, McpError> {
    if modern_client(context) {
        return Ok(input);
    }
    Err(client::unanswerable(
        server,
        &client::Client::of(context),
        &input,
    ))
}

/// A forwarded result's `_meta`, without what describes the upstream (rmcp adds Tether's own).
fn own_meta(meta: Option<MetaObject>) -> Option<MetaObject> {
    let mut meta = meta?;
    meta.0.remove("io.modelcontextprotocol/serverInfo");
    (!meta.0.is_empty()).then_some(meta)
}

/// A call resumed by a later request than the one that started it: the result's bytes go to
/// this request's slot, or, where this request has none, back into the result.
fn raw_to_this_request(
    mut outcome: asking::CallOutcome,
    started: Option<Arc<RawResult>>,
    extensions: &rmcp::model::Extensions,
) -> asking::CallOutcome {
    let here = http::results::slot_in(extensions);
    let Some(started) = started.filter(|slot| here.is_none_or(|here| !Arc::ptr_eq(slot, here)))
    else {
        return outcome;
    };
    let Some(bytes) = started.take() else {
        return outcome;
    };
    match (here, &mut outcome) {
        (Some(here), _) => here.fill(bytes),
        (None, Ok(CallToolResponse::Complete(result))) if is_placeholder(result) => {
            *result = raw::typed(&bytes).unwrap_or_else(|| {
                rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(
                    "The tool answered with a result Tether could not read.",
                )])
            });
        }
        (None, _) => {}
    }
    outcome
}

fn unexpected(server: &str, method: &str) -> McpError {
    McpError::internal_error(
        format!("server {server:?} gave an answer of the wrong kind to {method}"),
        None,
    )
}

fn bad_cursor(error: String) -> McpError {
    McpError::invalid_params(error, None)
}

/// The MCP view of a routed tool.
/// A call's outcome as its client gets it: a result (the server's own, or Tether's words for
/// the model), the server's request for input passed on to a client that can answer it, or the
/// server's JSON-RPC error as it sent it.
fn call_answer(
    advertised: &str,
    outcome: asking::CallOutcome,
    modern: bool,
) -> Result<CallToolResponse, McpError> {
    let response = match outcome {
        Ok(CallToolResponse::InputRequired(input)) if modern => {
            return Ok(CallToolResponse::InputRequired(input));
        }
        Ok(response) => response,
        Err(CallError::UnknownTool(name)) => {
            return Err(McpError::invalid_params(
                format!("unknown tool {name:?}: it is not in tools/list"),
                None,
            ));
        }
        // The server refused the request: its error, code and data as it sent them.
        Err(CallError::Rejected { server, mut error }) => {
            error.message = format!("server {server:?}: {}", error.message).into();
            return Err(error);
        }
        Err(interrupted @ CallError::Interrupted(_)) => {
            return Err(McpError::internal_error(
                format!("{interrupted}; it may or may not have run"),
                None,
            ));
        }
    };
    let mut result = crate::calls::complete(advertised, response);
    // Upstreams of the older generation send no `resultType`; 2026-07-28 clients require it.
    // rmcp strips "complete" again for older clients.
    result.result_type.get_or_insert(ResultType::COMPLETE);
    result.meta = own_meta(result.meta);
    Ok(result.into())
}

/// The MCP view of a routed tool: as its server listed it (title, annotations, output schema,
/// icons, `_meta`), under its advertised name.
fn tool_for_agents(route: &Route) -> Tool {
    route
        .for_agents
        .get_or_init(|| make_tool_for_agents(route))
        .clone()
}

fn make_tool_for_agents(route: &Route) -> Tool {
    let schema: JsonObject = serde_json::from_str(&route.tool.input_schema).unwrap_or_default();
    let basic = || {
        Tool::new_with_raw(
            route.tool.advertised.clone(),
            route.tool.description.clone().map(Into::into),
            schema.clone(),
        )
    };
    let mut tool = match serde_json::from_str::<JsonObject>(&route.tool.extra) {
        Ok(mut all) => {
            all.insert("name".into(), route.tool.advertised.clone().into());
            if let Some(description) = &route.tool.description {
                all.insert("description".into(), description.clone().into());
            }
            all.insert("inputSchema".into(), schema.clone().into());
            serde_json::from_value(serde_json::Value::Object(all)).unwrap_or_else(|_| basic())
        }
        Err(_) => basic(),
    };
    if route.tool.read_only
        && tool.annotations.as_ref().and_then(|a| a.read_only_hint) != Some(true)
    {
        let annotations = tool.annotations.take().unwrap_or_default();
        tool.annotations = Some(annotations.read_only(true));
    }
    tool
}

/// Methods that wait on upstreams box their futures: rmcp spawns every request as a task whose
/// future is as large as the largest method's, and moves it a few times (measured: a
/// forwarded call cost 95 000 more instructions, mostly `memcpy`, before the boxing).
impl ServerHandler for Gateway {
    #[allow(deprecated)] // logging: 2026-07-28 deprecates it, older clients still use it
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_completions()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_resources_subscribe()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("tether", env!("CARGO_PKG_VERSION")))
    }

    /// With the servers' instructions, which most agents read once, at the start: servers
    /// still starting are waited for, as a first list waits for them.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.supervisor.startup_settled().await;
        let mut result = self.negotiate_initialize(&request)?;
        result.instructions = self.supervisor.catalog().instructions();
        Ok(result)
    }

    /// A 2026-07-28 client's `server/discover`, with the servers' instructions as above.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        self.supervisor.startup_settled().await;
        let mut info = self.get_info();
        info.instructions = self.supervisor.catalog().instructions();
        let versions = self.supported_protocol_versions().into_owned();
        Ok(DiscoverResult::from_server_info(versions, info))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Some(calls) = self.http_calls.as_ref().and_then(Weak::upgrade) {
            calls.register(self.same_session(), &context);
        }
        self.downstream.register(self.session, context.peer);
    }

    /// 2026-07-28 clients hear of changes on `subscriptions/listen`: list changes of every
    /// kind, and updates of the resources a visible server offers.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let view = self.supervisor.catalog().view();
        let mut accepted = requested.clone();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| matches!(view.route_uri(uri), UriRoute::Server(_)))
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        Box::pin(async move {
            let accepted = context.accepted().clone();
            // Wanted first, and released however the stream ends (cancelled, its session
            // dropped, even while the servers are being subscribed).
            let id = self
                .downstream
                .add_stream(context.sink().clone(), accepted.clone());
            let _departure = departure::Departure::stream(id, self);
            for uri in accepted.resource_subscriptions.iter().flatten() {
                if let Ok(server) = self.route_uri(uri, true)
                    && let Err(error) = self
                        .subscribe_upstream(&server, uri, context.request_context())
                        .await
                {
                    tracing::debug!(%uri, "listen: {}", error.message);
                }
            }
            context.cancelled().await;
            Ok(())
        })
        .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.supervisor.startup_settled().await;
        let (_, routes) = self.supervisor.registry().snapshot();
        Ok(ListToolsResult::with_all_items(
            routes.iter().map(|route| tool_for_agents(route)).collect(),
        ))
    }

    /// The definition a tool call is checked against (rmcp validates the `Mcp-Param-*` headers
    /// of a 2026-07-28 call with it, as the server itself would).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.supervisor
            .registry()
            .visible_route(name)
            .map(|route| tool_for_agents(&route))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // An HTTP agent's result that passes as the server's bytes is answered with a stand-in
        // (see `http/results.rs`).
        let posted = http::results::posted(&context.extensions).cloned();
        let response = Box::pin(async move {
            // A tool of a server still starting is waited for (see `supervisor/startup.rs`).
            if !self.supervisor.registry().knows(&request.name) {
                self.supervisor.startup_settled().await;
            }
            // Its protocol version and capabilities are read once, here.
            let mut asker = client::Client::of(&context);
            let modern = asker.is_modern();
            // A 2026-07-28 client's call may end asking it what the server asked.
            let resumed = request
                .request_state
                .as_deref()
                .is_some_and(asking::Parking::issued);
            let asked = (modern && !resumed).then(|| asker.open_questions());
            let asker = Arc::new(asker);
            // Only a client that asked for its call's log messages costs a route lookup.
            let server = (modern && context.meta.log_level().is_some())
                .then(|| self.supervisor.registry().route_for_call(&request.name))
                .flatten()
                .map(|route| route.server.clone());
            let mut call = self.call_context(
                server.as_deref().unwrap_or_default(),
                ("tools/call", request.name.as_ref()),
                &context,
                asker.clone(),
            );
            if modern {
                return self
                    .call_for_modern_client(request, call, asked, &context)
                    .await;
            }
            // A retry after the server asked for input carries the answers through.
            call.input_responses = request.input_responses;
            call.request_state = request.request_state;
            // An older client is asked what a 2026-07-28 server needs, and the call retried
            // with the answers: keep the arguments for that only when it could be asked.
            let retries = client::can_be_asked(&asker);
            let mut arguments = request.arguments;
            // For the words of a request for input: whose it is.
            let server_of = || {
                self.supervisor
                    .registry()
                    .route_for_call(&request.name)
                    .map(|route| route.server.clone())
                    .unwrap_or_default()
            };
            for round in 0..=MAX_INPUT_ROUNDS {
                let kept = retries.then(|| arguments.clone()).flatten();
                let response = self
                    .supervisor
                    .call_tool_in(&request.name, arguments, call.clone())
                    .await;
                match response {
                    Ok(CallToolResponse::InputRequired(input))
                        if retries && round < MAX_INPUT_ROUNDS =>
                    {
                        call.input_responses =
                            Some(client::fulfil(&server_of(), &asker, &input).await?);
                        call.request_state = input.request_state;
                        arguments = kept;
                    }
                    // An older client that declared none of what a server may ask.
                    Ok(CallToolResponse::InputRequired(input)) if !retries => {
                        return Err(client::unanswerable(&server_of(), &asker, &input));
                    }
                    outcome => return call_answer(&request.name, outcome, false),
                }
            }
            unreachable!("the last round returns")
        })
        .await;
        http::results::stand_in(response, posted.as_deref())
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.supervisor.startup_settled().await;
        let view = self.supervisor.catalog().view();
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let (prompts, next) =
            catalog::page(&view.prompts, cursor, LIST_PAGE).map_err(bad_cursor)?;
        let mut result = ListPromptsResult::with_all_items(prompts);
        result.next_cursor = next;
        Ok(result)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        Box::pin(async move {
            if self
                .supervisor
                .catalog()
                .view()
                .prompt(&request.name)
                .is_none()
            {
                self.supervisor.startup_settled().await;
            }
            let view = self.supervisor.catalog().view();
            let Some((server, original)) = view.prompt(&request.name) else {
                return Err(McpError::invalid_params(
                    format!(
                        "unknown prompt {:?}: it is not in prompts/list",
                        request.name
                    ),
                    None,
                ));
            };
            let arguments = request.arguments;
            let prompt = request.name;
            let make = |responses, state| {
                let mut upstream = GetPromptRequestParams::new(original);
                upstream.arguments = arguments.clone();
                upstream.input_responses = responses;
                upstream.request_state = state;
                ClientRequest::GetPromptRequest(GetPromptRequest::new(upstream))
            };
            let first = (request.input_responses, request.request_state);
            match self
                .forward_answering(
                    server,
                    ("prompts/get", prompt.as_str()),
                    first,
                    make,
                    &context,
                )
                .await?
            {
                ServerResult::GetPromptResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    result.meta = own_meta(result.meta);
                    Ok(result.into())
                }
                ServerResult::InputRequiredResult(input) => {
                    input_required(server, input, &context).map(Into::into)
                }
                _ => Err(unexpected(server, "prompts/get")),
            }
        })
        .await
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.supervisor.startup_settled().await;
        let view = self.supervisor.catalog().view();
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let (resources, next) =
            catalog::page(&view.resources, cursor, LIST_PAGE).map_err(bad_cursor)?;
        let mut result = ListResourcesResult::with_all_items(resources);
        result.next_cursor = next;
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.supervisor.startup_settled().await;
        let view = self.supervisor.catalog().view();
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let (templates, next) =
            catalog::page(&view.templates, cursor, LIST_PAGE).map_err(bad_cursor)?;
        let mut result = ListResourceTemplatesResult::with_all_items(templates);
        result.next_cursor = next;
        Ok(result)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        Box::pin(async move {
            let modern = modern_client(&context);
            if self.route_uri(&request.uri, modern).is_err() {
                self.supervisor.startup_settled().await;
            }
            let server = self.route_uri(&request.uri, modern)?;
            let uri = request.uri;
            let make = |responses, state| {
                let mut upstream = ReadResourceRequestParams::new(uri.clone());
                upstream.input_responses = responses;
                upstream.request_state = state;
                ClientRequest::ReadResourceRequest(ReadResourceRequest::new(upstream))
            };
            let first = (request.input_responses, request.request_state);
            match self
                .forward_answering(
                    &server,
                    ("resources/read", uri.as_str()),
                    first,
                    make,
                    &context,
                )
                .await?
            {
                ServerResult::ReadResourceResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    result.meta = own_meta(result.meta);
                    Ok(result.into())
                }
                ServerResult::InputRequiredResult(input) => {
                    input_required(&server, input, &context).map(Into::into)
                }
                _ => Err(unexpected(&server, "resources/read")),
            }
        })
        .await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        Box::pin(async move {
            let view = self.supervisor.catalog().view();
            let mut upstream = request.clone();
            upstream.meta = None;
            let server = match &request.r#ref {
                Reference::Prompt(prompt) => {
                    let Some((server, original)) = view.prompt(&prompt.name) else {
                        return Err(McpError::invalid_params(
                            format!(
                                "unknown prompt {:?}: it is not in prompts/list",
                                prompt.name
                            ),
                            None,
                        ));
                    };
                    upstream.r#ref = Reference::for_prompt(original);
                    server.to_string()
                }
                Reference::Resource(resource) => match view.template_owner(&resource.uri) {
                    Some(server) => server.to_string(),
                    None => self.route_uri(&resource.uri, modern_client(&context))?,
                },
                #[allow(unreachable_patterns)] // a reference kind of a later revision
                _ => {
                    return Err(McpError::invalid_params(
                        "Tether routes completions of prompts and resources only",
                        None,
                    ));
                }
            };
            let target = match &request.r#ref {
                Reference::Prompt(prompt) => prompt.name.clone(),
                Reference::Resource(resource) => resource.uri.clone(),
                #[allow(unreachable_patterns)]
                _ => String::new(),
            };
            let request = ClientRequest::CompleteRequest(CompleteRequest::new(upstream));
            let asker = Arc::new(client::Client::of(&context));
            let what = ("completion/complete", target.as_str());
            let call = self.call_context(&server, what, &context, asker);
            match self
                .forward(&server, "completion/complete", request, &call)
                .await?
            {
                ServerResult::CompleteResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    result.meta = own_meta(result.meta);
                    Ok(result)
                }
                _ => Err(unexpected(&server, "completion/complete")),
            }
        })
        .await
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(async move {
            let server = self.route_uri(&request.uri, false)?;
            // Wanted first: a client leaving meanwhile must not unsubscribe the server from it.
            if !self.downstream.subscribe(self.session, &request.uri) {
                return Err(McpError::invalid_request(
                    "resources/subscribe needs an initialized session",
                    None,
                ));
            }
            let subscribed = self
                .subscribe_upstream(&server, &request.uri, &context)
                .await;
            if subscribed.is_err() {
                let unwanted = self.downstream.unsubscribe(self.session, &request.uri);
                self.release(unwanted).await;
            }
            subscribed
        })
        .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(async move {
            let _ = context;
            // What nobody else wants: the servers may stop sending its updates.
            let unwanted = self.downstream.unsubscribe(self.session, &request.uri);
            self.release(unwanted).await;
            Ok(())
        })
        .await
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if self.downstream.set_log_level(self.session, request.level) {
            // As a server's own client's would, the level reaches the servers before the answer.
            self.tell_log_levels(None).await;
            Ok(())
        } else {
            Err(McpError::invalid_request(
                "logging/setLevel needs an initialized session",
                None,
            ))
        }
    }

    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, McpError> {
        // rmcp hands over a request of a method it knows whose params it could not read, and
        // one of a method 2026-07-28 removed from a client of that generation: that one is not
        // served (SEP-2575: method not found).
        let removed = matches!(
            request.method.as_str(),
            "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe"
        ) && modern_client(&context);
        if let Some(why) =
            unreadable_params(&request.method, request.params.as_ref()).filter(|_| !removed)
        {
            let method = &request.method;
            return Err(McpError::invalid_params(
                format!("invalid params for {method}: {why}"),
                None,
            ));
        }
        Err(McpError::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("Tether does not serve {:?}", request.method),
            None,
        ))
    }
}

/// Why `params` are not what `method` takes, for the methods the gateway serves; `None` for
/// another method (or params that read, which rmcp would not have handed over).
#[allow(deprecated)] // logging: 2026-07-28 deprecates it, older clients still use it
fn unreadable_params(method: &str, params: Option<&serde_json::Value>) -> Option<String> {
    fn read<T: serde::de::DeserializeOwned>(params: Option<&serde_json::Value>) -> Option<String> {
        let params = params.cloned().unwrap_or(serde_json::Value::Null);
        let error = serde_json::from_value::<T>(params).err()?;
        Some(error.to_string())
    }
    match method {
        "tools/call" => read::<CallToolRequestParams>(params),
        "prompts/get" => read::<GetPromptRequestParams>(params),
        "resources/read" => read::<ReadResourceRequestParams>(params),
        "resources/subscribe" => read::<SubscribeRequestParams>(params),
        "resources/unsubscribe" => read::<UnsubscribeRequestParams>(params),
        "completion/complete" => read::<CompleteRequestParams>(params),
        "logging/setLevel" => read::<SetLevelRequestParams>(params),
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            read::<Option<PaginatedRequestParams>>(params)
        }
        _ => None,
    }
}
