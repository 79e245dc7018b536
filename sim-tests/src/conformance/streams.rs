//! Conformance cases of the streams surface: registration by config hash, state reads, and the
//! cycle's all-or-nothing commit fenced on the source lease.

use serde_json::json;

use queen_core::storage::{AckStatus, Storage, TxOp, TxOpResult};
use queen_core::streams::{
    QueryRegistration, Registration, StateOp, StateQuery, StreamCycleOp, StreamRefusal,
};

use super::{ack, e, push, Backend, CaseResult};
use crate::fixtures::{group, pop_req, Ids};

fn registration(name: &str, source: &str, hash: &str, reset: bool) -> QueryRegistration {
    QueryRegistration {
        name: name.into(),
        source_queue: source.into(),
        sink_queue: None,
        config_hash: hash.into(),
        reset,
    }
}

async fn register(
    s: &dyn Storage,
    ids: &mut Ids,
    req: QueryRegistration,
) -> Result<Registration, String> {
    s.register_stream_query(&req, ids.worker().0)
        .await
        .map_err(e)
}

async fn query_id(
    s: &dyn Storage,
    ids: &mut Ids,
    name: &str,
    source: &str,
) -> Result<uuid::Uuid, String> {
    match register(s, ids, registration(name, source, "h", false)).await? {
        Registration::Registered { query_id, .. } => Ok(query_id),
        other => Err(format!("registration: {other:?}")),
    }
}

fn all_rows(query_id: uuid::Uuid, partition_id: &str) -> StateQuery {
    StateQuery {
        query_id,
        partition_id: partition_id.into(),
        keys: vec![],
        key_prefix: None,
        ripe_at_or_before: None,
    }
}

/// (key, value) of every row of the shard.
async fn rows(
    s: &dyn Storage,
    query_id: uuid::Uuid,
    partition_id: &str,
) -> Result<Vec<(String, serde_json::Value)>, String> {
    let rows = s
        .stream_state(&all_rows(query_id, partition_id))
        .await
        .map_err(e)?
        .ok_or("unknown query")?;
    Ok(rows.into_iter().map(|r| (r.key, r.value)).collect())
}

fn upsert(key: &str, value: serde_json::Value) -> StateOp {
    StateOp::Upsert {
        key: key.into(),
        value,
    }
}

/// A name is registered once; the same hash finds it, another is refused unless `reset`,
/// which drops the query's state and keeps its id.
pub async fn stream_queries_register_by_hash(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(70);
    let first = register(&*s, &mut ids, registration("q1", "src", "h1", false)).await?;
    let Registration::Registered {
        query_id,
        fresh: true,
        reset: false,
    } = first
    else {
        return Err(format!("first registration: {first:?}"));
    };
    ensure_eq!(
        register(&*s, &mut ids, registration("q1", "src", "h1", true)).await?,
        Registration::Registered {
            query_id,
            fresh: false,
            reset: false
        },
        "the same hash finds the query and never resets it"
    );
    ensure_eq!(
        register(&*s, &mut ids, registration("q1", "src", "h2", false)).await?,
        Registration::HashMismatch {
            stored_hash: "h1".into()
        },
        "another hash without reset"
    );
    // A flush cycle (no lease) writes state on a partition of the source queue. The pop that
    // finds the partition's id reads as another group, so no lease of "g" is live.
    push(&*s, &mut ids, "src", "p", "t", 0..1).await?;
    let (_, pid) = lease_p(&*s, &mut ids, "src", "peek", 10).await?;
    let flush = TxOp::Stream(StreamCycleOp {
        query_id,
        partition_id: pid.clone(),
        group: "g".into(),
        lease_id: None,
        ops: vec![upsert("k", json!(1))],
    });
    ensure!(
        s.transaction(vec![flush]).await.map_err(e)?.committed,
        "flush"
    );
    ensure_eq!(rows(&*s, query_id, &pid).await?.len(), 1, "a row");
    ensure_eq!(
        register(&*s, &mut ids, registration("q1", "src", "h2", true)).await?,
        Registration::Registered {
            query_id,
            fresh: false,
            reset: true
        },
        "reset keeps the id"
    );
    ensure_eq!(
        rows(&*s, query_id, &pid).await?,
        vec![],
        "reset dropped the state"
    );
    ensure_eq!(
        register(&*s, &mut ids, registration("q1", "src", "h2", false)).await?,
        Registration::Registered {
            query_id,
            fresh: false,
            reset: false
        },
        "the new hash is the stored one"
    );
    Ok(())
}

/// State reads select by keys, by prefix and by closed windows; the last op on a key wins.
pub async fn stream_state_reads_select(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(71);
    let qid = query_id(&*s, &mut ids, "reads", "rsrc").await?;
    push(&*s, &mut ids, "rsrc", "p", "t", 0..1).await?;
    let r = s
        .pop_partition(pop_req("rsrc", "peek", ids.worker(), 10), "p".into())
        .await
        .map_err(e)?;
    let pid = r.claims[0].partition_id.clone();
    let ops = vec![
        upsert("tumb:1\u{1f}a", json!({"acc": 1, "windowEnd": 1000})),
        upsert("tumb:1\u{1f}b", json!({"acc": 2, "windowEnd": 2000})),
        upsert("gate\u{1f}x", json!({"tokens": 3})),
        upsert("gone", json!(0)),
        StateOp::Delete { key: "gone".into() },
        upsert("tumb:1\u{1f}a", json!({"acc": 5, "windowEnd": 1000})),
    ];
    let cycle = TxOp::Stream(StreamCycleOp {
        query_id: qid,
        partition_id: pid.clone(),
        group: "g".into(),
        lease_id: None,
        ops,
    });
    let out = s.transaction(vec![cycle]).await.map_err(e)?;
    ensure_eq!(
        out.results,
        vec![TxOpResult::Stream(Ok(6))],
        "six ops applied"
    );
    let read = |keys: Vec<&str>, prefix: Option<&str>, ripe: Option<i64>| StateQuery {
        keys: keys.into_iter().map(str::to_string).collect(),
        key_prefix: prefix.map(str::to_string),
        ripe_at_or_before: ripe,
        ..all_rows(qid, &pid)
    };
    let keys = |q: StateQuery| {
        let s = s.clone();
        async move {
            let rows = s
                .stream_state(&q)
                .await
                .map_err(e)?
                .ok_or("unknown query")?;
            Ok::<_, String>(rows.into_iter().map(|r| r.key).collect::<Vec<_>>())
        }
    };
    ensure_eq!(
        keys(read(vec![], None, None)).await?,
        vec!["gate\u{1f}x", "tumb:1\u{1f}a", "tumb:1\u{1f}b"],
        "every row, by key; the deleted key is gone"
    );
    ensure_eq!(
        rows(&*s, qid, &pid).await?[1].1,
        json!({"acc": 5, "windowEnd": 1000}),
        "the last upsert of a key wins"
    );
    ensure_eq!(
        keys(read(vec!["gate\u{1f}x", "nope"], None, None)).await?,
        vec!["gate\u{1f}x"],
        "named keys; a missing one is absent"
    );
    ensure_eq!(
        keys(read(vec![], Some("tumb:1\u{1f}"), Some(1500))).await?,
        vec!["tumb:1\u{1f}a"],
        "one operator's closed windows"
    );
    ensure_eq!(
        keys(read(vec![], None, Some(5000))).await?,
        vec!["tumb:1\u{1f}a", "tumb:1\u{1f}b"],
        "a row without a windowEnd is never ripe"
    );
    ensure_eq!(
        rows(&*s, qid, "00000000-0000-0000-0000-000000000000").await?,
        vec![],
        "another shard is empty"
    );
    ensure!(
        s.stream_state(&all_rows(ids.worker().0, &pid))
            .await
            .map_err(e)?
            .is_none(),
        "an unknown query reads as unknown"
    );
    Ok(())
}

/// A cycle's state, sink pushes and ack commit together or not at all; it is fenced on the
/// source lease as a whole (a lease released, expired or re-claimed commits nothing, even for
/// messages already committed), and refuses an unknown query or a partition of another queue.
pub async fn stream_cycles_commit_all_or_nothing_on_the_lease(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(72);
    let qid = query_id(&*s, &mut ids, "cyc", "csrc").await?;
    push(&*s, &mut ids, "csrc", "p", "t", 0..4).await?;
    push(&*s, &mut ids, "other", "p", "o", 0..1).await?;
    let (w, pid) = lease_p(&*s, &mut ids, "csrc", "g", 2).await?;
    let cycle = |ids: &mut Ids, lease: Option<String>, txid: &str, value: i64| {
        vec![
            TxOp::Stream(StreamCycleOp {
                query_id: qid,
                partition_id: pid.clone(),
                group: "g".into(),
                lease_id: lease.clone(),
                ops: vec![upsert("count", json!(value))],
            }),
            TxOp::Push(vec![group(ids, "csink", "p", &format!("s{value}-"), 0..1)]),
            TxOp::Ack {
                group: "g".into(),
                item: ack(txid, &pid, AckStatus::Completed, lease),
            },
        ]
    };
    let sink_count = |s: std::sync::Arc<dyn Storage>, mut ids: Ids| async move {
        let r = s
            .pop_partition(pop_req("csink", "check", ids.worker(), 100), "p".into())
            .await
            .map_err(e)?;
        Ok::<_, String>(r.message_count())
    };

    // A failure in any part rolls back every part: here the ack names no delivered message.
    let out = s
        .transaction(cycle(&mut ids, Some(w.to_string()), "t-3", 1))
        .await
        .map_err(e)?;
    ensure!(
        !out.committed,
        "an ack past the batch fails the cycle: {out:?}"
    );
    ensure_eq!(
        rows(&*s, qid, &pid).await?,
        vec![],
        "no state from a failed cycle"
    );

    let out = s
        .transaction(cycle(&mut ids, Some(w.to_string()), "t-1", 2))
        .await
        .map_err(e)?;
    ensure!(out.committed, "the holder's cycle commits: {out:?}");
    ensure!(
        matches!(&out.results[2], TxOpResult::Ack(a) if a.success && a.lease_released),
        "its ack committed the batch and ended the lease: {:?}",
        out.results[2]
    );
    ensure_eq!(
        rows(&*s, qid, &pid).await?,
        vec![("count".to_string(), json!(2))],
        "its state"
    );

    // The same cycle again (a retry after a lost answer): the lease is gone, so nothing.
    let out = s
        .transaction(cycle(&mut ids, Some(w.to_string()), "t-1", 3))
        .await
        .map_err(e)?;
    ensure_eq!(
        out.results.first(),
        Some(&TxOpResult::Stream(Err(StreamRefusal::LeaseLost))),
        "a released lease fences the whole cycle"
    );
    ensure!(!out.committed, "nothing committed");

    // A lease that expired, then was re-claimed by another: the old holder commits nothing.
    let w2 = ids.worker();
    s.pop_partition(pop_req("csrc", "g", w2, 2), "p".into())
        .await
        .map_err(e)?;
    b.advance_secs(3600).await;
    let out = s
        .transaction(cycle(&mut ids, Some(w2.to_string()), "t-3", 4))
        .await
        .map_err(e)?;
    ensure_eq!(
        out.results.first(),
        Some(&TxOpResult::Stream(Err(StreamRefusal::LeaseLost))),
        "an expired lease fences the cycle"
    );
    let w3 = ids.worker();
    s.pop_partition(pop_req("csrc", "g", w3, 2), "p".into())
        .await
        .map_err(e)?;
    let out = s
        .transaction(cycle(&mut ids, Some(w2.to_string()), "t-3", 5))
        .await
        .map_err(e)?;
    ensure_eq!(
        out.results.first(),
        Some(&TxOpResult::Stream(Err(StreamRefusal::LeaseLost))),
        "a lease re-claimed by another fences the old holder"
    );
    ensure_eq!(
        rows(&*s, qid, &pid).await?,
        vec![("count".to_string(), json!(2))],
        "only the committed cycle's state"
    );
    ensure_eq!(
        sink_count(s.clone(), Ids::new(73)).await?,
        1,
        "only the committed cycle's sink push"
    );
    let out = s
        .transaction(cycle(&mut ids, Some(w3.to_string()), "t-3", 6))
        .await
        .map_err(e)?;
    ensure!(out.committed, "the new holder's cycle commits: {out:?}");

    refusals_and_deletion(&*s, &mut ids, qid, &pid).await
}

/// The lease of a new worker of `group` on partition p of `queue` (a batch of `batch`): the
/// worker, and the partition's id.
async fn lease_p(
    s: &dyn Storage,
    ids: &mut Ids,
    queue: &str,
    group: &str,
    batch: u32,
) -> Result<(queen_core::WorkerId, String), String> {
    let w = ids.worker();
    let r = s
        .pop_partition(pop_req(queue, group, w, batch), "p".into())
        .await
        .map_err(e)?;
    let pid = r
        .claims
        .first()
        .map(|c| c.partition_id.clone())
        .ok_or_else(|| format!("{queue}: nothing leased"))?;
    Ok((w, pid))
}

/// The end of `stream_cycles_commit_all_or_nothing_on_the_lease`: cycles refused for what they
/// name (a partition of another queue, an unknown query) write nothing, and the source queue's
/// deletion takes its partitions' state.
async fn refusals_and_deletion(
    s: &dyn Storage,
    ids: &mut Ids,
    qid: uuid::Uuid,
    pid: &str,
) -> CaseResult {
    // Refusals of the cycle itself.
    let other_pid = s
        .pop_partition(pop_req("other", "g", ids.worker(), 1), "p".into())
        .await
        .map_err(e)?
        .claims[0]
        .partition_id
        .clone();
    for (query_id, partition_id, want) in [
        (qid, other_pid, StreamRefusal::ForeignPartition),
        (ids.worker().0, pid.to_string(), StreamRefusal::UnknownQuery),
    ] {
        let op = TxOp::Stream(StreamCycleOp {
            query_id,
            partition_id,
            group: "g".into(),
            lease_id: None,
            ops: vec![upsert("x", json!(1))],
        });
        let out = s.transaction(vec![op]).await.map_err(e)?;
        ensure_eq!(out.results, vec![TxOpResult::Stream(Err(want))], "{want:?}");
    }
    ensure_eq!(
        rows(s, qid, pid).await?,
        vec![("count".to_string(), json!(6))],
        "refused cycles wrote nothing"
    );
    // The source queue deleted: its partitions' state goes with them.
    ensure!(s.delete_queue("csrc").await.map_err(e)?, "deleted");
    ensure_eq!(
        rows(s, qid, pid).await?,
        vec![],
        "a deleted partition's state is deleted"
    );
    Ok(())
}

/// A cycle that owns its batch ends the lease even when its ack stops short of the batch's end
/// (`TxOp::EndLease` after the ack): the rest of the batch is claimable at once. After an ack at
/// the batch's end there is no lease left to end, and that is no failure.
pub async fn stream_cycles_end_the_lease_they_own(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(74);
    let qid = query_id(&*s, &mut ids, "own", "osrc").await?;
    push(&*s, &mut ids, "osrc", "p", "t", 0..4).await?;
    let (w, pid) = lease_p(&*s, &mut ids, "osrc", "g", 4).await?;
    let cycle = |lease: &str, txid: &str| {
        vec![
            TxOp::Stream(StreamCycleOp {
                query_id: qid,
                partition_id: pid.clone(),
                group: "g".into(),
                lease_id: Some(lease.to_string()),
                ops: vec![upsert("k", json!(txid))],
            }),
            TxOp::Ack {
                group: "g".into(),
                item: ack(txid, &pid, AckStatus::Completed, Some(lease.to_string())),
            },
            TxOp::EndLease {
                group: "g".into(),
                partition_id: pid.clone(),
                lease_id: lease.to_string(),
            },
        ]
    };
    let out = s
        .transaction(cycle(&w.to_string(), "t-1"))
        .await
        .map_err(e)?;
    ensure!(out.committed, "committed: {out:?}");
    ensure!(
        matches!(&out.results[2], TxOpResult::Ack(a) if a.success && a.lease_released),
        "the partial ack's lease ended: {:?}",
        out.results[2]
    );
    let w2 = ids.worker();
    let again = s
        .pop_partition(pop_req("osrc", "g", w2, 4), "p".into())
        .await
        .map_err(e)?;
    ensure_eq!(
        again
            .claims
            .first()
            .map(|c| (c.first_offset, c.last_offset)),
        Some((2, 3)),
        "the rest of the batch, at once"
    );
    let out = s
        .transaction(cycle(&w2.to_string(), "t-3"))
        .await
        .map_err(e)?;
    ensure!(out.committed, "committed: {out:?}");
    ensure!(
        matches!(&out.results[2], TxOpResult::Ack(a) if a.success && !a.lease_released),
        "the ack at the batch's end left no lease to end: {:?}",
        out.results[2]
    );
    Ok(())
}

/// A cycle is fenced on the state it closes: a delete must find the row it read, and a cycle
/// without an ack (the SDK's idle flush) commits only while no worker of the group holds the
/// source lease. Two flushes that read one window: the first emits it, the second commits
/// nothing, its sink push included.
pub async fn stream_cycles_are_fenced_on_the_state_they_close(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(75);
    let qid = query_id(&*s, &mut ids, "close", "fsrc").await?;
    push(&*s, &mut ids, "fsrc", "p", "t", 0..2).await?;
    let (w, pid) = lease_p(&*s, &mut ids, "fsrc", "g", 1).await?;
    let window = json!({"acc": 3, "windowEnd": 1000});
    let stream = |lease: Option<String>, ops: Vec<StateOp>| {
        TxOp::Stream(StreamCycleOp {
            query_id: qid,
            partition_id: pid.clone(),
            group: "g".into(),
            lease_id: lease,
            ops,
        })
    };
    // The holder's cycle opens the window and acks its message.
    let out = s
        .transaction(vec![
            stream(Some(w.to_string()), vec![upsert("w1", window.clone())]),
            TxOp::Ack {
                group: "g".into(),
                item: ack("t-0", &pid, AckStatus::Completed, Some(w.to_string())),
            },
        ])
        .await
        .map_err(e)?;
    ensure!(out.committed, "the holder's cycle: {out:?}");
    // A flush while another holder has the next message: refused, nothing applied.
    let w2 = ids.worker();
    s.pop_partition(pop_req("fsrc", "g", w2, 1), "p".into())
        .await
        .map_err(e)?;
    let mut sink_ids = Ids::new(77);
    let mut flush = |nonce: &str| {
        vec![
            stream(None, vec![StateOp::Delete { key: "w1".into() }]),
            TxOp::Push(vec![group(&mut sink_ids, "fsink", "out", nonce, 0..1)]),
        ]
    };
    let out = s.transaction(flush("a")).await.map_err(e)?;
    ensure_eq!(
        out.results.first(),
        Some(&TxOpResult::Stream(Err(StreamRefusal::SourceLeased))),
        "a flush while the source is leased"
    );
    ensure!(!out.committed, "nothing committed");
    // The holder lets go (its ack ends the lease): the first flush closes the window.
    let out = s
        .transaction(vec![TxOp::Ack {
            group: "g".into(),
            item: ack("t-1", &pid, AckStatus::Completed, Some(w2.to_string())),
        }])
        .await
        .map_err(e)?;
    ensure!(out.committed, "the second holder's ack: {out:?}");
    // Both flushes read the window (one ripe read stands for both: the second finds it stamped).
    let ripe = StateQuery {
        ripe_at_or_before: Some(5000),
        ..all_rows(qid, &pid)
    };
    s.stream_state(&ripe).await.map_err(e)?;
    let out = s.transaction(flush("b")).await.map_err(e)?;
    ensure!(out.committed, "the first flush closes the window: {out:?}");
    // The second flush read the same window: its delete finds no row, so it commits nothing.
    let out = s.transaction(flush("c")).await.map_err(e)?;
    ensure_eq!(
        out.results.first(),
        Some(&TxOpResult::Stream(Err(StreamRefusal::StateGone))),
        "a second flush of one window"
    );
    ensure!(!out.committed, "nothing committed");
    let sunk = s
        .pop_partition(
            pop_req("fsink", "check", Ids::new(76).worker(), 100),
            "out".into(),
        )
        .await
        .map_err(e)?;
    ensure_eq!(sunk.message_count(), 1, "the window reached the sink once");
    ensure_eq!(
        rows(&*s, qid, &pid).await?,
        vec![],
        "the window's row is gone"
    );
    // A key the cycle upserts first is its own to delete: no row needed.
    let out = s
        .transaction(vec![stream(
            None,
            vec![
                upsert("tmp", json!(1)),
                StateOp::Delete { key: "tmp".into() },
            ],
        )])
        .await
        .map_err(e)?;
    ensure!(out.committed, "upsert then delete: {out:?}");
    Ok(())
}

/// A flush deletes a window's row only as its ripe read saw it: a ripe read stamps each row it
/// answers, a later write of the row (here a regular cycle adding an event to the window) makes
/// the flush that read it commit nothing; the next ripe read sees the new value and its flush
/// commits. A row without a `windowEnd` needs no ripe read.
pub async fn a_flush_deletes_a_window_only_as_its_ripe_read_saw_it(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(78);
    let qid = query_id(&*s, &mut ids, "ripe", "ripesrc").await?;
    push(&*s, &mut ids, "ripesrc", "p", "t", 0..2).await?;
    let (w, pid) = lease_p(&*s, &mut ids, "ripesrc", "g", 1).await?;
    let cycle = |lease: Option<String>, ops: Vec<StateOp>| {
        TxOp::Stream(StreamCycleOp {
            query_id: qid,
            partition_id: pid.clone(),
            group: "g".into(),
            lease_id: lease,
            ops,
        })
    };
    let regular = |w: queen_core::WorkerId, tx: &str, acc: i64| {
        vec![
            cycle(
                Some(w.to_string()),
                vec![
                    upsert("w\u{1f}1", json!({"acc": acc, "windowEnd": 1000})),
                    upsert("other", json!({"acc": acc})),
                ],
            ),
            TxOp::Ack {
                group: "g".into(),
                item: ack(tx, &pid, AckStatus::Completed, Some(w.to_string())),
            },
        ]
    };
    let out = s.transaction(regular(w, "t-0", 1)).await.map_err(e)?;
    ensure!(out.committed, "the first event's cycle: {out:?}");
    let ripe = StateQuery {
        ripe_at_or_before: Some(5000),
        ..all_rows(qid, &pid)
    };
    let read = s
        .stream_state(&ripe)
        .await
        .map_err(e)?
        .ok_or("unknown query")?;
    ensure_eq!(
        read.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        vec!["w\u{1f}1"],
        "the ripe read"
    );
    // A regular cycle adds the second event to the window after the flush read it.
    let w2 = ids.worker();
    s.pop_partition(pop_req("ripesrc", "g", w2, 1), "p".into())
        .await
        .map_err(e)?;
    let out = s.transaction(regular(w2, "t-1", 2)).await.map_err(e)?;
    ensure!(out.committed, "the second event's cycle: {out:?}");
    let flush = || {
        vec![cycle(
            None,
            vec![StateOp::Delete {
                key: "w\u{1f}1".into(),
            }],
        )]
    };
    let out = s.transaction(flush()).await.map_err(e)?;
    ensure_eq!(
        out.results,
        vec![TxOpResult::Stream(Err(StreamRefusal::StateGone))],
        "a flush of a window written since its ripe read"
    );
    ensure_eq!(
        rows(&*s, qid, &pid).await?.first().cloned(),
        Some(("other".to_string(), json!({"acc": 2}))),
        "nothing applied"
    );
    // The next ripe read sees the window as it is; its flush commits.
    s.stream_state(&ripe).await.map_err(e)?;
    let out = s.transaction(flush()).await.map_err(e)?;
    ensure!(out.committed, "the flush after a new ripe read: {out:?}");
    // A row without a windowEnd is deleted without a ripe read.
    let out = s
        .transaction(vec![cycle(
            None,
            vec![StateOp::Delete {
                key: "other".into(),
            }],
        )])
        .await
        .map_err(e)?;
    ensure!(out.committed, "a row no ripe read selects: {out:?}");
    ensure_eq!(rows(&*s, qid, &pid).await?, vec![], "both gone");
    Ok(())
}
