//! The admin API over real HTTP, on both backends with the same assertions: resources, depth,
//! the message browser (filters, paging, lookup, dead letters, retry, delete), traces (and their
//! removal with their messages by retention), consumer-group lag, status time series from the
//! brokers' samples, and bad input answered 400 and changing nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{start, Client, Store};
use queen_server::config::RetentionSettings;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

fn config() -> ServerConfig {
    ServerConfig {
        sample_interval_ms: 100,
        retention: RetentionSettings {
            interval_ms: 200,
            ..RetentionSettings::default()
        },
        ..ServerConfig::default()
    }
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let r = Client::connect(addr).await.get(path).await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
    let r = Client::connect(addr)
        .await
        .send(method, path, bytes.as_deref())
        .await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

async fn push(addr: SocketAddr, queue: &str, partition: &str, txids: &[&str]) -> Vec<Value> {
    let items: Vec<Value> = txids
        .iter()
        .map(|t| json!({"queue": queue, "partition": partition, "payload": {"tx": t}, "transactionId": t}))
        .collect();
    let (status, v) = send(
        addr,
        "POST",
        "/api/v1/push",
        Some(json!({ "items": items })),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    v.as_array().unwrap().clone()
}

/// Pops everything `group` can claim on `queue` now and acks it with `status`.
async fn consume(addr: SocketAddr, queue: &str, group: &str, status: &str) -> usize {
    let mut n = 0;
    loop {
        let (code, v) = get(
            addr,
            &format!("/api/v1/pop/queue/{queue}?batch=50&wait=false&consumerGroup={group}"),
        )
        .await;
        if code == 204 {
            return n;
        }
        assert_eq!(code, 200, "{v}");
        let acks: Vec<Value> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                            "leaseId": m["leaseId"], "status": status, "error": "broken"})
            })
            .collect();
        n += acks.len();
        let (code, v) = send(
            addr,
            "POST",
            "/api/v1/ack/batch",
            Some(json!({"acknowledgments": acks, "consumerGroup": group})),
        )
        .await;
        assert_eq!(code, 200, "{v}");
    }
}

/// The sum of each item's `key`, a number.
fn sum_of(list: &Value, key: &str) -> u64 {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|v| v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}")))
        .sum()
}

/// Each item's `key`, a string.
fn each<'a>(list: &'a Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|v| v[key].as_str().unwrap_or_else(|| panic!("no {key} in {v}")))
        .collect()
}

fn by_name<'a>(list: &'a Value, key: &str, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v[key] == name)
        .unwrap_or_else(|| panic!("no {key}={name} in {list}"))
}

async fn admin_routes(store: Store) {
    let b = start(store, config()).await;
    let a = b.addr;
    let q = "adm";
    let (code, _) = send(
        a,
        "POST",
        "/api/v1/configure",
        Some(json!({"queue": q, "options": {"retryLimit": 0}})),
    )
    .await;
    assert_eq!(code, 200);
    push(a, q, "p1", &["a1", "a2"]).await;
    let pushed = push(a, q, "p2", &["b1"]).await;
    let p2 = pushed[0]["partitionId"].as_str().unwrap().to_string();

    admin_resources(a, q).await;
    admin_message_browser(a, q, &p2).await;
    admin_traces(a, q, &p2).await;
    admin_consumer_groups(a, q).await;
    admin_dead_letter(a, &p2).await;
    admin_bad_input(a).await;
    admin_status(a).await;
    admin_retention(a).await;
}

/// Queues, depth and one queue's partitions, after group g1 read everything.
async fn admin_resources(a: SocketAddr, q: &str) {
    // Group g1 reads everything; queue mode has not started.
    assert_eq!(consume(a, q, "g1", "completed").await, 3);
    push(a, q, "p2", &["b2"]).await;

    let (code, v) = get(a, "/api/v1/resources/queues").await;
    assert_eq!(code, 200);
    let entry = by_name(&v["queues"], "name", q);
    assert_eq!(entry["partitions"], 3, "Default, p1 and p2: {entry}");
    assert_eq!(entry["messages"]["total"], 4);
    assert_eq!(entry["messages"]["pending"], 1, "only b2 is unread by g1");
    assert_eq!(v["total"], 1);

    let (_, v) = get(a, &format!("/api/v1/resources/queues/{q}/depth?group=g1")).await;
    assert_eq!(v["pending"], 1);
    assert_eq!(v["partitionsPending"], 1);
    assert_eq!(by_name(&v["partitions"], "partition", "p2")["pending"], 1);
    let (_, v) = get(a, &format!("/api/v1/resources/queues/{q}/depth?group=late")).await;
    assert_eq!(
        v["pending"], 4,
        "a group with no cursor reads from the start"
    );

    let (code, v) = get(a, &format!("/api/v1/resources/queues/{q}")).await;
    assert_eq!(code, 200);
    let names: Vec<&str> = each(&v["partitions"], "name");
    assert_eq!(names, ["Default", "p1", "p2"]);
    let (code, v) = get(a, "/api/v1/resources/queues/absent").await;
    assert_eq!((code, v["error"].as_str()), (404, Some("Queue not found")));
    let (code, v) = get(a, "/api/v1/resources/queues/absent?after=p1").await;
    assert_eq!((code, v["error"].as_str()), (404, Some("Queue not found")));

    // Paged by name: each page a range, the totals the whole queue's.
    let (_, whole) = get(a, &format!("/api/v1/resources/queues/{q}")).await;
    assert_eq!(whole["pagination"]["next"], Value::Null);
    let (_, first) = get(a, &format!("/api/v1/resources/queues/{q}?limit=2")).await;
    assert_eq!(first["partitions"].as_array().map(Vec::len), Some(2));
    assert_eq!(first["pagination"]["next"], "p1");
    assert_eq!(
        (&first["totals"], &first["partitionsTotal"]),
        (&whole["totals"], &json!(3))
    );
    let (_, rest) = get(a, &format!("/api/v1/resources/queues/{q}?limit=2&after=p1")).await;
    assert_eq!(rest["partitions"][0]["name"], "p2");
    assert_eq!(rest["pagination"]["next"], Value::Null);
    for (group, pending) in [("g1", 1), ("late", 4)] {
        let (_, v) = get(
            a,
            &format!("/api/v1/resources/queues/{q}/depth?group={group}&limit=1"),
        )
        .await;
        assert_eq!(v["pending"], pending, "{group}: {v}");
        assert_eq!(v["partitions"].as_array().map(Vec::len), Some(1), "{v}");
    }

    let (_, v) = get(
        a,
        &format!("/api/v1/resources/partitions?queue={q}&minDepth=1"),
    )
    .await;
    assert_eq!(v["total"], 1, "{v}");
    let (_, v) = get(
        a,
        &format!("/api/v1/resources/partitions?queue={q}&limit=1&offset=1"),
    )
    .await;
    assert_eq!(each(&v["partitions"], "name"), ["p1"], "{v}");
    assert_eq!((&v["total"], &v["truncated"]), (&json!(3), &json!(false)));
}

/// The message browser: newest first, paged, filtered; one message by id.
async fn admin_message_browser(a: SocketAddr, q: &str, p2: &str) {
    // The message browser: newest first, paged, filtered.
    let (code, v) = get(a, &format!("/api/v1/messages?queue={q}")).await;
    assert_eq!(code, 200, "{v}");
    let txids: Vec<&str> = each(&v["messages"], "transactionId");
    assert_eq!(txids.len(), 4);
    assert_eq!(txids[0], "b2", "newest first: {txids:?}");
    let mut sorted = txids.clone();
    sorted.sort();
    assert_eq!(sorted, ["a1", "a2", "b1", "b2"]);
    let (_, page2) = get(a, &format!("/api/v1/messages?queue={q}&limit=3&offset=3")).await;
    assert_eq!(page2["messages"].as_array().unwrap().len(), 1);
    assert_eq!(page2["messages"][0]["transactionId"], txids[3]);
    let (_, v) = get(a, &format!("/api/v1/messages?queue={q}&partition=p1")).await;
    assert_eq!(v["messages"].as_array().unwrap().len(), 2);
    assert_eq!(v["mode"]["type"], "bus");
    let (_, v) = get(a, &format!("/api/v1/messages?queue={q}&status=completed")).await;
    assert_eq!(
        v["messages"].as_array().unwrap().len(),
        3,
        "g1 passed three"
    );
    let (_, v) = get(a, &format!("/api/v1/messages?queue={q}&status=pending")).await;
    assert_eq!(v["messages"][0]["transactionId"], "b2");
    assert_eq!(v["messages"][0]["data"], json!({"tx": "b2"}));

    // Namespace filters: the listing and the analytics count only that namespace's queues.
    let (code, _) = send(
        a,
        "POST",
        "/api/v1/configure",
        Some(json!({"queue": "adm-ns", "namespace": "billing"})),
    )
    .await;
    assert_eq!(code, 200);
    push(a, "adm-ns", "n1", &["n1"]).await;
    let (_, v) = get(a, "/api/v1/messages?namespace=billing").await;
    let queues: Vec<&str> = each(&v["messages"], "queue");
    assert_eq!(queues, ["adm-ns"], "{v}");
    let (_, v) = get(a, "/api/v1/messages?namespace=nobody").await;
    assert_eq!(v["messages"], json!([]), "{v}");
    let (_, v) = get(
        a,
        "/api/v1/status/analytics?namespace=billing&interval=minute",
    )
    .await;
    let counted: u64 = sum_of(&v["dataPoints"], "messages");
    assert_eq!(counted, 1, "{v}");

    let (code, v) = get(a, &format!("/api/v1/messages/{p2}/b1")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["payload"], json!({"tx": "b1"}));
    assert_eq!(v["status"], "completed");
    assert_eq!(
        by_name(&v["consumerGroups"], "name", "g1")["consumed"],
        true
    );
    let (code, _) = get(a, &format!("/api/v1/messages/{p2}/absent")).await;
    assert_eq!(code, 404);
    let (code, v) = get(a, "/api/v1/messages/not-a-uuid/b1").await;
    assert_eq!(code, 400, "{v}");
}

/// Traces: written against a stored message, read three ways.
async fn admin_traces(a: SocketAddr, q: &str, p2: &str) {
    // Traces: written against a stored message, read three ways.
    for (i, names) in [json!(["order-7"]), json!(["order-7", "vip"])]
        .iter()
        .enumerate()
    {
        let (code, v) = send(
            a,
            "POST",
            "/api/v1/traces",
            Some(json!({"transactionId": "b1", "partitionId": p2, "consumerGroup": "g1",
                        "traceNames": names, "eventType": "info", "data": {"text": format!("step {i}")}})),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        assert!(v["traceId"].is_number());
    }
    let (code, _) = send(
        a,
        "POST",
        "/api/v1/traces",
        Some(json!({"transactionId": "none", "partitionId": p2, "data": {}})),
    )
    .await;
    assert_eq!(code, 404, "no trace of a message that is not stored");
    let (code, v) = send(
        a,
        "POST",
        "/api/v1/traces",
        Some(json!({"transactionId": "b1", "partitionId": p2})),
    )
    .await;
    assert_eq!((code, v["error"].as_str()), (400, Some("data is required")));
    let (_, v) = get(a, &format!("/api/v1/traces/{p2}/b1")).await;
    let texts: Vec<&str> = v["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["step 0", "step 1"], "oldest first");
    let (_, v) = get(a, "/api/v1/traces/by-name/order-7?limit=1&offset=1").await;
    assert_eq!(v["total"], 2);
    assert_eq!(v["traces"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["traces"][0]["data"]["text"], "step 0",
        "newest first, page 2"
    );
    assert_eq!(v["traces"][0]["queue_name"], q);
    let (_, v) = get(a, "/api/v1/traces/names").await;
    assert_eq!(v["total"], 2);
    assert_eq!(
        by_name(&v["trace_names"], "trace_name", "order-7")["trace_count"],
        2
    );
    assert_eq!(
        by_name(&v["trace_names"], "trace_name", "vip")["message_count"],
        1
    );
}

/// Consumer groups and their lag.
async fn admin_consumer_groups(a: SocketAddr, q: &str) {
    // Consumer groups and their lag.
    let (_, v) = get(a, "/api/v1/consumer-groups").await;
    let g1 = v
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "g1" && g["queueName"] == q)
        .unwrap();
    assert_eq!(g1["totalLag"], 1);
    assert_eq!(g1["partitionsWithLag"], 1);
    assert_eq!(g1["state"], "Stable");
    let (_, v) = get(a, "/api/v1/consumer-groups/g1").await;
    assert_eq!(
        by_name(&v[q]["partitions"], "partition", "p2")["offsetLag"],
        1
    );
    let (_, v) = get(a, &format!("/api/v1/consumer-groups/g1?queue={q}&limit=1")).await;
    assert_eq!(v[q]["partitions"][0]["partition"], "Default", "{v}");
    assert_eq!(v[q]["pagination"]["next"], "Default");
    let (_, v) = get(a, &format!("/api/v1/consumer-groups/g1?queue={q}&after=p1")).await;
    assert_eq!(v[q]["partitions"][0]["offsetLag"], 1, "{v}");
    let (_, v) = get(a, "/api/v1/consumer-groups/nobody").await;
    assert_eq!(v, json!({}));
    let (code, v) = get(a, "/api/v1/consumer-groups/lagging?minLagSeconds=3600").await;
    assert_eq!((code, v), (200, json!([])));
    // b2, unread by g1 on p2, is past a lag of 0 s once a second has gone by.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (code, v) = get(a, "/api/v1/consumer-groups/lagging?minLagSeconds=0").await;
    assert_eq!(code, 200, "{v}");
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["consumer_group"] == "g1" && l["queue_name"] == q)
        .unwrap_or_else(|| panic!("g1 does not lag: {v}"));
    assert_eq!(
        (row["partition_name"].as_str(), row["offset_lag"].as_u64()),
        (Some("p2"), Some(1)),
        "{row}"
    );
    assert!(row["time_lag_seconds"].as_u64() >= Some(1), "{row}");
}

/// A dead letter: shown, retried as a new message, gone; a live message is not deletable; the retried message is delivered again.
async fn admin_dead_letter(a: SocketAddr, p2: &str) {
    // A dead letter: shown, retried as a new message, gone; a live message is not deletable.
    let (code, v) = send(
        a,
        "POST",
        "/api/v1/configure",
        Some(json!({"queue": "adm-dlq", "options": {"retryLimit": 0}})),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let dp = push(a, "adm-dlq", "p", &["d1", "d2"]).await[0]["partitionId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(consume(a, "adm-dlq", "__QUEUE_MODE__", "failed").await, 2);
    let (_, v) = get(a, "/api/v1/messages?queue=adm-dlq&status=dead_letter").await;
    assert_eq!(v["messages"].as_array().unwrap().len(), 2, "{v}");
    let (_, v) = get(a, &format!("/api/v1/messages/{dp}/d1")).await;
    assert_eq!(v["status"], "dead_letter");
    assert_eq!(v["errorMessage"], "broken");
    let (code, v) = send(a, "POST", &format!("/api/v1/messages/{dp}/d1/retry"), None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["dlqRowRemoved"], true);
    let (code, _) = send(a, "POST", &format!("/api/v1/messages/{dp}/d1/retry"), None).await;
    assert_eq!(code, 404, "the dead letter is gone");
    let (code, v) = send(a, "DELETE", &format!("/api/v1/messages/{dp}/d2"), None).await;
    assert_eq!((code, v["success"].as_bool()), (200, Some(true)), "{v}");
    let (_, v) = get(a, "/api/v1/dlq?queue=adm-dlq").await;
    assert_eq!(v["total"], 0);
    let (code, v) = send(a, "DELETE", &format!("/api/v1/messages/{p2}/b2"), None).await;
    assert_eq!(code, 409, "{v}");
    let (_, v) = get(a, &format!("/api/v1/messages/{p2}/b2")).await;
    assert_eq!(v["status"], "pending", "the refused delete changed nothing");
    // The retried message is delivered again.
    assert_eq!(
        consume(a, "adm-dlq", "__QUEUE_MODE__", "completed").await,
        1
    );
}

/// Bad input: 400 with a reason.
async fn admin_bad_input(a: SocketAddr) {
    // Bad input: 400 with a reason.
    for path in [
        "/api/v1/messages?limit=abc",
        "/api/v1/messages?status=failed",
        "/api/v1/messages?from=yesterday",
        "/api/v1/status?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
        "/api/v1/status/analytics?interval=week",
        "/api/v1/traces/names?limit=0",
        "/api/v1/consumer-groups/lagging?minLagSeconds=-1",
        "/api/v1/resources/queues/adm?limit=0",
        "/api/v1/resources/queues/adm/depth?limit=10001",
        "/api/v1/status/queues/adm?after=%00",
        "/api/v1/consumer-groups/g1?after=p1",
    ] {
        let (code, v) = get(a, path).await;
        assert_eq!(code, 400, "{path}: {v}");
        assert!(v["error"].is_string(), "{path}: {v}");
    }
}

/// Status: the broker's samples become the time series.
async fn admin_status(a: SocketAddr) {
    // Status: the broker's samples become the time series.
    let mut status = Value::Null;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, v) = get(a, "/api/v1/status").await;
        let ingested: u64 = sum_of(&v["throughput"], "ingested");
        if ingested >= 6 {
            status = v;
            break;
        }
    }
    assert!(!status.is_null(), "the samples never showed the pushes");
    assert_eq!(status["workers"].as_array().unwrap().len(), 1);
    assert_eq!(status["messages"]["deadLetter"], 0);
    let (_, v) = get(a, "/api/v1/analytics/worker-metrics").await;
    assert!(v["summary"]["totalPushMessages"].as_u64().unwrap() >= 6);
    assert!(v["summary"]["totalDlq"].as_u64().unwrap() >= 2, "{v}");
    let (_, v) = get(a, "/api/v1/analytics/system-metrics").await;
    assert_eq!(v["replicaCount"], 1);
    let (_, v) = get(a, "/api/v1/status/analytics?interval=minute").await;
    let counted: u64 = sum_of(&v["dataPoints"], "messages");
    assert_eq!(
        counted,
        4 + 1 + 2 + 1,
        "every message pushed in the window (adm, adm-ns, adm-dlq), the retry too"
    );
    let (_, v) = get(a, "/api/v1/resources/overview").await;
    assert_eq!(v["queues"], 3, "adm, adm-ns, adm-dlq");
    let (code, v) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(code, 200, "{v}");
}

/// Retention removes traces with their messages.
async fn admin_retention(a: SocketAddr) {
    // Retention removes traces with their messages.
    let (code, _) = send(
        a,
        "POST",
        "/api/v1/configure",
        Some(json!({"queue": "adm-short", "options": {"retentionEnabled": true, "retentionSeconds": 1}})),
    )
    .await;
    assert_eq!(code, 200);
    let sp = push(a, "adm-short", "p", &["s1"]).await[0]["partitionId"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, _) = send(
        a,
        "POST",
        "/api/v1/traces",
        Some(json!({"transactionId": "s1", "partitionId": sp, "traceNames": ["short"], "data": {"n": 1}})),
    )
    .await;
    assert_eq!(code, 201);
    let mut gone = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, v) = get(a, &format!("/api/v1/traces/{sp}/s1")).await;
        if v["traces"].as_array().unwrap().is_empty() {
            gone = true;
            break;
        }
    }
    assert!(gone, "the trace outlived its message");
    let (code, _) = get(a, &format!("/api/v1/messages/{sp}/s1")).await;
    assert_eq!(code, 404);
    let (_, v) = get(a, "/api/v1/traces/by-name/short").await;
    assert_eq!(v["total"], 0);
}

#[tokio::test]
async fn admin_routes_memory() {
    admin_routes(Store::Memory).await;
}

#[tokio::test]
async fn admin_routes_postgres() {
    admin_routes(Store::Postgres("admin_api")).await;
}

/// The text of `/metrics/prometheus`.
async fn scrape(a: SocketAddr) -> String {
    let r = Client::connect(a).await.get("/metrics/prometheus").await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).unwrap()
}

/// The value of the one series of `/metrics/prometheus` whose line starts with `series`.
fn series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn labelled_metrics(store: Store) {
    let b = start(
        store,
        ServerConfig {
            metrics_partition_series: 1,
            ..config()
        },
    )
    .await;
    let a = b.addr;
    // A queue name that needs escaping in a label value.
    let q = "met\"rics";
    push(a, q, "p1", &["a1", "a2"]).await;
    push(a, q, "p2", &["b1"]).await;
    assert_eq!(consume(a, "met%22rics", "g1", "completed").await, 3);
    push(a, q, "p1", &["a3"]).await;
    push(a, q, "p2", &["b2"]).await;
    let text = scrape(a).await;
    let lbl = r#"queue="met\"rics""#;
    assert_eq!(
        series(
            &text,
            &format!(r#"queen_consumergroup_lag{{{lbl},consumer_group="g1"}}"#)
        ),
        Some(2.0),
        "{text}"
    );
    assert!(series(
        &text,
        &format!(r#"queen_consumergroup_lag_seconds{{{lbl},consumer_group="g1"}}"#)
    )
    .is_some());
    assert_eq!(
        series(&text, &format!("queen_queue_depth{{{lbl}}}")),
        Some(2.0)
    );
    assert_eq!(
        series(&text, &format!("queen_queue_messages{{{lbl}}}")),
        Some(5.0)
    );
    assert_eq!(
        series(&text, &format!("queen_dlq_depth{{{lbl}}}")),
        Some(0.0)
    );
    let partition_series = text
        .lines()
        .filter(|l| l.starts_with("queen_partition_lag{"))
        .count();
    assert_eq!(partition_series, 1, "the cap holds");
    assert_eq!(series(&text, "queen_partition_series_omitted"), Some(1.0));
    assert_eq!(series(&text, "queen_stored_state_ok"), Some(1.0));
    assert!(series(&text, r#"queen_storage_duration_seconds_count{op="push"}"#).unwrap() >= 4.0);
    assert!(series(&text, r#"queen_storage_duration_seconds_count{op="ack"}"#).unwrap() >= 1.0);
    // A push that wakes a parked pop is timed from the gate opening.
    let parked = tokio::spawn(async move {
        get(
            a,
            "/api/v1/pop/queue/met-wake?wait=true&timeout=5000&autoAck=true",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    push(a, "met-wake", "p", &["w1"]).await;
    let (code, _) = parked.await.unwrap();
    assert_eq!(code, 200);
    let text = scrape(a).await;
    assert!(
        series(&text, "queen_wake_latency_seconds_count").unwrap() >= 1.0,
        "{text}"
    );
    // A deleted queue's series go with it.
    let (code, _) = send(a, "DELETE", "/api/v1/resources/queues/met%22rics", None).await;
    assert_eq!(code, 200);
    let text = scrape(a).await;
    assert!(!text.contains("met\\\"rics"), "{text}");
}

#[tokio::test]
async fn labelled_metrics_memory() {
    labelled_metrics(Store::Memory).await;
}

#[tokio::test]
async fn labelled_metrics_postgres() {
    labelled_metrics(Store::Postgres("admin_metrics")).await;
}

/// The admin totals from a pass's snapshot (ADMIN_INLINE_PARTITIONS=0: never computed per
/// request): a pass reads a queue of more partitions than one page, its totals equal the
/// one-queue route's (read as they stand), every totals answer says its statsAge,
/// `POST /stats/refresh` waits for a pass that sees every push before it, and while the totals
/// are read the refresher renews them without being asked.
async fn totals_from_a_snapshot(store: Store) {
    let b = start(
        store,
        ServerConfig {
            admin_inline_partitions: 0,
            ..config()
        },
    )
    .await;
    let a = b.addr;
    let q = "snap";
    // More partitions than a pass reads per storage call (2,000).
    let items: Vec<Value> = (0..2_050)
        .map(|i| json!({"queue": q, "partition": format!("p{i:05}"), "payload": {"i": i}}))
        .collect();
    let (code, v) = send(a, "POST", "/api/v1/push", Some(json!({ "items": items }))).await;
    assert_eq!(code, 201, "{v}");
    push(a, "snap-g", "x", &["x1", "x2"]).await;
    assert_eq!(consume(a, "snap-g", "g1", "completed").await, 2);

    let (code, v) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (v["refreshed"].as_bool(), v["partitions"].as_u64()),
        (Some(true), Some(2_051)),
        "both queues' partitions"
    );
    let (_, listed) = get(a, "/api/v1/resources/queues").await;
    let entry = by_name(&listed["queues"], "name", q);
    assert_eq!(entry["partitions"], 2_050, "{entry}");
    assert_eq!(entry["messages"]["total"], 2_050);
    assert_eq!(entry["messages"]["pending"], 2_050, "nobody reads it");
    assert!(listed["statsAge"].as_i64().is_some(), "{listed}");
    // The whole queue in one page: its totals counted for the request, as the pass counted them.
    let (_, live) = get(a, &format!("/api/v1/resources/queues/{q}?limit=5000")).await;
    assert_eq!(live["statsAge"], 0, "{}", live["pagination"]);
    assert_eq!(live["partitions"].as_array().map(Vec::len), Some(2_050));
    assert_eq!(entry["messages"]["total"], live["totals"]["total"]);
    assert_eq!(entry["messages"]["completed"], live["totals"]["completed"]);
    // A page of a larger queue: its totals from the pass, with their age.
    let (code, first) = get(a, &format!("/api/v1/resources/queues/{q}")).await;
    assert_eq!(code, 200, "{}", first["error"]);
    assert_eq!(first["partitions"].as_array().map(Vec::len), Some(1_000));
    assert_eq!(first["pagination"]["next"], "p00999");
    assert_eq!(first["partitionsTotal"], 2_050);
    assert_eq!(first["totals"], live["totals"]);
    assert!(first["statsAge"].as_i64().is_some());
    let (_, last) = get(a, &format!("/api/v1/resources/queues/{q}?after=p01999")).await;
    let names: Vec<&str> = each(&last["partitions"], "name");
    assert_eq!(names.len(), 50);
    assert_eq!((names[0], names[49]), ("p02000", "p02049"));
    assert_eq!(last["pagination"]["next"], Value::Null);
    let (_, d) = get(a, &format!("/api/v1/resources/queues/{q}/depth?limit=10")).await;
    assert_eq!(
        (d["pending"].as_u64(), d["partitionsPending"].as_u64()),
        (Some(2_050), Some(2_050)),
        "{d}"
    );
    assert_eq!(d["partitions"].as_array().map(Vec::len), Some(10));
    // A group the pass did not meet reads everything stored, on the page and in the totals.
    let (_, d) = get(
        a,
        &format!("/api/v1/resources/queues/{q}/depth?group=newcomer&limit=2"),
    )
    .await;
    assert_eq!(
        (d["pending"].as_u64(), d["partitionsPending"].as_u64()),
        (Some(2_050), Some(2_050)),
        "{d}"
    );
    assert_eq!(sum_of(&d["partitions"], "pending"), 2, "{d}");
    let (_, v) = get(
        a,
        &format!("/api/v1/resources/partitions?queue={q}&limit=3&offset=2045"),
    )
    .await;
    assert_eq!(
        each(&v["partitions"], "name"),
        ["p02045", "p02046", "p02047"]
    );
    assert_eq!(v["total"], 2_050, "{v}");
    let (_, v) = get(a, "/api/v1/resources/partitions?minDepth=1&limit=2").await;
    assert_eq!(
        v["total"], 2_050,
        "snap's partitions; g1 read snap-g's: {v}"
    );
    let (_, detail) = get(
        a,
        &format!("/api/v1/status/queues/{q}?limit=3&after=p00100"),
    )
    .await;
    assert_eq!(detail["partitions"][0]["name"], "p00101", "{detail}");
    assert_eq!(detail["totals"]["total"], 2_050);

    push(a, "snap-g", "y", &["late1", "late2"]).await;
    let (_, v) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(v["statsAge"], 0, "{v}");
    let (_, groups) = get(a, "/api/v1/consumer-groups").await;
    let g1 = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "g1" && g["queueName"] == "snap-g")
        .unwrap();
    assert_eq!(
        (g1["totalLag"].as_u64(), g1["partitionsWithLag"].as_u64()),
        (Some(2), Some(1))
    );
    for path in [
        "/api/v1/resources/overview",
        "/api/v1/resources/namespaces",
        "/api/v1/status",
        "/api/v1/status/queues",
    ] {
        let (code, v) = get(a, path).await;
        assert_eq!(code, 200, "{path}: {v}");
        assert!(v["statsAge"].as_i64().is_some(), "{path}: {v}");
    }

    // Unasked, the refresher renews the totals while they are read.
    push(a, q, "p00008", &["late3"]).await;
    let mut seen = 0;
    for _ in 0..100 {
        let (_, v) = get(a, "/api/v1/resources/queues").await;
        seen = by_name(&v["queues"], "name", q)["messages"]["total"]
            .as_u64()
            .unwrap();
        if seen == 2_051 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, 2_051, "the refresher never renewed the totals");
}

#[tokio::test]
async fn totals_from_a_snapshot_memory() {
    totals_from_a_snapshot(Store::Memory).await;
}

#[tokio::test]
async fn totals_from_a_snapshot_postgres() {
    totals_from_a_snapshot(Store::Postgres("admin_snapshot")).await;
}

/// Below ADMIN_INLINE_PARTITIONS (as the last pass counted them) every totals answer is counted
/// for its request, whatever the machine's speed: each push shows at once, `statsAge` 0. Once
/// a pass counts that many, answers come from the kept pass with their age, and a refresh
/// shows the rest.
async fn totals_per_request_below_the_partition_count(store: Store) {
    let b = start(
        store,
        ServerConfig {
            admin_inline_partitions: 3,
            ..config()
        },
    )
    .await;
    let a = b.addr;
    let q = "inline";
    for (i, partition) in ["p1", "p2", "p3"].into_iter().enumerate() {
        push(a, q, partition, &[&format!("t{i}")]).await;
        let (_, listed) = get(a, "/api/v1/resources/queues").await;
        let entry = by_name(&listed["queues"], "name", q);
        assert_eq!(entry["partitions"], i + 1, "{listed}");
        assert_eq!(entry["messages"]["total"], i + 1, "{listed}");
        assert_eq!(listed["statsAge"], 0, "{listed}");
    }
    push(a, q, "p4", &["t3"]).await;
    let (_, listed) = get(a, "/api/v1/resources/queues").await;
    let entry = by_name(&listed["queues"], "name", q);
    assert!(
        entry["partitions"] == 3 || entry["partitions"] == 4,
        "the kept pass, or the refresher's newer one: {listed}"
    );
    assert!(listed["statsAge"].as_i64().is_some(), "{listed}");
    let (_, v) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(v["partitions"], 4, "{v}");
    let (_, listed) = get(a, "/api/v1/resources/queues").await;
    assert_eq!(by_name(&listed["queues"], "name", q)["partitions"], 4);
}

#[tokio::test]
async fn totals_per_request_below_the_partition_count_memory() {
    totals_per_request_below_the_partition_count(Store::Memory).await;
}

#[tokio::test]
async fn totals_per_request_below_the_partition_count_postgres() {
    totals_per_request_below_the_partition_count(Store::Postgres("admin_inline_count")).await;
}

/// A `minDepth` listing answers from the deepest partitions each pass keeps
/// (ADMIN_DEEPEST_PARTITIONS, here 2), as deep as the pass found them: exact while the pass left
/// out none that deep, `truncated` once it did; the queue filter and paging apply to the kept
/// ones.
async fn min_depth_from_the_deepest_kept(store: Store) {
    let b = start(
        store,
        ServerConfig {
            admin_deepest_partitions: 2,
            ..config()
        },
    )
    .await;
    let a = b.addr;
    push(a, "deep", "p1", &["a1", "a2", "a3"]).await;
    push(a, "deep", "p2", &["b1"]).await;
    push(a, "deep", "p3", &["c1", "c2"]).await;
    push(a, "deep2", "x", &["d1", "d2", "d3", "d4", "d5"]).await;
    let listing = |query: &str| {
        let path = format!("/api/v1/resources/partitions?{query}");
        async move {
            let (code, v) = get(a, &path).await;
            assert_eq!(code, 200, "{path}: {v}");
            let rows: Vec<(String, String, u64)> = v["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["queue"].as_str().unwrap().to_string(),
                        r["name"].as_str().unwrap().to_string(),
                        r["depth"].as_u64().unwrap(),
                    )
                })
                .collect();
            (rows, v["total"].as_u64(), v["truncated"].as_bool())
        }
    };
    let row = |q: &str, p: &str, d: u64| (q.to_string(), p.to_string(), d);

    // Kept: deep2/x (5) and deep/p1 (3); left out: p3 (2) and p2 (1).
    let (mut rows, total, truncated) = listing("minDepth=3").await;
    rows.sort();
    assert_eq!(rows, [row("deep", "p1", 3), row("deep2", "x", 5)]);
    assert_eq!((total, truncated), (Some(2), Some(false)));
    let (rows, total, truncated) = listing("minDepth=3&queue=deep").await;
    assert_eq!(rows, [row("deep", "p1", 3)]);
    assert_eq!((total, truncated), (Some(1), Some(false)));
    let (rows, total, truncated) = listing("minDepth=2&limit=1&offset=1").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (total, truncated),
        (Some(2), Some(true)),
        "p3 is 2 deep and was left out"
    );
    let (_, total, truncated) = listing("minDepth=6").await;
    assert_eq!((total, truncated), (Some(0), Some(false)));

    // deep2 read: the next pass keeps p1 and p3, and leaves out only p2.
    assert_eq!(consume(a, "deep2", "g", "completed").await, 5);
    let (rows, total, truncated) = listing("minDepth=2").await;
    assert_eq!(rows, [row("deep", "p1", 3), row("deep", "p3", 2)]);
    assert_eq!((total, truncated), (Some(2), Some(false)));
    let (_, total, truncated) = listing("minDepth=1").await;
    assert_eq!((total, truncated), (Some(2), Some(true)));
}

#[tokio::test]
async fn min_depth_from_the_deepest_kept_memory() {
    min_depth_from_the_deepest_kept(Store::Memory).await;
}

#[tokio::test]
async fn min_depth_from_the_deepest_kept_postgres() {
    min_depth_from_the_deepest_kept(Store::Postgres("admin_deepest")).await;
}

/// A slow pass is stored for the deployment (ADMIN_INLINE_PARTITIONS=0: every pass counts as
/// slow): a broker started later answers its first totals request from the stored pass instead
/// of passing itself, and while another holds the deployment's pass lease its refresher takes
/// the passes others store instead of passing; once the lease is free it passes again.
async fn a_stored_pass_serves_the_other_brokers(store: Store) {
    let cfg = || ServerConfig {
        admin_inline_partitions: 0,
        ..config()
    };
    let first = start(store, cfg()).await;
    let a = first.addr;
    let q = "shared-totals";
    let total_on = |addr: SocketAddr| async move {
        let (code, v) = get(addr, "/api/v1/resources/queues").await;
        assert_eq!(code, 200, "{v}");
        assert!(v["statsAge"].as_i64().is_some(), "{v}");
        v["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == q)
            .map_or(0, |e| e["messages"]["total"].as_u64().unwrap())
    };
    push(a, q, "p", &["m1", "m2", "m3"]).await;
    let (code, v) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(code, 200, "{v}");
    push(a, q, "p", &["m4"]).await;

    // Started after the pass: its first answer is the stored pass (3), not a pass of its own (4).
    let second = common::start_beside(&first, cfg()).await;
    let b = second.addr;
    assert_eq!(total_on(b).await, 3, "the stored pass");

    // Another holder has the lease: the second broker's refresher only takes stored passes.
    let retention = &second.app.storage.retention;
    assert!(retention
        .claim_maintenance("admin-totals", "another broker", 600)
        .await
        .unwrap());
    push(a, q, "p", &["m5"]).await;
    // Its snapshot is due after a second (a short pass's pause): were it to pass regardless of
    // the lease, it would see m5 by now.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        total_on(b).await,
        3,
        "passed while another broker held the lease"
    );
    let (code, _) = send(a, "POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(code, 200);
    push(a, q, "p", &["m6"]).await;
    let mut seen = 0;
    for _ in 0..50 {
        seen = total_on(b).await;
        if seen != 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen, 5,
        "the first broker's stored pass, not one of its own (6)"
    );

    // Lease free: the second broker's refresher passes again.
    retention
        .release_maintenance("admin-totals", "another broker")
        .await
        .unwrap();
    for _ in 0..50 {
        seen = total_on(b).await;
        if seen == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen, 6,
        "the refresher never passed once the lease was free"
    );
}

#[tokio::test]
async fn a_stored_pass_serves_the_other_brokers_memory() {
    a_stored_pass_serves_the_other_brokers(Store::Memory).await;
}

#[tokio::test]
async fn a_stored_pass_serves_the_other_brokers_postgres() {
    a_stored_pass_serves_the_other_brokers(Store::Postgres("admin_stored_pass")).await;
}

/// A totals request that finds no pass to answer from (none kept, none stored) waits for one at
/// most ADMIN_TOTALS_WAIT_MS (here 0) and answers 503 with Retry-After, and the pass it started
/// goes on without it: a later request answers from that pass. Were the pass the request's own
/// work, dropped with it, a pass longer than a proxy's timeout would never end.
async fn a_first_pass_outlives_its_request(store: Store) {
    let b = start(
        store,
        ServerConfig {
            admin_inline_partitions: 0,
            admin_totals_wait_ms: 0,
            ..config()
        },
    )
    .await;
    let a = b.addr;
    push(a, "first-pass", "p", &["m1", "m2"]).await;
    let r = Client::connect(a)
        .await
        .get("/api/v1/resources/queues")
        .await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("retry-after")),
        "{:?}",
        r.headers
    );
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("being counted"),
        "{v}"
    );
    let mut answered = None;
    for _ in 0..50 {
        let (code, v) = get(a, "/api/v1/resources/queues").await;
        if code == 200 {
            answered = Some(v);
            break;
        }
        assert_eq!(code, 503, "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v = answered.expect("the pass the first request started never ended");
    assert_eq!(
        by_name(&v["queues"], "name", "first-pass")["messages"]["total"],
        2,
        "{v}"
    );
}

#[tokio::test]
async fn a_first_pass_outlives_its_request_memory() {
    a_first_pass_outlives_its_request(Store::Memory).await;
}

#[tokio::test]
async fn a_first_pass_outlives_its_request_postgres() {
    a_first_pass_outlives_its_request(Store::Postgres("admin_first_pass")).await;
}
