//! `queen.ephemeral_queues`: the declared options of ephemeral queues.
use async_trait::async_trait;
use queen_core::storage::{
    EphemeralBroker, EphemeralClaim, EphemeralConfigStorage, EphemeralOwnerStorage, StorageError,
    StorageResult,
};
use serde_json::Value;

use crate::error::{pg_err, pool_err, prepared};
use crate::PgStorage;

#[async_trait]
impl EphemeralConfigStorage for PgStorage {
    async fn ephemeral_config(&self, queue: &str) -> StorageResult<Option<Value>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "SELECT options::text FROM queen.ephemeral_queues WHERE name = $1";
        let rows = client
            .query(&prepared(&client, sql).await?, &[&queue])
            .await
            .map_err(pg_err("ephemeral: read a declaration"))?;
        rows.first().map(|r| options_of(r.get(0))).transpose()
    }

    async fn ephemeral_configs(&self) -> StorageResult<Vec<(String, Value)>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "SELECT name, options::text FROM queen.ephemeral_queues ORDER BY name";
        let rows = client
            .query(&prepared(&client, sql).await?, &[])
            .await
            .map_err(pg_err("ephemeral: list declarations"))?;
        rows.iter()
            .map(|r| Ok((r.get(0), options_of(r.get(1))?)))
            .collect()
    }

    async fn save_ephemeral_config(&self, queue: &str, options: &Value) -> StorageResult<()> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "INSERT INTO queen.ephemeral_queues (name, options) VALUES ($1, $2::text::jsonb)
                   ON CONFLICT (name) DO UPDATE SET options = EXCLUDED.options, updated_at = now()";
        client
            .execute(
                &prepared(&client, sql).await?,
                &[&queue, &options.to_string()],
            )
            .await
            .map_err(pg_err("ephemeral: declare"))?;
        Ok(())
    }

    async fn remove_ephemeral_config(&self, queue: &str) -> StorageResult<bool> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "DELETE FROM queen.ephemeral_queues WHERE name = $1";
        let n = client
            .execute(&prepared(&client, sql).await?, &[&queue])
            .await
            .map_err(pg_err("ephemeral: forget a declaration"))?;
        Ok(n > 0)
    }
}

fn options_of(text: String) -> StorageResult<Value> {
    serde_json::from_str(&text)
        .map_err(|e| StorageError::Internal(format!("ephemeral: a stored declaration: {e}")))
}

/// Incarnations are u64 in the broker and bigint here: stored bit for bit.
fn stored(incarnation: u64) -> i64 {
    i64::from_ne_bytes(incarnation.to_ne_bytes())
}

fn loaded(incarnation: i64) -> u64 {
    u64::from_ne_bytes(incarnation.to_ne_bytes())
}

#[async_trait]
impl EphemeralOwnerStorage for PgStorage {
    async fn ephemeral_heartbeat(
        &self,
        incarnation: u64,
        address: &str,
        alive_ms: u64,
    ) -> StorageResult<()> {
        let client = self.pool.get().await.map_err(pool_err)?;
        // A row that ran out starts its unbroken span (alive_since) again.
        let sql = "INSERT INTO queen.ephemeral_brokers AS b (incarnation, address, alive_until, alive_since)
                   VALUES ($1, $2, queen.now() + $3::bigint * interval '1 millisecond', queen.now())
                   ON CONFLICT (incarnation) DO UPDATE
                   SET address = EXCLUDED.address, alive_until = EXCLUDED.alive_until,
                       alive_since = CASE WHEN b.alive_until > queen.now() THEN b.alive_since
                                          ELSE EXCLUDED.alive_since END";
        let alive = i64::try_from(alive_ms).unwrap_or(i64::MAX);
        client
            .execute(
                &prepared(&client, sql).await?,
                &[&stored(incarnation), &address, &alive],
            )
            .await
            .map_err(pg_err("ephemeral: heartbeat"))?;
        Ok(())
    }

    async fn ephemeral_claim(
        &self,
        queue: &str,
        incarnation: u64,
        takeover_after_ms: u64,
    ) -> StorageResult<EphemeralClaim> {
        let client = self.pool.get().await.map_err(pool_err)?;
        // Taken when free, when its owner left, or when its owner's liveness ran out and the
        // claimer is the owner or has been alive without a break for $3 ms; then whoever owns
        // it, with the address its peers reach it at.
        let claim = "INSERT INTO queen.ephemeral_owners AS o (queue, incarnation) VALUES ($1, $2)
                     ON CONFLICT (queue) DO UPDATE
                     SET incarnation = EXCLUDED.incarnation, epoch = o.epoch + 1
                     WHERE NOT EXISTS (SELECT 1 FROM queen.ephemeral_brokers b
                                        WHERE b.incarnation = o.incarnation
                                          AND b.alive_until > queen.now())
                       AND (o.incarnation = EXCLUDED.incarnation OR $3::bigint = 0
                            OR NOT EXISTS (SELECT 1 FROM queen.ephemeral_brokers b
                                            WHERE b.incarnation = o.incarnation)
                            OR EXISTS (SELECT 1 FROM queen.ephemeral_brokers me
                                        WHERE me.incarnation = EXCLUDED.incarnation
                                          AND me.alive_since
                                              <= queen.now() - $3::bigint * interval '1 millisecond'))";
        let settle = i64::try_from(takeover_after_ms).unwrap_or(i64::MAX);
        client
            .execute(
                &prepared(&client, claim).await?,
                &[&queue, &stored(incarnation), &settle],
            )
            .await
            .map_err(pg_err("ephemeral: claim a queue"))?;
        let owner = "SELECT o.incarnation, b.address, o.epoch FROM queen.ephemeral_owners o
                     JOIN queen.ephemeral_brokers b USING (incarnation) WHERE o.queue = $1";
        let rows = client
            .query(&prepared(&client, owner).await?, &[&queue])
            .await
            .map_err(pg_err("ephemeral: read a queue's owner"))?;
        let row = rows.first().ok_or_else(|| {
            StorageError::Unavailable(format!(
                "ephemeral: {queue}'s owner has no broker row (it left): try again"
            ))
        })?;
        Ok(EphemeralClaim {
            owner: EphemeralBroker {
                incarnation: loaded(row.get(0)),
                address: row.get(1),
            },
            epoch: row.get(2),
        })
    }

    async fn ephemeral_brokers(&self) -> StorageResult<Vec<EphemeralBroker>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "SELECT incarnation, address FROM queen.ephemeral_brokers
                   WHERE alive_until > queen.now() ORDER BY incarnation";
        let rows = client
            .query(&prepared(&client, sql).await?, &[])
            .await
            .map_err(pg_err("ephemeral: list brokers"))?;
        Ok(rows
            .iter()
            .map(|r| EphemeralBroker {
                incarnation: loaded(r.get(0)),
                address: r.get(1),
            })
            .collect())
    }

    async fn ephemeral_leave(&self, incarnation: u64) -> StorageResult<()> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let sql = "DELETE FROM queen.ephemeral_brokers WHERE incarnation = $1";
        client
            .execute(&prepared(&client, sql).await?, &[&stored(incarnation)])
            .await
            .map_err(pg_err("ephemeral: leave"))?;
        Ok(())
    }
}
