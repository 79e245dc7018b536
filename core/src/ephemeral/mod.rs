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
//!
//! Rooms: `queue.rs` (one queue's rings, cursors and leases), `store.rs` (a broker's queues:
//! every verb), `ownership.rs` (which broker holds a queue's ring).

mod queue;
mod store;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Value};

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

pub mod ownership;

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
