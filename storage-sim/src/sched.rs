//! The seeded step scheduler: runs model transactions as tasks and interleaves their statements
//! in an order drawn from one seed. A statement that must wait stays parked until its holder's
//! transaction ends; when every open task waits in a cycle, the youngest is aborted, as
//! PostgreSQL's deadlock detector would.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use queen_core::rng::SeededRng;
use queen_core::storage::{
    AckItem, AckOutcome, PopRequest, PopResult, PushGroup, PushGroupResult, RenewOutcome,
    StorageResult,
};

use crate::tx::{lock, TaskCell};
use crate::{delivery, kv, messages, pop, SimDb};

/// One operation a task performs: a storage procedure.
#[derive(Clone, Debug)]
pub enum Op {
    Push(Vec<PushGroup>),
    PopPartition(PopRequest, String),
    PopList(PopRequest, Vec<String>),
    PopWildcard(PopRequest),
    Ack(String, Vec<AckItem>),
    Renew(String, u32),
    Kv(Vec<queen_core::kv::KvOp>),
    /// A lock op and the owner minted for an acquire that names none.
    Lock(queen_core::locks::LockOp, String),
    Transaction(Vec<queen_core::storage::TxOp>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpResult {
    Push(StorageResult<Vec<PushGroupResult>>),
    Pop(StorageResult<PopResult>),
    Ack(StorageResult<Vec<AckOutcome>>),
    Renew(StorageResult<RenewOutcome>),
    Kv(StorageResult<queen_core::kv::KvBatch>),
    Lock(StorageResult<serde_json::Value>),
    Transaction(StorageResult<queen_core::storage::TxOutcome>),
}

type TaskFuture = Pin<Box<dyn Future<Output = OpResult> + Send>>;

struct Task {
    cell: Arc<TaskCell>,
    fut: Option<TaskFuture>,
    result: Option<OpResult>,
}

/// A set of concurrent transactions over one model database.
pub struct Interleaving {
    db: Arc<SimDb>,
    rng: SeededRng,
    tasks: Vec<Task>,
    /// Which task ran at each step (for traces and determinism checks).
    pub trace: Vec<usize>,
}

impl Interleaving {
    pub fn new(db: Arc<SimDb>, seed: u64) -> Self {
        Interleaving {
            db,
            rng: SeededRng::new(seed).child("interleaving"),
            tasks: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// Adds a task; returns its index.
    pub fn spawn(&mut self, op: Op) -> usize {
        let cell = TaskCell::stepped();
        let shared = self.db.shared().clone();
        let c = cell.clone();
        let fut: TaskFuture = match op {
            Op::Push(groups) => {
                Box::pin(
                    async move { OpResult::Push(messages::push(shared, c, groups, None).await) },
                )
            }
            Op::PopPartition(req, p) => {
                Box::pin(async move { OpResult::Pop(pop::pop_partition(shared, c, req, p).await) })
            }
            Op::PopList(req, names) => {
                Box::pin(async move { OpResult::Pop(pop::pop_list(shared, c, req, names).await) })
            }
            Op::PopWildcard(req) => {
                Box::pin(async move { OpResult::Pop(pop::pop_wildcard(shared, c, req).await) })
            }
            Op::Ack(group, items) => {
                Box::pin(async move { OpResult::Ack(messages::ack(shared, c, group, items).await) })
            }
            Op::Renew(lease, secs) => {
                Box::pin(
                    async move { OpResult::Renew(messages::renew(shared, c, lease, secs).await) },
                )
            }
            Op::Kv(ops) => Box::pin(async move {
                let limits = queen_core::kv::KvLimits::default();
                OpResult::Kv(kv::kv_batch(shared, c, ops, limits).await)
            }),
            Op::Lock(op, owner) => {
                Box::pin(async move { OpResult::Lock(kv::lock_op(shared, c, op, owner).await) })
            }
            Op::Transaction(ops) => Box::pin(async move {
                OpResult::Transaction(delivery::transaction(shared, c, ops).await)
            }),
        };
        self.tasks.push(Task {
            cell,
            fut: Some(fut),
            result: None,
        });
        self.tasks.len() - 1
    }

    fn waiting_on(&self, i: usize) -> Option<u64> {
        let tx = (*lock(&self.tasks[i].cell.tx))?;
        lock(&self.db.shared().active).get(&tx).copied().flatten()
    }

    fn runnable(&self) -> Vec<usize> {
        let active = lock(&self.db.shared().active);
        (0..self.tasks.len())
            .filter(|i| self.tasks[*i].fut.is_some())
            .filter(|i| {
                let tx = *lock(&self.tasks[*i].cell.tx);
                match tx.and_then(|t| active.get(&t).copied().flatten()) {
                    None => true,
                    Some(holder) => !active.contains_key(&holder),
                }
            })
            .collect()
    }

    /// Polls one task once (one statement). Returns false when every task has finished.
    pub fn step(&mut self) -> bool {
        let mut runnable = self.runnable();
        if runnable.is_empty() {
            let open: Vec<usize> = (0..self.tasks.len())
                .filter(|i| self.tasks[*i].fut.is_some())
                .collect();
            if open.is_empty() {
                return false;
            }
            // Everyone waits: a cycle. Abort the youngest transaction in it.
            let victim = open
                .iter()
                .copied()
                .max_by_key(|i| lock(&self.tasks[*i].cell.tx).unwrap_or(0))
                .unwrap_or(open[0]);
            debug_assert!(self.waiting_on(victim).is_some());
            *lock(&self.tasks[victim].cell.deadlock_victim) = true;
            runnable = vec![victim];
        }
        let pick = runnable[self.rng.below(runnable.len() as u64) as usize];
        self.trace.push(pick);
        let task = &mut self.tasks[pick];
        let mut cx = Context::from_waker(Waker::noop());
        if let Some(fut) = task.fut.as_mut() {
            if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                task.result = Some(r);
                task.fut = None;
            }
        }
        true
    }

    /// Runs every task to completion (bounded, so a livelock is a failure, not a hang).
    pub fn run(&mut self, max_steps: usize) -> Result<Vec<OpResult>, String> {
        for _ in 0..max_steps {
            if !self.step() {
                return Ok(self.tasks.iter().filter_map(|t| t.result.clone()).collect());
            }
        }
        Err(format!("no progress after {max_steps} steps: livelock"))
    }

    /// Results so far, by task index (None while still running).
    pub fn result(&self, i: usize) -> Option<&OpResult> {
        self.tasks.get(i).and_then(|t| t.result.as_ref())
    }
}
