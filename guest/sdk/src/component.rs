//! The thin wit-bindgen edge: converts between the WIT types and [`crate::model`], and holds the
//! single policy instance of a component. No decisions are made here.
//!
//! A policy implements [`PolicyLogic`] for its own type and calls
//! [`export_policy_logic!`](crate::export_policy_logic).

use std::cell::RefCell;

use crate::model;

/// Bindings for `wit/0.2/policy.wit` (contract 0.2.2, the world that hears about
/// authorizations), shared with wrapper components.
#[allow(clippy::all, missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/0.2",
        world: "authorizing-policy-component",
        pub_export_macro: true,
        export_macro_name: "export_policy",
        default_bindings_module: "tether_policy_sdk::component::bindings",
    });
}

use bindings::tether::policy::log as wit_log;
use bindings::tether::policy::types as wit;

/// What a component's policy must do; the default policy (`tether-policy`) implements it.
pub trait PolicyLogic {
    fn info() -> model::PolicyInfo
    where
        Self: Sized;
    fn create(settings_json: &str) -> Result<Self, String>
    where
        Self: Sized;
    fn restore(snapshot: &[u8]) -> Result<Self, String>
    where
        Self: Sized;
    fn set_settings(&mut self, settings_json: &str) -> Result<(), String>;
    fn handle(&mut self, event: model::Event) -> Vec<model::Action>;
    fn admit(&mut self, request: model::CallRequest) -> model::Admission;
    /// Every server's status at host time `now`.
    fn status(&self, now: model::Millis) -> Vec<model::ServerStatus>;
    fn snapshot(&self) -> Vec<u8>;
    /// Adopts another implementation's state on a fresh instance (contract 0.2 `take-over`).
    fn take_over(&mut self, handover: model::Handover) -> Result<Vec<model::Action>, String> {
        let _ = handover;
        Err("this policy cannot take over another policy's state".into())
    }
    fn take_logs(&mut self) -> Vec<(model::LogLevel, String)>;
    /// The operator's naming of a server (contract 0.2.1).
    fn set_naming(&mut self, naming: model::Naming);
    /// The names agents see for a server's prompts (contract 0.2.1); changes no state.
    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<model::NamedPrompt>;
    /// A server needs an authorization only a person can give (contract 0.2.2); a policy that
    /// does not care treats the `auth-required` fault that follows like any other.
    fn authorization_required(&mut self, server: &str, what_to_do: &str) {
        let _ = (server, what_to_do);
    }
}

thread_local! {
    // A component instance is single-threaded; this is its one policy.
    static INSTANCE: RefCell<Option<Box<dyn PolicyLogic>>> = const { RefCell::new(None) };
}

const NOT_INITIALIZED: &str = "policy not initialized: the host must call init first";

fn with_instance<R>(default: R, f: impl FnOnce(&mut dyn PolicyLogic) -> R) -> R {
    let result = INSTANCE.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_deref_mut() {
            Some(policy) => {
                let result = f(policy);
                flush_logs(policy);
                Some(result)
            }
            None => None,
        }
    });
    result.unwrap_or_else(|| {
        wit_log::log(wit_log::Level::Error, NOT_INITIALIZED);
        default
    })
}

fn flush_logs(policy: &mut dyn PolicyLogic) {
    for (level, message) in policy.take_logs() {
        let level = match level {
            model::LogLevel::Trace => wit_log::Level::Trace,
            model::LogLevel::Debug => wit_log::Level::Debug,
            model::LogLevel::Info => wit_log::Level::Info,
            model::LogLevel::Warn => wit_log::Level::Warn,
            model::LogLevel::Error => wit_log::Level::Error,
        };
        wit_log::log(level, &message);
    }
}

fn install(policy: Box<dyn PolicyLogic>) {
    INSTANCE.with(|slot| *slot.borrow_mut() = Some(policy));
}

// The functions below are the bodies of the exported WIT functions, generic over the logic.

pub fn guest_info<P: PolicyLogic>() -> wit::PolicyInfo {
    let info = P::info();
    wit::PolicyInfo {
        name: info.name,
        version: info.version,
    }
}

pub fn guest_init<P: PolicyLogic + 'static>(settings: String) -> Result<(), String> {
    install(Box::new(P::create(&settings)?));
    Ok(())
}

pub fn guest_restore<P: PolicyLogic + 'static>(snapshot: Vec<u8>) -> Result<(), String> {
    install(Box::new(P::restore(&snapshot)?));
    Ok(())
}

pub fn guest_set_settings(settings: String) -> Result<(), String> {
    with_instance(Err(NOT_INITIALIZED.to_string()), |p| {
        p.set_settings(&settings)
    })
}

pub fn guest_handle(event: wit::Event) -> Vec<wit::Action> {
    let event = event_from_wit(event);
    with_instance(Vec::new(), |p| {
        p.handle(event).into_iter().map(action_to_wit).collect()
    })
}

pub fn guest_admit(request: wit::CallRequest) -> wit::Admission {
    let request = model::CallRequest {
        now: request.now,
        call_id: request.call_id,
        server: request.server,
        tool: request.tool,
    };
    with_instance(wit::Admission::Reject(NOT_INITIALIZED.to_string()), |p| {
        admission_to_wit(p.admit(request))
    })
}

pub fn guest_status(now: u64) -> Vec<wit::ServerStatus> {
    with_instance(Vec::new(), |p| {
        p.status(now).into_iter().map(status_to_wit).collect()
    })
}

pub fn guest_take_over(handover: wit::Handover) -> Result<Vec<wit::Action>, String> {
    let handover = handover_from_wit(handover);
    with_instance(Err(NOT_INITIALIZED.to_string()), |p| {
        p.take_over(handover)
            .map(|actions| actions.into_iter().map(action_to_wit).collect())
    })
}

pub fn guest_snapshot() -> Vec<u8> {
    with_instance(Vec::new(), |p| p.snapshot())
}

pub fn guest_set_naming(naming: wit::Naming) {
    let naming = model::Naming {
        server: naming.server,
        prefix: naming.prefix,
    };
    with_instance((), |p| p.set_naming(naming))
}

pub fn guest_authorization_required(server: String, what_to_do: String) {
    with_instance((), |p| p.authorization_required(&server, &what_to_do))
}

pub fn guest_name_prompts(server: String, originals: Vec<String>) -> Vec<wit::NamedPrompt> {
    with_instance(Vec::new(), |p| {
        p.name_prompts(&server, &originals)
            .into_iter()
            .map(|n| wit::NamedPrompt {
                advertised: n.advertised,
                original: n.original,
            })
            .collect()
    })
}

/// Exports `$logic` (a [`PolicyLogic`]) as the component's `tether:policy/policy` implementation.
#[macro_export]
macro_rules! export_policy_logic {
    ($logic:ty) => {
        struct TetherPolicyExport;

        impl $crate::component::bindings::exports::tether::policy::policy::Guest for TetherPolicyExport {
            fn info() -> $crate::component::bindings::tether::policy::types::PolicyInfo {
                $crate::component::guest_info::<$logic>()
            }
            fn init(settings: String) -> Result<(), String> {
                $crate::component::guest_init::<$logic>(settings)
            }
            fn set_settings(settings: String) -> Result<(), String> {
                $crate::component::guest_set_settings(settings)
            }
            fn handle(
                event: $crate::component::bindings::tether::policy::types::Event,
            ) -> Vec<$crate::component::bindings::tether::policy::types::Action> {
                $crate::component::guest_handle(event)
            }
            fn admit(
                request: $crate::component::bindings::tether::policy::types::CallRequest,
            ) -> $crate::component::bindings::tether::policy::types::Admission {
                $crate::component::guest_admit(request)
            }
            fn status(
                now: u64,
            ) -> Vec<$crate::component::bindings::tether::policy::types::ServerStatus> {
                $crate::component::guest_status(now)
            }
            fn take_over(
                handover: $crate::component::bindings::tether::policy::types::Handover,
            ) -> Result<Vec<$crate::component::bindings::tether::policy::types::Action>, String> {
                $crate::component::guest_take_over(handover)
            }
            fn snapshot() -> Vec<u8> {
                $crate::component::guest_snapshot()
            }
            fn restore(snapshot: Vec<u8>) -> Result<(), String> {
                $crate::component::guest_restore::<$logic>(snapshot)
            }
            fn set_naming(naming: $crate::component::bindings::tether::policy::types::Naming) {
                $crate::component::guest_set_naming(naming)
            }
            fn name_prompts(
                server: String,
                originals: Vec<String>,
            ) -> Vec<$crate::component::bindings::tether::policy::types::NamedPrompt> {
                $crate::component::guest_name_prompts(server, originals)
            }
        }

        impl $crate::component::bindings::exports::tether::policy::authorization::Guest
            for TetherPolicyExport
        {
            fn authorization_required(server: String, what_to_do: String) {
                $crate::component::guest_authorization_required(server, what_to_do)
            }
        }

        $crate::component::bindings::export_policy!(
            TetherPolicyExport with_types_in $crate::component::bindings
        );
    };
}

fn fault_from_wit(fault: wit::Fault) -> model::Fault {
    match fault {
        wit::Fault::SpawnFailed(why) => model::Fault::SpawnFailed(why),
        wit::Fault::HandshakeFailed(why) => model::Fault::HandshakeFailed(why),
        wit::Fault::HandshakeTimedOut => model::Fault::HandshakeTimedOut,
        wit::Fault::AuthRequired(code) => model::Fault::AuthRequired(code),
        wit::Fault::NotMcpEndpoint(what) => model::Fault::NotMcpEndpoint(what),
        wit::Fault::ProcessExited(code) => model::Fault::ProcessExited(code),
        wit::Fault::TransportClosed(why) => model::Fault::TransportClosed(why),
        wit::Fault::SessionExpired => model::Fault::SessionExpired,
        wit::Fault::KeepaliveFailed(why) => model::Fault::KeepaliveFailed(why),
    }
}

fn server_fault_from_wit(f: wit::ServerFault) -> model::ServerFault {
    model::ServerFault {
        server: f.server,
        fault: fault_from_wit(f.fault),
    }
}

fn tools_from_wit(tools: Vec<wit::Tool>) -> Vec<model::Tool> {
    tools
        .into_iter()
        .map(|t| model::Tool {
            name: t.name,
            read_only: t.read_only,
            revision: t.revision,
        })
        .collect()
}

pub fn event_from_wit(event: wit::Event) -> model::Event {
    use wit::EventKind as W;
    let kind = match event.kind {
        W::ServerConfigured(c) => model::EventKind::ServerConfigured(config_from_wit(c)),
        W::ServerRemoved(name) => model::EventKind::ServerRemoved(name),
        W::Connected(s) => model::EventKind::Connected(model::SessionInfo {
            server: s.server,
            server_info: s.server_info,
            tools: tools_from_wit(s.tools),
        }),
        W::ConnectFailed(f) => model::EventKind::ConnectFailed(server_fault_from_wit(f)),
        W::Disconnected(f) => model::EventKind::Disconnected(server_fault_from_wit(f)),
        W::ToolsChanged(t) => model::EventKind::ToolsChanged(model::ServerTools {
            server: t.server,
            tools: tools_from_wit(t.tools),
        }),
        W::KeepaliveOk(server) => model::EventKind::KeepaliveOk(server),
        W::KeepaliveFailed(f) => model::EventKind::KeepaliveFailed(server_fault_from_wit(f)),
        W::CallFinished(r) => model::EventKind::CallFinished(model::CallReport {
            server: r.server,
            call_id: r.call_id,
            outcome: match r.outcome {
                wit::CallOutcome::Ok => model::CallOutcome::Ok,
                wit::CallOutcome::ToolError(text) => model::CallOutcome::ToolError(text),
                wit::CallOutcome::TransportError(f) => {
                    model::CallOutcome::TransportError(fault_from_wit(f))
                }
                wit::CallOutcome::Timeout => model::CallOutcome::Timeout,
                wit::CallOutcome::Cancelled => model::CallOutcome::Cancelled,
            },
            duration_ms: r.duration_ms,
        }),
        W::Timer(t) => model::EventKind::Timer(model::TimerFired {
            server: t.server,
            token: t.token,
        }),
        W::ReconnectRequested(r) => model::EventKind::ReconnectRequested(model::ReconnectRequest {
            server: r.server,
            source: match r.source {
                wit::ReconnectSource::Operator => model::ReconnectSource::Operator,
                wit::ReconnectSource::Agent => model::ReconnectSource::Agent,
                wit::ReconnectSource::Probe => model::ReconnectSource::Probe,
            },
        }),
        W::Shutdown => model::EventKind::Shutdown,
    };
    model::Event {
        now: event.now,
        kind,
    }
}

fn state_to_wit(state: model::ServerState) -> wit::ServerState {
    match state {
        model::ServerState::Connecting => wit::ServerState::Connecting,
        model::ServerState::Connected => wit::ServerState::Connected,
        model::ServerState::Healthy => wit::ServerState::Healthy,
        model::ServerState::BackingOff => wit::ServerState::BackingOff,
        model::ServerState::Parked => wit::ServerState::Parked,
        model::ServerState::Stopped => wit::ServerState::Stopped,
    }
}

pub fn action_to_wit(action: model::Action) -> wit::Action {
    match action {
        model::Action::Connect(server) => wit::Action::Connect(server),
        model::Action::Disconnect(server) => wit::Action::Disconnect(server),
        model::Action::WakeAt(w) => wit::Action::WakeAt(wit::Wake {
            server: w.server,
            at: w.at,
            token: w.token,
        }),
        model::Action::PublishTools(p) => wit::Action::PublishTools(wit::Publication {
            server: p.server,
            tools: p
                .tools
                .into_iter()
                .map(|t| wit::PublishedTool {
                    advertised: t.advertised,
                    original: t.original,
                    read_only: t.read_only,
                })
                .collect(),
        }),
        model::Action::WithdrawTools(server) => wit::Action::WithdrawTools(server),
        model::Action::StateChanged(c) => wit::Action::StateChanged(wit::StateChange {
            server: c.server,
            state: state_to_wit(c.state),
            detail: c.detail,
        }),
    }
}

pub fn admission_to_wit(admission: model::Admission) -> wit::Admission {
    match admission {
        model::Admission::Allow => wit::Admission::Allow,
        model::Admission::Probe => wit::Admission::Probe,
        model::Admission::Reject(message) => wit::Admission::Reject(message),
        model::Admission::Reconnect(message) => wit::Admission::Reconnect(message),
        model::Admission::Hold(hold) => wit::Admission::Hold(wit::Hold {
            wait_ms: hold.wait_ms,
            message: hold.message,
        }),
    }
}

pub fn status_to_wit(s: model::ServerStatus) -> wit::ServerStatus {
    wit::ServerStatus {
        server: s.server,
        state: state_to_wit(s.state),
        breaker: match s.breaker {
            model::BreakerState::Closed => wit::BreakerState::Closed,
            model::BreakerState::Open => wit::BreakerState::Open,
            model::BreakerState::HalfOpen => wit::BreakerState::HalfOpen,
        },
        failures: s.failures,
        breaker_failures: s.breaker_failures,
        tool_errors: s.tool_errors,
        last_fault: s.last_fault,
        since: s.since,
        published_tools: s.published_tools,
        next_attempt_at: s.next_attempt_at,
        breaker_until: s.breaker_until,
    }
}

fn config_from_wit(c: wit::ServerConfig) -> model::ServerConfig {
    model::ServerConfig {
        name: c.name,
        transport: match c.transport {
            wit::TransportKind::Stdio => model::TransportKind::Stdio,
            wit::TransportKind::StreamableHttp => model::TransportKind::StreamableHttp,
            wit::TransportKind::Sse => model::TransportKind::Sse,
        },
        include: c.include,
        exclude: c.exclude,
        settings: c.settings,
    }
}

fn state_from_wit(state: wit::ServerState) -> model::ServerState {
    match state {
        wit::ServerState::Connecting => model::ServerState::Connecting,
        wit::ServerState::Connected => model::ServerState::Connected,
        wit::ServerState::Healthy => model::ServerState::Healthy,
        wit::ServerState::BackingOff => model::ServerState::BackingOff,
        wit::ServerState::Parked => model::ServerState::Parked,
        wit::ServerState::Stopped => model::ServerState::Stopped,
    }
}

pub fn handover_from_wit(h: wit::Handover) -> model::Handover {
    model::Handover {
        now: h.now,
        previous: model::PolicyInfo {
            name: h.previous.name,
            version: h.previous.version,
        },
        servers: h
            .servers
            .into_iter()
            .map(|s| model::ServerHandover {
                config: config_from_wit(s.config),
                session: s.session.map(|live| model::LiveSession {
                    server_info: live.server_info,
                    tools: tools_from_wit(live.tools),
                    proven: live.proven,
                }),
                connecting: s.connecting,
                state: state_from_wit(s.state),
                breaker: match s.breaker {
                    wit::BreakerState::Closed => model::BreakerState::Closed,
                    wit::BreakerState::Open => model::BreakerState::Open,
                    wit::BreakerState::HalfOpen => model::BreakerState::HalfOpen,
                },
                breaker_until: s.breaker_until,
                failures: s.failures,
                breaker_failures: s.breaker_failures,
                tool_errors: s.tool_errors,
                last_fault: s.last_fault,
                since: s.since,
                next_attempt_at: s.next_attempt_at,
            })
            .collect(),
    }
}
