//! Supervision. One task per configured server turns what it observes (a session opened or
//! failed, ended, answered a keepalive, changed its tools; a timer fired) into policy events.
//! Events go straight to the policy runtime, in the same order as admissions (decided inline or
//! queued, so a call's report always counts before the next admission), and each decision's
//! actions run as soon as it is made, in decision order: connect/disconnect/wake-at go back to
//! the server's task, publish/withdraw go to the registry and show or hide the server's prompts
//! and resources in the catalog.
//!
//! Each server's task (`task.rs`) is the IO around a sans-IO lifecycle (`lifecycle.rs`): what
//! it observes goes in with the host's time, effects come out (open through the `connector.rs`
//! [`Connector`], close, probe, feed the policy).
//!
//! Follow one failure: the child dies → its task sees the session end → its lifecycle says
//! close it and feed `Disconnected(process exited)` → the policy decides, and its actions run at
//! once: `WithdrawTools` (the registry drops the routes and broadcasts the change) and `WakeAt`
//! (the lifecycle's timer) → `Timer` → `Connect` → a new session → `Connected` → `PublishTools`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rmcp::model::{CallToolResponse, JsonObject};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::auth::{AuthContext, Authorizer};
use crate::calls::{CallError, CallHost, CallObserver, Calls, Sessions};
use crate::catalog::Catalog;
use crate::config::ServerSpec;
use crate::error::ServerProblem;
use crate::policy::{
    Action, Admission, CallRequest, Event, EventKind, PolicyError, PolicyRuntime, PolicySource,
    ServerState, ServerStatus, StateChange, SwapReport, TransportKind,
};
use crate::registry::{Registry, Route};
use crate::upstream::{CallContext, ServerEvent, Session};

mod connector;
mod lifecycle;
mod startup;
mod task;

// The seam between supervision and sessions: public for Tether's own tests (a fake connector
// in virtual time), not part of the API (its types come from the hidden `upstream` module).
#[doc(hidden)]
pub use connector::{Connector, Link, Upstream};
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub use connector::{Attempt, OpenRequest, Opened};
use task::{Command, ServerTask};

/// Host time for the policy: milliseconds since the supervisor started.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock whose time 0 is now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Milliseconds since the clock started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The instant at host time `ms`.
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// What operators see of one server, kept by the host (the policy's view is in `status`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServerView {
    /// The server's name.
    pub name: String,
    /// Its lifecycle state, as the policy last reported it.
    pub state: ServerState,
    /// The policy's reason for that state.
    pub detail: String,
    /// Wall-clock time the state was entered.
    pub since: SystemTime,
    /// How it is reached (that of its latest session, after an SSE fallback).
    pub transport: TransportKind,
    /// The server process's id while a stdio session is open.
    pub pid: Option<u32>,
    /// The latest fault, described.
    pub last_fault: Option<String>,
    /// While the server needs authorization: what to do about it (the host's words, naming
    /// the login to run; a policy knows only that authorization is required).
    pub authorization: Option<String>,
    /// Connection attempts the policy ordered (the first included).
    pub reconnects: u64,
    /// Times the server was parked.
    pub parks: u64,
    /// The names of the tools its latest session offers (what the policy publishes from).
    pub offered: Vec<String>,
}

/// What a reload changed, by server name.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
pub struct ReloadReport {
    /// Servers new to the configuration, now started.
    pub added: Vec<String>,
    /// Servers no longer configured, now stopped.
    pub removed: Vec<String>,
    /// Servers whose spec changed, stopped and started again.
    pub restarted: Vec<String>,
    /// Servers whose spec is the same; their sessions were not touched.
    pub unchanged: Vec<String>,
    /// Whether the config file's top-level `policy` changed and the policy now runs with it.
    #[serde(default)]
    pub policy_settings_changed: bool,
    /// What the config file says that Tether ignores (unknown keys, and the like).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// A lifecycle event for operators (admin event stream, logs).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct LifecycleEvent {
    /// The server concerned.
    pub server: String,
    /// Its new state.
    pub state: ServerState,
    /// A human-readable reason (names the fault, the attempt, the next retry).
    pub detail: String,
}

struct ServerHandle {
    /// Shared with every call's lookup: a call copies none of it.
    spec: Arc<ServerSpec>,
    commands: mpsc::UnboundedSender<Command>,
    session: watch::Receiver<Option<Arc<Session>>>,
    view: Arc<Mutex<ServerView>>,
    task: JoinHandle<()>,
}

pub(crate) struct Shared {
    pub(crate) policy: PolicyRuntime,
    pub(crate) registry: Arc<Registry>,
    pub(crate) catalog: Arc<Catalog>,
    /// Resource updates and log messages from every upstream.
    events: broadcast::Sender<ServerEvent>,
    pub(crate) clock: Clock,
    feeder: Feeder,
    servers: Mutex<BTreeMap<String, ServerHandle>>,
    /// Serializes adding, removing and stopping servers with what the policy hears of them.
    /// Never taken while actions run, so it may be held across a decision.
    membership: Mutex<()>,
    /// Set when shutdown begins: no server is added after it.
    stopped: AtomicBool,
    log_dir: PathBuf,
    connector: Arc<dyn Connector>,
    lifecycle: broadcast::Sender<LifecycleEvent>,
    /// Tool actions of the policy that changed nothing (see [`Supervisor::redundant_actions`]).
    redundant_actions: AtomicU64,
    /// The call path (its ids, the calls in flight, their observer).
    calls: Calls,
    /// The first answer's wait for the servers configured at start.
    startup: Arc<startup::Startup>,
    /// Where OAuth servers' tokens are kept, and the browser (see `crate::auth`).
    auth: std::sync::RwLock<Option<Arc<AuthContext>>>,
    /// One reload or policy change at a time, from reading the config to the last server
    /// started (a SIGHUP and `tether reload` at once would otherwise apply two versions of the
    /// file, and a settings change during a reload could be lost to it).
    reloads: tokio::sync::Mutex<()>,
    /// Servers disabled in the config (their tokens kept): when they leave it, theirs go.
    disabled: Mutex<BTreeSet<String>>,
}

/// A server's current session (possibly dead) and its spec, for the gateway's other requests.
pub(crate) struct SessionLookup {
    pub(crate) current: Option<Arc<Session>>,
    pub(crate) spec: Arc<ServerSpec>,
}

/// Handle to the supervisor; cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    pub(crate) shared: Arc<Shared>,
}

impl Supervisor {
    /// Starts supervising nothing yet; add servers with [`Supervisor::add_server`].
    /// `log_dir` receives each stdio server's stderr as `<name>.log`.
    pub fn start(policy: PolicyRuntime, log_dir: PathBuf) -> Self {
        Self::start_with(policy, log_dir, Arc::new(Upstream))
    }

    /// Like [`Supervisor::start`], reaching servers through `connector` (a fake one tests
    /// supervision without processes or sockets, in virtual time).
    #[doc(hidden)]
    pub fn start_with(
        policy: PolicyRuntime,
        log_dir: PathBuf,
        connector: Arc<dyn Connector>,
    ) -> Self {
        let clock = Clock::new();
        policy.set_clock(Arc::new(move || clock.now_ms()));
        let shared = Arc::new_cyclic(|shared| Shared {
            feeder: Feeder {
                policy: policy.clone(),
                clock,
                shared: shared.clone(),
            },
            policy,
            registry: Arc::new(Registry::default()),
            catalog: Arc::new(Catalog::default()),
            events: broadcast::channel(1024).0,
            clock,
            servers: Mutex::default(),
            membership: Mutex::default(),
            stopped: AtomicBool::new(false),
            log_dir,
            connector,
            lifecycle: broadcast::channel(1024).0,

            redundant_actions: AtomicU64::new(0),
            calls: Calls::default(),
            startup: Arc::default(),
            auth: std::sync::RwLock::new(None),
            reloads: tokio::sync::Mutex::new(()),
            disabled: Mutex::default(),
        });
        Self { shared }
    }

    /// Lets HTTP servers added from now on use OAuth with `context` (where tokens are kept,
    /// the browser). When a login completes, its server is reconnected at once.
    pub fn use_authorization(&self, context: Arc<AuthContext>) {
        let mut authorized = context.authorized.subscribe();
        *self.shared.auth.write().unwrap_or_else(|e| e.into_inner()) = Some(context);
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let server = match authorized.recv().await {
                    Ok(server) => server,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                tracing::info!(%server, "authorized: reconnecting");
                Supervisor { shared }
                    .request_reconnect(&server, crate::policy::ReconnectSource::Operator);
            }
        });
    }

    /// From now until `wait` has passed, lists and calls wait for the first attempt of every
    /// server added meanwhile (see `startup.rs`).
    pub fn begin_startup(&self, wait: Duration) {
        self.shared.startup.begin(wait);
    }

    /// Waits until the servers configured at start have connected or failed their first
    /// attempt, within the startup wait; returns at once after it.
    pub async fn startup_settled(&self) {
        self.shared.startup.settled().await;
    }

    /// Tool actions of the policy the host absorbed because they changed nothing: a
    /// `withdraw-tools` of a server with nothing published, a `publish-tools` identical to the
    /// publication in force. They are harmless (nothing is announced to agents), so not a fault
    /// of the policy; counted for operators (`tether_policy_redundant_actions_total`).
    pub fn redundant_actions(&self) -> u64 {
        self.shared.redundant_actions.load(Ordering::Relaxed)
    }

    /// The tools agents can see and where each call goes.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.shared.registry
    }

    /// The visible servers' prompts, resources and templates.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.shared.catalog
    }

    /// Resource updates and log messages from the upstream servers, as they arrive.
    pub fn server_events(&self) -> broadcast::Receiver<ServerEvent> {
        self.shared.events.subscribe()
    }

    /// The policy runtime deciding for every server.
    pub fn policy(&self) -> &PolicyRuntime {
        &self.shared.policy
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The host clock events are stamped with.
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// Lifecycle events as they happen.
    pub fn lifecycle(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.shared.lifecycle.subscribe()
    }

    /// Starts supervising `spec` (replacing nothing: the name must be new). Refused once
    /// shutdown has begun.
    pub fn add_server(&self, spec: ServerSpec) -> Result<(), ServerProblem> {
        // Held until the policy has heard of the server: a removal or a shutdown of the same
        // name cannot come between the two.
        let _membership = self.shared.membership();
        if self.shared.stopped.load(Ordering::SeqCst) {
            return Err(ServerProblem::ShuttingDown { server: spec.name });
        }
        let mut servers = self
            .shared
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if servers.contains_key(&spec.name) {
            return Err(ServerProblem::Duplicate { server: spec.name });
        }
        if let Some(why) = ServerSpec::name_problem(&spec.name) {
            return Err(ServerProblem::BadName {
                server: spec.name,
                why,
            });
        }
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (session_tx, session) = watch::channel(None);
        let view = Arc::new(Mutex::new(ServerView {
            name: spec.name.clone(),
            state: ServerState::Connecting,
            detail: "configured".into(),
            since: SystemTime::now(),
            transport: spec.transport.kind(),
            pid: None,
            last_fault: None,
            authorization: None,
            reconnects: 0,
            parks: 0,
            offered: Vec::new(),
        }));
        let auth = self
            .shared
            .auth
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .and_then(|context| Authorizer::for_server(&spec, context));
        let task = ServerTask {
            spec: spec.clone(),
            auth,
            connector: self.shared.connector.clone(),
            own_commands: commands.downgrade(),
            feeder: self.shared.feeder.clone(),
            log_dir: self.shared.log_dir.clone(),
            session_tx,
            view: view.clone(),
            catalog: self.shared.catalog.clone(),
            events: self.shared.events.clone(),
            startup: self.shared.startup.clone(),
        };
        self.shared.startup.track(&spec.name);
        let config = spec.policy_config();
        if config.prefix.is_some() && !takes_naming(&self.shared.policy) {
            tracing::warn!(
                server = %config.name,
                contract = %self.shared.policy.running().contract,
                "`prefix` is ignored: the running policy is older than contract 0.2.1 and names the server's tools its own way"
            );
        }
        let refused = view.clone();
        let handle = ServerHandle {
            spec: Arc::new(spec),
            commands,
            session,
            view,
            task: tokio::spawn(task.run(commands_rx)),
        };
        servers.insert(config.name.clone(), handle);
        // Released before the policy decides: its actions (run as soon as it has) reach this
        // server through the table.
        drop(servers);
        // A policy that cannot take the server never asks to connect it: say so where
        // operators look, rather than leaving it "connecting" without a fault.
        self.shared
            .feeder
            .feed_or(EventKind::ServerConfigured(config), move |reason| {
                let mut view = refused.lock().unwrap_or_else(|e| e.into_inner());
                view.detail = "the policy could not take this server; not connecting".into();
                view.last_fault = Some(format!("the policy could not take this server: {reason}"));
            });
        Ok(())
    }

    /// Stops supervising a server: the policy withdraws its tools, its session and process end.
    pub async fn remove_server(&self, name: &str) -> bool {
        let handle = {
            let _membership = self.shared.membership();
            let handle = self
                .shared
                .servers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
            let Some(handle) = handle else { return false };
            self.shared.feed(EventKind::ServerRemoved(name.to_string()));
            handle
        };
        stop(handle).await;
        self.shared.startup.settle(name);
        // What the policy decided before hearing of the removal (a publication of its tools)
        // is done before they are forgotten, or it would show them again.
        let _ = self.shared.policy.status().await;
        // Unless a server of that name was added meanwhile: its tools are its own.
        let _membership = self.shared.membership();
        let present = self
            .shared
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name);
        if !present {
            self.shared.registry.forget(name);
            self.shared.catalog.forget(name);
        }
        true
    }

    /// The specs of every supervised server.
    pub fn specs(&self) -> Vec<ServerSpec> {
        self.shared
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| ServerSpec::clone(&h.spec))
            .collect()
    }

    /// The host's view of every server, sorted by name.
    pub fn views(&self) -> Vec<ServerView> {
        self.shared
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| h.view.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }

    /// Replaces the running policy while everything keeps running: no session is torn down,
    /// and the incoming policy's actions (publications, timers) run in decision order. Between
    /// implementations the state is handed over (see [`SwapReport`]).
    pub async fn swap_policy(&self, source: PolicySource) -> Result<SwapReport, PolicyError> {
        let _turn = self.reload_turn().await;
        let policy = self.shared.policy.clone();
        let loaded = tokio::task::spawn_blocking(move || policy.load(&source))
            .await
            .unwrap_or(Err(PolicyError::Stopped))?;
        let (answer, answered) = oneshot::channel();
        let shared = Arc::downgrade(&self.shared);
        self.shared.policy.swap_then(loaded, move |result| {
            if let (Ok(report), Some(shared)) = (&result, shared.upgrade()) {
                shared.execute(report.actions.clone());
            }
            let _ = answer.send(result);
        });
        let report = answered.await.unwrap_or(Err(PolicyError::Stopped))?;
        self.rename_prompts().await;
        Ok(report)
    }

    /// Asks the (new) policy to name every server's prompts again.
    async fn rename_prompts(&self) {
        for (server, offer) in self.shared.catalog.offers() {
            let names = prompt_names(&self.shared.policy, &server, &offer).await;
            self.shared.catalog.rename_prompts(&server, names);
        }
    }

    /// Promotes the shadow policy (see [`PolicyRuntime::shadow_blocking`]): a swap to it, as
    /// [`Self::swap_policy`] does.
    pub async fn swap_policy_from_shadow(&self) -> Result<SwapReport, PolicyError> {
        let _turn = self.reload_turn().await;
        let (answer, answered) = oneshot::channel();
        let shared = Arc::downgrade(&self.shared);
        self.shared.policy.swap_from_shadow_then(move |result| {
            if let (Ok(report), Some(shared)) = (&result, shared.upgrade()) {
                shared.execute(report.actions.clone());
            }
            let _ = answer.send(result);
        });
        let report = answered.await.unwrap_or(Err(PolicyError::Stopped))?;
        self.rename_prompts().await;
        Ok(report)
    }

    /// The policy's view of every server.
    pub async fn policy_status(&self) -> Vec<ServerStatus> {
        self.shared.policy.status().await.unwrap_or_default()
    }

    /// Asks the policy to reconnect a server now (operator or agent).
    pub fn request_reconnect(&self, name: &str, source: crate::policy::ReconnectSource) -> bool {
        if !self
            .shared
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
        {
            return false;
        }
        self.shared.feed(EventKind::ReconnectRequested(
            crate::policy::ReconnectRequest {
                server: name.to_string(),
                source,
            },
        ));
        true
    }

    /// The servers the config names but disables (their tokens are kept until they leave it).
    pub(crate) fn set_disabled(&self, names: &[String]) {
        *self.shared.disabled.lock().unwrap_or_else(|e| e.into_inner()) =
            names.iter().cloned().collect();
    }

    /// Held by a reload from before it reads its config until it is applied, and by a change
    /// of the policy or its settings.
    pub(crate) async fn reload_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.shared.reloads.lock().await
    }

    /// Makes the supervised set equal `specs`: starts added servers, stops removed ones,
    /// restarts changed ones; servers whose spec is unchanged keep their sessions untouched.
    /// A removed server's tokens are forgotten.
    pub async fn reload(&self, specs: Vec<ServerSpec>) -> ReloadReport {
        self.reload_keeping(specs, &[]).await
    }

    /// As [`Supervisor::reload`], but the servers named in `still_configured` (disabled in the
    /// config, not gone from it) keep their tokens when they stop.
    pub async fn reload_keeping(
        &self,
        specs: Vec<ServerSpec>,
        still_configured: &[String],
    ) -> ReloadReport {
        let current: BTreeMap<String, ServerSpec> = self
            .specs()
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let wanted: BTreeMap<String, ServerSpec> =
            specs.into_iter().map(|s| (s.name.clone(), s)).collect();
        let mut report = ReloadReport::default();
        for name in current.keys().filter(|n| !wanted.contains_key(*n)) {
            if self.remove_server(name).await {
                report.removed.push(name.clone());
            }
        }
        // Servers that left the config (stopped now, or disabled until now): their tokens go.
        let was_disabled = std::mem::replace(
            &mut *self.shared.disabled.lock().unwrap_or_else(|e| e.into_inner()),
            still_configured.iter().cloned().collect(),
        );
        let context = self.shared.auth.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(context) = context {
            let gone = report.removed.iter().chain(&was_disabled).filter(|name| {
                !still_configured.contains(name) && !wanted.contains_key(name.as_str())
            });
            for name in gone {
                if let Err(why) = context.store.remove(name) {
                    tracing::warn!(server = %name, "reload: removing the tokens failed: {why}");
                }
            }
        }
        for (name, spec) in wanted {
            match current.get(&name) {
                Some(old) if *old == spec => report.unchanged.push(name),
                Some(_) => {
                    self.remove_server(&name).await;
                    match self.add_server(spec) {
                        Ok(()) => report.restarted.push(name),
                        Err(why) => {
                            tracing::error!("reload: {why}");
                            report.removed.push(name);
                        }
                    }
                }
                None => match self.add_server(spec) {
                    Ok(()) => report.added.push(name),
                    Err(why) => tracing::error!("reload: {why}"),
                },
            }
        }
        tracing::info!(?report, "configuration reloaded");
        report
    }

    /// Refuses new calls and waits up to `within` for the calls in flight to be answered.
    pub async fn drain(&self, within: Duration) {
        self.shared.calls.drain(within).await;
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Calls the tool agents know as `advertised`. Tool errors from the server pass through
    /// unchanged; refusals and transport failures become tool errors with words for the model.
    pub async fn call_tool(
        &self,
        advertised: &str,
        arguments: Option<JsonObject>,
    ) -> Result<rmcp::model::CallToolResult, CallError> {
        self.call_tool_with_hook(advertised, arguments, CallContext::default(), async {})
            .await
    }

    /// [`Supervisor::call_tool`] for a client that may cancel the call, wants its progress, or
    /// can answer a server's request for input (protocol 2026-07-28): such a request comes back
    /// as [`CallToolResponse::InputRequired`], and the retry carries the answers in `context`.
    pub async fn call_tool_in(
        &self,
        advertised: &str,
        arguments: Option<JsonObject>,
        context: CallContext,
    ) -> Result<CallToolResponse, CallError> {
        let shared = &*self.shared;
        shared
            .calls
            .call(shared, advertised, arguments, context, async {})
            .await
    }

    #[cfg(any(test, feature = "test-support"))]
    /// [`Supervisor::call_tool`] with `before_dispatch` awaited between admission and dispatch,
    /// so tests can make the world change exactly there (e.g. kill the server).
    #[doc(hidden)]
    pub async fn call_tool_with_hook(
        &self,
        advertised: &str,
        arguments: Option<JsonObject>,
        context: CallContext,
        before_dispatch: impl std::future::Future<Output = ()>,
    ) -> Result<rmcp::model::CallToolResult, CallError> {
        let shared = &*self.shared;
        let response = shared
            .calls
            .call(shared, advertised, arguments, context, before_dispatch)
            .await;
        crate::calls::as_result(advertised, response)
    }

    /// Registers the one observer of finished calls (metrics).
    pub fn observe_calls(&self, observer: Arc<dyn CallObserver>) {
        self.shared.calls.observe_calls(observer);
    }

    /// Withdraws every tool, closes every session and reaps every child. Supervision ends.
    pub async fn shutdown(&self) {
        let handles: Vec<ServerHandle> = {
            let _membership = self.shared.membership();
            self.shared.stopped.store(true, Ordering::SeqCst);
            self.shared.feed(EventKind::Shutdown);
            std::mem::take(
                &mut *self
                    .shared
                    .servers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            )
            .into_values()
            .collect()
        };
        // The policy decides in order: once it has answered this, the shutdown's actions (the
        // last withdrawals and state changes) have run, even if they were queued.
        let _ = self.shared.policy.status().await;
        futures::future::join_all(handles.into_iter().map(stop)).await;
        // Every stop's decisions are recorded by now.
        let _ = self.shared.policy.end_recording().await;
    }
}

async fn stop(handle: ServerHandle) {
    let (done_tx, done) = oneshot::channel();
    if handle.commands.send(Command::Stop(done_tx)).is_ok() {
        let _ = done.await;
    }
    let _ = handle.task.await;
}

/// The call path reaches servers, the registry and the policy through the supervisor.
impl CallHost for Shared {
    type Session = Session;

    fn route(&self, advertised: &str) -> Option<Arc<Route>> {
        self.registry.route_for_call(advertised)
    }

    fn admit(
        &self,
        request: CallRequest,
    ) -> impl Future<Output = Result<Admission, PolicyError>> + Send + '_ {
        self.policy.admit(request)
    }

    fn feed(&self, event: EventKind) {
        Shared::feed(self, event);
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn sessions(&self, server: &str) -> Option<Sessions<Session>> {
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        let handle = servers.get(server)?;
        Some(Sessions {
            current: handle.session.borrow().clone(),
            updates: handle.session.clone(),
            timeouts: handle.spec.timeouts.clone(),
        })
    }
}

impl Shared {
    fn membership(&self) -> std::sync::MutexGuard<'_, ()> {
        self.membership.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives an event to the policy; its actions run once it is decided, in decision order.
    pub(crate) fn feed(&self, kind: EventKind) {
        self.feeder.feed(kind);
    }

    /// The names of the servers configured.
    pub(crate) fn server_names(&self) -> Vec<String> {
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.keys().cloned().collect()
    }

    /// The session of `server` as the gateway's other requests need it.
    pub(crate) fn session(&self, server: &str) -> Option<SessionLookup> {
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        let handle = servers.get(server)?;
        Some(SessionLookup {
            current: handle.session.borrow().clone(),
            spec: handle.spec.clone(),
        })
    }

    fn execute(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Connect(server) => self.command(&server, Command::Connect),
                Action::Disconnect(server) => self.command(&server, Command::Disconnect),
                Action::WakeAt(wake) => self.command(
                    &wake.server,
                    Command::WakeAt {
                        at_ms: wake.at,
                        token: wake.token,
                    },
                ),
                // A server's prompts and resources are shown while its tools are published (or,
                // without tools, while it is up): the catalog follows these actions. One that
                // changes neither is absorbed: nothing is announced, and it is only counted.
                Action::PublishTools(publication) => {
                    let server = publication.server.clone();
                    let shown = self.registry.publish(publication);
                    let marked = self.catalog.set_published(&server, true);
                    if !(shown || marked) {
                        self.absorbed(&server, "a publication identical to the one in force");
                    }
                }
                Action::WithdrawTools(server) => {
                    let hidden = self.registry.withdraw(&server);
                    let marked = self.catalog.set_published(&server, false);
                    if !(hidden || marked) {
                        self.absorbed(&server, "a withdrawal of tools not shown");
                    }
                }
                Action::StateChanged(change) => self.state_changed(change),
            }
        }
    }

    fn absorbed(&self, server: &str, what: &str) {
        self.redundant_actions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(server, "the policy asked for {what}: nothing changes");
    }

    fn command(&self, server: &str, command: Command) {
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = servers.get(server) {
            let _ = handle.commands.send(command);
        }
    }

    fn state_changed(&self, change: StateChange) {
        let up = matches!(change.state, ServerState::Connected | ServerState::Healthy);
        self.catalog.set_live(&change.server, up);
        // A server the policy will not connect now needs no waiting for.
        if matches!(change.state, ServerState::Parked | ServerState::Stopped) {
            self.startup.settle(&change.server);
        }
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = servers.get(&change.server) {
            let mut view = handle.view.lock().unwrap_or_else(|e| e.into_inner());
            if view.state != change.state {
                view.since = SystemTime::now();
                if change.state == ServerState::Parked {
                    view.parks += 1;
                }
            }
            view.state = change.state;
            view.detail = change.detail.clone();
        }
        drop(servers);
        // One line per lifecycle step (the policy logs these at debug only).
        match change.state {
            ServerState::Parked => {
                tracing::warn!(server = %change.server, "{}", change.detail)
            }
            _ => {
                tracing::info!(server = %change.server, state = ?change.state, "{}", change.detail)
            }
        }
        let _ = self.lifecycle.send(LifecycleEvent {
            server: change.server,
            state: change.state,
            detail: change.detail,
        });
    }
}

/// Whether the running policy hears the operator's naming (contract 0.2.1 or later).
fn takes_naming(policy: &PolicyRuntime) -> bool {
    let naming = semver::Version::new(0, 2, 1);
    semver::Version::parse(&policy.running().contract)
        .is_ok_and(|version| version.major == 0 && version.minor == 2 && version >= naming)
}

/// The names agents see for a server's prompts, as the policy gives them (contract 0.2.1); a
/// policy that cannot be asked (older contracts) or cannot answer gets the default rule, as
/// contract 0.2.0 named them. Empty without prompts.
pub(crate) async fn prompt_names(
    policy: &PolicyRuntime,
    server: &str,
    catalog: &crate::catalog::ServerCatalog,
) -> std::collections::HashMap<String, String> {
    let originals = catalog.prompt_originals();
    if originals.is_empty() {
        return Default::default();
    }
    let named = match policy
        .name_prompts(server.to_string(), originals.clone())
        .await
    {
        Ok(Some(named)) => {
            return named
                .into_iter()
                .map(|n| (n.original, n.advertised))
                .collect();
        }
        Ok(None) => originals,
        Err(error) => {
            tracing::warn!(
                server,
                "the policy could not name the prompts ({error}); using the default names"
            );
            originals
        }
    };
    named
        .into_iter()
        .map(|original| {
            let advertised = tether_policy::naming::advertised_name(server, &original);
            (original, advertised)
        })
        .collect()
}

/// Feeds events to the policy runtime, stamped with the host's time when the policy takes
/// them, and executes their actions as soon as they are decided: in decision order (the
/// runtime runs each decision's callback before deciding the next input), with no task in
/// between.
#[derive(Clone)]
pub(crate) struct Feeder {
    pub(crate) policy: PolicyRuntime,
    pub(crate) clock: Clock,
    shared: std::sync::Weak<Shared>,
}

impl Feeder {
    pub(crate) fn feed(&self, kind: EventKind) {
        self.feed_or(kind, |_| {});
    }

    /// Like `feed`, and runs `failed` with the reason when the policy could not decide.
    pub(crate) fn feed_or(&self, kind: EventKind, failed: impl FnOnce(String) + Send + 'static) {
        self.feed_then(kind, |outcome| {
            if let Err(reason) = outcome {
                failed(reason);
            }
        });
    }

    /// Like `feed`, and runs `decided` with the outcome as soon as the policy has decided,
    /// before its actions run and before any later input is decided. What `decided` returns
    /// is dropped once the actions ran.
    pub(crate) fn feed_then<Held: Send + 'static>(
        &self,
        kind: EventKind,
        decided: impl FnOnce(Result<(), String>) -> Held + Send + 'static,
    ) {
        let clock = self.clock;
        let shared = self.shared.clone();
        self.policy.handle_then(
            move || Event {
                now: clock.now_ms(),
                kind,
            },
            move |outcome| {
                let held = decided(outcome.as_ref().map(|_| ()).map_err(ToString::to_string));
                match outcome {
                    Ok(actions) => {
                        if let Some(shared) = shared.upgrade() {
                            shared.execute(actions);
                        }
                    }
                    // The runtime already contained and reported the fault; nothing to run.
                    Err(error) => tracing::error!("the policy could not handle an event: {error}"),
                }
                drop(held);
            },
        );
    }
}
