//! The ephemeral queues' checkers. Both brokers of the faults and prompt scenarios share their
//! ephemeral queues (one owner a queue, the other forwarding over the simulated network), and the
//! clients call either broker.
//!
//! The faults scenario's verdicts, over what its ephemeral clients saw (times are simulated
//! microseconds; a call was served somewhere between its sending and its answer):
//! - **answers**: every ephemeral call that got an answer got a 200, or a 503 while its queue's
//!   owner was out of reach; never a 404, a 429 (the queue drops its oldest), or a 500;
//! - **one ring at a time** (the ownership fence): once another ring of the queue has served,
//!   a ring that served before it never serves again (ids name their ring: incarnation and
//!   generation);
//! - **no double hand-out**: a message of a ring is not handed to a group again while a delivery
//!   of it is leased (within the lease of the pop that took it, unless a `failed` ack of that
//!   delivery was sent first);
//! - **FIFO**: per (ring, group, partition), a first delivery (attempt 1) served after another
//!   carries a later message, where the later message's push was answered before the earlier
//!   message's push was sent (pushes whose outcome the producer did not know are not ordered).
//!
//! The prompt scenario holds its parked ephemeral consumers to the delivery bound with the same
//! stall checker as the durable queues (`Liveness`), over `Tally`: what was pushed and answered,
//! per partition, against what each group received.

use std::collections::{BTreeMap, BTreeSet};

use super::Deliverable;

/// One push the producer sent: messages numbered `first..first + count` to `partition`.
#[derive(Clone, Debug)]
pub struct PushSent {
    pub partition: String,
    pub first: u64,
    pub count: u64,
    pub sent: i64,
    /// When its 200 came back (`None`: no answer, or another status).
    pub stored: Option<i64>,
}

/// One message a consumer received.
#[derive(Clone, Debug)]
pub struct Received {
    pub consumer: String,
    pub group: String,
    pub id: String,
    pub partition: String,
    pub attempts: u64,
    /// The producer's number for the message.
    pub n: u64,
    /// When the pop that brought it was sent, and when its answer came.
    pub sent: i64,
    pub at: i64,
}

/// What the ephemeral clients saw and did, in the order it happened.
#[derive(Debug, Default)]
pub struct Log {
    pub pushes: Vec<PushSent>,
    pub received: Vec<Received>,
    /// `failed` acks: (group, id, sent at).
    pub failed_acks: Vec<(String, String, i64)>,
    /// Answers other than 200 and 503: (call, status).
    pub odd_answers: Vec<(String, u16)>,
    /// 503 answers: an owner out of reach or moving.
    pub unavailable: u64,
}

/// (ring, partition, seq) as a delivery id names them: `inc.gen.partition.seq.attempt`.
pub fn id_parts(id: &str) -> Option<MessageKey> {
    let p: Vec<&str> = id.split('.').collect();
    (p.len() == 5).then(|| {
        (
            format!("{}.{}", p[0], p[1]),
            p[2].to_string(),
            p[3].to_string(),
        )
    })
}

/// The faults scenario's verdicts; `lease_us`: the queue's lease.
pub fn check(log: &Log, lease_us: i64) -> Vec<String> {
    let mut out: Vec<String> = log
        .odd_answers
        .iter()
        .map(|(call, status)| format!("ephemeral: {call} answered {status}"))
        .collect();
    let mut parsed = vec![];
    for r in &log.received {
        match id_parts(&r.id) {
            Some(parts) => parsed.push((parts, r)),
            None => out.push(format!(
                "ephemeral: {} received an id that is not one: {}",
                r.consumer, r.id
            )),
        }
    }
    out.extend(one_ring_at_a_time(&parsed));
    out.extend(no_double_hand_out(&parsed, &log.failed_acks, lease_us));
    out.extend(first_deliveries_in_push_order(&parsed, &log.pushes));
    out
}

/// (ring, partition, seq): one message of one ring.
type MessageKey = (String, String, String);
type Parsed<'a> = (MessageKey, &'a Received);

/// A ring that served, then another, then the first again: two owners served one queue.
fn one_ring_at_a_time(parsed: &[Parsed<'_>]) -> Vec<String> {
    // Per ring: its earliest answer (it served before then) and the latest sending of a pop it
    // answered (it served after then).
    let mut span: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for ((ring, _, _), r) in parsed {
        let s = span.entry(ring.as_str()).or_insert((r.at, r.sent));
        s.0 = s.0.min(r.at);
        s.1 = s.1.max(r.sent);
    }
    let mut out = vec![];
    for (a, (a_first_answer, a_last_sent)) in &span {
        // Another ring served in between: a delivery of it sent after a's first answer and
        // answered before a's last pop was sent.
        if let Some(((b, _, _), r)) = parsed.iter().find(|((b, _, _), r)| {
            b.as_str() != *a && r.sent > *a_first_answer && r.at < *a_last_sent
        }) {
            out.push(format!(
                "ephemeral: ring {a} served (answered by {} ms), then ring {b} served ({} received \
                 {} between {} and {} ms), then ring {a} again (a pop sent at {} ms): two owners",
                a_first_answer / 1000,
                r.consumer,
                r.id,
                r.sent / 1000,
                r.at / 1000,
                a_last_sent / 1000
            ));
        }
    }
    out
}

/// A message handed to a group again while an earlier delivery of it was surely still leased.
/// Each hand-out of a message has the next attempt number, so the attempts order them: a
/// delivery of attempt k was handed out after its pop was sent, and attempt k + 1 no sooner than
/// a lease later (or once a `failed` ack of attempt k returned it).
fn no_double_hand_out(
    parsed: &[Parsed<'_>],
    failed_acks: &[(String, String, i64)],
    lease_us: i64,
) -> Vec<String> {
    let mut by_message: BTreeMap<(&str, &MessageKey), Vec<&Received>> = BTreeMap::new();
    for (key, r) in parsed {
        by_message
            .entry((r.group.as_str(), key))
            .or_default()
            .push(r);
    }
    let failed: BTreeMap<(&str, &str), i64> = failed_acks
        .iter()
        .map(|(g, id, at)| ((g.as_str(), id.as_str()), *at))
        .collect();
    let mut out = vec![];
    for ((group, _), deliveries) in by_message {
        for (i, first) in deliveries.iter().enumerate() {
            for second in &deliveries[i + 1..] {
                let (earlier, later) = if second.attempts < first.attempts {
                    (*second, *first)
                } else {
                    (*first, *second)
                };
                if earlier.attempts == later.attempts {
                    out.push(format!(
                        "ephemeral: {} handed to {group} twice ({} at {} ms, {} at {} ms)",
                        earlier.id,
                        earlier.consumer,
                        earlier.at / 1000,
                        later.consumer,
                        later.at / 1000
                    ));
                    continue;
                }
                let leased_until = earlier.sent + lease_us;
                let returned = failed
                    .get(&(group, earlier.id.as_str()))
                    .is_some_and(|t| *t < later.at);
                if later.at < leased_until && !returned {
                    out.push(format!(
                        "ephemeral: {} handed to {group} ({}, answered at {} ms) while {} ({}, \
                         popped at {} ms) was leased until at least {} ms",
                        later.id,
                        later.consumer,
                        later.at / 1000,
                        earlier.id,
                        earlier.consumer,
                        earlier.sent / 1000,
                        leased_until / 1000
                    ));
                }
            }
        }
    }
    out
}

/// Per (ring, group, partition): a first delivery known to be served after another carries a
/// later message, when the two messages' pushes are known to be in that order.
fn first_deliveries_in_push_order(parsed: &[Parsed<'_>], pushes: &[PushSent]) -> Vec<String> {
    // Each message number's push: (sent, stored).
    let mut push_of: BTreeMap<u64, (i64, Option<i64>)> = BTreeMap::new();
    for p in pushes {
        for n in p.first..p.first + p.count {
            push_of.insert(n, (p.sent, p.stored));
        }
    }
    let mut lanes: BTreeMap<(&str, &str, &str), Vec<&Received>> = BTreeMap::new();
    for ((ring, partition, _), r) in parsed.iter().filter(|(_, r)| r.attempts == 1) {
        lanes
            .entry((ring.as_str(), r.group.as_str(), partition.as_str()))
            .or_default()
            .push(r);
    }
    let mut out = vec![];
    let mut reported: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
    for (lane, firsts) in &lanes {
        for a in firsts {
            for b in firsts {
                // a surely served before b, yet b carries an earlier message that was stored
                // before a's message was even sent.
                let ordered_pushes = match (push_of.get(&b.n), push_of.get(&a.n)) {
                    (Some((_, Some(b_stored))), Some((a_sent, _))) => b_stored < a_sent,
                    _ => false,
                };
                if a.at < b.sent && ordered_pushes && reported.insert(*lane) {
                    out.push(format!(
                        "ephemeral: FIFO broken in {lane:?}: message {} ({}, answered at {} ms) \
                         before message {} ({}, sent at {} ms), pushed in the other order",
                        a.n,
                        a.id,
                        a.at / 1000,
                        b.n,
                        b.id,
                        b.sent / 1000
                    ));
                }
            }
        }
    }
    out
}

/// The prompt scenario's view for the delivery bound: messages pushed (answered) per partition,
/// against those each group received. Every group's consumers commit on delivery and the
/// brokers neither crash nor lose their reach, so each message reaches each group once.
pub struct Tally {
    pub partitions: Vec<String>,
    pub stored: BTreeMap<String, u64>,
    pub received: BTreeMap<(String, String), u64>,
}

impl Deliverable for Tally {
    fn partitions(&self, _queue: &str) -> Vec<String> {
        self.partitions.clone()
    }

    fn open(&self, _queue: &str, partition: &str, group: &str) -> bool {
        let stored = self.stored.get(partition).copied().unwrap_or(0);
        let received = self
            .received
            .get(&(group.to_string(), partition.to_string()))
            .copied()
            .unwrap_or(0);
        stored > received
    }

    fn describe(&self, _queue: &str, partition: &str, group: &str) -> String {
        format!(
            "{partition}: {} stored, {} received by {group}",
            self.stored.get(partition).copied().unwrap_or(0),
            self.received
                .get(&(group.to_string(), partition.to_string()))
                .copied()
                .unwrap_or(0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn got(consumer: &str, id: &str, n: u64, sent_ms: i64, at_ms: i64) -> Received {
        Received {
            consumer: consumer.into(),
            group: "g".into(),
            id: id.into(),
            partition: "e0".into(),
            attempts: id
                .rsplit('.')
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(1),
            n,
            sent: sent_ms * 1000,
            at: at_ms * 1000,
        }
    }

    fn pushed(first: u64, count: u64, sent_ms: i64, stored_ms: i64) -> PushSent {
        PushSent {
            partition: "e0".into(),
            first,
            count,
            sent: sent_ms * 1000,
            stored: Some(stored_ms * 1000),
        }
    }

    #[test]
    fn a_run_that_kept_every_rule_passes() {
        let log = Log {
            pushes: vec![pushed(0, 2, 0, 5), pushed(2, 1, 10, 15)],
            received: vec![
                got("c0", "7.1.0.1.1", 0, 20, 25),
                // The lease ran out: attempt 2 to another consumer, then the next message.
                got("c1", "7.1.0.1.2", 0, 2_030, 2_040),
                got("c1", "7.1.0.2.1", 1, 2_050, 2_055),
                // The owner moved: a new ring serves from then on.
                got("c0", "9.1.0.1.1", 2, 6_000, 6_010),
            ],
            ..Log::default()
        };
        assert_eq!(check(&log, 2_000_000), Vec::<String>::new());
    }

    #[test]
    fn each_rule_catches_its_break() {
        let two_owners = Log {
            received: vec![
                got("c0", "7.1.0.1.1", 0, 0, 5),
                got("c1", "9.1.0.1.1", 1, 10, 15),
                got("c0", "7.1.0.2.1", 2, 20, 25),
            ],
            ..Log::default()
        };
        assert!(check(&two_owners, 2_000_000)[0].contains("two owners"));
        let leased_twice = Log {
            received: vec![
                got("c0", "7.1.0.1.1", 0, 0, 5),
                got("c1", "7.1.0.1.2", 0, 300, 305),
            ],
            ..Log::default()
        };
        assert!(check(&leased_twice, 2_000_000)[0].contains("was leased"));
        let returned = Log {
            failed_acks: vec![("g".into(), "7.1.0.1.1".into(), 100)],
            ..leased_twice
        };
        assert_eq!(check(&returned, 2_000_000), Vec::<String>::new());
        let reordered = Log {
            pushes: vec![pushed(0, 1, 0, 5), pushed(1, 1, 10, 15)],
            received: vec![
                got("c0", "7.1.0.2.1", 1, 20, 25),
                got("c1", "7.1.0.1.1", 0, 30, 35),
            ],
            ..Log::default()
        };
        assert!(check(&reordered, 2_000_000)[0].contains("FIFO"));
        let odd = Log {
            odd_answers: vec![("pop".into(), 500)],
            ..Log::default()
        };
        assert_eq!(check(&odd, 2_000_000), vec!["ephemeral: pop answered 500"]);
    }
}
