//! The write fence: which epochs of which partitions may no longer start a
//! write, and which writes of theirs are under way.
//!
//! An exactly-once sink stores its progress with its data, keyed by where
//! a partition's records start. Once a partition is handed to another
//! owner, a write of the old owner's that lands late replaces the new
//! owner's objects and sets its progress back. So the checkpointer closes
//! a partition's epochs as its revocation begins
//! ([`WriteFence::close`]), and an exactly-once sink driver asks before
//! each write and each retry ([`AckSet::begin_write`]): a batch of a
//! closed epoch is not written, and a write already under way is
//! registered until it ends, so the revocation can tell whether one may
//! still land ([`WriteFence::writing`]).
//!
//! Registration and closing take one lock per partition batch, so either
//! the write registered before the epoch closed (and the revocation sees
//! it under way until it ends), or it is refused.
//!
//! [`AckSet::begin_write`]: crate::AckSet::begin_write

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use etl_record::PartitionId;

use crate::batch::BatchId;
use crate::sync::{Arc, Mutex, lock};

/// The fence of one acknowledgement channel (see the module's docs): the
/// receiver's owner closes epochs, the holders of the channel's handles
/// register their writes. Get it from
/// [`AckReceiver::fence`](crate::AckReceiver::fence).
pub struct WriteFence {
    state: Mutex<FenceState>,
}

impl Default for WriteFence {
    fn default() -> Self {
        WriteFence {
            state: Mutex::new(FenceState::default()),
        }
    }
}

#[derive(Default)]
struct FenceState {
    /// Per partition, the highest closed epoch: it and every epoch below
    /// are closed. (Epochs only grow per partition while a checkpointer
    /// runs.)
    closed: HashMap<PartitionId, u32>,
    /// Writes under way, per partition and epoch.
    writing: BTreeMap<(PartitionId, u32), usize>,
}

impl fmt::Debug for WriteFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("WriteFence")
            .field("closed", &state.closed)
            .field("writing", &state.writing.len())
            .finish()
    }
}

impl WriteFence {
    /// A fence with every epoch open.
    #[must_use]
    pub fn new() -> Self {
        WriteFence::default()
    }

    /// Close `partition`'s epochs up to `through` (inclusive): from now on
    /// no write of a batch of those epochs starts. Writes already under
    /// way go on ([`writing`](Self::writing) says whether one is). A
    /// partition's closed epochs never reopen; a later assignment's
    /// higher epoch is open.
    pub fn close(&self, partition: PartitionId, through: u32) {
        let mut state = lock(&self.state);
        let closed = state.closed.entry(partition).or_insert(through);
        *closed = (*closed).max(through);
    }

    /// Whether `batch`'s epoch is closed: it may start no write.
    #[must_use]
    pub fn is_closed(&self, batch: BatchId) -> bool {
        lock(&self.state).is_closed(batch)
    }

    /// Whether a write of a closed epoch of `partition` is under way: it
    /// began before the epoch closed and has not ended.
    #[must_use]
    pub fn writing(&self, partition: PartitionId) -> bool {
        let state = lock(&self.state);
        let Some(&through) = state.closed.get(&partition) else {
            return false;
        };
        state
            .writing
            .range((partition, 0)..=(partition, through))
            .any(|(_, n)| *n > 0)
    }

    /// Register a write of `batch`, unless its epoch is closed.
    pub(crate) fn register(&self, batch: BatchId) -> bool {
        let mut state = lock(&self.state);
        if state.is_closed(batch) {
            return false;
        }
        *state
            .writing
            .entry((batch.partition, batch.epoch))
            .or_insert(0) += 1;
        true
    }

    /// The write of `batch` registered by [`register`](Self::register)
    /// ended.
    pub(crate) fn release(&self, batch: BatchId) {
        let mut state = lock(&self.state);
        let key = (batch.partition, batch.epoch);
        if let Some(n) = state.writing.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.writing.remove(&key);
            }
        }
    }
}

impl FenceState {
    fn is_closed(&self, batch: BatchId) -> bool {
        self.closed
            .get(&batch.partition)
            .is_some_and(|&through| batch.epoch <= through)
    }
}

/// A write under way, registered with the fences of the batches it
/// holds ([`AckSet::begin_write`](crate::AckSet::begin_write)): the
/// registration ends when the guard drops. Hold it for the whole write,
/// retries excluded (each retry begins again).
#[must_use = "the write is registered only while the guard lives"]
pub struct WriteGuard {
    registered: Vec<(Arc<WriteFence>, BatchId)>,
}

impl WriteGuard {
    pub(crate) fn new() -> Self {
        WriteGuard {
            registered: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, fence: Arc<WriteFence>, batch: BatchId) {
        self.registered.push((fence, batch));
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field(
                "batches",
                &self.registered.iter().map(|(_, b)| b).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        for (fence, batch) in self.registered.drain(..) {
            fence.release(batch);
        }
    }
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    use super::*;
    use crate::AckRef;

    fn id(partition: u32, epoch: u32) -> BatchId {
        BatchId {
            partition: PartitionId(partition),
            epoch,
            seq: 0,
        }
    }

    #[test]
    fn a_closed_epoch_and_those_below_refuse_a_write_and_a_later_one_does_not() {
        let fence = WriteFence::new();
        assert!(fence.register(id(1, 3)));
        fence.close(PartitionId(1), 3);
        for epoch in [1, 3] {
            assert!(fence.is_closed(id(1, epoch)));
            assert!(!fence.register(id(1, epoch)), "epoch {epoch}");
        }
        assert!(!fence.is_closed(id(1, 4)), "a later assignment");
        assert!(!fence.is_closed(id(2, 3)), "another partition");
        // A lower close does not reopen.
        fence.close(PartitionId(1), 2);
        assert!(fence.is_closed(id(1, 3)));
    }

    #[test]
    fn a_write_registered_before_the_close_is_under_way_until_it_is_released() {
        let fence = WriteFence::new();
        assert!(fence.register(id(1, 2)));
        assert!(fence.register(id(1, 2)));
        assert!(fence.register(id(1, 5)));
        assert!(!fence.writing(PartitionId(1)), "no epoch closed yet");
        fence.close(PartitionId(1), 2);
        assert!(fence.writing(PartitionId(1)));
        fence.release(id(1, 2));
        assert!(fence.writing(PartitionId(1)), "one of two ended");
        fence.release(id(1, 2));
        assert!(
            !fence.writing(PartitionId(1)),
            "epoch 5's write is the next assignment's, not the revoked one's"
        );
    }

    #[test]
    fn a_set_begins_no_write_once_one_of_its_epochs_is_closed_and_its_guard_ends_the_write() {
        let (acker, receiver) = crate::channel();
        let open = |partition: u32, epoch: u32| {
            acker
                .open(crate::BatchMeta {
                    id: id(partition, epoch),
                    first_offset: etl_record::Offset(0),
                    last_offset: etl_record::Offset(0),
                    records: 1,
                    bytes: 1,
                })
                .unwrap()
        };
        let fence = receiver.fence();
        let mut set: crate::AckSet = vec![open(1, 1), open(2, 1)].into();
        let guard = set.begin_write().expect("nothing closed");
        fence.close(PartitionId(2), 1);
        assert!(fence.writing(PartitionId(2)), "registered before the close");
        assert!(set.begin_write().is_none(), "a retry does not start");
        assert!(
            !fence.writing(PartitionId(1)),
            "the refused attempt left nothing registered"
        );
        drop(guard);
        assert!(!fence.writing(PartitionId(2)));
        let fenced = set.take_where(|_, ack| ack.is_fenced());
        assert_eq!(
            fenced.iter().map(AckRef::batch_id).collect::<Vec<_>>(),
            vec![id(2, 1)]
        );
        assert!(
            set.begin_write().is_some(),
            "partition 1 alone may be written"
        );
        set.deliver();
        drop(fenced);
    }
}
