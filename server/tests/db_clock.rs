//! A broker on a host whose clock is off from the database's keeps the database's time
//! (`tasks::db_clock`): a lease that ends is redelivered to a parked consumer within the 1 s
//! bound, with a handful of storage calls. Without the alignment (the same broker, the task not
//! started) the tests show the two failures it prevents: 3 s ahead, the lease's end was
//! revisited every millisecond for 3 s; 3 s behind, the redelivery came 3 s late.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::request;
use queen_core::storage::StorageSet;
use queen_core::Timestamp;
use queen_server::broker::{Broker, Hooks};
use queen_server::config::ServerConfig;
use serde_json::json;

/// The liveness bound: a message that becomes deliverable reaches a parked consumer within it.
const BOUND: Duration = Duration::from_secs(1);
const LEASE_SECS: u64 = 2;

/// A broker whose host clock is `skew_ms` off, on a fresh database; aligned or not.
async fn skewed_broker(
    name: &str,
    skew_ms: i64,
    aligned: bool,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let pg =
        queen_storage_pg::testing::fresh_database(&format!("{name}_{}", std::process::id()), 8)
            .await;
    let hooks = Hooks {
        clock: Arc::new(move || Timestamp(queen_server::wall_now().0 + skew_ms * 1_000)),
        ..Hooks::default()
    };
    let app = Broker::with_hooks(
        ServerConfig::default(),
        StorageSet::of(Arc::new(pg.clone())),
        3,
        hooks,
    );
    queen_server::tasks::start(&app);
    queen_server::spawn_event_listener(app.clone(), &pg);
    if aligned {
        queen_server::spawn_clock_alignment(&app, &pg);
        for _ in 0..100 {
            if app.clock_offset_us() != 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let off_ms = app.clock_offset_us() / 1_000;
        assert!(
            (off_ms + skew_ms).abs() < 200,
            "measured the database {off_ms} ms ahead of a host {skew_ms} ms off"
        );
        let gauge = app.metrics.database_clock_ahead_seconds.get();
        assert!(
            (gauge * 1e3 + skew_ms as f64).abs() < 200.0,
            "the gauge says {gauge} s"
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    (app, addr)
}

/// Leases a message for `LEASE_SECS`, leaves it unacked, and parks a pop of the same group until
/// the lease ends: how long past the lease's end the redelivery came, and the storage calls the
/// broker made meanwhile.
async fn redelivery_after_lease(app: &Broker, addr: std::net::SocketAddr) -> (Duration, u64) {
    let q = "skewed";
    let configured = request(
        addr,
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": q, "options": {"leaseTime": LEASE_SECS}})),
    )
    .await;
    assert_eq!(configured.status, 200, "{}", configured.json());
    let pushed = request(
        addr,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": q, "payload": {"n": 1}}]})),
    )
    .await;
    assert_eq!(pushed.status, 201);
    let popped = request(
        addr,
        "GET",
        &format!("/api/v1/pop/queue/{q}?consumerGroup=g&wait=false"),
        None,
    )
    .await;
    assert_eq!(popped.status, 200);
    let leased_at = Instant::now();
    let calls_before = app.metrics.storage_calls.get();
    let again = request(
        addr,
        "GET",
        &format!("/api/v1/pop/queue/{q}?consumerGroup=g&wait=true&timeout=20000"),
        None,
    )
    .await;
    assert_eq!(again.status, 200, "the lease's end redelivers");
    let past_lease = leased_at
        .elapsed()
        .saturating_sub(Duration::from_secs(LEASE_SECS));
    (past_lease, app.metrics.storage_calls.get() - calls_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_clock_ahead_of_the_database_does_not_spin_on_a_lease() {
    let (app, addr) = skewed_broker("queen_clock_ahead", 3_000, true).await;
    let (late, calls) = redelivery_after_lease(&app, addr).await;
    assert!(late < BOUND, "redelivered {late:?} after the lease's end");
    assert!(calls < 20, "{calls} storage calls for one lease's end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_clock_behind_the_database_does_not_delay_a_redelivery() {
    let (app, addr) = skewed_broker("queen_clock_behind", -3_000, true).await;
    let (late, calls) = redelivery_after_lease(&app, addr).await;
    assert!(late < BOUND, "redelivered {late:?} after the lease's end");
    assert!(calls < 20, "{calls} storage calls for one lease's end");
}

/// The failures the alignment prevents, on the same broker without it: the checks above can
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_alignment_a_skewed_host_spins_or_comes_late() {
    let (app, addr) = skewed_broker("queen_clock_unaligned_ahead", 3_000, false).await;
    let (_, calls) = redelivery_after_lease(&app, addr).await;
    assert!(calls >= 100, "only {calls} storage calls: no spin to catch");
    let (app, addr) = skewed_broker("queen_clock_unaligned_behind", -3_000, false).await;
    let (late, _) = redelivery_after_lease(&app, addr).await;
    assert!(
        late >= Duration::from_millis(2_500),
        "redelivered {late:?} after the lease's end"
    );
}
