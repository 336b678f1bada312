//! The `tether` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Work with policy components.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run the conformance suite against a policy component (default: the embedded policy).
    /// Exits 0 when every scenario passes, 1 when one fails, 2 when the component cannot load.
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
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging("warn");
    match cli.command {
        Command::Policy {
            command:
                PolicyCommand::Check {
                    file,
                    settings,
                    json,
                },
        } => policy_check(file, &settings, json),
    }
}

/// Logs go to stderr (stdout may carry MCP); `RUST_LOG` overrides the default level.
fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn policy_check(file: Option<PathBuf>, settings: &str, json: bool) -> ExitCode {
    let source = file.map_or(PolicySource::Embedded, PolicySource::File);
    // Loading errors (not a component, incompatible version) are reported once, not per scenario.
    let engine = match crate::policy::PolicyEngine::new(None)
        .and_then(|engine| engine.load(&source).map(|_| engine))
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
        for result in &results {
            match &result.failure {
                None => println!("  ok    {}", result.name),
                Some(why) => println!("  FAIL  {}: {why}", result.name),
            }
        }
        println!("{} passed, {failed} failed", results.len() - failed);
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
