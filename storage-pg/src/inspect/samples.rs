//! The brokers' per-minute samples and the admin totals' stored pass.

use queen_core::storage::{StorageResult, StoredTotals, WorkerSample};
use queen_core::Timestamp;

use super::{count, ts};
use crate::error::{pg_err, pool_err};
use crate::{to_system_time, PgStorage};

const SAMPLE_COUNTERS: [&str; 10] = [
    "push_requests",
    "push_messages",
    "pop_requests",
    "pop_messages",
    "pop_empty",
    "ack_requests",
    "ack_messages",
    "ack_failed",
    "dead_lettered",
    "db_errors",
];

pub(super) async fn record_sample(pg: &PgStorage, s: WorkerSample) -> StorageResult<()> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    let sums = SAMPLE_COUNTERS
        .iter()
        .map(|c| format!("{c} = w.{c} + EXCLUDED.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    client
        .execute(
            &format!(
                "INSERT INTO queen.worker_samples AS w (hostname, worker_id, bucket, {counters},
                     lag_avg_ms, lag_max_ms, cpu_user_pct, cpu_system_pct, rss_bytes, pool_size, pool_in_use, parked)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
                 ON CONFLICT (bucket, hostname, worker_id) DO UPDATE SET {sums},
                     lag_avg_ms = EXCLUDED.lag_avg_ms, lag_max_ms = GREATEST(w.lag_max_ms, EXCLUDED.lag_max_ms),
                     cpu_user_pct = EXCLUDED.cpu_user_pct, cpu_system_pct = EXCLUDED.cpu_system_pct,
                     rss_bytes = EXCLUDED.rss_bytes, pool_size = EXCLUDED.pool_size,
                     pool_in_use = EXCLUDED.pool_in_use, parked = EXCLUDED.parked",
                counters = SAMPLE_COUNTERS.join(", ")
            ),
            &[
                &s.hostname,
                &s.worker_id,
                &to_system_time(s.bucket),
                &big(s.push_requests),
                &big(s.push_messages),
                &big(s.pop_requests),
                &big(s.pop_messages),
                &big(s.pop_empty),
                &big(s.ack_requests),
                &big(s.ack_messages),
                &big(s.ack_failed),
                &big(s.dead_lettered),
                &big(s.db_errors),
                &s.lag_avg_ms,
                &s.lag_max_ms,
                &s.cpu_user_pct,
                &s.cpu_system_pct,
                &big(s.rss_bytes),
                &big(s.pool_size),
                &big(s.pool_in_use),
                &big(s.parked),
            ],
        )
        .await
        .map_err(pg_err("record sample"))?;
    Ok(())
}

pub(super) async fn samples(
    pg: &PgStorage,
    from: Timestamp,
    to: Timestamp,
) -> StorageResult<Vec<WorkerSample>> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    let rows = client
        .query(
            &format!(
                "SELECT hostname, worker_id, bucket, {counters}, lag_avg_ms, lag_max_ms, cpu_user_pct,
                        cpu_system_pct, rss_bytes, pool_size, pool_in_use, parked
                   FROM queen.worker_samples WHERE bucket >= $1 AND bucket < $2
                  ORDER BY bucket, hostname, worker_id",
                counters = SAMPLE_COUNTERS.join(", ")
            ),
            &[&to_system_time(from), &to_system_time(to)],
        )
        .await
        .map_err(pg_err("samples"))?;
    let n = |r: &tokio_postgres::Row, i: usize| count(r.get(i));
    Ok(rows
        .iter()
        .map(|r| WorkerSample {
            hostname: r.get(0),
            worker_id: r.get(1),
            bucket: ts(r.get(2)),
            push_requests: n(r, 3),
            push_messages: n(r, 4),
            pop_requests: n(r, 5),
            pop_messages: n(r, 6),
            pop_empty: n(r, 7),
            ack_requests: n(r, 8),
            ack_messages: n(r, 9),
            ack_failed: n(r, 10),
            dead_lettered: n(r, 11),
            db_errors: n(r, 12),
            lag_avg_ms: r.get(13),
            lag_max_ms: r.get(14),
            cpu_user_pct: r.get(15),
            cpu_system_pct: r.get(16),
            rss_bytes: n(r, 17),
            pool_size: n(r, 18),
            pool_in_use: n(r, 19),
            parked: n(r, 20),
        })
        .collect())
}

pub(super) async fn remove_samples_before(pg: &PgStorage, before: Timestamp) -> StorageResult<u64> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    client
        .execute(
            "DELETE FROM queen.worker_samples WHERE bucket < $1",
            &[&to_system_time(before)],
        )
        .await
        .map_err(pg_err("remove samples"))
}

pub(super) async fn store_totals(pg: &PgStorage, totals: &StoredTotals) -> StorageResult<()> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    client
        .execute(
            "INSERT INTO queen.admin_totals (taken_at, body) VALUES ($1, $2)
             ON CONFLICT (singleton) DO UPDATE SET taken_at = excluded.taken_at,
                                                   body = excluded.body
              WHERE admin_totals.taken_at < excluded.taken_at",
            &[&to_system_time(totals.taken_at), &totals.body],
        )
        .await
        .map_err(pg_err("store the admin totals"))?;
    Ok(())
}

pub(super) async fn stored_totals(
    pg: &PgStorage,
    newer_than: Option<Timestamp>,
) -> StorageResult<Option<StoredTotals>> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    let row = client
        .query_opt(
            "SELECT taken_at, body FROM queen.admin_totals
              WHERE $1::timestamptz IS NULL OR taken_at > $1",
            &[&newer_than.map(to_system_time)],
        )
        .await
        .map_err(pg_err("the stored admin totals"))?;
    Ok(row.map(|r| StoredTotals {
        taken_at: ts(r.get(0)),
        body: r.get(1),
    }))
}
