//! B-trees of one entry per partition or per input file, filled packed.
//!
//! A file source has a partition per input file, so these maps may hold
//! a hundred thousand entries. Inserted one by one in ascending order (as
//! partitions are assigned, and as the record of inputs is read back), a
//! B-tree splits each full node in two and never fills the left half
//! again: its nodes stay about half full, twice the memory of the
//! entries. `BTreeMap::append` builds its result from both sorted
//! sequences with full nodes, so entries gathered in short runs and
//! appended cost about their own size.

use std::collections::BTreeMap;

/// Entries gathered at a time: a run is the only copy of them.
const RUN: usize = 4096;

/// Insert `items` into `map` (a later value for a key replaces an earlier
/// one, as with `insert`), keeping its nodes full.
pub(crate) fn extend_packed<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    items: impl IntoIterator<Item = (K, V)>,
) {
    let mut run = BTreeMap::new();
    for (key, value) in items {
        run.insert(key, value);
        if run.len() == RUN {
            map.append(&mut run);
        }
    }
    map.append(&mut run);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_insertion_keeps_every_entry_and_the_last_value_of_a_key() {
        let mut map = BTreeMap::from([(5u32, "old"), (20_000, "kept")]);
        let items = (0..10_000u32).map(|k| (k, "new")).chain([(7, "last")]);
        extend_packed(&mut map, items);
        assert_eq!(map.len(), 10_001);
        assert_eq!(map[&5], "new");
        assert_eq!(map[&7], "last");
        assert_eq!(map[&20_000], "kept");
        assert!(map.keys().copied().eq((0..10_000).chain([20_000])));
    }
}
