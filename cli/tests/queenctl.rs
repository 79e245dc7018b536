//! queenctl against an in-process broker (the embedded backend): every command's table, its
//! JSON form, a requeue and a seek that change the broker, and a failure's exit status.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing

use std::net::SocketAddr;
use std::sync::Arc;

use queen_core::storage::StorageSet;
use queen_raw_client::Client;
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;
use queen_server::wall_now;
use queen_storage_sim::{SimBugs, SimDb};
use serde_json::{json, Value};

async fn broker() -> SocketAddr {
    let db = SimDb::new(1, Arc::new(wall_now), SimBugs::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Broker::new(ServerConfig::default(), StorageSet::of(db), 3);
    queen_server::tasks::start(&app);
    tokio::spawn(queen_server::serve_listener(app, listener));
    addr
}

/// Runs queenctl; (exit success, stdout, stderr).
async fn queenctl(addr: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_queenctl"))
            .arg("--url")
            .arg(format!("http://{addr}"))
            .args(&args)
            .env_remove("QUEEN_TOKEN")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

async fn ok(addr: SocketAddr, args: &[&str]) -> String {
    let (success, out, err) = queenctl(addr, args).await;
    assert!(success, "queenctl {args:?} failed: {err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command() {
    let addr = broker().await;
    let mut c = Client::connect(addr).await;
    let r = c
        .post(
            "/api/v1/configure",
            &json!({"queue": "ctl", "options": {"retryLimit": 0}}),
        )
        .await;
    assert_eq!(r.status, 200);
    let items: Vec<Value> = (0..4)
        .map(|i| json!({"queue": "ctl", "partition": "p", "payload": {"i": i}, "transactionId": format!("t{i}")}))
        .collect();
    let r = c.post("/api/v1/push", &json!({ "items": items })).await;
    assert_eq!(r.status, 201);
    let pid = r.json()[0]["partitionId"].as_str().unwrap().to_string();
    // Queue mode dead-letters one message; group g reads nothing yet.
    let popped = c
        .get("/api/v1/pop/queue/ctl?batch=1&wait=false")
        .await
        .json();
    let m = &popped["messages"][0];
    let r = c
        .post(
            "/api/v1/ack",
            &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "status": "failed", "error": "bad card"}),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = c
        .get("/api/v1/pop/queue/ctl?batch=1&wait=false&consumerGroup=g&autoAck=true")
        .await;
    assert_eq!(r.status, 200);

    let out = ok(addr, &["queues"]).await;
    let row = out.lines().find(|l| l.starts_with("ctl ")).expect(&out);
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["ctl", "2", "4", "3", "0", "1"],
        "queue, partitions, stored, pending, in flight, dead letters:\n{out}"
    );
    let out = ok(addr, &["queue", "ctl"]).await;
    assert!(out.contains("g:3"), "{out}");
    assert!(!out.contains("the next page"), "{out}");
    let out = ok(addr, &["queue", "ctl", "--limit", "1"]).await;
    let next = out
        .lines()
        .find_map(|l| l.strip_prefix("1 of 2 partitions; the next page: --after "))
        .unwrap_or_else(|| panic!("no next page named:\n{out}"));
    let out = ok(addr, &["queue", "ctl", "--after", next]).await;
    assert!(
        out.contains("g:3") && !out.contains(&format!("{next} ")),
        "{out}"
    );

    let out = ok(addr, &["lag", "--group", "g"]).await;
    let row = out.lines().find(|l| l.starts_with("g ")).expect(&out);
    assert_eq!(row.split_whitespace().nth(3), Some("3"), "{out}");
    let out = ok(addr, &["lag", "--min-seconds", "3600"]).await;
    assert!(out.contains("(none)"), "{out}");

    let out = ok(addr, &["dlq", "list", "ctl"]).await;
    assert!(
        out.contains("bad card") && out.contains("1 dead letters in all"),
        "{out}"
    );
    let listing: Value =
        serde_json::from_str(&ok(addr, &["--json", "dlq", "list", "ctl"]).await).unwrap();
    let id = listing["messages"][0]["dlqId"]
        .as_i64()
        .unwrap()
        .to_string();
    let out = ok(addr, &["dlq", "requeue", &id]).await;
    assert!(out.contains("requeued") && out.contains("ctl/p"), "{out}");
    let listing: Value =
        serde_json::from_str(&ok(addr, &["--json", "dlq", "list", "ctl"]).await).unwrap();
    assert_eq!(listing["total"], 0, "the requeue removed the dead letter");

    let out = ok(addr, &["message", &pid, "t1"]).await;
    assert!(
        out.contains("ctl/p t1") && out.contains(r#"payload: {"i":1}"#),
        "{out}"
    );
    let out = ok(addr, &["messages", "ctl", "--limit", "2"]).await;
    assert_eq!(out.lines().count(), 3, "a header and two messages:\n{out}");

    let out = ok(addr, &["seek", "g", "ctl", "--to-end"]).await;
    assert!(
        out.contains("moved 2 cursors"),
        "both partitions, Default too: {out}"
    );
    let lag: Value = serde_json::from_str(&ok(addr, &["--json", "lag"]).await).unwrap();
    let g = lag
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "g")
        .unwrap();
    assert_eq!(
        g["totalLag"], 0,
        "after the seek to the end, g is caught up"
    );

    assert!(ok(addr, &["health"]).await.starts_with("healthy"));

    // A refused request: the broker's error and a failing exit status.
    let (success, _, err) = queenctl(addr, &["queue", "absent"]).await;
    assert!(!success);
    assert!(
        err.contains("404") && err.contains("Queue not found"),
        "{err}"
    );
    let (success, _, err) = queenctl(addr, &["message", "not-a-uuid", "t1"]).await;
    assert!(!success && err.contains("400"), "{err}");
}
