//! The sink driver: batching, writes in flight, fail-safe teardown.

use std::sync::Arc;
use std::time::Duration;

use etl_ack::{AckSet, Acked};
use etl_record::{DeadLetter, Record};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::batch::{BatchBuilder, SpareBuffer, SpareRecords};
use crate::handle::SinkHandle;
use crate::metrics::{MetricsCell, add};
use crate::write::{Job, Outcome, Shared, run_job};
use crate::{Encoder, Progress, ProgressSink, Sink, SinkDriverConfig, SinkDriverError};

/// Builds and starts a sink driver: a tokio task that takes
/// `Acked<Vec<Record>>` from a bounded channel, encodes and batches the
/// records (by count, bytes and linger time), keeps up to
/// `concurrency` writes going while it builds the next batch, and
/// resolves each batch's handles by the outcome of its write.
///
/// Teardown fails safe: whatever the driver holds when it stops without an
/// outcome (aborted, panicked, past a shutdown deadline) fails, queued
/// input included.
#[derive(Debug)]
pub struct SinkDriver {
    sink: Arc<dyn Sink>,
    encoder: Box<dyn Encoder>,
    dead_letters: Option<Arc<dyn Sink>>,
    config: SinkDriverConfig,
    resume: Option<Progress>,
    /// The sink's own progress, for an exactly-once driver: records it
    /// covers are skipped. Read for every input, so progress the sink
    /// reloaded (a partition another process advanced) counts at once.
    progress: Option<Arc<dyn ProgressSink>>,
    on_halt: Option<OnHalt>,
}

/// What a driver calls when it halts, before anything it holds fails:
/// every callback given, in order.
struct OnHalt(Vec<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for OnHalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnHalt")
    }
}

// Compile-time check: a driver moves into the task `spawn` starts.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<SinkDriver>();
};

impl SinkDriver {
    /// A driver writing to `sink`, encoding with `encoder`, with the
    /// default configuration and no dead-letter sink.
    pub fn new(sink: impl Sink + 'static, encoder: impl Encoder + 'static) -> Self {
        SinkDriver {
            sink: Arc::new(sink),
            encoder: Box::new(encoder),
            dead_letters: None,
            config: SinkDriverConfig::default(),
            resume: None,
            progress: None,
            on_halt: None,
        }
    }

    /// An exactly-once driver for a sink that stores its progress with its
    /// data. Returns the stored progress too: the pipeline MUST start each
    /// listed partition's source there. The driver skips (and delivers)
    /// records the progress already covers, writes one batch at a time,
    /// and halts after a batch fails for good (writing later batches would
    /// store progress past records that were never written).
    pub fn exactly_once<S: ProgressSink + 'static>(
        sink: S,
        encoder: impl Encoder + 'static,
    ) -> (Self, Progress) {
        let progress = sink.progress();
        let sink = Arc::new(sink);
        let mut driver = SinkDriver::new_shared(sink.clone(), encoder);
        driver.resume = Some(progress.clone());
        driver.progress = Some(sink);
        (driver, progress)
    }

    fn new_shared(sink: Arc<dyn Sink>, encoder: impl Encoder + 'static) -> Self {
        SinkDriver {
            sink,
            encoder: Box::new(encoder),
            dead_letters: None,
            config: SinkDriverConfig::default(),
            resume: None,
            progress: None,
            on_halt: None,
        }
    }

    /// The sink of an exactly-once driver, as the keeper of its progress:
    /// the pipeline reloads the progress through it on every assignment
    /// and starts the assigned partitions there. `None` for other drivers.
    #[must_use]
    pub fn progress_sink(&self) -> Option<Arc<dyn ProgressSink>> {
        self.progress.clone()
    }

    /// Use `config` (an exactly-once driver still writes one batch at a
    /// time).
    #[must_use]
    pub fn config(mut self, config: SinkDriverConfig) -> Self {
        self.config = config;
        self
    }

    /// Cut batches at `max` encoded bytes (at least 1) when the
    /// configuration allows larger ones. A pipeline caps its sinks'
    /// batches at a share of its in-flight byte bound: a batch holding
    /// most of what may be in flight stalls the source while it fills,
    /// then while it is written and synced.
    #[must_use]
    pub fn batch_max_bytes_at_most(mut self, max: usize) -> Self {
        self.config.batch_max_bytes = self.config.batch_max_bytes.min(max.max(1));
        self
    }

    /// Send refused records (encoder or sink rejects) and, by policy,
    /// batches that failed for good to `sink`, as NDJSON dead letters.
    #[must_use]
    pub fn dead_letters(mut self, sink: impl Sink + 'static) -> Self {
        self.dead_letters = Some(Arc::new(sink));
        self
    }

    /// Call `on_halt` once if the driver halts (its sink cannot write,
    /// whatever the records; an exactly-once driver after a failed
    /// batch), before anything the driver still holds fails: the
    /// batches of the halting write, the writes in flight, the batch
    /// being built and the queued input. A pipeline records there that
    /// the run halts, so that the failures that follow are not taken for
    /// ones to replay. Not called when the driver closes, is aborted or
    /// panics.
    ///
    /// Each call adds one: every `on_halt` given is called, in the order
    /// given, so a pipeline's own does not replace one set before it; one
    /// that panics (the panic is logged) does not keep the next from
    /// being called.
    #[must_use]
    pub fn on_halt(mut self, on_halt: impl FnOnce() + Send + 'static) -> Self {
        self.on_halt
            .get_or_insert_with(|| OnHalt(Vec::new()))
            .0
            .push(Box::new(on_halt));
        self
    }

    /// Start the driver on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    #[must_use]
    pub fn spawn(self) -> SinkHandle {
        let mut config = self.config;
        let invalid = config.validate().err();
        let exactly_once = self.resume.is_some();
        if exactly_once {
            config.concurrency = 1;
        }
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let (close_tx, close_rx) = oneshot::channel();
        let (ended_tx, ended_rx) = watch::channel(false);
        let (waiting_tx, waiting_rx) = watch::channel(false);
        let metrics = Arc::new(MetricsCell::default());
        let sink = self.sink.clone();
        let driver = Driver {
            shared: Arc::new(Shared {
                sink: self.sink,
                dead_letters: self.dead_letters,
                config,
                metrics: metrics.clone(),
                exactly_once,
                spare: SpareBuffer::default(),
                spare_records: SpareRecords::default(),
            }),
            encoder: self.encoder,
            input: Input(rx),
            close: close_rx,
            input_ended: ended_rx,
            source_waiting: waiting_rx,
            resume: self.resume,
            progress: self.progress,
            on_halt: self.on_halt,
            halt_on_failure: exactly_once,
            builder: BatchBuilder::default(),
            acks: AckSet::new(),
            ends: Vec::new(),
            refused: Vec::new(),
            refused_bytes: 0,
            first_at: None,
        };
        let task = match invalid {
            // Dropping the driver drops its input: whatever is sent fails.
            Some(err) => tokio::spawn(async move {
                drop(driver);
                tracing::error!(error = %err, "sink driver not started");
                Err(err)
            }),
            None => tokio::spawn(driver.run()),
        };
        SinkHandle::new(tx, close_tx, ended_tx, waiting_tx, task, metrics, sink)
    }
}

/// The input channel's receiving end. Dropping it (the driver stopped for
/// any reason) drops every item still queued, and a dropped [`Acked`]
/// fails its batch.
struct Input(mpsc::Receiver<Acked<Vec<Record>>>);

struct Driver {
    shared: Arc<Shared>,
    encoder: Box<dyn Encoder>,
    input: Input,
    close: oneshot::Receiver<()>,
    /// Turns `true` once the upstream read all its input: lingering for
    /// more records is then pointless.
    input_ended: watch::Receiver<bool>,
    /// `true` while the source waits for credit (see
    /// [`SinkHandle::source_waiting`](crate::SinkHandle::source_waiting)).
    source_waiting: watch::Receiver<bool>,
    resume: Option<Progress>,
    progress: Option<Arc<dyn ProgressSink>>,
    on_halt: Option<OnHalt>,
    halt_on_failure: bool,
    builder: BatchBuilder,
    /// Handles of the batch being built: failed if the driver stops.
    acks: AckSet,
    /// Where each handle's records end in the batch being built, and its
    /// encoder refusals in `refused`.
    ends: Vec<(usize, usize)>,
    refused: Vec<DeadLetter>,
    /// The bytes of the values in `refused`.
    refused_bytes: usize,
    first_at: Option<Instant>,
}

impl Driver {
    fn has_pending(&self) -> bool {
        !self.acks.is_empty()
    }

    /// The driver halts: tell whoever asked, before anything it holds
    /// fails (they fail as it returns).
    fn halting(&mut self) {
        let Some(OnHalt(callbacks)) = self.on_halt.take() else {
            return;
        };
        for callback in callbacks {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)).is_err() {
                tracing::error!("an on_halt callback panicked; the next ones are still called");
            }
        }
    }

    /// Whether the batch being built is due for writing. An empty batch
    /// is never full, so input is always taken when nothing is held.
    fn is_full(&self) -> bool {
        let c = &self.shared.config;
        // Records the encoder refused count as the batch's too: they are
        // held until it is written, so they fill the driver as much.
        self.has_pending()
            && (self.builder.len() + self.refused.len() >= c.batch_max_records
                || self.builder.byte_len() + self.refused_bytes >= c.batch_max_bytes)
    }

    fn accept(&mut self, item: Acked<Vec<Record>>) {
        let (records, ack) = item.into_parts();
        // The progress now, not at start: the sink may have reloaded it
        // (a reassigned partition another process advanced), and the
        // source resumed that partition below it only if it had to.
        if let (Some(resume), Some(sink)) = (self.resume.as_mut(), &self.progress) {
            for (partition, next) in sink.progress().iter() {
                resume.advance(partition, next);
            }
        }
        self.builder
            .adopt(&self.shared.spare, &self.shared.spare_records);
        let offered = records.len();
        let mut skipped = 0;
        let resume = &self.resume;
        let refused = self.builder.extend(records, &*self.encoder, |record| {
            let skip = resume.as_ref().is_some_and(|p| p.covers(record));
            skipped += usize::from(skip);
            skip
        });
        if skipped > 0 {
            add(&self.shared.metrics.skipped, skipped as u64);
        }
        for (record, err) in refused {
            self.refused_bytes += record.value.len();
            self.refused.push(DeadLetter::new(record, err.to_string()));
        }
        if skipped < offered {
            let slots = self.acks.len();
            self.acks.push(ack);
            if self.acks.len() > slots {
                self.ends.push((self.builder.len(), self.refused.len()));
            } else if let Some(end) = self.ends.last_mut() {
                *end = (self.builder.len(), self.refused.len());
            }
            self.first_at.get_or_insert_with(Instant::now);
        }
        // Otherwise every record is already stored (or there were none):
        // releasing the handle delivers it.
    }

    fn dispatch(&mut self) -> BoxFuture<'static, Outcome> {
        let job = Job {
            batch: self.builder.finish(),
            acks: std::mem::take(&mut self.acks),
            ends: std::mem::take(&mut self.ends),
            refused: std::mem::take(&mut self.refused),
        };
        self.refused_bytes = 0;
        self.first_at = None;
        Box::pin(run_job(self.shared.clone(), job))
    }

    async fn run(mut self) -> Result<(), SinkDriverError> {
        let max = self.shared.config.concurrency;
        let mut linger = self.shared.config.linger;
        // Whether the end of the upstream's input may still be announced.
        let mut awaiting_end = true;
        // Whether the source may still say it waits for credit, and
        // whether it waits: every batch then goes as soon as the input is
        // idle.
        let mut waiting_open = true;
        let mut source_waits = false;
        let mut in_flight: FuturesUnordered<BoxFuture<'static, Outcome>> = FuturesUnordered::new();
        let mut input_open = true;
        let mut closing = false;
        loop {
            if self.has_pending() && in_flight.len() < max && (self.is_full() || !input_open) {
                let job = self.dispatch();
                in_flight.push(job);
                continue;
            }
            if !input_open && !self.has_pending() && in_flight.is_empty() {
                break;
            }
            // Input is taken while writes are in flight too: the next
            // batch is checked and encoded while they go, and it goes
            // once one returns. Not by an exactly-once driver: what it
            // skips is what its sink's progress covers, which its write
            // moves only as it returns (a replay of the records it
            // writes would be taken again).
            let accepting = input_open
                && !self.is_full()
                && (!self.shared.exactly_once || in_flight.is_empty());
            let wait = if source_waits { Duration::ZERO } else { linger };
            let linger_at = self.first_at.map(|t| t + wait);
            tokio::select! {
                biased;
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => match outcome {
                    Outcome::Delivered => {}
                    Outcome::Failed(reason, held) => {
                        if self.halt_on_failure {
                            // As for a halt below: first the word, then
                            // the failures (the failed batch's too).
                            tracing::error!(%reason, "a batch of the exactly-once sink failed; stopping");
                            self.halting();
                            self.input.0.close();
                            drop(held);
                            return Err(SinkDriverError::Halted(reason));
                        }
                        drop(held);
                    }
                    // Whoever asked hears of the halt first, then the
                    // input closes, then what this driver holds fails
                    // (the job's handles, the writes in flight, the batch
                    // being built, the queued input): upstream, a failure
                    // always finds this sink gone, so it is never taken
                    // for a record's fault and dead-lettered, nor for one
                    // to replay.
                    Outcome::Halt(err, held) => {
                        tracing::error!(error = %err, "the sink fails whatever the records; stopping");
                        self.halting();
                        self.input.0.close();
                        drop(held);
                        return Err(err);
                    }
                },
                // A close request, or the handle dropped: stop taking input,
                // drain what is queued.
                _ = &mut self.close, if !closing => {
                    closing = true;
                    self.input.0.close();
                }
                item = self.input.0.recv(), if accepting => match item {
                    Some(item) => self.accept(item),
                    None => input_open = false,
                },
                // The upstream's input ended: write a partial batch as soon
                // as the input is idle (the branches above come first).
                changed = self.input_ended.changed(), if awaiting_end => match changed {
                    // The handle is gone: no announcement can come.
                    Err(_) => awaiting_end = false,
                    Ok(()) => {
                        if *self.input_ended.borrow_and_update() {
                            awaiting_end = false;
                            linger = Duration::ZERO;
                        }
                    }
                },
                // The source waits for credit, which what this driver holds
                // may be keeping: write as soon as the input is idle, for
                // as long as it waits.
                changed = self.source_waiting.changed(), if waiting_open => match changed {
                    Err(_) => waiting_open = false,
                    Ok(()) => source_waits = *self.source_waiting.borrow_and_update(),
                },
                () = sleep_until(linger_at), if linger_at.is_some() && in_flight.len() < max => {
                    let job = self.dispatch();
                    in_flight.push(job);
                }
            }
        }
        self.shared
            .config
            .retry
            .run(
                || self.shared.sink.flush(),
                |_| add(&self.shared.metrics.retries, 1),
            )
            .await
            .map_err(SinkDriverError::from)
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
