//! The policy runtime: loads a policy component, runs it sandboxed on its own thread, contains
//! its failures and swaps it at runtime. The rest of the host talks to [`PolicyRuntime`].

pub mod bindings;
pub mod conformance;
mod engine;
mod engine_config;
mod guest_output;
mod instance;
mod runtime;

pub use bindings::{
    Action, Admission, BreakerState, CallOutcome, CallReport, CallRequest, Event, EventKind, Fault,
    PolicyInfo, Publication, PublishedTool, ReconnectRequest, ReconnectSource, ServerConfig,
    ServerFault, ServerState, ServerStatus, ServerTools, SessionInfo, StateChange, TimerFired,
    Tool, TransportKind, Wake,
};
pub use engine::{EMBEDDED_DEFAULT_POLICY, LoadedPolicy, PolicyEngine, PolicySource};
pub use instance::{
    DEFAULT_FUEL_PER_DATA_BYTE, DEFAULT_MEMORY_PER_DATA_BYTE, Limits, PolicyInstance, tool_data,
};
pub use runtime::{DEFAULT_INLINE_FUEL, PolicyNotice, PolicyRuntime, RuntimeOptions, RuntimeStats};

/// What stopped a guest call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFault {
    #[error("ran out of fuel ({0} units per call): an endless loop?")]
    OutOfFuel(u64),
    #[error("exceeded its memory limit of {0} bytes")]
    Memory(usize),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("returned invalid output: {0}")]
    InvalidOutput(String),
}

/// Errors of the policy runtime. Every variant names the policy concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot set up the wasm engine: {0}")]
    Engine(String),
    #[error("cannot read policy {policy}: {reason}")]
    Read { policy: String, reason: String },
    #[error("policy {policy} is not a valid wasm component: {reason}")]
    Invalid { policy: String, reason: String },
    #[error("{policy} is not a Tether policy component: {reason}")]
    NotAPolicy { policy: String, reason: String },
    #[error(
        "policy {policy} was built for tether:policy@{found}, which this host (tether:policy@{}) cannot load: only {}.x components of the same or a newer minor version are compatible",
        bindings::CONTRACT_VERSION,
        contract_line()
    )]
    Incompatible { policy: String, found: String },
    #[error("policy {policy} failed during {during}: {fault}")]
    Fault {
        policy: String,
        during: &'static str,
        fault: PolicyFault,
    },
    #[error("policy {policy} refused {what}: {reason}")]
    Refused {
        policy: String,
        what: &'static str,
        reason: String,
    },
    #[error("the policy runtime has stopped")]
    Stopped,
}

fn contract_line() -> String {
    let v = semver::Version::parse(bindings::CONTRACT_VERSION).expect("valid contract version");
    if v.major == 0 {
        format!("0.{}", v.minor)
    } else {
        v.major.to_string()
    }
}
