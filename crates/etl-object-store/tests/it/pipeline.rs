//! Whole pipelines: the `object_store` type through the registry;
//! exactly-once through `Pipeline::builder()` across a failed run; and
//! objects rolling by bytes, by age, and at the in-flight bounds whatever
//! a batch may hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use etl::{Pipeline, Registry};
use etl_checkpoint::MemoryStore;
use etl_object_store::ObjectStoreSink;
use etl_record::SourceId;
use etl_sink::{RetryPolicy, SinkDriver, SinkDriverConfig};
use etl_source::{GeneratorConfig, GeneratorSource};
use object_store::local::LocalFileSystem;
use tokio_util::sync::CancellationToken;

use crate::faults::FaultyStore;
use crate::support::{config, read_folder, rows};

const GENERATED: &str = r#"
    key = "gen/{partition}-{first_offset}.parquet"
    [store]
    kind = "local"
    path = "lake"
    [encoding]
    format = "parquet"
    columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "user", type = "string", nullable = false },
        { name = "amount", type = "float64" },
        { name = "ts", type = "timestamp" },
        { name = "tags", type = "list", item = { name = "tag", type = "string" } },
    ]
"#;

/// How many times each id appears in the objects.
fn id_counts(folder: &std::path::Path) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for row in rows(&read_folder(folder, "gen")) {
        *counts.entry(row["id"].as_i64().unwrap()).or_default() += 1;
    }
    counts
}

/// Every file under `folder`, by path, with its inode.
fn files_by_inode(folder: &std::path::Path) -> BTreeMap<std::path::PathBuf, u64> {
    use std::os::unix::fs::MetadataExt;
    let mut files = BTreeMap::new();
    let mut folders = vec![folder.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                folders.push(entry.path());
            } else {
                files.insert(entry.path(), meta.ino());
            }
        }
    }
    files
}

/// A configuration: `per_partition` records of 2 partitions from the
/// generator into the `object_store` sink `lake` over [`GENERATED`], with
/// `extra` lines in the sink's table.
fn generated_pipeline(per_partition: u64, extra: &str) -> String {
    let table: String = GENERATED
        .lines()
        .map(|l| {
            let l = l.trim();
            if l.starts_with('[') && !l.starts_with("[[") && l != "[" {
                format!("[sinks.{}", &l[1..])
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        "[source]\ntype = \"generator\"\npartitions = 2\nrecords_per_partition = {per_partition}\n\n\
         [[sinks]]\ntype = \"object_store\"\nname = \"lake\"\nbatch_max_records = 100\n{extra}\n{table}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_type_runs_from_a_configuration_through_the_registry() {
    let folder = tempfile::tempdir().unwrap();
    let registry = etl_object_store::register(Registry::new());
    let text = generated_pipeline(300, "");
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let counts = id_counts(&folder.path().join("lake"));
    assert_eq!(counts.len(), 600);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}

/// A file of NDJSON lines, one of them not JSON, into Parquet objects
/// from a configuration: `ndjson` or `parquet` objects; the dead letters
/// as the `[dead_letter]` file holds them, and the ids the objects hold.
async fn file_into(format: &str) -> (String, Vec<i64>) {
    let folder = tempfile::tempdir().unwrap();
    let lines = [
        "{\"id\":1,\"user\":\"a\"}",
        "not json",
        "{\"id\":3,\"user\":\"c\"}",
    ];
    std::fs::write(folder.path().join("in.ndjson"), lines.join("\n") + "\n").unwrap();
    let encoding = if format == "parquet" {
        "format = \"parquet\"\ncolumns = [{ name = \"id\", type = \"int64\", nullable = false }]"
    } else {
        "format = \"ndjson\""
    };
    let text = format!(
        "[source]\ntype = \"file\"\npaths = [\"in.ndjson\"]\n\n\
         [[sinks]]\ntype = \"object_store\"\nname = \"lake\"\nkey = \"k/{{partition}}-{{first_offset}}.{format}\"\n\
         [sinks.store]\nkind = \"local\"\npath = \"lake\"\n[sinks.encoding]\n{encoding}\n\n\
         [dead_letter]\ntype = \"file\"\npath = \"dead.ndjson\"\n\n\
         [checkpoint]\nstore = {{ type = \"memory\" }}\n"
    );
    let registry = etl_object_store::register(Registry::new());
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    let dead = std::fs::read_to_string(folder.path().join("dead.ndjson")).unwrap();
    // Every line is delivered or dead-lettered, once.
    assert_eq!(summary.dead_lettered, 1, "{dead}");
    assert_eq!(summary.written(), 2, "{dead}");
    let ids = if format == "parquet" {
        rows(&read_folder(&folder.path().join("lake"), "k"))
            .iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect()
    } else {
        Vec::new()
    };
    (dead, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_is_not_json_is_dead_lettered_once_by_the_parquet_sink_the_file_source_leaves_it_to()
 {
    let (dead, ids) = file_into("parquet").await;
    // The sink's reason: the source did not read the line as JSON first.
    assert!(dead.contains("the value is not JSON"), "{dead}");
    assert!(!dead.contains("invalid JSON"), "{dead}");
    assert_eq!(ids, [1, 3]);
    // Before an NDJSON object, which reads nothing, the source checks.
    let (dead, _) = file_into("ndjson").await;
    assert!(dead.contains("invalid JSON"), "{dead}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_sink_from_the_configuration_resumes_from_the_store_not_the_local_offsets()
{
    let folder = tempfile::tempdir().unwrap();
    let registry = etl_object_store::register(Registry::new());
    let text = generated_pipeline(300, "exactly_once = true");
    let mut objects = Vec::new();
    for _ in 0..2 {
        let config = registry.loader().text(&text, folder.path()).unwrap();
        let pipeline = etl::pipeline_from_config(&config).await.unwrap();
        pipeline.run(CancellationToken::new()).await.unwrap();
        objects.push(files_by_inode(&folder.path().join("lake")));
        // The local offsets lost between the runs: the second run starts
        // from the progress the store holds, so it writes nothing again
        // (an at-least-once sink would put every object again, each a new
        // file under its old name).
        let _ = std::fs::remove_dir_all(folder.path().join(".etl-state"));
    }
    assert!(!objects[0].is_empty());
    assert_eq!(objects[0], objects[1], "the second run wrote objects again");
    let counts = id_counts(&folder.path().join("lake"));
    assert_eq!(counts.len(), 600);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lake_example_runs_against_a_local_folder() {
    let folder = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lake/pipeline.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let registry = etl_object_store::register(Registry::new());
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let objects = read_folder(&folder.path().join("lake"), "orders");
    // Cut by the batches: 5000 records at most, and the pipeline's share
    // of its in-flight bytes.
    assert!(objects.len() >= 4, "{} objects", objects.len());
    assert!(objects.iter().all(|(_, _, r)| r.len() <= 5000));
    let mut ids: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..20_000).collect::<Vec<_>>());
}

async fn exactly_once_run(
    store: Arc<FaultyStore>,
    source_batch: usize,
) -> Result<etl::Summary, etl::PipelineError> {
    let source = GeneratorSource::new(GeneratorConfig {
        name: SourceId::new("gen"),
        partitions: 2,
        records_per_partition: Some(400),
        max_batch_records: source_batch,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let sink = ObjectStoreSink::exactly_once_with_store("lake", config(GENERATED), store)
        .await
        .unwrap();
    let encoder = sink.encoder();
    let (driver, progress) = SinkDriver::exactly_once(sink, encoder);
    let driver = driver.config(SinkDriverConfig {
        batch_max_records: 1,
        retry: RetryPolicy::never(),
        ..SinkDriverConfig::default()
    });
    Pipeline::builder()
        .source(source)
        .exactly_once_sink("lake", driver, progress)
        // A new offset store each run: what was stored survives in the
        // object store only.
        .offset_store(MemoryStore::new())
        .build()
        .unwrap()
        .run(CancellationToken::new())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_pipeline_halted_between_data_and_progress_resumes_from_the_store_without_duplicates()
 {
    let folder = tempfile::tempdir().unwrap();
    let local: Arc<dyn object_store::ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let store = Arc::new(FaultyStore::new(local));
    // The first run stores three progress objects, then its progress
    // writes fail: the data of that write is in the store, its progress
    // is not.
    *store.fail_puts_under.lock().unwrap() = Some("_etl_progress".to_owned());
    store
        .puts_before_failing
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let first = exactly_once_run(store.clone(), 50).await;
    assert!(first.is_err(), "{first:?}");
    let written = id_counts(folder.path());
    assert!(
        !written.is_empty() && written.len() < 800,
        "{} ids",
        written.len()
    );

    // The second run cuts its batches elsewhere: the object past the
    // stored progress is replaced, not duplicated.
    *store.fail_puts_under.lock().unwrap() = None;
    exactly_once_run(store.clone(), 35).await.unwrap();
    let counts = id_counts(folder.path());
    assert_eq!(counts.len(), 800, "every record stored");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
}

/// Run 1,000 generated records of one partition (`source` lines in the
/// `[source]` table) into NDJSON objects in a folder, with `sink` lines in
/// the sink's table and `limits` in `[limits]`: each object's size in
/// bytes and line count, in key order, once every id was checked to be in
/// exactly one object.
async fn objects_of_a_run(source: &str, sink: &str, limits: &str) -> Vec<(u64, usize)> {
    let folder = tempfile::tempdir().unwrap();
    let text = format!(
        "[source]\ntype = \"generator\"\npartitions = 1\nrecords_per_partition = 1000\n\
         max_batch_records = 10\n{source}\n\n\
         [[sinks]]\ntype = \"object_store\"\nname = \"lake\"\nkey = \"gen/{{partition}}-{{first_offset}}.ndjson\"\n\
         batch_max_records = 1000000\n{sink}\n\
         [sinks.store]\nkind = \"local\"\npath = \"lake\"\n[sinks.encoding]\nformat = \"ndjson\"\n\n\
         [limits]\n{limits}\n\n[checkpoint]\nstore = {{ type = \"memory\" }}\n"
    );
    let registry = etl_object_store::register(Registry::new());
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let objects = read_folder(&folder.path().join("lake"), "gen");
    let mut ids: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..1000).collect::<Vec<_>>(), "every record once");
    let dir = folder.path().join("lake/gen");
    let mut sizes: Vec<(String, u64, usize)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let text = std::fs::read_to_string(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                text.len() as u64,
                text.lines().count(),
            )
        })
        .collect();
    sizes.sort();
    sizes.into_iter().map(|(_, b, n)| (b, n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_roll_at_batch_max_bytes_with_the_chunk_that_reached_it() {
    // The generator's records are well under 200 bytes a line, and the
    // source hands on chunks of 10: an object closes once it reaches
    // 4 KiB, with the chunk that took it there.
    let objects = objects_of_a_run("", "batch_max_bytes = 4096\nlinger = \"1h\"", "").await;
    assert!(objects.len() >= 1000 * 60 / (4096 + 2000), "{objects:?}");
    for &(bytes, _) in &objects {
        assert!(
            bytes < 4096 + 10 * 200,
            "an object of {bytes} bytes: {objects:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_roll_at_linger_while_the_source_is_slow() {
    // 400 records a second for 2.5 s, far below every other bound (the
    // in-flight bounds room for the whole input, so the source never
    // waits for credit): with a linger of an hour the batch is written
    // once, at the input's end; with 100 ms, again and again.
    let room = "max_in_flight_batches = 1000\nmax_in_flight_batches_per_partition = 1000";
    let (slow, quick) = tokio::join!(
        objects_of_a_run("rate = 400", "linger = \"1h\"", room),
        objects_of_a_run("rate = 400", "linger = \"100ms\"", room),
    );
    assert_eq!(slow.len(), 1, "{slow:?}");
    assert!(quick.len() >= 5, "{quick:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_holds_no_more_than_the_in_flight_bounds_whatever_batch_max_bytes_allows() {
    // A batch could grow to 1 GiB, but the source stops at 32 KiB in
    // flight (a record counts its bytes and 200 more): the sink writes
    // what it holds while the source waits, so no object exceeds that.
    let objects = objects_of_a_run(
        "",
        "batch_max_bytes = \"1GiB\"\nlinger = \"1h\"",
        "max_in_flight_bytes = \"32KiB\"\nmax_in_flight_bytes_per_partition = \"32KiB\"",
    )
    .await;
    assert!(objects.len() >= 2, "{objects:?}");
    for &(bytes, lines) in &objects {
        assert!(
            bytes + 200 * lines as u64 <= 32 << 10,
            "an object of {bytes} bytes in {lines} lines: {objects:?}"
        );
    }
}
