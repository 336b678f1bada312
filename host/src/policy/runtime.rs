//! The policy runtime: one policy instance, fed events and admissions in order. Decisions run
//! inline on the caller's thread when nothing is queued, the instance is free and the input hands
//! over little tool data (a large tool list is work for the policy thread): a decision
//! takes well under a microsecond, while waking a sleeping thread and being woken back costs tens
//! of microseconds on a small VM. Everything else (and any input that finds the queue busy) goes
//! through a FIFO to a dedicated policy thread. It contains every guest failure:
//!
//! 1. a fault (trap, endless loop, memory blow-up, invalid output) discards the instance;
//! 2. a fresh instance is restored from the last good snapshot plus the journal of inputs since,
//!    and the failed input is tried once more;
//! 3. if that fails too, the embedded default policy takes over (restoring the same state when it
//!    can, else by a handover) and the failure is logged loudly.
//!
//! Swaps compile the new component off the policy thread, then move the state across; if any
//! step fails the old policy keeps running and the caller gets the reason. The state moves by
//! snapshot between builds of one implementation (it carries everything), and otherwise by a
//! handover ([`SwapPath`]): what the host knows (the [`Ledger`]) plus what the outgoing policy
//! reports in `status`, given to a 0.2 policy's `take-over` or taught to a 0.1 policy as events.
//! Either way live sessions are kept: the incoming policy's `connect`s for them are dropped.
//!
//! An inline decision gets a small fuel budget. If it runs out, faults, or panics (a host
//! function under the guest can: wasmtime-wasi's sync bindings block on tokio, which panics on a
//! tokio worker; the engine replaces the ones a guest's stdout and stderr use, so printing does
//! not), the input goes to the policy thread instead, which starts from the last good state and
//! handles it with the full budget; only what fails there counts as a fault.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::task::{Context, Poll};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::{broadcast, oneshot};

use super::engine::{LoadedPolicy, PolicyEngine, PolicySource};
use super::instance::{HeldData, Limits, PolicyInstance, rough_tool_data};
use super::ledger::Ledger;
use super::outputs::{check_actions, check_take_over};
use super::record::{Divergence, Record, Recorder, event_name, redact_actions};
use super::types::{
    Action, Admission, BreakerState, CallRequest, Event, EventKind, Millis, NamedPrompt,
    PolicyInfo, ServerConfig, ServerState, ServerStatus,
};
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
    /// Fuel for a decision made inline on the caller's thread; a decision that needs more is
    /// made on the policy thread. 0: every input goes through the policy thread.
    pub inline_fuel: u64,
    /// Record every decision (input and output) in this file, as JSON lines (see
    /// [`super::record`]).
    pub record: Option<PathBuf>,
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
            inline_fuel: DEFAULT_INLINE_FUEL,
            record: None,
        }
    }
}

/// Something operators should hear about.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyNotice {
    /// A guest call failed; `error` names the policy and the fault.
    Fault {
        /// The failing policy's label.
        policy: String,
        /// The error, in words.
        error: String,
    },
    /// A fresh instance of the same policy was restored to the last good state.
    Recovered {
        /// The policy's label.
        policy: String,
    },
    /// The embedded default policy replaced a failing one.
    FellBack {
        /// The label of the policy that failed.
        from: String,
        /// Why it was replaced.
        reason: String,
    },
    /// An operator swapped the policy.
    Swapped {
        /// The outgoing policy's label.
        from: String,
        /// The incoming policy's label.
        to: String,
    },
    /// An operator changed the settings.
    SettingsChanged {
        /// The new settings, as a JSON object.
        settings: String,
    },
    /// A candidate policy runs beside the live one, acting on nothing.
    ShadowStarted {
        /// The shadow policy's label.
        policy: String,
    },
    /// The shadow policy decided otherwise than the live one (first time on this server).
    ShadowDiverged {
        /// The shadow policy's label.
        policy: String,
        /// The server the decision was about.
        server: String,
        /// What diverged (`"<event> actions"` or `"admission"`).
        decision: String,
    },
    /// The shadow policy failed and was dropped.
    ShadowDropped {
        /// The shadow policy's label.
        policy: String,
        /// Why it was dropped.
        reason: String,
    },
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Guest faults contained.
    pub faults: AtomicU64,
    /// Faulted instances rebuilt from the last good state.
    pub recoveries: AtomicU64,
    /// Times the embedded default policy replaced a failing one.
    pub fallbacks: AtomicU64,
    /// Policy swaps done.
    pub swaps: AtomicU64,
    /// Inputs the policy decided.
    pub decisions: AtomicU64,
    /// Time spent deciding them, in nanoseconds.
    pub decision_nanos: AtomicU64,
    /// Inline decisions handed to the policy thread (over budget, a fault, a panic).
    pub inline_misses: AtomicU64,
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

/// The host's clock, in the milliseconds events carry.
pub type HostClock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// How a swap moved the state into the incoming policy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SwapPath {
    /// Same implementation: its own snapshot, which carries everything.
    Snapshot,
    /// Another implementation of contract 0.2: `take-over` of the handover.
    Handover,
    /// A contract 0.1 policy: taught the servers and live sessions as events.
    Events,
}

/// What a swap did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SwapReport {
    /// The incoming policy.
    pub info: PolicyInfo,
    /// How the state was moved into it.
    pub path: SwapPath,
    /// What the incoming policy could not be given, in words for operators.
    pub not_carried: Vec<String>,
    /// What the incoming policy asked the host to do (publications, timers); the caller
    /// executes them. Never a `connect` or `disconnect` of a live session.
    #[serde(skip)]
    pub actions: Vec<Action>,
}

struct Shared {
    engine: Arc<PolicyEngine>,
    /// The host's time for `status` and swaps, when the host has set it.
    clock: Mutex<Option<HostClock>>,
    stats: RuntimeStats,
    notices: broadcast::Sender<PolicyNotice>,
    running: Mutex<RunningPolicy>,
    /// Jobs sent to the policy thread and not finished yet; inline decisions wait for zero.
    queued: AtomicUsize,
}

type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// Fuel for an inline decision. The default policy's decisions take a few thousand units; a
/// decision that needs more is made on the policy thread, not on the caller's.
pub const DEFAULT_INLINE_FUEL: u64 = 5_000_000;

/// Handle to the policy. Cheap to clone; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct PolicyRuntime {
    jobs: mpsc::Sender<Job>,
    shared: Arc<Shared>,
    worker: Arc<Mutex<Worker>>,
}

/// An answer from the policy: `.await` it, or `.wait()` outside async code. An answer decided
/// inline is already there.
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
                    Ok(worker) => {
                        let shared = worker.shared.clone();
                        let worker = Arc::new(Mutex::new(worker));
                        let _ = ready_tx.send(Ok((shared.clone(), worker.clone())));
                        while let Ok(job) = job_rx.recv() {
                            let mut worker = worker.lock().unwrap_or_else(|e| e.into_inner());
                            job(&mut worker);
                            // Still under the lock: an inline decision must not overtake this job.
                            shared.queued.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start the policy thread: {e}")))?;
        let (shared, worker) = ready_rx.recv().map_err(|_| PolicyError::Stopped)??;
        Ok(Self {
            jobs,
            shared,
            worker,
        })
    }

    /// Queues a job for the policy thread, behind everything queued before.
    fn queue(&self, job: impl FnOnce(&mut Worker) + Send + 'static) {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if self.jobs.send(Box::new(job)).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn ask<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Worker) -> Result<T, PolicyError> + Send + 'static,
    ) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        self.queue(move |worker: &mut Worker| {
            let _ = tx.send(job(worker));
        });
        Reply(rx)
    }

    /// The worker, when an input may be decided on the caller's thread: nothing is queued ahead
    /// of it and no one else is deciding.
    fn inline_worker(&self) -> Option<MutexGuard<'_, Worker>> {
        let queued = || self.shared.queued.load(Ordering::SeqCst);
        if queued() != 0 {
            return None;
        }
        let worker = self.worker.try_lock().ok()?;
        // A shadow decides on the policy thread only, never on a caller's.
        (worker.inline && worker.shadow.is_none() && queued() == 0).then_some(worker)
    }

    /// Decides the input `make` builds inline if it may be, else queues it for the policy
    /// thread (which builds it when it gets there). `answer` runs once, with the outcome, in
    /// decision order relative to every other input (under the worker's lock).
    fn decide(
        &self,
        make: impl FnOnce() -> Input + Send + 'static,
        answer: impl FnOnce(Result<Output, PolicyError>) + Send + 'static,
    ) {
        if let Some(mut worker) = self.inline_worker() {
            let input = make();
            if input.is_heavy(worker.policy.contract().carries_descriptions()) {
                // Straight to the policy thread (queued while holding the worker, so nothing
                // overtakes it): inline, it would run out of its budget and leave an instance
                // to rebuild, which costs far more than the hand-off.
                self.queue(move |w| answer(w.step(input)));
                return;
            }
            match worker.step_inline(input) {
                Ok(outcome) => answer(outcome),
                // Queued while still holding the worker, so nothing decided later overtakes it.
                Err(missed) => self.queue(move |w| {
                    let (input, miss) = *missed;
                    answer(w.redo(input, miss))
                }),
            }
            return;
        }
        self.queue(move |w| answer(w.step(make())));
    }

    fn decide_reply<T: Send + 'static>(&self, input: Input, extract: fn(Output) -> T) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        self.decide(
            move || input,
            move |outcome| {
                let _ = tx.send(outcome.map(extract));
            },
        );
        Reply(rx)
    }

    /// Feeds an event; returns the actions to execute.
    pub fn handle(&self, event: Event) -> Reply<Vec<Action>> {
        self.decide_reply(Input::Event(event), Output::into_actions)
    }

    /// Feeds the event `make` builds, then hands its outcome to `then`, in exactly the order the
    /// policy decided them. Building the event when it is decided keeps its time from running
    /// behind an earlier input's. Nothing waits: the input is decided or queued ahead of
    /// anything asked after this returns.
    pub fn handle_then(
        &self,
        make: impl FnOnce() -> Event + Send + 'static,
        then: impl FnOnce(Result<Vec<Action>, PolicyError>) + Send + 'static,
    ) {
        self.decide(
            move || Input::Event(make()),
            move |outcome| then(outcome.map(Output::into_actions)),
        );
    }

    /// Asks whether a tool call may go out.
    pub fn admit(&self, request: CallRequest) -> Reply<Admission> {
        self.decide_reply(Input::Admit(request), Output::into_admission)
    }

    /// The names agents see for a server's prompts, as a contract 0.2.1 policy gives them;
    /// `None` from an older policy, which cannot be asked (the host then names them by the
    /// default rule). Changes no state.
    pub fn name_prompts(
        &self,
        server: String,
        originals: Vec<String>,
    ) -> Reply<Option<Vec<NamedPrompt>>> {
        self.decide_reply(
            Input::NamePrompts { server, originals },
            |output| match output {
                Output::Prompts(named) => named,
                _ => unreachable!("a naming request yields names"),
            },
        )
    }

    /// Every server's status as the policy sees it, at the host's time (see
    /// [`Self::set_clock`]; without a clock, at the latest event's time).
    pub fn status(&self) -> Reply<Vec<ServerStatus>> {
        self.ask(move |w| {
            let now = w.now();
            match w.step(Input::Status(now))? {
                Output::Status(status) => Ok(status),
                _ => unreachable!("a status request yields status"),
            }
        })
    }

    /// Gives the runtime the host's clock (the time events carry), for `status` and swaps.
    pub fn set_clock(&self, clock: HostClock) {
        *self.shared.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some(clock);
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

    /// Whether the running policy accepts a server's configuration (its per-server settings
    /// and tool filters), asked of a scratch instance with the current settings: the live one
    /// is not touched. A policy refuses a configuration by parking the server the moment it is
    /// configured; `Some(reason)` is that refusal. Lets a config file be checked when it is
    /// read, instead of a server parking later.
    pub fn check_server(&self, config: ServerConfig) -> Reply<Option<String>> {
        self.ask(move |w| {
            let mut scratch = PolicyInstance::instantiate(&w.policy, &w.limits)?;
            scratch.init(&w.settings)?;
            let name = config.name.clone();
            let event = Event {
                now: w.last_now,
                kind: EventKind::ServerConfigured(config),
            };
            Ok(scratch
                .handle_with(&event, &|server, original| w.ledger.tool(server, original))?
                .into_iter()
                .find_map(|action| match action {
                    Action::StateChanged(change)
                        if change.server == name && change.state == ServerState::Parked =>
                    {
                        Some(change.detail)
                    }
                    _ => None,
                }))
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
    /// The report's actions are the caller's to execute (see [`Self::swap_then`]).
    pub fn swap_blocking(&self, source: &PolicySource) -> Result<SwapReport, PolicyError> {
        let policy = self.shared.engine.load(source)?;
        self.ask(move |w| w.swap(policy)).wait()
    }

    /// Async form of [`Self::swap_blocking`].
    pub async fn swap(&self, source: PolicySource) -> Result<SwapReport, PolicyError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.swap_blocking(&source))
            .await
            .unwrap_or(Err(PolicyError::Stopped))
    }

    /// Swaps to an already loaded policy and hands the outcome to `then` in decision order (as
    /// [`Self::handle_then`] does), so the swap's actions are executed before those of any
    /// input decided after it.
    pub fn swap_then(
        &self,
        policy: Arc<LoadedPolicy>,
        then: impl FnOnce(Result<SwapReport, PolicyError>) + Send + 'static,
    ) {
        self.queue(move |w| then(w.swap(policy)));
    }

    /// Starts running `source` beside the live policy, given the live state as a swap would,
    /// on the live inputs, acting on nothing, until promoted ([`Self::swap_from_shadow_then`])
    /// or dropped. Replaces any earlier shadow. Blocking (compiles).
    pub fn shadow_blocking(&self, source: &PolicySource) -> Result<ShadowReport, PolicyError> {
        let policy = self.shared.engine.load(source)?;
        self.ask(move |w| w.start_shadow(policy)).wait()
    }

    /// The shadow policy, if one runs.
    pub fn shadow_policy(&self) -> Reply<Option<Arc<LoadedPolicy>>> {
        self.ask(|w| Ok(w.shadow.as_ref().map(|s| s.policy.clone())))
    }

    /// The engine that compiles this runtime's policies.
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.shared.engine
    }

    /// The shadow policy's comparison so far, if one runs.
    pub fn shadow_report(&self) -> Reply<Option<ShadowReport>> {
        self.ask(|w| Ok(w.shadow.as_ref().map(|s| s.report.clone())))
    }

    /// Stops the shadow policy; false if none ran.
    pub fn drop_shadow(&self) -> Reply<bool> {
        self.ask(|w| {
            let dropped = w.shadow.take();
            if let Some(shadow) = &dropped {
                w.notify(PolicyNotice::ShadowDropped {
                    policy: shadow.report.label.clone(),
                    reason: "dropped by an operator".into(),
                });
            }
            Ok(dropped.is_some())
        })
    }

    /// Swaps to the shadow policy (from the live state, as any swap), as [`Self::swap_then`].
    pub fn swap_from_shadow_then(
        &self,
        then: impl FnOnce(Result<SwapReport, PolicyError>) + Send + 'static,
    ) {
        self.queue(move |w| {
            let result = match w.shadow.take() {
                Some(shadow) => {
                    let swapped = w.swap(shadow.policy.clone());
                    if swapped.is_err() {
                        // Not promoted: it keeps shadowing.
                        w.shadow = Some(shadow);
                    }
                    swapped
                }
                None => Err(PolicyError::NoShadow),
            };
            then(result)
        });
    }

    /// Compiles (or finds compiled) and vets a policy component without running it.
    pub fn load(&self, source: &PolicySource) -> Result<Arc<LoadedPolicy>, PolicyError> {
        self.shared.engine.load(source)
    }

    /// What runs now.
    pub fn running(&self) -> RunningPolicy {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counters for metrics.
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
    Status(Millis),
    NamePrompts {
        server: String,
        originals: Vec<String>,
    },
}

/// Events handing over more tool data than this are decided on the policy thread: a decision
/// costs up to ~110 fuel per byte of it (a list of tiny tools), and the inline budget
/// ([`DEFAULT_INLINE_FUEL`]) is meant for the decisions that take a few thousand.
const INLINE_TOOL_DATA: usize = 16 << 10;

impl Input {
    /// Whether deciding the input is work for the policy thread, whatever the queue, for a
    /// policy that is (`descriptions`) or is not handed tool descriptions.
    fn is_heavy(&self, descriptions: bool) -> bool {
        matches!(self, Input::Event(event) if rough_tool_data(event, descriptions) > INLINE_TOOL_DATA)
    }

    /// Whether the input can change the policy's state (and so belongs in the replay journal).
    fn changes_state(&self) -> bool {
        !matches!(self, Input::Status(_) | Input::NamePrompts { .. })
    }
}

enum Output {
    Actions(Vec<Action>),
    Admission(Admission),
    Status(Vec<ServerStatus>),
    Prompts(Option<Vec<NamedPrompt>>),
    Done,
}

impl Output {
    fn into_actions(self) -> Vec<Action> {
        match self {
            Output::Actions(actions) => actions,
            _ => unreachable!("an event yields actions"),
        }
    }

    fn into_admission(self) -> Admission {
        match self {
            Output::Admission(admission) => admission,
            _ => unreachable!("an admission request yields an admission"),
        }
    }
}

/// Why an inline decision went to the policy thread.
#[derive(Debug)]
enum InlineMiss {
    /// It needed more than the inline fuel budget (which is smaller than the full one).
    OverBudget,
    /// The guest faulted: handled like any fault.
    Fault(PolicyError),
    /// A host function panicked under the guest (a blocking WASI call on a tokio worker).
    Panicked,
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
    /// The tool data `last_good` holds, per server: sizes the memory cap of an instance it is
    /// restored into (and removing a server afterwards releases its share).
    last_good_held: HeldData,
    /// The ledger as it was at `last_good`: the journal is replayed on a copy of it.
    last_good_ledger: Ledger,
    journal: Vec<Input>,
    /// What is true of the servers, for handovers and 0.2 publications.
    ledger: Ledger,
    /// Actions produced while re-teaching a fallback policy, delivered with the next event.
    pending_actions: Vec<Action>,
    last_now: u64,
    /// Whether inputs may be decided on the caller's thread.
    inline: bool,
    inline_fuel: u64,
    /// An inline decision was cut short: the instance must be rebuilt before its next use.
    poisoned: bool,
    recorder: Option<Recorder>,
    shadow: Option<Shadow>,
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
            clock: Mutex::new(None),
            queued: AtomicUsize::new(0),
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
            last_good_held: HeldData::default(),
            last_good_ledger: Ledger::default(),
            journal: Vec::new(),
            ledger: Ledger::default(),
            pending_actions: Vec::new(),
            last_now: 0,
            inline: options.inline_fuel > 0,
            inline_fuel: options.inline_fuel,
            poisoned: false,
            recorder: options
                .record
                .as_deref()
                .map(Recorder::create)
                .transpose()?,
            shadow: None,
        };
        worker.describe();
        worker.record_policy();
        Ok(worker)
    }

    /// The host's time, never behind the latest event's.
    fn now(&self) -> Millis {
        let clock = self
            .shared
            .clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        clock.map_or(self.last_now, |clock| clock().max(self.last_now))
    }

    /// Notes in the recording which policy decides from here on.
    fn record_policy(&mut self) {
        let Some(recorder) = &mut self.recorder else {
            return;
        };
        let running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        recorder.write(Record::Policy {
            label: running.label,
            name: running.name,
            version: running.version,
            contract: running.contract,
            settings: running.settings,
        });
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
        ledger: &mut Ledger,
        input: &Input,
    ) -> Result<Output, PolicyError> {
        Ok(match input {
            Input::Event(event) => Output::Actions(instance.decide_event(ledger, event)?),
            Input::Admit(request) => Output::Admission(instance.decide_admission(request)?),
            Input::Settings(settings) => {
                instance.set_settings(settings)?;
                Output::Done
            }
            Input::Status(now) => Output::Status(instance.status(*now)?),
            Input::NamePrompts { server, originals } => {
                Output::Prompts(instance.name_prompts(server, originals)?)
            }
        })
    }

    fn step(&mut self, input: Input) -> Result<Output, PolicyError> {
        self.heal();
        let started = Instant::now();
        let mut result = Self::apply(&mut self.instance, &mut self.ledger, &input);
        if let Err(fault @ PolicyError::Fault { .. }) = result {
            result = self.contain(fault, &input);
        }
        self.finish(input, started, result)
    }

    /// Decides `input` on the caller's thread with the inline budget, or gives it back (with
    /// the instance marked for rebuilding) when only the policy thread may answer it.
    fn step_inline(
        &mut self,
        input: Input,
    ) -> Result<Result<Output, PolicyError>, Box<(Input, InlineMiss)>> {
        let started = Instant::now();
        let budget = self.inline_fuel.min(self.limits.fuel_per_call);
        let (instance, ledger) = (&mut self.instance, &mut self.ledger);
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            instance.with_fuel(budget, |instance| Self::apply(instance, ledger, &input))
        }));
        let miss = match applied {
            Ok(Err(PolicyError::Fault {
                fault: PolicyFault::OutOfFuel(_),
                ..
            })) if budget < self.limits.fuel_per_call => InlineMiss::OverBudget,
            Ok(Err(fault @ PolicyError::Fault { .. })) => InlineMiss::Fault(fault),
            Err(_) => InlineMiss::Panicked,
            Ok(result) => return Ok(self.finish(input, started, result)),
        };
        self.poisoned = true;
        self.inline = false;
        self.shared
            .stats
            .inline_misses
            .fetch_add(1, Ordering::Relaxed);
        Err(Box::new((input, miss)))
    }

    /// Decides an input an inline attempt gave up on.
    fn redo(&mut self, input: Input, miss: InlineMiss) -> Result<Output, PolicyError> {
        let policy = self.policy.label().to_string();
        match miss {
            // A fault like any other: reported, then retried once on a fresh instance.
            InlineMiss::Fault(fault) => {
                self.poisoned = false;
                let started = Instant::now();
                let result = self.contain(fault, &input);
                self.finish(input, started, result)
            }
            InlineMiss::OverBudget => {
                tracing::warn!(
                    policy,
                    "a decision needed more than {} fuel; decided again on the policy thread from the last good state",
                    self.inline_fuel
                );
                let faults = self.shared.stats.faults.load(Ordering::Relaxed);
                let result = self.step(input);
                // Fine with the full budget: only that decision was heavy.
                if self.shared.stats.faults.load(Ordering::Relaxed) == faults {
                    self.inline = true;
                }
                result
            }
            InlineMiss::Panicked => {
                tracing::warn!(
                    policy,
                    "the policy made a blocking WASI call during a decision on an async worker, where such calls panic (the panic above); it decides on the policy thread from now on"
                );
                self.step(input)
            }
        }
    }

    /// Replaces an instance an inline attempt left mid-call with one in the last good state.
    fn heal(&mut self) {
        if !std::mem::take(&mut self.poisoned) {
            return;
        }
        match self.rebuild(self.policy.clone()) {
            Ok(instance) => self.instance = instance,
            // The old instance fails its next call, and containment takes over from there.
            Err(error) => {
                tracing::warn!(policy = %self.policy.label(), "cannot rebuild the policy instance: {error}")
            }
        }
    }

    fn finish(
        &mut self,
        input: Input,
        started: Instant,
        result: Result<Output, PolicyError>,
    ) -> Result<Output, PolicyError> {
        let stats = &self.shared.stats;

        stats.decisions.fetch_add(1, Ordering::Relaxed);
        stats
            .decision_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut output = result?;
        if let Some(recorder) = &mut self.recorder {
            let record = match (&input, &output) {
                (Input::Event(event), Output::Actions(actions)) => Some(Record::Event {
                    event: event.clone(),
                    actions: actions.clone(),
                }),
                (Input::Admit(request), Output::Admission(admission)) => Some(Record::Admit {
                    request: request.clone(),
                    admission: admission.clone(),
                }),
                (Input::Settings(settings), _) => Some(Record::Settings {
                    settings: settings.clone(),
                }),
                _ => None,
            };
            if let Some(record) = record {
                recorder.write(record);
            }
        }
        self.shadow_step(&input, &output);
        // After the recording and the shadow, which compare the policy's own decisions: the
        // actions of a fallback's handover go out with this event's.
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
                match Self::apply(&mut self.instance, &mut self.ledger, input) {
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
        Self::apply(&mut self.instance, &mut self.ledger, input)
    }

    /// A fresh instance of `policy` in the state of the current one before the failed input.
    fn rebuild(&mut self, policy: Arc<LoadedPolicy>) -> Result<PolicyInstance, PolicyError> {
        let mut instance = PolicyInstance::instantiate(&policy, &self.limits)?;
        instance.init(&self.settings)?;
        self.restore_into(&mut instance)?;
        Ok(instance)
    }

    /// Restores the last good snapshot and replays the journal since, on a copy of the ledger
    /// as it was then (the live ledger already holds what the journal's events say, and may
    /// have forgotten servers the journal still acts on).
    fn restore_into(&mut self, instance: &mut PolicyInstance) -> Result<(), PolicyError> {
        instance.restore_holding(&self.last_good, self.last_good_held.clone())?;
        let mut ledger = self.last_good_ledger.clone();
        for input in &self.journal {
            Self::apply(instance, &mut ledger, input)?;
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
            // The saved state is not in the default's format: a handover of what is known (the
            // failing policy's own report, if it can still give one).
            tracing::warn!(
                "the default policy cannot take over the saved state ({error}); handing over what the host knows"
            );
            instance = PolicyInstance::instantiate(&policy, &self.limits)?;
            instance.init(&self.settings)?;
            let now = self.now();
            let status = self.instance.status(now).unwrap_or_default();
            let previous = PolicyInfo {
                name: from.clone(),
                version: String::new(),
            };
            let handover = self.ledger.handover(now, &status, previous);
            let ledger = &self.ledger;
            let actions =
                instance.take_over(&handover, &|server, original| ledger.tool(server, original))?;
            let actions = keep_sessions(actions, ledger, &mut Vec::new());
            self.ledger.note_actions(&actions);
            self.pending_actions.extend(actions);
        }
        self.policy = policy;
        self.instance = instance;
        self.inline = self.inline_fuel > 0;
        self.shared.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.notify(PolicyNotice::FellBack {
            from,
            reason: reason.to_string(),
        });
        self.describe();
        self.record_policy();
        self.checkpoint();
        Ok(())
    }

    fn commit(&mut self, input: Input) {
        if !input.changes_state() {
            return;
        }
        if let Input::Event(event) = &input {
            self.last_now = self.last_now.max(event.now);
        }
        self.journal.push(input);
        if self.journal.len() >= self.checkpoint_every {
            self.checkpoint();
        }
    }

    /// Moves `last_good` up to now. A policy whose snapshot fails is recovered or replaced.
    fn checkpoint(&mut self) {
        self.heal();
        match self.instance.snapshot() {
            Ok(snapshot) => {
                self.last_good = snapshot;
                self.last_good_held = self.instance.held().clone();
                self.last_good_ledger = self.ledger.clone();
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

    fn swap(&mut self, policy: Arc<LoadedPolicy>) -> Result<SwapReport, PolicyError> {
        self.checkpoint();
        let Prepared {
            instance: incoming,
            settings,
            report,
        } = self.prepare(&policy)?;
        self.ledger.note_actions(&report.actions);
        let from = self.policy.label().to_string();
        self.policy = policy;
        self.instance = incoming;
        self.settings = settings;
        self.journal.clear();
        self.inline = self.inline_fuel > 0;
        self.shared.stats.swaps.fetch_add(1, Ordering::Relaxed);
        tracing::info!(from = %from, to = %self.policy.label(), path = ?report.path, "policy swapped");
        for what in &report.not_carried {
            tracing::warn!(to = %self.policy.label(), "not carried over by the swap: {what}");
        }
        self.notify(PolicyNotice::Swapped {
            from,
            to: self.policy.label().to_string(),
        });
        self.describe();
        self.record_policy();
        self.checkpoint();
        Ok(report)
    }

    /// An instance of `policy` in the current state (by snapshot or handover, see [`SwapPath`]),
    /// and the actions that make the host match it. Changes nothing.
    fn prepare(&mut self, policy: &Arc<LoadedPolicy>) -> Result<Prepared, PolicyError> {
        let now = self.now();
        let outgoing = self.instance.info().ok();
        let mut not_carried = Vec::new();
        let limits = self.limits.clone();
        let fresh = |settings: &str| -> Result<PolicyInstance, PolicyError> {
            let mut instance = PolicyInstance::instantiate(policy, &limits)?;
            instance.init(settings)?;
            Ok(instance)
        };
        // Another implementation's settings need not suit it: then it runs on its defaults.
        let (mut incoming, settings) = match fresh(&self.settings) {
            Ok(instance) => (instance, self.settings.clone()),
            Err(refused @ PolicyError::Refused { .. }) => {
                not_carried.push(format!(
                    "the settings ({refused}): it runs on its default settings"
                ));
                (fresh("{}")?, "{}".to_string())
            }
            Err(error) => return Err(error),
        };
        let info = incoming.info()?;
        let same_implementation = outgoing.as_ref().is_some_and(|o| o.name == info.name)
            && policy.contract() == self.policy.contract()
            && settings == self.settings;
        let mut path = None;
        if same_implementation {
            match self.restore_into(&mut incoming) {
                Ok(()) => path = Some(SwapPath::Snapshot),
                // A build of the same implementation with another state format: hand over.
                Err(refused @ PolicyError::Refused { .. }) => {
                    tracing::warn!("{refused}; handing the state over instead");
                    incoming = fresh(&settings)?;
                }
                Err(error) => return Err(error),
            }
        }
        let mut actions = Vec::new();
        let path = match path {
            Some(path) => path,
            None => {
                // A failing outgoing policy cannot report: the host's own knowledge still goes.
                let status = self.instance.status(now).unwrap_or_else(|error| {
                    not_carried.push(format!("the outgoing policy's view ({error})"));
                    Vec::new()
                });
                let previous = outgoing.unwrap_or_else(|| PolicyInfo {
                    name: self.policy.label().to_string(),
                    version: String::new(),
                });
                let ledger = &self.ledger;
                let lookup = |server: &str, original: &str| ledger.tool(server, original);
                let path = if incoming.can_take_over() {
                    let handover = ledger.handover(now, &status, previous);
                    actions = incoming.take_over(&handover, &lookup)?;
                    check_take_over(&actions, ledger).map_err(|why| {
                        policy.fault("take-over", PolicyFault::InvalidOutput(why))
                    })?;
                    SwapPath::Handover
                } else {
                    for event in ledger.lessons(now, &status) {
                        actions.extend(incoming.handle_with(&event, &lookup)?);
                    }
                    not_carried.extend(unteachable(&status, ledger));
                    SwapPath::Events
                };
                actions = keep_sessions(actions, ledger, &mut not_carried);
                check_actions(&actions, ledger)
                    .map_err(|why| policy.fault("take-over", PolicyFault::InvalidOutput(why)))?;
                path
            }
        };
        Ok(Prepared {
            instance: incoming,
            settings,
            report: SwapReport {
                info,
                path,
                not_carried,
                actions,
            },
        })
    }

    /// Starts running `policy` beside the live one, on the live inputs, acting on nothing.
    fn start_shadow(&mut self, policy: Arc<LoadedPolicy>) -> Result<ShadowReport, PolicyError> {
        self.checkpoint();
        let Prepared {
            instance, report, ..
        } = self.prepare(&policy)?;
        let shadow = Shadow {
            report: ShadowReport {
                label: policy.label().to_string(),
                name: report.info.name.clone(),
                version: report.info.version.clone(),
                path: report.path,
                not_carried: report.not_carried,
                decisions: 0,
                divergences: 0,
                by_kind: BTreeMap::new(),
                first_per_server: BTreeMap::new(),
            },
            policy,
            instance,
        };
        tracing::info!(shadow = %shadow.report.label, "shadow policy started");
        self.notify(PolicyNotice::ShadowStarted {
            policy: shadow.report.label.clone(),
        });
        let report = shadow.report.clone();
        self.shadow = Some(shadow);
        Ok(report)
    }

    /// Feeds the shadow the input the live policy just decided, and compares.
    fn shadow_step(&mut self, input: &Input, live: &Output) {
        let Some(shadow) = &mut self.shadow else {
            return;
        };
        if !matches!(
            input,
            Input::Event(_) | Input::Admit(_) | Input::Settings(_)
        ) {
            return;
        }
        let ledger = &self.ledger;
        let lookup = |server: &str, original: &str| ledger.tool(server, original);
        let instance = &mut shadow.instance;
        // A small budget, and panics caught: a candidate that loops or breaks is dropped
        // without holding up the live policy for long.
        let decided = std::panic::catch_unwind(AssertUnwindSafe(|| {
            instance.with_fuel(SHADOW_FUEL, |instance| match (input, live) {
                (Input::Event(event), Output::Actions(live)) => {
                    instance.handle_with(event, &lookup).map(|mut actions| {
                        let mut live = live.clone();
                        redact_actions(&mut live);
                        redact_actions(&mut actions);
                        let server = event.kind.server().unwrap_or("(all)").to_string();
                        let kind = format!("{} actions", event_name(&event.kind));
                        (server, kind, to_value(&live), to_value(&actions))
                    })
                }
                (Input::Admit(request), Output::Admission(live)) => {
                    instance.admit(request).map(|admission| {
                        (
                            request.server.clone(),
                            "admission".to_string(),
                            to_value(live),
                            to_value(&admission),
                        )
                    })
                }
                (Input::Settings(settings), _) => instance
                    .set_settings(settings)
                    .map(|()| (String::new(), String::new(), Value::Null, Value::Null)),
                _ => Ok((String::new(), String::new(), Value::Null, Value::Null)),
            })
        }))
        .unwrap_or_else(|_| {
            Err(PolicyError::Engine(
                "a host function panicked under the shadow policy".into(),
            ))
        });
        let (server, kind, live, candidate) = match decided {
            Ok(compared) => compared,
            Err(error) => {
                let label = shadow.report.label.clone();
                tracing::warn!(shadow = %label, "shadow policy dropped: {error}");
                self.shadow = None;
                self.notify(PolicyNotice::ShadowDropped {
                    policy: label,
                    reason: error.to_string(),
                });
                return;
            }
        };
        if matches!(input, Input::Settings(_)) {
            return;
        }
        let report = &mut shadow.report;
        report.decisions += 1;
        if live == candidate {
            return;
        }
        report.divergences += 1;
        *report.by_kind.entry(kind.clone()).or_default() += 1;
        if report.first_per_server.contains_key(&server) {
            return;
        }
        let divergence = Divergence {
            line: report.decisions,
            server: server.clone(),
            kind: kind.clone(),
            recorded: live,
            candidate,
        };
        report.first_per_server.insert(server.clone(), divergence);
        let policy = report.label.clone();
        tracing::info!(shadow = %policy, server = %server, "the shadow policy decided otherwise ({kind})");
        self.notify(PolicyNotice::ShadowDiverged {
            policy,
            server,
            decision: kind,
        });
    }
}

/// Fuel for one decision of a shadow policy (the default's take a few thousand units).
const SHADOW_FUEL: u64 = 50_000_000;

/// An incoming policy, ready to take over.
struct Prepared {
    instance: PolicyInstance,
    settings: String,
    report: SwapReport,
}

/// A candidate running beside the live policy.
struct Shadow {
    policy: Arc<LoadedPolicy>,
    instance: PolicyInstance,
    report: ShadowReport,
}

/// How a shadow policy's decisions compare with the live policy's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ShadowReport {
    /// Where the shadow policy came from (file path or other label).
    pub label: String,
    /// Its implementation name.
    pub name: String,
    /// Its implementation version.
    pub version: String,
    /// How it was given the live state.
    pub path: SwapPath,
    /// What it could not be given of the live state, in words for operators.
    pub not_carried: Vec<String>,
    /// Live decisions it made too (events and admissions).
    pub decisions: usize,
    /// Those it made differently.
    pub divergences: usize,
    /// Divergences by kind.
    pub by_kind: BTreeMap<String, usize>,
    /// The first divergence on each server (`recorded` is the live decision; `line` counts
    /// decisions since the shadow started).
    pub first_per_server: BTreeMap<String, Divergence>,
}

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Drops an incoming policy's `connect`s and `disconnect`s of servers whose session (or attempt
/// in flight) the host keeps across a swap, noting any that were not just a fresh start.
fn keep_sessions(actions: Vec<Action>, ledger: &Ledger, notes: &mut Vec<String>) -> Vec<Action> {
    actions
        .into_iter()
        .filter(|action| match action {
            Action::Connect(server) => !ledger.is_live(server),
            Action::Disconnect(server) if ledger.is_live(server) => {
                notes.push(format!(
                    "{server}: the incoming policy asked to disconnect its live session; it was kept"
                ));
                false
            }
            _ => true,
        })
        .collect()
}

/// What a policy that knows no handover (contract 0.1) cannot learn from events: per server,
/// the outgoing policy's counts, breaker and parking, in words.
fn unteachable(status: &[ServerStatus], ledger: &Ledger) -> Vec<String> {
    let mut notes = Vec::new();
    for s in status {
        let mut lost = Vec::new();
        if s.state == ServerState::Parked {
            lost.push("parked (it is tried again now)".to_string());
        }
        if s.breaker != BreakerState::Closed {
            lost.push(format!("breaker {:?}", s.breaker).to_lowercase());
        }
        if s.failures > 0 {
            lost.push(format!("{} failed attempts", s.failures));
        }
        if s.breaker_failures > 0 {
            lost.push(format!("{} breaker failures", s.breaker_failures));
        }
        if !lost.is_empty() && ledger.is_configured(&s.server) {
            notes.push(format!(
                "{}: {} (contract 0.1 knows no handover)",
                s.server,
                lost.join(", ")
            ));
        }
    }
    notes
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
