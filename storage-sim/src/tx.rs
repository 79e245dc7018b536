//! Transactions executed one statement at a time.
//!
//! A procedure is ordinary async code whose every statement goes through `Tx::stmt`. In stepped
//! mode each statement first yields, so a scheduler that polls one task at a time decides the
//! interleaving, and a statement that must wait (row lock, in-flight insert, advisory lock) stays
//! pending until its holder ends. In free-run mode the whole transaction runs serially under one
//! gate, so nothing ever waits: that is the embedded backend.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use queen_core::events::DeliveryEvent;
use queen_core::storage::StorageError;
use queen_core::Timestamp;

use crate::state::DbState;
use crate::table::TxId;
use crate::{SimBugs, SimClock};

/// A statement that had to wait on another transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitEvent {
    pub procedure: &'static str,
    pub statement: &'static str,
    pub waiter: TxId,
    pub holder: TxId,
}

/// What the model observed, for coverage assertions and checkers.
#[derive(Clone, Debug, Default)]
pub struct SimEvents {
    pub waits: Vec<WaitEvent>,
    pub deadlocks: u32,
    /// Longest waits-for chain seen (1 = a single wait).
    pub longest_wait_chain: usize,
    /// Statements executed, by procedure.
    pub statements: BTreeMap<&'static str, u64>,
    /// Pops whose response carried an empty partitionId (the partition-creation race).
    pub empty_partition_ids: u32,
    /// Claims that found the partition created by a push after the pop's first snapshot.
    pub creation_races: u32,
    pub seals: u32,
    pub skip_locked: u32,
    pub advisory_skips: u32,
    /// Partitions a retention batch skipped because a push held them.
    pub retention_skips: u32,
}

/// Shared by everything that touches the model.
pub struct Shared {
    pub state: Mutex<DbState>,
    pub events: Mutex<SimEvents>,
    pub clock: SimClock,
    pub bugs: SimBugs,
    /// Transactions begun and not yet ended, with who each waits on.
    pub active: Mutex<BTreeMap<TxId, Option<TxId>>>,
    /// When each open transaction began (a discovery answer's `safeTime` stays below them).
    pub started: Mutex<BTreeMap<TxId, Timestamp>>,
    pub next_tx: Mutex<TxId>,
    /// Free-run mode: one transaction at a time.
    pub serial: Mutex<()>,
    /// LISTEN: who hears the notifications of committed transactions, by subscription id.
    pub listeners: Mutex<BTreeMap<u64, Listener>>,
    pub next_listener: Mutex<u64>,
}

/// Hears one committed notification. Called after the model's locks are released; it must not
/// block (a broker forwards it to its own task).
pub type Listener = Arc<dyn Fn(&DeliveryEvent) + Send + Sync>;

impl Shared {
    /// Delivers a committed transaction's notifications to every listener, in subscription order.
    fn publish(&self, sent: Vec<DeliveryEvent>) {
        if sent.is_empty() {
            return;
        }
        let listeners: Vec<Listener> = lock(&self.listeners).values().cloned().collect();
        for event in &sent {
            for l in &listeners {
                l(event);
            }
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the model half-written in a way later
    // statements rely on (each statement is all-or-nothing on its own data), so recover.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a statement pauses in interleaved mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseKind {
    /// Before every statement: the runtime may run other transactions here.
    Statement,
    /// The statement must wait on another transaction: retry after this.
    Blocked,
}

/// The interleaved mode's scheduling point, supplied by the runtime that drives the model.
pub type PauseFn = Arc<dyn Fn(PauseKind) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

#[derive(Clone)]
pub struct Pause(pub PauseFn);

impl std::fmt::Debug for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pause")
    }
}

/// Per task: set by the scheduler to abort a deadlock victim.
#[derive(Debug, Default)]
pub struct TaskCell {
    pub stepped: bool,
    pub pause: Option<Pause>,
    pub deadlock_victim: Mutex<bool>,
    pub tx: Mutex<Option<TxId>>,
}

impl TaskCell {
    pub fn free_run() -> Arc<TaskCell> {
        Arc::new(TaskCell {
            stepped: false,
            ..Default::default()
        })
    }
    pub fn paused(pause: Pause) -> Arc<TaskCell> {
        Arc::new(TaskCell {
            pause: Some(pause),
            ..Default::default()
        })
    }
    pub fn stepped() -> Arc<TaskCell> {
        Arc::new(TaskCell {
            stepped: true,
            ..Default::default()
        })
    }
}

pub(crate) enum StmtError {
    /// Must wait for this transaction to end.
    Blocked(TxId),
    Abort(StorageError),
}

impl From<StorageError> for StmtError {
    fn from(e: StorageError) -> Self {
        StmtError::Abort(e)
    }
}

/// Returns `Pending` once: a scheduling point.
pub(crate) struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

pub(crate) struct Tx {
    pub shared: Arc<Shared>,
    pub id: TxId,
    /// Transaction start time: PostgreSQL's now().
    pub now: Timestamp,
    pub procedure: &'static str,
    cell: Arc<TaskCell>,
    ended: bool,
}

impl Tx {
    pub fn begin(shared: &Arc<Shared>, procedure: &'static str, cell: Arc<TaskCell>) -> Tx {
        let id = {
            let mut n = lock(&shared.next_tx);
            *n += 1;
            *n
        };
        lock(&shared.active).insert(id, None);
        let now = (shared.clock)();
        lock(&shared.started).insert(id, now);
        *lock(&cell.tx) = Some(id);
        Tx {
            shared: shared.clone(),
            id,
            now,
            procedure,
            cell,
            ended: false,
        }
    }

    /// Runs one statement. `f` sees the whole database and either completes or says whom it
    /// waits on; it must not change anything before deciding to wait.
    pub async fn stmt<T>(
        &self,
        name: &'static str,
        mut f: impl FnMut(&mut DbState, &Tx) -> Result<T, StmtError>,
    ) -> Result<T, StorageError> {
        if self.cell.stepped {
            YieldOnce(false).await;
        } else if let Some(p) = &self.cell.pause {
            (p.0)(PauseKind::Statement).await;
        }
        *lock(&self.shared.events)
            .statements
            .entry(self.procedure)
            .or_default() += 1;
        let mut waiting_on = None;
        loop {
            if std::mem::take(&mut *lock(&self.cell.deadlock_victim)) {
                lock(&self.shared.events).deadlocks += 1;
                if let Some(w) = lock(&self.shared.active).get_mut(&self.id) {
                    *w = None;
                }
                return Err(StorageError::Internal(format!(
                    "deadlock detected in {}: {name}",
                    self.procedure
                )));
            }
            let r = f(&mut lock(&self.shared.state), self);
            match r {
                Ok(v) => {
                    if waiting_on.is_some() {
                        if let Some(w) = lock(&self.shared.active).get_mut(&self.id) {
                            *w = None;
                        }
                    }
                    return Ok(v);
                }
                Err(StmtError::Abort(e)) => return Err(e),
                Err(StmtError::Blocked(holder)) => {
                    if !self.cell.stepped && self.cell.pause.is_none() {
                        return Err(StorageError::Internal(format!(
                            "{}: {name} would wait on transaction {holder} in serial mode",
                            self.procedure
                        )));
                    }
                    if waiting_on != Some(holder) {
                        waiting_on = Some(holder);
                        let chain = {
                            let mut active = lock(&self.shared.active);
                            if let Some(w) = active.get_mut(&self.id) {
                                *w = Some(holder);
                            }
                            chain_length(&active, self.id)
                        };
                        let mut ev = lock(&self.shared.events);
                        ev.waits.push(WaitEvent {
                            procedure: self.procedure,
                            statement: name,
                            waiter: self.id,
                            holder,
                        });
                        ev.longest_wait_chain = ev.longest_wait_chain.max(chain);
                        drop(ev);
                        if self.cell.pause.is_some() {
                            // No scheduler picks victims here: the waiter that closes a cycle
                            // is aborted.
                            if in_cycle(&lock(&self.shared.active), self.id) {
                                lock(&self.shared.events).deadlocks += 1;
                                if let Some(w) = lock(&self.shared.active).get_mut(&self.id) {
                                    *w = None;
                                }
                                return Err(StorageError::Internal(format!(
                                    "deadlock detected in {}: {name}",
                                    self.procedure
                                )));
                            }
                        }
                    }
                    match &self.cell.pause {
                        Some(p) => (p.0)(PauseKind::Blocked).await,
                        None => YieldOnce(false).await,
                    }
                }
            }
        }
    }

    /// Commits or rolls back, releasing every lock.
    pub fn end(mut self, commit: bool) {
        self.finish(commit);
    }

    fn finish(&mut self, commit: bool) {
        if self.ended {
            return;
        }
        self.ended = true;
        let now = (self.shared.clock)();
        let sent = lock(&self.shared.state).end(self.id, commit, now);
        lock(&self.shared.active).remove(&self.id);
        lock(&self.shared.started).remove(&self.id);
        self.shared.publish(sent);
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // A dropped (cancelled) transaction rolls back, like a broken connection.
        self.finish(false);
    }
}

/// Whether the waits-for chain from `tx` leads back to `tx`.
pub(crate) fn in_cycle(active: &BTreeMap<TxId, Option<TxId>>, tx: TxId) -> bool {
    let mut cur = tx;
    for _ in 0..active.len() {
        match active.get(&cur) {
            Some(Some(next)) if *next == tx => return true,
            Some(Some(next)) => cur = *next,
            _ => return false,
        }
    }
    false
}

/// Length of the waits-for chain starting at `tx` (stops at a cycle).
pub(crate) fn chain_length(active: &BTreeMap<TxId, Option<TxId>>, tx: TxId) -> usize {
    let mut seen = vec![tx];
    let mut cur = tx;
    while let Some(Some(next)) = active.get(&cur) {
        if seen.contains(next) {
            break;
        }
        seen.push(*next);
        cur = *next;
    }
    seen.len() - 1
}

/// Runs a procedure body in its own transaction: commit on success, roll back on error.
pub(crate) async fn in_tx<T, F, Fut>(
    shared: &Arc<Shared>,
    procedure: &'static str,
    cell: Arc<TaskCell>,
    body: F,
) -> Result<T, StorageError>
where
    F: FnOnce(Arc<TxHandle>) -> Fut,
    Fut: Future<Output = Result<T, StorageError>>,
{
    let tx = Arc::new(TxHandle(Mutex::new(Some(Tx::begin(
        shared, procedure, cell,
    )))));
    let r = body(tx.clone()).await;
    if let Some(t) = lock(&tx.0).take() {
        t.end(r.is_ok());
    }
    r
}

/// Shared handle so procedure bodies can hold the transaction across awaits.
pub(crate) struct TxHandle(Mutex<Option<Tx>>);

impl TxHandle {
    /// The model's bug switches (the default when the transaction already ended).
    pub fn bugs(&self) -> crate::SimBugs {
        lock(&self.0)
            .as_ref()
            .map(|t| t.shared.bugs)
            .unwrap_or_default()
    }

    pub async fn stmt<T>(
        &self,
        name: &'static str,
        f: impl FnMut(&mut DbState, &Tx) -> Result<T, StmtError>,
    ) -> Result<T, StorageError> {
        // The Tx itself is only borrowed for the statement; take it out so no guard is held
        // across the scheduling point.
        let tx = lock(&self.0)
            .take()
            .ok_or_else(|| StorageError::Internal("transaction already ended".into()))?;
        let r = tx.stmt(name, f).await;
        *lock(&self.0) = Some(tx);
        r
    }

    pub fn now(&self) -> Timestamp {
        lock(&self.0).as_ref().map_or(Timestamp::EPOCH, |t| t.now)
    }
}
