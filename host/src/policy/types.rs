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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransportKind {
    Stdio,
    StreamableHttp,
    Sse,
}

/// Why a connection attempt, a session or a keepalive failed, as classified by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    SpawnFailed(String),
    HandshakeFailed(String),
    HandshakeTimedOut,
    AuthRequired(u16),
    NotMcpEndpoint(String),
    ProcessExited(Option<i32>),
    TransportClosed(String),
    SessionExpired,
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
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Its input JSON schema, serialized as JSON.
    #[serde(default)]
    pub input_schema: String,
    /// Annotated `readOnlyHint`: safe to retry on a fresh session.
    pub read_only: bool,
}

/// A server as configured by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerConfig {
    pub name: String,
    pub transport: TransportKind,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Per-server overrides of the policy settings, as a JSON object (empty string: none).
    pub settings: String,
}

/// A fresh session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub server: String,
    pub server_info: String,
    pub tools: Vec<Tool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFault {
    pub server: String,
    pub fault: Fault,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTools {
    pub server: String,
    pub tools: Vec<Tool>,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallOutcome {
    Ok,
    ToolError(String),
    TransportError(Fault),
    Timeout,
    /// The agent cancelled it in flight (contract 0.2; not reported to 0.1 policies).
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallReport {
    pub server: String,
    pub call_id: u64,
    pub outcome: CallOutcome,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReconnectSource {
    Operator,
    Agent,
    Probe,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconnectRequest {
    pub server: String,
    pub source: ReconnectSource,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerFired {
    pub server: String,
    pub token: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    ServerConfigured(ServerConfig),
    ServerRemoved(String),
    Connected(SessionInfo),
    ConnectFailed(ServerFault),
    Disconnected(ServerFault),
    ToolsChanged(ServerTools),
    KeepaliveOk(String),
    KeepaliveFailed(ServerFault),
    CallFinished(CallReport),
    Timer(TimerFired),
    ReconnectRequested(ReconnectRequest),
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
    pub now: Millis,
    pub kind: EventKind,
}

/// A tool as agents see it. From a 0.2 policy, the description and schema are the host's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedTool {
    pub advertised: String,
    pub original: String,
    pub description: Option<String>,
    pub input_schema: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub server: String,
    pub tools: Vec<PublishedTool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    pub server: String,
    pub at: Millis,
    pub token: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServerState {
    Connecting,
    Connected,
    Healthy,
    BackingOff,
    Parked,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChange {
    pub server: String,
    pub state: ServerState,
    pub detail: String,
}

/// What the host must do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Connect(String),
    Disconnect(String),
    WakeAt(Wake),
    PublishTools(Publication),
    WithdrawTools(String),
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRequest {
    pub now: Millis,
    pub call_id: u64,
    pub server: String,
    pub tool: String,
}

/// "Not sent; wait up to `wait_ms` for a fresh session, then ask again."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub wait_ms: u64,
    /// The answer for the agent when no fresh session comes up in time.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admission {
    Allow,
    Probe,
    Reject(String),
    Reconnect(String),
    /// Contract 0.2.
    Hold(Hold),
}

/// A server's status as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub server: String,
    pub state: ServerState,
    pub breaker: BreakerState,
    pub failures: u32,
    pub breaker_failures: u32,
    pub tool_errors: u32,
    pub last_fault: Option<String>,
    pub since: Millis,
    pub published_tools: u32,
    /// When the next attempt or self-probe is due (contract 0.2; `None` from 0.1 policies).
    #[serde(default)]
    pub next_attempt_at: Option<Millis>,
    /// When an open breaker turns half-open (contract 0.2; `None` from 0.1 policies).
    #[serde(default)]
    pub breaker_until: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
}

/// Severity of a policy's log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// A live session as the host knows it, for a handover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSession {
    pub server_info: String,
    pub tools: Vec<Tool>,
    pub proven: bool,
}

/// One server's state, handed to a policy of another implementation: what the host knows
/// (configuration, session, attempt in flight) and what the outgoing policy reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerHandover {
    pub config: ServerConfig,
    pub session: Option<LiveSession>,
    pub connecting: bool,
    pub state: ServerState,
    pub breaker: BreakerState,
    pub breaker_until: Option<Millis>,
    pub failures: u32,
    pub breaker_failures: u32,
    pub tool_errors: u32,
    pub last_fault: Option<String>,
    pub since: Millis,
    pub next_attempt_at: Option<Millis>,
}

/// What is true when a policy takes over from another implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    pub now: Millis,
    pub servers: Vec<ServerHandover>,
    pub previous: PolicyInfo,
}
