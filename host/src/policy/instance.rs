//! One sandboxed policy instance: a wasmtime `Store` with a fuel budget on every call, a memory
//! cap, a WASI context with nothing in it, and guest output captured into the host log.
//!
//! The limits follow the data. A policy keeps the tools it is told about (names, descriptions,
//! schemas), and servers make those as large as their messages (16 MiB by default). So each
//! call's memory cap is the configured base, [`Limits::memory_bytes`] (for the policy's own
//! state), plus [`Limits::memory_per_data_byte`] times the tool data the instance holds or is
//! being handed: the weight ([`tool_data`]) of each server's latest list from `connected` or
//! `tools-changed` (released when the server is removed), plus the list an event brings, or the
//! snapshot `restore` is given. Fuel grows the same way ([`Limits::fuel_per_data_byte`]), and so
//! does what a call may hand back to the host (wasmtime's "hostcall fuel", 128 MiB by default,
//! which a snapshot of 64 MB of tools exceeds). A policy that leaks or loops still runs into
//! them: they are never more than the base plus a multiple of the data, and the memory cap never
//! above wasm32's 4 GiB. A 0.2 policy is handed tool names only (the host keeps descriptions
//! and schemas), so its tool data is the names' weight; the figures below are for 0.1 policies.
//!
//! The bound: the default policy needs up to 8 bytes of linear memory per byte of tool data
//! (measured; see [`DEFAULT_MEMORY_PER_DATA_BYTE`]), so one instance holds at most about 500 MB
//! of tool data across all its servers (24 servers of 14 MB each were checked to work). The cap
//! keeps its full margin up to (4 GiB - base) / multiple, about 254 MB with the defaults (some
//! 15 servers at the 16 MiB message limit); beyond that it is the 4 GiB itself. A list's weight
//! is about its size on the wire (up to ~9x for lists of tiny tools, whose per-tool overhead
//! dominates, so a single 16 MiB list of tiny tools weighs up to ~150 MB).
//!
//! Calls here are synchronous. The runtime makes them on its policy thread, or inline on a
//! caller's thread. On a tokio worker, a WASI call that wasmtime-wasi's sync bindings run through
//! tokio would panic; the engine replaces those a guest's stdout and stderr use, and the runtime
//! catches any other and answers on its thread instead.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::{Store, Trap};

use super::bindings::{Actions, Exports, Lookup};
use super::engine::LoadedPolicy;
use super::ledger::Ledger;
use super::outputs::{check_actions, check_admission, check_prompt_names};
use super::store::StoreState;
use super::types::{
    Action, Admission, CallRequest, Event, EventKind, Fault, Handover, Millis, NamedPrompt, Naming,
    PolicyInfo, ServerStatus, Tool,
};
use super::{PolicyError, PolicyFault};

/// Resource limits applied to every policy instance.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Linear memory cap per instance for the policy's own state, in bytes: the whole cap of an
    /// instance that holds no tool data.
    pub memory_bytes: usize,
    /// Linear memory allowed on top of `memory_bytes` per byte of tool data the instance holds
    /// or is being handed ([`tool_data`]; for `restore`, per byte of the snapshot).
    pub memory_per_data_byte: usize,
    /// Fuel (roughly wasm instructions) allowed per call; an endless loop runs out of it.
    pub fuel_per_call: u64,
    /// Fuel allowed on top of `fuel_per_call` per byte of tool data the instance holds or is
    /// being handed (reading, planning, snapshotting and restoring data is work in proportion).
    pub fuel_per_data_byte: u64,
    /// Most actions accepted from one `handle` call.
    pub max_actions: usize,
}

/// The default [`Limits::memory_per_data_byte`]. Measured with the default policy: peak linear
/// memory (less the 1.2 MB of a fresh instance) per byte of tool data was 2.8 for a `connected`
/// of 14 x 1 MB, 3.5 for a reconnect of 10 MB over 14 MB, 5.9 for a `tools-changed` list growing
/// to 14 MB, 8.0 for five servers of 3 MB each (the snapshot after each input: JSON next to the
/// state, which holds each tool twice, the session's and the publication), 2.0 per snapshot byte
/// for `restore` into a fresh instance and 6.1 for its next snapshot, 7.4 for 200 000 tiny tools,
/// 5.5 for descriptions of control characters, 6.0 for non-ASCII text. 16 leaves a margin of 2
/// over the worst (allocator slack, buffers doubling, other policies' layouts).
pub const DEFAULT_MEMORY_PER_DATA_BYTE: usize = 16;

/// The default [`Limits::fuel_per_data_byte`]. Measured with the default policy: at most 2 fuel
/// per byte for a `connected` of large descriptions and 62 for snapshots of them; 110 for a
/// `connected` of 200 000 tiny tools and 176 to restore them (per-tool work dominates). 384
/// leaves a margin of 2 over the worst; a 16 MiB list then gets ~6.4 billion extra fuel.
pub const DEFAULT_FUEL_PER_DATA_BYTE: u64 = 384;

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 32 << 20,
            memory_per_data_byte: DEFAULT_MEMORY_PER_DATA_BYTE,
            fuel_per_call: 2_000_000_000,
            fuel_per_data_byte: DEFAULT_FUEL_PER_DATA_BYTE,
            max_actions: 10_000,
        }
    }
}

/// The most linear memory a wasm32 instance can have (65536 pages of 64 KiB).
const WASM32_MAX_MEMORY: u64 = 1 << 32;

/// What a tool costs beyond its strings: its records, map entries and advertised name in the
/// policy's state, and its fields in snapshots.
const TOOL_OVERHEAD: usize = 256;

/// The weight of tool data, in bytes: each string as long as it is escaped in JSON (how
/// snapshots carry it), plus `TOOL_OVERHEAD` (256 bytes) per tool. A 0.2 policy is handed names
/// only (`descriptions` false): its weight is theirs.
pub fn tool_data(tools: &[Tool], descriptions: bool) -> usize {
    tools.iter().fold(0usize, |sum, tool| {
        let sum = sum
            .saturating_add(TOOL_OVERHEAD)
            .saturating_add(json_len(&tool.name));
        if !descriptions {
            return sum;
        }
        sum.saturating_add(tool.description.as_deref().map_or(0, json_len))
            .saturating_add(json_len(&tool.input_schema))
    })
}

/// The length of `text` as a JSON string's contents.
fn json_len(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                0..0x20 => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// The tool data an event hands over: the server whose list it replaces, and its weight.
fn handed_over(event: &Event, descriptions: bool) -> Option<(&str, usize)> {
    match &event.kind {
        EventKind::Connected(session) => Some((
            &session.server,
            tool_data(&session.tools, descriptions)
                .saturating_add(session.server.len())
                .saturating_add(session.server_info.len()),
        )),
        EventKind::ToolsChanged(change) => Some((
            &change.server,
            tool_data(&change.tools, descriptions).saturating_add(change.server.len()),
        )),
        _ => None,
    }
}

/// [`tool_data`] of the list `event` hands over, without the escapes: quick, and at most the
/// real weight.
pub(crate) fn rough_tool_data(event: &Event, descriptions: bool) -> usize {
    let tools = match &event.kind {
        EventKind::Connected(session) => &session.tools,
        EventKind::ToolsChanged(change) => &change.tools,
        _ => return 0,
    };
    tools.iter().fold(0usize, |sum, tool| {
        let sum = sum
            .saturating_add(TOOL_OVERHEAD)
            .saturating_add(tool.name.len());
        if !descriptions {
            return sum;
        }
        sum.saturating_add(tool.description.as_deref().map_or(0, str::len))
            .saturating_add(tool.input_schema.len())
    })
}

/// The tool data an instance's state holds, as handed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HeldData {
    /// Per server, its latest tool list (from `connected` or `tools-changed`).
    servers: BTreeMap<String, usize>,
    /// Restored from a snapshot without an account per server: the snapshot's size.
    restored: usize,
    /// The sum of `servers`, kept as they change: every guest call asks for the total, and
    /// summing would cost each call in proportion to the servers configured.
    servers_total: usize,
}

impl HeldData {
    /// Nothing held per server; the `bytes` of a restored snapshot.
    fn from_snapshot(bytes: usize) -> Self {
        Self {
            restored: bytes,
            ..Self::default()
        }
    }

    /// All the tool data the state holds, in bytes.
    pub(crate) fn total(&self) -> usize {
        self.restored.saturating_add(self.servers_total)
    }

    /// Accounts for `event`, which the policy has handled; `handed` is [`handed_over`] of it.
    fn note(&mut self, event: &Event, handed: Option<(&str, usize)>) {
        if let Some((server, bytes)) = handed {
            self.hold(server, Some(bytes));
        } else if let EventKind::ServerRemoved(server) = &event.kind {
            self.hold(server, None);
        }
    }

    /// `server` now holds `bytes` of tool data (`None`: nothing, it is gone). Every change goes
    /// through here, so the sum stays that of `servers` (whose sizes, of lists held in memory,
    /// sum far below `usize::MAX`).
    fn hold(&mut self, server: &str, bytes: Option<usize>) {
        let replaced = match bytes {
            Some(bytes) => self.servers.insert(server.to_string(), bytes),
            None => self.servers.remove(server),
        };
        self.servers_total = self
            .servers_total
            .saturating_sub(replaced.unwrap_or(0))
            .saturating_add(bytes.unwrap_or(0));
    }
}

/// The bytes a guest call may hand the host (its results) when it holds no tool data:
/// wasmtime's default "hostcall fuel".
const HOSTCALL_BYTES: usize = 128 << 20;

/// The bytes a guest call may hand the host per byte of tool data on top of [`HOSTCALL_BYTES`]:
/// a snapshot carries each tool about twice (the session's list and the publication), actions
/// republish at most what is held.
const HOSTCALL_BYTES_PER_DATA_BYTE: usize = 4;

/// The fuel of a call, given the tool data held or handed over.
fn fuel_budget(limits: &Limits, data: usize) -> u64 {
    let data = u64::try_from(data).unwrap_or(u64::MAX);
    limits
        .fuel_per_call
        .saturating_add(data.saturating_mul(limits.fuel_per_data_byte))
}

/// The memory cap of a call, given the tool data held or handed over.
fn memory_cap(limits: &Limits, data: usize) -> usize {
    let cap = limits
        .memory_bytes
        .saturating_add(data.saturating_mul(limits.memory_per_data_byte));
    usize::try_from(WASM32_MAX_MEMORY).map_or(cap, |max| cap.min(max))
}

/// A live instance of a loaded policy component, in its own sandbox with fuel and memory limits.
pub struct PolicyInstance {
    store: Store<StoreState>,
    exports: Box<dyn Exports>,
    policy: Arc<LoadedPolicy>,
    limits: Limits,
    /// At most this much fuel per guest call, when set (an inline decision's smaller budget).
    fuel_cap: Option<u64>,
    /// The fuel of the current (or last) guest call.
    fuel_budget: u64,
    /// The tool data the guest's state holds.
    held: HeldData,
    /// The memory cap in force (in the store's `StoreLimits`).
    memory_cap: usize,
    #[cfg(any(test, feature = "test-support"))]
    /// What is true of the servers, when the instance is fed outside a runtime
    /// ([`Self::handle`]); a runtime keeps its own.
    ledger: Ledger,
}

impl PolicyInstance {
    /// Instantiates `policy` in a fresh, empty sandbox. The guest is not initialized yet.
    pub fn instantiate(policy: &Arc<LoadedPolicy>, limits: &Limits) -> Result<Self, PolicyError> {
        // No preopens, no env, no args, no network: the policy can reach nothing.
        let state = StoreState::new(Arc::from(policy.label()), memory_cap(limits, 0));
        let mut store = Store::new(policy.engine(), state);
        store.limiter(|state| state.limits());
        store
            .set_fuel(limits.fuel_per_call)
            .map_err(|e| policy.fault("instantiation", PolicyFault::Trap(format!("{e:#}"))))?;
        let memory_cap = memory_cap(limits, 0);
        let exports = policy.pre().instantiate(&mut store).map_err(|e| {
            let fault = classify(&e, limits.fuel_per_call, memory_cap);
            policy.fault("instantiation", fault)
        })?;
        Ok(Self {
            store,
            exports,
            policy: policy.clone(),
            limits: limits.clone(),
            fuel_cap: None,
            fuel_budget: limits.fuel_per_call,
            held: HeldData::default(),
            memory_cap,
            #[cfg(any(test, feature = "test-support"))]
            ledger: Ledger::default(),
        })
    }

    /// The component this instance runs.
    pub fn policy(&self) -> &Arc<LoadedPolicy> {
        &self.policy
    }

    /// Runs `f` with every guest call limited to `fuel` (at most the configured budget).
    pub fn with_fuel<R>(&mut self, fuel: u64, f: impl FnOnce(&mut Self) -> R) -> R {
        self.fuel_cap = Some(fuel.min(self.limits.fuel_per_call));
        let result = f(self);
        self.fuel_cap = None;
        result
    }

    /// The tool data the guest's state holds, as handed over.
    pub(crate) fn held(&self) -> &HeldData {
        &self.held
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The memory cap of the latest guest call, in bytes (the next one's follows the data).
    pub fn memory_cap(&self) -> usize {
        self.memory_cap
    }

    /// Runs one guest call with fuel and a memory cap sized for the data held plus `incoming`
    /// bytes handed over, turning traps into [`PolicyFault`]s.
    fn call<R>(
        &mut self,
        during: &'static str,
        incoming: usize,
        f: impl FnOnce(&dyn Exports, &mut Store<StoreState>) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let data = self.held.total().saturating_add(incoming);
        let fuel = fuel_budget(&self.limits, data);
        self.fuel_budget = self.fuel_cap.map_or(fuel, |cap| cap.min(fuel));
        // What the guest hands back (a snapshot, publications) is data too: wasmtime's limit on
        // it (128 MiB by default) would refuse a snapshot of 64 MB of tools.
        self.store.set_hostcall_fuel(
            HOSTCALL_BYTES.saturating_add(data.saturating_mul(HOSTCALL_BYTES_PER_DATA_BYTE)),
        );
        let cap = memory_cap(&self.limits, data);
        if cap != self.memory_cap {
            self.store.data_mut().set_memory_cap(cap);
            self.memory_cap = cap;
        }
        self.store.set_fuel(self.fuel_budget).map_err(|e| {
            self.policy
                .fault(during, PolicyFault::Trap(format!("{e:#}")))
        })?;
        f(&*self.exports, &mut self.store).map_err(|e| {
            let fault = classify(&e, self.fuel_budget, self.memory_cap);
            self.policy.fault(during, fault)
        })
    }

    /// Whether this policy is handed tool descriptions and schemas (contract 0.1).
    fn descriptions(&self) -> bool {
        self.policy.contract().carries_descriptions()
    }

    /// Asks the guest who it is (its name and version).
    pub fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
        self.call("info", 0, |x, s| x.info(s))
    }

    /// Initializes the guest with settings; a refusal is an error naming the policy, not a fault.
    pub fn init(&mut self, settings: &str) -> Result<(), PolicyError> {
        let answer = self.call("init", 0, |x, s| x.init(s, settings))?;
        answer.map_err(|reason| self.policy.refused("the settings", reason))?;
        // `init` forgets all state.
        self.held = HeldData::default();
        Ok(())
    }

    /// Changes the guest's settings, keeping its state; a refusal is an error naming the policy.
    pub fn set_settings(&mut self, settings: &str) -> Result<(), PolicyError> {
        let answer = self.call("set-settings", 0, |x, s| x.set_settings(s, settings))?;
        answer.map_err(|reason| self.policy.refused("the settings", reason))
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Feeds an event, outside a runtime: the instance keeps each server's latest tool list
    /// itself, for the descriptions of a 0.2 policy's publications.
    pub fn handle(&mut self, event: &Event) -> Result<Vec<Action>, PolicyError> {
        let mut ledger = std::mem::take(&mut self.ledger);
        ledger.note_event(event);
        let answer = self.handle_with(event, &|server, original| ledger.tool(server, original));
        self.ledger = ledger;
        answer
    }

    /// Feeds an event. `lookup` finds a tool in a server's latest list, for the descriptions of
    /// a 0.2 policy's publications. An event the policy's contract has no word for (a cancelled
    /// call, for 0.1) is not fed.
    pub(crate) fn handle_with<'a>(
        &mut self,
        event: &Event,
        lookup: &Lookup<'a>,
    ) -> Result<Vec<Action>, PolicyError> {
        // The operator's naming reaches a 0.2.1 policy right before the server's configuration.
        if let EventKind::ServerConfigured(config) = &event.kind
            && let Some(naming) = config.naming()
        {
            self.set_naming(&naming)?;
        }
        // What gives a missing authorization reaches a 0.2.2 policy right before the fault.
        if let EventKind::ConnectFailed(f)
        | EventKind::Disconnected(f)
        | EventKind::KeepaliveFailed(f) = &event.kind
            && let Fault::AuthorizationRequired(what_to_do) = &f.fault
        {
            self.authorization_required(&f.server, what_to_do)?;
        }
        let handed = handed_over(event, self.descriptions());
        let incoming = handed.map_or(0, |(_, bytes)| bytes);
        let max_actions = self.limits.max_actions;
        let answer = self.call("handle", incoming, |x, s| {
            x.handle(s, event, lookup, max_actions)
        })?;
        let Some(actions) = answer else {
            return Ok(Vec::new());
        };
        self.held.note(event, handed);
        self.checked(actions, "handle")
    }

    /// Feeds `event` and checks the actions, keeping `ledger` (what the host knows) in step:
    /// it hears the event first (a 0.2 publication needs the tools it brings), except a
    /// removal (the policy still acts on the server it forgets), then the actions.
    pub(crate) fn decide_event(
        &mut self,
        ledger: &mut Ledger,
        event: &Event,
    ) -> Result<Vec<Action>, PolicyError> {
        let removal = matches!(event.kind, EventKind::ServerRemoved(_));
        if !removal {
            ledger.note_event(event);
        }
        let actions = self.handle_with(event, &|server, original| ledger.tool(server, original))?;
        check_actions(&actions, ledger)
            .map_err(|why| self.policy.fault("handle", PolicyFault::InvalidOutput(why)))?;
        if removal {
            ledger.note_event(event);
        }
        ledger.note_actions(&actions);
        Ok(actions)
    }

    /// Asks whether a call may be made, and checks the answer.
    pub(crate) fn decide_admission(
        &mut self,
        request: &CallRequest,
    ) -> Result<Admission, PolicyError> {
        let admission = self.admit(request)?;
        check_admission(&admission)
            .map_err(|why| self.policy.fault("admit", PolicyFault::InvalidOutput(why)))?;
        Ok(admission)
    }

    /// Actions the host can take; others are the policy's invalid output.
    fn checked(&self, actions: Actions, during: &'static str) -> Result<Vec<Action>, PolicyError> {
        actions.map_err(|why| self.policy.fault(during, PolicyFault::InvalidOutput(why)))
    }

    /// Asks the guest whether a tool call may be made.
    pub fn admit(&mut self, request: &CallRequest) -> Result<Admission, PolicyError> {
        self.call("admit", 0, |x, s| x.admit(s, request))
    }

    /// Every server's status at host time `now` (0.1 policies know no time here).
    pub fn status(&mut self, now: Millis) -> Result<Vec<ServerStatus>, PolicyError> {
        self.call("status", 0, |x, s| x.status(s, now))
    }

    /// Serializes the guest's whole state, for `restore` in a fresh instance of the same policy.
    pub fn snapshot(&mut self) -> Result<Vec<u8>, PolicyError> {
        self.call("snapshot", 0, |x, s| x.snapshot(s))
    }

    /// Restores a snapshot. The data it carries is accounted as the snapshot's size; the runtime,
    /// which knows each server's share, uses `restore_holding`.
    pub fn restore(&mut self, snapshot: &[u8]) -> Result<(), PolicyError> {
        self.restore_holding(snapshot, HeldData::from_snapshot(snapshot.len()))
    }

    /// Restores a snapshot of an instance that held `held` when it was taken.
    pub(crate) fn restore_holding(
        &mut self,
        snapshot: &[u8],
        held: HeldData,
    ) -> Result<(), PolicyError> {
        // Sized for the larger of the snapshot and the data it carries, as accounted.
        let incoming = snapshot.len().max(held.total());
        let answer = self.call("restore", incoming, |x, s| x.restore(s, snapshot))?;
        answer.map_err(|reason| self.policy.refused("the saved state", reason))?;
        self.held = held;
        Ok(())
    }

    /// Whether this policy hears about missing authorizations (contract 0.2.2).
    pub fn takes_authorization(&self) -> bool {
        self.exports.takes_authorization()
    }

    /// Tells a 0.2.2 policy that `server` needs an authorization only a person can give, and
    /// what gives it; older policies hear only the `auth-required` fault.
    pub fn authorization_required(
        &mut self,
        server: &str,
        what_to_do: &str,
    ) -> Result<(), PolicyError> {
        if !self.takes_authorization() {
            return Ok(());
        }
        self.call("authorization-required", 0, |x, s| {
            x.authorization_required(s, server, what_to_do)
        })
    }

    /// Whether this policy names tools and prompts as the operator asks (contract 0.2.1).
    pub fn takes_naming(&self) -> bool {
        self.exports.takes_naming()
    }

    /// Tells a 0.2.1 policy the operator's naming of a server; older policies ignore it.
    pub fn set_naming(&mut self, naming: &Naming) -> Result<(), PolicyError> {
        if !self.takes_naming() {
            return Ok(());
        }
        self.call("set-naming", 0, |x, s| x.set_naming(s, naming))
    }

    /// The names a 0.2.1 policy gives a server's prompts (checked: usable, unique, and only of
    /// the `originals` asked about); `None` from an older policy, which cannot be asked.
    pub fn name_prompts(
        &mut self,
        server: &str,
        originals: &[String],
    ) -> Result<Option<Vec<NamedPrompt>>, PolicyError> {
        if !self.takes_naming() {
            return Ok(None);
        }
        let named = self.call("name-prompts", 0, |x, s| {
            x.name_prompts(s, server, originals)
        })?;
        if let Some(named) = &named {
            check_prompt_names(originals, named).map_err(|why| {
                self.policy
                    .fault("name-prompts", PolicyFault::InvalidOutput(why))
            })?;
        }
        Ok(named)
    }

    /// Whether this policy can take over another implementation's state (contract 0.2).
    pub fn can_take_over(&self) -> bool {
        self.exports.can_take_over()
    }

    /// Hands a 0.2 policy the state of another implementation; returns its actions. `lookup`
    /// as for [`Self::handle`]. A 0.1 policy cannot take over (see [`Self::can_take_over`]).
    pub fn take_over<'a>(
        &mut self,
        handover: &Handover,
        lookup: &Lookup<'a>,
    ) -> Result<Vec<Action>, PolicyError> {
        let mut held = HeldData::default();
        for server in &handover.servers {
            if let Some(session) = &server.session {
                held.hold(&server.config.name, Some(tool_data(&session.tools, false)));
            }
        }
        // A 0.2.1 policy hears the operator's naming of each server first.
        for server in &handover.servers {
            if let Some(naming) = server.config.naming() {
                self.set_naming(&naming)?;
            }
        }
        let max_actions = self.limits.max_actions;
        let answer = self.call("take-over", held.total(), |x, s| {
            x.take_over(s, handover, lookup, max_actions)
        })?;
        let actions =
            answer.map_err(|reason| self.policy.refused("the handed-over state", reason))?;
        let actions = self.checked(actions, "take-over")?;
        self.held = held;
        Ok(actions)
    }
}

/// Names what stopped a guest call made with `fuel` and a memory cap of `memory_cap` bytes.
fn classify(error: &wasmtime::Error, fuel: u64, memory_cap: usize) -> PolicyFault {
    let text = format!("{error:#}");
    let memory = text.contains("forcing trap when growing memory");
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => PolicyFault::OutOfFuel(fuel),
        Some(Trap::AllocationTooLarge) => PolicyFault::Memory(memory_cap),
        _ if memory => PolicyFault::Memory(memory_cap),
        Some(trap) => PolicyFault::Trap(format!("{trap}: {text}")),
        None => PolicyFault::Trap(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::types::SessionInfo;

    fn connected(server: &str, tools: usize) -> Event {
        let tool = |i: usize| Tool {
            name: format!("tool{i}"),
            description: None,
            input_schema: String::new(),
            read_only: false,
            extra: String::new(),
        };
        Event {
            now: 0,
            kind: EventKind::Connected(SessionInfo {
                server: server.to_string(),
                server_info: "fixture 1".to_string(),
                tools: (0..tools).map(tool).collect(),
            }),
        }
    }

    fn note(held: &mut HeldData, event: &Event) {
        held.note(event, handed_over(event, false));
    }

    #[test]
    fn the_data_held_follows_each_servers_latest_list() {
        let mut held = HeldData::from_snapshot(100);
        let (a, b) = (connected("a", 3), connected("b", 5));
        let size = |event: &Event| handed_over(event, false).unwrap().1;
        note(&mut held, &a);
        note(&mut held, &b);
        assert_eq!(held.total(), 100 + size(&a) + size(&b));
        // A new list replaces the server's last one; it does not add to it.
        let a_again = connected("a", 1);
        note(&mut held, &a_again);
        assert_eq!(held.total(), 100 + size(&a_again) + size(&b));
        let removed = Event {
            now: 0,
            kind: EventKind::ServerRemoved("b".to_string()),
        };
        note(&mut held, &removed);
        assert_eq!(held.total(), 100 + size(&a_again));
        // Other events change nothing.
        note(
            &mut held,
            &Event {
                now: 0,
                kind: EventKind::Shutdown,
            },
        );
        assert_eq!(held.total(), 100 + size(&a_again));
    }

    #[test]
    fn a_servers_data_handed_over_is_let_go_when_it_is_removed() {
        let mut held = HeldData::default();
        // As a take-over fills it, then the server is removed: nothing is left held.
        held.hold("handed", Some(40));
        held.hold("kept", Some(7));
        let removed = Event {
            now: 0,
            kind: EventKind::ServerRemoved("handed".to_string()),
        };
        note(&mut held, &removed);
        assert_eq!(held.total(), 7);
    }
}
