//! Errors of the environment stop the driver; errors of the data fail
//! exactly the source batches that hold the bad records.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::{Broken, FailEveryNth, FailWhere, MemorySink};
use etl_sink::{
    FailureKind, NdjsonEncoder, PermanentErrorPolicy, RetryPolicy, SinkDriver, SinkDriverConfig,
    SinkDriverError, SinkError,
};
use tokio::time::Instant;

use etl_test_support::acks::{AckedBatches, record, tally};

/// One write per `batch_max_records` records; the dead-letter policy on, so a
/// failure wrongly taken for bad data would show up as dead letters.
fn dead_lettering(max_records: usize) -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: max_records,
        linger: Duration::from_millis(5),
        concurrency: 2,
        on_permanent_error: PermanentErrorPolicy::DeadLetter,
        ..SinkDriverConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_broken_pipe_halts_the_driver_and_dead_letters_nothing() {
    let mut source = AckedBatches::new();
    let broken = Arc::new(Broken::broken_pipe());
    let dead = MemorySink::new();
    let sink = SinkDriver::new(broken.clone(), NdjsonEncoder::new())
        .config(dead_lettering(10))
        .dead_letters(dead.clone())
        .spawn();
    let start = Instant::now();
    let mut sent = 0;
    for i in 0..20 {
        // Once the driver stopped, a send hands the batch back, failed.
        if sink
            .send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .is_ok()
        {
            sent += 1;
        }
    }
    let err = sink.close().await.unwrap_err();
    assert!(err.is_io(), "{err}");
    assert!(err.to_string().contains("standard output"), "{err}");
    assert!(
        matches!(&err, SinkDriverError::Sink(e) if e.kind() == FailureKind::Environment),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "a broken pipe is not retried: {:?}",
        start.elapsed()
    );
    assert!(sent >= 1);
    assert_eq!(tally(&source.resolutions()), (0, 20), "nothing delivered");
    assert!(dead.positions().is_empty(), "no good record dead-lettered");
    assert!(broken.calls() <= 2, "no write after the failure was seen");
}

#[tokio::test(start_paused = true)]
async fn a_halting_driver_calls_on_halt_before_anything_it_holds_fails() {
    let (acker, receiver) = etl_ack::channel();
    let receiver = Arc::new(Mutex::new(receiver));
    // Resolutions in the order they reached the receiver, `None` where
    // the driver said it halts.
    let seen: Arc<Mutex<Vec<Option<AckStatus>>>> = Arc::default();
    let drain = {
        let (receiver, seen) = (receiver.clone(), seen.clone());
        move || {
            let mut receiver = receiver.lock().unwrap();
            let mut seen = seen.lock().unwrap();
            while let Ok(event) = receiver.try_next() {
                if let AckEvent::Resolved(msg) = event {
                    seen.push(Some(msg.status));
                }
            }
        }
    };
    let on_halt = {
        let (drain, seen) = (drain.clone(), seen.clone());
        move || {
            drain();
            seen.lock().unwrap().push(None);
        }
    };
    // Two writes in flight, one being built, more queued: all held when
    // the first write finds the pipe broken.
    let sink = SinkDriver::new(Arc::new(Broken::broken_pipe()), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            channel_capacity: 8,
            ..dead_lettering(10)
        })
        .on_halt(on_halt)
        .spawn();
    let batches = 20;
    for seq in 0..batches {
        let first = i64::try_from(seq).unwrap() * 10;
        let ack = acker
            .open(BatchMeta {
                id: BatchId {
                    partition: PartitionId(0),
                    epoch: 1,
                    seq,
                },
                first_offset: Offset(first),
                last_offset: Offset(first + 9),
                records: 10,
                bytes: 100,
            })
            .unwrap();
        let records = (first..first + 10).map(|o| record(0, o)).collect();
        let _ = sink.send(Acked::new(records, ack)).await;
    }
    assert!(sink.close().await.unwrap_err().is_io());
    drain();
    let seen = seen.lock().unwrap();
    let halt = seen.iter().position(Option::is_none).expect("on_halt ran");
    assert_eq!(halt, 0, "nothing failed before the driver said it halts");
    assert_eq!(seen.iter().filter(|s| s.is_none()).count(), 1, "once");
    assert_eq!(
        seen[1..].to_vec(),
        vec![Some(AckStatus::Failed); 20],
        "every batch failed after it"
    );
}

/// A pipeline adds its own `on_halt` to every sink driver it runs: one
/// given before (a user's, or a wrapper's) is still called, not replaced.
#[tokio::test(start_paused = true)]
async fn every_on_halt_given_to_a_driver_is_called_in_the_order_given() {
    let mut source = AckedBatches::new();
    let calls: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let (first, second) = (calls.clone(), calls.clone());
    let sink = SinkDriver::new(Arc::new(Broken::broken_pipe()), NdjsonEncoder::new())
        .config(dead_lettering(10))
        .on_halt(move || first.lock().unwrap().push("user"))
        .on_halt(move || second.lock().unwrap().push("pipeline"))
        .spawn();
    let _ = sink.send(source.batch(0, 0..10)).await;
    assert!(sink.close().await.unwrap_err().is_io());
    assert_eq!(*calls.lock().unwrap(), ["user", "pipeline"], "each once");
}

/// A user's `on_halt` that panics must not keep the pipeline's (given
/// after it) from being called: the halt would be taken for a replay.
#[tokio::test(start_paused = true)]
async fn an_on_halt_that_panics_does_not_keep_the_next_from_being_called() {
    let mut source = AckedBatches::new();
    let calls: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let second = calls.clone();
    let sink = SinkDriver::new(Arc::new(Broken::broken_pipe()), NdjsonEncoder::new())
        .config(dead_lettering(10))
        .on_halt(|| panic!("a user's on_halt panics"))
        .on_halt(move || second.lock().unwrap().push("pipeline"))
        .spawn();
    let _ = sink.send(source.batch(0, 0..10)).await;
    assert!(sink.close().await.unwrap_err().is_io());
    assert_eq!(*calls.lock().unwrap(), ["pipeline"]);
    assert_eq!(tally(&source.resolutions()), (0, 1), "the batch failed");
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_closes_or_fails_a_batch_on_its_data_never_calls_on_halt() {
    let mut source = AckedBatches::new();
    let called = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = called.clone();
    let sink = SinkDriver::new(
        FailEveryNth::data(MemorySink::new(), 2),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        batch_max_records: 10,
        ..SinkDriverConfig::default()
    })
    .on_halt(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
    .spawn();
    for i in 0..4 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    sink.close().await.unwrap();
    assert_eq!(
        tally(&source.resolutions()),
        (2, 2),
        "two failed on their data"
    );
    assert!(!called.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn an_unclassified_failure_halts_after_the_retry_policy() {
    // A permanent error: not retried, and not known to be the records'
    // fault.
    let mut source = AckedBatches::new();
    let dead = MemorySink::new();
    let sink = SinkDriver::new(
        FailEveryNth::permanent(MemorySink::new(), 1),
        NdjsonEncoder::new(),
    )
    .config(dead_lettering(10))
    .dead_letters(dead.clone())
    .spawn();
    let _ = sink.send(source.batch(0, 0..10)).await;
    let err = sink.close().await.unwrap_err();
    assert!(
        matches!(err, SinkDriverError::Sink(SinkError::Permanent(_))),
        "{err}"
    );
    assert_eq!(tally(&source.resolutions()), (0, 1));
    assert!(dead.positions().is_empty());

    // A retryable error that never clears: retried until the policy gives
    // up, then the driver stops (it does not replay for ever).
    let policy = RetryPolicy {
        max_elapsed: Duration::from_secs(30),
        ..RetryPolicy::default()
    };
    let broken = Arc::new(Broken::new(|| SinkError::retryable("broker unreachable")));
    let sink = SinkDriver::new(broken.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            retry: policy,
            ..dead_lettering(10)
        })
        .dead_letters(dead.clone())
        .spawn();
    let start = Instant::now();
    let _ = sink.send(source.batch(0, 0..10)).await;
    let err = sink.close().await.unwrap_err();
    assert!(
        matches!(err, SinkDriverError::Sink(SinkError::Retryable(_))),
        "{err}"
    );
    assert!(start.elapsed() <= Duration::from_secs(30));
    assert!(broken.calls() > 1, "retried first");
    assert_eq!(tally(&source.resolutions()), (0, 1));
    assert!(dead.positions().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_merged_write_failing_on_one_record_fails_only_its_batch() {
    // Ten single-record batches, as the source sends a narrowed range,
    // merged by the driver into one write; the sink fails any write
    // holding offset 9.
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(
        FailWhere::new(memory.clone(), |r: &Record| r.position.offset == Offset(9)),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        batch_max_records: 100,
        linger: Duration::from_millis(5),
        ..SinkDriverConfig::default()
    })
    .spawn();
    for o in 0..10 {
        sink.send(source.batch(0, o..o + 1)).await.unwrap();
    }
    let metrics = sink.close().await.unwrap();
    let msgs = source.resolutions();
    let failed: Vec<i64> = msgs
        .iter()
        .filter(|m| m.status == AckStatus::Failed)
        .map(|m| m.last_offset.0)
        .collect();
    assert_eq!(failed, vec![9], "only the batch holding offset 9 fails");
    assert_eq!(tally(&msgs), (9, 1));
    let written: Vec<i64> = memory.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(written, (0..9).collect::<Vec<_>>());
    assert_eq!(metrics.records_written, 9);
}

#[tokio::test(start_paused = true)]
async fn a_merged_write_dead_letters_only_the_record_at_fault_by_policy() {
    // Batches of 5 records merged into one write that fails on offset 7:
    // under the dead-letter policy the driver narrows it down itself.
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let sink = SinkDriver::new(
        FailWhere::new(memory.clone(), |r: &Record| r.position.offset == Offset(7)),
        NdjsonEncoder::new(),
    )
    .config(dead_lettering(100))
    .dead_letters(dead.clone())
    .spawn();
    for i in 0..4 {
        sink.send(source.batch(0, i * 5..i * 5 + 5)).await.unwrap();
    }
    sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (4, 0));
    let dead: Vec<i64> = dead.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(dead, vec![7], "not the good records of its batch");
    let written: Vec<i64> = memory.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(written, (0..20).filter(|&o| o != 7).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_batch_failing_in_a_merged_write_keeps_its_encoder_refusals_for_its_replay() {
    // Two batches merged into one write, each holding a value the encoder
    // refuses; the sink fails any write holding offset 8 (second batch).
    // Only the first batch is written, so only its refusal is a dead
    // letter: the second batch's comes again when it replays.
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let sink = SinkDriver::new(
        FailWhere::new(memory.clone(), |r: &Record| r.position.offset == Offset(8)),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        batch_max_records: 100,
        linger: Duration::from_millis(5),
        ..SinkDriverConfig::default()
    })
    .dead_letters(dead.clone())
    .spawn();
    for (range, bad) in [(0..5, 2), (5..10, 6)] {
        let records = range
            .map(|o| {
                let mut r = record(0, o);
                if o == bad {
                    r.value = bytes::Bytes::from_static(b"\xffnot json");
                }
                r
            })
            .collect();
        sink.send(source.batch_of(records)).await.unwrap();
    }
    sink.close().await.unwrap();
    let msgs = source.resolutions();
    let failed: Vec<i64> = msgs
        .iter()
        .filter(|m| m.status == AckStatus::Failed)
        .map(|m| m.last_offset.0)
        .collect();
    assert_eq!(failed, vec![9], "only the second batch fails");
    let dead: Vec<i64> = dead.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(dead, vec![2], "no dead letter for a batch that replays");
    let written: Vec<i64> = memory.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(written, vec![0, 1, 3, 4]);
}

/// An exactly-once sink stores progress with its data. A record the
/// encoder refuses goes to the dead-letter sink instead; if the data were
/// written (and progress stored past the record) before its letter, a
/// letter that then fails would lose the record for good: the next run
/// skips what the progress covers.
#[tokio::test(start_paused = true)]
async fn an_exactly_once_sink_stores_no_progress_past_a_refused_record_before_its_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = etl_sink::FileSinkConfig {
        exactly_once: true,
        ..etl_sink::FileSinkConfig::default()
    };
    let file = etl_sink::FileSink::open(&path, config).await.unwrap();
    let mut source = AckedBatches::new();
    let mut records: Vec<Record> = (0..10).map(|o| record(0, o)).collect();
    records[4] = Record::new(records[4].position.clone(), "not json");
    let (driver, _) = SinkDriver::exactly_once(file, NdjsonEncoder::new());
    let sink = driver
        .dead_letters(FailEveryNth::data(MemorySink::new(), 1))
        .spawn();
    sink.send(source.batch_of(records)).await.unwrap();
    let _ = sink.close().await;
    assert_eq!(tally(&source.resolutions()), (0, 1), "the batch fails");
    let reopened = etl_sink::FileSink::open(&path, config).await.unwrap();
    let progress = etl_sink::ProgressSink::progress(&reopened);
    assert!(
        !progress.covers(&record(0, 4)),
        "progress {:?} covers the refused record whose dead letter failed",
        progress.iter().collect::<Vec<_>>()
    );
}
