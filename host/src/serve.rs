//! `tether serve`: config → policy → supervisor → gateway (and the admin API), until a signal.
//! Shutdown is graceful: no new calls, in-flight calls answered (bounded), every tool
//! withdrawn, every session closed and every child reaped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ServeArgs;
use crate::config::ServerSpec;
use crate::gateway::{Gateway, HttpOptions, McpToken};
use crate::policy::{PolicyRuntime, PolicySource, RuntimeOptions};
use crate::supervisor::{ReloadReport, Supervisor};

/// Where the MCP endpoint's bearer token may come from besides `--mcp-token-file`.
const MCP_TOKEN_ENV: &str = "TETHER_MCP_TOKEN";
/// Once the drain is over and the servers are stopped, how long the last answers (calls that
/// failed because their server stopped) may take to reach HTTP clients.
const ANSWER_GRACE: Duration = Duration::from_secs(3);

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

/// How the gateway meets its agent.
enum Front {
    Http(crate::gateway::HttpServer),
    Stdio(tokio::task::JoinHandle<Result<(), String>>),
}

async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let http_options = HttpOptions {
        allowed_origins: args.allow_origin.clone(),
        token: mcp_token(&args)?,
    };
    let state_file = args
        .state_file
        .clone()
        .unwrap_or_else(crate::admin::state_file::default_path);
    // Held until this function returns: a second gateway on this state file is refused.
    let _state_lock = crate::admin::state_file::lock(&state_file)?;

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
        record: args.record.clone(),
        ..RuntimeOptions::default()
    };
    let policy = tokio::task::spawn_blocking(move || PolicyRuntime::start(options))
        .await
        .context("starting the policy")??;
    let running = policy.running();
    tracing::info!(policy = %running.label, name = %running.name, version = %running.version, "policy loaded");

    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        state_file
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join("logs")
    });
    check_with_policy(&policy, &servers, &args.config)
        .await
        .map_err(anyhow::Error::msg)?;
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
    let has_token = http_options.token.is_some();
    let mut front = match args.http {
        Some(bind) => {
            let server = gateway
                .serve_http(bind, http_options)
                .await
                .map_err(anyhow::Error::msg)?;
            let addr = server.addr;
            warn_if_exposed(addr, has_token);
            tracing::info!(token = has_token, "serving MCP at http://{addr}/mcp");
            eprintln!(
                "tether: serving MCP at http://{addr}/mcp (admin API at http://{})",
                admin.addr
            );
            Front::Http(server)
        }
        // Its own task, so it keeps answering while calls drain.
        None => Front::Stdio(tokio::spawn(gateway.serve_stdio())),
    };
    match &mut front {
        Front::Http(_) => shutdown_signal().await,
        Front::Stdio(session) => tokio::select! {
            result = session => {
                if let Ok(Err(error)) = result {
                    tracing::warn!("{error}");
                }
                tracing::info!("the MCP client closed stdin; shutting down");
            }
            _ = shutdown_signal() => {}
        },
    }

    // No new connections or calls; calls in flight get `drain_timeout` to finish (the only
    // wait for them), then every server stops, which ends the calls still running with an
    // answer that says so.
    if let Front::Http(server) = &front {
        server.stop_accepting();
    }
    tracing::info!(within = ?args.drain_timeout, "shutting down: draining in-flight calls");
    supervisor.drain(args.drain_timeout).await;
    supervisor.shutdown().await;
    match front {
        // Open sessions (long-lived event streams) are cut only after the last answers left.
        Front::Http(server) => server.close(ANSWER_GRACE).await,
        Front::Stdio(session) => session.abort(),
    }
    admin.shutdown().await;
    crate::admin::state_file::remove(&state_file);
    tracing::info!("all servers stopped");
    Ok(())
}

async fn reload(supervisor: &Supervisor, path: &Path) -> Result<ReloadReport, String> {
    let (servers, _) = load_servers(path).map_err(|e| format!("{e:#}"))?;
    check_with_policy(supervisor.policy(), &servers, path).await?;
    Ok(supervisor.reload(servers).await)
}

/// Per-server policy overrides and tool filters are the policy's to judge: each server that
/// has any is shown to the running policy (on a scratch instance) when the file is read, so
/// an invalid one is an error naming the file and the server, not a server parked later.
async fn check_with_policy(
    policy: &PolicyRuntime,
    servers: &[ServerSpec],
    file: &Path,
) -> Result<(), String> {
    for spec in servers {
        if spec.policy_settings.is_none() && spec.include.is_empty() && spec.exclude.is_empty() {
            continue;
        }
        match policy.check_server(spec.policy_config()).await {
            Ok(None) => {}
            Ok(Some(reason)) => {
                return Err(format!(
                    "{}: server `{}`: the policy refuses its configuration (keys `policy`, \
                     `include`, `exclude`): {reason}",
                    file.display(),
                    spec.name
                ));
            }
            Err(error) => {
                return Err(format!(
                    "{}: server `{}`: the policy could not check its configuration: {error}",
                    file.display(),
                    spec.name
                ));
            }
        }
    }
    Ok(())
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
