//! The `tether` command line: `serve` runs the gateway on the embedding API ([`tether::Tether`]);
//! the operators' commands talk to a running gateway's admin API ([`client`]); `policy check`
//! and `policy replay` run a policy component here.

mod args;
pub mod auth;
mod client;
mod config_check;
pub mod exit;
mod policy;
mod serve;
mod starter;
pub mod state_file;
pub mod version;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use args::{AuthCommand, Cli, Command, ConfigCommand, PolicyCommand};

/// The allocator the `tether` command runs on, set by its `main.rs`: mimalloc with the
/// `mimalloc` feature (the default), the system's without. A forwarded call allocates and
/// frees a few hundred small blocks (rmcp's messages, hyper's and tokio's per-request state);
/// glibc's allocator spent 18 % of the gateway's instructions a call on them, mimalloc about a
/// third as many (docs/BENCHMARKS.md, section 8). Not set here: a program that links this
/// library (the tests do) keeps its own.
#[cfg(feature = "mimalloc")]
pub type Allocator = mimalloc::MiMalloc;
/// The allocator the `tether` command runs on (the system's: the `mimalloc` feature is off).
#[cfg(not(feature = "mimalloc"))]
pub type Allocator = std::alloc::System;

/// Runs the command line: parses the arguments, runs the command, and says how it ended.
pub fn main() -> ExitCode {
    // The long version names the commit, target, wasmtime and contract lines (built once).
    let long_version: &'static str = Box::leak(version::long().into_boxed_str());
    let matches = Cli::command().long_version(long_version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let logging = cli.logging;
    let init_logging = |default: &str| init_logging(default, logging);
    match cli.command {
        Command::Version { json } => version::print(json),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "tether", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Manpage => {
            let command = Cli::command().long_version(long_version);
            match clap_mangen::Man::new(command).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("error: cannot write the man page: {error}");
                    ExitCode::from(exit::REFUSED)
                }
            }
        }
        Command::Serve(args) => {
            // rmcp logs every session start and end at info; ours say it better.
            init_logging("info,rmcp=warn");
            serve::main(*args)
        }
        Command::Config {
            command: ConfigCommand::Check(args),
        } => {
            init_logging("warn");
            config_check::check(args)
        }
        Command::Policy {
            command: PolicyCommand::Check(args),
        } => {
            init_logging("warn");
            policy::check(args)
        }
        Command::Policy {
            command: PolicyCommand::New { lang, dir },
        } => starter::new(lang, &dir),
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
            policy::replay(&recording, candidate, settings, json)
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
    match command {
        Command::Gateways { json } => client::gateways(json),
        Command::Status { admin } => client::status(&admin).await,
        Command::Tools { admin } => client::tools(&admin).await,
        Command::Dashboard { admin } => client::dashboard(&admin).await,
        Command::Events { admin } => client::events(&admin).await,
        Command::Reconnect { name, admin } => client::reconnect(&admin, &name).await,
        Command::Reload { admin } => client::reload(&admin).await,
        Command::Auth { command } => match command {
            AuthCommand::Login {
                name,
                config,
                scopes,
                no_browser,
            } => auth::login(&config, &name, scopes, no_browser).await,
            AuthCommand::Status { config, json } => auth::status(&config, json),
            AuthCommand::Logout { name, config } => auth::logout(&config, &name).await,
        },
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
        | Command::Version { .. }
        | Command::Completions { .. }
        | Command::Manpage
        | Command::Config { .. }
        | Command::Policy {
            command:
                PolicyCommand::Check(_) | PolicyCommand::New { .. } | PolicyCommand::Replay { .. },
        } => unreachable!("handled in main"),
    }
}

/// The multi-threaded runtime `serve` and `config check` need (a policy loads on it); `None`,
/// said on stderr, when it cannot start.
pub(crate) fn multi_thread_runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            None
        }
    }
}

/// The policy as `serve`'s flags give it, for `serve` and `config check` alike: a component
/// file (else the embedded default), its settings (else the config's), and where compiled
/// components are kept (else the user's cache directory).
pub(crate) fn with_policy(
    mut builder: tether::Builder,
    policy: Option<&std::path::Path>,
    settings: Option<&str>,
    cache_dir: Option<&std::path::Path>,
) -> tether::Builder {
    if let Some(policy) = policy {
        builder = builder.policy(tether::policy::PolicySource::File(policy.to_path_buf()));
    }
    if let Some(settings) = settings {
        builder = builder.policy_settings(settings);
    }
    if let Some(cache_dir) = cache_dir
        .map(std::path::Path::to_path_buf)
        .or_else(default_cache_dir)
    {
        builder = builder.cache_dir(cache_dir);
    }
    builder
}

/// Where compiled policy components are kept: `tether/policies` in the user's cache directory.
pub(crate) fn default_cache_dir() -> Option<std::path::PathBuf> {
    dirs::cache_dir().map(|dir| dir.join("tether").join("policies"))
}

/// Logs go to stderr (stdout may carry MCP). The level is the command's default, moved by
/// `-v`/`-q`; `RUST_LOG` overrides both.
fn init_logging(default_level: &str, logging: args::LogArgs) {
    let level = adjusted_level(default_level, logging.verbose, logging.quiet);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match logging.log_format {
        args::LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
        args::LogFormat::Text => builder
            .with_ansi(colours(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .try_init(),
    };
}

/// The default level moved by `-v` (more) and `-q` (less): `-v` makes Tether's own log debug,
/// `-vv` trace, everything; `-q` errors only, `-qq` nothing.
fn adjusted_level(default_level: &str, verbose: u8, quiet: u8) -> String {
    match (verbose, quiet) {
        (0, 0) => default_level.to_string(),
        (1, _) => "debug,rmcp=info".to_string(),
        (2.., _) => "trace".to_string(),
        (_, 1) => "error".to_string(),
        (_, _) => "off".to_string(),
    }
}

/// Colours only on a terminal (stderr redirected to a file gets plain text), and never when
/// `NO_COLOR` is set to anything but the empty string (no-color.org).
fn colours(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_and_quiet_move_the_level_from_the_commands_default() {
        assert_eq!(adjusted_level("warn", 0, 0), "warn");
        assert_eq!(adjusted_level("warn", 1, 0), "debug,rmcp=info");
        assert_eq!(adjusted_level("warn", 3, 0), "trace");
        assert_eq!(adjusted_level("info", 0, 1), "error");
        assert_eq!(adjusted_level("info", 0, 2), "off");
    }

    #[test]
    fn no_color_turns_colours_off_on_a_terminal() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".as_ref())));
        assert!(!colours(true, Some("1".as_ref())));
        assert!(!colours(false, None));
    }
}
