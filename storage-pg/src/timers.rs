//! Timers on PostgreSQL: the upsert, the cancel and the firing `queen_core::timers` describes.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use queen_core::storage::{StorageError, StorageResult, TimerStorage};
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
            txn,
            message_id,
            ..
        } => {
            let row = op
                .scheduled_row(now)
                .ok_or_else(|| StorageError::Internal("timers: a schedule without a row".into()))?;
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

/// A run of `TxOp::FireTimer`s in one statement: whether each removed its timer (a timer named
/// twice is removed by its first op only, as ops one at a time would).
pub(crate) async fn fire_run(
    client: &impl GenericClient,
    run: &[(&str, &str, uuid::Uuid)],
) -> StorageResult<Vec<bool>> {
    if let [(queue, key, id)] = run {
        return Ok(vec![fire(client, queue, key, id).await?]);
    }
    let queues: Vec<&str> = run.iter().map(|r| r.0).collect();
    let keys: Vec<&str> = run.iter().map(|r| r.1).collect();
    let ids: Vec<uuid::Uuid> = run.iter().map(|r| r.2).collect();
    let rows = client
        .query(
            &prepared(
                client,
                "DELETE FROM queen.timers t
                  USING unnest($1::text[], $2::text[], $3::uuid[]) AS u(q, k, m)
                  WHERE t.queue = u.q AND t.timer_key = u.k AND t.message_id = u.m
                    AND t.deliver_at <= queen.now()
                  RETURNING t.queue, t.timer_key, t.message_id",
            )
            .await?,
            &[&queues, &keys, &ids],
        )
        .await
        .map_err(pg_err("timers: fire"))?;
    let mut removed: std::collections::BTreeSet<(String, String, uuid::Uuid)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    Ok(run
        .iter()
        .map(|(q, k, m)| removed.remove(&(q.to_string(), k.to_string(), *m)))
        .collect())
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
        // Runs of schedules of distinct timers go as one statement each (an upsert may not
        // touch one row twice); a cancel, or a timer named again, starts a new run, so the
        // ops still apply in their order.
        let mut run: Vec<&TimerOp> = vec![];
        for op in ops {
            let named_again = run.iter().any(|o| o.timer() == op.timer());
            if matches!(op, TimerOp::Cancel { .. }) || named_again {
                out.extend(schedule_run(&tx, &run, now).await?);
                run.clear();
            }
            match op {
                TimerOp::Schedule { .. } => run.push(op),
                TimerOp::Cancel { .. } => out.push(timer_op(&tx, op, now).await?),
            }
        }
        out.extend(schedule_run(&tx, &run, now).await?);
        tx.commit().await.map_err(pg_err("timers: commit"))?;
        Ok(out)
    }
}

/// Schedules of distinct timers in one upsert; their answers in the run's order.
async fn schedule_run(
    client: &impl GenericClient,
    run: &[&TimerOp],
    now: Timestamp,
) -> StorageResult<Vec<Value>> {
    if let [op] = run {
        return Ok(vec![timer_op(client, op, now).await?]);
    }
    let mut keyed: Vec<(&str, &str, TimerRow)> = Vec::with_capacity(run.len());
    for op in run {
        let (queue, key) = op.timer();
        let row = op.scheduled_row(now).ok_or_else(|| {
            StorageError::Internal("timers: a cancel in a run of schedules".into())
        })?;
        keyed.push((queue, key, row));
    }
    if keyed.is_empty() {
        return Ok(vec![]);
    }
    let queues: Vec<&str> = keyed.iter().map(|k| k.0).collect();
    let keys: Vec<&str> = keyed.iter().map(|k| k.1).collect();
    let partitions: Vec<&str> = keyed.iter().map(|k| k.2.partition.as_str()).collect();
    let payloads: Vec<&[u8]> = keyed.iter().map(|k| k.2.payload.as_slice()).collect();
    let txns: Vec<&str> = keyed.iter().map(|k| k.2.txn.as_str()).collect();
    let ids: Vec<uuid::Uuid> = keyed.iter().map(|k| k.2.message_id).collect();
    let due: Vec<std::time::SystemTime> = keyed
        .iter()
        .map(|k| to_system_time(k.2.deliver_at))
        .collect();
    // xmax is set on a row version an ON CONFLICT update wrote: the timer replaced one.
    let rows = client
        .query(
            &prepared(
                client,
                "INSERT INTO queen.timers (queue, timer_key, partition, payload, txn, message_id, deliver_at, created_at)
                 SELECT u.q, u.k, u.p, u.b, u.t, u.m, u.d, $8
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[],
                               $6::uuid[], $7::timestamptz[]) AS u(q, k, p, b, t, m, d)
                 ON CONFLICT (queue, timer_key) DO UPDATE
                    SET partition = EXCLUDED.partition, payload = EXCLUDED.payload,
                        txn = EXCLUDED.txn, message_id = EXCLUDED.message_id,
                        deliver_at = EXCLUDED.deliver_at, created_at = EXCLUDED.created_at
                 RETURNING queue, timer_key, xmax <> 0",
            )
            .await?,
            &[
                &queues,
                &keys,
                &partitions,
                &payloads,
                &txns,
                &ids,
                &due,
                &to_system_time(now),
            ],
        )
        .await
        .map_err(pg_err("timers: schedule"))?;
    let replaced: std::collections::BTreeMap<(String, String), bool> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    keyed
        .iter()
        .map(|(queue, key, row)| {
            let was = replaced
                .get(&(queue.to_string(), key.to_string()))
                .ok_or_else(|| {
                    StorageError::Internal(format!("timers: {queue}/{key} not written"))
                })?;
            Ok(timers::scheduled(queue, key, row, *was))
        })
        .collect()
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

    /// `SKIP LOCKED` passes over the rows a firing on another broker is deleting (its
    /// transaction holds their locks until it commits). The read's own locks end with its
    /// statement: they only keep two reads at one instant apart.
    async fn due_timers(&self, limit: u32, skip_queues: &[String]) -> StorageResult<Vec<DueTimer>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let rows = client
            .query(
                &prepared(
                    &client,
                    &format!(
                        "SELECT queue, timer_key, {ROW} FROM queen.timers
                      WHERE deliver_at <= queen.now() AND NOT (queue = ANY($2::text[]))
                      ORDER BY deliver_at, queue, timer_key LIMIT $1
                      FOR UPDATE SKIP LOCKED"
                    ),
                )
                .await?,
                &[&i64::from(limit), &skip_queues],
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

    async fn next_timer_due(&self, skip_queues: &[String]) -> StorageResult<Option<Timestamp>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                &prepared(
                    &client,
                    "SELECT min(deliver_at) FROM queen.timers WHERE NOT (queue = ANY($1::text[]))",
                )
                .await?,
                &[&skip_queues],
            )
            .await
            .map_err(pg_err("timers: next due"))?;
        Ok(row
            .get::<_, Option<std::time::SystemTime>>(0)
            .map(from_system_time))
    }
}
