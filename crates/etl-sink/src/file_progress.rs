//! The file sink's progress file: written atomically, read on open.

use std::io::Write;
use std::path::{Path, PathBuf};

use etl_fs::{Fs, OpenOptions};
use etl_record::{Offset, PartitionId};

use crate::{Progress, SinkError};

/// What the progress file records: how many finished segments exist, how
/// long the active file is, and the source offsets its data covers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) segments: u64,
    pub(crate) length: u64,
    pub(crate) progress: Progress,
}

/// `<path>.progress`.
pub(crate) fn progress_path(path: &Path) -> PathBuf {
    suffixed(path, "progress")
}

/// `<path>.<suffix>`.
pub(crate) fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Highest `n` such that `<path>.<n>` exists.
pub(crate) fn last_segment(fs: &dyn Fs, path: &Path) -> Result<u64, SinkError> {
    let dir = parent_dir(path);
    let Some(name) = path.file_name() else {
        return Ok(0);
    };
    // Compared as bytes: a name need not be UTF-8, and a segment missed
    // here is one the next rotation would be renamed over.
    let mut prefix = name.as_encoded_bytes().to_vec();
    prefix.push(b'.');
    let entries = fs
        .read_dir(dir)
        .map_err(|e| SinkError::io("list", dir, e))?;
    let mut last = 0;
    for file_name in entries {
        if let Some(n) = file_name
            .as_encoded_bytes()
            .strip_prefix(prefix.as_slice())
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<u64>().ok())
        {
            last = last.max(n);
        }
    }
    Ok(last)
}

/// Make renames and creations in `dir` durable.
pub(crate) fn sync_dir(fs: &dyn Fs, dir: &Path) -> Result<(), SinkError> {
    fs.sync_dir(dir)
        .map_err(|e| SinkError::io("fsync directory", dir, e))
}

/// Replace the progress file atomically (see [`replace_atomically`]).
pub(crate) fn write_stored(fs: &dyn Fs, path: &Path, stored: &Stored) -> Result<(), SinkError> {
    let offsets: Vec<serde_json::Value> = stored
        .progress
        .iter()
        .map(|(p, o)| serde_json::json!([p.0, o.0]))
        .collect();
    let doc = serde_json::json!({
        "version": 1,
        "segments": stored.segments,
        "length": stored.length,
        "offsets": offsets,
    });
    replace_atomically(fs, &progress_path(path), doc.to_string().as_bytes())
}

/// Replace the file `target` with `bytes` atomically: write
/// `<target>.tmp`, fsync it, rename it over `target`, fsync the directory.
/// A crash leaves the old or the new content, never a torn one.
pub(crate) fn replace_atomically(
    fs: &dyn Fs,
    target: &Path,
    bytes: &[u8],
) -> Result<(), SinkError> {
    let tmp = suffixed(target, "tmp");
    let mut file = fs
        .open(
            &tmp,
            &OpenOptions::new().write(true).create(true).truncate(true),
        )
        .map_err(|e| SinkError::io("create", &tmp, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| SinkError::io("write", &tmp, e))?;
    drop(file);
    fs.rename(&tmp, target)
        .map_err(|e| SinkError::io("rename", &tmp, e))?;
    sync_dir(fs, parent_dir(target))
}

/// Read the progress file of `path`, if there is one.
pub(crate) fn read_stored(fs: &dyn Fs, path: &Path) -> Result<Option<Stored>, SinkError> {
    let target = progress_path(path);
    let text = match fs.read(&target) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SinkError::io("read", &target, e)),
    };
    let corrupt = |reason: &str| SinkError::CorruptProgress {
        path: target.clone(),
        reason: reason.to_owned(),
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| corrupt(&format!("not JSON: {e}")))?;
    if doc["version"] != 1 {
        return Err(corrupt("unknown version"));
    }
    let segments = doc["segments"]
        .as_u64()
        .ok_or_else(|| corrupt("missing segments"))?;
    let length = doc["length"]
        .as_u64()
        .ok_or_else(|| corrupt("missing length"))?;
    let mut progress = Progress::new();
    for pair in doc["offsets"]
        .as_array()
        .ok_or_else(|| corrupt("missing offsets"))?
    {
        let partition = pair[0]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| corrupt("bad partition"))?;
        let next = pair[1].as_i64().ok_or_else(|| corrupt("bad offset"))?;
        progress.advance(PartitionId(partition), Offset(next));
    }
    Ok(Some(Stored {
        segments,
        length,
        progress,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let fs = etl_fs::RealFs;
        let path = dir.path().join("out.ndjson");
        assert_eq!(read_stored(&fs, &path).unwrap(), None);
        let stored = Stored {
            segments: 2,
            length: 99,
            progress: [(PartitionId(0), Offset(5)), (PartitionId(3), Offset(-1))]
                .into_iter()
                .collect(),
        };
        write_stored(&fs, &path, &stored).unwrap();
        assert_eq!(read_stored(&fs, &path).unwrap(), Some(stored));
        std::fs::write(progress_path(&path), "{\"version\":1,\"segm").unwrap();
        let err = read_stored(&fs, &path).unwrap_err();
        assert!(matches!(err, SinkError::CorruptProgress { .. }), "{err}");
    }

    #[test]
    fn a_crash_at_any_point_of_a_store_leaves_the_old_progress_or_the_new() {
        // Temporary file, fsync, rename, fsync of the folder: a crash
        // after any step finds one whole progress file, never a torn one
        // nor none.
        let old = Stored {
            segments: 0,
            length: 8,
            progress: [(PartitionId(0), Offset(1))].into_iter().collect(),
        };
        let new = Stored {
            length: 16,
            progress: [(PartitionId(0), Offset(2))].into_iter().collect(),
            ..old.clone()
        };
        let ops = [
            None,
            Some(etl_fs::SimOp::Write),
            Some(etl_fs::SimOp::Sync),
            Some(etl_fs::SimOp::Rename),
            Some(etl_fs::SimOp::SyncDir),
        ];
        for seed in 0..40 {
            let failing = ops[usize::try_from(seed).unwrap() % ops.len()];
            let sim = etl_fs::SimFs::new(seed);
            let path = Path::new("/out.ndjson");
            write_stored(&sim, path, &old).unwrap();
            sim.set_faults(etl_fs::SimFaults {
                torn: 500,
                kept: 300,
                dirs_kept: 500,
                ..etl_fs::SimFaults::default()
            });
            // The store stops after the failing call: the crash finds
            // what the steps before it left.
            if let Some(op) = failing {
                sim.fail_next(op, 5);
            }
            let stored = write_stored(&sim, path, &new);
            assert_eq!(stored.is_ok(), failing.is_none(), "seed {seed}");
            sim.crash();
            let found = read_stored(&sim.process(), path).unwrap();
            match failing {
                None => assert_eq!(
                    found,
                    Some(new.clone()),
                    "seed {seed}: a store that returned"
                ),
                Some(op) => assert!(
                    found == Some(old.clone()) || found == Some(new.clone()),
                    "seed {seed}: {found:?} after a failed {op:?}"
                ),
            }
        }
    }
}
