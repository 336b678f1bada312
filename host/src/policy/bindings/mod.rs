//! The policy contract table: every contract line this host speaks (`tether:policy@0.1.x`,
//! `@0.2.x`), one binding module each, converting between its generated types and the host's
//! own ([`super::types`]) at the edge. This module owns what differs by line: linking, preparing
//! a component, and every call into an instance ([`Exports`]). The rest of the host never
//! matches on a contract version; a new line is one new module and its row in [`LINES`].

use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker};

use super::store::StoreState;
use super::types::{
    Action, Admission, CallRequest, Event, Handover, Millis, NamedPrompt, Naming, PolicyInfo,
    ServerStatus, Tool,
};

pub(crate) mod v0_1;
pub(crate) mod v0_2;

/// The WIT package a policy component exports `policy` from.
pub const CONTRACT_PACKAGE: &str = "tether:policy";

/// One contract line: its first version, the newest this host knows all of, and how to link
/// and prepare its components.
struct Line {
    contract: Contract,
    version: &'static str,
    newest: &'static str,
    add_to_linker: fn(&mut Linker<StoreState>) -> wasmtime::Result<()>,
    prepare: Prepare,
}

/// How a line prepares a component for instantiation.
type Prepare = fn(&Component, InstancePre<StoreState>) -> wasmtime::Result<Box<dyn Prepared>>;

/// The lines this host speaks, newest first.
const LINES: [Line; 2] = [
    Line {
        contract: Contract::V0_2,
        version: v0_2::VERSION,
        newest: v0_2::NEWEST,
        add_to_linker: v0_2::add_to_linker,
        prepare: v0_2::prepare,
    },
    Line {
        contract: Contract::V0_1,
        version: v0_1::VERSION,
        newest: v0_1::VERSION,
        add_to_linker: v0_1::add_to_linker,
        prepare: v0_1::prepare,
    },
];

/// The contract versions this host loads, newest first. A component built for a later patch or
/// minor version of the same 0.x line is loaded as that line (additive changes only).
pub const CONTRACT_VERSIONS: [&str; 2] = [LINES[0].version, LINES[1].version];

/// The newest version of each line this host knows all of, in the order of
/// [`CONTRACT_VERSIONS`] (a later minor loads too, as the newest known).
pub const CONTRACT_NEWEST: [&str; 2] = [LINES[0].newest, LINES[1].newest];

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
        LINES
            .iter()
            .find(|line| {
                let base = semver::Version::parse(line.version).expect("valid contract version");
                compatible(&base, version)
            })
            .map(|line| line.contract)
    }

    fn line(self) -> &'static Line {
        LINES
            .iter()
            .find(|line| line.contract == self)
            .expect("every contract has a line")
    }

    /// Whether policies of this line keep tool descriptions and schemas (0.1) or only names.
    pub fn carries_descriptions(self) -> bool {
        self == Contract::V0_1
    }

    /// A component of this line, ready to instantiate.
    pub(crate) fn prepare(
        self,
        component: &Component,
        instance_pre: InstancePre<StoreState>,
    ) -> wasmtime::Result<Box<dyn Prepared>> {
        (self.line().prepare)(component, instance_pre)
    }
}

/// Links what every line imports (their `log` interfaces have different versioned names).
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    LINES
        .iter()
        .try_for_each(|line| (line.add_to_linker)(linker))
}

/// A tool in a server's latest list, by server and original name.
pub(crate) type Lookup<'a> = dyn Fn(&str, &str) -> Option<&'a Tool> + 'a;

/// What a guest's list of actions became: the host's actions, or why they cannot be taken
/// (invalid output).
pub(crate) type Actions = Result<Vec<Action>, String>;

/// A component of one line, ready to instantiate.
pub(crate) trait Prepared: Send + Sync {
    fn instantiate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Box<dyn Exports>>;
}

/// One instance's exports in the host's terms: every call a policy answers. The outer error is
/// the guest call's failure (a trap, fuel, memory); an inner `Err` is the policy's own answer
/// (a refusal) or output the host cannot take.
pub(crate) trait Exports: Send {
    fn info(&self, store: &mut Store<StoreState>) -> wasmtime::Result<PolicyInfo>;
    fn init(
        &self,
        store: &mut Store<StoreState>,
        settings: &str,
    ) -> wasmtime::Result<Result<(), String>>;
    fn set_settings(
        &self,
        store: &mut Store<StoreState>,
        settings: &str,
    ) -> wasmtime::Result<Result<(), String>>;
    /// `None` when the line has no word for the event: it is not fed.
    fn handle<'a>(
        &self,
        store: &mut Store<StoreState>,
        event: &Event,
        lookup: &Lookup<'a>,
        max_actions: usize,
    ) -> wasmtime::Result<Option<Actions>>;
    fn admit(
        &self,
        store: &mut Store<StoreState>,
        request: &CallRequest,
    ) -> wasmtime::Result<Admission>;
    /// Every server's status at host time `now` (0.1 knows no time here).
    fn status(
        &self,
        store: &mut Store<StoreState>,
        now: Millis,
    ) -> wasmtime::Result<Vec<ServerStatus>>;
    fn snapshot(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Vec<u8>>;
    fn restore(
        &self,
        store: &mut Store<StoreState>,
        snapshot: &[u8],
    ) -> wasmtime::Result<Result<(), String>>;

    /// Whether the line takes another implementation's state (0.2).
    fn can_take_over(&self) -> bool {
        false
    }
    /// The inner `Err` is a refusal; a line without handover refuses.
    fn take_over<'a>(
        &self,
        _store: &mut Store<StoreState>,
        _handover: &Handover,
        _lookup: &Lookup<'a>,
        _max_actions: usize,
    ) -> wasmtime::Result<Result<Actions, String>> {
        Ok(Err("this contract line knows no handover".into()))
    }

    /// Whether the instance names tools and prompts as the operator asks (0.2.1).
    fn takes_naming(&self) -> bool {
        false
    }
    fn set_naming(&self, _store: &mut Store<StoreState>, _naming: &Naming) -> wasmtime::Result<()> {
        Ok(())
    }
    /// `None` from an instance that cannot be asked.
    fn name_prompts(
        &self,
        _store: &mut Store<StoreState>,
        _server: &str,
        _originals: &[String],
    ) -> wasmtime::Result<Option<Vec<NamedPrompt>>> {
        Ok(None)
    }

    /// Whether the instance hears about missing authorizations (0.2.2).
    fn takes_authorization(&self) -> bool {
        false
    }
    fn authorization_required(
        &self,
        _store: &mut Store<StoreState>,
        _server: &str,
        _what_to_do: &str,
    ) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// A guest's actions in the host's terms, refused whole above `max` (`what`: for what they
/// were returned) or when one cannot be taken.
fn convert_actions<A>(
    actions: Vec<A>,
    max: usize,
    what: &str,
    convert: impl FnMut(A) -> Result<Action, String>,
) -> Actions {
    if actions.len() > max {
        return Err(format!(
            "returned {} actions for {what} (limit {max})",
            actions.len()
        ));
    }
    actions.into_iter().map(convert).collect()
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

        impl self::tether::policy::types::Host for StoreState {}

        impl self::tether::policy::log::Host for StoreState {
            fn log(&mut self, level: LogLevel, message: String) {
                self.write_log(level.into(), &message);
            }
        }

        /// The event in this version's terms, or `None` when this version has no word for it.
        /// Borrowed: a tool list is copied only as far as this version carries it.
        fn event(event: &host::Event) -> Option<wit::Event> {
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
        fn action<'a>(
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

/// The calls whose shape is the same in every line, for `impl Exports`; the line's module
/// gives `self.policy()` (its generated `policy` interface), `event`, `action` and `admission`.
macro_rules! same_calls {
    () => {
        fn info(&self, store: &mut Store<StoreState>) -> wasmtime::Result<host::PolicyInfo> {
            self.policy().call_info(store).map(Into::into)
        }

        fn init(
            &self,
            store: &mut Store<StoreState>,
            settings: &str,
        ) -> wasmtime::Result<Result<(), String>> {
            self.policy().call_init(store, settings)
        }

        fn set_settings(
            &self,
            store: &mut Store<StoreState>,
            settings: &str,
        ) -> wasmtime::Result<Result<(), String>> {
            self.policy().call_set_settings(store, settings)
        }

        fn handle<'a>(
            &self,
            store: &mut Store<StoreState>,
            event: &host::Event,
            lookup: &super::Lookup<'a>,
            max_actions: usize,
        ) -> wasmtime::Result<Option<super::Actions>> {
            let Some(event) = self::event(event) else {
                return Ok(None);
            };
            let actions = self.policy().call_handle(store, &event)?;
            Ok(Some(super::convert_actions(
                actions,
                max_actions,
                "one event",
                |a| action(a, lookup),
            )))
        }

        fn admit(
            &self,
            store: &mut Store<StoreState>,
            request: &host::CallRequest,
        ) -> wasmtime::Result<host::Admission> {
            self.policy()
                .call_admit(store, &request.clone().into())
                .map(admission)
        }

        fn snapshot(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Vec<u8>> {
            self.policy().call_snapshot(store)
        }

        fn restore(
            &self,
            store: &mut Store<StoreState>,
            snapshot: &[u8],
        ) -> wasmtime::Result<Result<(), String>> {
            self.policy().call_restore(store, snapshot)
        }
    };
}

use same_calls;
