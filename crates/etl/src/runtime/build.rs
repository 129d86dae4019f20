//! Building a pipeline from a configuration file's [`Config`].

use std::sync::Arc;

use etl_checkpoint::{FileStore, MemoryStore, OffsetStore};
use etl_record::SourceId;
use etl_sink::{
    BlackholeSink, Encoder, FileSink, FileSinkConfig, FsyncPolicy, NdjsonEncoder, RawLinesEncoder,
    Sink, SinkDriver, StdoutSink, StdoutSinkConfig,
};
use etl_source::{
    FileSource, FileSourceConfig, GeneratorConfig, GeneratorSource, LineFormat, Source,
    SourceDriverConfig,
};

use super::{Pipeline, PipelineBuilder, PipelineError};
use crate::config::{
    Config, Encoding, FsyncMode, SinkConfig, SinkKind, SourceConfig, StoreConfig, TransformConfig,
};
use crate::transform::try_chain_from_config;

/// Build the pipeline a configuration describes: open its source, sinks
/// and offset store.
///
/// # Errors
///
/// A part could not be opened (a missing input file, an unwritable output,
/// a corrupt offset store), or the configuration names a connector this
/// build does not include.
pub async fn pipeline_from_config(config: &Config) -> Result<Pipeline, PipelineError> {
    builder_from_config(config, values_are_json(config))
        .await?
        .build()
}

impl PipelineBuilder {
    /// The builder of the pipeline a configuration describes, its source,
    /// sinks and offset store opened, to take more Rust before it is
    /// built: a transform appended after the file's
    /// ([`transform`](Self::transform)), another sink, a dead-letter sink
    /// in place of the file's.
    ///
    /// Unlike [`pipeline_from_config`], the sinks check that every value
    /// they encode as NDJSON is JSON, since a step added here may change
    /// what the file's steps guaranteed; a value that is not goes to the
    /// dead-letter path.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use etl::{PipelineBuilder, load_config, map, shutdown_signal};
    /// use etl_record::Record;
    ///
    /// let config = load_config("pipeline.toml".as_ref())?;
    /// let pipeline = PipelineBuilder::from_config(&config)
    ///     .await?
    ///     .transform(map("stamp", |mut record: Record| {
    ///         record.headers.push("seen-by", Some(Bytes::from_static(b"rust")));
    ///         Ok(record)
    ///     }))
    ///     .build()?;
    /// pipeline.run(shutdown_signal()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`pipeline_from_config`].
    pub async fn from_config(config: &Config) -> Result<PipelineBuilder, PipelineError> {
        builder_from_config(config, false).await
    }
}

/// The builder of `config`'s pipeline; `trusted`: the NDJSON encoders may
/// take every value as JSON without checking it.
async fn builder_from_config(
    config: &Config,
    trusted: bool,
) -> Result<PipelineBuilder, PipelineError> {
    let mut builder = Pipeline::builder()
        .transforms(try_chain_from_config(&config.transforms).map_err(PipelineError::Invalid)?)
        .checkpoint(config.checkpoint_config())
        .source_driver(SourceDriverConfig {
            max_replays: config.delivery.max_replays.max(1),
            poison: config.delivery.poison,
            ..SourceDriverConfig::default()
        })
        .on_failure(config.delivery.on_failure);

    builder = with_source(builder, config)?;
    let stored = StoredProgressCheck::new(config)?;
    for sink in &config.sinks {
        #[cfg(feature = "postgres")]
        let sink = &group_shares_progress(config, sink);
        builder = with_sink(builder, sink, trusted, &stored).await?;
    }
    if let Some(kind) = &config.dead_letter {
        let sink = open_sink(kind, "dead_letter").await?.shared();
        builder = builder.dead_letter(sink);
    }
    Ok(builder)
}

fn open_store(store: &StoreConfig) -> Result<Box<dyn OffsetStore>, PipelineError> {
    Ok(match store {
        StoreConfig::File { path } => Box::new(FileStore::open(path)?),
        StoreConfig::Memory => Box::new(MemoryStore::new()),
        StoreConfig::Source => {
            return Err(PipelineError::Invalid(
                "store = \"source\" needs a source that keeps offsets (kafka)".to_owned(),
            ));
        }
    })
}

/// The source and, unless the source keeps offsets itself, the offset
/// store.
fn with_source(
    builder: PipelineBuilder,
    config: &Config,
) -> Result<PipelineBuilder, PipelineError> {
    let source: Box<dyn Source> = match &config.source {
        SourceConfig::File(f) => Box::new(FileSource::open(FileSourceConfig {
            name: SourceId::new(f.name.as_deref().unwrap_or("file")),
            paths: f.paths.clone(),
            format: match f.format {
                // The JSON steps parse every line anyway and send what is
                // not a JSON object to the dead-letter path with the
                // parser's message: checking at the source as well would
                // parse each line twice.
                LineFormat::Ndjson if first_step_reads_json(config) => LineFormat::Lines,
                format => format,
            },
            max_line_bytes: usize::try_from(f.max_line_bytes.0).unwrap_or(usize::MAX),
            max_batch_records: f.max_batch_records,
            eof: f.eof,
            follow: f.follow,
            max_open_files: f.max_open_files,
            on_replaced: f.on_replaced,
            // Which file each partition id stands for is kept next to the
            // offsets it gives meaning to.
            state_dir: match &config.checkpoint.store {
                StoreConfig::File { path } => Some(path.clone()),
                StoreConfig::Memory | StoreConfig::Source => None,
            },
            ..FileSourceConfig::default()
        })?),
        SourceConfig::Generator(g) => Box::new(GeneratorSource::new(GeneratorConfig {
            name: SourceId::new(g.name.as_deref().unwrap_or("generator")),
            partitions: g.partitions,
            records_per_partition: g.records_per_partition,
            max_batch_records: g.max_batch_records,
            rate: g.rate.map(|r| r as f64),
            seed: g.seed,
        })?),
        // Offsets live in the consumer group: it is the offset store.
        #[cfg(feature = "kafka")]
        SourceConfig::Kafka(table) => {
            return crate::connectors::kafka::with_source(builder, table, &config.checkpoint);
        }
        #[cfg(not(feature = "kafka"))]
        SourceConfig::Kafka(_) => {
            return Err(PipelineError::Invalid(
                "this build of etl has no Kafka source".to_owned(),
            ));
        }
        SourceConfig::Custom(custom) => custom
            .build("source")
            .map_err(|e| PipelineError::Invalid(format!("[source]: {e}")))?,
    };
    Ok(builder
        .offset_store(open_store(&config.checkpoint.store)?)
        .source(source))
}

/// Whether every value reaching the sinks is known to be valid JSON: the
/// built-in transforms (all JSON steps, fused into one stage that runs
/// last) parse every record they keep, the NDJSON file source checks every
/// line, and the generator writes JSON. The sinks' NDJSON encoders then
/// skip their own check.
/// The first step is a built-in one, which parses every record as JSON
/// and dead-letters what is not (a registered step may not).
fn first_step_reads_json(config: &Config) -> bool {
    config
        .transforms
        .first()
        .is_some_and(|t| !matches!(t, TransformConfig::Custom(_)))
}

fn values_are_json(config: &Config) -> bool {
    // A registered transform may write anything.
    if config
        .transforms
        .iter()
        .any(|t| matches!(t, TransformConfig::Custom(_)))
    {
        return false;
    }
    !config.transforms.is_empty()
        || matches!(
            &config.source,
            SourceConfig::Generator(_)
                | SourceConfig::File(crate::config::FileSourceOptions {
                    format: LineFormat::Ndjson,
                    ..
                })
        )
}

fn encoder(encoding: Encoding, trusted: bool) -> Box<dyn Encoder> {
    match encoding {
        Encoding::Ndjson if trusted => Box::new(NdjsonEncoder::trusted()),
        Encoding::Ndjson => Box::new(NdjsonEncoder::new()),
        Encoding::Lines => Box::new(RawLinesEncoder::new()),
    }
}

/// An opened sink: shareable, or a file sink that keeps its progress (which
/// is the only sink of its pipeline, so it is not shared).
enum Opened {
    Shared(Arc<dyn Sink>),
    ExactlyOnce(FileSink),
    #[cfg(feature = "postgres")]
    PostgresExactlyOnce(Box<etl_postgres::PostgresSink>),
}

impl Opened {
    fn shared(self) -> Arc<dyn Sink> {
        match self {
            Opened::Shared(s) => s,
            Opened::ExactlyOnce(f) => Arc::new(f),
            #[cfg(feature = "postgres")]
            Opened::PostgresExactlyOnce(p) => Arc::new(*p),
        }
    }
}

/// The members of one Kafka consumer group write one PostgreSQL progress
/// (the group keeps their partitions apart), so behind a Kafka source a
/// PostgreSQL sink takes its progress lock shared unless its table says
/// otherwise; behind any other source it is exclusive.
#[cfg(feature = "postgres")]
fn group_shares_progress(config: &Config, sink: &SinkConfig) -> SinkConfig {
    let mut sink = sink.clone();
    if let (SourceConfig::Kafka(_), SinkKind::Postgres(table)) = (&config.source, &mut sink.kind) {
        use secrecy::ExposeSecret;
        let mut shared = table.expose_secret().clone();
        shared
            .entry("progress_lock")
            .or_insert_with(|| toml::Value::String("shared".to_owned()));
        *table = crate::config::ConnectorTable::new(shared);
    }
    sink
}

/// Open the sink of a `[[sinks]]` entry or of `[dead_letter]`.
async fn open_sink(kind: &SinkKind, name: &str) -> Result<Opened, PipelineError> {
    let sink_error = |source: etl_sink::SinkError| PipelineError::Sink {
        name: name.to_owned(),
        source: source.into(),
    };
    Ok(match kind {
        SinkKind::File(f) => {
            if let Some(dir) = f.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| PipelineError::Sink {
                    name: name.to_owned(),
                    source: etl_sink::SinkError::Io {
                        op: "create the output folder",
                        path: dir.to_owned(),
                        source,
                    }
                    .into(),
                })?;
            }
            let file = FileSink::open(
                &f.path,
                FileSinkConfig {
                    fsync: match (f.fsync, f.fsync_interval) {
                        (FsyncMode::Interval, Some(every)) => FsyncPolicy::Interval(every),
                        _ => FsyncPolicy::EveryBatch,
                    },
                    rotate_bytes: f.rotate_bytes.map(|b| b.0),
                    rotate_after: f.rotate_interval,
                    exactly_once: f.exactly_once,
                },
            )
            .await
            .map_err(sink_error)?;
            if f.exactly_once {
                Opened::ExactlyOnce(file)
            } else {
                Opened::Shared(Arc::new(file))
            }
        }
        // Refused when no record written there could be read: standard
        // output closed, read-only, or the null device (exit 74).
        SinkKind::Stdout(s) => Opened::Shared(Arc::new(
            StdoutSink::open(StdoutSinkConfig {
                allow_null_device: s.allow_null_device,
            })
            .map_err(sink_error)?,
        )),
        SinkKind::Blackhole(_) => Opened::Shared(Arc::new(BlackholeSink::new())),
        #[cfg(feature = "kafka")]
        SinkKind::Kafka(table) => Opened::Shared(crate::connectors::kafka::open_sink(table, name)?),
        #[cfg(not(feature = "kafka"))]
        SinkKind::Kafka(_) => {
            return Err(PipelineError::Invalid(format!(
                "sink {name:?}: this build of etl has no such connector"
            )));
        }
        #[cfg(feature = "postgres")]
        SinkKind::Postgres(table) => {
            let sink = crate::connectors::open_postgres(table, name).await?;
            if sink.config().exactly_once {
                Opened::PostgresExactlyOnce(Box::new(sink))
            } else {
                Opened::Shared(Arc::new(sink))
            }
        }
        #[cfg(not(feature = "postgres"))]
        SinkKind::Postgres(_) => {
            return Err(PipelineError::Invalid(format!(
                "sink {name:?}: this build of etl has no such connector"
            )));
        }
        SinkKind::Custom(custom) => Opened::Shared(Arc::from(
            custom
                .build(name)
                .map_err(|e| PipelineError::Invalid(format!("sink {name:?}: {e}")))?,
        )),
    })
}

/// What an exactly-once sink's stored progress must satisfy for this
/// source before it is applied.
enum StoredProgressCheck {
    Any,
    /// A Kafka source: no partition id of the mapping by topic index that
    /// earlier versions stored (it may name another partition now).
    #[cfg(feature = "kafka")]
    Kafka(etl_kafka::PartitionMap),
}

impl StoredProgressCheck {
    fn new(config: &Config) -> Result<Self, PipelineError> {
        match &config.source {
            #[cfg(feature = "kafka")]
            SourceConfig::Kafka(table) => {
                let (_, source) = crate::connectors::kafka::source_config(table)?;
                etl_kafka::PartitionMap::new(source.topics)
                    .map(StoredProgressCheck::Kafka)
                    .map_err(|e| PipelineError::Invalid(format!("[source] {e}")))
            }
            _ => Ok(StoredProgressCheck::Any),
        }
    }

    #[cfg_attr(
        not(feature = "kafka"),
        allow(unused_variables, reason = "only Kafka partition ids are checked")
    )]
    fn check(&self, sink: &str, progress: &etl_sink::Progress) -> Result<(), PipelineError> {
        match self {
            StoredProgressCheck::Any => Ok(()),
            #[cfg(feature = "kafka")]
            StoredProgressCheck::Kafka(map) => map
                .check_stored(progress.iter().map(|(p, _)| p))
                .map_err(|e| PipelineError::Invalid(format!("sink {sink:?}: {e}"))),
        }
    }
}

async fn with_sink(
    builder: PipelineBuilder,
    config: &SinkConfig,
    trusted: bool,
    stored: &StoredProgressCheck,
) -> Result<PipelineBuilder, PipelineError> {
    let driver_config = config.options.driver_config();
    let encoding = match &config.kind {
        SinkKind::File(f) => f.encoding,
        SinkKind::Stdout(s) => s.encoding,
        // Nothing is written, so there is no format to check values
        // against: the blackhole takes every record as it is.
        SinkKind::Blackhole(_) => Encoding::Lines,
        _ => Encoding::Ndjson,
    };
    Ok(match open_sink(&config.kind, &config.name).await? {
        Opened::ExactlyOnce(file) => {
            let (driver, progress) = SinkDriver::exactly_once(file, encoder(encoding, trusted));
            stored.check(&config.name, &progress)?;
            builder.exactly_once_sink(config.name.clone(), driver.config(driver_config), progress)
        }
        #[cfg(feature = "postgres")]
        Opened::PostgresExactlyOnce(sink) => {
            let (driver, progress) = SinkDriver::exactly_once(*sink, encoder(encoding, trusted));
            stored.check(&config.name, &progress)?;
            builder.exactly_once_sink(config.name.clone(), driver.config(driver_config), progress)
        }
        // The blackhole keeps nothing: its encoder copies nothing either.
        Opened::Shared(sink) if matches!(config.kind, SinkKind::Blackhole(_)) => builder.sink(
            config.name.clone(),
            SinkDriver::new(sink, BlackholeSink::encoder()).config(driver_config),
        ),
        Opened::Shared(sink) => builder.sink(
            config.name.clone(),
            SinkDriver::new(sink, encoder(encoding, trusted)).config(driver_config),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(source: &str, transforms: &str) -> Config {
        let text = format!("[source]\n{source}\n{transforms}\n[[sinks]]\ntype = \"blackhole\"\n");
        crate::parse_config(&text, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn encoders_trust_only_values_known_to_be_json() {
        let filter = "[[transforms]]\ntype = \"filter\"\nfield = \"n\"\nop = \">\"\nvalue = 1";
        let ndjson = "type = \"file\"\npaths = [\"in.ndjson\"]";
        let lines = "type = \"file\"\npaths = [\"in.txt\"]\nformat = \"lines\"";
        let generator = "type = \"generator\"\nrecords_per_partition = 1";
        assert!(values_are_json(&config(ndjson, "")));
        assert!(values_are_json(&config(generator, "")));
        assert!(values_are_json(&config(lines, filter)));
        assert!(!values_are_json(&config(lines, "")));
    }

    #[tokio::test]
    async fn the_blackhole_takes_values_that_are_not_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.txt"), "not json\n{\"a\":1}\n").unwrap();
        let source = format!(
            "type = \"file\"\npaths = [{:?}]\nformat = \"lines\"",
            dir.path().join("in.txt")
        );
        let mut config = config(&source, "");
        config.checkpoint.store = crate::config::StoreConfig::Memory;
        let pipeline = pipeline_from_config(&config).await.unwrap();
        let summary = pipeline
            .run(tokio_util::sync::CancellationToken::new())
            .await
            .unwrap();
        assert_eq!((summary.read, summary.written()), (2, 2));
        assert_eq!(summary.dead_lettered, 0);
    }
}
