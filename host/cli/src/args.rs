//! The command line's grammar (clap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "Keeps MCP servers connected for AI agents"
)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// How much is logged, and how (on stderr; `RUST_LOG` overrides the level).
#[derive(Args, Clone, Copy)]
pub struct LogArgs {
    /// Log more: once for debug, twice for trace.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Log less: once for errors only, twice for nothing.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub quiet: u8,
    /// `text` (for people) or `json` (one object per line: timestamp, level, target, message
    /// and the event's fields, for log pipelines).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Supervise the configured servers and serve their healthy tools as one MCP server.
    Serve(Box<ServeArgs>),
    /// List the running gateways (each agent on stdio starts its own): pid, how it serves
    /// MCP, its admin address, config and state file.
    Gateways {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show every server's state (from a running gateway).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Every tool the servers offer (from a running gateway): the name agents see it by,
    /// its server and name there, and why agents do not see it when they do not.
    Tools {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print the address of a running gateway's dashboard (its admin API's `/ui`), with the
    /// token in the fragment: open it in a browser.
    Dashboard {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Stream lifecycle events (from a running gateway) until interrupted.
    Events {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Reconnect a server now (revives a parked one).
    Reconnect {
        /// The server's name.
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Reload the gateway's config file: start added servers, stop removed ones, restart
    /// changed ones; others keep their sessions.
    Reload {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Authorize Tether with servers that use OAuth (tokens are kept under the state
    /// directory, shared by every gateway of this user).
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Work with config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Work with policy components.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Prints a completion script for SHELL to stdout (e.g. `tether completions bash >
    /// ~/.local/share/bash-completion/completions/tether`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Prints the man page (roff) to stdout (e.g. `tether manpage > ~/.local/share/man/man1/tether.1`).
    Manpage,
    /// What this build is: version, commit, target, wasmtime, the policy contract lines it
    /// loads (`--version` says the same).
    Version {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Finds everything `serve` would refuse in a config (the file, server names, the policy
    /// and its settings, each server's settings as the policy judges them) without starting
    /// anything. Exits 0 when it is usable, 4 when it is not.
    Check(ConfigCheckArgs),
}

#[derive(Args)]
pub struct ConfigCheckArgs {
    /// The config file (mcpServers JSON, VS Code mcp.json or Tether TOML).
    pub file: PathBuf,
    /// The policy component `serve` would run (default: the embedded policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Policy settings (JSON) `serve` would be given, instead of the file's `policy`.
    #[arg(long)]
    pub policy_settings: Option<String>,
    /// Where compiled policy components are kept.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Log in to a server: opens its authorization page in the browser (`$BROWSER`, else the
    /// platform's opener; the URL is printed too) and waits for the redirect on loopback. The
    /// running gateways reconnect the server when it is done.
    Login {
        /// The server's name in the config.
        name: String,
        /// The config file that names it.
        #[arg(long)]
        config: PathBuf,
        /// A scope to ask for (repeatable; default: what the server names).
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// Do not start a browser: print the URL only.
        #[arg(long)]
        no_browser: bool,
    },
    /// Per server of the config: authorized or not, scopes, expiry (never a token).
    Status {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Forget a server's tokens; running gateways park it until the next login.
    Logout {
        /// The server's name in the config.
        name: String,
        /// The config file that names it.
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Run the conformance suite against a policy component (default: the embedded policy).
    /// Exits 0 when every scenario passes, 1 when one fails, 2 when the component cannot be used
    /// (it cannot load, or it refuses the settings).
    Check(CheckArgs),
    /// Write a policy project to start from into DIR (new or empty): the contract's WIT, a
    /// policy that passes the contract level of `tether policy check`, and `build.sh OUT.wasm`,
    /// which installs the language's pinned toolchain inside DIR and builds the component.
    New {
        /// The language.
        #[arg(long, value_enum)]
        lang: Lang,
        /// Where to write it.
        dir: PathBuf,
    },
    /// Replay a recording (`tether serve --record FILE`) against a candidate policy (default:
    /// the embedded one) and print where its decisions differ from the recorded ones. Exits 0
    /// when none differ, 1 when some do, 2 when the recording or the candidate cannot be used.
    Replay {
        /// The recording.
        recording: PathBuf,
        /// The candidate component (.wasm).
        candidate: Option<PathBuf>,
        /// Settings JSON for the candidate (default: the recording's initial settings).
        #[arg(long)]
        settings: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace the running gateway's policy with a component, keeping its state (by snapshot
    /// for the same implementation, by handover for another) and its sessions.
    Swap {
        /// The component (.wasm).
        #[arg(required_unless_present = "from_shadow")]
        file: Option<PathBuf>,
        /// Promote the shadow policy (`tether policy shadow FILE`) instead of a file.
        #[arg(long, conflicts_with = "file")]
        from_shadow: bool,
        /// Swap even to a policy that breaks Tether's invariants (`tether policy check`); the
        /// answer names them. A policy that breaks the contract is never swapped in.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Run a candidate policy beside the running gateway's policy, on the live inputs, acting on
    /// nothing, and report where it decides otherwise (also in `tether events`). Without FILE:
    /// show the report so far. Promote it with `tether policy swap --from-shadow`.
    Shadow {
        /// The candidate component (.wasm).
        file: Option<PathBuf>,
        /// Stop the shadow policy.
        #[arg(long, conflicts_with = "file")]
        drop: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Change the running gateway's policy settings (a JSON object), keeping its state.
    Set {
        settings: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// How the admin commands find the running gateway.
#[derive(Args, Debug, Clone)]
pub struct AdminArgs {
    /// The gateway's admin address (default: from the state file).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Bearer token for the gateway at --admin (default: from the state file naming that
    /// address). Without --admin, the state file's token is used.
    #[arg(long, env = "TETHER_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The state file `tether serve` wrote (default: the one running gateway's).
    #[arg(long, conflicts_with = "pid")]
    pub state_file: Option<PathBuf>,
    /// The gateway with this process id, when several run (`tether gateways` lists them).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// `tether serve` options.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Config file: `mcpServers` JSON, VS Code `mcp.json`, or Tether TOML.
    #[arg(long)]
    pub config: PathBuf,
    /// Serve MCP over Streamable HTTP at http://ADDR/mcp instead of stdio.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Admin API address (loopback only unless --admin-allow-remote).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub admin: SocketAddr,
    /// Allow a non-loopback admin address.
    #[arg(long)]
    pub admin_allow_remote: bool,
    /// Serve probes for an orchestrator at ADDR, without a token: `GET /livez` (the process
    /// answers) and `GET /readyz` (the config is loaded and the policy answers).
    #[arg(long, value_name = "ADDR")]
    pub probes: Option<SocketAddr>,
    /// Serve `GET /metrics` on the probe listener too (no token there).
    #[arg(long, requires = "probes")]
    pub probe_metrics: bool,
    /// `/readyz` answers ready only while every configured server is connected.
    #[arg(long, requires = "probes")]
    pub ready_requires_servers: bool,
    /// Export a trace span per forwarded request (tools/call, prompts/get, resources/read,
    /// completion/complete) over OTLP/HTTP to the collector at URL (e.g.
    /// `http://127.0.0.1:4318`; `/v1/traces` is added). OTEL_EXPORTER_OTLP_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT turn it on too.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Policy component to run instead of the embedded default.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Policy settings JSON (overrides the config file's [policy]).
    #[arg(long)]
    pub policy_settings: Option<String>,
    /// Where to write the admin address and token (0600).
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// Where stdio servers' stderr logs go (default: beside the state file).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Cache for compiled policy components (default: the user's cache directory).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Also accept browser requests from ORIGIN over HTTP (`https://app.example.com`, a port,
    /// or `:*` for any port). Loopback origins and requests without an Origin always pass;
    /// others get 403. Repeatable.
    #[arg(
        long = "allow-origin",
        value_name = "ORIGIN",
        requires = "http",
        value_parser = tether::gateway::parse_allowed_origin
    )]
    pub allow_origin: Vec<String>,
    /// A file holding the bearer token every MCP request over HTTP must carry (or set
    /// TETHER_MCP_TOKEN). Requests without it get 401.
    #[arg(long, value_name = "PATH", requires = "http")]
    pub mcp_token_file: Option<PathBuf>,
    /// How long an MCP session over HTTP may go without a request before it ends (its client
    /// must then start a new one), e.g. "10m", "1h".
    #[arg(long, value_name = "DURATION", default_value = "5m", requires = "http", value_parser = session_idle)]
    pub session_idle: Duration,
    /// Record the policy's every decision (events, admissions, actions) in FILE as JSON lines,
    /// for `tether policy replay`. Holds no secrets (see docs/POLICY-CONTRACT.md).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// How long calls in flight may take to finish once shutdown starts (e.g. "30s", "2m").
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// How long, at most, the first lists and calls wait for the configured servers to connect
    /// or fail their first attempt ("0s": answer at once, possibly empty).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub startup_wait: Duration,
}

/// A language a policy can be written in.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with wit-bindgen (cargo, target wasm32-wasip2).
    Rust,
    /// Python, with componentize-py.
    Python,
    /// JavaScript, with componentize-js.
    Js,
}

impl std::fmt::Display for Lang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        })
    }
}

/// `tether policy check`.
#[derive(Args)]
pub struct CheckArgs {
    /// The component (.wasm) to check.
    pub file: Option<PathBuf>,
    /// Settings JSON given to the policy in every scenario.
    #[arg(long, default_value = "{}")]
    pub settings: String,
    /// Print results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Cache for compiled components (default: the user's cache directory, as `serve`):
    /// a second check of the same component skips compiling.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Compile the component even if it is in the cache, and cache nothing.
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
    /// Write the suite's scenarios as JSON into this directory (one file per scenario, and
    /// `index.json`; see docs/CONFORMANCE.md) and check nothing.
    #[arg(long, conflicts_with_all = ["file", "json", "transcripts"])]
    pub export: Option<PathBuf>,
    /// Write each scenario's transcript (every call into the policy and its answer) into this
    /// directory as NAME.jsonl, to compare with other hosts'.
    #[arg(long)]
    pub transcripts: Option<PathBuf>,
}

/// A session's idle time: any duration but none (which would end every session at once).
fn session_idle(value: &str) -> Result<Duration, String> {
    let idle = humantime::parse_duration(value).map_err(|error| error.to_string())?;
    if idle.is_zero() {
        return Err("a session must be allowed some idle time".into());
    }
    Ok(idle)
}
