//! The policy runtime: loads a policy component, runs it sandboxed on its own thread, contains
//! its failures and swaps it at runtime. The rest of the host talks to its `PolicyRuntime`; embedders name policies
//! ([`PolicySource`]), check them ([`conformance`]) and replay recordings through them ([`replay`]).

mod bindings;
pub mod conformance;
mod engine;
mod engine_config;
mod guest_output;
mod imports;
mod instance;
mod ledger;
mod outputs;
pub mod record;
pub mod replay;
mod runtime;
mod store;
pub mod types;

pub use bindings::Contract;
pub use engine::{LoadedPolicy, PolicyEngine, PolicySource};
insides! { pub use engine::EMBEDDED_DEFAULT_POLICY; }
insides! {
    pub use instance::{
        DEFAULT_FUEL_PER_DATA_BYTE, DEFAULT_MEMORY_PER_DATA_BYTE, Limits, PolicyInstance, tool_data,
    };
}
pub use runtime::{PolicyNotice, ShadowReport, SwapPath, SwapReport};
insides! {
    pub use runtime::{
        DEFAULT_INLINE_FUEL, PolicyRuntime, Reply, RunningPolicy, RuntimeOptions, RuntimeStats,
    };
}
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub use runtime::QueueHold;
pub use types::{
    Action, Admission, BreakerState, CallOutcome, CallReport, CallRequest, Event, EventKind, Fault,
    Handover, Hold, LiveSession, NamedPrompt, Naming, PolicyInfo, Publication, PublishedTool,
    ReconnectRequest, ReconnectSource, ServerConfig, ServerFault, ServerHandover, ServerState,
    ServerStatus, ServerTools, SessionInfo, StateChange, TimerFired, Tool, TransportKind, Wake,
};

/// What stopped a guest call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFault {
    /// It used up its fuel budget (the payload is the budget per call).
    #[error("ran out of fuel ({0} units per call): an endless loop?")]
    OutOfFuel(u64),
    /// It tried to grow its memory beyond the limit (the payload is the limit in bytes).
    #[error("exceeded its memory limit of {0} bytes")]
    Memory(usize),
    /// It trapped (a panic, any other wasm trap) or failed to instantiate; the text says why.
    #[error("trapped: {0}")]
    Trap(String),
    /// Its answer broke the contract; the text says how.
    #[error("returned invalid output: {0}")]
    InvalidOutput(String),
}

/// Errors of the policy runtime. Every variant names the policy concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The wasm engine or linker could not be set up, or the policy thread not started.
    #[error("cannot set up the wasm engine: {0}")]
    Engine(String),
    /// The component file could not be read (or a recording file not created).
    #[error("cannot read policy {policy}: {reason}")]
    Read {
        /// The policy's label (its path, or what it is).
        policy: String,
        /// What went wrong (the I/O error).
        reason: String,
    },
    /// The bytes are not a valid wasm component.
    #[error("policy {policy} is not a valid wasm component: {reason}")]
    Invalid {
        /// The policy's label.
        policy: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The component does not export the policy contract or needs imports the host lacks.
    #[error("{policy} is not a Tether policy component: {reason}")]
    NotAPolicy {
        /// The policy's label.
        policy: String,
        /// What it lacks or exports instead.
        reason: String,
    },
    /// The component speaks a contract version this host cannot load.
    #[error(
        "policy {policy} was built for tether:policy@{found}, which this host cannot load: it loads components of {}",
        contract_lines()
    )]
    Incompatible {
        /// The policy's label.
        policy: String,
        /// The contract version it was built for.
        found: String,
    },
    /// A guest call failed (fuel, memory, trap or invalid output).
    #[error("policy {policy} failed during {during}: {fault}")]
    Fault {
        /// The policy's label.
        policy: String,
        /// The call that failed (`handle`, `admit`, `instantiation`, ...).
        during: &'static str,
        /// What stopped it.
        fault: PolicyFault,
    },
    /// The policy rejected its input (settings, a snapshot, a handover).
    #[error("policy {policy} refused {what}: {reason}")]
    Refused {
        /// The policy's label.
        policy: String,
        /// What it refused (`the settings`, `the saved state`, ...).
        what: &'static str,
        /// The policy's reason.
        reason: String,
    },
    /// The policy thread is gone (the runtime was shut down).
    #[error("the policy runtime has stopped")]
    Stopped,
    /// A shadow operation was asked for while no shadow policy runs.
    #[error("no shadow policy is running: start one with `tether policy shadow FILE`")]
    NoShadow,
}

/// The policy contract lines this host loads, newest first, each as the oldest version it
/// loads and the newest whose additions it knows (for `tether version`).
pub fn contract_support() -> Vec<(&'static str, &'static str)> {
    bindings::CONTRACT_VERSIONS
        .into_iter()
        .zip(bindings::CONTRACT_NEWEST)
        .collect()
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
