//! Live metrics of a running pipeline, gathered from its parts.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use etl_checkpoint::{CheckpointHandle, CheckpointMetrics};
use etl_sink::SinkMetrics;
use etl_source::{SourceMetrics, SourceMetricsHandle};

use super::fanout::StageCounters;
use crate::metrics::{ProgressTotals, PromKind, PromText};

type SinkMetricsFn = Box<dyn Fn() -> Option<SinkMetrics> + Send + Sync>;

/// Where one sink's metrics come from: the live driver while it runs, its
/// final figures after it closed.
pub(crate) struct SinkSlot {
    live: SinkMetricsFn,
    last: Mutex<SinkMetrics>,
}

impl SinkSlot {
    pub(crate) fn new(live: SinkMetricsFn) -> Arc<Self> {
        Arc::new(SinkSlot {
            live,
            last: Mutex::new(SinkMetrics::default()),
        })
    }

    fn read(&self) -> SinkMetrics {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(now) = (self.live)() {
            *last = now;
        }
        *last
    }

    /// Record the final figures of a closed driver.
    pub(crate) fn finish(&self, metrics: SinkMetrics) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = metrics;
    }
}

#[derive(Default)]
struct Parts {
    source: Option<SourceMetricsHandle>,
    checkpoint: Option<CheckpointHandle>,
    sinks: Vec<(String, Arc<SinkSlot>)>,
    dead_letter: Option<Arc<SinkSlot>>,
}

/// Reads the metrics of a pipeline while it runs (and after). Cloning
/// shares it.
#[derive(Clone, Default)]
pub struct MetricsHub {
    stage: Arc<StageCounters>,
    parts: Arc<Mutex<Parts>>,
}

impl std::fmt::Debug for MetricsHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHub").finish_non_exhaustive()
    }
}

/// Everything the pipeline exposes, at one instant.
#[derive(Clone, Debug, Default)]
pub struct PipelineSnapshot {
    /// Records that entered the transforms.
    pub read: u64,
    /// Records dropped on purpose by transforms.
    pub filtered: u64,
    /// Records transforms rejected to the dead-letter path.
    pub rejected: u64,
    /// Per source partition.
    pub source: SourceMetrics,
    /// The checkpointer's view.
    pub checkpoint: CheckpointMetrics,
    /// Per sink, by name.
    pub sinks: Vec<(String, SinkMetrics)>,
    /// The dead-letter sink.
    pub dead_letter: Option<SinkMetrics>,
}

impl MetricsHub {
    pub(crate) fn stage(&self) -> Arc<StageCounters> {
        self.stage.clone()
    }

    fn parts(&self) -> std::sync::MutexGuard<'_, Parts> {
        self.parts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_source(&self, source: SourceMetricsHandle) {
        self.parts().source = Some(source);
    }

    pub(crate) fn set_checkpoint(&self, checkpoint: CheckpointHandle) {
        self.parts().checkpoint = Some(checkpoint);
    }

    pub(crate) fn add_sink(&self, name: String, slot: Arc<SinkSlot>) {
        self.parts().sinks.push((name, slot));
    }

    pub(crate) fn set_dead_letter(&self, slot: Arc<SinkSlot>) {
        self.parts().dead_letter = Some(slot);
    }

    /// Everything, now.
    #[must_use]
    pub fn snapshot(&self) -> PipelineSnapshot {
        let parts = self.parts();
        PipelineSnapshot {
            read: self.stage.read.load(Ordering::Relaxed),
            filtered: self.stage.filtered.load(Ordering::Relaxed),
            rejected: self.stage.rejected.load(Ordering::Relaxed),
            source: parts
                .source
                .as_ref()
                .map(SourceMetricsHandle::snapshot)
                .unwrap_or_default(),
            checkpoint: parts
                .checkpoint
                .as_ref()
                .map(CheckpointHandle::metrics)
                .unwrap_or_default(),
            sinks: parts
                .sinks
                .iter()
                .map(|(n, s)| (n.clone(), s.read()))
                .collect(),
            dead_letter: parts.dead_letter.as_ref().map(|s| s.read()),
        }
    }

    /// The progress line's totals, now.
    #[must_use]
    pub fn totals(&self) -> ProgressTotals {
        self.snapshot().totals()
    }

    /// The metrics as Prometheus text.
    #[must_use]
    pub fn prometheus(&self) -> String {
        self.snapshot().prometheus()
    }
}

impl PipelineSnapshot {
    /// The progress line's totals.
    #[must_use]
    pub fn totals(&self) -> ProgressTotals {
        let cp = &self.checkpoint.partitions;
        let lag = self
            .source
            .partitions
            .iter()
            .filter_map(|(p, s)| {
                let position = s.position?;
                let committed = cp.get(p).and_then(|c| c.committed).unwrap_or_default();
                Some(position.0.saturating_sub(committed.0).max(0) as u64)
            })
            .sum();
        ProgressTotals {
            read: self.read,
            written: self.sinks.iter().map(|(_, m)| m.records_written).sum(),
            filtered: self.filtered,
            dead_lettered: self.dead_letter.as_ref().map_or(0, |m| m.records_written),
            in_flight_batches: cp.values().map(|p| p.in_flight_batches).sum(),
            in_flight_bytes: cp.values().map(|p| p.in_flight_bytes).sum(),
            lag,
            committed: cp
                .iter()
                .filter_map(|(p, m)| m.committed.map(|c| (p.0, c.0)))
                .collect(),
        }
    }

    /// The metrics as Prometheus text (ARCHITECTURE §5: per partition and
    /// per sink).
    #[must_use]
    pub fn prometheus(&self) -> String {
        use PromKind::{Counter, Gauge};
        let mut p = PromText::new();
        p.sample(
            "etl_records_read_total",
            Counter,
            "Records that entered the transforms.",
            &[],
            self.read as f64,
        );
        p.sample(
            "etl_records_filtered_total",
            Counter,
            "Records dropped on purpose by transforms.",
            &[],
            self.filtered as f64,
        );
        p.sample(
            "etl_records_rejected_total",
            Counter,
            "Records transforms sent to the dead-letter path.",
            &[],
            self.rejected as f64,
        );
        let part = |id: &etl_record::PartitionId| id.0.to_string();
        let src = &self.source.partitions;
        let cp = &self.checkpoint.partitions;
        for (id, s) in src {
            if let Some(pos) = s.position {
                p.sample(
                    "etl_partition_fetched_position",
                    Gauge,
                    "Next offset the source will read.",
                    &[("partition", &part(id))],
                    pos.0 as f64,
                );
            }
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_watermark",
                Gauge,
                "Delivered watermark: every offset below was delivered.",
                &[("partition", &part(id))],
                m.watermark.0 as f64,
            );
        }
        for (id, m) in cp {
            if let Some(c) = m.committed {
                p.sample(
                    "etl_partition_committed_offset",
                    Gauge,
                    "Last committed offset.",
                    &[("partition", &part(id))],
                    c.0 as f64,
                );
            }
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_in_flight_batches",
                Gauge,
                "Batches opened and not yet resolved.",
                &[("partition", &part(id))],
                m.in_flight_batches as f64,
            );
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_in_flight_bytes",
                Gauge,
                "Payload bytes in flight.",
                &[("partition", &part(id))],
                m.in_flight_bytes as f64,
            );
        }
        for (id, m) in cp {
            let age = m.oldest_unresolved_age.map_or(0.0, |d| d.as_secs_f64());
            p.sample(
                "etl_partition_oldest_unresolved_seconds",
                Gauge,
                "Age of the oldest unresolved batch.",
                &[("partition", &part(id))],
                age,
            );
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_failed_batches_total",
                Counter,
                "Batches that failed.",
                &[("partition", &part(id))],
                m.failed_batches as f64,
            );
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_replays_total",
                Counter,
                "Replays requested.",
                &[("partition", &part(id))],
                m.replays as f64,
            );
        }
        for (id, m) in cp {
            p.sample(
                "etl_partition_stale_acks_total",
                Counter,
                "Acknowledgements of ended epochs discarded.",
                &[("partition", &part(id))],
                m.stale_acks as f64,
            );
        }
        p.sample(
            "etl_commits_total",
            Counter,
            "Successful offset commits.",
            &[],
            self.checkpoint.commits as f64,
        );
        p.sample(
            "etl_commit_errors_total",
            Counter,
            "Failed offset commits.",
            &[],
            self.checkpoint.commit_errors as f64,
        );
        let mut sinks: Vec<(&str, &SinkMetrics)> =
            self.sinks.iter().map(|(n, m)| (n.as_str(), m)).collect();
        if let Some(d) = &self.dead_letter {
            sinks.push(("dead_letter", d));
        }
        type Field = fn(&SinkMetrics) -> f64;
        let families: [(&'static str, PromKind, &str, Field); 6] = [
            (
                "etl_sink_records_written_total",
                Counter,
                "Records durably written.",
                |m| m.records_written as f64,
            ),
            (
                "etl_sink_bytes_written_total",
                Counter,
                "Bytes durably written.",
                |m| m.bytes_written as f64,
            ),
            ("etl_sink_retries_total", Counter, "Write retries.", |m| {
                m.retries as f64
            }),
            (
                "etl_sink_dead_lettered_total",
                Counter,
                "Records sent to the dead-letter sink.",
                |m| m.dead_lettered as f64,
            ),
            (
                "etl_sink_write_latency_mean_seconds",
                Gauge,
                "Mean write latency.",
                |m| m.write_latency_mean().as_secs_f64(),
            ),
            (
                "etl_sink_write_latency_max_seconds",
                Gauge,
                "Longest write.",
                |m| m.write_latency_max.as_secs_f64(),
            ),
        ];
        for (name, kind, help, field) in families {
            for (sink, m) in &sinks {
                p.sample(name, kind, help, &[("sink", sink)], field(m));
            }
        }
        p.finish()
    }
}
