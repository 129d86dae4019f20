//! Building and running a pipeline from Rust.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etl_checkpoint::{
    CheckpointConfig, CheckpointHandle, Checkpointer, MemoryStore, OffsetStore, Offsets,
};
use etl_record::{Offset, PartitionId};
use etl_sink::{DeadLetterHandle, DriverConfig as SinkDriverConfig, Sink, SinkDriver, SinkMetrics};
use etl_source::{DriverConfig as SourceDriverConfig, Source, SourceDriver, SourceOutput};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fanout::{Outputs, Stage, StageStop};
use super::hub::SinkSlot;
use super::ordered::{Workers, run_parallel, run_serial};
use super::{MetricsHub, PipelineError};
use crate::config::FailurePolicy;
use crate::transform::{Transform, TransformChain};

/// Creates the source once the checkpointer runs, for sources that need
/// its handle (a Kafka consumer commits on revoke through it).
pub type SourceFactory =
    Box<dyn FnOnce(&CheckpointHandle) -> Result<Box<dyn Source>, PipelineError> + Send>;

enum SourceSpec {
    Ready(Box<dyn Source>),
    Factory(SourceFactory),
}

struct SinkSpec {
    name: String,
    driver: SinkDriver,
}

/// Assembles a [`Pipeline`].
pub struct PipelineBuilder {
    source: Option<SourceSpec>,
    chain: TransformChain,
    sinks: Vec<SinkSpec>,
    progress: Option<BTreeMap<PartitionId, Offset>>,
    dead_letter: Option<Arc<dyn Sink>>,
    store: Option<Box<dyn OffsetStore>>,
    checkpoint: CheckpointConfig,
    source_driver: SourceDriverConfig,
    on_failure: FailurePolicy,
    channel_capacity: usize,
    shutdown_timeout: Duration,
    transform_workers: usize,
}

impl std::fmt::Debug for PipelineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field(
                "sinks",
                &self.sinks.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("transforms", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl Default for PipelineBuilder {
    fn default() -> Self {
        PipelineBuilder {
            source: None,
            chain: TransformChain::new(),
            sinks: Vec::new(),
            progress: None,
            dead_letter: None,
            store: None,
            checkpoint: CheckpointConfig::default(),
            source_driver: SourceDriverConfig::default(),
            on_failure: FailurePolicy::Replay,
            channel_capacity: 16,
            shutdown_timeout: Duration::from_secs(30),
            transform_workers: default_transform_workers(),
        }
    }
}

impl PipelineBuilder {
    /// The source.
    #[must_use]
    pub fn source(mut self, source: impl Source + 'static) -> Self {
        self.source = Some(SourceSpec::Ready(Box::new(source)));
        self
    }

    /// The source, created by `factory` once the checkpointer is running
    /// (for a source that needs the [`CheckpointHandle`], such as a
    /// consumer-group member that commits on revoke).
    #[must_use]
    pub fn source_factory(
        mut self,
        factory: impl FnOnce(&CheckpointHandle) -> Result<Box<dyn Source>, PipelineError>
        + Send
        + 'static,
    ) -> Self {
        self.source = Some(SourceSpec::Factory(Box::new(factory)));
        self
    }

    /// Append a transform.
    #[must_use]
    pub fn transform(mut self, transform: impl Transform + 'static) -> Self {
        self.chain.push(Box::new(transform));
        self
    }

    /// Use these transforms (replacing any added so far).
    #[must_use]
    pub fn transforms(mut self, chain: TransformChain) -> Self {
        self.chain = chain;
        self
    }

    /// Add a sink, driven by `driver` (its sink, encoder and batching).
    /// Every record goes to every sink.
    #[must_use]
    pub fn sink(mut self, name: impl Into<String>, driver: SinkDriver) -> Self {
        self.sinks.push(SinkSpec {
            name: name.into(),
            driver,
        });
        self
    }

    /// Add the single sink of an exactly-once pipeline, with the progress
    /// it stored (from [`SinkDriver::exactly_once`]): the source resumes
    /// there instead of at the offset store's commits.
    #[must_use]
    pub fn exactly_once_sink(
        mut self,
        name: impl Into<String>,
        driver: SinkDriver,
        progress: etl_sink::Progress,
    ) -> Self {
        self.progress = Some(progress.iter().collect());
        self.sink(name, driver)
    }

    /// Where dead letters go (bad input, poison records, rejected rows).
    /// Without one, a dead letter stops the pipeline.
    #[must_use]
    pub fn dead_letter(mut self, sink: impl Sink + 'static) -> Self {
        self.dead_letter = Some(Arc::new(sink));
        self
    }

    /// Where offsets are committed (default: in memory).
    #[must_use]
    pub fn offset_store(mut self, store: impl OffsetStore) -> Self {
        self.store = Some(Box::new(store));
        self
    }

    /// Commit policy and in-flight limits.
    #[must_use]
    pub fn checkpoint(mut self, config: CheckpointConfig) -> Self {
        self.checkpoint = config;
        self
    }

    /// Replays, poison records and idle behaviour of the source driver.
    #[must_use]
    pub fn source_driver(mut self, config: SourceDriverConfig) -> Self {
        self.source_driver = config;
        self
    }

    /// What happens when a batch fails.
    #[must_use]
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }

    /// How long a graceful stop may take for the sinks to flush.
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How many threads run the transforms (default: the number of
    /// cores, at most 4). With 2 or more, and when every transform can
    /// [`fork`](Transform::fork), whole batches run on that many workers
    /// and their results still reach the sinks in the order the batches
    /// came; otherwise the transforms run on one task.
    #[must_use]
    pub fn transform_workers(mut self, workers: usize) -> Self {
        self.transform_workers = workers;
        self
    }

    /// Check and assemble.
    ///
    /// # Errors
    ///
    /// [`PipelineError::Invalid`] without a source or a sink, or with an
    /// exactly-once sink beside others.
    pub fn build(self) -> Result<Pipeline, PipelineError> {
        let source = self
            .source
            .ok_or_else(|| PipelineError::Invalid("no source".to_owned()))?;
        if self.sinks.is_empty() {
            return Err(PipelineError::Invalid("no sink".to_owned()));
        }
        if self.progress.is_some() && self.sinks.len() > 1 {
            return Err(PipelineError::Invalid(
                "an exactly-once sink must be the only sink: with several, each would hold its own progress"
                    .to_owned(),
            ));
        }
        let mut source_driver = self.source_driver;
        if let Some(progress) = self.progress {
            source_driver.start_offsets.extend(progress);
        }
        Ok(Pipeline {
            source,
            chain: self.chain,
            sinks: self.sinks,
            dead_letter: self.dead_letter,
            store: self.store.unwrap_or_else(|| Box::new(MemoryStore::new())),
            checkpoint: self.checkpoint,
            source_driver,
            on_failure: self.on_failure,
            channel_capacity: self.channel_capacity.max(1),
            shutdown_timeout: self.shutdown_timeout,
            transform_workers: self.transform_workers,
            hub: MetricsHub::default(),
        })
    }
}

/// What a finished run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Records that entered the transforms (replays count again).
    pub read: u64,
    /// Records dropped on purpose by transforms.
    pub filtered: u64,
    /// Records sent to the dead-letter sink (by the source, transforms
    /// and sinks).
    pub dead_lettered: u64,
    /// Per sink: what it wrote.
    pub sinks: Vec<(String, SinkMetrics)>,
    /// Replays requested, over all partitions.
    pub replays: u64,
    /// The final committed offsets.
    pub committed: Offsets,
    /// Whether the run stopped on request (rather than at the end of its
    /// input).
    pub stopped: bool,
}

impl Summary {
    /// Records written, summed over sinks.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.sinks.iter().map(|(_, m)| m.records_written).sum()
    }
}

/// A pipeline ready to run. See [`Pipeline::builder`].
pub struct Pipeline {
    source: SourceSpec,
    chain: TransformChain,
    sinks: Vec<SinkSpec>,
    dead_letter: Option<Arc<dyn Sink>>,
    store: Box<dyn OffsetStore>,
    checkpoint: CheckpointConfig,
    source_driver: SourceDriverConfig,
    on_failure: FailurePolicy,
    channel_capacity: usize,
    shutdown_timeout: Duration,
    transform_workers: usize,
    hub: MetricsHub,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field(
                "sinks",
                &self.sinks.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Start assembling a pipeline.
    #[must_use]
    pub fn builder() -> PipelineBuilder {
        PipelineBuilder::default()
    }

    /// Live metrics; valid before, during and after [`run`](Self::run).
    #[must_use]
    pub fn metrics(&self) -> MetricsHub {
        self.hub.clone()
    }

    /// Run until the source is exhausted and everything is delivered, or
    /// until `shutdown` is cancelled: then polling stops, in-flight records
    /// drain to the sinks, the sinks flush and a final commit is made.
    ///
    /// # Errors
    ///
    /// The first failure of a part; whatever was in flight then is failed,
    /// so nothing past the last commit counts as delivered.
    pub async fn run(self, shutdown: CancellationToken) -> Result<Summary, PipelineError> {
        let Pipeline {
            source,
            chain,
            sinks,
            dead_letter,
            store,
            checkpoint,
            source_driver,
            on_failure,
            channel_capacity,
            shutdown_timeout,
            transform_workers,
            hub,
        } = self;

        let (acker, receiver) = etl_ack::channel();
        let (checkpointer, mut replays) = Checkpointer::spawn(checkpoint, store, receiver)?;
        hub.set_checkpoint(checkpointer.clone());

        // Sinks, sharing one dead-letter sink.
        let dlq = dead_letter.map(|sink| {
            let handle = Arc::new(DeadLetterHandle::spawn(
                sink.clone(),
                SinkDriverConfig::default(),
            ));
            (sink, handle)
        });
        let dlq_slot = dlq.as_ref().map(|(_, handle)| {
            let weak = Arc::downgrade(handle);
            let slot = SinkSlot::new(Box::new(move || weak.upgrade().map(|h| h.metrics())));
            hub.set_dead_letter(slot.clone());
            slot
        });
        let mut handles = Vec::with_capacity(sinks.len());
        for SinkSpec { name, mut driver } in sinks {
            if let Some((sink, _)) = &dlq {
                driver = driver.dead_letters(sink.clone());
            }
            let handle = Arc::new(driver.spawn());
            let weak = Arc::downgrade(&handle);
            let slot = SinkSlot::new(Box::new(move || weak.upgrade().map(|h| h.metrics())));
            hub.add_sink(name.clone(), slot.clone());
            handles.push((name, handle, slot));
        }

        // Replays pass through here so `on_failure = halt` can stop them.
        let (replay_tx, replay_rx) = mpsc::unbounded_channel();
        let (halt_tx, mut halt_rx) = mpsc::unbounded_channel();
        let replay_gate = tokio::spawn(async move {
            while let Some(request) = replays.recv().await {
                let sent = match on_failure {
                    FailurePolicy::Replay => replay_tx.send(request).is_ok(),
                    FailurePolicy::Halt => halt_tx.send(request).is_ok(),
                };
                if !sent {
                    break;
                }
            }
        });

        let source = match source {
            SourceSpec::Ready(source) => source,
            SourceSpec::Factory(factory) => match factory(&checkpointer) {
                Ok(source) => source,
                Err(e) => {
                    let _ = checkpointer.shutdown().await;
                    return Err(e);
                }
            },
        };
        let (out_tx, out_rx) = mpsc::channel::<SourceOutput>(channel_capacity);
        let driver = SourceDriver::new(
            source,
            acker,
            checkpointer.clone(),
            replay_rx,
            out_tx,
            source_driver,
        );
        hub.set_source(driver.metrics());
        let cancel = shutdown.child_token();
        let driver_task = tokio::spawn(driver.run(cancel.clone()));

        let workers = Workers::spawn(&chain, transform_workers);
        let outputs = Outputs {
            sinks: handles.iter().map(|(_, h, _)| h.sender()).collect(),
            dead_letters: dlq.as_ref().map(|(_, h)| h.clone()),
        };
        let stage = Stage::new(chain, outputs, hub.stage());
        let stage_task = match workers {
            Some(workers) => tokio::spawn(run_parallel(stage, workers, out_rx, cancel.clone())),
            None => tokio::spawn(run_serial(stage, out_rx, cancel.clone())),
        };

        // Wait for the driver, or for a halt.
        let mut halted = None;
        let driver_result = {
            tokio::pin!(driver_task);
            tokio::select! {
                r = &mut driver_task => r,
                Some(request) = halt_rx.recv() => {
                    halted = Some(request);
                    cancel.cancel();
                    driver_task.await
                }
            }
        };
        let stage_result = stage_task.await;
        replay_gate.abort();

        // Drain the sinks, then the dead-letter sink, then commit.
        let mut first_error: Option<PipelineError> = None;
        let mut sink_metrics = Vec::new();
        for (name, handle, slot) in handles {
            let metrics = handle.metrics();
            // The stage is done, so this is the last strong reference.
            let Ok(handle) = Arc::try_unwrap(handle) else {
                sink_metrics.push((name, metrics));
                continue;
            };
            match handle.shutdown(shutdown_timeout).await {
                Ok(m) => {
                    slot.finish(m);
                    sink_metrics.push((name, m));
                }
                Err(source) => {
                    sink_metrics.push((name.clone(), metrics));
                    first_error.get_or_insert(PipelineError::Sink { name, source });
                }
            }
        }
        let mut dead_lettered = 0;
        if let Some((_, handle)) = dlq {
            dead_lettered = handle.metrics().records_written;
            if let Ok(handle) = Arc::try_unwrap(handle) {
                match handle.shutdown(shutdown_timeout).await {
                    Ok(m) => {
                        dead_lettered = m.records_written;
                        if let Some(slot) = &dlq_slot {
                            slot.finish(m);
                        }
                    }
                    Err(source) => {
                        first_error.get_or_insert(PipelineError::Sink {
                            name: "dead_letter".to_owned(),
                            source,
                        });
                    }
                }
            }
        }
        dead_lettered += sink_metrics
            .iter()
            .map(|(_, m)| m.dead_lettered)
            .sum::<u64>();
        let final_commit = checkpointer.shutdown().await;

        // Report the root cause first.
        if let Some(request) = halted {
            return Err(PipelineError::Halted {
                partition: request.partition,
                from: request.from,
            });
        }
        let exit = match driver_result {
            Ok(Ok(exit)) => exit,
            Ok(Err(e)) => {
                // A closed downstream is the stage's doing: report its cause.
                return Err(match stage_result {
                    Ok(Err(stop)) => stop_error(stop, first_error),
                    Err(join) => PipelineError::Internal(format!("transform stage: {join}")),
                    Ok(Ok(())) => e.into(),
                });
            }
            Err(join) => return Err(PipelineError::Internal(format!("source driver: {join}"))),
        };
        match stage_result {
            Ok(Ok(())) => {}
            Ok(Err(stop)) => return Err(stop_error(stop, first_error)),
            Err(join) => return Err(PipelineError::Internal(format!("transform stage: {join}"))),
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let final_commit = final_commit?;
        let snapshot = hub.snapshot();
        Ok(Summary {
            read: snapshot.read,
            filtered: snapshot.filtered,
            dead_lettered,
            sinks: sink_metrics,
            replays: snapshot.source.total(|p| p.replays),
            committed: final_commit.committed,
            stopped: exit == etl_source::DriverExit::Shutdown,
        })
    }
}

/// The number of cores, at most 4.
fn default_transform_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

fn stop_error(stop: StageStop, sink_error: Option<PipelineError>) -> PipelineError {
    match stop {
        StageStop::NoDeadLetterSink(letter) => PipelineError::NoDeadLetterSink {
            key: letter.record.idempotency_key(),
            reason: letter.reason,
        },
        StageStop::Halted(letter) => PipelineError::TransformHalted {
            key: letter.record.idempotency_key(),
            reason: letter.reason,
        },
        StageStop::WorkerGone => {
            PipelineError::Internal("a transform worker stopped without an answer".to_owned())
        }
        StageStop::SinkGone => sink_error.unwrap_or_else(|| {
            PipelineError::Internal("a sink driver stopped without an error".to_owned())
        }),
    }
}
