//! The delivery contract's endpoints: transactions, dead letters, consumer-group management.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::events::DeliveryEvent;
use queen_core::frames::slice_blob;
use queen_core::storage::{AckItem, DlqQuery, PushOutcome, SeekTarget, TxOp, TxOpResult};
use queen_core::time::{format_iso_micros, parse_iso};
use queen_core::types::QUEUE_MODE_GROUP;
use serde_json::{json, Value};

use crate::app::App;
use crate::http::{self, str_field, Failure, Reply};
use crate::routes::{group_items, parse_ack_fields, parse_item};

/// POST /api/v1/transaction: acks and pushes commit together or not at all.
pub async fn transaction(app: &Arc<App>, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let ops = v
        .get("operations")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::bad("operations array required"))?;
    if ops.is_empty() {
        return Err(Failure::bad("operations array cannot be empty"));
    }
    // requiredLeases stands in for acks without their own leaseId when it names exactly one lease.
    let required: Vec<String> = match v.get("requiredLeases") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|l| {
                l.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Failure::bad("requiredLeases must be strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(Failure::bad("requiredLeases must be an array")),
    };
    let mut tx_ops = Vec::with_capacity(ops.len());
    // Per op: the push items' transaction ids and queues, to render the flat result list.
    let mut shapes: Vec<Vec<(String, String)>> = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        match str_field(op, "type", "type")? {
            Some("push") => {
                let items = op.get("items").and_then(Value::as_array).ok_or_else(|| {
                    Failure::bad(format!("operations[{i}]: items array is required"))
                })?;
                let parsed = items
                    .iter()
                    .enumerate()
                    .map(|(k, it)| parse_item(k, it, app))
                    .collect::<Result<Vec<_>, _>>()?;
                shapes.push(
                    parsed
                        .iter()
                        .map(|it| (it.frame.transaction_id.clone(), it.queue.clone()))
                        .collect(),
                );
                let (groups, _) = group_items(parsed);
                tx_ops.push(TxOp::Push(groups));
            }
            Some("ack") => {
                let mut item: AckItem = parse_ack_fields(op, i)?;
                if item.lease_id.is_none() && required.len() == 1 {
                    item.lease_id = Some(required[0].clone());
                }
                let group = str_field(op, "consumerGroup", "consumerGroup")?
                    .filter(|g| !g.is_empty())
                    .unwrap_or(QUEUE_MODE_GROUP)
                    .to_string();
                shapes.push(vec![]);
                tx_ops.push(TxOp::Ack { group, item });
            }
            _ => {
                return Err(Failure::bad(format!(
                    "operations[{i}]: type must be \"push\" or \"ack\""
                )))
            }
        }
    }
    let out = app.delivery.transaction(tx_ops.clone()).await?;
    if out.committed {
        app.publish_acks(out.results.iter().zip(&tx_ops).filter_map(|r| match r {
            (TxOpResult::Ack(a), TxOp::Ack { group, .. }) => Some((group.as_str(), a)),
            _ => None,
        }));
    }
    let mut results = vec![];
    for (k, r) in out.results.iter().enumerate() {
        match (r, &tx_ops[k]) {
            (TxOpResult::Ack(a), TxOp::Ack { item, .. }) => {
                results.push(json!({"index": results.len(), "type": "ack", "success": a.success, "transactionId": item.transaction_id, "error": a.error, "dlq": a.dlq}));
            }
            (TxOpResult::Push(groups), TxOp::Push(req)) => {
                if out.committed {
                    app.publish_pushes(
                        req.iter().map(|g| (g.queue.as_str(), g.partition.as_str())),
                        groups,
                    );
                }
                // Items in request order: match each (transactionId, queue) to its group outcome.
                for (txid, queue) in &shapes[k] {
                    let found = req.iter().zip(groups).find_map(|(g, res)| {
                        (g.queue == *queue)
                            .then(|| {
                                g.frames
                                    .iter()
                                    .position(|f| &f.transaction_id == txid)
                                    .map(|pos| &res[pos])
                            })
                            .flatten()
                    });
                    let (status, message_id, partition_id) = match found {
                        Some(PushOutcome::Queued {
                            message_id,
                            partition_id,
                            ..
                        }) => ("queued", message_id.to_string(), partition_id.clone()),
                        Some(PushOutcome::Duplicate {
                            message_id,
                            partition_id,
                        }) => ("duplicate", message_id.to_string(), partition_id.clone()),
                        Some(PushOutcome::Rejected { partition_id, .. }) => {
                            ("failed", String::new(), partition_id.clone())
                        }
                        None => ("failed", String::new(), String::new()),
                    };
                    results.push(json!({"index": results.len(), "type": "push", "success": status != "failed", "status": status,
                                        "transactionId": txid, "messageId": message_id, "partitionId": partition_id, "queueName": queue}));
                }
            }
            _ => return Err(Failure::server("transaction results out of order")),
        }
    }
    let id = app.mint_uuid().to_string();
    let answer = if out.committed {
        json!({"transactionId": id, "success": true, "results": results})
    } else {
        json!({"transactionId": id, "success": false, "error": out.error, "results": results})
    };
    Ok(http::json(StatusCode::OK, &answer))
}

fn timestamp_param(v: &str, what: &str) -> Result<queen_core::Timestamp, Failure> {
    parse_iso(v)
        .ok_or_else(|| Failure::bad(format!("{what} must be an ISO-8601 timestamp, got {v:?}")))
}

/// GET /api/v1/dlq: dead letters newest first, with the 0.15 shape plus `total`.
pub async fn dead_letters(app: &Arc<App>, pairs: &[(String, String)]) -> Result<Reply, Failure> {
    let mut q = DlqQuery {
        limit: 100,
        ..DlqQuery::default()
    };
    for (k, v) in pairs {
        match k.as_str() {
            "queue" => q.queue = v.clone(),
            "consumerGroup" if !v.is_empty() => q.group = Some(v.clone()),
            "partition" if !v.is_empty() => q.partition = Some(v.clone()),
            "from" if !v.is_empty() => q.from = Some(timestamp_param(v, "from")?),
            "to" if !v.is_empty() => q.to = Some(timestamp_param(v, "to")?),
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
    let (limit, offset) = (q.limit, q.offset);
    let (rows, total) = app.delivery.dead_letters(q).await?;
    let mut messages = Vec::with_capacity(rows.len());
    for r in rows {
        let frame = r
            .segment
            .as_ref()
            .and_then(|s| slice_blob(&s.blob, s.start_idx as usize, 1, s.msg_count as usize).ok())
            .and_then(|mut f| f.pop());
        let data = frame
            .as_ref()
            .and_then(|f| serde_json::from_slice::<Value>(&f.payload).ok())
            .unwrap_or(Value::Null);
        messages.push(json!({
            "id": frame.as_ref().map(|f| f.message_id.to_string()),
            "dlqId": r.id,
            "transactionId": r.transaction_id, "partitionId": r.partition_id, "queue": r.queue, "partition": r.partition,
            "consumerGroup": r.group, "errorMessage": r.error, "retryCount": r.retry_count, "data": data, "producerSub": null,
            "createdAt": r.segment.as_ref().map(|s| format_iso_micros(s.created_at)), "failedAt": format_iso_micros(r.failed_at),
        }));
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
    app: &Arc<App>,
    group: &str,
    queue: Option<&str>,
    pairs: &[(String, String)],
) -> Result<Reply, Failure> {
    let with_meta = delete_metadata(pairs);
    let (cursors, meta) = app.delivery.delete_group(group, queue, with_meta).await?;
    app.publish(&DeliveryEvent::GroupReset {
        queue: queue.map(str::to_string),
        group: group.to_string(),
    });
    let mut answer = json!({"success": true, "consumerGroup": group, "deletedPartitions": cursors, "metadataDeleted": meta > 0});
    if let Some(q) = queue {
        answer["queueName"] = json!(q);
    }
    Ok(http::json(StatusCode::OK, &answer))
}

/// POST /api/v1/consumer-groups/{g}/queues/{q}/seek with {"toEnd": true} or {"timestamp": ISO}.
pub async fn seek(app: &Arc<App>, group: &str, queue: &str, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, Some(json!({})))?;
    let to_end = v.get("toEnd").and_then(Value::as_bool).unwrap_or(false);
    let target = if to_end {
        SeekTarget::End
    } else {
        match str_field(&v, "timestamp", "timestamp")? {
            Some(t) => SeekTarget::Timestamp(timestamp_param(t, "timestamp")?),
            None => return Err(Failure::bad("seek needs toEnd: true or a timestamp")),
        }
    };
    let moved = app.delivery.seek_group(group, queue, target).await?;
    app.publish(&DeliveryEvent::GroupReset {
        queue: Some(queue.to_string()),
        group: group.to_string(),
    });
    let ts = match target {
        SeekTarget::Timestamp(t) => json!(format_iso_micros(t)),
        SeekTarget::End => Value::Null,
    };
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "consumerGroup": group, "queueName": queue, "seekToEnd": to_end, "targetTimestamp": ts, "partitionsUpdated": moved}),
    ))
}

/// POST /api/v1/consumer-groups/{g}/subscription with {"subscriptionTimestamp": ISO}.
pub async fn update_subscription(
    app: &Arc<App>,
    group: &str,
    body: &[u8],
) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let ts = str_field(&v, "subscriptionTimestamp", "subscriptionTimestamp")?
        .ok_or_else(|| Failure::bad("subscriptionTimestamp is required"))?;
    let t = timestamp_param(ts, "subscriptionTimestamp")?;
    let n = app.delivery.update_subscription(group, t).await?;
    app.publish(&DeliveryEvent::GroupReset {
        queue: None,
        group: group.to_string(),
    });
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "consumerGroup": group, "newTimestamp": ts, "rowsUpdated": n}),
    ))
}

/// POST /api/v1/dlq/{id}/requeue: the dead letter's message is pushed again as a new message.
pub async fn requeue(app: &Arc<App>, id: &str) -> Result<Reply, Failure> {
    let id: i64 = id
        .parse()
        .map_err(|_| Failure::bad("the dead-letter id must be a whole number"))?;
    match app
        .delivery
        .requeue_dead_letter(id, app.mint_uuid())
        .await?
    {
        None => Ok(http::json(
            StatusCode::NOT_FOUND,
            &json!({"error": "no such dead letter (or its message was removed by retention)"}),
        )),
        Some((queue, partition, outcome)) => {
            let (message_id, partition_id) = (
                outcome.message_id().to_string(),
                outcome.partition_id().to_string(),
            );
            app.publish_pushes(
                std::iter::once((queue.as_str(), partition.as_str())),
                &[vec![outcome]],
            );
            Ok(http::json(
                StatusCode::OK,
                &json!({"success": true, "requeued": true, "queue": queue, "partition": partition, "messageId": message_id, "partitionId": partition_id}),
            ))
        }
    }
}
