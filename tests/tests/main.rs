//! Tether's integration tests, as one test binary: wasmtime, rmcp and reqwest are linked once.
//! Each module is one area (its file says what it covers); `common` holds what they share. The
//! fixture servers and the CLI under test are this package's binaries (`src/bin/`), the
//! misbehaving policies its `policies/` crates.

mod common;

mod admin_api;
mod chaos;
mod child_env;
mod cli_policy_check;
mod conformance_suite;
mod contract_level;
mod embed;
mod fixture_smoke;
mod gateway;
mod host_death;
mod hostile_upstreams;
mod languages;
mod naming;
mod policy_runtime;
mod reload_and_swap;
mod supervision_http;
mod supervision_stdio;
mod supervision_virtual;
mod transport_http;
