//! The policy runtime: one policy instance, fed events and admissions in order. This module is
//! the driver around a sans-IO core ([`core`]): it owns the policy thread, the queue in front of
//! it, the host's clock, the recording file and the channels that tell the rest of the host what
//! happened; the core decides, contains failures ([`core`]'s three rungs), swaps ([`swap`]) and
//! shadows ([`shadow`]).
//!
//! Decisions run inline on the caller's thread when nothing is queued, the core is free and the
//! input hands over little tool data (a large tool list is work for the policy thread): a
//! decision takes well under a microsecond, while waking a sleeping thread and being woken back
//! costs tens of microseconds on a small VM. Everything else (and any input that finds the queue
//! busy) goes through a FIFO to a dedicated policy thread.
//!
//! What the host does with a decision (its actions) runs after the core's lock is released, in
//! decision order ([`Delivery`]): a slow registry update never holds up the next decision.
//!
//! An inline decision gets a small fuel budget. If it runs out, faults, or panics (a host
//! function under the guest can: wasmtime-wasi's sync bindings block on tokio, which panics on a
//! tokio worker; the engine replaces the ones a guest's stdout and stderr use, so printing does
//! not), the input goes to the policy thread instead, which starts from the last good state and
//! handles it with the full budget; only what fails there counts as a fault.

mod core;
mod delivery;
mod input;
mod journal;
mod reports;
mod shadow;
mod swap;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::task::{Context, Poll};

use tokio::sync::{broadcast, oneshot};

use self::core::{CoreOptions, PolicyCore};
use self::delivery::Delivery;
use self::input::{Input, Output};
use super::PolicyError;
use super::engine::{LoadedPolicy, PolicyEngine, PolicySource};
use super::instance::Limits;
use super::record::Recorder;
use super::types::{
    Action, Admission, CallRequest, Event, Millis, NamedPrompt, ServerConfig, ServerStatus,
};

pub use reports::{PolicyNotice, RunningPolicy, RuntimeStats};
pub use shadow::ShadowReport;
pub use swap::{SwapPath, SwapReport};

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
    /// Take a snapshot after at least this many state-changing inputs; with the default, once
    /// they weigh as much as the last snapshot (bounds the replay journal; see `journal.rs`).
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
            checkpoint_every: journal::DEFAULT_CHECKPOINT_EVERY,
            inline_fuel: DEFAULT_INLINE_FUEL,
            record: None,
        }
    }
}

/// The host's clock, in the milliseconds events carry.
pub type HostClock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// Fuel for an inline decision. The default policy's decisions take a few thousand units; a
/// decision that needs more is made on the policy thread, not on the caller's.
pub const DEFAULT_INLINE_FUEL: u64 = 5_000_000;

/// What the driver shares between the handles and the policy thread.
struct Shared {
    engine: Arc<PolicyEngine>,
    /// The host's time for `status` and swaps, when the host has set it.
    clock: Mutex<Option<HostClock>>,
    stats: Arc<RuntimeStats>,
    notices: broadcast::Sender<PolicyNotice>,
    running: Mutex<RunningPolicy>,
    /// Jobs sent to the policy thread and not finished yet; inline decisions wait for zero.
    queued: AtomicUsize,
    delivery: Delivery,
}

impl Shared {
    /// The host's time, never behind the latest input's.
    fn now(&self, core: &PolicyCore) -> Millis {
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner()).clone();
        clock.map_or(core.last_now(), |clock| clock().max(core.last_now()))
    }
}

/// The core and the recording of its decisions, behind one lock: whoever holds it decides.
struct Worker {
    core: PolicyCore,
    recorder: Option<Recorder>,
}

impl Worker {
    /// Decides `input` with the full budget and publishes what the core has to say, before
    /// anyone hears the outcome.
    fn decide(&mut self, input: Input, shared: &Shared) -> Result<Output, PolicyError> {
        let outcome = self.core.step(input);
        self.publish(shared);
        outcome
    }

    /// Publishes what the core has to say (notices, recording lines, the running policy), in
    /// decision order: called under the lock after every decision.
    fn publish(&mut self, shared: &Shared) {
        let outbox = self.core.take_outbox();
        if outbox.is_empty() {
            return;
        }
        if let Some(running) = outbox.running {
            *shared.running.lock().unwrap_or_else(|e| e.into_inner()) = running;
        }
        if let Some(recorder) = &mut self.recorder {
            for record in outbox.records {
                recorder.write(record);
            }
        }
        for notice in outbox.notices {
            let _ = shared.notices.send(notice);
        }
    }
}

type Job = Box<dyn FnOnce(&mut Worker, &Shared) + Send>;
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
        let recorder = options
            .record
            .as_deref()
            .map(Recorder::create)
            .transpose()?;
        let core_options = CoreOptions {
            settings: options.settings.clone(),
            limits: options.limits.clone(),
            fallback_to_default: options.fallback_to_default,
            checkpoint_every: options.checkpoint_every,
            inline_fuel: options.inline_fuel,
            recording: recorder.is_some(),
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, job_rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tether-policy".into())
            .spawn(move || {
                let stats = Arc::new(RuntimeStats::default());
                let core =
                    match PolicyCore::start(engine.clone(), stats.clone(), policy, core_options) {
                        Ok(core) => core,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                let (notices, _) = broadcast::channel(256);
                let shared = Arc::new(Shared {
                    engine,
                    clock: Mutex::new(None),
                    stats,
                    notices,
                    running: Mutex::new(core.running().clone()),
                    queued: AtomicUsize::new(0),
                    delivery: Delivery::default(),
                });
                let mut worker = Worker { core, recorder };
                worker.publish(&shared);
                let worker = Arc::new(Mutex::new(worker));
                let _ = ready_tx.send(Ok((shared.clone(), worker.clone())));
                while let Ok(job) = job_rx.recv() {
                    {
                        let mut worker = worker.lock().unwrap_or_else(|e| e.into_inner());
                        // Each job publishes the core's outbox before it answers.
                        job(&mut worker, &shared);
                        // Still under the lock: an inline decision must not overtake this job.
                        shared.queued.fetch_sub(1, Ordering::SeqCst);
                    }
                    shared.delivery.run();
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
    fn queue(&self, job: impl FnOnce(&mut Worker, &Shared) + Send + 'static) {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if self.jobs.send(Box::new(job)).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Ends the recording (`--record`), after every decision queued before: its file is closed
    /// and its lock released, so another Tether may record to it, even while clones of this
    /// runtime live on.
    pub fn end_recording(&self) -> Reply<()> {
        let (tx, rx) = oneshot::channel();
        self.queue(move |worker, shared| {
            worker.publish(shared);
            worker.recorder = None;
            let _ = tx.send(Ok(()));
        });
        Reply(rx)
    }

    /// Asks the core something on the policy thread.
    fn ask<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut PolicyCore, &Shared) -> Result<T, PolicyError> + Send + 'static,
    ) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        self.queue(move |worker, shared| {
            let answer = job(&mut worker.core, shared);
            worker.publish(shared);
            let _ = tx.send(answer);
        });
        Reply(rx)
    }

    /// Like [`Self::ask`], with the answer handed to `then` in decision order, outside the
    /// worker's lock (see [`Delivery`]).
    fn ask_then<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut PolicyCore, &Shared) -> Result<T, PolicyError> + Send + 'static,
        then: impl FnOnce(Result<T, PolicyError>) + Send + 'static,
    ) {
        self.queue(move |worker, shared| {
            let answer = job(&mut worker.core, shared);
            worker.publish(shared);
            shared.delivery.push(Box::new(move || then(answer)));
        });
    }

    /// The worker, when an input may be decided on the caller's thread: nothing is queued ahead
    /// of it and no one else is deciding.
    fn inline_worker(&self) -> Option<MutexGuard<'_, Worker>> {
        let queued = || self.shared.queued.load(Ordering::SeqCst);
        if queued() != 0 {
            return None;
        }
        let worker = self.worker.try_lock().ok()?;
        (worker.core.decides_inline() && queued() == 0).then_some(worker)
    }

    /// Decides the input `make` builds inline if it may be, else queues it for the policy
    /// thread (which builds it when it gets there). `answer` gets the outcome in decision
    /// order relative to every other input, under the worker's lock: it must only hand the
    /// outcome on (a reply, or a [`Delivery`]).
    fn decide(
        &self,
        make: impl FnOnce() -> Input + Send + 'static,
        answer: impl FnOnce(Result<Output, PolicyError>, &Shared) + Send + 'static,
    ) {
        let Some(mut worker) = self.inline_worker() else {
            self.queue(move |w, shared| answer(w.decide(make(), shared), shared));
            return;
        };
        let input = make();
        if worker.core.is_heavy(&input) {
            // Straight to the policy thread (queued while holding the worker, so nothing
            // overtakes it): inline, it would run out of its budget and leave an instance
            // to rebuild, which costs far more than the hand-off.
            self.queue(move |w, shared| answer(w.decide(input, shared), shared));
            return;
        }
        match worker.core.step_inline(input) {
            Ok(outcome) => {
                worker.publish(&self.shared);
                answer(outcome, &self.shared);
            }
            // Queued while still holding the worker, so nothing decided later overtakes it.
            Err(missed) => {
                worker.publish(&self.shared);
                self.queue(move |w, shared| {
                    let (input, miss) = *missed;
                    let outcome = w.core.redo(input, miss);
                    w.publish(shared);
                    answer(outcome, shared)
                })
            }
        }
        drop(worker);
        self.shared.delivery.run();
    }

    fn decide_reply<T: Send + 'static>(&self, input: Input, extract: fn(Output) -> T) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        self.decide(
            move || input,
            move |outcome, _| {
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
    /// policy decided them, and outside the policy's lock. Building the event when it is decided
    /// keeps its time from running behind an earlier input's. Nothing waits: the input is
    /// decided or queued ahead of anything asked after this returns.
    pub fn handle_then(
        &self,
        make: impl FnOnce() -> Event + Send + 'static,
        then: impl FnOnce(Result<Vec<Action>, PolicyError>) + Send + 'static,
    ) {
        self.decide(
            move || Input::Event(make()),
            move |outcome, shared| {
                let actions = outcome.map(Output::into_actions);
                shared.delivery.push(Box::new(move || then(actions)));
            },
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
            Output::into_prompts,
        )
    }

    /// Every server's status as the policy sees it, at the host's time (see
    /// [`Self::set_clock`]; without a clock, at the latest event's time).
    pub fn status(&self) -> Reply<Vec<ServerStatus>> {
        self.ask(|core, shared| {
            let now = shared.now(core);
            core.status(now)
        })
    }

    /// Gives the runtime the host's clock (the time events carry), for `status` and swaps.
    pub fn set_clock(&self, clock: HostClock) {
        *self.shared.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some(clock);
    }

    /// Changes the settings, keeping all state. A refusal leaves everything as it was.
    pub fn set_settings(&self, settings: String) -> Reply<()> {
        self.ask(move |core, _| core.set_settings(settings))
    }

    /// Whether the running policy accepts `settings`, asked of a scratch instance: the live
    /// one is not touched.
    pub fn check_settings(&self, settings: String) -> Reply<()> {
        self.ask(move |core, _| core.check_settings(&settings))
    }

    /// Whether the running policy accepts a server's configuration (its per-server settings
    /// and tool filters), asked of a scratch instance with the current settings, or with
    /// `settings` about to be given: the live one is not touched. A policy refuses a
    /// configuration by parking the server the moment it is configured; `Some(reason)` is that
    /// refusal. Lets a config file be checked when it is read, instead of a server parking
    /// later.
    pub fn check_server(
        &self,
        config: ServerConfig,
        settings: Option<String>,
    ) -> Reply<Option<String>> {
        self.ask(move |core, _| core.check_server(config, settings.as_deref()))
    }

    #[cfg(any(test, feature = "test-support"))]
    /// A snapshot of the running policy's state.
    pub fn snapshot(&self) -> Reply<Vec<u8>> {
        self.ask(|core, _| Ok(core.snapshot()))
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Replaces the running policy, keeping its state. The new component is compiled on the
    /// calling thread (use `spawn_blocking` in async code); the policy thread pauses only to
    /// move the state. On failure the old policy keeps running.
    /// The report's actions are the caller's to execute (see [`Self::swap_then`]).
    pub fn swap_blocking(&self, source: &PolicySource) -> Result<SwapReport, PolicyError> {
        let policy = self.shared.engine.load(source)?;
        self.ask(move |core, shared| {
            let now = shared.now(core);
            core.swap(policy, now)
        })
        .wait()
    }

    #[cfg(any(test, feature = "test-support"))]
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
        self.ask_then(
            move |core, shared| {
                let now = shared.now(core);
                core.swap(policy, now)
            },
            then,
        );
    }

    /// Starts running `source` beside the live policy, given the live state as a swap would,
    /// on the live inputs, acting on nothing, until promoted ([`Self::swap_from_shadow_then`])
    /// or dropped. Replaces any earlier shadow. Blocking (compiles).
    pub fn shadow_blocking(&self, source: &PolicySource) -> Result<ShadowReport, PolicyError> {
        let policy = self.shared.engine.load(source)?;
        self.ask(move |core, shared| {
            let now = shared.now(core);
            core.start_shadow(policy, now)
        })
        .wait()
    }

    /// The shadow policy, if one runs.
    pub fn shadow_policy(&self) -> Reply<Option<Arc<LoadedPolicy>>> {
        self.ask(|core, _| Ok(core.shadow_policy()))
    }

    /// The engine that compiles this runtime's policies.
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.shared.engine
    }

    /// The shadow policy's comparison so far, if one runs.
    pub fn shadow_report(&self) -> Reply<Option<ShadowReport>> {
        self.ask(|core, _| Ok(core.shadow_report()))
    }

    /// Stops the shadow policy; false if none ran.
    pub fn drop_shadow(&self) -> Reply<bool> {
        self.ask(|core, _| Ok(core.drop_shadow()))
    }

    /// Swaps to the shadow policy (from the live state, as any swap), as [`Self::swap_then`].
    /// A shadow that cannot be promoted keeps shadowing.
    pub fn swap_from_shadow_then(
        &self,
        then: impl FnOnce(Result<SwapReport, PolicyError>) + Send + 'static,
    ) {
        self.ask_then(
            |core, shared| {
                let now = shared.now(core);
                core.promote_shadow(now)
            },
            then,
        );
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

    #[cfg(any(test, feature = "test-support"))]
    /// Keeps the policy thread busy until the guard is dropped, as a slow decision would:
    /// every input after this one is queued behind it (none is decided inline). Lets a test
    /// line inputs up and see what the host does before they are decided.
    pub fn hold(&self) -> QueueHold {
        let (release, released) = mpsc::channel::<()>();
        self.queue(move |_, _| {
            let _ = released.recv();
        });
        QueueHold { _release: release }
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The inputs queued for the policy thread, the one it is deciding included.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }
}

#[cfg(any(test, feature = "test-support"))]
/// The policy thread held by [`PolicyRuntime::hold`]; dropping it lets the thread go on.
pub struct QueueHold {
    _release: mpsc::Sender<()>,
}
