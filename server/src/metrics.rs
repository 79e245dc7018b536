//! The broker's metrics: counters and gauges from prometheus-client, served as the Prometheus
//! (OpenMetrics) text at /metrics/prometheus and as JSON at /metrics.
//!
//! Labelled series are families; each labelled counter the broker bumps is kept as a handle
//! (a clone shares the family's atomic), so the hot paths pay one atomic add, never a lookup.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use queen_core::storage::{Removed, RetentionPass};

fn pass_name(pass: RetentionPass) -> &'static str {
    match pass {
        RetentionPass::Retention => "retention",
        RetentionPass::Eviction => "eviction",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FormLabel {
    form: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabel {
    pass: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RemovedLabel {
    pass: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub queue: String,
    pub consumer_group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub queue: String,
    pub partition: String,
    pub consumer_group: String,
}

/// The series read from storage at each scrape: what the queues and groups hold now.
#[derive(Default)]
pub struct StoredState {
    pub queue_depth: Family<QueueLabel, Gauge>,
    pub queue_messages: Family<QueueLabel, Gauge>,
    pub queue_in_flight: Family<QueueLabel, Gauge>,
    pub queue_partitions: Family<QueueLabel, Gauge>,
    pub dlq_depth: Family<QueueLabel, Gauge>,
    pub group_lag: Family<GroupLabel, Gauge>,
    pub group_lag_seconds: Family<GroupLabel, Gauge>,
    pub partition_lag: Family<PartitionLabel, Gauge>,
    /// Partition series left out by the cardinality cap at the last scrape.
    pub partition_series_omitted: Gauge,
    /// 1 when the last scrape could read storage, else 0 (the families keep their last values).
    pub read_ok: Gauge,
    /// One scrape at a time clears and sets the families.
    pub scrape: tokio::sync::Mutex<()>,
}

impl StoredState {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "queue_depth",
            "Messages of a queue its slowest consumer group has not consumed",
            self.queue_depth.clone(),
        );
        registry.register(
            "queue_messages",
            "Messages a queue stores (retained)",
            self.queue_messages.clone(),
        );
        registry.register(
            "queue_in_flight",
            "Messages of a queue leased and not yet acknowledged",
            self.queue_in_flight.clone(),
        );
        registry.register(
            "queue_partitions",
            "Partitions of a queue",
            self.queue_partitions.clone(),
        );
        registry.register(
            "dlq_depth",
            "Dead letters of a queue",
            self.dlq_depth.clone(),
        );
        registry.register(
            "consumergroup_lag",
            "Messages a consumer group has not consumed, per queue (summed over partitions)",
            self.group_lag.clone(),
        );
        registry.register(
            "consumergroup_lag_seconds",
            "Age of the oldest message a consumer group has not consumed, per queue",
            self.group_lag_seconds.clone(),
        );
        registry.register(
            "partition_lag",
            "Messages a consumer group has not consumed on one partition (capped: METRICS_PARTITION_SERIES)",
            self.partition_lag.clone(),
        );
        registry.register(
            "partition_series_omitted",
            "Partition lag series the cardinality cap left out at the last scrape",
            self.partition_series_omitted.clone(),
        );
        registry.register(
            "stored_state_ok",
            "Whether the last scrape read the queue and group series from storage",
            self.read_ok.clone(),
        );
    }

    /// Forgets every labelled series before a scrape sets the current ones (a deleted queue's
    /// series disappear).
    pub fn clear(&self) {
        self.queue_depth.clear();
        self.queue_messages.clear();
        self.queue_in_flight.clear();
        self.queue_partitions.clear();
        self.dlq_depth.clear();
        self.group_lag.clear();
        self.group_lag_seconds.clear();
        self.partition_lag.clear();
    }
}

/// A storage error a route answered for (with 503, or an empty 204 for a pop): which route
/// family met it and its SQLSTATE ("none" when the database gave none, e.g. a cut connection).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StorageErrorLabel {
    route: &'static str,
    sqlstate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
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

pub struct Metrics {
    pub pops_messages: Counter,
    pub pops_empty: Counter,
    pub pops_error: Counter,
    pub pops_cancelled: Counter,
    /// Wake signals a simulation dropped on purpose.
    pub wakes_dropped: Counter,
    pub parked: Gauge,
    pub wakes: Counter,
    /// Parked pops that resumed on a wake (not their timer).
    pub pops_woken: Counter,
    /// Wakes a queue-wide pop handed on to another parked pop of its group.
    pub wakes_passed: Counter,
    pub storage_calls: Counter,
    pub messages_delivered: Counter,
    pub pushes: Counter,
    /// Push requests written to the file buffer.
    pub pushes_buffered: Counter,
    pub messages_pushed: Counter,
    pub duplicates: Counter,
    pub acks: Counter,
    pub acks_refused: Counter,
    /// Ack requests (single and batch).
    pub ack_requests: Counter,
    /// Batches acked whole through the delivery ledger (one cursor write each).
    pub whole_batch_acks: Counter,
    /// Messages acks sent to the dead-letter queue.
    pub dead_lettered: Counter,
    /// Timers whose message this broker pushed.
    pub timers_fired: Counter,
    pub bad_requests: Counter,
    pub server_errors: Counter,
    /// Requests and answers in Queen 2.x's binary forms.
    pub binary_pushes: Counter,
    pub binary_transactions: Counter,
    pub framed_pops: Counter,
    /// Deliverability events applied, by `EVENT_KINDS` index.
    events: [Counter; EVENT_KINDS.len()],
    delivery_lag: Histogram,
    /// For the JSON form's average and maximum (a histogram keeps neither exactly).
    lag_sum_us: AtomicU64,
    lag_max_us: AtomicU64,
    /// The largest lag since the sampler last took it (the per-minute samples' maximum).
    lag_window_max_us: AtomicU64,
    lag_max_seconds: Gauge<f64, AtomicU64>,
    /// How far the database's clock is ahead of this host's (`tasks::db_clock`).
    pub database_clock_ahead_seconds: Gauge<f64, AtomicU64>,
    /// The age of the oldest transaction or snapshot open in the database (`tasks::snapshot_watch`).
    pub database_oldest_snapshot_seconds: Gauge<f64, AtomicU64>,
    /// Read at scrape time from the limiter and the backend.
    limiter_limit: Gauge,
    limiter_in_flight: Gauge,
    pool_in_use: Gauge,
    pool_size: Gauge,
    retention_runs: Family<PassLabel, Counter>,
    storage_errors: Family<StorageErrorLabel, Counter>,
    retention_removed: Family<RemovedLabel, Counter>,
    /// Storage call durations by operation (push, pop, ack).
    storage_seconds: Family<OpLabel, Histogram>,
    /// From a wake gate opening to the parked pop it woke resuming.
    wake_latency: Histogram,
    pub stored: StoredState,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("queen");
        let pops = Family::<OutcomeLabel, Counter>::default();
        let pop = |outcome| pops.get_or_create(&OutcomeLabel { outcome }).clone();
        let (pops_messages, pops_empty, pops_error, pops_cancelled) = (
            pop("messages"),
            pop("empty"),
            pop("error"),
            pop("cancelled"),
        );
        let events_family = Family::<KindLabel, Counter>::default();
        let events =
            EVENT_KINDS.map(|kind| events_family.get_or_create(&KindLabel { kind }).clone());
        let failed = Family::<ClassLabel, Counter>::default();
        let bad_requests = failed
            .get_or_create(&ClassLabel { class: "client" })
            .clone();
        let server_errors = failed
            .get_or_create(&ClassLabel { class: "server" })
            .clone();
        let forms = Family::<FormLabel, Counter>::default();
        let form = |form| forms.get_or_create(&FormLabel { form }).clone();
        let (binary_pushes, binary_transactions, framed_pops) =
            (form("QPB1"), form("QTB1"), form("QPF1"));
        let m = Metrics {
            binary_pushes,
            binary_transactions,
            framed_pops,
            pops_messages,
            pops_empty,
            pops_error,
            pops_cancelled,
            wakes_dropped: Counter::default(),
            parked: Gauge::default(),
            wakes: Counter::default(),
            pops_woken: Counter::default(),
            wakes_passed: Counter::default(),
            storage_calls: Counter::default(),
            messages_delivered: Counter::default(),
            pushes: Counter::default(),
            pushes_buffered: Counter::default(),
            messages_pushed: Counter::default(),
            duplicates: Counter::default(),
            acks: Counter::default(),
            acks_refused: Counter::default(),
            ack_requests: Counter::default(),
            whole_batch_acks: Counter::default(),
            dead_lettered: Counter::default(),
            timers_fired: Counter::default(),
            bad_requests,
            server_errors,
            events,
            // 1 ms to about 65 s.
            delivery_lag: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            lag_sum_us: AtomicU64::new(0),
            lag_max_us: AtomicU64::new(0),
            lag_window_max_us: AtomicU64::new(0),
            lag_max_seconds: Gauge::default(),
            database_clock_ahead_seconds: Gauge::default(),
            database_oldest_snapshot_seconds: Gauge::default(),
            limiter_limit: Gauge::default(),
            limiter_in_flight: Gauge::default(),
            pool_in_use: Gauge::default(),
            pool_size: Gauge::default(),
            retention_runs: Family::default(),
            storage_errors: Family::default(),
            retention_removed: Family::default(),
            // 100 µs to about 6.5 s.
            storage_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 17))
            }),
            // 10 µs to about 0.6 s.
            wake_latency: Histogram::new(exponential_buckets(0.00001, 2.0, 17)),
            stored: StoredState::default(),
            registry: Registry::default(),
        };
        m.register(
            &mut registry,
            LabelledFamilies {
                pops,
                events: events_family,
                failed,
                forms,
            },
        );
        Metrics { registry, ..m }
    }
}

/// The families whose members `Metrics` keeps as separate fields, registered whole.
struct LabelledFamilies {
    pops: Family<OutcomeLabel, Counter>,
    events: Family<KindLabel, Counter>,
    failed: Family<ClassLabel, Counter>,
    forms: Family<FormLabel, Counter>,
}

impl Metrics {
    /// Every series under its OpenMetrics name and help text: the pop path's here, the rest in
    /// `register_requests` and `register_database`.
    fn register(&self, registry: &mut Registry, families: LabelledFamilies) {
        let m = self;
        let LabelledFamilies {
            pops,
            events: events_family,
            failed,
            forms,
        } = families;
        registry.register(
            "storage_duration_seconds",
            "Storage call durations, by operation (push, pop, ack)",
            m.storage_seconds.clone(),
        );
        registry.register(
            "wake_latency_seconds",
            "From a wake gate opening to the parked pop it woke resuming",
            m.wake_latency.clone(),
        );
        m.stored.register(registry);
        registry.register("pops", "Pop requests by outcome", pops);
        registry.register(
            "parked_pops",
            "Long-polls parked on a wake gate",
            m.parked.clone(),
        );
        registry.register(
            "wakes",
            "Wake gate openings that reached a parked pop",
            m.wakes.clone(),
        );
        registry.register(
            "parked_pops_woken",
            "Parked pops that resumed on a wake rather than their timer",
            m.pops_woken.clone(),
        );
        registry.register(
        "wakes_passed",
        "Wakes a queue-wide pop handed on to another parked pop of its group (it may have left work behind)",
        m.wakes_passed.clone(),
    );
        registry.register(
            "delivery_events",
            "Deliverability events applied (local, from other brokers, and wheel revisits)",
            events_family,
        );
        registry.register(
            "storage_calls",
            "Storage calls made by pops",
            m.storage_calls.clone(),
        );
        registry.register(
            "messages_delivered",
            "Messages delivered by pops",
            m.messages_delivered.clone(),
        );
        self.register_requests(registry, forms, failed);
        self.register_database(registry);
    }

    /// Pushes, acks, timers, the binary forms, failed requests and delivery lag.
    fn register_requests(
        &self,
        registry: &mut Registry,
        forms: Family<FormLabel, Counter>,
        failed: Family<ClassLabel, Counter>,
    ) {
        let m = self;
        registry.register("pushes", "Push requests stored", m.pushes.clone());
        registry.register(
            "pushes_buffered",
            "Push requests written to the file buffer",
            m.pushes_buffered.clone(),
        );
        registry.register(
            "messages_pushed",
            "Messages stored by pushes",
            m.messages_pushed.clone(),
        );
        registry.register(
            "duplicates",
            "Pushed items answered as duplicates",
            m.duplicates.clone(),
        );
        registry.register("acks", "Ack items processed", m.acks.clone());
        registry.register(
            "acks_refused",
            "Ack items storage refused",
            m.acks_refused.clone(),
        );
        registry.register(
            "ack_requests",
            "Ack requests (single and batch)",
            m.ack_requests.clone(),
        );
        registry.register(
            "whole_batch_acks",
            "Delivered batches acked whole in one cursor write (the rest are acked item by item)",
            m.whole_batch_acks.clone(),
        );
        registry.register(
            "dead_lettered",
            "Messages acks moved to the dead-letter queue",
            m.dead_lettered.clone(),
        );
        registry.register(
            "timers_fired",
            "Timers whose message this broker pushed (each timer fires once, on one broker)",
            m.timers_fired.clone(),
        );
        registry.register(
            "binary_requests",
            "Binary push and transaction requests, and framed pop answers, by form",
            forms,
        );
        registry.register(
            "requests_failed",
            "Requests answered with an error, by class (client: 4xx, server: 5xx)",
            failed,
        );
        registry.register(
            "delivery_lag_seconds",
            "Push-to-delivery lag of delivered messages",
            m.delivery_lag.clone(),
        );
        registry.register(
            "delivery_lag_seconds_max",
            "Largest push-to-delivery lag seen",
            m.lag_max_seconds.clone(),
        );
    }

    /// The database's clock and snapshots, the limiter, the pool, retention, storage errors.
    fn register_database(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "database_clock_ahead_seconds",
            "How far the database's clock is ahead of this host's (the broker keeps the database's time)",
            m.database_clock_ahead_seconds.clone(),
        );
        registry.register(
            "database_oldest_snapshot_seconds",
            "Age of the oldest transaction or snapshot open in the database (other roles' sessions need pg_read_all_stats); while one is open PostgreSQL cleans none of the broker's rows deleted or updated since it began",
            m.database_oldest_snapshot_seconds.clone(),
        );
        registry.register(
            "limiter_limit",
            "Serving limiter concurrency limit",
            m.limiter_limit.clone(),
        );
        registry.register(
            "limiter_in_flight",
            "Serving limiter permits held",
            m.limiter_in_flight.clone(),
        );
        registry.register(
            "pool_connections_in_use",
            "Database connections in use",
            m.pool_in_use.clone(),
        );
        registry.register(
            "pool_connections_max",
            "Database pool size",
            m.pool_size.clone(),
        );
        registry.register(
            "retention_runs",
            "Retention and eviction passes, by outcome (skipped: another broker held the lease)",
            m.retention_runs.clone(),
        );
        registry.register(
            "storage_errors",
            "Storage errors a route answered for (503, or an empty pop), by route and SQLSTATE",
            m.storage_errors.clone(),
        );
        registry.register(
            "retention_removed",
            "Rows retention and eviction removed, by kind",
            m.retention_removed.clone(),
        );
    }
}

impl Metrics {
    pub fn count_event(&self, kind: &str) {
        match EVENT_KINDS.iter().position(|k| *k == kind) {
            Some(i) => {
                self.events[i].inc();
            }
            None => debug_assert!(false, "unknown event kind {kind}"),
        }
    }

    fn events_by_kind(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        EVENT_KINDS
            .iter()
            .zip(&self.events)
            .map(|(k, c)| (*k, c.get()))
    }

    /// Counts a storage error a route answered for; the count so far of its (route, SQLSTATE).
    pub fn count_storage_error(&self, route: &'static str, sqlstate: Option<&str>) -> u64 {
        self.storage_errors
            .get_or_create(&StorageErrorLabel {
                route,
                sqlstate: sqlstate.unwrap_or("none").to_string(),
            })
            .inc()
            + 1
    }

    /// How many storage errors of (route, SQLSTATE) were counted ("none": no SQLSTATE).
    pub fn storage_error_count(&self, route: &'static str, sqlstate: &str) -> u64 {
        self.storage_errors
            .get_or_create(&StorageErrorLabel {
                route,
                sqlstate: sqlstate.to_string(),
            })
            .get()
    }

    pub fn count_retention_run(&self, pass: RetentionPass, outcome: &'static str) {
        self.retention_runs
            .get_or_create(&PassLabel {
                pass: pass_name(pass),
                outcome,
            })
            .inc();
    }

    pub fn count_retention(&self, pass: RetentionPass, removed: &Removed, partitions: u64) {
        let pass = pass_name(pass);
        for (kind, n) in [
            ("segments", removed.segments),
            ("messages", removed.messages),
            ("dedup_rows", removed.dedup_rows),
            ("dead_letters", removed.dead_letters),
            ("partitions", partitions),
        ] {
            if n > 0 {
                self.retention_removed
                    .get_or_create(&RemovedLabel { pass, kind })
                    .inc_by(n);
            }
        }
    }

    /// Rows removed of one kind, over both passes.
    pub fn retention_removed(&self, kind: &'static str) -> u64 {
        ["retention", "eviction"]
            .into_iter()
            .map(|pass| {
                self.retention_removed
                    .get_or_create(&RemovedLabel { pass, kind })
                    .get()
            })
            .sum()
    }

    /// (sum of every delivered message's lag so far, largest lag since the last call), in µs.
    pub fn take_lag_window(&self) -> (u64, u64) {
        (
            self.lag_sum_us.load(Ordering::Relaxed),
            self.lag_window_max_us.swap(0, Ordering::Relaxed),
        )
    }

    pub fn record_storage(&self, op: &'static str, micros: u64) {
        self.storage_seconds
            .get_or_create(&OpLabel { op })
            .observe(micros as f64 / 1e6);
    }

    pub fn record_wake(&self, micros: u64) {
        self.pops_woken.inc();
        self.wake_latency.observe(micros as f64 / 1e6);
    }

    pub fn record_lag(&self, lag_us: u64) {
        self.delivery_lag.observe(lag_us as f64 / 1e6);
        self.lag_sum_us.fetch_add(lag_us, Ordering::Relaxed);
        self.lag_window_max_us.fetch_max(lag_us, Ordering::Relaxed);
        let max = self
            .lag_max_us
            .fetch_max(lag_us, Ordering::Relaxed)
            .max(lag_us);
        self.lag_max_seconds.set(max as f64 / 1e6);
    }
}

/// A snapshot with the gauges the broker adds.
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
        let delivered = m.messages_delivered.get();
        let lag_sum_us = m.lag_sum_us.load(Ordering::Relaxed);
        serde_json::json!({
            "backend": self.backend,
            "pops": {
                "messages": m.pops_messages.get(),
                "empty": m.pops_empty.get(),
                "error": m.pops_error.get(),
                "cancelled": m.pops_cancelled.get(),
            },
            "parkedPops": m.parked.get(),
            "wakes": m.wakes.get(),
            "popsWoken": m.pops_woken.get(),
            "wakesPassed": m.wakes_passed.get(),
            "deliveryEvents": m
                .events_by_kind()
                .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                .collect::<serde_json::Map<String, serde_json::Value>>(),
            "storageCalls": m.storage_calls.get(),
            "messagesDelivered": delivered,
            "pushes": m.pushes.get(),
            "pushesBuffered": m.pushes_buffered.get(),
            "messagesPushed": m.messages_pushed.get(),
            "duplicates": m.duplicates.get(),
            "acks": m.acks.get(),
            "acksRefused": m.acks_refused.get(),
            "wholeBatchAcks": m.whole_batch_acks.get(),
            "badRequests": m.bad_requests.get(),
            "serverErrors": m.server_errors.get(),
            "binary": {
                "pushes": m.binary_pushes.get(),
                "transactions": m.binary_transactions.get(),
                "framedPops": m.framed_pops.get(),
            },
            "limiter": { "limit": self.limiter_limit, "inFlight": self.limiter_in_flight },
            "pool": { "inUse": self.pool_in_use, "size": self.pool_size },
            "databaseClockAheadMs": m.database_clock_ahead_seconds.get() * 1000.0,
            "databaseOldestSnapshotSeconds": m.database_oldest_snapshot_seconds.get(),
            "retentionRemoved": {
                "segments": m.retention_removed("segments"),
                "messages": m.retention_removed("messages"),
                "dedupRows": m.retention_removed("dedup_rows"),
                "deadLetters": m.retention_removed("dead_letters"),
                "partitions": m.retention_removed("partitions"),
            },
            "deliveryLagMs": {
                "avg": if delivered == 0 { 0.0 } else { lag_sum_us as f64 / delivered as f64 / 1000.0 },
                "max": m.lag_max_us.load(Ordering::Relaxed) as f64 / 1000.0,
            },
        })
    }

    /// The OpenMetrics text of every series.
    pub fn prometheus(&self) -> Result<String, std::fmt::Error> {
        let m = self.metrics;
        m.limiter_limit.set(i64::from(self.limiter_limit));
        m.limiter_in_flight.set(i64::from(self.limiter_in_flight));
        m.pool_in_use
            .set(i64::try_from(self.pool_in_use).unwrap_or(i64::MAX));
        m.pool_size
            .set(i64::try_from(self.pool_size).unwrap_or(i64::MAX));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry)?;
        Ok(out)
    }
}

/// The content type of `Snapshot::prometheus`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
