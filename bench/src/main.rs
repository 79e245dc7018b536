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
mod limiter;
mod live;
mod parked;
mod push;
mod reads;
mod report;
mod restart;
mod retention;
mod scaling;
mod streams;
mod util;
mod wake;

use std::sync::Arc;

use clap::Parser;
use queen_core::storage::StorageSet;
use queen_server::broker::Broker;
use queen_server::config::ServerConfig;
use serde_json::json;
use util::Row;

use args::{Args, Command, RunArgs, Scenario};

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

async fn start_app(
    pg: &queen_storage_pg::PgStorage,
    hotlist: bool,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let config = ServerConfig {
        hotlist,
        ..crate::bench_config()
    };
    start_with(pg, config, 1).await
}

/// The in-process brokers' runtime, apart from the load generator's: its threads are named
/// (util::BROKER_THREAD), so the broker's CPU time is read from /proc apart, and the two do not
/// share worker threads, as a broker and its clients would not.
fn broker_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(util::BROKER_THREAD)
            .enable_all()
            .build()
            .expect("broker runtime")
    })
}

/// The configuration of the bench's in-process brokers: the defaults without a retention
/// worker. Every broker it starts lives to the end of the run, so default workers would run
/// retention passes over other scenarios' queues (one removed the retention scenario's filled
/// partitions before the pass it measures); the soak turns its own worker on.
pub(crate) fn bench_config() -> ServerConfig {
    ServerConfig {
        retention: queen_server::config::RetentionSettings::OFF,
        pop_rounds: std::env::var("POP_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_POP_ROUNDS),
        push_rounds: std::env::var("PUSH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_PUSH_ROUNDS),
        limiter: bench_limiter(),
        client_idle_timeout_ms: std::env::var("CLIENT_IDLE_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_CLIENT_IDLE_TIMEOUT_MS),
        ..ServerConfig::default()
    }
}

/// The serving limiter's bounds, from `QUEEN_LIMITER_MIN` / `QUEEN_LIMITER_MAX` as the server
/// reads them (min = max: a fixed limit), to compare limits on one load.
fn bench_limiter() -> queen_core::limiter::LimiterConfig {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let mut limiter = queen_core::limiter::LimiterConfig::default();
    if let Some(min) = env("QUEEN_LIMITER_MIN") {
        limiter.min_limit = min;
    }
    if let Some(max) = env("QUEEN_LIMITER_MAX") {
        limiter.max_limit = max;
    }
    // The initial limit is left as it is: the limiter holds it within the bounds itself.
    limiter
}

/// An in-process broker on the bench's database, serving on an ephemeral port.
pub(crate) async fn start_with(
    pg: &queen_storage_pg::PgStorage,
    config: ServerConfig,
    seed: u64,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    serve_on(pg, config, seed, listener)
}

/// A broker with its background tasks, serving `listener` on the brokers' runtime.
fn serve_on(
    pg: &queen_storage_pg::PgStorage,
    config: ServerConfig,
    seed: u64,
    listener: std::net::TcpListener,
) -> (Arc<Broker>, std::net::SocketAddr) {
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let addr = listener.local_addr().expect("addr");
    let app = Broker::new(config, StorageSet::of(Arc::new(pg.clone())), seed);
    queen_server::tasks::start(&app);
    let served = app.clone();
    broker_runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        queen_server::serve_listener(served, listener).await
    });
    (app, addr)
}

/// An in-process broker that shares its ephemeral queues with the other peers on the bench's
/// database: its `PEER_ADDRESS` is the port it serves on.
pub(crate) async fn start_peer(
    pg: &queen_storage_pg::PgStorage,
    seed: u64,
) -> (Arc<Broker>, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = ServerConfig {
        peer_address: Some(addr.to_string()),
        ..bench_config()
    };
    serve_on(pg, config, seed, listener)
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

/// Scenario 1: Push throughput per batch size, against (a) rows and (b) segments.
async fn measure_push(run: &mut Run) {
    let batches = run.args.push_batches.clone();
    for batch in batches {
        let rows = push::push_scenario(run.addr, &run.cfg, batch, run.plan.secs).await;
        run.rows.extend(rows);
        eprintln!("measured push, batch {batch}");
    }
}

/// Scenario 2: Consume throughput per (partitions, consumers) shape, against (c) the claim loop.
async fn measure_consume(run: &mut Run) {
    let shapes = run.args.consume_shapes.clone();
    for shape in shapes {
        let (partitions, consumers) = (shape.partitions, shape.consumers);
        let rows = consume::consume_scenario(
            &run.app,
            run.addr,
            &run.cfg,
            partitions,
            consumers,
            run.plan.consume_total,
        )
        .await;
        run.rows.extend(rows);
        eprintln!("measured consume, {partitions} partitions, {consumers} consumers");
    }
    let total = run.plan.consume_one_total;
    let rows = consume::consume_one_at_a_time(&run.app, run.addr, &run.cfg, total, "consume").await;
    run.rows.extend(rows);
}

/// Scenario 3, steady state: the maximum first, then 10% of it, each against the raw pipeline. The
/// fan-out scenario needs its calm rate and p99 even when the steady rows are not wanted.
async fn measure_steady(run: &mut Run) {
    let secs = run.plan.steady_secs;
    let max = live::run(run.addr, "steady-max", 1, 4, None, secs).await;
    // --offered fixes the calm rate, so runs of two builds offer the same load.
    run.offered = run
        .args
        .offered
        .unwrap_or_else(|| (max.delivered * 0.1).max(100.0));
    let offered = run.offered;
    let calm = live::run(run.addr, "steady-10pct", 1, 4, Some(offered), secs).await;
    run.calm_p99 = calm.groups[0].p99;
    if run.args.runs(Scenario::Steady) {
        let raw_max = live::raw_run(&run.cfg, None, secs).await;
        let raw_calm = live::raw_run(&run.cfg, Some(offered), secs).await;
        for (label, b, r) in [
            ("steady state, maximum".to_string(), &max, &raw_max),
            (
                format!("steady state, {offered:.0} msg/s offered (10% of max)"),
                &calm,
                &raw_calm,
            ),
        ] {
            let raw = "NOTIFY + claim loop";
            let (bg, rg) = (&b.groups[0], &r.groups[0]);
            run.rows.extend([
                Row::new(
                    label.clone(),
                    "delivered msg/s",
                    b.delivered,
                    raw,
                    r.delivered,
                ),
                Row::new(label.clone(), "p50 ms", bg.p50, raw, rg.p50),
                Row::new(label.clone(), "p99 ms", bg.p99, raw, rg.p99),
                Row::new(label, "max ms", bg.max, raw, rg.max),
            ]);
        }
    }
    eprintln!("measured steady state");
}

/// Scenario 4: Parked long-polls, hot-list on and off, against 1 Hz raw pollers.
async fn measure_parked(run: &mut Run) {
    let counts = run
        .args
        .parked
        .clone()
        .unwrap_or_else(|| run.plan.parked.to_vec());
    let secs = run.plan.parked_secs;
    for consumers in counts {
        let raw = parked::raw_pollers(&run.cfg, DB_NAME, consumers, secs).await;
        for hotlist in [true, false] {
            let p =
                parked::broker_run(&run.db_url, DB_NAME, &run.cfg, hotlist, consumers, secs).await;
            run.rows.extend(parked::rows(consumers, hotlist, &p, raw));
            eprintln!("measured parked, {consumers} long-polls, hotlist {hotlist}");
        }
    }
}

/// Scenario 5, partition scaling: the wildcard scan (QUEEN_HOTLIST=0) and the hot-list path, each
/// size against the smallest.
async fn measure_scaling(run: &mut Run) {
    let (_wild, wild_addr) = start_app(&run.pg, false).await;
    let mut smallest: [Option<scaling::Scaling>; 2] = [None, None];
    let mut sizes = run
        .args
        .scaling_sizes
        .clone()
        .unwrap_or_else(|| run.plan.sizes.to_vec());
    sizes.sort_unstable();
    for size in sizes {
        let queue = format!("scale-{size}");
        scaling::prefill(&run.pg, &run.cfg, &queue, size).await;
        let paths = [
            ("wildcard pop", wild_addr, "wild"),
            ("hot-list pop", run.addr, "hot"),
        ];
        for (k, (path, at, group)) in paths.into_iter().enumerate() {
            // --scaling-paths hot (or wild) runs one path (to profile it alone).
            if !run.args.scaling_paths.iter().any(|p| p == group) {
                continue;
            }
            let s = scaling::run(at, &queue, group, run.plan.secs).await;
            let base = smallest[k].as_ref().unwrap_or(&s);
            let label = format!("{path}, batch 10, {size} partitions");
            let vs = format!("{} partitions", run.plan.sizes[0]);
            run.rows.extend([
                Row::new(label.clone(), "msg/s", s.rate, vs.clone(), base.rate),
                Row::new(
                    label.clone(),
                    "pop p99 ms",
                    s.pop.p99,
                    vs.clone(),
                    base.pop.p99,
                ),
                Row::new(
                    label.clone(),
                    "first contact ms",
                    s.first_contact_ms,
                    vs.clone(),
                    base.first_contact_ms,
                ),
                Row::new(
                    label,
                    "a later new group's first contact ms (median of 5)",
                    s.later_contact_ms,
                    vs,
                    base.later_contact_ms,
                ),
            ]);
            if smallest[k].is_none() {
                smallest[k] = Some(s);
            }
        }
        weigh_ring(run, &queue, size);
        measure_admin_totals(run, &queue, size).await;
        eprintln!("measured scaling, {size} partitions");
    }
}

/// The admin totals once the database holds the scaling queues so far: a pass over every
/// partition, and the totals routes answered from it (each against the pass).
async fn measure_admin_totals(run: &mut Run, queue: &str, size: usize) {
    let t = admin::measure(run.addr, queue).await;
    let label = format!("admin totals, {size}-partition queue");
    let vs = "a pass over every partition, ms";
    run.rows.extend([
        Row::new(
            label.clone(),
            "pass ms (POST /stats/refresh)",
            t.pass_ms,
            "partitions read",
            t.partitions,
        ),
        Row::new(
            label.clone(),
            "queue listing ms (median of 5)",
            t.listing_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "consumer groups ms (median of 5)",
            t.groups_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "overview ms (median of 5)",
            t.overview_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its depth for a group ms (median of 5)",
            t.depth_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its first page of partitions ms (median of 5)",
            t.queue_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its status view ms (median of 5)",
            t.queue_status_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "a group's partitions on it ms (median of 5)",
            t.group_ms,
            vs,
            t.pass_ms,
        ),
        Row::new(
            label.clone(),
            "its messages, first page, ms (median of 5)",
            t.messages_ms,
            vs,
            t.pass_ms,
        ),
    ]);
    for (metric, ms) in [
        ("status ms (median of 5)", t.status_ms),
        ("lagging cursors ms (median of 5)", t.lagging_ms),
        ("its dead letters ms (median of 5)", t.dlq_ms),
        ("trace names ms (median of 5)", t.trace_names_ms),
    ] {
        run.rows
            .push(Row::new(label.clone(), metric, ms, vs, t.pass_ms));
    }
}

/// What the hot-list ring holds after a scaling run, and what its entries cost: live heap bytes
/// before and after the queue's rings are dropped.
fn weigh_ring(run: &mut Run, queue: &str, size: usize) {
    let label = format!("hot-list ring, {size} partitions");
    let (entries, freed) = {
        let mut ctx = queen_server::lock(&run.app.pop_ctx);
        let entries = ctx.rings.entry_count();
        let region = stats_alloc::Region::new(&ALLOCATOR);
        ctx.rings.forget_queue(queue);
        let change = region.change();
        (
            entries,
            change.bytes_deallocated as i64 - change.bytes_allocated as i64,
        )
    };
    run.rows.extend([
        Row::new(
            label.clone(),
            "entries after the run",
            entries as f64,
            "partitions",
            size as f64,
        ),
        Row::new(
            label.clone(),
            "heap bytes per entry",
            freed as f64 / entries.max(1) as f64,
            "-",
            f64::NAN,
        ),
        Row::new(
            label,
            "bench process RSS MiB (broker in-process)",
            util::rss_mib("self"),
            "-",
            f64::NAN,
        ),
    ]);
}

/// Scenario 6: Fan-out at the calm offered rate: every group must receive every message.
async fn measure_fan_out(run: &mut Run) {
    let counts = run
        .args
        .fanout_groups
        .clone()
        .unwrap_or_else(|| run.plan.fan_out_groups.to_vec());
    let (offered, calm_p99) = (run.offered, run.calm_p99);
    // CPU per delivery of the first (fewest groups) run: what a delivery costs when few groups
    // share the pushes.
    let mut first_cost: Option<(usize, f64, f64)> = None;
    for groups in counts {
        let trace = limiter::LimitTrace::start(&run.app, std::time::Duration::from_millis(100));
        let name = format!("fanout-{groups}");
        let cpu = util::CpuMark::now();
        let r = live::run(run.addr, &name, groups, 2, Some(offered), run.plan.secs).await;
        let (broker_per_cpu_s, pg_per_cpu_s) = cpu.messages_per_cpu_second(r.deliveries as f64);
        let (broker_us, pg_us) = (1e6 / broker_per_cpu_s, 1e6 / pg_per_cpu_s);
        let (first_groups, first_broker_us, first_pg_us) =
            *first_cost.get_or_insert((groups, broker_us, pg_us));
        let worst = r.groups.iter().map(|l| l.p99).fold(0.0, f64::max);
        let spread: Vec<String> = r
            .groups
            .iter()
            .map(|l| format!("{:.1}/{:.1}/{:.0}", l.p50, l.p99, l.max))
            .collect();
        eprintln!(
            "fan-out {groups} groups, p50/p99/max ms per group (steady 10% p99 {calm_p99:.1}): {}",
            spread.join(" ")
        );
        let label = format!("fan-out, {groups} groups, {offered:.0} msg/s offered");
        let ideal = offered * groups as f64;
        run.rows.extend([
            Row::new(
                label.clone(),
                "deliveries/s",
                r.delivered,
                "offered x groups",
                ideal,
            ),
            Row::new(
                label.clone(),
                "worst group p99 ms",
                worst,
                "steady 10% p99",
                calm_p99,
            ),
            Row::new(
                label.clone(),
                "broker CPU us per delivery",
                broker_us,
                format!("{first_groups} group(s)"),
                first_broker_us,
            ),
            Row::new(
                label.clone(),
                "PG CPU us per delivery",
                pg_us,
                format!("{first_groups} group(s)"),
                first_pg_us,
            ),
        ]);
        let samples = trace.stop().await;
        run.rows.extend(limiter::trace_rows(&label, &samples));
        run.limiter_series
            .push(limiter::trace_json(&label, &samples));
        eprintln!("measured fan-out, {groups} groups");
    }
}

/// Scenario 7, wake latency per event: the consumer parks on broker B; the event happens on B
/// (one broker) or on A (across two). Re-checks are 60 s apart there: only events deliver.
async fn measure_wake(run: &mut Run) {
    let (_a, a_addr) = wake::start_broker(&run.pg, 11).await;
    let (_b, b_addr) = wake::start_broker(&run.pg, 12).await;
    let samples = if run.plan.quick { 10 } else { 100 };
    for kind in wake::KINDS {
        for across in [false, true] {
            let actor = if across { a_addr } else { b_addr };
            let tag = if across { "x" } else { "o" };
            let (l, n) = wake::run(kind, actor, b_addr, tag, samples).await;
            run.rows.extend(wake::rows(kind, across, &l, n));
        }
    }
    eprintln!("measured wake latency");
}

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
