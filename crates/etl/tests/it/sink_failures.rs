//! Whole pipelines against failing sinks: an error of the environment
//! halts the run with nothing committed past it and nothing dead-lettered;
//! an error of the data is pinned on exactly the record that causes it.
//! And a sink's batching never holds up the end of a bounded run.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use etl::{Pipeline, PipelineError};
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::{Broken, FailWhere, MemorySink};
use etl_sink::{
    PermanentErrorPolicy, RawLinesEncoder, RetryPolicy, SinkDriver, SinkDriverConfig,
    SinkDriverError, SinkError,
};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn generator(partitions: u32, records: u64, max_batch_records: usize) -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        partitions,
        records_per_partition: Some(records),
        max_batch_records,
        ..GeneratorConfig::default()
    })
    .unwrap()
}

/// Batches merged into large writes, and the dead-letter policy on: a
/// failure wrongly taken for bad data would show up as dead letters.
fn merging() -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: 1000,
        linger: Duration::from_millis(20),
        on_permanent_error: PermanentErrorPolicy::DeadLetter,
        ..SinkDriverConfig::default()
    }
}

fn committed(store: &MemoryStore, partition: u32) -> Offset {
    store
        .offsets()
        .get(&PartitionId(partition))
        .copied()
        .unwrap_or(Offset(0))
}

#[tokio::test(start_paused = true)]
async fn a_sink_with_a_broken_pipe_halts_the_pipeline_and_dead_letters_nothing() {
    let store = MemoryStore::new();
    let broken = Arc::new(Broken::broken_pipe());
    let dead = MemorySink::new();
    let pipeline = Pipeline::builder()
        .source(generator(3, 2_000, 50))
        .sink(
            "out",
            SinkDriver::new(broken.clone(), RawLinesEncoder::new()).config(merging()),
        )
        .dead_letter(dead.clone())
        .offset_store(store.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    match &err {
        PipelineError::Sink { name, source } => {
            assert_eq!(name, "out");
            assert!(source.is_io(), "{err}");
        }
        other => panic!("expected the sink's error, got {other}"),
    }
    assert!(
        err.to_string().to_lowercase().contains("broken pipe"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "halts at once, not after replays: {:?}",
        start.elapsed()
    );
    assert!(
        broken.calls() <= 4,
        "{} writes: no replay loop",
        broken.calls()
    );
    for p in 0..3 {
        assert_eq!(committed(&store, p), Offset(0), "partition {p}");
    }
    assert!(dead.positions().is_empty(), "no good record dead-lettered");
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_stays_unreachable_halts_after_its_retry_policy() {
    let store = MemoryStore::new();
    let broken = Arc::new(Broken::new(|| SinkError::retryable("broker unreachable")));
    let dead = MemorySink::new();
    let pipeline = Pipeline::builder()
        .source(generator(2, 500, 50))
        .sink(
            "out",
            SinkDriver::new(broken.clone(), RawLinesEncoder::new()).config(SinkDriverConfig {
                retry: RetryPolicy {
                    max_elapsed: Duration::from_secs(20),
                    ..RetryPolicy::default()
                },
                ..merging()
            }),
        )
        .dead_letter(dead.clone())
        .offset_store(store.clone())
        .build()
        .unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            PipelineError::Sink {
                source: SinkDriverError::Sink(SinkError::Retryable(_)),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("broker unreachable"), "{err}");
    assert_eq!(committed(&store, 0), Offset(0));
    assert_eq!(committed(&store, 1), Offset(0));
    assert!(dead.positions().is_empty());
}

#[tokio::test(start_paused = true)]
async fn only_the_record_a_merged_write_fails_on_is_dead_lettered() {
    // The sink fails any write holding offset 9 of partition 0, and merges
    // the single-record batches the source narrows a failing range to.
    let store = MemoryStore::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let bad = |r: &Record| r.position.partition == PartitionId(0) && r.position.offset == Offset(9);
    let pipeline = Pipeline::builder()
        .source(generator(2, 40, 10))
        .sink(
            "out",
            SinkDriver::new(FailWhere::new(memory.clone(), bad), RawLinesEncoder::new()).config(
                SinkDriverConfig {
                    on_permanent_error: PermanentErrorPolicy::Fail,
                    ..merging()
                },
            ),
        )
        .dead_letter(dead.clone())
        .offset_store(store.clone())
        .build()
        .unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    let dead: Vec<(PartitionId, Offset)> = dead.positions();
    assert_eq!(
        dead,
        vec![(PartitionId(0), Offset(9))],
        "exactly the bad record"
    );
    assert_eq!(summary.dead_lettered, 1);
    let written: BTreeSet<(PartitionId, Offset)> = memory.positions().into_iter().collect();
    let expected: BTreeSet<(PartitionId, Offset)> = (0..2)
        .flat_map(|p| (0..40).map(move |o| (PartitionId(p), Offset(o))))
        .filter(|&(p, o)| !(p == PartitionId(0) && o == Offset(9)))
        .collect();
    assert_eq!(written, expected, "every good record reached the sink");
    assert_eq!(committed(&store, 0), Offset(40));
    assert_eq!(committed(&store, 1), Offset(40));
}

#[tokio::test(start_paused = true)]
async fn a_long_linger_does_not_delay_the_end_of_a_bounded_run() {
    let store = MemoryStore::new();
    let memory = MemorySink::new();
    let linger = Duration::from_secs(3600);
    let pipeline = Pipeline::builder()
        .source(generator(2, 95, 10))
        .sink(
            "out",
            SinkDriver::new(memory.clone(), RawLinesEncoder::new()).config(SinkDriverConfig {
                batch_max_records: 1000,
                linger,
                ..SinkDriverConfig::default()
            }),
        )
        .offset_store(store.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    assert!(
        start.elapsed() < linger / 10,
        "the last partial batch is written once the input ends, not after its linger: {:?}",
        start.elapsed()
    );
    assert_eq!(memory.positions().len(), 190);
    assert_eq!(summary.committed.len(), 2);
    assert_eq!(committed(&store, 0), Offset(95));
    assert_eq!(committed(&store, 1), Offset(95));
}

/// A sink that halts on an error of its environment fails the batches it
/// holds; those failures must never count toward a poison verdict. With
/// single-record batches and one replay allowed, every batch in flight
/// when the sink halted looked like a record that "failed alone", and was
/// dead-lettered while the pipeline was stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_failed_by_a_halting_sink_are_never_dead_lettered_as_poison() {
    for round in 0..20 {
        let store = MemoryStore::new();
        let dead = MemorySink::new();
        let sink = etl_sink::testing::FailEveryNth::permanent(MemorySink::new(), 15);
        let pipeline = Pipeline::builder()
            .source(generator(2, 200, 1))
            .sink(
                "out",
                SinkDriver::new(sink, RawLinesEncoder::new()).config(SinkDriverConfig {
                    batch_max_records: 1,
                    linger: Duration::ZERO,
                    concurrency: 4,
                    retry: RetryPolicy::never(),
                    ..SinkDriverConfig::default()
                }),
            )
            .source_driver(etl_source::SourceDriverConfig {
                max_replays: 1,
                ..etl_source::SourceDriverConfig::default()
            })
            .dead_letter(dead.clone())
            .offset_store(store.clone())
            .build()
            .unwrap();
        let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
        assert!(matches!(err, PipelineError::Sink { .. }), "{err}");
        assert!(
            dead.positions().is_empty(),
            "round {round}: healthy records dead-lettered as poison: {:?}",
            dead.positions()
        );
    }
}
