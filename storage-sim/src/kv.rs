//! The key/value store and its locks in the model: each op reads its key's row under the row
//! lock, asks core's rules, and writes what they name, as `storage-pg/src/kv.rs` does.

use std::sync::Arc;

use queen_core::kv::{self, Decision, KvBatch, KvLimits, KvOp, KvRow, LOCKS_NAMESPACE};
use queen_core::locks::{self, AcquireDecision, LockOp};
use queen_core::storage::StorageError;
use queen_core::Timestamp;
use serde_json::Value;

use crate::state::DbState;
use crate::table::{Insert, Lock};
use crate::tx::{in_tx, lock, Shared, StmtError, TaskCell, Tx, TxHandle};

type Key = (String, String);

/// Writes `key`'s row (an update of the physical row when `existed`, else an insert) at the
/// next version. Callers have checked that no other transaction holds the row.
fn store(
    st: &mut DbState,
    key: &Key,
    existed: bool,
    value: Value,
    expires_at: Option<Timestamp>,
    t: &Tx,
) -> Result<KvRow, StmtError> {
    let (now, tx) = (t.now, t.id);
    let version = if t.shared.bugs.kv_versions_repeat {
        // SimBugs::kv_versions_repeat: a version per key, recycled after a delete.
        st.kv.get(key, tx).map_or(1, |r| r.version + 1)
    } else {
        st.kv_seq + 1
    };
    let row = KvRow {
        value,
        version,
        expires_at,
        updated_at: now,
    };
    if existed {
        match st.kv.update(key, row.clone(), tx) {
            Lock::Acquired => {}
            Lock::HeldBy(h) => return Err(StmtError::Blocked(h)),
            Lock::Missing => {
                return Err(StmtError::Abort(StorageError::Internal(
                    "kv: the row read under its lock vanished".into(),
                )))
            }
        }
    } else {
        match st.kv.insert(key.clone(), row.clone(), tx) {
            Insert::Inserted => {}
            Insert::WaitFor(h) => return Err(StmtError::Blocked(h)),
            Insert::Exists => {
                return Err(StmtError::Abort(StorageError::Internal(
                    "kv: a row appeared under a key read as absent".into(),
                )))
            }
        }
    }
    st.kv_seq += 1;
    Ok(row)
}

/// The row of `key` for an op that takes its lock: waits while another transaction holds or
/// inserts it.
fn locked_row(st: &mut DbState, key: &Key, tx: u64) -> Result<Option<KvRow>, StmtError> {
    if let Some(h) = st.kv.locked_by_other(key, tx) {
        return Err(StmtError::Blocked(h));
    }
    let row = st.kv.get(key, tx).cloned();
    if row.is_some() {
        st.kv.lock(key, tx);
    }
    Ok(row)
}

/// One op of a batch or a transaction's rider: its answer, and whether it was refused.
pub(crate) async fn kv_op(
    tx: &TxHandle,
    op: &KvOp,
    limits: &KvLimits,
) -> Result<(Value, bool), StorageError> {
    match op {
        KvOp::GetMany { ns, keys } => {
            tx.stmt("kv getMany", |st, t| {
                let rows: Vec<Option<KvRow>> = keys
                    .iter()
                    .map(|k| st.kv.get(&(ns.clone(), k.clone()), t.id).cloned())
                    .collect();
                Ok((kv::get_many_answer(keys, &rows, t.now, limits), false))
            })
            .await
        }
        KvOp::GetPrefix {
            ns,
            prefix,
            after,
            limit,
            keys_only,
        } => {
            tx.stmt("kv getPrefix", |st, t| {
                let rows = prefix_rows(st, ns, prefix, after.as_deref(), *limit as usize + 1, t);
                Ok((kv::prefix_answer(&rows, *limit, *keys_only, limits), false))
            })
            .await
        }
        KvOp::Incr { .. } if tx.bugs().incr_checks_limit_before_the_lock => {
            // SimBugs::incr_checks_limit_before_the_lock: the verdict is made on a read without
            // the row's lock, and written after taking it, so two increments that read one
            // value both pass the limit and both write the same next value.
            let key: Key = (
                op.namespace().to_string(),
                op.key().unwrap_or_default().to_string(),
            );
            let decision = tx
                .stmt("kv incr read", |st, t| {
                    Ok(kv::decide(op, st.kv.get(&key, t.id), t.now))
                })
                .await?;
            tx.stmt("kv incr write", |st, t| {
                let row = locked_row(st, &key, t.id)?;
                match decision.clone() {
                    Decision::Write { value, expires_at } => {
                        let written = store(st, &key, row.is_some(), value, expires_at, t)?;
                        Ok((kv::written(&key.1, &written), false))
                    }
                    Decision::Answer { answer, refused } => Ok((answer, refused)),
                    Decision::Delete { answer } => Ok((answer, false)),
                }
            })
            .await
        }
        _ => {
            let key: Key = (
                op.namespace().to_string(),
                op.key().unwrap_or_default().to_string(),
            );
            tx.stmt("kv op", |st, t| {
                let mut row = if op.locks_row() {
                    locked_row(st, &key, t.id)?
                } else {
                    st.kv.get(&key, t.id).cloned()
                };
                if t.shared.bugs.kv_get_ignores_expiry && matches!(op, KvOp::Get { .. }) {
                    // SimBugs::kv_get_ignores_expiry: a read takes an expired row as live.
                    if let Some(r) = row.as_mut() {
                        r.expires_at = None;
                    }
                }
                match kv::decide(op, row.as_ref(), t.now) {
                    Decision::Answer { answer, refused } => Ok((answer, refused)),
                    Decision::Write { value, expires_at } => {
                        let written = store(st, &key, row.is_some(), value, expires_at, t)?;
                        Ok((kv::written(&key.1, &written), false))
                    }
                    Decision::Delete { answer } => {
                        st.kv.delete(&key, t.id);
                        Ok((answer, false))
                    }
                }
            })
            .await
        }
    }
}

/// Live rows of `ns` under `prefix` after the cursor, in key order, at most `take`.
fn prefix_rows(
    st: &DbState,
    ns: &str,
    prefix: &str,
    after: Option<&str>,
    take: usize,
    t: &Tx,
) -> Vec<(String, KvRow)> {
    let start = (ns.to_string(), prefix.to_string());
    st.kv
        .range(start.., t.id)
        .take_while(|((n, k), _)| n == ns && k.starts_with(prefix))
        .filter(|((_, k), r)| kv::in_prefix_page(k, prefix, after) && r.live(t.now))
        .take(take)
        .map(|((_, k), r)| (k.clone(), r.clone()))
        .collect()
}

/// `POST /api/v1/kv`: the ops in one transaction; a refused required op rolls it back.
pub(crate) async fn kv_batch(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    ops: Vec<KvOp>,
    limits: KvLimits,
) -> Result<KvBatch, StorageError> {
    let outcome = Arc::new(std::sync::Mutex::new(None));
    let stash = outcome.clone();
    let r = in_tx(&shared, "kv batch", cell, |tx| async move {
        let mut results = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (answer, refused) = kv_op(&tx, op, &limits).await?;
            results.push(answer);
            if refused && op.required() && tx.bugs().required_checked_outside_the_transaction {
                // SimBugs::required_checked_outside_the_transaction: the ops before the refused
                // one stay applied (as if each had committed alone), the rest are not run.
                let mut answers = results.clone();
                answers.extend(ops[i + 1..].iter().map(|later| {
                    serde_json::json!({"applied": false, "reason": "rolled_back", "key": later.key()})
                }));
                return Ok(KvBatch {
                    results: answers,
                    failed: Some(i),
                });
            }
            if refused && op.required() {
                // Answer every op (reads included), then roll back.
                for later in &ops[i + 1..] {
                    results.push(kv_op(&tx, later, &limits).await?.0);
                }
                *lock(&stash) = Some(KvBatch {
                    results: kv::rolled_back(results, &ops, i),
                    failed: Some(i),
                });
                return Err(StorageError::Invalid("kv batch refused".into()));
            }
        }
        Ok(KvBatch {
            results,
            failed: None,
        })
    })
    .await;
    let refused = lock(&outcome).take();
    match (r, refused) {
        (Ok(batch), _) => Ok(batch),
        (Err(_), Some(refused)) => Ok(refused),
        (Err(e), None) => Err(e),
    }
}

/// One lock op in its own transaction.
pub(crate) async fn lock_op(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    op: LockOp,
    minted_owner: String,
) -> Result<Value, StorageError> {
    in_tx(&shared, "lock op", cell, |tx| async move {
        match &op {
            LockOp::Acquire {
                name,
                ttl_seconds,
                owner,
                limit,
            } => {
                let owner = owner.clone().unwrap_or(minted_owner);
                tx.stmt("lock acquire", |st, t| {
                    if let Some(h) = st.take_advisory(locks::advisory_key(name), t.id) {
                        return Err(StmtError::Blocked(h));
                    }
                    let slots: Vec<(u32, Option<KvRow>)> = (0..*limit)
                        .map(|s| {
                            let row = st.kv.get(&permit(name, s), t.id).cloned();
                            // SimBugs::expired_permits_count: every stored permit looks live.
                            let row = row.map(|r| KvRow {
                                expires_at: r
                                    .expires_at
                                    .filter(|_| !t.shared.bugs.expired_permits_count),
                                ..r
                            });
                            (s, row)
                        })
                        .collect();
                    match locks::decide_acquire(&slots, &owner, *limit, t.now) {
                        AcquireDecision::Already { slot, row } => {
                            Ok(locks::acquired(name, slot, &row, true))
                        }
                        AcquireDecision::Refuse { holders } => Ok(locks::refused_acquire(holders)),
                        AcquireDecision::Take { slot } => {
                            let key = permit(name, slot);
                            let existing = locked_row(st, &key, t.id)?;
                            let expires_at = kv::Expiry::Ttl(*ttl_seconds).at(t.now);
                            let value = locks::permit_value(&owner, t.now);
                            let row = store(st, &key, existing.is_some(), value, expires_at, t)?;
                            Ok(locks::acquired(name, slot, &row, false))
                        }
                    }
                })
                .await
            }
            LockOp::Renew {
                name,
                token,
                slot,
                ttl_seconds,
                owner,
            } => {
                tx.stmt("lock renew", |st, t| {
                    let key = permit(name, *slot);
                    let row = locked_row(st, &key, t.id)?;
                    // SimBugs::renew_takes_over_the_slot: any stored permit of the slot passes.
                    let takes_over = t.shared.bugs.renew_takes_over_the_slot;
                    match row.filter(|r| {
                        takes_over || locks::renew_holds(r, *token, owner.as_deref(), t.now)
                    }) {
                        Some(r) => {
                            let expires_at = kv::Expiry::Ttl(*ttl_seconds).at(t.now);
                            let value = locks::renewed_value(&r);
                            let row = store(st, &key, true, value, expires_at, t)?;
                            Ok(locks::renewed(name, *slot, &row))
                        }
                        None => Ok(locks::lost_renew(locks::holders(
                            &permits_of(st, name, t.id),
                            t.now,
                        ))),
                    }
                })
                .await
            }
            LockOp::Release { name, token, slot } => {
                tx.stmt("lock release", |st, t| {
                    let key = permit(name, *slot);
                    let row = locked_row(st, &key, t.id)?;
                    let holds = locks::token_holds(row.as_ref(), *token, t.now);
                    if holds {
                        st.kv.delete(&key, t.id);
                    }
                    Ok(locks::released(holds))
                })
                .await
            }
            LockOp::Get { name } => {
                tx.stmt("lock get", |st, t| {
                    Ok(locks::got(locks::holders(
                        &permits_of(st, name, t.id),
                        t.now,
                    )))
                })
                .await
            }
        }
    })
    .await
}

fn permit(name: &str, slot: u32) -> Key {
    (LOCKS_NAMESPACE.to_string(), locks::permit_key(name, slot))
}

/// Every permit row of lock `name` (live or not), with its slot.
fn permits_of(st: &DbState, name: &str, tx: u64) -> Vec<(u32, KvRow)> {
    let prefix = format!("{name}#");
    st.kv
        .range((LOCKS_NAMESPACE.to_string(), prefix.clone()).., tx)
        .take_while(|((n, k), _)| n == LOCKS_NAMESPACE && k.starts_with(&prefix))
        .filter_map(|((_, k), r)| locks::slot_of(name, k).map(|s| (s, r.clone())))
        .collect()
}

/// Removes up to `limit` expired rows that no transaction holds.
pub(crate) async fn sweep_expired(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    limit: u32,
) -> Result<u64, StorageError> {
    in_tx(&shared, "kv sweep", cell, |tx| async move {
        tx.stmt("kv sweep", |st, t| {
            let expired: Vec<Key> = st
                .kv
                .iter(t.id)
                .filter(|(k, r)| !r.live(t.now) && st.kv.locked_by_other(k, t.id).is_none())
                .take(limit as usize)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &expired {
                st.kv.delete(k, t.id);
            }
            Ok(expired.len() as u64)
        })
        .await
    })
    .await
}
