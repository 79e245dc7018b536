//! Generated requests against every route with a body or parameters: arbitrary JSON of every
//! shape, fields of the wrong type, and raw bytes. Every answer is a 2xx or a 4xx with a JSON
//! error, the server keeps serving, and a 4xx changes nothing. `PROPTEST_CASES` sets the count.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Client, Store, TestBroker};
use proptest::prelude::*;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/v1/push"),
    ("POST", "/api/v1/ack"),
    ("POST", "/api/v1/ack/batch"),
    ("POST", "/api/v1/lease/l-1/extend"),
    ("POST", "/api/v1/configure"),
    ("POST", "/api/v1/transaction"),
    ("POST", "/api/v1/consumer-groups/g/queues/fz/seek"),
    ("POST", "/api/v1/consumer-groups/g/subscription"),
    ("POST", "/api/v1/system/maintenance/pop"),
    ("POST", "/api/v1/kv"),
    ("PUT", "/api/v1/kv/fz/k"),
    ("POST", "/api/v1/locks"),
    ("POST", "/api/v1/timers"),
    ("POST", "/api/v1/fetch"),
    ("POST", "/api/v1/partitions/changed"),
    ("POST", "/streams/v1/queries"),
    ("POST", "/streams/v1/state/get"),
    ("POST", "/streams/v1/cycle"),
];

/// Field names the routes read, so generated objects hit real fields, not only unknown ones.
const FIELDS: &[&str] = &[
    "items",
    "queue",
    "partition",
    "transactionId",
    "traceId",
    "data",
    "payload",
    "partitionId",
    "leaseId",
    "status",
    "error",
    "consumerGroup",
    "acknowledgments",
    "seconds",
    "options",
    "leaseTime",
    "retryLimit",
    "priority",
    "namespace",
    "task",
    "operations",
    "type",
    "requiredLeases",
    "toEnd",
    "timestamp",
    "subscriptionTimestamp",
    "enabled",
    "op",
    "ns",
    "key",
    "keys",
    "prefix",
    "value",
    "ttlSeconds",
    "forever",
    "expect",
    "required",
    "delta",
    "max",
    "name",
    "token",
    "owner",
    "limit",
    "timerKey",
    "delayMs",
    "txn",
    "kv",
    "timers",
    "entries",
    "offset",
    "maxBytes",
    "since",
    "after",
    "source_queue",
    "sink_queue",
    "config_hash",
    "reset",
    "query_id",
    "partition_id",
    "consumer_group",
    "state_ops",
    "push_items",
    "ack",
    "release_lease",
    "key_prefix",
    "ripe_at_or_before",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("fz"),
            Just("p"),
            Just("g"),
            Just("a\u{0}b"),
            Just("2026-02-30")
        ]
        .prop_map(|s| json!(s)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// What a refused request must leave alone: the queues, and the messages stored.
async fn fingerprint(b: &TestBroker) -> (Vec<String>, u64) {
    let queues = b
        .app
        .storage
        .pops
        .queues_matching(None, None)
        .await
        .unwrap();
    (queues, b.app.metrics.messages_pushed.get())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    // (PROPTEST_CASES overrides the count.)

    #[test]
    fn every_generated_request_is_answered_2xx_or_4xx(route in 0..ROUTES.len(), body in body()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let b = start(Store::Memory, ServerConfig { max_body_bytes: 4096, ..ServerConfig::default() }).await;
            let (method, path) = ROUTES[route];
            let before = fingerprint(&b).await;
            let mut c = Client::connect(b.addr).await;
            let r = c.send(method, path, Some(&body)).await;
            prop_assert!(
                (200..300).contains(&r.status) || (400..500).contains(&r.status),
                "{method} {path} {:?}: {}", String::from_utf8_lossy(&body), r.status
            );
            if r.status >= 400 {
                prop_assert!(r.json().get("error").is_some(), "a 4xx without a JSON error");
                prop_assert_eq!(fingerprint(&b).await, before, "a refused request changed state");
            }
            // Still serving.
            let h = Client::connect(b.addr).await.get("/health").await;
            prop_assert_eq!(h.status, 200);
            b.app.shutting_down.send_replace(true);
            Ok(())
        })?;
    }
}
