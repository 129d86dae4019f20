//! The crate's error type, and the value a failed send hands back.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use etl_record::IdempotencyKey;

/// An error from user code (a sink, an encoder), as it crosses the trait
/// boundary.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One record of a batch that a sink refused, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    /// Index of the record in the [`EncodedBatch`](crate::EncodedBatch).
    pub index: usize,
    /// Why the sink refused it, for a human (it ends up in the dead letter).
    pub reason: String,
}

impl Reject {
    /// A reject of the record at `index`.
    #[must_use]
    pub fn new(index: usize, reason: impl Into<String>) -> Self {
        Reject {
            index,
            reason: reason.into(),
        }
    }
}

/// Whose fault a failed write is: it decides what the driver does once
/// the retry policy is spent (see [`SinkError::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The sink cannot write, whatever the records: a broken pipe, a
    /// read-only or full disk, refused credentials or privileges, a
    /// dropped table, an unreachable broker. Replaying the records would
    /// fail the same way and dead-lettering them would set good data
    /// aside, so the driver stops with the error and the pipeline halts;
    /// nothing past the failed batch is committed.
    Environment,
    /// The records are at fault (a row the database refuses, a message
    /// too large, a value the encoder cannot encode): the other records
    /// would be written. The failed batch's partitions replay, a range
    /// that keeps failing is narrowed to single records, and a record that
    /// fails alone goes to the dead-letter path as poison.
    Data,
}

/// Everything that can go wrong on the sink path.
///
/// A sink classifies its failures twice. Whether retrying the same write
/// may succeed ([`is_retryable`](SinkError::is_retryable)):
/// [`Retryable`](SinkError::Retryable), [`Timeout`](SinkError::Timeout)
/// and most [`Io`](SinkError::Io) errors are retried by the driver's retry
/// policy. And whose fault it is ([`kind`](SinkError::kind)): only
/// [`Rejected`](SinkError::Rejected) (some records refused, the others
/// durably written), [`Data`](SinkError::Data) (the batch failed because
/// of records it holds) and [`Encode`](SinkError::Encode) are
/// [`FailureKind::Data`]; every other error, once retries are spent, is
/// [`FailureKind::Environment`] and halts the pipeline. An unclassified
/// failure ([`Permanent`](SinkError::Permanent)) therefore halts rather
/// than sending good records to the dead-letter path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// A transient failure: the same write may succeed later. Once the
    /// retry policy gives up it counts as an error of the environment.
    #[error("transient sink error: {0}")]
    Retryable(#[source] BoxError),
    /// A failure that retrying cannot fix and that is not known to be
    /// caused by the records: an error of the environment.
    #[error("permanent sink error: {0}")]
    Permanent(#[source] BoxError),
    /// The batch failed because of records it holds, and the sink cannot
    /// say which (a multi-row statement refused for one bad row, a message
    /// over the broker's size limit). Nothing of the batch was written.
    /// Not retried; the batch's partitions replay and narrow down to the
    /// record at fault.
    #[error("sink refused the batch's data: {0}")]
    Data(#[source] BoxError),
    /// Some records were refused; every other record of the batch was
    /// durably written.
    #[error("sink rejected {} record(s), first: {}", .0.len(), first_reason(.0))]
    Rejected(Vec<Reject>),
    /// A write did not finish in time (retryable).
    #[error("sink write timed out after {0:?}")]
    Timeout(Duration),
    /// An I/O operation on a file or stream failed. Retryable (the file
    /// sink rolls a failed append back before returning it; where it
    /// cannot, or earlier bytes are not durable yet, it returns
    /// [`NotDurable`](SinkError::NotDurable) instead), except a broken
    /// pipe, a refused permission and a read-only file system, which no
    /// retry can fix.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted ("append to", "fsync", "rename", ...).
        op: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The output no longer holds what the sink wrote to it: its path no
    /// longer names the file the sink writes (it was deleted, or another
    /// file was renamed over it), or the file is not the length the sink
    /// wrote (truncated in place, or appended to by another writer). No
    /// retry can bring the data back, so this is not retried; it is an
    /// I/O error of the output (the `etl` binary exits with code 74) and
    /// halts the pipeline.
    #[error(
        "cannot keep writing to {}: the output file {what}; \
         the sink stops rather than report records written that the file does not hold",
        path.display()
    )]
    OutputLost {
        /// The output file's path.
        path: PathBuf,
        /// What happened to it ("was deleted while the sink was writing
        /// it", "was truncated ...").
        what: String,
    },
    /// A write or `fsync` of an output (or of its progress file) failed
    /// while some of its bytes were not yet known to be durable. The
    /// kernel may have dropped those bytes and report the next `fsync` a
    /// success, so nothing written to the file can be trusted any more:
    /// every later write fails with this error, it is not retried, and it
    /// is an I/O error of the output (the `etl` binary exits with code
    /// 74). The next run reads again from the last commit (an
    /// exactly-once output is cut back to its last durable length).
    #[error(
        "cannot keep writing to {}: {op} failed with bytes not yet durable ({source}); \
         a later fsync could report them durable although they never reached the disk, \
         so the sink stops and the next run writes them again",
        path.display()
    )]
    NotDurable {
        /// What failed ("fsync", "append to", "store the progress of", ...).
        op: &'static str,
        /// The output file's path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A record cannot be encoded (its value is not what the encoder
    /// needs); it goes to the dead-letter path.
    #[error("cannot encode record {key}: {reason}")]
    Encode {
        /// The record's identity.
        key: IdempotencyKey,
        /// What is wrong with it.
        reason: String,
    },
    /// A stored progress file cannot be trusted.
    #[error("progress file {} is unusable: {reason}", path.display())]
    CorruptProgress {
        /// The progress file (or the data file it describes).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a sink driver and its handles report when the driver stops with an
/// error: a write that failed for good ([`Sink`](SinkDriverError::Sink),
/// the [`SinkError`] the sink returned), or a failure of the driver itself.
/// A [`Sink`](crate::Sink) implementation returns [`SinkError`] only.
#[derive(Debug, thiserror::Error)]
pub enum SinkDriverError {
    /// A write failed for good: an error of the environment, or one the
    /// retry policy gave up on.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The sink panicked; the driver stopped and every set it held failed.
    #[error("sink driver panicked: {0}")]
    Panicked(String),
    /// The driver did not drain within the shutdown deadline; it was
    /// aborted and every set it held failed.
    #[error("sink driver did not drain within {0:?}; in-flight batches failed")]
    ShutdownTimeout(Duration),
    /// An exactly-once driver stopped after a failed batch, because
    /// writing later batches would move the stored progress past records
    /// that were never written.
    #[error("exactly-once sink driver halted after a failed batch: {0}")]
    Halted(String),
    /// The dead-letter sink failed for good while the driver wrote the
    /// records set aside from a batch.
    #[error("dead-letter write failed: {0}")]
    DeadLetter(#[source] SinkError),
    /// The driver's configuration is out of range (see
    /// [`SinkDriverConfig::validate`](crate::SinkDriverConfig::validate)); the
    /// driver did not start and failed whatever was sent to it.
    #[error("invalid sink driver config: {0}")]
    InvalidConfig(String),
    /// The driver is gone.
    #[error("sink driver is closed")]
    Closed,
}

impl SinkDriverError {
    /// Whether the failure is an I/O error of the output (the sink's own
    /// or its dead-letter sink's): the `etl` binary exits with code 74
    /// for it.
    #[must_use]
    pub fn is_io(&self) -> bool {
        match self {
            SinkDriverError::Sink(e) | SinkDriverError::DeadLetter(e) => e.is_io(),
            _ => false,
        }
    }
}

fn first_reason(rejects: &[Reject]) -> &str {
    rejects.first().map_or("", |r| r.reason.as_str())
}

impl SinkError {
    /// A retryable error from any error value.
    pub fn retryable(err: impl Into<BoxError>) -> Self {
        SinkError::Retryable(err.into())
    }

    /// A permanent error from any error value.
    pub fn permanent(err: impl Into<BoxError>) -> Self {
        SinkError::Permanent(err.into())
    }

    /// An error caused by the batch's records (see [`SinkError::Data`]).
    pub fn data(err: impl Into<BoxError>) -> Self {
        SinkError::Data(err.into())
    }

    /// An I/O error of `op` on `path` (a file, or a name such as
    /// "standard output").
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SinkError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Whether retrying the same write may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            SinkError::Retryable(_) | SinkError::Timeout(_) => true,
            SinkError::Io { source, .. } => !matches!(
                source.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem
            ),
            _ => false,
        }
    }

    /// Whose fault the failure is, once retries are spent:
    /// [`FailureKind::Data`] for [`Rejected`](SinkError::Rejected),
    /// [`Data`](SinkError::Data) and [`Encode`](SinkError::Encode),
    /// [`FailureKind::Environment`] for everything else.
    #[must_use]
    pub fn kind(&self) -> FailureKind {
        match self {
            SinkError::Rejected(_) | SinkError::Data(_) | SinkError::Encode { .. } => {
                FailureKind::Data
            }
            _ => FailureKind::Environment,
        }
    }

    /// Whether the failure is an I/O error of the output: the `etl`
    /// binary exits with code 74 for it.
    #[must_use]
    pub fn is_io(&self) -> bool {
        matches!(
            self,
            SinkError::Io { .. } | SinkError::OutputLost { .. } | SinkError::NotDurable { .. }
        )
    }
}

/// The driver is gone; the value is handed back, with its handle already
/// marked failed so dropping it cannot count as a delivery.
#[derive(PartialEq, Eq)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendError").finish_non_exhaustive()
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sink driver is closed; the value was not sent and its batch is failed")
    }
}

impl<T> std::error::Error for SendError<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(SinkError::retryable("x").is_retryable());
        assert!(SinkError::Timeout(Duration::from_secs(1)).is_retryable());
        assert!(!SinkError::permanent("x").is_retryable());
        assert!(!SinkError::Rejected(vec![Reject::new(0, "bad")]).is_retryable());
        let text = SinkError::Rejected(vec![Reject::new(0, "bad row")]).to_string();
        assert!(
            text.contains("1 record(s)") && text.contains("bad row"),
            "{text}"
        );
    }

    #[test]
    fn only_errors_of_the_records_are_data_and_unclassified_ones_halt() {
        use std::io::{Error, ErrorKind};
        assert_eq!(SinkError::data("too large").kind(), FailureKind::Data);
        assert!(!SinkError::data("too large").is_retryable());
        assert_eq!(
            SinkError::Rejected(vec![Reject::new(0, "bad")]).kind(),
            FailureKind::Data
        );
        for err in [
            SinkError::permanent("x"),
            SinkError::retryable("x"),
            SinkError::Timeout(Duration::from_secs(1)),
            SinkError::io("append to", "out", Error::from(ErrorKind::StorageFull)),
        ] {
            assert_eq!(err.kind(), FailureKind::Environment, "{err}");
        }
        let pipe = SinkError::io(
            "write to",
            "standard output",
            Error::from(ErrorKind::BrokenPipe),
        );
        assert!(!pipe.is_retryable() && pipe.is_io());
        assert!(SinkError::io("fsync", "out", Error::from(ErrorKind::Interrupted)).is_retryable());
        assert!(SinkDriverError::DeadLetter(pipe).is_io());
        // A failed fsync is never retried: the next one would lie.
        let lost = SinkError::NotDurable {
            op: "fsync",
            path: "out".into(),
            source: Error::from(ErrorKind::Interrupted),
        };
        assert!(!lost.is_retryable() && lost.is_io(), "{lost:?}");
        assert_eq!(lost.kind(), FailureKind::Environment);
        assert!(!SinkError::permanent("x").is_io());
    }
}
