//! Wake latency per deliverability event: how long after an event (or after the instant a
//! time-based one matures) a consumer parked on the queue receives the message, on the broker
//! where the event happened and on another broker on the same PostgreSQL. The brokers re-check
//! parked pops only every 60 s, so every delivery measured here came from an event or a revisit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_core::backoff::WaitBackoff;
use queen_raw_client::Client;
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

use crate::util::{latency, Latency, Row};

/// What makes the parked consumer's message deliverable.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Push,
    AckRelease,
    LeaseExpiry,
    DelayMaturity,
    Seek,
    GroupDelete,
}

pub const KINDS: [Kind; 6] = [
    Kind::Push,
    Kind::AckRelease,
    Kind::LeaseExpiry,
    Kind::DelayMaturity,
    Kind::Seek,
    Kind::GroupDelete,
];

impl Kind {
    /// Whether the clock, not a request, makes the message deliverable.
    fn time_based(self) -> bool {
        matches!(self, Kind::LeaseExpiry | Kind::DelayMaturity)
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Push => "push",
            Kind::AckRelease => "ack release",
            Kind::LeaseExpiry => "lease expiry",
            Kind::DelayMaturity => "delay maturity",
            Kind::Seek => "seek",
            Kind::GroupDelete => "group delete",
        }
    }
}

/// A broker with re-checks 60 s apart, listening for the other brokers' events.
pub async fn start_broker(
    pg: &queen_storage_pg::PgStorage,
    seed: u64,
) -> (Arc<Broker>, SocketAddr) {
    let config = ServerConfig {
        backoff: WaitBackoff {
            initial_ms: 60_000,
            threshold: 1,
            multiplier: 1.0,
            max_ms: 60_000,
        },
        ..crate::bench_config()
    };
    let (app, addr) = crate::start_with(pg, config, seed).await;
    queen_server::spawn_event_listener(app.clone(), pg);
    (app, addr)
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> Value {
    let r = Client::connect(addr).await.post(path, &body).await;
    assert!(r.status < 300, "{path}: {} {}", r.status, r.json());
    r.json()
}

async fn send(addr: SocketAddr, method: &str, path: &str) {
    let r = Client::connect(addr).await.send(method, path, None).await;
    assert!(r.status < 300, "{method} {path}: {}", r.status);
}

/// Takes the partition's first message under a lease: (leaseId, partitionId, transactionId).
async fn take(addr: SocketAddr, queue: &str) -> (String, String, String) {
    let r = Client::connect(addr)
        .await
        .get(&format!("/api/v1/pop/queue/{queue}/partition/p?batch=1"))
        .await;
    assert_eq!(r.status, 200, "take from {queue}");
    let v = r.json();
    let m = &v["messages"][0];
    (
        v["leaseId"].as_str().unwrap_or_default().to_string(),
        m["partitionId"].as_str().unwrap_or_default().to_string(),
        m["transactionId"].as_str().unwrap_or_default().to_string(),
    )
}

async fn push(addr: SocketAddr, queue: &str, txids: &[&str]) {
    let items: Vec<Value> = txids
        .iter()
        .map(|t| json!({"queue": queue, "partition": "p", "payload": {"t": t}, "transactionId": t}))
        .collect();
    post(addr, "/api/v1/push", json!({ "items": items })).await;
}

async fn ack(addr: SocketAddr, lease: &str, pid: &str, txid: &str) {
    post(
        addr,
        "/api/v1/ack",
        json!({"transactionId": txid, "partitionId": pid, "leaseId": lease, "status": "completed"}),
    )
    .await;
}

async fn parked_pops(addr: SocketAddr) -> u64 {
    let m = Client::connect(addr).await.get("/metrics").await.json();
    m["parkedPops"].as_u64().unwrap_or(0)
}

/// One sample: sets up `queue` through `actor`, parks a consumer on `parked`, makes the message
/// deliverable, and answers the microseconds from the event to the delivery.
async fn sample(kind: Kind, actor: SocketAddr, parked: SocketAddr, queue: String) -> Option<u64> {
    let options = match kind {
        Kind::LeaseExpiry => json!({"leaseTime": 1}),
        Kind::DelayMaturity => json!({"delayedProcessing": 1}),
        _ => json!({"leaseTime": 300}),
    };
    post(
        actor,
        "/api/v1/configure",
        json!({"queue": queue, "options": options}),
    )
    .await;
    // Before the consumer parks: what the event will then make deliverable.
    let mut held = None;
    let mut lease_from = None;
    match kind {
        Kind::Push | Kind::DelayMaturity => {}
        Kind::AckRelease => {
            push(actor, &queue, &["m1", "m2"]).await;
            held = Some(take(actor, &queue).await);
        }
        Kind::LeaseExpiry => {
            push(actor, &queue, &["m1"]).await;
            lease_from = Some(Instant::now());
            take(actor, &queue).await;
        }
        Kind::Seek | Kind::GroupDelete => {
            push(actor, &queue, &["m1"]).await;
            let (lease, pid, txid) = take(actor, &queue).await;
            ack(actor, &lease, &pid, &txid).await;
        }
    }
    let before = parked_pops(parked).await;
    let path = format!("/api/v1/pop/queue/{queue}?batch=1&wait=true&timeout=20000&autoAck=true");
    let sent = Instant::now();
    let waiter = tokio::spawn(async move { Client::connect(parked).await.get(&path).await });
    // Event-triggered samples run one at a time, so the count is this pop's; time-based ones
    // run several at once and need no more than a bounded look (their event is the clock).
    for _ in 0..1000 {
        if parked_pops(parked).await > before || waiter.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The instant the message became deliverable (for time-based events: when it matured,
    // measured from just before the request that started the clock, so never flattering).
    let event_at = match kind {
        Kind::Push => {
            let t = Instant::now();
            push(actor, &queue, &["m1"]).await;
            t
        }
        Kind::DelayMaturity => {
            let t = Instant::now();
            push(actor, &queue, &["m1"]).await;
            t + Duration::from_secs(1)
        }
        Kind::AckRelease => {
            let (lease, pid, txid) = held.clone().expect("held");
            let t = Instant::now();
            ack(actor, &lease, &pid, &txid).await;
            t
        }
        Kind::LeaseExpiry => lease_from.expect("leased") + Duration::from_secs(1),
        Kind::Seek => {
            let t = Instant::now();
            post(
                actor,
                &format!("/api/v1/consumer-groups/__QUEUE_MODE__/queues/{queue}/seek"),
                json!({"timestamp": "2000-01-01T00:00:00Z"}),
            )
            .await;
            t
        }
        Kind::GroupDelete => {
            let t = Instant::now();
            send(
                actor,
                "DELETE",
                &format!("/api/v1/consumer-groups/__QUEUE_MODE__/queues/{queue}"),
            )
            .await;
            t
        }
    };
    let r = waiter.await.ok()?;
    let got = Instant::now();
    if r.status != 200 {
        eprintln!(
            "wake {kind:?} ({queue}): the parked pop got {} after {:?}",
            r.status,
            sent.elapsed()
        );
        return None;
    }
    Some(got.saturating_duration_since(event_at).as_micros() as u64)
}

/// `samples` samples of one kind on their own queues: one at a time when a request is the
/// event (the parked count then tells when the pop has parked), ten at a time when time is.
pub async fn run(
    kind: Kind,
    actor: SocketAddr,
    parked: SocketAddr,
    tag: &str,
    samples: usize,
) -> (Latency, usize) {
    let mut us = vec![];
    let concurrency = if kind.time_based() { 10 } else { 1 };
    for round in 0..samples.div_ceil(concurrency) {
        let tasks: Vec<_> = (0..concurrency.min(samples - round * concurrency))
            .map(|i| {
                let queue = format!("wake-{tag}-{}-{round}-{i}", kind.label().replace(' ', "-"));
                tokio::spawn(sample(kind, actor, parked, queue))
            })
            .collect();
        for t in tasks {
            if let Ok(Some(x)) = t.await {
                us.push(x);
            }
        }
    }
    let n = us.len();
    (latency(us), n)
}

/// The rows of one kind on one topology: p50 and p99 against the bound docs/delivery.md states.
pub fn rows(kind: Kind, across: bool, l: &Latency, n: usize) -> Vec<Row> {
    let where_ = if across {
        "across two brokers"
    } else {
        "one broker"
    };
    let label = format!("wake, {}, {where_} ({n} samples)", kind.label());
    let target = if across { 250.0 } else { 100.0 };
    vec![
        Row::new(label.clone(), "p50 ms", l.p50, "-", f64::NAN),
        Row::new(label, "p99 ms", l.p99, "p99 target ms", target),
    ]
}
