//! PostgreSQL going away under live traffic: every connection of two brokers terminated, again and
//! again, while producers push through one broker and consumers long-poll and ack through the
//! other. Meanwhile requests answer 503 with Retry-After (never a 500), pops park or answer
//! 204; afterwards the pools and the LISTEN connections heal by themselves, and every push a
//! producer saw confirmed is delivered. Requires DATABASE_URL (`bash .ci/test`).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_heal_and_lose_no_confirmed_push() {
    let config = ServerConfig::default();
    let (a, b) = start_pair("queen_faults_terminate", config).await;
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(&format!(
        "queen_faults_terminate_{}",
        std::process::id()
    ));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for producer in 0..2 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), a.addr);
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
        let (seen, stop, addr) = (seen.clone(), stop.clone(), b.addr);
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
    // Three outages, a second apart, under the load.
    let mut terminated = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        terminated += terminate_all(&cfg).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(terminated > 0, "the outages terminated no connection");
    // The brokers heal by themselves: health, and a push through A reaching a consumer of B
    // (which needs B's LISTEN connection back, or B's re-checks).
    let healed = Instant::now();
    loop {
        let ha = request(a.addr, "GET", "/health", None).await;
        let hb = request(b.addr, "GET", "/health", None).await;
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
    let mut c = Client::connect(b.addr).await;
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
    let s = seen.lock().unwrap();
    eprintln!(
        "terminated {terminated} connections; answers {:?}; {} confirmed, {} failed acks",
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
}
