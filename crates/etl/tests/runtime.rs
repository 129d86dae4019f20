//! The runtime's teardown paths: a panicking transform fails the batch it
//! was working on, so its offsets are never committed; a dead letter that
//! never became durable is produced again by the next run.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etl::{Pipeline, PipelineError, map};
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::{FailEveryNth, MemorySink};
use etl_sink::{
    BlackholeSink, FileSink, FileSinkConfig, NdjsonEncoder, RawLinesEncoder, Sink, SinkDriver,
};
use etl_source::{FileSource, FileSourceConfig, GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_panicking_transform_fails_its_batch() {
    let store = MemoryStore::new();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(100),
        batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(map("explodes", |r: &Record| {
            assert!(r.position.offset != Offset(25), "a bug in user code");
            Ok(r.clone())
        }))
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .offset_store(store.clone())
        .build()
        .unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, PipelineError::Internal(_)), "{err}");
    let committed = store
        .offsets()
        .get(&PartitionId(0))
        .copied()
        .unwrap_or(Offset(0));
    assert!(
        committed <= Offset(20),
        "committed {committed}: the batch holding offset 25 never reached the sink"
    );
}

/// 20 NDJSON lines; the tenth is not JSON, so the source sends it to the
/// dead-letter path.
fn input_with_a_bad_line(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for id in 0..20 {
        if id == 9 {
            text.push_str("not json\n");
        } else {
            text.push_str(&format!("{{\"id\":{id}}}\n"));
        }
    }
    let path = dir.join("in.ndjson");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

async fn exactly_once_pipeline(
    dir: &std::path::Path,
    store: &MemoryStore,
    dead_letter: impl Sink + 'static,
) -> Pipeline {
    let source = FileSource::open(FileSourceConfig {
        inputs: vec![input_with_a_bad_line(dir)],
        ..FileSourceConfig::default()
    })
    .unwrap();
    let file = FileSink::open(
        dir.join("out.ndjson"),
        FileSinkConfig {
            exactly_once: true,
            ..FileSinkConfig::default()
        },
    )
    .await
    .unwrap();
    let (driver, progress) = SinkDriver::exactly_once(file, NdjsonEncoder::new());
    Pipeline::builder()
        .source(source)
        .exactly_once_sink("out", driver, progress)
        .dead_letter(dead_letter)
        .offset_store(store.clone())
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Lines of the exactly-once output by id, with their counts.
fn output_ids(dir: &std::path::Path) -> BTreeMap<u64, usize> {
    let text = std::fs::read_to_string(dir.join("out.ndjson")).unwrap_or_default();
    let mut ids = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        *ids.entry(v["id"].as_u64().unwrap()).or_default() += 1;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_failed_before_a_stop_is_written_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new();

    // The dead-letter sink refuses every write (a full disk); the run is
    // stopped while the bad line keeps failing.
    let full = Arc::new(FailEveryNth::permanent(MemorySink::new(), 1));
    let pipeline = exactly_once_pipeline(dir.path(), &store, full.clone()).await;
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    for _ in 0..1000 {
        if full.calls() > 0 && output_ids(dir.path()).len() == 19 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(full.calls() > 0, "the dead letter was never attempted");
    stop.cancel();
    let _ = run.await.unwrap();
    assert_eq!(output_ids(dir.path()).len(), 19, "the good lines are stored");

    // The next run has a working dead-letter sink: the line is written
    // there, and the exactly-once output gains nothing twice.
    let dead = MemorySink::new();
    let pipeline = exactly_once_pipeline(dir.path(), &store, dead.clone()).await;
    pipeline.run(CancellationToken::new()).await.unwrap();
    let letters = String::from_utf8(dead.bytes()).unwrap();
    assert!(letters.contains("not json"), "lost: {letters:?}");
    let out = output_ids(dir.path());
    assert_eq!(out.len(), 19);
    assert!(out.values().all(|n| *n == 1), "{out:?}");
}
