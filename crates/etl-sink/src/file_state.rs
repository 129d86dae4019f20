//! The file sink's blocking core: open and recover, append, fsync, rotate.

use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use etl_fs::{FileHandle, Fs, Metadata, OpenOptions, TryLockError};
use etl_record::{LockError, Offset, OwnerLock, PartitionId};

use crate::file_progress::{Stored, parent_dir, read_stored, suffixed, sync_dir, write_stored};
use crate::{FileSinkConfig, Progress, SinkError};

/// One record of a batch as the exactly-once path sees it.
pub(crate) type Placed = (PartitionId, Offset, Range<usize>);

/// Which file a path names: device and inode. Where the platform has no
/// such numbers, every file compares equal and only a deleted path is
/// noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(meta: &Metadata) -> FileId {
        let (dev, ino) = meta.dev_ino();
        FileId { dev, ino }
    }
}

/// Why the sink can no longer trust the active file. Once set, every
/// operation fails with it: nothing written to the file is reported
/// durable again.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Lost {
    /// Its path names no file any more.
    Deleted,
    /// Its path names another file.
    Replaced,
    /// It is not the length the sink wrote: truncated in place (shorter),
    /// or appended to by another writer (longer).
    Resized { expected: u64, found: u64 },
    /// A write or `fsync` failed while some bytes were not yet durable:
    /// the kernel may have dropped them and report the next `fsync` a
    /// success.
    Failed {
        op: &'static str,
        path: PathBuf,
        kind: io::ErrorKind,
        message: String,
    },
}

/// Another sink writes the output, under this name or another one.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot write {}: the file ({}) is already written by another sink, under this name or \
     another (a symlink or a hard link to it): {source}",
    path.display(),
    file.display()
)]
struct OutputInUse {
    /// The configured path.
    path: PathBuf,
    /// The file it names, symlinks resolved.
    file: PathBuf,
    #[source]
    source: LockError,
}

#[derive(Debug)]
pub(crate) struct FileState {
    /// The file system everything goes through.
    fs: Arc<dyn Fs>,
    path: PathBuf,
    config: FileSinkConfig,
    /// Held for the sink's life: this sink is the output's only writer
    /// (none for a device such as `/dev/full`: there is no file to own).
    /// The open data file is locked too (see [`lock_data`]).
    _lock: Option<OwnerLock>,
    file: Box<dyn FileHandle>,
    /// Whether the output is a regular file (not a device such as
    /// `/dev/null`, whose length says nothing about what was written).
    regular: bool,
    /// The file `file` is; `path` must still name it, at the length
    /// written, when data is reported durable.
    active: FileId,
    /// Set once the file cannot be trusted (see [`Lost`]): every later
    /// operation fails.
    lost: Option<Lost>,
    /// Length of the active file.
    len: u64,
    /// How much of the active file the last good `fsync` of it covered
    /// (what a failure cuts it back to, see [`FileState::cut_to_durable`]).
    fsynced_len: u64,
    /// Bytes appended since open, across segments; `synced` of them are
    /// durable.
    pub(crate) written: u64,
    pub(crate) synced: u64,
    pub(crate) last_sync: Instant,
    /// `fsync`s done since open (for tests).
    #[cfg(test)]
    pub(crate) syncs: u64,
    opened_at: Instant,
    /// Finished segments: `<path>.1` ..= `<path>.<segments>`.
    segments: u64,
    /// Progress of everything appended (exactly-once mode).
    appended: Progress,
    /// Progress durably stored with the data.
    pub(crate) stored: Progress,
}

fn open_active(fs: &dyn Fs, path: &Path) -> Result<Box<dyn FileHandle>, SinkError> {
    fs.open(
        path,
        &OpenOptions::new().read(true).append(true).create(true),
    )
    .map_err(|e| SinkError::io("open", path, e))
}

/// Take the output's locks before anything reads or cuts it: the lock
/// file beside the file `path` names, symlinks resolved
/// (`<canonical path>.lock`, which names the holder's pid), and a lock on
/// the open data file itself (see [`lock_data`]). Locks keyed by the
/// configured name would let a second name for the same file (a symlink,
/// a hard link) in as a second writer. `file` is the open output.
/// Returns the lock and the canonical path.
fn lock_output(
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
fn lock_data(file: &dyn FileHandle, path: &Path) -> Result<(), LockError> {
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

/// Highest `n` such that `<path>.<n>` exists.
fn last_segment(fs: &dyn Fs, path: &Path) -> Result<u64, SinkError> {
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

/// Length of the longest prefix of `file` that ends with a line break.
fn complete_prefix(file: &dyn FileHandle, len: u64, path: &Path) -> Result<u64, SinkError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        read_exact_at(file, &mut buf[..n], start).map_err(|e| SinkError::io("read", path, e))?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The error for an output shorter than its progress records: records
/// stored as written are gone from it (truncated, or replaced, between
/// runs).
fn shorter_than_recorded(path: &Path, len: u64, recorded: u64) -> SinkError {
    SinkError::OutputLost {
        path: path.to_owned(),
        what: format!(
            "is shorter than its progress records ({len} bytes, {recorded} recorded): it was \
             truncated or replaced since the last run; restore it, or remove {} and reset the \
             offsets to write it again",
            crate::file_progress::progress_path(path).display()
        ),
    }
}

/// Fill `buf` from `at`.
fn read_exact_at(file: &dyn FileHandle, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, at) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn truncate(file: &dyn FileHandle, len: u64, path: &Path) -> Result<(), SinkError> {
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| SinkError::io("truncate", path, e))
}

impl FileState {
    pub(crate) fn open(
        fs: Arc<dyn Fs>,
        path: &Path,
        config: FileSinkConfig,
    ) -> Result<FileState, SinkError> {
        // An output that exists and is not a regular file (a device, a
        // pipe) holds no state to protect, and a lock file would land
        // beside it (in `/dev`, shared by every writer of `/dev/full`): no
        // lock.
        let regular = !fs.metadata(path).is_ok_and(|m| !m.is_file());
        // Opened (created) before anything else, so that the locks are
        // taken on the file itself; opening cuts nothing.
        let file = open_active(&*fs, path)?;
        let lock = if regular {
            let (lock, canonical) = lock_output(&*fs, path, &*file)?;
            // Opening may have created the file: its name is durable only
            // once its directory (the target's, through a symlink) is
            // fsynced, and every record reported durable in it depends on
            // it.
            sync_dir(&*fs, parent_dir(&canonical))?;
            Some(lock)
        } else {
            None
        };
        let mut segments = last_segment(&*fs, path)?;
        let mut keep = None;
        let mut stored = Progress::new();
        if config.exactly_once
            && let Some(side) = read_stored(&*fs, path)?
        {
            stored = side.progress;
            // A recorded count at the limit has no next: it cannot come
            // from a rotation, and must not wrap.
            let Some(after) = side.segments.checked_add(1) else {
                return Err(SinkError::CorruptProgress {
                    path: path.to_owned(),
                    reason: format!("records {} finished segments", side.segments),
                });
            };
            if segments == after {
                // A crash after a rotation renamed the active file but
                // before it was recorded: that segment holds the recorded
                // length, and the active file starts empty.
                let seg = suffixed(path, &segments.to_string());
                let f = fs
                    .open(&seg, &OpenOptions::new().write(true))
                    .map_err(|e| SinkError::io("open", &seg, e))?;
                let seg_len = f
                    .metadata()
                    .map_err(|e| SinkError::io("stat", &seg, e))?
                    .len();
                if seg_len < side.length {
                    return Err(shorter_than_recorded(&seg, seg_len, side.length));
                }
                truncate(&*f, side.length, &seg)?;
                keep = Some(0);
            } else if segments <= side.segments {
                // Finished segments are never read or cut again: shipping
                // them away (retention) is routine, and only the active
                // file's length counts. The numbering goes on from the
                // recorded count, so a new segment never takes the name of
                // one shipped.
                keep = Some(side.length);
            } else {
                return Err(SinkError::CorruptProgress {
                    path: path.to_owned(),
                    reason: format!(
                        "records {} finished segments, {} exist",
                        side.segments, segments
                    ),
                });
            }
            segments = segments.max(side.segments);
        }
        let meta = file
            .metadata()
            .map_err(|e| SinkError::io("stat", path, e))?;
        let active = FileId::of(&meta);
        let len = meta.len();
        let len = match keep {
            // Records the progress covers are gone from the file: cutting
            // back would be silent loss.
            Some(keep) if len < keep => return Err(shorter_than_recorded(path, len, keep)),
            Some(keep) => keep,
            // Without recorded progress, cut a partial trailing record.
            None => complete_prefix(&*file, len, path)?,
        };
        if file.metadata().map(|m| m.len()).unwrap_or(len) != len {
            tracing::warn!(path = %path.display(), len, "cutting the output back after a crash");
            truncate(&*file, len, path)?;
        }
        let now = Instant::now();
        let mut state = FileState {
            fs,
            path: path.to_owned(),
            config,
            _lock: lock,
            file,
            regular,
            active,
            lost: None,
            len,
            fsynced_len: len,
            written: 0,
            synced: 0,
            last_sync: now,
            #[cfg(test)]
            syncs: 0,
            opened_at: now,
            segments,
            appended: stored.clone(),
            stored,
        };
        if config.exactly_once {
            // Record the starting point at once, so a crash before the
            // first write cuts back to here and not to an older state.
            state.store()?;
        }
        Ok(state)
    }

    fn store(&mut self) -> Result<(), SinkError> {
        write_stored(
            &*self.fs,
            &self.path,
            &Stored {
                segments: self.segments,
                length: self.len,
                progress: self.appended.clone(),
            },
        )
    }

    /// Append a batch's bytes (in exactly-once mode only the records not
    /// yet appended); returns the end of the data in `written` terms. A
    /// failed append is cut back off before the error is returned; when
    /// it cannot be, or bytes appended earlier are not durable yet, the
    /// file is lost.
    pub(crate) fn append(
        &mut self,
        bytes: &Bytes,
        placed: Option<&[Placed]>,
    ) -> Result<u64, SinkError> {
        self.check_usable()?;
        self.maybe_rotate(bytes.len() as u64)?;
        let before = self.len;
        let result = match placed {
            None => self.write_file(bytes).map(|()| bytes.len() as u64),
            Some(placed) => {
                let mut n = 0u64;
                let mut res = Ok(());
                for (partition, offset, range) in placed {
                    if self
                        .appended
                        .get(*partition)
                        .is_some_and(|next| *offset < next)
                    {
                        continue;
                    }
                    if let Some(slice) = bytes.get(range.clone()) {
                        res = self.write_file(slice);
                        if res.is_err() {
                            break;
                        }
                        n += slice.len() as u64;
                    }
                }
                res.map(|()| n)
            }
        };
        match result {
            Ok(n) => {
                self.len += n;
                self.written += n;
                // The file is opened to append: bytes another writer
                // appended (or a truncation) would put these somewhere
                // else than the recorded length says.
                self.check_len()?;
                if let Some(placed) = placed {
                    for (partition, offset, _) in placed {
                        self.appended.advance(*partition, offset.next());
                    }
                }
                Ok(self.written)
            }
            Err(e) => Err(self.undo_append(before, e)),
        }
    }

    /// Cut a failed append's bytes back off, so that a retry does not
    /// find half a batch, and say whether the retry may be trusted: only
    /// when the cut is known to have happened and every byte appended
    /// before is durable. Otherwise the file is lost: a write error can
    /// come from a failed writeback of earlier bytes, which the next
    /// `fsync` would no longer report.
    fn undo_append(&mut self, before: u64, e: io::Error) -> SinkError {
        if !self.regular {
            // A device has no length to restore and no bytes to lose.
            return SinkError::io("append to", &self.path, e);
        }
        // Shorter than the sink wrote it: another program truncated it.
        // Cutting "back" would lengthen it with zeros and hide that.
        if let Ok(meta) = self.file.metadata()
            && meta.len() < before
        {
            return self.poison(Lost::Resized {
                expected: before,
                found: meta.len(),
            });
        }
        let cut = self
            .file
            .set_len(before)
            .and_then(|()| self.file.metadata())
            .is_ok_and(|m| m.len() == before);
        if cut && self.synced == self.written && self.stored == self.appended {
            SinkError::io("append to", &self.path, e)
        } else {
            self.failed("append to", e)
        }
    }

    /// Make everything appended durable (and, in exactly-once mode, store
    /// the progress with it).
    pub(crate) fn sync(&mut self) -> Result<(), SinkError> {
        self.check_usable()?;
        if self.synced == self.written && self.stored == self.appended {
            return self.check_active();
        }
        if let Err(e) = self.sync_file() {
            // Never retried: Linux marks the pages of a failed writeback
            // clean and reports the error once, so the next `fsync` would
            // succeed without the bytes.
            return Err(self.failed("fsync", e));
        }
        self.fsynced_len = self.len;
        // Data is durable output only in a file its path still names, at
        // the length written: check after the fsync, the last moment
        // before it is reported.
        self.check_active()?;
        if self.config.exactly_once {
            if let Err(e) = self.store() {
                return Err(self.poison_with(e));
            }
            self.stored = self.appended.clone();
        }
        // Only now is everything appended durable, progress included.
        self.synced = self.written;
        self.last_sync = Instant::now();
        #[cfg(test)]
        {
            self.syncs += 1;
        }
        Ok(())
    }

    /// Fail if the file is lost.
    fn check_usable(&self) -> Result<(), SinkError> {
        match &self.lost {
            Some(lost) => Err(self.lost_error(lost)),
            None => Ok(()),
        }
    }

    /// Fail unless `path` still names the file being written, at the
    /// length written. Once it does not (deleted, another file renamed
    /// over it, truncated, appended to by another writer), it never will
    /// again for this sink: appending to a file that does not hold what
    /// was written would lose records while reporting them written.
    fn check_active(&mut self) -> Result<(), SinkError> {
        self.check_usable()?;
        let lost = match self.fs.metadata(&self.path) {
            Ok(meta) if FileId::of(&meta) != self.active => Lost::Replaced,
            Ok(meta) if self.regular && meta.len() != self.len => Lost::Resized {
                expected: self.len,
                found: meta.len(),
            },
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Lost::Deleted,
            Err(e) => return Err(SinkError::io("stat", &self.path, e)),
        };
        Err(self.poison(lost))
    }

    /// Fail unless the open file is as long as the sink wrote it.
    fn check_len(&mut self) -> Result<(), SinkError> {
        if !self.regular {
            return Ok(());
        }
        match self.file.metadata() {
            Ok(meta) if meta.len() == self.len => Ok(()),
            Ok(meta) => Err(self.poison(Lost::Resized {
                expected: self.len,
                found: meta.len(),
            })),
            // Where the bytes landed is unknown.
            Err(e) => Err(self.failed("stat", e)),
        }
    }

    /// Mark the file lost: the one place a failure becomes final for this
    /// sink. Returns the error every later operation fails with.
    fn poison(&mut self, lost: Lost) -> SinkError {
        let err = self.lost_error(&lost);
        if self.lost.is_none() {
            tracing::error!(error = %err, "the file sink's output cannot be trusted; no further write can succeed");
            if matches!(lost, Lost::Failed { .. }) {
                self.cut_to_durable();
            }
            self.lost = Some(lost);
        }
        err
    }

    /// After a failed write or `fsync`, cut the active file back to what
    /// the last good `fsync` of it covered. Writeback fails page by page:
    /// the bytes after it may hold lost pages (zeros) between lines that
    /// reached the disk whole, and a next run that keeps every complete
    /// line (without recorded progress) would keep them as output. Bytes
    /// an `fsync` covered stay, reported durable or not: a progress store
    /// that failed after its rename may record them. Best effort: the
    /// file is lost whatever happens here.
    fn cut_to_durable(&mut self) {
        if !self.regular {
            return;
        }
        let durable = self.fsynced_len;
        // Never lengthen a file: a rotation cut short may have left a new,
        // shorter active file.
        if !self.file.metadata().is_ok_and(|m| m.len() > durable) {
            return;
        }
        if let Err(e) = self
            .file
            .set_len(durable)
            .and_then(|()| self.file.sync_all())
        {
            tracing::warn!(path = %self.path.display(), durable, error = %e, "cannot cut the lost output back to its durable length; the next run cuts back to its last complete line");
        }
    }

    /// Mark the file lost after `op` on it failed with `e`.
    fn failed(&mut self, op: &'static str, e: io::Error) -> SinkError {
        let path = self.path.clone();
        self.poison(Lost::Failed {
            op,
            path,
            kind: e.kind(),
            message: e.to_string(),
        })
    }

    /// Mark the file lost after a step that writes to it (or beside it:
    /// the progress file, a rename) failed with `err`.
    fn poison_with(&mut self, err: SinkError) -> SinkError {
        match err {
            SinkError::Io { op, path, source } => self.poison(Lost::Failed {
                op,
                path,
                kind: source.kind(),
                message: source.to_string(),
            }),
            // Already lost.
            err @ (SinkError::OutputLost { .. } | SinkError::NotDurable { .. }) => err,
            err => {
                let path = self.path.clone();
                self.poison(Lost::Failed {
                    op: "write",
                    path,
                    kind: io::ErrorKind::Other,
                    message: err.to_string(),
                })
            }
        }
    }

    fn lost_error(&self, lost: &Lost) -> SinkError {
        let what = match lost {
            Lost::Deleted => "was deleted while the sink was writing it".to_owned(),
            Lost::Replaced => {
                "was replaced by another file while the sink was writing it".to_owned()
            }
            Lost::Resized { expected, found } if found < expected => format!(
                "was truncated while the sink was writing it ({found} bytes, the sink had \
                 written {expected}; copy-truncate rotation loses records: use rotate_bytes or \
                 rotate_interval)"
            ),
            Lost::Resized { expected, found } => format!(
                "was appended to by another writer while the sink was writing it ({found} bytes, \
                 the sink had written {expected})"
            ),
            Lost::Failed {
                op,
                path,
                kind,
                message,
            } => {
                return SinkError::NotDurable {
                    op,
                    path: path.clone(),
                    source: io::Error::new(*kind, message.clone()),
                };
            }
        };
        SinkError::OutputLost {
            path: self.path.clone(),
            what,
        }
    }

    /// Write `bytes` to the file. The one place a data write's error
    /// comes back.
    fn write_file(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)
    }

    /// `fdatasync` the file. The one place its error comes back.
    fn sync_file(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn maybe_rotate(&mut self, incoming: u64) -> Result<(), SinkError> {
        if self.len == 0 {
            return Ok(());
        }
        let by_size = self
            .config
            .rotate_bytes
            .is_some_and(|max| self.len + incoming > max);
        let by_age = self
            .config
            .rotate_after
            .is_some_and(|age| self.opened_at.elapsed() >= age);
        if !(by_size || by_age) {
            return Ok(());
        }
        // The finished segment is durable (and recorded) before it moves.
        self.sync()?;
        // A rotation cut short leaves the path naming no file, or a new
        // one not yet durable in its directory: nothing more is written.
        self.rotate().map_err(|e| self.poison_with(e))
    }

    fn rotate(&mut self) -> Result<(), SinkError> {
        // Without a next number the rename would wrap to `<path>.0`.
        let Some(next) = self.segments.checked_add(1) else {
            return Err(SinkError::io(
                "rename",
                &self.path,
                io::Error::other(format!(
                    "no segment number follows {}, the highest there is",
                    self.segments
                )),
            ));
        };
        let seg = suffixed(&self.path, &next.to_string());
        // A rename replaces its target: a file already there (a segment
        // this sink failed to count, or one another program put there)
        // would be gone, records and all.
        if self.fs.symlink_metadata(&seg).is_ok() {
            return Err(SinkError::io(
                "rename",
                &self.path,
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("the next segment {} already exists", seg.display()),
                ),
            ));
        }
        self.fs
            .rename(&self.path, &seg)
            .map_err(|e| SinkError::io("rename", &self.path, e))?;
        sync_dir(&*self.fs, parent_dir(&self.path))?;
        let file = open_active(&*self.fs, &self.path)?;
        lock_data(&*file, &self.path).map_err(SinkError::permanent)?;
        self.file = file;
        self.active = FileId::of(
            &self
                .file
                .metadata()
                .map_err(|e| SinkError::io("stat", &self.path, e))?,
        );
        self.segments = next;
        self.len = 0;
        self.fsynced_len = 0;
        self.opened_at = Instant::now();
        sync_dir(&*self.fs, parent_dir(&self.path))?;
        if self.config.exactly_once {
            self.store()?;
        }
        Ok(())
    }

    pub(crate) fn segments(&self) -> u64 {
        self.segments
    }

    /// The file system the output is on.
    pub(crate) fn fs(&self) -> &Arc<dyn Fs> {
        &self.fs
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::FsyncPolicy;
    use etl_fs::{SimFs, SimOp};
    use std::time::Duration;

    pub(crate) const EIO: i32 = 5;
    const ENOSPC: i32 = 28;

    fn config(exactly_once: bool) -> FileSinkConfig {
        FileSinkConfig {
            // Writes wait for an explicit `sync`.
            fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
            exactly_once,
            ..FileSinkConfig::default()
        }
    }

    /// A simulated disk with the folder `/out`, durable.
    pub(crate) fn disk(seed: u64) -> SimFs {
        let sim = SimFs::new(seed);
        sim.create_dir_all(Path::new("/out")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        sim
    }

    pub(crate) const PATH: &str = "/out/out.ndjson";

    /// A state on `fs` whose writes wait for an explicit `sync`.
    fn open(fs: &SimFs, exactly_once: bool) -> FileState {
        FileState::open(Arc::new(fs.clone()), Path::new(PATH), config(exactly_once)).unwrap()
    }

    /// Append the line of record `offset` of partition 0.
    fn append(state: &mut FileState, offset: i64) -> Result<u64, SinkError> {
        let line = Bytes::from(format!("{{\"o\":{offset}}}\n"));
        let placed = [(PartitionId(0), Offset(offset), 0..line.len())];
        let exactly_once = state.config.exactly_once;
        state.append(&line, exactly_once.then_some(&placed[..]))
    }

    fn assert_lost(err: &SinkError, what: &str) {
        assert!(
            matches!(err, SinkError::NotDurable { .. }),
            "{what}: {err:?}"
        );
        assert!(!err.is_retryable(), "{what}: {err:?} is retried");
        assert!(err.is_io(), "{what}: {err:?}");
    }

    #[test]
    fn a_failed_append_with_bytes_not_yet_durable_makes_the_file_lost() {
        // A write error can be the report of a failed writeback of the
        // bytes before it: the next fsync would not report it again.
        let sim = disk(1);
        let mut state = open(&sim, false);
        append(&mut state, 0).unwrap();
        sim.fail_next(SimOp::Write, EIO);
        let err = append(&mut state, 1).unwrap_err();
        let retried = append(&mut state, 1).and_then(|_| state.sync());
        assert!(retried.is_err(), "the retried append was reported durable");
        assert_lost(&err, "the failed append");
        assert_lost(&append(&mut state, 1).unwrap_err(), "the retried append");
        assert_lost(&state.sync().unwrap_err(), "the fsync after it");
        assert_eq!(state.synced, 0, "nothing is reported durable");
    }

    #[test]
    fn a_failed_append_to_a_file_truncated_under_the_sink_is_lost_output_not_zeros() {
        // Cutting the failed append back to the length the sink wrote
        // would lengthen a file another program truncated with zeros, and
        // the truncation would go unnoticed.
        for exactly_once in [false, true] {
            let sim = disk(3);
            let mut state = open(&sim, exactly_once);
            append(&mut state, 0).unwrap();
            state.sync().unwrap();
            sim.apply(&etl_fs::Mutation::Truncate {
                path: PATH.into(),
                len: 0,
            })
            .unwrap();
            sim.fail_next(SimOp::Write, ENOSPC);
            let err = append(&mut state, 1).unwrap_err();
            assert!(
                matches!(err, SinkError::OutputLost { .. }),
                "exactly_once {exactly_once}: {err:?}"
            );
            assert!(append(&mut state, 1).is_err(), "the sink wrote on");
            let bytes = sim.read(Path::new(PATH)).unwrap();
            assert!(
                !bytes.contains(&0),
                "exactly_once {exactly_once}: the file was lengthened with zeros: {bytes:?}"
            );
        }
    }

    #[test]
    fn a_failed_append_after_a_good_fsync_is_cut_back_and_may_be_retried() {
        // With every byte before it durable, a failed append (a full
        // disk) is cut back off and retried: the disk may get room.
        for seed in 0..8 {
            let sim = disk(seed);
            let mut state = open(&sim, false);
            append(&mut state, 0).unwrap();
            state.sync().unwrap();
            sim.fail_next(SimOp::Write, ENOSPC);
            let err = append(&mut state, 1).unwrap_err();
            assert!(err.is_retryable(), "{err:?}");
            assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"{\"o\":0}\n");
            append(&mut state, 1).unwrap();
            state.sync().unwrap();
            sim.crash();
            assert_eq!(
                sim.process().read(Path::new(PATH)).unwrap(),
                b"{\"o\":0}\n{\"o\":1}\n",
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_created_output_is_durable_in_its_directory_before_its_data_is() {
        // An fsync of a new file does not make its name durable: after a
        // power loss the file, and every record acknowledged in it, may
        // be gone. Through a symlink the file is created in the target's
        // directory, not the link's.
        for exactly_once in [false, true] {
            for via_link in [false, true] {
                let sim = disk(3);
                let path = if via_link {
                    sim.create_dir_all(Path::new("/links")).unwrap();
                    sim.symlink(Path::new(PATH), Path::new("/links/out.ndjson"))
                        .unwrap();
                    sim.sync_dir(Path::new("/links")).unwrap();
                    sim.sync_dir(Path::new("/")).unwrap();
                    PathBuf::from("/links/out.ndjson")
                } else {
                    PathBuf::from(PATH)
                };
                let mut state =
                    FileState::open(Arc::new(sim.clone()), &path, config(exactly_once)).unwrap();
                append(&mut state, 0).unwrap();
                state.sync().unwrap();
                sim.crash();
                assert_eq!(
                    sim.process().read(Path::new(PATH)).ok().as_deref(),
                    Some(&b"{\"o\":0}\n"[..]),
                    "exactly_once {exactly_once}, through a link {via_link}: a record \
                     reported durable was gone after a crash"
                );
            }
        }
    }

    #[test]
    fn a_progress_store_failing_after_its_rename_leaves_the_data_it_records() {
        // The directory's fsync fails after the new progress took the old
        // one's place: the next run finds it, and the data it records
        // (fsynced before it) must still be there.
        let sim = disk(4);
        let mut state = open(&sim, true);
        append(&mut state, 0).unwrap();
        state.sync().unwrap();
        append(&mut state, 1).unwrap();
        sim.fail_next(SimOp::SyncDir, EIO);
        assert_lost(&state.sync().unwrap_err(), "the failed store");
        drop(state);
        let state = open(&sim, true);
        assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(2)));
        assert_eq!(
            sim.read(Path::new(PATH)).unwrap(),
            b"{\"o\":0}\n{\"o\":1}\n"
        );
    }

    #[test]
    fn a_failed_progress_store_makes_the_file_lost() {
        let sim = disk(5);
        let mut state = open(&sim, true);
        append(&mut state, 0).unwrap();
        state.sync().unwrap();
        append(&mut state, 1).unwrap();
        // The data's fsync succeeds; the progress file's write fails.
        sim.fail_next(SimOp::Write, EIO);
        let err = state.sync().unwrap_err();
        assert!(
            state.sync().is_err(),
            "the retried store was reported durable"
        );
        assert_lost(&err, "the failed store");
        assert_lost(&state.sync().unwrap_err(), "the retried store");
        assert_lost(&append(&mut state, 2).unwrap_err(), "a later append");
        assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(1)));
        drop(state);
        // The next run cuts back to what the last good store recorded.
        let state = open(&sim, true);
        assert_eq!(state.stored.get(PartitionId(0)), Some(Offset(1)));
        assert_eq!(sim.read(Path::new(PATH)).unwrap(), b"{\"o\":0}\n");
    }

    #[test]
    fn a_crash_keeps_every_record_reported_durable_and_no_partial_line() {
        // Whatever a crash keeps of the unsynced bytes (nothing, some
        // whole writes, a torn one), the next run finds every record a
        // sync reported, then whole lines only; exactly-once finds each
        // record once, in order.
        for seed in 0..64 {
            for exactly_once in [false, true] {
                let case = format!("seed {seed}, exactly_once {exactly_once}");
                let sim = disk(seed);
                sim.set_faults(etl_fs::SimFaults {
                    torn: 400,
                    kept: 400,
                    dirs_kept: 500,
                    ..etl_fs::SimFaults::default()
                });
                let mut state = open(&sim, exactly_once);
                let synced_through = 3 + seed % 5;
                for o in 0..synced_through {
                    append(&mut state, i64::try_from(o).unwrap()).unwrap();
                    if o % 2 == 0 {
                        state.sync().unwrap();
                    }
                }
                state.sync().unwrap();
                for o in synced_through..synced_through + 3 {
                    append(&mut state, i64::try_from(o).unwrap()).unwrap();
                }
                sim.crash();
                let fs = sim.process();
                let state =
                    FileState::open(Arc::new(fs.clone()), Path::new(PATH), config(exactly_once))
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                let bytes = fs.read(Path::new(PATH)).unwrap();
                assert!(
                    bytes.is_empty() || bytes.ends_with(b"\n"),
                    "{case}: a partial line is left: {bytes:?}"
                );
                // At least once keeps the unsynced lines a crash kept,
                // whole or torn (lost bytes read as zeros): they were
                // never acknowledged and are written again. Exactly once
                // keeps only what its progress records.
                let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
                let offsets: Vec<u64> = lines
                    .iter()
                    .map_while(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
                    .map(|v| v["o"].as_u64().unwrap())
                    .collect();
                assert!(
                    offsets.len() >= usize::try_from(synced_through).unwrap(),
                    "{case}: {offsets:?}"
                );
                assert!(
                    offsets.iter().copied().eq(0..offsets.len() as u64),
                    "{case}: {offsets:?}"
                );
                if exactly_once {
                    assert_eq!(offsets.len(), lines.len(), "{case}: a torn line is kept");
                    let next = state.stored.get(PartitionId(0)).unwrap_or(Offset(0));
                    assert_eq!(
                        offsets,
                        (0..u64::try_from(next.0).unwrap()).collect::<Vec<_>>(),
                        "{case}: the output holds what its progress records, once"
                    );
                }
            }
        }
    }
}
