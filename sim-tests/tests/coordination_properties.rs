//! Property tests of the coordination primitives over interleaved transactions: waves of
//! concurrent KV, lock and timer operations on the model, scheduled statement by statement from
//! one seed, with model time moving between waves (across TTLs and due times).
//!
//! - KV: every key's history is linearizable against the sequential rules (`queen_core::kv`),
//!   and a key's version rises with every write of it, across deletes and expiries.
//! - Locks: never more live permits than the limit; tokens only rise; an acquire is refused only
//!   when the permits are taken (a wave that began with a free permit admits an acquire).
//! - Timers: each incarnation fires at most once (two brokers fire every due set concurrently),
//!   never before it is due, and every incarnation that was not replaced or cancelled fires.
//!
//! Each property has a switch re-introducing the bug it guards against (`SimBugs`), and a test
//! proving the property catches it within the seed budget. `SIM_SEED=<n>` replays one seed.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::collections::BTreeMap;

use queen_core::kv::{self, Decision, KvLimits, KvOp, KvRow};
use queen_core::locks::LockOp;
use queen_core::rng::SeededRng;
use queen_core::storage::{KvStorage, TimerStorage, TxOp};
use queen_core::timers::TimerOp;
use queen_core::Timestamp;
use queen_sim_tests::fixtures::block_on;
use queen_storage_sim::sched::{Interleaving, Op, OpResult};
use queen_storage_sim::{ManualClock, SimBugs, SimDb};
use serde_json::{json, Value};

const T0: Timestamp = Timestamp(1_700_000_000_000_000);
const WAVES: usize = 8;
const MAX_STEPS: usize = 20_000;

fn seeds(default: u64) -> Vec<u64> {
    match std::env::var("SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SIM_SEED is a number")],
        Err(_) => (0..default).collect(),
    }
}

/// Model time between waves: none, past no TTL (4 s), or past every 10 s TTL (11 s). Sums of 4s
/// and 11s never equal 10, so no expiry lands exactly on a wave.
fn advance(rng: &mut SeededRng, clock: &ManualClock) {
    match rng.below(3) {
        0 => {}
        1 => clock.advance_millis(4_000),
        _ => clock.advance_millis(11_000),
    }
}

// ---------------------------------------------------------------------------------------------
// KV: per-key linearizability.
// ---------------------------------------------------------------------------------------------

fn kv_op(rng: &mut SeededRng, key: &str, seen: &[i64]) -> KvOp {
    let expiry = if rng.chance(1, 2) {
        json!({"ttlSeconds": 10})
    } else {
        json!({"forever": true})
    };
    let expect = |rng: &mut SeededRng| -> i64 {
        match rng.below(3) {
            0 => 0,
            _ if !seen.is_empty() => seen[rng.below(seen.len() as u64) as usize],
            _ => 1 + rng.below(4) as i64,
        }
    };
    let mut v = match rng.below(8) {
        0 => json!({"op": "get"}),
        1 => json!({"op": "put", "value": rng.below(100)}),
        2 => json!({"op": "put", "value": rng.below(100), "expect": expect(rng)}),
        3 => json!({"op": "putIfAbsent", "value": rng.below(100)}),
        4 => json!({"op": "delete"}),
        5 => json!({"op": "delete", "expect": expect(rng)}),
        6 => json!({"op": "check", "expect": expect(rng)}),
        _ => json!({"op": "incr", "max": 3}),
    };
    v["ns"] = json!("n");
    v["key"] = json!(key);
    if matches!(v["op"].as_str(), Some("put" | "putIfAbsent" | "incr")) {
        for (k, x) in expiry.as_object().unwrap() {
            v[k] = x.clone();
        }
    }
    kv::parse_op(&v, &KvLimits::default()).expect("the workload's ops are valid")
}

/// A key's state in one sequential order: its row, and the highest version it ever had.
#[derive(Clone, Debug, PartialEq)]
struct KeyState {
    row: Option<KvRow>,
    max_version: i64,
}

/// Applies `op` with its observed answer to `state` at `now` under the sequential rules: the
/// next state, or why the answer is impossible at this point of the order.
fn spec_step(
    state: &KeyState,
    op: &KvOp,
    answer: &Value,
    now: Timestamp,
) -> Result<KeyState, String> {
    let key = op.key().unwrap_or_default();
    match kv::decide(op, state.row.as_ref(), now) {
        Decision::Answer { answer: want, .. } => {
            if &want != answer {
                return Err(format!("answered {answer}, the rules say {want}"));
            }
            Ok(state.clone())
        }
        Decision::Delete { answer: want } => {
            if &want != answer {
                return Err(format!("answered {answer}, the rules say {want}"));
            }
            Ok(KeyState {
                row: None,
                max_version: state.max_version,
            })
        }
        Decision::Write { value, expires_at } => {
            let version = answer["version"].as_i64().unwrap_or(-1);
            let row = KvRow {
                value,
                version,
                expires_at,
                updated_at: now,
            };
            if answer != &kv::written(key, &row) {
                return Err(format!(
                    "answered {answer}, the rules write {}",
                    kv::written(key, &row)
                ));
            }
            if version <= state.max_version {
                return Err(format!(
                    "version {version} does not rise above {} (a recycled version)",
                    state.max_version
                ));
            }
            Ok(KeyState {
                row: Some(row),
                max_version: version,
            })
        }
    }
}

/// Every state reachable by some order of `wave` (ops of one key, all concurrent) from `from`.
fn linearize(
    from: &[KeyState],
    wave: &[(KvOp, Value)],
    now: Timestamp,
) -> Result<Vec<KeyState>, String> {
    let mut out: Vec<KeyState> = vec![];
    let mut last_err = String::new();
    let n = wave.len();
    let mut order: Vec<usize> = (0..n).collect();
    // Heap's algorithm over the wave's orders (at most 4! = 24).
    let mut c = vec![0usize; n];
    let mut try_order = |order: &[usize], out: &mut Vec<KeyState>| {
        for start in from {
            let mut s = start.clone();
            let mut ok = true;
            for &i in order {
                match spec_step(&s, &wave[i].0, &wave[i].1, now) {
                    Ok(next) => s = next,
                    Err(e) => {
                        last_err = format!("{:?}: {e}", wave[i].0);
                        ok = false;
                        break;
                    }
                }
            }
            if ok && !out.contains(&s) {
                out.push(s);
            }
        }
    };
    try_order(&order, &mut out);
    let mut i = 0;
    while i < n {
        if c[i] < i {
            if i % 2 == 0 {
                order.swap(0, i);
            } else {
                order.swap(c[i], i);
            }
            try_order(&order, &mut out);
            c[i] += 1;
            i = 0;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
    if out.is_empty() {
        Err(format!("no sequential order explains the wave: {last_err}"))
    } else {
        Ok(out)
    }
}

fn kv_case(seed: u64, bugs: SimBugs) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let db = SimDb::new(seed, clock.as_sim_clock(), bugs);
    let mut rng = SeededRng::new(seed).child("kv-workload");
    let keys = ["a", "b"];
    let mut states: BTreeMap<&str, Vec<KeyState>> = keys
        .iter()
        .map(|k| {
            (
                *k,
                vec![KeyState {
                    row: None,
                    max_version: 0,
                }],
            )
        })
        .collect();
    let mut seen: Vec<i64> = vec![];
    for wave in 0..WAVES {
        let now = clock.now();
        let mut run = Interleaving::new(db.clone(), seed ^ (wave as u64) << 32);
        let mut ops = vec![];
        for _ in 0..2 + rng.below(3) {
            let key = keys[rng.below(2) as usize];
            let op = kv_op(&mut rng, key, &seen);
            run.spawn(Op::Kv(vec![op.clone()]));
            ops.push((key, op));
        }
        let results = run
            .run(MAX_STEPS)
            .map_err(|e| format!("seed {seed} wave {wave}: {e}"))?;
        let mut by_key: BTreeMap<&str, Vec<(KvOp, Value)>> = BTreeMap::new();
        for ((key, op), result) in ops.into_iter().zip(results) {
            let OpResult::Kv(Ok(batch)) = result else {
                return Err(format!("seed {seed} wave {wave}: {result:?}"));
            };
            let answer = batch.results.into_iter().next().unwrap_or(Value::Null);
            if let Some(v) = answer["version"].as_i64() {
                seen.push(v);
            }
            by_key.entry(key).or_default().push((op, answer));
        }
        for (key, wave_ops) in by_key {
            let next = linearize(&states[key], &wave_ops, now)
                .map_err(|e| format!("seed {seed} wave {wave} key {key}: {e}"))?;
            states.insert(key, next);
        }
        advance(&mut rng, &clock);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Locks: safety and rising tokens.
// ---------------------------------------------------------------------------------------------

fn holders_now(db: &SimDb, name: &str) -> Result<Vec<Value>, String> {
    let got = block_on(db.lock_op(LockOp::Get { name: name.into() }, String::new()))
        .map_err(|e| e.to_string())?;
    Ok(got["holders"].as_array().cloned().unwrap_or_default())
}

fn locks_case(seed: u64, bugs: SimBugs) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let db = SimDb::new(seed, clock.as_sim_clock(), bugs);
    let mut rng = SeededRng::new(seed).child("locks-workload");
    let limit = 1 + rng.below(2) as u32;
    let owners = ["o0", "o1", "o2", "o3"];
    // Each owner's last granted (token, slot).
    let mut held: BTreeMap<&str, (i64, u32)> = BTreeMap::new();
    let mut highest = 0i64;
    for wave in 0..WAVES {
        let before = holders_now(&db, "L")?;
        let mut run = Interleaving::new(db.clone(), seed ^ (wave as u64) << 32);
        let mut ops = vec![];
        for _ in 0..2 + rng.below(3) {
            let owner = owners[rng.below(owners.len() as u64) as usize];
            let op = match (held.get(owner), rng.below(3)) {
                (Some((token, slot)), 0) => LockOp::Renew {
                    name: "L".into(),
                    token: *token,
                    slot: *slot,
                    ttl_seconds: 10,
                    owner: Some(owner.into()),
                },
                (Some((token, slot)), 1) => LockOp::Release {
                    name: "L".into(),
                    token: *token,
                    slot: *slot,
                },
                _ => LockOp::Acquire {
                    name: "L".into(),
                    ttl_seconds: 10,
                    owner: Some(owner.into()),
                    limit,
                },
            };
            run.spawn(Op::Lock(op.clone(), String::new()));
            ops.push((owner, op));
        }
        let results = run
            .run(MAX_STEPS)
            .map_err(|e| format!("seed {seed} wave {wave}: {e}"))?;
        let mut acquires = 0;
        let mut admitted = 0;
        let mut granted = vec![];
        for ((owner, op), result) in ops.iter().zip(results) {
            let OpResult::Lock(Ok(answer)) = result else {
                return Err(format!("seed {seed} wave {wave}: {result:?}"));
            };
            match op {
                LockOp::Acquire { .. } => {
                    acquires += 1;
                    if answer["acquired"] == true {
                        admitted += 1;
                        let token = answer["token"].as_i64().unwrap_or(-1);
                        if answer["already"] != true {
                            granted.push(token);
                        }
                        held.insert(owner, (token, answer["slot"].as_u64().unwrap_or(0) as u32));
                    }
                }
                LockOp::Renew { .. } => {
                    if answer["renewed"] == true {
                        let token = answer["token"].as_i64().unwrap_or(-1);
                        granted.push(token);
                        held.insert(owner, (token, answer["slot"].as_u64().unwrap_or(0) as u32));
                    } else {
                        held.remove(owner);
                    }
                }
                LockOp::Release { .. } => {
                    held.remove(owner);
                }
                LockOp::Get { .. } => {}
            }
        }
        for token in &granted {
            if *token <= highest {
                return Err(format!(
                    "seed {seed} wave {wave}: token {token} granted after {highest}: tokens only rise"
                ));
            }
        }
        highest = granted
            .iter()
            .copied()
            .max()
            .unwrap_or(highest)
            .max(highest);
        let after = holders_now(&db, "L")?;
        if after.len() > limit as usize {
            return Err(format!(
                "seed {seed} wave {wave}: {} live permits, limit {limit}: {after:?}",
                after.len()
            ));
        }
        if acquires > 0 && admitted == 0 && before.len() < limit as usize {
            return Err(format!(
                "seed {seed} wave {wave}: every acquire refused though {} of {limit} permits were live",
                before.len()
            ));
        }
        advance(&mut rng, &clock);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Timers: at most once per incarnation, never early, and every pending incarnation fires.
// ---------------------------------------------------------------------------------------------

fn timers_case(seed: u64, bugs: SimBugs) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let db = SimDb::new(seed, clock.as_sim_clock(), bugs);
    let mut rng = SeededRng::new(seed).child("timers-workload");
    let keys = ["t0", "t1", "t2"];
    let mut next_id: u128 = 1;
    // Committed firings per incarnation (message id).
    let mut fired: BTreeMap<uuid::Uuid, u32> = BTreeMap::new();
    for wave in 0..WAVES + 3 {
        let now = clock.now();
        let mut run = Interleaving::new(db.clone(), seed ^ (wave as u64) << 32);
        let mut spawned = vec![];
        // Two brokers fire what is due now, concurrently with schedules and cancels.
        let due = block_on(db.due_timers(10, &[])).map_err(|e| e.to_string())?;
        for d in &due {
            if d.row.deliver_at > now {
                return Err(format!(
                    "seed {seed} wave {wave}: {d:?} read as due before its time"
                ));
            }
        }
        if !due.is_empty() {
            for _broker in 0..2 {
                spawned.push((
                    true,
                    run.spawn(Op::Transaction(queen_core::storage::firing(&due))),
                ));
            }
        }
        if wave < WAVES {
            for _ in 0..rng.below(3) {
                let key = keys[rng.below(keys.len() as u64) as usize];
                let op = if rng.chance(1, 4) {
                    TimerOp::Cancel {
                        queue: "q".into(),
                        key: key.into(),
                        txn: None,
                    }
                } else {
                    next_id += 1;
                    TimerOp::Schedule {
                        queue: "q".into(),
                        key: key.into(),
                        partition: "p".into(),
                        payload: b"{}".to_vec(),
                        delay_ms: rng.below(12_000) as i64,
                        txn: format!("txn-{next_id}"),
                        message_id: uuid::Uuid::from_u128(next_id),
                    }
                };
                spawned.push((false, run.spawn(Op::Transaction(vec![TxOp::Timer(op)]))));
            }
        }
        let results = run
            .run(MAX_STEPS)
            .map_err(|e| format!("seed {seed} wave {wave}: {e}"))?;
        for ((what, _), result) in spawned.iter().zip(results) {
            let OpResult::Transaction(Ok(out)) = result else {
                return Err(format!("seed {seed} wave {wave}: {result:?}"));
            };
            if *what && out.committed {
                for d in &due {
                    *fired.entry(d.row.message_id).or_default() += 1;
                }
            }
        }
        if let Some((id, n)) = fired.iter().find(|(_, n)| **n > 1) {
            return Err(format!(
                "seed {seed} wave {wave}: timer incarnation {id} fired {n} times"
            ));
        }
        clock.advance_millis(if wave < WAVES {
            rng.below(6_000) as i64
        } else {
            13_000
        });
    }
    // Every delay was under 12 s and the last waves moved 13 s each: nothing may be left.
    let left = block_on(db.timer_page("q", None, 100)).map_err(|e| e.to_string())?;
    if !left.is_empty() {
        return Err(format!("seed {seed}: due timers never fired: {left:?}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn all_pass(name: &str, budget: u64, case: fn(u64, SimBugs) -> Result<(), String>) {
    for seed in seeds(budget) {
        if let Err(e) = case(seed, SimBugs::default()) {
            panic!("{name}: {e} (replay with SIM_SEED={seed})");
        }
    }
}

fn caught(name: &str, budget: u64, bugs: SimBugs, case: fn(u64, SimBugs) -> Result<(), String>) {
    let found = (0..budget).find_map(|seed| case(seed, bugs).err());
    match found {
        Some(e) => eprintln!("{name}: the switch is caught: {e}"),
        None => panic!("{name}: the switch {bugs:?} went unnoticed in {budget} seeds"),
    }
}

#[test]
fn kv_histories_are_linearizable() {
    all_pass("kv", 300, kv_case);
}

#[test]
fn kv_checker_catches_recycled_versions() {
    caught(
        "kv",
        300,
        SimBugs {
            kv_versions_repeat: true,
            ..SimBugs::default()
        },
        kv_case,
    );
}

#[test]
fn locks_hold_their_limit_and_tokens_rise() {
    all_pass("locks", 300, locks_case);
}

#[test]
fn locks_checker_catches_expired_permits_counted() {
    caught(
        "locks",
        300,
        SimBugs {
            expired_permits_count: true,
            ..SimBugs::default()
        },
        locks_case,
    );
}

#[test]
fn timers_fire_once_and_never_early() {
    all_pass("timers", 300, timers_case);
}

#[test]
fn timers_checker_catches_double_firing() {
    caught(
        "timers",
        300,
        SimBugs {
            timers_fire_without_removal: true,
            ..SimBugs::default()
        },
        timers_case,
    );
}
