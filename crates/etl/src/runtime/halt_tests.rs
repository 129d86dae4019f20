//! A run that halts replays nothing, so nothing may say it replays: a
//! transform that halts on a record, and a dead-letter sink that cannot
//! write, each end the run, and the failures they cause are logged as not
//! replayed (the next run reads them again from the last commit).
//!
//! The lines are read from a subscriber of the test's own thread: the
//! checkpointer's thread logs to the subscriber of the thread that
//! started it, so tests running at the same time do not mix their lines.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::{Broken, MemorySink};
use etl_sink::{RawLinesEncoder, SinkDriver};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineError};
use crate::transform::{Outcome, Transform};

/// The lines logged while `run` ran on this thread (and on the threads
/// its checkpointer started), with what it returned.
async fn logged<T>(run: impl Future<Output = T>) -> (T, String) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = Captured(log.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let result = {
        let _default = tracing::subscriber::set_default(subscriber);
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the run ends")
    };
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    (result, text)
}

#[derive(Clone)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Halts on offset `at` of every partition; rejects offsets `reject` mod
/// 10 when set; keeps the rest.
#[derive(Debug, Clone)]
struct Judge {
    halt_at: Option<i64>,
    reject: Option<i64>,
}

impl Transform for Judge {
    fn name(&self) -> &str {
        "judge"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        let offset = record.position.offset.0;
        if self.halt_at == Some(offset) {
            Outcome::Halt(record, "cannot be processed".to_owned())
        } else if self.reject.is_some_and(|r| offset % 10 == r) {
            Outcome::Reject(record, "set aside".to_owned())
        } else {
            Outcome::Keep(record)
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.clone()))
    }
}

/// Panics, or halts, on offset `at` of every partition.
#[derive(Debug, Clone)]
struct StopAt {
    at: i64,
    panics: bool,
}

impl Transform for StopAt {
    fn name(&self) -> &str {
        "stop_at"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        if record.position.offset.0 != self.at {
            return Outcome::Keep(record);
        }
        assert!(!self.panics, "a bug in user code");
        Outcome::Halt(record, "cannot be processed".to_owned())
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.clone()))
    }
}

fn source() -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        partitions: 3,
        records_per_partition: Some(600),
        max_batch_records: 4,
        ..GeneratorConfig::default()
    })
    .unwrap()
}

/// No line announces a replay; at least one says a partition is not
/// replayed.
fn assert_no_replay_announced(log: &str) {
    let replaying: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("replaying the partition"))
        .collect();
    assert!(
        replaying.is_empty(),
        "replays announced in a run that halts: {replaying:#?}"
    );
    assert!(
        log.lines().any(|l| l.contains("not replayed")),
        "the halted partition's line: {log}"
    );
}

/// What the halt left committed is in the sink, and nothing at or past
/// the batch that halted (offsets `at` rounded down to the batch of 4) is
/// committed.
fn assert_committed_was_written(store: &MemoryStore, sink: &MemorySink, halted_at: i64) {
    let written: std::collections::BTreeSet<(u32, i64)> = sink
        .records()
        .iter()
        .map(|r| (r.position.partition.0, r.position.offset.0))
        .collect();
    let offsets = store.offsets();
    for partition in 0..3 {
        let committed = offsets
            .get(&PartitionId(partition))
            .copied()
            .unwrap_or(Offset(0))
            .0;
        assert!(
            committed <= halted_at / 4 * 4,
            "partition {partition} committed {committed}, past the batch that halted"
        );
        for offset in 0..committed {
            assert!(
                written.contains(&(partition, offset)),
                "partition {partition}: offset {offset} committed, never written"
            );
        }
    }
}

async fn a_transform_halt(workers: usize) {
    let (store, sink) = (MemoryStore::new(), MemorySink::default());
    let pipeline = Pipeline::builder()
        .source(source())
        .transform(Judge {
            halt_at: Some(250),
            reject: None,
        })
        .transform_workers(workers)
        .sink("out", SinkDriver::new(sink.clone(), RawLinesEncoder::new()))
        .offset_store(store.clone())
        .build()
        .unwrap();
    let (result, log) = logged(pipeline.run(CancellationToken::new())).await;
    assert!(
        matches!(result, Err(PipelineError::TransformHalted { .. })),
        "{result:?}"
    );
    assert_no_replay_announced(&log);
    assert_committed_was_written(&store, &sink, 250);
}

/// Nothing but the stage's stop can end this run: its source has read
/// its last record (the stop is in its last batch), so it sends nothing
/// more that would find the stage gone, and waits for the batches it
/// handed on; no replay is asked for once the halt is recorded.
async fn a_stage_stop_ends_a_run_with_nothing_left_to_read(workers: usize, panics: bool) {
    let (store, sink) = (MemoryStore::new(), MemorySink::default());
    let read_to_the_end = GeneratorSource::new(GeneratorConfig {
        partitions: 3,
        records_per_partition: Some(252),
        max_batch_records: 4,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(read_to_the_end)
        .transform(StopAt { at: 250, panics })
        .transform_workers(workers)
        .sink("out", SinkDriver::new(sink.clone(), RawLinesEncoder::new()))
        .offset_store(store.clone())
        .build()
        .unwrap();
    let (result, _log) = logged(pipeline.run(CancellationToken::new())).await;
    if panics {
        assert!(
            matches!(result, Err(PipelineError::Internal(_))),
            "{result:?}"
        );
    } else {
        assert!(
            matches!(result, Err(PipelineError::TransformHalted { .. })),
            "{result:?}"
        );
    }
    assert_committed_was_written(&store, &sink, 250);
}

#[tokio::test(flavor = "current_thread")]
async fn a_transform_panic_on_the_stages_task_ends_a_run_with_nothing_left_to_read() {
    a_stage_stop_ends_a_run_with_nothing_left_to_read(0, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_panic_on_worker_threads_ends_a_run_with_nothing_left_to_read() {
    a_stage_stop_ends_a_run_with_nothing_left_to_read(2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_halt_ends_a_run_with_nothing_left_to_read() {
    a_stage_stop_ends_a_run_with_nothing_left_to_read(2, false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_transform_halt_on_the_stages_task_announces_no_replay() {
    a_transform_halt(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_halt_on_worker_threads_announces_no_replay() {
    a_transform_halt(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_sink_that_cannot_write_halts_and_announces_no_replay() {
    let pipeline = Pipeline::builder()
        .source(source())
        .transform(Judge {
            halt_at: None,
            reject: Some(3),
        })
        .transform_workers(0)
        .sink(
            "out",
            SinkDriver::new(MemorySink::default(), RawLinesEncoder::new()),
        )
        .dead_letter(Broken::broken_pipe())
        .build()
        .unwrap();
    let (result, log) = logged(pipeline.run(CancellationToken::new())).await;
    match &result {
        Err(PipelineError::Sink { name, .. }) => assert_eq!(name, "dead_letter"),
        other => panic!("the dead-letter sink's error: {other:?}"),
    }
    assert_no_replay_announced(&log);
}
