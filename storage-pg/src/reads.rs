//! Reads by offset and partition discovery on PostgreSQL: one statement each, so one snapshot.
//! Offsets are assigned under the partition row's lock, held to commit, with the segment insert
//! in the same transaction: a snapshot that sees `last_offset` sees every segment below it.

use async_trait::async_trait;
use queen_core::reads::{self, ChangedPage, ChangedPartition, ChangedQuery, Retained};
use queen_core::storage::{PartitionRead, ReadStorage, SegmentRow, StorageResult};
use queen_core::Offset;

use crate::error::{pg_err, pool_err, prepared};
use crate::{from_system_time, to_system_time, PgStorage};

/// Segments one entry reads at most (their blobs are bounded by the byte hint as well).
const SEGMENTS_PER_READ: i64 = 1000;

#[async_trait]
impl ReadStorage for PgStorage {
    async fn read_partition(
        &self,
        queue: &str,
        partition: &str,
        offset: Offset,
        byte_hint: u64,
    ) -> StorageResult<PartitionRead> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let hint = i64::try_from(byte_hint).unwrap_or(i64::MAX);
        // The segment holding `offset` is the last one starting at or before it (found by the
        // primary key); the running sum of blob sizes (their stored lengths: nothing is
        // decompressed or detoasted to count them) stops the read near the hint.
        let rows = client
            .query(
                &prepared(
                    &client,
                    "WITH p AS (
                         SELECT p.id, p.last_offset,
                                (SELECT min(x.base_offset) FROM queen.log_segments x
                                  WHERE x.partition_id = p.id) AS oldest
                           FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
                          WHERE q.name = $1 AND p.name = $2),
                     s AS (
                         SELECT s.base_offset, s.end_offset, s.msg_count, s.created_at, s.blob,
                                sum(octet_length(s.blob)) OVER (ORDER BY s.base_offset) AS upto,
                                row_number() OVER (ORDER BY s.base_offset) AS n
                           FROM (SELECT s.* FROM p JOIN queen.log_segments s ON s.partition_id = p.id
                                  WHERE $4::bigint > 0
                                    AND $3 >= COALESCE(p.oldest, p.last_offset + 1)
                                    AND $3 <= p.last_offset
                                    AND s.base_offset >= COALESCE(
                                        (SELECT x.base_offset FROM queen.log_segments x
                                          WHERE x.partition_id = p.id AND x.base_offset <= $3
                                          ORDER BY x.base_offset DESC LIMIT 1), $3)
                                  ORDER BY s.base_offset LIMIT $5) s)
                     SELECT p.last_offset, p.oldest, s.base_offset, s.msg_count, s.created_at, s.blob
                       FROM p LEFT JOIN s ON s.n = 1 OR s.upto <= $4::bigint
                      ORDER BY s.base_offset",
                )
                .await?,
                &[&queue, &partition, &offset, &hint, &SEGMENTS_PER_READ],
            )
            .await
            .map_err(pg_err("fetch: read partition"))?;
        let Some(first) = rows.first() else {
            return Ok(PartitionRead::Unknown);
        };
        let range = Retained::of(first.get(0), first.get(1));
        let mut segments = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(base) = r.get::<_, Option<Offset>>(2) else {
                continue;
            };
            let msg_count = u32::try_from(r.get::<_, i32>(3)).unwrap_or(0);
            let start_idx = u32::try_from((offset - base).max(0)).unwrap_or(u32::MAX);
            if start_idx >= msg_count {
                continue;
            }
            segments.push(SegmentRow {
                base_offset: base,
                start_idx,
                take: msg_count - start_idx,
                msg_count,
                created_at: from_system_time(r.get(4)),
                blob: std::sync::Arc::new(r.get::<_, Vec<u8>>(5)),
            });
        }
        Ok(PartitionRead::Found { range, segments })
    }

    async fn changed_partitions(&self, q: &ChangedQuery) -> StorageResult<ChangedPage> {
        let client = self.pool.get().await.map_err(pool_err)?;
        // First the time and the oldest open transaction of this database (its own statement:
        // the partitions are read in a later snapshot, so a transaction that commits in between
        // is read, and one that commits later began after the sample or is counted in it).
        // Every stored write time is at or after its transaction's start (queen.now() or later).
        let sample = client
            .query_one(
                &prepared(
                    &client,
                    "SELECT clock_timestamp() + (queen.now() - now()),
                            (SELECT min(a.xact_start) FROM pg_stat_activity a
                              WHERE a.datname = current_database() AND a.xact_start IS NOT NULL
                                AND a.pid <> pg_backend_pid()) + (queen.now() - now())",
                )
                .await?,
                &[],
            )
            .await
            .map_err(pg_err("partitions changed: sample open transactions"))?;
        let safe_time = reads::safe_time(
            from_system_time(sample.get(0)),
            sample
                .get::<_, Option<std::time::SystemTime>>(1)
                .map(from_system_time),
        );
        let floor = q.since.map(|s| to_system_time(reads::since_floor(s)));
        let rows = client
            .query(
                &prepared(
                    &client,
                    "SELECT p.name, p.id::text, p.last_offset,
                            (SELECT min(s.base_offset) FROM queen.log_segments s
                              WHERE s.partition_id = p.id),
                            p.last_write_at
                       FROM queen.queues q JOIN queen.log_partitions p ON p.queue_id = q.id
                      WHERE q.name = $1
                        AND ($2::timestamptz IS NULL OR p.last_write_at >= $2)
                        AND ($3::text IS NULL OR p.name COLLATE \"C\" > $3)
                      ORDER BY p.name COLLATE \"C\" LIMIT $4",
                )
                .await?,
                &[&q.queue, &floor, &q.after, &(i64::from(q.limit) + 1)],
            )
            .await
            .map_err(pg_err("partitions changed: list"))?;
        if rows.is_empty() {
            let exists = client
                .query(
                    &prepared(&client, "SELECT 1 FROM queen.queues WHERE name = $1").await?,
                    &[&q.queue],
                )
                .await
                .map_err(pg_err("partitions changed: queue"))?;
            if exists.is_empty() {
                return Ok(ChangedPage {
                    partitions: None,
                    more: false,
                    safe_time,
                });
            }
        }
        let mut list: Vec<ChangedPartition> = rows
            .iter()
            .map(|r| ChangedPartition {
                name: r.get(0),
                id: r.get(1),
                range: Retained::of(r.get(2), r.get(3)),
                last_write_at: from_system_time(r.get(4)),
            })
            .collect();
        let more = list.len() > q.limit as usize;
        list.truncate(q.limit as usize);
        Ok(ChangedPage {
            partitions: Some(list),
            more,
            safe_time,
        })
    }
}
