//! The delivery contract in the model: transactions, dead letters, consumer-group management.

use std::sync::{Arc, Mutex};

use queen_core::storage::{
    DeadLetterEntry, DeadLetterPage, DlqQuery, GroupDeleted, Requeued, SealCheck, SeekTarget,
    SegmentRow, StorageError, TxOp, TxOpResult, TxOutcome,
};
use queen_core::{Offset, Timestamp};

use crate::messages::{ack_body, insert_or_wait, push_body};
use crate::state::DbState;
use crate::table::Lock;
use crate::tx::{in_tx, lock, Shared, StmtError, TaskCell};

/// The results up to a refused ack, and its reason.
type Refusal = (Vec<TxOpResult>, String);

/// Runs acks and pushes in one transaction. A refused ack or push rolls everything back; the answer then
/// carries the results up to it and the reason.
pub(crate) async fn transaction(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    ops: Vec<TxOp>,
) -> Result<TxOutcome, StorageError> {
    let refused: Arc<Mutex<Option<Refusal>>> = Arc::new(Mutex::new(None));
    let stash = refused.clone();
    let r = in_tx(&shared, "transaction", cell, |tx| async move {
        let mut results = Vec::with_capacity(ops.len());
        for op in &ops {
            let result = match op {
                TxOp::Push(groups) => {
                    TxOpResult::Push(push_body(&tx, groups, None, SealCheck::Enforce).await?)
                }
                TxOp::Ack { group, item } => TxOpResult::Ack(
                    ack_body(&tx, group, std::slice::from_ref(item))
                        .await?
                        .remove(0),
                ),
                TxOp::Kv(op) => {
                    let (answer, refused) =
                        crate::kv::kv_op(&tx, op, &queen_core::kv::KvLimits::default()).await?;
                    TxOpResult::Kv {
                        answer,
                        refused,
                        required: op.required(),
                    }
                }
                TxOp::Timer(op) => TxOpResult::Timer(crate::timers::timer_op(&tx, op).await?),
                TxOp::FireTimer {
                    queue,
                    key,
                    message_id,
                } => TxOpResult::Fired(crate::timers::fire(&tx, queue, key, *message_id).await?),
                TxOp::Stream(op) => TxOpResult::Stream(crate::streams::cycle_op(&tx, op).await?),
                TxOp::EndLease {
                    group,
                    partition_id,
                    lease_id,
                } => TxOpResult::Ack(queen_core::streams::lease_end_outcome(
                    crate::streams::end_lease(&tx, group, partition_id, lease_id).await?,
                )),
            };
            let refusal = result.refusal();
            results.push(result);
            if let Some(reason) = refusal {
                *lock(&stash) = Some((results, reason));
                return Err(StorageError::Invalid("transaction refused".into()));
            }
        }
        Ok(results)
    })
    .await;
    let refusal = lock(&refused).take();
    match (r, refusal) {
        (Ok(results), _) => Ok(TxOutcome {
            committed: true,
            results,
            error: None,
        }),
        (Err(_), Some((results, error))) => Ok(TxOutcome {
            committed: false,
            results,
            error: Some(error),
        }),
        (Err(e), None) => Err(e),
    }
}

fn segment_holding(st: &DbState, pid: &str, offset: Offset, tx: u64) -> Option<SegmentRow> {
    let ((_, base), s) = st
        .segments
        .range(
            (pid.to_string(), Offset::MIN)..=(pid.to_string(), offset),
            tx,
        )
        .next_back()?;
    (s.end_offset >= offset).then(|| SegmentRow {
        base_offset: *base,
        start_idx: (offset - base) as u32,
        take: 1,
        msg_count: s.message_count(*base),
        created_at: s.created_at,
        blob: s.blob.clone(),
    })
}

pub(crate) fn dead_letters(st: &DbState, q: &DlqQuery) -> DeadLetterPage {
    let mut matching: Vec<DeadLetterEntry> = st
        .dlq
        .range((q.queue.clone(), 0)..=(q.queue.clone(), u64::MAX), 0)
        .filter(|(_, d)| q.group.as_ref().is_none_or(|g| &d.group == g))
        .filter(|(_, d)| q.partition.as_ref().is_none_or(|p| &d.partition == p))
        .filter(|(_, d)| {
            q.from.is_none_or(|f| d.failed_at >= f) && q.to.is_none_or(|t| d.failed_at <= t)
        })
        .map(|((queue, seq), d)| DeadLetterEntry {
            id: *seq as i64,
            queue: queue.clone(),
            partition: d.partition.clone(),
            partition_id: d.partition_id.clone(),
            group: d.group.clone(),
            offset: d.offset,
            transaction_id: d.transaction_id.clone(),
            error: d.error.clone(),
            retry_count: d.retry_count,
            failed_at: d.failed_at,
            segment: segment_holding(st, &d.partition_id, d.offset, 0),
        })
        .collect();
    matching.reverse(); // newest first
    let total = matching.len() as u64;
    let page = matching
        .into_iter()
        .skip(q.offset as usize)
        .take(q.limit as usize)
        .collect();
    DeadLetterPage {
        entries: page,
        total,
    }
}

/// The cursor a seek lands on for one partition.
fn seek_cursor(
    st: &DbState,
    pid: &str,
    last_offset: Offset,
    target: SeekTarget,
    tx: u64,
) -> Offset {
    match target {
        SeekTarget::End => last_offset,
        SeekTarget::Timestamp(ts) => {
            let segs: Vec<(Offset, Offset, Timestamp)> = st
                .segments
                .range(
                    (pid.to_string(), Offset::MIN)..=(pid.to_string(), Offset::MAX),
                    tx,
                )
                .map(|((_, b), s)| (*b, s.end_offset, s.created_at))
                .collect();
            match segs.iter().rev().find(|(_, _, c)| *c <= ts) {
                Some((_, end, _)) => *end,
                None => segs.first().map_or(last_offset, |(b, _, _)| b - 1),
            }
        }
    }
}

pub(crate) async fn seek_group(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    group: String,
    queue: String,
    target: SeekTarget,
) -> Result<u32, StorageError> {
    in_tx(&shared, "seek_group", cell, |tx| async move {
        tx.stmt("seek", |st, t| {
            let parts: Vec<(String, Offset)> = st
                .partitions_of(&queue, t.id)
                .map(|(_, p)| (p.id.clone(), p.last_offset))
                .collect();
            let keys: Vec<((String, String), Offset)> = parts
                .iter()
                .filter(|(pid, _)| {
                    st.consumers
                        .get(&(pid.clone(), group.clone()), t.id)
                        .is_some()
                })
                .map(|(pid, last)| ((pid.clone(), group.clone()), *last))
                .collect();
            for (k, _) in &keys {
                if let Lock::HeldBy(h) = st.consumers.lock(k, t.id) {
                    return Err(StmtError::Blocked(h));
                }
            }
            for (k, last) in &keys {
                let target = seek_cursor(st, &k.0, *last, target, t.id);
                if let Some(mut row) = st.consumers.get(k, t.id).cloned() {
                    row.committed = target;
                    row.worker_id = None;
                    row.lease_expires_at = None;
                    row.lease_acquired_at = None;
                    row.batch_end = None;
                    row.retry_offset = None;
                    row.retry_count = 0;
                    st.consumers.update(k, row, t.id);
                }
            }
            // The group reads old partitions again: its wildcard watermark no longer holds.
            let wm = (queue.clone(), group.clone());
            if st.watermarks.get(&wm, t.id).is_some() {
                st.watermarks.delete(&wm, t.id);
            }
            Ok(keys.len() as u32)
        })
        .await
    })
    .await
}

pub(crate) async fn delete_group(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    group: String,
    queue: Option<String>,
    delete_metadata: bool,
) -> Result<GroupDeleted, StorageError> {
    in_tx(&shared, "delete_group", cell, |tx| async move {
        tx.stmt("delete group", |st, t| {
            let pids: Vec<String> = match &queue {
                Some(q) => st
                    .partitions
                    .range((q.clone(), String::new()).., t.id)
                    .take_while(|((qq, _), _)| qq == q)
                    .map(|(_, p)| p.id.clone())
                    .collect(),
                None => st
                    .partitions
                    .iter(t.id)
                    .map(|(_, p)| p.id.clone())
                    .collect(),
            };
            let keys: Vec<(String, String)> = pids
                .into_iter()
                .map(|p| (p, group.clone()))
                .filter(|k| st.consumers.get(k, t.id).is_some())
                .collect();
            let meta: Vec<(String, String)> = if delete_metadata {
                st.metadata
                    .iter(t.id)
                    .filter(|((q, g), _)| *g == group && queue.as_ref().is_none_or(|qq| qq == q))
                    .map(|(k, _)| k.clone())
                    .collect()
            } else {
                vec![]
            };
            for k in &keys {
                if let Lock::HeldBy(h) = st.consumers.lock(k, t.id) {
                    return Err(StmtError::Blocked(h));
                }
            }
            for k in &meta {
                if let Lock::HeldBy(h) = st.metadata.lock(k, t.id) {
                    return Err(StmtError::Blocked(h));
                }
            }
            let wms: Vec<(String, String)> = st
                .watermarks
                .iter(t.id)
                .filter(|((q, g), _)| *g == group && queue.as_ref().is_none_or(|qq| qq == q))
                .map(|(k, _)| k.clone())
                .collect();
            for k in &keys {
                st.consumers.delete(k, t.id);
            }
            for k in &meta {
                st.metadata.delete(k, t.id);
            }
            for k in &wms {
                st.watermarks.delete(k, t.id);
            }
            Ok(GroupDeleted {
                cursors: keys.len() as u32,
                subscription_records: meta.len() as u32,
            })
        })
        .await
    })
    .await
}

pub(crate) async fn update_subscription(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    group: String,
    ts: Timestamp,
) -> Result<u32, StorageError> {
    in_tx(&shared, "update_subscription", cell, |tx| async move {
        tx.stmt("update subscription", |st, t| {
            let keys: Vec<(String, String)> = st
                .metadata
                .iter(t.id)
                .filter(|((_, g), _)| *g == group)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &keys {
                if let Lock::HeldBy(h) = st.metadata.lock(k, t.id) {
                    return Err(StmtError::Blocked(h));
                }
            }
            for k in &keys {
                if let Some(mut m) = st.metadata.get(k, t.id).cloned() {
                    m.subscription_timestamp = Some(ts);
                    st.metadata.update(k, m, t.id);
                }
            }
            Ok(keys.len() as u32)
        })
        .await
    })
    .await
}

pub(crate) async fn requeue_dead_letter(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    id: i64,
    message_id: uuid::Uuid,
) -> Result<Option<Requeued>, StorageError> {
    in_tx(&shared, "requeue_dead_letter", cell, |tx| async move {
        let found = tx
            .stmt("read dead letter", |st, t| {
                let Some((key, d)) = st
                    .dlq
                    .iter(t.id)
                    .find(|((_, seq), _)| *seq as i64 == id)
                    .map(|(k, d)| (k.clone(), d.clone()))
                else {
                    return Ok(None);
                };
                let Some(seg) = segment_holding(st, &d.partition_id, d.offset, t.id) else {
                    return Ok(None);
                };
                if let Lock::HeldBy(h) = st.dlq.lock(&key, t.id) {
                    return Err(StmtError::Blocked(h));
                }
                Ok(Some((key, d, seg)))
            })
            .await?;
        let Some((key, d, seg)) = found else {
            return Ok(None);
        };
        let mut frames = queen_core::frames::slice_blob(
            &seg.blob,
            seg.start_idx as usize,
            1,
            seg.msg_count as usize,
        )
        .map_err(|e| StorageError::Internal(e.to_string()))?;
        let Some(mut frame) = frames.pop() else {
            return Ok(None);
        };
        frame.message_id = message_id;
        frame.transaction_id = queen_core::storage::requeue_transaction_id(id, &d.transaction_id);
        let group = queen_core::storage::PushGroup {
            queue: key.0.clone(),
            partition: d.partition.clone(),
            frames: vec![frame],
            blob: None,
        };
        let mut out = crate::messages::push_body(
            &tx,
            std::slice::from_ref(&group),
            None,
            SealCheck::AsStored,
        )
        .await?;
        tx.stmt("delete dead letter", |st, t| {
            st.dlq.delete(&key, t.id);
            Ok(())
        })
        .await?;
        Ok(out.pop().and_then(|mut g| g.pop()).map(|outcome| Requeued {
            queue: key.0.clone(),
            partition: d.partition.clone(),
            outcome,
        }))
    })
    .await
}

/// The stored value of a cluster setting, `proposed` when none was stored yet (INSERT ... ON
/// CONFLICT DO NOTHING, then the row).
pub(crate) async fn cluster_setting(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    name: String,
    proposed: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, StorageError> {
    in_tx(&shared, "cluster_setting", cell, |tx| async move {
        tx.stmt("insert or read the setting", |st, t| {
            if let Some(v) = st.cluster_settings.get(&name, t.id) {
                return Ok(Some(v.clone()));
            }
            if let Some(value) = &proposed {
                insert_or_wait(&mut st.cluster_settings, name.clone(), value.clone(), t.id)?;
            }
            Ok(proposed.clone())
        })
        .await
    })
    .await
}
