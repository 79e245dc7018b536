//! Scenario 16: stream cycles. Eight SDK-shaped workers, each on its own source partition: a
//! leased pop of 100 messages, then one `POST /streams/v1/cycle` per message (one state upsert,
//! one sink push, the ack of that message; the last cycle of the batch ends the lease, the
//! others keep it, as a gate's partial cycles do). Counted: committed cycles. Against the same
//! three statements raw in one transaction per cycle (an upsert of a jsonb state row, a message
//! row insert, a cursor update), on eight connections, in the same run.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use crate::util::{measure_with_cpu, payload, pg_connect, Row};

const SOURCE: &str = "bench-stream-src";
const SINK: &str = "bench-stream-sink";
const GROUP: &str = "streams.bench";
const WORKERS: usize = 8;
const BATCH: usize = 100;

async fn post(c: &mut queen_raw_client::Client, path: &str, body: &Value) -> Value {
    let bytes = serde_json::to_vec(body).expect("json");
    let r = c.send("POST", path, Some(&bytes)).await;
    assert!(
        (200..300).contains(&r.status),
        "{path}: {} {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

/// One worker: refill its partition, take a batch, commit a cycle per message.
async fn worker(
    addr: std::net::SocketAddr,
    query_id: String,
    t: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut c = queen_raw_client::Client::connect(addr).await;
    let partition = format!("w{t}");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let items: Vec<Value> = (0..BATCH as u64)
            .map(|k| json!({"queue": SOURCE, "partition": partition, "payload": payload(n + k)}))
            .collect();
        n += BATCH as u64;
        post(&mut c, "/api/v1/push", &json!({ "items": items })).await;
        let r = c
            .send(
                "GET",
                &format!(
                    "/api/v1/pop/queue/{SOURCE}/partition/{partition}?batch={BATCH}&consumerGroup={GROUP}"
                ),
                None,
            )
            .await;
        assert_eq!(r.status, 200, "pop: {}", String::from_utf8_lossy(&r.body));
        let popped = r.json();
        let messages = popped["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.len().saturating_sub(1);
        for (i, m) in messages.iter().enumerate() {
            if stop.load(Ordering::Relaxed) && i < last {
                // Finish with the batch's last message, so the lease ends.
                continue;
            }
            let answer = post(
                &mut c,
                "/streams/v1/cycle",
                &json!({
                    "query_id": query_id,
                    "partition_id": m["partitionId"],
                    "consumer_group": GROUP,
                    "state_ops": [{"type": "upsert", "key": "count", "value": {"n": i}}],
                    "push_items": [{"queue": SINK, "partition": partition, "payload": m["data"]}],
                    "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"], "status": "completed"},
                    "release_lease": i == last,
                }),
            )
            .await;
            assert_eq!(answer["success"], true, "cycle: {answer}");
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Cycles/s through the broker.
async fn broker_cycles(addr: std::net::SocketAddr, secs: u64) -> f64 {
    let mut c = queen_raw_client::Client::connect(addr).await;
    let registered = post(
        &mut c,
        "/streams/v1/queries",
        &json!({"name": "bench-stream", "source_queue": SOURCE, "sink_queue": SINK,
                "config_hash": "bench", "reset": true}),
    )
    .await;
    let query_id = registered["query_id"]
        .as_str()
        .expect("a query id")
        .to_string();
    let (rate, _) = measure_with_cpu(WORKERS, secs, move |t, stop, count| {
        worker(addr, query_id.clone(), t, stop, count)
    })
    .await;
    rate
}

/// The same three statements raw: cycles/s.
async fn raw_cycles(cfg: &tokio_postgres::Config, secs: u64) -> f64 {
    let setup = pg_connect(cfg).await;
    setup
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench.stream_state (
                 query_id int NOT NULL, partition int NOT NULL, key text NOT NULL, value jsonb NOT NULL,
                 updated_at timestamptz NOT NULL, PRIMARY KEY (query_id, partition, key))",
        )
        .await
        .expect("raw stream state table");
    drop(setup);
    let cfg = cfg.clone();
    let (rate, _) = measure_with_cpu(WORKERS, secs, move |t, stop, count| {
        let cfg = cfg.clone();
        async move {
            let mut c = pg_connect(&cfg).await;
            let upsert = c
                .prepare(
                    "INSERT INTO bench.stream_state (query_id, partition, key, value, updated_at)
                     VALUES (1, $1, 'count', $2::text::jsonb, now())
                     ON CONFLICT (query_id, partition, key)
                     DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at",
                )
                .await
                .expect("prepare");
            let sink = c
                .prepare(
                    "INSERT INTO bench.rows (partition, txid, payload) VALUES ($1, $2, $3::text::jsonb)",
                )
                .await
                .expect("prepare");
            let ack = c
                .prepare("UPDATE bench.cursors SET committed = committed + 1 WHERE pid = $1")
                .await
                .expect("prepare");
            let (pid, partition) = (t as i32, format!("stream-w{t}"));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let tx = c.transaction().await.expect("begin");
                tx.execute(&upsert, &[&pid, &json!({"n": i}).to_string()])
                    .await
                    .expect("upsert");
                tx.execute(
                    &sink,
                    &[&partition, &format!("s-{i}"), &payload(i).to_string()],
                )
                .await
                .expect("sink row");
                tx.execute(&ack, &[&pid]).await.expect("cursor");
                tx.commit().await.expect("commit");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    rate
}

pub async fn streams_scenario(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> Vec<Row> {
    let raw = raw_cycles(cfg, secs).await;
    let broker = broker_cycles(addr, secs).await;
    vec![Row::new(
        "stream cycles (1 upsert, 1 sink push, 1 ack), 8 workers",
        "cycles/s",
        broker,
        "the three statements raw",
        raw,
    )]
}
