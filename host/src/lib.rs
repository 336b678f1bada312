//! Tether keeps MCP servers connected for AI agents and never shows an agent a tool that cannot
//! answer. The decisions (reconnect, back off, park, publish, admit a call) live in a
//! WebAssembly policy component ([`policy`]); this crate is the native host around it.
//!
//! Embedding starts at [`Tether::builder`]:
//!
//! ```no_run
//! # async fn run() -> Result<(), tether::Error> {
//! let tether = tether::Tether::builder()
//!     .config_file("mcp.json")
//!     .observer(|event| eprintln!("{event:?}"))
//!     .start()
//!     .await?;
//! let addr = tether
//!     .serve_http("127.0.0.1:8765".parse().unwrap(), Default::default())
//!     .await?;
//! println!("MCP at http://{addr}/mcp");
//! tether.shutdown(std::time::Duration::from_secs(30)).await;
//! # Ok(()) }
//! ```
//!
//! The modules, for what the handle does not cover: [`config`] says what to supervise,
//! [`supervisor`] runs one task per server and feeds the policy, [`registry`] holds the tools
//! the policy published, [`gateway`] serves them as one MCP server, [`admin`] is the operators'
//! HTTP API and [`events`] what they hear.
#![deny(missing_docs)]

pub mod admin;
pub mod auth;
pub mod config;
mod embed;
mod error;
pub mod events;
pub mod gateway;
pub mod policy;
pub mod registry;
pub mod supervisor;

// The host's insides: public for Tether's own integration tests and benchmarks only, not part
// of the API (no stability promise, no docs).
#[doc(hidden)]
pub mod calls;
#[doc(hidden)]
pub mod catalog;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod transport;
#[doc(hidden)]
pub mod upstream;

pub use admin::probes::ProbeOptions;
pub use embed::{
    AdminOptions, Builder, CheckedConfig, CheckedPolicy, CheckedServer, DEFAULT_STARTUP_WAIT,
    Tether,
};
pub use error::{Error, Result};
pub use events::Event;
