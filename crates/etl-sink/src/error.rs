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

/// Everything that can go wrong on the sink path.
///
/// A sink classifies its failures: [`Retryable`](SinkError::Retryable)
/// (try the same batch again), [`Permanent`](SinkError::Permanent) (it will
/// never succeed) and [`Rejected`](SinkError::Rejected) (some records were
/// refused, the others are durably written). The driver retries what
/// [`is_retryable`](SinkError::is_retryable) says it may.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// A transient failure: the same write may succeed later.
    #[error("transient sink error: {0}")]
    Retryable(#[source] BoxError),
    /// A failure that retrying cannot fix.
    #[error("permanent sink error: {0}")]
    Permanent(#[source] BoxError),
    /// Some records were refused; every other record of the batch was
    /// durably written.
    #[error("sink rejected {} record(s), first: {}", .0.len(), first_reason(.0))]
    Rejected(Vec<Reject>),
    /// A write did not finish in time (retryable).
    #[error("sink write timed out after {0:?}")]
    Timeout(Duration),
    /// An I/O operation on a file failed (retryable: the file sink rolls a
    /// failed append back before returning it).
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
    /// The driver is gone.
    #[error("sink driver is closed")]
    Closed,
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

    /// Whether retrying the same write may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SinkError::Retryable(_) | SinkError::Timeout(_) | SinkError::Io { .. }
        )
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SinkError::Io {
            op,
            path: path.into(),
            source,
        }
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
}
