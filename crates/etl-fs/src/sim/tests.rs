//! The simulated file system's own semantics: durability, fsyncgate, names, links, locks, crashes.

#![allow(clippy::unwrap_used)]

use super::*;

fn fs_with_dir() -> SimFs {
    let fs = SimFs::new(1);
    fs.create_dir_all(Path::new("/d")).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

fn append(fs: &SimFs, path: &str, bytes: &[u8]) -> Box<dyn FileHandle> {
    let mut f = fs
        .open(
            Path::new(path),
            &OpenOptions::new().read(true).append(true).create(true),
        )
        .unwrap();
    f.write_all(bytes).unwrap();
    f
}

#[test]
fn unsynced_bytes_and_names_are_lost_in_a_crash_synced_ones_kept() {
    let fs = fs_with_dir();
    let f = append(&fs, "/d/a", b"one\n");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    drop(append(&fs, "/d/a", b"two\n"));
    drop(append(&fs, "/d/b", b"never named durably\n"));
    let b = fs.open(Path::new("/d/b"), &OpenOptions::reading()).unwrap();
    b.sync_data().unwrap();
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"one\ntwo\n");
    fs.crash();
    let fs = fs.process();
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"one\n");
    assert!(
        fs.metadata(Path::new("/d/b")).is_err(),
        "its folder was never synced"
    );
}

#[test]
fn a_handle_or_view_of_a_crashed_process_cannot_touch_the_next_world() {
    let fs = fs_with_dir();
    let mut f = append(&fs, "/d/a", b"x");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    fs.crash();
    assert!(f.write_all(b"zombie").is_err());
    assert!(fs.write(Path::new("/d/z"), b"zombie").is_err());
    let next = fs.process();
    assert_eq!(next.read(Path::new("/d/a")).unwrap(), b"x");
    assert!(next.metadata(Path::new("/d/z")).is_err());
}

#[test]
fn a_kill_keeps_the_page_cache_but_ends_the_process_and_its_locks() {
    let fs = fs_with_dir();
    let mut f = append(&fs, "/d/a", b"unsynced\n");
    f.try_lock().unwrap();
    fs.kill();
    assert!(
        f.write_all(b"zombie").is_err(),
        "the killed process wrote on"
    );
    let next = fs.process();
    assert_eq!(next.read(Path::new("/d/a")).unwrap(), b"unsynced\n");
    let g = next
        .open(Path::new("/d/a"), &OpenOptions::reading())
        .unwrap();
    g.try_lock().unwrap();
    // Dropped after the next process took the lock: it keeps it.
    drop(f);
    let h = next
        .open(Path::new("/d/a"), &OpenOptions::reading())
        .unwrap();
    assert!(matches!(h.try_lock(), Err(TryLockError::WouldBlock)));
    // Nothing was synced: a crash now loses it all.
    fs.crash();
    assert!(fs.process().metadata(Path::new("/d/a")).is_err());
}

#[test]
fn a_failed_fsync_drops_the_dirty_bytes_and_the_next_one_succeeds() {
    // Linux's behaviour ("fsyncgate"): the error is reported once.
    let fs = fs_with_dir();
    let f = append(&fs, "/d/a", b"kept\n");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    drop(f);
    let mut f = append(&fs, "/d/a", b"lost\n");
    fs.fail_next(SimOp::Sync, 5);
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5));
    // Still readable until the crash (the pages stayed cached) ...
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"kept\nlost\n");
    f.write_all(b"more\n").unwrap();
    f.sync_data().unwrap();
    fs.crash();
    // ... but the disk has zeros where they were.
    let got = fs.process().read(Path::new("/d/a")).unwrap();
    assert_eq!(got, b"kept\n\0\0\0\0\0more\n");
}

#[test]
fn by_seed_the_lost_bytes_read_back_as_zeros_at_once() {
    let fs = fs_with_dir();
    fs.set_faults(SimFaults {
        zero_lost: 1000,
        ..SimFaults::default()
    });
    let f = append(&fs, "/d/a", b"lost\n");
    fs.fail_next(SimOp::Sync, 5);
    assert!(f.sync_data().is_err());
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"\0\0\0\0\0");
    assert!(f.sync_data().is_ok(), "the next fsync reports success");
}

#[test]
fn renames_links_and_removals_are_durable_once_their_folder_is_synced() {
    let fs = fs_with_dir();
    let f = append(&fs, "/d/a", b"data");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    fs.rename(Path::new("/d/a"), Path::new("/d/b")).unwrap();
    fs.crash();
    let fs2 = fs.process();
    assert!(fs2.exists(Path::new("/d/a")) && !fs2.exists(Path::new("/d/b")));
    fs2.rename(Path::new("/d/a"), Path::new("/d/b")).unwrap();
    fs2.hard_link(Path::new("/d/b"), Path::new("/d/c")).unwrap();
    fs2.sync_dir(Path::new("/d")).unwrap();
    fs.crash();
    let fs3 = fs.process();
    assert!(!fs3.exists(Path::new("/d/a")));
    let (b, c) = (
        fs3.metadata(Path::new("/d/b")).unwrap(),
        fs3.metadata(Path::new("/d/c")).unwrap(),
    );
    assert_eq!(b.dev_ino(), c.dev_ino(), "hard links share an inode");
    fs3.remove_file(Path::new("/d/b")).unwrap();
    assert_eq!(fs3.read(Path::new("/d/c")).unwrap(), b"data");
    assert_eq!(
        fs3.read_dir(Path::new("/d")).unwrap(),
        vec![OsString::from("c")]
    );
}

#[test]
fn symlinks_resolve_and_canonicalize_to_their_target() {
    let fs = fs_with_dir();
    fs.create_dir_all(Path::new("/e/f")).unwrap();
    fs.symlink(Path::new("/e/f"), Path::new("/d/link")).unwrap();
    fs.symlink(Path::new("../d/link/x"), Path::new("/e/rel"))
        .unwrap();
    drop(append(&fs, "/d/link/x", b"1"));
    assert_eq!(
        fs.canonicalize(Path::new("/d/link/x")).unwrap(),
        Path::new("/e/f/x")
    );
    assert_eq!(
        fs.canonicalize(Path::new("/e/rel")).unwrap(),
        Path::new("/e/f/x")
    );
    assert_eq!(
        fs.symlink_metadata(Path::new("/e/rel")).unwrap().kind,
        FileKind::Symlink
    );
    assert_eq!(fs.read(Path::new("/e/./f/../f/x")).unwrap(), b"1");
    fs.symlink(Path::new("/d/loop"), Path::new("/d/loop"))
        .unwrap();
    assert_eq!(
        fs.metadata(Path::new("/d/loop"))
            .unwrap_err()
            .raw_os_error(),
        Some(ELOOP)
    );
}

#[test]
fn a_lock_belongs_to_the_open_file_and_is_released_on_drop_or_crash() {
    let fs = fs_with_dir();
    let a = append(&fs, "/d/l", b"");
    fs.hard_link(Path::new("/d/l"), Path::new("/d/m")).unwrap();
    let b = fs.open(Path::new("/d/m"), &OpenOptions::reading()).unwrap();
    a.try_lock().unwrap();
    a.try_lock().unwrap();
    assert!(matches!(b.try_lock(), Err(TryLockError::WouldBlock)));
    drop(a);
    b.try_lock().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    fs.crash();
    let c = fs
        .process()
        .open(Path::new("/d/l"), &OpenOptions::reading())
        .unwrap();
    c.try_lock().unwrap();
}

#[test]
fn a_crash_keeps_torn_or_whole_unsynced_writes_by_seed() {
    let mut torn = 0;
    let mut whole = 0;
    for seed in 0..64 {
        let fs = SimFs::new(seed);
        fs.set_faults(SimFaults {
            torn: 300,
            kept: 300,
            ..SimFaults::default()
        });
        fs.create_dir_all(Path::new("/d")).unwrap();
        let f = append(&fs, "/d/a", b"");
        f.sync_data().unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        drop(append(&fs, "/d/a", b"abcdefgh"));
        fs.crash();
        match fs.process().read(Path::new("/d/a")).unwrap().as_slice() {
            b"" => {}
            b"abcd" => torn += 1,
            b"abcdefgh" => whole += 1,
            other => panic!("seed {seed}: {other:?}"),
        }
    }
    assert!(torn > 0 && whole > 0, "torn {torn}, whole {whole}");
}

#[test]
fn outside_changes_are_never_failed_by_the_faults() {
    let fs = fs_with_dir();
    fs.set_faults(SimFaults {
        write_fail: 1000,
        sync_fail: 1000,
        ..SimFaults::default()
    });
    fs.apply(&Mutation::Replace {
        path: "/d/a".into(),
        bytes: b"first\n".to_vec(),
    })
    .unwrap();
    let before = fs.metadata(Path::new("/d/a")).unwrap();
    fs.apply(&Mutation::RewriteInPlace {
        path: "/d/a".into(),
        bytes: b"second\n".to_vec(),
    })
    .unwrap();
    fs.apply(&Mutation::Append {
        path: "/d/a".into(),
        bytes: b"third\n".to_vec(),
    })
    .unwrap();
    let after = fs.metadata(Path::new("/d/a")).unwrap();
    assert_eq!(before.ino, after.ino, "rewritten in place");
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"second\nthird\n");
    fs.apply(&Mutation::Truncate {
        path: "/d/a".into(),
        len: 3,
    })
    .unwrap();
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"sec");
    let mut f = fs
        .open(Path::new("/d/a"), &OpenOptions::new().append(true))
        .unwrap();
    assert!(f.write_all(b"x").is_err(), "the pipeline's writes do fail");
    fs.apply(&Mutation::Unlink {
        path: "/d/a".into(),
    })
    .unwrap();
    assert!(!fs.exists(Path::new("/d/a")));
}

#[test]
fn names_in_a_folder_whose_own_name_is_lost_are_lost_with_it() {
    let fs = SimFs::new(3);
    fs.create_dir_all(Path::new("/new/deeper")).unwrap();
    let f = append(&fs, "/new/deeper/a", b"x");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/new/deeper")).unwrap();
    fs.sync_dir(Path::new("/new")).unwrap();
    fs.crash();
    assert!(!fs.process().exists(Path::new("/new/deeper/a")));
}

#[test]
fn a_durable_copy_holds_what_a_power_loss_would_keep_and_leaves_the_disk_alive() {
    let fs = fs_with_dir();
    fs.set_faults(SimFaults {
        kept: 1000,
        dirs_kept: 1000,
        ..SimFaults::default()
    });
    let f = append(&fs, "/d/a", b"one\n");
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    drop(append(&fs, "/d/a", b"two\n"));
    drop(append(&fs, "/d/b", b"never named durably\n"));
    let copy = fs.durable_copy();
    // Whatever the faults would keep through a real crash, the copy keeps
    // only what an fsync covered.
    assert_eq!(copy.read(Path::new("/d/a")).unwrap(), b"one\n");
    assert!(copy.metadata(Path::new("/d/b")).is_err());
    // The disk and its process go on as they were, apart from the copy.
    assert_eq!(fs.read(Path::new("/d/a")).unwrap(), b"one\ntwo\n");
    drop(append(&fs, "/d/a", b"three\n"));
    assert_eq!(copy.read(Path::new("/d/a")).unwrap(), b"one\n");
    assert_eq!(fs.stats().crashes, 0);
}
