//! Retention, eviction and the maintenance lease on PostgreSQL (`retention_batch_v1.sql`,
//! `remove_inactive_partitions_v1.sql`, `claim_maintenance_v1.sql`).

use std::time::SystemTime;

use async_trait::async_trait;
use queen_core::storage::{
    Removed, RetentionBatch, RetentionMark, RetentionPass, RetentionStorage, StorageError,
    StorageResult,
};

use crate::error::{pg_err, pool_err, retry_contention};
use crate::{from_system_time, int, to_system_time, PgStorage};

fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[async_trait]
impl RetentionStorage for PgStorage {
    async fn claim_maintenance(
        &self,
        name: &str,
        holder: &str,
        seconds: u32,
    ) -> StorageResult<bool> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT queen.claim_maintenance_v1($1, $2, $3)",
                &[&name, &holder, &int(seconds)],
            )
            .await
            .map_err(pg_err("claim the maintenance lease"))?;
        Ok(row.get(0))
    }

    async fn release_maintenance(&self, name: &str, holder: &str) -> StorageResult<()> {
        let client = self.pool.get().await.map_err(pool_err)?;
        client
            .execute(
                "SELECT queen.release_maintenance_v1($1, $2)",
                &[&name, &holder],
            )
            .await
            .map_err(pg_err("release the maintenance lease"))?;
        Ok(())
    }

    async fn retention_queues(&self, pass: RetentionPass) -> StorageResult<Vec<String>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let eviction_only = pass == RetentionPass::Eviction;
        let rows = client
            .query(
                "SELECT name FROM queen.queues
                  WHERE max_wait_time_seconds > 0
                     OR (NOT $1 AND retention_enabled
                         AND (retention_seconds > 0 OR completed_retention_seconds > 0))
                  ORDER BY name",
                &[&eviction_only],
            )
            .await
            .map_err(pg_err("list queues with retention"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn retention_batch(
        &self,
        queue: &str,
        pass: RetentionPass,
        after: Option<RetentionMark>,
        limit: u32,
    ) -> StorageResult<RetentionBatch> {
        let (after_at, after_id) = match &after {
            Some(m) => {
                let id = uuid::Uuid::parse_str(&m.partition_id).map_err(|e| {
                    StorageError::Invalid(format!("retention mark {:?}: {e}", m.partition_id))
                })?;
                (Some(to_system_time(m.oldest_at)), Some(id))
            }
            None => (None, None),
        };
        let eviction_only = pass == RetentionPass::Eviction;
        let limit = int(limit.max(1));
        let row = retry_contention(|| async {
            let client = self.pool.get().await.map_err(pool_err)?;
            client
                .query_one(
                    "SELECT o_partitions, o_segments, o_messages, o_txids, o_dead_letters, o_next_at, o_next_id
                       FROM queen.retention_batch_v1($1, $2, $3, $4, $5)",
                    &[&queue, &eviction_only, &after_at, &after_id, &limit],
                )
                .await
                .map_err(pg_err("retention batch"))
        })
        .await?;
        let next_at: Option<SystemTime> = row.get(5);
        let next_id: Option<uuid::Uuid> = row.get(6);
        Ok(RetentionBatch {
            partitions_visited: u32::try_from(row.get::<_, i32>(0)).unwrap_or(0),
            removed: Removed {
                segments: count(row.get(1)),
                messages: count(row.get(2)),
                dedup_rows: count(row.get(3)),
                dead_letters: count(row.get(4)),
            },
            next: next_at.zip(next_id).map(|(at, id)| RetentionMark {
                oldest_at: from_system_time(at),
                partition_id: id.to_string(),
            }),
        })
    }

    async fn remove_inactive_partitions(
        &self,
        inactive_secs: u64,
        limit: u32,
    ) -> StorageResult<u64> {
        let secs = i64::try_from(inactive_secs).unwrap_or(i64::MAX);
        let limit = int(limit.max(1));
        let row = retry_contention(|| async {
            let client = self.pool.get().await.map_err(pool_err)?;
            client
                .query_one(
                    "SELECT queen.remove_inactive_partitions_v1($1, $2)",
                    &[&secs, &limit],
                )
                .await
                .map_err(pg_err("remove inactive partitions"))
        })
        .await?;
        Ok(count(row.get(0)))
    }

    async fn remove_old_dead_letters(
        &self,
        older_than_secs: u64,
        limit: u32,
    ) -> StorageResult<u64> {
        let secs = i64::try_from(older_than_secs).unwrap_or(i64::MAX);
        let limit = i64::from(limit.max(1));
        let client = self.pool.get().await.map_err(pool_err)?;
        let n = client
            .execute(
                "DELETE FROM queen.dead_letters d
                  WHERE d.id IN (SELECT o.id FROM queen.dead_letters o
                                  WHERE o.failed_at < queen.now() - make_interval(secs => $1)
                                  ORDER BY o.failed_at LIMIT $2)",
                &[&(secs as f64), &limit],
            )
            .await
            .map_err(pg_err("remove old dead letters"))?;
        Ok(n)
    }
}
