//! The stream cycles' checker: what the faults scenario's stream workers saw, held against what
//! the model committed. A worker pops a batch of the source queue, reads its partition's state
//! row (`{count, last}`), and commits one cycle: the row moved on by the batch, one sink message
//! naming the batch, and the ack of the batch's last message, fenced on the lease. A cycle whose
//! answer was lost is never resent (its outcome is unknown: committed or not).
//!
//! Verdicts, each naming what it saw:
//! - a committed cycle read the state its batch follows (`from == last + 1`): no holder commits
//!   over state another holder moved since it read (the lease fence);
//! - every batch is in the sink at most once, every committed cycle's sink message is there and
//!   no refused cycle's is (all or none);
//! - per partition, the state row, the sink and the group's cursor agree: the count is the sink's
//!   messages summed, and the state's `last` is where the cursor committed.
//!
//! Windows (`check_windows`): each cycle opens a window row for its batch; cycles close the
//! windows they read, and so do the workers' idle flushes (cycles without an ack) racing them.
//! Each window opened reaches the window sink exactly once or is still open at the end, never
//! both; no window reaches it twice, nor from a closer that was refused, nor unopened.

use std::collections::BTreeMap;

use serde_json::Value;

/// How a cycle ended, as the worker saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CycleOutcome {
    Committed,
    /// Answered `success: false`: nothing of it may have committed.
    Refused,
    /// No answer: it may or may not have committed.
    Unknown,
}

/// One cycle a worker sent.
#[derive(Clone, Debug)]
pub struct StreamCycle {
    pub partition_id: String,
    pub partition: String,
    /// The state's `last` the worker read before the cycle (`None`: no row).
    pub read_last: Option<i64>,
    pub from: i64,
    pub to: i64,
    /// Names the cycle's sink message.
    pub nonce: String,
    pub outcome: CycleOutcome,
}

/// One closing of windows as its worker saw it: a regular cycle's or an idle flush's.
#[derive(Clone, Debug)]
pub struct WindowClose {
    /// Names the closer in the window sink's messages.
    pub nonce: String,
    /// The windows it closed: (partition id, the opening batch's first offset).
    pub windows: Vec<(String, i64)>,
    /// A cycle without an ack.
    pub flush: bool,
    pub outcome: CycleOutcome,
}

/// What the model holds of the windows at the end of a run.
pub struct CommittedWindows {
    /// Windows still open: (partition id, from).
    pub open: Vec<(String, i64)>,
    /// The window sink's messages: (partition id, from, the closer's nonce).
    pub emitted: Vec<(String, i64, String)>,
}

/// A window sink message's payload.
pub fn window_entry(payload: &[u8]) -> Option<(String, i64, String)> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    Some((
        v["pid"].as_str()?.to_string(),
        v["from"].as_i64()?,
        v["closer"].as_str()?.to_string(),
    ))
}

/// The window verdicts (empty: every rule held). `cycles` opened the windows (a committed cycle
/// surely, one without an answer perhaps).
pub fn check_windows(
    cycles: &[StreamCycle],
    closes: &[WindowClose],
    committed: &CommittedWindows,
) -> Vec<String> {
    let mut out = vec![];
    let mut emitted: BTreeMap<(&str, i64), Vec<&str>> = BTreeMap::new();
    for (pid, from, closer) in &committed.emitted {
        emitted
            .entry((pid.as_str(), *from))
            .or_default()
            .push(closer.as_str());
    }
    let open: std::collections::BTreeSet<(&str, i64)> = committed
        .open
        .iter()
        .map(|(p, f)| (p.as_str(), *f))
        .collect();
    let closers: BTreeMap<&str, &WindowClose> =
        closes.iter().map(|c| (c.nonce.as_str(), c)).collect();
    for ((pid, from), by) in &emitted {
        if by.len() > 1 {
            out.push(format!(
                "streams: window {pid}/{from} reached the sink {} times (closed by {by:?})",
                by.len()
            ));
        }
        if open.contains(&(*pid, *from)) {
            out.push(format!(
                "streams: window {pid}/{from} reached the sink and is still open"
            ));
        }
        for closer in by {
            match closers.get(closer) {
                Some(c) if c.outcome == CycleOutcome::Refused => out.push(format!(
                    "streams: a refused {}'s window emit committed ({pid}/{from} by {closer})",
                    if c.flush { "flush" } else { "cycle" }
                )),
                Some(_) => {}
                None => out.push(format!(
                    "streams: a window emit no closer sent ({pid}/{from} by {closer})"
                )),
            }
        }
    }
    let opener = |pid: &str, from: i64| {
        cycles
            .iter()
            .filter(|c| c.partition_id == pid && c.from == from)
            .map(|c| c.outcome)
            .find(|o| *o != CycleOutcome::Refused)
    };
    for (pid, from) in emitted.keys().chain(open.iter()) {
        if opener(pid, *from).is_none() {
            out.push(format!(
                "streams: window {pid}/{from} exists, but no cycle that may have committed opened it"
            ));
        }
    }
    for c in cycles
        .iter()
        .filter(|c| c.outcome == CycleOutcome::Committed)
    {
        let w = (c.partition_id.as_str(), c.from);
        if !open.contains(&w) && !emitted.contains_key(&w) {
            out.push(format!(
                "streams: window {}/{} was opened and is lost: neither open nor emitted",
                c.partition, c.from
            ));
        }
    }
    out
}

/// What the model committed at the end of a run.
pub struct Committed {
    /// Per partition id: the state row's (count, last).
    pub state: BTreeMap<String, (i64, i64)>,
    /// The sink's messages: (partition id, from, to, nonce).
    pub sink: Vec<(String, i64, i64, String)>,
    /// Per partition id: the group's committed cursor (`None`: no cursor row).
    pub cursors: BTreeMap<String, Option<i64>>,
}

/// A sink message's payload.
pub fn sink_entry(payload: &[u8]) -> Option<(String, i64, i64, String)> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    Some((
        v["pid"].as_str()?.to_string(),
        v["from"].as_i64()?,
        v["to"].as_i64()?,
        v["nonce"].as_str()?.to_string(),
    ))
}

/// The verdicts (empty: every rule held).
pub fn check(cycles: &[StreamCycle], committed: &Committed) -> Vec<String> {
    let mut out = vec![];
    for c in cycles
        .iter()
        .filter(|c| c.outcome == CycleOutcome::Committed)
    {
        let follows = c.read_last.map_or(0, |l| l + 1);
        if c.from != follows {
            out.push(format!(
                "streams: a cycle committed over state it did not read: {} batch {}..={} \
                 after reading last {:?}",
                c.partition, c.from, c.to, c.read_last
            ));
        }
    }
    let mut batches: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    for (pid, from, _, _) in &committed.sink {
        *batches.entry((pid.as_str(), *from)).or_default() += 1;
    }
    for ((pid, from), n) in batches.iter().filter(|(_, n)| **n > 1) {
        out.push(format!(
            "streams: the sink holds the batch of {pid} from {from} {n} times"
        ));
    }
    let by_nonce: BTreeMap<&str, &StreamCycle> =
        cycles.iter().map(|c| (c.nonce.as_str(), c)).collect();
    let sunk: std::collections::BTreeSet<&str> = committed
        .sink
        .iter()
        .map(|(_, _, _, n)| n.as_str())
        .collect();
    for (_, _, _, nonce) in &committed.sink {
        match by_nonce.get(nonce.as_str()) {
            Some(c) if c.outcome == CycleOutcome::Refused => out.push(format!(
                "streams: a refused cycle's sink message committed ({} batch {}..={})",
                c.partition, c.from, c.to
            )),
            Some(_) => {}
            None => out.push(format!("streams: a sink message no cycle sent ({nonce})")),
        }
    }
    for c in cycles
        .iter()
        .filter(|c| c.outcome == CycleOutcome::Committed)
    {
        if !sunk.contains(c.nonce.as_str()) {
            out.push(format!(
                "streams: a committed cycle's sink message is missing ({} batch {}..={})",
                c.partition, c.from, c.to
            ));
        }
    }
    let mut summed: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (pid, from, to, _) in &committed.sink {
        let e = summed.entry(pid.as_str()).or_insert((0, -1));
        e.0 += to - from + 1;
        e.1 = e.1.max(*to);
    }
    let pids: std::collections::BTreeSet<&str> = committed
        .state
        .keys()
        .map(String::as_str)
        .chain(summed.keys().copied())
        .collect();
    for pid in pids {
        let state = committed.state.get(pid).copied();
        let sink = summed.get(pid).copied();
        let cursor = committed.cursors.get(pid).copied().flatten();
        let agree = match (state, sink) {
            (Some((count, last)), Some((n, max_to))) => {
                count == n && last == max_to && cursor == Some(last)
            }
            _ => false,
        };
        if !agree {
            out.push(format!(
                "streams: state, sink and ack disagree on {pid}: state (count, last) {state:?}, \
                 sink (messages, last) {sink:?}, cursor {cursor:?}"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(
        from: i64,
        to: i64,
        read_last: Option<i64>,
        nonce: &str,
        outcome: CycleOutcome,
    ) -> StreamCycle {
        StreamCycle {
            partition_id: "pid".into(),
            partition: "s0".into(),
            read_last,
            from,
            to,
            nonce: nonce.into(),
            outcome,
        }
    }

    fn committed(state: (i64, i64), sink: &[(i64, i64, &str)], cursor: i64) -> Committed {
        Committed {
            state: [("pid".to_string(), state)].into_iter().collect(),
            sink: sink
                .iter()
                .map(|(f, t, n)| ("pid".to_string(), *f, *t, n.to_string()))
                .collect(),
            cursors: [("pid".to_string(), Some(cursor))].into_iter().collect(),
        }
    }

    #[test]
    fn a_consistent_history_passes_and_each_breach_is_named() {
        let cycles = vec![
            cycle(0, 2, None, "a", CycleOutcome::Committed),
            cycle(0, 2, None, "b", CycleOutcome::Refused),
            cycle(3, 4, Some(2), "c", CycleOutcome::Unknown),
            cycle(5, 5, Some(4), "d", CycleOutcome::Committed),
        ];
        let good = committed((6, 5), &[(0, 2, "a"), (3, 4, "c"), (5, 5, "d")], 5);
        assert_eq!(check(&cycles, &good), Vec::<String>::new());

        // The fence broken: a stale holder's cycle committed too.
        let mut stale = cycles.clone();
        stale[1].outcome = CycleOutcome::Committed;
        let twice = committed(
            (6, 5),
            &[(0, 2, "a"), (0, 2, "b"), (3, 4, "c"), (5, 5, "d")],
            5,
        );
        let v = check(&stale, &twice);
        assert!(v.iter().any(|m| m.contains("2 times")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("disagree")), "{v:?}");

        // A part committed alone: the state moved, the sink message is missing.
        let torn = committed((6, 5), &[(0, 2, "a"), (3, 4, "c")], 5);
        let v = check(&cycles, &torn);
        assert!(v.iter().any(|m| m.contains("is missing")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("disagree")), "{v:?}");

        // A committed cycle over state it did not read.
        let mut blind = cycles.clone();
        blind[3].read_last = Some(2);
        let v = check(&blind, &good);
        assert!(v.iter().any(|m| m.contains("did not read")), "{v:?}");
    }

    fn close(nonce: &str, windows: &[i64], flush: bool, outcome: CycleOutcome) -> WindowClose {
        WindowClose {
            nonce: nonce.into(),
            windows: windows.iter().map(|f| ("pid".to_string(), *f)).collect(),
            flush,
            outcome,
        }
    }

    fn windows(open: &[i64], emitted: &[(i64, &str)]) -> CommittedWindows {
        CommittedWindows {
            open: open.iter().map(|f| ("pid".to_string(), *f)).collect(),
            emitted: emitted
                .iter()
                .map(|(f, n)| ("pid".to_string(), *f, n.to_string()))
                .collect(),
        }
    }

    #[test]
    fn each_window_once_and_each_breach_is_named() {
        let cycles = vec![
            cycle(0, 2, None, "a", CycleOutcome::Committed),
            cycle(3, 4, Some(2), "c", CycleOutcome::Committed),
            cycle(5, 5, Some(4), "d", CycleOutcome::Refused),
        ];
        let closes = vec![
            close("c", &[0], false, CycleOutcome::Committed),
            close("f1", &[3], true, CycleOutcome::Committed),
            close("f2", &[3], true, CycleOutcome::Refused),
        ];
        let good = windows(&[], &[(0, "c"), (3, "f1")]);
        assert_eq!(check_windows(&cycles, &closes, &good), Vec::<String>::new());
        assert_eq!(
            check_windows(&cycles, &closes, &windows(&[3], &[(0, "c")])),
            Vec::<String>::new(),
            "a window still open is fine"
        );

        // The unfenced flush: a window another cycle closed, emitted again.
        let twice = windows(&[], &[(0, "c"), (3, "f1"), (3, "f2")]);
        let v = check_windows(&cycles, &closes, &twice);
        assert!(v.iter().any(|m| m.contains("2 times")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("refused flush")), "{v:?}");

        let lost = windows(&[], &[(0, "c")]);
        let v = check_windows(&cycles, &closes, &lost);
        assert!(v.iter().any(|m| m.contains("is lost")), "{v:?}");

        let both = windows(&[3], &[(0, "c"), (3, "f1")]);
        let v = check_windows(&cycles, &closes, &both);
        assert!(v.iter().any(|m| m.contains("still open")), "{v:?}");

        let unopened = windows(&[5], &[(0, "c"), (3, "f1")]);
        let v = check_windows(&cycles, &closes, &unopened);
        assert!(v.iter().any(|m| m.contains("no cycle")), "{v:?}");
    }
}
