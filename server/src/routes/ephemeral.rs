//! `/api/v1/ephemeral/*`: configure, reset, delete, push, pop, ack, queues, depth. The rules are
//! `queen_core::ephemeral`; the rings are this broker's memory (`crate::ephemeral`); storage keeps
//! only the declarations, so a restarted broker has every declared queue back, empty.

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use queen_core::ephemeral::{
    self, AckStatus, Delivery, EphemeralError, EphemeralOptions, ErrorKind, PopRequest,
    DEFAULT_PARTITION, MAX_BATCH, QUEUE_MODE,
};
use queen_core::Timestamp;
use serde_json::{json, value::RawValue, Value};
use tokio::sync::oneshot;

use crate::broker::Broker;
use crate::http::{self, Failure, Reply, Routed};

fn refused(e: EphemeralError) -> Failure {
    let status = match e.kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::Full => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Budget => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
    };
    Failure {
        status,
        code: Some(e.code),
        ..Failure::bad(e.message)
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::coded("ephemeral_invalid_request", message)
}

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("body is not JSON: {e}")))
}

fn queue_of(body: &Value) -> Result<String, Failure> {
    let queue = body["queue"]
        .as_str()
        .ok_or_else(|| invalid("queue (a string) is required"))?;
    ephemeral::check_name("queue", queue).map_err(refused)?;
    Ok(queue.to_string())
}

fn options_of(stored: Value) -> Result<EphemeralOptions, Failure> {
    EphemeralOptions::parse(&stored)
        .map_err(|e| Failure::server(format!("a stored ephemeral declaration: {}", e.message)))
}

/// Makes sure the queue is in this broker's memory: created with its declaration's options when
/// storage holds one, else with the defaults when `implicit` (push and pop create; depth does
/// not). Answers whether the queue exists now.
async fn load(broker: &Broker, queue: &str, implicit: bool) -> Result<bool, Failure> {
    if broker.ephemeral.exists(queue) {
        return Ok(true);
    }
    match broker.storage.ephemeral.ephemeral_config(queue).await? {
        Some(stored) => broker.ephemeral.ensure(queue, options_of(stored)?),
        None if implicit => broker.ephemeral.ensure(queue, EphemeralOptions::default()),
        None => return Ok(false),
    }
    Ok(true)
}

pub async fn configure(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let body = parse_body(body)?;
    let queue = queue_of(&body)?;
    let options = EphemeralOptions::parse(&body["options"]).map_err(refused)?;
    // Storage first: a declaration answered is a declaration kept.
    let resolved = options.to_json();
    broker
        .storage
        .ephemeral
        .save_ephemeral_config(&queue, &resolved)
        .await?;
    broker.ephemeral.with(|s| s.configure(&queue, options));
    Ok(http::json(
        StatusCode::OK,
        &json!({"configured": true, "queue": queue, "options": resolved}),
    ))
}

pub async fn reset(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let queue = queue_of(&parse_body(body)?)?;
    let dropped = broker.ephemeral.with(|s| s.reset(&queue));
    broker.ephemeral.wake(&queue);
    Ok(http::json(
        StatusCode::OK,
        &json!({"queue": queue, "dropped": dropped}),
    ))
}

pub async fn delete(broker: &Arc<Broker>, queue: &str) -> Result<Reply, Failure> {
    ephemeral::check_name("queue", queue).map_err(refused)?;
    let declared = broker
        .storage
        .ephemeral
        .remove_ephemeral_config(queue)
        .await?;
    let held = broker.ephemeral.with(|s| s.delete(queue));
    broker.ephemeral.wake(queue);
    broker.ephemeral.forget_wake(queue);
    Ok(http::json(
        StatusCode::OK,
        &json!({"queue": queue, "deleted": declared || held}),
    ))
}

/// The push body, with each payload kept as the JSON text it arrived as (never re-encoded).
#[derive(serde::Deserialize)]
struct PushBody<'a> {
    #[serde(borrow)]
    queue: Option<&'a str>,
    #[serde(borrow, default)]
    partition: Option<&'a str>,
    #[serde(borrow)]
    messages: Option<Vec<PushMessage<'a>>>,
}

#[derive(serde::Deserialize)]
struct PushMessage<'a> {
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

pub async fn push(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let parsed: PushBody<'_> =
        serde_json::from_slice(body).map_err(|e| invalid(format!("push body: {e}")))?;
    let queue = parsed
        .queue
        .ok_or_else(|| invalid("queue (a string) is required"))?;
    ephemeral::check_name("queue", queue).map_err(refused)?;
    let partition = parsed.partition.unwrap_or(DEFAULT_PARTITION);
    ephemeral::check_name("partition", partition).map_err(refused)?;
    let messages = parsed
        .messages
        .ok_or_else(|| invalid("messages (an array of {payload}) is required"))?;
    let payloads: Vec<Box<str>> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.payload
                .map(|p| Box::from(p.get()))
                .ok_or_else(|| invalid(format!("messages[{i}] has no payload")))
        })
        .collect::<Result<_, _>>()?;
    if payloads.is_empty() {
        return Ok(http::json(
            StatusCode::OK,
            &json!({"queue": queue, "partition": partition, "pushed": 0}),
        ));
    }
    load(broker, queue, true).await?;
    let now = broker.now();
    let pushed = broker
        .ephemeral
        .with(|s| s.push(queue, partition, payloads, now))
        .map_err(refused)?;
    broker.ephemeral.wake(queue);
    Ok(http::json(
        StatusCode::OK,
        &json!({"queue": queue, "partition": partition, "pushed": pushed}),
    ))
}

struct PopParams {
    queue: String,
    partition: Option<String>,
    group: String,
    batch: u32,
    auto_ack: bool,
    /// How long a waiting pop may park (None: answer at once).
    wait_ms: Option<u64>,
}

fn flag(v: &str) -> Result<bool, Failure> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(invalid(format!("{v:?} is not true or false"))),
    }
}

fn pop_params(broker: &Broker, query: Option<&str>) -> Result<PopParams, Failure> {
    let (mut queue, mut partition, mut group) = (None, None, None);
    let (mut batch, mut auto_ack, mut wait, mut timeout) = (1u32, false, false, None);
    for (k, v) in http::query_pairs(query)? {
        match k.as_str() {
            "queue" => queue = Some(v),
            "partition" => partition = Some(v),
            "group" | "consumerGroup" => group = Some(v),
            "batch" => {
                batch = v
                    .parse::<u32>()
                    .ok()
                    .filter(|b| (1..=MAX_BATCH).contains(b))
                    .ok_or_else(|| invalid(format!("batch is an integer in 1..={MAX_BATCH}")))?
            }
            "autoAck" | "auto_ack" => auto_ack = flag(&v)?,
            "wait" => wait = flag(&v)?,
            "timeout" => {
                timeout = Some(v.parse::<u64>().map_err(|_| {
                    invalid("timeout is a whole number of milliseconds".to_string())
                })?)
            }
            _ => {}
        }
    }
    let queue = queue.ok_or_else(|| invalid("queue is required"))?;
    ephemeral::check_name("queue", &queue).map_err(refused)?;
    if let Some(p) = &partition {
        ephemeral::check_name("partition", p).map_err(refused)?;
    }
    if let Some(g) = &group {
        ephemeral::check_name("group", g).map_err(refused)?;
    }
    let max_wait = broker.config.default_timeout_ms.max(30_000) * 10;
    Ok(PopParams {
        queue,
        partition,
        group: group.unwrap_or_else(|| QUEUE_MODE.to_string()),
        batch,
        auto_ack,
        wait_ms: wait.then(|| timeout.unwrap_or(30_000).min(max_wait)),
    })
}

fn pop_answer(queue: &str, got: &[Delivery]) -> Reply {
    // Payloads go out as the JSON text they were pushed as.
    let mut out = format!("{{\"queue\":{},\"messages\":[", json!(queue));
    for (i, m) in got.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{{\"id\":{},\"partition\":{},\"attempts\":{},\"payload\":{}}}",
            json!(m.id),
            json!(m.partition),
            m.attempts,
            m.payload
        ));
    }
    out.push_str("]}");
    http::json_bytes(StatusCode::OK, out.into_bytes())
}

pub async fn pop(broker: Arc<Broker>, query: Option<&str>) -> Result<Routed, Failure> {
    let params = pop_params(&broker, query)?;
    load(&broker, &params.queue, true).await?;
    if params.wait_ms.is_none() {
        let got = take(&broker, &params, broker.now()).map_err(refused)?;
        return Ok(Routed::Now(pop_answer(&params.queue, &got)));
    }
    let (tx, rx) = oneshot::channel();
    tokio::spawn(park(broker, params, tx));
    Ok(Routed::Later(rx))
}

fn take(broker: &Broker, p: &PopParams, now: Timestamp) -> Result<Vec<Delivery>, EphemeralError> {
    let req = PopRequest {
        partition: p.partition.as_deref(),
        group: &p.group,
        batch: p.batch,
        auto_ack: p.auto_ack,
    };
    broker.ephemeral.with(|s| {
        // A pop of a queue deleted meanwhile creates it again, as any pop does.
        s.ensure(&p.queue, EphemeralOptions::default);
        s.pop(&p.queue, &req, now)
    })
}

/// How long until `t` on the broker's clock.
fn until(broker: &Broker, t: Timestamp) -> Duration {
    Duration::from_micros(u64::try_from(t.0 - broker.now().0).unwrap_or(0))
}

/// A waiting pop: looks, and parks on the queue's wake until a push, an ack, a reset, the next
/// lease expiry or its timeout. With `windowBuffer`, a pop that finds fewer than `count`
/// messages waits up to `ms` from the first it saw for more.
async fn park(broker: Arc<Broker>, p: PopParams, mut tx: oneshot::Sender<Reply>) {
    let start = broker.now();
    let deadline = Timestamp(start.0 + p.wait_ms.unwrap_or(0) as i64 * 1000);
    let wake = broker.ephemeral.wake_of(&p.queue);
    let mut window_end: Option<Timestamp> = None;
    let mut shutdown = broker.shutting_down.subscribe();
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = broker.now();
        let (window, available, lease_end) = broker.ephemeral.with(|s| {
            s.ensure(&p.queue, EphemeralOptions::default);
            let window = s.options(&p.queue).and_then(|o| o.window_buffer);
            let available = s.available(&p.queue, p.partition.as_deref(), &p.group, now);
            (window, available, s.next_lease_end(&p.queue))
        });
        let fatten = match window {
            Some(w) if available > 0 && available < u64::from(w.count.min(p.batch)) => {
                let end = *window_end
                    .get_or_insert(Timestamp(now.0 + (w.ms as i64) * 1000).min(deadline));
                now < end
            }
            _ => false,
        };
        if !fatten && (available > 0 || now >= deadline) {
            let reply = match take(&broker, &p, now) {
                Ok(got) if got.is_empty() && now < deadline => None,
                Ok(got) => Some(pop_answer(&p.queue, &got)),
                Err(e) => Some(http::error(&refused(e))),
            };
            if let Some(reply) = reply {
                let _ = tx.send(reply);
                return;
            }
        }
        let mut wake_at = deadline;
        if let Some(t) = window_end.filter(|_| fatten) {
            wake_at = wake_at.min(t);
        }
        if let Some(t) = lease_end {
            wake_at = wake_at.min(t.max(now));
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep(until(&broker, wake_at)) => {}
            _ = tx.closed() => return,
            _ = shutdown.changed() => {
                let _ = tx.send(pop_answer(&p.queue, &[]));
                return;
            }
        }
    }
}

pub async fn ack(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let body = parse_body(body)?;
    let queue = queue_of(&body)?;
    let group = match &body["group"] {
        Value::Null => QUEUE_MODE.to_string(),
        Value::String(g) => {
            ephemeral::check_name("group", g).map_err(refused)?;
            g.clone()
        }
        _ => return Err(invalid("group must be a string")),
    };
    let entries = body["acks"]
        .as_array()
        .ok_or_else(|| invalid("acks (an array of {id, status?}) is required"))?;
    // Every entry is checked before any is applied: a bad one changes nothing.
    let acks: Vec<(&str, AckStatus)> = entries
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let id = a["id"]
                .as_str()
                .ok_or_else(|| invalid(format!("acks[{i}].id (a string) is required")))?;
            let status = AckStatus::parse(a["status"].as_str())
                .map_err(|e| invalid(format!("acks[{i}]: {}", e.message)))?;
            Ok((id, status))
        })
        .collect::<Result<_, Failure>>()?;
    let now = broker.now();
    let results: Vec<Value> = broker.ephemeral.with(|s| {
        acks.iter()
            .map(|(id, status)| {
                let outcome = s.ack(&queue, &group, id, *status, now);
                json!({"id": id, "outcome": outcome.as_str()})
            })
            .collect()
    });
    // An ack may end a partition's lease or return a message: parked pops look again.
    broker.ephemeral.wake(&queue);
    Ok(http::json(StatusCode::OK, &json!({"results": results})))
}

pub async fn queues(broker: &Arc<Broker>) -> Result<Reply, Failure> {
    // Declared queues this broker has not met since it started are listed too (empty).
    for (queue, stored) in broker.storage.ephemeral.ephemeral_configs().await? {
        if !broker.ephemeral.exists(&queue) {
            broker.ephemeral.ensure(&queue, options_of(stored)?);
        }
    }
    let queues = broker.ephemeral.with(|s| s.list());
    Ok(http::json(StatusCode::OK, &json!({"queues": queues})))
}

pub async fn depth(broker: &Arc<Broker>, queue: &str) -> Result<Reply, Failure> {
    ephemeral::check_name("queue", queue).map_err(refused)?;
    load(broker, queue, false).await?;
    let now = broker.now();
    match broker.ephemeral.with(|s| s.depth(queue, now)) {
        Some(d) => Ok(http::json(StatusCode::OK, &d)),
        None => Err(refused(ephemeral::not_found(queue))),
    }
}
