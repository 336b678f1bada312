//! `mcp-fixture`: a fault-injecting MCP server for Tether's integration tests.
//!
//! It serves a small tool set over stdio, Streamable HTTP or the legacy HTTP+SSE transport,
//! and can crash, hang, flap, fail handshakes or change its tools on demand. Every fault is
//! chosen by a command-line flag or, at run time, by `control.json` in the state directory,
//! which also records what happened (starts, initializes, executed calls) across respawns.
//! See `cli.rs` for the flags and exit codes.

mod catalog;
mod cli;
mod fixture;
mod garbage;
mod grandchild;
mod handler;
mod http;
#[path = "../shared/severity.rs"]
mod severity;
mod sse;
mod state;
mod stdio;
mod tools;

use std::{process::ExitCode, sync::Arc};

use clap::Parser;

use crate::{
    cli::{Cli, Transport, exit_code},
    fixture::Fixture,
    state::StateDir,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr only: stdout is the MCP channel for stdio.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();

    let state = match StateDir::open(&cli.state_dir) {
        Ok(state) => state,
        Err(error) => {
            eprintln!(
                "mcp-fixture: state dir {}: {error}",
                cli.state_dir.display()
            );
            return ExitCode::from(1);
        }
    };
    let fixture = match Fixture::start(state, cli.behaviour.clone(), cli.transport) {
        Ok(fixture) => Arc::new(fixture),
        Err(error) => {
            eprintln!("mcp-fixture: start: {error}");
            return ExitCode::from(1);
        }
    };
    if let Some(delay) = fixture.settings().startup_delay_ms {
        std::thread::sleep(std::time::Duration::from_millis(delay));
    }
    // Checked after `starts` is bumped, so tests can count failed spawns too.
    if let Some(code) = fixture.settings().crash_at_startup {
        fixture::exit(code, "crash at startup");
    }

    if fixture.settings().spawn_grandchild
        && let Err(error) = grandchild::spawn(&cli.state_dir, grandchild::Leaves::InGroup)
    {
        eprintln!("mcp-fixture: --spawn-grandchild: {error}");
        return ExitCode::from(exit_code::SERVE_FAILED);
    }
    if fixture.settings().spawn_daemon
        && let Err(error) = grandchild::spawn(&cli.state_dir, grandchild::Leaves::OwnSession)
    {
        eprintln!("mcp-fixture: --spawn-daemon: {error}");
        return ExitCode::from(exit_code::SERVE_FAILED);
    }

    if fixture.settings().stubborn {
        // SAFETY: setting a signal's disposition to ignore runs no code in a handler.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mcp-fixture: tokio runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        tokio::spawn(fixture.clone().watch_control());
        match cli.transport {
            Transport::Stdio => stdio::serve(fixture).await,
            Transport::Http => http::serve(fixture, cli.bind).await,
            Transport::Sse => sse::serve(fixture, cli.bind).await,
        }
    });
    // Don't wait for a blocking stdin read that may never return.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mcp-fixture: {error}");
            ExitCode::from(exit_code::SERVE_FAILED)
        }
    }
}
