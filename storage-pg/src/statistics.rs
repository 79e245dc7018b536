//! Keeping the planner's statistics of the queen tables up with their growth. A session plans
//! each statement of a procedure once and keeps the plan until the table's statistics change
//! (an ANALYZE). A plan made while a table was a page or two stays a sequential scan, or an index
//! scan on the wrong key, while the table grows: a push's write of its partition's head took
//! 21.8 ms at 200k partitions against 0.1 ms after an ANALYZE, a whole-batch ack 43 ms against
//! 0.1 (psql; docs/benchmarks.md, "Scale, ninth look"). Autovacuum re-analyzes a table once 10% of it
//! changed, but only at its next round (autovacuum_naptime, a minute by default), and a burst of
//! new partitions or groups outruns it.
//!
//! So a pass, every few seconds, compares each queen table's size on disk with the size its
//! statistics describe, and analyzes the tables that more than doubled since (the ANALYZE ends
//! every session's stale plans). Brokers on one database share the work through a try-lock: one
//! analyzes, the others skip that pass. Doubling keeps it logarithmic: a table grown from empty
//! to a million partitions is analyzed about twenty times.
//!
//! It is started by the server binary (and the benchmark's in-process brokers), not by
//! `PgStorage::connect`: tests that count statements see only their own.

use std::time::Duration;

use crate::PgStorage;

/// A table is re-analyzed once its pages exceed this multiple of the pages its statistics
/// describe (plus `MIN_GROWTH_PAGES`, so a table of a few pages is left to autovacuum).
const GROWTH_FACTOR: i64 = 2;
const MIN_GROWTH_PAGES: i64 = 8;

/// The advisory-lock key brokers share for a pass (an arbitrary constant: "queen-st").
const PASS_LOCK_KEY: i64 = 0x7175_6565_6e2d_7374;

/// The tables a pass analyzed (empty when none had outgrown its statistics, or another broker
/// held the pass).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StatisticsPass {
    pub analyzed: Vec<String>,
}

/// Runs a pass every `interval`, for as long as the future runs.
pub async fn keep_statistics(storage: PgStorage, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        match statistics_pass(&storage).await {
            Ok(pass) if !pass.analyzed.is_empty() => {
                tracing::info!(tables = ?pass.analyzed, "analyzed queen tables that outgrew their statistics");
            }
            Ok(_) => {}
            // A database in trouble: the next pass tries again.
            Err(e) => tracing::debug!("statistics pass failed: {e}"),
        }
    }
}

/// One pass: analyzes every queen table whose pages on disk more than doubled since its last
/// ANALYZE (or VACUUM), unless another broker's pass holds the lock.
pub async fn statistics_pass(storage: &PgStorage) -> Result<StatisticsPass, String> {
    let mut client = storage
        .pool()
        .get()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| format!("begin: {e}"))?;
    let locked: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&PASS_LOCK_KEY])
        .await
        .map_err(|e| format!("lock: {e}"))?
        .get(0);
    if !locked {
        return Ok(StatisticsPass::default());
    }
    // relpages: the pages the statistics describe; pg_relation_size: the pages now (the smgr's
    // count, exact and cheap).
    let outgrown: Vec<String> = tx
        .query(
            "SELECT c.relname::text
               FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'queen' AND c.relkind = 'r'
                AND pg_relation_size(c.oid) / current_setting('block_size')::bigint
                    > $1::bigint * GREATEST(c.relpages, 0)::bigint + $2::bigint
              ORDER BY c.relname",
            &[&GROWTH_FACTOR, &MIN_GROWTH_PAGES],
        )
        .await
        .map_err(|e| format!("sizes: {e}"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // An ANALYZE of a large table may outlast a database's statement_timeout for its sessions.
    if !outgrown.is_empty() {
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(|e| format!("statement timeout: {e}"))?;
    }
    for table in &outgrown {
        // The name comes from pg_class and is quoted as an identifier.
        let quoted = format!("queen.\"{}\"", table.replace('"', "\"\""));
        tx.batch_execute(&format!("ANALYZE {quoted}"))
            .await
            .map_err(|e| format!("analyze {table}: {e}"))?;
    }
    tx.commit().await.map_err(|e| format!("commit: {e}"))?;
    Ok(StatisticsPass { analyzed: outgrown })
}
