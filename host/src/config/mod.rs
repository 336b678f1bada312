//! What the host knows about each upstream server: how to reach it and its limits. (Reading
//! the operator's config files into these types is `config::file`'s job.)

pub mod file;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::policy::{ServerConfig, TransportKind};

/// One upstream server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    /// Unique name; by default the prefix of its advertised tool and prompt names.
    pub name: String,
    /// How to reach it.
    pub transport: TransportSpec,
    /// Glob patterns over tool names: when non-empty only matching tools are shown.
    pub include: Vec<String>,
    /// Glob patterns over tool names: matching tools are never shown.
    pub exclude: Vec<String>,
    /// Per-server policy settings overrides (a JSON object), if any.
    pub policy_settings: Option<serde_json::Value>,
    /// Its deadlines.
    pub timeouts: Timeouts,
    /// The largest message accepted from this server, in bytes: one answer, one notification,
    /// one event, and a whole (paginated) tool list. What is larger fails with a fault naming
    /// the server, what was too large and this limit.
    pub max_message: usize,
    /// Which protocol generation to speak to it.
    pub protocol: ProtocolChoice,
    /// What to put before its tool and prompt names (config key `prefix`): `None` for the
    /// policy's default (`<server>__` with the default policy), `""` for the server's own
    /// names. The policy decides the names; a policy older than contract 0.2.1 ignores it.
    pub prefix: Option<String>,
    /// How to authorize with it when it demands OAuth (config table `oauth`); `None`: the
    /// defaults (see [`ServerSpec::oauth`]).
    pub oauth: Option<OAuthConfig>,
    /// Whether tool calls to this HTTP server keep their connections open (config key
    /// `keep_connections`, default `false`): no TCP or TLS handshake a call, but a call waits
    /// ~40 ms when a TCP relay (docker-proxy, `kubectl port-forward`, HAProxy in TCP mode) stands
    /// in front of a server that leaves Nagle's algorithm on.
    pub keep_connections: bool,
}

/// How Tether obtains tokens from a server's authorization server (MCP authorization,
/// OAuth 2.1). Every field is optional: by default Tether discovers the authorization server
/// from the server's 401, registers itself (dynamic client registration) and asks for the
/// scopes the server names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OAuthConfig {
    /// A client ID registered with the authorization server beforehand.
    pub client_id: Option<String>,
    /// Its secret (a confidential client).
    pub client_secret: Option<Secret>,
    /// Scopes to ask for; empty: what the server's challenge or metadata names.
    pub scopes: Vec<String>,
    /// An https URL of a client ID metadata document, used as the client ID where the
    /// authorization server supports it.
    pub client_metadata_url: Option<String>,
    /// How tokens are obtained.
    pub grant: Grant,
}

/// The OAuth grant Tether uses for a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Grant {
    /// A person logs in once in a browser (PKCE); refresh tokens keep the server connected.
    #[default]
    AuthorizationCode,
    /// Machine to machine: the client ID and secret buy tokens, no browser.
    ClientCredentials,
}

impl Grant {
    /// The config value.
    pub fn name(self) -> &'static str {
        match self {
            Grant::AuthorizationCode => "authorization_code",
            Grant::ClientCredentials => "client_credentials",
        }
    }
}

/// A secret from the config: compared and used, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Which MCP protocol generation Tether speaks to a server (config key `protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProtocolChoice {
    /// Probe with `server/discover` and fall back to `initialize`; what worked is remembered
    /// for reconnects.
    #[default]
    Auto,
    /// 2026-07-28 only (`server/discover`, no `initialize`).
    Modern,
    /// The `initialize` handshake (2025-11-25 and older) only.
    Legacy,
}

impl ProtocolChoice {
    /// The values of the config key.
    pub const CHOICES: &str = "\"auto\", \"2026-07-28\" or \"2025-11-25\"";

    /// The choice a config value names (one of [`Self::CHOICES`]), if any.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "auto" => Some(Self::Auto),
            "2026-07-28" => Some(Self::Modern),
            "2025-11-25" => Some(Self::Legacy),
            _ => None,
        }
    }
}

/// How to reach a server.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportSpec {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        /// The program to run.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Added to the allowlisted part of the host environment.
        env: BTreeMap<String, String>,
        /// Its working directory (`None`: the host's).
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP; with `sse_fallback`, a first connect falls back to legacy SSE when the
    /// server refuses Streamable HTTP (400/405/406).
    Http {
        /// The MCP endpoint.
        url: String,
        /// Sent with every request (e.g. `Authorization`).
        headers: BTreeMap<String, String>,
        /// Whether a first connect may fall back to legacy SSE.
        sse_fallback: bool,
    },
    /// Legacy HTTP+SSE.
    Sse {
        /// The SSE endpoint.
        url: String,
        /// Sent with every request (e.g. `Authorization`).
        headers: BTreeMap<String, String>,
    },
}

impl TransportSpec {
    /// The transport kind, as the policy is told it.
    pub fn kind(&self) -> TransportKind {
        match self {
            TransportSpec::Stdio { .. } => TransportKind::Stdio,
            TransportSpec::Http { .. } => TransportKind::StreamableHttp,
            TransportSpec::Sse { .. } => TransportKind::Sse,
        }
    }
}

/// Deadlines for one server.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    /// Spawn/connect plus the MCP initialize handshake.
    pub connect: Duration,
    /// A tool call without progress notifications.
    pub call: Duration,
    /// A tool call in total, however much progress it reports.
    pub call_max: Duration,
    /// Time between keepalives on an idle session (at least [`Timeouts::KEEPALIVE_FLOOR`]).
    pub keepalive_interval: Duration,
    /// How long a keepalive may take.
    pub keepalive_deadline: Duration,
    /// How long a call waits for a fresh session when it finds the old one dead.
    pub reconnect_wait: Duration,
    /// Grace between closing stdin, SIGTERM and SIGKILL when stopping a child.
    pub stop_grace: Duration,
    /// Most `tools/list` pages read from one server.
    pub max_tool_pages: usize,
}

impl Timeouts {
    /// The shortest keepalive interval used, whatever is configured.
    pub const KEEPALIVE_FLOOR: Duration = Duration::from_secs(5);
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(30),
            call: Duration::from_secs(300),
            call_max: Duration::from_secs(3600),
            keepalive_interval: Duration::from_secs(180),
            keepalive_deadline: Duration::from_secs(30),
            reconnect_wait: Duration::from_secs(15),
            stop_grace: Duration::from_secs(2),
            max_tool_pages: 100,
        }
    }
}

impl ServerSpec {
    /// 16 MiB: what rmcp's HTTP client accepts by default, so stdio, HTTP and SSE agree.
    pub const DEFAULT_MAX_MESSAGE: usize = 16 << 20;
    /// Longest server name: it prefixes every advertised tool name (at most 64 characters)
    /// and names the server's log file.
    pub const MAX_NAME_LEN: usize = 48;

    /// Whether `name` may name a server: 1 to [`Self::MAX_NAME_LEN`] of `[A-Za-z0-9_-]`.
    pub fn valid_name(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= Self::MAX_NAME_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    /// Why `name` cannot name a server, if it cannot.
    pub fn name_problem(name: &str) -> Option<String> {
        (!Self::valid_name(name)).then(|| {
            format!(
                "invalid server name {name:?}: use 1 to {} letters, digits, `_` and `-`",
                Self::MAX_NAME_LEN
            )
        })
    }

    /// A stdio server with default settings.
    pub fn stdio(name: &str, command: impl Into<String>, args: &[&str]) -> Self {
        Self::new(
            name,
            TransportSpec::Stdio {
                command: command.into(),
                args: args.iter().map(|a| a.to_string()).collect(),
                env: BTreeMap::new(),
                cwd: None,
            },
        )
    }

    /// A server with default settings.
    pub fn new(name: &str, transport: TransportSpec) -> Self {
        Self {
            name: name.to_string(),
            transport,
            include: Vec::new(),
            exclude: Vec::new(),
            policy_settings: None,
            timeouts: Timeouts::default(),
            max_message: Self::DEFAULT_MAX_MESSAGE,
            protocol: ProtocolChoice::Auto,
            prefix: None,
            oauth: None,
            keep_connections: false,
        }
    }

    /// How Tether authorizes with this server when it demands it: `None` for a stdio server
    /// and for one whose configured headers carry its credentials (`Authorization`), which
    /// Tether then sends as they are.
    pub fn oauth(&self) -> Option<OAuthConfig> {
        let headers = match &self.transport {
            TransportSpec::Stdio { .. } => return None,
            TransportSpec::Http { headers, .. } | TransportSpec::Sse { headers, .. } => headers,
        };
        if headers
            .keys()
            .any(|name| name.eq_ignore_ascii_case("authorization"))
        {
            return None;
        }
        Some(self.oauth.clone().unwrap_or_default())
    }

    /// The URL of an HTTP server.
    pub fn url(&self) -> Option<&str> {
        match &self.transport {
            TransportSpec::Stdio { .. } => None,
            TransportSpec::Http { url, .. } | TransportSpec::Sse { url, .. } => Some(url),
        }
    }

    /// What the policy is told about this server.
    pub fn policy_config(&self) -> ServerConfig {
        ServerConfig {
            name: self.name.clone(),
            transport: self.transport.kind(),
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            settings: self
                .policy_settings
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default(),
            prefix: self.prefix.clone(),
        }
    }

    /// The keepalive interval with its floor applied.
    pub fn keepalive_interval(&self) -> Duration {
        self.timeouts
            .keepalive_interval
            .max(Timeouts::KEEPALIVE_FLOOR)
    }
}

/// Whether credentials may be sent to `url`: https, or http on loopback.
pub(crate) fn secure_enough(url: &str) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Domain(host)) => host.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}
