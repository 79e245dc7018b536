//! Start-up schema management, under a session advisory lock so that several brokers starting at
//! once apply each change exactly once.
//!
//! Two kinds of SQL, kept apart so that `git log` of one file is the history of one thing:
//! - `migrations/NNN_*.sql`: tables, indexes, triggers and data changes, append-only. Each applied
//!   migration's checksum is stored; a broker refuses to start when an applied migration's file
//!   was edited since (its effect on existing databases would silently differ from new ones).
//! - `sql/functions/<name>.sql`: the one current definition of each function, `CREATE OR
//!   REPLACE`, applied after the migrations whenever its content differs from what the database
//!   holds. A changed signature is a new name (`push_v3`) plus a migration dropping the old one.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::error::pg_err;
use queen_core::storage::{StorageError, StorageResult};

/// One versioned migration.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $name:literal, $file:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/", $file)),
        }
    };
}

/// In order. Append only: never edit one that was released (the checksum check refuses).
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "schema", "001_schema.sql"),
    migration!(2, "log_pop", "002_log_pop.sql"),
    migration!(3, "push_ack", "003_push_ack.sql"),
    migration!(4, "delivery", "004_delivery.sql"),
    migration!(5, "ack_set_based", "005_ack_set_based.sql"),
    migration!(6, "push_notify", "006_push_notify.sql"),
    migration!(7, "queue_options", "007_queue_options.sql"),
    migration!(8, "pop_retention_gap", "008_pop_retention_gap.sql"),
    migration!(9, "delivery_events", "009_delivery_events.sql"),
    migration!(10, "functions_apart", "010_functions_apart.sql"),
    migration!(11, "push_created_at", "011_push_created_at.sql"),
    migration!(12, "retention", "012_retention.sql"),
    migration!(13, "partition numbers", "013_partition_numbers.sql"),
    migration!(14, "encryption", "014_encryption.sql"),
    migration!(15, "inspection", "015_inspection.sql"),
    migration!(16, "txids without foreign key", "016_txids_without_fk.sql"),
    migration!(17, "ack_v2", "017_ack_v2.sql"),
    migration!(18, "pop list direct", "018_pop_list_direct.sql"),
    migration!(
        19,
        "transaction ids compared bytewise",
        "019_txids_bytewise.sql"
    ),
    migration!(20, "push_v6", "020_push_v6.sql"),
    migration!(21, "partition_walks", "021_partition_walks.sql"),
    migration!(
        22,
        "cursors' group index ends with the partition",
        "022_consumers_group_index.sql"
    ),
    migration!(23, "key/value store", "023_kv.sql"),
    migration!(24, "timers", "024_timers.sql"),
    migration!(25, "partitions by name", "025_partitions_by_name.sql"),
    migration!(26, "stream queries and state", "026_streams.sql"),
    migration!(
        27,
        "stream state follows its partition",
        "027_stream_state_follows_partitions.sql"
    ),
    migration!(28, "group conflation", "028_group_conflation.sql"),
    migration!(29, "ephemeral queues' configuration", "029_ephemeral.sql"),
    migration!(30, "admin totals", "030_admin_totals.sql"),
    migration!(
        31,
        "partitions keep their newest segment's time",
        "031_partition_newest_segment.sql"
    ),
    migration!(
        32,
        "ephemeral brokers' unbroken liveness",
        "032_ephemeral_alive_since.sql"
    ),
    migration!(
        33,
        "stream state versions and ripe-read stamps",
        "033_stream_state_versions.sql"
    ),
];

macro_rules! functions {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../sql/functions/", $name, ".sql")))),*]
    };
}

/// (name, definition) of every function of schema `queen`, one file each.
pub const FUNCTIONS: &[(&str, &str)] = functions![
    "now",
    "seed_cursor_v1",
    "log_pop_v2",
    "log_pop_loop_v2",
    "log_pop_specific_v2",
    "log_pop_wildcard_v2",
    "log_pending_partitions_v2",
    "log_next_pending_v1",
    "push_v6",
    "push_round_v1",
    "push_take_back_txids_v1",
    // Superseded by v3 (a nack below the cursor refused, noop, a dead-lettering nack ends the
    // lease); kept while brokers of the previous version may still call it (a rolling upgrade).
    "ack_v2",
    "ack_v3",
    // Superseded by v2; kept while brokers of the previous version may still call it (a rolling
    // upgrade), to be dropped by a later migration.
    "ack_batch_ends_v1",
    "ack_batch_ends_v2",
    "renew_lease_v1",
    "configure_queue_v1",
    "delete_queue_v1",
    "drop_segments_v1",
    "claim_maintenance_v1",
    "release_maintenance_v1",
    "retention_batch_v1",
    "remove_inactive_partitions_v1",
    "seek_group_v1",
    "delete_group_v1",
    "update_subscription_v1",
    "dead_letters_v1",
    "kv_insert_v1",
    "kv_put_v1",
    "kv_incr_v1",
    "lock_acquire_v1",
    "lock_renew_v1",
    "notify_cursor_event",
    "notify_subscription_event",
    "notify_queue_event",
];

/// The session advisory lock brokers migrate under (any fixed key: "queen" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x0071_7565_656e;

pub(crate) fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The table of applied migrations, in the schema they make.
const BOOKKEEPING: &str = "CREATE SCHEMA IF NOT EXISTS queen;
CREATE TABLE IF NOT EXISTS queen.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());
ALTER TABLE queen.schema_migrations ADD COLUMN IF NOT EXISTS checksum text";

/// What one start-up changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SchemaChanges {
    pub migrations_applied: Vec<i32>,
    pub functions_applied: Vec<&'static str>,
}

pub async fn migrate(client: &mut Client) -> StorageResult<SchemaChanges> {
    // Migrations wait as long as they must: for another broker's migrations (the advisory
    // lock), for the table locks a schema change takes, and for a schema change on tables that
    // grew large (whatever `statement_timeout` the database or role sets for its sessions). The
    // session's own values (config::session_setup's lock_timeout among them) come back after.
    // Notices are not logged: every start re-runs the `IF NOT EXISTS` of the bookkeeping table,
    // and "already exists, skipping" at each start says nothing.
    let before = client
        .query_one(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
                    current_setting('client_min_messages')",
            &[],
        )
        .await
        .map_err(pg_err("migration settings"))?;
    let (lock_timeout, statement_timeout, min_messages): (String, String, String) =
        (before.get(0), before.get(1), before.get(2));
    client
        .batch_execute(
            "SET statement_timeout = 0; SET lock_timeout = 0; SET client_min_messages = warning",
        )
        .await
        .map_err(pg_err("migration settings"))?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err("migration lock"))?;
    let result = apply(client).await;
    let unlock = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err("migration unlock"));
    client
        .execute(
            "SELECT set_config('lock_timeout', $1, false), set_config('statement_timeout', $2, false),
                    set_config('client_min_messages', $3, false)",
            &[&lock_timeout, &statement_timeout, &min_messages],
        )
        .await
        .map_err(pg_err("migration settings"))?;
    let changes = result?;
    unlock?;
    Ok(changes)
}

/// `sql` without its `CREATE SCHEMA IF NOT EXISTS name;` lines for schemas that exist already.
/// PostgreSQL checks the database's CREATE privilege before it sees the schema exists, so a role
/// that owns schemas its DBA made (and may not create others) could not run those statements.
/// The migration's checksum stays that of its file.
async fn without_existing_schemas(client: &Client, sql: &str) -> StorageResult<String> {
    let mut kept = Vec::new();
    for line in sql.lines() {
        let schema = line
            .trim()
            .strip_prefix("CREATE SCHEMA IF NOT EXISTS ")
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = schema {
            let exists: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                    &[&name],
                )
                .await
                .map_err(pg_err("migration schemas"))?
                .get(0);
            if exists {
                continue;
            }
        }
        kept.push(line);
    }
    Ok(kept.join("\n"))
}

async fn apply(client: &mut Client) -> StorageResult<SchemaChanges> {
    let bookkeeping = without_existing_schemas(client, BOOKKEEPING).await?;
    client
        .batch_execute(&bookkeeping)
        .await
        .map_err(pg_err("migration bookkeeping"))?;
    let done: Vec<(i32, Option<String>)> = client
        .query("SELECT version, checksum FROM queen.schema_migrations", &[])
        .await
        .map_err(pg_err("migration bookkeeping"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut changes = SchemaChanges::default();
    for m in MIGRATIONS {
        let sum = checksum(m.sql);
        match done.iter().find(|(v, _)| *v == m.version) {
            Some((_, Some(stored))) if *stored == sum => {}
            Some((_, Some(_))) => {
                return Err(StorageError::Internal(format!(
                    "migration {:03}_{} was edited after this database applied it (its checksum \
                     differs); restore the released file and put the change in a new migration",
                    m.version, m.name
                )))
            }
            // Applied before checksums were kept: the content is taken as applied.
            Some((_, None)) => {
                client
                    .execute(
                        "UPDATE queen.schema_migrations SET checksum = $2 WHERE version = $1",
                        &[&m.version, &sum],
                    )
                    .await
                    .map_err(pg_err("migration bookkeeping"))?;
            }
            None => {
                let sql = without_existing_schemas(client, m.sql).await?;
                let tx = client.transaction().await.map_err(pg_err("migration"))?;
                tx.batch_execute(&sql)
                    .await
                    .map_err(pg_err(&format!("migration {:03}_{}", m.version, m.name)))?;
                tx.execute(
                    "INSERT INTO queen.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    &[&m.version, &m.name, &sum],
                )
                .await
                .map_err(pg_err("migration bookkeeping"))?;
                tx.commit().await.map_err(pg_err("migration commit"))?;
                tracing::info!(version = m.version, name = m.name, "applied migration");
                changes.migrations_applied.push(m.version);
            }
        }
    }
    changes.functions_applied = apply_functions(client).await?;
    Ok(changes)
}

/// (Re)defines every function whose file differs from what the database last applied, in one
/// transaction. Bodies are not checked against each other while they are replaced (as pg_dump
/// does), so the order of the files does not matter.
async fn apply_functions(client: &mut Client) -> StorageResult<Vec<&'static str>> {
    let applied: Vec<(String, String)> = client
        .query("SELECT name, checksum FROM queen.schema_functions", &[])
        .await
        .map_err(pg_err("function bookkeeping"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let stale: Vec<(&'static str, &'static str, String)> = FUNCTIONS
        .iter()
        .map(|(name, sql)| (*name, *sql, checksum(sql)))
        .filter(|(name, _, sum)| !applied.iter().any(|(n, s)| n == name && s == sum))
        .collect();
    if stale.is_empty() {
        return Ok(vec![]);
    }
    let tx = client.transaction().await.map_err(pg_err("functions"))?;
    tx.batch_execute("SET LOCAL check_function_bodies = off")
        .await
        .map_err(pg_err("functions"))?;
    for (name, sql, sum) in &stale {
        tx.batch_execute(sql)
            .await
            .map_err(pg_err(&format!("function {name}")))?;
        tx.execute(
            "INSERT INTO queen.schema_functions (name, checksum) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
            &[name, sum],
        )
        .await
        .map_err(pg_err("function bookkeeping"))?;
    }
    tx.commit().await.map_err(pg_err("functions commit"))?;
    let names: Vec<&'static str> = stale.iter().map(|(n, _, _)| *n).collect();
    tracing::info!(functions = ?names, "applied function definitions");
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of sql/functions is listed (a new file cannot be forgotten), and each file
    /// defines exactly the function it is named after.
    #[test]
    fn every_function_file_is_listed_and_named_for_its_function() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/functions");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let mut listed: Vec<String> = FUNCTIONS.iter().map(|(n, _)| format!("{n}.sql")).collect();
        listed.sort();
        assert_eq!(files, listed);
        for (name, sql) in FUNCTIONS {
            let header = format!("CREATE OR REPLACE FUNCTION queen.{name}(");
            assert_eq!(
                sql.matches("CREATE OR REPLACE FUNCTION").count(),
                1,
                "{name}"
            );
            assert!(
                sql.contains(&header),
                "{name}.sql does not define queen.{name}"
            );
        }
    }

    /// From migration 010 on, migrations define no functions: those live in sql/functions.
    #[test]
    fn later_migrations_define_no_functions() {
        for m in MIGRATIONS.iter().filter(|m| m.version >= 10) {
            assert!(
                !m.sql.contains("CREATE OR REPLACE FUNCTION"),
                "migration {} defines a function",
                m.version
            );
        }
    }

    #[test]
    fn versions_are_consecutive() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
        }
    }
}
