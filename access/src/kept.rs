//! A bounded map of things kept for reuse (verified assertions, signed ones,
//! runs' checked specs): a cache, never the truth, so losing an entry costs
//! only the work of making it again.
//!
//! It keeps two generations of at most `capacity` entries each. New entries
//! go into the newer one; when it is full it becomes the older one and the
//! older one is dropped. An entry found in the older generation moves to the
//! newer one, so what is still in use stays and what is not leaves within
//! two generations' worth of inserts.
//!
//! This replaced maps that were cleared when full: under a backlog (runs
//! waiting seconds between their steps while thousands of others start) a
//! clear dropped every entry still in use, each of which was then made again
//! and filled the map sooner (workflows-bench: a run's checked spec was made
//! again 1.6 times a run, its assertions signed and verified again).

use std::borrow::Borrow;
use std::hash::Hash;

/// See the module documentation.
pub struct Kept<K, V> {
    newer: ahash::AHashMap<K, V>,
    older: ahash::AHashMap<K, V>,
    capacity: usize,
}

impl<K: Hash + Eq, V> Kept<K, V> {
    /// A map of at most `capacity` entries in each generation (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            newer: ahash::AHashMap::new(),
            older: ahash::AHashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The entry for `key`, moved to the newer generation if it was in the older.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.newer.contains_key(key) {
            let (key, value) = self.older.remove_entry(key)?;
            self.insert(key, value);
        }
        self.newer.get(key)
    }

    /// Keeps `value` for `key` (in the newer generation, replacing any entry for it).
    pub fn insert(&mut self, key: K, value: V) {
        if self.newer.len() >= self.capacity && !self.newer.contains_key(&key) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.older.remove(&key);
        self.newer.insert(key, value);
    }

    /// Forgets the entry for `key`.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.newer.remove(key).or_else(|| self.older.remove(key))
    }

    /// Entries kept now (both generations).
    pub fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Kept;

    #[test]
    fn what_is_used_stays_and_what_is_not_leaves() {
        let mut kept = Kept::new(2);
        kept.insert("a", 1);
        kept.insert("b", 2);
        // Full: the next insert starts a generation; a and b are older.
        kept.insert("c", 3);
        assert_eq!(kept.len(), 3);
        // a is used: it moves to the newer generation (c, a: full).
        assert_eq!(kept.get("a"), Some(&1));
        // The next insert drops the older generation (b), never a or c.
        kept.insert("d", 4);
        assert_eq!(kept.get("b"), None, "unused for two generations: gone");
        assert_eq!(kept.get("a"), Some(&1));
        assert_eq!(kept.get("c"), Some(&3));
        assert_eq!(kept.get("d"), Some(&4));
        assert!(kept.len() <= 4, "at most two generations of two");
    }

    #[test]
    fn an_insert_replaces_and_a_remove_forgets_in_either_generation() {
        let mut kept = Kept::new(1);
        kept.insert("a", 1);
        kept.insert("b", 2); // a is older now
        kept.insert("a", 10); // replaces the older entry, not kept twice
        assert_eq!(kept.get("a"), Some(&10));
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.remove("b"), Some(2));
        assert_eq!(kept.remove("a"), Some(10));
        assert!(kept.is_empty());
        assert_eq!(kept.get("a"), None);
    }

    #[test]
    fn a_zero_capacity_still_keeps_the_newest() {
        let mut kept = Kept::new(0);
        kept.insert(1, "one");
        assert_eq!(kept.get(&1), Some(&"one"));
    }
}
