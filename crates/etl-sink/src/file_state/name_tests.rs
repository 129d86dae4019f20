//! The file state's side files (progress, recovery point) belong to the
//! file written, not to the name a run gave it: runs taking turns under
//! two names, and files replaced or linked between runs.

use super::tests::{PATH, disk};
use super::*;
use crate::FsyncPolicy;
use etl_fs::SimFs;
use std::time::Duration;

fn config(exactly_once: bool) -> FileSinkConfig {
    FileSinkConfig {
        fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
        exactly_once,
        ..FileSinkConfig::default()
    }
}

fn open_as(fs: &SimFs, path: &str, exactly_once: bool) -> Result<FileState, SinkError> {
    FileState::open(Arc::new(fs.clone()), Path::new(path), config(exactly_once))
}

/// Append `line` as the record `offset` of partition 0, and make it
/// durable: the sink reports it written.
fn write_durably(state: &mut FileState, offset: i64, line: &[u8]) {
    let bytes = Bytes::copy_from_slice(line);
    let placed = [(PartitionId(0), Offset(offset), 0..line.len())];
    let exactly_once = state.config.exactly_once;
    state
        .append(&bytes, exactly_once.then_some(&placed[..]))
        .unwrap();
    state.sync().unwrap();
}

/// Second names for `PATH`: a symlink, a path through `..`, a symlinked
/// folder, and a hard link; whether it is the hard link.
const SECOND_NAMES: [(&str, bool); 4] = [
    ("/links/out.ndjson", false),
    ("/links/../out/out.ndjson", false),
    ("/links/dir/out.ndjson", false),
    ("/links/hard.ndjson", true),
];

/// Make the second name `SECOND_NAMES[case]` on `sim` (only that one).
fn second_name(sim: &SimFs, case: usize) -> (&'static str, bool) {
    sim.create_dir_all(Path::new("/links")).unwrap();
    match case {
        0 => sim
            .symlink(Path::new(PATH), Path::new("/links/out.ndjson"))
            .unwrap(),
        2 => sim
            .symlink(Path::new("/out"), Path::new("/links/dir"))
            .unwrap(),
        3 => sim
            .hard_link(Path::new(PATH), Path::new("/links/hard.ndjson"))
            .unwrap(),
        _ => {}
    }
    SECOND_NAMES[case]
}

#[test]
fn records_written_under_another_name_are_never_cut_by_a_stale_recovery_point() {
    // Raw values may hold NUL bytes, which the recovery point's check
    // cuts past the point: a point older than what a run under another
    // name acknowledged would cut that run's records.
    for case in 0..4 {
        let sim = disk(7);
        let mut first = open_as(&sim, PATH, false).unwrap();
        write_durably(&mut first, 0, b"x\n");
        first.flush().unwrap();
        drop(first);
        let (other, _) = second_name(&sim, case);
        let mut second = open_as(&sim, other, false).unwrap();
        write_durably(&mut second, 1, b"a\0b\n");
        drop(second);
        drop(open_as(&sim, PATH, false).unwrap());
        assert_eq!(
            sim.read(Path::new(PATH)).unwrap(),
            b"x\na\0b\n",
            "{other}: a line acknowledged under another name was cut"
        );
    }
}

#[test]
fn exactly_once_progress_covers_what_runs_under_every_name_wrote() {
    for case in 0..4 {
        let sim = disk(8);
        let mut first = open_as(&sim, PATH, true).unwrap();
        write_durably(&mut first, 0, b"{\"o\":0}\n");
        drop(first);
        let (other, hard) = second_name(&sim, case);
        let second = open_as(&sim, other, true);
        if hard {
            // Progress beside one of its names cannot speak for what a
            // run under the other wrote: refused, nothing cut.
            let err = second.unwrap_err();
            assert!(
                matches!(err, SinkError::OutputLost { .. }) && !err.is_retryable(),
                "{other}: {err:?}"
            );
            assert!(err.to_string().contains("hard link"), "{other}: {err}");
            continue;
        }
        let mut second = second.unwrap();
        assert_eq!(
            second.stored.get(PartitionId(0)),
            Some(Offset(1)),
            "{other}: the progress stored under the first name is not found"
        );
        write_durably(&mut second, 1, b"{\"o\":1}\n");
        drop(second);
        let third = open_as(&sim, PATH, true).unwrap();
        assert_eq!(third.stored.get(PartitionId(0)), Some(Offset(2)), "{other}");
        assert_eq!(
            sim.read(Path::new(PATH)).unwrap(),
            b"{\"o\":0}\n{\"o\":1}\n",
            "{other}: records written under another name were cut"
        );
    }
}

#[test]
fn an_exactly_once_output_replaced_since_the_last_run_is_refused_not_cut() {
    // Its progress was stored for another file: cutting this one to the
    // recorded length would destroy what it holds.
    let sim = disk(9);
    let mut first = open_as(&sim, PATH, true).unwrap();
    write_durably(&mut first, 0, b"{\"o\":0}\n");
    drop(first);
    let foreign = b"{\"f\":1}\n{\"f\":2}\n{\"f\":3}\n";
    sim.write(Path::new("/out/new"), foreign).unwrap();
    sim.rename(Path::new("/out/new"), Path::new(PATH)).unwrap();
    let err = open_as(&sim, PATH, true).unwrap_err();
    assert!(
        matches!(err, SinkError::OutputLost { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(err.to_string().contains("replaced"), "{err}");
    assert_eq!(
        sim.read(Path::new(PATH)).unwrap(),
        foreign,
        "the file was cut"
    );
}

#[test]
fn progress_an_older_version_kept_beside_a_symlink_is_refused_not_ignored() {
    // Ignoring it would write every record again, and a later run under
    // the link's name would cut back to it.
    let sim = disk(10);
    let (link, _) = second_name(&sim, 0);
    let mut first = open_as(&sim, link, true).unwrap();
    write_durably(&mut first, 0, b"{\"o\":0}\n");
    drop(first);
    let beside_file = crate::file_progress::progress_path(Path::new(PATH));
    let beside_link = crate::file_progress::progress_path(Path::new(link));
    sim.rename(&beside_file, &beside_link).unwrap();
    let err = open_as(&sim, link, true).unwrap_err();
    assert!(matches!(err, SinkError::CorruptProgress { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&beside_file.display().to_string()),
        "{err}"
    );
    assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"{\"o\":0}\n");
}

#[test]
fn rotation_through_a_symlinked_output_rotates_its_target_beside_it_and_keeps_the_link() {
    // The link names where the data goes (another disk, say): a rotation
    // that renamed the link instead would leave the data file behind as
    // a segment's target and write on in the link's folder.
    for exactly_once in [false, true] {
        let sim = disk(3);
        sim.create_dir_all(Path::new("/links")).unwrap();
        let link = Path::new("/links/out.ndjson");
        sim.symlink(Path::new(PATH), link).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        let rotating = FileSinkConfig {
            rotate_bytes: Some(4),
            ..config(exactly_once)
        };
        let mut state = FileState::open(Arc::new(sim.clone()), link, rotating).unwrap();
        for (offset, line) in [b"a0\n", b"a1\n", b"a2\n"].into_iter().enumerate() {
            write_durably(&mut state, offset as i64, line);
        }
        state.flush().unwrap();
        drop(state);
        let meta = sim.symlink_metadata(link).unwrap();
        assert_eq!(
            meta.kind,
            etl_fs::FileKind::Symlink,
            "exactly once: {exactly_once}"
        );
        assert_eq!(sim.canonicalize(link).unwrap(), Path::new(PATH));
        assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"a2\n");
        assert_eq!(sim.read(Path::new("/out/out.ndjson.1")).unwrap(), b"a0\n");
        assert_eq!(sim.read(Path::new("/out/out.ndjson.2")).unwrap(), b"a1\n");
        for seg in ["/out/out.ndjson.1", "/out/out.ndjson.2"] {
            let kind = sim.symlink_metadata(Path::new(seg)).unwrap().kind;
            assert_eq!(kind, etl_fs::FileKind::File, "{seg}");
        }
        assert!(
            sim.symlink_metadata(Path::new("/links/out.ndjson.1"))
                .is_err()
        );
        // The next run, under either name, goes on where this one ended.
        for (n, name) in [link, Path::new(PATH)].into_iter().enumerate() {
            let mut state = FileState::open(Arc::new(sim.clone()), name, rotating).unwrap();
            assert_eq!(state.segments(), 2 + n as u64, "{}", name.display());
            let line = format!("a{}\n", 3 + n);
            write_durably(&mut state, 3 + n as i64, line.as_bytes());
            state.flush().unwrap();
        }
        assert_eq!(sim.read(Path::new("/out/out.ndjson.3")).unwrap(), b"a2\n");
        assert_eq!(sim.read(Path::new("/out/out.ndjson.4")).unwrap(), b"a3\n");
        assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"a4\n");
    }
}
