//! Writes of the coordination surfaces and the admin plane that are not deliveries: KV batches,
//! lock ops, timer ops (which wake the timer worker), traces, dead-letter removals and the
//! ephemeral queues' stored declarations, stream queries' registrations.

use queen_core::kv::KvBatch;
use queen_core::kv::KvOp;
use queen_core::locks::LockOp;
use queen_core::storage::{StorageResult, TraceInput};
use queen_core::streams::{QueryRegistration, Registration};
use queen_core::timers::TimerOp;
use serde_json::Value;

use crate::broker::Broker;

impl Broker {
    /// One KV batch (`expect` and `required` decided in its transaction).
    pub(crate) async fn kv_batch(&self, ops: Vec<KvOp>) -> StorageResult<KvBatch> {
        self.storage.kv.kv_batch(ops).await
    }

    /// One lock op, under an owner minted for it (a new holder's id).
    pub(crate) async fn lock_op(&self, op: LockOp) -> StorageResult<Value> {
        let owner = self.mint_uuid().to_string();
        self.storage.kv.lock_op(op, owner).await
    }

    /// One timers batch; a batch that schedules wakes the timer worker, whose next due time may
    /// now be earlier.
    pub(crate) async fn timers_batch(&self, ops: Vec<TimerOp>) -> StorageResult<Vec<Value>> {
        let schedules = ops.iter().any(|op| matches!(op, TimerOp::Schedule { .. }));
        let results = self.storage.timers.timers_batch(ops).await?;
        if schedules {
            self.timer_wake.notify_one();
        }
        Ok(results)
    }

    /// Records a trace of a stored message; `None` when no such message is stored.
    pub(crate) async fn add_trace(&self, trace: TraceInput) -> StorageResult<Option<i64>> {
        self.storage.inspect.add_trace(trace).await
    }

    /// Removes a message's dead letters; how many.
    pub(crate) async fn delete_dead_letters_of(&self, pid: &str, tx: &str) -> StorageResult<u64> {
        self.storage.inspect.delete_dead_letters_of(pid, tx).await
    }

    /// Stores an ephemeral queue's declaration (its resolved options).
    pub(crate) async fn save_ephemeral_config(
        &self,
        queue: &str,
        options: &Value,
    ) -> StorageResult<()> {
        self.storage
            .ephemeral
            .save_ephemeral_config(queue, options)
            .await
    }

    /// Removes an ephemeral queue's declaration; whether there was one.
    pub(crate) async fn remove_ephemeral_config(&self, queue: &str) -> StorageResult<bool> {
        self.storage.ephemeral.remove_ephemeral_config(queue).await
    }

    /// Registers a stream query (a new one under a freshly minted id).
    pub(crate) async fn register_stream_query(
        &self,
        req: &QueryRegistration,
    ) -> StorageResult<Registration> {
        self.storage
            .streams
            .register_stream_query(req, self.mint_uuid())
            .await
    }
}
