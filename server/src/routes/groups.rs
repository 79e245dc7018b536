//! Consumer-group management (delete, seek, subscription) and the dead-letter queue.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::slice_blob;
use queen_core::storage::{DlqQuery, SeekTarget};
use queen_core::time::format_iso_micros;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, wire as requests, Failure, Reply};

/// GET /api/v1/dlq: dead letters newest first, with the 0.15 shape plus `total`.
pub async fn dead_letters(
    broker: &Arc<Broker>,
    pairs: &[(String, String)],
) -> Result<Reply, Failure> {
    let mut q = DlqQuery {
        limit: 100,
        ..DlqQuery::default()
    };
    for (k, v) in pairs {
        match k.as_str() {
            "queue" => q.queue = v.clone(),
            "consumerGroup" if !v.is_empty() => {
                requests::check_name("consumerGroup", v)?;
                q.group = Some(v.clone())
            }
            "partition" if !v.is_empty() => {
                requests::check_name("partition", v)?;
                q.partition = Some(v.clone())
            }
            "from" if !v.is_empty() => q.from = Some(requests::timestamp(v, "from")?),
            "to" if !v.is_empty() => q.to = Some(requests::timestamp(v, "to")?),
            "limit" => {
                q.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| Failure::bad("limit must be between 1 and 1000"))?
            }
            "offset" => {
                q.offset = v
                    .parse()
                    .map_err(|_| Failure::bad("offset must be a whole number"))?
            }
            _ => {}
        }
    }
    if q.queue.is_empty() {
        return Err(Failure::bad("queue is required"));
    }
    requests::check_name("queue", &q.queue)?;
    let (limit, offset) = (q.limit, q.offset);
    let page = broker.dead_letters(q).await?;
    let total = page.total;
    let mut messages = Vec::with_capacity(page.entries.len());
    for r in page.entries {
        let frame = r
            .segment
            .as_ref()
            .and_then(|s| slice_blob(&s.blob, s.start_idx as usize, 1, s.msg_count as usize).ok())
            .and_then(|mut f| f.pop());
        let data = match &frame {
            Some(f) => {
                let payload = crate::sealing::plaintext(broker.config.cipher.as_deref(), f)
                    .map_err(Failure::server)?;
                serde_json::from_slice::<Value>(&payload).unwrap_or(Value::Null)
            }
            None => Value::Null,
        };
        let producer = frame.as_ref().and_then(|f| f.producer.clone());
        let mut entry = json!({
            "id": frame.as_ref().map(|f| f.message_id.to_string()),
            "dlqId": r.id,
            "transactionId": r.transaction_id, "partitionId": r.partition_id, "queue": r.queue, "partition": r.partition,
            "consumerGroup": r.group, "errorMessage": r.error, "retryCount": r.retry_count, "data": data,
            "createdAt": r.segment.as_ref().map(|s| format_iso_micros(s.created_at)), "failedAt": format_iso_micros(r.failed_at),
        });
        // Omitted for messages pushed without auth, as on pops.
        if let Some(p) = producer {
            entry["producerSub"] = json!(p);
        }
        messages.push(entry);
    }
    Ok(http::json(
        StatusCode::OK,
        &json!({"messages": messages, "pagination": {"limit": limit, "offset": offset}, "total": total}),
    ))
}

fn delete_metadata(pairs: &[(String, String)]) -> bool {
    pairs
        .iter()
        .any(|(k, v)| k == "deleteMetadata" && (v == "true" || v == "1"))
}

/// DELETE /api/v1/consumer-groups/{g}[/queues/{q}]
pub async fn delete_group(
    broker: &Arc<Broker>,
    group: &str,
    queue: Option<&str>,
    pairs: &[(String, String)],
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    if let Some(q) = queue {
        requests::check_name("queue", q)?;
    }
    let with_meta = delete_metadata(pairs);
    let deleted = broker.delete_group(group, queue, with_meta).await?;
    let mut answer = json!({"success": true, "consumerGroup": group, "deletedPartitions": deleted.cursors,
                            "metadataDeleted": deleted.subscription_records > 0});
    if let Some(q) = queue {
        answer["queueName"] = json!(q);
    }
    Ok(http::json(StatusCode::OK, &answer))
}

/// POST /api/v1/consumer-groups/{g}/queues/{q}/seek with {"toEnd": true} or {"timestamp": ISO}.
pub async fn seek(
    broker: &Arc<Broker>,
    group: &str,
    queue: &str,
    body: &[u8],
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    requests::check_name("queue", queue)?;
    let request: requests::SeekBody = requests::body(body, Some("{}"))?;
    let target = request.target()?;
    let moved = broker.seek_group(group, queue, target).await?;
    let (to_end, ts) = match target {
        SeekTarget::Timestamp(t) => (false, json!(format_iso_micros(t))),
        SeekTarget::End => (true, Value::Null),
    };
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "consumerGroup": group, "queueName": queue, "seekToEnd": to_end, "targetTimestamp": ts, "partitionsUpdated": moved}),
    ))
}

/// POST /api/v1/consumer-groups/{g}/subscription with {"subscriptionTimestamp": ISO}.
pub async fn update_subscription(
    broker: &Arc<Broker>,
    group: &str,
    body: &[u8],
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    let request: requests::SubscriptionBody = requests::body(body, None)?;
    let ts = request
        .subscription_timestamp
        .ok_or_else(|| Failure::bad("subscriptionTimestamp is required"))?;
    let t = requests::timestamp(&ts, "subscriptionTimestamp")?;
    let n = broker.update_subscription(group, t).await?;
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "consumerGroup": group, "newTimestamp": ts, "rowsUpdated": n}),
    ))
}

/// POST /api/v1/dlq/{id}/requeue: the dead letter's message is pushed again as a new message.
pub async fn requeue(broker: &Arc<Broker>, id: &str) -> Result<Reply, Failure> {
    let id: i64 = id
        .parse()
        .map_err(|_| Failure::bad("the dead-letter id must be a whole number"))?;
    match broker.requeue_dead_letter(id).await? {
        None => Ok(http::json(
            StatusCode::NOT_FOUND,
            &json!({"error": "no such dead letter (or its message was removed by retention)"}),
        )),
        Some(r) => Ok(http::json(
            StatusCode::OK,
            &json!({"success": true, "requeued": true, "queue": r.queue, "partition": r.partition,
                    "messageId": r.outcome.message_id().to_string(),
                    "partitionId": r.outcome.partition_id()}),
        )),
    }
}
