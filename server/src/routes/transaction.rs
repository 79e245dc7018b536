//! `POST /api/v1/transaction`: pushes and acks that commit together or not at all.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::{PushOutcome, TxOp, TxOpResult, TxOutcome, KV_PRECONDITION};
use queen_core::wire::{self, WireGroup};
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, wire as requests, Failure, Reply};
use crate::routes::push::{group_items, merge_wire_groups};

/// `POST /api/v1/transaction`: acks and pushes commit together or not at all. A JSON body, or
/// Queen 2.x's binary one (`QTB1`: a JSON head without the pushes, then the pushes as framed
/// groups; the answer lists the head's operations first, then the pushes in wire order).
pub async fn transaction(
    broker: &Arc<Broker>,
    body: &[u8],
    producer: Option<&str>,
) -> Result<Reply, Failure> {
    let (request, pushes, counts) = decode(broker, body)?;
    let (tx_ops, shapes) = operations(broker, request, pushes)?;
    // The ack items' transaction ids and the push groups, for the answer.
    let rendered_ops: Vec<TxOp> = tx_ops.clone();
    let out = broker.transaction(tx_ops, producer).await?;
    let results = results(&out.results, &rendered_ops, &shapes)?;
    let id = broker.mint_uuid().to_string();
    let answer = if let Some(refused) = kv_refusal(&out, &results) {
        let mut answer = refused;
        answer["transactionId"] = json!(id);
        answer["results"] = json!(results);
        answer
    } else if counts {
        counted_answer(&id, &out, &results)
    } else if out.committed {
        json!({"transactionId": id, "success": true, "results": results})
    } else {
        json!({"transactionId": id, "success": false, "error": out.error, "results": results})
    };
    Ok(http::json(StatusCode::OK, &answer))
}

/// Per push op: each item's (transactionId, queue), to render the flat result list.
type Shapes = Vec<Vec<(String, String)>>;

/// The request's head, its binary pushes (QTB1 only), and whether the answer is counted (flag 2).
fn decode(
    broker: &Broker,
    body: &[u8],
) -> Result<(requests::TransactionBody, Option<Vec<WireGroup>>, bool), Failure> {
    if wire::is_binary_transaction(body) {
        let decoded = wire::decode_transaction(body, broker.config.max_body_bytes)
            .map_err(|e| Failure::bad(format!("binary transaction: {e}")))?;
        broker.metrics.binary_transactions.inc();
        let head: requests::TransactionBody = requests::body(&decoded.head, Some("{}"))?;
        return Ok((head, Some(decoded.groups), decoded.counts));
    }
    let request: requests::TransactionBody = requests::body(body, None)?;
    if request.operations.is_none() {
        return Err(Failure::bad("operations array required"));
    }
    Ok((request, None, false))
}

/// The storage operations in request order (the binary pushes last), each with its shape.
fn operations(
    broker: &Broker,
    request: requests::TransactionBody,
    pushes: Option<Vec<WireGroup>>,
) -> Result<(Vec<TxOp>, Shapes), Failure> {
    let operations = request.operations.unwrap_or_default();
    let riders = crate::routes::kv::parse_ops(broker, request.kv.as_deref().unwrap_or_default())?;
    let timer_riders =
        crate::routes::timers::parse_ops(broker, request.timers.as_deref().unwrap_or_default())?;
    if operations.is_empty()
        && pushes.as_ref().is_none_or(|g| g.is_empty())
        && riders.is_empty()
        && timer_riders.is_empty()
    {
        return Err(Failure::bad("operations array cannot be empty"));
    }
    let required = request.required_leases.unwrap_or_default();
    for lease in &required {
        requests::check_name("requiredLeases", lease)?;
    }
    let mut tx_ops = Vec::with_capacity(operations.len() + 1);
    let mut shapes: Shapes = Vec::with_capacity(tx_ops.capacity());
    for (i, raw) in operations.iter().enumerate() {
        let kind: requests::OperationKind = requests::operation(raw, i)?;
        match kind.kind.as_deref() {
            Some("push") => {
                let op: requests::PushOperation = requests::operation(raw, i)?;
                let items =
                    requests::push_items(&op.items, &format!("operations[{i}].items"), || {
                        broker.mint_uuid()
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
    // Riders after every operation: their results follow the pushes' and acks' in the answer.
    for op in riders {
        shapes.push(vec![]);
        tx_ops.push(TxOp::Kv(op));
    }
    for op in timer_riders {
        shapes.push(vec![]);
        tx_ops.push(TxOp::Timer(op));
    }
    Ok((tx_ops, shapes))
}

/// The flat result list: one entry per ack, and per pushed item in request order.
fn results(outcomes: &[TxOpResult], ops: &[TxOp], shapes: &Shapes) -> Result<Vec<Value>, Failure> {
    let mut results = vec![];
    for (k, r) in outcomes.iter().enumerate() {
        match (r, &ops[k]) {
            (TxOpResult::Ack(a), TxOp::Ack { item, .. }) => {
                let mut result = json!({"index": results.len(), "type": "ack", "success": a.success, "transactionId": item.transaction_id, "error": a.error, "dlq": a.dlq});
                if a.noop {
                    result["noop"] = json!(true);
                }
                results.push(result);
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
            (TxOpResult::Kv { answer, .. }, TxOp::Kv(_)) => {
                let mut element = answer.clone();
                element["index"] = json!(results.len());
                element["type"] = json!("kv");
                results.push(element);
            }
            (TxOpResult::Timer(answer), TxOp::Timer(_)) => {
                let mut element = answer.clone();
                element["index"] = json!(results.len());
                element["type"] = json!("timer");
                results.push(element);
            }
            _ => return Err(Failure::server("transaction results out of order")),
        }
    }
    Ok(results)
}

/// A transaction rolled back by a `required` KV op that did not apply: returned to the client
/// (not raised) as `{success: false, reason: "kv_precondition", failedIndex, kvReason, value,
/// version}`. Storage stops at the refused op, so it is the last result.
fn kv_refusal(out: &TxOutcome, results: &[Value]) -> Option<Value> {
    if out.committed || out.error.as_deref() != Some(KV_PRECONDITION) {
        return None;
    }
    let failed = results.last()?;
    Some(
        json!({"success": false, "reason": KV_PRECONDITION, "error": KV_PRECONDITION,
                "failedIndex": results.len() - 1, "kvReason": failed["reason"],
                "value": failed.get("value").cloned().unwrap_or(Value::Null),
                "version": failed.get("version").cloned().unwrap_or(Value::Null)}),
    )
}

/// Flag 2's answer: the pushes' and acks' results counted, not listed.
fn counted_answer(id: &str, out: &TxOutcome, results: &[Value]) -> Value {
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
    answer
}
