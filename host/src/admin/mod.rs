//! The operators' side: a loopback admin API over the supervisor (`server.rs`), its requests and
//! answers as types shared with clients ([`api`]), the last hour of events it keeps
//! (`history.rs`) for the dashboard it serves (`ui.html`), and probes for an orchestrator without
//! a token (`probes.rs`). The `tether` CLI is the admin API's client.

pub mod api;
insides! { pub mod history; }
insides! { pub mod probes; }
insides! { pub mod server; }

pub use server::AdminError;
insides! { pub use server::{AdminContext, AdminServer, start}; }
