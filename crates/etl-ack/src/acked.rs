//! Data travelling with the acknowledgement handle that covers it.

use crate::ack_ref::AckRef;

/// A value in transit (records of one poll batch, a slice of them, a dead
/// letter) together with the handle of the batch it came from.
///
/// **Dropping an `Acked` fails its handle.** A value in transit that is
/// dropped — a queue torn down, a task aborted, a panic unwinding through
/// a stage — never reads as delivered, so no queue that carries `Acked`
/// values needs a guard of its own. Code that takes a value off a queue
/// and finishes with it calls [`into_parts`](Acked::into_parts): from then
/// on the bare [`AckRef`] is its responsibility (dropping it means
/// *consumed*; moving it into an [`AckSet`](crate::AckSet) fails it unless
/// the set is delivered).
///
/// # Example
///
/// ```
/// use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
/// use etl_record::{Offset, PartitionId};
///
/// let (acker, mut receiver) = etl_ack::channel();
/// let id = BatchId { partition: PartitionId(0), epoch: 1, seq: 0 };
/// let meta = BatchMeta { id, first_offset: Offset(0), last_offset: Offset(0), records: 1, bytes: 3 };
///
/// // Torn down in transit: the batch fails.
/// let lost = Acked::new("abc", acker.open(meta).unwrap());
/// drop(lost);
/// let _opened = receiver.try_next();
/// match receiver.try_next() {
///     Ok(AckEvent::Resolved(msg)) => assert_eq!(msg.status, AckStatus::Failed),
///     other => panic!("unexpected {other:?}"),
/// }
///
/// // Taken off the queue and consumed: the batch is delivered.
/// let taken = Acked::new("abc", acker.open(meta).unwrap());
/// let (value, ack) = taken.into_parts();
/// assert_eq!(value, "abc");
/// drop(ack);
/// let _opened = receiver.try_next();
/// match receiver.try_next() {
///     Ok(AckEvent::Resolved(msg)) => assert_eq!(msg.status, AckStatus::Delivered),
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
#[derive(Debug)]
pub struct Acked<T> {
    value: T,
    guard: InTransit,
}

/// Fails the handle it holds when dropped, unless released.
#[derive(Debug)]
struct InTransit {
    ack: AckRef,
    armed: bool,
}

impl InTransit {
    /// Hand the handle out; dropping the guard then does nothing.
    fn release(mut self) -> AckRef {
        self.armed = false;
        // A clone (one reference count) rather than a move: the guard has
        // a destructor, so its fields cannot be moved out of it.
        self.ack.clone()
    }
}

impl Drop for InTransit {
    fn drop(&mut self) {
        if self.armed {
            self.ack.fail();
        }
    }
}

/// A copy in transit of its own (for a fan-out to several queues): each
/// copy fails the batch if it is dropped.
impl<T: Clone> Clone for Acked<T> {
    fn clone(&self) -> Self {
        Acked::new(self.value.clone(), self.guard.ack.clone())
    }
}

impl<T> Acked<T> {
    /// Pair a value with a handle.
    #[must_use]
    pub fn new(value: T, ack: AckRef) -> Self {
        Acked {
            value,
            guard: InTransit { ack, armed: true },
        }
    }

    /// The data.
    #[must_use]
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The data, to change in place.
    #[must_use]
    pub fn value_mut(&mut self) -> &mut T {
        &mut self.value
    }

    /// The handle of the poll batch the data came from.
    #[must_use]
    pub fn ack(&self) -> &AckRef {
        &self.guard.ack
    }

    /// Transform the value, keeping the handle (still failed on drop).
    #[must_use]
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Acked<U> {
        let Acked { value, guard } = self;
        Acked {
            value: f(value),
            guard,
        }
    }

    /// Take the value and the handle out of transit: the caller now
    /// decides the batch's fate (a bare [`AckRef`] dropped means
    /// consumed).
    #[must_use]
    pub fn into_parts(self) -> (T, AckRef) {
        let Acked { value, guard } = self;
        (value, guard.release())
    }

    /// Finish with the value: the handle is released as consumed (the
    /// batch resolves *Delivered* once every other holder is done, unless
    /// one of them failed it).
    pub fn consume(self) {
        drop(self.into_parts());
    }

    /// Mark the batch failed and drop the value (what dropping does,
    /// spelled out).
    pub fn fail(self) {
        drop(self);
    }
}
