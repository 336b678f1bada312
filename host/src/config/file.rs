//! Reading the operator's config file into [`ServerSpec`]s.
//!
//! Three formats are read (see [`Format`]): the `mcpServers` JSON of Claude Desktop, Cursor
//! and Claude Code; VS Code's `.vscode/mcp.json` (`servers`); and Tether's own TOML. JSON files
//! may carry `//` and `/* */` comments and trailing commas (VS Code's JSONC).
//!
//! Per server, the keys of each format:
//!
//! | key | mcpServers JSON | VS Code JSON | TOML | meaning |
//! |---|---|---|---|---|
//! | `command`, `args`, `env`, `cwd` | yes | yes | yes | a stdio server |
//! | `envFile` | — | yes | — | a dotenv file merged under `env`, read as VS Code does |
//! | `url`, `headers` | yes | yes | yes | an HTTP server |
//! | `type` | optional | required | optional | transport, see below |
//! | `timeout` | yes | — | — | tool call deadline in milliseconds (`timeouts.call`) |
//! | `disabled` | yes | yes | yes | `true` leaves the server out |
//! | `include`, `exclude` | yes | yes | yes | tool name globs |
//! | `timeouts` | yes | yes | yes | table of durations, see below |
//! | `policy` | yes | yes | yes | per-server policy settings (an object, passed through) |
//! | `max_message` | yes | yes | yes | largest message accepted from the server, see below |
//! | `protocol` | yes | yes | yes | `"auto"` (default), `"2026-07-28"` or `"2025-11-25"`, see below |
//! | `prefix` | yes | yes | yes | what agents see before the server's tool and prompt names, see below |
//! | `oauth` | yes | yes | yes | how to authorize with an HTTP server that demands OAuth, see below |
//! | `keep_connections` | yes | yes | yes | `true`: tool calls to an HTTP server keep their connections, see below |
//!
//! A server has exactly one of `command` (stdio) and `url` (HTTP). `type`: `"stdio"`; `"sse"`
//! (legacy HTTP+SSE); `"http"` is Streamable HTTP — without SSE fallback in the mcpServers and
//! TOML formats, with it in VS Code files (as VS Code does); `"streamable-http"`,
//! `"streamableHttp"` and `"streamable_http"` (not in VS Code files) are Streamable HTTP without
//! fallback; a `url` without `type` is Streamable HTTP with SSE fallback.
//!
//! `timeouts` keys: `connect`, `call`, `call_max`, `keepalive`, `keepalive_deadline`,
//! `reconnect_wait`, `stop_grace` (a duration: a string such as `"30s"`, `"500ms"`, `"5m"`,
//! `"1h 30m"`, or integer milliseconds; greater than zero, at most 365 days) and
//! `max_tool_pages` (a positive integer). A keepalive below [`Timeouts::KEEPALIVE_FLOOR`] is
//! raised to it with a warning. A `call` longer than the default `call_max` raises `call_max`
//! unless `call_max` is given (then `call` must not exceed it).
//!
//! `keep_connections` (a boolean, default `false`; also at the top level, as every server's
//! default) keeps the connections of tool calls to a Streamable HTTP server open, on Linux, where
//! no proxy intercepts them and the URL carries no credentials: no TCP or TLS handshake a call.
//! It is off by default because a TCP relay in front of a server that leaves Nagle's algorithm on
//! (docker-proxy, `kubectl port-forward`, HAProxy in TCP mode, in front of an rmcp or axum
//! server) then delays every call by ~40 ms; without it every call opens a connection, as rmcp's
//! own client does.
//!
//! `max_message` is a size: integer bytes or a string such as `"16 MiB"`, `"512KiB"`, `"2MB"`
//! (at least 1 KiB, at most 1 GiB; default 16 MiB). It bounds every message Tether buffers
//! from the server (an answer, a notification, an SSE event) and the whole tool list.
//!
//! `protocol` picks the protocol generation: `"auto"` probes with `server/discover` and falls
//! back to `initialize` (remembered for reconnects; a server that ignores the probe costs up
//! to 10 s once), `"2026-07-28"` never uses `initialize`, `"2025-11-25"` always does. Legacy
//! SSE servers are always `"2025-11-25"`.
//!
//! `prefix` is a string of at most 64 characters: absent, the policy names the server's tools and
//! prompts its own way (`<server>__<name>` with the default policy); `""` exposes the server's
//! own names; anything else is put before each name as given. Names are still sanitised to
//! `[A-Za-z0-9_-]` and clamped to 64 characters, and two servers that claim one name both lose
//! it (fail closed). A policy older than contract 0.2.1 cannot be told and names as before.
//!
//! `oauth` is a table (an object in JSON) of optional keys: `client_id` and `client_secret` (a
//! client registered beforehand; expanded, the secret never shown), `scopes` (a list, or one
//! string of space-separated scopes), `client_metadata_url` (an https URL used as the client ID
//! where the authorization server supports client ID metadata documents) and `grant`
//! (`"authorization_code"`, the default: a person logs in once with `tether auth login`; or
//! `"client_credentials"`: machine to machine, needs `client_id` and `client_secret`). Without
//! the table an HTTP server that answers 401 with an OAuth challenge is still authorized, with
//! dynamic client registration. A server whose `headers` carry `Authorization` is not: its
//! header is sent as configured, and combining it with `oauth` is an error.
//!
//! Top-level keys: `mcpServers` (mcpServers JSON), `servers` (VS Code JSON and TOML; may be
//! absent in TOML), `inputs` (VS Code JSON; ignored, with a warning when non-empty),
//! `max_message` and `prefix` (defaults for every server) and `policy` (all formats: the global
//! policy settings object). Unknown keys anywhere are
//! warnings, not errors; JSON `null` counts as an absent key.
//!
//! Strings in `command`, `args`, `env` values, `envFile`, `cwd`, `url` and `headers` values are
//! expanded as described in `expand` (`${VAR}`, `${VAR:-default}`,
//! `${env:VAR}`). `cwd` and `envFile` may start with `~` (the home directory); when relative
//! they are resolved against the directory of the config file. Nothing in `include`,
//! `exclude`, `timeouts` or `policy` is expanded.
//!
//! A disabled server is skipped before anything else about it is checked (its variables need
//! not be set). Every error and warning names the file, and the server and key when there is
//! one; none quotes a variable's value or a string from the file that might hold a secret.

mod env_file;
mod expand;
mod raw;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::expand::{ExpandError, Vars};
use self::raw::{Raw, SyntaxError, table_get};
use super::{Grant, OAuthConfig, ProtocolChoice, Secret, ServerSpec, Timeouts, TransportSpec};

/// The servers and settings read from one config file.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// In file order; disabled servers are left out.
    pub servers: Vec<ServerSpec>,
    /// The names of the disabled servers: still in the config (a reload keeps their tokens).
    pub disabled: Vec<String>,
    /// The global policy settings object (top-level `policy`), if the file has one.
    pub policy_settings: Option<serde_json::Value>,
    /// Unknown keys, ignored keys, clamped values; each names the file, server and key.
    pub warnings: Vec<String>,
}

/// A config file layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"mcpServers": {...}}`: Claude Desktop, Cursor, Claude Code.
    McpServersJson,
    /// `{"servers": {...}, "inputs": [...]}`: VS Code's `.vscode/mcp.json`.
    VsCodeJson,
    /// Tether's own TOML.
    Toml,
}

impl Format {
    fn language(self) -> &'static str {
        match self {
            Format::Toml => "TOML",
            Format::McpServersJson | Format::VsCodeJson => "JSON",
        }
    }
}

/// Which server and key an error or warning is about.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Place {
    /// The server, if the place is inside one.
    pub server: Option<String>,
    /// A dotted path inside the server (or at top level): `env.TOKEN`, `args[2]`,
    /// `timeouts.call`.
    pub key: Option<String>,
}

impl Place {
    fn top(key: impl Into<String>) -> Self {
        Place {
            server: None,
            key: Some(key.into()),
        }
    }
    fn server(server: &str) -> Self {
        Place {
            server: Some(server.to_string()),
            key: None,
        }
    }
    fn key(server: &str, key: impl Into<String>) -> Self {
        Place {
            server: Some(server.to_string()),
            key: Some(key.into()),
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match (&self.server, &self.key) {
            (Some(s), Some(k)) => write!(f, "server `{s}`, key `{k}`"),
            (Some(s), None) => write!(f, "server `{s}`"),
            (None, Some(k)) => write!(f, "key `{k}`"),
            (None, None) => f.write_str("top level"),
        }
    }
}

/// Why a config file could not be loaded. Every message starts with the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    // The cause is in the message and deliberately not a `source`: error reports that print
    // the chain would say it twice.
    #[error("{file}: cannot read the config file: {cause}")]
    Read {
        /// The config file.
        file: String,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The file name ends in neither `.json` nor `.toml`.
    #[error("{file}: unknown config file type: expected a `.json` or `.toml` file")]
    UnknownExtension {
        /// The config file.
        file: String,
    },
    /// The file is not valid JSON or TOML.
    #[error("{file}:{line}:{column}: invalid {language}: {message}")]
    Syntax {
        /// The config file.
        file: String,
        /// `"JSON"` or `"TOML"`.
        language: &'static str,
        /// Line of the error (1-based).
        line: usize,
        /// Column of the error (1-based, in characters).
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The file has neither a `mcpServers` nor a `servers` object at the top.
    #[error(
        "{file}: not an MCP server config: expected a top-level `mcpServers` object (Claude \
         Desktop, Cursor, Claude Code) or `servers` object (VS Code)"
    )]
    UnknownLayout {
        /// The config file.
        file: String,
    },
    /// A value has the wrong type.
    #[error("{file}: {place}: expected {expected}, found {found}")]
    WrongType {
        /// The config file.
        file: String,
        /// Where the value is.
        place: Place,
        /// What the key takes.
        expected: &'static str,
        /// What kind of value was found.
        found: &'static str,
    },
    /// A required key is absent.
    #[error("{file}: {place}: required key is missing ({expected})")]
    Missing {
        /// The config file.
        file: String,
        /// Where the key belongs.
        place: Place,
        /// What the key takes.
        expected: &'static str,
    },
    /// A server name is empty, too long or has characters other than `[A-Za-z0-9_-]`.
    #[error(
        "{file}: server {server:?}: invalid server name: use only letters, digits, `_` and `-`, \
         at most {max} characters (tools are advertised as `<server>__<tool>` and the name names \
         the server's log file)",
        max = ServerSpec::MAX_NAME_LEN
    )]
    InvalidName {
        /// The config file.
        file: String,
        /// The rejected name.
        server: String,
    },
    /// A server's transport keys do not fit together (both `command` and `url`, neither, or a
    /// `type` that does not match).
    #[error("{file}: server `{server}`: {message}")]
    Transport {
        /// The config file.
        file: String,
        /// The server.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// A string refers to an environment variable that is not set (and has no default).
    #[error("{file}: {place}: environment variable `{var}` is not set")]
    UnsetVariable {
        /// The config file.
        file: String,
        /// Where the string is.
        place: Place,
        /// The variable's name.
        var: String,
    },
    /// A string holds a malformed or unsupported variable reference (e.g. `${input:...}`).
    #[error("{file}: {place}: {message}")]
    BadReference {
        /// The config file.
        file: String,
        /// Where the string is.
        place: Place,
        /// What is wrong with the reference.
        message: String,
    },
    /// A value has the right type but is not allowed (an unknown `type`, a bad URL, a zero
    /// timeout, ...).
    #[error("{file}: {place}: {message}")]
    InvalidValue {
        /// The config file.
        file: String,
        /// Where the value is.
        place: Place,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// The config file (as given to [`load`] or as `origin` to [`parse`]).
    pub fn file(&self) -> &str {
        match self {
            ConfigError::Read { file, .. }
            | ConfigError::UnknownExtension { file }
            | ConfigError::Syntax { file, .. }
            | ConfigError::UnknownLayout { file }
            | ConfigError::WrongType { file, .. }
            | ConfigError::Missing { file, .. }
            | ConfigError::InvalidName { file, .. }
            | ConfigError::Transport { file, .. }
            | ConfigError::UnsetVariable { file, .. }
            | ConfigError::BadReference { file, .. }
            | ConfigError::InvalidValue { file, .. } => file,
        }
    }

    fn place(&self) -> Option<&Place> {
        match self {
            ConfigError::WrongType { place, .. }
            | ConfigError::Missing { place, .. }
            | ConfigError::UnsetVariable { place, .. }
            | ConfigError::BadReference { place, .. }
            | ConfigError::InvalidValue { place, .. } => Some(place),
            _ => None,
        }
    }

    /// The server the error is about, if any.
    pub fn server(&self) -> Option<&str> {
        match self {
            ConfigError::InvalidName { server, .. } | ConfigError::Transport { server, .. } => {
                Some(server)
            }
            _ => self.place().and_then(|p| p.server.as_deref()),
        }
    }

    /// The key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        self.place().and_then(|p| p.key.as_deref())
    }
}

/// Reads and parses a config file; variables come from the process environment.
///
/// `.toml` files are [`Format::Toml`]; `.json` files are [`Format::McpServersJson`] when they
/// have a top-level `mcpServers`, else [`Format::VsCodeJson`] when they have `servers`, else
/// an error. Relative `cwd`/`envFile` paths resolve against the file's directory.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let file = path.display().to_string();
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let is_toml = match extension.as_deref() {
        Some("toml") => true,
        Some("json") => false,
        _ => return Err(ConfigError::UnknownExtension { file }),
    };
    let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
        file: file.clone(),
        cause,
    })?;
    let base_dir = std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let env = |name: &str| std::env::var(name).ok();
    let (format, root) = if is_toml {
        (Format::Toml, parse_text(&text, Format::Toml, &file)?)
    } else {
        let root = parse_text(&text, Format::McpServersJson, &file)?;
        let format = if root.get("mcpServers").is_some() {
            Format::McpServersJson
        } else if root.get("servers").is_some() {
            Format::VsCodeJson
        } else {
            return Err(ConfigError::UnknownLayout { file });
        };
        (format, root)
    };
    let mut loaded = Loader::new(&file, format, base_dir, &env).build(&root)?;
    leave_out_self(&mut loaded, &file);
    Ok(loaded)
}

/// Leaves out, with a warning, a stdio server whose command is this very program: a client's
/// `mcpServers` file that lists Tether, given to Tether, would make it start itself.
fn leave_out_self(loaded: &mut LoadedConfig, file: &str) {
    let Some(this) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.canonicalize().ok())
    else {
        return;
    };
    loaded.servers.retain(|spec| {
        let crate::config::TransportSpec::Stdio { command, .. } = &spec.transport else {
            return true;
        };
        if resolve_command(command).is_none_or(|found| found != this) {
            return true;
        }
        loaded.warnings.push(format!(
            "{file}: server `{}` runs Tether itself ({command}): left out, or Tether would start \
             itself as one of its servers; keep the servers Tether supervises in a file of their own",
            spec.name
        ));
        false
    });
}

/// Where `command` is: itself when it names a path, else the first match on `PATH`.
fn resolve_command(command: &str) -> Option<PathBuf> {
    let found = if command.contains('/') {
        PathBuf::from(command)
    } else {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(command))
            .find(|candidate| candidate.is_file())?
    };
    found.canonicalize().ok()
}

/// Parses config text in a known format. `origin` names the text in messages and is taken
/// as its path: relative `cwd`/`envFile` paths resolve against `origin`'s parent directory
/// (against the process's working directory when `origin` has none, e.g. `"demo.json"`).
pub fn parse(
    text: &str,
    format: Format,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadedConfig, ConfigError> {
    let root = parse_text(text, format, origin)?;
    let base_dir = Path::new(origin)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    Loader::new(origin, format, base_dir, env).build(&root)
}

fn parse_text(text: &str, format: Format, file: &str) -> Result<Raw, ConfigError> {
    let parsed = match format {
        Format::Toml => raw::parse_toml(text),
        Format::McpServersJson | Format::VsCodeJson => raw::parse_json(text),
    };
    parsed.map_err(
        |SyntaxError {
             line,
             column,
             message,
         }| ConfigError::Syntax {
            file: file.to_string(),
            language: format.language(),
            line,
            column,
            message,
        },
    )
}

/// Keys every format accepts on a server.
const SERVER_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "type",
    "disabled",
    "include",
    "exclude",
    "timeouts",
    "policy",
    "max_message",
    "protocol",
    "prefix",
    "oauth",
    "keep_connections",
];
/// The longest `prefix`: a longer one leaves no room for the name itself.
const MAX_PREFIX_LEN: usize = 64;
/// Bounds of `max_message`: smaller answers nothing useful; larger defeats the point.
const MIN_MAX_MESSAGE: u64 = 1 << 10;
const MAX_MAX_MESSAGE: u64 = 1 << 30;
const STDIO_ONLY_KEYS: &[&str] = &["args", "env", "envFile", "cwd"];
const HTTP_ONLY_KEYS: &[&str] = &["headers", "oauth", "keep_connections"];
/// The top-level keys of every format besides its servers table (and VS Code's `inputs`).
const TOP_KEYS: &[&str] = &["policy", "max_message", "prefix", "keep_connections"];
/// Durations are capped so that deadline arithmetic on `Instant` cannot overflow.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Stdio,
    Http { sse_fallback: bool },
    Sse,
}

struct Loader<'a> {
    file: &'a str,
    format: Format,
    base_dir: PathBuf,
    env: &'a dyn Fn(&str) -> Option<String>,
    predefined: Vec<(&'static str, String)>,
    warnings: Vec<String>,
}

type Table = [(String, Raw)];

impl<'a> Loader<'a> {
    fn new(
        file: &'a str,
        format: Format,
        base_dir: PathBuf,
        env: &'a dyn Fn(&str) -> Option<String>,
    ) -> Self {
        let mut predefined = Vec::new();
        if format == Format::VsCodeJson {
            // `.vscode/mcp.json` lives in the workspace folder's `.vscode`.
            let workspace = if base_dir.file_name().is_some_and(|n| n == ".vscode") {
                base_dir.parent().map(Path::to_path_buf).unwrap_or_default()
            } else {
                base_dir.clone()
            };
            predefined.push(("workspaceFolder", workspace.display().to_string()));
            if let Some(home) = dirs::home_dir() {
                predefined.push(("userHome", home.display().to_string()));
            }
        }
        Loader {
            file,
            format,
            base_dir,
            env,
            predefined,
            warnings: Vec::new(),
        }
    }

    fn build(mut self, root: &Raw) -> Result<LoadedConfig, ConfigError> {
        let Raw::Table(root) = root else {
            return Err(ConfigError::UnknownLayout {
                file: self.file.to_string(),
            });
        };
        let servers_key = match self.format {
            Format::McpServersJson => "mcpServers",
            Format::VsCodeJson | Format::Toml => "servers",
        };
        for (key, _) in root {
            let known = key == servers_key
                || TOP_KEYS.contains(&key.as_str())
                || (self.format == Format::VsCodeJson && key == "inputs");
            if !known {
                self.warn(format!("unknown top-level key `{key}` (ignored)"));
            }
        }
        let policy_settings = match table_get(root, "policy") {
            Some(v) => Some(self.json_object(v, Place::top("policy"))?),
            None => None,
        };
        let default_max_message = match table_get(root, "max_message") {
            Some(v) => self.size(v, Place::top("max_message"))?,
            None => ServerSpec::DEFAULT_MAX_MESSAGE,
        };
        let default_prefix = match table_get(root, "prefix") {
            Some(v) => Some(self.prefix(v, Place::top("prefix"))?),
            None => None,
        };
        let default_keep = match table_get(root, "keep_connections") {
            Some(v) => self.boolean(v, Place::top("keep_connections"))?,
            None => false,
        };
        if self.format == Format::VsCodeJson
            && let Some(inputs) = table_get(root, "inputs")
        {
            match inputs {
                Raw::Array(items) if items.is_empty() => {}
                Raw::Array(items) => self.warn(format!(
                    "key `inputs`: {} input(s) ignored: Tether never prompts; a server that \
                     references `${{input:...}}` fails to load, so set environment variables \
                     and use `${{env:NAME}}`",
                    items.len()
                )),
                other => return Err(self.wrong(Place::top("inputs"), "an array", other)),
            }
        }
        let servers: &Table = match table_get(root, servers_key) {
            Some(Raw::Table(t)) => t,
            Some(other) => {
                let expected = self.object_word();
                return Err(self.wrong(Place::top(servers_key), expected, other));
            }
            None if self.format == Format::Toml => &[],
            None => {
                return Err(ConfigError::Missing {
                    file: self.file.to_string(),
                    place: Place::top(servers_key),
                    expected: "an object mapping server names to servers",
                });
            }
        };
        let mut specs = Vec::new();
        let mut disabled = Vec::new();
        for (name, value) in servers {
            let table = match value {
                Raw::Table(t) => t,
                other => {
                    let expected = self.object_word();
                    return Err(self.wrong(Place::server(name), expected, other));
                }
            };
            match table_get(table, "disabled") {
                None | Some(Raw::Bool(false)) => {}
                Some(Raw::Bool(true)) => {
                    disabled.push(name.clone());
                    continue;
                }
                Some(other) => {
                    return Err(self.wrong(Place::key(name, "disabled"), "a boolean", other));
                }
            }
            if !ServerSpec::valid_name(name) {
                return Err(ConfigError::InvalidName {
                    file: self.file.to_string(),
                    server: name.clone(),
                });
            }
            let mut spec = self.server(name, table)?;
            spec.max_message = match table_get(table, "max_message") {
                Some(v) => self.size(v, Place::key(name, "max_message"))?,
                None => default_max_message,
            };
            spec.prefix = match table_get(table, "prefix") {
                Some(v) => Some(self.prefix(v, Place::key(name, "prefix"))?),
                None => default_prefix.clone(),
            };
            // Only a Streamable HTTP server keeps connections; on the others the key is left
            // out of the spec, so changing it restarts none of them on reload.
            if matches!(spec.transport, TransportSpec::Http { .. }) {
                spec.keep_connections = match table_get(table, "keep_connections") {
                    Some(v) => self.boolean(v, Place::key(name, "keep_connections"))?,
                    None => default_keep,
                };
            }
            specs.push(spec);
        }
        Ok(LoadedConfig {
            servers: specs,
            disabled,
            policy_settings,
            warnings: self.warnings,
        })
    }

    fn server(&mut self, name: &str, t: &Table) -> Result<ServerSpec, ConfigError> {
        let extra: &[&str] = match self.format {
            Format::McpServersJson => &["timeout"],
            Format::VsCodeJson => &["envFile"],
            Format::Toml => &[],
        };
        for (key, _) in t {
            if !SERVER_KEYS.contains(&key.as_str()) && !extra.contains(&key.as_str()) {
                self.warn_at(&Place::key(name, key), "unknown key (ignored)");
            }
        }
        let kind = self.kind(name, t)?;
        let ignored: &[&str] = if kind == Kind::Stdio {
            HTTP_ONLY_KEYS
        } else {
            STDIO_ONLY_KEYS
        };
        for key in ignored {
            if table_get(t, key).is_some() && (*key != "envFile" || extra.contains(key)) {
                let applies = if kind == Kind::Stdio {
                    "applies only to HTTP servers (`url`)"
                } else {
                    "applies only to stdio servers (`command`)"
                };
                self.warn_at(&Place::key(name, *key), &format!("{applies}; ignored"));
            }
        }
        let transport = match kind {
            Kind::Stdio => self.stdio(name, t)?,
            Kind::Http { sse_fallback } => {
                let (url, headers) = self.http(name, t)?;
                TransportSpec::Http {
                    url,
                    headers,
                    sse_fallback,
                }
            }
            Kind::Sse => {
                let (url, headers) = self.http(name, t)?;
                TransportSpec::Sse { url, headers }
            }
        };
        let mut spec = ServerSpec::new(name, transport);
        spec.include = self.string_list(name, t, "include")?;
        spec.exclude = self.string_list(name, t, "exclude")?;
        spec.policy_settings = match table_get(t, "policy") {
            Some(v) => Some(self.json_object(v, Place::key(name, "policy"))?),
            None => None,
        };
        spec.timeouts = self.timeouts(name, t)?;
        spec.protocol = match table_get(t, "protocol") {
            None => ProtocolChoice::Auto,
            Some(Raw::Str(value)) => ProtocolChoice::parse(value).ok_or_else(|| {
                self.invalid(
                    Place::key(name, "protocol"),
                    &format!("must be {}", ProtocolChoice::CHOICES),
                )
            })?,
            Some(other) => {
                return Err(self.wrong(Place::key(name, "protocol"), "a string", other));
            }
        };
        if kind != Kind::Stdio {
            spec.oauth = self.oauth(name, t)?;
            if spec.oauth.is_some() && spec.url().is_some_and(|url| !super::secure_enough(url)) {
                self.warn(format!(
                    "server `{name}` uses `oauth` over plain http off loopback: its access tokens \
                     cross the network readable (they are sent, as without Tether); serve it over https"
                ));
            }
        }
        if spec.protocol == ProtocolChoice::Modern && kind == Kind::Sse {
            return Err(self.invalid(
                Place::key(name, "protocol"),
                "legacy SSE servers speak 2025-11-25 or older; \"2026-07-28\" needs stdio or Streamable HTTP",
            ));
        }
        Ok(spec)
    }

    /// The `oauth` table of an HTTP server. Its strings are expanded; the secret is never
    /// quoted in an error.
    fn oauth(&mut self, name: &str, t: &Table) -> Result<Option<OAuthConfig>, ConfigError> {
        let Some(value) = table_get(t, "oauth") else {
            return Ok(None);
        };
        let place = |key: &str| Place::key(name, format!("oauth.{key}"));
        let entries = match value {
            Raw::Table(entries) => entries,
            other => return Err(self.wrong(Place::key(name, "oauth"), "a table", other)),
        };
        let mut oauth = OAuthConfig::default();
        for (key, value) in entries {
            if matches!(value, Raw::Null) {
                continue;
            }
            match key.as_str() {
                "client_id" => oauth.client_id = Some(self.expand_value(value, place(key))?),
                "client_secret" => {
                    oauth.client_secret = Some(Secret::new(self.expand_value(value, place(key))?))
                }
                "client_metadata_url" => {
                    let url = self.expand_value(value, place(key))?;
                    let https = url::Url::parse(&url).is_ok_and(|url| {
                        url.scheme() == "https" && url.path() != "/" && url.host_str().is_some()
                    });
                    if !https {
                        return Err(self.invalid(
                            place(key),
                            "must be an https URL with a path (the client ID metadata document)",
                        ));
                    }
                    oauth.client_metadata_url = Some(url);
                }
                "scopes" => {
                    oauth.scopes = match value {
                        // "a b c", as OAuth writes scopes, or a list.
                        Raw::Str(text) => text.split_whitespace().map(str::to_string).collect(),
                        Raw::Array(items) => items
                            .iter()
                            .map(|item| match item {
                                Raw::Str(scope) if !scope.trim().is_empty() => {
                                    Ok(scope.trim().to_string())
                                }
                                other => Err(self.wrong(place(key), "a list of scopes", other)),
                            })
                            .collect::<Result<_, _>>()?,
                        other => {
                            return Err(self.wrong(place(key), "a list of scopes", other));
                        }
                    }
                }
                "grant" => {
                    oauth.grant = match value {
                        Raw::Str(grant) if grant == "authorization_code" => {
                            Grant::AuthorizationCode
                        }
                        Raw::Str(grant) if grant == "client_credentials" => {
                            Grant::ClientCredentials
                        }
                        Raw::Str(_) => {
                            return Err(self.invalid(
                                place(key),
                                "must be \"authorization_code\" or \"client_credentials\"",
                            ));
                        }
                        other => return Err(self.wrong(place(key), "a string", other)),
                    }
                }
                _ => self.warn_at(&place(key), "unknown key (ignored)"),
            }
        }
        if oauth.client_secret.is_some() && oauth.client_id.is_none() {
            return Err(self.invalid(
                place("client_secret"),
                "needs `client_id`: a secret belongs to a registered client",
            ));
        }
        if oauth.grant == Grant::ClientCredentials
            && (oauth.client_id.is_none() || oauth.client_secret.is_none())
        {
            return Err(self.invalid(
                place("grant"),
                "\"client_credentials\" needs `client_id` and `client_secret`",
            ));
        }
        let static_credentials = table_get(t, "headers").is_some_and(|headers| match headers {
            Raw::Table(headers) => headers
                .iter()
                .any(|(header, _)| header.eq_ignore_ascii_case("authorization")),
            _ => false,
        });
        if static_credentials {
            return Err(self.invalid(
                Place::key(name, "oauth"),
                "cannot be combined with an `Authorization` header: Tether would send the \
                 header's credentials instead of its tokens; keep one of them",
            ));
        }
        Ok(Some(oauth))
    }

    /// The transport, from `type`, `command` and `url`.
    fn kind(&self, name: &str, t: &Table) -> Result<Kind, ConfigError> {
        let vscode = self.format == Format::VsCodeJson;
        let ty = match table_get(t, "type") {
            None => None,
            Some(Raw::Str(s)) => Some(s.as_str()),
            Some(other) => return Err(self.wrong(Place::key(name, "type"), "a string", other)),
        };
        let expected_types = if vscode {
            "\"stdio\", \"http\" or \"sse\""
        } else {
            "\"stdio\", \"http\", \"streamable-http\", \"streamableHttp\", \"streamable_http\" \
             or \"sse\""
        };
        let declared = match ty {
            None if vscode => {
                return Err(ConfigError::Missing {
                    file: self.file.to_string(),
                    place: Place::key(name, "type"),
                    expected: "one of \"stdio\", \"http\" or \"sse\"",
                });
            }
            None => None,
            Some("stdio") => Some(Kind::Stdio),
            // VS Code's "http" tries Streamable HTTP and falls back to legacy SSE.
            Some("http") => Some(Kind::Http {
                sse_fallback: vscode,
            }),
            Some("streamable-http" | "streamableHttp" | "streamable_http") if !vscode => {
                Some(Kind::Http {
                    sse_fallback: false,
                })
            }
            Some("sse") => Some(Kind::Sse),
            Some(other) => {
                return Err(ConfigError::InvalidValue {
                    file: self.file.to_string(),
                    place: Place::key(name, "type"),
                    message: format!(
                        "unknown transport type {other:?}; expected one of {expected_types}"
                    ),
                });
            }
        };
        let has_command = table_get(t, "command").is_some();
        let has_url = table_get(t, "url").is_some();
        let transport_error = |message: String| ConfigError::Transport {
            file: self.file.to_string(),
            server: name.to_string(),
            message,
        };
        match (has_command, has_url, declared) {
            (true, true, _) => Err(transport_error(
                "has both `command` and `url`: a server is either a stdio child process \
                 (`command`) or an HTTP endpoint (`url`)"
                    .into(),
            )),
            (false, false, _) => Err(transport_error(
                "has neither `command` (a stdio server) nor `url` (an HTTP server)".into(),
            )),
            (true, false, None | Some(Kind::Stdio)) => Ok(Kind::Stdio),
            (true, false, Some(_)) => Err(transport_error(format!(
                "`type` is {:?}, which needs `url`, but the server has `command`",
                ty.unwrap_or_default()
            ))),
            (false, true, Some(Kind::Stdio)) => Err(transport_error(
                "`type` is \"stdio\", which needs `command`, but the server has `url`".into(),
            )),
            (false, true, None) => Ok(Kind::Http { sse_fallback: true }),
            (false, true, Some(kind)) => Ok(kind),
        }
    }

    fn stdio(&mut self, name: &str, t: &Table) -> Result<TransportSpec, ConfigError> {
        let command = self.expanded(name, t, "command")?.unwrap_or_default();
        if command.trim().is_empty() {
            return Err(self.invalid(Place::key(name, "command"), "must not be empty"));
        }
        let args = match table_get(t, "args") {
            None => Vec::new(),
            Some(Raw::Array(items)) => {
                let mut args = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let place = Place::key(name, format!("args[{i}]"));
                    args.push(self.expand_value(item, place)?);
                }
                args
            }
            Some(other) => {
                return Err(self.wrong(Place::key(name, "args"), "an array of strings", other));
            }
        };
        let mut env = BTreeMap::new();
        if let Some(value) = table_get(t, "env") {
            let entries = self.table(value, Place::key(name, "env"))?;
            for (key, value) in entries {
                let place = Place::key(name, format!("env.{key}"));
                if !valid_env_key(key) {
                    return Err(self.invalid(
                        place,
                        "invalid environment variable name (empty, or contains `=` or NUL)",
                    ));
                }
                let value = self.expand_value(value, place.clone())?;
                if value.contains('\0') {
                    return Err(self.invalid(place, "the value contains a NUL character"));
                }
                env.insert(key.clone(), value);
            }
        }
        if self.format == Format::VsCodeJson
            && let Some(path) = self.path(name, t, "envFile")?
        {
            for (key, value) in self.read_env_file(name, &path)? {
                env.entry(key).or_insert(value);
            }
        }
        let cwd = self.path(name, t, "cwd")?;
        Ok(TransportSpec::Stdio {
            command,
            args,
            env,
            cwd,
        })
    }

    fn http(
        &mut self,
        name: &str,
        t: &Table,
    ) -> Result<(String, BTreeMap<String, String>), ConfigError> {
        let url = self.expanded(name, t, "url")?.unwrap_or_default();
        let place = Place::key(name, "url");
        // The URL may hold an expanded secret: describe what is wrong, never quote it.
        match url::Url::parse(&url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
            Ok(_) => {
                return Err(
                    self.invalid(place, "not an HTTP URL: the scheme must be http or https")
                );
            }
            Err(e) => return Err(self.invalid(place, &format!("not a valid URL: {e}"))),
        }
        let mut headers = BTreeMap::new();
        if let Some(value) = table_get(t, "headers") {
            let entries = self.table(value, Place::key(name, "headers"))?;
            for (key, value) in entries {
                let place = Place::key(name, format!("headers.{key}"));
                if http::HeaderName::from_bytes(key.as_bytes()).is_err() {
                    return Err(self.invalid(place, "not a valid HTTP header name"));
                }
                let value = self.expand_value(value, place.clone())?;
                if http::HeaderValue::from_str(&value).is_err() {
                    return Err(self.invalid(
                        place,
                        "not a valid HTTP header value (after expansion it contains a newline \
                         or another control character)",
                    ));
                }
                headers.insert(key.clone(), value);
            }
        }
        Ok((url, headers))
    }

    fn timeouts(&mut self, name: &str, t: &Table) -> Result<Timeouts, ConfigError> {
        let mut out = Timeouts::default();
        let (mut call_set, mut call_max_set) = (false, false);
        if let Some(value) = table_get(t, "timeouts") {
            let entries = self.table(value, Place::key(name, "timeouts"))?;
            for (key, value) in entries {
                if matches!(value, Raw::Null) {
                    continue;
                }
                let place = Place::key(name, format!("timeouts.{key}"));
                let slot = match key.as_str() {
                    "connect" => &mut out.connect,
                    "call" => {
                        call_set = true;
                        &mut out.call
                    }
                    "call_max" => {
                        call_max_set = true;
                        &mut out.call_max
                    }
                    "keepalive" => &mut out.keepalive_interval,
                    "keepalive_deadline" => &mut out.keepalive_deadline,
                    "reconnect_wait" => &mut out.reconnect_wait,
                    "stop_grace" => &mut out.stop_grace,
                    "max_tool_pages" => {
                        out.max_tool_pages = match value {
                            Raw::Int(n) if *n > 0 => usize::try_from(*n).unwrap_or(usize::MAX),
                            Raw::Int(_) => {
                                return Err(self.invalid(place, "must be greater than zero"));
                            }
                            other => return Err(self.wrong(place, "a positive integer", other)),
                        };
                        continue;
                    }
                    _ => {
                        self.warn_at(&place, "unknown key (ignored)");
                        continue;
                    }
                };
                *slot = self.duration(value, place)?;
            }
        }
        if self.format == Format::McpServersJson
            && let Some(value) = table_get(t, "timeout")
        {
            let place = Place::key(name, "timeout");
            if call_set {
                return Err(self.invalid(
                    place,
                    "conflicts with `timeouts.call`; give the call deadline once",
                ));
            }
            out.call = self.duration(value, place.clone())?;
            call_set = true;
            if let Raw::Int(ms) = value
                && *ms < 1000
            {
                self.warn_at(
                    &place,
                    &format!(
                        "{ms} is read as milliseconds, a very short call deadline; \
                         for {ms} seconds write {}",
                        ms * 1000
                    ),
                );
            }
        }
        if out.call > out.call_max {
            if call_max_set {
                return Err(self.invalid(
                    Place::key(name, "timeouts.call_max"),
                    &format!(
                        "{} is shorter than the call deadline {}",
                        humantime::format_duration(out.call_max),
                        humantime::format_duration(out.call)
                    ),
                ));
            }
            if call_set {
                out.call_max = out.call;
            }
        }
        if out.keepalive_interval < Timeouts::KEEPALIVE_FLOOR {
            self.warn_at(
                &Place::key(name, "timeouts.keepalive"),
                &format!(
                    "{} is below the {} floor; using {}",
                    humantime::format_duration(out.keepalive_interval),
                    humantime::format_duration(Timeouts::KEEPALIVE_FLOOR),
                    humantime::format_duration(Timeouts::KEEPALIVE_FLOOR),
                ),
            );
            out.keepalive_interval = Timeouts::KEEPALIVE_FLOOR;
        }
        Ok(out)
    }

    /// A byte size: integer bytes, or a string with a unit (`"16 MiB"`, `"512KiB"`, `"2MB"`).
    fn size(&self, value: &Raw, place: Place) -> Result<usize, ConfigError> {
        let bytes = match value {
            Raw::Int(n) if *n > 0 => *n as u64,
            Raw::Int(_) => return Err(self.invalid(place, "must be greater than zero")),
            Raw::Str(text) => match text.trim().parse::<bytesize::ByteSize>() {
                Ok(size) => size.as_u64(),
                Err(_) => {
                    return Err(self.invalid(
                        place,
                        "not a size: write bytes, or a number with a unit such as \"16 MiB\"",
                    ));
                }
            },
            other => {
                return Err(self.wrong(
                    place,
                    "a size (bytes, or a string like \"16 MiB\")",
                    other,
                ));
            }
        };
        if !(MIN_MAX_MESSAGE..=MAX_MAX_MESSAGE).contains(&bytes) {
            return Err(self.invalid(place, "must be between 1 KiB and 1 GiB"));
        }
        Ok(bytes as usize)
    }

    fn duration(&self, value: &Raw, place: Place) -> Result<Duration, ConfigError> {
        let duration = match value {
            Raw::Int(ms) if *ms <= 0 => {
                return Err(self.invalid(place, "must be greater than zero"));
            }
            Raw::Int(ms) => u64::try_from(*ms)
                .map(Duration::from_millis)
                .unwrap_or(Duration::MAX),
            Raw::Str(text) => humantime::parse_duration(text.trim()).map_err(|e| {
                self.invalid(
                    place.clone(),
                    &format!(
                        "invalid duration {text:?} ({e}); write e.g. \"30s\", \"500ms\", \"5m\" \
                         or integer milliseconds"
                    ),
                )
            })?,
            other => {
                return Err(self.wrong(
                    place,
                    "a duration (a string such as \"30s\", or integer milliseconds)",
                    other,
                ));
            }
        };
        if duration.is_zero() {
            return Err(self.invalid(place, "must be greater than zero"));
        }
        if duration > MAX_DURATION {
            return Err(self.invalid(place, "is too long (at most 365 days)"));
        }
        Ok(duration)
    }

    /// `keep_connections`: a boolean.
    fn boolean(&self, value: &Raw, place: Place) -> Result<bool, ConfigError> {
        match value {
            Raw::Bool(value) => Ok(*value),
            other => Err(self.wrong(place, "a boolean", other)),
        }
    }

    /// `include`/`exclude`: an array of strings, not expanded.
    /// A `prefix`: a string of at most [`MAX_PREFIX_LEN`] characters (not expanded).
    fn prefix(&self, value: &Raw, place: Place) -> Result<String, ConfigError> {
        match value {
            Raw::Str(prefix) if prefix.chars().count() <= MAX_PREFIX_LEN => Ok(prefix.clone()),
            Raw::Str(_) => Err(self.invalid(
                place,
                &format!("must be at most {MAX_PREFIX_LEN} characters"),
            )),
            other => Err(self.wrong(place, "a string", other)),
        }
    }

    fn string_list(&self, name: &str, t: &Table, key: &str) -> Result<Vec<String>, ConfigError> {
        let place = Place::key(name, key);
        match table_get(t, key) {
            None => Ok(Vec::new()),
            Some(Raw::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Raw::Str(s) => Ok(s.clone()),
                    other => Err(self.wrong(
                        Place::key(name, format!("{key}[{i}]")),
                        "a string (a glob pattern)",
                        other,
                    )),
                })
                .collect(),
            Some(other) => Err(self.wrong(place, "an array of glob patterns", other)),
        }
    }

    /// An expanded path: `~` is the home directory; relative paths resolve against the
    /// config file's directory.
    fn path(&self, name: &str, t: &Table, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        let Some(text) = self.expanded(name, t, key)? else {
            return Ok(None);
        };
        if text.is_empty() {
            return Err(self.invalid(Place::key(name, key), "must not be empty"));
        }
        let path = if text == "~" || text.starts_with("~/") {
            let Some(home) = dirs::home_dir() else {
                return Err(self.invalid(
                    Place::key(name, key),
                    "starts with `~` but the home directory is unknown",
                ));
            };
            home.join(text.trim_start_matches('~').trim_start_matches('/'))
        } else {
            PathBuf::from(text)
        };
        Ok(Some(if path.is_relative() {
            self.base_dir.join(path)
        } else {
            path
        }))
    }

    /// The variables of a VS Code `envFile`, read as VS Code reads it (`env_file.rs`); lines it
    /// would skip are skipped with a warning naming them.
    fn read_env_file(
        &mut self,
        name: &str,
        path: &Path,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let place = Place::key(name, "envFile");
        // The path may be built from variables: report the I/O error, not the path.
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.invalid(place.clone(), &format!("cannot read the env file: {e}")))?;
        let file = env_file::parse(&text);
        if !file.skipped.is_empty() {
            let lines: Vec<String> = file.skipped.iter().map(usize::to_string).collect();
            self.warn_at(
                &place,
                &format!(
                    "env file line {} defines nothing (not KEY=VALUE) and is skipped",
                    lines.join(", ")
                ),
            );
        }
        if let Some(line) = file.unusable.first() {
            return Err(self.invalid(
                place,
                &format!(
                    "env file line {line}: a name with `=` or a NUL character in it cannot be passed to a process"
                ),
            ));
        }
        Ok(file.vars)
    }

    /// The expanded string under `key`, if present.
    fn expanded(&self, name: &str, t: &Table, key: &str) -> Result<Option<String>, ConfigError> {
        table_get(t, key)
            .map(|v| self.expand_value(v, Place::key(name, key)))
            .transpose()
    }

    fn expand_value(&self, value: &Raw, place: Place) -> Result<String, ConfigError> {
        let Raw::Str(text) = value else {
            return Err(self.wrong(place, "a string", value));
        };
        let vars = Vars {
            env: self.env,
            predefined: &self.predefined,
        };
        expand::expand(text, &vars).map_err(|e| match e {
            ExpandError::Unset { var } => ConfigError::UnsetVariable {
                file: self.file.to_string(),
                place,
                var,
            },
            ExpandError::Invalid(message) => ConfigError::BadReference {
                file: self.file.to_string(),
                place,
                message,
            },
        })
    }

    fn table<'v>(&self, value: &'v Raw, place: Place) -> Result<&'v Table, ConfigError> {
        match value {
            Raw::Table(t) => Ok(t),
            other => {
                let expected = if self.format == Format::Toml {
                    "a table of strings"
                } else {
                    "an object of strings"
                };
                Err(self.wrong(place, expected, other))
            }
        }
    }

    fn json_object(&self, value: &Raw, place: Place) -> Result<serde_json::Value, ConfigError> {
        if !matches!(value, Raw::Table(_)) {
            let expected = self.object_word();
            return Err(self.wrong(place, expected, value));
        }
        value.to_json().map_err(|what| {
            self.invalid(
                place,
                &format!("contains {what}, which cannot be passed to the policy"),
            )
        })
    }

    fn object_word(&self) -> &'static str {
        if self.format == Format::Toml {
            "a table"
        } else {
            "an object"
        }
    }

    fn wrong(&self, place: Place, expected: &'static str, found: &Raw) -> ConfigError {
        ConfigError::WrongType {
            file: self.file.to_string(),
            place,
            expected,
            found: found.kind(self.format == Format::Toml),
        }
    }

    fn invalid(&self, place: Place, message: &str) -> ConfigError {
        ConfigError::InvalidValue {
            file: self.file.to_string(),
            place,
            message: message.to_string(),
        }
    }

    fn warn(&mut self, message: String) {
        self.warnings.push(format!("{}: {message}", self.file));
    }

    fn warn_at(&mut self, place: &Place, message: &str) {
        self.warnings
            .push(format!("{}: {place}: {message}", self.file));
    }
}

fn valid_env_key(key: &str) -> bool {
    !key.is_empty() && !key.contains(['=', '\0'])
}

#[cfg(test)]
mod tests;
