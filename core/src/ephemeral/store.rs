//! A broker's ephemeral queues: every verb (configure, push, pop, ack, reset, delete, depth),
//! over the queues' rings.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::types::Timestamp;

use super::queue::evict_until;
use super::{
    not_found, AckOutcome, AckStatus, Cursor, Delivery, DeliveryId, EphemeralBugs, EphemeralError,
    EphemeralOptions, EphemeralStore, ErrorKind, FullPolicy, Lease, Message, PopRequest, Queue,
    QUEUE_MODE,
};

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
