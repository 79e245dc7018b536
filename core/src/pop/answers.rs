//! What a storage answer does to a pop: verdicts back into the ring, a delivery, a hand-off of
//! the wake, another look, or a park.

use super::context::{CachedConfig, PopContext};
use super::io::{PopEffect, PopReply, StorageCommand, StorageReply};
use super::{PermitRound, Phase, PopMachine, Work};
use crate::params::PopShape;
use crate::ring::Candidate;
use crate::storage::{PopResult, StorageError, StorageResult, Verdict};
use crate::types::Timestamp;

impl PopMachine {
    pub(super) fn on_storage(
        &mut self,
        work: Work,
        round: PermitRound,
        result: StorageResult<StorageReply>,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let reply = match result {
            Ok(r) => r,
            Err(e) => return self.on_storage_failed(work, round, e, now, ctx),
        };
        if let StorageReply::Pop(result) = &reply {
            // A discovery pop's answers are of several queues: kept for this pop only.
            let queue = self.params.queue_name().map(str::to_string);
            self.learn_policy(queue.as_deref(), result, ctx);
        }
        let group = self.params.consumer_group.clone();
        match (work, reply) {
            (Work::Config, StorageReply::Config(config)) => {
                let queue = self.params.queue_name().unwrap_or_default().to_string();
                if config.as_ref().is_some_and(|c| c.min_pop_wait_ms > 0) {
                    ctx.rings.min_pop_wait_in_use = true;
                }
                ctx.configs.insert(
                    queue.clone(),
                    CachedConfig {
                        config,
                        fetched_at: now,
                    },
                );
                self.next_ring_step(&queue, round, now, ctx);
            }
            (Work::Reseed, StorageReply::Names(names)) => {
                let queue = self.params.queue_name().unwrap_or_default().to_string();
                // A windowBuffer partition learnt of here is tried at once: storage's debounce
                // answers when its hold ends.
                let ring = ctx.rings.ring(&queue, &group);
                let page_full = names.len() >= ring.reseed_page() as usize;
                ring.apply_reseed(&names, page_full, now);
                self.next_ring_step(&queue, round, now, ctx);
            }
            (Work::List(cands), StorageReply::Pop(result)) => {
                self.on_list_pop(&cands, result, round, now, ctx);
            }
            (
                Work::Wildcard {
                    first_contact,
                    issued_at,
                },
                StorageReply::Pop(result),
            ) => self.on_wildcard_pop(first_contact, issued_at, result, round, now, ctx),
            (Work::Partition { issued_at }, StorageReply::Pop(result)) => {
                self.note_revisits(&result.verdicts, now);
                if let PopShape::Partition { queue, .. } = &self.params.shape {
                    let ring = ctx.rings.ring(queue, &group);
                    for (name, verdict) in &result.verdicts {
                        ring.check_in_issued(name, *verdict, issued_at, now);
                    }
                }
                self.deliver_or_wait(result, round, true, now, ctx);
            }
            (Work::DiscoveryNext, StorageReply::NextPending(next)) => {
                // Storage's time is a floor for the revisit: a lease held elsewhere ends then.
                if let Some(t) = next {
                    self.revisit_at = Some(self.revisit_at.map_or(t, |r| r.min(t)));
                }
                self.deliver_or_wait(PopResult::default(), round, true, now, ctx);
            }
            (Work::Discovery { queues, next }, reply) => {
                self.on_discovery_step(queues, next, reply, round, now, ctx);
            }
            (_, other) => {
                self.effects
                    .push_back(PopEffect::ReleasePermit { rtt_us: None });
                self.finish(PopReply::Failed(StorageError::Internal(format!(
                    "unexpected storage reply {other:?}"
                ))));
            }
        }
    }

    /// A storage call failed: a ring's reseed is retried and a list pop's candidates go back to
    /// the ring (the transaction rolled back). Storage away is no error for the pop: a long-poll
    /// parks and looks again with the backoff (204 at its deadline if storage is still away).
    pub(super) fn on_storage_failed(
        &mut self,
        work: Work,
        round: PermitRound,
        e: StorageError,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        if let (Work::Reseed, PopShape::Queue { queue }) = (&work, &self.params.shape) {
            ctx.rings
                .ring(queue, &self.params.consumer_group)
                .reseed_failed();
        }
        if matches!(work, Work::Partition { .. }) && !self.config.bugs.keep_a_failed_partition_look
        {
            // The look read nothing: the pop looks again as soon as it may.
            self.partition_look = None;
        }
        if let Work::List(cands) = &work {
            if let PopShape::Queue { queue } = &self.params.shape {
                let ring = ctx.rings.ring(queue, &self.params.consumer_group);
                for c in cands {
                    ring.check_in(&c.partition, Verdict::NotEvaluated, Some(c.epoch), now);
                }
            }
        }
        self.effects
            .push_back(PopEffect::ReleasePermit { rtt_us: None });
        if e.is_unavailable() {
            self.note_storage_away(&e, now, ctx);
            return self.after_unreachable_storage(now, round.woken, ctx);
        }
        self.finish(PopReply::Failed(e));
    }

    /// A ring pop's answer: each candidate's verdict goes back into the ring (those storage did
    /// not mention as not evaluated); an empty answer with the ring still ready tries again.
    pub(super) fn on_list_pop(
        &mut self,
        cands: &[Candidate],
        result: PopResult,
        round: PermitRound,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let queue = self.params.queue_name().unwrap_or_default().to_string();
        let ring = ctx.rings.ring(&queue, &self.params.consumer_group);
        for (name, verdict) in &result.verdicts {
            let epoch = cands.iter().find(|c| &c.partition == name).map(|c| c.epoch);
            ring.check_in(name, *verdict, epoch, now);
        }
        // Candidates storage did not mention go back as not evaluated.
        for c in cands {
            if !result.verdicts.iter().any(|(n, _)| n == &c.partition) {
                ring.check_in(&c.partition, Verdict::NotEvaluated, Some(c.epoch), now);
            }
        }
        if result.claims.is_empty() && round.list_rounds < 2 && ring.has_ready(now) {
            return self.next_ring_step(&queue, round, now, ctx);
        }
        let returned = cands.iter().any(|c| ring.is_ready(&c.partition));
        self.deliver_or_wait(result, round, returned, now, ctx);
    }

    /// A wildcard scan's answer (a group's first contact, or the legacy path): its verdicts are
    /// checked in against the epoch clock it was issued at.
    pub(super) fn on_wildcard_pop(
        &mut self,
        first_contact: bool,
        issued_at: u64,
        result: PopResult,
        round: PermitRound,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        self.note_revisits(&result.verdicts, now);
        if let PopShape::Queue { queue } = &self.params.shape {
            let ring = ctx.rings.ring(queue, &self.params.consumer_group);
            if first_contact {
                ring.mark_first_contact_done();
            }
            for (name, verdict) in &result.verdicts {
                ring.check_in_issued(name, *verdict, issued_at, now);
            }
            if first_contact && result.claims.is_empty() && self.config.hotlist {
                let queue = queue.clone();
                return self.next_ring_step(&queue, round, now, ctx);
            }
        }
        if !result.claims.is_empty() && !self.config.bugs.no_scan_wake_handoff {
            // Another partition may be claimable too: the next parked pop asks.
            self.pass_wake_on_scan();
        }
        self.deliver_or_wait(result, round, true, now, ctx);
    }

    /// A discovery pop's step: the matching queues, then each in turn until one has claims;
    /// when every queue answered empty, when one of them next has something.
    pub(super) fn on_discovery_step(
        &mut self,
        queues: Vec<String>,
        next: usize,
        reply: StorageReply,
        round: PermitRound,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let (queues, result) = match reply {
            StorageReply::Names(names) => (names, PopResult::default()),
            StorageReply::Pop(r) => (queues, r),
            _ => (queues, PopResult::default()),
        };
        self.note_revisits(&result.verdicts, now);
        if !result.claims.is_empty() || queues.is_empty() {
            return self.deliver_or_wait(result, round, true, now, ctx);
        }
        if next >= queues.len() {
            let command = StorageCommand::NextPending {
                queues,
                group: self.params.consumer_group.clone(),
            };
            return self.work(command, Work::DiscoveryNext, round);
        }
        let req = self.request(&queues[next]);
        self.work(
            StorageCommand::PopWildcard { req },
            Work::Discovery {
                queues,
                next: next + 1,
            },
            round,
        );
    }

    /// The permit found no candidate: no pop ran under it, so there is no latency sample. (A
    /// zero sample would pin the limiter's uncontended floor to 1 µs for good, and every real
    /// sample after it would read as congestion.)
    pub(super) fn release_then_empty(&mut self, round: PermitRound, now: Timestamp) {
        self.effects
            .push_back(PopEffect::ReleasePermit { rtt_us: None });
        self.empty_or_park(now, round.woken);
    }

    /// `returned`: this pop's verdicts made partitions ready again (candidates storage did not
    /// get to, an autoAck partition with more, a push that raced the answer).
    pub(super) fn deliver_or_wait(
        &mut self,
        result: PopResult,
        round: PermitRound,
        returned: bool,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let rtt_us = Some(u64::try_from((now.0 - round.since.0).max(1)).unwrap_or(1));
        self.effects.push_back(PopEffect::ReleasePermit { rtt_us });
        // Leaving the ring: what its own verdicts made ready goes to another parked pop. Work
        // made ready otherwise has its own wake (an event's, a revisit's, or the hand-off of
        // the pop that left it when taking candidates): passing that on too woke pops for
        // partitions other pops were already serving.
        if returned && !self.config.bugs.no_handoff_of_returned {
            self.pass_wake_if_work_left(now, ctx);
        }
        if !result.claims.is_empty() {
            let reply = PopReply::Messages {
                worker: self.worker,
                auto_ack: self.params.auto_ack,
                claims: result.claims,
            };
            return self.finish(reply);
        }
        self.empty_or_park(now, round.woken);
    }

    /// The hand-off of a ring pop that leaves work behind (see `PopEffect::PassWake`). Only
    /// after progress: candidates taken, or storage's verdicts checked in. A pop that found
    /// nothing it could do (a missing queue) or met a failure passes nothing on, so hand-offs
    /// never circle through the parked pops without storage answering in between.
    pub(super) fn pass_wake_if_work_left(&mut self, now: Timestamp, ctx: &mut PopContext) {
        if !self.serves_from_ring() || self.config.bugs.no_wake_handoff {
            return;
        }
        let Some(queue) = self.params.queue_name() else {
            return;
        };
        if ctx
            .rings
            .ring(queue, &self.params.consumer_group)
            .has_work(now)
        {
            self.effects.push_back(PopEffect::PassWake);
        }
    }

    /// The legacy scan's hand-off (`QUEEN_HOTLIST=0`, queue-wide pops): with no ring to say what
    /// is left, a pop passes the wake on whenever it may leave work to its group's other parked
    /// pops: after a claim (another partition may be claimable as well), and when a wake chose it
    /// and it left before looking. The pop it wakes asks storage before it passes anything on,
    /// so a chain ends at the first pop that finds nothing: an event costs the claims it makes
    /// possible plus one look per group, however many pops are parked. What storage says about
    /// later (a lease ending) is the broker's, not the pop's: `ProbeMemos::note_revisit`.
    pub(super) fn pass_wake_on_scan(&mut self) {
        if self.wakes_one_per_group() && !self.config.hotlist {
            self.effects.push_back(PopEffect::PassWake);
        }
    }

    /// Empty: answer now, or park (releasing everything) until a wake or the backoff timer.
    /// `woken`: an event landed while storage was answering (under an older snapshot).
    pub(super) fn empty_or_park(&mut self, now: Timestamp, woken: bool) {
        if !self.params.wait || now >= self.deadline {
            return self.finish(PopReply::Empty);
        }
        if woken {
            // Look again at once instead of sleeping through the event.
            self.phase = Phase::Parked { until: now };
            self.effects.push_back(PopEffect::Park { until: now });
            return;
        }
        self.empty_checks = self.empty_checks.saturating_add(1);
        let mut until = if self.config.bugs.no_backoff_floor {
            self.deadline
        } else {
            let interval = i64::try_from(self.config.backoff.interval_ms(self.empty_checks))
                .unwrap_or(i64::MAX);
            now.plus_millis(interval).min(self.deadline)
        };
        if let Some(t) = self.revisit_at.filter(|_| {
            !(self.config.bugs.no_partition_revisit
                && matches!(self.params.shape, PopShape::Partition { .. }))
        }) {
            // A revisit due now (a lease ending this very microsecond, still held by storage's
            // strict `<`) would otherwise be retried in a hot loop until the clock moves on.
            until = until.min(t.max(now.plus_millis(1)));
        }
        self.phase = Phase::Parked { until };
        self.effects.push_back(PopEffect::Park { until });
    }
}
