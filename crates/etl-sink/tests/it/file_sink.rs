//! The file sink: appends, crash recovery, rotation, and exactly-once
//! output across simulated crashes.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId};
use etl_sink::{
    EncodedBatch, FileSink, FileSinkConfig, FsyncPolicy, NdjsonEncoder, ProgressSink,
    RawLinesEncoder, Sink, SinkDriver, SinkDriverConfig, SinkError,
};
use etl_test_support::acks::{AckedBatches, record, tally};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

fn batch(partition: u32, offsets: std::ops::Range<i64>) -> EncodedBatch {
    let records = offsets.map(|o| record(partition, o)).collect();
    EncodedBatch::encode(records, &NdjsonEncoder::new()).0
}

fn append_raw(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// `(partition, offset)` of every line of every file of the output.
fn positions(files: &[std::path::PathBuf]) -> Vec<(u32, i64)> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: bad line {line:?}: {e}", file.display()));
            out.push((
                u32::try_from(v["p"].as_u64().unwrap()).unwrap(),
                v["o"].as_i64().unwrap(),
            ));
        }
    }
    out
}

#[tokio::test]
async fn appends_and_reopens_after_the_last_complete_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let sink = FileSink::open(&path, FileSinkConfig::default())
        .await
        .unwrap();
    sink.write(&batch(0, 0..3)).await.unwrap();
    drop(sink);
    // A crash mid-append left half a line behind.
    append_raw(&path, b"{\"p\":0,\"o\":3");
    let sink = FileSink::open(&path, FileSinkConfig::default())
        .await
        .unwrap();
    assert_eq!(positions(&sink.files()), vec![(0, 0), (0, 1), (0, 2)]);
    sink.write(&batch(0, 3..5)).await.unwrap();
    sink.flush().await.unwrap();
    assert_eq!(positions(&sink.files()).len(), 5);
    assert!(
        sink.progress().is_empty(),
        "progress is only kept in exactly-once mode"
    );
}

#[tokio::test]
async fn a_file_without_any_line_break_is_cut_to_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    std::fs::write(&path, b"partial").unwrap();
    let sink = FileSink::open(&path, FileSinkConfig::default())
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(sink.path()).unwrap().len(), 0);
}

#[tokio::test]
async fn rotates_by_size_and_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    // Each record is 14 bytes: three batches of 2 records, 40-byte files.
    let config = FileSinkConfig {
        rotate_bytes: Some(40),
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    for i in 0..3 {
        sink.write(&batch(0, i * 2..i * 2 + 2)).await.unwrap();
    }
    assert_eq!(sink.segments(), 2);
    assert_eq!(
        positions(&sink.files()),
        (0..6).map(|o| (0, o)).collect::<Vec<_>>()
    );
    drop(sink);
    // Reopening finds the segments and keeps numbering after them.
    let config = FileSinkConfig {
        rotate_after: Some(Duration::ZERO),
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    assert_eq!(sink.segments(), 2);
    sink.write(&batch(0, 6..7)).await.unwrap();
    assert_eq!(sink.segments(), 3, "an aged, non-empty file rotates");
    assert_eq!(positions(&sink.files()).len(), 7);
}

#[tokio::test]
async fn interval_fsync_shares_one_fsync_between_concurrent_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        fsync: FsyncPolicy::Interval(Duration::from_millis(30)),
        ..FileSinkConfig::default()
    };
    let sink = std::sync::Arc::new(FileSink::open(&path, config).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..4 {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            sink.write(&batch(1, i * 5..i * 5 + 5)).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(positions(&sink.files()).len(), 20);
}

#[tokio::test]
async fn exactly_once_cuts_back_to_the_recorded_length_and_skips_stored_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    assert!(sink.progress().is_empty());
    sink.write(&batch(0, 0..4)).await.unwrap();
    sink.write(&batch(1, 10..12)).await.unwrap();
    // A retried (or replayed) batch that is already stored is not written twice.
    sink.write(&batch(0, 2..6)).await.unwrap();
    let progress = sink.progress();
    assert_eq!(progress.get(PartitionId(0)), Some(Offset(6)));
    assert_eq!(progress.get(PartitionId(1)), Some(Offset(12)));
    drop(sink);
    // Data appended but never recorded (a crash before the progress file
    // was replaced) is cut off on open.
    append_raw(&path, b"{\"p\":0,\"o\":6}\n{\"p\":0,\"o\":7}\n");
    let sink = FileSink::open(&path, config).await.unwrap();
    assert_eq!(sink.progress(), progress);
    let mut got = positions(&sink.files());
    got.sort_unstable();
    let mut want: Vec<_> = (0..6).map(|o| (0, o)).chain([(1, 10), (1, 11)]).collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[tokio::test]
async fn exactly_once_recovers_a_rotation_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    sink.write(&batch(0, 0..3)).await.unwrap();
    drop(sink);
    // The crash hit after the rename, before the progress file said so.
    std::fs::rename(&path, dir.path().join("out.ndjson.1")).unwrap();
    let sink = FileSink::open(&path, config).await.unwrap();
    assert_eq!(sink.segments(), 1);
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(3)));
    sink.write(&batch(0, 3..4)).await.unwrap();
    assert_eq!(
        positions(&sink.files()),
        (0..4).map(|o| (0, o)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_data_file_shorter_than_recorded_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    sink.write(&batch(0, 0..3)).await.unwrap();
    drop(sink);
    std::fs::write(&path, b"").unwrap();
    let err = FileSink::open(&path, config).await.unwrap_err();
    // Records the progress covers are gone: lost output (exit 74), never
    // cut back silently.
    assert!(matches!(err, SinkError::OutputLost { .. }), "{err}");
    assert!(err.is_io() && !err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("shorter"), "{err}");
}

#[tokio::test]
async fn the_dead_letter_driver_writes_lines_then_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.ndjson");
    let mut source = AckedBatches::new();
    let file = FileSink::open(&path, FileSinkConfig::default())
        .await
        .unwrap();
    let dead = etl_sink::DeadLetterHandle::spawn(file, SinkDriverConfig::default());
    let item = source.batch(3, 0..2);
    let (records, ack) = item.into_parts();
    for r in records {
        let letter = etl_record::DeadLetter::new(r, "line too long");
        dead.send(etl_ack::Acked::new(letter, ack.clone()))
            .await
            .unwrap();
    }
    drop(ack);
    let metrics = dead.close().await.unwrap();
    assert_eq!(metrics.records_written, 2);
    assert_eq!(tally(&source.resolutions()), (1, 0));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["key"], "in/3/1");
    assert_eq!(lines[1]["reason"], "line too long");
    assert_eq!(lines[1]["value"], "{\"p\":3,\"o\":1}");
}

#[tokio::test(start_paused = true)]
async fn an_exactly_once_driver_halts_after_a_failed_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let file = FileSink::open(&path, config).await.unwrap();
    let failing = etl_sink::testing::FailEveryNth::data(file, 2);
    let (driver, progress) = SinkDriver::exactly_once(failing, NdjsonEncoder::new());
    assert!(progress.is_empty());
    let sink = driver
        .config(SinkDriverConfig {
            batch_max_records: 5,
            concurrency: 4,
            ..SinkDriverConfig::default()
        })
        .spawn();
    let mut source = AckedBatches::new();
    for i in 0..4 {
        // Sends may find the driver already halted; then they fail too.
        let _ = sink.send(source.batch(0, i * 5..i * 5 + 5)).await;
    }
    let err = sink.close().await.unwrap_err();
    assert!(matches!(err, etl_sink::SinkDriverError::Halted(_)), "{err}");
    let msgs = source.resolutions();
    assert_eq!(tally(&msgs), (1, 3), "only the first batch was stored");
    // Nothing after the failed batch reached the file or its progress.
    let file = FileSink::open(&path, config).await.unwrap();
    assert_eq!(file.progress().get(PartitionId(0)), Some(Offset(5)));
    assert_eq!(positions(&file.files()).len(), 5);
}

/// The batch that makes an exactly-once driver halt fails only after
/// the driver said it halts, like every other batch it holds: upstream,
/// no failure of a halting driver is taken for one to replay.
#[tokio::test(start_paused = true)]
async fn an_exactly_once_driver_says_it_halts_before_the_failed_batch_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let file = FileSink::open(&dir.path().join("out.ndjson"), config)
        .await
        .unwrap();
    let (driver, _) = SinkDriver::exactly_once(
        etl_sink::testing::FailEveryNth::data(file, 2),
        NdjsonEncoder::new(),
    );
    let (acker, receiver) = etl_ack::channel();
    let receiver = std::sync::Arc::new(std::sync::Mutex::new(receiver));
    // Resolutions in the order they reached the receiver, `None` where
    // the driver said it halts.
    let seen: std::sync::Arc<std::sync::Mutex<Vec<Option<AckStatus>>>> = Default::default();
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
    let sink = driver
        .config(SinkDriverConfig {
            batch_max_records: 5,
            ..SinkDriverConfig::default()
        })
        .on_halt(on_halt)
        .spawn();
    for seq in 0..4 {
        let first = i64::try_from(seq).unwrap() * 5;
        let ack = acker
            .open(BatchMeta {
                id: BatchId {
                    partition: PartitionId(0),
                    epoch: 1,
                    seq,
                },
                first_offset: Offset(first),
                last_offset: Offset(first + 4),
                records: 5,
                bytes: 50,
            })
            .unwrap();
        let records = (first..first + 5).map(|o| record(0, o)).collect();
        let _ = sink.send(Acked::new(records, ack)).await;
    }
    let err = sink.close().await.unwrap_err();
    assert!(matches!(err, etl_sink::SinkDriverError::Halted(_)), "{err}");
    drain();
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[..2],
        [Some(AckStatus::Delivered), None],
        "the first batch stored, then the halt, before any failure: {seen:?}"
    );
    assert_eq!(
        seen[2..],
        [Some(AckStatus::Failed); 3],
        "every other batch failed after it"
    );
}

const PARTITIONS: u32 = 2;
const PER_PARTITION: i64 = 200;

/// One run of the "process": resume from the sink's progress (sometimes
/// from a little earlier, as a lagging offset store would), send records,
/// and either crash after `crash_after` items or finish cleanly.
async fn run_once(path: &Path, round: u32, crash_after: Option<usize>) -> bool {
    let config = FileSinkConfig {
        exactly_once: true,
        rotate_bytes: Some(1500),
        ..FileSinkConfig::default()
    };
    let file = FileSink::open(path, config).await.unwrap();
    let (driver, progress) = SinkDriver::exactly_once(file, NdjsonEncoder::new());
    let sink = driver
        .config(SinkDriverConfig {
            batch_max_records: 16,
            linger: Duration::from_millis(1),
            ..SinkDriverConfig::default()
        })
        .spawn();
    let mut source = AckedBatches::new();
    let mut next: Vec<i64> = (0..PARTITIONS)
        .map(|p| {
            let resume = progress.get(PartitionId(p)).map_or(0, |o| o.0);
            if round % 3 == 1 {
                (resume - 5).max(0)
            } else {
                resume
            }
        })
        .collect();
    let mut sent = 0;
    while next.iter().any(|&n| n < PER_PARTITION) {
        for p in 0..PARTITIONS {
            let from = next[p as usize];
            let to = (from + 7).min(PER_PARTITION);
            if from < to {
                sink.send(source.batch(p, from..to)).await.unwrap();
                next[p as usize] = to;
                sent += 1;
                if crash_after == Some(sent) {
                    // Crash: the runtime is dropped with the driver mid-run.
                    return false;
                }
            }
        }
    }
    sink.close().await.unwrap();
    let (_, failed) = tally(&source.resolutions());
    assert_eq!(failed, 0);
    true
}

#[test]
fn exactly_once_file_output_survives_repeated_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut finished = false;
    for round in 0..30u32 {
        let crash_after = (round < 29).then(|| rng.random_range(1..12usize));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let done = runtime.block_on(run_once(&path, round, crash_after));
        // Cancels every task; blocking file work already started finishes,
        // as it would have reached the disk before a real crash.
        runtime.shutdown_timeout(Duration::from_secs(20));
        if done {
            finished = true;
            break;
        }
        if round % 2 == 0 && path.exists() {
            // A torn append the progress file does not cover.
            append_raw(&path, b"{\"p\":0,\"o\":99999}\n{\"p\":1,");
        }
    }
    assert!(finished);
    let segments = (1..)
        .map(|n| dir.path().join(format!("out.ndjson.{n}")))
        .take_while(|p| p.exists());
    let files: Vec<_> = segments.chain([path.clone()]).collect();
    assert!(files.len() > 2, "rotation was exercised");
    let got = positions(&files);
    let unique: BTreeSet<_> = got.iter().copied().collect();
    assert_eq!(got.len(), unique.len(), "no record twice");
    let want: BTreeSet<_> = (0..PARTITIONS)
        .flat_map(|p| (0..PER_PARTITION).map(move |o| (p, o)))
        .collect();
    assert_eq!(unique, want, "every record once");
}

#[tokio::test]
async fn raw_lines_reach_the_file_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.txt");
    let mut source = AckedBatches::new();
    let file = FileSink::open(&path, FileSinkConfig::default())
        .await
        .unwrap();
    let sink = SinkDriver::new(file, RawLinesEncoder::new()).spawn();
    sink.send(source.batch(0, 0..2)).await.unwrap();
    sink.close().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\"p\":0,\"o\":0}\n{\"p\":0,\"o\":1}\n"
    );
}

#[tokio::test]
async fn a_second_sink_on_the_same_output_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    for exactly_once in [true, false] {
        let config = FileSinkConfig {
            exactly_once,
            ..FileSinkConfig::default()
        };
        let first = FileSink::open(&path, config).await.unwrap();
        let err = FileSink::open(&path, config).await.unwrap_err();
        let text = err.to_string();
        assert!(held_by_another_sink(&err), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        first.write(&batch(0, 0..2)).await.unwrap();
        drop(first);
        let second = FileSink::open(&path, config).await.unwrap();
        second.write(&batch(0, 2..4)).await.unwrap();
    }
}

/// Whether `err`, or an error under it, says another sink holds the
/// output (as the `etl` binary looks for it, to exit 75).
fn held_by_another_sink(err: &SinkError) -> bool {
    std::iter::successors(Some(err as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .any(|e| {
        e.downcast_ref::<etl_record::LockError>()
            .is_some_and(etl_record::LockError::is_in_use)
    })
}

#[tokio::test]
async fn a_second_name_for_the_output_is_refused_while_the_first_lives() {
    for exactly_once in [true, false] {
        for how in ["symlink", "hard link"] {
            let case = format!("{how}, exactly_once {exactly_once}");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out.ndjson");
            let other = dir.path().join("other.ndjson");
            let config = FileSinkConfig {
                exactly_once,
                ..FileSinkConfig::default()
            };
            let first = FileSink::open(&path, config).await.unwrap();
            first.write(&batch(0, 0..2)).await.unwrap();
            match how {
                "symlink" => std::os::unix::fs::symlink(&path, &other).unwrap(),
                _ => std::fs::hard_link(&path, &other).unwrap(),
            }
            let err = FileSink::open(&other, config).await.unwrap_err();
            let text = err.to_string();
            assert!(held_by_another_sink(&err), "{case}: {text}");
            assert!(
                text.contains(&other.display().to_string()),
                "{case}: {text}"
            );
            // The first one was not disturbed.
            first.write(&batch(0, 2..4)).await.unwrap();
            assert_eq!(positions(&first.files()).len(), 4, "{case}");
            drop(first);
            let second = FileSink::open(&other, config).await;
            if exactly_once && how == "hard link" {
                // Once the first is gone, a hard link is still a second
                // name: progress beside one cannot cover what a run under
                // the other writes.
                let err = second.unwrap_err();
                assert!(matches!(err, SinkError::OutputLost { .. }), "{case}: {err}");
                continue;
            }
            second.unwrap().write(&batch(0, 4..6)).await.unwrap();
        }
    }
}

#[tokio::test]
async fn an_output_truncated_in_place_fails_every_later_write_and_flush() {
    // What copy-truncate rotation does to a running sink's output.
    for exactly_once in [false, true] {
        for fsync in [
            FsyncPolicy::EveryBatch,
            FsyncPolicy::Interval(Duration::from_millis(5)),
        ] {
            let case = format!("exactly_once {exactly_once}, {fsync:?}");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out.ndjson");
            let config = FileSinkConfig {
                exactly_once,
                fsync,
                ..FileSinkConfig::default()
            };
            let sink = FileSink::open(&path, config).await.unwrap();
            sink.write(&batch(0, 0..3)).await.unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            assert!(
                sink.flush().await.is_err(),
                "{case}: flush after the truncation"
            );
            let err = sink.write(&batch(0, 3..6)).await.unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, SinkError::OutputLost { .. }),
                "{case}: {err:?}"
            );
            assert!(text.contains("truncated"), "{case}: {text}");
            assert!(!err.is_retryable() && err.is_io(), "{case}: {err:?}");
            assert!(sink.write(&batch(0, 3..6)).await.is_err(), "{case}");
            if exactly_once {
                assert_eq!(
                    sink.progress().get(PartitionId(0)),
                    Some(Offset(3)),
                    "{case}"
                );
            }
            drop(sink);
            // Truncated between a write and its fsync: caught at the fsync.
            std::fs::remove_file(&path).unwrap();
            let _ = std::fs::remove_file(path.with_extension("ndjson.progress"));
            let sink = FileSink::open(&path, config).await.unwrap();
            let held = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            sink.write(&batch(0, 0..3)).await.unwrap();
            held.set_len(1).unwrap();
            assert!(
                sink.write(&batch(0, 3..6)).await.is_err(),
                "{case}: truncated to 1"
            );
        }
    }
}

#[tokio::test]
async fn bytes_another_writer_appends_make_the_output_lost() {
    // The progress records the sink's own appends only: a foreign append
    // would put the next records past the recorded length, and the next
    // run would cut them off and keep the foreign bytes.
    for exactly_once in [true, false] {
        let case = format!("exactly_once {exactly_once}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.ndjson");
        let config = FileSinkConfig {
            exactly_once,
            ..FileSinkConfig::default()
        };
        let sink = FileSink::open(&path, config).await.unwrap();
        sink.write(&batch(0, 0..3)).await.unwrap();
        append_raw(&path, b"{\"foreign\":1}\n");
        let err = sink.write(&batch(0, 3..6)).await.unwrap_err();
        assert!(
            matches!(err, SinkError::OutputLost { .. }),
            "{case}: {err:?}"
        );
        assert!(err.to_string().contains("another writer"), "{case}: {err}");
        assert!(!err.is_retryable() && err.is_io(), "{case}: {err:?}");
        assert!(sink.flush().await.is_err(), "{case}");
        if exactly_once {
            assert_eq!(
                sink.progress().get(PartitionId(0)),
                Some(Offset(3)),
                "{case}"
            );
            drop(sink);
            // The next run cuts back to what was recorded: the records
            // of the progress are all there.
            let sink = FileSink::open(&path, config).await.unwrap();
            assert_eq!(
                positions(&sink.files()),
                vec![(0, 0), (0, 1), (0, 2)],
                "{case}"
            );
        }
    }
}

#[tokio::test]
async fn finished_segments_of_an_exactly_once_output_may_be_moved_away() {
    // Retention ships finished segments elsewhere; the next run must still
    // start, skip what it holds, and not reuse a shipped segment's name.
    let dir = tempfile::tempdir().unwrap();
    let shipped = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.ndjson");
    let config = FileSinkConfig {
        exactly_once: true,
        rotate_bytes: Some(40),
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    for start in (0..6).step_by(2) {
        sink.write(&batch(0, start..start + 2)).await.unwrap();
    }
    assert_eq!(sink.segments(), 2);
    drop(sink);
    for n in 1..=2 {
        let name = format!("o.ndjson.{n}");
        std::fs::rename(dir.path().join(&name), shipped.path().join(&name)).unwrap();
    }
    let sink = FileSink::open(&path, config).await.unwrap();
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(6)));
    assert_eq!(sink.files(), vec![path.clone()]);
    // Records 4 and 5 are held already: only 6 and 7 are written, after
    // a rotation.
    sink.write(&batch(0, 4..8)).await.unwrap();
    assert_eq!(
        sink.segments(),
        3,
        "numbering goes on past the shipped segments"
    );
    assert!(dir.path().join("o.ndjson.3").exists());
    assert_eq!(
        positions(&sink.files()),
        vec![(0, 4), (0, 5), (0, 6), (0, 7)]
    );
}

/// Each way the output's path can stop naming the file the sink writes.
fn output_deleted_or_replaced(path: &Path, how: &str) {
    match how {
        "deleted" => std::fs::remove_file(path).unwrap(),
        "replaced" => {
            let other = path.with_extension("other");
            std::fs::write(&other, b"").unwrap();
            std::fs::rename(&other, path).unwrap();
        }
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn a_deleted_or_replaced_output_fails_every_later_write_and_flush() {
    for how in ["deleted", "replaced"] {
        for exactly_once in [false, true] {
            for fsync in [
                FsyncPolicy::EveryBatch,
                FsyncPolicy::Interval(Duration::from_millis(5)),
            ] {
                let case = format!("{how}, exactly_once {exactly_once}, {fsync:?}");
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("out.ndjson");
                let config = FileSinkConfig {
                    exactly_once,
                    fsync,
                    ..FileSinkConfig::default()
                };
                let sink = FileSink::open(&path, config).await.unwrap();
                sink.write(&batch(0, 0..3)).await.unwrap();
                output_deleted_or_replaced(&path, how);
                let err = sink.write(&batch(0, 3..6)).await.unwrap_err();
                let text = err.to_string();
                assert!(text.contains(&path.display().to_string()), "{case}: {text}");
                assert!(text.contains(how), "{case}: {text}");
                // No retry can bring the file back: the driver must not
                // spend its retry budget on it, and the binary exits 74.
                assert!(!err.is_retryable(), "{case}: {err:?} is retried");
                assert!(err.is_io(), "{case}: {err:?}");
                // Nothing is ever reported durable again, retried or not.
                assert!(sink.write(&batch(0, 3..6)).await.is_err(), "{case}");
                assert!(sink.write(&batch(0, 6..9)).await.is_err(), "{case}");
                assert!(sink.flush().await.is_err(), "{case}");
                if exactly_once {
                    assert_eq!(
                        sink.progress().get(PartitionId(0)),
                        Some(Offset(3)),
                        "{case}: progress stays with the lost file's data"
                    );
                }
                if how == "replaced" {
                    assert_eq!(std::fs::read(&path).unwrap(), b"", "{case}");
                } else {
                    assert!(!path.exists(), "{case}: the sink does not recreate it");
                }
            }
        }
    }
}

/// A device is not state a run owns: two sinks writing `/dev/null` at once
/// are both allowed, and no `/dev/null.lock` appears beside it.
#[tokio::test]
async fn two_sinks_on_a_device_are_not_refused_and_leave_no_lock_beside_it() {
    let first = FileSink::open("/dev/null", FileSinkConfig::default())
        .await
        .unwrap();
    let second = FileSink::open("/dev/null", FileSinkConfig::default())
        .await
        .unwrap();
    assert!(!std::path::Path::new("/dev/null.lock").exists());
    drop((first, second));
}

#[cfg(unix)]
#[tokio::test]
async fn an_output_whose_name_is_not_utf8_never_rotates_over_a_finished_segment() {
    // A file name need not be UTF-8. The next run must still find the
    // finished segments, or its first rotation renames the active file
    // over `<path>.1` and the records acknowledged in it are gone.
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"out-\xff.ndjson"));
    let config = FileSinkConfig {
        rotate_bytes: Some(40),
        ..FileSinkConfig::default()
    };
    for run in 0..2 {
        let sink = FileSink::open(&path, config).await.unwrap();
        for i in 0..2 {
            let start = run * 4 + i * 2;
            sink.write(&batch(0, start..start + 2)).await.unwrap();
        }
    }
    let segment = |n: u32| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        std::path::PathBuf::from(name)
    };
    let files: Vec<_> = [segment(1), segment(2), segment(3), path.clone()]
        .into_iter()
        .filter(|f| f.exists())
        .collect();
    assert_eq!(
        positions(&files),
        (0..8).map(|o| (0, o)).collect::<Vec<_>>(),
        "every acknowledged record is in the output"
    );
    let sink = FileSink::open(&path, config).await.unwrap();
    assert_eq!(sink.segments(), 3, "the finished segments are found again");
}

#[tokio::test]
async fn rotation_never_renames_the_output_over_an_existing_file() {
    // A rename replaces its target: a file that took the next segment's
    // name after the sink opened would be gone, with whatever it held.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    let config = FileSinkConfig {
        rotate_bytes: Some(40),
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    sink.write(&batch(0, 0..2)).await.unwrap();
    let foreign = dir.path().join("out.ndjson.1");
    std::fs::write(&foreign, b"kept\n").unwrap();
    let err = sink.write(&batch(0, 2..4)).await.unwrap_err();
    assert!(matches!(err, SinkError::NotDurable { .. }), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&foreign).unwrap(), b"kept\n");
    assert_eq!(positions(&[path]), vec![(0, 0), (0, 1)]);
}

#[tokio::test]
async fn a_segment_number_at_the_limit_halts_the_sink_without_a_panic() {
    // Numbers come from the names in the folder and from the progress
    // file: the last one has no next, and must not wrap to `<path>.0`.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    std::fs::write(dir.path().join(format!("out.ndjson.{}", u64::MAX)), b"").unwrap();
    let config = FileSinkConfig {
        rotate_bytes: Some(40),
        ..FileSinkConfig::default()
    };
    let sink = FileSink::open(&path, config).await.unwrap();
    sink.write(&batch(0, 0..2)).await.unwrap();
    let err = sink.write(&batch(0, 2..4)).await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    assert!(!err.to_string().contains("panicked"), "{err}");
    assert!(!dir.path().join("out.ndjson.0").exists());
    assert_eq!(positions(std::slice::from_ref(&path)), vec![(0, 0), (0, 1)]);
    drop(sink);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ndjson");
    std::fs::write(&path, b"").unwrap();
    std::fs::write(
        dir.path().join("out.ndjson.progress"),
        format!(
            "{{\"version\":1,\"segments\":{},\"length\":0,\"offsets\":[]}}",
            u64::MAX
        ),
    )
    .unwrap();
    let config = FileSinkConfig {
        exactly_once: true,
        ..FileSinkConfig::default()
    };
    let err = FileSink::open(&path, config).await.unwrap_err();
    assert!(matches!(err, SinkError::CorruptProgress { .. }), "{err:?}");
}
