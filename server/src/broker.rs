//! Shared broker state: storage, the pop scheduler's context, the serving limiter, per-queue
//! wake gates, id minting and metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use queen_core::events::{DeliveryEvent, EventBugs, Wake};
use queen_core::ids::IdMinter;
use queen_core::ledger::DeliveryLedger;
use queen_core::limiter::GradientLimiter;
use queen_core::pop::{PopConfig, PopContext};
use queen_core::ring::{RingBugs, RingTable, DEFAULT_RESEED_INTERVAL_MS};
use queen_core::rng::SeededRng;
use queen_core::storage::StorageSet;
use queen_core::{Timestamp, WorkerId};
use tokio::sync::{watch, Notify};

use crate::config::ServerConfig;
use crate::helpers::{lock, wall_now};
use crate::metrics::Metrics;

/// The adaptive serving limiter behind an async acquire. Not a `tokio::sync::Semaphore`: the limit
/// moves on every latency sample, and a semaphore cannot take back permits that are out (it could
/// only forget them as they come back); here the limit is a number compared at acquire.
pub struct Limiter {
    state: Mutex<GradientLimiter>,
    released: Notify,
}

impl Limiter {
    pub fn new(config: queen_core::limiter::LimiterConfig) -> Self {
        Limiter {
            state: Mutex::new(GradientLimiter::new(config)),
            released: Notify::new(),
        }
    }

    pub async fn acquire(&self) {
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.state).try_acquire() {
                return;
            }
            notified.await;
        }
    }

    pub fn release(&self, rtt_us: Option<u64>) {
        lock(&self.state).release(rtt_us);
        self.released.notify_one();
    }

    /// (limit, in flight).
    pub fn state(&self) -> (u32, u32) {
        let s = lock(&self.state);
        (s.limit(), s.in_flight())
    }
}

/// A queue's wake gate: a sequence number bumped by every event of the queue, a FIFO of parked
/// waiters that every event wakes (named partitions, discovery), and per consumer group a FIFO
/// of parked queue-wide pops that an event wakes one at a time (on the hot-list path only when
/// the group's ring has work). No thundering herd: a push to one partition wakes one of ten
/// thousand parked consumers, and the woken pop hands the wake on when it may leave work
/// behind (`PopEffect::PassWake`).
/// (Not `tokio::sync::watch`: its waiters sit in randomly chosen shards, so the order in which
/// parked pops wake, and the simulation's trace, would depend on tokio's unseeded RNG.)
#[derive(Default)]
pub struct Gate {
    seq: AtomicU64,
    notify: Notify,
    /// Parked queue-wide pops by consumer group. `Notify::notify_one` wakes the longest-parked, keeps
    /// the wake for the next pop to park when none is parked, and passes it on when the pop it
    /// chose is dropped before it ran (its client left).
    groups: Mutex<BTreeMap<String, Arc<Notify>>>,
    /// When it last opened (µs, the broker's clock): a woken pop's wake latency starts here.
    opened_at_us: std::sync::atomic::AtomicI64,
}

impl Gate {
    /// Opens the gate: every waiter outside a group list wakes, and one queue-wide pop of each
    /// group in `groups`.
    fn open(&self, now: Timestamp, groups: &[Arc<Notify>]) {
        self.opened_at_us.store(now.0, Ordering::SeqCst);
        self.seq.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
        for group in groups {
            group.notify_one();
        }
    }

    /// The groups with a queue-wide pop parked or about to park (someone besides this map holds
    /// their list).
    fn parked_groups(&self) -> Vec<(String, Arc<Notify>)> {
        lock(&self.groups)
            .iter()
            .filter(|(_, n)| Arc::strong_count(n) > 1)
            .map(|(g, n)| (g.clone(), n.clone()))
            .collect()
    }
}

/// One parked pop's view of a gate: what it has already seen, and for a queue-wide pop its
/// group's wake list.
pub struct GateWatch {
    gate: Arc<Gate>,
    seen: u64,
    group: Option<Arc<Notify>>,
}

impl GateWatch {
    /// Marks everything so far as seen; answers whether the gate opened since it was last
    /// seen (a wake that came while the pop was busy with a permit or a storage call).
    pub fn mark_seen(&mut self) -> bool {
        let now = self.gate.seq.load(Ordering::SeqCst);
        let missed = now != self.seen;
        self.seen = now;
        missed
    }

    /// When the gate last opened.
    pub fn opened_at(&self) -> Timestamp {
        Timestamp(self.gate.opened_at_us.load(Ordering::SeqCst))
    }

    /// Resolves once the gate opened after the last `mark_seen` (or `changed`); a queue-wide pop,
    /// once it opened before the pop parked, or once a wake chose it.
    pub async fn changed(&mut self) {
        loop {
            let notified = self.gate.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let chosen = self.group.as_ref().map(|g| g.notified());
            tokio::pin!(chosen);
            if let Some(chosen) = chosen.as_mut().as_pin_mut() {
                chosen.enable();
            }
            let now = self.gate.seq.load(Ordering::SeqCst);
            if now != self.seen {
                self.seen = now;
                return;
            }
            match chosen.as_mut().as_pin_mut() {
                Some(chosen) => {
                    chosen.await;
                    self.seen = self.gate.seq.load(Ordering::SeqCst);
                    return;
                }
                None => notified.await,
            }
        }
    }
}

/// What happens to one wake signal (a simulation's fault; production always delivers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeFate {
    Deliver,
    Drop,
    Delay(std::time::Duration),
}

/// Decides the fate of a queue's wake signal.
pub type WakeFilter = Arc<dyn Fn(&str) -> WakeFate + Send + Sync>;

/// A moment in a request where a simulation may kill the broker: after storage committed (or
/// claimed) and before the client hears of it, or while a long-poll is parked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// A pop claimed and leased a batch; the answer is not sent yet.
    PopClaimed,
    /// A push committed; the answer is not sent yet.
    PushStored,
    /// An ack committed; the answer is not sent yet.
    AckStored,
    /// A transaction committed; the answer is not sent yet.
    TransactionStored,
    /// A long-poll is parked.
    LongPollParked,
}

/// Told of every crash point a request reaches; `true`: the broker is to die here, so the
/// request goes no further (the simulation crashes the host next).
pub type CrashHook = Arc<dyn Fn(CrashPoint) -> bool + Send + Sync>;

/// What a deterministic simulation replaces in a broker: the clock, the wake signal (it may be
/// dropped), the historical-bug switches of the hot-list ring and the pop machine, and the
/// points where it may kill the broker.
#[derive(Clone)]
pub struct Hooks {
    pub clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Drops or delays wake signals (lost and late wakes).
    pub wake_fate: Option<WakeFilter>,
    pub ring_bugs: RingBugs,
    pub pop_bugs: queen_core::pop::PopBugs,
    pub event_bugs: EventBugs,
    pub rounds_bugs: crate::rounds::RoundsBugs,
    /// Scheduler turns a new storage round waits for company (`rounds::COMPANY_YIELDS`); a
    /// simulation varies it, since it moves where a broker's tasks interleave.
    pub round_company_yields: usize,
    pub reseed_interval_ms: i64,
    /// Names per page of a ring's reseed walk.
    pub reseed_page: u32,
    pub crash_points: Option<CrashHook>,
    /// The longest the timer worker sleeps without reading the earliest due time again.
    pub timer_rescan_ms: u64,
    pub timer_bugs: queen_core::timers::TimerBugs,
    /// How this broker dials its peers (ephemeral forwards): TCP, or a simulation's network.
    pub peer_connector: crate::peers::PeerConnector,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            clock: Arc::new(wall_now),
            wake_fate: None,
            ring_bugs: RingBugs::default(),
            pop_bugs: queen_core::pop::PopBugs::default(),
            event_bugs: EventBugs::default(),
            rounds_bugs: crate::rounds::RoundsBugs::default(),
            round_company_yields: crate::rounds::COMPANY_YIELDS,
            reseed_interval_ms: DEFAULT_RESEED_INTERVAL_MS,
            reseed_page: queen_core::ring::DEFAULT_RESEED_PAGE,
            crash_points: None,
            timer_rescan_ms: queen_core::timers::RESCAN_MS,
            timer_bugs: queen_core::timers::TimerBugs::default(),
            peer_connector: crate::peers::tcp_connector(),
        }
    }
}

pub struct Broker {
    pub config: ServerConfig,
    hooks: Hooks,
    pub storage: StorageSet,
    pub pop_config: PopConfig,
    pub pop_ctx: Mutex<PopContext>,
    pub limiter: Limiter,
    gates: Mutex<BTreeMap<String, Arc<Gate>>>,
    ids: Mutex<IdMinter>,
    pub metrics: Metrics,
    pub shutting_down: watch::Sender<bool>,
    /// Push maintenance mode: pushes go to the file buffer, not to storage.
    pub push_maintenance: std::sync::atomic::AtomicBool,
    /// Told when the file buffer has something new to drain, or maintenance mode ended.
    pub(crate) drain_wake: Arc<Notify>,
    /// Told when a ring scheduled a revisit earlier than the wheel ticker sleeps until.
    pub(crate) ticker_rearm: Arc<Notify>,
    /// Told when this broker scheduled a timer: the timer worker reads the earliest due time
    /// again, so a timer fires at its due time, not at the next re-scan.
    pub(crate) timer_wake: Arc<Notify>,
    /// Queues known to have encryptionEnabled: their pushes are sealed before storage sees
    /// them (storage refuses plaintext for the others it turns out to encrypt).
    pub(crate) encrypted_queues: Mutex<std::collections::BTreeSet<String>>,
    /// When (ms) a storage error of each (route, SQLSTATE) was last logged.
    storage_errors_logged: Mutex<BTreeMap<(&'static str, String), i64>>,
    /// What this broker's leased pops delivered, so whole-batch acks cost one cursor write.
    pub(crate) delivered: Mutex<DeliveryLedger>,
    /// Whole-batch acks sent to storage in rounds, across groups.
    pub(crate) ack_rounds: Arc<crate::rounds::AckRounds>,
    /// Ring pops sent to storage in rounds, across groups (None: POP_ROUNDS=0).
    pub(crate) pop_rounds: Option<Arc<crate::rounds::PopRounds>>,
    pub(crate) push_rounds: Option<Arc<crate::rounds::PushRounds>>,
    /// The admin totals' snapshot and its refresh.
    pub(crate) stats: crate::stats::AdminStats,
    /// The seed this broker was built with: its background tasks draw their jitter from it.
    pub(crate) seed: u64,
    /// Ephemeral queues' rings, in this process's memory.
    pub ephemeral: crate::ephemeral::Ephemeral,
    /// How far (µs) the database's clock is ahead of this host's (`tasks::db_clock`): 0 on the
    /// in-memory backend, whose clock is the host's.
    clock_offset_us: std::sync::atomic::AtomicI64,
}

/// Delivered batches the delivery ledger remembers (about 300 bytes each: names, ids and a
/// digest, so about 20 MiB full); past it the oldest leases go, and acks of their batches take the
/// item-by-item path.
const DELIVERY_LEDGER_CAPACITY: usize = 65_536;

/// The failure a request or a pop's storage call past its storage deadline answers with.
pub fn past_storage_deadline(deadline: std::time::Duration) -> queen_core::storage::StorageError {
    let ms = deadline.as_millis();
    let within = if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    };
    queen_core::storage::StorageError::Unavailable(format!(
        "storage did not answer within {within}"
    ))
}

/// How often one (route, SQLSTATE) pair's storage errors are logged (each is counted).
const STORAGE_ERROR_LOG_EVERY_MS: i64 = 10_000;

/// The gate of discovery pops (they span queues): every push opens it too.
const ANY_QUEUE_GATE: &str = "";

impl Broker {
    /// The broker's state, with no background task running (`tasks::start` starts them), so
    /// tests and the simulation can build one and choose what runs.
    pub fn new(config: ServerConfig, storage: StorageSet, seed: u64) -> Arc<Broker> {
        Self::with_hooks(config, storage, seed, Hooks::default())
    }

    /// A broker with a simulation's clock, wake filter and bug switches. Like `new`, it starts
    /// nothing: `tasks::start` launches its background work.
    pub fn with_hooks(
        config: ServerConfig,
        storage: StorageSet,
        seed: u64,
        hooks: Hooks,
    ) -> Arc<Broker> {
        let pop_config = PopConfig {
            backoff: config.backoff,
            hotlist: config.hotlist,
            bugs: hooks.pop_bugs,
            ..PopConfig::default()
        };
        let (shutting_down, _) = watch::channel(false);
        let rng = SeededRng::new(seed);
        let config_ephemeral_max_bytes = config.ephemeral_max_bytes;
        let config_ephemeral_address = config.peer_address.clone();
        let peers = crate::peers::Peers::new(hooks.peer_connector.clone());
        let ack_rounds = Arc::new(crate::rounds::ack_rounds(
            storage.messages.clone(),
            hooks.round_company_yields,
            hooks.rounds_bugs,
        ));
        let pop_rounds = (config.pop_rounds > 0).then(|| {
            Arc::new(crate::rounds::pop_rounds(
                storage.pops.clone(),
                config.pop_rounds,
                hooks.round_company_yields,
                hooks.rounds_bugs,
            ))
        });
        let push_rounds = (config.push_rounds > 0).then(|| {
            Arc::new(crate::rounds::push_rounds(
                storage.messages.clone(),
                config.push_rounds,
                hooks.round_company_yields,
                hooks.rounds_bugs,
            ))
        });
        Arc::new(Broker {
            limiter: Limiter::new(config.limiter),
            config,
            storage,
            pop_config,
            pop_ctx: Mutex::new(PopContext::new(
                RingTable::new(hooks.reseed_interval_ms, hooks.ring_bugs)
                    .with_jitter_seed(rng.child("ring walks").next_u64())
                    .with_reseed_page(hooks.reseed_page),
                hooks.event_bugs,
            )),
            hooks,
            gates: Mutex::new(BTreeMap::new()),
            ids: Mutex::new(IdMinter::new(rng.child("ids"))),
            metrics: Metrics::default(),
            shutting_down,
            push_maintenance: std::sync::atomic::AtomicBool::new(false),
            storage_errors_logged: Mutex::new(BTreeMap::new()),
            drain_wake: Arc::new(Notify::new()),
            ticker_rearm: Arc::new(Notify::new()),
            timer_wake: Arc::new(Notify::new()),
            encrypted_queues: Mutex::new(std::collections::BTreeSet::new()),
            delivered: Mutex::new(DeliveryLedger::new(DELIVERY_LEDGER_CAPACITY)),
            ack_rounds,
            pop_rounds,
            push_rounds,
            stats: crate::stats::AdminStats::default(),
            ephemeral: crate::ephemeral::Ephemeral::new(
                rng.child("ephemeral incarnation").next_u64(),
                config_ephemeral_max_bytes,
                config_ephemeral_address,
                peers,
            ),
            seed,
            clock_offset_us: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// The broker's time: the database's clock, as read on this host's (`clock_offset_us`).
    /// Leases, delays and timers are stamped by the database, and the broker schedules its
    /// revisits and wakes by them.
    pub fn now(&self) -> Timestamp {
        Timestamp((self.hooks.clock)().0 + self.clock_offset_us.load(Ordering::Relaxed))
    }

    /// This host's clock, which `clock_offset_us` corrects.
    pub fn host_clock(&self) -> Arc<dyn Fn() -> Timestamp + Send + Sync> {
        self.hooks.clock.clone()
    }

    /// How far (µs) the database's clock is ahead of this host's, as last measured.
    pub fn clock_offset_us(&self) -> i64 {
        self.clock_offset_us.load(Ordering::Relaxed)
    }

    /// Follows the database's clock from now on; the wheel ticker and the timer worker, asleep
    /// until an instant of the old reading, look again.
    pub fn set_clock_offset_us(&self, offset: i64) {
        let before = self.clock_offset_us.swap(offset, Ordering::Relaxed);
        self.metrics
            .database_clock_ahead_seconds
            .set(offset as f64 / 1e6);
        if before != offset {
            self.ticker_rearm.notify_one();
            self.timer_wake.notify_one();
        }
    }

    /// The timer worker's re-scan interval and bug switches.
    pub(crate) fn timer_hooks(&self) -> (u64, queen_core::timers::TimerBugs) {
        (self.hooks.timer_rescan_ms, self.hooks.timer_bugs)
    }

    /// A crash point: in production nothing happens; in a simulation that aimed a crash here,
    /// the request stops for good (the host is about to be killed).
    pub async fn crash_point(&self, point: CrashPoint) {
        if self.hooks.crash_points.as_ref().is_some_and(|h| h(point)) {
            std::future::pending::<()>().await;
        }
    }

    pub fn mint_uuid(&self) -> uuid::Uuid {
        lock(&self.ids).mint(self.now())
    }

    pub fn mint_worker(&self) -> WorkerId {
        WorkerId(self.mint_uuid())
    }

    /// A receiver on a queue's wake gate (`None`: the any-queue gate of discovery pops).
    /// `group`: the pop is queue-wide (`PopMachine::wakes_one_per_group`), woken one at a time.
    pub fn gate(&self, queue: Option<&str>, group: Option<&str>) -> GateWatch {
        let key = queue.unwrap_or(ANY_QUEUE_GATE).to_string();
        let gate = lock(&self.gates).entry(key).or_default().clone();
        let group = group.map(|g| lock(&gate.groups).entry(g.to_string()).or_default().clone());
        let seen = gate.seq.load(Ordering::SeqCst);
        GateWatch { gate, seen, group }
    }

    /// Opens a queue's wake gate: every pop parked on it outside a group list re-checks now, and
    /// one parked queue-wide pop of each group (on the hot-list path, of each group whose ring
    /// has work).
    pub fn wake(&self, queue: &str) {
        let fate = self
            .hooks
            .wake_fate
            .as_ref()
            .map_or(WakeFate::Deliver, |f| f(queue));
        let gates: Vec<Arc<Gate>> = {
            let gates = lock(&self.gates);
            [queue, ANY_QUEUE_GATE]
                .iter()
                .filter_map(|k| gates.get(*k))
                // Someone besides the map holds it: a pop is parked or about to park.
                .filter(|g| Arc::strong_count(g) > 1)
                .cloned()
                .collect()
        };
        // The queue-wide pops to wake are chosen now, by what the rings hold now (a delayed
        // wake delivers the same choice late).
        let opens: Vec<(Arc<Gate>, Vec<Arc<Notify>>)> = gates
            .into_iter()
            .map(|gate| {
                let chosen = self.group_pops_to_wake(queue, &gate);
                (gate, chosen)
            })
            .collect();
        match fate {
            WakeFate::Deliver => {
                let now = self.now();
                for (gate, chosen) in &opens {
                    gate.open(now, chosen);
                    self.metrics.wakes.inc();
                }
            }
            WakeFate::Drop => {
                self.metrics.wakes_dropped.inc();
            }
            WakeFate::Delay(d) => {
                let clock = self.hooks.clock.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    for (gate, chosen) in &opens {
                        gate.open(clock(), chosen);
                    }
                });
            }
        }
    }

    /// Of each group with a queue-wide pop parked on `gate`, that group's wake list: one of its
    /// parked pops is woken. On the hot-list path only if the group's ring has work; the legacy
    /// scan has no ring to ask, so its woken pop asks storage (one look per group and event).
    fn group_pops_to_wake(&self, queue: &str, gate: &Gate) -> Vec<Arc<Notify>> {
        let parked = gate.parked_groups();
        if parked.is_empty() || !self.pop_config.hotlist {
            return parked.into_iter().map(|(_, n)| n).collect();
        }
        let now = self.now();
        let mut ctx = lock(&self.pop_ctx);
        parked
            .into_iter()
            .filter(|(group, _)| ctx.rings.ring(queue, group).has_work(now))
            .map(|(_, n)| n)
            .collect()
    }

    /// A queue-wide pop may leave work behind: one more parked pop of its group looks (see
    /// `PopEffect::PassWake`).
    pub fn pass_wake(&self, queue: &str, group: &str) {
        let gate = lock(&self.gates).get(queue).cloned();
        let Some(gate) = gate else { return };
        let next = lock(&gate.groups).get(group).cloned();
        if let Some(next) = next {
            next.notify_one();
            self.metrics.wakes_passed.inc();
        }
    }

    /// The one path of every deliverability event, made here or reported by storage from another
    /// broker: the rings learn it, the gates it concerns open, and the wheel ticker re-arms if
    /// the rings now hold an earlier revisit.
    pub fn publish(&self, event: &DeliveryEvent) {
        self.publish_all(std::slice::from_ref(event));
    }

    /// Publishes the events of one request together: one lock for the rings, and each gate
    /// opened once however many of its partitions the request touched.
    pub fn publish_all(&self, events: &[DeliveryEvent]) {
        if events.is_empty() {
            return;
        }
        let mut queues: Vec<String> = vec![];
        let mut all = false;
        {
            let mut ctx = lock(&self.pop_ctx);
            let now = self.now();
            for event in events {
                match ctx.apply(event, now) {
                    Wake::Nothing => {}
                    Wake::Queue(q) => queues.push(q),
                    Wake::All => all = true,
                }
            }
            self.rearm_ticker_if_needed(&ctx);
        }
        for event in events {
            self.metrics.count_event(event.kind());
        }
        if all {
            return self.wake_all();
        }
        queues.sort_unstable();
        queues.dedup();
        for q in &queues {
            self.wake(q);
        }
    }

    /// Called with the pop context held after anything that may have put a revisit on a ring's
    /// wheel or among the legacy probes' (a pop's verdicts or probe answer, an event).
    pub fn rearm_ticker_if_needed(&self, ctx: &PopContext) {
        if ctx.ticker_needs_rearm() {
            self.ticker_rearm.notify_one();
        }
    }

    /// Opens every gate (an event about every queue). Waking a queue also opens the
    /// discovery pops' gate, so that one is opened on its own only when no queue gate exists.
    fn wake_all(&self) {
        let queues: Vec<String> = lock(&self.gates)
            .keys()
            .filter(|q| q.as_str() != ANY_QUEUE_GATE)
            .cloned()
            .collect();
        if queues.is_empty() {
            return self.wake(ANY_QUEUE_GATE);
        }
        for q in &queues {
            self.wake(q);
        }
    }

    /// Drops gates and group wake lists nobody listens to (called now and then, so the maps
    /// stay small).
    pub fn prune_gates(&self) {
        lock(&self.gates).retain(|_, gate| {
            lock(&gate.groups).retain(|_, n| Arc::strong_count(n) > 1);
            Arc::strong_count(gate) > 1
        });
    }

    /// Every storage error a route answers for (a 5xx, or an empty 204 for a pop) comes here: it
    /// is counted by route and SQLSTATE, and logged with both at most once per
    /// `STORAGE_ERROR_LOG_EVERY_MS` for each pair, so an outage does not flood the log and a
    /// resource error (SQLSTATE class 53) is not mistaken for one. Says whether it logged.
    pub fn note_storage_error(
        &self,
        route: &'static str,
        e: &queen_core::storage::StorageError,
    ) -> bool {
        let sqlstate = e.sqlstate();
        let count = self.metrics.count_storage_error(route, sqlstate);
        let now = self.now().as_millis();
        let key = (route, sqlstate.unwrap_or("none").to_string());
        {
            let mut logged = lock(&self.storage_errors_logged);
            let last = logged.entry(key).or_insert(i64::MIN);
            if now.saturating_sub(*last) < STORAGE_ERROR_LOG_EVERY_MS {
                return false;
            }
            *last = now;
        }
        tracing::warn!(
            route,
            sqlstate = sqlstate.unwrap_or("none"),
            count,
            error = %e,
            "a storage call failed (its request answers 5xx; a pop waits or answers empty; a \
             push with a file buffer is buffered)"
        );
        true
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_core::storage::StorageError;
    use std::sync::atomic::AtomicI64;

    #[tokio::test]
    async fn storage_errors_are_counted_each_and_logged_per_sqlstate_every_ten_seconds() {
        let ms = Arc::new(AtomicI64::new(1_000_000));
        let read = ms.clone();
        let clock: Arc<dyn Fn() -> Timestamp + Send + Sync> =
            Arc::new(move || Timestamp::from_millis(read.load(Ordering::Relaxed)));
        let db = queen_storage_sim::SimDb::new(1, clock.clone(), Default::default());
        let hooks = Hooks {
            clock,
            ..Hooks::default()
        };
        let broker = Broker::with_hooks(ServerConfig::default(), StorageSet::of(db), 1, hooks);
        let lock_table_full = StorageError::Unavailable("pop: out of shared memory (53200)".into());
        let cut = StorageError::Unavailable("no database connection: closed".into());
        assert!(broker.note_storage_error("pop", &lock_table_full));
        ms.fetch_add(9_999, Ordering::Relaxed);
        assert!(
            !broker.note_storage_error("pop", &lock_table_full),
            "within 10 s: counted, not logged again"
        );
        assert!(
            broker.note_storage_error("pop", &cut),
            "another SQLSTATE is logged on its own"
        );
        assert!(
            broker.note_storage_error("push", &lock_table_full),
            "another route is logged on its own"
        );
        ms.fetch_add(1, Ordering::Relaxed);
        assert!(broker.note_storage_error("pop", &lock_table_full));
        assert_eq!(broker.metrics.storage_error_count("pop", "53200"), 3);
        assert_eq!(broker.metrics.storage_error_count("pop", "none"), 1);
        assert_eq!(broker.metrics.storage_error_count("push", "53200"), 1);
    }
}
