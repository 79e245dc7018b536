//! When the admin totals' pass (`stats`) runs. A pass costs time linear in partitions, so:
//! - while the last pass read fewer than `ADMIN_INLINE_PARTITIONS`, each request runs one
//!   (requests that arrive during it share it): exact figures, `statsAge` 0;
//! - past it, requests answer the last snapshot and its `statsAge`, and a refresher task runs
//!   passes with a pause of nine times the pass's length (at most a tenth of one connection's
//!   time) while anyone reads them (`WATCHED_MS`), then stops;
//! - `POST /api/v1/stats/refresh` runs a pass and waits for it.
//!
//! A slow pass is stored (`InspectStorage::store_totals`), as Queen keeps its totals in one
//! table: a broker with no snapshot of its own (just started) answers from the stored one at
//! once instead of making its first request wait for a pass (47 s at 2.6 million partitions),
//! and a deployment's brokers take turns under one maintenance lease (`TOTALS_LEASE`): a
//! refresher whose snapshot is due adopts a newer stored pass, else passes if it gets the lease,
//! else waits for the broker that holds it. B brokers pay one pass per period, not B.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use queen_core::storage::{PartitionView, QueueFilter};
use queen_core::Timestamp;

use crate::broker::Broker;
use crate::http::Failure;
use crate::stats::{partition_page, pass, tally_queue, QueueTally, Snapshot};

/// The maintenance lease (`RetentionStorage::claim_maintenance`) of the broker that passes for
/// the deployment.
const TOTALS_LEASE: &str = "admin-totals";

/// How long after the last read the refresher keeps refreshing.
const WATCHED_MS: i64 = 5 * 60_000;

/// A refresher's pause between passes, as a multiple of the pass's length.
const PAUSE_FACTOR: u32 = 9;
const MIN_PAUSE: Duration = Duration::from_secs(1);

fn slow(broker: &Broker, s: &Snapshot) -> bool {
    s.queues.iter().map(|t| t.partitions).sum::<u64>() >= broker.config.admin_inline_partitions
}

/// The totals for a request: fresh while a pass is cheap, else the last snapshot (and the
/// refresher keeps it young while it is read). With no snapshot at all it waits for a pass at
/// most `admin_totals_wait_ms`, then answers 503; the pass goes on for the next request.
pub(crate) async fn for_request(broker: &Arc<Broker>) -> Result<Arc<Snapshot>, Failure> {
    let asked_at = broker.now();
    broker
        .stats
        .last_read_ms
        .store(asked_at.0 / 1000, Ordering::Relaxed);
    let current = match broker.stats.current() {
        Some(s) => Some(s),
        // Just started: the deployment's stored pass, if one is kept.
        None => adopt_stored(broker).await?,
    };
    if let Some(s) = current {
        if slow(broker, &s) {
            ensure_refresher(broker);
            return Ok(s);
        }
    }
    let wait = Duration::from_millis(broker.config.admin_totals_wait_ms);
    let pass = start_pass(broker, asked_at, Wanted::ForRequest);
    // 0: never wait (a timeout of 0 still waits for the timer's next tick).
    if !wait.is_zero() {
        if let Ok(done) = tokio::time::timeout(wait, pass).await {
            return ended(done);
        }
    }
    Err(Failure::unavailable(format!(
        "the admin totals are being counted (a pass over every partition, which this broker has \
         none of yet, ran past {} ms); retry shortly",
        wait.as_millis()
    )))
}

/// Which pass a caller takes.
#[derive(Clone, Copy)]
enum Wanted {
    /// One that started after it asked (`POST /stats/refresh`, the refresher).
    StartedAfter,
    /// The same, or any slow one: past `ADMIN_INLINE_PARTITIONS` a request answers the last
    /// pass, so one that waited for a slow pass takes it instead of starting another.
    ForRequest,
}

/// `refresh` in a task of its own: a caller that leaves (a proxy's timeout, a dropped
/// connection) does not cancel the pass, which would make a pass longer than the timeout never
/// end.
fn start_pass(
    broker: &Arc<Broker>,
    asked_at: Timestamp,
    wanted: Wanted,
) -> tokio::task::JoinHandle<Result<Arc<Snapshot>, Failure>> {
    let b = broker.clone();
    tokio::spawn(async move { refresh(&b, asked_at, wanted).await })
}

fn ended(
    done: Result<Result<Arc<Snapshot>, Failure>, tokio::task::JoinError>,
) -> Result<Arc<Snapshot>, Failure> {
    done.map_err(|e| Failure::server(format!("the admin totals' pass ended: {e}")))?
}

/// Runs a pass now (or takes one that started after `asked_at`) and keeps it; it goes on if the
/// caller leaves.
pub(crate) async fn refresh_after(
    broker: &Arc<Broker>,
    asked_at: Timestamp,
) -> Result<Arc<Snapshot>, Failure> {
    ended(start_pass(broker, asked_at, Wanted::StartedAfter).await)
}

/// Takes the stored pass when it is newer than this broker's (or this broker has none) and
/// readable, and keeps it; the broker's snapshot, whichever it is.
async fn adopt_stored(broker: &Arc<Broker>) -> Result<Option<Arc<Snapshot>>, Failure> {
    let current = broker.stats.current();
    let newer_than = current.as_ref().map(|s| s.taken_at);
    let Some(stored) = broker.storage.inspect.stored_totals(newer_than).await? else {
        return Ok(current);
    };
    match Snapshot::from_stored(&stored) {
        Ok(s) => {
            let s = Arc::new(s);
            broker.stats.store_if_newer(s.clone());
            Ok(broker.stats.current())
        }
        Err(why) => {
            tracing::warn!(%why, "not reading the stored admin totals: this broker passes itself");
            Ok(current)
        }
    }
}

/// Runs a pass (or takes the one `wanted`, run meanwhile) and keeps it.
async fn refresh(
    broker: &Arc<Broker>,
    asked_at: Timestamp,
    wanted: Wanted,
) -> Result<Arc<Snapshot>, Failure> {
    let _one_pass = broker.stats.pass.lock().await;
    if let Some(s) = broker.stats.current() {
        let taken = match wanted {
            Wanted::StartedAfter => s.taken_at >= asked_at,
            Wanted::ForRequest => s.taken_at >= asked_at || slow(broker, &s),
        };
        if taken {
            return Ok(s);
        }
    }
    let s = Arc::new(
        pass(
            &*broker.storage.inspect,
            broker.now(),
            broker.config.metrics_partition_series,
            broker.config.admin_deepest_partitions,
        )
        .await?,
    );
    // A pass that is no longer slow still replaces a stored slow one: a broker started later
    // would take that for the deployment's size.
    let was_slow = broker.stats.current().is_some_and(|c| slow(broker, &c));
    let is_slow = slow(broker, &s);
    broker.stats.store_if_newer(s.clone());
    if is_slow || was_slow {
        // For the other brokers and for restarts; the pass stands without it.
        let stored = match s.stored() {
            Ok(stored) => broker
                .storage
                .inspect
                .store_totals(&stored)
                .await
                .map_err(Failure::from),
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            tracing::warn!(error = %e.message, "storing the admin totals");
        }
    }
    if is_slow {
        ensure_refresher(broker);
    }
    Ok(s)
}

/// A page of one queue's partitions with the queue's totals, for the routes about one queue.
pub(crate) struct QueuePage {
    pub(crate) tally: QueueTally,
    /// With only the asked group's cursors, when a group was asked.
    pub(crate) partitions: Vec<PartitionView>,
    /// The page's last partition when more follow: the next page's `after`.
    pub(crate) next: Option<String>,
    /// Whole seconds since the totals were counted (0: for this request).
    pub(crate) stats_age: i64,
}

/// Up to `limit` partitions of queue `name` after the partition named `after` (with `group`'s
/// cursors only, when given), and the queue's totals (with `group`'s backlog, a group that
/// never read it included). When the page holds
/// the whole queue the totals are counted from it; otherwise they come from the admin totals
/// (`for_request`), so no request reads every partition of a large queue (a group the pass did
/// not meet on it had read nothing of it); a queue newer than the last pass gets a pass of that
/// queue alone. `None`: no such queue.
pub(crate) async fn for_queue(
    broker: &Arc<Broker>,
    name: &str,
    after: Option<&str>,
    limit: u32,
    group: Option<&str>,
) -> Result<Option<QueuePage>, Failure> {
    let inspect = &*broker.storage.inspect;
    let now = broker.now();
    let (partitions, next) = partition_page(inspect, name, after, limit, group).await?;
    let own_view = || async {
        let filter = QueueFilter {
            queue: Some(name.to_string()),
            ..QueueFilter::default()
        };
        Ok::<_, Failure>(inspect.queue_views(filter).await?.into_iter().next())
    };
    if after.is_none() && next.is_none() {
        // The page holds the whole queue.
        let Some(view) = own_view().await? else {
            return Ok(None);
        };
        let start = QueueTally::new(view).with_group(group);
        let tally = match group {
            None => partitions.iter().fold(start, |mut t, p| {
                t.add(p, now);
                t
            }),
            // The page holds the group's cursors only; the others count too.
            Some(_) => tally_queue(inspect, start, now, |_, _, _| {}).await?,
        };
        return Ok(Some(QueuePage {
            tally,
            partitions,
            next,
            stats_age: 0,
        }));
    }
    let snap = for_request(broker).await?;
    if let Some(t) = snap.queue(name) {
        // A group the pass did not meet on the queue read nothing of it then.
        let tally = match group {
            Some(g) if !t.groups.contains_key(g) => t.unread_by(g),
            _ => t.clone(),
        };
        return Ok(Some(QueuePage {
            tally,
            partitions,
            next,
            stats_age: snap.age_secs(now),
        }));
    }
    let Some(view) = own_view().await? else {
        return Ok(None);
    };
    let start = QueueTally::new(view).with_group(group);
    let tally = tally_queue(inspect, start, now, |_, _, _| {}).await?;
    Ok(Some(QueuePage {
        tally,
        partitions,
        next,
        stats_age: 0,
    }))
}

fn ensure_refresher(broker: &Arc<Broker>) {
    if !broker.stats.refresher_running.swap(true, Ordering::AcqRel) {
        tokio::spawn(refresher(Arc::downgrade(broker)));
    }
}

fn pause_after(pass_ms: u64) -> Duration {
    (Duration::from_millis(pass_ms) * PAUSE_FACTOR).max(MIN_PAUSE)
}

/// Refreshes the snapshot while it is read and passes are slow; then ends.
async fn refresher(broker: Weak<Broker>) {
    let holder = match broker.upgrade() {
        Some(b) => b.mint_uuid().to_string(),
        None => return,
    };
    loop {
        let Some(b) = broker.upgrade() else { return };
        let watched = b.now().0 / 1000 - b.stats.last_read_ms.load(Ordering::Relaxed) < WATCHED_MS;
        let slow_passes = b.stats.current().is_some_and(|s| slow(&b, &s));
        if !watched || !slow_passes || *b.shutting_down.borrow() {
            b.stats.refresher_running.store(false, Ordering::Release);
            return;
        }
        let pause = match refresher_turn(&b, &holder).await {
            Ok(pause) => pause,
            Err(e) => {
                tracing::debug!(error = %e.message, "refreshing the admin totals");
                MIN_PAUSE * 5
            }
        };
        drop(b);
        tokio::time::sleep(pause).await;
    }
}

/// One look of the refresher: adopts a newer stored pass; when the snapshot is due, passes
/// under the deployment's lease (or, when another broker holds it, looks again shortly for the
/// pass it will store). How long to wait before the next look.
async fn refresher_turn(b: &Arc<Broker>, holder: &str) -> Result<Duration, Failure> {
    // The refresher runs only while a snapshot is kept, and none is ever dropped.
    let s = adopt_stored(b)
        .await?
        .ok_or_else(|| Failure::server("the admin totals' refresher runs with no snapshot kept"))?;
    let age = Duration::from_millis(s.taken_at.millis_until(b.now()));
    let pause = pause_after(s.pass_ms);
    if age < pause {
        return Ok((pause - age).max(MIN_PAUSE));
    }
    // Held a little past twice the last pass: a lease that lapses mid-pass lets a second broker
    // pass too, which costs time and nothing else.
    let lease_secs = u32::try_from(s.pass_ms / 500 + 10).unwrap_or(u32::MAX);
    let retention = &b.storage.retention;
    if !retention
        .claim_maintenance(TOTALS_LEASE, holder, lease_secs)
        .await?
    {
        return Ok(MIN_PAUSE);
    }
    let passed = refresh_after(b, b.now()).await;
    let released = retention.release_maintenance(TOTALS_LEASE, holder).await;
    let s = passed?;
    released?;
    Ok(pause_after(s.pass_ms))
}
