//! The runtime's teardown paths: a panicking transform fails the batch it
//! was working on, so its offsets are never committed; a dead letter that
//! never became durable is produced again by the next run; a graceful
//! stop ends within its timeout whatever hangs, and a run whose last
//! commit failed is not a success.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etl::{Pipeline, PipelineError, Refused, map};
use etl_checkpoint::{
    CheckpointConfig, CheckpointError, CheckpointHandle, InFlightLimits, MemoryStore, OffsetStore,
    PartitionOffsets,
};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::testing::{FailEveryNth, Hang, MemorySink};
use etl_sink::{
    BlackholeSink, FileSink, FileSinkConfig, NdjsonEncoder, RawLinesEncoder, Sink, SinkDriver,
    SinkDriverConfig,
};
use etl_source::{
    FileSource, FileSourceConfig, GeneratorConfig, GeneratorSource, PollBatch, Source, SourceError,
    SourceEvent,
};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_panicking_transform_fails_its_batch() {
    let store = MemoryStore::new();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(100),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(map("explodes", |r: Record| {
            assert!(r.position.offset != Offset(25), "a bug in user code");
            Ok(r)
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
            max_batch_records: 10,
            ..GeneratorConfig::default()
        })
        .unwrap();
        // A gate keeps the panic back until the source channel is full, so
        // the panic finds batches of every partition queued behind it.
        let pipeline = Pipeline::builder()
            .source(source)
            .transform(map("explodes", |r: Record| {
                if r.position.partition == PartitionId(0) && r.position.offset == Offset(500) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    panic!("a bug in user code");
                }
                Ok(r)
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
        paths: vec![input_with_a_bad_line(dir)],
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
        .checkpoint(CheckpointConfig {
            shutdown_timeout: Duration::from_secs(5),
            ..CheckpointConfig::default()
        })
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
    assert_eq!(
        output_ids(dir.path()).len(),
        19,
        "the good lines are stored"
    );

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

#[tokio::test(start_paused = true)]
async fn a_stop_with_a_sink_that_never_finishes_ends_within_the_shutdown_timeout() {
    let store = MemoryStore::new();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 2,
        records_per_partition: None,
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let stuck = Arc::new(Hang::new());
    let driver = SinkDriver::new(stuck.clone(), RawLinesEncoder::new()).config(SinkDriverConfig {
        batch_max_records: 10,
        concurrency: 1,
        channel_capacity: 4,
        write_timeout: Some(Duration::from_secs(1)),
        ..SinkDriverConfig::default()
    });
    let timeout = Duration::from_secs(5);
    let pipeline = Pipeline::builder()
        .source(source)
        .sink("stuck", driver)
        .checkpoint(CheckpointConfig {
            limits: InFlightLimits {
                max_in_flight_batches: 1000,
                max_in_flight_batches_per_partition: 1000,
                ..InFlightLimits::default()
            },
            shutdown_timeout: timeout,
            ..CheckpointConfig::default()
        })
        .offset_store(store.clone())
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    // The clock only moves while every task waits; the checkpointer's
    // thread does not count, so wait for the first write by polling.
    for _ in 0..100_000 {
        if stuck.calls() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(stuck.calls() > 0, "the sink was never written to");
    // Let the queues between the source and the sink fill up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let stopped_at = tokio::time::Instant::now();
    let result = tokio::time::timeout(timeout * 100, run)
        .await
        .expect("the stop hung past its timeout")
        .unwrap();
    let took = stopped_at.elapsed();
    assert!(took <= timeout, "the stop took {took:?}");
    let err = result.expect_err("the sink never wrote: the stop cannot be clean");
    assert!(err.to_string().contains("stuck"), "{err}");
    assert!(
        store.offsets().values().all(|o| *o == Offset(0)),
        "committed {:?} although the sink wrote nothing",
        store.offsets()
    );
}

/// A store whose every commit fails.
#[derive(Debug, Default)]
struct RefusingStore;

impl OffsetStore for RefusingStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(PartitionOffsets::new())
    }

    fn commit(&mut self, _offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        Err(CheckpointError::Store(
            "the coordinator is unreachable".into(),
        ))
    }
}

/// One partition of ten records, then a revoke made the way a consumer
/// group's rebalance callback makes it (straight through the
/// checkpointer's handle, its error only logged), then the end.
struct RevokedByTheGroup {
    handle: CheckpointHandle,
    step: u32,
}

#[async_trait::async_trait]
impl Source for RevokedByTheGroup {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        self.step += 1;
        let p = PartitionId(0);
        Ok(match self.step {
            1 => SourceEvent::Assigned(vec![p]),
            2 => {
                let mut batch = PollBatch::new(p);
                batch.records = (0..10)
                    .map(|o| Record::new(Position::new(SourceId::new("s"), p, Offset(o)), "x"))
                    .collect();
                SourceEvent::Batch(batch)
            }
            3 => {
                while self
                    .handle
                    .metrics()
                    .partitions
                    .get(&p)
                    .is_none_or(|m| m.watermark < Offset(10))
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // The callback logs the failed commit and goes on.
                let _ = self.handle.revoke(vec![p]).await;
                SourceEvent::Revoked(vec![p])
            }
            _ => SourceEvent::End,
        })
    }

    async fn seek(&mut self, _partition: PartitionId, _offset: Offset) -> Result<(), SourceError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_last_commit_failed_is_not_a_success() {
    let pipeline = Pipeline::builder()
        .source_factory(|handle| {
            Ok(Box::new(RevokedByTheGroup {
                handle: handle.clone(),
                step: 0,
            }))
        })
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .offset_store(RefusingStore)
        .build()
        .unwrap();
    let err = pipeline
        .run(CancellationToken::new())
        .await
        .expect_err("the delivered records were never committed");
    assert!(
        err.to_string().contains("the coordinator is unreachable"),
        "{err}"
    );
}

/// A store whose commits fail while `down` is set (a group coordinator
/// that is unreachable, then back); it keeps what it committed.
#[derive(Debug, Clone, Default)]
struct OutageStore {
    down: Arc<std::sync::atomic::AtomicBool>,
    committed: Arc<std::sync::Mutex<PartitionOffsets>>,
    /// Fail as a local store on a full disk does, not as a coordinator.
    disk_full: bool,
}

impl OffsetStore for OutageStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(self.committed.lock().expect("lock").clone())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            if self.disk_full {
                return Err(CheckpointError::Io {
                    path: "offsets".into(),
                    op: "write",
                    source: std::io::Error::from_raw_os_error(28),
                });
            }
            return Err(CheckpointError::Store(
                "the coordinator is unreachable".into(),
            ));
        }
        self.committed.lock().expect("lock").extend(offsets.clone());
        Ok(())
    }
}

/// A consumer group's member through an outage, as the source driver sees
/// it: partition 0 read, the coordinator gone, the partition revoked (the
/// driver takes the revocation first; its commit fails), the coordinator
/// back, the partition assigned again and read from the last commit.
struct LostInAnOutage {
    store: OutageStore,
    handle: CheckpointHandle,
    step: u32,
}

#[async_trait::async_trait]
impl Source for LostInAnOutage {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        self.step += 1;
        let p = PartitionId(0);
        let batch = || {
            let mut batch = PollBatch::new(p);
            batch.records = (0..10)
                .map(|o| Record::new(Position::new(SourceId::new("s"), p, Offset(o)), "x"))
                .collect();
            SourceEvent::Batch(batch)
        };
        Ok(match self.step {
            1 => SourceEvent::Assigned(vec![p]),
            2 => batch(),
            3 => {
                while self
                    .handle
                    .metrics()
                    .partitions
                    .get(&p)
                    .is_none_or(|m| m.watermark < Offset(10))
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                self.store
                    .down
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                SourceEvent::Revoked(vec![p])
            }
            4 => {
                self.store
                    .down
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                SourceEvent::Assigned(vec![p])
            }
            5 => batch(),
            _ => SourceEvent::End,
        })
    }

    async fn seek(&mut self, _partition: PartitionId, _offset: Offset) -> Result<(), SourceError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_whose_commit_fails_does_not_end_the_run_and_the_partition_is_read_again() {
    let store = OutageStore::default();
    let output = MemorySink::new();
    let source_store = store.clone();
    let pipeline = Pipeline::builder()
        .source_factory(move |handle| {
            Ok(Box::new(LostInAnOutage {
                store: source_store,
                handle: handle.clone(),
                step: 0,
            }))
        })
        .sink(
            "out",
            SinkDriver::new(output.clone(), RawLinesEncoder::new()),
        )
        .offset_store(store.clone())
        .build()
        .unwrap();
    let summary = pipeline
        .run(CancellationToken::new())
        .await
        .expect("a lost partition is read again by its next owner, not an error");
    // Written twice: once before the outage, once after (at least once).
    assert_eq!(summary.written(), 20);
    assert_eq!(output.records().len(), 20);
    assert_eq!(
        store.committed.lock().expect("lock").get(&PartitionId(0)),
        Some(&Offset(10))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_whose_commit_fails_on_a_full_disk_ends_the_run() {
    let store = OutageStore {
        disk_full: true,
        ..OutageStore::default()
    };
    let source_store = store.clone();
    let pipeline = Pipeline::builder()
        .source_factory(move |handle| {
            Ok(Box::new(LostInAnOutage {
                store: source_store,
                handle: handle.clone(),
                step: 0,
            }))
        })
        .sink(
            "out",
            SinkDriver::new(MemorySink::new(), RawLinesEncoder::new()),
        )
        .offset_store(store)
        .build()
        .unwrap();
    let err = pipeline
        .run(CancellationToken::new())
        .await
        .expect_err("every later commit would fail too");
    assert!(err.to_string().contains("offsets"), "{err}");
}

/// A store whose commits never return (until the test ends).
#[derive(Debug)]
struct StuckStore {
    entered: Arc<std::sync::atomic::AtomicBool>,
    release: std::sync::mpsc::Receiver<()>,
}

impl OffsetStore for StuckStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(PartitionOffsets::new())
    }

    fn commit(&mut self, _offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        self.entered
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.release.recv();
        Err(CheckpointError::Store("released".into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_never_returns_does_not_hold_the_stop() {
    let (_release, release) = std::sync::mpsc::channel();
    let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: None,
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(source)
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .checkpoint(CheckpointConfig {
            commit_interval: Duration::from_millis(1),
            shutdown_timeout: Duration::from_millis(500),
            ..CheckpointConfig::default()
        })
        .offset_store(StuckStore {
            entered: entered.clone(),
            release,
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    while !entered.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.cancel();
    let err = run
        .await
        .unwrap()
        .expect_err("the final commit never happened");
    assert!(err.to_string().contains("commit"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_stop_with_a_dead_letter_sink_that_never_finishes_ends_within_the_shutdown_timeout() {
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: None,
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let stuck = Arc::new(Hang::new());
    let timeout = Duration::from_secs(5);
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(map("refuses everything", |r: Record| {
            Err(Refused::new(r, "no"))
        }))
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .dead_letter(stuck.clone())
        .checkpoint(CheckpointConfig {
            shutdown_timeout: timeout,
            ..CheckpointConfig::default()
        })
        .transform_workers(1)
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    for _ in 0..100_000 {
        if stuck.calls() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(stuck.calls() > 0, "no dead letter was ever written");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let stopped_at = tokio::time::Instant::now();
    let result = tokio::time::timeout(timeout * 100, run)
        .await
        .expect("the stop hung past its timeout")
        .unwrap();
    let took = stopped_at.elapsed();
    assert!(took <= timeout, "the stop took {took:?}");
    let err = result.expect_err("the dead letters were never written");
    assert!(err.to_string().contains("dead_letter"), "{err}");
}

/// A local store whose first commit's fsync fails and whose later ones
/// would succeed (as a retried fsync reports success for pages the kernel
/// dropped).
#[derive(Debug, Clone, Default)]
struct FsyncFailsOnce {
    failed: Arc<std::sync::atomic::AtomicBool>,
    committed: Arc<std::sync::Mutex<PartitionOffsets>>,
}

impl OffsetStore for FsyncFailsOnce {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(self.committed.lock().expect("lock").clone())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(CheckpointError::Io {
                path: "state/offsets.tmp".into(),
                op: "fsync",
                source: std::io::Error::from_raw_os_error(5),
            });
        }
        self.committed.lock().expect("lock").extend(offsets.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_of_the_offset_store_halts_an_endless_run_and_commits_nothing_after_it() {
    let store = FsyncFailsOnce::default();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 2,
        records_per_partition: None,
        max_batch_records: 10,
        rate: Some(2_000.0),
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(source)
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .checkpoint(CheckpointConfig {
            commit_interval: Duration::from_millis(20),
            ..CheckpointConfig::default()
        })
        .offset_store(store.clone())
        .build()
        .unwrap();
    // Nothing cancels the run: the lost store must stop it. The timeout
    // only keeps a regression from hanging the suite.
    let err = tokio::time::timeout(
        Duration::from_secs(120),
        pipeline.run(CancellationToken::new()),
    )
    .await
    .expect("the run stops by itself once its store is lost")
    .expect_err("a run whose store is lost is no success");
    assert!(
        matches!(
            &err,
            PipelineError::Checkpoint(CheckpointError::Io { .. } | CheckpointError::Commit { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("state/offsets.tmp"), "{err}");
    assert!(
        store.committed.lock().expect("lock").is_empty(),
        "no commit after the failed fsync is trusted"
    );
}
