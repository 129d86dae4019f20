//! Tests of the record of inputs over a simulated disk: reloads, old
//! formats, failed fsyncs and crashes.

use etl_fs::{SimFs, SimOp};

use super::*;

const EIO: i32 = 5;

fn identity(ino: u64) -> FileIdentity {
    FileIdentity {
        dev: 1,
        ino,
        fp_len: 10,
        fp_crc: 0xdead_beef,
    }
}

fn tail() -> Tail {
    Tail {
        end: 4000,
        crc: 0x0123_4567,
    }
}

const STATE: &str = "/state";

/// A simulated disk with the durable folder `/state`.
fn disk() -> SimFs {
    let sim = SimFs::new(3);
    sim.create_dir_all(Path::new(STATE)).unwrap();
    sim.sync_dir(Path::new("/")).unwrap();
    sim
}

fn load(sim: &SimFs) -> Registry {
    Registry::load(Arc::new(sim.clone()), Some(Path::new(STATE))).unwrap()
}

fn stored(sim: &SimFs) -> Vec<u8> {
    sim.read(&Path::new(STATE).join(NAME)).unwrap()
}

#[test]
fn the_registry_survives_a_reload_byte_for_byte() {
    let sim = disk();
    let mut r = load(&sim);
    assert!(r.is_fresh());
    let a = Path::new("/data/with space/a\\b\nc.ndjson");
    let id = r.assign_new(a, identity(5), tail());
    assert_eq!(id, file_partition_id(a));
    r.set_cut(a, (10, 15));
    let b = Path::new("/data/b");
    let first_b = r.assign_new(b, identity(6), tail());
    let second_b = r.assign_new(b, identity(7), tail());
    assert_ne!(first_b, second_b);
    r.save().unwrap();
    let again = load(&sim);
    assert!(!again.is_fresh());
    assert_eq!(again.entries, r.entries);
    assert_eq!(again.retired, BTreeSet::from([first_b.0]));
    assert_eq!(again.get(a).unwrap().cut.as_deref(), Some(&(10, 15)));
}

#[test]
fn a_replaced_file_never_gets_an_id_handed_out_before() {
    let mut r = Registry::load(Arc::new(SimFs::new(1)), None).unwrap();
    let p = Path::new("/x");
    let mut seen = BTreeSet::new();
    for ino in 0..50 {
        assert!(seen.insert(r.assign_new(p, identity(ino), tail())));
    }
}

#[test]
fn a_corrupt_registry_is_an_error_naming_it() {
    let sim = disk();
    sim.write(
        &Path::new(STATE).join(NAME),
        b"etl-file-inputs 1\nfile 1\ncrc32 00000000\n",
    )
    .unwrap();
    let err = Registry::load(Arc::new(sim), Some(Path::new(STATE))).unwrap_err();
    assert!(err.to_string().contains("file-inputs"), "{err}");
}

#[test]
fn a_version_1_registry_is_read_with_no_tails_and_written_as_version_2() {
    let sim = disk();
    let mut v1 =
        String::from("etl-file-inputs 1\nfile 7 1 5 10 deadbeef 3 9 /data/a b\nretired 4\n");
    etl_checkpoint::seal(&mut v1);
    sim.write(&Path::new(STATE).join(NAME), v1.as_bytes())
        .unwrap();
    let mut r = load(&sim);
    let a = Path::new("/data/a b");
    let entry = r.get(a).unwrap().clone();
    assert_eq!(entry.id, PartitionId(7));
    assert_eq!(entry.cut.as_deref(), Some(&(3, 9)));
    assert_eq!(entry.tail(), None);
    r.set_tail(a, tail());
    r.save().unwrap();
    assert!(stored(&sim).starts_with(b"etl-file-inputs 2\n"));
    let again = load(&sim);
    assert_eq!(again.get(a).unwrap().tail(), Some(tail()));
    assert_eq!(again.retired, BTreeSet::from([4]));
}

#[test]
fn a_failed_fsync_makes_the_registry_lost_and_later_saves_fail() {
    let sim = disk();
    let mut r = load(&sim);
    r.assign_new(Path::new("/data/a"), identity(1), tail());
    r.save().unwrap();
    let before = stored(&sim);

    r.assign_new(Path::new("/data/b"), identity(2), tail());
    sim.fail_next(SimOp::Sync, EIO);
    let err = r.save().unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Checkpoint(CheckpointError::Io { op: "fsync", .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("file-inputs.tmp"), "{err}");
    assert!(r.lost().is_some());
    // The next fsync would succeed; the registry is not trusted again,
    // whatever changes.
    r.set_cut(Path::new("/data/a"), (1, 2));
    let again = r.save().unwrap_err();
    assert!(
        matches!(again, SourceError::Checkpoint(CheckpointError::Io { .. })),
        "{again}"
    );
    assert!(again.to_string().contains("lost"), "{again}");
    assert_eq!(stored(&sim), before);
    // After a crash too, only the save before the failed one is there.
    sim.crash();
    assert_eq!(load(&sim.process()).entries.len(), 1);
}

#[test]
fn a_failed_fsync_of_the_folder_makes_the_registry_lost_too() {
    let sim = disk();
    let mut r = load(&sim);
    r.assign_new(Path::new("/data/a"), identity(1), tail());
    // The file's fsync passes, the folder's fails.
    sim.fail_next(SimOp::SyncDir, EIO);
    let err = r.save().unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Checkpoint(CheckpointError::Io {
                op: "fsync the folder",
                ..
            })
        ),
        "{err}"
    );
    assert!(r.save().is_err(), "a retried fsync is never trusted");
}

#[test]
fn a_crash_that_loses_the_page_cache_keeps_the_last_save_of_the_registry() {
    let sim = disk();
    let mut r = load(&sim);
    r.assign_new(Path::new("/data/a"), identity(1), tail());
    r.save().unwrap();
    let saved = r.entries.clone();
    // Changed, not saved: only in memory.
    r.assign_new(Path::new("/data/b"), identity(2), tail());
    sim.crash();
    assert_eq!(load(&sim.process()).entries, saved);
}

#[test]
fn a_state_folder_the_registry_creates_survives_a_crash() {
    let sim = SimFs::new(4);
    let dir = Path::new("/var/etl/state");
    let mut r = Registry::load(Arc::new(sim.clone()), Some(dir)).unwrap();
    r.assign_new(Path::new("/data/a"), identity(1), tail());
    r.save().unwrap();
    sim.crash();
    let again = Registry::load(Arc::new(sim.process()), Some(dir)).unwrap();
    assert_eq!(again.entries, r.entries);
}

#[test]
fn a_state_folder_another_component_created_survives_a_crash_once_the_record_is_saved() {
    // The offset store, or the runtime, may create the state folder (and
    // the one above it) without making their names durable; the first
    // save of the record of inputs in it must, or a crash takes the
    // record with the folder while the output keeps what was read.
    // `/state` durable and only the state folder new, as the offset
    // store makes it; then a whole new path.
    for dir in ["/state/run", "/var/etl/state/run"] {
        let sim = SimFs::new(5);
        let dir = Path::new(dir);
        if dir.starts_with(STATE) {
            sim.create_dir_all(Path::new(STATE)).unwrap();
            sim.sync_dir(Path::new("/")).unwrap();
        }
        sim.create_dir_all(dir).unwrap();
        let mut r = Registry::load(Arc::new(sim.clone()), Some(dir)).unwrap();
        r.assign_new(Path::new("/data/a"), identity(1), tail());
        r.save().unwrap();
        sim.crash();
        let again = Registry::load(Arc::new(sim.process()), Some(dir)).unwrap();
        assert_eq!(
            again.entries,
            r.entries,
            "{}: the saved record is gone with its folder",
            dir.display()
        );
    }
}
