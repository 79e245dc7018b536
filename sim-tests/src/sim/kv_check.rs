//! Per-key linearizability of the KV store against a sequential register spec, over a history
//! whose calls may have lost their answers (a crash between commit and answer, a held link).
//!
//! The spec: a key is absent or holds `(value, version)`; every applied write gives the key a
//! version above every version it had before (versions rise and are never recycled); `expect`
//! is the version the key must hold (0: absent); `incr` adds its delta to the value (absent:
//! 0) unless the sum passes `max`, when it is refused with `limit` and changes nothing. A call whose answer was lost may have taken
//! effect at any instant after its invocation, or never. The search is Wing & Gong's, with the
//! visited (linearized set, state) pairs remembered so that it stays polynomial in practice.

use std::collections::BTreeSet;

use serde_json::Value;

/// Simulated microseconds.
pub type Micros = i64;

/// One KV call of the simulation's KV clients (values are unique per put).
#[derive(Clone, Debug)]
pub struct KvCall {
    pub client: String,
    pub key: String,
    pub op: KvCallOp,
    pub invoked: Micros,
    /// The answer and when it arrived; `None` when it never did (the outcome is unknown).
    pub answered: Option<(Micros, Value)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum KvCallOp {
    Get,
    Put { value: i64, expect: Option<i64> },
    Delete { expect: Option<i64> },
    Incr { delta: i64, max: Option<i64> },
}

/// How one `incr` with `max` of the rate-limit counter ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncrOutcome {
    /// Applied: the counter's value after it.
    Admitted(i64),
    /// Refused at the limit.
    Refused,
    /// No answer: applied or not.
    Unknown,
}

/// The rate limiter's promise, for a counter only ever incremented by one with `max`: it never
/// admits more than `max`; each admitted increment answered a value of its own; and the final
/// value is the number applied, at least the admitted ones and at most those plus the unknown
/// ones. `final_value` is the committed counter (0 without a row).
pub fn check_counter(calls: &[IncrOutcome], final_value: i64, max: i64) -> Vec<String> {
    let mut out = vec![];
    let admitted: Vec<i64> = calls
        .iter()
        .filter_map(|c| match c {
            IncrOutcome::Admitted(v) => Some(*v),
            _ => None,
        })
        .collect();
    let unknown = calls.iter().filter(|c| **c == IncrOutcome::Unknown).count() as i64;
    let n = admitted.len() as i64;
    if n > max {
        out.push(format!(
            "kv: the limiter admitted {n} increments past its max {max}"
        ));
    }
    let distinct: std::collections::BTreeSet<i64> = admitted.iter().copied().collect();
    if distinct.len() < admitted.len() {
        out.push(format!(
            "kv: two admitted increments answered the same value ({} answers, {} values)",
            admitted.len(),
            distinct.len()
        ));
    }
    if let Some(v) = admitted.iter().find(|v| **v < 1 || **v > max) {
        out.push(format!(
            "kv: an admitted increment answered {v}, outside 1..={max}"
        ));
    }
    if final_value > max || final_value < n || final_value > n + unknown {
        out.push(format!(
            "kv: the counter ended at {final_value} after {n} admitted and {unknown} unknown \
             increments (max {max})"
        ));
    }
    out
}

/// A call on the TTL key as its caller saw it (simulated microseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TtlCall {
    /// A put with a TTL, answered with the version it wrote.
    Put {
        invoked: Micros,
        answered: Micros,
        version: i64,
    },
    /// A get, answered with the version it read (`None`: absent).
    Get {
        invoked: Micros,
        answered: Micros,
        version: Option<i64>,
    },
}

/// The TTL key's promise: a value is never read once its TTL has passed. A put commits before
/// its answer, so its value is gone `ttl` after the answer at the latest; a get sent later than
/// that (with `margin` for the clocks) must not read it.
pub fn check_expiry(calls: &[TtlCall], ttl: Micros, margin: Micros) -> Vec<String> {
    let written: std::collections::BTreeMap<i64, Micros> = calls
        .iter()
        .filter_map(|c| match c {
            TtlCall::Put {
                answered, version, ..
            } => Some((*version, *answered)),
            TtlCall::Get { .. } => None,
        })
        .collect();
    let mut out = vec![];
    for c in calls {
        let TtlCall::Get {
            invoked,
            version: Some(v),
            ..
        } = c
        else {
            continue;
        };
        if let Some(answered) = written.get(v) {
            if *invoked > answered + ttl + margin {
                out.push(format!(
                    "kv: a get sent at {invoked} us read version {v}, whose TTL ran out by {} us",
                    answered + ttl
                ));
            }
        }
    }
    out
}

/// The pair keys' promise: every batch writes one value to both keys in one call, the second
/// write `required` and conditional, so a batch is applied whole or not at all. Each read of the
/// two keys in one call (`getMany`, one snapshot), and the committed state at the end, must show
/// both keys equal (or both absent).
pub fn check_pairs(
    reads: &[(Option<i64>, Option<i64>)],
    final_pair: (Option<i64>, Option<i64>),
) -> Vec<String> {
    let mut out = vec![];
    for (a, b) in reads.iter().filter(|(a, b)| a != b) {
        out.push(format!(
            "kv: a read saw a batch in part: the pair held {a:?} and {b:?}"
        ));
    }
    if final_pair.0 != final_pair.1 {
        out.push(format!(
            "kv: a batch committed in part: the pair ended at {:?} and {:?}",
            final_pair.0, final_pair.1
        ));
    }
    out
}

/// A version as the search knows it: answered, or that of a put whose answer was lost and
/// whose value no read ever showed (then no read can match it and no `expect` can name it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Version {
    Known(i64),
    Unseen(usize),
}

/// The register: the live `(value, version)`, and the highest known version it ever had.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Register {
    live: Option<(i64, Version)>,
    high: i64,
}

/// The precondition's verdict for `expect` against the register (`None`: it holds).
fn precondition(expect: i64, live: &Option<(i64, Version)>) -> Option<&'static str> {
    match (expect, live) {
        (0, None) => None,
        (0, Some(_)) => Some("exists"),
        (_, None) => Some("absent"),
        (e, Some((_, Version::Known(v)))) if *v == e => None,
        (_, Some(_)) => Some("version"),
    }
}

/// A version answered for a key must rise above every version the key had.
fn rises(reg: &Register, version: i64) -> Option<Register> {
    (version > reg.high).then_some(Register {
        live: reg.live,
        high: version,
    })
}

/// The register after the call with index `i`, if its answer is legal in `reg`.
/// `versions[i]` is the version a lost put is known to have written (seen by a read).
fn step(call: &KvCall, i: usize, learned: Option<i64>, reg: &Register) -> Option<Register> {
    let answer = call.answered.as_ref().map(|(_, a)| a);
    match (&call.op, answer) {
        (KvCallOp::Get, None) => Some(reg.clone()),
        (KvCallOp::Get, Some(a)) => {
            let found = a["found"] == true;
            match (&reg.live, found) {
                (None, false) => Some(reg.clone()),
                (Some((value, Version::Known(v))), true) => (a["value"].as_i64() == Some(*value)
                    && a["version"].as_i64() == Some(*v))
                .then(|| reg.clone()),
                _ => None,
            }
        }
        (KvCallOp::Put { value, expect }, None) => {
            if expect.is_some_and(|e| precondition(e, &reg.live).is_some()) {
                return None;
            }
            match learned {
                Some(v) => rises(reg, v).map(|r| Register {
                    live: Some((*value, Version::Known(v))),
                    ..r
                }),
                None => Some(Register {
                    live: Some((*value, Version::Unseen(i))),
                    high: reg.high,
                }),
            }
        }
        (KvCallOp::Put { value, expect }, Some(a)) => {
            let verdict = expect.and_then(|e| precondition(e, &reg.live));
            if a["applied"] == true {
                let v = a["version"].as_i64()?;
                if verdict.is_some() || a["value"].as_i64() != Some(*value) {
                    return None;
                }
                rises(reg, v).map(|r| Register {
                    live: Some((*value, Version::Known(v))),
                    ..r
                })
            } else {
                (verdict.is_some() && a["reason"].as_str() == verdict && shows(a, reg))
                    .then(|| reg.clone())
            }
        }
        (KvCallOp::Incr { delta, max }, answer) => incr_step(reg, i, *delta, *max, answer),
        (KvCallOp::Delete { expect }, answer) => {
            let verdict = expect
                .and_then(|e| precondition(e, &reg.live))
                .or(reg.live.is_none().then_some("absent"));
            let applied = answer.is_none_or(|a| a["applied"] == true);
            if applied {
                let version_matches = match (answer, &reg.live) {
                    (None, _) => true,
                    (Some(a), Some((_, Version::Known(v)))) => a["version"].as_i64() == Some(*v),
                    (Some(_), _) => false,
                };
                (verdict.is_none() && version_matches).then_some(Register {
                    live: None,
                    high: reg.high,
                })
            } else {
                let a = answer?;
                (verdict.is_some() && a["reason"].as_str() == verdict && shows(a, reg))
                    .then(|| reg.clone())
            }
        }
    }
}

/// An `incr` in `reg`: applied when the sum stays within `max` (a lost answer's version is
/// unseen), refused with `limit` otherwise; `None` when the answer contradicts `reg`.
fn incr_step(
    reg: &Register,
    i: usize,
    delta: i64,
    max: Option<i64>,
    answer: Option<&Value>,
) -> Option<Register> {
    let current = reg.live.map_or(0, |(value, _)| value);
    let next = current.checked_add(delta)?;
    let fits = max.is_none_or(|hi| next <= hi);
    match answer {
        // No answer: it took effect at some instant, as the rule says, or never.
        None if fits => Some(Register {
            live: Some((next, Version::Unseen(i))),
            high: reg.high,
        }),
        None => Some(reg.clone()),
        Some(a) if a["applied"] == true => {
            let v = a["version"].as_i64()?;
            (fits && a["value"].as_i64() == Some(next)).then_some(())?;
            rises(reg, v).map(|r| Register {
                live: Some((next, Version::Known(v))),
                ..r
            })
        }
        Some(a) => {
            // A refusal shows the counter's value; its version too, unless a lost increment
            // wrote it unseen.
            let shown = match &reg.live {
                None => a.get("value").is_none(),
                Some((value, Version::Known(v))) => {
                    a["value"].as_i64() == Some(*value) && a["version"].as_i64() == Some(*v)
                }
                Some((value, Version::Unseen(_))) => a["value"].as_i64() == Some(*value),
            };
            (!fits && a["reason"] == "limit" && shown).then(|| reg.clone())
        }
    }
}

/// A refusal shows the live row as it stands (or, when the key is absent, version 0 and no
/// value).
fn shows(a: &Value, reg: &Register) -> bool {
    match &reg.live {
        None => a["version"].as_i64() == Some(0) && a.get("value").is_none(),
        Some((value, Version::Known(v))) => {
            a["version"].as_i64() == Some(*v) && a["value"].as_i64() == Some(*value)
        }
        Some((_, Version::Unseen(_))) => false,
    }
}

/// How a key's history checked out.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the answers; the call the search got stuck on first.
    Not {
        stuck_at: String,
    },
    /// The search gave up (too many pending calls whose answers were lost).
    TooLarge,
}

/// Checks one key's calls (any order) with at most `budget` search steps.
pub fn check_key(calls: &[KvCall], budget: u64) -> Verdict {
    let mut calls: Vec<KvCall> = calls.to_vec();
    // A read whose answer was lost tells nothing.
    calls.retain(|c| c.op != KvCallOp::Get || c.answered.is_some());
    calls.sort_by_key(|c| c.invoked);
    // A lost put's version, when some read (or refusal) showed its unique value.
    let learned: Vec<Option<i64>> = calls
        .iter()
        .map(|c| match (&c.op, &c.answered) {
            (KvCallOp::Put { value, .. }, None) => calls.iter().find_map(|o| {
                let (_, a) = o.answered.as_ref()?;
                (a["value"].as_i64() == Some(*value))
                    .then(|| a["version"].as_i64())
                    .flatten()
            }),
            _ => None,
        })
        .collect();
    let mut search = Search {
        calls: &calls,
        learned: &learned,
        seen: BTreeSet::new(),
        steps: 0,
        budget,
        deepest: (0, None),
    };
    let start = Register {
        live: None,
        high: 0,
    };
    match search.explore(&mut vec![false; calls.len()], 0, &start) {
        Some(true) => Verdict::Linearizable,
        None => Verdict::TooLarge,
        Some(false) => Verdict::Not {
            stuck_at: search
                .deepest
                .1
                .map(|i| format!("{:?}", calls[i]))
                .unwrap_or_default(),
        },
    }
}

struct Search<'a> {
    calls: &'a [KvCall],
    learned: &'a [Option<i64>],
    seen: BTreeSet<(Vec<bool>, Register)>,
    steps: u64,
    budget: u64,
    /// The most calls linearized on any path, and the first call none of that path's
    /// candidates could follow.
    deepest: (usize, Option<usize>),
}

impl Search<'_> {
    /// `Some(true)`: the answered calls not yet in `done` can be linearized after `reg`.
    /// `None`: the budget ran out.
    fn explore(&mut self, done: &mut Vec<bool>, count: usize, reg: &Register) -> Option<bool> {
        let pending_answered = self
            .calls
            .iter()
            .zip(done.iter())
            .any(|(c, d)| !d && c.answered.is_some());
        if !pending_answered {
            return Some(true);
        }
        self.steps += 1;
        if self.steps > self.budget {
            return None;
        }
        if !self.seen.insert((done.clone(), reg.clone())) {
            return Some(false);
        }
        // Only calls invoked before the earliest answer among the pending ones can go next.
        let horizon = self
            .calls
            .iter()
            .zip(done.iter())
            .filter(|(_, d)| !**d)
            .filter_map(|(c, _)| c.answered.as_ref().map(|(at, _)| *at))
            .min()
            .unwrap_or(Micros::MAX);
        let first_pending = done.iter().position(|d| !d);
        for i in 0..self.calls.len() {
            if done[i] {
                continue;
            }
            if self.calls[i].invoked > horizon {
                break;
            }
            if let Some(next) = step(&self.calls[i], i, self.learned[i], reg) {
                done[i] = true;
                let r = self.explore(done, count + 1, &next);
                done[i] = false;
                if r != Some(false) {
                    return r;
                }
            }
        }
        if count >= self.deepest.0 {
            self.deepest = (count, first_pending);
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(op: KvCallOp, invoked: Micros, answered: Option<(Micros, Value)>) -> KvCall {
        KvCall {
            client: "c".into(),
            key: "k".into(),
            op,
            invoked,
            answered,
        }
    }

    fn put(value: i64) -> KvCallOp {
        KvCallOp::Put {
            value,
            expect: None,
        }
    }

    fn incr(answer: Option<(Micros, Value)>, invoked: Micros) -> KvCall {
        call(
            KvCallOp::Incr {
                delta: 1,
                max: Some(2),
            },
            invoked,
            answer,
        )
    }

    #[test]
    fn increments_count_up_to_their_max_in_real_time() {
        let admitted =
            |v: i64, version: i64| json!({"applied": true, "value": v, "version": version});
        let h = [
            incr(Some((10, admitted(1, 1))), 0),
            incr(Some((30, admitted(2, 2))), 20),
            incr(
                Some((
                    50,
                    json!({"applied": false, "reason": "limit", "value": 2, "version": 2}),
                )),
                40,
            ),
        ];
        assert_eq!(check_key(&h, 1_000), Verdict::Linearizable);
        // A later call that answered a lower value than one completed before it began.
        let backwards = [
            incr(Some((10, admitted(2, 2))), 0),
            incr(Some((30, admitted(1, 3))), 20),
        ];
        assert!(matches!(check_key(&backwards, 1_000), Verdict::Not { .. }));
        // A refusal while the counter was below its max.
        let early_refusal = [incr(
            Some((10, json!({"applied": false, "reason": "limit"}))),
            0,
        )];
        assert!(matches!(
            check_key(&early_refusal, 1_000),
            Verdict::Not { .. }
        ));
    }

    #[test]
    fn a_lost_increment_may_have_counted_or_not() {
        let lost = incr(None, 0);
        let after_it = |v: i64| {
            incr(
                Some((30, json!({"applied": true, "value": v, "version": 7}))),
                20,
            )
        };
        assert_eq!(
            check_key(&[lost.clone(), after_it(1)], 1_000),
            Verdict::Linearizable
        );
        assert_eq!(
            check_key(&[lost.clone(), after_it(2)], 1_000),
            Verdict::Linearizable
        );
        assert!(matches!(
            check_key(&[lost, after_it(3)], 1_000),
            Verdict::Not { .. }
        ));
    }

    #[test]
    fn a_read_sees_the_write_before_it() {
        let h = [
            call(
                put(1000),
                0,
                Some((10, json!({"applied": true, "value": 1000, "version": 5}))),
            ),
            call(
                KvCallOp::Get,
                20,
                Some((30, json!({"found": true, "value": 1000, "version": 5}))),
            ),
        ];
        assert_eq!(check_key(&h, 1_000), Verdict::Linearizable);
    }

    #[test]
    fn a_stale_read_is_caught() {
        let h = [
            call(
                put(1000),
                0,
                Some((10, json!({"applied": true, "value": 1000, "version": 5}))),
            ),
            call(
                put(2000),
                20,
                Some((30, json!({"applied": true, "value": 2000, "version": 6}))),
            ),
            call(
                KvCallOp::Get,
                40,
                Some((50, json!({"found": true, "value": 1000, "version": 5}))),
            ),
        ];
        assert!(matches!(check_key(&h, 1_000), Verdict::Not { .. }));
    }

    #[test]
    fn a_lost_put_may_have_landed_or_not() {
        let lost = call(put(3000), 0, None);
        let landed = call(
            KvCallOp::Get,
            20,
            Some((30, json!({"found": true, "value": 3000, "version": 9}))),
        );
        let never = call(KvCallOp::Get, 20, Some((30, json!({"found": false}))));
        assert_eq!(
            check_key(&[lost.clone(), landed], 1_000),
            Verdict::Linearizable
        );
        assert_eq!(check_key(&[lost, never], 1_000), Verdict::Linearizable);
    }

    #[test]
    fn a_recycled_version_is_caught() {
        // put → delete → put that answers the deleted row's version again.
        let h = [
            call(
                put(1000),
                0,
                Some((10, json!({"applied": true, "value": 1000, "version": 1}))),
            ),
            call(
                KvCallOp::Delete { expect: None },
                20,
                Some((30, json!({"applied": true, "version": 1}))),
            ),
            call(
                put(2000),
                40,
                Some((50, json!({"applied": true, "value": 2000, "version": 1}))),
            ),
        ];
        assert!(matches!(check_key(&h, 1_000), Verdict::Not { .. }));
    }

    #[test]
    fn a_compare_and_set_must_name_the_live_version() {
        let h = [
            call(
                put(1000),
                0,
                Some((10, json!({"applied": true, "value": 1000, "version": 4}))),
            ),
            call(
                KvCallOp::Put {
                    value: 2000,
                    expect: Some(3),
                },
                20,
                Some((30, json!({"applied": true, "value": 2000, "version": 7}))),
            ),
        ];
        assert!(matches!(check_key(&h, 1_000), Verdict::Not { .. }));
    }

    #[test]
    fn the_counter_checker_names_each_breach() {
        use IncrOutcome::*;
        let calls = [Admitted(1), Unknown, Admitted(3), Refused, Admitted(2)];
        assert_eq!(check_counter(&calls, 3, 3), Vec::<String>::new());
        assert_eq!(
            check_counter(&calls, 4, 4),
            Vec::<String>::new(),
            "the unknown applied"
        );
        let lost_update = [Admitted(1), Admitted(2), Admitted(2)];
        let v = check_counter(&lost_update, 2, 3);
        assert!(v.iter().any(|m| m.contains("same value")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("ended at 2")), "{v:?}");
        let past_max = [Admitted(1), Admitted(2), Admitted(3)];
        let v = check_counter(&past_max, 3, 2);
        assert!(v.iter().any(|m| m.contains("past its max")), "{v:?}");
        let v = check_counter(&[Admitted(1)], 2, 5);
        assert!(v.iter().any(|m| m.contains("ended at 2")), "{v:?}");
    }

    #[test]
    fn a_batch_seen_in_part_is_named() {
        assert_eq!(
            check_pairs(&[(None, None), (Some(3), Some(3))], (Some(3), Some(3))),
            Vec::<String>::new()
        );
        let v = check_pairs(&[(Some(3), Some(4))], (Some(4), Some(4)));
        assert!(v.iter().any(|m| m.contains("read saw")), "{v:?}");
        let v = check_pairs(&[], (Some(4), None));
        assert!(v.iter().any(|m| m.contains("committed in part")), "{v:?}");
    }

    #[test]
    fn an_expired_read_is_named() {
        let put = TtlCall::Put {
            invoked: 0,
            answered: 10,
            version: 4,
        };
        let get = |invoked, version| TtlCall::Get {
            invoked,
            answered: invoked + 5,
            version,
        };
        let ok = [put.clone(), get(500, Some(4)), get(2_000, None)];
        assert_eq!(check_expiry(&ok, 1_000, 1), Vec::<String>::new());
        let v = check_expiry(&[put, get(1_100, Some(4))], 1_000, 1);
        assert!(v.iter().any(|m| m.contains("TTL ran out")), "{v:?}");
    }
}
