//! The handle of a running sink driver.

use std::sync::Arc;
use std::time::Duration;

use etl_ack::Acked;
use etl_record::Record;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::MetricsCell;
use crate::{SendError, Sink, SinkDriverError, SinkMetrics};

/// Sends records to a sink driver. Cloneable; a clone per producer.
#[derive(Clone, Debug)]
pub struct SinkSender {
    tx: mpsc::Sender<Acked<Vec<Record>>>,
}

impl SinkSender {
    /// Whether the driver stopped taking input (it halted, or it is
    /// closing).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Queue records with their handle, waiting while the driver's input
    /// channel is full (this is the backpressure that bounds memory).
    ///
    /// Cancelling the returned future before it completes fails the
    /// records' handle: records that never reached the driver were not
    /// written.
    ///
    /// # Errors
    ///
    /// The driver is gone: the records are handed back, with the handle
    /// already failed so that dropping them cannot count as a delivery.
    pub async fn send(
        &self,
        item: Acked<Vec<Record>>,
    ) -> Result<(), SendError<Acked<Vec<Record>>>> {
        // Cancelled while waiting: `item` is dropped, which fails it.
        match self.tx.reserve().await {
            Ok(permit) => {
                permit.send(item);
                Ok(())
            }
            Err(_) => {
                item.ack().fail();
                Err(SendError(item))
            }
        }
    }
}

/// Controls a running sink driver (see [`SinkDriver`](crate::SinkDriver)).
///
/// Dropping the handle asks the driver to close as [`close`](Self::close)
/// does, without waiting for it.
pub struct SinkHandle {
    sender: SinkSender,
    close: Option<oneshot::Sender<()>>,
    input_ended: watch::Sender<bool>,
    source_waiting: watch::Sender<bool>,
    task: JoinHandle<Result<(), SinkDriverError>>,
    metrics: Arc<MetricsCell>,
    /// The driver's sink, to [`settle`](Sink::settle) once the driver
    /// stopped.
    sink: Arc<dyn Sink>,
}

/// `Debug` by hand: the sink's own is left out (a connector's may show
/// more of its configuration than a handle needs to).
impl std::fmt::Debug for SinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkHandle")
            .field("sender", &self.sender)
            .field("closing", &self.close.is_none())
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl SinkHandle {
    pub(crate) fn new(
        tx: mpsc::Sender<Acked<Vec<Record>>>,
        close: oneshot::Sender<()>,
        input_ended: watch::Sender<bool>,
        source_waiting: watch::Sender<bool>,
        task: JoinHandle<Result<(), SinkDriverError>>,
        metrics: Arc<MetricsCell>,
        sink: Arc<dyn Sink>,
    ) -> Self {
        SinkHandle {
            sender: SinkSender { tx },
            close: Some(close),
            input_ended,
            source_waiting,
            task,
            metrics,
            sink,
        }
    }

    /// Queue records with their handle (see [`SinkSender::send`]).
    ///
    /// # Errors
    ///
    /// As [`SinkSender::send`].
    pub async fn send(
        &self,
        item: Acked<Vec<Record>>,
    ) -> Result<(), SendError<Acked<Vec<Record>>>> {
        self.sender.send(item).await
    }

    /// Another sender into this driver.
    #[must_use]
    pub fn sender(&self) -> SinkSender {
        self.sender.clone()
    }

    /// Tell the driver that the upstream has read all its input: from now
    /// on it writes a partial batch as soon as its input is idle instead
    /// of waiting out [`linger`](crate::SinkDriverConfig::linger), so the last
    /// records of a bounded run (and any replay after them) are written at
    /// once. Unlike [`close`](Self::close) it keeps taking input.
    pub fn input_ended(&self) {
        self.input_ended.send_replace(true);
    }

    /// Tell the driver whether the source waits for in-flight credit.
    /// While it does, everything it may have in flight is held
    /// downstream, some of it perhaps in the batch this driver is
    /// building: the driver writes each batch as soon as its input is
    /// idle, full or not, instead of waiting out
    /// [`linger`](crate::SinkDriverConfig::linger) for records that cannot
    /// come until credit is given back. Once told `false`, batches linger
    /// again. A pipeline relays its checkpointer's
    /// `InFlightBudget::waiting` here.
    pub fn source_waiting(&self, waiting: bool) {
        self.source_waiting
            .send_if_modified(|w| std::mem::replace(w, waiting) != waiting);
    }

    /// What the driver has done so far.
    #[must_use]
    pub fn metrics(&self) -> SinkMetrics {
        self.metrics.snapshot()
    }

    fn request_close(&mut self) {
        if let Some(close) = self.close.take() {
            // The driver may already be gone; then there is nothing to close.
            let _ = close.send(());
        }
    }

    /// Stop taking input, write everything queued and batched, flush the
    /// sink, wait for the driver to finish, then for the sink to
    /// [`settle`](Sink::settle) (its [`settle_time`](Sink::settle_time)
    /// at most).
    ///
    /// # Errors
    ///
    /// The driver halted ([`SinkDriverError::Halted`]), panicked
    /// ([`SinkDriverError::Panicked`]) or could not flush; whatever it held then
    /// was failed.
    pub async fn close(mut self) -> Result<SinkMetrics, SinkDriverError> {
        self.request_close();
        let joined = (&mut self.task).await;
        self.settle(later(Instant::now(), self.sink.settle_time()))
            .await;
        self.finish(joined)
    }

    /// As [`close`](Self::close), but abort the driver if it has not
    /// finished in time: every batch it still holds fails (and will
    /// replay).
    ///
    /// The sink's [`settle_time`](Sink::settle_time) comes out of
    /// `deadline` (half of it at most): the driver is aborted that long
    /// before `deadline`, and the sink settles until `deadline`. So the
    /// whole stop takes `deadline` at most, or the settle time when
    /// `deadline` is shorter: what a caller does after the stop (a final
    /// commit) keeps the time it kept for itself.
    ///
    /// # Errors
    ///
    /// [`SinkDriverError::ShutdownTimeout`] when the driver was aborted,
    /// otherwise as [`close`](Self::close).
    pub async fn shutdown(mut self, deadline: Duration) -> Result<SinkMetrics, SinkDriverError> {
        let started = Instant::now();
        let settle_time = self.sink.settle_time();
        let kept = settle_time.min(deadline / 2);
        self.request_close();
        let ended = match tokio::time::timeout(deadline - kept, &mut self.task).await {
            Ok(joined) => self.finish(joined),
            Err(_) => {
                self.task.abort();
                // Wait until the task is gone, so its sets have failed.
                let _ = (&mut self.task).await;
                Err(SinkDriverError::ShutdownTimeout(deadline))
            }
        };
        self.settle(later(started, deadline.max(settle_time))).await;
        ended
    }

    /// Abort the driver now and wait until it is gone: every batch it held
    /// (queued, batched or being written) has failed when this returns.
    /// Then wait for the sink to [`settle`](Sink::settle), its
    /// [`settle_time`](Sink::settle_time) at most.
    pub async fn abort(mut self) -> SinkMetrics {
        self.task.abort();
        let _ = (&mut self.task).await;
        self.settle(later(Instant::now(), self.sink.settle_time()))
            .await;
        self.metrics.snapshot()
    }

    /// Abort the driver now, without waiting: the write under way is
    /// dropped and every batch the driver holds fails. A later
    /// [`close`](Self::close), [`shutdown`](Self::shutdown) or
    /// [`abort`](Self::abort) waits for it to be gone (and then for the
    /// sink to settle); `close` and `shutdown` report
    /// [`SinkDriverError::Closed`]. For a run that must not let a write
    /// land any later than now (a revocation that halted it).
    pub fn tear_down(&self) {
        self.task.abort();
    }

    /// Wait for the sink's background work, until `until` at most.
    async fn settle(&self, until: Instant) {
        if tokio::time::timeout_at(until, self.sink.settle())
            .await
            .is_err()
        {
            tracing::warn!(
                settle_time = ?self.sink.settle_time(),
                "a sink's background work did not end within its settle time"
            );
        }
    }

    fn finish(
        &self,
        joined: Result<Result<(), SinkDriverError>, tokio::task::JoinError>,
    ) -> Result<SinkMetrics, SinkDriverError> {
        match joined {
            Ok(Ok(())) => Ok(self.metrics.snapshot()),
            Ok(Err(err)) => Err(err),
            Err(err) if err.is_panic() => {
                let payload = err.into_panic();
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "non-text panic payload".to_owned());
                Err(SinkDriverError::Panicked(msg))
            }
            Err(_) => Err(SinkDriverError::Closed),
        }
    }
}

/// `start + wait`, or a year from `start` when that is past what an
/// instant holds (a stop given `Duration::MAX`).
fn later(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .unwrap_or_else(|| start + Duration::from_secs(365 * 24 * 60 * 60))
}
