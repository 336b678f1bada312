//! The operators' side: a loopback admin API over the supervisor ([`server`]), its requests and
//! answers as types shared with clients ([`api`]), and probes for an orchestrator without a
//! token ([`probes`]). The `tether` CLI is the admin API's client.

pub mod api;
pub mod probes;
pub mod server;

pub use server::{AdminContext, AdminError, AdminServer, start};
