//! Timers on PostgreSQL: the upsert, the cancel and the firing `queen_core::timers` describes.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use queen_core::storage::{StorageResult, TimerStorage};
use queen_core::timers::{self, DueTimer, TimerOp, TimerRow};
use queen_core::Timestamp;
use serde_json::Value;
use tokio_postgres::Row;

use crate::error::{pg_err, pool_err, prepared, retry_contention};
use crate::kv::db_now;
use crate::{from_system_time, to_system_time, PgStorage};

const ROW: &str = "partition, payload, txn, message_id, deliver_at, created_at";

fn timer_row(r: &Row, at: usize) -> TimerRow {
    TimerRow {
        partition: r.get(at),
        payload: r.get(at + 1),
        txn: r.get(at + 2),
        message_id: r.get(at + 3),
        deliver_at: from_system_time(r.get(at + 4)),
        created_at: from_system_time(r.get(at + 5)),
    }
}

/// One schedule or cancel, in a batch or a transaction's rider.
pub(crate) async fn timer_op(
    client: &impl GenericClient,
    op: &TimerOp,
    now: Timestamp,
) -> StorageResult<Value> {
    match op {
        TimerOp::Schedule {
            queue,
            key,
            partition,
            payload,
            delay_ms,
            txn,
            message_id,
        } => {
            let row = TimerRow {
                partition: partition.clone(),
                payload: payload.clone(),
                txn: txn.clone(),
                message_id: *message_id,
                deliver_at: timers::deliver_at(now, *delay_ms),
                created_at: now,
            };
            // xmax is set on a row version an ON CONFLICT update wrote: the timer replaced one.
            let r = client
                .query_one(
                    &prepared(client, "INSERT INTO queen.timers (queue, timer_key, partition, payload, txn, message_id, deliver_at, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (queue, timer_key) DO UPDATE
                        SET partition = EXCLUDED.partition, payload = EXCLUDED.payload,
                            txn = EXCLUDED.txn, message_id = EXCLUDED.message_id,
                            deliver_at = EXCLUDED.deliver_at, created_at = EXCLUDED.created_at
                     RETURNING xmax <> 0").await?,
                    &[
                        queue,
                        key,
                        partition,
                        payload,
                        txn,
                        message_id,
                        &to_system_time(row.deliver_at),
                        &to_system_time(now),
                    ],
                )
                .await
                .map_err(pg_err("timers: schedule"))?;
            Ok(timers::scheduled(queue, key, &row, r.get(0)))
        }
        TimerOp::Cancel { queue, key, txn } => {
            let rows = client
                .query(
                    &prepared(client, &format!(
                        "DELETE FROM queen.timers WHERE queue = $1 AND timer_key = $2 RETURNING {ROW}"
                    )).await?,
                    &[queue, key],
                )
                .await
                .map_err(pg_err("timers: cancel"))?;
            let removed = rows.first().map(|r| timer_row(r, 0));
            Ok(timers::cancelled(
                queue,
                key,
                removed.as_ref(),
                txn.as_deref(),
            ))
        }
    }
}

/// `TxOp::FireTimer`: removes the timer if this incarnation is still pending and due.
pub(crate) async fn fire(
    client: &impl GenericClient,
    queue: &str,
    key: &str,
    message_id: &uuid::Uuid,
) -> StorageResult<bool> {
    let n = client
        .execute(
            &prepared(client, "DELETE FROM queen.timers
              WHERE queue = $1 AND timer_key = $2 AND message_id = $3 AND deliver_at <= queen.now()").await?,
            &[&queue, &key, message_id],
        )
        .await
        .map_err(pg_err("timers: fire"))?;
    Ok(n == 1)
}

impl PgStorage {
    async fn timers_batch_once(&self, ops: &[TimerOp]) -> StorageResult<Vec<Value>> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client
            .transaction()
            .await
            .map_err(pg_err("timers: begin"))?;
        let now = db_now(&tx).await?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(timer_op(&tx, op, now).await?);
        }
        tx.commit().await.map_err(pg_err("timers: commit"))?;
        Ok(out)
    }
}

#[async_trait]
impl TimerStorage for PgStorage {
    async fn timers_batch(&self, ops: Vec<TimerOp>) -> StorageResult<Vec<Value>> {
        let (this, ops) = (self, &ops);
        retry_contention(move || this.timers_batch_once(ops)).await
    }

    async fn timer_peek(&self, queue: &str, key: &str) -> StorageResult<Option<TimerRow>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                &prepared(
                    &client,
                    &format!("SELECT {ROW} FROM queen.timers WHERE queue = $1 AND timer_key = $2"),
                )
                .await?,
                &[&queue, &key],
            )
            .await
            .map_err(pg_err("timers: peek"))?;
        Ok(rows.first().map(|r| timer_row(r, 0)))
    }

    async fn timer_page(
        &self,
        queue: &str,
        after: Option<String>,
        limit: u32,
    ) -> StorageResult<Vec<(String, TimerRow)>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                &prepared(
                    &client,
                    &format!(
                        "SELECT timer_key, {ROW} FROM queen.timers
                      WHERE queue = $1 AND ($2::text IS NULL OR timer_key > $2)
                      ORDER BY timer_key LIMIT $3"
                    ),
                )
                .await?,
                &[&queue, &after, &(i64::from(limit) + 1)],
            )
            .await
            .map_err(pg_err("timers: list"))?;
        Ok(rows.iter().map(|r| (r.get(0), timer_row(r, 1))).collect())
    }

    async fn due_timers(&self, limit: u32) -> StorageResult<Vec<DueTimer>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                &prepared(
                    &client,
                    &format!(
                        "SELECT queue, timer_key, {ROW} FROM queen.timers
                      WHERE deliver_at <= queen.now()
                      ORDER BY deliver_at, queue, timer_key LIMIT $1"
                    ),
                )
                .await?,
                &[&i64::from(limit)],
            )
            .await
            .map_err(pg_err("timers: due"))?;
        Ok(rows
            .iter()
            .map(|r| DueTimer {
                queue: r.get(0),
                key: r.get(1),
                row: timer_row(r, 2),
            })
            .collect())
    }

    async fn next_timer_due(&self) -> StorageResult<Option<Timestamp>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                &prepared(&client, "SELECT min(deliver_at) FROM queen.timers").await?,
                &[],
            )
            .await
            .map_err(pg_err("timers: next due"))?;
        Ok(row
            .get::<_, Option<std::time::SystemTime>>(0)
            .map(from_system_time))
    }
}
