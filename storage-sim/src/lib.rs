//! `queen-storage-sim`: an in-memory model of Queen's PostgreSQL storage.
//!
//! It reproduces the semantics where the races live (row locks held to commit, SKIP LOCKED,
//! transaction-scoped advisory try-locks, READ COMMITTED statement snapshots, inserts that wait on
//! an in-flight inserter) and executes every procedure one statement at a time, so a seeded
//! scheduler (`sched::Interleaving`) can interleave transactions deterministically. Through the
//! storage traits (`backend.rs`) it runs transactions serially: the broker's embedded in-memory backend.

mod backend;
mod delivery;
mod inspect;
mod kv;
mod messages;
mod pop;
mod queues;
pub mod reach;
mod reads;
mod retention;
pub mod sched;
mod state;
mod streams;
pub mod table;
mod timers;
mod tx;

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use queen_core::claim::CursorRow;
use queen_core::storage::{StorageError, StorageResult};
use queen_core::{Offset, Timestamp};

pub use state::DlqRow as DeadLetter;
pub use state::RemovedMessages;
pub use tx::{Listener, Pause, PauseFn, PauseKind, SimEvents, TaskCell, WaitEvent};

use tx::{lock, Shared};

/// The model's clock: PostgreSQL's now(), injected.
pub type SimClock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// A settable clock for tests and simulations.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.0)))
    }
    pub fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
    pub fn advance_millis(&self, ms: i64) {
        self.0.fetch_add(ms * 1000, Ordering::SeqCst);
    }
    pub fn as_sim_clock(&self) -> SimClock {
        let c = self.clone();
        Arc::new(move || c.now())
    }
}

/// Switches that re-introduce historical bugs of brokers of this design (each described at its
/// field). Each has a test proving the suites catch it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimBugs {
    /// The specific-partition pop reports the partitionId resolved under the outer statement's
    /// snapshot, taken before the claim.
    pub partition_id_outside_function: bool,
    /// Every pop runs INSERT ... ON CONFLICT DO NOTHING on the cursor row before claiming.
    pub per_pop_insert_on_conflict: bool,
    /// Cursor creation takes the advisory lock (waits) instead of trying it.
    pub advisory_lock_blocking: bool,
    /// No empty-partition cursor seal.
    pub no_cursor_seal: bool,
    /// Cursor creation inserts without re-checking for the row after the advisory lock (a window
    /// the model found in the literal design: the insert can wait on a third pop's update).
    pub insert_without_recheck: bool,
    /// The cursor trigger sends nothing: an ack, nack or failed ack on one broker frees a
    /// partition that consumers parked on another broker never hear of.
    pub no_release_notify: bool,
    /// Completed retention counts cursor rows only (Queen 0.15's rule): a group subscribed to the
    /// queue but not yet on a partition holds nothing back there, so retention removes what it
    /// has not read.
    pub retention_ignores_groups_without_rows: bool,
    /// The pending scans (the wildcard pop's candidates, the ring's reseed pages, the next-pending
    /// probe) see only partitions with a cursor row for the group, as if the group's first
    /// contact had seeded every partition: past `FIRST_CONTACT_SEED_CAP` a backlog from before
    /// the first contact is never found.
    pub pending_scans_need_a_cursor: bool,
    /// A KV write's version is the key's previous version plus one (1 for a new key), so a key
    /// deleted or expired and written again repeats versions: a stale compare-and-set succeeds.
    pub kv_versions_repeat: bool,
    /// A KV `incr` checks its `min`/`max` on a read made before it takes the row's lock: two
    /// increments that read one value both pass the limit and write the same next value, so a
    /// rate limiter admits more than its `max`.
    pub incr_checks_limit_before_the_lock: bool,
    /// A KV `get` takes an expired row as live (the sweep has not removed it yet): a value is
    /// read past its TTL.
    pub kv_get_ignores_expiry: bool,
    /// A KV batch's `required` op is checked as if outside the batch's transaction: when it is
    /// refused, the ops before it stay applied, so a batch is visible in part.
    pub required_checked_outside_the_transaction: bool,
    /// A lock renew is checked against the slot, not the permit: it extends whatever permit holds
    /// the slot, so a holder whose permit lapsed and was taken over renews its successor's permit
    /// and gets a new, higher token: two holders at once.
    pub renew_takes_over_the_slot: bool,
    /// A lock acquire counts expired permits as held.
    pub expired_permits_count: bool,
    /// A timer's firing neither checks nor removes the timer row: two brokers both fire it.
    pub timers_fire_without_removal: bool,
    /// A read by offset from inside a segment starts at the segment's first record.
    pub fetch_from_segment_base: bool,
    /// A read by offset sees a push in flight (offsets allocated, not committed): it may answer
    /// offsets a rollback leaves to another push, or a high watermark above a gap.
    pub fetch_reads_in_flight: bool,
    /// A stream cycle's fence ignores the lease (Queen 0.15's weakness): a holder whose lease
    /// expired and was re-claimed commits its state and sink pushes, its ack passing as the
    /// idempotent ack of a message already committed.
    pub stream_fence_ignores_lease: bool,
    /// A cycle without an ack (the SDK's idle flush) is fenced on nothing: it deletes rows another
    /// cycle already closed and commits while a worker holds the source lease, so a window that
    /// two cycles read reaches the sink twice.
    pub stream_flush_unfenced: bool,
    /// A flush deletes a window row whatever happened to it since its ripe read: a regular cycle
    /// that added a batch to the window in between is lost with the row (the window is emitted
    /// as the flush read it).
    pub flush_ignores_its_ripe_read: bool,
    /// A conflating pop moves the cursor through the message it delivers (retirement and
    /// commit in one), so a consumer that dies before its ack loses the partition's newest
    /// message: the redelivery starts past it.
    pub conflation_commits_at_claim: bool,
}

/// A model database. Clone the `Arc` to share it between brokers.
pub struct SimDb {
    shared: Arc<Shared>,
    /// Interleaved mode: the async runtime runs transactions concurrently, pausing at every
    /// statement. `None`: the embedded backend, one transaction at a time.
    pause: Option<Pause>,
}

impl SimDb {
    pub fn new(seed: u64, clock: SimClock, bugs: SimBugs) -> Arc<SimDb> {
        Self::build(seed, clock, bugs, None)
    }

    /// A model whose transactions run concurrently under the caller's async runtime (a
    /// simulation): every statement first awaits `pause(Pause::Statement)`, and a statement that
    /// must wait awaits `pause(Pause::Blocked)` before retrying. A wait that closes a cycle aborts
    /// the waiter, as PostgreSQL's deadlock detector would.
    pub fn interleaved(seed: u64, clock: SimClock, bugs: SimBugs, pause: PauseFn) -> Arc<SimDb> {
        Self::build(seed, clock, bugs, Some(Pause(pause)))
    }

    fn build(seed: u64, clock: SimClock, bugs: SimBugs, pause: Option<Pause>) -> Arc<SimDb> {
        let mut state = state::DbState::new(seed);
        state.no_release_notify = bugs.no_release_notify;
        state.record_removals = pause.is_some();
        Arc::new(SimDb {
            pause,
            shared: Arc::new(Shared {
                listeners: Mutex::new(Default::default()),
                next_listener: Mutex::new(0),
                state: Mutex::new(state),
                events: Mutex::new(SimEvents::default()),
                clock,
                bugs,
                active: Mutex::new(Default::default()),
                started: Mutex::new(Default::default()),
                next_tx: Mutex::new(0),
                serial: Mutex::new(()),
            }),
        })
    }

    pub fn now(&self) -> Timestamp {
        (self.shared.clock)()
    }

    /// LISTEN: `listener` hears every notification of a transaction that commits from now on,
    /// until the subscription is dropped (a broker that crashed stops listening).
    pub fn subscribe(&self, listener: Listener) -> Subscription {
        let id = {
            let mut n = lock(&self.shared.next_listener);
            *n += 1;
            *n
        };
        lock(&self.shared.listeners).insert(id, listener);
        Subscription {
            shared: Arc::downgrade(&self.shared),
            id,
        }
    }

    pub fn events(&self) -> SimEvents {
        lock(&self.shared.events).clone()
    }

    pub fn bugs(&self) -> SimBugs {
        self.shared.bugs
    }

    /// The committed cursor row of (queue, partition, group), if any.
    pub fn cursor(&self, queue: &str, partition: &str, group: &str) -> Option<CursorRow> {
        let st = lock(&self.shared.state);
        let pid = st
            .partitions
            .get(&(queue.to_string(), partition.to_string()), 0)?
            .id
            .clone();
        st.consumers.get(&(pid, group.to_string()), 0).cloned()
    }

    /// (last_offset, partition id) of a partition, committed.
    pub fn partition_head(&self, queue: &str, partition: &str) -> Option<(Offset, String)> {
        let st = lock(&self.shared.state);
        st.partitions
            .get(&(queue.to_string(), partition.to_string()), 0)
            .map(|p| (p.last_offset, p.id.clone()))
    }

    /// Partition names of a queue, committed, in name order.
    pub fn partitions(&self, queue: &str) -> Vec<String> {
        let st = lock(&self.shared.state);
        st.partitions_of(queue, 0)
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// Dead letters of a queue, in filing order.
    pub fn filed_dead_letters(&self, queue: &str) -> Vec<DeadLetter> {
        let st = lock(&self.shared.state);
        st.dlq
            .range((queue.to_string(), 0)..=(queue.to_string(), u64::MAX), 0)
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// Every dead letter failed acks filed (or discarded) in committed transactions, requeued
    /// ones included, in commit order; recorded only with `record_removals` (simulations).
    pub fn dead_letterings(&self) -> Vec<DeadLetter> {
        lock(&self.shared.state).dead_letterings.clone()
    }

    /// The durable subscription record of (queue, group): (timestamp, registered at).
    pub fn subscription(&self, queue: &str, group: &str) -> Option<(Option<Timestamp>, Timestamp)> {
        let st = lock(&self.shared.state);
        st.metadata
            .get(&(queue.to_string(), group.to_string()), 0)
            .map(|m| (m.subscription_timestamp, m.created_at))
    }

    /// Whether (queue, group) has claimable pending data, read directly (committed state).
    pub fn has_pending_now(&self, queue: &str, group: &str) -> bool {
        let now = self.now();
        pop::next_pending(
            &lock(&self.shared.state),
            &[queue.to_string()],
            group,
            now,
            0,
            // An oracle: the model's rules, whatever a bug switch does to the pops.
            SimBugs::default(),
        )
        .is_some_and(|t| t <= now)
    }

    /// The committed rows of a KV namespace, in key order (a simulation's checkers).
    pub fn kv_rows(&self, ns: &str) -> Vec<(String, queen_core::kv::KvRow)> {
        lock(&self.shared.state)
            .kv
            .range((ns.to_string(), String::new()).., 0)
            .take_while(|((n, _), _)| n == ns)
            .map(|((_, k), r)| (k.clone(), r.clone()))
            .collect()
    }

    /// The committed stream state rows: (query id, partition id, key) → value, in key order (a
    /// simulation's checkers).
    pub fn stream_state_rows(&self) -> Vec<((uuid::Uuid, String, String), serde_json::Value)> {
        lock(&self.shared.state)
            .stream_state
            .iter(0)
            .map(|(k, r)| (k.clone(), r.value.clone()))
            .collect()
    }

    /// Every committed message of a queue: (partition id, offset, payload), by partition name,
    /// then offset (a simulation's checkers).
    pub fn messages(&self, queue: &str) -> Vec<(String, Offset, Vec<u8>)> {
        let st = lock(&self.shared.state);
        let mut out = vec![];
        for (_, p) in st.partitions_of(queue, 0) {
            let segments = st
                .segments
                .range((p.id.clone(), Offset::MIN)..=(p.id.clone(), Offset::MAX), 0);
            for ((_, base), seg) in segments {
                let count = seg.message_count(*base) as usize;
                let Ok(frames) = queen_core::frames::slice_blob(&seg.blob, 0, count, count) else {
                    continue;
                };
                for (i, f) in frames.into_iter().enumerate() {
                    out.push((p.id.clone(), base + i as Offset, f.payload.to_vec()));
                }
            }
        }
        out
    }

    /// Timers not yet fired (a simulation's drain waits for them).
    pub fn pending_timers(&self) -> usize {
        lock(&self.shared.state).timers.iter(0).count()
    }

    /// Whether a pop of `group` could take a message of the partition now (a simulation's
    /// liveness oracle; see `pop::deliverable_now`).
    pub fn deliverable_now(&self, queue: &str, partition: &str, group: &str) -> bool {
        let now = self.now();
        pop::deliverable_now(&lock(&self.shared.state), queue, partition, group, now)
    }

    /// The queue's partitions for which `deliverable_now` holds, by name, read at once.
    pub fn deliverable_partitions(&self, queue: &str, group: &str) -> Vec<String> {
        let now = self.now();
        pop::deliverable_partitions(&lock(&self.shared.state), queue, group, now)
    }

    /// Every removal retention committed so far, in commit order (recorded in interleaved mode,
    /// for a simulation's checkers; empty otherwise).
    pub fn removals(&self) -> Vec<RemovedMessages> {
        lock(&self.shared.state).removals.clone()
    }

    /// Committed firings per timer incarnation (message id), in interleaved mode (for a
    /// simulation's checkers; empty otherwise).
    pub fn firings(&self) -> std::collections::BTreeMap<uuid::Uuid, u32> {
        lock(&self.shared.state).firings.clone()
    }

    /// Whether any transaction is open (every scheduled task finished cleanly).
    pub fn open_transactions(&self) -> usize {
        lock(&self.shared.active).len()
    }

    /// Retention: drop a partition's segments below `before`.
    pub fn drop_segments(
        &self,
        queue: &str,
        partition: &str,
        before: Offset,
    ) -> StorageResult<u32> {
        self.run(queues::drop_segments(
            self.shared.clone(),
            TaskCell::free_run(),
            queue.into(),
            partition.into(),
            before,
        ))
    }

    /// Runs a transaction to completion in free-run mode (serially; it can never wait).
    fn run<T>(&self, fut: impl Future<Output = StorageResult<T>>) -> StorageResult<T> {
        let _serial = lock(&self.shared.serial);
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(StorageError::Internal(
                "model transaction did not complete in serial mode".into(),
            )),
        }
    }

    /// The task cell of one storage call in the current mode.
    fn cell(&self) -> Arc<TaskCell> {
        match &self.pause {
            Some(p) => TaskCell::paused(p.clone()),
            None => TaskCell::free_run(),
        }
    }

    /// A scheduling point in interleaved mode (nothing otherwise).
    async fn pause_point(&self) {
        if let Some(p) = &self.pause {
            (p.0)(PauseKind::Statement).await;
        }
    }

    /// Runs one storage call: concurrently in interleaved mode, else serially.
    async fn exec<T>(&self, fut: impl Future<Output = StorageResult<T>>) -> StorageResult<T> {
        if self.pause.is_some() {
            fut.await
        } else {
            self.run(fut)
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// A LISTEN registration; dropping it unlistens.
pub struct Subscription {
    shared: std::sync::Weak<Shared>,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.listeners).remove(&self.id);
        }
    }
}
