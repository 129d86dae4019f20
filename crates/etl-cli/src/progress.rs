//! The periodic progress report: a live status line on a terminal (drawn
//! by `indicatif`, cut to the terminal's width and cleared when the run
//! ends), a structured log line otherwise.

use std::time::{Duration, Instant};

use etl::{CommittedTotals, ProgressTotals};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What a source's offsets count, for the units of the lag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OffsetUnit {
    /// Byte positions in files.
    Bytes,
    /// Record or message numbers.
    Records,
}

/// What is known of the input before the run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InputShape {
    /// What offsets count.
    pub(crate) unit: OffsetUnit,
    /// The input's total size in offsets, when it is bounded and known
    /// (files read to their end): then the report shows how far along the
    /// run is and when it should end.
    pub(crate) total: Option<u64>,
}

/// Turns successive totals into rates and reports them.
pub(crate) struct ProgressReporter {
    bar: Option<ProgressBar>,
    shape: InputShape,
    /// When the run started: the ETA comes from the average rate since.
    start: Instant,
    /// The previous report (the start, before the first).
    last: (Instant, u64, u64),
}

impl ProgressReporter {
    /// A reporter drawing a status line on standard error (`true`, on a
    /// terminal) or emitting `tracing` info events. Rates count from now.
    pub(crate) fn new(status_line: bool, shape: InputShape) -> Self {
        let bar = status_line.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar
        });
        let start = Instant::now();
        ProgressReporter {
            bar,
            shape,
            start,
            last: (start, 0, 0),
        }
    }

    /// Report `totals` now.
    pub(crate) fn report(&mut self, totals: &ProgressTotals) {
        let done = done(totals);
        let (rate, done_rate) = self.advance(Instant::now(), totals.read, done);
        let eta = self
            .shape
            .total
            .map(|total| Eta::new(done, total, done_rate));
        match &self.bar {
            Some(bar) => bar.set_message(line(totals, rate, self.shape.unit, eta)),
            None => {
                let lag = totals.lag;
                let unit = match self.shape.unit {
                    OffsetUnit::Bytes => "bytes",
                    OffsetUnit::Records => "records",
                };
                tracing::info!(
                    records_per_sec = rate.round() as u64,
                    read = totals.read,
                    written = totals.written,
                    filtered = totals.filtered,
                    dead_lettered = totals.dead_lettered,
                    in_flight_batches = totals.in_flight_batches,
                    in_flight_bytes = totals.in_flight_bytes,
                    lag,
                    lag_unit = unit,
                    percent_done = eta.map(|e| e.percent),
                    eta_seconds = eta.and_then(|e| e.remaining).map(|d| d.as_secs()),
                    committed = %render_committed(&totals.committed),
                    source = %render_gauges(totals),
                    "progress"
                );
            }
        }
    }

    /// Records read per second since the previous report (or the start),
    /// and offsets committed per second since the start (commits come in
    /// steps: the average keeps the ETA steady).
    fn advance(&mut self, now: Instant, read: u64, done: u64) -> (f64, f64) {
        let (at, read_before, _) = self.last;
        let secs = now.duration_since(at).as_secs_f64();
        self.last = (now, read, done);
        (
            per_second(read.saturating_sub(read_before), secs),
            per_second(done, now.duration_since(self.start).as_secs_f64()),
        )
    }

    /// Clear the status line, so what follows starts on a clean line.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// How far along a bounded run is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Eta {
    /// Committed share of the input, 0-100.
    pub(crate) percent: u8,
    /// Time left at the current rate; `None` while nothing moves.
    pub(crate) remaining: Option<Duration>,
}

impl Eta {
    fn new(done: u64, total: u64, rate: f64) -> Self {
        let percent = if total == 0 {
            100
        } else {
            (done.min(total) as f64 * 100.0 / total as f64).floor() as u8
        };
        let left = total.saturating_sub(done);
        let remaining = if left == 0 {
            Some(Duration::ZERO)
        } else if rate > 0.0 {
            Some(Duration::from_secs_f64(left as f64 / rate))
        } else {
            None
        };
        Eta { percent, remaining }
    }
}

/// The committed offsets, summed: for files, the bytes behind every
/// commit.
fn done(totals: &ProgressTotals) -> u64 {
    totals.committed.sum
}

fn per_second(delta: u64, secs: f64) -> f64 {
    if secs > 0.0 { delta as f64 / secs } else { 0.0 }
}

/// The status line.
fn line(totals: &ProgressTotals, rate: f64, unit: OffsetUnit, eta: Option<Eta>) -> String {
    let lag = match unit {
        OffsetUnit::Bytes => human_bytes(totals.lag),
        OffsetUnit::Records => format!("{} records", totals.lag),
    };
    let mut line = String::new();
    if let Some(eta) = eta {
        let left = eta.remaining.map_or_else(|| "?".to_owned(), human_duration);
        line.push_str(&format!("{:>3}% committed, ETA {left} | ", eta.percent));
    }
    line.push_str(&format!(
        "{:.0} records/s | read {} written {} filtered {} dead-lettered {} | in flight {} batches, {} | lag {lag} | committed {}",
        rate,
        totals.read,
        totals.written,
        totals.filtered,
        totals.dead_lettered,
        totals.in_flight_batches,
        human_bytes(totals.in_flight_bytes),
        render_committed(&totals.committed),
    ));
    if !totals.source_gauges.is_empty() {
        line.push_str(" | ");
        line.push_str(&render_gauges(totals));
    }
    line
}

/// The source's own figures, `name value` each (a size in bytes when the
/// name ends in `_bytes`); those the metrics leave out are left out.
fn render_gauges(totals: &ProgressTotals) -> String {
    let mut parts: Vec<String> = Vec::new();
    for gauge in totals.source_gauges.iter().filter(|g| g.has_valid_name()) {
        let part = match gauge.name.strip_suffix("_bytes") {
            Some(name) => format!("{name} {}", human_bytes(gauge.value.max(0) as u64)),
            None => format!("{} {}", gauge.name, gauge.value),
        };
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    parts.join(", ")
}

/// The interval between two reports, from seconds given on the command
/// line (at least 50 ms).
pub(crate) fn report_interval(secs: f64) -> Duration {
    Duration::from_secs_f64(if secs.is_finite() {
        secs.max(0.05)
    } else {
        1.0
    })
}

pub(crate) fn render_committed(committed: &CommittedTotals) -> String {
    let mut parts: Vec<String> = committed
        .first
        .iter()
        .map(|(p, o)| format!("{p}={o}"))
        .collect();
    let more = committed.partitions.saturating_sub(parts.len() as u64);
    if more > 0 {
        parts.push(format!("+{more} more"));
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
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId};

    fn totals(read: u64, committed: i64) -> ProgressTotals {
        ProgressTotals {
            read,
            written: read,
            lag: 86_377_777,
            committed: CommittedTotals::of([(PartitionId(7), Offset(committed))]),
            ..ProgressTotals::default()
        }
    }

    #[test]
    fn the_first_report_has_a_rate_counted_from_the_start() {
        let shape = InputShape {
            unit: OffsetUnit::Records,
            total: None,
        };
        let mut r = ProgressReporter::new(false, shape);
        let start = r.last.0;
        let (rate, _) = r.advance(start + Duration::from_secs(2), 3_200_000, 0);
        assert!((rate - 1_600_000.0).abs() < 1e-6, "{rate}");
        let (rate, _) = r.advance(start + Duration::from_secs(3), 3_300_000, 0);
        assert!((rate - 100_000.0).abs() < 1e-6, "{rate}");
    }

    #[test]
    fn every_figure_has_its_unit_and_a_bounded_run_its_share_and_eta() {
        let eta = Eta::new(250, 1000, 50.0);
        assert_eq!(
            eta,
            Eta {
                percent: 25,
                remaining: Some(Duration::from_secs(15))
            }
        );
        let text = line(&totals(10, 250), 1234.4, OffsetUnit::Bytes, Some(eta));
        assert!(
            text.starts_with(" 25% committed, ETA 15s | 1234 records/s"),
            "{text}"
        );
        assert!(text.contains("lag 82.4 MiB"), "{text}");
        assert!(text.contains("in flight 0 batches, 0 B"), "{text}");
        let text = line(&totals(10, 250), 0.0, OffsetUnit::Records, None);
        assert!(text.contains("lag 86377777 records"), "{text}");
        assert!(!text.contains('%'), "{text}");
        assert_eq!(Eta::new(0, 1000, 0.0).remaining, None, "nothing moves yet");
        assert_eq!(Eta::new(1000, 1000, 0.0).percent, 100);
        assert_eq!(human_duration(Duration::from_secs(3725)), "1h02m");
    }

    #[test]
    fn a_sources_own_figures_end_the_line_sizes_in_bytes() {
        let mut with = totals(10, 250);
        with.source_gauges = vec![
            etl_source::SourceGauge::new("retained_wal_bytes", "", 3 << 20),
            etl_source::SourceGauge::new("files_waiting", "", 4),
        ];
        let text = line(&with, 0.0, OffsetUnit::Records, None);
        assert!(
            text.ends_with(" | retained_wal 3.0 MiB, files_waiting 4"),
            "{text}"
        );
        let text = line(&totals(10, 250), 0.0, OffsetUnit::Records, None);
        assert!(text.ends_with("committed 7=250"), "{text}");
    }

    #[test]
    fn committed_offsets_are_abbreviated() {
        assert_eq!(render_committed(&CommittedTotals::default()), "-");
        let many = CommittedTotals::of((0..6).map(|p| (PartitionId(p), Offset(10))));
        assert_eq!(render_committed(&many), "0=10,1=10,2=10,3=10,+2 more");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(report_interval(0.0), Duration::from_millis(50));
    }
}
