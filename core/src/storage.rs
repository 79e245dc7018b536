//! The `Storage` trait: what the broker asks of a backend. PostgreSQL (`queen-storage-pg`) is the
//! production implementation; `queen-storage-sim` is the in-memory model held to it.
//!
//! Storage decides claim, lease, cursor and visibility. It never looks inside a blob: a pop answer
//! carries raw segment rows and the broker slices frames.

use std::fmt;

use async_trait::async_trait;

use crate::claim::SubscriptionIntent;
use crate::frames::Frame;
use crate::types::{Offset, Timestamp, WorkerId};

/// A queue's configuration row (`queen.queues`), with the options of the configure endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig {
    pub name: String,
    pub namespace: String,
    pub task: String,
    pub lease_time: u32,
    pub retry_limit: u32,
    /// Milliseconds a `failed` ack holds the partition (for that group) before the redelivery.
    pub retry_delay: u32,
    /// Order of queues in a namespace/task pop: higher first.
    pub priority: i32,
    pub delayed_processing: u32,
    pub window_buffer: u32,
    /// Cap on the queue's backlog (messages some consumer group has not passed; all messages
    /// while no group has a cursor). A push that would exceed it is refused. 0 = no cap.
    pub max_size: u32,
    /// Seconds a message stays deliverable; older messages are skipped. 0 = forever (0.15 stored
    /// 3600 but never enforced it, so enforcing that default would silently drop old backlogs).
    pub ttl: u32,
    pub retention_enabled: bool,
    pub retention_seconds: u32,
    pub completed_retention_seconds: u32,
    pub encryption_enabled: bool,
    /// Keep dead letters. Off: a message that exhausts its retries or is acked `dlq` is
    /// discarded. On by default (0.15 always kept them; clients never send the flag).
    pub dead_letter_queue: bool,
    /// Dead-letter a message after `retry_limit` failed retries. Off: retried until acknowledged.
    pub dlq_after_max_retries: bool,
    pub max_wait_time_seconds: u32,
    /// Milliseconds an under-full claim may be held back (0 = off).
    pub min_pop_wait_time: u32,
}

impl QueueConfig {
    /// The server defaults of a queue created by configure without options, or by a first push.
    pub fn with_defaults(name: &str) -> Self {
        let (namespace, task) = crate::types::namespace_and_task(name);
        QueueConfig {
            name: name.to_string(),
            namespace,
            task,
            lease_time: 300,
            retry_limit: 3,
            retry_delay: 1000,
            priority: 0,
            delayed_processing: 0,
            window_buffer: 0,
            max_size: 0,
            ttl: 0,
            retention_enabled: false,
            retention_seconds: 0,
            completed_retention_seconds: 0,
            encryption_enabled: false,
            dead_letter_queue: true,
            dlq_after_max_retries: true,
            max_wait_time_seconds: 0,
            min_pop_wait_time: 0,
        }
    }
}

/// The messages of one push request for one (queue, partition), in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushGroup {
    pub queue: String,
    pub partition: String,
    /// Frames with broker-minted message ids. Duplicates (by transactionId) are filtered by
    /// storage, under the partition row's lock, before the segment is written.
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushOutcome {
    Queued {
        message_id: uuid::Uuid,
        partition_id: String,
        offset: Offset,
    },
    /// The (partition, transactionId) was already stored: the original message's id.
    Duplicate {
        message_id: uuid::Uuid,
        partition_id: String,
    },
    /// Not stored: the queue is at its `maxSize`. The whole group is refused together.
    Rejected {
        message_id: uuid::Uuid,
        partition_id: String,
        full: QueueFull,
    },
}

/// A push refused because its queue is at its maxSize: the cap and the backlog the push met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueFull {
    pub queue: String,
    pub max_size: u32,
    pub backlog: u64,
}

impl fmt::Display for QueueFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "queue {} is full: maxSize {}, backlog {}",
            self.queue, self.max_size, self.backlog
        )
    }
}

impl PushOutcome {
    /// The stored message's id (the original's, for a duplicate).
    pub fn message_id(&self) -> uuid::Uuid {
        match self {
            PushOutcome::Queued { message_id, .. }
            | PushOutcome::Duplicate { message_id, .. }
            | PushOutcome::Rejected { message_id, .. } => *message_id,
        }
    }

    pub fn partition_id(&self) -> &str {
        match self {
            PushOutcome::Queued { partition_id, .. }
            | PushOutcome::Duplicate { partition_id, .. }
            | PushOutcome::Rejected { partition_id, .. } => partition_id,
        }
    }
}

/// One push group's outcomes, one per frame in the group's order.
pub type PushGroupResult = Vec<PushOutcome>;

/// Parameters every pop shape shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PopRequest {
    pub queue: String,
    pub group: String,
    pub worker: WorkerId,
    /// Global message cap across partitions.
    pub batch: u32,
    /// How many partitions one call may claim.
    pub max_partitions: u32,
    pub auto_ack: bool,
    pub lease_seconds: Option<u32>,
    pub intent: SubscriptionIntent,
    /// Storage skips the windowBuffer debounce (for a caller that owns the hold itself). The
    /// broker passes false: the debounce's verdict carries the exact end of the hold.
    pub skip_window_debounce: bool,
}

/// A raw segment row of a pop answer: frames [start_idx, start_idx + take) of `blob`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRow {
    pub base_offset: Offset,
    pub start_idx: u32,
    pub take: u32,
    pub msg_count: u32,
    pub created_at: Timestamp,
    pub blob: std::sync::Arc<Vec<u8>>,
}

/// One partition claimed by a pop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub queue: String,
    pub partition: String,
    /// Never empty: resolved after the claim, inside the same function (see log_pop_specific_v1).
    pub partition_id: String,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub attempt_count: u32,
    /// `None` for autoAck.
    pub lease_expires_at: Option<Timestamp>,
    pub rows: Vec<SegmentRow>,
}

impl Claim {
    pub fn message_count(&self) -> u32 {
        self.rows.iter().map(|r| r.take).sum()
    }
}

/// The per-candidate verdict a pop checks back into the hot-list ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered `count` messages; `leased_until` is the new lease (None for autoAck).
    Took {
        count: u32,
        leased_until: Option<Timestamp>,
    },
    /// Nothing deliverable for this group.
    Empty,
    /// Another consumer holds a live lease until then.
    LeasedUntil(Timestamp),
    /// A concurrent pop holds the row, or another pop is creating it: skip for one cycle.
    Busy,
    /// windowBuffer or delayedProcessing defers delivery until then.
    DeferredUntil(Timestamp),
    /// The partition does not exist.
    Missing,
    /// The budget (batch or partitions) was spent before this candidate was tried.
    NotEvaluated,
}

impl Verdict {
    /// The first instant the partition may be deliverable again, for a revisit: a lease holds
    /// while `lease_expires_at >= now` (storage's claim tests `<`), so it ends just after its
    /// expiry; a deferral ends at its instant; a busy row is tried again shortly. `None`: no
    /// revisit (taken, empty, missing, or not evaluated).
    pub fn revisit_at(&self, now: Timestamp) -> Option<Timestamp> {
        match self {
            Verdict::LeasedUntil(t) => Some(t.just_after()),
            Verdict::DeferredUntil(t) => Some(*t),
            Verdict::Busy => Some(now.plus_millis(crate::ring::BUSY_REVISIT_MS)),
            Verdict::Took { .. } | Verdict::Empty | Verdict::Missing | Verdict::NotEvaluated => {
                None
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PopResult {
    pub claims: Vec<Claim>,
    /// (partition name, verdict) for every candidate considered.
    pub verdicts: Vec<(String, Verdict)>,
}

impl PopResult {
    pub fn message_count(&self) -> u32 {
        self.claims.iter().map(Claim::message_count).sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckStatus {
    Completed,
    Failed,
    Retry,
    Dlq,
}

impl AckStatus {
    pub fn parse(s: &str) -> Option<AckStatus> {
        match s {
            "completed" | "success" => Some(AckStatus::Completed),
            "failed" => Some(AckStatus::Failed),
            "retry" => Some(AckStatus::Retry),
            "dlq" => Some(AckStatus::Dlq),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckItem {
    pub transaction_id: String,
    pub partition_id: String,
    pub status: AckStatus,
    /// When present, the ack is fenced: it must match the live lease.
    pub lease_id: Option<String>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckOutcome {
    pub success: bool,
    pub error: Option<String>,
    pub queue: Option<String>,
    pub partition: Option<String>,
    pub lease_released: bool,
    pub dlq: bool,
}

impl AckOutcome {
    pub fn refused(error: &str) -> Self {
        AckOutcome {
            success: false,
            error: Some(error.to_string()),
            queue: None,
            partition: None,
            lease_released: false,
            dlq: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewOutcome {
    /// Partitions whose lease was extended.
    pub renewed: u32,
    pub expires_at: Option<Timestamp>,
}

/// A storage failure. Every variant leaves storage unchanged: the transaction rolled back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageError {
    /// The backend could not be reached or the connection broke (5xx; safe to retry).
    Unavailable(String),
    /// The request is invalid for the stored state (4xx).
    Invalid(String),
    /// Anything else the backend reported (5xx).
    Internal(String),
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Unavailable(e) => write!(f, "storage unavailable: {e}"),
            StorageError::Invalid(e) => write!(f, "invalid request: {e}"),
            StorageError::Internal(e) => write!(f, "storage error: {e}"),
        }
    }
}

impl std::error::Error for StorageError {}

pub type StorageResult<T> = Result<T, StorageError>;

/// What the broker needs from a backend. Object safe: the server holds an `Arc<dyn Storage>`.
#[async_trait]
pub trait Storage: Send + Sync {
    /// Creates or overwrites a queue's configuration (and its `Default` partition).
    /// Returns (queue id, Default partition id).
    async fn configure_queue(&self, config: QueueConfig) -> StorageResult<(String, String)>;
    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>>;
    /// Deletes a queue with its partitions, segments, cursors and dead letters; false if absent.
    async fn delete_queue(&self, queue: &str) -> StorageResult<bool>;

    /// One transaction for the whole request. Outcomes align with `groups`.
    async fn push(&self, groups: Vec<PushGroup>) -> StorageResult<Vec<PushGroupResult>>;

    /// `log_pop_specific_v1`: one named partition.
    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult>;
    /// `log_pop_list_v1`: candidate names from the broker's hot-list ring.
    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult>;
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
    /// (coarse, may be stale; a pop's verdict puts a leased one on the wheel until its expiry).
    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        limit: u32,
    ) -> StorageResult<Vec<String>>;

    /// Positional cursor advances fenced by the lease; one outcome per item, in order.
    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>>;
    /// Extends every live lease held under `lease_id` to at least now + seconds.
    async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome>;
}

/// One operation of a transaction, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxOp {
    Push(Vec<PushGroup>),
    Ack { group: String, item: AckItem },
}

/// The answer of one transaction operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxOpResult {
    Push(Vec<PushGroupResult>),
    Ack(AckOutcome),
}

impl TxOpResult {
    /// Why this operation makes its transaction roll back, if it was refused: a push that met
    /// a queue at its maxSize, or an ack storage refused. The one wording of both backends.
    pub fn refusal(&self) -> Option<String> {
        match self {
            TxOpResult::Push(groups) => groups.iter().flatten().find_map(|o| match o {
                PushOutcome::Rejected { full, .. } => {
                    Some(format!("PUSH operation failed: {full}"))
                }
                _ => None,
            }),
            TxOpResult::Ack(a) => (!a.success).then(|| {
                format!(
                    "ACK operation failed: {}",
                    a.error.as_deref().unwrap_or("refused")
                )
            }),
        }
    }
}

/// A transaction's outcome: committed with every result, or rolled back at the failing ack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    pub committed: bool,
    pub results: Vec<TxOpResult>,
    pub error: Option<String>,
}

/// Where a consumer group's cursors on a queue move to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTarget {
    /// Past everything stored now.
    End,
    /// Just after the last message created at or before the instant (the start if none).
    Timestamp(Timestamp),
}

/// Filters of the dead-letter listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DlqQuery {
    pub queue: String,
    pub group: Option<String>,
    pub partition: Option<String>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
    pub limit: u32,
    pub offset: u32,
}

/// A dead letter with the segment row that holds its message (`None` once retention removed it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterEntry {
    pub id: i64,
    pub queue: String,
    pub partition: String,
    pub partition_id: String,
    pub group: String,
    pub offset: Offset,
    pub transaction_id: String,
    pub error: Option<String>,
    pub retry_count: u32,
    pub failed_at: Timestamp,
    pub segment: Option<SegmentRow>,
}

/// Delivery-contract operations beyond the pop: transactions, dead letters, group management.
#[async_trait]
pub trait DeliveryStorage: Send + Sync {
    /// Runs acks and pushes in one transaction; a refused ack rolls everything back.
    async fn transaction(&self, ops: Vec<TxOp>) -> StorageResult<TxOutcome>;
    /// Dead letters newest first, and the total matching the filters.
    async fn dead_letters(&self, query: DlqQuery) -> StorageResult<(Vec<DeadLetterEntry>, u64)>;
    /// Moves a group's existing cursors on a queue; returns how many moved. Leases end.
    async fn seek_group(&self, group: &str, queue: &str, target: SeekTarget) -> StorageResult<u32>;
    /// Deletes a group's cursors (on one queue, or all) and optionally its subscription records.
    /// Returns (cursors deleted, subscription records deleted).
    async fn delete_group(
        &self,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> StorageResult<(u32, u32)>;
    /// Sets the subscription timestamp of every record of a group; returns rows updated.
    async fn update_subscription(&self, group: &str, timestamp: Timestamp) -> StorageResult<u32>;
    /// Pushes a dead letter's message again (as a new message, `new_message_id`) and removes the
    /// dead letter, in one transaction. `None` when there is no such dead letter, or its message
    /// is gone (retention). Answers (queue, partition, outcome).
    async fn requeue_dead_letter(
        &self,
        id: i64,
        new_message_id: uuid::Uuid,
    ) -> StorageResult<Option<(String, String, PushOutcome)>>;
}

/// The transactionId a requeued dead letter is pushed under: unique per dead letter, so the
/// original's de-duplication entry does not swallow it.
pub fn requeue_transaction_id(dead_letter_id: i64, original: &str) -> String {
    let mut t = format!("requeue-{dead_letter_id}-{original}");
    while t.len() > crate::types::MAX_NAME_BYTES {
        t.pop();
    }
    t
}
