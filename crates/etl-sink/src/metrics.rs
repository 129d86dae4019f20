//! Counters a sink driver keeps, and the snapshot it hands out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a sink driver has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkMetrics {
    /// Records durably written to the sink.
    pub records_written: u64,
    /// Encoded bytes durably written to the sink.
    pub bytes_written: u64,
    /// Batches durably written (fully or with rejects).
    pub batches_written: u64,
    /// Batches whose acknowledgements were failed (they will replay).
    pub batches_failed: u64,
    /// Source batches an exactly-once driver did not write because their
    /// partition was being handed over to another owner: they fail, and
    /// the next owner writes their records (see `AckSet::begin_write`).
    pub batches_fenced: u64,
    /// Write attempts repeated after a retryable error.
    pub retries: u64,
    /// Records durably written to the dead-letter sink.
    pub dead_lettered: u64,
    /// Records skipped because the sink's stored progress already covers
    /// them (exactly-once mode).
    pub skipped: u64,
    /// Number of latency samples (one per batch, from dispatch to outcome).
    pub write_count: u64,
    /// Sum of the write latencies.
    pub write_latency_total: Duration,
    /// The largest write latency.
    pub write_latency_max: Duration,
}

impl SinkMetrics {
    /// Mean write latency, or zero before the first write.
    #[must_use]
    pub fn write_latency_mean(&self) -> Duration {
        match u32::try_from(self.write_count) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.write_latency_total / n,
            Err(_) => Duration::from_nanos(
                u64::try_from(self.write_latency_total.as_nanos()).unwrap_or(u64::MAX)
                    / self.write_count,
            ),
        }
    }
}

/// The live counters, shared between the driver, its writes and the handle.
#[derive(Debug, Default)]
pub(crate) struct MetricsCell {
    pub(crate) records_written: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) batches_written: AtomicU64,
    pub(crate) batches_failed: AtomicU64,
    pub(crate) batches_fenced: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) skipped: AtomicU64,
    write_count: AtomicU64,
    latency_total_ns: AtomicU64,
    latency_max_ns: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl MetricsCell {
    pub(crate) fn record_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        add(&self.write_count, 1);
        add(&self.latency_total_ns, ns);
        self.latency_max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> SinkMetrics {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SinkMetrics {
            records_written: get(&self.records_written),
            bytes_written: get(&self.bytes_written),
            batches_written: get(&self.batches_written),
            batches_failed: get(&self.batches_failed),
            batches_fenced: get(&self.batches_fenced),
            retries: get(&self.retries),
            dead_lettered: get(&self.dead_lettered),
            skipped: get(&self.skipped),
            write_count: get(&self.write_count),
            write_latency_total: Duration::from_nanos(get(&self.latency_total_ns)),
            write_latency_max: Duration::from_nanos(get(&self.latency_max_ns)),
        }
    }
}
