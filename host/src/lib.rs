//! Tether keeps MCP servers connected for AI agents and never shows an agent a tool that cannot
//! answer. The decisions live in a WebAssembly policy component ([`policy`]); this crate is the
//! native host around it: [`config`] says what to supervise, [`transport`] reaches servers,
//! [`upstream`] is one live session, [`supervisor`] runs one task per server and feeds the
//! policy, [`registry`] holds the tools the policy published, and [`calls`] routes tool calls.

pub mod admin;
pub mod calls;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod gateway;
pub mod metrics;
pub mod policy;
pub mod registry;
pub mod serve;
pub mod supervisor;
pub mod transport;
pub mod upstream;
