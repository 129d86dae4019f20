//! Data travelling with the acknowledgement handle that covers it.

use crate::ack_ref::AckRef;

/// A value (records of one poll batch, a slice of them, a dead letter)
/// together with the handle of the batch it came from.
///
/// Dropping it releases the handle, which resolves the batch *Delivered*
/// once every other holder is done: for records that means consumed.
/// Code that cannot finish with the value must call [`AckRef::fail`] on
/// the handle first, or move the handle into an
/// [`AckSet`](crate::AckSet), which fails on drop.
#[derive(Clone, Debug)]
pub struct Acked<T> {
    /// The data.
    pub value: T,
    /// The handle of the poll batch the data came from.
    pub ack: AckRef,
}

impl<T> Acked<T> {
    /// Pair a value with a handle.
    #[must_use]
    pub fn new(value: T, ack: AckRef) -> Self {
        Acked { value, ack }
    }

    /// Transform the value, keeping the handle.
    #[must_use]
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Acked<U> {
        Acked {
            value: f(self.value),
            ack: self.ack,
        }
    }

    /// Split into the value and the handle.
    #[must_use]
    pub fn into_parts(self) -> (T, AckRef) {
        (self.value, self.ack)
    }
}
