//! The simulated producers and consumers: real HTTP requests to the brokers, every answer (or its
//! absence) recorded in the history.
//!
//! Here: the scenarios' queues, groups and plans, and the clients' spawning; each kind of client
//! is in a file of its own under `workload/`.

mod admin;
mod conflation;
mod coordination;
mod queues;
mod reads;
mod streams;

use admin::administer;
pub use admin::ADMIN;
use conflation::consume_newest;
use coordination::{hold_locks, use_kv};
use queues::{consume, produce};
use reads::read_by_offset;
use streams::run_stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::history::Event;
use super::http::request;
use super::{Scenario, Shared};

pub const QUEUES: [&str; 13] = [
    PROMPT_RESET,
    SCALE_QUEUE,
    RETENTION_QUEUE,
    "c",
    "k",
    "w",
    "f",
    PROMPT_LEASE,
    PROMPT_DELAY,
    PROMPT_WINDOW,
    PROMPT_RETRY,
    PROMPT_LONG,
    PROMPT_SPREAD,
];

/// The prompt-delivery scenario's queues, one per way a message becomes deliverable by time
/// or by another broker's action, all in one namespace for the discovery consumer.
pub const PROMPT_NAMESPACE: &str = "ns";
pub const PROMPT_LEASE: &str = "ns.lease";
pub const PROMPT_DELAY: &str = "ns.delay";
pub const PROMPT_WINDOW: &str = "ns.window";
pub const PROMPT_RETRY: &str = "ns.retry";
/// A 30 s lease, far longer than a ring reseed: a release this broker missed must not wait for
/// the lease to end.
pub const PROMPT_LONG: &str = "ns.long";
/// Pushed to every partition at once, and read by three consumers of one group that work on
/// each batch longer than the delivery bound: one event makes two partitions ready, a wake goes
/// to one parked consumer, which claims one, so the other is served only if that pop hands the
/// wake on to the next parked consumer (`PopEffect::PassWake`).
pub const PROMPT_SPREAD: &str = "ns.spread";
/// g1's consumers of the spread queue, and how long each works on a batch.
const SPREAD_CONSUMERS: usize = 3;
const SPREAD_WORK_MS: u64 = 1_200;
pub const PROMPT_QUEUES: [&str; 6] = [
    PROMPT_LEASE,
    PROMPT_DELAY,
    PROMPT_WINDOW,
    PROMPT_RETRY,
    PROMPT_LONG,
    PROMPT_SPREAD,
];
/// The queue the prompt scenario seeks back and whose group it deletes: filled at the start and
/// then quiet, so no push wakes its parked consumers; only the reset's own event can. Outside the
/// namespace, so only the reset groups read it.
pub const PROMPT_RESET: &str = "quiet.reset";
/// Groups the prompt scenario seeks back and deletes (through the broker its consumers are not
/// parked on); their rewinds are judged by the liveness checker only.
pub const SEEK_GROUP: &str = "gs";
/// The group whose only consumers pop named partitions: a parked single-partition pop is then
/// the only one that can serve its partition, so its own revisits are what the bound tests.
pub const PARTITION_GROUP: &str = "gp";
pub const DELETED_GROUP: &str = "gd";

/// The scale scenario's queue, its partitions (more than a first contact seeds), and its
/// groups (their first contacts half a second apart).
pub const SCALE_QUEUE: &str = "m";
/// 270: four seed caps and then some (no cursor seeded), nine reseed pages of 32 names.
const SCALE_PARTITIONS: u32 = queen_core::claim::FIRST_CONTACT_SEED_CAP as u32 * 4 + 14;
const SCALE_GROUPS: [&str; 4] = ["g1", "g2", "g3", "g4"];

/// The retention scenario's queue: completed retention after 1 s, everything after 8 s.
pub const RETENTION_QUEUE: &str = "r";
pub const RETENTION_COMPLETED_SECS: u32 = 1;
pub const RETENTION_PENDING_SECS: u32 = 8;
/// The retention scenario's lagging group: it falls seconds behind, so completed retention must
/// wait for it and pending retention takes what it did not reach in time.
pub const LAGGING_GROUP: &str = "g2";

/// A queue's options in every scenario: a 2 s lease (expiries happen inside a run) and a 200 ms
/// retryDelay, plus what each prompt queue exercises.
pub fn queue_options(q: &str) -> queen_core::storage::QueueConfig {
    let base = queen_core::storage::QueueConfig {
        lease_time_secs: super::LEASE_SECS as u32,
        retry_delay_ms: 200,
        ..queen_core::storage::QueueConfig::with_defaults(q)
    };
    match q {
        PROMPT_DELAY => queen_core::storage::QueueConfig {
            delayed_processing_secs: 1,
            ..base
        },
        PROMPT_WINDOW => queen_core::storage::QueueConfig {
            window_buffer_secs: 1,
            ..base
        },
        PROMPT_RETRY => queen_core::storage::QueueConfig {
            retry_delay_ms: 400,
            retry_limit: 1,
            ..base
        },
        PROMPT_LONG => queen_core::storage::QueueConfig {
            lease_time_secs: 30,
            ..base
        },
        RETENTION_QUEUE => queen_core::storage::QueueConfig {
            retention_enabled: true,
            retention_seconds: RETENTION_PENDING_SECS,
            completed_retention_seconds: RETENTION_COMPLETED_SECS,
            ..base
        },
        _ => base,
    }
}

/// The groups that must receive every acknowledged message.
pub fn groups_of(scenario: Scenario) -> Vec<&'static str> {
    match scenario {
        Scenario::Contention | Scenario::Faults => vec!["g1", "g2"],
        Scenario::Retention => vec!["g1", LAGGING_GROUP, LATE_GROUP],
        Scenario::Prompt => vec!["g1", "g2", PARTITION_GROUP],
        Scenario::Scale => SCALE_GROUPS.to_vec(),
        _ => vec!["g1"],
    }
}

/// Every (queue, group) that must be drained at the end of a run.
pub fn drain_targets(scenario: Scenario) -> Vec<(&'static str, &'static str)> {
    match scenario {
        Scenario::Prompt => {
            let mut t: Vec<(&str, &str)> = PROMPT_QUEUES
                .iter()
                .flat_map(|q| [(*q, "g1"), (*q, "g2"), (*q, PARTITION_GROUP)])
                .collect();
            t.push((PROMPT_RESET, SEEK_GROUP));
            t.push((PROMPT_RESET, DELETED_GROUP));
            t
        }
        Scenario::Faults => {
            let mut t: Vec<(&str, &str)> = groups_of(Scenario::Faults)
                .into_iter()
                .map(|g| (queue_of(Scenario::Faults), g))
                .collect();
            t.push((CONFLATION_QUEUE, CONFLATION_GROUP));
            t
        }
        s => groups_of(s).into_iter().map(|g| (queue_of(s), g)).collect(),
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
        Scenario::Prompt => PROMPT_LEASE,
        Scenario::Retention => RETENTION_QUEUE,
        Scenario::Scale => SCALE_QUEUE,
    }
}

#[derive(Clone, Copy)]
enum PopPath {
    /// Queue-wide (hot-list or wildcard).
    Queue,
    /// Named partitions just ahead of the producer (the creation race).
    AheadOfProducer,
    /// Named partitions, one pop each, in turn (the single-partition route).
    Partitions([&'static str; 2]),
    /// A namespace pop (`GET /api/v1/pop?namespace=`).
    Discovery(&'static str),
}

/// What only the liveness checker judges: the groups the prompt scenario rewinds on purpose
/// (seeks back, deletes) and the pushes to their queue, which no other group reads.
pub fn is_rewound(e: &Event) -> bool {
    match e {
        Event::Pushed { queue, .. } => queue == PROMPT_RESET,
        e => e
            .group()
            .is_some_and(|g| g == SEEK_GROUP || g == DELETED_GROUP),
    }
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
    /// After dying, comes back as a new process (a restarted service) after a moment.
    revives: bool,
    /// Starts when the driver says retention ran (the late group).
    late: bool,
    /// Acks through the other broker (the one it does not pop from).
    ack_elsewhere: bool,
    /// Chance that an ack reports the batch's first message failed.
    fail_p: f64,
    /// Works this long on every delivery before acking it (a group that falls behind).
    work_ms: u64,
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
    /// Partition names are this prefix and a number (unique across the prompt queues).
    prefix: &'static str,
    /// Stops after this many pushes (a queue that goes quiet).
    max_pushes: Option<u64>,
    /// One push in four goes as a transaction's push operation (the faults scenario: a crash
    /// aimed between a transaction's commit and its answer needs transactions to aim at).
    transactions: bool,
    /// Each push writes into every partition of the producer in one request: one event makes
    /// several partitions ready at once.
    spread: bool,
    /// Each message goes as a timer (`POST /api/v1/timers`) due 100 ms to 2.5 s later, through
    /// one broker, while the queue's consumers are parked on the brokers.
    timers: bool,
}

fn plan(scenario: Scenario, brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    match scenario {
        Scenario::Prompt => prompt_plan(brokers),
        Scenario::Retention => retention_plan(brokers),
        Scenario::Scale => scale_plan(brokers),
        Scenario::CreationRace => creation_plan(brokers),
        Scenario::Contention => contention_plan(brokers),
        Scenario::LostWakes => lost_wakes_plan(brokers),
        Scenario::Faults => faults_plan(brokers),
    }
}

/// A consumer with the workload's defaults, named by `i` and on broker `i` (round robin).
fn consumer(
    brokers: &[String],
    i: usize,
    queue: &'static str,
    group: &'static str,
    path: PopPath,
    auto_ack: bool,
) -> Consumer {
    Consumer {
        name: format!("consumer{i}"),
        broker: brokers[i % brokers.len()].clone(),
        queue,
        group,
        path,
        batch: 3,
        timeout_ms: 1_000,
        auto_ack,
        start_ms: 0,
        mortal: false,
        revives: false,
        late: false,
        ack_elsewhere: false,
        fail_p: 0.08,
        work_ms: 0,
    }
}

/// A producer with the workload's defaults: `partitions` named `p<n>`, pushes `gap_ms` apart.
fn producer(name: String, queue: &'static str, partitions: u32, gap_ms: (u64, u64)) -> Producer {
    Producer {
        name,
        queue,
        partitions,
        fresh_partitions: false,
        gap_ms,
        burst: 0.0,
        prefix: "p",
        max_pushes: None,
        transactions: false,
        spread: false,
        timers: false,
    }
}

/// g1 keeps up; g2 falls behind (completed retention waits for it, pending retention takes what
/// it reaches too late); g3 makes first contact mid-run. producer1 makes a new partition with
/// every push: groups meet it without a cursor row there.
fn retention_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let q = RETENTION_QUEUE;
    let cs = vec![
        consumer(brokers, 0, q, "g1", PopPath::Queue, false),
        consumer(brokers, 1, q, "g1", PopPath::Queue, false),
        Consumer {
            work_ms: 350,
            ..consumer(brokers, 2, q, LAGGING_GROUP, PopPath::Queue, false)
        },
        Consumer {
            start_ms: 5_000,
            ..consumer(brokers, 3, q, LATE_GROUP, PopPath::Queue, false)
        },
    ];
    let producers = vec![
        producer("producer0".into(), q, 3, (20, 150)),
        Producer {
            fresh_partitions: true,
            ..producer("producer1".into(), q, 0, (300, 900))
        },
    ];
    (producers, cs)
}

/// The backlog first, in one push into every partition, before any group's first contact; then
/// a trickle into random partitions. Each group's two consumers start one after another group's.
fn scale_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let producers = vec![
        Producer {
            max_pushes: Some(1),
            spread: true,
            ..producer("producer0".into(), SCALE_QUEUE, SCALE_PARTITIONS, (0, 0))
        },
        producer(
            "producer1".into(),
            SCALE_QUEUE,
            SCALE_PARTITIONS,
            (200, 600),
        ),
    ];
    let consumers = SCALE_GROUPS
        .iter()
        .enumerate()
        .flat_map(|(g, group)| {
            (0..2).map(move |k| Consumer {
                start_ms: 500 + 500 * g as u64,
                batch: 10,
                ..consumer(
                    brokers,
                    2 * g + k,
                    SCALE_QUEUE,
                    group,
                    PopPath::Queue,
                    false,
                )
            })
        })
        .collect();
    (producers, consumers)
}

/// Pops of named partitions racing the pushes that create them.
fn creation_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let producers = vec![Producer {
        fresh_partitions: true,
        ..producer("producer0".into(), "c", 0, (5, 60))
    }];
    let consumers = (0..3)
        .map(|i| Consumer {
            timeout_ms: 300,
            ..consumer(brokers, i, "c", "g1", PopPath::AheadOfProducer, false)
        })
        .collect();
    (producers, consumers)
}

/// Eight consumers of one group on two partitions (SKIP LOCKED), and a second group's first
/// contact later.
fn contention_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let mut cs: Vec<Consumer> = (0..8)
        .map(|i| consumer(brokers, i, "k", "g1", PopPath::Queue, false))
        .collect();
    cs.extend((8..11).map(|i| Consumer {
        start_ms: 4_000,
        ..consumer(brokers, i, "k", "g2", PopPath::Queue, false)
    }));
    (vec![producer("producer0".into(), "k", 2, (2, 30))], cs)
}

/// Bursts far apart into one partition, four autoAck consumers parked on long polls.
fn lost_wakes_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let producers = vec![Producer {
        burst: 0.6,
        ..producer("producer0".into(), "w", 1, (1_500, 3_000))
    }];
    let consumers = (0..4)
        .map(|i| Consumer {
            timeout_ms: 8_000,
            batch: 2,
            ..consumer(brokers, i, "w", "g1", PopPath::Queue, true)
        })
        .collect();
    (producers, consumers)
}

/// Two producers (a quarter of their pushes as transactions), a group of three (one mortal), an
/// autoAck group, and a group that makes first contact after retention removed what the others
/// consumed.
fn faults_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    let mut cs: Vec<Consumer> = (0..3)
        .map(|i| Consumer {
            mortal: i == 0,
            ..consumer(brokers, i, "f", "g1", PopPath::Queue, false)
        })
        .collect();
    cs.push(consumer(brokers, 3, "f", "g2", PopPath::Queue, true));
    cs.push(Consumer {
        late: true,
        ..consumer(brokers, 4, "f", LATE_GROUP, PopPath::Queue, false)
    });
    let producers = (0..2)
        .map(|i| Producer {
            transactions: true,
            ..producer(format!("producer{i}"), "f", 4, (20, 200))
        })
        .collect();
    (producers, cs)
}

/// One producer per prompt queue (the spread queue's pushes further apart than the bound), and
/// a quiet one for the queue whose groups are sought back and deleted.
fn prompt_producers() -> Vec<Producer> {
    let prefixes = ["l", "d", "w", "r", "n", "s"];
    let mut producers: Vec<Producer> = PROMPT_QUEUES
        .iter()
        .zip(prefixes)
        .enumerate()
        .map(|(i, (q, prefix))| Producer {
            name: format!("producer{i}"),
            queue: q,
            partitions: 2,
            fresh_partitions: false,
            gap_ms: (200, 1_500),
            burst: 0.2,
            prefix,
            max_pushes: None,
            transactions: false,
            spread: *q == PROMPT_SPREAD,
            timers: false,
        })
        .map(|p| match p.queue {
            // Pushes further apart than the bound, so that no push's own wake serves what the
            // previous one left behind.
            PROMPT_SPREAD => Producer {
                gap_ms: (2_500, 4_000),
                burst: 0.0,
                ..p
            },
            _ => p,
        })
        .collect();
    producers.push(Producer {
        name: "producer-quiet".into(),
        queue: PROMPT_RESET,
        partitions: 2,
        fresh_partitions: false,
        gap_ms: (50, 300),
        burst: 0.0,
        prefix: "q",
        max_pushes: Some(5),
        transactions: false,
        spread: false,
        timers: false,
    });
    // Timers into the lease queue's partitions: a due timer is a deliverability event the
    // liveness checker holds to the same bound (`SimDb::deliverable_now` counts a due timer).
    producers.push(Producer {
        name: "timers".into(),
        queue: PROMPT_LEASE,
        partitions: 2,
        fresh_partitions: false,
        gap_ms: (1_500, 3_000),
        burst: 0.0,
        prefix: "l",
        max_pushes: None,
        transactions: false,
        spread: false,
        timers: true,
    });
    producers
}

fn prompt_plan(brokers: &[String]) -> (Vec<Producer>, Vec<Consumer>) {
    (prompt_producers(), prompt_consumers(brokers))
}

/// Every pop route of the prompt scenario on every queue: one consumer of each queue's group
/// (several on the spread queue), one of the named partitions, a discovery consumer, the
/// long-lease queue's four, and the groups that are sought back and deleted.
fn prompt_consumers(brokers: &[String]) -> Vec<Consumer> {
    let b = |i: usize| brokers[i % brokers.len()].clone();
    let mut n = 0;
    let mut consumer = |queue, group, path, broker: usize| {
        n += 1;
        Consumer {
            name: format!("consumer{n}"),
            broker: b(broker),
            queue,
            group,
            path,
            batch: 2,
            timeout_ms: 30_000,
            auto_ack: false,
            start_ms: 0,
            mortal: false,
            revives: true,
            late: false,
            ack_elsewhere: true,
            fail_p: 0.0,
            work_ms: 0,
        }
    };
    let partitions: [[&'static str; 2]; 6] = [
        ["l0", "l1"],
        ["d0", "d1"],
        ["w0", "w1"],
        ["r0", "r1"],
        ["n0", "n1"],
        ["s0", "s1"],
    ];
    let mut cs = vec![];
    for (i, q) in PROMPT_QUEUES.iter().enumerate() {
        let fail_p = if *q == PROMPT_RETRY { 0.4 } else { 0.0 };
        if *q == PROMPT_SPREAD {
            for _ in 0..SPREAD_CONSUMERS {
                cs.push(Consumer {
                    work_ms: SPREAD_WORK_MS,
                    ..consumer(q, "g1", PopPath::Queue, i)
                });
            }
        } else if *q != PROMPT_LONG {
            cs.push(Consumer {
                mortal: *q == PROMPT_LEASE,
                fail_p,
                ..consumer(q, "g1", PopPath::Queue, i)
            });
        }
        cs.push(Consumer {
            mortal: *q == PROMPT_LEASE,
            fail_p,
            ..consumer(
                q,
                PARTITION_GROUP,
                PopPath::Partitions(partitions[i]),
                i + 1,
            )
        });
    }
    cs.push(consumer(
        PROMPT_LEASE,
        "g2",
        PopPath::Discovery(PROMPT_NAMESPACE),
        1,
    ));
    // The long-lease queue's consumers park on broker0 and ack through broker1: only a release
    // event (or, when it is lost, the reconnect's reseed) frees the partition early. They start
    // together on a backlog, so the group's first contacts (wildcard looks) race each other's
    // claims, releases and the ring's drop of a drained partition: a look's stale `LeasedUntil`
    // must not park a partition the ring dropped meanwhile (a 30 s stall otherwise).
    for _ in 0..4 {
        cs.push(Consumer {
            start_ms: 2_500,
            batch: 10,
            ..consumer(PROMPT_LONG, "g1", PopPath::Queue, 0)
        });
    }
    cs.push(consumer(PROMPT_RESET, SEEK_GROUP, PopPath::Queue, 0));
    cs.push(consumer(PROMPT_RESET, DELETED_GROUP, PopPath::Queue, 0));
    cs
}

pub fn client_names(scenario: Scenario) -> Vec<String> {
    let (p, c) = plan(scenario, &["broker0".to_string()]);
    p.into_iter()
        .map(|p| p.name)
        .chain(c.into_iter().map(|c| c.name))
        .chain(lockers(scenario))
        .chain(kv_clients(scenario))
        .chain(stream_workers(scenario))
        .chain(conflating_consumers(scenario))
        .chain(readers(scenario))
        .chain(super::ephemeral_clients::client_names(scenario))
        .collect()
}

/// The retention scenario's reader: reads by offset while pushes, retention and crashes run.
fn readers(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Retention => vec![READER.to_string()],
        _ => vec![],
    }
}

pub const READER: &str = "reader";

/// The faults scenario's KV clients (each call through either broker under the fault schedule;
/// the judge holds each key's history to linearizability).
fn kv_clients(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Faults => (0..3).map(|i| format!("kv{i}")).collect(),
        _ => vec![],
    }
}

/// The faults scenario's stream workers: SDK-shaped workers of one stream query, competing for
/// the source queue's partitions through either broker under the fault schedule (the judge
/// holds their cycles to `streams_check`).
fn stream_workers(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Faults => (0..2).map(|i| format!("stream{i}")).collect(),
        _ => vec![],
    }
}

/// The faults scenario's conflating consumers: each feeds its own partition of
/// `CONFLATION_QUEUE` and pops the newest of either partition for `CONFLATION_GROUP` through
/// either broker under the fault schedule, dying now and then with a delivery in hand (the judge
/// holds what they saw to `conflation_check`).
fn conflating_consumers(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Faults => (0..2).map(|i| format!("last{i}")).collect(),
        _ => vec![],
    }
}

pub const CONFLATION_QUEUE: &str = "cf.src";
pub const CONFLATION_GROUP: &str = "cf.last";

pub const STREAM_SOURCE: &str = "st.src";
pub const STREAM_SINK: &str = "st.sink";
pub const STREAM_GROUP: &str = "streams.sim";
/// Where the stream workers emit the windows they close (regular cycles and idle flushes alike).
pub const STREAM_WINDOWS: &str = "st.win";
/// The state key prefix of the stream workers' windows.
pub const WINDOW_PREFIX: &str = "w\u{1f}";
const STREAM_QUERY: &str = "sim-query";

/// The keys the KV clients share, in namespace `KV_NAMESPACE`.
pub const KV_KEYS: [&str; 2] = ["a", "b"];
/// The KV clients' rate-limit counter (incremented by one with `max`, never otherwise written).
pub const KV_COUNTER: &str = "ctr";
pub const KV_COUNTER_MAX: i64 = 25;
/// The KV clients' pair keys: every batch writes one value to both, all or nothing.
pub const KV_PAIR: [&str; 2] = ["pa", "pb"];
/// The KV clients' key written with a TTL of `KV_TTL_SECS`.
pub const KV_TTL_KEY: &str = "t";
pub const KV_TTL_SECS: i64 = 1;
pub const KV_NAMESPACE: &str = "sim";

/// The faults scenario's lock holders (they take locks through either broker under the fault
/// schedule; the driver holds the model to lock safety at every step).
fn lockers(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Faults => (0..3).map(|i| format!("locker{i}")).collect(),
        _ => vec![],
    }
}

/// The locks the lockers take, and their permits.
pub const LOCKS: [(&str, u32); 2] = [("job", 1), ("pool", 2)];

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
    for (i, name) in lockers(scenario).into_iter().enumerate() {
        let (shared, rng) = (shared.clone(), rng.child(&name));
        sim.client(name.clone(), async move {
            hold_locks(shared, i, name, rng).await;
            Ok(())
        });
    }
    for name in readers(scenario) {
        let (shared, rng) = (shared.clone(), rng.child(&name));
        sim.client(name, async move {
            read_by_offset(shared, rng).await;
            Ok(())
        });
    }
    for (i, name) in kv_clients(scenario).into_iter().enumerate() {
        let (shared, rng) = (shared.clone(), rng.child(&name));
        sim.client(name.clone(), async move {
            use_kv(shared, i, name, rng).await;
            Ok(())
        });
    }
    for (i, name) in stream_workers(scenario).into_iter().enumerate() {
        let (shared, rng) = (shared.clone(), rng.child(&name));
        sim.client(name.clone(), async move {
            run_stream(shared, i, name, rng).await;
            Ok(())
        });
    }
    for (i, name) in conflating_consumers(scenario).into_iter().enumerate() {
        let (shared, rng) = (shared.clone(), rng.child(&name));
        sim.client(name.clone(), async move {
            consume_newest(shared, i, name, rng).await;
            Ok(())
        });
    }
    super::ephemeral_clients::spawn(sim, shared, scenario, rng);
    if scenario == Scenario::Prompt {
        let (shared, rng) = (shared.clone(), rng.child(ADMIN));
        sim.client(ADMIN, async move {
            administer(shared, rng).await;
            Ok(())
        });
    }
}

/// Pushes `feeds` messages to a worker's own partition, numbered on from `fed`, trying up to five
/// brokers in turn from `k`: a resend of a lost push carries the same transaction ids
/// (de-duplicated).
async fn feed(
    shared: &Shared,
    k: usize,
    queue: &str,
    partition: &str,
    name: &str,
    fed: &mut u64,
    feeds: u64,
) {
    let items: Vec<Value> = (0..feeds)
        .map(|i| json!({"queue": queue, "partition": partition,
                        "payload": {"n": *fed + i}, "transactionId": format!("{name}-{}", *fed + i)}))
        .collect();
    *fed += feeds;
    let body = json!({ "items": items });
    for attempt in (0..5).filter(|_| feeds > 0) {
        let b = &shared.brokers[(k + attempt) % shared.brokers.len()];
        let answer = request(
            b,
            "POST",
            "/api/v1/push",
            Some(&body),
            Duration::from_secs(2),
        )
        .await;
        if let Ok((201, _)) = answer {
            break;
        }
    }
}

/// Sends `body` through the brokers in turn until one answers 200 (or the run is over): the
/// workers' set-up calls. False when the run ended first.
async fn until_answered(
    shared: &Shared,
    k: &mut usize,
    path: &str,
    body: &Value,
    lost: &'static str,
) -> Option<Value> {
    let brokers = shared.brokers.len();
    loop {
        if shared.draining.load(Ordering::SeqCst) {
            return None;
        }
        *k += 1;
        let broker = &shared.brokers[*k % brokers];
        match request(broker, "POST", path, Some(body), Duration::from_secs(2)).await {
            Ok((200, answer)) => return Some(answer),
            _ => {
                shared.bump(lost);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
