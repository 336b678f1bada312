//! The policy SDK: what every Rust policy for Tether shares. [`model`] is the contract
//! (`wit/0.2/policy.wit`) as plain Rust types, so a policy's logic is unit-tested natively;
//! [`component`] is the thin wit-bindgen edge that exports a type implementing
//! [`PolicyLogic`] as a policy component:
//!
//! ```ignore
//! struct MyPolicy { /* ... */ }
//! impl tether_policy_sdk::PolicyLogic for MyPolicy { /* ... */ }
//! tether_policy_sdk::export_policy_logic!(MyPolicy);
//! ```
//!
//! Build the crate as a `cdylib` for `wasm32-wasip2` and the result is a component Tether loads.

pub mod component;
pub mod model;

pub use component::PolicyLogic;
