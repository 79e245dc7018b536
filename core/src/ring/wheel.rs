//! The ring's revisit wheel: partitions parked until a time, in time order, with those parked
//! for a lease to end also kept in a set of their own. A pop that does not wait offers the
//! soonest of those again, and must not walk every deferred or busy slot to find them.

use std::collections::BTreeSet;

use crate::types::Timestamp;

#[derive(Clone, Debug, Default)]
pub(super) struct Wheel {
    /// Every parked partition, by revisit time.
    slots: BTreeSet<(Timestamp, String)>,
    /// The subset of `slots` parked until a lease ends (not a delay or a hold).
    lease_held: BTreeSet<(Timestamp, String)>,
}

impl Wheel {
    pub(super) fn insert(&mut self, until: Timestamp, partition: &str, lease_held: bool) {
        self.slots.insert((until, partition.to_string()));
        if lease_held {
            self.lease_held.insert((until, partition.to_string()));
        }
    }

    pub(super) fn remove(&mut self, until: Timestamp, partition: &str) {
        let slot = (until, partition.to_string());
        self.slots.remove(&slot);
        self.lease_held.remove(&slot);
    }

    /// The earliest slot.
    pub(super) fn first(&self) -> Option<&(Timestamp, String)> {
        self.slots.first()
    }

    /// Takes the earliest slot if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: Timestamp) -> Option<(Timestamp, String)> {
        let (t, _) = self.slots.first()?;
        if *t > now {
            return None;
        }
        let slot = self.slots.pop_first()?;
        self.lease_held.remove(&slot);
        Some(slot)
    }

    /// Every parked partition's name, soonest first.
    pub(super) fn names(&self) -> Vec<String> {
        self.slots.iter().map(|(_, p)| p.clone()).collect()
    }

    /// The slots parked for a lease to end, soonest lease end first.
    pub(super) fn lease_held(&self) -> impl Iterator<Item = &(Timestamp, String)> {
        self.lease_held.iter()
    }

    #[cfg(test)]
    pub(super) fn lease_held_len(&self) -> usize {
        self.lease_held.len()
    }
}
