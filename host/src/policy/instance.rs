//! One sandboxed policy instance: a wasmtime `Store` with a fuel budget on every call, a memory
//! cap, a WASI context with nothing in it, and guest output captured into the host log.
//!
//! Calls here are synchronous. The runtime makes them on its policy thread, or inline on a
//! caller's thread; on a tokio worker a guest's WASI call panics (wasmtime-wasi's sync bindings
//! block on tokio), which the runtime catches and answers on its thread instead.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime::{Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::{
    Action, Admission, CallRequest, Event, LogLevel, PolicyComponent, PolicyInfo, ServerStatus,
};
use super::engine::LoadedPolicy;
use super::guest_output::GuestOutput;
use super::{PolicyError, PolicyFault};

/// Resource limits applied to every policy instance.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Linear memory cap per instance, in bytes.
    pub memory_bytes: usize,
    /// Fuel (roughly wasm instructions) allowed per call; an endless loop runs out of it.
    pub fuel_per_call: u64,
    /// Most actions accepted from one `handle` call.
    pub max_actions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 32 << 20,
            fuel_per_call: 2_000_000_000,
            max_actions: 10_000,
        }
    }
}

/// The state a policy `Store` carries.
pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    label: Arc<str>,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl super::bindings::tether::policy::types::Host for StoreState {}

impl super::bindings::tether::policy::log::Host for StoreState {
    fn log(&mut self, level: LogLevel, message: String) {
        let policy = &*self.label;
        match level {
            LogLevel::Trace => tracing::trace!(target: "tether::policy", policy, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "tether::policy", policy, "{message}"),
            LogLevel::Info => tracing::info!(target: "tether::policy", policy, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "tether::policy", policy, "{message}"),
            LogLevel::Error => tracing::error!(target: "tether::policy", policy, "{message}"),
        }
    }
}

/// A live instance of a loaded policy component.
pub struct PolicyInstance {
    store: Store<StoreState>,
    bindings: PolicyComponent,
    policy: Arc<LoadedPolicy>,
    limits: Limits,
    /// Fuel for the next guest call (normally `limits.fuel_per_call`).
    fuel_budget: u64,
}

impl PolicyInstance {
    /// Instantiates `policy` in a fresh, empty sandbox. The guest is not initialized yet.
    pub fn instantiate(policy: &Arc<LoadedPolicy>, limits: &Limits) -> Result<Self, PolicyError> {
        let label: Arc<str> = Arc::from(policy.label());
        let output = GuestOutput::new(label.clone());
        // No preopens, no env, no args, no network: the policy can reach nothing.
        let wasi = WasiCtxBuilder::new()
            .stdout(output.clone())
            .stderr(output)
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        let state = StoreState {
            wasi,
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .trap_on_grow_failure(true)
                .build(),
            label,
        };
        let mut store = Store::new(policy.engine(), state);
        store.limiter(|state| &mut state.limits);
        store
            .set_fuel(limits.fuel_per_call)
            .map_err(|e| policy.fault("instantiation", PolicyFault::Trap(format!("{e:#}"))))?;
        let bindings = policy
            .pre()
            .instantiate(&mut store)
            .map_err(|e| policy.fault("instantiation", classify(&e, limits)))?;
        Ok(Self {
            store,
            bindings,
            policy: policy.clone(),
            limits: limits.clone(),
            fuel_budget: limits.fuel_per_call,
        })
    }

    /// The component this instance runs.
    pub fn policy(&self) -> &Arc<LoadedPolicy> {
        &self.policy
    }

    /// Runs `f` with every guest call limited to `fuel` (at most the configured budget).
    pub fn with_fuel<R>(&mut self, fuel: u64, f: impl FnOnce(&mut Self) -> R) -> R {
        self.fuel_budget = fuel.min(self.limits.fuel_per_call);
        let result = f(self);
        self.fuel_budget = self.limits.fuel_per_call;
        result
    }

    /// Runs one guest call with a fresh fuel budget, turning traps into [`PolicyFault`]s.
    fn call<R>(
        &mut self,
        during: &'static str,
        f: impl FnOnce(&PolicyComponent, &mut Store<StoreState>) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        self.store.set_fuel(self.fuel_budget).map_err(|e| {
            self.policy
                .fault(during, PolicyFault::Trap(format!("{e:#}")))
        })?;
        f(&self.bindings, &mut self.store)
            .map_err(|e| self.policy.fault(during, classify(&e, &self.limits)))
    }

    fn exports(bindings: &PolicyComponent) -> &super::bindings::PolicyExports {
        bindings.tether_policy_policy()
    }

    pub fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
        self.call("info", |b, s| Self::exports(b).call_info(s))
    }

    /// Initializes the guest with settings; a refusal is an error naming the policy, not a fault.
    pub fn init(&mut self, settings: &str) -> Result<(), PolicyError> {
        let answer = self.call("init", |b, s| Self::exports(b).call_init(s, settings))?;
        answer.map_err(|reason| self.policy.refused("the settings", reason))
    }

    pub fn set_settings(&mut self, settings: &str) -> Result<(), PolicyError> {
        let answer = self.call("set-settings", |b, s| {
            Self::exports(b).call_set_settings(s, settings)
        })?;
        answer.map_err(|reason| self.policy.refused("the settings", reason))
    }

    pub fn handle(&mut self, event: &Event) -> Result<Vec<Action>, PolicyError> {
        let actions = self.call("handle", |b, s| Self::exports(b).call_handle(s, event))?;
        if actions.len() > self.limits.max_actions {
            return Err(self.policy.fault(
                "handle",
                PolicyFault::InvalidOutput(format!(
                    "returned {} actions for one event (limit {})",
                    actions.len(),
                    self.limits.max_actions
                )),
            ));
        }
        Ok(actions)
    }

    pub fn admit(&mut self, request: &CallRequest) -> Result<Admission, PolicyError> {
        self.call("admit", |b, s| Self::exports(b).call_admit(s, request))
    }

    pub fn status(&mut self) -> Result<Vec<ServerStatus>, PolicyError> {
        self.call("status", |b, s| Self::exports(b).call_status(s))
    }

    pub fn snapshot(&mut self) -> Result<Vec<u8>, PolicyError> {
        self.call("snapshot", |b, s| Self::exports(b).call_snapshot(s))
    }

    pub fn restore(&mut self, snapshot: &[u8]) -> Result<(), PolicyError> {
        let answer = self.call("restore", |b, s| Self::exports(b).call_restore(s, snapshot))?;
        answer.map_err(|reason| self.policy.refused("the saved state", reason))
    }
}

/// Names what stopped a guest call.
fn classify(error: &wasmtime::Error, limits: &Limits) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => PolicyFault::OutOfFuel(limits.fuel_per_call),
        Some(Trap::AllocationTooLarge) => PolicyFault::Memory(limits.memory_bytes),
        Some(trap) => {
            let text = format!("{error:#}");
            if text.contains("forcing trap when growing memory") {
                PolicyFault::Memory(limits.memory_bytes)
            } else {
                PolicyFault::Trap(format!("{trap}: {text}"))
            }
        }
        None => {
            let text = format!("{error:#}");
            if text.contains("forcing trap when growing memory") {
                PolicyFault::Memory(limits.memory_bytes)
            } else {
                PolicyFault::Trap(text)
            }
        }
    }
}
