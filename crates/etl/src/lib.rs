//! The pipeline runtime: a source, a chain of transforms and one or more
//! sinks, with one checkpointer committing only what every sink has made
//! durable (at-least-once; exactly-once with a single
//! [`ProgressSink`](etl_sink::ProgressSink)). The `etl` command that runs
//! it from a TOML file is the `etl-cli` crate.
//!
//! * [`Pipeline::builder`] gives a [`PipelineBuilder`]: a
//!   [`Source`](etl_source::Source) (or a [`SourceFactory`] for a source
//!   that needs the checkpointer's handle, as a Kafka consumer does),
//!   transforms ([`filter`], [`map`], [`flat_map`] closures, [`JsonStage`],
//!   anything that implements [`Transform`]), named sinks, each run by an
//!   [`etl_sink::SinkDriver`], a dead-letter sink, an
//!   [`OffsetStore`](etl_checkpoint::OffsetStore) (in memory by default;
//!   [`FileStore`](etl_checkpoint::FileStore) survives restarts) and the
//!   commit policy.
//! * [`Pipeline::run`] runs it to the end of its input or until its
//!   cancellation token is cancelled, then drains, flushes, commits and
//!   returns a [`Summary`]; failures are [`PipelineError`]s naming the
//!   component. [`shutdown_signal`] gives a token wired to SIGINT and
//!   SIGTERM as the command line has it (first signal: graceful stop;
//!   second: exit 130).
//! * [`Pipeline::metrics`] gives a [`MetricsHub`]: counters and gauges of
//!   the run as a [`PipelineSnapshot`], as Prometheus text, or registered
//!   into your own `prometheus-client` registry.
//! * The TOML configuration the `etl` command reads:
//!   `etl::registry().loader()` (a [`ConfigLoader`] with every built-in of
//!   this build) reads a file or text into a [`Config`] (every problem
//!   reported, with the key it is about), [`pipeline_from_config`] turns
//!   it into a [`Pipeline`].
//!
//! # Example
//!
//! Numbers from a generator, the even ones kept, written as lines to a
//! sink that keeps them in memory; offsets committed in memory.
//!
//! ```
//! use etl::{Pipeline, filter};
//! use etl_record::Record;
//! use etl_sink::testing::MemorySink;
//! use etl_sink::{RawLinesEncoder, SinkDriver};
//! use etl_source::{GeneratorConfig, GeneratorSource};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let output = MemorySink::new();
//! let pipeline = Pipeline::builder()
//!     .source(GeneratorSource::new(GeneratorConfig {
//!         partitions: 1,
//!         records_per_partition: Some(10),
//!         ..GeneratorConfig::default()
//!     })?)
//!     .transform(filter("even", |r: &Record| r.position.offset.0 % 2 == 0))
//!     .sink("memory", SinkDriver::new(output.clone(), RawLinesEncoder::new()))
//!     .build()?;
//! // In a program: `etl::shutdown_signal()?` to stop on Ctrl-C.
//! let summary = pipeline.run(CancellationToken::new()).await?;
//!
//! assert_eq!((summary.read, summary.filtered, summary.written()), (10, 5, 5));
//! assert_eq!(output.bytes().iter().filter(|b| **b == b'\n').count(), 5);
//! # Ok(())
//! # }
//! ```
//!
//! A pipeline from the TOML the `etl` command runs:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Relative paths (here the offset store's `.etl-state/`) are resolved
//! // against the folder given, as `etl run` does against the file's.
//! let folder = tempfile::tempdir()?;
//! let config = etl::registry().loader().text(
//!     r#"
//!     [source]
//!     type = "generator"
//!     records_per_partition = 10
//!
//!     [[sinks]]
//!     type = "blackhole"
//!     "#,
//!     folder.path(),
//! )
//! .map_err(|problems| format!("{problems:?}"))?;
//! let pipeline = etl::pipeline_from_config(&config).await?;
//! let summary = pipeline.run(tokio_util::sync::CancellationToken::new()).await?;
//! assert_eq!(summary.written(), summary.read);
//! # Ok(())
//! # }
//! ```
//!
//! `docs/using-the-crates.md` says which crate does what and what to put
//! in `Cargo.toml`; `crates/etl/examples/` has complete programs.
//!
//! # Features
//!
//! * `kafka` (default): the `type = "kafka"` source and sink of the
//!   configuration, through `etl-kafka` (librdkafka, built from source:
//!   needs a C compiler and takes a while).
//! * `postgres` (default): the `type = "postgres"` sink, through
//!   `etl-postgres`.
//! * `remap` (default): the `type = "remap"` step and `condition` filters
//!   in the Vector Remap Language (`Remap`, `VrlFilter`, `VrlProgram`).
//!
//! With `default-features = false` the crate builds without librdkafka
//! and VRL; everything above the Features heading works without them.

mod connectors;
mod metrics;
mod runtime;
mod signal;
mod transform;

pub use connectors::{registry, with_connectors};
// The configuration language is `etl-config`'s: its sections and options
// are in [`config`], named apart from the library types they become.
pub use etl_config::config;
// What `Pipeline::builder().on_failure(...)` takes is the checkpointer's.
pub use etl_checkpoint::FailurePolicy;
pub use etl_config::{
    BoxError, BoxFuture, BuiltSink, BuiltSource, CheckReport, CompareOp, Component,
    ComponentContext, Config, ConfigError, ConfigLoader, ConfigProblem, ErrorKind, ErrorKindFn,
    ProgressCheck, Registry, RouteMode, SinkPlugin, SourcePlugin, StartWithHandle,
};
/// The engine's inner readers for the fuzz targets in `fuzz/` (feature
/// `fuzzing`; not a stable interface).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use etl_json::fuzzing;
pub use metrics::{CommittedTotals, ProgressTotals};
pub use runtime::{
    MetricsHub, Pipeline, PipelineBuilder, PipelineError, PipelineSnapshot, Route, SourceFactory,
    Summary, pipeline_from_config,
};
pub use signal::{ABORT_EXIT_CODE, shutdown_signal};
pub use transform::{
    ChainError, ChainOutput, FilterFn, FlatMapFn, JsonOp, JsonStage, MapFn, Outcome, Refused,
    Transform, TransformChain, chain_from_config, filter, filter_mut, flat_map, flat_map_mut, map,
    map_mut, try_chain_from_config,
};
#[cfg(feature = "remap")]
pub use transform::{Remap, VrlError, VrlFilter, VrlProgram};
