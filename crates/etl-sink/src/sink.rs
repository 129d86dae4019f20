//! The `Sink` trait: where encoded batches are written durably.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{EncodedBatch, SinkError};

/// A destination for records: a file, a table, a topic, user code.
///
/// The driver calls [`write`](Sink::write) with an encoded batch and
/// releases the batch's acknowledgements only when it returns `Ok`. So:
///
/// * `Ok(())` MUST mean every record of the batch is durable: it survives
///   a crash of this process (fsynced, committed, acknowledged by a
///   broker).
/// * On failure, say what kind: [`SinkError::Retryable`] (the same batch
///   may succeed later), [`SinkError::Permanent`] (it never will), or
///   [`SinkError::Rejected`] with the indices of refused records when every
///   other record *is* durably written.
/// * Writes may be retried, so a write that failed MUST NOT leave partial
///   data that a retry would duplicate where the sink can avoid it (roll
///   back, truncate, use idempotency keys).
///
/// Sinks take `&self`: the driver may keep several writes in flight. The
/// trait is object safe; [`BoxSink`] is the boxed form. See
/// `docs/writing-a-sink.md` for the full contract.
#[async_trait]
pub trait Sink: Send + Sync + fmt::Debug {
    /// Write `batch` durably.
    ///
    /// # Errors
    ///
    /// A classified [`SinkError`]; the driver retries retryable ones.
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError>;

    /// Make everything written so far durable (a sink whose `write` is
    /// already durable has nothing to do). Called on shutdown.
    ///
    /// # Errors
    ///
    /// As [`write`](Sink::write).
    async fn flush(&self) -> Result<(), SinkError> {
        Ok(())
    }

    /// How long [`settle`](Sink::settle) may take: the driver keeps this
    /// much of a stop's deadline for it (see
    /// [`SinkHandle::shutdown`](crate::SinkHandle::shutdown)). Zero, the
    /// default, for a sink that runs nothing in the background.
    fn settle_time(&self) -> Duration {
        Duration::ZERO
    }

    /// Wait until the work the sink runs in the background for writes
    /// that are over has ended: the abort of an upload that a dropped
    /// write gave up, say. The driver calls it once it stopped, however it
    /// stopped (closed, halted, aborted at a deadline), and stops waiting
    /// after [`settle_time`](Sink::settle_time), so that this work is done
    /// before the runtime that runs it ends. It acknowledges nothing: a
    /// sink MUST NOT need it for a write to count as durable. The default
    /// returns at once.
    async fn settle(&self) {}
}

/// A boxed, type-erased sink.
pub type BoxSink = Box<dyn Sink>;

// Compile-time check that `Sink` stays object safe.
const _: Option<&dyn Sink> = None;

#[async_trait]
impl<S: Sink + ?Sized> Sink for Box<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        (**self).write(batch).await
    }

    async fn flush(&self) -> Result<(), SinkError> {
        (**self).flush().await
    }

    fn settle_time(&self) -> Duration {
        (**self).settle_time()
    }

    async fn settle(&self) {
        (**self).settle().await;
    }
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for Arc<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        (**self).write(batch).await
    }

    async fn flush(&self) -> Result<(), SinkError> {
        (**self).flush().await
    }

    fn settle_time(&self) -> Duration {
        (**self).settle_time()
    }

    async fn settle(&self) {
        (**self).settle().await;
    }
}
