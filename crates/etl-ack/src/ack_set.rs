//! The fail-safe collection of handles on the sink path.

use crate::ack_ref::AckRef;
use crate::fence::WriteGuard;

/// A fail-safe collection of acknowledgement handles for data that has not
/// been durably written yet (encoded chunks, sink batches).
///
/// A bare [`AckRef`] resolves *Delivered* on drop — the right default for
/// records, where drop means "consumed" (filtered out, skipped by policy,
/// or written). Collections travelling the sink path are different: there,
/// drop without an explicit outcome means the data was torn down (task
/// aborted, queue dropped, worker cancelled), and resolving Delivered would
/// commit offsets for rows that never reached the sink. `AckSet` therefore
/// **fails** every handle it still holds when dropped; the happy path calls
/// [`AckSet::deliver`] after the durable write. Over-failing is always safe
/// under at-least-once — it costs replay, never loss.
///
/// Consecutive handles of the same batch share one slot: a sink batch of
/// 10,000 records from one poll batch holds one handle, so the set's size
/// follows the number of poll batches, not of records.
#[derive(Debug, Default)]
pub struct AckSet(Vec<AckRef>);

impl AckSet {
    /// An empty set.
    #[must_use]
    pub fn new() -> Self {
        AckSet(Vec::new())
    }

    /// Add a handle to the set. A handle of the same batch as the last one
    /// added is folded into it (the extra clone is released, which cannot
    /// resolve the batch while the set holds its twin).
    pub fn push(&mut self, ack: AckRef) {
        match self.0.last() {
            Some(last) if last.same_batch(&ack) => {}
            _ => self.0.push(ack),
        }
    }

    /// Move every handle out of `other` into `self`.
    pub fn absorb(&mut self, mut other: AckSet) {
        let mut handles = std::mem::take(&mut other.0).into_iter();
        if let Some(first) = handles.next() {
            self.push(first);
        }
        self.0.extend(handles);
    }

    /// Whether the set holds no handles.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of handles held (distinct consecutive batches).
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Split the set in two: `self` keeps the first `at` handles, the
    /// returned set holds the rest (both still fail what they hold when
    /// dropped). Lets a sink resolve the batches of one write one by one.
    ///
    /// # Panics
    ///
    /// If `at > self.len()`.
    #[must_use]
    pub fn split_off(&mut self, at: usize) -> AckSet {
        AckSet(self.0.split_off(at))
    }

    /// The handles held, in insertion order.
    pub fn iter(&self) -> std::slice::Iter<'_, AckRef> {
        self.0.iter()
    }

    /// Move the handles for which `take(index, handle)` is true into a
    /// set of their own (both keep their order; both still fail what they
    /// hold when dropped). `index` counts the handles as held before the
    /// call.
    #[must_use]
    pub fn take_where(&mut self, mut take: impl FnMut(usize, &AckRef) -> bool) -> AckSet {
        let mut taken = AckSet::new();
        let mut kept = Vec::with_capacity(self.0.len());
        for (i, ack) in std::mem::take(&mut self.0).into_iter().enumerate() {
            if take(i, &ack) {
                taken.0.push(ack);
            } else {
                kept.push(ack);
            }
        }
        self.0 = kept;
        taken
    }

    /// Begin a write of the batches this set holds: register it with
    /// their channel's [`WriteFence`](crate::WriteFence) until the guard
    /// drops, unless a batch's epoch is closed (its partition is being
    /// revoked): then nothing is registered and `None` says the write
    /// must not start. Handles made for tests have no fence and never
    /// refuse. Call it before each attempt of a write, retries included.
    #[must_use]
    pub fn begin_write(&self) -> Option<WriteGuard> {
        let mut guard = WriteGuard::new();
        for ack in &self.0 {
            if let Some(fence) = ack.fence() {
                if !fence.register(ack.batch_id()) {
                    // Dropping the guard releases what was registered.
                    return None;
                }
                guard.push(fence.clone(), ack.batch_id());
            }
        }
        Some(guard)
    }

    /// Resolve the set as delivered: the data it covers is durably
    /// written. Consumes the set; the handles drop with their default
    /// (Delivered) resolution.
    pub fn deliver(mut self) {
        self.0.clear();
    }

    /// Resolve the set as failed now, rather than at drop. Consumes the
    /// set; every batch it covers will replay.
    pub fn fail(self) {
        drop(self);
    }
}

impl Drop for AckSet {
    fn drop(&mut self) {
        for ack in &self.0 {
            ack.fail();
        }
    }
}

impl From<Vec<AckRef>> for AckSet {
    fn from(acks: Vec<AckRef>) -> Self {
        let mut set = AckSet(Vec::with_capacity(acks.len()));
        for ack in acks {
            set.push(ack);
        }
        set
    }
}

impl Extend<AckRef> for AckSet {
    fn extend<I: IntoIterator<Item = AckRef>>(&mut self, iter: I) {
        for ack in iter {
            self.push(ack);
        }
    }
}

impl FromIterator<AckRef> for AckSet {
    fn from_iter<I: IntoIterator<Item = AckRef>>(iter: I) -> Self {
        let mut set = AckSet::new();
        set.extend(iter);
        set
    }
}

#[cfg(all(test, not(etl_loom)))]
mod ack_set_tests {
    use super::*;
    use crate::AckStatus;

    #[test]
    fn dropping_a_set_fails_its_batches() {
        let (ack, rx) = AckRef::test_pair();
        let mut set = AckSet::new();
        set.push(ack.clone());
        drop(ack);
        drop(set);
        assert_eq!(rx.try_recv().unwrap().status, AckStatus::Failed);
    }

    #[test]
    fn delivering_a_set_resolves_delivered() {
        let (ack, rx) = AckRef::test_pair();
        let mut set = AckSet::new();
        set.push(ack.clone());
        drop(ack);
        set.deliver();
        assert_eq!(rx.try_recv().unwrap().status, AckStatus::Delivered);
    }

    #[test]
    fn absorb_moves_handles_without_resolving() {
        let (ack, rx) = AckRef::test_pair();
        let mut a = AckSet::new();
        a.push(ack.clone());
        drop(ack);
        let mut b = AckSet::new();
        b.absorb(a);
        assert!(rx.try_recv().is_err(), "absorb must not resolve");
        assert_eq!(b.len(), 1);
        b.deliver();
        assert_eq!(rx.try_recv().unwrap().status, AckStatus::Delivered);
    }

    #[test]
    fn ten_thousand_records_of_one_batch_hold_one_handle() {
        let (ack, rx) = AckRef::test_pair();
        let mut set = AckSet::new();
        for _ in 0..10_000 {
            set.push(ack.clone());
        }
        drop(ack);
        assert_eq!(set.len(), 1);
        assert!(rx.try_recv().is_err(), "folding clones must not resolve");
        set.deliver();
        assert_eq!(rx.try_recv().unwrap().status, AckStatus::Delivered);
        assert!(rx.try_recv().is_err(), "resolves exactly once");
    }

    #[test]
    fn distinct_batches_keep_distinct_slots_and_absorb_folds_the_seam() {
        let (a, rx_a) = AckRef::test_pair();
        let (b, rx_b) = AckRef::test_pair();
        let mut left: AckSet = vec![a.clone(), a.clone(), b.clone()].into();
        assert_eq!(left.len(), 2);
        let right: AckSet = [b.clone(), a.clone()].into_iter().collect();
        left.absorb(right);
        assert_eq!(left.len(), 3, "b|b folds at the seam, a comes back");
        drop((a, b));
        left.fail();
        assert_eq!(rx_a.try_recv().unwrap().status, AckStatus::Failed);
        assert_eq!(rx_b.try_recv().unwrap().status, AckStatus::Failed);
    }

    #[test]
    fn split_off_resolves_each_half_by_its_own_outcome() {
        let (a, rx_a) = AckRef::test_pair();
        let (b, rx_b) = AckRef::test_pair();
        let mut set: AckSet = vec![a.clone(), b.clone()].into();
        drop((a, b));
        let tail = set.split_off(1);
        assert!(rx_a.try_recv().is_err() && rx_b.try_recv().is_err());
        assert_eq!((set.len(), tail.len()), (1, 1));
        set.deliver();
        drop(tail);
        assert_eq!(rx_a.try_recv().unwrap().status, AckStatus::Delivered);
        assert_eq!(rx_b.try_recv().unwrap().status, AckStatus::Failed);
    }
}
