//! The KV store on real PostgreSQL under concurrent callers: each key's history (puts through
//! the one-statement path, guarded puts, putIfAbsent, deletes and gets, all racing on two keys)
//! is checked for linearizability by the simulation's checker (`sim::kv_check`), so that the
//! version drawn after an insert or under a row lock is held to the same spec as the model.
//! Requires DATABASE_URL (the test command starts a throwaway PostgreSQL and sets it).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use queen_core::kv::{self, KvLimits};
use queen_core::rng::SeededRng;
use queen_core::storage::KvStorage;
use queen_sim_tests::sim::kv_check::{check_key, KvCall, KvCallOp, Verdict};
use queen_storage_pg::testing;
use serde_json::json;

const KEYS: [&str; 2] = ["a", "b"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_kv_histories_are_linearizable_on_postgres() {
    let storage =
        Arc::new(testing::fresh_database(&format!("queen_kv_lin_{}", std::process::id()), 8).await);
    // Real-time order without a clock: a call's invocation and answer each take the next tick
    // of one counter, so an answer ticked before an invocation really came first.
    let ticks = Arc::new(AtomicI64::new(0));
    let calls: Arc<Mutex<Vec<KvCall>>> = Arc::new(Mutex::new(vec![]));
    let mut tasks = vec![];
    for who in 0..6i64 {
        let (storage, calls, ticks) = (storage.clone(), calls.clone(), ticks.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = SeededRng::new(7).child(&format!("caller{who}"));
            let mut seen: std::collections::BTreeMap<&str, i64> = Default::default();
            for n in 0..80i64 {
                let key = KEYS[rng.below(2) as usize];
                let value = (who + 1) * 1_000_000 + n;
                let last = seen.get(key).copied();
                let (op, wire) = match rng.below(100) {
                    0..30 => (
                        KvCallOp::Get,
                        json!({"op": "get", "ns": "lin", "key": key}),
                    ),
                    30..60 => (
                        KvCallOp::Put {
                            value,
                            expect: None,
                        },
                        json!({"op": "put", "ns": "lin", "key": key, "value": value, "forever": true}),
                    ),
                    60..70 => (
                        KvCallOp::Put {
                            value,
                            expect: Some(0),
                        },
                        json!({"op": "putIfAbsent", "ns": "lin", "key": key, "value": value, "forever": true}),
                    ),
                    70..85 => {
                        let e = last.unwrap_or(1);
                        (
                            KvCallOp::Put {
                                value,
                                expect: Some(e),
                            },
                            json!({"op": "put", "ns": "lin", "key": key, "value": value, "forever": true, "expect": e}),
                        )
                    }
                    _ => (
                        KvCallOp::Delete { expect: None },
                        json!({"op": "delete", "ns": "lin", "key": key}),
                    ),
                };
                let parsed = kv::parse_op(&wire, &KvLimits::default()).expect("a valid op");
                let invoked = ticks.fetch_add(1, Ordering::SeqCst);
                let answered = match storage.kv_batch(vec![parsed]).await {
                    Ok(batch) => {
                        let r = batch.results[0].clone();
                        if let Some(v) = r["version"].as_i64() {
                            seen.insert(key, v);
                        }
                        Some((ticks.fetch_add(1, Ordering::SeqCst), r))
                    }
                    // An error's outcome is unknown to the caller, as a lost answer's is.
                    Err(_) => None,
                };
                calls.lock().unwrap().push(KvCall {
                    client: format!("caller{who}"),
                    key: key.to_string(),
                    op,
                    invoked,
                    answered,
                });
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let calls = calls.lock().unwrap().clone();
    let applied = calls
        .iter()
        .filter(|c| {
            c.answered
                .as_ref()
                .is_some_and(|(_, a)| a["applied"] == true)
        })
        .count();
    assert!(applied > 100, "the callers wrote: {applied} writes applied");
    for key in KEYS {
        let mine: Vec<KvCall> = calls.iter().filter(|c| c.key == key).cloned().collect();
        assert_eq!(
            check_key(&mine, 5_000_000),
            Verdict::Linearizable,
            "the history of key {key} on PostgreSQL"
        );
    }
}
