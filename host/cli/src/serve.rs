//! `tether serve`: the embedding API ([`tether::Tether`]) with the config file, the admin API and
//! its state file, MCP over stdio or HTTP, until a signal. Shutdown is the handle's: no new
//! calls, in-flight calls answered (bounded), every tool withdrawn, every session closed and
//! every child reaped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use tether::gateway::{HttpOptions, McpToken};
use tether::{AdminOptions, Tether};

use crate::args::ServeArgs;
use crate::state_file;

/// Where the MCP endpoint's bearer token may come from besides `--mcp-token-file`.
const MCP_TOKEN_ENV: &str = "TETHER_MCP_TOKEN";

pub fn main(args: ServeArgs) -> ExitCode {
    let Some(runtime) = crate::multi_thread_runtime() else {
        return ExitCode::from(crate::exit::REFUSED);
    };
    let result = runtime.block_on(run(args));
    // A blocking read of stdin may still be pending; do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Once: the log goes to stderr too.
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

/// A config, a server or a policy that cannot be used is the operator's to fix (4); anything
/// else failed while serving (1).
fn exit_code(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<tether::Error>() {
        Some(
            tether::Error::Config(_) | tether::Error::Server { .. } | tether::Error::Policy(_),
        ) => crate::exit::CONFIG,
        _ => crate::exit::REFUSED,
    }
}

/// The MCP endpoint's bearer token: from `--mcp-token-file`, else `TETHER_MCP_TOKEN` (never a
/// command-line value: `ps` shows those). Only HTTP has one.
fn mcp_token(args: &ServeArgs) -> anyhow::Result<Option<McpToken>> {
    if args.http.is_none() {
        return Ok(None);
    }
    let from_env = std::env::var_os(MCP_TOKEN_ENV);
    if let Some(path) = &args.mcp_token_file {
        if from_env.is_some() {
            tracing::warn!("{MCP_TOKEN_ENV} is ignored: --mcp-token-file gives the MCP token");
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the MCP token file {}", path.display()))?;
        let token = McpToken::new(text.trim())
            .map_err(|why| anyhow::anyhow!("{why} (in {})", path.display()))?;
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
        if mode & 0o077 != 0 {
            tracing::warn!(
                "the MCP token file {} can be read by other users (mode {:o}); chmod 600 it",
                path.display(),
                mode & 0o777
            );
        }
        return Ok(Some(token));
    }
    match from_env {
        None => Ok(None),
        Some(value) => {
            let value = value
                .into_string()
                .map_err(|_| anyhow::anyhow!("{MCP_TOKEN_ENV} is not valid UTF-8"))?;
            McpToken::new(value.trim())
                .map(Some)
                .map_err(|why| anyhow::anyhow!("{why} (in {MCP_TOKEN_ENV})"))
        }
    }
}

/// Says loudly, in the log and on stderr, that MCP is served beyond this machine.
fn warn_if_exposed(addr: std::net::SocketAddr, token: bool) {
    if addr.ip().to_canonical().is_loopback() {
        return;
    }
    let protection = if token {
        "every request needs the bearer token, which plain HTTP carries in clear: put a TLS proxy in front and firewall the port"
    } else {
        "with no token, anyone who can reach it can call every tool: set --mcp-token-file (or TETHER_MCP_TOKEN), firewall the port and put a TLS proxy in front, or bind 127.0.0.1"
    };
    tracing::warn!(%addr, "serving MCP to the network; {protection}");
    eprintln!(
        "tether: WARNING: --http {addr} is not a loopback address: MCP is served to the network; {protection}"
    );
}

async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // `serve_http` answers any host name on an address beyond loopback.
    let http_options = HttpOptions {
        allowed_origins: args.allow_origin.clone(),
        token: mcp_token(&args)?,
        session_idle: Some(args.session_idle),
        ..HttpOptions::default()
    };
    // An HTTP gateway owns the one default state file; every gateway on stdio (each agent
    // starts its own) gets one of its own.
    let state_file = match (&args.state_file, args.http) {
        (Some(path), _) => path.clone(),
        (None, Some(_)) => state_file::default_path(),
        (None, None) => state_file::stdio_path(std::process::id()),
    };
    // Held until this function returns: a second gateway on this state file is refused.
    let _state_lock = state_file::lock(&state_file)?;
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| match &args.state_file {
            Some(path) => path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
                .join("logs"),
            None => state_file::state_dir().join("logs"),
        });

    let traces = traces(&args)?;
    let mut builder = Tether::builder()
        .token_store(Arc::new(tether::auth::FileTokenStore::new(
            crate::auth::token_dir(),
        )))
        .config_file(&args.config)
        .log_dir(&log_dir)
        .startup_wait(args.startup_wait)
        .admin(AdminOptions {
            bind: args.admin,
            allow_remote: args.admin_allow_remote,
            token: std::env::var("TETHER_ADMIN_TOKEN").ok(),
        });
    builder = builder.build_info(tether::BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("TETHER_COMMIT").to_string(),
        target: env!("TETHER_TARGET").to_string(),
        wasmtime: env!("TETHER_WASMTIME").to_string(),
    });
    if let Some(bind) = args.probes {
        builder = builder.probes(tether::ProbeOptions {
            bind,
            metrics: args.probe_metrics,
            ready_requires_servers: args.ready_requires_servers,
        });
    }
    builder = crate::with_policy(
        builder,
        args.policy.as_deref(),
        args.policy_settings.as_deref(),
        args.cache_dir.as_deref(),
    );
    if let Some(record) = &args.record {
        builder = builder.record(record);
    }
    // A server that first demands authorization opens a login where a person can see it.
    if let Some(browser) = tether::auth::Browser::from_env() {
        builder = builder.browser(browser);
    }
    let tether = builder.start().await?;
    tracing::info!(logs = %log_dir.display(), "logs of stdio servers");

    let admin_addr = tether.admin_addr().expect("the admin API was asked for");
    let admin_token = tether.admin_token().unwrap_or_default();
    let serves = match args.http {
        Some(_) => "http".to_string(),
        None => "stdio".to_string(),
    };
    let config = std::path::absolute(&args.config).unwrap_or_else(|_| args.config.clone());
    if let Err(error) =
        state_file::write(&state_file, admin_addr, admin_token, &serves, Some(&config))
    {
        tether.shutdown(args.drain_timeout).await;
        return Err(error)
            .with_context(|| format!("writing the state file {}", state_file.display()));
    }
    tracing::info!(admin = %admin_addr, state_file = %state_file.display(), "admin API listening");

    let tether = Arc::new(tether);
    // SIGHUP reloads the config file; a reload under way is finished before shutdown starts.
    let stop_reloading = Arc::new(tokio::sync::Notify::new());
    let hup_task = match signal(SignalKind::hangup()) {
        Ok(mut hangups) => {
            let reloader = tether.clone();
            let stop = stop_reloading.clone();
            Some(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        biased;
                        () = stop.notified() => return,
                        received = hangups.recv() => {
                            if received.is_none() {
                                return;
                            }
                            if let Err(error) = reloader.reload().await {
                                tracing::error!("reload refused: {error}");
                            }
                        }
                    }
                }
            }))
        }
        Err(error) => {
            tracing::error!(
                "cannot install the SIGHUP handler (reload with `tether reload`): {error}"
            );
            None
        }
    };

    let served = serve_until_done(&tether, &args, http_options, admin_addr).await;
    stop_reloading.notify_one();
    if let Some(task) = hup_task {
        let _ = task.await;
    }
    // The SIGHUP task has ended: this is the only reference to the handle.
    let tether = Arc::into_inner(tether).expect("the SIGHUP task has ended");
    tether.shutdown(args.drain_timeout).await;
    state_file::remove(&state_file);
    if let Some(traces) = traces {
        // Sends the spans not yet sent (a blocking export).
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    served
}

/// Whether spans are exported: `--otlp-endpoint`, or the standard OpenTelemetry variables
/// (unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`).
#[cfg(feature = "otel")]
fn traces(args: &ServeArgs) -> anyhow::Result<Option<tether::telemetry::Exporting>> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint = args
        .otlp_endpoint
        .as_deref()
        .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')));
    let wanted = endpoint.is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if disabled || !wanted {
        return Ok(None);
    }
    let exporting = tether::telemetry::export(endpoint.as_deref()).map_err(anyhow::Error::msg)?;
    tracing::info!("exporting a trace span per forwarded request over OTLP");
    Ok(Some(exporting))
}

/// Stands for the exporter in a build without one.
#[cfg(not(feature = "otel"))]
struct NoTraces;

#[cfg(not(feature = "otel"))]
impl NoTraces {
    fn shutdown(self) {}
}

/// This build exports no traces: `--otlp-endpoint` is refused.
#[cfg(not(feature = "otel"))]
fn traces(args: &ServeArgs) -> anyhow::Result<Option<NoTraces>> {
    match args.otlp_endpoint {
        Some(_) => anyhow::bail!(
            "this tether was built without the `otel` feature: it cannot export traces"
        ),
        None => Ok(None),
    }
}

/// Serves MCP over HTTP until SIGINT or SIGTERM, or over stdio until the client leaves or a
/// signal comes.
async fn serve_until_done(
    tether: &Tether,
    args: &ServeArgs,
    http_options: HttpOptions,
    admin_addr: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let has_token = http_options.token.is_some();
    let mut served = Ok(());
    match args.http {
        Some(bind) => {
            let addr = tether.serve_http(bind, http_options).await?;
            warn_if_exposed(addr, has_token);
            tracing::info!(token = has_token, "serving MCP at http://{addr}/mcp");
            eprintln!(
                "tether: serving MCP at http://{addr}/mcp (admin API at http://{admin_addr})"
            );
            shutdown_signal().await;
        }
        None => {
            // Its own task, so it keeps answering while calls drain.
            let session = tether.serve_stdio();
            tokio::select! {
                result = session => match result {
                    Ok(Ok(())) => tracing::info!("the MCP client closed stdin; shutting down"),
                    // Whoever started Tether learns it from the exit code, after the shutdown.
                    Ok(Err(error)) => served = Err(anyhow::anyhow!(error)),
                    Err(error) => {
                        served = Err(anyhow::anyhow!("the MCP session on stdin ended: {error}"))
                    }
                },
                _ = shutdown_signal() => {}
            }
        }
    }
    served
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::error!("cannot install the SIGTERM handler: {error}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
    }
}
