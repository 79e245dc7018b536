//! Status and analytics: the throughput window, queues' status, a queue's cursors, message
//! analytics and the brokers' own samples.

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_core::storage::WorkerSample;
use queen_core::Timestamp;
use serde_json::{json, Value};

use super::{
    iso, name_param, ok, ok_with_partitions, paging, param, partition_row, queue_filter,
    queue_page, time_param, CursorRow, CursorSummary, Pairs, PartitionRow,
};
use crate::broker::Broker;
use crate::http::{Failure, Reply};
use crate::stats::QueueTally;
use crate::storage_reads;
use crate::tasks::admin_totals;
use crate::views::{bucket_of, bucketed, page, stat, Counts};

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
    let samples = storage_reads::samples(broker, from, to).await?;
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
    let queue = name_param(pairs, "queue")?;
    let created =
        storage_reads::messages_created(broker, from, to, step_secs, queue.as_deref()).await?;
    // Whether each queue passes the filter, asked once (the counts come in queue order).
    let mut passes: Option<(String, bool)> = None;
    let mut counts: BTreeMap<i64, u64> = BTreeMap::new();
    for c in created {
        let taken = match &passes {
            Some((q, p)) if *q == c.queue => *p,
            _ => {
                let config = storage_reads::queue_config(broker, &c.queue).await?;
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
    let samples = storage_reads::samples(broker, from, to).await?;
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
    let all = storage_reads::samples(broker, from, to).await?;
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
