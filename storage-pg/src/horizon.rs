//! What holds back PostgreSQL's cleanup of the broker's tables. Every push updates its
//! partition's row, every ack its cursor's, and retention deletes segments and transactionId
//! rows; PostgreSQL removes the old versions only once no open transaction or snapshot of the
//! database can still see them. One left open elsewhere (a forgotten `psql` in a transaction, a
//! long report, an abandoned prepared transaction) keeps them all: the tables grow and every
//! statement walks past more dead versions: push-to-delivery latency climbs for as long as it
//! stays open (measured in the retention soak: docs/benchmarks.md).

use crate::error::{pg_err, pool_err, prepared};
use crate::PgStorage;
use queen_core::storage::StorageResult;

/// The oldest transaction or snapshot open in the broker's database.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotHolder {
    /// Seconds since it began.
    pub age_secs: f64,
    /// Which: `session pid 4242` or `prepared transaction 'x'`.
    pub holder: String,
    /// More of it: a session's application, client and state; a prepared transaction's owner.
    pub detail: String,
}

/// The oldest holder among the database's client sessions with a snapshot (other than the
/// asking one; other roles' sessions show only to a role with `pg_read_all_stats`) and its
/// prepared transactions.
const OLDEST_SNAPSHOT: &str = "
    SELECT extract(epoch FROM now() - h.since)::float8, h.holder, h.detail FROM (
        SELECT coalesce(a.xact_start, a.query_start, a.backend_start) AS since,
               format('session pid %s', a.pid) AS holder,
               format('application %s, client %s, %s',
                      coalesce(nullif(a.application_name, ''), 'unnamed'),
                      coalesce(host(a.client_addr), 'local socket'), a.state) AS detail
          FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.backend_xmin IS NOT NULL
           AND a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
        UNION ALL
        SELECT p.prepared, format('prepared transaction %L', p.gid), format('owner %s', p.owner)
          FROM pg_prepared_xacts p
         WHERE p.database = current_database()) h
     ORDER BY h.since LIMIT 1";

impl PgStorage {
    /// The oldest transaction or snapshot open in the database, if any.
    pub async fn oldest_snapshot(&self) -> StorageResult<Option<SnapshotHolder>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_opt(&prepared(&client, OLDEST_SNAPSHOT).await?, &[])
            .await
            .map_err(pg_err("the oldest snapshot"))?;
        Ok(row.map(|r| SnapshotHolder {
            age_secs: r.get::<_, f64>(0).max(0.0),
            holder: r.get(1),
            detail: r.get(2),
        }))
    }
}
