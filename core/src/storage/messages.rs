//! Push, ack and lease renewal: what goes in and what comes back.
use std::fmt;

use crate::frames::Frame;
use crate::types::{Offset, Timestamp};
use crate::WorkerId;

/// The messages of one push request for one (queue, partition), in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushGroup {
    pub queue: String,
    pub partition: String,
    /// Frames with broker-minted message ids. Duplicates (by transactionId) are filtered by
    /// storage, under the partition row's lock, before the segment is written.
    pub frames: Vec<Frame>,
    /// The client's zstd frame of exactly `frames` (a framed binary push), stored as it came
    /// when every frame is kept.
    pub blob: Option<Vec<u8>>,
}

/// Whether a push honours its queue's `encryptionEnabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealCheck {
    /// Plaintext payloads to an encrypted queue are refused (`StorageError::EncryptionRequired`).
    Enforce,
    /// The frames are stored as they are: a requeue pushes a stored message again, admitted
    /// under the queue's options of its time.
    AsStored,
}

impl PushGroup {
    /// Every payload of the group is sealed (what an encrypted queue accepts).
    pub fn is_sealed(&self) -> bool {
        self.frames.iter().all(|f| f.encrypted)
    }

    /// `Err(EncryptionRequired)` when `check` enforces and the queue (`encrypted`: its
    /// `encryptionEnabled`) needs sealed payloads this group does not have.
    pub fn seal_check(&self, encrypted: bool, check: SealCheck) -> Result<(), super::StorageError> {
        if encrypted && check == SealCheck::Enforce && !self.is_sealed() {
            return Err(super::StorageError::EncryptionRequired {
                queue: self.queue.clone(),
            });
        }
        Ok(())
    }

    /// The segment blob of the frames a push keeps (the group's frames minus duplicates, in
    /// order): the client's own blob when every frame is kept, else built here.
    pub fn segment_blob(&self, kept: &[Frame]) -> Result<Vec<u8>, crate::frames::FrameError> {
        match &self.blob {
            Some(blob) if kept.len() == self.frames.len() => Ok(blob.clone()),
            _ => crate::frames::build_blob(kept),
        }
    }
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

/// A whole delivered batch to commit (`MessageStorage::ack_batch_ends`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchEnd {
    pub partition_id: String,
    /// The offset of the batch's last delivered message: where its claim ended.
    pub end_offset: Offset,
    /// Still stored only if the whole batch is (retention removes a partition's oldest first).
    pub first_transaction_id: String,
}

/// One lease's whole delivered batches to commit (`MessageStorage::ack_batch_ends_many`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseBatchEnds {
    pub group: String,
    pub lease: WorkerId,
    pub batches: Vec<BatchEnd>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckOutcome {
    pub success: bool,
    pub error: Option<String>,
    pub queue: Option<String>,
    pub partition: Option<String>,
    pub lease_released: bool,
    pub dlq: bool,
    /// A completed ack of a message the cursor had already passed: it succeeded and changed
    /// nothing (Queen's `noop`).
    pub noop: bool,
}

/// The error of an ack whose message storage cannot find: no such transactionId in the
/// partition it names (Queen's clients read "unresolvable" in it). The one wording of both
/// backends.
pub const ACK_NOT_FOUND: &str =
    "Message not found: its transactionId is unresolvable in that partition";

/// The error of a nack (failed, retry, dlq) of a message the cursor had already passed: it can
/// be neither retried nor dead-lettered, and the caller is told rather than answered ok.
pub const ACK_ALREADY_COMMITTED: &str =
    "Message already committed: the cursor is past it, so it can be neither retried nor dead-lettered";

impl AckOutcome {
    pub fn refused(error: &str) -> Self {
        AckOutcome {
            success: false,
            error: Some(error.to_string()),
            queue: None,
            partition: None,
            lease_released: false,
            dlq: false,
            noop: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewOutcome {
    /// Partitions whose lease was extended.
    pub renewed: u32,
    pub expires_at: Option<Timestamp>,
}
