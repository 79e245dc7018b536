//! What every scenario shares: payloads with a send timestamp, PostgreSQL connections, a timed
//! runner, latency summaries and the result rows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The bench's time origin: payloads carry microseconds since it, so any task of this process can
/// compute push-to-delivery latency.
pub fn since_start_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// About 200 bytes of JSON, stamped with its send time.
pub fn payload(i: u64) -> Value {
    json!({"id": i, "kind": "order.created", "customer": format!("c-{}", i % 997), "amount": (i % 10_000) as f64 / 100.0,
           "sentUs": since_start_us(), "note": "x".repeat(100)})
}

/// Push-to-delivery latency of a delivered payload, in microseconds.
pub fn latency_us(data: &Value) -> Option<u64> {
    data["sentUs"]
        .as_u64()
        .map(|sent| since_start_us().saturating_sub(sent))
}

pub async fn pg_connect(cfg: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

/// The database every measured window starts on (set once by `main`; unset, `settle` does nothing).
static SETTLE_DATABASE: OnceLock<tokio_postgres::Config> = OnceLock::new();

pub fn settle_before_measuring(cfg: &tokio_postgres::Config) {
    let _ = SETTLE_DATABASE.set(cfg.clone());
}

/// Brings the database to the same state before every measured window, broker's and baseline's
/// alike: the earlier windows' dead rows vacuumed (a manual VACUUM also cancels an autovacuum
/// worker still busy with them) and their dirty pages written out. Without it a window paid for
/// the one before it: the autovacuum of a consume load's acks, or of a million-partition fill,
/// ran inside the next scenario's measurement and moved its rows by a fifth between full runs.
/// A window's own debris is still its own to pay for.
pub async fn settle() {
    let Some(cfg) = SETTLE_DATABASE.get() else {
        return;
    };
    let t = Instant::now();
    let c = pg_connect(cfg).await;
    // Separate statements: VACUUM refuses to run inside the implicit transaction of a
    // multi-statement query.
    for sql in ["VACUUM (ANALYZE)", "CHECKPOINT"] {
        if let Err(e) = c.batch_execute(sql).await {
            eprintln!("settle: {sql} failed (measuring unsettled): {e}");
        }
    }
    eprintln!("settled the database in {:.1} s", t.elapsed().as_secs_f64());
}

/// p50 / p99 / max of latency samples, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn latency(mut us: Vec<u64>) -> Latency {
    if us.is_empty() {
        return Latency::default();
    }
    us.sort_unstable();
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    Latency {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

/// One printed row: a broker figure, its unit, and the baseline it is compared with.
pub struct Row {
    pub scenario: String,
    pub metric: &'static str,
    pub broker: f64,
    pub baseline_name: String,
    pub baseline: f64,
}

impl Row {
    pub fn new(
        scenario: impl Into<String>,
        metric: &'static str,
        broker: f64,
        baseline_name: impl Into<String>,
        baseline: f64,
    ) -> Row {
        Row {
            scenario: scenario.into(),
            metric,
            broker,
            baseline_name: baseline_name.into(),
            baseline,
        }
    }

    pub fn ratio(&self) -> f64 {
        if self.baseline == 0.0 || self.baseline.is_nan() || self.broker.is_nan() {
            f64::NAN
        } else {
            self.broker / self.baseline
        }
    }
}

/// A load task's end: a panic (a failed request) is reported, not swallowed.
pub fn joined(r: Result<(), tokio::task::JoinError>) {
    if let Err(e) = r {
        eprintln!("a load task failed: {e}");
    }
}

/// A broker to load, and the bearer token its clients send (auth on), if any.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: std::net::SocketAddr,
    pub token: Option<String>,
}

impl Endpoint {
    pub fn open(addr: std::net::SocketAddr) -> Endpoint {
        Endpoint { addr, token: None }
    }

    /// A keep-alive connection to the broker, sending the token with every request.
    pub async fn client(&self) -> queen_raw_client::Client {
        let c = queen_raw_client::Client::connect(self.addr).await;
        match &self.token {
            Some(t) => c.with_header("authorization", &format!("Bearer {t}")),
            None => c,
        }
    }
}

/// The name of the in-process broker's runtime threads (main.rs), so its CPU time is read apart
/// from the load generator's.
pub const BROKER_THREAD: &str = "queen-broker";

/// user + system CPU seconds in a /proc `stat` line (the 12th and 13th fields after the command
/// name; the kernel counts in USER_HZ, 100 on Linux).
pub fn stat_cpu_seconds(stat: &str) -> f64 {
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn command_of(stat: &str) -> &str {
    stat.split_once('(')
        .and_then(|(_, rest)| rest.rsplit_once(')'))
        .map_or("", |(name, _)| name)
}

/// CPU seconds used so far by the broker's threads and by each PostgreSQL process of this host.
#[derive(Clone, Debug)]
pub struct CpuMark {
    broker: f64,
    postgres: std::collections::BTreeMap<u32, f64>,
}

/// (pid or tid, CPU seconds) of the entries of a /proc directory whose command is `command`.
fn cpu_by_id(dir: &str, command: &str) -> std::collections::BTreeMap<u32, f64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Default::default();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let id = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            (command_of(&stat) == command).then(|| (id, stat_cpu_seconds(&stat)))
        })
        .collect()
}

impl CpuMark {
    pub fn now() -> CpuMark {
        CpuMark {
            broker: cpu_by_id("/proc/self/task", BROKER_THREAD).values().sum(),
            postgres: cpu_by_id("/proc", "postgres"),
        }
    }

    /// Messages per CPU-second of each side, for `messages` handled since `self`. PostgreSQL's
    /// time is summed per process still alive (a backend of an earlier load exiting meanwhile
    /// takes its time with it; one that started meanwhile counts whole).
    pub fn messages_per_cpu_second(&self, messages: f64) -> (f64, f64) {
        let now = CpuMark::now();
        let postgres: f64 = now
            .postgres
            .iter()
            .map(|(pid, cpu)| cpu - self.postgres.get(pid).copied().unwrap_or(0.0))
            .sum();
        let per = |used: f64| {
            if used > 0.0 {
                messages / used
            } else {
                f64::NAN
            }
        };
        (per(now.broker - self.broker), per(postgres))
    }
}

/// Runs `tasks` load tasks for `secs`: their messages per second, and the messages per CPU-second
/// of the broker and of PostgreSQL meanwhile. The
/// second reading is taken when the load stops, before the tasks end: a baseline's connections
/// close with its tasks, and an exited backend's CPU time leaves /proc with it.
pub async fn measure_with_cpu<F, Fut>(tasks: usize, secs: u64, work: F) -> (f64, (f64, f64))
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    settle().await;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mark = CpuMark::now();
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(work(t, stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let cpu = mark.messages_per_cpu_second(count.load(Ordering::Relaxed) as f64);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        crate::util::joined(h.await);
    }
    (
        count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        cpu,
    )
}

/// A process's resident set (`pid`, or "self"), from /proc (NaN where unreadable).
pub fn rss_mib(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// What PostgreSQL has done for this database so far, from `pg_stat_statements`: top-level
/// statements executed and their execution time. `None` where the extension is not loaded
/// (`shared_preload_libraries`; `bash .ci/bench` loads it on both servers).
#[derive(Clone, Copy, Debug)]
pub struct PgWork {
    pub statements: i64,
    pub exec_ms: f64,
}

impl PgWork {
    pub async fn mark(c: &tokio_postgres::Client) -> Option<PgWork> {
        let _ = c
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await;
        let r = c
            .query_one(
                "SELECT COALESCE(sum(s.calls), 0)::bigint, COALESCE(sum(s.total_exec_time), 0)::float8
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                  WHERE d.datname = current_database() AND s.query NOT ILIKE '%pg_stat_statements%'",
                &[],
            )
            .await
            .ok()?;
        Some(PgWork {
            statements: r.get(0),
            exec_ms: r.get(1),
        })
    }

    /// (statements, execution µs) per operation between two marks.
    pub fn per_op(before: Option<PgWork>, after: Option<PgWork>, ops: f64) -> Option<(f64, f64)> {
        let (b, a) = (before?, after?);
        let ops = ops.max(1.0);
        Some((
            (a.statements - b.statements) as f64 / ops,
            (a.exec_ms - b.exec_ms) * 1000.0 / ops,
        ))
    }
}
