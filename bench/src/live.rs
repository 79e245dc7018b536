//! Scenarios 3 and 6: producers and consumers together, push-to-delivery latency from the send
//! time in each payload. Steady state at the maximum and at a fixed offered rate; fan-out to 1, 5
//! and 10 consumer groups. The raw baseline is the shortest path PostgreSQL itself offers: a
//! segment insert that NOTIFYs at commit, and LISTENing claim loops.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use queen_core::frames::{build_blob, slice_blob, Frame};
use queen_raw_client::Client;
use serde_json::{json, Value};

use crate::util::{latency, latency_us, payload, pg_connect, since_start_us, Latency};

/// A pop answer as the live consumers read it: what an ack needs and each payload's send time,
/// typed (a `serde_json::Value` tree per answer took the load generator's share of the two cores
/// from the broker and PostgreSQL at 50 groups).
#[derive(serde::Deserialize)]
struct LiveAnswer<'a> {
    #[serde(borrow)]
    messages: Vec<LiveMessage<'a>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiveMessage<'a> {
    #[serde(borrow)]
    transaction_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    partition_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    lease_id: Option<std::borrow::Cow<'a, str>>,
    data: SentAt,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SentAt {
    sent_us: Option<u64>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct LiveAck<'a> {
    transaction_id: &'a str,
    partition_id: &'a str,
    lease_id: Option<&'a str>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct LiveAcks<'a> {
    acknowledgments: Vec<LiveAck<'a>>,
    consumer_group: &'a str,
}

const PRODUCERS: usize = 4;
const PARTITIONS: usize = 10;
const PUSH_BATCH: usize = 10;

pub struct LiveResult {
    /// Deliveries per second over all groups.
    pub delivered: f64,
    /// Deliveries made over all groups.
    pub deliveries: u64,
    /// Push-to-delivery latency per group.
    pub groups: Vec<Latency>,
}

/// Paces one producer: `None` pushes as fast as it can.
fn pace(rate: Option<f64>) -> Option<Duration> {
    rate.map(|r| Duration::from_secs_f64(PUSH_BATCH as f64 * PRODUCERS as f64 / r.max(1.0)))
}

/// The counters a run's producers and consumers share.
struct Counters<'a> {
    stop: &'a AtomicBool,
    pushed: &'a AtomicU64,
    delivered: &'a AtomicU64,
    drained: &'a AtomicBool,
}

/// The shared end of a run: after `secs`, stop the producers, let the consumers catch up with what
/// was pushed (bounded by 10 s), stop them; returns deliveries per second of the whole window.
async fn finish_run(
    secs: u64,
    c: Counters<'_>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<tokio::task::JoinHandle<()>>,
    deliveries_per_push: u64,
) -> (f64, u64) {
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    c.stop.store(true, Ordering::Relaxed);
    for p in producers {
        crate::util::joined(p.await);
    }
    let want = c.pushed.load(Ordering::Relaxed) * deliveries_per_push;
    let grace = Instant::now() + Duration::from_secs(10);
    while c.delivered.load(Ordering::Relaxed) < want && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    c.drained.store(true, Ordering::Relaxed);
    for h in consumers {
        crate::util::joined(h.await);
    }
    let deliveries = c.delivered.load(Ordering::Relaxed);
    (deliveries as f64 / elapsed, deliveries)
}

/// One live producer: pushes batches of `PUSH_BATCH` to its partitions in turn, at its share of
/// `rate` (unpaced without one), until `stop`.
fn spawn_producer(
    addr: std::net::SocketAddr,
    t: usize,
    queue: String,
    rate: Option<f64>,
    stop: Arc<AtomicBool>,
    pushed: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        let mut tick = pace(rate).map(|d| {
            let mut iv = tokio::time::interval(d);
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            iv
        });
        let mut i = (t as u64) << 40;
        while !stop.load(Ordering::Relaxed) {
            if let Some(iv) = tick.as_mut() {
                iv.tick().await;
            }
            let partition = format!("p{}", (t + i as usize) % PARTITIONS);
            let items: Vec<Value> = (0..PUSH_BATCH)
                .map(|_| {
                    i += 1;
                    json!({"queue": queue, "partition": partition, "payload": payload(i)})
                })
                .collect();
            let r = c.post("/api/v1/push", &json!({ "items": items })).await;
            assert_eq!(r.status, 201, "push failed");
            pushed.fetch_add(PUSH_BATCH as u64, Ordering::Relaxed);
        }
    })
}

/// Producers push batches of 10 for `secs`; `groups` x `per_group` consumers long-poll, ack, and
/// record the latency of every message.
pub async fn run(
    addr: std::net::SocketAddr,
    queue: &str,
    groups: usize,
    per_group: usize,
    rate: Option<f64>,
    secs: u64,
) -> LiveResult {
    crate::util::settle().await;
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            spawn_producer(
                addr,
                t,
                queue.to_string(),
                rate,
                stop.clone(),
                pushed.clone(),
            )
        })
        .collect();
    let delivered = Arc::new(AtomicU64::new(0));
    let samples: Vec<Arc<Mutex<Vec<u64>>>> =
        (0..groups).map(|_| Arc::new(Mutex::new(vec![]))).collect();
    let drained = Arc::new(AtomicBool::new(false));
    // Every delivery on stderr: where in a run a tail comes from (docs/benchmarks.md, its knobs).
    let dump_latencies = std::env::var("BENCH_DUMP_LAT").is_ok();
    let mut consumers = vec![];
    for (g, sink) in samples.iter().enumerate() {
        for _ in 0..per_group {
            let (delivered, sink, drained) = (delivered.clone(), sink.clone(), drained.clone());
            let group = format!("g{g}");
            let path = format!(
                "/api/v1/pop/queue/{queue}?batch=100&wait=true&timeout=500&consumerGroup={group}"
            );
            consumers.push(tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                while !drained.load(Ordering::Relaxed) {
                    let r = c.get(&path).await;
                    if r.status != 200 {
                        continue;
                    }
                    let answer: LiveAnswer = serde_json::from_slice(&r.body).expect("pop answer");
                    let now = since_start_us();
                    let lat: Vec<u64> = answer
                        .messages
                        .iter()
                        .filter_map(|m| m.data.sent_us.map(|sent| now.saturating_sub(sent)))
                        .collect();
                    // A message seconds late is a delivery fault, not load: say where it was.
                    if let Some((m, l)) = answer
                        .messages
                        .iter()
                        .zip(&lat)
                        .find(|(_, l)| **l > 5_000_000)
                    {
                        eprintln!(
                            "late delivery: {l} us, group {group}, partition {}, sent at {} us",
                            m.partition_id,
                            m.data.sent_us.unwrap_or(0)
                        );
                    }
                    let acks = LiveAcks {
                        acknowledgments: answer
                            .messages
                            .iter()
                            .map(|m| LiveAck {
                                transaction_id: &m.transaction_id,
                                partition_id: &m.partition_id,
                                lease_id: m.lease_id.as_deref(),
                            })
                            .collect(),
                        consumer_group: &group,
                    };
                    let body = serde_json::to_vec(&acks).expect("ack body");
                    let a = c
                        .post_bytes("/api/v1/ack/batch", "application/json", &body)
                        .await;
                    assert_eq!(a.status, 200, "ack failed");
                    delivered.fetch_add(answer.messages.len() as u64, Ordering::Relaxed);
                    if dump_latencies {
                        for m in &answer.messages {
                            if let Some(sent) = m.data.sent_us {
                                let l = now.saturating_sub(sent);
                                eprintln!("LAT {group} {} {sent} {l}", m.partition_id);
                            }
                        }
                    }
                    sink.lock().map(|mut s| s.extend(lat)).ok();
                }
            }));
        }
    }
    let counters = Counters {
        stop: &stop,
        pushed: &pushed,
        delivered: &delivered,
        drained: &drained,
    };
    let (rate, deliveries) = finish_run(secs, counters, producers, consumers, groups as u64).await;
    LiveResult {
        delivered: rate,
        deliveries,
        groups: samples
            .iter()
            .map(|s| latency(s.lock().map(|v| v.clone()).unwrap_or_default()))
            .collect(),
    }
}

/// The raw pipeline at the same offered rate: producers insert a segment and NOTIFY in one
/// transaction; consumers LISTEN and run the claim loop over every partition on each notification.
pub async fn raw_run(cfg: &tokio_postgres::Config, rate: Option<f64>, secs: u64) -> LiveResult {
    let setup = pg_connect(cfg).await;
    setup
        .batch_execute("TRUNCATE bench.segments; UPDATE bench.parts SET last_offset = -1; UPDATE bench.cursors SET committed = -1")
        .await
        .expect("reset");
    crate::util::settle().await;
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let (stop, pushed, cfg) = (stop.clone(), pushed.clone(), cfg.clone());
            tokio::spawn(async move {
                let mut c = pg_connect(&cfg).await;
                let mut tick = pace(rate).map(|d| {
                    let mut iv = tokio::time::interval(d);
                    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    iv
                });
                let mut i = (t as u64) << 40;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(iv) = tick.as_mut() {
                        iv.tick().await;
                    }
                    let p = ((t + i as usize) % PARTITIONS) as i32;
                    let frames: Vec<Frame> = (0..PUSH_BATCH)
                        .map(|_| {
                            i += 1;
                            Frame { producer: None, encrypted: false, message_id: uuid::Uuid::from_u128(u128::from(i)), transaction_id: format!("{i}"), trace_id: None, payload: payload(i).to_string().into_bytes() }
                        })
                        .collect();
                    let blob = build_blob(&frames).expect("blob");
                    let tx = c.transaction().await.expect("begin");
                    let last: i64 = tx.query_one("SELECT last_offset FROM bench.parts WHERE id = $1 FOR NO KEY UPDATE", &[&p]).await.expect("lock").get(0);
                    let n = PUSH_BATCH as i64;
                    tx.execute("INSERT INTO bench.segments (pid, base_offset, end_offset, blob) VALUES ($1, $2, $3, $4)", &[&p, &(last + 1), &(last + n), &blob]).await.expect("segment");
                    tx.execute("UPDATE bench.parts SET last_offset = $2 WHERE id = $1", &[&p, &(last + n)]).await.expect("advance");
                    tx.execute("SELECT pg_notify('bench_push', $1::text)", &[&p.to_string()]).await.expect("notify");
                    tx.commit().await.expect("commit");
                    pushed.fetch_add(PUSH_BATCH as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let delivered = Arc::new(AtomicU64::new(0));
    let sink = Arc::new(Mutex::new(vec![]));
    let drained = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let (delivered, sink, drained, cfg) = (delivered.clone(), sink.clone(), drained.clone(), cfg.clone());
            tokio::spawn(async move {
                let (mut c, mut conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
                let (wake_tx, mut wake) = tokio::sync::mpsc::unbounded_channel::<()>();
                tokio::spawn(async move {
                    let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(Ok(m)) = messages.next().await {
                        if matches!(m, tokio_postgres::AsyncMessage::Notification(_)) && wake_tx.send(()).is_err() {
                            break;
                        }
                    }
                });
                c.batch_execute("LISTEN bench_push").await.expect("listen");
                while !drained.load(Ordering::Relaxed) {
                    let _ = tokio::time::timeout(Duration::from_millis(100), wake.recv()).await;
                    while wake.try_recv().is_ok() {}
                    // Claim loop over every partition until a pass takes nothing.
                    loop {
                        let mut took = 0;
                        for k in 0..PARTITIONS {
                            let p = ((k + t) % PARTITIONS) as i32;
                            let tx = c.transaction().await.expect("begin");
                            let Some(row) = tx.query_opt("SELECT committed FROM bench.cursors WHERE pid = $1 FOR UPDATE SKIP LOCKED", &[&p]).await.expect("claim") else {
                                tx.commit().await.expect("commit");
                                continue;
                            };
                            let committed: i64 = row.get(0);
                            let segs = tx.query("SELECT base_offset, end_offset, blob FROM bench.segments WHERE pid = $1 AND end_offset > $2 ORDER BY base_offset LIMIT 10", &[&p, &committed]).await.expect("read");
                            let mut lat = vec![];
                            let mut taken = 0i64;
                            for s in &segs {
                                let (base, end, blob): (i64, i64, Vec<u8>) = (s.get(0), s.get(1), s.get(2));
                                let start_idx = (committed + 1 - base).max(0);
                                let frames = slice_blob(&blob, start_idx as usize, (end - base + 1 - start_idx) as usize, (end - base + 1) as usize).expect("slice");
                                for f in &frames {
                                    let v: Value = serde_json::from_slice(&f.payload).unwrap_or(Value::Null);
                                    lat.extend(latency_us(&v));
                                }
                                taken += frames.len() as i64;
                            }
                            if taken > 0 {
                                tx.execute("UPDATE bench.cursors SET committed = committed + $2 WHERE pid = $1", &[&p, &taken]).await.expect("advance");
                            }
                            tx.commit().await.expect("commit");
                            took += taken;
                            delivered.fetch_add(taken as u64, Ordering::Relaxed);
                            sink.lock().map(|mut s| s.extend(lat)).ok();
                        }
                        if took == 0 {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    let counters = Counters {
        stop: &stop,
        pushed: &pushed,
        delivered: &delivered,
        drained: &drained,
    };
    let (rate, deliveries) = finish_run(secs, counters, producers, consumers, 1).await;
    LiveResult {
        delivered: rate,
        deliveries,
        groups: vec![latency(sink.lock().map(|v| v.clone()).unwrap_or_default())],
    }
}
