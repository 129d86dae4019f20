//! The file state's tests: failed appends, fsyncs and progress stores,
//! created outputs, and crashes, over the simulated disk.

use super::*;
use crate::FsyncPolicy;
use etl_fs::{SimFs, SimOp};
use std::time::Duration;

pub(crate) const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn config(exactly_once: bool) -> FileSinkConfig {
    FileSinkConfig {
        // Writes wait for an explicit `sync`.
        fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
        exactly_once,
        ..FileSinkConfig::default()
    }
}

/// A simulated disk with the folder `/out`, durable.
pub(crate) fn disk(seed: u64) -> SimFs {
    let sim = SimFs::new(seed);
    sim.create_dir_all(Path::new("/out")).unwrap();
    sim.sync_dir(Path::new("/")).unwrap();
    sim
}

pub(crate) const PATH: &str = "/out/out.ndjson";

/// A state on `fs` whose writes wait for an explicit `sync`.
fn open(fs: &SimFs, exactly_once: bool) -> FileState {
    FileState::open(Arc::new(fs.clone()), Path::new(PATH), config(exactly_once)).unwrap()
}

/// Append the line of record `offset` of partition 0.
fn append(state: &mut FileState, offset: i64) -> Result<u64, SinkError> {
    let line = Bytes::from(format!("{{\"o\":{offset}}}\n"));
    let placed = [(PartitionId(0), Offset(offset), 0..line.len())];
    let exactly_once = state.config.exactly_once;
    state.append(&line, exactly_once.then_some(&placed[..]))
}

fn assert_lost(err: &SinkError, what: &str) {
    assert!(
        matches!(err, SinkError::NotDurable { .. }),
        "{what}: {err:?}"
    );
    assert!(!err.is_retryable(), "{what}: {err:?} is retried");
    assert!(err.is_io(), "{what}: {err:?}");
}

#[test]
fn a_failed_append_with_bytes_not_yet_durable_makes_the_file_lost() {
    // A write error can be the report of a failed writeback of the
    // bytes before it: the next fsync would not report it again.
    let sim = disk(1);
    let mut state = open(&sim, false);
    append(&mut state, 0).unwrap();
    sim.fail_next(SimOp::Write, EIO);
    let err = append(&mut state, 1).unwrap_err();
    let retried = append(&mut state, 1).and_then(|_| state.sync());
    assert!(retried.is_err(), "the retried append was reported durable");
    assert_lost(&err, "the failed append");
    assert_lost(&append(&mut state, 1).unwrap_err(), "the retried append");
    assert_lost(&state.sync().unwrap_err(), "the fsync after it");
    assert_eq!(state.synced, 0, "nothing is reported durable");
}

#[test]
fn a_failed_append_to_a_file_truncated_under_the_sink_is_lost_output_not_zeros() {
    // Cutting the failed append back to the length the sink wrote
    // would lengthen a file another program truncated with zeros, and
    // the truncation would go unnoticed.
    // The failed write lands a prefix of its bytes (by seed) at the
    // truncated end: as long as the bytes cut, it leaves the file at the
    // length the sink expects, so only a check before the write tells.
    for seed in 0..32 {
        for exactly_once in [false, true] {
            let sim = disk(seed);
            let mut state = open(&sim, exactly_once);
            append(&mut state, 0).unwrap();
            state.sync().unwrap();
            sim.apply(&etl_fs::Mutation::Truncate {
                path: PATH.into(),
                len: 0,
            })
            .unwrap();
            sim.fail_next(SimOp::Write, ENOSPC);
            let err = append(&mut state, 1).unwrap_err();
            assert!(
                matches!(err, SinkError::OutputLost { .. }),
                "seed {seed}, exactly_once {exactly_once}: {err:?}"
            );
            assert!(append(&mut state, 1).is_err(), "the sink wrote on");
            let bytes = sim.read(Path::new(PATH)).unwrap();
            assert!(
                !bytes.contains(&0),
                "exactly_once {exactly_once}: the file was lengthened with zeros: {bytes:?}"
            );
        }
    }
}

#[test]
fn a_failed_append_after_a_good_fsync_is_cut_back_and_may_be_retried() {
    // With every byte before it durable, a failed append (a full
    // disk) is cut back off and retried: the disk may get room.
    for seed in 0..8 {
        let sim = disk(seed);
        let mut state = open(&sim, false);
        append(&mut state, 0).unwrap();
        state.sync().unwrap();
        sim.fail_next(SimOp::Write, ENOSPC);
        let err = append(&mut state, 1).unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"{\"o\":0}\n");
        append(&mut state, 1).unwrap();
        state.sync().unwrap();
        sim.crash();
        assert_eq!(
            sim.process().read(Path::new(PATH)).unwrap(),
            b"{\"o\":0}\n{\"o\":1}\n",
            "seed {seed}"
        );
    }
}

#[test]
fn a_created_output_is_durable_in_its_directory_before_its_data_is() {
    // An fsync of a new file does not make its name durable: after a
    // power loss the file, and every record acknowledged in it, may
    // be gone. Through a symlink the file is created in the target's
    // directory, not the link's.
    for exactly_once in [false, true] {
        for via_link in [false, true] {
            let sim = disk(3);
            let path = if via_link {
                sim.create_dir_all(Path::new("/links")).unwrap();
                sim.symlink(Path::new(PATH), Path::new("/links/out.ndjson"))
                    .unwrap();
                sim.sync_dir(Path::new("/links")).unwrap();
                sim.sync_dir(Path::new("/")).unwrap();
                PathBuf::from("/links/out.ndjson")
            } else {
                PathBuf::from(PATH)
            };
            let mut state =
                FileState::open(Arc::new(sim.clone()), &path, config(exactly_once)).unwrap();
            append(&mut state, 0).unwrap();
            state.sync().unwrap();
            sim.crash();
            assert_eq!(
                sim.process().read(Path::new(PATH)).ok().as_deref(),
                Some(&b"{\"o\":0}\n"[..]),
                "exactly_once {exactly_once}, through a link {via_link}: a record \
                 reported durable was gone after a crash"
            );
        }
    }
}

#[test]
fn an_output_folder_created_without_syncing_survives_a_crash_with_its_records() {
    // The runtime creates a missing output folder (and those above it)
    // without making their names durable; a dead-letter folder too. A
    // crash would take every record acknowledged in it.
    for exactly_once in [false, true] {
        let sim = SimFs::new(6);
        let path = Path::new("/data/new/out.ndjson");
        sim.create_dir_all(parent_dir(path)).unwrap();
        let mut state = FileState::open(Arc::new(sim.clone()), path, config(exactly_once)).unwrap();
        append(&mut state, 0).unwrap();
        state.sync().unwrap();
        sim.crash();
        assert_eq!(
            sim.process().read(path).ok().as_deref(),
            Some(&b"{\"o\":0}\n"[..]),
            "exactly_once {exactly_once}: a record reported durable was gone with its folder"
        );
    }
}

#[test]
fn a_progress_store_failing_after_its_rename_leaves_the_data_it_records() {
    // The directory's fsync fails after the new progress took the old
    // one's place: the next run finds it, and the data it records
    // (fsynced before it) must still be there.
    let sim = disk(4);
    let mut state = open(&sim, true);
    append(&mut state, 0).unwrap();
    state.sync().unwrap();
    append(&mut state, 1).unwrap();
    sim.fail_next(SimOp::SyncDir, EIO);
    assert_lost(&state.sync().unwrap_err(), "the failed store");
    drop(state);
    let state = open(&sim, true);
    assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(2)));
    assert_eq!(
        sim.read(Path::new(PATH)).unwrap(),
        b"{\"o\":0}\n{\"o\":1}\n"
    );
}

#[test]
fn a_failed_progress_store_makes_the_file_lost() {
    let sim = disk(5);
    let mut state = open(&sim, true);
    append(&mut state, 0).unwrap();
    state.sync().unwrap();
    append(&mut state, 1).unwrap();
    // The data's fsync succeeds; the progress file's write fails.
    sim.fail_next(SimOp::Write, EIO);
    let err = state.sync().unwrap_err();
    assert!(
        state.sync().is_err(),
        "the retried store was reported durable"
    );
    assert_lost(&err, "the failed store");
    assert_lost(&state.sync().unwrap_err(), "the retried store");
    assert_lost(&append(&mut state, 2).unwrap_err(), "a later append");
    assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(1)));
    drop(state);
    // The next run cuts back to what the last good store recorded.
    let state = open(&sim, true);
    assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(1)));
    assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"{\"o\":0}\n");
}

#[test]
fn a_crash_keeps_every_record_reported_durable_and_no_partial_line() {
    // Whatever a crash keeps of the unsynced bytes (nothing, some
    // whole writes, a torn one), the next run finds every record a
    // sync reported, then whole lines only; exactly-once finds each
    // record once, in order.
    for seed in 0..64 {
        for exactly_once in [false, true] {
            let case = format!("seed {seed}, exactly_once {exactly_once}");
            let sim = disk(seed);
            sim.set_faults(etl_fs::SimFaults {
                torn: 400,
                kept: 400,
                dirs_kept: 500,
                ..etl_fs::SimFaults::default()
            });
            let mut state = open(&sim, exactly_once);
            let synced_through = 3 + seed % 5;
            for o in 0..synced_through {
                append(&mut state, i64::try_from(o).unwrap()).unwrap();
                if o % 2 == 0 {
                    state.sync().unwrap();
                }
            }
            state.sync().unwrap();
            for o in synced_through..synced_through + 3 {
                append(&mut state, i64::try_from(o).unwrap()).unwrap();
            }
            sim.crash();
            let fs = sim.process();
            let state =
                FileState::open(Arc::new(fs.clone()), Path::new(PATH), config(exactly_once))
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
            let bytes = fs.read(Path::new(PATH)).unwrap();
            assert!(
                bytes.is_empty() || bytes.ends_with(b"\n"),
                "{case}: a partial line is left: {bytes:?}"
            );
            // At least once may keep unsynced lines a crash kept
            // whole (never acknowledged, they are written again), but
            // no torn one: not a record glued to lost bytes (zeros),
            // nor a line of them. Exactly once keeps only what its
            // progress records.
            let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
            let offsets: Vec<u64> = lines
                .iter()
                .map_while(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
                .map(|v| v["o"].as_u64().unwrap())
                .collect();
            assert!(
                offsets.len() >= usize::try_from(synced_through).unwrap(),
                "{case}: {offsets:?}"
            );
            assert!(
                offsets.iter().copied().eq(0..offsets.len() as u64),
                "{case}: {offsets:?}"
            );
            assert_eq!(
                offsets.len(),
                lines.len(),
                "{case}: a torn line is kept: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            if exactly_once {
                let next = state.stored.get(PartitionId(0)).unwrap_or(Offset(0));
                assert_eq!(
                    offsets,
                    (0..u64::try_from(next.0).unwrap()).collect::<Vec<_>>(),
                    "{case}: the output holds what its progress records, once"
                );
            }
        }
    }
}
