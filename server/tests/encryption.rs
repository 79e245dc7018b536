//! Payload encryption at rest (`encryptionEnabled` with QUEEN_ENCRYPTION_KEY), over real HTTP on
//! both backends: transparent on pop, dead letters and requeue for every push path; the plaintext
//! absent from PostgreSQL's files (a plaintext queue's payload, pushed alongside, is found there:
//! the scan can fail); a queue switched to encrypted on another broker is sealed by a broker that
//! never heard of it; a broker without the key refuses clearly and loses nothing; a broker with a
//! different key does not start.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::sync::Arc;

use common::{request, start, start_pair_with, Client, Store, TestBroker};
use queen_server::config::ServerConfig;
use queen_server::sealing::{check_cluster_key, PayloadCipher};
use serde_json::{json, Value};

const KEY: &str = "6b1d2c3e4f5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const OTHER_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn keyed(key: &str) -> ServerConfig {
    ServerConfig {
        cipher: Some(Arc::new(PayloadCipher::from_hex(key).unwrap())),
        ..ServerConfig::default()
    }
}

async fn configure(b: &TestBroker, queue: &str, options: Value) -> common::Response {
    request(
        b.addr,
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": queue, "options": options})),
    )
    .await
}

/// Pops everything (autoAck) until `n` messages came: their payloads by transactionId.
async fn drain(b: &TestBroker, queue: &str, n: usize) -> std::collections::BTreeMap<String, Value> {
    common::pop_until(b.addr, None, queue, n, "data").await
}

async fn transparent(store: Store) {
    let b = start(store, keyed(KEY)).await;
    let q = "sealed";
    assert_eq!(
        configure(&b, q, json!({"encryptionEnabled": true}))
            .await
            .status,
        200
    );
    // JSON push, a transaction's push, QPB1 plain and QPB1 with client-compressed frames.
    let push =
        json!({"items": [{"queue": q, "transactionId": "json", "payload": {"card": "4111-json"}}]});
    assert_eq!(
        request(b.addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    let tx = json!({"operations": [{"type": "push", "items": [{"queue": q, "transactionId": "txn", "payload": {"card": "4111-txn"}}]}]});
    assert_eq!(
        request(b.addr, "POST", "/api/v1/transaction", Some(&tx))
            .await
            .status,
        200
    );
    let batch = |tx: &str, card: &str| queen_raw_client::wire::Batch {
        queue: q.into(),
        partition: "Default".into(),
        payloads: vec![format!("{{\"card\":\"{card}\"}}").into_bytes()],
        transaction_ids: Some(vec![tx.into()]),
    };
    let mut c = Client::connect(b.addr).await;
    let plain = queen_raw_client::wire::push_plain(&[batch("qpb1", "4111-qpb1")], 0);
    assert_eq!(
        c.post_bytes("/api/v1/push", "application/x-queen-push", &plain)
            .await
            .status,
        201
    );
    let mut seed = 9;
    let (framed, _) = queen_raw_client::wire::push_frames(
        &[batch("qpb1-frames", "4111-frames")],
        false,
        &mut seed,
    );
    assert_eq!(
        c.post_bytes("/api/v1/push", "application/x-queen-push", &framed)
            .await
            .status,
        201
    );
    // A framed pop is answered JSON on a broker with a key; the payloads come back opened.
    let mut fc = Client::connect(b.addr).await;
    let r = fc
        .get(&format!(
            "/api/v1/pop/queue/{q}?batch=100&wait=false&frames=true&autoAck=true"
        ))
        .await;
    assert_eq!(r.status, 200);
    assert!(!r.body.starts_with(b"QPF1"));
    let mut seen: std::collections::BTreeMap<String, Value> = r.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["transactionId"].as_str().unwrap().to_string(),
                m["data"].clone(),
            )
        })
        .collect();
    seen.extend(drain(&b, q, 4 - seen.len()).await);
    let expected: std::collections::BTreeMap<String, Value> = [
        ("json", "4111-json"),
        ("txn", "4111-txn"),
        ("qpb1", "4111-qpb1"),
        ("qpb1-frames", "4111-frames"),
    ]
    .iter()
    .map(|(t, card)| (t.to_string(), json!({"card": card})))
    .collect();
    assert_eq!(seen, expected);

    // A dead letter shows the plaintext, and a requeue delivers it again, opened.
    let dq = "sealed-dlq";
    configure(
        &b,
        dq,
        json!({"encryptionEnabled": true, "retryLimit": 0, "retryDelay": 0}),
    )
    .await;
    let push =
        json!({"items": [{"queue": dq, "transactionId": "d1", "payload": {"card": "4111-dlq"}}]});
    request(b.addr, "POST", "/api/v1/push", Some(&push)).await;
    let popped = request(
        b.addr,
        "GET",
        &format!("/api/v1/pop/queue/{dq}?wait=false"),
        None,
    )
    .await
    .json();
    let m = &popped["messages"][0];
    assert_eq!(m["data"], json!({"card": "4111-dlq"}));
    let ack = json!({"transactionId": "d1", "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "failed"});
    request(b.addr, "POST", "/api/v1/ack", Some(&ack)).await;
    let dlq = request(b.addr, "GET", &format!("/api/v1/dlq?queue={dq}"), None)
        .await
        .json();
    assert_eq!(
        dlq["messages"][0]["data"],
        json!({"card": "4111-dlq"}),
        "{dlq}"
    );
    let id = dlq["messages"][0]["dlqId"].as_i64().unwrap();
    let requeued = request(b.addr, "POST", &format!("/api/v1/dlq/{id}/requeue"), None).await;
    assert_eq!(requeued.status, 200);
    let again = drain(&b, dq, 1).await;
    assert_eq!(
        again.values().collect::<Vec<_>>(),
        vec![&json!({"card": "4111-dlq"})]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_on_every_path_memory() {
    transparent(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_on_every_path_postgres() {
    transparent(Store::Postgres("enc_transparent")).await;
}

/// Every file under the PostgreSQL data directory that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(p.display().to_string());
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_never_reaches_the_database_files() {
    let b = start(Store::Postgres("enc_files"), keyed(KEY)).await;
    configure(&b, "vault", json!({"encryptionEnabled": true})).await;
    configure(&b, "open", json!({})).await;
    let unique = uuid::Uuid::now_v7().simple().to_string();
    let secret = format!("SECRET-{unique}");
    let control = format!("CONTROL-{unique}");
    for (q, marker) in [("vault", &secret), ("open", &control)] {
        let push = json!({"items": [{"queue": q, "payload": {"marker": marker}}]});
        assert_eq!(
            request(b.addr, "POST", "/api/v1/push", Some(&push))
                .await
                .status,
            201
        );
    }
    let pg = b.pg.as_ref().unwrap();
    let client = pg.pool().get().await.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    let row = client.query_one("SHOW data_directory", &[]).await.unwrap();
    let dir = std::path::PathBuf::from(row.get::<_, String>(0));
    // The scan can fail: the plaintext queue's payload is in the files as it was sent.
    assert!(
        !files_holding(&dir, control.as_bytes()).is_empty(),
        "the control payload should be found in {}",
        dir.display()
    );
    assert_eq!(files_holding(&dir, secret.as_bytes()), Vec::<String>::new());
    // And the broker still serves it.
    let seen = drain(&b, "vault", 1).await;
    assert_eq!(seen.values().next(), Some(&json!({"marker": secret})));
}

/// The frames of every segment of a queue, as stored.
async fn stored_frames(b: &TestBroker, queue: &str) -> Vec<queen_core::frames::Frame> {
    let client = b.pg.as_ref().unwrap().pool().get().await.unwrap();
    let rows = client
        .query(
            "SELECT s.blob, s.msg_count FROM queen.log_segments s
               JOIN queen.log_partitions p ON p.id = s.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = $1 ORDER BY s.base_offset",
            &[&queue],
        )
        .await
        .unwrap();
    rows.iter()
        .flat_map(|r| {
            let n = r.get::<_, i32>(1) as usize;
            queen_core::frames::slice_blob(&r.get::<_, Vec<u8>>(0), 0, n, n).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_switched_on_another_broker_is_sealed() {
    let (a, b) = start_pair_with("enc_switch", keyed(KEY), keyed(KEY)).await;
    let q = "switched";
    configure(&a, q, json!({})).await;
    let push =
        |tx: &str| json!({"items": [{"queue": q, "transactionId": tx, "payload": {"tx": tx}}]});
    assert_eq!(
        request(b.addr, "POST", "/api/v1/push", Some(&push("before")))
            .await
            .status,
        201
    );
    // A switches the queue on; B has cached nothing about it and pushes plaintext, which
    // storage refuses in the push's transaction: B seals and pushes again.
    configure(&a, q, json!({"encryptionEnabled": true})).await;
    assert_eq!(
        request(b.addr, "POST", "/api/v1/push", Some(&push("after")))
            .await
            .status,
        201
    );
    let frames = stored_frames(&b, q).await;
    let sealed: Vec<(String, bool)> = frames
        .iter()
        .map(|f| (f.transaction_id.clone(), f.encrypted))
        .collect();
    assert_eq!(
        sealed,
        vec![("before".into(), false), ("after".into(), true)]
    );
    // Both read back through either broker.
    let seen = drain(&a, q, 2).await;
    assert_eq!(seen.get("after"), Some(&json!({"tx": "after"})));
    assert_eq!(seen.get("before"), Some(&json!({"tx": "before"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_the_key_refuses_and_loses_nothing() {
    let (keyed_broker, keyless) =
        start_pair_with("enc_keyless", keyed(KEY), ServerConfig::default()).await;
    let q = "locked";
    let refused = configure(&keyless, q, json!({"encryptionEnabled": true})).await;
    assert_eq!(refused.status, 400);
    assert!(refused.json()["error"]
        .as_str()
        .unwrap()
        .contains("QUEEN_ENCRYPTION_KEY"));
    configure(
        &keyed_broker,
        q,
        json!({"encryptionEnabled": true, "leaseTime": 300}),
    )
    .await;
    let push = json!({"items": [{"queue": q, "transactionId": "k1", "payload": {"n": 1}}]});
    let r = request(keyless.addr, "POST", "/api/v1/push", Some(&push)).await;
    assert_eq!(r.status, 500, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("nothing was stored"));
    assert!(stored_frames(&keyed_broker, q).await.is_empty());
    // A message sealed by the keyed broker: the keyless one cannot open it, answers 500 and
    // gives the lease back at once (the keyed broker gets it without waiting out 300 s).
    assert_eq!(
        request(keyed_broker.addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    let r = request(
        keyless.addr,
        "GET",
        &format!("/api/v1/pop/queue/{q}?wait=false"),
        None,
    )
    .await;
    assert_eq!(r.status, 500);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("no QUEEN_ENCRYPTION_KEY"));
    let got = request(
        keyed_broker.addr,
        "GET",
        &format!("/api/v1/pop/queue/{q}?wait=false"),
        None,
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["messages"][0]["data"], json!({"n": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_key_check() {
    // On the model: the first key's check is stored; the same key passes, another does not,
    // and no key does not once a key is in use.
    let b = start(Store::Memory, ServerConfig::default()).await;
    let admin = &*b.app.storage.admin;
    let key = PayloadCipher::from_hex(KEY).unwrap();
    let other = PayloadCipher::from_hex(OTHER_KEY).unwrap();
    assert!(
        check_cluster_key(admin, None).await.is_ok(),
        "no key anywhere yet"
    );
    assert!(check_cluster_key(admin, Some(&key)).await.is_ok());
    assert!(check_cluster_key(admin, Some(&key)).await.is_ok());
    let e = check_cluster_key(admin, Some(&other)).await.unwrap_err();
    assert!(e.contains("not the key"), "{e}");
    assert!(check_cluster_key(admin, None).await.is_err());
}

/// The real binary against PostgreSQL: started with the cluster's key it serves; with another
/// key, or none, it exits at once with the reason, before it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_another_key() {
    let name = format!("enc_binary_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let url = {
        let base = queen_storage_pg::testing::database_url();
        let (head, _) = base.rsplit_once('/').unwrap();
        format!("{head}/{name}")
    };
    drop(cfg);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let run = |key: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_queen"));
        cmd.env_clear()
            .env("DATABASE_URL", &url)
            .env("PORT", port.to_string())
            .env("HOST", "127.0.0.1")
            .env("RETENTION_INTERVAL", "0")
            .env("EVICTION_INTERVAL", "0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(k) = key {
            cmd.env("QUEEN_ENCRYPTION_KEY", k);
        }
        cmd
    };
    // The first broker with a key sets the cluster's; it serves.
    let mut first = run(Some(KEY)).spawn().unwrap();
    let mut up = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            use tokio::io::AsyncWriteExt;
            let _ = s
                .write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
                .await;
            up = true;
            break;
        }
    }
    assert!(up, "the broker with the cluster's key serves");
    let _ = first.kill();
    let _ = first.wait();
    for (key, why) in [
        (Some(OTHER_KEY), "not the key"),
        (None, "QUEEN_ENCRYPTION_KEY is not set"),
    ] {
        let out = run(key).output().unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(stderr.contains(why), "{stderr}");
        assert!(
            !stderr.contains(OTHER_KEY) && !stderr.contains(KEY),
            "the key is never logged"
        );
    }
    queen_storage_pg::testing::drop_database(&name).await;
}
