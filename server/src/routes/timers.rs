//! Timers: `POST /api/v1/timers` (schedule, reschedule, cancel), `DELETE` and `GET
//! /api/v1/timers/{queue}/{timerKey}`, `GET /api/v1/timers/{queue}` (keyset pages). The rules are
//! `queen_core::timers`; the firing is `tasks::timers`.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::timers::{self, TimerOp};
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};
use crate::routes::kv::operations;
use crate::storage_reads;

/// Parses a call's (or a transaction rider's) ops, minting each schedule's message id.
pub(crate) fn parse_ops(broker: &Broker, raw: &[Value]) -> Result<Vec<TimerOp>, Failure> {
    timers::parse_ops(raw, broker.config.kv_limits.max_ops, || broker.mint_uuid())
        .map_err(|e| Failure::coded(e.code, e.message))
}

pub async fn batch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let raw = operations(body, "timers_invalid_operation")?;
    let ops = parse_ops(broker, &raw)?;
    if ops.is_empty() {
        return Ok(http::json(StatusCode::OK, &json!({"results": []})));
    }
    let results = broker.timers_batch(ops).await?;
    Ok(http::json(StatusCode::OK, &json!({"results": results})))
}

fn key(key: &str) -> Result<String, Failure> {
    timers::timer_key(Some(&json!(key))).map_err(|e| Failure::coded(e.code, e.message))
}

/// `DELETE /api/v1/timers/{queue}/{timerKey}[?txn=]`: the cancel route that is never blocked.
pub async fn cancel(
    broker: &Arc<Broker>,
    queue: &str,
    timer_key: &str,
    query: Option<&str>,
) -> Result<Reply, Failure> {
    let txn = http::query_pairs(query)?
        .into_iter()
        .find(|(k, _)| k == "txn")
        .map(|(_, v)| v);
    let op = TimerOp::Cancel {
        queue: queue.to_string(),
        key: key(timer_key)?,
        txn,
    };
    let result = broker
        .timers_batch(vec![op])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Failure::server("timers: no result for a cancel"))?;
    Ok(http::json(StatusCode::OK, &result))
}

/// `GET /api/v1/timers/{queue}/{timerKey}`: a miss is `{"found": false}` with 200.
pub async fn peek(broker: &Arc<Broker>, queue: &str, timer_key: &str) -> Result<Reply, Failure> {
    let k = key(timer_key)?;
    let row = storage_reads::timer_peek(broker, queue, &k).await?;
    Ok(http::json(
        StatusCode::OK,
        &timers::peek(queue, &k, row.as_ref()),
    ))
}

/// `GET /api/v1/timers/{queue}[?after&limit]`.
pub async fn list(
    broker: &Arc<Broker>,
    queue: &str,
    query: Option<&str>,
) -> Result<Reply, Failure> {
    let (mut after, mut limit) = (None, None);
    for (k, v) in http::query_pairs(query)? {
        match k.as_str() {
            "after" if !v.is_empty() => after = Some(v),
            "limit" => {
                limit = Some(v.parse::<i64>().map_err(|_| {
                    Failure::coded("timers_invalid_operation", "limit must be a whole number")
                })?)
            }
            _ => {}
        }
    }
    let limit = timers::list_limit(limit);
    let rows = storage_reads::timer_page(broker, queue, after, limit).await?;
    Ok(http::json(
        StatusCode::OK,
        &timers::page(queue, &rows, limit),
    ))
}
