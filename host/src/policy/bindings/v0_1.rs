//! Contract `tether:policy@0.1.x` (`wit/0.1`): tools with descriptions and schemas, no
//! handover, no held calls, no `cancelled` outcome, `status` without the time.

wasmtime::component::bindgen!({
    path: "../wit/0.1",
    world: "policy-component",
});

use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use self::exports::tether::policy::policy::Guest;
use self::tether::policy::log::Level as LogLevel;
use self::tether::policy::types as wit;
use super::{Exports, Prepared};
use crate::policy::store::StoreState;
use crate::policy::types as host;

/// The contract version these bindings were generated from.
pub const VERSION: &str = "0.1.0";

super::unchanged_types!();

pub(super) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    PolicyComponent::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

pub(super) fn prepare(
    _component: &Component,
    instance_pre: InstancePre<StoreState>,
) -> wasmtime::Result<Box<dyn Prepared>> {
    Ok(Box::new(PolicyComponentPre::new(instance_pre)?))
}

impl Prepared for PolicyComponentPre<StoreState> {
    fn instantiate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Box<dyn Exports>> {
        Ok(Box::new(PolicyComponentPre::instantiate(self, store)?))
    }
}

impl PolicyComponent {
    fn policy(&self) -> &Guest {
        self.tether_policy_policy()
    }
}

impl Exports for PolicyComponent {
    super::same_calls!();

    fn status(
        &self,
        store: &mut Store<StoreState>,
        _now: host::Millis,
    ) -> wasmtime::Result<Vec<host::ServerStatus>> {
        let all = self.policy().call_status(store)?;
        Ok(all.into_iter().map(status).collect())
    }
}

fn tool(t: &host::Tool) -> wit::Tool {
    wit::Tool {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: t.input_schema.clone(),
        read_only: t.read_only,
    }
}

/// 0.1 has no `cancelled`: a cancelled call is not reported (it says nothing of the server).
fn call_outcome(outcome: host::CallOutcome) -> Option<wit::CallOutcome> {
    Some(match outcome {
        host::CallOutcome::Ok => wit::CallOutcome::Ok,
        host::CallOutcome::ToolError(s) => wit::CallOutcome::ToolError(s),
        host::CallOutcome::TransportError(f) => wit::CallOutcome::TransportError(f.into()),
        host::CallOutcome::Timeout => wit::CallOutcome::Timeout,
        host::CallOutcome::Cancelled => return None,
    })
}

/// A 0.1 policy publishes the descriptions it was given; the host adds the rest of the
/// definition (title, annotations, ...), which 0.1 never carried, where it knows the tool.
fn published_tool<'a>(
    server: &str,
    t: wit::PublishedTool,
    lookup: &dyn Fn(&str, &str) -> Option<&'a host::Tool>,
) -> Result<host::PublishedTool, String> {
    let extra = lookup(server, &t.original)
        .map(|known| known.extra.clone())
        .unwrap_or_default();
    Ok(host::PublishedTool {
        advertised: t.advertised,
        original: t.original,
        description: t.description,
        input_schema: t.input_schema,
        read_only: t.read_only,
        extra,
    })
}

fn admission(admission: wit::Admission) -> host::Admission {
    match admission {
        wit::Admission::Allow => host::Admission::Allow,
        wit::Admission::Probe => host::Admission::Probe,
        wit::Admission::Reject(s) => host::Admission::Reject(s),
        wit::Admission::Reconnect(s) => host::Admission::Reconnect(s),
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
        next_attempt_at: None,
        breaker_until: None,
    }
}
