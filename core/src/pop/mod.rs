//! The pop state machine: candidate selection, permit, storage, verdict check-in, parking.
//!
//! Sans-IO in the quinn-proto style: the driver calls `handle(input, now, ctx)` once per event,
//! then drains `poll()` and performs each effect (take a permit, run a storage command, park
//! until a wake or a deadline, reply). A storage round trip is two events: the machine emits a
//! command with a correlation id, and the driver feeds back `StorageDone { id, .. }`; a reply
//! with a stale id is ignored, so tests may delay, duplicate or reorder replies.
//!
//! The driver's contract: every input it feeds (start, a granted permit, the answer of the call
//! the machine asked for, a wake, timer or cancel while parked) is answered with the machine's
//! next wait (`AcquirePermit`, `Storage`, `Park`) or its `Reply`; even an early timer re-emits
//! the park. Each phase carries the data only it needs (`PermitRound` while a permit is held).
//!
//! The module's rooms: `io` (the storage commands and replies, the inputs the driver feeds and
//! the effects it performs), `context` (what the machines of a broker share: rings, cached
//! configs, the legacy path's probe answers, the switches), `gates` (whether a pop asks storage
//! now: the in-memory check, the min_pop_wait hold, the wait after storage failed) and
//! `answers` (what a storage answer does: verdicts back into the ring, deliver, hand the wake
//! on, or park). The machine's phases and its round of work under a permit are here.

mod answers;
mod context;
mod gates;
mod io;

pub use context::{
    CachedConfig, PopBugs, PopConfig, PopContext, ProbeEpoch, ProbeMemos, STORAGE_AWAY_CAP_MS,
};
pub use io::{execute, PopEffect, PopInput, PopReply, StorageCommand, StorageReply};

use std::collections::VecDeque;

use crate::autopilot::{self, Sizing};
use crate::claim::SubscriptionIntent;
use crate::params::{PopParams, PopShape};
use crate::ring::{Candidate, HotRing};
use crate::storage::{PopRequest, PopResult, StorageResult, Verdict};
use crate::types::{Timestamp, WorkerId};

#[derive(Clone, Debug, PartialEq)]
enum Work {
    Config,
    Reseed,
    List(Vec<Candidate>),
    /// `issued_at`: the ring's clock when the look was issued (`HotRing::check_in_issued`).
    Wildcard {
        first_contact: bool,
        issued_at: u64,
    },
    Partition {
        issued_at: u64,
    },
    Discovery {
        queues: Vec<String>,
        next: usize,
    },
    /// A discovery round found nothing: asking when something becomes deliverable.
    DiscoveryNext,
}

/// What one permit's work has done so far (the data of the `Working` phase).
#[derive(Clone, Copy, Debug, PartialEq)]
struct PermitRound {
    /// When the permit was granted: the storage latency reported to the limiter runs from here.
    since: Timestamp,
    /// A wake arrived while storage was working: look again at once instead of parking, since
    /// storage's answer was read before the event.
    woken: bool,
    /// List pops issued under this permit (a second one runs when the first found only stale
    /// candidates and the ring still has ready ones).
    list_rounds: u32,
    /// This pop took on its ring's due reseed and has not run it yet.
    owes_reseed: bool,
}

/// A single-partition pop's last storage look: the ring epoch of its partition and the table's
/// reset count then, and when it was. An unchanged epoch means nothing was learnt since.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PartitionLook {
    epoch_and_resets: (u64, u64),
    at: Timestamp,
}

/// Where the machine is; each phase carries the data only it needs.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    New,
    /// min_pop_wait: an under-full batch held back before the permit, since `started`.
    Holding {
        until: Timestamp,
        started: Timestamp,
        owes_reseed: bool,
    },
    AwaitPermit {
        woken: bool,
        owes_reseed: bool,
    },
    /// The legacy path's cheap probe (no permit), issued when the queue's events were at `epoch`.
    Probing {
        id: u64,
        woken: bool,
        epoch: ProbeEpoch,
    },
    Working {
        id: u64,
        work: Work,
        round: PermitRound,
    },
    Parked {
        until: Timestamp,
    },
    Done,
}

/// One pop request's state machine.
#[derive(Debug)]
pub struct PopMachine {
    params: PopParams,
    worker: WorkerId,
    config: PopConfig,
    deadline: Timestamp,
    phase: Phase,
    effects: VecDeque<PopEffect>,
    next_id: u64,
    /// Empty checks since the last wake (drives the backoff); lives as long as the request.
    empty_checks: u32,
    /// Single-partition pops: the last storage look (`None` before the first).
    partition_look: Option<PartitionLook>,
    /// When storage said something this pop could take becomes deliverable (a lease expiring,
    /// delayedProcessing, windowBuffer, a retryDelay hold): the parked pop looks again then.
    /// Queue-wide pops on the hot-list keep these times on the ring's wheel instead.
    revisit_at: Option<Timestamp>,
    /// The group's stored conflation policy: what this pop's storage answers said, else (once
    /// done) what its broker last heard for the (queue, group).
    stored_conflation: Option<bool>,
    /// The width and budget of this pop's storage calls: the request's, or where it left them to
    /// the autopilot, the last the autopilot chose (see `resize`).
    sizing: Sizing,
}

/// How long a single-partition pop trusts an unchanged ring epoch before asking storage again.
const PARTITION_RECHECK_MS: i64 = 30_000;

impl PopMachine {
    pub fn new(params: PopParams, worker: WorkerId, config: PopConfig, now: Timestamp) -> Self {
        let deadline = if params.wait {
            params.deadline(now)
        } else {
            now
        };
        // Until a ring serves it, a pop is sized as one no ring serves.
        let sizing = match params.autopilot {
            Some(chosen) => autopilot::size(chosen, Sizing::sent(&params), None),
            None => Sizing::sent(&params),
        };
        PopMachine {
            params,
            worker,
            config,
            deadline,
            phase: Phase::New,
            effects: VecDeque::new(),
            next_id: 0,
            empty_checks: 0,
            partition_look: None,
            revisit_at: None,
            stored_conflation: None,
            sizing,
        }
    }

    /// What the answer echoes of the autopilot's choice, when the request asked for it.
    pub fn autopilot_echo(&self) -> Option<autopilot::Echo> {
        self.params
            .autopilot
            .map(|_| autopilot::Echo::of(self.sizing))
    }

    /// Sizes the next storage call from the ring serving this pop, where the request left a
    /// knob to the autopilot (a pop that did not ask pays nothing here).
    fn resize(&mut self, ring: &mut HotRing, now: Timestamp) {
        if let Some(chosen) = self.params.autopilot {
            let ready = ring.ready_count(now);
            self.sizing = autopilot::size(chosen, Sizing::sent(&self.params), Some(ready));
        }
    }

    /// What the answer says of conflation (see `claim::ConflationEcho`).
    pub fn conflation_echo(&self) -> crate::claim::ConflationEcho {
        crate::claim::ConflationEcho::of(self.params.conflation, self.stored_conflation)
    }

    /// Notes the group's stored policy from a pop's answer, for this pop and its broker.
    fn learn_policy(&mut self, queue: Option<&str>, result: &PopResult, ctx: &mut PopContext) {
        if let Some(conflating) = result.stored_conflation {
            self.stored_conflation = Some(conflating);
            if let Some(queue) = queue {
                ctx.rings
                    .note_conflation_policy(queue, &self.params.consumer_group, conflating);
            }
        }
    }

    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    pub fn params(&self) -> &PopParams {
        &self.params
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    pub fn is_parked(&self) -> bool {
        matches!(self.phase, Phase::Parked { .. } | Phase::Holding { .. })
    }

    /// Whether this pop is served from its (queue, group) hot-list ring.
    pub fn serves_from_ring(&self) -> bool {
        self.config.hotlist && self.wakes_one_per_group()
    }

    /// Whether a parked pop of this shape is woken one at a time (an event wakes one parked pop
    /// per group, and each woken pop that may leave work behind passes the wake on): every
    /// queue-wide pop, on either path. Every other shape (a named partition, discovery) is woken
    /// by every event of its queue.
    pub fn wakes_one_per_group(&self) -> bool {
        matches!(self.params.shape, PopShape::Queue { .. })
    }

    /// Whether the machine holds a serving permit right now.
    pub fn holds_permit(&self) -> bool {
        matches!(self.phase, Phase::Working { .. })
    }

    /// The next effect to perform; call until `None` after every `handle`.
    #[must_use]
    pub fn poll(&mut self) -> Option<PopEffect> {
        self.effects.pop_front()
    }

    /// When the machine next needs a `Timer` input, if parked.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Parked { until } | Phase::Holding { until, .. } => Some(until),
            _ => None,
        }
    }

    /// Every shape asks storage to apply the windowBuffer debounce: its verdict carries the
    /// exact end of the hold (newest segment + window), which a broker cannot know for pushes it
    /// learnt of late (a reseed, another broker's notification after a lost one).
    fn request(&self, queue: &str) -> PopRequest {
        PopRequest {
            queue: queue.to_string(),
            group: self.params.consumer_group.clone(),
            worker: self.worker,
            batch: self.sizing.batch,
            max_partitions: self.sizing.partitions,
            auto_ack: self.params.auto_ack,
            lease_seconds: self.params.lease_seconds,
            intent: SubscriptionIntent {
                mode: self.params.subscription_mode,
                from: self.params.subscription_from,
            },
            skip_window_debounce: false,
            conflation: self.params.conflation,
        }
    }

    fn storage(&mut self, command: StorageCommand) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.effects.push_back(PopEffect::Storage { id, command });
        id
    }

    fn finish(&mut self, reply: PopReply) {
        self.effects.push_back(PopEffect::Reply(reply));
        self.phase = Phase::Done;
    }

    /// Feeds the driver's next input, told whether the pop's wake gate opened since the driver
    /// last looked. A wake that came while the pop waited for a permit or for storage is handled
    /// first: the answer about to be handled was read before that event, so the pop must not
    /// park on it as if nothing had happened.
    pub fn handle_after_gate_check(
        &mut self,
        input: PopInput,
        woke_meanwhile: bool,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let busy = matches!(
            input,
            PopInput::PermitGranted | PopInput::StorageDone { .. }
        );
        if woke_meanwhile && busy && !self.config.bugs.drop_wakes_during_work {
            self.handle(PopInput::Wake, now, ctx);
            debug_assert!(self.effects.is_empty(), "a busy machine only notes a wake");
        }
        self.handle(input, now, ctx);
    }

    pub fn handle(&mut self, input: PopInput, now: Timestamp, ctx: &mut PopContext) {
        self.handle_input(input, now, ctx);
        if self.phase == Phase::Done && self.stored_conflation.is_none() {
            // An answer that never reached storage (the ring had nothing, a memo answered):
            // the broker's last word on the group's policy.
            if let Some(queue) = self.params.queue_name() {
                self.stored_conflation = ctx
                    .rings
                    .conflation_policy(queue, &self.params.consumer_group);
            }
        }
    }

    fn handle_input(&mut self, input: PopInput, now: Timestamp, ctx: &mut PopContext) {
        debug_assert!(
            self.effects.is_empty(),
            "drain poll() before the next input"
        );
        if self.phase == Phase::Done {
            return;
        }
        match input {
            PopInput::Start => {
                if self.phase == Phase::New {
                    self.check(now, ctx, false);
                }
            }
            PopInput::Cancel => {
                if self.holds_permit() {
                    self.effects
                        .push_back(PopEffect::ReleasePermit { rtt_us: None });
                }
                if matches!(
                    self.phase,
                    Phase::AwaitPermit { .. } | Phase::Holding { .. }
                ) {
                    // It may have been the pop a wake chose: the work it saw goes to another.
                    self.pass_wake_if_work_left(now, ctx);
                    self.pass_wake_on_scan();
                }
                self.phase = Phase::Done;
            }
            PopInput::Wake => match &mut self.phase {
                Phase::Parked { .. } => {
                    self.empty_checks = 0;
                    self.check(now, ctx, false);
                }
                Phase::Holding {
                    started,
                    owes_reseed,
                    ..
                } => {
                    let (started, owes_reseed) = (*started, *owes_reseed);
                    self.check_hold(now, ctx, Some(started), owes_reseed)
                }
                Phase::AwaitPermit { woken, .. }
                | Phase::Probing { woken, .. }
                | Phase::Working {
                    round: PermitRound { woken, .. },
                    ..
                } => *woken = true,
                Phase::New | Phase::Done => {}
            },
            PopInput::Timer => match self.phase {
                Phase::Parked { until } if now >= until => {
                    if now >= self.deadline {
                        self.finish(PopReply::Empty);
                    } else {
                        self.check(now, ctx, true);
                    }
                }
                Phase::Holding {
                    until,
                    started,
                    owes_reseed,
                } if now >= until => self.check_hold(now, ctx, Some(started), owes_reseed),
                // Early (the driver's timer and the clock disagree by a hair): keep waiting, and
                // say so, so that every input a parked machine gets is answered with its wait.
                Phase::Parked { until } | Phase::Holding { until, .. } => {
                    self.effects.push_back(PopEffect::Park { until })
                }
                _ => {}
            },
            PopInput::PermitGranted => {
                if let Phase::AwaitPermit { woken, owes_reseed } = self.phase {
                    let round = PermitRound {
                        since: now,
                        woken,
                        list_rounds: 0,
                        owes_reseed,
                    };
                    self.start_work(round, now, ctx);
                }
            }
            PopInput::StorageDone { id, result } => {
                // Any answer means storage is reachable again: the broker-wide wait starts over.
                if result.is_ok() {
                    ctx.storage_failures = 0;
                }
                self.on_storage_done(id, result, now, ctx)
            }
        }
    }

    fn on_storage_done(
        &mut self,
        id: u64,
        result: StorageResult<StorageReply>,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        match self.phase.clone() {
            Phase::Probing {
                id: want,
                woken,
                epoch,
            } if want == id => {
                let next = match &result {
                    Ok(StorageReply::NextPending(next)) => Some(*next),
                    _ => None,
                };
                if let Some(queue) = self.params.queue_name() {
                    // Whatever it answered, this probe is no longer in flight.
                    let group = &self.params.consumer_group;
                    ctx.probes.answered(queue, group, epoch, next, now);
                    if let Some(Some(at)) = next.filter(|_| !self.config.bugs.no_scan_revisit) {
                        ctx.probes.note_revisit(queue, group, at, now);
                    }
                }
                match result {
                    Ok(StorageReply::NextPending(Some(t))) if t <= now => {
                        self.acquire(woken, false)
                    }
                    Ok(StorageReply::NextPending(next)) => {
                        self.revisit_at = next;
                        self.empty_or_park(now, woken)
                    }
                    Ok(_) => self.empty_or_park(now, woken),
                    Err(e) if e.is_unavailable() => {
                        self.note_storage_away(&e, now, ctx);
                        self.after_unreachable_storage(now, woken, ctx)
                    }
                    Err(e) => self.finish(PopReply::Failed(e)),
                }
            }
            Phase::Working {
                id: want,
                work,
                round,
            } if want == id => self.on_storage(work, round, result, now, ctx),
            _ => {}
        }
    }

    fn acquire(&mut self, woken: bool, owes_reseed: bool) {
        self.phase = Phase::AwaitPermit { woken, owes_reseed };
        self.effects.push_back(PopEffect::AcquirePermit);
    }

    fn work(&mut self, command: StorageCommand, work: Work, round: PermitRound) {
        let id = self.storage(command);
        self.phase = Phase::Working { id, work, round };
    }

    /// Whether storage's promised revisit time has come.
    fn revisit_due(&self, now: Timestamp) -> bool {
        let ignored = self.config.bugs.no_partition_revisit
            && matches!(self.params.shape, PopShape::Partition { .. });
        !ignored && self.revisit_at.is_some_and(|t| now >= t)
    }

    /// Keeps the earliest time a verdict says something becomes deliverable, for the shapes the
    /// ring does not serve (on the hot-list path a queue pop's verdicts go to the ring's wheel,
    /// and the wheel's ticker wakes it).
    fn note_revisits(&mut self, verdicts: &[(String, Verdict)], now: Timestamp) {
        if self.config.hotlist && matches!(self.params.shape, PopShape::Queue { .. }) {
            return;
        }
        for at in verdicts.iter().filter_map(|(_, v)| v.revisit_at(now)) {
            self.revisit_at = Some(self.revisit_at.map_or(at, |r| r.min(at)));
        }
    }

    /// Under a permit: issue the next storage command for this shape.
    fn start_work(&mut self, round: PermitRound, now: Timestamp, ctx: &mut PopContext) {
        let group = self.params.consumer_group.clone();
        // This round's verdicts say anew when to look again.
        self.revisit_at = None;
        match self.params.shape.clone() {
            PopShape::Partition { queue, partition } => {
                let req = self.request(&queue);
                self.partition_look = Some(PartitionLook {
                    epoch_and_resets: (
                        ctx.rings.ring(&queue, &group).epoch(&partition),
                        ctx.rings.resets(),
                    ),
                    at: now,
                });
                let issued_at = ctx.rings.ring(&queue, &group).clock();
                self.work(
                    StorageCommand::PopPartition { req, partition },
                    Work::Partition { issued_at },
                    round,
                );
            }
            PopShape::Queue { queue } if self.config.hotlist => {
                self.next_ring_step(&queue, round, now, ctx)
            }
            PopShape::Queue { queue } => {
                let req = self.request(&queue);
                let issued_at = ctx.rings.ring(&queue, &group).clock();
                self.work(
                    StorageCommand::PopWildcard { req },
                    Work::Wildcard {
                        first_contact: false,
                        issued_at,
                    },
                    round,
                );
            }
            PopShape::Discovery { namespace, task } => {
                self.work(
                    StorageCommand::QueuesMatching { namespace, task },
                    Work::Discovery {
                        queues: vec![],
                        next: 0,
                    },
                    round,
                );
            }
        }
    }

    /// The ring path under a permit: refresh config, first contact, reseed, then the list pop.
    fn next_ring_step(
        &mut self,
        queue: &str,
        mut round: PermitRound,
        now: Timestamp,
        ctx: &mut PopContext,
    ) {
        let group = self.params.consumer_group.clone();
        if !ctx.config_fresh(queue, now, self.config.config_ttl_ms) {
            return self.work(
                StorageCommand::QueueConfig {
                    queue: queue.to_string(),
                },
                Work::Config,
                round,
            );
        }
        if matches!(
            ctx.configs.get(queue),
            Some(CachedConfig { config: None, .. })
        ) {
            // No such queue (yet): nothing to deliver.
            return self.release_then_empty(round, now);
        }
        let ring = ctx.rings.ring(queue, &group);
        if !ring.first_contact_done() {
            let issued_at = ring.clock();
            let req = self.request(queue);
            return self.work(
                StorageCommand::PopWildcard { req },
                Work::Wildcard {
                    first_contact: true,
                    issued_at,
                },
                round,
            );
        }
        if round.owes_reseed || ring.reseed_due(now) {
            // Counted as started now, so pops re-checking meanwhile do not reseed too.
            let after = ring.mark_reseed_started(now);
            round.owes_reseed = false;
            let command = StorageCommand::PendingPartitions {
                queue: queue.to_string(),
                group,
                after,
                limit: ring.reseed_page(),
            };
            return self.work(command, Work::Reseed, round);
        }
        self.resize(ring, now);
        let candidates = ring.take_share(self.sizing.partitions, now);
        if candidates.is_empty() {
            return self.release_then_empty(round, now);
        }
        // More ready than this pop takes: another parked pop serves the rest meanwhile.
        self.pass_wake_if_work_left(now, ctx);
        round.list_rounds += 1;
        let req = self.request(queue);
        let names = candidates.iter().map(|c| c.partition.clone()).collect();
        self.work(
            StorageCommand::PopList {
                req,
                candidates: names,
            },
            Work::List(candidates),
            round,
        );
    }
}
