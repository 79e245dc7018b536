//! Timer workers of several brokers fire at once: a due read passes over the timers another
//! broker's firing is removing right now (their rows are locked until it commits), so the
//! brokers take different timers instead of all reading the earliest ones, colliding on them,
//! and rolling back. The collision made timer lateness 60x the raw poller's with five brokers on
//! one database (docs/benchmarks.md).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::time::Duration;

use queen_core::storage::TimerStorage;
use queen_core::timers::TimerOp;
use queen_storage_pg::{testing, PgConfig, PgStorage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_read_skips_the_timers_another_firing_is_removing() {
    let name = format!("queen_timers_skip_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let storage = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 4,
    })
    .await
    .expect("pg");
    let ops: Vec<TimerOp> = (0..6)
        .map(|i| TimerOp::Schedule {
            queue: "due".into(),
            key: format!("t{i}"),
            partition: "Default".into(),
            payload: br#"{"n":1}"#.to_vec(),
            // Due in order t0..t5, all in the past by the time they are read.
            delay_ms: -10_000 + i,
            txn: format!("t{i}"),
            message_id: uuid::Uuid::from_u128(1 + i as u128),
        })
        .collect();
    storage.timers_batch(ops).await.expect("schedule");
    let keys = |due: &[queen_core::timers::DueTimer]| -> Vec<String> {
        due.iter().map(|t| t.key.clone()).collect()
    };
    let all = storage.due_timers(10, &[]).await.expect("due");
    assert_eq!(keys(&all), ["t0", "t1", "t2", "t3", "t4", "t5"]);

    // Another broker's firing: it has deleted the three earliest and not committed yet.
    let (mut other, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let firing = other.transaction().await.expect("begin");
    let removed = firing
        .execute(
            "DELETE FROM queen.timers WHERE timer_key IN ('t0', 't1', 't2')",
            &[],
        )
        .await
        .expect("delete");
    assert_eq!(removed, 3);
    // A plain read sees them still (its snapshot predates the delete): bounded all the same.
    let rest = tokio::time::timeout(Duration::from_secs(10), storage.due_timers(10, &[]))
        .await
        .expect("a due read does not wait for another broker's firing")
        .expect("due");
    assert_eq!(
        keys(&rest),
        ["t3", "t4", "t5"],
        "the firing's timers are skipped"
    );
    let some = storage.due_timers(2, &[]).await.expect("due");
    assert_eq!(keys(&some), ["t3", "t4"], "the limit counts what it takes");

    // Rolled back, the firing's timers are due again (none was lost).
    firing.rollback().await.expect("rollback");
    let again = storage.due_timers(10, &[]).await.expect("due");
    assert_eq!(keys(&again), ["t0", "t1", "t2", "t3", "t4", "t5"]);
    drop(storage);
    testing::drop_database(&name).await;
}
