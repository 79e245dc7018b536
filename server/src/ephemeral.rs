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

use queen_core::ephemeral::{ownership, EphemeralBugs};
use queen_core::ephemeral::{EphemeralOptions, EphemeralStore};
use queen_core::storage::EphemeralClaim;
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

/// Which parked pops a wake is for: (queue, group, partition; `None` for queue-wide pops).
pub type WakeKey = (String, String, Option<String>);

pub struct Ephemeral {
    incarnation: u64,
    /// The address peers reach this broker at; `None`: a single broker owning every queue.
    address: Option<String>,
    store: Mutex<EphemeralStore>,
    /// Parked pops by (queue, group, partition; `None`: queue-wide), each key a FIFO of waiters.
    wakes: Mutex<BTreeMap<WakeKey, Arc<Notify>>>,
    /// Owners this broker has resolved, until a forward fails or its own liveness lapses.
    owners: Mutex<BTreeMap<String, Owner>>,
    /// The claim epoch under which this broker holds each ring it has: after a lapse, a claim
    /// that answers the same epoch gives the ring back its contents.
    held: Mutex<BTreeMap<String, i64>>,
    /// When this broker's last successful liveness renewal was sent.
    last_beat: Mutex<Option<Timestamp>>,
    bugs: Mutex<EphemeralBugs>,
    pub peers: Peers,
}

impl Ephemeral {
    pub fn new(incarnation: u64, budget_bytes: u64, address: Option<String>, peers: Peers) -> Self {
        Ephemeral {
            incarnation,
            address,
            store: Mutex::new(EphemeralStore::new(incarnation, budget_bytes)),
            wakes: Mutex::new(BTreeMap::new()),
            owners: Mutex::new(BTreeMap::new()),
            held: Mutex::new(BTreeMap::new()),
            last_beat: Mutex::new(None),
            bugs: Mutex::new(EphemeralBugs::default()),
            peers,
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
    pub fn set_bugs(&self, bugs: EphemeralBugs) {
        *lock(&self.bugs) = bugs;
        lock(&self.store).set_bugs(bugs);
    }

    /// How long this broker must have been alive to take over a lapsed owner's queues.
    pub fn takeover_after_ms(&self) -> u64 {
        ownership::takeover_after_ms(*lock(&self.bugs))
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

    /// What a parked pop waits on: its (queue, group, partition) key's FIFO of waiters.
    pub fn parked(&self, key: &WakeKey) -> Arc<Notify> {
        lock(&self.wakes).entry(key.clone()).or_default().clone()
    }

    /// Forgets a key nobody waits on (its last pop left and dropped its handle).
    pub fn unparked(&self, key: &WakeKey) {
        let mut wakes = lock(&self.wakes);
        if wakes.get(key).is_some_and(|n| Arc::strong_count(n) == 1) {
            wakes.remove(key);
        }
    }

    /// The keys of one queue's parked pops, with their waiters.
    fn keys_of(&self, queue: &str) -> Vec<(WakeKey, Arc<Notify>)> {
        let from: WakeKey = (queue.to_string(), String::new(), None);
        lock(&self.wakes)
            .range(from..)
            .take_while(|(k, _)| k.0 == queue)
            .map(|(k, n)| (k.clone(), n.clone()))
            .collect()
    }

    /// A push to (queue, partition): one parked pop of each group that may take it (queue-wide,
    /// or of that partition). No herd: a push wakes one consumer a group, and that consumer
    /// passes the wake on when it leaves work behind (`pass_on`).
    pub fn pushed(&self, queue: &str, partition: &str) {
        let queue_wide_only = lock(&self.bugs).wake_queue_wide_only;
        for ((_, _, p), n) in self.keys_of(queue) {
            let mine = match p.as_deref() {
                None => true,
                Some(p) => p == partition && !queue_wide_only,
            };
            if mine {
                n.notify_one();
            }
        }
    }

    /// A group's partition lease ended or a message came back (an ack): one pop of the group.
    pub fn released(&self, queue: &str, group: &str) {
        for ((_, g, _), n) in self.keys_of(queue) {
            if g == group {
                n.notify_one();
            }
        }
    }

    /// A woken queue-wide pop left work its group could take: the next parked one looks.
    pub fn pass_on(&self, queue: &str, group: &str) {
        if let Some(n) = lock(&self.wakes).get(&(queue.to_string(), group.to_string(), None)) {
            n.notify_one();
        }
    }

    /// Everything about a queue changed (a reset, a delete, lost ownership): every parked pop
    /// of it looks again.
    pub fn wake_all(&self, queue: &str) {
        for (_, n) in self.keys_of(queue) {
            n.notify_waiters();
        }
    }

    /// A renewal of this broker's liveness, sent at `sent`, was stored; `stored` is when its
    /// answer came. If the renewal before it was past the fence by then, this broker was lapsed
    /// meanwhile, whether or not a call saw it (a call seeing it ends it in `serving`): the lapse
    /// ends the same way, before the new renewal counts, so no call in between trusts an owner
    /// resolved before the lapse. The rings it leaves unresolved are for `unresolved_rings`.
    pub fn beat_stored(&self, sent: Timestamp, stored: Timestamp) {
        let bugs = *lock(&self.bugs);
        let previous = *lock(&self.last_beat);
        if !bugs.lapse_seen_only_by_calls && !ownership::serving(previous, stored, bugs) {
            self.resolve_owners_afresh();
        }
        let mut last = lock(&self.last_beat);
        *last = Some(last.map_or(sent, |t| t.max(sent)));
    }

    /// Queues whose ring this broker holds but whose owner nobody resolved since a lapse: each
    /// is claimed again (`claimed`), which keeps the ring if nobody took the queue meanwhile
    /// and drops it if somebody did, rather than leaving it in memory until a call for it comes.
    pub fn unresolved_rings(&self) -> Vec<String> {
        let held: Vec<String> = lock(&self.held).keys().cloned().collect();
        let owners = lock(&self.owners);
        held.into_iter()
            .filter(|q| !owners.contains_key(q))
            .collect()
    }

    /// This broker stops owning anything at once (it is shutting down and leaves storage's list
    /// of live brokers, after which another may claim its queues without waiting).
    pub fn resign(&self) {
        *lock(&self.last_beat) = None;
        let dropped = {
            lock(&self.owners).clear();
            lock(&self.held).clear();
            lock(&self.store).clear()
        };
        for queue in dropped {
            self.wake_all(&queue);
        }
    }

    /// Whether this broker may serve the queues it owns at `now`. When it may not (its liveness
    /// lapsed: another broker may claim them), it stops serving: owners are resolved afresh, and
    /// the parked pops answer. Its rings stay, each kept only if its next claim finds that
    /// nobody held the queue meanwhile (`claimed`), so a database restart loses nothing when no
    /// other broker took over.
    pub fn serving(&self, now: Timestamp) -> bool {
        if self.address.is_none() {
            return true;
        }
        let last = *lock(&self.last_beat);
        if ownership::serving(last, now, *lock(&self.bugs)) {
            return true;
        }
        self.resolve_owners_afresh();
        false
    }

    /// Forgets every resolved owner and wakes the pops parked on this broker's own queues, so
    /// they answer and every next call claims its queue again.
    fn resolve_owners_afresh(&self) {
        let owned: Vec<String> = std::mem::take(&mut *lock(&self.owners))
            .into_iter()
            .filter(|(_, o)| *o == Owner::Local)
            .map(|(q, _)| q)
            .collect();
        for queue in owned {
            self.wake_all(&queue);
        }
    }

    /// Records what a claim answered for `queue` and says where its ring is. A ring this broker
    /// held under another epoch (the queue changed hands meanwhile), or holds for a queue another
    /// broker owns now, is dropped.
    pub fn claimed(&self, queue: &str, claim: &EphemeralClaim) -> Owner {
        let bugs = *lock(&self.bugs);
        let mine = claim.owner.incarnation == self.incarnation;
        let mut held = lock(&self.held);
        let kept = mine && ownership::keeps_ring(held.get(queue).copied(), claim.epoch, bugs);
        if !kept && lock(&self.store).delete(queue) {
            drop(held);
            self.wake_all(queue);
            held = lock(&self.held);
        }
        let owner = if mine {
            held.insert(queue.to_string(), claim.epoch);
            Owner::Local
        } else {
            held.remove(queue);
            Owner::Remote(claim.owner.address.clone())
        };
        drop(held);
        self.note_owner(queue, owner.clone());
        owner
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
