//! What the source driver counts, per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use etl_record::{Offset, PartitionId};

/// Counters of one partition, since the driver started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionSourceMetrics {
    /// Whether the partition is currently assigned.
    pub assigned: bool,
    /// The epoch batches are currently opened under.
    pub epoch: u32,
    /// Highest offset emitted in the current epoch (the fetched position).
    pub position: Option<Offset>,
    /// Batches opened.
    pub batches: u64,
    /// Records emitted.
    pub records: u64,
    /// Bad input emitted as dead letters by the source.
    pub rejected: u64,
    /// Replays served (seeks back to the watermark).
    pub replays: u64,
    /// Records given up on as poison.
    pub poison_records: u64,
    /// The offset after the partition's last record, where the source
    /// knows it ([`Source::high_watermark`](crate::Source::high_watermark)).
    pub high_watermark: Option<Offset>,
}

/// A snapshot of the driver's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMetrics {
    /// Per partition, every partition ever assigned.
    pub partitions: BTreeMap<PartitionId, PartitionSourceMetrics>,
}

impl SourceMetrics {
    /// The sum of a counter over all partitions.
    #[must_use]
    pub fn total(&self, counter: impl Fn(&PartitionSourceMetrics) -> u64) -> u64 {
        self.partitions.values().map(counter).sum()
    }
}

/// Reads the driver's counters from anywhere; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SourceMetricsHandle(Arc<Mutex<SourceMetrics>>);

impl SourceMetricsHandle {
    /// The counters now.
    #[must_use]
    pub fn snapshot(&self) -> SourceMetrics {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn update(
        &self,
        partition: PartitionId,
        f: impl FnOnce(&mut PartitionSourceMetrics),
    ) {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f(guard.partitions.entry(partition).or_default());
    }
}
