//! The model's tables: the same rows as schema `queen` in PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_core::claim::CursorRow;
use queen_core::events::DeliveryEvent;
use queen_core::rng::SeededRng;
use queen_core::storage::QueueConfig;
use queen_core::{Offset, Timestamp};

use crate::table::{Table, TxId};

#[derive(Clone, Debug)]
pub struct QueueRow {
    pub id: String,
    pub config: QueueConfig,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug)]
pub struct PartitionRow {
    pub id: String,
    pub last_offset: Offset,
    /// Quantized to one second, as in PostgreSQL.
    pub last_write_at: Timestamp,
    /// The created_at of the oldest segment (`None`: no segment): retention's candidate key.
    pub oldest_at: Option<Timestamp>,
    /// The partition's number (PostgreSQL's `seq`): the u64 `partitionId` of framed pop answers.
    pub number: u64,
    pub created_at: Timestamp,
}

/// A trace of a stored message (`queen.message_traces` with its names).
#[derive(Clone, Debug)]
pub struct TraceRow {
    pub transaction_id: String,
    pub offset: Offset,
    pub group: String,
    pub event_type: String,
    pub data: String,
    pub worker_id: Option<String>,
    pub names: Vec<String>,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug)]
pub struct SegmentData {
    pub end_offset: Offset,
    pub created_at: Timestamp,
    pub blob: Arc<Vec<u8>>,
}

impl SegmentData {
    /// The messages of this segment, stored at `base`: at least one (a push stores no empty
    /// segment) and at most a push's batch, so anything else is a broken store.
    pub fn message_count(&self, base: Offset) -> u32 {
        let count = self.end_offset - base + 1;
        match u32::try_from(count) {
            Ok(n) if n >= 1 => n,
            _ => panic!(
                "segment at offset {base} ends at {}: {count} messages",
                self.end_offset
            ),
        }
    }
}

/// queen_streams.queries: one registered query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamQueryRow {
    pub name: String,
    pub source_queue: String,
    pub sink_queue: Option<String>,
    pub config_hash: String,
}

/// queen_streams.state: one row's value.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamStateRow {
    pub value: serde_json::Value,
    pub updated_at: Timestamp,
    /// A new one at every write (`stream_state_seq`, never reused).
    pub version: i64,
    /// The version the row's last ripe read saw (`core::streams::ripe_read_stamps`).
    pub ripe_read: Option<i64>,
}

/// (query id, partition id, key).
pub type StateKey = (uuid::Uuid, String, String);

#[derive(Clone, Debug)]
pub struct TxidRow {
    pub offset: Offset,
    pub message_id: uuid::Uuid,
}

#[derive(Clone, Debug)]
pub struct MetaRow {
    pub subscription_timestamp: Option<Timestamp>,
    pub created_at: Timestamp,
    /// The group's conflation policy, fixed at registration (`claim::policy_step`).
    pub conflation: bool,
}

#[derive(Clone, Debug)]
pub struct WatermarkRow {
    pub watermark: Timestamp,
    pub last_checked: Timestamp,
}

/// The cluster-wide maintenance lease (`queen.maintenance_leases`).
#[derive(Clone, Debug)]
pub struct MaintenanceLease {
    pub holder: String,
    pub until: Timestamp,
}

/// Messages retention removed, as a committed fact (for the simulation's checkers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedMessages {
    pub queue: String,
    pub partition: String,
    pub base_offset: Offset,
    pub end_offset: Offset,
    pub created_at: Timestamp,
    pub reason: queen_core::storage::Removal,
    /// The transactionIds of the removed messages.
    pub transaction_ids: Vec<String>,
    /// When the removal committed (set at commit).
    pub committed_at: Timestamp,
}

#[derive(Clone, Debug)]
pub struct DlqRow {
    pub partition_id: String,
    pub partition: String,
    pub group: String,
    pub offset: Offset,
    pub transaction_id: String,
    pub error: Option<String>,
    pub retry_count: u32,
    pub failed_at: Timestamp,
}

/// Partition id → (queue, partition name).
pub type PartitionKey = (String, String);

#[derive(Debug)]
pub struct DbState {
    pub queues: Table<String, QueueRow>,
    pub partitions: Table<PartitionKey, PartitionRow>,
    pub partition_ids: Table<String, PartitionKey>,
    /// Partition number → partition id.
    pub partition_numbers: Table<u64, String>,
    /// The last partition number handed out (a sequence: not rolled back, as in PostgreSQL).
    pub partition_seq: u64,
    pub segments: Table<(String, Offset), SegmentData>,
    pub txids: Table<(String, String), TxidRow>,
    pub consumers: Table<(String, String), CursorRow>,
    pub metadata: Table<(String, String), MetaRow>,
    pub watermarks: Table<(String, String), WatermarkRow>,
    pub dlq: Table<(String, u64), DlqRow>,
    pub dlq_seq: u64,
    pub maintenance: Table<String, MaintenanceLease>,
    /// queen.cluster_settings: name → value.
    pub cluster_settings: Table<String, Vec<u8>>,
    /// queen.message_traces: (partition id, trace id) → trace.
    pub traces: Table<(String, i64), TraceRow>,
    pub trace_seq: i64,
    /// queen.kv: (namespace, key) → row.
    pub kv: Table<(String, String), queen_core::kv::KvRow>,
    /// queen.kv_versions: the last version handed out (a sequence: not rolled back).
    pub kv_seq: i64,
    /// The last stream state row version handed out.
    pub stream_state_seq: i64,
    /// queen.timers: (queue, timer key) → pending timer.
    pub timers: Table<(String, String), queen_core::timers::TimerRow>,
    /// queen_streams.queries: id → query; its unique name index.
    pub stream_queries: Table<uuid::Uuid, StreamQueryRow>,
    pub stream_names: Table<String, uuid::Uuid>,
    /// queen_streams.state: (query id, partition id, key) → row.
    pub stream_state: Table<StateKey, StreamStateRow>,
    /// queen.worker_samples: (bucket, hostname, worker id) → sample. Not transactional: a
    /// sample is one broker's own write, never read back within a transaction.
    pub samples: BTreeMap<(Timestamp, String, String), queen_core::storage::WorkerSample>,
    /// queen.admin_totals: the admin totals' stored pass. Not transactional, as above.
    pub stored_totals: Option<queen_core::storage::StoredTotals>,
    /// queen.ephemeral_queues: name → declared options. Not transactional: each write is one
    /// row's upsert or delete, never part of a larger transaction.
    pub ephemeral_configs: BTreeMap<String, serde_json::Value>,
    /// queen.ephemeral_brokers: incarnation → its row; queen.ephemeral_owners: queue →
    /// incarnation. Not transactional, as above.
    pub ephemeral_brokers: BTreeMap<u64, EphemeralBrokerRow>,
    /// queue → (incarnation, epoch).
    pub ephemeral_owners: BTreeMap<String, (u64, i64)>,
    /// Committed removals, in commit order, when `record_removals` (a simulation's checkers
    /// read them; the embedded backend must not grow).
    pub removals: Vec<RemovedMessages>,
    pub record_removals: bool,
    /// Removals of open transactions, published at commit.
    removals_pending: BTreeMap<TxId, Vec<RemovedMessages>>,
    /// Committed dead-letter filings (and discards, on a queue without dead letters), in commit
    /// order, when `record_removals`: a simulation's checkers read them, and a requeue takes a
    /// filing out of the dead letters.
    pub dead_letterings: Vec<DlqRow>,
    /// Filings of open transactions, published at commit.
    dead_letterings_pending: BTreeMap<TxId, Vec<DlqRow>>,
    /// Committed timer firings per incarnation (message id), when `record_removals`: a
    /// simulation's checker holds each incarnation to one firing.
    pub firings: BTreeMap<uuid::Uuid, u32>,
    /// Firings of open transactions, counted at commit.
    firings_pending: BTreeMap<TxId, Vec<uuid::Uuid>>,
    /// Transaction-scoped advisory locks: key → holder.
    pub advisory: BTreeMap<i64, TxId>,
    pub advisory_held: BTreeMap<TxId, Vec<i64>>,
    /// For ORDER BY random() and id minting.
    pub rng: SeededRng,
    /// `pg_notify` calls of open transactions, delivered at commit.
    outbox: BTreeMap<TxId, Vec<DeliveryEvent>>,
    /// `SimBugs::no_release_notify`: the cursor trigger stays silent.
    pub no_release_notify: bool,
}

impl DbState {
    pub fn new(seed: u64) -> Self {
        DbState {
            queues: Table::default(),
            partitions: Table::default(),
            partition_ids: Table::default(),
            partition_numbers: Table::default(),
            partition_seq: 0,
            segments: Table::default(),
            txids: Table::default(),
            consumers: Table::default(),
            metadata: Table::default(),
            watermarks: Table::default(),
            dlq: Table::default(),
            dlq_seq: 0,
            maintenance: Table::default(),
            cluster_settings: Table::default(),
            traces: Table::default(),
            trace_seq: 0,
            kv: Table::default(),
            kv_seq: 0,
            stream_state_seq: 0,
            timers: Table::default(),
            stream_queries: Table::default(),
            stream_names: Table::default(),
            stream_state: Table::default(),
            samples: BTreeMap::new(),
            stored_totals: None,
            ephemeral_configs: BTreeMap::new(),
            ephemeral_brokers: BTreeMap::new(),
            ephemeral_owners: BTreeMap::new(),
            removals: Vec::new(),
            record_removals: false,
            dead_letterings: Vec::new(),
            dead_letterings_pending: BTreeMap::new(),
            removals_pending: BTreeMap::new(),
            firings: BTreeMap::new(),
            firings_pending: BTreeMap::new(),
            advisory: BTreeMap::new(),
            advisory_held: BTreeMap::new(),
            rng: SeededRng::new(seed).child("db"),
            outbox: BTreeMap::new(),
            no_release_notify: false,
        }
    }

    /// `pg_notify`: queued with the transaction, sent if it commits.
    pub fn notify(&mut self, tx: TxId, event: DeliveryEvent) {
        self.outbox.entry(tx).or_default().push(event);
    }

    /// Records messages a transaction removes; they become a fact if it commits.
    pub fn note_removal(&mut self, tx: TxId, removed: RemovedMessages) {
        if !self.record_removals {
            return;
        }
        self.removals_pending.entry(tx).or_default().push(removed);
    }

    /// Records a message a transaction files as a dead letter (or discards so); it becomes a
    /// fact if the transaction commits.
    pub fn note_dead_lettering(&mut self, tx: TxId, row: &DlqRow) {
        if !self.record_removals {
            return;
        }
        self.dead_letterings_pending
            .entry(tx)
            .or_default()
            .push(row.clone());
    }

    /// Records a timer incarnation a transaction fires; it counts if the transaction commits.
    pub fn note_firing(&mut self, tx: TxId, message_id: uuid::Uuid) {
        if !self.record_removals {
            return;
        }
        self.firings_pending.entry(tx).or_default().push(message_id);
    }

    /// The notifying triggers of migration 009, over the transaction's writes (the model's
    /// row triggers; PostgreSQL runs the same conditions per row):
    /// - a cursor whose lease ends or changes hands other than by a new claim (an ack, a nack, a
    ///   failed ack's retryDelay hold, a seek): `Released`, marked `batch_committed` when the
    ///   cursor reached the lease's batch end. A claim sets `lease_acquired_at` and is not
    ///   announced;
    /// - a cursor moved backwards (a seek) or deleted (a group delete): `GroupReset`;
    /// - a subscription record changed or deleted: `GroupReset`;
    /// - a queue row inserted, updated (configure) or deleted: `QueueChanged`.
    fn triggers(&self, tx: TxId) -> Vec<DeliveryEvent> {
        let mut sent = vec![];
        for ((pid, group), old, new) in self.consumers.changes(tx) {
            let Some(old) = old else { continue };
            // A deleted partition (its queue deleted) is no longer visible: nothing to name.
            let Some((queue, partition)) = self.partition_ids.get(pid, tx).cloned() else {
                continue;
            };
            let group = group.clone();
            match new {
                Some(new) => {
                    let released = old.worker_id.is_some()
                        && old.worker_id != new.worker_id
                        && new.lease_acquired_at.is_none();
                    if released && !self.no_release_notify {
                        sent.push(DeliveryEvent::Released {
                            queue: queue.clone(),
                            partition,
                            group: group.clone(),
                            batch_committed: old.batch_end.is_some_and(|e| new.committed >= e),
                        });
                    }
                    if new.committed < old.committed {
                        sent.push(DeliveryEvent::GroupReset {
                            queue: Some(queue),
                            group,
                        });
                    }
                }
                None => sent.push(DeliveryEvent::GroupReset {
                    queue: Some(queue),
                    group,
                }),
            }
        }
        for ((queue, group), old, new) in self.metadata.changes(tx) {
            let changed = match (old, new) {
                (Some(o), Some(n)) => o.subscription_timestamp != n.subscription_timestamp,
                (Some(_), None) => true,
                _ => false,
            };
            if changed {
                sent.push(DeliveryEvent::GroupReset {
                    queue: Some(queue.clone()),
                    group: group.clone(),
                });
            }
        }
        for (queue, _, _) in self.queues.changes(tx) {
            sent.push(DeliveryEvent::QueueChanged {
                queue: queue.clone(),
            });
        }
        sent
    }

    /// `pg_try_advisory_xact_lock`: never waits.
    pub fn try_advisory(&mut self, key: i64, tx: TxId) -> bool {
        match self.advisory.get(&key) {
            Some(holder) => *holder == tx,
            None => {
                self.advisory.insert(key, tx);
                self.advisory_held.entry(tx).or_default().push(key);
                true
            }
        }
    }

    /// `pg_advisory_xact_lock`: the holder, if this would wait.
    pub fn take_advisory(&mut self, key: i64, tx: TxId) -> Option<TxId> {
        match self.advisory.get(&key) {
            Some(holder) if *holder != tx => Some(*holder),
            _ => {
                self.try_advisory(key, tx);
                None
            }
        }
    }

    /// Ends a transaction; a commit answers the notifications it sends (each distinct one once,
    /// in order, as PostgreSQL folds identical notifications of one transaction).
    pub fn end(&mut self, tx: TxId, commit: bool, now: Timestamp) -> Vec<DeliveryEvent> {
        let mut sent = vec![];
        let removed = self.removals_pending.remove(&tx).unwrap_or_default();
        let fired = self.firings_pending.remove(&tx).unwrap_or_default();
        let filed = self.dead_letterings_pending.remove(&tx).unwrap_or_default();
        if commit {
            self.dead_letterings.extend(filed);
            for id in fired {
                *self.firings.entry(id).or_default() += 1;
            }
            self.removals
                .extend(removed.into_iter().map(|r| RemovedMessages {
                    committed_at: now,
                    ..r
                }));
            let explicit = self.outbox.remove(&tx).unwrap_or_default();
            for e in explicit.into_iter().chain(self.triggers(tx)) {
                if !sent.contains(&e) {
                    sent.push(e);
                }
            }
        } else {
            self.outbox.remove(&tx);
        }
        macro_rules! each_table {
            ($($t:ident),*) => { $( if commit { self.$t.commit(tx) } else { self.$t.rollback(tx) } )* };
        }
        each_table!(
            queues,
            partitions,
            partition_ids,
            partition_numbers,
            segments,
            txids,
            consumers,
            metadata,
            watermarks,
            dlq,
            maintenance,
            cluster_settings,
            traces,
            kv,
            timers,
            stream_queries,
            stream_names,
            stream_state
        );
        for key in self.advisory_held.remove(&tx).unwrap_or_default() {
            self.advisory.remove(&key);
        }
        sent
    }

    /// A queue's partitions visible to `tx`, in name order: (name, row).
    pub fn partitions_of<'a>(
        &'a self,
        queue: &'a str,
        tx: TxId,
    ) -> impl Iterator<Item = (&'a str, &'a PartitionRow)> + 'a {
        self.partitions
            .range((queue.to_string(), String::new()).., tx)
            .take_while(move |((q, _), _)| q == queue)
            .map(|((_, n), p)| (n.as_str(), p))
    }

    /// The partition id an ack names, by its id or by its number (a framed pop's `partitionId`).
    pub fn partition_by_ref(&self, reference: &str, tx: TxId) -> Option<String> {
        match queen_core::storage::partition_number(reference) {
            Some(n) => self.partition_numbers.get(&n, tx).cloned(),
            None => Some(reference.to_string()),
        }
    }

    pub fn mint_uuid(&mut self, now: Timestamp) -> uuid::Uuid {
        let mut bytes = [0u8; 10];
        self.rng.fill(&mut bytes);
        uuid::Builder::from_unix_timestamp_millis(
            u64::try_from(now.as_millis()).unwrap_or(0),
            &bytes,
        )
        .into_uuid()
    }
}

/// `hashtextextended(partition_id || '/' || group, seed)` stand-in: any stable 64-bit hash will
/// do for the model, collisions included (they false-skip, harmlessly).
pub fn advisory_key(partition_id: &str, group: &str, seed: u64) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in partition_id
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(group.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// A row of queen.ephemeral_brokers.
#[derive(Clone, Debug)]
pub struct EphemeralBrokerRow {
    pub address: String,
    /// Alive while this is ahead.
    pub alive_until: Timestamp,
    /// Since when it has been alive without a break.
    pub alive_since: Timestamp,
}
