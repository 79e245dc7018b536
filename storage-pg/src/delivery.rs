//! Transactions and dead letters on PostgreSQL.

use std::time::SystemTime;

use async_trait::async_trait;
use queen_core::storage::{
    DeadLetterEntry, DeadLetterPage, DeliveryStorage, DlqQuery, PushGroup, Requeued, SealCheck,
    StorageError, StorageResult, TxOp, TxOpResult, TxOutcome,
};

use crate::error::{pg_err, pool_err, retry_contention};
use crate::messages::{ack_items, push_groups, Dedup, PushFailure};
use crate::{from_system_time, int, to_system_time, PgStorage};

#[async_trait]
impl DeliveryStorage for PgStorage {
    async fn transaction(&self, ops: Vec<TxOp>) -> StorageResult<TxOutcome> {
        let (this, ops) = (self, &ops);
        retry_contention(move || this.transaction_once(ops)).await
    }

    async fn dead_letters(&self, q: DlqQuery) -> StorageResult<DeadLetterPage> {
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
        Ok(DeadLetterPage {
            entries: out,
            total,
        })
    }

    async fn requeue_dead_letter(
        &self,
        id: i64,
        new_message_id: uuid::Uuid,
    ) -> StorageResult<Option<Requeued>> {
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
                blob: None,
            }],
            None,
            SealCheck::AsStored,
            Dedup::Answer,
        )
        .await
        .map_err(PushFailure::into_storage)?;
        tx.execute("DELETE FROM queen.dead_letters WHERE id = $1", &[&id])
            .await
            .map_err(pg_err("requeue: delete"))?;
        tx.commit().await.map_err(pg_err("requeue: commit"))?;
        Ok(out.pop().and_then(|mut g| g.pop()).map(|outcome| Requeued {
            queue,
            partition,
            outcome,
        }))
    }
}

impl PgStorage {
    /// One attempt of a transaction request: everything commits, or nothing does.
    async fn transaction_once(&self, ops: &[TxOp]) -> StorageResult<TxOutcome> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client
            .transaction()
            .await
            .map_err(pg_err("transaction: begin"))?;
        let mut results = Vec::with_capacity(ops.len());
        let mut kv_now = None;
        // A run of firings goes as one statement when its first op comes up (a due set is up
        // to a hundred timers: a round trip each was most of a firing's time).
        let mut fired_ahead: std::collections::BTreeMap<usize, bool> = Default::default();
        for (i, op) in ops.iter().enumerate() {
            let result = match op {
                TxOp::Push(groups) => TxOpResult::Push(
                    push_groups(&tx, groups, None, SealCheck::Enforce, Dedup::Answer)
                        .await
                        .map_err(PushFailure::into_storage)?,
                ),
                TxOp::Ack { group, item } => TxOpResult::Ack(
                    ack_items(&tx, group, std::slice::from_ref(item))
                        .await?
                        .into_iter()
                        .next()
                        .ok_or_else(|| StorageError::Internal("ack_v3 answered no row".into()))?,
                ),
                TxOp::Kv(op) => {
                    let now = match kv_now {
                        Some(now) => now,
                        None => *kv_now.insert(crate::kv::db_now(&tx).await?),
                    };
                    let limits = queen_core::kv::KvLimits::default();
                    let (answer, refused) = crate::kv::kv_op(&tx, op, now, &limits).await?;
                    TxOpResult::Kv {
                        answer,
                        refused,
                        required: op.required(),
                    }
                }
                TxOp::Timer(op) => {
                    let now = match kv_now {
                        Some(now) => now,
                        None => *kv_now.insert(crate::kv::db_now(&tx).await?),
                    };
                    TxOpResult::Timer(crate::timers::timer_op(&tx, op, now).await?)
                }
                TxOp::Stream(op) => TxOpResult::Stream(crate::streams::cycle_op(&tx, op).await?),
                TxOp::EndLease {
                    group,
                    partition_id,
                    lease_id,
                } => TxOpResult::Ack(queen_core::streams::lease_end_outcome(
                    crate::streams::end_lease(&tx, group, partition_id, lease_id).await?,
                )),
                TxOp::FireTimer { .. } => {
                    if !fired_ahead.contains_key(&i) {
                        let run: Vec<(&str, &str, uuid::Uuid)> = ops[i..]
                            .iter()
                            .map_while(|o| match o {
                                TxOp::FireTimer {
                                    queue,
                                    key,
                                    message_id,
                                } => Some((queue.as_str(), key.as_str(), *message_id)),
                                _ => None,
                            })
                            .collect();
                        let fired = crate::timers::fire_run(&tx, &run).await?;
                        fired_ahead.extend(fired.into_iter().enumerate().map(|(k, f)| (i + k, f)));
                    }
                    let fired = fired_ahead.get(&i).copied().ok_or_else(|| {
                        StorageError::Internal(format!("transaction: firing {i} not run"))
                    })?;
                    TxOpResult::Fired(fired)
                }
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
}
