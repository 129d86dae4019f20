//! How a sink driver batches, retries and handles failures.

use std::time::Duration;

use crate::RetryPolicy;

/// What the driver does with a batch that failed for good (a permanent
/// error, or retryable errors past the retry policy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnPermanentFailure {
    /// Fail the batch's acknowledgements: its partitions replay from
    /// their watermark (the runtime's poison-record policy takes over for
    /// a record that keeps failing).
    #[default]
    Fail,
    /// Write the batch's records to the dead-letter sink, and deliver them
    /// once that write is durable (fail them if it is not, or if there is
    /// no dead-letter sink).
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
