//! Consumer groups: the listing, one group's partitions, and the lagging cursors.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{iso, name_param, number, ok, partition_paging, Pairs};
use crate::broker::Broker;
use crate::http::wire as requests;
use crate::http::{Failure, Reply};
use crate::storage_reads;
use crate::tasks::admin_totals;
use crate::views::{depth, GroupLag};

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
        let (partitions, next) = storage_reads::partition_page(
            broker,
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
