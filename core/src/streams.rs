//! The streams surface's rules, sans-IO: what a well-formed query registration, state read and
//! cycle are, which registration verdict a stored query gets, which state rows a read selects,
//! and why a cycle is refused. The streaming SDKs of Queen's clients compute windows, keys and
//! gates themselves; the broker keeps per-(query, source partition) state rows and commits one
//! cycle (state changes, sink pushes, the source ack) in one transaction.
//!
//! A cycle is fenced on the source lease as a whole, not only its ack: when it names a lease,
//! the lease must still be live and held by that id, even for messages already committed. An
//! ack alone is idempotent after its commit (a retried transaction's ack), but a cycle is not:
//! a worker whose lease expired and was re-claimed would otherwise overwrite the state its
//! successor committed with state computed from older rows.
//!
//! A cycle is also fenced on the state it closes. The SDKs delete only rows they read (a window's
//! row, once its window is emitted), and two paths close windows: the regular cycle, and the idle
//! flush (a cycle without an ack, run by a timer beside it, by any worker of the query). When two
//! of them read the same row, both would emit its window. So a delete must find its row, or the
//! whole cycle is refused ([`StreamRefusal::StateGone`]): of two cycles that read one row, the
//! first to commit emits it, the other commits nothing and the SDK's redo reads the state as it
//! is. A cycle without an ack is refused while a worker of the group holds the source
//! partition's lease ([`StreamRefusal::SourceLeased`]): the holder's cycle read the state after
//! its pop and commits under the lease, so no flush may change that state in between (a flush
//! that deleted a row the holder then upserts would emit the window twice). And a flush may
//! delete a window's row (one with a numeric `windowEnd`) only as its ripe read saw it: that read
//! stamps each row it answers with the row's version, every write of a row gives it a new one,
//! and a flush's delete of a window row whose stamp is not its version is refused
//! ([`StreamRefusal::StateGone`]). Without it a flush that read a window, then met a whole
//! regular cycle that added an event to it, would emit the window without that event and delete
//! it (found by two SDK workers of one sliding-window query: 47 of 48 counted).

use serde_json::Value;

use crate::types::Timestamp;

/// Size limits of the streams surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    pub max_name_bytes: usize,
    pub max_hash_bytes: usize,
    pub max_key_bytes: usize,
    /// A state value's JSON text.
    pub max_value_bytes: usize,
    /// State ops of one cycle.
    pub max_state_ops: usize,
    /// Keys of one state read.
    pub max_keys: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            max_name_bytes: 255,
            max_hash_bytes: 255,
            max_key_bytes: 1024,
            max_value_bytes: 1024 * 1024,
            max_state_ops: 10_000,
            max_keys: 10_000,
        }
    }
}

/// `POST /streams/v1/queries`: register a query by name, or find it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryRegistration {
    pub name: String,
    pub source_queue: String,
    pub sink_queue: Option<String>,
    pub config_hash: String,
    /// A changed hash drops every state row of the query instead of being refused.
    pub reset: bool,
}

/// A stored query, as registration reads it under its row lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredQuery {
    pub id: uuid::Uuid,
    pub config_hash: String,
}

/// What registration does with the query stored under the name (if any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationStep {
    /// No query of that name: insert it.
    Create,
    /// Same hash: answer the stored id, change nothing.
    Existing,
    /// Another hash with `reset`: drop the query's state and store the new hash.
    Reset,
    /// Another hash without `reset`: refused (409), nothing changed.
    Mismatch,
}

/// The verdict of a registration against the stored query of its name.
pub fn registration_step(
    req: &QueryRegistration,
    stored: Option<&StoredQuery>,
) -> RegistrationStep {
    match stored {
        None => RegistrationStep::Create,
        Some(q) if q.config_hash == req.config_hash => RegistrationStep::Existing,
        Some(_) if req.reset => RegistrationStep::Reset,
        Some(_) => RegistrationStep::Mismatch,
    }
}

/// A registration's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    Registered {
        query_id: uuid::Uuid,
        /// This call created the query.
        fresh: bool,
        /// This call dropped the query's state for a new hash.
        reset: bool,
    },
    /// The name is registered with another hash (`reset` was not asked).
    HashMismatch { stored_hash: String },
}

/// `POST /streams/v1/state/get`: rows of one (query, partition) shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateQuery {
    pub query_id: uuid::Uuid,
    pub partition_id: String,
    /// Empty: every row of the shard (narrowed by the filters below).
    pub keys: Vec<String>,
    /// Only keys starting with this (the SDK's idle flush: one window operator's rows).
    pub key_prefix: Option<String>,
    /// Only rows whose value's `windowEnd` (epoch ms) is at or before this: the windows that
    /// have closed. A row without a numeric `windowEnd` is never ripe.
    pub ripe_at_or_before: Option<i64>,
}

impl StateQuery {
    /// Whether the row of `key` holding `value` is one the read asks for. PostgreSQL's
    /// statement (`storage-pg/src/streams.rs`) applies the same three filters.
    pub fn selects(&self, key: &str, value: &Value) -> bool {
        (self.keys.is_empty() || self.keys.iter().any(|k| k == key))
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| key.starts_with(p))
            && self
                .ripe_at_or_before
                .is_none_or(|at| window_end(value).is_some_and(|end| end <= at))
    }
}

/// A state value's `windowEnd`, when it is a number (epoch ms; a float is truncated, as
/// PostgreSQL's `::numeric::bigint` cast of the JSON number rounds it: only whole numbers are
/// written by the SDKs).
pub fn window_end(value: &Value) -> Option<i64> {
    let end = value.get("windowEnd")?;
    end.as_i64()
        .or_else(|| end.as_f64().map(|f| f.round() as i64))
}

/// One state row as read.
#[derive(Clone, Debug, PartialEq)]
pub struct StateRow {
    pub key: String,
    pub value: Value,
    pub updated_at: Timestamp,
}

/// One state change of a cycle, scoped to the cycle's (query, partition).
#[derive(Clone, Debug, PartialEq)]
pub enum StateOp {
    Upsert { key: String, value: Value },
    Delete { key: String },
}

impl StateOp {
    pub fn key(&self) -> &str {
        match self {
            StateOp::Upsert { key, .. } | StateOp::Delete { key } => key,
        }
    }
}

/// The state part of a cycle, run first in the cycle's transaction: the checks that fence the
/// whole cycle, then the state ops in order.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamCycleOp {
    pub query_id: uuid::Uuid,
    /// The source partition (its id) the cycle's state and ack belong to.
    pub partition_id: String,
    /// The consumer group the cycle's ack acts for (the fence's cursor row).
    pub group: String,
    /// The source lease the cycle was computed under (`None`: a cycle without an ack, the
    /// SDK's idle flush of closed windows, which holds no lease).
    pub lease_id: Option<String>,
    pub ops: Vec<StateOp>,
}

/// What a cycle's state ops leave behind, key by key (a later op on a key replaces an earlier
/// one): the values to upsert and the keys to delete, each in key order. Both backends write
/// this net effect, so a key upserted then deleted in one cycle ends deleted.
pub fn net_effect(ops: &[StateOp]) -> (Vec<(String, Value)>, Vec<String>) {
    let mut last: std::collections::BTreeMap<&str, Option<&Value>> = Default::default();
    for op in ops {
        match op {
            StateOp::Upsert { key, value } => last.insert(key, Some(value)),
            StateOp::Delete { key } => last.insert(key, None),
        };
    }
    let mut upserts = vec![];
    let mut deletes = vec![];
    for (key, value) in last {
        match value {
            Some(v) => upserts.push((key.to_string(), v.clone())),
            None => deletes.push(key.to_string()),
        }
    }
    (upserts, deletes)
}

/// Why a cycle commits nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRefusal {
    /// No query has that id (never registered, or deleted).
    UnknownQuery,
    /// The partition is not one of the query's source queue.
    ForeignPartition,
    /// The source lease the cycle names is no longer live, or is held by another consumer.
    LeaseLost,
    /// A state delete names a row that is not there (another cycle closed it since this one
    /// read it), or a flush deletes a window row changed since its ripe read.
    StateGone,
    /// A cycle without an ack (an idle flush) while a worker of the group holds the source
    /// partition's lease: the holder's cycle may change the state this one read.
    SourceLeased,
}

/// Every refusal, for lookups by message.
const REFUSALS: [StreamRefusal; 5] = [
    StreamRefusal::UnknownQuery,
    StreamRefusal::ForeignPartition,
    StreamRefusal::LeaseLost,
    StreamRefusal::StateGone,
    StreamRefusal::SourceLeased,
];

impl StreamRefusal {
    /// The one wording of both backends; also the transaction's error.
    pub fn message(self) -> &'static str {
        match self {
            StreamRefusal::UnknownQuery => "stream query not found",
            StreamRefusal::ForeignPartition => {
                "partition_id is not a partition of the query's source queue"
            }
            StreamRefusal::LeaseLost => {
                "source lease lost: the lease is expired or held by another consumer"
            }
            StreamRefusal::StateGone => {
                "stream state changed: a state delete names a row that is no longer there, or \
                 that another cycle changed since it was read; nothing of the cycle was applied"
            }
            StreamRefusal::SourceLeased => {
                "stream state busy: a cycle without an ack while a worker holds the source \
                 partition's lease; nothing of the cycle was applied"
            }
        }
    }

    /// The refusal a message names, when it is one (the transaction carries it as text).
    pub fn from_message(message: &str) -> Option<StreamRefusal> {
        REFUSALS.into_iter().find(|r| r.message() == message)
    }

    /// A conflict with another cycle over the same state (answered 409): the SDK's redo reads
    /// the state again.
    pub fn is_state_conflict(self) -> bool {
        matches!(self, StreamRefusal::StateGone | StreamRefusal::SourceLeased)
    }
}

/// The keys whose rows a cycle deletes as it read them: those whose first op in the cycle is a
/// delete (a key the cycle upserts first is its own to delete). Each must be there when the
/// cycle commits. In key order, without repeats.
pub fn deletes_of_read_rows(ops: &[StateOp]) -> Vec<String> {
    let mut first: std::collections::BTreeMap<&str, bool> = Default::default();
    for op in ops {
        first
            .entry(op.key())
            .or_insert(matches!(op, StateOp::Delete { .. }));
    }
    first
        .into_iter()
        .filter(|(_, delete)| *delete)
        .map(|(k, _)| k.to_string())
        .collect()
}

/// What the fence reads: the cursor row's lease, if the row exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseView {
    pub worker: Option<uuid::Uuid>,
    pub expires_at: Option<Timestamp>,
}

/// The fence of a cycle naming `lease_id`: its lease must be live at `now` and held by that id.
pub fn lease_holds(lease_id: &str, row: Option<LeaseView>, now: Timestamp) -> bool {
    row.is_some_and(|r| {
        r.expires_at.is_some_and(|t| t > now) && r.worker.is_some_and(|w| w.to_string() == lease_id)
    })
}

/// The answer of `TxOp::EndLease`: an ack that never fails; `ended` names the partition whose
/// lease it ended (`None`: no live lease of that id was left to end).
pub fn lease_end_outcome(ended: Option<(String, String)>) -> crate::storage::AckOutcome {
    let lease_released = ended.is_some();
    let (queue, partition) = ended.unzip();
    crate::storage::AckOutcome {
        success: true,
        error: None,
        queue,
        partition,
        lease_released,
        dlq: false,
        noop: false,
    }
}

/// Whether a worker holds the cursor row's lease at `now` (whoever it is).
pub fn lease_is_live(row: Option<LeaseView>, now: Timestamp) -> bool {
    row.is_some_and(|r| r.worker.is_some() && r.expires_at.is_some_and(|t| t > now))
}

/// A row a cycle deletes as read, as the cycle's fence finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowFound {
    pub key: String,
    /// Its value has a numeric `windowEnd` (a window's row: what a ripe read selects).
    pub window: bool,
    /// Its last ripe read stamped the version it has now: unchanged since that read.
    pub as_ripe_read: bool,
}

/// What a ripe read (`StateQuery::ripe_at_or_before`) leaves on each row it answers: the row's
/// version, so the flush that read it can delete it only as it read it.
pub fn ripe_read_stamps(query: &StateQuery) -> bool {
    query.ripe_at_or_before.is_some()
}

/// What the checks of a cycle read, under the cycle's locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleView<'a> {
    /// The query's source queue (`None`: no such query).
    pub query_source: Option<&'a str>,
    /// The queue the partition belongs to (`None`: no such partition).
    pub source_of_partition: Option<&'a str>,
    /// The group's cursor row on the partition.
    pub lease: Option<LeaseView>,
    /// Of [`deletes_of_read_rows`], the rows that are there.
    pub rows_found: &'a [RowFound],
}

/// The checks of a cycle before its state ops, in the order both backends make them.
pub fn check_cycle(
    op: &StreamCycleOp,
    view: &CycleView<'_>,
    now: Timestamp,
) -> Result<(), StreamRefusal> {
    let Some(source) = view.query_source else {
        return Err(StreamRefusal::UnknownQuery);
    };
    if view.source_of_partition != Some(source) {
        return Err(StreamRefusal::ForeignPartition);
    }
    match op.lease_id.as_deref() {
        Some(id) if !lease_holds(id, view.lease, now) => return Err(StreamRefusal::LeaseLost),
        Some(_) => {}
        None if lease_is_live(view.lease, now) => return Err(StreamRefusal::SourceLeased),
        None => {}
    }
    let flush = op.lease_id.is_none();
    let gone = deletes_of_read_rows(&op.ops).iter().any(|k| {
        match view.rows_found.iter().find(|r| &r.key == k) {
            None => true,
            Some(r) => flush && r.window && !r.as_ripe_read,
        }
    });
    if gone {
        return Err(StreamRefusal::StateGone);
    }
    Ok(())
}

/// Checks a name-like field (query name, config hash, state key): non-empty, within `max`
/// bytes, no control characters.
pub fn check_text(what: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{what} is required"));
    }
    if value.len() > max {
        return Err(format!("{what} is longer than {max} bytes"));
    }
    if value.chars().any(|c| c.is_control() && c != '\u{1f}') {
        return Err(format!("{what} must not contain control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: Timestamp = Timestamp(1_700_000_000_000_000);

    fn reg(hash: &str, reset: bool) -> QueryRegistration {
        QueryRegistration {
            name: "q1".into(),
            source_queue: "src".into(),
            sink_queue: None,
            config_hash: hash.into(),
            reset,
        }
    }

    #[test]
    fn the_last_op_on_a_key_wins() {
        let ops = vec![
            StateOp::Upsert {
                key: "b".into(),
                value: json!(1),
            },
            StateOp::Delete { key: "a".into() },
            StateOp::Upsert {
                key: "a".into(),
                value: json!(2),
            },
            StateOp::Delete { key: "b".into() },
        ];
        assert_eq!(
            net_effect(&ops),
            (vec![("a".to_string(), json!(2))], vec!["b".to_string()])
        );
    }

    #[test]
    fn registration_steps() {
        let stored = StoredQuery {
            id: uuid::Uuid::nil(),
            config_hash: "h1".into(),
        };
        assert_eq!(
            registration_step(&reg("h1", false), None),
            RegistrationStep::Create
        );
        assert_eq!(
            registration_step(&reg("h1", true), Some(&stored)),
            RegistrationStep::Existing,
            "the same hash never resets, even when asked"
        );
        assert_eq!(
            registration_step(&reg("h2", false), Some(&stored)),
            RegistrationStep::Mismatch
        );
        assert_eq!(
            registration_step(&reg("h2", true), Some(&stored)),
            RegistrationStep::Reset
        );
    }

    #[test]
    fn state_reads_select_by_keys_prefix_and_ripeness() {
        let q = |keys: &[&str], prefix: Option<&str>, ripe: Option<i64>| StateQuery {
            query_id: uuid::Uuid::nil(),
            partition_id: "p".into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            key_prefix: prefix.map(str::to_string),
            ripe_at_or_before: ripe,
        };
        let v = json!({"acc": 3, "windowEnd": 1000});
        assert!(q(&[], None, None).selects("w\u{1f}a", &v));
        assert!(q(&["w\u{1f}a"], None, None).selects("w\u{1f}a", &v));
        assert!(!q(&["other"], None, None).selects("w\u{1f}a", &v));
        assert!(q(&[], Some("w\u{1f}"), None).selects("w\u{1f}a", &v));
        assert!(!q(&[], Some("x\u{1f}"), None).selects("w\u{1f}a", &v));
        assert!(
            q(&[], None, Some(1000)).selects("k", &v),
            "closed at its end"
        );
        assert!(!q(&[], None, Some(999)).selects("k", &v));
        assert!(
            !q(&[], None, Some(5000)).selects("k", &json!(7)),
            "no windowEnd"
        );
        assert!(!q(&[], None, Some(5000)).selects("k", &json!({"windowEnd": "1"})));
    }

    fn view<'a>(
        query_source: Option<&'a str>,
        source_of_partition: Option<&'a str>,
        lease: Option<LeaseView>,
        rows_found: &'a [RowFound],
    ) -> CycleView<'a> {
        CycleView {
            query_source,
            source_of_partition,
            lease,
            rows_found,
        }
    }

    fn found(key: &str, window: bool, as_ripe_read: bool) -> RowFound {
        RowFound {
            key: key.into(),
            window,
            as_ripe_read,
        }
    }

    #[test]
    fn the_fence_needs_a_live_lease_held_by_the_id() {
        let w = uuid::Uuid::from_u128(7);
        let live = LeaseView {
            worker: Some(w),
            expires_at: Some(T0.plus_secs(10)),
        };
        let op = StreamCycleOp {
            query_id: uuid::Uuid::nil(),
            partition_id: "p".into(),
            group: "g".into(),
            lease_id: Some(w.to_string()),
            ops: vec![],
        };
        let src = Some("src");
        assert_eq!(
            check_cycle(&op, &view(src, src, Some(live), &[]), T0),
            Ok(())
        );
        assert_eq!(
            check_cycle(&op, &view(None, src, Some(live), &[]), T0),
            Err(StreamRefusal::UnknownQuery)
        );
        assert_eq!(
            check_cycle(&op, &view(src, Some("other"), Some(live), &[]), T0),
            Err(StreamRefusal::ForeignPartition)
        );
        assert_eq!(
            check_cycle(&op, &view(src, None, None, &[]), T0),
            Err(StreamRefusal::ForeignPartition)
        );
        assert_eq!(
            check_cycle(&op, &view(src, src, Some(live), &[]), T0.plus_secs(10)),
            Err(StreamRefusal::LeaseLost),
            "expired"
        );
        let other = LeaseView {
            worker: Some(uuid::Uuid::from_u128(8)),
            ..live
        };
        assert_eq!(
            check_cycle(&op, &view(src, src, Some(other), &[]), T0),
            Err(StreamRefusal::LeaseLost),
            "re-claimed by another"
        );
        let flush = StreamCycleOp {
            lease_id: None,
            ..op
        };
        assert_eq!(check_cycle(&flush, &view(src, src, None, &[]), T0), Ok(()));
        for r in REFUSALS {
            assert_eq!(StreamRefusal::from_message(r.message()), Some(r));
        }
    }

    #[test]
    fn a_flush_waits_for_no_lease_and_a_delete_needs_its_row() {
        let live = LeaseView {
            worker: Some(uuid::Uuid::from_u128(7)),
            expires_at: Some(T0.plus_secs(10)),
        };
        let flush = StreamCycleOp {
            query_id: uuid::Uuid::nil(),
            partition_id: "p".into(),
            group: "g".into(),
            lease_id: None,
            ops: vec![
                StateOp::Delete { key: "w1".into() },
                StateOp::Upsert {
                    key: "w2".into(),
                    value: json!(1),
                },
                StateOp::Delete { key: "w2".into() },
            ],
        };
        let src = Some("src");
        let w1 = [found("w1", false, false)];
        assert_eq!(
            deletes_of_read_rows(&flush.ops),
            vec!["w1".to_string()],
            "a key the cycle upserts first is its own to delete"
        );
        assert_eq!(check_cycle(&flush, &view(src, src, None, &w1), T0), Ok(()));
        assert_eq!(
            check_cycle(&flush, &view(src, src, None, &[]), T0),
            Err(StreamRefusal::StateGone),
            "another cycle closed w1 since this one read it"
        );
        assert_eq!(
            check_cycle(&flush, &view(src, src, Some(live), &w1), T0),
            Err(StreamRefusal::SourceLeased),
            "a worker holds the source lease"
        );
        assert_eq!(
            check_cycle(&flush, &view(src, src, Some(live), &w1), T0.plus_secs(10)),
            Ok(()),
            "an expired lease holds nothing"
        );
        let released = LeaseView {
            worker: None,
            expires_at: None,
        };
        assert_eq!(
            check_cycle(&flush, &view(src, src, Some(released), &w1), T0),
            Ok(())
        );
        // The holder's own cycle is fenced on its rows too.
        let held = StreamCycleOp {
            lease_id: Some(uuid::Uuid::from_u128(7).to_string()),
            ..flush.clone()
        };
        assert_eq!(
            check_cycle(&held, &view(src, src, Some(live), &[]), T0),
            Err(StreamRefusal::StateGone)
        );
        // A window row: a flush deletes it only as its ripe read saw it; the holder's cycle
        // (under its lease) needs only the row.
        let ripe = [found("w1", true, true)];
        let changed = [found("w1", true, false)];
        assert_eq!(
            check_cycle(&flush, &view(src, src, None, &ripe), T0),
            Ok(())
        );
        assert_eq!(
            check_cycle(&flush, &view(src, src, None, &changed), T0),
            Err(StreamRefusal::StateGone),
            "a window row written since the flush's ripe read"
        );
        assert_eq!(
            check_cycle(&held, &view(src, src, Some(live), &changed), T0),
            Ok(())
        );
        assert!(StreamRefusal::StateGone.is_state_conflict());
        assert!(StreamRefusal::SourceLeased.is_state_conflict());
        assert!(!StreamRefusal::LeaseLost.is_state_conflict());
    }
}
