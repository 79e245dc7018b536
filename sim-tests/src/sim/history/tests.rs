//! The history checkers' own tests.

use super::*;

fn delivered(invoked: Micros, at: Micros, lease: &str, offsets: &[i64]) -> Event {
    Event::Delivered {
        invoked,
        at,
        id: 0,
        consumer: lease.into(),
        group: "g".into(),
        partition: "p".into(),
        lease: lease.into(),
        auto_ack: false,
        attempt: 1,
        msgs: offsets
            .iter()
            .map(|o| Msg {
                partition_id: "pid".into(),
                offset: *o,
                txid: format!("t{o}"),
            })
            .collect(),
    }
}

fn ack(at: Micros, lease: &str) -> Event {
    Event::AckSent {
        at,
        group: "g".into(),
        partition: "p".into(),
        lease: lease.into(),
        last_offset: 0,
        failed: false,
    }
}

#[test]
fn a_second_lease_on_a_live_offset_is_reported_once() {
    let events = [
        delivered(0, 10, "a", &[0, 1]),
        delivered(20, 30, "b", &[1, 2]),
        delivered(25, 35, "c", &[5]),
    ];
    let v = leases_exclusive(&events, 60);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("lease a") && v[0].contains("lease b"),
        "{v:?}"
    );
}

#[test]
fn a_lease_ends_at_its_first_ack_or_its_expiry() {
    let acked = [
        delivered(0, 10, "a", &[0]),
        ack(15, "a"),
        ack(50, "a"),
        delivered(20, 30, "b", &[0]),
    ];
    assert!(leases_exclusive(&acked, 60).is_empty());
    let expired = [
        delivered(0, 10, "a", &[0]),
        delivered(2_000_000, 2_000_010, "b", &[0]),
    ];
    assert!(leases_exclusive(&expired, 1).is_empty());
}

/// An autoAck delivery (no lease) of pop `id`.
fn auto_delivered(id: u64, invoked: Micros, at: Micros, offsets: &[i64]) -> Event {
    match delivered(invoked, at, "", offsets) {
        Event::Delivered {
            consumer,
            group,
            partition,
            lease,
            attempt,
            msgs,
            ..
        } => Event::Delivered {
            invoked,
            at,
            id,
            consumer,
            group,
            partition,
            lease,
            auto_ack: true,
            attempt,
            msgs,
        },
        other => other,
    }
}

fn acked(at: Micros, lease: &str, last_offset: i64, failed: bool) -> Event {
    Event::AckSent {
        at,
        group: "g".into(),
        partition: "p".into(),
        lease: lease.into(),
        last_offset,
        failed,
    }
}

fn dead_letter(offset: i64, filed_at: Micros) -> DeadLettered {
    DeadLettered {
        group: "g".into(),
        partition: "p".into(),
        offset,
        filed_at,
    }
}

/// A failed ack whose first message was dead-lettered consumed its batch; one that was not
/// (its message comes again) consumed nothing, so a delivery past it is a skip.
#[test]
fn a_failed_ack_consumes_its_batch_only_when_it_dead_lettered() {
    let events = [
        delivered(0, 10, "a", &[0, 1, 2]),
        acked(10, "a", 2, true),
        delivered(20, 30, "b", &[0, 1, 2, 3]),
        acked(30, "b", 3, true),
        delivered(40, 50, "c", &[4]),
    ];
    assert!(no_skips(&events, &[], &[dead_letter(0, 31)]).is_empty());
    let v = no_skips(&events, &[], &[]);
    assert_eq!(v, ["skip: g got p from offset 4 with only -1 consumed"]);
    // Filed by the first failed ack (sent at 10, filed at 11), not by the second.
    let v = no_skips(&events, &[], &[dead_letter(0, 11)]);
    assert_eq!(v, ["skip: g got p from offset 4 with only 2 consumed"]);
}

/// An autoAck pop whose answer was lost may have taken one run of messages: it excuses one
/// gap of its group after it, not two, and none before it.
#[test]
fn a_lost_auto_ack_pop_excuses_one_gap() {
    let auto = |id: u64, at: Micros, offsets: &[i64]| auto_delivered(id, at, at, offsets);
    let lost = Event::PopInvoked {
        at: 15,
        consumer: "c".into(),
        group: "g".into(),
        id: 99,
    };
    let events = [
        auto(1, 10, &[0]),
        lost,
        auto(2, 20, &[3]),
        auto(3, 30, &[6]),
    ];
    let v = no_skips(&events, &[], &[]);
    assert_eq!(v, ["skip: g got p from offset 6 with only 3 consumed"]);
}

/// Two autoAck pops in flight at once may answer in another order than they took their runs:
/// the later run answered first is no skip when the earlier run's pop was invoked before that
/// answer, and is one when nobody took the gap.
#[test]
fn auto_ack_runs_answered_out_of_order_are_no_skip() {
    let auto =
        |invoked: Micros, at: Micros, offsets: &[i64]| auto_delivered(0, invoked, at, offsets);
    let reordered = [auto(0, 10, &[0]), auto(5, 20, &[3]), auto(15, 30, &[1, 2])];
    assert!(no_skips(&reordered, &[], &[]).is_empty());
    let taken_later = [auto(0, 10, &[0]), auto(5, 20, &[3]), auto(25, 30, &[1, 2])];
    assert_eq!(
        no_skips(&taken_later, &[], &[]),
        ["skip: g got p from offset 3 with only 0 consumed"]
    );
}

/// A failed ack whose failed message retention removed before the next delivery answered
/// consumed its batch (a removed message is no barrier); one removed only later did not.
#[test]
fn a_failed_ack_of_a_removed_message_consumes_its_batch() {
    let events = [
        delivered(0, 10, "a", &[0, 1, 2]),
        acked(10, "a", 2, true),
        delivered(40, 50, "b", &[3]),
    ];
    let removal = |committed_at: Micros| Removal {
        partition: "p".into(),
        base: 0,
        end: 0,
        expired: true,
        txids: vec!["t0".into()],
        committed_at,
    };
    assert!(no_skips(&events, &[removal(20)], &[]).is_empty());
    assert_eq!(
        no_skips(&events, &[removal(60)], &[]),
        ["skip: g got p from offset 3 with only -1 consumed"]
    );
}
