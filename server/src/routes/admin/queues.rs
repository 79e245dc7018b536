//! Queues and partitions: the queue listings, a queue's page and depth, the partition listing,
//! the overview, namespaces and tasks.

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_core::storage::{PartitionView, QueueFilter, QueueView};
use serde_json::{json, Value};

use super::{
    iso, name_param, number, ok, ok_with_partitions, paging, partition_row, queue_filter,
    queue_page, DepthRow, Pairs, PartitionRow,
};
use crate::broker::Broker;
use crate::http::{Failure, Reply};
use crate::stats::{QueueTally, Snapshot};
use crate::storage_reads;
use crate::tasks::admin_totals;
use crate::views::{depth, page, Backlog, Counts};

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
            let page = storage_reads::partition_views_page(
                broker,
                &q.config.name,
                after.as_deref(),
                size as u32,
            )
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
    let (ingested, processed) = storage_reads::recent_rates(broker, 5).await?;
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
