//! This broker's ephemeral queues: the rings (`queen_core::ephemeral`, the rules) behind one lock,
//! a wake per queue that parked pops wait on, and, when several brokers share one database, which
//! of them owns each queue. Every call holds the lock for microseconds (no I/O under it), so one
//! lock serves every queue.
//!
//! Several brokers: each queue's ring lives in one broker, its owner, claimed through storage
//! (`EphemeralOwnerStorage`) and fenced by liveness (`queen_core::ephemeral::ownership`). The
//! others forward the queue's calls to it (`routes/ephemeral.rs`), so every consumer of a queue
//! reads one ring and a push through any broker wakes a pop parked through any other at once.
//! The embedded in-memory mode (no peer address) owns everything itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use queen_core::ephemeral::ownership::{self, OwnershipBugs};
use queen_core::ephemeral::{EphemeralOptions, EphemeralStore};
use queen_core::Timestamp;
use tokio::sync::Notify;

use crate::helpers::lock;
use crate::peers::Peers;

/// Where a queue's ring is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    Local,
    /// Another broker, at this address.
    Remote(String),
}

pub struct Ephemeral {
    incarnation: u64,
    /// The address peers reach this broker at; `None`: a single broker owning every queue.
    address: Option<String>,
    store: Mutex<EphemeralStore>,
    wakes: Mutex<BTreeMap<String, Arc<Notify>>>,
    /// Owners this broker has resolved, until a forward fails or its own liveness lapses.
    owners: Mutex<BTreeMap<String, Owner>>,
    /// When this broker's last successful liveness renewal was sent.
    last_beat: Mutex<Option<Timestamp>>,
    bugs: Mutex<OwnershipBugs>,
    pub peers: Peers,
}

impl Ephemeral {
    pub fn new(incarnation: u64, budget_bytes: u64, address: Option<String>) -> Self {
        Ephemeral {
            incarnation,
            address,
            store: Mutex::new(EphemeralStore::new(incarnation, budget_bytes)),
            wakes: Mutex::new(BTreeMap::new()),
            owners: Mutex::new(BTreeMap::new()),
            last_beat: Mutex::new(None),
            bugs: Mutex::new(OwnershipBugs::default()),
            peers: Peers::default(),
        }
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The peer address, when this broker shares its queues with others.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// Re-introduces a bug (tests proving the checks catch it).
    pub fn set_bugs(&self, bugs: OwnershipBugs) {
        *lock(&self.bugs) = bugs;
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

    /// A renewal of this broker's liveness, sent at `sent`, was stored.
    pub fn beat_stored(&self, sent: Timestamp) {
        let mut last = lock(&self.last_beat);
        *last = Some(last.map_or(sent, |t| t.max(sent)));
    }

    /// This broker stops owning anything at once (it is shutting down and leaves storage's list
    /// of live brokers, after which another may claim its queues without waiting).
    pub fn resign(&self) {
        *lock(&self.last_beat) = None;
        let dropped = {
            lock(&self.owners).clear();
            lock(&self.store).clear()
        };
        for queue in dropped {
            self.wake(&queue);
        }
    }

    /// Whether this broker may serve the queues it owns at `now`. When it may not (its liveness
    /// lapsed: another broker may claim them), everything it held is dropped: the contents are
    /// lost, the parked pops answer, and owners are resolved afresh.
    pub fn serving(&self, now: Timestamp) -> bool {
        if self.address.is_none() {
            return true;
        }
        let last = *lock(&self.last_beat);
        if ownership::serving(last, now, *lock(&self.bugs)) {
            return true;
        }
        let dropped = {
            let mut owners = lock(&self.owners);
            owners.clear();
            lock(&self.store).clear()
        };
        for queue in dropped {
            self.wake(&queue);
        }
        false
    }

    /// Whether this broker still owns `queue` (a parked pop's check each time it wakes).
    pub fn owns(&self, queue: &str, now: Timestamp) -> bool {
        self.address.is_none()
            || (self.serving(now) && lock(&self.owners).get(queue) == Some(&Owner::Local))
    }

    pub fn cached_owner(&self, queue: &str) -> Option<Owner> {
        lock(&self.owners).get(queue).cloned()
    }

    pub fn note_owner(&self, queue: &str, owner: Owner) {
        lock(&self.owners).insert(queue.to_string(), owner);
    }

    /// A forward to the cached owner failed or was refused: resolve it again next time.
    pub fn forget_owner(&self, queue: &str) {
        lock(&self.owners).remove(queue);
    }
}
