//! Traces: recording one, and reading them by message and by name.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::{TraceInput, TraceRecord};
use serde_json::{json, Value};

use super::{iso, not_found, ok, paging, Pairs};
use crate::broker::Broker;
use crate::http::wire as requests;
use crate::http::{self, Failure, Reply};
use crate::storage_reads;

/// POST /api/v1/traces: 201 with the trace's id; 404 when no such message is stored (a trace
/// is removed with its message, so one of nothing would never be).
pub async fn add_trace(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Failure::bad(format!("body must be a JSON object: {e}")))?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let tx = text("transactionId").ok_or_else(|| Failure::bad("transactionId is required"))?;
    let pid = text("partitionId").ok_or_else(|| Failure::bad("partitionId is required"))?;
    let data = v
        .get("data")
        .filter(|d| !d.is_null())
        .ok_or_else(|| Failure::bad("data is required"))?;
    requests::check_name("transactionId", &tx)?;
    let group = requests::consumer_group(text("consumerGroup"))?;
    let event_type = text("eventType").unwrap_or_else(|| "info".into());
    if event_type.is_empty() || event_type.len() > 64 {
        return Err(Failure::bad("eventType must be 1 to 64 bytes"));
    }
    let names: Vec<String> = match v.get("traceNames") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|n| {
                let n = n
                    .as_str()
                    .ok_or_else(|| Failure::bad("traceNames must be strings"))?;
                requests::check_name("traceNames", n)?;
                Ok(n.to_string())
            })
            .collect::<Result<_, Failure>>()?,
        Some(_) => return Err(Failure::bad("traceNames must be an array of strings")),
    };
    let worker_id = v.get("workerId").map(|w| match w {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    let id = broker
        .add_trace(TraceInput {
            partition_id: pid,
            transaction_id: tx,
            group,
            event_type,
            data: data.to_string(),
            worker_id,
            names,
        })
        .await?
        .ok_or_else(|| not_found("Message not found"))?;
    Ok(http::json(
        StatusCode::CREATED,
        &json!({"success": true, "traceId": id}),
    ))
}

fn trace_json(t: &TraceRecord, with_message: bool) -> Value {
    let mut v = json!({"id": t.id, "event_type": t.event_type,
        "data": serde_json::from_str::<Value>(&t.data).unwrap_or(Value::Null),
        "consumer_group": t.group, "worker_id": t.worker_id, "created_at": iso(t.created_at),
        "trace_names": t.names});
    if with_message {
        v["transaction_id"] = json!(t.transaction_id);
        v["partition_id"] = json!(t.partition_id);
        v["queue_name"] = json!(t.queue);
        v["partition_name"] = json!(t.partition);
    }
    v
}

/// GET /api/v1/traces/{pid}/{tx}: oldest first.
pub async fn traces_of(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    requests::check_name("transactionId", tx)?;
    let traces = storage_reads::traces_of(broker, pid, tx).await?;
    ok(&json!({"traces": traces.iter().map(|t| trace_json(t, false)).collect::<Vec<_>>()}))
}

/// GET /api/v1/traces/by-name/{name}?limit=100&offset=0: newest first, paged.
pub async fn traces_named(
    broker: &Arc<Broker>,
    name: &str,
    pairs: &Pairs,
) -> Result<Reply, Failure> {
    requests::check_name("traceName", name)?;
    let (limit, offset) = paging(pairs, 100)?;
    let (traces, total) = storage_reads::traces_named(broker, name, limit, offset).await?;
    ok(
        &json!({"traces": traces.iter().map(|t| trace_json(t, true)).collect::<Vec<_>>(),
               "total": total, "pagination": {"limit": limit, "offset": offset}}),
    )
}

/// GET /api/v1/traces/names?limit=50&offset=0: most recently seen first.
pub async fn trace_names(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 50)?;
    let (names, total) = storage_reads::trace_names(broker, limit, offset).await?;
    let rows: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({"trace_name": n.name, "trace_count": n.traces,
                        "message_count": n.messages, "last_seen": iso(n.last_seen)})
        })
        .collect();
    ok(&json!({"trace_names": rows, "total": total,
               "pagination": {"limit": limit, "offset": offset}}))
}
