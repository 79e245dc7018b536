//! Queue administration in the model: configure, delete, and retention's segment drop.

use std::sync::Arc;

use queen_core::storage::{ConfiguredQueue, QueueConfig, StorageError};
use queen_core::Offset;

use crate::messages::{ensure_partition_locked, ensure_queue, lock_or_wait};
use crate::state::RemovedMessages;
use crate::tx::{in_tx, Shared, StmtError, TaskCell};

pub(crate) async fn configure(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    config: QueueConfig,
) -> Result<ConfiguredQueue, StorageError> {
    in_tx(&shared, "configure_queue", cell, |tx| async move {
        let now = tx.now();
        let qid = tx
            .stmt("upsert queue", |st, t| {
                ensure_queue(st, &config.name, now, t.id)?;
                let mut row = st.queues.get(&config.name, t.id).cloned().ok_or_else(|| {
                    StmtError::Abort(StorageError::Internal("queue row missing".into()))
                })?;
                row.config = config.clone();
                lock_or_wait(st.queues.update(&config.name, row.clone(), t.id))?;
                Ok(row.id)
            })
            .await?;
        let pid = tx
            .stmt("default partition", |st, t| {
                ensure_partition_locked(
                    st,
                    &config.name,
                    queen_core::types::DEFAULT_PARTITION,
                    now,
                    t.id,
                )
            })
            .await?;
        Ok(ConfiguredQueue {
            queue_id: qid,
            default_partition_id: pid,
        })
    })
    .await
}

pub(crate) async fn delete_queue(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    queue: String,
) -> Result<bool, StorageError> {
    in_tx(&shared, "delete_queue", cell, |tx| async move {
        tx.stmt("delete queue", |st, t| {
            if st.queues.get(&queue, t.id).is_none() {
                return Ok(false);
            }
            let parts: Vec<((String, String), String)> = st
                .partitions_of(&queue, t.id)
                .map(|(n, p)| ((queue.clone(), n.to_string()), p.id.clone()))
                .collect();
            // Take every lock first (waiting where needed), so a wait changes nothing.
            lock_or_wait(st.queues.lock(&queue, t.id))?;
            for (k, pid) in &parts {
                lock_or_wait(st.partitions.lock(k, t.id))?;
                // Before the cursor rows, in a stream cycle's order (its fence holds the
                // partition id row, then the cursor row).
                lock_or_wait(st.partition_ids.lock(pid, t.id))?;
                for s in crate::streams::state_keys_of_partition(st, pid, t.id) {
                    lock_or_wait(st.stream_state.lock(&s, t.id))?;
                }
                for c in st.consumers.keys_of(pid, String::new(), t.id) {
                    lock_or_wait(st.consumers.lock(&c, t.id))?;
                }
            }
            for (k, pid) in &parts {
                st.segments.delete_all_of(pid, Offset::MIN, t.id);
                st.txids.delete_all_of(pid, String::new(), t.id);
                st.traces.delete_all_of(pid, i64::MIN, t.id);
                st.consumers.delete_all_of(pid, String::new(), t.id);
                for s in crate::streams::state_keys_of_partition(st, pid, t.id) {
                    st.stream_state.delete(&s, t.id);
                }
                if let Some(n) = st.partitions.get(k, t.id).map(|p| p.number) {
                    st.partition_numbers.delete(&n, t.id);
                }
                st.partition_ids.delete(pid, t.id);
                st.partitions.delete(k, t.id);
            }
            st.dlq.delete_all_of(&queue, 0, t.id);
            st.watermarks.delete_all_of(&queue, String::new(), t.id);
            st.queues.delete(&queue, t.id);
            Ok(true)
        })
        .await
    })
    .await
}

/// Retention: removes a partition's segments with base_offset < `before` (the cursor rows and
/// partition head are untouched, exactly as a retention job leaves them).
pub(crate) async fn drop_segments(
    shared: Arc<Shared>,
    cell: Arc<TaskCell>,
    queue: String,
    partition: String,
    before: Offset,
) -> Result<u32, StorageError> {
    in_tx(&shared, "retention", cell, |tx| async move {
        tx.stmt("delete segments", |st, t| {
            let Some(pid) = st
                .partitions
                .get(&(queue.clone(), partition.clone()), t.id)
                .map(|p| p.id.clone())
            else {
                return Ok(0);
            };
            let segs: Vec<_> = st
                .segments
                .range((pid.clone(), Offset::MIN)..(pid.clone(), before), t.id)
                .map(|(k, _)| k.clone())
                .collect();
            for s in &segs {
                lock_or_wait(st.segments.lock(s, t.id))?;
            }
            let key = (queue.clone(), partition.clone());
            lock_or_wait(st.partitions.lock(&key, t.id))?;
            for s in &segs {
                let Some(seg) = st.segments.get(s, t.id).cloned() else {
                    continue;
                };
                let txids: Vec<String> = st
                    .txids
                    .range((pid.clone(), String::new()).., t.id)
                    .take_while(|((p, _), _)| *p == pid)
                    .filter(|(_, r)| (s.1..=seg.end_offset).contains(&r.offset))
                    .map(|((_, tx), _)| tx.clone())
                    .collect();
                st.segments.delete(s, t.id);
                // A removal like retention's (the driver calls this only on consumed data).
                st.note_removal(
                    t.id,
                    RemovedMessages {
                        queue: queue.clone(),
                        partition: partition.clone(),
                        base_offset: s.1,
                        end_offset: seg.end_offset,
                        created_at: seg.created_at,
                        reason: queen_core::storage::Removal::Completed,
                        transaction_ids: txids,
                        committed_at: queen_core::Timestamp::EPOCH,
                    },
                );
            }
            crate::retention::refresh_oldest_at(st, &key, &pid, t.id)?;
            Ok(segs.len() as u32)
        })
        .await
    })
    .await
}
