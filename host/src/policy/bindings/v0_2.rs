//! Contract `tether:policy@0.2.x` (`wit/0.2`): tools as names and revisions (the host keeps
//! descriptions and schemas and adds them to publications), `take-over` of another
//! implementation's state, held calls, the `cancelled` outcome, `status` at the host's time.

wasmtime::component::bindgen!({
    path: "../wit/0.2",
    world: "policy-component",
});

use sha2::{Digest, Sha256};

use self::tether::policy::log::Level as LogLevel;
use self::tether::policy::types as wit;
use crate::policy::instance::StoreState;
use crate::policy::types as host;

/// The contract version these bindings were generated from.
pub const VERSION: &str = "0.2.0";

super::unchanged_types!();

/// A digest of what agents read of a tool beyond its name: its description and schema.
pub fn revision(tool: &host::Tool) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(tool.description.as_deref().unwrap_or_default());
    hasher.update([0]);
    hasher.update(&tool.input_schema);
    hasher.update([u8::from(tool.description.is_some())]);
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
        original: t.original,
        read_only: t.read_only,
    })
}

pub(crate) fn admission(admission: wit::Admission) -> host::Admission {
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

pub(crate) fn status(s: wit::ServerStatus) -> host::ServerStatus {
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
pub(crate) fn handover(h: &host::Handover) -> wit::Handover {
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
