//! A sink's batches and the in-flight bound: a pipeline cuts each sink's
//! batches at a small share of what may be in flight, so that one batch
//! filling, then being written and synced, never holds back the source.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etl::Pipeline;
use etl_checkpoint::{CheckpointConfig, InFlightLimits, MemoryStore};
use etl_sink::{EncodedBatch, NdjsonEncoder, Sink, SinkDriver, SinkError};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sinks_batches_are_cut_at_a_sixteenth_of_the_in_flight_bound() {
    const RECORDS: u64 = 20_000;
    const IN_FLIGHT: u64 = 256 << 10;
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(RECORDS),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
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
        .checkpoint(CheckpointConfig {
            limits: InFlightLimits {
                max_in_flight_bytes: IN_FLIGHT,
                max_in_flight_bytes_per_partition: IN_FLIGHT,
                ..InFlightLimits::default()
            },
            ..CheckpointConfig::default()
        })
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
