//! The one error type of the embedding API ([`crate::Tether`]): every message names its
//! culprit (the file, server, policy or address), so it can be shown to an operator as it is.

use std::net::SocketAddr;

/// Why an embedding call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A config file could not be read or understood (the message starts with the file).
    #[error(transparent)]
    Config(#[from] crate::config::file::ConfigError),
    /// A server's settings are invalid: a duplicate name, or a configuration the policy refuses.
    #[error("{0}")]
    Server(String),
    /// The policy could not be loaded, refused its settings, failed, or has stopped.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The admin API could not start.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    /// The MCP endpoint could not listen.
    #[error("cannot serve MCP on {addr}: {cause}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why not (the cause is in the message, so chained reports say it once).
        cause: std::io::Error,
    },
    /// An MCP session over stdio failed to start or ended with an error.
    #[error("MCP over stdio: {0}")]
    Stdio(String),
    /// No server of that name is supervised.
    #[error("no server named {0:?} is supervised")]
    UnknownServer(String),
    /// [`crate::Tether::reload`] needs the config file the servers came from.
    #[error("there is no config file to reload: the servers were given in code")]
    NoConfigFile,
    /// The async runtime failed to run a blocking step (a panic in it, or shutdown).
    #[error("{what} did not finish: {cause}")]
    Task {
        /// The step.
        what: &'static str,
        /// Why.
        cause: String,
    },
}

/// A result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
