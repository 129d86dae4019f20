//! The sink: records cut into objects, encoded, uploaded, and (exactly-once)
//! followed by their progress.

use std::collections::BTreeMap;
use std::path::Path as FsPath;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{EncodedBatch, Progress, ProgressSink, Reject, Sink, SinkError};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path;
use serde_json::Value;

use crate::encode::{Held, ObjectFormat, Read, SchemaSource};
use crate::error::classify;
use crate::key::{KeyParts, lookup};
use crate::progress::ProgressStore;
use crate::schema::{Row, RowSchema, timestamp_micros};
use crate::store::build_store;
use crate::upload::{ABORT_SETTLE, Aborts, upload};
use crate::workers::Workers;
use crate::{
    EncodingConfig, KeyTemplate, ObjectStoreSinkConfig, ObjectStoreSinkError, StoreConfig,
    ValueEncoder,
};

/// Objects uploaded at once by one write.
const UPLOADS_AT_ONCE: usize = 8;

/// The fewest records a thread is given to read: fewer are read on the
/// write's own thread rather than on a helper started for them.
const MIN_ROWS_PER_READ: usize = 1024;

/// A sink writing records as objects: NDJSON (plain, gzip, zstd) or
/// Parquet, to S3 and S3-compatible servers, GCS, Azure or a local folder.
///
/// Each write (one batch of the sink driver, which cuts batches by
/// records, bytes and age) becomes one object per partition and key, cut
/// further at offsets that are multiples of `max_object_offsets`. A write
/// returns `Ok` once the store acknowledged every object (the PUT or the
/// multipart completion returned): that is when its records count as
/// delivered.
///
/// Exactly-once ([`ObjectStoreSink::exactly_once`]): after the objects,
/// the write stores each partition's progress in a progress object; the
/// pipeline resumes from that progress, read from the store. See the crate
/// docs for why a replay then writes no duplicate.
#[derive(Clone, Debug)]
pub struct ObjectStoreSink {
    inner: Arc<Inner>,
}

/// `Debug` by hand: the store's own `Debug` prints its credentials (the
/// Azure client shows its access key's bytes).
struct Inner {
    name: String,
    location: String,
    store: Arc<dyn ObjectStore>,
    key: KeyTemplate,
    format: ObjectFormat,
    date_field: Option<Vec<String>>,
    max_object_offsets: Option<i64>,
    multipart_threshold: usize,
    part_size: usize,
    /// The aborts of the multipart uploads dropped writes gave up.
    aborts: Aborts,
    /// The threads a write reads its records and encodes its Parquet
    /// objects on: one per core.
    workers: Workers,
    exactly_once: Option<(ProgressStore, Mutex<Progress>)>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("name", &self.name)
            .field("location", &self.location)
            .field("key", &self.key)
            .field("format", &self.format)
            .field("exactly_once", &self.exactly_once.is_some())
            .finish_non_exhaustive()
    }
}

/// The rows the sink's encoder read of the records it accepted, in their
/// order, attached to them in the batch (see
/// [`etl_sink::BatchEncoding::attach`]): the write takes them instead of
/// reading the records again.
#[derive(Debug)]
pub(crate) struct CheckedRows {
    /// The sink whose schema they were read with: a write of another
    /// sink reads the records itself.
    sink: Arc<Inner>,
    rows: Vec<Row>,
}

impl CheckedRows {
    /// `rows`, read with `sink`'s schema.
    pub(crate) fn new(sink: &ObjectStoreSink, rows: Vec<Row>) -> Self {
        CheckedRows {
            sink: sink.inner.clone(),
            rows,
        }
    }
}

/// One object to write: a partition's records sharing their key parts.
#[derive(Debug)]
struct Planned {
    partition: PartitionId,
    parts: KeyParts,
    first_offset: i64,
    rows: Vec<usize>,
}

impl ObjectStoreSink {
    /// An at-least-once sink named `name`, on the store `config` names
    /// (a local folder relative to `base_dir`).
    ///
    /// # Errors
    ///
    /// [`ObjectStoreSinkError::Config`] for an inconsistent configuration,
    /// [`ObjectStoreSinkError::Store`] when the store cannot be set up.
    pub fn new(
        name: &str,
        base_dir: &FsPath,
        config: ObjectStoreSinkConfig,
    ) -> Result<Self, ObjectStoreSinkError> {
        let store = build_store(&resolve(config.store.clone(), base_dir), &config.requests)?;
        ObjectStoreSink::with_store(name, config, store)
    }

    /// An at-least-once sink on `store` (for a store built by the caller:
    /// an in-memory one, a wrapper that injects faults). `config.store`
    /// only names it in messages.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_store(
        name: &str,
        config: ObjectStoreSinkConfig,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self, ObjectStoreSinkError> {
        Ok(ObjectStoreSink {
            inner: Arc::new(Inner::new(name, config, store, false)?),
        })
    }

    /// An exactly-once sink: its progress is read from the store now, and
    /// stored after every write. The key template must hold `{partition}`
    /// and `{first_offset}`, and `{date}`/`{hour}` only with a
    /// `date_field` (the time of writing would differ on a replay).
    /// Pair it with its [`encoder`](Self::encoder) in
    /// [`SinkDriver::exactly_once`](etl_sink::SinkDriver::exactly_once).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), and [`ObjectStoreSinkError::Progress`] when
    /// the stored progress cannot be read.
    pub async fn exactly_once(
        name: &str,
        base_dir: &FsPath,
        config: ObjectStoreSinkConfig,
    ) -> Result<Self, ObjectStoreSinkError> {
        let store = build_store(&resolve(config.store.clone(), base_dir), &config.requests)?;
        ObjectStoreSink::exactly_once_with_store(name, config, store).await
    }

    /// [`exactly_once`](Self::exactly_once) on a store built by the caller.
    ///
    /// # Errors
    ///
    /// As [`exactly_once`](Self::exactly_once).
    pub async fn exactly_once_with_store(
        name: &str,
        config: ObjectStoreSinkConfig,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self, ObjectStoreSinkError> {
        let inner = Inner::new(name, config, store, true)?;
        if let Some((progress_store, progress)) = &inner.exactly_once {
            let loaded =
                progress_store
                    .load()
                    .await
                    .map_err(|source| ObjectStoreSinkError::Progress {
                        sink: name.to_owned(),
                        source,
                    })?;
            *progress.lock().unwrap_or_else(PoisonError::into_inner) = loaded;
        }
        Ok(ObjectStoreSink {
            inner: Arc::new(inner),
        })
    }

    /// The encoder to drive this sink with: NDJSON, refusing (to the
    /// dead-letter path, before the write) a record the sink could not
    /// store: a value that does not fit the Parquet schema, or lacks a
    /// field the key needs.
    #[must_use]
    pub fn encoder(&self) -> ValueEncoder {
        ValueEncoder::new(self.clone())
    }

    /// The store the sink writes to.
    #[must_use]
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.inner.store.clone()
    }

    /// Each of `records`' rows, or why it cannot be stored (the reason
    /// [`fits`](Self::fits) gives), in their order, read in chunks on the
    /// write's threads: what the write needs of them, where that is their
    /// rows alone (a declared Parquet schema, a key that reads no field
    /// and no date field). `None` where the write needs more.
    pub(crate) fn rows_of(&self, records: &[Record]) -> Option<Vec<Result<Row, String>>> {
        let inner = &*self.inner;
        let schema = inner.rows_schema()?;
        // Only a panic fails a chunk: a record that does not fit is its
        // row's `Err`. After a panic, each record is judged alone.
        inner
            .read_rows(schema, records.iter().collect(), MIN_ROWS_PER_READ)
            .ok()
    }

    /// Whether `record` can be stored: `Ok(true)` when its value was
    /// read as JSON to tell (so it is known to be JSON), `Ok(false)` when
    /// nothing needed reading it; `Err` says why it cannot be stored.
    pub(crate) fn fits(&self, record: &Record) -> Result<bool, String> {
        let inner = &*self.inner;
        if !inner.key.reads_fields()
            && inner.date_field.is_none()
            && inner.format.surely_fits(&record.value)
        {
            // Nothing else reads the value, and nothing else can refuse
            // it: key parts that read no field and no date field are
            // made of any record.
            return Ok(true);
        }
        let value = if inner.reads_values() {
            serde_json::from_slice::<Value>(&record.value).ok()
        } else {
            None
        };
        inner.place(record, value.as_ref(), Utc::now())?;
        Ok(value.is_some())
    }
}

/// A local store's folder, relative to `base_dir`.
fn resolve(store: StoreConfig, base_dir: &FsPath) -> StoreConfig {
    match store {
        StoreConfig::Local { path } => StoreConfig::Local {
            path: base_dir.join(path).to_string_lossy().into_owned(),
        },
        other => other,
    }
}

impl Inner {
    fn new(
        name: &str,
        config: ObjectStoreSinkConfig,
        store: Arc<dyn ObjectStore>,
        exactly_once: bool,
    ) -> Result<Self, ObjectStoreSinkError> {
        let bad = |why: String| ObjectStoreSinkError::Config(format!("sink {name:?}: {why}"));
        let key = KeyTemplate::parse(&config.key)?;
        let format = match config.encoding {
            EncodingConfig::Ndjson { compression } => ObjectFormat::Ndjson(compression),
            EncodingConfig::Parquet {
                columns,
                compression,
                row_group_rows,
                page_bytes,
            } => ObjectFormat::parquet(
                if columns.is_empty() {
                    SchemaSource::Inferred(OnceLock::new())
                } else {
                    SchemaSource::Declared(RowSchema::new(&columns)?)
                },
                compression,
                row_group_rows,
                page_bytes,
            ),
        };
        if config.part_size < 5 << 20 {
            return Err(bad(format!(
                "part_size {} is below 5 MiB, the smallest part S3 takes",
                config.part_size
            )));
        }
        if config.max_object_offsets == Some(0) {
            return Err(bad("max_object_offsets must be at least 1".to_owned()));
        }
        let max_object_offsets = config
            .max_object_offsets
            .map(|n| {
                i64::try_from(n).map_err(|_| bad("max_object_offsets is too large".to_owned()))
            })
            .transpose()?;
        // A sample key must be a valid object path.
        let sample = key.render(&KeyParts::sample(&key), 0);
        Path::parse(&sample).map_err(|e| bad(format!("key {:?}: {e}", config.key)))?;
        let date_field = config
            .date_field
            .as_deref()
            .map(|f| f.split('.').map(str::to_owned).collect::<Vec<_>>());
        let location = format!("{}://{}", config.store.scheme(), config.store.bucket());
        let exactly_once = if exactly_once {
            if format.infers() {
                return Err(bad(
                    "exactly-once needs declared Parquet `columns`: a schema inferred from the first record may differ on a replay, which would write the same records with other bytes"
                        .to_owned(),
                ));
            }
            if key.uses_time() && date_field.is_none() {
                return Err(bad(format!(
                    "key {:?}: exactly-once takes `{{date}}`/`{{hour}}` from a `date_field` only: the time of writing differs on a replay, which would write the same records under another key",
                    config.key
                )));
            }
            let prefix = match &config.progress_prefix {
                Some(prefix) => Path::parse(prefix)
                    .map_err(|e| bad(format!("progress_prefix {prefix:?}: {e}")))?,
                None => Path::from("_etl_progress").join(name),
            };
            Some((
                ProgressStore {
                    store: store.clone(),
                    prefix,
                    key: config.key.clone(),
                    sink: name.to_owned(),
                    location: location.clone(),
                },
                Mutex::new(Progress::new()),
            ))
        } else {
            None
        };
        Ok(Inner {
            name: name.to_owned(),
            location,
            store,
            key,
            format,
            date_field,
            max_object_offsets,
            multipart_threshold: config.multipart_threshold,
            part_size: config.part_size,
            aborts: Aborts::default(),
            workers: Workers::per_core(),
            exactly_once,
        })
    }

    /// The declared schema, where the write needs nothing of a record but
    /// its row: no key part nor date reads a field.
    fn rows_schema(&self) -> Option<&RowSchema> {
        self.format
            .declared()
            .filter(|_| !self.key.reads_fields() && self.date_field.is_none())
    }

    /// The rows of `records`, or why each does not fit, in their order:
    /// read in one pass over the bytes where the record surely fits and
    /// through its `Value` otherwise; in as many chunks as there are
    /// threads (of at least `min_chunk` records), each read on one.
    fn read_rows(
        &self,
        schema: &RowSchema,
        records: Vec<&Record>,
        min_chunk: usize,
    ) -> Result<Vec<Result<Row, String>>, String> {
        let chunk = records
            .len()
            .div_ceil(self.workers.count())
            .max(min_chunk)
            .max(1);
        let chunks: Vec<&[&Record]> = records.chunks(chunk).collect();
        // A chunk's rows share one arena: reading a record allocates
        // nothing of its own, and freeing the rows frees a few buffers a
        // chunk.
        let read = self.workers.run(chunks, &[], |chunk| {
            Ok(schema.rows_of_chunk(chunk.iter().map(|r| &r.value[..])))
        })?;
        Ok(read.into_iter().flatten().collect())
    }

    fn reads_values(&self) -> bool {
        self.format.reads_values() || self.key.reads_fields() || self.date_field.is_some()
    }

    /// The key parts of `record`, once it is known to fit the object's
    /// format; `Err` says why it cannot be stored.
    fn place(
        &self,
        record: &Record,
        value: Option<&Value>,
        now: DateTime<Utc>,
    ) -> Result<KeyParts, String> {
        self.format.check(value)?;
        self.parts(record, value, now)
    }

    /// The key parts of `record`, whose value is known to fit.
    fn parts(
        &self,
        record: &Record,
        value: Option<&Value>,
        now: DateTime<Utc>,
    ) -> Result<KeyParts, String> {
        let time = if !self.key.uses_time() {
            now
        } else if let Some(path) = &self.date_field {
            value
                .and_then(|v| lookup(v, path))
                .and_then(timestamp_micros)
                .and_then(DateTime::from_timestamp_micros)
                .ok_or_else(|| {
                    format!(
                        "the key's date needs field `{}`, an RFC 3339 time or milliseconds since 1970",
                        path.join(".")
                    )
                })?
        } else {
            record
                .timestamp
                .and_then(|t| DateTime::from_timestamp_millis(t.0))
                .unwrap_or(now)
        };
        self.key.parts_of(record, value, time)
    }

    /// Whether an object starting at `first` may not hold `offset`.
    fn crosses_boundary(&self, first: i64, offset: i64) -> bool {
        self.max_object_offsets
            .is_some_and(|n| first.div_euclid(n) != offset.div_euclid(n))
    }

    /// Read what the objects of `batch` need of its records: for a
    /// declared Parquet schema whose keys need no field, each record's row
    /// (the one the sink's encoder read and attached, or else read here);
    /// else the values, where anything reads them.
    fn read<'b>(&self, batch: &'b EncodedBatch) -> Result<Read<'b>, String> {
        if let Some(schema) = self.rows_schema() {
            let mut held: Vec<Option<&'b Row>> = vec![None; batch.len()];
            for (range, attached) in batch.attachments() {
                let Some(checked) = attached.downcast_ref::<CheckedRows>() else {
                    continue;
                };
                if std::ptr::eq(Arc::as_ptr(&checked.sink), self)
                    && let Some(slots) = held.get_mut(range)
                    && slots.len() == checked.rows.len()
                {
                    for (slot, row) in slots.iter_mut().zip(&checked.rows) {
                        *slot = Some(row);
                    }
                }
            }
            let records = batch.records();
            let missing: Vec<&Record> = records
                .iter()
                .zip(&held)
                .filter_map(|(record, row)| row.is_none().then_some(record))
                .collect();
            let mut read = if missing.is_empty() {
                Vec::new()
            } else {
                self.read_rows(schema, missing, MIN_ROWS_PER_READ)?
            }
            .into_iter();
            let rows = held
                .into_iter()
                .map(|row| match row {
                    Some(row) => Ok(Held::Checked(row)),
                    None => read
                        .next()
                        .unwrap_or_else(|| Err("the record was not read".to_owned()))
                        .map(Held::Read),
                })
                .collect();
            return Ok(Read::Rows(rows));
        }
        Ok(if self.reads_values() {
            Read::Values(
                batch
                    .records()
                    .iter()
                    .map(|r| serde_json::from_slice(&r.value).ok())
                    .collect(),
            )
        } else {
            Read::Nothing
        })
    }

    /// Cut `batch` into objects; the records that cannot be stored are
    /// rejected.
    fn plan(&self, batch: &EncodedBatch, read: &Read<'_>) -> (Vec<Planned>, Vec<Reject>) {
        let now = Utc::now();
        let mut planned: Vec<Planned> = Vec::new();
        let mut open: BTreeMap<PartitionId, usize> = BTreeMap::new();
        let mut rejects = Vec::new();
        // Key parts that read no field and no time are fixed by the
        // record's partition, topic and source: a record of the same ones
        // as its partition's open object's first has that object's.
        let by_place = !self.key.reads_fields() && !self.key.uses_time();
        let records = batch.records();
        for (i, record) in records.iter().enumerate() {
            let fits = match read {
                Read::Rows(rows) => match rows.get(i) {
                    Some(Ok(_)) => Ok(None),
                    Some(Err(why)) => Err(why.clone()),
                    None => Err("the record was not read".to_owned()),
                },
                Read::Values(values) => {
                    let value = values.get(i).and_then(Option::as_ref);
                    self.format.check(value).map(|()| value)
                }
                Read::Nothing => self.format.check(None).map(|()| None),
            };
            let value = match fits {
                Ok(value) => value,
                Err(why) => {
                    rejects.push(Reject::new(i, why));
                    continue;
                }
            };
            let partition = record.position.partition;
            let offset = record.position.offset.0;
            let at = open.get(&partition).copied();
            let same_place = by_place
                && at
                    .and_then(|at| planned.get(at))
                    .and_then(|object| object.rows.first())
                    .and_then(|&first| records.get(first))
                    .is_some_and(|first| {
                        first.topic == record.topic
                            && first.position.source == record.position.source
                    });
            let parts = if same_place {
                None
            } else {
                match self.parts(record, value, now) {
                    Ok(parts) => Some(parts),
                    Err(why) => {
                        rejects.push(Reject::new(i, why));
                        continue;
                    }
                }
            };
            match at.and_then(|at| planned.get_mut(at)) {
                Some(object)
                    if parts.as_ref().is_none_or(|parts| *parts == object.parts)
                        && !self.crosses_boundary(object.first_offset, offset) =>
                {
                    object.rows.push(i);
                }
                object => {
                    let Some(parts) = parts.or_else(|| object.map(|o| o.parts.clone())) else {
                        rejects.push(Reject::new(i, "the record's key was not made".to_owned()));
                        continue;
                    };
                    open.insert(partition, planned.len());
                    planned.push(Planned {
                        partition,
                        parts,
                        first_offset: offset,
                        rows: vec![i],
                    });
                }
            }
        }
        (planned, rejects)
    }
}

#[async_trait]
impl Sink for ObjectStoreSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let inner = &*self.inner;
        let read = inner.read(batch).map_err(|why| {
            SinkError::permanent(format!(
                "sink {:?}: cannot read the records for {}: {why}",
                inner.name, inner.location
            ))
        })?;
        let (planned, rejects) = inner.plan(batch, &read);
        if inner.exactly_once.is_some() && !rejects.is_empty() {
            // Progress past a rejected record would be stored before its
            // dead letter is durable: refuse the batch instead (the
            // sink's own encoder refuses such records before the write).
            return Err(SinkError::data(format!(
                "sink {:?}: {} record(s) cannot be stored (first: {}); an exactly-once object-store sink needs its own encoder (`ObjectStoreSink::encoder`) to set them aside first",
                inner.name,
                rejects.len(),
                rejects.first().map_or("", |r| r.reason.as_str())
            )));
        }
        let mut objects = Vec::with_capacity(planned.len());
        for object in &planned {
            let key = inner.key.render(&object.parts, object.first_offset);
            let body = inner
                .format
                .encode(batch, &object.rows, &read, inner.workers)
                .map_err(|why| {
                    SinkError::permanent(format!(
                        "sink {:?}: cannot encode {}/{key}: {why}",
                        inner.name, inner.location
                    ))
                })?;
            objects.push((key, body));
        }
        let last_keys: BTreeMap<PartitionId, String> = planned
            .iter()
            .zip(&objects)
            .map(|(p, (key, _))| (p.partition, key.clone()))
            .collect();
        futures::stream::iter(objects)
            .map(|(key, body): (String, Bytes)| async move { self.put(&key, body).await })
            .buffer_unordered(UPLOADS_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
        if let Some((progress_store, progress)) = &inner.exactly_once {
            let mut next: BTreeMap<PartitionId, Offset> = BTreeMap::new();
            for record in batch.records() {
                let entry = next
                    .entry(record.position.partition)
                    .or_insert(record.position.offset.next());
                *entry = (*entry).max(record.position.offset.next());
            }
            let stores = next.iter().map(|(&partition, &offset)| {
                let last = last_keys.get(&partition).cloned().unwrap_or_default();
                async move { progress_store.store(partition, offset, &last).await }
            });
            futures::future::try_join_all(stores).await?;
            let mut held = progress.lock().unwrap_or_else(PoisonError::into_inner);
            for (partition, offset) in next {
                held.advance(partition, offset);
            }
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }

    /// Time for the aborts of uploads given up at a stop: a round trip to
    /// a store that answers.
    fn settle_time(&self) -> Duration {
        ABORT_SETTLE
    }

    /// Wait for the aborts of the multipart uploads that dropped writes
    /// gave up, so that none is dropped with the runtime, its parts left
    /// on the server.
    async fn settle(&self) {
        self.inner.aborts.settle().await;
    }
}

impl ObjectStoreSink {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), SinkError> {
        let inner = &*self.inner;
        let path = Path::parse(key).map_err(|e| {
            SinkError::permanent(format!(
                "sink {:?}: {}/{key} is not a valid object key: {e}",
                inner.name, inner.location
            ))
        })?;
        upload(
            &*inner.store,
            &path,
            body,
            inner.multipart_threshold,
            inner.part_size,
            &inner.aborts,
        )
        .await
        .map_err(|(op, e)| classify(op, &inner.name, &inner.location, key, e))
    }
}

#[async_trait]
impl ProgressSink for ObjectStoreSink {
    fn progress(&self) -> Progress {
        match &self.inner.exactly_once {
            Some((_, progress)) => progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            None => Progress::new(),
        }
    }

    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        let Some((store, progress)) = &self.inner.exactly_once else {
            return Ok(Progress::new());
        };
        let loaded = store.load().await?;
        let mut held = progress.lock().unwrap_or_else(PoisonError::into_inner);
        for (partition, next) in loaded.iter() {
            held.advance(partition, next);
        }
        Ok(held.clone())
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    /// The built sink of every store kind, shown with `{:?}`, holds no
    /// credential: not the key's text, nor its decoded bytes, which the
    /// Azure client's own `Debug` prints.
    #[tokio::test]
    async fn no_credential_of_any_store_shows_in_the_sinks_debug() {
        // "supersecretkey-azure" in base64.
        let azure_key = "c3VwZXJzZWNyZXRrZXktYXp1cmU=";
        let stores = [
            format!(
                "kind = \"azure\"\naccount = \"acct\"\ncontainer = \"c\"\naccess_key = \"{azure_key}\""
            ),
            "kind = \"s3\"\nbucket = \"b\"\nregion = \"eu-west-1\"\naccess_key_id = \"AKIDSECRETID\"\nsecret_access_key = \"supersecretkey-s3\"".to_owned(),
        ];
        for store in stores {
            let config: ObjectStoreSinkConfig = toml::from_str(&format!(
                "key = \"{{partition}}-{{first_offset}}.ndjson\"\nexactly_once = true\n[store]\n{store}\n"
            ))
            .unwrap();
            let inner = Inner::new(
                "lake",
                config.clone(),
                crate::store::build_store(&config.store, &config.requests).unwrap(),
                true,
            )
            .unwrap();
            let shown = format!("{inner:?}");
            let decoded: Vec<String> = b"supersecretkey".iter().map(u8::to_string).collect();
            for secret in [
                azure_key,
                "supersecretkey",
                "AKIDSECRETID",
                &decoded.join(", "),
            ] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
            assert!(shown.contains("lake"), "{shown}");
        }
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use std::ops::Range;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arrow_array::Int64Array;
    use bytes::BytesMut;
    use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
    use etl_record::{Offset, Position, SourceId};
    use etl_sink::testing::MemorySink;
    use etl_sink::{BatchEncoding, Encoder, SinkDriver, SinkDriverConfig};
    use object_store::ObjectStoreExt;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    const COLUMNS: &str = r#"columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "user", type = "string" },
        { name = "amount", type = "float64" },
        { name = "tags", type = "list", item = { name = "tag", type = "string" } },
    ]"#;

    /// A Parquet sink on an in-memory store whose write shares its work
    /// between `threads` threads.
    fn sink(columns: &str, threads: usize) -> ObjectStoreSink {
        let config: ObjectStoreSinkConfig = toml::from_str(&format!(
            "key = \"{{partition}}-{{first_offset}}.parquet\"\n\
             [store]\nkind = \"local\"\npath = \"lake\"\n\
             [encoding]\nformat = \"parquet\"\n{columns}\n"
        ))
        .unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let mut inner = Inner::new("lake", config, store, false).unwrap();
        inner.workers = Workers::new(threads);
        ObjectStoreSink {
            inner: Arc::new(inner),
        }
    }

    /// Records of every kind: fitting in one pass, fitting only by the
    /// check over `Value` (a key given twice), not fitting, not JSON.
    fn records(n: i64) -> Vec<Record> {
        (0..n)
            .map(|i: i64| {
                let value = match i % 7 {
                    0..=2 => format!(
                        r#"{{"id":{i},"user":"u{}","amount":{i}.5,"tags":["a","b{i}"]}}"#,
                        i % 13
                    ),
                    3 => format!(r#"{{"id":0,"id":{i},"user":null}}"#),
                    4 => format!(r#"{{"id":"{i}"}}"#),
                    5 => format!(r#"{{"id":{i},"amount":-{i},"tags":[]}}"#),
                    _ => format!("not json {i}"),
                };
                Record::new(
                    Position::new(
                        SourceId::new("in"),
                        PartitionId(u32::try_from(i % 3).unwrap()),
                        Offset(i),
                    ),
                    value,
                )
            })
            .collect()
    }

    /// The batch and refusals of `encoder` taking one record at a time.
    fn one_by_one(encoder: &dyn Encoder, records: &[Record]) -> (Vec<u8>, Vec<(i64, String)>) {
        let mut bytes = BytesMut::new();
        let mut refused = Vec::new();
        for record in records {
            let mut out = BytesMut::new();
            match encoder.encode(record, &mut out) {
                Ok(()) => bytes.extend_from_slice(&out),
                Err(e) => refused.push((record.position.offset.0, e.to_string())),
            }
        }
        (bytes.to_vec(), refused)
    }

    /// Checked in chunks on several threads, a batch's records keep their
    /// order: the bytes, the refusals (with their reasons) and the rows
    /// attached are those of the records taken one by one, whichever
    /// chunk finishes first.
    #[test]
    fn a_batch_checked_on_several_threads_gives_what_one_record_at_a_time_gives() {
        for threads in [1, 2, 5] {
            let sink = sink(COLUMNS, threads);
            let encoder = sink.encoder();
            // Enough records for a chunk a thread.
            let records = records(7_000);
            let (bytes, refused) = one_by_one(&encoder, &records);
            let (batch, batch_refused) = EncodedBatch::encode(records.clone(), &encoder);
            let batch_refused: Vec<(i64, String)> = batch_refused
                .into_iter()
                .map(|(r, e)| (r.position.offset.0, e.to_string()))
                .collect();
            assert!(batch.bytes()[..] == bytes[..], "{threads} threads");
            assert_eq!(batch_refused, refused, "{threads} threads");
            assert_eq!(refused.len(), 2_000);
            let attachments: Vec<_> = batch.attachments().collect();
            assert_eq!(attachments.len(), 1);
            let (range, attached) = &attachments[0];
            assert_eq!(*range, 0..batch.len());
            let checked = attached.downcast_ref::<CheckedRows>().unwrap();
            let schema = sink.inner.format.declared().unwrap();
            let expected: Vec<Row> = batch
                .records()
                .iter()
                .map(|r| {
                    let value: Value = serde_json::from_slice(&r.value).unwrap();
                    schema.row_of(&value).unwrap()
                })
                .collect();
            assert!(checked.rows == expected, "{threads} threads: other rows");
        }
    }

    async fn objects(sink: &ObjectStoreSink) -> BTreeMap<String, Bytes> {
        let store = sink.store();
        let mut out = BTreeMap::new();
        let listed: Vec<_> = store.list(None).try_collect().await.unwrap();
        for meta in listed {
            let bytes = store
                .get(&meta.location)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            out.insert(meta.location.to_string(), bytes);
        }
        out
    }

    /// The write takes the rows its own encoder attached, and reads the
    /// records itself where there are none (a selected batch) or they
    /// were read with another sink's schema: the objects are the same
    /// bytes either way.
    #[tokio::test]
    async fn a_write_takes_its_encoders_rows_and_writes_the_objects_it_would_read() {
        let records = records(3_000);
        let checked_by_it = sink(COLUMNS, 2);
        let (batch, _) = EncodedBatch::encode(records.clone(), &checked_by_it.encoder());
        let read = checked_by_it.inner.read(&batch).unwrap();
        let Read::Rows(rows) = &read else {
            panic!("not read as rows")
        };
        assert!(rows.iter().all(|r| matches!(r, Ok(Held::Checked(_)))));
        checked_by_it.write(&batch).await.unwrap();

        let unattached = sink(COLUMNS, 2);
        let selected = batch.select(|_| true);
        assert_eq!(selected.attachments().count(), 0);
        unattached.write(&selected).await.unwrap();

        // Rows of another schema, which the records fit too (its first
        // column is none of theirs): not taken.
        let other = sink(
            &COLUMNS.replace(
                "columns = [",
                r#"columns = [{ name = "x", type = "string" },"#,
            ),
            2,
        );
        let by_other = EncodedBatch::encode(records, &other.encoder()).0;
        assert!(by_other.bytes() == batch.bytes());
        let not_its_own = sink(COLUMNS, 2);
        let read = not_its_own.inner.read(&by_other).unwrap();
        let Read::Rows(rows) = &read else {
            panic!("not read as rows")
        };
        assert!(rows.iter().all(|r| matches!(r, Ok(Held::Read(_)))));
        not_its_own.write(&by_other).await.unwrap();

        let written = objects(&checked_by_it).await;
        assert_eq!(written.len(), 3);
        assert!(written == objects(&unattached).await);
        assert!(written == objects(&not_its_own).await);
    }

    /// Encodes one record at a time (the default `encode_batch`, as an
    /// encoder wrapping another without forwarding it does): its batches
    /// carry no attachment.
    #[derive(Debug)]
    struct OneAtATime<E>(E);

    impl<E: Encoder> Encoder for OneAtATime<E> {
        fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
            self.0.encode(record, out)
        }
    }

    /// A sink's own encoder on the first, third, ... upstream batch it is
    /// given, and one record at a time on the second, fourth, ... (as
    /// when `rows_of` gives nothing, after a panic in a chunk): a batch
    /// the driver merges from them has rows attached to some of its
    /// records only.
    #[derive(Debug)]
    struct Alternating {
        own: ValueEncoder,
        one_at_a_time: OneAtATime<ValueEncoder>,
        calls: AtomicUsize,
    }

    impl Alternating {
        fn new(sink: &ObjectStoreSink) -> Self {
            Alternating {
                own: sink.encoder(),
                one_at_a_time: OneAtATime(sink.encoder()),
                calls: AtomicUsize::new(0),
            }
        }
    }

    impl Encoder for Alternating {
        fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
            self.own.encode(record, out)
        }

        fn encode_batch(&self, records: &[Record], out: &mut BatchEncoding<'_>) {
            if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
                self.own.encode_batch(records, out);
            } else {
                self.one_at_a_time.encode_batch(records, out);
            }
        }
    }

    /// Keeps each batch it is given (attachments and all), then writes it
    /// with its sink.
    #[derive(Clone, Debug)]
    struct Keeping {
        sink: ObjectStoreSink,
        kept: Arc<Mutex<Vec<EncodedBatch>>>,
    }

    #[async_trait]
    impl Sink for Keeping {
        async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
            self.kept.lock().unwrap().push(batch.clone());
            self.sink.write(batch).await
        }
    }

    /// Where [`records`] are cut into upstream batches: the first and
    /// third go through the sink's own encoder under [`Alternating`], the
    /// second and fourth one record at a time; records of every kind,
    /// refused ones included, are in each.
    const UPSTREAM: [usize; 5] = [0, 1_000, 1_500, 3_000, 6_000];

    /// The upstream batch of [`UPSTREAM`] the record at `offset` is in.
    fn upstream(offset: i64) -> usize {
        let at = usize::try_from(offset).unwrap();
        UPSTREAM
            .windows(2)
            .position(|w| (w[0]..w[1]).contains(&at))
            .unwrap()
    }

    /// Whether [`Alternating`] gives the record at `offset` of [`UPSTREAM`]
    /// to the sink's own encoder.
    fn checked_by_its_encoder(offset: i64) -> bool {
        upstream(offset).is_multiple_of(2)
    }

    /// `records` cut at [`UPSTREAM`], sent to a driver of `sink` encoding
    /// with `encoder`, which lingers long enough to merge them all into
    /// one write. Returns the batches written (each as the write was given
    /// it) and the offsets dead-lettered, once every upstream batch was
    /// delivered.
    async fn merged(
        sink: &ObjectStoreSink,
        encoder: impl Encoder + 'static,
        records: &[Record],
    ) -> (Vec<EncodedBatch>, Vec<i64>) {
        let keeping = Keeping {
            sink: sink.clone(),
            kept: Arc::default(),
        };
        let letters = MemorySink::new();
        let driver = SinkDriver::new(keeping.clone(), encoder)
            .config(SinkDriverConfig {
                linger: Duration::from_secs(600),
                ..SinkDriverConfig::default()
            })
            .dead_letters(letters.clone())
            .spawn();
        let (acker, mut events) = etl_ack::channel();
        for (seq, cut) in UPSTREAM.windows(2).enumerate() {
            let records = records[cut[0]..cut[1]].to_vec();
            // Records of three partitions: the driver reads no partition
            // of a batch's handle.
            let meta = BatchMeta {
                id: BatchId {
                    partition: PartitionId(0),
                    epoch: 1,
                    seq: seq as u64,
                },
                first_offset: records[0].position.offset,
                last_offset: records[records.len() - 1].position.offset,
                records: records.len() as u32,
                bytes: records.iter().map(|r| r.value.len() as u64).sum(),
            };
            let ack = acker.open(meta).unwrap();
            driver.send(Acked::new(records, ack)).await.unwrap();
        }
        // Closing writes what the driver holds: everything sent, as one
        // batch (the linger has not run out).
        driver.close().await.unwrap();
        let mut statuses = Vec::new();
        while let Ok(event) = events.try_next() {
            if let AckEvent::Resolved(message) = event {
                statuses.push(message.status);
            }
        }
        assert_eq!(statuses, [AckStatus::Delivered; 4]);
        let written = keeping.kept.lock().unwrap().clone();
        let refused = letters
            .records()
            .iter()
            .map(|r| r.position.offset.0)
            .collect();
        (written, refused)
    }

    /// The offsets of [`records`] that do not fit [`COLUMNS`].
    fn unfit(n: i64) -> Vec<i64> {
        (0..n).filter(|i| matches!(i % 7, 4 | 6)).collect()
    }

    /// A batch merged from upstream batches the sink's encoder checked
    /// and upstream batches encoded one record at a time, refusals in
    /// each: the write gives every record its own row, the one its
    /// encoder attached where there is one and the one read for it
    /// elsewhere, each in its place.
    #[tokio::test]
    async fn a_write_reads_the_records_its_encoders_rows_do_not_cover_each_in_its_place() {
        let sink = sink(COLUMNS, 2);
        let records = records(6_000);
        let (written, refused) = merged(&sink, Alternating::new(&sink), &records).await;
        let batch = &written[0];
        let unfit = unfit(6_000);
        assert_eq!(
            batch.len(),
            6_000 - unfit.len(),
            "not merged into one write"
        );
        // One attachment for each upstream batch the sink's encoder
        // checked, over the records of it the batch holds, and none for
        // the others.
        let mut runs: BTreeMap<usize, Range<usize>> = BTreeMap::new();
        for (i, record) in batch.records().iter().enumerate() {
            let offset = record.position.offset.0;
            if checked_by_its_encoder(offset) {
                runs.entry(upstream(offset))
                    .and_modify(|run| run.end = i + 1)
                    .or_insert(i..i + 1);
            }
        }
        let attached: Vec<Range<usize>> = batch.attachments().map(|(range, _)| range).collect();
        assert_eq!(attached, runs.into_values().collect::<Vec<_>>());
        assert_eq!(attached.len(), 2);

        let schema = sink.inner.format.declared().unwrap();
        let Read::Rows(rows) = sink.inner.read(batch).unwrap() else {
            panic!("not read as rows")
        };
        assert_eq!(rows.len(), batch.len());
        for (record, row) in batch.records().iter().zip(&rows) {
            let offset = record.position.offset.0;
            let value: Value = serde_json::from_slice(&record.value).unwrap();
            let expected = schema.row_of(&value).unwrap();
            match row {
                Ok(Held::Checked(row)) if checked_by_its_encoder(offset) => {
                    assert!(**row == expected, "offset {offset}: another record's row");
                }
                Ok(Held::Read(row)) if !checked_by_its_encoder(offset) => {
                    assert!(*row == expected, "offset {offset}: another record's row");
                }
                Ok(Held::Checked(_)) => panic!("offset {offset}: a row it was not attached"),
                Ok(Held::Read(_)) => panic!("offset {offset}: read again"),
                Err(why) => panic!("offset {offset}: {why}"),
            }
        }
        // The write took them all: none was refused, nor written again.
        assert_eq!(refused, unfit);
        assert_eq!(written.len(), 1);
    }

    /// Merged by the driver from upstream batches the sink's encoder
    /// checked and upstream batches encoded one record at a time,
    /// refusals in each, a write stores the objects of a sink whose
    /// encoder attaches nothing, byte for byte: each record accepted in
    /// exactly one, each refused in none.
    #[tokio::test]
    async fn a_merged_write_of_checked_and_unchecked_batches_stores_what_an_unattached_one_does() {
        let records = records(6_000);
        let mixed = sink(COLUMNS, 2);
        let unfit = unfit(6_000);
        let (written, refused) = merged(&mixed, Alternating::new(&mixed), &records).await;
        assert_eq!(written[0].len(), 6_000 - unfit.len(), "not merged");
        assert_eq!(written[0].attachments().count(), 2);
        let plain = sink(COLUMNS, 2);
        let (plain_written, plain_refused) =
            merged(&plain, OneAtATime(plain.encoder()), &records).await;
        assert_eq!(plain_written.len(), 1, "not merged into one write");
        assert_eq!(plain_written[0].attachments().count(), 0);
        assert_eq!(plain_refused, unfit);

        let stored = objects(&mixed).await;
        assert_eq!(
            stored.keys().collect::<Vec<_>>(),
            [
                "0-00000000000000000000.parquet",
                "1-00000000000000000001.parquet",
                "2-00000000000000000002.parquet"
            ]
        );
        assert!(stored == objects(&plain).await, "other bytes");
        let mut ids = Vec::new();
        for (key, body) in &stored {
            let reader = ParquetRecordBatchReaderBuilder::try_new(body.clone())
                .unwrap()
                .build()
                .unwrap();
            for read in reader {
                let read = read.unwrap();
                let column = read.column_by_name("id").unwrap();
                let column = column.as_any().downcast_ref::<Int64Array>().unwrap();
                let partition = &key[..1];
                for id in column.values().iter() {
                    assert_eq!(partition, (id % 3).to_string(), "{id} in {key}");
                    ids.push(*id);
                }
            }
        }
        ids.sort_unstable();
        let accepted: Vec<i64> = (0..6_000).filter(|i| !unfit.contains(i)).collect();
        assert_eq!(ids, accepted, "a record missing or stored twice");
        // Refused by the encoder alone, and written in one write.
        assert_eq!(refused, unfit);
        assert_eq!(written.len(), 1);
    }
}
