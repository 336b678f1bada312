//! What the core decides, and what a decision yields.

use crate::policy::PolicyError;
use crate::policy::instance::{PolicyInstance, rough_tool_data};
use crate::policy::ledger::Ledger;
use crate::policy::types::{
    Action, Admission, CallRequest, Event, EventKind, Millis, NamedPrompt, ServerStatus,
};

/// One thing for the policy to decide, in the order the host asks.
pub(crate) enum Input {
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
/// ([`super::DEFAULT_INLINE_FUEL`]) is meant for the decisions that take a few thousand.
pub(crate) const INLINE_TOOL_DATA: usize = 16 << 10;

impl Input {
    /// Whether deciding the input is work for the policy thread, whatever the queue, for a
    /// policy that is (`descriptions`) or is not handed tool descriptions.
    pub(crate) fn is_heavy(&self, descriptions: bool) -> bool {
        matches!(self, Input::Event(event) if rough_tool_data(event, descriptions) > INLINE_TOOL_DATA)
    }

    /// Whether the input is an event about a server's life (anything but a call's report).
    pub(crate) fn is_lifecycle_event(&self) -> bool {
        matches!(self, Input::Event(event) if !matches!(event.kind, EventKind::CallFinished(_)))
    }

    /// The tool data the input carries, roughly, in bytes (names, descriptions and schemas).
    pub(crate) fn tool_data(&self) -> usize {
        match self {
            Input::Event(event) => rough_tool_data(event, true),
            _ => 0,
        }
    }

    /// Whether the input can change the policy's state (and so belongs in the replay journal).
    pub(crate) fn changes_state(&self) -> bool {
        !matches!(self, Input::Status(_) | Input::NamePrompts { .. })
    }

    /// Decides the input on `instance`, keeping `ledger` (what the host knows) up to date.
    pub(crate) fn decide_on(
        &self,
        instance: &mut PolicyInstance,
        ledger: &mut Ledger,
    ) -> Result<Output, PolicyError> {
        Ok(match self {
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

    /// The host's time the input carries, if it carries one.
    pub(crate) fn time(&self) -> Option<Millis> {
        match self {
            Input::Event(event) => Some(event.now),
            Input::Status(now) => Some(*now),
            _ => None,
        }
    }
}

/// What deciding an [`Input`] yielded (the variant matches the input's).
#[derive(Debug)]
pub(crate) enum Output {
    Actions(Vec<Action>),
    Admission(Admission),
    Status(Vec<ServerStatus>),
    Prompts(Option<Vec<NamedPrompt>>),
    Done,
}

impl Output {
    pub(crate) fn into_actions(self) -> Vec<Action> {
        match self {
            Output::Actions(actions) => actions,
            _ => unreachable!("an event yields actions"),
        }
    }

    pub(crate) fn into_admission(self) -> Admission {
        match self {
            Output::Admission(admission) => admission,
            _ => unreachable!("an admission request yields an admission"),
        }
    }

    pub(crate) fn into_status(self) -> Vec<ServerStatus> {
        match self {
            Output::Status(status) => status,
            _ => unreachable!("a status request yields status"),
        }
    }

    pub(crate) fn into_prompts(self) -> Option<Vec<NamedPrompt>> {
        match self {
            Output::Prompts(named) => named,
            _ => unreachable!("a naming request yields names"),
        }
    }
}

/// Why an inline decision went to the policy thread.
#[derive(Debug)]
pub(crate) enum InlineMiss {
    /// It needed more than the inline fuel budget (which is smaller than the full one).
    OverBudget,
    /// The guest faulted: handled like any fault.
    Fault(PolicyError),
    /// A host function panicked under the guest (a blocking WASI call on a tokio worker).
    Panicked,
}
