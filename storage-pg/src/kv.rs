//! The key/value store and its locks on PostgreSQL. Each op reads its key's row (`FOR UPDATE`
//! when it may write or must still hold at commit), asks core's rules (`queen_core::kv`,
//! `queen_core::locks`) and runs the write they name, so the model and PostgreSQL share one
//! statement of every verdict. An insert that meets a concurrent insert of the same key waits for
//! it (the primary key) and then reads the row again.

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

    async fn lock_op_once(&self, op: &LockOp, minted_owner: &str) -> StorageResult<Value> {
        if let LockOp::Release { name, token, slot } = op {
            return self.lock_release(name, *token, *slot).await;
        }
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client.transaction().await.map_err(pg_err("lock: begin"))?;
        let now = db_now(&tx).await?;
        let answer = match op {
            LockOp::Acquire {
                name,
                ttl_seconds,
                owner,
                limit,
            } => {
                let owner = owner.as_deref().unwrap_or(minted_owner);
                tx.execute(
                    &prepared(&tx, "SELECT pg_advisory_xact_lock($1)").await?,
                    &[&locks::advisory_key(name)],
                )
                .await
                .map_err(pg_err("lock: serialize acquires"))?;
                let mut slots = Vec::with_capacity(*limit as usize);
                for s in 0..*limit {
                    let row =
                        read_row(&tx, LOCKS_NAMESPACE, &locks::permit_key(name, s), false).await?;
                    slots.push((s, row));
                }
                match locks::decide_acquire(&slots, owner, *limit, now) {
                    AcquireDecision::Already { slot, row } => {
                        locks::acquired(name, slot, &row, true)
                    }
                    AcquireDecision::Refuse { holders } => locks::refused_acquire(holders),
                    AcquireDecision::Take { slot } => {
                        let key = locks::permit_key(name, slot);
                        let existing = read_row(&tx, LOCKS_NAMESPACE, &key, true).await?;
                        let expires_at = kv::Expiry::Ttl(*ttl_seconds).at(now);
                        let value = locks::permit_value(owner, now);
                        let row = store(
                            &tx,
                            LOCKS_NAMESPACE,
                            &key,
                            existing.is_some(),
                            &value,
                            expires_at,
                            now,
                        )
                        .await?
                        .ok_or_else(|| {
                            // Inserts of one name are serialized by the advisory lock.
                            StorageError::Internal(format!("lock: permit {key} appeared"))
                        })?;
                        locks::acquired(name, slot, &row, false)
                    }
                }
            }
            LockOp::Renew {
                name,
                token,
                slot,
                ttl_seconds,
                owner,
            } => {
                let key = locks::permit_key(name, *slot);
                let row = read_row(&tx, LOCKS_NAMESPACE, &key, true).await?;
                match row.filter(|r| locks::renew_holds(r, *token, owner.as_deref(), now)) {
                    Some(r) => {
                        let expires_at = kv::Expiry::Ttl(*ttl_seconds).at(now);
                        let value = locks::renewed_value(&r);
                        let row = store(&tx, LOCKS_NAMESPACE, &key, true, &value, expires_at, now)
                            .await?
                            .ok_or_else(|| {
                                StorageError::Internal(format!("lock: permit {key} vanished"))
                            })?;
                        locks::renewed(name, *slot, &row)
                    }
                    None => locks::lost_renew(locks::holders(&permits_of(&tx, name).await?, now)),
                }
            }
            LockOp::Release { .. } => {
                return Err(StorageError::Internal(
                    "lock: a release reached the transaction path (it is one statement)".into(),
                ))
            }
            LockOp::Get { name } => locks::got(locks::holders(&permits_of(&tx, name).await?, now)),
        };
        tx.commit().await.map_err(pg_err("lock: commit"))?;
        Ok(answer)
    }
}

/// Every permit row of lock `name` (live or not), with its slot.
async fn permits_of(client: &impl GenericClient, name: &str) -> StorageResult<Vec<(u32, KvRow)>> {
    let prefix = format!("{name}#");
    let rows = client
        .query(
            &prepared(
                client,
                &format!(
                    "SELECT key, {ROW} FROM queen.kv
                  WHERE ns = $1 AND key >= $2 AND starts_with(key, $2) ORDER BY key"
                ),
            )
            .await?,
            &[&LOCKS_NAMESPACE, &prefix],
        )
        .await
        .map_err(pg_err("lock: holders"))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        if let Some(slot) = locks::slot_of(name, &r.get::<_, String>(0)) {
            out.push((slot, kv_row(r, 1)?));
        }
    }
    Ok(out)
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
