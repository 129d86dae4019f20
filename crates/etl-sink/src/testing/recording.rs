//! A wrapper that journals every call made to a sink.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId};

use crate::{EncodedBatch, Sink, SinkError};

/// One entry of a [`Journal`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A write began, with the positions of its records.
    WriteStarted(Vec<(PartitionId, Offset)>),
    /// A write returned (`ok`: it returned `Ok`, i.e. the data is durable).
    WriteDone {
        /// Positions of the written records.
        positions: Vec<(PartitionId, Offset)>,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A flush returned.
    FlushDone {
        /// Whether it succeeded.
        ok: bool,
    },
    /// Something a test noted (for instance: "batch 3 delivered").
    Note(String),
}

#[derive(Debug, Default)]
struct JournalInner {
    events: Mutex<Vec<Event>>,
    active: AtomicUsize,
    max_active: AtomicUsize,
}

/// The shared, ordered log of a [`Recording`] sink. A test may add its own
/// [`Event::Note`]s (for instance from an acknowledgement observer) to
/// check the order of sink calls against deliveries.
#[derive(Clone, Debug, Default)]
pub struct Journal(Arc<JournalInner>);

impl Journal {
    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.0.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, event: Event) {
        self.lock().push(event);
    }

    /// Add a note.
    pub fn note(&self, text: impl Into<String>) {
        self.push(Event::Note(text.into()));
    }

    /// Every event so far, in order.
    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// Writes started so far.
    #[must_use]
    pub fn writes_started(&self) -> usize {
        self.lock()
            .iter()
            .filter(|e| matches!(e, Event::WriteStarted(_)))
            .count()
    }

    /// The most writes that were inside the sink at once.
    #[must_use]
    pub fn max_concurrent_writes(&self) -> usize {
        self.0.max_active.load(Ordering::SeqCst)
    }
}

/// Journals every call to the inner sink.
#[derive(Debug)]
pub struct Recording<S> {
    inner: S,
    journal: Journal,
}

impl<S> Recording<S> {
    /// Wrap `inner` with a fresh journal.
    pub fn new(inner: S) -> Self {
        Recording {
            inner,
            journal: Journal::default(),
        }
    }

    /// The journal (shared).
    pub fn journal(&self) -> Journal {
        self.journal.clone()
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

struct Active<'a>(&'a AtomicUsize);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn positions(batch: &EncodedBatch) -> Vec<(PartitionId, Offset)> {
    batch
        .records()
        .iter()
        .map(|r| (r.position.partition, r.position.offset))
        .collect()
}

#[async_trait]
impl<S: Sink> Sink for Recording<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let j = &self.journal.0;
        let now = j.active.fetch_add(1, Ordering::SeqCst) + 1;
        j.max_active.fetch_max(now, Ordering::SeqCst);
        // Counts the write out even if its future is dropped mid-way.
        let _active = Active(&j.active);
        self.journal.push(Event::WriteStarted(positions(batch)));
        let result = self.inner.write(batch).await;
        self.journal.push(Event::WriteDone {
            positions: positions(batch),
            ok: result.is_ok(),
        });
        result
    }

    fn settle_time(&self) -> std::time::Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        let result = self.inner.flush().await;
        self.journal.push(Event::FlushDone { ok: result.is_ok() });
        result
    }
}
