//! The admin and observability routes of Queen's client 2.6.0 (`queen/admin/admin.py`) and of
//! the dashboard: resources, messages, traces, status, analytics and consumer groups, in Queen's
//! shapes (docs/operations.md lists each route) with real status codes and working pagination.
//! One file per resource: `queues` (queues, partitions, overview, namespaces and tasks),
//! `messages`, `traces`, `status` (status and analytics), `groups` (consumer groups) and
//! `stats` (the admin totals' refresh and the stored metrics); this file holds what they share:
//! parameters, answers and a queue's page of partitions.
//!
//! Totals over every queue (the queue listings, overview, namespaces and tasks, status, consumer
//! groups, the metrics' stored series) come from the admin totals' snapshot (`stats`), whose age
//! each such answer states in `statsAge`; a route about one queue, partition, group or message
//! reads storage's views (`InspectStorage`) as they stand. What a route costs is stated in
//! docs/operations.md ("Dashboard, admin API, metrics, queenctl").

mod groups;
mod messages;
mod queues;
mod stats;
mod status;
mod traces;

pub use groups::{consumer_group, consumer_groups, lagging};
pub use messages::{delete_message, get_message, list_messages, retry_message};
pub use queues::{get_queue, groupings, list_partitions, list_queues, overview, queue_depth};
pub use stats::refresh_stats;
pub(crate) use stats::refresh_stored_metrics;
pub use status::{analytics, queue_detail, status, status_queues, system_metrics, worker_metrics};
pub use traces::{add_trace, trace_names, traces_named, traces_of};

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::{PartitionView, QueueFilter};
use queen_core::time::format_iso_micros;
use queen_core::Timestamp;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::wire as requests;
use crate::http::{self, Failure, Reply};
use crate::tasks::admin_totals::{self, QueuePage};
use crate::views::{Counts, CountsWire};

type Pairs = [(String, String)];

fn iso(t: Timestamp) -> String {
    format_iso_micros(t)
}

fn param<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, v)| k == key && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

fn number(pairs: &Pairs, key: &str, default: u32, max: u32) -> Result<u32, Failure> {
    match param(pairs, key) {
        None => Ok(default),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| Failure::bad(format!("{key} must be a whole number up to {max}"))),
    }
}

fn paging(pairs: &Pairs, default_limit: u32) -> Result<(u32, u32), Failure> {
    let limit = number(pairs, "limit", default_limit, 10_000)?;
    if limit == 0 {
        return Err(Failure::bad("limit must be at least 1"));
    }
    Ok((limit, number(pairs, "offset", 0, u32::MAX)?))
}

fn name_param(pairs: &Pairs, key: &'static str) -> Result<Option<String>, Failure> {
    match param(pairs, key) {
        None => Ok(None),
        Some(v) => {
            requests::check_name(key, v)?;
            Ok(Some(v.to_string()))
        }
    }
}

fn time_param(pairs: &Pairs, key: &'static str) -> Result<Option<Timestamp>, Failure> {
    param(pairs, key)
        .map(|v| requests::timestamp(v, key))
        .transpose()
}

/// The queue, namespace and task filters of a request (`queue` only when the route takes one).
fn queue_filter(pairs: &Pairs, with_queue: bool) -> Result<QueueFilter, Failure> {
    Ok(QueueFilter {
        queue: if with_queue {
            name_param(pairs, "queue")?
        } else {
            None
        },
        namespace: name_param(pairs, "namespace")?,
        task: name_param(pairs, "task")?,
    })
}

fn not_found(message: &str) -> Failure {
    Failure {
        status: StatusCode::NOT_FOUND,
        message: message.to_string(),
        storage: None,
        code: None,
    }
}

fn ok(v: &Value) -> Result<Reply, Failure> {
    Ok(http::json(StatusCode::OK, v))
}

/// An answer of `fields` and a `partitions` array serialized straight from typed rows: built
/// as a tree of values, a page of 1,000 cost the broker about 6 ms of CPU.
fn ok_with_partitions<P: Serialize>(fields: Value, partitions: &[P]) -> Result<Reply, Failure> {
    #[derive(Serialize)]
    struct WithPartitions<'a, P> {
        #[serde(flatten)]
        fields: Value,
        partitions: &'a [P],
    }
    let bytes = serde_json::to_vec(&WithPartitions { fields, partitions })
        .map_err(|e| Failure::server(format!("writing a page of partitions: {e}")))?;
    Ok(http::json_bytes(StatusCode::OK, bytes))
}

/// A partition of a queue's page, as `partition_row` answers it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartitionRow {
    id: String,
    name: String,
    created_at: String,
    stats: CountsWire,
    messages: CountsWire,
    last_offset: i64,
    log_start: i64,
    oldest_message: Option<String>,
    newest_message: Option<String>,
    /// The listing across queues says whose it is, and its depth.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    depth: Option<u64>,
    /// The status view adds each cursor.
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<CursorSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_activity: Option<Option<String>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CursorSummary {
    total_consumed: i64,
    groups: Vec<CursorRow>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CursorRow {
    consumer_group: String,
    committed: i64,
    pending: u64,
    lease_expires_at: Option<String>,
}

/// A partition's backlog for the depth route.
#[derive(Serialize)]
struct DepthRow<'a> {
    partition: &'a str,
    pending: u64,
    processing: u64,
    ready: u64,
}

fn partition_row(p: &PartitionView, groups: &[String]) -> PartitionRow {
    let c = Counts::of(p, groups);
    PartitionRow {
        id: p.partition_id.clone(),
        name: p.partition.clone(),
        created_at: iso(p.created_at),
        stats: c.wire(),
        messages: c.wire(),
        last_offset: p.last_offset,
        log_start: p.log_start,
        oldest_message: p.oldest_at.map(iso),
        newest_message: p.newest_at.map(iso),
        queue: None,
        depth: None,
        cursor: None,
        last_activity: None,
    }
}

/// `limit` (default 1000) and `after` (a partition name) of a route that lists one queue's
/// partitions: pages by name, each one index range however deep it starts.
fn partition_paging(pairs: &Pairs) -> Result<(u32, Option<String>), Failure> {
    let limit = number(pairs, "limit", 1000, 10_000)?;
    if limit == 0 {
        return Err(Failure::bad("limit must be at least 1"));
    }
    Ok((limit, name_param(pairs, "after")?))
}

/// A page of queue `name`'s partitions with the queue's totals (`admin_totals::for_queue`), and
/// the answer's `pagination`.
async fn queue_page(
    broker: &Arc<Broker>,
    name: &str,
    pairs: &Pairs,
    group: Option<&str>,
) -> Result<(QueuePage, Value), Failure> {
    requests::check_name("queue", name)?;
    let (limit, after) = partition_paging(pairs)?;
    let page = admin_totals::for_queue(broker, name, after.as_deref(), limit, group)
        .await?
        .ok_or_else(|| not_found("Queue not found"))?;
    let pagination = json!({"limit": limit, "after": after, "next": page.next});
    Ok((page, pagination))
}
