//! Building and running a pipeline from Rust.

use std::sync::Arc;
use std::time::Duration;

use etl_checkpoint::{
    CheckpointConfig, CheckpointHandle, Checkpointer, FailurePolicy, MemoryStore, OffsetStore,
    PartitionOffsets,
};
use etl_sink::{
    DeadLetterHandle, ProgressSink, Sink, SinkDriver, SinkDriverConfig, SinkDriverError,
    SinkMetrics,
};
use etl_source::{Source, SourceDriver, SourceDriverConfig, SourceOutput};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fanout::{Outputs, Stage, StageStop, Steps};
use super::hub::SinkSlot;
use super::ordered::{InputEnd, OnStop, Workers, run_parallel, run_serial};
use super::progress_store::SinkProgressStore;
use super::route::{Route, Router};
use super::{MetricsHub, PipelineError};
use crate::config::RouteMode;
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
    /// The stored progress of the exactly-once sink, if there is one.
    progress: Option<etl_sink::Progress>,
    /// The exactly-once sink, to read its progress on every assignment.
    progress_sink: Option<Arc<dyn ProgressSink>>,
    dead_letter: Option<Arc<dyn Sink>>,
    store: Option<Box<dyn OffsetStore>>,
    checkpoint: CheckpointConfig,
    source_driver: SourceDriverConfig,
    on_failure: FailurePolicy,
    channel_capacity: usize,
    transform_workers: usize,
    /// Each sink's route, by sink name.
    routes: Vec<(String, Route)>,
    route_mode: RouteMode,
    /// The sink of records no condition matched.
    unmatched: Option<String>,
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
            progress_sink: None,
            dead_letter: None,
            store: None,
            checkpoint: CheckpointConfig::default(),
            source_driver: SourceDriverConfig::default(),
            on_failure: FailurePolicy::Replay,
            channel_capacity: 16,
            transform_workers: default_transform_workers(),
            routes: Vec::new(),
            route_mode: RouteMode::All,
            unmatched: None,
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
        self.routes_read_unchecked();
        self
    }

    /// Use these transforms (replacing any added so far).
    #[must_use]
    pub fn transforms(mut self, chain: TransformChain) -> Self {
        self.chain = chain;
        self.routes_read_unchecked();
        self
    }

    /// The routes' conditions no longer take the shared steps' output as
    /// checked JSON: steps added after them may write anything.
    fn routes_read_unchecked(&mut self) {
        for (_, route) in &mut self.routes {
            route.fast = route.fast.take().map(|c| c.checked_input(false));
        }
    }

    /// Add a sink, driven by `driver` (its sink, encoder and batching).
    /// Every record goes to every sink, unless [`route`](Self::route)
    /// says otherwise. Its batches are cut at a sixteenth
    /// of the smaller in-flight byte bound of the
    /// [`checkpoint`](PipelineBuilder::checkpoint) limits when its
    /// configuration allows larger ones (1 MiB at the defaults): a batch
    /// holding much of what may be in flight stalls the source while it
    /// fills, then while it is written and synced.
    #[must_use]
    pub fn sink(mut self, name: impl Into<String>, driver: SinkDriver) -> Self {
        self.sinks.push(SinkSpec {
            name: name.into(),
            driver,
        });
        self
    }

    /// Add the single sink of an exactly-once pipeline, with the progress
    /// it stored (from [`SinkDriver::exactly_once`]).
    ///
    /// The source resumes at the lower of the offset store's commit and
    /// the sink's progress: the commit only ever covers records whose
    /// every destination (dead letters included) is durable, while the
    /// sink's progress moves past records it does not store, so resuming
    /// there alone would skip a dead letter that never became durable.
    /// The driver skips what the sink's progress already holds. The
    /// progress is read again from the sink on every assignment
    /// ([`ProgressSink::reload_progress`]), so a partition another process
    /// advanced meanwhile is skipped up to where that one left it.
    #[must_use]
    pub fn exactly_once_sink(
        mut self,
        name: impl Into<String>,
        driver: SinkDriver,
        progress: etl_sink::Progress,
    ) -> Self {
        self.progress = Some(progress);
        self.progress_sink = driver.progress_sink();
        self.sink(name, driver)
    }

    /// Which records the sink named `sink` takes, and its own transforms
    /// (see [`Route`]). A record a sink does not take counts as filtered
    /// for it: its offset commits once the sinks it went to hold it.
    ///
    /// ```
    /// use etl::{Pipeline, Route, RouteMode, filter};
    /// use etl_record::Record;
    ///
    /// let builder = Pipeline::builder()
    ///     // .source(...).sink("errors", ...).sink("review", ...)
    ///     .route(
    ///         "errors",
    ///         Route::new().when(filter("level", |r: &Record| r.value.starts_with(b"E"))),
    ///     )
    ///     .route_mode(RouteMode::Exclusive)
    ///     .unmatched("review");
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn route(mut self, sink: impl Into<String>, route: Route) -> Self {
        self.routes.push((sink.into(), route));
        self
    }

    /// How the sinks' conditions combine (default [`RouteMode::All`]).
    #[must_use]
    pub fn route_mode(mut self, mode: RouteMode) -> Self {
        self.route_mode = mode;
        self
    }

    /// The sink that takes the records no sink's condition matched.
    /// Without one, they go nowhere and count as `unrouted`
    /// ([`Summary::unrouted`]).
    #[must_use]
    pub fn unmatched(mut self, sink: impl Into<String>) -> Self {
        self.unmatched = Some(sink.into());
        self
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

    /// Commit policy, in-flight limits and how long a graceful stop may
    /// take, all of it ([`CheckpointConfig::shutdown_timeout`]): from the
    /// stop request (or the end of the source) the source driver, the
    /// transform stage and the sinks get nine tenths of it to drain and
    /// flush, and are torn down past that (what they hold fails and is
    /// read again next run); the final commit gets the rest.
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

    /// How many threads run the transforms (default: the number of
    /// cores, at most 4). Whole batches run on threads of their own, never
    /// on the async runtime's workers (a CPU-bound stage there holds up
    /// the tasks it wakes), and their results still reach the sinks in
    /// the order the batches came. With 2 or more, each thread runs a
    /// [`fork`](Transform::fork) of the transforms; when one of them
    /// cannot fork, they run on one thread. 0 counts as 1. On a
    /// current-thread runtime, 1 (or 0) keeps the transforms on the
    /// pipeline's own task.
    #[must_use]
    pub fn transform_workers(mut self, workers: usize) -> Self {
        self.transform_workers = workers;
        self
    }

    /// Check and assemble.
    ///
    /// # Errors
    ///
    /// [`PipelineError::Invalid`] without a source or a sink, with an
    /// exactly-once sink beside others, or with a route or an unmatched
    /// sink naming no sink (or an unmatched sink with a condition).
    pub fn build(self) -> Result<Pipeline, PipelineError> {
        let router = router(&self.sinks, self.routes, self.route_mode, self.unmatched)?;
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
        if let Some(progress) = &self.progress {
            tracing::debug!(
                ?progress,
                "exactly-once sink: resuming at the commits, skipping what the sink holds"
            );
        }
        let source_driver = self.source_driver;
        Ok(Pipeline {
            source,
            chain: self.chain,
            sinks: self.sinks,
            dead_letter: self.dead_letter,
            store: self.store.unwrap_or_else(|| Box::new(MemoryStore::new())),
            progress_sink: self.progress_sink,
            checkpoint: self.checkpoint,
            source_driver,
            on_failure: self.on_failure,
            channel_capacity: self.channel_capacity.max(1),
            shutdown_timeout: self.checkpoint.shutdown_timeout,
            transform_workers: self.transform_workers,
            router,
            hub: MetricsHub::default(),
        })
    }
}

/// The routes of `sinks`, in their order; `None` when every record goes
/// to every sink unchanged.
fn router(
    sinks: &[SinkSpec],
    routes: Vec<(String, Route)>,
    mode: RouteMode,
    unmatched: Option<String>,
) -> Result<Option<Box<Router>>, PipelineError> {
    let index = |name: &str, what: &str| {
        sinks
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| PipelineError::Invalid(format!("{what} {name:?} names no sink")))
    };
    let mut by_sink: Vec<Option<Route>> = sinks.iter().map(|_| None).collect();
    for (name, route) in routes {
        let i = index(&name, "the route of sink")?;
        if by_sink[i].replace(route).is_some() {
            return Err(PipelineError::Invalid(format!(
                "sink {name:?} has two routes"
            )));
        }
    }
    let unmatched = match unmatched {
        Some(name) => {
            let i = index(&name, "the unmatched sink")?;
            if by_sink[i].as_ref().is_some_and(|r| r.when.is_some()) {
                return Err(PipelineError::Invalid(format!(
                    "the unmatched sink {name:?} has a condition: it takes what no condition \
                     matched"
                )));
            }
            Some(i)
        }
        None => None,
    };
    let routes = by_sink.into_iter().map(Option::unwrap_or_default).collect();
    let router = Router::new(mode, routes, unmatched);
    Ok((!router.is_trivial()).then(|| Box::new(router)))
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
    /// Records no route took and no unmatched sink received (see
    /// [`PipelineBuilder::route`]).
    pub unrouted: u64,
    /// The final committed offsets.
    pub committed: PartitionOffsets,
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

// Compile-time check: a pipeline and the future of its run may be spawned
// on a multi-threaded runtime (`tokio::spawn(pipeline.run(token))`).
const _: fn() = || {
    fn assert_send<T: Send>(_: &T) {}
    fn run_is_send(pipeline: Pipeline) {
        assert_send(&pipeline);
        assert_send(&pipeline.run(CancellationToken::new()));
    }
    let _ = run_is_send;
};

/// A pipeline ready to run. See [`Pipeline::builder`].
pub struct Pipeline {
    source: SourceSpec,
    chain: TransformChain,
    sinks: Vec<SinkSpec>,
    dead_letter: Option<Arc<dyn Sink>>,
    store: Box<dyn OffsetStore>,
    progress_sink: Option<Arc<dyn ProgressSink>>,
    checkpoint: CheckpointConfig,
    source_driver: SourceDriverConfig,
    on_failure: FailurePolicy,
    channel_capacity: usize,
    shutdown_timeout: Duration,
    transform_workers: usize,
    router: Option<Box<Router>>,
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
    /// drain to the sinks, the sinks flush and a final commit is made,
    /// all within the checkpoint's
    /// [`shutdown_timeout`](etl_checkpoint::CheckpointConfig::shutdown_timeout).
    ///
    /// # Errors
    ///
    /// The first failure of a part; whatever was in flight then is failed,
    /// so nothing past the last commit counts as delivered.
    /// [`PipelineError::ShutdownTimeout`] when parts had to be torn down at
    /// the deadline, [`PipelineError::FinalCommit`] (or
    /// [`PipelineError::Checkpoint`]) when the final commit failed, did
    /// not finish in time, or the run's last commit failed.
    pub async fn run(self, shutdown: CancellationToken) -> Result<Summary, PipelineError> {
        let shutdown_timeout = self.shutdown_timeout;
        let mut running = self.start(&shutdown).await?;
        let halted = running.until_stop(&shutdown).await;
        running.stop(halted, shutdown_timeout).await
    }

    /// The start phase: the checkpointer, the sinks (sharing one
    /// dead-letter sink), the replay gate, the source and its driver, and
    /// the transform stage, each running as a task.
    async fn start(self, shutdown: &CancellationToken) -> Result<Running, PipelineError> {
        let Pipeline {
            source,
            chain,
            sinks,
            dead_letter,
            store,
            progress_sink,
            checkpoint,
            source_driver,
            on_failure,
            channel_capacity,
            shutdown_timeout: _,
            transform_workers,
            router,
            hub,
        } = self;

        let store: Box<dyn OffsetStore> = match progress_sink {
            Some(sink) => Box::new(SinkProgressStore::new(
                store,
                sink,
                tokio::runtime::Handle::current(),
            )),
            None => store,
        };
        let batch_cap = batch_bytes_cap(&checkpoint.limits);
        let (acker, receiver) = etl_ack::channel();
        let (checkpointer, mut replays) = Checkpointer::spawn(checkpoint, store, receiver)?;
        // Watched from before the source starts: a reservation that waits
        // at once must not go unheard.
        let source_waiting = checkpointer.budget().waiting();
        if on_failure == FailurePolicy::Halt {
            // The first failure halts the run: the checkpointer records
            // it before the failures it causes, and announces no replay.
            checkpointer.halt_on_failure();
        }
        hub.set_checkpoint(checkpointer.clone());

        // Sinks, sharing one dead-letter sink. A sink that cannot write
        // (the dead-letter sink included) ends the run: the checkpointer
        // hears it before any batch the driver holds fails, so those
        // failures ask for no replay.
        let part_halted = CancellationToken::new();
        let on_halt = || {
            let (halting, halted) = (checkpointer.clone(), part_halted.clone());
            move || {
                halting.halt();
                halted.cancel();
            }
        };
        let dlq = dead_letter.map(|sink| {
            let handle = Arc::new(DeadLetterHandle::spawn_with_halt(
                sink.clone(),
                SinkDriverConfig::default(),
                on_halt(),
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
            driver = driver.batch_max_bytes_at_most(batch_cap);
            driver = driver.on_halt(on_halt());
            let handle = Arc::new(driver.spawn());
            let weak = Arc::downgrade(&handle);
            let slot = SinkSlot::new(Box::new(move || weak.upgrade().map(|h| h.metrics())));
            hub.add_sink(name.clone(), slot.clone());
            handles.push((name, handle, slot));
        }

        // Replays pass through here so `on_failure = halt` can stop them.
        let (replay_tx, replay_rx) = mpsc::unbounded_channel();
        let (halt_tx, halt_rx) = mpsc::unbounded_channel();
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
                    // The sinks and the replay gate close as their handles
                    // drop; nothing was read, so nothing is in flight.
                    replay_gate.abort();
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
        // The stage passes the end of the source's input on behind the
        // last records read (see `until_stop`).
        let (passed_on, input_ended) = tokio::sync::watch::channel(false);
        let end = InputEnd::new(driver.input_ended(), move || {
            passed_on.send_replace(true);
        });
        let driver_task = tokio::spawn(driver.run(cancel.clone()));

        let outputs = Outputs {
            sinks: handles.iter().map(|(_, h, _)| h.sender()).collect(),
            dead_letters: dlq.as_ref().map(|(_, h)| h.clone()),
        };
        let steps = Steps { chain, router };
        // A stage that stops (or panics) ends the run as a sink's halt
        // does: the checkpointer hears it before anything the stage holds
        // fails (so nothing asks for a replay), and the run is told to
        // stop (nothing else would end it: no replay request comes).
        let on_stop: OnStop = {
            let (halting, halted) = (checkpointer.clone(), part_halted.clone());
            Arc::new(move || {
                halting.halt();
                halted.cancel();
            })
        };
        let stage_task = match Workers::spawn(steps, transform_threads(transform_workers)) {
            Ok(workers) => {
                let stage = Stage::new(Steps::default(), outputs, hub.stage());
                tokio::spawn(run_parallel(
                    stage,
                    workers,
                    out_rx,
                    end,
                    cancel.clone(),
                    on_stop,
                ))
            }
            Err(steps) => {
                let stage = Stage::new(steps, outputs, hub.stage());
                tokio::spawn(run_serial(stage, out_rx, end, cancel.clone(), on_stop))
            }
        };

        Ok(Running {
            checkpointer,
            source_waiting,
            hub,
            handles,
            dead_letters: dlq.map(|(_, handle)| handle),
            dead_letter_slot: dlq_slot,
            replay_gate,
            halt_rx,
            part_halted,
            input_ended,
            cancel,
            driver_task,
            driver_done: None,
            stage_task,
        })
    }
}

/// A sink running under a pipeline: its name, its driver and its metrics
/// slot.
type RunningSink = (String, Arc<etl_sink::SinkHandle>, Arc<SinkSlot>);

/// The join handle of the source driver's task.
type DriverTask = tokio::task::JoinHandle<Result<etl_source::DriverExit, etl_source::SourceError>>;

/// A started pipeline: the parts' tasks and what stopping them needs.
struct Running {
    checkpointer: CheckpointHandle,
    /// `true` while the source waits for credit (see
    /// `InFlightBudget::waiting`): the sinks are told, and write what they
    /// hold meanwhile.
    source_waiting: tokio::sync::watch::Receiver<bool>,
    hub: MetricsHub,
    handles: Vec<RunningSink>,
    dead_letters: Option<Arc<DeadLetterHandle>>,
    dead_letter_slot: Option<Arc<SinkSlot>>,
    replay_gate: tokio::task::JoinHandle<()>,
    halt_rx: mpsc::UnboundedReceiver<etl_checkpoint::ReplayRequest>,
    /// Cancelled when a sink driver halts or the transform stage stops.
    part_halted: CancellationToken,
    /// Turns `true` once the stage has handed the sinks every record the
    /// source read before it read all its input.
    input_ended: tokio::sync::watch::Receiver<bool>,
    /// Stops the source driver and the stage (a child of the run's
    /// `shutdown`).
    cancel: CancellationToken,
    driver_task: DriverTask,
    /// How the driver ended, when it ended before the stop.
    driver_done: Option<
        Result<Result<etl_source::DriverExit, etl_source::SourceError>, tokio::task::JoinError>,
    >,
    stage_task: tokio::task::JoinHandle<Result<(), StageStop>>,
}

impl Running {
    /// The run phase: until the driver ends, a replay is refused by
    /// `on_failure = "halt"` (returned), a sink halts, the offset store
    /// is lost, a revocation halts the run (the sinks are torn down
    /// then), or `shutdown` is cancelled. Once the source has read all
    /// its input and the stage has handed on the last records read, the
    /// sinks write their last partial batches at once: a bounded run does
    /// not end a linger late, nor write its last records apart.
    async fn until_stop(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Option<etl_checkpoint::ReplayRequest> {
        let mut told_sinks = false;
        loop {
            tokio::select! {
                r = &mut self.driver_task => {
                    self.driver_done = Some(r);
                    return None;
                }
                Some(request) = self.halt_rx.recv() => {
                    self.checkpointer.halt();
                    self.cancel.cancel();
                    return Some(request);
                }
                // A sink halted (it cannot write), or the transform stage
                // stopped or panicked: the run ends, whether or not a
                // batch fails after it (none replays any more).
                () = self.part_halted.cancelled() => {
                    self.cancel.cancel();
                    return None;
                }
                // A revocation's deadline passed while an exactly-once
                // sink was writing a revoked partition: the sinks are torn
                // down at once (not drained), so that write ends and the
                // partition is handed over only then.
                () = self.checkpointer.revoke_halted() => {
                    tracing::error!("a revocation halted the run; tearing the sinks down");
                    for (_, handle, _) in &self.handles {
                        handle.tear_down();
                    }
                    self.cancel.cancel();
                    return None;
                }
                // A failed write or fsync of the offset store: nothing can
                // be committed any more, so the run stops, and its final
                // commit reports the store's error.
                () = self.checkpointer.store_lost() => {
                    tracing::error!("the offset store is lost; stopping the run");
                    self.checkpointer.halt();
                    self.cancel.cancel();
                    return None;
                }
                // The source waits for credit: the sinks' partial batches
                // may be what holds it (a routed sink taking one record in
                // a hundred fills its batch long after the bound is
                // reached), so each writes what it holds rather than
                // linger for records that cannot come.
                Ok(()) = self.source_waiting.changed() => {
                    let waiting = *self.source_waiting.borrow_and_update();
                    for (_, handle, _) in &self.handles {
                        handle.source_waiting(waiting);
                    }
                    if let Some(letters) = &self.dead_letters {
                        letters.source_waiting(waiting);
                    }
                }
                Ok(_) = self.input_ended.wait_for(|ended| *ended), if !told_sinks => {
                    told_sinks = true;
                    for (_, handle, _) in &self.handles {
                        handle.input_ended();
                    }
                }
                () = shutdown.cancelled() => return None,
            }
        }
    }

    /// The stop phase. From here every wait ends by one deadline,
    /// `shutdown_timeout` from now, whatever hangs: what a part still
    /// holds at its deadline is failed (its partitions replay), never
    /// delivered. The parts drain until `drain_at`; past it they are torn
    /// down, and the rest of the time is the final commit's.
    async fn stop(
        self,
        halted: Option<etl_checkpoint::ReplayRequest>,
        shutdown_timeout: Duration,
    ) -> Result<Summary, PipelineError> {
        let Running {
            checkpointer,
            source_waiting: _,
            hub,
            handles,
            dead_letters,
            dead_letter_slot,
            replay_gate,
            halt_rx: _,
            part_halted: _,
            input_ended: _,
            cancel: _,
            mut driver_task,
            driver_done,
            mut stage_task,
        } = self;
        let end_at = Instant::now() + shutdown_timeout;
        let reserve = shutdown_timeout / 10;
        let drain_at = end_at - reserve;
        let teardown_at = end_at - reserve / 2;
        let mut timed_out: Vec<&'static str> = Vec::new();

        // The source driver stops polling at once; only a call into the
        // source or the checkpointer can hold it. Aborted, its guards fail
        // the batch it was handing on.
        let driver_result = match driver_done {
            Some(r) => Some(r),
            None => match tokio::time::timeout_at(drain_at, &mut driver_task).await {
                Ok(r) => Some(r),
                Err(_) => {
                    timed_out.push("the source driver");
                    abort(&mut driver_task, teardown_at).await;
                    None
                }
            },
        };

        // The stage drains what the source handed on into the sinks.
        let stage_in_time = tokio::time::timeout_at(drain_at, &mut stage_task)
            .await
            .ok();

        // Close the sinks, all at once, by the same deadline; past it
        // they are aborted and fail what they hold. A stage still blocked
        // on a full sink then finds it gone, and fails what it holds too.
        let budget = drain_at.saturating_duration_since(Instant::now());
        let mut closing = Vec::with_capacity(handles.len());
        for (name, handle, slot) in handles {
            let metrics = handle.metrics();
            // Only the stage held other references, through senders.
            let task = Arc::try_unwrap(handle)
                .ok()
                .map(|handle| tokio::spawn(handle.shutdown(budget)));
            closing.push((name, slot, metrics, task));
        }
        let stage_result = match stage_in_time {
            Some(r) => Some(r),
            None => {
                timed_out.push("the transform stage");
                if tokio::time::timeout_at(teardown_at, &mut stage_task)
                    .await
                    .is_err()
                {
                    // Blocked elsewhere (the dead-letter sink, a worker).
                    abort(&mut stage_task, end_at - reserve / 4).await;
                }
                // Its result is the teardown's doing, not a cause.
                None
            }
        };
        replay_gate.abort();

        // The stage is gone: the dead-letter driver is ours alone.
        let mut dead_lettered = 0;
        let dlq_closing = dead_letters.map(|handle| {
            dead_lettered = handle.metrics().records_written;
            let budget = drain_at.saturating_duration_since(Instant::now());
            Arc::try_unwrap(handle)
                .ok()
                .map(|handle| tokio::spawn(handle.shutdown(budget)))
        });

        let Closed {
            first_error,
            sink_metrics,
            dead_lettered,
        } = collect_closed(
            closing,
            dlq_closing.flatten(),
            dead_letter_slot.as_ref(),
            dead_lettered,
        )
        .await;

        let final_commit = final_commit(&checkpointer, end_at, shutdown_timeout).await;

        // A revocation that halted the run is its root cause: what the
        // parts report (a sink torn down) followed from it.
        if let Some(err) = checkpointer.revoke_halt() {
            let _ = final_commit;
            return Err(err.into());
        }
        let exit = root_cause(Ended {
            halted,
            first_error,
            driver_result,
            stage_result,
            timed_out,
            shutdown_timeout,
        })?;
        let final_commit = final_commit?;
        let snapshot = hub.snapshot();
        Ok(Summary {
            read: snapshot.read,
            filtered: snapshot.filtered,
            dead_lettered,
            sinks: sink_metrics,
            replays: snapshot.source.total(|p| p.replays),
            unrouted: snapshot.unrouted,
            committed: final_commit.committed,
            stopped: exit == etl_source::DriverExit::Shutdown,
        })
    }
}

/// What closing the sinks left: the first sink's error, each sink's
/// metrics, and the records dead-lettered in all.
struct Closed {
    first_error: Option<PipelineError>,
    sink_metrics: Vec<(String, SinkMetrics)>,
    dead_lettered: u64,
}

/// A sink being closed: its name, metrics slot, last metrics, and the
/// task of its shutdown (none when it could not be taken back).
type Closing = (
    String,
    Arc<SinkSlot>,
    SinkMetrics,
    Option<tokio::task::JoinHandle<Result<SinkMetrics, SinkDriverError>>>,
);

/// Wait for the sinks' and the dead-letter sink's shutdowns (each bounded
/// by its own budget), and gather what they left.
async fn collect_closed(
    closing: Vec<Closing>,
    dlq_closing: Option<tokio::task::JoinHandle<Result<SinkMetrics, SinkDriverError>>>,
    dlq_slot: Option<&Arc<SinkSlot>>,
    mut dead_lettered: u64,
) -> Closed {
    let mut first_error: Option<PipelineError> = None;
    let mut sink_metrics = Vec::with_capacity(closing.len());
    for (name, slot, metrics, task) in closing {
        match closed(task).await {
            None => sink_metrics.push((name, metrics)),
            Some(Ok(m)) => {
                slot.finish(m);
                sink_metrics.push((name, m));
            }
            Some(Err(source)) => {
                sink_metrics.push((name.clone(), metrics));
                first_error.get_or_insert(PipelineError::Sink { name, source });
            }
        }
    }
    match closed(dlq_closing).await {
        None => {}
        Some(Ok(m)) => {
            dead_lettered = m.records_written;
            if let Some(slot) = dlq_slot {
                slot.finish(m);
            }
        }
        Some(Err(source)) => {
            first_error.get_or_insert(PipelineError::Sink {
                name: "dead_letter".to_owned(),
                source,
            });
        }
    }
    dead_lettered += sink_metrics
        .iter()
        .map(|(_, m)| m.dead_lettered)
        .sum::<u64>();

    Closed {
        first_error,
        sink_metrics,
        dead_lettered,
    }
}

/// The final commit, bounded too: a store that never answers (a group
/// coordinator that is down) must not hold the stop.
async fn final_commit(
    checkpointer: &CheckpointHandle,
    end_at: Instant,
    shutdown_timeout: Duration,
) -> Result<etl_checkpoint::CheckpointSummary, PipelineError> {
    let commit_budget = end_at.saturating_duration_since(Instant::now());
    match within_wall_clock(commit_budget, checkpointer.shutdown()).await {
        None => Err(PipelineError::FinalCommit(format!(
            "the offset store did not answer within shutdown_timeout ({})",
            humantime::format_duration(shutdown_timeout)
        ))),
        Some(Err(e)) => Err(e.into()),
        // A commit that failed with nothing committed since (a revoke
        // whose commit failed, its partition gone) leaves delivered
        // records uncommitted: that is no success either.
        Some(Ok(summary)) => match &summary.metrics.last_commit_error {
            Some(reason) => Err(PipelineError::FinalCommit(format!(
                "the last commit failed: {reason}"
            ))),
            None => Ok(summary),
        },
    }
}

/// How the parts of a run ended.
struct Ended {
    halted: Option<etl_checkpoint::ReplayRequest>,
    first_error: Option<PipelineError>,
    driver_result: Option<
        Result<Result<etl_source::DriverExit, etl_source::SourceError>, tokio::task::JoinError>,
    >,
    stage_result: Option<Result<Result<(), StageStop>, tokio::task::JoinError>>,
    timed_out: Vec<&'static str>,
    shutdown_timeout: Duration,
}

/// The run's error, its root cause first, or how the source driver ended.
fn root_cause(ended: Ended) -> Result<etl_source::DriverExit, PipelineError> {
    let Ended {
        halted,
        first_error,
        driver_result,
        stage_result,
        timed_out,
        shutdown_timeout,
    } = ended;
    // Report the root cause first. A sink that stopped on its own error
    // (it cannot write, whatever the records) failed the batches whose
    // replay `on_failure = "halt"` then refused: the sink is the cause.
    if let Some(request) = halted {
        if let Some(err @ PipelineError::Sink { .. }) = first_error
            && !matches!(
                &err,
                PipelineError::Sink {
                    source: SinkDriverError::Halted(_) | SinkDriverError::ShutdownTimeout(_),
                    ..
                }
            )
        {
            return Err(err);
        }
        return Err(PipelineError::Halted {
            partition: request.partition,
            from: request.from,
        });
    }
    let exit = match driver_result {
        Some(Ok(Ok(exit))) => exit,
        Some(Ok(Err(e))) => {
            // A closed downstream is the stage's doing: report its cause.
            return Err(match stage_result {
                Some(Ok(Err(stop))) => stop_error(stop, first_error),
                Some(Err(join)) => PipelineError::Internal(format!("transform stage: {join}")),
                Some(Ok(Ok(()))) | None => e.into(),
            });
        }
        Some(Err(join)) => {
            return Err(PipelineError::Internal(format!("source driver: {join}")));
        }
        // Torn down at its deadline (counted in `timed_out`).
        None => etl_source::DriverExit::Shutdown,
    };
    match stage_result {
        Some(Ok(Ok(()))) | None => {}
        Some(Ok(Err(stop))) => return Err(stop_error(stop, first_error)),
        Some(Err(join)) => {
            return Err(PipelineError::Internal(format!("transform stage: {join}")));
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if !timed_out.is_empty() {
        return Err(PipelineError::ShutdownTimeout {
            parts: timed_out.join(" and "),
            timeout: shutdown_timeout,
        });
    }
    Ok(exit)
}

/// Abort `task` and wait until `until` at most for it to go: a task
/// stuck in a blocking call cannot go at once, and is then left behind
/// (what it holds fails whenever it does go).
async fn abort<T>(task: &mut tokio::task::JoinHandle<T>, until: Instant) {
    task.abort();
    let _ = tokio::time::timeout_at(until, task).await;
}

/// The outcome of a sink driver's spawned shutdown; `None` when there was
/// nothing to close.
async fn closed(
    task: Option<tokio::task::JoinHandle<Result<SinkMetrics, SinkDriverError>>>,
) -> Option<Result<SinkMetrics, SinkDriverError>> {
    let joined = task?.await;
    // `shutdown` does not panic; a join error means the runtime is
    // going away, and the driver with it (which fails what it held).
    Some(joined.unwrap_or(Err(SinkDriverError::Closed)))
}

/// Wait for `future` at most `limit` of wall-clock time.
///
/// The checkpointer runs on its own thread, on the wall clock. Under
/// tokio's paused clock (tests, simulations) a tokio timer would jump
/// ahead while that thread is still working, whenever every task waits,
/// and give up on an answer that was on its way. The timer here is a
/// blocking task, which holds the paused clock still while it runs, and
/// ends as soon as `future` does.
async fn within_wall_clock<F: std::future::Future>(
    limit: Duration,
    future: F,
) -> Option<F::Output> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let timer = tokio::task::spawn_blocking(move || {
        // Returns early once `done` is dropped: the future finished.
        let _ = finished.recv_timeout(limit);
    });
    tokio::select! {
        biased;
        out = future => {
            drop(done);
            Some(out)
        }
        _ = timer => None,
    }
}

/// The share of the in-flight byte bound one sink batch may hold.
const BATCH_SHARE: u64 = 16;

/// The largest batch, in encoded bytes, the pipeline lets a sink write:
/// a sixteenth of the smaller in-flight byte bound (1 MiB at the
/// defaults). A batch whose records hold a large share of what may be in
/// flight stalls the source twice: while it fills, once the bound is
/// reached the records it waits for cannot be read; while it is written
/// and synced, nothing behind it can be acknowledged. On 400-byte
/// records, 8192-record batches held 30% of the default 16 MiB and cost
/// a quarter of the rate of a file-to-file run (docs/benchmarks.md).
fn batch_bytes_cap(limits: &etl_checkpoint::InFlightLimits) -> usize {
    let bound = limits
        .max_in_flight_bytes
        .min(limits.max_in_flight_bytes_per_partition);
    usize::try_from(bound / BATCH_SHARE).unwrap_or(usize::MAX)
}

/// Threads for the transforms when `workers` are asked for: at least one
/// on a multi-thread runtime, where a CPU-bound stage on a runtime worker
/// holds up the tasks it wakes (tokio runs a woken task next on the
/// waking worker, where no other worker may take it: the sink waited for
/// the stage's whole backlog, the source for credit, and two cores did
/// the work of one). On a current-thread runtime one worker means none:
/// the transforms run on the stage's task, as everything else does.
fn transform_threads(workers: usize) -> usize {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread if workers < 2 => 0,
        _ => workers.max(1),
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
