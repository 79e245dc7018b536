//! Differential property test: random operation sequences applied to the in-memory model and to
//! real PostgreSQL give the same observable results: delivered offsets and payloads, verdicts,
//! ack outcomes, attempt counts and the final cursor rows.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::storage::AdminStorage;
use std::sync::Arc;

use proptest::prelude::*;
use queen_core::claim::{CursorRow, SubscriptionIntent};
use queen_core::delivery::claims_to_messages;
use queen_core::frames::Frame;
use queen_core::storage::{
    AckItem, AckStatus, BatchEnd, LeaseBatchEnds, PopRequest, PopResult, PushGroup, PushOutcome,
    QueueConfig, Storage, Verdict,
};
use queen_core::{Timestamp, WorkerId};
use queen_storage_pg::{testing, PgConfig, PgStorage};
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

const PARTS: [&str; 3] = ["a", "b", "c"];
const GROUPS: [&str; 2] = ["__QUEUE_MODE__", "g"];

#[derive(Clone, Debug)]
enum Op {
    Push {
        part: usize,
        n: u32,
        dup: bool,
    },
    Pop {
        group: usize,
        shape: u8,
        part: usize,
        batch: u32,
        max: u32,
        auto_ack: bool,
    },
    Ack {
        k: u8,
        failed: bool,
        fenced: bool,
    },
    /// Several messages in one call: (which, how named: 0 no lease, 1 its lease, 2 another
    /// lease, 3 an unknown transactionId); `failed` marks one item failed (the item-by-item path),
    /// otherwise all are completed (the one-statement path of ack_v2).
    AckMany {
        items: Vec<(u8, u8)>,
        failed: Option<u8>,
    },
    /// The last leased pop's batches acked whole (ack_batch_ends_many), `stale` naming an end one
    /// short.
    AckWhole {
        stale: bool,
    },
    Advance {
        secs: i64,
    },
    Renew,
    Retention {
        part: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 1..4u32, prop::bool::weighted(0.15)).prop_map(|(part, n, dup)| Op::Push { part, n, dup }),
        4 => (0..2usize, 0..4u8, 0..3usize, 1..6u32, 1..4u32, prop::bool::weighted(0.2))
            .prop_map(|(group, shape, part, batch, max, auto_ack)| Op::Pop { group, shape, part, batch, max, auto_ack }),
        3 => (0..12u8, prop::bool::weighted(0.35), prop::bool::weighted(0.7)).prop_map(|(k, failed, fenced)| Op::Ack { k, failed, fenced }),
        2 => (
            prop::collection::vec((0..12u8, prop_oneof![1 => Just(0u8), 4 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)]), 1..7),
            prop::option::weighted(0.3, 0..7u8),
        )
            .prop_map(|(items, failed)| Op::AckMany { items, failed }),
        2 => prop::bool::weighted(0.2).prop_map(|stale| Op::AckWhole { stale }),
        // 4 s and 11 s steps never land on the 10 s lease boundary (PostgreSQL's clock also moves
        // in real time between statements).
        1 => prop_oneof![Just(4i64), Just(11)].prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Renew),
        1 => (0..3usize).prop_map(|part| Op::Retention { part }),
    ]
}

/// What a pop answered, without ids or absolute times.
#[derive(Debug, PartialEq)]
struct PopView {
    claims: Vec<(String, i64, i64, u32, bool, Vec<String>)>,
    verdicts: Vec<(String, String)>,
}

fn view(r: &PopResult) -> PopView {
    let msgs = claims_to_messages(&r.claims).expect("slice");
    let mut claims: Vec<_> = r
        .claims
        .iter()
        .map(|c| {
            let txids = msgs
                .iter()
                .filter(|m| m.partition == c.partition)
                .map(|m| m.frame.transaction_id.clone())
                .collect();
            (
                c.partition.clone(),
                c.first_offset,
                c.last_offset,
                c.attempt_count,
                c.lease_expires_at.is_some(),
                txids,
            )
        })
        .collect();
    claims.sort();
    let kind = |v: &Verdict| match v {
        Verdict::Took { count, drained, .. } => format!("took {count} drained {drained}"),
        Verdict::LeasedUntil(_) => "leased".into(),
        Verdict::DeferredUntil(_) => "deferred".into(),
        other => format!("{other:?}"),
    };
    let mut verdicts: Vec<_> = r
        .verdicts
        .iter()
        .map(|(p, v)| (p.clone(), kind(v)))
        .collect();
    verdicts.sort();
    PopView { claims, verdicts }
}

/// A leased pop's messages as acks name them. Claims come back in scan order, which is random
/// on both sides: the messages are sorted by (partition, offset).
fn leased_messages(r: &PopResult, group: &str, worker: WorkerId) -> Vec<Delivered> {
    let mut msgs = claims_to_messages(&r.claims).expect("slice");
    msgs.sort_by(|a, b| (&a.partition, a.offset).cmp(&(&b.partition, b.offset)));
    msgs.into_iter()
        .map(|m| Delivered {
            group: group.to_string(),
            partition_id: m.partition_id,
            offset: m.offset,
            transaction_id: m.frame.transaction_id,
            worker,
        })
        .collect()
}

/// Ring pops of both groups and a second pop of the first group (another worker) in one
/// `pop_list_many`: PostgreSQL runs them in one statement, the model one after another, and each
/// answers what a pop at its turn would (the second pop of a group meets the first one's lease).
async fn pop_several(side: &mut Side, req: PopRequest, part: usize, seq: u128) -> String {
    let names = |shift: usize| {
        let mut names: Vec<String> = PARTS.iter().map(|p| p.to_string()).collect();
        names.rotate_left((part + shift) % PARTS.len());
        names
    };
    let other = GROUPS
        .iter()
        .find(|g| **g != req.group)
        .expect("two groups");
    let pops = vec![
        (req.clone(), names(0)),
        (
            PopRequest {
                group: other.to_string(),
                ..req.clone()
            },
            names(1),
        ),
        (
            PopRequest {
                worker: WorkerId(uuid::Uuid::from_u128(seq + 500_000)),
                ..req
            },
            names(0),
        ),
    ];
    let answers = side.storage.pop_list_many(pops.clone()).await;
    assert_eq!(answers.len(), pops.len(), "an answer per pop");
    let mut views = vec![];
    for (i, ((req, _), answer)) in pops.iter().zip(answers).enumerate() {
        let r = answer.expect("pop");
        // The acks that follow name the first pop's lease (one lease, sorted by partition, as
        // they expect); the others' claims show in their answers and in the final cursors.
        if i == 0 && !req.auto_ack && !r.claims.is_empty() {
            side.delivered = leased_messages(&r, &req.group, req.worker);
        }
        views.push(view(&r));
    }
    format!("{views:?}")
}

/// A message the last leased pop delivered: what an ack can name.
#[derive(Clone)]
struct Delivered {
    group: String,
    partition_id: String,
    offset: i64,
    transaction_id: String,
    worker: WorkerId,
}

struct Side {
    storage: Arc<dyn Storage>,
    delivered: Vec<Delivered>,
}

async fn apply(side: &mut Side, op: &Op, seq: u128, worker: WorkerId) -> String {
    match op {
        Op::Push { part, n, dup } => apply_push(side, part, n, dup, seq).await,
        Op::Pop { .. } => apply_pop(side, op, seq, worker).await,
        Op::Ack { k, failed, fenced } => apply_ack(side, k, failed, fenced).await,
        Op::AckMany { items, failed } => apply_ack_many(side, items, failed).await,
        Op::AckWhole { stale } => apply_ack_whole(side, stale).await,
        Op::Advance { .. } | Op::Retention { .. } => String::new(),
        Op::Renew => apply_renew(side).await,
    }
}

async fn apply_push(side: &mut Side, part: &usize, n: &u32, dup: &bool, seq: u128) -> String {
    let s = side.storage.clone();
    let frames = (0..*n)
        .map(|i| Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(seq * 100 + u128::from(i)),
            transaction_id: if *dup {
                format!("dup-{i}")
            } else {
                format!("t{seq}-{i}")
            },
            trace_id: None,
            payload: format!("{{\"s\":{seq}}}").into_bytes(),
        })
        .collect();
    let out = s
        .push(vec![PushGroup {
            queue: "q".into(),
            partition: PARTS[*part].into(),
            frames,
            blob: None,
        }])
        .await
        .expect("push");
    let v: Vec<String> = out[0]
        .iter()
        .map(|o| match o {
            PushOutcome::Queued { offset, .. } => format!("queued {offset}"),
            PushOutcome::Duplicate { message_id, .. } => {
                format!("duplicate of {message_id}")
            }
            PushOutcome::Rejected { full, .. } => format!("rejected: {full}"),
        })
        .collect();
    format!("{v:?}")
}

async fn apply_pop(side: &mut Side, op: &Op, seq: u128, worker: WorkerId) -> String {
    let Op::Pop {
        group,
        shape,
        part,
        batch,
        max,
        auto_ack,
    } = op
    else {
        panic!("apply_pop applies pops only: {op:?}");
    };
    let s = side.storage.clone();
    let req = PopRequest {
        queue: "q".into(),
        group: GROUPS[*group].into(),
        worker,
        batch: *batch,
        max_partitions: *max,
        auto_ack: *auto_ack,
        lease_seconds: Some(10),
        intent: SubscriptionIntent::default(),
        skip_window_debounce: false,
        conflation: false,
    };
    if *shape == 3 {
        return pop_several(side, req, *part, seq).await;
    }
    let r = match shape {
        0 => s.pop_partition(req, PARTS[*part].into()).await,
        1 => {
            let mut names: Vec<String> = PARTS.iter().map(|p| p.to_string()).collect();
            names.rotate_left(*part);
            s.pop_list(req, names).await
        }
        // Everything claimable, so the scan's random order cannot change the answer.
        _ => {
            s.pop_wildcard(PopRequest {
                batch: 1000,
                max_partitions: 3,
                ..req
            })
            .await
        }
    }
    .expect("pop");
    if !*auto_ack && !r.claims.is_empty() {
        side.delivered = leased_messages(&r, GROUPS[*group], worker);
    }
    format!("{:?}", view(&r))
}

async fn apply_ack(side: &mut Side, k: &u8, failed: &bool, fenced: &bool) -> String {
    let s = side.storage.clone();
    if side.delivered.is_empty() {
        return "nothing delivered".into();
    }
    let d = side.delivered[usize::from(*k) % side.delivered.len()].clone();
    let out = s
        .ack(
            &d.group,
            vec![AckItem {
                transaction_id: d.transaction_id,
                partition_id: d.partition_id,
                status: if *failed {
                    AckStatus::Failed
                } else {
                    AckStatus::Completed
                },
                lease_id: fenced.then(|| d.worker.to_string()),
                error: None,
            }],
        )
        .await
        .expect("ack");
    format!(
        "{:?}",
        out.iter()
            .map(|o| (o.success, o.error.clone(), o.lease_released, o.dlq))
            .collect::<Vec<_>>()
    )
}

async fn apply_ack_many(side: &mut Side, items: &[(u8, u8)], failed: &Option<u8>) -> String {
    let s = side.storage.clone();
    if side.delivered.is_empty() {
        return "nothing delivered".into();
    }
    let group = side.delivered[0].group.clone();
    let acks = items
        .iter()
        .enumerate()
        .map(|(i, (k, naming))| {
            let d = side.delivered[usize::from(*k) % side.delivered.len()].clone();
            AckItem {
                transaction_id: if *naming == 3 {
                    "never-pushed".into()
                } else {
                    d.transaction_id
                },
                partition_id: d.partition_id,
                status: if failed.is_some_and(|f| usize::from(f) % items.len() == i) {
                    AckStatus::Failed
                } else {
                    AckStatus::Completed
                },
                lease_id: match naming {
                    0 => None,
                    2 => Some(uuid::Uuid::from_u128(7).to_string()),
                    _ => Some(d.worker.to_string()),
                },
                error: None,
            }
        })
        .collect();
    let out = s.ack(&group, acks).await.expect("ack");
    format!(
        "{:?}",
        out.iter()
            .map(|o| (o.success, o.error.clone(), o.lease_released, o.dlq))
            .collect::<Vec<_>>()
    )
}

async fn apply_ack_whole(side: &mut Side, stale: &bool) -> String {
    let s = side.storage.clone();
    let Some(first) = side.delivered.first().cloned() else {
        return "nothing delivered".into();
    };
    // Delivered is sorted by (partition, offset): each partition's run is one batch.
    let mut ends: Vec<BatchEnd> = vec![];
    for d in &side.delivered {
        match ends.last_mut() {
            Some(b) if b.partition_id == d.partition_id => b.end_offset = d.offset,
            _ => ends.push(BatchEnd {
                partition_id: d.partition_id.clone(),
                end_offset: d.offset,
                first_transaction_id: d.transaction_id.clone(),
            }),
        }
    }
    if *stale {
        for b in &mut ends {
            b.end_offset -= 1;
        }
    }
    // In one call, as the broker's ack rounds send them: the lease's batches split in
    // two, and between them the same batches named under the other group (whose
    // cursors this lease never held: nothing of it commits).
    let other = GROUPS
        .iter()
        .find(|g| **g != first.group)
        .expect("two groups");
    let (head, tail) = ends.split_at(ends.len() / 2);
    let lease = |group: &str, batches: &[BatchEnd]| LeaseBatchEnds {
        group: group.to_string(),
        lease: first.worker,
        batches: batches.to_vec(),
    };
    let leases = [
        lease(&first.group, head),
        lease(other, &ends),
        lease(&first.group, tail),
    ];
    let committed = s
        .ack_batch_ends_many(&leases)
        .await
        .expect("ack whole batches");
    // Partition ids differ between the sides: count what each lease committed.
    let counts: Vec<(usize, usize)> = committed
        .iter()
        .zip(&leases)
        .map(|(c, l)| (c.len(), l.batches.len()))
        .collect();
    format!("committed (of) per lease {counts:?}")
}

async fn apply_renew(side: &mut Side) -> String {
    let s = side.storage.clone();
    let Some(w) = side.delivered.first().map(|d| d.worker) else {
        return "nothing delivered".into();
    };
    let r = s.renew_lease(&w.to_string(), 60).await.expect("renew");
    format!("renewed {}", r.renewed)
}

/// (committed, leased, batch_end, attempt_count, attempt_offset, retry_offset, retry_count)
type CursorView = (i64, bool, Option<i64>, u32, Option<i64>, Option<i64>, u32);

fn cursor_view(c: Option<CursorRow>) -> Option<CursorView> {
    c.map(|c| {
        (
            c.committed,
            c.worker_id.is_some(),
            c.batch_end,
            c.attempt_count,
            c.attempt_offset,
            c.retry_offset,
            c.retry_count,
        )
    })
}

/// The queue options of one case. ttl 25 s and retryDelay 2.5 s are never reached exactly by sums
/// of the 4 s and 11 s clock steps (PostgreSQL's clock also moves in real time).
#[derive(Clone, Debug)]
struct Options {
    delay: u32,
    retry_delay_ms: u32,
    ttl_secs: u32,
    max_size: u32,
    dead_letter_queue: bool,
    dlq_after_max_retries: bool,
}

fn options() -> impl Strategy<Value = Options> {
    (
        prop_oneof![Just(0u32), Just(2u32)],
        prop_oneof![Just(0u32), Just(2500u32)],
        prop_oneof![2 => Just(0u32), 1 => Just(25u32)],
        prop_oneof![2 => Just(0u32), 1 => Just(6u32)],
        prop::bool::weighted(0.75),
        prop::bool::weighted(0.75),
    )
        .prop_map(
            |(
                delay,
                retry_delay_ms,
                ttl_secs,
                max_size,
                dead_letter_queue,
                dlq_after_max_retries,
            )| {
                Options {
                    delay,
                    retry_delay_ms,
                    ttl_secs,
                    max_size,
                    dead_letter_queue,
                    dlq_after_max_retries,
                }
            },
        )
}

async fn run(ops: Vec<Op>, opts: Options, case: usize) -> Result<(), TestCaseError> {
    let delay = opts.delay;
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let model = SimDb::new(3, clock.as_sim_clock(), SimBugs::default());
    let name = format!("queen_diff_{}_{case}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    let pg = PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg,
        pool_size: 2,
    })
    .await
    .expect("pg");
    let config = QueueConfig {
        delayed_processing_secs: delay,
        retry_limit: 1,
        retry_delay_ms: opts.retry_delay_ms,
        ttl_secs: opts.ttl_secs,
        max_size: opts.max_size,
        dead_letter_queue: opts.dead_letter_queue,
        dlq_after_max_retries: opts.dlq_after_max_retries,
        ..QueueConfig::with_defaults("q")
    };
    model
        .configure_queue(config.clone())
        .await
        .expect("configure model");
    pg.configure_queue(config).await.expect("configure pg");
    let mut a = Side {
        storage: model.clone(),
        delivered: vec![],
    };
    let mut b = Side {
        storage: Arc::new(pg.clone()),
        delivered: vec![],
    };
    let mut trace: Vec<String> = vec![];
    for (i, op) in ops.iter().enumerate() {
        let worker = WorkerId(uuid::Uuid::from_u128(i as u128 + 1000));
        match op {
            Op::Advance { secs } => {
                clock.advance_millis(secs * 1000);
                pg.advance_clock(*secs).await.expect("advance");
            }
            Op::Retention { part } => {
                // Safe retention: only segments every group has consumed.
                let floor = |c: Option<CursorRow>| c.map_or(-1, |c| c.committed);
                let mut m = i64::MAX;
                for g in GROUPS {
                    m = m.min(floor(model.cursor("q", PARTS[*part], g)));
                }
                model
                    .drop_segments("q", PARTS[*part], m + 1)
                    .expect("model retention");
                pg.drop_segments("q", PARTS[*part], m + 1)
                    .await
                    .expect("pg retention");
            }
            _ => {}
        }
        let x = apply(&mut a, op, i as u128 + 1, worker).await;
        let y = apply(&mut b, op, i as u128 + 1, worker).await;
        trace.push(format!("step {i} {op:?}\n  model: {x}\n  pg:    {y}"));
        for p in PARTS {
            for g in GROUPS {
                let m = cursor_view(model.cursor("q", p, g));
                let q = cursor_view(pg.cursor("q", p, g).await.expect("pg cursor"));
                if m.is_some() || q.is_some() {
                    trace.push(format!("    cursor ({p},{g}) model {m:?} pg {q:?}"));
                }
            }
        }
        if x != y {
            return Err(TestCaseError::fail(format!(
                "step {i}: model and PostgreSQL differ ({opts:?}); trace:\n{}",
                trace.join("\n")
            )));
        }
    }
    for p in PARTS {
        for g in GROUPS {
            let m = cursor_view(model.cursor("q", p, g));
            let q = cursor_view(pg.cursor("q", p, g).await.expect("pg cursor"));
            if m != q {
                return Err(TestCaseError::fail(format!(
                    "cursor ({p}, {g}) differs: model {m:?} pg {q:?}; trace:\n{}",
                    trace.join("\n")
                )));
            }
        }
    }
    testing::drop_database(&name).await;
    Ok(())
}

fn cases() -> u32 {
    std::env::var("DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48)
}

#[test]
fn model_and_postgres_agree() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    });
    let result = runner.run(
        &(prop::collection::vec(op(), 1..40), options()),
        |(ops, opts)| {
            let case = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(run(ops, opts, case))
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A case the property above found: a call of completed acks only, listed above offset order,
/// the lower one naming another lease. Both backends answer it in the call's order (ack_v3's
/// set-based form), a nack's offset order being for calls that hold one.
#[test]
fn completed_acks_alone_apply_in_the_call_s_order_on_both() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let push = || Op::Push {
        part: 0,
        n: 1,
        dup: false,
    };
    let ops = vec![
        push(),
        push(),
        push(),
        Op::Pop {
            group: 0,
            shape: 0,
            part: 0,
            batch: 3,
            max: 1,
            auto_ack: false,
        },
        Op::AckMany {
            items: vec![(1, 0), (0, 2)],
            failed: None,
        },
    ];
    let opts = Options {
        delay: 0,
        retry_delay_ms: 0,
        ttl_secs: 0,
        max_size: 0,
        dead_letter_queue: false,
        dlq_after_max_retries: false,
    };
    if let Err(e) = rt.block_on(run(ops, opts, 9_000)) {
        panic!("{e}");
    }
}
