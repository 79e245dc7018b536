//! What the admin API, the dashboard and the metrics read: queues, partitions and cursors as
//! they stand, stored messages by address or by time, traces and per-minute broker samples.
//!
//! Every read is bounded by what it is asked for, never by the log: totals come from the
//! partition rows (`last_offset`) and one index probe per partition for its first retained
//! offset, lags from cursor rows, and a message listing reads only the segments of the page it
//! answers (newest first, by the segments' `created_at` index).

use super::pop::SegmentRow;
use super::queue::QueueConfig;
use crate::types::{Offset, Timestamp};

/// One partition as it stands, with every group's cursor on it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionView {
    pub queue: String,
    pub partition: String,
    pub partition_id: String,
    pub created_at: Timestamp,
    /// Offset of the newest message; -1: none was ever pushed.
    pub last_offset: Offset,
    /// Offset of the oldest retained message (`last_offset + 1` when nothing is retained).
    pub log_start: Offset,
    /// created_at of the oldest retained segment.
    pub oldest_at: Option<Timestamp>,
    /// created_at of the newest retained segment.
    pub newest_at: Option<Timestamp>,
    /// In group-name order.
    pub cursors: Vec<CursorView>,
}

impl PartitionView {
    /// Messages pushed to the partition in its life (offsets start at 0).
    pub fn pushed(&self) -> u64 {
        u64::try_from(self.last_offset + 1).unwrap_or(0)
    }

    /// Messages still stored.
    pub fn retained(&self) -> u64 {
        u64::try_from(self.last_offset + 1 - self.log_start).unwrap_or(0)
    }

    /// Messages after `committed` that are still stored.
    pub fn pending_after(&self, committed: Offset) -> u64 {
        u64::try_from(self.last_offset - committed.max(self.log_start - 1)).unwrap_or(0)
    }

    pub fn cursor(&self, group: &str) -> Option<&CursorView> {
        self.cursors.iter().find(|c| c.group == group)
    }
}

/// One (partition, consumer group) cursor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CursorView {
    pub group: String,
    pub committed: Offset,
    /// The lease's end, when a live lease is held at the time of the read.
    pub leased_until: Option<Timestamp>,
    /// Last offset of the live lease's span.
    pub leased_through: Option<Offset>,
    pub worker_id: Option<String>,
    pub total_consumed: i64,
    /// created_at of the segment holding the first message after `committed`, when one is
    /// stored: how old the group's oldest unconsumed message is.
    pub oldest_unconsumed_at: Option<Timestamp>,
}

impl CursorView {
    /// Messages of the live lease not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.leased_through
            .map_or(0, |end| u64::try_from(end - self.committed).unwrap_or(0))
    }
}

/// One queue with its configuration, groups and dead letters; what its partitions hold is read
/// by partition (`partition_views_page`), never summed here: at a million partitions the sums
/// alone read every partition row several times.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueueView {
    pub id: String,
    pub created_at: Timestamp,
    pub config: QueueConfig,
    pub dead_letters: u64,
    /// Groups with a cursor row or a subscription record on the queue, in name order.
    pub groups: Vec<String>,
    /// The groups registered with conflation (last-value delivery), in name order.
    pub conflating_groups: Vec<String>,
}

/// Filters of the queue listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueFilter {
    pub queue: Option<String>,
    pub namespace: Option<String>,
    pub task: Option<String>,
}

impl QueueFilter {
    /// Whether a queue passes every filter given.
    pub fn matches(&self, queue: &QueueConfig) -> bool {
        self.queue.as_ref().is_none_or(|w| *w == queue.name)
            && self
                .namespace
                .as_ref()
                .is_none_or(|w| *w == queue.namespace)
            && self.task.as_ref().is_none_or(|w| *w == queue.task)
    }
}

/// A position in the newest-first listing of segments: the listing continues with segments
/// strictly older (by `created_at`, then partition id, then base offset, descending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentMark {
    pub created_at: Timestamp,
    pub partition_id: String,
    pub base_offset: Offset,
}

/// Which stored segments a message listing reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentQuery {
    pub queue: Option<String>,
    pub partition: Option<String>,
    /// Segments created at or after.
    pub from: Option<Timestamp>,
    /// Segments created before.
    pub to: Option<Timestamp>,
    pub after: Option<SegmentMark>,
    /// Segments to return at most.
    pub limit: u32,
}

/// One stored segment, whole (`start_idx` 0, `take` = `msg_count`), with where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSegment {
    pub queue: String,
    pub partition: String,
    pub partition_id: String,
    pub row: SegmentRow,
}

impl StoredSegment {
    pub fn mark(&self) -> SegmentMark {
        SegmentMark {
            created_at: self.row.created_at,
            partition_id: self.partition_id.clone(),
            base_offset: self.row.base_offset,
        }
    }
}

/// A message found by (partition id, transactionId): its offset, the segment holding it (one
/// frame: `take` 1) and its partition as it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    pub offset: Offset,
    pub segment: SegmentRow,
    pub partition: PartitionView,
    /// Dead letters of this message (one per group that dead-lettered it): (id, group, error,
    /// retry count, failed at).
    pub dead_letters: Vec<DeadLetterRef>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterRef {
    pub id: i64,
    pub group: String,
    pub error: Option<String>,
    pub retry_count: u32,
    pub failed_at: Timestamp,
}

/// A trace event a consumer recorded against a message (`POST /api/v1/traces`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceInput {
    pub partition_id: String,
    pub transaction_id: String,
    pub group: String,
    pub event_type: String,
    /// JSON text.
    pub data: String,
    pub worker_id: Option<String>,
    pub names: Vec<String>,
}

/// A stored trace event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub id: i64,
    pub partition_id: String,
    pub transaction_id: String,
    pub queue: String,
    pub partition: String,
    pub group: String,
    pub event_type: String,
    pub data: String,
    pub worker_id: Option<String>,
    pub names: Vec<String>,
    pub created_at: Timestamp,
}

/// One trace name and how much carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceName {
    pub name: String,
    pub traces: u64,
    pub messages: u64,
    pub last_seen: Timestamp,
}

/// One broker's counters over one minute, for the status and analytics time series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerSample {
    pub hostname: String,
    pub worker_id: String,
    /// Start of the minute.
    pub bucket: Timestamp,
    pub push_requests: u64,
    pub push_messages: u64,
    pub pop_requests: u64,
    pub pop_messages: u64,
    pub pop_empty: u64,
    pub ack_requests: u64,
    pub ack_messages: u64,
    pub ack_failed: u64,
    pub dead_lettered: u64,
    pub db_errors: u64,
    /// Delivery lag (message age at pop), average and maximum over the minute, ms.
    pub lag_avg_ms: f64,
    pub lag_max_ms: f64,
    pub cpu_user_pct: f64,
    pub cpu_system_pct: f64,
    pub rss_bytes: u64,
    pub pool_size: u64,
    pub pool_in_use: u64,
    pub parked: u64,
}

/// Messages of one queue stored with a creation time in one interval (`InspectStorage::
/// messages_created`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CreatedCount {
    pub queue: String,
    /// The interval's start: a multiple of its width since the epoch.
    pub bucket: Timestamp,
    pub messages: u64,
}

/// The admin totals of one pass over every partition, as the broker that ran it serialized them
/// (opaque here), kept in storage so other brokers and restarted ones answer from it instead of
/// passing again (`InspectStorage::store_totals`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTotals {
    /// When the pass started.
    pub taken_at: Timestamp,
    pub body: Vec<u8>,
}

/// The reads of the admin API. Cheap by construction (see the module comment).
#[async_trait::async_trait]
pub trait InspectStorage: Send + Sync {
    /// Queues matching the filter, newest first.
    async fn queue_views(&self, filter: QueueFilter) -> super::StorageResult<Vec<QueueView>>;
    /// Up to `limit` partitions of one queue with their cursors (only `group`'s when given), in
    /// bytewise name order, after the partition named `after`: a pass over a queue of any size,
    /// page by page.
    async fn partition_views_page(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: u32,
        group: Option<&str>,
    ) -> super::StorageResult<Vec<PartitionView>>;
    /// Every partition of one queue with every cursor on it, shown to `each` one at a time in
    /// no particular order; how many. A backend that can read the whole queue in one pass
    /// cheaper than page by page in name order (PostgreSQL: pages of 2,000 in partition-id
    /// order, about half the time at a million partitions) says so here; by default it reads
    /// pages of 2,000 by name.
    async fn each_partition_of(
        &self,
        queue: &str,
        each: &mut (dyn FnMut(PartitionView) + Send),
    ) -> super::StorageResult<u64> {
        const PAGE: u32 = 2_000;
        let mut after: Option<String> = None;
        let mut seen = 0u64;
        loop {
            let page = self
                .partition_views_page(queue, after.as_deref(), PAGE, None)
                .await?;
            let full = page.len() == PAGE as usize;
            after = page.last().map(|p| p.partition.clone());
            for p in page {
                seen += 1;
                each(p);
            }
            if !full {
                return Ok(seen);
            }
        }
    }
    /// Every partition of each of `queues`, shown to `each` with its queue's place in `queues`,
    /// in no particular order (the queues' partitions may come interleaved); how many of each.
    /// A queue that does not exist has none. For many small queues: a backend that reads them
    /// cheaper together than one at a time (PostgreSQL: a statement for those of at most
    /// 1,000 partitions, up to 2,000 together, where a queue alone costs a transaction and its
    /// round trips; larger
    /// ones as `each_partition_of`) says so here; by default, one at a time.
    async fn each_partition_of_queues(
        &self,
        queues: &[String],
        each: &mut (dyn FnMut(usize, PartitionView) + Send),
    ) -> super::StorageResult<Vec<u64>> {
        let mut seen = Vec::with_capacity(queues.len());
        for (i, queue) in queues.iter().enumerate() {
            seen.push(self.each_partition_of(queue, &mut |p| each(i, p)).await?);
        }
        Ok(seen)
    }
    /// The partitions of these ids with every cursor on them, in (queue, name) order; an id of
    /// no partition is left out.
    async fn partition_views_by_id(
        &self,
        ids: &[String],
    ) -> super::StorageResult<Vec<PartitionView>>;
    /// Stored messages created in `[from, to)` (of `queue` alone when given), counted per queue
    /// and per interval of `width_secs`, in (queue, interval) order; counted where they are
    /// stored, not read.
    async fn messages_created(
        &self,
        from: Timestamp,
        to: Timestamp,
        width_secs: i64,
        queue: Option<&str>,
    ) -> super::StorageResult<Vec<CreatedCount>>;
    /// Stored segments, newest first, from `query.after` on.
    async fn segments(&self, query: SegmentQuery) -> super::StorageResult<Vec<StoredSegment>>;
    /// The message stored under (partition id, transactionId), if any.
    async fn message(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> super::StorageResult<Option<StoredMessage>>;
    /// Removes a message's dead letters; how many.
    async fn delete_dead_letters_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> super::StorageResult<u64>;
    /// Stores a trace of a stored message; its id, or `None` when no such message is stored.
    async fn add_trace(&self, trace: TraceInput) -> super::StorageResult<Option<i64>>;
    /// A message's traces, oldest first.
    async fn traces_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> super::StorageResult<Vec<TraceRecord>>;
    /// Traces carrying `name`, newest first, and how many carry it.
    async fn traces_named(
        &self,
        name: &str,
        limit: u32,
        offset: u32,
    ) -> super::StorageResult<(Vec<TraceRecord>, u64)>;
    /// Trace names, most recently seen first, and how many names there are.
    async fn trace_names(
        &self,
        limit: u32,
        offset: u32,
    ) -> super::StorageResult<(Vec<TraceName>, u64)>;
    /// Adds a broker's minute to the stored samples (summing into an existing one).
    async fn record_sample(&self, sample: WorkerSample) -> super::StorageResult<()>;
    /// Samples of every broker in [from, to), oldest first.
    async fn samples(
        &self,
        from: Timestamp,
        to: Timestamp,
    ) -> super::StorageResult<Vec<WorkerSample>>;
    /// Removes samples older than `before`; how many.
    async fn remove_samples_before(&self, before: Timestamp) -> super::StorageResult<u64>;
    /// Keeps `totals` as the stored pass unless one taken later is stored already (two brokers
    /// that passed at once: the later pass stays, whichever finished last).
    async fn store_totals(&self, totals: &StoredTotals) -> super::StorageResult<()>;
    /// The stored pass when it was taken after `newer_than` (any stored pass when `None`): a
    /// broker that holds a pass reads no body unless a newer one is stored.
    async fn stored_totals(
        &self,
        newer_than: Option<Timestamp>,
    ) -> super::StorageResult<Option<StoredTotals>>;
}
