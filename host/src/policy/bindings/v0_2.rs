//! Contract `tether:policy@0.2.x`: tools as names and revisions (the host keeps descriptions
//! and schemas and adds them to publications), `take-over` of another implementation's state,
//! held calls, the `cancelled` outcome, `status` at the host's time.
//!
//! The bindings are generated from the line as first published (`wit/0.2.0`), so every 0.2.x
//! component loads; what a later minor adds is looked up by name when the component has it
//! (0.2.1: `set-naming` and `name-prompts`, [`Naming`]; 0.2.2: `authorization-required`,
//! [`Authorization`]), and a component without it is treated as the older minor was.

wasmtime::component::bindgen!({
    path: "../wit/0.2.0",
    world: "policy-component",
});

use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentType, HasSelf, InstancePre, Lift, Linker, Lower,
    TypedFunc,
};

use self::exports::tether::policy::policy::Guest;
use self::tether::policy::log::Level as LogLevel;
use self::tether::policy::types as wit;
use super::{Actions, Exports, Lookup, Prepared};
use crate::policy::store::StoreState;
use crate::policy::types as host;

/// The contract version these bindings were generated from.
pub const VERSION: &str = "0.2.0";

/// The minor that added the operator's naming.
const NAMING_SINCE: &str = "0.2.1";

/// The minor that added authorizations.
const AUTHORIZATION_SINCE: &str = "0.2.2";

/// The newest minor of the line this host knows (what `wit/0.2` declares).
pub const NEWEST: &str = AUTHORIZATION_SINCE;

/// A component of the 0.2 line ready to instantiate: the 0.2.0 exports, and where a later
/// minor's additions are, if it has them.
struct Pre {
    exports: PolicyComponentPre<StoreState>,
    naming: Option<NamingIndices>,
    authorization: Option<ComponentExportIndex>,
}

/// An instance's 0.2 exports.
struct Bound {
    exports: PolicyComponent,
    naming: Option<Naming>,
    authorization: Option<Authorization>,
}

/// 0.2.2's `authorization` interface of one instance.
struct Authorization {
    required: TypedFunc<(String, String), ()>,
}

impl Authorization {
    /// `authorization-required(server, what-to-do)`.
    fn required(
        &self,
        store: &mut Store<StoreState>,
        server: &str,
        what_to_do: &str,
    ) -> wasmtime::Result<()> {
        self.required
            .call(store, (server.to_string(), what_to_do.to_string()))
    }
}

/// Where 0.2.1's `set-naming` and `name-prompts` are in a component.
struct NamingIndices {
    set_naming: ComponentExportIndex,
    name_prompts: ComponentExportIndex,
}

/// 0.2.1's `naming` record, as the host lowers it.
#[derive(ComponentType, Lower)]
#[component(record)]
struct WitNaming {
    server: String,
    prefix: Option<String>,
}

/// 0.2.1's `named-prompt` record, as the host lifts it.
#[derive(ComponentType, Lift)]
#[component(record)]
struct WitNamedPrompt {
    advertised: String,
    original: String,
}

/// 0.2.1's naming functions of one instance.
struct Naming {
    set_naming: TypedFunc<(WitNaming,), ()>,
    name_prompts: TypedFunc<(String, Vec<String>), (Vec<WitNamedPrompt>,)>,
}

pub(super) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    PolicyComponent::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

pub(super) fn prepare(
    component: &Component,
    instance_pre: InstancePre<StoreState>,
) -> wasmtime::Result<Box<dyn Prepared>> {
    Ok(Box::new(Pre::new(component, instance_pre)?))
}

impl Pre {
    fn new(component: &Component, instance_pre: InstancePre<StoreState>) -> wasmtime::Result<Self> {
        // Found by semver: a 0.2.2 component's `policy@0.2.2` answers for 0.2.1.
        let naming = component
            .get_export_index(
                None,
                format!("tether:policy/policy@{NAMING_SINCE}").as_str(),
            )
            .and_then(|policy| {
                Some(NamingIndices {
                    set_naming: component.get_export_index(Some(&policy), "set-naming")?,
                    name_prompts: component.get_export_index(Some(&policy), "name-prompts")?,
                })
            });
        let authorization = component
            .get_export_index(
                None,
                format!("tether:policy/authorization@{AUTHORIZATION_SINCE}").as_str(),
            )
            .and_then(|at| component.get_export_index(Some(&at), "authorization-required"));
        Ok(Self {
            exports: PolicyComponentPre::new(instance_pre)?,
            naming,
            authorization,
        })
    }

    fn bind(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Bound> {
        let instance = self.exports.instance_pre().instantiate(&mut *store)?;
        let exports = PolicyComponent::new(&mut *store, &instance)?;
        let naming = match &self.naming {
            Some(at) => Some(Naming {
                set_naming: instance.get_typed_func(&mut *store, at.set_naming)?,
                name_prompts: instance.get_typed_func(&mut *store, at.name_prompts)?,
            }),
            None => None,
        };
        let authorization = match &self.authorization {
            Some(at) => Some(Authorization {
                required: instance.get_typed_func(&mut *store, at)?,
            }),
            None => None,
        };
        Ok(Bound {
            exports,
            naming,
            authorization,
        })
    }
}

impl Prepared for Pre {
    fn instantiate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Box<dyn Exports>> {
        Ok(Box::new(self.bind(store)?))
    }
}

impl Bound {
    fn policy(&self) -> &Guest {
        self.exports.tether_policy_policy()
    }
}

impl Exports for Bound {
    super::same_calls!();

    fn status(
        &self,
        store: &mut Store<StoreState>,
        now: host::Millis,
    ) -> wasmtime::Result<Vec<host::ServerStatus>> {
        let all = self.policy().call_status(store, now)?;
        Ok(all.into_iter().map(status).collect())
    }

    fn can_take_over(&self) -> bool {
        true
    }

    fn take_over<'a>(
        &self,
        store: &mut Store<StoreState>,
        handover: &host::Handover,
        lookup: &Lookup<'a>,
        max_actions: usize,
    ) -> wasmtime::Result<Result<Actions, String>> {
        let answer = self
            .policy()
            .call_take_over(store, &self::handover(handover))?;
        Ok(answer.map(|actions| {
            super::convert_actions(actions, max_actions, "a handover", |a| action(a, lookup))
        }))
    }

    fn takes_naming(&self) -> bool {
        self.naming.is_some()
    }

    fn set_naming(
        &self,
        store: &mut Store<StoreState>,
        naming: &host::Naming,
    ) -> wasmtime::Result<()> {
        match &self.naming {
            Some(funcs) => funcs.set(store, naming),
            None => Ok(()),
        }
    }

    fn name_prompts(
        &self,
        store: &mut Store<StoreState>,
        server: &str,
        originals: &[String],
    ) -> wasmtime::Result<Option<Vec<host::NamedPrompt>>> {
        match &self.naming {
            Some(funcs) => funcs.name_prompts(store, server, originals).map(Some),
            None => Ok(None),
        }
    }

    fn takes_authorization(&self) -> bool {
        self.authorization.is_some()
    }

    fn authorization_required(
        &self,
        store: &mut Store<StoreState>,
        server: &str,
        what_to_do: &str,
    ) -> wasmtime::Result<()> {
        match &self.authorization {
            Some(funcs) => funcs.required(store, server, what_to_do),
            None => Ok(()),
        }
    }
}

impl Naming {
    /// `set-naming(naming)`.
    fn set(&self, store: &mut Store<StoreState>, naming: &host::Naming) -> wasmtime::Result<()> {
        self.set_naming.call(
            store,
            (WitNaming {
                server: naming.server.clone(),
                prefix: naming.prefix.clone(),
            },),
        )
    }

    /// `name-prompts(server, originals)`.
    fn name_prompts(
        &self,
        store: &mut Store<StoreState>,
        server: &str,
        originals: &[String],
    ) -> wasmtime::Result<Vec<host::NamedPrompt>> {
        let (named,) = self
            .name_prompts
            .call(store, (server.to_string(), originals.to_vec()))?;
        Ok(named
            .into_iter()
            .map(|n| host::NamedPrompt {
                advertised: n.advertised,
                original: n.original,
            })
            .collect())
    }
}

super::unchanged_types!();

/// A digest of what agents read of a tool beyond its name: its description and schema.
pub fn revision(tool: &host::Tool) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(tool.description.as_deref().unwrap_or_default());
    hasher.update([0]);
    hasher.update(&tool.input_schema);
    hasher.update([u8::from(tool.description.is_some())]);
    // What else agents read (a title, annotations, an output schema): its change republishes
    // too. Nothing is added for a tool without it, so such tools keep their revisions.
    if !tool.extra.is_empty() {
        hasher.update([0]);
        hasher.update(&tool.extra);
    }
    let digest = hasher.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

fn tool(t: &host::Tool) -> wit::Tool {
    wit::Tool {
        revision: revision(t),
        name: t.name.clone(),
        read_only: t.read_only,
    }
}

fn call_outcome(outcome: host::CallOutcome) -> Option<wit::CallOutcome> {
    Some(match outcome {
        host::CallOutcome::Ok => wit::CallOutcome::Ok,
        host::CallOutcome::ToolError(s) => wit::CallOutcome::ToolError(s),
        host::CallOutcome::TransportError(f) => wit::CallOutcome::TransportError(f.into()),
        host::CallOutcome::Timeout => wit::CallOutcome::Timeout,
        host::CallOutcome::Cancelled => wit::CallOutcome::Cancelled,
    })
}

/// The host adds the description and schema of the server's latest list.
fn published_tool<'a>(
    server: &str,
    t: wit::PublishedTool,
    lookup: &dyn Fn(&str, &str) -> Option<&'a host::Tool>,
) -> Result<host::PublishedTool, String> {
    let Some(known) = lookup(server, &t.original) else {
        return Err(format!(
            "published {} as {:?}, which server {server:?} does not offer",
            t.advertised.chars().take(80).collect::<String>(),
            t.original.chars().take(80).collect::<String>()
        ));
    };
    Ok(host::PublishedTool {
        advertised: t.advertised,
        description: known.description.clone(),
        input_schema: known.input_schema.clone(),
        extra: known.extra.clone(),
        original: t.original,
        read_only: t.read_only,
    })
}

fn admission(admission: wit::Admission) -> host::Admission {
    match admission {
        wit::Admission::Allow => host::Admission::Allow,
        wit::Admission::Probe => host::Admission::Probe,
        wit::Admission::Reject(s) => host::Admission::Reject(s),
        wit::Admission::Reconnect(s) => host::Admission::Reconnect(s),
        wit::Admission::Hold(hold) => host::Admission::Hold(host::Hold {
            wait_ms: hold.wait_ms,
            message: hold.message,
        }),
    }
}

fn status(s: wit::ServerStatus) -> host::ServerStatus {
    host::ServerStatus {
        server: s.server,
        state: s.state.into(),
        breaker: s.breaker.into(),
        failures: s.failures,
        breaker_failures: s.breaker_failures,
        tool_errors: s.tool_errors,
        last_fault: s.last_fault,
        since: s.since,
        published_tools: s.published_tools,
        next_attempt_at: s.next_attempt_at,
        breaker_until: s.breaker_until,
    }
}

impl From<host::ServerState> for wit::ServerState {
    fn from(state: host::ServerState) -> Self {
        match state {
            host::ServerState::Connecting => wit::ServerState::Connecting,
            host::ServerState::Connected => wit::ServerState::Connected,
            host::ServerState::Healthy => wit::ServerState::Healthy,
            host::ServerState::BackingOff => wit::ServerState::BackingOff,
            host::ServerState::Parked => wit::ServerState::Parked,
            host::ServerState::Stopped => wit::ServerState::Stopped,
        }
    }
}

impl From<host::BreakerState> for wit::BreakerState {
    fn from(state: host::BreakerState) -> Self {
        match state {
            host::BreakerState::Closed => wit::BreakerState::Closed,
            host::BreakerState::Open => wit::BreakerState::Open,
            host::BreakerState::HalfOpen => wit::BreakerState::HalfOpen,
        }
    }
}

/// Borrowed, like events: only names, flags and revisions of the tools are copied.
fn handover(h: &host::Handover) -> wit::Handover {
    wit::Handover {
        now: h.now,
        previous: wit::PolicyInfo {
            name: h.previous.name.clone(),
            version: h.previous.version.clone(),
        },
        servers: h
            .servers
            .iter()
            .map(|s| wit::ServerHandover {
                config: s.config.clone().into(),
                session: s.session.as_ref().map(|live| wit::LiveSession {
                    server_info: live.server_info.clone(),
                    tools: tools(&live.tools),
                    proven: live.proven,
                }),
                connecting: s.connecting,
                state: s.state.into(),
                breaker: s.breaker.into(),
                breaker_until: s.breaker_until,
                failures: s.failures,
                breaker_failures: s.breaker_failures,
                tool_errors: s.tool_errors,
                last_fault: s.last_fault.clone(),
                since: s.since,
                next_attempt_at: s.next_attempt_at,
            })
            .collect(),
    }
}
