//! Tether keeps MCP servers connected for AI agents and never shows an agent a tool that cannot
//! answer. The decisions live in a WebAssembly policy component ([`policy`]); this crate is the
//! native host around it.

pub mod cli;
pub mod policy;
