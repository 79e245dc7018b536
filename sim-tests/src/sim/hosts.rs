//! The simulated deployment: the model database (interleaved statement by statement, as the seed
//! draws), and each broker as a turmoil host with the seed's settings, wake faults, aimed crash
//! points and notification line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_core::backoff::WaitBackoff;
use queen_core::rng::SeededRng;
use queen_core::storage::StorageSet;
use queen_core::Timestamp;
use queen_server::broker::{Broker, CrashHook, Hooks, WakeFate, WakeFilter};
use queen_server::config::{RetentionSettings, ServerConfig};
use queen_storage_sim::reach::OwnerReach;
use queen_storage_sim::{PauseKind, SimDb};

use super::pop_reach::PopReach;
use super::{
    hit, Aim, Faults, ListenLine, Scenario, Spec, PRODUCTION_BACKOFF, SCALE_RESEED_PAGE,
    SIM_RESEED_INTERVAL_MS, SIM_RESEED_PAGE, SIM_TIMER_RESCAN_MS,
};

/// The model, interleaved as the seed draws: before every statement the transaction yields
/// 0..3 times, and one statement in four takes 1..4 ms of simulated time (a round trip), so
/// transactions of different requests overlap.
pub(super) fn model_db(
    spec: &Spec,
    root: &SeededRng,
    clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
) -> Arc<SimDb> {
    let step_rng = Arc::new(Mutex::new(root.child("statements")));
    let pause: queen_storage_sim::PauseFn = Arc::new(move |kind| {
        let (yields, latency_ms) = match kind {
            PauseKind::Statement => step_rng
                .lock()
                .map(|mut r| {
                    let slow = r.below(4) == 0;
                    (r.below(4), if slow { 1 + r.below(4) } else { 0 })
                })
                .unwrap_or((0, 0)),
            PauseKind::Blocked => (0, 1),
        };
        Box::pin(async move {
            if latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(latency_ms)).await;
            }
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
        })
    });
    SimDb::interleaved(spec.seed, clock, spec.bugs.sim, pause)
}

/// The brokers a scenario runs.
pub(super) fn broker_names(scenario: Scenario) -> Vec<String> {
    match scenario {
        Scenario::Faults
        | Scenario::Contention
        | Scenario::Prompt
        | Scenario::Retention
        | Scenario::Scale => {
            vec!["broker0".into(), "broker1".into()]
        }
        _ => vec!["broker0".into()],
    }
}

/// What the driver and the judge share with the broker hosts: the fault counters, each broker's
/// notification line and aimed crash.
pub(super) struct Fleet {
    pub names: Vec<String>,
    pub dropped_wakes: Arc<AtomicU64>,
    pub delayed_wakes: Arc<AtomicU64>,
    pub restarts: Arc<AtomicU64>,
    pub lines: Vec<Arc<ListenLine>>,
    pub aims: Vec<Arc<Mutex<Aim>>>,
    /// Each broker's reach to the ephemeral owner rows (the driver cuts it).
    pub reaches: Vec<Arc<OwnerReach>>,
    /// Each broker's pops' reach to the database (the prompt scenario's driver cuts it).
    pub pop_reaches: Vec<Arc<PopReach>>,
}

/// The port every simulated broker serves on.
const PORT: u16 = 6632;

/// Where the scenario's brokers share their ephemeral queues (each at its host name, and the
/// forwards between them over the simulated network): the two-broker scenarios whose clients
/// use them.
fn peer_address(scenario: Scenario, name: &str) -> Option<String> {
    matches!(scenario, Scenario::Faults | Scenario::Prompt).then(|| format!("{name}:{PORT}"))
}

/// Dials a peer over the simulated network.
fn turmoil_connector() -> queen_server::peers::PeerConnector {
    Arc::new(|address: String| {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(address.as_str())
                .await
                .map_err(|e| format!("connecting to {address}: {e}"))?;
            queen_server::peers::handshake(stream, &address).await
        })
    })
}

/// Per-broker settings the seed draws.
struct BrokerDraws {
    /// The prompt scenario runs one broker with the hot-list and one without, or both alike, as
    /// the seed draws; the scale scenario one of each.
    hotlist: Vec<bool>,
    /// Ring pops in rounds (POP_ROUNDS 1) or each its own statement (0), as the seed draws per
    /// broker: both are settings a deployment may run, and they interleave pops differently.
    pop_rounds: Vec<usize>,
    /// A new storage round yields for company (`COMPANY_YIELDS`) or goes at once, as the seed
    /// draws per broker: a scheduling detail, so both ways the broker's tasks interleave are run.
    company_yields: Vec<usize>,
}

impl BrokerDraws {
    fn draw(root: &SeededRng, scenario: Scenario, brokers: usize) -> BrokerDraws {
        let hotlist = {
            let mut r = root.child("hotlist");
            (0..brokers)
                .map(|i| match scenario {
                    Scenario::Prompt => r.below(3) != 0,
                    Scenario::Scale => i == 0,
                    _ => true,
                })
                .collect()
        };
        let pop_rounds = {
            let mut r = root.child("pop rounds");
            (0..brokers).map(|_| r.below(2) as usize).collect()
        };
        let company_yields = {
            let mut r = root.child("round company yields");
            (0..brokers)
                .map(|_| r.below(2) as usize * queen_server::rounds::COMPANY_YIELDS)
                .collect()
        };
        BrokerDraws {
            hotlist,
            pop_rounds,
            company_yields,
        }
    }
}

/// A simulated broker's configuration.
fn broker_config(scenario: Scenario, name: &str, hotlist: bool, pop_rounds: usize) -> ServerConfig {
    ServerConfig {
        peer_address: peer_address(scenario, name),
        hotlist,
        pop_rounds,
        backoff: if scenario == Scenario::Prompt {
            PRODUCTION_BACKOFF
        } else {
            WaitBackoff::default()
        },
        // The retention scenario's worker runs often, in small batches (marks get used),
        // with a short maintenance lease (a crashed holder's runs out within the run).
        // Elsewhere it is off: those scenarios' removals are the driver's.
        retention: if scenario == Scenario::Retention {
            RetentionSettings {
                interval_ms: 700,
                batch_size: 2,
                partition_cleanup_days: 0,
                eviction_interval_ms: 0,
                lease_secs: 3,
                ..RetentionSettings::default()
            }
        } else {
            RetentionSettings::OFF
        },
        // The samples read /proc: no input of a simulation's behaviour may.
        sample_interval_ms: 0,
        ..ServerConfig::default()
    }
}

/// Everything one broker host needs to start (again, after a crash).
#[derive(Clone)]
struct HostParts {
    index: usize,
    spec: Spec,
    config: ServerConfig,
    company_yields: usize,
    db: Arc<SimDb>,
    clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    wake_rng: Arc<Mutex<SeededRng>>,
    drop_wake: f64,
    delay_wake: f64,
    dropped: Arc<AtomicU64>,
    delayed: Arc<AtomicU64>,
    line: Arc<ListenLine>,
    aim: Arc<Mutex<Aim>>,
    reach: Arc<OwnerReach>,
    pop_reach: Arc<PopReach>,
}

impl Fleet {
    /// Adds every broker of the scenario to the simulation.
    pub(super) fn start(
        sim: &mut turmoil::Sim<'_>,
        root: &SeededRng,
        spec: &Spec,
        faults: &Faults,
        db: &Arc<SimDb>,
        clock: &Arc<dyn Fn() -> Timestamp + Send + Sync>,
    ) -> Fleet {
        let names = broker_names(spec.scenario);
        let fleet = Fleet {
            dropped_wakes: Arc::new(AtomicU64::new(0)),
            delayed_wakes: Arc::new(AtomicU64::new(0)),
            restarts: Arc::new(AtomicU64::new(0)),
            lines: names.iter().map(|_| Arc::default()).collect(),
            aims: names.iter().map(|_| Arc::default()).collect(),
            reaches: names.iter().map(|_| OwnerReach::new(db.clone())).collect(),
            pop_reaches: names.iter().map(|_| PopReach::new(db.clone())).collect(),
            names,
        };
        let wake_rng = Arc::new(Mutex::new(root.child("wakes")));
        let draws = BrokerDraws::draw(root, spec.scenario, fleet.names.len());
        if std::env::var("SIM_EVENTS").is_ok() {
            eprintln!(
                "hot-list per broker: {:?}; pop rounds per broker: {:?}; \
                 round company yields per broker: {:?}",
                draws.hotlist, draws.pop_rounds, draws.company_yields
            );
        }
        for (i, name) in fleet.names.iter().enumerate() {
            let parts = HostParts {
                index: i,
                spec: *spec,
                config: broker_config(spec.scenario, name, draws.hotlist[i], draws.pop_rounds[i]),
                company_yields: draws.company_yields[i],
                db: db.clone(),
                clock: clock.clone(),
                wake_rng: wake_rng.clone(),
                drop_wake: faults.drop_wake,
                delay_wake: faults.delay_wake,
                dropped: fleet.dropped_wakes.clone(),
                delayed: fleet.delayed_wakes.clone(),
                line: fleet.lines[i].clone(),
                aim: fleet.aims[i].clone(),
                reach: fleet.reaches[i].clone(),
                pop_reach: fleet.pop_reaches[i].clone(),
            };
            let restarts = fleet.restarts.clone();
            sim.host(name.as_str(), move || {
                // A restart is a new process: a fresh ring, fresh parked pops; the database stays.
                let incarnation = restarts.fetch_add(1, Ordering::SeqCst);
                serve_broker(parts.clone(), incarnation)
            });
        }
        fleet
    }
}

/// The wake filter of one broker: the seed's dropped and delayed wakes.
fn wake_filter(parts: &HostParts) -> WakeFilter {
    let (wake_rng, dropped, delayed) = (
        parts.wake_rng.clone(),
        parts.dropped.clone(),
        parts.delayed.clone(),
    );
    let (drop_p, delay_p) = (parts.drop_wake, parts.delay_wake);
    Arc::new(move |_q| {
        let Ok(mut r) = wake_rng.lock() else {
            return WakeFate::Deliver;
        };
        if hit(&mut r, drop_p) {
            dropped.fetch_add(1, Ordering::Relaxed);
            WakeFate::Drop
        } else if hit(&mut r, delay_p) {
            delayed.fetch_add(1, Ordering::Relaxed);
            WakeFate::Delay(Duration::from_millis(5 + r.below(400)))
        } else {
            WakeFate::Deliver
        }
    })
}

/// An aimed crash: the first request to reach the armed point stops there, and the driver kills
/// the host at its next step.
fn crash_hook(aim: Arc<Mutex<Aim>>) -> CrashHook {
    Arc::new(move |point| {
        let Ok(mut a) = aim.lock() else { return false };
        if a.point == Some(point) && !a.reached {
            a.reached = true;
            return true;
        }
        false
    })
}

/// One incarnation of a broker host: the broker with the simulation's hooks, its notification
/// line, and its listener.
async fn serve_broker(parts: HostParts, incarnation: u64) -> turmoil::Result {
    let i = parts.index;
    let spec = parts.spec;
    let bugs = spec.bugs;
    let hooks = Hooks {
        clock: parts.clock.clone(),
        wake_fate: Some(wake_filter(&parts)),
        ring_bugs: bugs.ring,
        pop_bugs: bugs.pop,
        event_bugs: bugs.events,
        rounds_bugs: bugs.rounds,
        round_company_yields: parts.company_yields,
        reseed_interval_ms: SIM_RESEED_INTERVAL_MS,
        reseed_page: if spec.scenario == Scenario::Scale {
            SCALE_RESEED_PAGE
        } else {
            SIM_RESEED_PAGE
        },
        crash_points: Some(crash_hook(parts.aim.clone())),
        timer_rescan_ms: SIM_TIMER_RESCAN_MS,
        timer_bugs: bugs.timers,
        peer_connector: turmoil_connector(),
    };
    let mut storage = StorageSet::of(parts.db.clone());
    storage.ephemeral_owners = parts.reach.clone();
    storage.pops = parts.pop_reach.clone();
    let app = Broker::with_hooks(
        parts.config.clone(),
        storage,
        spec.seed ^ (i as u64) << 32 ^ incarnation,
        hooks,
    );
    app.ephemeral.set_bugs(bugs.ephemeral);
    queen_server::tasks::start(&app);
    // LISTEN: the model's committed notifications feed the broker's event path, as
    // PostgreSQL's do; a (re)started broker listens anew and resyncs first.
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let forward = events_tx.clone();
    if let Ok(mut l) = parts.line.events.lock() {
        *l = Some(events_tx.clone());
    }
    let trace_events = std::env::var("SIM_EVENTS").is_ok();
    let broker = format!("broker{i}");
    let line = parts.line.clone();
    let _listening = parts.db.subscribe(Arc::new(move |e| {
        let down = line.down.load(Ordering::SeqCst);
        if trace_events {
            // SIM_EVENTS=1: every notification a broker hears (a replay aid).
            let at = turmoil::sim_elapsed().map_or(0, |d| d.as_millis());
            eprintln!(
                "{at} ms {broker}{} {e:?}",
                if down { " (line cut)" } else { "" }
            );
        }
        if down {
            line.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = forward.send(e.clone());
        }
    }));
    let _ = events_tx.send(queen_core::events::DeliveryEvent::Resync);
    tokio::spawn(queen_server::forward_events(app.clone(), events_rx));
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(queen_server::serve_connection(app.clone(), stream));
    }
}
