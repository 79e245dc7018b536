//! One ephemeral queue: its rings per partition, each group's cursors and leases, and the
//! eviction its bounds call for.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{Cursor, Dropped, EphemeralBugs, EphemeralOptions, Group, Queue, Ring};
use crate::types::Timestamp;

impl Queue {
    pub(super) fn new(options: EphemeralOptions, generation: u64) -> Queue {
        Queue {
            options,
            generation,
            rings: vec![],
            by_name: BTreeMap::new(),
            fronts: BTreeSet::new(),
            next_order: 0,
            length: 0,
            bytes: 0,
            groups: BTreeMap::new(),
            dropped: Dropped::default(),
            pushed: 0,
            delivered: 0,
            completed: 0,
            next_lease_end: None,
        }
    }

    pub(super) fn ring_of(&mut self, partition: &str) -> usize {
        if let Some(i) = self.by_name.get(partition) {
            return *i;
        }
        self.rings.push(Ring {
            name: partition.to_string(),
            base: 0,
            messages: VecDeque::new(),
        });
        let i = self.rings.len() - 1;
        self.by_name.insert(partition.to_string(), i);
        i
    }

    /// Removes the front message of a ring (counted by the caller's cause); groups' state below
    /// the new base is forgotten, so an ack of it answers `unknown`.
    pub(super) fn drop_front(&mut self, ring: usize) -> u64 {
        let r = &mut self.rings[ring];
        let Some(m) = r.messages.pop_front() else {
            return 0;
        };
        let gone = r.base;
        r.base += 1;
        self.fronts.remove(&(m.order, ring));
        if let Some(next) = r.messages.front() {
            self.fronts.insert((next.order, ring));
        }
        let bytes = m.payload.len() as u64;
        self.length -= 1;
        self.bytes -= bytes;
        for g in self.groups.values_mut() {
            if let Some(c) = g.cursors.get_mut(ring) {
                c.next = c.next.max(gone + 1);
                c.retry.remove(&gone);
                if let Some(l) = c.lease.as_mut() {
                    l.open.remove(&gone);
                    if l.open.is_empty() {
                        c.lease = None;
                    }
                }
            }
        }
        bytes
    }

    /// Drops the messages every group has completed from the fronts of `ring` (only when some
    /// group exists: with none, what is pushed waits for the first).
    pub(super) fn trim(&mut self, ring: usize) -> u64 {
        if self.groups.is_empty() {
            return 0;
        }
        let low = self
            .groups
            .values()
            .map(|g| {
                g.cursors
                    .get(ring)
                    .map_or(self.rings[ring].base, Cursor::low)
            })
            .min()
            .unwrap_or(0);
        let mut freed = 0;
        while self.rings[ring].base < low && !self.rings[ring].messages.is_empty() {
            freed += self.drop_front(ring);
        }
        freed
    }

    /// Drops messages older than the TTL from every ring's front.
    pub(super) fn expire(&mut self, now: Timestamp) -> u64 {
        let Some(ttl) = self.options.ttl_ms else {
            return 0;
        };
        let cutoff = now.0.saturating_sub(ttl.saturating_mul(1000) as i64);
        let mut freed = 0;
        for ring in 0..self.rings.len() {
            while self.rings[ring]
                .messages
                .front()
                .is_some_and(|m| m.pushed_at.0 <= cutoff)
            {
                freed += self.drop_front(ring);
                self.dropped.expired += 1;
            }
        }
        freed
    }

    /// Ends the leases that ran out: their open deliveries wait for redelivery, or are dropped at
    /// `retryLimit`.
    pub(super) fn end_leases(&mut self, now: Timestamp, bugs: EphemeralBugs) -> u64 {
        match self.next_lease_end {
            Some(t) if t <= now => {}
            _ => return 0,
        }
        let limit = self.options.retry_limit;
        let mut over: Vec<(usize, u64)> = vec![];
        let mut next_end: Option<Timestamp> = None;
        for g in self.groups.values_mut() {
            for (ring, c) in g.cursors.iter_mut().enumerate() {
                let Some(lease) = c.lease.take() else {
                    continue;
                };
                if lease.until > now {
                    next_end = Some(next_end.map_or(lease.until, |t| t.min(lease.until)));
                    c.lease = Some(lease);
                    continue;
                }
                if bugs.lease_expiry_rewinds {
                    if let Some((&first, _)) = lease.open.first_key_value() {
                        c.next = c.next.min(first);
                    }
                    continue;
                }
                for (seq, attempt) in lease.open {
                    if attempt > limit {
                        over.push((ring, seq));
                    } else {
                        c.retry.insert(seq, attempt);
                    }
                }
            }
        }
        self.next_lease_end = next_end;
        self.dropped.retry_limit += over.len() as u64;
        let mut freed = 0;
        for ring in over.iter().map(|(r, _)| *r).collect::<BTreeSet<_>>() {
            freed += self.trim(ring);
        }
        freed
    }

    pub(super) fn note_lease(&mut self, until: Timestamp) {
        self.next_lease_end = Some(self.next_lease_end.map_or(until, |t| t.min(until)));
    }

    /// Whether a group has anything to deliver in a ring now (its partition not leased).
    pub(super) fn has_work(&self, group: Option<&Group>, ring: usize) -> bool {
        let r = &self.rings[ring];
        match group.and_then(|g| g.cursors.get(ring)) {
            None => !r.messages.is_empty(),
            Some(c) => c.lease.is_none() && (!c.retry.is_empty() || c.next < r.end()),
        }
    }

    pub(super) fn available(&self, group: Option<&Group>, ring: usize) -> u64 {
        let r = &self.rings[ring];
        match group.and_then(|g| g.cursors.get(ring)) {
            None => r.messages.len() as u64,
            Some(c) if c.lease.is_some() => 0,
            Some(c) => c.retry.len() as u64 + r.end().saturating_sub(c.next.max(r.base)),
        }
    }
}

/// Drops a queue's oldest messages (any partition) until `fits`; answers the bytes freed.
pub(super) fn evict_until(q: &mut Queue, fits: impl Fn(&Queue) -> bool) -> u64 {
    let mut freed = 0;
    while !fits(q) {
        let Some(&(_, ring)) = q.fronts.first() else {
            break;
        };
        freed += q.drop_front(ring);
        q.dropped.evicted += 1;
    }
    freed
}
