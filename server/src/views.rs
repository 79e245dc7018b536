//! The read models: what the admin and observability routes show, computed from storage's
//! inventory views (`InspectStorage`) and the brokers' per-minute samples (the routes in
//! `routes/admin/` parse parameters and render; the counting, depth, lag and bucketing rules
//! live here, once), and `reads`, every read a route makes of storage.

use std::collections::BTreeMap;

use queen_core::storage::{InspectStorage, PartitionView, WorkerSample};
use queen_core::types::QUEUE_MODE_GROUP;
use queen_core::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::http::Failure;

pub(crate) fn page<T>(items: Vec<T>, limit: u32, offset: u32) -> Vec<T> {
    items
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect()
}

/// How deep a partition is for `group`, or (no group) for its slowest reader: the named groups'
/// lowest cursor, queue mode only when the queue has no named group, and everything retained
/// when nobody reads it. A group without a cursor on the partition reads it from the start.
pub(crate) fn depth(p: &PartitionView, groups: &[String], group: Option<&str>) -> u64 {
    let after = |g: &str| p.pending_after(p.cursor(g).map_or(-1, |c| c.committed));
    match group {
        Some(g) => after(g),
        None => {
            let named: Vec<&String> = groups.iter().filter(|g| *g != QUEUE_MODE_GROUP).collect();
            if !named.is_empty() {
                named.iter().map(|g| after(g)).max().unwrap_or(0)
            } else if groups.iter().any(|g| g == QUEUE_MODE_GROUP) {
                after(QUEUE_MODE_GROUP)
            } else {
                p.retained()
            }
        }
    }
}

/// Messages leased and not yet acknowledged on a partition, by `group` or by any.
pub(crate) fn processing(p: &PartitionView, group: Option<&str>) -> u64 {
    p.cursors
        .iter()
        .filter(|c| group.is_none_or(|g| g == c.group))
        .map(|c| c.in_flight())
        .max()
        .unwrap_or(0)
}

/// A backlog over partitions, for a group or (none) the slowest reader: what is pending, how
/// much of it is leased, and on how many partitions something is pending.
#[derive(Default, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Backlog {
    pub(crate) pending: u64,
    pub(crate) processing: u64,
    pub(crate) partitions_pending: u64,
}

impl Backlog {
    pub(crate) fn of(p: &PartitionView, groups: &[String], group: Option<&str>) -> Backlog {
        let pending = depth(p, groups, group);
        Backlog {
            pending,
            processing: processing(p, group).min(pending),
            partitions_pending: u64::from(pending > 0),
        }
    }

    pub(crate) fn add(&mut self, o: Backlog) {
        self.pending += o.pending;
        self.processing += o.processing;
        self.partitions_pending += o.partitions_pending;
    }

    pub(crate) fn ready(&self) -> u64 {
        self.pending - self.processing
    }
}

/// The six counts of Queen's stats objects, for a set of partitions.
#[derive(Default, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Counts {
    pub(crate) total: u64,
    pub(crate) pending: u64,
    pub(crate) processing: u64,
    pub(crate) dead_letter: u64,
}

impl Counts {
    pub(crate) fn of(p: &PartitionView, groups: &[String]) -> Counts {
        let processing = processing(p, None);
        Counts {
            total: p.retained(),
            pending: depth(p, groups, None).saturating_sub(processing),
            processing,
            dead_letter: 0,
        }
    }

    pub(crate) fn add(&mut self, o: Counts) {
        self.total += o.total;
        self.pending += o.pending;
        self.processing += o.processing;
        self.dead_letter += o.dead_letter;
    }

    pub(crate) fn completed(&self) -> u64 {
        self.total.saturating_sub(self.pending + self.processing)
    }

    /// Queen's stats object, typed, so a page of a thousand partitions serializes straight to
    /// bytes.
    pub(crate) fn wire(&self) -> CountsWire {
        CountsWire {
            total: self.total,
            pending: self.pending,
            processing: self.processing,
            completed: self.completed(),
            failed: 0,
            dead_letter: self.dead_letter,
        }
    }

    pub(crate) fn json(&self) -> Value {
        json!(self.wire())
    }
}

/// `Counts` as Queen's clients read it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CountsWire {
    total: u64,
    pending: u64,
    processing: u64,
    completed: u64,
    failed: u64,
    dead_letter: u64,
}

pub(crate) fn lag_stats(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return json!({"avg": 0, "median": 0, "min": 0, "max": 0});
    }
    values.sort_by(f64::total_cmp);
    let avg = values.iter().sum::<f64>() / values.len() as f64;
    json!({"avg": avg, "median": values[values.len() / 2], "min": values[0],
           "max": values[values.len() - 1]})
}

/// Samples of the last `minutes` summed over brokers: (pushed, acked) per second.
pub(crate) async fn recent_rates(
    inspect: &dyn InspectStorage,
    now: Timestamp,
    minutes: i64,
) -> Result<(f64, f64), Failure> {
    let samples = inspect
        .samples(now.minus_secs(minutes * 60), now.plus_secs(60))
        .await?;
    let secs = (minutes * 60) as f64;
    let pushed: u64 = samples.iter().map(|s| s.push_messages).sum();
    let acked: u64 = samples.iter().map(|s| s.ack_messages).sum();
    Ok((pushed as f64 / secs, acked as f64 / secs))
}

/// A message's status for the listing: dead_letter, else (named groups only) completed once
/// every named group passed it, else by queue mode's cursor: completed, processing, pending.
pub(crate) fn message_status(
    p: &PartitionView,
    groups: &[String],
    offset: i64,
    dead: bool,
    now: Timestamp,
) -> (&'static str, u64, u64) {
    let named: Vec<&String> = groups.iter().filter(|g| *g != QUEUE_MODE_GROUP).collect();
    let passed = |g: &str| p.cursor(g).is_some_and(|c| c.committed >= offset);
    let consumed_by = named.iter().filter(|g| passed(g)).count() as u64;
    if dead {
        return ("dead_letter", consumed_by, named.len() as u64);
    }
    let status = match p.cursor(QUEUE_MODE_GROUP) {
        Some(c) if c.committed >= offset => "completed",
        Some(c)
            if c.leased_through.is_some_and(|e| e >= offset)
                && c.leased_until.is_some_and(|t| t > now) =>
        {
            "processing"
        }
        Some(_) => "pending",
        None if !named.is_empty() && consumed_by == named.len() as u64 => "completed",
        None => "pending",
    };
    (status, consumed_by, named.len() as u64)
}

pub(crate) fn bucket_of(t: Timestamp, minutes: i64) -> Timestamp {
    let width = minutes * 60_000_000;
    Timestamp(t.0 - t.0.rem_euclid(width))
}

/// Samples summed per bucket (over brokers), oldest first.
pub(crate) fn bucketed(samples: &[WorkerSample], minutes: i64) -> Vec<(Timestamp, WorkerSample)> {
    let mut by: BTreeMap<Timestamp, WorkerSample> = BTreeMap::new();
    for s in samples {
        let b = by.entry(bucket_of(s.bucket, minutes)).or_default();
        b.push_requests += s.push_requests;
        b.push_messages += s.push_messages;
        b.pop_requests += s.pop_requests;
        b.pop_messages += s.pop_messages;
        b.pop_empty += s.pop_empty;
        b.ack_requests += s.ack_requests;
        b.ack_messages += s.ack_messages;
        b.ack_failed += s.ack_failed;
        b.dead_lettered += s.dead_lettered;
        b.db_errors += s.db_errors;
        b.lag_max_ms = b.lag_max_ms.max(s.lag_max_ms);
        b.lag_avg_ms = b.lag_avg_ms.max(s.lag_avg_ms);
        b.cpu_user_pct += s.cpu_user_pct;
        b.cpu_system_pct += s.cpu_system_pct;
        b.rss_bytes += s.rss_bytes;
        b.pool_size += s.pool_size;
        b.pool_in_use += s.pool_in_use;
        b.parked += s.parked;
    }
    by.into_iter().collect()
}

pub(crate) fn stat(values: &[f64]) -> Value {
    if values.is_empty() {
        return json!({"avg": 0, "min": 0, "max": 0, "last": 0});
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({"avg": values.iter().sum::<f64>() / values.len() as f64, "min": min, "max": max,
           "last": values[values.len() - 1]})
}

/// One (group, queue) pair's lag over the queue's partitions.
#[derive(Default, Clone, Serialize, Deserialize)]
pub(crate) struct GroupLag {
    pub(crate) members: u64,
    /// `total_lag` and `partitions_with_lag` of Queen's answers.
    pub(crate) backlog: Backlog,
    pub(crate) max_time_lag: u64,
    pub(crate) consumed: i64,
}

impl GroupLag {
    /// Adds one partition of the queue (whose groups are `groups`) to `group`'s lag.
    pub(crate) fn add(
        &mut self,
        p: &PartitionView,
        groups: &[String],
        group: &str,
        now: Timestamp,
    ) {
        let backlog = Backlog::of(p, groups, Some(group));
        let pending = backlog.pending;
        self.backlog.add(backlog);
        let oldest = match p.cursor(group) {
            Some(c) => {
                self.members += 1;
                self.consumed += c.total_consumed;
                c.oldest_unconsumed_at
            }
            // No cursor yet: it reads from the oldest stored message.
            None => p.oldest_at.filter(|_| pending > 0),
        };
        if let Some(t) = oldest {
            self.max_time_lag = self.max_time_lag.max(t.millis_until(now) / 1000);
        }
    }
}
