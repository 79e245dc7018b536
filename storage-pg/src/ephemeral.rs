//! `queen.ephemeral_queues`: the declared options of ephemeral queues.
use async_trait::async_trait;
use queen_core::storage::{EphemeralConfigStorage, StorageError, StorageResult};
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
