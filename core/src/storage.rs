//! What the broker asks of a backend, by capability (`StorageSet` holds one of each): pops,
//! messages (push, ack, renew), admin (queues and consumer groups), delivery (transactions, dead
//! letters), retention, health, inspect (the admin routes' reads), KV and locks, timers, reads by
//! offset, streams, and ephemeral queues (their configuration and their owners). PostgreSQL
//! (`queen-storage-pg`) is the production implementation; `queen-storage-sim` is the in-memory
//! model held to it. A backend implements each; `Storage` is all of them, for the server's one
//! `Arc<dyn Storage>`.
//!
//! Storage decides claim, lease, cursor and visibility. It never looks inside a blob: a pop answer
//! carries raw segment rows and the broker slices frames.

mod delivery;
mod ephemeral;
mod inspect;
mod kv;
mod messages;
mod pop;
mod queue;
mod reads;
mod retention;
mod streams;
mod timers;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

pub use delivery::{
    requeue_transaction_id, DeadLetterEntry, DeadLetterPage, DlqQuery, GroupDeleted, Requeued,
    SeekTarget, TxOp, TxOpResult, TxOutcome, KV_PRECONDITION,
};
pub use ephemeral::{
    EphemeralBroker, EphemeralClaim, EphemeralConfigStorage, EphemeralOwnerStorage,
};
pub use inspect::{
    CreatedCount, CursorView, DeadLetterRef, InspectStorage, PartitionView, QueueFilter, QueueView,
    SegmentMark, SegmentQuery, StoredMessage, StoredSegment, StoredTotals, TraceInput, TraceName,
    TraceRecord, WorkerSample,
};
pub use kv::KvStorage;
pub use messages::{
    AckItem, AckOutcome, AckStatus, BatchEnd, LeaseBatchEnds, PushGroup, PushGroupResult,
    PushOutcome, QueueFull, RenewOutcome, SealCheck, ACK_ALREADY_COMMITTED, ACK_NOT_FOUND,
};
pub use pop::{Claim, PopRequest, PopResult, SegmentRow, Verdict};
pub use queue::{ConfiguredQueue, QueueConfig};
pub use reads::{PartitionRead, ReadStorage};
pub use retention::{
    reads_from, removal, ConsumedFloor, Cutoffs, Removal, Removed, RetentionBatch, RetentionMark,
    RetentionPass,
};
pub use streams::StreamStorage;
pub use timers::{firing, TimerStorage};

use crate::types::{Timestamp, WorkerId};

/// A storage failure. Every variant leaves storage unchanged: the transaction rolled back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageError {
    /// The backend could not be reached or the connection broke (5xx; safe to retry).
    Unavailable(String),
    /// The request is invalid for the stored state (400).
    Invalid(String),
    /// The request conflicts with stored data (a constraint it would break; 409).
    Conflict(String),
    /// A serialization failure or deadlock: the transaction rolled back and running it again
    /// may succeed. Storage retries these itself a few times before answering with it (503).
    Contention(String),
    /// A push of plaintext payloads to a queue whose `encryptionEnabled` is set: nothing was
    /// stored. The broker seals the queue's payloads and pushes again (storage checks the flag in
    /// the push's own transaction, so no broker's stale view of the queue stores plaintext).
    EncryptionRequired { queue: String },
    /// Anything else the backend reported (5xx).
    Internal(String),
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Unavailable(e) => write!(f, "storage unavailable: {e}"),
            StorageError::Invalid(e) => write!(f, "invalid request: {e}"),
            StorageError::Conflict(e) => write!(f, "conflict: {e}"),
            StorageError::Contention(e) => write!(f, "storage contention: {e}"),
            StorageError::EncryptionRequired { queue } => {
                write!(
                    f,
                    "queue {queue} has encryptionEnabled: its payloads must be encrypted"
                )
            }
            StorageError::Internal(e) => write!(f, "storage error: {e}"),
        }
    }
}

impl StorageError {
    /// The database is unreachable, restarting or contended: nothing is wrong with the request,
    /// and the same request later may succeed.
    /// The SQLSTATE a PostgreSQL error carried: the PostgreSQL backend ends a database error's
    /// text with it in parentheses (`context: message (53200)`). `None` for the model's errors
    /// and for failures with no database answer (a broken connection).
    pub fn sqlstate(&self) -> Option<&str> {
        let text = match self {
            StorageError::Unavailable(t)
            | StorageError::Invalid(t)
            | StorageError::Conflict(t)
            | StorageError::Contention(t)
            | StorageError::Internal(t) => t.as_str(),
            StorageError::EncryptionRequired { .. } => return None,
        };
        let code = text.strip_suffix(')')?.rsplit_once('(')?.1;
        (code.len() == 5
            && code
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
        .then_some(code)
    }

    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StorageError::Unavailable(_) | StorageError::Contention(_)
        )
    }
}

impl std::error::Error for StorageError {}

#[cfg(test)]
mod sqlstate_tests {
    use super::StorageError;

    #[test]
    fn the_sqlstate_is_read_from_a_database_error_only() {
        let e = StorageError::Unavailable("pop: out of shared memory (53200)".into());
        assert_eq!(e.sqlstate(), Some("53200"));
        let e = StorageError::Internal("push: relation missing (42P01)".into());
        assert_eq!(e.sqlstate(), Some("42P01"));
        let e = StorageError::Unavailable("no database connection: closed".into());
        assert_eq!(e.sqlstate(), None);
        let e = StorageError::Invalid("a name (too long)".into());
        assert_eq!(e.sqlstate(), None);
    }
}

pub type StorageResult<T> = Result<T, StorageError>;

/// The pop path: claims under `FOR UPDATE SKIP LOCKED`, and what the scheduler asks to decide
/// where to look next.
#[async_trait]
pub trait PopStorage: Send + Sync {
    /// A queue's options, which shape how it is popped (windowBuffer, minPopWaitTime).
    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>>;
    /// `log_pop_specific_v2`: one named partition.
    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult>;
    /// Candidate names from the broker's hot-list ring, one transaction (`log_pop_loop_v2`).
    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult>;
    /// Several ring pops, of any queues and groups, answered in order: each answer is what
    /// `pop_list` would have answered at its turn, after the pops before it. A backend may run
    /// them all in one transaction (PostgreSQL does: one statement instead of one per pop, which
    /// is what a push read by many groups wakes); this default runs them one after another.
    async fn pop_list_many(
        &self,
        pops: Vec<(PopRequest, Vec<String>)>,
    ) -> Vec<StorageResult<PopResult>> {
        let mut answers = Vec::with_capacity(pops.len());
        for (req, candidates) in pops {
            answers.push(self.pop_list(req, candidates).await);
        }
        answers
    }
    /// The wildcard scan (legacy path, and every first contact of a (queue, group)).
    async fn pop_wildcard(&self, req: PopRequest) -> StorageResult<PopResult>;
    /// Queues matching a namespace and/or task, for the discovery pop, in the order it tries
    /// them: higher `priority` first, then by name.
    async fn queues_matching(
        &self,
        namespace: Option<String>,
        task: Option<String>,
    ) -> StorageResult<Vec<String>>;
    /// `log_next_pending_v1`: the first instant something becomes deliverable to the group in
    /// any of `queues`, as far as cursors and leases tell. `None`: nothing is pending at all; a
    /// time at or before storage's now: something is claimable now; a later time: every
    /// partition with a backlog is leased (or held after a failed ack), and the earliest lease
    /// ends just before then (see `Verdict::revisit_at`).
    /// Visibility options (delay, window, ttl) are the pop's to report, as `DeferredUntil`.
    async fn next_pending(
        &self,
        queues: &[String],
        group: &str,
    ) -> StorageResult<Option<Timestamp>>;
    /// Partitions with a backlog for the group, claimable or leased, for seeding the ring
    /// (coarse, may be stale; a pop's verdict puts a leased one on the wheel until its expiry):
    /// the first `limit` by name (bytewise) after `after`, so a walk pages through a large queue.
    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>>;
    /// The numbers of partitions named by id, in order (`None`: no such partition). A number
    /// never changes, so callers may keep it.
    async fn partition_numbers(&self, partition_ids: &[String]) -> StorageResult<Vec<Option<u64>>>;
}

/// Messages in and cursors forward.
#[async_trait]
pub trait MessageStorage: Send + Sync {
    /// One transaction for the whole request. Outcomes align with `groups`.
    async fn push(&self, groups: Vec<PushGroup>) -> StorageResult<Vec<PushGroupResult>> {
        self.push_accepted_at(groups, None).await
    }
    /// A push accepted earlier (drained from a broker's file buffer): stored with the time it was
    /// accepted as its `created_at` (kept monotone per partition). `None`: now.
    async fn push_accepted_at(
        &self,
        groups: Vec<PushGroup>,
        accepted_at: Option<Timestamp>,
    ) -> StorageResult<Vec<PushGroupResult>>;
    /// Several push requests in one transaction (a round): an answer per request, in order, each
    /// what `push` would have answered it. When the round cannot commit whole (a duplicate met, a
    /// queue that must encrypt, a failure), each request is sent alone, so one fails alone and
    /// nothing of it is stored.
    async fn push_round(
        &self,
        requests: Vec<Vec<PushGroup>>,
    ) -> Vec<StorageResult<Vec<PushGroupResult>>> {
        let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
        if requests.len() > 1 {
            let all: Vec<PushGroup> = requests.iter().flatten().cloned().collect();
            if let Ok(mut results) = self.push(all).await {
                if results.len() == sizes.iter().sum::<usize>() {
                    let mut answers = Vec::with_capacity(sizes.len());
                    for n in sizes.iter().rev() {
                        answers.push(Ok(results.split_off(results.len() - n)));
                    }
                    answers.reverse();
                    return answers;
                }
            }
        }
        let mut answers = Vec::with_capacity(requests.len());
        for groups in requests {
            answers.push(self.push(groups).await);
        }
        answers
    }
    /// Positional cursor advances fenced by the lease. A call holding a nack applies each
    /// partition's items in offset order whatever the order given (the nack bounds every
    /// completed ack of its call); one outcome per item, in the order given.
    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>>;
    /// Acks whole batches of one lease, the cheap form of acking each of their messages
    /// completed: where the group's cursor on a batch's partition is still under the live
    /// `lease` with that batch end not yet committed and the batch's first message still
    /// stored, commits through the end and ends the lease. Returns the partition ids committed;
    /// the others are untouched (the caller acks their items one by one, for their outcomes).
    async fn ack_batch_ends(
        &self,
        group: &str,
        lease: WorkerId,
        batches: &[BatchEnd],
    ) -> StorageResult<Vec<String>> {
        let one = LeaseBatchEnds {
            group: group.to_string(),
            lease,
            batches: batches.to_vec(),
        };
        let answers = self.ack_batch_ends_many(std::slice::from_ref(&one)).await?;
        let n = answers.len();
        match <[Vec<String>; 1]>::try_from(answers) {
            Ok([committed]) => Ok(committed),
            Err(_) => Err(StorageError::Internal(format!(
                "whole-batch ack of one lease answered {n} leases"
            ))),
        }
    }
    /// `ack_batch_ends` for several leases, of any groups, in one transaction: each lease's
    /// committed partition ids, in order. The broker sends whole-batch acks that arrive while
    /// one is in flight together, so a push read by many groups costs one statement for their
    /// acks, not one per group.
    async fn ack_batch_ends_many(
        &self,
        leases: &[LeaseBatchEnds],
    ) -> StorageResult<Vec<Vec<String>>>;
    /// Extends every live lease held under `lease_id` to at least now + `seconds`.
    async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome>;
}

/// Queues and consumer groups.
#[async_trait]
pub trait AdminStorage: Send + Sync {
    /// Creates or overwrites a queue's configuration (and its `Default` partition).
    async fn configure_queue(&self, config: QueueConfig) -> StorageResult<ConfiguredQueue>;
    /// Deletes a queue with its partitions, segments, cursors and dead letters; false if absent.
    async fn delete_queue(&self, queue: &str) -> StorageResult<bool>;
    /// Moves a group's existing cursors on a queue; returns how many moved. Leases end.
    async fn seek_group(&self, group: &str, queue: &str, target: SeekTarget) -> StorageResult<u32>;
    /// Deletes a group's cursors (on one queue, or all) and optionally its subscription records.
    async fn delete_group(
        &self,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> StorageResult<GroupDeleted>;
    /// Sets the subscription timestamp of every record of a group; returns rows updated.
    async fn update_subscription(&self, group: &str, timestamp: Timestamp) -> StorageResult<u32>;
    /// A setting every broker of the cluster shares: stores `proposed` (if any) when the setting
    /// has no value yet, and returns the stored value (the first broker's, for all later ones).
    async fn cluster_setting(
        &self,
        name: &str,
        proposed: Option<Vec<u8>>,
    ) -> StorageResult<Option<Vec<u8>>>;
}

/// The delivery contract beyond the pop: transactions and dead letters.
#[async_trait]
pub trait DeliveryStorage: Send + Sync {
    /// Runs acks and pushes in one transaction; a refused operation rolls everything back.
    async fn transaction(&self, ops: Vec<TxOp>) -> StorageResult<TxOutcome>;
    /// Dead letters newest first, and the total matching the filters.
    async fn dead_letters(&self, query: DlqQuery) -> StorageResult<DeadLetterPage>;
    /// Pushes a dead letter's message again (as a new message, `new_message_id`) and removes the
    /// dead letter, in one transaction. `None` when there is no such dead letter, or its message
    /// is gone (retention).
    async fn requeue_dead_letter(
        &self,
        id: i64,
        new_message_id: uuid::Uuid,
    ) -> StorageResult<Option<Requeued>>;
}

/// Retention and eviction (`retention.rs` holds the rules), and the cluster-wide lease that
/// keeps one broker at a time doing it.
#[async_trait]
pub trait RetentionStorage: Send + Sync {
    /// Takes (or renews) the maintenance lease `name` for `holder` until now + `seconds`. False:
    /// another holder's lease is live, and this broker skips the cycle. A holder that dies loses
    /// it when it runs out.
    async fn claim_maintenance(
        &self,
        name: &str,
        holder: &str,
        seconds: u32,
    ) -> StorageResult<bool>;
    /// Ends `holder`'s lease early (nothing if it is not the holder).
    async fn release_maintenance(&self, name: &str, holder: &str) -> StorageResult<()>;
    /// Queues with something for the pass to do (retention enabled, or maxWaitTimeSeconds set).
    async fn retention_queues(&self, pass: RetentionPass) -> StorageResult<Vec<String>>;
    /// One batch of a queue's pass: up to `limit` partitions whose oldest segment is old
    /// enough, after `after` in (oldest segment, id) order, each cleared of what the rules
    /// allow. Partitions a push holds are skipped until the next cycle.
    async fn retention_batch(
        &self,
        queue: &str,
        pass: RetentionPass,
        after: Option<RetentionMark>,
        limit: u32,
    ) -> StorageResult<RetentionBatch>;
    /// Deletes up to `limit` partitions that hold no segment, had no push for `inactive_secs`
    /// and no live lease (with their cursor rows); how many. A later push recreates one.
    async fn remove_inactive_partitions(
        &self,
        inactive_secs: u64,
        limit: u32,
    ) -> StorageResult<u64>;
    /// Deletes up to `limit` dead letters that failed more than `older_than_secs` ago.
    async fn remove_old_dead_letters(&self, older_than_secs: u64, limit: u32)
        -> StorageResult<u64>;
}

/// Whether the backend answers, and what the metrics report about it.
#[async_trait]
pub trait HealthStorage: Send + Sync {
    /// One round trip to the backend.
    async fn health(&self) -> StorageHealth;
    /// The backend's name and connection-pool use, for metrics.
    fn usage(&self) -> StorageUsage;
}

/// A partition named by its number (1 to 18 digits, as ack_v2 reads it: a framed pop's `partitionId`), not its id.
pub fn partition_number(reference: &str) -> Option<u64> {
    if reference.is_empty()
        || reference.len() > 18
        || !reference.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    reference.parse().ok()
}

/// The answer of a health check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageHealth {
    pub reachable: bool,
    /// What the health route reports as `database`: "in-memory", "connected", "unreachable".
    pub database: &'static str,
}

/// A backend's name and pool use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageUsage {
    pub backend: &'static str,
    pub pool_in_use: usize,
    pub pool_size: usize,
}

/// Every capability: what one broker serves from.
pub trait Storage:
    PopStorage
    + MessageStorage
    + AdminStorage
    + DeliveryStorage
    + RetentionStorage
    + HealthStorage
    + InspectStorage
    + KvStorage
    + TimerStorage
    + ReadStorage
    + StreamStorage
    + EphemeralConfigStorage
    + EphemeralOwnerStorage
{
}

impl<T> Storage for T where
    T: PopStorage
        + MessageStorage
        + AdminStorage
        + DeliveryStorage
        + RetentionStorage
        + HealthStorage
        + InspectStorage
        + KvStorage
        + TimerStorage
        + ReadStorage
        + StreamStorage
        + EphemeralConfigStorage
        + EphemeralOwnerStorage
{
}

/// One backend as the broker holds it: a handle per capability, so a route names what it uses
/// and a test can stand in for one capability alone.
#[derive(Clone)]
pub struct StorageSet {
    pub pops: Arc<dyn PopStorage>,
    pub messages: Arc<dyn MessageStorage>,
    pub admin: Arc<dyn AdminStorage>,
    pub delivery: Arc<dyn DeliveryStorage>,
    pub retention: Arc<dyn RetentionStorage>,
    pub health: Arc<dyn HealthStorage>,
    pub inspect: Arc<dyn InspectStorage>,
    pub kv: Arc<dyn KvStorage>,
    pub timers: Arc<dyn TimerStorage>,
    pub reads: Arc<dyn ReadStorage>,
    pub streams: Arc<dyn StreamStorage>,
    pub ephemeral: Arc<dyn EphemeralConfigStorage>,
    pub ephemeral_owners: Arc<dyn EphemeralOwnerStorage>,
}

impl StorageSet {
    /// Every capability served by one backend.
    pub fn of<S: Storage + 'static>(backend: Arc<S>) -> Self {
        StorageSet {
            pops: backend.clone(),
            messages: backend.clone(),
            admin: backend.clone(),
            delivery: backend.clone(),
            retention: backend.clone(),
            health: backend.clone(),
            inspect: backend.clone(),
            kv: backend.clone(),
            timers: backend.clone(),
            reads: backend.clone(),
            streams: backend.clone(),
            ephemeral: backend.clone(),
            ephemeral_owners: backend,
        }
    }
}
