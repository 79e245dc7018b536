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
    let pg = storage(cfg).await;
    for chunk in (0..partitions).collect::<Vec<_>>().chunks(2000) {
        pg.push(one_message_each("wide", chunk, 0))
            .await
            .expect("push");
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
            conflation: false,
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

/// The seed's rule at its boundary, read from the table: a first contact seeds every cursor of a
/// queue of FIRST_CONTACT_SEED_CAP partitions and only the cursor it claims of a queue of one
/// more; both are then drained, one message per partition, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_contact_seeds_a_small_queue_whole_and_a_larger_one_at_its_claims() {
    let name = format!("queen_seed_rule_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let pg = storage(cfg).await;
    let cap = queen_core::claim::FIRST_CONTACT_SEED_CAP;
    for (queue, partitions, seeded) in [
        ("small", cap as u32, cap as i64),
        ("large", cap as u32 + 1, 1),
    ] {
        let names: Vec<usize> = (0..partitions as usize).collect();
        pg.push(one_message_each(queue, &names, queue.len() * 1000))
            .await
            .expect("push");
        let req = |i: u128| PopRequest {
            queue: queue.into(),
            group: "g".into(),
            worker: WorkerId(uuid::Uuid::from_u128(i)),
            batch: 1,
            max_partitions: 1,
            auto_ack: true,
            lease_seconds: None,
            intent: SubscriptionIntent::default(),
            skip_window_debounce: true,
            conflation: false,
        };
        let first = pg.pop_wildcard(req(1)).await.expect("first contact");
        assert_eq!(
            first.message_count(),
            1,
            "{queue}: the first contact's claim"
        );
        let rows: i64 = client
            .query_one(
                "SELECT count(*) FROM queen.log_consumers c
                   JOIN queen.log_partitions p ON p.id = c.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = $1 AND c.consumer_group = 'g'",
                &[&queue],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, seeded, "{queue}: cursor rows after the first contact");
        let mut delivered = first.message_count();
        for i in 2..(u128::from(partitions) * 4) {
            let got = pg.pop_wildcard(req(i)).await.expect("pop");
            if got.message_count() == 0 {
                break;
            }
            delivered += got.message_count();
        }
        assert_eq!(delivered, partitions, "{queue}: each message once");
    }
    drop(client);
    drop(pg);
    testing::drop_database(&name).await;
}

/// One message in each partition `p{n}` of `queue`, message ids from `id_base + n + 1`.
fn one_message_each(queue: &str, partitions: &[usize], id_base: usize) -> Vec<PushGroup> {
    partitions
        .iter()
        .map(|&p| PushGroup {
            queue: queue.into(),
            partition: format!("p{p}"),
            frames: vec![Frame {
                producer: None,
                encrypted: false,
                message_id: uuid::Uuid::from_u128((id_base + p) as u128 + 1),
                transaction_id: format!("t{p}"),
                trace_id: None,
                payload: b"{}".to_vec(),
            }],
            blob: None,
        })
        .collect()
}

async fn storage(pg: tokio_postgres::Config) -> PgStorage {
    PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg,
        pool_size: 4,
    })
    .await
    .expect("pg")
}
