//! One binding module per contract version (`tether:policy@0.1.x`, `@0.2.x`), each converting
//! between its generated types and the host's own ([`super::types`]) at the edge.

pub(crate) mod v0_1;
pub(crate) mod v0_2;

/// The WIT package a policy component exports `policy` from.
pub const CONTRACT_PACKAGE: &str = "tether:policy";

/// The contract versions this host loads, newest first. A component built for a later patch or
/// minor version of the same 0.x line is loaded as that line (additive changes only).
pub const CONTRACT_VERSIONS: [&str; 2] = [v0_2::VERSION, v0_1::VERSION];

/// The newest version of each line this host knows all of, in the order of
/// [`CONTRACT_VERSIONS`] (a later minor loads too, as the newest known).
pub const CONTRACT_NEWEST: [&str; 2] = [v0_2::NEWEST, v0_1::VERSION];

/// The contract line a component speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// `tether:policy@0.1` (frozen).
    V0_1,
    /// `tether:policy@0.2`: take-over, hold, cancelled, status with times.
    V0_2,
}

impl Contract {
    /// The line a component of contract `version` belongs to, if this host speaks it.
    pub fn of(version: &semver::Version) -> Option<Contract> {
        [Contract::V0_2, Contract::V0_1]
            .into_iter()
            .find(|line| compatible(&line.base(), version))
    }

    fn base(self) -> semver::Version {
        let text = match self {
            Contract::V0_1 => v0_1::VERSION,
            Contract::V0_2 => v0_2::VERSION,
        };
        semver::Version::parse(text).expect("valid contract version")
    }

    /// Whether policies of this line keep tool descriptions and schemas (0.1) or only names.
    pub fn carries_descriptions(self) -> bool {
        self == Contract::V0_1
    }
}

/// Semver compatibility as the component model applies it: same major (same minor for 0.x),
/// and not older than the host's.
pub fn compatible(host: &semver::Version, found: &semver::Version) -> bool {
    let same_line = if host.major == 0 {
        found.major == 0 && found.minor == host.minor
    } else {
        found.major == host.major
    };
    same_line && found >= host
}

/// Conversions whose types are the same in every contract version, expanded in each version's
/// module (where `wit` and `host` name that version's types and the host's).
macro_rules! unchanged_types {
    () => {
        impl From<host::TransportKind> for wit::TransportKind {
            fn from(kind: host::TransportKind) -> Self {
                match kind {
                    host::TransportKind::Stdio => wit::TransportKind::Stdio,
                    host::TransportKind::StreamableHttp => wit::TransportKind::StreamableHttp,
                    host::TransportKind::Sse => wit::TransportKind::Sse,
                }
            }
        }

        impl From<host::Fault> for wit::Fault {
            fn from(fault: host::Fault) -> Self {
                match fault {
                    host::Fault::SpawnFailed(s) => wit::Fault::SpawnFailed(s),
                    host::Fault::HandshakeFailed(s) => wit::Fault::HandshakeFailed(s),
                    host::Fault::HandshakeTimedOut => wit::Fault::HandshakeTimedOut,
                    host::Fault::AuthRequired(code) => wit::Fault::AuthRequired(code),
                    // Contract 0.2 has no class of its own for it: a 401 it is.
                    host::Fault::AuthorizationRequired(_) => wit::Fault::AuthRequired(401),
                    host::Fault::NotMcpEndpoint(s) => wit::Fault::NotMcpEndpoint(s),
                    host::Fault::ProcessExited(code) => wit::Fault::ProcessExited(code),
                    host::Fault::TransportClosed(s) => wit::Fault::TransportClosed(s),
                    host::Fault::SessionExpired => wit::Fault::SessionExpired,
                    host::Fault::KeepaliveFailed(s) => wit::Fault::KeepaliveFailed(s),
                }
            }
        }

        impl From<host::ServerConfig> for wit::ServerConfig {
            fn from(c: host::ServerConfig) -> Self {
                wit::ServerConfig {
                    name: c.name,
                    transport: c.transport.into(),
                    include: c.include,
                    exclude: c.exclude,
                    settings: c.settings,
                }
            }
        }

        impl From<host::ServerFault> for wit::ServerFault {
            fn from(f: host::ServerFault) -> Self {
                wit::ServerFault {
                    server: f.server,
                    fault: f.fault.into(),
                }
            }
        }

        impl From<host::ReconnectSource> for wit::ReconnectSource {
            fn from(source: host::ReconnectSource) -> Self {
                match source {
                    host::ReconnectSource::Operator => wit::ReconnectSource::Operator,
                    host::ReconnectSource::Agent => wit::ReconnectSource::Agent,
                    host::ReconnectSource::Probe => wit::ReconnectSource::Probe,
                }
            }
        }

        impl From<host::CallRequest> for wit::CallRequest {
            fn from(r: host::CallRequest) -> Self {
                wit::CallRequest {
                    now: r.now,
                    call_id: r.call_id,
                    server: r.server,
                    tool: r.tool,
                }
            }
        }

        impl From<wit::ServerState> for host::ServerState {
            fn from(state: wit::ServerState) -> Self {
                match state {
                    wit::ServerState::Connecting => host::ServerState::Connecting,
                    wit::ServerState::Connected => host::ServerState::Connected,
                    wit::ServerState::Healthy => host::ServerState::Healthy,
                    wit::ServerState::BackingOff => host::ServerState::BackingOff,
                    wit::ServerState::Parked => host::ServerState::Parked,
                    wit::ServerState::Stopped => host::ServerState::Stopped,
                }
            }
        }

        impl From<wit::BreakerState> for host::BreakerState {
            fn from(state: wit::BreakerState) -> Self {
                match state {
                    wit::BreakerState::Closed => host::BreakerState::Closed,
                    wit::BreakerState::Open => host::BreakerState::Open,
                    wit::BreakerState::HalfOpen => host::BreakerState::HalfOpen,
                }
            }
        }

        impl From<wit::PolicyInfo> for host::PolicyInfo {
            fn from(info: wit::PolicyInfo) -> Self {
                host::PolicyInfo {
                    name: info.name,
                    version: info.version,
                }
            }
        }

        impl From<LogLevel> for host::LogLevel {
            fn from(level: LogLevel) -> Self {
                match level {
                    LogLevel::Trace => host::LogLevel::Trace,
                    LogLevel::Debug => host::LogLevel::Debug,
                    LogLevel::Info => host::LogLevel::Info,
                    LogLevel::Warn => host::LogLevel::Warn,
                    LogLevel::Error => host::LogLevel::Error,
                }
            }
        }

        impl tether::policy::types::Host for StoreState {}

        impl tether::policy::log::Host for StoreState {
            fn log(&mut self, level: LogLevel, message: String) {
                self.write_log(level.into(), &message);
            }
        }

        /// The event in this version's terms, or `None` when this version has no word for it.
        /// Borrowed: a tool list is copied only as far as this version carries it.
        pub(crate) fn event(event: &host::Event) -> Option<wit::Event> {
            let kind = match &event.kind {
                host::EventKind::ServerConfigured(c) => {
                    wit::EventKind::ServerConfigured(c.clone().into())
                }
                host::EventKind::ServerRemoved(s) => wit::EventKind::ServerRemoved(s.clone()),
                host::EventKind::Connected(session) => {
                    wit::EventKind::Connected(wit::SessionInfo {
                        server: session.server.clone(),
                        server_info: session.server_info.clone(),
                        tools: tools(&session.tools),
                    })
                }
                host::EventKind::ConnectFailed(f) => {
                    wit::EventKind::ConnectFailed(f.clone().into())
                }
                host::EventKind::Disconnected(f) => wit::EventKind::Disconnected(f.clone().into()),
                host::EventKind::ToolsChanged(change) => {
                    wit::EventKind::ToolsChanged(wit::ServerTools {
                        server: change.server.clone(),
                        tools: tools(&change.tools),
                    })
                }
                host::EventKind::KeepaliveOk(s) => wit::EventKind::KeepaliveOk(s.clone()),
                host::EventKind::KeepaliveFailed(f) => {
                    wit::EventKind::KeepaliveFailed(f.clone().into())
                }
                host::EventKind::CallFinished(report) => {
                    wit::EventKind::CallFinished(wit::CallReport {
                        outcome: call_outcome(report.outcome.clone())?,
                        server: report.server.clone(),
                        call_id: report.call_id,
                        duration_ms: report.duration_ms,
                    })
                }
                host::EventKind::Timer(t) => wit::EventKind::Timer(wit::TimerFired {
                    server: t.server.clone(),
                    token: t.token,
                }),
                host::EventKind::ReconnectRequested(r) => {
                    wit::EventKind::ReconnectRequested(wit::ReconnectRequest {
                        server: r.server.clone(),
                        source: r.source.into(),
                    })
                }
                host::EventKind::Shutdown => wit::EventKind::Shutdown,
            };
            Some(wit::Event {
                now: event.now,
                kind,
            })
        }

        fn tools(tools: &[host::Tool]) -> Vec<wit::Tool> {
            tools.iter().map(tool).collect()
        }

        /// A guest's action in the host's terms; `lookup` finds a tool in a server's latest list.
        pub(crate) fn action<'a>(
            action: wit::Action,
            lookup: &dyn Fn(&str, &str) -> Option<&'a host::Tool>,
        ) -> Result<host::Action, String> {
            Ok(match action {
                wit::Action::Connect(s) => host::Action::Connect(s),
                wit::Action::Disconnect(s) => host::Action::Disconnect(s),
                wit::Action::WakeAt(w) => host::Action::WakeAt(host::Wake {
                    server: w.server,
                    at: w.at,
                    token: w.token,
                }),
                wit::Action::PublishTools(p) => {
                    let mut published = Vec::with_capacity(p.tools.len());
                    for t in p.tools {
                        published.push(published_tool(&p.server, t, lookup)?);
                    }
                    host::Action::PublishTools(host::Publication {
                        server: p.server,
                        tools: published,
                    })
                }
                wit::Action::WithdrawTools(s) => host::Action::WithdrawTools(s),
                wit::Action::StateChanged(c) => host::Action::StateChanged(host::StateChange {
                    server: c.server,
                    state: c.state.into(),
                    detail: c.detail,
                }),
            })
        }
    };
}

use unchanged_types;
