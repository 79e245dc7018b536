//! The retention worker: every broker runs one, and the cluster-wide maintenance lease lets one
//! at a time work (the others skip the cycle). What may be removed is storage's rule
//! (`queen_core::storage::retention`); this decides when, in bounded batches.

use std::sync::Weak;
use std::time::Duration;

use queen_core::rng::SeededRng;
use queen_core::storage::{Removed, RetentionPass, StorageResult};

use crate::broker::Broker;
use crate::config::RetentionSettings;

/// The lease's name in `queen.maintenance_leases` (eviction shares it, as in Queen).
pub const MAINTENANCE_LEASE: &str = "retention";

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub partitions_visited: u64,
    pub removed: Removed,
    pub partitions_deleted: u64,
    /// Expired KV rows (and lock permits) removed.
    pub kv_swept: u64,
    /// False: another broker held the lease, or this one lost it mid-pass.
    pub held_lease: bool,
}

/// Runs one pass now, under the lease (`holder` names this broker).
pub async fn run_pass(
    broker: &Broker,
    holder: &str,
    pass: RetentionPass,
    settings: &RetentionSettings,
) -> StorageResult<PassReport> {
    let store = &broker.storage.retention;
    let mut report = PassReport::default();
    if !store
        .claim_maintenance(MAINTENANCE_LEASE, holder, settings.lease_secs)
        .await?
    {
        return Ok(report);
    }
    let result = pass_under_lease(broker, holder, pass, settings, &mut report).await;
    // Released whatever happened: a failed pass must not keep the others out for the lease.
    let released = store.release_maintenance(MAINTENANCE_LEASE, holder).await;
    result?;
    released?;
    Ok(report)
}

async fn pass_under_lease(
    broker: &Broker,
    holder: &str,
    pass: RetentionPass,
    settings: &RetentionSettings,
    report: &mut PassReport,
) -> StorageResult<()> {
    let store = &broker.storage.retention;
    let limit = match pass {
        RetentionPass::Retention => settings.batch_size,
        RetentionPass::Eviction => settings.eviction_batch_size,
    };
    for queue in store.retention_queues(pass).await? {
        let mut after = None;
        loop {
            if !store
                .claim_maintenance(MAINTENANCE_LEASE, holder, settings.lease_secs)
                .await?
            {
                return Ok(());
            }
            let batch = store.retention_batch(&queue, pass, after, limit).await?;
            report.partitions_visited += u64::from(batch.partitions_visited);
            report.removed += batch.removed;
            broker.metrics.count_retention(pass, &batch.removed, 0);
            match batch.next {
                Some(mark) => after = Some(mark),
                None => break,
            }
        }
    }
    if pass == RetentionPass::Retention {
        if settings.partition_cleanup_days > 0 {
            let inactive = u64::from(settings.partition_cleanup_days) * 86_400;
            report.partitions_deleted += until_short(settings.batch_size, || async {
                let n = store
                    .remove_inactive_partitions(inactive, settings.batch_size)
                    .await?;
                broker.metrics.count_retention(pass, &Removed::default(), n);
                Ok(n)
            })
            .await?;
        }
        if settings.dead_letter_retention_secs > 0 {
            report.removed.dead_letters += until_short(settings.batch_size, || async {
                let n = store
                    .remove_old_dead_letters(
                        settings.dead_letter_retention_secs,
                        settings.batch_size,
                    )
                    .await?;
                let removed = Removed {
                    dead_letters: n,
                    ..Removed::default()
                };
                broker.metrics.count_retention(pass, &removed, 0);
                Ok(n)
            })
            .await?;
        }
        // Expired KV rows are already absent to every reader; sweeping them only frees space.
        report.kv_swept += until_short(settings.batch_size, || async {
            broker
                .storage
                .kv
                .sweep_expired_kv(settings.batch_size)
                .await
        })
        .await?;
    }
    report.held_lease = true;
    Ok(())
}

/// Runs `batch` (which removes up to `limit` rows and says how many) until one comes back short;
/// the total.
async fn until_short<F, Fut>(limit: u32, mut batch: F) -> StorageResult<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StorageResult<u64>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < u64::from(limit.max(1)) {
            return Ok(total);
        }
    }
}

/// The worker: a retention pass every `interval_ms` and an eviction pass every
/// `eviction_interval_ms`, the first of each at a seeded fraction of its interval (brokers
/// started together do not fire in lockstep). Stops when the broker does.
pub async fn retention_worker(broker: Weak<Broker>, settings: RetentionSettings, seed: u64) {
    let Some(holder) = broker.upgrade().map(|a| a.mint_uuid().to_string()) else {
        return;
    };
    let mut rng = SeededRng::new(seed).child("retention");
    let mut schedule: Vec<(RetentionPass, u64, u64)> = [
        (RetentionPass::Retention, settings.interval_ms),
        (RetentionPass::Eviction, settings.eviction_interval_ms),
    ]
    .into_iter()
    .filter(|(_, every)| *every > 0)
    .map(|(pass, every)| (pass, every, rng.below(every)))
    .collect();
    let start = tokio::time::Instant::now();
    loop {
        let Some(&(pass, every, due)) = schedule.iter().min_by_key(|(_, _, due)| *due) else {
            return;
        };
        let shutdown = match broker.upgrade() {
            Some(a) => a.shutting_down.subscribe(),
            None => return,
        };
        if *shutdown.borrow() {
            return;
        }
        tokio::time::sleep_until(start + Duration::from_millis(due)).await;
        for entry in schedule.iter_mut().filter(|e| e.0 == pass) {
            entry.2 = due + every;
        }
        let Some(broker) = broker.upgrade() else {
            return;
        };
        if *broker.shutting_down.borrow() {
            return;
        }
        match run_pass(&broker, &holder, pass, &settings).await {
            Ok(r) if r.held_lease => {
                tracing::debug!(?pass, ?r, "retention pass");
                broker.metrics.count_retention_run(pass, "ran");
            }
            Ok(_) => broker.metrics.count_retention_run(pass, "skipped"),
            Err(e) => {
                tracing::warn!(?pass, error = %e, "retention pass failed; next cycle retries");
                broker.metrics.count_retention_run(pass, "failed");
            }
        }
    }
}
