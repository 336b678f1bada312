//! The last good state and the inputs decided since: what a fresh instance is restored from
//! after a fault, and what a swap to another build of the same policy carries.

use crate::policy::PolicyError;
use crate::policy::instance::{HeldData, PolicyInstance};
use crate::policy::ledger::Ledger;

use super::input::Input;

/// What one input weighs in the journal besides the tool data it carries, in bytes of
/// snapshot. With the runtime's default `checkpoint_every` ([`DEFAULT_CHECKPOINT_EVERY`]), a
/// checkpoint is due once the journal weighs as much as the snapshot it follows (and holds at
/// least that many inputs). A checkpoint costs about as much as its snapshot is long, so each
/// input's share of that cost stays the same however many servers and tools the state holds (a
/// fixed count of inputs made every call pay for a snapshot of all of them), and the journal
/// stays within a small multiple of the state's size. A smaller `checkpoint_every` snapshots
/// proportionally sooner (1: after every input of a small state).
const INPUT_WEIGHT: usize = 32;

/// The runtime's default minimum of inputs between checkpoints: a small state's snapshot
/// (about 130 k instructions for one server's) then costs each input about 250 (a forwarded
/// call is two inputs); replaying this many after a fault (a few thousand instructions each)
/// takes a millisecond or two, and the journal holds about 100 KB.
pub(crate) const DEFAULT_CHECKPOINT_EVERY: usize = 512;

pub(crate) struct LastGood {
    /// The policy's state after the inputs before `journal`.
    pub(crate) snapshot: Vec<u8>,
    /// The tool data `snapshot` holds, per server: sizes the memory cap of an instance it is
    /// restored into (and removing a server afterwards releases its share).
    pub(crate) held: HeldData,
    /// The ledger as it was at `snapshot`: the journal is replayed on a copy of it.
    pub(crate) ledger: Ledger,
    /// The state-changing inputs decided since `snapshot`, in order.
    pub(crate) journal: Vec<Input>,
    /// What `journal` weighs (see [`INPUT_WEIGHT`]).
    weight: usize,
}

impl LastGood {
    /// The state a freshly initialized instance is in.
    pub(crate) fn new(snapshot: Vec<u8>) -> Self {
        Self {
            snapshot,
            held: HeldData::default(),
            ledger: Ledger::default(),
            journal: Vec::new(),
            weight: 0,
        }
    }

    /// Journals a state-changing input decided after the snapshot.
    pub(crate) fn push(&mut self, input: Input) {
        self.weight = self
            .weight
            .saturating_add(INPUT_WEIGHT)
            .saturating_add(input.tool_data());
        self.journal.push(input);
    }

    /// Whether a checkpoint is due: at least `every` inputs journaled, weighing at least
    /// `every / DEFAULT_CHECKPOINT_EVERY` times the snapshot.
    pub(crate) fn due(&self, every: usize) -> bool {
        self.journal.len() >= every
            && self.weight.saturating_mul(DEFAULT_CHECKPOINT_EVERY)
                >= self.snapshot.len().saturating_mul(every)
    }

    /// Forgets the journal (the state it led to is no longer restored from `snapshot`).
    pub(crate) fn clear_journal(&mut self) {
        self.journal.clear();
        self.weight = 0;
    }

    /// Moves the last good state up to `instance`'s, whose ledger is `ledger`.
    pub(crate) fn advance(
        &mut self,
        snapshot: Vec<u8>,
        instance: &PolicyInstance,
        ledger: &Ledger,
    ) {
        self.snapshot = snapshot;
        self.held = instance.held().clone();
        self.ledger = ledger.clone();
        self.clear_journal();
    }

    /// Restores the snapshot into `instance` and replays the journal since, on a copy of the
    /// ledger as it was then (the live ledger already holds what the journal's events say, and
    /// may have forgotten servers the journal still acts on).
    pub(crate) fn restore_into(&self, instance: &mut PolicyInstance) -> Result<(), PolicyError> {
        instance.restore_holding(&self.snapshot, self.held.clone())?;
        let mut ledger = self.ledger.clone();
        for input in &self.journal {
            input.decide_on(instance, &mut ledger)?;
        }
        Ok(())
    }
}
