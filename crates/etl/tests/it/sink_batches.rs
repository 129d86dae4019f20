//! A sink's batches and the in-flight bound: a pipeline cuts each sink's
//! batches at a small share of what may be in flight, so that one batch
//! filling, then being written and synced, never holds back the source.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etl::{Pipeline, Route, filter};
use etl_checkpoint::{CheckpointConfig, InFlightLimits, MemoryStore};
use etl_record::Record;
use etl_sink::{EncodedBatch, NdjsonEncoder, Sink, SinkDriver, SinkDriverConfig, SinkError};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

/// Keeps the size of every batch written, and its records.
#[derive(Clone, Debug, Default)]
struct Sizes(Arc<Mutex<Vec<(usize, usize)>>>);

#[async_trait]
impl Sink for Sizes {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        self.0
            .lock()
            .unwrap()
            .push((batch.bytes().len(), batch.records().len()));
        Ok(())
    }
}

/// Run `pipeline` to its end, on real time: a run that waits for a
/// sink's linger of an hour (when `waiting`: nothing told the sink to
/// write sooner) is cut at two minutes.
async fn within_two_minutes(pipeline: Pipeline, waiting: &str) -> etl::Summary {
    tokio::time::timeout(
        Duration::from_secs(120),
        pipeline.run(CancellationToken::new()),
    )
    .await
    .unwrap_or_else(|_| panic!("the run waits for a linger of an hour on {waiting}"))
    .unwrap()
}

/// A generator of `records` records on one partition, ten a batch.
fn ten_a_batch(records: u64) -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(records),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap()
}

/// Checkpointing with at most `bytes` in flight.
fn bytes_in_flight(bytes: u64) -> CheckpointConfig {
    CheckpointConfig {
        limits: InFlightLimits {
            max_in_flight_bytes: bytes,
            max_in_flight_bytes_per_partition: bytes,
            ..InFlightLimits::default()
        },
        ..CheckpointConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sinks_batches_are_cut_at_a_sixteenth_of_the_in_flight_bound() {
    const RECORDS: u64 = 20_000;
    const IN_FLIGHT: u64 = 256 << 10;
    let source = ten_a_batch(RECORDS);
    let sizes = Sizes::default();
    // The driver's own limits (8192 records, 4 MiB) are far above the
    // in-flight bound: uncut, a batch would fill with everything in
    // flight and wait for its linger while the source waits for it.
    let pipeline = Pipeline::builder()
        .source(source)
        .sink(
            "sizes",
            SinkDriver::new(sizes.clone(), NdjsonEncoder::new()),
        )
        .offset_store(MemoryStore::new())
        .checkpoint(bytes_in_flight(IN_FLIGHT))
        .build()
        .unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(summary.written(), RECORDS, "{summary:?}");
    let sizes = sizes.0.lock().unwrap().clone();
    assert_eq!(
        sizes.iter().map(|&(_, n)| n as u64).sum::<u64>(),
        RECORDS,
        "every record in one batch or another"
    );
    let largest = sizes.iter().map(|&(bytes, _)| bytes).max().unwrap();
    // Cut once it reaches the share; the source's batch of ten records
    // (of about 100 bytes) that took it there stays whole.
    assert!(
        largest <= (IN_FLIGHT / 16) as usize + 2048,
        "a batch of {largest} bytes against an in-flight bound of {IN_FLIGHT} ({} batches)",
        sizes.len()
    );
}

/// A sink that takes one record in a hundred fills its batch a hundred
/// times slower than the source fills the in-flight bound. Its partial
/// batch holds back every source batch it has a record of, so once the
/// bound is reached the source waits for it: a starved source asks the
/// sinks to write what they hold (as a Kafka producer sends its batches
/// when its buffer memory is exhausted) rather than wait for their
/// linger, once per window.
///
/// On real time (a paused clock jumps to the next linger whenever the
/// runtime idles while the checkpointer's thread works): the linger is an
/// hour, and a run that waits for it is cut at two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_starved_by_a_sinks_partial_batch_gets_it_written_before_its_linger() {
    const RECORDS: u64 = 20_000;
    const IN_FLIGHT: u64 = 64 << 10;
    let source = ten_a_batch(RECORDS);
    let (all, rare) = (Sizes::default(), Sizes::default());
    let linger = Duration::from_secs(3600);
    let config = SinkDriverConfig {
        batch_max_records: 1000,
        linger,
        ..SinkDriverConfig::default()
    };
    let pipeline = Pipeline::builder()
        .source(source)
        .sink(
            "all",
            SinkDriver::new(all.clone(), NdjsonEncoder::new()).config(config),
        )
        .sink(
            "rare",
            SinkDriver::new(rare.clone(), NdjsonEncoder::new()).config(config),
        )
        .route(
            "rare",
            Route::new().when(filter("one in a hundred", |r: &Record| {
                r.position.offset.0 % 100 == 0
            })),
        )
        .offset_store(MemoryStore::new())
        .checkpoint(bytes_in_flight(IN_FLIGHT))
        .build()
        .unwrap();
    let summary = within_two_minutes(pipeline, "a starved source").await;
    assert_eq!(summary.written(), RECORDS + RECORDS / 100, "{summary:?}");
    let written =
        |sizes: &Sizes| -> u64 { sizes.0.lock().unwrap().iter().map(|&(_, n)| n as u64).sum() };
    assert_eq!(written(&all), RECORDS);
    assert_eq!(written(&rare), RECORDS / 100);
}

/// Holds the record of one offset for a while, as a slow step would: the
/// source has read its last record and announced the end of its input
/// while that batch is still on its way to the sinks.
struct SlowAt(i64, Duration);

impl etl::Transform for SlowAt {
    fn name(&self) -> &str {
        "slow"
    }
    fn apply(&mut self, record: Record) -> etl::Outcome {
        if record.position.offset.0 == self.0 {
            std::thread::sleep(self.1);
        }
        etl::Outcome::Keep(record)
    }
    fn fork(&self) -> Option<Box<dyn etl::Transform>> {
        Some(Box::new(SlowAt(self.0, self.1)))
    }
}

/// Once the source has read all its input, a sink writes its partial
/// batch without lingering, but only with every record read before the
/// end: told of the end while the last batch was still in the transform
/// stage, it wrote what it held, then the last records alone, one write
/// (one object, for a lake) more than the input needs.
async fn the_end_reaches_the_sink_behind_the_last_records(workers: usize) {
    let sizes = Sizes::default();
    let pipeline = Pipeline::builder()
        .source(ten_a_batch(95))
        .transform(SlowAt(94, Duration::from_millis(300)))
        .transform_workers(workers)
        .sink(
            "sizes",
            SinkDriver::new(sizes.clone(), NdjsonEncoder::new()).config(SinkDriverConfig {
                batch_max_records: 1000,
                linger: Duration::from_secs(3600),
                ..SinkDriverConfig::default()
            }),
        )
        .offset_store(MemoryStore::new())
        .build()
        .unwrap();
    let summary = within_two_minutes(pipeline, "the end of the input").await;
    assert_eq!(summary.written(), 95, "{summary:?}");
    let sizes = sizes.0.lock().unwrap().clone();
    assert_eq!(
        sizes.iter().map(|&(_, n)| n).collect::<Vec<_>>(),
        [95],
        "{workers} workers: one write of every record"
    );
}

/// The stage on worker threads: one, and two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_the_input_reaches_a_sink_after_the_records_read_before_it() {
    for workers in [1, 2] {
        the_end_reaches_the_sink_behind_the_last_records(workers).await;
    }
}

/// The stage on the pipeline's own task (a current-thread runtime with
/// one worker asked for): it too passes the end on, behind the records.
/// (There the old order held by the scheduler's turn, the stage being
/// woken before the run loop: this guards the serial stage's passing the
/// end on at all, without which the run waits out the hour's linger.)
#[tokio::test(flavor = "current_thread")]
async fn the_stage_on_the_pipelines_own_task_passes_the_end_of_the_input_on() {
    the_end_reaches_the_sink_behind_the_last_records(1).await;
}
