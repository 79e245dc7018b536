//! How many PostgreSQL statements one delivered batch costs on each pop shape, counted by
//! pg_stat_statements with track = all (statements inside the procedures included). The figures
//! are printed for the record and bounded so a change that adds work to the pop path fails.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::claim::SubscriptionIntent;
use queen_core::frames::Frame;
use queen_core::storage::{AckItem, AckStatus, PopRequest, PushGroup};
use queen_core::storage::{MessageStorage, PopStorage};
use queen_core::WorkerId;
use queen_storage_pg::{testing, PgConfig, PgStorage};

/// pg_stat_statements_reset() clears every database's counts, so the tests of this file, each on
/// a database of its own, take turns: run at once, one test's reset wiped another's counts.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn req(worker: u128) -> PopRequest {
    PopRequest {
        queue: "stm".into(),
        group: "g".into(),
        worker: WorkerId(uuid::Uuid::from_u128(worker)),
        batch: 10,
        max_partitions: 1,
        auto_ack: false,
        lease_seconds: Some(60),
        intent: SubscriptionIntent::default(),
        skip_window_debounce: true,
        conflation: false,
    }
}

/// A fresh database whose sessions count nested statements too (pg_stat_statements, track =
/// all): the storage on one connection, and a connection apart to read the counts.
async fn counted_database(name: &str) -> (PgStorage, tokio_postgres::Client) {
    let mut cfg = testing::fresh_database_config(name).await;
    cfg.options("-c pg_stat_statements.track=all");
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 1,
    })
    .await
    .expect("pg");
    let (stats, conn) = cfg
        .connect(tokio_postgres::NoTls)
        .await
        .expect("stats connection");
    tokio::spawn(conn);
    stats
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .expect("pg_stat_statements must be available (shared_preload_libraries); the test command's PostgreSQL has it");
    (pg, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_per_delivered_batch() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (pg, stats) = counted_database(&format!("queen_stm_{}", std::process::id())).await;

    let partitions: Vec<String> = (0..60).map(|i| format!("p{i:02}")).collect();
    let groups = partitions
        .iter()
        .map(|p| PushGroup {
            queue: "stm".into(),
            partition: p.clone(),
            frames: (0..10)
                .map(|i| Frame {
                    producer: None,
                    encrypted: false,
                    message_id: uuid::Uuid::from_u128(i + 1),
                    transaction_id: format!("{p}-{i}"),
                    trace_id: None,
                    payload: b"{}".to_vec(),
                })
                .collect(),
            blob: None,
        })
        .collect();
    pg.push(groups).await.expect("push");
    // First contact (bulk seed) outside the measurement; autoAck so no partition stays leased.
    let first = pg
        .pop_wildcard(PopRequest {
            batch: 1,
            auto_ack: true,
            ..req(1)
        })
        .await
        .expect("first contact");
    assert_eq!(first.claims.len(), 1);

    let count = |label: &'static str| {
        let stats = &stats;
        async move {
            let n: i64 = stats
                .query_one(
                    "SELECT COALESCE(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                      WHERE d.datname = current_database() AND s.query NOT ILIKE '%pg_stat_statements%'",
                    &[],
                )
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"))
                .get(0);
            n
        }
    };
    let mut report = vec![];
    let mut next = 2u128;
    for shape in ["specific", "list", "wildcard"] {
        stats
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .expect("reset");
        let before = count(shape).await;
        let mut batches = 0;
        for i in 0..15 {
            next += 1;
            let r = match shape {
                "specific" => pg.pop_partition(req(next), partitions[i].clone()).await,
                "list" => {
                    pg.pop_list(req(next), vec![partitions[20 + i].clone()])
                        .await
                }
                _ => pg.pop_wildcard(req(next)).await,
            }
            .expect("pop");
            assert_eq!(r.claims.len(), 1, "{shape} pop {i} delivered nothing");
            batches += 1;
        }
        let after = count(shape).await;
        // The reset and the two counting queries are excluded by the filter; nothing else runs.
        let per_batch = (after - before) as f64 / f64::from(batches);
        report.push((shape, per_batch));
    }
    // The ack that completes a batch, for the record.
    let frames = (0..10)
        .map(|i| Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(i + 1),
            transaction_id: format!("ackp-{i}"),
            trace_id: None,
            payload: b"{}".to_vec(),
        })
        .collect();
    pg.push(vec![PushGroup {
        queue: "stm".into(),
        partition: "ackp".into(),
        frames,
        blob: None,
    }])
    .await
    .expect("push");
    stats
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .expect("reset");
    let r = pg
        .pop_list(req(999), vec!["ackp".into()])
        .await
        .expect("pop");
    let c = &r.claims[0];
    let before = count("ack").await;
    let items = (0..10)
        .map(|i| AckItem {
            transaction_id: format!("ackp-{i}"),
            partition_id: c.partition_id.clone(),
            status: AckStatus::Completed,
            lease_id: None,
            error: None,
        })
        .collect();
    let out = pg.ack("g", items).await.expect("ack");
    assert!(out.iter().all(|o| o.success));
    let ack_statements = count("ack").await - before;
    for (shape, n) in &report {
        eprintln!("{shape:>9} pop: {n:.1} statements per delivered batch (one round trip)");
    }
    eprintln!("ack of a 10-message batch: {ack_statements} statements (one round trip)");
    for (shape, n) in report {
        assert!(n <= 16.0, "{shape} pop costs {n:.1} statements per batch");
    }
}

/// A pop of a partition with a deep backlog reads the segments it delivers, not the backlog: the
/// forward scan's buffer reads (pg_stat_statements, track = all) stay a handful at 3,000
/// segments. PL/pgSQL plans a loop's query for all of its rows, which without the scan's LIMIT
/// was a read of the whole backlog and a sort (docs/benchmarks.md, "Scale, sixth look").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_reads_the_segments_it_delivers_not_the_backlog() {
    let _turn = ONE_AT_A_TIME.lock().await;
    use queen_core::storage::{AdminStorage, QueueConfig};
    let name = format!("queen_deep_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    let queue_id: uuid::Uuid = pg
        .configure_queue(QueueConfig::with_defaults("deep"))
        .await
        .expect("configure")
        .queue_id
        .parse()
        .expect("queue id");
    let blob = queen_core::frames::build_blob(&[Frame {
        producer: None,
        encrypted: false,
        message_id: uuid::Uuid::from_u128(1),
        transaction_id: "t".into(),
        trace_id: None,
        payload: b"{}".to_vec(),
    }])
    .expect("blob");
    const SEGMENTS: i64 = 3000;
    stats
        .execute(
            "INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
             VALUES (gen_random_uuid(), $1, 'p', $2, now())",
            &[&queue_id, &(SEGMENTS - 1)],
        )
        .await
        .expect("partition");
    stats
        .execute(
            "INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
             SELECT p.id, k, k, 1, now(), $2 FROM queen.log_partitions p, generate_series(0::bigint, $3::bigint - 1) k
              WHERE p.queue_id = $1",
            &[&queue_id, &blob, &SEGMENTS],
        )
        .await
        .expect("segments");
    stats
        .batch_execute("ANALYZE queen.log_segments; SELECT pg_stat_statements_reset()")
        .await
        .expect("analyze");
    let r = pg
        .pop_partition(
            PopRequest {
                queue: "deep".into(),
                auto_ack: true,
                ..req(1)
            },
            "p".into(),
        )
        .await
        .expect("pop");
    assert_eq!(r.claims.len(), 1);
    let blocks: i64 = stats
        .query_one(
            "SELECT COALESCE(sum(shared_blks_hit + shared_blks_read), 0)::bigint FROM pg_stat_statements
              WHERE query LIKE '%FROM queen.log_segments s%base_offset > v_wanted%'",
            &[],
        )
        .await
        .expect("stats")
        .get(0);
    eprintln!("the forward scan of a batch of 10 read {blocks} buffers at {SEGMENTS} segments");
    assert!(
        blocks > 0 && blocks < 30,
        "the forward scan read {blocks} buffers for 10 messages"
    );
    drop(pg);
    drop(stats);
    testing::drop_database(&name).await;
}

/// A pop's cursor probe stays a point lookup when its plan is made while log_consumers is a page:
/// log_pop_v2 runs with enable_seqscan off, and the generic plan of a (partition, group) lookup
/// on a table analyzed empty then holding a few rows steps on both columns. The plan a session
/// caches there is kept while the table grows; it was a sequential scan, or a scan of the group
/// index (then on consumer_group alone) that read every cursor of the group: 2.1 ms a pop
/// against 0.3 in queen-bench's scaling rows (docs/benchmarks.md, "Scale, eighth look").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_probe_planned_on_a_tiny_table_steps_on_both_key_columns() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_tiny_plan_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    let config: Vec<String> = stats
        .query_one(
            "SELECT COALESCE(proconfig, '{}') FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'queen' AND p.proname = 'log_pop_v2'",
            &[],
        )
        .await
        .expect("log_pop_v2")
        .get(0);
    assert!(
        config.iter().any(|c| c == "enable_seqscan=off"),
        "log_pop_v2's settings: {config:?}"
    );
    pg.push(
        (0..3)
            .map(|p| PushGroup {
                queue: "stm".into(),
                partition: format!("p{p}"),
                frames: vec![Frame {
                    producer: None,
                    encrypted: false,
                    message_id: uuid::Uuid::from_u128(p + 1),
                    transaction_id: format!("t{p}"),
                    trace_id: None,
                    payload: b"{}".to_vec(),
                }],
                blob: None,
            })
            .collect(),
    )
    .await
    .expect("push");
    // VACUUM apart: it refuses the implicit transaction of a multi-statement query.
    stats
        .batch_execute("VACUUM ANALYZE queen.log_consumers")
        .await
        .expect("analyze while empty");
    stats
        .batch_execute(
            "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
             SELECT p.id, 'g', -1 FROM queen.log_partitions p;
             SET plan_cache_mode = force_generic_plan;
             SET enable_seqscan = off;
             PREPARE probe(uuid, text) AS
                 SELECT c.committed FROM queen.log_consumers c
                  WHERE c.partition_id = $1 AND c.consumer_group = $2
                    FOR UPDATE SKIP LOCKED",
        )
        .await
        .expect("set-up");
    let plan: Vec<String> = stats
        .query("EXPLAIN EXECUTE probe(gen_random_uuid(), 'g')", &[])
        .await
        .expect("explain")
        .iter()
        .map(|r| r.get(0))
        .collect();
    eprintln!("the probe's generic plan:\n{}", plan.join("\n"));
    assert!(
        plan.iter().any(|l| l.contains("Index Cond")
            && l.contains("partition_id")
            && l.contains("consumer_group")),
        "the probe's generic plan does not step on both key columns:\n{}",
        plan.join("\n")
    );
    drop(pg);
    drop(stats);
    testing::drop_database(&name).await;
}

/// A whole-batch ack and a lease renewal stay key steps on a session that planned them while
/// log_consumers was empty. Sessions keep a plan until the next ANALYZE; planned on an empty
/// table, the set-based batch ack was a hash join over a sequential scan of every cursor row
/// (43 ms a call at 200k cursors) and the renewal a sequential scan (17 ms). Counted in buffers
/// (pg_stat_statements, nested statements), not in time: after the table grew to 20,000 cursor
/// rows (about 200 pages), each statement reads a handful of pages a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_and_renewals_planned_on_an_empty_table_stay_key_steps() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_tiny_ack_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    let configs: Vec<(String, Vec<String>)> = stats
        .query(
            "SELECT p.proname::text, COALESCE(p.proconfig, '{}') FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'queen'
                AND p.proname IN ('ack_batch_ends_v2', 'renew_lease_v1', 'log_pop_v2')",
            &[],
        )
        .await
        .expect("settings")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(configs.len(), 3, "{configs:?}");
    for (name, config) in &configs {
        for setting in ["enable_seqscan=off", "jit=off"] {
            assert!(config.iter().any(|c| c == setting), "{name}: {config:?}");
        }
    }
    stats
        .batch_execute(
            "INSERT INTO queen.queues (name) VALUES ('tiny');
             INSERT INTO queen.log_partitions (id, queue_id, name, last_write_at)
             SELECT gen_random_uuid(), q.id, 'p' || g, now()
               FROM queen.queues q, generate_series(1, 20000) g WHERE q.name = 'tiny';",
        )
        .await
        .expect("partitions");
    analyze_empty_and_hold(&stats, "log_consumers").await;
    let calls = "SELECT count(*) FROM queen.ack_batch_ends_v2(
                     ARRAY['g'], ARRAY[gen_random_uuid()],
                     ARRAY[(SELECT id FROM queen.log_partitions ORDER BY id LIMIT 1)],
                     ARRAY[5::bigint], ARRAY['t']);
                 SELECT count(*) FROM queen.renew_lease_v1(gen_random_uuid()::text, 30);";
    // Past the plan cache's five custom plans: the session now holds generic ones.
    for _ in 0..8 {
        stats
            .batch_execute(calls)
            .await
            .expect("calls on the empty table");
    }
    stats
        .batch_execute(
            "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
             SELECT p.id, 'g', -1 FROM queen.log_partitions p;
             SELECT pg_stat_statements_reset();",
        )
        .await
        .expect("grow the table");
    for _ in 0..10 {
        stats
            .batch_execute(calls)
            .await
            .expect("calls on the grown table");
    }
    for (what, statement) in [
        (
            "batch ack",
            "%UPDATE queen.log_consumers lc%batch_end = NULL%",
        ),
        ("renewal", "%UPDATE queen.log_consumers c%GREATEST%"),
    ] {
        let per_call = pages_per_call(&stats, statement).await;
        eprintln!("{what}: {per_call:.1} pages a call");
        assert!(
            per_call <= 16.0,
            "the {what} reads {per_call:.1} pages a call on 20,000 cursor rows"
        );
    }
    drop(pg);
    drop(stats);
    testing::drop_database(&name).await;
}

/// A table that outgrew its statistics is analyzed by the broker's statistics pass, which ends
/// the plans sessions made while it was tiny. Sessions keep a plan until the next ANALYZE: a
/// push's write of its partition's head, by id, planned while log_partitions was analyzed empty
/// is a sequential scan of every partition once the table grew (21.8 ms a push at 200k
/// partitions, psql). Counted in pages (pg_stat_statements, nested statements): the same
/// session's pushes read hundreds of pages a call before the pass (the hazard, shown present)
/// and a handful after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_outgrowing_its_statistics_is_analyzed_and_its_plans_remade() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_outgrown_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    analyze_empty_and_hold(&stats, "log_partitions").await;
    let push = "SELECT count(*) FROM queen.push_v6('tiny', 'first', ARRAY[gen_random_uuid()::text],
                    ARRAY[gen_random_uuid()], '\\x00'::bytea, NULL, false, true)";
    // Past the plan cache's five custom plans: the session now holds generic ones.
    for _ in 0..8 {
        stats
            .batch_execute(push)
            .await
            .expect("pushes on the empty table");
    }
    stats
        .batch_execute(
            "INSERT INTO queen.log_partitions (id, queue_id, name, last_write_at)
             SELECT gen_random_uuid(), q.id, 'p' || g, now()
               FROM queen.queues q, generate_series(1, 20000) g WHERE q.name = 'tiny'",
        )
        .await
        .expect("grow the table");
    let pages_per_write = || async {
        stats
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .expect("reset");
        for _ in 0..5 {
            stats.batch_execute(push).await.expect("push");
        }
        pages_per_call(
            &stats,
            "UPDATE queen.log_partitions p%SET last_offset = v_last + v_n%",
        )
        .await
    };
    let before = pages_per_write().await;
    eprintln!("partition head write before the pass: {before:.1} pages a call");
    assert!(
        before > 100.0,
        "the stale plan should read every partition: {before:.1} pages a call"
    );
    let pass = queen_storage_pg::statistics_pass(&pg)
        .await
        .expect("statistics pass");
    assert!(
        pass.analyzed.iter().any(|t| t == "log_partitions"),
        "{pass:?}"
    );
    let after = pages_per_write().await;
    eprintln!("partition head write after the pass: {after:.1} pages a call");
    assert!(after <= 16.0, "{after:.1} pages a call after the pass");
    let again = queen_storage_pg::statistics_pass(&pg)
        .await
        .expect("second pass");
    assert!(again.analyzed.is_empty(), "nothing grew since: {again:?}");
    drop(pg);
    drop(stats);
    testing::drop_database(&name).await;
}

/// Analyzes a queen table while it is empty and keeps autovacuum off it, so the plans sessions
/// make now stay until the test's own ANALYZE (autovacuum's would re-plan them too).
async fn analyze_empty_and_hold(stats: &tokio_postgres::Client, table: &str) {
    // VACUUM apart: it refuses the implicit transaction of a multi-statement query.
    stats
        .batch_execute(&format!("VACUUM ANALYZE queen.{table}"))
        .await
        .expect("analyze while empty");
    stats
        .batch_execute(&format!(
            "ALTER TABLE queen.{table} SET (autovacuum_enabled = false)"
        ))
        .await
        .expect("no autovacuum");
}

/// Pages (buffers hit or read) a call of the nested statement whose text matches `pattern`
/// (LIKE), since the last pg_stat_statements_reset, in the current database.
async fn pages_per_call(stats: &tokio_postgres::Client, pattern: &str) -> f64 {
    let row = stats
        .query_one(
            "SELECT sum(shared_blks_hit + shared_blks_read)::float8 / sum(calls)
               FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query LIKE $1",
            &[&pattern],
        )
        .await
        .expect("counts");
    row.get::<_, Option<f64>>(0)
        .unwrap_or_else(|| panic!("no statement like {pattern} was counted"))
}

/// A retention batch reads the prefixes it removes, not the history of every queue: on a database
/// whose other queues hold many old segments, the removal's plan walked (created_at, ...) from the
/// start up to the cutoff for each partition of the batch, every old segment of every partition,
/// while it held the batch's partition locks and the queue's pushes waited behind them (34 ms a
/// partition beside a million old segments; docs/benchmarks.md, "Retention beside other queues'
/// history"). Here 375 buffers against 3,705 before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_batch_reads_its_prefixes_not_other_queues_history() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_ret_history_{}", std::process::id());
    let (_pg, stats) = counted_database(&name).await;
    stats
        .batch_execute(
            "INSERT INTO queen.queues (name) VALUES ('history');
             INSERT INTO queen.queues (name, retention_enabled, completed_retention_seconds)
                  VALUES ('ret', true, 1);
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
                  SELECT gen_random_uuid(), q.id, 'h' || g, 19999, now()
                    FROM queen.queues q, generate_series(1, 2) g WHERE q.name = 'history';
             INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count,
                                             created_at, blob)
                  SELECT p.id, k, k, 1, now() - interval '1 hour', '\\x00'::bytea
                    FROM queen.log_partitions p, generate_series(0, 19999) k
                   WHERE p.name LIKE 'h%';
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at,
                                               oldest_at)
                  SELECT gen_random_uuid(), q.id, 'r' || g, 0, now() - interval '1 minute',
                         now() - interval '1 minute'
                    FROM queen.queues q, generate_series(1, 10) g WHERE q.name = 'ret';
             INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count,
                                             created_at, blob)
                  SELECT p.id, 0, 0, 1, now() - interval '1 minute', '\\x00'::bytea
                    FROM queen.log_partitions p WHERE p.name LIKE 'r%';
             INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
                  SELECT p.id, 'g', 0 FROM queen.log_partitions p WHERE p.name LIKE 'r%';
             INSERT INTO queen.consumer_groups_metadata (queue_name, consumer_group)
                  VALUES ('ret', 'g');
             ANALYZE queen.log_partitions; ANALYZE queen.log_segments;
             SELECT pg_stat_statements_reset();",
        )
        .await
        .expect("a queue with history and one with a consumed segment per partition");
    let removed: i64 = stats
        .query_one(
            "SELECT o_segments FROM queen.retention_batch_v1('ret', false, NULL, NULL, 500)",
            &[],
        )
        .await
        .expect("retention batch")
        .get(0);
    assert_eq!(removed, 10, "each partition's consumed segment goes");
    let pages = pages_per_call(&stats, "WITH part AS%").await;
    eprintln!("a retention batch of 10 partitions read {pages} buffers beside 40,000 old segments");
    assert!(
        pages < 1000.0,
        "a retention batch of 10 partitions read {pages} buffers: it walked other queues' history"
    );
    drop(stats);
    testing::drop_database(&name).await;
}

/// Buffers read by every statement of this database since the counts were reset.
async fn buffers_since_reset(stats: &tokio_postgres::Client) -> f64 {
    stats
        .query_one(
            "SELECT COALESCE(sum(shared_blks_hit + shared_blks_read), 0)::float8
               FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .expect("counts")
        .get(0)
}

/// The admin reads of a small queue read the small queue, beside one of 200,000 partitions:
/// the queue's groups were a sub-select of the listing whose one plan (for every queue) joined
/// every cursor with every partition, and the whole-queue read of a kept generic plan scanned
/// every partition; a two-partition queue's page took 246 ms beside a million
/// (docs/operations.md, "Admin API").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_queue_s_admin_reads_do_not_read_a_big_queue() {
    use queen_core::storage::{InspectStorage, QueueFilter};
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_small_beside_big_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    stats
        .batch_execute(
            "INSERT INTO queen.queues (name) VALUES ('big'), ('small');
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
                  SELECT gen_random_uuid(), q.id, q.name || g, 0, now()
                    FROM queen.queues q, generate_series(1, 200000) g
                   WHERE q.name = 'big' OR g <= 2;
             INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
                  SELECT p.id, 'g', 0 FROM queen.log_partitions p;
             ANALYZE queen.log_partitions; ANALYZE queen.log_consumers;",
        )
        .await
        .expect("a queue of 200,000 partitions and one of 2, a cursor on each");
    // The first reads prepare and warm up; the counted ones follow.
    for counted in [false, true] {
        if counted {
            stats
                .batch_execute("SELECT pg_stat_statements_reset()")
                .await
                .expect("reset");
        }
        let filter = QueueFilter {
            queue: Some("small".into()),
            ..QueueFilter::default()
        };
        let views = pg.queue_views(filter).await.expect("queue views");
        assert_eq!(views.len(), 1, "the small queue");
        assert_eq!(views[0].groups, vec!["g".to_string()], "its group");
        let seen = pg
            .each_partition_of("small", &mut |_| {})
            .await
            .expect("the small queue's partitions");
        assert_eq!(seen, 2, "its partitions");
    }
    let buffers = buffers_since_reset(&stats).await;
    eprintln!("a two-partition queue's view and partitions read {buffers} buffers beside 200,000");
    assert!(
        buffers < 500.0,
        "a two-partition queue's view and partitions read {buffers} buffers: they read the big queue"
    );
    drop(stats);
    testing::drop_database(&name).await;
}

/// With many queues, `queue_views` reads every queue's groups in one statement, and many small
/// queues' partitions are read in one (`each_partition_of_queues`): each answers what the reads
/// of one queue answer (groups from cursors and from subscription records, in name order; a
/// queue with none; a queue of more than 1,000 partitions read alone), in a few statements
/// however many queues there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queues_are_read_together_as_each_alone() {
    use queen_core::storage::{InspectStorage, QueueFilter};
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_many_queues_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    stats
        .batch_execute(
            "INSERT INTO queen.queues (name) SELECT 'q' || n FROM generate_series(1, 120) n;
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
                  SELECT gen_random_uuid(), q.id, 'p' || g, g, now()
                    FROM queen.queues q, generate_series(1, 3) g;
             INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
                  SELECT p.id, CASE WHEN p.name = 'p1' THEN 'zeta' ELSE 'alpha' END, 0
                    FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
                   WHERE q.name <> 'q7';
             INSERT INTO queen.consumer_groups_metadata (queue_name, consumer_group)
                  VALUES ('q7', 'subscribed'), ('q8', 'mid'), ('gone', 'x');
             INSERT INTO queen.queues (name) VALUES ('large');
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
                  SELECT gen_random_uuid(), q.id, 'p' || g, g, now()
                    FROM queen.queues q, generate_series(1, 1200) g WHERE q.name = 'large';",
        )
        .await
        .expect("120 queues of 3 partitions, and one of 1,200 (read alone)");
    stats
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .expect("reset");
    let all = pg
        .queue_views(QueueFilter::default())
        .await
        .expect("queue views");
    assert_eq!(all.len(), 121);
    let names: Vec<String> = all.iter().map(|v| v.config.name.clone()).collect();
    let mut together: Vec<(usize, String, i64, usize)> = vec![];
    let counts = pg
        .each_partition_of_queues(&names, &mut |at, p| {
            together.push((at, p.partition, p.last_offset, p.cursors.len()))
        })
        .await
        .expect("the queues' partitions");
    let statements: i64 = stats
        .query_one(
            "SELECT sum(calls)::bigint FROM pg_stat_statements
              WHERE query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .expect("statements")
        .get(0);
    assert!(
        statements < 20,
        "121 queues' views and partitions took {statements} statements"
    );
    together.sort();
    for (at, view) in all.iter().enumerate() {
        let alone = pg
            .queue_views(QueueFilter {
                queue: Some(view.config.name.clone()),
                ..QueueFilter::default()
            })
            .await
            .expect("one queue's view");
        assert_eq!(
            alone[0].groups, view.groups,
            "{}'s groups",
            view.config.name
        );
        let mut of_queue = vec![];
        pg.each_partition_of(&view.config.name, &mut |p| {
            of_queue.push((at, p.partition, p.last_offset, p.cursors.len()))
        })
        .await
        .expect("one queue's partitions");
        of_queue.sort();
        let read_together: Vec<_> = together.iter().filter(|t| t.0 == at).cloned().collect();
        assert_eq!(
            counts[at],
            of_queue.len() as u64,
            "{}'s count",
            view.config.name
        );
        assert_eq!(read_together, of_queue, "{}'s partitions", view.config.name);
    }
    let groups_of = |q: &str| -> Vec<String> {
        all.iter()
            .find(|v| v.config.name == q)
            .map(|v| v.groups.clone())
            .unwrap_or_default()
    };
    assert_eq!(groups_of("q1"), vec!["alpha", "zeta"]);
    assert_eq!(groups_of("q7"), vec!["subscribed"]);
    assert_eq!(groups_of("q8"), vec!["alpha", "mid", "zeta"]);
    assert_eq!(
        counts.iter().filter(|&&n| n == 1200).count(),
        1,
        "the large queue"
    );
    drop(stats);
    testing::drop_database(&name).await;
}

/// The admin pass reads by pages of `ADMIN_PASS_PAGE` partitions, each a statement in a
/// transaction of its own: a statement holds its snapshot, and with it PostgreSQL's cleanup of
/// every row updated since, for as long as it runs (one statement per queue held it 11 s at a
/// million partitions). A queue of 2.5 pages takes three statements and small queues of 1.5
/// pages two, and every partition is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_pass_reads_by_pages_of_short_statements() {
    use queen_core::storage::InspectStorage;
    use queen_storage_pg::ADMIN_PASS_PAGE;
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = format!("queen_pass_pages_{}", std::process::id());
    let (pg, stats) = counted_database(&name).await;
    let (large, small_queues, small) = (ADMIN_PASS_PAGE * 5 / 2, 15, ADMIN_PASS_PAGE / 10);
    stats
        .execute(
            "WITH q AS (INSERT INTO queen.queues (name)
                        SELECT 'small' || n FROM generate_series(1, $2::int) n
                        UNION ALL SELECT 'large' RETURNING id, name)
             INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
                  SELECT gen_random_uuid(), q.id, 'p' || g, g, now()
                    FROM q, generate_series(1, $1::bigint) g
                   WHERE q.name = 'large' OR g <= $3::bigint",
            &[&large, &small_queues, &small],
        )
        .await
        .expect("a queue of 2.5 pages and 15 of a tenth of a page");
    stats
        .batch_execute(
            "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
                  SELECT p.id, 'g', 0 FROM queen.log_partitions p;
             ANALYZE queen.log_partitions; ANALYZE queen.log_consumers;
             SELECT pg_stat_statements_reset();",
        )
        .await
        .expect("a cursor on each");
    let mut names = std::collections::BTreeMap::new();
    let seen = pg
        .each_partition_of("large", &mut |p| {
            assert_eq!(p.cursors.len(), 1, "{}'s cursor", p.partition);
            *names.entry(p.partition).or_insert(0) += 1;
        })
        .await
        .expect("the large queue");
    assert_eq!(seen, large as u64, "partitions counted");
    assert_eq!(names.len() as i64, large, "partitions read");
    assert!(names.values().all(|&n| n == 1), "each read once");
    let page_statements = |like: &'static str| {
        let stats = &stats;
        async move {
            let r = stats
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint
                       FROM pg_stat_statements WHERE query LIKE $1",
                    &[&like],
                )
                .await
                .expect("statement counts");
            (r.get::<_, i64>(0), r.get::<_, i64>(1))
        }
    };
    assert_eq!(
        page_statements("%WHERE p.queue_id = $1 AND%LIMIT%").await,
        (3, large),
        "the large queue's statements and rows"
    );
    let queues: Vec<String> = (1..=small_queues).map(|n| format!("small{n}")).collect();
    let counts = pg
        .each_partition_of_queues(&queues, &mut |_, p| {
            assert_eq!(p.cursors.len(), 1, "{}'s cursor", p.partition)
        })
        .await
        .expect("the small queues");
    assert_eq!(counts, vec![small as u64; small_queues as usize]);
    assert_eq!(
        page_statements("%WHERE p.queue_id = ANY($1)%").await,
        (2, small * i64::from(small_queues)),
        "the small queues' statements and rows"
    );
    drop(stats);
    testing::drop_database(&name).await;
}
