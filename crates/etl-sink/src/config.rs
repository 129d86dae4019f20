//! How a sink driver batches, retries and handles failures.

use std::time::Duration;

use crate::{RetryPolicy, SinkError};

/// What the driver does with a batch that failed for good because of its
/// data ([`FailureKind::Data`](crate::FailureKind::Data)). A failure of
/// the environment halts the driver whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnPermanentFailure {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// A batch is written once it holds this many records.
    pub max_records: usize,
    /// A batch is written once its encoding is this many bytes.
    pub max_bytes: usize,
    /// A non-empty batch is written at the latest this long after its
    /// first record arrived.
    pub linger: Duration,
    /// Writes in flight at once (at least 1). Exactly-once drivers use 1.
    pub max_in_flight: usize,
    /// Capacity of the input channel, in items (`Acked<Vec<Record>>`).
    pub channel_capacity: usize,
    /// Retrying retryable errors.
    pub retry: RetryPolicy,
    /// Limit of each write attempt, if any (a timed-out attempt is
    /// retryable).
    pub write_timeout: Option<Duration>,
    /// What to do with a batch that failed for good.
    pub on_permanent_failure: OnPermanentFailure,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            max_records: 1000,
            max_bytes: 1 << 20,
            linger: Duration::from_millis(10),
            max_in_flight: 4,
            channel_capacity: 64,
            retry: RetryPolicy::default(),
            write_timeout: None,
            on_permanent_failure: OnPermanentFailure::Fail,
        }
    }
}

impl DriverConfig {
    /// Check every limit's range: `max_records`, `max_bytes`,
    /// `max_in_flight` and `channel_capacity` at least 1, a
    /// `write_timeout` longer than zero. A driver spawned with a config
    /// that fails this stops at once with the error (and fails whatever
    /// was sent to it) rather than run with a limit it can never meet.
    ///
    /// # Errors
    ///
    /// [`SinkError::InvalidConfig`] naming the first offending field.
    pub fn validate(&self) -> Result<(), SinkError> {
        let at_least_one = [
            ("max_records", self.max_records),
            ("max_bytes", self.max_bytes),
            ("max_in_flight", self.max_in_flight),
            ("channel_capacity", self.channel_capacity),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(SinkError::InvalidConfig(format!(
                "{field} must be at least 1"
            )));
        }
        if self.write_timeout.is_some_and(|t| t.is_zero()) {
            return Err(SinkError::InvalidConfig(
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
        assert!(DriverConfig::default().validate().is_ok());
        let cases = [
            DriverConfig {
                max_records: 0,
                ..DriverConfig::default()
            },
            DriverConfig {
                max_bytes: 0,
                ..DriverConfig::default()
            },
            DriverConfig {
                max_in_flight: 0,
                ..DriverConfig::default()
            },
            DriverConfig {
                channel_capacity: 0,
                ..DriverConfig::default()
            },
            DriverConfig {
                write_timeout: Some(Duration::ZERO),
                ..DriverConfig::default()
            },
        ];
        let fields = [
            "max_records",
            "max_bytes",
            "max_in_flight",
            "channel_capacity",
            "write_timeout",
        ];
        for (config, field) in cases.iter().zip(fields) {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
