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
