//! The streams endpoints (`/streams/v1/*`) the streaming SDKs of Queen's clients commit through:
//! query registration, state reads, and the cycle (state ops, sink pushes and the source ack in
//! one transaction, fenced on the source lease). The rules are `queen_core::streams`; a cycle
//! runs through the broker's transaction path, so its pushes and ack wake consumers as any do.

use std::sync::Arc;

use hyper::StatusCode;
use queen_core::storage::{PushOutcome, TxOp, TxOpResult};
use queen_core::streams::{
    self, QueryRegistration, Registration, StateOp, StateQuery, StreamCycleOp, StreamLimits,
    StreamRefusal,
};
use queen_core::time::format_iso_micros;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, wire as requests, Failure, Reply};
use crate::routes::push::group_items;
use crate::storage_reads;

/// A refusal in the SDKs' shape (`success: false`), with a real status and a code.
fn refused(status: StatusCode, code: &str, error: impl Into<String>) -> Reply {
    http::json(
        status,
        &json!({"success": false, "error": error.into(), "code": code}),
    )
}

/// Bad input, found before anything is asked of storage: answered 400, nothing changed.
struct Invalid(String);

impl Invalid {
    fn reply(self) -> Reply {
        refused(StatusCode::BAD_REQUEST, "streams_invalid", self.0)
    }
}

fn invalid(error: impl Into<String>) -> Invalid {
    Invalid(error.into())
}

fn text_field(what: &str, value: &str, max: usize) -> Result<(), Invalid> {
    streams::check_text(what, value, max).map_err(invalid)
}

fn uuid_field(what: &str, value: &str) -> Result<uuid::Uuid, Invalid> {
    uuid::Uuid::parse_str(value)
        .map_err(|_| invalid(format!("{what} must be a UUID, got {value:?}")))
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Invalid> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("invalid request body: {e}")))
}

#[derive(Deserialize)]
struct RegisterBody {
    name: String,
    source_queue: String,
    #[serde(default)]
    sink_queue: Option<String>,
    config_hash: String,
    #[serde(default)]
    reset: bool,
}

/// `POST /streams/v1/queries`.
pub async fn register(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let req = match registration(body) {
        Ok(r) => r,
        Err(bad) => return Ok(bad.reply()),
    };
    let answer = broker.register_stream_query(&req).await?;
    Ok(match answer {
        Registration::Registered {
            query_id,
            fresh,
            reset,
        } => http::json(
            StatusCode::OK,
            &json!({"success": true, "query_id": query_id.to_string(), "name": req.name,
                    "config_hash": req.config_hash, "fresh": fresh, "reset": reset}),
        ),
        Registration::HashMismatch { stored_hash } => refused(
            StatusCode::CONFLICT,
            "streams_config_hash_mismatch",
            format!(
                "config_hash mismatch: query {:?} is registered with config_hash \
                 {stored_hash:?}, not {:?}; register with reset: true to drop its state and \
                 store the new hash",
                req.name, req.config_hash
            ),
        ),
    })
}

fn registration(body: &[u8]) -> Result<QueryRegistration, Invalid> {
    let b: RegisterBody = parse(body)?;
    let limits = StreamLimits::default();
    text_field("name", &b.name, limits.max_name_bytes)?;
    text_field("config_hash", &b.config_hash, limits.max_hash_bytes)?;
    requests::check_name("source_queue", &b.source_queue).map_err(|f| invalid(f.message))?;
    let sink_queue = b.sink_queue.filter(|s| !s.is_empty());
    if let Some(sink) = &sink_queue {
        requests::check_name("sink_queue", sink).map_err(|f| invalid(f.message))?;
    }
    Ok(QueryRegistration {
        name: b.name,
        source_queue: b.source_queue,
        sink_queue,
        config_hash: b.config_hash,
        reset: b.reset,
    })
}

#[derive(Deserialize)]
struct StateBody {
    query_id: String,
    partition_id: String,
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    key_prefix: Option<String>,
    #[serde(default)]
    ripe_at_or_before: Option<i64>,
}

/// `POST /streams/v1/state/get`.
pub async fn state(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let query = match state_query(body) {
        Ok(q) => q,
        Err(bad) => return Ok(bad.reply()),
    };
    let Some(rows) = storage_reads::stream_state(broker, &query).await? else {
        return Ok(refused(
            StatusCode::NOT_FOUND,
            "streams_query_not_found",
            StreamRefusal::UnknownQuery.message(),
        ));
    };
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|r| json!({"key": r.key, "value": r.value, "updated_at": format_iso_micros(r.updated_at)}))
        .collect();
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "rows": rows}),
    ))
}

fn state_query(body: &[u8]) -> Result<StateQuery, Invalid> {
    let b: StateBody = parse(body)?;
    let limits = StreamLimits::default();
    let query_id = uuid_field("query_id", &b.query_id)?;
    uuid_field("partition_id", &b.partition_id)?;
    if b.keys.len() > limits.max_keys {
        return Err(invalid(format!(
            "keys: at most {} per read, got {}",
            limits.max_keys,
            b.keys.len()
        )));
    }
    for (i, k) in b.keys.iter().enumerate() {
        text_field(&format!("keys[{i}]"), k, limits.max_key_bytes)?;
    }
    let key_prefix = b.key_prefix.filter(|p| !p.is_empty());
    if let Some(p) = &key_prefix {
        text_field("key_prefix", p, limits.max_key_bytes)?;
    }
    Ok(StateQuery {
        query_id,
        partition_id: b.partition_id,
        keys: b.keys,
        key_prefix,
        ripe_at_or_before: b.ripe_at_or_before,
    })
}

#[derive(Deserialize)]
struct CycleBody {
    query_id: String,
    partition_id: String,
    #[serde(default)]
    consumer_group: Option<String>,
    #[serde(default)]
    state_ops: Vec<Value>,
    #[serde(default)]
    push_items: Vec<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    ack: Option<Value>,
    #[serde(default)]
    release_lease: Option<bool>,
}

/// A cycle's storage operations: the fence and state ops first, then the sink pushes, then the
/// source ack; and each push's (queue, transactionId) in the order storage answers them.
struct Cycle {
    ops: Vec<TxOp>,
    pushed: Vec<(String, String)>,
    query_id: uuid::Uuid,
    partition_id: String,
}

/// `POST /streams/v1/cycle`: everything commits, or nothing does.
pub async fn cycle(
    broker: &Arc<Broker>,
    body: &[u8],
    producer: Option<&str>,
) -> Result<Reply, Failure> {
    let cycle = match parse_cycle(broker, body) {
        Ok(c) => c,
        Err(bad) => return Ok(bad.reply()),
    };
    let out = broker.transaction(cycle.ops, producer).await?;
    let mut applied = 0;
    let mut push_results = vec![];
    let mut ack_result = Value::Null;
    for result in &out.results {
        match result {
            TxOpResult::Stream(Ok(n)) => applied = *n,
            TxOpResult::Stream(Err(StreamRefusal::UnknownQuery)) => {
                return Ok(refused(
                    StatusCode::NOT_FOUND,
                    "streams_query_not_found",
                    StreamRefusal::UnknownQuery.message(),
                ))
            }
            TxOpResult::Stream(Err(StreamRefusal::ForeignPartition)) => {
                return Ok(invalid(StreamRefusal::ForeignPartition.message()).reply())
            }
            TxOpResult::Stream(Err(r)) if r.is_state_conflict() => {
                return Ok(refused(
                    StatusCode::CONFLICT,
                    "streams_state_changed",
                    r.message(),
                ))
            }
            TxOpResult::Stream(Err(StreamRefusal::LeaseLost)) => {}
            TxOpResult::Push(groups) => {
                for (outcome, (queue, txid)) in groups.iter().flatten().zip(&cycle.pushed) {
                    push_results.push(push_result(outcome, queue, txid));
                }
            }
            // The ack, then (with release_lease) the lease's end: released by either.
            TxOpResult::Ack(a) if ack_result.is_null() => {
                ack_result = json!({"success": a.success, "lease_released": a.lease_released,
                                    "dlq": a.dlq, "error": a.error});
            }
            TxOpResult::Ack(ended) => {
                if ended.lease_released {
                    ack_result["lease_released"] = json!(true);
                }
            }
            other => {
                return Err(Failure::server(format!(
                    "streams cycle: unexpected result {other:?}"
                )))
            }
        }
    }
    if !out.committed {
        return Ok(http::json(
            StatusCode::OK,
            &json!({"success": false, "query_id": cycle.query_id.to_string(), "partition_id": cycle.partition_id,
                    "error": out.error.unwrap_or_else(|| "cycle refused".into()),
                    "push_results": push_results, "ack_result": ack_result}),
        ));
    }
    Ok(http::json(
        StatusCode::OK,
        &json!({"success": true, "query_id": cycle.query_id.to_string(), "partition_id": cycle.partition_id,
                "state_ops_applied": applied, "push_results": push_results,
                "ack_result": ack_result}),
    ))
}

fn parse_cycle(broker: &Broker, body: &[u8]) -> Result<Cycle, Invalid> {
    let b: CycleBody = parse(body)?;
    let limits = StreamLimits::default();
    let query_id = uuid_field("query_id", &b.query_id)?;
    uuid_field("partition_id", &b.partition_id)?;
    let group = requests::consumer_group(b.consumer_group).map_err(|f| invalid(f.message))?;
    if b.state_ops.len() > limits.max_state_ops {
        return Err(invalid(format!(
            "state_ops: at most {} per cycle, got {}",
            limits.max_state_ops,
            b.state_ops.len()
        )));
    }
    let state_ops = b
        .state_ops
        .iter()
        .enumerate()
        .map(|(i, raw)| state_op(raw, i, &limits))
        .collect::<Result<Vec<_>, _>>()?;
    let items = requests::push_items(&b.push_items, "push_items", || broker.mint_uuid())
        .map_err(|f| invalid(f.message))?;
    let ack = match b.ack {
        None | Some(Value::Null) => None,
        Some(Value::Object(mut fields)) => {
            // `count` says how many of the batch's messages the cycle acks: the ack commits
            // through its transactionId, which says the same.
            if let Some(count) = fields.remove("count") {
                if !count.is_null() && count.as_u64().is_none() {
                    return Err(invalid("ack.count must be a non-negative integer"));
                }
            }
            fields.insert("partitionId".into(), json!(b.partition_id));
            let parsed: requests::AckFields = serde_json::from_value(Value::Object(fields))
                .map_err(|e| invalid(format!("ack: {e}")))?;
            let item = parsed
                .into_item()
                .map_err(|f| invalid(format!("ack: {}", f.message)))?;
            if item.lease_id.is_none() {
                return Err(invalid(
                    "ack.leaseId is required: a cycle is fenced on the source lease",
                ));
            }
            Some(item)
        }
        Some(_) => return Err(invalid("ack must be an object or null")),
    };
    if b.release_lease == Some(false) && ack.is_none() {
        return Err(invalid(
            "release_lease: false keeps a lease, so it needs an ack",
        ));
    }
    let mut ops = vec![TxOp::Stream(StreamCycleOp {
        query_id,
        partition_id: b.partition_id.clone(),
        group: group.clone(),
        lease_id: ack.as_ref().and_then(|a| a.lease_id.clone()),
        ops: state_ops,
    })];
    let mut pushed = vec![];
    if !items.is_empty() {
        let groups = group_items(items).0;
        pushed = groups
            .iter()
            .flat_map(|g| {
                g.frames
                    .iter()
                    .map(|f| (g.queue.clone(), f.transaction_id.clone()))
            })
            .collect();
        ops.push(TxOp::Push(groups));
    }
    if let Some(item) = ack {
        let lease_id = item.lease_id.clone();
        let partition_id = item.partition_id.clone();
        ops.push(TxOp::Ack {
            group: group.clone(),
            item,
        });
        // The cycle owns the whole batch: an ack short of its end still ends the lease, so the
        // rest comes back at once (an ack at the end already ended it).
        if let (true, Some(lease_id)) = (b.release_lease.unwrap_or(true), lease_id) {
            ops.push(TxOp::EndLease {
                group,
                partition_id,
                lease_id,
            });
        }
    }
    Ok(Cycle {
        ops,
        pushed,
        query_id,
        partition_id: b.partition_id,
    })
}

/// One sink push's result, as the push route names its fields.
fn push_result(outcome: &PushOutcome, queue: &str, txid: &str) -> Value {
    let (status, message_id, partition_id, error) = super::push::outcome_fields(outcome);
    json!({"status": status, "messageId": message_id.map(|m| m.to_string()), "partitionId": partition_id,
           "queueName": queue, "transactionId": txid, "error": error})
}

fn state_op(raw: &Value, i: usize, limits: &StreamLimits) -> Result<StateOp, Invalid> {
    let place = format!("state_ops[{i}]");
    let kind = raw.get("type").and_then(Value::as_str);
    let key = raw
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{place}.key must be a string")))?;
    text_field(&format!("{place}.key"), key, limits.max_key_bytes)?;
    match kind {
        Some("upsert") => {
            let value = raw.get("value").cloned().unwrap_or(Value::Null);
            let size = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
            if size > limits.max_value_bytes {
                return Err(invalid(format!(
                    "{place}.value is larger than {} bytes",
                    limits.max_value_bytes
                )));
            }
            Ok(StateOp::Upsert {
                key: key.to_string(),
                value,
            })
        }
        Some("delete") => Ok(StateOp::Delete {
            key: key.to_string(),
        }),
        _ => Err(invalid(format!(
            "{place}.type must be \"upsert\" or \"delete\""
        ))),
    }
}
