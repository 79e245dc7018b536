//! Each broker's per-minute sample (`queen.worker_samples`): the counters' growth since the
//! last sample, the delivery lag, CPU, RSS, pool and parked pops. The status and analytics
//! routes chart them, across every broker of the cluster. Samples older than
//! `SAMPLE_RETENTION_SECS` are removed by whichever broker writes next.

use std::sync::{Arc, Weak};
use std::time::Duration;

use queen_core::storage::WorkerSample;
use queen_core::Timestamp;

use crate::broker::Broker;

/// A week of samples, as Queen keeps its worker metrics.
const SAMPLE_RETENTION_SECS: i64 = 7 * 24 * 3600;

/// Cumulative readings at one sample.
#[derive(Default, Clone, Copy)]
struct Readings {
    push_requests: u64,
    push_messages: u64,
    pop_requests: u64,
    pop_messages: u64,
    pop_empty: u64,
    ack_requests: u64,
    ack_messages: u64,
    ack_failed: u64,
    dead_lettered: u64,
    errors: u64,
    lag_sum_us: u64,
    cpu_user_ticks: u64,
    cpu_system_ticks: u64,
}

fn read(broker: &Broker) -> (Readings, u64) {
    let m = &broker.metrics;
    let (lag_sum_us, lag_max_us) = m.take_lag_window();
    let (cpu_user_ticks, cpu_system_ticks) = cpu_ticks();
    (
        Readings {
            push_requests: m.pushes.get() + m.pushes_buffered.get(),
            push_messages: m.messages_pushed.get(),
            pop_requests: m.pops_messages.get() + m.pops_empty.get() + m.pops_error.get(),
            pop_messages: m.messages_delivered.get(),
            pop_empty: m.pops_empty.get(),
            ack_requests: m.ack_requests.get(),
            ack_messages: m.acks.get(),
            ack_failed: m.acks_refused.get(),
            dead_lettered: m.dead_lettered.get(),
            errors: m.server_errors.get(),
            lag_sum_us,
            cpu_user_ticks,
            cpu_system_ticks,
        },
        lag_max_us,
    )
}

/// utime and stime of this process, in clock ticks (Linux; 0 elsewhere).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
    (tick(11), tick(12))
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn minute_of(t: Timestamp) -> Timestamp {
    Timestamp(t.0 - t.0.rem_euclid(60_000_000))
}

/// Writes a sample every `interval` until the broker is gone or shutting down.
pub async fn sampler(
    broker: Weak<Broker>,
    interval: Duration,
    hostname: String,
    worker_id: String,
) {
    const TICKS_PER_SEC: f64 = 100.0;
    let Some(first) = broker.upgrade() else {
        return;
    };
    let (mut last, _) = read(&first);
    drop(first);
    loop {
        tokio::time::sleep(interval).await;
        let Some(broker) = broker.upgrade() else {
            return;
        };
        if *broker.shutting_down.borrow() {
            return;
        }
        let (now, lag_max_us) = read(&broker);
        let d = |f: fn(&Readings) -> u64| f(&now).saturating_sub(f(&last));
        let delivered = d(|r| r.pop_messages);
        let secs = interval.as_secs_f64().max(0.001);
        let usage = broker.storage.health.usage();
        let at = broker.now();
        let sample = WorkerSample {
            hostname: hostname.clone(),
            worker_id: worker_id.clone(),
            bucket: minute_of(at),
            push_requests: d(|r| r.push_requests),
            push_messages: d(|r| r.push_messages),
            pop_requests: d(|r| r.pop_requests),
            pop_messages: delivered,
            pop_empty: d(|r| r.pop_empty),
            ack_requests: d(|r| r.ack_requests),
            ack_messages: d(|r| r.ack_messages),
            ack_failed: d(|r| r.ack_failed),
            dead_lettered: d(|r| r.dead_lettered),
            db_errors: d(|r| r.errors),
            lag_avg_ms: if delivered == 0 {
                0.0
            } else {
                d(|r| r.lag_sum_us) as f64 / delivered as f64 / 1000.0
            },
            lag_max_ms: lag_max_us as f64 / 1000.0,
            cpu_user_pct: d(|r| r.cpu_user_ticks) as f64 / TICKS_PER_SEC / secs * 100.0,
            cpu_system_pct: d(|r| r.cpu_system_ticks) as f64 / TICKS_PER_SEC / secs * 100.0,
            rss_bytes: rss_bytes(),
            pool_size: usage.pool_size as u64,
            pool_in_use: usage.pool_in_use as u64,
            parked: u64::try_from(broker.metrics.parked.get()).unwrap_or(0),
        };
        match broker.storage.inspect.record_sample(sample).await {
            Ok(()) => {
                last = now;
                if let Err(e) = broker
                    .storage
                    .inspect
                    .remove_samples_before(at.minus_secs(SAMPLE_RETENTION_SECS))
                    .await
                {
                    tracing::debug!(error = %e, "removing old worker samples");
                }
            }
            // Kept for the next try: the minute's counts go into the next sample.
            Err(e) => tracing::debug!(error = %e, "recording the worker sample"),
        }
    }
}

/// Starts the sampler of `broker` when its interval is not 0.
pub fn start(broker: &Arc<Broker>) {
    let ms = broker.config.sample_interval_ms;
    if ms == 0 {
        return;
    }
    let hostname = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let worker_id = format!(
        "{}-{}",
        broker.config.port,
        &broker.mint_uuid().simple().to_string()[..8]
    );
    tokio::spawn(sampler(
        Arc::downgrade(broker),
        Duration::from_millis(ms),
        hostname,
        worker_id,
    ));
}
