//! The rings of one broker, one per (queue, group), with the broker-wide min_pop_wait gate,
//! the revisit ticker's arming, and what applies to every ring of a queue at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::rng::SeededRng;
use crate::types::Timestamp;

use super::{HotRing, RingBugs, DEFAULT_RESEED_INTERVAL_MS, DEFAULT_RESEED_PAGE};

/// Rings keyed by (queue, group), plus the broker-wide min_pop_wait gate.
#[derive(Debug)]
pub struct RingTable {
    rings: BTreeMap<(String, String), HotRing>,
    reseed_interval_ms: i64,
    reseed_page: u32,
    bugs: RingBugs,
    /// False on every broker where no queue ever configured minPopWaitTime: the default path
    /// pays one flag check instead of a per-queue lookup.
    pub min_pop_wait_in_use: bool,
    /// Bumped whenever rings are dropped or made stale (group reset, queue change, resync): a
    /// single-partition pop re-asks storage when it changes, since a dropped ring's epochs
    /// start again from zero.
    resets: u64,
    /// Shared with every ring: the earliest wheel time scheduled since the ticker armed.
    new_due: Arc<AtomicI64>,
    /// The wheel time the broker's ticker sleeps until.
    armed_at: Option<Timestamp>,
    /// The parent of every ring's walk jitter (brokers seed it apart, so theirs differ too).
    jitter: SeededRng,
    /// Each (queue, group)'s stored conflation policy as the last pop read it: the echo of an
    /// empty answer that never reached storage. Dropped with the group's rings (a deleted group
    /// may come back with the other policy).
    conflation_policies: BTreeMap<(String, String), bool>,
}

impl Default for RingTable {
    fn default() -> Self {
        Self::new(DEFAULT_RESEED_INTERVAL_MS, RingBugs::default())
    }
}

impl RingTable {
    pub fn new(reseed_interval_ms: i64, bugs: RingBugs) -> Self {
        RingTable {
            rings: BTreeMap::new(),
            reseed_interval_ms,
            reseed_page: DEFAULT_RESEED_PAGE,
            bugs,
            min_pop_wait_in_use: false,
            resets: 0,
            new_due: Arc::new(AtomicI64::new(i64::MAX)),
            armed_at: None,
            jitter: SeededRng::new(0),
            conflation_policies: BTreeMap::new(),
        }
    }

    /// Seeds the rings' walk jitter (a broker passes its own seed).
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter = SeededRng::new(seed);
        self
    }

    /// Names per reseed page (small pages make simulations walk many of them).
    pub fn with_reseed_page(mut self, names: u32) -> Self {
        assert!(names > 0, "a reseed page holds at least one name");
        self.reseed_page = names;
        self
    }

    pub fn ring(&mut self, queue: &str, group: &str) -> &mut HotRing {
        let (interval, bugs, sink) = (self.reseed_interval_ms, self.bugs, &self.new_due);
        let (jitter, page) = (&self.jitter, self.reseed_page);
        self.rings
            .entry((queue.to_string(), group.to_string()))
            .or_insert_with(|| {
                let rng = jitter.child(&format!("{queue}/{group}"));
                let mut ring = HotRing::with_due_sink(interval, bugs, sink.clone(), Some(rng));
                ring.reseed_page = page;
                ring
            })
    }

    /// Entries over every ring (partitions believed pending or held), for the ring's memory.
    pub fn entry_count(&self) -> usize {
        self.rings.values().map(|r| r.entries.len()).sum()
    }

    /// How many times rings were dropped or made stale.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Every ring reseeds at its next pop (events may have been missed).
    pub fn resync(&mut self) {
        self.resets += 1;
        for ring in self.rings.values_mut() {
            ring.resync();
        }
    }

    /// The broker's wheel ticker arms itself: the earliest revisit of any ring.
    pub fn arm_ticker(&mut self) -> Option<Timestamp> {
        self.new_due.store(i64::MAX, Ordering::Relaxed);
        self.armed_at = self.rings.values().filter_map(HotRing::next_revisit).min();
        self.armed_at
    }

    /// Whether a revisit earlier than the armed tick was scheduled since it armed.
    pub fn ticker_needs_rearm(&self) -> bool {
        let new_due = self.new_due.load(Ordering::Relaxed);
        new_due != i64::MAX && self.armed_at.is_none_or(|a| new_due < a.0)
    }

    /// The ticker fired: moves every due wheel entry to its ready queue and answers the queues
    /// that gained ready partitions (their gates open).
    pub fn advance_due(&mut self, now: Timestamp) -> Vec<String> {
        let mut queues: Vec<String> = vec![];
        for ((queue, _), ring) in &mut self.rings {
            if ring.next_revisit().is_some_and(|t| t <= now) {
                ring.advance(now);
                if queues.last() != Some(queue) {
                    queues.push(queue.clone());
                }
            }
        }
        queues
    }

    /// A push to (queue, partition): every group's ring of that queue learns it.
    pub fn note_push(&mut self, queue: &str, partition: &str, count: u64) {
        for ((q, _), ring) in self.rings.range_mut((queue.to_string(), String::new())..) {
            if q != queue {
                break;
            }
            ring.note_push(partition, count);
        }
    }

    pub fn note_freed(&mut self, queue: &str, group: &str, partition: &str, batch_committed: bool) {
        if let Some(r) = self.rings.get_mut(&(queue.to_string(), group.to_string())) {
            r.note_freed(partition, batch_committed);
        }
    }

    /// Drops a group's rings (on one queue, or on all): after a seek or a group deletion its
    /// beliefs are stale, and its next pop starts with first contact and a reseed.
    pub fn forget_group(&mut self, queue: Option<&str>, group: &str) {
        self.resets += 1;
        self.rings
            .retain(|(q, g), _| !(g == group && queue.is_none_or(|qq| qq == q)));
        self.conflation_policies
            .retain(|(q, g), _| !(g == group && queue.is_none_or(|qq| qq == q)));
    }

    /// The group's stored conflation policy, as a pop of this broker last read it.
    pub fn conflation_policy(&self, queue: &str, group: &str) -> Option<bool> {
        self.conflation_policies
            .get(&(queue.to_string(), group.to_string()))
            .copied()
    }

    pub fn note_conflation_policy(&mut self, queue: &str, group: &str, conflating: bool) {
        self.conflation_policies
            .insert((queue.to_string(), group.to_string()), conflating);
    }

    /// Drops every ring of a queue (queue deleted or reconfigured).
    pub fn forget_queue(&mut self, queue: &str) {
        self.resets += 1;
        self.rings.retain(|(q, _), _| q != queue);
        self.conflation_policies.retain(|(q, _), _| q != queue);
    }
}

impl RingTable {
    pub fn defer_all_groups(&mut self, queue: &str, partition: &str, until: Timestamp) {
        for ((q, _), ring) in self.rings.range_mut((queue.to_string(), String::new())..) {
            if q != queue {
                break;
            }
            ring.defer(partition, until);
        }
    }
}
