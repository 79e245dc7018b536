//! `/api/v1/ephemeral/*`: configure, reset, delete, push, pop, ack, queues, depth. The rules are
//! `queen_core::ephemeral`; the rings are the owning broker's memory (`crate::ephemeral`), and a
//! call that reaches another broker is forwarded whole to the owner; storage keeps only the
//! declarations, so a restarted deployment has every declared queue back, empty.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, StatusCode};
use queen_core::ephemeral::{
    self, AckStatus, Delivery, EphemeralError, EphemeralOptions, ErrorKind, PopRequest,
    DEFAULT_PARTITION, MAX_BATCH, QUEUE_MODE,
};
use queen_core::Timestamp;
use serde_json::{json, value::RawValue, Value};
use tokio::sync::oneshot;

use crate::broker::Broker;
use crate::ephemeral::Owner;
use crate::http::{self, Failure, Reply, Routed};
use crate::storage_reads;
use crate::tasks::ephemeral_liveness::{beat, claim};

/// Marks a call one broker forwarded to another: the receiver serves it or refuses it, never
/// forwards it again.
const FORWARDED: &str = "x-queen-forwarded";
/// The refusal of a broker that no longer owns the queue it was forwarded a call for.
const OWNER_MOVED: &str = "ephemeral_owner_moved";

/// An ephemeral call as it arrived, kept to forward whole to its queue's owner.
pub struct Call {
    pub method: Method,
    /// Path and query.
    pub target: String,
    pub authorization: Option<HeaderValue>,
    pub forwarded: bool,
    pub body: Bytes,
}

impl Call {
    pub fn of<B>(req: &hyper::Request<B>) -> Call {
        Call {
            method: req.method().clone(),
            target: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string()),
            authorization: req.headers().get(AUTHORIZATION).cloned(),
            forwarded: req.headers().contains_key(FORWARDED),
            body: Bytes::new(),
        }
    }
}

/// Which broker holds `queue`'s ring: this one, or (claimed through storage) another. A broker
/// that cannot renew its liveness serves nothing; to a call another broker forwarded it says
/// so as a queue that moved, so that broker resolves the owner again instead of forwarding here
/// for as long as this one is cut off, past the time its queues may be taken over.
async fn owner_of(broker: &Broker, queue: &str, forwarded: bool) -> Result<Owner, Failure> {
    if broker.ephemeral.address().is_none() {
        return Ok(Owner::Local);
    }
    let serving = broker.ephemeral.serving(broker.now())
        || (beat(broker).await && broker.ephemeral.serving(broker.now()));
    if !serving {
        return Err(Failure {
            code: forwarded.then_some(OWNER_MOVED),
            ..Failure::unavailable(
                "ephemeral: this broker cannot renew its liveness in storage, so it serves no ephemeral queue until it does",
            )
        });
    }
    if let Some(owner) = broker.ephemeral.cached_owner(queue) {
        return Ok(owner);
    }
    Ok(claim(broker, queue).await?)
}

/// Another broker's answer to a forwarded call.
struct PeerAnswer {
    status: StatusCode,
    retry_after: Option<HeaderValue>,
    body: Bytes,
}

impl PeerAnswer {
    /// The refusal of a broker that no longer owns the queue.
    fn moved(&self) -> bool {
        self.status == StatusCode::SERVICE_UNAVAILABLE
            && serde_json::from_slice::<Value>(&self.body).is_ok_and(|v| v["code"] == OWNER_MOVED)
    }

    /// The answer as this broker's reply, as it is.
    fn into_reply(self) -> Reply {
        let mut reply = http::json_bytes(self.status, self.body.to_vec());
        if let Some(after) = self.retry_after {
            reply.headers_mut().insert(RETRY_AFTER, after);
        }
        reply
    }
}

/// Sends a call to another broker and reads its whole answer.
async fn forward(broker: &Broker, address: &str, call: &Call) -> Result<PeerAnswer, String> {
    // An owner that vanished without closing its connections (a partition, a dead host) must
    // not hold the call: a long poll gets its own timeout and a margin, anything else 10 s.
    let limit = Duration::from_millis(forward_limit_ms(call));
    let mut request = hyper::Request::builder()
        .method(call.method.clone())
        .uri(&call.target)
        .header(HOST, address)
        .header(CONTENT_TYPE, "application/json")
        .header(FORWARDED, "1");
    if let Some(auth) = &call.authorization {
        request = request.header(AUTHORIZATION, auth);
    }
    let request = request
        .body(Full::new(call.body.clone()))
        .map_err(|e| format!("building the forward: {e}"))?;
    let answer = tokio::time::timeout(limit, broker.ephemeral.peers.send(address, request))
        .await
        .map_err(|_| format!("{address} did not answer within {} ms", limit.as_millis()))??;
    let (parts, body) = answer.into_parts();
    Ok(PeerAnswer {
        status: parts.status,
        retry_after: parts.headers.get(RETRY_AFTER).cloned(),
        body,
    })
}

/// How long a forwarded call may take: a waiting pop its timeout plus 5 s, anything else 10 s.
fn forward_limit_ms(call: &Call) -> u64 {
    const OTHERS_MS: u64 = 10_000;
    let query = call.target.split_once('?').map_or("", |(_, q)| q);
    let mut wait = false;
    let mut timeout = 30_000u64;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("wait", v)) => wait = v == "true" || v == "1",
            Some(("timeout", v)) => timeout = v.parse().unwrap_or(timeout),
            _ => {}
        }
    }
    if wait {
        timeout.saturating_add(5_000)
    } else {
        OTHERS_MS
    }
}

/// Serves here (`None`) or answers with the owner's reply. A forward that fails, or that the
/// broker it reached refuses as not the owner any more, resolves the owner again once.
async fn at_owner(broker: &Broker, call: &Call, queue: &str) -> Result<Option<Reply>, Failure> {
    let mut failure = String::new();
    for _ in 0..2 {
        let address = match owner_of(broker, queue, call.forwarded).await? {
            Owner::Local => return Ok(None),
            Owner::Remote(_) if call.forwarded => {
                return Err(Failure {
                    code: Some(OWNER_MOVED),
                    ..Failure::unavailable(format!(
                        "ephemeral: this broker does not own {queue} (it moved): try again"
                    ))
                })
            }
            Owner::Remote(address) => address,
        };
        match forward(broker, &address, call).await {
            Ok(answer) if answer.moved() => failure = format!("{address} no longer owns {queue}"),
            Ok(answer) => return Ok(Some(answer.into_reply())),
            Err(e) => failure = e,
        }
        broker.ephemeral.forget_owner(queue);
    }
    Err(Failure::unavailable(format!(
        "ephemeral: {queue}'s owner did not answer ({failure}): try again"
    )))
}

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
    match storage_reads::ephemeral_config(broker, queue).await? {
        Some(stored) => broker.ephemeral.ensure(queue, options_of(stored)?),
        None if implicit => broker.ephemeral.ensure(queue, EphemeralOptions::default()),
        None => return Ok(false),
    }
    Ok(true)
}

pub async fn configure(broker: &Arc<Broker>, call: &Call) -> Result<Reply, Failure> {
    let body = parse_body(&call.body)?;
    let queue = queue_of(&body)?;
    let options = EphemeralOptions::parse(&body["options"]).map_err(refused)?;
    if let Some(reply) = at_owner(broker, call, &queue).await? {
        return Ok(reply);
    }
    // Storage first: a declaration answered is a declaration kept.
    let resolved = options.to_json();
    broker.save_ephemeral_config(&queue, &resolved).await?;
    broker.ephemeral.with(|s| s.configure(&queue, options));
    Ok(http::json(
        StatusCode::OK,
        &json!({"configured": true, "queue": queue, "options": resolved}),
    ))
}

pub async fn reset(broker: &Arc<Broker>, call: &Call) -> Result<Reply, Failure> {
    let queue = queue_of(&parse_body(&call.body)?)?;
    if let Some(reply) = at_owner(broker, call, &queue).await? {
        return Ok(reply);
    }
    let dropped = broker.ephemeral.with(|s| s.reset(&queue));
    broker.ephemeral.wake_all(&queue);
    Ok(http::json(
        StatusCode::OK,
        &json!({"queue": queue, "dropped": dropped}),
    ))
}

pub async fn delete(broker: &Arc<Broker>, call: &Call, queue: &str) -> Result<Reply, Failure> {
    ephemeral::check_name("queue", queue).map_err(refused)?;
    if let Some(reply) = at_owner(broker, call, queue).await? {
        return Ok(reply);
    }
    let declared = broker.remove_ephemeral_config(queue).await?;
    let held = broker.ephemeral.with(|s| s.delete(queue));
    broker.ephemeral.wake_all(queue);
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

pub async fn push(broker: &Arc<Broker>, call: &Call) -> Result<Reply, Failure> {
    let parsed: PushBody<'_> =
        serde_json::from_slice(&call.body).map_err(|e| invalid(format!("push body: {e}")))?;
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
    if let Some(reply) = at_owner(broker, call, queue).await? {
        return Ok(reply);
    }
    load(broker, queue, true).await?;
    let now = broker.now();
    let pushed = broker
        .ephemeral
        .with(|s| s.push(queue, partition, payloads, now))
        .map_err(refused)?;
    broker.ephemeral.pushed(queue, partition);
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

pub async fn pop(broker: Arc<Broker>, call: Call, query: Option<&str>) -> Result<Routed, Failure> {
    let params = pop_params(&broker, query)?;
    if params.wait_ms.is_none() {
        if let Some(reply) = at_owner(&broker, &call, &params.queue).await? {
            return Ok(Routed::Now(reply));
        }
        load(&broker, &params.queue, true).await?;
        let got = take(&broker, &params, broker.now()).map_err(refused)?;
        return Ok(Routed::Now(pop_answer(&params.queue, &got)));
    }
    // A long poll runs in its own task, so a client that leaves cancels it (and its forward).
    let (mut tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let served = async {
            if let Some(reply) = at_owner(&broker, &call, &params.queue).await? {
                return Ok(Some(reply));
            }
            load(&broker, &params.queue, true).await?;
            Ok::<_, Failure>(None)
        };
        let served = tokio::select! {
            s = served => s,
            _ = tx.closed() => return,
        };
        match served {
            Ok(None) => park(broker, params, tx).await,
            Ok(Some(reply)) => {
                let _ = tx.send(reply);
            }
            Err(f) => {
                let _ = tx.send(http::error(&f));
            }
        }
    });
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

/// A waiting pop: looks, and parks on its (queue, group, partition) wake until a push it may
/// take, an ack of its group, a reset, the next lease expiry or its timeout. With `windowBuffer`,
/// a pop that finds fewer than `count` messages waits up to `ms` from the first it saw for more.
async fn park(broker: Arc<Broker>, p: PopParams, tx: oneshot::Sender<Reply>) {
    let key = (p.queue.clone(), p.group.clone(), p.partition.clone());
    let wake = broker.ephemeral.parked(&key);
    parked(&broker, &p, &wake, tx).await;
    drop(wake);
    broker.ephemeral.unparked(&key);
}

async fn parked(
    broker: &Arc<Broker>,
    p: &PopParams,
    wake: &tokio::sync::Notify,
    mut tx: oneshot::Sender<Reply>,
) {
    let start = broker.now();
    let deadline = Timestamp(start.0 + p.wait_ms.unwrap_or(0) as i64 * 1000);
    let mut window_end: Option<Timestamp> = None;
    let mut shutdown = broker.shutting_down.subscribe();
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = broker.now();
        if !broker.ephemeral.owns(&p.queue, now) {
            // Its ring is gone with this broker's ownership: empty, and the client asks again.
            let _ = tx.send(pop_answer(&p.queue, &[]));
            return;
        }
        let (window, available, lease_end) = broker.ephemeral.with(|s| {
            s.ensure(&p.queue, EphemeralOptions::default);
            s.join(&p.queue, &p.group);
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
            let reply = match take(broker, p, now) {
                Ok(got) if got.is_empty() && now < deadline => None,
                Ok(got) => {
                    // Woken for work, it may have left some (another partition, a bigger
                    // push): the next parked pop of its group looks.
                    if !got.is_empty() && p.partition.is_none() {
                        let left = broker
                            .ephemeral
                            .with(|s| s.available(&p.queue, None, &p.group, now));
                        if left > 0 {
                            broker.ephemeral.pass_on(&p.queue, &p.group);
                        }
                    }
                    Some(pop_answer(&p.queue, &got))
                }
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
            _ = tokio::time::sleep(until(broker, wake_at)) => {}
            _ = tx.closed() => return,
            _ = shutdown.changed() => {
                let _ = tx.send(pop_answer(&p.queue, &[]));
                return;
            }
        }
    }
}

pub async fn ack(broker: &Arc<Broker>, call: &Call) -> Result<Reply, Failure> {
    let body = parse_body(&call.body)?;
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
    if let Some(reply) = at_owner(broker, call, &queue).await? {
        return Ok(reply);
    }
    let now = broker.now();
    let results: Vec<Value> = broker.ephemeral.with(|s| {
        acks.iter()
            .map(|(id, status)| {
                let outcome = s.ack(&queue, &group, id, *status, now);
                json!({"id": id, "outcome": outcome.as_str()})
            })
            .collect()
    });
    // An ack may end a partition's lease or return a message: a parked pop of the group looks.
    broker.ephemeral.released(&queue, &group);
    Ok(http::json(StatusCode::OK, &json!({"results": results})))
}

/// `queues`: the queues whose rings this broker holds, those every other live broker holds (asked
/// with a forwarded call, which answers only its own), and the declared ones nobody holds now
/// (empty, as declared).
pub async fn queues(broker: &Arc<Broker>, call: &Call) -> Result<Reply, Failure> {
    let mut held: std::collections::BTreeMap<String, Value> = broker
        .ephemeral
        .with(|s| s.list())
        .into_iter()
        .filter_map(|q| Some((q["queue"].as_str()?.to_string(), q)))
        .collect();
    if call.forwarded {
        let queues: Vec<Value> = held.into_values().collect();
        return Ok(http::json(StatusCode::OK, &json!({"queues": queues})));
    }
    if broker.ephemeral.address().is_some() {
        let me = broker.ephemeral.incarnation();
        for peer in storage_reads::ephemeral_brokers(broker).await? {
            if peer.incarnation == me {
                continue;
            }
            let listing = |e: String| {
                Failure::unavailable(format!("ephemeral: listing {}'s queues: {e}", peer.address))
            };
            let answer = forward(broker, &peer.address, call)
                .await
                .map_err(listing)?;
            if answer.status != StatusCode::OK {
                return Err(listing(format!("it answered {}", answer.status)));
            }
            let listed: Value = serde_json::from_slice(&answer.body)
                .map_err(|e| listing(format!("its answer is not JSON: {e}")))?;
            for q in listed["queues"].as_array().into_iter().flatten() {
                if let Some(name) = q["queue"].as_str() {
                    held.insert(name.to_string(), q.clone());
                }
            }
        }
    }
    for (queue, stored) in storage_reads::ephemeral_configs(broker).await? {
        if let std::collections::btree_map::Entry::Vacant(slot) = held.entry(queue) {
            let options = options_of(stored)?;
            let entry = json!({
                "queue": slot.key(), "length": 0, "bytes": 0, "partitions": 0, "groups": 0,
                "options": options.to_json(),
            });
            slot.insert(entry);
        }
    }
    let queues: Vec<Value> = held.into_values().collect();
    Ok(http::json(StatusCode::OK, &json!({"queues": queues})))
}

pub async fn depth(broker: &Arc<Broker>, call: &Call, queue: &str) -> Result<Reply, Failure> {
    ephemeral::check_name("queue", queue).map_err(refused)?;
    if let Some(reply) = at_owner(broker, call, queue).await? {
        return Ok(reply);
    }
    load(broker, queue, false).await?;
    let now = broker.now();
    match broker.ephemeral.with(|s| s.depth(queue, now)) {
        Some(d) => Ok(http::json(StatusCode::OK, &d)),
        None => Err(refused(ephemeral::not_found(queue))),
    }
}
