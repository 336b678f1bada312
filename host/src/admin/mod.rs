//! The operators' side: a loopback admin API over the supervisor ([`server`]), its requests and
//! answers as types shared with clients ([`api`]). The `tether` CLI is its client.

pub mod api;
pub mod server;

pub use server::{AdminContext, AdminError, AdminServer, start};
