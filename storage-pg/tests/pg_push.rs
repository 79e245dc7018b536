//! Push on real PostgreSQL: de-duplication under concurrent pushes, and offsets in commit order.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::storage::{MessageStorage, PopStorage};
use std::sync::Arc;

use queen_core::frames::Frame;
use queen_core::storage::{PushGroup, PushOutcome};
use queen_storage_pg::testing;

fn one(partition: &str, txid: &str, id: u128) -> PushGroup {
    PushGroup {
        queue: "dedup".into(),
        partition: partition.into(),
        frames: vec![Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(id),
            transaction_id: txid.into(),
            trace_id: None,
            payload: b"{}".to_vec(),
        }],
        blob: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_of_one_transaction_id_store_it_once() {
    let pg =
        Arc::new(testing::fresh_database(&format!("queen_push_{}", std::process::id()), 16).await);
    for round in 0..20u128 {
        let txid = format!("same-{round}");
        let mut tasks = vec![];
        for k in 0..8u128 {
            let pg = pg.clone();
            let txid = txid.clone();
            // Half the rounds race on a partition that does not exist yet.
            let partition = if round % 2 == 0 {
                format!("fresh-{round}")
            } else {
                "p".to_string()
            };
            tasks.push(tokio::spawn(async move {
                pg.push(vec![one(&partition, &txid, round * 100 + k + 1)])
                    .await
                    .expect("push")
            }));
        }
        let mut queued = vec![];
        let mut dups = vec![];
        for t in tasks {
            match t.await.unwrap().remove(0).remove(0) {
                PushOutcome::Queued { message_id, .. } => queued.push(message_id),
                PushOutcome::Duplicate { message_id, .. } => dups.push(message_id),
                PushOutcome::Rejected { full, .. } => panic!("uncapped queue refused: {full}"),
            }
        }
        assert_eq!(
            queued.len(),
            1,
            "round {round}: exactly one push stores the message"
        );
        assert_eq!(dups.len(), 7);
        assert!(
            dups.iter().all(|d| *d == queued[0]),
            "round {round}: duplicates answer the winner's id"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_get_gapless_offsets_in_commit_order() {
    let pg = Arc::new(
        testing::fresh_database(&format!("queen_push_order_{}", std::process::id()), 16).await,
    );
    let mut tasks = vec![];
    for k in 0..16u128 {
        let pg = pg.clone();
        tasks.push(tokio::spawn(async move {
            let mut offsets = vec![];
            for i in 0..20u128 {
                let out = pg
                    .push(vec![one("p", &format!("w{k}-{i}"), k * 1000 + i + 1)])
                    .await
                    .expect("push");
                if let PushOutcome::Queued { offset, .. } = out[0][0] {
                    offsets.push(offset);
                }
            }
            offsets
        }));
    }
    let mut all = vec![];
    for t in tasks {
        let o = t.await.unwrap();
        assert!(
            o.windows(2).all(|w| w[0] < w[1]),
            "one producer's offsets rise"
        );
        all.extend(o);
    }
    all.sort();
    assert_eq!(
        all,
        (0..320).collect::<Vec<i64>>(),
        "offsets are gapless and unique"
    );
}

/// Queen 0.15 ordered by transaction start: a push that began earlier but committed later than
/// another, already consumed, push was skipped forever. Here offsets are allocated under the
/// partition lock: the later push waits, and both are delivered in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_committing_push_is_never_skipped() {
    use queen_core::claim::SubscriptionIntent;
    use queen_core::storage::{AckItem, AckStatus, PopRequest};
    let name = format!("queen_push_commit_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let pg = Arc::new(
        queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
            tls: Default::default(),
            pg: cfg.clone(),
            pool_size: 8,
        })
        .await
        .expect("pg"),
    );
    pg.push(vec![one("p", "setup", 1)])
        .await
        .expect("create the partition");
    let req = |w: u128| PopRequest {
        queue: "dedup".into(),
        group: "g".into(),
        worker: queen_core::WorkerId(uuid::Uuid::from_u128(w)),
        batch: 100,
        max_partitions: 1,
        auto_ack: false,
        lease_seconds: Some(60),
        intent: SubscriptionIntent::default(),
        skip_window_debounce: true,
        conflation: false,
    };
    let first = pg.pop_partition(req(1), "p".into()).await.expect("pop");
    let pid = first.claims[0].partition_id.clone();
    pg.ack(
        "g",
        vec![AckItem {
            transaction_id: "setup".into(),
            partition_id: pid.clone(),
            status: AckStatus::Completed,
            lease_id: None,
            error: None,
        }],
    )
    .await
    .expect("ack");
    // "early" begins first and holds its transaction open.
    let (early, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    early.batch_execute("BEGIN").await.expect("begin");
    let blob = queen_core::frames::build_blob(&[Frame {
        producer: None,
        encrypted: false,
        message_id: uuid::Uuid::from_u128(77),
        transaction_id: "early".into(),
        trace_id: None,
        payload: b"{}".to_vec(),
    }])
    .expect("blob");
    early
        .query(
            "SELECT * FROM queen.push_v6('dedup', 'p', ARRAY['early'], ARRAY[$1::uuid], $2, NULL, false, false)",
            &[&uuid::Uuid::from_u128(77), &blob],
        )
        .await
        .expect("early push");
    // "late" begins after, and must wait for "early" to commit.
    let late = {
        let pg = pg.clone();
        tokio::spawn(async move {
            pg.push(vec![one("p", "late", 78)])
                .await
                .expect("late push")
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !late.is_finished(),
        "the later push waits for the partition lock"
    );
    let r = pg.pop_partition(req(2), "p".into()).await.expect("pop");
    assert!(r.claims.is_empty(), "nothing committed yet");
    early.batch_execute("COMMIT").await.expect("commit");
    late.await.expect("late");
    let r = pg.pop_partition(req(3), "p".into()).await.expect("pop");
    let msgs = queen_core::delivery::claims_to_messages(&r.claims).expect("slice");
    let order: Vec<&str> = msgs
        .iter()
        .map(|m| m.frame.transaction_id.as_str())
        .collect();
    assert_eq!(
        order,
        vec!["early", "late"],
        "both delivered, in commit order"
    );
}

/// The transactionId rows (no foreign key since migration 016) go with what holds them: a push
/// that meets a duplicate or maxSize takes its own rows back, and deleting a queue deletes its
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_id_rows_go_with_what_holds_them() {
    use queen_core::storage::{AdminStorage, QueueConfig};
    let pg = testing::fresh_database(&format!("queen_txrows_{}", std::process::id()), 4).await;
    let rows = |queue: &'static str| {
        let pool = pg.pool().clone();
        async move {
            let c = pool.get().await.unwrap();
            c.query_one(
                "SELECT count(*) FROM queen.log_txids t JOIN queen.log_partitions p ON p.id = t.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1",
                &[&queue],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    let group = |queue: &str, txids: &[&str], first_id: u128| PushGroup {
        queue: queue.into(),
        partition: "p".into(),
        frames: txids
            .iter()
            .enumerate()
            .map(|(k, t)| Frame {
                producer: None,
                encrypted: false,
                message_id: uuid::Uuid::from_u128(first_id + k as u128),
                transaction_id: (*t).into(),
                trace_id: None,
                payload: b"{}".to_vec(),
            })
            .collect(),
        blob: None,
    };
    pg.push(vec![group("rows", &["a", "b"], 1)]).await.unwrap();
    assert_eq!(rows("rows").await, 2);
    // Two duplicates among three: the first call takes its rows back, the second stores "c".
    let out = pg
        .push(vec![group("rows", &["b", "c", "a"], 10)])
        .await
        .unwrap()
        .remove(0);
    assert!(
        matches!(out[0], PushOutcome::Duplicate { message_id, .. } if message_id == uuid::Uuid::from_u128(2))
    );
    assert!(
        matches!(out[1], PushOutcome::Queued { offset: 2, .. }),
        "{out:?}"
    );
    assert!(
        matches!(out[2], PushOutcome::Duplicate { message_id, .. } if message_id == uuid::Uuid::from_u128(1))
    );
    assert_eq!(rows("rows").await, 3);
    // maxSize: a refused push leaves no row behind.
    let mut capped = QueueConfig::with_defaults("capped");
    capped.max_size = 2;
    pg.configure_queue(capped).await.unwrap();
    pg.push(vec![group("capped", &["x", "y"], 20)])
        .await
        .unwrap();
    let out = pg
        .push(vec![group("capped", &["z"], 30)])
        .await
        .unwrap()
        .remove(0);
    assert!(matches!(out[0], PushOutcome::Rejected { .. }), "{out:?}");
    assert_eq!(rows("capped").await, 2);
    // A queue's removal removes its rows (also of a partition made by a multi-partition push,
    // whose transaction met a duplicate, rolled back and ran again answering it).
    let mut other = group("rows", &["d"], 40);
    other.partition = "q".into();
    let out = pg
        .push(vec![group("rows", &["e", "a"], 50), other])
        .await
        .unwrap();
    assert!(
        matches!(out[0][0], PushOutcome::Queued { offset: 3, .. }),
        "{out:?}"
    );
    assert!(
        matches!(out[0][1], PushOutcome::Duplicate { .. }),
        "{out:?}"
    );
    assert!(
        matches!(out[1][0], PushOutcome::Queued { offset: 0, .. }),
        "{out:?}"
    );
    let total = || {
        let pool = pg.pool().clone();
        async move {
            let c = pool.get().await.unwrap();
            c.query_one("SELECT count(*) FROM queen.log_txids", &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    assert_eq!(total().await, 7);
    assert!(pg.delete_queue("rows").await.unwrap());
    assert_eq!(total().await, 2, "only the capped queue's rows are left");
}

/// A round of pushes is one statement, so one transaction and one commit: every segment it
/// stored carries the same `xmin`. (A round that fell back to pushing its requests one by one
/// would answer the same, so the answers alone cannot tell.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_round_commits_once() {
    let name = format!("queen_push_round_{}", std::process::id());
    let pg = testing::fresh_database(&name, 4).await;
    let answers = pg
        .push_round(vec![
            vec![one("r1", "a", 1)],
            vec![one("r2", "b", 2)],
            vec![one("r1", "c", 3), one("r3", "d", 4)],
        ])
        .await;
    assert_eq!(answers.len(), 3);
    for a in &answers {
        let groups = a.as_ref().expect("pushed");
        assert!(groups
            .iter()
            .flatten()
            .all(|o| matches!(o, PushOutcome::Queued { .. })));
    }
    let (client, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT s.xmin::text) FROM queen.log_segments s",
            &[],
        )
        .await
        .expect("segments");
    assert_eq!(row.get::<_, i64>(0), 4, "four segments");
    assert_eq!(row.get::<_, i64>(1), 1, "one transaction stored them all");
    drop(client);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}

/// A round whose partitions all exist is stored by `push_round_v1`, set-based; one with a
/// partition that does not exist yet is left whole to push_v6 per group (the function answers
/// no row and writes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_round_v1_takes_existing_partitions_and_leaves_new_ones() {
    let name = format!("queen_push_round_v1_{}", std::process::id());
    let pg = testing::fresh_database(&name, 4).await;
    pg.push(vec![one("e", "seed", 1)]).await.expect("seed");
    let (client, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let call = "SELECT o_i, o_offset, o_count FROM queen.push_round_v1(
                    ARRAY['dedup', 'dedup'], ARRAY[$1, 'e'], ARRAY['\\x00'::bytea, '\\x00'::bytea],
                    ARRAY[false, false], ARRAY[1, 2], ARRAY[1, 3], ARRAY['t1', 't2', 't3'],
                    ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()])";
    let rows = client
        .query(call, &[&"new"])
        .await
        .expect("a new partition");
    assert!(rows.is_empty(), "a new partition is left to push_v6");
    let partitions: i64 = client
        .query_one("SELECT count(*) FROM queen.log_partitions", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(partitions, 1, "and nothing was written");
    let rows = client.query(call, &[&"e"]).await.expect("existing");
    let got: Vec<(i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![(1, 1, 1), (2, 2, 2)],
        "two groups of one partition chain their offsets after the seed"
    );
    let head: i64 = client
        .query_one(
            "SELECT last_offset FROM queen.log_partitions WHERE name = 'e'",
            &[],
        )
        .await
        .expect("head")
        .get(0);
    assert_eq!(head, 3);
    drop(client);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}

/// Rounds (set-based) and single pushes (push_v6) racing on the same partitions, each request
/// of several partitions: no deadlock, every message stored once, offsets gapless per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_rounds_and_single_pushes_race_without_deadlock_or_gaps() {
    let name = format!("queen_push_round_race_{}", std::process::id());
    let pg = Arc::new(testing::fresh_database(&name, 12).await);
    for p in ["a", "b", "c"] {
        pg.push(vec![one(p, &format!("seed-{p}"), 0)])
            .await
            .expect("seed");
    }
    let mut tasks = vec![];
    for t in 0..6u128 {
        let pg = pg.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25u128 {
                let id = |k: u128| 1_000 + t * 10_000 + i * 10 + k;
                let tx = |k: u128| format!("t{t}-{i}-{k}");
                if t % 2 == 0 {
                    let answers = pg
                        .push_round(vec![
                            vec![one("c", &tx(0), id(0)), one("a", &tx(1), id(1))],
                            vec![one("b", &tx(2), id(2))],
                            vec![one("a", &tx(3), id(3)), one("b", &tx(4), id(4))],
                        ])
                        .await;
                    for a in answers {
                        a.expect("a round's request");
                    }
                } else {
                    pg.push(vec![one("b", &tx(0), id(0)), one("a", &tx(1), id(1))])
                        .await
                        .expect("a single push");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let (client, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT p.name, p.last_offset, count(x.*), min(x.msg_offset), max(x.msg_offset),
                    count(DISTINCT x.msg_offset)
               FROM queen.log_partitions p JOIN queen.log_txids x ON x.partition_id = p.id
              GROUP BY p.name, p.last_offset ORDER BY p.name",
            &[],
        )
        .await
        .expect("partitions");
    // Per partition: the seed, and a's, b's, c's share of 3 rounds x 25 and 3 pushers x 25.
    let expected = [
        ("a", 1 + 75 * 2 + 75),
        ("b", 1 + 75 * 2 + 75),
        ("c", 1 + 75),
    ];
    for (row, (p, n)) in rows.iter().zip(expected) {
        let name: String = row.get(0);
        assert_eq!(name, p);
        let (head, count, lo, hi, distinct): (i64, i64, i64, i64, i64) =
            (row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
        assert_eq!(count, n, "{p}: every message once");
        assert_eq!((lo, hi, distinct), (0, n - 1, n), "{p}: offsets gapless");
        assert_eq!(head, n - 1, "{p}: the head at the last offset");
    }
    drop(client);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}

/// A push finds the floor of its created_at (the partition's newest segment's time) on the
/// partition row it locks, not in log_segments: in the steady state neither push_v6 nor
/// push_round_v1 reads a segment (pg_stat_xact_user_tables, the transaction's own counts). A row
/// whose newest_offset is not its head, as a push of the previous version leaves it during a
/// rolling upgrade (it appends a segment and moves the head, and keeps no newest_*), is read
/// from the segment instead: created_at stays monotone in base_offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_takes_its_time_floor_from_the_partition_row_unless_the_row_is_stale() {
    let name = format!("queen_push_newest_{}", std::process::id());
    let pg = testing::fresh_database(&name, 4).await;
    pg.push(vec![one("n", "t0", 1)]).await.expect("first push");
    let (mut client, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(conn);
    let kept: (i64, bool) = {
        let r = client
            .query_one(
                "SELECT p.newest_offset,
                        p.newest_at = (SELECT max(s.created_at) FROM queen.log_segments s
                                        WHERE s.partition_id = p.id)
                   FROM queen.log_partitions p WHERE p.name = 'n'",
                &[],
            )
            .await
            .expect("row");
        (r.get(0), r.get(1))
    };
    assert_eq!(kept, (0, true), "the row keeps its newest segment's time");
    // The backend's counts not yet flushed, earlier transactions' included: read before and
    // after the call, within its transaction (nothing is flushed inside one).
    let segment_reads = "SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0)
                           FROM pg_stat_xact_user_tables
                          WHERE relid = 'queen.log_segments'::regclass";
    for (what, call) in [
        (
            "push_v6",
            "SELECT count(*) FROM queen.push_v6('dedup', 'n', ARRAY['t1'],
                 ARRAY[gen_random_uuid()], '\\x00'::bytea, NULL, false, true)",
        ),
        (
            "push_round_v1",
            "SELECT count(*) FROM queen.push_round_v1(
                 ARRAY['dedup', 'dedup'], ARRAY['n', 'n'], ARRAY['\\x00'::bytea, '\\x00'::bytea],
                 ARRAY[false, false], ARRAY[1, 2], ARRAY[1, 2], ARRAY['t2', 't3'],
                 ARRAY[gen_random_uuid(), gen_random_uuid()])",
        ),
    ] {
        let tx = client.transaction().await.expect("begin");
        let before: i64 = tx
            .query_one(segment_reads, &[])
            .await
            .expect("counts")
            .get(0);
        let stored: i64 = tx.query_one(call, &[]).await.expect(what).get(0);
        assert!(stored >= 1, "{what} stored nothing");
        let after: i64 = tx
            .query_one(segment_reads, &[])
            .await
            .expect("counts")
            .get(0);
        tx.commit().await.expect("commit");
        let reads = after - before;
        assert_eq!(reads, 0, "{what} read log_segments {reads} times");
    }
    // The previous version's push: a segment an hour ahead, the head moved, newest_* untouched.
    let stale = |hours: i32| {
        format!(
            "INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count,
                                             created_at, blob)
             SELECT p.id, p.last_offset + 1, p.last_offset + 1, 1,
                    now() + make_interval(hours => {hours}), '\\x00'::bytea
               FROM queen.log_partitions p WHERE p.name = 'n';
             UPDATE queen.log_partitions SET last_offset = last_offset + 1 WHERE name = 'n';"
        )
    };
    client.batch_execute(&stale(1)).await.expect("stale row");
    pg.push(vec![one("n", "t4", 5)])
        .await
        .expect("push_v6 on it");
    client.batch_execute(&stale(2)).await.expect("stale again");
    let answers = pg
        .push_round(vec![vec![one("n", "t5", 6)], vec![one("n", "t6", 7)]])
        .await;
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
    let times: Vec<(i64, bool)> = client
        .query(
            "SELECT s.base_offset,
                    s.created_at >= lag(s.created_at) OVER (ORDER BY s.base_offset)
               FROM queen.log_segments s JOIN queen.log_partitions p ON p.id = s.partition_id
              WHERE p.name = 'n' ORDER BY s.base_offset",
            &[],
        )
        .await
        .expect("segments")
        .iter()
        .map(|r| (r.get(0), r.get::<_, Option<bool>>(1).unwrap_or(true)))
        .collect();
    assert_eq!(times.len(), 9, "{times:?}");
    assert!(
        times.iter().all(|(_, monotone)| *monotone),
        "created_at went back after a stale row: {times:?}"
    );
    drop(client);
    let _ = driver.await;
    drop(pg);
    testing::drop_database(&name).await;
}
