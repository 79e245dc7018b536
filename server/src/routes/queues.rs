//! Queue configuration and deletion.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::QueueConfig;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, wire as requests, Failure, Reply};

fn options_json(c: &QueueConfig) -> Value {
    json!({"priority": c.priority, "leaseTime": c.lease_time_secs, "retryLimit": c.retry_limit, "retryDelay": c.retry_delay_ms,
           "maxSize": c.max_size, "ttl": c.ttl_secs, "deadLetterQueue": c.dead_letter_queue,
           "dlqAfterMaxRetries": c.dlq_after_max_retries, "delayedProcessing": c.delayed_processing_secs,
           "windowBuffer": c.window_buffer_secs, "retentionSeconds": c.retention_seconds,
           "completedRetentionSeconds": c.completed_retention_seconds, "retentionEnabled": c.retention_enabled,
           "encryptionEnabled": c.encryption_enabled, "maxWaitTimeSeconds": c.max_wait_time_seconds})
}

pub async fn configure(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let request: requests::ConfigureBody = requests::body(body, None)?;
    let config = request.into_config()?;
    let configured = broker.configure_queue(config.clone()).await?;
    Ok(http::json(
        StatusCode::OK,
        &json!({"configured": true, "queueId": configured.queue_id,
                "partitionId": configured.default_partition_id, "queue": config.name,
                "namespace": config.namespace, "task": config.task, "options": options_json(&config)}),
    ))
}

pub async fn delete_queue(broker: &Arc<Broker>, queue: &str) -> Result<Reply, Failure> {
    requests::check_name("queue", queue)?;
    let existed = broker.delete_queue(queue).await?;
    Ok(http::json(
        StatusCode::OK,
        &json!({"deleted": true, "queue": queue, "existed": existed}),
    ))
}
