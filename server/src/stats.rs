//! The admin plane's totals: queue counts, group lag, lease figures and the metrics' stored
//! series, computed by a pass over every partition, a queue at a time, and kept as a snapshot that
//! the totals routes read in time proportional to the number of queues. When a pass runs (per
//! request while cheap, in the background while read once it is not) is decided in
//! `tasks/admin_totals.rs`.
//!
//! A pass costs about 8-12 µs per partition on PostgreSQL (statements of up to 2,000
//! partitions in partition-id order, so none holds its snapshot long: each
//! partition's first and last segment, its cursors and each cursor's oldest unconsumed message,
//! all primary-key probes): 8.1-12.4 s at a million partitions, with the machine's state
//! (docs/operations.md).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::Arc;

use queen_core::storage::{
    CursorView, InspectStorage, PartitionView, QueueFilter, QueueView, StoredTotals,
};
use queen_core::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::Failure;
use crate::views::{depth, lag_stats, Backlog, Counts, GroupLag};

/// One queue's totals.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct QueueTally {
    pub(crate) view: QueueView,
    pub(crate) partitions: u64,
    /// Messages pushed in the queue's life.
    pub(crate) pushed: u64,
    /// Messages still stored.
    pub(crate) retained: u64,
    /// Partitions with a message stored.
    pub(crate) partitions_retaining: u64,
    pub(crate) counts: Counts,
    /// The slowest reader's backlog (`views::depth`).
    pub(crate) backlog: Backlog,
    pub(crate) leases: u64,
    pub(crate) leased_partitions: u64,
    pub(crate) leased_messages: u64,
    pub(crate) consumed: i64,
    /// Each group's lag on the queue.
    pub(crate) groups: BTreeMap<String, GroupLag>,
}

/// One (queue, partition, group) pending figure, for the metrics' capped partition series.
#[derive(Serialize, Deserialize)]
pub(crate) struct PartitionLag {
    pub(crate) queue: String,
    pub(crate) partition: String,
    pub(crate) group: String,
    pub(crate) pending: u64,
}

/// The cursors the lagging view keeps: the longest-lagging, over every queue.
pub(crate) const LAGGING_KEPT: usize = 1_000;

/// A cursor with something unconsumed, for the lagging view.
#[derive(PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct LaggingCursor {
    /// First: the heap of `pass` orders by it.
    pub(crate) oldest_unconsumed_at: Timestamp,
    pub(crate) group: String,
    pub(crate) queue: String,
    pub(crate) partition: String,
    pub(crate) partition_id: String,
    /// The holder of a live lease.
    pub(crate) worker_id: Option<String>,
    pub(crate) offset_lag: u64,
}

/// A partition with something pending, for the `minDepth` listing (`Snapshot::deepest`).
#[derive(Serialize, Deserialize)]
pub(crate) struct DeepPartition {
    /// `views::depth` over the queue's groups.
    pub(crate) depth: u64,
    /// Its queue's place in `Snapshot::queues` (the listing's queue order).
    pub(crate) queue_index: usize,
    pub(crate) view: PartitionView,
}

impl DeepPartition {
    /// The heap's order: a shallower one is dropped first (ties by place, for determinism).
    fn rank(&self) -> (u64, usize, &str) {
        (self.depth, self.queue_index, &self.view.partition)
    }
}

impl PartialEq for DeepPartition {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl Eq for DeepPartition {}
impl PartialOrd for DeepPartition {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for DeepPartition {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

/// What one pass found. Stored for the other brokers and for restarts as JSON
/// (`Snapshot::stored`, `Snapshot::from_stored`).
#[derive(Serialize, Deserialize)]
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
    /// The `LAGGING_KEPT` cursors whose oldest unconsumed message is oldest, oldest first.
    pub(crate) lagging: Vec<LaggingCursor>,
    /// The deepest partitions (at most `ADMIN_DEEPEST_PARTITIONS`, each with something
    /// pending), in listing order: by queue (`queues`' order), then name.
    pub(crate) deepest: Vec<DeepPartition>,
    /// The greatest depth of a partition with something pending that `deepest` left out (0:
    /// none was left out): a `minDepth` above it finds every match in `deepest`.
    pub(crate) deepest_left_out: u64,
}

/// The stored form's version: a broker reads only a pass stored in its own form (an upgrade that
/// changed it passes again, as a broker with no stored pass does).
const STORED_FORM: u32 = 1;

#[derive(Serialize)]
struct StoredForm<'a> {
    form: u32,
    snapshot: &'a Snapshot,
}

/// The form alone (the rest skipped), read before the snapshot is.
#[derive(Deserialize)]
struct FormOnly {
    form: u32,
}

#[derive(Deserialize)]
struct ReadForm {
    snapshot: Snapshot,
}

impl Snapshot {
    /// The form `InspectStorage::store_totals` keeps.
    pub(crate) fn stored(&self) -> Result<StoredTotals, Failure> {
        let body = serde_json::to_vec(&StoredForm {
            form: STORED_FORM,
            snapshot: self,
        })
        .map_err(|e| Failure::server(format!("serializing the admin totals: {e}")))?;
        Ok(StoredTotals {
            taken_at: self.taken_at,
            body,
        })
    }

    /// A stored pass, or why it cannot be read (another form, a damaged body).
    pub(crate) fn from_stored(stored: &StoredTotals) -> Result<Snapshot, String> {
        let FormOnly { form } =
            serde_json::from_slice(&stored.body).map_err(|e| format!("not a stored pass: {e}"))?;
        if form != STORED_FORM {
            return Err(format!(
                "stored in form {form}, this broker reads form {STORED_FORM}"
            ));
        }
        serde_json::from_slice::<ReadForm>(&stored.body)
            .map(|r| r.snapshot)
            .map_err(|e| format!("a damaged stored pass: {e}"))
    }

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

    /// The tally of a kept deep partition's queue: `queue_index` is a place in `queues`, set
    /// by the pass that made both.
    pub(crate) fn queue_of(&self, d: &DeepPartition) -> &QueueTally {
        &self.queues[d.queue_index]
    }

    /// The tally of queue `name`, if the pass met it.
    pub(crate) fn queue(&self, name: &str) -> Option<&QueueTally> {
        self.queues.iter().find(|t| t.view.config.name == name)
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

    /// Keeps `s` unless the snapshot kept meanwhile was taken later (a pass of this broker's
    /// that ended while the stored one was read).
    pub(crate) fn store_if_newer(&self, s: Arc<Snapshot>) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.as_ref().is_none_or(|c| c.taken_at < s.taken_at) {
            *current = Some(s);
        }
    }
}

/// Queues read in one call (`InspectStorage::each_partition_of_queues`): a queue alone costs
/// PostgreSQL a transaction and several round trips, which made a pass over 5,023
/// one-partition queues take 6.4-7.5 s where PostgreSQL's own work in it was 0.5 s.
const QUEUES_A_READ: usize = 1_000;

/// One pass over every queue's partitions, started at `taken_at`; at most `partition_series`
/// partition lags (the first in (queue, partition, group) order) and `deepest_kept` of the
/// deepest partitions are kept.
pub(crate) async fn pass(
    inspect: &dyn InspectStorage,
    taken_at: Timestamp,
    partition_series: usize,
    deepest_kept: usize,
) -> Result<Snapshot, Failure> {
    let started = tokio::time::Instant::now();
    let cap = partition_series;
    let (mut time_lags, mut offset_lags) = (vec![], vec![]);
    // The last in (queue, partition, group) order on top, to make room for an earlier one.
    let mut partition_lags: BinaryHeap<(usize, String, String, u64)> = BinaryHeap::new();
    let mut omitted = 0u64;
    // The youngest kept on top, to make room for an older one.
    let mut lagging: BinaryHeap<LaggingCursor> = BinaryHeap::new();
    // The shallowest kept on top, to make room for a deeper one.
    let mut deepest: BinaryHeap<Reverse<DeepPartition>> = BinaryHeap::new();
    let mut deepest_left_out = 0u64;
    let mut queues: Vec<QueueTally> = inspect
        .queue_views(QueueFilter::default())
        .await?
        .into_iter()
        .map(QueueTally::new)
        .collect();
    let places: Vec<usize> = (0..queues.len()).collect();
    for batch in places.chunks(QUEUES_A_READ) {
        let names: Vec<String> = batch
            .iter()
            .map(|&i| queues[i].view.config.name.clone())
            .collect();
        let mut each = |queue_index: usize, p: PartitionView| {
            let tally = &mut queues[queue_index];
            let d = tally.add(&p, taken_at);
            let (tally, p) = (&*tally, &p);
            if d > 0 {
                keep_if_deep(
                    &mut deepest,
                    &mut deepest_left_out,
                    deepest_kept,
                    d,
                    queue_index,
                    p,
                );
            }
            for c in &p.cursors {
                keep_if_lagging(&mut lagging, c, p);
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
                    let earlier = partition_lags.peek().is_some_and(|(qi, lp, lg, _)| {
                        (queue_index, p.partition.as_str(), g.as_str())
                            < (*qi, lp.as_str(), lg.as_str())
                    });
                    if !earlier {
                        continue;
                    }
                    partition_lags.pop();
                }
                partition_lags.push((queue_index, p.partition.clone(), g.clone(), pending));
            }
        };
        inspect
            .each_partition_of_queues(&names, &mut |at, p| each(batch[at], p))
            .await?;
    }
    let partition_lags = partition_lags
        .into_sorted_vec()
        .into_iter()
        .map(|(queue_index, partition, group, pending)| PartitionLag {
            queue: queues[queue_index].view.config.name.clone(),
            partition,
            group,
            pending,
        })
        .collect();
    Ok(Snapshot {
        taken_at,
        pass_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        queues,
        time_lags: lag_stats(&mut time_lags),
        offset_lags: lag_stats(&mut offset_lags),
        partition_lags,
        partition_lags_omitted: omitted,
        lagging: lagging.into_sorted_vec(),
        deepest: {
            let mut kept: Vec<DeepPartition> = deepest.into_iter().map(|Reverse(k)| k).collect();
            kept.sort_by(|a, b| {
                (a.queue_index, &a.view.partition).cmp(&(b.queue_index, &b.view.partition))
            });
            kept
        },
        deepest_left_out,
    })
}

/// Keeps `p` (`d` deep) among the `kept` deepest partitions seen, or raises `left_out` to its
/// depth when it is shallower than all of them.
fn keep_if_deep(
    deepest: &mut BinaryHeap<Reverse<DeepPartition>>,
    left_out: &mut u64,
    kept: usize,
    d: u64,
    queue_index: usize,
    p: &PartitionView,
) {
    let shallower_than_kept = deepest.len() >= kept
        && deepest
            .peek()
            .is_none_or(|Reverse(k)| (d, queue_index, p.partition.as_str()) <= k.rank());
    if shallower_than_kept {
        *left_out = (*left_out).max(d);
        return;
    }
    deepest.push(Reverse(DeepPartition {
        depth: d,
        queue_index,
        view: p.clone(),
    }));
    if deepest.len() > kept {
        if let Some(Reverse(out)) = deepest.pop() {
            *left_out = (*left_out).max(out.depth);
        }
    }
}

/// Keeps cursor `c` of `p` among the `LAGGING_KEPT` with the oldest unconsumed message.
fn keep_if_lagging(lagging: &mut BinaryHeap<LaggingCursor>, c: &CursorView, p: &PartitionView) {
    let Some(oldest) = c.oldest_unconsumed_at else {
        return;
    };
    let younger_than_kept = lagging.len() >= LAGGING_KEPT
        && lagging
            .peek()
            .is_some_and(|l| l.oldest_unconsumed_at <= oldest);
    if younger_than_kept {
        return;
    }
    lagging.push(LaggingCursor {
        oldest_unconsumed_at: oldest,
        group: c.group.clone(),
        queue: p.queue.clone(),
        partition: p.partition.clone(),
        partition_id: p.partition_id.clone(),
        worker_id: c.leased_until.and(c.worker_id.clone()),
        offset_lag: p.pending_after(c.committed),
    });
    if lagging.len() > LAGGING_KEPT {
        lagging.pop();
    }
}

/// Up to `limit` partitions of `queue` after the one named `after` (with `group`'s cursors
/// only, when given), and the page's last partition when more follow: the next page's `after`.
pub(crate) async fn partition_page(
    inspect: &dyn InspectStorage,
    queue: &str,
    after: Option<&str>,
    limit: u32,
    group: Option<&str>,
) -> Result<(Vec<PartitionView>, Option<String>), Failure> {
    let mut partitions = inspect
        .partition_views_page(queue, after, limit.saturating_add(1), group)
        .await?;
    if partitions.len() <= limit as usize {
        return Ok((partitions, None));
    }
    partitions.truncate(limit as usize);
    let next = partitions.last().map(|p| p.partition.clone());
    Ok((partitions, next))
}

/// Adds every partition of the tally's queue to it (storage reads the queue in one pass where it
/// can: `InspectStorage::each_partition_of`), showing each to `each` once it is added, with its
/// depth (`views::depth` over the queue's groups).
pub(crate) async fn tally_queue(
    inspect: &dyn InspectStorage,
    mut tally: QueueTally,
    taken_at: Timestamp,
    mut each: impl FnMut(&QueueTally, &PartitionView, u64) + Send,
) -> Result<QueueTally, Failure> {
    let name = tally.view.config.name.clone();
    inspect
        .each_partition_of(&name, &mut |p| {
            let depth = tally.add(&p, taken_at);
            each(&tally, &p, depth);
        })
        .await?;
    Ok(tally)
}

impl QueueTally {
    /// An empty tally of `view`'s queue, its partitions to be added.
    pub(crate) fn new(view: QueueView) -> QueueTally {
        QueueTally {
            partitions: 0,
            pushed: 0,
            retained: 0,
            partitions_retaining: 0,
            counts: Counts {
                dead_letter: view.dead_letters,
                ..Counts::default()
            },
            backlog: Backlog::default(),
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
        }
    }

    /// The tally of a group no partition of the queue had a cursor of when it was counted: it
    /// reads everything stored (`views::depth`).
    pub(crate) fn unread_by(&self, group: &str) -> QueueTally {
        let mut t = self.clone();
        t.groups
            .entry(group.to_string())
            .or_insert_with(|| GroupLag {
                backlog: Backlog {
                    pending: self.retained,
                    processing: 0,
                    partitions_pending: self.partitions_retaining,
                },
                ..GroupLag::default()
            });
        t
    }

    /// The tally also counts `group`'s backlog when the queue does not list it (a group that
    /// has not read it yet).
    pub(crate) fn with_group(mut self, group: Option<&str>) -> QueueTally {
        if let Some(g) = group {
            self.groups.entry(g.to_string()).or_default();
        }
        self
    }

    /// Adds the partition's figures, and answers its depth (its backlog's `pending`).
    pub(crate) fn add(&mut self, p: &PartitionView, now: Timestamp) -> u64 {
        self.partitions += 1;
        self.pushed += p.pushed();
        self.retained += p.retained();
        self.partitions_retaining += u64::from(p.retained() > 0);
        self.counts.add(Counts::of(p, &self.view.groups));
        let backlog = Backlog::of(p, &self.view.groups, None);
        self.backlog.add(backlog);
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
        backlog.pending
    }
}
