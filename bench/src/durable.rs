//! Scenario 15: durable PostgreSQL. Every other scenario runs on a PostgreSQL with `fsync`,
//! `synchronous_commit` and `full_page_writes` off; users run with them on, where each commit
//! waits for a WAL flush. This one runs on a second PostgreSQL with durability on
//! (`DURABLE_DATABASE_URL`; `bash .ci/bench` starts one): push at batch 1, 10 and 100 against
//! (a) raw rows, and leased consume at batch 100 and at batch 1 (in queue mode and for a consumer
//! group) against (c) the claim loop, each with the
//! commits per 1,000 messages and the WAL bytes per message it cost, and the steady state's
//! maximum against NOTIFY + claim. The costs are read as the server's
//! transaction-id and WAL-position deltas around the measurement (exact at once, where the
//! cumulative statistics views lag by up to their flush interval).

use std::sync::Arc;

use queen_server::broker::Broker;

use crate::util::{pg_connect, Endpoint, Row};
use crate::{consume, push};

/// The database the scenario makes on the durable server.
const DB: &str = "queen_bench_durable";

/// (transaction ids assigned, WAL bytes written) so far on the server.
async fn mark(c: &tokio_postgres::Client) -> (i64, f64) {
    let r = c
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8",
            &[],
        )
        .await
        .expect("wal mark");
    (r.get(0), r.get(1))
}

/// Commits per 1,000 messages and WAL bytes per message between two marks.
fn costs(before: (i64, f64), after: (i64, f64), messages: f64) -> (f64, f64) {
    let messages = messages.max(1.0);
    (
        (after.0 - before.0) as f64 * 1000.0 / messages,
        (after.1 - before.1) / messages,
    )
}

/// A fresh database on the durable server, migrated, with the raw baselines' schema.
async fn set_up(url: &str) -> (queen_storage_pg::PgStorage, tokio_postgres::Config) {
    let base: tokio_postgres::Config = url.parse().expect("DURABLE_DATABASE_URL");
    let admin = pg_connect(&base).await;
    for statement in [
        format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"),
        format!("CREATE DATABASE {DB}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .expect("durable database");
    }
    let settings = admin
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'),
                    current_setting('full_page_writes')",
            &[],
        )
        .await
        .expect("settings");
    let on: Vec<String> = (0..3).map(|i| settings.get(i)).collect();
    assert!(
        on.iter().all(|s| s == "on"),
        "DURABLE_DATABASE_URL must have fsync, synchronous_commit and full_page_writes on: {on:?}"
    );
    let mut cfg = base.clone();
    cfg.dbname(DB);
    let pg = queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size: 32,
    })
    .await
    .expect("connect and migrate the durable database");
    pg_connect(&cfg)
        .await
        .batch_execute(crate::BASELINE_SCHEMA)
        .await
        .expect("baseline schema");
    (pg, cfg)
}

async fn push_rows(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    marks: &tokio_postgres::Client,
    batch: usize,
    secs: u64,
) -> Vec<Row> {
    let before = mark(marks).await;
    let (rate, _) = push::broker_push(addr, batch, secs, push::PushForm::Json, None).await;
    let broker_costs = costs(before, mark(marks).await, rate * secs as f64);
    let before = mark(marks).await;
    let (raw, _) = push::raw_rows(cfg, batch, secs).await;
    let raw_costs = costs(before, mark(marks).await, raw * secs as f64);
    let scenario = format!(
        "durable push, batch {batch}, {} producers, {} partitions",
        push::PRODUCERS,
        push::PARTITIONS
    );
    vec![
        Row::new(scenario.clone(), "msg/s", rate, "(a) rows", raw),
        Row::new(
            scenario.clone(),
            "commits per 1000 msg",
            broker_costs.0,
            "(a) rows",
            raw_costs.0,
        ),
        Row::new(
            scenario,
            "WAL bytes per msg",
            broker_costs.1,
            "(a) rows",
            raw_costs.1,
        ),
    ]
}

async fn consume_rows(
    app: &Arc<Broker>,
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    marks: &tokio_postgres::Client,
    total: usize,
) -> Vec<Row> {
    let (partitions, consumers) = (10, 4);
    let endpoint = Endpoint::open(addr);
    // The marks hold the drains alone (the fills before them are pushes and inserts).
    let queue = "durable-consume";
    let filled = consume::broker_fill(app, queue, partitions, total).await;
    let before = mark(marks).await;
    let rate = consume::broker_drain(
        &endpoint,
        queue,
        consumers,
        consume::Consume::Leased,
        filled,
    )
    .await;
    let broker_costs = costs(before, mark(marks).await, filled as f64);
    let filled = consume::claim_fill(cfg, partitions, total).await;
    let before = mark(marks).await;
    let claim = consume::claim_drain(cfg, partitions, consumers, filled).await;
    let claim_costs = costs(before, mark(marks).await, filled as f64);
    let scenario = format!(
        "durable consume leased, batch 100, {partitions} partitions, {consumers} consumers"
    );
    vec![
        Row::new(scenario.clone(), "msg/s", rate, "(c) claim loop", claim),
        Row::new(
            scenario.clone(),
            "commits per 1000 msg",
            broker_costs.0,
            "(c) claim loop",
            claim_costs.0,
        ),
        Row::new(
            scenario,
            "WAL bytes per msg",
            broker_costs.1,
            "(c) claim loop",
            claim_costs.1,
        ),
    ]
}

/// The steady state's maximum delivered rate and its latency, against NOTIFY + claim.
async fn steady_rows(
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    secs: u64,
) -> Vec<Row> {
    let broker = crate::live::run(addr, "durable-steady-max", 1, 4, None, secs).await;
    let raw = crate::live::raw_run(cfg, None, secs).await;
    let scenario = "durable steady state, maximum";
    let baseline = "NOTIFY + claim loop";
    let (b, r) = (&broker.groups[0], &raw.groups[0]);
    vec![
        Row::new(
            scenario,
            "delivered msg/s",
            broker.delivered,
            baseline,
            raw.delivered,
        ),
        Row::new(scenario, "p50 ms", b.p50, baseline, r.p50),
        Row::new(scenario, "p99 ms", b.p99, baseline, r.p99),
    ]
}

pub async fn durable_scenario(
    url: &str,
    secs: u64,
    steady_secs: u64,
    consume_total: usize,
    consume_one_total: usize,
) -> Vec<Row> {
    let (pg, cfg) = set_up(url).await;
    let (app, addr) = crate::start_with(&pg, crate::bench_config(), 15).await;
    let marks = pg_connect(&cfg).await;
    let mut rows = vec![];
    for batch in [1, 10, 100] {
        rows.extend(push_rows(addr, &cfg, &marks, batch, secs).await);
        eprintln!("measured durable push, batch {batch}");
    }
    rows.extend(consume_rows(&app, addr, &cfg, &marks, consume_total).await);
    eprintln!("measured durable consume");
    rows.extend(
        consume::consume_one_at_a_time(&app, addr, &cfg, consume_one_total, "durable consume")
            .await,
    );
    rows.extend(steady_rows(addr, &cfg, steady_secs).await);
    eprintln!("measured durable steady state");
    rows
}
