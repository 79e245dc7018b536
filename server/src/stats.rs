//! The admin plane's totals: queue counts, group lag, lease figures and the metrics' stored
//! series, computed by a pass over every partition, page by page, and kept as a snapshot that
//! the totals routes read in time proportional to the number of queues. When a pass runs (per
//! request while cheap, in the background while read once it is not) is decided in
//! `tasks/admin_totals.rs`.
//!
//! A pass costs 15-25 µs per partition on PostgreSQL (cursor rows and two index probes for
//! each cursor's oldest unconsumed message): 16 s at a million partitions (docs/operations.md).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::Arc;

use queen_core::storage::{InspectStorage, PartitionView, QueueFilter, QueueView};
use queen_core::Timestamp;
use serde_json::Value;

use crate::http::Failure;
use crate::views::{depth, lag_stats, Counts, GroupLag};

/// Partitions read per storage call of a pass.
const PAGE: u32 = 2_000;

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

/// A broker's snapshot and the state of its refresh (`tasks::admin_totals`).
#[derive(Default)]
pub(crate) struct AdminStats {
    current: std::sync::Mutex<Option<Arc<Snapshot>>>,
    /// One pass at a time; a request that waited for it takes the pass that ran meanwhile.
    pub(crate) pass: tokio::sync::Mutex<()>,
    /// When (broker ms) a route last read the totals.
    pub(crate) last_read_ms: AtomicI64,
    pub(crate) refresher_running: AtomicBool,
}

impl AdminStats {
    pub(crate) fn current(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn store(&self, s: Arc<Snapshot>) {
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(s);
    }
}

/// One pass over every queue's partitions, started at `taken_at`; at most `partition_series`
/// partition lags are kept.
pub(crate) async fn pass(
    inspect: &dyn InspectStorage,
    taken_at: Timestamp,
    partition_series: usize,
) -> Result<Snapshot, Failure> {
    let started = tokio::time::Instant::now();
    let cap = partition_series;
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
