//! One broker's pops cut off from the database, as a PostgreSQL that stopped answering cuts them:
//! every pop storage call of that broker fails `Unavailable` while pushes and acks still reach
//! the model. The driver cuts and restores it (the prompt scenario) and judges how often the
//! broker asked meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queen_core::storage::{
    PopRequest, PopResult, PopStorage, QueueConfig, StorageError, StorageResult,
};
use queen_core::Timestamp;
use queen_storage_sim::SimDb;

/// Failing calls past which each further one first lets 1 ms of simulated time pass: a broker
/// that asks as fast as calls fail would otherwise never let the simulated clock move, and the
/// run would hang instead of reporting it.
const SPIN_GUARD: u64 = 20_000;

pub struct PopReach {
    db: Arc<SimDb>,
    cut: AtomicBool,
    /// Calls made while cut, since the last `restore`.
    calls_while_cut: AtomicU64,
}

impl PopReach {
    pub fn new(db: Arc<SimDb>) -> Arc<PopReach> {
        Arc::new(PopReach {
            db,
            cut: AtomicBool::new(false),
            calls_while_cut: AtomicU64::new(0),
        })
    }

    pub fn cut(&self) {
        self.calls_while_cut.store(0, Ordering::SeqCst);
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Restores the reach; returns how many calls failed while it was cut.
    pub fn restore(&self) -> u64 {
        self.cut.store(false, Ordering::SeqCst);
        self.calls_while_cut.swap(0, Ordering::SeqCst)
    }

    async fn check(&self) -> StorageResult<()> {
        if !self.cut.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.calls_while_cut.fetch_add(1, Ordering::SeqCst) >= SPIN_GUARD {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Err(StorageError::Unavailable(
            "pops cut off from the database".into(),
        ))
    }
}

#[async_trait]
impl PopStorage for PopReach {
    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>> {
        self.check().await?;
        self.db.queue_config(queue).await
    }
    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult> {
        self.check().await?;
        self.db.pop_partition(req, partition).await
    }
    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult> {
        self.check().await?;
        self.db.pop_list(req, candidates).await
    }
    async fn pop_list_many(
        &self,
        pops: Vec<(PopRequest, Vec<String>)>,
    ) -> Vec<StorageResult<PopResult>> {
        if let Err(e) = self.check().await {
            return pops.iter().map(|_| Err(e.clone())).collect();
        }
        self.db.pop_list_many(pops).await
    }
    async fn pop_wildcard(&self, req: PopRequest) -> StorageResult<PopResult> {
        self.check().await?;
        self.db.pop_wildcard(req).await
    }
    async fn queues_matching(
        &self,
        namespace: Option<String>,
        task: Option<String>,
    ) -> StorageResult<Vec<String>> {
        self.check().await?;
        self.db.queues_matching(namespace, task).await
    }
    async fn next_pending(
        &self,
        queues: &[String],
        group: &str,
    ) -> StorageResult<Option<Timestamp>> {
        self.check().await?;
        self.db.next_pending(queues, group).await
    }
    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        self.check().await?;
        self.db.pending_partitions(queue, group, after, limit).await
    }
    async fn partition_numbers(&self, partition_ids: &[String]) -> StorageResult<Vec<Option<u64>>> {
        self.check().await?;
        self.db.partition_numbers(partition_ids).await
    }
}
