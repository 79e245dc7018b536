//! The admin plane's totals: queue counts, group lag, lease figures and the metrics' stored
//! series, computed by a pass over every partition, page by page, and kept as a snapshot that
//! the totals routes read in time proportional to the number of queues.
//!
//! A pass costs about 10 µs per partition on PostgreSQL (cursor rows and two index probes for
//! each cursor's oldest unconsumed message), so it cannot run per request at a million
//! partitions. Freshness is chosen by what a pass costs:
//! - while a pass takes less than `ADMIN_INLINE_PASS_MS`, each request runs one (requests that
//!   arrive during it share it): exact figures, `statsAge` 0, as cheap as before;
//! - above it, requests answer the last snapshot and its `statsAge`, and a refresher task runs
//!   passes back to back with a pause of nine times the pass's length (at most a tenth of one
//!   connection's time) while anyone reads them (`WATCHED_MS`), then stops;
//! - `POST /api/v1/stats/refresh` runs a pass and waits for it.
//!
//! Each broker keeps its own snapshot. Queen keeps one table refreshed by one job; here a
//! deployment of B brokers whose admin plane is read through all of them pays B passes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use queen_core::storage::{PartitionView, QueueFilter, QueueView};
use queen_core::Timestamp;
use serde_json::Value;

use crate::broker::Broker;
use crate::http::Failure;
use crate::views::{depth, lag_stats, Counts, GroupLag};

/// Partitions read per storage call of a pass.
const PAGE: u32 = 2_000;

/// How long after the last read the refresher keeps refreshing.
const WATCHED_MS: i64 = 5 * 60_000;

/// A refresher's pause between passes, as a multiple of the pass's length.
const PAUSE_FACTOR: u32 = 9;
const MIN_PAUSE: Duration = Duration::from_secs(1);

/// One queue's totals.
pub(crate) struct QueueTally {
    /// The queue; `partitions`, `pushed` and `retained` are the pass's own sums.
    pub(crate) view: QueueView,
    pub(crate) counts: Counts,
    /// The slowest reader's depth summed over partitions (`views::depth`).
    pub(crate) depth: u64,
    pub(crate) leases: u64,
    pub(crate) leased_partitions: u64,
    pub(crate) leased_messages: u64,
    pub(crate) consumed: i64,
    /// Each group's lag on the queue.
    pub(crate) groups: BTreeMap<String, GroupLag>,
}

/// One (queue, partition, group) pending figure, for the metrics' capped partition series.
pub(crate) struct PartitionLag {
    pub(crate) queue: String,
    pub(crate) partition: String,
    pub(crate) group: String,
    pub(crate) pending: u64,
}

/// What one pass found.
pub(crate) struct Snapshot {
    /// When the pass started.
    pub(crate) taken_at: Timestamp,
    /// How long it took.
    pub(crate) pass_ms: u64,
    /// Newest first, as `queue_views` lists them.
    pub(crate) queues: Vec<QueueTally>,
    /// Over every cursor: seconds since its oldest unconsumed message, and messages behind.
    pub(crate) time_lags: Value,
    pub(crate) offset_lags: Value,
    /// At most `metrics_partition_series`, in (queue, partition, group) order.
    pub(crate) partition_lags: Vec<PartitionLag>,
    pub(crate) partition_lags_omitted: u64,
}

impl Snapshot {
    /// Whole seconds since the pass started.
    pub(crate) fn age_secs(&self, now: Timestamp) -> i64 {
        i64::try_from(self.taken_at.millis_until(now) / 1000).unwrap_or(i64::MAX)
    }

    pub(crate) fn queues_matching<'a>(
        &'a self,
        filter: &'a QueueFilter,
    ) -> impl Iterator<Item = &'a QueueTally> + 'a {
        self.queues
            .iter()
            .filter(|q| filter.matches(&q.view.config))
    }
}

/// A broker's snapshot and what decides when it is refreshed.
#[derive(Default)]
pub(crate) struct AdminStats {
    current: std::sync::Mutex<Option<Arc<Snapshot>>>,
    /// One pass at a time; a request that waited for it takes the pass that ran meanwhile.
    pass: tokio::sync::Mutex<()>,
    /// When (broker ms) a route last read the totals.
    last_read_ms: AtomicI64,
    refresher_running: AtomicBool,
}

impl AdminStats {
    fn current(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn store(&self, s: Arc<Snapshot>) {
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(s);
    }
}

/// The totals for a request: fresh while a pass is cheap, else the last snapshot (and the
/// refresher keeps it young while it is read).
pub(crate) async fn for_request(broker: &Arc<Broker>) -> Result<Arc<Snapshot>, Failure> {
    let asked_at = broker.now();
    broker
        .stats
        .last_read_ms
        .store(asked_at.0 / 1000, Ordering::Relaxed);
    if let Some(s) = broker.stats.current() {
        if s.pass_ms >= broker.config.admin_inline_pass_ms {
            ensure_refresher(broker);
            return Ok(s);
        }
    }
    refresh_after(broker, asked_at).await
}

/// Runs a pass now (or takes one that started after `asked_at`) and keeps it.
pub(crate) async fn refresh_after(
    broker: &Arc<Broker>,
    asked_at: Timestamp,
) -> Result<Arc<Snapshot>, Failure> {
    let _one_pass = broker.stats.pass.lock().await;
    if let Some(s) = broker.stats.current() {
        if s.taken_at >= asked_at {
            return Ok(s);
        }
    }
    let s = Arc::new(pass(broker).await?);
    broker.stats.store(s.clone());
    if s.pass_ms >= broker.config.admin_inline_pass_ms {
        ensure_refresher(broker);
    }
    Ok(s)
}

fn ensure_refresher(broker: &Arc<Broker>) {
    if !broker.stats.refresher_running.swap(true, Ordering::AcqRel) {
        tokio::spawn(refresher(Arc::downgrade(broker)));
    }
}

fn pause_after(pass_ms: u64) -> Duration {
    (Duration::from_millis(pass_ms) * PAUSE_FACTOR).max(MIN_PAUSE)
}

/// Refreshes the snapshot while it is read and passes are slow; then ends. It pauses first: it
/// starts right after a pass.
async fn refresher(broker: Weak<Broker>) {
    let mut pause = match broker.upgrade() {
        Some(b) => pause_after(b.stats.current().map_or(0, |s| s.pass_ms)),
        None => return,
    };
    loop {
        tokio::time::sleep(pause).await;
        let Some(b) = broker.upgrade() else { return };
        let watched = b.now().0 / 1000 - b.stats.last_read_ms.load(Ordering::Relaxed) < WATCHED_MS;
        let slow = b
            .stats
            .current()
            .is_some_and(|s| s.pass_ms >= b.config.admin_inline_pass_ms);
        if !watched || !slow || *b.shutting_down.borrow() {
            b.stats.refresher_running.store(false, Ordering::Release);
            return;
        }
        pause = match refresh_after(&b, b.now()).await {
            Ok(s) => pause_after(s.pass_ms),
            Err(e) => {
                tracing::debug!(error = %e.message, "refreshing the admin totals");
                MIN_PAUSE * 5
            }
        };
    }
}

/// One pass over every queue's partitions.
async fn pass(broker: &Broker) -> Result<Snapshot, Failure> {
    let started = tokio::time::Instant::now();
    let taken_at = broker.now();
    let inspect = &broker.storage.inspect;
    let cap = broker.config.metrics_partition_series;
    let (mut time_lags, mut offset_lags) = (vec![], vec![]);
    let mut partition_lags = vec![];
    let mut omitted = 0u64;
    let mut queues = vec![];
    for view in inspect.queue_views(QueueFilter::default()).await? {
        let mut tally = QueueTally {
            counts: Counts::default(),
            depth: 0,
            leases: 0,
            leased_partitions: 0,
            leased_messages: 0,
            consumed: 0,
            groups: view
                .groups
                .iter()
                .map(|g| (g.clone(), GroupLag::default()))
                .collect(),
            view,
        };
        let (mut partitions, mut pushed, mut retained) = (0u64, 0u64, 0u64);
        let mut after: Option<String> = None;
        loop {
            let page = inspect
                .partition_views_page(&tally.view.config.name, after.as_deref(), PAGE)
                .await?;
            for p in &page {
                partitions += 1;
                pushed += p.pushed();
                retained += p.retained();
                tally.add(p, taken_at);
                for c in &p.cursors {
                    offset_lags.push(p.pending_after(c.committed) as f64);
                    time_lags.push(
                        c.oldest_unconsumed_at
                            .map_or(0.0, |t| t.millis_until(taken_at) as f64 / 1000.0),
                    );
                }
                for g in &tally.view.groups {
                    let pending = depth(p, &tally.view.groups, Some(g));
                    if pending == 0 {
                        continue;
                    }
                    if partition_lags.len() >= cap {
                        omitted += 1;
                        continue;
                    }
                    partition_lags.push(PartitionLag {
                        queue: p.queue.clone(),
                        partition: p.partition.clone(),
                        group: g.clone(),
                        pending,
                    });
                }
            }
            match page.last() {
                Some(last) if page.len() == PAGE as usize => after = Some(last.partition.clone()),
                _ => break,
            }
        }
        tally.view.partitions = partitions;
        tally.view.pushed = pushed;
        tally.view.retained = retained;
        tally.counts.dead_letter = tally.view.dead_letters;
        queues.push(tally);
    }
    Ok(Snapshot {
        taken_at,
        pass_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        queues,
        time_lags: lag_stats(&mut time_lags),
        offset_lags: lag_stats(&mut offset_lags),
        partition_lags,
        partition_lags_omitted: omitted,
    })
}

impl QueueTally {
    fn add(&mut self, p: &PartitionView, now: Timestamp) {
        self.counts.add(Counts::of(p, &self.view.groups));
        self.depth += depth(p, &self.view.groups, None);
        let live = p.cursors.iter().filter(|c| c.leased_until.is_some());
        let (mut leases, mut messages) = (0u64, 0u64);
        for c in live {
            leases += 1;
            messages += c.in_flight();
        }
        self.leases += leases;
        self.leased_partitions += u64::from(leases > 0);
        self.leased_messages += messages;
        self.consumed += p.cursors.iter().map(|c| c.total_consumed).sum::<i64>();
        for (g, lag) in &mut self.groups {
            lag.add(p, &self.view.groups, g, now);
        }
    }
}
