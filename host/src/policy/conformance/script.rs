//! The scenario language: steps a host takes and predicates it checks, as data. The suite
//! (`suite.rs`) is written in it, `interpreter.rs` runs it here, and the JSON it
//! serializes to (`docs/CONFORMANCE.md`) is what other hosts run.

use serde::Serialize;

use super::wire;
use crate::policy::types::{CallOutcome, EventKind, Handover, Naming, ServerState};

/// Which promise a scenario checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// What any policy the host runs must do.
    Contract,
    /// What Tether promises its users; a policy may break it on purpose.
    Invariant,
}

/// One scenario: a named list of steps.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Its name (e.g. `tools-are-withdrawn-exactly-once`).
    pub name: &'static str,
    /// Which promise it checks.
    pub level: Level,
    /// What it checks, in a sentence.
    pub summary: &'static str,
    /// The contract version that added what it checks; a component without that version's
    /// functions passes it without running it (not applicable).
    pub since: Option<&'static str>,
    /// What the host does.
    pub steps: Vec<Step>,
}

/// One step; see `docs/CONFORMANCE.md` for what a host does for each.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "do", rename_all = "kebab-case")]
pub enum Step {
    /// Feed an event at the current time.
    Event {
        /// What happened.
        #[serde(serialize_with = "wire::with::event_kind")]
        kind: EventKind,
    },
    /// Fire the server's pending timer, moving time to it.
    FireTimer {
        /// The server.
        server: String,
        /// Skip the step when no timer is armed (otherwise that fails the scenario).
        optional: bool,
    },
    /// Move time forward.
    Advance {
        /// By how much.
        ms: u64,
    },
    /// Ask whether a call may be made, with the next call id.
    Admit {
        /// The server.
        server: String,
        /// The tool on it.
        tool: String,
        /// A name to refer to the call by later (`finish`).
        name: Option<String>,
    },
    /// Report a call finished.
    Finish {
        /// The server.
        server: String,
        /// The call by name; `None`: the latest admitted.
        call: Option<String>,
        /// How it ended.
        #[serde(serialize_with = "wire::with::call_outcome")]
        outcome: CallOutcome,
    },
    /// Admit a call and, when it may be made, finish it with `outcome`.
    Call {
        /// The server.
        server: String,
        /// The tool on it.
        tool: String,
        /// How it ends, if made.
        #[serde(serialize_with = "wire::with::call_outcome")]
        outcome: CallOutcome,
    },
    /// Ask for every server's status.
    Status,
    /// Move the state into a fresh instance by `snapshot` and `restore`: the status must not
    /// change, and the restored instance must answer `steps` as the original did.
    SnapshotRestore {
        /// Run on the original instance after the snapshot, then again on the restored one
        /// (the host's own state as at the snapshot): the transcripts must be equal.
        steps: Vec<Step>,
    },
    /// Hand a fresh instance another implementation's state.
    TakeOver {
        /// What the host hands over.
        #[serde(serialize_with = "wire::with::handover")]
        handover: Handover,
        /// The operator's naming of servers, given (contract 0.2.1) before the handover.
        namings: Option<Vec<Naming>>,
    },
    /// Tell the policy the operator's naming of a server (contract 0.2.1).
    SetNaming {
        /// The naming.
        naming: Naming,
    },
    /// Ask the policy to name a server's prompts (contract 0.2.1).
    NamePrompts {
        /// The server.
        server: String,
        /// The prompts' names on the server.
        originals: Vec<String>,
    },
    /// Run the steps, then again in a fresh instance (given only `init`; the host's own state
    /// as before the block): the transcripts must be equal. Meant for a scenario's start.
    Twice {
        /// The steps.
        steps: Vec<Step>,
    },
    /// Run the steps up to `times` times, until a `stop-if` holds.
    Repeat {
        /// At most this many times.
        times: u32,
        /// The steps.
        steps: Vec<Step>,
        /// When set, running all `times` is a failure with this message.
        #[serde(rename = "else")]
        otherwise: Option<String>,
    },
    /// Inside `repeat`: end the repetition when the predicate holds.
    StopIf {
        /// The predicate.
        that: Predicate,
    },
    /// Fail with the message unless the predicate holds.
    Expect {
        /// The predicate.
        that: Predicate,
        /// The failure's message.
        #[serde(rename = "else")]
        otherwise: String,
    },
}

/// A named check of the latest answers; see `docs/CONFORMANCE.md`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Predicate {
    /// The latest actions connect the server.
    Connects(String),
    /// The latest actions disconnect the server.
    Disconnects(String),
    /// The latest actions withdraw the server's tools exactly `times` times.
    Withdraws {
        /// The server.
        server: String,
        /// How many times.
        times: usize,
    },
    /// The latest actions publish the server's tools.
    Publishes(String),
    /// The server's last publication in the latest actions has exactly these original names.
    PublishesOriginals {
        /// The server.
        server: String,
        /// The original names, as a set.
        originals: Vec<String>,
    },
    /// The server's last publication's advertised names are usable and unique.
    PublishesUsableNames(String),
    /// The server's last publication in the latest actions is exactly these pairs of original
    /// and advertised names.
    PublishesAdvertised {
        /// The server.
        server: String,
        /// `[original, advertised]` pairs, as a set.
        names: Vec<(String, String)>,
    },
    /// The latest prompt names are exactly these pairs of original and advertised names.
    NamesPrompts(Vec<(String, String)>),
    /// A timer is armed for the server.
    TimerArmed(String),
    /// The server's timer is not in the past.
    TimerNotInThePast(String),
    /// The latest admission is this case.
    Admission(AdmissionCase),
    /// The latest admission refuses the call with a message naming the server.
    RefusedNaming(String),
    /// The latest status lists the server.
    Lists(String),
    /// The host holds a publication for the server (published and not withdrawn since).
    Published(String),
    /// The latest actions held a tool action about the server that the host absorbs, changing
    /// nothing: a withdrawal of nothing, or a publication identical to the one in force.
    Redundant(String),
    /// The host has an attempt to connect the server in flight.
    Attempting(String),
    /// The latest status has the server in one of these states.
    State {
        /// The server.
        server: String,
        /// The states.
        #[serde(rename = "in")]
        states: Vec<ServerState>,
    },
    /// The predicate does not hold.
    Not(Box<Predicate>),
}

/// The cases of an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdmissionCase {
    /// `allow`.
    Allow,
    /// `probe`.
    Probe,
    /// `reject`.
    Reject,
    /// `reconnect`.
    Reconnect,
    /// `hold`.
    Hold,
}
