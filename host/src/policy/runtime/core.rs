//! The runtime's sans-IO core: one policy instance and all it takes to contain its failures,
//! driven by inputs one at a time. It has no thread, lock, clock or file of its own: the driver
//! ([`super::PolicyRuntime`]) hands it each input (events carry the host's time; what else needs
//! the time is given it), and publishes what the core leaves in its [`Outbox`] (notices for
//! operators, recording lines, the running policy's description).
//!
//! Call order, for a driver: [`PolicyCore::start`]; then for each input either
//! [`PolicyCore::step`], or [`PolicyCore::step_inline`] when the input is decided on a caller's
//! thread with the small inline budget and, when that gives the input back,
//! [`PolicyCore::redo`] before anything else is decided; after each call,
//! [`PolicyCore::take_outbox`]. Failures are contained in three rungs:
//!
//! 1. a fault (trap, endless loop, memory blow-up, invalid output) discards the instance;
//! 2. a fresh instance is restored from the last good snapshot plus the journal of inputs since
//!    ([`LastGood`]), and the failed input is tried once more;
//! 3. if that fails too, the embedded default policy takes over (restoring the same state when
//!    it can, else by a handover) and the failure is logged loudly.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::policy::engine::{LoadedPolicy, PolicyEngine, PolicySource};
use crate::policy::instance::{Limits, PolicyInstance};
use crate::policy::ledger::Ledger;
use crate::policy::record::Record;
use crate::policy::types::{
    Action, Event, EventKind, Millis, ServerConfig, ServerState, ServerStatus,
};
use crate::policy::{PolicyError, PolicyFault};

use super::input::{INLINE_TOOL_DATA, InlineMiss, Input, Output};
use super::journal::LastGood;
use super::reports::{PolicyNotice, RunningPolicy, RuntimeStats};
use super::shadow::{Shadow, ShadowReport};
use super::swap::{self, Outgoing, Prepared, SwapReport};

/// How a [`PolicyCore`] runs its policy.
#[derive(Debug, Clone)]
pub(crate) struct CoreOptions {
    /// Settings JSON given to the policy's `init`.
    pub(crate) settings: String,
    /// Sandbox limits for every instance.
    pub(crate) limits: Limits,
    /// Whether a policy that keeps failing is replaced by the embedded default.
    pub(crate) fallback_to_default: bool,
    /// Take a snapshot after this many state-changing inputs (bounds the replay journal).
    pub(crate) checkpoint_every: usize,
    /// Fuel for an inline decision (0: none is made inline).
    pub(crate) inline_fuel: u64,
    /// Whether to leave a [`Record`] of every decision in the outbox.
    pub(crate) recording: bool,
}

/// What the core has to say since the last [`PolicyCore::take_outbox`], for the driver to
/// publish.
#[derive(Default)]
pub(crate) struct Outbox {
    /// Faults, recoveries, fallbacks, swaps and shadow news, in order.
    pub(crate) notices: Vec<PolicyNotice>,
    /// Lines for the recording, in decision order (only when recording).
    pub(crate) records: Vec<Record>,
    /// The running policy's description, when it changed.
    pub(crate) running: Option<RunningPolicy>,
}

impl Outbox {
    pub(crate) fn is_empty(&self) -> bool {
        self.notices.is_empty() && self.records.is_empty() && self.running.is_none()
    }
}

pub(crate) struct PolicyCore {
    /// Compiles (or finds compiled) the embedded default a failing policy falls back to.
    engine: Arc<PolicyEngine>,
    stats: Arc<RuntimeStats>,
    limits: Limits,
    fallback_to_default: bool,
    checkpoint_every: usize,
    policy: Arc<LoadedPolicy>,
    instance: PolicyInstance,
    settings: String,
    last_good: LastGood,
    /// What is true of the servers, for handovers and 0.2 publications.
    ledger: Ledger,
    /// Actions produced while re-teaching a fallback policy, delivered with the next event.
    pending_actions: Vec<Action>,
    /// The latest time an input carried: the time of what the core does on its own (a
    /// fallback's handover).
    last_now: Millis,
    /// Whether inputs may be decided on a caller's thread.
    inline: bool,
    inline_fuel: u64,
    /// An inline decision was cut short: the instance must be rebuilt before its next use.
    poisoned: bool,
    recording: bool,
    shadow: Option<Shadow>,
    running: RunningPolicy,
    outbox: Outbox,
}

impl PolicyCore {
    /// Instantiates `policy` and initializes it with the settings.
    pub(crate) fn start(
        engine: Arc<PolicyEngine>,
        stats: Arc<RuntimeStats>,
        policy: Arc<LoadedPolicy>,
        options: CoreOptions,
    ) -> Result<Self, PolicyError> {
        let mut instance = PolicyInstance::instantiate(&policy, &options.limits)?;
        instance.init(&options.settings)?;
        let last_good = LastGood::new(instance.snapshot()?);
        let running = RunningPolicy::describe(&policy, None, &options.settings);
        let mut core = Self {
            engine,
            stats,
            limits: options.limits,
            fallback_to_default: options.fallback_to_default,
            checkpoint_every: options.checkpoint_every.max(1),
            policy,
            instance,
            settings: options.settings,
            last_good,
            ledger: Ledger::default(),
            pending_actions: Vec::new(),
            last_now: 0,
            inline: options.inline_fuel > 0,
            inline_fuel: options.inline_fuel,
            poisoned: false,
            recording: options.recording,
            shadow: None,
            running,
            outbox: Outbox::default(),
        };
        core.describe();
        core.record_policy();
        Ok(core)
    }

    /// What the core has to say since the last call.
    pub(crate) fn take_outbox(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// Whether the next input may be decided on a caller's thread (a shadow decides on the
    /// policy thread only, and so does a policy whose last inline decision went wrong).
    pub(crate) fn decides_inline(&self) -> bool {
        self.inline && self.shadow.is_none()
    }

    /// Whether deciding `input` is work for the policy thread whatever the queue: it carries
    /// much tool data, or it is a lifecycle event of a policy that holds much (publishing
    /// tools weighs them all). A call's report is light whatever the state.
    pub(crate) fn is_heavy(&self, input: &Input) -> bool {
        input.is_heavy(self.policy.contract().carries_descriptions())
            || (input.is_lifecycle_event() && self.instance.held().total() > INLINE_TOOL_DATA)
    }

    /// What runs now.
    pub(crate) fn running(&self) -> &RunningPolicy {
        &self.running
    }

    /// The latest time an input carried.
    pub(crate) fn last_now(&self) -> Millis {
        self.last_now
    }

    fn notify(&mut self, notice: PolicyNotice) {
        self.outbox.notices.push(notice);
    }

    /// Describes the running policy anew.
    fn describe(&mut self) {
        let info = self.instance.info().ok();
        self.running = RunningPolicy::describe(&self.policy, info, &self.settings);
        self.outbox.running = Some(self.running.clone());
    }

    /// Notes in the recording which policy decides from here on.
    fn record_policy(&mut self) {
        if !self.recording {
            return;
        }
        let running = self.running.clone();
        self.outbox.records.push(Record::Policy {
            label: running.label,
            name: running.name,
            version: running.version,
            contract: running.contract,
            settings: running.settings,
        });
    }

    /// Decides `input` with the full budget, containing any fault.
    pub(crate) fn step(&mut self, input: Input) -> Result<Output, PolicyError> {
        self.heal();
        let started = Instant::now();
        let mut result = input.decide_on(&mut self.instance, &mut self.ledger);
        if let Err(fault @ PolicyError::Fault { .. }) = result {
            result = self.contain(fault, &input);
        }
        self.finish(input, started, result)
    }

    /// Decides `input` with the inline budget, or gives it back (the instance marked for
    /// rebuilding) when only a full decision may answer it: then [`Self::redo`] it next.
    pub(crate) fn step_inline(
        &mut self,
        input: Input,
    ) -> Result<Result<Output, PolicyError>, Box<(Input, InlineMiss)>> {
        let started = Instant::now();
        let budget = self.inline_fuel.min(self.limits.fuel_per_call);
        let (instance, ledger) = (&mut self.instance, &mut self.ledger);
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            instance.with_fuel(budget, |instance| input.decide_on(instance, ledger))
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
        self.stats.inline_misses.fetch_add(1, Ordering::Relaxed);
        Err(Box::new((input, miss)))
    }

    /// Decides an input an inline attempt gave up on.
    pub(crate) fn redo(&mut self, input: Input, miss: InlineMiss) -> Result<Output, PolicyError> {
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
                let faults = self.stats.faults.load(Ordering::Relaxed);
                let result = self.step(input);
                // Fine with the full budget: only that decision was heavy.
                if self.stats.faults.load(Ordering::Relaxed) == faults {
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
        match self.rebuild() {
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
        self.stats.decisions.fetch_add(1, Ordering::Relaxed);
        self.stats
            .decision_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut output = result?;
        if self.recording {
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
            self.outbox.records.extend(record);
        }
        self.follow_in_shadow(&input, &output);
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

    fn report(&mut self, error: &PolicyError) {
        tracing::error!(policy = %self.policy.label(), "policy fault contained: {error}");
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        let policy = self.policy.label().to_string();
        self.notify(PolicyNotice::Fault {
            policy,
            error: error.to_string(),
        });
    }

    /// Recovers from a fault on `input` and answers it, or says why it could not.
    fn contain(&mut self, fault: PolicyError, input: &Input) -> Result<Output, PolicyError> {
        self.report(&fault);
        let last_error;
        match self.rebuild() {
            Ok(instance) => {
                self.instance = instance;
                self.stats.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(policy = %self.policy.label(), "policy restored into a fresh instance");
                let policy = self.policy.label().to_string();
                self.notify(PolicyNotice::Recovered { policy });
                match input.decide_on(&mut self.instance, &mut self.ledger) {
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
        input.decide_on(&mut self.instance, &mut self.ledger)
    }

    /// A fresh instance of the running policy in the state of the current one before the
    /// failed input.
    fn rebuild(&self) -> Result<PolicyInstance, PolicyError> {
        let mut instance = PolicyInstance::instantiate(&self.policy, &self.limits)?;
        instance.init(&self.settings)?;
        self.last_good.restore_into(&mut instance)?;
        Ok(instance)
    }

    fn fall_back(&mut self, reason: &PolicyError) -> Result<(), PolicyError> {
        let default = PolicySource::Embedded.label();
        if !self.fallback_to_default || self.policy.label() == default {
            return Err(reason.clone());
        }
        let policy = self.engine.load(&PolicySource::Embedded)?;
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
        if let Err(error) = self.last_good.restore_into(&mut instance) {
            // The saved state is not in the default's format: a handover of what is known (the
            // failing policy's own report, if it can still give one).
            tracing::warn!(
                "the default policy cannot take over the saved state ({error}); handing over what the host knows"
            );
            instance = PolicyInstance::instantiate(&policy, &self.limits)?;
            instance.init(&self.settings)?;
            let actions = swap::hand_over_from_failing(
                &mut instance,
                &mut self.instance,
                &from,
                &self.ledger,
                self.last_now,
            )?;
            self.ledger.note_actions(&actions);
            self.pending_actions.extend(actions);
        }
        self.policy = policy;
        self.instance = instance;
        self.inline = self.inline_fuel > 0;
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
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
        if let Some(now) = input.time() {
            self.last_now = self.last_now.max(now);
        }
        self.last_good.push(input);
        if self.last_good.due(self.checkpoint_every) {
            self.checkpoint();
        }
    }

    /// Moves the last good state up to now. A policy whose snapshot fails is recovered or
    /// replaced.
    fn checkpoint(&mut self) {
        self.heal();
        match self.instance.snapshot() {
            Ok(snapshot) => self
                .last_good
                .advance(snapshot, &self.instance, &self.ledger),
            Err(error) => {
                self.report(&error);
                if self.fall_back(&error).is_err() {
                    // No way out: keep the journal (the state is still reproducible from it).
                    tracing::error!(policy = %self.policy.label(), "cannot snapshot the policy; keeping the replay journal");
                }
            }
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    /// A snapshot of the policy's state now.
    pub(crate) fn snapshot(&mut self) -> Vec<u8> {
        self.checkpoint();
        self.last_good.snapshot.clone()
    }

    /// Every server's status as the policy sees it at `now`.
    pub(crate) fn status(&mut self, now: Millis) -> Result<Vec<ServerStatus>, PolicyError> {
        self.step(Input::Status(now)).map(Output::into_status)
    }

    /// Changes the settings, keeping all state. A refusal leaves everything as it was.
    pub(crate) fn set_settings(&mut self, settings: String) -> Result<(), PolicyError> {
        self.step(Input::Settings(settings.clone()))?;
        self.settings = settings.clone();
        self.describe();
        self.notify(PolicyNotice::SettingsChanged { settings });
        Ok(())
    }

    /// Whether the policy accepts `settings`, asked of a scratch instance.
    pub(crate) fn check_settings(&self, settings: &str) -> Result<(), PolicyError> {
        PolicyInstance::instantiate(&self.policy, &self.limits)?.init(settings)
    }

    /// Whether the policy accepts a server's configuration, asked of a scratch instance with
    /// `settings` (default: the current ones); `Some(reason)` is its refusal (it parks the
    /// server at once).
    pub(crate) fn check_server(
        &self,
        config: ServerConfig,
        settings: Option<&str>,
    ) -> Result<Option<String>, PolicyError> {
        let mut scratch = PolicyInstance::instantiate(&self.policy, &self.limits)?;
        scratch.init(settings.unwrap_or(&self.settings))?;
        let name = config.name.clone();
        let event = Event {
            now: self.last_now,
            kind: EventKind::ServerConfigured(config),
        };
        let ledger = &self.ledger;
        Ok(scratch
            .handle_with(&event, &|server, original| ledger.tool(server, original))?
            .into_iter()
            .find_map(|action| match action {
                Action::StateChanged(change)
                    if change.server == name && change.state == ServerState::Parked =>
                {
                    Some(change.detail)
                }
                _ => None,
            }))
    }

    /// An instance of `policy` in the current state at `now`; see [`swap::prepare`].
    fn prepare(
        &mut self,
        policy: &Arc<LoadedPolicy>,
        now: Millis,
    ) -> Result<Prepared, PolicyError> {
        let last_good = &self.last_good;
        let restore = |instance: &mut PolicyInstance| last_good.restore_into(instance);
        swap::prepare(
            policy,
            &self.limits,
            Outgoing {
                policy: &self.policy,
                instance: &mut self.instance,
                settings: &self.settings,
                ledger: &self.ledger,
                restore: &restore,
            },
            now,
        )
    }

    /// Replaces the running policy with `policy` at `now`, moving the state across. On failure
    /// the running policy is untouched. The report's actions are the host's to execute.
    pub(crate) fn swap(
        &mut self,
        policy: Arc<LoadedPolicy>,
        now: Millis,
    ) -> Result<SwapReport, PolicyError> {
        self.checkpoint();
        let Prepared {
            instance: incoming,
            settings,
            report,
        } = self.prepare(&policy, now)?;
        self.ledger.note_actions(&report.actions);
        let from = self.policy.label().to_string();
        self.policy = policy;
        self.instance = incoming;
        self.settings = settings;
        self.last_good.clear_journal();
        self.inline = self.inline_fuel > 0;
        self.stats.swaps.fetch_add(1, Ordering::Relaxed);
        tracing::info!(from = %from, to = %self.policy.label(), path = ?report.path, "policy swapped");
        for what in &report.not_carried {
            tracing::warn!(to = %self.policy.label(), "not carried over by the swap: {what}");
        }
        let to = self.policy.label().to_string();
        self.notify(PolicyNotice::Swapped { from, to });
        self.describe();
        self.record_policy();
        self.checkpoint();
        Ok(report)
    }

    /// Starts running `policy` beside the live one, given the live state at `now` as a swap
    /// would, on the live inputs, acting on nothing. Replaces any earlier shadow.
    pub(crate) fn start_shadow(
        &mut self,
        policy: Arc<LoadedPolicy>,
        now: Millis,
    ) -> Result<ShadowReport, PolicyError> {
        self.checkpoint();
        let prepared = self.prepare(&policy, now)?;
        let shadow = Shadow::start(policy, prepared);
        tracing::info!(shadow = %shadow.report.label, "shadow policy started");
        let report = shadow.report.clone();
        self.notify(PolicyNotice::ShadowStarted {
            policy: report.label.clone(),
        });
        self.shadow = Some(shadow);
        Ok(report)
    }

    /// The shadow policy, if one runs.
    pub(crate) fn shadow_policy(&self) -> Option<Arc<LoadedPolicy>> {
        self.shadow.as_ref().map(|s| s.policy.clone())
    }

    /// The shadow policy's comparison so far, if one runs.
    pub(crate) fn shadow_report(&self) -> Option<ShadowReport> {
        self.shadow.as_ref().map(|s| s.report.clone())
    }

    /// Stops the shadow policy; false if none ran.
    pub(crate) fn drop_shadow(&mut self) -> bool {
        let Some(shadow) = self.shadow.take() else {
            return false;
        };
        self.notify(PolicyNotice::ShadowDropped {
            policy: shadow.report.label,
            reason: "dropped by an operator".into(),
        });
        true
    }

    /// Swaps to the shadow policy at `now` (from the live state, as any swap). A shadow that
    /// cannot be promoted keeps shadowing.
    pub(crate) fn promote_shadow(&mut self, now: Millis) -> Result<SwapReport, PolicyError> {
        let shadow = self.shadow.take().ok_or(PolicyError::NoShadow)?;
        let swapped = self.swap(shadow.policy.clone(), now);
        if swapped.is_err() {
            self.shadow = Some(shadow);
        }
        swapped
    }

    /// Feeds the shadow the input the live policy just decided; a shadow that fails is dropped.
    fn follow_in_shadow(&mut self, input: &Input, live: &Output) {
        let Some(shadow) = &mut self.shadow else {
            return;
        };
        match shadow.follow(input, live, &self.ledger) {
            Ok(None) => {}
            Ok(Some(diverged)) => self.notify(diverged),
            Err(error) => {
                let policy = shadow.report.label.clone();
                tracing::warn!(shadow = %policy, "shadow policy dropped: {error}");
                self.shadow = None;
                self.notify(PolicyNotice::ShadowDropped {
                    policy,
                    reason: error.to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
