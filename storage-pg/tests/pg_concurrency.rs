//! Concurrent pops against real PostgreSQL: 16 consumers of one group on one queue with 1,000
//! partitions, mixing the three pop shapes, while a producer keeps pushing and adversarial
//! transactions hold a push's partition lock and cursor rows' locks for 400 ms at a time. The
//! pops' connections run with lock_timeout = 100ms: a pop that waited on any of those
//! transactions fails the test. (A lower timeout also trips on PostgreSQL's microsecond
//! relation-extension locks, which are not waits on another transaction.) Checks: no wait, no
//! deadlock, no duplicate delivery under a live lease, nothing lost.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::storage::{MessageStorage, PopStorage};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_core::claim::SubscriptionIntent;
use queen_core::delivery::claims_to_messages;
use queen_core::frames::Frame;
use queen_core::rng::SeededRng;
use queen_core::storage::{AckItem, AckStatus, PopRequest, PushGroup};
use queen_core::WorkerId;
use queen_storage_pg::{testing, PgConfig, PgStorage};

const PARTITIONS: usize = 1000;
const CONSUMERS: usize = 16;

fn group(p: usize, tag: &str, n: usize) -> PushGroup {
    PushGroup {
        queue: "conc".into(),
        partition: format!("p{p:04}"),
        frames: (0..n)
            .map(|i| Frame {
                producer: None,
                encrypted: false,
                message_id: uuid::Uuid::from_u128((p * 1_000_000 + i) as u128 + 1),
                transaction_id: format!("{tag}-{i}"),
                trace_id: None,
                payload: b"{}".to_vec(),
            })
            .collect(),
        blob: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_consumers_on_a_thousand_partitions_never_wait_or_double_lease() {
    let name = format!("queen_conc_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let (admin, conn) = tokio_postgres::Config::from_str(&testing::database_url())
        .expect("url")
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let writer = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 8,
    })
    .await
    .expect("writer pool");
    let mut pop_cfg = cfg.clone();
    pop_cfg.options("-c lock_timeout=100ms");
    let popper = Arc::new(
        PgStorage::connect(&PgConfig {
            tls: Default::default(),
            pg: pop_cfg,
            pool_size: CONSUMERS,
        })
        .await
        .expect("pop pool"),
    );

    // Backlog: 1,000 partitions x 3 messages, pushed 100 partitions per request.
    for chunk in (0..PARTITIONS).collect::<Vec<_>>().chunks(100) {
        writer
            .push(chunk.iter().map(|p| group(*p, "a", 3)).collect())
            .await
            .expect("push backlog");
    }
    let mut total = PARTITIONS * 3;
    // A producer races the consumers.
    let producer = {
        let writer = writer.clone();
        tokio::spawn(async move {
            let mut rng = SeededRng::new(5);
            for k in 0..200 {
                let p = rng.below(PARTITIONS as u64) as usize;
                writer
                    .push(vec![group(p, &format!("late{k}"), 2)])
                    .await
                    .expect("concurrent push");
            }
        })
    };
    total += 200 * 2;
    // Lock holders: a push that keeps its partition row locked, and a transaction that keeps
    // cursor rows locked FOR UPDATE (as an ack does) and rewrites them (an in-flight update).
    let holders = tokio::spawn(hold_locks(cfg.clone()));

    let delivered: Arc<Mutex<BTreeMap<(String, i64), usize>>> =
        Arc::new(Mutex::new(BTreeMap::new()));
    // The candidates include the holders' fresh partitions (missing ones answer `missing`).
    let names: Arc<Vec<String>> = Arc::new(
        (0..PARTITIONS)
            .map(|p| format!("p{p:04}"))
            .chain((0..12).map(|k| format!("fresh{k}")))
            .collect(),
    );
    let mut consumers = vec![];
    for c in 0..CONSUMERS {
        let popper = popper.clone();
        let writer = writer.clone();
        let delivered = delivered.clone();
        let names = names.clone();
        consumers.push(tokio::spawn(consume(c, popper, writer, delivered, names)));
    }
    producer.await.expect("producer");
    total += holders.await.expect("lock holders");
    for h in consumers {
        h.await.expect("consumer task");
    }
    // Drain what the idle consumers left (pushes that landed after they gave up).
    for _ in 0..200 {
        let req = PopRequest {
            queue: "conc".into(),
            group: "g".into(),
            worker: WorkerId(uuid::Uuid::from_u128(u128::MAX)),
            batch: 10_000,
            max_partitions: 1000,
            auto_ack: true,
            lease_seconds: None,
            intent: SubscriptionIntent::default(),
            skip_window_debounce: true,
            conflation: false,
        };
        let r = writer.pop_wildcard(req).await.expect("drain");
        if r.claims.is_empty() {
            break;
        }
        let mut d = delivered.lock().unwrap();
        for m in claims_to_messages(&r.claims).expect("slice") {
            assert!(
                d.insert((m.partition.clone(), m.offset), usize::MAX)
                    .is_none(),
                "drain redelivered an acked message"
            );
        }
    }
    let (count, per_consumer) = {
        let d = delivered.lock().unwrap();
        (
            d.len(),
            (0..CONSUMERS)
                .map(|c| d.values().filter(|v| **v == c).count())
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(count, total, "every pushed message delivered exactly once");
    eprintln!("deliveries per consumer: {per_consumer:?}");
    assert!(
        per_consumer.iter().filter(|n| **n > 0).count() >= CONSUMERS / 2,
        "work spread over the consumers: {per_consumer:?}"
    );
    let deadlocks: i64 = admin
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = $1",
            &[&name],
        )
        .await
        .expect("stats")
        .get(0);
    assert_eq!(deadlocks, 0, "PostgreSQL detected deadlocks");
}

/// Twelve times: a fresh partition's push held in an open transaction, or an open transaction
/// holding a partition's cursor rows; each released after 400 ms. Returns the messages pushed.
async fn hold_locks(cfg: tokio_postgres::Config) -> usize {
    let (client, conn) = cfg
        .connect(tokio_postgres::NoTls)
        .await
        .expect("holder connect");
    tokio::spawn(conn);
    let mut rng = SeededRng::new(9);
    let mut held = 0;
    for k in 0..12 {
        let p = format!("p{:04}", rng.below(PARTITIONS as u64));
        if k % 2 == 0 {
            // A partition that exists (committed) but has no cursor row yet, then a push
            // that keeps its row locked: pops creating the cursor row (whose foreign-key
            // check share-locks the partition row) must not wait on it.
            let p = format!("fresh{k}");
            for (round, tag) in [(0u128, "a"), (1, "b")] {
                let id = uuid::Uuid::from_u128(1_000_000_000 + u128::from(k as u32) * 2 + round);
                let blob = queen_core::frames::build_blob(&[Frame {
                    producer: None,
                    encrypted: false,
                    message_id: id,
                    transaction_id: format!("held{k}{tag}"),
                    trace_id: None,
                    payload: b"{}".to_vec(),
                }])
                .expect("blob");
                if round == 1 {
                    client.batch_execute("BEGIN").await.expect("begin");
                }
                client
                    .query(
                        "SELECT * FROM queen.push_v6('conc', $1, ARRAY[$2], $3, $4, NULL, false, false)",
                        &[&p, &format!("held{k}{tag}"), &vec![id], &blob],
                    )
                    .await
                    .expect("held push");
            }
            held += 2;
        } else {
            client.batch_execute("BEGIN").await.expect("begin");
            client
                .execute(
                    "UPDATE queen.log_consumers c SET committed = c.committed FROM queen.log_partitions p
                      WHERE p.id = c.partition_id AND p.name = $1 AND c.consumer_group = 'g'",
                    &[&p],
                )
                .await
                .expect("held cursor");
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        client.batch_execute("COMMIT").await.expect("commit");
    }
    held
}

/// One consumer: pops by its route (wildcard, list or one partition), asserts no offset is
/// delivered twice under a live lease, acks; leaves after 40 empty pops in a row.
async fn consume(
    c: usize,
    popper: Arc<PgStorage>,
    writer: PgStorage,
    delivered: Arc<Mutex<BTreeMap<(String, i64), usize>>>,
    names: Arc<Vec<String>>,
) {
    let mut rng = SeededRng::new(100 + c as u64);
    let mut idle = 0;
    let mut seq = 0u128;
    while idle < 40 {
        seq += 1;
        let worker = WorkerId(uuid::Uuid::from_u128(((c as u128) << 64) | seq));
        let req = PopRequest {
            queue: "conc".into(),
            group: "g".into(),
            worker,
            batch: 20,
            max_partitions: 4,
            auto_ack: false,
            lease_seconds: Some(120),
            intent: SubscriptionIntent::default(),
            skip_window_debounce: true,
            conflation: false,
        };
        let result = match c % 3 {
            0 => popper.pop_wildcard(req).await,
            1 => {
                let mut cands: Vec<String> = (0..64)
                    .map(|_| names[rng.below(PARTITIONS as u64) as usize].clone())
                    .collect();
                cands.extend(names[PARTITIONS..].iter().cloned());
                popper.pop_list(req, cands).await
            }
            _ => {
                popper
                    .pop_partition(req, names[rng.below(PARTITIONS as u64) as usize].clone())
                    .await
            }
        };
        let result = result.unwrap_or_else(|e| {
            panic!("consumer {c}: pop failed (a wait, a deadlock or an error): {e}")
        });
        if result.claims.is_empty() {
            idle += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        idle = 0;
        let msgs = claims_to_messages(&result.claims).expect("slice");
        let mut items = vec![];
        {
            let mut d = delivered.lock().unwrap();
            for m in &msgs {
                let prev = d.insert((m.partition.clone(), m.offset), c);
                assert!(
                    prev.is_none(),
                    "({}, {}) delivered to consumer {c} and before to {prev:?} under a live lease",
                    m.partition,
                    m.offset
                );
                items.push(AckItem {
                    transaction_id: m.frame.transaction_id.clone(),
                    partition_id: m.partition_id.clone(),
                    status: AckStatus::Completed,
                    lease_id: Some(worker.to_string()),
                    error: None,
                });
            }
        }
        let out = writer.ack("g", items).await.expect("ack");
        assert!(
            out.iter().all(|o| o.success),
            "consumer {c}: ack refused: {out:?}"
        );
    }
}
