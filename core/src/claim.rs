//! The claim semantics of `log_pop_v2`, as plain functions. The in-memory model calls these
//! directly and the SQL procedures mirror them statement by statement; the conformance suite
//! holds the two to the same answers.

use crate::params::{SubscriptionFrom, SubscriptionMode};
use crate::types::{Offset, Timestamp, WorkerId, QUEUE_MODE_GROUP};

/// The cursor row of one (partition, consumer group): `queen.log_consumers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorRow {
    /// Last consumed offset; -1 = nothing consumed.
    pub committed: Offset,
    pub worker_id: Option<WorkerId>,
    pub lease_expires_at: Option<Timestamp>,
    pub lease_acquired_at: Option<Timestamp>,
    /// Last offset of the leased span (committed, batch_end].
    pub batch_end: Option<Offset>,
    /// Delivery attempts of the batch starting at `attempt_offset` (telemetry only).
    pub attempt_count: u32,
    pub attempt_offset: Option<Offset>,
    pub total_consumed: i64,
    /// Per-message retry budget: failed acks charged to the message at `retry_offset`.
    pub retry_offset: Option<Offset>,
    pub retry_count: u32,
}

impl CursorRow {
    pub fn seeded(committed: Offset) -> Self {
        CursorRow {
            committed,
            worker_id: None,
            lease_expires_at: None,
            lease_acquired_at: None,
            batch_end: None,
            attempt_count: 0,
            attempt_offset: None,
            total_consumed: 0,
            retry_offset: None,
            retry_count: 0,
        }
    }

    /// The lease filter of the claim: no worker, no expiry, or an expired lease.
    pub fn claimable(&self, now: Timestamp) -> bool {
        match (self.worker_id, self.lease_expires_at) {
            (None, _) | (_, None) => true,
            (Some(_), Some(exp)) => exp < now,
        }
    }

    /// Moves the cursor forward to `to` (never back), counting what it passes; a pending retry
    /// count for an offset it passes is over.
    pub fn commit_through(&mut self, to: Offset) {
        if to > self.committed {
            self.total_consumed += to - self.committed;
            self.committed = to;
            if self.retry_offset.is_some_and(|r| r <= to) {
                self.retry_offset = None;
                self.retry_count = 0;
            }
        }
    }

    /// Ends the lease and the batch it covered.
    pub fn end_lease(&mut self) {
        self.worker_id = None;
        self.lease_expires_at = None;
        self.lease_acquired_at = None;
        self.batch_end = None;
    }

    /// The live lease's expiry, if a lease is held at `now`.
    pub fn live_lease_until(&self, now: Timestamp) -> Option<Timestamp> {
        if self.claimable(now) {
            None
        } else {
            self.lease_expires_at
        }
    }
}

/// What a pop carries about where a never-seen group should start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SubscriptionIntent {
    pub mode: SubscriptionMode,
    pub from: SubscriptionFrom,
}

/// The durable subscription record of (group, queue) in `consumer_groups_metadata`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriptionRecord {
    /// `None`: from the beginning.
    pub subscription_timestamp: Option<Timestamp>,
}

/// A group's first contact seeds every cursor of a queue of at most this many partitions at once
/// (`log_pop_wildcard_v2` says the same), and none of a larger queue: there each cursor is made at
/// its first claim, by the same rule, under try-locks that never wait. Small queues are where many
/// fresh consumers collide on few partitions (lazy creation convoyed there); on a large one their
/// random windows rarely meet, and each seeded row cost the first pop 20-40 us (cursor rule,
/// foreign-key check, two index entries; cold pages): 64 rows were 1.6 of a new group's 2.9 ms
/// at 1M partitions, 1000 made it 25-35 ms.
pub const FIRST_CONTACT_SEED_CAP: usize = 64;

/// The timestamp a first-contact registration stores for a pop's intent.
pub fn registration_timestamp(intent: SubscriptionIntent, now: Timestamp) -> Option<Timestamp> {
    match (intent.from, intent.mode) {
        (SubscriptionFrom::At(t), _) => Some(t),
        (SubscriptionFrom::Now, _) | (SubscriptionFrom::Unset, SubscriptionMode::New) => Some(now),
        (SubscriptionFrom::Unset, SubscriptionMode::All) => None,
    }
}

/// Where seeding starts the cursor, before it is resolved against the partition's segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedRule {
    /// committed = -1: deliver everything retained.
    FromStart,
    /// committed = last_offset: skip the whole existing backlog.
    AtEnd,
    /// Just before the first segment created at or after the timestamp; `AtEnd` if none.
    FromTimestamp(Timestamp),
}

/// Where a new cursor starts (pop step 3): the durable record first, then the pop-carried intent, then -1.
/// `__QUEUE_MODE__` skips both: a queue-mode pop never skips backlog.
pub fn seed_rule(
    group: &str,
    record: Option<SubscriptionRecord>,
    intent: SubscriptionIntent,
) -> SeedRule {
    if group == QUEUE_MODE_GROUP {
        return SeedRule::FromStart;
    }
    if let Some(rec) = record {
        return match rec.subscription_timestamp {
            Some(t) => SeedRule::FromTimestamp(t),
            None => SeedRule::FromStart,
        };
    }
    match (intent.from, intent.mode) {
        (SubscriptionFrom::At(t), _) => SeedRule::FromTimestamp(t),
        (SubscriptionFrom::Now, _) | (SubscriptionFrom::Unset, SubscriptionMode::New) => {
            SeedRule::AtEnd
        }
        (SubscriptionFrom::Unset, SubscriptionMode::All) => SeedRule::FromStart,
    }
}

/// Resolves a seed rule to a cursor. `first_segment_at_or_after` is the base offset of the first
/// segment whose created_at >= the timestamp (found by a forward walk from the retention start).
pub fn seed_cursor(
    rule: SeedRule,
    last_offset: Offset,
    first_segment_at_or_after: Option<Offset>,
) -> Offset {
    match rule {
        SeedRule::FromStart => -1,
        SeedRule::AtEnd => last_offset,
        SeedRule::FromTimestamp(_) => {
            first_segment_at_or_after.map_or(last_offset, |base| base - 1)
        }
    }
}

/// A segment as the scan sees it (no blob).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentMeta {
    pub base_offset: Offset,
    pub end_offset: Offset,
    pub created_at: Timestamp,
}

impl SegmentMeta {
    pub fn msg_count(&self) -> i64 {
        self.end_offset - self.base_offset + 1
    }
}

/// One row of a pop's answer before the blob is attached: frames [start_idx, start_idx + take).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceRow {
    pub base_offset: Offset,
    pub start_idx: u32,
    pub take: u32,
    pub msg_count: u32,
    pub created_at: Timestamp,
}

/// Conflation (last-value delivery) is a stored policy of (queue, consumer group), fixed at the
/// group's registration (`consumer_groups_metadata`): rolling deploys mix consumers that ask for
/// it and consumers that do not, so the stored value wins over what a pop asks.
/// What a pop does about its group's policy before it claims anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyStep {
    /// The group is registered with this policy.
    Stored(bool),
    /// No registration, and the pop did not ask for conflation: delivery as usual, nothing
    /// recorded (the group's first contact on the ring path records it).
    Unregistered,
    /// No registration, and the pop asked for conflation: register the group as conflating
    /// first (under the first-contact try-lock; a contended lock claims nothing this time).
    Register,
}

pub fn policy_step(group: &str, stored: Option<bool>, requested: bool) -> PolicyStep {
    match stored {
        _ if group == QUEUE_MODE_GROUP => PolicyStep::Unregistered,
        Some(conflating) => PolicyStep::Stored(conflating),
        None if requested => PolicyStep::Register,
        None => PolicyStep::Unregistered,
    }
}

/// A conflating pop's one message of a partition: the newest visible one, when it is at or
/// past `wanted`. Everything between `wanted` and it is retired (the cursor moves to just before
/// it), so `newest_visible` must be read in one statement: pushes of a partition commit in
/// offset order, so nothing below it can commit later, and no newer message is retired unseen.
pub fn conflated_slice(wanted: Offset, newest_visible: Option<SegmentMeta>) -> Option<SliceRow> {
    let seg = newest_visible.filter(|s| s.end_offset >= wanted)?;
    Some(SliceRow {
        base_offset: seg.base_offset,
        start_idx: u32::try_from(seg.end_offset - seg.base_offset).ok()?,
        take: 1,
        msg_count: u32::try_from(seg.msg_count()).ok()?,
        created_at: seg.created_at,
    })
}

/// What a pop's answer says of conflation: `conflation` when the group's effective policy is
/// conflating, `conflict` when the pop asked for conflation and the group is stored without it.
/// With no stored policy known (a registration still in flight elsewhere; nothing was delivered)
/// the request's own wish is echoed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ConflationEcho {
    pub conflation: bool,
    pub conflict: bool,
}

impl ConflationEcho {
    pub fn of(requested: bool, stored: Option<bool>) -> Self {
        ConflationEcho {
            conflation: stored.unwrap_or(requested),
            conflict: requested && stored == Some(false),
        }
    }

    /// Clients that asked must see the echo even on an empty pop, so such a pop is a 200.
    pub fn says_anything(&self) -> bool {
        self.conflation || self.conflict
    }
}

/// delayedProcessing: a segment is visible only when it is at least D seconds old.
pub fn delay_visible(seg: &SegmentMeta, delayed_processing_secs: u32, now: Timestamp) -> bool {
    delayed_processing_secs == 0
        || seg.created_at <= now.minus_secs(i64::from(delayed_processing_secs))
}

/// The head probe's covering test and the forward scan, over segments the caller fetched:
/// `head` is the greatest segment with base_offset <= wanted (one backward step, LIMIT 1);
/// `forward` yields segments with base_offset > wanted in ascending order, and is consumed only
/// until the budget is spent (the SQL loop is a cursor, so the index walk stops there too).
pub fn plan_scan(
    wanted: Offset,
    head: Option<SegmentMeta>,
    forward: impl IntoIterator<Item = SegmentMeta>,
    budget: u32,
    delayed_processing_secs: u32,
    now: Timestamp,
) -> Vec<SliceRow> {
    let mut rows = Vec::new();
    let mut left = i64::from(budget);
    if left == 0 {
        return rows;
    }
    if let Some(h) = head {
        if h.end_offset >= wanted {
            if !delay_visible(&h, delayed_processing_secs, now) {
                return rows;
            }
            let take = (h.end_offset - wanted + 1).min(left);
            rows.push(SliceRow {
                base_offset: h.base_offset,
                start_idx: (wanted - h.base_offset) as u32,
                take: take as u32,
                msg_count: h.msg_count() as u32,
                created_at: h.created_at,
            });
            left -= take;
        }
    }
    for seg in forward {
        if left == 0 || !delay_visible(&seg, delayed_processing_secs, now) {
            // created_at is monotone in base_offset: the first invisible segment starts the
            // filtered suffix.
            break;
        }
        let take = seg.msg_count().min(left);
        rows.push(SliceRow {
            base_offset: seg.base_offset,
            start_idx: 0,
            take: take as u32,
            msg_count: seg.msg_count() as u32,
            created_at: seg.created_at,
        });
        left -= take;
    }
    rows
}

/// ttl: the first offset at or after `wanted` that has not expired. Segments older than `ttl`
/// seconds are skipped whole; created_at is monotone in base_offset, so the expired segments are
/// a prefix and the walk stops at the first live one. `head` and `forward` are as in
/// [`plan_scan`].
pub fn ttl_skip_to(
    wanted: Offset,
    head: Option<SegmentMeta>,
    forward: impl IntoIterator<Item = SegmentMeta>,
    ttl_secs: u32,
    now: Timestamp,
) -> Offset {
    if ttl_secs == 0 {
        return wanted;
    }
    let cutoff = now.minus_secs(i64::from(ttl_secs));
    let mut to = wanted;
    if let Some(h) = head.filter(|h| h.end_offset >= wanted) {
        if h.created_at >= cutoff {
            return to;
        }
        to = h.end_offset + 1;
    }
    for seg in forward {
        if seg.created_at >= cutoff {
            break;
        }
        to = to.max(seg.end_offset + 1);
    }
    to
}

/// windowBuffer: the partition is held while its newest segment is younger than W seconds.
/// Returns the instant the hold ends, or `None` when the partition may be served.
pub fn window_hold_until(
    newest_created_at: Option<Timestamp>,
    window_buffer_secs: u32,
    now: Timestamp,
) -> Option<Timestamp> {
    if window_buffer_secs == 0 {
        return None;
    }
    let until = newest_created_at?.plus_secs(i64::from(window_buffer_secs));
    (until > now).then_some(until)
}

/// The empty-partition cursor seal: only when the scan took nothing, the partition holds no
/// segments at all, and last_offset > committed. Returns the new committed offset.
pub fn seal_target(
    taken: u32,
    partition_has_segments: bool,
    last_offset: Offset,
    committed: Offset,
) -> Option<Offset> {
    (taken == 0 && !partition_has_segments && last_offset > committed).then_some(last_offset)
}

/// The attempt rule: a batch starting where the previous delivery started is a redelivery.
pub fn next_attempt(prev_count: u32, prev_offset: Option<Offset>, start: Offset) -> u32 {
    if prev_offset == Some(start) {
        prev_count.saturating_add(1)
    } else {
        1
    }
}

/// autoAck: commit inside the pop, no lease (at-most-once).
pub fn apply_auto_ack(row: &mut CursorRow, last: Offset, taken: u32) {
    row.committed = last;
    row.worker_id = None;
    row.lease_expires_at = None;
    row.lease_acquired_at = None;
    row.batch_end = None;
    row.total_consumed += i64::from(taken);
}

/// Leased delivery of (committed, last]: the cursor does not move.
pub fn apply_lease(
    row: &mut CursorRow,
    worker: WorkerId,
    now: Timestamp,
    lease_seconds: u32,
    start: Offset,
    last: Offset,
) {
    row.worker_id = Some(worker);
    row.lease_expires_at = Some(now.plus_secs(i64::from(lease_seconds)));
    row.lease_acquired_at = Some(now);
    row.batch_end = Some(last);
    row.attempt_count = next_attempt(row.attempt_count, row.attempt_offset, start);
    row.attempt_offset = Some(start);
}

/// The SQL candidate cap of the wildcard scan: spare candidates for the ones claimed concurrently
/// or found empty, 16 for each partition the pop may claim (at least 64). A pop reads and answers
/// every candidate, so 512 for a one-partition pop was half its cost on a large queue.
pub fn wildcard_candidate_cap(partition_count: u64, max_partitions: u32) -> u64 {
    let by_queue = if partition_count >= 128 {
        512
    } else {
        (partition_count * 4).clamp(64, 512)
    };
    by_queue.min((u64::from(max_partitions) * 16).max(64))
}

/// How far behind the write watermark the wildcard scan looks (absorbs 1 s quantization).
pub const WATERMARK_SLACK_SECS: i64 = 120;
/// The empty-scan watermark re-check throttle.
pub const WATERMARK_RECHECK_SECS: i64 = 30;

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: Offset, end: Offset, at: i64) -> SegmentMeta {
        SegmentMeta {
            base_offset: base,
            end_offset: end,
            created_at: Timestamp::from_secs(at),
        }
    }

    const NOW: Timestamp = Timestamp(1_000_000_000);

    #[test]
    fn seeding_order_record_then_intent_then_start() {
        let new = SubscriptionIntent {
            mode: SubscriptionMode::New,
            from: SubscriptionFrom::Unset,
        };
        let all = SubscriptionIntent::default();
        let at = SubscriptionIntent {
            mode: SubscriptionMode::All,
            from: SubscriptionFrom::At(Timestamp(5)),
        };
        let rec = |t| {
            Some(SubscriptionRecord {
                subscription_timestamp: t,
            })
        };
        // Queue mode never skips backlog, whatever it carries.
        assert_eq!(
            seed_rule(QUEUE_MODE_GROUP, rec(Some(Timestamp(9))), new),
            SeedRule::FromStart
        );
        assert_eq!(seed_rule(QUEUE_MODE_GROUP, None, new), SeedRule::FromStart);
        // The durable record wins over the intent.
        assert_eq!(
            seed_rule("g", rec(Some(Timestamp(9))), new),
            SeedRule::FromTimestamp(Timestamp(9))
        );
        assert_eq!(seed_rule("g", rec(None), new), SeedRule::FromStart);
        // Then the intent.
        assert_eq!(seed_rule("g", None, new), SeedRule::AtEnd);
        assert_eq!(
            seed_rule(
                "g",
                None,
                SubscriptionIntent {
                    mode: SubscriptionMode::All,
                    from: SubscriptionFrom::Now
                }
            ),
            SeedRule::AtEnd
        );
        assert_eq!(
            seed_rule("g", None, at),
            SeedRule::FromTimestamp(Timestamp(5))
        );
        assert_eq!(seed_rule("g", None, all), SeedRule::FromStart);
    }

    #[test]
    fn seed_cursor_lands_before_the_first_recent_segment() {
        assert_eq!(seed_cursor(SeedRule::FromStart, 9, None), -1);
        assert_eq!(seed_cursor(SeedRule::AtEnd, 9, None), 9);
        assert_eq!(
            seed_cursor(SeedRule::FromTimestamp(Timestamp(1)), 9, Some(4)),
            3
        );
        assert_eq!(
            seed_cursor(SeedRule::FromTimestamp(Timestamp(1)), 9, None),
            9
        );
    }

    #[test]
    fn registration_stores_the_intent() {
        let now = Timestamp(77);
        assert_eq!(
            registration_timestamp(SubscriptionIntent::default(), now),
            None
        );
        let new = SubscriptionIntent {
            mode: SubscriptionMode::New,
            from: SubscriptionFrom::Unset,
        };
        assert_eq!(registration_timestamp(new, now), Some(now));
        let at = SubscriptionIntent {
            mode: SubscriptionMode::New,
            from: SubscriptionFrom::At(Timestamp(3)),
        };
        assert_eq!(registration_timestamp(at, now), Some(Timestamp(3)));
    }

    #[test]
    fn scan_starts_mid_segment_and_stops_at_budget() {
        let head = seg(0, 9, 1);
        let fwd = [seg(10, 14, 2), seg(15, 29, 3), seg(30, 39, 4)];
        let rows = plan_scan(7, Some(head), fwd, 12, 0, NOW);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            (rows[0].start_idx, rows[0].take, rows[0].msg_count),
            (7, 3, 10)
        );
        assert_eq!((rows[1].start_idx, rows[1].take), (0, 5));
        assert_eq!((rows[2].base_offset, rows[2].take), (15, 4));
        assert_eq!(rows.iter().map(|r| r.take).sum::<u32>(), 12);
    }

    #[test]
    fn head_that_does_not_cover_is_ignored() {
        // Fully consumed head (0..=4, wanted 5): the forward scan starts at 10 (retention gap).
        let rows = plan_scan(5, Some(seg(0, 4, 1)), [seg(10, 12, 2)], 100, 0, NOW);
        assert_eq!(
            rows,
            vec![SliceRow {
                base_offset: 10,
                start_idx: 0,
                take: 3,
                msg_count: 3,
                created_at: Timestamp::from_secs(2)
            }]
        );
    }

    #[test]
    fn delay_cuts_a_suffix() {
        let now = Timestamp::from_secs(100);
        let fwd = [seg(0, 1, 90), seg(2, 3, 97), seg(4, 5, 91)];
        let rows = plan_scan(0, None, fwd, 100, 5, now);
        assert_eq!(rows.len(), 1, "stops at the first too-young segment");
        assert!(plan_scan(0, Some(seg(0, 1, 99)), [], 10, 5, now).is_empty());
    }

    #[test]
    fn window_holds_until_quiet() {
        let now = Timestamp::from_secs(100);
        assert_eq!(
            window_hold_until(Some(Timestamp::from_secs(99)), 2, now),
            Some(Timestamp::from_secs(101))
        );
        assert_eq!(
            window_hold_until(Some(Timestamp::from_secs(98)), 2, now),
            None
        );
        assert_eq!(
            window_hold_until(Some(Timestamp::from_secs(99)), 0, now),
            None
        );
        assert_eq!(window_hold_until(None, 2, now), None);
    }

    #[test]
    fn seal_guards_are_narrow() {
        assert_eq!(seal_target(0, false, 9, 3), Some(9));
        assert_eq!(
            seal_target(0, true, 9, 3),
            None,
            "segments exist (maybe deferred): never seal"
        );
        assert_eq!(seal_target(2, false, 9, 3), None);
        assert_eq!(seal_target(0, false, 3, 3), None);
    }

    #[test]
    fn attempt_rule() {
        assert_eq!(next_attempt(0, None, 0), 1);
        assert_eq!(next_attempt(1, Some(0), 0), 2);
        assert_eq!(next_attempt(5, Some(0), 3), 1);
        let mut row = CursorRow::seeded(-1);
        let w = WorkerId(uuid::Uuid::nil());
        apply_lease(&mut row, w, NOW, 30, 0, 4);
        assert_eq!(
            (
                row.attempt_count,
                row.attempt_offset,
                row.batch_end,
                row.committed
            ),
            (1, Some(0), Some(4), -1)
        );
        assert_eq!(row.lease_expires_at, Some(NOW.plus_secs(30)));
        apply_lease(&mut row, w, NOW, 30, 0, 2);
        assert_eq!(row.attempt_count, 2);
        apply_auto_ack(&mut row, 2, 3);
        assert_eq!(
            (row.committed, row.worker_id, row.total_consumed),
            (2, None, 3)
        );
        assert_eq!(
            row.attempt_count, 2,
            "autoAck leaves the attempt telemetry alone"
        );
    }

    #[test]
    fn claimability() {
        let mut row = CursorRow::seeded(-1);
        assert!(row.claimable(NOW));
        row.worker_id = Some(WorkerId(uuid::Uuid::nil()));
        row.lease_expires_at = Some(NOW);
        assert!(
            !row.claimable(NOW),
            "expiry is strict: a lease is live through its expiry instant"
        );
        assert!(row.claimable(Timestamp(NOW.0 + 1)));
    }

    #[test]
    fn candidate_cap() {
        assert_eq!(wildcard_candidate_cap(1, 64), 64);
        assert_eq!(wildcard_candidate_cap(20, 64), 80);
        assert_eq!(wildcard_candidate_cap(127, 64), 508);
        assert_eq!(wildcard_candidate_cap(128, 64), 512);
        assert_eq!(wildcard_candidate_cap(100_000, 64), 512);
        assert_eq!(wildcard_candidate_cap(100_000, 1), 64);
        assert_eq!(wildcard_candidate_cap(100_000, 0), 64);
        assert_eq!(wildcard_candidate_cap(100_000, 10), 160);
        assert_eq!(wildcard_candidate_cap(20, 10), 80);
    }
}

#[cfg(test)]
mod ttl_tests {
    use super::*;

    fn seg(base: Offset, end: Offset, at: i64) -> SegmentMeta {
        SegmentMeta {
            base_offset: base,
            end_offset: end,
            created_at: Timestamp::from_secs(at),
        }
    }

    #[test]
    fn ttl_skips_the_expired_prefix_only() {
        let now = Timestamp::from_secs(1_000);
        // Head [0,4] at t=10, then [5,9] at t=20 (expired at ttl 100), [10,14] at t=950 (live).
        let fwd = [seg(5, 9, 20), seg(10, 14, 950)];
        assert_eq!(ttl_skip_to(2, Some(seg(0, 4, 10)), fwd, 100, now), 10);
        assert_eq!(ttl_skip_to(2, Some(seg(0, 4, 10)), fwd, 0, now), 2);
        // A live head stops the walk, whatever follows.
        assert_eq!(ttl_skip_to(2, Some(seg(0, 4, 990)), fwd, 100, now), 2);
        // Everything expired: past the last segment.
        assert_eq!(
            ttl_skip_to(2, Some(seg(0, 4, 10)), [seg(5, 9, 20)], 100, now),
            10
        );
        // A head that does not cover `wanted` is ignored.
        assert_eq!(
            ttl_skip_to(5, Some(seg(0, 4, 10)), [seg(5, 9, 950)], 100, now),
            5
        );
        // Exactly at the cutoff is still live.
        assert_eq!(ttl_skip_to(0, Some(seg(0, 4, 900)), [], 100, now), 0);
    }
}

#[cfg(test)]
mod conflation_tests {
    use super::*;

    fn seg(base: Offset, end: Offset) -> SegmentMeta {
        SegmentMeta {
            base_offset: base,
            end_offset: end,
            created_at: Timestamp::from_secs(7),
        }
    }

    #[test]
    fn the_stored_policy_wins_and_only_an_asking_pop_registers() {
        assert_eq!(
            policy_step("g", Some(false), true),
            PolicyStep::Stored(false)
        );
        assert_eq!(
            policy_step("g", Some(true), false),
            PolicyStep::Stored(true)
        );
        assert_eq!(policy_step("g", None, true), PolicyStep::Register);
        assert_eq!(policy_step("g", None, false), PolicyStep::Unregistered);
        assert_eq!(
            policy_step(QUEUE_MODE_GROUP, Some(true), true),
            PolicyStep::Unregistered
        );
    }

    #[test]
    fn a_conflated_pop_takes_the_newest_visible_message_only() {
        // Segment [10, 14]: the newest message is offset 14, frame 4 of 5.
        let row = conflated_slice(3, Some(seg(10, 14))).expect("a message past the cursor");
        assert_eq!(
            (row.base_offset, row.start_idx, row.take, row.msg_count),
            (10, 4, 1, 5)
        );
        assert_eq!(
            conflated_slice(14, Some(seg(10, 14))).map(|r| r.start_idx),
            Some(4)
        );
        // Nothing past the cursor, or nothing visible.
        assert_eq!(conflated_slice(15, Some(seg(10, 14))), None);
        assert_eq!(conflated_slice(0, None), None);
    }

    #[test]
    fn the_echo_follows_the_stored_policy() {
        let echo = ConflationEcho::of;
        assert_eq!(
            echo(true, Some(true)),
            ConflationEcho {
                conflation: true,
                conflict: false
            }
        );
        assert_eq!(
            echo(true, Some(false)),
            ConflationEcho {
                conflation: false,
                conflict: true
            }
        );
        // A consumer that did not ask still hears that its group conflates.
        assert!(echo(false, Some(true)).conflation);
        assert!(!echo(false, None).says_anything());
        assert!(echo(true, None).conflation);
    }
}
