//! The ephemeral queue's clients, in the two scenarios whose brokers share it (`hosts::
//! peer_address`): a producer and long-polling consumers, each call through either broker, so
//! most calls are forwarded to the queue's owner over the simulated network. What they see goes
//! to `ephemeral_check`.
//!
//! - **Prompt** (calm): consumers commit on delivery and park for 10 s, queue-wide and on one
//!   partition, in two groups; the driver holds them to the delivery bound.
//! - **Faults**: two consumers of one group ack explicitly, and now and then die holding a
//!   delivery, dawdle past the lease, or ack `failed`; a third group commits on delivery; the
//!   driver cuts brokers from their owner rows, so queues change hands.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::ephemeral_check::{PushSent, Received};
use super::http::{request, Answer};
use super::{Scenario, Shared, Wait};

/// The ephemeral queue and its partitions.
pub const QUEUE: &str = "eph";
pub const PARTITIONS: [&str; 2] = ["e0", "e1"];
/// The queue's lease: the faults scenario's consumers sometimes hold a delivery past it.
pub const LEASE_SECS: i64 = 2;
const PRODUCER: &str = "eph-feed";

/// The queue's declaration, stored before the run (a configured deployment).
pub fn options() -> Value {
    json!({"leaseSeconds": LEASE_SECS, "retryLimit": 3, "maxLength": 40, "policy": "drop_oldest"})
}

struct Consumer {
    name: &'static str,
    group: &'static str,
    partition: Option<&'static str>,
    auto_ack: bool,
    timeout_ms: u64,
}

fn consumers(scenario: Scenario) -> Vec<Consumer> {
    let c = |name, group, partition, auto_ack, timeout_ms| Consumer {
        name,
        group,
        partition,
        auto_ack,
        timeout_ms,
    };
    match scenario {
        // Long parks, so a wake that never comes is a stall the bound sees.
        Scenario::Prompt => vec![
            c("eph-a-any", "ea", None, true, 10_000),
            c("eph-a-e1", "ea", Some("e1"), true, 10_000),
            c("eph-b-e0", "eb", Some("e0"), true, 10_000),
            c("eph-b-e1", "eb", Some("e1"), true, 10_000),
        ],
        Scenario::Faults => vec![
            c("eph-w0", "ew", None, false, 1_000),
            c("eph-w1", "ew", None, false, 1_000),
            c("eph-v0", "ev", None, true, 1_000),
        ],
        _ => vec![],
    }
}

pub fn client_names(scenario: Scenario) -> Vec<String> {
    let cs = consumers(scenario);
    if cs.is_empty() {
        return vec![];
    }
    std::iter::once(PRODUCER.to_string())
        .chain(cs.iter().map(|c| c.name.to_string()))
        .collect()
}

pub(super) fn spawn(
    sim: &mut turmoil::Sim<'_>,
    shared: &Arc<Shared>,
    scenario: Scenario,
    rng: &mut SeededRng,
) {
    let cs = consumers(scenario);
    if cs.is_empty() {
        return;
    }
    let (s, r) = (shared.clone(), rng.child(PRODUCER));
    sim.client(PRODUCER, async move {
        produce(s, scenario, r).await;
        Ok(())
    });
    for c in cs {
        let (s, r) = (shared.clone(), rng.child(c.name));
        sim.client(c.name, async move {
            consume(s, c, r).await;
            Ok(())
        });
    }
}

/// Notes an answer other than a 200: a 503 (the owner out of reach) is counted, anything else
/// is a finding. Answers whether it was a 200.
fn note_answer(shared: &Shared, call: &str, answer: &Answer) -> bool {
    let Ok(mut log) = shared.ephemeral.lock() else {
        return false;
    };
    match answer {
        Ok((200, _)) => return true,
        Ok((503, _)) => log.unavailable += 1,
        Ok((status, body)) => log.odd_answers.push((format!("{call} ({body})"), *status)),
        Err(_) => {
            drop(log);
            shared.bump("ephemeral: calls without an answer");
        }
    }
    false
}

fn any_broker(shared: &Shared, rng: &mut SeededRng) -> String {
    shared.brokers[rng.below(shared.brokers.len() as u64) as usize].clone()
}

/// Pushes numbered messages to either partition through either broker until the drain. A push
/// without an answer is not sent again (ephemeral pushes have no de-duplication).
async fn produce(shared: Arc<Shared>, scenario: Scenario, mut rng: SeededRng) {
    // The consumers' first pops make their groups before anything is pushed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (gap_min, gap_spread) = if scenario == Scenario::Prompt {
        (50, 850)
    } else {
        (20, 280)
    };
    let mut n = 0u64;
    while !shared.draining.load(Ordering::SeqCst) {
        let partition = PARTITIONS[rng.below(PARTITIONS.len() as u64) as usize];
        let count = 1 + rng.below(3);
        let messages: Vec<Value> = (n..n + count)
            .map(|i| json!({"payload": {"n": i}}))
            .collect();
        let body = json!({"queue": QUEUE, "partition": partition, "messages": messages});
        let broker = any_broker(&shared, &mut rng);
        let sent = shared.now();
        let answer = request(
            &broker,
            "POST",
            "/api/v1/ephemeral/push",
            Some(&body),
            Duration::from_secs(2),
        )
        .await;
        let stored = note_answer(&shared, "push", &answer).then(|| shared.now());
        if let Ok(mut log) = shared.ephemeral.lock() {
            log.pushes.push(PushSent {
                partition: partition.to_string(),
                first: n,
                count,
                sent,
                stored,
            });
        }
        n += count;
        tokio::time::sleep(Duration::from_millis(gap_min + rng.below(gap_spread))).await;
    }
}

/// Long-polls through either broker until the run is over; explicit-ack consumers settle each
/// batch as the seed draws.
async fn consume(shared: Arc<Shared>, c: Consumer, mut rng: SeededRng) {
    while !shared.done.load(Ordering::SeqCst) {
        let broker = any_broker(&shared, &mut rng);
        let mut path = format!(
            "/api/v1/ephemeral/pop?queue={QUEUE}&batch=3&wait=true&timeout={}&group={}",
            c.timeout_ms, c.group
        );
        if let Some(p) = c.partition {
            path.push_str(&format!("&partition={p}"));
        }
        if c.auto_ack {
            path.push_str("&autoAck=true");
        }
        let sent = shared.now();
        shared.set_ephemeral_wait(
            c.name,
            Some(Wait {
                consumer: format!("{}@{broker}", c.name),
                group: c.group,
                queues: vec![QUEUE],
                partition: c.partition,
                since: sent,
            }),
        );
        let answer = request(
            &broker,
            "GET",
            &path,
            None,
            Duration::from_millis(c.timeout_ms + 3_000),
        )
        .await;
        // The wait ends and the deliveries count at one instant (the checker reads both).
        shared.set_ephemeral_wait(c.name, None);
        let got = received(&shared, &c, &answer, sent);
        if !note_answer(&shared, "pop", &answer) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if c.auto_ack || got.is_empty() {
            continue;
        }
        settle(&shared, &c, &got, &mut rng).await;
    }
}

/// Logs a pop's messages; answers their ids.
fn received(shared: &Shared, c: &Consumer, answer: &Answer, sent: i64) -> Vec<String> {
    let Ok((200, body)) = answer else {
        return vec![];
    };
    let at = shared.now();
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let Ok(mut log) = shared.ephemeral.lock() else {
        return vec![];
    };
    messages
        .iter()
        .map(|m| {
            let id = m["id"].as_str().unwrap_or_default().to_string();
            log.received.push(Received {
                consumer: c.name.to_string(),
                group: c.group.to_string(),
                id: id.clone(),
                partition: m["partition"].as_str().unwrap_or_default().to_string(),
                attempts: m["attempts"].as_u64().unwrap_or(0),
                n: m["payload"]["n"].as_u64().unwrap_or(u64::MAX),
                sent,
                at,
            });
            id
        })
        .collect()
}

/// Dies holding the batch (no ack: its lease brings it back), dawdles (sometimes past the
/// lease), acks it `failed` (back at once), or acks it.
async fn settle(shared: &Shared, c: &Consumer, ids: &[String], rng: &mut SeededRng) {
    match rng.below(10) {
        0 | 1 => {
            shared.bump("ephemeral: deliveries abandoned");
            tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
            return;
        }
        2 | 3 => {
            tokio::time::sleep(Duration::from_millis(100 + rng.below(2_400))).await;
        }
        _ => {}
    }
    let failed = rng.below(8) == 0;
    let status = if failed { "failed" } else { "completed" };
    let acks: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "status": status}))
        .collect();
    if failed {
        let at = shared.now();
        if let Ok(mut log) = shared.ephemeral.lock() {
            for id in ids {
                log.failed_acks.push((c.group.to_string(), id.clone(), at));
            }
        }
    }
    let body = json!({"queue": QUEUE, "group": c.group, "acks": acks});
    let broker = any_broker(shared, rng);
    let answer = request(
        &broker,
        "POST",
        "/api/v1/ephemeral/ack",
        Some(&body),
        Duration::from_secs(2),
    )
    .await;
    if note_answer(shared, "ack", &answer) {
        shared.bump("ephemeral: acks answered");
    }
}
