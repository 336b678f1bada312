//! The JSON encoding of contract 0.2's values (`docs/CONFORMANCE.md`), in which scenarios are
//! exported and transcripts written: records as objects with the WIT's kebab-case field names
//! in WIT order, variants as `{"tag", "val"}`, enums as their case names, options as `null` or
//! the value, integers as numbers. Borrowed views of the host's types, for serializing only:
//! other hosts read this encoding, Tether writes it.

use serde::Serialize;

use crate::policy::bindings::v0_2::revision;
use crate::policy::types::{self as host, BreakerState, ServerState, TransportKind};

#[derive(Serialize)]
#[serde(tag = "tag", content = "val", rename_all = "kebab-case")]
pub enum Fault<'a> {
    SpawnFailed(&'a str),
    HandshakeFailed(&'a str),
    HandshakeTimedOut,
    AuthRequired(u16),
    NotMcpEndpoint(&'a str),
    ProcessExited(Option<i32>),
    TransportClosed(&'a str),
    SessionExpired,
    KeepaliveFailed(&'a str),
}

impl<'a> From<&'a host::Fault> for Fault<'a> {
    fn from(fault: &'a host::Fault) -> Self {
        match fault {
            host::Fault::SpawnFailed(s) => Self::SpawnFailed(s),
            host::Fault::HandshakeFailed(s) => Self::HandshakeFailed(s),
            host::Fault::HandshakeTimedOut => Self::HandshakeTimedOut,
            host::Fault::AuthRequired(code) => Self::AuthRequired(*code),
            host::Fault::AuthorizationRequired(_) => Self::AuthRequired(401),
            host::Fault::NotMcpEndpoint(s) => Self::NotMcpEndpoint(s),
            host::Fault::ProcessExited(code) => Self::ProcessExited(*code),
            host::Fault::TransportClosed(s) => Self::TransportClosed(s),
            host::Fault::SessionExpired => Self::SessionExpired,
            host::Fault::KeepaliveFailed(s) => Self::KeepaliveFailed(s),
        }
    }
}

/// A tool as contract 0.2 hands it over: its description and schema as a revision.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Tool<'a> {
    name: &'a str,
    read_only: bool,
    revision: u64,
}

fn tools(tools: &[host::Tool]) -> Vec<Tool<'_>> {
    tools
        .iter()
        .map(|t| Tool {
            name: &t.name,
            read_only: t.read_only,
            revision: revision(t),
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServerConfig<'a> {
    name: &'a str,
    transport: TransportKind,
    include: &'a [String],
    exclude: &'a [String],
    settings: &'a str,
}

impl<'a> From<&'a host::ServerConfig> for ServerConfig<'a> {
    fn from(c: &'a host::ServerConfig) -> Self {
        Self {
            name: &c.name,
            transport: c.transport,
            include: &c.include,
            exclude: &c.exclude,
            settings: &c.settings,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SessionInfo<'a> {
    server: &'a str,
    server_info: &'a str,
    tools: Vec<Tool<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServerFault<'a> {
    server: &'a str,
    fault: Fault<'a>,
}

impl<'a> From<&'a host::ServerFault> for ServerFault<'a> {
    fn from(f: &'a host::ServerFault) -> Self {
        Self {
            server: &f.server,
            fault: (&f.fault).into(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServerTools<'a> {
    server: &'a str,
    tools: Vec<Tool<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "tag", content = "val", rename_all = "kebab-case")]
pub enum CallOutcome<'a> {
    Ok,
    ToolError(&'a str),
    TransportError(Fault<'a>),
    Timeout,
    Cancelled,
}

impl<'a> From<&'a host::CallOutcome> for CallOutcome<'a> {
    fn from(outcome: &'a host::CallOutcome) -> Self {
        match outcome {
            host::CallOutcome::Ok => Self::Ok,
            host::CallOutcome::ToolError(s) => Self::ToolError(s),
            host::CallOutcome::TransportError(f) => Self::TransportError(f.into()),
            host::CallOutcome::Timeout => Self::Timeout,
            host::CallOutcome::Cancelled => Self::Cancelled,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CallReport<'a> {
    server: &'a str,
    call_id: u64,
    outcome: CallOutcome<'a>,
    duration_ms: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReconnectSource {
    Operator,
    Agent,
    Probe,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ReconnectRequest<'a> {
    server: &'a str,
    source: ReconnectSource,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TimerFired<'a> {
    server: &'a str,
    token: u64,
}

#[derive(Serialize)]
#[serde(tag = "tag", content = "val", rename_all = "kebab-case")]
pub enum EventKind<'a> {
    ServerConfigured(ServerConfig<'a>),
    ServerRemoved(&'a str),
    Connected(SessionInfo<'a>),
    ConnectFailed(ServerFault<'a>),
    Disconnected(ServerFault<'a>),
    ToolsChanged(ServerTools<'a>),
    KeepaliveOk(&'a str),
    KeepaliveFailed(ServerFault<'a>),
    CallFinished(CallReport<'a>),
    Timer(TimerFired<'a>),
    ReconnectRequested(ReconnectRequest<'a>),
    Shutdown,
}

impl<'a> From<&'a host::EventKind> for EventKind<'a> {
    fn from(kind: &'a host::EventKind) -> Self {
        use host::EventKind as K;
        match kind {
            K::ServerConfigured(c) => Self::ServerConfigured(c.into()),
            K::ServerRemoved(s) => Self::ServerRemoved(s),
            K::Connected(s) => Self::Connected(SessionInfo {
                server: &s.server,
                server_info: &s.server_info,
                tools: tools(&s.tools),
            }),
            K::ConnectFailed(f) => Self::ConnectFailed(f.into()),
            K::Disconnected(f) => Self::Disconnected(f.into()),
            K::ToolsChanged(t) => Self::ToolsChanged(ServerTools {
                server: &t.server,
                tools: tools(&t.tools),
            }),
            K::KeepaliveOk(s) => Self::KeepaliveOk(s),
            K::KeepaliveFailed(f) => Self::KeepaliveFailed(f.into()),
            K::CallFinished(r) => Self::CallFinished(CallReport {
                server: &r.server,
                call_id: r.call_id,
                outcome: (&r.outcome).into(),
                duration_ms: r.duration_ms,
            }),
            K::Timer(t) => Self::Timer(TimerFired {
                server: &t.server,
                token: t.token,
            }),
            K::ReconnectRequested(r) => Self::ReconnectRequested(ReconnectRequest {
                server: &r.server,
                source: match r.source {
                    host::ReconnectSource::Operator => ReconnectSource::Operator,
                    host::ReconnectSource::Agent => ReconnectSource::Agent,
                    host::ReconnectSource::Probe => ReconnectSource::Probe,
                },
            }),
            K::Shutdown => Self::Shutdown,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Event<'a> {
    now: u64,
    kind: EventKind<'a>,
}

impl<'a> From<&'a host::Event> for Event<'a> {
    fn from(event: &'a host::Event) -> Self {
        Self {
            now: event.now,
            kind: (&event.kind).into(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PublishedTool<'a> {
    advertised: &'a str,
    original: &'a str,
    read_only: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Publication<'a> {
    server: &'a str,
    tools: Vec<PublishedTool<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Wake<'a> {
    server: &'a str,
    at: u64,
    token: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct StateChange<'a> {
    server: &'a str,
    state: ServerState,
    detail: &'a str,
}

#[derive(Serialize)]
#[serde(tag = "tag", content = "val", rename_all = "kebab-case")]
pub enum Action<'a> {
    Connect(&'a str),
    Disconnect(&'a str),
    WakeAt(Wake<'a>),
    PublishTools(Publication<'a>),
    WithdrawTools(&'a str),
    StateChanged(StateChange<'a>),
}

impl<'a> From<&'a host::Action> for Action<'a> {
    fn from(action: &'a host::Action) -> Self {
        match action {
            host::Action::Connect(s) => Self::Connect(s),
            host::Action::Disconnect(s) => Self::Disconnect(s),
            host::Action::WakeAt(w) => Self::WakeAt(Wake {
                server: &w.server,
                at: w.at,
                token: w.token,
            }),
            host::Action::PublishTools(p) => Self::PublishTools(Publication {
                server: &p.server,
                tools: p
                    .tools
                    .iter()
                    .map(|t| PublishedTool {
                        advertised: &t.advertised,
                        original: &t.original,
                        read_only: t.read_only,
                    })
                    .collect(),
            }),
            host::Action::WithdrawTools(s) => Self::WithdrawTools(s),
            host::Action::StateChanged(c) => Self::StateChanged(StateChange {
                server: &c.server,
                state: c.state,
                detail: &c.detail,
            }),
        }
    }
}

/// Every action of a list, encoded.
pub fn actions(actions: &[host::Action]) -> Vec<Action<'_>> {
    actions.iter().map(Action::from).collect()
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CallRequest<'a> {
    now: u64,
    call_id: u64,
    server: &'a str,
    tool: &'a str,
}

impl<'a> From<&'a host::CallRequest> for CallRequest<'a> {
    fn from(r: &'a host::CallRequest) -> Self {
        Self {
            now: r.now,
            call_id: r.call_id,
            server: &r.server,
            tool: &r.tool,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Hold<'a> {
    wait_ms: u64,
    message: &'a str,
}

#[derive(Serialize)]
#[serde(tag = "tag", content = "val", rename_all = "kebab-case")]
pub enum Admission<'a> {
    Allow,
    Probe,
    Reject(&'a str),
    Reconnect(&'a str),
    Hold(Hold<'a>),
}

impl<'a> From<&'a host::Admission> for Admission<'a> {
    fn from(admission: &'a host::Admission) -> Self {
        match admission {
            host::Admission::Allow => Self::Allow,
            host::Admission::Probe => Self::Probe,
            host::Admission::Reject(m) => Self::Reject(m),
            host::Admission::Reconnect(m) => Self::Reconnect(m),
            host::Admission::Hold(h) => Self::Hold(Hold {
                wait_ms: h.wait_ms,
                message: &h.message,
            }),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServerStatus<'a> {
    server: &'a str,
    state: ServerState,
    breaker: BreakerState,
    failures: u32,
    breaker_failures: u32,
    tool_errors: u32,
    last_fault: Option<&'a str>,
    since: u64,
    published_tools: u32,
    next_attempt_at: Option<u64>,
    breaker_until: Option<u64>,
}

/// Every status of a list, encoded.
pub fn statuses(all: &[host::ServerStatus]) -> Vec<ServerStatus<'_>> {
    all.iter()
        .map(|s| ServerStatus {
            server: &s.server,
            state: s.state,
            breaker: s.breaker,
            failures: s.failures,
            breaker_failures: s.breaker_failures,
            tool_errors: s.tool_errors,
            last_fault: s.last_fault.as_deref(),
            since: s.since,
            published_tools: s.published_tools,
            next_attempt_at: s.next_attempt_at,
            breaker_until: s.breaker_until,
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct LiveSession<'a> {
    server_info: &'a str,
    tools: Vec<Tool<'a>>,
    proven: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServerHandover<'a> {
    config: ServerConfig<'a>,
    session: Option<LiveSession<'a>>,
    connecting: bool,
    state: ServerState,
    breaker: BreakerState,
    breaker_until: Option<u64>,
    failures: u32,
    breaker_failures: u32,
    tool_errors: u32,
    last_fault: Option<&'a str>,
    since: u64,
    next_attempt_at: Option<u64>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PolicyInfo<'a> {
    name: &'a str,
    version: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Handover<'a> {
    now: u64,
    servers: Vec<ServerHandover<'a>>,
    previous: PolicyInfo<'a>,
}

impl<'a> From<&'a host::Handover> for Handover<'a> {
    fn from(h: &'a host::Handover) -> Self {
        Self {
            now: h.now,
            servers: h
                .servers
                .iter()
                .map(|s| ServerHandover {
                    config: (&s.config).into(),
                    session: s.session.as_ref().map(|l| LiveSession {
                        server_info: &l.server_info,
                        tools: tools(&l.tools),
                        proven: l.proven,
                    }),
                    connecting: s.connecting,
                    state: s.state,
                    breaker: s.breaker,
                    breaker_until: s.breaker_until,
                    failures: s.failures,
                    breaker_failures: s.breaker_failures,
                    tool_errors: s.tool_errors,
                    last_fault: s.last_fault.as_deref(),
                    since: s.since,
                    next_attempt_at: s.next_attempt_at,
                })
                .collect(),
            previous: PolicyInfo {
                name: &h.previous.name,
                version: &h.previous.version,
            },
        }
    }
}

/// `serialize_with` adapters, for scenario steps that hold the host's own types.
pub mod with {
    use super::*;
    use serde::Serializer;

    pub fn event_kind<S: Serializer>(kind: &host::EventKind, s: S) -> Result<S::Ok, S::Error> {
        EventKind::from(kind).serialize(s)
    }

    pub fn call_outcome<S: Serializer>(o: &host::CallOutcome, s: S) -> Result<S::Ok, S::Error> {
        CallOutcome::from(o).serialize(s)
    }

    pub fn handover<S: Serializer>(h: &host::Handover, s: S) -> Result<S::Ok, S::Error> {
        Handover::from(h).serialize(s)
    }
}
