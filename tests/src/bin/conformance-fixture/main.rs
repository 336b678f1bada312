//! `conformance-fixture`: an MCP server that implements everything the server scenarios of the
//! official conformance suite (`@modelcontextprotocol/conformance` 0.2.0-alpha.12) expect, so
//! the suite can be run against it directly and then through Tether, to prove the gateway is
//! transparent.
//!
//! One Streamable HTTP URL (`/mcp`) serves both wires: 2025-11-25 sessions (initialize,
//! `Mcp-Session-Id`, SSE, server-to-client sampling and elicitation, logging, subscriptions)
//! and 2026-07-28 stateless requests (`server/discover`, per-request `_meta`,
//! `subscriptions/listen`, `InputRequiredResult`). `--stdio` serves one session on
//! stdin/stdout instead, for use as a child process.

mod catalog;
mod content;
mod handler;
mod http;
mod media;
mod mrtr;
#[path = "../shared/severity.rs"]
mod severity;
mod state;
mod tools;

use std::{net::SocketAddr, process::ExitCode, sync::Arc};

use clap::{ArgGroup, Parser};

use crate::state::Shared;

#[derive(Parser, Debug)]
#[command(
    name = "conformance-fixture",
    about = "MCP server implementing what the conformance suite's server scenarios expect",
    group(ArgGroup::new("transport").required(true).args(["http", "stdio"]))
)]
struct Cli {
    /// Serve Streamable HTTP on this address (port 0 picks one); the first line on stdout is
    /// `listening http://ADDR/mcp`.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Serve one session on stdin/stdout.
    #[arg(long)]
    stdio: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr only: stdout is the MCP channel for stdio and the address line for HTTP.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("conformance-fixture: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let shared = Arc::new(Shared::new()?);
    let runtime =
        tokio::runtime::Runtime::new().map_err(|error| format!("tokio runtime: {error}"))?;
    let result = runtime.block_on(async move {
        match cli.http {
            Some(bind) => http::serve(shared, bind).await,
            None => serve_stdio(shared).await,
        }
    });
    // Don't wait for a blocking stdin read that may never return.
    runtime.shutdown_background();
    result
}

/// One session over stdin/stdout until the client closes it.
async fn serve_stdio(shared: Arc<Shared>) -> Result<(), String> {
    use rmcp::{ServiceExt, service::ServerInitializeError};
    let running = match handler::Handler::new(shared)
        .serve(rmcp::transport::stdio())
        .await
    {
        Ok(running) => running,
        // The client went away before initializing: a clean end, not a failure.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(error) => return Err(format!("stdio handshake: {error}")),
    };
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|error| format!("stdio session: {error}"))
}
