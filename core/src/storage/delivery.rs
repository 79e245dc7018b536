//! Transactions, dead letters and consumer-group management.
use super::messages::{AckItem, AckOutcome, PushGroup, PushGroupResult, PushOutcome};
use super::pop::SegmentRow;
use crate::kv::KvOp;
use crate::timers::TimerOp;
use crate::types::{Offset, Timestamp};

/// One operation of a transaction, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub enum TxOp {
    Push(Vec<PushGroup>),
    Ack {
        group: String,
        item: AckItem,
    },
    /// A KV rider op (a lock guard is a `check`).
    Kv(KvOp),
    /// A timer rider op.
    Timer(TimerOp),
    /// Removes a due timer (this incarnation: its message id) so its push in the same
    /// transaction is its one firing; refused when it is no longer pending or not yet due.
    FireTimer {
        queue: String,
        key: String,
        message_id: uuid::Uuid,
    },
    /// A stream cycle's fence and state ops (placed first in the cycle's transaction).
    Stream(crate::streams::StreamCycleOp),
    /// Ends the lease `lease_id` holds on the partition for `group`, if it still holds a live
    /// one (`crate::streams::lease_holds`): a stream cycle that owns its whole batch, after an
    /// ack short of the batch's end. Answered as an ack that never fails, `lease_released`
    /// saying whether a lease ended (an ack at the batch's end already ended it).
    EndLease {
        group: String,
        partition_id: String,
        lease_id: String,
    },
}

/// The answer of one transaction operation.
#[derive(Clone, Debug, PartialEq)]
pub enum TxOpResult {
    Push(Vec<PushGroupResult>),
    Ack(AckOutcome),
    /// A KV rider's answer; `refused` when it is `applied: false`.
    Kv {
        answer: serde_json::Value,
        refused: bool,
        required: bool,
    },
    Timer(serde_json::Value),
    /// Whether the timer was still pending and due (and is now removed).
    Fired(bool),
    /// A stream cycle's state ops applied, or why the cycle commits nothing.
    Stream(Result<usize, crate::streams::StreamRefusal>),
}

impl TxOpResult {
    /// Why this operation makes its transaction roll back, if it was refused: a push that met
    /// a queue at its maxSize, or an ack storage refused. The one wording of both backends; it
    /// says the transaction was rolled back, which Queen's clients read from the error.
    pub fn refusal(&self) -> Option<String> {
        match self {
            TxOpResult::Push(groups) => groups.iter().flatten().find_map(|o| match o {
                PushOutcome::Rejected { full, .. } => Some(format!(
                    "PUSH operation failed: {full}; the transaction was rolled back"
                )),
                _ => None,
            }),
            TxOpResult::Ack(a) => (!a.success).then(|| {
                format!(
                    "ACK operation failed: {}; the transaction was rolled back",
                    a.error.as_deref().unwrap_or("refused")
                )
            }),
            TxOpResult::Kv {
                refused, required, ..
            } => (*refused && *required).then(|| KV_PRECONDITION.to_string()),
            TxOpResult::Timer(_) => None,
            TxOpResult::Fired(fired) => {
                (!fired).then(|| "the timer is no longer pending, or not yet due".to_string())
            }
            TxOpResult::Stream(r) => r.err().map(|e| e.message().to_string()),
        }
    }
}

/// The refusal of a transaction whose `required` KV rider op did not apply.
pub const KV_PRECONDITION: &str = "kv_precondition";

/// A transaction's outcome: committed with every result, or rolled back at the failing ack.
#[derive(Clone, Debug, PartialEq)]
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

/// The transactionId a requeued dead letter is pushed under: unique per dead letter, so the
/// original's de-duplication entry does not swallow it.
pub fn requeue_transaction_id(dead_letter_id: i64, original: &str) -> String {
    let mut t = format!("requeue-{dead_letter_id}-{original}");
    while t.len() > crate::types::MAX_NAME_BYTES {
        t.pop();
    }
    t
}

/// One page of the dead-letter listing, newest first, and how many match the filters in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterPage {
    pub entries: Vec<DeadLetterEntry>,
    pub total: u64,
}

/// A dead letter pushed again: where it went and how its push ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeued {
    pub queue: String,
    pub partition: String,
    pub outcome: PushOutcome,
}

/// What a consumer-group delete removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupDeleted {
    pub cursors: u32,
    pub subscription_records: u32,
}
