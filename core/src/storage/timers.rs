//! Timers: scheduled messages, fired by any broker without a leader.
use async_trait::async_trait;
use serde_json::Value;

use super::{PushGroup, StorageResult, TxOp};
use crate::frames::Frame;
use crate::timers::{DueTimer, TimerOp, TimerRow};
use crate::types::Timestamp;

#[async_trait]
pub trait TimerStorage: Send + Sync {
    /// Schedules and cancels in one transaction, answers index-aligned.
    async fn timers_batch(&self, ops: Vec<TimerOp>) -> StorageResult<Vec<Value>>;
    /// A pending timer.
    async fn timer_peek(&self, queue: &str, key: &str) -> StorageResult<Option<TimerRow>>;
    /// A queue's pending timers after `after` in key order, at most `limit + 1`.
    async fn timer_page(
        &self,
        queue: &str,
        after: Option<String>,
        limit: u32,
    ) -> StorageResult<Vec<(String, TimerRow)>>;
    /// Timers due now, earliest first, at most `limit`, none of `skip_queues` (queues whose
    /// pushes were just refused at their maxSize: their timers must not stand in front of the
    /// others). Read, not claimed: a firing transaction's `TxOp::FireTimer` decides who fires
    /// each. A backend that can see which timers another broker's firing is removing right now
    /// leaves them out, so brokers firing at once take different timers instead of colliding on
    /// the earliest ones.
    async fn due_timers(&self, limit: u32, skip_queues: &[String]) -> StorageResult<Vec<DueTimer>>;
    /// When the earliest pending timer of a queue not in `skip_queues` is due.
    async fn next_timer_due(&self, skip_queues: &[String]) -> StorageResult<Option<Timestamp>>;
}

/// A firing of due timers as one transaction: the removal of each timer's incarnation, then
/// their messages' pushes (ids and transaction ids minted at schedule time, so the delivered
/// message is the one the schedule answered). A timer another broker fired, or a cancel or
/// reschedule removed, refuses its removal and the whole firing rolls back.
pub fn firing(due: &[DueTimer]) -> Vec<TxOp> {
    let mut ops: Vec<TxOp> = due
        .iter()
        .map(|t| TxOp::FireTimer {
            queue: t.queue.clone(),
            key: t.key.clone(),
            message_id: t.row.message_id,
        })
        .collect();
    let mut groups: Vec<PushGroup> = vec![];
    for t in due {
        let frame = Frame {
            message_id: t.row.message_id,
            transaction_id: t.row.txn.clone(),
            trace_id: None,
            producer: None,
            encrypted: false,
            payload: t.row.payload.clone(),
        };
        match groups
            .iter_mut()
            .find(|g| g.queue == t.queue && g.partition == t.row.partition)
        {
            Some(g) => g.frames.push(frame),
            None => groups.push(PushGroup {
                queue: t.queue.clone(),
                partition: t.row.partition.clone(),
                frames: vec![frame],
                blob: None,
            }),
        }
    }
    ops.push(TxOp::Push(groups));
    ops
}
