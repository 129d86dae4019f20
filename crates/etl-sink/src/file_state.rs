//! The file sink's blocking core: open and recover, append, fsync, rotate.

use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use etl_fs::{FileHandle, Fs, Metadata, OpenOptions};
use etl_record::{Offset, OwnerLock, PartitionId};

use crate::file_progress::{
    Stored, last_segment, parent_dir, read_stored_for, replaced_since_recorded, side_files_apply,
    suffixed, sync_dir, write_stored,
};
use crate::file_recovery::{
    RecoveryPoint, SCAN_LIMIT, complete_prefix, cut_back, forget_point, read_point, truncate,
    undamaged_prefix, write_point,
};
use crate::{FileSinkConfig, Progress, SinkError};

mod locks;
pub(crate) use locks::OutputInUse;
use locks::{lock_data, lock_output};

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

#[derive(Debug)]
pub(crate) struct FileState {
    /// The file system everything goes through.
    fs: Arc<dyn Fs>,
    path: PathBuf,
    /// Where the side files (progress, recovery point) go: beside the
    /// file written, symlinks resolved; `path` for a device.
    side: PathBuf,
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
    /// At least once, on a regular file: the active file's recovery point
    /// (see [`crate::file_recovery`]), below which it is trusted after a
    /// crash. `None` when there is none to keep (exactly once, a device).
    point: Option<u64>,
    /// Whether bytes appended past `point` hold a NUL byte: then the next
    /// `fsync` stores the point, before the bytes are acknowledged.
    nul_past_point: bool,
}

fn open_active(fs: &dyn Fs, path: &Path) -> Result<Box<dyn FileHandle>, SinkError> {
    fs.open(
        path,
        &OpenOptions::new().read(true).append(true).create(true),
    )
    .map_err(|e| SinkError::io("open", path, e))
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
        let (lock, side) = if regular {
            let (lock, canonical) = lock_output(&*fs, path, &*file)?;
            // Opening may have created the file: its name is durable only
            // once its directory (the target's, through a symlink) is
            // fsynced, and every record reported durable in it depends on
            // it. So does the directory's own name, up to the root: the
            // runtime creates a missing output folder without syncing it.
            etl_fs::sync_folders_above(&*fs, &canonical)
                .map_err(|e| SinkError::io("fsync directory", &e.dir, e.source))?;
            (Some(lock), canonical)
        } else {
            (None, path.to_owned())
        };
        // A rotating sink writes, rotates and watches the file itself,
        // symlinks resolved once here: a rotation renames it to a segment
        // beside it and creates the next one there. Renaming a symlink
        // would move the link, leave the data it named behind as a
        // segment's target, and write on in the link's folder.
        let rotates = config.rotate_bytes.is_some() || config.rotate_after.is_some();
        let resolved = side.clone();
        let path = if regular && rotates {
            resolved.as_path()
        } else {
            path
        };
        let meta = file
            .metadata()
            .map_err(|e| SinkError::io("stat", path, e))?;
        let active = FileId::of(&meta);
        // The progress and the recovery point sit beside the file
        // written (`side`, symlinks resolved), whatever the name a run
        // gives it, and record its device and inode. A second name that
        // is a hard link has no such canonical form: see `side_files_apply`.
        let side_files_apply = side_files_apply(path, &meta, config.exactly_once)?;
        let mut segments = last_segment(&*fs, path)?;
        let mut keep = None;
        let tracks_point = regular && !config.exactly_once;
        let recorded = if tracks_point {
            read_point(&*fs, &side)?.filter(|_| side_files_apply)
        } else {
            if regular {
                // A point left by an at-least-once run does not describe
                // what exactly-once runs write after it: a later
                // at-least-once run must not find it.
                forget_point(&*fs, &side)?;
            }
            None
        };
        if let Some(point) = &recorded {
            // Numbering goes on from the recorded count, so a new segment
            // never takes the name of one moved away.
            segments = segments.max(point.segments);
        }
        let mut stored = Progress::new();
        if config.exactly_once
            && let Some(side) = read_stored_for(&*fs, path, &side)?
        {
            stored = side.progress.clone();
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
                    .open(&seg, &OpenOptions::new().read(true).write(true))
                    .map_err(|e| SinkError::io("open", &seg, e))?;
                let seg_meta = f.metadata().map_err(|e| SinkError::io("stat", &seg, e))?;
                let seg_len = seg_meta.len();
                if !side.describes(&seg_meta) {
                    return Err(replaced_since_recorded(&seg, &side));
                }
                if seg_len < side.length {
                    return Err(shorter_than_recorded(&seg, seg_len, side.length));
                }
                truncate(&*f, side.length, &seg)?;
                keep = Some(0);
            } else if segments <= side.segments {
                // Progress stored for another file (this one was renamed
                // over it since): cutting this one to the recorded length
                // would destroy what it holds. An empty one has nothing to
                // cut; below, it is shorter than recorded unless nothing was.
                if !side.describes(&meta) && !meta.is_empty() {
                    return Err(replaced_since_recorded(path, &side));
                }
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
        let len = meta.len();
        let trusted = recorded
            .filter(|p| (p.dev, p.ino) == (active.dev, active.ino))
            .map(|p| p.length);
        let len = match keep {
            // Records the progress covers are gone from the file: cutting
            // back would be silent loss.
            Some(keep) if len < keep => return Err(shorter_than_recorded(path, len, keep)),
            Some(keep) => keep,
            // Every acknowledged byte past the recovery point is whole
            // lines free of NUL bytes: the first line that is not was
            // never acknowledged, and neither was anything after it.
            None => match trusted {
                Some(point) if point <= len => undamaged_prefix(&*file, point, len, path)?,
                other => {
                    if let Some(point) = other {
                        tracing::warn!(path = %path.display(), len, point, "the output is shorter than its recovery point: it was truncated since the last run; keeping its complete lines");
                    }
                    // Without a point (an output of an older version, or
                    // a file replaced since), cut a partial trailing line.
                    complete_prefix(&*file, len, path)?
                }
            },
        };
        if file.metadata().map(|m| m.len()).unwrap_or(len) != len {
            tracing::warn!(path = %path.display(), len, "cutting the output back after a crash");
            truncate(&*file, len, path)?;
        }
        let point = if !tracks_point {
            None
        } else if trusted == Some(len) && recorded.is_some_and(|p| p.segments == segments) {
            Some(len)
        } else {
            // What a crash (or a killed run) left is trusted from now on:
            // make it durable before recording it so.
            file.sync_all()
                .map_err(|e| SinkError::io("fsync", path, e))?;
            let point = RecoveryPoint {
                dev: active.dev,
                ino: active.ino,
                segments,
                length: len,
            };
            write_point(&*fs, &side, &point)?;
            Some(len)
        };
        let now = Instant::now();
        let mut state = FileState {
            fs,
            path: path.to_owned(),
            side,
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
            point,
            nul_past_point: false,
        };
        if config.exactly_once {
            // Record the starting point at once, so a crash before the
            // first write cuts back to here and not to an older state.
            state.store()?;
        }
        Ok(state)
    }

    /// Record the active file's length as its recovery point; only once
    /// an `fsync` covered it.
    fn store_point(&mut self) -> Result<(), SinkError> {
        self.store_point_counting(self.segments)
    }

    /// [`store_point`](Self::store_point), recording `segments` finished
    /// segments.
    fn store_point_counting(&mut self, segments: u64) -> Result<(), SinkError> {
        let point = RecoveryPoint {
            dev: self.active.dev,
            ino: self.active.ino,
            segments,
            length: self.len,
        };
        write_point(&*self.fs, &self.side, &point)?;
        self.point = Some(self.len);
        self.nul_past_point = false;
        Ok(())
    }

    fn store(&mut self) -> Result<(), SinkError> {
        write_stored(
            &*self.fs,
            &self.side,
            &Stored {
                segments: self.segments,
                length: self.len,
                file: Some((self.active.dev, self.active.ino)),
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
        if self.point.is_some() && memchr::memchr(0, bytes).is_some() {
            self.nul_past_point = true;
        }
        // The file is opened to append: a truncation since the last write
        // would put this batch where committed bytes were, and a failed
        // write landing a prefix as long as the bytes cut would leave the
        // length the sink expects. One `fstat` a batch tells it first.
        self.check_len()?;
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
        let cut = match cut_back(&*self.file, before) {
            Ok(true) => self.file.metadata().is_ok_and(|m| m.len() == before),
            // Truncated under the sink between the check above and the
            // cut: lost output, not zeros to append behind.
            Ok(false) => {
                let found = self.file.metadata().map_or(0, |m| m.len());
                return self.poison(Lost::Resized {
                    expected: before,
                    found,
                });
            }
            Err(_) => false,
        };
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
        if let Some(point) = self.point
            && (self.nul_past_point || self.len.saturating_sub(point) >= SCAN_LIMIT)
            && let Err(e) = self.store_point()
        {
            return Err(self.poison_with(e));
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

    /// [`sync`](Self::sync), then record everything as the recovery
    /// point: the next run, after a stop that flushed, opens the output
    /// with nothing to check. A failed store of the point loses nothing:
    /// the point before it still holds.
    pub(crate) fn flush(&mut self) -> Result<(), SinkError> {
        self.sync()?;
        match self.point {
            Some(point) if point != self.len => self.store_point(),
            _ => Ok(()),
        }
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
        if let Err(e) = cut_back(&*self.file, durable).and_then(|_| self.file.sync_all()) {
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
        if self.point.is_some() {
            // The new segment's number is recorded before the segment
            // exists: after a crash between the rename and the point's
            // store below, the next run must not give the number again
            // once the segment was moved away.
            self.store_point_counting(next)?;
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
        // Symlinks were resolved at open: the side files stay beside it.
        self.side = self
            .fs
            .canonicalize(&self.path)
            .map_err(|e| SinkError::io("resolve", &self.path, e))?;
        self.opened_at = Instant::now();
        sync_dir(&*self.fs, parent_dir(&self.path))?;
        if self.config.exactly_once {
            self.store()?;
        } else if self.point.is_some() {
            self.store_point()?;
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
pub(crate) mod tests;

#[cfg(test)]
mod name_tests;

#[cfg(test)]
mod race_tests;
