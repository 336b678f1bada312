//! `tether serve`: config → policy → supervisor → gateway (and the admin API), until a signal.
//! Shutdown is graceful: no new calls, in-flight calls answered (bounded), every tool
//! withdrawn, every session closed and every child reaped.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ServeArgs;
use crate::config::ServerSpec;
use crate::gateway::Gateway;
use crate::policy::{PolicyRuntime, PolicySource, RuntimeOptions};
use crate::supervisor::{ReloadReport, Supervisor};

/// How long in-flight calls may take to finish once shutdown starts.
const DRAIN: Duration = Duration::from_secs(30);

pub fn main(args: ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    // A blocking read of stdin may still be pending; do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_servers(path: &Path) -> anyhow::Result<(Vec<ServerSpec>, Option<serde_json::Value>)> {
    let loaded = crate::config::file::load(path)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    Ok((loaded.servers, loaded.policy_settings))
}

async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (servers, file_settings) = load_servers(&args.config)?;
    let settings = match (&args.policy_settings, file_settings) {
        (Some(given), _) => given.clone(),
        (None, Some(from_file)) => from_file.to_string(),
        (None, None) => "{}".to_string(),
    };
    let options = RuntimeOptions {
        source: args
            .policy
            .clone()
            .map_or(PolicySource::Embedded, PolicySource::File),
        settings,
        cache_dir: args
            .cache_dir
            .clone()
            .or_else(|| dirs::cache_dir().map(|d| d.join("tether").join("policies"))),
        ..RuntimeOptions::default()
    };
    let policy = tokio::task::spawn_blocking(move || PolicyRuntime::start(options))
        .await
        .context("starting the policy")??;
    let running = policy.running();
    tracing::info!(policy = %running.label, name = %running.name, version = %running.version, "policy loaded");

    let state_file = args
        .state_file
        .clone()
        .unwrap_or_else(crate::admin::state_file::default_path);
    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        state_file
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join("logs")
    });
    let supervisor = Supervisor::start(policy, log_dir.clone());
    for spec in servers {
        supervisor.add_server(spec).map_err(anyhow::Error::msg)?;
    }
    tracing::info!(logs = %log_dir.display(), "supervising {} servers", supervisor.specs().len());

    let metrics = Arc::new(crate::metrics::Metrics::new());
    supervisor.observe_calls(metrics.clone());

    let config_path = args.config.clone();
    let reloader = supervisor.clone();
    let reload: crate::admin::server::ReloadFn = Arc::new(move || {
        let path = config_path.clone();
        let supervisor = reloader.clone();
        Box::pin(async move { reload(&supervisor, &path).await })
    });
    let admin = crate::admin::server::start(
        args.admin,
        args.admin_allow_remote,
        std::env::var("TETHER_ADMIN_TOKEN").ok(),
        crate::admin::server::AdminContext {
            supervisor: supervisor.clone(),
            reload: reload.clone(),
            metrics: metrics.clone(),
        },
    )
    .await
    .context("starting the admin API")?;
    crate::admin::state_file::write(&state_file, admin.addr, &admin.token)
        .with_context(|| format!("writing the state file {}", state_file.display()))?;
    tracing::info!(admin = %admin.addr, state_file = %state_file.display(), "admin API listening");

    // SIGHUP reloads the config file.
    let mut hangups = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let hup_reload = reload.clone();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            if let Err(error) = hup_reload().await {
                tracing::error!("reload refused: {error}");
            }
        }
    });

    let (gateway, _announcer) = Gateway::new(supervisor.clone());
    match args.http {
        Some(bind) => {
            // The listener stops at the signal; open sessions (long-lived event streams) are
            // cut only after the calls in flight were answered.
            let stop_listening = Arc::new(tokio::sync::Notify::new());
            let stopped = stop_listening.clone();
            let (addr, server) = gateway
                .serve_http(bind, async move { stopped.notified().await })
                .await
                .map_err(anyhow::Error::msg)?;
            tracing::info!("serving MCP at http://{addr}/mcp");
            eprintln!(
                "tether: serving MCP at http://{addr}/mcp (admin API at http://{})",
                admin.addr
            );
            shutdown_signal().await;
            stop_listening.notify_one();
            tracing::info!("shutting down: draining in-flight calls");
            supervisor.drain(DRAIN).await;
            server.abort();
        }
        None => {
            tokio::select! {
                result = gateway.serve_stdio() => {
                    if let Err(error) = result {
                        tracing::warn!("{error}");
                    }
                    tracing::info!("the MCP client closed stdin; shutting down");
                }
                _ = shutdown_signal() => {}
            }
        }
    }

    supervisor.drain(DRAIN).await;
    supervisor.shutdown().await;
    admin.shutdown().await;
    crate::admin::state_file::remove(&state_file);
    tracing::info!("all servers stopped");
    Ok(())
}

async fn reload(supervisor: &Supervisor, path: &Path) -> Result<ReloadReport, String> {
    let (servers, _) = load_servers(path).map_err(|e| format!("{e:#}"))?;
    Ok(supervisor.reload(servers).await)
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
