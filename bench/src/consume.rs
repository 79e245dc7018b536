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

use crate::util::{payload, pg_connect, Endpoint, Row};

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

/// Acks a whole batch in one request; anything but 200 ends the run.
async fn ack_batch(c: &mut queen_raw_client::Client, acks: &[Ack<'_>]) {
    #[derive(Serialize)]
    struct Body<'a> {
        acknowledgments: &'a [Ack<'a>],
    }
    let body = serde_json::to_vec(&Body {
        acknowledgments: acks,
    })
    .expect("ack body");
    let a = c
        .post_bytes("/api/v1/ack/batch", "application/json", &body)
        .await;
    assert_eq!(a.status, 200);
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

/// `consumers` HTTP consumers drain the `total` messages of the queue: messages/s.
pub(crate) async fn broker_drain(
    broker: &Endpoint,
    queue: &str,
    consumers: usize,
    mode: Consume,
    total: u64,
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
    let path = format!("/api/v1/pop/queue/{queue}?batch=100&{wait}&autoAck={auto_ack}{framed}");
    let handles: Vec<_> = (0..consumers)
        .map(|_| {
            let (done, path, broker) = (done.clone(), path.clone(), broker.clone());
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
                        ack_batch(&mut c, &acks).await;
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
                            ack_batch(&mut c, &acks).await;
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

/// `consumers` claim loops drain the `total` messages of `partitions`: messages/s.
pub(crate) async fn claim_drain(
    cfg: &tokio_postgres::Config,
    partitions: usize,
    consumers: usize,
    total: u64,
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
                        let take = (end - base + 1 - start_idx).min(100 - taken);
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
