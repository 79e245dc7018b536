//! Storage calls sent in rounds. Calls that share a key take turns: while a round of a key is in
//! flight, the calls of that key that arrive wait, and the next round sends them all in one
//! statement. Whole-batch acks all share one key, of whatever group or lease; ring pops share
//! the key of the partition they reach for first. A push read by many groups is acked by each
//! at nearly the same moment, and wakes a pop of each for the pushed partition: at 10 groups a
//! round holds several acks or pops where each was a statement of its own, and the pops of one
//! partition no longer contend for its pages from as many backends at once (docs/benchmarks.md,
//! "Scale, sixth look" for acks, "tenth look" for pops). Pops of different partitions (many
//! consumers of one group) never wait for each other. A call arriving while its key has fewer
//! rounds than the limit in flight goes at once: a round never waits for company on a timer, it
//! only lets the calls woken with it catch up (`COMPANY_YIELDS`).
//!
//! Rounds run in tasks of their own, not in the request that started them: a client that leaves
//! mid-round must not cancel the others' calls, nor leave the rounds stopped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use queen_core::storage::{
    LeaseBatchEnds, MessageStorage, PopRequest, PopResult, PopStorage, PushGroup, PushGroupResult,
    PushOutcome, StorageError, StorageResult,
};
use tokio::sync::oneshot;

use crate::helpers::lock;

type Reply<A> = oneshot::Sender<StorageResult<A>>;

/// Sends one round: an answer per call, in order.
type SendRound<T, A> =
    Box<dyn Fn(Vec<T>) -> BoxFuture<'static, Vec<StorageResult<A>>> + Send + Sync>;

/// Scheduler turns a new round task yields before its first round. Without them the task, spawned
/// by the call that found its key idle, ran ahead of the other calls woken by the same event
/// (tokio runs a task spawned by the running one next), so a round of the 10-group fan-out held
/// 2.3 pops on average; with four, 5-7, and the fan-out's pop statements took half the
/// database time (docs/benchmarks.md, "Scale, eleventh look"). Sixteen gathered no more.
pub const COMPANY_YIELDS: usize = 4;

/// Calls per round at most: one statement's locks and parameters stay bounded when a burst piles
/// up behind a slow round; the rest go in the rounds after it, oldest first.
pub(crate) const MAX_CALLS_PER_ROUND: usize = 256;

/// Historical bugs of the rounds a simulation may switch back on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundsBugs {
    /// After a round that was not full, its task leaves without looking for calls that arrived
    /// meanwhile: they saw a round in flight and started none, so they wait until the next call
    /// of their key starts one (a pop stranded until unrelated traffic comes).
    pub leave_without_looking_again: bool,
    /// A push round answers its last request as stored without sending it (a message the
    /// producer was told is queued is lost).
    pub push_round_drops_its_last_request: bool,
}

pub(crate) struct Rounds<K, T, A> {
    /// The keys with a round in flight, and their waiting calls.
    state: Mutex<BTreeMap<K, RoundState<T, A>>>,
    /// Rounds of one key in flight at most (each a task holding one connection).
    max_running: usize,
    key: fn(&T) -> K,
    /// Who a call is for, when two calls of one key for the same member gain nothing by taking
    /// turns (two pops of one group reaching for one partition: one of them finds it leased, and
    /// should find that out at once rather than after the other's round).
    member: fn(&T) -> Option<String>,
    send: SendRound<T, A>,
    bugs: RoundsBugs,
    /// Scheduler turns a new round task yields first (`COMPANY_YIELDS` but in a simulation).
    company_yields: usize,
}

struct RoundState<T, A> {
    /// Round tasks running; each takes from `waiting` until it finds it empty.
    running: usize,
    /// Each waiting call with its member, as `call` found it.
    waiting: VecDeque<(T, Option<String>, Reply<A>)>,
    /// Calls waiting or in a round, by member.
    members: BTreeMap<String, usize>,
}

/// Whole-batch acks: one round at a time (`ack_batch_ends_many`).
pub(crate) type AckRounds = Rounds<(), LeaseBatchEnds, Vec<String>>;

/// Pushes without an accepted time (`push_round`): all share one key.
pub(crate) type PushRounds = Rounds<(), Vec<PushGroup>, Vec<PushGroupResult>>;

/// `max_running`: push statements in flight at once; pushes arriving beyond them share the next
/// round's statement.
pub(crate) fn push_rounds(
    storage: Arc<dyn MessageStorage>,
    max_running: usize,
    company_yields: usize,
    bugs: RoundsBugs,
) -> PushRounds {
    Rounds::new(
        max_running,
        company_yields,
        bugs,
        |_| (),
        |_| None,
        Box::new(move |requests: Vec<Vec<PushGroup>>| {
            let storage = storage.clone();
            Box::pin(async move {
                let n = requests.len();
                if bugs.push_round_drops_its_last_request && n > 1 {
                    // The historical bug: the last request is answered as stored and never sent.
                    let mut requests = requests;
                    let dropped = requests.pop().unwrap_or_default();
                    let mut answers = storage.push_round(requests).await;
                    answers.push(Ok(dropped
                        .iter()
                        .map(|g| {
                            g.frames
                                .iter()
                                .map(|f| PushOutcome::Queued {
                                    message_id: f.message_id,
                                    partition_id: String::new(),
                                    offset: -1,
                                })
                                .collect()
                        })
                        .collect()));
                    return answers;
                }
                let answers = storage.push_round(requests).await;
                if answers.len() == n {
                    answers
                } else {
                    let e = StorageError::Internal(format!(
                        "a round of {n} pushes answered {}",
                        answers.len()
                    ));
                    (0..n).map(|_| Err(e.clone())).collect()
                }
            })
        }),
    )
}

/// Ring pops (`pop_list_many`), keyed by (queue, first candidate).
pub(crate) type PopRounds = Rounds<(String, String), (PopRequest, Vec<String>), PopResult>;

pub(crate) fn ack_rounds(
    storage: Arc<dyn MessageStorage>,
    company_yields: usize,
    bugs: RoundsBugs,
) -> AckRounds {
    Rounds::new(
        1,
        company_yields,
        bugs,
        |_| (),
        |_| None,
        Box::new(move |leases: Vec<LeaseBatchEnds>| {
            let storage = storage.clone();
            Box::pin(async move {
                let n = leases.len();
                match storage.ack_batch_ends_many(&leases).await {
                    Ok(answers) if answers.len() == n => answers.into_iter().map(Ok).collect(),
                    Ok(answers) => {
                        let e = StorageError::Internal(format!(
                            "whole-batch acks of {n} leases answered {}",
                            answers.len()
                        ));
                        vec![Err(e); n]
                    }
                    Err(e) => vec![Err(e); n],
                }
            })
        }),
    )
}

/// `max_running`: ring-pop statements in flight at once per (queue, first candidate); pops
/// arriving beyond them share the next round's statement.
pub(crate) fn pop_rounds(
    storage: Arc<dyn PopStorage>,
    max_running: usize,
    company_yields: usize,
    bugs: RoundsBugs,
) -> PopRounds {
    Rounds::new(
        max_running,
        company_yields,
        bugs,
        |(req, candidates)| {
            let first = candidates.first().cloned().unwrap_or_default();
            (req.queue.clone(), first)
        },
        |(req, _)| Some(req.group.clone()),
        Box::new(move |pops| {
            let storage = storage.clone();
            Box::pin(async move { storage.pop_list_many(pops).await })
        }),
    )
}

impl<K, T, A> Rounds<K, T, A>
where
    K: Ord + Clone + Send + 'static,
    T: Send + 'static,
    A: Send + 'static,
{
    fn new(
        max_running: usize,
        company_yields: usize,
        bugs: RoundsBugs,
        key: fn(&T) -> K,
        member: fn(&T) -> Option<String>,
        send: SendRound<T, A>,
    ) -> Self {
        assert!(max_running >= 1, "rounds need at least one in flight");
        Rounds {
            state: Mutex::new(BTreeMap::new()),
            max_running,
            key,
            member,
            send,
            bugs,
            company_yields,
        }
    }

    /// Sends one call in the next round of its key that has room, and waits for its answer.
    pub(crate) async fn call(self: &Arc<Self>, item: T) -> StorageResult<A> {
        let key = (self.key)(&item);
        let member = (self.member)(&item);
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = lock(&self.state);
            let present = match (&member, state.get(&key)) {
                (Some(m), Some(rounds)) => rounds.members.contains_key(m),
                _ => false,
            };
            if present {
                Err(item)
            } else {
                Ok(self.enqueue(&mut state, &key, member, item, reply))
            }
        };
        match start {
            Err(item) => return self.alone(item).await,
            Ok(true) => {
                tokio::spawn(self.clone().run(key));
            }
            Ok(false) => {}
        }
        answer
            .await
            .map_err(|_| StorageError::Internal("a storage round ended without an answer".into()))?
    }

    /// Queues a call under its key; true: it starts a round task of its own.
    fn enqueue(
        &self,
        state: &mut BTreeMap<K, RoundState<T, A>>,
        key: &K,
        member: Option<String>,
        item: T,
        reply: Reply<A>,
    ) -> bool {
        let rounds = state.entry(key.clone()).or_insert_with(|| RoundState {
            running: 0,
            waiting: VecDeque::new(),
            members: BTreeMap::new(),
        });
        if let Some(m) = &member {
            *rounds.members.entry(m.clone()).or_insert(0) += 1;
        }
        rounds.waiting.push_back((item, member, reply));
        let start = rounds.running < self.max_running;
        if start {
            rounds.running += 1;
        }
        start
    }

    /// One call in a statement of its own, beside the rounds.
    async fn alone(&self, item: T) -> StorageResult<A> {
        let mut answers = (self.send)(vec![item]).await;
        match (answers.pop(), answers.is_empty()) {
            (Some(answer), true) => answer,
            _ => Err(StorageError::Internal(
                "a storage call sent alone did not get one answer".into(),
            )),
        }
    }

    /// Sends rounds of one key until none of its calls waits. A task leaves (`running`
    /// decremented, the key dropped with the last) under the same lock that finds the queue
    /// empty, so a call queued after that starts a task of its own: none is left waiting.
    async fn run(self: Arc<Self>, key: K) {
        // A round that panics drops its replies (their requests answer an error) and this guard
        // gives up its place, so the next call starts a new task rather than waiting for ever.
        let _running = LeaveOnPanic(&self.state, key.clone());
        // Company: the tasks woken by the event that woke this round's first call (a push read by
        // ten groups wakes a pop of each) get to the queue before the first round goes. Turns of
        // the scheduler, not a timer: a call alone waits microseconds.
        for _ in 0..self.company_yields {
            tokio::task::yield_now().await;
        }
        loop {
            let round = {
                let mut state = lock(&self.state);
                let Some(rounds) = state.get_mut(&key) else {
                    unreachable!("a key stays while a round task of it runs");
                };
                if rounds.waiting.is_empty() {
                    rounds.running -= 1;
                    if rounds.running == 0 {
                        state.remove(&key);
                    }
                    return;
                }
                let take = rounds.waiting.len().min(MAX_CALLS_PER_ROUND);
                rounds.waiting.drain(..take).collect::<Vec<_>>()
            };
            let n = round.len();
            let mut items = Vec::with_capacity(n);
            let mut members = vec![];
            let mut replies = Vec::with_capacity(n);
            for (item, member, reply) in round {
                items.push(item);
                members.extend(member);
                replies.push(reply);
            }
            let answers = (self.send)(items).await;
            if !members.is_empty() {
                let mut state = lock(&self.state);
                if let Some(rounds) = state.get_mut(&key) {
                    for m in members {
                        if let Some(count) = rounds.members.get_mut(&m) {
                            *count -= 1;
                            if *count == 0 {
                                rounds.members.remove(&m);
                            }
                        }
                    }
                }
            }
            if answers.len() == n {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            } else {
                let e = StorageError::Internal(format!(
                    "a round of {n} storage calls answered {}",
                    answers.len()
                ));
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            if self.bugs.leave_without_looking_again && n < MAX_CALLS_PER_ROUND {
                let mut state = lock(&self.state);
                if let Some(rounds) = state.get_mut(&key) {
                    rounds.running -= 1;
                    if rounds.running == 0 && rounds.waiting.is_empty() {
                        state.remove(&key);
                    }
                }
                return;
            }
        }
    }
}

struct LeaveOnPanic<'a, K: Ord, T, A>(&'a Mutex<BTreeMap<K, RoundState<T, A>>>, K);

impl<K: Ord, T, A> Drop for LeaveOnPanic<'_, K, T, A> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = lock(self.0);
            let last = match state.get_mut(&self.1) {
                Some(rounds) => {
                    rounds.running -= 1;
                    rounds.running == 0
                }
                None => false,
            };
            if last {
                // No task is left to take them: their callers answer an error now.
                state.remove(&self.1);
            }
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

    fn waiting<K, T, A>(rounds: &Rounds<K, T, A>) -> usize {
        lock(&rounds.state).values().map(|r| r.waiting.len()).sum()
    }

    /// The round task sends its last replies before it finds the queue empty and stops: it stops
    /// soon after the last answer, not before it. A key whose calls wait with no round task to
    /// take them fails at once: nothing would ever answer them.
    async fn assert_rounds_stop<K, T, A>(rounds: &Rounds<K, T, A>) {
        for _ in 0..10_000 {
            {
                let state = lock(&rounds.state);
                if state.is_empty() {
                    return;
                }
                let stranded: usize = state
                    .values()
                    .filter(|r| r.running == 0)
                    .map(|r| r.waiting.len())
                    .sum();
                assert_eq!(
                    stranded, 0,
                    "calls left waiting with no round task to take them"
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("the round task kept running with nothing queued");
    }

    /// Holds a first round (one ack) in storage, queues `piled` acks behind it one after
    /// another, releases the round and checks every answer: the storage's record of the calls.
    async fn piled_behind_a_held_round(piled: usize, bugs: RoundsBugs) -> Arc<Counting> {
        let counting = Arc::new(Counting {
            calls: Mutex::new(vec![]),
            firsts: Mutex::new(vec![]),
            release: tokio::sync::Semaphore::new(0),
        });
        let storage: Arc<dyn MessageStorage> = counting.clone();
        let rounds = Arc::new(ack_rounds(storage.clone(), COMPANY_YIELDS, bugs));
        let first = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.call(lease(0)).await }
        });
        while lock(&counting.calls).is_empty() {
            tokio::task::yield_now().await;
        }
        let mut rest = vec![];
        for i in 1..=piled {
            let round = rounds.clone();
            rest.push(tokio::spawn(async move { round.call(lease(i)).await }));
            while waiting(&rounds) < i {
                tokio::task::yield_now().await;
            }
        }
        counting.release.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), vec!["p0".to_string()]);
        // Before awaiting the rest: a call stranded for good fails here rather than hanging.
        assert_rounds_stop(&rounds).await;
        for (i, r) in rest.into_iter().enumerate() {
            assert_eq!(r.await.unwrap().unwrap(), vec![format!("p{}", i + 1)]);
        }
        counting
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acks_arriving_during_a_round_go_together_in_the_next() {
        let counting = piled_behind_a_held_round(9, RoundsBugs::default()).await;
        assert_eq!(*lock(&counting.calls), vec![1, 9], "one round for the nine");
    }

    /// The switch that re-introduces a task leaving with calls queued is caught by the check
    /// above (the simulation catches it too: `every_mutation_switch_is_caught`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "calls left waiting with no round task")]
    async fn a_task_leaving_with_calls_queued_is_caught() {
        let bugs = RoundsBugs {
            leave_without_looking_again: true,
            ..RoundsBugs::default()
        };
        piled_behind_a_held_round(9, bugs).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pile_of_acks_goes_in_bounded_rounds_oldest_first() {
        let counting =
            piled_behind_a_held_round(MAX_CALLS_PER_ROUND + 44, RoundsBugs::default()).await;
        assert_eq!(*lock(&counting.calls), vec![1, MAX_CALLS_PER_ROUND, 44]);
        let second_round_starts = format!("g{}", MAX_CALLS_PER_ROUND + 1);
        assert_eq!(
            *lock(&counting.firsts),
            vec!["g0", "g1", &second_round_starts]
        );
    }

    /// Rounds of numbers answered with their doubles. Each round's size is recorded in `calls`,
    /// and as "{hundreds of its first}x{size}" in `firsts`; a round waits for a permit of
    /// `release` unless `free` says it need not.
    fn recording<K: Ord + Clone + Send + 'static>(
        max_running: usize,
        key: fn(&u32) -> K,
        member: fn(&u32) -> Option<String>,
        free: fn(&[u32]) -> bool,
    ) -> (Arc<Rounds<K, u32, u32>>, Arc<Counting>) {
        let counting = Arc::new(Counting {
            calls: Mutex::new(vec![]),
            firsts: Mutex::new(vec![]),
            release: tokio::sync::Semaphore::new(0),
        });
        let held = counting.clone();
        let rounds = Rounds::new(
            max_running,
            COMPANY_YIELDS,
            RoundsBugs::default(),
            key,
            member,
            Box::new(move |items: Vec<u32>| {
                let held = held.clone();
                Box::pin(async move {
                    lock(&held.firsts).push(format!("{}x{}", items[0] / 100, items.len()));
                    lock(&held.calls).push(items.len());
                    if !free(&items) {
                        held.release.acquire().await.expect("open").forget();
                    }
                    items.into_iter().map(|i| Ok(i * 2)).collect()
                })
            }),
        );
        (Arc::new(rounds), counting)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_go_alone_up_to_the_limit_in_flight_and_the_rest_together() {
        let (rounds, counting) = recording(2, |_| (), |_| None, |_| false);
        let mut answers = vec![];
        for i in 0..9u32 {
            let round = rounds.clone();
            answers.push(tokio::spawn(async move { round.call(i).await }));
            if i < 2 {
                // The first two each start a round of their own.
                while lock(&counting.calls).len() <= i as usize {
                    tokio::task::yield_now().await;
                }
            } else {
                while waiting(&rounds) < i as usize - 1 {
                    tokio::task::yield_now().await;
                }
            }
        }
        assert_eq!(
            lock(&rounds.state)[&()].running,
            2,
            "no more rounds than the limit"
        );
        counting.release.add_permits(3);
        for (i, a) in answers.into_iter().enumerate() {
            assert_eq!(a.await.unwrap().unwrap(), 2 * i as u32);
        }
        let mut calls = lock(&counting.calls).clone();
        calls[..2].sort_unstable();
        assert_eq!(
            calls,
            vec![1, 1, 7],
            "the seven that waited went in one round"
        );
        assert_rounds_stop(&rounds).await;
    }

    /// Calls that reach the rounds a few scheduler turns after the first (woken by the same event,
    /// each with a step of its own first, as a pop's permit) go in the first round with it. On
    /// one thread the order of turns is fixed, so the test is exact; with no company yields the
    /// first round holds the first call alone.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_a_few_turns_behind_the_first_join_its_round() {
        let (rounds, counting) = recording(1, |_| (), |_| None, |_| true);
        let first = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.call(0).await }
        });
        // Three turns behind (each of the others yields three times before its call).
        let behind: Vec<_> = (1..10u32)
            .map(|i| {
                let rounds = rounds.clone();
                tokio::spawn(async move {
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    rounds.call(i).await
                })
            })
            .collect();
        assert_eq!(first.await.unwrap().unwrap(), 0);
        for (i, b) in behind.into_iter().enumerate() {
            assert_eq!(b.await.unwrap().unwrap(), 2 * (i as u32 + 1));
        }
        assert_eq!(*lock(&counting.calls), vec![10], "one round for all ten");
        assert_rounds_stop(&rounds).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_of_different_keys_never_wait_for_each_other() {
        // Keyed by hundreds, as pops are by their first partition.
        let (rounds, counting) = recording(1, |i| *i / 100, |_| None, |_| false);
        let mut answers = vec![];
        for (n, i) in [0u32, 100, 200, 1, 2, 101].into_iter().enumerate() {
            let round = rounds.clone();
            answers.push(tokio::spawn(async move { round.call(i).await }));
            // Each key's first call (the first three) has its round in storage (held) before
            // the next call; a later call may wait behind its key's round instead.
            let queued = |rounds: &Rounds<_, _, _>| if n < 3 { 0 } else { waiting(rounds) };
            while lock(&counting.calls).len() + queued(&rounds) <= n {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(
            lock(&counting.calls).len(),
            3,
            "one round of each key at once"
        );
        counting.release.add_permits(5);
        for a in answers {
            a.await.unwrap().unwrap();
        }
        let mut rounds_seen = lock(&counting.firsts).clone();
        rounds_seen.sort();
        assert_eq!(rounds_seen, vec!["0x1", "0x2", "1x1", "1x1", "2x1"]);
        assert_rounds_stop(&rounds).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_whose_member_is_already_in_its_key_goes_alone_at_once() {
        // One key; the member is the number's parity (as a pop's group); 2's call is not held.
        let (rounds, counting) = recording(
            1,
            |_| (),
            |i| Some((i % 2).to_string()),
            |items| items == [2],
        );
        let first = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.call(0).await }
        });
        while lock(&counting.calls).is_empty() {
            tokio::task::yield_now().await;
        }
        let other_member = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.call(1).await }
        });
        while waiting(&rounds) < 1 {
            tokio::task::yield_now().await;
        }
        // Member 0 is in flight: 2 does not wait behind it (its call is not held).
        assert_eq!(rounds.call(2).await.unwrap(), 4);
        assert_eq!(waiting(&rounds), 1, "1 still waits for the round in flight");
        counting.release.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap(), 0);
        assert_eq!(other_member.await.unwrap().unwrap(), 2);
        assert_eq!(*lock(&counting.calls), vec![1, 1, 1]);
        assert_rounds_stop(&rounds).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_ack_is_answered_under_contention() {
        let counting = Arc::new(Counting {
            calls: Mutex::new(vec![]),
            firsts: Mutex::new(vec![]),
            release: tokio::sync::Semaphore::new(1),
        });
        let storage: Arc<dyn MessageStorage> = counting.clone();
        let rounds = Arc::new(ack_rounds(
            storage.clone(),
            COMPANY_YIELDS,
            RoundsBugs::default(),
        ));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let rounds = rounds.clone();
                tokio::spawn(async move {
                    for k in 0..500 {
                        let i = t * 1000 + k;
                        let got = rounds.call(lease(i)).await.unwrap();
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
