//! The output's locks: one writer per file, whatever its name.

use std::path::{Path, PathBuf};

use etl_fs::{FileHandle, Fs, TryLockError};
use etl_record::{LockError, OwnerLock};

use crate::SinkError;
use crate::file_progress::suffixed;

/// Another sink writes the output, under this name or another one.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot write {}: the file ({}) is already written by another sink, under this name or \
     another (a symlink or a hard link to it): {source}",
    path.display(),
    file.display()
)]
pub(crate) struct OutputInUse {
    /// The configured path.
    path: PathBuf,
    /// The file it names, symlinks resolved.
    file: PathBuf,
    #[source]
    source: LockError,
}

/// Take the output's locks before anything reads or cuts it: the lock
/// file beside the file `path` names, symlinks resolved
/// (`<canonical path>.lock`, which names the holder's pid), and a lock on
/// the open data file itself (see [`lock_data`]). Locks keyed by the
/// configured name would let a second name for the same file (a symlink,
/// a hard link) in as a second writer. `file` is the open output.
/// Returns the lock and the canonical path.
pub(super) fn lock_output(
    fs: &dyn Fs,
    path: &Path,
    file: &dyn FileHandle,
) -> Result<(OwnerLock, PathBuf), SinkError> {
    let canonical = fs
        .canonicalize(path)
        .map_err(|e| SinkError::io("resolve", path, e))?;
    let in_use = |source: LockError| {
        SinkError::permanent(OutputInUse {
            path: path.to_owned(),
            file: canonical.clone(),
            source,
        })
    };
    let lock = OwnerLock::acquire_in(fs, suffixed(&canonical, "lock")).map_err(|e| match e {
        LockError::Io { path, op, source } => SinkError::io(op, path, source),
        e => in_use(e),
    })?;
    lock_data(file, &canonical).map_err(|e| match e {
        LockError::Io { path, op, source } => SinkError::io(op, path, source),
        e => in_use(e),
    })?;
    Ok((lock, canonical))
}

/// Lock the open data file `file` (at `path`) exclusively. The lock
/// belongs to the file, not to a name: a second sink reaching it through
/// a hard link (another name, another lock file) is refused here. The
/// kernel releases it when the file is closed.
pub(super) fn lock_data(file: &dyn FileHandle, path: &Path) -> Result<(), LockError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(LockError::InUse {
            path: path.to_owned(),
            pid: None,
        }),
        Err(TryLockError::Error(source)) => Err(LockError::Io {
            path: path.to_owned(),
            op: "lock",
            source,
        }),
    }
}
