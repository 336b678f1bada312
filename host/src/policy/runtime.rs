//! The policy runtime: one policy instance on a dedicated thread, fed events and admissions
//! through a channel. It contains every guest failure:
//!
//! 1. a fault (trap, endless loop, memory blow-up, invalid output) discards the instance;
//! 2. a fresh instance is restored from the last good snapshot plus the journal of inputs since,
//!    and the failed input is tried once more;
//! 3. if that fails too, the embedded default policy takes over (restoring the same state when it
//!    can, else re-learning the configured servers) and the failure is logged loudly.
//!
//! Swaps compile the new component off the policy thread, then move the state across; if any
//! step fails the old policy keeps running and the caller gets the reason.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::{broadcast, oneshot};

use super::bindings::{
    Action, Admission, CallRequest, Event, EventKind, PolicyInfo, ServerConfig, ServerStatus,
};
use super::engine::{LoadedPolicy, PolicyEngine, PolicySource};
use super::instance::{Limits, PolicyInstance};
use super::{PolicyError, PolicyFault};

/// How to start a [`PolicyRuntime`].
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// The policy to run.
    pub source: PolicySource,
    /// Settings JSON given to the policy's `init`.
    pub settings: String,
    /// Sandbox limits for every instance.
    pub limits: Limits,
    /// Cache for precompiled components (`None`: compile every time). Ignored with `engine`.
    pub cache_dir: Option<PathBuf>,
    /// An engine to share with other runtimes (it keeps compiled components in memory).
    pub engine: Option<Arc<PolicyEngine>>,
    /// Whether a policy that keeps failing is replaced by the embedded default. Off when checking
    /// a component, so that its failures are reported rather than papered over.
    pub fallback_to_default: bool,
    /// Take a snapshot after this many state-changing inputs (bounds the replay journal).
    pub checkpoint_every: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            source: PolicySource::Embedded,
            settings: "{}".to_string(),
            limits: Limits::default(),
            cache_dir: None,
            engine: None,
            fallback_to_default: true,
            checkpoint_every: 64,
        }
    }
}

/// Something operators should hear about.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyNotice {
    /// A guest call failed; `error` names the policy and the fault.
    Fault { policy: String, error: String },
    /// A fresh instance of the same policy was restored to the last good state.
    Recovered { policy: String },
    /// The embedded default policy replaced a failing one.
    FellBack { from: String, reason: String },
    /// An operator swapped the policy.
    Swapped { from: String, to: String },
    /// An operator changed the settings.
    SettingsChanged { settings: String },
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    pub faults: AtomicU64,
    pub recoveries: AtomicU64,
    pub fallbacks: AtomicU64,
    pub swaps: AtomicU64,
    pub decisions: AtomicU64,
    pub decision_nanos: AtomicU64,
}

/// What is running now, for status displays.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunningPolicy {
    pub label: String,
    pub name: String,
    pub version: String,
    pub contract: String,
    pub digest: String,
    pub settings: String,
}

struct Shared {
    engine: Arc<PolicyEngine>,
    stats: RuntimeStats,
    notices: broadcast::Sender<PolicyNotice>,
    running: Mutex<RunningPolicy>,
}

type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// Handle to the policy thread. Cheap to clone; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct PolicyRuntime {
    jobs: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// A pending answer from the policy thread: `.await` it, or `.wait()` outside async code.
pub struct Reply<T>(oneshot::Receiver<Result<T, PolicyError>>);

impl<T> Reply<T> {
    /// Blocks the current thread for the answer. Do not call from async code.
    pub fn wait(self) -> Result<T, PolicyError> {
        self.0.blocking_recv().unwrap_or(Err(PolicyError::Stopped))
    }
}

impl<T> Future for Reply<T> {
    type Output = Result<T, PolicyError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(PolicyError::Stopped)))
    }
}

impl PolicyRuntime {
    /// Compiles the policy, starts its thread and initializes it with the settings. Blocking.
    pub fn start(options: RuntimeOptions) -> Result<Self, PolicyError> {
        let engine = match &options.engine {
            Some(engine) => engine.clone(),
            None => PolicyEngine::new(options.cache_dir.clone())?,
        };
        let policy = engine.load(&options.source)?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let shared_engine = engine.clone();
        std::thread::Builder::new()
            .name("tether-policy".into())
            .spawn(move || {
                let worker = Worker::start(shared_engine, policy, &options);
                match worker {
                    Ok(mut worker) => {
                        let shared = worker.shared.clone();
                        let _ = ready_tx.send(Ok(shared));
                        while let Ok(job) = job_rx.recv() {
                            job(&mut worker);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start the policy thread: {e}")))?;
        let shared = ready_rx.recv().map_err(|_| PolicyError::Stopped)??;
        Ok(Self { jobs, shared })
    }

    fn ask<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Worker) -> Result<T, PolicyError> + Send + 'static,
    ) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        let _ = self.jobs.send(Box::new(move |worker: &mut Worker| {
            let _ = tx.send(job(worker));
        }));
        Reply(rx)
    }

    /// Feeds an event; returns the actions to execute.
    pub fn handle(&self, event: Event) -> Reply<Vec<Action>> {
        self.ask(move |w| match w.step(Input::Event(event))? {
            Output::Actions(actions) => Ok(actions),
            _ => unreachable!("an event yields actions"),
        })
    }

    /// Feeds the event `make` builds, then hands its outcome to `then`; both run on the policy
    /// thread. Building the event there keeps its time from running behind an earlier input's,
    /// and `then` sees outcomes in exactly the order the policy decided them. Nothing waits: the
    /// input is queued ahead of anything asked after this returns.
    pub fn handle_then(
        &self,
        make: impl FnOnce() -> Event + Send + 'static,
        then: impl FnOnce(Result<Vec<Action>, PolicyError>) + Send + 'static,
    ) {
        let _ = self.jobs.send(Box::new(move |w: &mut Worker| {
            then(match w.step(Input::Event(make())) {
                Ok(Output::Actions(actions)) => Ok(actions),
                Ok(_) => unreachable!("an event yields actions"),
                Err(error) => Err(error),
            })
        }));
    }

    /// Asks whether a tool call may go out.
    pub fn admit(&self, request: CallRequest) -> Reply<Admission> {
        self.ask(move |w| match w.step(Input::Admit(request))? {
            Output::Admission(admission) => Ok(admission),
            _ => unreachable!("an admission request yields an admission"),
        })
    }

    /// Every server's status as the policy sees it.
    pub fn status(&self) -> Reply<Vec<ServerStatus>> {
        self.ask(move |w| match w.step(Input::Status)? {
            Output::Status(status) => Ok(status),
            _ => unreachable!("a status request yields status"),
        })
    }

    /// Changes the settings, keeping all state. A refusal leaves everything as it was.
    pub fn set_settings(&self, settings: String) -> Reply<()> {
        self.ask(move |w| {
            w.step(Input::Settings(settings.clone()))?;
            w.settings = settings.clone();
            w.describe();
            w.notify(PolicyNotice::SettingsChanged { settings });
            Ok(())
        })
    }

    /// A snapshot of the running policy's state.
    pub fn snapshot(&self) -> Reply<Vec<u8>> {
        self.ask(move |w| {
            w.checkpoint();
            Ok(w.last_good.clone())
        })
    }

    /// Replaces the running policy, keeping its state. The new component is compiled on the
    /// calling thread (use `spawn_blocking` in async code); the policy thread pauses only to
    /// move the state. On failure the old policy keeps running.
    pub fn swap_blocking(&self, source: &PolicySource) -> Result<PolicyInfo, PolicyError> {
        let policy = self.shared.engine.load(source)?;
        self.ask(move |w| w.swap(policy)).wait()
    }

    /// Async form of [`Self::swap_blocking`].
    pub async fn swap(&self, source: PolicySource) -> Result<PolicyInfo, PolicyError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.swap_blocking(&source))
            .await
            .unwrap_or(Err(PolicyError::Stopped))
    }

    /// What runs now.
    pub fn running(&self) -> RunningPolicy {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn stats(&self) -> &RuntimeStats {
        &self.shared.stats
    }

    /// Faults, recoveries, fallbacks and swaps as they happen.
    pub fn notices(&self) -> broadcast::Receiver<PolicyNotice> {
        self.shared.notices.subscribe()
    }
}

enum Input {
    Event(Event),
    Admit(CallRequest),
    Settings(String),
    Status,
}

impl Input {
    /// Whether the input can change the policy's state (and so belongs in the replay journal).
    fn changes_state(&self) -> bool {
        !matches!(self, Input::Status)
    }
}

enum Output {
    Actions(Vec<Action>),
    Admission(Admission),
    Status(Vec<ServerStatus>),
    Done,
}

struct Worker {
    shared: Arc<Shared>,
    limits: Limits,
    fallback_to_default: bool,
    checkpoint_every: usize,
    policy: Arc<LoadedPolicy>,
    instance: PolicyInstance,
    settings: String,
    /// The state after the inputs before `journal`.
    last_good: Vec<u8>,
    journal: Vec<Input>,
    /// What the host has told the policy about its servers, to re-teach a fresh default policy.
    configured: BTreeMap<String, ServerConfig>,
    /// Actions produced while re-teaching a fallback policy, delivered with the next event.
    pending_actions: Vec<Action>,
    last_now: u64,
}

impl Worker {
    fn start(
        engine: Arc<PolicyEngine>,
        policy: Arc<LoadedPolicy>,
        options: &RuntimeOptions,
    ) -> Result<Self, PolicyError> {
        let mut instance = PolicyInstance::instantiate(&policy, &options.limits)?;
        instance.init(&options.settings)?;
        let last_good = instance.snapshot()?;
        let (notices, _) = broadcast::channel(256);
        let shared = Arc::new(Shared {
            engine,
            stats: RuntimeStats::default(),
            notices,
            running: Mutex::new(describe(&policy, None, &options.settings)),
        });
        let mut worker = Self {
            shared,
            limits: options.limits.clone(),
            fallback_to_default: options.fallback_to_default,
            checkpoint_every: options.checkpoint_every.max(1),
            policy,
            instance,
            settings: options.settings.clone(),
            last_good,
            journal: Vec::new(),
            configured: BTreeMap::new(),
            pending_actions: Vec::new(),
            last_now: 0,
        };
        worker.describe();
        Ok(worker)
    }

    fn notify(&self, notice: PolicyNotice) {
        let _ = self.shared.notices.send(notice);
    }

    fn describe(&mut self) {
        let info = self.instance.info().ok();
        *self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = describe(&self.policy, info, &self.settings);
    }

    fn apply(
        instance: &mut PolicyInstance,
        known: &BTreeMap<String, ServerConfig>,
        input: &Input,
    ) -> Result<Output, PolicyError> {
        Ok(match input {
            Input::Event(event) => {
                let actions = instance.handle(event)?;
                check_actions(&actions, known, event).map_err(|why| {
                    instance
                        .policy()
                        .fault("handle", PolicyFault::InvalidOutput(why))
                })?;
                Output::Actions(actions)
            }
            Input::Admit(request) => {
                let admission = instance.admit(request)?;
                check_admission(&admission).map_err(|why| {
                    instance
                        .policy()
                        .fault("admit", PolicyFault::InvalidOutput(why))
                })?;
                Output::Admission(admission)
            }
            Input::Settings(settings) => {
                instance.set_settings(settings)?;
                Output::Done
            }
            Input::Status => Output::Status(instance.status()?),
        })
    }

    fn step(&mut self, input: Input) -> Result<Output, PolicyError> {
        let started = Instant::now();
        let mut result = Self::apply(&mut self.instance, &self.configured, &input);
        if let Err(fault @ PolicyError::Fault { .. }) = result {
            result = self.contain(fault, &input);
        }
        let stats = &self.shared.stats;
        stats.decisions.fetch_add(1, Ordering::Relaxed);
        stats
            .decision_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut output = result?;
        if let Output::Actions(actions) = &mut output
            && !self.pending_actions.is_empty()
        {
            let mut all = std::mem::take(&mut self.pending_actions);
            all.append(actions);
            *actions = all;
        }
        self.commit(input);
        Ok(output)
    }

    fn report(&self, error: &PolicyError) {
        tracing::error!(policy = %self.policy.label(), "policy fault contained: {error}");
        self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
        self.notify(PolicyNotice::Fault {
            policy: self.policy.label().to_string(),
            error: error.to_string(),
        });
    }

    /// Recovers from a fault on `input` and answers it, or says why it could not.
    fn contain(&mut self, fault: PolicyError, input: &Input) -> Result<Output, PolicyError> {
        self.report(&fault);
        let last_error;
        match self.rebuild(self.policy.clone()) {
            Ok(instance) => {
                self.instance = instance;
                self.shared.stats.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(policy = %self.policy.label(), "policy restored into a fresh instance");
                self.notify(PolicyNotice::Recovered {
                    policy: self.policy.label().to_string(),
                });
                match Self::apply(&mut self.instance, &self.configured, input) {
                    Err(again @ PolicyError::Fault { .. }) => {
                        self.report(&again);
                        last_error = again;
                    }
                    answer => return answer,
                }
            }
            Err(error) => {
                self.report(&error);
                last_error = error;
            }
        }
        self.fall_back(&last_error)?;
        Self::apply(&mut self.instance, &self.configured, input)
    }

    /// A fresh instance of `policy` in the state of the current one before the failed input.
    fn rebuild(&self, policy: Arc<LoadedPolicy>) -> Result<PolicyInstance, PolicyError> {
        let mut instance = PolicyInstance::instantiate(&policy, &self.limits)?;
        instance.init(&self.settings)?;
        self.restore_into(&mut instance)?;
        Ok(instance)
    }

    fn restore_into(&self, instance: &mut PolicyInstance) -> Result<(), PolicyError> {
        instance.restore(&self.last_good)?;
        for input in &self.journal {
            Self::apply(instance, &self.configured, input)?;
        }
        Ok(())
    }

    fn fall_back(&mut self, reason: &PolicyError) -> Result<(), PolicyError> {
        let default = PolicySource::Embedded.label();
        if !self.fallback_to_default || self.policy.label() == default {
            return Err(reason.clone());
        }
        let policy = self.shared.engine.load(&PolicySource::Embedded)?;
        let from = self.policy.label().to_string();
        tracing::error!(
            policy = %from,
            "POLICY REPLACED: {from} keeps failing ({reason}); the embedded default policy takes over"
        );
        let mut instance = PolicyInstance::instantiate(&policy, &self.limits)?;
        if let Err(refused) = instance.init(&self.settings) {
            // The failing policy's settings need not suit the default; the state carries its own.
            tracing::warn!("{refused}; the default policy starts from its default settings");
            instance = PolicyInstance::instantiate(&policy, &self.limits)?;
            instance.init("{}")?;
            self.settings = "{}".to_string();
        }
        if let Err(error) = self.restore_into(&mut instance) {
            // The saved state is not in the default's format: start clean and re-teach servers.
            tracing::warn!(
                "the default policy cannot take over the saved state ({error}); re-learning servers"
            );
            instance = PolicyInstance::instantiate(&policy, &self.limits)?;
            instance.init(&self.settings)?;
            for config in self.configured.values() {
                let event = Event {
                    now: self.last_now,
                    kind: EventKind::ServerConfigured(config.clone()),
                };
                self.pending_actions.extend(instance.handle(&event)?);
            }
        }
        self.policy = policy;
        self.instance = instance;
        self.shared.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.notify(PolicyNotice::FellBack {
            from,
            reason: reason.to_string(),
        });
        self.describe();
        self.checkpoint();
        Ok(())
    }

    fn commit(&mut self, input: Input) {
        if !input.changes_state() {
            return;
        }
        if let Input::Event(event) = &input {
            self.last_now = self.last_now.max(event.now);
            match &event.kind {
                EventKind::ServerConfigured(config) => {
                    self.configured.insert(config.name.clone(), config.clone());
                }
                EventKind::ServerRemoved(name) => {
                    self.configured.remove(name);
                }
                _ => {}
            }
        }
        self.journal.push(input);
        if self.journal.len() >= self.checkpoint_every {
            self.checkpoint();
        }
    }

    /// Moves `last_good` up to now. A policy whose snapshot fails is recovered or replaced.
    fn checkpoint(&mut self) {
        match self.instance.snapshot() {
            Ok(snapshot) => {
                self.last_good = snapshot;
                self.journal.clear();
            }
            Err(error) => {
                self.report(&error);
                if self.fall_back(&error).is_err() {
                    // No way out: keep the journal (the state is still reproducible from it).
                    tracing::error!(policy = %self.policy.label(), "cannot snapshot the policy; keeping the replay journal");
                }
            }
        }
    }

    fn swap(&mut self, policy: Arc<LoadedPolicy>) -> Result<PolicyInfo, PolicyError> {
        self.checkpoint();
        let mut instance = self.rebuild(policy.clone())?;
        let info = instance.info()?;
        let from = self.policy.label().to_string();
        self.policy = policy;
        self.instance = instance;
        self.shared.stats.swaps.fetch_add(1, Ordering::Relaxed);
        tracing::info!(from = %from, to = %self.policy.label(), "policy swapped");
        self.notify(PolicyNotice::Swapped {
            from,
            to: self.policy.label().to_string(),
        });
        self.describe();
        self.checkpoint();
        Ok(info)
    }
}

fn describe(policy: &LoadedPolicy, info: Option<PolicyInfo>, settings: &str) -> RunningPolicy {
    let (name, version) = info.map(|i| (i.name, i.version)).unwrap_or_default();
    RunningPolicy {
        label: policy.label().to_string(),
        name,
        version,
        contract: policy.contract_version().to_string(),
        digest: policy.digest().to_string(),
        settings: settings.to_string(),
    }
}

/// The longest message for the model a policy may produce.
const MAX_MESSAGE: usize = 4096;

fn check_admission(admission: &Admission) -> Result<(), String> {
    match admission {
        Admission::Reject(message) | Admission::Reconnect(message) => {
            if message.trim().is_empty() {
                Err("a refusal without a message for the model".into())
            } else if message.len() > MAX_MESSAGE {
                Err(format!(
                    "a refusal message of {} bytes (limit {MAX_MESSAGE})",
                    message.len()
                ))
            } else {
                Ok(())
            }
        }
        Admission::Allow | Admission::Probe => Ok(()),
    }
}

/// Refuses action lists no correct policy produces: actions about servers the host never
/// configured, and tool names agents could not use or could confuse.
fn check_actions(
    actions: &[Action],
    known: &BTreeMap<String, ServerConfig>,
    event: &Event,
) -> Result<(), String> {
    let configuring = match &event.kind {
        EventKind::ServerConfigured(config) => Some(config.name.as_str()),
        _ => None,
    };
    let is_known = |server: &str| known.contains_key(server) || configuring == Some(server);
    for action in actions {
        let server = match action {
            Action::Connect(s) | Action::Disconnect(s) | Action::WithdrawTools(s) => s,
            Action::WakeAt(wake) => &wake.server,
            Action::StateChanged(change) => &change.server,
            Action::PublishTools(publication) => {
                let mut names = std::collections::HashSet::new();
                for tool in &publication.tools {
                    if !valid_tool_name(&tool.advertised) {
                        return Err(format!(
                            "published an unusable tool name {:?}",
                            truncate(&tool.advertised)
                        ));
                    }
                    if tool.original.is_empty() {
                        return Err(format!(
                            "published {} without its original name",
                            tool.advertised
                        ));
                    }
                    if !names.insert(tool.advertised.as_str()) {
                        return Err(format!("published {} twice", tool.advertised));
                    }
                }
                &publication.server
            }
        };
        if !is_known(server) {
            return Err(format!(
                "acted on a server the host never configured: {:?}",
                truncate(server)
            ));
        }
    }
    Ok(())
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn truncate(text: &str) -> String {
    text.chars().take(80).collect()
}
