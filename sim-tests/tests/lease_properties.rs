//! Property tests of lease semantics: random sequences of push, pop (three shapes, leased or
//! autoAck, several consumers and groups), ack (completed/failed, fenced or not, mixed batches),
//! lease expiry (clock advance), renewal and retention, applied to the model backend and
//! checked step by step against a small reference model that predicts every answer exactly.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use queen_core::storage::{AdminStorage, MessageStorage, PopStorage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use queen_core::claim::SubscriptionIntent;
use queen_core::frames::Frame;
use queen_core::storage::{
    AckItem, AckStatus, PopRequest, PopResult, PushGroup, QueueConfig, Verdict,
};
use queen_core::{Offset, Timestamp, WorkerId};
use queen_sim_tests::fixtures::{block_on, messages};
use queen_storage_sim::{ManualClock, SimBugs, SimDb};

const PARTS: [&str; 3] = ["p0", "p1", "p2"];
const GROUPS: [&str; 2] = ["__QUEUE_MODE__", "g1"];
const LEASE_SECS: i64 = 10;
const RETRY_LIMIT: u32 = 1;
const T0: Timestamp = Timestamp(1_700_000_000_000_000);

/// How often each interesting thing happened across all cases (a property that never meets
/// its situation proves nothing).
#[derive(Default)]
struct Coverage {
    transitions: AtomicU64,
    leased_deliveries: AtomicU64,
    auto_ack_deliveries: AtomicU64,
    redeliveries: AtomicU64,
    acks_accepted: AtomicU64,
    acks_refused: AtomicU64,
    lease_releases: AtomicU64,
    dead_letters: AtomicU64,
    retentions: AtomicU64,
    deferred: AtomicU64,
    leased_elsewhere: AtomicU64,
}

static COVERAGE: Coverage = Coverage {
    transitions: AtomicU64::new(0),
    leased_deliveries: AtomicU64::new(0),
    auto_ack_deliveries: AtomicU64::new(0),
    redeliveries: AtomicU64::new(0),
    acks_accepted: AtomicU64::new(0),
    acks_refused: AtomicU64::new(0),
    lease_releases: AtomicU64::new(0),
    dead_letters: AtomicU64::new(0),
    retentions: AtomicU64::new(0),
    deferred: AtomicU64::new(0),
    leased_elsewhere: AtomicU64::new(0),
};

fn count(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[derive(Clone, Debug)]
struct Seg {
    base: Offset,
    end: Offset,
    created_ms: i64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Cursor {
    committed: Offset,
    worker: Option<u64>,
    expires_ms: Option<i64>,
    batch_end: Option<Offset>,
    attempt_count: u32,
    attempt_offset: Option<Offset>,
    retry_offset: Option<Offset>,
    retry_count: u32,
}

impl Cursor {
    fn fresh() -> Self {
        Cursor {
            committed: -1,
            ..Default::default()
        }
    }
    fn live(&self, now_ms: i64) -> bool {
        self.worker.is_some() && self.expires_ms.is_some_and(|e| e >= now_ms)
    }
    fn release(&mut self) {
        self.worker = None;
        self.expires_ms = None;
        self.batch_end = None;
    }
}

/// A claim a consumer holds: what it may ack.
#[derive(Clone, Debug)]
struct Held {
    part: usize,
    group: usize,
    first: Offset,
    last: Offset,
    worker: u64,
}

#[derive(Clone, Debug)]
struct RefState {
    delay_secs: u32,
    now_ms: i64,
    segs: [Vec<Seg>; 3],
    last: [Offset; 3],
    cursors: BTreeMap<(usize, usize), Cursor>,
    held: [Vec<Held>; 3],
    next_worker: u64,
}

#[derive(Clone, Debug)]
enum Shape {
    Partition(usize),
    List(Vec<usize>, u32),
    Wildcard,
}

#[derive(Clone, Debug)]
enum Transition {
    Push {
        part: usize,
        n: u32,
    },
    Pop {
        consumer: usize,
        group: usize,
        shape: Shape,
        batch: u32,
        auto_ack: bool,
    },
    Ack {
        consumer: usize,
        claim: usize,
        items: Vec<(u8, bool)>,
        fenced: bool,
    },
    Advance {
        ms: i64,
    },
    Renew {
        consumer: usize,
    },
    Retention {
        part: usize,
    },
}

/// What a pop must return: per claimed partition (name index, first, last, attempt count).
type Expected = Vec<(usize, Offset, Offset, u32)>;

impl RefState {
    fn cursor(&mut self, p: usize, g: usize) -> &mut Cursor {
        self.cursors.entry((p, g)).or_insert_with(Cursor::fresh)
    }

    /// Takes up to `budget` visible messages of partition `p` for group `g`: (first, take).
    fn scan(&self, p: usize, committed: Offset, budget: u32) -> (Offset, u32) {
        let wanted = committed + 1;
        let mut take = 0i64;
        for s in &self.segs[p] {
            if s.end < wanted {
                continue;
            }
            if self.delay_secs > 0 && s.created_ms > self.now_ms - i64::from(self.delay_secs) * 1000
            {
                break;
            }
            take += s.end - s.base.max(wanted) + 1;
        }
        (wanted, take.min(i64::from(budget)) as u32)
    }

    /// One log_pop_v2 on the reference: the claim, if any.
    fn pop_one(
        &mut self,
        p: usize,
        g: usize,
        budget: u32,
        auto_ack: bool,
        worker: u64,
    ) -> Option<(Offset, Offset, u32)> {
        let now = self.now_ms;
        if self.cursor(p, g).live(now) {
            return None;
        }
        let committed = self.cursor(p, g).committed;
        let (first, take) = self.scan(p, committed, budget);
        let no_segments = self.segs[p].is_empty();
        let last_offset = self.last[p];
        let c = self.cursor(p, g);
        if take == 0 {
            if no_segments && last_offset > c.committed {
                c.committed = last_offset;
            }
            return None;
        }
        let last = first + i64::from(take) - 1;
        if auto_ack {
            c.committed = last;
            c.release();
            Some((first, last, 1))
        } else {
            c.worker = Some(worker);
            c.expires_ms = Some(now + LEASE_SECS * 1000);
            c.batch_end = Some(last);
            c.attempt_count = if c.attempt_offset == Some(first) {
                c.attempt_count + 1
            } else {
                1
            };
            c.attempt_offset = Some(first);
            Some((first, last, c.attempt_count))
        }
    }

    fn pop(&mut self, group: usize, shape: &Shape, batch: u32, auto_ack: bool) -> (u64, Expected) {
        self.next_worker += 1;
        let worker = self.next_worker;
        let (order, max_parts, budget): (Vec<usize>, usize, u32) = match shape {
            Shape::Partition(p) => (vec![*p], 1, batch),
            Shape::List(order, max) => (order.clone(), *max as usize, batch),
            // Everything claimable, so the random scan order cannot change the answer.
            Shape::Wildcard => ((0..PARTS.len()).collect(), PARTS.len(), 1000),
        };
        let mut budget = budget;
        let mut out = vec![];
        for p in order {
            if budget == 0 || out.len() >= max_parts {
                break;
            }
            if let Some((first, last, attempt)) = self.pop_one(p, group, budget, auto_ack, worker) {
                budget -= (last - first + 1) as u32;
                out.push((p, first, last, attempt));
            }
        }
        out.sort();
        (worker, out)
    }

    /// The ack rules: positional, fenced, a call holding a nack applied in offset order whatever
    /// the call's order (so a failed message is a barrier to every completed ack of its call;
    /// completed acks alone apply in the call's order), every nack ends the lease
    /// (dead-lettering included), a nack below the cursor is refused. Answers in the call's
    /// order.
    fn ack(&mut self, held: &Held, items: &[(Offset, bool)], fenced: bool) -> Vec<bool> {
        let mut order: Vec<usize> = (0..items.len()).collect();
        if items.iter().any(|&(_, completed)| !completed) {
            order.sort_by_key(|&i| (items[i].0, i));
        }
        let applied: Vec<(Offset, bool)> = order.iter().map(|&i| items[i]).collect();
        let answers = self.ack_in_order(held, &applied, fenced);
        let mut ok = vec![false; items.len()];
        for (k, &i) in order.iter().enumerate() {
            ok[i] = answers[k];
        }
        ok
    }

    /// `ack`'s items, applied in the order given.
    fn ack_in_order(&mut self, held: &Held, items: &[(Offset, bool)], fenced: bool) -> Vec<bool> {
        let now = self.now_ms;
        let (p, g) = (held.part, held.group);
        let c = self.cursor(p, g).clone();
        let (start_worker, start_live) = (c.worker, c.live(now));
        let mut cur = c;
        let mut barrier: Option<Offset> = None;
        let mut release = false;
        let mut ok = vec![];
        for &(off, completed) in items {
            if off <= cur.committed {
                // A completed ack is idempotent there; a nack can no longer be honoured.
                ok.push(completed);
                continue;
            }
            if fenced && (!start_live || start_worker != Some(held.worker)) {
                ok.push(false);
                continue;
            }
            if cur.batch_end.is_none_or(|e| off > e) {
                ok.push(false);
                continue;
            }
            ok.push(true);
            let advance = |cur: &mut Cursor, to: Offset, barrier: Option<Offset>| {
                let to = barrier.map_or(to, |b| to.min(b - 1));
                if to > cur.committed {
                    cur.committed = to;
                    if cur.retry_offset.is_some_and(|r| r <= to) {
                        cur.retry_offset = None;
                        cur.retry_count = 0;
                    }
                }
            };
            if completed {
                advance(&mut cur, off, barrier);
            } else {
                cur.retry_count = if cur.retry_offset == Some(off) {
                    cur.retry_count + 1
                } else {
                    1
                };
                cur.retry_offset = Some(off);
                if cur.retry_count > RETRY_LIMIT && off == cur.committed + 1 && barrier.is_none() {
                    advance(&mut cur, off, None);
                    release = true;
                } else {
                    barrier = Some(barrier.map_or(off, |b| b.min(off)));
                    release = true;
                }
            }
            if cur.batch_end.is_some_and(|e| cur.committed >= e) {
                cur.release();
            }
        }
        if release && cur.worker.is_some() && cur.worker == start_worker {
            cur.release();
        }
        *self.cursor(p, g) = cur;
        ok
    }
}

struct LeaseModel;

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (0..3usize).prop_map(Shape::Partition),
        (Just(vec![0usize, 1, 2]).prop_shuffle(), 1..=3u32).prop_map(|(o, m)| Shape::List(o, m)),
        Just(Shape::Wildcard),
    ]
}

impl ReferenceStateMachine for LeaseModel {
    type State = RefState;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<RefState> {
        prop_oneof![Just(0u32), Just(2u32)]
            .prop_map(|delay_secs| RefState {
                delay_secs,
                now_ms: 0,
                segs: Default::default(),
                last: [-1; 3],
                cursors: BTreeMap::new(),
                held: Default::default(),
                next_worker: 0,
            })
            .boxed()
    }

    fn transitions(_: &RefState) -> BoxedStrategy<Transition> {
        prop_oneof![
            3 => (0..3usize, 1..4u32).prop_map(|(part, n)| Transition::Push { part, n }),
            4 => (0..3usize, 0..2usize, shape(), 1..6u32, prop::bool::weighted(0.2))
                .prop_map(|(consumer, group, shape, batch, auto_ack)| Transition::Pop { consumer, group, shape, batch, auto_ack }),
            4 => (0..3usize, 0..4usize, prop::collection::vec((0..6u8, prop::bool::weighted(0.6)), 1..4), prop::bool::weighted(0.7))
                .prop_map(|(consumer, claim, items, fenced)| Transition::Ack { consumer, claim, items, fenced }),
            1 => prop_oneof![Just(1_000i64), Just(3_000), Just(11_000)].prop_map(|ms| Transition::Advance { ms }),
            1 => (0..3usize).prop_map(|consumer| Transition::Renew { consumer }),
            1 => (0..3usize).prop_map(|part| Transition::Retention { part }),
        ]
        .boxed()
    }

    fn preconditions(state: &RefState, t: &Transition) -> bool {
        match t {
            Transition::Ack {
                consumer, claim, ..
            } => *claim < state.held[*consumer].len(),
            _ => true,
        }
    }

    fn apply(mut state: RefState, t: &Transition) -> RefState {
        match t {
            Transition::Push { part, n } => {
                let base = state.last[*part] + 1;
                let end = base + i64::from(*n) - 1;
                state.segs[*part].push(Seg {
                    base,
                    end,
                    created_ms: state.now_ms,
                });
                state.last[*part] = end;
            }
            Transition::Pop {
                consumer,
                group,
                shape,
                batch,
                auto_ack,
            } => {
                let (worker, claims) = state.pop(*group, shape, *batch, *auto_ack);
                if !*auto_ack {
                    state.held[*consumer] = claims
                        .iter()
                        .map(|(p, f, l, _)| Held {
                            part: *p,
                            group: *group,
                            first: *f,
                            last: *l,
                            worker,
                        })
                        .collect();
                }
            }
            Transition::Ack {
                consumer,
                claim,
                items,
                fenced,
            } => {
                let held = state.held[*consumer][*claim].clone();
                let offs = ack_offsets(&held, items);
                state.ack(&held, &offs, *fenced);
            }
            Transition::Advance { ms } => state.now_ms += ms,
            Transition::Renew { consumer } => {
                if let Some(w) = state.held[*consumer].first().map(|h| h.worker) {
                    let now = state.now_ms;
                    for c in state.cursors.values_mut() {
                        if c.worker == Some(w) && c.live(now) {
                            c.expires_ms = c.expires_ms.map(|e| e.max(now + 60_000));
                        }
                    }
                }
            }
            Transition::Retention { part } => {
                let floor = (0..GROUPS.len())
                    .map(|g| state.cursors.get(&(*part, g)).map_or(-1, |c| c.committed))
                    .min()
                    .unwrap_or(-1);
                state.segs[*part].retain(|s| s.end > floor);
            }
        }
        state
    }
}

fn ack_offsets(held: &Held, items: &[(u8, bool)]) -> Vec<(Offset, bool)> {
    let span = held.last - held.first + 1;
    items
        .iter()
        .map(|(k, ok)| (held.first + i64::from(*k) % span, *ok))
        .collect()
}

struct Sut {
    db: Arc<SimDb>,
    clock: ManualClock,
    /// Offsets delivered per (partition, group), and which of them by autoAck.
    delivered: BTreeMap<(usize, usize), BTreeSet<Offset>>,
    auto_acked: BTreeMap<(usize, usize), BTreeSet<Offset>>,
    /// The reference state before the transition being applied (the runner hands `apply` the
    /// state after it); refreshed by `check_invariants`, which runs after every step.
    before: std::cell::RefCell<Option<RefState>>,
}

fn worker_id(seq: u64) -> WorkerId {
    WorkerId(uuid::Uuid::from_u128(u128::from(seq)))
}

impl Sut {
    fn pid(&self, p: usize) -> String {
        self.db
            .partition_head("q", PARTS[p])
            .map(|(_, id)| id)
            .unwrap_or_default()
    }

    fn check_pop(&mut self, group: usize, auto_ack: bool, got: &PopResult, expected: &Expected) {
        let mut seen: Vec<(usize, Offset, Offset, u32)> = got
            .claims
            .iter()
            .map(|c| {
                let p = PARTS
                    .iter()
                    .position(|n| *n == c.partition)
                    .unwrap_or_else(|| panic!("unknown partition {}", c.partition));
                (p, c.first_offset, c.last_offset, c.attempt_count)
            })
            .collect();
        seen.sort();
        assert_eq!(
            &seen, expected,
            "pop answer differs from the reference (verdicts {:?})",
            got.verdicts
        );
        for m in messages(got) {
            let p = PARTS
                .iter()
                .position(|n| *n == m.partition)
                .unwrap_or(usize::MAX);
            // FIFO and no gaps: the payload names exactly the offset it was pushed at.
            assert_eq!(
                m.frame.transaction_id,
                format!("{}-{}", m.partition, m.offset),
                "frame at the wrong offset"
            );
            let key = (p, group);
            assert!(
                !self
                    .auto_acked
                    .get(&key)
                    .is_some_and(|s| s.contains(&m.offset)),
                "offset {} of {} redelivered after an autoAck delivery",
                m.offset,
                m.partition
            );
            self.delivered.entry(key).or_default().insert(m.offset);
            if auto_ack {
                self.auto_acked.entry(key).or_default().insert(m.offset);
            }
        }
        for (_, v) in &got.verdicts {
            match v {
                Verdict::Took { leased_until, .. } => {
                    assert_eq!(leased_until.is_none(), auto_ack, "lease iff not autoAck");
                    count(
                        if auto_ack {
                            &COVERAGE.auto_ack_deliveries
                        } else {
                            &COVERAGE.leased_deliveries
                        },
                        1,
                    );
                }
                Verdict::DeferredUntil(_) => count(&COVERAGE.deferred, 1),
                Verdict::LeasedUntil(_) => count(&COVERAGE.leased_elsewhere, 1),
                _ => {}
            }
        }
        count(
            &COVERAGE.redeliveries,
            got.claims.iter().filter(|c| c.attempt_count > 1).count() as u64,
        );
    }
}

impl StateMachineTest for LeaseModel {
    type SystemUnderTest = Sut;
    type Reference = LeaseModel;

    fn init_test(r: &RefState) -> Sut {
        let clock = ManualClock::new(T0);
        let db = SimDb::new(11, clock.as_sim_clock(), SimBugs::default());
        let config = QueueConfig {
            delayed_processing_secs: r.delay_secs,
            retry_limit: RETRY_LIMIT,
            // The reference model redelivers a failed message at once; the retryDelay hold is
            // covered by the conformance and differential suites.
            retry_delay_ms: 0,
            ..QueueConfig::with_defaults("q")
        };
        block_on(db.configure_queue(config)).unwrap_or_else(|e| panic!("configure: {e}"));
        Sut {
            db,
            clock,
            delivered: BTreeMap::new(),
            auto_acked: BTreeMap::new(),
            before: Default::default(),
        }
    }

    fn apply(mut sut: Sut, after: &RefState, t: Transition) -> Sut {
        count(&COVERAGE.transitions, 1);
        let before = sut
            .before
            .borrow()
            .clone()
            .unwrap_or_else(|| panic!("check_invariants runs before every transition"));
        let before = &before;
        match &t {
            Transition::Push { part, n } => {
                let base = before.last[*part] + 1;
                let frames = (0..*n)
                    .map(|i| Frame {
                        producer: None,
                        encrypted: false,
                        message_id: uuid::Uuid::from_u128(u128::from(i) + 1),
                        transaction_id: format!("{}-{}", PARTS[*part], base + i64::from(i)),
                        trace_id: None,
                        payload: b"{}".to_vec(),
                    })
                    .collect();
                let out = block_on(sut.db.push(vec![PushGroup {
                    queue: "q".into(),
                    partition: PARTS[*part].into(),
                    frames,
                    blob: None,
                }]));
                assert!(out.is_ok(), "push failed: {out:?}");
            }
            Transition::Pop {
                group,
                shape,
                batch,
                auto_ack,
                ..
            } => {
                let mut scratch = before.clone();
                let (worker, expected) = scratch.pop(*group, shape, *batch, *auto_ack);
                let req = PopRequest {
                    queue: "q".into(),
                    group: GROUPS[*group].into(),
                    worker: worker_id(worker),
                    batch: *batch,
                    max_partitions: 1,
                    auto_ack: *auto_ack,
                    lease_seconds: Some(LEASE_SECS as u32),
                    intent: SubscriptionIntent::default(),
                    skip_window_debounce: false,
                    conflation: false,
                };
                let got = match shape {
                    Shape::Partition(p) => block_on(sut.db.pop_partition(req, PARTS[*p].into())),
                    Shape::List(order, max) => block_on(sut.db.pop_list(
                        PopRequest {
                            max_partitions: *max,
                            ..req
                        },
                        order.iter().map(|p| PARTS[*p].to_string()).collect(),
                    )),
                    Shape::Wildcard => block_on(sut.db.pop_wildcard(PopRequest {
                        max_partitions: PARTS.len() as u32,
                        batch: 1000,
                        ..req
                    })),
                };
                let got = got.unwrap_or_else(|e| panic!("pop failed: {e}"));
                sut.check_pop(*group, *auto_ack, &got, &expected);
            }
            Transition::Ack {
                consumer,
                claim,
                items,
                fenced,
            } => {
                let held = before.held[*consumer][*claim].clone();
                let offs = ack_offsets(&held, items);
                let expected = before.clone().ack(&held, &offs, *fenced);
                let pid = sut.pid(held.part);
                let ack_items = offs
                    .iter()
                    .map(|(o, ok)| AckItem {
                        transaction_id: format!("{}-{o}", PARTS[held.part]),
                        partition_id: pid.clone(),
                        status: if *ok {
                            AckStatus::Completed
                        } else {
                            AckStatus::Failed
                        },
                        lease_id: fenced.then(|| worker_id(held.worker).to_string()),
                        error: None,
                    })
                    .collect();
                let got = block_on(sut.db.ack(GROUPS[held.group], ack_items))
                    .unwrap_or_else(|e| panic!("ack failed: {e}"));
                count(
                    &COVERAGE.lease_releases,
                    got.iter().filter(|o| o.lease_released).count() as u64,
                );
                count(
                    &COVERAGE.dead_letters,
                    got.iter().filter(|o| o.dlq).count() as u64,
                );
                let got: Vec<bool> = got.iter().map(|o| o.success).collect();
                count(
                    &COVERAGE.acks_accepted,
                    got.iter().filter(|o| **o).count() as u64,
                );
                count(
                    &COVERAGE.acks_refused,
                    got.iter().filter(|o| !**o).count() as u64,
                );
                assert_eq!(got, expected, "ack verdicts differ from the reference");
            }
            Transition::Advance { ms } => sut.clock.advance_millis(*ms),
            Transition::Renew { consumer } => {
                if let Some(w) = before.held[*consumer].first().map(|h| h.worker) {
                    block_on(sut.db.renew_lease(&worker_id(w).to_string(), 60))
                        .unwrap_or_else(|e| panic!("renew failed: {e}"));
                }
            }
            Transition::Retention { part } => {
                let floor = after.segs[*part]
                    .first()
                    .map_or(after.last[*part] + 1, |s| s.base);
                let dropped = sut
                    .db
                    .drop_segments("q", PARTS[*part], floor)
                    .unwrap_or_else(|e| panic!("retention failed: {e}"));
                count(&COVERAGE.retentions, u64::from(dropped));
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, r: &RefState) {
        *sut.before.borrow_mut() = Some(r.clone());
        let now = sut.db.now();
        assert_eq!(now, T0.plus_millis(r.now_ms));
        for (p, name) in PARTS.iter().enumerate() {
            let last = sut.db.partition_head("q", name).map_or(-1, |(l, _)| l);
            assert_eq!(last, r.last[p], "last offset of {name}");
            for (g, group) in GROUPS.iter().enumerate() {
                // A row that does not exist yet is a fresh cursor (committed -1, no lease): when
                // rows get created is an implementation detail.
                let row = sut
                    .db
                    .cursor("q", name, group)
                    .unwrap_or_else(|| queen_core::claim::CursorRow::seeded(-1));
                let want = r
                    .cursors
                    .get(&(p, g))
                    .cloned()
                    .unwrap_or_else(Cursor::fresh);
                let ctx = format!("cursor ({name}, {group})");
                assert_eq!(row.committed, want.committed, "{ctx}: committed");
                assert_eq!(
                    row.worker_id,
                    want.worker.map(worker_id),
                    "{ctx}: lease holder"
                );
                assert_eq!(
                    row.lease_expires_at,
                    want.expires_ms.map(|e| T0.plus_millis(e)),
                    "{ctx}: lease expiry"
                );
                assert_eq!(row.batch_end, want.batch_end, "{ctx}: batch_end");
                assert_eq!(
                    (row.attempt_count, row.attempt_offset),
                    (want.attempt_count, want.attempt_offset),
                    "{ctx}: attempts"
                );
                // The leased span is exactly (committed, batch_end].
                if let Some(end) = row.batch_end {
                    assert!(end > row.committed, "{ctx}: empty leased span");
                }
                // Nothing is skipped: every committed offset was delivered to this group.
                let delivered = sut.delivered.get(&(p, g));
                for o in 0..=row.committed {
                    assert!(
                        delivered.is_some_and(|d| d.contains(&o)),
                        "{ctx}: offset {o} committed but never delivered"
                    );
                }
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

/// The generator's seed: PROPTEST_SEED, or a fixed one, so a run (and its coverage) is the same
/// every time; a failure names the seed that replays it.
fn seed() -> u64 {
    std::env::var("PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1ea5_e5ee_d001)
}

#[test]
fn lease_semantics_match_the_reference() {
    let config = ProptestConfig {
        cases: cases(),
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    };
    let seed = seed();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = proptest::test_runner::TestRng::from_seed(
        proptest::test_runner::RngAlgorithm::ChaCha,
        &key,
    );
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config.clone(), rng);
    let result = runner.run(
        &LeaseModel::sequential_strategy(1..60),
        |(init, transitions, seen)| {
            LeaseModel::test_sequential(config.clone(), init, transitions, seen);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}\n(PROPTEST_SEED={seed} replays it)");
    }
    let c = &COVERAGE;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "coverage over {} cases: {} transitions, {} leased and {} autoAck deliveries, {} redeliveries, {} acks accepted, {} refused, {} lease releases, {} dead letters, {} segments retired, {} deferred, {} leased elsewhere",
        config.cases,
        get(&c.transitions),
        get(&c.leased_deliveries),
        get(&c.auto_ack_deliveries),
        get(&c.redeliveries),
        get(&c.acks_accepted),
        get(&c.acks_refused),
        get(&c.lease_releases),
        get(&c.dead_letters),
        get(&c.retentions),
        get(&c.deferred),
        get(&c.leased_elsewhere)
    );
    for (name, v) in [
        ("leased deliveries", &c.leased_deliveries),
        ("autoAck deliveries", &c.auto_ack_deliveries),
        ("redeliveries", &c.redeliveries),
        ("accepted acks", &c.acks_accepted),
        ("refused acks", &c.acks_refused),
        ("lease releases", &c.lease_releases),
        ("dead letters", &c.dead_letters),
        ("retired segments", &c.retentions),
        ("deferred verdicts", &c.deferred),
        ("leased-elsewhere verdicts", &c.leased_elsewhere),
    ] {
        assert!(
            get(v) > 0,
            "coverage: no {name} happened; the properties were not exercised (PROPTEST_SEED={seed}, PROPTEST_CASES={})",
            config.cases
        );
    }
}
