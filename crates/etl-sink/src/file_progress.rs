//! The file sink's progress file: written atomically, read on open.
//!
//! It sits beside the file written (`<canonical path>.progress`, symlinks
//! resolved), not beside the name a run gave it, and records the file's
//! device and inode: progress is never applied to a file it was not
//! stored for (a file renamed over the output, a run under another
//! name).

use std::io::Write;
use std::path::{Path, PathBuf};

use etl_fs::{Fs, Metadata, OpenOptions};
use etl_record::{Offset, PartitionId};

use crate::{Progress, SinkError};

/// What the progress file records: how many finished segments exist, how
/// long the active file is, and the source offsets its data covers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) segments: u64,
    pub(crate) length: u64,
    /// The active file's device and inode when it was stored (`None`
    /// from an older version, which did not record them).
    pub(crate) file: Option<(u64, u64)>,
    pub(crate) progress: Progress,
}

impl Stored {
    /// Whether this progress may be about the file `meta` describes.
    pub(crate) fn describes(&self, meta: &Metadata) -> bool {
        self.file.is_none_or(|file| file == meta.dev_ino())
    }
}

/// The error for an output whose progress was stored for another file:
/// renamed over it (or replaced) since the last run.
pub(crate) fn replaced_since_recorded(path: &Path, stored: &Stored) -> SinkError {
    SinkError::OutputLost {
        path: path.to_owned(),
        what: format!(
            "was replaced since the last run: it is not the file its progress was stored for \
             ({} bytes recorded), and cutting it back would destroy what it holds; restore the \
             file, or move it away and reset the offsets to write it again",
            stored.length
        ),
    }
}

/// Whether the side files beside the canonical path of the output
/// (`meta`, at `path`) can describe it. A file with a second name that
/// is a hard link has no one canonical path: a run under the other name
/// keeps its own side files, and progress or a recovery point from
/// either could cut what the other wrote. Exactly once, such an output
/// is refused; at least once, its recovery point is not trusted (its
/// complete lines are kept).
pub(crate) fn side_files_apply(
    path: &Path,
    meta: &Metadata,
    exactly_once: bool,
) -> Result<bool, SinkError> {
    if !meta.is_file() || meta.links <= 1 {
        return Ok(true);
    }
    if exactly_once {
        return Err(SinkError::OutputLost {
            path: path.to_owned(),
            what: format!(
                "has {} names (hard links): progress kept beside one name cannot cover what a \
                 run under another wrote, and cutting back to it could delete committed \
                 records; remove the other names to write it exactly once",
                meta.links
            ),
        });
    }
    tracing::warn!(path = %path.display(), links = meta.links, "the output has more than one name (hard links): its recovery point is not trusted; keeping its complete lines");
    Ok(false)
}

/// The progress stored for the output at `path`, whose canonical path is
/// `side`. An older version kept it beside the configured name: found
/// there alone, it is refused rather than ignored (ignoring it would
/// write everything again, and a later run under that name would cut
/// back to it).
pub(crate) fn read_stored_for(
    fs: &dyn Fs,
    path: &Path,
    side: &Path,
) -> Result<Option<Stored>, SinkError> {
    let stored = read_stored(fs, side)?;
    if stored.is_none() && side != path && fs.exists(&progress_path(path)) {
        return Err(SinkError::CorruptProgress {
            path: progress_path(path),
            reason: format!(
                "it is kept beside the name {} of the output, which is {}: progress now sits \
                 beside the file written; move it to {}",
                path.display(),
                side.display(),
                progress_path(side).display()
            ),
        });
    }
    Ok(stored)
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
    let mut doc = serde_json::json!({
        "version": 1,
        "segments": stored.segments,
        "length": stored.length,
        "offsets": offsets,
    });
    if let Some((dev, ino)) = stored.file {
        doc["dev"] = dev.into();
        doc["ino"] = ino.into();
    }
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
    let file = match (&doc["dev"], &doc["ino"]) {
        (serde_json::Value::Null, serde_json::Value::Null) => None,
        (dev, ino) => Some(
            dev.as_u64()
                .zip(ino.as_u64())
                .ok_or_else(|| corrupt("bad dev or ino"))?,
        ),
    };
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
        file,
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
            file: Some((3, 4)),
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
            file: None,
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
