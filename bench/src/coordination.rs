//! Scenario 13: the coordination surfaces, each against a raw PostgreSQL baseline in the same run
//! on the same database: KV `get` and `put` round trips (1 and 16 callers) and 100-op batches,
//! `incr` with `max` under 16 callers on one key, lock acquire+release cycles uncontended and
//! the hand-over time with 16 contenders, timers scheduled per second, and the lateness of
//! 10,000 timers due within one second (delivered to a consumer) against a raw `SKIP LOCKED`
//! timer table polled as a worker would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::util::{latency, measure_with_cpu, pg_connect, since_start_us, Row};

/// The raw baselines' tables.
pub const SCHEMA: &str = "CREATE SEQUENCE bench.kv_versions;
     CREATE TABLE bench.kv (ns text NOT NULL, key text NOT NULL, value jsonb NOT NULL, version bigint NOT NULL,
                            expires_at timestamptz, PRIMARY KEY (ns, key));
     CREATE TABLE bench.timers (id bigserial PRIMARY KEY, due timestamptz NOT NULL, payload jsonb NOT NULL);
     CREATE INDEX ON bench.timers (due);";

async fn kv_call(c: &mut queen_raw_client::Client, ops: &Value) -> Value {
    let body = serde_json::to_vec(&json!({ "operations": ops })).expect("json");
    let r = c.send("POST", "/api/v1/kv", Some(&body)).await;
    assert_eq!(r.status, 200, "kv: {}", String::from_utf8_lossy(&r.body));
    r.json()
}

async fn lock_call(c: &mut queen_raw_client::Client, op: Value) -> Value {
    let body = serde_json::to_vec(&json!({ "operations": [op] })).expect("json");
    let r = c.send("POST", "/api/v1/locks", Some(&body)).await;
    assert_eq!(r.status, 200, "locks: {}", String::from_utf8_lossy(&r.body));
    r.json()["results"][0].clone()
}

/// ops/s of a KV load: `callers` keep-alive clients (broker) or connections (raw), each sending
/// `per_call` ops of `kind` per round trip.
async fn kv_rates(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    kind: &'static str,
    callers: usize,
    per_call: usize,
    secs: u64,
) -> (f64, f64) {
    let (broker, _) = measure_with_cpu(callers, secs, move |t, stop, count| async move {
        let mut c = queen_raw_client::Client::connect(addr).await;
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let ops: Vec<Value> = (0..per_call)
                .map(|_| {
                    i += 1;
                    let key = format!("k{t}-{}", i % 1000);
                    match kind {
                        "get" => json!({"op": "get", "ns": "bench", "key": key}),
                        _ => json!({"op": "put", "ns": "bench", "key": key, "value": {"n": i}, "forever": true}),
                    }
                })
                .collect();
            kv_call(&mut c, &json!(ops)).await;
            count.fetch_add(per_call as u64, Ordering::Relaxed);
        }
    })
    .await;
    let cfg = cfg.clone();
    let (raw, _) = measure_with_cpu(callers, secs, move |t, stop, count| {
        let cfg = cfg.clone();
        async move {
            let mut c = pg_connect(&cfg).await;
            let get = c
                .prepare("SELECT value, version FROM bench.kv WHERE ns = 'bench' AND key = $1")
                .await
                .expect("prepare");
            let put = c
                .prepare(
                    "INSERT INTO bench.kv (ns, key, value, version) VALUES ('bench', $1, $2::text::jsonb, nextval('bench.kv_versions'))
                     ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version",
                )
                .await
                .expect("prepare");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if per_call == 1 {
                    // One read, or one put without a precondition, is its own transaction:
                    // one statement, as the broker sends.
                    i += 1;
                    let key = format!("k{t}-{}", i % 1000);
                    if kind == "get" {
                        c.query(&get, &[&key]).await.expect("get");
                    } else {
                        c.execute(&put, &[&key, &json!({"n": i}).to_string()]).await.expect("put");
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let tx = c.transaction().await.expect("begin");
                for _ in 0..per_call {
                    i += 1;
                    let key = format!("k{t}-{}", i % 1000);
                    if kind == "get" {
                        tx.query(&get, &[&key]).await.expect("get");
                    } else {
                        tx.execute(&put, &[&key, &json!({"n": i}).to_string()]).await.expect("put");
                    }
                }
                tx.commit().await.expect("commit");
                count.fetch_add(per_call as u64, Ordering::Relaxed);
            }
        }
    })
    .await;
    (broker, raw)
}

/// `incr` with `max` on one key under 16 callers (a window long enough never to close): calls/s.
async fn incr_rates(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> (f64, f64) {
    let (broker, _) = measure_with_cpu(16, secs, move |_, stop, count| async move {
        let mut c = queen_raw_client::Client::connect(addr).await;
        while !stop.load(Ordering::Relaxed) {
            kv_call(&mut c, &json!([{"op": "incr", "ns": "bench", "key": "limit", "max": 1_000_000_000u64, "ttlSeconds": 3600}])).await;
            count.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    let cfg = cfg.clone();
    let (raw, _) = measure_with_cpu(16, secs, move |_, stop, count| {
        let cfg = cfg.clone();
        async move {
            let c = pg_connect(&cfg).await;
            let incr = c
                .prepare(
                    "INSERT INTO bench.kv (ns, key, value, version) VALUES ('bench', 'limit', '1', nextval('bench.kv_versions'))
                     ON CONFLICT (ns, key) DO UPDATE SET value = to_jsonb(bench.kv.value::text::bigint + 1), version = EXCLUDED.version
                     WHERE bench.kv.value::text::bigint < 1000000000 RETURNING value",
                )
                .await
                .expect("prepare");
            while !stop.load(Ordering::Relaxed) {
                c.query(&incr, &[]).await.expect("incr");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    (broker, raw)
}

/// Uncontended acquire+release cycles per second, one caller per lock name.
async fn lock_cycles(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> (f64, f64) {
    let (broker, _) = measure_with_cpu(4, secs, move |t, stop, count| async move {
        let mut c = queen_raw_client::Client::connect(addr).await;
        let name = format!("solo-{t}");
        while !stop.load(Ordering::Relaxed) {
            let a = lock_call(
                &mut c,
                json!({"op": "acquire", "name": name, "ttlSeconds": 30, "owner": name}),
            )
            .await;
            lock_call(
                &mut c,
                json!({"op": "release", "name": name, "token": a["token"]}),
            )
            .await;
            count.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    let cfg = cfg.clone();
    let (raw, _) = measure_with_cpu(4, secs, move |t, stop, count| {
        let cfg = cfg.clone();
        async move {
            let c = pg_connect(&cfg).await;
            let acquire = c
                .prepare(
                    "INSERT INTO bench.kv (ns, key, value, version, expires_at)
                     VALUES ('locks', $1, '{}', nextval('bench.kv_versions'), now() + interval '30 s')
                     ON CONFLICT DO NOTHING RETURNING version",
                )
                .await
                .expect("prepare");
            let release = c
                .prepare("DELETE FROM bench.kv WHERE ns = 'locks' AND key = $1 AND version = $2")
                .await
                .expect("prepare");
            let name = format!("solo-{t}");
            while !stop.load(Ordering::Relaxed) {
                let row = c.query_one(&acquire, &[&name]).await.expect("acquire");
                let version: i64 = row.get(0);
                c.execute(&release, &[&name, &version]).await.expect("release");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    (broker, raw)
}

/// 16 contenders take one lock in turn (each retrying every millisecond while it is held, holding
/// it 1 ms): the time from a release to the next acquisition, p99 in ms.
async fn hand_over_p99(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> (f64, f64) {
    async fn run<F, Fut>(secs: u64, contender: F) -> f64
    where
        F: Fn(Arc<AtomicBool>, Arc<Mutex<Option<Instant>>>, Arc<Mutex<Vec<u64>>>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(Mutex::new(None));
        let gaps = Arc::new(Mutex::new(vec![]));
        let tasks: Vec<_> = (0..16)
            .map(|_| tokio::spawn(contender(stop.clone(), released.clone(), gaps.clone())))
            .collect();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            crate::util::joined(t.await);
        }
        let gaps = gaps.lock().map(|g| g.clone()).unwrap_or_default();
        latency(gaps).p99
    }
    fn took(released: &Mutex<Option<Instant>>, gaps: &Mutex<Vec<u64>>) {
        if let (Ok(r), Ok(mut g)) = (released.lock(), gaps.lock()) {
            if let Some(at) = *r {
                g.push(at.elapsed().as_micros() as u64);
            }
        }
    }
    fn gave_back(released: &Mutex<Option<Instant>>) {
        if let Ok(mut r) = released.lock() {
            *r = Some(Instant::now());
        }
    }
    let broker = run(secs, move |stop, released, gaps| async move {
        let mut c = queen_raw_client::Client::connect(addr).await;
        let owner = format!("c-{}", since_start_us());
        while !stop.load(Ordering::Relaxed) {
            let a = lock_call(
                &mut c,
                json!({"op": "acquire", "name": "contended", "ttlSeconds": 30, "owner": owner}),
            )
            .await;
            if a["acquired"] != true {
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            took(&released, &gaps);
            tokio::time::sleep(Duration::from_millis(1)).await;
            gave_back(&released);
            lock_call(
                &mut c,
                json!({"op": "release", "name": "contended", "token": a["token"]}),
            )
            .await;
        }
    })
    .await;
    let cfg = cfg.clone();
    let raw = run(secs, move |stop, released, gaps| {
        let cfg = cfg.clone();
        async move {
            let c = pg_connect(&cfg).await;
            let acquire = c
                .prepare(
                    "INSERT INTO bench.kv (ns, key, value, version, expires_at)
                     VALUES ('locks', 'contended', '{}', nextval('bench.kv_versions'), now() + interval '30 s')
                     ON CONFLICT DO NOTHING RETURNING version",
                )
                .await
                .expect("prepare");
            while !stop.load(Ordering::Relaxed) {
                let rows = c.query(&acquire, &[]).await.expect("acquire");
                let Some(row) = rows.first() else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let version: i64 = row.get(0);
                took(&released, &gaps);
                tokio::time::sleep(Duration::from_millis(1)).await;
                gave_back(&released);
                c.execute("DELETE FROM bench.kv WHERE ns = 'locks' AND key = 'contended' AND version = $1", &[&version])
                    .await
                    .expect("release");
            }
        }
    })
    .await;
    (broker, raw)
}

/// Timers scheduled per second: batches of 100 over 4 callers, against multi-row inserts.
async fn schedule_rates(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> (f64, f64) {
    let payload = base64::engine::general_purpose::STANDARD.encode(b"{\"n\":1}");
    let (broker, _) = measure_with_cpu(4, secs, move |t, stop, count| {
        let payload = payload.clone();
        async move {
            let mut c = queen_raw_client::Client::connect(addr).await;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ops: Vec<Value> = (0..100)
                    .map(|_| {
                        i += 1;
                        json!({"op": "schedule", "queue": "bench-far", "timerKey": format!("{t}-{i}"), "payload": payload,
                               "delayMs": 3_600_000, "txn": format!("{t}-{i}")})
                    })
                    .collect();
                let body = serde_json::to_vec(&json!({ "operations": ops })).expect("json");
                let r = c.send("POST", "/api/v1/timers", Some(&body)).await;
                assert_eq!(r.status, 200, "timers: {}", String::from_utf8_lossy(&r.body));
                count.fetch_add(100, Ordering::Relaxed);
            }
        }
    })
    .await;
    let cfg = cfg.clone();
    let (raw, _) = measure_with_cpu(4, secs, move |_, stop, count| {
        let cfg = cfg.clone();
        async move {
            let c = pg_connect(&cfg).await;
            while !stop.load(Ordering::Relaxed) {
                c.execute(
                    "INSERT INTO bench.timers (due, payload) SELECT now() + interval '1 hour', '{\"n\":1}' FROM generate_series(1, 100)",
                    &[],
                )
                .await
                .expect("insert timers");
                count.fetch_add(100, Ordering::Relaxed);
            }
        }
    })
    .await;
    (broker, raw)
}

/// `n` timers due evenly over `spread_ms` (0: all at one instant), 2 s from now: (p50, p99) ms
/// from due to delivery to a consumer long-polling the queue (broker), or from due to a worker's
/// `SKIP LOCKED` take (raw, polling every 10 ms as a timer worker without events would).
async fn lateness(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    n: usize,
    spread_ms: u64,
) -> ((f64, f64), (f64, f64)) {
    let base_ms = 2_000u64;
    let queue = format!("bench-due-{}", since_start_us());
    let mut c = queen_raw_client::Client::connect(addr).await;
    let started = since_start_us();
    for chunk in 0..n.div_ceil(250) {
        let ops: Vec<Value> = (chunk * 250..((chunk + 1) * 250).min(n))
            .map(|i| {
                let delay = base_ms + (i as u64 * spread_ms / n as u64);
                let due_us = started + delay * 1000;
                let payload = base64::engine::general_purpose::STANDARD.encode(json!({"dueUs": due_us}).to_string());
                json!({"op": "schedule", "queue": queue, "timerKey": format!("t{i}"), "payload": payload,
                       "delayMs": delay.saturating_sub((since_start_us() - started) / 1000), "txn": format!("t{i}")})
            })
            .collect();
        let body = serde_json::to_vec(&json!({ "operations": ops })).expect("json");
        let r = c.send("POST", "/api/v1/timers", Some(&body)).await;
        assert_eq!(
            r.status,
            200,
            "timers: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let mut late = vec![];
    let path = format!("/api/v1/pop/queue/{queue}?batch=1000&wait=true&timeout=2000&autoAck=true");
    let deadline = Instant::now() + Duration::from_secs(20);
    while late.len() < n && Instant::now() < deadline {
        let r = c.get(&path).await;
        if r.status != 200 {
            continue;
        }
        let now = since_start_us();
        for m in r.json()["messages"].as_array().cloned().unwrap_or_default() {
            if let Some(due) = m["data"]["dueUs"].as_u64() {
                late.push(now.saturating_sub(due));
            }
        }
    }
    let broker = latency(late);
    // Raw: the same due times in a table, a worker polling it.
    let pg = pg_connect(cfg).await;
    let started = since_start_us();
    pg.execute(
        "INSERT INTO bench.timers (due, payload)
         SELECT now() + make_interval(secs => ($1::int + g * $3::int / $2::int)::float8 / 1000), jsonb_build_object('g', g)
           FROM generate_series(0, $2::int - 1) g",
        &[&(base_ms as i32), &(n as i32), &(spread_ms as i32)],
    )
    .await
    .expect("raw timers");
    let mut raw_late = vec![];
    let deadline = Instant::now() + Duration::from_secs(20);
    while raw_late.len() < n && Instant::now() < deadline {
        let rows = pg
            .query(
                "DELETE FROM bench.timers WHERE id IN (
                     SELECT id FROM bench.timers WHERE due <= now() AND payload ? 'g'
                      ORDER BY due LIMIT 1000 FOR UPDATE SKIP LOCKED)
                 RETURNING (payload->>'g')::int",
                &[],
            )
            .await
            .expect("take due");
        let now = since_start_us();
        for r in rows {
            let g: i32 = r.get(0);
            let due = started + (base_ms + g as u64 * spread_ms / n as u64) * 1000;
            raw_late.push(now.saturating_sub(due));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let raw = latency(raw_late);
    ((broker.p50, broker.p99), (raw.p50, raw.p99))
}

pub async fn coordination_scenario(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
    due_timers: usize,
) -> Vec<Row> {
    let mut rows = vec![];
    let setup = pg_connect(cfg).await;
    setup
        .batch_execute(SCHEMA)
        .await
        .expect("coordination baseline schema");
    for (kind, callers, per_call) in [
        ("get", 1, 1),
        ("get", 16, 1),
        ("put", 1, 1),
        ("put", 16, 1),
        ("put", 4, 100),
    ] {
        // Gets read keys the puts would write: fill them first.
        if kind == "get" && callers == 1 {
            kv_rates(addr, cfg, "put", 16, 100, 1).await;
        }
        let (broker, raw) = kv_rates(addr, cfg, kind, callers, per_call, secs).await;
        let scenario = if per_call == 1 {
            format!("kv {kind}, {callers} caller(s), one op per call")
        } else {
            format!("kv {kind}, {callers} callers, {per_call} ops per call")
        };
        rows.push(Row::new(scenario, "ops/s", broker, "raw statements", raw));
        eprintln!("measured kv {kind} x{callers} ({per_call} per call)");
    }
    let (broker, raw) = incr_rates(addr, cfg, secs).await;
    rows.push(Row::new(
        "kv incr with max, 16 callers, one key",
        "calls/s",
        broker,
        "raw upsert",
        raw,
    ));
    let (broker, raw) = lock_cycles(addr, cfg, secs).await;
    rows.push(Row::new(
        "lock acquire+release, 4 callers, uncontended",
        "cycles/s",
        broker,
        "raw insert+delete",
        raw,
    ));
    let (broker, raw) = hand_over_p99(addr, cfg, secs.max(2)).await;
    rows.push(Row::new(
        "lock hand-over, 16 contenders",
        "p99 ms",
        broker,
        "raw insert+delete",
        raw,
    ));
    let (broker, raw) = schedule_rates(addr, cfg, secs).await;
    rows.push(Row::new(
        "timers scheduled, 4 callers, 100 per call",
        "timers/s",
        broker,
        "raw insert",
        raw,
    ));
    eprintln!("measured kv incr, locks and timer scheduling");
    // Spread over a second, and all due at one instant (a cron-like burst: every timer of a
    // set due at midnight).
    for (spread_ms, when) in [(1_000, "within 1 s"), (0, "at one instant")] {
        let ((b50, b99), (r50, r99)) = lateness(addr, cfg, due_timers, spread_ms).await;
        let scenario = format!("timer lateness, {due_timers} due {when}");
        for (metric, broker, raw) in [("p50 ms", b50, r50), ("p99 ms", b99, r99)] {
            rows.push(Row::new(
                scenario.clone(),
                metric,
                broker,
                "raw SKIP LOCKED, 10 ms poll",
                raw,
            ));
        }
    }
    eprintln!("measured timer lateness");
    rows
}
