//! The admin API's reads on PostgreSQL. Plain statements, not procedures: each is one read
//! (or one small write) with no rule of its own to keep in one place. This file holds the
//! queue and partition views (and the admin pass's reads of whole queues), messages and
//! segments; `traces.rs` the traces, `samples.rs` the brokers' samples and the stored totals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio_postgres::types::Type;

use async_trait::async_trait;
use queen_core::storage::{
    CreatedCount, CursorView, DeadLetterRef, InspectStorage, PartitionView, QueueFilter, QueueView,
    SegmentQuery, SegmentRow, StorageError, StorageResult, StoredMessage, StoredSegment,
    StoredTotals, TraceInput, TraceName, TraceRecord, WorkerSample,
};
use queen_core::Timestamp;

use crate::error::{pg_err, pool_err, prepared};
use crate::pop::{config_from_row, CONFIG_COLUMNS};
use crate::{from_system_time, to_system_time, PgStorage};

mod samples;
mod traces;

fn ts(t: SystemTime) -> Timestamp {
    from_system_time(t)
}

fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn parse_uuid(id: &str) -> StorageResult<uuid::Uuid> {
    uuid::Uuid::parse_str(id)
        .map_err(|_| StorageError::Invalid(format!("partitionId must be a UUID, got {id:?}")))
}

// The expressions the partition reads share, as literals for `concat!`.
/// A partition's first and last retained segment (`h`, `t`), by primary-key probes.
macro_rules! segment_ends {
    () => {
        "LEFT JOIN LATERAL (SELECT s.base_offset, s.created_at FROM queen.log_segments s
                            WHERE s.partition_id = p.id ORDER BY s.base_offset LIMIT 1) h ON true
         LEFT JOIN LATERAL (SELECT s.created_at FROM queen.log_segments s
                            WHERE s.partition_id = p.id ORDER BY s.base_offset DESC LIMIT 1) t ON true"
    };
}
/// A partition's columns for `partition_view`, after `segment_ends`.
macro_rules! partition_columns {
    () => {
        "p.name, p.id, p.created_at, p.last_offset,
         COALESCE(h.base_offset, p.last_offset + 1), h.created_at, t.created_at"
    };
}
/// A cursor's live lease: its end, and the last offset it covers.
macro_rules! lease_end {
    () => {
        "CASE WHEN c.worker_id IS NOT NULL AND c.lease_expires_at > queen.now() THEN c.lease_expires_at END"
    };
}
macro_rules! leased_through {
    () => {
        "CASE WHEN c.worker_id IS NOT NULL AND c.lease_expires_at > queen.now() THEN c.batch_end END"
    };
}
/// The created_at of a cursor's oldest unconsumed message's segment, by two primary-key probes:
/// the one holding committed + 1, else (retention removed it) the next.
macro_rules! oldest_unconsumed_at {
    () => {
        "CASE WHEN c.committed < p.last_offset THEN COALESCE(
            (SELECT s.created_at FROM queen.log_segments s
              WHERE s.partition_id = c.partition_id AND s.base_offset <= c.committed + 1
                AND s.end_offset > c.committed
              ORDER BY s.base_offset DESC LIMIT 1),
            (SELECT s.created_at FROM queen.log_segments s
              WHERE s.partition_id = c.partition_id AND s.base_offset > c.committed
              ORDER BY s.base_offset LIMIT 1)) END"
    };
}

/// Every cursor on partition `p` that `$group` (a condition on `c`) takes, as arrays (aligned,
/// in no order: an ORDER BY in each aggregate sorted seven times per partition, 11.5 s against
/// 8.0 s at a million), by probes of the cursors' primary key.
macro_rules! cursor_arrays {
    ($group:literal) => {
        concat!(
            " LEFT JOIN LATERAL (
               SELECT array_agg(c.consumer_group) AS groups, array_agg(c.committed) AS committed,
                      array_agg(",
            lease_end!(),
            ") AS leased_until, array_agg(",
            leased_through!(),
            ") AS leased_through, array_agg(c.worker_id::text) AS workers,
                      array_agg(c.total_consumed) AS consumed, array_agg(",
            oldest_unconsumed_at!(),
            ") AS oldest
                 FROM queen.log_consumers c WHERE c.partition_id = p.id AND ",
            $group,
            ") cs ON true"
        )
    };
}
/// The arrays of `cursor_arrays`, after `partition_columns`.
macro_rules! cursor_columns {
    () => {
        "cs.groups, cs.committed, cs.leased_until, cs.leased_through, cs.workers, cs.consumed,
         cs.oldest"
    };
}

/// Partitions matching `{filter}` (with their first and last retained segment) and their
/// cursors, those of the group `$1` when it is not null. One statement: the cursors as a second
/// one over the page's ids probed each partition's row again, 14.9 ms against 11.2 ms for a page
/// of 1,000 of a million.
const PARTITIONS: &str = concat!(
    "SELECT q.name, ",
    partition_columns!(),
    ", ",
    cursor_columns!(),
    " FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id ",
    segment_ends!(),
    cursor_arrays!("($1::text IS NULL OR c.consumer_group = $1)"),
    " WHERE {filter} ORDER BY q.name, p.name"
);

/// A page of one queue's partitions (by id) with every cursor on it: those after partition id
/// `$2` (all when null), at most `$3`, each partition's segments and cursors by primary-key
/// probes. In the order of partition ids, which those keys begin with, so consecutive probes walk
/// the indexes forward instead of landing on random pages (13.3 s against 16.8 s in heap order
/// for a million, in psql; by name, as pages go, 1.6 times the heap order's time:
/// docs/benchmarks.md, "The admin pass, one statement per queue").
const WHOLE_QUEUE: &str = concat!(
    "SELECT ",
    partition_columns!(),
    ", ",
    cursor_columns!(),
    " FROM queen.log_partitions p ",
    segment_ends!(),
    cursor_arrays!("true"),
    " WHERE p.queue_id = $1 AND ($2::uuid IS NULL OR p.id > $2) ORDER BY p.id LIMIT $3"
);

/// At most this many partitions a statement of the admin pass reads (`WHOLE_QUEUE`,
/// `WHOLE_QUEUES`), each in a transaction of its own: a statement holds its snapshot, and with
/// it PostgreSQL's cleanup of every row updated since, for as long as it runs. One statement for
/// a queue of a million held it 11 s idle (20-35 s under load), every pass. A page of 2,000 runs
/// 25 ms idle and 52 ms on average under load (at most 0.64 s), and the pass takes as long as
/// with pages of 10,000 (docs/benchmarks.md).
pub const ADMIN_PASS_PAGE: i64 = 2_000;

/// From how many queues `queue_views` reads their groups in one statement.
const GROUPS_ONE_STATEMENT_FROM: usize = 50;

/// Queues of at most this many partitions are read together (`each_partition_of_queues`).
const TOGETHER_AT_MOST: i64 = 1_000;

/// `WHOLE_QUEUE` for several queues at once, with each row's queue id last.
const WHOLE_QUEUES: &str = concat!(
    "SELECT ",
    partition_columns!(),
    ", ",
    cursor_columns!(),
    ", p.queue_id FROM queen.log_partitions p ",
    segment_ends!(),
    cursor_arrays!("true"),
    " WHERE p.queue_id = ANY($1) ORDER BY p.id"
);

/// A partition's view from the columns `first..first + 7` of a row (name, id, created_at,
/// last offset, log start, oldest and newest segment times), as `PARTITIONS` and `WHOLE_QUEUE`
/// select them.
fn partition_view(
    r: &tokio_postgres::Row,
    first: usize,
    queue: String,
    cursors: Vec<CursorView>,
) -> PartitionView {
    let id: uuid::Uuid = r.get(first + 1);
    PartitionView {
        queue,
        partition: r.get(first),
        partition_id: id.to_string(),
        created_at: ts(r.get(first + 2)),
        last_offset: r.get(first + 3),
        log_start: r.get(first + 4),
        oldest_at: r.get::<_, Option<SystemTime>>(first + 5).map(ts),
        newest_at: r.get::<_, Option<SystemTime>>(first + 6).map(ts),
        cursors,
    }
}

/// A partition's cursors from the arrays of `cursor_columns` at columns `first..first + 7`,
/// sorted by group.
fn cursors_from_arrays(r: &tokio_postgres::Row, first: usize) -> Vec<CursorView> {
    let groups: Vec<String> = r.get::<_, Option<Vec<String>>>(first).unwrap_or_default();
    let committed: Vec<i64> = r.get::<_, Option<Vec<i64>>>(first + 1).unwrap_or_default();
    let leased_until: Vec<Option<SystemTime>> =
        r.get::<_, Option<_>>(first + 2).unwrap_or_default();
    let leased_through: Vec<Option<i64>> = r.get::<_, Option<_>>(first + 3).unwrap_or_default();
    let workers: Vec<Option<String>> = r.get::<_, Option<_>>(first + 4).unwrap_or_default();
    let consumed: Vec<i64> = r.get::<_, Option<Vec<i64>>>(first + 5).unwrap_or_default();
    let oldest: Vec<Option<SystemTime>> = r.get::<_, Option<_>>(first + 6).unwrap_or_default();
    let n = groups.len();
    assert!(
        [
            committed.len(),
            leased_until.len(),
            leased_through.len(),
            workers.len(),
            consumed.len(),
            oldest.len()
        ]
        .iter()
        .all(|&l| l == n),
        "one statement's cursor arrays differ in length"
    );
    let mut cursors: Vec<CursorView> = (0..n)
        .map(|i| CursorView {
            group: groups[i].clone(),
            committed: committed[i],
            leased_until: leased_until[i].map(ts),
            leased_through: leased_through[i],
            worker_id: workers[i].clone(),
            total_consumed: consumed[i],
            oldest_unconsumed_at: oldest[i].map(ts),
        })
        .collect();
    cursors.sort_by(|a, b| a.group.cmp(&b.group));
    cursors
}

/// The settings of a read of whole queues. JIT off: its compilation cost 240 ms a statement and
/// saved nothing at a million partitions. No statement_timeout: a background pass over a million
/// partitions takes seconds, and a database's timeout for its sessions would cancel every pass
/// of such a queue for good.
async fn whole_read_settings(
    txn: &deadpool_postgres::Transaction<'_>,
    context: &str,
) -> StorageResult<()> {
    txn.batch_execute("SET LOCAL jit = off; SET LOCAL statement_timeout = 0")
        .await
        .map_err(pg_err(context))
}

/// One page of `WHOLE_QUEUE`, in a transaction of its own: how many partitions it read, and the
/// id of the last.
async fn whole_queue_page(
    client: &mut deadpool_postgres::Object,
    queue_id: uuid::Uuid,
    queue: &str,
    after: Option<uuid::Uuid>,
    each: &mut (dyn FnMut(PartitionView) + Send),
) -> StorageResult<(u64, Option<uuid::Uuid>)> {
    use futures_util::TryStreamExt;
    let txn = client
        .transaction()
        .await
        .map_err(pg_err("a queue's partitions"))?;
    // Planned for this queue's id, never as a kept generic plan: a queue of two partitions
    // reads them by index in 1 ms, a queue of a million by a sequential scan; the generic plan
    // scanned every partition of every queue for each (70 ms for two).
    whole_read_settings(&txn, "a queue's partitions").await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&queue_id, &after, &ADMIN_PASS_PAGE];
    let rows = txn
        .query_raw(WHOLE_QUEUE, params)
        .await
        .map_err(pg_err("a queue's partitions"))?;
    let mut rows = std::pin::pin!(rows);
    let (mut read, mut last) = (0u64, None);
    while let Some(r) = rows
        .try_next()
        .await
        .map_err(pg_err("a queue's partitions"))?
    {
        last = Some(r.get::<_, uuid::Uuid>(1));
        read += 1;
        let cursors = cursors_from_arrays(&r, 7);
        each(partition_view(&r, 0, queue.to_string(), cursors));
    }
    txn.commit().await.map_err(pg_err("a queue's partitions"))?;
    Ok((read, last))
}

/// Which partitions a view read takes.
enum PartitionScope<'a> {
    /// One partition by id.
    One(uuid::Uuid),
    /// Partitions by id.
    Ids(&'a [uuid::Uuid]),
    /// A page of one queue's partitions by bytewise name.
    Page {
        queue: &'a str,
        after: Option<&'a str>,
        limit: i64,
    },
}

impl PgStorage {
    async fn partitions_where(
        &self,
        scope: PartitionScope<'_>,
        group: Option<&str>,
    ) -> StorageResult<Vec<PartitionView>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        // The filter is spelled out, not `$n IS NULL OR ...`: a one-partition read must plan
        // as an index lookup, not as a scan of every partition. `$1` is the group.
        let rows = match scope {
            PartitionScope::One(id) => {
                client
                    .query(&PARTITIONS.replace("{filter}", "p.id = $2"), &[&group, &id])
                    .await
            }
            PartitionScope::Ids(ids) => {
                client
                    .query(
                        &PARTITIONS.replace("{filter}", "p.id = ANY($2)"),
                        &[&group, &ids],
                    )
                    .await
            }
            PartitionScope::Page {
                queue,
                after,
                limit,
            } => {
                // Bytewise, by the (queue_id, name COLLATE "C") index: one index range a page
                // (1.9 ms for 2,000 of a million partitions). The queue's id is a sub-select, so
                // it is an index condition: joined by name, the planner sorted the queue's
                // partitions for each page (130 ms). The first page has its own statement: with
                // `$3 IS NULL OR name > $3` the bound would be no index condition either.
                let filter = match after {
                    Some(_) => {
                        "p.queue_id = (SELECT id FROM queen.queues WHERE name = $2)
                         AND p.name COLLATE \"C\" > $3"
                    }
                    None => {
                        "p.queue_id = (SELECT id FROM queen.queues WHERE name = $2)
                         AND $3::text IS NULL"
                    }
                };
                let sql = PARTITIONS.replace("{filter}", filter).replace(
                    "ORDER BY q.name, p.name",
                    "ORDER BY p.name COLLATE \"C\" LIMIT $4",
                );
                client.query(&sql, &[&group, &queue, &after, &limit]).await
            }
        }
        .map_err(pg_err("partition views"))?;
        Ok(rows
            .iter()
            .map(|r| partition_view(r, 1, r.get(0), cursors_from_arrays(r, 8)))
            .collect())
    }
}

#[async_trait]
impl InspectStorage for PgStorage {
    async fn queue_views(&self, f: QueueFilter) -> StorageResult<Vec<QueueView>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = format!(
            "SELECT q.id, q.created_at,
                    (SELECT count(*) FROM queen.dead_letters d WHERE d.queue_id = q.id),
                    ARRAY(SELECT m.consumer_group FROM queen.consumer_groups_metadata m
                           WHERE m.queue_name = q.name AND m.conflation ORDER BY 1),
                    {CONFIG_COLUMNS}
               FROM queen.queues q
              WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR q.namespace = $2)
                AND ($3::text IS NULL OR q.task = $3)
              ORDER BY q.created_at DESC, q.name"
        );
        let rows = client
            .query(&sql, &[&f.queue, &f.namespace, &f.task])
            .await
            .map_err(pg_err("queue views"))?;
        // Many queues (the admin totals' pass): every queue's groups in one statement, which
        // reads every cursor once, where a statement a queue cost a round trip and a plan each
        // (5,000 queues: 1.4 s of a 1.9 s pass). Few (a queue's own view): a statement each,
        // planned for its queue's id; as a sub-select of the listing its plan was one for every
        // queue, a hash join of every cursor with every partition, 290 ms a queue beside a queue
        // of a million partitions, where the statement of its own takes 0.15 ms.
        let mut all_groups: Option<HashMap<uuid::Uuid, Vec<String>>> = None;
        if rows.len() > GROUPS_ONE_STATEMENT_FROM {
            let mut by_queue: HashMap<uuid::Uuid, Vec<String>> = HashMap::new();
            for g in client
                .query(
                    "SELECT x.queue_id, x.g FROM (
                         SELECT p.queue_id, c.consumer_group AS g
                           FROM queen.log_consumers c
                           JOIN queen.log_partitions p ON p.id = c.partition_id
                         UNION
                         SELECT q.id, m.consumer_group FROM queen.consumer_groups_metadata m
                           JOIN queen.queues q ON q.name = m.queue_name) x
                      ORDER BY x.queue_id, x.g",
                    &[],
                )
                .await
                .map_err(pg_err("queues' groups"))?
            {
                by_queue.entry(g.get(0)).or_default().push(g.get(1));
            }
            all_groups = Some(by_queue);
        }
        let mut views = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: uuid::Uuid = r.get(0);
            let config = config_from_row(r, 4);
            let groups = match &mut all_groups {
                Some(by_queue) => by_queue.remove(&id).unwrap_or_default(),
                None => client
                    .query_typed(
                        "SELECT g FROM (SELECT c.consumer_group AS g
                                          FROM queen.log_consumers c
                                          JOIN queen.log_partitions p ON p.id = c.partition_id
                                         WHERE p.queue_id = $1
                                        UNION
                                        SELECT m.consumer_group FROM queen.consumer_groups_metadata m
                                         WHERE m.queue_name = $2) x ORDER BY g",
                        &[(&id, Type::UUID), (&config.name, Type::TEXT)],
                    )
                    .await
                    .map_err(pg_err("a queue's groups"))?
                    .iter()
                    .map(|g| g.get(0))
                    .collect(),
            };
            views.push(QueueView {
                id: id.to_string(),
                created_at: ts(r.get(1)),
                dead_letters: count(r.get(2)),
                groups,
                conflating_groups: r.get(3),
                config,
            });
        }
        Ok(views)
    }

    async fn partition_views_page(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: u32,
        group: Option<&str>,
    ) -> StorageResult<Vec<PartitionView>> {
        self.partitions_where(
            PartitionScope::Page {
                queue,
                after,
                limit: i64::from(limit),
            },
            group,
        )
        .await
    }

    async fn each_partition_of(
        &self,
        queue: &str,
        each: &mut (dyn FnMut(PartitionView) + Send),
    ) -> StorageResult<u64> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let found = client
            .query_opt(
                &prepared(&client, "SELECT id FROM queen.queues WHERE name = $1").await?,
                &[&queue],
            )
            .await
            .map_err(pg_err("a queue's id"))?;
        let Some(found) = found else { return Ok(0) };
        let queue_id: uuid::Uuid = found.get(0);
        let mut after: Option<uuid::Uuid> = None;
        let mut seen = 0u64;
        loop {
            let (read, last) = whole_queue_page(&mut client, queue_id, queue, after, each).await?;
            seen += read;
            match last {
                Some(last) if read == ADMIN_PASS_PAGE as u64 => after = Some(last),
                _ => return Ok(seen),
            }
        }
    }

    async fn each_partition_of_queues(
        &self,
        queues: &[String],
        each: &mut (dyn FnMut(usize, PartitionView) + Send),
    ) -> StorageResult<Vec<u64>> {
        use futures_util::TryStreamExt;
        let mut seen = vec![0u64; queues.len()];
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let asked: HashMap<&str, usize> = queues
            .iter()
            .enumerate()
            .map(|(i, q)| (q.as_str(), i))
            .collect();
        // Each queue's id and partitions, counted up to one past `TOGETHER_AT_MOST` (an
        // index-only count that stops there: counting a million took 0.2 s idle and 1.2 s under
        // load): a large queue is read alone afterwards, by pages, as `each_partition_of` reads
        // it; the small ones together, up to `ADMIN_PASS_PAGE` partitions to a statement.
        let mut small: Vec<(uuid::Uuid, usize, i64)> = vec![];
        let mut large: Vec<usize> = vec![];
        for r in client
            .query(
                &prepared(
                    &client,
                    "SELECT q.id, q.name,
                            (SELECT count(*) FROM (SELECT FROM queen.log_partitions p
                                                    WHERE p.queue_id = q.id LIMIT $2) c)
                       FROM queen.queues q WHERE q.name = ANY($1)",
                )
                .await?,
                &[&queues, &(TOGETHER_AT_MOST + 1)],
            )
            .await
            .map_err(pg_err("queues' ids"))?
        {
            let Some(&at) = asked.get(r.get::<_, &str>(1)) else {
                continue;
            };
            let partitions: i64 = r.get(2);
            if partitions > TOGETHER_AT_MOST {
                large.push(at);
            } else {
                small.push((r.get(0), at, partitions));
            }
        }
        let mut rest = small.as_slice();
        while !rest.is_empty() {
            // At least one queue a statement, and no more than a page of partitions.
            let mut take = 1;
            let mut partitions = rest[0].2;
            while take < rest.len() && partitions + rest[take].2 <= ADMIN_PASS_PAGE {
                partitions += rest[take].2;
                take += 1;
            }
            let (together, after) = rest.split_at(take);
            rest = after;
            let place: HashMap<uuid::Uuid, usize> =
                together.iter().map(|&(id, at, _)| (id, at)).collect();
            let ids: Vec<uuid::Uuid> = together.iter().map(|&(id, _, _)| id).collect();
            let txn = client
                .transaction()
                .await
                .map_err(pg_err("queues' partitions"))?;
            // As `each_partition_of`: planned for these ids.
            whole_read_settings(&txn, "queues' partitions").await?;
            let rows = txn
                .query_raw(WHOLE_QUEUES, [&ids])
                .await
                .map_err(pg_err("queues' partitions"))?;
            let mut rows = std::pin::pin!(rows);
            while let Some(r) = rows
                .try_next()
                .await
                .map_err(pg_err("queues' partitions"))?
            {
                let queue_id: uuid::Uuid = r.get(14);
                let Some(&at) = place.get(&queue_id) else {
                    return Err(StorageError::Internal(format!(
                        "a partition of queue {queue_id}, which was not asked for"
                    )));
                };
                let cursors = cursors_from_arrays(&r, 7);
                seen[at] += 1;
                each(at, partition_view(&r, 0, queues[at].clone(), cursors));
            }
            txn.commit().await.map_err(pg_err("queues' partitions"))?;
        }
        drop(client);
        large.sort_unstable();
        for at in large {
            seen[at] = self
                .each_partition_of(&queues[at], &mut |p| each(at, p))
                .await?;
        }
        Ok(seen)
    }

    async fn partition_views_by_id(&self, ids: &[String]) -> StorageResult<Vec<PartitionView>> {
        // An id that is no uuid names no partition.
        let ids: Vec<uuid::Uuid> = ids
            .iter()
            .filter_map(|id| uuid::Uuid::parse_str(id).ok())
            .collect();
        self.partitions_where(PartitionScope::Ids(&ids), None).await
    }

    async fn messages_created(
        &self,
        from: Timestamp,
        to: Timestamp,
        width_secs: i64,
        queue: Option<&str>,
    ) -> StorageResult<Vec<CreatedCount>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let width_us = width_secs.max(1).saturating_mul(1_000_000);
        // One index range of the segments' created_at, counted here: no segment leaves the
        // database.
        let rows = client
            .query(
                &prepared(
                    &client,
                    "SELECT q.name, b.us - mod(b.us, $3::bigint),
                            sum(s.end_offset - s.base_offset + 1)::bigint
                       FROM queen.log_segments s
                       JOIN queen.log_partitions p ON p.id = s.partition_id
                       JOIN queen.queues q ON q.id = p.queue_id
                      CROSS JOIN LATERAL
                            (SELECT (extract(epoch FROM s.created_at) * 1000000)::bigint AS us) b
                      WHERE s.created_at >= $1 AND s.created_at < $2
                        AND ($4::text IS NULL OR q.name = $4)
                      GROUP BY 1, 2 ORDER BY 1, 2",
                )
                .await?,
                &[
                    &to_system_time(from),
                    &to_system_time(to),
                    &width_us,
                    &queue,
                ],
            )
            .await
            .map_err(pg_err("messages created per interval"))?;
        Ok(rows
            .iter()
            .map(|r| CreatedCount {
                queue: r.get(0),
                bucket: Timestamp(r.get(1)),
                messages: count(r.get(2)),
            })
            .collect())
    }

    async fn segments(&self, q: SegmentQuery) -> StorageResult<Vec<StoredSegment>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let (after_at, after_pid, after_base) = match &q.after {
            Some(m) => (
                Some(to_system_time(m.created_at)),
                Some(parse_uuid(&m.partition_id)?),
                Some(m.base_offset),
            ),
            None => (None, None, None),
        };
        let rows = client
            .query(
                "SELECT q.name, p.name, p.id, s.base_offset, s.end_offset, s.created_at, s.blob
                   FROM queen.log_segments s
                   JOIN queen.log_partitions p ON p.id = s.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR p.name = $2)
                    AND ($3::timestamptz IS NULL OR s.created_at >= $3)
                    AND ($4::timestamptz IS NULL OR s.created_at < $4)
                    AND ($5::timestamptz IS NULL
                         OR (s.created_at, s.partition_id, s.base_offset) < ($5, $6::uuid, $7::bigint))
                  ORDER BY s.created_at DESC, s.partition_id DESC, s.base_offset DESC
                  LIMIT $8",
                &[
                    &q.queue,
                    &q.partition,
                    &q.from.map(to_system_time),
                    &q.to.map(to_system_time),
                    &after_at,
                    &after_pid,
                    &after_base,
                    &i64::from(q.limit),
                ],
            )
            .await
            .map_err(pg_err("segments"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let base: i64 = r.get(3);
                let end: i64 = r.get(4);
                let count = u32::try_from(end - base + 1).unwrap_or(0);
                StoredSegment {
                    queue: r.get(0),
                    partition: r.get(1),
                    partition_id: r.get::<_, uuid::Uuid>(2).to_string(),
                    row: SegmentRow {
                        base_offset: base,
                        start_idx: 0,
                        take: count,
                        msg_count: count,
                        created_at: ts(r.get(5)),
                        blob: Arc::new(r.get(6)),
                    },
                }
            })
            .collect())
    }

    async fn message(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<Option<StoredMessage>> {
        let pid = parse_uuid(partition_id)?;
        let found = {
            let client = self.pool.get().await.map_err(pool_err)?;
            let row = client
                .query_opt(
                    "SELECT t.msg_offset, s.base_offset, s.end_offset, s.created_at, s.blob
                       FROM queen.log_txids t
                       JOIN LATERAL (SELECT s.base_offset, s.end_offset, s.created_at, s.blob
                                       FROM queen.log_segments s
                                      WHERE s.partition_id = t.partition_id AND s.base_offset <= t.msg_offset
                                      ORDER BY s.base_offset DESC LIMIT 1) s ON s.end_offset >= t.msg_offset
                      WHERE t.partition_id = $1 AND t.transaction_id = $2",
                    &[&pid, &transaction_id],
                )
                .await
                .map_err(pg_err("message"))?;
            let Some(row) = row else { return Ok(None) };
            let offset: i64 = row.get(0);
            let base: i64 = row.get(1);
            let end: i64 = row.get(2);
            let letters = client
                .query(
                    "SELECT id, consumer_group, error, retry_count, failed_at FROM queen.dead_letters
                      WHERE partition_id = $1 AND msg_offset = $2 ORDER BY id",
                    &[&pid, &offset],
                )
                .await
                .map_err(pg_err("message dead letters"))?;
            let segment = SegmentRow {
                base_offset: base,
                start_idx: u32::try_from(offset - base).unwrap_or(0),
                take: 1,
                msg_count: u32::try_from(end - base + 1).unwrap_or(0),
                created_at: ts(row.get(3)),
                blob: Arc::new(row.get(4)),
            };
            let dead_letters = letters
                .iter()
                .map(|r| DeadLetterRef {
                    id: r.get(0),
                    group: r.get(1),
                    error: r.get(2),
                    retry_count: u32::try_from(r.get::<_, i32>(3)).unwrap_or(0),
                    failed_at: ts(r.get(4)),
                })
                .collect();
            (offset, segment, dead_letters)
        };
        let (offset, segment, dead_letters) = found;
        let Some(partition) = self
            .partitions_where(PartitionScope::One(pid), None)
            .await?
            .into_iter()
            .next()
        else {
            return Ok(None);
        };
        Ok(Some(StoredMessage {
            offset,
            segment,
            partition,
            dead_letters,
        }))
    }

    async fn delete_dead_letters_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<u64> {
        let pid = parse_uuid(partition_id)?;
        let client = self.pool.get().await.map_err(pool_err)?;
        client
            .execute(
                "DELETE FROM queen.dead_letters WHERE partition_id = $1 AND transaction_id = $2",
                &[&pid, &transaction_id],
            )
            .await
            .map_err(pg_err("delete dead letters"))
    }

    async fn add_trace(&self, t: TraceInput) -> StorageResult<Option<i64>> {
        traces::add_trace(self, t).await
    }

    async fn traces_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<Vec<TraceRecord>> {
        traces::traces_of(self, partition_id, transaction_id).await
    }

    async fn traces_named(
        &self,
        name: &str,
        limit: u32,
        offset: u32,
    ) -> StorageResult<(Vec<TraceRecord>, u64)> {
        traces::traces_named(self, name, limit, offset).await
    }

    async fn trace_names(&self, limit: u32, offset: u32) -> StorageResult<(Vec<TraceName>, u64)> {
        traces::trace_names(self, limit, offset).await
    }

    async fn record_sample(&self, s: WorkerSample) -> StorageResult<()> {
        samples::record_sample(self, s).await
    }

    async fn samples(&self, from: Timestamp, to: Timestamp) -> StorageResult<Vec<WorkerSample>> {
        samples::samples(self, from, to).await
    }

    async fn remove_samples_before(&self, before: Timestamp) -> StorageResult<u64> {
        samples::remove_samples_before(self, before).await
    }

    async fn store_totals(&self, totals: &StoredTotals) -> StorageResult<()> {
        samples::store_totals(self, totals).await
    }

    async fn stored_totals(
        &self,
        newer_than: Option<Timestamp>,
    ) -> StorageResult<Option<StoredTotals>> {
        samples::stored_totals(self, newer_than).await
    }
}
