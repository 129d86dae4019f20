//! Per-partition figures at a few bytes a partition: a dense row for
//! every partition, sorted by partition, and the figures that stay zero
//! on a healthy partition in a sparse side list, sorted too. What the
//! checkpointer's [`PublishedMetrics`](crate::PublishedMetrics) and the
//! source driver's published counters keep, read the same way.
//!
//! ```
//! use etl_checkpoint::sparse::{self, DenseRow};
//! use etl_record::PartitionId;
//!
//! struct Row(PartitionId, bool);
//! impl DenseRow for Row {
//!     fn partition(&self) -> PartitionId { self.0 }
//!     fn has_extra(&self) -> bool { self.1 }
//! }
//! let rows = [Row(PartitionId(1), false), Row(PartitionId(4), true)];
//! let extras = [(PartitionId(4), 7_u64)];
//! let read: Vec<(u32, u64)> = sparse::with_extras(&rows, &extras)
//!     .map(|(row, extra)| (row.0.0, extra))
//!     .collect();
//! assert_eq!(read, [(1, 0), (4, 7)]);
//! assert_eq!(sparse::extra_of(&rows[1], &extras), 7);
//! ```

use etl_record::PartitionId;

/// A row of the dense list.
pub trait DenseRow {
    /// The row's partition (the lists are sorted by it).
    fn partition(&self) -> PartitionId;
    /// Whether the side list holds figures of this row's partition.
    fn has_extra(&self) -> bool;
}

/// The index of `partition`'s row in `rows` (sorted by partition), or
/// where it would go.
///
/// # Errors
///
/// `Err(at)` when no row has `partition`: `at` keeps the order.
pub fn find<R: DenseRow>(rows: &[R], partition: PartitionId) -> Result<usize, usize> {
    rows.binary_search_by_key(&partition, DenseRow::partition)
}

/// The side figures of `row` in `extras` (sorted by partition), or the
/// default (all zero) when it has none.
pub fn extra_of<R: DenseRow, X: Copy + Default>(row: &R, extras: &[(PartitionId, X)]) -> X {
    if !row.has_extra() {
        return X::default();
    }
    extras
        .binary_search_by_key(&row.partition(), |(p, _)| *p)
        .map_or_else(|_| X::default(), |i| extras[i].1)
}

/// Every row with its side figures, in partition order, in one pass over
/// both lists.
pub fn with_extras<'a, R: DenseRow, X: Copy + Default>(
    rows: &'a [R],
    extras: &'a [(PartitionId, X)],
) -> impl Iterator<Item = (&'a R, X)> + 'a {
    let mut extras = extras.iter().peekable();
    rows.iter().map(move |row| {
        let extra = if row.has_extra() {
            // Both sorted by partition: the next entry at or after this
            // row is this row's.
            while extras.next_if(|(p, _)| *p < row.partition()).is_some() {}
            extras
                .next_if(|(p, _)| *p == row.partition())
                .map_or_else(X::default, |(_, x)| *x)
        } else {
            X::default()
        };
        (row, extra)
    })
}
