//! What the broker does for each request, apart from HTTP: the storage call, then its effects (the
//! deliverability events it publishes, the metrics it counts). Routes parse, call one of these and
//! render; the pop has its own driver (`routes/pop.rs`, around `queen_core::pop::PopMachine`),
//! whose storage calls go through `Broker::pop_storage_call`. Writes that deliver nothing (KV,
//! locks, timers, traces, declarations) are in `records`. Reads go through `views`.

mod records;

use std::sync::atomic::Ordering;

use queen_core::events::DeliveryEvent;
use queen_core::ledger::WholeBatches;
use queen_core::pop::{StorageCommand, StorageReply};
use queen_core::storage::{
    AckItem, AckOutcome, ConfiguredQueue, DeadLetterPage, DlqQuery, GroupDeleted, LeaseBatchEnds,
    PushGroup, PushGroupResult, PushOutcome, QueueConfig, RenewOutcome, Requeued, SeekTarget,
    StorageError, StorageResult, TxOp, TxOpResult, TxOutcome,
};
use queen_core::{Timestamp, WorkerId};

use crate::broker::{Broker, CrashPoint};
use crate::helpers::lock;

impl Broker {
    /// A storage call of a pop's machine (`queen_core::pop::execute`), for its driver.
    pub(crate) async fn pop_storage_call(
        &self,
        command: StorageCommand,
    ) -> StorageResult<StorageReply> {
        queen_core::pop::execute(&*self.storage.pops, command).await
    }

    /// Stores a push request's groups in one transaction; the partitions that queued anything
    /// are published. With a file buffer, a push goes to the buffer instead while push
    /// maintenance mode is on or earlier pushes wait there (so none overtakes them), and when
    /// storage is unreachable.
    /// `producer`: the authenticated caller's identity, stamped on every message (whatever the
    /// request said).
    pub async fn push(
        &self,
        mut groups: Vec<PushGroup>,
        producer: Option<&str>,
    ) -> StorageResult<Pushed> {
        stamp_producer(&mut groups, producer);
        if let Some(buffer) = &self.config.file_buffer {
            if self.push_maintenance.load(Ordering::SeqCst) || buffer.pending() > 0 {
                return self.buffer_push(groups).await;
            }
            // Kept for the buffer in case storage turns out to be away.
            let copy = groups.clone();
            return match self.store_push(groups, None).await {
                Err(e) if e.is_unavailable() => {
                    self.note_storage_error("push", &e);
                    tracing::debug!("storage unavailable: the push goes to the file buffer");
                    self.buffer_push(copy).await
                }
                other => other.map(Pushed::Stored),
            };
        }
        self.store_push(groups, None).await.map(Pushed::Stored)
    }

    async fn buffer_push(&self, mut groups: Vec<PushGroup>) -> StorageResult<Pushed> {
        let Some(buffer) = self.config.file_buffer.clone() else {
            return Err(StorageError::Internal("no file buffer".into()));
        };
        // Queues known to encrypt are sealed before the file; the drain seals any other that
        // turns out to (store_push).
        self.seal_known(&mut groups)?;
        let accepted_at = self.now();
        let written = tokio::task::spawn_blocking(move || {
            buffer.append(accepted_at, &groups)?;
            Ok::<_, std::io::Error>(groups)
        })
        .await
        .map_err(|e| StorageError::Internal(format!("file buffer task: {e}")))?
        .map_err(|e| StorageError::Unavailable(format!("the file buffer refused the push: {e}")))?;
        self.metrics.pushes_buffered.inc();
        self.drain_wake.notify_one();
        Ok(Pushed::Buffered(written))
    }

    /// The storage half of a push: one transaction, then the events and counters. A queue
    /// storage says must encrypt is learned, and the push sealed and sent again.
    async fn store_push(
        &self,
        mut groups: Vec<PushGroup>,
        accepted_at: Option<Timestamp>,
    ) -> StorageResult<Vec<PushGroupResult>> {
        let targets: Vec<(String, String)> = groups
            .iter()
            .map(|g| (g.queue.clone(), g.partition.clone()))
            .collect();
        self.seal_known(&mut groups)?;
        let started = self.now();
        let outcomes = loop {
            let again = self.may_need_sealing(&groups).then(|| groups.clone());
            let stored = match (&self.push_rounds, accepted_at) {
                // A replay keeps its accepted time: alone.
                (Some(rounds), None) => rounds.call(groups).await,
                _ => {
                    self.storage
                        .messages
                        .push_accepted_at(groups, accepted_at)
                        .await
                }
            };
            match stored {
                Err(StorageError::EncryptionRequired { queue }) if again.is_some() => {
                    groups = self.learned_encrypted(queue, again)?;
                }
                other => break other?,
            }
        };
        self.metrics
            .record_storage("push", started.micros_until(self.now()));
        self.metrics.pushes.inc();
        for o in outcomes.iter().flatten() {
            let counter = match o {
                PushOutcome::Queued { .. } => &self.metrics.messages_pushed,
                PushOutcome::Duplicate { .. } => &self.metrics.duplicates,
                PushOutcome::Rejected { .. } => continue,
            };
            counter.inc();
        }
        self.crash_point(CrashPoint::PushStored).await;
        self.publish_all(&pushed_events(&targets, &outcomes));
        Ok(outcomes)
    }

    /// Acknowledges a client's items of one group; the leases they ended are published.
    pub async fn ack(&self, group: &str, items: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
        let whole = lock(&self.delivered).take_whole(group, &items);
        let outcomes = match whole {
            Some(whole) => self.ack_whole_batches(group, items, whole).await?,
            None => self.ack_and_publish(group, items).await?,
        };
        self.crash_point(CrashPoint::AckStored).await;
        self.metrics.ack_requests.inc();
        for o in &outcomes {
            self.metrics.acks.inc();
            if !o.success {
                self.metrics.acks_refused.inc();
            }
            if o.dlq {
                self.metrics.dead_lettered.inc();
            }
        }
        Ok(outcomes)
    }

    /// Gives back the leases of a batch whose client left before the answer (retry acks, which
    /// charge no retry budget). Not a client's ack: the ack metrics do not count it.
    pub async fn release_undelivered(
        &self,
        group: &str,
        items: Vec<AckItem>,
    ) -> StorageResult<Vec<AckOutcome>> {
        self.ack_and_publish(group, items).await
    }

    /// An ack of whole delivered batches (the ledger matched it): one guarded cursor write per
    /// batch. Its outcomes are what acking each message would answer: every item succeeds and the
    /// last of each batch ends the lease. A batch storage did not commit (its lease moved on, or
    /// retention took it) is acked item by item, which answers for each.
    async fn ack_whole_batches(
        &self,
        group: &str,
        items: Vec<AckItem>,
        whole: WholeBatches,
    ) -> StorageResult<Vec<AckOutcome>> {
        let Ok(lease) = uuid::Uuid::try_parse(&whole.lease_id) else {
            return self.ack_and_publish(group, items).await;
        };
        let started = self.now();
        let committed = self
            .ack_rounds
            .call(LeaseBatchEnds {
                group: group.to_string(),
                lease: WorkerId(lease),
                batches: whole.ends(),
            })
            .await?;
        self.metrics
            .record_storage("ack", started.micros_until(self.now()));
        let mut outcomes: Vec<Option<AckOutcome>> = vec![None; items.len()];
        let mut rest: Vec<usize> = vec![];
        for (batch, range) in &whole.runs {
            if committed.contains(&batch.partition_id) {
                self.metrics.whole_batch_acks.inc();
                for i in range.clone() {
                    outcomes[i] = Some(AckOutcome {
                        success: true,
                        error: None,
                        queue: Some(batch.queue.clone()),
                        partition: Some(batch.partition.clone()),
                        lease_released: i + 1 == range.end,
                        dlq: false,
                        noop: false,
                    });
                }
            } else {
                rest.extend(range.clone());
            }
        }
        let done: Vec<&AckOutcome> = outcomes.iter().flatten().collect();
        // Each of these committed its batch through the lease's end.
        self.publish_all(&released_events(done.into_iter().map(|o| (group, o)), true));
        if !rest.is_empty() {
            let again = rest.iter().map(|&i| items[i].clone()).collect();
            let answered = self.ack_and_publish(group, again).await?;
            if answered.len() != rest.len() {
                return Err(StorageError::Internal(format!(
                    "ack answered {} outcomes for {} items",
                    answered.len(),
                    rest.len()
                )));
            }
            for (i, o) in rest.into_iter().zip(answered) {
                outcomes[i] = Some(o);
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| StorageError::Internal("an ack item got no outcome".into())))
            .collect()
    }

    async fn ack_and_publish(
        &self,
        group: &str,
        items: Vec<AckItem>,
    ) -> StorageResult<Vec<AckOutcome>> {
        let started = self.now();
        let outcomes = self.storage.messages.ack(group, items).await?;
        self.metrics
            .record_storage("ack", started.micros_until(self.now()));
        // Item by item, a release may leave some of its batch behind (a nack, a partial ack).
        self.publish_all(&released_events(outcomes.iter().map(|o| (group, o)), false));
        Ok(outcomes)
    }

    pub async fn renew_lease(&self, lease_id: &str, seconds: u32) -> StorageResult<RenewOutcome> {
        self.storage.messages.renew_lease(lease_id, seconds).await
    }

    /// Runs a transaction; when it commits, what its operations queued and released is published.
    /// A transaction that pushes waits while pushes sit in the file buffer (503): stored now, it
    /// would overtake them.
    pub async fn transaction(
        &self,
        mut ops: Vec<TxOp>,
        producer: Option<&str>,
    ) -> StorageResult<TxOutcome> {
        let pushes = ops.iter().any(|op| matches!(op, TxOp::Push(_)));
        if pushes
            && self
                .config
                .file_buffer
                .as_ref()
                .is_some_and(|b| b.pending() > 0 || self.push_maintenance.load(Ordering::SeqCst))
        {
            return Err(StorageError::Unavailable(
                "buffered pushes are waiting to be stored: retry the transaction".into(),
            ));
        }
        // What each operation touches, kept aside: the operations move into storage.
        let touched: Vec<Touched> = ops
            .iter()
            .map(|op| match op {
                TxOp::Push(groups) => Touched::Partitions(
                    groups
                        .iter()
                        .map(|g| (g.queue.clone(), g.partition.clone()))
                        .collect(),
                ),
                TxOp::Ack { group, .. } | TxOp::EndLease { group, .. } => {
                    Touched::Group(group.clone())
                }
                TxOp::Kv(_) | TxOp::Timer(_) | TxOp::FireTimer { .. } | TxOp::Stream(_) => {
                    Touched::Nothing
                }
            })
            .collect();
        for op in &mut ops {
            if let TxOp::Push(groups) = op {
                stamp_producer(groups, producer);
            }
        }
        self.seal_known_ops(&mut ops)?;
        let out = loop {
            let pushed = ops.iter().flat_map(|op| match op {
                TxOp::Push(g) => g.as_slice(),
                TxOp::Ack { .. }
                | TxOp::EndLease { .. }
                | TxOp::Kv(_)
                | TxOp::Timer(_)
                | TxOp::FireTimer { .. }
                | TxOp::Stream(_) => &[],
            });
            let again = self.may_need_sealing(pushed).then(|| ops.clone());
            match self.storage.delivery.transaction(ops).await {
                Err(StorageError::EncryptionRequired { queue }) if again.is_some() => {
                    self.learned_encrypted(queue, None)?;
                    ops = again.unwrap_or_default();
                    self.seal_known_ops(&mut ops)?;
                }
                other => break other?,
            }
        };
        self.crash_point(CrashPoint::TransactionStored).await;
        if out.committed
            && out
                .results
                .iter()
                .any(|r| matches!(r, TxOpResult::Timer(_)))
        {
            self.timer_wake.notify_one();
        }
        if out.committed {
            let mut events = vec![];
            for (result, touched) in out.results.iter().zip(&touched) {
                match (result, touched) {
                    (TxOpResult::Push(outcomes), Touched::Partitions(targets)) => {
                        events.extend(pushed_events(targets, outcomes))
                    }
                    (TxOpResult::Ack(a), Touched::Group(group)) => {
                        events.extend(released_events(std::iter::once((group.as_str(), a)), false))
                    }
                    (
                        TxOpResult::Kv { .. }
                        | TxOpResult::Timer(_)
                        | TxOpResult::Fired(_)
                        | TxOpResult::Stream(_),
                        Touched::Nothing,
                    ) => {}
                    // Storage answers each operation with its own kind, in order.
                    _ => debug_assert!(false, "transaction results out of order"),
                }
            }
            self.publish_all(&events);
        }
        Ok(out)
    }

    /// Seals the groups of queues this broker knows to encrypt.
    fn seal_known(&self, groups: &mut [PushGroup]) -> StorageResult<()> {
        let known = lock(&self.encrypted_queues);
        for g in groups.iter_mut().filter(|g| known.contains(&g.queue)) {
            let cipher =
                self.config
                    .cipher
                    .as_ref()
                    .ok_or_else(|| StorageError::EncryptionRequired {
                        queue: g.queue.clone(),
                    })?;
            cipher.seal_group(g).map_err(StorageError::Internal)?;
        }
        Ok(())
    }

    fn seal_known_ops(&self, ops: &mut [TxOp]) -> StorageResult<()> {
        for op in ops {
            if let TxOp::Push(groups) = op {
                self.seal_known(groups)?;
            }
        }
        Ok(())
    }

    /// Whether storage could still refuse these groups for want of sealing: this broker has a
    /// key and some group is plaintext (then a push keeps a copy to seal and send again).
    fn may_need_sealing<'a>(&self, groups: impl IntoIterator<Item = &'a PushGroup>) -> bool {
        self.config.cipher.is_some() && groups.into_iter().any(|g| !g.is_sealed())
    }

    /// Storage refused plaintext for `queue`: remember that it encrypts, and give back `again`
    /// sealed. Refused twice for the same queue (impossible once it is sealed) is an error,
    /// so the retry loop ends.
    fn learned_encrypted(
        &self,
        queue: String,
        again: Option<Vec<PushGroup>>,
    ) -> StorageResult<Vec<PushGroup>> {
        if !lock(&self.encrypted_queues).insert(queue.clone()) {
            return Err(StorageError::Internal(format!(
                "queue {queue} refused sealed payloads as plaintext"
            )));
        }
        let mut groups = again.unwrap_or_default();
        self.seal_known(&mut groups)?;
        Ok(groups)
    }

    /// Creates or overwrites a queue's configuration. Every broker's cached options and beliefs
    /// about the queue are stale now. encryptionEnabled needs this broker's key (400 without).
    pub async fn configure_queue(&self, config: QueueConfig) -> StorageResult<ConfiguredQueue> {
        if config.encryption_enabled && self.config.cipher.is_none() {
            return Err(StorageError::Invalid(
                "encryptionEnabled needs QUEEN_ENCRYPTION_KEY set on the broker".into(),
            ));
        }
        let queue = config.name.clone();
        let encrypted = config.encryption_enabled;
        let configured = self.storage.admin.configure_queue(config).await?;
        // Other brokers learn it from push_v6's refusal; a queue no longer encrypting is
        // harmless to seal for (pops open any sealed frame).
        if encrypted {
            lock(&self.encrypted_queues).insert(queue.clone());
        } else {
            lock(&self.encrypted_queues).remove(&queue);
        }
        self.publish(&DeliveryEvent::QueueChanged { queue });
        Ok(configured)
    }

    pub async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        let existed = self.storage.admin.delete_queue(queue).await?;
        self.publish(&DeliveryEvent::QueueChanged {
            queue: queue.to_string(),
        });
        Ok(existed)
    }

    pub async fn seek_group(
        &self,
        group: &str,
        queue: &str,
        target: SeekTarget,
    ) -> StorageResult<u32> {
        let moved = self.storage.admin.seek_group(group, queue, target).await?;
        self.publish(&DeliveryEvent::GroupReset {
            queue: Some(queue.to_string()),
            group: group.to_string(),
        });
        Ok(moved)
    }

    pub async fn delete_group(
        &self,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> StorageResult<GroupDeleted> {
        let deleted = self
            .storage
            .admin
            .delete_group(group, queue, delete_metadata)
            .await?;
        self.publish(&DeliveryEvent::GroupReset {
            queue: queue.map(str::to_string),
            group: group.to_string(),
        });
        Ok(deleted)
    }

    pub async fn update_subscription(
        &self,
        group: &str,
        timestamp: Timestamp,
    ) -> StorageResult<u32> {
        let n = self
            .storage
            .admin
            .update_subscription(group, timestamp)
            .await?;
        self.publish(&DeliveryEvent::GroupReset {
            queue: None,
            group: group.to_string(),
        });
        Ok(n)
    }

    pub async fn dead_letters(&self, query: DlqQuery) -> StorageResult<DeadLetterPage> {
        self.storage.delivery.dead_letters(query).await
    }

    /// Pushes a dead letter's message again, as a new message, and publishes it.
    pub async fn requeue_dead_letter(&self, id: i64) -> StorageResult<Option<Requeued>> {
        let requeued = self
            .storage
            .delivery
            .requeue_dead_letter(id, self.mint_uuid())
            .await?;
        if let Some(r) = &requeued {
            let target = [(r.queue.clone(), r.partition.clone())];
            self.publish_all(&pushed_events(&target, &[vec![r.outcome.clone()]]));
        }
        Ok(requeued)
    }
}

/// Every message of a push carries the caller's identity, or none: a client never sets it.
fn stamp_producer(groups: &mut [PushGroup], producer: Option<&str>) {
    for g in groups.iter_mut() {
        if g.frames.iter().any(|f| f.producer.as_deref() != producer) {
            for f in &mut g.frames {
                f.producer = producer.map(str::to_string);
            }
            // The client's compressed blob holds the frames without it.
            g.blob = None;
        }
    }
}

/// How a push ended: stored (each item's outcome), or buffered to be stored later.
pub enum Pushed {
    Stored(Vec<PushGroupResult>),
    /// Written to the file buffer; the groups as given (message ids included).
    Buffered(Vec<PushGroup>),
}

impl Broker {
    /// Stores the oldest buffered push; `false` when it could not (storage away, or the buffer
    /// unreadable): the drain waits before trying again.
    pub(crate) async fn drain_step(&self) -> bool {
        let Some(buffer) = self.config.file_buffer.clone() else {
            return false;
        };
        let reader = buffer.clone();
        let next = match tokio::task::spawn_blocking(move || reader.next_batch(1)).await {
            Ok(Ok(mut batch)) => batch.pop(),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read the file buffer");
                return false;
            }
            Err(e) => {
                tracing::error!(error = %e, "file buffer task failed");
                return false;
            }
        };
        let Some(record) = next else { return false };
        let groups = record.groups.clone();
        let stored = self.store_push(groups, Some(record.accepted_at)).await;
        let refused = match stored {
            Ok(_) => false,
            Err(e) if e.is_unavailable() => return false,
            Err(e) => {
                tracing::error!(error = %e, "storage refused a buffered push; it moves to failed.log");
                true
            }
        };
        let marked = tokio::task::spawn_blocking(move || {
            if refused {
                buffer.mark_failed(&record)
            } else {
                buffer.mark_stored(&record)
            }
        })
        .await;
        match marked {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot record the file buffer's progress");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "file buffer task failed");
                false
            }
        }
    }
}

/// What one transaction operation touched.
enum Touched {
    Partitions(Vec<(String, String)>),
    Group(String),
    /// A KV rider: nothing a parked pop waits for.
    Nothing,
}

/// `Pushed` per (queue, partition) group that queued anything (duplicates and refusals append
/// nothing, so they wake nobody).
fn pushed_events(targets: &[(String, String)], results: &[PushGroupResult]) -> Vec<DeliveryEvent> {
    targets
        .iter()
        .zip(results)
        .filter_map(|((queue, partition), res)| {
            let count = res
                .iter()
                .filter(|o| matches!(o, PushOutcome::Queued { .. }))
                .count() as u64;
            (count > 0).then(|| DeliveryEvent::Pushed {
                queue: queue.clone(),
                partition: partition.clone(),
                count,
            })
        })
        .collect()
}

/// `Released` per ack that ended a lease; `batch_committed`: each committed its whole batch.
fn released_events<'a>(
    acks: impl Iterator<Item = (&'a str, &'a AckOutcome)>,
    batch_committed: bool,
) -> Vec<DeliveryEvent> {
    acks.filter_map(
        |(group, o)| match (o.lease_released, &o.queue, &o.partition) {
            (true, Some(queue), Some(partition)) => Some(DeliveryEvent::Released {
                queue: queue.clone(),
                partition: partition.clone(),
                group: group.to_string(),
                batch_committed,
            }),
            _ => None,
        },
    )
    .collect()
}
