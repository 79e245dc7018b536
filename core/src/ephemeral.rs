//! Ephemeral queues, sans-IO: rings in a broker's memory whose contents survive nothing (a
//! restart empties them) and whose configuration is kept by storage. Here are the whole rules:
//! the bounds and what a full queue does, per-group cursors over one ring, partition leases,
//! redelivery with `attempts` until `retryLimit`, the ack outcomes, and the ids that fence an
//! incarnation. Time arrives as an argument; nothing here reads a clock.
//!
//! - **One ring per (queue, partition)**, FIFO by push order. Every consumer group has its own
//!   cursor over it (fan-out); the consumers of one group share it: a pop leases one partition to
//!   one consumer of the group until its messages are acked or the lease expires, as on durable
//!   queues, which is what keeps FIFO per partition with competing consumers. Groupless pops are
//!   the group [`QUEUE_MODE`].
//! - **A message leaves the ring** when every group that exists (from its first pop, parked or
//!   not) has completed it, when the ring's bounds evict it (`policy: drop_oldest`), when it is older than `ttlSeconds`, or when it failed
//!   `retryLimit` redeliveries (dropped and counted: no DLQ). A group created later starts at the
//!   oldest message still held.
//! - **Ids** are `incarnation.generation.partition.seq.attempt` in hex. The incarnation is the
//!   broker process's, the generation the queue's (a reset or delete starts a new one), so an ack
//!   carried across a restart or a reset answers `stale` and never acks another message.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Map, Value};

use crate::types::{validate_name, Timestamp};

/// The group of groupless pops and acks (queue mode).
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";
/// The partition of a push or pop that names none.
pub const DEFAULT_PARTITION: &str = "Default";
/// Messages one pop may take.
pub const MAX_BATCH: u32 = 10_000;
/// The longest lease, TTL and window a queue may declare (a day), so deadlines stay in range.
const MAX_SECONDS: u64 = 86_400;

/// What a push to a full queue does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullPolicy {
    /// The push is refused whole (429 `ephemeral_queue_full`); nothing of it is stored.
    Reject,
    /// The oldest messages of the queue (any partition) are dropped to make room: feed semantics.
    DropOldest,
}

impl FullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FullPolicy::Reject => "reject",
            FullPolicy::DropOldest => "drop_oldest",
        }
    }
}

/// `windowBuffer`: a waiting pop that finds fewer than `count` messages waits up to `ms` for more
/// before it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBuffer {
    pub ms: u64,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralOptions {
    pub max_bytes: u64,
    pub max_length: u64,
    pub policy: FullPolicy,
    pub ttl_ms: Option<u64>,
    pub lease_ms: u64,
    pub retry_limit: u32,
    pub window_buffer: Option<WindowBuffer>,
}

impl Default for EphemeralOptions {
    fn default() -> Self {
        EphemeralOptions {
            max_bytes: 64 * 1024 * 1024,
            max_length: 100_000,
            policy: FullPolicy::Reject,
            ttl_ms: None,
            lease_ms: 30_000,
            retry_limit: 3,
            window_buffer: None,
        }
    }
}

/// Why a call was refused; `code` is the wire's `body.code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralError {
    pub kind: ErrorKind,
    pub code: &'static str,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client's mistake: 400.
    Invalid,
    /// The queue is at its bounds under `policy: reject`: 429.
    Full,
    /// The broker's memory budget for every ephemeral queue is spent: 503.
    Budget,
    /// `depth` of a queue that does not exist: 404.
    NotFound,
}

fn invalid(message: impl Into<String>) -> EphemeralError {
    EphemeralError {
        kind: ErrorKind::Invalid,
        code: "ephemeral_invalid_request",
        message: message.into(),
    }
}

fn whole(v: &Value, name: &str, min: u64, max: u64) -> Result<u64, EphemeralError> {
    v.as_u64()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            invalid(format!(
                "options.{name} must be an integer in {min}..={max}"
            ))
        })
}

impl EphemeralOptions {
    /// Reads `configure`'s `options` over the defaults. The list is closed: an unknown option is
    /// refused, since each one bounds something and a dropped one is a bound that is not there.
    pub fn parse(options: &Value) -> Result<EphemeralOptions, EphemeralError> {
        let mut out = EphemeralOptions::default();
        let map = match options {
            Value::Null => return Ok(out),
            Value::Object(m) => m,
            _ => return Err(invalid("options must be an object")),
        };
        for (key, v) in map {
            if v.is_null() {
                continue;
            }
            match key.as_str() {
                "maxBytes" => out.max_bytes = whole(v, key, 1, u64::from(u32::MAX) * 16)?,
                "maxLength" => out.max_length = whole(v, key, 1, 100_000_000)?,
                "policy" => {
                    out.policy = match v.as_str() {
                        Some("reject") => FullPolicy::Reject,
                        Some("drop_oldest") => FullPolicy::DropOldest,
                        _ => return Err(invalid("options.policy is reject or drop_oldest")),
                    }
                }
                "ttlSeconds" => {
                    let s = whole(v, key, 0, MAX_SECONDS)?;
                    out.ttl_ms = (s > 0).then_some(s * 1000);
                }
                "leaseSeconds" => out.lease_ms = whole(v, key, 1, MAX_SECONDS)? * 1000,
                "retryLimit" => out.retry_limit = whole(v, key, 0, 1000)? as u32,
                "windowBuffer" => {
                    let ms = whole(&v["ms"], "windowBuffer.ms", 0, MAX_SECONDS * 1000)?;
                    let count = whole(&v["count"], "windowBuffer.count", 1, MAX_BATCH.into())?;
                    out.window_buffer = (ms > 0).then_some(WindowBuffer {
                        ms,
                        count: count as u32,
                    });
                }
                other => {
                    return Err(invalid(format!(
                        "unknown option {other}: the options are maxBytes, maxLength, policy, \
                         ttlSeconds, leaseSeconds, retryLimit, windowBuffer"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// The options as the wire spells them, every one resolved.
    pub fn to_json(&self) -> Value {
        json!({
            "maxBytes": self.max_bytes,
            "maxLength": self.max_length,
            "policy": self.policy.as_str(),
            "ttlSeconds": self.ttl_ms.map_or(0, |ms| ms / 1000),
            "leaseSeconds": self.lease_ms / 1000,
            "retryLimit": self.retry_limit,
            "windowBuffer": self.window_buffer.map(|w| json!({"ms": w.ms, "count": w.count})),
        })
    }
}

/// Checks a queue, partition or group name.
pub fn check_name(what: &'static str, name: &str) -> Result<(), EphemeralError> {
    validate_name(what, name).map_err(|e| invalid(e.to_string()))
}

/// What an ack did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Taken: a completion removed the message from the group's work; a `failed` or `retry`
    /// returned it for redelivery (or dropped it at `retryLimit`).
    Acked,
    /// Too late: the delivery's lease had expired and the message was (or will be) delivered
    /// again; this ack changed nothing.
    Redelivered,
    /// The id belongs to an earlier incarnation of the broker or of the queue (restart, reset,
    /// delete): nothing of it is held.
    Stale,
    /// Not a delivery this ring knows: never an id, already completed, or dropped by a bound.
    Unknown,
}

impl AckOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AckOutcome::Acked => "acked",
            AckOutcome::Redelivered => "redelivered",
            AckOutcome::Stale => "stale",
            AckOutcome::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckStatus {
    Completed,
    /// `failed` or `retry`: deliver again (attempts + 1) until `retryLimit`.
    Retry,
}

impl AckStatus {
    pub fn parse(status: Option<&str>) -> Result<AckStatus, EphemeralError> {
        match status {
            None | Some("completed") | Some("success") => Ok(AckStatus::Completed),
            Some("failed") | Some("retry") => Ok(AckStatus::Retry),
            Some(other) => Err(invalid(format!(
                "ack status {other:?} is not completed, failed or retry"
            ))),
        }
    }
}

/// One delivered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: String,
    pub partition: String,
    /// The payload's JSON text, as pushed.
    pub payload: Box<str>,
    /// 1 on the first delivery.
    pub attempts: u32,
}

/// Messages a queue lost to its bounds, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Evicted by `policy: drop_oldest`.
    pub evicted: u64,
    /// Older than `ttlSeconds`.
    pub expired: u64,
    /// Failed past `retryLimit`.
    pub retry_limit: u64,
    /// Pushes refused whole (messages) by `policy: reject` or the broker's budget.
    pub rejected: u64,
}

struct Message {
    payload: Box<str>,
    pushed_at: Timestamp,
    /// Push order across the queue's partitions, for `drop_oldest`.
    order: u64,
}

struct Ring {
    name: String,
    /// The seq of `messages[0]`.
    base: u64,
    messages: VecDeque<Message>,
}

impl Ring {
    fn end(&self) -> u64 {
        self.base + self.messages.len() as u64
    }
    fn get(&self, seq: u64) -> Option<&Message> {
        seq.checked_sub(self.base)
            .and_then(|i| self.messages.get(usize::try_from(i).ok()?))
    }
}

struct Lease {
    until: Timestamp,
    /// Delivered under this lease and not acked yet: seq -> attempt.
    open: BTreeMap<u64, u32>,
}

/// One group's state over one partition's ring.
#[derive(Default)]
struct Cursor {
    /// The next seq never delivered to this group.
    next: u64,
    lease: Option<Lease>,
    /// Delivered, not completed, waiting to be delivered again: seq -> attempts so far.
    retry: BTreeMap<u64, u32>,
}

impl Cursor {
    /// The lowest seq this group has not completed.
    fn low(&self) -> u64 {
        let mut low = self.next;
        if let Some((s, _)) = self.retry.first_key_value() {
            low = low.min(*s);
        }
        if let Some((s, _)) = self.lease.as_ref().and_then(|l| l.open.first_key_value()) {
            low = low.min(*s);
        }
        low
    }
}

#[derive(Default)]
struct Group {
    /// By partition number.
    cursors: Vec<Cursor>,
    /// Where a pop naming no partition starts looking.
    turn: usize,
}

struct Queue {
    options: EphemeralOptions,
    generation: u64,
    rings: Vec<Ring>,
    by_name: BTreeMap<String, usize>,
    /// Every non-empty ring's front message as (push order, ring): the queue's oldest message is
    /// the first, for `drop_oldest`.
    fronts: BTreeSet<(u64, usize)>,
    next_order: u64,
    length: u64,
    bytes: u64,
    groups: BTreeMap<String, Group>,
    dropped: Dropped,
    pushed: u64,
    delivered: u64,
    completed: u64,
    /// The earliest lease deadline of any group (a hint: `None` means none is held).
    next_lease_end: Option<Timestamp>,
}

/// Every ephemeral queue of one broker.
pub struct EphemeralStore {
    incarnation: u64,
    bugs: EphemeralBugs,
    budget_bytes: u64,
    bytes: u64,
    next_generation: u64,
    queues: BTreeMap<String, Queue>,
}

/// Bugs a test can re-introduce into ephemeral queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EphemeralBugs {
    /// An owner keeps serving after its liveness lapsed (two rings for one queue once another
    /// broker claims it).
    pub serve_past_fence: bool,
    /// A push wakes only the queue-wide parked pops of each group, not those parked on its
    /// partition (they wait for their timeout).
    pub wake_queue_wide_only: bool,
    /// An owner back from a lapse keeps its ring even when the queue changed hands meanwhile
    /// (an older ring serves again after a newer one did).
    pub keep_ring_across_epochs: bool,
    /// Leases are counted in tenths of what was configured (a unit slip: ms taken for 100 µs),
    /// so a leased message is handed out again while its consumer still holds it.
    pub lease_units_slip: bool,
    /// `drop_oldest` stops one message short of the bound (the queue holds maxLength + 1).
    pub evict_one_short: bool,
    /// An expired lease seeks its group's cursor back to the lease's first open message instead
    /// of queueing its open deliveries for retry: what the group was already handed out after it
    /// comes again as new (attempt 1), behind later messages other pops were served.
    pub lease_expiry_rewinds: bool,
    /// A lapse of an owner's liveness is noticed only by a call made while it lasts: an owner
    /// that nobody called meanwhile serves its old ring again once it renews, though another
    /// broker took the queue in between (two rings for one queue), and a ring of a queue that
    /// moved stays in memory until a call for it comes.
    pub lapse_seen_only_by_calls: bool,
    /// A broker takes over the queues of an owner whose liveness ran out as soon as it is alive
    /// itself, even when it has only just come back: after a database outage longer than
    /// `ALIVE_MS` every broker's liveness has run out, and the first one called after it takes
    /// every queue it is called for from owners that had no chance to renew yet, dropping their
    /// rings.
    pub take_over_at_once: bool,
}

/// Which broker holds a queue's ring when several share one database. Each broker renews its
/// liveness every [`ownership::HEARTBEAT_MS`] for [`ownership::ALIVE_MS`] on storage's clock, and
/// a queue whose owner is not alive may be claimed by another. An owner serves only while its
/// last renewal *sent* is younger than [`ownership::FENCE_MS`]: a renewal sent at `t` lands at or
/// after `t`, so its row lives until at least `t + ALIVE_MS`, and nobody can claim the queue until
/// the owner has stopped serving it, with `ALIVE_MS - FENCE_MS` to spare for the clocks' rates.
pub mod ownership {
    use super::EphemeralBugs;
    use crate::types::Timestamp;

    pub const HEARTBEAT_MS: u64 = 1000;
    pub const ALIVE_MS: u64 = 5000;
    pub const FENCE_MS: u64 = 3500;
    /// A broker takes over the queues of an owner whose liveness ran out only once it has itself
    /// been alive without a break for this long (storage's clock). A database outage longer than
    /// `ALIVE_MS` runs every broker's liveness out; when the database is back, each renews within
    /// `HEARTBEAT_MS`, so an owner that is still there renews before anyone may take its queues,
    /// and keeps their rings (`keeps_ring`). An owner that crashed is taken over once a broker
    /// alive throughout sees its liveness run out, as before; one that shut down left and is
    /// taken over at once.
    pub const TAKEOVER_AFTER_MS: u64 = ALIVE_MS;

    /// How long a broker must have been alive to take over a lapsed owner's queues.
    pub fn takeover_after_ms(bugs: EphemeralBugs) -> u64 {
        if bugs.take_over_at_once {
            0
        } else {
            TAKEOVER_AFTER_MS
        }
    }

    /// Whether an owner that held a queue's ring under epoch `held` keeps it once a claim answers
    /// it the owner under `claimed`: only if nobody held the queue in between (the same epoch).
    /// Otherwise the ring is dropped and the queue starts empty.
    pub fn keeps_ring(held: Option<i64>, claimed: i64, bugs: EphemeralBugs) -> bool {
        held == Some(claimed) || (bugs.keep_ring_across_epochs && held.is_some())
    }

    /// Whether a broker whose last successful renewal was sent at `last_sent` may serve as an
    /// owner at `now`.
    pub fn serving(last_sent: Option<Timestamp>, now: Timestamp, bugs: EphemeralBugs) -> bool {
        match last_sent {
            None => false,
            Some(_) if bugs.serve_past_fence => true,
            Some(t) => now.0 - t.0 < (FENCE_MS as i64) * 1000,
        }
    }
}

/// The parts of a delivery id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DeliveryId {
    incarnation: u64,
    generation: u64,
    partition: usize,
    seq: u64,
    attempt: u32,
}

impl DeliveryId {
    fn format(&self) -> String {
        format!(
            "{:x}.{:x}.{:x}.{:x}.{:x}",
            self.incarnation, self.generation, self.partition, self.seq, self.attempt
        )
    }
    fn parse(id: &str) -> Option<DeliveryId> {
        let mut parts = id.split('.');
        let mut next = || u64::from_str_radix(parts.next()?, 16).ok();
        let out = DeliveryId {
            incarnation: next()?,
            generation: next()?,
            partition: usize::try_from(next()?).ok()?,
            seq: next()?,
            attempt: u32::try_from(next()?).ok()?,
        };
        parts.next().is_none().then_some(out)
    }
}

/// A pop's request.
#[derive(Clone, Debug)]
pub struct PopRequest<'a> {
    pub partition: Option<&'a str>,
    pub group: &'a str,
    pub batch: u32,
    /// Commit at delivery: no lease, nothing to ack, at-most-once.
    pub auto_ack: bool,
}

impl Queue {
    fn new(options: EphemeralOptions, generation: u64) -> Queue {
        Queue {
            options,
            generation,
            rings: vec![],
            by_name: BTreeMap::new(),
            fronts: BTreeSet::new(),
            next_order: 0,
            length: 0,
            bytes: 0,
            groups: BTreeMap::new(),
            dropped: Dropped::default(),
            pushed: 0,
            delivered: 0,
            completed: 0,
            next_lease_end: None,
        }
    }

    fn ring_of(&mut self, partition: &str) -> usize {
        if let Some(i) = self.by_name.get(partition) {
            return *i;
        }
        self.rings.push(Ring {
            name: partition.to_string(),
            base: 0,
            messages: VecDeque::new(),
        });
        let i = self.rings.len() - 1;
        self.by_name.insert(partition.to_string(), i);
        i
    }

    /// Removes the front message of a ring (counted by the caller's cause); groups' state below
    /// the new base is forgotten, so an ack of it answers `unknown`.
    fn drop_front(&mut self, ring: usize) -> u64 {
        let r = &mut self.rings[ring];
        let Some(m) = r.messages.pop_front() else {
            return 0;
        };
        let gone = r.base;
        r.base += 1;
        self.fronts.remove(&(m.order, ring));
        if let Some(next) = r.messages.front() {
            self.fronts.insert((next.order, ring));
        }
        let bytes = m.payload.len() as u64;
        self.length -= 1;
        self.bytes -= bytes;
        for g in self.groups.values_mut() {
            if let Some(c) = g.cursors.get_mut(ring) {
                c.next = c.next.max(gone + 1);
                c.retry.remove(&gone);
                if let Some(l) = c.lease.as_mut() {
                    l.open.remove(&gone);
                    if l.open.is_empty() {
                        c.lease = None;
                    }
                }
            }
        }
        bytes
    }

    /// Drops the messages every group has completed from the fronts of `ring` (only when some
    /// group exists: with none, what is pushed waits for the first).
    fn trim(&mut self, ring: usize) -> u64 {
        if self.groups.is_empty() {
            return 0;
        }
        let low = self
            .groups
            .values()
            .map(|g| {
                g.cursors
                    .get(ring)
                    .map_or(self.rings[ring].base, Cursor::low)
            })
            .min()
            .unwrap_or(0);
        let mut freed = 0;
        while self.rings[ring].base < low && !self.rings[ring].messages.is_empty() {
            freed += self.drop_front(ring);
        }
        freed
    }

    /// Drops messages older than the TTL from every ring's front.
    fn expire(&mut self, now: Timestamp) -> u64 {
        let Some(ttl) = self.options.ttl_ms else {
            return 0;
        };
        let cutoff = now.0.saturating_sub(ttl.saturating_mul(1000) as i64);
        let mut freed = 0;
        for ring in 0..self.rings.len() {
            while self.rings[ring]
                .messages
                .front()
                .is_some_and(|m| m.pushed_at.0 <= cutoff)
            {
                freed += self.drop_front(ring);
                self.dropped.expired += 1;
            }
        }
        freed
    }

    /// Ends the leases that ran out: their open deliveries wait for redelivery, or are dropped at
    /// `retryLimit`.
    fn end_leases(&mut self, now: Timestamp, bugs: EphemeralBugs) -> u64 {
        match self.next_lease_end {
            Some(t) if t <= now => {}
            _ => return 0,
        }
        let limit = self.options.retry_limit;
        let mut over: Vec<(usize, u64)> = vec![];
        let mut next_end: Option<Timestamp> = None;
        for g in self.groups.values_mut() {
            for (ring, c) in g.cursors.iter_mut().enumerate() {
                let Some(lease) = c.lease.take() else {
                    continue;
                };
                if lease.until > now {
                    next_end = Some(next_end.map_or(lease.until, |t| t.min(lease.until)));
                    c.lease = Some(lease);
                    continue;
                }
                if bugs.lease_expiry_rewinds {
                    if let Some((&first, _)) = lease.open.first_key_value() {
                        c.next = c.next.min(first);
                    }
                    continue;
                }
                for (seq, attempt) in lease.open {
                    if attempt > limit {
                        over.push((ring, seq));
                    } else {
                        c.retry.insert(seq, attempt);
                    }
                }
            }
        }
        self.next_lease_end = next_end;
        self.dropped.retry_limit += over.len() as u64;
        let mut freed = 0;
        for ring in over.iter().map(|(r, _)| *r).collect::<BTreeSet<_>>() {
            freed += self.trim(ring);
        }
        freed
    }

    fn note_lease(&mut self, until: Timestamp) {
        self.next_lease_end = Some(self.next_lease_end.map_or(until, |t| t.min(until)));
    }

    /// Whether a group has anything to deliver in a ring now (its partition not leased).
    fn has_work(&self, group: Option<&Group>, ring: usize) -> bool {
        let r = &self.rings[ring];
        match group.and_then(|g| g.cursors.get(ring)) {
            None => !r.messages.is_empty(),
            Some(c) => c.lease.is_none() && (!c.retry.is_empty() || c.next < r.end()),
        }
    }

    fn available(&self, group: Option<&Group>, ring: usize) -> u64 {
        let r = &self.rings[ring];
        match group.and_then(|g| g.cursors.get(ring)) {
            None => r.messages.len() as u64,
            Some(c) if c.lease.is_some() => 0,
            Some(c) => c.retry.len() as u64 + r.end().saturating_sub(c.next.max(r.base)),
        }
    }
}

impl EphemeralStore {
    /// `incarnation` tells this process's deliveries from an earlier one's (a random number at
    /// start); `budget_bytes` bounds the payload bytes of every queue together.
    pub fn new(incarnation: u64, budget_bytes: u64) -> EphemeralStore {
        EphemeralStore {
            incarnation,
            bugs: EphemeralBugs::default(),
            budget_bytes,
            bytes: 0,
            next_generation: 1,
            queues: BTreeMap::new(),
        }
    }

    pub fn exists(&self, queue: &str) -> bool {
        self.queues.contains_key(queue)
    }

    /// Re-introduces bugs (tests proving the checks catch them).
    pub fn set_bugs(&mut self, bugs: EphemeralBugs) {
        self.bugs = bugs;
    }

    /// Payload bytes held by every queue.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Creates a queue with `options` if it is not there (a push or pop creates implicitly, with
    /// the options storage kept for it or the defaults).
    pub fn ensure(&mut self, queue: &str, options: impl FnOnce() -> EphemeralOptions) {
        if !self.queues.contains_key(queue) {
            let generation = self.next_generation;
            self.next_generation += 1;
            self.queues
                .insert(queue.to_string(), Queue::new(options(), generation));
        }
    }

    /// Declares (or re-declares) a queue's bounds. Contents stay; a `drop_oldest` queue now over
    /// its bounds drops its oldest at once.
    pub fn configure(&mut self, queue: &str, options: EphemeralOptions) {
        self.ensure(queue, || options.clone());
        if let Some(q) = self.queues.get_mut(queue) {
            q.options = options;
            if q.options.policy == FullPolicy::DropOldest {
                let (max_len, max_bytes) = (q.options.max_length, q.options.max_bytes);
                let slack = u64::from(self.bugs.evict_one_short);
                let freed = evict_until(q, |q| q.length <= max_len + slack && q.bytes <= max_bytes);
                self.bytes -= freed;
            }
        }
    }

    pub fn options(&self, queue: &str) -> Option<&EphemeralOptions> {
        self.queues.get(queue).map(|q| &q.options)
    }

    /// Drops every message, lease and cursor of a queue; its options stay. Answers how many
    /// messages were dropped.
    pub fn reset(&mut self, queue: &str) -> u64 {
        let generation = self.next_generation;
        let Some(q) = self.queues.get_mut(queue) else {
            return 0;
        };
        self.next_generation += 1;
        let dropped = q.length;
        self.bytes -= q.bytes;
        *q = Queue::new(q.options.clone(), generation);
        dropped
    }

    /// Drops every queue (a broker that stopped owning them: contents are lost, and acks of
    /// what they delivered answer `stale`). Answers their names.
    pub fn clear(&mut self) -> Vec<String> {
        self.bytes = 0;
        std::mem::take(&mut self.queues).into_keys().collect()
    }

    /// Removes a queue; answers whether it was there.
    pub fn delete(&mut self, queue: &str) -> bool {
        match self.queues.remove(queue) {
            Some(q) => {
                self.bytes -= q.bytes;
                true
            }
            None => false,
        }
    }

    /// Appends payloads (JSON texts) to a partition's ring, all or nothing. The queue must exist
    /// ([`EphemeralStore::ensure`]).
    pub fn push(
        &mut self,
        queue: &str,
        partition: &str,
        payloads: Vec<Box<str>>,
        now: Timestamp,
    ) -> Result<u64, EphemeralError> {
        let Some(q) = self.queues.get_mut(queue) else {
            return Err(not_found(queue));
        };
        self.bytes -= q.expire(now) + q.end_leases(now, self.bugs);
        let n = payloads.len() as u64;
        let size: u64 = payloads.iter().map(|p| p.len() as u64).sum();
        let (max_len, max_bytes) = (q.options.max_length, q.options.max_bytes);
        let refuse = |q: &mut Queue, kind, code, message: String| {
            q.dropped.rejected += n;
            Err(EphemeralError {
                kind,
                code,
                message,
            })
        };
        if n > max_len || size > max_bytes {
            return refuse(
                q,
                ErrorKind::Full,
                "ephemeral_queue_full",
                format!(
                    "{queue}: a push of {n} messages ({size} bytes) is larger than the queue's \
                     bounds (maxLength {max_len}, maxBytes {max_bytes})"
                ),
            );
        }
        let slack = u64::from(self.bugs.evict_one_short);
        let fits = |q: &Queue| q.length + n <= max_len + slack && q.bytes + size <= max_bytes;
        if !fits(q) {
            match q.options.policy {
                FullPolicy::Reject => {
                    return refuse(
                        q,
                        ErrorKind::Full,
                        "ephemeral_queue_full",
                        format!(
                            "{queue} is full ({} messages, {} bytes; maxLength {max_len}, \
                             maxBytes {max_bytes}, policy reject): nothing was stored",
                            q.length, q.bytes
                        ),
                    )
                }
                FullPolicy::DropOldest => {
                    // Only what must go: the budget check below may still refuse the push, and
                    // then these were dropped for a push that is not stored; a drop_oldest queue
                    // over the broker's budget sheds its oldest either way.
                    let freed = evict_until(q, fits);
                    self.bytes -= freed;
                }
            }
        }
        if self.bytes + size > self.budget_bytes {
            return refuse(
                q,
                ErrorKind::Budget,
                "ephemeral_budget_exhausted",
                format!(
                    "the broker's ephemeral budget ({} bytes, EPHEMERAL_MAX_BYTES) is spent: \
                     nothing was stored",
                    self.budget_bytes
                ),
            );
        }
        let ring = q.ring_of(partition);
        let r = &mut q.rings[ring];
        if r.messages.is_empty() {
            q.fronts.insert((q.next_order, ring));
        }
        for payload in payloads {
            r.messages.push_back(Message {
                payload,
                pushed_at: now,
                order: q.next_order,
            });
            q.next_order += 1;
        }
        q.length += n;
        q.bytes += size;
        q.pushed += n;
        self.bytes += size;
        Ok(n)
    }

    /// Makes `group` exist (a parked pop's group): from now on messages are held for it until it
    /// completes them, as for a group that took some.
    pub fn join(&mut self, queue: &str, group: &str) {
        if let Some(q) = self.queues.get_mut(queue) {
            q.groups.entry(group.to_string()).or_default();
        }
    }

    /// Whether `group` would get a message from a pop now, and how many (for `windowBuffer`).
    pub fn available(
        &mut self,
        queue: &str,
        partition: Option<&str>,
        group: &str,
        now: Timestamp,
    ) -> u64 {
        let Some(q) = self.queues.get_mut(queue) else {
            return 0;
        };
        self.bytes -= q.expire(now) + q.end_leases(now, self.bugs);
        let g = q.groups.get(group);
        match partition {
            Some(p) => q.by_name.get(p).map_or(0, |r| q.available(g, *r)),
            None => (0..q.rings.len())
                .map(|r| q.available(g, r))
                .max()
                .unwrap_or(0),
        }
    }

    /// When the next lease of a queue runs out (a parked pop waits no longer than this).
    pub fn next_lease_end(&self, queue: &str) -> Option<Timestamp> {
        self.queues.get(queue).and_then(|q| q.next_lease_end)
    }

    /// Takes up to `batch` messages from one partition for a group: first those waiting for
    /// redelivery, then new ones, in seq order. Without `auto_ack` the partition is leased to
    /// this pop for `leaseSeconds`. The queue must exist.
    pub fn pop(
        &mut self,
        queue: &str,
        req: &PopRequest<'_>,
        now: Timestamp,
    ) -> Result<Vec<Delivery>, EphemeralError> {
        let incarnation = self.incarnation;
        let Some(q) = self.queues.get_mut(queue) else {
            return Err(not_found(queue));
        };
        self.bytes -= q.expire(now) + q.end_leases(now, self.bugs);
        // A pop makes its group exist even when it finds nothing: what is pushed from now on is
        // held for the group until it completes it.
        q.groups.entry(req.group.to_string()).or_default();
        let ring = {
            let g = q.groups.get(req.group);
            match req.partition {
                Some(p) => q.by_name.get(p).copied().filter(|r| q.has_work(g, *r)),
                None => {
                    let n = q.rings.len();
                    let start = g.map_or(0, |g| g.turn);
                    (0..n)
                        .map(|i| (start + i) % n.max(1))
                        .find(|r| q.has_work(g, *r))
                }
            }
        };
        let Some(ring) = ring else {
            return Ok(vec![]);
        };
        let rings_len = q.rings.len();
        let base = q.rings[ring].base;
        let end = q.rings[ring].end();
        let group = q.groups.entry(req.group.to_string()).or_default();
        group.turn = (ring + 1) % rings_len;
        while group.cursors.len() < rings_len {
            let b = q.rings[group.cursors.len()].base;
            group.cursors.push(Cursor {
                next: b,
                ..Cursor::default()
            });
        }
        let c = &mut group.cursors[ring];
        c.next = c.next.max(base);
        let mut taken: Vec<(u64, u32)> = vec![];
        while taken.len() < req.batch as usize {
            match c.retry.pop_first() {
                Some((seq, attempts)) => taken.push((seq, attempts + 1)),
                None => break,
            }
        }
        while taken.len() < req.batch as usize && c.next < end {
            taken.push((c.next, 1));
            c.next += 1;
        }
        let lease_us = (q.options.lease_ms as i64)
            * if self.bugs.lease_units_slip {
                100
            } else {
                1000
            };
        let lease_until = Timestamp(now.0 + lease_us);
        if !req.auto_ack {
            c.lease = Some(Lease {
                until: lease_until,
                open: taken.iter().copied().collect(),
            });
        }
        let r = &q.rings[ring];
        let out: Vec<Delivery> = taken
            .iter()
            .filter_map(|(seq, attempt)| {
                let m = r.get(*seq)?;
                Some(Delivery {
                    id: DeliveryId {
                        incarnation,
                        generation: q.generation,
                        partition: ring,
                        seq: *seq,
                        attempt: *attempt,
                    }
                    .format(),
                    partition: r.name.clone(),
                    payload: m.payload.clone(),
                    attempts: *attempt,
                })
            })
            .collect();
        debug_assert_eq!(out.len(), taken.len(), "a taken seq is in the ring");
        q.delivered += out.len() as u64;
        if req.auto_ack {
            q.completed += out.len() as u64;
            self.bytes -= q.trim(ring);
        } else {
            q.note_lease(lease_until);
        }
        Ok(out)
    }

    /// Acks one delivery for a group.
    pub fn ack(
        &mut self,
        queue: &str,
        group: &str,
        id: &str,
        status: AckStatus,
        now: Timestamp,
    ) -> AckOutcome {
        let Some(d) = DeliveryId::parse(id) else {
            return AckOutcome::Unknown;
        };
        if d.incarnation != self.incarnation {
            return AckOutcome::Stale;
        }
        let Some(q) = self.queues.get_mut(queue) else {
            return AckOutcome::Stale;
        };
        if d.generation != q.generation {
            return AckOutcome::Stale;
        }
        self.bytes -= q.expire(now) + q.end_leases(now, self.bugs);
        let limit = q.options.retry_limit;
        let Some(c) = q
            .groups
            .get_mut(group)
            .and_then(|g| g.cursors.get_mut(d.partition))
        else {
            return AckOutcome::Unknown;
        };
        let leased = c.lease.as_ref().and_then(|l| l.open.get(&d.seq).copied());
        match leased {
            Some(attempt) if attempt == d.attempt => {}
            Some(_) => return AckOutcome::Redelivered,
            None if c.retry.contains_key(&d.seq) => return AckOutcome::Redelivered,
            None => return AckOutcome::Unknown,
        }
        if let Some(lease) = c.lease.as_mut() {
            lease.open.remove(&d.seq);
            if lease.open.is_empty() {
                c.lease = None;
            }
        }
        match status {
            AckStatus::Completed => q.completed += 1,
            AckStatus::Retry if d.attempt > limit => q.dropped.retry_limit += 1,
            AckStatus::Retry => {
                c.retry.insert(d.seq, d.attempt);
            }
        }
        self.bytes -= q.trim(d.partition);
        AckOutcome::Acked
    }

    /// `depth`: the gauges of one queue, or `None` when it does not exist.
    pub fn depth(&mut self, queue: &str, now: Timestamp) -> Option<Value> {
        let q = self.queues.get_mut(queue)?;
        self.bytes -= q.expire(now) + q.end_leases(now, self.bugs);
        let q = self.queues.get(queue)?;
        let groups: Vec<Value> = q
            .groups
            .iter()
            .map(|(name, g)| {
                let (mut pending, mut in_flight, mut waiting) = (0u64, 0u64, 0u64);
                for (ring, r) in q.rings.iter().enumerate() {
                    match g.cursors.get(ring) {
                        Some(c) => {
                            pending += r.end().saturating_sub(c.next.max(r.base));
                            in_flight += c.lease.as_ref().map_or(0, |l| l.open.len() as u64);
                            waiting += c.retry.len() as u64;
                        }
                        None => pending += r.messages.len() as u64,
                    }
                }
                json!({
                    "group": if name == QUEUE_MODE { Value::Null } else { json!(name) },
                    "pending": pending + waiting,
                    "inFlight": in_flight,
                    "awaitingRedelivery": waiting,
                })
            })
            .collect();
        let partitions: Map<String, Value> = q
            .rings
            .iter()
            .filter(|r| !r.messages.is_empty())
            .map(|r| (r.name.clone(), json!(r.messages.len())))
            .collect();
        Some(json!({
            "queue": queue,
            "length": q.length,
            "bytes": q.bytes,
            "partitions": partitions,
            "groups": groups,
            "pushed": q.pushed,
            "delivered": q.delivered,
            "completed": q.completed,
            "dropped": {
                "evicted": q.dropped.evicted,
                "expired": q.dropped.expired,
                "retryLimit": q.dropped.retry_limit,
                "rejected": q.dropped.rejected,
            },
            "options": q.options.to_json(),
        }))
    }

    /// `queues`: every queue with its length, bytes and options, by name.
    pub fn list(&self) -> Vec<Value> {
        self.queues
            .iter()
            .map(|(name, q)| {
                json!({
                    "queue": name,
                    "length": q.length,
                    "bytes": q.bytes,
                    "partitions": q.rings.len(),
                    "groups": q.groups.len(),
                    "options": q.options.to_json(),
                })
            })
            .collect()
    }
}

/// Drops a queue's oldest messages (any partition) until `fits`; answers the bytes freed.
fn evict_until(q: &mut Queue, fits: impl Fn(&Queue) -> bool) -> u64 {
    let mut freed = 0;
    while !fits(q) {
        let Some(&(_, ring)) = q.fronts.first() else {
            break;
        };
        freed += q.drop_front(ring);
        q.dropped.evicted += 1;
    }
    freed
}

/// The one 404 of the family that is about data: the queue is not there.
pub fn not_found(queue: &str) -> EphemeralError {
    EphemeralError {
        kind: ErrorKind::NotFound,
        code: "ephemeral_queue_not_found",
        message: format!("ephemeral queue {queue} does not exist"),
    }
}

#[cfg(test)]
mod tests;
