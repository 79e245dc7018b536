//! The delivery contract's endpoints: transactions, dead letters, consumer-group management.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::slice_blob;
use queen_core::storage::{DlqQuery, PushOutcome, SeekTarget, TxOp, TxOpResult};
use queen_core::time::format_iso_micros;
use queen_core::wire;
use serde_json::{json, Value};

use crate::app::App;
use crate::http::{self, Failure, Reply};
use crate::requests;
use crate::routes::{group_items, merge_wire_groups};

/// `POST /api/v1/transaction`: acks and pushes commit together or not at all. A JSON body, or Queen 2.x's binary one (`QTB1`: a JSON head
/// without the pushes, then the pushes as framed groups; the answer lists the head's operations
/// first, then the pushes in wire order).
pub async fn transaction(
    app: &Arc<App>,
    body: &[u8],
    producer: Option<&str>,
) -> Result<Reply, Failure> {
    let (request, pushes, counts) = if wire::is_binary_transaction(body) {
        let decoded = wire::decode_transaction(body, app.config.max_body_bytes)
            .map_err(|e| Failure::bad(format!("binary transaction: {e}")))?;
        app.metrics.binary_transactions.inc();
        let head: requests::TransactionBody = requests::body(&decoded.head, Some("{}"))?;
        (head, Some(decoded.groups), decoded.counts)
    } else {
        let request: requests::TransactionBody = requests::body(body, None)?;
        if request.operations.is_none() {
            return Err(Failure::bad("operations array required"));
        }
        (request, None, false)
    };
    let operations = request.operations.unwrap_or_default();
    if operations.is_empty() && pushes.as_ref().is_none_or(|g| g.is_empty()) {
        return Err(Failure::bad("operations array cannot be empty"));
    }
    let required = request.required_leases.unwrap_or_default();
    for lease in &required {
        requests::check_name("requiredLeases", lease)?;
    }
    let mut tx_ops = Vec::with_capacity(operations.len() + 1);
    // Per push op: each item's (transactionId, queue), to render the flat result list.
    let mut shapes: Vec<Vec<(String, String)>> = Vec::with_capacity(tx_ops.capacity());
    for (i, raw) in operations.iter().enumerate() {
        let kind: requests::OperationKind = requests::operation(raw, i)?;
        match kind.kind.as_deref() {
            Some("push") => {
                let op: requests::PushOperation = requests::operation(raw, i)?;
                let items =
                    requests::push_items(&op.items, &format!("operations[{i}].items"), || {
                        app.mint_uuid()
                    })?;
                shapes.push(
                    items
                        .iter()
                        .map(|it| (it.frame.transaction_id.clone(), it.queue.clone()))
                        .collect(),
                );
                tx_ops.push(TxOp::Push(group_items(items).0));
            }
            Some("ack") => {
                let fields: requests::AckFields = requests::operation(raw, i)?;
                let group = requests::consumer_group(fields.consumer_group.clone())?;
                let mut item = fields.into_item()?;
                if let ([lease], None) = (required.as_slice(), &item.lease_id) {
                    item.lease_id = Some(lease.clone());
                }
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
    if let Some(groups) = pushes.filter(|g| !g.is_empty()) {
        shapes.push(
            groups
                .iter()
                .flat_map(|g| {
                    g.frames
                        .iter()
                        .map(|f| (f.transaction_id.clone(), g.queue.clone()))
                })
                .collect(),
        );
        tx_ops.push(TxOp::Push(merge_wire_groups(groups).0));
    }
    // The ack items' transaction ids and the push groups, for the answer.
    let rendered_ops: Vec<TxOp> = tx_ops.clone();
    let out = app.transaction(tx_ops, producer).await?;
    let mut results = vec![];
    for (k, r) in out.results.iter().enumerate() {
        match (r, &rendered_ops[k]) {
            (TxOpResult::Ack(a), TxOp::Ack { item, .. }) => {
                results.push(json!({"index": results.len(), "type": "ack", "success": a.success, "transactionId": item.transaction_id, "error": a.error, "dlq": a.dlq}));
            }
            (TxOpResult::Push(groups), TxOp::Push(req)) => {
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
    if counts {
        // Flag 2: the pushes' and acks' results are counted, not listed.
        let count = |kind: &str, status: Option<&str>| {
            results
                .iter()
                .filter(|r| r["type"] == kind && r["success"] == true)
                .filter(|r| status.is_none_or(|s| r["status"] == s))
                .count()
        };
        let (pushed, duplicate, acked) = (
            count("push", Some("queued")),
            count("push", Some("duplicate")),
            count("ack", None),
        );
        let mut answer = json!({"transactionId": id, "success": out.committed, "pushed": pushed,
                                "duplicate": duplicate, "acked": acked, "results": []});
        if !out.committed {
            answer["error"] = json!(out.error);
        }
        return Ok(http::json(StatusCode::OK, &answer));
    }
    let answer = if out.committed {
        json!({"transactionId": id, "success": true, "results": results})
    } else {
        json!({"transactionId": id, "success": false, "error": out.error, "results": results})
    };
    Ok(http::json(StatusCode::OK, &answer))
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
    let page = app.dead_letters(q).await?;
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
                let payload = crate::sealing::plaintext(app.config.cipher.as_deref(), f)
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
    app: &Arc<App>,
    group: &str,
    queue: Option<&str>,
    pairs: &[(String, String)],
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    if let Some(q) = queue {
        requests::check_name("queue", q)?;
    }
    let with_meta = delete_metadata(pairs);
    let deleted = app.delete_group(group, queue, with_meta).await?;
    let mut answer = json!({"success": true, "consumerGroup": group, "deletedPartitions": deleted.cursors,
                            "metadataDeleted": deleted.subscription_records > 0});
    if let Some(q) = queue {
        answer["queueName"] = json!(q);
    }
    Ok(http::json(StatusCode::OK, &answer))
}

/// POST /api/v1/consumer-groups/{g}/queues/{q}/seek with {"toEnd": true} or {"timestamp": ISO}.
pub async fn seek(app: &Arc<App>, group: &str, queue: &str, body: &[u8]) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    requests::check_name("queue", queue)?;
    let request: requests::SeekBody = requests::body(body, Some("{}"))?;
    let target = request.target()?;
    let moved = app.seek_group(group, queue, target).await?;
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
    app: &Arc<App>,
    group: &str,
    body: &[u8],
) -> Result<Reply, Failure> {
    requests::check_name("consumerGroup", group)?;
    let request: requests::SubscriptionBody = requests::body(body, None)?;
    let ts = request
        .subscription_timestamp
        .ok_or_else(|| Failure::bad("subscriptionTimestamp is required"))?;
    let t = requests::timestamp(&ts, "subscriptionTimestamp")?;
    let n = app.update_subscription(group, t).await?;
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
    match app.requeue_dead_letter(id).await? {
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
