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

/// One load: leased (pop + batch ack) or autoAck consumers on some partitions.
pub struct Load {
    pub partitions: usize,
    pub consumers: usize,
    pub auto_ack: bool,
}

pub const LOADS: [Load; 2] = [
    Load {
        partitions: 1000,
        consumers: 16,
        auto_ack: false,
    },
    Load {
        partitions: 10,
        consumers: 16,
        auto_ack: true,
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
    let queue = format!(
        "limiter-{tag}-{}-{}-{}",
        load.partitions, load.consumers, load.auto_ack
    );
    let rate = crate::consume::broker_rate(
        &app,
        addr,
        &queue,
        load.partitions,
        load.consumers,
        load.auto_ack,
        total,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    crate::util::joined(sampler.await);
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
            "limiter, Vegas, consume {}, {} partitions, {} consumers",
            if load.auto_ack { "autoAck" } else { "leased" },
            load.partitions,
            load.consumers
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
