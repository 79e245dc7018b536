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
//!     limiter's limit traced over time (also over the fan-out runs; the traces go to the JSON).
//!
//! Usage: DATABASE_URL=... queen-bench [--quick] [--only push,consume,...] [--json PATH]   (or `bash .ci/bench [--quick]`)

#![allow(clippy::expect_used)] // a benchmark that cannot set up has nothing to report

mod auth;
mod consume;
mod consumers;
mod limiter;
mod live;
mod parked;
mod push;
mod restart;
mod retention;
mod scaling;
mod util;
mod wake;

use std::sync::Arc;

use queen_core::storage::StorageSet;
use queen_server::app::App;
use queen_server::config::ServerConfig;
use serde_json::json;
use util::Row;

struct Plan {
    quick: bool,
    secs: u64,
    consume_total: usize,
    steady_secs: u64,
    parked: [usize; 2],
    parked_secs: u64,
    sizes: &'static [usize],
    soak_secs: u64,
    retention_sizes: [usize; 2],
    fan_out_groups: &'static [usize],
    /// The many-consumer count of scenario 12.
    many_consumers: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            // Smaller counts and windows, every row still printed: a smoke run under 2 minutes.
            Plan {
                quick,
                secs: 1,
                consume_total: 10_000,
                steady_secs: 2,
                parked: [500, 2_000],
                parked_secs: 2,
                sizes: &[100, 1_000, 10_000],
                soak_secs: 8,
                retention_sizes: [1_000, 10_000],
                fan_out_groups: &[1, 5, 10],
                many_consumers: 200,
            }
        } else {
            Plan {
                quick,
                secs: 10,
                // 300k: at 10 partitions the claim loop drains 100k in under a second, a window
                // too short to compare (its rate varied 118k-163k msg/s run to run).
                consume_total: 300_000,
                steady_secs: 30,
                parked: [1_000, 10_000],
                parked_secs: 30,
                sizes: &[100, 10_000, 100_000, 1_000_000],
                soak_secs: 240,
                retention_sizes: [10_000, 100_000],
                fan_out_groups: &[1, 5, 10, 50],
                many_consumers: 1_000,
            }
        }
    }
}

async fn start_app(
    pg: &queen_storage_pg::PgStorage,
    hotlist: bool,
) -> (Arc<App>, std::net::SocketAddr) {
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
        retention: queen_server::retention::RetentionSettings::OFF,
        pop_rounds: std::env::var("POP_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(queen_server::config::DEFAULT_POP_ROUNDS),
        limiter: bench_limiter(),
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
) -> (Arc<App>, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let addr = listener.local_addr().expect("addr");
    let app = App::new(config, StorageSet::of(Arc::new(pg.clone())), seed);
    let served = app.clone();
    broker_runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        queen_server::serve_listener(served, listener).await
    });
    (app, addr)
}

fn print_table(plan: &Plan, rows: &[Row]) {
    println!(
        "\nqueen-bench ({}; PostgreSQL on this host; {} s per throughput measurement)\n",
        if plan.quick { "quick" } else { "full" },
        plan.secs
    );
    println!("| scenario | metric | broker | baseline | baseline value | broker / baseline |");
    println!("|---|---|---:|---|---:|---:|");
    let num = |x: f64| {
        if x.is_nan() {
            "-".to_string()
        } else if x.abs() >= 100.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.2}")
        }
    };
    for r in rows {
        let ratio = if r.ratio().is_nan() {
            "-".into()
        } else {
            format!("{:.2}x", r.ratio())
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.metric,
            num(r.broker),
            r.baseline_name,
            num(r.baseline),
            ratio
        );
    }
}

// The allocator of the `queen` binary (server/Cargo.toml says why), counting live bytes.
#[global_allocator]
static ALLOCATOR: stats_alloc::StatsAlloc<mimalloc::MiMalloc> =
    stats_alloc::StatsAlloc::new(mimalloc::MiMalloc);

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let plan = Plan::new(args.iter().any(|a| a == "--quick"));
    // --only <names>: comma-separated scenarios, each at its full length, the rest skipped.
    const SCENARIOS: [&str; 12] = [
        "push",
        "consume",
        "steady",
        "parked",
        "scaling",
        "fan-out",
        "wake",
        "limiter",
        "retention",
        "restart",
        "auth",
        "consumers",
    ];
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| {
            list.split(',')
                .map(|n| {
                    if n == "fanout" {
                        "fan-out".to_string()
                    } else {
                        n.trim().to_string()
                    }
                })
                .collect()
        });
    if let Some(unknown) = only
        .iter()
        .flatten()
        .find(|n| !SCENARIOS.contains(&n.as_str()))
    {
        eprintln!(
            "--only: unknown scenario {unknown:?}; the names are {}",
            SCENARIOS.join(", ")
        );
        std::process::exit(2);
    }
    let runs = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "target/queen-bench.json".into());
    let name = "queen_bench";
    let pg = queen_storage_pg::testing::fresh_database(name, 32).await;
    // The in-process brokers share this pool; it is warmed as the server binary warms its own,
    // and PG_WARM_INTERVAL_MS=0 turns it off here too (to measure what it saves).
    let warm_ms = std::env::var("PG_WARM_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(queen_server::config::DEFAULT_PG_WARM_INTERVAL_MS);
    if warm_ms > 0 {
        broker_runtime().spawn(
            queen_storage_pg::ConnectionWarmer::default()
                .run(pg.clone(), std::time::Duration::from_millis(warm_ms)),
        );
    }
    // Statistics kept as the server binary keeps them (PG_STATS_INTERVAL_MS=0: off).
    let stats_ms = std::env::var("PG_STATS_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(queen_server::config::DEFAULT_PG_STATS_INTERVAL_MS);
    if stats_ms > 0 {
        broker_runtime().spawn(queen_storage_pg::keep_statistics(
            pg.clone(),
            std::time::Duration::from_millis(stats_ms),
        ));
    }
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(name);
    let db_url = parked::url_with_db(&queen_storage_pg::testing::database_url(), name);
    let setup = util::pg_connect(&cfg).await;
    util::settle_before_measuring(&cfg);
    setup
        .batch_execute(
            "CREATE SCHEMA bench;
             CREATE TABLE bench.rows (id bigserial PRIMARY KEY, partition text NOT NULL, txid text NOT NULL, payload jsonb NOT NULL,
                                      created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (partition, txid));
             CREATE TABLE bench.parts (id int PRIMARY KEY, last_offset bigint NOT NULL);
             CREATE TABLE bench.segments (pid int NOT NULL, base_offset bigint NOT NULL, end_offset bigint NOT NULL, blob bytea NOT NULL,
                                          created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pid, base_offset));
             ALTER TABLE bench.segments ALTER COLUMN blob SET STORAGE EXTERNAL;
             CREATE TABLE bench.cursors (pid int PRIMARY KEY, committed bigint NOT NULL);
             INSERT INTO bench.parts SELECT g, -1 FROM generate_series(0, 999) g;
             INSERT INTO bench.cursors SELECT g, -1 FROM generate_series(0, 999) g;",
        )
        .await
        .expect("baseline schema");
    let (app, addr) = start_app(&pg, true).await;
    let mut rows = vec![];
    // The serving limiter's limit over time under the scale loads (JSON only: [ms, limit, in flight,
    // idle %] per sample).
    let mut limiter_series: Vec<serde_json::Value> = vec![];

    // BENCH_PUSH_BATCHES=1000 narrows the batch sizes (for a profiler's window).
    let push_batches: Vec<usize> = match std::env::var("BENCH_PUSH_BATCHES") {
        Ok(list) => list
            .split(',')
            .map(|n| match n.trim().parse() {
                Ok(n) => n,
                Err(_) => {
                    eprintln!("BENCH_PUSH_BATCHES: {n:?} is not a batch size");
                    std::process::exit(2);
                }
            })
            .collect(),
        Err(_) => vec![1, 10, 100, 1000],
    };
    for batch in push_batches.into_iter().filter(|_| runs("push")) {
        rows.extend(push::push_scenario(addr, &cfg, batch, plan.secs).await);
        eprintln!("measured push, batch {batch}");
    }
    // BENCH_CONSUME_SHAPES=10x4,1000x16 narrows the consume shapes (for a profiler's window).
    let consume_shapes: Vec<(usize, usize)> = match std::env::var("BENCH_CONSUME_SHAPES") {
        Ok(list) => list
            .split(',')
            .map(|shape| {
                shape
                    .trim()
                    .split_once('x')
                    .and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?)))
                    .unwrap_or_else(|| {
                        eprintln!(
                            "BENCH_CONSUME_SHAPES: {shape:?} is not <partitions>x<consumers>"
                        );
                        std::process::exit(2)
                    })
            })
            .collect(),
        Err(_) => vec![(10, 4), (10, 16), (1000, 4), (1000, 16)],
    };
    for (partitions, consumers) in consume_shapes.into_iter().filter(|_| runs("consume")) {
        {
            rows.extend(
                consume::consume_scenario(
                    &app,
                    addr,
                    &cfg,
                    partitions,
                    consumers,
                    plan.consume_total,
                )
                .await,
            );
            eprintln!("measured consume, {partitions} partitions, {consumers} consumers");
        }
    }

    // 3. Steady state: the maximum first, then 10% of it, each against the raw pipeline.
    let mut offered = 1000.0;
    let mut calm_p99 = f64::NAN;
    if runs("steady") || runs("fan-out") {
        let max = live::run(addr, "steady-max", 1, 4, None, plan.steady_secs).await;
        // BENCH_OFFERED fixes the calm rate, so runs of two builds offer the same load.
        offered = match std::env::var("BENCH_OFFERED")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(fixed) => fixed,
            None => (max.delivered * 0.1).max(100.0),
        };
        let calm = live::run(addr, "steady-10pct", 1, 4, Some(offered), plan.steady_secs).await;
        calm_p99 = calm.groups[0].p99;
        if runs("steady") {
            let raw_max = live::raw_run(&cfg, None, plan.steady_secs).await;
            let raw_calm = live::raw_run(&cfg, Some(offered), plan.steady_secs).await;
            for (label, b, r) in [
                ("steady state, maximum".to_string(), &max, &raw_max),
                (
                    format!("steady state, {offered:.0} msg/s offered (10% of max)"),
                    &calm,
                    &raw_calm,
                ),
            ] {
                let raw = "NOTIFY + claim loop";
                rows.push(Row::new(
                    label.clone(),
                    "delivered msg/s",
                    b.delivered,
                    raw,
                    r.delivered,
                ));
                rows.push(Row::new(
                    label.clone(),
                    "p50 ms",
                    b.groups[0].p50,
                    raw,
                    r.groups[0].p50,
                ));
                rows.push(Row::new(
                    label.clone(),
                    "p99 ms",
                    b.groups[0].p99,
                    raw,
                    r.groups[0].p99,
                ));
                rows.push(Row::new(
                    label,
                    "max ms",
                    b.groups[0].max,
                    raw,
                    r.groups[0].max,
                ));
            }
        }
        eprintln!("measured steady state");
    }

    // 4. Parked long-polls, hot-list on and off, against 1 Hz raw pollers.
    let parked_counts: Vec<usize> = match std::env::var("BENCH_PARKED") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => plan.parked.to_vec(),
    };
    for consumers in parked_counts.into_iter().filter(|_| runs("parked")) {
        let raw = parked::raw_pollers(&cfg, name, consumers, plan.parked_secs).await;
        for hotlist in [true, false] {
            let p =
                parked::broker_run(&db_url, name, &cfg, hotlist, consumers, plan.parked_secs).await;
            rows.extend(parked::rows(consumers, hotlist, &p, raw));
            eprintln!("measured parked, {consumers} long-polls, hotlist {hotlist}");
        }
    }

    // 5. Partition scaling: the wildcard scan (QUEEN_HOTLIST=0) and the hot-list path.
    let (_wild, wild_addr) = start_app(&pg, false).await;
    let mut smallest: [Option<scaling::Scaling>; 2] = [None, None];
    // BENCH_SCALING_SIZES=100,1000000 narrows the sizes (the smallest is every size's baseline).
    let sizes: Vec<usize> = match std::env::var("BENCH_SCALING_SIZES") {
        Ok(list) => {
            let mut sizes: Vec<usize> = list
                .split(',')
                .map(|n| {
                    n.trim().parse().unwrap_or_else(|_| {
                        eprintln!("BENCH_SCALING_SIZES: {n:?} is not a partition count");
                        std::process::exit(2)
                    })
                })
                .collect();
            sizes.sort_unstable();
            sizes
        }
        Err(_) => plan.sizes.to_vec(),
    };
    for &size in sizes.iter().filter(|_| runs("scaling")) {
        let queue = format!("scale-{size}");
        scaling::prefill(&pg, &cfg, &queue, size).await;
        for (k, (path, at, group)) in [
            ("wildcard pop", wild_addr, "wild"),
            ("hot-list pop", addr, "hot"),
        ]
        .into_iter()
        .enumerate()
        {
            // BENCH_SCALING_PATHS=hot or =wild runs one path (to profile it alone).
            if std::env::var("BENCH_SCALING_PATHS").is_ok_and(|p| !p.split(',').any(|n| n == group))
            {
                continue;
            }
            let s = scaling::run(at, &queue, group, plan.secs).await;
            let base = smallest[k].as_ref().unwrap_or(&s);
            let label = format!("{path}, batch 10, {size} partitions");
            let vs = format!("{} partitions", plan.sizes[0]);
            rows.push(Row::new(
                label.clone(),
                "msg/s",
                s.rate,
                vs.clone(),
                base.rate,
            ));
            rows.push(Row::new(
                label.clone(),
                "pop p99 ms",
                s.pop.p99,
                vs.clone(),
                base.pop.p99,
            ));
            rows.push(Row::new(
                label.clone(),
                "first contact ms",
                s.first_contact_ms,
                vs.clone(),
                base.first_contact_ms,
            ));
            rows.push(Row::new(
                label,
                "a later new group's first contact ms (median of 5)",
                s.later_contact_ms,
                vs,
                base.later_contact_ms,
            ));
            if smallest[k].is_none() {
                smallest[k] = Some(s);
            }
        }
        // What the hot-list ring holds after the run, and what its entries cost: live heap
        // bytes before and after the queue's rings are dropped.
        let label = format!("hot-list ring, {size} partitions");
        let (entries, freed) = {
            let mut ctx = app.pop_ctx.lock().unwrap_or_else(|p| p.into_inner());
            let entries = ctx.rings.entry_count();
            let region = stats_alloc::Region::new(&ALLOCATOR);
            ctx.rings.forget_queue(&queue);
            let change = region.change();
            (
                entries,
                change.bytes_deallocated as i64 - change.bytes_allocated as i64,
            )
        };
        rows.push(Row::new(
            label.clone(),
            "entries after the run",
            entries as f64,
            "partitions",
            size as f64,
        ));
        rows.push(Row::new(
            label.clone(),
            "heap bytes per entry",
            freed as f64 / entries.max(1) as f64,
            "-",
            f64::NAN,
        ));
        rows.push(Row::new(
            label,
            "bench process RSS MiB (broker in-process)",
            util::rss_mib("self"),
            "-",
            f64::NAN,
        ));
        eprintln!("measured scaling, {size} partitions");
    }

    // 6. Fan-out at the calm offered rate: every group must receive every message.
    // BENCH_FANOUT_GROUPS=10 narrows the group counts (for a profile of one of them).
    let fan_out_groups: Vec<usize> = match std::env::var("BENCH_FANOUT_GROUPS") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => plan.fan_out_groups.to_vec(),
    };
    for groups in fan_out_groups.into_iter().filter(|_| runs("fan-out")) {
        let trace = limiter::LimitTrace::start(&app, std::time::Duration::from_millis(100));
        let r = live::run(
            addr,
            &format!("fanout-{groups}"),
            groups,
            2,
            Some(offered),
            plan.secs,
        )
        .await;
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
        rows.push(Row::new(
            label.clone(),
            "deliveries/s",
            r.delivered,
            "offered x groups",
            offered * groups as f64,
        ));
        rows.push(Row::new(
            label.clone(),
            "worst group p99 ms",
            worst,
            "steady 10% p99",
            calm_p99,
        ));
        let samples = trace.stop().await;
        rows.extend(limiter::trace_rows(&label, &samples));
        limiter_series.push(limiter::trace_json(&label, &samples));
        eprintln!("measured fan-out, {groups} groups");
    }

    // 7. Wake latency per event: the consumer parks on broker B; the event happens on B (one
    // broker) or on A (across two). Re-checks are 60 s apart there: only events deliver.
    if runs("wake") {
        let (_a, a_addr) = wake::start_broker(&pg, 11).await;
        let (_b, b_addr) = wake::start_broker(&pg, 12).await;
        let samples = if plan.quick { 10 } else { 100 };
        for kind in wake::KINDS {
            for across in [false, true] {
                let actor = if across { a_addr } else { b_addr };
                let tag = if across { "x" } else { "o" };
                let (l, n) = wake::run(kind, actor, b_addr, tag, samples).await;
                rows.extend(wake::rows(kind, across, &l, n));
            }
        }
        eprintln!("measured wake latency");
    }

    // 8. The serving limiter under the consume loads: the adaptive limit against a fixed one.
    if runs("limiter") {
        rows.extend(limiter::limiter_scenario(&pg, plan.consume_total).await);
        eprintln!("measured the limiter");
    }

    // 12. Many concurrent consumers, with the limiter traced.
    if runs("consumers") {
        rows.extend(
            consumers::consumers_scenario(
                &pg,
                plan.consume_total,
                plan.many_consumers,
                &mut limiter_series,
            )
            .await,
        );
        eprintln!("measured many consumers");
    }

    // 9. Retention: a soak, and the cost of one pass.
    if runs("retention") {
        rows.extend(
            retention::retention_scenario(
                &pg,
                &cfg,
                // BENCH_SOAK_SECS: another soak length (a profiling aid).
                std::env::var("BENCH_SOAK_SECS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(plan.soak_secs),
                plan.retention_sizes,
            )
            .await,
        );
        eprintln!("measured retention");
    }

    // 11. JWT auth on against off.
    if runs("auth") {
        rows.extend(auth::auth_scenario(&pg, plan.secs, plan.consume_total).await);
        eprintln!("measured auth");
    }

    // 10. Last: PostgreSQL restarted under load (every connection of this process is cut).
    if runs("restart") {
        rows.extend(restart::restart_scenario(addr, if plan.quick { 1 } else { 3 }).await);
        eprintln!("measured a PostgreSQL restart");
    }

    print_table(&plan, &rows);
    let out: Vec<_> = rows
        .iter()
        .map(|r| json!({"scenario": r.scenario, "metric": r.metric, "broker": r.broker, "baseline": r.baseline_name, "baselineValue": r.baseline, "ratio": r.ratio()}))
        .collect();
    let doc = json!({"mode": if plan.quick { "quick" } else { "full" }, "seconds": plan.secs, "rows": out, "limiterSeries": limiter_series});
    if let Err(e) = std::fs::write(
        &json_path,
        serde_json::to_vec_pretty(&doc).unwrap_or_default(),
    ) {
        eprintln!("cannot write {json_path}: {e}");
    }
    drop(setup);
    app.shutting_down.send_replace(true);
    queen_storage_pg::testing::drop_database(name).await;
}
