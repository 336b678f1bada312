//! The `tether` command line: `serve` runs the gateway; the other commands talk to a running
//! gateway's admin API (see [`crate::admin::client`]); `policy check` runs the conformance suite.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::policy::{PolicySource, conformance};

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "Keeps MCP servers connected for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Supervise the configured servers and serve their healthy tools as one MCP server.
    Serve(ServeArgs),
    /// Show every server's state (from a running gateway).
    Status {
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
    /// Work with policy components.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run the conformance suite against a policy component (default: the embedded policy).
    /// Exits 0 when every scenario passes, 1 when one fails, 2 when the component cannot be used
    /// (it cannot load, or it refuses the settings).
    Check {
        /// The component (.wasm) to check.
        file: Option<PathBuf>,
        /// Settings JSON given to the policy in every scenario.
        #[arg(long, default_value = "{}")]
        settings: String,
        /// Print results as JSON.
        #[arg(long)]
        json: bool,
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
    /// Bearer token (default: from the state file, for that address).
    #[arg(long, env = "TETHER_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The state file `tether serve` wrote.
    #[arg(long)]
    pub state_file: Option<PathBuf>,
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
        value_parser = crate::gateway::parse_allowed_origin
    )]
    pub allow_origin: Vec<String>,
    /// A file holding the bearer token every MCP request over HTTP must carry (or set
    /// TETHER_MCP_TOKEN). Requests without it get 401.
    #[arg(long, value_name = "PATH", requires = "http")]
    pub mcp_token_file: Option<PathBuf>,
    /// Record the policy's every decision (events, admissions, actions) in FILE as JSON lines,
    /// for `tether policy replay`. Holds no secrets (see docs/POLICY-CONTRACT.md).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// How long calls in flight may take to finish once shutdown starts (e.g. "30s", "2m").
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            // rmcp logs every session start and end at info; ours say it better.
            init_logging("info,rmcp=warn");
            crate::serve::main(args)
        }
        Command::Policy {
            command:
                PolicyCommand::Check {
                    file,
                    settings,
                    json,
                },
        } => {
            init_logging("warn");
            policy_check(file, &settings, json)
        }
        Command::Policy {
            command:
                PolicyCommand::Replay {
                    recording,
                    candidate,
                    settings,
                    json,
                },
        } => {
            init_logging("warn");
            policy_replay(&recording, candidate, settings, json)
        }
        command => {
            init_logging("warn");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(admin_command(command))
        }
    }
}

async fn admin_command(command: Command) -> ExitCode {
    use crate::admin::client;
    match command {
        Command::Status { admin } => client::status(&admin).await,
        Command::Events { admin } => client::events(&admin).await,
        Command::Reconnect { name, admin } => client::reconnect(&admin, &name).await,
        Command::Reload { admin } => client::reload(&admin).await,
        Command::Policy {
            command:
                PolicyCommand::Swap {
                    file,
                    from_shadow,
                    force,
                    admin,
                },
        } => match file {
            Some(file) if !from_shadow => client::policy_swap(&admin, &file, force).await,
            _ => client::policy_promote(&admin, force).await,
        },
        Command::Policy {
            command: PolicyCommand::Shadow { file, drop, admin },
        } => client::policy_shadow(&admin, file.as_deref(), drop).await,
        Command::Policy {
            command: PolicyCommand::Set { settings, admin },
        } => client::policy_set(&admin, &settings).await,
        Command::Serve(_)
        | Command::Policy {
            command: PolicyCommand::Check { .. } | PolicyCommand::Replay { .. },
        } => unreachable!("handled in main"),
    }
}

/// Logs go to stderr (stdout may carry MCP); `RUST_LOG` overrides the default level.
fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colours only on a terminal: stderr redirected to a file gets plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn policy_check(file: Option<PathBuf>, settings: &str, json: bool) -> ExitCode {
    let source = file.map_or(PolicySource::Embedded, PolicySource::File);
    // Loading errors (not a component, incompatible version) and settings the policy refuses
    // are reported once, not per scenario.
    let engine = match crate::policy::PolicyEngine::new(None)
        .map_err(|error| error.to_string())
        .and_then(|engine| conformance::preflight(&engine, &source, settings).map(|()| engine))
    {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let results = conformance::run(&engine, &source, settings);
    let failed = results.iter().filter(|r| r.failure.is_some()).count();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).expect("results serialize")
        );
    } else {
        println!("checking {}", source.label());
        for (level, title) in [
            (
                conformance::Level::Contract,
                "the contract (any policy must)",
            ),
            (
                conformance::Level::Invariant,
                "Tether's invariants (a policy may break them on purpose)",
            ),
        ] {
            println!("{title}:");
            let mut passed = 0;
            let mut failed = 0;
            for result in results.iter().filter(|r| r.level == level) {
                match &result.failure {
                    None => {
                        passed += 1;
                        println!("  ok    {}", result.name)
                    }
                    Some(why) => {
                        failed += 1;
                        println!("  FAIL  {}: {why}", result.name)
                    }
                }
            }
            println!("  {passed} passed, {failed} failed");
        }
        println!("{} passed, {failed} failed", results.len() - failed);
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn policy_replay(
    recording: &std::path::Path,
    candidate: Option<PathBuf>,
    settings: Option<String>,
    json: bool,
) -> ExitCode {
    use crate::policy::{PolicyRuntime, RuntimeOptions, record};
    let records = match record::read(recording) {
        Ok(records) => records,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let source = candidate.map_or(PolicySource::Embedded, PolicySource::File);
    let settings = settings
        .or_else(|| record::initial_settings(&records).map(str::to_string))
        .unwrap_or_else(|| "{}".to_string());
    let runtime = match PolicyRuntime::start(RuntimeOptions {
        source: source.clone(),
        settings,
        fallback_to_default: false,
        ..RuntimeOptions::default()
    }) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let report = match record::replay(&records, &runtime) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: the candidate failed during the replay: {error}");
            return ExitCode::from(2);
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
    } else {
        println!(
            "replayed {} decisions of {} against {}: {} differ",
            report.decisions,
            recording.display(),
            source.label(),
            report.divergences
        );
        if report.policy_changes > 0 {
            println!(
                "note: the recording changes policy {} times (swaps or fallbacks); it is compared as recorded",
                report.policy_changes
            );
        }
        for (kind, count) in &report.by_kind {
            println!("  {count:>6}  {kind}");
        }
        for divergence in report.first_per_server.values() {
            println!(
                "first on {} (line {}, {}):\n    recorded:  {}\n    candidate: {}",
                divergence.server,
                divergence.line,
                divergence.kind,
                divergence.recorded,
                divergence.candidate
            );
        }
    }
    if report.divergences == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
