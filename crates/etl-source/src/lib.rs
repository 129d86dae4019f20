//! Sources of an ETL pipeline: the [`Source`] trait and built-in sources.
//!
//! A source reads partitioned, replayable input and returns it in
//! [`PollBatch`]es of one partition each; the [`SourceDriver`] opens an
//! acknowledgement handle per batch, bounds what is in flight and replays
//! partitions after failures by [seeking](Source::seek) back.
//!
//! * [`Source`] is the trait to implement, with its implementor contract
//!   (what a source MUST do on seek, on revoke, on shutdown); [`BoxSource`]
//!   is how it is held. `docs/writing-a-source.md` walks through a
//!   complete example.
//! * [`SourceDriver`] runs a source against an `etl-checkpoint`
//!   checkpointer: epochs from assignments and replays, credits from the
//!   in-flight budget, [`SourceOutput`]s downstream, poison records
//!   narrowed down and handled by [`PoisonPolicy`], counters in
//!   [`SourceMetrics`].
//! * [`FileSource`] reads NDJSON or raw lines from files (one partition
//!   per file, byte offsets, bad input as dead letters);
//!   [`GeneratorSource`] makes deterministic synthetic records.
//!
//! # Example
//!
//! ```
//! use etl_source::{GeneratorConfig, GeneratorSource, Source, SourceEvent};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let mut source = GeneratorSource::new(GeneratorConfig {
//!     records_per_partition: Some(3),
//!     ..GeneratorConfig::default()
//! })?;
//! assert!(matches!(source.next().await?, SourceEvent::Assigned(_)));
//! let SourceEvent::Batch(batch) = source.next().await? else { unreachable!() };
//! assert_eq!(batch.records.len(), 3);
//! assert!(matches!(source.next().await?, SourceEvent::End));
//! # Ok::<(), etl_source::SourceError>(())
//! # }).unwrap();
//! ```

mod batch;
mod driver;
mod driver_config;
mod error;
mod file_config;
mod file_glob;
mod file_identity;
mod file_source;
mod file_tail;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod generator;
mod line_reader;
#[cfg(test)]
mod memory_tests;
mod metrics;
mod ndjson_check;
mod packed;
mod poison;
mod read_buf;
mod source;

pub use batch::PollBatch;
pub use driver::SourceDriver;
pub use driver_config::{DriverExit, SourceDriverConfig, SourceOutput};
pub use error::SourceError;
pub use file_config::{
    EofPolicy, FileSourceConfig, LineFormat, ReplacedPolicy, file_partition_id, resolve_inputs,
    resolve_inputs_in,
};
pub use file_identity::{registered_inputs, registered_inputs_in};
pub use file_source::FileSource;
pub use generator::{GeneratorConfig, GeneratorSource};
pub use metrics::{
    PartitionSourceMetrics, PublishedSourceMetrics, SourceMetrics, SourceMetricsHandle,
};
pub use poison::PoisonPolicy;
pub use source::{BoxSource, Source, SourceEvent, SourceGauge};
