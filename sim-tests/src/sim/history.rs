//! The recorded history of a simulated run (invoke/complete events in simulated time) and the
//! checkers that judge it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Simulated microseconds since the start of the run.
pub type Micros = i64;

/// One delivered message: (partitionId as reported, offset, transactionId).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub partition_id: String,
    pub offset: i64,
    pub txid: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A push the broker acknowledged (every item queued or duplicate): first sent at `invoked`.
    Pushed {
        invoked: Micros,
        at: Micros,
        queue: String,
        partition: String,
        txids: Vec<String>,
    },
    /// A pop invoked (its outcome comes as `Delivered` or `Empty`, or never).
    PopInvoked {
        at: Micros,
        consumer: String,
        group: String,
        id: u64,
    },
    Delivered {
        invoked: Micros,
        at: Micros,
        id: u64,
        consumer: String,
        group: String,
        partition: String,
        lease: String,
        auto_ack: bool,
        attempt: u64,
        msgs: Vec<Msg>,
    },
    Empty {
        invoked: Micros,
        at: Micros,
        id: u64,
        consumer: String,
        group: String,
    },
    /// An ack request sent for every message of a delivery (completed, or failed).
    AckSent {
        at: Micros,
        group: String,
        partition: String,
        lease: String,
        last_offset: i64,
        failed: bool,
    },
}

impl Event {
    /// The partition an event concerns, if one.
    pub fn partition(&self) -> Option<&str> {
        match self {
            Event::Pushed { partition, .. }
            | Event::Delivered { partition, .. }
            | Event::AckSent { partition, .. } => Some(partition),
            Event::PopInvoked { .. } | Event::Empty { .. } => None,
        }
    }

    /// The consumer group an event concerns (pushes concern none).
    pub fn group(&self) -> Option<&str> {
        match self {
            Event::Pushed { .. } => None,
            Event::PopInvoked { group, .. }
            | Event::Delivered { group, .. }
            | Event::Empty { group, .. }
            | Event::AckSent { group, .. } => Some(group),
        }
    }
}

#[derive(Clone, Default)]
pub struct History(pub Arc<Mutex<Vec<Event>>>);

impl History {
    pub fn record(&self, e: Event) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A checker's finding.
pub type Violation = String;

/// The pops of autoAck groups whose answer never came, as (index in `events`, group), in history
/// order: each may have taken messages nobody saw (autoAck is at-most-once).
fn lost_auto_ack_pops(events: &[Event]) -> Vec<(usize, &str)> {
    let answered: BTreeSet<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Delivered { id, .. } | Event::Empty { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let auto: BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Delivered {
                group,
                auto_ack: true,
                ..
            } => Some(group.as_str()),
            _ => None,
        })
        .collect();
    events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::PopInvoked { id, group, .. }
                if auto.contains(group.as_str()) && !answered.contains(id) =>
            {
                Some((i, group.as_str()))
            }
            _ => None,
        })
        .collect()
}

/// Groups with a lost autoAck pop (`lost_auto_ack_pops`) are exempt from `nothing_lost` (and
/// still held to `auto_ack_once`).
pub fn at_most_once_groups(events: &[Event]) -> BTreeSet<String> {
    lost_auto_ack_pops(events)
        .into_iter()
        .map(|(_, g)| g.to_string())
        .collect()
}

/// Every acknowledged push is delivered to every group (after the final heal-and-drain), but
/// what retention removed (`removed`: transactionIds; `retention_entitled` judges each removal).
pub fn nothing_lost(
    events: &[Event],
    groups: &[&str],
    removed: &BTreeSet<String>,
) -> Vec<Violation> {
    let exempt = at_most_once_groups(events);
    let groups: Vec<&str> = groups
        .iter()
        .copied()
        .filter(|g| !exempt.contains(*g))
        .collect();
    let mut delivered: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in events {
        if let Event::Delivered { group, msgs, .. } = e {
            let set = delivered.entry(group.as_str()).or_default();
            for m in msgs {
                set.insert(m.txid.as_str());
            }
        }
    }
    let mut out = vec![];
    for e in events {
        if let Event::Pushed { txids, at, .. } = e {
            for g in &groups {
                for t in txids {
                    if !removed.contains(t)
                        && !delivered.get(g).is_some_and(|s| s.contains(t.as_str()))
                    {
                        out.push(format!(
                            "lost: {t} (pushed at {at} us) never delivered to group {g}"
                        ));
                    }
                }
            }
        }
    }
    out
}

/// No message is delivered to two consumers of one group under overlapping live leases. A lease
/// is certainly live from its delivery's arrival until the earlier of (pop invocation + lease
/// time) and the first ack sent under it; another lease on a shared offset claimed (its pop
/// answered) inside that window is a double lease.
pub fn leases_exclusive(events: &[Event], lease_secs: i64) -> Vec<Violation> {
    struct Span<'a> {
        invoked: Micros,
        at: Micros,
        live_until: Micros,
        lease: &'a str,
        offsets: BTreeSet<i64>,
    }
    // The first ack sent under each lease, indexed once (not searched per delivery).
    let mut first_ack: BTreeMap<&str, Micros> = BTreeMap::new();
    for e in events {
        if let Event::AckSent { at, lease, .. } = e {
            let first = first_ack.entry(lease.as_str()).or_insert(*at);
            *first = (*first).min(*at);
        }
    }
    let mut spans: BTreeMap<(&str, &str), Vec<Span>> = BTreeMap::new();
    for e in events {
        if let Event::Delivered {
            invoked,
            at,
            group,
            partition,
            lease,
            auto_ack: false,
            msgs,
            ..
        } = e
        {
            let acked = first_ack.get(lease.as_str()).copied();
            let expiry = invoked + lease_secs * 1_000_000;
            spans
                .entry((group.as_str(), partition.as_str()))
                .or_default()
                .push(Span {
                    invoked: *invoked,
                    at: *at,
                    live_until: acked.map_or(expiry, |a| a.min(expiry)),
                    lease: lease.as_str(),
                    offsets: msgs.iter().map(|m| m.offset).collect(),
                });
        }
    }
    let mut out = vec![];
    for ((g, p), list) in &spans {
        // Only deliveries that share an offset can collide: compare within each offset's list
        // (a handful of redeliveries) instead of every pair of the partition's deliveries.
        let mut by_offset: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, span) in list.iter().enumerate() {
            for o in &span.offsets {
                by_offset.entry(*o).or_default().push(i);
            }
        }
        let pairs: BTreeSet<(usize, usize)> = by_offset
            .values()
            .flat_map(|ids| {
                ids.iter()
                    .flat_map(move |a| ids.iter().map(move |b| (*a, *b)))
                    .filter(|(a, b)| a != b)
            })
            .collect();
        for (a, b) in pairs {
            let (a, b) = (&list[a], &list[b]);
            if a.lease != b.lease && b.invoked >= a.at && b.at < a.live_until {
                out.push(format!(
                    "double lease: group {g} partition {p}: lease {} live until {} us, lease {} granted by {} us, on offsets {:?}",
                    a.lease,
                    a.live_until,
                    b.lease,
                    b.at,
                    a.offsets.intersection(&b.offsets).collect::<Vec<_>>()
                ));
            }
        }
    }
    out
}

/// Per-partition FIFO inside a batch: consecutive ascending offsets; leased batches carry their
/// partitionId (the partition-creation race delivers "").
pub fn batches_well_formed(events: &[Event]) -> Vec<Violation> {
    let mut out = vec![];
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            msgs,
            auto_ack,
            ..
        } = e
        {
            for w in msgs.windows(2) {
                if w[1].offset != w[0].offset + 1 {
                    out.push(format!(
                        "gap or disorder in a batch of {partition} for {group}: {} then {}",
                        w[0].offset, w[1].offset
                    ));
                }
            }
            if !auto_ack && msgs.iter().any(|m| m.partition_id.is_empty()) {
                out.push(format!(
                    "leased batch of {partition} for {group} carries an empty partitionId"
                ));
            }
        }
    }
    out
}

/// No delivery past the committed cursor + 1: a batch never starts beyond one past everything
/// the group had acknowledged (or taken with autoAck) on that partition before it, unless
/// retention removed what lies between before the pop answered (a gap the pop steps over), or
/// autoAck pops of the group took it: pops in flight at once whose answers came in another order
/// than they took their runs (every offset of the gap delivered by an autoAck pop of the group
/// invoked before this delivery answered), or a pop whose answer was lost (each, invoked before
/// the delivery, excuses one gap: a pop takes one run of one partition; autoAck is
/// at-most-once).
pub fn no_skips(
    events: &[Event],
    removals: &[Removal],
    dead_letters: &[DeadLettered],
) -> Vec<Violation> {
    // Lost autoAck pops per group, in history order, and how many excused a gap so far.
    let mut lost_pops: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, group) in lost_auto_ack_pops(events) {
        lost_pops.entry(group).or_default().push(i);
    }
    // (group, partition, offset) -> when each autoAck pop that delivered it was invoked.
    let mut auto_taken: BTreeMap<(&str, &str, i64), Vec<Micros>> = BTreeMap::new();
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            msgs,
            invoked,
            auto_ack: true,
            ..
        } = e
        {
            for m in msgs {
                auto_taken
                    .entry((group, partition, m.offset))
                    .or_default()
                    .push(*invoked);
            }
        }
    }
    let mut excused: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = vec![];
    for (i, e, c) in deliveries_with_consumed(events, removals, dead_letters) {
        let Event::Delivered {
            group,
            partition,
            msgs,
            at,
            ..
        } = e
        else {
            continue;
        };
        if let Some(first) = msgs.first() {
            // A parked pop reads storage any time until it answers.
            let removed_below = removed_through(removals, partition, c + 1, *at);
            if first.offset > removed_below.max(c) + 1 {
                let taken_concurrently = (removed_below.max(c) + 1..first.offset).all(|o| {
                    auto_taken
                        .get(&(group.as_str(), partition.as_str(), o))
                        .is_some_and(|pops| pops.iter().any(|invoked| invoked <= at))
                });
                if taken_concurrently {
                    continue;
                }
                let lost_before = lost_pops
                    .get(group.as_str())
                    .map_or(0, |l| l.iter().take_while(|&&p| p < i).count());
                let used = excused.entry(group.as_str()).or_default();
                if *used < lost_before {
                    *used += 1;
                    continue;
                }
                out.push(format!(
                    "skip: {group} got {partition} from offset {} with only {c} consumed",
                    first.offset
                ));
            }
        }
    }
    out
}

/// A message a failed ack filed as a dead letter for its group, as the checkers see it.
#[derive(Clone, Debug)]
pub struct DeadLettered {
    pub group: String,
    pub partition: String,
    pub offset: i64,
    /// When the ack that filed it was applied.
    pub filed_at: Micros,
}

/// The failed acks (by index in `events`) that dead-lettered their batch's first message: for
/// each dead letter, the last failed ack of its group and partition sent before it was filed
/// whose batch began with it. Such an ack consumed its whole batch: the failed message went to
/// the dead letters, the others were acknowledged completed.
fn dead_lettering_acks(
    events: &[Event],
    first_of: &BTreeMap<(&str, &str, &str), i64>,
    dead_letters: &[DeadLettered],
) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    for d in dead_letters {
        let filing = events.iter().enumerate().rev().find(|(_, e)| match e {
            Event::AckSent {
                at,
                group,
                partition,
                lease,
                failed: true,
                ..
            } => {
                *at <= d.filed_at
                    && *group == d.group
                    && *partition == d.partition
                    && first_of.get(&(group.as_str(), lease.as_str(), partition.as_str()))
                        == Some(&d.offset)
            }
            _ => false,
        });
        if let Some((i, _)) = filing {
            out.insert(i);
        }
    }
    out
}

/// The first offset of each delivery, by (group, lease, partition): the message a failed ack
/// reports failed.
fn batch_firsts(events: &[Event]) -> BTreeMap<(&str, &str, &str), i64> {
    let mut first_of = BTreeMap::new();
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            lease,
            msgs,
            ..
        } = e
        {
            if let Some(m) = msgs.first() {
                first_of.insert(
                    (group.as_str(), lease.as_str(), partition.as_str()),
                    m.offset,
                );
            }
        }
    }
    first_of
}

/// Each delivery, with the highest offset its group had consumed of that partition before it: by
/// a completed ack sent, an autoAck delivery, or a failed ack whose failed message (its batch's
/// first) is gone: dead-lettered by that ack, or removed by retention before the delivery
/// answered (a removed message is no barrier, so the ack's completions count), earlier in the
/// history (-1: nothing).
fn deliveries_with_consumed<'a>(
    events: &'a [Event],
    removals: &[Removal],
    dead_letters: &[DeadLettered],
) -> Vec<(usize, &'a Event, i64)> {
    let first_of = batch_firsts(events);
    let filing = dead_lettering_acks(events, &first_of, dead_letters);
    let mut consumed: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    // Failed acks not yet known to have consumed their batch: (first, last) per group/partition.
    let mut failed: BTreeMap<(&str, &str), Vec<(i64, i64)>> = BTreeMap::new();
    let mut out = vec![];
    for (i, e) in events.iter().enumerate() {
        match e {
            Event::AckSent {
                group,
                partition,
                last_offset,
                failed: false,
                ..
            } => {
                let c = consumed
                    .entry((group.as_str(), partition.as_str()))
                    .or_insert(-1);
                *c = (*c).max(*last_offset);
            }
            Event::AckSent {
                group,
                partition,
                lease,
                last_offset,
                failed: true,
                ..
            } => {
                let key = (group.as_str(), partition.as_str());
                if filing.contains(&i) {
                    let c = consumed.entry(key).or_insert(-1);
                    *c = (*c).max(*last_offset);
                } else if let Some(first) =
                    first_of.get(&(group.as_str(), lease.as_str(), partition.as_str()))
                {
                    failed.entry(key).or_default().push((*first, *last_offset));
                }
            }
            Event::Delivered {
                group,
                partition,
                msgs,
                auto_ack,
                at,
                ..
            } => {
                let key = (group.as_str(), partition.as_str());
                let c = consumed.entry(key).or_insert(-1);
                if let Some(pending) = failed.get_mut(&key) {
                    pending.retain(|(first, last)| {
                        let gone = removals.iter().any(|r| {
                            r.partition == *partition
                                && r.committed_at < *at
                                && r.base <= *first
                                && *first <= r.end
                        });
                        if gone {
                            *c = (*c).max(*last);
                        }
                        !gone
                    });
                }
                out.push((i, e, *c));
                if *auto_ack {
                    if let Some(last) = msgs.last() {
                        *c = (*c).max(last.offset);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Deliveries whose batch started past removed messages (a pop stepping over a retention gap),
/// for coverage.
pub fn gap_steps(events: &[Event], removals: &[Removal], dead_letters: &[DeadLettered]) -> u64 {
    deliveries_with_consumed(events, removals, dead_letters)
        .into_iter()
        .filter(|(_, e, c)| match e {
            Event::Delivered {
                partition,
                msgs,
                at,
                ..
            } => msgs.first().is_some_and(|m| {
                m.offset > c + 1 && removed_through(removals, partition, c + 1, *at) > *c
            }),
            _ => false,
        })
        .count() as u64
}

/// The last offset of the run of removed offsets starting at `from` on the partition, removed
/// before `before` (`from - 1` when `from` itself was not removed by then).
fn removed_through(removals: &[Removal], partition: &str, from: i64, before: Micros) -> i64 {
    let mut through = from - 1;
    loop {
        let next = removals.iter().find(|r| {
            r.partition == partition
                && r.committed_at < before
                && r.base <= through + 1
                && r.end > through
        });
        match next {
            Some(r) => through = r.end,
            None => return through,
        }
    }
}

/// A removal retention committed, as the checkers see it.
#[derive(Clone, Debug)]
pub struct Removal {
    pub partition: String,
    pub base: i64,
    pub end: i64,
    /// Removed for its age (retentionSeconds), consumed or not; else as completed.
    pub expired: bool,
    pub txids: Vec<String>,
    pub committed_at: Micros,
}

/// Each removal was one retention was entitled to make, judged from what the clients saw:
/// - expired: the push was sent at least `pending_us` before the removal committed;
/// - completed: every group that must read it had sent a completed ack covering each message
///   before the removal committed. `groups` must read every message; a `late` group reads from
///   the start once its first contact committed, so it must have acked what is removed after
///   its first pop was answered.
///
/// And no pop sent after a removal committed delivers a removed message.
pub fn retention_entitled(
    events: &[Event],
    removals: &[Removal],
    groups: &[&str],
    late: &[&str],
    pending_us: Micros,
) -> Vec<Violation> {
    let mut pushed_at: BTreeMap<&str, Micros> = BTreeMap::new();
    // (group, lease, partition) -> the messages of that delivery, in order.
    let mut deliveries: BTreeMap<(&str, &str, &str), Vec<&Msg>> = BTreeMap::new();
    let mut first_answer: BTreeMap<&str, Micros> = BTreeMap::new();
    for e in events {
        match e {
            Event::Pushed { invoked, txids, .. } => {
                for t in txids {
                    pushed_at.entry(t.as_str()).or_insert(*invoked);
                }
            }
            Event::Delivered {
                group,
                lease,
                partition,
                msgs,
                at,
                ..
            } => {
                deliveries
                    .entry((group.as_str(), lease.as_str(), partition.as_str()))
                    .or_default()
                    .extend(msgs.iter());
                first_answer.entry(group.as_str()).or_insert(*at);
            }
            Event::Empty { group, at, .. } => {
                first_answer.entry(group.as_str()).or_insert(*at);
            }
            _ => {}
        }
    }
    // (group, transactionId) -> when a completed ack of it was first sent. An ack request that
    // reports a batch's first message failed acks the others completed (they count once that
    // failed message is gone: a removed message is no barrier).
    let mut completed: BTreeMap<(&str, &str), Micros> = BTreeMap::new();
    for e in events {
        if let Event::AckSent {
            group,
            lease,
            partition,
            last_offset,
            failed,
            at,
        } = e
        {
            for (_, m) in deliveries
                .get(&(group.as_str(), lease.as_str(), partition.as_str()))
                .into_iter()
                .flatten()
                .enumerate()
                .filter(|(i, m)| m.offset <= *last_offset && !(*failed && *i == 0))
            {
                completed
                    .entry((group.as_str(), m.txid.as_str()))
                    .or_insert(*at);
            }
        }
    }
    let mut out = vec![];
    for r in removals {
        for t in &r.txids {
            let Some(sent) = pushed_at.get(t.as_str()).copied() else {
                continue;
            };
            if r.expired {
                if r.committed_at < sent + pending_us {
                    out.push(format!(
                        "retention removed {t} of {} as expired at {} us, pushed at {sent} us",
                        r.partition, r.committed_at
                    ));
                }
                continue;
            }
            let readers = groups.iter().chain(
                late.iter()
                    .filter(|g| first_answer.get(**g).is_some_and(|a| *a < r.committed_at)),
            );
            for g in readers {
                if completed
                    .get(&(*g, t.as_str()))
                    .is_none_or(|at| *at >= r.committed_at)
                {
                    out.push(format!(
                        "retention removed {t} of {} as completed at {} us, but {g} had not acked it",
                        r.partition, r.committed_at
                    ));
                }
            }
        }
    }
    out.extend(delivered_after_removal(events, removals));
    out
}

/// A message delivered by a pop sent after retention removed it.
fn delivered_after_removal(events: &[Event], removals: &[Removal]) -> Vec<Violation> {
    let mut out = vec![];
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            invoked,
            msgs,
            ..
        } = e
        {
            for m in msgs {
                if let Some(r) = removals.iter().find(|r| {
                    r.partition == *partition
                        && (r.base..=r.end).contains(&m.offset)
                        && r.committed_at < *invoked
                }) {
                    out.push(format!(
                        "{group} got {partition}@{} from a pop sent at {invoked} us, after \
                         retention removed it at {} us",
                        m.offset, r.committed_at
                    ));
                }
            }
        }
    }
    out
}

/// Attempt counts: deliveries starting at the same offset count up (1, 2, ...).
pub fn attempts_count_up(events: &[Event]) -> Vec<Violation> {
    let mut last: BTreeMap<(&str, &str, i64), u64> = BTreeMap::new();
    let mut out = vec![];
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            msgs,
            attempt,
            auto_ack: false,
            ..
        } = e
        {
            if let Some(first) = msgs.first() {
                let k = (group.as_str(), partition.as_str(), first.offset);
                if let Some(prev) = last.get(&k) {
                    if attempt <= prev {
                        out.push(format!(
                            "attempt count of {partition}@{} for {group} went {prev} -> {attempt}",
                            first.offset
                        ));
                    }
                } else if *attempt == 0 {
                    out.push(format!("attempt 0 for {partition}@{}", first.offset));
                }
                last.insert(k, *attempt);
            }
        }
    }
    out
}

/// autoAck deliveries never repeat: a message taken with autoAck is never delivered again to
/// that group.
pub fn auto_ack_once(events: &[Event]) -> Vec<Violation> {
    let mut seen: BTreeMap<(&str, &str, i64), bool> = BTreeMap::new();
    let mut out = vec![];
    for e in events {
        if let Event::Delivered {
            group,
            partition,
            msgs,
            auto_ack,
            ..
        } = e
        {
            for m in msgs {
                let k = (group.as_str(), partition.as_str(), m.offset);
                if seen.get(&k) == Some(&true) {
                    out.push(format!(
                        "{partition}@{} delivered to {group} again after an autoAck delivery",
                        m.offset
                    ));
                }
                let was = seen.get(&k).copied().unwrap_or(false);
                seen.insert(k, was || *auto_ack);
            }
        }
    }
    out
}

/// A timer's message is never delivered before the `deliverAt` its schedule answered: the count
/// of timer messages delivered, and the violations.
pub fn timers_never_early(
    events: &[Event],
    due: &BTreeMap<String, Micros>,
) -> (Vec<Violation>, u64) {
    let (mut out, mut seen) = (vec![], 0);
    for e in events {
        if let Event::Delivered {
            at, msgs, group, ..
        } = e
        {
            for m in msgs {
                if let Some(d) = due.get(&m.txid) {
                    seen += 1;
                    if at < d {
                        out.push(format!(
                            "timer {} delivered to {group} at {at} us, before its deliverAt {d} us",
                            m.txid
                        ));
                    }
                }
            }
        }
    }
    (out, seen)
}

/// Lost wakes: a message pushed while a consumer of the group was parked reaches a consumer
/// within `bound_us` of the push's acknowledgment.
pub fn parked_consumers_served(events: &[Event], bound_us: i64) -> (Vec<Violation>, u32) {
    let mut first_delivery: BTreeMap<&str, Micros> = BTreeMap::new();
    for e in events {
        if let Event::Delivered { at, msgs, .. } = e {
            for m in msgs {
                first_delivery.entry(m.txid.as_str()).or_insert(*at);
            }
        }
    }
    // Pops pending at a time: invoked before it, completed after it.
    let pending: Vec<(Micros, Micros)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Delivered { invoked, at, .. } | Event::Empty { invoked, at, .. } => {
                Some((*invoked, *at))
            }
            _ => None,
        })
        .collect();
    let mut out = vec![];
    let mut covered = 0;
    for e in events {
        if let Event::Pushed { at, txids, .. } = e {
            if !pending.iter().any(|(i, c)| *i < *at && *c > *at) {
                continue;
            }
            for t in txids {
                covered += 1;
                match first_delivery.get(t.as_str()) {
                    Some(d) if d - at <= bound_us => {}
                    Some(d) => out.push(format!("stranded: {t} pushed at {at} us while a consumer was parked, delivered {} ms later", (d - at) / 1000)),
                    None => out.push(format!("stranded: {t} pushed at {at} us while a consumer was parked, never delivered")),
                }
            }
        }
    }
    (out, covered)
}
#[cfg(test)]
mod tests;
