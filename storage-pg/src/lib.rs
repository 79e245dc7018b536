//! `queen-storage-pg`: the production backend. PostgreSQL is the sole authority on claim, lease,
//! cursor and visibility; the procedures live in `migrations/` and are applied at start-up.

mod config;
mod error;
mod migrate;
mod pop_rows;
pub mod testing;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use queen_core::dedup::FirstOccurrences;
use queen_core::events::DeliveryEvent;
use queen_core::frames::build_blob;
use queen_core::params::{SubscriptionFrom, SubscriptionMode};
use queen_core::storage::{
    AckItem, AckOutcome, AckStatus, DeadLetterEntry, DeliveryStorage, DlqQuery, PopRequest,
    PopResult, PushGroup, PushGroupResult, PushOutcome, QueueConfig, QueueFull, RenewOutcome,
    SeekTarget, Storage, StorageError, StorageResult, TxOp, TxOpResult, TxOutcome,
};
use queen_core::{Offset, Timestamp};
use tokio_postgres::NoTls;

pub use config::{PgConfig, DEFAULT_POOL_SIZE};
pub use error::pg_err;
pub use migrate::MIGRATIONS;

use error::pool_err;

pub(crate) fn to_system_time(t: Timestamp) -> SystemTime {
    if t.0 >= 0 {
        UNIX_EPOCH + Duration::from_micros(t.0 as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(t.0.unsigned_abs())
    }
}

pub(crate) fn from_system_time(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        Err(e) => Timestamp(-i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX)),
    }
}

/// The PostgreSQL backend: a connection pool over schema `queen`.
#[derive(Clone)]
pub struct PgStorage {
    pool: Pool,
}

impl PgStorage {
    /// Builds the pool and applies pending migrations.
    pub async fn connect(config: &PgConfig) -> StorageResult<PgStorage> {
        let manager = Manager::from_config(
            config.pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .build()
            .map_err(|e| StorageError::Internal(format!("building the connection pool: {e}")))?;
        let storage = PgStorage { pool };
        let mut client = storage.pool.get().await.map_err(pool_err)?;
        migrate::migrate(&mut client).await?;
        Ok(storage)
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// (connections in use, pool size), for metrics.
    pub fn pool_usage(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size.saturating_sub(s.available), s.max_size)
    }

    /// Test hook: moves queen.now() forward (production never calls it; the offset stays 0).
    pub async fn advance_clock(&self, secs: i64) -> StorageResult<()> {
        let client = self.pool.get().await.map_err(pool_err)?;
        client
            .execute(
                "UPDATE queen.clock SET offset_us = offset_us + $1",
                &[&(secs * 1_000_000)],
            )
            .await
            .map_err(pg_err("advance clock"))?;
        Ok(())
    }

    /// Retention: removes a partition's segments below `before`.
    pub async fn drop_segments(
        &self,
        queue: &str,
        partition: &str,
        before: Offset,
    ) -> StorageResult<i32> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT queen.drop_segments_v1($1, $2, $3)",
                &[&queue, &partition, &before],
            )
            .await
            .map_err(pg_err("drop segments"))?;
        Ok(row.get(0))
    }

    /// The cursor row of (queue, partition, group), for tests and diagnostics.
    pub async fn cursor(
        &self,
        queue: &str,
        partition: &str,
        group: &str,
    ) -> StorageResult<Option<queen_core::claim::CursorRow>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_opt(
                "SELECT c.committed, c.worker_id, c.lease_expires_at, c.lease_acquired_at, c.batch_end, c.attempt_count,
                        c.attempt_offset, c.total_consumed, c.retry_offset, c.retry_count
                   FROM queen.log_consumers c
                   JOIN queen.log_partitions p ON p.id = c.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = $1 AND p.name = $2 AND c.consumer_group = $3",
                &[&queue, &partition, &group],
            )
            .await
            .map_err(pg_err("cursor"))?;
        let u = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(row.map(|r| queen_core::claim::CursorRow {
            committed: r.get(0),
            worker_id: r.get::<_, Option<uuid::Uuid>>(1).map(queen_core::WorkerId),
            lease_expires_at: r.get::<_, Option<SystemTime>>(2).map(from_system_time),
            lease_acquired_at: r.get::<_, Option<SystemTime>>(3).map(from_system_time),
            batch_end: r.get(4),
            attempt_count: u(r.get(5)),
            attempt_offset: r.get(6),
            total_consumed: r.get(7),
            retry_offset: r.get(8),
            retry_count: u(r.get(9)),
        }))
    }

    /// (offset, transactionId) of a queue's dead letters, in filing order.
    pub async fn dead_letters(&self, queue: &str) -> StorageResult<Vec<(Offset, String)>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                "SELECT d.msg_offset, d.transaction_id FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id
                  WHERE q.name = $1 ORDER BY d.id",
                &[&queue],
            )
            .await
            .map_err(pg_err("dead letters"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn pop_query(
        &self,
        queue: &str,
        context: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StorageResult<PopResult> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client.prepare_cached(sql).await.map_err(pg_err(context))?;
        let rows = client.query(&stmt, params).await.map_err(pg_err(context))?;
        let mut result = pop_rows::decode(&rows, context)?;
        for c in &mut result.claims {
            c.queue = queue.to_string();
        }
        Ok(result)
    }
}

/// The pop-carried subscription intent as the procedures take it: (mode, from, from=now).
fn intent_params(req: &PopRequest) -> (&'static str, Option<SystemTime>, bool) {
    let mode = match req.intent.mode {
        SubscriptionMode::All => "all",
        SubscriptionMode::New => "new",
    };
    match req.intent.from {
        SubscriptionFrom::Unset => (mode, None, false),
        SubscriptionFrom::Now => (mode, None, true),
        SubscriptionFrom::At(t) => (mode, Some(to_system_time(t)), false),
    }
}

fn lease_param(req: &PopRequest) -> Option<i32> {
    req.lease_seconds
        .map(|s| i32::try_from(s).unwrap_or(i32::MAX))
}

fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn status_text(s: AckStatus) -> &'static str {
    match s {
        AckStatus::Completed => "completed",
        AckStatus::Failed => "failed",
        AckStatus::Retry => "retry",
        AckStatus::Dlq => "dlq",
    }
}

/// The push of a request inside a caller's transaction (a push request, or a transaction op).
async fn push_groups(
    tx: &deadpool_postgres::Transaction<'_>,
    groups: &[PushGroup],
) -> StorageResult<Vec<PushGroupResult>> {
    let stmt = tx
        .prepare_cached(
            "SELECT o_status, o_message_id, o_partition_id, o_offset, o_max_size, o_backlog
               FROM queen.push_v2($1, $2, $3, $4, $5)",
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
            let blob = build_blob(&frames).map_err(|e| StorageError::Invalid(e.to_string()))?;
            let txids: Vec<&str> = frames.iter().map(|f| f.transaction_id.as_str()).collect();
            let ids: Vec<uuid::Uuid> = frames.iter().map(|f| f.message_id).collect();
            let rows = tx
                .query(&stmt, &[&g.queue, &g.partition, &txids, &ids, &blob])
                .await
                .map_err(pg_err("push"))?;
            if rows.len() != candidates.len() {
                return Err(StorageError::Internal(format!(
                    "push_v2 answered {} rows for {} items",
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
                            "push_v2 answered the unknown status {other:?}"
                        )))
                    }
                };
            }
            candidates = retry;
        }
        if !candidates.is_empty() {
            return Err(StorageError::Internal(
                "push_v2 reported duplicates twice under the partition lock".into(),
            ));
        }
        results[i] = firsts
            .resolve(outcome)
            .ok_or_else(|| StorageError::Internal("push outcome missing".into()))?;
    }
    Ok(results)
}

/// Runs ack_v1 on a client or a transaction.
async fn ack_items(
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
impl Storage for PgStorage {
    async fn configure_queue(&self, c: QueueConfig) -> StorageResult<(String, String)> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_queue_id, o_partition_id FROM queen.configure_queue_v1($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19)",
                &[
                    &c.name,
                    &c.namespace,
                    &c.task,
                    &int(c.lease_time),
                    &int(c.retry_limit),
                    &int(c.retry_delay),
                    &c.priority,
                    &int(c.delayed_processing),
                    &int(c.window_buffer),
                    &int(c.max_size),
                    &int(c.ttl),
                    &c.retention_enabled,
                    &int(c.retention_seconds),
                    &int(c.completed_retention_seconds),
                    &c.encryption_enabled,
                    &c.dead_letter_queue,
                    &c.dlq_after_max_retries,
                    &int(c.max_wait_time_seconds),
                    &int(c.min_pop_wait_time),
                ],
            )
            .await
            .map_err(pg_err("configure queue"))?;
        let q: uuid::Uuid = row.get(0);
        let p: uuid::Uuid = row.get(1);
        Ok((q.to_string(), p.to_string()))
    }

    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached(
                "SELECT name, namespace, task, lease_time, retry_limit, retry_delay, priority, delayed_processing,
                        window_buffer, max_size, ttl, retention_enabled, retention_seconds, completed_retention_seconds,
                        encryption_enabled, dead_letter_queue, dlq_after_max_retries, max_wait_time_seconds, min_pop_wait_time
                   FROM queen.queues WHERE name = $1",
            )
            .await
            .map_err(pg_err("queue config"))?;
        let row = client
            .query_opt(&stmt, &[&queue])
            .await
            .map_err(pg_err("queue config"))?;
        let u = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(row.map(|r| QueueConfig {
            name: r.get(0),
            namespace: r.get(1),
            task: r.get(2),
            lease_time: u(r.get(3)),
            retry_limit: u(r.get(4)),
            retry_delay: u(r.get(5)),
            priority: r.get(6),
            delayed_processing: u(r.get(7)),
            window_buffer: u(r.get(8)),
            max_size: u(r.get(9)),
            ttl: u(r.get(10)),
            retention_enabled: r.get(11),
            retention_seconds: u(r.get(12)),
            completed_retention_seconds: u(r.get(13)),
            encryption_enabled: r.get(14),
            dead_letter_queue: r.get(15),
            dlq_after_max_retries: r.get(16),
            max_wait_time_seconds: u(r.get(17)),
            min_pop_wait_time: u(r.get(18)),
        }))
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one("SELECT queen.delete_queue_v1($1)", &[&queue])
            .await
            .map_err(pg_err("delete queue"))?;
        Ok(row.get(0))
    }

    async fn push(&self, groups: Vec<PushGroup>) -> StorageResult<Vec<PushGroupResult>> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client.transaction().await.map_err(pg_err("push: begin"))?;
        let results = push_groups(&tx, &groups).await?;
        tx.commit().await.map_err(pg_err("push: commit"))?;
        Ok(results)
    }

    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_specific_v1",
            "SELECT * FROM queen.log_pop_specific_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &req.queue,
                &partition,
                &req.group,
                &req.worker.0,
                &int(req.batch),
                &req.auto_ack,
                &lease_param(&req),
                &mode,
                &from,
                &now,
            ],
        )
        .await
    }

    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_list_v1",
            "SELECT * FROM queen.log_pop_list_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &req.queue,
                &req.group,
                &candidates,
                &req.worker.0,
                &int(req.batch),
                &int(req.max_partitions),
                &req.auto_ack,
                &lease_param(&req),
                &req.skip_window_debounce,
                &mode,
                &from,
                &now,
            ],
        )
        .await
    }

    async fn pop_wildcard(&self, req: PopRequest) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_wildcard_v1",
            "SELECT * FROM queen.log_pop_wildcard_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &req.queue,
                &req.group,
                &req.worker.0,
                &int(req.batch),
                &int(req.max_partitions),
                &req.auto_ack,
                &lease_param(&req),
                &mode,
                &from,
                &now,
            ],
        )
        .await
    }

    async fn queues_matching(
        &self,
        namespace: Option<String>,
        task: Option<String>,
    ) -> StorageResult<Vec<String>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                "SELECT name FROM queen.queues WHERE ($1::text IS NULL OR namespace = $1) AND ($2::text IS NULL OR task = $2) ORDER BY priority DESC, name",
                &[&namespace, &task],
            )
            .await
            .map_err(pg_err("queues matching"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn next_pending(
        &self,
        queues: &[String],
        group: &str,
    ) -> StorageResult<Option<Timestamp>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached("SELECT queen.log_next_pending_v1($1, $2)")
            .await
            .map_err(pg_err("next pending"))?;
        let row = client
            .query_one(&stmt, &[&queues, &group])
            .await
            .map_err(pg_err("next pending"))?;
        Ok(row.get::<_, Option<SystemTime>>(0).map(from_system_time))
    }

    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached("SELECT queen.log_pending_partitions_v1($1, $2, $3)")
            .await
            .map_err(pg_err("pending partitions"))?;
        let rows = client
            .query(&stmt, &[&queue, &group, &int(limit)])
            .await
            .map_err(pg_err("pending partitions"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        ack_items(&client, group, &items).await
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

#[async_trait]
impl DeliveryStorage for PgStorage {
    async fn transaction(&self, ops: Vec<TxOp>) -> StorageResult<TxOutcome> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client
            .transaction()
            .await
            .map_err(pg_err("transaction: begin"))?;
        let mut results = Vec::with_capacity(ops.len());
        for op in &ops {
            let result = match op {
                TxOp::Push(groups) => TxOpResult::Push(push_groups(&tx, groups).await?),
                TxOp::Ack { group, item } => TxOpResult::Ack(
                    ack_items(&tx, group, std::slice::from_ref(item))
                        .await?
                        .into_iter()
                        .next()
                        .ok_or_else(|| StorageError::Internal("ack_v1 answered no row".into()))?,
                ),
            };
            // Why the transaction must roll back, if this operation was refused.
            let refusal = result.refusal();
            results.push(result);
            if let Some(error) = refusal {
                tx.rollback()
                    .await
                    .map_err(pg_err("transaction: rollback"))?;
                return Ok(TxOutcome {
                    committed: false,
                    results,
                    error: Some(error),
                });
            }
        }
        tx.commit().await.map_err(pg_err("transaction: commit"))?;
        Ok(TxOutcome {
            committed: true,
            results,
            error: None,
        })
    }

    async fn dead_letters(&self, q: DlqQuery) -> StorageResult<(Vec<DeadLetterEntry>, u64)> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let from = q.from.map(to_system_time);
        let to = q.to.map(to_system_time);
        let rows = client
            .query(
                "SELECT * FROM queen.dead_letters_v1($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &q.queue,
                    &q.group,
                    &q.partition,
                    &from,
                    &to,
                    &int(q.limit),
                    &int(q.offset),
                ],
            )
            .await
            .map_err(pg_err("dead letters"))?;
        let mut total: u64 = 0;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            total = u64::try_from(r.get::<_, i64>(13)).unwrap_or(0);
            let offset: i64 = r.get(4);
            let base: Option<i64> = r.get(9);
            let segment = match (
                base,
                r.get::<_, Option<i64>>(10),
                r.get::<_, Option<SystemTime>>(11),
                r.get::<_, Option<Vec<u8>>>(12),
            ) {
                (Some(base), Some(end), Some(created), Some(blob)) => {
                    Some(queen_core::storage::SegmentRow {
                        base_offset: base,
                        start_idx: u32::try_from(offset - base).unwrap_or(0),
                        take: 1,
                        msg_count: u32::try_from(end - base + 1).unwrap_or(0),
                        created_at: from_system_time(created),
                        blob: std::sync::Arc::new(blob),
                    })
                }
                _ => None,
            };
            out.push(DeadLetterEntry {
                id: r.get(0),
                queue: q.queue.clone(),
                partition: r.get(1),
                partition_id: r.get::<_, uuid::Uuid>(2).to_string(),
                group: r.get(3),
                offset,
                transaction_id: r.get(5),
                error: r.get(6),
                retry_count: u32::try_from(r.get::<_, i32>(7)).unwrap_or(0),
                failed_at: from_system_time(r.get(8)),
                segment,
            });
        }
        if rows.is_empty() && q.offset > 0 {
            // The page is past the end: count separately.
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id WHERE q.name = $1
                        AND ($2::text IS NULL OR d.consumer_group = $2) AND ($3::text IS NULL OR d.partition_name = $3)
                        AND ($4::timestamptz IS NULL OR d.failed_at >= $4) AND ($5::timestamptz IS NULL OR d.failed_at <= $5)",
                    &[&q.queue, &q.group, &q.partition, &from, &to],
                )
                .await
                .map_err(pg_err("dead letters"))?
                .get(0);
            total = u64::try_from(n).unwrap_or(0);
        }
        Ok((out, total))
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
    ) -> StorageResult<(u32, u32)> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT o_cursors, o_metadata FROM queen.delete_group_v1($1, $2, $3)",
                &[&group, &queue, &delete_metadata],
            )
            .await
            .map_err(pg_err("delete consumer group"))?;
        Ok((
            u32::try_from(row.get::<_, i32>(0)).unwrap_or(0),
            u32::try_from(row.get::<_, i32>(1)).unwrap_or(0),
        ))
    }

    async fn requeue_dead_letter(
        &self,
        id: i64,
        new_message_id: uuid::Uuid,
    ) -> StorageResult<Option<(String, String, PushOutcome)>> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client
            .transaction()
            .await
            .map_err(pg_err("requeue: begin"))?;
        let row = tx
            .query_opt(
                "SELECT q.name, d.partition_name, d.transaction_id, s.base_offset, s.msg_count, s.blob, d.msg_offset
                   FROM queen.dead_letters d
                   JOIN queen.queues q ON q.id = d.queue_id
                   JOIN LATERAL (SELECT s.base_offset, s.end_offset, s.msg_count, s.blob FROM queen.log_segments s
                                  WHERE s.partition_id = d.partition_id AND s.base_offset <= d.msg_offset
                                  ORDER BY s.base_offset DESC LIMIT 1) s ON s.end_offset >= d.msg_offset
                  WHERE d.id = $1
                    FOR UPDATE OF d",
                &[&id],
            )
            .await
            .map_err(pg_err("requeue: read"))?;
        let Some(r) = row else { return Ok(None) };
        let (queue, partition, txid): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let (base, count, blob, offset): (i64, i32, Vec<u8>, i64) =
            (r.get(3), r.get(4), r.get(5), r.get(6));
        let mut frames = queen_core::frames::slice_blob(
            &blob,
            usize::try_from(offset - base).unwrap_or(0),
            1,
            usize::try_from(count).unwrap_or(0),
        )
        .map_err(|e| StorageError::Internal(format!("requeue: {e}")))?;
        let Some(mut frame) = frames.pop() else {
            return Ok(None);
        };
        frame.message_id = new_message_id;
        frame.transaction_id = queen_core::storage::requeue_transaction_id(id, &txid);
        let mut out = push_groups(
            &tx,
            &[PushGroup {
                queue: queue.clone(),
                partition: partition.clone(),
                frames: vec![frame],
            }],
        )
        .await?;
        tx.execute("DELETE FROM queen.dead_letters WHERE id = $1", &[&id])
            .await
            .map_err(pg_err("requeue: delete"))?;
        tx.commit().await.map_err(pg_err("requeue: commit"))?;
        Ok(out
            .pop()
            .and_then(|mut g| g.pop())
            .map(|o| (queue, partition, o)))
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
}

impl PgStorage {
    /// Listens for deliverability events committed by any broker on this database (`NOTIFY
    /// queen_push` from push_v2, `NOTIFY queen_event` from the triggers of migration 009) on a
    /// dedicated connection, and sends each to `events`. Every (re)connection is followed by a
    /// `Resync`: notifications sent while nobody listened are lost, so the broker re-reads what
    /// it may have missed. Reconnects after a second; returns when the receiver is gone.
    pub async fn listen_events(
        config: tokio_postgres::Config,
        events: tokio::sync::mpsc::UnboundedSender<DeliveryEvent>,
    ) {
        loop {
            match config.connect(tokio_postgres::NoTls).await {
                Ok((client, mut connection)) => {
                    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
                    let forward = events.clone();
                    let driver = tokio::spawn(async move {
                        let mut done_tx = Some(done_tx);
                        loop {
                            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                                    let Some(event) = notification_event(n.channel(), n.payload())
                                    else {
                                        tracing::warn!(
                                            channel = n.channel(),
                                            payload = n.payload(),
                                            "unreadable notification"
                                        );
                                        continue;
                                    };
                                    if forward.send(event).is_err() {
                                        break;
                                    }
                                }
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break,
                            }
                        }
                        if let Some(d) = done_tx.take() {
                            let _ = d.send(());
                        }
                    });
                    if let Err(e) = client
                        .batch_execute("LISTEN queen_push; LISTEN queen_event")
                        .await
                    {
                        tracing::warn!(error = %e, "LISTEN failed; retrying");
                    } else {
                        tracing::info!("listening for deliverability events from every broker");
                        if events.send(DeliveryEvent::Resync).is_err() {
                            driver.abort();
                            return;
                        }
                        tokio::select! {
                            _ = &mut done_rx => {}
                            _ = events.closed() => {
                                driver.abort();
                                return;
                            }
                        }
                    }
                    driver.abort();
                    tracing::warn!("event notification connection lost; reconnecting");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open the event notification connection; retrying")
                }
            }
            if events.is_closed() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

/// A notification as an event: push_v2's `queue\npartition\ncount` on `queen_push`, the
/// triggers' payloads on `queen_event`.
fn notification_event(channel: &str, payload: &str) -> Option<DeliveryEvent> {
    match channel {
        "queen_push" => DeliveryEvent::parse(&format!("push\n{payload}")),
        "queen_event" => DeliveryEvent::parse(payload),
        _ => None,
    }
}

#[cfg(test)]
mod notification_tests {
    use super::*;

    #[test]
    fn push_and_trigger_payloads_parse() {
        assert_eq!(
            notification_event("queen_push", "q\np\n3"),
            Some(DeliveryEvent::Pushed {
                queue: "q".into(),
                partition: "p".into(),
                count: 3
            })
        );
        assert_eq!(
            notification_event("queen_event", "group\nq\ng"),
            Some(DeliveryEvent::GroupReset {
                queue: Some("q".into()),
                group: "g".into()
            })
        );
        assert_eq!(notification_event("other", "x"), None);
    }
}
