//! The checkpointer's per-partition state, in one vector sorted by
//! partition.
//!
//! A file source has a partition per input file, so a checkpointer may
//! hold a hundred thousand of them, nearly all idle. A hash map of their
//! state costs up to twice its entries (its table grows by doubling, and
//! both tables live while it grows); here an entry costs its own size and
//! nothing more. Lookups are a binary search. Partitions come in
//! ascending order (the file source numbers its files, a consumer group
//! its partitions), which appends; other insertions and removals move
//! the entries after them, a cost paid per assignment or revocation, not
//! per acknowledgement.

use etl_record::PartitionId;

/// Values by partition, sorted by partition.
#[derive(Debug)]
pub(crate) struct PartitionMap<V> {
    entries: Vec<(PartitionId, V)>,
}

impl<V> Default for PartitionMap<V> {
    fn default() -> Self {
        PartitionMap {
            entries: Vec::new(),
        }
    }
}

impl<V> PartitionMap<V> {
    fn find(&self, partition: PartitionId) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&partition, |(p, _)| *p)
    }

    pub(crate) fn get(&self, partition: &PartitionId) -> Option<&V> {
        let i = self.find(*partition).ok()?;
        Some(&self.entries[i].1)
    }

    pub(crate) fn get_mut(&mut self, partition: &PartitionId) -> Option<&mut V> {
        let i = self.find(*partition).ok()?;
        Some(&mut self.entries[i].1)
    }

    /// Set the value of `partition`; the one it replaces.
    pub(crate) fn insert(&mut self, partition: PartitionId, value: V) -> Option<V> {
        if self
            .entries
            .last()
            .is_none_or(|(last, _)| *last < partition)
        {
            self.entries.push((partition, value));
            return None;
        }
        match self.find(partition) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                self.entries.insert(i, (partition, value));
                None
            }
        }
    }

    /// Take out the value of `partition`. The vector shrinks once it is
    /// mostly empty, so revoked partitions give their memory back.
    pub(crate) fn remove(&mut self, partition: &PartitionId) -> Option<V> {
        let i = self.find(*partition).ok()?;
        let (_, value) = self.entries.remove(i);
        if self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        Some(value)
    }

    /// How many partitions it holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Room for `more` entries, allocated at once.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.entries.reserve(more);
    }

    /// Every partition, ascending.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &PartitionId> {
        self.entries.iter().map(|(p, _)| p)
    }

    /// Every partition and its value, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&PartitionId, &V)> {
        self.entries.iter().map(|(p, v)| (p, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_stay_sorted_whatever_the_order_of_insertion() {
        let mut map = PartitionMap::default();
        for p in [5, 1, 9, 3, 7] {
            assert_eq!(map.insert(PartitionId(p), p * 10), None);
        }
        assert_eq!(map.insert(PartitionId(3), 33), Some(30), "replaced");
        let keys: Vec<u32> = map.keys().map(|p| p.0).collect();
        assert_eq!(keys, [1, 3, 5, 7, 9]);
        assert_eq!(map.get(&PartitionId(3)), Some(&33));
        assert_eq!(map.get(&PartitionId(4)), None);
        *map.get_mut(&PartitionId(9)).unwrap() += 1;
        assert_eq!(map.remove(&PartitionId(9)), Some(91));
        assert_eq!(map.remove(&PartitionId(9)), None);
        assert!(map.get(&PartitionId(9)).is_none() && map.get(&PartitionId(1)).is_some());
        let pairs: Vec<(u32, u32)> = map.iter().map(|(p, v)| (p.0, *v)).collect();
        assert_eq!(pairs, [(1, 10), (3, 33), (5, 50), (7, 70)]);
    }

    #[test]
    fn removing_most_entries_gives_the_memory_back() {
        let mut map = PartitionMap::default();
        map.reserve(1000);
        for p in 0..1000 {
            map.insert(PartitionId(p), p);
        }
        assert_eq!(map.entries.capacity(), 1000, "reserved once, exactly");
        for p in 0..990 {
            map.remove(&PartitionId(p));
        }
        assert!(map.entries.capacity() <= 40, "{}", map.entries.capacity());
        assert_eq!(map.keys().count(), 10);
    }
}
