//! The pop path on PostgreSQL: the log_pop_* procedures, and the scheduler's reads.

use std::time::SystemTime;

use async_trait::async_trait;
use queen_core::params::{SubscriptionFrom, SubscriptionMode};
use queen_core::storage::{PopRequest, PopResult, PopStorage, QueueConfig, StorageResult};
use queen_core::Timestamp;

use crate::error::{pg_err, pool_err, retry_contention};
use crate::{from_system_time, int, pop_rows, to_system_time, PgStorage};
use queen_core::storage::StorageError;

impl PgStorage {
    async fn pop_query(
        &self,
        queue: &str,
        context: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StorageResult<PopResult> {
        let rows = self.pop_rows(context, sql, params).await?;
        let mut result = pop_rows::decode(&rows, 0, context)?;
        name_queue(&mut result, queue);
        Ok(result)
    }

    /// A pop procedure's rows, run again on contention (its transaction rolled back whole).
    async fn pop_rows(
        &self,
        context: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StorageResult<Vec<tokio_postgres::Row>> {
        let this = self;
        retry_contention(move || async move {
            let client = this.pool.get().await.map_err(pool_err)?;
            let stmt = client.prepare_cached(sql).await.map_err(pg_err(context))?;
            client.query(&stmt, params).await.map_err(|e| {
                // A cursor row inserted for a partition the retention worker deleted in the
                // meantime (an empty, inactive one): the pop looks again and finds it gone.
                if e.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) {
                    StorageError::Contention(format!("{context}: partition removed meanwhile: {e}"))
                } else {
                    pg_err(context)(e)
                }
            })
        })
        .await
    }

    /// Ring pops of several requests in one statement: one transaction, the pops in order.
    async fn pop_list_together(
        &self,
        pops: &[(PopRequest, Vec<String>)],
    ) -> StorageResult<Vec<PopResult>> {
        let mut queues = Vec::with_capacity(pops.len());
        let mut groups = Vec::with_capacity(pops.len());
        let mut workers = Vec::with_capacity(pops.len());
        let mut batches = Vec::with_capacity(pops.len());
        let mut max_partitions = Vec::with_capacity(pops.len());
        let mut auto_acks = Vec::with_capacity(pops.len());
        let mut leases = Vec::with_capacity(pops.len());
        let mut skip_windows = Vec::with_capacity(pops.len());
        let mut modes = Vec::with_capacity(pops.len());
        let mut froms = Vec::with_capacity(pops.len());
        let mut from_nows = Vec::with_capacity(pops.len());
        let mut conflations = Vec::with_capacity(pops.len());
        // The candidates flattened, each name beside the (1-based) number of its pop: a
        // PostgreSQL array of arrays must be rectangular.
        let mut names: Vec<&str> = vec![];
        let mut owners: Vec<i32> = vec![];
        for (i, (req, candidates)) in pops.iter().enumerate() {
            let (mode, from, now) = intent_params(req);
            queues.push(req.queue.as_str());
            groups.push(req.group.as_str());
            workers.push(req.worker.0);
            batches.push(int(req.batch));
            max_partitions.push(int(req.max_partitions));
            auto_acks.push(req.auto_ack);
            leases.push(lease_param(req));
            skip_windows.push(req.skip_window_debounce);
            modes.push(mode);
            froms.push(from);
            from_nows.push(now);
            conflations.push(req.conflation);
            let owner = i32::try_from(i + 1).map_err(|_| {
                StorageError::Internal(format!("{} pops in one statement", pops.len()))
            })?;
            for name in candidates {
                names.push(name);
                owners.push(owner);
            }
        }
        let context = "log_pop_loop_v2 (ring candidates of several pops)";
        let rows = self
            .pop_rows(
                context,
                // Each pop is the one-pop statement's loop call (see pop_list), laterally per
                // request; ORDER BY keeps each pop's rows together and in the loop's order.
                "SELECT r.i, l.o_partition, l.o_partition_id, l.o_kind, l.o_until, l.o_first,
                        l.o_last, l.o_attempt, l.o_lease_exp, l.o_base, l.o_start, l.o_take,
                        l.o_count, l.o_created, l.o_blob
                   FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int[], $5::int[],
                               $6::bool[], $7::int[], $8::bool[], $9::text[], $10::timestamptz[],
                               $11::bool[], $14::bool[])
                        WITH ORDINALITY AS r(queue, grp, worker, batch, max_partitions,
                                             auto_ack, lease, skip_window, sub_mode, sub_from,
                                             sub_now, conflation, i)
                  CROSS JOIN LATERAL queen.log_pop_loop_v2(
                        (SELECT q FROM queen.queues q WHERE q.name = r.queue), r.grp,
                        ARRAY(SELECT c.name
                                FROM unnest($12::text[], $13::int[]) WITH ORDINALITY
                                     AS c(name, pop, k)
                               WHERE c.pop = r.i
                               ORDER BY c.k),
                        NULL::uuid[], r.worker, r.batch, r.max_partitions, r.auto_ack, r.lease,
                        r.skip_window, r.sub_mode, r.sub_from, r.sub_now, queen.now(),
                        r.conflation)
                        WITH ORDINALITY AS l
                  ORDER BY r.i, l.ordinality",
                &[
                    &queues,
                    &groups,
                    &workers,
                    &batches,
                    &max_partitions,
                    &auto_acks,
                    &leases,
                    &skip_windows,
                    &modes,
                    &froms,
                    &from_nows,
                    &names,
                    &owners,
                    &conflations,
                ],
            )
            .await?;
        let mut answers = Vec::with_capacity(pops.len());
        let mut at = 0;
        for (i, (req, _)) in pops.iter().enumerate() {
            let number = i64::try_from(i + 1).unwrap_or(i64::MAX);
            let mut end = at;
            while end < rows.len() {
                let owner: i64 = rows[end]
                    .try_get(0)
                    .map_err(|e| StorageError::Internal(format!("{context}: pop number: {e}")))?;
                if owner != number {
                    break;
                }
                end += 1;
            }
            let mut result = pop_rows::decode(&rows[at..end], 1, context)?;
            name_queue(&mut result, &req.queue);
            answers.push(result);
            at = end;
        }
        if at != rows.len() {
            return Err(StorageError::Internal(format!(
                "{context}: rows of no pop (pop numbers out of order)"
            )));
        }
        Ok(answers)
    }
}

fn name_queue(result: &mut PopResult, queue: &str) {
    for c in &mut result.claims {
        c.queue = queue.to_string();
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

/// The columns of `queen.queues` a `QueueConfig` is read from, in `config_from_row`'s order.
pub(crate) const CONFIG_COLUMNS: &str = "name, namespace, task, lease_time, retry_limit, retry_delay, priority, delayed_processing,
    window_buffer, max_size, ttl, retention_enabled, retention_seconds, completed_retention_seconds,
    encryption_enabled, dead_letter_queue, dlq_after_max_retries, max_wait_time_seconds, min_pop_wait_time";

/// A queue's configuration from `CONFIG_COLUMNS`, starting at column `at`.
pub(crate) fn config_from_row(r: &tokio_postgres::Row, at: usize) -> QueueConfig {
    let u = |i: usize| u32::try_from(r.get::<_, i32>(at + i)).unwrap_or(0);
    QueueConfig {
        name: r.get(at),
        namespace: r.get(at + 1),
        task: r.get(at + 2),
        lease_time_secs: u(3),
        retry_limit: u(4),
        retry_delay_ms: u(5),
        priority: r.get(at + 6),
        delayed_processing_secs: u(7),
        window_buffer_secs: u(8),
        max_size: u(9),
        ttl_secs: u(10),
        retention_enabled: r.get(at + 11),
        retention_seconds: u(12),
        completed_retention_seconds: u(13),
        encryption_enabled: r.get(at + 14),
        dead_letter_queue: r.get(at + 15),
        dlq_after_max_retries: r.get(at + 16),
        max_wait_time_seconds: u(17),
        min_pop_wait_ms: u(18),
    }
}

#[async_trait]
impl PopStorage for PgStorage {
    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {CONFIG_COLUMNS} FROM queen.queues WHERE name = $1"
            ))
            .await
            .map_err(pg_err("queue config"))?;
        let row = client
            .query_opt(&stmt, &[&queue])
            .await
            .map_err(pg_err("queue config"))?;
        Ok(row.map(|r| config_from_row(&r, 0)))
    }

    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_specific_v2",
            "SELECT * FROM queen.log_pop_specific_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
                &req.conflation,
            ],
        )
        .await
    }

    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_loop_v2 (ring candidates)",
            // The loop called directly, not through a plpgsql wrapper that looked the queue up:
            // each wrapper level copies every row (blobs included) through one more tuplestore.
            // A missing queue is a NULL row, whose names the loop answers 'missing' one by one;
            // a NULL id array means every name is resolved.
            "SELECT * FROM queen.log_pop_loop_v2(
                 (SELECT q FROM queen.queues q WHERE q.name = $1), $2, $3, NULL::uuid[], $4, $5,
                 $6, $7, $8, $9, $10, $11, $12, queen.now(), $13)",
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
                &req.conflation,
            ],
        )
        .await
    }

    async fn pop_list_many(
        &self,
        pops: Vec<(PopRequest, Vec<String>)>,
    ) -> Vec<StorageResult<PopResult>> {
        let mut pops = pops;
        if pops.len() <= 1 {
            // One pop is the one-pop statement (no arrays to build and unpack).
            return match pops.pop() {
                Some((req, candidates)) => vec![self.pop_list(req, candidates).await],
                None => vec![],
            };
        }
        match self.pop_list_together(&pops).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            // One transaction: it failed for all of them, and claimed nothing for any.
            Err(e) => pops.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn pop_wildcard(&self, req: PopRequest) -> StorageResult<PopResult> {
        let (mode, from, now) = intent_params(&req);
        self.pop_query(
            &req.queue,
            "log_pop_wildcard_v2",
            "SELECT * FROM queen.log_pop_wildcard_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
                &req.conflation,
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
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached("SELECT queen.log_pending_partitions_v2($1, $2, $3, $4)")
            .await
            .map_err(pg_err("pending partitions"))?;
        let rows = client
            .query(&stmt, &[&queue, &group, &after, &int(limit)])
            .await
            .map_err(pg_err("pending partitions"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn partition_numbers(&self, partition_ids: &[String]) -> StorageResult<Vec<Option<u64>>> {
        let ids: Vec<Option<uuid::Uuid>> = partition_ids
            .iter()
            .map(|id| uuid::Uuid::parse_str(id).ok())
            .collect();
        let mut known: Vec<Option<u64>> = {
            let cache = self.partition_numbers_cache();
            ids.iter()
                .map(|id| id.and_then(|id| cache.get(&id).copied()))
                .collect()
        };
        let missing: Vec<uuid::Uuid> = ids
            .iter()
            .zip(&known)
            .filter_map(|(id, n)| if n.is_none() { *id } else { None })
            .collect();
        if missing.is_empty() {
            return Ok(known);
        }
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached("SELECT id, seq FROM queen.log_partitions WHERE id = ANY ($1)")
            .await
            .map_err(pg_err("partition numbers"))?;
        let rows = client
            .query(&stmt, &[&missing])
            .await
            .map_err(pg_err("partition numbers"))?;
        let mut cache = self.partition_numbers_cache();
        for row in &rows {
            let id: uuid::Uuid = row.get(0);
            let seq: i64 = row.get(1);
            let seq = u64::try_from(seq).map_err(|_| {
                StorageError::Internal(format!("partition {id} has the negative number {seq}"))
            })?;
            cache.insert(id, seq);
        }
        for (n, id) in known.iter_mut().zip(&ids) {
            if n.is_none() {
                *n = id.and_then(|id| cache.get(&id).copied());
            }
        }
        Ok(known)
    }
}
