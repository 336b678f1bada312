//! The operators' side: a loopback admin API over the supervisor ([`server`]), the state file
//! that tells the CLI where it is ([`state_file`]), and the CLI client for it ([`client`]).

pub mod client;
pub mod server;
pub mod state_file;

pub use server::{AdminContext, AdminError, AdminServer, start};
