//! The configuration schema. Every section rejects unknown fields, so a
//! typo is an error with its place rather than a silently ignored setting.
//! Relative paths are resolved against the configuration file's folder.
//!
//! An option has the name of the Rust setting it becomes, and its default
//! is that setting's default: the `defaults` below read them from the
//! library types (`etl_source::FileSourceOptions`,
//! `etl_sink::SinkDriverConfig`, `etl_checkpoint::CheckpointOptions`, ...),
//! so the two cannot drift apart. Policies that are one enum in the
//! library (`LineFormat`, `EofPolicy`, `ReplacedPolicy`, `PoisonPolicy`,
//! `PermanentErrorPolicy`, `FsyncPolicy`, `FailurePolicy`) are that enum
//! here. The option structs are named `*Options` where a library type of
//! the same concept exists.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::zeroize::Zeroize;
use secrecy::{CloneableSecret, ExposeSecret, SecretBox};
use serde::Deserialize;

// The policies are the library's own enums.
pub use etl_checkpoint::FailurePolicy;
pub use etl_sink::{FsyncPolicy, PermanentErrorPolicy};
pub use etl_source::{EofPolicy, LineFormat, PoisonPolicy, ReplacedPolicy};

// A comparison in a `filter` transform is the engine's own.
pub use etl_json::ops::CompareOp;

use super::units::{ByteSize, duration, opt_duration};
use crate::registry::{BoxError, BoxFuture, BuiltSink, BuiltSource, Component};

/// A whole pipeline: one source, transforms in order, one or more sinks.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where records come from.
    pub source: SourceConfig,
    /// What happens to each record, in order.
    pub transforms: Vec<TransformConfig>,
    /// Where records go: every record to every sink, unless their
    /// `when` and `[routing]` say otherwise.
    pub sinks: Vec<SinkConfig>,
    /// How the sinks' conditions combine.
    pub routing: RoutingConfig,
    /// Where bad records go, if anywhere.
    pub dead_letter: Option<SinkKind>,
    /// What to do when delivery fails.
    pub delivery: DeliveryConfig,
    /// Bounds on in-flight data.
    pub limits: LimitsConfig,
    /// Commit policy and offset store.
    pub checkpoint: CheckpointOptions,
    /// What the file does that works but is likely a mistake (VRL's
    /// compiler warnings about a program), each at its place. `etl
    /// validate` prints them and `etl run` logs them; neither stops for
    /// them.
    pub warnings: Vec<super::ConfigProblem>,
}

impl Config {
    /// The checkpointer's configuration: `[checkpoint]`'s commit
    /// interval, deadlines and shutdown timeout with `[limits]`.
    #[must_use]
    pub fn checkpoint_config(&self) -> etl_checkpoint::CheckpointConfig {
        etl_checkpoint::CheckpointConfig {
            commit_interval: self.checkpoint.commit_interval,
            revoke_deadline: self.checkpoint.revoke_deadline,
            shutdown_timeout: self.checkpoint.shutdown_timeout,
            limits: etl_checkpoint::InFlightLimits {
                max_in_flight_batches_per_partition: self
                    .limits
                    .max_in_flight_batches_per_partition,
                max_in_flight_bytes_per_partition: self.limits.max_in_flight_bytes_per_partition.0,
                max_in_flight_batches: self.limits.max_in_flight_batches,
                max_in_flight_bytes: self.limits.max_in_flight_bytes.0,
            },
        }
    }
}

/// The `[source]` section: a source of a type registered in the
/// [`Registry`](crate::Registry) (the built-ins are registered there
/// too), built by its factory.
pub type SourceConfig = Component<BuiltSource>;

/// A component's own table, read by its factory. It may hold passwords (Kafka `properties`, a
/// PostgreSQL `url` or `password`), so it is held as a secret: `Debug`
/// prints its keys only, it is zeroed when dropped, and reading it takes
/// [`ExposeSecret::expose_secret`], for the connector alone.
#[derive(Clone)]
pub struct ConnectorTable(SecretBox<SecretTable>);

/// The table inside a [`ConnectorTable`].
#[derive(Clone, Default)]
pub struct SecretTable(toml::Table);

impl ConnectorTable {
    /// Hold `table` as a secret.
    #[must_use]
    pub fn new(table: toml::Table) -> Self {
        ConnectorTable(SecretBox::new(Box::new(SecretTable(table))))
    }
}

impl ExposeSecret<toml::Table> for ConnectorTable {
    fn expose_secret(&self) -> &toml::Table {
        &self.0.expose_secret().0
    }
}

impl From<toml::Table> for ConnectorTable {
    fn from(table: toml::Table) -> Self {
        ConnectorTable::new(table)
    }
}

impl fmt::Debug for ConnectorTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnectorTable")
            .field(&self.expose_secret().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl fmt::Debug for SecretTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretTable([REDACTED])")
    }
}

impl PartialEq for ConnectorTable {
    fn eq(&self, other: &Self) -> bool {
        self.expose_secret() == other.expose_secret()
    }
}

impl<'de> Deserialize<'de> for ConnectorTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        toml::Table::deserialize(deserializer).map(ConnectorTable::new)
    }
}

impl Zeroize for SecretTable {
    fn zeroize(&mut self) {
        fn wipe(value: &mut toml::Value) {
            match value {
                toml::Value::String(s) => s.zeroize(),
                toml::Value::Array(a) => a.iter_mut().for_each(wipe),
                toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| wipe(v)),
                _ => {}
            }
        }
        self.0.iter_mut().for_each(|(_, v)| wipe(v));
        self.0.clear();
    }
}

impl CloneableSecret for SecretTable {}

/// `type = "file"` source options.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSourceOptions {
    /// The source's name, part of every record's idempotency key
    /// (default `file`).
    pub name: Option<String>,
    /// Paths or glob patterns.
    pub paths: Vec<String>,
    /// Line format.
    #[serde(default)]
    pub format: LineFormat,
    /// Longest line accepted; longer lines become dead letters.
    #[serde(default = "defaults::max_line_bytes")]
    pub max_line_bytes: ByteSize,
    /// What to do with an unterminated last line.
    #[serde(default)]
    pub eof: EofPolicy,
    /// Keep reading as files grow instead of stopping at their end.
    #[serde(default)]
    pub follow: bool,
    /// Largest poll batch, in records.
    #[serde(default = "defaults::file_max_batch_records")]
    pub max_batch_records: usize,
    /// Most input files open at once.
    #[serde(default = "defaults::max_open_files")]
    pub max_open_files: usize,
    /// What to do with an input replaced, rewritten or truncated since
    /// its offsets were committed.
    #[serde(default)]
    pub on_replaced: ReplacedPolicy,
}

/// `type = "generator"` source options.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorOptions {
    /// The source's name, part of every record's idempotency key
    /// (default `generator`).
    pub name: Option<String>,
    /// Records to generate per partition; unbounded when absent.
    pub records_per_partition: Option<u64>,
    /// Varies the generated content; the same seed gives the same records.
    #[serde(default)]
    pub seed: u64,
    /// Partitions to spread them over.
    #[serde(default = "defaults::partitions")]
    pub partitions: u32,
    /// Records per second in all; unlimited when absent.
    pub rate: Option<u64>,
    /// Largest poll batch, in records.
    #[serde(default = "defaults::generator_max_batch_records")]
    pub max_batch_records: usize,
}

/// One `[[transforms]]` entry.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TransformConfig {
    /// Require the value to be a JSON object; others are dead letters.
    ParseJson,
    /// Keep records whose field compares true, or for which the VRL
    /// `condition` is true; drop (count as filtered) the others.
    Filter {
        /// Dotted path of the field (`user.id`, `items.0.sku`); empty
        /// when a `condition` is given.
        #[serde(default)]
        field: String,
        /// The comparison (`exists` when a `condition` is given).
        #[serde(default = "defaults::compare_op")]
        op: CompareOp,
        /// The value compared against (unused by `exists`).
        #[serde(default)]
        value: Option<toml::Value>,
        /// A VRL boolean expression, instead of `field`, `op` and `value`.
        #[serde(default)]
        condition: Option<String>,
    },
    /// Run a program in the Vector Remap Language on each record.
    Remap {
        /// The program's text.
        #[serde(default)]
        source: Option<String>,
        /// A file holding the program (relative to the configuration
        /// file), instead of `source`.
        #[serde(default)]
        file: Option<PathBuf>,
        /// A runtime error sends the record to the dead-letter path
        /// (`true`, the default) or halts the run (`false`).
        #[serde(default = "defaults::yes")]
        drop_on_error: bool,
    },
    /// Set a field to a constant.
    AddField {
        /// Dotted path of the field.
        field: String,
        /// Its value.
        value: toml::Value,
    },
    /// Rename a field; records without it pass unchanged.
    RenameField {
        /// Dotted path of the field.
        from: String,
        /// New name (a path at the same or another place).
        to: String,
    },
    /// Remove a field; records without it pass unchanged.
    DropField {
        /// Dotted path of the field.
        field: String,
    },
    /// A type registered in a [`Registry`](crate::Registry), built by its
    /// factory.
    #[serde(skip)]
    Custom(Component<Box<dyn crate::Transform>>),
}

/// One `[[sinks]]` entry: the sink and how it is driven.
#[derive(Clone, Debug, PartialEq)]
pub struct SinkConfig {
    /// Name in metrics and logs.
    pub name: String,
    /// Which sink.
    pub kind: SinkKind,
    /// Batching, concurrency, retry.
    pub options: SinkOptions,
    /// Which records it takes (`when`) and its own steps (`transforms`).
    pub route: SinkRoute,
}

/// A sink's `when` and `transforms`: which records it takes, and what is
/// done to its copy of them after the shared `[[transforms]]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SinkRoute {
    /// The condition, as a `filter` step: a VRL `condition`, or a
    /// declarative `field`, `op` and `value`. `None`: every record (or,
    /// with `[routing] mode = "exclusive"`, every record no sink before
    /// took).
    pub when: Option<TransformConfig>,
    /// Steps of this sink's own, in order.
    pub transforms: Vec<TransformConfig>,
}

impl SinkRoute {
    /// Whether the sink takes every record unchanged.
    #[must_use]
    pub fn is_plain(&self) -> bool {
        self.when.is_none() && self.transforms.is_empty()
    }
}

/// The `[routing]` section: how the sinks' `when` conditions combine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    /// `all` (every sink whose condition matches) or `exclusive` (the
    /// first one, in the file's order).
    #[serde(default)]
    pub mode: RouteMode,
    /// The sink that takes the records no condition matched. Without
    /// one, they count as unrouted and go nowhere (their offsets commit).
    #[serde(default)]
    pub unmatched: Option<String>,
}

/// The sink-specific part of a `[[sinks]]` entry or of `[dead_letter]`:
/// a sink of a type registered in the [`Registry`](crate::Registry) (the
/// built-ins are registered there too), built by its factory.
pub type SinkKind = Component<BoxFuture<Result<BuiltSink, BoxError>>>;

/// `type = "file"` sink options.
///
/// Read from the sink's table as the file writes it: `fsync = "batch"`
/// (the default), or `fsync = "interval"` with `fsync_interval = "5ms"`,
/// two keys for one [`FsyncPolicy`], checked together at their place
/// when the configuration is loaded.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "FileSinkTable")]
pub struct FileSinkOptions {
    /// Output file; with `{field}` placeholders, one output per value
    /// (`out/{level}/events.ndjson`).
    pub path: PathBuf,
    /// How a record becomes a line (`encoding`): its value as one JSON
    /// document (`ndjson`, checked unless the steps or the source vouch
    /// for it), or its value's bytes as they are (`lines`).
    pub encoding: LineFormat,
    /// When to fsync: [`FsyncPolicy::EveryBatch`] for `fsync = "batch"`,
    /// [`FsyncPolicy::Interval`] for `fsync = "interval"` with its
    /// `fsync_interval`.
    pub fsync: FsyncPolicy,
    /// Start a new file past this size.
    pub rotate_bytes: Option<ByteSize>,
    /// Start a new file after this long.
    pub rotate_interval: Option<Duration>,
    /// Store progress with the data and resume from it: every record
    /// exactly once in the file, even after a crash. Needs a single sink.
    pub exactly_once: bool,
    /// With a templated `path`: outputs open at once (the least recently
    /// written one is closed to make room).
    pub max_open_outputs: usize,
    /// With a templated `path`: an output nothing was written to for this
    /// long is closed.
    pub close_idle_after: Duration,
}

impl FileSinkOptions {
    /// The configuration of the [`FileSink`](etl_sink::FileSink) (or of
    /// each output of a templated `path`) these options stand for.
    #[must_use]
    pub fn file_config(&self) -> etl_sink::FileSinkConfig {
        etl_sink::FileSinkConfig {
            fsync: self.fsync,
            rotate_bytes: self.rotate_bytes.map(|b| b.0),
            rotate_after: self.rotate_interval,
            exactly_once: self.exactly_once,
        }
    }
}

/// A file sink's table as the file writes it, what the `file` type's
/// check reads: each key where the file has it, so that a problem is
/// shown at its key.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileSinkTable {
    pub(crate) path: PathBuf,
    #[serde(default, deserialize_with = "line_encoding")]
    pub(crate) encoding: LineFormat,
    #[serde(default)]
    pub(crate) fsync: FsyncKey,
    #[serde(default, deserialize_with = "opt_duration")]
    pub(crate) fsync_interval: Option<Duration>,
    pub(crate) rotate_bytes: Option<ByteSize>,
    #[serde(default, deserialize_with = "opt_duration")]
    pub(crate) rotate_interval: Option<Duration>,
    #[serde(default)]
    pub(crate) exactly_once: bool,
    #[serde(default = "defaults::max_open_outputs")]
    pub(crate) max_open_outputs: usize,
    #[serde(default = "defaults::close_idle_after", deserialize_with = "duration")]
    pub(crate) close_idle_after: Duration,
}

/// Why a file sink takes no `encoding = "parquet"`.
pub(crate) const PARQUET_IS_WRITTEN_WHOLE: &str = "a file sink appends lines, and a Parquet file is readable only once its footer is written: \
     Parquet goes to a folder as whole objects with type = \"object_store\" and [sinks.store] kind = \"local\" \
     (see docs/object-storage.md)";

/// A file sink's `encoding`: one of [`LineFormat`]'s names, and for
/// `"parquet"` a pointer to the sink that writes it.
fn line_encoding<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<LineFormat, D::Error> {
    use serde::de::IntoDeserializer;
    let name = String::deserialize(deserializer)?;
    if name == "parquet" {
        return Err(serde::de::Error::custom(PARQUET_IS_WRITTEN_WHOLE));
    }
    LineFormat::deserialize(name.into_deserializer())
}

/// The `fsync` key of a file sink's table: which [`FsyncPolicy`], the
/// interval of which is `fsync_interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsyncKey {
    /// [`FsyncPolicy::EveryBatch`].
    #[default]
    Batch,
    /// [`FsyncPolicy::Interval`], of `fsync_interval`.
    Interval,
}

/// Why a file sink's table gives no [`FileSinkOptions`].
pub(crate) const INTERVAL_NEEDS_ITS_LENGTH: &str = "fsync = \"interval\" needs fsync_interval";

impl TryFrom<FileSinkTable> for FileSinkOptions {
    type Error = &'static str;

    fn try_from(table: FileSinkTable) -> Result<Self, Self::Error> {
        let fsync = match (table.fsync, table.fsync_interval) {
            (FsyncKey::Batch, _) => FsyncPolicy::EveryBatch,
            (FsyncKey::Interval, Some(every)) => FsyncPolicy::Interval(every),
            (FsyncKey::Interval, None) => return Err(INTERVAL_NEEDS_ITS_LENGTH),
        };
        Ok(FileSinkOptions {
            path: table.path,
            encoding: table.encoding,
            fsync,
            rotate_bytes: table.rotate_bytes,
            rotate_interval: table.rotate_interval,
            exactly_once: table.exactly_once,
            max_open_outputs: table.max_open_outputs,
            close_idle_after: table.close_idle_after,
        })
    }
}

/// `type = "stdout"` sink options.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkOptions {
    /// How a record becomes a line (`encoding`): its value as one JSON
    /// document (`ndjson`, checked unless the steps or the source vouch
    /// for it), or its value's bytes as they are (`lines`).
    #[serde(default)]
    pub encoding: LineFormat,
    /// Write even when standard output is the null device; see
    /// [`StdoutSinkConfig::allow_null_device`](etl_sink::StdoutSinkConfig::allow_null_device).
    #[serde(default = "defaults::allow_null_device")]
    pub allow_null_device: bool,
}

impl Default for StdoutSinkOptions {
    fn default() -> Self {
        StdoutSinkOptions {
            encoding: LineFormat::default(),
            allow_null_device: defaults::allow_null_device(),
        }
    }
}

/// `type = "blackhole"` sink options (none).
#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BlackholeSinkOptions {}

/// Batching, concurrency and retry of one sink: the
/// [`SinkDriverConfig`](etl_sink::SinkDriverConfig) of its driver, under
/// the same names and with its defaults.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkOptions {
    /// Largest write, in records.
    #[serde(default = "defaults::batch_max_records")]
    pub batch_max_records: usize,
    /// Largest write, in bytes.
    #[serde(default = "defaults::batch_max_bytes")]
    pub batch_max_bytes: ByteSize,
    /// How long a partial batch may wait for more records.
    #[serde(default = "defaults::linger", deserialize_with = "duration")]
    pub linger: Duration,
    /// Writes in flight at once.
    #[serde(default = "defaults::concurrency")]
    pub concurrency: usize,
    /// Retrying a retryable error (`[sinks.retry]`).
    #[serde(default)]
    pub retry: RetryOptions,
    /// Time limit of one write attempt.
    #[serde(default = "defaults::write_timeout", deserialize_with = "duration")]
    pub write_timeout: Duration,
    /// What to do with a batch that fails for good because of its records.
    #[serde(default)]
    pub on_permanent_error: PermanentErrorPolicy,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            batch_max_records: defaults::batch_max_records(),
            batch_max_bytes: defaults::batch_max_bytes(),
            linger: defaults::linger(),
            concurrency: defaults::concurrency(),
            retry: RetryOptions::default(),
            write_timeout: defaults::write_timeout(),
            on_permanent_error: PermanentErrorPolicy::default(),
        }
    }
}

impl SinkOptions {
    /// The driver configuration these options stand for.
    #[must_use]
    pub fn driver_config(&self) -> etl_sink::SinkDriverConfig {
        etl_sink::SinkDriverConfig {
            batch_max_records: self.batch_max_records,
            batch_max_bytes: usize::try_from(self.batch_max_bytes.0).unwrap_or(usize::MAX),
            linger: self.linger,
            concurrency: self.concurrency,
            retry: self.retry.policy(),
            write_timeout: Some(self.write_timeout),
            on_permanent_error: self.on_permanent_error,
            ..etl_sink::SinkDriverConfig::default()
        }
    }
}

/// A sink's `[sinks.retry]` table: the
/// [`RetryPolicy`](etl_sink::RetryPolicy) of its driver, under the same
/// names and with its defaults.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryOptions {
    /// Upper bound of the first wait.
    #[serde(default = "defaults::initial_backoff", deserialize_with = "duration")]
    pub initial_backoff: Duration,
    /// Upper bound of any wait.
    #[serde(default = "defaults::max_backoff", deserialize_with = "duration")]
    pub max_backoff: Duration,
    /// Give up when the next wait would end later than this after the
    /// first attempt.
    #[serde(default = "defaults::max_elapsed", deserialize_with = "duration")]
    pub max_elapsed: Duration,
    /// Give up after this many retries, if set.
    #[serde(default)]
    pub max_retries: Option<u32>,
}

impl Default for RetryOptions {
    fn default() -> Self {
        let policy = etl_sink::RetryPolicy::default();
        RetryOptions {
            initial_backoff: policy.initial_backoff,
            max_backoff: policy.max_backoff,
            max_elapsed: policy.max_elapsed,
            max_retries: policy.max_retries,
        }
    }
}

impl RetryOptions {
    /// The retry policy these options stand for.
    #[must_use]
    pub fn policy(&self) -> etl_sink::RetryPolicy {
        etl_sink::RetryPolicy {
            initial_backoff: self.initial_backoff,
            max_backoff: self.max_backoff,
            max_elapsed: self.max_elapsed,
            max_retries: self.max_retries,
        }
    }
}

/// How the conditions of several sinks (`when`) combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// A record goes to every sink whose condition it matches, and to
    /// every sink without one.
    #[default]
    All,
    /// A record goes to the first sink, in the file's order, whose
    /// condition it matches; a sink without a condition matches every
    /// record.
    Exclusive,
}

/// The `[delivery]` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// After a failed batch.
    #[serde(default)]
    pub on_failure: FailurePolicy,
    /// Replays of one range before it counts as poison.
    #[serde(default = "defaults::max_replays")]
    pub max_replays: u32,
    /// What to do with a poison record.
    #[serde(default)]
    pub poison: PoisonPolicy,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            on_failure: FailurePolicy::Replay,
            max_replays: defaults::max_replays(),
            poison: PoisonPolicy::DeadLetter,
        }
    }
}

/// The `[limits]` section: in-flight bounds (batches between source and
/// durable write).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Poll batches in flight, in all.
    #[serde(default = "defaults::max_in_flight_batches")]
    pub max_in_flight_batches: u32,
    /// Payload bytes in flight, in all.
    #[serde(default = "defaults::max_in_flight_bytes")]
    pub max_in_flight_bytes: ByteSize,
    /// Poll batches in flight per partition.
    #[serde(default = "defaults::max_in_flight_batches_per_partition")]
    pub max_in_flight_batches_per_partition: u32,
    /// Payload bytes in flight per partition.
    #[serde(default = "defaults::max_in_flight_bytes_per_partition")]
    pub max_in_flight_bytes_per_partition: ByteSize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_in_flight_batches: defaults::max_in_flight_batches(),
            max_in_flight_bytes: defaults::max_in_flight_bytes(),
            max_in_flight_batches_per_partition: defaults::max_in_flight_batches_per_partition(),
            max_in_flight_bytes_per_partition: defaults::max_in_flight_bytes_per_partition(),
        }
    }
}

/// Where committed offsets are kept.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StoreConfig {
    /// A crash-safe local file store in this folder.
    File {
        /// The folder holding the store's files.
        path: PathBuf,
    },
    /// In memory only: every run starts from the beginning.
    Memory,
    /// The source keeps offsets itself (a Kafka consumer group).
    Source,
}

/// The `[checkpoint]` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointOptions {
    /// How often delivered watermarks are committed.
    #[serde(default = "defaults::commit_interval", deserialize_with = "duration")]
    pub commit_interval: Duration,
    /// How long a revoke waits for in-flight batches before committing.
    #[serde(default = "defaults::revoke_deadline", deserialize_with = "duration")]
    pub revoke_deadline: Duration,
    /// How long a graceful stop may take before it gives up waiting.
    #[serde(default = "defaults::shutdown_timeout", deserialize_with = "duration")]
    pub shutdown_timeout: Duration,
    /// The offset store (default: a file store in `.etl-state` beside the
    /// configuration file).
    #[serde(default = "defaults::store")]
    pub store: StoreConfig,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        CheckpointOptions {
            commit_interval: defaults::commit_interval(),
            revoke_deadline: defaults::revoke_deadline(),
            shutdown_timeout: defaults::shutdown_timeout(),
            store: defaults::store(),
        }
    }
}

/// Every default reads the library setting the option becomes.
pub(crate) mod defaults {
    use super::*;

    fn file_source() -> etl_source::FileSourceConfig {
        etl_source::FileSourceConfig::default()
    }
    fn sink_driver() -> etl_sink::SinkDriverConfig {
        etl_sink::SinkDriverConfig::default()
    }
    fn checkpoint() -> etl_checkpoint::CheckpointConfig {
        etl_checkpoint::CheckpointConfig::default()
    }

    pub(crate) fn max_line_bytes() -> ByteSize {
        ByteSize(file_source().max_line_bytes as u64)
    }
    pub(crate) fn file_max_batch_records() -> usize {
        file_source().max_batch_records
    }
    pub(crate) fn max_open_files() -> usize {
        file_source().max_open_files
    }
    pub(crate) fn generator_max_batch_records() -> usize {
        etl_source::GeneratorConfig::default().max_batch_records
    }
    pub(crate) fn partitions() -> u32 {
        etl_source::GeneratorConfig::default().partitions
    }
    pub(crate) fn batch_max_records() -> usize {
        sink_driver().batch_max_records
    }
    pub(crate) fn batch_max_bytes() -> ByteSize {
        ByteSize(sink_driver().batch_max_bytes as u64)
    }
    pub(crate) fn linger() -> Duration {
        sink_driver().linger
    }
    pub(crate) fn concurrency() -> usize {
        sink_driver().concurrency
    }
    pub(crate) fn max_open_outputs() -> usize {
        etl_sink::FileOutputsConfig::default().max_open
    }
    pub(crate) fn close_idle_after() -> Duration {
        etl_sink::FileOutputsConfig::default().close_idle_after
    }
    pub(crate) fn write_timeout() -> Duration {
        sink_driver()
            .write_timeout
            .unwrap_or(Duration::from_secs(30))
    }
    pub(crate) fn initial_backoff() -> Duration {
        etl_sink::RetryPolicy::default().initial_backoff
    }
    pub(crate) fn max_backoff() -> Duration {
        etl_sink::RetryPolicy::default().max_backoff
    }
    pub(crate) fn max_elapsed() -> Duration {
        etl_sink::RetryPolicy::default().max_elapsed
    }
    pub(crate) fn allow_null_device() -> bool {
        etl_sink::StdoutSinkConfig::default().allow_null_device
    }
    pub(crate) fn yes() -> bool {
        true
    }
    pub(crate) fn compare_op() -> CompareOp {
        CompareOp::Exists
    }
    pub(crate) fn max_replays() -> u32 {
        etl_source::SourceDriverConfig::default().max_replays
    }
    pub(crate) fn max_in_flight_batches() -> u32 {
        checkpoint().limits.max_in_flight_batches
    }
    pub(crate) fn max_in_flight_bytes() -> ByteSize {
        ByteSize(checkpoint().limits.max_in_flight_bytes)
    }
    pub(crate) fn max_in_flight_batches_per_partition() -> u32 {
        checkpoint().limits.max_in_flight_batches_per_partition
    }
    pub(crate) fn max_in_flight_bytes_per_partition() -> ByteSize {
        ByteSize(checkpoint().limits.max_in_flight_bytes_per_partition)
    }
    pub(crate) fn commit_interval() -> Duration {
        checkpoint().commit_interval
    }
    pub(crate) fn revoke_deadline() -> Duration {
        checkpoint().revoke_deadline
    }
    pub(crate) fn shutdown_timeout() -> Duration {
        checkpoint().shutdown_timeout
    }
    pub(crate) fn store() -> StoreConfig {
        StoreConfig::File {
            path: PathBuf::from(".etl-state"),
        }
    }
}
