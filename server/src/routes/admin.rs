//! The admin and observability routes of Queen's client 2.6.0 (`queen/admin/admin.py`) and of
//! the dashboard: resources, messages, traces, status, analytics and consumer groups, in Queen's
//! shapes (docs/operations.md lists each route) with real status codes and working pagination.
//!
//! Totals over every queue (the queue listings, overview, namespaces and tasks, status, consumer
//! groups, the metrics' stored series) come from the admin totals' snapshot (`stats`), whose age
//! each such answer states in `statsAge`; a route about one queue, partition, group or message
//! reads storage's views (`InspectStorage`) as they stand. What a route costs is stated in the
//! README.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::{slice_blob, Frame};
use queen_core::storage::{
    PartitionView, QueueFilter, QueueView, SegmentQuery, StoredMessage, TraceInput, TraceRecord,
    WorkerSample,
};
use queen_core::time::format_iso_micros;
use queen_core::types::QUEUE_MODE_GROUP;
use queen_core::Timestamp;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::wire as requests;
use crate::http::{self, Failure, Reply};
use crate::stats::{partition_page, QueueTally, Snapshot};
use crate::tasks::admin_totals::{self, QueuePage};
use crate::views::{
    bucket_of, bucketed, depth, message_status, page, recent_rates, stat, Backlog, Counts,
    CountsWire, GroupLag,
};

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

fn queue_summary(t: &QueueTally) -> Value {
    let (q, c) = (&t.view, &t.counts);
    json!({"id": q.id, "name": q.config.name, "namespace": q.config.namespace, "task": q.config.task,
           "priority": q.config.priority, "createdAt": iso(q.created_at), "partitions": t.partitions,
           "messages": {"total": c.total, "pending": c.pending, "processing": c.processing,
                        "completed": c.completed(), "deadLetter": c.dead_letter,
                        "pushed": t.pushed}})
}

/// GET /api/v1/resources/queues[?namespace,task,limit,offset]: newest first.
pub async fn list_queues(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 1000)?;
    let filter = queue_filter(pairs, false)?;
    let snap = admin_totals::for_request(broker).await?;
    let matching: Vec<&QueueTally> = snap.queues_matching(&filter).collect();
    let total = matching.len();
    let queues: Vec<Value> = page(matching, limit, offset)
        .into_iter()
        .map(queue_summary)
        .collect();
    ok(&json!({"queues": queues, "total": total,
               "pagination": {"limit": limit, "offset": offset},
               "statsAge": snap.age_secs(broker.now())}))
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

/// GET /api/v1/resources/queues/{name}[?limit,after]: partitions sorted by name, a page of them.
pub async fn get_queue(broker: &Arc<Broker>, name: &str, pairs: &Pairs) -> Result<Reply, Failure> {
    let (page, pagination) = queue_page(broker, name, pairs, None).await?;
    let q = &page.tally.view;
    let partitions: Vec<PartitionRow> = page
        .partitions
        .iter()
        .map(|p| partition_row(p, &q.groups))
        .collect();
    ok_with_partitions(
        json!({"id": q.id, "name": q.config.name, "namespace": q.config.namespace,
               "task": q.config.task, "createdAt": iso(q.created_at),
               "totals": page.tally.counts.json(),
               "partitionsTotal": page.tally.partitions, "pagination": pagination,
               "statsAge": page.stats_age}),
        &partitions,
    )
}

/// GET /api/v1/resources/queues/{name}/depth[?group=g,limit,after].
pub async fn queue_depth(
    broker: &Arc<Broker>,
    name: &str,
    pairs: &Pairs,
) -> Result<Reply, Failure> {
    let group = name_param(pairs, "group")?;
    let (page, pagination) = queue_page(broker, name, pairs, group.as_deref()).await?;
    let t = &page.tally;
    let groups = &t.view.groups;
    let rows: Vec<DepthRow> = page
        .partitions
        .iter()
        .map(|p| {
            let b = Backlog::of(p, groups, group.as_deref());
            DepthRow {
                partition: &p.partition,
                pending: b.pending,
                processing: b.processing,
                ready: b.ready(),
            }
        })
        .collect();
    let total =
        match &group {
            None => t.backlog,
            Some(g) => t.groups.get(g).map(|l| l.backlog).ok_or_else(|| {
                Failure::server(format!("the tally of queue {name} lacks group {g}"))
            })?,
        };
    // A conflating group takes one message a partition: its effective backlog is the number of
    // partitions with something pending.
    let conflation = group
        .as_ref()
        .is_some_and(|g| t.view.conflating_groups.contains(g));
    let effective_pending = if conflation {
        total.partitions_pending
    } else {
        total.pending
    };
    ok_with_partitions(
        json!({"queue": name, "group": group, "pending": total.pending,
               "partitionsPending": total.partitions_pending, "conflation": conflation,
               "effectivePending": effective_pending, "processing": total.processing,
               "ready": total.ready(),
               "partitionsTotal": t.partitions, "pagination": pagination,
               "statsAge": page.stats_age}),
        &rows,
    )
}

/// Partitions a listing without `minDepth` reads at most (an `offset` deep into a large
/// database); past it, it answers what it found and says `truncated`.
const MAX_PARTITIONS_PER_LISTING: usize = 100_000;

/// Partitions the listing reads per storage call.
const LISTING_PAGE: usize = 2_000;

/// GET /api/v1/resources/partitions[?queue,minDepth,limit,offset]: Queen's documentation
/// describes it and no Queen server answers it; here, partitions with their depth, queue by
/// queue (the admin totals' queues, newest first), each queue's by name. Without `minDepth` it
/// reads only up to the page and `total` is the admin totals'. With it, it reads no partition:
/// it answers the deepest partitions the admin totals' pass kept, as deep as that pass found
/// them, and says `truncated` when the pass left out one at least `minDepth` deep.
pub async fn list_partitions(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 1000)?;
    let min_depth = u64::from(number(pairs, "minDepth", 0, u32::MAX)?);
    let filter = QueueFilter {
        queue: name_param(pairs, "queue")?,
        ..QueueFilter::default()
    };
    let snap = admin_totals::for_request(broker).await?;
    let (rows, total, truncated) = if min_depth == 0 {
        let (rows, truncated) =
            first_partitions(broker, &snap, &filter, offset as usize, limit as usize).await?;
        let total = snap.queues_matching(&filter).map(|t| t.partitions).sum();
        (rows, total, truncated)
    } else {
        let matching: Vec<_> = snap
            .deepest
            .iter()
            .filter(|d| d.depth >= min_depth)
            .map(|d| (d, snap.queue_of(d)))
            .filter(|(_, t)| filter.matches(&t.view.config))
            .collect();
        let rows = matching
            .iter()
            .skip(offset as usize)
            .take(limit as usize)
            .map(|(d, t)| listing_row(&d.view, &t.view, d.depth))
            .collect();
        (
            rows,
            matching.len() as u64,
            min_depth <= snap.deepest_left_out,
        )
    };
    ok_with_partitions(
        json!({"total": total, "truncated": truncated,
               "pagination": {"limit": limit, "offset": offset},
               "statsAge": snap.age_secs(broker.now())}),
        &rows,
    )
}

/// A row of the listing across queues: the partition's row with its queue and depth.
fn listing_row(p: &PartitionView, q: &QueueView, depth: u64) -> PartitionRow {
    let mut row = partition_row(p, &q.groups);
    row.queue = Some(q.config.name.clone());
    row.depth = Some(depth);
    row
}

/// The partitions from `offset` to `offset + limit` in the listing's order, read a page at a
/// time (each with its depth), and whether `MAX_PARTITIONS_PER_LISTING` cut the reading short.
async fn first_partitions(
    broker: &Arc<Broker>,
    snap: &Snapshot,
    filter: &QueueFilter,
    offset: usize,
    limit: usize,
) -> Result<(Vec<PartitionRow>, bool), Failure> {
    let wanted = (offset + limit).min(MAX_PARTITIONS_PER_LISTING);
    let (mut rows, mut seen) = (vec![], 0usize);
    for t in snap.queues_matching(filter) {
        let q = &t.view;
        let mut after: Option<String> = None;
        loop {
            let size = (wanted - seen).clamp(1, LISTING_PAGE);
            let page = broker
                .storage
                .inspect
                .partition_views_page(&q.config.name, after.as_deref(), size as u32, None)
                .await?;
            for p in &page {
                if seen >= offset {
                    rows.push(listing_row(p, q, depth(p, &q.groups, None)));
                }
                seen += 1;
                if seen >= wanted {
                    return Ok((rows, wanted < offset + limit));
                }
            }
            match page.last() {
                Some(last) if page.len() == size => after = Some(last.partition.clone()),
                _ => break,
            }
        }
    }
    Ok((rows, false))
}

/// GET /api/v1/resources/overview.
pub async fn overview(broker: &Arc<Broker>) -> Result<Reply, Failure> {
    let snap = admin_totals::for_request(broker).await?;
    let now = broker.now();
    let mut totals = Counts::default();
    let (mut namespaces, mut tasks) = (vec![], vec![]);
    let mut partitions = 0;
    for t in &snap.queues {
        totals.add(t.counts);
        partitions += t.partitions;
        namespaces.push(t.view.config.namespace.clone());
        tasks.push(t.view.config.task.clone());
    }
    for v in [&mut namespaces, &mut tasks] {
        v.retain(|n| !n.is_empty());
        v.sort();
        v.dedup();
    }
    let (ingested, processed) = recent_rates(&*broker.storage.inspect, broker.now(), 5).await?;
    ok(
        &json!({"queues": snap.queues.len(), "partitions": partitions,
               "namespaces": namespaces.len(), "tasks": tasks.len(),
               "messages": totals.json(),
               "lag": {"time": snap.time_lags, "offset": snap.offset_lags},
               "throughput": {"ingestedPerSecond": ingested, "processedPerSecond": processed},
               "timestamp": iso(now), "statsAge": snap.age_secs(now)}),
    )
}

/// GET /api/v1/resources/namespaces and /tasks: queues grouped by namespace (or task).
pub async fn groupings(broker: &Arc<Broker>, by_task: bool) -> Result<Reply, Failure> {
    let snap = admin_totals::for_request(broker).await?;
    let mut by: BTreeMap<String, (u64, u64, Counts)> = BTreeMap::new();
    for t in &snap.queues {
        let q = &t.view;
        let key = if by_task {
            &q.config.task
        } else {
            &q.config.namespace
        };
        if key.is_empty() {
            continue;
        }
        let e = by.entry(key.clone()).or_default();
        e.0 += 1;
        e.1 += t.partitions;
        e.2.add(t.counts);
    }
    let (list, item) = if by_task {
        ("tasks", "task")
    } else {
        ("namespaces", "namespace")
    };
    let rows: Vec<Value> = by
        .into_iter()
        .map(|(name, (queues, partitions, c))| {
            json!({item: name, "queues": queues, "partitions": partitions,
                   "messages": {"total": c.total, "pending": c.pending}})
        })
        .collect();
    ok(&json!({list: rows, "statsAge": snap.age_secs(broker.now())}))
}

fn mode_json(groups: &[String]) -> Value {
    let has_queue_mode = groups.iter().any(|g| g == QUEUE_MODE_GROUP);
    let bus = groups.iter().filter(|g| *g != QUEUE_MODE_GROUP).count();
    let kind = match (has_queue_mode, bus > 0) {
        (true, true) => "hybrid",
        (true, false) => "queue",
        (false, true) => "bus",
        (false, false) => "none",
    };
    json!({"hasQueueMode": has_queue_mode, "busGroupsCount": bus, "type": kind})
}

fn frame_payload(broker: &Broker, f: &Frame) -> Result<(Value, bool), Failure> {
    let plain = crate::sealing::plaintext(broker.config.cipher.as_deref(), f);
    match plain {
        Ok(bytes) => Ok((
            serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            f.encrypted,
        )),
        // Sealed and this broker has no key: say so rather than fail the listing.
        Err(_) => Ok((Value::Null, true)),
    }
}

/// Segments read per listing page at most: a page of a sparse status filter stops there and
/// says so (`truncated`), rather than reading the whole log.
const MAX_SEGMENTS_PER_LISTING: u32 = 2000;

/// The listing's name filters: queue, partition, namespace (`ns` or `namespace`) and task.
struct ListingNames {
    queue: Option<String>,
    partition: Option<String>,
    namespace: Option<String>,
    task: Option<String>,
}

fn listing_names(pairs: &Pairs) -> Result<ListingNames, Failure> {
    let namespace = match name_param(pairs, "ns")? {
        Some(n) => Some(n),
        None => name_param(pairs, "namespace")?,
    };
    Ok(ListingNames {
        queue: name_param(pairs, "queue")?,
        partition: name_param(pairs, "partition")?,
        namespace,
        task: name_param(pairs, "task")?,
    })
}

/// The listing's status filter, one of the four statuses.
fn status_param(pairs: &Pairs) -> Result<Option<&str>, Failure> {
    let status = param(pairs, "status");
    if let Some(s) = status {
        if !["pending", "processing", "completed", "dead_letter"].contains(&s) {
            return Err(Failure::bad(
                "status must be pending, processing, completed or dead_letter",
            ));
        }
    }
    Ok(status)
}

/// What the message listing knows of a queue it lists: its configuration, the groups reading it
/// (the admin totals', with those on each message's partition added) and the offsets of its
/// newest 1000 dead letters, whose messages show as dead_letter.
struct ListedQueue {
    config: queen_core::storage::QueueConfig,
    groups: Vec<String>,
    dead: std::collections::BTreeSet<(String, i64)>,
}

/// The listing's view of queue `name`; `None` when it is gone or the filter leaves it out.
async fn listed_queue(
    broker: &Broker,
    snap: &Snapshot,
    name: &str,
    filter: &QueueFilter,
) -> Result<Option<ListedQueue>, Failure> {
    let Some(config) = broker.storage.pops.queue_config(name).await? else {
        return Ok(None);
    };
    if !filter.matches(&config) {
        return Ok(None);
    }
    let groups = snap
        .queue(name)
        .map_or_else(Vec::new, |t| t.view.groups.clone());
    let letters = broker
        .dead_letters(queen_core::storage::DlqQuery {
            queue: name.to_string(),
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let dead = letters
        .entries
        .into_iter()
        .map(|d| (d.partition_id, d.offset))
        .collect();
    Ok(Some(ListedQueue {
        config,
        groups,
        dead,
    }))
}

/// GET /api/v1/messages[?queue,partition,ns|namespace,task,status,from,to,limit,offset]:
/// newest first. `from` defaults to an hour ago, as in Queen. It reads the segments of the
/// window newest first and, for each batch, the partitions and queues it has not seen yet.
pub async fn list_messages(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 200)?;
    let ListingNames {
        queue,
        partition,
        namespace,
        task,
    } = listing_names(pairs)?;
    let status = status_param(pairs)?;
    let now = broker.now();
    let from = time_param(pairs, "from")?.unwrap_or(now.minus_secs(3600));
    let to = time_param(pairs, "to")?;
    let filter = QueueFilter {
        queue: queue.clone(),
        namespace,
        task,
    };
    let snap = admin_totals::for_request(broker).await?;
    let mut queues: BTreeMap<String, Option<ListedQueue>> = BTreeMap::new();
    if let Some(q) = &queue {
        queues.insert(q.clone(), listed_queue(broker, &snap, q, &filter).await?);
    }
    let mut partitions: BTreeMap<String, PartitionView> = BTreeMap::new();
    let wanted = offset as usize + limit as usize;
    let mut matched: Vec<Value> = vec![];
    let mut after = None;
    let mut read = 0u32;
    let mut truncated = false;
    'segments: loop {
        let batch = broker
            .storage
            .inspect
            .segments(SegmentQuery {
                queue: queue.clone(),
                partition: partition.clone(),
                from: Some(from),
                to,
                after: after.clone(),
                limit: 100,
            })
            .await?;
        if batch.is_empty() {
            break;
        }
        let mut unseen: Vec<String> = batch
            .iter()
            .map(|s| s.partition_id.clone())
            .filter(|id| !partitions.contains_key(id))
            .collect();
        unseen.sort();
        unseen.dedup();
        if !unseen.is_empty() {
            for p in broker
                .storage
                .inspect
                .partition_views_by_id(&unseen)
                .await?
            {
                partitions.insert(p.partition_id.clone(), p);
            }
        }
        for s in &batch {
            if !queues.contains_key(&s.queue) {
                let listed = listed_queue(broker, &snap, &s.queue, &filter).await?;
                queues.insert(s.queue.clone(), listed);
            }
        }
        for s in &batch {
            read += 1;
            after = Some(s.mark());
            let (Some(p), Some(Some(q))) = (partitions.get(&s.partition_id), queues.get(&s.queue))
            else {
                continue;
            };
            let mut groups = q.groups.clone();
            for c in &p.cursors {
                if !groups.contains(&c.group) {
                    groups.push(c.group.clone());
                }
            }
            let frames = slice_blob(
                &s.row.blob,
                0,
                s.row.msg_count as usize,
                s.row.msg_count as usize,
            )
            .map_err(|e| Failure::server(format!("reading a stored segment: {e}")))?;
            for (i, f) in frames.iter().enumerate().rev() {
                let offset = s.row.base_offset + i as i64;
                let dead = q.dead.contains(&(s.partition_id.clone(), offset));
                let (st, consumed, group_count) = message_status(p, &groups, offset, dead, now);
                if status.is_some_and(|w| w != st) {
                    continue;
                }
                let (data, encrypted) = frame_payload(broker, f)?;
                let c = &q.config;
                let mut m = json!({
                    "id": f.message_id.to_string(), "transactionId": f.transaction_id,
                    "partitionId": s.partition_id, "queuePath": format!("{}/{}", s.queue, s.partition),
                    "queue": s.queue, "partition": s.partition, "namespace": c.namespace,
                    "task": c.task, "status": st, "queueStatus": st,
                    "busStatus": {"consumedBy": consumed, "totalGroups": group_count},
                    "traceId": f.trace_id.map(|t| t.to_string()), "producerSub": f.producer,
                    "queuePriority": c.priority, "createdAt": iso(s.row.created_at),
                    "leaseExpiresAt": p.cursor(QUEUE_MODE_GROUP).and_then(|c| c.leased_until).map(iso),
                    "offset": offset,
                });
                m["data"] = data;
                m["isEncrypted"] = json!(encrypted);
                matched.push(m);
                if matched.len() >= wanted {
                    break 'segments;
                }
            }
            if read >= MAX_SEGMENTS_PER_LISTING {
                truncated = true;
                break 'segments;
            }
        }
    }
    let mut groups: Vec<String> = queues
        .values()
        .flatten()
        .flat_map(|q| q.groups.iter().cloned())
        .collect();
    groups.sort();
    groups.dedup();
    let messages = page(matched, limit, offset);
    ok(
        &json!({"total": messages.len(), "messages": messages, "mode": mode_json(&groups),
               "truncated": truncated, "pagination": {"limit": limit, "offset": offset}}),
    )
}

async fn stored_message(broker: &Broker, pid: &str, tx: &str) -> Result<StoredMessage, Failure> {
    requests::check_name("transactionId", tx)?;
    broker
        .storage
        .inspect
        .message(pid, tx)
        .await?
        .ok_or_else(|| not_found("Message not found"))
}

/// GET /api/v1/messages/{partitionId}/{transactionId}.
pub async fn get_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    let p = &m.partition;
    // The queue's configuration and the groups that reached this partition: one row each,
    // not the queue's totals (a queue may have 100k partitions).
    let config = broker
        .storage
        .pops
        .queue_config(&p.queue)
        .await?
        .ok_or_else(|| not_found("Message not found"))?;
    let groups: Vec<String> = p.cursors.iter().map(|c| c.group.clone()).collect();
    let frame = slice_blob(
        &m.segment.blob,
        m.segment.start_idx as usize,
        1,
        m.segment.msg_count as usize,
    )
    .map_err(|e| Failure::server(format!("reading a stored segment: {e}")))?
    .pop()
    .ok_or_else(|| Failure::server("a stored segment held no frame at the message's offset"))?;
    let (payload, encrypted) = frame_payload(broker, &frame)?;
    let now = broker.now();
    let (status, consumed, group_count) =
        message_status(p, &groups, m.offset, !m.dead_letters.is_empty(), now);
    let letter = m.dead_letters.first();
    let consumer_groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let c = p.cursor(g);
            json!({"name": g, "consumed": c.is_some_and(|c| c.committed >= m.offset),
                   "leaseExpiresAt": c.filter(|c| c.leased_through.is_some_and(|e| e >= m.offset))
                       .and_then(|c| c.leased_until).map(iso)})
        })
        .collect();
    let c = &config;
    ok(&json!({
        "id": frame.message_id.to_string(), "transactionId": frame.transaction_id,
        "partitionId": p.partition_id, "queuePath": format!("{}/{}", p.queue, p.partition),
        "queue": p.queue, "partition": p.partition, "namespace": c.namespace, "task": c.task,
        "status": status, "payload": payload, "isEncrypted": encrypted,
        "traceId": frame.trace_id.map(|t| t.to_string()), "producerSub": frame.producer,
        "createdAt": iso(m.segment.created_at), "offset": m.offset,
        "errorMessage": letter.and_then(|d| d.error.clone()),
        "retryCount": letter.map(|d| d.retry_count),
        "deadLetters": m.dead_letters.iter().map(|d| json!({"id": d.id, "consumerGroup": d.group,
            "errorMessage": d.error, "retryCount": d.retry_count, "failedAt": iso(d.failed_at)})).collect::<Vec<_>>(),
        "leaseExpiresAt": p.cursor(QUEUE_MODE_GROUP).and_then(|c| c.leased_until).map(iso),
        "queueConfig": {"leaseTime": c.lease_time_secs, "retryLimit": c.retry_limit,
                        "retryDelay": c.retry_delay_ms, "ttl": c.ttl_secs, "priority": c.priority},
        "mode": {"consumedByGroups": consumed, "busGroupsCount": group_count,
                 "hasQueueMode": groups.iter().any(|g| g == QUEUE_MODE_GROUP),
                 "type": mode_json(&groups)["type"]},
        "consumerGroups": consumer_groups,
    }))
}

/// DELETE /api/v1/messages/{pid}/{tx}: removes the message's dead letters. A message in the
/// partition log is part of an immutable segment and of every group's offsets: it cannot be
/// removed alone (seek a group past it instead); that answers 409 and changes nothing.
pub async fn delete_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    if m.dead_letters.is_empty() {
        return Ok(http::json(
            StatusCode::CONFLICT,
            &json!({"success": false, "partitionId": pid, "transactionId": tx,
                    "error": "only dead letters can be deleted: a message in the partition log is removed by retention, or skipped by seeking its consumer group past it"}),
        ));
    }
    let n = broker
        .storage
        .inspect
        .delete_dead_letters_of(pid, tx)
        .await?;
    ok(
        &json!({"success": n > 0, "partitionId": pid, "transactionId": tx,
               "deadLettersDeleted": n, "message": "Message deleted successfully"}),
    )
}

/// POST /api/v1/messages/{pid}/{tx}/retry: replays the message's dead letter as a new message
/// (under a new transactionId, so de-duplication cannot drop it) and removes the dead letter,
/// in one transaction.
pub async fn retry_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    let Some(letter) = m.dead_letters.first() else {
        return Ok(http::json(
            StatusCode::NOT_FOUND,
            &json!({"success": false, "partitionId": pid, "transactionId": tx,
                    "error": "Message not found", "message": "the message has no dead letter to retry"}),
        ));
    };
    match broker.requeue_dead_letter(letter.id).await? {
        None => Err(not_found("Message not found")),
        Some(r) => ok(
            &json!({"success": true, "queue": r.queue, "partition": r.partition,
            "replayedAs": {"messageId": r.outcome.message_id().to_string(),
                           "partitionId": r.outcome.partition_id()},
            "dlqRowRemoved": true}),
        ),
    }
}

/// POST /api/v1/traces: 201 with the trace's id; 404 when no such message is stored (a trace
/// is removed with its message, so one of nothing would never be).
pub async fn add_trace(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Failure::bad(format!("body must be a JSON object: {e}")))?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let tx = text("transactionId").ok_or_else(|| Failure::bad("transactionId is required"))?;
    let pid = text("partitionId").ok_or_else(|| Failure::bad("partitionId is required"))?;
    let data = v
        .get("data")
        .filter(|d| !d.is_null())
        .ok_or_else(|| Failure::bad("data is required"))?;
    requests::check_name("transactionId", &tx)?;
    let group = requests::consumer_group(text("consumerGroup"))?;
    let event_type = text("eventType").unwrap_or_else(|| "info".into());
    if event_type.is_empty() || event_type.len() > 64 {
        return Err(Failure::bad("eventType must be 1 to 64 bytes"));
    }
    let names: Vec<String> = match v.get("traceNames") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|n| {
                let n = n
                    .as_str()
                    .ok_or_else(|| Failure::bad("traceNames must be strings"))?;
                requests::check_name("traceNames", n)?;
                Ok(n.to_string())
            })
            .collect::<Result<_, Failure>>()?,
        Some(_) => return Err(Failure::bad("traceNames must be an array of strings")),
    };
    let worker_id = v.get("workerId").map(|w| match w {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    let id = broker
        .storage
        .inspect
        .add_trace(TraceInput {
            partition_id: pid,
            transaction_id: tx,
            group,
            event_type,
            data: data.to_string(),
            worker_id,
            names,
        })
        .await?
        .ok_or_else(|| not_found("Message not found"))?;
    Ok(http::json(
        StatusCode::CREATED,
        &json!({"success": true, "traceId": id}),
    ))
}

fn trace_json(t: &TraceRecord, with_message: bool) -> Value {
    let mut v = json!({"id": t.id, "event_type": t.event_type,
        "data": serde_json::from_str::<Value>(&t.data).unwrap_or(Value::Null),
        "consumer_group": t.group, "worker_id": t.worker_id, "created_at": iso(t.created_at),
        "trace_names": t.names});
    if with_message {
        v["transaction_id"] = json!(t.transaction_id);
        v["partition_id"] = json!(t.partition_id);
        v["queue_name"] = json!(t.queue);
        v["partition_name"] = json!(t.partition);
    }
    v
}

/// GET /api/v1/traces/{pid}/{tx}: oldest first.
pub async fn traces_of(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    requests::check_name("transactionId", tx)?;
    let traces = broker.storage.inspect.traces_of(pid, tx).await?;
    ok(&json!({"traces": traces.iter().map(|t| trace_json(t, false)).collect::<Vec<_>>()}))
}

/// GET /api/v1/traces/by-name/{name}?limit=100&offset=0: newest first, paged.
pub async fn traces_named(
    broker: &Arc<Broker>,
    name: &str,
    pairs: &Pairs,
) -> Result<Reply, Failure> {
    requests::check_name("traceName", name)?;
    let (limit, offset) = paging(pairs, 100)?;
    let (traces, total) = broker
        .storage
        .inspect
        .traces_named(name, limit, offset)
        .await?;
    ok(
        &json!({"traces": traces.iter().map(|t| trace_json(t, true)).collect::<Vec<_>>(),
               "total": total, "pagination": {"limit": limit, "offset": offset}}),
    )
}

/// GET /api/v1/traces/names?limit=50&offset=0: most recently seen first.
pub async fn trace_names(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 50)?;
    let (names, total) = broker.storage.inspect.trace_names(limit, offset).await?;
    let rows: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({"trace_name": n.name, "trace_count": n.traces,
                        "message_count": n.messages, "last_seen": iso(n.last_seen)})
        })
        .collect();
    ok(&json!({"trace_names": rows, "total": total,
               "pagination": {"limit": limit, "offset": offset}}))
}

/// Queen's time window: `from` (default `to` − `default_span`), `to` (default now), and the
/// bucket width its span implies.
fn window(
    pairs: &Pairs,
    now: Timestamp,
    default_span_secs: i64,
) -> Result<(Timestamp, Timestamp, i64), Failure> {
    let to = time_param(pairs, "to")?.unwrap_or(now);
    let from = time_param(pairs, "from")?.unwrap_or(to.minus_secs(default_span_secs));
    if from >= to {
        return Err(Failure::bad("from must be before to"));
    }
    let span_min = (to.0 - from.0) / 60_000_000;
    let bucket = match span_min {
        ..=60 => 1,
        61..=360 => 5,
        361..=1440 => 15,
        1441..=10080 => 60,
        _ => 360,
    };
    Ok((from, to, bucket))
}

fn point_json(t: Timestamp, s: &WorkerSample, minutes: i64) -> Value {
    let secs = (minutes * 60) as f64;
    json!({"timestamp": iso(t), "ingested": s.push_messages, "processed": s.ack_messages,
           "popMessages": s.pop_messages, "ingestedPerSecond": s.push_messages as f64 / secs,
           "processedPerSecond": s.ack_messages as f64 / secs,
           "popPerSecond": s.pop_messages as f64 / secs, "avgLagMs": s.lag_avg_ms,
           "maxLagMs": s.lag_max_ms, "dbErrors": s.db_errors, "ackFailed": s.ack_failed,
           "dlqCount": s.dead_lettered, "queenCpuUserPct": s.cpu_user_pct,
           "queenCpuSysPct": s.cpu_system_pct, "queenRssMb": s.rss_bytes as f64 / 1048576.0,
           "dbPoolActive": s.pool_in_use, "dbPoolIdle": s.pool_size.saturating_sub(s.pool_in_use),
           "dbPoolSize": s.pool_size, "parked": s.parked,
           "pushRequests": s.push_requests, "popRequests": s.pop_requests,
           "popEmpty": s.pop_empty, "ackRequests": s.ack_requests})
}

/// Brokers seen in the samples, with their latest sample.
fn workers(samples: &[WorkerSample]) -> Vec<Value> {
    let mut latest: BTreeMap<(&str, &str), (&WorkerSample, u64)> = BTreeMap::new();
    for s in samples {
        let e = latest
            .entry((s.hostname.as_str(), s.worker_id.as_str()))
            .or_insert((s, 0));
        e.1 += s.pop_messages;
        if s.bucket >= e.0.bucket {
            e.0 = s;
        }
    }
    latest
        .into_iter()
        .map(|((host, id), (s, processed))| {
            json!({"hostname": host, "workerId": id, "lastSeen": iso(s.bucket),
                   "dbConnections": s.pool_in_use, "freeSlots": s.pool_size.saturating_sub(s.pool_in_use),
                   "parked": s.parked, "messagesProcessed": processed,
                   "avgEventLoopLagMs": 0, "maxEventLoopLagMs": 0, "jobQueueSize": 0})
        })
        .collect()
}

/// GET /api/v1/status[?from,to,queue,namespace,task].
pub async fn status(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let now = broker.now();
    let (from, to, minutes) = window(pairs, now, 3600)?;
    let samples = broker.storage.inspect.samples(from, to).await?;
    let points = bucketed(&samples, minutes);
    let throughput: Vec<Value> = points
        .iter()
        .rev()
        .map(|(t, s)| point_json(*t, s, minutes))
        .collect();
    let filter = queue_filter(pairs, true)?;
    let snap = admin_totals::for_request(broker).await?;
    let mut totals = Counts::default();
    let (mut leases, mut leased_partitions, mut leased_messages) = (0u64, 0u64, 0u64);
    let mut affected = 0u64;
    let mut queues = vec![];
    for t in snap.queues_matching(&filter) {
        let q = &t.view;
        totals.add(t.counts);
        leases += t.leases;
        leased_partitions += t.leased_partitions;
        leased_messages += t.leased_messages;
        affected += u64::from(q.dead_letters > 0);
        if t.retained > 0 {
            queues.push(
                json!({"id": q.id, "name": q.config.name, "namespace": q.config.namespace,
                               "task": q.config.task, "partitions": t.partitions,
                               "totalConsumed": t.consumed}),
            );
        }
    }
    let sum = |f: fn(&WorkerSample) -> u64| samples.iter().map(f).sum::<u64>();
    let (push_req, pop_req, ack_req) = (
        sum(|s| s.push_requests),
        sum(|s| s.pop_requests),
        sum(|s| s.ack_requests),
    );
    let per = |msgs: u64, reqs: u64| {
        if reqs == 0 {
            0.0
        } else {
            msgs as f64 / reqs as f64
        }
    };
    let mut messages = totals.json();
    messages["requests"] = json!({"push": push_req, "pop": pop_req, "ack": ack_req});
    messages["batchEfficiency"] = json!({
        "push": per(sum(|s| s.push_messages), push_req),
        "pop": per(sum(|s| s.pop_messages), pop_req),
        "ack": per(sum(|s| s.ack_messages), ack_req)});
    ok(&json!({
        "timeRange": {"from": iso(from), "to": iso(to)}, "bucketMinutes": minutes,
        "pointCount": throughput.len(), "throughput": throughput, "queues": queues,
        "messages": messages,
        "leases": {"active": leases, "partitionsWithLeases": leased_partitions,
                   "totalBatchSize": leased_messages, "totalAcked": sum(|s| s.ack_messages)},
        "deadLetterQueue": {"totalMessages": totals.dead_letter, "affectedQueues": affected},
        "workers": workers(&samples),
        "errors": {"dbErrors": sum(|s| s.db_errors), "ackFailed": sum(|s| s.ack_failed),
                   "dlqMessages": sum(|s| s.dead_lettered)},
        "statsAge": snap.age_secs(now),
    }))
}

/// GET /api/v1/status/queues[?namespace,task,limit=100,offset].
pub async fn status_queues(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 100)?;
    let filter = queue_filter(pairs, false)?;
    let snap = admin_totals::for_request(broker).await?;
    let matching: Vec<&QueueTally> = snap.queues_matching(&filter).collect();
    let total = matching.len();
    let rows: Vec<Value> = page(matching, limit, offset)
        .into_iter()
        .map(|t| {
            let (q, c) = (&t.view, t.counts);
            // Queen's quirk kept: pending here is not net of processing.
            json!({"id": q.id, "name": q.config.name, "namespace": q.config.namespace,
                   "task": q.config.task, "createdAt": iso(q.created_at), "partitions": t.partitions,
                   "messages": {"total": c.total, "pending": c.pending + c.processing,
                                "processing": c.processing, "completed": c.completed(),
                                "deadLetter": c.dead_letter}})
        })
        .collect();
    ok(
        &json!({"queues": rows, "total": total, "pagination": {"limit": limit, "offset": offset},
               "statsAge": snap.age_secs(broker.now())}),
    )
}

/// GET /api/v1/status/queues/{name}[?limit,after]: a page of its partitions, each with every
/// cursor.
pub async fn queue_detail(
    broker: &Arc<Broker>,
    name: &str,
    pairs: &Pairs,
) -> Result<Reply, Failure> {
    let (page, pagination) = queue_page(broker, name, pairs, None).await?;
    let q = &page.tally.view;
    let c = &q.config;
    let partitions: Vec<PartitionRow> = page
        .partitions
        .iter()
        .map(|p| {
            let mut row = partition_row(p, &q.groups);
            row.cursor = Some(CursorSummary {
                total_consumed: p.cursors.iter().map(|c| c.total_consumed).sum::<i64>(),
                groups: p
                    .cursors
                    .iter()
                    .map(|c| CursorRow {
                        consumer_group: c.group.clone(),
                        committed: c.committed,
                        pending: p.pending_after(c.committed),
                        lease_expires_at: c.leased_until.map(iso),
                    })
                    .collect(),
            });
            row.last_activity = Some(p.newest_at.map(iso));
            row
        })
        .collect();
    let totals = page.tally.counts;
    let mut t = totals.json();
    t["messages"] = totals.json();
    ok_with_partitions(
        json!({
        "queue": {"id": q.id, "name": c.name, "namespace": c.namespace, "task": c.task,
                  "priority": c.priority, "createdAt": iso(q.created_at),
                  "config": {"leaseTime": c.lease_time_secs, "retryLimit": c.retry_limit,
                             "retryDelay": c.retry_delay_ms, "ttl": c.ttl_secs,
                             "maxQueueSize": c.max_size, "deadLetterQueue": c.dead_letter_queue,
                             "retentionEnabled": c.retention_enabled,
                             "retentionSeconds": c.retention_seconds,
                             "completedRetentionSeconds": c.completed_retention_seconds,
                             "encryptionEnabled": c.encryption_enabled}},
        "groups": q.groups, "totals": t,
        "partitionsTotal": page.tally.partitions, "pagination": pagination, "statsAge": page.stats_age,
        }),
        &partitions,
    )
}

/// GET /api/v1/status/analytics[?from,to,interval,queue,namespace,task]: messages by creation
/// time (the segments of the window counted in storage), zero-filled, oldest first.
pub async fn analytics(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let now = broker.now();
    let (from, to, _) = window(pairs, now, 24 * 3600)?;
    let interval = param(pairs, "interval").unwrap_or("hour");
    let step_secs: i64 = match interval {
        "minute" => 60,
        "hour" => 3600,
        "day" => 86400,
        _ => return Err(Failure::bad("interval must be minute, hour or day")),
    };
    if (to.0 - from.0) / 1_000_000 / step_secs > 10_000 {
        return Err(Failure::bad("the window holds more than 10000 intervals"));
    }
    let filter = queue_filter(pairs, true)?;
    let created = broker
        .storage
        .inspect
        .messages_created(from, to, step_secs, name_param(pairs, "queue")?.as_deref())
        .await?;
    // Whether each queue passes the filter, asked once (the counts come in queue order).
    let mut passes: Option<(String, bool)> = None;
    let mut counts: BTreeMap<i64, u64> = BTreeMap::new();
    for c in created {
        let taken = match &passes {
            Some((q, p)) if *q == c.queue => *p,
            _ => {
                let config = broker.storage.pops.queue_config(&c.queue).await?;
                let p = config.is_some_and(|conf| filter.matches(&conf));
                passes = Some((c.queue.clone(), p));
                p
            }
        };
        if taken {
            *counts.entry(c.bucket.0).or_default() += c.messages;
        }
    }
    let width = step_secs * 1_000_000;
    let mut points = vec![];
    let mut b = from.0 - from.0.rem_euclid(width);
    while b < to.0 {
        points.push(json!({"timestamp": iso(Timestamp(b)),
                           "messages": counts.get(&b).copied().unwrap_or(0)}));
        b += width;
    }
    ok(&json!({"dataPoints": points, "interval": interval, "from": iso(from), "to": iso(to)}))
}

fn worker_filter<'a>(
    samples: &'a [WorkerSample],
    pairs: &Pairs,
) -> impl Iterator<Item = &'a WorkerSample> + 'a {
    let host = param(pairs, "hostname").map(str::to_string);
    let worker = param(pairs, "workerId").map(str::to_string);
    samples.iter().filter(move |s| {
        host.as_ref().is_none_or(|h| *h == s.hostname)
            && worker.as_ref().is_none_or(|w| *w == s.worker_id)
    })
}

/// GET /api/v1/analytics/system-metrics[?from,to,hostname,workerId]: one series per broker.
/// `cpu.*_us` is CPU % × 100, as Queen's (despite the name).
pub async fn system_metrics(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let now = broker.now();
    let (from, to, minutes) = window(pairs, now, 3600)?;
    let samples = broker.storage.inspect.samples(from, to).await?;
    let mut by: BTreeMap<(String, String), Vec<&WorkerSample>> = BTreeMap::new();
    for s in worker_filter(&samples, pairs) {
        by.entry((s.hostname.clone(), s.worker_id.clone()))
            .or_default()
            .push(s);
    }
    let replicas: Vec<Value> = by
        .into_iter()
        .map(|((host, id), list)| {
            let mut buckets: BTreeMap<Timestamp, Vec<&WorkerSample>> = BTreeMap::new();
            for s in list {
                buckets.entry(bucket_of(s.bucket, minutes)).or_default().push(s);
            }
            let series: Vec<Value> = buckets
                .into_iter()
                .map(|(t, ss)| {
                    let f = |g: fn(&WorkerSample) -> f64| ss.iter().map(|s| g(s)).collect::<Vec<_>>();
                    json!({"timestamp": iso(t), "sampleCount": ss.len(), "metrics": {
                        "cpu": {"user_us": stat(&f(|s| s.cpu_user_pct * 100.0)),
                                "system_us": stat(&f(|s| s.cpu_system_pct * 100.0))},
                        "memory": {"rss_bytes": stat(&f(|s| s.rss_bytes as f64))},
                        "database": {"pool_size": stat(&f(|s| s.pool_size as f64)),
                                     "pool_active": stat(&f(|s| s.pool_in_use as f64)),
                                     "pool_idle": stat(&f(|s| s.pool_size.saturating_sub(s.pool_in_use) as f64))},
                        "parked": stat(&f(|s| s.parked as f64))}})
                })
                .collect();
            json!({"hostname": host, "workerId": id, "port": broker.config.port,
                   "timeSeries": series})
        })
        .collect();
    ok(
        &json!({"timeRange": {"from": iso(from), "to": iso(to)}, "replicaCount": replicas.len(),
               "bucketMinutes": minutes, "pointCount": replicas.iter()
                   .map(|r| r["timeSeries"].as_array().map_or(0, Vec::len)).max().unwrap_or(0),
               "replicas": replicas}),
    )
}

/// GET /api/v1/analytics/worker-metrics[?from,to,hostname,workerId]: newest first.
pub async fn worker_metrics(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let now = broker.now();
    let (from, to, minutes) = window(pairs, now, 3600)?;
    let all = broker.storage.inspect.samples(from, to).await?;
    let samples: Vec<WorkerSample> = worker_filter(&all, pairs).cloned().collect();
    let secs = (minutes * 60) as f64;
    let series: Vec<Value> = bucketed(&samples, minutes)
        .iter()
        .rev()
        .map(|(t, s)| {
            json!({"timestamp": iso(*t), "pushMessages": s.push_messages,
                   "popMessages": s.pop_messages, "ackMessages": s.ack_messages,
                   "pushRequests": s.push_requests, "popRequests": s.pop_requests,
                   "ackRequests": s.ack_requests, "pushPerSecond": s.push_messages as f64 / secs,
                   "popPerSecond": s.pop_messages as f64 / secs,
                   "ackPerSecond": s.ack_messages as f64 / secs, "avgLagMs": s.lag_avg_ms,
                   "maxLagMs": s.lag_max_ms, "dbErrors": s.db_errors,
                   "ackSuccess": s.ack_messages.saturating_sub(s.ack_failed),
                   "ackFailed": s.ack_failed, "dlqCount": s.dead_lettered,
                   "dbConnections": s.pool_in_use, "popEmpty": s.pop_empty, "parked": s.parked})
        })
        .collect();
    let sum = |f: fn(&WorkerSample) -> u64| samples.iter().map(f).sum::<u64>();
    ok(
        &json!({"timeRange": {"from": iso(from), "to": iso(to)}, "bucketMinutes": minutes,
               "pointCount": series.len(), "timeSeries": series, "workers": workers(&samples),
               "summary": {"totalPushMessages": sum(|s| s.push_messages),
                           "totalPopMessages": sum(|s| s.pop_messages),
                           "totalAckMessages": sum(|s| s.ack_messages),
                           "totalPushRequests": sum(|s| s.push_requests),
                           "totalPopRequests": sum(|s| s.pop_requests),
                           "totalAckRequests": sum(|s| s.ack_requests),
                           "totalDbErrors": sum(|s| s.db_errors),
                           "totalAckFailed": sum(|s| s.ack_failed),
                           "totalDlq": sum(|s| s.dead_lettered)}}),
    )
}

/// GET /api/v1/consumer-groups: one entry per (group, queue), by group then queue.
pub async fn consumer_groups(broker: &Arc<Broker>) -> Result<Reply, Failure> {
    let snap = admin_totals::for_request(broker).await?;
    let by_group: BTreeMap<(&String, &String), &GroupLag> = snap
        .queues
        .iter()
        .flat_map(|t| t.groups.iter().map(|(g, l)| ((g, &t.view.config.name), l)))
        .collect();
    let rows: Vec<Value> = by_group
        .into_iter()
        .map(|((g, q), l)| {
            let state = if l.max_time_lag > 300 {
                "Lagging"
            } else if l.consumed > 0 {
                "Stable"
            } else {
                "Dead"
            };
            json!({"name": g, "topics": [q], "queueName": q, "members": l.members,
                   "partitionsWithLag": l.backlog.partitions_pending, "totalLag": l.backlog.pending,
                   "maxTimeLag": l.max_time_lag, "state": state, "subscriptionMode": "all",
                   "subscriptionTimestamp": null, "subscriptionCreatedAt": null})
        })
        .collect();
    ok(&Value::Array(rows))
}

/// GET /api/v1/consumer-groups/{group}[?queue,limit,after]: keyed by queue, a page of each
/// queue's partitions (`after` needs `queue`). The group's queues are those the admin totals
/// list it on. Unknown group: `{}`.
pub async fn consumer_group(
    broker: &Arc<Broker>,
    group: &str,
    pairs: &Pairs,
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    let (limit, after) = partition_paging(pairs)?;
    let only = name_param(pairs, "queue")?;
    if after.is_some() && only.is_none() {
        return Err(Failure::bad(
            "after needs queue: it names a partition of one queue",
        ));
    }
    let snap = admin_totals::for_request(broker).await?;
    let now = broker.now();
    let stats_age = snap.age_secs(now);
    let mut out = serde_json::Map::new();
    let queues = snap.queues.iter().filter(|t| {
        t.view.groups.iter().any(|g| g == group)
            && only.as_ref().is_none_or(|o| *o == t.view.config.name)
    });
    for tally in queues {
        let q = &tally.view;
        let (partitions, next) = partition_page(
            &*broker.storage.inspect,
            &q.config.name,
            after.as_deref(),
            limit,
            Some(group),
        )
        .await?;
        let rows: Vec<Value> = partitions
            .iter()
            .map(|p| {
                let c = p.cursor(group);
                json!({"partition": p.partition, "partitionId": p.partition_id,
                       "workerId": c.and_then(|c| c.leased_until.and(c.worker_id.clone())),
                       "lastConsumedAt": null,
                       "totalConsumed": c.map_or(0, |c| c.total_consumed),
                       "committedOffset": c.map(|c| c.committed),
                       "offsetLag": depth(p, &q.groups, Some(group)),
                       "timeLagSeconds": c.map_or(p.oldest_at.filter(|_| p.retained() > 0), |c| c.oldest_unconsumed_at)
                           .map_or(0, |t| t.millis_until(now) / 1000),
                       "leaseActive": c.is_some_and(|c| c.leased_until.is_some())})
            })
            .collect();
        out.insert(
            q.config.name.clone(),
            json!({"partitions": rows, "partitionsTotal": tally.partitions,
                   "pagination": {"limit": limit, "after": after, "next": next},
                   "statsAge": stats_age}),
        );
    }
    ok(&Value::Object(out))
}

/// GET /api/v1/consumer-groups/lagging?minLagSeconds=3600: worst first, from the admin
/// totals, which keep the `LAGGING_KEPT` longest-lagging cursors.
pub async fn lagging(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let min_lag = u64::from(number(pairs, "minLagSeconds", 3600, u32::MAX)?);
    let snap = admin_totals::for_request(broker).await?;
    let now = broker.now();
    let rows: Vec<Value> = snap
        .lagging
        .iter()
        .map(|l| (l, l.oldest_unconsumed_at.millis_until(now) / 1000))
        .take_while(|(_, lag)| *lag > min_lag)
        .map(|(l, lag)| {
            json!({"consumer_group": l.group, "queue_name": l.queue,
                   "partition_name": l.partition, "partition_id": l.partition_id,
                   "worker_id": l.worker_id, "offset_lag": l.offset_lag,
                   "time_lag_seconds": lag, "lag_hours": lag as f64 / 3600.0,
                   "oldest_unconsumed_at": iso(l.oldest_unconsumed_at),
                   "last_consumed_at": null})
        })
        .collect();
    ok(&Value::Array(rows))
}

/// POST /api/v1/stats/refresh: runs a pass of the admin totals (`stats`) and answers when it
/// is done, with what it read and how long it took.
pub async fn refresh_stats(broker: &Arc<Broker>) -> Result<Reply, Failure> {
    let snap = admin_totals::refresh_after(broker, broker.now()).await?;
    let partitions: u64 = snap.queues.iter().map(|t| t.partitions).sum();
    ok(
        &json!({"success": true, "refreshed": true, "queues": snap.queues.len(),
               "partitions": partitions, "tookMs": snap.pass_ms,
               "statsAge": snap.age_secs(broker.now())}),
    )
}

/// Sets the scrape-time series (queue depth, group lag, partition lag under the cap) from the
/// admin totals. On a storage failure the previous values stay and `stored_state_ok` reads 0.
pub(crate) async fn refresh_stored_metrics(broker: &Arc<Broker>) {
    use crate::metrics::{GroupLabel, PartitionLabel, QueueLabel};
    let stored = &broker.metrics.stored;
    let _one_at_a_time = stored.scrape.lock().await;
    let snap = match admin_totals::for_request(broker).await {
        Ok(snap) => snap,
        Err(e) => {
            tracing::debug!(error = %e.message, "reading the queue series for a scrape");
            stored.read_ok.set(0);
            return;
        }
    };
    let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    stored.clear();
    for t in &snap.queues {
        let q = &t.view;
        let queue = QueueLabel {
            queue: q.config.name.clone(),
        };
        stored
            .queue_depth
            .get_or_create(&queue)
            .set(gauge(t.backlog.pending));
        stored
            .queue_messages
            .get_or_create(&queue)
            .set(gauge(t.counts.total));
        stored
            .queue_in_flight
            .get_or_create(&queue)
            .set(gauge(t.counts.processing));
        stored
            .queue_partitions
            .get_or_create(&queue)
            .set(gauge(t.partitions));
        stored
            .dlq_depth
            .get_or_create(&queue)
            .set(gauge(q.dead_letters));
        for (group, lag) in &t.groups {
            let label = GroupLabel {
                queue: q.config.name.clone(),
                consumer_group: group.clone(),
            };
            stored
                .group_lag
                .get_or_create(&label)
                .set(gauge(lag.backlog.pending));
            stored
                .group_lag_seconds
                .get_or_create(&label)
                .set(gauge(lag.max_time_lag));
        }
    }
    for l in &snap.partition_lags {
        stored
            .partition_lag
            .get_or_create(&PartitionLabel {
                queue: l.queue.clone(),
                partition: l.partition.clone(),
                consumer_group: l.group.clone(),
            })
            .set(gauge(l.pending));
    }
    stored
        .partition_series_omitted
        .set(gauge(snap.partition_lags_omitted));
    stored.read_ok.set(1);
}
