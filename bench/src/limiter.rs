//! Scenario 8: the serving limiter. The same consume loads under the adaptive limiter and
//! under a fixed limit (the admission-arbiter alternative: a constant number of permits, as
//! large as the pool allows), with the adaptive limit sampled every 10 ms while it runs. A limiter
//! that settles far below the fixed limit while the fixed limit moves more messages is
//! throttling work the database had room for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_core::limiter::LimiterConfig;
use queen_server::config::ServerConfig;

use crate::util::Row;

/// The fixed limit compared: the pool the benchmark's brokers have (32 connections).
pub const FIXED_PERMITS: u32 = 32;

/// One load: leased (pop + batch ack) or autoAck consumers on some partitions, and optionally
/// pollers of a queue that does not exist (each of their pops takes a permit and finds no
/// candidate: the mixed load under which a limiter fed empty samples misjudges).
pub struct Load {
    pub partitions: usize,
    pub consumers: usize,
    pub auto_ack: bool,
    pub idle_pollers: usize,
}

pub const LOADS: [Load; 4] = [
    Load {
        partitions: 1000,
        consumers: 16,
        auto_ack: false,
        idle_pollers: 0,
    },
    Load {
        partitions: 10,
        consumers: 16,
        auto_ack: true,
        idle_pollers: 0,
    },
    // More consumers than the fixed limit: the limit binds.
    Load {
        partitions: 1000,
        consumers: 64,
        auto_ack: false,
        idle_pollers: 0,
    },
    Load {
        partitions: 1000,
        consumers: 16,
        auto_ack: false,
        idle_pollers: 16,
    },
];

/// Limit samples of one run: (mean, min, max).
fn summary(samples: &[u32]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let sum: u64 = samples.iter().map(|s| u64::from(*s)).sum();
    let min = samples.iter().copied().min().map_or(f64::NAN, f64::from);
    let max = samples.iter().copied().max().map_or(f64::NAN, f64::from);
    (sum as f64 / samples.len() as f64, min, max)
}

async fn run(
    pg: &queen_storage_pg::PgStorage,
    load: &Load,
    limiter: LimiterConfig,
    tag: &str,
    total: usize,
) -> (f64, Vec<u32>) {
    let config = ServerConfig {
        limiter,
        ..crate::bench_config()
    };
    let (app, addr) = crate::start_with(pg, config, 21).await;
    let trace = LimitTrace::start(&app, Duration::from_millis(10));
    let stop = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..load.idle_pollers)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut c = queen_raw_client::Client::connect(addr).await;
                while !stop.load(Ordering::Relaxed) {
                    let r = c.get("/api/v1/pop/queue/limiter-missing?wait=false").await;
                    assert_eq!(r.status, 204);
                }
            })
        })
        .collect();
    let queue = format!(
        "limiter-{tag}-{}-{}-{}-{}",
        load.partitions, load.consumers, load.auto_ack, load.idle_pollers
    );
    let rate = crate::consume::broker_rate(
        &app,
        &crate::util::Endpoint::open(addr),
        &queue,
        load.partitions,
        load.consumers,
        if load.auto_ack {
            crate::consume::Consume::AutoAck
        } else {
            crate::consume::Consume::Leased
        },
        total,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = trace.stop().await.iter().map(|s| s.limit).collect();
    for p in pollers {
        crate::util::joined(p.await);
    }
    app.shutting_down.send_replace(true);
    (rate, samples)
}

/// One sample of a broker's serving limiter, with the machine's idle share at that moment.
#[derive(Clone, Copy, Debug)]
pub struct LimitSample {
    /// Since the trace started.
    pub at_ms: u64,
    pub limit: u32,
    pub in_flight: u32,
    /// Share of the machine's CPU time idle since the previous sample, in percent (/proc/stat).
    pub idle_pct: f64,
}

/// The limiter's limit over time while a load runs.
pub struct LimitTrace {
    samples: Arc<Mutex<Vec<LimitSample>>>,
    stop: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<()>,
}

/// (idle, total) jiffies of the machine, from the first line of /proc/stat.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: idle and iowait are idle cores.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (idle, fields.iter().sum())
}

impl LimitTrace {
    pub fn start(app: &Arc<queen_server::broker::Broker>, every: Duration) -> LimitTrace {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (app, samples, stop) = (app.clone(), samples.clone(), stop.clone());
            tokio::spawn(async move {
                let start = std::time::Instant::now();
                let mut last = machine_jiffies();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(every).await;
                    let (limit, in_flight) = app.limiter.state();
                    let now = machine_jiffies();
                    let (idle, total) =
                        (now.0.saturating_sub(last.0), now.1.saturating_sub(last.1));
                    last = now;
                    let sample = LimitSample {
                        at_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                        limit,
                        in_flight,
                        idle_pct: if total == 0 {
                            f64::NAN
                        } else {
                            idle as f64 * 100.0 / total as f64
                        },
                    };
                    if let Ok(mut s) = samples.lock() {
                        s.push(sample);
                    }
                }
            })
        };
        LimitTrace {
            samples,
            stop,
            sampler,
        }
    }

    pub async fn stop(self) -> Vec<LimitSample> {
        self.stop.store(true, Ordering::Relaxed);
        crate::util::joined(self.sampler.await);
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Cores at least this idle (percent of the machine) count as room the limiter left unused.
const IDLE_ROOM_PCT: f64 = 25.0;

/// What a trace shows, as rows: where the limit sat, and how often it held work back while the
/// cores had room (every permit taken, a quarter of the machine idle). A limiter that collapses
/// shows a low minimum; one stuck at a fixed point while cores idle shows a high share of
/// such samples.
pub fn trace_rows(label: &str, samples: &[LimitSample]) -> Vec<Row> {
    let limits: Vec<u32> = samples.iter().map(|s| s.limit).collect();
    let (mean, min, max) = summary(&limits);
    let measured: Vec<&LimitSample> = samples.iter().filter(|s| !s.idle_pct.is_nan()).collect();
    let held_back = measured
        .iter()
        .filter(|s| s.in_flight >= s.limit && s.idle_pct >= IDLE_ROOM_PCT)
        .count();
    let held_back_pct = if measured.is_empty() {
        f64::NAN
    } else {
        held_back as f64 * 100.0 / measured.len() as f64
    };
    let label = format!("{label}, limiter over time");
    vec![
        Row::new(label.clone(), "mean limit", mean, "-", f64::NAN),
        Row::new(label.clone(), "min limit", min, "-", f64::NAN),
        Row::new(label.clone(), "max limit", max, "-", f64::NAN),
        Row::new(
            label,
            "% samples all permits taken, cores >= 25% idle",
            held_back_pct,
            "-",
            f64::NAN,
        ),
    ]
}

/// A trace as the JSON report keeps it: [ms, limit, in flight, idle %] per sample.
pub fn trace_json(label: &str, samples: &[LimitSample]) -> serde_json::Value {
    serde_json::json!({
        "scenario": label,
        "samples": samples
            .iter()
            .map(|s| serde_json::json!([s.at_ms, s.limit, s.in_flight, (s.idle_pct * 10.0).round() / 10.0]))
            .collect::<Vec<_>>(),
    })
}

/// Per load: the adaptive limiter's throughput against the fixed limit's, and where its limit sat.
pub async fn limiter_scenario(pg: &queen_storage_pg::PgStorage, total: usize) -> Vec<Row> {
    let fixed = LimiterConfig {
        initial_limit: FIXED_PERMITS,
        min_limit: FIXED_PERMITS,
        max_limit: FIXED_PERMITS,
        ..LimiterConfig::default()
    };
    let mut rows = vec![];
    for load in &LOADS {
        let (adaptive_rate, samples) =
            run(pg, load, LimiterConfig::default(), "adaptive", total).await;
        let (fixed_rate, _) = run(pg, load, fixed, "fixed", total).await;
        let (mean, min, max) = summary(&samples);
        let label = format!(
            "limiter, adaptive, consume {}, {} partitions, {} consumers{}",
            if load.auto_ack { "autoAck" } else { "leased" },
            load.partitions,
            load.consumers,
            if load.idle_pollers > 0 {
                format!(" + {} pollers of a missing queue", load.idle_pollers)
            } else {
                String::new()
            }
        );
        let fixed_name = format!("fixed {FIXED_PERMITS} permits");
        rows.push(Row::new(
            label.clone(),
            "msg/s",
            adaptive_rate,
            fixed_name.clone(),
            fixed_rate,
        ));
        rows.push(Row::new(
            label.clone(),
            "mean limit",
            mean,
            fixed_name.clone(),
            f64::from(FIXED_PERMITS),
        ));
        rows.push(Row::new(
            label.clone(),
            "min limit",
            min,
            fixed_name.clone(),
            f64::from(FIXED_PERMITS),
        ));
        rows.push(Row::new(
            label,
            "max limit",
            max,
            fixed_name,
            f64::from(FIXED_PERMITS),
        ));
    }
    rows
}
