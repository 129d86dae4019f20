//! Where committed offsets live: the [`OffsetStore`] trait and the
//! in-memory store.

use std::collections::BTreeMap;

use etl_record::{Offset, PartitionId};

use crate::CheckpointError;
use crate::sync::{Arc, Mutex, lock};

/// Committed offsets by partition. A committed offset is the next offset to
/// read: everything below it was delivered.
pub type Offsets = BTreeMap<PartitionId, Offset>;

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
    fn load(&mut self) -> Result<Offsets, CheckpointError>;

    /// Durably record `offsets`, merged into what is stored (partitions not
    /// named keep their offsets). When this returns `Ok`, a crash at any
    /// later instant MUST still load these offsets; when it returns `Err`,
    /// the previous commit MUST still load.
    ///
    /// # Errors
    ///
    /// The commit did not happen.
    fn commit(&mut self, offsets: &Offsets) -> Result<(), CheckpointError>;
}

impl OffsetStore for Box<dyn OffsetStore> {
    fn load(&mut self) -> Result<Offsets, CheckpointError> {
        (**self).load()
    }

    fn commit(&mut self, offsets: &Offsets) -> Result<(), CheckpointError> {
        (**self).commit(offsets)
    }
}

/// Offsets in memory, lost with the process. Clones share the offsets, so
/// a test can keep one to inspect what was committed.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    offsets: Arc<Mutex<Offsets>>,
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
    pub fn with_offsets(offsets: Offsets) -> Self {
        let store = MemoryStore::new();
        *lock(&store.offsets) = offsets;
        store
    }

    /// What is committed now.
    #[must_use]
    pub fn offsets(&self) -> Offsets {
        lock(&self.offsets).clone()
    }

    /// How many commits were made.
    #[must_use]
    pub fn commits(&self) -> u64 {
        *lock(&self.commits)
    }
}

impl OffsetStore for MemoryStore {
    fn load(&mut self) -> Result<Offsets, CheckpointError> {
        Ok(self.offsets())
    }

    fn commit(&mut self, offsets: &Offsets) -> Result<(), CheckpointError> {
        lock(&self.offsets).extend(offsets.iter().map(|(p, o)| (*p, *o)));
        *lock(&self.commits) += 1;
        Ok(())
    }
}
