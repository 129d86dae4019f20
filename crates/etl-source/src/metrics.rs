//! What the source driver counts, per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use etl_record::{Offset, PartitionId};

use crate::SourceGauge;

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
    /// The source's own figures, as it last reported them
    /// ([`Source::gauges`](crate::Source::gauges)).
    pub gauges: Vec<SourceGauge>,
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

    /// Read the counters in place: `f` sees them under their lock, so a
    /// figure summed over many partitions needs no copy of them all.
    /// Keep `f` short: the driver waits for it to count.
    pub fn with_metrics<R>(&self, f: impl FnOnce(&SourceMetrics) -> R) -> R {
        f(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Mark partitions assigned under their epochs, with no position
    /// yet. Partitions new to the counters join in sorted runs through
    /// `append`, which builds packed nodes: inserted one by one in order
    /// (a file source assigns a partition per input file, in order), a
    /// B-tree's nodes stay about half full.
    pub(crate) fn assigned(&self, partitions: impl IntoIterator<Item = (PartitionId, u32)>) {
        /// New partitions merged at a time: the run is the only copy.
        const RUN: usize = 4096;
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut run = BTreeMap::new();
        for (partition, epoch) in partitions {
            let m = match guard.partitions.get_mut(&partition) {
                Some(m) => m,
                None => run.entry(partition).or_default(),
            };
            m.assigned = true;
            m.epoch = epoch;
            m.position = None;
            if run.len() == RUN {
                guard.partitions.append(&mut run);
            }
        }
        guard.partitions.append(&mut run);
    }

    /// The source's own figures now; nothing to do for a source that
    /// has none.
    pub(crate) fn set_gauges(&self, gauges: Vec<SourceGauge>) {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !(gauges.is_empty() && guard.gauges.is_empty()) {
            guard.gauges = gauges;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigning_marks_every_partition_and_keeps_earlier_counters() {
        let handle = SourceMetricsHandle::default();
        handle.update(PartitionId(3), |m| {
            m.records = 7;
            m.position = Some(Offset(70));
        });
        // More partitions than one merged run, not in order.
        let ids = (0..10_000u32).rev().map(|p| (PartitionId(p), p % 5));
        handle.assigned(ids);
        handle.with_metrics(|s| {
            assert_eq!(s.partitions.len(), 10_000);
            assert!(
                s.partitions
                    .iter()
                    .all(|(p, m)| m.assigned && m.epoch == p.0 % 5 && m.position.is_none())
            );
            assert_eq!(s.partitions[&PartitionId(3)].records, 7, "kept");
        });
    }
}
