//! Tether inside another program: [`Tether::builder`] says what to supervise and how, and the
//! [`Tether`] it starts is the handle to everything a running gateway offers (status, reload,
//! reconnect, policy swaps, MCP over stdio, HTTP or any rmcp transport, and an orderly shutdown).
//! The `tether` command line is built on exactly this.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};

use crate::admin::probes::{ProbeOptions, ProbeServer};
use crate::admin::{AdminContext, AdminServer};
use crate::auth::{AuthContext, Browser, MemoryTokenStore, TokenStore};
use crate::config::ServerSpec;
use crate::error::{Error, Result, ServerProblem};
use crate::events::{Event, Feed};
use crate::gateway::{Gateway, HttpOptions, HttpServer, McpEndpoint};
use crate::metrics::Metrics;
use crate::policy::{PolicyRuntime, PolicySource, ReconnectSource, RuntimeOptions, SwapReport};
use crate::status::Status;
use crate::supervisor::{ReloadReport, Supervisor};

/// Once the drain is over and the servers are stopped, how long the last answers (calls that
/// failed because their server stopped) may take to reach HTTP clients.
const ANSWER_GRACE: Duration = Duration::from_secs(3);
/// How long the observer may take over the last events at shutdown.
const OBSERVER_GRACE: Duration = Duration::from_secs(5);

/// Called with every [`Event`] on a task of its own.
type Observer = Arc<dyn Fn(&Event) + Send + Sync>;

/// Where and how the admin API listens (it is off unless asked for).
#[derive(Debug, Clone)]
pub struct AdminOptions {
    /// The address (port 0: any free port; see [`Tether::admin_addr`]).
    pub bind: SocketAddr,
    /// Allow a non-loopback address (anyone who can reach it with the token controls Tether).
    pub allow_remote: bool,
    /// The bearer token requests must carry; `None` generates one ([`Tether::admin_token`]).
    pub token: Option<String>,
}

/// What to supervise and how; [`Builder::start`] starts it.
#[must_use]
pub struct Builder {
    config_file: Option<PathBuf>,
    servers: Vec<ServerSpec>,
    policy: PolicySource,
    policy_settings: Option<String>,
    cache_dir: Option<PathBuf>,
    log_dir: Option<PathBuf>,
    record: Option<PathBuf>,
    observer: Option<Observer>,
    admin: Option<AdminOptions>,
    probes: Option<ProbeOptions>,
    build_info: Option<crate::metrics::BuildInfo>,
    startup_wait: Duration,
    token_store: Option<Arc<dyn TokenStore>>,
    browser: Option<Browser>,
}

/// How long lists and calls wait, at most, for the servers configured at start
/// ([`Builder::startup_wait`]).
pub const DEFAULT_STARTUP_WAIT: Duration = Duration::from_secs(5);

impl Builder {
    /// How long, at most, the first lists and calls wait for the servers configured at start
    /// to connect or fail their first attempt (default [`DEFAULT_STARTUP_WAIT`]; zero: never),
    /// so that a client that lists once when it starts does not get an empty list.
    pub fn startup_wait(mut self, wait: Duration) -> Self {
        self.startup_wait = wait;
        self
    }

    /// Servers (and default policy settings, the file's `policy`) from a config file:
    /// `mcpServers` JSON, VS Code `mcp.json` or Tether TOML. [`Tether::reload`] re-reads it.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    /// A server from code (after those of the config file, if any).
    pub fn server(mut self, spec: ServerSpec) -> Self {
        self.servers.push(spec);
        self
    }

    /// The policy component (default: the embedded default policy).
    pub fn policy(mut self, source: PolicySource) -> Self {
        self.policy = source;
        self
    }

    /// The policy's settings, a JSON object (default: the config file's `policy`, else `{}`).
    pub fn policy_settings(mut self, json: impl Into<String>) -> Self {
        self.policy_settings = Some(json.into());
        self
    }

    /// A directory to keep compiled policy components in, so later starts skip compiling
    /// (default: none, every start compiles).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Where stdio servers' stderr logs go (default: `tether/logs` in the user's state
    /// directory).
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Record every policy decision in `file` as JSON lines (for `tether policy replay`).
    pub fn record(mut self, file: impl Into<PathBuf>) -> Self {
        self.record = Some(file.into());
        self
    }

    /// Calls `observer` with every lifecycle change, tool list change and policy notice (each
    /// kind in order; see [`crate::events`]), on a task of its own, up to the last ones of
    /// [`Tether::shutdown`] (not of a failed [`Builder::start`]). Keep it quick: a slow observer
    /// misses events, and is then told how many with [`Event::Lagged`]; one that never returns
    /// keeps its task running after shutdown.
    pub fn observer(mut self, observer: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// What `tether_build_info` says of this build (default: the library's version, the rest
    /// `unknown`): a binary built on the library names its commit, target and wasmtime.
    pub fn build_info(mut self, info: crate::metrics::BuildInfo) -> Self {
        self.build_info = Some(info);
        self
    }

    /// Serve probes for an orchestrator, without a token: `/livez`, `/readyz` and, when asked,
    /// `/metrics` ([`ProbeOptions`]).
    pub fn probes(mut self, options: ProbeOptions) -> Self {
        self.probes = Some(options);
        self
    }

    /// Serve the admin API (what the `tether` CLI's `status`, `reload`, `policy swap` … use).
    pub fn admin(mut self, options: AdminOptions) -> Self {
        self.admin = Some(options);
        self
    }

    /// Where the tokens of servers that use OAuth are kept (default: in memory, for this run
    /// only). The `tether` command keeps them in files under its state directory.
    pub fn token_store(mut self, store: Arc<dyn TokenStore>) -> Self {
        self.token_store = Some(store);
        self
    }

    /// The browser a login opens when a server first demands authorization (default: none;
    /// then only [`crate::auth::Authorizer::login`], e.g. `tether auth login`, authorizes).
    pub fn browser(mut self, browser: Browser) -> Self {
        self.browser = Some(browser);
        self
    }

    /// Everything [`Builder::start`] would refuse, found without starting anything: reads the
    /// config, checks the server names, loads the policy with its settings and shows it each
    /// server's configuration. No server is started, nothing listens and nothing is recorded.
    /// Must run inside a multi-threaded tokio runtime.
    pub async fn check(mut self) -> Result<CheckedConfig> {
        self.record = None;
        let Prepared {
            servers,
            policy,
            warnings,
            ..
        } = self.prepare().await?;
        let running = policy.running();
        Ok(CheckedConfig {
            servers: servers
                .iter()
                .map(|spec| CheckedServer {
                    name: spec.name.clone(),
                    transport: crate::transport::kind_words(spec.transport.kind()).to_string(),
                })
                .collect(),
            policy: CheckedPolicy {
                label: running.label.clone(),
                name: running.name.clone(),
                version: running.version.clone(),
                contract: running.contract.to_string(),
            },
            warnings,
        })
    }

    /// The servers, the running policy and the config file's warnings, each checked as
    /// [`Builder::check`] says; what `start` and `check` share.
    async fn prepare(&mut self) -> Result<Prepared> {
        let mut servers = Vec::new();
        let origin = self
            .config_file
            .as_ref()
            .map_or_else(|| "config".to_string(), |f| f.display().to_string());
        let mut file_settings = None;
        let mut warnings = Vec::new();
        let mut disabled = Vec::new();
        if let Some(path) = &self.config_file {
            let loaded = load_config(path)?;
            servers = loaded.servers;
            file_settings = loaded.policy_settings;
            warnings = loaded.warnings;
            disabled = loaded.disabled;
        }
        // Kept for reloads too: servers given in code are not the file's to remove.
        servers.extend(self.servers.iter().cloned());
        // Before anything starts: a bad list starts nothing.
        check_names(&servers, &origin)?;
        let settings_given = self.policy_settings.is_some();
        let settings = match (self.policy_settings.take(), &file_settings) {
            (Some(given), _) => given,
            (None, Some(from_file)) => from_file.to_string(),
            (None, None) => "{}".to_string(),
        };
        let options = RuntimeOptions {
            source: std::mem::replace(&mut self.policy, PolicySource::Embedded),
            settings,
            cache_dir: self.cache_dir.clone(),
            record: self.record.take(),
            ..RuntimeOptions::default()
        };
        let policy = tokio::task::spawn_blocking(move || PolicyRuntime::start(options))
            .await
            .map_err(|e| Error::Task {
                what: "starting the policy",
                cause: e.to_string(),
            })??;
        let running = policy.running();
        tracing::info!(policy = %running.label, name = %running.name, version = %running.version, "policy loaded");
        check_with_policy(&policy, &servers, self.config_file.as_deref(), None).await?;
        Ok(Prepared {
            servers,
            policy,
            warnings,
            disabled,
            file_settings,
            settings_given,
        })
    }

    /// Loads the config and the policy, checks every server's settings with the policy, and
    /// starts supervising. Must run inside a multi-threaded tokio runtime.
    pub async fn start(mut self) -> Result<Tether> {
        let Prepared {
            servers,
            policy,
            disabled,
            file_settings,
            settings_given,
            ..
        } = self.prepare().await?;

        let log_dir = self.log_dir.unwrap_or_else(default_log_dir);
        let supervisor = Supervisor::start(policy, log_dir);
        supervisor.begin_startup(self.startup_wait);
        supervisor.set_disabled(&disabled);
        let mut auth = AuthContext::new(
            self.token_store
                .unwrap_or_else(|| Arc::new(MemoryTokenStore::default())),
        );
        auth.browser = self.browser;
        supervisor.use_authorization(Arc::new(auth));
        // Subscribed before the first server starts: the observer hears everything.
        let observer_task = self.observer.map(|observer| {
            let mut feed = Feed::new(&supervisor);
            let stop = Arc::new(tokio::sync::Notify::new());
            let stopping = stop.clone();
            let task = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        biased;
                        event = feed.next() => match event {
                            Some(event) => observer(&event),
                            None => return,
                        },
                        () = stopping.notified() => {
                            while let Some(event) = feed.try_next() {
                                observer(&event);
                            }
                            return;
                        }
                    }
                }
            });
            (task, stop)
        });
        let metrics = Arc::new(Metrics::with_build(self.build_info.unwrap_or_default()));
        supervisor.observe_calls(metrics.clone());
        let (gateway, announcer) = Gateway::new(supervisor.clone());
        let mut tether = Tether {
            supervisor,
            gateway,
            announcer,
            observer_task,
            reloads: Arc::new(Reloads {
                config_file: self.config_file,
                given_servers: self.servers,
                settings_given,
                file_settings: Mutex::new(file_settings),
            }),
            admin: None,
            probes: None,
            fronts: Mutex::default(),
        };
        // Recorded from before the first server is added: the dashboard shows how each started.
        let history = self
            .admin
            .as_ref()
            .map(|_| crate::admin::history::History::record(&tether.supervisor));
        for spec in servers {
            if let Err(problem) = tether.supervisor.add_server(spec) {
                tether.abandon().await;
                return Err(Error::Server {
                    origin: "config".into(),
                    problems: vec![problem],
                });
            }
        }
        tracing::info!("supervising {} servers", tether.supervisor.specs().len());
        if let Some(options) = self.probes {
            let bind = options.bind;
            match crate::admin::probes::start(options, tether.supervisor.clone(), metrics.clone())
                .await
            {
                Ok(probes) => tether.probes = Some(probes),
                Err(cause) => {
                    tether.abandon().await;
                    return Err(Error::Listen { addr: bind, cause });
                }
            }
        }
        if let (Some(admin), Some(history)) = (self.admin, history) {
            let reload = tether.reload_fn();
            let started = crate::admin::start(
                admin.bind,
                admin.allow_remote,
                admin.token,
                AdminContext {
                    supervisor: tether.supervisor.clone(),
                    reload,
                    metrics,
                    history,
                },
            )
            .await;
            match started {
                Ok(server) => tether.admin = Some(server),
                Err(error) => {
                    tether.abandon().await;
                    return Err(error.into());
                }
            }
        }
        Ok(tether)
    }
}

/// A running Tether: supervised servers, their policy, and the MCP service over them.
/// [`Tether::shutdown`] stops it in order; dropping it without that leaves servers running
/// until the process ends.
pub struct Tether {
    supervisor: Supervisor,
    gateway: Gateway,
    announcer: JoinHandle<()>,
    /// The observer's task, and what tells it to hear the last events and end.
    observer_task: Option<(JoinHandle<()>, Arc<tokio::sync::Notify>)>,
    reloads: Arc<Reloads>,
    admin: Option<AdminServer>,
    probes: Option<ProbeServer>,
    fronts: Mutex<Vec<Front>>,
}

/// How agents reach this Tether, ended at shutdown.
enum Front {
    Http(HttpServer),
    Mounted(McpEndpoint),
    Stdio(AbortHandle),
}

impl Tether {
    /// Starts describing a Tether.
    pub fn builder() -> Builder {
        Builder {
            config_file: None,
            servers: Vec::new(),
            policy: PolicySource::Embedded,
            policy_settings: None,
            cache_dir: None,
            log_dir: None,
            record: None,
            observer: None,
            admin: None,
            probes: None,
            build_info: None,
            startup_wait: DEFAULT_STARTUP_WAIT,
            token_store: None,
            browser: None,
        }
    }

    /// Every server's state and the running policy, as the admin API's `GET /status` has it.
    pub async fn status(&self) -> Status {
        Status::collect(&self.supervisor).await
    }

    /// Re-reads the config file: starts added servers, stops removed ones, restarts changed
    /// ones; the others keep their sessions. A bad file changes nothing.
    pub async fn reload(&self) -> Result<ReloadReport> {
        reload_file(&self.supervisor, &self.reloads).await
    }

    /// Supervises exactly `servers` from now on, as [`Tether::reload`] does with a file's.
    pub async fn reload_servers(&self, servers: Vec<ServerSpec>) -> Result<ReloadReport> {
        let _turn = self.supervisor.reload_turn().await;
        check_names(&servers, "config")?;
        check_with_policy(self.supervisor.policy(), &servers, None, None).await?;
        Ok(self.supervisor.reload(servers).await)
    }

    /// Asks the policy to reconnect `server` now (this revives a parked server).
    pub fn reconnect(&self, server: &str) -> Result<()> {
        if self
            .supervisor
            .request_reconnect(server, ReconnectSource::Operator)
        {
            Ok(())
        } else {
            Err(Error::UnknownServer(server.to_string()))
        }
    }

    /// Replaces the policy, keeping its state and every live session. Unlike the admin API,
    /// this does not run the conformance suite first (see [`crate::policy::conformance`]).
    pub async fn swap_policy(&self, source: PolicySource) -> Result<SwapReport> {
        Ok(self.supervisor.swap_policy(source).await?)
    }

    /// Gives the running policy new settings (a JSON object), keeping its state.
    pub async fn set_policy_settings(&self, json: impl Into<String>) -> Result<()> {
        let _turn = self.supervisor.reload_turn().await;
        Ok(self.supervisor.policy().set_settings(json.into()).await?)
    }

    /// The MCP service: an rmcp `ServerHandler` to serve over any rmcp transport (each clone
    /// is one downstream session).
    pub fn gateway(&self) -> Gateway {
        self.gateway.clone()
    }

    /// Serves one MCP session over this process's stdin and stdout, on a task of its own. It
    /// ends when the client closes stdin, or at [`Tether::shutdown`].
    pub fn serve_stdio(&self) -> JoinHandle<Result<()>> {
        let session = tokio::spawn(self.gateway().serve_stdio());
        self.front(Front::Stdio(session.abort_handle()));
        session
    }

    /// Serves Streamable HTTP at `http://BIND/mcp` and returns the address bound.
    pub async fn serve_http(&self, bind: SocketAddr, options: HttpOptions) -> Result<SocketAddr> {
        let server = self.gateway().serve_http(bind, options).await?;
        let addr = server.addr;
        self.front(Front::Http(server));
        Ok(addr)
    }

    /// The Streamable HTTP endpoint as an axum router serving `/mcp`, to merge into the
    /// embedder's own router. It answers requests addressed to loopback names only, unless
    /// `options.hosts` is [`Hosts::Any`](crate::gateway::Hosts::Any) (for a listener beyond
    /// loopback).
    /// Its sessions end at [`Tether::shutdown`]. Serve the final router with
    /// `axum::serve(listener, router.into_make_service())`: served as it is, axum rebuilds a
    /// router for every connection it accepts.
    pub fn http_router(&self, options: HttpOptions) -> axum::Router {
        let (router, endpoint) = self.gateway().http_router(options);
        self.front(Front::Mounted(endpoint));
        router
    }

    /// The probe listener's address, when it runs.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probes.as_ref().map(|probes| probes.addr)
    }

    /// The admin API's address, when it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|admin| admin.addr)
    }

    /// The admin API's bearer token, when it runs.
    pub fn admin_token(&self) -> Option<&str> {
        self.admin.as_ref().map(|admin| admin.token.as_str())
    }

    /// Lifecycle changes, tool list changes and policy notices from now on, as the observer
    /// hears them (see [`Builder::observer`]): `.next().await` each.
    pub fn events(&self) -> Feed {
        Feed::new(&self.supervisor)
    }

    /// The supervisor underneath (Tether's own tests only).
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Stops in order: no new MCP connections or calls; calls in flight get `drain` to finish;
    /// then every server stops (its tools withdrawn, its session closed, its child reaped), the
    /// last answers go out, and the MCP sessions and the admin API close.
    pub async fn shutdown(self, drain: Duration) {
        let fronts = std::mem::take(&mut *self.fronts.lock().unwrap_or_else(|e| e.into_inner()));
        for front in &fronts {
            if let Front::Http(server) = front {
                server.stop_accepting();
            }
        }
        // Not ready from here on: the orchestrator stops sending traffic.
        if let Some(probes) = self.probes {
            probes.shutdown().await;
        }
        tracing::info!(within = ?drain, "shutting down: draining in-flight calls");
        self.supervisor.drain(drain).await;
        self.supervisor.shutdown().await;
        for front in fronts {
            match front {
                // Open sessions (long-lived event streams) are cut only after the last answers.
                Front::Http(server) => server.close(ANSWER_GRACE).await,
                Front::Mounted(endpoint) => endpoint.close(ANSWER_GRACE).await,
                Front::Stdio(session) => session.abort(),
            }
        }
        if let Some(admin) = self.admin {
            admin.shutdown().await;
        }
        if let Some((mut task, stop)) = self.observer_task {
            stop.notify_one();
            if tokio::time::timeout(OBSERVER_GRACE, &mut task)
                .await
                .is_err()
            {
                tracing::warn!("the observer is still busy after {OBSERVER_GRACE:?}; dropping it");
                task.abort();
            }
        }
        self.announcer.abort();
        tracing::info!("all servers stopped");
    }

    /// Undoes a start that failed part way: servers stopped, tasks ended.
    async fn abandon(&mut self) {
        self.supervisor.shutdown().await;
        if let Some((task, _)) = self.observer_task.take() {
            task.abort();
        }
        self.announcer.abort();
    }

    fn front(&self, front: Front) {
        self.fronts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(front);
    }

    fn reload_fn(&self) -> crate::admin::server::ReloadFn {
        let supervisor = self.supervisor.clone();
        let reloads = self.reloads.clone();
        Arc::new(move || {
            let supervisor = supervisor.clone();
            let reloads = reloads.clone();
            Box::pin(async move { reload_file(&supervisor, &reloads).await })
        })
    }
}

/// Every server needs a valid name of its own; `origin` says where the list came from.
fn check_names(servers: &[ServerSpec], origin: &str) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    let mut problems = Vec::new();
    for spec in servers {
        let server = spec.name.clone();
        if let Some(why) = ServerSpec::name_problem(&spec.name) {
            problems.push(ServerProblem::BadName { server, why });
        } else if !seen.insert(spec.name.as_str()) {
            problems.push(ServerProblem::Duplicate { server });
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(Error::Server {
            origin: origin.to_string(),
            problems,
        }),
    }
}

/// What [`Builder::prepare`] found: the servers to supervise, the running policy, the config
/// file's warnings and the servers it disables.
struct Prepared {
    servers: Vec<ServerSpec>,
    policy: PolicyRuntime,
    warnings: Vec<String>,
    disabled: Vec<String>,
    /// The file's top-level `policy`.
    file_settings: Option<serde_json::Value>,
    /// Whether the policy settings were given in code (they win over the file's).
    settings_given: bool,
}

/// What a reload of the config file works from.
struct Reloads {
    config_file: Option<PathBuf>,
    /// The servers the builder was given in code: a reload of the file keeps them.
    given_servers: Vec<ServerSpec>,
    /// Policy settings given in code (`--policy-settings`) win over the file's, as at the start.
    settings_given: bool,
    /// The file's top-level `policy` as last read. A reload applies the file's settings only
    /// when they changed since, so settings changed at runtime (the admin API) stay until the
    /// file changes them.
    file_settings: Mutex<Option<serde_json::Value>>,
}

fn default_log_dir() -> PathBuf {
    dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|home| home.join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tether")
        .join("logs")
}

fn load_config(path: &Path) -> Result<crate::config::file::LoadedConfig> {
    let loaded = crate::config::file::load(path)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    Ok(loaded)
}

/// The file's servers and those given in code, as at the start; a server disabled in the
/// file keeps its tokens. The file's top-level `policy`, when it changed, is checked (and the
/// servers' settings with it) on scratch instances before the policy gets it: anything
/// refused changes nothing.
async fn reload_file(supervisor: &Supervisor, reloads: &Reloads) -> Result<ReloadReport> {
    let path = reloads.config_file.as_deref().ok_or(Error::NoConfigFile)?;
    let _turn = supervisor.reload_turn().await;
    let loaded = load_config(path)?;
    let mut servers = loaded.servers;
    servers.extend(reloads.given_servers.iter().cloned());
    check_names(&servers, &path.display().to_string())?;
    let mut warnings = loaded.warnings;
    let policy = supervisor.policy();
    // No table and an empty one say the same.
    let as_given = |settings: &Option<serde_json::Value>| {
        settings
            .as_ref()
            .map_or_else(|| "{}".to_string(), |settings| settings.to_string())
    };
    let settings = as_given(&loaded.policy_settings);
    let changed = as_given(
        &reloads
            .file_settings
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    ) != settings;
    let refused = |cause| Error::Settings {
        origin: path.display().to_string(),
        cause,
    };
    let new_settings = match changed {
        true if reloads.settings_given => {
            warnings.push(format!(
                "{}: the top-level `policy` changed and is not used: the policy settings were given on the command line or in code",
                path.display()
            ));
            None
        }
        true => {
            policy
                .check_settings(settings.clone())
                .await
                .map_err(refused)?;
            Some(settings)
        }
        false => None,
    };
    check_with_policy(policy, &servers, Some(path), new_settings.clone()).await?;
    let policy_settings_changed = new_settings.is_some();
    if let Some(settings) = new_settings {
        policy.set_settings(settings).await.map_err(refused)?;
    }
    *reloads
        .file_settings
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = loaded.policy_settings;
    let mut report = supervisor.reload_keeping(servers, &loaded.disabled).await;
    report.policy_settings_changed = policy_settings_changed;
    report.warnings = warnings;
    Ok(report)
}

/// Per-server policy overrides and tool filters are the policy's to judge: each server that
/// has any is shown to the running policy (on a scratch instance, with `settings` when they
/// are about to change) before it is supervised, so an invalid one is an error naming the file
/// and the server, not a server parked later.
async fn check_with_policy(
    policy: &PolicyRuntime,
    servers: &[ServerSpec],
    file: Option<&Path>,
    settings: Option<String>,
) -> Result<()> {
    let origin = file.map_or_else(|| "config".to_string(), |f| f.display().to_string());
    // Every server is shown: the operator fixes all of them in one go.
    let mut problems = Vec::new();
    for spec in servers {
        if spec.policy_settings.is_none() && spec.include.is_empty() && spec.exclude.is_empty() {
            continue;
        }
        let server = spec.name.clone();
        match policy
            .check_server(spec.policy_config(), settings.clone())
            .await
        {
            Ok(None) => {}
            Ok(Some(reason)) => problems.push(ServerProblem::RefusedByPolicy { server, reason }),
            Err(error) => problems.push(ServerProblem::Unchecked { server, error }),
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(Error::Server { origin, problems }),
    }
}

/// What [`Builder::check`] found: the servers and the policy [`Builder::start`] would run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckedConfig {
    /// The servers, in the config's order.
    pub servers: Vec<CheckedServer>,
    /// The policy, which accepted its settings and every server's configuration.
    pub policy: CheckedPolicy,
    /// What the config file says that Tether ignores (unknown keys, and the like).
    pub warnings: Vec<String>,
}

/// A server [`Builder::check`] found usable.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckedServer {
    /// Its name.
    pub name: String,
    /// How it is reached: `stdio`, `Streamable HTTP` or `SSE`.
    pub transport: String,
}

/// The policy [`Builder::check`] loaded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckedPolicy {
    /// Where it comes from (a file, or the embedded default).
    pub label: String,
    /// Its name and version, as it says.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The contract version it speaks.
    pub contract: String,
}
