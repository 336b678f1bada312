//! Plain Rust mirrors of the WIT types in `wit/0.2/policy.wit`, so the policy logic can be built and
//! unit-tested natively without any wasm machinery. The component glue converts at the edge.

use serde::{Deserialize, Serialize};

/// Host monotonic time in milliseconds.
pub type Millis = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransportKind {
    Stdio,
    StreamableHttp,
    Sse,
}

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

impl Fault {
    /// Faults that another attempt cannot fix without someone changing something.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Fault::SpawnFailed(_) | Fault::AuthRequired(_) | Fault::NotMcpEndpoint(_)
        )
    }
}

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

/// A tool: its name, and a revision that changes with its description or schema (which the
/// host keeps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub read_only: bool,
    pub revision: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerConfig {
    pub name: String,
    pub transport: TransportKind,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Per-server settings overrides as a JSON object; empty means none.
    pub settings: String,
}

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallOutcome {
    Ok,
    ToolError(String),
    TransportError(Fault),
    Timeout,
    /// The agent cancelled the call: nothing is learned about the server.
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallReport {
    pub server: String,
    pub call_id: u64,
    pub outcome: CallOutcome,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub now: Millis,
    pub kind: EventKind,
}

/// A tool as published. The revision is not part of the contract's `published-tool`: it makes
/// a changed description a changed publication (the host then shows the new text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedTool {
    pub advertised: String,
    pub original: String,
    pub read_only: bool,
    pub revision: u64,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerState {
    Connecting,
    Connected,
    Healthy,
    BackingOff,
    Parked,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Connect(String),
    Disconnect(String),
    WakeAt(Wake),
    PublishTools(Publication),
    WithdrawTools(String),
    StateChanged(StateChange),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRequest {
    pub now: Millis,
    pub call_id: u64,
    pub server: String,
    pub tool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub wait_ms: Millis,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admission {
    Allow,
    Probe,
    Reject(String),
    Reconnect(String),
    /// Not sent yet: ask again once a fresh session is up (or answer the message).
    Hold(Hold),
}

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
    pub next_attempt_at: Option<Millis>,
    pub breaker_until: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSession {
    pub server_info: String,
    pub tools: Vec<Tool>,
    pub proven: bool,
}

/// One server as handed over by the host when this policy takes over from another.
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    pub now: Millis,
    pub servers: Vec<ServerHandover>,
    pub previous: PolicyInfo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The operator's naming of one server (contract 0.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Naming {
    pub server: String,
    /// `None`: the policy's default; `""`: the server's own names.
    pub prefix: Option<String>,
}

/// A prompt's name as agents see it (contract 0.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPrompt {
    pub advertised: String,
    pub original: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
}
