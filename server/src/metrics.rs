//! Counters for /metrics (JSON) and /metrics/prometheus (text).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub pops_messages: AtomicU64,
    pub pops_empty: AtomicU64,
    pub pops_error: AtomicU64,
    pub pops_cancelled: AtomicU64,
    /// Wake signals a simulation dropped on purpose.
    pub wakes_dropped: AtomicU64,
    pub parked: AtomicU64,
    pub wakes: AtomicU64,
    pub storage_calls: AtomicU64,
    pub messages_delivered: AtomicU64,
    pub pushes: AtomicU64,
    pub messages_pushed: AtomicU64,
    pub duplicates: AtomicU64,
    pub acks: AtomicU64,
    pub acks_refused: AtomicU64,
    pub bad_requests: AtomicU64,
    pub server_errors: AtomicU64,
    /// Delivery lag (now - createdAt) of delivered messages, microseconds.
    pub lag_sum_us: AtomicU64,
    pub lag_max_us: AtomicU64,
    /// Deliverability events applied, by `EVENT_KINDS` index.
    events: [AtomicU64; EVENT_KINDS.len()],
}

/// The kinds of `DeliveryEvent::kind`, plus the wheel ticker's revisits.
pub const EVENT_KINDS: [&str; 6] = [
    "push",
    "release",
    "group_reset",
    "queue_changed",
    "resync",
    "revisit",
];

impl Metrics {
    pub fn count_event(&self, kind: &str) {
        match EVENT_KINDS.iter().position(|k| *k == kind) {
            Some(i) => {
                self.events[i].fetch_add(1, Ordering::Relaxed);
            }
            None => debug_assert!(false, "unknown event kind {kind}"),
        }
    }

    fn events_by_kind(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        EVENT_KINDS
            .iter()
            .zip(&self.events)
            .map(|(k, c)| (*k, c.load(Ordering::Relaxed)))
    }

    pub fn record_lag(&self, lag_us: u64) {
        self.lag_sum_us.fetch_add(lag_us, Ordering::Relaxed);
        self.lag_max_us.fetch_max(lag_us, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// A snapshot with the gauges the app adds.
pub struct Snapshot<'a> {
    pub metrics: &'a Metrics,
    pub limiter_limit: u32,
    pub limiter_in_flight: u32,
    pub pool_in_use: usize,
    pub pool_size: usize,
    pub backend: &'static str,
}

impl Snapshot<'_> {
    pub fn json(&self) -> serde_json::Value {
        let m = self.metrics;
        let g = Metrics::get;
        let delivered = g(&m.messages_delivered);
        serde_json::json!({
            "backend": self.backend,
            "pops": {
                "messages": g(&m.pops_messages),
                "empty": g(&m.pops_empty),
                "error": g(&m.pops_error),
                "cancelled": g(&m.pops_cancelled),
            },
            "parkedPops": g(&m.parked),
            "wakes": g(&m.wakes),
            "deliveryEvents": m
                .events_by_kind()
                .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                .collect::<serde_json::Map<String, serde_json::Value>>(),
            "storageCalls": g(&m.storage_calls),
            "messagesDelivered": delivered,
            "pushes": g(&m.pushes),
            "messagesPushed": g(&m.messages_pushed),
            "duplicates": g(&m.duplicates),
            "acks": g(&m.acks),
            "acksRefused": g(&m.acks_refused),
            "badRequests": g(&m.bad_requests),
            "serverErrors": g(&m.server_errors),
            "limiter": { "limit": self.limiter_limit, "inFlight": self.limiter_in_flight },
            "pool": { "inUse": self.pool_in_use, "size": self.pool_size },
            "deliveryLagMs": {
                "avg": if delivered == 0 { 0.0 } else { g(&m.lag_sum_us) as f64 / delivered as f64 / 1000.0 },
                "max": g(&m.lag_max_us) as f64 / 1000.0,
            },
        })
    }

    pub fn prometheus(&self) -> String {
        let m = self.metrics;
        let g = Metrics::get;
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in samples {
                out.push_str(&format!("{name}{labels} {v}\n"));
            }
        };
        metric(
            "queen_pops_total",
            "counter",
            "Pop requests by outcome.",
            &[
                ("{outcome=\"messages\"}", g(&m.pops_messages) as f64),
                ("{outcome=\"empty\"}", g(&m.pops_empty) as f64),
                ("{outcome=\"error\"}", g(&m.pops_error) as f64),
                ("{outcome=\"cancelled\"}", g(&m.pops_cancelled) as f64),
            ],
        );
        metric(
            "queen_parked_pops",
            "gauge",
            "Long-polls parked on a wake gate.",
            &[("", g(&m.parked) as f64)],
        );
        metric(
            "queen_wakes_total",
            "counter",
            "Wake gate openings that reached a parked pop.",
            &[("", g(&m.wakes) as f64)],
        );
        let events: Vec<(String, f64)> = m
            .events_by_kind()
            .map(|(k, v)| (format!("{{kind=\"{k}\"}}"), v as f64))
            .collect();
        metric(
            "queen_delivery_events_total",
            "counter",
            "Deliverability events applied (local, from other brokers, and wheel revisits).",
            &events
                .iter()
                .map(|(l, v)| (l.as_str(), *v))
                .collect::<Vec<_>>(),
        );
        metric(
            "queen_storage_calls_total",
            "counter",
            "Storage calls made by pops.",
            &[("", g(&m.storage_calls) as f64)],
        );
        metric(
            "queen_messages_delivered_total",
            "counter",
            "Messages delivered by pops.",
            &[("", g(&m.messages_delivered) as f64)],
        );
        metric(
            "queen_messages_pushed_total",
            "counter",
            "Messages stored by pushes.",
            &[("", g(&m.messages_pushed) as f64)],
        );
        metric(
            "queen_acks_total",
            "counter",
            "Ack items processed.",
            &[("", g(&m.acks) as f64)],
        );
        metric(
            "queen_limiter_limit",
            "gauge",
            "Serving limiter concurrency limit.",
            &[("", f64::from(self.limiter_limit))],
        );
        metric(
            "queen_limiter_in_flight",
            "gauge",
            "Serving limiter permits held.",
            &[("", f64::from(self.limiter_in_flight))],
        );
        metric(
            "queen_pool_connections_in_use",
            "gauge",
            "Database connections in use.",
            &[("", self.pool_in_use as f64)],
        );
        metric(
            "queen_pool_connections_max",
            "gauge",
            "Database pool size.",
            &[("", self.pool_size as f64)],
        );
        metric(
            "queen_delivery_lag_seconds_sum",
            "counter",
            "Sum of push-to-delivery lag.",
            &[("", g(&m.lag_sum_us) as f64 / 1e6)],
        );
        metric(
            "queen_delivery_lag_seconds_max",
            "gauge",
            "Largest push-to-delivery lag seen.",
            &[("", g(&m.lag_max_us) as f64 / 1e6)],
        );
        out
    }
}
