//! Scenario 10: retention.
//! - Soak: steady push + consume at a fixed rate with completedRetentionSeconds = 2 and the
//!   worker every second, for `--soak-secs` (4 minutes in the full run; an hour is
//!   `--only retention --soak-secs 3600`). Per window (5 minutes; quarters in runs under 20
//!   minutes): the push-to-delivery p50 and p99, schema `queen`'s total size, the dead tuples of
//!   its tables and the autovacuum runs on them, against the second window (the first warms up):
//!   flat storage and latency are ratios near 1, not a climb.
//! - One retention pass over N partitions, each holding one consumed segment older than the
//!   cutoff, against a raw set-based DELETE of the same rows from an identical queue.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_core::storage::RetentionPass;
use queen_raw_client::Client;
use queen_server::config::ServerConfig;
use queen_server::{config::RetentionSettings, tasks::retention::run_pass};
use serde_json::{json, Value};

use crate::util::{latency, latency_us, payload, pg_connect, Row};

const SOAK_QUEUE: &str = "retention-soak";
const SOAK_PARTITIONS: usize = 100;
const SOAK_PRODUCERS: usize = 4;
const SOAK_CONSUMERS: usize = 4;
/// Messages per second offered in the soak (about a fifth of the steady maximum).
const SOAK_RATE: f64 = 2_000.0;
const QUARTERS: usize = 4;
/// Runs this long or longer report per 5-minute window instead of per quarter.
const WINDOW_SECS: u64 = 300;

/// Dead tuples of schema `queen`'s tables, and the autovacuum runs on them so far.
async fn vacuum_state(c: &tokio_postgres::Client) -> (f64, f64) {
    let r = c
        .query_one(
            "SELECT COALESCE(sum(n_dead_tup), 0)::float8, COALESCE(sum(autovacuum_count), 0)::float8
               FROM pg_stat_user_tables WHERE schemaname = 'queen'",
            &[],
        )
        .await
        .expect("vacuum statistics");
    (r.get(0), r.get(1))
}

/// One window of the soak.
struct Window {
    schema_mib: f64,
    p50: f64,
    p99: f64,
    dead_tuples: f64,
    autovacuums: f64,
}

async fn schema_bytes(c: &tokio_postgres::Client) -> f64 {
    c.query_one(
        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::float8
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'queen' AND c.relkind = 'r'",
        &[],
    )
    .await
    .expect("schema size")
    .get(0)
}

pub async fn retention_scenario(
    pg: &queen_storage_pg::PgStorage,
    cfg: &tokio_postgres::Config,
    soak_secs: u64,
    sizes: [usize; 2],
) -> Vec<Row> {
    let mut rows = soak(pg, cfg, soak_secs).await;
    for n in sizes {
        rows.extend(pass_cost(pg, cfg, n).await);
    }
    rows
}

async fn soak(
    pg: &queen_storage_pg::PgStorage,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> Vec<Row> {
    let config = ServerConfig {
        retention: RetentionSettings {
            interval_ms: 1_000,
            ..RetentionSettings::default()
        },
        ..crate::bench_config()
    };
    let (app, addr) = crate::start_with(pg, config, 11).await;
    let db = pg_connect(cfg).await;
    prepare_soak_tables(&db).await;
    let dashboard_open = partitions_beside(&db).await;
    let _held = hold_a_snapshot(cfg).await;
    let mut c = Client::connect(addr).await;
    let r = c
        .post(
            "/api/v1/configure",
            &json!({"queue": SOAK_QUEUE, "options": {"retentionEnabled": true, "completedRetentionSeconds": 2}}),
        )
        .await;
    assert_eq!(r.status, 200, "configure the soak queue");

    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let samples: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut tasks = vec![];
    for t in 0..SOAK_PRODUCERS {
        tasks.push(tokio::spawn(soak_producer(
            addr,
            t,
            stop.clone(),
            pushed.clone(),
        )));
    }
    for _ in 0..SOAK_CONSUMERS {
        tasks.push(tokio::spawn(soak_consumer(
            addr,
            stop.clone(),
            samples.clone(),
        )));
    }
    if dashboard_open {
        tasks.push(tokio::spawn(dashboard_reader(addr, stop.clone())));
    }
    let windows = if secs >= 4 * WINDOW_SECS {
        (secs / WINDOW_SECS) as usize
    } else {
        QUARTERS
    };
    let window = Duration::from_secs_f64(secs as f64 / windows as f64);
    let mut seen = vec![];
    let mut vacuums = vacuum_state(&db).await.1;
    for _ in 0..windows {
        tokio::time::sleep(window).await;
        let (dead_tuples, runs) = vacuum_state(&db).await;
        let delivered = samples
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        let lat = latency(delivered);
        seen.push(Window {
            schema_mib: schema_bytes(&db).await / (1024.0 * 1024.0),
            p50: lat.p50,
            p99: lat.p99,
            dead_tuples,
            autovacuums: runs - vacuums,
        });
        vacuums = runs;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        crate::util::joined(t.await);
    }
    let removed = app.metrics.retention_removed("messages") as f64;
    // Its worker stops before the pass measurements, which need the maintenance lease.
    app.shutting_down.send_replace(true);
    let pushed = pushed.load(Ordering::Relaxed) as f64;
    soak_rows(secs, &seen, removed, pushed)
}

/// BENCH_SOAK_HOLD_SNAPSHOT=1: the soak with a transaction left open in the database for its
/// whole length (a forgotten `psql`, a long report), which holds back PostgreSQL's cleanup of
/// the broker's tables (`PgStorage::oldest_snapshot`). The session ends when the answer drops.
async fn hold_a_snapshot(cfg: &tokio_postgres::Config) -> Option<tokio_postgres::Client> {
    std::env::var_os("BENCH_SOAK_HOLD_SNAPSHOT")?;
    let holder = pg_connect(cfg).await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.queues")
        .await
        .expect("hold a snapshot");
    eprintln!("soak with a snapshot held open");
    Some(holder)
}

/// The profiling variants of the soak's tables, each behind its environment variable.
async fn prepare_soak_tables(db: &tokio_postgres::Client) {
    // BENCH_AUTOVACUUM_DEFAULTS=1: the soak with PostgreSQL's default autovacuum settings, to
    // compare with migration 012's (docs/benchmarks.md).
    if std::env::var_os("BENCH_AUTOVACUUM_DEFAULTS").is_some() {
        db.batch_execute(
            "ALTER TABLE queen.log_segments RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                 autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, autovacuum_analyze_scale_factor, vacuum_truncate);
             ALTER TABLE queen.log_txids RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                 autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, autovacuum_analyze_scale_factor, vacuum_truncate);
             ALTER TABLE queen.log_consumers RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                 autovacuum_vacuum_cost_delay, fillfactor);
             ALTER TABLE queen.log_partitions RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                 autovacuum_vacuum_cost_delay, fillfactor);",
        )
        .await
        .expect("reset autovacuum settings");
        eprintln!("soak with PostgreSQL's default autovacuum settings");
    }
    // BENCH_SOAK_BALLAST=<n>: n messages held by another queue without retention (one segment
    // and one transactionId row each), as a deployment's backlog makes the tables large: the
    // default autovacuum trigger grows with the table (20% of its rows), fixed thresholds do not.
    if let Some(n) = std::env::var("BENCH_SOAK_BALLAST")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        db.batch_execute(&format!(
            "INSERT INTO queen.queues (name) VALUES ('ballast');
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at, oldest_at)
                  SELECT gen_random_uuid(), q.id, 'b' || g, {n} / 100 - 1, now(), now()
                    FROM generate_series(0, 99) g, queen.queues q WHERE q.name = 'ballast';
             INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
                  SELECT p.id, o, o, 1, now(), '\\x00'::bytea
                    FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id, generate_series(0, {n} / 100 - 1) o
                   WHERE q.name = 'ballast';
             INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
                  SELECT s.partition_id, 'b' || s.base_offset, s.base_offset, gen_random_uuid()
                    FROM queen.log_segments s JOIN queen.log_partitions p ON p.id = s.partition_id
                    JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'ballast';
             ANALYZE queen.log_segments; ANALYZE queen.log_txids;"
        ))
        .await
        .expect("ballast");
        eprintln!("soak with {n} messages of ballast");
    }
}

/// BENCH_SOAK_BESIDE_PARTITIONS=<n>: the soak beside another queue of n partitions (one message
/// and one cursor each) with the dashboard open (`dashboard_reader`), so the admin totals' pass
/// over them runs in the background through the soak, as for an operator watching a large
/// deployment. Whether it was asked.
async fn partitions_beside(db: &tokio_postgres::Client) -> bool {
    let Some(n) = std::env::var("BENCH_SOAK_BESIDE_PARTITIONS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return false;
    };
    db.batch_execute(&format!(
        "INSERT INTO queen.queues (name) VALUES ('beside');
         INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at, oldest_at)
              SELECT gen_random_uuid(), q.id, 'b' || g, 0, now(), now()
                FROM generate_series(1, {n}) g, queen.queues q WHERE q.name = 'beside';
         -- Planned on statistics of an empty table, the inserts below probe every row's
         -- partition by a scan (minutes at a million).
         ANALYZE queen.log_partitions;
         INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
              SELECT p.id, 0, 0, 1, now(), '\\x00'::bytea
                FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
               WHERE q.name = 'beside';
         INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
              SELECT p.id, 'g', -1
                FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
               WHERE q.name = 'beside';
         ANALYZE queen.log_segments; ANALYZE queen.log_consumers;"
    ))
    .await
    .expect("partitions beside the soak");
    eprintln!("soak beside {n} partitions, the dashboard open");
    true
}

/// Reads the queue listing every 2 s, as the dashboard does while open.
async fn dashboard_reader(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) {
    let mut c = Client::connect(addr).await;
    while !stop.load(Ordering::Relaxed) {
        let r = c.get("/api/v1/resources/queues").await;
        assert!(
            r.status == 200 || r.status == 503,
            "the queue listing: {}",
            r.status
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Pushes batches of 10 at the producer's share of `SOAK_RATE`, round the soak's partitions.
async fn soak_producer(
    addr: std::net::SocketAddr,
    t: usize,
    stop: Arc<AtomicBool>,
    pushed: Arc<AtomicU64>,
) {
    let per_producer = Duration::from_secs_f64(10.0 * SOAK_PRODUCERS as f64 / SOAK_RATE);
    let mut c = Client::connect(addr).await;
    let mut next = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let partition = format!("p{}", (t * 7 + i as usize) % SOAK_PARTITIONS);
        let items: Vec<Value> = (0..10)
            .map(|_| {
                i += 1;
                json!({"queue": SOAK_QUEUE, "partition": partition, "payload": payload(i), "transactionId": format!("s{t}-{i}")})
            })
            .collect();
        let r = c.post("/api/v1/push", &json!({ "items": items })).await;
        assert_eq!(r.status, 201, "soak push");
        pushed.fetch_add(10, Ordering::Relaxed);
        next += per_producer;
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Long-polls batches of 50, notes each message's push-to-delivery latency, acks them whole.
async fn soak_consumer(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<u64>>>,
) {
    let mut c = Client::connect(addr).await;
    while !stop.load(Ordering::Relaxed) {
        let r = c
            .get(&format!(
                "/api/v1/pop/queue/{SOAK_QUEUE}?batch=50&wait=true&timeout=1000"
            ))
            .await;
        if r.status != 200 {
            continue;
        }
        let msgs = r.json()["messages"].as_array().cloned().unwrap_or_default();
        if let Ok(mut s) = samples.lock() {
            s.extend(msgs.iter().filter_map(|m| latency_us(&m["data"])));
        }
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}))
            .collect();
        let r = c
            .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
            .await;
        assert_eq!(r.status, 200, "soak ack");
    }
}

/// Each window's figures against the second window's, and what retention removed.
fn soak_rows(secs: u64, windows: &[Window], removed: f64, pushed: f64) -> Vec<Row> {
    let mut rows = vec![];
    let Some(base) = windows.get(1).or(windows.first()) else {
        return rows;
    };
    let n = windows.len();
    for (k, w) in windows.iter().enumerate() {
        let label = format!(
            "retention soak ({SOAK_RATE:.0} msg/s, completed after 2 s), window {}/{n} of {secs} s",
            k + 1
        );
        let against = "window 2";
        rows.push(Row::new(
            label.clone(),
            "schema MiB",
            w.schema_mib,
            against,
            base.schema_mib,
        ));
        rows.push(Row::new(label.clone(), "p50 ms", w.p50, against, base.p50));
        rows.push(Row::new(label.clone(), "p99 ms", w.p99, against, base.p99));
        rows.push(Row::new(
            label.clone(),
            "dead tuples",
            w.dead_tuples,
            against,
            base.dead_tuples,
        ));
        rows.push(Row::new(
            label,
            "autovacuum runs",
            w.autovacuums,
            "-",
            f64::NAN,
        ));
    }
    rows.push(Row::new(
        format!("retention soak, {secs} s"),
        "messages removed",
        removed,
        "messages pushed",
        pushed,
    ));
    rows
}

/// Fills queue `name` with `n` partitions, each holding one segment created a minute ago and
/// consumed by group g (a cursor row at its end): exactly what completed retention removes.
async fn fill_consumed(db: &tokio_postgres::Client, name: &str, n: usize) {
    db.batch_execute(&format!(
        "INSERT INTO queen.queues (name, retention_enabled, completed_retention_seconds) VALUES ('{name}', true, 1);
         INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at, oldest_at)
              SELECT gen_random_uuid(), q.id, 'p' || g, 0, now() - interval '1 minute', now() - interval '1 minute'
                FROM generate_series(1, {n}) g, queen.queues q WHERE q.name = '{name}';
         INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
              SELECT p.id, 0, 0, 1, now() - interval '1 minute', '\\x00'::bytea
                FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{name}';
         INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
              SELECT p.id, 't', 0, gen_random_uuid()
                FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{name}';
         INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
              SELECT p.id, 'g', 0
                FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{name}';
         INSERT INTO queen.consumer_groups_metadata (queue_name, consumer_group) VALUES ('{name}', 'g');
         ANALYZE queen.log_partitions; ANALYZE queen.log_segments; ANALYZE queen.log_txids;"
    ))
    .await
    .expect("fill a queue with consumed partitions");
}

async fn pass_cost(
    pg: &queen_storage_pg::PgStorage,
    cfg: &tokio_postgres::Config,
    n: usize,
) -> Vec<Row> {
    let db = pg_connect(cfg).await;
    let (ours, raw) = (format!("tick-{n}"), format!("tick-raw-{n}"));
    fill_consumed(&db, &ours, n).await;
    fill_consumed(&db, &raw, n).await;
    // Only this queue has retention work: the pass's cost is this queue's.
    db.execute(
        "UPDATE queen.queues SET retention_enabled = false WHERE name <> $1",
        &[&ours],
    )
    .await
    .expect("one queue with retention");
    let (app, _) = crate::start_with(pg, crate::bench_config(), 12).await;
    let settings = RetentionSettings::default();
    // A pass still running in the soak's stopped worker holds the lease for a moment.
    let (report, ours_ms) = loop {
        let t = Instant::now();
        let report = run_pass(&app, "bench", RetentionPass::Retention, &settings)
            .await
            .expect("retention pass");
        if report.held_lease {
            break (report, t.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        report.removed.segments, n as u64,
        "the pass removes every segment: {report:?}"
    );
    let t = Instant::now();
    db.batch_execute(&format!(
        "BEGIN;
         DELETE FROM queen.log_txids t USING queen.log_partitions p, queen.queues q
          WHERE t.partition_id = p.id AND p.queue_id = q.id AND q.name = '{raw}';
         DELETE FROM queen.log_segments s USING queen.log_partitions p, queen.queues q
          WHERE s.partition_id = p.id AND p.queue_id = q.id AND q.name = '{raw}';
         COMMIT;"
    ))
    .await
    .expect("raw delete");
    let raw_ms = t.elapsed().as_secs_f64() * 1000.0;
    // A pass with nothing old enough: the index finds no candidate.
    let t = Instant::now();
    run_pass(&app, "bench", RetentionPass::Retention, &settings)
        .await
        .expect("idle pass");
    let idle_ms = t.elapsed().as_secs_f64() * 1000.0;
    db.execute(
        "SELECT queen.delete_queue_v1(n) FROM unnest($1::text[]) n",
        &[&vec![ours, raw]],
    )
    .await
    .expect("clean up");
    vec![
        Row::new(
            format!("retention pass, {n} partitions with a removable segment"),
            "ms",
            ours_ms,
            "raw DELETE of the same rows",
            raw_ms,
        ),
        Row::new(
            format!("retention pass, {n} partitions, nothing left to remove"),
            "ms",
            idle_ms,
            "raw DELETE of the same rows",
            raw_ms,
        ),
    ]
}
