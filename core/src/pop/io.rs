//! The pop machine's inputs and effects: the storage commands it asks the driver to run and
//! their replies, the inputs the driver feeds, the effects it performs and the final reply.

use crate::storage::{Claim, PopRequest, PopResult, QueueConfig, StorageError, StorageResult};
use crate::types::{Timestamp, WorkerId};

/// A storage call the driver performs for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageCommand {
    PopPartition {
        req: PopRequest,
        partition: String,
    },
    PopList {
        req: PopRequest,
        candidates: Vec<String>,
    },
    PopWildcard {
        req: PopRequest,
    },
    QueuesMatching {
        namespace: Option<String>,
        task: Option<String>,
    },
    /// When something next becomes deliverable to the group in these queues (see
    /// `Storage::next_pending`).
    NextPending {
        queues: Vec<String>,
        group: String,
    },
    PendingPartitions {
        queue: String,
        group: String,
        /// The page starts after this name (`None`: the first page of a walk).
        after: Option<String>,
        limit: u32,
    },
    QueueConfig {
        queue: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum StorageReply {
    Pop(PopResult),
    NextPending(Option<Timestamp>),
    Names(Vec<String>),
    Config(Option<QueueConfig>),
}

/// Runs a command against a backend: the whole of the driver's storage effect.
pub async fn execute(
    storage: &dyn crate::storage::PopStorage,
    command: StorageCommand,
) -> StorageResult<StorageReply> {
    Ok(match command {
        StorageCommand::PopPartition { req, partition } => {
            StorageReply::Pop(storage.pop_partition(req, partition).await?)
        }
        StorageCommand::PopList { req, candidates } => {
            StorageReply::Pop(storage.pop_list(req, candidates).await?)
        }
        StorageCommand::PopWildcard { req } => StorageReply::Pop(storage.pop_wildcard(req).await?),
        StorageCommand::QueuesMatching { namespace, task } => {
            StorageReply::Names(storage.queues_matching(namespace, task).await?)
        }
        StorageCommand::NextPending { queues, group } => {
            StorageReply::NextPending(storage.next_pending(&queues, &group).await?)
        }
        StorageCommand::PendingPartitions {
            queue,
            group,
            after,
            limit,
        } => StorageReply::Names(
            storage
                .pending_partitions(&queue, &group, after.as_deref(), limit)
                .await?,
        ),
        StorageCommand::QueueConfig { queue } => {
            StorageReply::Config(storage.queue_config(&queue).await?)
        }
    })
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopInput {
    /// Begin (or nothing: the first `handle` of a new machine).
    Start,
    PermitGranted,
    StorageDone {
        id: u64,
        result: StorageResult<StorageReply>,
    },
    /// The queue's wake gate opened (a deliverability event, or the ring wheel's ticker).
    Wake,
    /// The timer of the last `Park` fired. A spurious timer is a harmless no-op.
    Timer,
    /// The client went away.
    Cancel,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopReply {
    Messages {
        worker: WorkerId,
        auto_ack: bool,
        claims: Vec<Claim>,
    },
    Empty,
    Failed(StorageError),
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopEffect {
    /// Take a serving permit, then feed `PermitGranted`.
    AcquirePermit,
    /// Return the permit; `rtt_us` is the storage latency under it, if any work completed.
    ReleasePermit {
        rtt_us: Option<u64>,
    },
    Storage {
        id: u64,
        command: StorageCommand,
    },
    /// Wait for `Wake`, or feed `Timer` at `until`. Holds no permit and no connection.
    Park {
        until: Timestamp,
    },
    /// Wake one more parked queue-wide pop of this pop's (queue, group) on this broker: this pop
    /// may leave work behind that it will not take itself. An event wakes one parked queue-wide
    /// pop per group, not all of them, so the work an event made is served by a chain of these
    /// hand-offs, each woken pop taking its share. On the hot-list path the ring says what is
    /// left; the legacy scan passes the wake after every claim (see `pass_wake_on_scan`).
    PassWake,
    /// The final answer; the machine is done after it.
    Reply(PopReply),
}
