//! Scenario 4: parked consumers. N long-polls on an empty queue against a broker running as its
//! own process (so its CPU and RSS are its own): storage statements per second (from
//! pg_stat_statements), broker CPU and RSS, then one push and its delivery latency, then the wake
//! cost: the broker's CPU per one-message push and how many parked pops each push woke (a push
//! that wakes every parked pop costs CPU in proportion to them). Hot-list on and off. The
//! baseline: N consumers polling PostgreSQL directly once a second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_raw_client::Client;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::{pg_connect, Row};

/// Statements the bench database has executed (pg_stat_statements), excluding this probe.
async fn statements(c: &tokio_postgres::Client, db: &str) -> Option<i64> {
    c.query_one(
        "SELECT COALESCE(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1 AND s.query NOT ILIKE '%pg_stat_statements%'",
        &[&db],
    )
    .await
    .ok()
    .map(|r| r.get(0))
}

/// (user + system CPU seconds, RSS in MiB) of a process, from /proc.
fn cpu_and_rss(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that ends the command name: utime and stime are the 12th and 13th.
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    (cpu, crate::util::rss_mib(&pid.to_string()))
}

/// The DATABASE_URL with its database name replaced.
pub fn url_with_db(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map_or(0, |i| i + 3);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

struct Broker {
    child: tokio::process::Child,
    addr: std::net::SocketAddr,
}

async fn spawn_broker(db_url: &str, hotlist: bool) -> Broker {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let exe = std::env::current_exe().expect("exe");
    let queen = exe.with_file_name("queen");
    let child = tokio::process::Command::new(&queen)
        .env("DATABASE_URL", db_url)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("QUEEN_HOTLIST", if hotlist { "1" } else { "0" })
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} (build it with cargo build --release --bins): {e}",
                queen.display()
            )
        });
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            if s.write_all(b"GET /health HTTP/1.1\r\nhost: b\r\n\r\n")
                .await
                .is_ok()
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "broker did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Broker { child, addr }
}

/// A counter of the broker's `/metrics` JSON.
async fn broker_counter(addr: std::net::SocketAddr, name: &str) -> u64 {
    let mut c = Client::connect(addr).await;
    c.get("/metrics").await.json()[name].as_u64().unwrap_or(0)
}

async fn parked_count(addr: std::net::SocketAddr) -> u64 {
    broker_counter(addr, "parkedPops").await
}

pub struct Parked {
    pub statements_per_sec: f64,
    pub cpu_percent: f64,
    pub rss_mib: f64,
    pub delivery_ms: f64,
    /// Broker CPU per push of one message while the rest stay parked, above the idle rate.
    pub cpu_ms_per_push: f64,
    /// Parked pops that resumed on a wake, per such push (1 when a push wakes only the pop it
    /// can serve; the parked count when it wakes them all).
    pub woken_per_push: f64,
}

/// Opens `consumers` long-polls (`request` on sockets of their own, 500 at a time), each with a
/// reader that notes the first answer of any in `first` and then keeps its socket open.
async fn open_long_polls(
    addr: std::net::SocketAddr,
    request: &str,
    consumers: usize,
    first: &Arc<Mutex<Option<Instant>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut readers = vec![];
    for chunk in 0..consumers.div_ceil(500) {
        // Open 500 at a time, then give each socket a reader that notes the first answer.
        let opened: Vec<_> = ((chunk * 500)..((chunk + 1) * 500).min(consumers))
            .map(|_| {
                let (request, addr) = (request.to_string(), addr);
                tokio::spawn(async move {
                    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
                    s.write_all(request.as_bytes()).await.expect("write");
                    s
                })
            })
            .collect();
        for o in opened {
            let mut s = o.await.expect("open");
            let first = first.clone();
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 512];
                if let Ok(1..) = s.read(&mut buf).await {
                    if let Ok(mut f) = first.lock() {
                        f.get_or_insert_with(Instant::now);
                    }
                }
                // Keep the socket until the run ends.
                let _ = s.read(&mut buf).await;
            }));
        }
    }
    readers
}

/// Pushes of one message each in the wake-cost phase, this far apart (each is delivered long
/// before the next: `push-to-delivery ms` is tens of ms at 10,000 parked).
const WAKE_PUSHES: u32 = 20;
const WAKE_PUSH_GAP: Duration = Duration::from_millis(250);

pub async fn broker_run(
    db_url: &str,
    db: &str,
    cfg: &tokio_postgres::Config,
    hotlist: bool,
    consumers: usize,
    secs: u64,
) -> Parked {
    let probe = pg_connect(cfg).await;
    let _ = probe
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    let mut b = spawn_broker(db_url, hotlist).await;
    let pid = b.child.id().unwrap_or(0);
    let queue = format!("parked-{consumers}-{}", u8::from(hotlist));
    let mut c = Client::connect(b.addr).await;
    c.post("/api/v1/configure", &json!({"queue": queue, "options": {}}))
        .await;
    let first: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let request = format!(
        "GET /api/v1/pop/queue/{queue}?batch=1&wait=true&timeout={} HTTP/1.1\r\nhost: b\r\n\r\n",
        (secs + 60) * 1000
    );
    let readers = open_long_polls(b.addr, &request, consumers, &first).await;
    // Without the hot-list every parked pop polls storage on its backoff; at 10,000 they queue
    // for storage permits and never all park at once. Measure that state after 15 s.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut parked_now = 0;
    while parked_now < consumers as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        parked_now = parked_count(b.addr).await;
    }
    if parked_now < consumers as u64 {
        eprintln!(
            "{parked_now} of {consumers} long-polls parked at once (the rest wait for storage)"
        );
    }
    let s0 = statements(&probe, db).await;
    let (cpu0, _) = cpu_and_rss(pid);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let s1 = statements(&probe, db).await;
    let (cpu1, rss) = cpu_and_rss(pid);
    let elapsed = t0.elapsed().as_secs_f64();
    let pushed_at = Instant::now();
    c.post(
        "/api/v1/push",
        &json!({"items": [{"queue": queue, "payload": {"wake": true}}]}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let delivered = loop {
        if let Some(at) = first.lock().ok().and_then(|f| *f) {
            break Some(at);
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    // The wake cost: pushes of one message each while the others stay parked. Each push goes to
    // a partition of its own (the first push's partition stays leased by the pop it woke) and is
    // served by one parked pop, whose socket then idles: every push finds the rest parked.
    let woken0 = broker_counter(b.addr, "popsWoken").await;
    let (cpu_w0, _) = cpu_and_rss(pid);
    let tw = Instant::now();
    for i in 0..WAKE_PUSHES {
        c.post(
            "/api/v1/push",
            &json!({"items": [{"queue": queue, "partition": format!("wake-{i}"), "payload": {"wake": i}}]}),
        )
        .await;
        tokio::time::sleep(WAKE_PUSH_GAP).await;
    }
    let (cpu_w1, _) = cpu_and_rss(pid);
    let wake_elapsed = tw.elapsed().as_secs_f64();
    let woken = broker_counter(b.addr, "popsWoken")
        .await
        .saturating_sub(woken0);
    let idle_cpu_s_per_s = (cpu1 - cpu0) / elapsed;
    let cpu_ms_per_push = ((cpu_w1 - cpu_w0) - idle_cpu_s_per_s * wake_elapsed).max(0.0) * 1000.0
        / f64::from(WAKE_PUSHES);
    let _ = b.child.kill().await;
    for r in readers {
        r.abort();
    }
    Parked {
        cpu_ms_per_push,
        woken_per_push: woken as f64 / f64::from(WAKE_PUSHES),
        statements_per_sec: match (s0, s1) {
            (Some(a), Some(b)) => (b - a) as f64 / elapsed,
            _ => f64::NAN,
        },
        cpu_percent: (cpu1 - cpu0) / elapsed * 100.0,
        rss_mib: rss,
        delivery_ms: delivered.map_or(f64::NAN, |at| {
            at.saturating_duration_since(pushed_at).as_secs_f64() * 1000.0
        }),
    }
}

/// N consumers polling PostgreSQL once a second each (one pending check per poll), over 16
/// connections: the statements per second the broker's parking saves.
pub async fn raw_pollers(
    cfg: &tokio_postgres::Config,
    db: &str,
    consumers: usize,
    secs: u64,
) -> f64 {
    let probe = pg_connect(cfg).await;
    let s0 = statements(&probe, db).await;
    let polls = Arc::new(AtomicU64::new(0));
    let conns = 16.min(consumers);
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|t| {
            let (cfg, polls) = (cfg.clone(), polls.clone());
            tokio::spawn(async move {
                let c = pg_connect(&cfg).await;
                let stmt = c
                    .prepare("SELECT EXISTS (SELECT 1 FROM bench.segments s JOIN bench.cursors c ON c.pid = s.pid WHERE s.pid = $1 AND s.end_offset > c.committed)")
                    .await
                    .expect("prepare");
                let mine = consumers / conns + usize::from(t < consumers % conns);
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / mine.max(1) as f64));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut k = 0i32;
                while start.elapsed() < Duration::from_secs(secs) {
                    tick.tick().await;
                    k = (k + 1) % 10;
                    let _ = c.query_one(&stmt, &[&k]).await;
                    polls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        crate::util::joined(h.await);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let s1 = statements(&probe, db).await;
    match (s0, s1) {
        (Some(a), Some(b)) => (b - a) as f64 / elapsed,
        _ => polls.load(Ordering::Relaxed) as f64 / elapsed,
    }
}

pub fn rows(consumers: usize, hotlist: bool, p: &Parked, raw: f64) -> Vec<Row> {
    let label = format!(
        "parked, {consumers} long-polls, QUEEN_HOTLIST={}",
        u8::from(hotlist)
    );
    vec![
        Row::new(
            label.clone(),
            "statements/s",
            p.statements_per_sec,
            "1 Hz raw pollers",
            raw,
        ),
        Row::new(label.clone(), "broker CPU %", p.cpu_percent, "-", f64::NAN),
        Row::new(label.clone(), "broker RSS MiB", p.rss_mib, "-", f64::NAN),
        Row::new(
            label.clone(),
            "push-to-delivery ms",
            p.delivery_ms,
            "-",
            f64::NAN,
        ),
        Row::new(
            label.clone(),
            "broker CPU ms per push",
            p.cpu_ms_per_push,
            "-",
            f64::NAN,
        ),
        Row::new(
            label,
            "pops woken per push",
            p.woken_per_push,
            "-",
            f64::NAN,
        ),
    ]
}
