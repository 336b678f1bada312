//! Tether's default reconnect, breaker and registry policy: a pure, deterministic state machine
//! (see `wit/policy.wit`), shipped as a wasm component and unit-tested natively.

pub mod model;

pub mod component;

pub mod backoff;
pub mod breaker;
pub mod naming;
pub mod policy;
pub mod registry;
pub mod server;
pub mod settings;
pub mod words;

pub use policy::Policy;
