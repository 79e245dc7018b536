//! Push, ack, lease, configure, delete, maintenance, health and metrics endpoints.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper::StatusCode;
use queen_core::events::DeliveryEvent;
use queen_core::frames::Frame;
use queen_core::storage::{AckItem, AckStatus, PushGroup, PushOutcome, QueueConfig};
use queen_core::time::format_iso_micros;
use queen_core::types::{
    namespace_and_task, validate_name, DEFAULT_PARTITION, MAX_NAME_BYTES, QUEUE_MODE_GROUP,
};
use serde_json::{json, Value};

use crate::app::{lock, App, Backend};
use crate::http::{self, str_field, Failure, Reply};
use crate::metrics::Snapshot;

fn name_check(what: &'static str, v: &str) -> Result<(), Failure> {
    validate_name(what, v).map_err(|e| Failure::bad(e.to_string()))
}

/// One push item after validation.
pub(crate) struct Item {
    pub(crate) queue: String,
    pub(crate) partition: String,
    pub(crate) frame: Frame,
}

pub(crate) fn parse_item(i: usize, v: &Value, app: &App) -> Result<Item, Failure> {
    let obj = v
        .as_object()
        .ok_or_else(|| Failure::bad(format!("items[{i}] must be an object")))?;
    let queue = match obj.get("queue") {
        Some(Value::String(q)) => q.clone(),
        None | Some(Value::Null) => {
            return Err(Failure::bad(format!("items[{i}]: queue is required")))
        }
        Some(_) => return Err(Failure::bad("Queue must be a string")),
    };
    name_check("queue", &queue)?;
    let partition = str_field(v, "partition", "Partition")?
        .unwrap_or(DEFAULT_PARTITION)
        .to_string();
    name_check("partition", &partition)?;
    let transaction_id = str_field(v, "transactionId", "TransactionId")?
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    if transaction_id
        .as_ref()
        .is_some_and(|t| t.len() > MAX_NAME_BYTES)
    {
        return Err(Failure::bad(format!(
            "items[{i}]: transactionId is longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    let trace_id = match str_field(v, "traceId", "TraceId")? {
        None | Some("") => None,
        Some(t) => Some(
            uuid::Uuid::parse_str(t)
                .map_err(|_| Failure::bad(format!("items[{i}]: traceId must be a UUID")))?,
        ),
    };
    // The payload is `data` if present, else `payload`, else the whole item (key presence counts).
    let payload = obj.get("data").or_else(|| obj.get("payload")).unwrap_or(v);
    let payload = serde_json::to_vec(payload)
        .map_err(|e| Failure::bad(format!("items[{i}]: payload: {e}")))?;
    let message_id = app.mint_uuid();
    Ok(Item {
        queue,
        partition,
        frame: Frame {
            message_id,
            transaction_id: transaction_id.unwrap_or_else(|| message_id.to_string()),
            trace_id,
            payload,
        },
    })
}

/// Items grouped by (queue, partition) in first-appearance order, remembering each item's slot.
pub(crate) fn group_items(items: Vec<Item>) -> (Vec<PushGroup>, Vec<(usize, usize)>) {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut groups: Vec<PushGroup> = vec![];
    let mut slots = Vec::with_capacity(items.len());
    for it in items {
        let key = (it.queue.clone(), it.partition.clone());
        let g = *index.entry(key).or_insert_with(|| {
            groups.push(PushGroup {
                queue: it.queue.clone(),
                partition: it.partition.clone(),
                frames: vec![],
            });
            groups.len() - 1
        });
        slots.push((g, groups[g].frames.len()));
        groups[g].frames.push(it.frame);
    }
    (groups, slots)
}

/// A push group's queue, partition and (transactionId, traceId) per frame.
type GroupHead = (String, String, Vec<(String, Option<uuid::Uuid>)>);

pub async fn push(app: &Arc<App>, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let items = v
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::bad("items array is required"))?;
    if items.is_empty() {
        return Ok(http::json(StatusCode::CREATED, &json!([])));
    }
    let parsed: Vec<Item> = items
        .iter()
        .enumerate()
        .map(|(i, it)| parse_item(i, it, app))
        .collect::<Result<_, _>>()?;
    let (groups, slots) = group_items(parsed);
    // What the answer and the ring need, kept aside so the payloads move into storage uncopied:
    // per group (queue, partition, (transactionId, traceId) per frame).
    let heads: Vec<GroupHead> = groups
        .iter()
        .map(|g| {
            (
                g.queue.clone(),
                g.partition.clone(),
                g.frames
                    .iter()
                    .map(|f| (f.transaction_id.clone(), f.trace_id))
                    .collect(),
            )
        })
        .collect();
    let outcomes = app.storage.push(groups).await?;
    app.metrics.pushes.fetch_add(1, Ordering::Relaxed);
    app.publish_pushes(
        heads.iter().map(|(q, p, _)| (q.as_str(), p.as_str())),
        &outcomes,
    );
    let mut answer = Vec::with_capacity(slots.len());
    for (index, (g, k)) in slots.iter().enumerate() {
        let (queue, _, frames) = &heads[*g];
        let (tx, trace_id) = &frames[*k];
        let o = outcomes
            .get(*g)
            .and_then(|o| o.get(*k))
            .ok_or_else(|| Failure::server("push outcome missing"))?;
        answer.push(match o {
            PushOutcome::Queued { message_id, partition_id, .. } => {
                app.metrics.messages_pushed.fetch_add(1, Ordering::Relaxed);
                json!({"index": index, "transaction_id": tx, "transactionId": tx, "status": "queued",
                       "message_id": message_id.to_string(), "messageId": message_id.to_string(),
                       "partition_id": partition_id, "partitionId": partition_id,
                       "trace_id": trace_id.map(|t| t.to_string()), "queueName": queue})
            }
            PushOutcome::Duplicate { message_id, partition_id } => {
                app.metrics.duplicates.fetch_add(1, Ordering::Relaxed);
                json!({"index": index, "transaction_id": tx, "transactionId": tx, "status": "duplicate",
                       "message_id": message_id.to_string(), "messageId": message_id.to_string(),
                       "partition_id": partition_id, "partitionId": partition_id, "queueName": queue})
            }
            PushOutcome::Rejected { partition_id, full, .. } => {
                json!({"index": index, "transaction_id": tx, "transactionId": tx, "status": "failed",
                       "error": full.to_string(), "message_id": null, "messageId": null,
                       "partition_id": partition_id, "partitionId": partition_id, "queueName": queue})
            }
        });
    }
    Ok(http::json(StatusCode::CREATED, &Value::Array(answer)))
}

pub(crate) fn parse_ack_fields(v: &Value, i: usize) -> Result<AckItem, Failure> {
    if !v.is_object() {
        return Err(Failure::bad(format!(
            "acknowledgments[{i}] must be an object"
        )));
    }
    let transaction_id = str_field(v, "transactionId", "transactionId")?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Failure::bad("Each acknowledgment must have a valid transactionId string"))?
        .to_string();
    let partition_id = str_field(v, "partitionId", "partitionId")?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Failure::bad("partitionId is required to ensure message uniqueness"))?
        .to_string();
    let status = match str_field(v, "status", "status")? {
        None => AckStatus::Completed,
        Some(s) => AckStatus::parse(s).ok_or_else(|| {
            Failure::bad(format!(
                "status must be one of completed, success, failed, retry, dlq; got {s:?}"
            ))
        })?,
    };
    let lease_id = str_field(v, "leaseId", "leaseId")?
        .filter(|l| !l.is_empty())
        .map(str::to_string);
    let error = match v.get("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    Ok(AckItem {
        transaction_id,
        partition_id,
        status,
        lease_id,
        error,
    })
}

fn group_of(v: &Value) -> Result<String, Failure> {
    let g = str_field(v, "consumerGroup", "consumerGroup")?
        .filter(|g| !g.is_empty())
        .unwrap_or(QUEUE_MODE_GROUP);
    name_check("consumerGroup", g)?;
    Ok(g.to_string())
}

async fn run_acks(app: &Arc<App>, group: &str, items: Vec<AckItem>) -> Result<Reply, Failure> {
    let txids: Vec<String> = items.iter().map(|i| i.transaction_id.clone()).collect();
    let outcomes = app.storage.ack(group, items).await?;
    let mut answer = Vec::with_capacity(outcomes.len());
    for (index, (o, tx)) in outcomes.iter().zip(txids).enumerate() {
        app.metrics.acks.fetch_add(1, Ordering::Relaxed);
        if !o.success {
            app.metrics.acks_refused.fetch_add(1, Ordering::Relaxed);
        }
        answer.push(
            json!({"index": index, "transactionId": tx, "success": o.success, "error": o.error,
                           "queueName": o.queue, "partitionName": o.partition,
                           "leaseReleased": o.lease_released, "dlq": o.dlq}),
        );
    }
    app.publish_acks(outcomes.iter().map(|o| (group, o)));
    Ok(http::json(StatusCode::OK, &Value::Array(answer)))
}

pub async fn ack(app: &Arc<App>, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    if !v.is_object() {
        return Err(Failure::bad("the ack body must be an object"));
    }
    if str_field(&v, "transactionId", "transactionId")?.is_none_or(str::is_empty) {
        return Err(Failure::bad("transactionId is required"));
    }
    let item = parse_ack_fields(&v, 0)?;
    run_acks(app, &group_of(&v)?, vec![item]).await
}

pub async fn ack_batch(app: &Arc<App>, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let list = v
        .get("acknowledgments")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::bad("acknowledgments array is required"))?;
    let items = list
        .iter()
        .enumerate()
        .map(|(i, it)| parse_ack_fields(it, i))
        .collect::<Result<Vec<_>, _>>()?;
    if items.is_empty() {
        return Ok(http::json(StatusCode::OK, &json!([])));
    }
    run_acks(app, &group_of(&v)?, items).await
}

pub async fn extend_lease(app: &Arc<App>, lease_id: &str, body: &[u8]) -> Result<Reply, Failure> {
    // An empty body means {} (client 2.6.0 sends none): 60 seconds.
    let v = http::parse_json(body, Some(json!({})))?;
    let seconds = match v.get("seconds") {
        None | Some(Value::Null) => 60,
        Some(s) => s
            .as_u64()
            .filter(|s| (1..=7 * 24 * 3600).contains(s))
            .ok_or_else(|| Failure::bad("seconds must be a whole number from 1 to 604800"))?,
    };
    let out = app.storage.renew_lease(lease_id, seconds as u32).await?;
    let expires = out.expires_at.map(format_iso_micros);
    let success = out.renewed > 0;
    Ok(http::json(
        StatusCode::OK,
        &json!([{"index": 0, "leaseId": lease_id, "success": success, "renewed": out.renewed,
                 "error": if success { Value::Null } else { json!("Lease not found or expired") },
                 "expiresAt": expires, "newExpiresAt": expires}]),
    ))
}

fn opt_u32(o: &serde_json::Map<String, Value>, key: &str, default: u32) -> Result<u32, Failure> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                Failure::bad(format!("options.{key} must be a non-negative whole number"))
            }),
    }
}

fn opt_bool(o: &serde_json::Map<String, Value>, key: &str, default: bool) -> Result<bool, Failure> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Failure::bad(format!("options.{key} must be true or false"))),
    }
}

fn options_json(c: &QueueConfig) -> Value {
    json!({"priority": c.priority, "leaseTime": c.lease_time, "retryLimit": c.retry_limit, "retryDelay": c.retry_delay,
           "maxSize": c.max_size, "ttl": c.ttl, "deadLetterQueue": c.dead_letter_queue,
           "dlqAfterMaxRetries": c.dlq_after_max_retries, "delayedProcessing": c.delayed_processing,
           "windowBuffer": c.window_buffer, "retentionSeconds": c.retention_seconds,
           "completedRetentionSeconds": c.completed_retention_seconds, "retentionEnabled": c.retention_enabled,
           "encryptionEnabled": c.encryption_enabled, "maxWaitTimeSeconds": c.max_wait_time_seconds})
}

pub async fn configure(app: &Arc<App>, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let queue = str_field(&v, "queue", "queue")?
        .filter(|q| !q.is_empty())
        .ok_or_else(|| Failure::bad("queue is required"))?
        .to_string();
    name_check("queue", &queue)?;
    let empty = serde_json::Map::new();
    let o = match v.get("options") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(Failure::bad("options must be an object")),
    };
    // Reconfiguring overwrites every option: absent ones go back to the defaults.
    let d = QueueConfig::with_defaults(&queue);
    let (derived_ns, derived_task) = namespace_and_task(&queue);
    let namespace = str_field(&v, "namespace", "namespace")?.map_or(derived_ns, str::to_string);
    let task = str_field(&v, "task", "task")?.map_or(derived_task, str::to_string);
    let priority = match o.get("priority") {
        None | Some(Value::Null) => 0,
        Some(p) => p
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| Failure::bad("options.priority must be a whole number"))?,
    };
    let config = QueueConfig {
        name: queue.clone(),
        namespace,
        task,
        lease_time: opt_u32(o, "leaseTime", d.lease_time)?,
        retry_limit: opt_u32(o, "retryLimit", d.retry_limit)?,
        retry_delay: opt_u32(o, "retryDelay", d.retry_delay)?,
        priority,
        delayed_processing: opt_u32(o, "delayedProcessing", d.delayed_processing)?,
        window_buffer: opt_u32(o, "windowBuffer", d.window_buffer)?,
        max_size: opt_u32(o, "maxSize", d.max_size)?,
        ttl: opt_u32(o, "ttl", d.ttl)?,
        retention_enabled: opt_bool(o, "retentionEnabled", d.retention_enabled)?,
        retention_seconds: opt_u32(o, "retentionSeconds", d.retention_seconds)?,
        completed_retention_seconds: opt_u32(
            o,
            "completedRetentionSeconds",
            d.completed_retention_seconds,
        )?,
        encryption_enabled: opt_bool(o, "encryptionEnabled", d.encryption_enabled)?,
        dead_letter_queue: opt_bool(o, "deadLetterQueue", d.dead_letter_queue)?,
        dlq_after_max_retries: opt_bool(o, "dlqAfterMaxRetries", d.dlq_after_max_retries)?,
        max_wait_time_seconds: opt_u32(o, "maxWaitTimeSeconds", d.max_wait_time_seconds)?,
        min_pop_wait_time: opt_u32(o, "minPopWaitTime", d.min_pop_wait_time)?,
    };
    let (queue_id, partition_id) = app.storage.configure_queue(config.clone()).await?;
    if config.min_pop_wait_time > 0 {
        lock(&app.pop_ctx).rings.min_pop_wait_in_use = true;
    }
    // The scheduler's cached options and beliefs about the queue are stale now.
    app.publish(&DeliveryEvent::QueueChanged {
        queue: queue.clone(),
    });
    Ok(http::json(
        StatusCode::OK,
        &json!({"configured": true, "queueId": queue_id, "partitionId": partition_id, "queue": queue,
                "namespace": config.namespace, "task": config.task, "options": options_json(&config)}),
    ))
}

pub async fn delete_queue(app: &Arc<App>, queue: &str) -> Result<Reply, Failure> {
    name_check("queue", queue)?;
    let existed = app.storage.delete_queue(queue).await?;
    app.publish(&DeliveryEvent::QueueChanged {
        queue: queue.to_string(),
    });
    Ok(http::json(
        StatusCode::OK,
        &json!({"deleted": true, "queue": queue, "existed": existed}),
    ))
}

pub fn pop_maintenance_state(app: &App) -> Reply {
    let on = lock(&app.pop_ctx).pop_maintenance;
    http::json(
        StatusCode::OK,
        &json!({"popMaintenanceMode": on, "message": if on { "pop maintenance is on: pops answer empty" } else { "pop maintenance is off" }}),
    )
}

pub fn set_pop_maintenance(app: &App, body: &[u8]) -> Result<Reply, Failure> {
    let v = http::parse_json(body, None)?;
    let on = v
        .get("enabled")
        .and_then(Value::as_bool)
        .ok_or_else(|| Failure::bad("enabled must be a boolean"))?;
    lock(&app.pop_ctx).pop_maintenance = on;
    Ok(pop_maintenance_state(app))
}

pub async fn health(app: &App) -> Reply {
    let (database, ok) = match &app.backend {
        Backend::Memory => ("in-memory", true),
        Backend::Postgres(pg) => match pg.pool().get().await {
            Ok(client) => match client.simple_query("SELECT 1").await {
                Ok(_) => ("connected", true),
                Err(_) => ("unreachable", false),
            },
            Err(_) => ("unreachable", false),
        },
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    http::json(
        status,
        &json!({"status": if ok { "healthy" } else { "unhealthy" }, "database": database, "version": env!("CARGO_PKG_VERSION")}),
    )
}

pub fn metrics_snapshot(app: &App) -> Snapshot<'_> {
    let (limit, in_flight) = app.limiter.state();
    let (pool_in_use, pool_size, backend) = match &app.backend {
        Backend::Memory => (0, 0, "memory"),
        Backend::Postgres(pg) => {
            let (u, s) = pg.pool_usage();
            (u, s, "postgres")
        }
    };
    Snapshot {
        metrics: &app.metrics,
        limiter_limit: limit,
        limiter_in_flight: in_flight,
        pool_in_use,
        pool_size,
        backend,
    }
}
