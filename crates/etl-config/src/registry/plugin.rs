//! What a source or sink type gives the registry beyond a factory: the
//! checks of its table at load time ([`CheckReport`]), and what it builds
//! ([`BuiltSource`], [`BuiltSink`]) with what the pipeline needs to know
//! of it (a source that needs the checkpointer's handle or keeps its own
//! offsets, a sink that stores its progress with its data).

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use etl_checkpoint::{CheckpointHandle, OffsetStore};
use etl_sink::{Encoder, Progress, ProgressSink, Sink};
use etl_source::Source;
use serde::de::DeserializeOwned;

use super::{BoxError, ComponentContext};
use crate::config::CheckpointOptions;

/// A factory's answer that may take time (a sink that connects).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One problem a component's check found in its table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    /// In `[checkpoint]` rather than the component's own table.
    pub(crate) in_checkpoint: bool,
    /// The key path inside the table (empty: the table itself).
    pub(crate) path: Vec<String>,
    /// What is wrong.
    pub(crate) message: String,
}

/// What a component's check reports of its table when the configuration
/// is loaded (`etl validate` and `etl run` alike): problems placed at the
/// key they are about, and what the loader checks across components (the
/// files it reads and writes, whether it stores its own progress).
#[derive(Debug)]
pub struct CheckReport<'a> {
    name: &'a str,
    checkpoint: &'a CheckpointOptions,
    base: &'a Path,
    pub(crate) problems: Vec<Problem>,
    pub(crate) facts: Facts,
}

/// What the loader knows of a component once its table is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    /// A sink that stores its progress with its data (needs a single
    /// sink).
    pub(crate) exactly_once: bool,
    /// Files it writes, and whether each rotates.
    pub(crate) writes: Vec<(PathBuf, bool)>,
    /// Files and globs it reads.
    pub(crate) reads: Vec<String>,
    /// A source that keeps its own offsets (a Kafka consumer group).
    pub(crate) keeps_offsets: bool,
    /// A sink that reads every value as JSON and refuses what is not.
    pub(crate) reads_json: bool,
}

impl<'a> CheckReport<'a> {
    pub(crate) fn new(name: &'a str, checkpoint: &'a CheckpointOptions, base: &'a Path) -> Self {
        CheckReport {
            name,
            checkpoint,
            base,
            problems: Vec::new(),
            facts: Facts::default(),
        }
    }

    /// The component's name, as [`ComponentContext::name`] will give it.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name
    }

    /// The configuration's `[checkpoint]` section (its defaults when it
    /// has problems of its own).
    #[must_use]
    pub fn checkpoint(&self) -> &CheckpointOptions {
        self.checkpoint
    }

    /// The configuration file's folder.
    #[must_use]
    pub fn base_dir(&self) -> &Path {
        self.base
    }

    /// A problem at `key` of the component's table (a dotted path is not
    /// split: give nested keys to [`problem_at`](Self::problem_at)).
    pub fn problem(&mut self, key: &str, message: impl Into<String>) {
        self.problem_at(&[key], message);
    }

    /// A problem at the key `path` (a key of the table, then keys inside
    /// it); at the table itself when `path` is empty or not written.
    pub fn problem_at(&mut self, path: &[&str], message: impl Into<String>) {
        self.problems.push(Problem {
            in_checkpoint: false,
            path: path.iter().map(|k| (*k).to_owned()).collect(),
            message: message.into(),
        });
    }

    /// A problem at `key` of `[checkpoint]`: the component cannot work
    /// with the commit settings there.
    pub fn checkpoint_problem(&mut self, key: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            in_checkpoint: true,
            path: vec![key.to_owned()],
            message: message.into(),
        });
    }

    /// A problem at `key` unless `value` is at least 1.
    pub fn at_least_one(&mut self, key: &str, value: u64) {
        if value == 0 {
            self.problem(key, format!("{key} must be at least 1"));
        }
    }

    /// A problem at `key` unless `value` is above zero.
    pub fn above_zero(&mut self, key: &str, value: std::time::Duration) {
        if value.is_zero() {
            self.problem(key, format!("{key} must be above zero"));
        }
    }

    /// The sink stores its progress with its data: it must be the
    /// pipeline's only sink.
    pub fn exactly_once(&mut self) {
        self.facts.exactly_once = true;
    }

    /// The component writes `path` (resolved against the configuration's
    /// folder), and `<path>.1`, `<path>.2`... when it `rotates`: checked
    /// against every other output and the source's inputs.
    pub fn writes_file(&mut self, path: &Path, rotates: bool) {
        self.facts.writes.push((path.to_owned(), rotates));
    }

    /// The source reads these files or globs: no sink may write one.
    pub fn reads_files(&mut self, patterns: &[String]) {
        self.facts.reads.extend(patterns.iter().cloned());
    }

    /// The source keeps its own offsets (as a Kafka consumer group does):
    /// `etl offsets` has none to show.
    pub fn keeps_offsets(&mut self) {
        self.facts.keeps_offsets = true;
    }

    /// The sink reads every value it is given as JSON and sends any that
    /// is not to the dead-letter path, with its reason (as a Parquet
    /// encoder does). The only sink of a pipeline without transforms,
    /// built from its configuration alone and with a `[dead_letter]`
    /// sink that does not say so itself, then checks each value once, and
    /// an NDJSON source need not check its lines before it (see
    /// [`ComponentContext::steps_check_json`](crate::ComponentContext::steps_check_json)).
    pub fn reads_values_as_json(&mut self) {
        self.facts.reads_json = true;
    }
}

/// Checks a component's config struct at load time.
pub(crate) type CheckFn<C> = dyn Fn(&C, &mut CheckReport<'_>) + Send + Sync;
/// Builds a source from its config struct.
type SourceBuildFn<C> =
    dyn Fn(C, &ComponentContext<'_>) -> Result<BuiltSource, BoxError> + Send + Sync;
/// Builds a sink from its config struct, maybe connecting first.
type SinkBuildFn<C> =
    dyn Fn(C, &ComponentContext<'_>) -> BoxFuture<Result<BuiltSink, BoxError>> + Send + Sync;

/// A source type with everything the built-ins use: a factory that
/// returns a [`BuiltSource`], a check of its config struct at load time,
/// and the keys of its table that are paths.
pub struct SourcePlugin<C> {
    pub(crate) build: Arc<SourceBuildFn<C>>,
    pub(crate) check: Option<Arc<CheckFn<C>>>,
    pub(crate) paths: Vec<String>,
}

impl<C: DeserializeOwned + 'static> SourcePlugin<C> {
    /// A source type built by `factory`.
    #[must_use]
    pub fn new<F>(factory: F) -> Self
    where
        F: Fn(C, &ComponentContext<'_>) -> Result<BuiltSource, BoxError> + Send + Sync + 'static,
    {
        SourcePlugin {
            build: Arc::new(factory),
            check: None,
            paths: Vec::new(),
        }
    }

    /// Check the table at load time, beyond its deserialization.
    #[must_use]
    pub fn check(
        mut self,
        check: impl Fn(&C, &mut CheckReport<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Arc::new(check));
        self
    }

    /// Keys of the table that hold a path or a list of paths: resolved
    /// against the configuration file's folder when it is loaded.
    #[must_use]
    pub fn paths(mut self, keys: &[&str]) -> Self {
        self.paths = keys.iter().map(|k| (*k).to_owned()).collect();
        self
    }
}

impl<C> fmt::Debug for SourcePlugin<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourcePlugin").finish_non_exhaustive()
    }
}

/// A sink type with everything the built-ins use: a factory (which may
/// connect) that returns a [`BuiltSink`], a check of its config struct at
/// load time, and the keys of its table that are paths.
pub struct SinkPlugin<C> {
    pub(crate) build: Arc<SinkBuildFn<C>>,
    pub(crate) check: Option<Arc<CheckFn<C>>>,
    pub(crate) paths: Vec<String>,
}

impl<C: DeserializeOwned + 'static> SinkPlugin<C> {
    /// A sink type built by `factory`.
    #[must_use]
    pub fn new<F>(factory: F) -> Self
    where
        F: Fn(C, &ComponentContext<'_>) -> Result<BuiltSink, BoxError> + Send + Sync + 'static,
    {
        SinkPlugin {
            build: Arc::new(move |config, context| {
                let built = factory(config, context);
                Box::pin(std::future::ready(built))
            }),
            check: None,
            paths: Vec::new(),
        }
    }

    /// A sink type built by `factory`, which may wait (to connect, to
    /// read its stored progress). The future must own what it needs of
    /// the context.
    #[must_use]
    pub fn new_async<F, Fut>(factory: F) -> Self
    where
        F: Fn(C, &ComponentContext<'_>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<BuiltSink, BoxError>> + Send + 'static,
    {
        SinkPlugin {
            build: Arc::new(move |config, context| Box::pin(factory(config, context))),
            check: None,
            paths: Vec::new(),
        }
    }

    /// Check the table at load time, beyond its deserialization.
    #[must_use]
    pub fn check(
        mut self,
        check: impl Fn(&C, &mut CheckReport<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Arc::new(check));
        self
    }

    /// Keys of the table that hold a path or a list of paths: resolved
    /// against the configuration file's folder when it is loaded.
    #[must_use]
    pub fn paths(mut self, keys: &[&str]) -> Self {
        self.paths = keys.iter().map(|k| (*k).to_owned()).collect();
        self
    }
}

impl<C> fmt::Debug for SinkPlugin<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkPlugin").finish_non_exhaustive()
    }
}

/// Starts a source once the checkpointer runs, with its handle.
pub type StartWithHandle =
    Box<dyn FnOnce(&CheckpointHandle) -> Result<Box<dyn Source>, BoxError> + Send>;

/// Checks an exactly-once sink's stored progress against the source.
pub type ProgressCheck = Box<dyn Fn(&Progress) -> Result<(), BoxError> + Send + Sync>;

/// How a built source starts.
pub enum SourceStart {
    /// Ready to be polled.
    Ready(Box<dyn Source>),
    /// Started once the checkpointer runs, with its handle.
    WithHandle(StartWithHandle),
}

impl fmt::Debug for SourceStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceStart::Ready(_) => "Ready",
            SourceStart::WithHandle(_) => "WithHandle",
        })
    }
}

/// What a source factory builds: the source, or how to start it with the
/// checkpointer's handle, and what the pipeline needs to know of it.
///
/// Its fields are what the runtime reads; the methods below build it.
pub struct BuiltSource {
    /// How it starts.
    pub start: SourceStart,
    /// Its own offset store, if it keeps its offsets.
    pub offset_store: Option<Box<dyn OffsetStore>>,
    /// The check of an exactly-once sink's stored progress, if any.
    pub progress_check: Option<ProgressCheck>,
    /// Every value it gives is a JSON document.
    pub values_are_json: bool,
    /// Several processes share an exactly-once sink's progress.
    pub shares_progress: bool,
}

impl BuiltSource {
    fn with(start: SourceStart) -> Self {
        BuiltSource {
            start,
            offset_store: None,
            progress_check: None,
            values_are_json: false,
            shares_progress: false,
        }
    }

    /// A source ready to be polled.
    #[must_use]
    pub fn new(source: impl Source + 'static) -> Self {
        BuiltSource::with(SourceStart::Ready(Box::new(source)))
    }

    /// A boxed source ready to be polled.
    #[must_use]
    pub fn boxed(source: Box<dyn Source>) -> Self {
        BuiltSource::with(SourceStart::Ready(source))
    }

    /// A source started once the checkpointer runs, with its
    /// [`CheckpointHandle`]: one that drains and commits partitions on a
    /// revoke (a Kafka consumer), or that acknowledges positions to its
    /// upstream as they commit (a replication slot).
    #[must_use]
    pub fn with_handle(
        start: impl FnOnce(&CheckpointHandle) -> Result<Box<dyn Source>, BoxError> + Send + 'static,
    ) -> Self {
        BuiltSource::with(SourceStart::WithHandle(Box::new(start)))
    }

    /// The source keeps its own offsets in `store` (a consumer group): it
    /// is the pipeline's offset store, whatever `[checkpoint] store`
    /// says.
    #[must_use]
    pub fn offset_store(mut self, store: impl OffsetStore) -> Self {
        self.offset_store = Some(Box::new(store));
        self
    }

    /// Check an exactly-once sink's stored progress before it is applied
    /// (partition ids this source would read differently).
    #[must_use]
    pub fn check_stored_progress(
        mut self,
        check: impl Fn(&Progress) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.progress_check = Some(Box::new(check));
        self
    }

    /// Every value the source gives is a JSON document: NDJSON encoders
    /// may take them without checking (when no step changes them).
    #[must_use]
    pub fn values_are_json(mut self, json: bool) -> Self {
        self.values_are_json = json;
        self
    }

    /// Several processes run this pipeline, each with its own partitions
    /// (the members of a consumer group): an exactly-once sink's stored
    /// progress is shared by them ([`ComponentContext::progress_is_shared`]).
    #[must_use]
    pub fn shares_progress(mut self) -> Self {
        self.shares_progress = true;
        self
    }
}

impl fmt::Debug for BuiltSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltSource")
            .field("keeps_offsets", &self.offset_store.is_some())
            .finish_non_exhaustive()
    }
}

/// A built sink, as the driver takes it.
#[derive(Debug)]
pub enum SinkHold {
    /// A sink, shareable.
    Shared(Arc<dyn Sink>),
    /// A sink that stores its progress with its data.
    ExactlyOnce(Box<dyn ProgressSink>),
}

/// What a sink factory builds: a sink, or an exactly-once sink that
/// stores its progress with its data, and the encoder of its batches.
///
/// Its fields are what the runtime reads; the methods below build it.
pub struct BuiltSink {
    /// The sink.
    pub sink: SinkHold,
    /// Its encoder; NDJSON when `None`.
    pub encoder: Option<Box<dyn Encoder>>,
}

impl BuiltSink {
    /// A sink; its batches are NDJSON unless [`encoder`](Self::encoder)
    /// says otherwise.
    #[must_use]
    pub fn new(sink: impl Sink + 'static) -> Self {
        BuiltSink {
            sink: SinkHold::Shared(Arc::new(sink)),
            encoder: None,
        }
    }

    /// A boxed sink.
    #[must_use]
    pub fn boxed(sink: Box<dyn Sink>) -> Self {
        BuiltSink {
            sink: SinkHold::Shared(Arc::from(sink)),
            encoder: None,
        }
    }

    /// A sink that stores the source positions it covers with its data:
    /// the pipeline resumes from its progress (exactly once). It must be
    /// the pipeline's only sink.
    #[must_use]
    pub fn exactly_once(sink: impl ProgressSink + 'static) -> Self {
        BuiltSink {
            sink: SinkHold::ExactlyOnce(Box::new(sink)),
            encoder: None,
        }
    }

    /// How the sink's batches are encoded.
    #[must_use]
    pub fn encoder(mut self, encoder: impl Encoder + 'static) -> Self {
        self.encoder = Some(Box::new(encoder));
        self
    }
}

impl fmt::Debug for BuiltSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltSink")
            .field(
                "exactly_once",
                &matches!(self.sink, SinkHold::ExactlyOnce(_)),
            )
            .finish_non_exhaustive()
    }
}

/// A boxed exactly-once sink as the driver takes one (a `ProgressSink`
/// of its own).
#[derive(Debug)]
pub struct BoxedProgressSink(pub Box<dyn ProgressSink>);

#[async_trait::async_trait]
impl Sink for BoxedProgressSink {
    async fn write(&self, batch: &etl_sink::EncodedBatch) -> Result<(), etl_sink::SinkError> {
        self.0.write(batch).await
    }

    async fn flush(&self) -> Result<(), etl_sink::SinkError> {
        self.0.flush().await
    }

    fn settle_time(&self) -> std::time::Duration {
        self.0.settle_time()
    }

    async fn settle(&self) {
        self.0.settle().await;
    }
}

#[async_trait::async_trait]
impl ProgressSink for BoxedProgressSink {
    fn progress(&self) -> Progress {
        self.0.progress()
    }

    async fn reload_progress(&self) -> Result<Progress, etl_sink::SinkError> {
        self.0.reload_progress().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Waker};
    use std::time::Duration;

    use super::*;

    /// An exactly-once sink with background work to settle.
    #[derive(Debug, Default)]
    struct Settling {
        settled: Arc<AtomicBool>,
    }

    #[async_trait::async_trait]
    impl Sink for Settling {
        async fn write(&self, _: &etl_sink::EncodedBatch) -> Result<(), etl_sink::SinkError> {
            Ok(())
        }

        fn settle_time(&self) -> Duration {
            Duration::from_secs(3)
        }

        async fn settle(&self) {
            self.settled.store(true, Ordering::SeqCst);
        }
    }

    impl ProgressSink for Settling {
        fn progress(&self) -> Progress {
            Progress::default()
        }
    }

    /// The driver settles the box it is given: a box that kept the
    /// defaults left an object-store sink's aborts to the runtime's end.
    #[test]
    fn a_boxed_exactly_once_sink_settles_as_the_sink_it_holds() {
        let settled = Arc::new(AtomicBool::new(false));
        let boxed = BoxedProgressSink(Box::new(Settling {
            settled: settled.clone(),
        }));
        assert_eq!(boxed.settle_time(), Duration::from_secs(3));
        let settle = boxed.settle();
        let mut settle = std::pin::pin!(settle);
        let polled = settle
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_ready());
        assert!(settled.load(Ordering::SeqCst));
    }
}
