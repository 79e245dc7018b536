//! queen-bench: the broker over real HTTP against raw PostgreSQL baselines, in the same run, on
//! the same database, with the same payloads and concurrency.
//!
//! Scenarios measured so far: push throughput (batch 1, 10, 100, 1,000; 10 partitions; 8
//! producers) against (a) one row per message with multi-row INSERTs and (b) one zstd segment
//! row per batch with offsets from the partition row; and leased consume throughput (pop batch
//! 100 + batch ack; 10 partitions; 4 consumers) against (c) a raw claim loop over segments.
//!
//! Usage: DATABASE_URL=... queen-bench [--quick] [--json PATH]   (or `bash .ci/bench`)

#![allow(clippy::expect_used)] // a benchmark that cannot set up has nothing to report

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_core::frames::{build_blob, slice_blob, Frame};
use queen_core::storage::PushGroup;
use queen_server::app::{App, Backend};
use queen_server::client::Client;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

const PRODUCERS: usize = 8;
const PARTITIONS: usize = 10;
const CONSUMERS: usize = 4;

fn payload(i: u64) -> Value {
    // About 200 bytes of JSON.
    json!({"id": i, "kind": "order.created", "customer": format!("c-{}", i % 997), "amount": (i % 10_000) as f64 / 100.0,
           "note": "x".repeat(120)})
}

struct Row {
    scenario: String,
    broker: f64,
    baseline: f64,
    baseline_name: &'static str,
    second: Option<(f64, &'static str)>,
}

async fn pg_connect(cfg: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

/// Runs `tasks` copies of `work` for `secs` seconds; returns messages per second.
async fn measure<F, Fut>(tasks: usize, secs: u64, work: F) -> f64
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(work(t, stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn push_scenario(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    batch: usize,
    secs: u64,
) -> Row {
    let broker = measure(PRODUCERS, secs, move |t, stop, count| async move {
        let mut c = Client::connect(addr).await;
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // One partition per request, rotating, as the segment baseline writes.
            let partition = format!("p{}", (t + i as usize) % PARTITIONS);
            let items: Vec<Value> = (0..batch)
                .map(|_| {
                    i += 1;
                    json!({"queue": format!("push{batch}"), "partition": partition, "payload": payload(i), "transactionId": format!("{t}-{i}")})
                })
                .collect();
            let r = c.post("/api/v1/push", &json!({ "items": items })).await;
            assert_eq!(r.status, 201, "push failed: {}", String::from_utf8_lossy(&r.body));
            count.fetch_add(batch as u64, Ordering::Relaxed);
        }
    })
    .await;
    // (a) one row per message, multi-row INSERT.
    let cfg_a = cfg.clone();
    let rows = measure(PRODUCERS, secs, move |t, stop, count| {
        let cfg = cfg_a.clone();
        async move {
            let c = pg_connect(&cfg).await;
            let values: Vec<String> = (0..batch)
                .map(|k| {
                    format!(
                        "(${}, ${}, ${}::text::jsonb)",
                        k * 3 + 1,
                        k * 3 + 2,
                        k * 3 + 3
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO bench.rows (partition, txid, payload) VALUES {}",
                values.join(",")
            );
            let stmt = c.prepare(&sql).await.expect("prepare");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut owned: Vec<(String, String, String)> = vec![];
                let partition = format!("p{}", (t + i as usize) % PARTITIONS);
                for _ in 0..batch {
                    i += 1;
                    owned.push((
                        partition.clone(),
                        format!("{batch}-{t}-{i}"),
                        payload(i).to_string(),
                    ));
                }
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![];
                for (p, x, d) in &owned {
                    params.push(p);
                    params.push(x);
                    params.push(d);
                }
                c.execute(&stmt, &params).await.expect("insert rows");
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
    .await;
    // (b) one segment row per batch, offsets from the partition row.
    let cfg_b = cfg.clone();
    let segs = measure(PRODUCERS, secs, move |t, stop, count| {
        let cfg = cfg_b.clone();
        async move {
            let mut c = pg_connect(&cfg).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = ((t + i as usize) % PARTITIONS) as i32;
                let frames: Vec<Frame> = (0..batch)
                    .map(|_| {
                        i += 1;
                        Frame { message_id: uuid::Uuid::from_u128(u128::from(i)), transaction_id: format!("{t}-{i}"), trace_id: None, payload: payload(i).to_string().into_bytes() }
                    })
                    .collect();
                let blob = build_blob(&frames).expect("blob");
                let tx = c.transaction().await.expect("begin");
                let last: i64 = tx.query_one("SELECT last_offset FROM bench.parts WHERE id = $1 FOR NO KEY UPDATE", &[&p]).await.expect("lock").get(0);
                tx.execute(
                    "INSERT INTO bench.segments (pid, base_offset, end_offset, blob) VALUES ($1, $2, $3, $4)",
                    &[&p, &(last + 1), &(last + batch as i64), &blob],
                )
                .await
                .expect("segment");
                tx.execute("UPDATE bench.parts SET last_offset = $2 WHERE id = $1", &[&p, &(last + batch as i64)]).await.expect("advance");
                tx.commit().await.expect("commit");
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
    .await;
    Row {
        scenario: format!("push, batch {batch}"),
        broker,
        baseline: rows,
        baseline_name: "(a) rows",
        second: Some((segs, "(b) segments")),
    }
}

async fn consume_scenario(
    app: &Arc<App>,
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    per_partition: usize,
) -> Row {
    // Backlog for the broker: segments of 100 messages, as batch-100 pushes store them.
    let total = (per_partition * PARTITIONS) as u64;
    let mut i = 0u64;
    for p in 0..PARTITIONS {
        for _ in 0..per_partition / 100 {
            let frames = (0..100)
                .map(|_| {
                    i += 1;
                    Frame {
                        message_id: uuid::Uuid::from_u128(u128::from(i)),
                        transaction_id: format!("c{i}"),
                        trace_id: None,
                        payload: payload(i).to_string().into_bytes(),
                    }
                })
                .collect();
            app.storage
                .push(vec![PushGroup {
                    queue: "consume".into(),
                    partition: format!("p{p}"),
                    frames,
                }])
                .await
                .expect("prefill");
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let done = done.clone();
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let mut empty = 0;
                while done.load(Ordering::Relaxed) < total && empty < 50 {
                    let r = c.get("/api/v1/pop/queue/consume?batch=100&wait=false").await;
                    if r.status == 204 {
                        empty += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    let body = r.json();
                    let msgs = body["messages"].as_array().expect("messages");
                    let acks: Vec<Value> = msgs.iter().map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]})).collect();
                    let a = c.post("/api/v1/ack/batch", &json!({ "acknowledgments": acks })).await;
                    assert_eq!(a.status, 200);
                    done.fetch_add(msgs.len() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.await;
    }
    let broker = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    // (c) the raw claim loop over segments holding the same backlog.
    let c = pg_connect(cfg).await;
    c.batch_execute("TRUNCATE bench.segments; UPDATE bench.parts SET last_offset = -1; UPDATE bench.cursors SET committed = -1").await.expect("reset");
    let mut i = 0u64;
    for p in 0..PARTITIONS as i32 {
        let mut last = -1i64;
        for _ in 0..per_partition / 100 {
            let frames: Vec<Frame> = (0..100)
                .map(|_| {
                    i += 1;
                    Frame {
                        message_id: uuid::Uuid::from_u128(u128::from(i)),
                        transaction_id: format!("c{i}"),
                        trace_id: None,
                        payload: payload(i).to_string().into_bytes(),
                    }
                })
                .collect();
            let blob = build_blob(&frames).expect("blob");
            c.execute("INSERT INTO bench.segments (pid, base_offset, end_offset, blob) VALUES ($1, $2, $3, $4)", &[&p, &(last + 1), &(last + 100), &blob]).await.expect("prefill");
            last += 100;
        }
        c.execute(
            "UPDATE bench.parts SET last_offset = $2 WHERE id = $1",
            &[&p, &last],
        )
        .await
        .expect("prefill");
    }
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..CONSUMERS)
        .map(|t| {
            let done = done.clone();
            let cfg = cfg.clone();
            tokio::spawn(async move {
                let mut c = pg_connect(&cfg).await;
                let mut k = t;
                let mut idle = 0;
                while done.load(Ordering::Relaxed) < total && idle < PARTITIONS * 3 {
                    k += 1;
                    let p = (k % PARTITIONS) as i32;
                    let tx = c.transaction().await.expect("begin");
                    let Some(row) = tx.query_opt("SELECT committed FROM bench.cursors WHERE pid = $1 FOR UPDATE SKIP LOCKED", &[&p]).await.expect("claim") else {
                        tx.commit().await.expect("commit");
                        idle += 1;
                        continue;
                    };
                    let committed: i64 = row.get(0);
                    let segs = tx
                        .query("SELECT base_offset, end_offset, blob FROM bench.segments WHERE pid = $1 AND end_offset > $2 ORDER BY base_offset LIMIT 2", &[&p, &committed])
                        .await
                        .expect("read");
                    let mut taken = 0i64;
                    for s in &segs {
                        let (base, end, blob): (i64, i64, Vec<u8>) = (s.get(0), s.get(1), s.get(2));
                        let start_idx = (committed + 1 + taken - base).max(0);
                        let take = (end - base + 1 - start_idx).min(100 - taken);
                        if take <= 0 {
                            break;
                        }
                        let frames = slice_blob(&blob, start_idx as usize, take as usize, (end - base + 1) as usize).expect("slice");
                        taken += frames.len() as i64;
                    }
                    if taken == 0 {
                        tx.commit().await.expect("commit");
                        idle += 1;
                        continue;
                    }
                    idle = 0;
                    tx.execute("UPDATE bench.cursors SET committed = committed + $2 WHERE pid = $1", &[&p, &taken]).await.expect("advance");
                    tx.commit().await.expect("commit");
                    done.fetch_add(taken as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.await;
    }
    let claim = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    Row {
        scenario: format!("consume leased, batch 100, {CONSUMERS} consumers"),
        broker,
        baseline: claim,
        baseline_name: "(c) claim loop",
        second: None,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "target/queen-bench.json".into());
    let secs = if quick { 2 } else { 10 };
    let per_partition = if quick { 2_000 } else { 10_000 };
    let name = "queen_bench";
    let pg = queen_storage_pg::testing::fresh_database(name, 32).await;
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(name);
    let setup = pg_connect(&cfg).await;
    setup
        .batch_execute(&format!(
            "CREATE SCHEMA bench;
             CREATE TABLE bench.rows (id bigserial PRIMARY KEY, partition text NOT NULL, txid text NOT NULL, payload jsonb NOT NULL,
                                      created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (partition, txid));
             CREATE TABLE bench.parts (id int PRIMARY KEY, last_offset bigint NOT NULL);
             CREATE TABLE bench.segments (pid int NOT NULL, base_offset bigint NOT NULL, end_offset bigint NOT NULL, blob bytea NOT NULL,
                                          created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pid, base_offset));
             ALTER TABLE bench.segments ALTER COLUMN blob SET STORAGE EXTERNAL;
             CREATE TABLE bench.cursors (pid int PRIMARY KEY, committed bigint NOT NULL);
             INSERT INTO bench.parts SELECT g, -1 FROM generate_series(0, {}) g;
             INSERT INTO bench.cursors SELECT g, -1 FROM generate_series(0, {}) g;",
            PARTITIONS - 1,
            PARTITIONS - 1
        ))
        .await
        .expect("baseline schema");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = App::new(
        ServerConfig::default(),
        Arc::new(pg.clone()),
        Arc::new(pg.clone()),
        Backend::Postgres(pg),
        1,
    );
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));

    let mut rows = vec![];
    for batch in [1usize, 10, 100, 1000] {
        rows.push(push_scenario(addr, &cfg, batch, secs).await);
        eprintln!("measured push, batch {batch}");
    }
    rows.push(consume_scenario(&app, addr, &cfg, per_partition).await);

    println!(
        "\nqueen-bench ({}; PostgreSQL on this host; {} s per measurement)\n",
        if quick { "quick" } else { "full" },
        secs
    );
    println!("| scenario | broker msg/s | baseline | baseline msg/s | broker / baseline |");
    println!("|---|---:|---|---:|---:|");
    let mut out = vec![];
    for r in &rows {
        println!(
            "| {} | {:.0} | {} | {:.0} | {:.2}x |",
            r.scenario,
            r.broker,
            r.baseline_name,
            r.baseline,
            r.broker / r.baseline
        );
        let mut j = json!({"scenario": r.scenario, "broker": r.broker, "baseline": r.baseline_name, "baselineRate": r.baseline, "ratio": r.broker / r.baseline});
        if let Some((rate, name)) = r.second {
            println!(
                "| {} | {:.0} | {} | {:.0} | {:.2}x |",
                r.scenario,
                r.broker,
                name,
                rate,
                r.broker / rate
            );
            j["secondBaseline"] = json!(name);
            j["secondRate"] = json!(rate);
            j["secondRatio"] = json!(r.broker / rate);
        }
        out.push(j);
    }
    let doc = json!({"mode": if quick { "quick" } else { "full" }, "seconds": secs, "rows": out});
    if let Err(e) = std::fs::write(
        &json_path,
        serde_json::to_vec_pretty(&doc).unwrap_or_default(),
    ) {
        eprintln!("cannot write {json_path}: {e}");
    }
    drop(setup);
    app.shutting_down.send_replace(true);
    queen_storage_pg::testing::drop_database(name).await;
}
