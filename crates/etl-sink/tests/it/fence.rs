//! The write fence: once a partition's revocation began (its epoch closed
//! on the acknowledgement channel's fence), an exactly-once driver starts
//! no write of it, neither a queued batch nor a retry, and goes on with
//! the other partitions. An at-least-once driver writes as before.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etl_ack::{AckEvent, AckReceiver, AckStatus, Acked, Acker, BatchId, BatchMeta, WriteFence};
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::MemorySink;
use etl_sink::{
    EncodedBatch, NdjsonEncoder, Progress, ProgressSink, RetryPolicy, Sink, SinkDriver,
    SinkDriverConfig, SinkError,
};
use etl_test_support::acks::record;
use tokio::sync::watch;

const GUARD: Duration = Duration::from_secs(20);

/// A sink keeping its progress with its data: each write's records as
/// (partition, offset). The first `hold` attempts wait for the gate; the
/// first `fail` attempts then fail with a retryable error.
#[derive(Clone, Debug)]
struct Ledger {
    state: Arc<Mutex<LedgerState>>,
    gate: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct LedgerState {
    written: Vec<Vec<(u32, i64)>>,
    progress: Progress,
    attempts: usize,
    hold: usize,
    fail: usize,
}

impl Ledger {
    fn new(hold: usize, fail: usize) -> Self {
        Ledger {
            state: Arc::new(Mutex::new(LedgerState {
                hold,
                fail,
                ..LedgerState::default()
            })),
            gate: watch::Sender::new(false),
        }
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    fn attempts(&self) -> usize {
        self.state.lock().unwrap().attempts
    }

    /// Every (partition, offset) written, write by write.
    fn written(&self) -> Vec<Vec<(u32, i64)>> {
        self.state.lock().unwrap().written.clone()
    }
}

#[async_trait]
impl Sink for Ledger {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let (held, failing) = {
            let mut s = self.state.lock().unwrap();
            s.attempts += 1;
            (s.attempts <= s.hold, s.attempts <= s.fail)
        };
        if held {
            let mut open = self.gate.subscribe();
            let _ = open.wait_for(|o| *o).await;
        }
        if failing {
            return Err(SinkError::Retryable("the store is busy".into()));
        }
        let mut s = self.state.lock().unwrap();
        s.written.push(
            batch
                .records()
                .iter()
                .map(|r| (r.position.partition.0, r.position.offset.0))
                .collect(),
        );
        s.progress.advance_past(batch.records());
        Ok(())
    }
}

impl ProgressSink for Ledger {
    fn progress(&self) -> Progress {
        self.state.lock().unwrap().progress.clone()
    }
}

/// Batches opened on one channel, and the channel's fence.
struct Batches {
    acker: Acker,
    receiver: AckReceiver,
    fence: Arc<WriteFence>,
    seq: u64,
}

impl Batches {
    fn new() -> Self {
        let (acker, receiver) = etl_ack::channel();
        let fence = receiver.fence();
        Batches {
            acker,
            receiver,
            fence,
            seq: 0,
        }
    }

    fn batch(&mut self, partition: u32, offsets: std::ops::Range<i64>) -> Acked<Vec<Record>> {
        self.batch_refusing(partition, offsets, &[])
    }

    /// As [`batch`](Self::batch), with the records at `bad` (offsets)
    /// not JSON: the NDJSON encoder refuses them.
    fn batch_refusing(
        &mut self,
        partition: u32,
        offsets: std::ops::Range<i64>,
        bad: &[i64],
    ) -> Acked<Vec<Record>> {
        self.batch_in_epoch(partition, 1, offsets, bad)
    }

    /// As [`batch_refusing`](Self::batch_refusing), opened under `epoch`
    /// (a replay of the partition opens its batches under a later one).
    fn batch_in_epoch(
        &mut self,
        partition: u32,
        epoch: u32,
        offsets: std::ops::Range<i64>,
        bad: &[i64],
    ) -> Acked<Vec<Record>> {
        let records: Vec<Record> = offsets
            .clone()
            .map(|o| {
                let mut r = record(partition, o);
                if bad.contains(&o) {
                    r.value = bytes::Bytes::from_static(b"\xffnot json");
                }
                r
            })
            .collect();
        self.seq += 1;
        let ack = self
            .acker
            .open(BatchMeta {
                id: BatchId {
                    partition: PartitionId(partition),
                    epoch,
                    seq: self.seq,
                },
                first_offset: Offset(offsets.start),
                last_offset: Offset(offsets.end - 1),
                records: records.len() as u32,
                bytes: 10,
            })
            .unwrap();
        Acked::new(records, ack)
    }

    /// Each batch's resolution, by (partition, first offset seq).
    fn resolutions(&mut self) -> Vec<(u32, u64, AckStatus)> {
        let mut out = Vec::new();
        while let Ok(event) = self.receiver.try_next() {
            if let AckEvent::Resolved(m) = event {
                out.push((m.id.partition.0, m.id.seq, m.status));
            }
        }
        out.sort_by_key(|(_, seq, _)| *seq);
        out
    }
}

fn config(retry: RetryPolicy) -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: 10,
        linger: Duration::from_millis(20),
        retry,
        ..SinkDriverConfig::default()
    }
}

fn offsets(partition: u32, range: std::ops::Range<i64>) -> Vec<(u32, i64)> {
    range.map(|o| (partition, o)).collect()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("waited too long for {what}"));
}

/// Partition 1's batch is queued behind a write under way when its
/// revocation begins; after that write, it is merged with partition 0's
/// next batch into one job. Only partition 0's records are written; the
/// revoked batch fails (which, its epoch being over, replays nothing);
/// the driver goes on and closes without an error.
#[tokio::test]
async fn a_queued_batch_of_a_revoked_partition_is_not_written_and_the_others_are() {
    let sink = Ledger::new(1, 0);
    let mut batches = Batches::new();
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    let handle = driver.config(config(RetryPolicy::never())).spawn();

    handle.send(batches.batch(0, 0..10)).await.unwrap();
    wait_for("the first write", || sink.attempts() == 1).await;
    handle.send(batches.batch(1, 0..5)).await.unwrap();
    handle.send(batches.batch(0, 10..15)).await.unwrap();
    // The revocation of partition 1 begins while the first write is
    // under way.
    batches.fence.close(PartitionId(1), 1);
    sink.open_gate();
    let metrics = handle.close().await.expect("the driver does not halt");

    assert_eq!(
        sink.written(),
        vec![offsets(0, 0..10), offsets(0, 10..15)],
        "partition 1's batch is not written"
    );
    assert_eq!(metrics.batches_fenced, 1, "{metrics:?}");
    assert_eq!(metrics.batches_failed, 0, "{metrics:?}");
    assert_eq!(
        batches.resolutions(),
        vec![
            (0, 1, AckStatus::Delivered),
            (1, 2, AckStatus::Failed),
            (0, 3, AckStatus::Delivered),
        ]
    );
    assert_eq!(
        sink.progress().get(PartitionId(1)),
        None,
        "no progress for the revoked partition"
    );
}

/// The first attempt of a write fails (retryable) after the revocation of
/// its partition began: no retry starts. While it was under way, the
/// fence counted it as a write that may still land.
#[tokio::test]
async fn no_retry_of_a_revoked_partition_s_failed_write_starts() {
    let sink = Ledger::new(1, 1);
    let mut batches = Batches::new();
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        max_elapsed: Duration::from_secs(60),
        max_retries: Some(5),
    };
    let handle = driver.config(config(retry)).spawn();

    handle.send(batches.batch(0, 0..10)).await.unwrap();
    wait_for("the first attempt", || sink.attempts() == 1).await;
    batches.fence.close(PartitionId(0), 1);
    assert!(
        batches.fence.writing(PartitionId(0)),
        "the attempt under way is registered"
    );
    sink.open_gate();
    wait_for("the batch to resolve", || {
        !batches.fence.writing(PartitionId(0))
    })
    .await;
    // Another partition is written on.
    handle.send(batches.batch(1, 0..10)).await.unwrap();
    handle.close().await.expect("the driver does not halt");

    assert_eq!(sink.attempts(), 2, "one attempt each, no retry");
    assert_eq!(sink.written(), vec![offsets(1, 0..10)]);
    assert_eq!(
        batches.resolutions(),
        vec![(0, 1, AckStatus::Failed), (1, 2, AckStatus::Delivered)]
    );
}

/// An at-least-once driver ignores the fence: a late write only
/// duplicates, which at-least-once allows. Its queued batch and its
/// retry are written as before.
#[tokio::test]
async fn an_at_least_once_driver_writes_a_revoked_partition_s_batches_as_before() {
    let sink = Ledger::new(1, 1);
    let mut batches = Batches::new();
    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        max_elapsed: Duration::from_secs(60),
        max_retries: Some(5),
    };
    let handle = SinkDriver::new(sink.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            concurrency: 1,
            ..config(retry)
        })
        .spawn();
    handle.send(batches.batch(0, 0..10)).await.unwrap();
    wait_for("the first attempt", || sink.attempts() == 1).await;
    handle.send(batches.batch(0, 10..15)).await.unwrap();
    batches.fence.close(PartitionId(0), 1);
    assert!(
        !batches.fence.writing(PartitionId(0)),
        "an at-least-once write is not registered"
    );
    sink.open_gate();
    handle.close().await.unwrap();

    assert_eq!(sink.attempts(), 3, "the retry, then the queued batch");
    assert_eq!(sink.written(), vec![offsets(0, 0..10), offsets(0, 10..15)]);
    assert_eq!(
        batches.resolutions(),
        vec![(0, 1, AckStatus::Delivered), (0, 2, AckStatus::Delivered)]
    );
}

/// A merged job holds three partitions' batches, each with a record the
/// encoder refuses; the middle partition's revocation begins while the
/// job waits. Its records and its refused record are dropped together:
/// the other two partitions' refused records are dead-lettered, each
/// with its own batch, and the fenced one's is not.
#[tokio::test]
async fn a_fenced_batch_s_refused_record_is_dropped_with_it_and_the_others_are_dead_lettered() {
    let sink = Ledger::new(1, 0);
    let dead = MemorySink::new();
    let mut batches = Batches::new();
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    let handle = driver
        .config(SinkDriverConfig {
            batch_max_records: 30,
            ..config(RetryPolicy::never())
        })
        .dead_letters(dead.clone())
        .spawn();

    handle.send(batches.batch(0, 0..10)).await.unwrap();
    wait_for("the first write", || sink.attempts() == 1).await;
    handle
        .send(batches.batch_refusing(0, 10..15, &[12]))
        .await
        .unwrap();
    handle
        .send(batches.batch_refusing(1, 0..5, &[1]))
        .await
        .unwrap();
    handle
        .send(batches.batch_refusing(2, 0..5, &[0]))
        .await
        .unwrap();
    batches.fence.close(PartitionId(1), 1);
    sink.open_gate();
    handle.close().await.expect("the driver does not halt");

    let mut second = offsets(0, 10..15);
    second.retain(|&(_, o)| o != 12);
    second.extend(offsets(2, 1..5));
    assert_eq!(
        sink.written(),
        vec![offsets(0, 0..10), second],
        "partition 1's batch is not written, the others' accepted records are"
    );
    assert_eq!(
        dead.positions(),
        vec![(PartitionId(0), Offset(12)), (PartitionId(2), Offset(0))],
        "the fenced batch's refused record is not dead-lettered"
    );
    assert_eq!(
        batches.resolutions(),
        vec![
            (0, 1, AckStatus::Delivered),
            (0, 2, AckStatus::Delivered),
            (1, 3, AckStatus::Failed),
            (2, 4, AckStatus::Delivered),
        ]
    );
}

/// A replay of partition 0 (epoch 2: a batch of it failed elsewhere, say
/// its dead letter) arrives while the exactly-once driver's one write
/// holds offsets 0..10 of epoch 1. Once that write returns, the sink's
/// progress covers 0..10: the replayed 0..10 must be skipped (and
/// delivered): an exactly-once driver takes no input during its write,
/// where it would check them against the progress of before it and
/// write them a second time.
#[tokio::test]
async fn a_replay_arriving_during_the_write_of_its_records_does_not_write_them_twice() {
    let sink = Ledger::new(1, 0);
    let mut batches = Batches::new();
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    let handle = driver.config(config(RetryPolicy::never())).spawn();

    handle.send(batches.batch(0, 0..10)).await.unwrap();
    wait_for("the first write", || sink.attempts() == 1).await;
    // The replay, from offset 0 under epoch 2, while 0..10 is written.
    handle
        .send(batches.batch_in_epoch(0, 2, 0..10, &[]))
        .await
        .unwrap();
    handle
        .send(batches.batch_in_epoch(0, 2, 10..15, &[]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    sink.open_gate();
    handle.close().await.expect("the driver does not halt");

    assert_eq!(
        sink.written(),
        vec![offsets(0, 0..10), offsets(0, 10..15)],
        "every record is written once"
    );
    assert_eq!(
        batches.resolutions(),
        vec![
            (0, 1, AckStatus::Delivered),
            (0, 2, AckStatus::Delivered),
            (0, 3, AckStatus::Delivered),
        ]
    );
}

/// An exactly-once driver over `sink` whose batch waits 300 ms for up to
/// 100 records: what is sent at once is written in one batch.
fn lingering_exactly_once(sink: &Ledger) -> etl_sink::SinkHandle {
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    driver
        .config(SinkDriverConfig {
            batch_max_records: 100,
            linger: Duration::from_millis(300),
            ..config(RetryPolicy::never())
        })
        .spawn()
}

/// A replay of partition 0 (epoch 2) arrives while records it repeats
/// are still in the batch the exactly-once driver builds (epoch 1, not
/// yet written). The write holds each record once: the replayed copies
/// go, and their handles are delivered with the write that stores the
/// records they repeat.
#[tokio::test]
async fn a_replay_of_records_in_the_batch_being_built_writes_each_once() {
    let sink = Ledger::new(0, 0);
    let mut batches = Batches::new();
    let handle = lingering_exactly_once(&sink);

    handle.send(batches.batch(0, 0..5)).await.unwrap();
    handle
        .send(batches.batch_in_epoch(0, 2, 0..5, &[]))
        .await
        .unwrap();
    handle
        .send(batches.batch_in_epoch(0, 2, 5..8, &[]))
        .await
        .unwrap();
    handle.close().await.expect("the driver does not halt");

    assert_eq!(
        sink.written(),
        vec![offsets(0, 0..8)],
        "every record is written once"
    );
    assert_eq!(
        batches.resolutions(),
        vec![
            (0, 1, AckStatus::Delivered),
            (0, 2, AckStatus::Delivered),
            (0, 3, AckStatus::Delivered),
        ]
    );
}

/// The partition is revoked and assigned to this member again while the
/// exactly-once driver builds a batch: the batch holds the old
/// assignment's 0..5 (fenced: not written, its next owner writes them)
/// and the new assignment's 0..5 (epoch 2, not fenced). The new copies
/// are written, not dropped as repeats of the fenced ones.
#[tokio::test]
async fn records_read_again_after_a_reassignment_are_written_though_the_fenced_copies_came_first() {
    let sink = Ledger::new(0, 0);
    let mut batches = Batches::new();
    let handle = lingering_exactly_once(&sink);

    let old = batches.batch(0, 0..5);
    batches.fence.close(PartitionId(0), 1);
    handle.send(old).await.unwrap();
    handle
        .send(batches.batch_in_epoch(0, 2, 0..5, &[]))
        .await
        .unwrap();
    handle.close().await.expect("the driver does not halt");

    assert_eq!(sink.written(), vec![offsets(0, 0..5)]);
}

/// A `remap` whose `.` ends as an array makes one record per element, each
/// keeping the original's position (docs/operations.md, `flat_map`): they
/// share an offset but are not a replay's copies of each other. An
/// exactly-once write must store every one of them, not keep the first
/// and deliver the batch with the others dropped.
#[tokio::test]
async fn records_a_transform_expanded_from_one_share_its_offset_and_are_all_written() {
    let sink = Ledger::new(0, 0);
    let mut batches = Batches::new();
    let (driver, _) = SinkDriver::exactly_once(sink.clone(), NdjsonEncoder::new());
    let handle = driver.config(config(RetryPolicy::never())).spawn();

    // Offset 0 expanded into three records, then offset 1.
    let records: Vec<Record> = [(0, 0), (0, 1), (0, 2), (1, 0)]
        .into_iter()
        .map(|(o, element)| {
            let mut r = record(0, o);
            r.value = bytes::Bytes::from(format!("{{\"o\":{o},\"element\":{element}}}"));
            r
        })
        .collect();
    let ack = batches
        .acker
        .open(BatchMeta {
            id: BatchId {
                partition: PartitionId(0),
                epoch: 1,
                seq: 1,
            },
            first_offset: Offset(0),
            last_offset: Offset(1),
            records: records.len() as u32,
            bytes: 10,
        })
        .unwrap();
    handle.send(Acked::new(records, ack)).await.unwrap();
    let metrics = handle.close().await.expect("the driver does not halt");

    assert_eq!(
        sink.written(),
        vec![vec![(0, 0), (0, 0), (0, 0), (0, 1)]],
        "every element of the expansion is written ({metrics:?})"
    );
    assert_eq!(batches.resolutions(), vec![(0, 1, AckStatus::Delivered)]);
}
