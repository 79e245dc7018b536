//! The retention worker over real HTTP: brokers with a short RETENTION_INTERVAL remove what every
//! group consumed once it is old enough, hold back what a lagging group has not read, and leave
//! the tables empty once everything is consumed; two brokers on one PostgreSQL share the work
//! under the maintenance lease.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{metrics, start, start_pair, Client, Store};
use queen_server::config::RetentionSettings;
use queen_server::config::ServerConfig;
use serde_json::json;

fn config() -> ServerConfig {
    ServerConfig {
        retention: RetentionSettings {
            interval_ms: 200,
            batch_size: 2,
            ..RetentionSettings::default()
        },
        ..ServerConfig::default()
    }
}

const QUEUE: &str = "kept-short";
const PARTITIONS: usize = 5;
const PUSHES: usize = 4;

async fn fill(addr: SocketAddr) {
    let mut c = Client::connect(addr).await;
    let r = c
        .post(
            "/api/v1/configure",
            &json!({"queue": QUEUE, "options": {"retentionEnabled": true, "completedRetentionSeconds": 1}}),
        )
        .await;
    assert_eq!(r.status, 200);
    for round in 0..PUSHES {
        for p in 0..PARTITIONS {
            let items: Vec<_> = (0..3)
                .map(|i| json!({"queue": QUEUE, "partition": format!("p{p}"), "payload": {"i": i}, "transactionId": format!("{round}-{p}-{i}")}))
                .collect();
            let r = c.post("/api/v1/push", &json!({ "items": items })).await;
            assert_eq!(r.status, 201);
        }
    }
}

/// Pops and acks everything the group has, through `addr`; how many messages.
async fn drain(addr: SocketAddr, group: &str) -> usize {
    let mut c = Client::connect(addr).await;
    let mut n = 0;
    loop {
        let r = c
            .get(&format!(
                "/api/v1/pop/queue/{QUEUE}?batch=50&wait=false&consumerGroup={group}"
            ))
            .await;
        if r.status == 204 {
            return n;
        }
        assert_eq!(r.status, 200);
        let msgs = r.json()["messages"].as_array().unwrap().clone();
        n += msgs.len();
        let acks: Vec<_> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}))
            .collect();
        let r = c
            .post(
                "/api/v1/ack/batch",
                &json!({"acknowledgments": acks, "consumerGroup": group}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
}

/// Waits until `done` holds, up to 15 s (retention runs every 200 ms).
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "retention never got there: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn removed_messages(addrs: &[SocketAddr]) -> u64 {
    let mut n = 0;
    for a in addrs {
        n += metrics(*a).await["retentionRemoved"]["messages"]
            .as_u64()
            .unwrap();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_the_memory_backend() {
    let broker = start(Store::Memory, config()).await;
    retention_cycle(&[broker.addr]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_postgres_with_two_brokers() {
    let (a, b) = start_pair("queen_retention", config()).await;
    retention_cycle(&[a.addr, b.addr]).await;
    let pg = a.pg.as_ref().unwrap();
    let client = pg.pool().get().await.unwrap();
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM queen.log_segments) + (SELECT count(*) FROM queen.log_txids)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "segments and transactionId rows are all gone");
}

/// A lagging group holds everything back; once it catches up, everything goes. Pops and acks go
/// through every broker in turn.
async fn retention_cycle(addrs: &[SocketAddr]) {
    let total = (PARTITIONS * PUSHES * 3) as u64;
    fill(addrs[0]).await;
    // `slow` makes first contact and consumes one message...
    let mut c = Client::connect(addrs[addrs.len() - 1]).await;
    let r = c
        .get(&format!(
            "/api/v1/pop/queue/{QUEUE}?batch=1&wait=false&consumerGroup=slow"
        ))
        .await;
    assert_eq!(r.status, 200);
    let m = &r.json()["messages"][0];
    let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed", "consumerGroup": "slow"});
    assert_eq!(c.post("/api/v1/ack", &ack).await.status, 200);
    // ... while `fast` consumes everything.
    assert_eq!(drain(addrs[0], "fast").await as u64, total);
    // Passes go by and nothing is removed: every segment holds something slow has not read.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        removed_messages(addrs).await,
        0,
        "slow holds everything back"
    );
    assert_eq!(
        drain(addrs[addrs.len() - 1], "slow").await as u64,
        total - 1
    );
    eventually(
        "everything consumed by both groups is removed",
        async || removed_messages(addrs).await == total,
    )
    .await;
}
