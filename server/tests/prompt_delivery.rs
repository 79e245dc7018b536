//! Prompt delivery over real HTTP, on both backends and across two brokers on one PostgreSQL:
//! every event that makes a message deliverable reaches a parked long-poll on every pop route,
//! with the hot-list on and off.
//!
//! No timing asserts: the brokers re-check parked pops only every 60 s and reseed their rings
//! every 30 s, while each parked pop's long-poll lasts a few seconds. A 200 therefore proves the
//! event (or the revisit storage asked for) delivered it; without it the pop answers 204.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use queen_core::pop::PopBugs;
use std::net::SocketAddr;
use std::time::Duration;

use common::{metrics, request, start, start_pair, Store};
use queen_core::backoff::WaitBackoff;
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

/// Re-checks far apart: only events and revisits can serve a parked pop within its long-poll.
fn event_driven(hotlist: bool) -> ServerConfig {
    ServerConfig {
        backoff: WaitBackoff {
            initial_ms: 60_000,
            threshold: 1,
            multiplier: 1.0,
            max_ms: 60_000,
        },
        hotlist,
        ..ServerConfig::default()
    }
}

/// The long-poll of a parked pop: longer than any case's event, far shorter than a re-check.
const LONG_POLL_MS: u64 = 8_000;

#[derive(Clone, Copy, Debug)]
enum Route {
    Partition,
    Queue,
    Discovery,
}

const ROUTES: [Route; 3] = [Route::Partition, Route::Queue, Route::Discovery];

/// A pop path on `route` for (namespace.task queue, partition p), parking for the long-poll.
fn pop_path(route: Route, queue: &str, group: &str, extra: &str) -> String {
    let q = format!("wait=true&timeout={LONG_POLL_MS}&batch=10&consumerGroup={group}{extra}");
    match route {
        Route::Partition => format!("/api/v1/pop/queue/{queue}/partition/p?{q}"),
        Route::Queue => format!("/api/v1/pop/queue/{queue}?{q}"),
        Route::Discovery => {
            let namespace = queue.split('.').next().unwrap();
            format!("/api/v1/pop?namespace={namespace}&{q}")
        }
    }
}

async fn configure(addr: SocketAddr, queue: &str, options: Value) {
    let r = request(
        addr,
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": queue, "options": options})),
    )
    .await;
    assert_eq!(r.status, 200, "configure {queue}: {}", r.json());
}

async fn push(addr: SocketAddr, queue: &str, txids: &[&str]) {
    let items: Vec<Value> = txids
        .iter()
        .map(|t| json!({"queue": queue, "partition": "p", "payload": {"t": t}, "transactionId": t}))
        .collect();
    let r = request(addr, "POST", "/api/v1/push", Some(&json!({"items": items}))).await;
    assert_eq!(r.status, 201, "push: {}", r.json());
}

/// A non-waiting leased pop of the partition: (leaseId, partitionId, transactionIds).
async fn take(
    addr: SocketAddr,
    queue: &str,
    group: &str,
    batch: u32,
) -> (String, String, Vec<String>) {
    let r = request(
        addr,
        "GET",
        &format!("/api/v1/pop/queue/{queue}/partition/p?batch={batch}&consumerGroup={group}"),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "take from {queue}");
    let v = r.json();
    let txids = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_string())
        .collect();
    (
        v["leaseId"].as_str().unwrap().to_string(),
        v["messages"][0]["partitionId"]
            .as_str()
            .unwrap()
            .to_string(),
        txids,
    )
}

async fn ack(
    addr: SocketAddr,
    group: &str,
    lease: &str,
    pid: &str,
    txids: &[String],
    status: &str,
) {
    let acks: Vec<Value> = txids
        .iter()
        .map(
            |t| json!({"transactionId": t, "partitionId": pid, "leaseId": lease, "status": status}),
        )
        .collect();
    let r = request(
        addr,
        "POST",
        "/api/v1/ack/batch",
        Some(&json!({"acknowledgments": acks, "consumerGroup": group})),
    )
    .await;
    assert_eq!(r.status, 200, "ack: {}", r.json());
    for o in r.json().as_array().unwrap() {
        assert_eq!(o["success"], true, "ack refused: {o}");
    }
}

/// Pushes one message and has `group` consume and acknowledge it.
async fn consumed(addr: SocketAddr, queue: &str, group: &str, txid: &str) {
    push(addr, queue, &[txid]).await;
    let (lease, pid, txids) = take(addr, queue, group, 1).await;
    ack(addr, group, &lease, &pid, &txids, "completed").await;
}

/// Starts a pop on `addr` and waits until it has parked (its broker counts one more parked pop,
/// or, when other cases park too, a moment has passed) or was answered without parking.
async fn park(addr: SocketAddr, path: String) -> tokio::task::JoinHandle<common::Response> {
    let before = metrics(addr).await["parkedPops"].as_u64().unwrap();
    let waiter = tokio::spawn(async move { request(addr, "GET", &path, None).await });
    for _ in 0..400 {
        if waiter.is_finished() || metrics(addr).await["parkedPops"].as_u64().unwrap() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiter
}

/// The transactionIds a parked pop was answered with (empty for a 204).
async fn answered(waiter: tokio::task::JoinHandle<common::Response>) -> Vec<String> {
    let r = waiter.await.unwrap();
    if r.status == 204 {
        return vec![];
    }
    assert_eq!(r.status, 200);
    r.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_string())
        .collect()
}

/// What makes the message deliverable by time alone.
#[derive(Clone, Copy, Debug)]
enum Timed {
    LeaseExpiry,
    Delay,
    Window,
    RetryDelay,
}

const TIMED: [Timed; 4] = [
    Timed::LeaseExpiry,
    Timed::Delay,
    Timed::Window,
    Timed::RetryDelay,
];

/// One time-based case on one route: the parked pop must be served when the time comes.
async fn timed_case(addr: SocketAddr, route: Route, what: Timed, tag: &str) {
    // One namespace per case, so a discovery pop sees only this queue.
    let queue = format!("{tag}{}{route:?}.q", format!("{what:?}").to_lowercase()).to_lowercase();
    let group = "g";
    match what {
        Timed::LeaseExpiry => {
            configure(addr, &queue, json!({"leaseTime": 2})).await;
            push(addr, &queue, &["m1"]).await;
            // A consumer takes it and dies: the lease ends in 2 s.
            take(addr, &queue, group, 1).await;
        }
        Timed::Delay => {
            configure(addr, &queue, json!({"delayedProcessing": 2})).await;
            push(addr, &queue, &["m1"]).await;
        }
        Timed::Window => {
            configure(addr, &queue, json!({"windowBuffer": 2})).await;
            push(addr, &queue, &["m1"]).await;
        }
        Timed::RetryDelay => {
            configure(addr, &queue, json!({"retryDelay": 2000, "retryLimit": 3})).await;
            push(addr, &queue, &["m1"]).await;
            let (lease, pid, txids) = take(addr, &queue, group, 1).await;
            ack(addr, group, &lease, &pid, &txids, "failed").await;
        }
    }
    let waiter = park(addr, pop_path(route, &queue, group, "")).await;
    assert_eq!(
        answered(waiter).await,
        vec!["m1".to_string()],
        "{what:?} on the {route:?} route ({queue}): the parked pop was not served in time"
    );
}

async fn every_timed_case(store: fn() -> Store, tag: &str) {
    for hotlist in [true, false] {
        let b = start(store(), event_driven(hotlist)).await;
        let mut cases = vec![];
        for route in ROUTES {
            for what in TIMED {
                let tag = format!("{tag}{}", if hotlist { "h" } else { "s" });
                cases.push(tokio::spawn(async move {
                    timed_case(b.addr, route, what, &tag).await
                }));
            }
        }
        for c in cases {
            c.await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_based_events_serve_parked_pops_on_every_route_memory() {
    every_timed_case(|| Store::Memory, "m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_based_events_serve_parked_pops_on_every_route_postgres() {
    every_timed_case(|| Store::Postgres("queen_prompt_timed"), "p").await;
}

/// A consumer-group delete on one broker wakes a consumer parked on the queue (single broker:
/// without the event, the group's pop waits for its re-check).
async fn group_delete_wakes(store: Store) {
    let b = start(store, event_driven(true)).await;
    let queue = "gdel.q";
    consumed(b.addr, queue, "g", "m1").await;
    for route in ROUTES {
        // autoAck: the delivery moves the cursor, so each round starts from a drained group.
        let waiter = park(b.addr, pop_path(route, queue, "g", "&autoAck=true")).await;
        let r = request(
            b.addr,
            "DELETE",
            &format!("/api/v1/consumer-groups/g/queues/{queue}"),
            None,
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            answered(waiter).await,
            vec!["m1".to_string()],
            "a deleted group starts over; its parked {route:?} pop gets the message"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_delete_wakes_its_parked_consumers_memory() {
    group_delete_wakes(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_delete_wakes_its_parked_consumers_postgres() {
    group_delete_wakes(Store::Postgres("queen_prompt_gdel")).await;
}

/// What another broker does that must wake a consumer parked here.
#[derive(Clone, Copy, Debug)]
enum Elsewhere {
    /// An ack ends a lease over a backlog.
    AckRelease,
    /// A push lands during the lease; then the ack.
    PushDuringLease,
    /// A failed ack: the retryDelay hold ends.
    FailedAck,
    Seek,
    GroupDelete,
    DeadLetterRequeue,
}

const ELSEWHERE: [Elsewhere; 6] = [
    Elsewhere::AckRelease,
    Elsewhere::PushDuringLease,
    Elsewhere::FailedAck,
    Elsewhere::Seek,
    Elsewhere::GroupDelete,
    Elsewhere::DeadLetterRequeue,
];

/// One cross-broker case: `b` parks a consumer, `a` acts; the parked pop gets `expect`.
async fn cross_broker_case(a: SocketAddr, b: SocketAddr, route: Route, what: Elsewhere, tag: &str) {
    let queue = format!("{tag}{}{route:?}.q", format!("{what:?}").to_lowercase()).to_lowercase();
    let g = "g";
    // A 300 s lease, as Queen's default: a consumer parked on `b` must not wait it out.
    configure(
        a,
        &queue,
        json!({"leaseTime": 300, "retryDelay": 1500, "retryLimit": 0}),
    )
    .await;
    let expect: Vec<String>;
    let action: Box<
        dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send,
    >;
    match what {
        Elsewhere::AckRelease => {
            push(a, &queue, &["m1", "m2"]).await;
            let (lease, pid, txids) = take(a, &queue, g, 1).await;
            expect = vec!["m2".into()];
            action = Box::new(move || {
                Box::pin(async move { ack(a, g, &lease, &pid, &txids, "completed").await })
            });
        }
        Elsewhere::PushDuringLease => {
            push(a, &queue, &["m1"]).await;
            let (lease, pid, txids) = take(a, &queue, g, 1).await;
            expect = vec!["m2".into()];
            let q = queue.clone();
            action = Box::new(move || {
                Box::pin(async move {
                    push(a, &q, &["m2"]).await;
                    ack(a, g, &lease, &pid, &txids, "completed").await
                })
            });
        }
        Elsewhere::FailedAck => {
            configure(
                a,
                &queue,
                json!({"leaseTime": 300, "retryDelay": 1500, "retryLimit": 3}),
            )
            .await;
            push(a, &queue, &["m1"]).await;
            let (lease, pid, txids) = take(a, &queue, g, 1).await;
            expect = vec!["m1".into()];
            action = Box::new(move || {
                Box::pin(async move { ack(a, g, &lease, &pid, &txids, "failed").await })
            });
        }
        Elsewhere::Seek => {
            consumed(a, &queue, g, "m1").await;
            expect = vec!["m1".into()];
            let q = queue.clone();
            action = Box::new(move || {
                Box::pin(async move {
                    let r = request(
                        a,
                        "POST",
                        &format!("/api/v1/consumer-groups/{g}/queues/{q}/seek"),
                        Some(&json!({"timestamp": "2000-01-01T00:00:00Z"})),
                    )
                    .await;
                    assert_eq!(r.status, 200, "seek: {}", r.json());
                })
            });
        }
        Elsewhere::GroupDelete => {
            consumed(a, &queue, g, "m1").await;
            expect = vec!["m1".into()];
            let q = queue.clone();
            action = Box::new(move || {
                Box::pin(async move {
                    let r = request(
                        a,
                        "DELETE",
                        &format!("/api/v1/consumer-groups/{g}/queues/{q}"),
                        None,
                    )
                    .await;
                    assert_eq!(r.status, 200);
                })
            });
        }
        Elsewhere::DeadLetterRequeue => {
            push(a, &queue, &["m1"]).await;
            let (lease, pid, txids) = take(a, &queue, g, 1).await;
            ack(a, g, &lease, &pid, &txids, "dlq").await;
            let r = request(a, "GET", &format!("/api/v1/dlq?queue={queue}"), None).await;
            let id = r.json()["messages"][0]["dlqId"]
                .as_i64()
                .expect("a dead letter");
            expect = vec![format!("requeue-{id}-m1")];
            action = Box::new(move || {
                Box::pin(async move {
                    let r = request(a, "POST", &format!("/api/v1/dlq/{id}/requeue"), None).await;
                    assert_eq!(r.status, 200, "requeue: {}", r.json());
                })
            });
        }
    }
    let waiter = park(b, pop_path(route, &queue, g, "")).await;
    action().await;
    let got = answered(waiter).await;
    assert_eq!(
        got,
        expect,
        "{what:?} through the other broker, consumer parked on the {route:?} route ({queue}); \
         the parked broker's metrics: {}",
        metrics(b).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_broker_does_wakes_consumers_parked_on_another() {
    for hotlist in [true, false] {
        let (a, b) = start_pair("queen_prompt_pair", event_driven(hotlist)).await;
        let mut cases = vec![];
        for route in ROUTES {
            for what in ELSEWHERE {
                let tag = if hotlist { "h" } else { "s" };
                let (a, b) = (a.addr, b.addr);
                cases.push(tokio::spawn(async move {
                    cross_broker_case(a, b, route, what, tag).await
                }));
            }
        }
        for c in cases {
            c.await.unwrap();
        }
    }
}

/// A broker whose notification connection drops misses what happens meanwhile; its reconnect
/// resyncs, so a consumer parked there is served without waiting for a re-check or a reseed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_listener_catches_up() {
    let (a, b) = start_pair("queen_prompt_relisten", event_driven(true)).await;
    let (a, b) = (a.addr, b.addr);
    let queue = "relisten.q";
    configure(a, queue, json!({"leaseTime": 300})).await;
    push(a, queue, &["m1", "m2"]).await;
    // Broker b learns the partition is leased (its own consumer is refused it).
    let (lease, pid, txids) = take(a, queue, "g", 1).await;
    let waiter = park(b, pop_path(Route::Queue, queue, "g", "")).await;
    // Cut every LISTEN connection; the ack lands while nobody listens.
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(&format!(
        "queen_prompt_relisten_{}",
        std::process::id()
    ));
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let cut = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
            &[],
        )
        .await
        .expect("terminate the listeners");
    assert_eq!(cut.len(), 2, "both brokers' listeners were cut");
    ack(a, "g", &lease, &pid, &txids, "completed").await;
    assert_eq!(
        answered(waiter).await,
        vec!["m2".to_string()],
        "the reconnect's resync served the parked consumer"
    );
}

/// A model storage whose next partition pop is held after it has read its answer: an event can
/// then land while the pop waits for a stale reply, deterministically.
struct HeldPartitionPop {
    inner: std::sync::Arc<queen_storage_sim::SimDb>,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

/// Only the pop capability is held; every other call goes straight to the model.
#[async_trait::async_trait]
impl queen_core::storage::PopStorage for HeldPartitionPop {
    async fn queue_config(
        &self,
        queue: &str,
    ) -> queen_core::storage::StorageResult<Option<queen_core::storage::QueueConfig>> {
        self.inner.queue_config(queue).await
    }
    async fn pop_partition(
        &self,
        req: queen_core::storage::PopRequest,
        partition: String,
    ) -> queen_core::storage::StorageResult<queen_core::storage::PopResult> {
        let answer = self.inner.pop_partition(req, partition).await;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        answer
    }
    async fn pop_list(
        &self,
        req: queen_core::storage::PopRequest,
        candidates: Vec<String>,
    ) -> queen_core::storage::StorageResult<queen_core::storage::PopResult> {
        self.inner.pop_list(req, candidates).await
    }
    async fn pop_wildcard(
        &self,
        req: queen_core::storage::PopRequest,
    ) -> queen_core::storage::StorageResult<queen_core::storage::PopResult> {
        self.inner.pop_wildcard(req).await
    }
    async fn queues_matching(
        &self,
        namespace: Option<String>,
        task: Option<String>,
    ) -> queen_core::storage::StorageResult<Vec<String>> {
        self.inner.queues_matching(namespace, task).await
    }
    async fn next_pending(
        &self,
        queues: &[String],
        group: &str,
    ) -> queen_core::storage::StorageResult<Option<queen_core::Timestamp>> {
        self.inner.next_pending(queues, group).await
    }
    async fn partition_numbers(
        &self,
        partition_ids: &[String],
    ) -> queen_core::storage::StorageResult<Vec<Option<u64>>> {
        self.inner.partition_numbers(partition_ids).await
    }
    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        after: Option<&str>,
        limit: u32,
    ) -> queen_core::storage::StorageResult<Vec<String>> {
        self.inner
            .pending_partitions(queue, group, after, limit)
            .await
    }
}

/// A push lands while a parked partition pop waits for storage's answer, read before the push:
/// the pop must look again instead of sleeping through it. With the driver's historical bug
/// switched back on (the wake marked seen and dropped), the same schedule strands it.
async fn a_wake_during_a_storage_call(drop_wakes_during_work: bool) -> u16 {
    use std::sync::Arc;
    let db = queen_storage_sim::SimDb::new(
        3,
        Arc::new(queen_server::wall_now),
        queen_storage_sim::SimBugs::default(),
    );
    let storage = Arc::new(HeldPartitionPop {
        inner: db.clone(),
        armed: std::sync::atomic::AtomicBool::new(false),
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let hooks = queen_server::broker::Hooks {
        pop_bugs: queen_core::pop::PopBugs {
            drop_wakes_during_work,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut backend = queen_core::storage::StorageSet::of(db);
    backend.pops = storage.clone();
    let app = queen_server::broker::Broker::with_hooks(event_driven(true), backend, 5, hooks);
    queen_server::tasks::start(&app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    // The partition exists and is drained.
    consumed(addr, "held.q", "g", "m1").await;
    storage
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let path = "/api/v1/pop/queue/held.q/partition/p?wait=true&timeout=3000&consumerGroup=g";
    let waiter = tokio::spawn(async move { request(addr, "GET", path, None).await });
    // The pop's storage call has read "nothing" and is held; now the push lands.
    storage.entered.notified().await;
    push(addr, "held.q", &["m2"]).await;
    storage.release.notify_one();
    waiter.await.unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_during_a_storage_call_is_not_slept_through() {
    assert_eq!(
        a_wake_during_a_storage_call(false).await,
        200,
        "the pop looked again after its stale answer"
    );
    assert_eq!(
        a_wake_during_a_storage_call(true).await,
        204,
        "the bug switch (the wake dropped) is caught: the pop slept through the push"
    );
}

/// An event-driven broker (`hotlist`: on the hot-list path) on a fresh model database with a
/// case's hooks (its bug switches), serving on a free port.
async fn hooked_memory_broker(
    hotlist: bool,
    hooks: queen_server::broker::Hooks,
    seed: u64,
) -> (std::sync::Arc<queen_server::broker::Broker>, SocketAddr) {
    let db = queen_storage_sim::SimDb::new(
        3,
        std::sync::Arc::new(queen_server::wall_now),
        queen_storage_sim::SimBugs::default(),
    );
    let app = queen_server::broker::Broker::with_hooks(
        event_driven(hotlist),
        queen_core::storage::StorageSet::of(db),
        seed,
        hooks,
    );
    queen_server::tasks::start(&app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    (app, addr)
}

/// A backlog the ring never heard of (pushed before the group's first pop), larger than a reseed
/// page: the walk reads on page after page as the ring drains, not a reseed interval (here an
/// hour) later. More partitions than the first contact's wildcard scan lists (512 candidates),
/// so the ring cannot learn them all from its verdicts. Answers how many of the partitions'
/// messages sequential wait=false pops took.
async fn walked_backlog(walk_stops_after_first_page: bool) -> usize {
    const PARTITIONS: usize = WALKED_PARTITIONS;
    let hooks = queen_server::broker::Hooks {
        ring_bugs: queen_core::ring::RingBugs {
            walk_stops_after_first_page,
            ..Default::default()
        },
        reseed_interval_ms: 3_600_000,
        reseed_page: 4,
        ..Default::default()
    };
    let (app, addr) = hooked_memory_broker(true, hooks, 9).await;
    let items: Vec<Value> = (0..PARTITIONS)
        .map(|i| {
            json!({"queue": "walk.q", "partition": format!("p{i:03}"),
                        "transactionId": format!("m{i}"), "payload": {"i": i}})
        })
        .collect();
    let pushed = request(
        addr,
        "POST",
        "/api/v1/push",
        Some(&json!({ "items": items })),
    )
    .await;
    assert_eq!(pushed.status, 201);
    let mut taken = std::collections::BTreeSet::new();
    // Each pop takes one partition's message; a few more pops than partitions allow for the
    // first contact and the pops that fetch a page.
    for _ in 0..PARTITIONS * 2 {
        let r = request(
            addr,
            "GET",
            "/api/v1/pop/queue/walk.q?batch=10&wait=false&autoAck=true&consumerGroup=g",
            None,
        )
        .await;
        if r.status == 200 {
            for m in r.json()["messages"].as_array().unwrap() {
                taken.insert(m["transactionId"].as_str().unwrap().to_string());
            }
        }
        if taken.len() == PARTITIONS {
            break;
        }
    }
    app.shutting_down.send_replace(true);
    taken.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_larger_than_a_reseed_page_is_walked_whole() {
    assert_eq!(
        walked_backlog(false).await,
        WALKED_PARTITIONS,
        "every partition was found"
    );
    let stranded = walked_backlog(true).await;
    assert!(
        stranded < WALKED_PARTITIONS,
        "the bug switch (a walk of one page) is caught: {stranded} of {WALKED_PARTITIONS} taken"
    );
}

const WALKED_PARTITIONS: usize = 600;

/// No thundering herd, and nothing left behind by avoiding it. Twenty pops of one group park on
/// a warm, empty queue (one partition each); one push writes into four partitions. The push
/// wakes one parked pop, and each woken pop that leaves partitions behind hands the wake on, so
/// four pops are answered with a partition each and the rest stay parked until their deadline.
/// On the hot-list path a pop hands on when it takes its share of candidates and when it hands
/// untried ones back; concurrent hand-offs may wake a pop for a partition another pop took
/// meanwhile, but each is for a partition left behind: at most two per pushed partition. On the
/// legacy scan (`hotlist` off) every pop that claims hands on and the chain ends at the first
/// that finds nothing: one more than the partitions. However many are parked, either way.
/// Re-checks are a minute apart, so each 200 was a wake or a hand-off.
/// Answers (the partitions the parked pops were answered with, pops woken).
async fn one_push_into_four_partitions(
    hotlist: bool,
    pop_bugs: queen_core::pop::PopBugs,
) -> (Vec<String>, u64) {
    const PARKED: usize = 20;
    const PARTITIONS: usize = 4;
    let hooks = queen_server::broker::Hooks {
        pop_bugs,
        ..Default::default()
    };
    let (app, addr) = hooked_memory_broker(hotlist, hooks, 11).await;
    // The group's first contact and the ring's first walk happen here, not under the test.
    let warm = "/api/v1/pop/queue/herd.q?wait=false&consumerGroup=g";
    assert_eq!(request(addr, "GET", warm, None).await.status, 204);
    let path =
        "/api/v1/pop/queue/herd.q?wait=true&timeout=2500&batch=10&partitions=1&consumerGroup=g";
    let mut waiters = vec![];
    for _ in 0..PARKED {
        waiters.push(park(addr, path.to_string()).await);
    }
    let woken_before = metrics(addr).await["popsWoken"].as_u64().unwrap();
    let items: Vec<Value> = (0..PARTITIONS)
        .map(|i| json!({"queue": "herd.q", "partition": format!("p{i}"), "payload": {"i": i}}))
        .collect();
    let pushed = request(
        addr,
        "POST",
        "/api/v1/push",
        Some(&json!({ "items": items })),
    )
    .await;
    assert_eq!(pushed.status, 201);
    let mut partitions = vec![];
    for w in waiters {
        let r = w.await.unwrap();
        if r.status == 200 {
            partitions.push(r.json()["partition"].as_str().unwrap().to_string());
        } else {
            assert_eq!(r.status, 204);
        }
    }
    let woken = metrics(addr).await["popsWoken"].as_u64().unwrap() - woken_before;
    app.shutting_down.send_replace(true);
    partitions.sort();
    (partitions, woken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_wakes_only_the_pops_it_can_serve_and_strands_none() {
    let (served, woken) = one_push_into_four_partitions(true, PopBugs::default()).await;
    assert_eq!(served, ["p0", "p1", "p2", "p3"], "one partition per pop");
    assert!(
        (4..=8).contains(&woken),
        "twenty pops parked, four partitions: {woken} woken (four to eight)"
    );
    let no_handoff = PopBugs {
        no_wake_handoff: true,
        ..PopBugs::default()
    };
    let (served, _) = one_push_into_four_partitions(true, no_handoff).await;
    assert_eq!(
        served.len(),
        1,
        "the bug switch (no hand-off) is caught: the woken pop's leftovers stranded the rest: {served:?}"
    );
    let no_return_handoff = PopBugs {
        no_handoff_of_returned: true,
        ..PopBugs::default()
    };
    let (served, _) = one_push_into_four_partitions(true, no_return_handoff).await;
    assert!(
        served.len() < 4,
        "the bug switch (no hand-off of returned candidates) is caught: {served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_legacy_scan_a_push_wakes_only_the_pops_it_can_serve_and_strands_none() {
    let (served, woken) = one_push_into_four_partitions(false, PopBugs::default()).await;
    assert_eq!(served, ["p0", "p1", "p2", "p3"], "one partition per pop");
    assert!(
        (4..=8).contains(&woken),
        "twenty pops parked, four partitions: {woken} woken (four to eight)"
    );
    let no_handoff = PopBugs {
        no_scan_wake_handoff: true,
        ..PopBugs::default()
    };
    let (served, _) = one_push_into_four_partitions(false, no_handoff).await;
    assert_eq!(
        served.len(),
        1,
        "the bug switch (no hand-off after a claim) is caught: {served:?}"
    );
}

/// Polls `addr`'s metrics until `ready` holds of them (a loaded machine may take seconds).
async fn until_metrics(addr: SocketAddr, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    for _ in 0..3_000 {
        if ready(&metrics(addr).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{addr} never reached: {what}");
}

/// The legacy scan's revisit outlives the pop that heard of it. Two brokers on one PostgreSQL;
/// on A (`QUEEN_HOTLIST=0`, re-checks a minute apart) two pops of one group park in turn on an
/// empty queue, the first with a short long-poll. On B a message is pushed and at once taken
/// under a 5 s lease, never acked. The push's wake reaches A only after the claim (A holds its
/// wakes until the test delivers that one): it wakes A's first pop, whose probe learns when the
/// lease ends and which answers empty at its deadline before then. A's second pop never heard of
/// the lease, and A's rings never saw the claim (it was B's): A's ticker must wake it when the
/// lease ends, from what the probe said.
/// Answers what A's second pop was answered with; `None` when the run could not set the scene
/// (the first pop's long-poll ended before the push's wake could reach it: a stalled machine).
async fn a_lease_ending_after_its_listener_left(
    pop_bugs: queen_core::pop::PopBugs,
    attempt: u32,
) -> Option<Vec<String>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let name = format!(
        "queen_prompt_revisit_{}_{}_{attempt}",
        std::process::id(),
        pop_bugs.no_scan_revisit
    );
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    // Every wake on A is dropped until the test delivers the push's, so that nothing else (the
    // listener's start, the queue's configuration) wakes a pop and reorders A's parked pops.
    let holding = std::sync::Arc::new(AtomicBool::new(true));
    let mut addrs = vec![];
    let mut apps = vec![];
    for (seed, hotlist) in [(21u64, false), (22, true)] {
        let pg = queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
            tls: Default::default(),
            pg: cfg.clone(),
            pool_size: 4,
        })
        .await
        .unwrap();
        let held = holding.clone();
        let hooks = queen_server::broker::Hooks {
            pop_bugs,
            wake_fate: (!hotlist).then(|| {
                let held: queen_server::broker::WakeFilter = std::sync::Arc::new(move |_| {
                    if held.load(Ordering::SeqCst) {
                        queen_server::broker::WakeFate::Drop
                    } else {
                        queen_server::broker::WakeFate::Deliver
                    }
                });
                held
            }),
            ..Default::default()
        };
        let app = queen_server::broker::Broker::with_hooks(
            event_driven(hotlist),
            queen_core::storage::StorageSet::of(std::sync::Arc::new(pg.clone())),
            seed,
            hooks,
        );
        queen_server::tasks::start(&app);
        queen_server::spawn_event_listener(app.clone(), &pg);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        tokio::spawn(queen_server::serve_listener(app.clone(), listener));
        apps.push(app);
    }
    let (a, b) = (addrs[0], addrs[1]);
    let heard = |kind: &'static str| {
        move |m: &serde_json::Value| m["deliveryEvents"][kind].as_u64() >= Some(1)
    };
    until_metrics(a, "A's listener is up", heard("resync")).await;
    // The lease outlives the first pop's long-poll by at least 2 s.
    configure(b, "gone.q", json!({"leaseTime": 5})).await;
    until_metrics(
        a,
        "A heard of the queue's configuration",
        heard("queue_changed"),
    )
    .await;
    let path = |timeout_ms: u64| {
        format!("/api/v1/pop/queue/gone.q?wait=true&timeout={timeout_ms}&batch=1&consumerGroup=g")
    };
    let first = park(a, path(3_000)).await;
    let second = park(a, path(LONG_POLL_MS)).await;
    push(b, "gone.q", &["m1"]).await;
    let (_, _, taken) = take(b, "gone.q", "g", 1).await;
    assert_eq!(taken, ["m1"], "B takes it before A hears of the push");
    until_metrics(a, "A heard of the push", heard("push")).await;
    // The push's wake, late: it goes to the pop parked first (a group's parked pops are woken
    // in the order they parked), which must still be parked.
    let scene_set = metrics(a).await["parkedPops"].as_u64() == Some(2);
    holding.store(false, Ordering::SeqCst);
    apps[0].wake("gone.q");
    let first_served = answered(first).await;
    let served = answered(second).await;
    for app in apps {
        app.shutting_down.send_replace(true);
    }
    if !scene_set {
        return None;
    }
    assert!(first_served.is_empty(), "the lease outlasts the first pop");
    Some(served)
}

/// Runs the scene until it is set (a stalled machine may end the first pop's long-poll early).
async fn second_pop_served_after_the_lease(pop_bugs: queen_core::pop::PopBugs) -> Vec<String> {
    for attempt in 0..3 {
        if let Some(served) = a_lease_ending_after_its_listener_left(pop_bugs, attempt).await {
            return served;
        }
    }
    panic!("the first pop's long-poll ended before the push's wake three times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_legacy_scan_a_lease_ending_wakes_a_pop_that_never_heard_of_it() {
    assert_eq!(
        second_pop_served_after_the_lease(PopBugs::default()).await,
        ["m1"],
        "redelivered when the lease ends"
    );
    let kept_by_the_pop = PopBugs {
        no_scan_revisit: true,
        ..PopBugs::default()
    };
    assert!(
        second_pop_served_after_the_lease(kept_by_the_pop)
            .await
            .is_empty(),
        "the bug switch (the revisit kept by the pop that asked) is caught"
    );
}

/// Queue-wide pops that do not wait, each right after its consumer acked the previous message
/// through another broker whose release it has not heard of (here the brokers never hear each
/// other's events, as when the release's notification is still on its way). Broker `a` leases
/// one message at a time; each ack goes through `b`; `a` is asked again at once. Answers the
/// transaction ids delivered before the first 204.
async fn one_shot_pops_after_releases_elsewhere(store: Store, pop_bugs: PopBugs) -> Vec<String> {
    let b = start(store, event_driven(true)).await;
    let hooks = queen_server::broker::Hooks {
        pop_bugs,
        ..Default::default()
    };
    let app = queen_server::broker::Broker::with_hooks(
        event_driven(true),
        b.app.storage.clone(),
        11,
        hooks,
    );
    queen_server::tasks::start(&app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = listener.local_addr().unwrap();
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    let queue = "oneshot.q";
    let sent = ["m1", "m2", "m3", "m4"];
    push(a, queue, &sent).await;
    let pop = format!("/api/v1/pop/queue/{queue}?batch=1&wait=false&consumerGroup=g");
    let mut delivered = vec![];
    while delivered.len() < sent.len() {
        let r = request(a, "GET", &pop, None).await;
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "pop: {}", r.json());
        let v = r.json();
        let txid = v["messages"][0]["transactionId"]
            .as_str()
            .unwrap()
            .to_string();
        let pid = v["messages"][0]["partitionId"].as_str().unwrap();
        let lease = v["leaseId"].as_str().unwrap();
        ack(
            b.addr,
            "g",
            lease,
            pid,
            std::slice::from_ref(&txid),
            "completed",
        )
        .await;
        delivered.push(txid);
    }
    delivered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_that_does_not_wait_sees_a_release_made_through_another_broker() {
    for store in [
        Store::Memory,
        Store::Postgres("queen_prompt_oneshot_release"),
    ] {
        assert_eq!(
            one_shot_pops_after_releases_elsewhere(store, PopBugs::default()).await,
            ["m1", "m2", "m3", "m4"],
            "each pop asked storage about the lease its ring believed in"
        );
    }
    let trusting = PopBugs {
        one_shot_pop_trusts_ring_leases: true,
        ..PopBugs::default()
    };
    let delivered = one_shot_pops_after_releases_elsewhere(Store::Memory, trusting).await;
    assert!(
        delivered.len() < 4,
        "the bug switch (the ring's lease trusted) is caught: a pop answered empty ({delivered:?})"
    );
}
