//! The periodic progress report: a live status line on a terminal, a
//! structured log line otherwise.

use std::io::Write;
use std::time::{Duration, Instant};

/// Totals the progress report is computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgressTotals {
    /// Records read from the source.
    pub read: u64,
    /// Records durably written (summed over sinks).
    pub written: u64,
    /// Records dropped on purpose by transforms.
    pub filtered: u64,
    /// Records written to the dead-letter sink.
    pub dead_lettered: u64,
    /// Poll batches in flight (opened, not yet resolved).
    pub in_flight_batches: u64,
    /// Payload bytes in flight.
    pub in_flight_bytes: u64,
    /// Records read but not yet committed, summed over partitions (offsets
    /// between the committed offset and the fetched position).
    pub lag: u64,
    /// Committed offsets, as `partition=offset` pairs.
    pub committed: Vec<(u32, i64)>,
}

/// Turns successive totals into rates and prints them.
#[derive(Debug)]
pub struct ProgressReporter {
    status_line: bool,
    last: Option<(Instant, u64)>,
}

impl ProgressReporter {
    /// A reporter drawing a status line (`true`, on a terminal) or
    /// emitting `tracing` info events.
    #[must_use]
    pub fn new(status_line: bool) -> Self {
        ProgressReporter {
            status_line,
            last: None,
        }
    }

    /// Records per second since the previous report.
    fn rate(&mut self, now: Instant, read: u64) -> f64 {
        let rate = match self.last {
            Some((at, before)) => {
                let secs = now.duration_since(at).as_secs_f64();
                if secs > 0.0 {
                    read.saturating_sub(before) as f64 / secs
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        self.last = Some((now, read));
        rate
    }

    /// Report `totals` now.
    pub fn report(&mut self, totals: &ProgressTotals) {
        let rate = self.rate(Instant::now(), totals.read);
        let committed = render_committed(&totals.committed);
        if self.status_line {
            let line = format!(
                "{:>10.0} rec/s | read {} written {} filtered {} dead {} | in flight {} batches {} | lag {} | committed {}",
                rate,
                totals.read,
                totals.written,
                totals.filtered,
                totals.dead_lettered,
                totals.in_flight_batches,
                human_bytes(totals.in_flight_bytes),
                totals.lag,
                committed
            );
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else {
            tracing::info!(
                records_per_sec = rate.round() as u64,
                read = totals.read,
                written = totals.written,
                filtered = totals.filtered,
                dead_lettered = totals.dead_lettered,
                in_flight_batches = totals.in_flight_batches,
                in_flight_bytes = totals.in_flight_bytes,
                lag = totals.lag,
                committed = %committed,
                "progress"
            );
        }
    }

    /// End the status line so later output starts on a fresh line.
    pub fn finish(&self) {
        if self.status_line {
            // Standard error may be closed or full: never a reason to fail.
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// The interval between two reports, from seconds given on the command
/// line (at least 50 ms).
#[must_use]
pub fn report_interval(secs: f64) -> Duration {
    Duration::from_secs_f64(if secs.is_finite() {
        secs.max(0.05)
    } else {
        1.0
    })
}

fn render_committed(committed: &[(u32, i64)]) -> String {
    const SHOWN: usize = 4;
    let mut parts: Vec<String> = committed
        .iter()
        .take(SHOWN)
        .map(|(p, o)| format!("{p}={o}"))
        .collect();
    if committed.len() > SHOWN {
        parts.push(format!("+{} more", committed.len() - SHOWN));
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(",")
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_deltas() {
        let mut r = ProgressReporter::new(false);
        let t0 = Instant::now();
        assert_eq!(r.rate(t0, 100), 0.0);
        let rate = r.rate(t0 + Duration::from_secs(2), 300);
        assert!((rate - 100.0).abs() < 1e-9);
    }

    #[test]
    fn committed_offsets_are_abbreviated() {
        assert_eq!(render_committed(&[]), "-");
        let many: Vec<_> = (0..6).map(|p| (p, 10)).collect();
        assert_eq!(render_committed(&many), "0=10,1=10,2=10,3=10,+2 more");
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(3 << 20), "3.0MiB");
        assert_eq!(report_interval(0.0), Duration::from_millis(50));
    }
}
