//! Fault-injecting sink wrappers.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etl_record::Record;
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

use crate::{EncodedBatch, Progress, ProgressSink, Reject, Sink, SinkError};

/// The error a [`FailEveryNth`] injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Injected {
    Transient,
    Permanent,
    Data,
}

/// Fails every `n`th call to `write` (calls `n`, `2n`, ...), transiently,
/// permanently or as a failure of the data; the other calls go to the
/// inner sink.
#[derive(Debug)]
pub struct FailEveryNth<S> {
    inner: S,
    n: u64,
    kind: Injected,
    calls: AtomicU64,
}

impl<S> FailEveryNth<S> {
    /// Fail every `n`th write with a retryable error (`n` at least 1).
    pub fn transient(inner: S, n: u64) -> Self {
        FailEveryNth {
            inner,
            n: n.max(1),
            kind: Injected::Transient,
            calls: AtomicU64::new(0),
        }
    }

    /// Fail every `n`th write with a permanent error (`n` at least 1): an
    /// error of the environment, which halts a driver.
    pub fn permanent(inner: S, n: u64) -> Self {
        FailEveryNth {
            kind: Injected::Permanent,
            ..FailEveryNth::transient(inner, n)
        }
    }

    /// Fail every `n`th write with [`SinkError::Data`] (`n` at least 1):
    /// the failed batches replay, as if they held a bad record.
    pub fn data(inner: S, n: u64) -> Self {
        FailEveryNth {
            kind: Injected::Data,
            ..FailEveryNth::transient(inner, n)
        }
    }

    /// Calls to `write` so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
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
impl<S: Sink> Sink for FailEveryNth<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if call.is_multiple_of(self.n) {
            let msg = format!("injected failure of write call {call}");
            return Err(match self.kind {
                Injected::Transient => SinkError::retryable(msg),
                Injected::Permanent => SinkError::permanent(msg),
                Injected::Data => SinkError::data(msg),
            });
        }
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

impl<S: ProgressSink> ProgressSink for FailEveryNth<S> {
    fn progress(&self) -> Progress {
        self.inner.progress()
    }
}

/// Fails a seeded random fraction of writes with a retryable error.
#[derive(Debug)]
pub struct Flaky<S> {
    inner: S,
    fraction: f64,
    rng: Mutex<SmallRng>,
    failures: AtomicU64,
}

impl<S> Flaky<S> {
    /// Fail each write with probability `fraction` (clamped to `[0, 1]`),
    /// drawn from a generator seeded with `seed`.
    pub fn new(inner: S, fraction: f64, seed: u64) -> Self {
        Flaky {
            inner,
            fraction: fraction.clamp(0.0, 1.0),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            failures: AtomicU64::new(0),
        }
    }

    /// Writes failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Sink> Sink for Flaky<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let fail = self
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .random_bool(self.fraction);
        if fail {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(SinkError::retryable("injected transient failure"));
        }
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

/// A write that never finishes.
#[derive(Debug, Default)]
pub struct Hang {
    calls: AtomicU64,
}

impl Hang {
    /// The sink.
    #[must_use]
    pub fn new() -> Self {
        Hang::default()
    }

    /// Writes started so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Sink for Hang {
    async fn write(&self, _batch: &EncodedBatch) -> Result<(), SinkError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        std::future::pending().await
    }
}

/// Panics on the `n`th call to `write`; the other calls go to the inner
/// sink.
#[derive(Debug)]
pub struct Panic<S> {
    inner: S,
    n: u64,
    calls: AtomicU64,
}

impl<S> Panic<S> {
    /// Panic on write call `n` (from 1).
    pub fn new(inner: S, n: u64) -> Self {
        Panic {
            inner,
            n,
            calls: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl<S: Sink> Sink for Panic<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        // Yield first, so the panic happens inside a running write.
        tokio::task::yield_now().await;
        assert!(call != self.n, "injected panic in write call {call}");
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

/// Waits `delay` before each write of the inner sink.
#[derive(Debug)]
pub struct Slow<S> {
    inner: S,
    delay: Duration,
}

impl<S> Slow<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, delay: Duration) -> Self {
        Slow { inner, delay }
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Sink> Sink for Slow<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        tokio::time::sleep(self.delay).await;
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

type RejectFn = Box<dyn Fn(&Record) -> Option<String> + Send + Sync>;

/// Refuses the records for which a predicate gives a reason and writes
/// the others to the inner sink, as a database refusing bad rows does.
pub struct Rejecting<S> {
    inner: S,
    reject: RejectFn,
}

impl<S> Rejecting<S> {
    /// Refuse records for which `reject` returns a reason.
    pub fn new(
        inner: S,
        reject: impl Fn(&Record) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Rejecting {
            inner,
            reject: Box::new(reject),
        }
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Rejecting<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejecting")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Sink> Sink for Rejecting<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let rejects: Vec<Reject> = batch
            .records()
            .iter()
            .enumerate()
            .filter_map(|(i, r)| (self.reject)(r).map(|reason| Reject::new(i, reason)))
            .collect();
        if rejects.is_empty() {
            return self.inner.write(batch).await;
        }
        let accepted = batch.select(|i| !rejects.iter().any(|r| r.index == i));
        if !accepted.is_empty() {
            self.inner.write(&accepted).await?;
        }
        Err(SinkError::Rejected(rejects))
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

type MatchFn = Box<dyn Fn(&Record) -> bool + Send + Sync>;

/// Fails, with [`SinkError::Data`], every write that holds a record the
/// predicate picks, and writes nothing of it; other writes go to the inner
/// sink. As a database whose multi-row insert fails for one bad row.
pub struct FailWhere<S> {
    inner: S,
    bad: MatchFn,
    failures: AtomicU64,
}

impl<S> FailWhere<S> {
    /// Fail every write holding a record for which `bad` is true.
    pub fn new(inner: S, bad: impl Fn(&Record) -> bool + Send + Sync + 'static) -> Self {
        FailWhere {
            inner,
            bad: Box::new(bad),
            failures: AtomicU64::new(0),
        }
    }

    /// Writes failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for FailWhere<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailWhere")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Sink> Sink for FailWhere<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        if let Some(bad) = batch.records().iter().find(|r| (self.bad)(r)) {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(SinkError::data(format!(
                "injected failure of a write holding {}",
                bad.idempotency_key()
            )));
        }
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}

type ErrorFn = Box<dyn Fn() -> SinkError + Send + Sync>;

/// Fails every write, whatever it holds, with the error `make` returns: a
/// sink whose environment is broken (a closed pipe, a read-only file, an
/// unreachable server).
pub struct Broken {
    make: ErrorFn,
    calls: AtomicU64,
}

impl Broken {
    /// Fail every write with `make()`.
    pub fn new(make: impl Fn() -> SinkError + Send + Sync + 'static) -> Self {
        Broken {
            make: Box::new(make),
            calls: AtomicU64::new(0),
        }
    }

    /// Fail every write as standard output does once its reader is gone
    /// (`EPIPE`).
    #[must_use]
    pub fn broken_pipe() -> Self {
        Broken::new(|| {
            SinkError::io(
                "write to",
                "standard output",
                std::io::Error::from(std::io::ErrorKind::BrokenPipe),
            )
        })
    }

    /// Writes attempted so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Broken")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Sink for Broken {
    async fn write(&self, _batch: &EncodedBatch) -> Result<(), SinkError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Err((self.make)())
    }
}
