//! Retention, eviction and the maintenance lease in the model: `retention_batch_v1` and its
//! siblings, one statement at a time, with the rules of `queen_core::storage::retention`.

use std::collections::BTreeSet;
use std::sync::Arc;

use queen_core::storage::{
    reads_from, removal, ConsumedFloor, Cutoffs, Removal, Removed, RetentionBatch, RetentionMark,
    RetentionPass, StorageError,
};
use queen_core::{Offset, Timestamp};

use crate::messages::lock_or_wait;
use crate::state::{DbState, MaintenanceLease, PartitionKey, RemovedMessages};
use crate::table::{Lock, TxId};
use crate::tx::{in_tx, Shared, StmtError, TaskCell};

pub(crate) async fn claim_maintenance(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    name: String,
    holder: String,
    seconds: u32,
) -> Result<bool, StorageError> {
    in_tx(&shared, "claim_maintenance_v1", cell, |tx| async move {
        let now = tx.now();
        tx.stmt("upsert lease", |st, t| {
            let until = now.plus_secs(i64::from(seconds));
            let lease = MaintenanceLease {
                holder: holder.clone(),
                until,
            };
            match st.maintenance.get(&name, t.id).cloned() {
                None => match st.maintenance.insert(name.clone(), lease, t.id) {
                    crate::table::Insert::Inserted => Ok(true),
                    crate::table::Insert::Exists => Ok(false),
                    crate::table::Insert::WaitFor(h) => Err(StmtError::Blocked(h)),
                },
                Some(cur) if cur.until <= now || cur.holder == holder => {
                    lock_or_wait(st.maintenance.update(&name, lease, t.id))
                }
                Some(_) => Ok(false),
            }
        })
        .await
    })
    .await
}

pub(crate) async fn release_maintenance(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    name: String,
    holder: String,
) -> Result<(), StorageError> {
    in_tx(&shared, "release_maintenance_v1", cell, |tx| async move {
        tx.stmt("end lease", |st, t| {
            if let Some(cur) = st.maintenance.get(&name, t.id).cloned() {
                if cur.holder == holder {
                    let ended = MaintenanceLease {
                        until: Timestamp(i64::MIN),
                        ..cur
                    };
                    lock_or_wait(st.maintenance.update(&name, ended, t.id))?;
                }
            }
            Ok(())
        })
        .await
    })
    .await
}

/// Queues with something for the pass to do, by name.
pub(crate) fn retention_queues(st: &DbState, pass: RetentionPass) -> Vec<String> {
    st.queues
        .iter(0)
        .filter(|(_, q)| {
            let c = &q.config;
            c.max_wait_time_seconds > 0
                || (pass == RetentionPass::Retention
                    && c.retention_enabled
                    && (c.retention_seconds > 0 || c.completed_retention_seconds > 0))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

pub(crate) async fn retention_batch(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    queue: String,
    pass: RetentionPass,
    after: Option<RetentionMark>,
    limit: u32,
) -> Result<RetentionBatch, StorageError> {
    let bugs = shared.bugs;
    let events = shared.clone();
    in_tx(&shared, "retention_batch_v1", cell, |tx| async move {
        let now = tx.now();
        let Some(config) = tx
            .stmt("queue", |st, t| {
                Ok(st.queues.get(&queue, t.id).map(|q| q.config.clone()))
            })
            .await?
        else {
            return Ok(RetentionBatch::default());
        };
        let cutoffs = Cutoffs::of(&config, pass, now);
        let Some(scan_before) = cutoffs.scan_before() else {
            return Ok(RetentionBatch::default());
        };
        // The candidates: (oldest_at, id) after the mark, oldest segment before the later cutoff.
        let limit = limit.max(1) as usize;
        let candidates: Vec<(Timestamp, String, PartitionKey)> = tx
            .stmt("candidates", |st, t| {
                let mut c: Vec<(Timestamp, String, PartitionKey)> = st
                    .partitions_of(&queue, t.id)
                    .filter_map(|(name, p)| {
                        let at = p.oldest_at.filter(|at| *at < scan_before)?;
                        let after_mark = after.as_ref().is_none_or(|m| {
                            (at, p.id.as_str()) > (m.oldest_at, m.partition_id.as_str())
                        });
                        after_mark.then(|| (at, p.id.clone(), (queue.clone(), name.to_string())))
                    })
                    .collect();
                c.sort();
                c.truncate(limit);
                Ok(c)
            })
            .await?;
        let mut batch = RetentionBatch {
            partitions_visited: candidates.len() as u32,
            next: (candidates.len() == limit)
                .then(|| candidates.last())
                .flatten()
                .map(|(at, id, _)| RetentionMark {
                    oldest_at: *at,
                    partition_id: id.clone(),
                }),
            ..RetentionBatch::default()
        };
        // The groups that read the queue: a subscription record and a cursor row somewhere on
        // it (a record without any is a deleted group's, and holds nothing back).
        let readers: BTreeSet<String> = if cutoffs.completed_before.is_some() {
            tx.stmt("reading groups", |st, t| {
                Ok(reading_groups(st, &queue, t.id))
            })
            .await?
        } else {
            BTreeSet::new()
        };
        for (_, pid, key) in candidates {
            // FOR NO KEY UPDATE SKIP LOCKED: a partition a push holds waits for the next cycle.
            let locked = tx
                .stmt("lock partition", |st, t| {
                    Ok(match st.partitions.lock(&key, t.id) {
                        Lock::Acquired => true,
                        Lock::HeldBy(_) | Lock::Missing => false,
                    })
                })
                .await?;
            if !locked {
                crate::tx::lock(&events.events).retention_skips += 1;
                continue;
            }
            let floor = tx
                .stmt("consumed floor", |st, t| {
                    Ok(cutoffs
                        .completed_before
                        .map(|_| consumed_floor(st, &queue, &pid, &readers, t.id, bugs)))
                })
                .await?;
            let removed = tx
                .stmt("remove segments", |st, t| {
                    remove_segments(st, t.id, &key, &pid, &cutoffs, floor.as_ref())
                })
                .await?;
            batch.removed += removed;
        }
        Ok(batch)
    })
    .await
}

fn reading_groups(st: &DbState, queue: &str, tx: TxId) -> BTreeSet<String> {
    let subscribed: BTreeSet<String> = st
        .metadata
        .range((queue.to_string(), String::new()).., tx)
        .take_while(|((q, _), _)| q == queue)
        .map(|((_, g), _)| g.clone())
        .collect();
    let mut reading = BTreeSet::new();
    for (_, p) in st.partitions_of(queue, tx) {
        for ((_, g), _) in st
            .consumers
            .range((p.id.clone(), String::new()).., tx)
            .take_while(|((pid, _), _)| *pid == p.id)
        {
            if subscribed.contains(g) {
                reading.insert(g.clone());
            }
        }
    }
    reading
}

/// What the partition's readers have consumed (`queen_core::storage::ConsumedFloor`).
fn consumed_floor(
    st: &DbState,
    queue: &str,
    pid: &str,
    readers: &BTreeSet<String>,
    tx: TxId,
    bugs: crate::SimBugs,
) -> ConsumedFloor {
    let rows: Vec<(String, Offset)> = st
        .consumers
        .range((pid.to_string(), String::new()).., tx)
        .take_while(|((p, _), _)| p == pid)
        .map(|((_, g), c)| (g.clone(), c.committed))
        .collect();
    let without_row = st
        .metadata
        .range((queue.to_string(), String::new()).., tx)
        .take_while(|((q, _), _)| q == queue)
        .filter(|_| !bugs.retention_ignores_groups_without_rows)
        .filter(|((_, g), _)| readers.contains(g) && !rows.iter().any(|(r, _)| r == g))
        .map(|((_, g), m)| reads_from(g, m.subscription_timestamp));
    ConsumedFloor::of(rows.iter().map(|(_, c)| *c).min(), without_row)
}

fn remove_segments(
    st: &mut DbState,
    tx: TxId,
    key: &PartitionKey,
    pid: &str,
    cutoffs: &Cutoffs,
    floor: Option<&ConsumedFloor>,
) -> Result<Removed, StmtError> {
    let no_floor = ConsumedFloor::of(None, []);
    let floor = floor.unwrap_or(&no_floor);
    let dead_lettered: Vec<Offset> = st
        .dlq
        .range((key.0.clone(), 0)..=(key.0.clone(), u64::MAX), tx)
        .filter(|(_, d)| d.partition_id == pid)
        .map(|(_, d)| d.offset)
        .collect();
    let gone: Vec<(Offset, Offset, Timestamp, Removal)> = st
        .segments
        .range(
            (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX),
            tx,
        )
        .filter_map(|((_, base), s)| {
            let pinned = dead_lettered
                .iter()
                .any(|o| (*base..=s.end_offset).contains(o));
            removal(cutoffs, floor, s.created_at, s.end_offset, pinned)
                .map(|why| (*base, s.end_offset, s.created_at, why))
        })
        .collect();
    let mut removed = Removed::default();
    if gone.is_empty() {
        return Ok(removed);
    }
    let txids: Vec<((String, String), Offset)> = st
        .txids
        .range((pid.to_string(), String::new()).., tx)
        .take_while(|((p, _), _)| p == pid)
        .map(|(k, r)| (k.clone(), r.offset))
        .collect();
    // Every row first: a statement that must wait changes nothing.
    let dlq_keys: Vec<(String, u64)> = st
        .dlq
        .range((key.0.clone(), 0)..=(key.0.clone(), u64::MAX), tx)
        .filter(|(_, d)| d.partition_id == pid)
        .map(|(k, _)| k.clone())
        .collect();
    for (base, ..) in &gone {
        wait_if_held(st.segments.locked_by_other(&(pid.to_string(), *base), tx))?;
    }
    for (k, _) in &txids {
        wait_if_held(st.txids.locked_by_other(k, tx))?;
    }
    for k in &dlq_keys {
        wait_if_held(st.dlq.locked_by_other(k, tx))?;
    }
    let trace_keys: Vec<((String, i64), Offset)> = st
        .traces
        .range(
            (pid.to_string(), i64::MIN)..=(pid.to_string(), i64::MAX),
            tx,
        )
        .map(|(k, t)| (k.clone(), t.offset))
        .collect();
    for (k, _) in &trace_keys {
        wait_if_held(st.traces.locked_by_other(k, tx))?;
    }
    for (base, end, created_at, reason) in &gone {
        lock_or_wait(st.segments.delete(&(pid.to_string(), *base), tx))?;
        removed.segments += 1;
        removed.messages += u64::try_from(end - base + 1).unwrap_or(0);
        let mut transaction_ids = vec![];
        for (k, offset) in txids.iter().filter(|(_, o)| (*base..=*end).contains(o)) {
            lock_or_wait(st.txids.delete(k, tx))?;
            removed.dedup_rows += 1;
            transaction_ids.push((*offset, k.1.clone()));
        }
        transaction_ids.sort();
        for (k, _) in trace_keys
            .iter()
            .filter(|(_, o)| (*base..=*end).contains(o))
        {
            lock_or_wait(st.traces.delete(k, tx))?;
        }
        if *reason == Removal::Expired {
            let dlq: Vec<(String, u64)> = st
                .dlq
                .range((key.0.clone(), 0)..=(key.0.clone(), u64::MAX), tx)
                .filter(|(_, d)| d.partition_id == pid && (*base..=*end).contains(&d.offset))
                .map(|(k, _)| k.clone())
                .collect();
            for k in dlq {
                lock_or_wait(st.dlq.delete(&k, tx))?;
                removed.dead_letters += 1;
            }
        }
        st.note_removal(
            tx,
            RemovedMessages {
                queue: key.0.clone(),
                partition: key.1.clone(),
                base_offset: *base,
                end_offset: *end,
                created_at: *created_at,
                reason: *reason,
                transaction_ids: transaction_ids.into_iter().map(|(_, t)| t).collect(),
                committed_at: Timestamp::EPOCH,
            },
        );
    }
    refresh_oldest_at(st, key, pid, tx)?;
    Ok(removed)
}

/// Sets a partition's `oldest_at` to its first remaining segment's time (`None`: none left), as
/// every removal does under the partition's lock.
pub(crate) fn refresh_oldest_at(
    st: &mut DbState,
    key: &PartitionKey,
    pid: &str,
    tx: TxId,
) -> Result<(), StmtError> {
    let oldest = st
        .segments
        .range(
            (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX),
            tx,
        )
        .next()
        .map(|(_, s)| s.created_at);
    if let Some(mut part) = st.partitions.get(key, tx).cloned() {
        part.oldest_at = oldest;
        lock_or_wait(st.partitions.update(key, part, tx))?;
    }
    Ok(())
}

fn wait_if_held(holder: Option<TxId>) -> Result<(), StmtError> {
    match holder {
        Some(h) => Err(StmtError::Blocked(h)),
        None => Ok(()),
    }
}

pub(crate) async fn remove_inactive_partitions(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    inactive_secs: u64,
    limit: u32,
) -> Result<u64, StorageError> {
    in_tx(
        &shared,
        "remove_inactive_partitions_v1",
        cell,
        |tx| async move {
            let now = tx.now();
            let cutoff =
                now.minus_secs(i64::try_from(inactive_secs).unwrap_or(i64::MAX / 2_000_000));
            tx.stmt("delete partitions", |st, t| {
                let mut candidates: Vec<(Timestamp, PartitionKey, String)> = st
                    .partitions
                    .iter(t.id)
                    .filter(|(_, p)| p.oldest_at.is_none() && p.last_write_at < cutoff)
                    .filter(|(_, p)| {
                        !st.consumers
                            .range((p.id.clone(), String::new()).., t.id)
                            .take_while(|((pid, _), _)| *pid == p.id)
                            .any(|(_, c)| c.lease_expires_at.is_some_and(|e| e > now))
                    })
                    .map(|(k, p)| (p.last_write_at, k.clone(), p.id.clone()))
                    .collect();
                candidates.sort();
                let mut n = 0;
                for (_, key, pid) in candidates {
                    if n >= u64::from(limit.max(1)) {
                        break;
                    }
                    // SKIP LOCKED, on the partition and on what the delete cascades to.
                    let cursors = st.consumers.keys_of(&pid, String::new(), t.id);
                    let txids = st.txids.keys_of(&pid, String::new(), t.id);
                    let held = st.partitions.locked_by_other(&key, t.id).is_some()
                        || cursors
                            .iter()
                            .any(|k| st.consumers.locked_by_other(k, t.id).is_some())
                        || txids
                            .iter()
                            .any(|k| st.txids.locked_by_other(k, t.id).is_some());
                    let state = crate::streams::state_keys_of_partition(st, &pid, t.id);
                    let held = held
                        || st.partition_ids.locked_by_other(&pid, t.id).is_some()
                        || state
                            .iter()
                            .any(|k| st.stream_state.locked_by_other(k, t.id).is_some());
                    if held {
                        continue;
                    }
                    for k in &state {
                        st.stream_state.delete(k, t.id);
                    }
                    for k in &cursors {
                        st.consumers.delete(k, t.id);
                    }
                    for k in &txids {
                        st.txids.delete(k, t.id);
                    }
                    // A trace cannot outlive its message, so an empty partition holds none;
                    // this is PostgreSQL's cascade, for completeness.
                    st.traces.delete_all_of(&pid, i64::MIN, t.id);
                    if let Some(n) = st.partitions.get(&key, t.id).map(|p| p.number) {
                        st.partition_numbers.delete(&n, t.id);
                    }
                    st.partition_ids.delete(&pid, t.id);
                    st.partitions.delete(&key, t.id);
                    n += 1;
                }
                Ok(n)
            })
            .await
        },
    )
    .await
}

pub(crate) async fn remove_old_dead_letters(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    older_than_secs: u64,
    limit: u32,
) -> Result<u64, StorageError> {
    in_tx(&shared, "remove_old_dead_letters", cell, |tx| async move {
        let cutoff = tx
            .now()
            .minus_secs(i64::try_from(older_than_secs).unwrap_or(i64::MAX / 2_000_000));
        tx.stmt("delete dead letters", |st, t| {
            let mut old: Vec<(Timestamp, (String, u64))> = st
                .dlq
                .iter(t.id)
                .filter(|(_, d)| d.failed_at < cutoff)
                .map(|(k, d)| (d.failed_at, k.clone()))
                .collect();
            old.sort();
            old.truncate(limit.max(1) as usize);
            for (_, k) in &old {
                lock_or_wait(st.dlq.delete(k, t.id))?;
            }
            Ok(old.len() as u64)
        })
        .await
    })
    .await
}
