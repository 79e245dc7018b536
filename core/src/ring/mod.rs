//! The hot-list ring: per (queue, group), the partitions this broker believes have pending data,
//! so a pop asks storage only about those.
//!
//! The ring may only ever err towards a false positive. A push bumps the partition's epoch; a
//! pop records the epoch when it takes a candidate, and an `Empty` verdict clears the entry only
//! if the epoch is unchanged. A push that raced the empty verdict therefore keeps the entry hot.

//!
//! `table.rs` holds the rings of a broker, one per (queue, group), and what applies to all of a
//! queue's rings at once; the tests are in `tests.rs`.

mod table;
#[cfg(test)]
mod tests;
mod wheel;

pub use table::RingTable;
use wheel::Wheel;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::rng::SeededRng;
use crate::storage::Verdict;
use crate::types::Timestamp;

/// Candidates per pop: clamp(partitions x 8, 16, 256).
pub fn candidate_count(partitions: u32) -> usize {
    (partitions as usize).saturating_mul(8).clamp(16, 256)
}

/// How often the ring is rebuilt from storage (the backstop for pushes made on other brokers).
/// Each ring's walk is jittered to 3/4..5/4 of it, so rings (and brokers) that started together
/// do not walk in lockstep.
pub const DEFAULT_RESEED_INTERVAL_MS: i64 = 30_000;
/// Names fetched per reseed page. A walk over a large queue goes a page at a time (keyset on the
/// partition name), so no single reseed scans every partition. A walk with pages left fetches
/// the next one when fewer than a quarter page of partitions are ready: the ring learns the rest
/// of a large backlog as it drains what it knows, not an interval later.
pub const DEFAULT_RESEED_PAGE: u32 = 4096;
/// How long the cached windowBuffer/delayedProcessing config stays fresh.
pub const DEFAULT_CONFIG_TTL_MS: i64 = 10_000;
/// A `Busy` candidate (row locked by a concurrent pop) is revisited after this long.
pub const BUSY_REVISIT_MS: i64 = 20;

/// What a verdict's look at storage knew of the ring when it was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    /// The ring handed the partition out at this epoch.
    HandedOut(u64),
    /// Issued when the ring's epoch clock read this, without taking the partition.
    IssuedAt(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryState {
    /// In the ready queue.
    Ready,
    /// Handed to a pop whose verdict is outstanding; `taken_epoch` is the epoch at hand-out.
    InFlight { taken_epoch: u64 },
    /// Parked on the revisit wheel until then (leased elsewhere, or deferred).
    Waiting { until: Timestamp },
    /// Believed empty.
    Idle,
}

#[derive(Clone, Debug)]
struct Entry {
    epoch: u64,
    state: EntryState,
    /// Messages pushed since the partition was last found empty (an estimate for min_pop_wait).
    pending_hint: u64,
    /// The epoch at which a pop of this broker leased the partition's whole visible backlog
    /// (a `took_all` verdict with no push since it read): while the epoch is unchanged, a
    /// release that commits that batch leaves nothing to deliver.
    drained_lease_epoch: Option<u64>,
}

/// Switches that re-introduce historical bugs, for proving the simulation suite catches them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingBugs {
    /// Clear an entry on an `Empty` (or drained autoAck `Took`) verdict without comparing epochs.
    pub clear_without_epoch_check: bool,
    /// A leased, deferred or busy verdict is put on the wheel even when the partition was
    /// pushed to or released while the verdict was in flight (its snapshot predates the event).
    pub held_verdict_without_epoch_check: bool,
    /// A reseed or a resync leaves partitions the ring believes leased or deferred on the wheel,
    /// even when storage says they are claimable now (a release this broker never heard of).
    pub reseed_keeps_waiting: bool,
    /// A reseed walk ends after its first page, however full (partitions past it wait for the
    /// next walk, an interval later).
    pub walk_stops_after_first_page: bool,
    /// A release that committed a drained lease's batch forgets the partition even when a push
    /// landed during the lease (its messages wait for the next reseed walk).
    pub committed_release_forgets_pushes: bool,
    /// A verdict from a look without a hand-out (a wildcard or single-partition pop) about a
    /// partition the ring dropped while it was in flight is trusted as current: a stale
    /// `LeasedUntil` parks the partition until a lease long released, and pushes do not free it.
    pub stale_look_trusts_a_dropped_entry: bool,
    /// A committed release of a partition the ring does not hold is ignored outright: a look
    /// in flight for it checks in its verdict (leased, read before the ack) as current, and a
    /// single-partition pop woken by the release finds nothing changed and waits out the lease.
    pub committed_release_of_unknown_ignored: bool,
}

#[derive(Clone, Debug)]
pub struct HotRing {
    entries: BTreeMap<String, Entry>,
    ready: VecDeque<String>,
    /// Partitions parked until a time; those parked for a lease to end are marked, since a
    /// release on another broker ends the lease sooner and this ring hears of that only by
    /// the release's notification.
    wheel: Wheel,
    /// The first-ever pop of (queue, group) has gone through the wildcard path.
    first_contact_done: bool,
    next_reseed_at: Option<Timestamp>,
    /// The last name of the walk's previous page, when that page came back full.
    walk_after: Option<String>,
    /// A page of the walk has been asked for and not applied yet.
    page_in_flight: bool,
    reseed_page: u32,
    reseed_interval_ms: i64,
    /// Draws each walk's jitter (`None`: walks exactly an interval apart).
    jitter: Option<SeededRng>,
    /// Epochs come from one counter per ring, so an entry trimmed when found empty and made
    /// again later never repeats an epoch a pop saw before.
    epoch_clock: u64,
    /// The clock when an entry was last dropped: a look issued before it may be about a
    /// partition whose events went with its entry.
    dropped_at: u64,
    bugs: RingBugs,
    /// The earliest wheel time scheduled since the broker's ticker last armed (shared by every
    /// ring of a table; `i64::MAX` when none).
    new_due: Arc<AtomicI64>,
}

/// A candidate handed to a pop, with the epoch to present at check-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub partition: String,
    pub epoch: u64,
}

impl Default for HotRing {
    fn default() -> Self {
        Self::new(DEFAULT_RESEED_INTERVAL_MS, RingBugs::default())
    }
}

impl HotRing {
    pub fn new(reseed_interval_ms: i64, bugs: RingBugs) -> Self {
        Self::with_due_sink(
            reseed_interval_ms,
            bugs,
            Arc::new(AtomicI64::new(i64::MAX)),
            None,
        )
    }

    fn with_due_sink(
        reseed_interval_ms: i64,
        bugs: RingBugs,
        new_due: Arc<AtomicI64>,
        jitter: Option<SeededRng>,
    ) -> Self {
        HotRing {
            entries: BTreeMap::new(),
            ready: VecDeque::new(),
            wheel: Wheel::default(),
            first_contact_done: false,
            next_reseed_at: None,
            walk_after: None,
            page_in_flight: false,
            reseed_page: DEFAULT_RESEED_PAGE,
            reseed_interval_ms,
            jitter,
            epoch_clock: 0,
            dropped_at: 0,
            bugs,
            new_due,
        }
    }

    pub fn first_contact_done(&self) -> bool {
        self.first_contact_done
    }

    pub fn mark_first_contact_done(&mut self) {
        self.first_contact_done = true;
    }

    /// A new walk is due (an interval since the last began, or a resync), or the walk under way
    /// has pages left and the ring is running low.
    pub fn reseed_due(&self, now: Timestamp) -> bool {
        self.walk_due(now)
            || (self.walk_after.is_some()
                && !self.page_in_flight
                && self.ready.len() < (self.reseed_page as usize / 4).max(1))
    }

    /// Names per reseed page.
    pub fn reseed_page(&self) -> u32 {
        self.reseed_page
    }

    fn walk_due(&self, now: Timestamp) -> bool {
        self.next_reseed_at.is_none_or(|t| t <= now)
    }

    fn walk_interval_ms(&mut self) -> i64 {
        let base = self.reseed_interval_ms;
        match &mut self.jitter {
            Some(rng) => base * 3 / 4 + rng.below((base / 2).max(1) as u64) as i64,
            None => base,
        }
    }

    /// A fresh epoch for `partition` (an event the pop holding it must not miss).
    fn bump(&mut self, partition: &str) -> &mut Entry {
        self.epoch_clock += 1;
        let epoch = self.epoch_clock;
        let e = self.entry(partition);
        e.epoch = epoch;
        e
    }

    fn make_ready(&mut self, partition: &str) {
        if let Some(e) = self.entries.get_mut(partition) {
            if let EntryState::Waiting { until } = e.state {
                self.wheel.remove(until, partition);
            }
            if e.state != EntryState::Ready {
                e.state = EntryState::Ready;
                self.ready.push_back(partition.to_string());
            }
        }
    }

    /// Drops the partition's entry, and its wheel slot if it waits on one.
    fn forget(&mut self, partition: &str) {
        if let Some(Entry { state, .. }) = self.entries.remove(partition) {
            self.note_dropped();
            if let EntryState::Waiting { until } = state {
                self.wheel.remove(until, partition);
            }
        }
    }

    fn note_dropped(&mut self) {
        self.epoch_clock += 1;
        self.dropped_at = self.epoch_clock;
    }

    /// The ring's epoch clock: a pop that reads storage without a hand-out (wildcard, single
    /// partition) notes it when issued and checks its verdicts in against it.
    pub fn clock(&self) -> u64 {
        self.epoch_clock
    }

    fn entry(&mut self, partition: &str) -> &mut Entry {
        self.entries.entry(partition.to_string()).or_insert(Entry {
            epoch: 0,
            state: EntryState::Idle,
            pending_hint: 0,
            drained_lease_epoch: None,
        })
    }

    /// A local push (or a peer's hint) of `count` messages into `partition`.
    pub fn note_push(&mut self, partition: &str, count: u64) {
        let e = self.bump(partition);
        e.pending_hint = e.pending_hint.saturating_add(count);
        // A leased or deferred partition stays on the wheel; an in-flight one keeps its bumped
        // epoch so its pending verdict cannot clear it.
        if e.state == EntryState::Idle {
            self.make_ready(partition);
        }
    }

    /// An ack freed the partition's lease: it may have more to deliver, unless the ack committed
    /// the batch of a lease that took everything the partition held and nothing was pushed
    /// since (the push would have bumped the epoch). Then the partition is believed empty, as
    /// after an `Empty` verdict, without a pop asking storage to find it so. A committed release
    /// of a partition the ring does not hold adds no entry (the ring believes it empty, and
    /// pushes since would have entered it), but it is noted as a drop: a look without a hand-out
    /// may be in flight for that partition (a single-partition pop's, a first contact's), and
    /// its verdict, read before the release, must not park the partition until the old lease's
    /// expiry.
    pub fn note_freed(&mut self, partition: &str, batch_committed: bool) {
        if batch_committed {
            let ignore_pushes = self.bugs.committed_release_forgets_pushes;
            match self.entries.get(partition) {
                None if self.bugs.committed_release_of_unknown_ignored => return,
                None => {
                    self.note_dropped();
                    return;
                }
                Some(e)
                    if matches!(e.state, EntryState::Waiting { .. })
                        && e.drained_lease_epoch
                            .is_some_and(|d| d == e.epoch || ignore_pushes) =>
                {
                    self.forget(partition);
                    return;
                }
                Some(_) => {}
            }
        }
        let e = self.bump(partition);
        if matches!(e.state, EntryState::Idle | EntryState::Waiting { .. }) {
            self.make_ready(partition);
        }
    }

    /// A reseed page is issued; answers the name it starts after (`None`: a new walk from the
    /// first name). A new walk's successor is due an interval from now.
    pub fn mark_reseed_started(&mut self, now: Timestamp) -> Option<String> {
        if self.walk_due(now) {
            self.walk_after = None;
            let interval = self.walk_interval_ms();
            self.next_reseed_at = Some(now.plus_millis(interval));
        }
        self.page_in_flight = true;
        self.walk_after.clone()
    }

    /// The page asked for failed: the walk asks again when it is next due (the backoff
    /// re-checks and pushes keep the ring live meanwhile).
    pub fn reseed_failed(&mut self) {
        self.page_in_flight = false;
    }

    /// Replaces beliefs with a storage snapshot of partitions with pending data (claimable now,
    /// or leased: a lease this broker did not grant is learnt by trying the partition). A
    /// partition believed leased or deferred is tried again too: its release may have happened
    /// on another broker whose notification was lost, and storage's verdict puts it back on the
    /// wheel if it really is held.
    /// `page_full`: the page came back at its limit (`reseed_page`), so the walk has more to read
    /// after its last name.
    pub fn apply_reseed(&mut self, pending: &[String], page_full: bool, now: Timestamp) {
        let keep_waiting = self.bugs.reseed_keeps_waiting;
        for p in pending {
            let e = self.bump(p);
            e.pending_hint = e.pending_hint.max(1);
            let stale = match e.state {
                EntryState::Idle => true,
                EntryState::Waiting { .. } => !keep_waiting,
                EntryState::Ready | EntryState::InFlight { .. } => false,
            };
            if stale {
                self.make_ready(p);
            }
        }
        self.page_in_flight = false;
        self.walk_after = if page_full && !self.bugs.walk_stops_after_first_page {
            pending.last().cloned()
        } else {
            None
        };
        if self.walk_after.is_none() {
            let interval = self.walk_interval_ms();
            self.next_reseed_at = Some(now.plus_millis(interval));
        }
    }

    /// Events may have been missed: the next pop reseeds, and every partition believed leased
    /// or deferred is tried again. A lease whose release was missed would otherwise hold the
    /// partition until its old expiry even after the reseed, when the partition had no backlog
    /// at the reseed (it is not listed) and pushes came later (a push never un-leases).
    pub fn resync(&mut self) {
        self.next_reseed_at = None;
        if self.bugs.reseed_keeps_waiting {
            return;
        }
        for p in self.wheel.names() {
            self.make_ready(&p);
        }
    }

    /// Moves wheel entries that are due into the ready queue.
    pub fn advance(&mut self, now: Timestamp) {
        while let Some((t, p)) = self.wheel.pop_due(now) {
            if let Some(e) = self.entries.get_mut(&p) {
                if e.state == (EntryState::Waiting { until: t }) {
                    e.state = EntryState::Ready;
                    self.ready.push_back(p);
                }
            }
        }
    }

    pub fn has_ready(&mut self, now: Timestamp) -> bool {
        self.advance(now);
        !self.ready.is_empty()
    }

    /// How many partitions are ready to hand out, for the pop autopilot's width (the list may
    /// still hold a name a verdict since took out: it errs high by those).
    pub fn ready_count(&mut self, now: Timestamp) -> usize {
        self.advance(now);
        self.ready.len()
    }

    /// A pop that will not wait is about to answer "nothing" from this ring: up to `k` of the
    /// partitions it believes leased (soonest lease end first) are offered to it again, so
    /// that storage, not a notification still on its way, says whether their leases ended. A
    /// client that acks through one broker and at once pops through another sees its release.
    /// Answers whether any was offered. Each one's verdict puts it back on the wheel if its
    /// lease still holds.
    pub fn offer_held_leases(&mut self, k: usize) -> bool {
        let held: Vec<String> = self
            .wheel
            .lease_held()
            .filter(|(t, p)| {
                self.entries
                    .get(p)
                    .is_some_and(|e| e.state == (EntryState::Waiting { until: *t }))
            })
            .take(k)
            .map(|(_, p)| p.clone())
            .collect();
        for p in &held {
            self.make_ready(p);
        }
        !held.is_empty()
    }

    /// Whether a pop of this ring has something to do now: the group's first contact, a reseed
    /// page, or a ready partition. A parked pop looks at storage only then, and a wake goes to
    /// a parked pop only then.
    pub fn has_work(&mut self, now: Timestamp) -> bool {
        !self.first_contact_done || self.reseed_due(now) || self.has_ready(now)
    }

    /// Sum of pending hints over ready partitions (for the min_pop_wait hold).
    pub fn pending_hint(&mut self, now: Timestamp) -> u64 {
        self.advance(now);
        self.ready
            .iter()
            .filter_map(|p| self.entries.get(p))
            .map(|e| e.pending_hint)
            .sum()
    }

    /// The earliest wheel revisit, for the driver's wake tick.
    pub fn next_revisit(&self) -> Option<Timestamp> {
        self.wheel.first().map(|(t, _)| *t)
    }

    /// One pop's candidates: `candidate_count`, but at most half of what is ready (never fewer
    /// than the partitions it may claim), so concurrent pops on a small ring each get some. A
    /// pop holds its candidates while its call is in flight: taking all ten of a ten-partition
    /// ring serialized four leased consumers behind one another.
    pub fn take_share(&mut self, partitions: u32, now: Timestamp) -> Vec<Candidate> {
        self.advance(now);
        let share = (self.ready.len() / 2).max(partitions as usize);
        self.take_ready(candidate_count(partitions).min(share))
    }

    /// Hands out up to `k` ready candidates in round-robin order.
    pub fn take_candidates(&mut self, k: usize, now: Timestamp) -> Vec<Candidate> {
        self.advance(now);
        self.take_ready(k)
    }

    /// Up to `k` of the ready list, in order (the wheel already advanced).
    fn take_ready(&mut self, k: usize) -> Vec<Candidate> {
        let mut out = Vec::with_capacity(k.min(self.ready.len()));
        while out.len() < k {
            let Some(p) = self.ready.pop_front() else {
                break;
            };
            if let Some(e) = self.entries.get_mut(&p) {
                if e.state == EntryState::Ready {
                    e.state = EntryState::InFlight {
                        taken_epoch: e.epoch,
                    };
                    out.push(Candidate {
                        partition: p,
                        epoch: e.epoch,
                    });
                }
            }
        }
        out
    }

    fn set_state(&mut self, partition: &str, state: EntryState) {
        if let Some(e) = self.entries.get_mut(partition) {
            e.state = state;
        }
    }

    fn wait_until(&mut self, partition: &str, until: Timestamp) {
        self.wait_on_wheel(partition, until, false);
    }

    /// Parks the partition until a lease ends (`lease_held`), or for another hold.
    fn wait_on_wheel(&mut self, partition: &str, until: Timestamp, lease_held: bool) {
        if let Some(e) = self.entries.get_mut(partition) {
            e.state = EntryState::Waiting { until };
            self.wheel.insert(until, partition, lease_held);
            self.new_due.fetch_min(until.0, Ordering::Relaxed);
        }
    }

    /// Checks a storage verdict back in. `taken_epoch` is what `take_candidates` returned, or
    /// `None` for a partition the ring did not hand out, from a look issued at an unknown time
    /// (then any event the ring knows of counts as after it).
    pub fn check_in(
        &mut self,
        partition: &str,
        verdict: Verdict,
        taken_epoch: Option<u64>,
        now: Timestamp,
    ) {
        let look = match taken_epoch {
            Some(t) => Look::HandedOut(t),
            None => Look::IssuedAt(0),
        };
        self.check_in_look(partition, verdict, look, now);
    }

    /// Checks in a verdict of a look that did not take the partition from the ring (a wildcard
    /// or single-partition pop), issued when the ring's `clock` read `issued_at`.
    pub fn check_in_issued(
        &mut self,
        partition: &str,
        verdict: Verdict,
        issued_at: u64,
        now: Timestamp,
    ) {
        self.check_in_look(partition, verdict, Look::IssuedAt(issued_at), now);
    }

    fn check_in_look(&mut self, partition: &str, verdict: Verdict, look: Look, now: Timestamp) {
        if verdict == Verdict::Missing {
            self.forget(partition);
            return;
        }
        let known = self.entries.contains_key(partition);
        let dropped_since = match look {
            Look::IssuedAt(c) => {
                !known && self.dropped_at > c && !self.bugs.stale_look_trusts_a_dropped_entry
            }
            Look::HandedOut(_) => false,
        };
        // An entry made from a look that events may have overtaken takes a fresh epoch: it
        // stands for those events, so a single-partition pop that saw the old one looks again.
        let e = if dropped_since {
            self.bump(partition)
        } else {
            self.entry(partition)
        };
        e.drained_lease_epoch = None;
        let state = e.state;
        let epoch = e.epoch;
        if state == EntryState::Ready {
            // Still queued from a push after hand-out; the ready slot stays authoritative.
            return;
        }
        if let EntryState::Waiting { until } = state {
            self.wheel.remove(until, partition);
            self.set_state(partition, EntryState::Idle);
        }
        // Whether a push or a release may have landed after storage's snapshot. Without a
        // hand-out, an entry held or bumped since the look was issued says so; so does an entry
        // dropped since, whose events went with it (else a verdict of the look, read before
        // the ack that emptied the partition, would park it until a lease long released).
        let pushed_since = match look {
            Look::HandedOut(t) => t != epoch,
            Look::IssuedAt(c) if known => state != EntryState::Idle || epoch > c,
            Look::IssuedAt(_) => dropped_since,
        };
        match verdict {
            Verdict::Took {
                count,
                leased_until,
                drained,
            } => {
                if let Some(e) = self.entries.get_mut(partition) {
                    e.pending_hint = e.pending_hint.saturating_sub(u64::from(count));
                }
                match leased_until {
                    Some(t) => {
                        self.wait_on_wheel(partition, t.just_after(), true);
                        if drained && !pushed_since {
                            if let Some(e) = self.entries.get_mut(partition) {
                                e.drained_lease_epoch = Some(epoch);
                            }
                        }
                    }
                    // Drained by an autoAck batch: offering it again would only find it empty.
                    None if drained => self.forget_unless_pushed(partition, pushed_since),
                    None => self.make_ready(partition),
                }
            }
            Verdict::Empty => self.forget_unless_pushed(partition, pushed_since),
            Verdict::LeasedUntil(_) | Verdict::DeferredUntil(_) | Verdict::Busy => {
                if pushed_since && !self.bugs.held_verdict_without_epoch_check {
                    // A push or a release landed after storage's snapshot: the hold may be over
                    // already. Ask again rather than wait out a lease that may be gone.
                    self.make_ready(partition);
                } else if let Some(at) = verdict.revisit_at(now) {
                    let lease_held = matches!(verdict, Verdict::LeasedUntil(_));
                    self.wait_on_wheel(partition, at, lease_held);
                }
            }
            Verdict::NotEvaluated => self.make_ready(partition),
            Verdict::Missing => {}
        }
    }

    /// A partition believed empty leaves the ring, so the ring holds only partitions with
    /// something pending or held (its memory follows the backlog, not the partitions ever seen);
    /// unless a push landed after the verdict's snapshot. The epoch clock keeps a re-made entry
    /// distinct.
    fn forget_unless_pushed(&mut self, partition: &str, pushed_since: bool) {
        if pushed_since && !self.bugs.clear_without_epoch_check {
            self.make_ready(partition);
        } else if self.entries.remove(partition).is_some() {
            self.note_dropped();
        }
    }

    pub fn is_ready(&self, partition: &str) -> bool {
        self.entries
            .get(partition)
            .is_some_and(|e| e.state == EntryState::Ready)
    }

    pub fn is_ready_or_waiting(&self, partition: &str) -> bool {
        self.entries
            .get(partition)
            .is_some_and(|e| !matches!(e.state, EntryState::Idle))
    }

    pub fn epoch(&self, partition: &str) -> u64 {
        self.entries.get(partition).map_or(0, |e| e.epoch)
    }
}

impl HotRing {
    /// Holds a partition on the wheel until `until` (windowBuffer), unless it is in flight.
    pub fn defer(&mut self, partition: &str, until: Timestamp) {
        let Some(e) = self.entries.get_mut(partition) else {
            return;
        };
        match e.state {
            EntryState::InFlight { .. } => {}
            EntryState::Waiting { until: old } if old >= until => {}
            EntryState::Waiting { until: old } => {
                self.wheel.remove(old, partition);
                self.wait_until(partition, until);
            }
            EntryState::Ready => {
                self.ready.retain(|p| p != partition);
                self.wait_until(partition, until);
            }
            EntryState::Idle => self.wait_until(partition, until),
        }
    }
}
