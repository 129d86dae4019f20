//! The runtime's teardown paths: a panicking transform fails the batch it
//! was working on, so its offsets are never committed.

#![allow(clippy::unwrap_used)]

use etl::{Pipeline, PipelineError, map};
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{BlackholeSink, RawLinesEncoder, SinkDriver};
use etl_source::{GeneratorConfig, GeneratorSource};
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

/// Hole: the stage owned the source -> stage channel, so a panic dropped
/// the batches still queued there, and dropping a batch's handle read as
/// delivered. Other partitions then committed past records no sink wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_transform_never_lets_queued_batches_of_other_partitions_commit() {
    for workers in [1, 2] {
        let store = MemoryStore::new();
        let sink = etl_sink::testing::MemorySink::new();
        let source = GeneratorSource::new(GeneratorConfig {
            partitions: 3,
            records_per_partition: Some(2_000),
            batch_records: 10,
            ..GeneratorConfig::default()
        })
        .unwrap();
        // A gate keeps the panic back until the source channel is full, so
        // the panic finds batches of every partition queued behind it.
        let pipeline = Pipeline::builder()
            .source(source)
            .transform(map("explodes", |r: &Record| {
                if r.position.partition == PartitionId(0) && r.position.offset == Offset(500) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    panic!("a bug in user code");
                }
                Ok(r.clone())
            }))
            .transform_workers(workers)
            .sink(
                "memory",
                SinkDriver::new(sink.clone(), RawLinesEncoder::new()),
            )
            .offset_store(store.clone())
            .build()
            .unwrap();
        let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
        assert!(matches!(err, PipelineError::Internal(_)), "{err}");
        let written: std::collections::BTreeSet<(PartitionId, Offset)> =
            sink.positions().into_iter().collect();
        for (partition, committed) in store.offsets() {
            for offset in 0..committed.0 {
                assert!(
                    written.contains(&(partition, Offset(offset))),
                    "workers {workers}: partition {} committed {committed} but offset {offset} never reached the sink",
                    partition.0
                );
            }
        }
    }
}
