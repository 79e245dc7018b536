//! Whether a pop asks storage now: the cheap in-memory check before any permit (the seed's
//! step 1), the min_pop_wait hold, and the broker-wide wait after storage failed.

use super::context::{CachedConfig, PopContext, STORAGE_AWAY_CAP_MS};
use super::io::{PopEffect, PopReply, StorageCommand};
use super::{Phase, PopMachine, PARTITION_RECHECK_MS};
use crate::params::PopShape;
use crate::ring::candidate_count;
use crate::storage::StorageError;
use crate::types::Timestamp;

impl PopMachine {
    /// The cheap in-memory check: decide whether there is real work before any permit.
    /// `recheck`: a parked pop's timer (not a new request or a wake), which on the legacy path
    /// may take the answer its (queue, group) shares.
    pub(super) fn check(&mut self, now: Timestamp, ctx: &mut PopContext, recheck: bool) {
        if ctx.pop_maintenance {
            self.finish(PopReply::Empty);
            return;
        }
        if let Some(until) = ctx.storage_away_until.filter(|until| now < *until) {
            if !self.config.bugs.retry_unreachable_storage_at_once {
                return self.wait_out_storage(until, now);
            }
        }
        let group = self.params.consumer_group.clone();
        let mut owes_reseed = false;
        let has_work = match self.params.shape.clone() {
            PopShape::Partition { queue, partition } => {
                let seen = (
                    ctx.rings.ring(&queue, &group).epoch(&partition),
                    ctx.rings.resets(),
                );
                self.revisit_due(now)
                    || self.partition_look.is_none_or(|look| {
                        look.epoch_and_resets != seen
                            || now >= look.at.plus_millis(PARTITION_RECHECK_MS)
                    })
            }
            PopShape::Queue { queue } if self.config.hotlist => {
                // A stale config alone is no work: it is refreshed when there is work to do, so
                // parked pops never fetch it in a burst.
                let ring = ctx.rings.ring(&queue, &group);
                let mut has_work = ring.has_work(now);
                if !has_work
                    && !self.params.wait
                    && !self.config.bugs.one_shot_pop_trusts_ring_leases
                {
                    // This pop answers now, so the ring's belief in a lease (which a release
                    // elsewhere ends by a notification that may still be on its way) is asked
                    // of storage rather than answered with a 204.
                    has_work = ring.offer_held_leases(candidate_count(self.params.partitions));
                }
                if ring.first_contact_done() && ring.reseed_due(now) {
                    // The first pop to see the reseed due takes it on; the others do not.
                    let _ = ring.mark_reseed_started(now);
                    owes_reseed = true;
                }
                has_work
            }
            PopShape::Queue { queue } => {
                // Legacy path: the cheap probe runs before any permit, unless storage already
                // said when something becomes deliverable and that time has come.
                if !self.revisit_due(now) {
                    let ttl_ms = i64::try_from(self.config.backoff.initial_ms).unwrap_or(i64::MAX);
                    let shared = recheck
                        .then(|| ctx.probes.recall(&queue, &group, now, ttl_ms))
                        .flatten();
                    if let Some(next) = shared {
                        // Another parked pop of this (queue, group) asked just now, and no event
                        // of the queue came since: its answer stands.
                        self.revisit_at = next;
                        return self.empty_or_park(now, false);
                    }
                    let epoch = ctx.probes.epoch(&queue);
                    ctx.probes.issued(&queue, &group, now);
                    let queues = vec![queue];
                    let id = self.storage(StorageCommand::NextPending { queues, group });
                    self.phase = Phase::Probing {
                        id,
                        woken: false,
                        epoch,
                    };
                    return;
                }
                true
            }
            PopShape::Discovery { .. } => true,
        };
        if !has_work {
            self.empty_or_park(now, false);
        } else {
            self.check_hold(now, ctx, None, owes_reseed);
        }
    }

    /// min_pop_wait_ms: hold an under-full claim in the broker, before the permit. `started`:
    /// when the hold began, if one is running.
    pub(super) fn check_hold(
        &mut self,
        now: Timestamp,
        ctx: &mut PopContext,
        started: Option<Timestamp>,
        owes_reseed: bool,
    ) {
        let PopShape::Queue { queue } = &self.params.shape else {
            return self.acquire(false, owes_reseed);
        };
        if !ctx.rings.min_pop_wait_in_use || !self.config.hotlist {
            return self.acquire(false, owes_reseed);
        }
        let min_wait = match ctx.configs.get(queue) {
            Some(CachedConfig {
                config: Some(c), ..
            }) => c.min_pop_wait_ms,
            _ => 0,
        };
        if min_wait == 0 {
            return self.acquire(false, owes_reseed);
        }
        let group = self.params.consumer_group.clone();
        let ring = ctx.rings.ring(queue, &group);
        let pending = ring.pending_hint(now);
        self.resize(ring, now);
        if pending == 0 {
            // Real work is a reseed or a refresh, not an under-full batch: do not hold.
            return self.acquire(false, owes_reseed);
        }
        let started = started.unwrap_or(now);
        let until = started
            .plus_millis(i64::from(min_wait))
            .min(self.params.deadline(started).max(started));
        if pending >= u64::from(self.sizing.batch)
            || now >= until
            || now >= self.deadline && self.params.wait
        {
            self.acquire(false, owes_reseed);
        } else {
            self.phase = Phase::Holding {
                until,
                started,
                owes_reseed,
            };
            self.effects.push_back(PopEffect::Park { until });
        }
    }

    /// A call failed as unreachable, and its work is still to do: a long-poll asks again once
    /// the broker-wide wait ends (`storage_away_until`), not after its empty-answer backoff,
    /// so the work is done within one wait of storage answering again. A call that lost to
    /// concurrent transactions (`Contention`) sets no wait and backs off as an empty answer.
    pub(super) fn after_unreachable_storage(
        &mut self,
        now: Timestamp,
        woken: bool,
        ctx: &PopContext,
    ) {
        match ctx.storage_away_until {
            Some(until)
                if until > now && !self.config.bugs.park_on_backoff_after_unreachable_storage =>
            {
                self.wait_out_storage(until, now)
            }
            _ => self.empty_or_park(now, woken),
        }
    }

    /// A call failed as unreachable: every pop of the broker waits before asking storage again
    /// (`PopContext::storage_away_until`): the initial backoff interval, doubled for each failure
    /// since storage last answered, up to `STORAGE_AWAY_CAP_MS`. A transaction that lost to
    /// concurrent ones (`Contention`) says nothing of the others' calls.
    pub(super) fn note_storage_away(&self, e: &StorageError, now: Timestamp, ctx: &mut PopContext) {
        if !matches!(e, StorageError::Unavailable(_)) {
            return;
        }
        let initial = self.config.backoff.initial_ms.max(1);
        let doublings = ctx.storage_failures.min(16);
        ctx.storage_failures = ctx.storage_failures.saturating_add(1);
        let wait = initial
            .saturating_mul(1u64 << doublings)
            .min(STORAGE_AWAY_CAP_MS.max(initial));
        let until = now.plus_millis(i64::try_from(wait).unwrap_or(i64::MAX));
        ctx.storage_away_until = Some(ctx.storage_away_until.map_or(until, |u| u.max(until)));
    }

    /// Storage was unreachable a moment ago: a long-poll parks until it may ask again (204 at its
    /// deadline), any other pop answers empty, as after a failed call.
    pub(super) fn wait_out_storage(&mut self, until: Timestamp, now: Timestamp) {
        if !self.params.wait || now >= self.deadline {
            return self.finish(PopReply::Empty);
        }
        let until = until.min(self.deadline);
        self.phase = Phase::Parked { until };
        self.effects.push_back(PopEffect::Park { until });
    }
}
