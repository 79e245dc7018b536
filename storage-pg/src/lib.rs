//! `queen-storage-pg`: the production backend. PostgreSQL is the sole authority on claim, lease,
//! cursor and visibility. The procedures live in `sql/functions/`, the tables in `migrations/`;
//! both are applied at start-up (`migrate.rs`). One module per storage capability.

mod admin;
mod config;
mod delivery;
mod ephemeral;
mod error;
mod horizon;
mod inspect;
mod kv;
mod listen;
mod messages;
mod migrate;
mod pop;
mod pop_rows;
mod reads;
mod retention;
mod statistics;
mod streams;
#[cfg(feature = "testing")]
pub mod testing;
mod timers;
pub mod tls;
mod warm;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use queen_core::storage::{
    HealthStorage, StorageError, StorageHealth, StorageResult, StorageUsage,
};
use queen_core::{Offset, Timestamp};

pub use config::{PgConfig, PgSettings, DEFAULT_POOL_SIZE};
pub use error::pg_err;
pub use horizon::SnapshotHolder;
pub use inspect::ADMIN_PASS_PAGE;
pub use migrate::{SchemaChanges, FUNCTIONS, MIGRATIONS, MIGRATION_LOCK};
pub use statistics::{keep_statistics, statistics_pass, StatisticsPass};
pub use warm::{ConnectionWarmer, WarmPass};

use error::{pool_err, prepared};

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
    /// The connection settings and TLS connector, for the LISTEN connection.
    listen: (
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    ),
    /// Partition id → number, which never changes (framed pop answers name partitions by it).
    partition_numbers: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<uuid::Uuid, u64>>>,
}

/// How long `/health`'s probe of the database may take before it says unreachable.
pub const HEALTH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a request waits for a pool connection before it answers 503.
pub const POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Entries the partition-number cache holds before it starts over (about 40 bytes each).
const PARTITION_NUMBERS_CACHED: usize = 1 << 20;

impl PgStorage {
    /// Builds the pool and applies pending migrations. `Unavailable` when the database is not up
    /// (worth trying again), `Internal` when a setting is wrong.
    pub async fn connect(config: &PgConfig) -> StorageResult<PgStorage> {
        let tls = tls::connector(&config.tls).map_err(StorageError::Internal)?;
        let pg = config::bounded(config.pg.clone());
        let manager = Manager::from_config(
            pg.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // A request waits at most POOL_WAIT for a connection: past it the database is taken as
        // unavailable (503), instead of requests queueing behind connections that hang.
        let setup = config::session_setup(&pg);
        let pool = Pool::builder(manager)
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let setup = setup.clone();
                Box::pin(async move {
                    client
                        .batch_execute(&setup)
                        .await
                        .map_err(deadpool_postgres::HookError::Backend)
                })
            }))
            .max_size(config.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(config::CONNECT_TIMEOUT))
            .recycle_timeout(Some(config::CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StorageError::Internal(format!("building the connection pool: {e}")))?;
        let storage = PgStorage {
            pool,
            listen: (pg, tls),
            partition_numbers: Default::default(),
        };
        let mut client = storage
            .pool
            .get()
            .await
            .map_err(error::first_connection_err)?;
        migrate::migrate(&mut client).await?;
        // Payloads are stored as bytes, but names, KV values and stream state are text: in a
        // database of another encoding, those outside it are refused (400, SQLSTATE 22P05).
        let encoding: String = client
            .query_one("SELECT current_setting('server_encoding')", &[])
            .await
            .map_err(pg_err("the database's encoding"))?
            .get(0);
        if encoding != "UTF8" {
            tracing::warn!(
                encoding,
                "the database is not UTF8: names, KV values and stream state outside its encoding are refused (400)"
            );
        }
        Ok(storage)
    }

    /// The partition-number cache, emptied when full (refilling is one query per pop).
    pub(crate) fn partition_numbers_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<uuid::Uuid, u64>> {
        let mut cache = self
            .partition_numbers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= PARTITION_NUMBERS_CACHED {
            cache.clear();
        }
        cache
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How far the database's clock (`queen.now()`, the time leases, delays and timers are
    /// stamped with) is ahead of `host`, in microseconds: of three reads, the one with the
    /// shortest round trip, against the middle of that trip (so within half of it).
    pub async fn clock_offset(
        &self,
        host: &(dyn Fn() -> Timestamp + Send + Sync),
    ) -> StorageResult<i64> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let read = prepared(
            &client,
            "SELECT (extract(epoch FROM queen.now() + (clock_timestamp() - now())) * 1000000)::int8",
        )
        .await?;
        let mut best: Option<(i64, i64)> = None;
        for _ in 0..3 {
            let before = host();
            let row = client
                .query_one(&read, &[])
                .await
                .map_err(pg_err("the database's clock"))?;
            let after = host();
            let database: i64 = row.get(0);
            let trip = after.0 - before.0;
            let offset = database - (before.0 + trip / 2);
            if best.is_none_or(|(shortest, _)| trip < shortest) {
                best = Some((trip, offset));
            }
        }
        Ok(best.map_or(0, |(_, offset)| offset))
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
    pub async fn filed_dead_letters(&self, queue: &str) -> StorageResult<Vec<(Offset, String)>> {
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
}

#[async_trait]
impl HealthStorage for PgStorage {
    async fn health(&self) -> StorageHealth {
        // A database that does not answer within HEALTH_DEADLINE is unhealthy: a probe (a load
        // balancer's, Kubernetes') needs its answer promptly, not when the database thaws.
        let probe = async {
            match self.pool.get().await {
                Ok(client) => client.simple_query("SELECT 1").await.is_ok(),
                Err(_) => false,
            }
        };
        let reachable = tokio::time::timeout(HEALTH_DEADLINE, probe)
            .await
            .unwrap_or(false);
        StorageHealth {
            reachable,
            database: if reachable {
                "connected"
            } else {
                "unreachable"
            },
        }
    }

    fn usage(&self) -> StorageUsage {
        let s = self.pool.status();
        StorageUsage {
            backend: "postgres",
            pool_in_use: s.size.saturating_sub(s.available),
            pool_size: s.max_size,
        }
    }
}

/// A count or duration as the procedures' `integer`, saturating.
pub(crate) fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
