//! A sink that fails every record of one partition stalls only that
//! partition's commits: the group source, the checkpointer (committing to
//! the group through `GroupOffsetStore`, revoking through its handle), the
//! source driver and a sink driver, wired as the runtime wires them.

use crate::support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::{CheckpointConfig, Checkpointer, InFlightLimits};
use etl_kafka::KafkaSource;
use etl_record::{PartitionId, SourceId};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkDriverConfig, SinkError};
use etl_source::{SourceDriver, SourceDriverConfig, SourceOutput};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use support::{TestBroker, produce, source_config, unique};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i32 = 40;
/// The partition whose records the sink refuses.
const FAILING: i32 = 2;

/// Writes records to memory, except those of one partition: a batch
/// holding any of them fails as a failure of its data (it replays).
#[derive(Debug, Default)]
struct FailOnePartition {
    failing: PartitionId,
    written: Mutex<BTreeSet<String>>,
    failures: Mutex<u64>,
}

#[async_trait]
impl Sink for FailOnePartition {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        if batch
            .records()
            .iter()
            .any(|r| r.position.partition == self.failing)
        {
            *self.failures.lock().expect("lock") += 1;
            return Err(SinkError::data(format!(
                "partition {} is refused",
                self.failing
            )));
        }
        let mut written = self.written.lock().expect("lock");
        for r in batch.records() {
            written.insert(r.idempotency_key().to_string());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_partition_stalls_only_its_commits() {
    let broker = TestBroker::start();
    let topic = unique("stall");
    let group = unique("stall-group");
    broker.create_topic(&topic, PARTITIONS).await;
    produce(&broker, &topic, PER_PARTITION, PARTITIONS).await;
    let deadline = Instant::now() + Duration::from_secs(60);

    // As the runtime builds it: the group is the checkpointer's store, the
    // checkpointer's handle is the source's revoke handler.
    let config = source_config(&broker, &group, &topic);
    let mut source = KafkaSource::new(SourceId::new("k"), config.clone()).expect("source");
    let (acker, receiver) = etl_ack::channel();
    let (checkpoint, replays) = Checkpointer::spawn(
        CheckpointConfig {
            commit_interval: Duration::from_millis(100),
            revoke_deadline: config.max_revoke_deadline(),
            shutdown_timeout: Duration::from_secs(5),
            limits: InFlightLimits::default(),
        },
        Box::new(source.offset_store()),
        receiver,
    )
    .expect("checkpointer");
    source.start(checkpoint.clone()).expect("start");

    // One poll batch per sink write, so a failure covers one partition.
    let sink = Arc::new(FailOnePartition {
        failing: source.partition_map().id(&topic, FAILING).expect("mapped"),
        ..FailOnePartition::default()
    });
    let sink_driver = SinkDriver::new(sink.clone(), RawLinesEncoder::new())
        .config(SinkDriverConfig {
            batch_max_records: 1,
            ..SinkDriverConfig::default()
        })
        .spawn();
    let (out_tx, mut out_rx) = mpsc::channel(16);
    let driver = SourceDriver::new(
        source,
        acker,
        checkpoint.clone(),
        replays,
        out_tx,
        // The refused partition replays for the whole test rather than
        // being narrowed down to a poison record.
        SourceDriverConfig {
            max_replays: 1_000_000,
            ..SourceDriverConfig::default()
        },
    );
    let cancel = CancellationToken::new();
    let driver_task = tokio::spawn(driver.run(cancel.clone()));
    let sender = sink_driver.sender();
    let stage = tokio::spawn(async move {
        while let Some(output) = out_rx.recv().await {
            match output {
                SourceOutput::Batch(batch) => {
                    if sender.send(batch).await.is_err() {
                        return;
                    }
                }
                // No dead letters are expected; failing one replays it.
                SourceOutput::DeadLetter(letter) => letter.fail(),
            }
        }
    });

    // The healthy partitions commit everything, while the refused one
    // keeps failing and replaying.
    let healthy: Vec<i32> = (0..PARTITIONS).filter(|p| *p != FAILING).collect();
    let committed = loop {
        let committed = broker.committed(&group, &topic, PARTITIONS);
        let done = healthy
            .iter()
            .all(|p| committed.get(p) == Some(&i64::from(PER_PARTITION)));
        // More failed writes than one pass over the partition makes: it
        // was replayed, and failed again.
        if done && *sink.failures.lock().expect("lock") > 3 * PER_PARTITION as u64 / 4 {
            break committed;
        }
        assert!(
            Instant::now() < deadline,
            "healthy partitions not committed: {committed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        committed.get(&FAILING).is_none_or(|o| *o == 0),
        "the refused partition committed past its first record: {committed:?}"
    );
    let metrics = checkpoint.metrics();
    let stalled = &metrics.partitions[&sink.failing];
    // Each replay starts a new epoch of the partition.
    assert_eq!(stalled.watermark.0, 0, "{stalled:?}");
    assert!(stalled.epoch >= 3, "{stalled:?}");
    let written = sink.written.lock().expect("lock").len();
    assert_eq!(written, healthy.len() * PER_PARTITION as usize);

    // A clean stop: the final commit still leaves the refused partition
    // where it was.
    cancel.cancel();
    driver_task.await.expect("driver task").expect("driver");
    stage.await.expect("stage");
    sink_driver.close().await.expect("sink drained");
    checkpoint.shutdown().await.expect("final commit");
    let after = broker.committed(&group, &topic, PARTITIONS);
    assert!(after.get(&FAILING).is_none_or(|o| *o == 0), "{after:?}");
    for p in healthy {
        assert_eq!(after.get(&p), Some(&i64::from(PER_PARTITION)), "{after:?}");
    }
}
