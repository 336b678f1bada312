//! Tether's default reconnect, breaker and registry policy: a pure, deterministic state machine
//! (see `wit/policy.wit`), shipped as a wasm component and unit-tested natively.

/// The contract's types, from the policy SDK (the default policy's logic speaks them).
pub use tether_policy_sdk::model;

pub mod backoff;
pub mod breaker;
pub mod naming;
pub mod policy;
pub mod registry;
pub mod server;
pub mod settings;
pub mod words;

pub use policy::Policy;

mod component;
