//! The totals a progress report (the `etl` binary's status line) is
//! computed from.

use etl_record::PartitionOffsets;
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
    /// Committed offsets.
    pub committed: PartitionOffsets,
    /// The source's own figures, as it last reported them
    /// ([`Source::gauges`](etl_source::Source::gauges)).
    pub source_gauges: Vec<SourceGauge>,
}
