//! Differential property test of the coordination primitives: random sequences of KV batches,
//! lock operations, timer operations, timer firings and transactions with KV and timer riders,
//! applied to the in-memory model and to real PostgreSQL, give the same answers (timestamps
//! aside: the two clocks differ by the milliseconds PostgreSQL's moves between statements; the
//! versions and tokens must match exactly, both counters start at 1 and never roll back).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::Arc;

use proptest::prelude::*;
use queen_core::kv::{self, KvLimits, KvOp};
use queen_core::locks::LockOp;
use queen_core::storage::{Storage, TxOp, TxOpResult};
use queen_core::timers::TimerOp;
use queen_core::Timestamp;
use queen_storage_pg::{testing, PgConfig, PgStorage};
use queen_storage_sim::{ManualClock, SimBugs, SimDb};
use serde_json::{json, Value};

const KEYS: [&str; 3] = ["a", "b", "c/1"];
const OWNERS: [&str; 3] = ["o0", "o1", "o2"];

#[derive(Clone, Debug)]
enum Op {
    /// One to three KV ops in one call; `required` marks the last one.
    Kv(Vec<(u8, usize, u8, bool)>),
    Lock {
        kind: u8,
        owner: usize,
        limit: u32,
    },
    /// One to four schedules (kind 0, 1) and cancels (kind 2) in one call: runs of schedules
    /// go as one statement on PostgreSQL, a timer named twice splits the run.
    Timers(Vec<(u8, usize, u8)>),
    Fire,
    Tx {
        guard_expect: u8,
        with_timer: bool,
    },
    Advance {
        secs: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => prop::collection::vec((0..9u8, 0..3usize, 0..6u8, prop::bool::weighted(0.3)), 1..4).prop_map(Op::Kv),
        3 => (0..4u8, 0..3usize, 1..3u32).prop_map(|(kind, owner, limit)| Op::Lock { kind, owner, limit }),
        2 => prop::collection::vec((0..3u8, 0..3usize, 0..12u8), 1..5).prop_map(Op::Timers),
        1 => Just(Op::Fire),
        1 => (0..4u8, any::<bool>()).prop_map(|(guard_expect, with_timer)| Op::Tx { guard_expect, with_timer }),
        // 4 s and 11 s: never onto a 10 s TTL's boundary (see differential.rs).
        1 => prop_oneof![Just(4i64), Just(11)].prop_map(|secs| Op::Advance { secs }),
    ]
}

/// One KV op from its draw: (kind, key, expected version or value, required).
fn kv_op((kind, key, n, required): &(u8, usize, u8, bool)) -> KvOp {
    let key = KEYS[*key];
    let expect = i64::from(*n);
    let mut v = match kind {
        0 => json!({"op": "get", "key": key}),
        // A string now and then: an incr of it is refused for its type.
        1 if *n == 5 => json!({"op": "put", "key": key, "value": "five", "ttlSeconds": 10}),
        1 => json!({"op": "put", "key": key, "value": n, "ttlSeconds": 10}),
        2 => json!({"op": "put", "key": key, "value": n, "forever": true, "expect": expect}),
        3 => json!({"op": "putIfAbsent", "key": key, "value": n, "ttlSeconds": 10}),
        4 => json!({"op": "delete", "key": key}),
        5 => json!({"op": "check", "key": key, "expect": expect}),
        6 => match n % 3 {
            0 => json!({"op": "incr", "key": key, "max": 3, "ttlSeconds": 10}),
            1 => json!({"op": "incr", "key": key, "delta": -2, "min": 0, "ttlSeconds": 10}),
            _ => json!({"op": "incr", "key": key, "delta": 4, "forever": true}),
        },
        7 => json!({"op": "getPrefix", "prefix": "c", "limit": 1 + expect % 2}),
        _ => json!({"op": "getMany", "keys": KEYS}),
    };
    v["ns"] = json!("n");
    if *required && !matches!(kind, 0 | 7 | 8) {
        v["required"] = json!(true);
    }
    kv::parse_op(&v, &KvLimits::default()).expect("valid")
}

/// Answers without their timestamps.
fn strip(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "expiresAt"
                            | "updatedAt"
                            | "since"
                            | "renewedAt"
                            | "deliverAt"
                            | "createdAt"
                    )
                })
                .map(|(k, v)| (k, strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
        other => other,
    }
}

struct Side {
    storage: Arc<dyn Storage>,
    /// Each owner's last (token, slot).
    held: [Option<(i64, u32)>; 3],
}

async fn apply(side: &mut Side, op: &Op, step: usize) -> Value {
    let s = &side.storage;
    match op {
        Op::Kv(draws) => {
            let ops: Vec<KvOp> = draws.iter().map(kv_op).collect();
            match s.kv_batch(ops).await {
                Ok(b) => json!({"results": strip(json!(b.results)), "failed": b.failed}),
                Err(e) => json!({"error": e.to_string()}),
            }
        }
        Op::Lock { kind, owner, limit } => {
            let name = "L".to_string();
            let lock_op = match (kind, side.held[*owner]) {
                // Half the renews name their owner and send the token before the one held (a
                // renew sent again after its answer was lost), half the token alone.
                (1, Some((token, slot))) => LockOp::Renew {
                    name,
                    token: if token % 2 == 0 { token - 1 } else { token },
                    slot,
                    ttl_seconds: 10,
                    owner: (token % 2 == 0).then(|| OWNERS[*owner].into()),
                },
                (2, Some((token, slot))) => LockOp::Release { name, token, slot },
                (3, _) => LockOp::Get { name },
                _ => LockOp::Acquire {
                    name,
                    ttl_seconds: 10,
                    owner: Some(OWNERS[*owner].into()),
                    limit: *limit,
                },
            };
            match s.lock_op(lock_op, String::new()).await {
                Ok(a) => {
                    if a["acquired"] == true || a["renewed"] == true {
                        side.held[*owner] = Some((
                            a["token"].as_i64().unwrap_or(0),
                            a["slot"].as_u64().unwrap_or(0) as u32,
                        ));
                    } else if a.get("released").is_some() || a["renewed"] == false {
                        side.held[*owner] = None;
                    }
                    strip(a)
                }
                Err(e) => json!({"error": e.to_string()}),
            }
        }
        Op::Timers(calls) => {
            let ops = calls
                .iter()
                .enumerate()
                .map(|(i, (kind, key, delay_s))| {
                    let key = format!("t{key}");
                    let id = step * 8 + i;
                    if *kind == 2 {
                        TimerOp::Cancel {
                            queue: "tq".into(),
                            key,
                            txn: None,
                        }
                    } else {
                        TimerOp::Schedule {
                            queue: "tq".into(),
                            key,
                            partition: "p".into(),
                            payload: format!("{{\"step\":{id}}}").into_bytes(),
                            delay_ms: i64::from(*delay_s) * 1000,
                            txn: format!("txn-{id}"),
                            message_id: uuid::Uuid::from_u128((1u128 << 64) + id as u128),
                        }
                    }
                })
                .collect();
            match s.timers_batch(ops).await {
                Ok(r) => strip(json!(r)),
                Err(e) => json!({"error": e.to_string()}),
            }
        }
        Op::Fire => {
            let due = match s.due_timers(10, &[]).await {
                Ok(d) => d,
                Err(e) => return json!({"error": e.to_string()}),
            };
            // Sorted: due times that tie on the model's clock differ by PostgreSQL's milliseconds.
            let mut keys: Vec<String> = due.iter().map(|d| d.key.clone()).collect();
            keys.sort();
            if due.is_empty() {
                return json!({"due": keys});
            }
            match s.transaction(queen_core::storage::firing(&due)).await {
                Ok(out) => json!({"due": keys, "committed": out.committed}),
                Err(e) => json!({"error": e.to_string()}),
            }
        }
        Op::Tx {
            guard_expect,
            with_timer,
        } => {
            let mut ops = vec![
                TxOp::Kv(kv_op(&(1, 1, 7, false))),
                TxOp::Kv(kv_op(&(5, 0, *guard_expect, true))),
            ];
            if *with_timer {
                ops.push(TxOp::Timer(TimerOp::Schedule {
                    queue: "tq".into(),
                    key: "rider".into(),
                    partition: "p".into(),
                    payload: b"{}".to_vec(),
                    delay_ms: 0,
                    txn: format!("rider-{step}"),
                    message_id: uuid::Uuid::from_u128(step as u128 + 1),
                }));
            }
            match s.transaction(ops).await {
                Ok(out) => {
                    let results: Vec<Value> = out
                        .results
                        .into_iter()
                        .map(|r| match r {
                            TxOpResult::Kv { answer, .. } | TxOpResult::Timer(answer) => {
                                strip(answer)
                            }
                            other => json!(format!("{other:?}")),
                        })
                        .collect();
                    json!({"committed": out.committed, "error": out.error, "results": results})
                }
                Err(e) => json!({"error": e.to_string()}),
            }
        }
        Op::Advance { .. } => Value::Null,
    }
}

async fn run(ops: Vec<Op>, case: usize) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let model = SimDb::new(5, clock.as_sim_clock(), SimBugs::default());
    let name = format!("queen_diffc_{}_{case}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg,
        pool_size: 2,
    })
    .await
    .expect("pg");
    let mut a = Side {
        storage: model.clone(),
        held: [None; 3],
    };
    let mut b = Side {
        storage: Arc::new(pg.clone()),
        held: [None; 3],
    };
    let mut trace = vec![];
    for (i, op) in ops.iter().enumerate() {
        if let Op::Advance { secs } = op {
            clock.advance_millis(secs * 1000);
            pg.advance_clock(*secs).await.expect("advance");
        }
        let x = apply(&mut a, op, i).await;
        let y = apply(&mut b, op, i).await;
        trace.push(format!("step {i} {op:?}\n  model: {x}\n  pg:    {y}"));
        if x != y {
            return Err(TestCaseError::fail(format!(
                "step {i}: model and PostgreSQL differ; trace:\n{}",
                trace.join("\n")
            )));
        }
    }
    testing::drop_database(&name).await;
    Ok(())
}

fn cases() -> u32 {
    std::env::var("DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32)
}

#[test]
fn model_and_postgres_agree_on_coordination() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        let case = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        rt.block_on(run(ops, case))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
