//! The checkpointer's metrics snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use etl_record::{Offset, PartitionId};

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
