//! The totals a progress report (the `etl` binary's status line) is
//! computed from.

use etl_record::{Offset, PartitionId};
use etl_source::SourceGauge;

/// Totals the progress report is computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgressTotals {
    /// Records read from the source.
    pub read: u64,
    /// Records durably written (summed over sinks).
    pub written: u64,
    /// Records dropped on purpose by transforms.
    pub filtered: u64,
    /// Records written to the dead-letter sink.
    pub dead_lettered: u64,
    /// Poll batches in flight (opened, not yet resolved).
    pub in_flight_batches: u64,
    /// Payload bytes in flight.
    pub in_flight_bytes: u64,
    /// Read but not yet committed, summed over partitions: the offsets
    /// between the committed offset and the fetched position, so bytes
    /// for a file source and records (messages) for the others.
    pub lag: u64,
    /// Committed offsets, summed up.
    pub committed: CommittedTotals,
    /// The source's own figures, as it last reported them
    /// ([`Source::gauges`](etl_source::Source::gauges)).
    pub source_gauges: Vec<SourceGauge>,
}

/// The committed offsets, summed up for a progress report: a file source
/// has a partition per input file and the report comes every second, so
/// only the first few partitions' offsets are kept, to show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommittedTotals {
    /// Partitions with a committed offset.
    pub partitions: u64,
    /// Their committed offsets summed (a negative one as 0): for a file
    /// source, the bytes behind every commit.
    pub sum: u64,
    /// The first [`SHOWN`](Self::SHOWN) of them, in the order given (by
    /// partition).
    pub first: Vec<(PartitionId, Offset)>,
}

impl CommittedTotals {
    /// How many committed offsets are kept to show.
    pub const SHOWN: usize = 4;

    /// Sum up `committed` (partitions in order, each once).
    pub fn of(committed: impl IntoIterator<Item = (PartitionId, Offset)>) -> Self {
        let mut totals = CommittedTotals::default();
        for (partition, offset) in committed {
            totals.partitions += 1;
            totals.sum += u64::try_from(offset.0).unwrap_or(0);
            if totals.first.len() < Self::SHOWN {
                totals.first.push((partition, offset));
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_totals_count_and_sum_every_partition_and_keep_the_first_few() {
        let totals =
            CommittedTotals::of((0..6).map(|p| (PartitionId(p), Offset(10 * i64::from(p) - 5))));
        assert_eq!(totals.partitions, 6);
        assert_eq!(
            totals.sum,
            5 + 15 + 25 + 35 + 45,
            "the negative offset counts as 0"
        );
        assert_eq!(
            totals.first,
            (0..4)
                .map(|p| (PartitionId(p), Offset(10 * i64::from(p) - 5)))
                .collect::<Vec<_>>()
        );
        assert_eq!(CommittedTotals::of([]), CommittedTotals::default());
    }
}
