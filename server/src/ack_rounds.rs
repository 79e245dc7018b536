//! Whole-batch acks sent to storage in rounds. While one round's statement is in flight, the
//! whole-batch acks that arrive wait, of whatever group or lease, and the next round sends them
//! all in one `ack_batch_ends_many` call. A push read by many groups is acked by each of them
//! at nearly the same moment, so at 10 groups a round holds several acks where each was a
//! statement of its own (docs/benchmarks.md, "Scale, sixth look"). An ack arriving while
//! nothing is in flight goes at once: a round never waits for company.
//!
//! Rounds run in a task of their own, not in the request that started them: a client that
//! leaves mid-round must not cancel the others' acks, nor leave the rounds stopped.

use std::sync::{Arc, Mutex};

use queen_core::storage::{LeaseBatchEnds, MessageStorage, StorageError, StorageResult};
use tokio::sync::oneshot;

use crate::app::lock;

type Reply = oneshot::Sender<StorageResult<Vec<String>>>;

/// Leases per round at most: one statement's locks and parameters stay bounded when a burst of
/// acks piles up behind a slow round; the rest go in the rounds after it, oldest first.
const MAX_LEASES_PER_ROUND: usize = 256;

#[derive(Default)]
pub(crate) struct AckRounds {
    state: Mutex<RoundState>,
}

#[derive(Default)]
struct RoundState {
    /// A round task is running; it takes `waiting` until it finds it empty.
    running: bool,
    waiting: Vec<(LeaseBatchEnds, Reply)>,
}

impl AckRounds {
    /// Commits one lease's whole batches in the next round: its committed partition ids.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        storage: &Arc<dyn MessageStorage>,
        lease: LeaseBatchEnds,
    ) -> StorageResult<Vec<String>> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = lock(&self.state);
            state.waiting.push((lease, reply));
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            tokio::spawn(self.clone().run(storage.clone()));
        }
        answer.await.map_err(|_| {
            StorageError::Internal("the whole-batch ack round ended without an answer".into())
        })?
    }

    /// Sends rounds until nothing waits. `running` is cleared under the same lock that finds the
    /// queue empty, so an ack queued after that starts a task of its own: none is left waiting.
    async fn run(self: Arc<Self>, storage: Arc<dyn MessageStorage>) {
        // A round that panics drops its replies (their requests answer an error) and this guard
        // clears `running`, so the next ack starts a new task rather than waiting for ever.
        let _running = ClearOnDrop(&self.state);
        loop {
            let round = {
                let mut state = lock(&self.state);
                if state.waiting.is_empty() {
                    state.running = false;
                    return;
                }
                let take = state.waiting.len().min(MAX_LEASES_PER_ROUND);
                state.waiting.drain(..take).collect::<Vec<_>>()
            };
            let (leases, replies): (Vec<LeaseBatchEnds>, Vec<Reply>) = round.into_iter().unzip();
            match storage.ack_batch_ends_many(&leases).await {
                Ok(answers) if answers.len() == replies.len() => {
                    for (reply, committed) in replies.into_iter().zip(answers) {
                        let _ = reply.send(Ok(committed));
                    }
                }
                Ok(answers) => {
                    let e = StorageError::Internal(format!(
                        "whole-batch acks of {} leases answered {}",
                        replies.len(),
                        answers.len()
                    ));
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

struct ClearOnDrop<'a>(&'a Mutex<RoundState>);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = lock(self.0);
            state.running = false;
            state.waiting.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code

    use super::*;
    use async_trait::async_trait;
    use queen_core::storage::{AckItem, AckOutcome, BatchEnd, PushGroup, PushGroupResult};
    use queen_core::storage::{RenewOutcome, StorageResult};
    use queen_core::{Timestamp, WorkerId};

    /// Answers each lease with its own partition ids, counting calls; the first call waits
    /// until `release` opens, so acks pile up behind it.
    struct Counting {
        calls: Mutex<Vec<usize>>,
        /// Each call's first lease's group.
        firsts: Mutex<Vec<String>>,
        release: tokio::sync::Semaphore,
    }

    #[async_trait]
    impl MessageStorage for Counting {
        async fn push_accepted_at(
            &self,
            _: Vec<PushGroup>,
            _: Option<Timestamp>,
        ) -> StorageResult<Vec<PushGroupResult>> {
            unreachable!("the rounds only commit whole batches")
        }
        async fn ack(&self, _: &str, _: Vec<AckItem>) -> StorageResult<Vec<AckOutcome>> {
            unreachable!("the rounds only commit whole batches")
        }
        async fn ack_batch_ends_many(
            &self,
            leases: &[LeaseBatchEnds],
        ) -> StorageResult<Vec<Vec<String>>> {
            let first = {
                let mut calls = lock(&self.calls);
                calls.push(leases.len());
                lock(&self.firsts).push(leases[0].group.clone());
                calls.len() == 1
            };
            if first {
                let _permit = self.release.acquire().await.expect("open");
            }
            Ok(leases
                .iter()
                .map(|l| l.batches.iter().map(|b| b.partition_id.clone()).collect())
                .collect())
        }
        async fn renew_lease(&self, _: &str, _: u32) -> StorageResult<RenewOutcome> {
            unreachable!("the rounds only commit whole batches")
        }
    }

    fn lease(i: usize) -> LeaseBatchEnds {
        LeaseBatchEnds {
            group: format!("g{i}"),
            lease: WorkerId(uuid::Uuid::from_u128(i as u128 + 1)),
            batches: vec![BatchEnd {
                partition_id: format!("p{i}"),
                end_offset: 9,
                first_transaction_id: "t".into(),
            }],
        }
    }

    /// The round task sends its last replies before it finds the queue empty and stops: it stops
    /// soon after the last answer, not before it.
    async fn assert_rounds_stop(rounds: &AckRounds) {
        for _ in 0..10_000 {
            if !lock(&rounds.state).running {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("the round task kept running with nothing queued");
    }

    /// Holds a first round (one ack) in storage, queues `piled` acks behind it one after
    /// another, releases the round and checks every answer: the storage's record of the calls.
    async fn piled_behind_a_held_round(piled: usize) -> Arc<Counting> {
        let counting = Arc::new(Counting {
            calls: Mutex::new(vec![]),
            firsts: Mutex::new(vec![]),
            release: tokio::sync::Semaphore::new(0),
        });
        let storage: Arc<dyn MessageStorage> = counting.clone();
        let rounds = Arc::new(AckRounds::default());
        let first = tokio::spawn({
            let (rounds, storage) = (rounds.clone(), storage.clone());
            async move { rounds.commit(&storage, lease(0)).await }
        });
        while lock(&counting.calls).is_empty() {
            tokio::task::yield_now().await;
        }
        let mut rest = vec![];
        for i in 1..=piled {
            let (round, storage) = (rounds.clone(), storage.clone());
            rest.push(tokio::spawn(async move {
                round.commit(&storage, lease(i)).await
            }));
            while lock(&rounds.state).waiting.len() < i {
                tokio::task::yield_now().await;
            }
        }
        counting.release.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), vec!["p0".to_string()]);
        for (i, r) in rest.into_iter().enumerate() {
            assert_eq!(r.await.unwrap().unwrap(), vec![format!("p{}", i + 1)]);
        }
        assert_rounds_stop(&rounds).await;
        counting
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acks_arriving_during_a_round_go_together_in_the_next() {
        let counting = piled_behind_a_held_round(9).await;
        assert_eq!(*lock(&counting.calls), vec![1, 9], "one round for the nine");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pile_of_acks_goes_in_bounded_rounds_oldest_first() {
        let counting = piled_behind_a_held_round(MAX_LEASES_PER_ROUND + 44).await;
        assert_eq!(*lock(&counting.calls), vec![1, MAX_LEASES_PER_ROUND, 44]);
        let second_round_starts = format!("g{}", MAX_LEASES_PER_ROUND + 1);
        assert_eq!(
            *lock(&counting.firsts),
            vec!["g0", "g1", &second_round_starts]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_ack_is_answered_under_contention() {
        let counting = Arc::new(Counting {
            calls: Mutex::new(vec![]),
            firsts: Mutex::new(vec![]),
            release: tokio::sync::Semaphore::new(1),
        });
        let storage: Arc<dyn MessageStorage> = counting.clone();
        let rounds = Arc::new(AckRounds::default());
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (rounds, storage) = (rounds.clone(), storage.clone());
                tokio::spawn(async move {
                    for k in 0..500 {
                        let i = t * 1000 + k;
                        let got = rounds.commit(&storage, lease(i)).await.unwrap();
                        assert_eq!(got, vec![format!("p{i}")]);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(lock(&counting.calls).iter().sum::<usize>(), 4000);
        assert_rounds_stop(&rounds).await;
    }
}
