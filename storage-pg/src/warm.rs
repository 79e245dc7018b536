//! Warming idle pool connections in the background. A PostgreSQL backend compiles each PL/pgSQL
//! function, loads the catalog entries of every table and index it touches and plans each
//! statement the first time the session runs it, and keeps all of it for the connection's life.
//! A group's first contact runs the wildcard scan and the bulk seed, which most connections have
//! never run: 17-28 ms at 1M partitions on a cold connection against 5.5-8.5 ms on a warm one
//! (docs/benchmarks.md, "A group's first contact at 1M partitions").
//!
//! Warming each connection as it is made (c8bc11e) put that cost on every reconnect, in front of
//! the requests waiting for the new connection, and slowed recovery after a PostgreSQL restart.
//! So the warmer only borrows connections nobody is waiting for: a pass runs while no request
//! waits and either two connections sit idle or the pool may still open one more (a request
//! arriving meanwhile finds a connection either way), takes one idle connection at a time (the pool hands
//! them out oldest-returned first, so successive takes visit different ones), runs a push and a
//! first contact on a scratch queue of its own in a transaction it rolls back, and gives it back.
//! Nothing of the scratch work is ever visible and its NOTIFYs are never sent; the rolled-back
//! partition insert only skips one value of the partition-number sequence, which numbers
//! partitions without promising them consecutive.
//!
//! It is started by the server binary (and the benchmark's in-process brokers), not by
//! `PgStorage::connect`: tests that count statements see only their own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Timeouts};
use queen_core::frames::{build_blob, Frame};

use crate::PgStorage;

/// Passes a connection may go unseen (busy the whole time, or gone) before its mark is dropped;
/// a busy one forgotten is warmed once more, which costs one scratch transaction.
const FORGET_AFTER_PASSES: u64 = 300;

/// Which pool connections have been warmed, by creation instant (deadpool's identity of a pooled
/// object), and the pass each was last seen idle in.
#[derive(Default)]
pub struct ConnectionWarmer {
    warmed: BTreeMap<Instant, u64>,
    pass: u64,
}

/// What one pass did (logged at debug level, and read by the test).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WarmPass {
    /// Idle connections that had not been warmed when the pass began.
    pub cold_idle: usize,
    /// Connections warmed in this pass.
    pub warmed: usize,
}

impl ConnectionWarmer {
    /// Warms idle connections every `interval`, for as long as the future runs.
    pub async fn run(mut self, storage: PgStorage, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            let pass = self.pass(&storage).await;
            if pass.warmed > 0 {
                tracing::debug!(?pass, "warmed idle PostgreSQL connections");
            }
        }
    }

    /// One pass: warms the idle connections not yet warmed while the pool has spare ones.
    pub async fn pass(&mut self, storage: &PgStorage) -> WarmPass {
        self.pass += 1;
        let pass = self.pass;
        let pool = storage.pool();
        let mut cold_idle = 0;
        pool.retain(|_, metrics| {
            match self.warmed.get_mut(&metrics.created) {
                Some(seen) => *seen = pass,
                None => cold_idle += 1,
            }
            true
        });
        let mut warmed = 0;
        if cold_idle > 0 {
            // Each take moves the taken connection to the back of the idle queue, so as many
            // takes as there are idle connections visit each of them once.
            for _ in 0..pool.status().available {
                let status = pool.status();
                let spare = status.available >= 2 || status.size < status.max_size;
                if !spare || status.waiting > 0 {
                    break;
                }
                let no_wait = Timeouts {
                    wait: Some(Duration::ZERO),
                    create: None,
                    recycle: None,
                };
                let Ok(mut client) = pool.timeout_get(&no_wait).await else {
                    break;
                };
                let created = Object::metrics(&client).created;
                if let Some(seen) = self.warmed.get_mut(&created) {
                    *seen = pass;
                    continue;
                }
                match warm(&mut client).await {
                    Ok(()) => {
                        self.warmed.insert(created, pass);
                        warmed += 1;
                    }
                    Err(e) => {
                        // A database in trouble: the next pass tries again.
                        tracing::debug!("connection warm-up failed: {e}");
                        break;
                    }
                }
            }
        }
        self.warmed
            .retain(|_, seen| pass.saturating_sub(*seen) <= FORGET_AFTER_PASSES);
        WarmPass { cold_idle, warmed }
    }
}

/// A push and a group's first contact on a scratch queue, rolled back.
async fn warm(client: &mut tokio_postgres::Client) -> Result<(), String> {
    let scratch = format!("__warm-{}", uuid::Uuid::now_v7());
    let frame = Frame {
        producer: None,
        encrypted: false,
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "warm".into(),
        trace_id: None,
        payload: b"{}".to_vec(),
    };
    let blob = build_blob(std::slice::from_ref(&frame)).map_err(|e| format!("blob: {e:?}"))?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| format!("begin: {e}"))?;
    let txids = vec![frame.transaction_id.clone()];
    let ids = vec![frame.message_id];
    let no_time: Option<std::time::SystemTime> = None;
    tx.query(
        "SELECT * FROM queen.push_v6($1, 'p', $2, $3, $4, $5, false, true)",
        &[&scratch, &txids, &ids, &blob, &no_time],
    )
    .await
    .map_err(|e| format!("push: {e}"))?;
    let (no_text, no_from): (Option<String>, Option<std::time::SystemTime>) = (None, None);
    tx.query(
        "SELECT * FROM queen.log_pop_wildcard_v2($1, 'warm', $2, 10, 1, false, 30, $3, $4, false, false)",
        &[&scratch, &uuid::Uuid::now_v7(), &no_text, &no_from],
    )
    .await
    .map_err(|e| format!("first contact: {e}"))?;
    tx.rollback().await.map_err(|e| format!("rollback: {e}"))
}
