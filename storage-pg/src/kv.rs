//! The key/value store and its locks on PostgreSQL. An op of a batch reads its key's row (`FOR
//! UPDATE` when it may write or must still hold at commit), asks core's rules (`queen_core::kv`)
//! and runs the write they name, so the model and PostgreSQL share one statement of every
//! verdict. An insert that meets a concurrent insert of the same key waits for it (the primary
//! key) and then reads the row again.
//!
//! The calls users make one at a time (a lone get, put or incr; every lock op) are one statement
//! each: a SQL function decides as core's rule does and answers the rows it decided on, and the
//! broker requires core's verdict over those rows to be the function's.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use queen_core::kv::{self, Decision, KvBatch, KvLimits, KvOp, KvRow, LOCKS_NAMESPACE};
use queen_core::locks::{self, AcquireDecision, LockOp};
use queen_core::storage::{KvStorage, StorageError, StorageResult};
use queen_core::Timestamp;
use serde_json::Value;
use tokio_postgres::Row;

use crate::error::{pg_err, pool_err, prepared, retry_contention};
use crate::{from_system_time, to_system_time, PgStorage};

const ROW: &str = "value::text, version, expires_at, updated_at";
const ROW_OF_K: &str = "k.value::text, k.version, k.expires_at, k.updated_at";

fn kv_row(r: &Row, at: usize) -> StorageResult<KvRow> {
    let text: String = r.get(at);
    Ok(KvRow {
        value: serde_json::from_str(&text)
            .map_err(|e| StorageError::Internal(format!("kv: stored value is not JSON: {e}")))?,
        version: r.get(at + 1),
        expires_at: r
            .get::<_, Option<std::time::SystemTime>>(at + 2)
            .map(from_system_time),
        updated_at: from_system_time(r.get(at + 3)),
    })
}

/// The database's time for this transaction (`queen.now()`, which tests move).
pub(crate) async fn db_now(client: &impl GenericClient) -> StorageResult<Timestamp> {
    let row = client
        .query_one(&prepared(client, "SELECT queen.now()").await?, &[])
        .await
        .map_err(pg_err("kv: now"))?;
    Ok(from_system_time(row.get(0)))
}

async fn read_row(
    client: &impl GenericClient,
    ns: &str,
    key: &str,
    for_update: bool,
) -> StorageResult<Option<KvRow>> {
    let sql = if for_update {
        "SELECT value::text, version, expires_at, updated_at FROM queen.kv WHERE ns = $1 AND key = $2 FOR UPDATE"
    } else {
        "SELECT value::text, version, expires_at, updated_at FROM queen.kv WHERE ns = $1 AND key = $2"
    };
    let rows = client
        .query(&prepared(client, sql).await?, &[&ns, &key])
        .await
        .map_err(pg_err("kv: read"))?;
    rows.first().map(|r| kv_row(r, 0)).transpose()
}

/// Writes a key at the next version: an update when its row exists (locked by this
/// transaction), else an insert (`kv_insert_v1`, which draws the version after the insert went
/// through). `None` when the insert met a row another transaction committed meanwhile (read it
/// again).
async fn store(
    client: &impl GenericClient,
    ns: &str,
    key: &str,
    existed: bool,
    value: &Value,
    expires_at: Option<Timestamp>,
    now: Timestamp,
) -> StorageResult<Option<KvRow>> {
    let text = value.to_string();
    let expires = expires_at.map(to_system_time);
    let at = to_system_time(now);
    let sql = if existed {
        "UPDATE queen.kv SET value = $3::text::jsonb, version = nextval('queen.kv_versions'),
                expires_at = $4, updated_at = $5
          WHERE ns = $1 AND key = $2
          RETURNING value::text, version, expires_at, updated_at"
    } else {
        "SELECT value, version, expires_at, updated_at
           FROM queen.kv_insert_v1($1, $2, $3::text::jsonb, $4, $5)"
    };
    let rows = client
        .query(
            &prepared(client, sql).await?,
            &[&ns, &key, &text, &expires, &at],
        )
        .await
        .map_err(pg_err("kv: write"))?;
    rows.first().map(|r| kv_row(r, 0)).transpose()
}

async fn delete_row(client: &impl GenericClient, ns: &str, key: &str) -> StorageResult<()> {
    client
        .execute(
            &prepared(client, "DELETE FROM queen.kv WHERE ns = $1 AND key = $2").await?,
            &[&ns, &key],
        )
        .await
        .map_err(pg_err("kv: delete"))?;
    Ok(())
}

/// One op of a batch or a transaction's rider: its answer, and whether it was refused.
pub(crate) async fn kv_op(
    client: &impl GenericClient,
    op: &KvOp,
    now: Timestamp,
    limits: &KvLimits,
) -> StorageResult<(Value, bool)> {
    match op {
        KvOp::GetMany { ns, keys } => {
            let rows = client
                .query(
                    &prepared(
                        client,
                        "SELECT k.key, value::text, version, expires_at, updated_at
                       FROM queen.kv k WHERE k.ns = $1 AND k.key = ANY($2)",
                    )
                    .await?,
                    &[ns, keys],
                )
                .await
                .map_err(pg_err("kv: getMany"))?;
            let mut by_key = std::collections::BTreeMap::new();
            for r in &rows {
                by_key.insert(r.get::<_, String>(0), kv_row(r, 1)?);
            }
            let ordered: Vec<Option<KvRow>> = keys.iter().map(|k| by_key.remove(k)).collect();
            Ok((kv::get_many_answer(keys, &ordered, now, limits), false))
        }
        KvOp::GetPrefix {
            ns,
            prefix,
            after,
            limit,
            keys_only,
        } => {
            let start = match after {
                Some(a) if a.as_str() > prefix.as_str() => a.clone(),
                _ => prefix.clone(),
            };
            let upper = kv::prefix_upper_bound(prefix);
            let rows = client
                .query(
                    &prepared(
                        client,
                        &format!(
                            "SELECT key, {ROW} FROM queen.kv
                          WHERE ns = $1 AND key >= $2 AND ($3::text IS NULL OR key < $3)
                            AND starts_with(key, $4) AND ($5::text IS NULL OR key > $5)
                            AND (expires_at IS NULL OR expires_at > $6)
                          ORDER BY key LIMIT $7"
                        ),
                    )
                    .await?,
                    &[
                        ns,
                        &start,
                        &upper,
                        prefix,
                        after,
                        &to_system_time(now),
                        &(i64::from(*limit) + 1),
                    ],
                )
                .await
                .map_err(pg_err("kv: getPrefix"))?;
            let rows = rows
                .iter()
                .map(|r| Ok((r.get::<_, String>(0), kv_row(r, 1)?)))
                .collect::<StorageResult<Vec<_>>>()?;
            Ok((kv::prefix_answer(&rows, *limit, *keys_only, limits), false))
        }
        _ => {
            let (ns, key) = (op.namespace(), op.key().unwrap_or_default());
            // Twice at most: an insert that lost to a concurrent insert reads the row again.
            for _ in 0..2 {
                let row = read_row(client, ns, key, op.locks_row()).await?;
                match kv::decide(op, row.as_ref(), now) {
                    Decision::Answer { answer, refused } => return Ok((answer, refused)),
                    Decision::Write { value, expires_at } => {
                        if let Some(written) =
                            store(client, ns, key, row.is_some(), &value, expires_at, now).await?
                        {
                            return Ok((kv::written(key, &written), false));
                        }
                    }
                    Decision::Delete { answer } => {
                        delete_row(client, ns, key).await?;
                        return Ok((answer, false));
                    }
                }
            }
            Err(StorageError::Contention(format!(
                "kv: key {key:?} of {ns:?} was inserted concurrently twice"
            )))
        }
    }
}

/// An expiry as the SQL functions take it: seconds from the database's time, NULL for never.
fn ttl_seconds(expiry: kv::Expiry) -> StorageResult<Option<i64>> {
    match expiry {
        kv::Expiry::Ttl(s) => i64::try_from(s)
            .map(Some)
            .map_err(|_| StorageError::Invalid(format!("kv: ttlSeconds {s} out of range"))),
        kv::Expiry::Forever => Ok(None),
    }
}

impl PgStorage {
    /// A call of one `get`: one statement, no transaction (a single read is its own snapshot).
    /// The most frequent call, and a quarter of the round trips of the general path.
    async fn kv_get(&self, op: &KvOp, ns: &str, key: &str) -> StorageResult<KvBatch> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let r = client
            .query_one(
                &prepared(
                    &client,
                    "SELECT queen.now(), k.value::text, k.version, k.expires_at, k.updated_at
                   FROM (SELECT 1) one LEFT JOIN queen.kv k ON k.ns = $1 AND k.key = $2",
                )
                .await?,
                &[&ns, &key],
            )
            .await
            .map_err(pg_err("kv: get"))?;
        let now = from_system_time(r.get(0));
        let row = match r.get::<_, Option<String>>(1) {
            Some(_) => Some(kv_row(&r, 1)?),
            None => None,
        };
        let (answer, _) = match kv::decide(op, row.as_ref(), now) {
            Decision::Answer { answer, refused } => (answer, refused),
            other => {
                return Err(StorageError::Internal(format!(
                    "kv: a get decided to write: {other:?}"
                )))
            }
        };
        Ok(KvBatch {
            results: vec![answer],
            failed: None,
        })
    }

    /// A call of one put without a precondition: one statement, no transaction (`kv_put_v1`).
    /// The most frequent write, and a fifth of the round trips of the general path.
    async fn kv_put(
        &self,
        ns: &str,
        key: &str,
        value: &Value,
        expiry: kv::Expiry,
    ) -> StorageResult<KvBatch> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let ttl = ttl_seconds(expiry)?;
        let r = client
            .query_one(
                &prepared(
                    &client,
                    "SELECT value, version, expires_at, updated_at
                   FROM queen.kv_put_v1($1, $2, $3::text::jsonb, $4)",
                )
                .await?,
                &[&ns, &key, &value.to_string(), &ttl],
            )
            .await
            .map_err(pg_err("kv: put"))?;
        Ok(KvBatch {
            results: vec![kv::written(key, &kv_row(&r, 0)?)],
            failed: None,
        })
    }

    /// A call of one `incr`: one statement (`kv_incr_v1`), so a hot key's row is locked for
    /// one statement, not for three round trips. A refusal's answer is core's verdict on the
    /// row the function answered, which must be a refusal too.
    async fn kv_incr(&self, op: &KvOp) -> StorageResult<KvBatch> {
        let KvOp::Incr {
            ns,
            key,
            delta,
            min,
            max,
            expiry,
            ..
        } = op
        else {
            return Err(StorageError::Internal(format!("kv: not an incr: {op:?}")));
        };
        let client = self.pool.get().await.map_err(pool_err)?;
        let r = client
            .query_one(
                &prepared(
                    &client,
                    "SELECT at, applied, value, version, expires_at, updated_at
                       FROM queen.kv_incr_v1($1, $2, $3, $4, $5, $6)",
                )
                .await?,
                &[ns, key, delta, min, max, &ttl_seconds(*expiry)?],
            )
            .await
            .map_err(pg_err("kv: incr"))?;
        let now = from_system_time(r.get(0));
        let row = match r.get::<_, Option<String>>(2) {
            Some(_) => Some(kv_row(&r, 2)?),
            None => None,
        };
        if r.get::<_, bool>(1) {
            let row = row.ok_or_else(|| {
                StorageError::Internal(format!("kv: incr of {key:?} applied without a row"))
            })?;
            return Ok(KvBatch {
                results: vec![kv::written(key, &row)],
                failed: None,
            });
        }
        match kv::decide(op, row.as_ref(), now) {
            // A refused `required` op fails the call, as in the general path (nothing was
            // written to roll back).
            Decision::Answer { answer, refused } if refused && op.required() => Ok(KvBatch {
                results: kv::rolled_back(vec![answer], std::slice::from_ref(op), 0),
                failed: Some(0),
            }),
            Decision::Answer { answer, .. } => Ok(KvBatch {
                results: vec![answer],
                failed: None,
            }),
            other => Err(StorageError::Internal(format!(
                "kv: kv_incr_v1 refused an incr of {key:?} that core writes: {other:?}"
            ))),
        }
    }

    async fn kv_batch_once(&self, ops: &[KvOp]) -> StorageResult<KvBatch> {
        match ops {
            [op @ KvOp::Get { ns, key }] => return self.kv_get(op, ns, key).await,
            [op @ KvOp::Incr { .. }] => return self.kv_incr(op).await,
            [op @ KvOp::Put {
                ns,
                key,
                value,
                expiry,
                ..
            }] if kv::writes_whatever_the_row(op) => {
                return self.kv_put(ns, key, value, *expiry).await
            }
            _ => {}
        }
        let limits = KvLimits::default();
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client.transaction().await.map_err(pg_err("kv: begin"))?;
        let now = db_now(&tx).await?;
        let mut results = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (answer, refused) = kv_op(&tx, op, now, &limits).await?;
            results.push(answer);
            if refused && op.required() {
                for later in &ops[i + 1..] {
                    results.push(kv_op(&tx, later, now, &limits).await?.0);
                }
                tx.rollback().await.map_err(pg_err("kv: rollback"))?;
                return Ok(KvBatch {
                    results: kv::rolled_back(results, ops, i),
                    failed: Some(i),
                });
            }
        }
        tx.commit().await.map_err(pg_err("kv: commit"))?;
        Ok(KvBatch {
            results,
            failed: None,
        })
    }

    /// A release in one statement: the permit goes only while it is live at the token
    /// (`locks::token_holds`, stated in SQL: the row's lock decides against a racing renew).
    async fn lock_release(&self, name: &str, token: i64, slot: u32) -> StorageResult<Value> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let n = client
            .execute(
                &prepared(
                    &client,
                    "DELETE FROM queen.kv
                      WHERE ns = $1 AND key = $2 AND version = $3
                        AND (expires_at IS NULL OR expires_at > queen.now())",
                )
                .await?,
                &[&LOCKS_NAMESPACE, &locks::permit_key(name, slot), &token],
            )
            .await
            .map_err(pg_err("lock: release"))?;
        Ok(locks::released(n == 1))
    }

    /// An acquire in one statement (`lock_acquire_v1`). The function decides as
    /// `locks::decide_acquire` does and answers the rows it decided on; core's verdict over
    /// those rows must be the function's, else the call fails (a drifted copy of the rule).
    async fn lock_acquire(
        &self,
        name: &str,
        ttl_seconds: u64,
        owner: &str,
        limit: u32,
    ) -> StorageResult<Value> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let keys: Vec<String> = (0..limit).map(|s| locks::permit_key(name, s)).collect();
        let ttl = ttl_seconds_of(ttl_seconds)?;
        let rows = client
            .query(
                &prepared(
                    &client,
                    "SELECT at, slot, taken, value, version, expires_at, updated_at
                       FROM queen.lock_acquire_v1($1, $2, $3, $4, $5)",
                )
                .await?,
                &[
                    &LOCKS_NAMESPACE,
                    &keys,
                    &locks::advisory_key(name),
                    &owner,
                    &ttl,
                ],
            )
            .await
            .map_err(pg_err("lock: acquire"))?;
        let now = time_of_first(&rows, || format!("lock: lock_acquire_v1 of {name:?}"))?;
        let mut found = Vec::with_capacity(rows.len());
        let mut written = None;
        for r in &rows {
            let slot = u32::try_from(r.get::<_, i32>(1)).map_err(|_| {
                StorageError::Internal("lock: lock_acquire_v1 answered a negative slot".into())
            })?;
            if r.get::<_, bool>(2) {
                written = Some((slot, kv_row(r, 3)?));
            } else {
                found.push((slot, Some(kv_row(r, 3)?)));
            }
        }
        let drifted = |what: String| {
            StorageError::Internal(format!("lock: lock_acquire_v1 of {name:?} {what}"))
        };
        match (locks::decide_acquire(&found, owner, limit, now), written) {
            (AcquireDecision::Already { slot, row }, None) => {
                Ok(locks::acquired(name, slot, &row, true))
            }
            (AcquireDecision::Refuse { holders }, None) => Ok(locks::refused_acquire(holders)),
            (AcquireDecision::Take { slot }, Some((took, row)))
                if took == slot && row.value == locks::permit_value(owner, now) =>
            {
                Ok(locks::acquired(name, slot, &row, false))
            }
            (verdict, written) => Err(drifted(format!(
                "wrote {written:?} where core decides {verdict:?}"
            ))),
        }
    }

    /// A renew in one statement (`lock_renew_v1`), held to `locks::renew_holds` over the row
    /// the function decided on, as an acquire is.
    async fn lock_renew(
        &self,
        name: &str,
        slot: u32,
        token: i64,
        owner: Option<&str>,
        ttl_seconds: u64,
    ) -> StorageResult<Value> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let key = locks::permit_key(name, slot);
        let rows = client
            .query(
                &prepared(
                    &client,
                    "SELECT at, key, taken, value, version, expires_at, updated_at
                       FROM queen.lock_renew_v1($1, $2, $3, $4, $5, $6)",
                )
                .await?,
                &[
                    &LOCKS_NAMESPACE,
                    &key,
                    &format!("{name}#"),
                    &token,
                    &owner,
                    &ttl_seconds_of(ttl_seconds)?,
                ],
            )
            .await
            .map_err(pg_err("lock: renew"))?;
        let now = time_of_first(&rows, || format!("lock: lock_renew_v1 of {key:?}"))?;
        let mut permits = Vec::with_capacity(rows.len());
        let mut decided_on = None;
        let mut written = None;
        for r in &rows {
            let Some(row_key) = r.get::<_, Option<String>>(1) else {
                continue;
            };
            let row = kv_row(r, 3)?;
            if r.get::<_, bool>(2) {
                written = Some(row);
                continue;
            }
            if row_key == key {
                decided_on = Some(row.clone());
            }
            if let Some(s) = locks::slot_of(name, &row_key) {
                permits.push((s, row));
            }
        }
        let holds = decided_on
            .as_ref()
            .is_some_and(|r| locks::renew_holds(r, token, owner, now));
        match (holds, written) {
            (true, Some(row)) => Ok(locks::renewed(name, slot, &row)),
            (false, None) => Ok(locks::lost_renew(locks::holders(&permits, now))),
            (holds, written) => Err(StorageError::Internal(format!(
                "lock: lock_renew_v1 of {key:?} wrote {written:?} where core says holds={holds}"
            ))),
        }
    }

    /// The holders of a lock in one statement (a read is its own snapshot).
    async fn lock_holders(&self, name: &str) -> StorageResult<Value> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let prefix = format!("{name}#");
        let rows = client
            .query(
                &prepared(
                    &client,
                    &format!(
                        "SELECT queen.now(), k.key, {ROW_OF_K}
                           FROM (SELECT 1) one LEFT JOIN queen.kv k
                             ON k.ns = $1 AND k.key >= $2 AND starts_with(k.key, $2)
                          ORDER BY k.key"
                    ),
                )
                .await?,
                &[&LOCKS_NAMESPACE, &prefix],
            )
            .await
            .map_err(pg_err("lock: holders"))?;
        let now = time_of_first(&rows, || format!("lock: the holders of {name:?}"))?;
        let mut permits = Vec::with_capacity(rows.len());
        for r in &rows {
            if let Some(slot) = r
                .get::<_, Option<String>>(1)
                .and_then(|k| locks::slot_of(name, &k))
            {
                permits.push((slot, kv_row(r, 2)?));
            }
        }
        Ok(locks::got(locks::holders(&permits, now)))
    }

    async fn lock_op_once(&self, op: &LockOp, minted_owner: &str) -> StorageResult<Value> {
        match op {
            LockOp::Acquire {
                name,
                ttl_seconds,
                owner,
                limit,
            } => {
                let owner = owner.as_deref().unwrap_or(minted_owner);
                self.lock_acquire(name, *ttl_seconds, owner, *limit).await
            }
            LockOp::Renew {
                name,
                token,
                slot,
                ttl_seconds,
                owner,
            } => {
                self.lock_renew(name, *slot, *token, owner.as_deref(), *ttl_seconds)
                    .await
            }
            LockOp::Release { name, token, slot } => self.lock_release(name, *token, *slot).await,
            LockOp::Get { name } => self.lock_holders(name).await,
        }
    }
}

/// The database's time a lock statement answered in its first column; every such answer has a
/// row (`what` names the call for the error).
fn time_of_first(rows: &[Row], what: impl FnOnce() -> String) -> StorageResult<Timestamp> {
    rows.first()
        .map(|r| from_system_time(r.get(0)))
        .ok_or_else(|| StorageError::Internal(format!("{} answered no row", what())))
}

/// A permit's lifetime as the SQL functions take it.
fn ttl_seconds_of(s: u64) -> StorageResult<i64> {
    i64::try_from(s)
        .map_err(|_| StorageError::Invalid(format!("lock: ttlSeconds {s} out of range")))
}

#[async_trait]
impl KvStorage for PgStorage {
    async fn kv_batch(&self, ops: Vec<KvOp>) -> StorageResult<KvBatch> {
        let (this, ops) = (self, &ops);
        retry_contention(move || this.kv_batch_once(ops)).await
    }

    async fn lock_op(&self, op: LockOp, minted_owner: String) -> StorageResult<Value> {
        let (this, op, owner) = (self, &op, &minted_owner);
        retry_contention(move || this.lock_op_once(op, owner)).await
    }

    async fn sweep_expired_kv(&self, limit: u32) -> StorageResult<u64> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let n = client
            .execute(
                &prepared(
                    &client,
                    "DELETE FROM queen.kv k USING (
                     SELECT ns, key FROM queen.kv
                      WHERE expires_at <= queen.now()
                      ORDER BY expires_at LIMIT $1
                      FOR UPDATE SKIP LOCKED) d
                  WHERE k.ns = d.ns AND k.key = d.key AND k.expires_at <= queen.now()",
                )
                .await?,
                &[&i64::from(limit)],
            )
            .await
            .map_err(pg_err("kv: sweep"))?;
        Ok(n)
    }
}
