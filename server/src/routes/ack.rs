//! Acks (one, or a batch) and lease extension.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::AckItem;
use queen_core::time::format_iso_micros;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, wire as requests, Failure, Reply};

async fn run_acks(
    broker: &Arc<Broker>,
    group: &str,
    items: Vec<AckItem>,
) -> Result<Reply, Failure> {
    let txids: Vec<String> = items.iter().map(|i| i.transaction_id.clone()).collect();
    let outcomes = broker.ack(group, items).await?;
    let answer: Vec<Value> = outcomes
        .iter()
        .zip(txids)
        .enumerate()
        .map(|(index, (o, tx))| {
            let mut item = json!({"index": index, "transactionId": tx, "success": o.success,
                                  "error": o.error, "queueName": o.queue,
                                  "partitionName": o.partition,
                                  "leaseReleased": o.lease_released, "dlq": o.dlq});
            // Only on a below-cursor ack: an ack that moved the cursor carries no flag.
            if o.noop {
                item["noop"] = json!(true);
            }
            item
        })
        .collect();
    Ok(http::json(StatusCode::OK, &Value::Array(answer)))
}

pub async fn ack(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let (group, item) = requests::ack(body)?;
    run_acks(broker, &group, vec![item]).await
}

pub async fn ack_batch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let request: requests::AckBatchBody = requests::body(body, None)?;
    let (group, items) = request.into_items()?;
    if items.is_empty() {
        return Ok(http::json(StatusCode::OK, &json!([])));
    }
    run_acks(broker, &group, items).await
}

pub async fn extend_lease(
    broker: &Arc<Broker>,
    lease_id: &str,
    body: &[u8],
) -> Result<Reply, Failure> {
    requests::check_name("leaseId", lease_id)?;
    let request: requests::ExtendBody = requests::body(body, Some("{}"))?;
    let out = broker.renew_lease(lease_id, request.seconds()?).await?;
    let expires = out.expires_at.map(format_iso_micros);
    let success = out.renewed > 0;
    Ok(http::json(
        StatusCode::OK,
        &json!([{"index": 0, "leaseId": lease_id, "success": success, "renewed": out.renewed,
                 "error": if success { Value::Null } else { json!("Lease not found or expired") },
                 "expiresAt": expires, "newExpiresAt": expires}]),
    ))
}
