//! Crashes that lose the page cache under an at-least-once file sink:
//! whatever a crash leaves of the bytes no `fsync` covered (nothing, whole
//! writes, torn ones, lost pages read back as zeros between kept ones),
//! the next run keeps every acknowledged record intact and writes the
//! replayed ones after whole lines only.

use std::collections::BTreeMap;
use std::io::Write;

use etl_fs::{Mutation, SimFaults, SimFs, SimOp};
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record, SourceId};

use super::*;
use crate::file_state::tests::{PATH, disk};

/// What the output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    /// NDJSON records: a NUL byte is never part of a line.
    Ndjson,
    /// Dead letters, as a dead-letter file sink writes them.
    DeadLetters,
    /// Raw lines whose values hold NUL bytes: a NUL byte alone says
    /// nothing about damage.
    RawWithNul,
}

fn record(o: i64) -> Record {
    let position = Position::new(SourceId::new("s"), PartitionId(0), Offset(o));
    Record::new(
        position,
        format!("{{\"o\":{o},\"pad\":\"{}\"}}", "x".repeat(40)),
    )
}

fn batch_of(content: Content, offsets: std::ops::Range<i64>) -> EncodedBatch {
    match content {
        Content::Ndjson => {
            let records = offsets.map(record).collect();
            EncodedBatch::encode(records, &crate::NdjsonEncoder::new()).0
        }
        Content::DeadLetters => crate::dead_letter::dead_letter_batch(
            offsets
                .map(|o| DeadLetter::new(record(o), format!("poison record {o}")))
                .collect(),
        ),
        Content::RawWithNul => {
            let records = offsets
                .map(|o| {
                    let mut r = record(o);
                    r.value = format!("o={o}\0bin\0{}", "\0".repeat(12)).into();
                    r
                })
                .collect();
            EncodedBatch::encode(records, &crate::RawLinesEncoder::new()).0
        }
    }
}

/// Every line the test can write, to its offset.
fn lines_of(content: Content, total: i64) -> BTreeMap<Vec<u8>, i64> {
    (0..total)
        .map(|o| (batch_of(content, o..o + 1).bytes().to_vec(), o))
        .collect()
}

/// One run of the scenario, as a case name.
#[derive(Clone, Copy, Debug)]
struct Case {
    seed: u64,
    content: Content,
    fsync: FsyncPolicy,
    rotate_bytes: Option<u64>,
    /// Finished segments are moved to `/shipped` before the crash.
    ship: bool,
    /// A call that fails, and when.
    fault: Option<(Phase, SimOp)>,
    /// The process is killed first (the page cache stays) and a next run
    /// opens the output, before the power fails.
    killed_first: bool,
}

/// When a [`Case`]'s fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// While the writes in flight append (their fsync, a rotation, the
    /// recovery point's store): the sink is lost, then the power fails.
    InFlight,
    /// While the next run recovers the output after the crash: it stops
    /// there, the power fails again, and the run after recovers.
    Recovery,
}

const EIO: i32 = 5;

/// Arm the case's fault for `phase`; returns the count of failed calls
/// before, for [`disarm`].
fn fault(case: Case, phase: Phase, sim: &SimFs) -> u64 {
    let before = sim.stats().failed;
    if let Some((at, op)) = case.fault
        && at == phase
    {
        sim.fail_next(op, EIO);
    }
    before
}

/// Spend the case's fault for `phase` if the sink made no such call: it
/// must not strike a later phase.
fn disarm(case: Case, phase: Phase, sim: &SimFs, before: u64) {
    let Some((at, op)) = case.fault else { return };
    if at != phase || sim.stats().failed > before {
        return;
    }
    let scratch = Path::new("/scratch");
    let options = etl_fs::OpenOptions::new().write(true).create(true);
    let mut file = sim.open(scratch, &options).unwrap();
    let spent = match op {
        SimOp::Write => file.write_all(b"x").is_err(),
        SimOp::Sync => file.sync_data().is_err(),
        SimOp::Rename => sim.rename(scratch, Path::new("/scratch2")).is_err(),
        SimOp::SyncDir => sim.sync_dir(Path::new("/")).is_err(),
    };
    assert!(spent, "{case:?}: the fault was not spent");
}

/// The files of the output in order: finished segments (shipped ones
/// included), then the active file.
fn all_files(fs: &SimFs) -> Vec<PathBuf> {
    let mut segments: Vec<(u64, PathBuf)> = Vec::new();
    for dir in ["/out", "/shipped"] {
        for name in fs.read_dir(Path::new(dir)).unwrap_or_default() {
            let name = name.to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("out.ndjson.")
                .and_then(|n| n.parse::<u64>().ok())
            {
                segments.push((n, Path::new(dir).join(name)));
            }
        }
    }
    segments.sort();
    let mut files: Vec<PathBuf> = segments.into_iter().map(|(_, p)| p).collect();
    files.push(PathBuf::from(PATH));
    files
}

async fn run(case: Case) {
    const TOTAL: i64 = 40;
    let sim = disk(case.seed);
    sim.create_dir_all(Path::new("/shipped")).unwrap();
    sim.sync_dir(Path::new("/")).unwrap();
    sim.set_faults(SimFaults {
        torn: 400,
        kept: 400,
        dirs_kept: 500,
        ..SimFaults::default()
    });
    let config = FileSinkConfig {
        fsync: case.fsync,
        rotate_bytes: case.rotate_bytes,
        ..FileSinkConfig::default()
    };
    let content = case.content;
    let sink = FileSink::open_in(Arc::new(sim.clone()), PATH, config)
        .await
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    // Acknowledged: each write returned, so an fsync covered it.
    let seed = i64::try_from(case.seed).unwrap();
    let acked = 4 + seed % 9;
    let mut o = 0;
    while o < acked {
        let end = (o + 1 + (seed + o) % 3).min(acked);
        sink.write(&batch_of(content, o..end)).await.unwrap();
        o = end;
    }
    // In flight when the power fails: appended, waiting for the fsync of
    // their group (a group commit, or the next batch's turn).
    let in_flight = acked + 3 + seed % 5;
    let before = fault(case, Phase::InFlight, &sim);
    while o < in_flight {
        let end = (o + 1 + seed % 2).min(in_flight);
        let bytes = batch_of(content, o..end).bytes().clone();
        let mut state = lock(&sink.state);
        // A failed append, or a failed step of a rotation before it,
        // loses the sink: nothing more is written.
        if state.append(&bytes, None).is_err() {
            break;
        }
        if (o + seed) % 4 == 0 {
            // A group's fsync, never acknowledged: the power fails before.
            if state.sync().is_err() {
                break;
            }
        }
        o = end;
    }
    disarm(case, Phase::InFlight, &sim, before);
    if case.ship {
        // Retention moves finished segments away (and makes it durable).
        for file in all_files(&sim) {
            if file.starts_with("/out") && file != Path::new(PATH) {
                let to = Path::new("/shipped").join(file.file_name().unwrap());
                sim.apply(&Mutation::Rename { from: file, to }).unwrap();
            }
        }
        sim.sync_dir(Path::new("/out")).unwrap();
        sim.sync_dir(Path::new("/shipped")).unwrap();
    }
    let sink = if case.killed_first {
        drop(sink);
        FileSink::open_in(Arc::new(sim.clone()), PATH, config)
            .await
            .unwrap_or_else(|e| panic!("{case:?}: after a kill: {e}"))
    } else {
        sink
    };
    sim.crash();
    drop(sink);
    let mut fs = sim.process();
    if case.fault.is_some_and(|(at, _)| at == Phase::Recovery) {
        let before = fault(case, Phase::Recovery, &fs);
        // Whether it opens or not, the power fails again at once.
        drop(FileSink::open_in(Arc::new(fs.clone()), PATH, config).await);
        disarm(case, Phase::Recovery, &fs, before);
        fs.crash();
        fs = fs.process();
    }
    let sink = FileSink::open_in(Arc::new(fs.clone()), PATH, config)
        .await
        .unwrap_or_else(|e| panic!("{case:?}: reopening: {e}"));
    // The source replays from the first record not acknowledged.
    let mut o = acked;
    while o < TOTAL {
        let end = (o + 4).min(TOTAL);
        sink.write(&batch_of(content, o..end))
            .await
            .unwrap_or_else(|e| panic!("{case:?}: replaying: {e}"));
        o = end;
    }
    let known = lines_of(content, TOTAL);
    let mut offsets = Vec::new();
    for file in all_files(&fs) {
        let bytes = fs.read(&file).unwrap();
        assert!(
            bytes.is_empty() || bytes.ends_with(b"\n"),
            "{case:?}: {} ends in a partial line",
            file.display()
        );
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            let Some(&o) = known.get(line) else {
                panic!(
                    "{case:?}: {} holds a line that is no record (torn, zeros, or a record \
                     glued to them): {:?}",
                    file.display(),
                    String::from_utf8_lossy(line)
                );
            };
            offsets.push(o);
        }
    }
    // Every acknowledged record, intact and in order, before anything else.
    assert_eq!(
        offsets.get(..usize::try_from(acked).unwrap()),
        Some(&(0..acked).collect::<Vec<_>>()[..]),
        "{case:?}: {offsets:?}"
    );
    // Then unacknowledged records a crash kept, and the replay: every
    // record is there.
    let mut seen = offsets.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..TOTAL).collect::<Vec<_>>(), "{case:?}");
    assert_eq!(
        offsets[offsets.len() - usize::try_from(TOTAL - acked).unwrap()..],
        (acked..TOTAL).collect::<Vec<_>>()[..],
        "{case:?}: the replay is written last, whole"
    );
}

const SEEDS: u64 = 48;

#[tokio::test]
async fn a_crash_leaves_an_at_least_once_output_every_acknowledged_record_and_whole_lines() {
    for seed in 0..SEEDS {
        for content in [Content::Ndjson, Content::DeadLetters, Content::RawWithNul] {
            for fsync in [
                FsyncPolicy::EveryBatch,
                FsyncPolicy::Interval(Duration::from_secs(3600)),
            ] {
                run(Case {
                    seed,
                    content,
                    fsync,
                    rotate_bytes: None,
                    ship: false,
                    fault: None,
                    killed_first: seed % 2 == 1,
                })
                .await;
            }
        }
    }
}

#[tokio::test]
async fn a_crash_leaves_every_segment_of_a_rotating_output_whole() {
    for seed in 0..SEEDS {
        for content in [Content::Ndjson, Content::RawWithNul] {
            for ship in [false, true] {
                run(Case {
                    seed,
                    content,
                    fsync: FsyncPolicy::EveryBatch,
                    rotate_bytes: Some(400 + 50 * (seed % 4)),
                    ship,
                    fault: None,
                    killed_first: seed % 3 == 1,
                })
                .await;
            }
        }
    }
}

#[tokio::test]
async fn a_crash_after_a_failure_or_during_recovery_leaves_whole_lines() {
    // A failed fsync, rename, folder fsync or write while writes are in
    // flight (an fsync of theirs, a rotation, a store of the recovery
    // point), then a crash; or a crash in the middle of the recovery of
    // the next run: the run after finds the same guarantees.
    let ops = [SimOp::Write, SimOp::Sync, SimOp::Rename, SimOp::SyncDir];
    for seed in 0..SEEDS {
        for phase in [Phase::InFlight, Phase::Recovery] {
            for content in [Content::Ndjson, Content::RawWithNul] {
                let op = ops[usize::try_from(seed).unwrap() % ops.len()];
                run(Case {
                    seed,
                    content,
                    fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
                    rotate_bytes: Some(300 + 40 * (seed % 5)),
                    ship: seed % 3 == 0,
                    fault: Some((phase, op)),
                    killed_first: false,
                })
                .await;
            }
        }
    }
}

#[tokio::test]
async fn a_flushed_output_opens_again_without_a_check_or_a_store() {
    // A stop flushes: the next open finds the output at its recovery point
    // and neither reads its tail back nor fsyncs anything.
    let sim = disk(7);
    let sink = FileSink::open_in(Arc::new(sim.clone()), PATH, FileSinkConfig::default())
        .await
        .unwrap();
    for start in (0..40).step_by(4) {
        sink.write(&batch_of(Content::Ndjson, start..start + 4))
            .await
            .unwrap();
    }
    sink.flush().await.unwrap();
    drop(sink);
    let syncs = sim.stats().syncs;
    let sink = FileSink::open_in(Arc::new(sim.clone()), PATH, FileSinkConfig::default())
        .await
        .unwrap();
    assert_eq!(
        sim.stats().syncs,
        syncs,
        "the open fsynced or stored a point"
    );
    sink.write(&batch_of(Content::Ndjson, 40..44))
        .await
        .unwrap();
    drop(sink);
    // Unflushed, the next open checks the tail and stores a point.
    let syncs = sim.stats().syncs;
    drop(
        FileSink::open_in(Arc::new(sim.clone()), PATH, FileSinkConfig::default())
            .await
            .unwrap(),
    );
    assert!(sim.stats().syncs > syncs);
}
