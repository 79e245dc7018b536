//! The simulated producers and consumers: real HTTP requests to the brokers, every answer (or its
//! absence) recorded in the history.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::history::{Event, Msg};
use super::http::request;
use super::{hit, Scenario, Shared};

pub const QUEUES: [&str; 4] = ["c", "k", "w", "f"];

/// The groups that must receive every acknowledged message.
pub fn groups_of(scenario: Scenario) -> Vec<&'static str> {
    match scenario {
        Scenario::Contention | Scenario::Faults => vec!["g1", "g2"],
        _ => vec!["g1"],
    }
}

/// A group that first contacts the queue after retention removed what g1 and g2 consumed: it
/// must drain (the cursor seal), but never sees the removed messages.
pub const LATE_GROUP: &str = "g3";

/// The queue a scenario works on.
pub fn queue_of(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::CreationRace => "c",
        Scenario::Contention => "k",
        Scenario::LostWakes => "w",
        Scenario::Faults => "f",
    }
}

#[derive(Clone, Copy)]
enum PopPath {
    /// Queue-wide (hot-list or wildcard).
    Queue,
    /// Named partitions just ahead of the producer (the creation race).
    AheadOfProducer,
}

#[derive(Clone)]
struct Consumer {
    name: String,
    broker: String,
    queue: &'static str,
    group: &'static str,
    path: PopPath,
    batch: u32,
    timeout_ms: u64,
    auto_ack: bool,
    /// Starts this late (a group's first contact mid-run).
    start_ms: u64,
    /// May die holding a lease.
    mortal: bool,
    /// Starts when the driver says retention ran (the late group).
    late: bool,
}

struct Producer {
    name: String,
    queue: &'static str,
    partitions: u32,
    /// Every push creates a new partition (the creation race).
    fresh_partitions: bool,
    gap_ms: (u64, u64),
    /// Chance that the next push follows within 30 ms (it lands while pops of the first are in
    /// flight: the ring's epoch race).
    burst: f64,
}

fn plan(scenario: Scenario, brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let b = |i: usize| brokers[i % brokers.len()].clone();
    let consumer = |i: usize, queue, group, path, auto_ack| Consumer {
        name: format!("consumer{i}"),
        broker: b(i),
        queue,
        group,
        path,
        batch: 3,
        timeout_ms: 1_000,
        auto_ack,
        start_ms: 0,
        mortal: false,
        late: false,
    };
    match scenario {
        Scenario::CreationRace => (
            vec![Producer {
                name: "producer0".into(),
                queue: "c",
                partitions: 0,
                fresh_partitions: true,
                gap_ms: (5, 60),
                burst: 0.0,
            }],
            (0..3)
                .map(|i| Consumer {
                    timeout_ms: 300,
                    ..consumer(i, "c", "g1", PopPath::AheadOfProducer, false)
                })
                .collect(),
        ),
        Scenario::Contention => {
            let mut cs: Vec<Consumer> = (0..8)
                .map(|i| consumer(i, "k", "g1", PopPath::Queue, false))
                .collect();
            cs.extend((8..11).map(|i| Consumer {
                start_ms: 4_000,
                ..consumer(i, "k", "g2", PopPath::Queue, false)
            }));
            (
                vec![Producer {
                    name: "producer0".into(),
                    queue: "k",
                    partitions: 2,
                    fresh_partitions: false,
                    gap_ms: (2, 30),
                    burst: 0.0,
                }],
                cs,
            )
        }
        Scenario::LostWakes => (
            vec![Producer {
                name: "producer0".into(),
                queue: "w",
                partitions: 1,
                fresh_partitions: false,
                gap_ms: (1_500, 3_000),
                burst: 0.6,
            }],
            (0..4)
                .map(|i| Consumer {
                    timeout_ms: 8_000,
                    batch: 2,
                    ..consumer(i, "w", "g1", PopPath::Queue, true)
                })
                .collect(),
        ),
        Scenario::Faults => {
            let mut cs: Vec<Consumer> = (0..3)
                .map(|i| Consumer {
                    mortal: i == 0,
                    ..consumer(i, "f", "g1", PopPath::Queue, false)
                })
                .collect();
            cs.push(consumer(3, "f", "g2", PopPath::Queue, true));
            cs.push(Consumer {
                late: true,
                ..consumer(4, "f", LATE_GROUP, PopPath::Queue, false)
            });
            (
                (0..2)
                    .map(|i| Producer {
                        name: format!("producer{i}"),
                        queue: "f",
                        partitions: 4,
                        fresh_partitions: false,
                        gap_ms: (20, 200),
                        burst: 0.0,
                    })
                    .collect(),
                cs,
            )
        }
    }
}

pub fn client_names(scenario: Scenario) -> Vec<String> {
    let (p, c) = plan(scenario, &["broker0".to_string()]);
    p.into_iter()
        .map(|p| p.name)
        .chain(c.into_iter().map(|c| c.name))
        .collect()
}

pub(crate) fn spawn_clients(
    sim: &mut turmoil::Sim<'_>,
    shared: &Arc<Shared>,
    scenario: Scenario,
    rng: &mut SeededRng,
) {
    let (producers, consumers) = plan(scenario, &shared.brokers);
    let made = Arc::new(AtomicU64::new(0));
    for p in producers {
        let (shared, made, rng) = (shared.clone(), made.clone(), rng.child(&p.name));
        sim.client(p.name.clone(), async move {
            produce(shared, p, made, rng).await;
            Ok(())
        });
    }
    for c in consumers {
        let (shared, made, rng) = (shared.clone(), made.clone(), rng.child(&c.name));
        sim.client(c.name.clone(), async move {
            consume(shared, c, made, rng).await;
            Ok(())
        });
    }
}

async fn produce(shared: Arc<Shared>, p: Producer, made: Arc<AtomicU64>, mut rng: SeededRng) {
    let mut k = 0u64;
    while !shared.draining.load(Ordering::SeqCst) {
        let partition = if p.fresh_partitions {
            format!("n{}", made.load(Ordering::SeqCst))
        } else {
            format!("p{}", rng.below(u64::from(p.partitions)))
        };
        let n = 1 + rng.below(3);
        let txids: Vec<String> = (0..n).map(|j| format!("{}-{k}-{j}", p.name)).collect();
        k += 1;
        let items: Vec<Value> = txids
            .iter()
            .map(|t| json!({"queue": p.queue, "partition": partition, "payload": {"tx": t}, "transactionId": t}))
            .collect();
        // A push without an answer may have been stored: retry it (same transactionIds, so a
        // stored one answers `duplicate`) until it is acknowledged.
        for attempt in 0..20 {
            let broker = &shared.brokers[(k as usize + attempt) % shared.brokers.len()];
            match request(
                broker,
                "POST",
                "/api/v1/push",
                Some(&json!({ "items": items })),
                Duration::from_secs(2),
            )
            .await
            {
                Ok((201, body))
                    if body.as_array().is_some_and(|a| {
                        a.iter()
                            .all(|i| i["status"] == "queued" || i["status"] == "duplicate")
                    }) =>
                {
                    if body
                        .as_array()
                        .is_some_and(|a| a.iter().any(|i| i["status"] == "duplicate"))
                    {
                        shared.bump("push: retried after a lost answer, answered duplicate");
                    }
                    shared.record(Event::Pushed {
                        at: shared.now(),
                        queue: p.queue.into(),
                        partition: partition.clone(),
                        txids: txids.clone(),
                    });
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

async fn consume(shared: Arc<Shared>, c: Consumer, made: Arc<AtomicU64>, mut rng: SeededRng) {
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
        let query = format!(
            "batch={}&wait=true&timeout={}&consumerGroup={}{}",
            c.batch,
            c.timeout_ms,
            c.group,
            if c.auto_ack { "&autoAck=true" } else { "" }
        );
        // Named pops only reach partitions near the producer: the rest, and the drain, go
        // queue-wide.
        let queue_wide = shared.draining.load(Ordering::SeqCst) || hit(&mut rng, 0.3);
        let path = match c.path {
            PopPath::AheadOfProducer if !queue_wide => {
                let ahead = made.load(Ordering::SeqCst) + rng.below(2);
                format!("/api/v1/pop/queue/{}/partition/n{ahead}?{query}", c.queue)
            }
            _ => format!("/api/v1/pop/queue/{}?{query}", c.queue),
        };
        // During the drain, a consumer on a broker whose ring has not seen another broker's
        // pushes may wait until the next reseed: pick brokers in turn.
        let broker = if shared.draining.load(Ordering::SeqCst) {
            shared.brokers[(pops as usize) % shared.brokers.len()].clone()
        } else {
            c.broker.clone()
        };
        let invoked = shared.now();
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
            Duration::from_millis(c.timeout_ms + 3_000),
        )
        .await;
        match answer {
            Ok((200, body)) => {
                let deliveries = parse_delivery(&body, invoked, shared.now(), id, &c);
                for d in &deliveries {
                    shared.record(d.clone());
                }
                if c.auto_ack {
                    continue;
                }
                if c.mortal && !shared.draining.load(Ordering::SeqCst) && hit(&mut rng, 0.15) {
                    // Dies holding the lease: its messages come back after the lease expires.
                    shared.bump("fault: consumer died holding a lease");
                    return;
                }
                if shared.faults.lease_boundary && hit(&mut rng, 0.1) {
                    // Works until about the lease's end, so the ack races the expiry.
                    shared.bump("fault: ack at the lease boundary");
                    tokio::time::sleep(Duration::from_millis(1_900 + rng.below(200))).await;
                }
                for d in deliveries {
                    ack(&shared, &broker, &d, hit(&mut rng, 0.08)).await;
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
