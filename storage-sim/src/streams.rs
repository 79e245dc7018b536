//! Stream queries and state in the model, as `storage-pg/src/streams.rs` keeps them: a query row
//! and its unique name, state rows keyed by (query, partition, key), registration under the
//! name's lock, and a cycle's state part inside the cycle's transaction.

use std::sync::Arc;

use queen_core::storage::StorageError;
use queen_core::streams::{
    self, LeaseView, QueryRegistration, Registration, RegistrationStep, StateQuery, StateRow,
    StoredQuery, StreamCycleOp, StreamRefusal,
};

use crate::state::{advisory_key, DbState, StateKey, StreamQueryRow, StreamStateRow};
use crate::table::{Insert, Lock};
use crate::tx::{in_tx, Shared, StmtError, TaskCell, TxHandle};

fn held(lock: Lock) -> Result<(), StmtError> {
    match lock {
        Lock::HeldBy(h) => Err(StmtError::Blocked(h)),
        Lock::Acquired | Lock::Missing => Ok(()),
    }
}

/// The state keys of a whole query (a reset drops them).
fn keys_of_query(st: &DbState, id: uuid::Uuid, tx: u64) -> Vec<StateKey> {
    st.stream_state
        .range((id, String::new(), String::new()).., tx)
        .take_while(|((q, _, _), _)| *q == id)
        .map(|(k, _)| k.clone())
        .collect()
}

pub(crate) async fn register(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    req: QueryRegistration,
    minted_id: uuid::Uuid,
) -> Result<Registration, StorageError> {
    in_tx(&shared, "streams register", cell, |tx| async move {
        tx.stmt("streams register", |st, t| {
            let name = req.name.clone();
            if let Some(h) = st.stream_names.locked_by_other(&name, t.id) {
                return Err(StmtError::Blocked(h));
            }
            let stored = st.stream_names.get(&name, t.id).copied().and_then(|id| {
                st.stream_queries.get(&id, t.id).map(|q| StoredQuery {
                    id,
                    config_hash: q.config_hash.clone(),
                })
            });
            let row = StreamQueryRow {
                name: name.clone(),
                source_queue: req.source_queue.clone(),
                sink_queue: req.sink_queue.clone(),
                config_hash: req.config_hash.clone(),
            };
            match (streams::registration_step(&req, stored.as_ref()), stored) {
                (RegistrationStep::Create, _) => {
                    match st.stream_names.insert(name, minted_id, t.id) {
                        Insert::Inserted => {}
                        Insert::WaitFor(h) => return Err(StmtError::Blocked(h)),
                        Insert::Exists => {
                            return Err(StmtError::Abort(StorageError::Internal(
                                "streams register: a name read as absent exists".into(),
                            )))
                        }
                    }
                    let _ = st.stream_queries.insert(minted_id, row, t.id);
                    Ok(Registration::Registered {
                        query_id: minted_id,
                        fresh: true,
                        reset: false,
                    })
                }
                (RegistrationStep::Existing, Some(q)) => Ok(Registration::Registered {
                    query_id: q.id,
                    fresh: false,
                    reset: false,
                }),
                (RegistrationStep::Mismatch, Some(q)) => Ok(Registration::HashMismatch {
                    stored_hash: q.config_hash,
                }),
                (RegistrationStep::Reset, Some(q)) => {
                    held(st.stream_queries.lock(&q.id, t.id))?;
                    let keys = keys_of_query(st, q.id, t.id);
                    for k in &keys {
                        if let Some(h) = st.stream_state.locked_by_other(k, t.id) {
                            return Err(StmtError::Blocked(h));
                        }
                    }
                    for k in &keys {
                        st.stream_state.delete(k, t.id);
                    }
                    st.stream_queries.update(&q.id, row, t.id);
                    Ok(Registration::Registered {
                        query_id: q.id,
                        fresh: false,
                        reset: true,
                    })
                }
                (step, None) => Err(StmtError::Abort(StorageError::Internal(format!(
                    "streams register: {step:?} without a stored query"
                )))),
            }
        })
        .await
    })
    .await
}

/// The state rows of a source partition (its deletion deletes them, as PostgreSQL's cascade).
pub(crate) fn state_keys_of_partition(st: &DbState, pid: &str, tx: u64) -> Vec<StateKey> {
    st.stream_state
        .iter(tx)
        .filter(|((_, p, _), _)| p == pid)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The committed rows a state read selects (`None`: no such query).
pub(crate) fn state(st: &DbState, q: &StateQuery) -> Option<Vec<StateRow>> {
    st.stream_queries.get(&q.query_id, 0)?;
    Some(selected(st, q, 0).into_iter().map(|(_, row)| row).collect())
}

/// The rows of the read's shard it selects, with their keys in the table, as transaction `tx`
/// sees them.
fn selected(st: &DbState, q: &StateQuery, tx: u64) -> Vec<(StateKey, StateRow)> {
    let start = (q.query_id, q.partition_id.clone(), String::new());
    st.stream_state
        .range(start.., tx)
        .take_while(|((id, p, _), _)| *id == q.query_id && *p == q.partition_id)
        .filter(|((_, _, key), row)| q.selects(key, &row.value))
        .map(|(k, row)| {
            (
                k.clone(),
                StateRow {
                    key: k.2.clone(),
                    value: row.value.clone(),
                    updated_at: row.updated_at,
                },
            )
        })
        .collect()
}

/// A ripe read: the rows it selects, each stamped with its version under the row's lock (as
/// PostgreSQL's UPDATE ... RETURNING), in a transaction of its own.
pub(crate) async fn ripe_read(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    q: StateQuery,
) -> Result<Option<Vec<StateRow>>, StorageError> {
    in_tx(&shared, "streams ripe read", cell, |tx| async move {
        tx.stmt("streams ripe read", |st, t| {
            if st.stream_queries.get(&q.query_id, t.id).is_none() {
                return Ok(None);
            }
            let rows = selected(st, &q, t.id);
            for (k, _) in &rows {
                if let Some(h) = st.stream_state.locked_by_other(k, t.id) {
                    return Err(StmtError::Blocked(h));
                }
            }
            for (k, _) in &rows {
                if let Some(mut row) = st.stream_state.get(k, t.id).cloned() {
                    row.ripe_read = Some(row.version);
                    st.stream_state.update(k, row, t.id);
                }
            }
            Ok(Some(rows.into_iter().map(|(_, r)| r).collect()))
        })
        .await
    })
    .await
}

/// `TxOp::Stream`: the fence, then the state ops' net effect (see the PostgreSQL version for
/// the locks and why).
pub(crate) async fn cycle_op(
    tx: &TxHandle,
    op: &StreamCycleOp,
) -> Result<Result<usize, StreamRefusal>, StorageError> {
    tx.stmt("streams cycle", |st, t| {
        let shard = advisory_key(&op.query_id.to_string(), &op.partition_id, 7173);
        if let Some(h) = st.take_advisory(shard, t.id) {
            return Err(StmtError::Blocked(h));
        }
        let source = match st.stream_queries.get(&op.query_id, t.id).cloned() {
            Some(q) => {
                held(st.stream_queries.lock(&op.query_id, t.id))?;
                Some(q.source_queue)
            }
            None => None,
        };
        let partition_queue = match st.partition_ids.get(&op.partition_id, t.id).cloned() {
            Some((queue, _)) => {
                // PostgreSQL's FOR KEY SHARE: the partition's deletion waits for the cycle.
                held(st.partition_ids.lock(&op.partition_id, t.id))?;
                Some(queue)
            }
            None => None,
        };
        // The cursor row, locked for the fence: a cycle with an ack needs its lease, a flush needs
        // no lease live.
        let cursor = (op.partition_id.clone(), op.group.clone());
        held(st.consumers.lock(&cursor, t.id))?;
        let mut lease = st.consumers.get(&cursor, t.id).map(|r| LeaseView {
            worker: r.worker_id.map(|w| w.0),
            expires_at: r.lease_expires_at,
        });
        let key = |k: &str| (op.query_id, op.partition_id.clone(), k.to_string());
        let read_rows = streams::deletes_of_read_rows(&op.ops);
        let mut rows_found: Vec<streams::RowFound> = read_rows
            .iter()
            .filter_map(|k| {
                let row = st.stream_state.get(&key(k), t.id)?;
                Some(streams::RowFound {
                    key: k.clone(),
                    window: streams::window_end(&row.value).is_some(),
                    // SimBugs::flush_ignores_its_ripe_read: every row passes as read.
                    as_ripe_read: row.ripe_read == Some(row.version)
                        || t.shared.bugs.flush_ignores_its_ripe_read,
                })
            })
            .collect();
        if t.shared.bugs.stream_flush_unfenced && op.lease_id.is_none() {
            // SimBugs::stream_flush_unfenced: a flush sees no lease and every row it deletes,
            // each as it read it.
            lease = None;
            rows_found = read_rows
                .into_iter()
                .map(|key| streams::RowFound {
                    key,
                    window: false,
                    as_ripe_read: true,
                })
                .collect();
        }
        // SimBugs::stream_fence_ignores_lease: the cycle is checked as if it named no lease (and
        // no lease were held).
        let unfenced;
        let checked = if t.shared.bugs.stream_fence_ignores_lease {
            unfenced = StreamCycleOp {
                lease_id: None,
                ..op.clone()
            };
            lease = None;
            &unfenced
        } else {
            op
        };
        let view = streams::CycleView {
            query_source: source.as_deref(),
            source_of_partition: partition_queue.as_deref(),
            lease,
            rows_found: &rows_found,
        };
        if let Err(refusal) = streams::check_cycle(checked, &view, t.now) {
            return Ok(Err(refusal));
        }
        let (upserts, deletes) = streams::net_effect(&op.ops);
        for k in upserts.iter().map(|(k, _)| k).chain(deletes.iter()) {
            if let Some(h) = st.stream_state.locked_by_other(&key(k), t.id) {
                return Err(StmtError::Blocked(h));
            }
        }
        for (k, value) in upserts {
            st.stream_state_seq += 1;
            let row = StreamStateRow {
                value,
                updated_at: t.now,
                version: st.stream_state_seq,
                ripe_read: None,
            };
            if st.stream_state.get(&key(&k), t.id).is_some() {
                st.stream_state.update(&key(&k), row, t.id);
            } else if let Insert::WaitFor(h) = st.stream_state.insert(key(&k), row, t.id) {
                return Err(StmtError::Blocked(h));
            }
        }
        for k in deletes {
            st.stream_state.delete(&key(&k), t.id);
        }
        Ok(Ok(op.ops.len()))
    })
    .await
}

/// `TxOp::EndLease`: ends the lease if that id still holds it live; the cursor row's change is
/// the release event, as PostgreSQL's trigger makes it.
pub(crate) async fn end_lease(
    tx: &TxHandle,
    group: &str,
    partition_id: &str,
    lease_id: &str,
) -> Result<Option<(String, String)>, StorageError> {
    tx.stmt("streams end lease", |st, t| {
        let key = (partition_id.to_string(), group.to_string());
        held(st.consumers.lock(&key, t.id))?;
        let Some(mut row) = st.consumers.get(&key, t.id).cloned() else {
            return Ok(None);
        };
        let view = LeaseView {
            worker: row.worker_id.map(|w| w.0),
            expires_at: row.lease_expires_at,
        };
        if !streams::lease_holds(lease_id, Some(view), t.now) {
            return Ok(None);
        }
        row.end_lease();
        st.consumers.update(&key, row, t.id);
        Ok(st.partition_ids.get(&key.0, t.id).cloned())
    })
    .await
}
