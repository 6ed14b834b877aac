//! A map kept as a sorted vector, for the small per-Service maps the
//! trackers hold by the ten thousand.
//!
//! A Service has one or two ports and one or two EndpointSlices. A
//! `BTreeMap` with a single entry still allocates a whole leaf node (room
//! for eleven entries, about a kilobyte for a `ServicePortName` key), which
//! made these maps most of the trackers' memory at 10,000 Services. A sorted
//! vector holds exactly its entries and iterates in the same key order.

use std::borrow::Borrow;

/// A map from `K` to `V` whose entries are stored sorted by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> VecMap<K, V> {
    /// An empty map; allocates nothing.
    pub fn new() -> Self {
        Self::default()
    }

    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries
            .binary_search_by(|(entry, _)| entry.borrow().cmp(key))
    }

    /// The value stored for `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|index| &self.entries[index].1)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    /// Stores `value` for `key`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(index) => Some(std::mem::replace(&mut self.entries[index].1, value)),
            Err(index) => {
                // Grow by one: these maps hold one or two entries, and
                // doubling would leave room for four.
                if self.entries.len() == self.entries.capacity() && self.entries.len() < 8 {
                    self.entries.reserve_exact(1);
                }
                self.entries.insert(index, (key, value));
                None
            }
        }
    }

    /// Removes the value stored for `key`.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let index = self.position(key).ok()?;
        Some(self.entries.remove(index).1)
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(key, value)| (key, value))
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(key, _)| key)
    }

    /// The values in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, value)| value)
    }
}

/// Collects entries; for equal keys the last one wins, as with `BTreeMap`.
impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable, so equal keys keep their arrival order and the last of
        // each run is the one kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduplicated: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match deduplicated.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => deduplicated.push(entry),
            }
        }
        deduplicated.shrink_to_fit();
        Self {
            entries: deduplicated,
        }
    }
}

impl<K, V> IntoIterator for VecMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(key, value)| (key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_keys_sorted_and_unique() {
        let mut map = VecMap::new();
        assert_eq!(map.insert("b", 2), None);
        assert_eq!(map.insert("a", 1), None);
        assert_eq!(map.insert("c", 3), None);
        assert_eq!(map.insert("b", 20), Some(2));
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(map.get("b"), Some(&20));
        assert_eq!(map.remove("a"), Some(1));
        assert_eq!(map.remove("a"), None);
        assert!(!map.contains_key("a"));
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn collecting_sorts_and_keeps_the_last_of_equal_keys() {
        let map: VecMap<_, _> = [("b", 1), ("a", 2), ("b", 3)].into_iter().collect();
        assert_eq!(map.into_iter().collect::<Vec<_>>(), [("a", 2), ("b", 3)]);
    }

    #[test]
    fn equal_maps_compare_equal_whatever_the_insertion_order() {
        let mut one = VecMap::new();
        one.insert(2, "two");
        one.insert(1, "one");
        let other: VecMap<_, _> = [(1, "one"), (2, "two")].into_iter().collect();
        assert_eq!(one, other);
        assert!(VecMap::<u8, u8>::new().is_empty());
    }
}
