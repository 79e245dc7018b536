//! Scenario 2: consume throughput on a pre-filled backlog (pop batch 100, then a batch ack unless
//! autoAck) against (c) a raw claim loop over segments holding the same backlog.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_core::frames::{build_blob, slice_blob, Frame};
use queen_core::storage::PushGroup;
use queen_server::broker::Broker;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::util::{payload, pg_connect, Endpoint, PgWork, Row};

fn frames(i: &mut u64, n: usize) -> Vec<Frame> {
    (0..n)
        .map(|_| {
            *i += 1;
            Frame {
                producer: None,
                encrypted: false,
                message_id: uuid::Uuid::from_u128(u128::from(*i)),
                transaction_id: format!("c{i}"),
                trace_id: None,
                payload: payload(*i).to_string().into_bytes(),
            }
        })
        .collect()
}

/// Segments per partition of at most 100 messages, as batch-100 pushes store them.
fn segment_sizes(per_partition: usize) -> Vec<usize> {
    let mut left = per_partition;
    let mut out = vec![];
    while left > 0 {
        out.push(left.min(100));
        left -= left.min(100);
    }
    out
}

/// How the bench's consumers take and settle their batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Consume {
    /// JSON answers, each batch acked whole.
    Leased,
    /// Framed (`QPF1`) answers, each batch acked whole by partition number.
    LeasedFramed,
    /// JSON answers committed at delivery.
    AutoAck,
    /// As `Leased`, but each pop long-polls (wait=true, 200 ms) instead of answering 204 at once:
    /// how many concurrent consumers run (a consumer with nothing to take parks on the broker).
    LeasedLongPoll,
}

/// A JSON pop answer as a typed client reads it: the fields an ack needs, each payload checked
/// as JSON and kept raw. (Parsing every answer into a `serde_json::Value` tree was a fifth of the
/// machine's CPU, taken from the broker and PostgreSQL it shares two cores with.)
#[derive(Deserialize)]
struct PopAnswer<'a> {
    #[serde(borrow)]
    messages: Vec<PoppedMessage<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PoppedMessage<'a> {
    #[serde(borrow)]
    transaction_id: Cow<'a, str>,
    #[serde(borrow)]
    partition_id: Cow<'a, str>,
    #[serde(borrow)]
    lease_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    #[allow(dead_code, reason = "parsed as a client parses it, not read")]
    data: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ack<'a> {
    transaction_id: Cow<'a, str>,
    partition_id: Cow<'a, str>,
    lease_id: Option<Cow<'a, str>>,
}

/// Acks a whole batch in one request (for `group`, else in queue mode); anything but 200, or an
/// ack the broker refused, ends the run (a refused ack leaves its lease held, and the run would
/// measure lease expiries).
async fn ack_batch(c: &mut queen_raw_client::Client, acks: &[Ack<'_>], group: Option<&str>) {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        acknowledgments: &'a [Ack<'a>],
        #[serde(skip_serializing_if = "Option::is_none")]
        consumer_group: Option<&'a str>,
    }
    #[derive(Deserialize)]
    struct Answer {
        success: bool,
    }
    let body = serde_json::to_vec(&Body {
        acknowledgments: acks,
        consumer_group: group,
    })
    .expect("ack body");
    let a = c
        .post_bytes("/api/v1/ack/batch", "application/json", &body)
        .await;
    assert_eq!(a.status, 200);
    let answers: Vec<Answer> = serde_json::from_slice(&a.body).expect("ack answer");
    assert!(
        answers.iter().all(|a| a.success),
        "an ack was refused: {}",
        String::from_utf8_lossy(&a.body)
    );
}

/// The broker: `consumers` HTTP consumers drain `total` messages spread over `partitions`.
pub(crate) async fn broker_rate(
    app: &Arc<Broker>,
    broker: &Endpoint,
    queue: &str,
    partitions: usize,
    consumers: usize,
    mode: Consume,
    total: usize,
) -> f64 {
    let total = broker_fill(app, queue, partitions, total).await;
    broker_drain(broker, queue, consumers, mode, total).await
}

/// The broker's backlog: `total` messages over `partitions`, pushed through storage in segments.
/// How many were pushed.
pub(crate) async fn broker_fill(
    app: &Arc<Broker>,
    queue: &str,
    partitions: usize,
    total: usize,
) -> u64 {
    let per_partition = total / partitions;
    let mut i = 0u64;
    for p in 0..partitions {
        for n in segment_sizes(per_partition) {
            app.storage
                .messages
                .push(vec![PushGroup {
                    queue: queue.into(),
                    partition: format!("p{p}"),
                    frames: frames(&mut i, n),
                    blob: None,
                }])
                .await
                .expect("prefill");
        }
    }
    (per_partition * partitions) as u64
}

/// `consumers` HTTP consumers drain the `total` messages of the queue, 100 per pop, in queue
/// mode: messages/s.
pub(crate) async fn broker_drain(
    broker: &Endpoint,
    queue: &str,
    consumers: usize,
    mode: Consume,
    total: u64,
) -> f64 {
    broker_drain_shaped(broker, queue, consumers, mode, total, &Take::BATCH_100).await
}

/// How each pop of a drain takes: its batch, and the consumer group it pops for (queue mode
/// without one).
pub(crate) struct Take<'a> {
    pub batch: usize,
    pub group: Option<&'a str>,
}

impl Take<'_> {
    pub const BATCH_100: Take<'static> = Take {
        batch: 100,
        group: None,
    };
}

/// `consumers` HTTP consumers drain the `total` messages of the queue, each pop as `take` says:
/// messages/s.
pub(crate) async fn broker_drain_shaped(
    broker: &Endpoint,
    queue: &str,
    consumers: usize,
    mode: Consume,
    total: u64,
    take: &Take<'_>,
) -> f64 {
    let auto_ack = mode == Consume::AutoAck;
    let framed = if mode == Consume::LeasedFramed {
        "&frames=true"
    } else {
        ""
    };
    crate::util::settle().await;
    // Marks the measured window apart from the prefill (for a profiler watching stderr).
    eprintln!("measuring {queue}");
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let long_poll = mode == Consume::LeasedLongPoll;
    let wait = if long_poll {
        "wait=true&timeout=200"
    } else {
        "wait=false"
    };
    let group: Option<Arc<str>> = take.group.map(Arc::from);
    let group_param = group
        .as_deref()
        .map(|g| format!("&consumerGroup={g}"))
        .unwrap_or_default();
    let batch = take.batch;
    let path = format!(
        "/api/v1/pop/queue/{queue}?batch={batch}&{wait}&autoAck={auto_ack}{framed}{group_param}"
    );
    let handles: Vec<_> = (0..consumers)
        .map(|_| {
            let (done, path, broker, group) =
                (done.clone(), path.clone(), broker.clone(), group.clone());
            tokio::spawn(async move {
                let mut c = broker.client().await;
                let mut empty = 0;
                while done.load(Ordering::Relaxed) < total && empty < 200 {
                    let r = c.get(&path).await;
                    // 200 empty answers in a row end this consumer: the backlog is drained. An
                    // empty answer amid the backlog is normal (another pop of this broker holds
                    // every ready partition of its ring while its call is in flight).
                    if r.status == 204 {
                        empty += 1;
                        if !long_poll {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        continue;
                    }
                    empty = 0;
                    let count = if mode == Consume::LeasedFramed {
                        let f = queen_raw_client::wire::read_pop_frames(&r.body);
                        let lease = f.lease_id.as_str();
                        let acks: Vec<Ack> = f
                            .claims
                            .iter()
                            .flat_map(|claim| {
                                let number = claim.partition_id.to_string();
                                claim.messages.iter().map(move |m| Ack {
                                    transaction_id: m.transaction_id.as_str().into(),
                                    partition_id: number.clone().into(),
                                    lease_id: Some(lease.into()),
                                })
                            })
                            .collect();
                        ack_batch(&mut c, &acks, group.as_deref()).await;
                        acks.len()
                    } else {
                        let answer: PopAnswer =
                            serde_json::from_slice(&r.body).expect("pop answer");
                        if !auto_ack {
                            let acks: Vec<Ack> = answer
                                .messages
                                .iter()
                                .map(|m| Ack {
                                    transaction_id: m.transaction_id.clone(),
                                    partition_id: m.partition_id.clone(),
                                    lease_id: m.lease_id.clone(),
                                })
                                .collect();
                            ack_batch(&mut c, &acks, group.as_deref()).await;
                        }
                        answer.messages.len()
                    };
                    done.fetch_add(count as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        crate::util::joined(h.await);
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// (c): claim a cursor row (SKIP LOCKED), read up to 100 messages of segments, advance, commit.
pub(crate) async fn claim_loop_rate(
    cfg: &tokio_postgres::Config,
    partitions: usize,
    consumers: usize,
    total: usize,
) -> f64 {
    let total = claim_fill(cfg, partitions, total).await;
    claim_drain(cfg, partitions, consumers, total).await
}

/// The claim loop's backlog, segments inserted directly. How many messages.
pub(crate) async fn claim_fill(
    cfg: &tokio_postgres::Config,
    partitions: usize,
    total: usize,
) -> u64 {
    let per_partition = total / partitions;
    let c = pg_connect(cfg).await;
    c.batch_execute("TRUNCATE bench.segments; UPDATE bench.parts SET last_offset = -1; UPDATE bench.cursors SET committed = -1")
        .await
        .expect("reset");
    let mut i = 0u64;
    for p in 0..partitions as i32 {
        let mut last = -1i64;
        for n in segment_sizes(per_partition) {
            let blob = build_blob(&frames(&mut i, n)).expect("blob");
            c.execute(
                "INSERT INTO bench.segments (pid, base_offset, end_offset, blob) VALUES ($1, $2, $3, $4)",
                &[&p, &(last + 1), &(last + n as i64), &blob],
            )
            .await
            .expect("prefill");
            last += n as i64;
        }
    }
    (per_partition * partitions) as u64
}

/// `consumers` claim loops drain the `total` messages of `partitions`, up to 100 per claim:
/// messages/s.
pub(crate) async fn claim_drain(
    cfg: &tokio_postgres::Config,
    partitions: usize,
    consumers: usize,
    total: u64,
) -> f64 {
    claim_drain_batch(cfg, partitions, consumers, total, 100).await
}

/// `consumers` claim loops drain the `total` messages of `partitions`, up to `batch` per
/// claim (one transaction: claim the cursor, read, advance, commit): messages/s.
pub(crate) async fn claim_drain_batch(
    cfg: &tokio_postgres::Config,
    partitions: usize,
    consumers: usize,
    total: u64,
    batch: i64,
) -> f64 {
    crate::util::settle().await;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..consumers)
        .map(|t| {
            let done = done.clone();
            let cfg = cfg.clone();
            tokio::spawn(async move {
                let mut c = pg_connect(&cfg).await;
                let mut k = t * 7919;
                let mut idle = 0;
                while done.load(Ordering::Relaxed) < total && idle < partitions * 3 {
                    k += 1;
                    let p = (k % partitions) as i32;
                    let tx = c.transaction().await.expect("begin");
                    let Some(row) = tx.query_opt("SELECT committed FROM bench.cursors WHERE pid = $1 FOR UPDATE SKIP LOCKED", &[&p]).await.expect("claim") else {
                        tx.commit().await.expect("commit");
                        idle += 1;
                        continue;
                    };
                    let committed: i64 = row.get(0);
                    let segs = tx
                        .query("SELECT base_offset, end_offset, blob FROM bench.segments WHERE pid = $1 AND end_offset > $2 ORDER BY base_offset LIMIT 2", &[&p, &committed])
                        .await
                        .expect("read");
                    let mut taken = 0i64;
                    for s in &segs {
                        let (base, end, blob): (i64, i64, Vec<u8>) = (s.get(0), s.get(1), s.get(2));
                        let start_idx = (committed + 1 + taken - base).max(0);
                        let take = (end - base + 1 - start_idx).min(batch - taken);
                        if take <= 0 {
                            break;
                        }
                        let frames = slice_blob(&blob, start_idx as usize, take as usize, (end - base + 1) as usize).expect("slice");
                        taken += frames.len() as i64;
                    }
                    if taken == 0 {
                        tx.commit().await.expect("commit");
                        idle += 1;
                        continue;
                    }
                    idle = 0;
                    tx.execute("UPDATE bench.cursors SET committed = committed + $2 WHERE pid = $1", &[&p, &taken]).await.expect("advance");
                    tx.commit().await.expect("commit");
                    done.fetch_add(taken as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        crate::util::joined(h.await);
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Leased and autoAck broker runs against one claim-loop baseline, per (partitions, consumers).
pub async fn consume_scenario(
    app: &Arc<Broker>,
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    partitions: usize,
    consumers: usize,
    total: usize,
) -> Vec<Row> {
    let broker = Endpoint::open(addr);
    let mut rates = vec![];
    for (mode, tag) in [
        (Consume::Leased, "leased"),
        (Consume::LeasedFramed, "framed"),
        (Consume::AutoAck, "auto"),
    ] {
        let queue = format!("consume-{partitions}-{consumers}-{tag}");
        let rate = broker_rate(app, &broker, &queue, partitions, consumers, mode, total).await;
        rates.push(rate);
    }
    let (leased, framed, auto) = (rates[0], rates[1], rates[2]);
    let claim = claim_loop_rate(cfg, partitions, consumers, total).await;
    let label = |mode: &str| {
        format!("consume {mode}, batch 100, {partitions} partitions, {consumers} consumers")
    };
    vec![
        Row::new(label("leased"), "msg/s", leased, "(c) claim loop", claim),
        Row::new(
            label("leased framed"),
            "msg/s",
            framed,
            "(c) claim loop",
            claim,
        ),
        Row::new(label("autoAck"), "msg/s", auto, "(c) claim loop", claim),
    ]
}

/// One message at a time: 8 consumers pop one message and ack it, on 10 and 1,000 partitions,
/// in queue mode and for a consumer group, against the claim loop claiming one message per
/// transaction; with each run's statements and PostgreSQL execution time per message
/// (`pg_stat_statements`). `total` messages per run.
pub async fn consume_one_at_a_time(
    app: &Arc<Broker>,
    addr: std::net::SocketAddr,
    cfg: &tokio_postgres::Config,
    total: usize,
    label: &str,
) -> Vec<Row> {
    let consumers = 8;
    let broker = Endpoint::open(addr);
    let marks = pg_connect(cfg).await;
    let mut rows = vec![];
    for partitions in [10, 1000] {
        let filled = claim_fill(cfg, partitions, total).await;
        let before = PgWork::mark(&marks).await;
        let claim = claim_drain_batch(cfg, partitions, consumers, filled, 1).await;
        let claim_work = PgWork::per_op(before, PgWork::mark(&marks).await, filled as f64);
        for (group, tag) in [(None, "queue mode"), (Some("bench-g"), "consumer group")] {
            let queue = format!(
                "{}-one-{partitions}-{}",
                label.replace(' ', "-"),
                group.is_some()
            );
            let filled = broker_fill(app, &queue, partitions, total).await;
            let take = Take { batch: 1, group };
            let before = PgWork::mark(&marks).await;
            let rate =
                broker_drain_shaped(&broker, &queue, consumers, Consume::Leased, filled, &take)
                    .await;
            let work = PgWork::per_op(before, PgWork::mark(&marks).await, filled as f64);
            let scenario = format!(
                "{label} leased, batch 1, {tag}, {partitions} partitions, {consumers} consumers"
            );
            let baseline = "(c) claim loop, batch 1";
            rows.push(Row::new(scenario.clone(), "msg/s", rate, baseline, claim));
            if let (Some(w), Some(c)) = (work, claim_work) {
                rows.push(Row::new(
                    scenario.clone(),
                    "PG statements per msg",
                    w.0,
                    baseline,
                    c.0,
                ));
                rows.push(Row::new(scenario, "PG exec us per msg", w.1, baseline, c.1));
            }
        }
        eprintln!("measured {label} at batch 1, {partitions} partitions");
    }
    rows
}
