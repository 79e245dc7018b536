//! Seeded interleavings of concurrent transactions: historical failures of brokers of this
//! design, each behind a switch (`SimBugs`), and proof that the shipped design avoids them.
//!
//! Every test sweeps a range of seeds; a failure names its seed, and `SIM_SEED=<n>` replays it.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::storage::{MessageStorage, PopStorage};
use std::sync::Arc;

use queen_core::claim::SubscriptionIntent;
use queen_core::frames::Frame;
use queen_core::ids::IdMinter;
use queen_core::rng::SeededRng;
use queen_core::storage::{PopRequest, PushGroup, Verdict};
use queen_core::{Timestamp, WorkerId};
use queen_storage_sim::sched::{Interleaving, Op, OpResult};
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

const T0: Timestamp = Timestamp(1_700_000_000_000_000);

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    match std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => default.collect(),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

fn db(seed: u64, bugs: SimBugs) -> (Arc<SimDb>, ManualClock) {
    let clock = ManualClock::new(T0);
    (SimDb::new(seed, clock.as_sim_clock(), bugs), clock)
}

fn push_group(ids: &mut IdMinter, queue: &str, partition: &str, n: u32) -> PushGroup {
    PushGroup {
        queue: queue.into(),
        partition: partition.into(),
        frames: (0..n)
            .map(|i| Frame {
                producer: None,
                encrypted: false,
                message_id: ids.mint(T0),
                transaction_id: format!("{partition}-{i}"),
                trace_id: None,
                payload: b"{}".to_vec(),
            })
            .collect(),
        blob: None,
    }
}

fn req(queue: &str, worker: WorkerId, max_partitions: u32) -> PopRequest {
    PopRequest {
        queue: queue.into(),
        group: "g".into(),
        worker,
        batch: 1000,
        max_partitions,
        auto_ack: false,
        lease_seconds: Some(60),
        intent: SubscriptionIntent::default(),
        skip_window_debounce: true,
        conflation: false,
    }
}

struct ContentionRun {
    waits: usize,
    deadlocks: u32,
    longest_chain: usize,
    errors: usize,
    claimed: Vec<String>,
    /// SKIP LOCKED and advisory skips: the contention happened.
    skips: u32,
}

/// Several consumers of one group pop a fresh queue's partitions in different orders, each
/// claiming several partitions in one transaction: the convoy's breeding ground.
fn contention(seed: u64, bugs: SimBugs) -> ContentionRun {
    let (db, _clock) = db(seed, bugs);
    let mut ids = IdMinter::new(SeededRng::new(seed).child("ids"));
    let names: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let groups = names
        .iter()
        .map(|n| push_group(&mut ids, "q", n, 3))
        .collect();
    block_on(db.push(groups)).unwrap_or_else(|e| panic!("seed {seed}: push failed: {e}"));
    let mut rng = SeededRng::new(seed).child("orders");
    let mut run = Interleaving::new(db.clone(), seed);
    for _ in 0..4 {
        let mut order = names.clone();
        rng.shuffle(&mut order);
        run.spawn(Op::PopList(req("q", WorkerId(ids.mint(T0)), 3), order));
    }
    let results = run
        .run(100_000)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let ev = db.events();
    let mut claimed = vec![];
    let mut errors = 0;
    for r in results {
        match r {
            OpResult::Pop(Ok(p)) => claimed.extend(p.claims.into_iter().map(|c| c.partition)),
            OpResult::Pop(Err(_)) => errors += 1,
            other => panic!("seed {seed}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        db.open_transactions(),
        0,
        "seed {seed}: a transaction was left open"
    );
    ContentionRun {
        waits: ev.waits.len(),
        deadlocks: ev.deadlocks,
        longest_chain: ev.longest_wait_chain,
        errors,
        claimed,
        skips: ev.skip_locked + ev.advisory_skips,
    }
}

#[test]
fn claim_first_with_advisory_try_lock_never_waits() {
    let mut skips = 0;
    for seed in seeds(0..200) {
        let r = contention(seed, SimBugs::default());
        assert_eq!(
            r.waits, 0,
            "seed {seed}: a pop waited on another transaction"
        );
        assert_eq!(r.errors, 0, "seed {seed}: a pop failed");
        let mut c = r.claimed.clone();
        c.sort();
        c.dedup();
        assert_eq!(
            c.len(),
            r.claimed.len(),
            "seed {seed}: a partition was leased twice: {:?}",
            r.claimed
        );
        skips += r.skips;
    }
    eprintln!("claim-first: 0 waits, {skips} skips (SKIP LOCKED or advisory)");
    // Coverage: the contention really happened (pops skipped each other's rows).
    assert!(skips > 0, "no seed produced a SKIP LOCKED or advisory skip");
}

#[test]
fn per_pop_insert_on_conflict_convoys_and_deadlocks() {
    let bugs = SimBugs {
        per_pop_insert_on_conflict: true,
        ..SimBugs::default()
    };
    let (mut waits, mut deadlocks, mut chains) = (0, 0, 0);
    for seed in seeds(0..200) {
        let r = contention(seed, bugs);
        waits += r.waits;
        deadlocks += r.deadlocks;
        chains = chains.max(r.longest_chain);
    }
    eprintln!(
        "per-pop insert-on-conflict: {waits} waits, {deadlocks} deadlocks, longest chain {chains}"
    );
    assert!(
        waits > 0,
        "the historical per-pop insert must make pops wait on each other"
    );
    assert!(
        deadlocks > 0 || chains >= 2,
        "waits must form cycles or chains (deadlocks {deadlocks}, longest chain {chains})"
    );
}

#[test]
fn blocking_advisory_lock_makes_pops_wait() {
    let bugs = SimBugs {
        advisory_lock_blocking: true,
        ..SimBugs::default()
    };
    let waits: usize = seeds(0..200)
        .into_iter()
        .map(|s| contention(s, bugs).waits)
        .sum();
    assert!(
        waits > 0,
        "taking (not trying) the advisory lock must be caught waiting"
    );
}

/// A pop of a partition racing the push that creates it.
fn creation_race(seed: u64, bugs: SimBugs) -> (u32, u32) {
    let (db, _clock) = db(seed, bugs);
    let mut ids = IdMinter::new(SeededRng::new(seed).child("ids"));
    block_on(db.push(vec![push_group(&mut ids, "q", "other", 1)]))
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let mut run = Interleaving::new(db.clone(), seed);
    run.spawn(Op::Push(vec![push_group(&mut ids, "q", "fresh", 2)]));
    run.spawn(Op::PopPartition(
        req("q", WorkerId(ids.mint(T0)), 1),
        "fresh".into(),
    ));
    let results = run
        .run(10_000)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    for r in &results {
        if let OpResult::Pop(Ok(p)) = r {
            for c in &p.claims {
                if bugs == SimBugs::default() {
                    assert!(
                        !c.partition_id.is_empty(),
                        "seed {seed}: leased batch with an empty partitionId"
                    );
                }
            }
        }
    }
    let ev = db.events();
    (ev.creation_races, ev.empty_partition_ids)
}

#[test]
fn partition_id_is_resolved_after_the_claim() {
    let (mut races, mut empties) = (0, 0);
    for seed in seeds(0..300) {
        let (r, e) = creation_race(seed, SimBugs::default());
        races += r;
        empties += e;
    }
    eprintln!("partition-creation race happened in {races} runs; empty partitionIds: {empties}");
    assert!(
        races > 0,
        "coverage: no seed raced the pop against the creating push's commit"
    );
    assert_eq!(empties, 0);
}

#[test]
fn partition_id_from_the_outer_snapshot_is_caught() {
    let bugs = SimBugs {
        partition_id_outside_function: true,
        ..SimBugs::default()
    };
    let empties: u32 = seeds(0..300)
        .into_iter()
        .map(|s| creation_race(s, bugs).1)
        .sum();
    eprintln!("old shape: {empties} leased batches with partitionId \"\"");
    assert!(
        empties > 0,
        "the old shape must deliver a leased batch with partitionId \"\""
    );
}

/// An emptied partition (retention removed every segment) must not stay pending forever.
fn phantom_pops_after_retention(bugs: SimBugs) -> (bool, usize) {
    let (db, clock) = db(1, bugs);
    let mut ids = IdMinter::new(SeededRng::new(1).child("ids"));
    block_on(db.push(vec![push_group(&mut ids, "q", "p", 3)])).unwrap_or_else(|e| panic!("{e}"));
    db.drop_segments("q", "p", i64::MAX)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut candidate_pops = 0;
    for _ in 0..20 {
        clock.advance_millis(31_000);
        let r = block_on(db.pop_wildcard(req("q", WorkerId(ids.mint(T0)), 1)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(r.claims.is_empty());
        if r.verdicts
            .iter()
            .any(|(n, v)| n == "p" && *v == Verdict::Empty)
        {
            candidate_pops += 1;
        }
    }
    let pending = db.has_pending_now("q", "g");
    (pending, candidate_pops)
}

#[test]
fn the_seal_ends_phantom_pending() {
    let (pending, candidate_pops) = phantom_pops_after_retention(SimBugs::default());
    assert!(!pending, "sealed partitions are not pending");
    assert_eq!(
        candidate_pops, 1,
        "only the first scan visits the emptied partition"
    );
}

#[test]
fn without_the_seal_an_emptied_partition_stays_a_phantom_candidate() {
    let (pending, candidate_pops) = phantom_pops_after_retention(SimBugs {
        no_cursor_seal: true,
        ..SimBugs::default()
    });
    assert!(pending, "the phantom stays pending");
    assert_eq!(candidate_pops, 20, "every scan revisits it");
}

#[test]
fn a_seed_replays_exactly() {
    let trace = |seed| {
        let (db, _clock) = db(seed, SimBugs::default());
        let mut ids = IdMinter::new(SeededRng::new(seed).child("ids"));
        let names: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
        block_on(
            db.push(
                names
                    .iter()
                    .map(|n| push_group(&mut ids, "q", n, 2))
                    .collect(),
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut run = Interleaving::new(db.clone(), seed);
        for _ in 0..3 {
            run.spawn(Op::PopWildcard(req("q", WorkerId(ids.mint(T0)), 2)));
        }
        let results = run.run(10_000).unwrap_or_else(|e| panic!("{e}"));
        (run.trace.clone(), format!("{results:?}"))
    };
    assert_eq!(trace(42), trace(42));
    assert_ne!(
        trace(42).0,
        trace(43).0,
        "different seeds interleave differently"
    );
}

/// Reads by offset beside pushes in flight: after every step of three concurrent pushes of one
/// partition, a read from offset 0. Returns what went wrong, and how many reads met a push in
/// flight (offsets allocated, not committed).
fn fetch_beside_pushes(seed: u64, bugs: SimBugs) -> (Vec<String>, u32) {
    use queen_core::storage::{PartitionRead, ReadStorage};
    let (db, _clock) = db(seed, bugs);
    let mut ids = IdMinter::new(SeededRng::new(seed).child("ids"));
    block_on(db.push(vec![push_group(&mut ids, "gq", "p", 3)])).unwrap_or_else(|e| panic!("{e}"));
    let mut run = Interleaving::new(db.clone(), seed);
    for w in 0..3 {
        let mut g = push_group(&mut ids, "gq", "p", 2);
        for f in &mut g.frames {
            f.transaction_id = format!("w{w}-{}", f.transaction_id);
        }
        // A second partition after it (pushes lock partitions in name order): the first's
        // segment stays uncommitted while the transaction goes on.
        let mut other = push_group(&mut ids, "gq", &format!("z{w}"), 1);
        other.frames[0].transaction_id = format!("z{w}");
        run.spawn(Op::Push(vec![g, other]));
    }
    let (mut wrong, mut in_flight) = (vec![], 0);
    let mut seen: std::collections::BTreeMap<i64, String> = Default::default();
    for _ in 0..100_000 {
        let more = run.step();
        let committed_end = db.partition_head("gq", "p").map_or(0, |(h, _)| h + 1);
        if db.open_transactions() > 0 {
            in_flight += 1;
        }
        let Ok(PartitionRead::Found { range, segments }) =
            block_on(db.read_partition("gq", "p", 0, u64::MAX))
        else {
            wrong.push("the partition reads as unknown".into());
            break;
        };
        let mut offsets = vec![];
        for s in &segments {
            let frames = queen_core::frames::slice_blob(
                &s.blob,
                s.start_idx as usize,
                s.take as usize,
                s.msg_count as usize,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            for (i, f) in frames.into_iter().enumerate() {
                let offset = s.base_offset + i64::from(s.start_idx) + i as i64;
                offsets.push(offset);
                if let Some(before) = seen.insert(offset, f.transaction_id.clone()) {
                    if before != f.transaction_id {
                        wrong.push(format!(
                            "offset {offset} read as {before}, then {}",
                            f.transaction_id
                        ));
                    }
                }
            }
        }
        if range.high_watermark != committed_end {
            wrong.push(format!(
                "high watermark {} with the committed end at {committed_end}",
                range.high_watermark
            ));
        }
        if offsets != (0..range.high_watermark).collect::<Vec<_>>() {
            wrong.push(format!(
                "offsets {offsets:?} below a high watermark of {}",
                range.high_watermark
            ));
        }
        if !more {
            break;
        }
    }
    (wrong, in_flight)
}

#[test]
fn a_read_by_offset_stops_at_the_committed_end() {
    let mut met = 0;
    for seed in seeds(0..40) {
        let (wrong, in_flight) = fetch_beside_pushes(seed, SimBugs::default());
        assert!(wrong.is_empty(), "seed {seed}: {wrong:?}");
        met += in_flight;
    }
    assert!(met > 40, "reads met pushes in flight only {met} times");
}

#[test]
fn a_read_that_sees_pushes_in_flight_is_caught() {
    let bugs = SimBugs {
        fetch_reads_in_flight: true,
        ..SimBugs::default()
    };
    assert!(
        seeds(0..40)
            .into_iter()
            .any(|seed| !fetch_beside_pushes(seed, bugs).0.is_empty()),
        "reading pushes in flight went unnoticed"
    );
}
