//! What a power loss would leave of the disk now, without causing one.

use std::sync::{Arc, Mutex};

use super::{SimFaults, SimFs};

impl SimFs {
    /// A copy of the disk as a power loss at this instant would leave
    /// it, keeping no unsynced write or name: only what an `fsync`
    /// covered. The copy is a file system of its own (changes to either
    /// do not reach the other) with no faults; this one is left as it
    /// is, its processes alive. A simulation checks against it that
    /// what was acknowledged so far is durable, at any instant and not
    /// only at the crashes it stages.
    #[must_use]
    pub fn durable_copy(&self) -> SimFs {
        let mut inner = self.lock().clone();
        inner.faults = SimFaults::default();
        inner.next_failures.clear();
        inner.crash();
        let epoch = inner.epoch;
        SimFs {
            inner: Arc::new(Mutex::new(inner)),
            epoch,
            blocks: false,
        }
    }
}
