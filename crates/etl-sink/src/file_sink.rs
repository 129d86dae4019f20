//! The file sink: append, fsync before acknowledging, rotate, recover.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etl_fs::{Fs, RealFs};
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
///   batch. When it cannot be cut back, or bytes appended before it are
///   not durable yet, the file is lost (below).
/// * A failed `fsync` is never retried: Linux drops the pages of a failed
///   writeback and reports the next `fsync` a success. The file is lost:
///   every later write and flush (the writes waiting on that `fsync`
///   included) fails with [`SinkError::NotDurable`], which is not retried.
///   The file is cut back to what the last good `fsync` covered: bytes
///   after it may hold lost pages between lines that reached the disk.
/// * Rotation renames the active file `<path>` to `<path>.<n>` (1, 2, ...)
///   and starts a new `<path>`. Finished segments are never read again:
///   they may be moved away or deleted.
/// * On open, bytes a crash left after the last `fsync` are checked and
///   cut from the first line that is not whole (at least once; exactly
///   once cuts back to its recorded length). A crash that loses the page
///   cache can keep part of the unsynced appends: torn writes, and lost
///   blocks that read back as zeros, possibly inside a line that still
///   ends in a line break. None of it was acknowledged: its records are
///   replayed. The sink keeps `<path>.recovery`, a length of the active
///   file that an `fsync` covered, and the invariant that every
///   acknowledged byte past it ends in a line break and holds no NUL
///   byte: on open, the file is cut at the first line past it holding a
///   NUL byte, or at a partial last line. The point is stored (a small
///   file replaced atomically: two more `fsync`s and a rename) on open
///   unless the file is already at it, at rotation, every 64 MiB, and,
///   for output holding NUL bytes (raw values), with each `fsync` that
///   covers one, before the write returns; and on
///   [`flush`](Sink::flush) (a stop), so that the next open has nothing
///   to check. An output without a point (an older version's) keeps
///   every complete line.
/// * One writer: the sink holds an exclusive advisory lock on
///   `<canonical path>.lock` (see [`etl_record::OwnerLock`]; symlinks
///   resolved) and on the open data file itself from open until it is
///   dropped, since it cuts the file back on open and after a failed
///   append. A second sink on the same file, in this process or another
///   and by any name (a symlink, a hard link), is refused.
/// * Before data is reported durable (after each `fsync`, and on
///   [`flush`](Sink::flush)), the sink checks that `<path>` still names
///   the file it writes (device and inode) at the length it wrote, and
///   after each append that the file grew by just what was appended. Once
///   the file was deleted, another file renamed over it, it was truncated
///   or another writer appended to it, every later write and flush fails
///   with [`SinkError::OutputLost`]: records are never acknowledged into a
///   file that does not hold them.
///
/// * The side files (`.progress`, `.recovery`, `.lock`) sit beside the
///   file written, symlinks resolved (`<canonical path>.progress`), and
///   record its device and inode: a run under another name (a symlink,
///   `./out` for `out`) finds the same ones, and progress is never
///   applied to another file (one renamed over the output is refused, not
///   cut). A file with a second name that is a hard link has no one place
///   for them: exactly once, it is refused ([`SinkError::OutputLost`]);
///   at least once, its recovery point is not trusted.
///
/// **Exactly-once mode** (`exactly_once: true`): after each `fsync` the
/// sink atomically replaces `<path>.progress` (temporary file, `fsync`,
/// rename, `fsync` of the directory) with the active file's length, its
/// device and inode, the number of finished segments and, per partition,
/// the offset after the last record written. On open it cuts the file back to the recorded
/// length, and [`ProgressSink::progress`] reports the recorded offsets, so
/// a pipeline resuming its source there writes every record exactly once.
/// Costs: one more small file write, two more `fsync`s and a rename per
/// `fsync`; one sink per pipeline; writes one batch at a time.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    config: FileSinkConfig,
    /// Whether calls on the file system may block ([`Fs::blocks`]): then
    /// they run on blocking threads, else inline.
    blocks: bool,
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

/// Run file work off the async threads when it may block (`blocks`, a
/// real disk); inline otherwise (an in-memory file system, whose calls
/// return at once: a simulation stays deterministic).
async fn blocking<T: Send + 'static>(
    blocks: bool,
    f: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    if !blocks {
        return f();
    }
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
    /// I/O errors; [`SinkError::Permanent`] with a
    /// [`LockError::InUse`](etl_record::LockError::InUse) among its
    /// sources (naming the holder's process id where it is known) when
    /// another sink holds the output, by this name or another;
    /// [`SinkError::OutputLost`] when the data file is shorter than its
    /// progress records; or [`SinkError::CorruptProgress`] when the
    /// progress file cannot be trusted.
    pub async fn open(path: impl AsRef<Path>, config: FileSinkConfig) -> Result<Self, SinkError> {
        Self::open_in(etl_fs::real(), path, config).await
    }

    /// Open the file at `path` on the file system `fs` like
    /// [`open`](Self::open): every read, write, `fsync`, lock, rename and
    /// listing of the sink goes through `fs` (a simulated one in tests).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn open_in(
        fs: Arc<dyn Fs>,
        path: impl AsRef<Path>,
        config: FileSinkConfig,
    ) -> Result<Self, SinkError> {
        let path = path.as_ref().to_owned();
        let p = path.clone();
        let blocks = fs.blocks();
        let state = blocking(blocks, move || FileState::open(fs, &p, config)).await?;
        Ok(FileSink {
            path,
            config,
            blocks,
            state: Arc::new(Mutex::new(state)),
            appending: Appending::default(),
        })
    }

    /// The progress stored with the output at `path` by an exactly-once
    /// sink (`<path>.progress`, beside the file `path` names, symlinks
    /// resolved), read without opening or locking the
    /// output: for tools that show where a pipeline stands. `None` when
    /// there is none.
    ///
    /// # Errors
    ///
    /// The progress file cannot be read, or cannot be trusted
    /// ([`SinkError::CorruptProgress`]).
    pub fn stored_progress(path: impl AsRef<Path>) -> Result<Option<Progress>, SinkError> {
        Self::stored_progress_in(&RealFs, path)
    }

    /// [`stored_progress`](Self::stored_progress) on the file system `fs`.
    ///
    /// # Errors
    ///
    /// As [`stored_progress`](Self::stored_progress).
    pub fn stored_progress_in(
        fs: &dyn Fs,
        path: impl AsRef<Path>,
    ) -> Result<Option<Progress>, SinkError> {
        let path = path.as_ref();
        // Beside the file written, symlinks resolved (see `open`); an
        // output that is gone has none to resolve.
        let side = fs.canonicalize(path).unwrap_or_else(|_| path.to_owned());
        Ok(crate::file_progress::read_stored_for(fs, path, &side)?.map(|stored| stored.progress))
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

    /// Every file of the output still there, in order: finished segments
    /// (but those moved away), then the active file.
    #[must_use]
    pub fn files(&self) -> Vec<PathBuf> {
        let (segments, fs) = {
            let state = lock(&self.state);
            (state.segments(), Arc::clone(state.fs()))
        };
        let mut files: Vec<PathBuf> = (1..=segments)
            .map(|n| crate::file_progress::suffixed(&self.path, &n.to_string()))
            .filter(|seg| fs.exists(seg))
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
            blocking(self.blocks, move || {
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
        let end = blocking(self.blocks, move || {
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
        blocking(self.blocks, move || lock(&state).flush()).await
    }
}

impl ProgressSink for FileSink {
    fn progress(&self) -> Progress {
        lock(&self.state).stored.clone()
    }
}

#[cfg(test)]
mod crash_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FsyncPolicy;
    use etl_fs::{SimFaults, SimFs, SimOp};
    use etl_record::{Offset, PartitionId, Position, Record, SourceId};

    fn batch(n: i64) -> EncodedBatch {
        batch_of(0..n)
    }

    fn batch_of(offsets: std::ops::Range<i64>) -> EncodedBatch {
        let records = offsets
            .map(|o| {
                Record::new(
                    Position::new(SourceId::new("s"), PartitionId(0), Offset(o)),
                    format!("{{\"o\":{o}}}"),
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

    use crate::file_state::tests::{EIO, PATH, disk};

    async fn open_on(fs: &SimFs, config: FileSinkConfig) -> FileSink {
        FileSink::open_in(Arc::new(fs.clone()), PATH, config)
            .await
            .unwrap()
    }

    /// The offsets of the lines of the output on `fs`; panics on a line
    /// that is not a record (a run of NUL bytes left by lost pages).
    fn offsets_in(fs: &SimFs) -> Vec<i64> {
        let bytes = fs.read(Path::new(PATH)).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        text.lines()
            .map(|line| {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
                v["o"].as_i64().unwrap()
            })
            .collect()
    }

    fn assert_not_durable(err: &SinkError, what: &str) {
        assert!(
            matches!(err, SinkError::NotDurable { .. }),
            "{what}: {err:?}"
        );
        assert!(!err.is_retryable(), "{what}: {err:?} is retried");
        assert!(err.is_io(), "{what}: {err:?}");
        assert_eq!(err.kind(), crate::FailureKind::Environment, "{what}");
    }

    #[tokio::test]
    async fn a_failed_fsync_makes_the_file_lost_and_later_writes_fail() {
        // Linux drops the pages of a failed writeback and reports the
        // next fsync a success: a retried write must not be trusted.
        for exactly_once in [false, true] {
            let case = format!("exactly_once {exactly_once}");
            let sim = disk(1);
            let config = FileSinkConfig {
                exactly_once,
                ..FileSinkConfig::default()
            };
            let sink = open_on(&sim, config).await;
            sink.write(&batch_of(0..4)).await.unwrap();
            sim.fail_next(SimOp::Sync, EIO);
            let err = sink.write(&batch_of(4..8)).await.unwrap_err();
            // Nothing is reported durable again, retried or not.
            let retried = sink
                .write(&batch_of(4..8))
                .await
                .expect_err("a write retried after a failed fsync was reported durable");
            assert_not_durable(&err, &case);
            assert!(err.to_string().contains("fsync"), "{case}: {err}");
            assert_not_durable(&retried, &case);
            assert_not_durable(&sink.write(&batch_of(8..12)).await.unwrap_err(), &case);
            assert_not_durable(&sink.flush().await.unwrap_err(), &case);
            if exactly_once {
                assert_eq!(
                    sink.progress().get(PartitionId(0)),
                    Some(Offset(4)),
                    "{case}"
                );
            }
            drop(sink);
            // The next run finds only what the last good fsync covered
            // and writes the rest again.
            let sink = open_on(&sim, config).await;
            assert_eq!(offsets_in(&sim), (0..4).collect::<Vec<_>>(), "{case}");
            if exactly_once {
                assert_eq!(
                    sink.progress().get(PartitionId(0)),
                    Some(Offset(4)),
                    "{case}"
                );
            }
            sink.write(&batch_of(4..8)).await.unwrap();
            assert_eq!(offsets_in(&sim), (0..8).collect::<Vec<_>>(), "{case}");
        }
    }

    #[tokio::test]
    async fn a_failed_fsync_leaves_none_of_its_lost_bytes_for_the_next_run() {
        // The pages of a failed writeback read back as zeros, at once or
        // after a crash; a next run that kept every byte of the file (or
        // every complete line) would keep them as output.
        for exactly_once in [false, true] {
            for crash in [false, true] {
                let case = format!("exactly_once {exactly_once}, crash {crash}");
                let sim = disk(2);
                sim.set_faults(SimFaults {
                    zero_lost: 1000,
                    ..SimFaults::default()
                });
                let config = FileSinkConfig {
                    exactly_once,
                    ..FileSinkConfig::default()
                };
                let sink = open_on(&sim, config).await;
                sink.write(&batch_of(0..4)).await.unwrap();
                sim.fail_next(SimOp::Sync, EIO);
                assert_not_durable(&sink.write(&batch_of(4..8)).await.unwrap_err(), &case);
                drop(sink);
                let sim = if crash {
                    sim.crash();
                    sim.process()
                } else {
                    sim
                };
                let sink = open_on(&sim, config).await;
                let bytes = sim.read(Path::new(PATH)).unwrap();
                assert!(
                    !bytes.contains(&0),
                    "{case}: the next run kept lost bytes: {bytes:?}"
                );
                assert_eq!(offsets_in(&sim), (0..4).collect::<Vec<_>>(), "{case}");
                sink.write(&batch_of(4..8)).await.unwrap();
                assert_eq!(offsets_in(&sim), (0..8).collect::<Vec<_>>(), "{case}");
            }
        }
    }

    // The file's lock is held across the wait on purpose: it keeps every
    // append back until all three writes are counted.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_group_fsync_fails_every_write_waiting_on_it() {
        // Calls on blocking threads, as on a real disk: the writes wait
        // for one another while the file's lock is held.
        let sim = disk(3).blocking();
        let config = FileSinkConfig {
            fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
            ..FileSinkConfig::default()
        };
        let sink = Arc::new(open_on(&sim, config).await);
        let held = lock(&sink.state);
        sim.fail_next(SimOp::Sync, EIO);
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
            let result = tokio::time::timeout(Duration::from_secs(60), write)
                .await
                .expect("the writes waited for the interval")
                .unwrap();
            assert_not_durable(&result.unwrap_err(), "a write waiting on the failed fsync");
        }
        assert_not_durable(&sink.write(&batch(1)).await.unwrap_err(), "a later write");
        let s = lock(&sink.state);
        assert_eq!(s.synced, 0, "nothing is reported durable");
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
