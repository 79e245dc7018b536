//! Push, ack and lease renewal in the model, statement by statement as push_v2, ack_v1 and
//! renew_lease_v1 run them.

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_core::dedup::FirstOccurrences;
use queen_core::events::DeliveryEvent;
use queen_core::frames::Frame;
use queen_core::storage::{
    AckItem, AckOutcome, AckStatus, BatchEnd, LeaseBatchEnds, PushGroup, PushGroupResult,
    PushOutcome, QueueConfig, QueueFull, RenewOutcome, SealCheck, StorageError,
    ACK_ALREADY_COMMITTED, ACK_NOT_FOUND,
};
use queen_core::{Offset, Timestamp, WorkerId};

use crate::state::{DbState, DlqRow, PartitionRow, QueueRow, SegmentData, TxidRow};
use crate::table::{Insert, Lock};
use crate::tx::{in_tx, Shared, StmtError, TaskCell, Tx, TxHandle};

pub(crate) fn insert_or_wait<K: Ord + Clone, V: Clone>(
    t: &mut crate::table::Table<K, V>,
    k: K,
    v: V,
    tx: u64,
) -> Result<bool, StmtError> {
    match t.insert(k, v, tx) {
        Insert::Inserted => Ok(true),
        Insert::Exists => Ok(false),
        Insert::WaitFor(h) => Err(StmtError::Blocked(h)),
    }
}

pub(crate) fn lock_or_wait(l: Lock) -> Result<bool, StmtError> {
    match l {
        Lock::Acquired => Ok(true),
        Lock::Missing => Ok(false),
        Lock::HeldBy(h) => Err(StmtError::Blocked(h)),
    }
}

/// Creates the queue row if absent (namespace/task from the name).
pub(crate) fn ensure_queue(
    st: &mut DbState,
    queue: &str,
    now: Timestamp,
    tx: u64,
) -> Result<(), StmtError> {
    if st.queues.get(&queue.to_string(), tx).is_some() {
        return Ok(());
    }
    let id = st.mint_uuid(now).to_string();
    insert_or_wait(
        &mut st.queues,
        queue.to_string(),
        QueueRow {
            id,
            config: QueueConfig::with_defaults(queue),
            created_at: now,
        },
        tx,
    )?;
    Ok(())
}

/// Creates the partition row if absent and locks it; returns its id.
pub(crate) fn ensure_partition_locked(
    st: &mut DbState,
    queue: &str,
    partition: &str,
    now: Timestamp,
    tx: u64,
) -> Result<String, StmtError> {
    let key = (queue.to_string(), partition.to_string());
    if st.partitions.get(&key, tx).is_none() {
        let id = st.mint_uuid(now).to_string();
        st.partition_seq += 1;
        let number = st.partition_seq;
        let row = PartitionRow {
            id: id.clone(),
            last_offset: -1,
            last_write_at: now.quantize_to_second(),
            oldest_at: None,
            number,
            created_at: now,
        };
        if insert_or_wait(&mut st.partitions, key.clone(), row, tx)? {
            insert_or_wait(&mut st.partition_ids, id.clone(), key.clone(), tx)?;
            insert_or_wait(&mut st.partition_numbers, number, id, tx)?;
        }
    }
    if !lock_or_wait(st.partitions.lock(&key, tx))? {
        return Err(StmtError::Abort(StorageError::Internal(format!(
            "partition {queue}/{partition} vanished"
        ))));
    }
    st.partitions
        .get(&key, tx)
        .map(|p| p.id.clone())
        .ok_or_else(|| StmtError::Abort(StorageError::Internal("partition row missing".into())))
}

/// One transaction for the request; offsets allocated under the partition row's lock, so commit
/// order equals offset order; duplicates by (partition, transactionId) answer the original id.
pub(crate) async fn push(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    groups: Vec<PushGroup>,
    accepted_at: Option<Timestamp>,
) -> Result<Vec<PushGroupResult>, StorageError> {
    in_tx(&shared, "push", cell, |tx| async move {
        push_body(&tx, &groups, accepted_at, SealCheck::Enforce).await
    })
    .await
}

/// The push statements, inside a caller's transaction. `accepted_at`: the time a replayed push
/// was accepted (push_v6's p_created), else now.
pub(crate) async fn push_body(
    tx: &TxHandle,
    groups: &[PushGroup],
    accepted_at: Option<Timestamp>,
    seal: SealCheck,
) -> Result<Vec<PushGroupResult>, StorageError> {
    let now = tx.now();
    let stamp = accepted_at.unwrap_or(now);
    // Lock partitions in one global order so concurrent multi-partition pushes never deadlock.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|a, b| {
        (&groups[*a].queue, &groups[*a].partition).cmp(&(&groups[*b].queue, &groups[*b].partition))
    });
    let mut results: Vec<PushGroupResult> = vec![Vec::new(); groups.len()];
    for i in order {
        results[i] = push_group(tx, &groups[i], now, stamp, seal).await?;
    }
    Ok(results)
}

/// One group's statements: the queue row (locked when the queue is capped), the partition row
/// locked, then de-duplication and the append.
async fn push_group(
    tx: &TxHandle,
    g: &PushGroup,
    now: Timestamp,
    stamp: Timestamp,
    seal: SealCheck,
) -> Result<PushGroupResult, StorageError> {
    tx.stmt("upsert queue", |st, t| {
        ensure_queue(st, &g.queue, now, t.id)
    })
    .await?;
    // maxSize: capped queues serialize their pushes on the queue row, taken before the
    // partition row (the order every push uses, so no deadlock).
    // encryptionEnabled is read in the push's own statement, as push_v6 reads it.
    let cap = tx
        .stmt("lock capped queue", |st, t| {
            let config = st.queues.get(&g.queue, t.id).map(|q| &q.config);
            g.seal_check(config.is_some_and(|c| c.encryption_enabled), seal)?;
            let cap = config.map_or(0, |c| c.max_size);
            if cap > 0 {
                lock_or_wait(st.queues.lock(&g.queue, t.id))?;
            }
            Ok(cap)
        })
        .await?;
    let pid = tx
        .stmt("upsert and lock partition", |st, t| {
            ensure_partition_locked(st, &g.queue, &g.partition, now, t.id)
        })
        .await?;
    tx.stmt("dedup and append", |st, t| {
        dedup_and_append(st, t, g, &pid, cap, stamp)
    })
    .await
}

/// The push's statement on its locked partition: each first occurrence is a duplicate of a
/// stored transactionId or new; the new ones are refused whole when they would take a capped
/// queue past its maxSize, else appended as one segment.
fn dedup_and_append(
    st: &mut DbState,
    t: &Tx,
    g: &PushGroup,
    pid: &str,
    cap: u32,
    stamp: Timestamp,
) -> Result<PushGroupResult, StmtError> {
    let pid = pid.to_string();
    let key = (g.queue.clone(), g.partition.clone());
    let part =
        st.partitions.get(&key, t.id).cloned().ok_or_else(|| {
            StmtError::Abort(StorageError::Internal("partition row missing".into()))
        })?;
    // Only first occurrences within the request are stored or refused; the
    // repeats answer theirs (the shared rule in queen_core::dedup).
    let firsts = FirstOccurrences::of(&g.frames);
    let mut outcomes: Vec<Option<PushOutcome>> = vec![None; g.frames.len()];
    let mut fresh = Vec::new();
    for k in firsts.firsts() {
        let f = &g.frames[k];
        outcomes[k] = Some(
            match st.txids.get(&(pid.clone(), f.transaction_id.clone()), t.id) {
                Some(orig) => PushOutcome::Duplicate {
                    message_id: orig.message_id,
                    partition_id: pid.clone(),
                },
                None => {
                    let offset = part.last_offset + 1 + fresh.len() as Offset;
                    fresh.push(f.clone());
                    PushOutcome::Queued {
                        message_id: f.message_id,
                        partition_id: pid.clone(),
                        offset,
                    }
                }
            },
        );
    }
    let resolve = |outcomes| {
        firsts
            .resolve(outcomes)
            .ok_or_else(|| StmtError::Abort(StorageError::Internal("push outcome missing".into())))
    };
    if fresh.is_empty() {
        return resolve(outcomes);
    }
    if cap > 0 {
        let backlog = queue_backlog(st, &g.queue, t.id);
        if backlog + fresh.len() as i64 > i64::from(cap) {
            let full = QueueFull {
                queue: g.queue.clone(),
                max_size: cap,
                backlog: u64::try_from(backlog).unwrap_or(0),
            };
            return resolve(refuse_new(outcomes, &full));
        }
    }
    append_segment(st, t, g, &pid, &fresh, part, stamp)?;
    resolve(outcomes)
}

/// Stores the new messages of a push as one segment after the partition's last offset, with
/// their transactionIds, and announces the push.
fn append_segment(
    st: &mut DbState,
    t: &Tx,
    g: &PushGroup,
    pid: &str,
    fresh: &[Frame],
    mut part: PartitionRow,
    stamp: Timestamp,
) -> Result<(), StmtError> {
    let pid = pid.to_string();
    let key = (g.queue.clone(), g.partition.clone());
    let blob = g
        .segment_blob(fresh)
        .map_err(|e| StmtError::Abort(StorageError::Invalid(e.to_string())))?;
    let base = part.last_offset + 1;
    for (i, f) in fresh.iter().enumerate() {
        let row = TxidRow {
            offset: base + i as Offset,
            message_id: f.message_id,
        };
        insert_or_wait(
            &mut st.txids,
            (pid.clone(), f.transaction_id.clone()),
            row,
            t.id,
        )?;
    }
    let end = base + fresh.len() as Offset - 1;
    // created_at stays monotone in base_offset even when a push that began
    // earlier takes the partition lock later.
    let newest = st
        .segments
        .range(
            (pid.clone(), Offset::MIN)..=(pid.clone(), Offset::MAX),
            t.id,
        )
        .next_back()
        .map(|(_, s)| s.created_at);
    let created_at = newest.map_or(stamp, |n| n.max(stamp));
    insert_or_wait(
        &mut st.segments,
        (pid.clone(), base),
        SegmentData {
            end_offset: end,
            created_at,
            blob: Arc::new(blob),
        },
        t.id,
    )?;
    part.last_offset = end;
    // Never before the transaction began, even for a push drained from a file buffer with the
    // time it was accepted: a discovery answer's safeTime relies on it.
    part.last_write_at = created_at.max(t.now).quantize_to_second();
    part.oldest_at = part.oldest_at.or(Some(created_at));
    st.partitions.update(&key, part, t.id);
    st.notify(
        t.id,
        DeliveryEvent::Pushed {
            queue: g.queue.clone(),
            partition: g.partition.clone(),
            count: fresh.len() as u64,
        },
    );
    Ok(())
}

/// Messages of a queue that some consumer group has not passed: per partition, from the slowest
/// cursor (or from the start when no group has a cursor there) to the head.
fn queue_backlog(st: &DbState, queue: &str, tx: u64) -> i64 {
    st.partitions_of(queue, tx)
        .map(|(_, p)| {
            let slowest = st
                .consumers
                .range((p.id.clone(), String::new()).., tx)
                .take_while(|((pid, _), _)| *pid == p.id)
                .map(|(_, c)| c.committed)
                .min()
                .unwrap_or(-1);
            (p.last_offset - slowest).max(0)
        })
        .sum()
}

/// A push group's new messages refused together because the queue is at its maxSize (stored
/// duplicates still answer as such: nothing new would have been stored for them).
fn refuse_new(outcomes: Vec<Option<PushOutcome>>, full: &QueueFull) -> Vec<Option<PushOutcome>> {
    outcomes
        .into_iter()
        .map(|o| match o {
            Some(PushOutcome::Queued {
                message_id,
                partition_id,
                ..
            }) => Some(PushOutcome::Rejected {
                message_id,
                partition_id,
                full: full.clone(),
            }),
            other => other,
        })
        .collect()
}

#[derive(Default)]
struct CallState {
    /// The lease as it stood when this call first touched the partition: the fence.
    worker: Option<WorkerId>,
    live: bool,
    /// The first failed/retried offset in this call: the cursor may not pass it.
    barrier: Option<Offset>,
    release: bool,
    /// A `failed` ack (not `retry`) ends the lease: the queue's retryDelay holds the partition.
    hold: bool,
    hold_ms: u32,
}

/// The options an ack consults, from the queue row.
struct AckOptions {
    retry_limit: u32,
    retry_delay_ms: u32,
    keep_dead_letters: bool,
    dlq_after_max_retries: bool,
}

/// Positional acks fenced by the lease. Within one call a failed message is a barrier: later
/// completed acks never move the cursor past it, so it is redelivered or dead-lettered, never lost.
pub(crate) async fn ack(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    group: String,
    items: Vec<AckItem>,
) -> Result<Vec<AckOutcome>, StorageError> {
    in_tx(&shared, "ack", cell, |tx| async move {
        ack_body(&tx, &group, &items).await
    })
    .await
}

/// The ack statements, inside a caller's transaction: each item's fenced cursor write, then the
/// leases the call's failed or retried messages end.
pub(crate) async fn ack_body(
    tx: &TxHandle,
    group: &str,
    items: &[AckItem],
) -> Result<Vec<AckOutcome>, StorageError> {
    let resolved = resolve_partition_numbers(tx, items).await?;
    let items = resolved.as_deref().unwrap_or(items);
    let now = tx.now();
    let mut calls: BTreeMap<String, CallState> = BTreeMap::new();
    // Found by the first item's statement (offsets never change once pushed), so a call in
    // offset order takes the same statements as before.
    let mut order: Option<Vec<usize>> = None;
    let mut answers: Vec<Option<AckOutcome>> = vec![None; items.len()];
    for step in 0..items.len() {
        let (i, outcome) = tx
            .stmt("ack", |st, t| {
                let i = order.get_or_insert_with(|| application_order(st, t, items))[step];
                Ok((i, ack_item(st, t, &items[i], group, now, &mut calls)?))
            })
            .await?;
        answers[i] = Some(outcome);
    }
    let mut out = answers
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| StorageError::Internal("an ack item went unapplied".into()))?;
    release_call_leases(tx, group, &calls, items, &mut out, now).await?;
    Ok(out)
}

/// The order a call's items apply in. A call holding a nack applies each partition's by offset
/// (ties, and items whose transactionId names no message, in the call's order; partitions in id
/// order), so the nack bounds every completed ack of its call wherever the call lists it. A call
/// of completed acks only applies in its own order (as ack_v3's set-based form answers it: an
/// item an earlier one of the call covers is already committed).
fn application_order(st: &DbState, t: &Tx, items: &[AckItem]) -> Vec<usize> {
    if items.iter().all(|i| i.status == AckStatus::Completed) {
        return (0..items.len()).collect();
    }
    let offsets: Vec<Option<Offset>> = items
        .iter()
        .map(|item| {
            st.txids
                .get(
                    &(item.partition_id.clone(), item.transaction_id.clone()),
                    t.id,
                )
                .map(|r| r.offset)
        })
        .collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (&items[i].partition_id, offsets[i].is_none(), offsets[i], i));
    order
}

/// Items naming their partition by number (a framed pop's partitionId) name it by id from here
/// on; an unknown number names no partition, so the ack answers "Message not found". `None`
/// when every item names its partition by id already.
async fn resolve_partition_numbers(
    tx: &TxHandle,
    items: &[AckItem],
) -> Result<Option<Vec<AckItem>>, StorageError> {
    if !items
        .iter()
        .any(|i| queen_core::storage::partition_number(&i.partition_id).is_some())
    {
        return Ok(None);
    }
    tx.stmt("resolve partition numbers", |st, t| {
        Ok(items
            .iter()
            .map(|i| AckItem {
                partition_id: st
                    .partition_by_ref(&i.partition_id, t.id)
                    .unwrap_or_default(),
                ..i.clone()
            })
            .collect::<Vec<_>>())
    })
    .await
    .map(Some)
}

/// One item's ack statement: fenced by the lease as the call first found it, and by the call's
/// barrier (its first failed or retried offset).
fn ack_item(
    st: &mut DbState,
    t: &Tx,
    item: &AckItem,
    group: &str,
    now: Timestamp,
    calls: &mut BTreeMap<String, CallState>,
) -> Result<AckOutcome, StmtError> {
    let group = group.to_string();
    let Some((queue, partition)) = st.partition_ids.get(&item.partition_id, t.id).cloned() else {
        return Ok(AckOutcome::refused(ACK_NOT_FOUND));
    };
    let Some(offset) = st
        .txids
        .get(
            &(item.partition_id.clone(), item.transaction_id.clone()),
            t.id,
        )
        .map(|r| r.offset)
    else {
        return Ok(AckOutcome::refused(ACK_NOT_FOUND));
    };
    let key = (item.partition_id.clone(), group.clone());
    if !lock_or_wait(st.consumers.lock(&key, t.id))? {
        return Ok(AckOutcome::refused(
            "Message not delivered to this consumer group",
        ));
    }
    let mut row =
        st.consumers.get(&key, t.id).cloned().ok_or_else(|| {
            StmtError::Abort(StorageError::Internal("cursor row vanished".into()))
        })?;
    let call = calls
        .entry(item.partition_id.clone())
        .or_insert_with(|| CallState {
            worker: row.worker_id,
            live: !row.claimable(now),
            ..Default::default()
        });
    let mut res = AckOutcome {
        success: true,
        error: None,
        queue: Some(queue.clone()),
        partition: Some(partition.clone()),
        lease_released: false,
        dlq: false,
        noop: false,
    };
    if offset <= row.committed {
        // Already committed: a completed ack is idempotent, whatever lease it names (a retried
        // transaction's ack arrives after its lease was released); a nack can no longer be
        // honoured, and says so.
        return Ok(if item.status == AckStatus::Completed {
            AckOutcome { noop: true, ..res }
        } else {
            AckOutcome {
                success: false,
                error: Some(ACK_ALREADY_COMMITTED.into()),
                ..res
            }
        });
    }
    if let Some(lid) = item.lease_id.as_deref().filter(|l| !l.is_empty()) {
        if !call.live || call.worker.map(|w| w.to_string()).as_deref() != Some(lid) {
            return Ok(AckOutcome {
                success: false,
                error: Some("Invalid or expired lease".into()),
                ..res
            });
        }
    }
    if row.batch_end.is_none_or(|e| offset > e) {
        return Ok(AckOutcome {
            success: false,
            error: Some("Message not delivered".into()),
            ..res
        });
    }
    let opts = st.queues.get(&queue, t.id).map_or(
        AckOptions {
            retry_limit: 3,
            retry_delay_ms: 0,
            keep_dead_letters: true,
            dlq_after_max_retries: true,
        },
        |q| AckOptions {
            retry_limit: q.config.retry_limit,
            retry_delay_ms: q.config.retry_delay_ms,
            keep_dead_letters: q.config.dead_letter_queue,
            dlq_after_max_retries: q.config.dlq_after_max_retries,
        },
    );
    call.hold_ms = opts.retry_delay_ms;
    let verdict = AckVerdict {
        item,
        queue: &queue,
        partition: &partition,
        group: &group,
        offset,
        now,
        opts: &opts,
    };
    verdict.apply(st, t, &mut row, call, &mut res);
    if row.batch_end.is_some_and(|e| row.committed >= e) {
        row.end_lease();
        res.lease_released = true;
    }
    st.consumers.update(&key, row, t.id);
    Ok(res)
}

/// What one ack item does to its cursor row, by its status.
struct AckVerdict<'a> {
    item: &'a AckItem,
    queue: &'a str,
    partition: &'a str,
    group: &'a str,
    offset: Offset,
    now: Timestamp,
    opts: &'a AckOptions,
}

impl AckVerdict<'_> {
    fn apply(
        &self,
        st: &mut DbState,
        t: &Tx,
        row: &mut queen_core::claim::CursorRow,
        call: &mut CallState,
        res: &mut AckOutcome,
    ) {
        let offset = self.offset;
        match self.item.status {
            AckStatus::Completed => Self::advance(row, offset, call.barrier),
            AckStatus::Failed => {
                row.retry_count = if row.retry_offset == Some(offset) {
                    row.retry_count + 1
                } else {
                    1
                };
                row.retry_offset = Some(offset);
                if self.opts.dlq_after_max_retries
                    && row.retry_count > self.opts.retry_limit
                    && offset == row.committed + 1
                    && call.barrier.is_none()
                {
                    res.dlq = self.dead_letter(st, t, row);
                    Self::advance(row, offset, None);
                    // A nack ends the lease, dead-lettering included: its consumer drops the
                    // rest of the batch, which comes again at once.
                    call.release = true;
                } else {
                    call.barrier = Some(call.barrier.map_or(offset, |b| b.min(offset)));
                    call.release = true;
                    call.hold = true;
                }
            }
            AckStatus::Retry => {
                call.barrier = Some(call.barrier.map_or(offset, |b| b.min(offset)));
                call.release = true;
            }
            AckStatus::Dlq => {
                if offset == row.committed + 1 && call.barrier.is_none() {
                    res.dlq = self.dead_letter(st, t, row);
                    Self::advance(row, offset, None);
                    call.release = true;
                } else {
                    // Earlier messages are still unacknowledged: file it when it reaches the head.
                    row.retry_offset = Some(offset);
                    row.retry_count = u32::MAX / 2;
                    call.barrier = Some(call.barrier.map_or(offset, |b| b.min(offset)));
                    call.release = true;
                }
            }
        }
    }

    /// Commits through `to`, but never up to the call's barrier.
    fn advance(row: &mut queen_core::claim::CursorRow, to: Offset, barrier: Option<Offset>) {
        row.commit_through(barrier.map_or(to, |b| to.min(b - 1)));
    }

    /// Files the message as a dead letter; false when the queue discards them instead.
    fn dead_letter(&self, st: &mut DbState, t: &Tx, row: &queen_core::claim::CursorRow) -> bool {
        let dl = DlqRow {
            partition_id: self.item.partition_id.clone(),
            partition: self.partition.to_string(),
            group: self.group.to_string(),
            offset: self.offset,
            transaction_id: self.item.transaction_id.clone(),
            error: self.item.error.clone(),
            retry_count: row.retry_count,
            failed_at: self.now,
        };
        st.note_dead_lettering(t.id, &dl);
        if !self.opts.keep_dead_letters {
            // deadLetterQueue off: the message is discarded, on purpose.
            return false;
        }
        st.dlq_seq += 1;
        let seq = st.dlq_seq;
        let _ = st.dlq.insert((self.queue.to_string(), seq), dl, t.id);
        true
    }
}

/// Failed or retried messages end the lease at the end of the call: redelivery from the cursor.
async fn release_call_leases(
    tx: &TxHandle,
    group: &str,
    calls: &BTreeMap<String, CallState>,
    items: &[AckItem],
    out: &mut [AckOutcome],
    now: Timestamp,
) -> Result<(), StorageError> {
    let group = group.to_string();
    for (pid, call) in calls.iter().filter(|(_, c)| c.release) {
        let released = tx
            .stmt("release lease", |st, t| {
                let key = (pid.clone(), group.clone());
                let Some(mut row) = st.consumers.get(&key, t.id).cloned() else {
                    return Ok(false);
                };
                if row.worker_id.is_none() || row.worker_id != call.worker {
                    return Ok(false);
                }
                if call.hold && call.hold_ms > 0 {
                    // retryDelay: nobody in the group may claim the partition until it ends.
                    row.worker_id = Some(WorkerId::RETRY_HOLD);
                    row.lease_expires_at = Some(now.plus_millis(i64::from(call.hold_ms)));
                } else {
                    row.worker_id = None;
                    row.lease_expires_at = None;
                }
                row.lease_acquired_at = None;
                row.batch_end = None;
                lock_or_wait(st.consumers.update(&key, row, t.id))
            })
            .await?;
        if released {
            for (item, o) in items.iter().zip(out.iter_mut()) {
                if &item.partition_id == pid && o.success {
                    o.lease_released = true;
                }
            }
        }
    }
    Ok(())
}

/// Whole-batch acks of several leases, as ack_batch_ends_v2: one guarded cursor write per batch,
/// in (partition id, group) order; a batch whose cursor is no longer under the live lease with
/// that end (or whose first message is gone) is left untouched. Each lease's committed partition
/// ids, in order.
pub(crate) async fn ack_batch_ends(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    leases: Vec<LeaseBatchEnds>,
) -> Result<Vec<Vec<String>>, StorageError> {
    let mut batches: Vec<(usize, &LeaseBatchEnds, &BatchEnd)> = leases
        .iter()
        .enumerate()
        .flat_map(|(k, l)| l.batches.iter().map(move |b| (k, l, b)))
        .collect();
    batches.sort_by(|a, b| (&a.2.partition_id, &a.1.group).cmp(&(&b.2.partition_id, &b.1.group)));
    let batches: Vec<(usize, String, WorkerId, BatchEnd)> = batches
        .into_iter()
        .map(|(k, l, b)| (k, l.group.clone(), l.lease, b.clone()))
        .collect();
    let count = leases.len();
    in_tx(&shared, "ack_batch_ends", cell, |tx| async move {
        let now = tx.now();
        let mut committed = vec![vec![]; count];
        for (k, group, lease, b) in &batches {
            let done = tx
                .stmt("commit batch end", |st, t| {
                    let key = (b.partition_id.clone(), group.clone());
                    let stored = st
                        .txids
                        .get(
                            &(b.partition_id.clone(), b.first_transaction_id.clone()),
                            t.id,
                        )
                        .is_some();
                    if !stored || !lock_or_wait(st.consumers.lock(&key, t.id))? {
                        return Ok(false);
                    }
                    let Some(mut row) = st.consumers.get(&key, t.id).cloned() else {
                        return Ok(false);
                    };
                    if row.worker_id != Some(*lease)
                        || row.claimable(now)
                        || row.batch_end != Some(b.end_offset)
                        || row.committed >= b.end_offset
                    {
                        return Ok(false);
                    }
                    row.commit_through(b.end_offset);
                    row.end_lease();
                    lock_or_wait(st.consumers.update(&key, row, t.id))
                })
                .await?;
            if done {
                committed[*k].push(b.partition_id.clone());
            }
        }
        Ok(committed)
    })
    .await
}

/// Extends every live lease held under `lease_id` to at least now + seconds.
pub(crate) async fn renew(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    lease_id: String,
    seconds: u32,
) -> Result<RenewOutcome, StorageError> {
    in_tx(&shared, "renew_lease", cell, |tx| async move {
        let now = tx.now();
        tx.stmt("renew", |st, t| {
            let keys: Vec<(String, String)> = st
                .consumers
                .iter(t.id)
                .filter(|(_, r)| {
                    r.worker_id
                        .is_some_and(|w| w != WorkerId::RETRY_HOLD && w.to_string() == lease_id)
                        && !r.claimable(now)
                })
                .map(|(k, _)| k.clone())
                .collect();
            let target = now.plus_secs(i64::from(seconds));
            let mut renewed = 0;
            let mut expires_at = None;
            for k in keys {
                let Some(mut row) = st.consumers.get(&k, t.id).cloned() else {
                    continue;
                };
                let exp = row.lease_expires_at.map_or(target, |e| e.max(target));
                row.lease_expires_at = Some(exp);
                lock_or_wait(st.consumers.update(&k, row, t.id))?;
                renewed += 1;
                expires_at = Some(expires_at.map_or(exp, |e: Timestamp| e.max(exp)));
            }
            Ok(RenewOutcome {
                renewed,
                expires_at,
            })
        })
        .await
    })
    .await
}
