//! The admin API's reads in the model: the same answers as `storage-pg/src/inspect/`, read
//! from committed state (tx 0), as PostgreSQL's read-committed statements would.

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_core::storage::{
    CreatedCount, CursorView, DeadLetterRef, PartitionView, QueueFilter, QueueView, SegmentQuery,
    SegmentRow, StorageError, StoredMessage, StoredSegment, TraceInput, TraceName, TraceRecord,
    WorkerSample,
};
use queen_core::{Offset, Timestamp};

use crate::messages::{insert_or_wait, lock_or_wait};
use crate::state::{DbState, PartitionRow, TraceRow};
use crate::tx::{in_tx, Shared, TaskCell};

const COMMITTED: u64 = 0;

fn parse_uuid(id: &str) -> Result<String, StorageError> {
    uuid::Uuid::parse_str(id)
        .map(|u| u.to_string())
        .map_err(|_| StorageError::Invalid(format!("partitionId must be a UUID, got {id:?}")))
}

fn first_segment(st: &DbState, pid: &str) -> Option<(Offset, Timestamp)> {
    st.segments
        .range(
            (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX),
            COMMITTED,
        )
        .next()
        .map(|((_, b), s)| (*b, s.created_at))
}

/// created_at of the segment holding the first message after `committed`, or of the next one
/// (retention removed it).
fn oldest_unconsumed(st: &DbState, pid: &str, committed: Offset) -> Option<Timestamp> {
    st.segments
        .range(
            (pid.to_string(), committed + 1)..=(pid.to_string(), Offset::MAX),
            COMMITTED,
        )
        .next()
        .map(|(_, s)| s.created_at)
        .into_iter()
        .chain(
            st.segments
                .range(
                    (pid.to_string(), Offset::MIN)..=(pid.to_string(), committed + 1),
                    COMMITTED,
                )
                .next_back()
                .filter(|(_, s)| s.end_offset > committed)
                .map(|(_, s)| s.created_at),
        )
        .min()
}

fn view(
    st: &DbState,
    queue: &str,
    name: &str,
    p: &PartitionRow,
    group: Option<&str>,
    now: Timestamp,
) -> PartitionView {
    let head = first_segment(st, &p.id);
    let newest = st
        .segments
        .range(
            (p.id.clone(), Offset::MIN)..=(p.id.clone(), Offset::MAX),
            COMMITTED,
        )
        .next_back()
        .map(|(_, s)| s.created_at);
    let cursors = st
        .consumers
        .range((p.id.clone(), String::new()).., COMMITTED)
        .take_while(|((pid, _), _)| *pid == p.id)
        .filter(|((_, g), _)| group.is_none_or(|want| want == g))
        .map(|((_, g), c)| {
            let live = c.worker_id.is_some() && c.lease_expires_at.is_some_and(|t| t > now);
            CursorView {
                group: g.clone(),
                committed: c.committed,
                leased_until: c.lease_expires_at.filter(|_| live),
                leased_through: c.batch_end.filter(|_| live),
                worker_id: c.worker_id.map(|w| w.to_string()),
                total_consumed: c.total_consumed,
                oldest_unconsumed_at: (c.committed < p.last_offset)
                    .then(|| oldest_unconsumed(st, &p.id, c.committed))
                    .flatten(),
            }
        })
        .collect();
    PartitionView {
        queue: queue.to_string(),
        partition: name.to_string(),
        partition_id: p.id.clone(),
        created_at: p.created_at,
        last_offset: p.last_offset,
        log_start: head.map_or(p.last_offset + 1, |(b, _)| b),
        oldest_at: head.map(|(_, t)| t),
        newest_at: newest,
        cursors,
    }
}

pub(crate) fn queue_views(st: &DbState, f: &QueueFilter) -> Vec<QueueView> {
    let mut out: Vec<QueueView> = st
        .queues
        .iter(COMMITTED)
        .filter(|(_, q)| f.matches(&q.config))
        .map(|(name, q)| {
            let mut groups: Vec<String> = vec![];
            for (_, p) in st.partitions_of(name, COMMITTED) {
                groups.extend(
                    st.consumers
                        .range((p.id.clone(), String::new()).., COMMITTED)
                        .take_while(|((pid, _), _)| *pid == p.id)
                        .map(|((_, g), _)| g.clone()),
                );
            }
            groups.extend(
                st.metadata
                    .range((name.clone(), String::new()).., COMMITTED)
                    .take_while(|((q, _), _)| q == name)
                    .map(|((_, g), _)| g.clone()),
            );
            groups.sort();
            groups.dedup();
            let conflating_groups = st
                .metadata
                .range((name.clone(), String::new()).., COMMITTED)
                .take_while(|((q, _), _)| q == name)
                .filter(|(_, m)| m.conflation)
                .map(|((_, g), _)| g.clone())
                .collect();
            let dead_letters = st
                .dlq
                .range((name.clone(), 0)..=(name.clone(), u64::MAX), COMMITTED)
                .count() as u64;
            QueueView {
                id: q.id.clone(),
                created_at: q.created_at,
                config: q.config.clone(),
                dead_letters,
                groups,
                conflating_groups,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.config.name.cmp(&b.config.name))
    });
    out
}

pub(crate) fn partition_views_page(
    st: &DbState,
    queue: &str,
    after: Option<&str>,
    limit: u32,
    group: Option<&str>,
    now: Timestamp,
) -> Vec<PartitionView> {
    st.partitions
        .range(
            (queue.to_string(), after.unwrap_or("").to_string())..,
            COMMITTED,
        )
        .take_while(|((q, _), _)| q == queue)
        .filter(|((_, n), _)| after.is_none_or(|a| n.as_str() > a))
        .take(limit as usize)
        .map(|((q, n), p)| view(st, q, n, p, group, now))
        .collect()
}

pub(crate) fn partition_views_by_id(
    st: &DbState,
    ids: &[String],
    now: Timestamp,
) -> Vec<PartitionView> {
    let mut names: Vec<(String, String)> = ids
        .iter()
        .filter_map(|id| st.partition_ids.get(id, COMMITTED).cloned())
        .collect();
    names.sort();
    names.dedup();
    names
        .iter()
        .filter_map(|key| {
            let p = st.partitions.get(key, COMMITTED)?;
            Some(view(st, &key.0, &key.1, p, None, now))
        })
        .collect()
}

pub(crate) fn segments(st: &DbState, q: &SegmentQuery) -> Vec<StoredSegment> {
    let mut found: Vec<StoredSegment> = st
        .segments
        .iter(COMMITTED)
        .filter_map(|((pid, base), s)| {
            let (queue, partition) = st.partition_ids.get(pid, COMMITTED)?;
            let wanted = q.queue.as_ref().is_none_or(|w| w == queue)
                && q.partition.as_ref().is_none_or(|w| w == partition)
                && q.from.is_none_or(|f| s.created_at >= f)
                && q.to.is_none_or(|t| s.created_at < t)
                && q.after.as_ref().is_none_or(|m| {
                    (s.created_at, pid.as_str(), *base)
                        < (m.created_at, m.partition_id.as_str(), m.base_offset)
                });
            let count = s.message_count(*base);
            wanted.then(|| StoredSegment {
                queue: queue.clone(),
                partition: partition.clone(),
                partition_id: pid.clone(),
                row: SegmentRow {
                    base_offset: *base,
                    start_idx: 0,
                    take: count,
                    msg_count: count,
                    created_at: s.created_at,
                    blob: s.blob.clone(),
                },
            })
        })
        .collect();
    found.sort_by(|a, b| {
        (b.row.created_at, &b.partition_id, b.row.base_offset).cmp(&(
            a.row.created_at,
            &a.partition_id,
            a.row.base_offset,
        ))
    });
    found.truncate(q.limit as usize);
    found
}

pub(crate) fn messages_created(
    st: &DbState,
    from: Timestamp,
    to: Timestamp,
    width_secs: i64,
    queue: Option<&str>,
) -> Vec<CreatedCount> {
    let width = width_secs.max(1) * 1_000_000;
    let mut counts: BTreeMap<(String, Timestamp), u64> = BTreeMap::new();
    for ((pid, base), s) in st.segments.iter(COMMITTED) {
        let Some((q, _)) = st.partition_ids.get(pid, COMMITTED) else {
            continue;
        };
        if queue.is_some_and(|w| w != q) || s.created_at < from || s.created_at >= to {
            continue;
        }
        let bucket = Timestamp(s.created_at.0 - s.created_at.0.rem_euclid(width));
        *counts.entry((q.clone(), bucket)).or_default() += u64::from(s.message_count(*base));
    }
    counts
        .into_iter()
        .map(|((queue, bucket), messages)| CreatedCount {
            queue,
            bucket,
            messages,
        })
        .collect()
}

pub(crate) fn message(
    st: &DbState,
    partition_id: &str,
    transaction_id: &str,
    now: Timestamp,
) -> Result<Option<StoredMessage>, StorageError> {
    let pid = parse_uuid(partition_id)?;
    let Some(txid) = st
        .txids
        .get(&(pid.clone(), transaction_id.to_string()), COMMITTED)
    else {
        return Ok(None);
    };
    let offset = txid.offset;
    let Some(((_, base), s)) = st
        .segments
        .range(
            (pid.clone(), Offset::MIN)..=(pid.clone(), offset),
            COMMITTED,
        )
        .next_back()
    else {
        return Ok(None);
    };
    if s.end_offset < offset {
        return Ok(None);
    }
    let Some((queue, name)) = st.partition_ids.get(&pid, COMMITTED) else {
        return Ok(None);
    };
    let Some(p) = st.partitions.get(&(queue.clone(), name.clone()), COMMITTED) else {
        return Ok(None);
    };
    let dead_letters = st
        .dlq
        .range((queue.clone(), 0)..=(queue.clone(), u64::MAX), COMMITTED)
        .filter(|(_, d)| d.partition_id == pid && d.offset == offset)
        .map(|((_, id), d)| DeadLetterRef {
            id: i64::try_from(*id).unwrap_or(i64::MAX),
            group: d.group.clone(),
            error: d.error.clone(),
            retry_count: d.retry_count,
            failed_at: d.failed_at,
        })
        .collect();
    Ok(Some(StoredMessage {
        offset,
        segment: SegmentRow {
            base_offset: *base,
            start_idx: u32::try_from(offset - base).unwrap_or(0),
            take: 1,
            msg_count: s.message_count(*base),
            created_at: s.created_at,
            blob: s.blob.clone(),
        },
        partition: view(st, queue, name, p, None, now),
        dead_letters,
    }))
}

pub(crate) async fn delete_dead_letters_of(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    partition_id: String,
    transaction_id: String,
) -> Result<u64, StorageError> {
    let pid = parse_uuid(&partition_id)?;
    in_tx(&shared, "delete_dead_letters_of", cell, |tx| async move {
        tx.stmt("delete the message's dead letters", |st, t| {
            let Some((queue, _)) = st.partition_ids.get(&pid, t.id).cloned() else {
                return Ok(0);
            };
            let keys: Vec<(String, u64)> = st
                .dlq
                .range((queue.clone(), 0)..=(queue.clone(), u64::MAX), t.id)
                .filter(|(_, d)| d.partition_id == pid && d.transaction_id == transaction_id)
                .map(|(k, _)| k.clone())
                .collect();
            let mut n = 0;
            for k in keys {
                if lock_or_wait(st.dlq.delete(&k, t.id))? {
                    n += 1;
                }
            }
            Ok(n)
        })
        .await
    })
    .await
}

pub(crate) async fn add_trace(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    trace: TraceInput,
) -> Result<Option<i64>, StorageError> {
    let by_number = queen_core::storage::partition_number(&trace.partition_id).is_some();
    let reference = if by_number {
        trace.partition_id.clone()
    } else {
        parse_uuid(&trace.partition_id)?
    };
    in_tx(&shared, "add_trace", cell, |tx| async move {
        let now = tx.now();
        tx.stmt("insert the trace", |st, t| {
            // A framed pop names partitions by number: its messages' traces do too.
            let Some(pid) = st.partition_by_ref(&reference, t.id) else {
                return Ok(None);
            };
            let Some(txid) = st
                .txids
                .get(&(pid.clone(), trace.transaction_id.clone()), t.id)
            else {
                return Ok(None);
            };
            let offset = txid.offset;
            st.trace_seq += 1;
            let id = st.trace_seq;
            let mut names = trace.names.clone();
            names.sort();
            names.dedup();
            let row = TraceRow {
                transaction_id: trace.transaction_id.clone(),
                offset,
                group: trace.group.clone(),
                event_type: trace.event_type.clone(),
                data: trace.data.clone(),
                worker_id: trace.worker_id.clone(),
                names,
                created_at: now,
            };
            insert_or_wait(&mut st.traces, (pid.clone(), id), row, t.id)?;
            Ok(Some(id))
        })
        .await
    })
    .await
}

fn record(st: &DbState, pid: &str, id: i64, t: &TraceRow) -> Option<TraceRecord> {
    let (queue, partition) = st.partition_ids.get(&pid.to_string(), COMMITTED)?;
    Some(TraceRecord {
        id,
        partition_id: pid.to_string(),
        transaction_id: t.transaction_id.clone(),
        queue: queue.clone(),
        partition: partition.clone(),
        group: t.group.clone(),
        event_type: t.event_type.clone(),
        data: t.data.clone(),
        worker_id: t.worker_id.clone(),
        names: t.names.clone(),
        created_at: t.created_at,
    })
}

pub(crate) fn traces_of(
    st: &DbState,
    partition_id: &str,
    transaction_id: &str,
) -> Result<Vec<TraceRecord>, StorageError> {
    let pid = parse_uuid(partition_id)?;
    Ok(st
        .traces
        .range((pid.clone(), i64::MIN)..=(pid.clone(), i64::MAX), COMMITTED)
        .filter(|(_, t)| t.transaction_id == transaction_id)
        .filter_map(|((p, id), t)| record(st, p, *id, t))
        .collect())
}

pub(crate) fn traces_named(
    st: &DbState,
    name: &str,
    limit: u32,
    offset: u32,
) -> (Vec<TraceRecord>, u64) {
    let mut all: Vec<TraceRecord> = st
        .traces
        .iter(COMMITTED)
        .filter(|(_, t)| t.names.iter().any(|n| n == name))
        .filter_map(|((p, id), t)| record(st, p, *id, t))
        .collect();
    all.sort_by_key(|t| std::cmp::Reverse(t.id));
    let total = all.len() as u64;
    let page = all
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    (page, total)
}

pub(crate) fn trace_names(st: &DbState, limit: u32, offset: u32) -> (Vec<TraceName>, u64) {
    use std::collections::BTreeSet;
    /// Per name: traces, the (partition, transactionId) messages they are of, last seen.
    type NameTally<'a> = (u64, BTreeSet<(&'a str, &'a str)>, Timestamp);
    let mut by_name: BTreeMap<&str, NameTally> = BTreeMap::new();
    for ((pid, _), t) in st.traces.iter(COMMITTED) {
        for n in &t.names {
            let e = by_name
                .entry(n.as_str())
                .or_insert((0, BTreeSet::new(), Timestamp::EPOCH));
            e.0 += 1;
            e.1.insert((pid.as_str(), t.transaction_id.as_str()));
            e.2 = e.2.max(t.created_at);
        }
    }
    let mut names: Vec<TraceName> = by_name
        .into_iter()
        .map(|(name, (traces, messages, last_seen))| TraceName {
            name: name.to_string(),
            traces,
            messages: messages.len() as u64,
            last_seen,
        })
        .collect();
    names.sort_by(|a, b| {
        b.last_seen
            .cmp(&a.last_seen)
            .then_with(|| a.name.cmp(&b.name))
    });
    let total = names.len() as u64;
    (
        names
            .into_iter()
            .skip(offset as usize)
            .take(limit as usize)
            .collect(),
        total,
    )
}

pub(crate) fn record_sample(st: &mut DbState, s: WorkerSample) {
    let key = (s.bucket, s.hostname.clone(), s.worker_id.clone());
    match st.samples.get_mut(&key) {
        Some(old) => {
            old.push_requests += s.push_requests;
            old.push_messages += s.push_messages;
            old.pop_requests += s.pop_requests;
            old.pop_messages += s.pop_messages;
            old.pop_empty += s.pop_empty;
            old.ack_requests += s.ack_requests;
            old.ack_messages += s.ack_messages;
            old.ack_failed += s.ack_failed;
            old.dead_lettered += s.dead_lettered;
            old.db_errors += s.db_errors;
            old.lag_avg_ms = s.lag_avg_ms;
            old.lag_max_ms = old.lag_max_ms.max(s.lag_max_ms);
            old.cpu_user_pct = s.cpu_user_pct;
            old.cpu_system_pct = s.cpu_system_pct;
            old.rss_bytes = s.rss_bytes;
            old.pool_size = s.pool_size;
            old.pool_in_use = s.pool_in_use;
            old.parked = s.parked;
        }
        None => {
            st.samples.insert(key, s);
        }
    }
}

pub(crate) fn samples(st: &DbState, from: Timestamp, to: Timestamp) -> Vec<WorkerSample> {
    st.samples
        .range((from, String::new(), String::new())..)
        .take_while(|((b, _, _), _)| *b < to)
        .map(|(_, s)| s.clone())
        .collect()
}

pub(crate) fn remove_samples_before(st: &mut DbState, before: Timestamp) -> u64 {
    let keep = st
        .samples
        .split_off(&(before, String::new(), String::new()));
    let removed = st.samples.len() as u64;
    st.samples = keep;
    removed
}

/// `InspectStorage::store_totals`: the later pass stays.
pub(crate) fn store_totals(st: &mut DbState, totals: &queen_core::storage::StoredTotals) {
    let later = st
        .stored_totals
        .as_ref()
        .is_none_or(|kept| totals.taken_at > kept.taken_at);
    if later {
        st.stored_totals = Some(totals.clone());
    }
}

/// `InspectStorage::stored_totals`.
pub(crate) fn stored_totals(
    st: &DbState,
    newer_than: Option<Timestamp>,
) -> Option<queen_core::storage::StoredTotals> {
    st.stored_totals
        .as_ref()
        .filter(|kept| newer_than.is_none_or(|t| kept.taken_at > t))
        .cloned()
}
