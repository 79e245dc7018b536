//! `POST /api/v1/locks`: acquire, renew, release and get, one result per op. Each op is its own
//! transaction (they are independent, never all-or-nothing). The rules are `queen_core::locks`.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::locks;
use serde_json::json;

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};
use crate::routes::kv::operations;

pub async fn batch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let raw = operations(body, "locks_invalid_operation")?;
    let max = broker.config.kv_limits.max_ops;
    if raw.len() > max {
        return Err(Failure::coded(
            "locks_too_many_operations",
            format!("{} operations in one call; the limit is {max}", raw.len()),
        ));
    }
    let ops = raw
        .iter()
        .enumerate()
        .map(|(i, op)| {
            locks::parse_op(op).map_err(|e| {
                Failure::coded("locks_invalid_operation", format!("operations[{i}]: {e}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(broker.lock_op(op).await?);
    }
    Ok(http::json(StatusCode::OK, &json!({"results": results})))
}
