//! In-flight credits: bound the batches and bytes between the source and
//! the durable write, per partition and in total.
//!
//! The source side reserves a batch's credit before opening it; the
//! checkpointer gives it back when the batch resolves, when its epoch ends
//! (revoke, replay), or at once when the batch was opened under an epoch
//! that had already ended. Every reservation is released exactly once.
//!
//! A reservation that has to wait says so, for as long as it waits
//! ([`InFlightBudget::waiting`]): what holds credit only while it waits
//! for more (a sink's partial batch lingering) should let it go then, or
//! the source waits for the linger.

use std::collections::HashMap;
use std::fmt;

use etl_record::PartitionId;
use tokio::sync::{Notify, watch};

use crate::sync::{Arc, Mutex, lock};

/// Bounds on in-flight work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightLimits {
    /// Batches in flight per partition.
    pub max_in_flight_batches_per_partition: u32,
    /// Payload bytes in flight per partition.
    pub max_in_flight_bytes_per_partition: u64,
    /// Batches in flight over all partitions.
    pub max_in_flight_batches: u32,
    /// Payload bytes in flight over all partitions.
    pub max_in_flight_bytes: u64,
}

impl Default for InFlightLimits {
    fn default() -> Self {
        InFlightLimits {
            max_in_flight_batches_per_partition: 64,
            max_in_flight_bytes_per_partition: 16 << 20,
            max_in_flight_batches: 64,
            max_in_flight_bytes: 16 << 20,
        }
    }
}

/// Batches and bytes in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Batches.
    pub batches: u32,
    /// Payload bytes.
    pub bytes: u64,
}

impl InFlight {
    fn fits(&self, bytes: u64, max_in_flight_batches: u32, max_in_flight_bytes: u64) -> bool {
        // A batch larger than the byte limit still goes when nothing else
        // is in flight, or it could never go at all.
        self.batches < max_in_flight_batches
            && (self.bytes == 0 || self.bytes + bytes <= max_in_flight_bytes)
    }

    fn take(&mut self, bytes: u64) {
        self.batches += 1;
        self.bytes += bytes;
    }

    fn give(&mut self, batches: u32, bytes: u64) {
        self.batches = self.batches.saturating_sub(batches);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

#[derive(Debug, Default)]
struct State {
    total: InFlight,
    partitions: HashMap<PartitionId, InFlight>,
    /// Reservations waiting for room.
    waiters: usize,
}

struct Inner {
    limits: InFlightLimits,
    state: Mutex<State>,
    notify: Notify,
    /// Whether a reservation waits for room (see
    /// [`InFlightBudget::waiting`]).
    waiting: watch::Sender<bool>,
}

/// One [`InFlightBudget::acquire`] counted as waiting until it is dropped
/// (it returned, or its future was dropped while it waited).
struct Waiting<'a>(&'a Inner);

impl<'a> Waiting<'a> {
    fn start(inner: &'a Inner) -> Self {
        let mut state = lock(&inner.state);
        state.waiters += 1;
        // Told under the lock: a wait ending on another task at the same
        // moment cannot tell `false` after this `true`.
        inner
            .waiting
            .send_if_modified(|w| !std::mem::replace(w, true));
        drop(state);
        Waiting(inner)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.waiters = state.waiters.saturating_sub(1);
        if state.waiters == 0 {
            self.0
                .waiting
                .send_if_modified(|w| std::mem::replace(w, false));
        }
    }
}

/// Credits bounding in-flight batches and bytes, per partition and in
/// total. Cloning shares the budget.
#[derive(Clone)]
pub struct InFlightBudget {
    inner: Arc<Inner>,
}

impl fmt::Debug for InFlightBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBudget")
            .field("limits", &self.inner.limits)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl InFlightBudget {
    /// A budget with these limits.
    #[must_use]
    pub fn new(limits: InFlightLimits) -> Self {
        InFlightBudget {
            inner: Arc::new(Inner {
                limits,
                state: Mutex::new(State::default()),
                notify: Notify::new(),
                waiting: watch::Sender::new(false),
            }),
        }
    }

    /// The limits.
    #[must_use]
    pub fn limits(&self) -> InFlightLimits {
        self.inner.limits
    }

    /// Reserve one more batch of `bytes` if it fits now.
    pub fn try_acquire(&self, partition: PartitionId, bytes: u64) -> bool {
        let l = self.inner.limits;
        let mut state = lock(&self.inner.state);
        let part = state
            .partitions
            .get(&partition)
            .copied()
            .unwrap_or_default();
        if !state
            .total
            .fits(bytes, l.max_in_flight_batches, l.max_in_flight_bytes)
            || !part.fits(
                bytes,
                l.max_in_flight_batches_per_partition,
                l.max_in_flight_bytes_per_partition,
            )
        {
            return false;
        }
        state.total.take(bytes);
        state.partitions.entry(partition).or_default().take(bytes);
        true
    }

    /// Wait until one more batch of `bytes` fits, then reserve it.
    ///
    /// Cancel-safe: a cancelled wait reserves nothing.
    pub async fn acquire(&self, partition: PartitionId, bytes: u64) {
        // Counted as waiting from the first try that finds no room until
        // this call returns or is dropped.
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so a release between the check and
            // the wait still wakes this waiter.
            notified.as_mut().enable();
            if self.try_acquire(partition, bytes) {
                return;
            }
            if waiting.is_none() {
                waiting = Some(Waiting::start(&self.inner));
            }
            notified.await;
        }
    }

    /// `true` while an [`acquire`](Self::acquire) waits for room:
    /// everything the bounds allow is in flight, held somewhere
    /// downstream. What holds credit only while it waits for more (a
    /// sink's batch that is not full, lingering for records that cannot
    /// come until credit is given back) should be let go while this is
    /// `true`, as a Kafka producer sends its batches, full or not, while
    /// a send waits for buffer memory. Otherwise a sink that takes a small
    /// share of the records (a routed one) fills its batch slower than the
    /// source fills the bounds, and every window of credit waits for that
    /// sink's linger.
    #[must_use]
    pub fn waiting(&self) -> watch::Receiver<bool> {
        self.inner.waiting.subscribe()
    }

    /// Give back `batches` reservations totalling `bytes`.
    pub fn release_many(&self, partition: PartitionId, batches: u32, bytes: u64) {
        if batches == 0 && bytes == 0 {
            return;
        }
        {
            let mut state = lock(&self.inner.state);
            state.total.give(batches, bytes);
            if let Some(p) = state.partitions.get_mut(&partition) {
                p.give(batches, bytes);
                if p.batches == 0 && p.bytes == 0 {
                    state.partitions.remove(&partition);
                }
            }
        }
        self.inner.notify.notify_waiters();
    }

    /// Give back one reservation that was never opened as a batch (the
    /// source failed between reserving and opening).
    pub fn release(&self, partition: PartitionId, bytes: u64) {
        self.release_many(partition, 1, bytes);
    }

    /// In flight over all partitions.
    #[must_use]
    pub fn in_flight(&self) -> InFlight {
        lock(&self.inner.state).total
    }

    /// In flight for one partition.
    #[must_use]
    pub fn in_flight_of(&self, partition: PartitionId) -> InFlight {
        lock(&self.inner.state)
            .partitions
            .get(&partition)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    fn budget() -> InFlightBudget {
        InFlightBudget::new(InFlightLimits {
            max_in_flight_batches_per_partition: 2,
            max_in_flight_bytes_per_partition: 100,
            max_in_flight_batches: 3,
            max_in_flight_bytes: 1000,
        })
    }

    #[tokio::test]
    async fn a_reservation_says_it_waits_for_as_long_as_it_waits() {
        let b = budget();
        let mut waiting = b.waiting();
        let p0 = PartitionId(0);
        b.acquire(p0, 60).await;
        assert!(!*waiting.borrow_and_update(), "it fit");
        let second = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(p0, 60).await })
        };
        waiting.wait_for(|w| *w).await.unwrap();
        b.release(p0, 60);
        second.await.unwrap();
        assert!(!*waiting.borrow_and_update(), "it got its room");
        assert_eq!(b.in_flight_of(p0).bytes, 60);
    }

    #[tokio::test]
    async fn a_wait_given_up_is_no_longer_counted() {
        let b = budget();
        let waiting = b.waiting();
        let p0 = PartitionId(0);
        b.acquire(p0, 100).await;
        let given_up = tokio::time::timeout(Duration::from_millis(10), b.acquire(p0, 1)).await;
        assert!(given_up.is_err(), "there was no room");
        assert!(!*waiting.borrow(), "nothing waits any more");
        assert_eq!(b.in_flight_of(p0).bytes, 100, "nothing reserved");
    }

    #[test]
    fn limits_per_partition_and_in_total() {
        let b = budget();
        let (p0, p1) = (PartitionId(0), PartitionId(1));
        assert!(b.try_acquire(p0, 60));
        assert!(!b.try_acquire(p0, 60), "partition bytes");
        assert!(b.try_acquire(p0, 40));
        assert!(!b.try_acquire(p0, 0), "partition batches");
        assert!(b.try_acquire(p1, 10));
        assert!(!b.try_acquire(PartitionId(2), 1), "total batches");
        assert_eq!(
            b.in_flight(),
            InFlight {
                batches: 3,
                bytes: 110
            }
        );
        b.release_many(p0, 2, 100);
        assert_eq!(b.in_flight_of(p0), InFlight::default());
        assert!(b.try_acquire(PartitionId(2), 1));
    }

    #[test]
    fn an_oversized_batch_goes_alone() {
        let b = budget();
        assert!(b.try_acquire(PartitionId(0), 5000));
        assert!(!b.try_acquire(PartitionId(0), 1));
    }

    #[tokio::test]
    async fn acquire_waits_for_a_release_and_cancelling_reserves_nothing() {
        let b = budget();
        let p = PartitionId(0);
        b.acquire(p, 50).await;
        b.acquire(p, 50).await;
        let cancelled = tokio::time::timeout(Duration::from_millis(20), b.acquire(p, 50)).await;
        assert!(cancelled.is_err());
        assert_eq!(b.in_flight_of(p).batches, 2);
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.acquire(p, 50).await }
        });
        tokio::task::yield_now().await;
        b.release(p, 50);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the release")
            .unwrap();
        assert_eq!(
            b.in_flight_of(p),
            InFlight {
                batches: 2,
                bytes: 100
            }
        );
    }
}
