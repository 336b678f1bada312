//! One server's task: the IO around its [`Lifecycle`]. It waits for whatever comes first (an
//! order from the policy, the attempt's outcome, the session's end, the keepalive's answer, a
//! list change, the lifecycle's deadline), hands it to the lifecycle with the host's time, and
//! carries out the effects: sessions opened through a [`Connector`], closed, probed; events fed
//! to the policy.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::connector::{Attempt, Connector, Link, OpenRequest, Opened};
use super::lifecycle::{Effect, Input, Lifecycle};
use super::startup::Startup;
use super::{Feeder, ServerView};
use crate::catalog::{Catalog, ServerCatalog};
use crate::config::{ServerSpec, Timeouts};
use crate::policy::{EventKind, Fault, SessionInfo, Tool};
use crate::upstream::{KeepaliveFailure, ListChanges, Remembered, ServerEvent, Session};

/// What the supervisor and policy callbacks tell a server's task.
pub(crate) enum Command {
    Connect,
    Disconnect,
    WakeAt {
        at_ms: u64,
        token: u64,
    },
    /// Close the session and end the task (removal, shutdown).
    Stop(oneshot::Sender<()>),
    /// The policy could not take the session that just opened (its answer to `connected`
    /// failed): close it and report the failure as a failed connect, so the server is never
    /// left "connecting" without a fault.
    PolicyRefusedSession(String),
}

/// The parts of the supervisor a server's task works with.
pub(crate) struct ServerTask {
    pub(crate) spec: ServerSpec,
    /// Its OAuth, if it uses it.
    pub(crate) auth: Option<Arc<crate::auth::Authorizer>>,
    pub(crate) connector: Arc<dyn Connector>,
    /// For reports back to this task from policy callbacks; weak, so the task still ends
    /// when the supervisor drops its handle.
    pub(crate) own_commands: mpsc::WeakUnboundedSender<Command>,
    pub(crate) feeder: Feeder,
    pub(crate) log_dir: PathBuf,
    /// The session calls use.
    pub(crate) session_tx: watch::Sender<Option<Arc<Session>>>,
    pub(crate) view: Arc<Mutex<ServerView>>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) events: broadcast::Sender<ServerEvent>,
    /// The startup wait, told when this server's first attempt settled: when it connected and
    /// the policy's decision ran, or when it failed.
    pub(crate) startup: Arc<Startup>,
}

/// The task's IO state: what is open and what is in flight.
#[derive(Default)]
struct Io {
    link: Option<Arc<dyn Link>>,
    /// An opened session the lifecycle has not adopted yet.
    opened: Option<Opened>,
    attempt: Option<Attempt>,
    keepalive: Option<BoxFuture<'static, Result<(), KeepaliveFailure>>>,
    tools: Option<BoxFuture<'static, Result<Vec<Tool>, Fault>>>,
    catalog: Option<BoxFuture<'static, Result<ServerCatalog, Fault>>>,
    changes: Arc<ListChanges>,
    /// Which HTTP flavor and protocol generation the server speaks, once known.
    remembered: Remembered,
}

impl ServerTask {
    pub(crate) async fn run(self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let name = self.spec.name.clone();
        let interval = self.spec.keepalive_interval().as_millis() as u64;
        let first = Timeouts::KEEPALIVE_FLOOR.as_millis() as u64;
        let mut lifecycle = Lifecycle::new(&name, interval, first);
        let mut io = Io::default();
        let clock = self.feeder.clock;
        loop {
            let deadline = lifecycle.deadline().map(|at| clock.instant_at(at));
            let input = tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Connect) => Input::Connect,
                    Some(Command::Disconnect) => Input::Disconnect,
                    Some(Command::WakeAt { at_ms, token }) => Input::WakeAt { at: at_ms, token },
                    Some(Command::PolicyRefusedSession(reason)) => {
                        tracing::error!(server = %name, "the policy could not take the new session: {reason}");
                        Input::PolicyRefusedSession(reason)
                    }
                    Some(Command::Stop(done)) => {
                        self.close_session(&mut io).await;
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        self.close_session(&mut io).await;
                        return;
                    }
                },
                (result, remembered) = poll_option(&mut io.attempt) => {
                    io.attempt = None;
                    io.remembered = remembered;
                    match result {
                        Ok(opened) => {
                            io.opened = Some(opened);
                            Input::Opened
                        }
                        Err(fault) => {
                            tracing::debug!(server = %name, "connection attempt failed: {fault}");
                            Input::AttemptFailed(fault)
                        }
                    }
                }
                _ = sleep_until_option(deadline) => Input::Tick,
                fault = ended(io.link.as_deref()) => {
                    tracing::info!(server = %name, "session ended: {fault}");
                    Input::Ended(fault)
                }
                result = poll_option(&mut io.keepalive) => {
                    io.keepalive = None;
                    let mut recorded_end = None;
                    if let (Err(failure), Some(link)) = (&result, io.link.clone()) {
                        // The lifecycle decides whether the session goes (`CloseSession`).
                        tracing::warn!(server = %name, "{}", failure.fault());
                        // A child that died fails its keepalive a moment before its end is
                        // settled, which then follows at once and says more (its exit code).
                        // A session still open (frozen, slow) is given up now.
                        recorded_end = match link.is_alive() {
                            true => link.recorded_end(),
                            false => Some(link.ended().await),
                        };
                    }
                    Input::KeepaliveDone { result, recorded_end }
                }
                changed = io.changes.next(), if io.link.is_some() => Input::ListsChanged {
                    tools: changed.tools,
                    catalog: changed.catalog,
                },
                result = poll_option(&mut io.catalog) => {
                    io.catalog = None;
                    let failed = result.is_err();
                    match result {
                        Ok(mut catalog) => {
                            catalog.prompt_names =
                                super::prompt_names(&self.feeder.policy, &name, &catalog).await;
                            self.catalog.set(&name, catalog)
                        }
                        // The last lists stay; the session's end, if it ended, comes separately.
                        Err(fault) => tracing::warn!(server = %name, "refreshing prompts and resources failed: {fault}"),
                    }
                    Input::CatalogListed { failed }
                }
                result = poll_option(&mut io.tools) => {
                    io.tools = None;
                    if let Err(fault) = &result {
                        tracing::warn!(server = %name, "refreshing tools failed: {fault}");
                    }
                    Input::ToolsListed(result)
                }
            };
            // A closed session is torn down (a frozen child: stdin closed, SIGTERM, the grace,
            // SIGKILL) once the policy has heard of its end in the same step, so its tools do not
            // outlive what is known of it; and before anything else is done, so a new attempt
            // never overlaps the old process.
            let mut closing = None;
            for effect in lifecycle.handle(input, clock.now_ms()) {
                match effect {
                    Effect::Feed(_) | Effect::NoteFault(_) => self.apply(effect, &mut io).await,
                    Effect::CloseSession => {
                        if let Some(old) = closing.take() {
                            self.tear_down(old).await;
                        }
                        closing = self.detach(&mut io);
                    }
                    other => {
                        if let Some(old) = closing.take() {
                            self.tear_down(old).await;
                        }
                        self.apply(other, &mut io).await;
                    }
                }
            }
            if let Some(old) = closing {
                self.tear_down(old).await;
            }
        }
    }

    async fn apply(&self, effect: Effect, io: &mut Io) {
        match effect {
            Effect::CloseSession => self.close_session(io).await,
            Effect::StartAttempt => {
                // Fresh: list changes the old session announced are moot.
                io.changes = Arc::new(ListChanges::default());
                io.attempt = Some(self.connector.open(OpenRequest {
                    spec: self.spec.clone(),
                    remembered: io.remembered,
                    changes: io.changes.clone(),
                    events: self.events.clone(),
                    log_dir: self.log_dir.clone(),
                    auth: self.auth.clone(),
                }));
                self.view().reconnects += 1;
            }
            Effect::DropAttempt => io.attempt = None,
            Effect::AdoptSession => {
                if let Some(opened) = io.opened.take() {
                    self.adopt(opened, io).await;
                }
            }
            Effect::StartKeepalive => {
                if let Some(link) = io.link.clone() {
                    let timeouts = self.spec.timeouts.clone();
                    io.keepalive = Some(async move { link.keepalive(&timeouts).await }.boxed());
                }
            }
            Effect::RefreshTools => {
                if let Some(link) = io.link.clone() {
                    let timeouts = self.spec.timeouts.clone();
                    io.tools = Some(async move { link.list_tools(&timeouts).await }.boxed());
                }
            }
            Effect::RefreshCatalog => {
                if let Some(link) = io.link.clone() {
                    let timeouts = self.spec.timeouts.clone();
                    io.catalog = Some(async move { link.list_catalog(&timeouts).await }.boxed());
                }
            }
            Effect::Feed(kind) => self.feed(kind),
            Effect::NoteFault(fault) => self.note(&fault),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, ServerView> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fault as operators see it.
    fn note(&self, fault: &Fault) {
        let mut view = self.view();
        view.last_fault = Some(fault.to_string());
        view.authorization = match fault {
            Fault::AuthorizationRequired(words) => Some(words.clone()),
            _ => None,
        };
    }

    /// Tells the policy; a fault it carries is what operators see as the last fault.
    fn feed(&self, kind: EventKind) {
        match &kind {
            EventKind::ConnectFailed(f) => {
                self.note(&f.fault);
                // Settled once the policy's decision about the failure ran.
                let (startup, server) = (self.startup.clone(), self.spec.name.clone());
                self.feeder
                    .feed_then(kind, move |_| Settled { startup, server });
                return;
            }
            EventKind::Disconnected(f) | EventKind::KeepaliveFailed(f) => self.note(&f.fault),
            EventKind::ToolsChanged(change) => {
                self.view().offered = change.tools.iter().map(|t| t.name.clone()).collect();
                let view = self.view.clone();
                let server = self.spec.name.clone();
                self.feeder.feed_or(kind, move |reason| {
                    tracing::error!(server = %server, "the policy could not take the new tool list; the last one stays: {reason}");
                    view.lock().unwrap_or_else(|e| e.into_inner()).last_fault =
                        Some(format!("the policy could not take the new tool list: {reason}"));
                });
                return;
            }
            _ => {}
        }
        self.feeder.feed(kind);
    }

    /// Takes the opened session as the server's and tells the policy it is `connected`.
    async fn adopt(&self, opened: Opened, io: &mut Io) {
        let Opened {
            link,
            tools,
            mut catalog,
        } = opened;
        catalog.prompt_names =
            super::prompt_names(&self.feeder.policy, &self.spec.name, &catalog).await;
        // Stored before the policy hears of the session: publishing the server shows it.
        self.catalog.set(&self.spec.name, catalog);
        {
            let mut view = self.view();
            view.pid = link.pid();
            view.transport = link.transport();
            view.offered = tools.iter().map(|t| t.name.clone()).collect();
        }
        let info = SessionInfo {
            server: self.spec.name.clone(),
            server_info: link.server_info(),
            tools,
        };
        io.link = Some(link.clone());
        let refused = self.own_commands.clone();
        self.view().authorization = None;
        let calls_see = self.session_tx.clone();
        // Settled once the policy's decision about the session (its publication) has run.
        let settle = Settled {
            startup: self.startup.clone(),
            server: self.spec.name.clone(),
        };
        // Calls see the session once the policy has heard of it, and before its publication
        // runs: a call that waited for it is admitted by a policy that knows it, and a call to
        // a published tool finds it.
        self.feeder
            .feed_then(EventKind::Connected(info), move |outcome| {
                match outcome {
                    // Unless it ended meanwhile (the task then cleared it).
                    Ok(()) => {
                        calls_see.send_if_modified(|current| {
                            let alive = link.is_alive();
                            if alive {
                                *current = link.session();
                            }
                            alive
                        });
                    }
                    Err(reason) => {
                        if let Some(commands) = refused.upgrade() {
                            let _ = commands.send(Command::PolicyRefusedSession(reason));
                        }
                    }
                }
                settle
            });
    }

    async fn close_session(&self, io: &mut Io) {
        if let Some(old) = self.detach(io) {
            self.tear_down(old).await;
        }
    }

    /// Lets go of the session: nothing more is read or sent on it, and calls stop seeing it.
    fn detach(&self, io: &mut Io) -> Option<Arc<dyn Link>> {
        io.keepalive = None;
        io.tools = None;
        io.catalog = None;
        let old = io.link.take()?;
        tracing::info!(server = %self.spec.name, "closing the session");
        let _ = self.session_tx.send(None);
        self.view().pid = None;
        Some(old)
    }

    /// Ends a detached session: closes its transport, stops its process.
    async fn tear_down(&self, old: Arc<dyn Link>) {
        old.close(self.spec.timeouts.stop_grace).await;
    }
}

/// Tells the startup wait that a server's first attempt settled, when dropped (after the
/// policy's decision about it ran).
struct Settled {
    startup: Arc<Startup>,
    server: String,
}

impl Drop for Settled {
    fn drop(&mut self) {
        self.startup.settle(&self.server);
    }
}

/// Polls an optional future; pending forever when there is none.
async fn poll_option<T>(future: &mut Option<BoxFuture<'static, T>>) -> T {
    match future {
        Some(future) => Pin::new(future).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_option(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves with its cause once the session ends; never without a session.
async fn ended(link: Option<&dyn Link>) -> Fault {
    match link {
        Some(link) => link.ended().await,
        None => std::future::pending().await,
    }
}
