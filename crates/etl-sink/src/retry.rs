//! Retrying retryable errors with exponential backoff and full jitter.

use std::future::Future;
use std::time::Duration;

use rand::RngExt as _;
use tokio::time::Instant;

use crate::SinkError;

/// When and how long to retry a write that failed with a retryable error.
///
/// The wait before retry `n` (from 0) is drawn uniformly from
/// `[0, min(max_backoff, initial_backoff * 2^n)]` ("full jitter", which
/// spreads the retries of many writers). Retrying stops when the next wait
/// would end past `max_elapsed` after the first attempt, or after
/// `max_retries` retries; the last error is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first wait.
    pub initial_backoff: Duration,
    /// Upper bound of any wait.
    pub max_backoff: Duration,
    /// Give up when the next wait would end later than this after the
    /// first attempt.
    pub max_elapsed: Duration,
    /// Give up after this many retries, if set.
    pub max_retries: Option<u32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(60),
            max_retries: None,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    #[must_use]
    pub fn never() -> Self {
        RetryPolicy {
            max_retries: Some(0),
            ..RetryPolicy::default()
        }
    }

    /// The largest wait before retry `n` (the jitter draws below it).
    #[must_use]
    pub fn backoff_cap(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// A jittered wait before retry `n`.
    #[must_use]
    pub fn backoff(&self, n: u32) -> Duration {
        let cap = u64::try_from(self.backoff_cap(n).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=cap))
    }

    /// Run `attempt` until it succeeds, fails with an error that is not
    /// retryable, or the policy gives up. `on_retry` is called before each
    /// retry with the error that caused it.
    ///
    /// # Errors
    ///
    /// The last error.
    pub async fn run<F, Fut>(
        &self,
        mut attempt: F,
        mut on_retry: impl FnMut(&SinkError),
    ) -> Result<(), SinkError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), SinkError>>,
    {
        let start = Instant::now();
        let mut retries = 0u32;
        loop {
            let err = match attempt().await {
                Err(err) if err.is_retryable() => err,
                other => return other,
            };
            if self.max_retries.is_some_and(|max| retries >= max) {
                return Err(err);
            }
            let wait = self.backoff(retries);
            if start.elapsed() + wait > self.max_elapsed {
                return Err(err);
            }
            tracing::debug!(retry = retries + 1, ?wait, error = %err, "retrying sink write");
            on_retry(&err);
            tokio::time::sleep(wait).await;
            retries += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FailEveryNth, MemorySink};
    use crate::{EncodedBatch, Sink};

    #[test]
    fn caps_grow_exponentially_then_saturate() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(70),
            ..RetryPolicy::default()
        };
        let caps: Vec<_> = (0..5).map(|n| p.backoff_cap(n).as_millis()).collect();
        assert_eq!(caps, vec![10, 20, 40, 70, 70]);
        assert_eq!(p.backoff_cap(200), Duration::from_millis(70));
        for n in 0..50 {
            assert!(p.backoff(n) <= p.backoff_cap(n));
        }
    }

    /// Write one empty batch to `sink` under `policy`; the retries made.
    async fn write(sink: &impl Sink, policy: &RetryPolicy) -> (Result<(), SinkError>, u64) {
        let batch = EncodedBatch::default();
        let mut retries = 0;
        let result = policy.run(|| sink.write(&batch), |_| retries += 1).await;
        (result, retries)
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_errors_only() {
        let memory = MemorySink::new();
        // Calls 2, 4, ... fail: the second write needs one retry.
        let sink = FailEveryNth::transient(memory.clone(), 2);
        let policy = RetryPolicy::default();
        assert_eq!(write(&sink, &policy).await.1, 0);
        let (result, retries) = write(&sink, &policy).await;
        result.unwrap();
        assert_eq!(retries, 1);
        assert_eq!(memory.writes(), 2);

        let permanent = FailEveryNth::permanent(MemorySink::new(), 1);
        let (result, retries) = write(&permanent, &policy).await;
        assert!(matches!(result.unwrap_err(), SinkError::Permanent(_)));
        assert_eq!(retries, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_elapsed() {
        let policy = RetryPolicy {
            max_elapsed: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        let memory = MemorySink::new();
        let sink = FailEveryNth::transient(memory.clone(), 1);
        let start = Instant::now();
        let (result, retries) = write(&sink, &policy).await;
        assert!(result.unwrap_err().is_retryable());
        assert!(start.elapsed() <= Duration::from_secs(2));
        assert!(retries > 0);
        assert_eq!(memory.writes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_retries() {
        let policy = RetryPolicy {
            max_retries: Some(3),
            ..RetryPolicy::default()
        };
        let sink = FailEveryNth::transient(MemorySink::new(), 1);
        let (result, retries) = write(&sink, &policy).await;
        assert!(result.unwrap_err().is_retryable());
        assert_eq!(retries, 3);
    }
}
