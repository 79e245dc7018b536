//! Queues and consumer groups on PostgreSQL.

use async_trait::async_trait;
use queen_core::storage::{
    AdminStorage, ConfiguredQueue, GroupDeleted, QueueConfig, SeekTarget, StorageResult,
};
use queen_core::Timestamp;

use crate::error::{pg_err, pool_err};
use crate::{int, to_system_time, PgStorage};

#[async_trait]
impl AdminStorage for PgStorage {
    async fn configure_queue(&self, c: QueueConfig) -> StorageResult<ConfiguredQueue> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_queue_id, o_partition_id FROM queen.configure_queue_v1($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19)",
                &[
                    &c.name,
                    &c.namespace,
                    &c.task,
                    &int(c.lease_time_secs),
                    &int(c.retry_limit),
                    &int(c.retry_delay_ms),
                    &c.priority,
                    &int(c.delayed_processing_secs),
                    &int(c.window_buffer_secs),
                    &int(c.max_size),
                    &int(c.ttl_secs),
                    &c.retention_enabled,
                    &int(c.retention_seconds),
                    &int(c.completed_retention_seconds),
                    &c.encryption_enabled,
                    &c.dead_letter_queue,
                    &c.dlq_after_max_retries,
                    &int(c.max_wait_time_seconds),
                    &int(c.min_pop_wait_ms),
                ],
            )
            .await
            .map_err(pg_err("configure queue"))?;
        let q: uuid::Uuid = row.get(0);
        let p: uuid::Uuid = row.get(1);
        Ok(ConfiguredQueue {
            queue_id: q.to_string(),
            default_partition_id: p.to_string(),
        })
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one("SELECT queen.delete_queue_v1($1)", &[&queue])
            .await
            .map_err(pg_err("delete queue"))?;
        Ok(row.get(0))
    }

    async fn seek_group(&self, group: &str, queue: &str, target: SeekTarget) -> StorageResult<u32> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let (to_end, ts) = match target {
            SeekTarget::End => (true, None),
            SeekTarget::Timestamp(t) => (false, Some(to_system_time(t))),
        };
        let row = client
            .query_one(
                "SELECT queen.seek_group_v1($1, $2, $3, $4)",
                &[&group, &queue, &to_end, &ts],
            )
            .await
            .map_err(pg_err("seek"))?;
        Ok(u32::try_from(row.get::<_, i32>(0)).unwrap_or(0))
    }

    async fn delete_group(
        &self,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> StorageResult<GroupDeleted> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_cursors, o_metadata FROM queen.delete_group_v1($1, $2, $3)",
                &[&group, &queue, &delete_metadata],
            )
            .await
            .map_err(pg_err("delete consumer group"))?;
        Ok(GroupDeleted {
            cursors: u32::try_from(row.get::<_, i32>(0)).unwrap_or(0),
            subscription_records: u32::try_from(row.get::<_, i32>(1)).unwrap_or(0),
        })
    }

    async fn update_subscription(&self, group: &str, timestamp: Timestamp) -> StorageResult<u32> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT queen.update_subscription_v1($1, $2)",
                &[&group, &to_system_time(timestamp)],
            )
            .await
            .map_err(pg_err("update subscription"))?;
        Ok(u32::try_from(row.get::<_, i32>(0)).unwrap_or(0))
    }

    async fn cluster_setting(
        &self,
        name: &str,
        proposed: Option<Vec<u8>>,
    ) -> StorageResult<Option<Vec<u8>>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        if let Some(value) = proposed {
            client
                .execute(
                    "INSERT INTO queen.cluster_settings (name, value) VALUES ($1, $2)
                     ON CONFLICT (name) DO NOTHING",
                    &[&name, &value],
                )
                .await
                .map_err(pg_err("cluster setting: insert"))?;
        }
        let row = client
            .query_opt(
                "SELECT value FROM queen.cluster_settings WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(pg_err("cluster setting: read"))?;
        Ok(row.map(|r| r.get(0)))
    }
}
