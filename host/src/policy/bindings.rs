//! Host-side bindings for `wit/policy.wit`. The generated types are the host's policy vocabulary.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy-component",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use exports::tether::policy::policy::Guest as PolicyExports;
pub use tether::policy::log::Level as LogLevel;
pub use tether::policy::types::*;

/// The WIT package this host speaks; a component must export `tether:policy/policy` at a
/// semver-compatible version.
pub const CONTRACT_PACKAGE: &str = "tether:policy";
pub const CONTRACT_VERSION: &str = "0.1.0";
