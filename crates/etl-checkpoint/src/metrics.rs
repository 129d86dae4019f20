//! The checkpointer's metrics snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use etl_record::{Offset, PartitionId};

use crate::sparse;

/// One partition, as the checkpointer sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionMetrics {
    /// Current assignment epoch.
    pub epoch: u32,
    /// Delivered watermark: every offset below it was delivered.
    pub watermark: Offset,
    /// Last committed offset, if any.
    pub committed: Option<Offset>,
    /// Batches in flight (opened, not folded into the watermark).
    pub in_flight_batches: u64,
    /// Payload bytes in flight.
    pub in_flight_bytes: u64,
    /// Age of the oldest unresolved batch.
    pub oldest_unresolved_age: Option<Duration>,
    /// Failed batches seen.
    pub failed_batches: u64,
    /// Replays requested.
    pub replays: u64,
    /// Stale or duplicate acknowledgements discarded.
    pub stale_acks: u64,
}

/// A snapshot of the checkpointer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointMetrics {
    /// Assigned partitions.
    pub partitions: BTreeMap<PartitionId, PartitionMetrics>,
    /// Successful commits.
    pub commits: u64,
    /// Failed commits.
    pub commit_errors: u64,
    /// The last commit error, if the last commit failed.
    pub last_commit_error: Option<String>,
    /// Stale acknowledgements of partitions no longer assigned.
    pub stale_acks_unassigned: u64,
}

/// The checkpointer's metrics as it publishes them, read in place through
/// [`CheckpointHandle::with_metrics`](crate::CheckpointHandle::with_metrics);
/// [`to_metrics`](Self::to_metrics) makes the [`CheckpointMetrics`]
/// snapshot of them.
///
/// A file source has a partition per input file, nearly all idle at any
/// time, so the figures are kept compactly: a small row per partition
/// (epoch, watermark, committed offset), and the rest (in flight, oldest
/// unresolved, failures, replays, stale acknowledgements) only for the
/// partitions where one of them is not zero. Every figure of
/// [`PartitionMetrics`] reads the same either way.
#[derive(Clone, Debug, Default)]
pub struct PublishedMetrics {
    /// One row per assigned partition, sorted by partition.
    rows: Vec<Row>,
    /// The figures that are not zero, of the rows marked `busy`, sorted
    /// by partition.
    busy: Vec<(PartitionId, Busy)>,
    /// Successful commits.
    pub commits: u64,
    /// Failed commits.
    pub commit_errors: u64,
    /// The last commit error, if the last commit failed.
    pub last_commit_error: Option<String>,
    /// Stale acknowledgements of partitions no longer assigned.
    pub stale_acks_unassigned: u64,
}

/// One partition's figures that every partition has.
#[derive(Clone, Copy, Debug)]
struct Row {
    partition: PartitionId,
    epoch: u32,
    watermark: Offset,
    /// Meaningful when `has_committed`.
    committed: Offset,
    has_committed: bool,
    /// Its other figures are in `busy`.
    busy: bool,
}

/// The figures that stay zero on an idle, healthy partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Busy {
    in_flight_batches: u64,
    in_flight_bytes: u64,
    oldest_unresolved_age: Option<Duration>,
    failed_batches: u64,
    replays: u64,
    stale_acks: u64,
}

impl sparse::DenseRow for Row {
    fn partition(&self) -> PartitionId {
        self.partition
    }

    fn has_extra(&self) -> bool {
        self.busy
    }
}

impl Row {
    fn metrics(&self, busy: Busy) -> PartitionMetrics {
        PartitionMetrics {
            epoch: self.epoch,
            watermark: self.watermark,
            committed: self.has_committed.then_some(self.committed),
            in_flight_batches: busy.in_flight_batches,
            in_flight_bytes: busy.in_flight_bytes,
            oldest_unresolved_age: busy.oldest_unresolved_age,
            failed_batches: busy.failed_batches,
            replays: busy.replays,
            stale_acks: busy.stale_acks,
        }
    }
}

impl PublishedMetrics {
    /// Assigned partitions.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no partition is assigned.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The figures of `partition`, if it is assigned.
    #[must_use]
    pub fn partition(&self, partition: PartitionId) -> Option<PartitionMetrics> {
        let row = &self.rows[sparse::find(&self.rows, partition).ok()?];
        Some(row.metrics(sparse::extra_of(row, &self.busy)))
    }

    /// Every assigned partition with its figures, in partition order.
    pub fn partitions(&self) -> impl Iterator<Item = (PartitionId, PartitionMetrics)> + '_ {
        sparse::with_extras(&self.rows, &self.busy)
            .map(|(row, busy)| (row.partition, row.metrics(busy)))
    }

    /// The snapshot of these figures.
    #[must_use]
    pub fn to_metrics(&self) -> CheckpointMetrics {
        CheckpointMetrics {
            partitions: self.partitions().collect(),
            commits: self.commits,
            commit_errors: self.commit_errors,
            last_commit_error: self.last_commit_error.clone(),
            stale_acks_unassigned: self.stale_acks_unassigned,
        }
    }

    /// Replace every partition's figures with `partitions` (`len` of
    /// them, in partition order). The rows are rewritten in place: their
    /// vector keeps its memory from one refresh to the next, and is sized
    /// exactly when it grows, so publishing never holds two copies of
    /// every partition's figures.
    pub(crate) fn refresh(
        &mut self,
        len: usize,
        partitions: impl IntoIterator<Item = (PartitionId, PartitionMetrics)>,
    ) {
        self.rows.clear();
        self.busy.clear();
        self.rows.reserve_exact(len);
        if len < self.rows.capacity() / 4 {
            self.rows.shrink_to(len * 2);
        }
        for (partition, m) in partitions {
            let busy = Busy {
                in_flight_batches: m.in_flight_batches,
                in_flight_bytes: m.in_flight_bytes,
                oldest_unresolved_age: m.oldest_unresolved_age,
                failed_batches: m.failed_batches,
                replays: m.replays,
                stale_acks: m.stale_acks,
            };
            let is_busy = busy != Busy::default();
            if is_busy {
                self.busy.push((partition, busy));
            }
            self.rows.push(Row {
                partition,
                epoch: m.epoch,
                watermark: m.watermark,
                committed: m.committed.unwrap_or_default(),
                has_committed: m.committed.is_some(),
                busy: is_busy,
            });
        }
        if self.busy.len() < self.busy.capacity() / 4 {
            self.busy.shrink_to(self.busy.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(p: u32) -> PartitionMetrics {
        PartitionMetrics {
            epoch: p % 3 + 1,
            watermark: Offset(i64::from(p) * 10),
            committed: p.is_multiple_of(2).then_some(Offset(i64::from(p))),
            ..PartitionMetrics::default()
        }
    }

    #[test]
    fn published_figures_read_back_as_they_were_given() {
        let mut given: Vec<(PartitionId, PartitionMetrics)> =
            (0..50).map(|p| (PartitionId(p * 2), figures(p))).collect();
        given[3].1.in_flight_batches = 2;
        given[3].1.in_flight_bytes = 300;
        given[3].1.oldest_unresolved_age = Some(Duration::from_millis(40));
        given[17].1.failed_batches = 1;
        given[17].1.replays = 1;
        given[49].1.stale_acks = 5;
        let mut published = PublishedMetrics::default();
        published.refresh(given.len(), given.iter().cloned());
        assert_eq!(published.len(), 50);
        assert_eq!(published.busy.len(), 3, "only the partitions with figures");
        assert!(published.partitions().eq(given.iter().cloned()));
        for (p, m) in &given {
            assert_eq!(published.partition(*p).as_ref(), Some(m));
        }
        assert_eq!(published.partition(PartitionId(1)), None);
        assert_eq!(
            published.to_metrics().partitions,
            given.iter().cloned().collect::<BTreeMap<_, _>>()
        );
        // A refresh replaces everything, and gives memory back.
        published.refresh(1, [(PartitionId(7), figures(7))]);
        assert!(published.partitions().eq([(PartitionId(7), figures(7))]));
        assert!(published.busy.is_empty() && published.rows.capacity() <= 2);
    }
}
