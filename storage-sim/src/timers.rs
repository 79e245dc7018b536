//! Timers in the model: the same upsert, cancel and firing as `storage-pg/src/timers.rs`.

use std::sync::Arc;

use queen_core::storage::StorageError;
use queen_core::timers::{self, DueTimer, TimerOp, TimerRow};
use queen_core::Timestamp;
use serde_json::Value;

use crate::table::Insert;
use crate::tx::{in_tx, Shared, StmtError, TaskCell, TxHandle};

type Key = (String, String);

fn free(st: &crate::state::DbState, key: &Key, tx: u64) -> Result<(), StmtError> {
    match st.timers.locked_by_other(key, tx) {
        Some(h) => Err(StmtError::Blocked(h)),
        None => Ok(()),
    }
}

/// One schedule or cancel, in a batch or a transaction's rider.
pub(crate) async fn timer_op(tx: &TxHandle, op: &TimerOp) -> Result<Value, StorageError> {
    tx.stmt("timer op", |st, t| match op {
        TimerOp::Schedule { queue, key, .. } => {
            let k: Key = (queue.clone(), key.clone());
            free(st, &k, t.id)?;
            let row = op.scheduled_row(t.now).ok_or_else(|| {
                StmtError::Abort(StorageError::Internal(
                    "timers: a schedule without a row".into(),
                ))
            })?;
            let replaced = st.timers.get(&k, t.id).is_some();
            if replaced {
                st.timers.update(&k, row.clone(), t.id);
            } else {
                match st.timers.insert(k, row.clone(), t.id) {
                    Insert::Inserted => {}
                    Insert::WaitFor(h) => return Err(StmtError::Blocked(h)),
                    Insert::Exists => {
                        return Err(StmtError::Abort(StorageError::Internal(
                            "timers: a row appeared under a key read as absent".into(),
                        )))
                    }
                }
            }
            Ok(timers::scheduled(queue, key, &row, replaced))
        }
        TimerOp::Cancel { queue, key, txn } => {
            let k: Key = (queue.clone(), key.clone());
            free(st, &k, t.id)?;
            let removed = st.timers.get(&k, t.id).cloned();
            if removed.is_some() {
                st.timers.delete(&k, t.id);
            }
            Ok(timers::cancelled(
                queue,
                key,
                removed.as_ref(),
                txn.as_deref(),
            ))
        }
    })
    .await
}

/// `TxOp::FireTimer`: removes the timer if this incarnation is still pending and due.
pub(crate) async fn fire(
    tx: &TxHandle,
    queue: &str,
    key: &str,
    message_id: uuid::Uuid,
) -> Result<bool, StorageError> {
    let k: Key = (queue.to_string(), key.to_string());
    tx.stmt("timer fire", |st, t| {
        if t.shared.bugs.timers_fire_without_removal {
            st.note_firing(t.id, message_id);
            return Ok(true);
        }
        free(st, &k, t.id)?;
        let due = st
            .timers
            .get(&k, t.id)
            .is_some_and(|r| r.message_id == message_id && r.deliver_at <= t.now);
        if due {
            st.timers.delete(&k, t.id);
            st.note_firing(t.id, message_id);
        }
        Ok(due)
    })
    .await
}

pub(crate) async fn batch(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    ops: Vec<TimerOp>,
) -> Result<Vec<Value>, StorageError> {
    in_tx(&shared, "timers batch", cell, |tx| async move {
        let mut out = Vec::with_capacity(ops.len());
        for op in &ops {
            out.push(timer_op(&tx, op).await?);
        }
        Ok(out)
    })
    .await
}

pub(crate) fn peek(st: &crate::state::DbState, queue: &str, key: &str) -> Option<TimerRow> {
    st.timers
        .get(&(queue.to_string(), key.to_string()), 0)
        .cloned()
}

pub(crate) fn page(
    st: &crate::state::DbState,
    queue: &str,
    after: Option<&str>,
    limit: u32,
) -> Vec<(String, TimerRow)> {
    st.timers
        .range(
            (queue.to_string(), after.unwrap_or_default().to_string())..,
            0,
        )
        .take_while(|((q, _), _)| q == queue)
        .filter(|((_, k), _)| after.is_none_or(|a| k.as_str() > a))
        .take(limit as usize + 1)
        .map(|((_, k), r)| (k.clone(), r.clone()))
        .collect()
}

/// Due timers, earliest first (ties by key).
pub(crate) fn due(
    st: &crate::state::DbState,
    now: Timestamp,
    limit: u32,
    skip_queues: &[String],
) -> Vec<DueTimer> {
    let mut due: Vec<DueTimer> = st
        .timers
        .iter(0)
        .filter(|((q, _), r)| r.deliver_at <= now && !skip_queues.contains(q))
        .map(|((q, k), r)| DueTimer {
            queue: q.clone(),
            key: k.clone(),
            row: r.clone(),
        })
        .collect();
    due.sort_by(|a, b| {
        (a.row.deliver_at, &a.queue, &a.key).cmp(&(b.row.deliver_at, &b.queue, &b.key))
    });
    due.truncate(limit as usize);
    due
}

pub(crate) fn next_due(st: &crate::state::DbState, skip_queues: &[String]) -> Option<Timestamp> {
    st.timers
        .iter(0)
        .filter(|((q, _), _)| !skip_queues.contains(q))
        .map(|(_, r)| r.deliver_at)
        .min()
}
