//! The file sink's blocking core: open and recover, append, fsync, rotate.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
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
    #[cfg(unix)]
    fn of(meta: &Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    #[cfg(not(unix))]
    fn of(_meta: &Metadata) -> FileId {
        FileId { dev: 0, ino: 0 }
    }
}

/// How the active file was lost while the sink had it open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    Deleted,
    Replaced,
}

#[derive(Debug)]
pub(crate) struct FileState {
    path: PathBuf,
    config: FileSinkConfig,
    /// Held for the sink's life: this sink is the output's only writer
    /// (none for a device such as `/dev/full`: there is no file to own).
    _lock: Option<OwnerLock>,
    file: File,
    /// The file `file` is; `path` must still name it when data is
    /// reported durable.
    active: FileId,
    /// Set once `path` no longer names `file`: every later write fails.
    lost: Option<Lost>,
    /// Length of the active file.
    len: u64,
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

fn open_active(path: &Path) -> Result<File, SinkError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| SinkError::io("open", path, e))
}

/// Take the output's lock, `<path>.lock`, before anything reads or cuts
/// the output. An output that exists and is not a regular file (a device,
/// a pipe) holds no state to protect, and `<path>.lock` would land beside
/// it (in `/dev`, shared by every writer of `/dev/full`): no lock.
fn lock_output(path: &Path) -> Result<Option<OwnerLock>, SinkError> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Ok(None);
    }
    OwnerLock::acquire(suffixed(path, "lock"))
        .map(Some)
        .map_err(|e| match e {
            LockError::Io { path, op, source } => SinkError::io(op, path, source),
            in_use => SinkError::permanent(in_use),
        })
}

/// Highest `n` such that `<path>.<n>` exists.
fn last_segment(path: &Path) -> Result<u64, SinkError> {
    let dir = parent_dir(path);
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(0);
    };
    let prefix = format!("{name}.");
    let entries = std::fs::read_dir(dir).map_err(|e| SinkError::io("list", dir, e))?;
    let mut last = 0;
    for entry in entries.flatten() {
        if let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|n| n.parse::<u64>().ok())
        {
            last = last.max(n);
        }
    }
    Ok(last)
}

/// Length of the longest prefix of `file` that ends with a line break.
fn complete_prefix(file: &mut File, len: u64, path: &Path) -> Result<u64, SinkError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        file.seek(SeekFrom::Start(start))
            .and_then(|_| file.read_exact(&mut buf[..n]))
            .map_err(|e| SinkError::io("read", path, e))?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

fn truncate(file: &File, len: u64, path: &Path) -> Result<(), SinkError> {
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| SinkError::io("truncate", path, e))
}

impl FileState {
    pub(crate) fn open(path: &Path, config: FileSinkConfig) -> Result<FileState, SinkError> {
        let lock = lock_output(path)?;
        let mut segments = last_segment(path)?;
        let mut keep = None;
        let mut stored = Progress::new();
        if config.exactly_once
            && let Some(side) = read_stored(path)?
        {
            stored = side.progress;
            if segments == side.segments + 1 {
                // A crash after a rotation renamed the active file but
                // before it was recorded: that segment holds the recorded
                // length, and the active file starts empty.
                let seg = suffixed(path, &segments.to_string());
                let f = OpenOptions::new()
                    .write(true)
                    .open(&seg)
                    .map_err(|e| SinkError::io("open", &seg, e))?;
                truncate(&f, side.length, &seg)?;
                keep = Some(0);
            } else if segments == side.segments {
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
        let mut file = open_active(path)?;
        let meta = file
            .metadata()
            .map_err(|e| SinkError::io("stat", path, e))?;
        let active = FileId::of(&meta);
        let len = meta.len();
        let len = match keep {
            Some(keep) if len < keep => {
                return Err(SinkError::CorruptProgress {
                    path: path.to_owned(),
                    reason: format!("records {keep} bytes, the file has {len}"),
                });
            }
            Some(keep) => keep,
            // Without recorded progress, cut a partial trailing record.
            None => complete_prefix(&mut file, len, path)?,
        };
        if file.metadata().map(|m| m.len()).unwrap_or(len) != len {
            tracing::warn!(path = %path.display(), len, "cutting the output back after a crash");
            truncate(&file, len, path)?;
        }
        let now = Instant::now();
        let state = FileState {
            path: path.to_owned(),
            config,
            _lock: lock,
            file,
            active,
            lost: None,
            len,
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

    fn store(&self) -> Result<(), SinkError> {
        write_stored(
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
    /// failed append is cut back off before the error is returned.
    pub(crate) fn append(
        &mut self,
        bytes: &Bytes,
        placed: Option<&[Placed]>,
    ) -> Result<u64, SinkError> {
        if let Some(lost) = self.lost {
            return Err(self.lost_error(lost));
        }
        self.maybe_rotate(bytes.len() as u64)?;
        let before = self.len;
        let result = match placed {
            None => self.file.write_all(bytes).map(|()| bytes.len() as u64),
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
                        res = self.file.write_all(slice);
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
                if let Some(placed) = placed {
                    for (partition, offset, _) in placed {
                        self.appended.advance(*partition, offset.next());
                    }
                }
                Ok(self.written)
            }
            Err(e) => {
                // Best effort: a retry must not find half a batch.
                let _ = self.file.set_len(before);
                Err(SinkError::io("append to", &self.path, e))
            }
        }
    }

    /// Make everything appended durable (and, in exactly-once mode, store
    /// the progress with it).
    pub(crate) fn sync(&mut self) -> Result<(), SinkError> {
        if self.synced == self.written && self.stored == self.appended {
            return self.check_active();
        }
        self.file
            .sync_data()
            .map_err(|e| SinkError::io("fsync", &self.path, e))?;
        // Data is durable output only in a file its path still names:
        // check after the fsync, the last moment before it is reported.
        self.check_active()?;
        if self.config.exactly_once {
            self.store()?;
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

    /// Fail unless `path` still names the file being written. Once it
    /// does not (deleted, or another file renamed over it), it never will
    /// again for this sink: appending to a file no path names would lose
    /// every record while reporting it written.
    fn check_active(&mut self) -> Result<(), SinkError> {
        if let Some(lost) = self.lost {
            return Err(self.lost_error(lost));
        }
        let lost = match std::fs::metadata(&self.path) {
            Ok(meta) if FileId::of(&meta) == self.active => return Ok(()),
            Ok(_) => Lost::Replaced,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Lost::Deleted,
            Err(e) => return Err(SinkError::io("stat", &self.path, e)),
        };
        self.lost = Some(lost);
        let err = self.lost_error(lost);
        tracing::error!(error = %err, "the file sink's output is gone; no further write can succeed");
        Err(err)
    }

    fn lost_error(&self, lost: Lost) -> SinkError {
        let what = match lost {
            Lost::Deleted => "deleted",
            Lost::Replaced => "replaced by another file",
        };
        SinkError::OutputLost {
            path: self.path.clone(),
            what,
        }
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
        let next = self.segments + 1;
        let seg = suffixed(&self.path, &next.to_string());
        std::fs::rename(&self.path, &seg).map_err(|e| SinkError::io("rename", &self.path, e))?;
        sync_dir(parent_dir(&self.path))?;
        self.file = open_active(&self.path)?;
        self.active = FileId::of(
            &self
                .file
                .metadata()
                .map_err(|e| SinkError::io("stat", &self.path, e))?,
        );
        self.segments = next;
        self.len = 0;
        self.opened_at = Instant::now();
        sync_dir(parent_dir(&self.path))?;
        if self.config.exactly_once {
            self.store()?;
        }
        Ok(())
    }

    pub(crate) fn segments(&self) -> u64 {
        self.segments
    }
}
