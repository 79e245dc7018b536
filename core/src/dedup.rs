//! De-duplication within one push request, the rule both backends share: in a (queue, partition)
//! group, the first item carrying a transactionId is the one stored (or refused); a later item
//! with the same transactionId answers the first one's outcome as a duplicate of it, or is
//! refused with it. (Duplicates of messages stored by earlier requests are storage's to find,
//! under the partition row's lock.)

use std::collections::BTreeMap;

use crate::frames::Frame;
use crate::storage::PushOutcome;

/// Which items of a push group are first occurrences of their transactionId.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstOccurrences {
    /// Per item, the index of the first item with its transactionId (itself for a first one).
    winner: Vec<usize>,
}

impl FirstOccurrences {
    pub fn of(frames: &[Frame]) -> Self {
        let mut first: BTreeMap<&str, usize> = BTreeMap::new();
        let winner = frames
            .iter()
            .enumerate()
            .map(|(k, f)| *first.entry(f.transaction_id.as_str()).or_insert(k))
            .collect();
        FirstOccurrences { winner }
    }

    /// Indices of the items storage must consider, in request order.
    pub fn firsts(&self) -> impl Iterator<Item = usize> + '_ {
        self.winner
            .iter()
            .enumerate()
            .filter(|(k, w)| k == *w)
            .map(|(k, _)| k)
    }

    /// The outcome of every item, given those of the first occurrences (`outcomes[k]` is set for
    /// every `k` of `firsts()`; repeats are `None`). `None` back: a first occurrence had no
    /// outcome, which is storage's bug to report.
    pub fn resolve(&self, mut outcomes: Vec<Option<PushOutcome>>) -> Option<Vec<PushOutcome>> {
        for (k, w) in self.winner.iter().enumerate() {
            if k != *w {
                outcomes[k] = Some(match outcomes[*w].as_ref()? {
                    refused @ PushOutcome::Rejected { .. } => refused.clone(),
                    stored => PushOutcome::Duplicate {
                        message_id: stored.message_id(),
                        partition_id: stored.partition_id().to_string(),
                    },
                });
            }
        }
        outcomes.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::QueueFull;

    fn frame(tx: &str, id: u128) -> Frame {
        Frame {
            producer: None,
            encrypted: false,
            message_id: uuid::Uuid::from_u128(id),
            transaction_id: tx.into(),
            trace_id: None,
            payload: vec![],
        }
    }

    fn queued(id: u128, offset: i64) -> PushOutcome {
        PushOutcome::Queued {
            message_id: uuid::Uuid::from_u128(id),
            partition_id: "p".into(),
            offset,
        }
    }

    #[test]
    fn a_repeat_answers_the_first_items_id() {
        let d = FirstOccurrences::of(&[frame("a", 1), frame("b", 2), frame("a", 3)]);
        assert_eq!(d.firsts().collect::<Vec<_>>(), vec![0, 1]);
        let out = d
            .resolve(vec![Some(queued(1, 0)), Some(queued(2, 1)), None])
            .expect("resolved");
        assert_eq!(
            out[2],
            PushOutcome::Duplicate {
                message_id: uuid::Uuid::from_u128(1),
                partition_id: "p".into()
            }
        );
    }

    #[test]
    fn a_repeat_of_a_refused_item_is_refused_with_it() {
        let d = FirstOccurrences::of(&[frame("a", 1), frame("a", 2)]);
        let refused = PushOutcome::Rejected {
            message_id: uuid::Uuid::from_u128(1),
            partition_id: "p".into(),
            full: QueueFull {
                queue: "q".into(),
                max_size: 1,
                backlog: 1,
            },
        };
        let out = d
            .resolve(vec![Some(refused.clone()), None])
            .expect("resolved");
        assert_eq!(out, vec![refused.clone(), refused]);
    }

    #[test]
    fn a_missing_first_outcome_is_reported() {
        let d = FirstOccurrences::of(&[frame("a", 1), frame("a", 2)]);
        assert_eq!(d.resolve(vec![None, None]), None);
    }
}
