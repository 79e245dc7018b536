//! A consumer group's first contact with a queue of more partitions than PostgreSQL's shared
//! lock table holds. The group's bulk cursor seed took an advisory lock per partition in one
//! transaction; past max_locks_per_transaction x (max_connections + max_prepared_transactions)
//! partitions the pop failed with "out of shared memory", rolled back its election, and every
//! later first contact failed the same way: the queue could not be consumed by a new group at
//! all. The partition count is derived from the server's settings, so the test fails whenever
//! the seed is unbounded again.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::str::FromStr;

use queen_core::claim::SubscriptionIntent;
use queen_core::frames::Frame;
use queen_core::storage::{MessageStorage, PopRequest, PopStorage, PushGroup};
use queen_core::WorkerId;
use queen_storage_pg::{testing, PgConfig, PgStorage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_contact_with_more_partitions_than_the_lock_table() {
    let name = format!("queen_first_contact_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let (admin, conn) = tokio_postgres::Config::from_str(&testing::database_url())
        .expect("url")
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let setting = |name: &'static str| {
        let admin = &admin;
        async move {
            let row = admin.query_one(&format!("SHOW {name}"), &[]).await.unwrap();
            row.get::<_, String>(0).parse::<usize>().unwrap()
        }
    };
    let slots = setting("max_locks_per_transaction").await
        * (setting("max_connections").await + setting("max_prepared_transactions").await);
    // Twice the table: PostgreSQL rounds shared memory up, and a lock may take some of the slack.
    let partitions = slots * 2;
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg,
        pool_size: 4,
    })
    .await
    .expect("pg");
    for chunk in (0..partitions).collect::<Vec<_>>().chunks(2000) {
        let groups = chunk
            .iter()
            .map(|&p| PushGroup {
                queue: "wide".into(),
                partition: format!("p{p}"),
                frames: vec![Frame {
                    producer: None,
                    encrypted: false,
                    message_id: uuid::Uuid::from_u128(p as u128 + 1),
                    transaction_id: format!("t{p}"),
                    trace_id: None,
                    payload: b"{}".to_vec(),
                }],
                blob: None,
            })
            .collect();
        pg.push(groups).await.expect("push");
    }
    for (i, group) in ["billing", "billing", "__QUEUE_MODE__"].iter().enumerate() {
        let req = PopRequest {
            queue: "wide".into(),
            group: group.to_string(),
            worker: WorkerId(uuid::Uuid::from_u128(i as u128 + 1)),
            batch: 10,
            max_partitions: 10,
            auto_ack: true,
            lease_seconds: None,
            intent: SubscriptionIntent::default(),
            skip_window_debounce: true,
        };
        let got = pg
            .pop_wildcard(req)
            .await
            .unwrap_or_else(|e| panic!("pop {i} ({group}) on {partitions} partitions: {e}"));
        assert!(
            got.message_count() > 0,
            "pop {i} ({group}) on {partitions} partitions delivered nothing"
        );
    }
}

/// Every new pool connection runs a push and a first contact in a transaction it rolls back, so
/// a group's first pop does not pay the backend's cold caches. The warm-up swallows its errors
/// (a connection made before migrations cannot be warmed), so this proves the SQL it runs is
/// valid, that the pool's connections run it, and that it leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_are_warmed_and_the_warm_up_leaves_nothing() {
    let name = format!("queen_warm_up_{}", std::process::id());
    let mut cfg = testing::fresh_database_config(&name).await;
    // Function call counts, to see the pool's own connections run the warm-up.
    cfg.options("-c track_functions=pl");
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 4,
    })
    .await
    .expect("pg");
    let (mut client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    testing::warm_up(&mut client)
        .await
        .expect("the warm-up runs on a migrated database");

    // The connection that ran the migrations was made before them; a second one is new.
    let first = pg.pool().get().await.expect("first connection");
    let second = pg.pool().get().await.expect("second connection");
    drop((first, second));
    let calls = |f: &'static str| {
        let client = &client;
        async move {
            // Call counts reach the shared statistics when a backend goes idle: polled, not timed.
            for _ in 0..100 {
                client
                    .batch_execute("SELECT pg_stat_clear_snapshot()")
                    .await
                    .unwrap();
                let n: i64 = client
                    .query_one(
                        "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_user_functions
                          WHERE schemaname = 'queen' AND funcname = $1",
                        &[&f],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if n >= 2 {
                    return n;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            0
        }
    };
    // This test's own warm-up and the pool's second connection's, at least.
    assert!(
        calls("log_pop_wildcard_v1").await >= 2,
        "the pool's new connection was not warmed"
    );

    for (table, filter) in [
        ("queen.queues", "name LIKE '\\_\\_warm-%'"),
        (
            "queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id",
            "q.name LIKE '\\_\\_warm-%'",
        ),
        ("queen.consumer_groups_metadata", "consumer_group = 'warm'"),
        ("queen.log_consumers", "consumer_group = 'warm'"),
        ("queen.log_txids", "transaction_id = 'warm'"),
        ("queen.log_segments", "true"),
    ] {
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table} WHERE {filter}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "the warm-up left rows in {table}");
    }
}
