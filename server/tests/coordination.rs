//! The coordination surfaces with several brokers on one PostgreSQL: timers fired once whichever
//! broker fires them, lock permits exclusive across brokers with rising tokens, and bad input
//! refused whole on both backends.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::collections::BTreeSet;

use base64::Engine;
use common::{pop_until, request, start, start_pair, Store};
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

fn schedule(queue: &str, key: &str, delay_ms: u64) -> Value {
    let payload = base64::engine::general_purpose::STANDARD.encode(json!({"k": key}).to_string());
    json!({"op": "schedule", "queue": queue, "timerKey": key, "payload": payload,
           "delayMs": delay_ms, "txn": key})
}

/// Schedules `ops` in one call, which must answer 200; its answer.
async fn post_timers(addr: std::net::SocketAddr, ops: Vec<Value>) -> Value {
    let r = request(
        addr,
        "POST",
        "/api/v1/timers",
        Some(&json!({"operations": ops})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// 400 timers due together, scheduled through two brokers (so both workers fire): each message
/// is stored and delivered once, and the brokers' firings add up to the timers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_fire_each_timer_once() {
    let (a, b) = start_pair("queen_timers_pair", ServerConfig::default()).await;
    let mut keys = BTreeSet::new();
    for (broker, side) in [(&a, "a"), (&b, "b")] {
        for chunk in 0..2 {
            let ops: Vec<Value> = (0..100)
                .map(|i| {
                    let key = format!("{side}-{chunk}-{i}");
                    keys.insert(key.clone());
                    schedule("due", &key, 400)
                })
                .collect();
            let answer = post_timers(broker.addr, ops).await;
            assert!(answer["results"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["ok"] == true));
        }
    }
    let seen = pop_until(b.addr, None, "due", keys.len(), "transactionId").await;
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        keys,
        "every timer's message, once"
    );
    let fired = a.app.metrics.timers_fired.get() + b.app.metrics.timers_fired.get();
    assert_eq!(
        fired,
        keys.len() as u64,
        "the brokers' firings add up to the timers: none fired twice"
    );
    let left = request(a.addr, "GET", "/api/v1/timers/due", None)
        .await
        .json();
    assert_eq!(left["rows"], json!([]), "no timer is left pending");
}

/// A queue at its maxSize refuses its timers' pushes: those timers stay pending and fire once
/// the queue has room, while the timers of other queues fire on time. More of them are due
/// (earlier) than the worker fires in one set: before, the worker read the same full queue's
/// timers again and again, refusing each one at a time, and the other queue's timer never came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_back_only_its_own_timers() {
    for store in [Store::Memory, Store::Postgres("queen_timers_full")] {
        let broker = start(store, ServerConfig::default()).await;
        let r = request(
            broker.addr,
            "POST",
            "/api/v1/configure",
            Some(&json!({"queue": "capped", "options": {"maxSize": 1}})),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let r = request(
            broker.addr,
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "capped", "payload": {"first": true}}]})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        for chunk in 0..5 {
            let ops: Vec<Value> = (0..250)
                .map(|i| schedule("capped", &format!("c-{chunk}-{i}"), 50))
                .collect();
            post_timers(broker.addr, ops).await;
        }
        // One due with the full queue's (in the same set), one after them all.
        post_timers(
            broker.addr,
            vec![
                schedule("open", "o-with", 50),
                schedule("open", "o-after", 300),
            ],
        )
        .await;

        let seen = pop_until(broker.addr, None, "open", 2, "transactionId").await;
        assert_eq!(
            seen.keys().cloned().collect::<Vec<_>>(),
            ["o-after", "o-with"],
            "the other queue's timers fire beside and behind 1,250 refused ones"
        );
        let pending = request(broker.addr, "GET", "/api/v1/timers/capped?limit=1000", None)
            .await
            .json();
        assert_eq!(
            pending["rows"].as_array().map(Vec::len),
            Some(1000),
            "the full queue's timers stay pending: {}",
            pending["rows"].as_array().map_or(0, Vec::len)
        );
        // Room in the queue: one more of its timers fires (maxSize 1 again), at the retry.
        let first = pop_until(broker.addr, None, "capped", 1, "transactionId").await;
        assert_eq!(first.len(), 1, "the message that filled the queue");
        let next = pop_until(broker.addr, None, "capped", 1, "transactionId").await;
        assert!(
            next.keys().all(|k| k.starts_with("c-")) && next.len() == 1,
            "a pending timer fires once the queue has room: {next:?}"
        );
    }
}

/// Eight holders on two brokers take a lock in turn: never two at once, tokens rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_permits_are_exclusive_across_brokers() {
    let (a, b) = start_pair("queen_locks_pair", ServerConfig::default()).await;
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let mut tasks = vec![];
    for h in 0..8 {
        let addr = if h % 2 == 0 { a.addr } else { b.addr };
        let (holding, tokens) = (holding.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("holder-{h}");
            for _ in 0..3 {
                let acquired = loop {
                    let r = request(
                        addr,
                        "POST",
                        "/api/v1/locks",
                        Some(&json!({"operations": [
                        {"op": "acquire", "name": "shared", "ttlSeconds": 30, "owner": owner}]})),
                    )
                    .await;
                    let answer = r.json()["results"][0].clone();
                    if answer["acquired"] == true {
                        break answer;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                };
                assert_eq!(
                    holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens
                    .lock()
                    .unwrap()
                    .push(acquired["token"].as_i64().unwrap());
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let r = request(
                    addr,
                    "POST",
                    "/api/v1/locks",
                    Some(&json!({"operations": [
                    {"op": "release", "name": "shared", "token": acquired["token"]}]})),
                )
                .await;
                assert_eq!(r.json()["results"][0]["released"], true);
            }
        }));
    }
    for t in tasks {
        t.await.expect("holder");
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 24);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens rise in the order holders took the lock: {tokens:?}"
    );
}

/// Malformed calls are refused whole with the client's code, on both backends, and change
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_whole_on_both_backends() {
    for store in [Store::Memory, Store::Postgres("queen_coord_bad")] {
        let broker = start(store, ServerConfig::default()).await;
        let cases = [
            (
                "/api/v1/kv",
                json!({"operations": [
                {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": true},
                {"op": "put", "ns": "n", "key": "k2", "value": 1}]}),
                "kv_expiry_not_specified",
            ),
            (
                "/api/v1/kv",
                json!({"operations": [{"op": "put", "ns": "n", "key": "x".repeat(2000), "value": 1, "forever": true}]}),
                "kv_key_too_long",
            ),
            (
                "/api/v1/kv",
                json!({"operations": (0..257).map(|_| json!({"op": "get", "ns": "n", "key": "k"})).collect::<Vec<_>>()}),
                "kv_too_many_operations",
            ),
            (
                "/api/v1/kv",
                json!({"operations": [{"op": "frobnicate", "ns": "n", "key": "k"}]}),
                "kv_invalid_operation",
            ),
            ("/api/v1/kv", json!({"nope": 1}), "kv_invalid_operation"),
            (
                "/api/v1/locks",
                json!({"operations": [{"op": "acquire", "name": "a#b", "ttlSeconds": 5}]}),
                "locks_invalid_operation",
            ),
            (
                "/api/v1/timers",
                json!({"operations": [schedule("q", "ok", 10), {"op": "schedule", "queue": "q", "timerKey": "late",
                "payload": "e30=", "delayMs": 91u64 * 86_400_000, "txn": "t"}]}),
                "timers_delay_beyond_horizon",
            ),
            (
                "/api/v1/timers",
                json!({"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "e30=",
                "delayMs": 10, "txn": "t", "deliverAt": "2030-01-01T00:00:00Z"}]}),
                "timers_server_owned_field",
            ),
        ];
        for (path, body, code) in cases {
            let r = request(broker.addr, "POST", path, Some(&body)).await;
            assert_eq!(
                r.status,
                400,
                "{path} {body}: {}",
                String::from_utf8_lossy(&r.body)
            );
            // Queen's clients branch on the surface's code; the specific one is the reason.
            let surface = &code[..code.find('_').unwrap()];
            assert_eq!(
                r.json()["code"],
                format!("{surface}_bad_request"),
                "{path}: {}",
                String::from_utf8_lossy(&r.body)
            );
            assert_eq!(
                r.json()["reason"],
                code,
                "{path}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
        let k = request(
            broker.addr,
            "POST",
            "/api/v1/kv",
            Some(&json!({"operations": [{"op": "get", "ns": "n", "key": "k"}]})),
        )
        .await;
        assert_eq!(
            k.json()["results"][0]["found"],
            false,
            "the refused call stored nothing"
        );
        let t = request(broker.addr, "GET", "/api/v1/timers/q/ok", None).await;
        assert_eq!(
            t.json()["found"],
            false,
            "the refused timers call stored nothing"
        );
    }
}
