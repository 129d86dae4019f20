//! The file sink: append, fsync before acknowledging, rotate, recover.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::file_state::{FileState, Placed};
use crate::{EncodedBatch, Progress, ProgressSink, Sink, SinkError};

/// When the file sink makes written data durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// `fsync` after every batch, before the write returns.
    EveryBatch,
    /// `fsync` at most once per interval; a write returns (and its batch is
    /// acknowledged) only after the `fsync` that covers it, so several
    /// batches share one `fsync`.
    Interval(Duration),
}

/// Configuration of a [`FileSink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSinkConfig {
    /// When data is made durable.
    pub fsync: FsyncPolicy,
    /// Start a new file before a write would take the current one past this
    /// many bytes.
    pub rotate_bytes: Option<u64>,
    /// Start a new file before writing to one older than this.
    pub rotate_after: Option<Duration>,
    /// Store progress with the data (see [`FileSink`]).
    pub exactly_once: bool,
}

impl Default for FileSinkConfig {
    fn default() -> Self {
        FileSinkConfig {
            fsync: FsyncPolicy::EveryBatch,
            rotate_bytes: None,
            rotate_after: None,
            exactly_once: false,
        }
    }
}

/// Appends encoded batches to a file.
///
/// * A write returns `Ok` only after `fsync` (see [`FsyncPolicy`]).
/// * A failed append is cut back off, so a retry does not duplicate half a
///   batch.
/// * Rotation renames the active file `<path>` to `<path>.<n>` (1, 2, ...)
///   and starts a new `<path>`.
/// * On open, a partial trailing line (a crash mid-append) is cut off.
/// * One writer: the sink holds an exclusive advisory lock on
///   `<path>.lock` (see [`etl_record::OwnerLock`]) from open until it is
///   dropped, since it cuts the file back on open and after a failed
///   append. A second sink on the same path, in this process or another,
///   is refused.
/// * Before data is reported durable (after each `fsync`, and on
///   [`flush`](Sink::flush)), the sink checks that `<path>` still names
///   the file it writes (device and inode). Once the file was deleted or
///   another file renamed over it, every later write and flush fails with
///   [`SinkError::Io`]: records are never acknowledged into a file no path
///   names.
///
/// **Exactly-once mode** (`exactly_once: true`): after each `fsync` the
/// sink atomically replaces `<path>.progress` (temporary file, `fsync`,
/// rename, `fsync` of the directory) with the active file's length, the
/// number of finished segments and, per partition, the offset after the
/// last record written. On open it cuts the file back to the recorded
/// length, and [`ProgressSink::progress`] reports the recorded offsets, so
/// a pipeline resuming its source there writes every record exactly once.
/// Costs: one more small file write, two more `fsync`s and a rename per
/// `fsync`; one sink per pipeline; writes one batch at a time.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    config: FileSinkConfig,
    state: Arc<Mutex<FileState>>,
}

fn lock(state: &Mutex<FileState>) -> MutexGuard<'_, FileState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Run blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SinkError::permanent(format!("file sink I/O task failed: {e}")))?
}

impl FileSink {
    /// Open (or create) the file at `path`, recovering from a crash as
    /// described above. The directory must exist.
    ///
    /// # Errors
    ///
    /// I/O errors; [`SinkError::Permanent`] wrapping
    /// [`LockError::InUse`](etl_record::LockError::InUse) (naming the
    /// holder's process id) when another sink holds the output; or
    /// [`SinkError::CorruptProgress`] when the progress file cannot be
    /// trusted (the data file is shorter than recorded).
    pub async fn open(path: impl AsRef<Path>, config: FileSinkConfig) -> Result<Self, SinkError> {
        let path = path.as_ref().to_owned();
        let p = path.clone();
        let state = blocking(move || FileState::open(&p, config)).await?;
        Ok(FileSink {
            path,
            config,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The progress stored with the output at `path` by an exactly-once
    /// sink (`<path>.progress`), read without opening or locking the
    /// output: for tools that show where a pipeline stands. `None` when
    /// there is none.
    ///
    /// # Errors
    ///
    /// The progress file cannot be read, or cannot be trusted
    /// ([`SinkError::CorruptProgress`]).
    pub fn stored_progress(path: impl AsRef<Path>) -> Result<Option<Progress>, SinkError> {
        Ok(crate::file_progress::read_stored(path.as_ref())?.map(|stored| stored.progress))
    }

    /// The active file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of finished (rotated) files: `<path>.1` ..= `<path>.<n>`.
    #[must_use]
    pub fn segments(&self) -> u64 {
        lock(&self.state).segments()
    }

    /// Every file of the output in order: finished segments, then the
    /// active file.
    #[must_use]
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (1..=self.segments())
            .map(|n| crate::file_progress::suffixed(&self.path, &n.to_string()))
            .collect();
        files.push(self.path.clone());
        files
    }

    async fn sync_through(&self, end: u64) -> Result<(), SinkError> {
        let interval = match self.config.fsync {
            FsyncPolicy::EveryBatch => Duration::ZERO,
            FsyncPolicy::Interval(d) => d,
        };
        loop {
            let due = {
                let s = lock(&self.state);
                if s.synced >= end {
                    return Ok(());
                }
                s.last_sync + interval
            };
            tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
            let state = self.state.clone();
            blocking(move || {
                let mut s = lock(&state);
                if s.synced < end {
                    s.sync()?;
                }
                Ok(())
            })
            .await?;
        }
    }
}

#[async_trait]
impl Sink for FileSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let bytes = batch.bytes().clone();
        let placed: Option<Vec<Placed>> = self.config.exactly_once.then(|| {
            batch
                .records()
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    Some((r.position.partition, r.position.offset, batch.range(i)?))
                })
                .collect()
        });
        let state = self.state.clone();
        let every_batch = self.config.fsync == FsyncPolicy::EveryBatch;
        let end = blocking(move || {
            let mut s = lock(&state);
            let end = s.append(&bytes, placed.as_deref())?;
            if every_batch {
                s.sync()?;
            }
            Ok(end)
        })
        .await?;
        self.sync_through(end).await
    }

    async fn flush(&self) -> Result<(), SinkError> {
        let state = self.state.clone();
        blocking(move || lock(&state).sync()).await
    }
}

impl ProgressSink for FileSink {
    fn progress(&self) -> Progress {
        lock(&self.state).stored.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId, Position, Record, SourceId};

    fn batch(n: i64) -> EncodedBatch {
        let records = (0..n)
            .map(|o| {
                Record::new(
                    Position::new(SourceId::new("s"), PartitionId(0), Offset(o)),
                    "{}",
                )
            })
            .collect();
        EncodedBatch::encode(records, &crate::NdjsonEncoder::new()).0
    }

    #[tokio::test]
    async fn a_write_returns_only_once_its_bytes_are_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        for fsync in [
            FsyncPolicy::EveryBatch,
            FsyncPolicy::Interval(Duration::from_millis(20)),
        ] {
            let config = FileSinkConfig {
                fsync,
                exactly_once: true,
                ..FileSinkConfig::default()
            };
            let sink = FileSink::open(dir.path().join(format!("{fsync:?}")), config)
                .await
                .unwrap();
            for _ in 0..3 {
                sink.write(&batch(4)).await.unwrap();
                let s = lock(&sink.state);
                assert!(s.written > 0 && s.synced == s.written, "{fsync:?}");
                assert_eq!(
                    s.stored.get(PartitionId(0)),
                    Some(Offset(4)),
                    "progress stored with the data"
                );
            }
        }
    }
}
