//! The refcounted per-batch handle and where its resolution is sent.

use std::fmt;

use etl_record::{Offset, PartitionId};

use crate::batch::{AckMsg, AckStatus, BatchId};
use crate::fence::WriteFence;
use crate::sync::{Arc, AtomicU8, Ordering};

/// Where a batch's resolution message is delivered: normally the
/// checkpointer's unbounded channel; under `--cfg etl_loom` an additional
/// recorder variant lets the drop/fail races be model-checked without an
/// unmodelled channel implementation.
#[derive(Clone)]
pub(crate) enum AckTx {
    /// The checkpointer's unbounded channel.
    Channel(crossbeam_channel::Sender<AckMsg>),
    /// Loom-test recorder.
    #[cfg(etl_loom)]
    Recorder(Arc<loom::sync::Mutex<Vec<AckMsg>>>),
}

impl AckTx {
    fn send(&self, msg: AckMsg) {
        match self {
            // A send error means the checkpointer is gone (shutdown
            // teardown); there is nothing left to acknowledge to.
            AckTx::Channel(tx) => {
                let _ = tx.send(msg);
            }
            #[cfg(etl_loom)]
            AckTx::Recorder(rec) => rec
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(msg),
        }
    }
}

impl fmt::Debug for AckTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AckTx")
    }
}

/// Shared acknowledgement state of one source poll batch.
///
/// Dropping the final handle sends an [`AckMsg`] on the checkpointer's
/// unbounded channel. `Arc`'s release/acquire on the refcount orders all
/// `fail()` calls before the drop-time status read, so no additional
/// synchronization is needed.
#[derive(Debug)]
struct AckState {
    id: BatchId,
    last_offset: Offset,
    status: AtomicU8,
    tx: AckTx,
    /// The fence of the channel the batch was opened on.
    fence: Option<Arc<WriteFence>>,
}

impl Drop for AckState {
    fn drop(&mut self) {
        let status = if self.status.load(Ordering::Relaxed) == AckStatus::Delivered as u8 {
            AckStatus::Delivered
        } else {
            AckStatus::Failed
        };
        self.tx.send(AckMsg {
            id: self.id,
            last_offset: self.last_offset,
            status,
        });
    }
}

/// Refcounted handle to a batch's acknowledgement state. Clone = one atomic
/// increment, no allocation; records hold one each.
#[derive(Clone, Debug)]
pub struct AckRef(Arc<AckState>);

impl AckRef {
    /// Create the handle for a new batch. Called by the source driver once
    /// per poll batch (through [`Acker::open`](crate::Acker::open));
    /// everything downstream only clones.
    pub(crate) fn new(
        id: BatchId,
        last_offset: Offset,
        tx: AckTx,
        fence: Option<Arc<WriteFence>>,
    ) -> Self {
        AckRef(Arc::new(AckState {
            id,
            last_offset,
            status: AtomicU8::new(AckStatus::Delivered as u8),
            tx,
            fence,
        }))
    }

    /// The fence of the channel the batch was opened on (none for a
    /// handle made for a test).
    pub(crate) fn fence(&self) -> Option<&Arc<WriteFence>> {
        self.0.fence.as_ref()
    }

    /// Whether the batch's epoch is closed: its partition is being
    /// revoked (or was), so an exactly-once sink must start no write of
    /// it ([`WriteFence`]).
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        self.fence()
            .is_some_and(|fence| fence.is_closed(self.batch_id()))
    }

    /// Mark the batch failed. Idempotent; any single failure poisons the
    /// batch (worst-of lattice), stalling the partition watermark.
    pub fn fail(&self) {
        self.0
            .status
            .store(AckStatus::Failed as u8, Ordering::Relaxed);
    }

    /// Identity of the batch this handle belongs to.
    #[must_use]
    pub fn batch_id(&self) -> BatchId {
        self.0.id
    }

    /// Highest source offset of the batch (inclusive).
    #[must_use]
    pub fn last_offset(&self) -> Offset {
        self.0.last_offset
    }

    /// Whether both handles belong to the same batch (the same shared
    /// state), so one of them may stand for both.
    #[must_use]
    pub fn same_batch(&self, other: &AckRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Build a handle plus the receiver its resolution message arrives on.
    /// Kept (hidden) for the reference implementation's own tests, which
    /// this crate keeps as its specification; everything else opens
    /// handles through [`channel`](crate::channel) and
    /// [`Acker::open`](crate::Acker::open), as the pipeline does.
    #[doc(hidden)]
    #[must_use]
    pub fn test_pair() -> (Self, crossbeam_channel::Receiver<AckMsg>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            Self::new(
                BatchId {
                    partition: PartitionId(0),
                    epoch: 0,
                    seq: 0,
                },
                Offset(0),
                AckTx::Channel(tx),
                None,
            ),
            rx,
        )
    }
}

/// Loom-only constructors for model checks in other crates.
#[cfg(etl_loom)]
pub mod loom_support {
    use super::*;

    /// A recorder every resolution is pushed to.
    pub type Recorder = Arc<loom::sync::Mutex<Vec<AckMsg>>>;

    /// A handle whose resolution is pushed to `recorder` instead of a
    /// channel, so loom sees every step.
    #[must_use]
    pub fn recorded(id: BatchId, last_offset: Offset, recorder: &Recorder) -> AckRef {
        AckRef::new(id, last_offset, AckTx::Recorder(recorder.clone()), None)
    }

    /// As [`recorded`], opened on a channel whose fence is `fence`, so
    /// [`AckSet::begin_write`](crate::AckSet::begin_write) registers its
    /// writes there.
    #[must_use]
    pub fn recorded_fenced(
        id: BatchId,
        last_offset: Offset,
        recorder: &Recorder,
        fence: &Arc<WriteFence>,
    ) -> AckRef {
        AckRef::new(
            id,
            last_offset,
            AckTx::Recorder(recorder.clone()),
            Some(fence.clone()),
        )
    }
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    use super::*;

    fn make(tx: crossbeam_channel::Sender<AckMsg>, seq: u64, last_offset: i64) -> AckRef {
        AckRef::new(
            BatchId {
                partition: PartitionId(1),
                epoch: 7,
                seq,
            },
            Offset(last_offset),
            AckTx::Channel(tx),
            None,
        )
    }

    #[test]
    fn resolves_once_on_last_drop() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ack = make(tx, 3, 99);
        let clones: Vec<_> = (0..8).map(|_| ack.clone()).collect();
        drop(ack);
        assert!(rx.try_recv().is_err(), "must not resolve while clones live");
        drop(clones);
        let msg = rx.try_recv().expect("resolved on last drop");
        assert_eq!(msg.id.seq, 3);
        assert_eq!(msg.last_offset, Offset(99));
        assert_eq!(msg.status, AckStatus::Delivered);
        assert!(rx.try_recv().is_err(), "resolves exactly once");
    }

    #[test]
    fn any_failure_poisons_the_batch() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ack = make(tx, 0, 10);
        let sibling = ack.clone();
        sibling.fail();
        drop(sibling);
        drop(ack);
        assert_eq!(rx.try_recv().unwrap().status, AckStatus::Failed);
    }

    #[test]
    fn dropped_checkpointer_does_not_panic() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ack = make(tx, 0, 0);
        drop(rx);
        drop(ack); // send fails silently — shutdown teardown ordering
    }

    #[test]
    fn same_batch_is_identity_not_equality() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let a = make(tx.clone(), 0, 0);
        let b = make(tx, 0, 0);
        assert!(a.same_batch(&a.clone()));
        assert!(!a.same_batch(&b), "equal ids, different handles");
        assert_eq!(a.last_offset(), Offset(0));
    }
}
