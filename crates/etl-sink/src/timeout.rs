//! A sink layer that bounds how long one write may take.

use std::time::Duration;

use async_trait::async_trait;

use crate::{EncodedBatch, Sink, SinkError};

/// Fails a write or flush of the inner sink that takes longer than the
/// limit with [`SinkError::Timeout`] (retryable). The inner future is
/// dropped, so the inner sink MUST tolerate cancellation (see the
/// implementor contract).
#[derive(Debug)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S> Timeout<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Timeout { inner, limit }
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
impl<S: Sink> Sink for Timeout<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        tokio::time::timeout(self.limit, self.inner.write(batch))
            .await
            .unwrap_or(Err(SinkError::Timeout(self.limit)))
    }

    async fn flush(&self) -> Result<(), SinkError> {
        tokio::time::timeout(self.limit, self.inner.flush())
            .await
            .unwrap_or(Err(SinkError::Timeout(self.limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Hang, MemorySink};

    #[tokio::test(start_paused = true)]
    async fn a_hanging_write_times_out_retryably() {
        let sink = Timeout::new(Hang::new(), Duration::from_secs(1));
        let err = sink.write(&EncodedBatch::default()).await.unwrap_err();
        assert!(matches!(err, SinkError::Timeout(_)) && err.is_retryable());
        let ok = Timeout::new(MemorySink::new(), Duration::from_secs(1));
        ok.write(&EncodedBatch::default()).await.unwrap();
        assert_eq!(ok.into_inner().writes(), 1);
    }
}
