//! The object-store sink in the simulation: the exactly-once sink of a
//! scenario, or sink 0 of an at-least-once one, is, when the scenario
//! says so (`Scenario::lake`), `etl_object_store::ObjectStoreSink` over
//! an in-memory store that fails, loses the answer to, and delays the
//! requests the scenario scripts, and dies with the process. It writes
//! NDJSON objects (each record's value a JSON string) or Parquet objects
//! of a declared schema (one non-nullable string column `v` holding the
//! value), in one PUT or as multipart uploads.
//!
//! The store outlives the runs (it is the world's); after each run the
//! model reads what it holds into the sink's state, so the same checks
//! judge it as any sink: every object's records (NDJSON lines, or Parquet
//! rows read with the `parquet` crate, apart from the sink's own code)
//! and, exactly-once, the stored progress. An at-least-once sink's
//! objects may hold a record twice (a retry after a lost answer, a replay
//! cut into other objects): the model of the at-least-once sinks allows
//! it, and checks that every record below a committed offset is in some
//! object.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, StringArray};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use etl_object_store::{ObjectStoreSink, ObjectStoreSinkConfig};
use etl_record::Record;
use etl_sink::{EncodedBatch, Encoder, Progress, ProgressSink, Sink, SinkError};
use futures::TryStreamExt;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::scenario::{Lake, LakeFormat, StoreFault};
use super::world::{Life, World, Write};

/// Where the data objects are (the progress is under `_etl_progress/`).
const DATA: &str = "sim";

/// The Parquet column holding each record's value.
const COLUMN: &str = "v";

/// The sink's configuration: one object per partition and write, named by
/// its first offset.
fn config(lake: &Lake, exactly_once: bool) -> ObjectStoreSinkConfig {
    let extension = match lake.format {
        LakeFormat::Ndjson => "ndjson",
        LakeFormat::Parquet => "parquet",
    };
    let mut table = serde_json::json!({
        "store": { "kind": "local", "path": "sim-lake" },
        "key": format!("{DATA}/{{partition}}/{{first_offset}}.{extension}"),
        "exactly_once": exactly_once,
    });
    if lake.format == LakeFormat::Parquet {
        table["encoding"] = serde_json::json!({
            "format": "parquet",
            "columns": [{ "name": COLUMN, "type": "string", "nullable": false }],
        });
    }
    if let Some(n) = lake.max_object_offsets {
        table["max_object_offsets"] = serde_json::json!(u64::from(n.max(1)));
    }
    if lake.multipart {
        // Every object past a few lines (every Parquet object) goes up in
        // parts of 5 MiB at most: one part and the completion, each a
        // request of its own.
        table["multipart_threshold"] = serde_json::json!(16);
    }
    serde_json::from_value(table).unwrap_or_else(|e| panic!("sim: lake configuration: {e}"))
}

/// The sink (recording each write in the world) and its encoder, for one
/// process `life`. Exactly-once, the progress is read from the store
/// through the faults, as a starting process reads it.
pub async fn open(
    lake: &Lake,
    exactly_once: bool,
    world: &World,
    life: &Life,
) -> Result<(LakeSink, JsonValues), String> {
    let store = Arc::new(FaultyMemory {
        world: world.clone(),
        life: life.clone(),
        faults: lake.faults.clone(),
    });
    let config = config(lake, exactly_once);
    let sink = if exactly_once {
        ObjectStoreSink::exactly_once_with_store("sink0", config, store).await
    } else {
        ObjectStoreSink::with_store("sink0", config, store)
    }
    .map_err(|e| e.to_string())?;
    let encoder = JsonValues {
        inner: sink.encoder(),
        format: lake.format,
    };
    Ok((
        LakeSink {
            sink,
            format: lake.format,
            world: world.clone(),
        },
        encoder,
    ))
}

/// Read what the store holds into sink 0's state: every object's records
/// (each value the one the source read, `p:o`, perhaps with a copy's
/// `#k`) and, exactly-once, the stored progress.
pub fn observe(lake: &Lake, exactly_once: bool, world: &World) {
    let store: Arc<InMemory> = world.lock().lake.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("sim: a runtime to read the lake: {e}"));
    let (contents, progress) = runtime.block_on(async {
        let mut contents = Vec::new();
        let objects: Vec<ObjectMeta> = store
            .list(Some(&Path::from(DATA)))
            .try_collect()
            .await
            .unwrap_or_else(|e| panic!("sim: list the lake: {e}"));
        for meta in objects {
            let read = async { store.get(&meta.location).await?.bytes().await };
            let bytes = read
                .await
                .unwrap_or_else(|e| panic!("sim: read {}: {e}", meta.location));
            let values = match lake.format {
                LakeFormat::Ndjson => ndjson_values(&bytes),
                LakeFormat::Parquet => parquet_values(bytes),
            }
            .unwrap_or_else(|e| panic!("sim: {}: {e}", meta.location));
            for value in values {
                let (p, o) = position(&value).unwrap_or_else(|| {
                    panic!("sim: {} holds {value:?}, no record's", meta.location)
                });
                contents.push((p, o, value));
            }
        }
        let progress = if exactly_once {
            ObjectStoreSink::exactly_once_with_store("sink0", config(lake, true), store)
                .await
                .map(|sink| sink.progress())
                .unwrap_or_else(|e| panic!("sim: read the lake's progress: {e}"))
        } else {
            Progress::new()
        };
        (contents, progress)
    });
    let mut state = world.lock();
    state.sinks[0].contents = contents;
    state.sinks[0].progress = progress;
}

/// The values of an NDJSON object: one JSON string a line.
fn ndjson_values(bytes: &[u8]) -> Result<Vec<String>, String> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            serde_json::from_slice(line).map_err(|e| {
                format!(
                    "a line that is not a JSON string ({e}): {:?}",
                    String::from_utf8_lossy(line)
                )
            })
        })
        .collect()
}

/// The values of a Parquet object, read with the `parquet` crate: its one
/// column, `v`, a string that is never null; as many as the footer says
/// the object holds rows.
fn parquet_values(bytes: Bytes) -> Result<Vec<String>, String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| format!("not a Parquet object: {e}"))?;
    let rows = builder.metadata().file_metadata().num_rows();
    let fields = builder.schema().fields();
    if fields.len() != 1 || fields[0].name() != COLUMN || fields[0].is_nullable() {
        return Err(format!(
            "its schema is {fields:?}, not the one non-nullable column {COLUMN:?}"
        ));
    }
    let reader = builder
        .build()
        .map_err(|e| format!("cannot read its rows: {e}"))?;
    let mut values = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot read its rows: {e}"))?;
        let column = batch
            .column_by_name(COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| format!("no string column {COLUMN:?} in a row group"))?;
        if column.null_count() > 0 {
            return Err(format!("{} null value(s)", column.null_count()));
        }
        values.extend(column.iter().flatten().map(str::to_owned));
    }
    if i64::try_from(values.len()) != Ok(rows) {
        return Err(format!(
            "{} rows read, the footer says {rows}",
            values.len()
        ));
    }
    Ok(values)
}

/// The partition and offset a value `p:o` or `p:o#k` was read at.
fn position(value: &str) -> Option<(u32, i64)> {
    let (p, rest) = value.split_once(':')?;
    let o = rest.split_once('#').map_or(rest, |(o, _)| o);
    Some((p.parse().ok()?, o.parse().ok()?))
}

/// The source's values are not JSON: each goes to the sink as JSON
/// (a JSON string in an NDJSON object, `{"v": value}` for a Parquet row),
/// through the sink's own encoder (which refuses, before the write, what
/// the sink could not store).
#[derive(Debug)]
pub struct JsonValues {
    inner: etl_object_store::ValueEncoder,
    format: LakeFormat,
}

impl Encoder for JsonValues {
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
        self.inner.encode(&as_json(record, self.format)?, out)
    }
}

/// `record` with its value as the sink stores it in `format`.
fn as_json(record: &Record, format: LakeFormat) -> Result<Record, SinkError> {
    let text = String::from_utf8_lossy(&record.value);
    let json = match format {
        LakeFormat::Ndjson => serde_json::to_vec(&*text),
        LakeFormat::Parquet => serde_json::to_vec(&serde_json::json!({ COLUMN: text })),
    }
    .map_err(SinkError::permanent)?;
    let mut record = record.clone();
    record.value = json.into();
    Ok(record)
}

/// The object-store sink, each write logged in the world as the
/// scripted sinks log theirs (the model judges dead letters by them).
///
/// A Parquet object is made of the records' values, not of their encoded
/// lines: the sink is given the batch again with each value as JSON
/// (`{"v": value}`), encoded by its own encoder in one call, as a
/// pipeline of JSON records hands it over.
#[derive(Debug)]
pub struct LakeSink {
    sink: ObjectStoreSink,
    format: LakeFormat,
    world: World,
}

#[async_trait]
impl Sink for LakeSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let records: Vec<(u32, i64)> = batch
            .records()
            .iter()
            .map(|r| (r.position.partition.0, r.position.offset.0))
            .collect();
        let entry = {
            let mut state = self.world.lock();
            let sink = &mut state.sinks[0];
            sink.calls += 1;
            sink.writes.push(Write {
                records,
                ok: false,
                environment: false,
            });
            sink.writes.len() - 1
        };
        let result = match self.format {
            LakeFormat::Ndjson => self.sink.write(batch).await,
            LakeFormat::Parquet => {
                let records = batch
                    .records()
                    .iter()
                    .map(|r| as_json(r, self.format))
                    .collect::<Result<Vec<_>, _>>()?;
                let (json, refused) = EncodedBatch::encode(records, &self.sink.encoder());
                if let Some((record, e)) = refused.first() {
                    // The driver's encoder accepted the same values.
                    panic!(
                        "sim: the sink's encoder refused {} on the write, not before: {e}",
                        record.idempotency_key()
                    );
                }
                self.sink.write(&json).await
            }
        };
        let mut state = self.world.lock();
        let write = &mut state.sinks[0].writes[entry];
        match &result {
            Ok(()) => write.ok = true,
            Err(e) => write.environment = e.kind() == etl_sink::FailureKind::Environment,
        }
        result
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.sink.flush().await
    }
}

#[async_trait]
impl ProgressSink for LakeSink {
    fn progress(&self) -> Progress {
        self.sink.progress()
    }

    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        self.sink.reload_progress().await
    }
}

/// The world's in-memory store, as one process sees it: requests are
/// counted over the whole scenario, so a scripted fault fires once; a
/// dead process's requests never finish (nothing becomes durable).
#[derive(Debug)]
struct FaultyMemory {
    world: World,
    life: Life,
    faults: Vec<StoreFault>,
}

/// What the scripts make of one request.
enum Fate {
    /// Done, answered.
    Answer,
    /// Not done; answered with an error.
    Fail,
    /// Done; the answer lost (an error instead).
    Lose,
    /// Done; answered after this long.
    Late(Duration),
}

impl FaultyMemory {
    /// Count a request and say what happens to it; `None` when the
    /// process is dead.
    fn request(&self) -> Option<(Arc<InMemory>, Fate)> {
        let mut state = self.world.lock();
        if !self.life.alive() {
            return None;
        }
        let call = state.lake_calls;
        state.lake_calls += 1;
        let fate = if state.healed {
            Fate::Answer
        } else {
            self.faults
                .iter()
                .find_map(|f| match *f {
                    StoreFault::Fail(n) if u64::from(n) == call => Some(Fate::Fail),
                    StoreFault::Lose(n) if u64::from(n) == call => Some(Fate::Lose),
                    StoreFault::Late(n, ms) if u64::from(n) == call => {
                        Some(Fate::Late(Duration::from_millis(u64::from(ms))))
                    }
                    _ => None,
                })
                .unwrap_or(Fate::Answer)
        };
        Some((state.lake.clone(), fate))
    }

    /// Run `op` on the store as the request's fate says.
    async fn run<T>(
        &self,
        what: &str,
        op: impl AsyncFnOnce(Arc<InMemory>) -> object_store::Result<T>,
    ) -> object_store::Result<T> {
        let Some((store, fate)) = self.request() else {
            return std::future::pending().await;
        };
        if matches!(fate, Fate::Fail) {
            return Err(injected(what, "failed"));
        }
        let result = op(store).await;
        match fate {
            Fate::Lose => Err(injected(what, "lost its answer")),
            Fate::Late(after) => {
                tokio::time::sleep(after).await;
                if self.life.alive() {
                    result
                } else {
                    std::future::pending().await
                }
            }
            Fate::Answer | Fate::Fail => result,
        }
    }
}

fn injected(what: &str, how: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "sim",
        source: format!("sim: {what} {how}").into(),
    }
}

impl std::fmt::Display for FaultyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyMemory")
    }
}

#[async_trait]
impl ObjectStore for FaultyMemory {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.run(&format!("PUT {location}"), async |s| {
            s.put_opts(location, payload, opts).await
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let inner = self
            .run(&format!("create upload {location}"), async |s| {
                s.put_multipart_opts(location, opts).await
            })
            .await?;
        Ok(Box::new(FaultyUpload {
            inner,
            store: Arc::new(FaultyMemory {
                world: self.world.clone(),
                life: self.life.clone(),
                faults: self.faults.clone(),
            }),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.run(&format!("GET {location}"), async |s| {
            s.get_opts(location, options).await
        })
        .await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.run(&format!("GET {location}"), async |s| {
            s.get_ranges(location, ranges).await
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.world.lock().lake.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.world.lock().lake.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.run("LIST", async |s| s.list_with_delimiter(prefix).await)
            .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.run(&format!("COPY {from}"), async |s| {
            s.copy_opts(from, to, options).await
        })
        .await
    }
}

/// A multipart upload whose parts and completion are requests of the
/// faulty store.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    store: Arc<FaultyMemory>,
    location: Path,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.inner.put_part(data);
        let store = self.store.clone();
        let what = format!("part of {}", self.location);
        Box::pin(async move { store.run(&what, async |_| part.await).await })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let what = format!("complete {}", self.location);
        let store = self.store.clone();
        let inner = &mut self.inner;
        store.run(&what, async |_| inner.complete().await).await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let what = format!("abort {}", self.location);
        let store = self.store.clone();
        let inner = &mut self.inner;
        store.run(&what, async |_| inner.abort().await).await
    }
}
