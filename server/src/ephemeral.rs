//! This broker's ephemeral queues: the rings (`queen_core::ephemeral`, the rules) behind one lock,
//! and a wake per queue that parked pops wait on. Every call holds the lock for microseconds
//! (no I/O under it), so one lock serves every queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use queen_core::ephemeral::{EphemeralOptions, EphemeralStore};
use tokio::sync::Notify;

use crate::helpers::lock;

pub struct Ephemeral {
    store: Mutex<EphemeralStore>,
    wakes: Mutex<BTreeMap<String, Arc<Notify>>>,
}

impl Ephemeral {
    pub fn new(incarnation: u64, budget_bytes: u64) -> Self {
        Ephemeral {
            store: Mutex::new(EphemeralStore::new(incarnation, budget_bytes)),
            wakes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs `f` over the rings under the lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut EphemeralStore) -> R) -> R {
        f(&mut lock(&self.store))
    }

    pub fn exists(&self, queue: &str) -> bool {
        lock(&self.store).exists(queue)
    }

    /// Creates a queue in memory with the options its declaration holds (or the defaults).
    pub fn ensure(&self, queue: &str, options: EphemeralOptions) {
        lock(&self.store).ensure(queue, || options);
    }

    /// What a parked pop of `queue` waits on: told by every push, ack and reset of the queue.
    pub fn wake_of(&self, queue: &str) -> Arc<Notify> {
        lock(&self.wakes)
            .entry(queue.to_string())
            .or_default()
            .clone()
    }

    /// Wakes every pop parked on `queue` (each looks again; those that find nothing park again).
    pub fn wake(&self, queue: &str) {
        if let Some(n) = lock(&self.wakes).get(queue) {
            n.notify_waiters();
        }
    }

    /// Forgets a deleted queue's wake once no pop holds it.
    pub fn forget_wake(&self, queue: &str) {
        let mut wakes = lock(&self.wakes);
        if wakes.get(queue).is_some_and(|n| Arc::strong_count(n) == 1) {
            wakes.remove(queue);
        }
    }
}
