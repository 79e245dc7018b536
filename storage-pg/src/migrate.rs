//! Versioned migrations, applied at start-up under a session advisory lock so that several
//! brokers starting at once apply each migration exactly once.

use tokio_postgres::Client;

use crate::error::pg_err;
use queen_core::storage::StorageResult;

/// (version, name, SQL). Functions are CREATE OR REPLACE, tables IF NOT EXISTS: re-running a
/// migration is harmless, but the version table makes it run once.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "schema", include_str!("../migrations/001_schema.sql")),
    (2, "log_pop", include_str!("../migrations/002_log_pop.sql")),
    (
        3,
        "push_ack",
        include_str!("../migrations/003_push_ack.sql"),
    ),
    (
        4,
        "delivery",
        include_str!("../migrations/004_delivery.sql"),
    ),
    (
        5,
        "ack_set_based",
        include_str!("../migrations/005_ack_set_based.sql"),
    ),
    (
        6,
        "push_notify",
        include_str!("../migrations/006_push_notify.sql"),
    ),
    (
        7,
        "queue_options",
        include_str!("../migrations/007_queue_options.sql"),
    ),
    (
        8,
        "pop_retention_gap",
        include_str!("../migrations/008_pop_retention_gap.sql"),
    ),
    (
        9,
        "delivery_events",
        include_str!("../migrations/009_delivery_events.sql"),
    ),
];

/// Any fixed key: "queen" in ASCII.
const MIGRATION_LOCK: i64 = 0x0071_7565_656e;

pub async fn migrate(client: &mut Client) -> StorageResult<Vec<i32>> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err("migration lock"))?;
    let result = apply(client).await;
    let unlock = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err("migration unlock"));
    let applied = result?;
    unlock?;
    Ok(applied)
}

async fn apply(client: &mut Client) -> StorageResult<Vec<i32>> {
    client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS queen;
             CREATE TABLE IF NOT EXISTS queen.schema_migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .map_err(pg_err("migration bookkeeping"))?;
    let done: Vec<i32> = client
        .query("SELECT version FROM queen.schema_migrations", &[])
        .await
        .map_err(pg_err("migration bookkeeping"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = vec![];
    for (version, name, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        let tx = client.transaction().await.map_err(pg_err("migration"))?;
        tx.batch_execute(sql)
            .await
            .map_err(pg_err(&format!("migration {version:03}_{name}")))?;
        tx.execute(
            "INSERT INTO queen.schema_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(pg_err("migration bookkeeping"))?;
        tx.commit().await.map_err(pg_err("migration commit"))?;
        tracing::info!(version, name, "applied migration");
        applied.push(*version);
    }
    Ok(applied)
}
