//! Scenario 5: partition scaling. One queue with 100 to 100,000 partitions, each holding a backlog
//! segment; queue pops with autoAck by 4 consumers, through the wildcard scan (QUEEN_HOTLIST=0)
//! and through the hot-list ring (the default), each as its own consumer group: throughput and
//! p99 per size. Pop cost must follow what is delivered, not the number of partitions, so the baseline of
//! every size is the smallest one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_core::frames::{build_blob, Frame};
use queen_core::storage::{AdminStorage, QueueConfig};
use queen_raw_client::Client;

use crate::util::{latency, payload, pg_connect, Latency};

const SEGMENT: i64 = 10;
/// Enough backlog that no size drains during a measurement: at least one segment per partition.
const BACKLOG: usize = 300_000;
const CONSUMERS: usize = 4;

/// Creates `queue` with `partitions` partitions holding 10-message segments, in bulk SQL.
pub async fn prefill(
    storage: &dyn AdminStorage,
    cfg: &tokio_postgres::Config,
    queue: &str,
    partitions: usize,
) {
    let qid = storage
        .configure_queue(QueueConfig::with_defaults(queue))
        .await
        .expect("configure")
        .queue_id;
    let frames: Vec<Frame> = (0..SEGMENT as u64)
        .map(|i| Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(u128::from(i) + 1),
            transaction_id: format!("s{i}"),
            trace_id: None,
            payload: payload(i).to_string().into_bytes(),
        })
        .collect();
    let blob = build_blob(&frames).expect("blob");
    let c = pg_connect(cfg).await;
    let qid: uuid::Uuid = qid.parse().expect("queue id");
    let segments = (BACKLOG / partitions).div_ceil(SEGMENT as usize).max(1) as i64;
    c.execute(
        "INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
         SELECT gen_random_uuid(), $1, 'p' || g, $2, date_trunc('second', now())
           FROM generate_series(1, $3::int) g
         ON CONFLICT (queue_id, name) DO NOTHING",
        &[&qid, &(segments * SEGMENT - 1), &(partitions as i32)],
    )
    .await
    .expect("partitions");
    // Planned on statistics of a table a million rows smaller, the segments' insert checked
    // each row's partition by a scan (over 10 minutes for a first size of a million).
    c.batch_execute("ANALYZE queen.log_partitions")
        .await
        .expect("analyze partitions");
    c.execute(
        "INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
         SELECT p.id, k * $2, k * $2 + $2 - 1, $5, now(), $4
           FROM queen.log_partitions p, generate_series(0::bigint, $3::bigint - 1) k
          WHERE p.queue_id = $1 AND p.name <> 'Default'",
        &[&qid, &SEGMENT, &segments, &blob, &(SEGMENT as i32)],
    )
    .await
    .expect("segments");
    c.batch_execute("ANALYZE queen.log_partitions; ANALYZE queen.log_segments")
        .await
        .expect("analyze");
}

pub struct Scaling {
    pub rate: f64,
    pub pop: Latency,
    pub first_contact_ms: f64,
    /// The median first contact of `LATER_GROUPS` more new groups, timed right after.
    pub later_contact_ms: f64,
}

/// Wildcard pops with autoAck for `secs`: messages per second and pop latency.
pub async fn run(addr: std::net::SocketAddr, queue: &str, group: &str, secs: u64) -> Scaling {
    let path =
        format!("/api/v1/pop/queue/{queue}?batch=10&wait=false&autoAck=true&consumerGroup={group}");
    crate::util::settle().await;
    // The group's first contact bulk-seeds its cursors: timed on its own.
    let t = Instant::now();
    Client::connect(addr).await.get(&path).await;
    let first_contact_ms = t.elapsed().as_secs_f64() * 1000.0;
    // What one more group costs once the queue has been read: each of these groups' first
    // contact, right after (no settle between: the queue's pages and plans are as the first
    // left them).
    let mut later_contacts_ms = vec![];
    for k in 1..=LATER_GROUPS {
        let path = format!(
            "/api/v1/pop/queue/{queue}?batch=10&wait=false&autoAck=true&consumerGroup={group}-later{k}"
        );
        let t = Instant::now();
        Client::connect(addr).await.get(&path).await;
        later_contacts_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    later_contacts_ms.sort_by(f64::total_cmp);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(vec![]));
    let start = Instant::now();
    let handles: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (stop, count, samples, path) =
                (stop.clone(), count.clone(), samples.clone(), path.clone());
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let mut mine = vec![];
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = c.get(&path).await;
                    mine.push(t.elapsed().as_micros() as u64);
                    if r.status == 200 {
                        let n = r.json()["messages"].as_array().map_or(0, Vec::len);
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                samples.lock().map(|mut s| s.extend(mine)).ok();
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        crate::util::joined(h.await);
    }
    Scaling {
        rate: count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        pop: latency(samples.lock().map(|v| v.clone()).unwrap_or_default()),
        first_contact_ms,
        later_contact_ms: later_contacts_ms[LATER_GROUPS / 2],
    }
}

/// New groups timed after the first contact (odd: the median is one of them).
const LATER_GROUPS: usize = 5;
