//! The file sink's progress file: written atomically, read on open.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// Make renames and creations in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), SinkError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SinkError::io("fsync directory", dir, e))?;
    #[cfg(test)]
    synced_dirs::record(dir);
    Ok(())
}

/// The directories `fsync`ed so far (resolved), for tests.
#[cfg(test)]
pub(crate) mod synced_dirs {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    pub(crate) fn record(dir: &Path) {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
        DIRS.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
    }

    /// Whether `dir` was `fsync`ed.
    pub(crate) fn contains(dir: &Path) -> bool {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
        DIRS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&dir)
    }
}

/// Replace the progress file atomically: write a temporary file, fsync
/// it, rename it over the old one, fsync the directory. A crash leaves the
/// old or the new content, never a torn one.
pub(crate) fn write_stored(path: &Path, stored: &Stored) -> Result<(), SinkError> {
    let target = progress_path(path);
    let tmp = suffixed(path, "progress.tmp");
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
    let mut file = File::create(&tmp).map_err(|e| SinkError::io("create", &tmp, e))?;
    file.write_all(doc.to_string().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| SinkError::io("write", &tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| SinkError::io("rename", &tmp, e))?;
    sync_dir(parent_dir(path))
}

/// Read the progress file of `path`, if there is one.
pub(crate) fn read_stored(path: &Path) -> Result<Option<Stored>, SinkError> {
    let target = progress_path(path);
    let text = match fs::read_to_string(&target) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SinkError::io("read", &target, e)),
    };
    let corrupt = |reason: &str| SinkError::CorruptProgress {
        path: target.clone(),
        reason: reason.to_owned(),
    };
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| corrupt(&format!("not JSON: {e}")))?;
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
        let path = dir.path().join("out.ndjson");
        assert_eq!(read_stored(&path).unwrap(), None);
        let stored = Stored {
            segments: 2,
            length: 99,
            progress: [(PartitionId(0), Offset(5)), (PartitionId(3), Offset(-1))]
                .into_iter()
                .collect(),
        };
        write_stored(&path, &stored).unwrap();
        assert_eq!(read_stored(&path).unwrap(), Some(stored));
        fs::write(progress_path(&path), "{\"version\":1,\"segm").unwrap();
        let err = read_stored(&path).unwrap_err();
        assert!(matches!(err, SinkError::CorruptProgress { .. }), "{err}");
    }
}
