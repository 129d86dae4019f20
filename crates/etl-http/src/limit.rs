//! What makes a request wait before it is sent: the rate limit and the
//! service's `Retry-After`.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::RateLimitConfig;

/// A rate limit of requests and body bytes per second, by spacing: each
/// request is given the earliest start at which neither limit is
/// exceeded, and the next one starts its cost later (a request of `n`
/// bytes costs `n / bytes_per_second`). So any window of `w` seconds
/// holds at most `w * requests_per_second + 1` requests, and no request
/// is ever dropped: a request waits for its turn, however large.
///
/// A hand-written pacer rather than a crate such as `governor`: a
/// request larger than a bucket's burst is refused there for good,
/// where here it waits its (longer) turn.
#[derive(Debug)]
pub(crate) struct RateLimit {
    requests: Option<f64>,
    bytes: Option<f64>,
    /// When the next request may start.
    next: Mutex<Option<Instant>>,
}

impl RateLimit {
    pub(crate) fn new(config: &RateLimitConfig) -> Result<Self, String> {
        for (name, value) in [
            ("requests_per_second", config.requests_per_second),
            ("bytes_per_second", config.bytes_per_second),
        ] {
            if let Some(v) = value
                && !(v.is_finite() && v > 0.0)
            {
                return Err(format!("rate_limit.{name} must be above 0, not {v}"));
            }
        }
        Ok(RateLimit {
            requests: config.requests_per_second,
            bytes: config.bytes_per_second,
            next: Mutex::new(None),
        })
    }

    /// Wait for the turn of a request of `bytes` body bytes.
    pub(crate) async fn acquire(&self, bytes: usize) {
        let cost = self.requests.map_or(0.0, |r| 1.0 / r).max(
            self.bytes
                // Precision is of no matter at the sizes of a body.
                .map_or(0.0, |b| bytes as f64 / b),
        );
        let cost = Duration::try_from_secs_f64(cost).unwrap_or(Duration::from_secs(3600));
        let turn = {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let start = next.map_or(now, |at| at.max(now));
            let turn = Turn {
                limit: self,
                before: *next,
                after: start + cost,
                taken: false,
            };
            *next = Some(turn.after);
            turn
        };
        let start = turn.after - cost;
        tokio::time::sleep_until(start).await;
        turn.take();
    }
}

/// A request's reserved turn, given back when its wait is given up (the
/// write was cancelled by its timeout) and no later request was spaced
/// after it: otherwise every retry would push the schedule further out.
struct Turn<'a> {
    limit: &'a RateLimit,
    before: Option<Instant>,
    after: Instant,
    taken: bool,
}

impl Turn<'_> {
    fn take(mut self) {
        self.taken = true;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let mut next = self
            .limit
            .next
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *next == Some(self.after) {
            *next = self.before;
        }
    }
}

/// The time before which the service asked not to be sent anything
/// (its last `Retry-After`). Every request of the sink waits for it, so
/// a retried write, and every other write in flight, honours it.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    until: Mutex<Option<Instant>>,
}

impl Pause {
    /// Send nothing before `wait` from now (a later pause stands).
    pub(crate) fn extend(&self, wait: Duration) {
        let at = Instant::now() + wait;
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if until.is_none_or(|u| u < at) {
            *until = Some(at);
        }
    }

    /// Wait until the pause is over.
    pub(crate) async fn wait(&self) {
        let until = *self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = until {
            tokio::time::sleep_until(at).await;
        }
    }
}

/// The wait a `Retry-After` value asks for: delay-seconds, or an HTTP
/// date (a date in the past asks for none), at most `max`.
pub(crate) fn retry_after(value: &str, now: SystemTime, max: Duration) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(seconds) = value.parse::<u64>() {
        Duration::from_secs(seconds)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_is_capped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let max = Duration::from_secs(60);
        assert_eq!(retry_after(" 3 ", now, max), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("3600", now, max), Some(max));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(retry_after(&later, now, max), Some(Duration::from_secs(7)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(retry_after(&earlier, now, max), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now, max), None);
        assert_eq!(retry_after("-1", now, max), None);
    }

    #[test]
    fn a_rate_limit_of_zero_or_nan_is_refused() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let config = RateLimitConfig {
                requests_per_second: Some(bad),
                bytes_per_second: None,
            };
            assert!(RateLimit::new(&config).is_err(), "{bad}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_gives_its_turn_back() {
        // A write cancelled by its timeout while waiting must not push
        // every later request back: retried, it would never be sent.
        let limit = RateLimit::new(&RateLimitConfig {
            requests_per_second: Some(1.0),
            bytes_per_second: None,
        })
        .unwrap();
        let start = Instant::now();
        limit.acquire(0).await;
        for _ in 0..3 {
            let waited = tokio::time::timeout(Duration::from_millis(100), limit.acquire(0)).await;
            assert!(waited.is_err());
        }
        limit.acquire(0).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_spaced_by_the_larger_of_their_costs() {
        let limit = RateLimit::new(&RateLimitConfig {
            requests_per_second: Some(10.0),
            bytes_per_second: Some(1000.0),
        })
        .unwrap();
        let start = Instant::now();
        limit.acquire(10).await; // costs 100 ms (the request limit)
        limit.acquire(500).await; // starts at 100 ms, costs 500 ms
        limit.acquire(0).await; // starts at 600 ms
        assert_eq!(start.elapsed(), Duration::from_millis(600));
    }
}
