//! Timers: scheduled messages, fired by any broker without a leader.
use async_trait::async_trait;
use serde_json::Value;

use super::StorageResult;
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
    /// Timers due now, earliest first, at most `limit` (read, not claimed: a firing
    /// transaction's `TxOp::FireTimer` decides who fires each).
    async fn due_timers(&self, limit: u32) -> StorageResult<Vec<DueTimer>>;
    /// When the earliest pending timer is due.
    async fn next_timer_due(&self) -> StorageResult<Option<Timestamp>>;
}
