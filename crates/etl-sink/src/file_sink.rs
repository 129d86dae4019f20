//! The file sink: append, fsync before acknowledging, rotate, recover.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::file_state::{FileState, Placed};
use crate::{EncodedBatch, Progress, ProgressSink, Sink, SinkError};

/// When the file sink makes written data durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// `fsync` after every batch, before the write returns.
    EveryBatch,
    /// Group commit: a write's `fsync` waits, up to the interval since the
    /// last one, while other writes in flight are still appending, so that
    /// one `fsync` covers them all; a write returns (its batch
    /// acknowledged) only after the `fsync` that covers it. Once no other
    /// write is appending, waiting could not save an `fsync` and would
    /// hold this write and every one behind it (with the driver's default
    /// `concurrency` of 1, a batch per interval): it syncs at once.
    /// Sharing needs `concurrency` above 1.
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
    /// Writes still appending, for group commit.
    appending: Appending,
}

/// The writes still appending their batch, and a wake-up for the writes
/// waiting for them to share an `fsync`.
#[derive(Debug, Default)]
struct Appending {
    count: AtomicUsize,
    done: Notify,
}

/// A write appending its batch: counted in [`Appending`] until
/// [`Writing::appended`], or until dropped (a failed or cancelled write).
struct Writing<'a> {
    appending: &'a Appending,
    counted: bool,
}

impl<'a> Writing<'a> {
    fn enter(appending: &'a Appending) -> Self {
        appending.count.fetch_add(1, Ordering::AcqRel);
        Writing {
            appending,
            counted: true,
        }
    }

    /// Its batch is appended: writes waiting to share an `fsync` need not
    /// wait for it any more.
    fn appended(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.appending.count.fetch_sub(1, Ordering::AcqRel);
            self.appending.done.notify_waiters();
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.appended();
    }
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
            appending: Appending::default(),
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

    /// Return once the first `end` bytes are durable: at once when an
    /// `fsync` covered them, else after one. Under
    /// [`FsyncPolicy::Interval`] the `fsync` waits, up to the interval
    /// since the last one, while other writes are still appending: theirs
    /// is then covered by the same `fsync`. Once none is, waiting could
    /// not save an `fsync`.
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
                tokio::time::Instant::from_std(s.last_sync + interval)
            };
            loop {
                // Registered before the count is read, so that an append
                // ending in between still wakes this one.
                let done = self.appending.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if self.appending.count.load(Ordering::Acquire) == 0 {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(due) => break,
                    () = done => {}
                }
            }
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
        let mut writing = Writing::enter(&self.appending);
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
        writing.appended();
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

    /// A sink syncing at most hourly: any wait for the interval shows.
    async fn hourly_sink() -> (tempfile::TempDir, FileSink) {
        let dir = tempfile::tempdir().unwrap();
        let config = FileSinkConfig {
            fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
            ..FileSinkConfig::default()
        };
        let sink = FileSink::open(dir.path().join("out"), config)
            .await
            .unwrap();
        (dir, sink)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_interval_write_with_no_other_in_flight_syncs_at_once() {
        // Waiting for the interval shares an fsync only with other writes
        // still appending; alone, it would hold this write and every one
        // behind it (with one write at a time, a batch per interval).
        let (_dir, sink) = hourly_sink().await;
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(60), sink.write(&batch(4)))
                .await
                .expect("a lone write waited for the interval")
                .unwrap();
            let s = lock(&sink.state);
            assert!(s.written > 0 && s.synced == s.written);
        }
    }

    // The file's lock is held across the wait on purpose: it keeps every
    // append back until all three writes are counted.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interval_writes_in_flight_together_share_one_fsync() {
        let (_dir, sink) = hourly_sink().await;
        let sink = Arc::new(sink);
        // Each waits for the others to append, not for the interval. The
        // file is held until all three are in flight, so none can finish
        // appending (and find itself alone) before the others started.
        let held = lock(&sink.state);
        let writes: Vec<_> = [2, 3, 4]
            .into_iter()
            .map(|n| {
                let sink = sink.clone();
                tokio::spawn(async move { sink.write(&batch(n)).await })
            })
            .collect();
        while sink.appending.count.load(Ordering::Acquire) < 3 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for write in writes {
            tokio::time::timeout(Duration::from_secs(60), write)
                .await
                .expect("the writes waited for the interval")
                .unwrap()
                .unwrap();
        }
        let s = lock(&sink.state);
        assert!(s.written > 0 && s.synced == s.written);
        assert!(
            s.syncs == 1,
            "{} fsyncs for three writes in flight together",
            s.syncs
        );
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
