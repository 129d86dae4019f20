//! Where committed offsets live: the [`OffsetStore`] trait and the
//! in-memory store.

pub use etl_record::PartitionOffsets;

use crate::CheckpointError;
use crate::sync::{Arc, Mutex, lock};

/// Durable storage of committed offsets.
///
/// Synchronous on purpose: it runs on the checkpointer's own thread, where
/// blocking is fine and ordering is simple.
pub trait OffsetStore: Send + 'static {
    /// Every committed offset.
    ///
    /// # Errors
    ///
    /// The store cannot be read; it MUST NOT pretend to be empty then.
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError>;

    /// Every committed offset, lent to `read` rather than returned: the
    /// checkpointer reads the store this way when partitions are assigned.
    /// The provided method calls [`load`](Self::load); a store that keeps
    /// its offsets in memory lends its own instead of a copy (a file
    /// source assigns a partition per input file at once, so a copy of
    /// every offset is a peak of memory at start).
    ///
    /// On `Ok`, it MUST have called `read` exactly once, with every
    /// committed offset (the checkpointer fails the assignment otherwise).
    /// `read` may be called with a lock of the store's held: it does not
    /// call back into the store.
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load); `read` is not called then.
    fn load_with(
        &mut self,
        read: &mut dyn FnMut(&PartitionOffsets),
    ) -> Result<(), CheckpointError> {
        read(&self.load()?);
        Ok(())
    }

    /// Durably record `offsets`, merged into what is stored (partitions not
    /// named keep their offsets). When this returns `Ok`, a crash at any
    /// later instant MUST still load these offsets; when it returns `Err`,
    /// the previous commit MUST still load.
    ///
    /// # Errors
    ///
    /// The commit did not happen.
    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError>;
}

impl OffsetStore for Box<dyn OffsetStore> {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        (**self).load()
    }

    fn load_with(
        &mut self,
        read: &mut dyn FnMut(&PartitionOffsets),
    ) -> Result<(), CheckpointError> {
        (**self).load_with(read)
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        (**self).commit(offsets)
    }
}

/// Offsets in memory, lost with the process. Clones share the offsets, so
/// a test can keep one to inspect what was committed.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    offsets: Arc<Mutex<PartitionOffsets>>,
    commits: Arc<Mutex<u64>>,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// A store holding `offsets`, as if committed earlier.
    #[must_use]
    pub fn with_offsets(offsets: PartitionOffsets) -> Self {
        let store = MemoryStore::new();
        *lock(&store.offsets) = offsets;
        store
    }

    /// What is committed now.
    #[must_use]
    pub fn offsets(&self) -> PartitionOffsets {
        lock(&self.offsets).clone()
    }

    /// How many commits were made.
    #[must_use]
    pub fn commits(&self) -> u64 {
        *lock(&self.commits)
    }
}

impl OffsetStore for MemoryStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(self.offsets())
    }

    fn load_with(
        &mut self,
        read: &mut dyn FnMut(&PartitionOffsets),
    ) -> Result<(), CheckpointError> {
        read(&lock(&self.offsets));
        Ok(())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        lock(&self.offsets).extend(offsets.iter().map(|(p, o)| (*p, *o)));
        *lock(&self.commits) += 1;
        Ok(())
    }
}
