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
//! [`gateway`] serves the servers' tools, prompts and resources as one MCP server, [`events`]
//! is what operators and embedders hear, [`status`] what [`Tether::status`] answers,
//! [`policy`] names, checks and replays policies, [`auth`] logs in to servers that demand
//! OAuth, [`admin`] holds the admin API's requests and answers for its clients, and
//! [`telemetry`] exports traces of forwarded requests (feature `otel`).
//!
//! Everything else is the host's insides (the supervisor, the call path, the transports, the
//! registry of published tools): crate-private. The `test-support` feature makes them public,
//! hidden from these docs and without any stability promise, for Tether's own tests and
//! benchmarks.
#![deny(missing_docs)]
// Every type a public signature uses can be named from the crate root.
#![warn(unnameable_types)]

/// Declares a module or re-export of the host's insides: crate-private, or public (and hidden)
/// with the `test-support` feature, for Tether's own tests and benchmarks.
macro_rules! insides {
    ($(#[$attr:meta])* pub mod $name:ident;) => {
        #[cfg(feature = "test-support")]
        #[doc(hidden)]
        $(#[$attr])*
        pub mod $name;
        #[cfg(not(feature = "test-support"))]
        $(#[$attr])*
        pub(crate) mod $name;
    };
    ($(#[$attr:meta])* pub use $($path:tt)+) => {
        #[cfg(feature = "test-support")]
        #[doc(hidden)]
        $(#[$attr])*
        pub use $($path)+
        #[cfg(not(feature = "test-support"))]
        #[allow(unused_imports)]
        $(#[$attr])*
        pub(crate) use $($path)+
    };
}

pub mod admin;
pub mod auth;
pub mod config;
mod embed;
mod error;
pub mod events;
pub mod gateway;
pub mod policy;
pub mod status;
pub mod telemetry;

insides! { pub mod calls; }
insides! { pub mod catalog; }
insides! { pub mod metrics; }
insides! { pub mod registry; }
insides! { pub mod supervisor; }
insides! { pub mod transport; }
insides! { pub mod upstream; }

pub use admin::probes::ProbeOptions;
pub use embed::{
    AdminOptions, Builder, CheckedConfig, CheckedPolicy, CheckedServer, DEFAULT_STARTUP_WAIT,
    Tether,
};
pub use error::{Error, Result, ServerProblem};
pub use events::Event;
pub use metrics::BuildInfo;
pub use status::Status;
pub use supervisor::ReloadReport;
