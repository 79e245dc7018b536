//! PostgreSQL going away under live traffic: every connection of two brokers terminated, again and
//! again, while producers push through one broker and consumers long-poll and ack through the
//! other. Meanwhile pushes and acks answer 503 with Retry-After (never a 500), pops park or
//! answer 204; afterwards the pools and the LISTEN connections heal by themselves, and every push a
//! producer saw confirmed is delivered. Requires DATABASE_URL (`bash .ci/test`).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

// The simulation's own checkers, compiled into this test, so a run on real processes is held to
// the same verdicts as the simulated one.
#[allow(dead_code)]
#[path = "../../sim-tests/src/sim/fence_check.rs"]
mod fence_check;
#[allow(dead_code)]
#[path = "../../sim-tests/src/sim/kv_check.rs"]
mod kv_check;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{request, start_pair, Client};
use queen_server::config::ServerConfig;
use serde_json::{json, Value};

/// Terminates every connection to the brokers' database but the caller's.
async fn terminate_all(cfg: &tokio_postgres::Config) -> u64 {
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("admin");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate");
    row.get::<_, i64>(0) as u64
}

#[derive(Default)]
struct Seen {
    /// Answers by status, per kind of request.
    statuses: BTreeMap<(&'static str, u16), u64>,
    /// 503 answers without a Retry-After header.
    missing_retry_after: u64,
    confirmed: Vec<String>,
    delivered: BTreeMap<String, u32>,
    failed_acks: u64,
}

fn note(seen: &Mutex<Seen>, kind: &'static str, r: &common::Response) {
    let mut s = seen.lock().unwrap();
    *s.statuses.entry((kind, r.status)).or_default() += 1;
    if r.status == 503 && r.header("retry-after").is_none() {
        s.missing_retry_after += 1;
    }
}

/// Runs the push, long-poll and ack load (producers on `push_at`, consumers of group g on
/// `pop_at`) while `outage` runs, then waits for both brokers' health, drains the queue and
/// checks: no 500, every 503 with Retry-After, no confirmed push lost, a message delivered
/// twice only after a failed ack. Returns what was seen, for the caller's own checks.
async fn under_load<F: std::future::Future<Output = ()>>(
    push_at: std::net::SocketAddr,
    pop_at: std::net::SocketAddr,
    outage: F,
) -> Seen {
    let (a_addr, b_addr) = (push_at, pop_at);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for producer in 0..2 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), a_addr);
        tasks.push(tokio::spawn(produce(producer, addr, seen, stop)));
    }
    for _ in 0..2 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), b_addr);
        tasks.push(tokio::spawn(consume_and_ack(addr, seen, stop)));
    }
    outage.await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // The brokers heal by themselves: health, and a push through A reaching a consumer of B
    // (which needs B's LISTEN connection back, or B's re-checks).
    let healed = Instant::now();
    loop {
        let ha = request(a_addr, "GET", "/health", None).await;
        let hb = request(b_addr, "GET", "/health", None).await;
        if ha.status == 200 && hb.status == 200 {
            break;
        }
        assert_eq!(ha.status.max(hb.status), 503, "health is 200 or 503");
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "still unhealthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Drain what is left, then every confirmed push must have been delivered. A batch whose ack
    // failed comes back when its 2 s lease ends: the drain waits longer than that.
    let mut c = Client::connect(b_addr).await;
    loop {
        let r = c
            .get("/api/v1/pop/queue/faults?wait=true&timeout=3000&batch=100&consumerGroup=g&leaseSeconds=2")
            .await;
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        let body = r.json();
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                            "leaseId": m["leaseId"]})
            })
            .collect();
        {
            let mut s = seen.lock().unwrap();
            for m in &msgs {
                *s.delivered
                    .entry(m["transactionId"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        let r = c
            .post(
                "/api/v1/ack/batch",
                &json!({"consumerGroup": "g", "acknowledgments": acks}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    let s = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!(
        "answers {:?}; {} confirmed, {} failed acks",
        s.statuses,
        s.confirmed.len(),
        s.failed_acks
    );
    assert!(
        s.statuses.keys().all(|(_, status)| *status != 500),
        "a 500 during the outages: {:?}",
        s.statuses
    );
    assert_eq!(s.missing_retry_after, 0, "a 503 without Retry-After");
    assert!(
        !s.statuses.contains_key(&("pop", 503)),
        "a pop answered 503: with storage away it parks, or answers 204 at its deadline"
    );
    assert!(
        s.confirmed.len() > 10,
        "too little traffic to mean anything"
    );
    let lost: Vec<&String> = s
        .confirmed
        .iter()
        .filter(|t| !s.delivered.contains_key(*t))
        .collect();
    assert!(
        lost.is_empty(),
        "confirmed pushes never delivered: {lost:?}"
    );
    let twice = s.delivered.values().filter(|n| **n > 1).count();
    assert!(
        twice == 0 || s.failed_acks > 0,
        "{twice} messages delivered twice with every ack successful"
    );
    s
}

/// A producer of the fault load: one-message pushes until stopped, noting each confirmed one.
async fn produce(
    producer: usize,
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let mut c = Client::connect(addr).await;
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let tx = format!("p{producer}-{n}");
        let body = json!({"items": [{"queue": "faults", "partition": format!("part{}", n % 4),
                                     "transactionId": tx, "payload": {"n": n}}]});
        let r = c.post("/api/v1/push", &body).await;
        note(&seen, "push", &r);
        match r.status {
            201 => seen.lock().unwrap().confirmed.push(tx),
            503 => tokio::time::sleep(Duration::from_millis(20)).await,
            s => panic!(
                "a push answered {s}: {:?}",
                String::from_utf8_lossy(&r.body)
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A consumer of the fault load: long-polls group g, notes every delivery, acks each batch whole.
async fn consume_and_ack(
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let mut c = Client::connect(addr).await;
    while !stop.load(Ordering::Relaxed) {
        let r = c
            .get("/api/v1/pop/queue/faults?wait=true&timeout=1000&batch=10&consumerGroup=g&leaseSeconds=2")
            .await;
        note(&seen, "pop", &r);
        match r.status {
            200 => {}
            204 => continue,
            503 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            s => panic!("a pop answered {s}: {:?}", String::from_utf8_lossy(&r.body)),
        }
        let body = r.json();
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                            "leaseId": m["leaseId"]})
            })
            .collect();
        {
            let mut s = seen.lock().unwrap();
            for m in &msgs {
                let tx = m["transactionId"].as_str().unwrap().to_string();
                *s.delivered.entry(tx).or_default() += 1;
            }
        }
        let r = c
            .post(
                "/api/v1/ack/batch",
                &json!({"consumerGroup": "g", "acknowledgments": acks}),
            )
            .await;
        note(&seen, "ack", &r);
        let all_acked = r.status == 200
            && r.json()
                .as_array()
                .is_some_and(|a| a.iter().all(|o| o["success"] == true));
        if !all_acked {
            seen.lock().unwrap().failed_acks += 1;
        }
        if !matches!(r.status, 200 | 503) {
            panic!("an ack answered {}", r.status);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_heal_and_lose_no_confirmed_push() {
    let (a, b) = start_pair("queen_faults_terminate", ServerConfig::default()).await;
    let cfg = queen_storage_pg::testing::fresh_database_config_existing(&format!(
        "queen_faults_terminate_{}",
        std::process::id()
    ));
    let terminated = Arc::new(AtomicU64::new(0));
    let outage = {
        let terminated = terminated.clone();
        async move {
            // Three outages, 0.7 s apart, under the load.
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(700)).await;
                terminated.fetch_add(terminate_all(&cfg).await, Ordering::Relaxed);
            }
        }
    };
    under_load(a.addr, b.addr, outage).await;
    assert!(
        terminated.load(Ordering::Relaxed) > 0,
        "the outages terminated no connection"
    );
}

/// A PostgreSQL of this test's own (the shared one serves every other test), started with the
/// test command's own script so an outage can stop and restart it. Stopped and removed on drop.
struct PrivatePg {
    dir: String,
    port: String,
    bin: String,
}

impl PrivatePg {
    fn script(&self, command: &str) -> std::process::Command {
        let mut c = std::process::Command::new("bash");
        c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .arg("-c")
            .arg(format!(". .ci/pg.sh && {command}"))
            .env("PG_DIR", &self.dir)
            .env("PG_PORT", &self.port)
            .env("PG_BIN", &self.bin)
            .env("PG_STARTED", "1");
        c
    }

    fn start() -> PrivatePg {
        let out = std::process::Command::new("bash")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .arg("-c")
            .arg(". .ci/pg.sh && pg_start 2>/dev/null && echo \"$PG_DIR $PG_PORT $PG_BIN\"")
            .env_remove("DATABASE_URL")
            .output()
            .expect("run .ci/pg.sh");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let parts: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(parts.len(), 3, "pg_start printed {text:?}");
        PrivatePg {
            dir: parts[0].into(),
            port: parts[1].into(),
            bin: parts[2].into(),
        }
    }

    fn config(&self) -> tokio_postgres::Config {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
            .parse()
            .expect("url")
    }

    /// Starts a streaming standby of this server on a port of its own and makes it synchronous
    /// (every commit waits for it), so a push answered 201 is on it when it is promoted. Returns
    /// its port.
    async fn add_synchronous_standby(&self) -> String {
        let out = self
            .script("pg_add_standby")
            .output()
            .expect("pg_add_standby");
        assert!(
            out.status.success(),
            "pg_add_standby failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (client, conn) = self
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .expect("admin");
        tokio::spawn(conn);
        // The test servers run with synchronous_commit off (pg_launch); the role's setting
        // reaches every session the brokers open after this.
        for statement in [
            "ALTER ROLE postgres SET synchronous_commit = on",
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "SELECT pg_reload_conf()",
        ] {
            client
                .batch_execute(statement)
                .await
                .expect("make the standby synchronous");
        }
        let synchronous = Instant::now();
        loop {
            let rows = client
                .query(
                    "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'",
                    &[],
                )
                .await
                .expect("pg_stat_replication");
            if !rows.is_empty() {
                return port;
            }
            assert!(
                synchronous.elapsed() < Duration::from_secs(30),
                "the standby did not become synchronous"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Crashes the server and promotes the standby (blocking: run it off the runtime's workers).
    fn fail_over(&self) {
        let status = self.script("pg_fail_over").status().expect("pg_fail_over");
        assert!(status.success(), "pg_fail_over failed");
    }

    /// Stops the server, waits, starts it again on the same port (blocking: run it off the
    /// runtime's workers).
    fn pause(&self, secs: u32) {
        let status = self
            .script(&format!("pg_pause {secs}"))
            .status()
            .expect("pg_pause");
        assert!(status.success(), "pg_pause failed");
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.script("pg_stop").status();
    }
}

/// PostgreSQL stopped for 3 s and started again under the load, with two brokers on it: they
/// answer 503 meanwhile (health included), then heal by themselves, LISTEN included (the
/// consumers are on the other broker), and no confirmed push is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_heals_and_loses_no_confirmed_push() {
    let pg = Arc::new(PrivatePg::start());
    let brokers = brokers_on(&pg).await;
    let (a, b) = (brokers[0].1, brokers[1].1);
    // A backlog on six partitions whose ring on B knows four of them are ready (two pops took
    // one each): the long-polls that meet the outage on it each take one partition and hand the
    // wake on to the other.
    for n in 0..6 {
        let body = json!({"items": [{"queue": "faults-backlog", "partition": format!("part{n}"),
                                     "payload": {"n": n}}]});
        assert_eq!(
            request(a, "POST", "/api/v1/push", Some(&body)).await.status,
            201
        );
    }
    const BACKLOG_POP: &str =
        "/api/v1/pop/queue/faults-backlog?batch=1&partitions=1&consumerGroup=g&leaseSeconds=30";
    for _ in 0..2 {
        let path = format!("{BACKLOG_POP}&wait=false");
        assert_eq!(request(b, "GET", &path, None).await.status, 200);
    }
    let unhealthy_meanwhile = Arc::new(AtomicBool::new(false));
    let outage = {
        let (pg, unhealthy) = (pg.clone(), unhealthy_meanwhile.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let paused = tokio::task::spawn_blocking(move || pg.pause(3));
            // While it is down, health says so.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            if request(a, "GET", "/health", None).await.status == 503 {
                unhealthy.store(true, Ordering::Relaxed);
            }
            let backlog_pops: Vec<_> = (0..2)
                .map(|_| {
                    let path = format!("{BACKLOG_POP}&wait=true&timeout=1000");
                    tokio::spawn(async move { request(b, "GET", &path, None).await.status })
                })
                .collect();
            for p in backlog_pops {
                let status = p.await.unwrap();
                assert!(
                    matches!(status, 200 | 204),
                    "a backlog pop answered {status}"
                );
            }
            paused.await.unwrap();
        }
    };
    let seen = under_load(a, b, outage).await;
    assert!(
        unhealthy_meanwhile.load(Ordering::Relaxed),
        "/health was not 503 while PostgreSQL was down"
    );
    // The long-polls on B ask storage again once per broker-wide wait (100 ms, doubling to 1 s)
    // while it is away, not as fast as calls fail: before that rule a group's parked pops woke one
    // another after every failure, about 57,000 failing calls a second per broker. The bound is
    // B's 4 pops at 10 calls a second for twice the outage and the restart.
    let failed_pop_calls = pop_storage_errors(b).await;
    eprintln!("{failed_pop_calls} failed pop calls on B");
    assert!(
        failed_pop_calls <= 4 * 10 * 2 * 5,
        "{failed_pop_calls} failed pop calls on the consumers' broker through a 3 s outage"
    );
    assert!(
        seen.statuses.get(&("push", 503)).copied().unwrap_or(0) > 0,
        "no push met the outage: {:?}",
        seen.statuses
    );
}

/// A failover under the load: the primary crashes and its synchronous standby is promoted. The
/// brokers' URL names both servers with `target_session_attrs=read-write`, as a deployment with a
/// standby writes it; they find the promoted one by themselves (pools and LISTEN connections),
/// answer 503 meanwhile, never 500, and lose no confirmed push. Nothing of a broker may stay tied
/// to the server it first connected to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_promoted_standby_heals_and_loses_no_confirmed_push() {
    let pg = Arc::new(PrivatePg::start());
    let standby_port = pg.add_synchronous_standby().await;
    let both: tokio_postgres::Config = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{standby_port}/postgres\
         ?target_session_attrs=read-write",
        pg.port
    )
    .parse()
    .expect("url");
    let (a, b) = (broker_on(&both, 8, 0).await, broker_on(&both, 8, 1).await);
    let outage = {
        let pg = pg.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            tokio::task::spawn_blocking(move || pg.fail_over())
                .await
                .unwrap();
        }
    };
    let seen = under_load(a.1, b.1, outage).await;
    assert!(
        seen.statuses.get(&("push", 503)).copied().unwrap_or(0) > 0,
        "no push met the failover: {:?}",
        seen.statuses
    );
    // The brokers are on the promoted server now: a queue made after the failover is there.
    let r = request(
        a.1,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "faults-after-failover", "payload": {}}]})),
    )
    .await;
    assert_eq!(r.status, 201);
    let promoted: tokio_postgres::Config =
        format!("postgres://postgres@127.0.0.1:{standby_port}/postgres")
            .parse()
            .expect("url");
    let (client, conn) = promoted
        .connect(tokio_postgres::NoTls)
        .await
        .expect("promoted");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*) FROM queen.queues WHERE name = 'faults-after-failover'",
            &[],
        )
        .await
        .expect("queues");
    assert_eq!(row.get::<_, i64>(0), 1);
}

/// The coordination surfaces through a PostgreSQL restart, with two brokers on it: KV
/// increments through both, lock cycles through both, timers scheduled through one. While it is
/// down they answer 503 (never a 500); afterwards the counter holds every increment answered 200
/// and none beyond those answered 503 (whose commit the caller cannot know), no two workers
/// held the lock at once and its tokens only rose, and every timer answered `ok` fired once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordination_holds_through_a_postgres_restart() {
    let pg = Arc::new(PrivatePg::start());
    let brokers = brokers_on(&pg).await;
    let addrs = [brokers[0].1, brokers[1].1];
    let stop = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(BTreeMap::<(&'static str, u16), u64>::new()));
    let count = |statuses: &Mutex<BTreeMap<(&'static str, u16), u64>>, route, status| {
        *statuses.lock().unwrap().entry((route, status)).or_default() += 1;
    };
    // KV: (answered 200, answered 503) per worker.
    let mut kv_workers = vec![];
    for addr in addrs {
        let (stop, statuses) = (stop.clone(), statuses.clone());
        kv_workers.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let (mut applied, mut unknown) = (0u64, 0u64);
            let incr = json!({"operations": [{"op": "incr", "ns": "faults", "key": "ctr", "forever": true}]});
            while !stop.load(Ordering::Relaxed) {
                let r = c.post("/api/v1/kv", &incr).await;
                count(&statuses, "kv", r.status);
                match r.status {
                    200 => {
                        assert_eq!(r.json()["results"][0]["applied"], true, "{:?}", r.json());
                        applied += 1;
                    }
                    503 => {
                        unknown += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    s => panic!("an incr answered {s}"),
                }
            }
            (applied, unknown)
        }));
    }
    // Locks: the holders right now, the most seen at once, and every token granted in order.
    let holders = Arc::new(AtomicU64::new(0));
    let most_holders = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::<i64>::new()));
    let mut lock_workers = vec![];
    for (i, addr) in addrs.into_iter().enumerate() {
        let (stop, statuses) = (stop.clone(), statuses.clone());
        let (holders, most_holders, tokens) =
            (holders.clone(), most_holders.clone(), tokens.clone());
        lock_workers.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let acquire = json!({"operations": [{"op": "acquire", "name": "faults-mutex",
                                                 "ttlSeconds": 2, "owner": format!("w{i}")}]});
            while !stop.load(Ordering::Relaxed) {
                let r = c.post("/api/v1/locks", &acquire).await;
                count(&statuses, "locks", r.status);
                if r.status != 200 {
                    assert_eq!(r.status, 503, "an acquire answered {}", r.status);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let got = r.json()["results"][0].clone();
                if got["acquired"] != true {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let token = got["token"].as_i64().expect("a token");
                {
                    let mut t = tokens.lock().unwrap();
                    // A resent acquire of a permit still held (its release failed) answers it again.
                    if got["already"] != true || t.last() != Some(&token) {
                        t.push(token);
                    }
                }
                let now_held = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most_holders.fetch_max(now_held, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                let release = json!({"operations": [{"op": "release", "name": "faults-mutex",
                                                     "token": token, "slot": got["slot"]}]});
                let r = c.post("/api/v1/locks", &release).await;
                count(&statuses, "locks", r.status);
                assert!(
                    matches!(r.status, 200 | 503),
                    "a release answered {}",
                    r.status
                );
            }
        }));
    }
    // Timers through A, each due 300 ms later: the keys answered `ok`.
    let timers = {
        let (stop, statuses, addr) = (stop.clone(), statuses.clone(), addrs[0]);
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut scheduled = vec![];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("t{n}");
                let payload =
                    base64::engine::general_purpose::STANDARD.encode(json!({"k": key}).to_string());
                let op = json!({"operations": [{"op": "schedule", "queue": "faults-timers",
                    "timerKey": key, "payload": payload, "delayMs": 300, "txn": key}]});
                let r = c.post("/api/v1/timers", &op).await;
                count(&statuses, "timers", r.status);
                match r.status {
                    200 if r.json()["results"][0]["ok"] == true => scheduled.push(key),
                    503 => tokio::time::sleep(Duration::from_millis(20)).await,
                    s => panic!(
                        "a schedule answered {s}: {:?}",
                        String::from_utf8_lossy(&r.body)
                    ),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            scheduled
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.pause(3))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut applied, mut unknown) = (0, 0);
    for w in kv_workers {
        let (a, u) = w.await.unwrap();
        (applied, unknown) = (applied + a, unknown + u);
    }
    for w in lock_workers {
        w.await.unwrap();
    }
    let scheduled = timers.await.unwrap();
    let statuses = statuses.lock().unwrap().clone();
    eprintln!("answers {statuses:?}");
    for route in ["kv", "locks", "timers"] {
        assert!(
            statuses.get(&(route, 503)).copied().unwrap_or(0) > 0,
            "no {route} call met the outage: {statuses:?}"
        );
    }
    let r = request(addrs[1], "GET", "/api/v1/kv/faults/ctr", None).await;
    assert_eq!(r.status, 200);
    let value = r.json()["value"].as_u64().expect("a number");
    assert!(
        applied <= value && value <= applied + unknown,
        "the counter is {value}: {applied} increments answered 200, {unknown} answered 503"
    );
    assert_eq!(
        most_holders.load(Ordering::SeqCst),
        1,
        "two holders at once"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens.len() > 10, "too few lock cycles: {}", tokens.len());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "lock tokens fell: {tokens:?}"
    );
    let fired = common::pop_until(
        addrs[1],
        None,
        "faults-timers",
        scheduled.len(),
        "transactionId",
    )
    .await;
    let missing: Vec<&String> = scheduled
        .iter()
        .filter(|k| !fired.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "timers answered ok that never fired: {missing:?}"
    );
}

/// A stream's window sums through a PostgreSQL restart, with Queen's real Python client and its
/// streams SDK (tests/python/streams_restart.py): the worker's cycles go through one broker, the
/// producers' pushes through the other, and PostgreSQL is stopped for 3 s while the worker is
/// busy with a backlog of cycles and producers go on pushing. Every event is counted exactly
/// once: a cycle that failed in the outage loses nothing (its batch comes back), and one retried
/// after an answer lost in the outage counts nothing twice (the cycle is fenced on its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_counts_every_event_once_through_a_postgres_restart() {
    let pg = PrivatePg::start();
    let brokers = brokers_on(&pg).await;
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = python_on_pair("streams_restart.py", &brokers, "4000")
        .arg(root)
        .env("PG_DIR", &pg.dir)
        .env("PG_PORT", &pg.port)
        .env("PG_BIN", &pg.bin)
        .env("PG_STARTED", "1")
        .output()
        .await
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("streams restart: all checks passed"),
        "the streams restart script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
}

/// Exactly once where users count, on real processes (tests/python/exactly_once.py, Queen's
/// Python client and streams SDK): two `queen` processes on one PostgreSQL; a rate limiter (incr
/// with max), a lock whose holders write to a fenced resource, and a windowed stream whose worker
/// is on broker A. A is killed with SIGKILL and started again, then PostgreSQL is stopped for 3 s
/// and started again, all while the workloads run. Afterwards the stream's windows counted every
/// event once (the script checks), and the counter's and the fenced resource's histories pass
/// the simulation's checkers: the counter is exact within the unknown outcomes and never past
/// its max, the accepted tokens only rose, no token served two holders, holders never overlapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_holds_through_a_killed_broker_and_a_postgres_restart() {
    let pg = Arc::new(PrivatePg::start());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let (port_a, port_b) = (free_port(), free_port());
    let mut broker_a = spawn_broker(&url, port_a).await;
    let _broker_b = spawn_broker(&url, port_b).await;
    let python = std::env::var("QUEEN_PYTHON").expect(
        "QUEEN_PYTHON must name a Python with queen-mq==2.6.0 installed (run `bash .ci/test`)",
    );
    let script = tokio::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/exactly_once.py"
        ))
        .arg(format!("http://127.0.0.1:{port_a}"))
        .arg(format!("http://127.0.0.1:{port_b}"))
        .arg("14")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python client");
    tokio::time::sleep(Duration::from_secs(4)).await;
    broker_a.kill().await.expect("SIGKILL broker A");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _broker_a = spawn_broker(&url, port_a).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.pause(3))
            .await
            .unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(240), script.wait_with_output())
        .await
        .expect("the script ended")
        .expect("the script's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("exactly once: all checks passed"),
        "the exactly-once script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history: Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("HISTORY "))
        .and_then(|h| serde_json::from_str(h).ok())
        .expect("the script's history");
    let counter = &history["counter"];
    let outcomes: Vec<kv_check::IncrOutcome> = counter["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .map(|o| match (o["admitted"].as_i64(), o.get("refused")) {
            (Some(v), _) => kv_check::IncrOutcome::Admitted(v),
            (None, Some(_)) => kv_check::IncrOutcome::Refused,
            _ => kv_check::IncrOutcome::Unknown,
        })
        .collect();
    let (ns, key, max) = (
        counter["ns"].as_str().expect("ns"),
        counter["key"].as_str().expect("key"),
        counter["max"].as_i64().expect("max"),
    );
    let addr_b: std::net::SocketAddr = format!("127.0.0.1:{port_b}").parse().unwrap();
    let r = request(addr_b, "GET", &format!("/api/v1/kv/{ns}/{key}"), None).await;
    assert_eq!(r.status, 200, "the counter: {:?}", r.json());
    let value = r.json()["value"].as_i64().expect("a number");
    let unknown = outcomes
        .iter()
        .filter(|o| **o == kv_check::IncrOutcome::Unknown)
        .count();
    let admitted = outcomes
        .iter()
        .filter(|o| matches!(o, kv_check::IncrOutcome::Admitted(_)))
        .count();
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("HISTORY "))
        .collect();
    eprintln!(
        "{}\ncounter {value}: {admitted} admitted, {unknown} unknown of {} calls",
        said.join("\n"),
        outcomes.len()
    );
    assert_eq!(
        kv_check::check_counter(&outcomes, value, max),
        Vec::<String>::new()
    );
    assert!(unknown > 0, "no increment met the faults");
    let writes: Vec<fence_check::FencedWrite> = history["fenced"]
        .as_array()
        .expect("fenced writes")
        .iter()
        .map(|w| fence_check::FencedWrite {
            tenure: w["tenure"].as_str().expect("tenure").to_string(),
            token: w["token"].as_i64().expect("token"),
            accepted: w["accepted"].as_bool().expect("accepted"),
        })
        .collect();
    assert!(
        writes.iter().filter(|w| w.accepted).count() > 20,
        "too few lock cycles: {}",
        writes.len()
    );
    assert_eq!(
        fence_check::check_fenced("the lock", &writes),
        Vec::<String>::new()
    );
}

/// An ephemeral queue through a PostgreSQL outage longer than the brokers' liveness (7 s: every
/// broker's liveness row runs out), on two brokers sharing their queues: a owns the queue and
/// holds 20 messages, and pushes go through b, which does not own it, all through the outage and
/// after. b is back first but may not take the queue over until it has been alive for
/// `TAKEOVER_AFTER_MS`, by which time a has renewed: afterwards the queue holds a's 20 messages
/// and every push answered 200, once each, in order. (Before, b took the queue from a as soon as
/// the database was back, and a's messages were gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_queue_keeps_its_contents_through_a_long_postgres_outage() {
    let pg = Arc::new(PrivatePg::start());
    let (_a, a_addr) = peer_broker_on(&pg.config(), 0).await;
    let (_b, b_addr) = peer_broker_on(&pg.config(), 1).await;
    let held: Vec<String> = (0..20).map(|i| format!("a-{i}")).collect();
    let messages: Vec<Value> = held.iter().map(|p| json!({"payload": p})).collect();
    let r = request(
        a_addr,
        "POST",
        "/api/v1/ephemeral/push",
        Some(&json!({"queue": "outage", "messages": messages})),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let stop = Arc::new(AtomicBool::new(false));
    let pushes = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut c = Client::connect(b_addr).await;
            let mut answers: Vec<(String, u16)> = vec![];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let payload = format!("b-{n}");
                let body = json!({"queue": "outage", "messages": [{"payload": payload}]});
                let r = c.post("/api/v1/ephemeral/push", &body).await;
                assert!(
                    matches!(r.status, 200 | 503),
                    "a push through b answered {}: {:?}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
                answers.push((payload, r.status));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.pause(7))
            .await
            .unwrap();
    }
    // Pushes go on until several have been stored after the outage.
    let back = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = pushes.await.unwrap();
    let stored: Vec<String> = answers
        .iter()
        .filter(|(_, status)| *status == 200)
        .map(|(p, _)| p.clone())
        .collect();
    let refused = answers.iter().filter(|(_, s)| *s == 503).count();
    eprintln!(
        "pushes through b: {} answered 200, {refused} answered 503; {:.1} s after the outage",
        stored.len(),
        back.elapsed().as_secs_f64()
    );
    assert!(refused > 0, "no push met the outage");
    let after: Vec<&String> = answers
        .iter()
        .rev()
        .take_while(|(_, s)| *s == 200)
        .map(|(p, _)| p)
        .collect();
    assert!(
        after.len() > 5,
        "too few pushes stored after the outage: {answers:?}"
    );
    let r = request(
        a_addr,
        "GET",
        "/api/v1/ephemeral/pop?queue=outage&group=g&batch=10000",
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let got: Vec<String> = r.json()["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["payload"].as_str().expect("a payload").to_string())
        .collect();
    // A push answered 503 may have reached the owner (its answer lost): it may be there, once.
    let answered_503: std::collections::BTreeSet<&String> = answers
        .iter()
        .filter(|(_, s)| *s == 503)
        .map(|(p, _)| p)
        .collect();
    let expected_or_unknown: Vec<String> = got
        .iter()
        .filter(|p| !answered_503.contains(p))
        .cloned()
        .collect();
    let expected: Vec<String> = held.iter().chain(stored.iter()).cloned().collect();
    assert_eq!(
        expected_or_unknown, expected,
        "after the outage the queue holds {got:?}"
    );
}

/// A broker (its tasks started) on the PostgreSQL of `cfg` that shares its ephemeral queues with
/// the others on it (its peer address is where it serves).
async fn peer_broker_on(
    cfg: &tokio_postgres::Config,
    seed: u64,
) -> (Arc<queen_server::broker::Broker>, std::net::SocketAddr) {
    let storage = storage_on(cfg, 8).await;
    let (listener, addr, config) = common::bind_peer(ServerConfig::default()).await;
    let app = queen_server::broker::Broker::new(
        config,
        queen_core::storage::StorageSet::of(Arc::new(storage.clone())),
        seed,
    );
    queen_server::tasks::start(&app);
    queen_server::spawn_event_listener(app.clone(), &storage);
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    (app, addr)
}

/// A table locked by another session (an operator's `LOCK TABLE`, a stuck migration): requests
/// that need it wait at most the connections' `lock_timeout`, then answer 503 with Retry-After,
/// where they used to wait as long as the lock was held. Once it is released they succeed.
/// (The broker sets 10 s unless the URL sets one: here the URL's 500 ms, to keep the test short.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_table_answers_503_instead_of_hanging() {
    let name = format!("queen_faults_locked_{}", std::process::id());
    let mut cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    {
        let unset = storage_on(&cfg, 1).await;
        let client = unset.pool().get().await.expect("a connection");
        let row = client
            .query_one("SHOW lock_timeout", &[])
            .await
            .expect("show");
        assert_eq!(
            row.get::<_, String>(0),
            "10s",
            "the broker's default lock_timeout"
        );
    }
    cfg.options("-c lock_timeout=500");
    let (_app, addr) = broker_on(&cfg, 4, 0).await;
    let push = json!({"items": [{"queue": "locked", "payload": {"n": 1}}]});
    assert_eq!(
        request(addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );

    let (locker, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    locker
        .batch_execute("BEGIN; LOCK TABLE queen.log_partitions IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let waited = push_answers_503_within(addr, &push, Duration::from_secs(30)).await;
    eprintln!("the push answered 503 after {waited:?}");
    locker.batch_execute("COMMIT").await.expect("unlock");
    assert_eq!(
        request(addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
}

/// A broker frozen in the middle of a transaction (a stopped process, a paused VM, a host that
/// vanished; here a session of another broker's pool that took a partition's row lock, as a
/// push does, and then sends nothing): the database ends that session after the broker's
/// `idle_in_transaction_session_timeout` (5 s, under the 10 s `lock_timeout`), so a push of that
/// partition through a live broker is stored. Before, the lock stayed as long as the broker was
/// frozen, and every such push answered 503 at the lock timeout. The frozen broker, resumed,
/// finds its transaction gone: its commit fails, so nothing of it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_frozen_in_a_transaction_holds_its_locks_only_briefly() {
    let name = format!("queen_faults_frozen_tx_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let (_app, live) = broker_on(&cfg, 4, 0).await;
    let push = json!({"items": [{"queue": "frozen-tx", "partition": "p", "payload": {"n": 1}}]});
    assert_eq!(
        request(live, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );

    let frozen = storage_on(&cfg, 1).await;
    let mut session = frozen.pool().get().await.expect("a connection");
    let idle = session
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .expect("show");
    assert_eq!(idle.get::<_, String>(0), "5s", "the broker's default");
    let tx = session.transaction().await.expect("begin");
    tx.query(
        "SELECT 1 FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = 'frozen-tx' AND p.name = 'p' FOR UPDATE OF p",
        &[],
    )
    .await
    .expect("the partition's row lock");

    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        request(live, "POST", "/api/v1/push", Some(&push)),
    )
    .await
    .expect("the push hung behind the frozen session");
    eprintln!(
        "the push answered {} after {:?}",
        r.status,
        started.elapsed()
    );
    assert_eq!(
        r.status,
        201,
        "a push waited on the frozen broker's lock: {}",
        String::from_utf8_lossy(&r.body)
    );

    assert!(
        tx.commit().await.is_err(),
        "the frozen broker's transaction outlived the timeout"
    );
    assert!(session.is_closed(), "the ended session is kept");
}

/// A transaction left open in the database (here a session named `forgotten-report`, idle in a
/// repeatable-read transaction) holds back PostgreSQL's cleanup of the broker's tables, and the
/// broker cannot end it: it says so. `PgStorage::oldest_snapshot` names the session, the watch
/// sets `queen_database_oldest_snapshot_seconds` to its age, and once it ends neither names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_held_open_in_the_database_is_reported() {
    let name = format!("queen_faults_snapshot_{}", std::process::id());
    let mut cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let (app, addr) = broker_on(&cfg, 4, 0).await;
    let pg = storage_on(&cfg, 2).await;

    cfg.application_name("forgotten-report");
    let (report, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    report
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.queues")
        .await
        .expect("a snapshot");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let oldest = pg
        .oldest_snapshot()
        .await
        .expect("read")
        .expect("no holder found");
    assert!(oldest.holder.starts_with("session pid "), "{oldest:?}");
    assert!(
        oldest.detail.contains("forgotten-report") && oldest.detail.contains("idle in transaction"),
        "{oldest:?}"
    );
    assert!(oldest.age_secs >= 1.4, "{oldest:?}");

    queen_server::spawn_snapshot_watch(&app, &pg);
    let started = Instant::now();
    while app.metrics.database_oldest_snapshot_seconds.get() < 1.4 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the gauge stayed at {}",
            app.metrics.database_oldest_snapshot_seconds.get()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let scraped = request(addr, "GET", "/metrics/prometheus", None).await;
    assert!(
        String::from_utf8_lossy(&scraped.body).contains("queen_database_oldest_snapshot_seconds"),
        "the gauge is not exposed"
    );

    report.batch_execute("COMMIT").await.expect("commit");
    if let Some(o) = pg.oldest_snapshot().await.expect("read") {
        assert!(!o.detail.contains("forgotten-report"), "{o:?}");
    }
}

/// A claimed batch in which one partition's messages cannot be read (here its segment cut short
/// by SQL, as a damaged row or a segment of an unknown format would be) costs the other
/// partitions of the same pop nothing: they are answered, and their leases and acks work. The
/// unreadable partition's lease is kept until it ends, so the group's next pops do not claim it
/// and fail again at once. Before, the whole pop answered 500, every lease of the batch stayed
/// held until it ended (the release read the segments too, and failed), and the log said they
/// were given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_cannot_be_read_costs_the_others_nothing() {
    let name = format!("queen_faults_unreadable_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let (_app, addr) = broker_on(&cfg, 4, 0).await;
    for p in ["a", "b", "c", "d", "e"] {
        let push = json!({"items": [
            {"queue": "unreadable", "partition": p, "payload": {"n": 1}},
            {"queue": "unreadable", "partition": p, "payload": {"n": 2}}]});
        let r = request(addr, "POST", "/api/v1/push", Some(&push)).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    let (db, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let cut = db
        .execute(
            "UPDATE queen.log_segments s SET blob = substring(s.blob FROM 1 FOR 10)
               FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = 'unreadable' AND p.name = 'a' AND s.partition_id = p.id",
            &[],
        )
        .await
        .expect("cut the segment");
    assert_eq!(cut, 1);

    let pop = "/api/v1/pop/queue/unreadable?consumerGroup=g&batch=100&partitions=5&wait=false";
    let r = request(addr, "GET", pop, None).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let answer = r.json();
    let messages = answer["messages"].as_array().expect("messages");
    let partitions: std::collections::BTreeSet<&str> = messages
        .iter()
        .map(|m| m["partition"].as_str().expect("partition"))
        .collect();
    assert_eq!(messages.len(), 8, "{answer}");
    assert_eq!(partitions, ["b", "c", "d", "e"].into_iter().collect());
    let acks: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": "completed"})
        })
        .collect();
    let r = request(
        addr,
        "POST",
        "/api/v1/ack/batch",
        Some(&json!({"acknowledgments": acks, "consumerGroup": "g"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // The unreadable partition is held off by its kept lease: no 500 again at once.
    let r = request(addr, "GET", pop, None).await;
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    let row = db
        .query_one(
            "SELECT c.committed, c.worker_id IS NOT NULL AND c.lease_expires_at > now()
               FROM queen.log_consumers c JOIN queen.log_partitions p ON p.id = c.partition_id
              WHERE p.name = 'a' AND c.consumer_group = 'g'",
            &[],
        )
        .await
        .expect("a's cursor");
    assert_eq!(row.get::<_, i64>(0), -1, "nothing of a was consumed");
    assert!(row.get::<_, bool>(1), "a's lease was not kept");
}

/// A database that stops answering without closing its connections (a stalled disk, a frozen
/// host; here the in-memory backend with every statement held): a push answers 503 with
/// Retry-After at the storage deadline (60 s, in paused time), where it used to wait as long as
/// the database did, and a pop's storage call gives up at the same deadline (the pop answers
/// 204). Once the database answers again, so does the broker. (A long-poll is asked with
/// `wait=false` here: its own timeout runs on the broker's wall clock, which paused time does not
/// move.)
#[tokio::test(start_paused = true)]
async fn a_frozen_database_answers_503_at_the_deadline() {
    let frozen = Arc::new(AtomicBool::new(false));
    let pause: queen_storage_sim::PauseFn = {
        let frozen = frozen.clone();
        Arc::new(move |_| {
            let frozen = frozen.clone();
            Box::pin(async move {
                while frozen.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
    };
    let db = queen_storage_sim::SimDb::interleaved(
        1,
        Arc::new(queen_server::wall_now),
        queen_storage_sim::SimBugs::default(),
        pause,
    );
    let app = queen_server::broker::Broker::new(
        ServerConfig::default(),
        queen_core::storage::StorageSet::of(db),
        0,
    );
    let addr = serve(&app).await;
    let push = json!({"items": [{"queue": "frozen", "payload": {"n": 1}}]});
    assert_eq!(
        request(addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );

    frozen.store(true, Ordering::SeqCst);
    let waited = push_answers_503_within(addr, &push, Duration::from_secs(600)).await;
    assert!(
        waited >= queen_server::config::STORAGE_DEADLINE,
        "answered before the deadline: {waited:?}"
    );
    let r = tokio::time::timeout(
        Duration::from_secs(600),
        request(addr, "GET", "/api/v1/pop/queue/frozen?wait=false", None),
    )
    .await
    .expect("the long-poll hung with the database");
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));

    frozen.store(false, Ordering::SeqCst);
    assert_eq!(
        request(addr, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
}

/// Sends `push` and expects a 503 with Retry-After within `bound` (a hang fails the test);
/// answers how long it took (in tokio's time, paused or not).
async fn push_answers_503_within(
    addr: std::net::SocketAddr,
    push: &Value,
    bound: Duration,
) -> Duration {
    let started = tokio::time::Instant::now();
    let r = tokio::time::timeout(bound, request(addr, "POST", "/api/v1/push", Some(push)))
        .await
        .unwrap_or_else(|_| panic!("the push did not answer within {bound:?}"));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.header("retry-after").is_some(),
        "a 503 without Retry-After"
    );
    started.elapsed()
}

/// A script of tests/python run by the Python with Queen's client installed, given the two
/// brokers' URLs and `count` (what it counts is the script's).
fn python_on_pair(
    script: &str,
    brokers: &[(Arc<queen_server::broker::Broker>, std::net::SocketAddr)],
    count: &str,
) -> tokio::process::Command {
    let python = std::env::var("QUEEN_PYTHON").expect(
        "QUEEN_PYTHON must name a Python with queen-mq==2.6.0 installed (run `bash .ci/test`)",
    );
    let mut c = tokio::process::Command::new(python);
    c.arg(format!(
        "{}/tests/python/{script}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .arg(format!("http://{}", brokers[0].1))
    .arg(format!("http://{}", brokers[1].1))
    .arg(count);
    c
}

/// The broker's storage on the PostgreSQL of `cfg` (connected and migrated), with `pool_size`
/// connections.
async fn storage_on(cfg: &tokio_postgres::Config, pool_size: usize) -> queen_storage_pg::PgStorage {
    queen_storage_pg::PgStorage::connect(&queen_storage_pg::PgConfig {
        tls: Default::default(),
        pg: cfg.clone(),
        pool_size,
    })
    .await
    .expect("connect")
}

/// A broker (its tasks started) on the PostgreSQL of `cfg` with `pool_size` connections,
/// serving on a port of its own.
async fn broker_on(
    cfg: &tokio_postgres::Config,
    pool_size: usize,
    seed: u64,
) -> (Arc<queen_server::broker::Broker>, std::net::SocketAddr) {
    let storage = storage_on(cfg, pool_size).await;
    let app = queen_server::broker::Broker::new(
        ServerConfig::default(),
        queen_core::storage::StorageSet::of(Arc::new(storage.clone())),
        seed,
    );
    queen_server::tasks::start(&app);
    queen_server::spawn_event_listener(app.clone(), &storage);
    let addr = serve(&app).await;
    (app, addr)
}

/// Serves `app` on a port of its own.
async fn serve(app: &Arc<queen_server::broker::Broker>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    addr
}

/// Two brokers on `pg`, each with its tasks and its event listener, serving on a port of their own.
async fn brokers_on(
    pg: &PrivatePg,
) -> Vec<(Arc<queen_server::broker::Broker>, std::net::SocketAddr)> {
    let mut brokers = vec![];
    for seed in 0..2u64 {
        brokers.push(broker_on(&pg.config(), 8, seed).await);
    }
    brokers
}

/// The broker's `queen_storage_errors_total` lines, by its metrics.
async fn storage_error_lines(addr: std::net::SocketAddr) -> Vec<String> {
    let r = request(addr, "GET", "/metrics/prometheus", None).await;
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with("queen_storage_errors_total{"))
        .map(String::from)
        .collect()
}

/// Storage calls of pops that failed on the broker at `addr`, by its metrics.
async fn pop_storage_errors(addr: std::net::SocketAddr) -> u64 {
    storage_error_lines(addr)
        .await
        .iter()
        .filter(|l| l.contains("route=\"pop\""))
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap_or_default();
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("a counter: {l}")) as u64
        })
        .sum()
}

/// More long-polls and pushes at once than the pool has connections (4): they queue for
/// permits and connections, none deadlocks or fails, every push is stored and every long-poll
/// answers by its deadline (the 60 s guard only tells a hang from an answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_requests_than_connections_queue_and_all_answer() {
    let name = format!("queen_faults_pressure_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let (app, addr) = broker_on(&cfg, 4, 9).await;
    let guard = Duration::from_secs(60);
    let mut polls = vec![];
    for i in 0..200 {
        polls.push(tokio::spawn(async move {
            let path = format!(
                "/api/v1/pop/queue/pressure-{}?wait=true&timeout=3000&consumerGroup=g{}",
                i % 20,
                i % 3
            );
            tokio::time::timeout(guard, request(addr, "GET", &path, None))
                .await
                .expect("a long-poll hung")
                .status
        }));
    }
    let mut pushes = vec![];
    for i in 0..60 {
        pushes.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut statuses = vec![];
            for k in 0..10 {
                let body = json!({"items": [{"queue": format!("pressure-{}", (i + k) % 20),
                                             "partition": format!("p{k}"),
                                             "transactionId": format!("t{i}-{k}"), "payload": k}]});
                let r = tokio::time::timeout(guard, c.post("/api/v1/push", &body))
                    .await
                    .expect("a push hung");
                statuses.push(r.status);
            }
            statuses
        }));
    }
    for p in pushes {
        for s in p.await.unwrap() {
            assert_eq!(s, 201, "a push under pressure");
        }
    }
    for p in polls {
        let s = p.await.unwrap();
        assert!(
            s == 200 || s == 204,
            "a long-poll under pressure answered {s}"
        );
    }
    let stored: u64 = app.metrics.messages_pushed.get();
    assert_eq!(stored, 600, "every push stored");
    app.shutting_down.send_replace(true);
    queen_storage_pg::testing::drop_database(&name).await;
}

/// The `queen` binary on the database at `url`, listening on `port`, once it answers healthy.
async fn spawn_broker(url: &str, port: u16) -> tokio::process::Child {
    let child = start_queen(url, port, None);
    assert!(
        healthy_within(port, Duration::from_secs(100)).await,
        "queen did not become healthy"
    );
    child
}

/// The `queen` binary on the database at `url`, listening on `port`, its log to `log` (the
/// test's own output when `None`).
fn start_queen(url: &str, port: u16, log: Option<&std::path::Path>) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_queen"));
    command
        .env("DATABASE_URL", url)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    if let Some(path) = log {
        let file = std::fs::File::create(path).expect("log file");
        command
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
    }
    command.spawn().expect("start queen")
}

/// Whether the broker on `port` answers `/health` with 200 within `limit`.
async fn healthy_within(port: u16, limit: Duration) -> bool {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(Ok(r)) = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .ok()?;
                let mut out = vec![];
                s.read_to_end(&mut out).await.ok()?;
                Some(out.starts_with(b"HTTP/1.1 200"))
            }),
        )
        .await
        {
            if r == Some(true) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A broker started while PostgreSQL is down (a host booting both, a restart of the database
/// beside the broker's deploy) waits for it with a warning per try instead of exiting, and
/// serves once it is up; a wrong setting (a database that does not exist) stops it at once and
/// says why, since waiting would not mend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_started_before_postgres_waits_for_it() {
    let pg = PrivatePg::start();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    assert!(pg.script("pg_halt").status().expect("pg_halt").success());
    let log = std::env::temp_dir().join(format!("queen-waits-{}.log", std::process::id()));
    let port = free_port();
    let mut broker = start_queen(&url, port, Some(&log));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        broker.try_wait().expect("try_wait").is_none(),
        "the broker exited while PostgreSQL was down: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("waiting for PostgreSQL"),
        "no warning while waiting: {text}"
    );
    assert!(pg
        .script("pg_launch")
        .status()
        .expect("pg_launch")
        .success());
    assert!(
        healthy_within(port, Duration::from_secs(30)).await,
        "the broker did not serve once PostgreSQL was up: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let pushed = request(
        format!("127.0.0.1:{port}").parse().unwrap(),
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "waited", "payload": {"n": 1}}]})),
    )
    .await;
    assert_eq!(pushed.status, 201);
    broker.kill().await.expect("kill");

    let wrong = format!("postgres://postgres@127.0.0.1:{}/no_such_database", pg.port);
    let mut broker = start_queen(&wrong, free_port(), Some(&log));
    let status = tokio::time::timeout(Duration::from_secs(20), broker.wait())
        .await
        .expect("a broker with a wrong database name kept running")
        .expect("wait");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("cannot use PostgreSQL") && text.contains("no_such_database"),
        "the broker did not say why it stopped: {text}"
    );
    let _ = std::fs::remove_file(&log);
}

/// One request on a fresh connection that may die with the broker: `None` when no answer came.
async fn try_request(
    addr: std::net::SocketAddr,
    method: &'static str,
    path: String,
    body: Value,
) -> Option<(u16, Value)> {
    let attempt = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        let r = c
            .send(method, &path, Some(&serde_json::to_vec(&body).unwrap()))
            .await;
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    });
    // A request to a killed broker fails inside the raw client (it panics on I/O errors).
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .ok()?
        .ok()
}

/// The broker killed (SIGKILL) while pushes, transactions and acks are in flight, then started
/// again; the clients retry every request that got no answer, with the same transactionIds.
/// Nothing confirmed is lost and nothing is stored twice: an audit group reads every message of
/// the queue exactly once per transactionId. PostgreSQL decides; the broker keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_loses_nothing_and_applies_nothing_twice() {
    let name = format!("queen_faults_kill_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let base = queen_storage_pg::testing::database_url();
    let url = match base.rfind('/') {
        Some(i) => format!("{}/{name}", &base[..i]),
        None => panic!("DATABASE_URL has no database part: {base}"),
    };
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut broker = spawn_broker(&url, port).await;
    let (requests, expected) = kill_test_requests();
    // First pass: the requests go out a millisecond apart, and the broker is killed as soon as
    // the first answer is back, with the others in flight or not yet sent.
    let first_answer = Arc::new(tokio::sync::Notify::new());
    let mut first = vec![];
    for (m, p, b) in requests.iter().cloned() {
        let first_answer = first_answer.clone();
        first.push(tokio::spawn(async move {
            let r = try_request(addr, m, p, b).await;
            if r.is_some() {
                first_answer.notify_one();
            }
            r
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), first_answer.notified()).await;
    broker.kill().await.expect("SIGKILL");
    let mut unanswered = vec![];
    for (req, h) in requests.iter().zip(first) {
        match h.await.unwrap() {
            Some((s, _)) if (200..300).contains(&s) => {}
            _ => unanswered.push(req.clone()),
        }
    }
    assert!(
        unanswered.len() < requests.len(),
        "the kill came before any answer"
    );
    // Again, and the clients retry what got no answer.
    let _broker = spawn_broker(&url, port).await;
    for (m, p, b) in &unanswered {
        let (s, answer) = try_request(addr, m, p.clone(), b.clone())
            .await
            .expect("the restarted broker answers");
        assert!((200..300).contains(&s), "a retry answered {s}: {answer}");
    }
    // A consumer acks some of it; the broker is killed mid-ack; the ack is retried.
    let popped = try_request(
        addr,
        "GET",
        "/api/v1/pop/queue/kill/partition/tx?batch=10&consumerGroup=worker".into(),
        Value::Null,
    )
    .await
    .expect("pop");
    assert_eq!(popped.0, 200);
    let acks: Vec<Value> = popped.1["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
        .collect();
    let ack_body = json!({"consumerGroup": "worker", "acknowledgments": acks});
    let pending_ack = tokio::spawn(try_request(
        addr,
        "POST",
        "/api/v1/ack/batch".into(),
        ack_body.clone(),
    ));
    drop(_broker); // kill_on_drop: SIGKILL
    let _ = pending_ack.await;
    let _broker = spawn_broker(&url, port).await;
    let (s, answer) = try_request(addr, "POST", "/api/v1/ack/batch".into(), ack_body)
        .await
        .expect("ack retry");
    assert_eq!(s, 200, "{answer}");
    assert!(
        answer
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["success"] == true),
        "a retried ack is applied once and then answers success: {answer}"
    );
    audit_every_push_stored_once(addr, &expected).await;
    // The worker's acked batch is not delivered to it again.
    let (s, body) = try_request(
        addr,
        "GET",
        "/api/v1/pop/queue/kill/partition/tx?batch=10&consumerGroup=worker".into(),
        Value::Null,
    )
    .await
    .expect("pop after ack");
    if s == 200 {
        let again: Vec<&Value> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                popped.1["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["transactionId"] == m["transactionId"])
            })
            .collect();
        assert!(again.is_empty(), "an acked message came back: {again:?}");
    }
    eprintln!(
        "{} of {} requests unanswered at the kill and retried",
        unanswered.len(),
        requests.len()
    );
    drop(_broker);
    drop(cfg);
    queen_storage_pg::testing::drop_database(&name).await;
}

/// A request of the kill test: (method, path, body).
type KillRequest = (&'static str, String, Value);

/// Requests, each retried until answered; and the transactionIds they push.
fn kill_test_requests() -> (Vec<KillRequest>, Vec<String>) {
    let mut requests: Vec<KillRequest> = vec![];
    for i in 0..40 {
        requests.push((
            "POST",
            "/api/v1/push".into(),
            json!({"items": (0..5).map(|k| json!({"queue": "kill", "partition": format!("p{}", k % 3),
                "transactionId": format!("push-{i}-{k}"), "payload": {"i": i, "k": k}})).collect::<Vec<_>>()}),
        ));
        requests.push((
            "POST",
            "/api/v1/transaction".into(),
            json!({"operations": [{"type": "push", "items": [
                {"queue": "kill", "partition": "tx", "transactionId": format!("tx-{i}-a"), "payload": i},
                {"queue": "kill", "partition": "tx", "transactionId": format!("tx-{i}-b"), "payload": i}]}]}),
        ));
    }
    let expected: Vec<String> = requests
        .iter()
        .flat_map(|(_, _, body)| {
            let items = body["items"]
                .as_array()
                .cloned()
                .or_else(|| body["operations"][0]["items"].as_array().cloned())
                .unwrap_or_default();
            items
                .into_iter()
                .map(|i| i["transactionId"].as_str().unwrap().to_string())
        })
        .collect();
    (requests, expected)
}

/// The audit: every message of the queue once, from the start; nothing else.
async fn audit_every_push_stored_once(addr: std::net::SocketAddr, expected: &[String]) {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    loop {
        let (s, body) = try_request(
            addr,
            "GET",
            "/api/v1/pop/queue/kill?batch=1000&partitions=10&autoAck=true&consumerGroup=audit"
                .into(),
            Value::Null,
        )
        .await
        .expect("audit pop");
        if s == 204 {
            break;
        }
        for m in body["messages"].as_array().unwrap() {
            *seen
                .entry(m["transactionId"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    let missing: Vec<&String> = expected.iter().filter(|t| !seen.contains_key(*t)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    let twice: Vec<(&String, &u32)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "stored twice: {twice:?}");
    assert_eq!(seen.len(), expected.len(), "stored something never pushed");
}

/// A scratch directory for a file buffer, empty.
fn buffer_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("queen-test-buffer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A broker on `storage` with a file buffer in `dir`.
async fn buffered_broker(
    storage: queen_core::storage::StorageSet,
    dir: &std::path::Path,
) -> (Arc<queen_server::broker::Broker>, std::net::SocketAddr) {
    let buffer = queen_server::buffer::FileBuffer::open(dir).expect("buffer");
    let config = ServerConfig {
        file_buffer: Some(Arc::new(buffer)),
        ..ServerConfig::default()
    };
    let app = queen_server::broker::Broker::new(config, storage, 13);
    queen_server::tasks::start(&app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(queen_server::serve_listener(app.clone(), listener));
    (app, addr)
}

/// Every message of `queue` for a fresh group, in delivery order, until the queue is empty.
async fn read_all(addr: std::net::SocketAddr, queue: &str, group: &str) -> Vec<Value> {
    let mut out = vec![];
    let mut c = Client::connect(addr).await;
    loop {
        let r = c
            .get(&format!(
                "/api/v1/pop/queue/{queue}?batch=1000&partitions=100&autoAck=true&consumerGroup={group}&wait=true&timeout=2000"
            ))
            .await;
        if r.status == 204 {
            return out;
        }
        assert_eq!(r.status, 200);
        out.extend(r.json()["messages"].as_array().cloned().unwrap_or_default());
    }
}

/// Per partition, the transactionIds in the order they were delivered.
fn by_partition(messages: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in messages {
        out.entry(m["partition"].as_str().unwrap().to_string())
            .or_default()
            .push(m["transactionId"].as_str().unwrap().to_string());
    }
    out
}

/// Push maintenance mode: pushes are answered `buffered` and nothing reaches storage; switched
/// off, the buffer is stored in the order the pushes came, each message once, with the time it
/// was accepted. A transaction that pushes waits meanwhile (503). Enabling the mode without a
/// buffer is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_maintenance_buffers_then_stores_in_order() {
    let dir = buffer_dir("maintenance");
    let db = queen_storage_sim::SimDb::new(
        5,
        Arc::new(queen_server::wall_now),
        queen_storage_sim::SimBugs::default(),
    );
    let (_app, addr) = buffered_broker(queen_core::storage::StorageSet::of(db), &dir).await;
    let on = request(
        addr,
        "POST",
        "/api/v1/system/maintenance",
        Some(&json!({"enabled": true})),
    )
    .await;
    assert_eq!(on.status, 200);
    assert_eq!(on.json()["maintenanceMode"], true);
    let mut c = Client::connect(addr).await;
    for i in 0..30 {
        let r = c
            .post(
                "/api/v1/push",
                &json!({"items": [{"queue": "maint", "partition": format!("p{}", i % 3),
                                   "transactionId": format!("m{i}"), "payload": i}]}),
            )
            .await;
        assert_eq!(r.status, 201);
        assert_eq!(r.json()[0]["status"], "buffered");
    }
    let tx = request(
        addr,
        "POST",
        "/api/v1/transaction",
        Some(
            &json!({"operations": [{"type": "push", "items": [{"queue": "maint", "payload": 1}]}]}),
        ),
    )
    .await;
    assert_eq!(
        tx.status, 503,
        "a pushing transaction would overtake the buffer"
    );
    let state = request(addr, "GET", "/api/v1/system/maintenance", None)
        .await
        .json();
    assert_eq!(state["bufferedMessages"], 30);
    let nothing = request(addr, "GET", "/api/v1/pop/queue/maint?wait=false", None).await;
    assert_eq!(
        nothing.status, 204,
        "nothing reached storage in maintenance mode"
    );
    let switched_off = queen_server::wall_now();
    let off = request(
        addr,
        "POST",
        "/api/v1/system/maintenance",
        Some(&json!({"enabled": false})),
    )
    .await;
    assert_eq!(off.status, 200);
    let messages = read_all(addr, "maint", "g").await;
    let order = by_partition(&messages);
    for p in 0..3 {
        let want: Vec<String> = (0..30)
            .filter(|i| i % 3 == p)
            .map(|i| format!("m{i}"))
            .collect();
        assert_eq!(
            order[&format!("p{p}")],
            want,
            "partition p{p} in push order"
        );
    }
    for m in &messages {
        let created = queen_core::time::parse_iso(m["createdAt"].as_str().unwrap()).unwrap();
        assert!(
            created <= switched_off,
            "stored with the time it was accepted: {m}"
        );
    }
    let state = request(addr, "GET", "/api/v1/system/maintenance", None)
        .await
        .json();
    assert_eq!(state["bufferedMessages"], 0);
    // Without a buffer, the mode cannot be switched on.
    let plain = common::start(common::Store::Memory, ServerConfig::default()).await;
    let refused = request(
        plain.addr,
        "POST",
        "/api/v1/system/maintenance",
        Some(&json!({"enabled": true})),
    )
    .await;
    assert_eq!(refused.status, 409);
    let _ = std::fs::remove_dir_all(&dir);
}

/// PostgreSQL stopped for 3 s under a push load with a file buffer: no push fails (each is
/// stored or buffered), and once PostgreSQL is back the buffer is stored: every pushed message
/// is read exactly once, each partition in push order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_during_an_outage_are_buffered_and_stored_once_in_order() {
    let dir = buffer_dir("outage");
    let pg = Arc::new(PrivatePg::start());
    let storage = storage_on(&pg.config(), 4).await;
    let (_app, addr) =
        buffered_broker(queen_core::storage::StorageSet::of(Arc::new(storage)), &dir).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = vec![];
    for p in 0..2 {
        let stop = stop.clone();
        producers.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let (mut n, mut buffered) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .post(
                        "/api/v1/push",
                        &json!({"items": [{"queue": "outage", "partition": format!("p{p}"),
                                           "transactionId": format!("p{p}-{n}"), "payload": n}]}),
                    )
                    .await;
                assert_eq!(r.status, 201, "{:?}", String::from_utf8_lossy(&r.body));
                if r.json()[0]["status"] == "buffered" {
                    buffered += 1;
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (n, buffered)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let paused = pg.clone();
    tokio::task::spawn_blocking(move || paused.pause(3))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut pushed = vec![];
    let mut buffered = 0;
    for h in producers {
        let (n, b) = h.await.unwrap();
        pushed.push(n);
        buffered += b;
    }
    assert!(buffered > 0, "no push met the outage");
    let messages = read_all(addr, "outage", "audit").await;
    let order = by_partition(&messages);
    for (p, n) in pushed.iter().enumerate() {
        let want: Vec<String> = (0..*n).map(|i| format!("p{p}-{i}")).collect();
        assert_eq!(
            order.get(&format!("p{p}")),
            Some(&want),
            "p{p}: every push once, in order"
        );
    }
    eprintln!("pushed {pushed:?}, {buffered} buffered during the outage");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A drain cut short by a crash (pushes stored, the progress not yet recorded) starts over in a
/// new process and stores nothing twice: storing is idempotent by transactionId.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_cut_short_stores_nothing_twice() {
    let dir = buffer_dir("cut");
    let name = format!("queen_faults_drain_{}", std::process::id());
    let storage = Arc::new(queen_storage_pg::testing::fresh_database(&name, 4).await);
    // What a crashed broker left: ten buffered pushes, of which its drain stored the first four
    // before dying without recording it.
    {
        let buffer = queen_server::buffer::FileBuffer::open(&dir).expect("buffer");
        let mut groups = vec![];
        for i in 0..10u128 {
            let group = queen_core::storage::PushGroup {
                queue: "cut".into(),
                partition: "p".into(),
                frames: vec![queen_core::frames::Frame {
                    producer: None,
                    encrypted: false,
                    message_id: uuid::Uuid::from_u128(1000 + i),
                    transaction_id: format!("c{i}"),
                    trace_id: None,
                    payload: format!("{i}").into_bytes(),
                }],
                blob: None,
            };
            buffer
                .append(queen_server::wall_now(), std::slice::from_ref(&group))
                .expect("append");
            groups.push(group);
        }
        use queen_core::storage::MessageStorage;
        for g in &groups[..4] {
            storage
                .push(vec![g.clone()])
                .await
                .expect("stored by the crashed drain");
        }
    }
    let (_app, addr) =
        buffered_broker(queen_core::storage::StorageSet::of(storage.clone()), &dir).await;
    let messages = read_all(addr, "cut", "audit").await;
    let txids: Vec<String> = by_partition(&messages).remove("p").unwrap_or_default();
    let want: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    assert_eq!(txids, want, "each buffered push stored once, in order");
    let ids: Vec<&str> = messages.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids[9],
        uuid::Uuid::from_u128(1009).to_string(),
        "the message id given at push is kept"
    );
    let _ = std::fs::remove_dir_all(&dir);
    queen_storage_pg::testing::drop_database(&name).await;
}

/// Queen's real Python client runs an exactly-once pipeline on two brokers (each source message
/// handled in one transaction: a `once` marker, its ack, a push, a KV increment and a timer)
/// while PostgreSQL is stopped for 3 s and started again: every message comes out exactly once,
/// the counter is exact and every timer fires (`tests/python/pipeline.py` checks and says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_pipeline_is_exactly_once_through_a_postgres_restart() {
    use tokio::io::AsyncBufReadExt;
    let pg = Arc::new(PrivatePg::start());
    let brokers = brokers_on(&pg).await;
    let mut script = python_on_pair("pipeline.py", &brokers, "400")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python client");
    let mut lines = tokio::io::BufReader::new(script.stdout.take().unwrap()).lines();
    let mut printed = vec![];
    while let Some(line) = lines.next_line().await.unwrap() {
        let cue = line == "pipeline: pushed";
        printed.push(line);
        if cue {
            break;
        }
    }
    // The pipeline is under way: stop PostgreSQL under it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pg2 = pg.clone();
    tokio::task::spawn_blocking(move || pg2.pause(3))
        .await
        .unwrap();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(180), lines.next_line())
        .await
        .expect("the pipeline hung")
        .unwrap()
    {
        printed.push(line);
    }
    let status = script.wait().await.unwrap();
    let printed = printed.join("\n");
    eprintln!("{printed}");
    assert!(
        status.success() && printed.contains("pipeline: all checks passed"),
        "the pipeline failed:\n{printed}"
    );
}

/// The SQLSTATEs of the storage errors the broker at `addr` counted, by its metrics.
async fn storage_error_states(addr: std::net::SocketAddr) -> Vec<String> {
    storage_error_lines(addr)
        .await
        .iter()
        .filter_map(|l| {
            l.split("sqlstate=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect()
}

/// A database that refuses writes for a while (`default_transaction_read_only` set by an
/// operator, or by a managed service whose storage filled; a connection that reached a standby):
/// pushes answer 503 with Retry-After, never 500, and a broker with a file buffer keeps them
/// there; once writes are allowed again pushes store, and the buffered ones are stored too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_writes_answers_503_and_the_buffer_keeps_pushes() {
    let name = format!("queen_faults_read_only_{}", std::process::id());
    let cfg = queen_storage_pg::testing::fresh_database_config(&name).await;
    let (_plain, plain) = broker_on(&cfg, 4, 0).await;
    let storage = storage_on(&cfg, 4).await;
    let dir = buffer_dir("read-only");
    let (_buffered, buffered) =
        buffered_broker(queen_core::storage::StorageSet::of(Arc::new(storage)), &dir).await;
    let push = |n: u32| json!({"items": [{"queue": "read-only", "payload": {"n": n}}]});
    assert_eq!(
        request(plain, "POST", "/api/v1/push", Some(&push(0)))
            .await
            .status,
        201
    );

    let (admin, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("admin");
    tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await
        .expect("read-only");
    // The brokers' connections come back read-only.
    terminate_all(&cfg).await;
    for n in 1..=5 {
        push_answers_503_within(plain, &push(n), Duration::from_secs(30)).await;
    }
    assert!(
        storage_error_states(plain)
            .await
            .iter()
            .any(|s| s == "25006"),
        "the refusal itself was met, not only the cut connections"
    );
    let r = request(buffered, "POST", "/api/v1/push", Some(&push(100))).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()[0]["status"], "buffered");

    // (terminate_all cut the first admin connection too.)
    let (admin, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("admin");
    tokio::spawn(conn);
    // (One statement a call: a multi-statement call is one transaction, read-only from its start.)
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .expect("this session writable");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only"
        ))
        .await
        .expect("writable");
    terminate_all(&cfg).await;
    let mut stored = false;
    for _ in 0..60 {
        if request(plain, "POST", "/api/v1/push", Some(&push(200)))
            .await
            .status
            == 201
        {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(stored, "pushes store again once writes are allowed");
    let mut seen = vec![];
    for _ in 0..60 {
        seen.extend(
            read_all(plain, "read-only", "audit")
                .await
                .iter()
                .filter_map(|m| m["data"]["n"].as_u64()),
        );
        if seen.contains(&100) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        vec![0, 100, 200],
        "the buffered push stored, the refused ones not"
    );
}
