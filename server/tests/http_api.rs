//! The HTTP API over real sockets, on the in-memory backend and on PostgreSQL.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::time::{Duration, Instant};

use common::{metrics, request, start, Client, Store};
use queen_core::rng::SeededRng;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

async fn round_trip(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let a = b.addr;
    let mut c = Client::connect(a).await;
    let r = c.post("/api/v1/configure", &json!({"queue": "my queue", "namespace": null, "task": null, "options": {"leaseTime": 30, "retryLimit": 2}})).await;
    assert_eq!(r.status, 200);
    let cfg = r.json();
    assert_eq!(cfg["configured"], true);
    assert_eq!(cfg["options"]["leaseTime"], 30);
    assert_eq!(
        cfg["options"].as_object().unwrap().len(),
        15,
        "all 15 options echoed"
    );

    push_pop_renew_and_ack(&mut c).await;
    consumer_groups_and_auto_ack(&mut c).await;
    discovery_and_maintenance(&mut c).await;
    delete_health_and_metrics(&mut c).await;
}

/// Push (per-item status, duplicates), pop a named partition, renew, the lease's 204, acks.
async fn push_pop_renew_and_ack(c: &mut Client) {
    // Push: 201, per-item status, duplicate answers the original id.
    let items = json!({"items": [
        {"queue": "my queue", "partition": "p/1", "payload": {"n": 1}, "transactionId": "t1"},
        {"queue": "my queue", "partition": "p/1", "data": null, "transactionId": "t2"},
        {"queue": "my queue", "partition": "p/1", "payload": {"n": 1}, "transactionId": "t1"}]});
    let r = c.post("/api/v1/push", &items).await;
    assert_eq!(r.status, 201);
    let out = r.json();
    assert_eq!(out[0]["status"], "queued");
    assert_eq!(out[1]["status"], "queued");
    assert_eq!(out[2]["status"], "duplicate");
    assert_eq!(out[2]["message_id"], out[0]["message_id"]);

    // Pop the named partition (percent-encoded path segments are decoded).
    let r = c
        .get("/api/v1/pop/queue/my%20queue/partition/p%2F1?batch=10&wait=true&timeout=2000")
        .await;
    assert_eq!(r.status, 200);
    let p = r.json();
    let msgs = p["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    for m in msgs {
        for key in [
            "partitionId",
            "transactionId",
            "leaseId",
            "createdAt",
            "partition",
            "consumerGroup",
        ] {
            assert!(
                m[key].as_str().is_some_and(|s| !s.is_empty()),
                "{key} missing in {m}"
            );
        }
        assert!(m.get("data").is_some());
    }
    assert_eq!(msgs[0]["data"], json!({"n": 1}));
    assert_eq!(msgs[1]["data"], Value::Null);
    let lease = p["leaseId"].as_str().unwrap().to_string();
    let pid = msgs[0]["partitionId"].as_str().unwrap().to_string();

    // Renewal with an empty body means {} (60 s).
    let r = c
        .send("POST", &format!("/api/v1/lease/{lease}/extend"), None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["success"], true);

    // Leased: another pop gets 204 with no body.
    let r = c.get("/api/v1/pop/queue/my%20queue?wait=false").await;
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-length").unwrap_or("0"), "0");

    // Batch ack with per-item success; the lease is released.
    let r = c
        .post(
            "/api/v1/ack/batch",
            &json!({"consumerGroup": null, "acknowledgments": [
            {"transactionId": "t1", "partitionId": pid, "status": "completed", "leaseId": lease},
            {"transactionId": "t2", "partitionId": pid, "status": "completed", "leaseId": lease}]}),
        )
        .await;
    assert_eq!(r.status, 200);
    let acks = r.json();
    assert!(
        acks.as_array()
            .unwrap()
            .iter()
            .all(|a| a["success"] == true && a["error"].is_null()),
        "{acks}"
    );
    // Re-acking a committed message is idempotent, whatever lease it names (a retried
    // transaction arrives after its lease was released); an unknown message is refused with
    // 200 + success:false.
    let r = c.post("/api/v1/ack", &json!({"transactionId": "t1", "partitionId": pid, "leaseId": "00000000-0000-7000-8000-000000000000"})).await;
    assert_eq!(r.json()[0]["success"], true);
    let r = c
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "nope", "partitionId": pid}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["success"], false);
    assert_eq!(r.json()[0]["error"], queen_core::storage::ACK_NOT_FOUND);
}

/// Consumer groups and autoAck.
async fn consumer_groups_and_auto_ack(c: &mut Client) {
    // Consumer groups and autoAck.
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "my queue", "partition": "p2", "payload": 3}]}),
    )
    .await;
    let r = c.get("/api/v1/pop/queue/my%20queue?consumerGroup=g1&autoAck=true&batch=10&partitions=5&wait=false").await;
    assert_eq!(r.status, 200);
    let p = r.json();
    assert_eq!(p["leaseId"], "");
    assert_eq!(
        p["messages"].as_array().unwrap().len(),
        3,
        "a new group (mode all) sees everything: {p}"
    );
    let r = c
        .get("/api/v1/pop/queue/my%20queue?consumerGroup=g1&autoAck=true&wait=false")
        .await;
    assert_eq!(r.status, 204, "autoAck committed");
}

/// A discovery pop needs a namespace or task; in maintenance mode pops answer 204 at once.
async fn discovery_and_maintenance(c: &mut Client) {
    // Discovery pop needs a namespace or task.
    assert_eq!(c.get("/api/v1/pop?wait=false").await.status, 400);
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "billing.invoice", "payload": 1}]}),
    )
    .await;
    let r = c.get("/api/v1/pop?namespace=billing&wait=false").await;
    assert_eq!(r.status, 200, "discovery finds billing.invoice");

    // Maintenance mode: pops answer 204 at once.
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "m", "payload": 1}]}),
    )
    .await;
    assert_eq!(
        c.post("/api/v1/system/maintenance/pop", &json!({"enabled": true}))
            .await
            .json()["popMaintenanceMode"],
        true
    );
    assert_eq!(
        c.get("/api/v1/pop/queue/m?wait=true&timeout=5000")
            .await
            .status,
        204
    );
    c.post("/api/v1/system/maintenance/pop", &json!({"enabled": false}))
        .await;
    assert_eq!(c.get("/api/v1/pop/queue/m?wait=false").await.status, 200);
}

/// Deleting a queue; health and the Prometheus text.
async fn delete_health_and_metrics(c: &mut Client) {
    // Delete.
    let r = c
        .send("DELETE", "/api/v1/resources/queues/my%20queue", None)
        .await;
    assert_eq!(
        r.json(),
        json!({"deleted": true, "queue": "my queue", "existed": true})
    );
    assert_eq!(
        c.get("/api/v1/pop/queue/my%20queue?wait=false")
            .await
            .status,
        204
    );

    let h = c.get("/health").await;
    assert_eq!(h.status, 200);
    let m = c.get("/metrics/prometheus").await;
    assert_eq!(
        m.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8_lossy(&m.body);
    for series in [
        "queen_pops_total{outcome=\"messages\"} ",
        "queen_delivery_events_total{kind=\"push\"}",
        "queen_delivery_lag_seconds_bucket{le=\"0.001\"}",
        "queen_delivery_lag_seconds_count ",
        "queen_limiter_limit ",
        "queen_requests_failed_total{class=\"client\"}",
    ] {
        assert!(text.contains(series), "no {series} in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    assert_eq!(c.get("/nope").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_the_memory_backend() {
    round_trip(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_postgres() {
    round_trip(Store::Postgres("queen_http_rt")).await;
}

/// With a re-check interval far longer than the wait, only a wake can deliver in time: the push
/// opens the queue's gate and the parked pop answers at once.
async fn push_wakes_a_parked_pop(store: Store) {
    let config = ServerConfig {
        backoff: queen_core::backoff::WaitBackoff {
            initial_ms: 60_000,
            threshold: 3,
            multiplier: 1.0,
            max_ms: 60_000,
        },
        ..ServerConfig::default()
    };
    let b = start(store, config).await;
    let a = b.addr;
    // Warm the (queue, group) ring: config, first contact and reseed happen here.
    request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "w", "payload": 0}]})),
    )
    .await;
    assert_eq!(
        request(
            a,
            "GET",
            "/api/v1/pop/queue/w?autoAck=true&wait=false",
            None
        )
        .await
        .status,
        200
    );
    let mut lat = vec![];
    for i in 0..20 {
        let waiter = tokio::spawn(async move {
            request(
                a,
                "GET",
                "/api/v1/pop/queue/w?autoAck=true&wait=true&timeout=20000",
                None,
            )
            .await
        });
        while metrics(a).await["parkedPops"].as_u64().unwrap() < 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = Instant::now();
        request(
            a,
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "w", "payload": i}]})),
        )
        .await;
        let r = waiter.await.unwrap();
        lat.push(t.elapsed());
        assert_eq!(
            r.status, 200,
            "the parked pop got the message through the wake"
        );
        assert_eq!(r.json()["messages"][0]["data"], json!(i));
    }
    lat.sort();
    eprintln!("push-to-delivery for a parked consumer (request round trip included): p50 {:?}, p99 {:?}, max {:?}", lat[lat.len() / 2], lat[lat.len() * 99 / 100], lat[lat.len() - 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_wakes_a_parked_pop_on_the_memory_backend() {
    push_wakes_a_parked_pop(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_wakes_a_parked_pop_on_postgres() {
    push_wakes_a_parked_pop(Store::Postgres("queen_http_wake")).await;
}

/// 1,000 long-polls parked on an empty queue for 5 s cost no storage calls; then one push is
/// delivered to exactly one of them.
async fn thousand_parked_long_polls(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let a = b.addr;
    request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "idle", "payload": 0}]})),
    )
    .await;
    assert_eq!(
        request(
            a,
            "GET",
            "/api/v1/pop/queue/idle?autoAck=true&wait=false",
            None
        )
        .await
        .status,
        200
    );
    let mut waiters = vec![];
    for _ in 0..1000 {
        waiters.push(tokio::spawn(async move {
            request(
                a,
                "GET",
                "/api/v1/pop/queue/idle?autoAck=true&wait=true&timeout=9000",
                None,
            )
            .await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics(a).await["parkedPops"].as_u64().unwrap() < 1000 {
        assert!(Instant::now() < deadline, "1,000 pops never all parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = metrics(a).await["storageCalls"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m = metrics(a).await;
    let after = m["storageCalls"].as_u64().unwrap();
    assert_eq!(
        after,
        before,
        "parked long-polls made {} storage calls in 5 s",
        after - before
    );
    assert_eq!(m["parkedPops"].as_u64().unwrap(), 1000);
    request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "idle", "payload": "hello"}]})),
    )
    .await;
    let mut got = 0;
    let mut empty = 0;
    for w in waiters {
        let r = w.await.unwrap();
        match r.status {
            200 => {
                got += 1;
                assert_eq!(r.json()["messages"][0]["data"], "hello");
            }
            204 => empty += 1,
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(
        (got, empty),
        (1, 999),
        "exactly one parked pop gets the message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_parked_long_polls_cost_nothing_on_the_memory_backend() {
    thousand_parked_long_polls(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_parked_long_polls_cost_nothing_on_postgres() {
    thousand_parked_long_polls(Store::Postgres("queen_http_idle")).await;
}

fn malformed(rng: &mut SeededRng, i: usize) -> (String, String, Option<Vec<u8>>) {
    let long = "x".repeat(256);
    let junk_json: [&[u8]; 12] = [
        b"{",
        b"[]",
        b"null",
        b"42",
        b"\"s\"",
        b"{\"items\": 5}",
        b"{\"items\": [5]}",
        b"{\"items\": [{\"queue\": 1}]}",
        b"{\"items\": [{\"partition\": \"p\"}]}",
        b"\xff\xfe",
        b"{\"items\": [{\"queue\": \"q\", \"traceId\": \"nope\"}]}",
        b"",
    ];
    match i % 11 {
        0 => (
            "POST".into(),
            "/api/v1/push".into(),
            Some(junk_json[rng.below(12) as usize].to_vec()),
        ),
        1 => (
            "POST".into(),
            "/api/v1/push".into(),
            Some(format!("{{\"items\":[{{\"queue\":\"{long}\",\"payload\":1}}]}}").into_bytes()),
        ),
        2 => {
            let bad = [
                "batch=0",
                "batch=-1",
                "batch=abc",
                "batch=99999999",
                "timeout=-5",
                "timeout=1e9",
                "wait=maybe",
                "partitions=0",
                "subscriptionFrom=yesterday",
                "autoAck=2",
            ];
            (
                "GET".into(),
                format!(
                    "/api/v1/pop/queue/q?{}",
                    bad[rng.below(bad.len() as u64) as usize]
                ),
                None,
            )
        }
        3 => ("GET".into(), "/api/v1/pop/queue/%ff%fe".into(), None),
        4 => (
            "POST".into(),
            "/api/v1/ack".into(),
            Some(junk_json[rng.below(12) as usize].to_vec()),
        ),
        5 => (
            "POST".into(),
            "/api/v1/ack".into(),
            Some(b"{\"transactionId\":\"t\",\"partitionId\":\"p\",\"status\":\"bogus\"}".to_vec()),
        ),
        6 => (
            "POST".into(),
            "/api/v1/ack/batch".into(),
            Some(b"{\"acknowledgments\":[{\"transactionId\":7}]}".to_vec()),
        ),
        7 => (
            "POST".into(),
            "/api/v1/configure".into(),
            Some(
                [
                    b"{\"options\":{}}".as_slice(),
                    b"{\"queue\":\"q\",\"options\":{\"leaseTime\":-1}}",
                    b"{\"queue\":\"q\",\"options\":5}",
                ][rng.below(3) as usize]
                    .to_vec(),
            ),
        ),
        8 => (
            "POST".into(),
            "/api/v1/lease/abc/extend".into(),
            Some(b"{\"seconds\":\"ten\"}".to_vec()),
        ),
        // A transaction's consumerGroup gets the ack route's name check.
        9 => (
            "POST".into(),
            "/api/v1/transaction".into(),
            Some(
                json!({"operations": [
                    {"type": "push", "items": [{"queue": "tq", "payload": 1}]},
                    {"type": "ack", "transactionId": "t", "partitionId": "p",
                     "consumerGroup": "bad\u{1}group"}]})
                .to_string()
                .into_bytes(),
            ),
        ),
        _ => (
            "GET".into(),
            format!("/api/v1/pop/queue/{long}?wait=false"),
            None,
        ),
    }
}

/// 10,000 malformed requests: every one a 4xx with a JSON error, nothing stored, and the server
/// still serves afterwards.
async fn malformed_requests(store: Store) {
    let b = start(
        store,
        ServerConfig {
            max_body_bytes: 4096,
            ..ServerConfig::default()
        },
    )
    .await;
    let a = b.addr;
    let mut rng = SeededRng::new(11);
    let mut tasks = vec![];
    for t in 0..8usize {
        let mut rng = rng.child(&format!("client{t}"));
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(a).await;
            let mut statuses = vec![];
            for i in 0..1250 {
                let (method, path, body) = malformed(&mut rng, i + t);
                let r = c.send(&method, &path, body.as_deref()).await;
                assert!(
                    r.json().get("error").is_some(),
                    "{method} {path}: no error body"
                );
                statuses.push(r.status);
            }
            // An oversized body: 413, and the connection may close after it.
            let mut c = Client::connect(a).await;
            let big = vec![b'['; 5000];
            statuses.push(c.send("POST", "/api/v1/push", Some(&big)).await.status);
            statuses
        }));
    }
    let _ = rng.next_u64();
    let mut n = 0;
    for t in tasks {
        for s in t.await.unwrap() {
            assert!((400..500).contains(&s), "a malformed request got {s}");
            n += 1;
        }
    }
    assert!(n >= 10_000);
    let names = b
        .app
        .storage
        .pops
        .queues_matching(None, None)
        .await
        .unwrap();
    assert!(names.is_empty(), "bad input changed state: {names:?}");
    let r = request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "ok", "payload": 1}]})),
    )
    .await;
    assert_eq!(r.status, 201, "the server still serves");
    assert_eq!(
        request(a, "GET", "/api/v1/pop/queue/ok?wait=false", None)
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_malformed_requests_on_the_memory_backend() {
    malformed_requests(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_malformed_requests_on_postgres() {
    malformed_requests(Store::Postgres("queen_http_fuzz")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_frees_its_parked_pop() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    let a = b.addr;
    let mut c = Client::connect(a).await;
    c.write_only(b"GET /api/v1/pop/queue/gone?wait=true&timeout=30000 HTTP/1.1\r\nhost: t\r\n\r\n")
        .await;
    while metrics(a).await["parkedPops"].as_u64().unwrap() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(a).await;
        if m["parkedPops"] == 0 && m["pops"]["cancelled"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the parked pop of a gone client was never freed: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_parked_pops_with_204() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    let a = b.addr;
    let waiter = tokio::spawn(async move {
        request(
            a,
            "GET",
            "/api/v1/pop/queue/s?wait=true&timeout=30000",
            None,
        )
        .await
    });
    while metrics(a).await["parkedPops"].as_u64().unwrap() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.app.shutting_down.send_replace(true);
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("answered promptly")
        .unwrap();
    assert_eq!(r.status, 204);
}

/// A storage failure is a 5xx that changes nothing; the broker recovers when storage does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_is_a_5xx_and_loses_nothing() {
    let b = start(Store::Postgres("queen_http_fail"), ServerConfig::default()).await;
    let a = b.addr;
    let pg = b.pg.as_ref().expect("postgres backend");
    let client = pg.pool().get().await.expect("connection");
    let push = json!({"items": [{"queue": "f", "partition": "p", "payload": 1, "transactionId": "t-1"}, {"queue": "f", "partition": "p", "payload": 2, "transactionId": "t-2"}]});
    // Break the segment table: the push fails after creating the queue and partition rows.
    client
        .batch_execute("ALTER TABLE queen.log_segments RENAME TO log_segments_away")
        .await
        .expect("break");
    let r = request(a, "POST", "/api/v1/push", Some(&push)).await;
    assert!(
        r.status >= 500,
        "a storage failure must be a 5xx, got {}",
        r.status
    );
    assert!(r.json().get("error").is_some());
    let r = request(a, "GET", "/api/v1/pop/queue/f?wait=false", None).await;
    assert!(
        r.status >= 500 || r.status == 204,
        "a pop during the failure: {}",
        r.status
    );
    client
        .batch_execute("ALTER TABLE queen.log_segments_away RENAME TO log_segments")
        .await
        .expect("repair");
    drop(client);
    // Nothing half-done: the failed push stored nothing, so the retry is new, not a duplicate.
    let r = request(a, "POST", "/api/v1/push", Some(&push)).await;
    assert_eq!(r.status, 201);
    let out = r.json();
    assert_eq!(out[0]["status"], "queued", "{out}");
    assert_eq!(out[1]["status"], "queued", "{out}");
    let r = request(a, "GET", "/api/v1/pop/queue/f?wait=false&batch=10", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["messages"].as_array().unwrap().len(), 2);
}

/// Dead letters over HTTP: a failed message past its budget is listed, then requeued and
/// delivered again. Then the queue options 0.15 never enforced: maxSize, retryDelay, priority.
async fn dead_letters_over_http(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let mut c = Client::connect(b.addr).await;
    c.post(
        "/api/v1/configure",
        &json!({"queue": "d", "options": {"retryLimit": 0}}),
    )
    .await;
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "d", "payload": {"bad": true}, "transactionId": "x"}]}),
    )
    .await;
    let p = c.get("/api/v1/pop/queue/d?wait=false").await.json();
    let m = &p["messages"][0];
    let r = c.post("/api/v1/ack", &json!({"transactionId": "x", "partitionId": m["partitionId"], "status": "failed", "error": "nope", "leaseId": m["leaseId"]})).await;
    assert_eq!(r.json()[0]["dlq"], true);
    assert_eq!(c.get("/api/v1/dlq").await.status, 400, "queue is required");
    let l = c.get("/api/v1/dlq?queue=d&limit=10").await.json();
    assert_eq!(l["total"], 1);
    let row = &l["messages"][0];
    assert_eq!(row["data"], json!({"bad": true}));
    assert_eq!(row["errorMessage"], "nope");
    let id = row["dlqId"].as_i64().expect("dlqId");
    let r = c
        .send("POST", &format!("/api/v1/dlq/{id}/requeue"), None)
        .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        c.send("POST", &format!("/api/v1/dlq/{id}/requeue"), None)
            .await
            .status,
        404
    );
    assert_eq!(c.get("/api/v1/dlq?queue=d").await.json()["total"], 0);
    let p = c.get("/api/v1/pop/queue/d?wait=true&timeout=2000").await;
    assert_eq!(p.status, 200);
    assert_eq!(p.json()["messages"][0]["data"], json!({"bad": true}));

    // maxSize: a push past the cap answers each refused item `failed` with the reason.
    c.post(
        "/api/v1/configure",
        &json!({"queue": "capped", "options": {"maxSize": 1}}),
    )
    .await;
    let r = c
        .post(
            "/api/v1/push",
            &json!({"items": [{"queue": "capped", "payload": 1}, {"queue": "capped", "payload": 2}]}),
        )
        .await;
    assert_eq!(r.status, 201);
    let items = r.json();
    for item in items.as_array().expect("items") {
        assert_eq!(item["status"], "failed", "{items}");
        assert!(
            item["error"]
                .as_str()
                .is_some_and(|e| e.contains("maxSize 1")),
            "{items}"
        );
    }
    assert_eq!(
        c.get("/api/v1/pop/queue/capped?wait=false").await.status,
        204,
        "nothing stored"
    );

    // retryDelay: a failed message comes back to a parked pop once the hold ends.
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "r", "payload": {"n": 1}, "transactionId": "r1"}]}),
    )
    .await;
    let m = c.get("/api/v1/pop/queue/r?wait=false").await.json()["messages"][0].clone();
    let r = c.post("/api/v1/ack", &json!({"transactionId": "r1", "partitionId": m["partitionId"], "status": "failed", "leaseId": m["leaseId"]})).await;
    assert_eq!(r.json()[0]["success"], true);
    assert_eq!(
        c.get("/api/v1/pop/queue/r?wait=false").await.status,
        204,
        "held for retryDelay"
    );
    let p = c.get("/api/v1/pop/queue/r?wait=true&timeout=5000").await;
    assert_eq!(p.status, 200);
    assert_eq!(p.json()["messages"][0]["data"], json!({"n": 1}));

    // priority: a discovery pop serves the higher-priority queue first.
    for (q, prio) in [("jobs.low", 1), ("jobs.high", 9)] {
        c.post(
            "/api/v1/configure",
            &json!({"queue": q, "options": {"priority": prio}}),
        )
        .await;
        c.post(
            "/api/v1/push",
            &json!({"items": [{"queue": q, "payload": {"from": q}}]}),
        )
        .await;
    }
    for expected in ["jobs.high", "jobs.low"] {
        let p = c
            .get("/api/v1/pop?namespace=jobs&wait=false&autoAck=true")
            .await;
        assert_eq!(p.status, 200);
        assert_eq!(p.json()["messages"][0]["data"], json!({"from": expected}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_over_http_on_the_memory_backend() {
    dead_letters_over_http(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_over_http_on_postgres() {
    dead_letters_over_http(Store::Postgres("queen_http_dlq")).await;
}

/// One group's lease expiring while another group is parked on the same queue must not disturb
/// the parked pop (the driver once woke on the other group's due revisit and failed with 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_groups_lease_expiry_does_not_disturb_a_parked_pop() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    let a = b.addr;
    request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "two", "partition": "p", "payload": 1}]})),
    )
    .await;
    let r = request(
        a,
        "GET",
        "/api/v1/pop/queue/two?consumerGroup=g1&leaseSeconds=1&wait=false",
        None,
    )
    .await;
    assert_eq!(r.status, 200, "g1 leases p for 1 s");
    let r = request(
        a,
        "GET",
        "/api/v1/pop/queue/two?consumerGroup=g2&autoAck=true&wait=false",
        None,
    )
    .await;
    assert_eq!(r.status, 200, "g2 takes the message");
    let waiter = tokio::spawn(async move {
        request(
            a,
            "GET",
            "/api/v1/pop/queue/two?consumerGroup=g2&autoAck=true&wait=true&timeout=6000",
            None,
        )
        .await
    });
    // g1's lease expires while g2 is parked; then a push arrives.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished(), "g2's parked pop answered early");
    request(
        a,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "two", "partition": "p", "payload": 2}]})),
    )
    .await;
    let r = waiter.await.unwrap();
    assert_eq!(
        r.status,
        200,
        "the parked pop gets the push: {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["messages"][0]["data"], json!(2));
}

/// Two brokers on one PostgreSQL: a push through one wakes a consumer parked on the other at
/// once (NOTIFY), not at the next ring reseed. The re-check interval is longer than the wait, so
/// only the notification can deliver in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_on_one_broker_wakes_a_consumer_parked_on_another() {
    let config = ServerConfig {
        backoff: queen_core::backoff::WaitBackoff {
            initial_ms: 60_000,
            threshold: 3,
            multiplier: 1.0,
            max_ms: 60_000,
        },
        ..ServerConfig::default()
    };
    let (a, b) = common::start_pair("queen_http_mesh", config).await;
    let (a, b) = (a.addr, b.addr);
    // Warm broker A's ring for the queue, then park a consumer on A.
    request(
        b,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "mesh", "payload": 0}]})),
    )
    .await;
    assert_eq!(
        request(
            a,
            "GET",
            "/api/v1/pop/queue/mesh?autoAck=true&wait=false",
            None
        )
        .await
        .status,
        200
    );
    let waiter = tokio::spawn(async move {
        request(
            a,
            "GET",
            "/api/v1/pop/queue/mesh?autoAck=true&wait=true&timeout=10000",
            None,
        )
        .await
    });
    while metrics(a).await["parkedPops"].as_u64().unwrap() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = Instant::now();
    request(
        b,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "mesh", "payload": "from b"}]})),
    )
    .await;
    let r = waiter.await.unwrap();
    assert_eq!(r.status, 200, "the consumer parked on A got B's push");
    assert_eq!(r.json()["messages"][0]["data"], "from b");
    eprintln!("cross-broker push-to-delivery: {:?}", t.elapsed());
}

/// Queen 0.15 fused concurrent requests into one statement, so one poison item failed every
/// co-batched request. Here each request stands alone: concurrent valid pushes all land
/// while poison pushes (a name over 255 bytes, a non-UUID traceId) are refused alone.
async fn a_poison_push_fails_alone(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let mut tasks = vec![];
    for i in 0..24u32 {
        let addr = b.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let item = match i % 8 {
                0 => json!({"queue": "x".repeat(300), "payload": i}),
                4 => json!({"queue": "fused", "payload": i, "traceId": "not-a-uuid"}),
                _ => json!({"queue": "fused", "partition": format!("p{}", i % 3), "payload": i}),
            };
            (i, c.post("/api/v1/push", &json!({"items": [item]})).await)
        }));
    }
    let mut stored = 0;
    for t in tasks {
        let (i, r) = t.await.unwrap();
        if i % 4 == 0 {
            assert_eq!(r.status, 400, "poison request {i} is refused alone");
        } else {
            assert_eq!(r.status, 201, "request {i}");
            assert_eq!(r.json()[0]["status"], "queued", "request {i}");
            stored += 1;
        }
    }
    let mut c = Client::connect(b.addr).await;
    let mut total = 0;
    for part in ["p0", "p1", "p2"] {
        let p = c
            .get(&format!(
                "/api/v1/pop/queue/fused/partition/{part}?batch=100&wait=false"
            ))
            .await;
        if p.status == 200 {
            total += p.json()["messages"].as_array().map_or(0, Vec::len);
        }
    }
    assert_eq!(total, stored, "every valid push was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_push_fails_alone_on_the_memory_backend() {
    a_poison_push_fails_alone(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_push_fails_alone_on_postgres() {
    a_poison_push_fails_alone(Store::Postgres("queen_http_fused")).await;
}

/// A push that stores nothing (every item a duplicate) is no deliverability event: it wakes
/// nobody. A push that stores something is one event per partition it appended to.
async fn only_a_push_that_stores_something_is_an_event(store: Store) {
    let b = start(store, ServerConfig::default()).await;
    let pushes = |m: Value| m["deliveryEvents"]["push"].as_u64().unwrap_or(0);
    let body = json!({"items": [
        {"queue": "ev", "partition": "a", "payload": 1, "transactionId": "t-1"},
        {"queue": "ev", "partition": "b", "payload": 2, "transactionId": "t-2"}]});
    let before = pushes(metrics(b.addr).await);
    let r = request(b.addr, "POST", "/api/v1/push", Some(&body)).await;
    assert_eq!(r.status, 201);
    assert_eq!(
        pushes(metrics(b.addr).await),
        before + 2,
        "one event per partition"
    );
    let r = request(b.addr, "POST", "/api/v1/push", Some(&body)).await;
    assert_eq!(r.json()[0]["status"], "duplicate");
    assert_eq!(
        pushes(metrics(b.addr).await),
        before + 2,
        "a push of duplicates appends nothing and publishes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_push_that_stores_something_is_an_event_on_the_memory_backend() {
    only_a_push_that_stores_something_is_an_event(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_push_that_stores_something_is_an_event_on_postgres() {
    only_a_push_that_stores_something_is_an_event(Store::Postgres("queen_http_events")).await;
}

/// Requests each carrying a NUL byte (or a NUL percent-encoded in the path) in one field.
fn hostile_corpus() -> Vec<(&'static str, String, Option<Value>)> {
    let nul = "a\u{0}b";
    let nul_path = "a%00b";
    vec![
        (
            "POST",
            "/api/v1/push".into(),
            Some(json!({"items": [{"queue": nul, "payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/push".into(),
            Some(json!({"items": [{"queue": "q", "partition": nul, "payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/push".into(),
            Some(json!({"items": [{"queue": "q", "transactionId": nul, "payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/ack".into(),
            Some(json!({"transactionId": nul, "partitionId": "p"})),
        ),
        (
            "POST",
            "/api/v1/ack".into(),
            Some(json!({"transactionId": "t", "partitionId": nul})),
        ),
        (
            "POST",
            "/api/v1/ack".into(),
            Some(json!({"transactionId": "t", "partitionId": "p", "leaseId": nul})),
        ),
        (
            "POST",
            "/api/v1/ack".into(),
            Some(
                json!({"transactionId": "t", "partitionId": "p", "status": "failed", "error": nul}),
            ),
        ),
        (
            "POST",
            "/api/v1/ack".into(),
            Some(json!({"transactionId": "t", "partitionId": "p", "consumerGroup": nul})),
        ),
        (
            "POST",
            "/api/v1/ack/batch".into(),
            Some(json!({"acknowledgments": [{"transactionId": "t", "partitionId": nul}]})),
        ),
        (
            "POST",
            "/api/v1/ack/batch".into(),
            Some(
                json!({"consumerGroup": nul, "acknowledgments": [{"transactionId": "t", "partitionId": "p"}]}),
            ),
        ),
        (
            "POST",
            format!("/api/v1/lease/{nul_path}/extend"),
            Some(json!({"seconds": 10})),
        ),
        (
            "POST",
            "/api/v1/configure".into(),
            Some(json!({"queue": "q", "namespace": nul})),
        ),
        (
            "POST",
            "/api/v1/configure".into(),
            Some(json!({"queue": "q", "task": nul})),
        ),
        (
            "POST",
            "/api/v1/transaction".into(),
            Some(
                json!({"operations": [{"type": "push", "items": [{"queue": "q", "transactionId": nul, "payload": 1}]}]}),
            ),
        ),
        (
            "POST",
            "/api/v1/transaction".into(),
            Some(
                json!({"operations": [{"type": "ack", "transactionId": "t", "partitionId": "p"}], "requiredLeases": [nul]}),
            ),
        ),
        ("GET", format!("/api/v1/dlq?queue={nul_path}"), None),
        (
            "GET",
            format!("/api/v1/dlq?queue=q&consumerGroup={nul_path}"),
            None,
        ),
        (
            "GET",
            format!("/api/v1/dlq?queue=q&partition={nul_path}"),
            None,
        ),
        ("GET", "/api/v1/dlq?queue=q&from=2026-02-30".into(), None),
        (
            "GET",
            "/api/v1/dlq?queue=q&to=2026-04-31T00:00:00Z".into(),
            None,
        ),
        ("GET", format!("/api/v1/pop?namespace={nul_path}"), None),
        ("GET", format!("/api/v1/pop?task={nul_path}"), None),
        (
            "GET",
            format!("/api/v1/pop/queue/q?consumerGroup={nul_path}"),
            None,
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?subscriptionFrom=2026-02-30T00:00:00Z".into(),
            None,
        ),
        ("GET", format!("/api/v1/pop/queue/{nul_path}"), None),
        (
            "POST",
            format!("/api/v1/consumer-groups/{nul_path}/queues/q/seek"),
            Some(json!({"toEnd": true})),
        ),
        (
            "POST",
            "/api/v1/consumer-groups/g/queues/q/seek".into(),
            Some(json!({"timestamp": "2026-02-30T00:00:00Z"})),
        ),
        (
            "POST",
            format!("/api/v1/consumer-groups/{nul_path}/subscription"),
            Some(json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z"})),
        ),
        (
            "POST",
            "/api/v1/consumer-groups/g/subscription".into(),
            Some(json!({"subscriptionTimestamp": "2026-04-31"})),
        ),
        (
            "DELETE",
            format!("/api/v1/consumer-groups/{nul_path}"),
            None,
        ),
        (
            "DELETE",
            format!("/api/v1/consumer-groups/g/queues/{nul_path}"),
            None,
        ),
        (
            "DELETE",
            format!("/api/v1/resources/queues/{nul_path}"),
            None,
        ),
        // Ephemeral queues: every verb's bad shapes and names.
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"queue": nul})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"options": {}})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"queue": "e", "options": {"maxLenght": 5}})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"queue": "e", "options": {"policy": "block"}})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"queue": "e", "options": {"leaseSeconds": 0}})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/configure".into(),
            Some(json!({"queue": "e", "options": {"windowBuffer": {"ms": 10}}})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push".into(),
            Some(json!({"queue": "e"})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push".into(),
            Some(json!({"queue": "e", "messages": [{"payload": 1}, {"data": 2}]})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push".into(),
            Some(json!({"queue": nul, "messages": [{"payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push".into(),
            Some(json!({"queue": "e", "partition": nul, "messages": [{"payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push".into(),
            Some(json!({"queue": 7, "messages": [{"payload": 1}]})),
        ),
        ("GET", "/api/v1/ephemeral/pop?queue=e&batch=0".into(), None),
        ("GET", "/api/v1/ephemeral/pop?queue=e&batch=x".into(), None),
        (
            "GET",
            "/api/v1/ephemeral/pop?queue=e&wait=maybe".into(),
            None,
        ),
        ("GET", "/api/v1/ephemeral/pop?batch=1".into(), None),
        (
            "GET",
            format!("/api/v1/ephemeral/pop?queue=e&group={nul_path}"),
            None,
        ),
        (
            "POST",
            "/api/v1/ephemeral/ack".into(),
            Some(json!({"queue": "e"})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/ack".into(),
            Some(json!({"queue": "e", "acks": [{"status": "completed"}]})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/ack".into(),
            Some(json!({"queue": "e", "acks": [{"id": "x", "status": "done"}]})),
        ),
        (
            "POST",
            "/api/v1/ephemeral/ack".into(),
            Some(json!({"queue": "e", "group": 3, "acks": [{"id": "x"}]})),
        ),
        ("POST", "/api/v1/ephemeral/reset".into(), Some(json!({}))),
        (
            "GET",
            format!("/api/v1/ephemeral/queues/{nul_path}/depth"),
            None,
        ),
        ("GET", "/api/v1/ephemeral/queues/never/depth".into(), None),
        (
            "DELETE",
            format!("/api/v1/ephemeral/queue/{nul_path}"),
            None,
        ),
    ]
}

/// The same hostile requests to a memory broker and a PostgreSQL broker: every one a 4xx with the
/// same status and body on both, and nothing stored. NUL reaches no storage (PostgreSQL text
/// cannot hold it; before one validation layer, the PostgreSQL broker answered 500 where the
/// memory broker stored it), impossible dates are refused, and so are bad shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_the_same_answer_from_both_backends() {
    let corpus = hostile_corpus();
    let memory = start(Store::Memory, ServerConfig::default()).await;
    let pg = start(
        Store::Postgres("queen_http_hostile"),
        ServerConfig::default(),
    )
    .await;
    for (method, path, body) in &corpus {
        let m = request(memory.addr, method, path, body.as_ref()).await;
        let p = request(pg.addr, method, path, body.as_ref()).await;
        assert!(
            (400..500).contains(&m.status),
            "{method} {path}: the memory broker answered {}",
            m.status
        );
        assert_eq!(
            (m.status, m.json()),
            (p.status, p.json()),
            "{method} {path}: the backends disagree"
        );
    }
    for b in [&memory, &pg] {
        let names = b
            .app
            .storage
            .pops
            .queues_matching(None, None)
            .await
            .unwrap();
        assert!(
            names.is_empty(),
            "a refused request stored something: {names:?}"
        );
        let declared = b.app.storage.ephemeral.ephemeral_configs().await.unwrap();
        assert!(
            declared.is_empty(),
            "a refused configure stored {declared:?}"
        );
        let listed = request(b.addr, "GET", "/api/v1/ephemeral/queues", None).await;
        assert_eq!(
            listed.json()["queues"],
            json!([]),
            "a refused ephemeral call created a queue"
        );
    }
}

/// What a raw connection got until the broker closed it (or `None`: still open after `wait`).
async fn read_until_closed(stream: &mut tokio::net::TcpStream, wait: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    match tokio::time::timeout(wait, stream.read_to_end(&mut got)).await {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => None,
    }
}

/// A memory-backend broker whose client-idle timeout is short enough to wait out in a test.
async fn broker_with_short_idle_timeout() -> (common::TestBroker, Duration) {
    let idle = Duration::from_millis(1500);
    let config = ServerConfig {
        client_idle_timeout_ms: idle.as_millis() as u64,
        ..ServerConfig::default()
    };
    (start(Store::Memory, config).await, idle)
}

/// The content-length an answer's head names.
fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("content-length:")
            .map(|v| v.trim().parse().unwrap())
    })
}

/// One request on a raw connection, its whole answer read by its content-length.
async fn exchange(stream: &mut tokio::net::TcpStream, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before answering: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = content_length(&text[..end]).unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text;
            }
        }
    }
}

/// A client that owes the broker bytes (a request head on a new or idle connection, the rest
/// of a body) is not waited for for ever: its connection is closed after CLIENT_IDLE_TIMEOUT_MS,
/// a stalled body first answered 408 with nothing of it stored. A client that keeps talking, and
/// a long-poll waiting for its answer, are never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_owe_the_broker_bytes_are_closed_after_the_idle_timeout() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let (b, idle) = broker_with_short_idle_timeout().await;
    // Well past the timeout: a closure is what is checked, not when it came.
    let patience = Duration::from_secs(30);

    // A head that never ends.
    let mut half_head = TcpStream::connect(b.addr).await.unwrap();
    half_head
        .write_all(b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(
        read_until_closed(&mut half_head, patience).await.is_some(),
        "a connection with half a request head is closed"
    );

    // A connection that never sends anything.
    let mut silent = TcpStream::connect(b.addr).await.unwrap();
    assert!(read_until_closed(&mut silent, patience).await.is_some());

    // A keep-alive connection that talks more often than the timeout stays open longer than it,
    // and is closed once it falls silent.
    let mut talking = TcpStream::connect(b.addr).await.unwrap();
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < idle * 3 {
        let a = exchange(&mut talking, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        answered += 1;
        tokio::time::sleep(idle / 4).await;
    }
    assert!(answered >= 4);
    assert!(read_until_closed(&mut talking, patience).await.is_some());

    // A body that stops arriving: 408, the connection closed, nothing stored.
    let mut stalled = TcpStream::connect(b.addr).await.unwrap();
    let part = r#"{"items": [{"queue": "stalled", "payload": {"n": 1}}"#;
    stalled
        .write_all(
            format!(
                "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{part}",
                part.len() + 2
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let answer = read_until_closed(&mut stalled, patience)
        .await
        .expect("a stalled body is answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("stopped arriving"), "{answer}");
    let r = request(b.addr, "GET", "/api/v1/pop/queue/stalled?wait=false", None).await;
    assert_eq!(r.status, 204, "nothing of the stalled push is stored");

    // A long-poll longer than the timeout is answered at its own deadline, on its connection.
    let mut parked = TcpStream::connect(b.addr).await.unwrap();
    let started = Instant::now();
    let a = exchange(
        &mut parked,
        &format!(
            "GET /api/v1/pop/queue/stalled?wait=true&timeout={} HTTP/1.1\r\nHost: x\r\n\r\n",
            (idle * 2).as_millis()
        ),
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 204"), "{a}");
    assert!(
        started.elapsed() >= idle * 2,
        "answered at its deadline, not cut"
    );
}

/// A request's storage deadline counts from the end of its body: the body's arrival is the
/// client's part. With the deadline shorter than the client-idle timeout (as by default: 60 s
/// against 75 s), a stalled body answers 408, not a 503 that blames the database, and a body
/// that keeps arriving for longer than the deadline is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_s_storage_deadline_counts_from_the_end_of_its_body() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let deadline = Duration::from_millis(1000);
    let idle = Duration::from_millis(3000);
    let b = start(
        Store::Memory,
        ServerConfig {
            storage_deadline_ms: deadline.as_millis() as u64,
            client_idle_timeout_ms: idle.as_millis() as u64,
            ..ServerConfig::default()
        },
    )
    .await;
    let body = r#"{"items": [{"queue": "slow-body", "payload": {"n": 1}}]}"#;
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );

    // Stalled after its first bytes: the client's fault, answered when the idle timeout says.
    let mut stalled = TcpStream::connect(b.addr).await.unwrap();
    stalled
        .write_all(format!("{head}{}", &body[..10]).as_bytes())
        .await
        .unwrap();
    let answer = read_until_closed(&mut stalled, Duration::from_secs(30))
        .await
        .expect("a stalled body is answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("stopped arriving"), "{answer}");

    // Arriving in pieces over 2.5 deadlines, no gap near the idle timeout: stored.
    let mut slow = TcpStream::connect(b.addr).await.unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    for piece in body.as_bytes().chunks(body.len().div_ceil(5)) {
        tokio::time::sleep(deadline / 2).await;
        slow.write_all(piece).await.unwrap();
    }
    assert!(started.elapsed() > deadline * 2);
    // The request is all sent: only its answer is read.
    let answer = exchange(&mut slow, "").await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let r = request(
        b.addr,
        "GET",
        "/api/v1/pop/queue/slow-body?wait=false&autoAck=true",
        None,
    )
    .await;
    assert_eq!(r.status, 200, "the slow push is stored");
    assert_eq!(r.json()["messages"][0]["data"], json!({"n": 1}));
}

/// Each parked consumer holds a connection and so a descriptor: the binary raises its soft
/// open-files limit to the hard one, so a host's low default (1,024 under systemd) does not
/// refuse connections past it. Started under a soft limit of 128, it serves 400 connections
/// held open at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_more_connections_than_the_soft_open_files_limit_it_started_under() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 128 && exec \"$0\"")
        .arg(env!("CARGO_BIN_EXE_queen"))
        .env_clear()
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut up = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            up = true;
            break;
        }
    }
    assert!(up, "the broker listens");
    // A connection the broker cannot accept is queued by the kernel and never answered: the
    // bound turns that into a failure instead of a hang.
    let served = tokio::time::timeout(Duration::from_secs(60), async {
        let mut open = Vec::new();
        for _ in 0..400 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            let a = exchange(&mut c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
            open.push(c);
        }
        open.len()
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        served.ok(),
        Some(400),
        "every connection answered while all stay open"
    );
}

/// A client that stops reading its answer (a frozen process, a host gone without a word) does
/// not hold the connection and the answer's bytes for ever: once a write has made no progress
/// for CLIENT_IDLE_TIMEOUT_MS the broker closes the connection, and the client, reading at
/// last, finds the answer cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_client_stops_reading_is_cut_after_the_idle_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (b, idle) = broker_with_short_idle_timeout().await;
    // About 24 MB of answer: more than the two sockets' buffers hold.
    let payload = "x".repeat(4096);
    for round in 0..6 {
        let items: Vec<Value> = (0..1000)
            .map(|i| json!({"queue": "unread", "partition": "p", "payload": {"n": round * 1000 + i, "pad": payload}}))
            .collect();
        let r = request(
            b.addr,
            "POST",
            "/api/v1/push",
            Some(&json!({ "items": items })),
        )
        .await;
        assert_eq!(r.status, 201);
    }
    let mut reader = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    reader
        .write_all(b"GET /api/v1/pop/queue/unread/partition/p?batch=6000&wait=false HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(idle * 3).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), reader.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the broker closed the connection");
    let text = String::from_utf8_lossy(&got[..got.len().min(4096)]).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    let end = text.find("\r\n\r\n").expect("a head") + 4;
    let length = content_length(&text[..end]).expect("a content-length");
    assert!(
        got.len() - end < length,
        "the answer was cut short: {} of {length} bytes",
        got.len() - end
    );
}
