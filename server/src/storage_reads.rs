//! Every read a route makes of storage, each named once: routes never reach `broker.storage`
//! themselves (`server/tests/storage_rule.rs` holds them to it), so what a route may read is this
//! list, and a write goes through a broker operation (`operations/`). The counting and bucketing
//! rules over what is read are the read models of `views.rs`; this file is apart from it because
//! the admin totals' pass (`stats.rs`, which the broker holds) uses those models, and a read here
//! needs the broker.

use queen_core::reads::{ChangedPage, ChangedQuery};
use queen_core::storage::{
    CreatedCount, EphemeralBroker, PartitionRead, PartitionView, QueueConfig, SegmentQuery,
    StorageHealth, StorageResult, StorageUsage, StoredMessage, StoredSegment, TraceName,
    TraceRecord, WorkerSample,
};
use queen_core::streams::{StateQuery, StateRow};
use queen_core::timers::TimerRow;
use queen_core::types::Offset;
use queen_core::Timestamp;
use serde_json::Value;

use crate::broker::Broker;
use crate::http::Failure;

pub(crate) async fn queue_config(b: &Broker, queue: &str) -> StorageResult<Option<QueueConfig>> {
    b.storage.pops.queue_config(queue).await
}

/// The numbers of partitions (a framed pop names partitions by number).
pub(crate) async fn partition_numbers(
    b: &Broker,
    ids: &[String],
) -> StorageResult<Vec<Option<u64>>> {
    b.storage.pops.partition_numbers(ids).await
}

pub(crate) async fn health(b: &Broker) -> StorageHealth {
    b.storage.health.health().await
}

pub(crate) fn usage(b: &Broker) -> StorageUsage {
    b.storage.health.usage()
}

pub(crate) async fn read_partition(
    b: &Broker,
    queue: &str,
    partition: &str,
    offset: Offset,
    byte_hint: u64,
) -> StorageResult<PartitionRead> {
    b.storage
        .reads
        .read_partition(queue, partition, offset, byte_hint)
        .await
}

pub(crate) async fn changed_partitions(
    b: &Broker,
    query: &ChangedQuery,
) -> StorageResult<ChangedPage> {
    b.storage.reads.changed_partitions(query).await
}

pub(crate) async fn stream_state(
    b: &Broker,
    query: &StateQuery,
) -> StorageResult<Option<Vec<StateRow>>> {
    b.storage.streams.stream_state(query).await
}

pub(crate) async fn timer_peek(
    b: &Broker,
    queue: &str,
    key: &str,
) -> StorageResult<Option<TimerRow>> {
    b.storage.timers.timer_peek(queue, key).await
}

pub(crate) async fn timer_page(
    b: &Broker,
    queue: &str,
    after: Option<String>,
    limit: u32,
) -> StorageResult<Vec<(String, TimerRow)>> {
    b.storage.timers.timer_page(queue, after, limit).await
}

pub(crate) async fn ephemeral_config(b: &Broker, queue: &str) -> StorageResult<Option<Value>> {
    b.storage.ephemeral.ephemeral_config(queue).await
}

pub(crate) async fn ephemeral_configs(b: &Broker) -> StorageResult<Vec<(String, Value)>> {
    b.storage.ephemeral.ephemeral_configs().await
}

pub(crate) async fn ephemeral_brokers(b: &Broker) -> StorageResult<Vec<EphemeralBroker>> {
    b.storage.ephemeral_owners.ephemeral_brokers().await
}

pub(crate) async fn segments(b: &Broker, query: SegmentQuery) -> StorageResult<Vec<StoredSegment>> {
    b.storage.inspect.segments(query).await
}

pub(crate) async fn partition_views_by_id(
    b: &Broker,
    ids: &[String],
) -> StorageResult<Vec<PartitionView>> {
    b.storage.inspect.partition_views_by_id(ids).await
}

pub(crate) async fn partition_views_page(
    b: &Broker,
    queue: &str,
    after: Option<&str>,
    limit: u32,
) -> StorageResult<Vec<PartitionView>> {
    b.storage
        .inspect
        .partition_views_page(queue, after, limit, None)
        .await
}

/// A page of a queue's partitions by name (of those `group` reads, when given).
pub(crate) async fn partition_page(
    b: &Broker,
    queue: &str,
    after: Option<&str>,
    limit: u32,
    group: Option<&str>,
) -> Result<(Vec<PartitionView>, Option<String>), Failure> {
    crate::stats::partition_page(&*b.storage.inspect, queue, after, limit, group).await
}

pub(crate) async fn message(
    b: &Broker,
    pid: &str,
    tx: &str,
) -> StorageResult<Option<StoredMessage>> {
    b.storage.inspect.message(pid, tx).await
}

pub(crate) async fn messages_created(
    b: &Broker,
    from: Timestamp,
    to: Timestamp,
    width_secs: i64,
    queue: Option<&str>,
) -> StorageResult<Vec<CreatedCount>> {
    b.storage
        .inspect
        .messages_created(from, to, width_secs, queue)
        .await
}

pub(crate) async fn samples(
    b: &Broker,
    from: Timestamp,
    to: Timestamp,
) -> StorageResult<Vec<WorkerSample>> {
    b.storage.inspect.samples(from, to).await
}

/// Messages ingested and processed per second over the last `minutes`.
pub(crate) async fn recent_rates(b: &Broker, minutes: i64) -> Result<(f64, f64), Failure> {
    crate::views::recent_rates(&*b.storage.inspect, b.now(), minutes).await
}

pub(crate) async fn traces_of(b: &Broker, pid: &str, tx: &str) -> StorageResult<Vec<TraceRecord>> {
    b.storage.inspect.traces_of(pid, tx).await
}

pub(crate) async fn traces_named(
    b: &Broker,
    name: &str,
    limit: u32,
    offset: u32,
) -> StorageResult<(Vec<TraceRecord>, u64)> {
    b.storage.inspect.traces_named(name, limit, offset).await
}

pub(crate) async fn trace_names(
    b: &Broker,
    limit: u32,
    offset: u32,
) -> StorageResult<(Vec<TraceName>, u64)> {
    b.storage.inspect.trace_names(limit, offset).await
}
