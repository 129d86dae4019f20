//! The checkpointer and the consumer group, wired to each other: the group
//! is the checkpointer's offset store, and the checkpointer ends the
//! epochs of partitions the group revokes.

use std::collections::BTreeMap;

use etl_checkpoint::{CheckpointError, CheckpointHandle, OffsetStore, PartitionOffsets};
use etl_record::PartitionId;

use crate::{GroupOffsetStore, RevokeHandler};

/// The checkpointer commits its watermarks to the group: `load` reads the
/// group's committed offsets (on every assignment, so a partition that
/// comes back starts where its last owner committed), `commit` waits for
/// the coordinator.
impl OffsetStore for GroupOffsetStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        GroupOffsetStore::load(self).map_err(|e| CheckpointError::Store(Box::new(e)))
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        GroupOffsetStore::commit(self, offsets).map_err(|e| CheckpointError::Store(Box::new(e)))
    }
}

/// A revocation inside the rebalance callback goes through the
/// checkpointer: it ends the partitions' epochs, waits for their in-flight
/// batches up to its `revoke_deadline` and commits their watermarks to the
/// group before the callback returns. Revoking a partition the
/// checkpointer does not track (never assigned, or already revoked by the
/// source driver) does nothing. Nor does revoking through a checkpointer
/// that has stopped: a pipeline shuts its checkpointer down (with a final
/// commit of every partition) before the source leaves the group, so the
/// group's offsets are already where they belong.
impl RevokeHandler for CheckpointHandle {
    fn revoke_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>> {
        // The partitions go to another member: fenced (an exactly-once
        // sink starts nothing more of them; a write of them still under
        // way at the deadline halts the run).
        match CheckpointHandle::hand_over_blocking(self, partitions) {
            Err(CheckpointError::Stopped) => {
                tracing::debug!("revoke after the checkpointer's final commit: nothing to commit");
                Ok(BTreeMap::new())
            }
            other => other.map_err(Into::into),
        }
    }
}
