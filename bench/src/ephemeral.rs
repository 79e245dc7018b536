//! Scenario 17: ephemeral queues against durable queues on the same broker in the same run: push
//! at batch 1 and 100 (8 producers), pop+ack at batch 1 and 100 (8 consumers in queue mode over 8
//! partitions), push-to-delivery p50/p99 at a tenth of the ephemeral push rate with a consumer
//! parked in a long poll, and the memory a million queued 200-byte messages cost. Then two
//! brokers sharing their ephemeral queues (`PEER_ADDRESS`): push and pop+ack at batch 1 through
//! the broker that does not own the queue (each call forwarded to the owner) against the same
//! through the owner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::{latency, measure_with_cpu, payload, rss_mib, since_start_us, Row};

const PRODUCERS: usize = 8;
const PARTITIONS: usize = 8;

/// A feed queue: at its bounds it drops its oldest, so a producer never waits on a consumer.
async fn configure(c: &mut queen_raw_client::Client, queue: &str, max_length: u64, max_bytes: u64) {
    let r = c
        .post(
            "/api/v1/ephemeral/configure",
            &json!({"queue": queue, "options": {
                "maxLength": max_length, "maxBytes": max_bytes, "policy": "drop_oldest"
            }}),
        )
        .await;
    assert_eq!(
        r.status,
        200,
        "configure: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// Frees a measured queue's memory for the next measurement.
async fn delete(addr: std::net::SocketAddr, queue: &str) {
    let mut c = queen_raw_client::Client::connect(addr).await;
    let r = c
        .send("DELETE", &format!("/api/v1/ephemeral/queue/{queue}"), None)
        .await;
    assert_eq!(
        r.status,
        200,
        "delete: {}",
        String::from_utf8_lossy(&r.body)
    );
}

const FEED_BYTES: u64 = 64 << 20;

/// Where a measurement's calls go: `owner` configures (and so owns) the queue, the clients call
/// `via` (the same broker, or another that forwards each call to the owner).
#[derive(Clone, Copy)]
struct Route {
    owner: std::net::SocketAddr,
    via: std::net::SocketAddr,
}

impl Route {
    fn direct(addr: std::net::SocketAddr) -> Route {
        Route {
            owner: addr,
            via: addr,
        }
    }
}

/// msg/s of `PRODUCERS` pushing `batch` messages a request, ephemeral or durable.
async fn push_rate(route: Route, ephemeral: bool, batch: usize, secs: u64) -> f64 {
    let addr = route.via;
    let queue = format!("{}-push{batch}", if ephemeral { "eph" } else { "dur" });
    if ephemeral {
        let mut c = queen_raw_client::Client::connect(route.owner).await;
        configure(&mut c, &queue, 2_000_000, FEED_BYTES).await;
    }
    let measured = queue.clone();
    let (rate, _) = measure_with_cpu(PRODUCERS, secs, move |t, stop, count| {
        let queue = queue.clone();
        async move {
            let mut c = queen_raw_client::Client::connect(addr).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let partition = format!("p{}", (t + i as usize) % PARTITIONS);
                let start = i;
                i += batch as u64;
                let r = if ephemeral {
                    let messages: Vec<Value> = (start + 1..=i)
                        .map(|k| json!({"payload": payload(k)}))
                        .collect();
                    c.post(
                        "/api/v1/ephemeral/push",
                        &json!({"queue": queue, "partition": partition, "messages": messages}),
                    )
                    .await
                } else {
                    let items: Vec<Value> = (start + 1..=i)
                        .map(|k| json!({"queue": queue, "partition": partition, "payload": payload(k), "transactionId": format!("{t}-{k}")}))
                        .collect();
                    c.post("/api/v1/push", &json!({ "items": items })).await
                };
                assert!(r.status < 300, "push: {}", String::from_utf8_lossy(&r.body));
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
    .await;
    if ephemeral {
        delete(route.owner, &measured).await;
    }
    rate
}

/// Messages a pop answer carries, and the body of the ack that completes them.
fn acks_of(ephemeral: bool, answer: &Value) -> (usize, Value) {
    let msgs = answer["messages"].as_array().cloned().unwrap_or_default();
    let n = msgs.len();
    let body = if ephemeral {
        let acks: Vec<Value> = msgs.iter().map(|m| json!({"id": m["id"]})).collect();
        json!({"queue": "", "acks": acks})
    } else {
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
            .collect();
        json!({ "acknowledgments": acks })
    };
    (n, body)
}

/// msg/s of 8 consumers (queue mode: one group) taking `batch` a pop and acking each batch,
/// draining a backlog pushed first.
async fn pop_ack_rate(route: Route, ephemeral: bool, batch: usize, secs: u64) -> f64 {
    let addr = route.via;
    let queue = format!("{}-pop{batch}", if ephemeral { "eph" } else { "dur" });
    let mut c = queen_raw_client::Client::connect(route.owner).await;
    if ephemeral {
        configure(&mut c, &queue, 2_000_000, FEED_BYTES).await;
    }
    // A backlog the consumers cannot finish within the window at these rates.
    let backlog = if secs <= 1 { 20_000 } else { 200_000 };
    let backlog = if batch == 1 { backlog / 10 } else { backlog };
    for chunk in 0..backlog / 1000 {
        let partition = format!("p{}", chunk % PARTITIONS);
        let r = if ephemeral {
            let messages: Vec<Value> = (0..1000).map(|k| json!({"payload": payload(k)})).collect();
            c.post(
                "/api/v1/ephemeral/push",
                &json!({"queue": queue, "partition": partition, "messages": messages}),
            )
            .await
        } else {
            let items: Vec<Value> = (0..1000)
                .map(|k| json!({"queue": queue, "partition": partition, "payload": payload(k)}))
                .collect();
            c.post("/api/v1/push", &json!({ "items": items })).await
        };
        assert!(r.status < 300, "fill: {}", String::from_utf8_lossy(&r.body));
    }
    // Until the backlog is drained or the window ends, whichever is first.
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs.max(1) * 3);
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let (queue, stop, count) = (queue.clone(), stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut c = queen_raw_client::Client::connect(addr).await;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let path = if ephemeral {
                        format!("/api/v1/ephemeral/pop?queue={queue}&batch={batch}")
                    } else {
                        format!("/api/v1/pop/queue/{queue}?batch={batch}&wait=false")
                    };
                    let r = c.get(&path).await;
                    if r.status == 204 {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    assert_eq!(r.status, 200, "pop: {}", String::from_utf8_lossy(&r.body));
                    let (n, mut body) = acks_of(ephemeral, &r.json());
                    if n == 0 {
                        // Every partition is leased to another consumer: try again.
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let path = if ephemeral {
                        body["queue"] = json!(queue);
                        "/api/v1/ephemeral/ack"
                    } else {
                        "/api/v1/ack/batch"
                    };
                    let a = c.post(path, &body).await;
                    assert_eq!(a.status, 200, "ack: {}", String::from_utf8_lossy(&a.body));
                    if count.fetch_add(n as u64, Ordering::Relaxed) + n as u64 >= backlog as u64 {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a consumer");
    }
    let rate = count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    if ephemeral {
        delete(route.owner, &queue).await;
    }
    rate
}

/// Push-to-delivery latencies (ms) of one producer at `rate` msg/s, one consumer in a long poll.
async fn latencies(
    addr: std::net::SocketAddr,
    ephemeral: bool,
    rate: f64,
    secs: u64,
) -> (f64, f64) {
    let queue = format!("{}-latency", if ephemeral { "eph" } else { "dur" });
    let consumer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut c = queen_raw_client::Client::connect(addr).await;
            let mut seen = vec![];
            let end = Instant::now() + Duration::from_secs(secs + 1);
            while Instant::now() < end {
                let path = if ephemeral {
                    format!("/api/v1/ephemeral/pop?queue={queue}&batch=100&wait=true&timeout=500&autoAck=true")
                } else {
                    format!(
                        "/api/v1/pop/queue/{queue}?batch=100&wait=true&timeout=500&autoAck=true"
                    )
                };
                let r = c.get(&path).await;
                if r.status != 200 {
                    continue;
                }
                let key = if ephemeral { "payload" } else { "data" };
                for m in r.json()["messages"].as_array().into_iter().flatten() {
                    if let Some(sent) = m[key]["sentUs"].as_u64() {
                        seen.push(since_start_us().saturating_sub(sent));
                    }
                }
            }
            seen
        })
    };
    let mut c = queen_raw_client::Client::connect(addr).await;
    let gap = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut i = 0u64;
    let mut next = Instant::now();
    while Instant::now() < end {
        i += 1;
        let r = if ephemeral {
            c.post(
                "/api/v1/ephemeral/push",
                &json!({"queue": queue, "messages": [{"payload": payload(i)}]}),
            )
            .await
        } else {
            c.post(
                "/api/v1/push",
                &json!({"items": [{"queue": queue, "payload": payload(i)}]}),
            )
            .await
        };
        assert!(r.status < 300);
        next += gap;
        tokio::time::sleep_until(next.into()).await;
    }
    let l = latency(consumer.await.expect("the latency consumer"));
    if ephemeral {
        delete(addr, &queue).await;
    }
    (l.p50, l.p99)
}

/// RSS growth per payload byte when `n` 200-byte messages are queued in one ephemeral queue.
async fn memory(addr: std::net::SocketAddr, n: usize) -> f64 {
    let mut c = queen_raw_client::Client::connect(addr).await;
    configure(&mut c, "eph-memory", n as u64 + 1, n as u64 * 256).await;
    let before = rss_mib("self");
    // A 200-byte JSON string: 198 characters and its quotes.
    let text = json!("m".repeat(198));
    let messages: Vec<Value> = (0..1000).map(|_| json!({"payload": text})).collect();
    let body = json!({"queue": "eph-memory", "messages": messages});
    for _ in 0..n / 1000 {
        let r = c.post("/api/v1/ephemeral/push", &body).await;
        assert_eq!(
            r.status,
            200,
            "memory fill: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let grown = (rss_mib("self") - before) * 1024.0 * 1024.0;
    delete(addr, "eph-memory").await;
    grown / (n as f64 * 200.0)
}

/// `peers`: two brokers sharing their ephemeral queues, for the forwarded path.
pub async fn ephemeral_scenario(
    addr: std::net::SocketAddr,
    peers: (std::net::SocketAddr, std::net::SocketAddr),
    secs: u64,
    quick: bool,
) -> Vec<Row> {
    let mut rows = vec![];
    let (mut eph_batch1, mut dur_batch1) = (0.0, 0.0);
    let here = Route::direct(addr);
    for batch in [1usize, 100] {
        let eph = push_rate(here, true, batch, secs).await;
        let dur = push_rate(here, false, batch, secs).await;
        if batch == 1 {
            (eph_batch1, dur_batch1) = (eph, dur);
        }
        rows.push(Row::new(
            format!("ephemeral push, batch {batch}, {PRODUCERS} producers"),
            "msg/s",
            eph,
            "durable push, same broker",
            dur,
        ));
    }
    for batch in [1usize, 100] {
        let eph = pop_ack_rate(here, true, batch, secs).await;
        let dur = pop_ack_rate(here, false, batch, secs).await;
        rows.push(Row::new(
            format!("ephemeral pop+ack, batch {batch}, {PRODUCERS} consumers"),
            "msg/s",
            eph,
            "durable pop+ack, same broker",
            dur,
        ));
    }
    // Each at a tenth of its own batch-1 push rate.
    let window = secs.max(2);
    let eph_rate = (eph_batch1 / 10.0).max(50.0);
    let dur_rate = (dur_batch1 / 10.0).max(50.0);
    let (eph50, eph99) = latencies(addr, true, eph_rate, window).await;
    let (dur50, dur99) = latencies(addr, false, dur_rate, window).await;
    let label = format!(
        "ephemeral push-to-delivery, {eph_rate:.0} msg/s offered (a tenth of batch-1 push)"
    );
    let durable = "durable, at a tenth of its own batch-1 push";
    rows.push(Row::new(
        label.clone(),
        "p50 ms",
        eph50,
        format!("{durable}, p50 ms"),
        dur50,
    ));
    rows.push(Row::new(
        label.clone(),
        "p99 ms",
        eph99,
        format!("{durable}, p99 ms"),
        dur99,
    ));
    rows.push(Row::new(
        label,
        "durable offered msg/s",
        dur_rate,
        "-",
        f64::NAN,
    ));
    let (owner, other) = peers;
    let forwarded = Route { owner, via: other };
    let at_owner = Route::direct(owner);
    let fwd = push_rate(forwarded, true, 1, secs).await;
    let own = push_rate(at_owner, true, 1, secs).await;
    rows.push(Row::new(
        format!("ephemeral push, batch 1, {PRODUCERS} producers, through a non-owner (forwarded)"),
        "msg/s",
        fwd,
        "through the owner",
        own,
    ));
    let fwd = pop_ack_rate(forwarded, true, 1, secs).await;
    let own = pop_ack_rate(at_owner, true, 1, secs).await;
    rows.push(Row::new(
        format!(
            "ephemeral pop+ack, batch 1, {PRODUCERS} consumers, through a non-owner (forwarded)"
        ),
        "msg/s",
        fwd,
        "through the owner",
        own,
    ));
    let n = if quick { 100_000 } else { 1_000_000 };
    rows.push(Row::new(
        format!("ephemeral memory, {n} queued 200-byte messages"),
        "RSS bytes per payload byte",
        memory(addr, n).await,
        "target",
        2.0,
    ));
    rows
}
