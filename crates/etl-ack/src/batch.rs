//! Batch identity, status and the messages the checkpointer receives.

use etl_record::{Offset, PartitionId};

/// Identity of one source poll batch within a partition and assignment
/// epoch. Epochs are bumped on every rebalance so acknowledgements from
/// revoked assignments are recognized as stale and discarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchId {
    /// Partition the batch was polled from.
    pub partition: PartitionId,
    /// Assignment epoch the batch belongs to.
    pub epoch: u32,
    /// Per-partition, per-epoch monotonically increasing sequence number.
    pub seq: u64,
}

/// Resolution status of a batch. Forms a "worst-of" lattice: once any
/// record of the batch fails, the batch is failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum AckStatus {
    /// Every record was durably delivered, filtered, or intentionally
    /// skipped by policy.
    Delivered = 0,
    /// At least one record could not be delivered; the partition watermark
    /// must not advance past this batch.
    Failed = 1,
}

/// Message sent to the checkpointer when the last [`AckRef`](crate::AckRef)
/// clone of a batch drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckMsg {
    /// Which batch resolved.
    pub id: BatchId,
    /// Highest source offset contained in the batch (inclusive). The
    /// committable position after this batch is `last_offset + 1`.
    pub last_offset: Offset,
    /// Worst status observed across the batch's records.
    pub status: AckStatus,
}

/// What the source side declares when it opens a batch: enough for the
/// checkpointer to account for in-flight work before the batch resolves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    /// The batch's identity.
    pub id: BatchId,
    /// Offset of the batch's first record.
    pub first_offset: Offset,
    /// Offset of the batch's last record (inclusive).
    pub last_offset: Offset,
    /// Number of records in the batch.
    pub records: u32,
    /// Payload bytes in the batch.
    pub bytes: u64,
}
