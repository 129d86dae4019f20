//! An object-store sink: records as NDJSON (plain, gzip, zstd) or Parquet
//! objects in S3 and S3-compatible servers, Google Cloud Storage, Azure
//! Blob Storage or a local folder, through Apache Arrow's `object_store`.
//!
//! * [`ObjectStoreSinkConfig`] is the `[[sinks]]` table of
//!   `type = "object_store"`: the [`StoreConfig`] (credentials from the
//!   table, `${VAR}` or the provider's environment, kept secret), the key
//!   template ([`KeyTemplate`]: `{partition}`, `{first_offset}`, `{topic}`,
//!   `{date}`, `{hour}`, any field), the encoding ([`EncodingConfig`],
//!   with a declared Parquet schema of [`ColumnConfig`]s) and request
//!   retries ([`RequestConfig`]: throttling is retried with backoff and
//!   jitter).
//! * [`ObjectStoreSink`] implements [`etl_sink::Sink`]: each write of the
//!   sink driver (which cuts batches by records, bytes and age) becomes one
//!   object per partition and key, uploaded in one PUT or, when large, a
//!   multipart upload that is aborted if it fails. A write returns `Ok`
//!   once the store acknowledged every object; only then are its records
//!   delivered (at-least-once).
//! * Exactly-once ([`ObjectStoreSink::exactly_once`], an
//!   [`etl_sink::ProgressSink`]): keys are deterministic (an object's key
//!   is fixed by its partition and the offset of its first record), and
//!   each write stores the partitions' progress in small progress objects
//!   *after* the data. On start the pipeline resumes from the progress
//!   read from the store, never from local state. A crash between the
//!   data and its progress leaves at most one write's objects past the
//!   progress; the replay writes objects starting at the same offsets,
//!   hence under the same keys, replacing them (S3 PUTs are atomic), so no
//!   record is stored twice. Conditional writes are not relied upon.
//! * [`register`] is the crate's one registration line: the `object_store`
//!   sink type (at least once, or exactly once with `exactly_once = true`)
//!   in a [`Registry`](etl_config::Registry), as the `etl` command does.
//!
//! `docs/object-storage.md` has the configuration, the layout, what readers
//! see during a replay and the failure table.
//!
//! # Example
//!
//! Two records to Parquet in a local folder:
//!
//! ```
//! use etl_ack::{Acked, BatchId, BatchMeta};
//! use etl_object_store::{ObjectStoreSink, ObjectStoreSinkConfig};
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId};
//! use etl_sink::SinkDriver;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let folder = tempfile::tempdir()?;
//! let config: ObjectStoreSinkConfig = toml::from_str(r#"
//!     key = "orders/{partition}-{first_offset}.parquet"
//!     [store]
//!     kind = "local"
//!     path = "lake"
//!     [encoding]
//!     format = "parquet"
//!     columns = [{ name = "id", type = "int64", nullable = false }]
//! "#)?;
//! let sink = ObjectStoreSink::new("lake", folder.path(), config)?;
//! let encoder = sink.encoder();
//! let driver = SinkDriver::new(sink, encoder).spawn();
//!
//! let (acker, _events) = etl_ack::channel();
//! let id = BatchId { partition: PartitionId(0), epoch: 1, seq: 0 };
//! let meta = BatchMeta { id, first_offset: Offset(0), last_offset: Offset(1), records: 2, bytes: 16 };
//! let records = (0..2)
//!     .map(|o| {
//!         let at = Position::new(SourceId::new("in"), PartitionId(0), Offset(o));
//!         Record::new(at, format!("{{\"id\":{o}}}"))
//!     })
//!     .collect();
//! driver.send(Acked::new(records, acker.open(meta)?)).await?;
//! driver.close().await?;
//!
//! let object = folder.path().join("lake/orders/0-00000000000000000000.parquet");
//! assert!(std::fs::read(object)?.starts_with(b"PAR1"));
//! # Ok(())
//! # }
//! ```

mod config;
mod encode;
mod error;
mod key;
mod progress;
mod schema;
mod sink;
mod store;
mod upload;
mod value_encoder;
mod workers;

pub use config::{
    EncodingConfig, NdjsonCompression, ObjectStoreSinkConfig, ParquetCompression, RequestConfig,
    StoreConfig,
};
pub use error::ObjectStoreSinkError;
pub use key::KeyTemplate;
pub use schema::{ColumnConfig, ColumnType};
pub use sink::ObjectStoreSink;
pub use value_encoder::ValueEncoder;

/// Register the `object_store` sink type in `registry`, as a user's
/// connector crate registers its own: the `etl` command's one line for
/// this crate.
///
/// `exactly_once = true` in the table builds the exactly-once sink
/// ([`ObjectStoreSink::exactly_once`]: its progress read from the store
/// before the pipeline starts) as the pipeline's progress keeper;
/// otherwise the at-least-once sink. Either is driven with its own
/// [`encoder`](ObjectStoreSink::encoder), so a record the objects cannot
/// hold goes to the dead-letter path before the write.
///
/// ```
/// let registry = etl_object_store::register(etl_config::Registry::new());
/// assert!(registry.has_sink("object_store"));
/// ```
#[must_use]
pub fn register(registry: etl_config::Registry) -> etl_config::Registry {
    use etl_config::{BuiltSink, ComponentContext, SinkPlugin};

    let plugin = SinkPlugin::new_async(
        |config: ObjectStoreSinkConfig, context: &ComponentContext<'_>| {
            let name = context.name().to_owned();
            let base = context.base_dir().to_owned();
            async move {
                if config.exactly_once {
                    let sink = ObjectStoreSink::exactly_once(&name, &base, config)
                        .await
                        .map_err(opening_error)?;
                    let encoder = sink.encoder();
                    Ok(BuiltSink::exactly_once(sink).encoder(encoder))
                } else {
                    let sink = ObjectStoreSink::new(&name, &base, config)?;
                    let encoder = sink.encoder();
                    Ok(BuiltSink::new(sink).encoder(encoder))
                }
            }
        },
    )
    .check(|config, report| {
        if config.exactly_once {
            report.exactly_once();
        }
        // A Parquet object's rows are read from each record's JSON, and a
        // record that is not JSON is dead-lettered with its reason, so an
        // NDJSON source alone before it need not check its lines as well.
        if matches!(config.encoding, config::EncodingConfig::Parquet { .. }) {
            report.reads_values_as_json();
        }
    });
    registry.sink_plugin("object_store", plugin)
}

/// Why an exactly-once sink did not open, as the pipeline reports it.
///
/// The progress's reading failing is an error of the output, as the same
/// failure of a write during the run is, not one of the configuration's
/// (which the same table, the store answering or the object mended, would
/// not cure): the store refusing it (its bucket missing, its credential,
/// region or endpoint refused) makes the `etl` binary exit 74, a store
/// that does not answer within the request bounds or a progress object
/// that does not parse 1, each naming the sink.
fn opening_error(e: ObjectStoreSinkError) -> etl_config::BoxError {
    match e {
        ObjectStoreSinkError::Progress { source, .. } => Box::new(source),
        e => Box::new(e),
    }
}
