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

/// Runs `tasks` copies of `work` for `secs` seconds; returns the count per second.
pub async fn measure<F, Fut>(tasks: usize, secs: u64, work: F) -> f64
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(work(t, stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        crate::util::joined(h.await);
    }
    count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
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
