//! A sink layer that bounds how many writes reach the inner sink at once.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::{EncodedBatch, Sink, SinkError};

/// Lets at most `max` writes (and flushes) run in the inner sink at once;
/// the others wait their turn.
#[derive(Debug)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S> ConcurrencyLimit<S> {
    /// Wrap `inner`; `max` is at least 1.
    pub fn new(inner: S, max: usize) -> Self {
        ConcurrencyLimit {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwrap the inner sink.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

#[async_trait]
impl<S: Sink> Sink for ConcurrencyLimit<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        // The semaphore is never closed, so acquiring only waits.
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SinkError::Closed)?;
        self.inner.write(batch).await
    }

    async fn flush(&self) -> Result<(), SinkError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SinkError::Closed)?;
        self.inner.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Recording, Slow};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn never_more_than_max_writes_inside() {
        let recording = Recording::new(Slow::new(
            crate::BlackholeSink::new(),
            Duration::from_millis(10),
        ));
        let journal = recording.journal();
        let sink = Arc::new(ConcurrencyLimit::new(recording, 2));
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let sink = sink.clone();
            tasks.push(tokio::spawn(async move {
                sink.write(&EncodedBatch::default()).await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(journal.max_concurrent_writes(), 2);
        assert_eq!(journal.writes_started(), 6);
    }
}
