//! `FileStore` under random commits and simulated crashes: after the newest
//! file is torn, corrupted, deleted or a temporary file is left behind,
//! loading returns the last commit or the one before it, never anything
//! else, and never an error while one valid generation exists.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use etl_checkpoint::{FileStore, OffsetStore, PartitionOffsets};
use etl_record::{Offset, PartitionId};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Clone, Debug)]
enum Crash {
    /// No crash.
    None,
    /// The newest file cut at this fraction of its length.
    Truncate(f64),
    /// One byte of the newest file changed.
    Flip(f64, u8),
    /// The newest file gone (e.g. lost with a folder entry never synced).
    Delete,
    /// A temporary file left over by a crash before its rename.
    StrayTemp(Vec<u8>),
}

fn crash() -> impl Strategy<Value = Crash> {
    prop_oneof![
        2 => Just(Crash::None),
        1 => (0.0..1.0f64).prop_map(Crash::Truncate),
        1 => (0.0..1.0f64, 1..=255u8).prop_map(|(at, x)| Crash::Flip(at, x)),
        1 => Just(Crash::Delete),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Crash::StrayTemp),
    ]
}

fn commit() -> impl Strategy<Value = PartitionOffsets> {
    prop::collection::btree_map(
        (0..4u32).prop_map(PartitionId),
        (0..1_000_000i64).prop_map(Offset),
        1..4,
    )
}

/// The slot file holding the newest generation.
fn newest(dir: &Path, generation: u64) -> std::path::PathBuf {
    dir.join(format!("offsets.{}", generation % 2))
}

fn damage(dir: &Path, generation: u64, crash: &Crash) -> bool {
    let path = newest(dir, generation);
    let Ok(mut bytes) = fs::read(&path) else {
        return false;
    };
    match crash {
        Crash::None => return false,
        Crash::Delete => {
            fs::remove_file(&path).unwrap();
            return true;
        }
        Crash::Truncate(at) => bytes.truncate((bytes.len() as f64 * at) as usize),
        Crash::Flip(at, x) => {
            let i = ((bytes.len() as f64 * at) as usize).min(bytes.len() - 1);
            bytes[i] ^= x;
        }
        Crash::StrayTemp(junk) => {
            fs::write(dir.join("offsets.tmp"), junk).unwrap();
            return false;
        }
    }
    fs::write(&path, bytes).unwrap();
    true
}

/// A scratch folder, in memory where the platform has one: the property is
/// about the format and the fallback, and fsync on a disk would make each
/// case cost milliseconds.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

proptest! {
    // Every case makes real fsyncs: cap the count so `cargo xtask prop`
    // stays quick on a slow disk.
    #![proptest_config(ProptestConfig {
        cases: ProptestConfig::default().cases.min(2_000),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/prop_file_store.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn prop_file_store_loads_the_last_or_previous_commit(
        steps in prop::collection::vec((commit(), crash()), 1..8)
    ) {
        let dir = scratch();
        let mut store = FileStore::open(dir.path()).unwrap();
        let mut current = PartitionOffsets::new();
        for (offsets, crash) in steps {
            store.commit(&offsets).unwrap();
            let mut merged = current.clone();
            merged.extend(offsets);
            // What the last two successful commits left.
            let previous = std::mem::replace(&mut current, merged);
            let generation = store.generation();
            let damaged = damage(dir.path(), generation, &crash);
            // The crash ends the process, and its lock with it.
            drop(store);
            let mut reopened = match FileStore::open(dir.path()) {
                Ok(reopened) => reopened,
                Err(err) => {
                    // Only when the one generation written so far was
                    // damaged in place: a clear error, never an empty store.
                    prop_assert!(damaged && generation == 1, "{}", err);
                    prop_assert!(!matches!(crash, Crash::Delete));
                    let text = err.to_string();
                    prop_assert!(text.contains("no valid generation"), "{}", text);
                    return Ok(());
                }
            };
            let loaded = reopened.load().unwrap();
            if damaged {
                // A cut that only drops the final newline leaves a valid
                // file; otherwise the previous generation stands.
                prop_assert!(loaded == previous || loaded == current, "loaded {:?}", loaded);
                // Continue from what the store says, as a restart would.
                current = loaded;
            } else {
                prop_assert_eq!(&loaded, &current);
            }
            store = reopened;
        }
    }
}

#[test]
fn a_stray_temp_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = FileStore::open(dir.path()).unwrap();
    let offsets: PartitionOffsets = [(PartitionId(0), Offset(5))].into();
    store.commit(&offsets).unwrap();
    drop(store);
    fs::write(dir.path().join("offsets.tmp"), b"etl-offsets 1\ngener").unwrap();
    assert_eq!(
        FileStore::open(dir.path()).unwrap().load().unwrap(),
        offsets
    );
}
