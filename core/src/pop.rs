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

use std::collections::VecDeque;

use crate::autopilot::{self, Sizing};
use crate::backoff::WaitBackoff;
use crate::claim::SubscriptionIntent;
use crate::params::{PopParams, PopShape};
use crate::ring::{candidate_count, Candidate, HotRing, RingTable, DEFAULT_CONFIG_TTL_MS};
use crate::storage::{
    Claim, PopRequest, PopResult, QueueConfig, StorageError, StorageResult, Verdict,
};
use crate::types::{Timestamp, WorkerId};

/// A storage call the driver performs for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageCommand {
    PopPartition {
        req: PopRequest,
        partition: String,
    },
    PopList {
        req: PopRequest,
        candidates: Vec<String>,
    },
    PopWildcard {
        req: PopRequest,
    },
    QueuesMatching {
        namespace: Option<String>,
        task: Option<String>,
    },
    /// When something next becomes deliverable to the group in these queues (see
    /// `Storage::next_pending`).
    NextPending {
        queues: Vec<String>,
        group: String,
    },
    PendingPartitions {
        queue: String,
        group: String,
        /// The page starts after this name (`None`: the first page of a walk).
        after: Option<String>,
        limit: u32,
    },
    QueueConfig {
        queue: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum StorageReply {
    Pop(PopResult),
    NextPending(Option<Timestamp>),
    Names(Vec<String>),
    Config(Option<QueueConfig>),
}

/// Runs a command against a backend: the whole of the driver's storage effect.
pub async fn execute(
    storage: &dyn crate::storage::PopStorage,
    command: StorageCommand,
) -> StorageResult<StorageReply> {
    Ok(match command {
        StorageCommand::PopPartition { req, partition } => {
            StorageReply::Pop(storage.pop_partition(req, partition).await?)
        }
        StorageCommand::PopList { req, candidates } => {
            StorageReply::Pop(storage.pop_list(req, candidates).await?)
        }
        StorageCommand::PopWildcard { req } => StorageReply::Pop(storage.pop_wildcard(req).await?),
        StorageCommand::QueuesMatching { namespace, task } => {
            StorageReply::Names(storage.queues_matching(namespace, task).await?)
        }
        StorageCommand::NextPending { queues, group } => {
            StorageReply::NextPending(storage.next_pending(&queues, &group).await?)
        }
        StorageCommand::PendingPartitions {
            queue,
            group,
            after,
            limit,
        } => StorageReply::Names(
            storage
                .pending_partitions(&queue, &group, after.as_deref(), limit)
                .await?,
        ),
        StorageCommand::QueueConfig { queue } => {
            StorageReply::Config(storage.queue_config(&queue).await?)
        }
    })
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopInput {
    /// Begin (or nothing: the first `handle` of a new machine).
    Start,
    PermitGranted,
    StorageDone {
        id: u64,
        result: StorageResult<StorageReply>,
    },
    /// The queue's wake gate opened (a deliverability event, or the ring wheel's ticker).
    Wake,
    /// The timer of the last `Park` fired. A spurious timer is a harmless no-op.
    Timer,
    /// The client went away.
    Cancel,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopReply {
    Messages {
        worker: WorkerId,
        auto_ack: bool,
        claims: Vec<Claim>,
    },
    Empty,
    Failed(StorageError),
}

#[derive(Clone, Debug, PartialEq)]
pub enum PopEffect {
    /// Take a serving permit, then feed `PermitGranted`.
    AcquirePermit,
    /// Return the permit; `rtt_us` is the storage latency under it, if any work completed.
    ReleasePermit {
        rtt_us: Option<u64>,
    },
    Storage {
        id: u64,
        command: StorageCommand,
    },
    /// Wait for `Wake`, or feed `Timer` at `until`. Holds no permit and no connection.
    Park {
        until: Timestamp,
    },
    /// Wake one more parked queue-wide pop of this pop's (queue, group) on this broker: this pop
    /// may leave work behind that it will not take itself. An event wakes one parked queue-wide
    /// pop per group, not all of them, so the work an event made is served by a chain of these
    /// hand-offs, each woken pop taking its share. On the hot-list path the ring says what is
    /// left; the legacy scan passes the wake after every claim (see `pass_wake_on_scan`).
    PassWake,
    /// The final answer; the machine is done after it.
    Reply(PopReply),
}

/// Switches that re-introduce historical bugs (for the simulation suite's mutation proof).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopBugs {
    /// Park until the deadline with no backoff re-check: a lost wake strands the consumer.
    pub no_backoff_floor: bool,
    /// A single-partition pop ignores the time storage said its partition becomes deliverable
    /// (lease expiry, delay, window, retryDelay): it waits for an event or the 30 s re-check.
    pub no_partition_revisit: bool,
    /// The driver drops a wake that came while the pop waited for a permit or for storage,
    /// so an answer read before the event puts the pop to sleep through it.
    pub drop_wakes_during_work: bool,
    /// A ring pop that leaves ready partitions behind (it took its share of candidates, or
    /// claimed fewer than it took) does not wake another parked pop of its group: the rest
    /// waits for the parked pops' re-checks.
    pub no_wake_handoff: bool,
    /// A ring pop hands the wake on only when it takes candidates, never for the candidates
    /// its verdicts hand back (untried ones, an autoAck partition with more): those wait for
    /// the parked pops' re-checks.
    pub no_handoff_of_returned: bool,
    /// A legacy-scan pop (`QUEEN_HOTLIST=0`) that claims does not wake another parked pop of
    /// its group: the other partitions the event made claimable wait for the parked pops'
    /// re-checks.
    pub no_scan_wake_handoff: bool,
    /// The legacy scan keeps what a probe said about later (a lease ending, a hold maturing) in
    /// the pop that asked, not in the broker's ticker: when that pop's long-poll ends first, the
    /// other parked pops of its group hear of it only at their re-checks.
    pub no_scan_revisit: bool,
    /// A pop asks storage again as soon as a wake or its timer comes, even while storage has
    /// just failed as unreachable: the wake hand-offs between a group's parked pops then turn
    /// an outage into a hot loop of failing calls.
    pub retry_unreachable_storage_at_once: bool,
    /// A pop whose call failed as unreachable parks for its empty-answer backoff, as if storage
    /// had said there was nothing: the work it was doing (a group's first contact after a
    /// delete, a reseed, candidates put back) waits for that re-check, up to the backoff's cap
    /// (10 s with Queen's production settings) after storage answers again.
    pub park_on_backoff_after_unreachable_storage: bool,
    /// A named-partition pop whose call failed keeps that call as its last look: with the
    /// partition's epoch unchanged it does not ask again until an event of the partition or
    /// its 30 s re-check, though what the partition held was never read.
    pub keep_a_failed_partition_look: bool,
    /// A queue-wide pop that will not wait answers "nothing" from its ring while the ring
    /// believes a partition leased: a release through another broker whose notification has
    /// not arrived yet (the client acked there a moment ago) goes unseen, and the pop answers
    /// 204 over messages that are deliverable.
    pub one_shot_pop_trusts_ring_leases: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PopConfig {
    pub backoff: WaitBackoff,
    /// QUEEN_HOTLIST (default on).
    pub hotlist: bool,
    pub config_ttl_ms: i64,
    pub bugs: PopBugs,
}

impl Default for PopConfig {
    fn default() -> Self {
        PopConfig {
            backoff: WaitBackoff::default(),
            hotlist: true,
            config_ttl_ms: DEFAULT_CONFIG_TTL_MS,
            bugs: PopBugs::default(),
        }
    }
}

/// Cached queue options the scheduler needs (windowBuffer hold, min_pop_wait_time).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedConfig {
    pub config: Option<QueueConfig>,
    pub fetched_at: Timestamp,
}

/// Broker-wide state the pop machines share: the rings and the maintenance switch.
#[derive(Debug, Default)]
pub struct PopContext {
    pub rings: RingTable,
    pub configs: std::collections::BTreeMap<String, CachedConfig>,
    pub pop_maintenance: bool,
    pub event_bugs: crate::events::EventBugs,
    /// The legacy path's shared probe answers.
    pub probes: ProbeMemos,
    /// Until when storage counts as unreachable: a pop's call failed as unavailable (a restart,
    /// lost connections), so no pop asks again before the wait has passed (the initial backoff
    /// interval, doubling with each further failure up to `STORAGE_AWAY_CAP_MS`). Measured
    /// before it: about 57,000 failing calls a second per broker during a PostgreSQL restart, a
    /// group's parked pops waking one another after each failure.
    pub storage_away_until: Option<Timestamp>,
    /// Calls that failed as unreachable since storage last answered one.
    pub storage_failures: u32,
}

/// The longest broker-wide wait after calls failed as unreachable (unless the initial backoff
/// interval is longer): how long after storage answers again its parked pops may take to ask.
pub const STORAGE_AWAY_CAP_MS: u64 = 1_000;

/// The legacy path's (`QUEEN_HOTLIST=0`) last "nothing claimable now" probe answer per (queue,
/// group), shared by the parked pops of that pair: within one initial backoff interval of it,
/// and with no event of the queue since, a parked pop's timed re-check takes the answer instead
/// of asking storage again (a new request and a woken pop always ask). Ten thousand parked pops of one queue then cost a probe per interval,
/// not ten thousand (each pop re-checks on its own backoff, as the raw pollers do). While one
/// pop's probe is in flight the others re-checking wait for their next interval rather than ask
/// too. An event of the queue drops its answers and the probes in flight, so a woken pop always
/// asks storage.
#[derive(Debug, Default)]
pub struct ProbeMemos {
    memos: std::collections::BTreeMap<(String, String), ProbeMemo>,
    /// When the probe in flight per (queue, group) was issued.
    in_flight: std::collections::BTreeMap<(String, String), Timestamp>,
    /// Events seen per queue, and of every queue: a probe's answer is kept only if no event of
    /// its queue came while it was in flight.
    queue_events: std::collections::BTreeMap<String, u64>,
    all_events: u64,
    /// The earliest time a probe said something of (queue, group) becomes deliverable (a lease
    /// ending, a delay or hold maturing): the broker's ticker wakes one parked pop of the group
    /// then, as the hot-list ring's wheel does. Kept here, not in the pop that asked, so that it
    /// outlives that pop's long-poll.
    revisits: std::collections::BTreeMap<(String, String), Timestamp>,
    /// The earliest revisit noted since the ticker last armed, if earlier than what it armed for.
    rearm: bool,
    armed_at: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug)]
struct ProbeMemo {
    at: Timestamp,
    next: Option<Timestamp>,
}

/// Which events a probe answer saw: (events of every queue, events of its queue).
pub type ProbeEpoch = (u64, u64);

impl ProbeMemos {
    pub fn epoch(&self, queue: &str) -> ProbeEpoch {
        (
            self.all_events,
            self.queue_events.get(queue).copied().unwrap_or(0),
        )
    }

    /// An event of `queue` (`None`: of every queue): its answers are stale.
    pub fn note_event(&mut self, queue: Option<&str>) {
        match queue {
            Some(q) => {
                *self.queue_events.entry(q.to_string()).or_default() += 1;
                self.memos.retain(|(mq, _), _| mq != q);
                self.in_flight.retain(|(mq, _), _| mq != q);
            }
            None => {
                self.all_events += 1;
                self.memos.clear();
                self.in_flight.clear();
            }
        }
    }

    /// A probe issued at `epoch` answered (`next`: its answer, `None` for a failed probe): it is
    /// no longer in flight, and an answer of nothing claimable now (nothing pending, or when a
    /// lease or hold over a backlog ends) is kept unless an event of the queue came since.
    pub fn answered(
        &mut self,
        queue: &str,
        group: &str,
        epoch: ProbeEpoch,
        next: Option<Option<Timestamp>>,
        now: Timestamp,
    ) {
        let key = (queue.to_string(), group.to_string());
        self.in_flight.remove(&key);
        let Some(next) = next else { return };
        if epoch == self.epoch(queue) && next.is_none_or(|t| t > now) {
            self.memos.insert(key, ProbeMemo { at: now, next });
        }
    }

    /// A probe said something of (queue, group) becomes deliverable `at`.
    pub fn note_revisit(&mut self, queue: &str, group: &str, at: Timestamp, now: Timestamp) {
        if at <= now {
            return;
        }
        let slot = self
            .revisits
            .entry((queue.to_string(), group.to_string()))
            .or_insert(at);
        *slot = (*slot).min(at);
        if self.armed_at.is_none_or(|armed| at < armed) {
            self.rearm = true;
        }
    }

    /// The ticker arms for the earliest revisit (`None`: none held).
    fn arm(&mut self) -> Option<Timestamp> {
        self.rearm = false;
        self.armed_at = self.revisits.values().min().copied();
        self.armed_at
    }

    /// The queues with a revisit due by `now` (each once, in order); those revisits are done.
    fn take_due(&mut self, now: Timestamp) -> Vec<String> {
        let mut queues: Vec<String> = vec![];
        self.revisits.retain(|(queue, _), at| {
            if *at > now {
                return true;
            }
            if queues.last() != Some(queue) {
                queues.push(queue.clone());
            }
            false
        });
        queues
    }

    /// A probe of (queue, group) is issued now.
    pub fn issued(&mut self, queue: &str, group: &str, now: Timestamp) {
        self.in_flight
            .insert((queue.to_string(), group.to_string()), now);
    }

    /// The shared answer, if one is fresh (younger than `ttl_ms`) and still says nothing is
    /// claimable now: `Some(next)`; while another pop's probe (issued within `ttl_ms`) is in
    /// flight, `Some(None)`: nothing known, look again at the next interval.
    pub fn recall(
        &self,
        queue: &str,
        group: &str,
        now: Timestamp,
        ttl_ms: i64,
    ) -> Option<Option<Timestamp>> {
        let key = (queue.to_string(), group.to_string());
        let memo = self
            .memos
            .get(&key)
            .filter(|m| now < m.at.plus_millis(ttl_ms) && m.next.is_none_or(|t| t > now))
            .map(|m| m.next);
        memo.or_else(|| {
            self.in_flight
                .get(&key)
                .filter(|at| now < at.plus_millis(ttl_ms))
                .map(|_| None)
        })
    }
}

impl PopContext {
    pub fn new(rings: RingTable, event_bugs: crate::events::EventBugs) -> Self {
        PopContext {
            rings,
            configs: Default::default(),
            pop_maintenance: false,
            event_bugs,
            probes: ProbeMemos::default(),
            storage_away_until: None,
            storage_failures: 0,
        }
    }

    /// The broker's ticker arms for the earliest revisit of any ring's wheel or legacy probe.
    pub fn arm_ticker(&mut self) -> Option<Timestamp> {
        let (ring, probe) = (self.rings.arm_ticker(), self.probes.arm());
        ring.into_iter().chain(probe).min()
    }

    /// Whether a revisit earlier than the armed tick was scheduled since it armed.
    pub fn ticker_needs_rearm(&self) -> bool {
        self.rings.ticker_needs_rearm() || self.probes.rearm
    }

    /// The ticker fired: what came due on the rings' wheels moves to their ready queues, the
    /// legacy probes' revisits that came due are done; answers the queues whose gates open.
    pub fn advance_due(&mut self, now: Timestamp) -> Vec<String> {
        let mut queues = self.rings.advance_due(now);
        queues.extend(self.probes.take_due(now));
        queues.sort();
        queues.dedup();
        queues
    }

    /// A push landed: every ring of the queue learns it. A windowBuffer queue's partition waits
    /// on the wheel until it has been quiet for the window.
    pub(crate) fn note_push(&mut self, queue: &str, partition: &str, count: u64, now: Timestamp) {
        if matches!(
            self.configs.get(queue),
            Some(CachedConfig { config: None, .. })
        ) {
            // The queue was unknown when cached; the push may have created it.
            self.configs.remove(queue);
        }
        let window = self.window_buffer(queue);
        self.rings.note_push(queue, partition, count);
        if window > 0 {
            self.rings
                .defer_all_groups(queue, partition, now.plus_secs(i64::from(window)));
        }
    }

    fn config_fresh(&self, queue: &str, now: Timestamp, ttl_ms: i64) -> bool {
        self.configs
            .get(queue)
            .is_some_and(|c| now < c.fetched_at.plus_millis(ttl_ms))
    }
}

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

    /// The cheap in-memory check: decide whether there is real work before any permit.
    /// `recheck`: a parked pop's timer (not a new request or a wake), which on the legacy path
    /// may take the answer its (queue, group) shares.
    fn check(&mut self, now: Timestamp, ctx: &mut PopContext, recheck: bool) {
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
    fn check_hold(
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

    fn on_storage(
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
    fn on_storage_failed(
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

    /// A call failed as unreachable, and its work is still to do: a long-poll asks again once
    /// the broker-wide wait ends (`storage_away_until`), not after its empty-answer backoff,
    /// so the work is done within one wait of storage answering again. A call that lost to
    /// concurrent transactions (`Contention`) sets no wait and backs off as an empty answer.
    fn after_unreachable_storage(&mut self, now: Timestamp, woken: bool, ctx: &PopContext) {
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
    fn note_storage_away(&self, e: &StorageError, now: Timestamp, ctx: &mut PopContext) {
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
    fn wait_out_storage(&mut self, until: Timestamp, now: Timestamp) {
        if !self.params.wait || now >= self.deadline {
            return self.finish(PopReply::Empty);
        }
        let until = until.min(self.deadline);
        self.phase = Phase::Parked { until };
        self.effects.push_back(PopEffect::Park { until });
    }

    /// A ring pop's answer: each candidate's verdict goes back into the ring (those storage did
    /// not mention as not evaluated); an empty answer with the ring still ready tries again.
    fn on_list_pop(
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
    fn on_wildcard_pop(
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
    fn on_discovery_step(
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
    fn release_then_empty(&mut self, round: PermitRound, now: Timestamp) {
        self.effects
            .push_back(PopEffect::ReleasePermit { rtt_us: None });
        self.empty_or_park(now, round.woken);
    }

    /// `returned`: this pop's verdicts made partitions ready again (candidates storage did not
    /// get to, an autoAck partition with more, a push that raced the answer).
    fn deliver_or_wait(
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
    fn pass_wake_if_work_left(&mut self, now: Timestamp, ctx: &mut PopContext) {
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
    fn pass_wake_on_scan(&mut self) {
        if self.wakes_one_per_group() && !self.config.hotlist {
            self.effects.push_back(PopEffect::PassWake);
        }
    }

    /// Empty: answer now, or park (releasing everything) until a wake or the backoff timer.
    /// `woken`: an event landed while storage was answering (under an older snapshot).
    fn empty_or_park(&mut self, now: Timestamp, woken: bool) {
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
