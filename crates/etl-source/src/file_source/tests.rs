//! Tests of the file source over a simulated disk (`etl_fs::SimFs`):
//! crashes, failed fsyncs of the record of inputs, and inputs rewritten
//! or rotated under a running or restarted source, each at an exact point
//! of the source's work.

use std::io::Write;

use etl_fs::{Mutation, OpenOptions, SimFaults, SimFs, SimOp};

use super::*;
use crate::{LineFormat, registered_inputs_in};

const EIO: i32 = 5;

fn config(path: &Path) -> FileSourceConfig {
    FileSourceConfig {
        paths: vec![path.display().to_string()],
        format: LineFormat::Lines,
        read_chunk_bytes: 4096,
        ..FileSourceConfig::default()
    }
}

fn values(batch: &crate::PollBatch) -> impl Iterator<Item = String> + '_ {
    batch
        .records
        .iter()
        .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
}

/// Values read until the source is idle or ends.
async fn drain(source: &mut FileSource) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        match source.next().await.unwrap() {
            SourceEvent::Batch(b) => got.extend(values(&b)),
            SourceEvent::Idle | SourceEvent::End => return got,
            SourceEvent::Assigned(_) | SourceEvent::Revoked(_) => {}
        }
    }
}

const INPUT: &str = "/in/a.log";
const STATE: &str = "/state";

/// `count` lines `"{tag} line {i}"` from `from`, each with its newline.
fn lines(tag: &str, from: usize, count: usize) -> Vec<u8> {
    (from..from + count)
        .flat_map(|i| format!("{tag} line {i:04}\n").into_bytes())
        .collect()
}

fn text_lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Replace the content of `path` on `fs` (the same inode when it exists)
/// with `bytes`, durably.
fn put_durably(fs: &SimFs, path: &Path, bytes: &[u8]) {
    let mut file = fs
        .open(
            path,
            &OpenOptions::new().write(true).create(true).truncate(true),
        )
        .unwrap();
    file.write_all(bytes).unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(path.parent().unwrap()).unwrap();
}

/// A simulated disk with the durable folders `/in` and `/state`, and the
/// durable input `/in/a.log` holding `bytes`.
fn disk(seed: u64, bytes: &[u8]) -> SimFs {
    let sim = SimFs::new(seed);
    sim.create_dir_all(Path::new("/in")).unwrap();
    sim.create_dir_all(Path::new(STATE)).unwrap();
    sim.sync_dir(Path::new("/")).unwrap();
    put_durably(&sim, Path::new(INPUT), bytes);
    sim
}

fn sim_config() -> FileSourceConfig {
    FileSourceConfig {
        state_dir: Some(STATE.into()),
        ..config(Path::new(INPUT))
    }
}

fn open_on(fs: &SimFs, config: FileSourceConfig) -> FileSource {
    FileSource::open_in(Arc::new(fs.clone()), config).unwrap()
}

/// Lines read, by partition, in the order read.
type ReadSoFar = BTreeMap<PartitionId, Vec<String>>;

/// Call `next` up to `steps` times, or until the source ends, seeking each
/// assigned partition to its start (as the driver does for a partition
/// with nothing committed). Whether it ended.
async fn poll(source: &mut FileSource, steps: usize, read: &mut ReadSoFar) -> bool {
    for _ in 0..steps {
        match source.next().await.unwrap() {
            SourceEvent::Batch(b) => read.entry(b.partition).or_default().extend(values(&b)),
            SourceEvent::Assigned(partitions) => {
                for p in partitions {
                    source.seek(p, Offset(0)).await.unwrap();
                }
            }
            SourceEvent::End => return true,
            SourceEvent::Idle | SourceEvent::Revoked(_) => {}
        }
    }
    false
}

#[tokio::test(start_paused = true)]
async fn lines_appended_to_a_followed_file_just_before_its_rotation_are_read() {
    let sim = disk(1, b"1\n2\n");
    let mut source = open_on(
        &sim,
        FileSourceConfig {
            follow: true,
            ..sim_config()
        },
    );
    let mut got = drain(&mut source).await;
    assert_eq!(got, ["1", "2"]);
    // The source found the end. The writer appends, the file is rotated;
    // then the source checks the path.
    sim.apply(&Mutation::Append {
        path: INPUT.into(),
        bytes: b"3\n4\n".to_vec(),
    })
    .unwrap();
    sim.apply(&Mutation::Rename {
        from: INPUT.into(),
        to: format!("{INPUT}.1").into(),
    })
    .unwrap();
    sim.apply(&Mutation::Replace {
        path: INPUT.into(),
        bytes: b"5\n".to_vec(),
    })
    .unwrap();
    let mut new = None;
    for _ in 0..20 {
        match source.next().await.unwrap() {
            SourceEvent::Batch(b) => got.extend(values(&b)),
            SourceEvent::Assigned(p) => {
                new = Some(p[0]);
                source.seek(p[0], Offset(0)).await.unwrap();
            }
            _ => {}
        }
    }
    assert!(new.is_some(), "the new file is a new partition");
    assert_eq!(got, ["1", "2", "3", "4", "5"]);
}

fn registry_bytes(fs: &SimFs) -> Option<Vec<u8>> {
    fs.read(&Path::new(STATE).join("file-inputs")).ok()
}

#[tokio::test]
async fn a_failed_fsync_of_the_record_of_inputs_or_of_its_folder_fails_the_source_for_good() {
    for op in [SimOp::Sync, SimOp::SyncDir] {
        let sim = disk(1, b"1\n2\n");
        let mut source = open_on(&sim, sim_config());
        sim.fail_next(op, EIO);
        let err = source.next().await.unwrap_err();
        assert!(
            matches!(
                err,
                SourceError::Checkpoint(etl_checkpoint::CheckpointError::Io { .. })
            ),
            "{op:?}: an I/O error of the state: {err}"
        );
        // Nothing is read after it, however often the source is asked:
        // the next fsync would succeed (Linux reports a failed one once),
        // and must not be trusted.
        for _ in 0..3 {
            let again = source.next().await.unwrap_err();
            assert!(again.to_string().contains("lost"), "{op:?}: {again}");
        }
        // No record of the inputs reaches the disk.
        sim.crash();
        assert_eq!(registry_bytes(&sim.process()), None, "{op:?}");
    }
}

#[tokio::test]
async fn a_crash_that_loses_the_page_cache_keeps_the_last_saved_record_of_inputs_and_the_source_resumes_from_it()
 {
    for seed in 0..48u64 {
        let sim = disk(seed, &lines("run 0", 0, 40));
        // Unsynced writes and names a crash keeps, whole or torn, by seed.
        sim.set_faults(SimFaults {
            torn: 300,
            kept: 300,
            dirs_kept: 300,
            ..SimFaults::default()
        });
        let fs = sim.process();
        let config = FileSourceConfig {
            max_batch_records: 4,
            ..sim_config()
        };
        // Runs one after another, the input rewritten in place (durably)
        // before each; the machine crashes in the middle of the last.
        let runs = seed % 3;
        let crash_after = usize::try_from(seed % 7).unwrap();
        let mut first_read: BTreeMap<PartitionId, String> = BTreeMap::new();
        for run in 0..=runs {
            if run > 0 {
                put_durably(&fs, Path::new(INPUT), &lines(&format!("run {run}"), 0, 40));
            }
            let mut source = open_on(&fs, config.clone());
            let steps = if run == runs { crash_after } else { usize::MAX };
            let mut read = ReadSoFar::new();
            poll(&mut source, steps, &mut read).await;
            for (p, got) in read {
                first_read.entry(p).or_insert_with(|| got[0].clone());
            }
        }
        // Every save returned before the crash: the disk holds the last.
        let saved = registry_bytes(&fs);
        sim.crash();
        let fs = sim.process();
        assert_eq!(registry_bytes(&fs), saved, "seed {seed}");
        // The restarted source reads each id's own file: an id that was
        // read from before starts with the same line again.
        let mut source = open_on(&fs, config);
        let mut read = ReadSoFar::new();
        assert!(poll(&mut source, 100, &mut read).await, "seed {seed}");
        assert_eq!(read.len(), 1, "seed {seed}");
        for (p, got) in &read {
            assert_eq!(got.len(), 40, "seed {seed}");
            if let Some(first) = first_read.get(p) {
                assert_eq!(&got[0], first, "seed {seed}: partition {p:?}");
            }
        }
    }
}

/// The input rewritten in place: other first bytes, or the same first
/// KiB and other bytes after it (found by the tail), and longer.
fn rewritten(original: &[u8], keep_first_kib: bool) -> Vec<u8> {
    let mut bytes = if keep_first_kib {
        // 100 lines of 14 bytes: more than the fingerprint's KiB.
        original[..1400].to_vec()
    } else {
        Vec::new()
    };
    bytes.extend(lines("new", 100, 300));
    bytes
}

#[tokio::test(start_paused = true)]
async fn an_input_rewritten_in_place_under_a_running_source_is_read_from_its_start_as_a_new_partition()
 {
    let original = lines("old", 0, 200);
    for keep_first_kib in [false, true] {
        let case = format!("keep_first_kib {keep_first_kib}");
        let sim = disk(5, &original);
        let mut source = open_on(
            &sim,
            FileSourceConfig {
                follow: true,
                ..sim_config()
            },
        );
        let mut read = ReadSoFar::new();
        poll(&mut source, 20, &mut read).await;
        let old = *read.keys().next().unwrap();
        assert_eq!(read[&old], text_lines(&original), "{case}");
        let bytes = rewritten(&original, keep_first_kib);
        sim.apply(&Mutation::RewriteInPlace {
            path: INPUT.into(),
            bytes: bytes.clone(),
        })
        .unwrap();
        poll(&mut source, 20, &mut read).await;
        assert_eq!(read.len(), 2, "{case}: a new partition");
        let (new, got) = read.iter().find(|(p, _)| **p != old).unwrap();
        assert_eq!(*got, text_lines(&bytes), "{case}: read from its start");
        assert_eq!(
            registered_inputs_in(&sim, Path::new(STATE)).unwrap()[new],
            Path::new(INPUT),
            "{case}"
        );
    }
}

#[tokio::test]
async fn an_input_rewritten_in_place_under_a_restarted_source_is_read_from_its_start_as_a_new_partition()
 {
    let original = lines("old", 0, 200);
    for keep_first_kib in [false, true] {
        let case = format!("keep_first_kib {keep_first_kib}");
        let sim = disk(6, &original);
        let mut read = ReadSoFar::new();
        assert!(poll(&mut open_on(&sim, sim_config()), 100, &mut read).await);
        let old = *read.keys().next().unwrap();
        let bytes = rewritten(&original, keep_first_kib);
        sim.apply(&Mutation::RewriteInPlace {
            path: INPUT.into(),
            bytes: bytes.clone(),
        })
        .unwrap();
        let mut source = open_on(&sim, sim_config());
        let new = source.partitions()[0].0;
        assert_ne!(new, old, "{case}: never resumed at the old offsets");
        let mut again = ReadSoFar::new();
        assert!(poll(&mut source, 100, &mut again).await);
        assert_eq!(again[&new], text_lines(&bytes), "{case}");
    }
}

/// A small deterministic generator for the rotation schedule.
struct Steps(u64);

impl Steps {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(start_paused = true)]
async fn an_input_rotated_by_rename_in_follow_mode_keeps_every_line() {
    for seed in 0..16u64 {
        let sim = disk(seed, b"");
        let mut source = open_on(
            &sim,
            FileSourceConfig {
                follow: true,
                max_batch_records: 3,
                ..sim_config()
            },
        );
        let mut steps = Steps(seed);
        let mut read = ReadSoFar::new();
        let mut written: Vec<String> = Vec::new();
        let mut next_line = 0;
        let append = |n: u64, next_line: &mut usize, written: &mut Vec<String>| {
            let bytes = lines("rotated", *next_line, usize::try_from(n).unwrap());
            written.extend(text_lines(&bytes));
            *next_line += usize::try_from(n).unwrap();
            bytes
        };
        poll(&mut source, 2, &mut read).await;
        for generation in 0..6 {
            for _ in 0..steps.below(4) {
                let bytes = append(steps.below(8), &mut next_line, &mut written);
                sim.apply(&Mutation::Append {
                    path: INPUT.into(),
                    bytes,
                })
                .unwrap();
                let n = usize::try_from(steps.below(3)).unwrap();
                poll(&mut source, n, &mut read).await;
            }
            // Lines appended just before the rotation, unread: they are
            // read through the renamed file's descriptor.
            let bytes = append(steps.below(5), &mut next_line, &mut written);
            sim.apply(&Mutation::Append {
                path: INPUT.into(),
                bytes,
            })
            .unwrap();
            let before = source.partitions()[0].0;
            sim.apply(&Mutation::Rename {
                from: INPUT.into(),
                to: format!("{INPUT}.{generation}").into(),
            })
            .unwrap();
            let bytes = append(steps.below(3), &mut next_line, &mut written);
            sim.apply(&Mutation::Replace {
                path: INPUT.into(),
                bytes,
            })
            .unwrap();
            // The next rotation comes once the source has found the new
            // file: one created and renamed away again between two looks
            // at the path is never seen (as with `tail -F`).
            let following = |s: &FileSource| s.partitions()[0].0 != before;
            for _ in 0..200 {
                if following(&source) {
                    break;
                }
                poll(&mut source, 1, &mut read).await;
            }
            assert!(following(&source), "seed {seed}");
        }
        poll(&mut source, 200, &mut read).await;
        let mut got: Vec<String> = read.values().flatten().cloned().collect();
        got.sort();
        assert_eq!(got, written, "seed {seed}: every line, once");
        for lines in read.values() {
            assert!(lines.is_sorted(), "seed {seed}: in order");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_file_rotated_again_before_its_new_partition_is_sought_keeps_its_lines() {
    let sim = disk(2, b"1\n");
    let mut source = open_on(
        &sim,
        FileSourceConfig {
            follow: true,
            ..sim_config()
        },
    );
    let mut read = ReadSoFar::new();
    poll(&mut source, 3, &mut read).await;
    let rotate = |generation: u32, bytes: &[u8]| {
        sim.apply(&Mutation::Rename {
            from: INPUT.into(),
            to: format!("{INPUT}.{generation}").into(),
        })
        .unwrap();
        sim.apply(&Mutation::Replace {
            path: INPUT.into(),
            bytes: bytes.to_vec(),
        })
        .unwrap();
    };
    rotate(1, b"2\n");
    // The source finds the rotation and announces the new file's
    // partition; before the driver seeks it, the file is rotated again.
    loop {
        if let SourceEvent::Assigned(partitions) = source.next().await.unwrap() {
            rotate(2, b"3\n");
            for p in partitions {
                source.seek(p, Offset(0)).await.unwrap();
            }
            break;
        }
    }
    poll(&mut source, 20, &mut read).await;
    let got: Vec<&str> = read.values().flatten().map(String::as_str).collect();
    assert_eq!(got.len(), 3, "{read:?}");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["1", "2", "3"]);
}
