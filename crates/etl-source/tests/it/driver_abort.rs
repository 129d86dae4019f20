//! Aborting the driver task while it waits to hand a batch downstream
//! fails that batch: the records never left, so their offsets must not be
//! committed.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use etl_checkpoint::{CheckpointConfig, Checkpointer, MemoryStore};
use etl_record::{Offset, PartitionId};
use etl_source::{
    GeneratorConfig, GeneratorSource, SourceDriver, SourceDriverConfig, SourceOutput,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn an_aborted_send_fails_its_batch() {
    let store = MemoryStore::new();
    let (acker, acks) = etl_ack::channel();
    let (checkpoint, replays) =
        Checkpointer::spawn(CheckpointConfig::default(), Box::new(store.clone()), acks).unwrap();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(100),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    // Room for one batch: the driver then blocks sending the second.
    let (tx, mut rx) = mpsc::channel::<SourceOutput>(1);
    let driver = SourceDriver::new(
        source,
        acker,
        checkpoint.clone(),
        replays,
        tx,
        SourceDriverConfig::default(),
    );
    let task = tokio::spawn(driver.run(CancellationToken::new()));
    let p = PartitionId(0);
    let started = std::time::Instant::now();
    while checkpoint.budget().in_flight_of(p).batches < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "driver never blocked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The first batch was handed over; deliver it.
    let first = rx.recv().await.unwrap();
    drop(first);
    let summary = checkpoint.shutdown().await.unwrap();
    // The failed second batch pins the watermark (its failure may even be
    // seen before the first batch resolves, which then is stale): at most
    // the first batch is committed, never the second.
    let committed = summary.committed.get(&p).copied().unwrap_or(Offset(0));
    assert!(
        committed <= Offset(10),
        "committed {committed}: an unsent batch counted as delivered"
    );
}
