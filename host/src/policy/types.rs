//! The host's policy vocabulary: what the host tells a policy and what a policy answers, whatever
//! contract version the policy component speaks. Each contract version has its own binding
//! module (`bindings/v0_1.rs`, `bindings/v0_2.rs`) that converts at the edge, so a new contract
//! version changes that module, not the transports, the config or the call path.
//!
//! The vocabulary is the union of the versions: what an older version lacks is dropped at its
//! edge (a `cancelled` call report never reaches a 0.1 policy), what it cannot say is never
//! answered (a 0.1 policy never holds a call).

use serde::{Deserialize, Serialize};

/// Host monotonic time in milliseconds (arbitrary origin, never goes backwards).
pub type Millis = u64;

/// How the host reaches a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// A child process speaking MCP over stdin/stdout.
    Stdio,
    /// MCP Streamable HTTP.
    StreamableHttp,
    /// The legacy HTTP+SSE transport.
    Sse,
}

/// Why a connection attempt, a session or a keepalive failed, as classified by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// The process could not be started (not found, permission denied); the text says why.
    SpawnFailed(String),
    /// The MCP initialize handshake failed; the text says why.
    HandshakeFailed(String),
    /// The MCP initialize handshake did not finish within the connect timeout.
    HandshakeTimedOut,
    /// The server demanded credentials (HTTP 401/403); the payload is the status code.
    AuthRequired(u16),
    /// The server uses OAuth and Tether holds no token it accepts: someone must log in
    /// (`tether auth login`). The text says why and how; it never carries a secret.
    AuthorizationRequired(String),
    /// The endpoint answered, but not as an MCP server; the text says what it answered.
    NotMcpEndpoint(String),
    /// The child process exited; the payload is its exit code, if it exited normally.
    ProcessExited(Option<i32>),
    /// The transport closed (pipe or connection closed, I/O error); the text says why.
    TransportClosed(String),
    /// The server no longer knows the session (HTTP 404 on a session).
    SessionExpired,
    /// A keepalive got no valid answer in time; the text says why.
    KeepaliveFailed(String),
}

/// Operator-facing wording of a fault (logs, status). Texts come from the host's own
/// classification and never carry credentials.
impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::SpawnFailed(why) => write!(f, "could not start the server process: {why}"),
            Fault::HandshakeFailed(why) => write!(f, "MCP handshake failed: {why}"),
            Fault::HandshakeTimedOut => f.write_str("MCP handshake timed out"),
            Fault::AuthRequired(code) => {
                write!(f, "the server requires authorization (HTTP {code})")
            }
            Fault::AuthorizationRequired(words) => f.write_str(words),
            Fault::NotMcpEndpoint(what) => write!(f, "not an MCP endpoint: {what}"),
            Fault::ProcessExited(Some(code)) => {
                write!(f, "the server process exited with code {code}")
            }
            Fault::ProcessExited(None) => f.write_str("the server process was killed by a signal"),
            Fault::TransportClosed(why) => write!(f, "the connection closed: {why}"),
            Fault::SessionExpired => f.write_str("the server no longer knows the session"),
            Fault::KeepaliveFailed(why) => write!(f, "keepalive failed: {why}"),
        }
    }
}

/// A tool as a server advertised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// The tool's name on its server.
    pub name: String,
    /// Its description, if the server gave one.
    #[serde(default)]
    pub description: Option<String>,
    /// Its input JSON schema, serialized as JSON.
    #[serde(default)]
    pub input_schema: String,
    /// Annotated `readOnlyHint`: safe to retry on a fresh session.
    pub read_only: bool,
    /// The rest of the tool as the server listed it (title, annotations, output schema, icons,
    /// `_meta`), a JSON object, empty when there was nothing else: agents get it as it was.
    /// The host keeps it; no policy is handed it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extra: String,
}

/// A server as configured by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerConfig {
    /// Unique server name (the prefix of its advertised tool names).
    pub name: String,
    /// How it is reached.
    pub transport: TransportKind,
    /// Glob patterns over original tool names; when non-empty only matching tools are published.
    pub include: Vec<String>,
    /// Glob patterns over original tool names; matching tools are never published.
    pub exclude: Vec<String>,
    /// Per-server overrides of the policy settings, as a JSON object (empty string: none).
    pub settings: String,
    /// The operator's prefix for the server's tool and prompt names (`None`: the policy's
    /// default; `""`: the server's own names). Contract 0.2.1 hears it through `set-naming`
    /// before `server-configured`; older policies never do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

impl ServerConfig {
    /// The operator's naming of this server, when there is one to tell the policy.
    pub fn naming(&self) -> Option<Naming> {
        self.prefix.as_ref().map(|prefix| Naming {
            server: self.name.clone(),
            prefix: Some(prefix.clone()),
        })
    }
}

/// How the operator wants one server's tools and prompts named (contract 0.2.1 `naming`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Naming {
    /// The server concerned.
    pub server: String,
    /// Put before each name: `None` for the policy's default, `""` for the server's own names.
    pub prefix: Option<String>,
}

/// A prompt as agents see it (contract 0.2.1 `named-prompt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPrompt {
    /// The name agents see.
    pub advertised: String,
    /// The prompt's name on its server.
    pub original: String,
}

/// A fresh session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The server the session belongs to.
    pub server: String,
    /// The server's self-reported name and version, for display.
    pub server_info: String,
    /// The tools the server advertised (all pages).
    pub tools: Vec<Tool>,
}

/// A fault on a named server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFault {
    /// The server concerned.
    pub server: String,
    /// What went wrong.
    pub fault: Fault,
}

/// A server's complete, refreshed tool list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTools {
    /// The server concerned.
    pub server: String,
    /// Its full tool list after the refresh.
    pub tools: Vec<Tool>,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallOutcome {
    /// The server answered with a result that is not an error.
    Ok,
    /// The server answered with `isError`; the payload is the error text. The server works.
    ToolError(String),
    /// The transport failed before an answer arrived (the outcome may be uncertain).
    TransportError(Fault),
    /// No answer arrived within the call deadline.
    Timeout,
    /// The agent cancelled it in flight (contract 0.2; not reported to 0.1 policies).
    Cancelled,
}

/// The report of one finished tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallReport {
    /// The server that was called.
    pub server: String,
    /// The host's identifier of the call, as passed to `admit`.
    pub call_id: u64,
    /// How it ended.
    pub outcome: CallOutcome,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
}

/// Who asked for a reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReconnectSource {
    /// An operator (admin API, CLI).
    Operator,
    /// The agent (through the gateway).
    Agent,
    /// The host, after a half-open probe or a call found no live session.
    Probe,
}

/// A request to reconnect a server now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconnectRequest {
    /// The server concerned.
    pub server: String,
    /// Who asked.
    pub source: ReconnectSource,
}

/// A deadline the policy asked for has passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerFired {
    /// The server the timer belongs to.
    pub server: String,
    /// The token the policy gave in its `wake-at` action.
    pub token: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A server was added to the configuration (or its configuration changed).
    ServerConfigured(ServerConfig),
    /// A server was removed from the configuration; the policy forgets it.
    ServerRemoved(String),
    /// A connection attempt produced an initialized session.
    Connected(SessionInfo),
    /// A connection attempt failed.
    ConnectFailed(ServerFault),
    /// A live session ended.
    Disconnected(ServerFault),
    /// A live session's tool list changed (after `notifications/tools/list_changed`).
    ToolsChanged(ServerTools),
    /// A keepalive got a valid answer: the session is proven.
    KeepaliveOk(String),
    /// A keepalive failed; a `Disconnected` event follows if the host tears the session down.
    KeepaliveFailed(ServerFault),
    /// A tool call finished.
    CallFinished(CallReport),
    /// A deadline asked for with `wake-at` has passed.
    Timer(TimerFired),
    /// Someone asked to reconnect a server now.
    ReconnectRequested(ReconnectRequest),
    /// The host is shutting down; every server is to be withdrawn.
    Shutdown,
}

impl EventKind {
    /// The server the event is about (none for `shutdown`).
    pub fn server(&self) -> Option<&str> {
        Some(match self {
            EventKind::ServerConfigured(config) => &config.name,
            EventKind::ServerRemoved(server) | EventKind::KeepaliveOk(server) => server,
            EventKind::Connected(session) => &session.server,
            EventKind::ConnectFailed(f)
            | EventKind::Disconnected(f)
            | EventKind::KeepaliveFailed(f) => &f.server,
            EventKind::ToolsChanged(change) => &change.server,
            EventKind::CallFinished(report) => &report.server,
            EventKind::Timer(timer) => &timer.server,
            EventKind::ReconnectRequested(request) => &request.server,
            EventKind::Shutdown => return None,
        })
    }
}

/// An event, stamped with the host's time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (host monotonic milliseconds).
    pub now: Millis,
    /// What happened.
    pub kind: EventKind,
}

/// A tool as agents see it. From a 0.2 policy, the description and schema are the host's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedTool {
    /// The name agents see (unique across all servers, `[A-Za-z0-9_-]{1,64}`).
    pub advertised: String,
    /// The tool's name on its server.
    pub original: String,
    /// Its description, if any.
    pub description: Option<String>,
    /// Its input JSON schema, serialized as JSON.
    pub input_schema: String,
    /// Whether it is annotated read-only (safe to retry on a fresh session).
    pub read_only: bool,
    /// The rest of its definition (see [`Tool::extra`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extra: String,
}

/// The complete set of tools a server may now show to agents (replaces any earlier set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// The server concerned.
    pub server: String,
    /// Its tools, as agents see them.
    pub tools: Vec<PublishedTool>,
}

/// A deadline the policy wants to hear about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    /// The server the timer belongs to.
    pub server: String,
    /// Host time at which to send a `Timer` event.
    pub at: Millis,
    /// Echoed in the `Timer` event; a later `WakeAt` for the same server supersedes earlier ones.
    pub token: u64,
}

/// A server's lifecycle state as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ServerState {
    /// Waiting for the first connection attempt or an attempt in progress.
    Connecting,
    /// A session is up but not yet proven by a keepalive or a successful call.
    Connected,
    /// A session is up and proven.
    Healthy,
    /// Waiting out a backoff before the next attempt.
    BackingOff,
    /// Retry budget exhausted or a permanent fault: tools withdrawn, slow self-probe armed.
    Parked,
    /// Removed from the configuration or shut down; nothing more happens.
    Stopped,
}

/// The state of a server's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// Calls fail fast until the cooldown ends.
    Open,
    /// The cooldown ended; exactly one probe call is allowed.
    HalfOpen,
}

/// A lifecycle change, for operators and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChange {
    /// The server concerned.
    pub server: String,
    /// Its new state.
    pub state: ServerState,
    /// A human-readable reason (names the fault, the attempt, the next retry).
    pub detail: String,
}

/// What the host must do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Start a connection attempt for the server (tear down any existing session first).
    Connect(String),
    /// Tear down the server's session (and child process) without reconnecting.
    Disconnect(String),
    /// Send a `Timer` event at the given time.
    WakeAt(Wake),
    /// Replace the server's visible tools with these.
    PublishTools(Publication),
    /// Hide all of the server's tools (idempotent).
    WithdrawTools(String),
    /// Report a lifecycle change.
    StateChanged(StateChange),
}

impl Action {
    /// The server the action is about.
    pub fn server(&self) -> &str {
        match self {
            Action::Connect(s) | Action::Disconnect(s) | Action::WithdrawTools(s) => s,
            Action::WakeAt(wake) => &wake.server,
            Action::PublishTools(publication) => &publication.server,
            Action::StateChanged(change) => &change.server,
        }
    }
}

/// A request to admit one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRequest {
    /// Host time of the request.
    pub now: Millis,
    /// The host's identifier for this call; echoed in its `CallReport`.
    pub call_id: u64,
    /// The server that would be called.
    pub server: String,
    /// The tool's name on that server.
    pub tool: String,
}

/// "Not sent; wait up to `wait_ms` for a fresh session, then ask again."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The longest wait, in milliseconds, for a session newer than the current one (at most
    /// 60 000; the host waits less when the call's deadline is nearer).
    pub wait_ms: u64,
    /// The answer for the agent when no fresh session comes up in time.
    pub message: String,
}

/// The policy's answer to a call request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admission {
    /// Make the call.
    Allow,
    /// Make the call; it is the single half-open probe of an open breaker.
    Probe,
    /// Do not make the call; answer the agent with this message.
    Reject(String),
    /// Do not make the call; reconnect the server and answer the agent with this message.
    Reconnect(String),
    /// Contract 0.2.
    Hold(Hold),
}

/// A server's status as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// The server.
    pub server: String,
    /// Its lifecycle state.
    pub state: ServerState,
    /// Its breaker.
    pub breaker: BreakerState,
    /// Consecutive failed attempts without a proven session.
    pub failures: u32,
    /// Consecutive transport failures counted by the breaker.
    pub breaker_failures: u32,
    /// Consecutive tool errors (counted apart; they never open the breaker).
    pub tool_errors: u32,
    /// The last fault, described.
    pub last_fault: Option<String>,
    /// Host time at which the current state was entered.
    pub since: Millis,
    /// Number of tools currently published.
    pub published_tools: u32,
    /// When the next attempt or self-probe is due (contract 0.2; `None` from 0.1 policies).
    #[serde(default)]
    pub next_attempt_at: Option<Millis>,
    /// When an open breaker turns half-open (contract 0.2; `None` from 0.1 policies).
    #[serde(default)]
    pub breaker_until: Option<Millis>,
}

/// Identifies a policy implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    /// Implementation name.
    pub name: String,
    /// Implementation version.
    pub version: String,
}

/// Severity of a policy's log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    /// Fine-grained tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected but handled.
    Warn,
    /// Something failed.
    Error,
}

/// A live session as the host knows it, for a handover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSession {
    /// The server's self-reported name and version, for display.
    pub server_info: String,
    /// Its latest tool list.
    pub tools: Vec<Tool>,
    /// Whether the session was proven (a keepalive answered, or the outgoing policy reported the
    /// server healthy).
    pub proven: bool,
}

/// One server's state, handed to a policy of another implementation: what the host knows
/// (configuration, session, attempt in flight) and what the outgoing policy reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerHandover {
    /// The server's configuration.
    pub config: ServerConfig,
    /// Its live session, if it has one (the incoming policy must not connect it again).
    pub session: Option<LiveSession>,
    /// Whether a connection attempt is in flight (its outcome will arrive as an event).
    pub connecting: bool,
    /// Its lifecycle state, as the outgoing policy reported it.
    pub state: ServerState,
    /// The outgoing policy's breaker.
    pub breaker: BreakerState,
    /// Host time at which an open breaker turns half-open, if the outgoing policy said.
    pub breaker_until: Option<Millis>,
    /// Consecutive failed attempts without a proven session.
    pub failures: u32,
    /// Consecutive transport failures counted by the breaker.
    pub breaker_failures: u32,
    /// Consecutive tool errors.
    pub tool_errors: u32,
    /// The last fault, described.
    pub last_fault: Option<String>,
    /// Host time at which the current state was entered.
    pub since: Millis,
    /// When the outgoing policy planned the next attempt, if it said.
    pub next_attempt_at: Option<Millis>,
}

/// What is true when a policy takes over from another implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// Host time of the handover.
    pub now: Millis,
    /// Every configured server.
    pub servers: Vec<ServerHandover>,
    /// The outgoing policy, for messages.
    pub previous: PolicyInfo,
}
