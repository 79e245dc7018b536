//! What this broker's leased pops delivered, so that a client acking a batch whole (every message
//! of one partition's claim, in order, completed, under its lease) costs one cursor write
//! (`MessageStorage::ack_batch_ends`) instead of resolving every transaction id.
//!
//! A cache, never an authority: an ack it cannot match (another broker's pop, a partial or mixed
//! ack, an evicted entry) takes the item-by-item path, and storage checks the lease, the batch end
//! and that the batch is still stored either way. Bounded: the oldest entries go first.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::storage::{AckItem, AckStatus, BatchEnd};
use crate::Offset;

/// One partition's claim of a leased pop, as its answer named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveredBatch {
    /// The `partitionId` the answer gave (an id in JSON, a number in frames): what acks echo.
    pub partition_ref: String,
    pub partition_id: String,
    pub queue: String,
    pub partition: String,
    /// The offset of the last message delivered.
    pub end_offset: Offset,
    pub first_transaction_id: String,
    pub count: usize,
    digest: [u8; 32],
}

impl DeliveredBatch {
    /// `transaction_ids`: the claim's messages in delivery (offset) order; `None` when empty.
    pub fn new<'a>(
        partition_ref: &str,
        partition_id: &str,
        queue: &str,
        partition: &str,
        end_offset: Offset,
        transaction_ids: impl Iterator<Item = &'a str>,
    ) -> Option<Self> {
        let mut first = None;
        let mut count = 0;
        let mut digest = Sha256::new();
        for id in transaction_ids {
            first.get_or_insert_with(|| id.to_string());
            count += 1;
            absorb(&mut digest, id);
        }
        Some(DeliveredBatch {
            partition_ref: partition_ref.to_string(),
            partition_id: partition_id.to_string(),
            queue: queue.to_string(),
            partition: partition.to_string(),
            end_offset,
            first_transaction_id: first?,
            count,
            digest: digest.finalize().into(),
        })
    }

    fn is_acked_by(&self, items: &[AckItem]) -> bool {
        if items.len() != self.count {
            return false;
        }
        let mut digest = Sha256::new();
        for i in items {
            absorb(&mut digest, &i.transaction_id);
        }
        <[u8; 32]>::from(digest.finalize()) == self.digest
    }
}

/// Length-prefixed, so that no two id lists hash alike by regrouping their bytes.
fn absorb(digest: &mut Sha256, id: &str) {
    digest.update((id.len() as u64).to_le_bytes());
    digest.update(id.as_bytes());
}

/// An ack made only of whole batches of one lease: what storage is asked to commit.
#[derive(Debug)]
pub struct WholeBatches {
    pub lease_id: String,
    /// Each batch with the range of the ack's items that acknowledge it.
    pub runs: Vec<(DeliveredBatch, std::ops::Range<usize>)>,
}

impl WholeBatches {
    pub fn ends(&self) -> Vec<BatchEnd> {
        self.runs
            .iter()
            .map(|(b, _)| BatchEnd {
                partition_id: b.partition_id.clone(),
                end_offset: b.end_offset,
                first_transaction_id: b.first_transaction_id.clone(),
            })
            .collect()
    }
}

/// (group, lease id) → the batches its pop delivered; past `capacity` batches in all (a pop may
/// claim many partitions), the oldest entries go.
#[derive(Debug)]
pub struct DeliveryLedger {
    entries: BTreeMap<(String, String), (u64, Vec<DeliveredBatch>)>,
    order: BTreeMap<u64, (String, String)>,
    next: u64,
    batches: usize,
    capacity: usize,
}

impl DeliveryLedger {
    pub fn new(capacity: usize) -> Self {
        DeliveryLedger {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            next: 0,
            batches: 0,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Batches held, over every entry.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// Records what a leased pop delivered under `lease_id`.
    pub fn record(&mut self, group: &str, lease_id: &str, batches: Vec<DeliveredBatch>) {
        if batches.is_empty() || batches.len() > self.capacity {
            return;
        }
        let key = (group.to_string(), lease_id.to_string());
        self.next += 1;
        self.batches += batches.len();
        if let Some((old, replaced)) = self.entries.insert(key.clone(), (self.next, batches)) {
            self.order.remove(&old);
            self.batches -= replaced.len();
        }
        self.order.insert(self.next, key);
        while self.batches > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, gone)) = self.entries.remove(&oldest) {
                self.batches -= gone.len();
            }
        }
    }

    /// Forgets a lease (its batch was given back, or acked another way).
    pub fn forget(&mut self, group: &str, lease_id: &str) {
        if let Some((seq, gone)) = self
            .entries
            .remove(&(group.to_string(), lease_id.to_string()))
        {
            self.order.remove(&seq);
            self.batches -= gone.len();
        }
    }

    /// The batches `items` acknowledge whole, taken out of the ledger; `None` (and the ledger
    /// unchanged) unless every item is a completed ack under one named lease and the items are,
    /// run by run of one partition, exactly the messages of that lease's batches in order.
    pub fn take_whole(&mut self, group: &str, items: &[AckItem]) -> Option<WholeBatches> {
        let lease_id = items
            .first()?
            .lease_id
            .as_deref()
            .filter(|l| !l.is_empty())?;
        if items
            .iter()
            .any(|i| i.status != AckStatus::Completed || i.lease_id.as_deref() != Some(lease_id))
        {
            return None;
        }
        let key = (group.to_string(), lease_id.to_string());
        let (_, batches) = self.entries.get(&key)?;
        let mut runs: Vec<(usize, std::ops::Range<usize>)> = vec![];
        let mut start = 0;
        while start < items.len() {
            let reference = &items[start].partition_id;
            let end = start
                + items[start..]
                    .iter()
                    .take_while(|i| &i.partition_id == reference)
                    .count();
            let k = batches.iter().position(|b| &b.partition_ref == reference)?;
            if runs.iter().any(|(seen, _)| *seen == k)
                || !batches[k].is_acked_by(&items[start..end])
            {
                return None;
            }
            runs.push((k, start..end));
            start = end;
        }
        let (seq, mut batches) = self.entries.remove(&key)?;
        self.batches -= batches.len();
        let taken = runs
            .iter()
            .map(|(k, range)| (batches[*k].clone(), range.clone()))
            .collect();
        let mut kept: Vec<DeliveredBatch> = vec![];
        for (k, b) in batches.drain(..).enumerate() {
            if !runs.iter().any(|(t, _)| *t == k) {
                kept.push(b);
            }
        }
        if kept.is_empty() {
            self.order.remove(&seq);
        } else {
            self.batches += kept.len();
            self.entries.insert(key, (seq, kept));
        }
        Some(WholeBatches {
            lease_id: lease_id.to_string(),
            runs: taken,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(reference: &str, end: Offset, ids: &[&str]) -> DeliveredBatch {
        DeliveredBatch::new(
            reference,
            &format!("id-{reference}"),
            "q",
            reference,
            end,
            ids.iter().copied(),
        )
        .expect("not empty")
    }

    fn ack(reference: &str, id: &str, lease: Option<&str>) -> AckItem {
        AckItem {
            transaction_id: id.into(),
            partition_id: reference.into(),
            status: AckStatus::Completed,
            lease_id: lease.map(str::to_string),
            error: None,
        }
    }

    fn ledger() -> DeliveryLedger {
        let mut l = DeliveryLedger::new(8);
        l.record(
            "g",
            "L",
            vec![batch("a", 4, &["t1", "t2"]), batch("b", 9, &["u1"])],
        );
        l
    }

    #[test]
    fn a_whole_batch_is_taken_once() {
        let mut l = ledger();
        let items = [ack("a", "t1", Some("L")), ack("a", "t2", Some("L"))];
        let whole = l.take_whole("g", &items).expect("whole");
        assert_eq!(whole.runs.len(), 1);
        assert_eq!(whole.runs[0].1, 0..2);
        let ends = whole.ends();
        assert_eq!(
            (ends[0].partition_id.as_str(), ends[0].end_offset),
            ("id-a", 4)
        );
        assert_eq!(ends[0].first_transaction_id, "t1");
        assert!(l.take_whole("g", &items).is_none(), "taken out");
        // The other batch of the lease is still there.
        assert!(l.take_whole("g", &[ack("b", "u1", Some("L"))]).is_some());
        assert!(l.is_empty());
    }

    #[test]
    fn anything_but_whole_batches_in_order_is_not_matched() {
        let mut l = ledger();
        let cases: Vec<Vec<AckItem>> = vec![
            vec![ack("a", "t1", Some("L"))],
            vec![ack("a", "t2", Some("L")), ack("a", "t1", Some("L"))],
            vec![ack("a", "t1", None), ack("a", "t2", None)],
            vec![ack("a", "t1", Some("L")), ack("a", "t2", Some("M"))],
            vec![ack("a", "t1", Some("M")), ack("a", "t2", Some("M"))],
            vec![
                ack("a", "t1", Some("L")),
                ack("a", "t2", Some("L")),
                ack("a", "t2", Some("L")),
            ],
            vec![
                ack("a", "t1", Some("L")),
                ack("a", "t2", Some("L")),
                ack("b", "u1", Some("L")),
                ack("a", "t1", Some("L")),
            ],
            vec![ack("c", "t1", Some("L"))],
            vec![],
        ];
        for items in &cases {
            assert!(l.take_whole("g", items).is_none(), "{items:?}");
            assert!(l.take_whole("other", items).is_none());
        }
        let mut failed = vec![ack("a", "t1", Some("L")), ack("a", "t2", Some("L"))];
        failed[1].status = AckStatus::Failed;
        assert!(l.take_whole("g", &failed).is_none());
        assert_eq!(l.len(), 1, "nothing was taken");
        let both = [
            ack("a", "t1", Some("L")),
            ack("a", "t2", Some("L")),
            ack("b", "u1", Some("L")),
        ];
        let whole = l.take_whole("g", &both).expect("both batches");
        assert_eq!(
            whole
                .runs
                .iter()
                .map(|(_, r)| r.clone())
                .collect::<Vec<_>>(),
            vec![0..2, 2..3]
        );
    }

    #[test]
    fn the_oldest_entries_go_past_capacity() {
        let mut l = DeliveryLedger::new(2);
        for lease in ["L1", "L2", "L3"] {
            l.record("g", lease, vec![batch("a", 1, &["t"])]);
        }
        assert_eq!((l.len(), l.batches()), (2, 2));
        assert!(l.take_whole("g", &[ack("a", "t", Some("L1"))]).is_none());
        assert!(l.take_whole("g", &[ack("a", "t", Some("L3"))]).is_some());
        l.forget("g", "L2");
        assert!(l.is_empty());
        assert_eq!((l.order.len(), l.batches()), (0, 0));
        // Capacity counts batches: a two-partition pop displaces two one-partition ones.
        l.record("g", "L4", vec![batch("a", 1, &["t"])]);
        l.record(
            "g",
            "L5",
            vec![batch("a", 1, &["t"]), batch("b", 1, &["u"])],
        );
        assert_eq!((l.len(), l.batches()), (1, 2));
        l.record("g", "L6", vec![batch("a", 1, &["t"]); 3]);
        assert_eq!(
            (l.len(), l.batches()),
            (1, 2),
            "larger than the whole ledger: not kept"
        );
        let _ = l
            .take_whole("g", &[ack("a", "t", Some("L5"))])
            .expect("one of two");
        assert_eq!((l.len(), l.batches()), (1, 1));
    }
}
