//! Transports to upstream MCP servers. Each turns a server spec into an initialized rmcp client
//! session, or a classified [`Fault`] the policy can reason about.

pub mod http;
pub mod sse;
pub mod stdio;

pub use crate::policy::Fault;
