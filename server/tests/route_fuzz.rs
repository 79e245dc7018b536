//! Generated requests against every route of the table that takes a body (POST and PUT):
//! arbitrary JSON of every shape, fields of the wrong type, and raw bytes. Every answer is a
//! 2xx or a 4xx with a JSON error, the server keeps serving, and a 4xx changes nothing.
//! `PROPTEST_CASES` sets the count.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use common::{start, Client, Store, TestBroker};
use proptest::prelude::*;
use queen_server::config::ServerConfig;
use queen_server::routes::{Verb, ROUTES};
use serde_json::{json, Value};

/// Every route of the table that takes a body (POST and PUT), its path parameters filled with
/// their own names: a route added to the table is fuzzed without being listed here.
fn body_routes() -> Vec<(&'static str, String)> {
    ROUTES
        .iter()
        .filter(|r| matches!(r.verb, Verb::Post | Verb::Put))
        .map(|r| {
            let path: String = r
                .pattern
                .split('/')
                .map(|s| s.trim_matches(|c| c == '{' || c == '}' || c == '*'))
                .collect::<Vec<_>>()
                .join("/");
            (r.verb.as_str(), path)
        })
        .collect()
}

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

#[test]
fn the_fuzz_reaches_every_route_with_a_body() {
    let routes = body_routes();
    for path in [
        "/api/v1/push",
        "/api/v1/ephemeral/push",
        "/streams/v1/cycle",
        "/api/v1/traces",
    ] {
        assert!(
            routes.iter().any(|(_, p)| p == path),
            "{path} is fuzzed: {routes:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::default())]
    // 256 cases, proptest's default; PROPTEST_CASES sets another count.

    #[test]
    fn every_generated_request_is_answered_2xx_or_4xx(route in 0..body_routes().len(), body in body()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let b = start(Store::Memory, ServerConfig { max_body_bytes: 4096, ..ServerConfig::default() }).await;
            let (method, path) = body_routes().swap_remove(route);
            let before = fingerprint(&b).await;
            let mut c = Client::connect(b.addr).await;
            let r = c.send(method, &path, Some(&body)).await;
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
