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
    /// Servers' settings are unusable: every problem found, each naming its server. `origin` is
    /// where the servers came from (the config file, or `config` for servers given in code).
    #[error("{}", problems.iter().map(|p| format!("{origin}: {p}")).collect::<Vec<_>>().join("\n"))]
    Server {
        /// The config file, or `config`.
        origin: String,
        /// What is wrong, per server; never empty.
        problems: Vec<ServerProblem>,
    },
    /// The policy could not be loaded, refused its settings, failed, or has stopped.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The policy refused the settings a config file gives it (its top-level `policy`).
    #[error("{origin}: the policy refuses the top-level `policy` settings: {cause}")]
    Settings {
        /// The config file.
        origin: String,
        /// The policy's refusal.
        cause: crate::policy::PolicyError,
    },
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

/// What is wrong with one server's settings (see [`Error::Server`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerProblem {
    /// Its name cannot be used; `why` says what a name must be.
    #[error("{why}")]
    BadName {
        /// The name.
        server: String,
        /// What a name must be.
        why: String,
    },
    /// Another server has the same name (in the same file, or already supervised).
    #[error("two servers are named {server:?}")]
    Duplicate {
        /// The name.
        server: String,
    },
    /// The running policy refuses its per-server settings or tool filters.
    #[error(
        "server `{server}`: the policy refuses its configuration (keys `policy`, `include`, `exclude`): {reason}"
    )]
    RefusedByPolicy {
        /// The server.
        server: String,
        /// The policy's reason.
        reason: String,
    },
    /// The policy could not judge its settings (it failed or has stopped).
    #[error("server `{server}`: the policy could not check its configuration: {error}")]
    Unchecked {
        /// The server.
        server: String,
        /// Why.
        error: crate::policy::PolicyError,
    },
    /// Tether is shutting down and takes no new server.
    #[error("server {server:?} was not added: Tether is shutting down")]
    ShuttingDown {
        /// The server.
        server: String,
    },
}

impl ServerProblem {
    /// The server the problem is about.
    pub fn server(&self) -> &str {
        match self {
            Self::BadName { server, .. }
            | Self::Duplicate { server }
            | Self::RefusedByPolicy { server, .. }
            | Self::Unchecked { server, .. }
            | Self::ShuttingDown { server } => server,
        }
    }
}

/// A result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
