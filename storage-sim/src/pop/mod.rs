//! The pop procedures: `log_pop_v2` and its three callers, statement by statement as in SQL.
//!
//! This file is `log_pop_v2` for one partition, step by step. `callers.rs` holds its three
//! callers (`log_pop_loop_v2` over the ring's candidates, `log_pop_specific_v2` for a named
//! partition, the wildcard scan), `scan.rs` the wildcard's own statements (group first contact,
//! the candidate scan, the empty-scan watermark), and `pending.rs` what is pending without a
//! claim (the legacy path's probe, the reseed's list, the simulation's liveness oracle).

mod callers;
mod pending;
mod scan;

pub(crate) use callers::{pop_list, pop_partition, pop_wildcard};
pub(crate) use pending::{
    deliverable_now, deliverable_partitions, next_pending, pending_partitions,
};

use std::sync::Arc;

use queen_core::claim::{
    apply_auto_ack, apply_lease, conflated_slice, delay_visible, plan_scan, seal_target,
    seed_cursor, seed_rule, ttl_skip_to, window_hold_until, CursorRow, SegmentMeta,
    SubscriptionRecord,
};
use queen_core::params::effective_lease_seconds;
use queen_core::storage::{Claim, PopRequest, SegmentRow, StorageError, Verdict};
use queen_core::{Offset, Timestamp};

use crate::state::{advisory_key, DbState};
use crate::table::{Insert, Lock};
use crate::tx::{lock, Shared, StmtError, TxHandle};

/// The advisory try-lock keys (the same numbers as the PostgreSQL procedures): 42 for cursor-row
/// creation, 43 for group-first-contact election, 44 for the watermark row.
const CURSOR_CREATE_SEED: u64 = 42;
const FIRST_CONTACT_SEED: u64 = 43;
const WATERMARK_SEED: u64 = 44;

struct QueueGates {
    delayed_processing_secs: u32,
    window_buffer_secs: u32,
    lease_time_secs: u32,
    ttl_secs: u32,
}

fn load_gates(st: &DbState, queue: &str, tx: u64) -> Option<QueueGates> {
    st.queues.get(&queue.to_string(), tx).map(|q| QueueGates {
        delayed_processing_secs: q.config.delayed_processing_secs,
        window_buffer_secs: q.config.window_buffer_secs,
        lease_time_secs: q.config.lease_time_secs,
        ttl_secs: q.config.ttl_secs,
    })
}

/// The key range of a partition's segments.
fn segments_of(pid: &str) -> std::ops::RangeInclusive<(String, Offset)> {
    (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX)
}

fn meta(st: &DbState, pid: &str, base: Offset, tx: u64) -> Option<SegmentMeta> {
    st.segments
        .get(&(pid.to_string(), base), tx)
        .map(|s| SegmentMeta {
            base_offset: base,
            end_offset: s.end_offset,
            created_at: s.created_at,
        })
}

/// The claim: `SELECT committed ... FOR UPDATE SKIP LOCKED` with the lease filter.
fn claim_row(
    st: &mut DbState,
    key: &(String, String),
    now: Timestamp,
    tx: u64,
) -> Result<Option<Offset>, StmtError> {
    if st.consumers.locked_by_other(key, tx).is_some() {
        return Ok(None);
    }
    match st.consumers.get(key, tx) {
        Some(row) if row.claimable(now) => {
            let committed = row.committed;
            match st.consumers.lock(key, tx) {
                Lock::Acquired => Ok(Some(committed)),
                _ => Ok(None),
            }
        }
        _ => Ok(None),
    }
}

/// `log_pop_v2` for one partition. Returns the claim (if any messages were taken) and the verdict.
/// Each step below is its own function, in the procedure's order; their statements (the model's
/// scheduling points) are those of the procedure, one for one.
#[allow(clippy::too_many_arguments)]
async fn log_pop_v2(
    shared: &Arc<Shared>,
    tx: &TxHandle,
    req: &PopRequest,
    queue_gates: &QueueGates,
    partition: &str,
    pid: &str,
    budget: u32,
    conflate: bool,
) -> Result<(Option<Claim>, Verdict), StorageError> {
    let now = tx.now();
    let key = (pid.to_string(), req.group.clone());

    // Step 2: windowBuffer debounce (bypassed on the ring path, where the wheel owns it).
    if !req.skip_window_debounce && queue_gates.window_buffer_secs > 0 {
        if let Some(until) = window_hold(tx, pid, queue_gates, now).await? {
            return Ok((None, Verdict::DeferredUntil(until)));
        }
    }
    // Steps 3 and 4: claim the cursor row, creating it on first contact.
    let committed = match claim_or_create(shared, tx, req, partition, pid, &key, now).await? {
        Ok(committed) => committed,
        Err(verdict) => return Ok((None, verdict)),
    };
    let committed = if queue_gates.ttl_secs > 0 {
        expire_ttl(tx, pid, &key, committed, queue_gates, now).await?
    } else {
        committed
    };
    // Step 5: head probe (one backward step), then the forward scan to the budget. A conflating
    // group takes the newest visible message alone, retiring those before it; with none past
    // the cursor, the scan (budget 0) says only whether one is deferred.
    let conflated = if conflate {
        conflate_newest(shared, tx, pid, &key, committed + 1, queue_gates, now).await?
    } else {
        None
    };
    let (rows, deferred) = match conflated {
        Some(row) => (vec![row], None),
        None if conflate => scan(tx, pid, committed + 1, 0, queue_gates, now).await?,
        None => scan(tx, pid, committed + 1, budget, queue_gates, now).await?,
    };
    let taken: u32 = rows.iter().map(|r| r.take).sum();
    if taken == 0 {
        if let Some(until) = deferred {
            return Ok((None, Verdict::DeferredUntil(until)));
        }
        if !shared.bugs.no_cursor_seal {
            seal_empty(shared, tx, req, partition, pid, &key, committed).await?;
        }
        return Ok((None, Verdict::Empty));
    }
    // A gap below the first segment (retention removed a prefix the cursor had not reached):
    // the batch starts where its first row does.
    let first = rows
        .first()
        .map_or(committed + 1, |r| r.base_offset + i64::from(r.start_idx));
    let last = first + i64::from(taken) - 1;
    let drained = drained_by(tx, pid, rows.last(), last).await?;
    // Step 6: autoAck or lease.
    let (attempt_count, leased_until) =
        deliver(tx, req, queue_gates, &key, first, last, taken, now).await?;
    let leased_until = if req.auto_ack { None } else { leased_until };
    let claim = Claim {
        queue: req.queue.clone(),
        partition: partition.to_string(),
        partition_id: pid.to_string(),
        first_offset: first,
        last_offset: last,
        attempt_count: if req.auto_ack { 1 } else { attempt_count },
        lease_expires_at: leased_until,
        rows,
    };
    Ok((
        Some(claim),
        Verdict::Took {
            count: taken,
            leased_until,
            drained,
        },
    ))
}

/// Conflation: the newest visible segment, in one statement; when it holds a message past the
/// cursor, the cursor moves to just before its newest message (the ones behind it are retired)
/// and that message is the batch.
async fn conflate_newest(
    shared: &Arc<Shared>,
    tx: &TxHandle,
    pid: &str,
    key: &(String, String),
    wanted: Offset,
    queue_gates: &QueueGates,
    now: Timestamp,
) -> Result<Option<SegmentRow>, StorageError> {
    let commits_at_claim = shared.bugs.conflation_commits_at_claim;
    tx.stmt("conflation: newest visible", |st, t| {
        let newest = st
            .segments
            .range(segments_of(pid), t.id)
            .rev()
            .map(|((_, base), s)| SegmentMeta {
                base_offset: *base,
                end_offset: s.end_offset,
                created_at: s.created_at,
            })
            .find(|s| delay_visible(s, queue_gates.delayed_processing_secs, now));
        let Some(slice) = conflated_slice(wanted, newest) else {
            return Ok(None);
        };
        let offset = slice.base_offset + i64::from(slice.start_idx);
        let mut row = st.consumers.get(key, t.id).cloned().ok_or_else(|| {
            StmtError::Abort(StorageError::Internal("claimed cursor row vanished".into()))
        })?;
        row.commit_through(if commits_at_claim { offset } else { offset - 1 });
        st.consumers.update(key, row, t.id);
        let blob = st
            .segments
            .get(&(pid.to_string(), slice.base_offset), t.id)
            .map(|s| s.blob.clone())
            .ok_or_else(|| {
                StmtError::Abort(StorageError::Internal("newest segment vanished".into()))
            })?;
        Ok(Some(SegmentRow {
            base_offset: slice.base_offset,
            start_idx: slice.start_idx,
            take: slice.take,
            msg_count: slice.msg_count,
            created_at: slice.created_at,
            blob,
        }))
    })
    .await
}

/// The procedure's probe past a batch (its `took_all`): a batch that ends inside a segment is
/// never the end; otherwise drained when no visible segment starts after `last`.
async fn drained_by(
    tx: &TxHandle,
    pid: &str,
    last_row: Option<&SegmentRow>,
    last: Offset,
) -> Result<bool, StorageError> {
    if last_row.is_none_or(|r| r.start_idx + r.take < r.msg_count) {
        return Ok(false);
    }
    tx.stmt("drained probe", |st, t| {
        Ok(st
            .segments
            .range(
                (pid.to_string(), last + 1)..=(pid.to_string(), Offset::MAX),
                t.id,
            )
            .next()
            .is_none())
    })
    .await
}

/// Step 2: while the partition's newest segment is younger than the window, the end of the hold.
async fn window_hold(
    tx: &TxHandle,
    pid: &str,
    queue_gates: &QueueGates,
    now: Timestamp,
) -> Result<Option<Timestamp>, StorageError> {
    tx.stmt("window gate", |st, t| {
        let newest = st
            .segments
            .range(segments_of(pid), t.id)
            .next_back()
            .map(|(_, s)| s.created_at);
        Ok(window_hold_until(
            newest,
            queue_gates.window_buffer_secs,
            now,
        ))
    })
    .await
}

/// Steps 3 and 4: claim-first; on a missing row, create it under the advisory try-lock (seeded
/// where the group starts) and claim again. `Ok(Err(verdict))`: nothing claimable (leased,
/// or busy: another pop holds the row or is creating it).
async fn claim_or_create(
    shared: &Arc<Shared>,
    tx: &TxHandle,
    req: &PopRequest,
    partition: &str,
    pid: &str,
    key: &(String, String),
    now: Timestamp,
) -> Result<Result<Offset, Verdict>, StorageError> {
    let bugs = shared.bugs;
    if bugs.per_pop_insert_on_conflict {
        // The historical shape: an unconditional INSERT ... ON CONFLICT DO NOTHING per pop. It
        // waits on any transaction inserting or updating the row.
        tx.stmt("insert on conflict (historical)", |st, t| {
            match st
                .consumers
                .insert(key.clone(), CursorRow::seeded(-1), t.id)
            {
                Insert::WaitFor(holder) => Err(StmtError::Blocked(holder)),
                _ => Ok(()),
            }
        })
        .await?;
    }

    // Step 4: claim-first.
    let committed = tx
        .stmt("claim", |st, t| {
            let r = claim_row(st, key, now, t.id)?;
            if r.is_none() && st.consumers.locked_by_other(key, t.id).is_some() {
                lock(&shared.events).skip_locked += 1;
            }
            Ok(r)
        })
        .await?;

    if committed.is_none() {
        // Re-probe without the lease filter: missing, or present but leased/locked?
        let present = tx
            .stmt("re-probe", |st, t| {
                Ok(st.consumers.get(key, t.id).map(|r| r.live_lease_until(now)))
            })
            .await?;
        match present {
            Some(Some(until)) => return Ok(Err(Verdict::LeasedUntil(until))),
            Some(None) => return Ok(Err(Verdict::Busy)),
            None => {}
        }
        let acquired = if bugs.advisory_lock_blocking {
            // The historical shape: take, not try. It waits on the holder's whole transaction.
            tx.stmt("advisory lock (historical)", |st, t| {
                match st.take_advisory(advisory_key(pid, &req.group, CURSOR_CREATE_SEED), t.id) {
                    Some(holder) => Err(StmtError::Blocked(holder)),
                    None => Ok(true),
                }
            })
            .await?
        } else {
            tx.stmt("advisory try-lock", |st, t| {
                Ok(st.try_advisory(advisory_key(pid, &req.group, CURSOR_CREATE_SEED), t.id))
            })
            .await?
        };
        if !acquired {
            lock(&shared.events).advisory_skips += 1;
            return Ok(Err(Verdict::Busy));
        }
        // Step 3: seed the new cursor, then insert it.
        let inserted = tx
            .stmt("seed and insert", |st, t| {
                let record = st
                    .metadata
                    .get(&(req.queue.clone(), req.group.clone()), t.id)
                    .map(|m| SubscriptionRecord {
                        subscription_timestamp: m.subscription_timestamp,
                    });
                let rule = seed_rule(&req.group, record, req.intent);
                let part_key = (req.queue.clone(), partition.to_string());
                let last_offset = st
                    .partitions
                    .get(&part_key, t.id)
                    .map_or(-1, |p| p.last_offset);
                let first_recent = match rule {
                    queen_core::claim::SeedRule::FromTimestamp(ts) => st
                        .segments
                        .range(segments_of(pid), t.id)
                        .find(|(_, s)| s.created_at >= ts)
                        .map(|((_, base), _)| *base),
                    _ => None,
                };
                let row = CursorRow::seeded(seed_cursor(rule, last_offset, first_recent));
                // INSERT ... SELECT ... WHERE NOT EXISTS, under a snapshot taken after the advisory
                // lock: a row another pop created and committed between our re-probe and the lock
                // is seen here, so the insert never conflicts with a row a third pop is updating
                // (the unique check would wait on that updater).
                if !shared.bugs.insert_without_recheck && st.consumers.get(key, t.id).is_some() {
                    return Ok(false);
                }
                match st.consumers.insert(key.clone(), row, t.id) {
                    Insert::Inserted => Ok(true),
                    Insert::Exists => Ok(false),
                    Insert::WaitFor(holder) => Err(StmtError::Blocked(holder)),
                }
            })
            .await?;
        let _ = inserted;
        let reclaimed = tx
            .stmt("re-claim", |st, t| claim_row(st, key, now, t.id))
            .await?;
        return Ok(reclaimed.ok_or(Verdict::Busy));
    }
    Ok(committed.ok_or(Verdict::Busy))
}

/// ttl: moves the cursor past the expired prefix before anything is read; the new cursor.
async fn expire_ttl(
    tx: &TxHandle,
    pid: &str,
    key: &(String, String),
    committed: Offset,
    queue_gates: &QueueGates,
    now: Timestamp,
) -> Result<Offset, StorageError> {
    tx.stmt("ttl expiry", |st, t| {
        let wanted = committed + 1;
        let range = segments_of(pid);
        let head = st
            .segments
            .range(
                (pid.to_string(), Offset::MIN)..=(pid.to_string(), wanted),
                t.id,
            )
            .next_back()
            .and_then(|((_, base), _)| meta(st, pid, *base, t.id));
        let forward = st
            .segments
            .range(range, t.id)
            .filter(|((_, base), _)| *base > wanted)
            .map(|((_, base), s)| SegmentMeta {
                base_offset: *base,
                end_offset: s.end_offset,
                created_at: s.created_at,
            });
        let to = ttl_skip_to(wanted, head, forward, queue_gates.ttl_secs, now);
        if to == wanted {
            return Ok(committed);
        }
        let mut row = st.consumers.get(key, t.id).cloned().ok_or_else(|| {
            StmtError::Abort(StorageError::Internal("claimed cursor row vanished".into()))
        })?;
        row.committed = to - 1;
        if row.retry_offset.is_some_and(|r| r < to) {
            row.retry_offset = None;
            row.retry_count = 0;
        }
        st.consumers.update(key, row, t.id);
        Ok(to - 1)
    })
    .await
}

/// Step 5: the head probe and the forward scan from `wanted` up to the budget; with nothing
/// visible yet under delayedProcessing, when the next message becomes visible.
async fn scan(
    tx: &TxHandle,
    pid: &str,
    wanted: Offset,
    budget: u32,
    queue_gates: &QueueGates,
    now: Timestamp,
) -> Result<(Vec<SegmentRow>, Option<Timestamp>), StorageError> {
    let head = tx
        .stmt("head probe", |st, t| {
            Ok(st
                .segments
                .range(
                    (pid.to_string(), Offset::MIN)..=(pid.to_string(), wanted),
                    t.id,
                )
                .next_back()
                .and_then(|((_, base), _)| meta(st, pid, *base, t.id)))
        })
        .await?;
    tx.stmt("forward scan", |st, t| {
        let forward = st
            .segments
            .range(
                (pid.to_string(), wanted + 1)..=(pid.to_string(), Offset::MAX),
                t.id,
            )
            .map(|((_, base), s)| SegmentMeta {
                base_offset: *base,
                end_offset: s.end_offset,
                created_at: s.created_at,
            });
        let rows = plan_scan(
            wanted,
            head,
            forward,
            budget,
            queue_gates.delayed_processing_secs,
            now,
        );
        // A batch starting above `wanted` is a retention gap only if nothing covers `wanted`
        // now: a segment that committed after the head probe (pushes commit in offset order)
        // is left for the next pop, never skipped.
        let head_covered = head.is_some_and(|h| h.end_offset >= wanted);
        let raced = !head_covered
            && rows.first().is_some_and(|r| r.base_offset > wanted)
            && st
                .segments
                .range(
                    (pid.to_string(), Offset::MIN)..=(pid.to_string(), wanted),
                    t.id,
                )
                .next_back()
                .is_some_and(|(_, s)| s.end_offset >= wanted);
        if raced {
            return Ok((Vec::new(), None));
        }
        let deferred = if rows.is_empty() && queue_gates.delayed_processing_secs > 0 {
            let next = head.filter(|h| h.end_offset >= wanted).or_else(|| {
                st.segments
                    .range(
                        (pid.to_string(), wanted + 1)..=(pid.to_string(), Offset::MAX),
                        t.id,
                    )
                    .next()
                    .map(|((_, base), s)| SegmentMeta {
                        base_offset: *base,
                        end_offset: s.end_offset,
                        created_at: s.created_at,
                    })
            });
            next.map(|s| {
                s.created_at
                    .plus_secs(i64::from(queue_gates.delayed_processing_secs))
            })
        } else {
            None
        };
        let with_blobs: Vec<SegmentRow> = rows
            .iter()
            .filter_map(|r| {
                st.segments
                    .get(&(pid.to_string(), r.base_offset), t.id)
                    .map(|s| SegmentRow {
                        base_offset: r.base_offset,
                        start_idx: r.start_idx,
                        take: r.take,
                        msg_count: r.msg_count,
                        created_at: r.created_at,
                        blob: s.blob.clone(),
                    })
            })
            .collect();
        Ok((with_blobs, deferred))
    })
    .await
}

/// The empty-partition seal, with its narrow guards: a cursor below an empty partition's head
/// moves to it.
async fn seal_empty(
    shared: &Arc<Shared>,
    tx: &TxHandle,
    req: &PopRequest,
    partition: &str,
    pid: &str,
    key: &(String, String),
    committed: Offset,
) -> Result<(), StorageError> {
    tx.stmt("seal", |st, t| {
        let has_segments = st.segments.range(segments_of(pid), t.id).next().is_some();
        let last_offset = st
            .partitions
            .get(&(req.queue.clone(), partition.to_string()), t.id)
            .map_or(-1, |p| p.last_offset);
        if let Some(target) = seal_target(0, has_segments, last_offset, committed) {
            if let Some(mut row) = st.consumers.get(key, t.id).cloned() {
                row.committed = target;
                st.consumers.update(key, row, t.id);
                lock(&shared.events).seals += 1;
            }
        }
        Ok(())
    })
    .await
}

/// Step 6: commit (autoAck) or lease the batch [first, last]; the attempt count and the lease.
#[allow(clippy::too_many_arguments)]
async fn deliver(
    tx: &TxHandle,
    req: &PopRequest,
    queue_gates: &QueueGates,
    key: &(String, String),
    first: Offset,
    last: Offset,
    taken: u32,
    now: Timestamp,
) -> Result<(u32, Option<Timestamp>), StorageError> {
    let lease_seconds =
        effective_lease_seconds(req.lease_seconds, Some(queue_gates.lease_time_secs));
    tx.stmt("deliver", |st, t| {
        let mut row = st.consumers.get(key, t.id).cloned().ok_or_else(|| {
            StmtError::Abort(StorageError::Internal("claimed cursor row vanished".into()))
        })?;
        if req.auto_ack {
            apply_auto_ack(&mut row, last, taken);
        } else {
            apply_lease(&mut row, req.worker, now, lease_seconds, first, last);
        }
        let out = (row.attempt_count, row.lease_expires_at);
        st.consumers.update(key, row, t.id);
        Ok(out)
    })
    .await
}

fn resolve_pid(st: &DbState, queue: &str, partition: &str, tx: u64) -> Option<String> {
    st.partitions
        .get(&(queue.to_string(), partition.to_string()), tx)
        .map(|p| p.id.clone())
}
