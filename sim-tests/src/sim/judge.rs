//! After a run: the history checkers' verdicts over what the clients saw and what the model
//! removed, the model's own findings (waits, deadlocks, pending messages), the coverage counters
//! and the trace's hash.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use queen_core::Timestamp;
use queen_storage_sim::{SimDb, SimEvents};

use super::driver::Driver;
use super::history::{self, Event};
use super::hosts::Fleet;
use super::{
    kv_check, reads_check, workload, Outcome, Scenario, Shared, Spec, EPOCH_SECS, LEASE_SECS,
};

/// The outcome of a finished run.
pub(super) fn judge(
    spec: &Spec,
    shared: &Shared,
    db: &Arc<SimDb>,
    fleet: &Fleet,
    driver: Driver<'_>,
    simulated_secs: f64,
) -> Outcome {
    let mut counts = driver.counts.clone();
    let mut violations = driver.violations.clone();
    // The groups the prompt scenario seeks back and deletes are rewound on purpose: the
    // history checkers below judge every other group (the liveness checker judged them all).
    let events: Vec<Event> = shared
        .history
        .events()
        .into_iter()
        .filter(|e| !workload::is_rewound(e))
        .collect();
    let ev = db.events();
    let removals = removals(db);
    let dead_letters = dead_letters(db);
    if spec.scenario == Scenario::Retention {
        violations.extend(retention_verdicts(
            &events,
            &removals,
            &dead_letters,
            &mut counts,
        ));
    }
    violations.extend(history_verdicts(spec, &events, &removals, &dead_letters));
    if let Ok(due) = shared.timer_due.lock() {
        let (early, delivered) = history::timers_never_early(&events, &due);
        violations.extend(early);
        if delivered > 0 {
            counts.insert("timers: messages delivered", delivered);
        }
    }
    // Exactly once: each timer incarnation is fired by one committed transaction, however many
    // brokers found it due at once.
    let firings = db.firings();
    for (id, n) in firings.iter().filter(|(_, n)| **n > 1) {
        violations.push(format!("timers: incarnation {id} fired {n} times"));
    }
    if !firings.is_empty() {
        counts.insert("timers: incarnations fired", firings.len() as u64);
    }
    violations.extend(model_verdicts(&ev));
    if let Ok(fetches) = shared.fetches.lock() {
        let (found, judged) = reads_check::judge(&fetches);
        violations.extend(found);
        if judged > 0 {
            counts.insert("reads: fetch entries judged", judged);
        }
    }
    if spec.scenario == Scenario::Faults {
        violations.extend(faults_verdicts(
            shared,
            db,
            &driver.permit_expiry,
            &mut counts,
        ));
    }
    if spec.scenario == Scenario::LostWakes {
        // One backoff interval (1,000 ms) plus the network and a storage round trip.
        let (stranded, covered) = history::parked_consumers_served(&events, 1_250_000);
        violations.extend(stranded);
        counts.insert(
            "race: message pushed to a parked consumer, wakes dropped",
            u64::from(covered),
        );
    }
    violations.extend(ephemeral_verdicts(spec, shared, &mut counts));
    violations.extend(pending_after_drain(spec, db));
    count_coverage(&mut counts, spec, &ev, fleet);
    for (k, v) in driver.liveness.coverage() {
        counts.insert(k, v);
    }
    if spec.scenario == Scenario::Prompt {
        let [(_, judged), (_, longest)] = driver.ephemeral_liveness.coverage();
        counts.insert("ephemeral: stalls judged against the bound", judged);
        counts.insert("ephemeral: longest stall before a delivery (ms)", longest);
        let (calls, bound) = driver.pop_cut_calls;
        counts.insert("pop cuts: most failed calls in one cut", calls);
        counts.insert("pop cuts: that cut's bound", bound);
    }
    if let Ok(c) = shared.counters.lock() {
        counts.extend(c.iter().map(|(k, v)| (*k, *v)));
    }
    count_deliveries(&mut counts, &events);
    let (trace_hash, trace_tail) = trace(&events, &ev, shared);
    Outcome {
        violations,
        coverage: counts,
        trace_hash,
        trace_tail,
        simulated_secs,
    }
}

/// The retention scenario's verdicts (what retention may remove, judged removal by removal) and
/// its coverage.
fn retention_verdicts(
    events: &[Event],
    removals: &[history::Removal],
    dead_letters: &[history::DeadLettered],
    counts: &mut BTreeMap<&'static str, u64>,
) -> Vec<String> {
    let violations = history::retention_entitled(
        events,
        removals,
        &["g1", workload::LAGGING_GROUP],
        &[workload::LATE_GROUP],
        i64::from(workload::RETENTION_PENDING_SECS) * 1_000_000,
    );
    counts.insert(
        "retention: a pop stepped over removed messages",
        history::gap_steps(events, removals, dead_letters),
    );
    for r in removals {
        *counts
            .entry(if r.expired {
                "retention: messages removed as expired"
            } else {
                "retention: messages removed as completed"
            })
            .or_default() += r.txids.len() as u64;
    }
    violations
}

/// The faults scenario's verdicts: coordination (locks, KV, the fenced resource), stream
/// windows and conflated deliveries.
fn faults_verdicts(
    shared: &Shared,
    db: &Arc<SimDb>,
    permit_expiry: &BTreeMap<(String, i64), Option<i64>>,
    counts: &mut BTreeMap<&'static str, u64>,
) -> Vec<String> {
    let mut violations = vec![];
    violations.extend(refusals_by_live_permits(shared, permit_expiry));
    violations.extend(kv_linearizable(shared, counts));
    violations.extend(kv_counter(shared, db));
    violations.extend(kv_pairs(shared, db));
    if let Ok(calls) = shared.ttl_calls.lock() {
        // One millisecond for the clocks: the model's and the history's share one timeline.
        violations.extend(kv_check::check_expiry(
            &calls,
            workload::KV_TTL_SECS * 1_000_000,
            1_000,
        ));
    }
    if let Ok(fenced) = shared.fenced.lock() {
        for ((name, slot), resource) in fenced.iter() {
            violations.extend(super::fence_check::check_fenced(
                &format!("{name}/{slot}"),
                &resource.writes,
            ));
        }
    }
    violations.extend(stream_cycles(shared, db));
    violations.extend(conflated_deliveries(shared, db));
    violations
}

/// A model timestamp on the history's clock (microseconds since the simulation began).
fn on_history_clock(t: Timestamp) -> history::Micros {
    t.0 - Timestamp::from_secs(EPOCH_SECS as i64).0
}

/// What failed acks dead-lettered (requeued since or not), in the checkers' terms.
fn dead_letters(db: &SimDb) -> Vec<history::DeadLettered> {
    db.dead_letterings()
        .into_iter()
        .map(|d| history::DeadLettered {
            group: d.group,
            partition: d.partition,
            offset: d.offset,
            filed_at: on_history_clock(d.failed_at),
        })
        .collect()
}

/// What the model removed (retention, eviction, the driver's drops), in the checkers' terms.
fn removals(db: &SimDb) -> Vec<history::Removal> {
    db.removals()
        .into_iter()
        .map(|r| history::Removal {
            partition: r.partition,
            base: r.base_offset,
            end: r.end_offset,
            expired: r.reason == queen_core::storage::Removal::Expired,
            txids: r.transaction_ids,
            committed_at: on_history_clock(r.committed_at),
        })
        .collect()
}

/// The history checkers every scenario runs.
fn history_verdicts(
    spec: &Spec,
    events: &[Event],
    removals: &[history::Removal],
    dead_letters: &[history::DeadLettered],
) -> Vec<String> {
    let mut violations = vec![];
    let groups = workload::groups_of(spec.scenario);
    let removed: std::collections::BTreeSet<String> =
        removals.iter().flat_map(|r| r.txids.clone()).collect();
    violations.extend(history::nothing_lost(events, &groups, &removed));
    violations.extend(history::leases_exclusive(events, LEASE_SECS));
    violations.extend(history::batches_well_formed(events));
    violations.extend(history::no_skips(events, removals, dead_letters));
    violations.extend(history::attempts_count_up(events));
    violations.extend(history::auto_ack_once(events));
    violations
}

/// What the model saw: pushes serialize on their partition row and acks on the cursor row, by
/// design; a pop never waits, and nothing deadlocks.
fn model_verdicts(ev: &SimEvents) -> Vec<String> {
    let mut violations = vec![];
    let pop_waits: Vec<_> = ev
        .waits
        .iter()
        .filter(|w| w.procedure.contains("pop"))
        .collect();
    if let Some(first) = pop_waits.first() {
        violations.push(format!(
            "{} pop waits (first: {first:?}); pops must never wait",
            pop_waits.len()
        ));
    }
    if ev.deadlocks > 0 {
        violations.push(format!("{} deadlocks", ev.deadlocks));
    }
    violations
}

/// Every drained group's queue has nothing pending once the run ends (SIM_DUMP=1 prints each
/// partition's head, cursor and deliverability first: a replay aid).
fn pending_after_drain(spec: &Spec, db: &SimDb) -> Vec<String> {
    let mut live = workload::drain_targets(spec.scenario);
    if spec.scenario == Scenario::Faults {
        live.push((workload::queue_of(spec.scenario), workload::LATE_GROUP));
    }
    if std::env::var("SIM_DUMP").is_ok() {
        for (queue, g) in &live {
            for p in db.partitions(queue) {
                eprintln!(
                    "dump {queue}/{p} {g}: head {:?} cursor {:?} deliverable {}",
                    db.partition_head(queue, &p),
                    db.cursor(queue, &p, g),
                    db.deliverable_now(queue, &p, g)
                );
            }
        }
    }
    live.iter()
        .filter(|(queue, g)| db.has_pending_now(queue, g))
        .map(|(queue, g)| {
            format!("liveness: {queue} still has pending messages for {g} after the drain")
        })
        .collect()
}

/// The races the model saw and the faults the hosts met.
fn count_coverage(
    counts: &mut BTreeMap<&'static str, u64>,
    spec: &Spec,
    ev: &SimEvents,
    fleet: &Fleet,
) {
    counts.insert(
        "race: partition created under a racing pop",
        u64::from(ev.creation_races),
    );
    counts.insert("race: SKIP LOCKED skip", u64::from(ev.skip_locked));
    counts.insert("race: advisory try-lock skip", u64::from(ev.advisory_skips));
    if spec.scenario == Scenario::Retention {
        counts.insert(
            "race: retention skipped a partition a push held",
            u64::from(ev.retention_skips),
        );
    }
    counts.insert(
        "fault: wake dropped",
        fleet.dropped_wakes.load(Ordering::Relaxed),
    );
    counts.insert(
        "fault: notification lost",
        fleet
            .lines
            .iter()
            .map(|l| l.dropped.load(Ordering::Relaxed))
            .sum(),
    );
    counts.insert(
        "fault: wake delayed",
        fleet.delayed_wakes.load(Ordering::Relaxed),
    );
    counts.insert(
        "fault: broker restart",
        fleet
            .restarts
            .load(Ordering::Relaxed)
            .saturating_sub(fleet.names.len() as u64),
    );
    counts.insert("interleaving: statements", ev.statements.values().sum());
}

fn count_deliveries(counts: &mut BTreeMap<&'static str, u64>, events: &[Event]) {
    for e in events {
        if let Event::Delivered {
            attempt, auto_ack, ..
        } = e
        {
            *counts
                .entry(if *auto_ack {
                    "delivery: autoAck"
                } else if *attempt > 1 {
                    "delivery: redelivery (attempt > 1)"
                } else {
                    "delivery: first attempt"
                })
                .or_default() += 1;
        }
    }
}

/// The whole trace's hash (a replay must match it) and its tail for a failure report (SIM_TRACE=1:
/// the whole history of the run, a replay aid).
fn trace(events: &[Event], ev: &SimEvents, shared: &Shared) -> (u64, Vec<String>) {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for e in events {
        format!("{e:?}").hash(&mut hasher);
    }
    if let Ok(log) = shared.ephemeral.lock() {
        format!("{:?}", *log).hash(&mut hasher);
    }
    format!("{:?}", ev.statements).hash(&mut hasher);
    let keep = if std::env::var("SIM_TRACE").is_ok() {
        events.len()
    } else {
        12
    };
    let tail = events
        .iter()
        .rev()
        .take(keep)
        .rev()
        .map(|e| format!("{e:?}"))
        .collect();
    (hasher.finish(), tail)
}

/// The ephemeral clients' verdicts (`ephemeral_check`), and what they reached: deliveries,
/// redeliveries, rings (each owner change of the queue makes one), 503s. On the prompt
/// scenario's calm network nothing may answer 503.
fn ephemeral_verdicts(
    spec: &Spec,
    shared: &Shared,
    counts: &mut BTreeMap<&'static str, u64>,
) -> Vec<String> {
    let Ok(log) = shared.ephemeral.lock() else {
        return vec!["ephemeral: the clients' log is poisoned".into()];
    };
    if log.pushes.is_empty() {
        return vec![];
    }
    let lease_us = super::ephemeral_clients::LEASE_SECS * 1_000_000;
    let mut out = super::ephemeral_check::check(&log, lease_us);
    if spec.scenario == Scenario::Prompt && log.unavailable > 0 {
        out.push(format!(
            "ephemeral: {} calls answered 503 on a calm network",
            log.unavailable
        ));
    }
    let rings: std::collections::BTreeSet<String> = log
        .received
        .iter()
        .filter_map(|r| super::ephemeral_check::id_parts(&r.id).map(|(ring, _, _)| ring))
        .collect();
    counts.insert("ephemeral: messages received", log.received.len() as u64);
    counts.insert(
        "ephemeral: redeliveries received (attempt > 1)",
        log.received.iter().filter(|r| r.attempts > 1).count() as u64,
    );
    counts.insert("ephemeral: rings that served", rings.len() as u64);
    counts.insert("ephemeral: calls answered 503", log.unavailable);
    out
}

/// A refused acquire names the permits that held the lock when it was decided, which was after
/// the call was sent: a named permit that had expired before then was counted though dead.
fn refusals_by_live_permits(
    shared: &Shared,
    expiry: &BTreeMap<(String, i64), Option<i64>>,
) -> Vec<String> {
    let Ok(refusals) = shared.lock_refusals.lock() else {
        return vec![];
    };
    let mut out = vec![];
    for (name, invoked, tokens) in refusals.iter() {
        for token in tokens {
            if let Some(Some(until)) = expiry.get(&(name.clone(), *token)) {
                if until <= invoked {
                    out.push(format!(
                        "locks: an acquire of {name} sent at {invoked} us was refused by token \
                         {token}, whose permit expired at {until} us"
                    ));
                }
            }
        }
    }
    out
}

/// The pair keys' reads and committed values: never a batch in part.
fn kv_pairs(shared: &Shared, db: &SimDb) -> Vec<String> {
    let Ok(reads) = shared.pair_reads.lock() else {
        return vec![];
    };
    let rows = db.kv_rows(workload::KV_NAMESPACE);
    let value = |key: &str| {
        rows.iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, r)| r.value.as_i64())
    };
    let [first, second] = workload::KV_PAIR;
    kv_check::check_pairs(&reads, (value(first), value(second)))
}

/// The rate-limit counter's increments against its committed value.
fn kv_counter(shared: &Shared, db: &SimDb) -> Vec<String> {
    let Ok(calls) = shared.incr_calls.lock() else {
        return vec![];
    };
    let final_value = db
        .kv_rows(workload::KV_NAMESPACE)
        .into_iter()
        .find(|(k, _)| k == workload::KV_COUNTER)
        .and_then(|(_, r)| r.value.as_i64())
        .unwrap_or(0);
    kv_check::check_counter(&calls, final_value, workload::KV_COUNTER_MAX)
}

/// Each KV key's history (answers lost to faults included) against the sequential spec.
fn kv_linearizable(shared: &Shared, counts: &mut BTreeMap<&'static str, u64>) -> Vec<String> {
    let Ok(calls) = shared.kv_calls.lock() else {
        return vec![];
    };
    let mut out = vec![];
    // The keys the KV clients read and write, and the rate limiter's counter.
    for key in workload::KV_KEYS.into_iter().chain([workload::KV_COUNTER]) {
        let mine: Vec<kv_check::KvCall> = calls.iter().filter(|c| c.key == key).cloned().collect();
        let lost = mine.iter().filter(|c| c.answered.is_none()).count() as u64;
        *counts.entry("kv: calls whose answer was lost").or_default() += lost;
        *counts.entry("kv: calls checked").or_default() += mine.len() as u64;
        match kv_check::check_key(&mine, KV_SEARCH_BUDGET) {
            kv_check::Verdict::Linearizable => {}
            kv_check::Verdict::Not { stuck_at } => out.push(format!(
                "kv: the history of key {key} ({} calls, {lost} unanswered) is not \
                 linearizable; no order explains {stuck_at}",
                mine.len()
            )),
            kv_check::Verdict::TooLarge => out.push(format!(
                "kv: the history of key {key} ({} calls, {lost} unanswered) outgrew the \
                 checker's search budget",
                mine.len()
            )),
        }
    }
    out
}

/// What the conflating consumers saw against each partition's newest offset at the end.
fn conflated_deliveries(shared: &Shared, db: &SimDb) -> Vec<String> {
    let Ok(seen) = shared.conflation_seen.lock() else {
        return vec![];
    };
    let heads = db
        .partitions(workload::CONFLATION_QUEUE)
        .into_iter()
        .filter_map(|name| {
            let (head, _) = db.partition_head(workload::CONFLATION_QUEUE, &name)?;
            Some((name, head))
        })
        .filter(|(_, head)| *head >= 0)
        .collect();
    super::conflation_check::check(&seen, &heads)
}

/// The stream workers' cycles against what the model committed.
fn stream_cycles(shared: &Shared, db: &SimDb) -> Vec<String> {
    use super::streams_check::{self, Committed};
    let Ok(cycles) = shared.stream_cycles.lock() else {
        return vec![];
    };
    let state = db
        .stream_state_rows()
        .into_iter()
        .filter(|((_, _, key), _)| key == "count")
        .filter_map(|((_, pid, _), v)| Some((pid, (v["count"].as_i64()?, v["last"].as_i64()?))))
        .collect();
    let sink = db
        .messages(workload::STREAM_SINK)
        .iter()
        .filter_map(|(_, _, payload)| streams_check::sink_entry(payload))
        .collect();
    let cursors = db
        .partitions(workload::STREAM_SOURCE)
        .into_iter()
        .filter_map(|name| {
            let (_, pid) = db.partition_head(workload::STREAM_SOURCE, &name)?;
            let cursor = db
                .cursor(workload::STREAM_SOURCE, &name, workload::STREAM_GROUP)
                .map(|c| c.committed);
            Some((pid, cursor))
        })
        .collect();
    let mut out = streams_check::check(
        &cycles,
        &Committed {
            state,
            sink,
            cursors,
        },
    );
    let Ok(closes) = shared.window_closes.lock() else {
        return out;
    };
    let open = db
        .stream_state_rows()
        .into_iter()
        .filter(|((_, _, key), _)| key.starts_with(workload::WINDOW_PREFIX))
        .filter_map(|((_, pid, _), v)| Some((pid, v["from"].as_i64()?)))
        .collect();
    let emitted = db
        .messages(workload::STREAM_WINDOWS)
        .iter()
        .filter_map(|(_, _, payload)| streams_check::window_entry(payload))
        .collect();
    out.extend(streams_check::check_windows(
        &cycles,
        &closes,
        &streams_check::CommittedWindows { open, emitted },
    ));
    out
}

/// Search steps per key: far above what a run's few hundred calls need.
const KV_SEARCH_BUDGET: u64 = 2_000_000;
