//! One writer per piece of state: an exclusive advisory lock on a lock
//! file, held for as long as its owner lives.
//!
//! An offset store and an exactly-once output each belong to one running
//! pipeline. Two pipelines on the same state write every record twice, or
//! cut each other's output back to their own recorded length. The lock is
//! `flock(2)` (through [`File::try_lock`]): it belongs to the open file,
//! so a second owner in the same process is refused too, and the kernel
//! releases it when the holder exits, however it exits (`kill -9`
//! included). The holder writes its process id into the lock file, so a
//! refused owner can say who holds it. The file itself is never removed:
//! removing a lock file while someone waits on it lets two owners in.
//!
//! Advisory locks bind only the programs that take them, and network file
//! systems may not honour them: the guard is for pipelines, against each
//! other, on local disks.
//!
//! The lock file is opened through an [`etl_fs::Fs`]: the real file
//! system with [`OwnerLock::acquire`], any other (a simulated one) with
//! [`OwnerLock::acquire_in`].

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use etl_fs::{FileHandle, Fs, OpenOptions, RealFs, TryLockError};

/// An exclusive lock on a lock file; released when dropped (or when the
/// process ends).
#[derive(Debug)]
pub struct OwnerLock {
    path: PathBuf,
    // Held for its lock; closing the file releases it.
    _file: Box<dyn FileHandle>,
}

impl OwnerLock {
    /// Take the lock at `path`, creating the file if needed, and record
    /// this process's id in it. Never waits.
    ///
    /// # Errors
    ///
    /// [`LockError::InUse`] when another owner (another process, or
    /// another owner in this one) holds it; [`LockError::Io`] when the
    /// file cannot be opened, locked or written.
    pub fn acquire(path: impl Into<PathBuf>) -> Result<OwnerLock, LockError> {
        OwnerLock::acquire_in(&RealFs, path)
    }

    /// Take the lock at `path` on the file system `fs`, as
    /// [`acquire`](Self::acquire) does on the real one.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    pub fn acquire_in(fs: &dyn Fs, path: impl Into<PathBuf>) -> Result<OwnerLock, LockError> {
        let path = path.into();
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| LockError::Io { path, op, source }
        };
        let mut file = fs
            .open(
                &path,
                &OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false),
            )
            .map_err(io("open"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let pid = read_pid(&mut *file);
                return Err(LockError::InUse { path, pid });
            }
            Err(TryLockError::Error(e)) => return Err(io("lock")(e)),
        }
        // The process id is for people and for a refused owner's message;
        // nothing depends on it being durable.
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .map_err(io("write"))?;
        Ok(OwnerLock { path, _file: file })
    }

    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The holder's process id, if it has written one yet.
fn read_pid(file: &mut dyn FileHandle) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Why a lock could not be taken.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner holds the lock: another pipeline runs on this state.
    InUse {
        /// The lock file.
        path: PathBuf,
        /// The holder's process id, when it could be read.
        pid: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    Io {
        /// The lock file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        source: io::Error,
    },
}

impl LockError {
    /// Whether another owner holds the lock (as opposed to an I/O error).
    #[must_use]
    pub fn is_in_use(&self) -> bool {
        matches!(self, LockError::InUse { .. })
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::InUse { path, pid } => {
                write!(f, "{} is held by ", path.display())?;
                match pid {
                    Some(pid) if *pid == std::process::id() => {
                        write!(f, "another pipeline of this process (pid {pid})")?;
                    }
                    Some(pid) => write!(f, "another process (pid {pid})")?,
                    None => write!(f, "another process")?,
                }
                write!(
                    f,
                    ": one pipeline at a time may own this state; \
                     stop the other run or wait for it to end"
                )
            }
            LockError::Io { path, op, source } => {
                write!(f, "cannot {op} the lock file {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::InUse { .. } => None,
            LockError::Io { source, .. } => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_second_owner_is_refused_with_the_holders_pid_until_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = OwnerLock::acquire(&path).unwrap();
        let err = OwnerLock::acquire(&path).unwrap_err();
        match &err {
            LockError::InUse { path: p, pid } => {
                assert_eq!(p, &path);
                assert_eq!(*pid, Some(std::process::id()));
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        drop(first);
        let again = OwnerLock::acquire(&path).unwrap();
        assert_eq!(again.path(), path);
    }

    #[test]
    fn a_lock_in_another_file_system_refuses_a_second_owner_until_a_crash() {
        use etl_fs::SimFs;
        let fs = SimFs::new(0);
        fs.create_dir_all(Path::new("/state")).unwrap();
        let path = Path::new("/state/lock");
        let first = OwnerLock::acquire_in(&fs, path).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs.sync_dir(Path::new("/state")).unwrap();
        let err = OwnerLock::acquire_in(&fs, path).unwrap_err();
        assert!(err.is_in_use(), "{err}");
        fs.crash();
        // The holder died with the machine, and its lock with it.
        OwnerLock::acquire_in(&fs.process(), path).unwrap();
        drop(first);
    }
}
