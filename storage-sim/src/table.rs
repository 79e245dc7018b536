//! A versioned table with PostgreSQL's row-level visibility and locking, reduced to what the
//! races need: readers see the last committed version (or their own pending write), a row lock
//! is held to commit, and an insert of a key whose row is being inserted, updated or deleted by
//! another open transaction waits for it (as the unique-index check does). A lock-only row
//! (`FOR UPDATE` without a write) does not make inserters wait.

use std::collections::BTreeMap;
use std::ops::RangeBounds;

pub type TxId = u64;

#[derive(Clone, Debug)]
struct Versioned<V> {
    committed: Option<V>,
    /// The row lock holder's write: `Some(None)` is a pending delete.
    pending: Option<Option<V>>,
    owner: Option<TxId>,
}

/// Result of taking a row lock.
#[derive(Debug, PartialEq, Eq)]
pub enum Lock {
    Acquired,
    HeldBy(TxId),
    /// No row visible to this transaction.
    Missing,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    /// A committed (or own) row already holds the key: ON CONFLICT DO NOTHING does nothing.
    Exists,
    /// Another open transaction is inserting, updating or deleting the key: wait for it.
    WaitFor(TxId),
}

#[derive(Clone, Debug)]
pub struct Table<K: Ord + Clone, V: Clone> {
    rows: BTreeMap<K, Versioned<V>>,
    touched: BTreeMap<TxId, Vec<K>>,
}

impl<K: Ord + Clone, V: Clone> Default for Table<K, V> {
    fn default() -> Self {
        Table {
            rows: BTreeMap::new(),
            touched: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, V: Clone> Table<K, V> {
    fn visible(row: &Versioned<V>, tx: TxId) -> Option<&V> {
        match (&row.pending, row.owner) {
            (Some(p), Some(o)) if o == tx => p.as_ref(),
            _ => row.committed.as_ref(),
        }
    }

    pub fn get(&self, key: &K, tx: TxId) -> Option<&V> {
        self.rows.get(key).and_then(|r| Self::visible(r, tx))
    }

    /// Who holds the row lock, if anyone other than `tx`.
    pub fn locked_by_other(&self, key: &K, tx: TxId) -> Option<TxId> {
        self.rows
            .get(key)
            .and_then(|r| r.owner)
            .filter(|o| *o != tx)
    }

    fn touch(&mut self, key: &K, tx: TxId) {
        self.touched.entry(tx).or_default().push(key.clone());
    }

    /// `SELECT ... FOR UPDATE` on a visible row.
    pub fn lock(&mut self, key: &K, tx: TxId) -> Lock {
        let Some(row) = self.rows.get_mut(key) else {
            return Lock::Missing;
        };
        if Self::visible(row, tx).is_none() {
            return Lock::Missing;
        }
        match row.owner {
            Some(o) if o != tx => Lock::HeldBy(o),
            Some(_) => Lock::Acquired,
            None => {
                row.owner = Some(tx);
                self.touch(key, tx);
                Lock::Acquired
            }
        }
    }

    /// Writes a new version of a row this transaction has locked (UPDATE after the lock).
    pub fn update(&mut self, key: &K, value: V, tx: TxId) -> Lock {
        match self.lock(key, tx) {
            Lock::Acquired => {
                if let Some(row) = self.rows.get_mut(key) {
                    row.pending = Some(Some(value));
                }
                Lock::Acquired
            }
            other => other,
        }
    }

    pub fn delete(&mut self, key: &K, tx: TxId) -> Lock {
        match self.lock(key, tx) {
            Lock::Acquired => {
                if let Some(row) = self.rows.get_mut(key) {
                    row.pending = Some(None);
                }
                Lock::Acquired
            }
            other => other,
        }
    }

    /// `INSERT ... ON CONFLICT DO NOTHING`.
    pub fn insert(&mut self, key: K, value: V, tx: TxId) -> Insert {
        match self.rows.get_mut(&key) {
            None => {
                self.rows.insert(
                    key.clone(),
                    Versioned {
                        committed: None,
                        pending: Some(Some(value)),
                        owner: Some(tx),
                    },
                );
                self.touch(&key, tx);
                Insert::Inserted
            }
            Some(row) => match row.owner {
                Some(o) if o != tx => {
                    if row.committed.is_none() || row.pending.is_some() {
                        Insert::WaitFor(o)
                    } else {
                        Insert::Exists
                    }
                }
                Some(_) => {
                    if Self::visible(row, tx).is_some() {
                        Insert::Exists
                    } else {
                        row.pending = Some(Some(value));
                        Insert::Inserted
                    }
                }
                None => {
                    if row.committed.is_some() {
                        Insert::Exists
                    } else {
                        row.pending = Some(Some(value));
                        row.owner = Some(tx);
                        self.touch(&key, tx);
                        Insert::Inserted
                    }
                }
            },
        }
    }

    /// The writes `tx` is about to commit: (key, committed version, new version), in key order
    /// of first touch. A lock without a write is not a change.
    pub fn changes(&self, tx: TxId) -> Vec<(&K, Option<&V>, Option<&V>)> {
        self.touched.get(&tx).map_or_else(Vec::new, |keys| {
            keys.iter()
                .filter_map(|k| {
                    let (key, row) = self.rows.get_key_value(k)?;
                    match (&row.pending, row.owner) {
                        (Some(new), Some(o)) if o == tx => {
                            Some((key, row.committed.as_ref(), new.as_ref()))
                        }
                        _ => None,
                    }
                })
                .collect()
        })
    }

    pub fn commit(&mut self, tx: TxId) {
        for key in self.touched.remove(&tx).unwrap_or_default() {
            let remove = match self.rows.get_mut(&key) {
                Some(row) if row.owner == Some(tx) => {
                    if let Some(p) = row.pending.take() {
                        row.committed = p;
                    }
                    row.owner = None;
                    row.committed.is_none()
                }
                _ => false,
            };
            if remove {
                self.rows.remove(&key);
            }
        }
    }

    pub fn rollback(&mut self, tx: TxId) {
        for key in self.touched.remove(&tx).unwrap_or_default() {
            let remove = match self.rows.get_mut(&key) {
                Some(row) if row.owner == Some(tx) => {
                    row.pending = None;
                    row.owner = None;
                    row.committed.is_none()
                }
                _ => false,
            };
            if remove {
                self.rows.remove(&key);
            }
        }
    }

    /// Rows visible to `tx` in key order.
    pub fn range<'a, R: RangeBounds<K> + 'a>(
        &'a self,
        range: R,
        tx: TxId,
    ) -> impl DoubleEndedIterator<Item = (&'a K, &'a V)> + 'a {
        self.rows
            .range(range)
            .filter_map(move |(k, r)| Self::visible(r, tx).map(|v| (k, v)))
    }

    /// Every key in a range, visible or not, with its lock holder (for waits on deletes).
    pub fn keys_in<'a, R: RangeBounds<K> + 'a>(
        &'a self,
        range: R,
    ) -> impl Iterator<Item = (&'a K, Option<TxId>)> + 'a {
        self.rows.range(range).map(|(k, r)| (k, r.owner))
    }

    pub fn iter(&self, tx: TxId) -> impl Iterator<Item = (&K, &V)> {
        self.rows
            .iter()
            .filter_map(move |(k, r)| Self::visible(r, tx).map(|v| (k, v)))
    }
}

/// Tables keyed by (owner, item): every row of one owner (a partition's segments or cursors, a
/// queue's dead letters).
impl<A: Ord + Clone, B: Ord + Clone, V: Clone> Table<(A, B), V> {
    /// The keys visible to `tx` under `owner`, in order; `lowest` is the smallest item key.
    pub fn keys_of(&self, owner: &A, lowest: B, tx: TxId) -> Vec<(A, B)> {
        self.range((owner.clone(), lowest).., tx)
            .take_while(|((a, _), _)| a == owner)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Deletes every row of `owner` (as `tx`).
    pub fn delete_all_of(&mut self, owner: &A, lowest: B, tx: TxId) {
        for k in self.keys_of(owner, lowest, tx) {
            self.delete(&k, tx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_committed_writers_see_their_own() {
        let mut t: Table<u32, &str> = Table::default();
        assert_eq!(t.insert(1, "a", 10), Insert::Inserted);
        assert_eq!(t.get(&1, 10), Some(&"a"));
        assert_eq!(t.get(&1, 11), None, "uncommitted insert is invisible");
        t.commit(10);
        assert_eq!(t.get(&1, 11), Some(&"a"));
        assert_eq!(t.update(&1, "b", 12), Lock::Acquired);
        assert_eq!(t.get(&1, 11), Some(&"a"));
        assert_eq!(t.get(&1, 12), Some(&"b"));
        assert_eq!(t.lock(&1, 11), Lock::HeldBy(12));
        t.rollback(12);
        assert_eq!(t.get(&1, 11), Some(&"a"));
        assert_eq!(t.lock(&1, 11), Lock::Acquired);
    }

    #[test]
    fn inserts_wait_on_inflight_inserts_and_updates_but_not_on_lockers() {
        let mut t: Table<u32, u32> = Table::default();
        assert_eq!(t.insert(1, 1, 10), Insert::Inserted);
        assert_eq!(t.insert(1, 2, 11), Insert::WaitFor(10));
        t.commit(10);
        assert_eq!(t.insert(1, 2, 11), Insert::Exists);
        assert_eq!(t.lock(&1, 12), Lock::Acquired);
        assert_eq!(
            t.insert(1, 3, 11),
            Insert::Exists,
            "FOR UPDATE alone does not block inserters"
        );
        assert_eq!(t.update(&1, 5, 12), Lock::Acquired);
        assert_eq!(
            t.insert(1, 3, 11),
            Insert::WaitFor(12),
            "an in-flight update does"
        );
        t.commit(12);
        assert_eq!(t.get(&1, 0), Some(&5));
    }

    #[test]
    fn rolled_back_insert_vanishes_and_delete_commits() {
        let mut t: Table<u32, u32> = Table::default();
        assert_eq!(t.insert(1, 1, 10), Insert::Inserted);
        t.rollback(10);
        assert_eq!(t.insert(1, 2, 11), Insert::Inserted);
        t.commit(11);
        assert_eq!(t.delete(&1, 12), Lock::Acquired);
        assert_eq!(t.get(&1, 13), Some(&2));
        t.commit(12);
        assert_eq!(t.get(&1, 13), None);
        assert_eq!(t.iter(13).count(), 0);
    }
}
