//! Scenario 8: the serving limiter. The same consume loads under the adaptive (Vegas) limiter and
//! under a fixed limit (the admission-arbiter alternative: a constant number of permits, as
//! large as the pool allows), with the Vegas limit sampled every 10 ms while it runs. A limiter
//! that settles far below the fixed limit while the fixed limit moves more messages is
//! throttling work the database had room for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_core::limiter::VegasConfig;
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
    vegas: VegasConfig,
    tag: &str,
    total: usize,
) -> (f64, Vec<u32>) {
    let config = ServerConfig {
        vegas,
        ..ServerConfig::default()
    };
    let (app, addr) = crate::start_with(pg, config, 21).await;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (app, samples, stop) = (app.clone(), samples.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (limit, _) = app.limiter.state();
                if let Ok(mut s) = samples.lock() {
                    s.push(limit);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
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
    crate::util::joined(sampler.await);
    for p in pollers {
        crate::util::joined(p.await);
    }
    app.shutting_down.send_replace(true);
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    (rate, samples)
}

/// Per load: Vegas throughput against the fixed limit's, and where the Vegas limit sat.
pub async fn limiter_scenario(pg: &queen_storage_pg::PgStorage, total: usize) -> Vec<Row> {
    let fixed = VegasConfig {
        initial_limit: FIXED_PERMITS,
        min_limit: FIXED_PERMITS,
        max_limit: FIXED_PERMITS,
        ..VegasConfig::default()
    };
    let mut rows = vec![];
    for load in &LOADS {
        let (vegas_rate, samples) = run(pg, load, VegasConfig::default(), "vegas", total).await;
        let (fixed_rate, _) = run(pg, load, fixed, "fixed", total).await;
        let (mean, min, max) = summary(&samples);
        let label = format!(
            "limiter, Vegas, consume {}, {} partitions, {} consumers{}",
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
            vegas_rate,
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
