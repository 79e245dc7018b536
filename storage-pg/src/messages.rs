//! Push, ack and lease renewal on PostgreSQL (push_v4, ack_v1, renew_lease_v1).

use async_trait::async_trait;
use queen_core::dedup::FirstOccurrences;
use queen_core::storage::{
    AckItem, AckOutcome, AckStatus, MessageStorage, PushGroup, PushGroupResult, PushOutcome,
    QueueFull, RenewOutcome, SealCheck, StorageError, StorageResult,
};
use std::time::SystemTime;

use queen_core::Timestamp;

use crate::error::{pg_err, pool_err, retry_contention};
use crate::{from_system_time, int, to_system_time, PgStorage};

fn status_text(s: AckStatus) -> &'static str {
    match s {
        AckStatus::Completed => "completed",
        AckStatus::Failed => "failed",
        AckStatus::Retry => "retry",
        AckStatus::Dlq => "dlq",
    }
}

/// The push of a request inside a caller's transaction (a push request, or a transaction op).
pub(crate) async fn push_groups(
    tx: &deadpool_postgres::Transaction<'_>,
    groups: &[PushGroup],
    accepted_at: Option<SystemTime>,
    seal: SealCheck,
) -> StorageResult<Vec<PushGroupResult>> {
    let stmt = tx
        .prepare_cached(
            "SELECT o_status, o_message_id, o_partition_id, o_offset, o_max_size, o_backlog
               FROM queen.push_v4($1, $2, $3, $4, $5, $6, $7)",
        )
        .await
        .map_err(pg_err("push"))?;
    // Partition locks are taken in one global order, so concurrent multi-partition pushes
    // never deadlock.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|a, b| {
        (&groups[*a].queue, &groups[*a].partition).cmp(&(&groups[*b].queue, &groups[*b].partition))
    });
    let mut results: Vec<PushGroupResult> = vec![Vec::new(); groups.len()];
    for i in order {
        let g = &groups[i];
        let sealed = (seal == SealCheck::Enforce).then(|| g.is_sealed());
        let firsts = FirstOccurrences::of(&g.frames);
        let mut outcome: Vec<Option<PushOutcome>> = vec![None; g.frames.len()];
        let mut candidates: Vec<usize> = firsts.firsts().collect();
        // At most two rounds: the second has no duplicates by construction (the partition
        // lock is held, so nothing can change in between).
        for _ in 0..2 {
            if candidates.is_empty() {
                break;
            }
            let frames: Vec<_> = candidates.iter().map(|k| g.frames[*k].clone()).collect();
            let blob = g
                .segment_blob(&frames)
                .map_err(|e| StorageError::Invalid(e.to_string()))?;
            let txids: Vec<&str> = frames.iter().map(|f| f.transaction_id.as_str()).collect();
            let ids: Vec<uuid::Uuid> = frames.iter().map(|f| f.message_id).collect();
            let rows = tx
                .query(
                    &stmt,
                    &[
                        &g.queue,
                        &g.partition,
                        &txids,
                        &ids,
                        &blob,
                        &accepted_at,
                        &sealed,
                    ],
                )
                .await
                .map_err(pg_err("push"))?;
            if rows.len() != candidates.len() {
                return Err(StorageError::Internal(format!(
                    "push_v4 answered {} rows for {} items",
                    rows.len(),
                    candidates.len()
                )));
            }
            let mut retry = vec![];
            for (k, row) in candidates.iter().zip(rows.iter()) {
                let message_id: uuid::Uuid = row.get(1);
                let partition_id = row.get::<_, uuid::Uuid>(2).to_string();
                outcome[*k] = match row.get::<_, &str>(0) {
                    "queued" => Some(PushOutcome::Queued {
                        message_id,
                        partition_id,
                        offset: row.get(3),
                    }),
                    "duplicate" => Some(PushOutcome::Duplicate {
                        message_id,
                        partition_id,
                    }),
                    "full" => Some(PushOutcome::Rejected {
                        message_id,
                        partition_id,
                        full: QueueFull {
                            queue: g.queue.clone(),
                            max_size: u32::try_from(row.get::<_, i32>(4)).unwrap_or(0),
                            backlog: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
                        },
                    }),
                    "retry" => {
                        retry.push(*k);
                        None
                    }
                    other => {
                        return Err(StorageError::Internal(format!(
                            "push_v4 answered the unknown status {other:?}"
                        )))
                    }
                };
            }
            candidates = retry;
        }
        if !candidates.is_empty() {
            return Err(StorageError::Internal(
                "push_v4 reported duplicates twice under the partition lock".into(),
            ));
        }
        results[i] = firsts
            .resolve(outcome)
            .ok_or_else(|| StorageError::Internal("push outcome missing".into()))?;
    }
    Ok(results)
}

/// Runs ack_v1 on a client or a transaction.
pub(crate) async fn ack_items(
    client: &impl deadpool_postgres::GenericClient,
    group: &str,
    items: &[AckItem],
) -> StorageResult<Vec<AckOutcome>> {
    let stmt = client
        .prepare_cached("SELECT o_success, o_error, o_queue, o_partition, o_lease_released, o_dlq FROM queen.ack_v1($1, $2, $3, $4, $5, $6)")
        .await
        .map_err(pg_err("ack"))?;
    let pids: Vec<&str> = items.iter().map(|i| i.partition_id.as_str()).collect();
    let txids: Vec<&str> = items.iter().map(|i| i.transaction_id.as_str()).collect();
    let statuses: Vec<&str> = items.iter().map(|i| status_text(i.status)).collect();
    let leases: Vec<Option<&str>> = items.iter().map(|i| i.lease_id.as_deref()).collect();
    let errors: Vec<Option<&str>> = items.iter().map(|i| i.error.as_deref()).collect();
    let rows = client
        .query(&stmt, &[&group, &pids, &txids, &statuses, &leases, &errors])
        .await
        .map_err(pg_err("ack"))?;
    Ok(rows
        .iter()
        .map(|r| AckOutcome {
            success: r.get(0),
            error: r.get(1),
            queue: r.get(2),
            partition: r.get(3),
            lease_released: r.get(4),
            dlq: r.get(5),
        })
        .collect())
}

#[async_trait]
impl MessageStorage for PgStorage {
    async fn push_accepted_at(
        &self,
        groups: Vec<PushGroup>,
        accepted_at: Option<Timestamp>,
    ) -> StorageResult<Vec<PushGroupResult>> {
        let (this, groups) = (self, &groups);
        let accepted_at = accepted_at.map(to_system_time);
        retry_contention(move || async move {
            let mut client = this.pool.get().await.map_err(pool_err)?;
            let tx = client.transaction().await.map_err(pg_err("push: begin"))?;
            let results = push_groups(&tx, groups, accepted_at, SealCheck::Enforce).await?;
            tx.commit().await.map_err(pg_err("push: commit"))?;
            Ok(results)
        })
        .await
    }

    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
        let (this, items) = (self, &items);
        retry_contention(move || async move {
            let client = this.pool.get().await.map_err(pool_err)?;
            ack_items(&client, group, items).await
        })
        .await
    }

    async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_renewed, o_expires FROM queen.renew_lease_v1($1, $2)",
                &[&lease_id, &int(seconds)],
            )
            .await
            .map_err(pg_err("renew lease"))?;
        let renewed: i32 = row.get(0);
        let expires: Option<SystemTime> = row.get(1);
        Ok(RenewOutcome {
            renewed: u32::try_from(renewed).unwrap_or(0),
            expires_at: expires.map(from_system_time),
        })
    }
}
