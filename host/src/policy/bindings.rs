//! Host-side bindings for `wit/policy.wit`. The generated types are the host's policy vocabulary.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy-component",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use self::exports::tether::policy::policy::Guest as PolicyExports;
pub use self::tether::policy::log::Level as LogLevel;
pub use self::tether::policy::types::*;

/// The WIT package this host speaks; a component must export `tether:policy/policy` at a
/// semver-compatible version.
pub const CONTRACT_PACKAGE: &str = "tether:policy";
pub const CONTRACT_VERSION: &str = "0.1.0";

/// Operator-facing wording of a fault (logs, status). Texts come from the host's own
/// classification and never carry credentials.
impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::SpawnFailed(why) => write!(f, "could not start the server process: {why}"),
            Fault::HandshakeFailed(why) => write!(f, "MCP handshake failed: {why}"),
            Fault::HandshakeTimedOut => f.write_str("MCP handshake timed out"),
            Fault::AuthRequired(code) => {
                write!(f, "the server requires authorization (HTTP {code})")
            }
            Fault::NotMcpEndpoint(what) => write!(f, "not an MCP endpoint: {what}"),
            Fault::ProcessExited(Some(code)) => {
                write!(f, "the server process exited with code {code}")
            }
            Fault::ProcessExited(None) => f.write_str("the server process was killed by a signal"),
            Fault::TransportClosed(why) => write!(f, "the connection closed: {why}"),
            Fault::SessionExpired => f.write_str("the server no longer knows the session"),
            Fault::KeepaliveFailed(why) => write!(f, "keepalive failed: {why}"),
        }
    }
}
