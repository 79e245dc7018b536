//! The ring's own tests.

use super::*;

const T0: Timestamp = Timestamp(1_000_000);

#[test]
fn k_is_clamped() {
    assert_eq!(candidate_count(1), 16);
    assert_eq!(candidate_count(2), 16);
    assert_eq!(candidate_count(3), 24);
    assert_eq!(candidate_count(32), 256);
    assert_eq!(candidate_count(1000), 256);
}

#[test]
fn push_makes_ready_and_empty_clears() {
    let mut r = HotRing::default();
    assert!(!r.has_ready(T0));
    r.note_push("p1", 3);
    assert!(r.has_ready(T0));
    let c = r.take_candidates(16, T0);
    assert_eq!(
        c,
        vec![Candidate {
            partition: "p1".into(),
            epoch: 1
        }]
    );
    assert!(!r.has_ready(T0), "in flight, not ready");
    r.check_in("p1", Verdict::Empty, Some(1), T0);
    assert!(!r.has_ready(T0));
    assert!(!r.is_ready_or_waiting("p1"));
}

#[test]
fn a_push_racing_an_empty_verdict_is_kept() {
    let mut r = HotRing::default();
    r.note_push("p1", 1);
    let c = r.take_candidates(16, T0);
    r.note_push("p1", 1); // lands after storage answered "empty" for the old snapshot
    r.check_in("p1", Verdict::Empty, Some(c[0].epoch), T0);
    assert!(
        r.has_ready(T0),
        "the epoch check keeps the raced push visible"
    );
}

#[test]
fn the_bug_switch_loses_the_raced_push() {
    let mut r = HotRing::new(
        DEFAULT_RESEED_INTERVAL_MS,
        RingBugs {
            clear_without_epoch_check: true,
            ..RingBugs::default()
        },
    );
    // An empty verdict, and a drained autoAck batch: both lose the push that raced them.
    for verdict in [Verdict::Empty, drained(1)] {
        r.note_push("p1", 1);
        let c = r.take_candidates(16, T0);
        r.note_push("p1", 1);
        r.check_in("p1", verdict, Some(c[0].epoch), T0);
        assert!(!r.has_ready(T0), "{verdict:?}");
    }
}

#[test]
fn a_pop_takes_at_most_half_of_a_small_ring() {
    let mut r = HotRing::default();
    for i in 0..10 {
        r.note_push(&format!("p{i}"), 1);
    }
    let shares: Vec<usize> = (0..4).map(|_| r.take_share(1, T0).len()).collect();
    assert_eq!(
        shares,
        vec![5, 2, 1, 1],
        "four concurrent pops each get some"
    );
    let mut big = HotRing::default();
    for i in 0..1000 {
        big.note_push(&format!("p{i}"), 1);
    }
    assert_eq!(
        big.take_share(1, T0).len(),
        16,
        "a large ring: candidate_count"
    );
    assert_eq!(big.take_share(4, T0).len(), 32);
    let mut one = HotRing::default();
    one.note_push("p", 1);
    assert_eq!(
        one.take_share(1, T0).len(),
        1,
        "never fewer than it may claim"
    );
}

fn drained(count: u32) -> Verdict {
    Verdict::Took {
        count,
        leased_until: None,
        drained: true,
    }
}

#[test]
fn a_drained_autoack_batch_leaves_the_ring_unless_a_push_raced_it() {
    let mut r = HotRing::default();
    r.note_push("p1", 2);
    r.note_push("p2", 2);
    let c = r.take_candidates(16, T0);
    r.note_push("p2", 1); // lands after storage's snapshot drained p2
    for cand in &c {
        r.check_in(&cand.partition, drained(2), Some(cand.epoch), T0);
    }
    assert!(!r.is_ready_or_waiting("p1"), "drained: not offered again");
    assert_eq!(r.take_candidates(16, T0).len(), 1);
    // Not drained: offered again, as storage may hold more.
    r.note_push("p3", 20);
    let c = r.take_candidates(16, T0);
    let more = Verdict::Took {
        count: 10,
        leased_until: None,
        drained: false,
    };
    r.check_in("p3", more, Some(c[0].epoch), T0);
    assert!(r.has_ready(T0));
}

#[test]
fn leased_and_deferred_partitions_wait_on_the_wheel() {
    let mut r = HotRing::default();
    r.note_push("a", 1);
    r.note_push("b", 1);
    let c = r.take_candidates(16, T0);
    assert_eq!(c.len(), 2);
    r.check_in(
        "a",
        Verdict::LeasedUntil(T0.plus_millis(500)),
        Some(c[0].epoch),
        T0,
    );
    r.check_in(
        "b",
        Verdict::DeferredUntil(T0.plus_millis(200)),
        Some(c[1].epoch),
        T0,
    );
    assert_eq!(r.next_revisit(), Some(T0.plus_millis(200)));
    r.note_push("a", 1);
    assert!(!r.has_ready(T0), "a push does not un-lease a partition");
    assert!(r.has_ready(T0.plus_millis(200)));
    let c = r.take_candidates(16, T0.plus_millis(200));
    assert_eq!(c[0].partition, "b");
    assert!(
        !r.has_ready(T0.plus_millis(500)),
        "a lease still holds at its expiry instant"
    );
    assert!(r.has_ready(T0.plus_millis(500).just_after()));
}

/// Two first contacts of one group in flight at once (four consumers of a new queue): the
/// first's consumer acks and a pop finds the partition empty, so the ring drops it; then
/// the second's verdict, read while the first still held the lease, comes back. It must
/// not park the partition until that lease's old expiry: pushes would not free it, and it
/// would wait for the next reseed walk (a 30 s late delivery in the steady benchmark).
fn stale_lease_after_drop(bugs: RingBugs) -> HotRing {
    let mut r = HotRing::new(DEFAULT_RESEED_INTERVAL_MS, bugs);
    r.note_push("a", 1);
    let second_look = r.clock();
    // A list pop meets the first contact's lease; the release readies it; the next pop
    // finds it empty.
    let c = r.take_candidates(16, T0);
    r.check_in(
        "a",
        Verdict::LeasedUntil(T0.plus_secs(300)),
        Some(c[0].epoch),
        T0,
    );
    r.note_freed("a", false);
    let c = r.take_candidates(16, T0);
    r.check_in("a", Verdict::Empty, Some(c[0].epoch), T0);
    assert!(!r.is_ready_or_waiting("a"), "found empty: dropped");
    r.check_in_issued(
        "a",
        Verdict::LeasedUntil(T0.plus_secs(300)),
        second_look,
        T0,
    );
    r
}

#[test]
fn a_stale_lease_verdict_does_not_park_a_dropped_partition() {
    let mut r = stale_lease_after_drop(RingBugs::default());
    assert!(r.has_ready(T0), "asked again at once");
    let c = r.take_candidates(16, T0);
    r.check_in("a", Verdict::Empty, Some(c[0].epoch), T0);
    r.note_push("a", 1);
    assert!(r.has_ready(T0), "the next push is offered");

    // The bug switch parks it until the old lease's expiry, and a push does not free it.
    let mut r = stale_lease_after_drop(RingBugs {
        stale_look_trusts_a_dropped_entry: true,
        ..RingBugs::default()
    });
    r.note_push("a", 1);
    assert!(
        !r.has_ready(T0.plus_secs(60)),
        "the switch re-introduces the bug"
    );
}

#[test]
fn a_look_issued_after_the_drop_is_trusted() {
    let mut r = HotRing::default();
    r.note_push("a", 1);
    let c = r.take_candidates(16, T0);
    r.check_in("a", Verdict::Empty, Some(c[0].epoch), T0);
    let look = r.clock();
    r.check_in_issued("a", Verdict::LeasedUntil(T0.plus_secs(300)), look, T0);
    assert!(!r.has_ready(T0), "leased elsewhere: on the wheel");
    assert_eq!(r.next_revisit(), Some(T0.plus_secs(300).just_after()));
}

#[test]
fn ack_frees_a_leased_partition() {
    let mut r = HotRing::default();
    r.note_push("a", 5);
    let _ = r.take_candidates(16, T0);
    r.check_in(
        "a",
        Verdict::Took {
            count: 2,
            leased_until: Some(T0.plus_secs(60)),
            drained: false,
        },
        Some(1),
        T0,
    );
    assert!(!r.has_ready(T0));
    r.note_freed("a", false);
    assert!(r.has_ready(T0));
    assert_eq!(r.pending_hint(T0), 3);
}

fn drained_lease() -> Verdict {
    Verdict::Took {
        count: 5,
        leased_until: Some(T0.plus_secs(60)),
        drained: true,
    }
}

#[test]
fn a_committed_release_of_a_drained_lease_leaves_the_ring() {
    let mut r = HotRing::default();
    r.note_push("a", 5);
    let c = r.take_candidates(16, T0);
    r.check_in("a", drained_lease(), Some(c[0].epoch), T0);
    r.note_freed("a", true);
    assert!(!r.is_ready_or_waiting("a"), "nothing left to deliver");
    assert_eq!(r.next_revisit(), None, "its lease revisit went with it");
    // The echo of the same release (storage's notification) does not bring it back.
    r.note_freed("a", true);
    assert!(!r.has_ready(T0));
    // A release that did not commit the batch (a nack) does.
    r.note_freed("a", false);
    assert!(r.has_ready(T0));
}

#[test]
fn a_push_during_a_drained_lease_survives_its_committed_release() {
    let mut r = HotRing::default();
    r.note_push("a", 5);
    let c = r.take_candidates(16, T0);
    r.check_in("a", drained_lease(), Some(c[0].epoch), T0);
    r.note_push("a", 1);
    r.note_freed("a", true);
    assert!(r.has_ready(T0), "the push after the read is still pending");
    // A push that raced the pop's read marks no drained lease at all.
    let c = r.take_candidates(16, T0);
    r.note_push("a", 1);
    r.check_in("a", drained_lease(), Some(c[0].epoch), T0);
    r.note_freed("a", true);
    assert!(r.has_ready(T0));
}

#[test]
fn a_committed_release_of_a_partial_lease_makes_it_ready() {
    let mut r = HotRing::default();
    r.note_push("a", 5);
    let c = r.take_candidates(16, T0);
    let partial = Verdict::Took {
        count: 2,
        leased_until: Some(T0.plus_secs(60)),
        drained: false,
    };
    r.check_in("a", partial, Some(c[0].epoch), T0);
    r.note_freed("a", true);
    assert!(r.has_ready(T0), "the rest of the backlog is pending");
}

#[test]
fn the_bug_switch_forgets_a_push_made_during_the_lease() {
    let mut r = HotRing::new(
        DEFAULT_RESEED_INTERVAL_MS,
        RingBugs {
            committed_release_forgets_pushes: true,
            ..RingBugs::default()
        },
    );
    r.note_push("a", 5);
    let c = r.take_candidates(16, T0);
    r.check_in("a", drained_lease(), Some(c[0].epoch), T0);
    r.note_push("a", 1);
    r.note_freed("a", true);
    assert!(!r.has_ready(T0), "the switch loses the push");
}

#[test]
fn busy_and_not_evaluated_come_back() {
    let mut r = HotRing::default();
    r.note_push("a", 1);
    r.note_push("b", 1);
    let _ = r.take_candidates(16, T0);
    r.check_in("a", Verdict::Busy, Some(1), T0);
    r.check_in("b", Verdict::NotEvaluated, Some(1), T0);
    assert_eq!(r.take_candidates(16, T0)[0].partition, "b");
    assert!(r.has_ready(T0.plus_millis(BUSY_REVISIT_MS)));
}

#[test]
fn round_robin_and_k_limit() {
    let mut r = HotRing::default();
    for i in 0..40 {
        r.note_push(&format!("p{i:02}"), 1);
    }
    let c = r.take_candidates(16, T0);
    assert_eq!(c.len(), 16);
    assert_eq!(c[0].partition, "p00");
    assert_eq!(r.take_candidates(16, T0)[0].partition, "p16");
}

#[test]
fn reseed_schedule() {
    let mut r = HotRing::new(1000, RingBugs::default());
    assert!(r.reseed_due(T0));
    r.apply_reseed(&["x".into()], false, T0);
    assert!(!r.reseed_due(T0.plus_millis(999)));
    assert!(r.reseed_due(T0.plus_millis(1000)));
    assert!(r.has_ready(T0));
}

fn names(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("p{i:03}")).collect()
}

#[test]
fn a_walk_pages_through_a_backlog_larger_than_a_page() {
    for stops in [false, true] {
        let bugs = RingBugs {
            walk_stops_after_first_page: stops,
            ..RingBugs::default()
        };
        let mut table = RingTable::new(1000, bugs).with_reseed_page(8);
        let r = table.ring("q", "g");
        assert!(r.reseed_due(T0));
        assert_eq!(
            r.mark_reseed_started(T0),
            None,
            "a walk starts at the first name"
        );
        assert!(!r.reseed_due(T0), "one page in flight at a time");
        r.apply_reseed(&names(0..8), true, T0);
        // Eight ready, above the low water (a quarter page): the next page waits.
        assert!(!r.reseed_due(T0));
        let taken = r.take_candidates(7, T0);
        for c in &taken {
            r.check_in(&c.partition, Verdict::Empty, Some(c.epoch), T0);
        }
        assert_eq!(
            r.reseed_due(T0),
            !stops,
            "one left: the walk reads on, not an interval later"
        );
        if stops {
            continue;
        }
        assert_eq!(r.mark_reseed_started(T0), Some("p007".to_string()));
        r.apply_reseed(&names(8..11), false, T0);
        assert!(!r.reseed_due(T0), "a short page ends the walk");
        assert_eq!(r.take_candidates(16, T0).len(), 4);
    }
}

#[test]
fn a_new_walk_starts_over_after_its_jittered_interval() {
    let mut table = RingTable::new(1000, RingBugs::default()).with_jitter_seed(7);
    let mut due = vec![];
    for group in ["a", "b", "c", "d"] {
        let r = table.ring("q", group);
        let _ = r.mark_reseed_started(T0);
        r.apply_reseed(&names(0..8), false, T0);
        let at = (750..=1250)
            .find(|ms| r.reseed_due(T0.plus_millis(*ms)))
            .expect("due within 3/4..5/4 of the interval");
        due.push(at);
        assert_eq!(r.mark_reseed_started(T0.plus_millis(at)), None);
    }
    due.dedup();
    assert!(due.len() > 1, "rings walk apart: {due:?}");
}

#[test]
fn an_empty_partition_leaves_the_ring_and_comes_back_with_a_fresh_epoch() {
    let mut table = RingTable::default();
    let r = table.ring("q", "g");
    r.note_push("a", 1);
    let first = r.epoch("a");
    let c = r.take_candidates(16, T0);
    r.check_in("a", Verdict::Empty, Some(c[0].epoch), T0);
    assert_eq!(
        table.entry_count(),
        0,
        "the ring holds only what is pending"
    );
    let r = table.ring("q", "g");
    r.note_push("a", 1);
    assert!(r.epoch("a") > first, "epochs never repeat");
    assert!(r.has_ready(T0));
}

#[test]
fn a_reseed_overrides_a_stale_lease() {
    for keep_waiting in [false, true] {
        let bugs = RingBugs {
            reseed_keeps_waiting: keep_waiting,
            ..RingBugs::default()
        };
        let mut r = HotRing::new(1000, bugs);
        r.note_push("a", 1);
        let _ = r.take_candidates(16, T0);
        r.check_in("a", Verdict::LeasedUntil(T0.plus_secs(300)), Some(1), T0);
        assert!(!r.has_ready(T0));
        // Storage says "a" is claimable: its lease was released on another broker.
        r.apply_reseed(&["a".into()], false, T0);
        assert_eq!(r.has_ready(T0), !keep_waiting);
    }
}

#[test]
fn a_release_racing_a_leased_verdict_is_kept() {
    for bug in [false, true] {
        let bugs = RingBugs {
            held_verdict_without_epoch_check: bug,
            ..RingBugs::default()
        };
        let mut r = HotRing::new(1000, bugs);
        r.note_push("a", 3);
        let c = r.take_candidates(16, T0);
        // The lease holder acks while this pop's claim (under an older snapshot) is running.
        r.note_freed("a", false);
        r.check_in(
            "a",
            Verdict::LeasedUntil(T0.plus_secs(30)),
            Some(c[0].epoch),
            T0,
        );
        assert_eq!(r.has_ready(T0), !bug);
    }
}

#[test]
fn a_resync_retries_every_partition_believed_held() {
    for keep_waiting in [false, true] {
        let bugs = RingBugs {
            reseed_keeps_waiting: keep_waiting,
            ..RingBugs::default()
        };
        let mut r = HotRing::new(1000, bugs);
        r.note_push("a", 1);
        let _ = r.take_candidates(16, T0);
        r.check_in(
            "a",
            Verdict::Took {
                count: 1,
                leased_until: Some(T0.plus_secs(30)),
                drained: false,
            },
            Some(1),
            T0,
        );
        // Its release was missed; after the reconnect storage lists nothing (no backlog),
        // then a push lands.
        r.resync();
        r.apply_reseed(&[], false, T0);
        r.note_push("a", 1);
        assert_eq!(r.has_ready(T0), !keep_waiting);
    }
}

#[test]
fn the_ticker_arms_on_the_earliest_revisit_and_hears_of_earlier_ones() {
    let mut t = RingTable::new(1000, RingBugs::default());
    let ring = t.ring("q", "g");
    ring.note_push("a", 1);
    let _ = ring.take_candidates(16, T0);
    ring.check_in("a", Verdict::LeasedUntil(T0.plus_secs(5)), Some(1), T0);
    assert_eq!(t.arm_ticker(), Some(T0.plus_secs(5).just_after()));
    assert!(!t.ticker_needs_rearm());
    let ring = t.ring("q2", "g");
    ring.note_push("b", 1);
    let _ = ring.take_candidates(16, T0);
    ring.check_in("b", Verdict::DeferredUntil(T0.plus_secs(1)), Some(1), T0);
    assert!(
        t.ticker_needs_rearm(),
        "an earlier revisit re-arms the ticker"
    );
    assert_eq!(t.arm_ticker(), Some(T0.plus_secs(1)));
    assert_eq!(t.advance_due(T0.plus_secs(1)), vec!["q2".to_string()]);
    assert!(t.ring("q2", "g").has_ready(T0.plus_secs(1)));
    assert_eq!(t.arm_ticker(), Some(T0.plus_secs(5).just_after()));
}

#[test]
fn table_fans_a_push_out_to_every_group() {
    let mut t = RingTable::new(1000, RingBugs::default());
    let _ = t.ring("q", "g1");
    let _ = t.ring("q", "g2");
    let _ = t.ring("q2", "g1");
    t.note_push("q", "p", 1);
    assert!(t.ring("q", "g1").has_ready(T0));
    assert!(t.ring("q", "g2").has_ready(T0));
    assert!(!t.ring("q2", "g1").has_ready(T0));
}

#[test]
fn a_pop_that_does_not_wait_is_offered_only_leased_partitions_soonest_first() {
    let mut r = HotRing::default();
    // Many partitions deferred (windowBuffer), a few leased elsewhere.
    for i in 0..200 {
        let p = format!("d{i:03}");
        r.note_push(&p, 1);
        r.take_candidates(1, T0);
        r.check_in(
            &p,
            Verdict::DeferredUntil(T0.plus_secs(60)),
            Some(r.epoch(&p)),
            T0,
        );
    }
    for (p, secs) in [("l1", 30), ("l2", 10), ("l3", 20)] {
        r.note_push(p, 1);
        r.take_candidates(1, T0);
        r.check_in(
            p,
            Verdict::LeasedUntil(T0.plus_secs(secs)),
            Some(r.epoch(p)),
            T0,
        );
    }
    assert!(!r.has_ready(T0));
    assert_eq!(r.wheel.lease_held_len(), 3);

    assert!(r.offer_held_leases(2));
    let offered: Vec<String> = r
        .take_candidates(16, T0)
        .into_iter()
        .map(|c| c.partition)
        .collect();
    assert_eq!(
        offered,
        vec!["l2", "l3"],
        "soonest lease end first, at most k"
    );
    assert_eq!(
        r.wheel.lease_held_len(),
        1,
        "offered ones left the lease set"
    );

    // A lease that still holds goes back; the deferred ones are never offered.
    r.check_in(
        "l2",
        Verdict::LeasedUntil(T0.plus_secs(10)),
        Some(r.epoch("l2")),
        T0,
    );
    assert_eq!(r.wheel.lease_held_len(), 2);
    assert!(r.offer_held_leases(16));
    let mut offered: Vec<String> = r
        .take_candidates(16, T0)
        .into_iter()
        .map(|c| c.partition)
        .collect();
    offered.sort();
    assert_eq!(offered, vec!["l1", "l2"]);
    assert!(!r.offer_held_leases(16), "nothing leased is left to offer");

    // The wheel's own advance clears the lease set too.
    r.check_in(
        "l1",
        Verdict::LeasedUntil(T0.plus_secs(30)),
        Some(r.epoch("l1")),
        T0,
    );
    r.advance(T0.plus_secs(31));
    assert_eq!(r.wheel.lease_held_len(), 0);
}
