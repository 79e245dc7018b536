//! Shared broker state: storage, the pop scheduler's context, the serving limiter, per-queue
//! wake gates, id minting and metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use queen_core::ids::IdMinter;
use queen_core::limiter::VegasLimiter;
use queen_core::pop::{PopConfig, PopContext};
use queen_core::ring::{RingBugs, RingTable, DEFAULT_RESEED_INTERVAL_MS};
use queen_core::rng::SeededRng;
use queen_core::storage::Storage;
use queen_core::{Timestamp, WorkerId};
use tokio::sync::{watch, Notify};

use crate::config::ServerConfig;
use crate::metrics::Metrics;

/// Locks a std mutex, recovering from poisoning: every critical section here leaves its data
/// consistent at each step, so a panic elsewhere must not take the broker down.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wall clock, read only by the server (the core takes time as an argument).
pub fn wall_now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Which backend serves this broker.
pub enum Backend {
    Memory,
    Postgres(queen_storage_pg::PgStorage),
}

/// The adaptive serving limiter behind an async acquire.
pub struct Limiter {
    state: Mutex<VegasLimiter>,
    released: Notify,
}

impl Limiter {
    pub fn new(config: queen_core::limiter::VegasConfig) -> Self {
        Limiter {
            state: Mutex::new(VegasLimiter::new(config)),
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

pub struct App {
    pub config: ServerConfig,
    pub storage: Arc<dyn Storage>,
    pub delivery: Arc<dyn queen_core::storage::DeliveryStorage>,
    pub backend: Backend,
    pub pop_config: PopConfig,
    pub pop_ctx: Mutex<PopContext>,
    pub limiter: Limiter,
    gates: Mutex<BTreeMap<String, watch::Sender<u64>>>,
    ids: Mutex<IdMinter>,
    pub metrics: Metrics,
    pub shutting_down: watch::Sender<bool>,
    pub push_maintenance: AtomicBool,
    wake_seq: AtomicU64,
}

/// The gate of discovery pops (they span queues): every push opens it too.
const ANY_QUEUE_GATE: &str = "";

impl App {
    pub fn new(
        config: ServerConfig,
        storage: Arc<dyn Storage>,
        delivery: Arc<dyn queen_core::storage::DeliveryStorage>,
        backend: Backend,
        seed: u64,
    ) -> Arc<App> {
        let pop_config = PopConfig {
            backoff: config.backoff,
            hotlist: config.hotlist,
            ..PopConfig::default()
        };
        let (shutting_down, _) = watch::channel(false);
        let rng = SeededRng::new(seed);
        Arc::new(App {
            limiter: Limiter::new(config.vegas),
            config,
            storage,
            delivery,
            backend,
            pop_config,
            pop_ctx: Mutex::new(PopContext::new(RingTable::new(
                DEFAULT_RESEED_INTERVAL_MS,
                RingBugs::default(),
            ))),
            gates: Mutex::new(BTreeMap::new()),
            ids: Mutex::new(IdMinter::new(rng.child("ids"))),
            metrics: Metrics::default(),
            shutting_down,
            push_maintenance: AtomicBool::new(false),
            wake_seq: AtomicU64::new(0),
        })
    }

    pub fn now(&self) -> Timestamp {
        wall_now()
    }

    pub fn mint_uuid(&self) -> uuid::Uuid {
        lock(&self.ids).mint(self.now())
    }

    pub fn mint_worker(&self) -> WorkerId {
        WorkerId(self.mint_uuid())
    }

    /// A receiver on a queue's wake gate (`None`: the any-queue gate of discovery pops).
    pub fn gate(&self, queue: Option<&str>) -> watch::Receiver<u64> {
        let key = queue.unwrap_or(ANY_QUEUE_GATE).to_string();
        lock(&self.gates)
            .entry(key)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Opens a queue's wake gate: every pop parked on it re-checks now.
    pub fn wake(&self, queue: &str) {
        let seq = self.wake_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let gates = lock(&self.gates);
        for key in [queue, ANY_QUEUE_GATE] {
            if let Some(tx) = gates.get(key) {
                if tx.receiver_count() > 0 {
                    tx.send_replace(seq);
                    self.metrics.wakes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Drops gates nobody listens to (called now and then, so the map stays small).
    pub fn prune_gates(&self) {
        lock(&self.gates).retain(|_, tx| tx.receiver_count() > 0);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }
}
