//! The admin totals: a pass on request, and the stored series of the metrics.

use std::sync::Arc;

use serde_json::json;

use super::ok;
use crate::broker::Broker;
use crate::http::{Failure, Reply};
use crate::tasks::admin_totals;

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
