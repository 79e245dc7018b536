//! The conflating group's checker: what the faults scenario's conflating consumers saw, held
//! against the partitions' heads at the end of the run. The consumers pop with `conflation=true`
//! through either broker under the fault schedule, and now and then die holding a delivery (no
//! ack: its lease must bring it back).
//!
//! Verdicts, each naming what it saw:
//! - every answer says `conflation: true` and carries at most one message a partition;
//! - no newer message is retired unseen: every partition's newest message at the end was
//!   delivered and acked (an ack was sent; its answer may have been lost) by a consumer. The
//!   cursor passes older messages unseen by design, never the newest.

use std::collections::{BTreeMap, BTreeSet};

/// What a conflating consumer saw or did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConflationSeen {
    /// An answer, as (partition, offset) of its messages; `echoed`: it said `conflation: true`.
    Answer {
        messages: Vec<(String, i64)>,
        echoed: bool,
    },
    /// An ack sent for a delivered message (its answer may have been lost).
    AckSent { partition: String, offset: i64 },
}

/// The verdicts (empty: every rule held). `heads`: each partition's newest offset at the end.
pub fn check(seen: &[ConflationSeen], heads: &BTreeMap<String, i64>) -> Vec<String> {
    let mut out = vec![];
    let mut acked: BTreeSet<(&str, i64)> = BTreeSet::new();
    for s in seen {
        match s {
            ConflationSeen::Answer { messages, echoed } => {
                if !echoed {
                    out.push(format!(
                        "conflation: an answer of a conflating group without the echo: {messages:?}"
                    ));
                }
                let mut per_partition: BTreeMap<&str, usize> = BTreeMap::new();
                for (p, _) in messages {
                    *per_partition.entry(p).or_default() += 1;
                }
                if per_partition.values().any(|n| *n > 1) {
                    out.push(format!(
                        "conflation: an answer carried more than the newest of a partition: \
                         {messages:?}"
                    ));
                }
            }
            ConflationSeen::AckSent { partition, offset } => {
                acked.insert((partition, *offset));
            }
        }
    }
    for (partition, head) in heads {
        if !acked.contains(&(partition.as_str(), *head)) {
            out.push(format!(
                "conflation: the newest message of {partition} (offset {head}) was retired \
                 without being processed"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(messages: &[(&str, i64)]) -> ConflationSeen {
        ConflationSeen::Answer {
            messages: messages.iter().map(|(p, o)| (p.to_string(), *o)).collect(),
            echoed: true,
        }
    }

    fn ack(p: &str, offset: i64) -> ConflationSeen {
        ConflationSeen::AckSent {
            partition: p.into(),
            offset,
        }
    }

    #[test]
    fn the_newest_must_be_processed_and_answers_carry_one_a_partition() {
        let heads = BTreeMap::from([("a".to_string(), 9), ("b".to_string(), 4)]);
        let good = [
            answer(&[("a", 3), ("b", 4)]),
            ack("a", 3),
            ack("b", 4),
            answer(&[("a", 9)]),
            ack("a", 9),
        ];
        assert!(check(&good, &heads).is_empty());
        // The newest of a was delivered and never acked (its holder died, and nothing brought
        // it back).
        let lost = [answer(&[("a", 9), ("b", 4)]), ack("b", 4)];
        assert_eq!(check(&lost, &heads).len(), 1);
        let two = [answer(&[("a", 8), ("a", 9)]), ack("a", 9), ack("b", 4)];
        assert_eq!(check(&two, &heads).len(), 1);
        let mute = [
            ConflationSeen::Answer {
                messages: vec![],
                echoed: false,
            },
            ack("a", 9),
            ack("b", 4),
        ];
        assert_eq!(check(&mute, &heads).len(), 1);
    }
}
