//! Reads by offset and partition discovery over real HTTP, on both backends: the answer shapes,
//! the byte budgets, an encrypted queue read in plaintext, and bad input refused whole.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::sync::Arc;

use common::{request, start, Store};
use queen_server::config::ServerConfig;
use queen_server::sealing::PayloadCipher;
use serde_json::{json, Value};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn keyed() -> ServerConfig {
    ServerConfig {
        cipher: Some(Arc::new(PayloadCipher::from_hex(KEY).unwrap())),
        ..ServerConfig::default()
    }
}

async fn push(addr: std::net::SocketAddr, queue: &str, partition: &str, n: std::ops::Range<u32>) {
    let items: Vec<Value> = n
        .map(|i| json!({"queue": queue, "partition": partition, "transactionId": format!("{partition}-{i}"),
                        "payload": {"n": i, "pad": "0123456789"}}))
        .collect();
    let r = request(
        addr,
        "POST",
        "/api/v1/push",
        Some(&json!({ "items": items })),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

async fn fetch(addr: std::net::SocketAddr, body: Value) -> Value {
    let r = request(addr, "POST", "/api/v1/fetch", Some(&body)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// A fetch with `?frames=true`, its `QRF1` answer rendered as the JSON answer would be.
async fn framed_as_json(addr: std::net::SocketAddr, body: &Value) -> Value {
    let r = request(addr, "POST", "/api/v1/fetch?frames=true", Some(body)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.header("content-type"),
        Some(queen_core::wire::FETCH_FRAMES_CONTENT_TYPE)
    );
    let entries: Vec<Value> = queen_core::wire::decode_fetch_frames(&r.body)
        .unwrap()
        .iter()
        .map(|e| {
            let records: Vec<Value> = e
                .records
                .iter()
                .map(|r| {
                    json!({"offset": r.offset, "transactionId": r.transaction_id,
                           "payload": serde_json::from_slice::<Value>(r.payload).unwrap(),
                           "ts": queen_core::time::format_iso_micros(queen_core::Timestamp(r.ts_us))})
                })
                .collect();
            let mut entry = json!({"queue": e.queue, "partition": e.partition, "records": records,
                                   "highWatermark": e.high_watermark, "logStartOffset": e.log_start});
            if let Some(error) = e.error {
                entry["error"] = json!(error);
            }
            entry
        })
        .collect();
    json!({ "entries": entries })
}

fn offsets(entry: &Value) -> Vec<i64> {
    entry["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["offset"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_answers_records_ranges_and_errors_on_both_backends() {
    for store in [Store::Memory, Store::Postgres("queen_reads_http")] {
        let b = start(store, keyed()).await;
        let configured = request(
            b.addr,
            "POST",
            "/api/v1/configure",
            Some(&json!({"queue": "sealed", "options": {"encryptionEnabled": true}})),
        )
        .await;
        assert_eq!(configured.status, 200);
        push(b.addr, "open", "p", 0..5).await;
        push(b.addr, "open", "p", 5..8).await;
        push(b.addr, "sealed", "p", 0..2).await;
        let fetch_body = json!({"entries": [
            {"queue": "open", "partition": "p", "offset": 2, "maxBytes": 1_000_000},
            {"queue": "sealed", "partition": "p", "offset": 0},
            {"queue": "open", "partition": "nope", "offset": 0},
            {"queue": "open", "partition": "p", "offset": 9}],
           "maxBytes": 1_000_000});
        let a = fetch(b.addr, fetch_body.clone()).await;
        let e = a["entries"].as_array().unwrap();
        assert_eq!(
            framed_as_json(b.addr, &fetch_body).await,
            a,
            "the framed answer carries what the JSON answer does"
        );
        assert_eq!(offsets(&e[0]), (2..8).collect::<Vec<_>>());
        assert_eq!(e[0]["records"][0]["transactionId"], "p-2");
        assert_eq!(e[0]["records"][0]["payload"]["n"], 2);
        assert_eq!(
            (
                e[0]["highWatermark"].as_i64(),
                e[0]["logStartOffset"].as_i64()
            ),
            (Some(8), Some(0))
        );
        assert!(e[0].get("error").is_none());
        assert_eq!(
            e[1]["records"][1]["payload"],
            json!({"n": 1, "pad": "0123456789"}),
            "an encrypted queue reads in plaintext"
        );
        assert_eq!(e[2]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(e[3]["error"], "OFFSET_OUT_OF_RANGE");
        assert_eq!(e[3]["highWatermark"], 8);
        // Budgets: each record's payload is 26 bytes; an entry of 60 takes two, the call's 80
        // leaves the second entry one; a call of 1 byte still reads its first record.
        let budget = fetch(
            b.addr,
            json!({"entries": [
                {"queue": "open", "partition": "p", "offset": 0, "maxBytes": 60},
                {"queue": "open", "partition": "p", "offset": 4, "maxBytes": 60}],
               "maxBytes": 80}),
        )
        .await;
        assert_eq!(offsets(&budget["entries"][0]), vec![0, 1]);
        assert_eq!(offsets(&budget["entries"][1]), vec![4]);
        let tiny = fetch(
            b.addr,
            json!({"entries": [{"queue": "open", "partition": "p", "offset": 0, "maxBytes": 1},
                               {"queue": "open", "partition": "p", "offset": 1, "maxBytes": 1}],
                   "maxBytes": 1}),
        )
        .await;
        assert_eq!(
            offsets(&tiny["entries"][0]),
            vec![0],
            "progress: the call's first record"
        );
        assert_eq!(offsets(&tiny["entries"][1]), Vec::<i64>::new());
        assert_eq!(
            tiny["entries"][1]["highWatermark"], 8,
            "a starved entry still has its range"
        );
        let changed = request(
            b.addr,
            "POST",
            "/api/v1/partitions/changed",
            Some(&json!({"entries": [{"queue": "open"}, {"queue": "absent"}]})),
        )
        .await;
        assert_eq!(changed.status, 200);
        let c = changed.json();
        assert_eq!(c["entries"][0]["partitions"][0]["name"], "p");
        assert_eq!(c["entries"][0]["partitions"][0]["lastOffset"], 7);
        assert_eq!(c["entries"][1]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
        assert!(c["safeTime"].as_str().unwrap().ends_with('Z'));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reads_are_refused_whole_on_both_backends() {
    for store in [Store::Memory, Store::Postgres("queen_reads_bad")] {
        let b = start(store, ServerConfig::default()).await;
        push(b.addr, "q", "p", 0..2).await;
        let entry = json!({"queue": "q", "partition": "p", "offset": 0});
        let cases = [
            ("/api/v1/fetch", json!({"nope": 1})),
            (
                "/api/v1/fetch",
                json!({"entries": [entry, {"queue": "q", "partition": "p", "offset": -1}]}),
            ),
            (
                "/api/v1/fetch",
                json!({"entries": [{"queue": "q", "partition": "p", "offset": "0"}]}),
            ),
            (
                "/api/v1/fetch",
                json!({"entries": [{"queue": "", "partition": "p"}]}),
            ),
            (
                "/api/v1/fetch",
                json!({"entries": [{"queue": "q", "partition": "p", "maxBytes": 0}]}),
            ),
            (
                "/api/v1/fetch",
                json!({"entries": [{"queue": "q", "partition": "p", "maxBytes": 9_000_000}]}),
            ),
            ("/api/v1/fetch", json!({"entries": [entry], "maxBytes": 0})),
            (
                "/api/v1/fetch",
                json!({"entries": vec![entry.clone(); 1025]}),
            ),
            ("/api/v1/fetch", json!({"entries": [7]})),
            ("/api/v1/fetch?frames=maybe", json!({"entries": [entry]})),
            (
                "/api/v1/partitions/changed",
                json!({"entries": [{"queue": "q", "since": "yesterday"}]}),
            ),
            (
                "/api/v1/partitions/changed",
                json!({"entries": [{"queue": "q", "limit": 1001}]}),
            ),
            (
                "/api/v1/partitions/changed",
                json!({"entries": [{"queue": "q", "after": 3}]}),
            ),
            (
                "/api/v1/partitions/changed",
                json!({"entries": [{"limit": 10}]}),
            ),
        ];
        for (path, body) in cases {
            let r = request(b.addr, "POST", path, Some(&body)).await;
            assert_eq!(
                r.status,
                400,
                "{path} {body}: {}",
                String::from_utf8_lossy(&r.body)
            );
            assert_eq!(r.json()["code"], "read_invalid", "{path} {body}");
            assert!(
                r.json()["error"].as_str().is_some_and(|e| !e.is_empty()),
                "a clear error"
            );
        }
        let raw = request(b.addr, "POST", "/api/v1/fetch", None).await;
        assert_eq!(raw.status, 400, "an empty body");
    }
}
