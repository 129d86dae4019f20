//! Small built-in sinks: standard output and a blackhole.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::BytesMut;
use etl_record::Record;

use crate::{EncodedBatch, Encoder, Sink, SinkError};

/// The name standard output goes by in errors.
const STDOUT: &str = "standard output";

/// Options of a [`StdoutSink`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StdoutSinkConfig {
    /// Write even when standard output is the null device (`/dev/null`).
    /// Off by default: a standard output closed when the process started
    /// is the null device by then (Rust's runtime opens `/dev/null` on a
    /// closed descriptor 0, 1 or 2), so every record would be counted as
    /// written and committed while it went nowhere. A blackhole sink is
    /// the way to discard records on purpose.
    pub allow_null_device: bool,
}

/// Writes batches to standard output and flushes it before returning.
/// "Durable" here means handed to the reader of the pipe.
///
/// It writes through a duplicate of file descriptor 1 of its own rather
/// than through [`std::io::stdout`], which reports a write that failed
/// with `EBADF` (descriptor 1 closed, or open for reading only) as a
/// success: here every failed write is an error.
#[derive(Debug)]
pub struct StdoutSink {
    out: Arc<Mutex<Output>>,
}

impl StdoutSink {
    /// The sink, on the process's standard output as it is now.
    ///
    /// # Errors
    ///
    /// An I/O error of standard output (the `etl` binary exits 74) when
    /// it is closed, not open for writing (`1</dev/null`), or the null
    /// device without [`StdoutSinkConfig::allow_null_device`]: records
    /// written there would be lost while counted as delivered.
    pub fn open(config: StdoutSinkConfig) -> Result<Self, SinkError> {
        Ok(StdoutSink {
            out: Arc::new(Mutex::new(Output::open(config)?)),
        })
    }
}

/// The refusal of a standard output no record can reach, as an I/O error
/// of the output.
fn unusable(reason: impl Into<String>) -> SinkError {
    SinkError::io("write to", STDOUT, std::io::Error::other(reason.into()))
}

/// Standard output, as the sink writes it.
#[cfg(unix)]
#[derive(Debug)]
struct Output(std::fs::File);

#[cfg(unix)]
impl Output {
    fn open(config: StdoutSinkConfig) -> Result<Self, SinkError> {
        use std::os::fd::AsFd;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};

        use rustix::fs::OFlags;

        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| match e.raw_os_error() {
                Some(code) if code == rustix::io::Errno::BADF.raw_os_error() => {
                    unusable("it is closed (file descriptor 1 is not open)")
                }
                _ => SinkError::io("duplicate", STDOUT, e),
            })?;
        let mode = rustix::fs::fcntl_getfl(&fd)
            .map_err(|e| SinkError::io("inspect", STDOUT, e.into()))?
            .intersection(OFlags::RWMODE);
        if mode != OFlags::WRONLY && mode != OFlags::RDWR {
            return Err(unusable(
                "it is open for reading only (as with `1</dev/null`), so no write can succeed",
            ));
        }
        let file = std::fs::File::from(fd);
        let null = std::fs::metadata("/dev/null").ok();
        let is_null = match (file.metadata(), null) {
            (Ok(out), Some(null)) => {
                out.file_type().is_char_device()
                    && null.file_type().is_char_device()
                    && out.rdev() == null.rdev()
            }
            _ => false,
        };
        if is_null && !config.allow_null_device {
            return Err(unusable(
                "it is the null device, which keeps nothing: standard output was closed \
                 (the process then finds /dev/null there) or redirected to /dev/null; \
                 discard records with a blackhole sink, or set allow_null_device = true",
            ));
        }
        Ok(Output(file))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_all(bytes)
    }
}

/// Standard output, as the sink writes it.
#[cfg(not(unix))]
#[derive(Debug)]
struct Output(std::io::Stdout);

#[cfg(not(unix))]
impl Output {
    fn open(_config: StdoutSinkConfig) -> Result<Self, SinkError> {
        Ok(Output(std::io::stdout()))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let mut out = self.0.lock();
        out.write_all(bytes).and_then(|()| out.flush())
    }
}

#[async_trait]
impl Sink for StdoutSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let bytes = batch.bytes().clone();
        let out = self.out.clone();
        tokio::task::spawn_blocking(move || {
            // One write at a time, so that batches never interleave. A
            // panic while the lock was held left no state to distrust:
            // each write stands alone.
            let mut out = out
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            out.write_all(&bytes)
        })
        .await
        .map_err(|e| SinkError::permanent(format!("stdout task failed: {e}")))?
        // A broken pipe (the reader went away) is not retried and halts
        // the pipeline; see `SinkError::is_retryable`.
        .map_err(|e| SinkError::io("write to", STDOUT, e))
    }
}

/// Accepts every batch at once and keeps nothing but counts: for
/// benchmarks that measure everything but the sink. Drive it with
/// [`BlackholeSink::encoder`], which copies nothing: its batches count
/// records and carry no bytes.
#[derive(Debug, Default)]
pub struct BlackholeSink {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl BlackholeSink {
    /// The sink.
    #[must_use]
    pub fn new() -> Self {
        BlackholeSink::default()
    }

    /// The encoder for this sink: it takes every record and appends
    /// nothing, so no value is copied on its way into the void.
    #[must_use]
    pub fn encoder() -> DiscardEncoder {
        DiscardEncoder { _private: () }
    }

    /// Records accepted so far.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Bytes accepted so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Sink for BlackholeSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        self.records
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.bytes
            .fetch_add(batch.bytes().len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Takes every record and encodes it as nothing: for a sink that keeps
/// nothing (see [`BlackholeSink::encoder`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardEncoder {
    _private: (),
}

impl Encoder for DiscardEncoder {
    fn encode(&self, _record: &Record, _out: &mut BytesMut) -> Result<(), SinkError> {
        Ok(())
    }
}
