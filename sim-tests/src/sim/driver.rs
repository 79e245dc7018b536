//! The driver: at every simulated tick, faults during the work phase (aimed and plain crashes,
//! held and partitioned links, cut notification lines), then heal and drain; the delivery-bound
//! checker runs at every step where a scenario holds to it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use queen_core::pop::STORAGE_AWAY_CAP_MS;
use queen_core::rng::SeededRng;
use queen_storage_sim::SimDb;

use super::hosts::Fleet;
use super::{
    hit, workload, Aim, CoverageLabel, Faults, Liveness, Scenario, Shared, Spec, AIMED_POINTS,
    DELIVERY_BOUND_US, PRODUCTION_BACKOFF, TICK,
};

/// The bound on a broker's pop calls while its pops are cut off from the database comes in waves:
/// after a call fails, no pop of the broker asks again for the broker-wide wait (at least the
/// re-check's initial interval), so the calls of a cut are those of one wave per interval at
/// most, and a wave is the calls already in flight together when the first of them failed. This many a wave (the
/// runs show one to three a cut); a broker whose parked pops wake one another after each failure
/// asks as fast as calls fail.
const POP_CALLS_A_WAVE: u64 = 4;

/// A link held or partitioned: (client, broker, until, is a partition).
type HeldLink = (String, String, Duration, bool);

/// The driver's state across steps; its findings and coverage go to the judge.
pub(super) struct Driver<'a> {
    spec: Spec,
    faults: Faults,
    rng: SeededRng,
    fleet: &'a Fleet,
    shared: &'a Shared,
    db: &'a Arc<SimDb>,
    clients: Vec<String>,
    work: Duration,
    crashed: Vec<(String, Duration)>,
    held: Vec<HeldLink>,
    pub counts: BTreeMap<&'static str, u64>,
    pub liveness: Liveness,
    /// The delivery bound of the prompt scenario's ephemeral consumers.
    pub ephemeral_liveness: Liveness,
    /// Brokers whose reach to the ephemeral owner rows is cut: (broker index, healed at).
    owner_cuts: Vec<(usize, Duration)>,
    /// A cut notification line: (broker index, restored at).
    outage: Option<(usize, Duration)>,
    /// Pops cut off from the database: (broker index, cut at, restored at). Drawn from a
    /// stream of their own, so the other faults of a seed are drawn as before.
    pop_cut: Option<(usize, Duration, Duration)>,
    pop_cut_rng: SeededRng,
    /// The most failing pop calls one cut saw, against its bound (coverage).
    pub pop_cut_calls: (u64, u64),
    quiet_since: Option<Duration>,
    pub violations: Vec<String>,
    /// Lock safety: the highest token seen per lock, and each permit row's version.
    lock_tokens: BTreeMap<String, i64>,
    permit_versions: BTreeMap<String, i64>,
    /// Each permit the model held: (lock, token) → when it expires (simulated microseconds;
    /// `None`: never), for the judge's check of refused acquires.
    pub permit_expiry: BTreeMap<(String, i64), Option<i64>>,
}

impl<'a> Driver<'a> {
    pub(super) fn new(
        spec: Spec,
        faults: Faults,
        rng: SeededRng,
        fleet: &'a Fleet,
        shared: &'a Shared,
        db: &'a Arc<SimDb>,
    ) -> Driver<'a> {
        Driver {
            spec,
            faults,
            pop_cut_rng: rng.child("pop cuts"),
            rng,
            fleet,
            shared,
            db,
            clients: workload::client_names(spec.scenario),
            work: Duration::from_millis(spec.work_ms),
            crashed: vec![],
            held: vec![],
            counts: BTreeMap::new(),
            liveness: Liveness::new(DELIVERY_BOUND_US),
            ephemeral_liveness: Liveness::new(DELIVERY_BOUND_US),
            owner_cuts: vec![],
            outage: None,
            pop_cut: None,
            pop_cut_calls: (0, 0),
            quiet_since: None,
            violations: vec![],
            lock_tokens: BTreeMap::new(),
            permit_versions: BTreeMap::new(),
            permit_expiry: BTreeMap::new(),
        }
    }

    /// Steps the simulation to its end.
    pub(super) fn drive(&mut self, sim: &mut turmoil::Sim<'_>) {
        loop {
            let elapsed = sim.elapsed();
            self.crash_reached_aims(sim, elapsed);
            if elapsed < self.work {
                self.inject_faults(sim, elapsed);
            } else if !self.shared.draining.swap(true, Ordering::SeqCst) {
                self.heal_all(sim);
            }
            self.restore_due(sim);
            if self.spec.scenario == Scenario::Prompt {
                self.cut_or_restore_line(sim.elapsed());
                let pops_back = self.cut_or_restore_pops(sim.elapsed());
                let now = i64::try_from(sim.elapsed().as_micros()).unwrap_or(i64::MAX);
                let cut = self.outage.is_some() || self.pop_cut.is_some();
                let (waits, delivered) = self.shared.durable_waits();
                let found = self
                    .liveness
                    .check(now, cut, &waits, &delivered, self.db.as_ref());
                self.violations.extend(found);
                if pops_back {
                    // Nothing tells a broker that the database answers again: its pops learn it
                    // when they next ask, at most one broker-wide wait after the last failure.
                    // The bound holds from then.
                    let wait_ms = STORAGE_AWAY_CAP_MS.max(PRODUCTION_BACKOFF.initial_ms);
                    let wait_us = i64::try_from(wait_ms * 1_000).unwrap_or(i64::MAX);
                    self.liveness.hold_from(now + wait_us);
                }
                // Ephemeral wakes do not ride the notification line: the tight bound always.
                let (waits, tally) = self.shared.ephemeral_waits();
                let found =
                    self.ephemeral_liveness
                        .check(now, false, &waits, &tally.received, &tally);
                self.violations.extend(found);
            }
            if self.spec.scenario == Scenario::Faults {
                self.check_locks();
            }
            if self.spec.scenario == Scenario::Scale {
                // A large queue's cursors are made at their first claim (no first-contact seed):
                // a partition without one is held to the same bound as any other.
                let now = i64::try_from(sim.elapsed().as_micros()).unwrap_or(i64::MAX);
                let (waits, delivered) = self.shared.durable_waits();
                let found = self
                    .liveness
                    .check(now, false, &waits, &delivered, self.db.as_ref());
                self.violations.extend(found);
            }
            if self.shared.draining.load(Ordering::SeqCst)
                && !self.shared.done.load(Ordering::SeqCst)
            {
                self.judge_drain(sim.elapsed());
            }
            match sim.step() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    self.violations.push(format!("simulation error: {e}"));
                    break;
                }
            }
        }
    }

    /// Lock safety in model time, at every step: never more live permits of a lock than its
    /// limit, and every permit written (acquired, or renewed) carries a token above every token
    /// the lock had before (a resource that keeps the highest token refuses a replaced holder).
    fn check_locks(&mut self) {
        let now = self.db.now();
        let mut rows = self.db.kv_rows(queen_core::kv::LOCKS_NAMESPACE);
        rows.sort_by_key(|(_, r)| r.version);
        for (name, limit) in workload::LOCKS {
            let live = rows
                .iter()
                .filter(|(k, r)| queen_core::locks::slot_of(name, k).is_some() && r.live(now))
                .count();
            if live > limit as usize {
                self.violations.push(format!(
                    "locks: {live} live permits of {name}, limit {limit}"
                ));
            }
        }
        for (key, row) in &rows {
            if self.permit_versions.get(key) == Some(&row.version) {
                continue;
            }
            self.permit_versions.insert(key.clone(), row.version);
            let name = key.split('#').next().unwrap_or_default().to_string();
            let expiry = row.expires_at.map(|t| t.0 - super::sim_timestamp(0).0);
            self.permit_expiry
                .insert((name.clone(), row.version), expiry);
            let highest = self.lock_tokens.entry(name.clone()).or_insert(0);
            if row.version <= *highest {
                self.violations.push(format!(
                    "locks: {key} written with token {} after {name} had token {}: tokens only rise",
                    row.version, *highest
                ));
            }
            *highest = (*highest).max(row.version);
        }
    }

    /// A broker whose armed point was reached dies now.
    fn crash_reached_aims(&mut self, sim: &mut turmoil::Sim<'_>, elapsed: Duration) {
        for (i, b) in self.fleet.names.iter().enumerate() {
            let reached = self.fleet.aims[i].lock().ok().and_then(|mut a| {
                let point = a.point.filter(|_| a.reached);
                if point.is_some() {
                    *a = Aim::default();
                }
                point
            });
            if let Some(point) = reached {
                sim.crash(b.as_str());
                let back = elapsed + Duration::from_millis(200 + self.rng.below(1500));
                self.crashed.push((b.clone(), back));
                *self.counts.entry(point.coverage_label()).or_default() += 1;
            }
        }
    }

    /// The work phase's faults, each drawn per step at its per-second chance.
    fn inject_faults(&mut self, sim: &mut turmoil::Sim<'_>, elapsed: Duration) {
        let per_step = TICK.as_secs_f64();
        let faults = self.faults;
        for (i, b) in self.fleet.names.iter().enumerate() {
            if !self.crashed.iter().any(|(c, _)| c == b)
                && hit(&mut self.rng, faults.aimed_crash * per_step)
            {
                if let Ok(mut a) = self.fleet.aims[i].lock() {
                    if a.point.is_none() {
                        a.point =
                            Some(AIMED_POINTS[self.rng.below(AIMED_POINTS.len() as u64) as usize]);
                    }
                }
            }
        }
        for (i, reach) in self.fleet.reaches.iter().enumerate() {
            if !reach.is_cut() && hit(&mut self.rng, faults.owner_cut * per_step) {
                // Long enough, often, for its liveness to lapse (3.5 s) and its queues to move
                // (5 s); shorter cuts end before anyone notices.
                reach.set_cut(true);
                let healed = elapsed + Duration::from_millis(1_000 + self.rng.below(8_000));
                self.owner_cuts.push((i, healed));
                *self
                    .counts
                    .entry("fault: a broker cut from its ephemeral owner rows")
                    .or_default() += 1;
            }
        }
        for b in &self.fleet.names {
            if !self.crashed.iter().any(|(c, _)| c == b)
                && hit(&mut self.rng, faults.crash * per_step)
            {
                sim.crash(b.as_str());
                let back = elapsed + Duration::from_millis(200 + self.rng.below(1500));
                self.crashed.push((b.clone(), back));
                *self.counts.entry("fault: broker crash").or_default() += 1;
            }
            let n = self.clients.len() as f64;
            for c in &self.clients {
                if hit(&mut self.rng, faults.hold * per_step / n) {
                    sim.hold(c.as_str(), b.as_str());
                    let until = elapsed + Duration::from_millis(50 + self.rng.below(800));
                    self.held.push((c.clone(), b.clone(), until, false));
                    *self.counts.entry("fault: hold").or_default() += 1;
                }
                if hit(&mut self.rng, faults.partition * per_step / n) {
                    sim.partition(c.as_str(), b.as_str());
                    let until = elapsed + Duration::from_millis(100 + self.rng.below(1500));
                    self.held.push((c.clone(), b.clone(), until, true));
                    *self.counts.entry("fault: partition").or_default() += 1;
                }
            }
        }
    }

    /// The work phase ended: heal everything; no more aimed crashes (one reached meanwhile was
    /// handled already).
    fn heal_all(&mut self, sim: &mut turmoil::Sim<'_>) {
        for a in &self.fleet.aims {
            if let Ok(mut a) = a.lock() {
                if !a.reached {
                    *a = Aim::default();
                }
            }
        }
        for (c, b, _, _) in self.held.drain(..) {
            sim.release(c.as_str(), b.as_str());
            sim.repair(c.as_str(), b.as_str());
        }
        for (i, _) in self.owner_cuts.drain(..) {
            self.fleet.reaches[i].set_cut(false);
        }
    }

    /// Crashed brokers come back, and held links heal, when their time comes (brokers at once
    /// while draining).
    fn restore_due(&mut self, sim: &mut turmoil::Sim<'_>) {
        let draining = self.shared.draining.load(Ordering::SeqCst);
        self.crashed.retain(|(b, back)| {
            if sim.elapsed() >= *back || draining {
                sim.bounce(b.as_str());
                false
            } else {
                true
            }
        });
        let reaches = &self.fleet.reaches;
        self.owner_cuts.retain(|(i, healed)| {
            let heal = sim.elapsed() >= *healed;
            if heal {
                reaches[*i].set_cut(false);
            }
            !heal
        });
        self.held.retain(|(c, b, until, is_partition)| {
            if sim.elapsed() >= *until {
                if *is_partition {
                    sim.repair(c.as_str(), b.as_str());
                } else {
                    sim.release(c.as_str(), b.as_str());
                }
                false
            } else {
                true
            }
        });
    }

    /// The prompt scenario cuts one broker's notification line now and then (LISTEN lost), and
    /// restores it later with the resync a reconnect does.
    fn cut_or_restore_line(&mut self, elapsed: Duration) {
        let lines = &self.fleet.lines;
        let per_step = TICK.as_secs_f64();
        match self.outage {
            None if elapsed < self.work && hit(&mut self.rng, 0.15 * per_step) => {
                let b = self.rng.below(lines.len() as u64) as usize;
                lines[b].down.store(true, Ordering::SeqCst);
                let back = elapsed + Duration::from_millis(1_000 + self.rng.below(3_000));
                self.outage = Some((b, back));
                *self
                    .counts
                    .entry("fault: notification line cut (LISTEN lost)")
                    .or_default() += 1;
            }
            Some((b, back)) if elapsed >= back || self.shared.draining.load(Ordering::SeqCst) => {
                // Reconnected: the listener resyncs before anything else, as
                // `PgStorage::listen_events` does.
                lines[b].down.store(false, Ordering::SeqCst);
                if std::env::var("SIM_EVENTS").is_ok() {
                    eprintln!("{} ms broker{b} line restored: Resync", elapsed.as_millis());
                }
                if let Ok(l) = lines[b].events.lock() {
                    if let Some(tx) = l.as_ref() {
                        let _ = tx.send(queen_core::events::DeliveryEvent::Resync);
                    }
                }
                self.outage = None;
            }
            _ => {}
        }
    }

    /// The prompt scenario cuts one broker's pops off from the database now and then (every pop
    /// storage call fails as against a PostgreSQL that is down; pushes and acks still land), for
    /// 0.3 to 2.5 s. At the restore, the broker's failed calls meanwhile are held to a bound
    /// (`POP_CALLS_A_WAVE`). Returns whether a cut ended now.
    fn cut_or_restore_pops(&mut self, elapsed: Duration) -> bool {
        let per_step = TICK.as_secs_f64();
        match self.pop_cut {
            None if elapsed < self.work && hit(&mut self.pop_cut_rng, 0.15 * per_step) => {
                let b = self.pop_cut_rng.below(self.fleet.pop_reaches.len() as u64) as usize;
                self.fleet.pop_reaches[b].cut();
                let back = elapsed + Duration::from_millis(300 + self.pop_cut_rng.below(2_200));
                self.pop_cut = Some((b, elapsed, back));
                *self
                    .counts
                    .entry("fault: a broker's pops cut off from the database")
                    .or_default() += 1;
                false
            }
            Some((b, since, back))
                if elapsed >= back || self.shared.draining.load(Ordering::SeqCst) =>
            {
                let calls = self.fleet.pop_reaches[b].restore();
                let cut_ms = u64::try_from((elapsed - since).as_millis()).unwrap_or(u64::MAX);
                let bound = POP_CALLS_A_WAVE * (2 + cut_ms / PRODUCTION_BACKOFF.initial_ms);
                if std::env::var("SIM_EVENTS").is_ok() {
                    eprintln!(
                        "{} ms broker{b} pops restored after {cut_ms} ms: {calls} failed calls",
                        elapsed.as_millis()
                    );
                }
                if calls > self.pop_cut_calls.0 {
                    self.pop_cut_calls = (calls, bound);
                }
                if calls > bound {
                    self.violations.push(format!(
                        "liveness: broker{b}'s pops asked the database {calls} times while cut \
                         off from it for {cut_ms} ms (bound {bound}): a wake loop, not a wait"
                    ));
                }
                self.pop_cut = None;
                true
            }
            _ => false,
        }
    }

    /// While draining: the run is done once every group stayed drained for a second (the
    /// faults scenario first removes what every group consumed and starts a late group), and
    /// fails if anything is still pending a minute after healing.
    fn judge_drain(&mut self, elapsed: Duration) {
        let scenario = self.spec.scenario;
        let queue = workload::queue_of(scenario);
        let db = self.db;
        // Drained: every group's cursor is at every partition's head (a held lease or a
        // retry hold is not drained, whatever has_pending says).
        let drained_for = |targets: &[(&str, &str)]| {
            targets.iter().all(|(queue, g)| {
                db.partitions(queue).iter().all(|p| {
                    let head = db.partition_head(queue, p).map_or(-1, |(h, _)| h);
                    head < 0 || db.cursor(queue, p, g).is_some_and(|c| c.committed >= head)
                })
            })
        };
        let mut targets = workload::drain_targets(scenario);
        let late = scenario == Scenario::Faults;
        let go = &self.shared.late_group_go;
        if late && !go.load(Ordering::SeqCst) && drained_for(&targets) {
            // Retention of everything every group has consumed, then a group's first
            // contact: its cursors start below segments that are gone (the seal's case).
            for p in db.partitions(queue) {
                let head = db.partition_head(queue, &p).map_or(-1, |(h, _)| h);
                if head >= 0 && db.drop_segments(queue, &p, head + 1).is_ok() {
                    *self
                        .counts
                        .entry("fault: retention removed a consumed partition")
                        .or_default() += 1;
                }
            }
            go.store(true, Ordering::SeqCst);
        }
        if late {
            targets.push((queue, workload::LATE_GROUP));
        }
        // A pending timer is a message to come.
        let drained = (!late || go.load(Ordering::SeqCst))
            && drained_for(&targets)
            && db.pending_timers() == 0;
        if !drained {
            self.quiet_since = None;
        } else if self.quiet_since.is_none() {
            self.quiet_since = Some(elapsed);
        }
        if self
            .quiet_since
            .is_some_and(|q| elapsed >= q + Duration::from_secs(1))
        {
            self.shared.done.store(true, Ordering::SeqCst);
        }
        if elapsed > self.work + Duration::from_secs(60) {
            self.violations
                .push("liveness: messages still pending 60 s after healing".to_string());
            self.shared.done.store(true, Ordering::SeqCst);
        }
    }
}
