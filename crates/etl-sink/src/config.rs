//! How a sink driver batches, retries and handles failures.

use std::time::Duration;

use crate::{RetryPolicy, SinkDriverError};

/// What the driver does with a batch that failed for good because of its
/// data ([`FailureKind::Data`](crate::FailureKind::Data)). A failure of
/// the environment halts the driver whatever this says.
///
/// In a configuration file this is a sink's `on_permanent_error`
/// (`"fail"` or `"dead_letter"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermanentErrorPolicy {
    /// Fail the batch's acknowledgements: its partitions replay from
    /// their watermark (the runtime's poison-record policy takes over for
    /// a record that keeps failing).
    #[default]
    Fail,
    /// Write the batch again in halves (halves of what fails again) until
    /// the records that fail alone are found, write those to the
    /// dead-letter sink, and deliver the batch once that write is durable
    /// (fail it if it is not, or if there is no dead-letter sink).
    DeadLetter,
}

/// Configuration of a sink driver.
///
/// The fields are the options of a `[[sinks]]` entry in a configuration
/// file, under the same names and with the same defaults (the file spells
/// `retry` as a `[sinks.retry]` table and durations as `"50ms"`);
/// `channel_capacity` is Rust-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkDriverConfig {
    /// A batch is written once it holds this many records (default
    /// 8192).
    pub batch_max_records: usize,
    /// A batch is written once its encoding is this many bytes (default
    /// 4 MiB).
    pub batch_max_bytes: usize,
    /// A non-empty batch is written at the latest this long after its
    /// first record arrived (default 50 ms).
    pub linger: Duration,
    /// Writes in flight at once (at least 1; default 1, which keeps the
    /// sink's writes in order). Beside them the driver builds the next
    /// batch (it takes, checks and encodes input while they go), so it
    /// holds at most `concurrency` batches being written and one being
    /// built (its records, those the encoder refused included, within
    /// `batch_max_records` and `batch_max_bytes`), and for its next
    /// batches, emptied, the record vector of one batch written (at most
    /// twice `batch_max_records` rounded up to a power of two) and the
    /// byte buffers of two (each at most twice `batch_max_bytes`), which
    /// the in-flight limits do not count. Exactly-once drivers
    /// use 1 and take no input while it is written: they skip what their
    /// sink's progress covers, which the write moves only as it returns.
    pub concurrency: usize,
    /// Capacity of the input channel, in items (`Acked<Vec<Record>>`).
    pub channel_capacity: usize,
    /// Retrying retryable errors.
    pub retry: RetryPolicy,
    /// Limit of each write attempt, if any (default 30 s; a timed-out
    /// attempt is retryable).
    pub write_timeout: Option<Duration>,
    /// What to do with a batch that failed for good because of its data.
    pub on_permanent_error: PermanentErrorPolicy,
}

impl Default for SinkDriverConfig {
    fn default() -> Self {
        SinkDriverConfig {
            batch_max_records: 8192,
            batch_max_bytes: 4 << 20,
            linger: Duration::from_millis(50),
            concurrency: 1,
            channel_capacity: 64,
            retry: RetryPolicy::default(),
            write_timeout: Some(Duration::from_secs(30)),
            on_permanent_error: PermanentErrorPolicy::Fail,
        }
    }
}

impl SinkDriverConfig {
    /// Check every limit's range: `batch_max_records`, `batch_max_bytes`,
    /// `concurrency` and `channel_capacity` at least 1, a
    /// `write_timeout` longer than zero. A driver spawned with a config
    /// that fails this stops at once with the error (and fails whatever
    /// was sent to it) rather than run with a limit it can never meet.
    ///
    /// # Errors
    ///
    /// [`SinkDriverError::InvalidConfig`] naming the first offending field.
    pub fn validate(&self) -> Result<(), SinkDriverError> {
        let at_least_one = [
            ("batch_max_records", self.batch_max_records),
            ("batch_max_bytes", self.batch_max_bytes),
            ("concurrency", self.concurrency),
            ("channel_capacity", self.channel_capacity),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(SinkDriverError::InvalidConfig(format!(
                "{field} must be at least 1"
            )));
        }
        if self.write_timeout.is_some_and(|t| t.is_zero()) {
            return Err(SinkDriverError::InvalidConfig(
                "write_timeout must be longer than zero".to_owned(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_limits_are_refused_by_name() {
        assert!(SinkDriverConfig::default().validate().is_ok());
        let cases = [
            SinkDriverConfig {
                batch_max_records: 0,
                ..SinkDriverConfig::default()
            },
            SinkDriverConfig {
                batch_max_bytes: 0,
                ..SinkDriverConfig::default()
            },
            SinkDriverConfig {
                concurrency: 0,
                ..SinkDriverConfig::default()
            },
            SinkDriverConfig {
                channel_capacity: 0,
                ..SinkDriverConfig::default()
            },
            SinkDriverConfig {
                write_timeout: Some(Duration::ZERO),
                ..SinkDriverConfig::default()
            },
        ];
        let fields = [
            "batch_max_records",
            "batch_max_bytes",
            "concurrency",
            "channel_capacity",
            "write_timeout",
        ];
        for (config, field) in cases.iter().zip(fields) {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
