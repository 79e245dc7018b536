//! Scenario 9: PostgreSQL restarted under load. Producers push (batch 10) and consumers pop and
//! ack through one broker (an ack answered 503 is sent again, as clients do); after a calm stretch PostgreSQL is stopped for 2 s and started again
//! (`.ci/bench` exports the server it started, and `.ci/pg.sh`'s `pg_pause` restarts it). Reported:
//! delivered msg/s before, during and after; the time from PostgreSQL being back to the first
//! stored push and the first delivery; push p99 before and after. Against a database the bench
//! did not start (`DATABASE_URL` given), nothing can be restarted: the rows print "-".

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_raw_client::Client;
use serde_json::{json, Value};

use crate::util::{latency, payload, Row};

const DOWN_SECS: u32 = 2;

#[derive(Default)]
struct Timeline {
    /// (time since start, push latency) of every stored push.
    pushes: Vec<(Duration, u64)>,
    /// (time since start, messages) of every delivery.
    deliveries: Vec<(Duration, u64)>,
    /// Times of pushes that were not stored (503 while PostgreSQL was away).
    refused: Vec<Duration>,
}

fn rate(deliveries: &[(Duration, u64)], from: Duration, to: Duration) -> f64 {
    let n: u64 = deliveries
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, n)| n)
        .sum();
    n as f64 / (to.saturating_sub(from)).as_secs_f64().max(1e-9)
}

/// Stops PostgreSQL, waits, starts it again; `false` when this bench did not start it.
fn restart_postgres() -> bool {
    if std::env::var("PG_DIR").is_err() {
        return false;
    }
    std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(". .ci/pg.sh && pg_pause {DOWN_SECS}"))
        .status()
        .is_ok_and(|s| s.success())
}

pub async fn restart_scenario(addr: std::net::SocketAddr, calm_secs: u64) -> Vec<Row> {
    let start = Instant::now();
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for _ in 0..2 {
        let (timeline, stop, next) = (timeline.clone(), stop.clone(), next.clone());
        tasks.push(tokio::spawn(restart_producer(
            addr, start, timeline, stop, next,
        )));
    }
    for _ in 0..2 {
        let (timeline, stop) = (timeline.clone(), stop.clone());
        tasks.push(tokio::spawn(restart_consumer(addr, start, timeline, stop)));
    }
    tokio::time::sleep(Duration::from_secs(calm_secs)).await;
    let down_at = start.elapsed();
    let restarted = tokio::task::spawn_blocking(restart_postgres)
        .await
        .unwrap_or(false);
    let up_at = start.elapsed();
    tokio::time::sleep(Duration::from_secs(calm_secs + 1)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        crate::util::joined(t.await);
    }
    let t = match timeline.lock() {
        Ok(t) if restarted => Timeline {
            pushes: t.pushes.clone(),
            deliveries: t.deliveries.clone(),
            refused: t.refused.clone(),
        },
        _ => {
            eprintln!("PostgreSQL was not restarted (the bench did not start it): no figures");
            let nan = f64::NAN;
            return rows(nan, nan, nan, nan, nan, nan, nan);
        }
    };
    print_recovery(&t, up_at + Duration::from_secs(calm_secs + 1));
    let ms_after_up = |events: &[(Duration, u64)]| {
        events
            .iter()
            .find(|(at, _)| *at >= up_at)
            .map_or(f64::NAN, |(at, _)| (*at - up_at).as_secs_f64() * 1000.0)
    };
    let recovered = up_at + Duration::from_secs(1);
    let end = recovered + Duration::from_secs(calm_secs);
    let p99 = |from: Duration, to: Duration| {
        latency(
            t.pushes
                .iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, us)| *us)
                .collect(),
        )
        .p99
    };
    rows(
        rate(&t.deliveries, Duration::ZERO, down_at),
        rate(&t.deliveries, down_at, up_at),
        rate(&t.deliveries, recovered, end),
        ms_after_up(&t.pushes),
        ms_after_up(&t.deliveries),
        p99(Duration::ZERO, down_at),
        p99(recovered, end),
    )
}

/// Pushes batches of 10 round eight partitions, noting each stored push and each refusal.
async fn restart_producer(
    addr: std::net::SocketAddr,
    start: Instant,
    timeline: Arc<Mutex<Timeline>>,
    stop: Arc<AtomicBool>,
    next: Arc<AtomicU64>,
) {
    let mut c = Client::connect(addr).await;
    while !stop.load(Ordering::Relaxed) {
        let base = next.fetch_add(10, Ordering::Relaxed);
        let items: Vec<Value> = (base..base + 10)
            .map(|i| {
                json!({"queue": "restart", "partition": format!("p{}", i % 8),
                            "transactionId": format!("r{i}"), "payload": payload(i)})
            })
            .collect();
        let sent = Instant::now();
        let r = c.post("/api/v1/push", &json!({ "items": items })).await;
        if r.status == 201 {
            let us = sent.elapsed().as_micros() as u64;
            if let Ok(mut t) = timeline.lock() {
                t.pushes.push((start.elapsed(), us));
            }
        } else {
            if let Ok(mut t) = timeline.lock() {
                t.refused.push(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Long-polls and acks what it got, sending an ack that met the outage again, as a client does.
async fn restart_consumer(
    addr: std::net::SocketAddr,
    start: Instant,
    timeline: Arc<Mutex<Timeline>>,
    stop: Arc<AtomicBool>,
) {
    let mut c = Client::connect(addr).await;
    while !stop.load(Ordering::Relaxed) {
        let r = c
            .get("/api/v1/pop/queue/restart?wait=true&timeout=500&batch=100&partitions=4")
            .await;
        if r.status != 200 {
            continue;
        }
        let body = r.json();
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
            .collect();
        // As a client does: an ack that met the outage (503) is sent again after the
        // Retry-After; dropped, its batch would stay leased for the queue's lease time.
        let body = json!({ "acknowledgments": acks });
        let mut a = c.post("/api/v1/ack/batch", &body).await;
        while a.status == 503 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            a = c.post("/api/v1/ack/batch", &body).await;
        }
        if a.status == 200 {
            if let Ok(mut t) = timeline.lock() {
                t.deliveries.push((start.elapsed(), msgs.len() as u64));
            }
        }
    }
}

/// Per second, for reading the recovery: stored pushes (messages), deliveries, refusals.
fn print_recovery(t: &Timeline, total: Duration) {
    for sec in 0..total.as_secs() + 1 {
        let (from, to) = (Duration::from_secs(sec), Duration::from_secs(sec + 1));
        let within = |at: &Duration| *at >= from && *at < to;
        eprintln!(
            "restart: second {sec}: pushed {} msgs, delivered {}, refused {} pushes",
            t.pushes.iter().filter(|(at, _)| within(at)).count() * 10,
            t.deliveries
                .iter()
                .filter(|(at, _)| within(at))
                .map(|(_, n)| n)
                .sum::<u64>(),
            t.refused.iter().filter(|at| within(at)).count()
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn rows(
    before: f64,
    during: f64,
    after: f64,
    first_push_ms: f64,
    first_delivery_ms: f64,
    p99_before: f64,
    p99_after: f64,
) -> Vec<Row> {
    let label = format!("restart of PostgreSQL under load ({DOWN_SECS} s down)");
    vec![
        Row::new(
            label.clone(),
            "delivered msg/s during",
            during,
            "before",
            before,
        ),
        Row::new(
            label.clone(),
            "delivered msg/s after",
            after,
            "before",
            before,
        ),
        Row::new(
            label.clone(),
            "ms to first stored push",
            first_push_ms,
            "-",
            f64::NAN,
        ),
        Row::new(
            label.clone(),
            "ms to first delivery",
            first_delivery_ms,
            "-",
            f64::NAN,
        ),
        Row::new(label, "push p99 ms after", p99_after, "before", p99_before),
    ]
}
