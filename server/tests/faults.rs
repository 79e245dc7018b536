//! PostgreSQL going away under live traffic: every connection of two brokers terminated, again and
//! again, while producers push through one broker and consumers long-poll and ack through the
//! other. Meanwhile pushes and acks answer 503 with Retry-After (never a 500), pops park or
//! answer 204; afterwards the pools and the LISTEN connections heal by themselves, and every push a
//! producer saw confirmed is delivered. Requires DATABASE_URL (`bash .ci/test`).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{request, start_pair, Client};
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

/// Terminates every connection to the brokers' database but the caller's.
async fn terminate_all(cfg: &tokio_postgres::Config) -> u64 {
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("admin");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate");
    row.get::<_, i64>(0) as u64
}

#[derive(Default)]
struct Seen {
    /// Answers by status, per kind of request.
    statuses: BTreeMap<(&'static str, u16), u64>,
    /// 503 answers without a Retry-After header.
    missing_retry_after: u64,
    confirmed: Vec<String>,
    delivered: BTreeMap<String, u32>,
    failed_acks: u64,
}

fn note(seen: &Mutex<Seen>, kind: &'static str, r: &common::Response) {
    let mut s = seen.lock().unwrap();
    *s.statuses.entry((kind, r.status)).or_default() += 1;
    if r.status == 503 && r.header("retry-after").is_none() {
        s.missing_retry_after += 1;
    }
}

/// Runs the push, long-poll and ack load (producers on `push_at`, consumers of group g on
/// `pop_at`) while `outage` runs, then waits for both brokers' health, drains the queue and
/// checks: no 500, every 503 with Retry-After, no confirmed push lost, a message delivered
/// twice only after a failed ack. Returns what was seen, for the caller's own checks.
async fn under_load<F: std::future::Future<Output = ()>>(
    push_at: std::net::SocketAddr,
    pop_at: std::net::SocketAddr,
    outage: F,
) -> Seen {
    let (a_addr, b_addr) = (push_at, pop_at);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for producer in 0..2 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), a_addr);
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let tx = format!("p{producer}-{n}");
                let body = json!({"items": [{"queue": "faults", "partition": format!("part{}", n % 4),
                                             "transactionId": tx, "payload": {"n": n}}]});
                let r = c.post("/api/v1/push", &body).await;
                note(&seen, "push", &r);
                match r.status {
                    201 => seen.lock().unwrap().confirmed.push(tx),
                    503 => tokio::time::sleep(Duration::from_millis(20)).await,
                    s => panic!("a push answered {s}: {:?}", String::from_utf8_lossy(&r.body)),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for _ in 0..2 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), b_addr);
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .get("/api/v1/pop/queue/faults?wait=true&timeout=1000&batch=10&consumerGroup=g&leaseSeconds=2")
                    .await;
                note(&seen, "pop", &r);
                match r.status {
                    200 => {}
                    204 => continue,
                    503 => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    s => panic!("a pop answered {s}: {:?}", String::from_utf8_lossy(&r.body)),
                }
                let body = r.json();
                let msgs = body["messages"].as_array().cloned().unwrap_or_default();
                let acks: Vec<Value> = msgs
                    .iter()
                    .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                    "leaseId": m["leaseId"]}))
                    .collect();
                {
                    let mut s = seen.lock().unwrap();
                    for m in &msgs {
                        let tx = m["transactionId"].as_str().unwrap().to_string();
                        *s.delivered.entry(tx).or_default() += 1;
                    }
                }
                let r = c
                    .post(
                        "/api/v1/ack/batch",
                        &json!({"consumerGroup": "g", "acknowledgments": acks}),
                    )
                    .await;
                note(&seen, "ack", &r);
                let all_acked = r.status == 200
                    && r.json()
                        .as_array()
                        .is_some_and(|a| a.iter().all(|o| o["success"] == true));
                if !all_acked {
                    seen.lock().unwrap().failed_acks += 1;
                }
                if !matches!(r.status, 200 | 503) {
                    panic!("an ack answered {}", r.status);
                }
            }
        }));
    }
    outage.await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // The brokers heal by themselves: health, and a push through A reaching a consumer of B
    // (which needs B's LISTEN connection back, or B's re-checks).
    let healed = Instant::now();
    loop {
        let ha = request(a_addr, "GET", "/health", None).await;
        let hb = request(b_addr, "GET", "/health", None).await;
        if ha.status == 200 && hb.status == 200 {
            break;
        }
        assert_eq!(ha.status.max(hb.status), 503, "health is 200 or 503");
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "still unhealthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Drain what is left, then every confirmed push must have been delivered. A batch whose ack
    // failed comes back when its 2 s lease ends: the drain waits longer than that.
    let mut c = Client::connect(b_addr).await;
    loop {
        let r = c
            .get("/api/v1/pop/queue/faults?wait=true&timeout=3000&batch=100&consumerGroup=g&leaseSeconds=2")
            .await;
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        let body = r.json();
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                            "leaseId": m["leaseId"]})
            })
            .collect();
        {
            let mut s = seen.lock().unwrap();
            for m in &msgs {
                *s.delivered
                    .entry(m["transactionId"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        let r = c
            .post(
                "/api/v1/ack/batch",
                &json!({"consumerGroup": "g", "acknowledgments": acks}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    let s = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!(
        "answers {:?}; {} confirmed, {} failed acks",
        s.statuses,
        s.confirmed.len(),
        s.failed_acks
    );
    assert!(
        s.statuses.keys().all(|(_, status)| *status != 500),
        "a 500 during the outages: {:?}",
        s.statuses
    );
    assert_eq!(s.missing_retry_after, 0, "a 503 without Retry-After");
    assert!(
        !s.statuses.contains_key(&("pop", 503)),
        "a pop answered 503: with storage away it parks, or answers 204 at its deadline"
    );
    assert!(
        s.confirmed.len() > 10,
        "too little traffic to mean anything"
    );
    let lost: Vec<&String> = s
        .confirmed
        .iter()
        .filter(|t| !s.delivered.contains_key(*t))
        .collect();
    assert!(
        lost.is_empty(),
        "confirmed pushes never delivered: {lost:?}"
    );
    let twice = s.delivered.values().filter(|n| **n > 1).count();
    assert!(
        twice == 0 || s.failed_acks > 0,
        "{twice} messages delivered twice with every ack successful"
    );
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_heal_and_lose_no_confirmed_push() {
    let (a, b) = start_pair("queen_faults_terminate", ServerConfig::default()).await;
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(&format!(
        "queen_faults_terminate_{}",
        std::process::id()
    ));
    let terminated = Arc::new(AtomicU64::new(0));
    let outage = {
        let terminated = terminated.clone();
        async move {
            // Three outages, 0.7 s apart, under the load.
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(700)).await;
                terminated.fetch_add(terminate_all(&cfg).await, Ordering::Relaxed);
            }
        }
    };
    under_load(a.addr, b.addr, outage).await;
    assert!(
        terminated.load(Ordering::Relaxed) > 0,
        "the outages terminated no connection"
    );
}

/// A PostgreSQL of this test's own (the shared one serves every other test), started with the
/// test command's own script so an outage can stop and restart it. Stopped and removed on drop.
struct PrivatePg {
    dir: String,
    port: String,
    bin: String,
}

impl PrivatePg {
    fn script(&self, command: &str) -> std::process::Command {
        let mut c = std::process::Command::new("bash");
        c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .arg("-c")
            .arg(format!(". .ci/pg.sh && {command}"))
            .env("PG_DIR", &self.dir)
            .env("PG_PORT", &self.port)
            .env("PG_BIN", &self.bin)
            .env("PG_STARTED", "1");
        c
    }

    fn start() -> PrivatePg {
        let out = std::process::Command::new("bash")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .arg("-c")
            .arg(". .ci/pg.sh && pg_start 2>/dev/null && echo \"$PG_DIR $PG_PORT $PG_BIN\"")
            .env_remove("DATABASE_URL")
            .output()
            .expect("run .ci/pg.sh");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let parts: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(parts.len(), 3, "pg_start printed {text:?}");
        PrivatePg {
            dir: parts[0].into(),
            port: parts[1].into(),
            bin: parts[2].into(),
        }
    }

    fn config(&self) -> tokio_postgres::Config {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
            .parse()
            .expect("url")
    }

    /// Stops the server, waits, starts it again on the same port (blocking: run it off the
    /// runtime's workers).
    fn pause(&self, secs: u32) {
        let status = self
            .script(&format!("pg_pause {secs}"))
            .status()
            .expect("pg_pause");
        assert!(status.success(), "pg_pause failed");
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.script("pg_stop").status();
    }
}

/// PostgreSQL stopped for 3 s and started again under the load, with two brokers on it: they
/// answer 503 meanwhile (health included), then heal by themselves, LISTEN included (the
/// consumers are on the other broker), and no confirmed push is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_heals_and_loses_no_confirmed_push() {
    let pg = Arc::new(PrivatePg::start());
    let mut brokers = vec![];
    for seed in 0..2u64 {
        let storage = queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
            pg: pg.config(),
            pool_size: 8,
        })
        .await
        .expect("connect");
        let app = queen_server::app::App::new(
            ServerConfig::default(),
            queen_core::storage::StorageSet::of(Arc::new(storage)),
            seed,
        );
        queen_server::spawn_event_listener(app.clone(), pg.config());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(queen_server::serve_listener(app.clone(), listener));
        brokers.push((app, addr));
    }
    let (a, b) = (brokers[0].1, brokers[1].1);
    let unhealthy_meanwhile = Arc::new(AtomicBool::new(false));
    let outage = {
        let (pg, unhealthy) = (pg.clone(), unhealthy_meanwhile.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let paused = tokio::task::spawn_blocking(move || pg.pause(3));
            // While it is down, health says so.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            if request(a, "GET", "/health", None).await.status == 503 {
                unhealthy.store(true, Ordering::Relaxed);
            }
            paused.await.unwrap();
        }
    };
    let seen = under_load(a, b, outage).await;
    assert!(
        unhealthy_meanwhile.load(Ordering::Relaxed),
        "/health was not 503 while PostgreSQL was down"
    );
    assert!(
        seen.statuses.get(&("push", 503)).copied().unwrap_or(0) > 0,
        "no push met the outage: {:?}",
        seen.statuses
    );
}
