//! The sink driver end to end: retries, failure policies, dead letters,
//! teardown and fan-out, observed through real acknowledgement channels.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use etl_ack::AckStatus;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::{
    Event, FailEveryNth, FailWhere, Flaky, Gated, Hang, MemorySink, Panic, Recording, Rejecting,
    Slow,
};
use etl_sink::{
    NdjsonEncoder, PermanentErrorPolicy, RetryPolicy, SendError, SinkDriver, SinkDriverConfig,
    SinkDriverError, SinkError, SinkHandle,
};
use etl_test_support::acks::{AckedBatches, record, tally};

fn one_batch_per_item(max_in_flight: usize) -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: 10,
        linger: Duration::from_millis(5),
        concurrency: max_in_flight,
        ..SinkDriverConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn thirty_percent_transient_failures_lose_nothing() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let flaky = Arc::new(Flaky::new(memory.clone(), 0.3, 42));
    let sink = SinkDriver::new(flaky.clone(), NdjsonEncoder::new())
        .config(one_batch_per_item(4))
        .spawn();
    let mut expected = BTreeSet::new();
    for i in 0..60 {
        let p = (i % 2) as u32;
        let start = (i / 2) * 10;
        expected.extend((start..start + 10).map(|o| (PartitionId(p), Offset(o))));
        sink.send(source.batch(p, start..start + 10)).await.unwrap();
    }
    let metrics = sink.close().await.unwrap();
    let msgs = source.resolutions();
    assert_eq!(tally(&msgs), (60, 0), "every batch delivered");
    let written: Vec<_> = memory.positions();
    assert_eq!(written.len(), 600, "each record written exactly once");
    assert_eq!(written.into_iter().collect::<BTreeSet<_>>(), expected);
    assert!(flaky.failures() > 0);
    assert_eq!(metrics.retries, flaky.failures());
    assert_eq!(metrics.records_written, 600);
    assert_eq!(metrics.batches_failed, 0);
}

#[tokio::test(start_paused = true)]
async fn data_failures_fail_their_batches_by_default() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(FailEveryNth::data(memory.clone(), 3), NdjsonEncoder::new())
        .config(one_batch_per_item(1))
        .spawn();
    for i in 0..9 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    let metrics = sink.close().await.unwrap();
    let msgs = source.resolutions();
    assert_eq!(tally(&msgs), (6, 3));
    let failed: Vec<u64> = msgs
        .iter()
        .filter(|m| m.status == AckStatus::Failed)
        .map(|m| m.id.seq)
        .collect();
    assert_eq!(failed, vec![2, 5, 8], "calls 3, 6, 9 failed");
    assert_eq!(memory.positions().len(), 60);
    assert_eq!(metrics.batches_written, 6);
    assert_eq!(metrics.batches_failed, 3);
    assert_eq!(metrics.records_written, 60);
    assert_eq!(metrics.retries, 0, "data errors are not retried");
}

#[tokio::test(start_paused = true)]
async fn data_failures_dead_letter_only_the_records_at_fault_by_policy() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let bad = |r: &Record| matches!(r.position.offset.0, 25 | 47);
    let sink = SinkDriver::new(FailWhere::new(memory.clone(), bad), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            on_permanent_error: PermanentErrorPolicy::DeadLetter,
            ..one_batch_per_item(1)
        })
        .dead_letters(dead.clone())
        .spawn();
    for i in 0..9 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    let metrics = sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (9, 0));
    assert_eq!(memory.positions().len(), 88);
    let dead_offsets: Vec<i64> = dead.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(
        dead_offsets,
        vec![25, 47],
        "not their batches' good records"
    );
    assert_eq!(metrics.dead_lettered, 2);
    assert_eq!(metrics.records_written + metrics.dead_lettered, 90);
    let text = String::from_utf8(dead.bytes()).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["reason"].as_str().unwrap().contains("injected failure"));
        assert!(v["key"].as_str().unwrap().starts_with("in/0/"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_sink_refusing_the_letters_fails_the_batch() {
    let mut source = AckedBatches::new();
    let sink = SinkDriver::new(
        FailEveryNth::data(MemorySink::new(), 1),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        on_permanent_error: PermanentErrorPolicy::DeadLetter,
        ..one_batch_per_item(1)
    })
    .dead_letters(FailEveryNth::data(MemorySink::new(), 1))
    .spawn();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    let metrics = sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (0, 1));
    assert_eq!(metrics.dead_lettered, 0);
}

#[tokio::test(start_paused = true)]
async fn a_broken_dead_letter_sink_halts_the_driver() {
    let mut source = AckedBatches::new();
    let sink = SinkDriver::new(
        FailEveryNth::data(MemorySink::new(), 1),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        on_permanent_error: PermanentErrorPolicy::DeadLetter,
        ..one_batch_per_item(1)
    })
    .dead_letters(FailEveryNth::permanent(MemorySink::new(), 1))
    .spawn();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    let err = sink.close().await.unwrap_err();
    assert!(
        matches!(&err, SinkDriverError::DeadLetter(inner) if matches!(inner, SinkError::Permanent(_))),
        "{err}"
    );
    assert_eq!(tally(&source.resolutions()), (0, 1));
}

fn with_bad_value(mut records: Vec<Record>, index: usize) -> Vec<Record> {
    records[index].value = bytes::Bytes::from_static(b"\xffnot json");
    records
}

#[tokio::test(start_paused = true)]
async fn records_the_encoder_refuses_are_dead_lettered_or_fail_the_set() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .dead_letters(dead.clone())
        .spawn();
    let records = with_bad_value((0..5).map(|o| record(0, o)).collect(), 2);
    sink.send(source.batch_of(records)).await.unwrap();
    let metrics = sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (1, 0));
    assert_eq!(memory.positions().len(), 4);
    assert_eq!(dead.positions(), vec![(PartitionId(0), Offset(2))]);
    let line: serde_json::Value = serde_json::from_slice(&dead.bytes()).unwrap();
    assert_eq!(line["value"], "ff6e6f74206a736f6e");
    assert_eq!(line["value_encoding"], "hex");
    assert_eq!(metrics.dead_lettered, 1);

    // Without a dead-letter sink, the batch fails (and will replay).
    let sink = SinkDriver::new(MemorySink::new(), NdjsonEncoder::new()).spawn();
    let records = with_bad_value((0..5).map(|o| record(0, o)).collect(), 0);
    sink.send(source.batch_of(records)).await.unwrap();
    let metrics = sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (0, 1));
    assert_eq!(metrics.batches_failed, 1);
}

#[tokio::test(start_paused = true)]
async fn records_the_sink_rejects_are_dead_lettered() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let dead = MemorySink::new();
    let rejecting = Rejecting::new(memory.clone(), |r: &Record| {
        (r.position.offset.0 % 4 == 0).then(|| "duplicate key".to_owned())
    });
    let sink = SinkDriver::new(rejecting, NdjsonEncoder::new())
        .dead_letters(dead.clone())
        .spawn();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    let metrics = sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (1, 0));
    assert_eq!(memory.positions().len(), 7);
    assert_eq!(dead.positions().len(), 3);
    assert_eq!(metrics.records_written, 7);
    assert_eq!(metrics.dead_lettered, 3);
    assert!(
        String::from_utf8(dead.bytes())
            .unwrap()
            .contains("duplicate key")
    );
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never became true");
}

#[tokio::test(start_paused = true)]
async fn aborting_during_a_write_fails_every_set_held_even_queued_ones() {
    let mut source = AckedBatches::new();
    let hang = Arc::new(Hang::new());
    let sink = SinkDriver::new(hang.clone(), NdjsonEncoder::new())
        .config(one_batch_per_item(1))
        .spawn();
    for i in 0..3 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    wait_for(|| hang.calls() == 1).await;
    assert!(
        source.resolutions().is_empty(),
        "nothing resolves while writing"
    );
    sink.abort().await;
    let msgs = source.resolutions();
    assert_eq!(tally(&msgs), (0, 3), "in-flight and queued batches fail");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_sink_fails_what_the_driver_held() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(Panic::new(memory.clone(), 2), NdjsonEncoder::new())
        .config(one_batch_per_item(1))
        .spawn();
    let sender = sink.sender();
    sender.send(source.batch(0, 0..10)).await.unwrap();
    sender.send(source.batch(0, 10..20)).await.unwrap();
    let err = sink.close().await.unwrap_err();
    assert!(
        matches!(err, SinkDriverError::Panicked(ref m) if m.contains("injected panic")),
        "{err}"
    );
    let msgs = source.resolutions();
    assert_eq!(msgs.len(), 2);
    assert_eq!(
        msgs.iter().find(|m| m.id.seq == 0).unwrap().status,
        AckStatus::Delivered
    );
    assert_eq!(
        msgs.iter().find(|m| m.id.seq == 1).unwrap().status,
        AckStatus::Failed
    );

    // The driver is gone: a send hands the records back, already failed.
    let SendError(back) = sender.send(source.batch(0, 20..30)).await.unwrap_err();
    assert_eq!(back.value().len(), 10);
    drop(back);
    assert_eq!(tally(&source.resolutions()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_past_its_deadline_fails_the_sets() {
    let mut source = AckedBatches::new();
    let sink = SinkDriver::new(Gated::new(MemorySink::new()), NdjsonEncoder::new()).spawn();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    sink.send(source.batch(1, 0..10)).await.unwrap();
    let err = sink.shutdown(Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(err, SinkDriverError::ShutdownTimeout(_)), "{err}");
    assert_eq!(tally(&source.resolutions()), (0, 2));
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_flushes_the_last_partial_batch() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            batch_max_records: 1000,
            linger: Duration::from_secs(3600),
            ..SinkDriverConfig::default()
        })
        .spawn();
    sink.send(source.batch(0, 0..3)).await.unwrap();
    let metrics = sink.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(metrics.records_written, 3);
    assert_eq!(memory.flushes(), 1, "the sink is flushed on close");
    assert_eq!(tally(&source.resolutions()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn batches_close_by_count_bytes_and_linger() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            batch_max_records: 25,
            batch_max_bytes: 1 << 20,
            linger: Duration::from_millis(100),
            concurrency: 1,
            ..SinkDriverConfig::default()
        })
        .spawn();
    // 3 items of 10: the batch closes at 30 >= 25 records.
    for i in 0..3 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    wait_for(|| memory.writes() == 1).await;
    assert_eq!(memory.positions().len(), 30);
    // A lone small item waits for the linger time, then goes out.
    sink.send(source.batch(0, 30..32)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(memory.writes(), 1, "still lingering");
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(memory.writes(), 2);
    let metrics = sink.close().await.unwrap();
    assert_eq!(metrics.batches_written, 2);
    assert!(metrics.write_count >= 2 && metrics.write_latency_max >= metrics.write_latency_mean());

    // By bytes: each record encodes to 14 bytes, so 30 bytes close a batch
    // of 3 records (a batch closes once it reaches the limit).
    let memory = MemorySink::new();
    let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            batch_max_bytes: 30,
            linger: Duration::from_secs(3600),
            concurrency: 1,
            ..SinkDriverConfig::default()
        })
        .spawn();
    for o in 0..6 {
        sink.send(source.batch(0, o..o + 1)).await.unwrap();
    }
    wait_for(|| memory.writes() == 2).await;
    sink.close().await.unwrap();
    assert_eq!(memory.writes(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_sink_stalls_input_instead_of_buffering() {
    let mut source = AckedBatches::new();
    let gated = Gated::new(MemorySink::new());
    let gate = gated.gate();
    let sink = SinkDriver::new(gated, NdjsonEncoder::new())
        .config(SinkDriverConfig {
            channel_capacity: 2,
            ..one_batch_per_item(2)
        })
        .spawn();
    // Two writes in flight, the next batch built (full), two items
    // queued: the sixth send waits.
    for i in 0..5 {
        sink.send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
    }
    let sixth = source.batch(0, 50..60);
    let blocked = tokio::time::timeout(Duration::from_secs(10), sink.send(sixth)).await;
    assert!(blocked.is_err(), "the input channel is full");
    gate.open();
    let metrics = sink.close().await.unwrap();
    assert_eq!(metrics.batches_written, 5);
    // The sixth send was cancelled: its records were never written, so
    // their batch failed.
    assert_eq!(tally(&source.resolutions()), (5, 1));
}

#[tokio::test(start_paused = true)]
async fn fan_out_delivers_only_when_every_sink_has_written() {
    let mut source = AckedBatches::new();
    let fast = SinkDriver::new(MemorySink::new(), NdjsonEncoder::new()).spawn();
    let gated = Gated::new(MemorySink::new());
    let gate = gated.gate();
    let slow = SinkDriver::new(gated, NdjsonEncoder::new()).spawn();
    let item = source.batch(0, 0..10);
    fast.send(item.clone()).await.unwrap();
    slow.send(item).await.unwrap();
    fast.close().await.unwrap();
    assert!(
        source.resolutions().is_empty(),
        "the slow sink still holds it"
    );
    gate.open();
    slow.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (1, 0));

    // If one of the sinks fails it, the batch fails.
    let ok = SinkDriver::new(MemorySink::new(), NdjsonEncoder::new()).spawn();
    let bad = SinkDriver::new(
        FailEveryNth::data(MemorySink::new(), 1),
        NdjsonEncoder::new(),
    )
    .config(SinkDriverConfig {
        retry: RetryPolicy::never(),
        ..SinkDriverConfig::default()
    })
    .spawn();
    let item = source.batch(0, 10..20);
    ok.send(item.clone()).await.unwrap();
    bad.send(item).await.unwrap();
    ok.close().await.unwrap();
    bad.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_returns_before_its_batch_is_delivered() {
    let mut source = AckedBatches::new();
    let dir = tempfile::tempdir().unwrap();
    let file = etl_sink::FileSink::open(dir.path().join("out.ndjson"), Default::default())
        .await
        .unwrap();
    let recording = Recording::new(Slow::new(file, Duration::from_millis(20)));
    let journal = recording.journal();
    let sink = SinkDriver::new(recording, NdjsonEncoder::new())
        .config(one_batch_per_item(2))
        .spawn();
    let items: Vec<_> = (0..4)
        .map(|i| source.batch(0, i * 10..i * 10 + 10))
        .collect();
    let observer_journal = journal.clone();
    let observer = std::thread::spawn(move || {
        for _ in 0..4 {
            let msg = source.next_resolution().expect("resolution");
            observer_journal.note(format!("delivered {} {:?}", msg.last_offset, msg.status));
        }
    });
    for item in items {
        sink.send(item).await.unwrap();
    }
    sink.close().await.unwrap();
    observer.join().unwrap();
    let events = journal.events();
    for i in 0..4i64 {
        let last = i * 10 + 9;
        let done = events
            .iter()
            .position(|e| matches!(e, Event::WriteDone { positions, ok: true } if positions.last().map(|p| p.1.0) == Some(last)))
            .expect("write done");
        let delivered = events
            .iter()
            .position(|e| *e == Event::Note(format!("delivered {last} Delivered")))
            .expect("delivered");
        assert!(done < delivered, "batch ending at {last}: {events:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_byte_limit_is_refused_instead_of_hanging() {
    // `batch_max_bytes = "0B"`: no batch could ever be started. The driver
    // must not take the batch and wait for ever (then panic on close).
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            batch_max_bytes: 0,
            ..one_batch_per_item(1)
        })
        .spawn();
    // The driver may already be gone: the send then hands the batch back,
    // failed.
    let _ = sink.send(source.batch(0, 0..10)).await;
    let closed = tokio::time::timeout(Duration::from_secs(3600), sink.close())
        .await
        .expect("the driver ends");
    let err = closed.unwrap_err();
    assert!(matches!(err, SinkDriverError::InvalidConfig(_)), "{err}");
    assert!(err.to_string().contains("max_bytes"), "{err}");
    assert_eq!(tally(&source.resolutions()), (0, 1), "the batch failed");
    assert!(memory.positions().is_empty());
}

/// A driver into `memory` whose batches of up to 1,000 records wait
/// `linger` for more.
fn lingering(memory: &MemorySink, linger: Duration) -> SinkHandle {
    SinkDriver::new(memory.clone(), NdjsonEncoder::new())
        .config(SinkDriverConfig {
            batch_max_records: 1000,
            linger,
            ..SinkDriverConfig::default()
        })
        .spawn()
}

#[tokio::test(start_paused = true)]
async fn once_the_input_ended_a_partial_batch_is_written_without_lingering() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let linger = Duration::from_secs(3600);
    let sink = lingering(&memory, linger);
    let start = tokio::time::Instant::now();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    sink.input_ended();
    wait_for(|| memory.positions().len() == 10).await;
    // A replay after the end is not held back either.
    sink.send(source.batch(0, 10..15)).await.unwrap();
    wait_for(|| memory.positions().len() == 15).await;
    assert!(start.elapsed() < linger / 10, "{:?}", start.elapsed());
    sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn while_the_source_waits_every_batch_goes_once_the_input_is_idle_then_lingers_again() {
    let mut source = AckedBatches::new();
    let memory = MemorySink::new();
    let linger = Duration::from_secs(3600);
    let sink = lingering(&memory, linger);
    let start = tokio::time::Instant::now();
    sink.source_waiting(true);
    // Dead letters, for one, come a record at a time: each goes while the
    // source still waits, not only the first.
    for i in 0..3 {
        sink.send(source.batch(0, i..i + 1)).await.unwrap();
        wait_for(|| memory.positions().len() == i as usize + 1).await;
    }
    assert!(start.elapsed() < linger / 10, "{:?}", start.elapsed());
    // The source got its credit: batches linger again.
    sink.source_waiting(false);
    sink.send(source.batch(0, 3..5)).await.unwrap();
    tokio::time::sleep(linger / 2).await;
    assert_eq!(memory.positions().len(), 3, "written before its linger");
    tokio::time::sleep(linger / 2).await;
    wait_for(|| memory.positions().len() == 5).await;
    assert!(start.elapsed() >= linger, "{:?}", start.elapsed());
    sink.close().await.unwrap();
    assert_eq!(tally(&source.resolutions()), (4, 0));
}

/// An encoder that counts the records it was given, in front of the
/// NDJSON one.
#[derive(Debug, Default)]
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl etl_sink::Encoder for Counting {
    fn encode(&self, record: &Record, out: &mut bytes::BytesMut) -> Result<(), SinkError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        NdjsonEncoder::new().encode(record, out)
    }
}

/// With its one write in flight, the driver still takes input and builds
/// (checks and encodes) the next batch, so that work overlaps the write
/// instead of waiting for it; the next batch goes only once the write
/// returned, and in its order.
#[tokio::test(start_paused = true)]
async fn the_next_batch_is_built_while_the_only_write_allowed_is_in_flight() {
    let mut source = AckedBatches::new();
    let gated = Gated::new(MemorySink::new());
    let gate = gated.gate();
    let memory = gated.get_ref().clone();
    let encoded = Arc::<std::sync::atomic::AtomicUsize>::default();
    let sink = SinkDriver::new(gated, Counting(encoded.clone()))
        .config(SinkDriverConfig {
            channel_capacity: 1,
            ..one_batch_per_item(1)
        })
        .spawn();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    sink.send(source.batch(0, 10..14)).await.unwrap();
    sink.send(source.batch(0, 14..20)).await.unwrap();
    let count = || encoded.load(std::sync::atomic::Ordering::SeqCst);
    wait_for(|| count() == 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        memory.writes(),
        0,
        "the first write still waits at the gate"
    );
    assert!(source.resolutions().is_empty(), "nothing is delivered yet");
    gate.open();
    let metrics = sink.close().await.unwrap();
    assert_eq!(metrics.batches_written, 2, "the next batch went as one");
    assert_eq!(tally(&source.resolutions()), (3, 0));
    let offsets: Vec<i64> = memory.positions().iter().map(|(_, o)| o.0).collect();
    assert_eq!(offsets, (0..20).collect::<Vec<_>>(), "in order");
}

/// A sink that keeps where each write's bytes were, and nothing else.
#[derive(Debug, Default)]
struct WhereWritten(std::sync::Mutex<Vec<usize>>);

#[async_trait::async_trait]
impl etl_sink::Sink for WhereWritten {
    async fn write(&self, batch: &etl_sink::EncodedBatch) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(batch.bytes().as_ptr() as usize);
        Ok(())
    }
}

/// A written batch's byte buffer is filled again by a later batch, not
/// freed and another allocated (a large buffer is a mapping of its own,
/// whose every page faults in again when allocated anew).
#[tokio::test(start_paused = true)]
async fn a_written_batchs_byte_buffer_is_filled_again_by_a_later_batch() {
    let mut source = AckedBatches::new();
    let sink = Arc::new(WhereWritten::default());
    let driver = SinkDriver::new(sink.clone(), NdjsonEncoder::new())
        .config(one_batch_per_item(1))
        .spawn();
    let written = || sink.0.lock().unwrap().len();
    // Offsets of two digits: every batch's encoding is as long.
    driver.send(source.batch(0, 10..20)).await.unwrap();
    wait_for(|| written() == 1).await;
    // Were the first buffer freed, one of these would take its place.
    let occupants: Vec<Vec<u8>> = (0..8).map(|_| vec![1u8; 150]).collect();
    for i in 2..5 {
        driver
            .send(source.batch(0, i * 10..i * 10 + 10))
            .await
            .unwrap();
        wait_for(|| written() == i as usize).await;
    }
    driver.close().await.unwrap();
    drop(occupants);
    let at = sink.0.lock().unwrap().clone();
    assert!(
        at[1..].contains(&at[0]),
        "the first batch's buffer came back: {at:x?}"
    );
    assert_eq!(tally(&source.resolutions()), (4, 0));
}

/// With its one write held, the driver may hold one batch being built
/// beside it (`SinkDriverConfig::concurrency`), then the input channel
/// pushes back. Records the encoder refuses fill that batch as much as
/// the records it accepts: a driver whose write is held does not take
/// every item of refused records it is given, holding them (and their
/// handles) without bound while the sender is never slowed.
#[tokio::test(start_paused = true)]
async fn refused_records_do_not_pile_up_in_the_driver_behind_a_write_in_flight() {
    let mut source = AckedBatches::new();
    let gated = Gated::new(MemorySink::new());
    let gate = gated.gate();
    let sink = SinkDriver::new(gated, NdjsonEncoder::new())
        .config(SinkDriverConfig {
            channel_capacity: 1,
            ..one_batch_per_item(1)
        })
        .dead_letters(MemorySink::new())
        .spawn();
    // A full batch: its write goes at once and waits at the gate.
    sink.send(source.batch(0, 0..10)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut taken = 0;
    for i in 1..=100 {
        let records = (i * 10..i * 10 + 10)
            .map(|o| {
                let mut r = record(0, o);
                r.value = bytes::Bytes::from_static(b"\xffnot json");
                r
            })
            .collect();
        let send = sink.send(source.batch_of(records));
        match tokio::time::timeout(Duration::from_secs(1), send).await {
            Ok(sent) => {
                sent.unwrap();
                taken += 1;
            }
            Err(_) => break,
        }
    }
    assert!(
        taken <= 3,
        "one batch being built and the channel's one item, not {taken} items of refused records"
    );
    gate.open();
    sink.close().await.unwrap();
}
