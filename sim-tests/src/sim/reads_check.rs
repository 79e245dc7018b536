//! Reads by offset, judged from what a reader saw while pushes, retention and broker crashes
//! ran: a record is never seen at two offsets, an offset never changes its record, and a read
//! from a retained offset returns every record from there up to the high watermark it reports
//! (the reader's budgets are larger than the partitions), never one below it missing.

use std::collections::BTreeMap;

/// One entry of a fetch answer as the reader saw it.
#[derive(Clone, Debug)]
pub struct FetchSeen {
    pub partition: String,
    pub from: i64,
    pub high_watermark: i64,
    pub log_start: i64,
    /// (offset, transactionId)
    pub records: Vec<(i64, String)>,
    pub error: Option<String>,
}

/// The violations, and how many answers were judged.
pub fn judge(answers: &[FetchSeen]) -> (Vec<String>, u64) {
    let mut out = vec![];
    // Per partition: offset → transactionId, the last range seen (a lower high watermark is a
    // new incarnation of the name: the partition was removed and made again).
    let mut at: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    let mut where_seen: BTreeMap<String, (String, i64)> = BTreeMap::new();
    let mut last_hw: BTreeMap<String, i64> = BTreeMap::new();
    for a in answers {
        let p = &a.partition;
        if last_hw.get(p).is_some_and(|hw| a.high_watermark < *hw) {
            at.remove(p);
            where_seen.retain(|_, (q, _)| q != p);
        }
        last_hw.insert(p.clone(), a.high_watermark);
        let in_range = a.from >= a.log_start && a.from <= a.high_watermark;
        match a.error.as_deref() {
            Some("OFFSET_OUT_OF_RANGE") if in_range => out.push(format!(
                "reads: {p} from {} answered out of range though it holds [{}, {})",
                a.from, a.log_start, a.high_watermark
            )),
            Some("OFFSET_OUT_OF_RANGE") | Some("UNKNOWN_TOPIC_OR_PARTITION") => {}
            Some(other) => out.push(format!("reads: {p} answered {other}")),
            None => {
                let offsets: Vec<i64> = a.records.iter().map(|(o, _)| *o).collect();
                let wanted: Vec<i64> = (a.from..a.high_watermark).collect();
                if offsets != wanted {
                    out.push(format!(
                        "reads: {p} from {} (range [{}, {})) returned offsets {offsets:?}",
                        a.from, a.log_start, a.high_watermark
                    ));
                }
            }
        }
        for (offset, txid) in &a.records {
            let seen = at.entry(p.clone()).or_default();
            match seen.get(offset) {
                Some(earlier) if earlier != txid => out.push(format!(
                    "reads: {p} offset {offset} was {earlier}, later {txid}"
                )),
                _ => {
                    seen.insert(*offset, txid.clone());
                }
            }
            match where_seen.get(txid) {
                Some((q, o)) if q != p || o != offset => {
                    out.push(format!("reads: {txid} seen at {q}/{o} and at {p}/{offset}"))
                }
                _ => {
                    where_seen.insert(txid.clone(), (p.clone(), *offset));
                }
            }
        }
    }
    (out, answers.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(from: i64, hw: i64, records: &[(i64, &str)]) -> FetchSeen {
        FetchSeen {
            partition: "p".into(),
            from,
            high_watermark: hw,
            log_start: 0,
            records: records.iter().map(|(o, t)| (*o, t.to_string())).collect(),
            error: None,
        }
    }

    #[test]
    fn a_hole_below_the_high_watermark_is_caught() {
        let (v, _) = judge(&[seen(0, 3, &[(0, "a"), (2, "c")])]);
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn a_changed_offset_and_a_moved_record_are_caught() {
        let (v, _) = judge(&[seen(0, 2, &[(0, "a"), (1, "b")]), seen(1, 2, &[(1, "x")])]);
        assert_eq!(v.len(), 1, "{v:?}");
        let (v, _) = judge(&[
            seen(0, 2, &[(0, "a"), (1, "b")]),
            seen(1, 3, &[(1, "b"), (2, "a")]),
        ]);
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn a_consistent_history_passes() {
        let (v, n) = judge(&[
            seen(0, 2, &[(0, "a"), (1, "b")]),
            seen(1, 3, &[(1, "b"), (2, "c")]),
            seen(3, 3, &[]),
        ]);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(n, 3);
    }
}
