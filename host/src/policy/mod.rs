//! The policy runtime: loads a policy component, runs it sandboxed on its own thread, contains
//! its failures and swaps it at runtime. The rest of the host talks to [`PolicyRuntime`].

pub mod bindings;
pub mod conformance;
mod engine;
mod engine_config;
mod guest_output;
mod instance;
mod ledger;
pub mod record;
mod runtime;
pub mod types;

pub use bindings::Contract;
pub use engine::{EMBEDDED_DEFAULT_POLICY, LoadedPolicy, PolicyEngine, PolicySource};
pub use instance::{
    DEFAULT_FUEL_PER_DATA_BYTE, DEFAULT_MEMORY_PER_DATA_BYTE, Limits, PolicyInstance, tool_data,
};
pub use runtime::{
    DEFAULT_INLINE_FUEL, PolicyNotice, PolicyRuntime, RuntimeOptions, RuntimeStats, ShadowReport,
    SwapPath, SwapReport,
};
pub use types::{
    Action, Admission, BreakerState, CallOutcome, CallReport, CallRequest, Event, EventKind, Fault,
    Handover, Hold, LiveSession, PolicyInfo, Publication, PublishedTool, ReconnectRequest,
    ReconnectSource, ServerConfig, ServerFault, ServerHandover, ServerState, ServerStatus,
    ServerTools, SessionInfo, StateChange, TimerFired, Tool, TransportKind, Wake,
};

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
        "policy {policy} was built for tether:policy@{found}, which this host cannot load: it loads components of {}",
        contract_lines()
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
    #[error("no shadow policy is running: start one with `tether policy shadow FILE`")]
    NoShadow,
}

/// The contract lines this host loads, for messages: "0.2.x (0.2.0 or newer) and 0.1.x (...)".
fn contract_lines() -> String {
    bindings::CONTRACT_VERSIONS
        .iter()
        .map(|version| {
            let v = semver::Version::parse(version).expect("valid contract version");
            format!("{}.{}.x ({version} or newer)", v.major, v.minor)
        })
        .collect::<Vec<_>>()
        .join(" and ")
}
