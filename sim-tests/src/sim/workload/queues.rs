//! The producers (pushes, transactions, timers) and the consumers (every pop route, acks).

use std::ops::Not;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::{Consumer, PopPath, Producer, PROMPT_QUEUES};
use crate::sim::history::{Event, Msg};
use crate::sim::http::request;
use crate::sim::{hit, Shared, Wait};

/// The items' answers of a push (or of a transaction's push), `None` when it failed or no
/// answer came.
async fn pushed_items(
    broker: &str,
    path: &str,
    body: &Value,
    as_transaction: bool,
) -> Option<Vec<Value>> {
    match request(broker, "POST", path, Some(body), Duration::from_secs(2)).await {
        // A push answers the items; a transaction answers them under `results`.
        Ok((201, body)) if !as_transaction => body.as_array().cloned(),
        Ok((200, body)) if as_transaction && body["success"] == true => {
            body["results"].as_array().cloned()
        }
        _ => None,
    }
}

pub(super) async fn produce(
    shared: Arc<Shared>,
    p: Producer,
    made: Arc<AtomicU64>,
    mut rng: SeededRng,
) {
    let mut k = 0u64;
    while !shared.draining.load(Ordering::SeqCst) && p.max_pushes.is_none_or(|m| k < m) {
        let partitions: Vec<String> = if p.fresh_partitions {
            vec![format!("n{}", made.load(Ordering::SeqCst))]
        } else if p.spread {
            (0..p.partitions)
                .map(|i| format!("{}{i}", p.prefix))
                .collect()
        } else {
            vec![format!(
                "{}{}",
                p.prefix,
                rng.below(u64::from(p.partitions))
            )]
        };
        // (partition, its transactionIds)
        let writes: Vec<(String, Vec<String>)> = partitions
            .into_iter()
            .map(|partition| {
                let n = 1 + rng.below(3);
                let txids = (0..n)
                    .map(|j| match p.spread {
                        true => format!("{}-{k}-{partition}-{j}", p.name),
                        false => format!("{}-{k}-{j}", p.name),
                    })
                    .collect();
                (partition, txids)
            })
            .collect();
        k += 1;
        let items: Vec<Value> = writes
            .iter()
            .flat_map(|(partition, txids)| {
                txids.iter().map(move |t| {
                    json!({"queue": p.queue, "partition": partition, "payload": {"tx": t}, "transactionId": t})
                })
            })
            .collect();
        if p.timers {
            schedule_timers(&shared, &p, &writes, k, &mut rng).await;
            let (lo, hi) = p.gap_ms;
            tokio::time::sleep(Duration::from_millis(lo + rng.below(hi - lo + 1))).await;
            continue;
        }
        let as_transaction = p.transactions && rng.below(4) == 0;
        let (path, request_body) = if as_transaction {
            (
                "/api/v1/transaction",
                json!({"operations": [{"type": "push", "items": items}]}),
            )
        } else {
            ("/api/v1/push", json!({ "items": items }))
        };
        // A push without an answer may have been stored: retry it (same transactionIds, so a
        // stored one answers `duplicate`) until it is acknowledged.
        let invoked = shared.now();
        for attempt in 0..20 {
            let broker = &shared.brokers[(k as usize + attempt) % shared.brokers.len()];
            let answer = pushed_items(broker, path, &request_body, as_transaction).await;
            match answer {
                Some(items)
                    if items.len() == writes.iter().map(|(_, t)| t.len()).sum::<usize>()
                        && items
                            .iter()
                            .all(|i| i["status"] == "queued" || i["status"] == "duplicate") =>
                {
                    if as_transaction {
                        shared.bump("push: as a transaction");
                    }
                    if items.iter().any(|i| i["status"] == "duplicate") {
                        shared.bump("push: retried after a lost answer, answered duplicate");
                    }
                    let at = shared.now();
                    for (partition, txids) in &writes {
                        shared.record(Event::Pushed {
                            invoked,
                            at,
                            queue: p.queue.into(),
                            partition: partition.clone(),
                            txids: txids.clone(),
                        });
                    }
                    break;
                }
                _ => {
                    shared.bump("fault: request without an answer (push)");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if p.fresh_partitions {
            made.fetch_add(1, Ordering::SeqCst);
        }
        let (lo, hi) = if hit(&mut rng, p.burst) {
            (0, 30)
        } else {
            p.gap_ms
        };
        tokio::time::sleep(Duration::from_millis(lo + rng.below(hi - lo + 1))).await;
    }
}

/// Schedules each message as a timer through one broker (another on a retry), and records it as
/// pushed at its `deliverAt`: from then it is deliverable.
async fn schedule_timers(
    shared: &Shared,
    p: &Producer,
    writes: &[(String, Vec<String>)],
    k: u64,
    rng: &mut SeededRng,
) {
    let ops: Vec<Value> = writes
        .iter()
        .flat_map(|(partition, txids)| txids.iter().map(move |t| (partition, t)))
        .map(|(partition, t)| {
            let payload =
                base64::engine::general_purpose::STANDARD.encode(json!({"tx": t}).to_string());
            json!({"op": "schedule", "queue": p.queue, "timerKey": t, "partition": partition,
                   "payload": payload, "delayMs": 100 + rng.below(2_400), "txn": t})
        })
        .collect();
    let invoked = shared.now();
    for attempt in 0..20 {
        let broker = &shared.brokers[(k as usize + attempt) % shared.brokers.len()];
        let body = json!({ "operations": ops });
        match request(
            broker,
            "POST",
            "/api/v1/timers",
            Some(&body),
            Duration::from_secs(2),
        )
        .await
        {
            Ok((200, answer)) => {
                let results = answer["results"].as_array().cloned().unwrap_or_default();
                if results.len() != ops.len() || results.iter().any(|r| r["ok"] != true) {
                    shared.bump("fault: timers refused");
                    return;
                }
                shared.bump("timers: scheduled");
                for (op, r) in ops.iter().zip(&results) {
                    let Some(at) = r["deliverAt"]
                        .as_str()
                        .and_then(queen_core::time::parse_iso)
                        .map(|t| t.0 - crate::sim::sim_timestamp(0).0)
                    else {
                        shared.bump("fault: timer answer without deliverAt");
                        continue;
                    };
                    let txid = op["txn"].as_str().unwrap_or_default().to_string();
                    if let Ok(mut due) = shared.timer_due.lock() {
                        let e = due.entry(txid.clone()).or_insert(at);
                        *e = (*e).min(at);
                    }
                    shared.record(Event::Pushed {
                        invoked,
                        at,
                        queue: p.queue.into(),
                        partition: op["partition"].as_str().unwrap_or_default().into(),
                        txids: vec![txid],
                    });
                }
                return;
            }
            _ => {
                shared.bump("fault: request without an answer (timers)");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub(super) async fn consume(
    shared: Arc<Shared>,
    c: Consumer,
    made: Arc<AtomicU64>,
    mut rng: SeededRng,
) {
    tokio::time::sleep(Duration::from_millis(c.start_ms)).await;
    while c.late && !shared.late_group_go.load(Ordering::SeqCst) {
        if shared.done.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut pops = 0u64;
    while !shared.done.load(Ordering::SeqCst) {
        pops += 1;
        let id = shared.next_pop_id.fetch_add(1, Ordering::SeqCst);
        // A consumer taking named partitions in turn must not sit out a 30 s long-poll on an
        // empty one while the other holds the last backlog of the drain. Its drain is one batch
        // per turn, and a turn on the empty partition is this timeout: at 2 s, a retry queue's
        // backlog (failures, retries) outlasted the drain's 60 s after a work-phase long-poll
        // had already sat out 30 s of it (seed 1036 of a 60-seed prompt soak).
        let timeout_ms = match c.path {
            PopPath::Partitions(_) if shared.draining.load(Ordering::SeqCst) => 500,
            _ => c.timeout_ms,
        };
        let (path, wait) = pop_target(&shared, &c, pops, timeout_ms, &made, &mut rng);
        let (broker, ack_broker) = brokers_for(&shared, &c, pops);
        let invoked = shared.now();
        if let Some((queues, partition)) = wait {
            shared.set_wait(
                &c.name,
                Some(Wait {
                    consumer: format!("{}@{broker}", c.name),
                    group: c.group,
                    queues,
                    partition,
                    since: invoked,
                }),
            );
        }
        shared.record(Event::PopInvoked {
            at: invoked,
            consumer: c.name.clone(),
            group: c.group.into(),
            id,
        });
        let answer = request(
            &broker,
            "GET",
            &path,
            None,
            Duration::from_millis(timeout_ms + 3_000),
        )
        .await;
        shared.set_wait(&c.name, None);
        match answer {
            Ok((200, body)) => {
                if body["autopilot"]["partitions"].as_u64() > Some(1) {
                    shared.bump("delivery: the autopilot widened a pop");
                }
                let deliveries = parse_delivery(&body, invoked, shared.now(), id, &c);
                let alive = settle(&shared, &c, deliveries, &ack_broker, &mut rng).await;
                if !alive {
                    return;
                }
            }
            Ok((204, _)) => shared.record(Event::Empty {
                invoked,
                at: shared.now(),
                id,
                consumer: c.name.clone(),
                group: c.group.into(),
            }),
            _ => {
                shared.bump("fault: request without an answer (pop)");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Where a consumer's next pop goes, and what the liveness checker may hold it to (the queues
/// and the partition it waits on). Named pops only reach partitions near the producer: the rest,
/// and the drain, go queue-wide.
fn pop_target(
    shared: &Shared,
    c: &Consumer,
    pops: u64,
    timeout_ms: u64,
    made: &AtomicU64,
    rng: &mut SeededRng,
) -> (String, Option<WaitTarget>) {
    // Every fourth pop leaves its batch and width to the broker's autopilot (Queen 2.6.0's
    // default), so the checkers hold broker-sized pops to the same rules.
    let sizing = if pops % 4 == 2 {
        "autopilot=true".to_string()
    } else {
        format!("batch={}", c.batch)
    };
    let query = format!(
        "{sizing}&wait=true&timeout={timeout_ms}&consumerGroup={}{}",
        c.group,
        if c.auto_ack { "&autoAck=true" } else { "" }
    );
    let queue_wide = shared.draining.load(Ordering::SeqCst) || hit(rng, 0.3);
    match c.path {
        PopPath::AheadOfProducer if !queue_wide => {
            let ahead = made.load(Ordering::SeqCst) + rng.below(2);
            let path = format!("/api/v1/pop/queue/{}/partition/n{ahead}?{query}", c.queue);
            (path, None)
        }
        PopPath::Partitions(names) => {
            let p = names[(pops % 2) as usize];
            (
                format!("/api/v1/pop/queue/{}/partition/{p}?{query}", c.queue),
                Some((vec![c.queue], Some(p))),
            )
        }
        PopPath::Discovery(ns) => (
            format!("/api/v1/pop?namespace={ns}&{query}"),
            Some((PROMPT_QUEUES.to_vec(), None)),
        ),
        _ => (
            format!("/api/v1/pop/queue/{}?{query}", c.queue),
            Some((vec![c.queue], None)),
        ),
    }
}

/// The queues a parked pop waits on, and its partition when it names one.
type WaitTarget = (Vec<&'static str>, Option<&'static str>);

/// The broker a pop goes to, and the one its acks go to. During the drain, a consumer on a
/// broker that missed another broker's pushes (a crash, a fault) may wait until the next
/// reseed: it picks brokers in turn. The prompt scenario keeps its brokers: events must reach
/// them.
fn brokers_for(shared: &Shared, c: &Consumer, pops: u64) -> (String, String) {
    let broker = if shared.draining.load(Ordering::SeqCst) && c.ack_elsewhere.not() {
        shared.brokers[(pops as usize) % shared.brokers.len()].clone()
    } else {
        c.broker.clone()
    };
    let ack_broker = if c.ack_elsewhere {
        let i = shared
            .brokers
            .iter()
            .position(|b| *b == broker)
            .unwrap_or(0);
        shared.brokers[(i + 1) % shared.brokers.len()].clone()
    } else {
        broker.clone()
    };
    (broker, ack_broker)
}

/// Records a delivery and acks it (unless autoAck), as the consumer's faults say: it may die
/// holding the lease (`false`: it is gone for good), work, or ack at the lease's boundary.
async fn settle(
    shared: &Arc<Shared>,
    c: &Consumer,
    deliveries: Vec<Event>,
    ack_broker: &str,
    rng: &mut SeededRng,
) -> bool {
    for d in &deliveries {
        if let Event::Delivered { partition, .. } = d {
            shared.note_delivered(c.group, partition);
        }
        shared.record(d.clone());
    }
    if c.auto_ack {
        return true;
    }
    if c.mortal && !shared.draining.load(Ordering::SeqCst) && hit(rng, 0.15) {
        // Dies holding the lease: its messages come back after the lease expires.
        shared.bump("fault: consumer died holding a lease");
        if !c.revives {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(300 + rng.below(500))).await;
        return true;
    }
    if c.work_ms > 0 {
        tokio::time::sleep(Duration::from_millis(c.work_ms)).await;
    }
    if shared.faults.lease_boundary && hit(rng, 0.1) {
        // Works until about the lease's end, so the ack races the expiry.
        shared.bump("fault: ack at the lease boundary");
        tokio::time::sleep(Duration::from_millis(1_900 + rng.below(200))).await;
    }
    for d in deliveries {
        ack(shared, ack_broker, &d, hit(rng, c.fail_p)).await;
    }
    true
}

fn parse_delivery(body: &Value, invoked: i64, at: i64, id: u64, c: &Consumer) -> Vec<Event> {
    let mut by_partition: Vec<(String, String, u64, Vec<Msg>)> = vec![];
    for m in body["messages"].as_array().into_iter().flatten() {
        let partition = m["partition"].as_str().unwrap_or_default().to_string();
        let msg = Msg {
            partition_id: m["partitionId"].as_str().unwrap_or_default().to_string(),
            offset: m["offset"].as_i64().unwrap_or(-1),
            txid: m["transactionId"].as_str().unwrap_or_default().to_string(),
        };
        let lease = m["leaseId"].as_str().unwrap_or_default().to_string();
        let attempt = m["deliveryAttempt"].as_u64().unwrap_or(0);
        match by_partition.iter_mut().find(|(p, _, _, _)| *p == partition) {
            Some(e) => e.3.push(msg),
            None => by_partition.push((partition, lease, attempt, vec![msg])),
        }
    }
    by_partition
        .into_iter()
        .map(|(partition, lease, attempt, msgs)| Event::Delivered {
            invoked,
            at,
            id,
            consumer: c.name.clone(),
            group: c.group.into(),
            partition,
            lease,
            auto_ack: c.auto_ack,
            attempt,
            msgs,
        })
        .collect()
}

async fn ack(shared: &Shared, broker: &str, d: &Event, failed: bool) {
    let Event::Delivered {
        group,
        partition,
        lease,
        msgs,
        ..
    } = d
    else {
        return;
    };
    let Some(last) = msgs.last() else { return };
    let acks: Vec<Value> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let status = if failed && i == 0 { "failed" } else { "completed" };
            json!({"transactionId": m.txid, "partitionId": m.partition_id, "leaseId": lease, "status": status})
        })
        .collect();
    if failed {
        shared.bump("delivery: failed ack (redelivery after retryDelay)");
    }
    shared.record(Event::AckSent {
        at: shared.now(),
        group: group.clone(),
        partition: partition.clone(),
        lease: lease.clone(),
        last_offset: last.offset,
        failed,
    });
    let body = json!({"acknowledgments": acks, "consumerGroup": group});
    if request(
        broker,
        "POST",
        "/api/v1/ack/batch",
        Some(&body),
        Duration::from_secs(2),
    )
    .await
    .is_err()
    {
        shared.bump("fault: request without an answer (ack)");
    }
}
