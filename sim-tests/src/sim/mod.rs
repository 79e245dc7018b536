//! The deterministic simulation: brokers (the real server code, hyper over `turmoil::net`) on one
//! shared model database, clients speaking the real HTTP API, and the network, all in one process
//! and driven by one seed: turmoil's RNG and epoch, the model's statement interleaving, the
//! workload and the fault schedule. The run is recorded as a history the checkers judge.

pub mod conflation_check;
mod driver;
pub mod ephemeral_check;
mod ephemeral_clients;
pub mod fence_check;
pub mod history;
mod hosts;
pub mod http;
mod judge;
pub mod kv_check;
pub mod pop_reach;
pub mod reads_check;
pub mod streams_check;
mod workload;

use queen_core::storage::{AdminStorage, EphemeralConfigStorage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use queen_core::backoff::WaitBackoff;
use queen_core::events::EventBugs;
use queen_core::pop::PopBugs;
use queen_core::ring::RingBugs;
use queen_core::rng::SeededRng;
use queen_core::Timestamp;
use queen_server::broker::CrashPoint;
use queen_server::rounds::RoundsBugs;
use queen_storage_sim::{SimBugs, SimDb};

use history::{Event, History};

/// Simulated time starts here (2023-11-14), for every seed.
pub(crate) const EPOCH_SECS: u64 = 1_700_000_000;
/// Simulated time per step.
const TICK: Duration = Duration::from_millis(1);
/// The queue's lease: short, so expiries happen inside a run.
pub const LEASE_SECS: i64 = 2;
/// The re-check timing of a production deployment (POP_WAIT_INITIAL_INTERVAL_MS=1000,
/// POP_WAIT_BACKOFF_THRESHOLD=1, POP_WAIT_BACKOFF_MULTIPLIER=5, POP_WAIT_MAX_INTERVAL_MS=10000):
/// a parked pop re-checks after 1 s, then every 10 s, so only events and revisits can keep the
/// one-second bound.
pub const PRODUCTION_BACKOFF: WaitBackoff = WaitBackoff {
    initial_ms: 1000,
    threshold: 1,
    multiplier: 5.0,
    max_ms: 10_000,
};
/// The delivery bound: a message that becomes deliverable reaches a parked consumer of any
/// broker, on any pop route, within this long (network healed, wakes delivered).
pub const DELIVERY_BOUND_US: i64 = 1_000_000;
/// The bound while a broker's notification line is cut (events from the other broker are lost):
/// the sim's ring reseed interval, plus the longest re-check interval, plus slack.
const LOOSE_BOUND_US: i64 = (SIM_RESEED_INTERVAL_MS + 10_000 + 1_000) * 1_000;
/// The brokers' timer re-scan in the simulation: longer than the delivery bound, so a due timer
/// reaches a parked consumer in time only by its broker's own schedule event.
const SIM_TIMER_RESCAN_MS: u64 = 5_000;
/// The brokers' ring reseed interval in the simulation.
const SIM_RESEED_INTERVAL_MS: i64 = 5_000;
/// Names per page of a ring's reseed walk: two, so every reseed of the simulation's queues (a
/// few partitions each) walks page boundaries.
const SIM_RESEED_PAGE: u32 = 2;
/// The scale scenario's reseed page: its queue's walk is nine pages, the last past the first
/// contact's seed cap.
const SCALE_RESEED_PAGE: u32 = 32;
/// A pop counts as parked this long after it was sent (the network's latency is at most 2 ms in
/// the calm scenarios).
const PARK_SLACK_US: i64 = 20_000;

/// Which race or mix a run exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Pops of named partitions racing the pushes that create them.
    CreationRace,
    /// Many consumers of one group on few partitions (SKIP LOCKED), and a group's first contact.
    Contention,
    /// Every wake signal dropped: parked consumers rely on the backoff re-check.
    LostWakes,
    /// Two brokers, a mixed workload and the fault schedule.
    Faults,
    /// Two brokers on a calm network with a production re-check timing (1 s, then 10 s):
    /// consumers parked on every pop route wait on events and time-based revisits, and are
    /// held to the one-second delivery bound.
    Prompt,
    /// Two brokers running the retention worker (one at a time, under the maintenance lease)
    /// on a queue with completed and pending retention, while a group lags, a group makes first
    /// contact mid-run and new partitions keep appearing; brokers crash.
    Retention,
    /// Many partitions and groups: a queue of more partitions than a group's first contact
    /// seeds (`FIRST_CONTACT_SEED_CAP`: every cursor is made at its first claim), filled before any group's first pop, read by four groups
    /// that make first contact one after another, each with a consumer on a hot-list broker and
    /// one on a broker without it; reseed walks of several pages and the wildcard scan's window.
    Scale,
}

/// The historical bugs a run may re-introduce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    pub sim: SimBugs,
    pub ring: RingBugs,
    pub pop: PopBugs,
    pub events: EventBugs,
    pub rounds: RoundsBugs,
    pub timers: queen_core::timers::TimerBugs,
    pub ephemeral: queen_core::ephemeral::EphemeralBugs,
}

/// One broker's notification line (its LISTEN connection): the driver can cut it, losing every
/// notification meanwhile, and restore it, which resyncs the broker as a reconnect does.
#[derive(Default)]
struct ListenLine {
    down: AtomicBool,
    /// The current incarnation's event channel.
    events: Mutex<Option<tokio::sync::mpsc::UnboundedSender<queen_core::events::DeliveryEvent>>>,
    dropped: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub seed: u64,
    pub scenario: Scenario,
    pub bugs: Bugs,
    /// The work phase (faults and traffic) in simulated milliseconds; the drain follows.
    pub work_ms: u64,
    /// Fault kinds switched off (a shrunk schedule); the seed draws the rest as always.
    pub quiet: FaultKinds,
}

/// The default work phase.
pub const WORK_MS: u64 = 12_000;

impl Spec {
    pub fn new(seed: u64, scenario: Scenario, bugs: Bugs) -> Spec {
        Spec {
            seed,
            scenario,
            bugs,
            work_ms: WORK_MS,
            quiet: FaultKinds::NONE,
        }
    }
}

/// A set of fault kinds, by name (`SIM_QUIET=hold,crash` switches those off in a replay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultKinds(u8);

impl FaultKinds {
    pub const NONE: FaultKinds = FaultKinds(0);
    pub const NAMES: [&'static str; 7] = [
        "hold",
        "partition",
        "crash",
        "aimed-crash",
        "drop-wake",
        "delay-wake",
        "owner-cut",
    ];

    pub fn with(self, name: &str) -> FaultKinds {
        match Self::NAMES.iter().position(|n| *n == name) {
            Some(i) => FaultKinds(self.0 | 1 << i),
            None => self,
        }
    }

    pub fn has(self, name: &str) -> bool {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .is_some_and(|i| self.0 & 1 << i != 0)
    }

    /// Parses `SIM_QUIET`'s comma-separated names; an unknown name is an error.
    pub fn parse(list: &str) -> Result<FaultKinds, String> {
        list.split(',')
            .filter(|n| !n.is_empty())
            .try_fold(FaultKinds::NONE, |k, n| {
                if Self::NAMES.contains(&n) {
                    Ok(k.with(n))
                } else {
                    Err(format!(
                        "SIM_QUIET: no fault kind {n:?}; kinds: {:?}",
                        Self::NAMES
                    ))
                }
            })
    }

    pub fn names(self) -> String {
        Self::NAMES
            .iter()
            .filter(|n| self.has(n))
            .copied()
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Faults {
    /// The plan with the quiet kinds switched off.
    fn quieted(mut self, quiet: FaultKinds) -> Faults {
        if quiet.has("hold") {
            self.hold = 0.0;
        }
        if quiet.has("partition") {
            self.partition = 0.0;
        }
        if quiet.has("crash") {
            self.crash = 0.0;
        }
        if quiet.has("aimed-crash") {
            self.aimed_crash = 0.0;
        }
        if quiet.has("drop-wake") {
            self.drop_wake = 0.0;
        }
        if quiet.has("delay-wake") {
            self.delay_wake = 0.0;
        }
        if quiet.has("owner-cut") {
            self.owner_cut = 0.0;
        }
        self
    }
}

/// Shrinks a failing run to a shorter, quieter schedule that still fails (`fails` runs a spec
/// and says whether it fails the same way): the work phase halved while it still fails, then
/// each fault kind switched off in turn when the failure survives without it. Same seed
/// throughout, so every step is a deterministic replay. Returns the smallest failing spec.
pub fn shrink(spec: Spec, fails: impl Fn(Spec) -> bool) -> Spec {
    let mut best = spec;
    while best.work_ms > 1_000 {
        let shorter = Spec {
            work_ms: best.work_ms / 2,
            ..best
        };
        if !fails(shorter) {
            break;
        }
        best = shorter;
    }
    for kind in FaultKinds::NAMES {
        if best.quiet.has(kind) {
            continue;
        }
        let quieter = Spec {
            quiet: best.quiet.with(kind),
            ..best
        };
        if fails(quieter) {
            best = quieter;
        }
    }
    best
}

/// What a run produced: the checkers' findings, coverage counters and a hash of the full trace.
#[derive(Debug, Default)]
pub struct Outcome {
    pub violations: Vec<String>,
    pub coverage: BTreeMap<&'static str, u64>,
    pub trace_hash: u64,
    /// The last events, for a failure report.
    pub trace_tail: Vec<String>,
    pub simulated_secs: f64,
}

/// The fault plan drawn from the seed: some runs calm, some brutal.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub max_latency_ms: u64,
    /// Per-second chances of each fault.
    pub hold: f64,
    pub partition: f64,
    pub crash: f64,
    /// Crashes aimed at a chosen point of a request (after a claim, push, ack or transaction
    /// committed and before its answer, or in a parked long-poll), per second.
    pub aimed_crash: f64,
    pub drop_wake: f64,
    pub delay_wake: f64,
    /// A broker's reach to its ephemeral owner rows cut (its liveness lapses while it runs).
    pub owner_cut: f64,
    pub dying_consumer: bool,
    pub lease_boundary: bool,
}

impl Faults {
    fn draw(rng: &mut SeededRng, scenario: Scenario) -> Faults {
        let level = rng.below(3); // 0 calm, 1 rough, 2 brutal
        let f = |x: f64| x * level as f64;
        let mut faults = Faults {
            max_latency_ms: [2, 20, 80][level as usize],
            hold: f(0.15),
            partition: f(0.1),
            crash: f(0.06),
            aimed_crash: f(0.08),
            drop_wake: f(0.25),
            delay_wake: f(0.2),
            owner_cut: f(0.06),
            dying_consumer: level > 0 || rng.below(2) == 0,
            lease_boundary: level > 0,
        };
        match scenario {
            Scenario::Faults => {}
            // The race scenarios run on a quiet network so the race, not the faults, decides.
            Scenario::LostWakes => {
                // Every wake dropped, or most: the wakes that get through make consumers pop
                // while the next push of a burst lands (the ring's epoch race).
                let drop_wake = if level == 0 { 1.0 } else { 0.6 };
                faults = Faults {
                    max_latency_ms: 2,
                    hold: 0.0,
                    partition: 0.0,
                    crash: 0.0,
                    aimed_crash: 0.0,
                    drop_wake,
                    delay_wake: 0.0,
                    owner_cut: 0.0,
                    dying_consumer: false,
                    lease_boundary: false,
                };
            }
            Scenario::Prompt => {
                // Calm: the bound under test is the broker's, not the network's.
                faults = Faults {
                    max_latency_ms: 2,
                    hold: 0.0,
                    partition: 0.0,
                    crash: 0.0,
                    aimed_crash: 0.0,
                    drop_wake: 0.0,
                    delay_wake: 0.0,
                    owner_cut: 0.0,
                    dying_consumer: true,
                    lease_boundary: false,
                };
            }
            Scenario::Retention => {
                faults = Faults {
                    max_latency_ms: 2,
                    hold: 0.0,
                    partition: 0.0,
                    aimed_crash: 0.0,
                    owner_cut: 0.0,
                    dying_consumer: false,
                    lease_boundary: false,
                    ..faults
                };
            }
            Scenario::CreationRace | Scenario::Contention | Scenario::Scale => {
                faults = Faults {
                    max_latency_ms: 2,
                    hold: 0.0,
                    partition: 0.0,
                    crash: 0.0,
                    aimed_crash: 0.0,
                    drop_wake: faults.drop_wake,
                    delay_wake: faults.delay_wake,
                    owner_cut: 0.0,
                    dying_consumer: false,
                    lease_boundary: false,
                };
            }
        }
        faults
    }
}

/// An aimed crash of one broker: the point armed, and whether a request reached it.
#[derive(Debug, Default)]
struct Aim {
    point: Option<CrashPoint>,
    reached: bool,
}

const AIMED_POINTS: [CrashPoint; 5] = [
    CrashPoint::PopClaimed,
    CrashPoint::PushStored,
    CrashPoint::AckStored,
    CrashPoint::TransactionStored,
    CrashPoint::LongPollParked,
];

trait CoverageLabel {
    fn coverage_label(self) -> &'static str;
}

impl CoverageLabel for CrashPoint {
    fn coverage_label(self) -> &'static str {
        match self {
            CrashPoint::PopClaimed => "fault: crash after a claim, before its answer",
            CrashPoint::PushStored => "fault: crash after a push committed, before its answer",
            CrashPoint::AckStored => "fault: crash after an ack committed, before its answer",
            CrashPoint::TransactionStored => {
                "fault: crash after a transaction committed, before its answer"
            }
            CrashPoint::LongPollParked => "fault: crash with a long-poll parked",
        }
    }
}

/// A consumer's pop in flight, for the liveness checker: what it waits on and since when.
#[derive(Clone, Debug)]
pub struct Wait {
    pub consumer: String,
    pub group: &'static str,
    /// The queues it may be served from (one, or a namespace's).
    pub queues: Vec<&'static str>,
    /// `Some`: only this partition (the single-partition route).
    pub partition: Option<&'static str>,
    pub since: i64,
}

/// Shared by the driver and the simulated clients.
pub(crate) struct Shared {
    pub history: History,
    /// Set when the work phase ends: producers stop, consumers drain.
    pub draining: AtomicBool,
    /// Set by the driver once nothing is pending: consumers leave.
    pub done: AtomicBool,
    pub faults: Faults,
    pub brokers: Vec<String>,
    /// Set once retention removed what g1 and g2 consumed: the late group starts.
    pub late_group_go: AtomicBool,
    /// Pop ids, unique across consumers (the history matches answers to invocations by id).
    pub next_pop_id: AtomicU64,
    /// Pops in flight by consumer, for the liveness checker.
    pub waits: Mutex<BTreeMap<String, Wait>>,
    /// Deliveries by (group, partition), for the liveness checker.
    pub delivered: Mutex<BTreeMap<(String, String), u64>>,
    /// Coverage counters the clients bump.
    pub counters: Mutex<BTreeMap<&'static str, u64>>,
    /// Each timer's transaction id → the earliest `deliverAt` a schedule of it answered
    /// (simulated microseconds), for the never-early checker.
    pub timer_due: Mutex<BTreeMap<String, i64>>,
    /// The KV clients' calls, for the per-key linearizability checker.
    pub kv_calls: Mutex<Vec<kv_check::KvCall>>,
    /// The KV clients' increments of the rate-limit counter, in the order they ended.
    pub incr_calls: Mutex<Vec<kv_check::IncrOutcome>>,
    /// The KV clients' reads of the pair keys: (first, second) values seen in one snapshot.
    pub pair_reads: Mutex<Vec<(Option<i64>, Option<i64>)>>,
    /// The KV clients' calls on the TTL key.
    pub ttl_calls: Mutex<Vec<kv_check::TtlCall>>,
    /// The fenced resources the lockers write with their tokens, per (lock, slot).
    pub fenced: Mutex<BTreeMap<(String, u64), fence_check::FencedResource>>,
    /// Refused lock acquires: (lock, invoked at, the holders' tokens the refusal named).
    pub lock_refusals: Mutex<Vec<(String, i64, Vec<i64>)>>,
    /// What the retention scenario's reader fetched, in the order it read.
    pub fetches: Mutex<Vec<reads_check::FetchSeen>>,
    /// The faults scenario's stream cycles, in the order they ended.
    pub stream_cycles: Mutex<Vec<streams_check::StreamCycle>>,
    /// The faults scenario's window closings (cycles and idle flushes), in the order they ended.
    pub window_closes: Mutex<Vec<streams_check::WindowClose>>,
    /// What the faults scenario's conflating consumers saw and did, in order.
    pub conflation_seen: Mutex<Vec<conflation_check::ConflationSeen>>,
    /// What the ephemeral clients saw and did, in order.
    pub ephemeral: Mutex<ephemeral_check::Log>,
    /// The ephemeral consumers' pops in flight, for the delivery bound (prompt scenario).
    pub ephemeral_waits: Mutex<BTreeMap<String, Wait>>,
}

fn set_wait_in(waits: &Mutex<BTreeMap<String, Wait>>, consumer: &str, wait: Option<Wait>) {
    if let Ok(mut w) = waits.lock() {
        match wait {
            Some(wait) => w.insert(consumer.to_string(), wait),
            None => w.remove(consumer),
        };
    }
}

/// A seeded coin with probability `p`.
pub(crate) fn hit(rng: &mut SeededRng, p: f64) -> bool {
    (rng.below(1_000_000) as f64) < p * 1_000_000.0
}

impl Shared {
    pub fn bump(&self, what: &'static str) {
        if let Ok(mut c) = self.counters.lock() {
            *c.entry(what).or_default() += 1;
        }
    }
    /// Simulated microseconds since the run began.
    pub fn now(&self) -> i64 {
        turmoil::sim_elapsed().map_or(0, |d| d.as_micros() as i64)
    }
    pub fn record(&self, e: Event) {
        self.history.record(e);
    }
    /// A durable consumer's pop in flight (`None`: answered).
    pub fn set_wait(&self, consumer: &str, wait: Option<Wait>) {
        set_wait_in(&self.waits, consumer, wait);
    }
    /// An ephemeral consumer's pop in flight (`None`: answered).
    pub fn set_ephemeral_wait(&self, consumer: &str, wait: Option<Wait>) {
        set_wait_in(&self.ephemeral_waits, consumer, wait);
    }
    /// The durable consumers' pops in flight and the deliveries so far, for the delivery bound.
    fn durable_waits(&self) -> (Vec<Wait>, BTreeMap<(String, String), u64>) {
        let waits = self
            .waits
            .lock()
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default();
        let delivered = self.delivered.lock().map(|d| d.clone()).unwrap_or_default();
        (waits, delivered)
    }

    /// The ephemeral consumers' pops in flight, and what was stored and received so far.
    fn ephemeral_waits(&self) -> (Vec<Wait>, ephemeral_check::Tally) {
        let waits = self
            .ephemeral_waits
            .lock()
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default();
        let mut tally = ephemeral_check::Tally {
            partitions: ephemeral_clients::PARTITIONS
                .iter()
                .map(|p| p.to_string())
                .collect(),
            stored: BTreeMap::new(),
            received: BTreeMap::new(),
        };
        if let Ok(log) = self.ephemeral.lock() {
            for p in log.pushes.iter().filter(|p| p.stored.is_some()) {
                *tally.stored.entry(p.partition.clone()).or_default() += p.count;
            }
            for r in &log.received {
                *tally
                    .received
                    .entry((r.group.clone(), r.partition.clone()))
                    .or_default() += 1;
            }
        }
        (waits, tally)
    }

    pub fn note_delivered(&self, group: &str, partition: &str) {
        if let Ok(mut d) = self.delivered.lock() {
            *d.entry((group.to_string(), partition.to_string()))
                .or_default() += 1;
        }
    }
}

/// The brokers' (and the model's) clock reading at `micros` of simulated time.
pub(crate) fn sim_timestamp(micros: i64) -> Timestamp {
    Timestamp(Timestamp::from_secs(EPOCH_SECS as i64).0 + micros)
}

/// The broker's and the model's clock: the simulation's time, from its epoch.
fn sim_clock(last: Arc<AtomicI64>) -> Arc<dyn Fn() -> Timestamp + Send + Sync> {
    Arc::new(move || match turmoil::sim_elapsed() {
        Some(d) => {
            let t = Timestamp::from_secs(EPOCH_SECS as i64).0 + d.as_micros() as i64;
            last.store(t, Ordering::SeqCst);
            Timestamp(t)
        }
        None => Timestamp(last.load(Ordering::SeqCst)),
    })
}

/// A seeded turmoil RNG (turmoil 0.6 takes any `RngCore`).
struct TurmoilRng(SeededRng);

impl rand::RngCore for TurmoilRng {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill(dest);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.0.fill(dest);
        Ok(())
    }
}

/// Every queue of the workload (`workload::queue_options`), before the simulation starts.
fn configure_queues(db: &Arc<SimDb>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("a runtime for the set-up: {e}"),
    };
    for q in workload::QUEUES {
        if let Err(e) = rt.block_on(db.configure_queue(workload::queue_options(q))) {
            panic!("configure {q}: {e}");
        }
    }
    let (q, options) = (ephemeral_clients::QUEUE, ephemeral_clients::options());
    if let Err(e) = rt.block_on(db.save_ephemeral_config(q, &options)) {
        panic!("declare the ephemeral queue {q}: {e}");
    }
}

/// One simulated run: the model, the brokers and the clients on turmoil, the driver's faults
/// and drain, then the checkers' verdicts.
pub fn run(spec: Spec) -> Outcome {
    let root = SeededRng::new(spec.seed);
    let faults = Faults::draw(&mut root.child("faults"), spec.scenario).quieted(spec.quiet);
    let last = Arc::new(AtomicI64::new(Timestamp::from_secs(EPOCH_SECS as i64).0));
    let clock = sim_clock(last.clone());
    let db = hosts::model_db(&spec, &root, clock.clone());
    let shared = Arc::new(Shared {
        history: History::default(),
        draining: AtomicBool::new(false),
        done: AtomicBool::new(false),
        faults,
        brokers: hosts::broker_names(spec.scenario),
        counters: Mutex::new(BTreeMap::new()),
        timer_due: Mutex::new(BTreeMap::new()),
        kv_calls: Mutex::new(vec![]),
        incr_calls: Mutex::new(vec![]),
        pair_reads: Mutex::new(vec![]),
        ttl_calls: Mutex::new(vec![]),
        lock_refusals: Mutex::new(vec![]),
        fenced: Mutex::new(BTreeMap::new()),
        fetches: Mutex::new(vec![]),
        stream_cycles: Mutex::new(vec![]),
        window_closes: Mutex::new(vec![]),
        conflation_seen: Mutex::new(vec![]),
        ephemeral: Mutex::new(ephemeral_check::Log::default()),
        ephemeral_waits: Mutex::new(BTreeMap::new()),
        next_pop_id: AtomicU64::new(1),
        waits: Mutex::new(BTreeMap::new()),
        delivered: Mutex::new(BTreeMap::new()),
        late_group_go: AtomicBool::new(false),
    });
    configure_queues(&db);

    let mut sim = turmoil::Builder::new()
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .simulation_duration(Duration::from_secs(120))
        .tick_duration(TICK)
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(faults.max_latency_ms))
        .build_with_rng(Box::new(TurmoilRng(root.child("turmoil"))));
    let fleet = hosts::Fleet::start(&mut sim, &root, &spec, &faults, &db, &clock);
    workload::spawn_clients(
        &mut sim,
        &shared,
        spec.scenario,
        &mut root.child("workload"),
    );
    let mut driver = driver::Driver::new(spec, faults, root.child("driver"), &fleet, &shared, &db);
    driver.drive(&mut sim);
    let simulated_secs = sim.elapsed().as_secs_f64();
    drop(sim);
    judge::judge(&spec, &shared, &db, &fleet, driver, simulated_secs)
}

/// What the delivery-bound checker asks of a backend: a queue's partitions, and whether a group
/// has a message deliverable in one of them now.
pub(crate) trait Deliverable {
    fn partitions(&self, queue: &str) -> Vec<String>;
    fn open(&self, queue: &str, partition: &str, group: &str) -> bool;
    /// The queue's partitions that are open to `group` now, by name (`open` of each, unless a
    /// backend has a quicker way).
    fn open_partitions(&self, queue: &str, group: &str) -> Vec<String> {
        self.partitions(queue)
            .into_iter()
            .filter(|p| self.open(queue, p, group))
            .collect()
    }
    /// One open partition, for a report.
    fn describe(&self, queue: &str, partition: &str, group: &str) -> String;
}

/// The durable queues: the model's own claim rules.
impl Deliverable for SimDb {
    fn partitions(&self, queue: &str) -> Vec<String> {
        SimDb::partitions(self, queue)
    }

    fn open(&self, queue: &str, partition: &str, group: &str) -> bool {
        self.deliverable_now(queue, partition, group)
    }

    fn open_partitions(&self, queue: &str, group: &str) -> Vec<String> {
        self.deliverable_partitions(queue, group)
    }

    fn describe(&self, queue: &str, partition: &str, group: &str) -> String {
        format!("{partition} {:?}", self.cursor(queue, partition, group))
    }
}

/// A delivery-bound scope: (queue, group, partition or `None` for queue-wide).
type Scope = (String, String, Option<String>);

/// The delivery-bound checker, run at every step of the driver: while something is deliverable
/// to a group (by the model's own claim rules, `SimDb::deliverable_now`) and a consumer of that
/// group is parked where it could take it (its queue, its partition, its namespace), some
/// consumer of the group must receive a message of it within the bound. A delivery to the
/// group from that partition (or queue) restarts the clock.
struct Liveness {
    bound_us: i64,
    /// While a notification line is cut.
    loose_bound_us: i64,
    /// When the last cut (a notification line, a broker's pops) was restored, or when its broker
    /// can know it: a stall is timed from then at the latest.
    restored_at: i64,
    outage: bool,
    /// (queue, group, partition or None for queue-wide) -> (stalled since, deliveries then).
    stalls: BTreeMap<Scope, (i64, u64)>,
    /// The longest stall that ended in a delivery, and how many stalls were judged.
    longest_us: i64,
    judged: u64,
}

/// A liveness finding: the stalled scope, the consumers parked there and what was open to them;
/// `(now, started, bound)` in simulated microseconds.
fn stall_finding(
    key: &Scope,
    waits: &[&Wait],
    open: &[String],
    backend: &dyn Deliverable,
    (now, started, bound): (i64, i64, i64),
) -> String {
    let (queue, group, partition) = key;
    let context: String = waits
        .iter()
        .map(|w| {
            format!(
                " [{} parked since {} ms; open: {}]",
                w.consumer,
                w.since / 1000,
                open.iter()
                    .map(|p| backend.describe(queue, p, group))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    format!(
        "liveness: {queue}/{} had a message deliverable to {group} and a parked \
         consumer for {} ms with no delivery (bound {} ms), at {} ms:{}",
        partition.as_deref().unwrap_or("*"),
        (now - started) / 1000,
        bound / 1000,
        now / 1000,
        context
    )
}

impl Liveness {
    fn new(bound_us: i64) -> Self {
        Liveness {
            bound_us,
            loose_bound_us: LOOSE_BOUND_US,
            restored_at: 0,
            outage: false,
            stalls: BTreeMap::new(),
            longest_us: 0,
            judged: 0,
        }
    }

    /// `now`: simulated microseconds since the start (the driver's clock: it runs outside the
    /// simulated hosts, where `Shared::now` reads nothing).
    /// `outage`: a broker's notification line is cut now (the looser bound applies).
    /// `waits`: the consumers' pops in flight; `delivered`: deliveries so far by (group,
    /// partition); `backend`: what is deliverable now.
    fn check(
        &mut self,
        now: i64,
        outage: bool,
        waits: &[Wait],
        delivered: &BTreeMap<(String, String), u64>,
        backend: &dyn Deliverable,
    ) -> Vec<String> {
        if self.outage && !outage {
            self.restored_at = self.restored_at.max(now);
        }
        self.outage = outage;
        // The scopes with a consumer parked past the slack: (queue, group, partition scope) ->
        // the consumers parked there, in the order of `waits`. Each scope is asked of the
        // backend once, however many of a group's consumers wait on it.
        let mut parked: BTreeMap<Scope, Vec<&Wait>> = BTreeMap::new();
        for w in waits.iter().filter(|w| now - w.since >= PARK_SLACK_US) {
            for queue in &w.queues {
                let key = (
                    queue.to_string(),
                    w.group.to_string(),
                    w.partition.map(str::to_string),
                );
                parked.entry(key).or_default().push(w);
            }
        }
        // What is deliverable now to a parked consumer: scope -> the deliveries so far to that
        // group from the partitions in scope, and the open partitions (for a report).
        let mut stalled: BTreeMap<Scope, (u64, Vec<String>)> = BTreeMap::new();
        for key in parked.keys() {
            let (queue, group, partition) = key;
            let (open, seen) = match partition {
                Some(p) => {
                    if !backend.open(queue, p, group) {
                        continue;
                    }
                    let seen = delivered
                        .get(&(group.clone(), p.clone()))
                        .copied()
                        .unwrap_or(0);
                    (vec![p.clone()], seen)
                }
                None => {
                    let open = backend.open_partitions(queue, group);
                    if open.is_empty() {
                        continue;
                    }
                    // The group's deliveries from any partition of the queue.
                    let partitions: BTreeSet<String> =
                        backend.partitions(queue).into_iter().collect();
                    let seen = delivered
                        .range((group.clone(), String::new())..)
                        .take_while(|((g, _), _)| g == group)
                        .filter(|((_, p), _)| partitions.contains(p))
                        .map(|(_, n)| n)
                        .sum();
                    (open, seen)
                }
            };
            stalled.insert(key.clone(), (seen, open));
        }
        let mut out = vec![];
        let ended: Vec<_> = self
            .stalls
            .keys()
            .filter(|k| !stalled.contains_key(*k))
            .cloned()
            .collect();
        for key in ended {
            self.stalls.remove(&key);
            self.judged += 1;
        }
        for (key, (seen, open)) in stalled {
            let entry = self.stalls.entry(key.clone()).or_insert((now, seen));
            if entry.1 != seen {
                // A delivery from this scope: the group made progress. Outside a cut line, the
                // stall is timed as the bound judges it.
                self.judged += 1;
                if !outage {
                    self.longest_us = self.longest_us.max(now - entry.0.max(self.restored_at));
                }
                *entry = (now, seen);
            }
            // A lost notification is made good by the reconnect's resync: from then on, the
            // tight bound holds again.
            let (started, bound) = if outage {
                (entry.0, self.loose_bound_us)
            } else {
                (entry.0.max(self.restored_at), self.bound_us)
            };
            if now - started > bound {
                // Built only for a finding: the checker runs at every step.
                let waits = parked.get(&key).map(Vec::as_slice).unwrap_or_default();
                out.push(stall_finding(
                    &key,
                    waits,
                    &open,
                    backend,
                    (now, started, bound),
                ));
                // One finding per stall.
                *entry = (now, seen);
            }
        }
        out
    }

    /// Stalls are timed from `at` at the earliest: what was cut is restored, and the broker cannot
    /// know it before then.
    fn hold_from(&mut self, at: i64) {
        self.restored_at = self.restored_at.max(at);
    }

    fn coverage(&self) -> [(&'static str, u64); 2] {
        [
            ("liveness: stalls judged against the bound", self.judged),
            (
                "liveness: longest stall before a delivery, no line cut (ms)",
                u64::try_from(self.longest_us / 1000).unwrap_or(0),
            ),
        ]
    }
}
