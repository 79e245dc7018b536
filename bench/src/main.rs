//! queen-bench: the broker over real HTTP against raw PostgreSQL baselines, in the same run, on
//! the same database, with the same payloads and concurrency. One table per run (markdown), and
//! the same figures as JSON.
//!
//! 1. push throughput vs (a) a row per message and (b) a segment per batch;
//! 2. consume throughput (leased and autoAck) vs (c) a raw claim loop;
//! 3. steady state: push-to-delivery latency at the maximum and at 10% of it, vs NOTIFY + claim;
//! 4. parked long-polls: statements/s, CPU, RSS, wake latency, hot-list on and off;
//! 5. partition scaling of the wildcard pop;
//! 6. fan-out to 1, 5, 10 and 50 consumer groups (50 only in the full run);
//! 7. wake latency per deliverability event, on one broker and across two;
//! 8. the serving limiter: the adaptive limit against a fixed one under the consume loads;
//! 9. retention: storage and p99 over a soak with completed retention, and the cost of one pass;
//! 10. PostgreSQL restarted under load: throughput during and after, time to recover;
//! 11. push and consume with JWT auth on, against auth off;
//! 12. many concurrent consumers (1,000 on 1,000 partitions) against 16, with the serving
//!     limiter's limit traced over time (also over the fan-out runs; the traces go to the JSON);
//! 13. the coordination surfaces (KV, locks, timers) against raw statements;
//! 14. reads by offset: a 1M-message partition read from offset 0 against a raw segment scan;
//! 15. durable PostgreSQL (`DURABLE_DATABASE_URL`): push and leased consume against raw, with
//!     commits per 1,000 messages and WAL bytes per message;
//! 16. stream cycles (see `streams.rs`);
//! 17. ephemeral queues against durable ones on the same broker: push, pop+ack, push-to-delivery
//!     latency, and the memory of queued messages; push and pop+ack through a broker that
//!     forwards to the queue's owner against the same through the owner.
//!
//! Usage: `queen-bench --help` (or `bash .ci/bench [--quick]`, which starts PostgreSQL itself);
//! `queen-bench report` turns a run's JSON into docs/benchmarks.md's table.

#![allow(clippy::expect_used)] // a benchmark that cannot set up has nothing to report

mod admin;
mod args;
mod auth;
mod consume;
mod consumers;
mod coordination;
mod durable;
mod ephemeral;
mod in_process;
mod limiter;
mod live;
mod parked;
mod push;
mod reads;
mod report;
mod restart;
mod retention;
mod scaling;
mod scenarios;
mod streams;
mod util;
mod wake;

use std::sync::Arc;

use clap::Parser;
use queen_server::broker::Broker;
use serde_json::json;
use util::Row;

use args::{Args, Command, RunArgs, Scenario};
pub(crate) use in_process::{bench_config, start_peer, start_with};
use in_process::{broker_runtime, start_app};
use scenarios::{
    measure_consume, measure_fan_out, measure_parked, measure_push, measure_scaling,
    measure_steady, measure_wake,
};

struct Plan {
    quick: bool,
    secs: u64,
    consume_total: usize,
    /// Messages each one-at-a-time consume run drains (scenario 2, batch 1).
    consume_one_total: usize,
    steady_secs: u64,
    parked: [usize; 2],
    parked_secs: u64,
    sizes: &'static [usize],
    soak_secs: u64,
    retention_sizes: [usize; 2],
    fan_out_groups: &'static [usize],
    /// The many-consumer count of scenario 12.
    many_consumers: usize,
    /// Timers due within one second in scenario 13.
    due_timers: usize,
    /// Messages in the partition scenario 14 reads by offset.
    fetch_messages: u64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            // Smaller counts and windows, every row still printed: a smoke run under 2 minutes.
            Plan {
                quick,
                secs: 1,
                consume_total: 10_000,
                consume_one_total: 2_000,
                steady_secs: 2,
                parked: [500, 2_000],
                parked_secs: 2,
                sizes: &[100, 1_000, 10_000],
                soak_secs: 8,
                retention_sizes: [1_000, 10_000],
                fan_out_groups: &[1, 5, 10],
                many_consumers: 200,
                due_timers: 2_000,
                fetch_messages: 50_000,
            }
        } else {
            Plan {
                quick,
                secs: 10,
                // 300k: at 10 partitions the claim loop drains 100k in under a second, a window
                // too short to compare (its rate varied 118k-163k msg/s run to run).
                consume_total: 300_000,
                // About 15 s of pop-and-ack per broker run at the rates of one message a call.
                consume_one_total: 15_000,
                steady_secs: 30,
                parked: [1_000, 10_000],
                parked_secs: 30,
                sizes: &[100, 10_000, 100_000, 1_000_000],
                soak_secs: 240,
                retention_sizes: [10_000, 100_000],
                fan_out_groups: &[1, 5, 10, 50],
                many_consumers: 1_000,
                due_timers: 10_000,
                fetch_messages: 1_000_000,
            }
        }
    }
}

// The allocator of the `queen` binary (server/Cargo.toml says why), counting live bytes.
#[global_allocator]
static ALLOCATOR: stats_alloc::StatsAlloc<mimalloc::MiMalloc> =
    stats_alloc::StatsAlloc::new(mimalloc::MiMalloc);

/// What every scenario of one run shares: the plan, the database (broker pool, raw
/// connection settings), the main in-process broker, and the rows measured so far.
struct Run {
    args: RunArgs,
    plan: Plan,
    pg: queen_storage_pg::PgStorage,
    cfg: tokio_postgres::Config,
    db_url: String,
    app: Arc<Broker>,
    addr: std::net::SocketAddr,
    rows: Vec<Row>,
    /// The serving limiter's limit over time under the scale loads (JSON only: [ms, limit, in
    /// flight, idle %] per sample).
    limiter_series: Vec<serde_json::Value>,
    /// The steady state's calm offered rate and its p99 (the fan-out rows compare with them).
    offered: f64,
    calm_p99: f64,
    /// The commit measured, read when the run starts (the work tree may move on meanwhile).
    commit: String,
}

/// The bench's database name.
const DB_NAME: &str = "queen_bench";

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    match args.command {
        Some(Command::Report(r)) => {
            if let Err(e) = report::write(&r) {
                eprintln!("queen-bench report: {e}");
                std::process::exit(1);
            }
        }
        None => measure(args.run).await,
    }
}

/// One run: set up, every chosen scenario in order, then the table and the JSON.
async fn measure(args: RunArgs) {
    let mut run = set_up(args).await;
    let only = run.args.only.clone();
    let runs = |s: Scenario| only.is_empty() || only.contains(&s);
    if runs(Scenario::Push) {
        measure_push(&mut run).await;
    }
    if runs(Scenario::Consume) {
        measure_consume(&mut run).await;
    }
    if runs(Scenario::Steady) || runs(Scenario::FanOut) {
        measure_steady(&mut run).await;
    }
    if runs(Scenario::Parked) {
        measure_parked(&mut run).await;
    }
    if runs(Scenario::Scaling) {
        measure_scaling(&mut run).await;
    }
    if runs(Scenario::FanOut) {
        measure_fan_out(&mut run).await;
    }
    if runs(Scenario::Wake) {
        measure_wake(&mut run).await;
    }
    if runs(Scenario::Limiter) {
        run.rows
            .extend(limiter::limiter_scenario(&run.pg, run.plan.consume_total).await);
        eprintln!("measured the limiter");
    }
    if runs(Scenario::Consumers) {
        let rows = consumers::consumers_scenario(
            &run.pg,
            run.plan.consume_total,
            run.plan.many_consumers,
            &mut run.limiter_series,
        )
        .await;
        run.rows.extend(rows);
        eprintln!("measured many consumers");
    }
    if runs(Scenario::Retention) {
        let soak = run.args.soak_secs.unwrap_or(run.plan.soak_secs);
        let rows =
            retention::retention_scenario(&run.pg, &run.cfg, soak, run.plan.retention_sizes).await;
        run.rows.extend(rows);
        eprintln!("measured retention");
    }
    if runs(Scenario::Auth) {
        run.rows
            .extend(auth::auth_scenario(&run.pg, run.plan.secs, run.plan.consume_total).await);
        eprintln!("measured auth");
    }
    if runs(Scenario::Coordination) {
        let rows = coordination::coordination_scenario(
            run.addr,
            &run.cfg,
            run.plan.secs,
            run.plan.due_timers,
        )
        .await;
        run.rows.extend(rows);
        eprintln!("measured the coordination surfaces");
    }
    if runs(Scenario::Reads) {
        let rows = reads::reads_scenario(run.addr, &run.cfg, run.plan.fetch_messages).await;
        run.rows.extend(rows);
        eprintln!("measured reads by offset");
    }
    if runs(Scenario::Streams) {
        let rows = streams::streams_scenario(run.addr, &run.cfg, run.plan.secs).await;
        run.rows.extend(rows);
        eprintln!("measured stream cycles");
    }
    if runs(Scenario::Ephemeral) {
        // Two more brokers, sharing their ephemeral queues with each other (not with the main
        // one, which owns its queues alone), for the forwarded path.
        let (_owner, owner) = start_peer(&run.pg, 17_001).await;
        let (_other, other) = start_peer(&run.pg, 17_002).await;
        let rows =
            ephemeral::ephemeral_scenario(run.addr, (owner, other), run.plan.secs, run.plan.quick)
                .await;
        run.rows.extend(rows);
        eprintln!("measured ephemeral queues");
    }
    if runs(Scenario::Durable) {
        match std::env::var("DURABLE_DATABASE_URL") {
            Ok(url) => {
                let rows = durable::durable_scenario(
                    &url,
                    run.plan.secs,
                    run.plan.steady_secs,
                    run.plan.consume_total,
                    run.plan.consume_one_total,
                )
                .await;
                run.rows.extend(rows);
                eprintln!("measured durable PostgreSQL");
            }
            // `bash .ci/bench` always starts one; a run pointed at its own database says so.
            Err(_) => eprintln!(
                "skipped the durable scenario: DURABLE_DATABASE_URL names no PostgreSQL with durability on"
            ),
        }
    }
    // Last: PostgreSQL restarted under load (every connection of this process is cut).
    if runs(Scenario::Restart) {
        let rounds = if run.plan.quick { 1 } else { 3 };
        run.rows
            .extend(restart::restart_scenario(run.addr, rounds).await);
        eprintln!("measured a PostgreSQL restart");
    }
    finish(run).await;
}

/// The database, the pool's warmer and statistics keeper (as the server binary runs them), the
/// raw baselines' schema, and the main broker.
async fn set_up(args: RunArgs) -> Run {
    let plan = Plan::new(args.quick);
    let pg = queen_storage_pg::testing::fresh_database(DB_NAME, 32).await;
    // The in-process brokers share this pool; it is warmed as the server binary warms its own,
    // and PG_WARM_INTERVAL_MS=0 turns it off here too (to measure what it saves).
    let warm_ms = env_number("PG_WARM_INTERVAL_MS")
        .unwrap_or(queen_server::config::DEFAULT_PG_WARM_INTERVAL_MS);
    if warm_ms > 0 {
        broker_runtime().spawn(
            queen_storage_pg::ConnectionWarmer::default()
                .run(pg.clone(), std::time::Duration::from_millis(warm_ms)),
        );
    }
    // Statistics kept as the server binary keeps them (PG_STATS_INTERVAL_MS=0: off).
    let stats_ms = env_number("PG_STATS_INTERVAL_MS")
        .unwrap_or(queen_server::config::DEFAULT_PG_STATS_INTERVAL_MS);
    if stats_ms > 0 {
        broker_runtime().spawn(queen_storage_pg::keep_statistics(
            pg.clone(),
            std::time::Duration::from_millis(stats_ms),
        ));
    }
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(DB_NAME);
    let db_url = parked::url_with_db(&queen_storage_pg::testing::database_url(), DB_NAME);
    let setup = util::pg_connect(&cfg).await;
    util::settle_before_measuring(&cfg);
    setup
        .batch_execute(BASELINE_SCHEMA)
        .await
        .expect("baseline schema");
    drop(setup);
    let (app, addr) = start_app(&pg, true).await;
    Run {
        args,
        plan,
        pg,
        cfg,
        db_url,
        app,
        addr,
        rows: vec![],
        limiter_series: vec![],
        offered: 1000.0,
        calm_p99: f64::NAN,
        commit: report::git_commit(),
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The raw baselines' tables: a row per message, a segment per batch, and claim cursors.
pub(crate) const BASELINE_SCHEMA: &str = "CREATE SCHEMA bench;
     CREATE TABLE bench.rows (id bigserial PRIMARY KEY, partition text NOT NULL, txid text NOT NULL, payload jsonb NOT NULL,
                              created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (partition, txid));
     CREATE TABLE bench.parts (id int PRIMARY KEY, last_offset bigint NOT NULL);
     CREATE TABLE bench.segments (pid int NOT NULL, base_offset bigint NOT NULL, end_offset bigint NOT NULL, blob bytea NOT NULL,
                                  created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pid, base_offset));
     ALTER TABLE bench.segments ALTER COLUMN blob SET STORAGE EXTERNAL;
     CREATE TABLE bench.cursors (pid int PRIMARY KEY, committed bigint NOT NULL);
     INSERT INTO bench.parts SELECT g, -1 FROM generate_series(0, 999) g;
     INSERT INTO bench.cursors SELECT g, -1 FROM generate_series(0, 999) g;";

/// The table on stdout, the JSON beside it, and the database dropped.
async fn finish(run: Run) {
    report::print_table(run.plan.quick, run.plan.secs, &run.rows);
    let out: Vec<_> = run
        .rows
        .iter()
        .map(|r| json!({"scenario": r.scenario, "metric": r.metric, "broker": r.broker, "baseline": r.baseline_name, "baselineValue": r.baseline, "ratio": r.ratio()}))
        .collect();
    let doc = json!({
        "mode": if run.plan.quick { "quick" } else { "full" },
        "seconds": run.plan.secs,
        "commit": run.commit,
        "date": report::today(),
        "machine": report::machine(),
        "rows": out,
        "limiterSeries": run.limiter_series,
    });
    let path = &run.args.json;
    if let Err(e) = std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap_or_default()) {
        eprintln!("cannot write {}: {e}", path.display());
    }
    run.app.shutting_down.send_replace(true);
    queen_storage_pg::testing::drop_database(DB_NAME).await;
}
