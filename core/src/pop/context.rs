//! What the pop machines of one broker share: the rings, cached queue configs, the legacy
//! path's probe answers, the wait after storage failed; and each machine's configuration and
//! bug switches.

use crate::backoff::WaitBackoff;
use crate::ring::{RingTable, DEFAULT_CONFIG_TTL_MS};
use crate::storage::QueueConfig;
use crate::types::Timestamp;

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

    pub(super) fn config_fresh(&self, queue: &str, now: Timestamp, ttl_ms: i64) -> bool {
        self.configs
            .get(queue)
            .is_some_and(|c| now < c.fetched_at.plus_millis(ttl_ms))
    }
}
