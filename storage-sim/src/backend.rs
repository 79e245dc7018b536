//! The model's answers to the storage traits, one impl per capability. In free-run mode each call
//! runs its transaction serially (the embedded backend); in interleaved mode concurrently, under
//! the seeded scheduler.

use async_trait::async_trait;
use queen_core::storage::{
    AckItem, AckOutcome, AdminStorage, ConfiguredQueue, DeadLetterPage, DeliveryStorage, DlqQuery,
    GroupDeleted, HealthStorage, LeaseBatchEnds, MessageStorage, PopRequest, PopResult, PopStorage,
    PushGroup, PushGroupResult, QueueConfig, RenewOutcome, Requeued, RetentionBatch, RetentionMark,
    RetentionPass, RetentionStorage, SeekTarget, StorageHealth, StorageResult, StorageUsage, TxOp,
    TxOutcome,
};
use queen_core::storage::{
    CreatedCount, InspectStorage, PartitionView, QueueFilter, QueueView, SegmentQuery,
    StoredMessage, StoredSegment, TraceInput, TraceName, TraceRecord, WorkerSample,
};
use queen_core::Timestamp;

use crate::tx::lock;
use crate::{
    delivery, inspect, kv, messages, pop, queues, reads, retention, streams, timers, SimDb,
};

#[async_trait]
impl PopStorage for SimDb {
    async fn queue_config(&self, queue: &str) -> StorageResult<Option<QueueConfig>> {
        Ok(lock(&self.shared.state)
            .queues
            .get(&queue.to_string(), 0)
            .map(|q| q.config.clone()))
    }

    async fn pop_partition(&self, req: PopRequest, partition: String) -> StorageResult<PopResult> {
        self.exec(pop::pop_partition(
            self.shared.clone(),
            self.cell(),
            req,
            partition,
        ))
        .await
    }

    async fn pop_list(&self, req: PopRequest, candidates: Vec<String>) -> StorageResult<PopResult> {
        self.exec(pop::pop_list(
            self.shared.clone(),
            self.cell(),
            req,
            candidates,
        ))
        .await
    }

    async fn pop_wildcard(&self, req: PopRequest) -> StorageResult<PopResult> {
        self.exec(pop::pop_wildcard(self.shared.clone(), self.cell(), req))
            .await
    }

    async fn queues_matching(
        &self,
        namespace: Option<String>,
        task: Option<String>,
    ) -> StorageResult<Vec<String>> {
        let st = lock(&self.shared.state);
        let mut matching: Vec<(i32, String)> = st
            .queues
            .iter(0)
            .filter(|(_, q)| {
                namespace.as_ref().is_none_or(|n| &q.config.namespace == n)
                    && task.as_ref().is_none_or(|t| &q.config.task == t)
            })
            .map(|(name, q)| (q.config.priority, name.clone()))
            .collect();
        // A discovery pop tries them in this order: higher priority first, then by name.
        matching.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        Ok(matching.into_iter().map(|(_, name)| name).collect())
    }

    async fn next_pending(
        &self,
        queues: &[String],
        group: &str,
    ) -> StorageResult<Option<Timestamp>> {
        self.pause_point().await;
        let now = self.now();
        let next = pop::next_pending(
            &lock(&self.shared.state),
            queues,
            group,
            now,
            0,
            self.shared.bugs,
        );
        self.pause_point().await;
        Ok(next)
    }

    async fn pending_partitions(
        &self,
        queue: &str,
        group: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        // A snapshot read: in interleaved mode other transactions may commit between the read
        // and the answer's arrival (the hot-list reseed race).
        self.pause_point().await;
        let names = pop::pending_partitions(
            &lock(&self.shared.state),
            queue,
            group,
            after,
            limit,
            0,
            self.shared.bugs,
        );
        self.pause_point().await;
        Ok(names)
    }

    async fn partition_numbers(&self, partition_ids: &[String]) -> StorageResult<Vec<Option<u64>>> {
        self.pause_point().await;
        let st = lock(&self.shared.state);
        Ok(partition_ids
            .iter()
            .map(|id| {
                let key = st.partition_ids.get(id, 0)?;
                st.partitions.get(key, 0).map(|p| p.number)
            })
            .collect())
    }
}

#[async_trait]
impl MessageStorage for SimDb {
    async fn push_accepted_at(
        &self,
        groups: Vec<PushGroup>,
        accepted_at: Option<Timestamp>,
    ) -> StorageResult<Vec<PushGroupResult>> {
        self.exec(messages::push(
            self.shared.clone(),
            self.cell(),
            groups,
            accepted_at,
        ))
        .await
    }

    async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
        self.exec(messages::ack(
            self.shared.clone(),
            self.cell(),
            group.to_string(),
            items,
        ))
        .await
    }

    async fn ack_batch_ends_many(
        &self,
        leases: &[LeaseBatchEnds],
    ) -> StorageResult<Vec<Vec<String>>> {
        self.exec(messages::ack_batch_ends(
            self.shared.clone(),
            self.cell(),
            leases.to_vec(),
        ))
        .await
    }

    async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome> {
        self.exec(messages::renew(
            self.shared.clone(),
            self.cell(),
            lease_id.to_string(),
            seconds,
        ))
        .await
    }
}

#[async_trait]
impl AdminStorage for SimDb {
    async fn configure_queue(&self, config: QueueConfig) -> StorageResult<ConfiguredQueue> {
        self.exec(queues::configure(self.shared.clone(), self.cell(), config))
            .await
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        self.exec(queues::delete_queue(
            self.shared.clone(),
            self.cell(),
            queue.to_string(),
        ))
        .await
    }

    async fn seek_group(&self, group: &str, queue: &str, target: SeekTarget) -> StorageResult<u32> {
        self.exec(delivery::seek_group(
            self.shared.clone(),
            self.cell(),
            group.into(),
            queue.into(),
            target,
        ))
        .await
    }

    async fn delete_group(
        &self,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> StorageResult<GroupDeleted> {
        self.exec(delivery::delete_group(
            self.shared.clone(),
            self.cell(),
            group.into(),
            queue.map(str::to_string),
            delete_metadata,
        ))
        .await
    }

    async fn update_subscription(&self, group: &str, timestamp: Timestamp) -> StorageResult<u32> {
        self.exec(delivery::update_subscription(
            self.shared.clone(),
            self.cell(),
            group.into(),
            timestamp,
        ))
        .await
    }

    async fn cluster_setting(
        &self,
        name: &str,
        proposed: Option<Vec<u8>>,
    ) -> StorageResult<Option<Vec<u8>>> {
        self.exec(delivery::cluster_setting(
            self.shared.clone(),
            self.cell(),
            name.into(),
            proposed,
        ))
        .await
    }
}

#[async_trait]
impl DeliveryStorage for SimDb {
    async fn transaction(&self, ops: Vec<TxOp>) -> StorageResult<TxOutcome> {
        self.exec(delivery::transaction(self.shared.clone(), self.cell(), ops))
            .await
    }

    async fn dead_letters(&self, query: DlqQuery) -> StorageResult<DeadLetterPage> {
        Ok(delivery::dead_letters(&lock(&self.shared.state), &query))
    }

    async fn requeue_dead_letter(
        &self,
        id: i64,
        new_message_id: uuid::Uuid,
    ) -> StorageResult<Option<Requeued>> {
        self.exec(delivery::requeue_dead_letter(
            self.shared.clone(),
            self.cell(),
            id,
            new_message_id,
        ))
        .await
    }
}

#[async_trait]
impl RetentionStorage for SimDb {
    async fn claim_maintenance(
        &self,
        name: &str,
        holder: &str,
        seconds: u32,
    ) -> StorageResult<bool> {
        self.exec(retention::claim_maintenance(
            self.shared.clone(),
            self.cell(),
            name.into(),
            holder.into(),
            seconds,
        ))
        .await
    }

    async fn release_maintenance(&self, name: &str, holder: &str) -> StorageResult<()> {
        self.exec(retention::release_maintenance(
            self.shared.clone(),
            self.cell(),
            name.into(),
            holder.into(),
        ))
        .await
    }

    async fn retention_queues(&self, pass: RetentionPass) -> StorageResult<Vec<String>> {
        self.pause_point().await;
        Ok(retention::retention_queues(&lock(&self.shared.state), pass))
    }

    async fn retention_batch(
        &self,
        queue: &str,
        pass: RetentionPass,
        after: Option<RetentionMark>,
        limit: u32,
    ) -> StorageResult<RetentionBatch> {
        self.exec(retention::retention_batch(
            self.shared.clone(),
            self.cell(),
            queue.into(),
            pass,
            after,
            limit,
        ))
        .await
    }

    async fn remove_inactive_partitions(
        &self,
        inactive_secs: u64,
        limit: u32,
    ) -> StorageResult<u64> {
        self.exec(retention::remove_inactive_partitions(
            self.shared.clone(),
            self.cell(),
            inactive_secs,
            limit,
        ))
        .await
    }

    async fn remove_old_dead_letters(
        &self,
        older_than_secs: u64,
        limit: u32,
    ) -> StorageResult<u64> {
        self.exec(retention::remove_old_dead_letters(
            self.shared.clone(),
            self.cell(),
            older_than_secs,
            limit,
        ))
        .await
    }
}

#[async_trait]
impl HealthStorage for SimDb {
    async fn health(&self) -> StorageHealth {
        StorageHealth {
            reachable: true,
            database: "in-memory",
        }
    }

    fn usage(&self) -> StorageUsage {
        StorageUsage {
            backend: "memory",
            pool_in_use: 0,
            pool_size: 0,
        }
    }
}

#[async_trait]
impl InspectStorage for SimDb {
    async fn queue_views(&self, filter: QueueFilter) -> StorageResult<Vec<QueueView>> {
        Ok(inspect::queue_views(&lock(&self.shared.state), &filter))
    }

    async fn partition_views_page(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: u32,
        group: Option<&str>,
    ) -> StorageResult<Vec<PartitionView>> {
        let now = self.now();
        Ok(inspect::partition_views_page(
            &lock(&self.shared.state),
            queue,
            after,
            limit,
            group,
            now,
        ))
    }

    async fn messages_created(
        &self,
        from: Timestamp,
        to: Timestamp,
        width_secs: i64,
        queue: Option<&str>,
    ) -> StorageResult<Vec<CreatedCount>> {
        Ok(inspect::messages_created(
            &lock(&self.shared.state),
            from,
            to,
            width_secs,
            queue,
        ))
    }

    async fn partition_views_by_id(&self, ids: &[String]) -> StorageResult<Vec<PartitionView>> {
        let now = self.now();
        Ok(inspect::partition_views_by_id(
            &lock(&self.shared.state),
            ids,
            now,
        ))
    }

    async fn segments(&self, query: SegmentQuery) -> StorageResult<Vec<StoredSegment>> {
        Ok(inspect::segments(&lock(&self.shared.state), &query))
    }

    async fn message(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<Option<StoredMessage>> {
        let now = self.now();
        inspect::message(&lock(&self.shared.state), partition_id, transaction_id, now)
    }

    async fn delete_dead_letters_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<u64> {
        self.exec(inspect::delete_dead_letters_of(
            self.shared.clone(),
            self.cell(),
            partition_id.into(),
            transaction_id.into(),
        ))
        .await
    }

    async fn add_trace(&self, trace: TraceInput) -> StorageResult<Option<i64>> {
        self.exec(inspect::add_trace(self.shared.clone(), self.cell(), trace))
            .await
    }

    async fn traces_of(
        &self,
        partition_id: &str,
        transaction_id: &str,
    ) -> StorageResult<Vec<TraceRecord>> {
        inspect::traces_of(&lock(&self.shared.state), partition_id, transaction_id)
    }

    async fn traces_named(
        &self,
        name: &str,
        limit: u32,
        offset: u32,
    ) -> StorageResult<(Vec<TraceRecord>, u64)> {
        Ok(inspect::traces_named(
            &lock(&self.shared.state),
            name,
            limit,
            offset,
        ))
    }

    async fn trace_names(&self, limit: u32, offset: u32) -> StorageResult<(Vec<TraceName>, u64)> {
        Ok(inspect::trace_names(
            &lock(&self.shared.state),
            limit,
            offset,
        ))
    }

    async fn record_sample(&self, sample: WorkerSample) -> StorageResult<()> {
        inspect::record_sample(&mut lock(&self.shared.state), sample);
        Ok(())
    }

    async fn samples(&self, from: Timestamp, to: Timestamp) -> StorageResult<Vec<WorkerSample>> {
        Ok(inspect::samples(&lock(&self.shared.state), from, to))
    }

    async fn remove_samples_before(&self, before: Timestamp) -> StorageResult<u64> {
        Ok(inspect::remove_samples_before(
            &mut lock(&self.shared.state),
            before,
        ))
    }

    async fn store_totals(&self, totals: &queen_core::storage::StoredTotals) -> StorageResult<()> {
        inspect::store_totals(&mut lock(&self.shared.state), totals);
        Ok(())
    }

    async fn stored_totals(
        &self,
        newer_than: Option<Timestamp>,
    ) -> StorageResult<Option<queen_core::storage::StoredTotals>> {
        Ok(inspect::stored_totals(
            &lock(&self.shared.state),
            newer_than,
        ))
    }
}

#[async_trait]
impl queen_core::storage::KvStorage for SimDb {
    async fn kv_batch(
        &self,
        ops: Vec<queen_core::kv::KvOp>,
    ) -> StorageResult<queen_core::kv::KvBatch> {
        self.exec(kv::kv_batch(
            self.shared.clone(),
            self.cell(),
            ops,
            queen_core::kv::KvLimits::default(),
        ))
        .await
    }

    async fn lock_op(
        &self,
        op: queen_core::locks::LockOp,
        minted_owner: String,
    ) -> StorageResult<serde_json::Value> {
        self.exec(kv::lock_op(
            self.shared.clone(),
            self.cell(),
            op,
            minted_owner,
        ))
        .await
    }

    async fn sweep_expired_kv(&self, limit: u32) -> StorageResult<u64> {
        self.exec(kv::sweep_expired(self.shared.clone(), self.cell(), limit))
            .await
    }
}

#[async_trait]
impl queen_core::storage::TimerStorage for SimDb {
    async fn timers_batch(
        &self,
        ops: Vec<queen_core::timers::TimerOp>,
    ) -> StorageResult<Vec<serde_json::Value>> {
        self.exec(timers::batch(self.shared.clone(), self.cell(), ops))
            .await
    }

    async fn timer_peek(
        &self,
        queue: &str,
        key: &str,
    ) -> StorageResult<Option<queen_core::timers::TimerRow>> {
        Ok(timers::peek(&lock(&self.shared.state), queue, key))
    }

    async fn timer_page(
        &self,
        queue: &str,
        after: Option<String>,
        limit: u32,
    ) -> StorageResult<Vec<(String, queen_core::timers::TimerRow)>> {
        Ok(timers::page(
            &lock(&self.shared.state),
            queue,
            after.as_deref(),
            limit,
        ))
    }

    async fn due_timers(
        &self,
        limit: u32,
        skip_queues: &[String],
    ) -> StorageResult<Vec<queen_core::timers::DueTimer>> {
        let now = (self.shared.clock)();
        Ok(timers::due(
            &lock(&self.shared.state),
            now,
            limit,
            skip_queues,
        ))
    }

    async fn next_timer_due(&self, skip_queues: &[String]) -> StorageResult<Option<Timestamp>> {
        Ok(timers::next_due(&lock(&self.shared.state), skip_queues))
    }
}

#[async_trait]
impl queen_core::storage::StreamStorage for SimDb {
    async fn register_stream_query(
        &self,
        req: &queen_core::streams::QueryRegistration,
        minted_id: uuid::Uuid,
    ) -> StorageResult<queen_core::streams::Registration> {
        self.exec(streams::register(
            self.shared.clone(),
            self.cell(),
            req.clone(),
            minted_id,
        ))
        .await
    }

    async fn stream_state(
        &self,
        query: &queen_core::streams::StateQuery,
    ) -> StorageResult<Option<Vec<queen_core::streams::StateRow>>> {
        if queen_core::streams::ripe_read_stamps(query) {
            return self
                .exec(streams::ripe_read(
                    self.shared.clone(),
                    self.cell(),
                    query.clone(),
                ))
                .await;
        }
        Ok(streams::state(&lock(&self.shared.state), query))
    }
}

#[async_trait]
impl queen_core::storage::ReadStorage for SimDb {
    async fn read_partition(
        &self,
        queue: &str,
        partition: &str,
        offset: queen_core::Offset,
        byte_hint: u64,
    ) -> StorageResult<queen_core::storage::PartitionRead> {
        let st = lock(&self.shared.state);
        let read = |view| {
            reads::read_partition(
                &st,
                queue,
                partition,
                offset,
                byte_hint,
                self.shared.bugs.fetch_from_segment_base,
                view,
            )
        };
        if !self.shared.bugs.fetch_reads_in_flight {
            return Ok(read(0));
        }
        // SimBugs::fetch_reads_in_flight: a dirty read, through the view of the open transaction
        // that has written the most of the partition.
        let views: Vec<u64> = lock(&self.shared.active).keys().copied().collect();
        Ok(views
            .into_iter()
            .map(read)
            .chain([read(0)])
            .max_by_key(|r| match r {
                queen_core::storage::PartitionRead::Found { range, .. } => range.high_watermark,
                _ => i64::MIN,
            })
            .unwrap_or(queen_core::storage::PartitionRead::Unknown))
    }

    async fn changed_partitions(
        &self,
        query: &queen_core::reads::ChangedQuery,
    ) -> StorageResult<queen_core::reads::ChangedPage> {
        // The open transactions first, then the state: one that commits in between is read.
        let sampled_at = (self.shared.clock)();
        let oldest_open = lock(&self.shared.started).values().min().copied();
        Ok(reads::changed(
            &lock(&self.shared.state),
            query,
            sampled_at,
            oldest_open,
        ))
    }
}

#[async_trait]
impl queen_core::storage::EphemeralConfigStorage for SimDb {
    async fn ephemeral_config(&self, queue: &str) -> StorageResult<Option<serde_json::Value>> {
        Ok(lock(&self.shared.state)
            .ephemeral_configs
            .get(queue)
            .cloned())
    }

    async fn ephemeral_configs(&self) -> StorageResult<Vec<(String, serde_json::Value)>> {
        Ok(lock(&self.shared.state)
            .ephemeral_configs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn save_ephemeral_config(
        &self,
        queue: &str,
        options: &serde_json::Value,
    ) -> StorageResult<()> {
        lock(&self.shared.state)
            .ephemeral_configs
            .insert(queue.to_string(), options.clone());
        Ok(())
    }

    async fn remove_ephemeral_config(&self, queue: &str) -> StorageResult<bool> {
        Ok(lock(&self.shared.state)
            .ephemeral_configs
            .remove(queue)
            .is_some())
    }
}

#[async_trait]
impl queen_core::storage::EphemeralOwnerStorage for SimDb {
    async fn ephemeral_heartbeat(
        &self,
        incarnation: u64,
        address: &str,
        alive_ms: u64,
    ) -> StorageResult<()> {
        let now = (self.shared.clock)();
        let until = Timestamp(now.0.saturating_add(alive_ms as i64 * 1000));
        let mut state = lock(&self.shared.state);
        // A row that ran out starts its unbroken span again.
        let since = match state.ephemeral_brokers.get(&incarnation) {
            Some(row) if row.alive_until > now => row.alive_since,
            _ => now,
        };
        state.ephemeral_brokers.insert(
            incarnation,
            crate::state::EphemeralBrokerRow {
                address: address.to_string(),
                alive_until: until,
                alive_since: since,
            },
        );
        Ok(())
    }

    async fn ephemeral_claim(
        &self,
        queue: &str,
        incarnation: u64,
        takeover_after_ms: u64,
    ) -> StorageResult<queen_core::storage::EphemeralClaim> {
        let now = (self.shared.clock)();
        let mut state = lock(&self.shared.state);
        let row = |s: &crate::state::DbState, inc: &u64| s.ephemeral_brokers.get(inc).cloned();
        let settled_since = Timestamp(now.0.saturating_sub(takeover_after_ms as i64 * 1000));
        let may_take_over = takeover_after_ms == 0
            || row(&state, &incarnation).is_some_and(|me| me.alive_since <= settled_since);
        let (owner, epoch) = match state.ephemeral_owners.get(queue) {
            None => (incarnation, 1),
            Some((inc, epoch)) => match row(&state, inc) {
                Some(r) if r.alive_until > now => (*inc, *epoch),
                // Its liveness ran out: taken by a settled claimer, or by itself.
                Some(_) if *inc != incarnation && !may_take_over => (*inc, *epoch),
                _ => (incarnation, epoch + 1),
            },
        };
        state
            .ephemeral_owners
            .insert(queue.to_string(), (owner, epoch));
        let address = state
            .ephemeral_brokers
            .get(&owner)
            .map(|r| &r.address)
            .ok_or_else(|| {
                queen_core::storage::StorageError::Unavailable(format!(
                    "ephemeral: {queue}'s owner has no broker row (it left): try again"
                ))
            })?;
        Ok(queen_core::storage::EphemeralClaim {
            owner: queen_core::storage::EphemeralBroker {
                incarnation: owner,
                address: address.clone(),
            },
            epoch,
        })
    }

    async fn ephemeral_brokers(&self) -> StorageResult<Vec<queen_core::storage::EphemeralBroker>> {
        let now = (self.shared.clock)();
        Ok(lock(&self.shared.state)
            .ephemeral_brokers
            .iter()
            .filter(|(_, row)| row.alive_until > now)
            .map(|(inc, row)| queen_core::storage::EphemeralBroker {
                incarnation: *inc,
                address: row.address.clone(),
            })
            .collect())
    }

    async fn ephemeral_leave(&self, incarnation: u64) -> StorageResult<()> {
        lock(&self.shared.state)
            .ephemeral_brokers
            .remove(&incarnation);
        Ok(())
    }
}
