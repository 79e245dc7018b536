//! The simulated producers and consumers: real HTTP requests to the brokers, every answer (or its
//! absence) recorded in the history.

use std::collections::BTreeMap;
use std::ops::Not;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use queen_core::rng::SeededRng;
use serde_json::{json, Value};

use super::history::{Event, Msg};
use super::http::request;
use super::{hit, Scenario, Shared, Wait};

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

/// One conflating consumer: feeds its own partition (until the drain), long-polls the newest of
/// either partition with `conflation=true`, and acks it, except now and then when it dies with
/// the delivery in hand (the lease must bring it back). It keeps consuming through the drain,
/// until the run is over.
async fn consume_newest(shared: Arc<Shared>, who: usize, name: String, mut rng: SeededRng) {
    use super::conflation_check::ConflationSeen;
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    let configure = json!({"queue": CONFLATION_QUEUE, "options": {"leaseTime": super::LEASE_SECS}});
    let lost = "fault: request without an answer (conflation)";
    if until_answered(&shared, &mut k, "/api/v1/configure", &configure, lost)
        .await
        .is_none()
    {
        return;
    }
    let partition = format!("l{who}");
    let mut fed = 0u64;
    let record = |seen: ConflationSeen| {
        if let Ok(mut all) = shared.conflation_seen.lock() {
            all.push(seen);
        }
    };
    while !shared.done.load(Ordering::SeqCst) {
        k += 1;
        let broker = &shared.brokers[k % brokers];
        let feeds = if shared.draining.load(Ordering::SeqCst) || rng.below(2) == 1 {
            0
        } else {
            1 + rng.below(3)
        };
        feed(
            &shared,
            k,
            CONFLATION_QUEUE,
            &partition,
            &name,
            &mut fed,
            feeds,
        )
        .await;
        let pop = format!(
            "/api/v1/pop/queue/{CONFLATION_QUEUE}?batch=3&partitions=2&consumerGroup={CONFLATION_GROUP}\
             &conflation=true&wait=true&timeout=1000"
        );
        let messages = match request(broker, "GET", &pop, None, timeout).await {
            Ok((200, body)) => {
                let messages = body["messages"].as_array().cloned().unwrap_or_default();
                record(ConflationSeen::Answer {
                    messages: messages
                        .iter()
                        .map(|m| {
                            (
                                m["partition"].as_str().unwrap_or_default().to_string(),
                                m["offset"].as_i64().unwrap_or(-1),
                            )
                        })
                        .collect(),
                    echoed: body["conflation"] == true,
                });
                messages
            }
            Ok(_) => vec![],
            Err(_) => {
                shared.bump(lost);
                vec![]
            }
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            continue;
        }
        shared.bump("conflation: newest messages delivered");
        if rng.below(5) == 0 {
            // Dies with the delivery in hand: no ack, the lease ends it.
            shared.bump("conflation: deliveries abandoned");
            continue;
        }
        for m in &messages {
            record(ConflationSeen::AckSent {
                partition: m["partition"].as_str().unwrap_or_default().to_string(),
                offset: m["offset"].as_i64().unwrap_or(-1),
            });
            let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "consumerGroup": CONFLATION_GROUP,
                             "status": "completed"});
            if request(broker, "POST", "/api/v1/ack", Some(&ack), timeout)
                .await
                .is_err()
            {
                shared.bump(lost);
            }
        }
    }
}

/// One stream worker: feeds its own source partition, long-polls a batch of either partition, reads
/// the partition's state and commits a cycle, as the SDKs' windowed workers do: the `count` row
/// moved on by the batch, one sink message naming the batch, a window row opened for the batch,
/// every window row it read closed (deleted, and emitted to `STREAM_WINDOWS`), and the ack of the
/// batch's last message, fenced on the lease. Now and then it dawdles past the lease between the
/// pop and the cycle, so the other worker re-claims the batch and the late cycle must be fenced
/// out. Beside it runs its idle flush (`flush_windows`), which closes the ripe windows of the
/// partitions the worker has seen and races both workers' cycles. A cycle without an answer is
/// never resent.
async fn run_stream(shared: Arc<Shared>, who: usize, name: String, mut rng: SeededRng) {
    use super::streams_check::{CycleOutcome, StreamCycle, WindowClose};
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    let register = json!({"name": STREAM_QUERY, "source_queue": STREAM_SOURCE,
                          "sink_queue": STREAM_SINK, "config_hash": "sim"});
    // The source's lease as the other queues' (configured here, through a broker, so the other
    // scenarios start from the state they always had).
    let configure = json!({"queue": STREAM_SOURCE, "options": {"leaseTime": super::LEASE_SECS}});
    let lost = "fault: request without an answer (streams)";
    if until_answered(&shared, &mut k, "/api/v1/configure", &configure, lost)
        .await
        .is_none()
    {
        return;
    }
    let Some(registered) =
        until_answered(&shared, &mut k, "/streams/v1/queries", &register, lost).await
    else {
        return;
    };
    let Some(query_id) = registered["query_id"].as_str().map(str::to_string) else {
        return;
    };
    let seen: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>> = Arc::default();
    tokio::spawn(flush_windows(
        shared.clone(),
        who,
        format!("{name}-flush"),
        query_id.clone(),
        seen.clone(),
        rng.child("flush"),
    ));
    let partition = format!("s{who}");
    let mut fed = 0u64;
    while !shared.draining.load(Ordering::SeqCst) {
        k += 1;
        let broker = &shared.brokers[k % brokers];
        // Feed, every other turn or so (so the workers' long-polls also find the source empty
        // and park).
        let feeds = if rng.below(2) == 0 {
            1 + rng.below(3)
        } else {
            0
        };
        feed(
            &shared,
            k,
            STREAM_SOURCE,
            &partition,
            &name,
            &mut fed,
            feeds,
        )
        .await;
        // A long-poll, as the SDKs' source pops are (`wait(True)`, up to a second).
        let pop = format!(
            "/api/v1/pop/queue/{STREAM_SOURCE}?batch=3&consumerGroup={STREAM_GROUP}&wait=true&timeout=1000"
        );
        let messages = match request(broker, "GET", &pop, None, timeout).await {
            Ok((200, body)) => body["messages"].as_array().cloned().unwrap_or_default(),
            Ok(_) => vec![],
            Err(_) => {
                shared.bump("fault: request without an answer (streams)");
                vec![]
            }
        };
        let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            continue;
        };
        let pid = first["partitionId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Ok(mut seen) = seen.lock() {
            seen.insert(pid.clone());
        }
        let part = first["partition"].as_str().unwrap_or_default().to_string();
        let (from, to) = (
            first["offset"].as_i64().unwrap_or(-1),
            last["offset"].as_i64().unwrap_or(-1),
        );
        let read = json!({"query_id": query_id, "partition_id": pid, "keys": []});
        let Some(rows) = read_state(&shared, broker, &read).await else {
            // The lease ends and the batch comes back.
            continue;
        };
        let count_row = rows.iter().find(|r| r["key"] == "count");
        let (count, read_last) = match count_row {
            Some(r) => (
                r["value"]["count"].as_i64().unwrap_or(0),
                r["value"]["last"].as_i64(),
            ),
            None => (0, None),
        };
        if rng.below(5) == 0 {
            // Past the lease (2 s), now and then.
            tokio::time::sleep(Duration::from_millis(1_000 + rng.below(2_500))).await;
        }
        let nonce = format!("{name}-c{k}");
        let (mut state_ops, mut push_items, closed) = close_windows(&rows, &pid, &nonce);
        state_ops.push(json!({"type": "upsert", "key": "count",
                              "value": {"count": count + (to - from + 1), "last": to}}));
        state_ops.push(
            json!({"type": "upsert", "key": format!("{WINDOW_PREFIX}{from}"),
                              "value": {"windowEnd": 0, "from": from}}),
        );
        push_items.push(json!({"queue": STREAM_SINK, "partition": "out",
                               "payload": {"pid": pid, "from": from, "to": to, "nonce": nonce}}));
        let cycle = json!({
            "query_id": query_id,
            "partition_id": pid,
            "consumer_group": STREAM_GROUP,
            "state_ops": state_ops,
            "push_items": push_items,
            "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                    "status": "completed"},
        });
        let outcome =
            match request(broker, "POST", "/streams/v1/cycle", Some(&cycle), timeout).await {
                Ok((200, body)) if body["success"] == true => {
                    shared.bump("streams: cycles committed");
                    CycleOutcome::Committed
                }
                Ok((status, _)) => {
                    shared.bump("streams: cycles refused (the lease fence, mostly)");
                    if status != 200 {
                        shared.bump("streams: cycles answered 4xx/5xx");
                    }
                    CycleOutcome::Refused
                }
                Err(_) => {
                    shared.bump("streams: cycles without an answer");
                    CycleOutcome::Unknown
                }
            };
        if let Ok(mut closes) = shared.window_closes.lock() {
            closes.push(WindowClose {
                nonce: nonce.clone(),
                windows: closed,
                flush: false,
                outcome,
            });
        }
        if let Ok(mut cycles) = shared.stream_cycles.lock() {
            cycles.push(StreamCycle {
                partition_id: pid,
                partition: part,
                read_last,
                from,
                to,
                nonce,
                outcome,
            });
        }
    }
}

/// A state read's rows (`None`: no answer, counted as a fault).
async fn read_state(shared: &Shared, broker: &str, read: &Value) -> Option<Vec<Value>> {
    match request(
        broker,
        "POST",
        "/streams/v1/state/get",
        Some(read),
        Duration::from_secs(2),
    )
    .await
    {
        Ok((200, body)) => Some(body["rows"].as_array().cloned().unwrap_or_default()),
        _ => {
            shared.bump("fault: request without an answer (streams)");
            None
        }
    }
}

/// The state ops and window emits that close every window row of `rows` (a cycle's or a
/// flush's read), and the (partition id, from) of each.
fn close_windows(
    rows: &[Value],
    pid: &str,
    nonce: &str,
) -> (Vec<Value>, Vec<Value>, Vec<(String, i64)>) {
    let mut ops = vec![];
    let mut emits = vec![];
    let mut closed = vec![];
    for row in rows {
        let Some(key) = row["key"].as_str().filter(|k| k.starts_with(WINDOW_PREFIX)) else {
            continue;
        };
        let from = row["value"]["from"].as_i64().unwrap_or(-1);
        ops.push(json!({"type": "delete", "key": key}));
        emits.push(json!({"queue": STREAM_WINDOWS, "partition": "out",
                          "payload": {"pid": pid, "from": from, "closer": nonce}}));
        closed.push((pid.to_string(), from));
    }
    (ops, emits, closed)
}

/// A stream worker's idle flush, beside its cycles (as the SDKs' flush timer runs): now and then
/// it reads the ripe windows of a partition the worker has seen and closes them in a cycle
/// without an ack, through either broker. It races its own worker's cycles and the other
/// worker's, and the other worker's flush.
async fn flush_windows(
    shared: Arc<Shared>,
    who: usize,
    name: String,
    query_id: String,
    seen: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    mut rng: SeededRng,
) {
    use super::streams_check::{CycleOutcome, WindowClose};
    let timeout = Duration::from_secs(2);
    let brokers = shared.brokers.len();
    let mut k = who;
    while !shared.draining.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        k += 1;
        let pids: Vec<String> = seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if pids.is_empty() {
            continue;
        }
        let pid = &pids[rng.below(pids.len() as u64) as usize];
        let broker = &shared.brokers[k % brokers];
        let read = json!({"query_id": query_id, "partition_id": pid, "keys": [],
                          "key_prefix": WINDOW_PREFIX, "ripe_at_or_before": 0});
        let Some(rows) = read_state(&shared, broker, &read).await else {
            continue;
        };
        let nonce = format!("{name}-f{k}");
        let (state_ops, push_items, closed) = close_windows(&rows, pid, &nonce);
        if closed.is_empty() {
            continue;
        }
        // Now and then the flush's commit comes late (its read goes stale meanwhile).
        if rng.below(3) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(600))).await;
        }
        let broker = &shared.brokers[(k + rng.below(2) as usize) % brokers];
        let cycle = json!({"query_id": query_id, "partition_id": pid,
                           "consumer_group": STREAM_GROUP, "state_ops": state_ops,
                           "push_items": push_items, "ack": null});
        let outcome =
            match request(broker, "POST", "/streams/v1/cycle", Some(&cycle), timeout).await {
                Ok((200, body)) if body["success"] == true => {
                    shared.bump("streams: flushes committed");
                    CycleOutcome::Committed
                }
                Ok((409, body)) => {
                    if body["error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("stream state changed"))
                    {
                        shared.bump("streams: flushes refused (a window another cycle closed)");
                    } else {
                        shared.bump("streams: flushes refused (the source leased)");
                    }
                    CycleOutcome::Refused
                }
                Ok(_) => {
                    shared.bump("streams: flushes refused (other)");
                    CycleOutcome::Refused
                }
                Err(_) => {
                    shared.bump("streams: flushes without an answer");
                    CycleOutcome::Unknown
                }
            };
        if let Ok(mut closes) = shared.window_closes.lock() {
            closes.push(WindowClose {
                nonce,
                windows: closed,
                flush: true,
                outcome,
            });
        }
    }
}

/// Takes a lock (a 1 s permit) through one broker, resending through the other when the answer
/// is lost (the same owner: the broker answers the permit it holds), holds it up to 1.5 s (past
/// its lifetime, sometimes) and releases it, three times in four.
async fn hold_locks(shared: Arc<Shared>, who: usize, owner: String, mut rng: SeededRng) {
    let timeout = Duration::from_secs(2);
    let mut k = who;
    // Per lock: this holder's tenures so far (a resent acquire answers the permit kept).
    let mut tenures: BTreeMap<&str, u64> = BTreeMap::new();
    while !shared.draining.load(Ordering::SeqCst) {
        let (name, limit) = LOCKS[rng.below(LOCKS.len() as u64) as usize];
        k += 1;
        let acquire = json!({"operations": [
            {"op": "acquire", "name": name, "ttlSeconds": 1, "owner": owner, "limit": limit}]});
        let mut granted = None;
        for attempt in 0..5 {
            let broker = &shared.brokers[(k + attempt) % shared.brokers.len()];
            let invoked = shared.now();
            match request(broker, "POST", "/api/v1/locks", Some(&acquire), timeout).await {
                Ok((200, body)) => {
                    let r = body["results"][0].clone();
                    if r["acquired"] == true {
                        if r["already"] == true {
                            shared.bump("locks: a resent acquire answered the permit held");
                        }
                        granted = Some((broker.clone(), r));
                    } else {
                        shared.bump("locks: acquire refused, permits held");
                        let tokens = r["holders"]
                            .as_array()
                            .map(|hs| hs.iter().filter_map(|h| h["token"].as_i64()).collect())
                            .unwrap_or_default();
                        if let Ok(mut refusals) = shared.lock_refusals.lock() {
                            refusals.push((name.to_string(), invoked, tokens));
                        }
                    }
                    break;
                }
                _ => {
                    shared.bump("fault: request without an answer (locks)");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        if let Some((broker, r)) = granted {
            shared.bump("locks: acquired");
            // The holder's tenure: a resent acquire answered the permit this holder kept.
            let tenure = tenures.entry(name).or_default();
            if r["already"] != true {
                *tenure += 1;
            }
            let holder = format!("{owner}-{tenure}");
            let slot = r["slot"].as_u64().unwrap_or(0);
            let mut token = r["token"].as_i64().unwrap_or(-1);
            write_fenced(&shared, name, slot, &holder, token);
            tokio::time::sleep(Duration::from_millis(50 + rng.below(1_450))).await;
            write_fenced(&shared, name, slot, &holder, token);
            if rng.below(3) == 0 {
                // A renew, now and then after the permit's second (so some find it lapsed), and
                // a write with the token it answered.
                let renew = json!({"operations": [{"op": "renew", "name": name, "token": token,
                    "slot": slot, "ttlSeconds": 1, "owner": owner}]});
                match request(&broker, "POST", "/api/v1/locks", Some(&renew), timeout).await {
                    Ok((200, body)) if body["results"][0]["renewed"] == true => {
                        shared.bump("locks: renewed");
                        token = body["results"][0]["token"].as_i64().unwrap_or(-1);
                        tokio::time::sleep(Duration::from_millis(rng.below(900))).await;
                        write_fenced(&shared, name, slot, &holder, token);
                    }
                    Ok((200, _)) => shared.bump("locks: renew found the permit lost"),
                    _ => shared.bump("fault: request without an answer (locks)"),
                }
            }
            if rng.below(4) != 0 {
                let release = json!({"operations": [
                    {"op": "release", "name": name, "token": token, "slot": slot}]});
                if let Ok((200, body)) =
                    request(&broker, "POST", "/api/v1/locks", Some(&release), timeout).await
                {
                    shared.bump(if body["results"][0]["released"] == true {
                        "locks: released"
                    } else {
                        "locks: release found the permit expired"
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(280))).await;
    }
}

/// A holder's write to the fenced resource of (lock, slot), with its permit's token.
fn write_fenced(shared: &Shared, name: &str, slot: u64, holder: &str, token: i64) {
    if let Ok(mut fenced) = shared.fenced.lock() {
        let accepted = fenced
            .entry((name.to_string(), slot))
            .or_default()
            .write(holder, token);
        shared.bump(if accepted {
            "locks: fenced writes accepted"
        } else {
            "locks: fenced writes refused (a lapsed holder)"
        });
    }
}

/// Gets, puts (plain, `putIfAbsent`, compare-and-set on the version last seen) and deletes on
/// the shared keys, each call through one broker and never resent: a call without an answer is
/// recorded with an unknown outcome (it may have committed).
async fn use_kv(shared: Arc<Shared>, who: usize, client: String, mut rng: SeededRng) {
    use super::kv_check::{KvCall, KvCallOp};
    let mut seen: BTreeMap<&str, i64> = BTreeMap::new();
    let mut n: i64 = 0;
    let mut counter_rng = rng.child("counter");
    let mut pair_rng = rng.child("pair");
    let mut ttl_rng = rng.child("ttl");
    // The first pair key's version this client last saw (0: absent).
    let mut pair_version = 0i64;
    while !shared.draining.load(Ordering::SeqCst) {
        // One call in five takes a permit of the counter (its own draw, so the other calls'
        // draws stay as they were).
        if counter_rng.below(5) == 0 {
            n += 1;
            incr_counter(&shared, who + n as usize).await;
            tokio::time::sleep(Duration::from_millis(20 + counter_rng.below(180))).await;
            continue;
        }
        // One in six of the rest puts or gets the TTL key (its own draws too).
        if ttl_rng.below(6) == 0 {
            n += 1;
            let value = (who as i64 + 1) * 1_000_000 + n;
            use_ttl_key(&shared, who + n as usize, value, ttl_rng.below(3) == 0).await;
            tokio::time::sleep(Duration::from_millis(20 + ttl_rng.below(400))).await;
            continue;
        }
        // One in six of the rest writes or reads the pair (its own draws too).
        if pair_rng.below(6) == 0 {
            n += 1;
            let value = (who as i64 + 1) * 1_000_000 + n;
            let write = pair_rng.below(3) != 0;
            use_pair(&shared, who + n as usize, value, write, &mut pair_version).await;
            tokio::time::sleep(Duration::from_millis(20 + pair_rng.below(180))).await;
            continue;
        }
        let key = KV_KEYS[rng.below(KV_KEYS.len() as u64) as usize];
        n += 1;
        // Unique across clients: a read that shows the value names the put that wrote it.
        let value = (who as i64 + 1) * 1_000_000 + n;
        let last = seen.get(key).copied();
        let roll = rng.below(100);
        let op = match roll {
            0..35 => KvCallOp::Get,
            35..60 => KvCallOp::Put {
                value,
                expect: None,
            },
            60..70 => KvCallOp::Put {
                value,
                expect: Some(0),
            },
            70..85 => KvCallOp::Put {
                value,
                expect: Some(last.unwrap_or(0)),
            },
            _ => KvCallOp::Delete {
                expect: last.filter(|_| roll.is_multiple_of(2)),
            },
        };
        let mut body = json!({"ns": KV_NAMESPACE, "key": key});
        match &op {
            KvCallOp::Get => body["op"] = json!("get"),
            KvCallOp::Put { value, expect } => {
                body["op"] = json!(if *expect == Some(0) {
                    "putIfAbsent"
                } else {
                    "put"
                });
                body["value"] = json!(value);
                body["forever"] = json!(true);
                if let Some(e) = expect.filter(|e| *e != 0) {
                    body["expect"] = json!(e);
                }
            }
            KvCallOp::Delete { expect } => {
                body["op"] = json!("delete");
                if let Some(e) = expect {
                    body["expect"] = json!(e);
                }
            }
        }
        let broker = &shared.brokers[(who + n as usize) % shared.brokers.len()];
        let invoked = shared.now();
        let call = json!({ "operations": [body] });
        let answered = match request(
            broker,
            "POST",
            "/api/v1/kv",
            Some(&call),
            Duration::from_secs(2),
        )
        .await
        {
            Ok((200, a)) => {
                let r = a["results"][0].clone();
                if let Some(v) = r["version"].as_i64() {
                    seen.insert(key, v);
                }
                shared.bump("kv: calls answered");
                Some((shared.now(), r))
            }
            _ => {
                shared.bump("fault: request without an answer (kv)");
                None
            }
        };
        if let Ok(mut calls) = shared.kv_calls.lock() {
            calls.push(KvCall {
                client: client.clone(),
                key: key.to_string(),
                op,
                invoked,
                answered,
            });
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(180))).await;
    }
}

/// A put of the TTL key (`KV_TTL_SECS`), or a get of it, through broker `k`, never resent.
async fn use_ttl_key(shared: &Shared, k: usize, value: i64, put: bool) {
    use super::kv_check::TtlCall;
    let broker = &shared.brokers[k % shared.brokers.len()];
    let op = if put {
        json!({"op": "put", "ns": KV_NAMESPACE, "key": KV_TTL_KEY, "value": value,
               "ttlSeconds": KV_TTL_SECS})
    } else {
        json!({"op": "get", "ns": KV_NAMESPACE, "key": KV_TTL_KEY})
    };
    let invoked = shared.now();
    let call = json!({ "operations": [op] });
    let Ok((200, answer)) = request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await
    else {
        shared.bump("kv: TTL key calls without an answer");
        return;
    };
    let answered = shared.now();
    let r = &answer["results"][0];
    let seen = match (put, r["version"].as_i64()) {
        (true, Some(version)) => TtlCall::Put {
            invoked,
            answered,
            version,
        },
        (true, None) => return,
        (false, version) => {
            shared.bump(if version.is_some() {
                "kv: TTL key read live"
            } else {
                "kv: TTL key read absent"
            });
            TtlCall::Get {
                invoked,
                answered,
                version,
            }
        }
    };
    if let Ok(mut calls) = shared.ttl_calls.lock() {
        calls.push(seen);
    }
}

/// A batch that writes `value` to both pair keys, the second write required and conditional on
/// the first key's version last seen (so some are refused and roll the first write back), or a
/// read of both in one call; through broker `k`, never resent.
async fn use_pair(shared: &Shared, k: usize, value: i64, write: bool, version: &mut i64) {
    let broker = &shared.brokers[k % shared.brokers.len()];
    let [first, second] = KV_PAIR;
    let call = if write {
        json!({"operations": [
            {"op": "put", "ns": KV_NAMESPACE, "key": second, "value": value, "forever": true},
            {"op": "put", "ns": KV_NAMESPACE, "key": first, "value": value, "forever": true,
             "expect": *version, "required": true}]})
    } else {
        json!({"operations": [{"op": "getMany", "ns": KV_NAMESPACE, "keys": [first, second]}]})
    };
    let Ok((200, answer)) = request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await
    else {
        shared.bump("kv: pair calls without an answer");
        return;
    };
    if write {
        let second_write = &answer["results"][1];
        if second_write["applied"] == true {
            shared.bump("kv: pair batches applied");
        } else {
            shared.bump("kv: pair batches refused whole");
        }
        if let Some(v) = second_write["version"].as_i64() {
            *version = v;
        }
        return;
    }
    let rows = answer["results"][0]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let value_of = |key: &str| {
        rows.iter()
            .find(|r| r["key"] == key)
            .and_then(|r| r["value"].as_i64())
    };
    if let Some(r) = rows.iter().find(|r| r["key"] == first) {
        *version = r["version"].as_i64().unwrap_or(*version);
    }
    shared.bump("kv: pair reads");
    if let Ok(mut reads) = shared.pair_reads.lock() {
        reads.push((value_of(first), value_of(second)));
    }
}

/// One `incr` of the rate-limit counter with `max`, through broker `k`: admitted (the value it
/// answered), refused at the limit, or without an answer.
async fn incr_counter(shared: &Shared, k: usize) {
    use super::kv_check::IncrOutcome;
    let broker = &shared.brokers[k % shared.brokers.len()];
    let call = json!({"operations": [{"op": "incr", "ns": KV_NAMESPACE, "key": KV_COUNTER,
                                      "delta": 1, "max": KV_COUNTER_MAX, "forever": true}]});
    let outcome = match request(
        broker,
        "POST",
        "/api/v1/kv",
        Some(&call),
        Duration::from_secs(2),
    )
    .await
    {
        Ok((200, a)) => match (
            a["results"][0]["applied"].as_bool(),
            a["results"][0]["value"].as_i64(),
        ) {
            (Some(true), Some(v)) => {
                shared.bump("kv: increments admitted");
                IncrOutcome::Admitted(v)
            }
            (Some(false), _) => {
                shared.bump("kv: increments refused at the limit");
                IncrOutcome::Refused
            }
            _ => IncrOutcome::Unknown,
        },
        _ => {
            shared.bump("kv: increments without an answer");
            IncrOutcome::Unknown
        }
    };
    if let Ok(mut calls) = shared.incr_calls.lock() {
        calls.push(outcome);
    }
}

/// Lists the retention queue's partitions (`partitions/changed`) and reads some of them by
/// offset (`fetch`) through either broker: from the start kept, from inside the range, or from
/// below it (out of range once retention moved the start), every 100-400 ms.
async fn read_by_offset(shared: Arc<Shared>, mut rng: SeededRng) {
    use super::reads_check::FetchSeen;
    let timeout = Duration::from_secs(2);
    while !shared.draining.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        let broker = &shared.brokers[rng.below(shared.brokers.len() as u64) as usize];
        let list = json!({"entries": [{"queue": RETENTION_QUEUE}]});
        let Ok((200, listed)) = request(
            broker,
            "POST",
            "/api/v1/partitions/changed",
            Some(&list),
            timeout,
        )
        .await
        else {
            shared.bump("fault: request without an answer (reads)");
            continue;
        };
        let parts = listed["entries"][0]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if parts.is_empty() {
            continue;
        }
        let mut entries = vec![];
        for _ in 0..3 {
            let p = &parts[rng.below(parts.len() as u64) as usize];
            let (start, end) = (
                p["logStart"].as_i64().unwrap_or(0),
                p["lastOffset"].as_i64().unwrap_or(-1) + 1,
            );
            let from = match rng.below(3) {
                0 => start,
                1 => start + rng.below((end - start + 1).max(1) as u64) as i64,
                _ => rng.below((end + 1).max(1) as u64) as i64,
            };
            entries.push(json!({"queue": RETENTION_QUEUE, "partition": p["name"], "offset": from}));
        }
        let call = json!({ "entries": entries });
        let Ok((200, answer)) =
            request(broker, "POST", "/api/v1/fetch", Some(&call), timeout).await
        else {
            shared.bump("fault: request without an answer (reads)");
            continue;
        };
        let got = answer["entries"].as_array().cloned().unwrap_or_default();
        let Ok(mut fetches) = shared.fetches.lock() else {
            return;
        };
        for (asked, e) in entries.iter().zip(got) {
            shared.bump(if e["error"].is_string() {
                "reads: entries answered with an error"
            } else {
                "reads: entries read"
            });
            fetches.push(FetchSeen {
                partition: asked["partition"].as_str().unwrap_or_default().to_string(),
                from: asked["offset"].as_i64().unwrap_or(0),
                high_watermark: e["highWatermark"].as_i64().unwrap_or(0),
                log_start: e["logStartOffset"].as_i64().unwrap_or(0),
                records: e["records"]
                    .as_array()
                    .map(|rs| {
                        rs.iter()
                            .map(|r| {
                                (
                                    r["offset"].as_i64().unwrap_or(-1),
                                    r["transactionId"].as_str().unwrap_or_default().to_string(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                error: e["error"].as_str().map(str::to_string),
            });
        }
    }
}

/// The prompt scenario's operator: seeks, group deletes and dead-letter requeues.
pub const ADMIN: &str = "admin";

/// Every 1.5-3 s, through the broker the affected consumers are not parked on: seeks the seek
/// group 3 s back, deletes the deleted group's cursors, or requeues a dead letter.
async fn administer(shared: Arc<Shared>, mut rng: SeededRng) {
    let Some(broker) = shared.brokers.last().cloned() else {
        return;
    };
    let timeout = Duration::from_secs(2);
    loop {
        tokio::time::sleep(Duration::from_millis(1_500 + rng.below(1_500))).await;
        if shared.draining.load(Ordering::SeqCst) {
            return;
        }
        match rng.below(3) {
            0 => {
                let at = super::sim_timestamp(shared.now()).minus_secs(3);
                let body = json!({ "timestamp": queen_core::time::format_iso_micros(at) });
                let path =
                    format!("/api/v1/consumer-groups/{SEEK_GROUP}/queues/{PROMPT_RESET}/seek");
                if let Ok((200, _)) = request(&broker, "POST", &path, Some(&body), timeout).await {
                    shared.bump("event: seek through the other broker");
                }
            }
            1 => {
                let path = format!("/api/v1/consumer-groups/{DELETED_GROUP}/queues/{PROMPT_RESET}");
                if let Ok((200, _)) = request(&broker, "DELETE", &path, None, timeout).await {
                    shared.bump("event: group delete through the other broker");
                }
            }
            _ => {
                let path = format!("/api/v1/dlq?queue={PROMPT_RETRY}&limit=1");
                let Ok((200, body)) = request(&broker, "GET", &path, None, timeout).await else {
                    continue;
                };
                let Some(id) = body["messages"][0]["dlqId"].as_i64() else {
                    continue;
                };
                let path = format!("/api/v1/dlq/{id}/requeue");
                if let Ok((200, _)) = request(&broker, "POST", &path, None, timeout).await {
                    shared.bump("event: dead letter requeued through the other broker");
                }
            }
        }
    }
}

async fn produce(shared: Arc<Shared>, p: Producer, made: Arc<AtomicU64>, mut rng: SeededRng) {
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
            let answer = match request(
                broker,
                "POST",
                path,
                Some(&request_body),
                Duration::from_secs(2),
            )
            .await
            {
                // A push answers the items; a transaction answers them under `results`.
                Ok((201, body)) if !as_transaction => body.as_array().cloned(),
                Ok((200, body)) if as_transaction && body["success"] == true => {
                    body["results"].as_array().cloned()
                }
                _ => None,
            };
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
                        .map(|t| t.0 - super::sim_timestamp(0).0)
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
