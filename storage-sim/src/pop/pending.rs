//! What is pending without a claim: the legacy path's probe (`log_next_pending_v1`), the
//! reseed's list of pending partitions, and the simulation's liveness oracle.

use queen_core::claim::{plan_scan, ttl_skip_to, window_hold_until, CursorRow, SegmentMeta};
use queen_core::{Offset, Timestamp};

use crate::state::{DbState, PartitionRow, QueueRow};
use crate::SimBugs;

/// A partition's backlog for a group: `None` when it has none; otherwise the cursor row, if any
/// (no row: everything retained is pending).
fn backlog<'a>(
    st: &'a DbState,
    p: &PartitionRow,
    group: &str,
    tx: u64,
    bugs: SimBugs,
) -> Option<Option<&'a CursorRow>> {
    match st.consumers.get(&(p.id.clone(), group.to_string()), tx) {
        None if bugs.pending_scans_need_a_cursor => None,
        None => (p.last_offset >= 0).then_some(None),
        Some(c) => (p.last_offset > c.committed).then_some(Some(c)),
    }
}

/// `log_next_pending_v1`: now if some partition of `queues` with a backlog for the group is
/// claimable; else the earliest end of the leases (or retry holds) over those backlogs; `None`
/// when no partition has a backlog.
pub(crate) fn next_pending(
    st: &DbState,
    queues: &[String],
    group: &str,
    now: Timestamp,
    tx: u64,
    bugs: SimBugs,
) -> Option<Timestamp> {
    let mut earliest: Option<Timestamp> = None;
    for queue in queues {
        for (_, p) in st.partitions_of(queue, tx) {
            let at = match backlog(st, p, group, tx, bugs) {
                None => continue,
                Some(None) => now,
                Some(Some(c)) => c.live_lease_until(now).map_or(now, Timestamp::just_after),
            };
            if at <= now {
                return Some(now);
            }
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
    }
    earliest
}

/// Partitions with a backlog for the group, claimable or leased (coarse: re-verified by the pop,
/// whose verdict puts a leased one on the ring's wheel until its lease ends).
pub(crate) fn pending_partitions(
    st: &DbState,
    queue: &str,
    group: &str,
    after: Option<&str>,
    limit: u32,
    tx: u64,
    bugs: SimBugs,
) -> Vec<String> {
    st.partitions_of(queue, tx)
        .filter(|(name, _)| after.is_none_or(|a| *name > a))
        .filter(|(_, p)| backlog(st, p, group, tx, bugs).is_some())
        .take(limit as usize)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Whether a timer due at `now` will push into (queue, partition).
fn due_timer_targets(st: &DbState, queue: &str, partition: &str, now: Timestamp) -> bool {
    st.timers
        .range((queue.to_string(), String::new()).., 0)
        .take_while(|((q, _), _)| q == queue)
        .any(|(_, t)| t.partition == partition && t.deliver_at <= now)
}

/// A liveness oracle for simulations: whether a pop of `group` could take at least one message
/// of the partition now, by the claim rules over committed state (no side effects). A partition
/// without a cursor row counts from its start, unless the group has a subscription timestamp
/// (that seeding is the pop's to judge, and the oracle stays silent).
pub(crate) fn deliverable_now(
    st: &DbState,
    queue: &str,
    partition: &str,
    group: &str,
    now: Timestamp,
) -> bool {
    let Some(q) = st.queues.get(&queue.to_string(), 0) else {
        return false;
    };
    st.partitions
        .get(&(queue.to_string(), partition.to_string()), 0)
        .is_some_and(|p| deliverable_in(st, queue, q, p, partition, group, now))
}

/// The partitions of a queue that `deliverable_now` finds open to `group`, by name, read under
/// one look at the state (the simulation's liveness checker asks at every step).
pub(crate) fn deliverable_partitions(
    st: &DbState,
    queue: &str,
    group: &str,
    now: Timestamp,
) -> Vec<String> {
    let Some(q) = st.queues.get(&queue.to_string(), 0) else {
        return vec![];
    };
    st.partitions_of(queue, 0)
        .filter(|(name, p)| deliverable_in(st, queue, q, p, name, group, now))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `deliverable_now` for a partition row already read.
fn deliverable_in(
    st: &DbState,
    queue: &str,
    q: &QueueRow,
    p: &PartitionRow,
    partition: &str,
    group: &str,
    now: Timestamp,
) -> bool {
    let committed = match st.consumers.get(&(p.id.clone(), group.to_string()), 0) {
        Some(c) if !c.claimable(now) => return false,
        Some(c) => c.committed,
        None => {
            let key = (queue.to_string(), group.to_string());
            if st
                .metadata
                .get(&key, 0)
                .is_some_and(|m| m.subscription_timestamp.is_some())
            {
                return false;
            }
            -1
        }
    };
    if p.last_offset <= committed {
        // Nothing stored is pending: a due timer's message would be the head, deliverable as
        // soon as it fires (where no delay or window holds a new message).
        return q.config.window_buffer_secs == 0
            && q.config.delayed_processing_secs == 0
            && due_timer_targets(st, queue, partition, now);
    }
    let segments = |from: Offset, to: Offset| {
        st.segments
            .range((p.id.clone(), from)..=(p.id.clone(), to), 0)
            .map(|((_, base), s)| SegmentMeta {
                base_offset: *base,
                end_offset: s.end_offset,
                created_at: s.created_at,
            })
    };
    let newest = segments(Offset::MIN, Offset::MAX)
        .next_back()
        .map(|s| s.created_at);
    if window_hold_until(newest, q.config.window_buffer_secs, now).is_some() {
        return false;
    }
    let head = |wanted: Offset| segments(Offset::MIN, wanted).next_back();
    let wanted = committed + 1;
    let wanted = ttl_skip_to(
        wanted,
        head(wanted),
        segments(wanted + 1, Offset::MAX),
        q.config.ttl_secs,
        now,
    );
    !plan_scan(
        wanted,
        head(wanted),
        segments(wanted + 1, Offset::MAX),
        1,
        q.config.delayed_processing_secs,
        now,
    )
    .is_empty()
}
