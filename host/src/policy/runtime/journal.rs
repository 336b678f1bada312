//! The last good state and the inputs decided since: what a fresh instance is restored from
//! after a fault, and what a swap to another build of the same policy carries.

use crate::policy::PolicyError;
use crate::policy::instance::{HeldData, PolicyInstance};
use crate::policy::ledger::Ledger;

use super::input::Input;

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
}

impl LastGood {
    /// The state a freshly initialized instance is in.
    pub(crate) fn new(snapshot: Vec<u8>) -> Self {
        Self {
            snapshot,
            held: HeldData::default(),
            ledger: Ledger::default(),
            journal: Vec::new(),
        }
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
        self.journal.clear();
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
