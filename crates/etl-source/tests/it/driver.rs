//! The source driver against a real checkpointer: epochs, seeks, replays,
//! revocation, in-flight bounds and poison records.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use etl_ack::Acked;
use etl_checkpoint::{
    CheckpointConfig, CheckpointHandle, Checkpointer, InFlightLimits, MemoryStore,
};
use etl_record::{Offset, PartitionId, PartitionOffsets, Record};
use etl_source::{
    DriverExit, GeneratorConfig, GeneratorSource, PoisonPolicy, Source, SourceDriver,
    SourceDriverConfig, SourceError, SourceEvent, SourceMetricsHandle, SourceOutput,
};
use etl_test_support::source::{ScriptedSource, Step};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const P0: PartitionId = PartitionId(0);
const P1: PartitionId = PartitionId(1);

struct Harness {
    store: MemoryStore,
    checkpoint: CheckpointHandle,
    rx: mpsc::Receiver<SourceOutput>,
    driver: JoinHandle<Result<DriverExit, SourceError>>,
    shutdown: CancellationToken,
    metrics: SourceMetricsHandle,
}

fn start(
    source: impl Source + 'static,
    store: MemoryStore,
    limits: InFlightLimits,
    config: SourceDriverConfig,
) -> Harness {
    let (acker, acks) = etl_ack::channel();
    let checkpoint_config = CheckpointConfig {
        commit_interval: Duration::from_millis(20),
        revoke_deadline: Duration::from_millis(200),
        limits,
        ..CheckpointConfig::default()
    };
    let (checkpoint, replays) =
        Checkpointer::spawn(checkpoint_config, Box::new(store.clone()), acks).unwrap();
    let (tx, rx) = mpsc::channel(64);
    let driver = SourceDriver::new(source, acker, checkpoint.clone(), replays, tx, config);
    let shutdown = CancellationToken::new();
    let metrics = driver.metrics();
    let driver = tokio::spawn(driver.run(shutdown.clone()));
    Harness {
        store,
        checkpoint,
        rx,
        driver,
        shutdown,
        metrics,
    }
}

fn roomy() -> InFlightLimits {
    InFlightLimits {
        max_in_flight_batches_per_partition: 1000,
        max_in_flight_bytes_per_partition: 1 << 30,
        max_in_flight_batches: 1000,
        max_in_flight_bytes: 1 << 30,
    }
}

fn offsets(batch: &Acked<Vec<Record>>) -> Vec<i64> {
    batch.value().iter().map(|r| r.position.offset.0).collect()
}

async fn recv(rx: &mut mpsc::Receiver<SourceOutput>) -> SourceOutput {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an output within 10 s")
        .expect("the driver is running")
}

fn committed(store: &MemoryStore) -> PartitionOffsets {
    store.offsets()
}

#[tokio::test]
async fn epochs_bump_on_assign_and_replay_and_a_replay_seeks_to_the_watermark() {
    let (source, seeks) = ScriptedSource::new(
        10,
        vec![Step::Event(SourceEvent::Assigned(vec![P0])), Step::Drain(2)],
    );
    let mut h = start(
        source,
        MemoryStore::new(),
        roomy(),
        SourceDriverConfig::default(),
    );
    let mut seen = Vec::new();
    let mut failed_once = false;
    while let Some(output) = h.rx.recv().await {
        let SourceOutput::Batch(batch) = output else {
            panic!("no dead letters expected")
        };
        let id = batch.ack().batch_id();
        seen.push((id.epoch, id.seq, offsets(&batch)));
        if !failed_once && offsets(&batch) == vec![4, 5] {
            failed_once = true;
            batch.ack().fail();
        }
        batch.consume();
    }
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Ended);
    let first_epoch = seen[0].0;
    // The first epoch starts at seq 0 with offsets 0..; the failure of [4, 5]
    // makes the driver seek to the watermark 4 under the next epoch.
    assert_eq!(seen[0], (first_epoch, 0, vec![0, 1]));
    assert_eq!(
        *seeks.lock().unwrap(),
        vec![(P0, Offset(0)), (P0, Offset(4))]
    );
    let replayed: Vec<_> = seen
        .iter()
        .filter(|s| s.0 == first_epoch + 1)
        .cloned()
        .collect();
    assert_eq!(
        replayed,
        vec![
            (first_epoch + 1, 0, vec![4, 5]),
            (first_epoch + 1, 1, vec![6, 7]),
            (first_epoch + 1, 2, vec![8, 9])
        ]
    );
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(committed(&h.store), BTreeMap::from([(P0, Offset(10))]));
}

#[tokio::test]
async fn assignment_resumes_from_the_committed_offset() {
    let store = MemoryStore::with_offsets(BTreeMap::from([(P0, Offset(6))]));
    let (source, seeks) = ScriptedSource::new(
        10,
        vec![
            Step::Event(SourceEvent::Assigned(vec![P0, P1])),
            Step::Drain(3),
        ],
    );
    let mut h = start(source, store, roomy(), SourceDriverConfig::default());
    let mut first = BTreeMap::new();
    while let Some(output) = h.rx.recv().await {
        if let SourceOutput::Batch(b) = output {
            first
                .entry(b.ack().batch_id().partition)
                .or_insert(offsets(&b)[0]);
            b.consume();
        }
    }
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Ended);
    assert_eq!(
        *seeks.lock().unwrap(),
        vec![(P0, Offset(6)), (P1, Offset(0))]
    );
    assert_eq!(first, BTreeMap::from([(P0, 6), (P1, 0)]));
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(
        committed(&h.store),
        BTreeMap::from([(P0, Offset(10)), (P1, Offset(10))])
    );
}

#[tokio::test]
async fn revoke_mid_flight_discards_the_old_epoch() {
    let (source, seeks) = ScriptedSource::new(
        6,
        vec![
            Step::Event(SourceEvent::Assigned(vec![P0, P1])),
            Step::Read(P1, 2),
            Step::Read(P1, 2),
            Step::Event(SourceEvent::Revoked(vec![P1])),
            Step::Read(P0, 6),
            Step::Event(SourceEvent::Assigned(vec![P1])),
            Step::Drain(2),
        ],
    );
    let mut h = start(
        source,
        MemoryStore::new(),
        roomy(),
        SourceDriverConfig::default(),
    );
    // [0, 1] of P1 is delivered, [2, 3] held across the revocation.
    let SourceOutput::Batch(a) = recv(&mut h.rx).await else {
        panic!()
    };
    let old_epoch = a.ack().batch_id().epoch;
    assert_eq!(offsets(&a), vec![0, 1]);
    a.consume();
    let SourceOutput::Batch(held) = recv(&mut h.rx).await else {
        panic!()
    };
    assert_eq!(offsets(&held), vec![2, 3]);
    // The revocation drains P1 until its deadline, commits the watermark 2
    // and only then lets the driver poll again: P0 comes next.
    let SourceOutput::Batch(p0) = recv(&mut h.rx).await else {
        panic!()
    };
    assert_eq!(p0.ack().batch_id().partition, P0);
    assert_eq!(committed(&h.store).get(&P1), Some(&Offset(2)));
    // The held batch resolves now: its epoch is over, it moves nothing.
    held.consume();
    p0.consume();
    let mut replay = Vec::new();
    while let Some(output) = h.rx.recv().await {
        if let SourceOutput::Batch(b) = output {
            let id = b.ack().batch_id();
            assert_eq!(id.partition, P1);
            assert!(id.epoch > old_epoch, "a new assignment is a new epoch");
            replay.extend(offsets(&b));
            b.consume();
        }
    }
    assert_eq!(
        replay,
        vec![2, 3, 4, 5],
        "re-assigned P1 resumes at its commit"
    );
    assert_eq!(seeks.lock().unwrap().last(), Some(&(P1, Offset(2))));
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Ended);
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(
        committed(&h.store),
        BTreeMap::from([(P0, Offset(6)), (P1, Offset(6))])
    );
}

#[tokio::test]
async fn a_sink_that_never_resolves_stops_the_source_at_the_in_flight_bound() {
    let generator = GeneratorSource::new(GeneratorConfig {
        records_per_partition: Some(1000),
        max_batch_records: 5,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let limits = InFlightLimits {
        max_in_flight_batches_per_partition: 4,
        max_in_flight_bytes_per_partition: 1 << 30,
        max_in_flight_batches: 4,
        max_in_flight_bytes: 1 << 30,
    };
    let mut h = start(
        generator,
        MemoryStore::new(),
        limits,
        // Payload only, to compare with the records' byte lengths.
        SourceDriverConfig {
            record_overhead_bytes: 0,
            ..SourceDriverConfig::default()
        },
    );
    let budget = h.checkpoint.budget();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(recv(&mut h.rx).await);
    }
    // However long we wait, nothing more comes and the bound holds.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(h.rx.try_recv().is_err(), "the source must wait for credits");
        assert_eq!(budget.in_flight().batches, 4);
    }
    let held_bytes: u64 = held
        .iter()
        .map(|o| match o {
            SourceOutput::Batch(b) => b.value().iter().map(|r| r.byte_len() as u64).sum(),
            SourceOutput::DeadLetter(_) => 0,
        })
        .sum();
    assert_eq!(budget.in_flight().bytes, held_bytes);

    // Resolving frees the source; it runs to the end.
    held.into_iter().for_each(SourceOutput::consume);
    let mut count = 20;
    while let Some(output) = h.rx.recv().await {
        if let SourceOutput::Batch(b) = output {
            count += b.value().len();
            b.consume();
        }
    }
    assert_eq!(count, 1000);
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Ended);
    h.checkpoint.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_byte_bound_holds_as_well() {
    // Payload only, to compare with the records' byte lengths.
    byte_bound_holds(0).await;
}

#[tokio::test]
async fn the_byte_bound_counts_a_per_record_overhead() {
    byte_bound_holds(1000).await;
}

/// With `overhead` bytes counted per record besides its value, a limit
/// just short of three batches of ten lets exactly two through.
async fn byte_bound_holds(overhead: u64) {
    let generator = GeneratorSource::new(GeneratorConfig {
        records_per_partition: Some(100),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let size = |o: u64| GeneratorSource::value(0, 1, P0, o).len() as u64 + overhead;
    let limit: u64 = (0..30).map(size).sum::<u64>() - 1;
    let two: u64 = (0..20).map(size).sum();
    let limits = InFlightLimits {
        max_in_flight_batches_per_partition: 100,
        max_in_flight_bytes_per_partition: limit,
        max_in_flight_batches: 100,
        max_in_flight_bytes: limit,
    };
    let mut h = start(
        generator,
        MemoryStore::new(),
        limits,
        SourceDriverConfig {
            record_overhead_bytes: overhead,
            ..SourceDriverConfig::default()
        },
    );
    let budget = h.checkpoint.budget();
    let held = vec![recv(&mut h.rx).await, recv(&mut h.rx).await];
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.rx.try_recv().is_err());
    let in_flight = budget.in_flight();
    assert_eq!(in_flight.batches, 2);
    assert_eq!(in_flight.bytes, two);
    assert!(in_flight.bytes <= limit);
    h.shutdown.cancel();
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Shutdown);
    held.into_iter().for_each(SourceOutput::consume);
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(committed(&h.store), BTreeMap::from([(P0, Offset(20))]));
}

/// Deliver everything except outputs holding `bad`, which fail. Returns
/// every delivered offset and the dead letters.
async fn sink_failing(
    rx: &mut mpsc::Receiver<SourceOutput>,
    bad: i64,
) -> (Vec<i64>, Vec<etl_record::DeadLetter>) {
    let (mut delivered, mut letters) = (Vec::new(), Vec::new());
    while let Some(output) = rx.recv().await {
        match output {
            SourceOutput::Batch(b) => {
                if offsets(&b).contains(&bad) {
                    b.ack().fail();
                } else {
                    delivered.extend(offsets(&b));
                }
                b.consume();
            }
            SourceOutput::DeadLetter(d) => letters.push(d.into_parts().0),
        }
    }
    (delivered, letters)
}

#[tokio::test]
async fn a_poison_record_is_narrowed_down_and_dead_lettered() {
    let generator = GeneratorSource::new(GeneratorConfig {
        records_per_partition: Some(30),
        max_batch_records: 5,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let config = SourceDriverConfig {
        max_replays: 2,
        ..SourceDriverConfig::default()
    };
    let mut h = start(generator, MemoryStore::new(), roomy(), config);
    let (delivered, letters) = sink_failing(&mut h.rx, 7).await;
    assert_eq!(h.driver.await.unwrap().unwrap(), DriverExit::Ended);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record.position.offset, Offset(7));
    assert!(
        letters[0].reason.contains("partition 0 offset 7"),
        "{}",
        letters[0].reason
    );
    for o in (0..30).filter(|o| *o != 7) {
        assert!(delivered.contains(&o), "offset {o} was never delivered");
    }
    assert!(!delivered.contains(&7));
    let m = h.metrics.snapshot().partitions[&P0];
    assert_eq!(m.poison_records, 1);
    // Twice for the range, twice for the record alone, once to emit it.
    assert!(m.replays >= 4, "{m:?}");
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(committed(&h.store), BTreeMap::from([(P0, Offset(30))]));
}

#[tokio::test]
async fn a_poison_record_halts_the_driver_by_policy() {
    let generator = GeneratorSource::new(GeneratorConfig {
        records_per_partition: Some(30),
        max_batch_records: 5,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let config = SourceDriverConfig {
        max_replays: 2,
        poison: PoisonPolicy::Halt,
        ..SourceDriverConfig::default()
    };
    let mut h = start(generator, MemoryStore::new(), roomy(), config);
    let (delivered, letters) = sink_failing(&mut h.rx, 7).await;
    let err = h.driver.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Poison {
                partition: P0,
                offset: Offset(7),
                replays: 2
            }
        ),
        "{err}"
    );
    assert!(letters.is_empty() && !delivered.contains(&7));
    h.checkpoint.shutdown().await.unwrap();
    assert_eq!(committed(&h.store), BTreeMap::from([(P0, Offset(7))]));
}
