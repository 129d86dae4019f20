//! Live metrics of a running pipeline, gathered from its parts.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use etl_checkpoint::{CheckpointHandle, CheckpointMetrics, PartitionMetrics, PublishedMetrics};
use etl_record::{Offset, PartitionId};
use etl_sink::SinkMetrics;
use etl_source::{PartitionSourceMetrics, SourceMetrics, SourceMetricsHandle};

use super::fanout::StageCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::metrics::{CommittedTotals, ProgressTotals};

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
    /// Records no route took and no unmatched sink received.
    pub unrouted: u64,
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
            unrouted: self.stage.unrouted.load(Ordering::Relaxed),
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

    /// The progress line's totals, now: the same as
    /// `snapshot().totals()`, summed where the metrics live instead of
    /// from a copy of every partition's figures (a file source has a
    /// partition per input file, and the report comes every second);
    /// nothing held per partition, not even its committed offset.
    #[must_use]
    pub fn totals(&self) -> ProgressTotals {
        let parts = self.parts();
        // The lag is read with the checkpointer's figures at hand: the
        // source's lock is taken inside the checkpointer's (never the
        // other way round), so neither is copied.
        let of_source = |checkpoint: &PublishedMetrics| {
            parts.source.as_ref().map_or_else(Default::default, |s| {
                s.with_metrics(|m| {
                    let committed = |p| checkpoint.partition(p).and_then(|c| c.committed);
                    (lag(m.partitions(), committed), m.gauges.clone())
                })
            })
        };
        let ((in_flight_batches, in_flight_bytes, committed), (lag, source_gauges)) =
            match &parts.checkpoint {
                Some(c) => c.with_metrics(|m| (checkpoint_totals(m.partitions()), of_source(m))),
                None => {
                    let none = PublishedMetrics::default();
                    (checkpoint_totals(none.partitions()), of_source(&none))
                }
            };
        ProgressTotals {
            read: self.stage.read.load(Ordering::Relaxed),
            written: parts
                .sinks
                .iter()
                .map(|(_, s)| s.read().records_written)
                .sum(),
            filtered: self.stage.filtered.load(Ordering::Relaxed),
            dead_lettered: parts
                .dead_letter
                .as_ref()
                .map_or(0, |s| s.read().records_written),
            in_flight_batches,
            in_flight_bytes,
            lag,
            committed,
            source_gauges,
        }
    }

    /// Add the pipeline's metrics to `registry` (read from this hub at
    /// every scrape), beside any of the application's own.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(HubCollector(self.clone())));
    }

    /// The metrics as OpenMetrics text (which Prometheus scrapes), now.
    #[must_use]
    pub fn prometheus(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// Batches and bytes in flight, summed over partitions, and the
/// committed offsets summed up.
fn checkpoint_totals(
    partitions: impl Iterator<Item = (PartitionId, PartitionMetrics)>,
) -> (u64, u64, CommittedTotals) {
    let (mut batches, mut bytes) = (0, 0);
    let committed = CommittedTotals::of(partitions.filter_map(|(p, m)| {
        batches += m.in_flight_batches;
        bytes += m.in_flight_bytes;
        m.committed.map(|c| (p, c))
    }));
    (batches, bytes, committed)
}

/// Offsets read and not committed, summed over partitions: each source
/// partition's position past its `committed` offset.
fn lag(
    source: impl Iterator<Item = (PartitionId, PartitionSourceMetrics)>,
    committed: impl Fn(PartitionId) -> Option<Offset>,
) -> u64 {
    source
        .filter_map(|(p, s)| {
            let position = s.position?;
            let committed = committed(p).unwrap_or_default();
            Some(position.0.saturating_sub(committed.0).max(0) as u64)
        })
        .sum()
}

impl PipelineSnapshot {
    /// The progress line's totals.
    #[must_use]
    pub fn totals(&self) -> ProgressTotals {
        let (in_flight_batches, in_flight_bytes, committed) = checkpoint_totals(
            self.checkpoint
                .partitions
                .iter()
                .map(|(p, m)| (*p, m.clone())),
        );
        ProgressTotals {
            read: self.read,
            written: self.sinks.iter().map(|(_, m)| m.records_written).sum(),
            filtered: self.filtered,
            dead_lettered: self.dead_letter.as_ref().map_or(0, |m| m.records_written),
            in_flight_batches,
            in_flight_bytes,
            lag: lag(self.source.partitions.iter().map(|(p, m)| (*p, *m)), |p| {
                self.checkpoint.partitions.get(&p).and_then(|m| m.committed)
            }),
            committed,
            source_gauges: self.source.gauges.clone(),
        }
    }

    /// Write every metric family of this snapshot (ARCHITECTURE §5: per
    /// partition and per sink) to a `prometheus-client` encoder.
    fn encode(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        type Labels = [(&'static str, String); 1];
        /// A family of labelled samples; nothing when there are none.
        fn family<M: EncodeMetric>(
            enc: &mut DescriptorEncoder<'_>,
            name: &str,
            help: &str,
            samples: impl IntoIterator<Item = (Labels, M)>,
        ) -> std::fmt::Result {
            let mut samples = samples.into_iter().peekable();
            let Some((_, first)) = samples.peek() else {
                return Ok(());
            };
            let mut metric = enc.encode_descriptor(name, help, None, first.metric_type())?;
            for (labels, value) in samples {
                value.encode(metric.encode_family(&labels)?)?;
            }
            Ok(())
        }
        /// A family of one sample without labels.
        fn single<M: EncodeMetric>(
            enc: &mut DescriptorEncoder<'_>,
            name: &str,
            help: &str,
            value: M,
        ) -> std::fmt::Result {
            value.encode(enc.encode_descriptor(name, help, None, value.metric_type())?)
        }
        let one = ConstCounter::new;
        let part = |id: &etl_record::PartitionId| [("partition", id.0.to_string())];
        let src = &self.source.partitions;
        let cp = &self.checkpoint.partitions;
        // Counters are named without `_total`: the encoder appends it.
        single(
            enc,
            "etl_records_read",
            "Records that entered the transforms.",
            one(self.read),
        )?;
        single(
            enc,
            "etl_records_filtered",
            "Records dropped on purpose by transforms.",
            one(self.filtered),
        )?;
        single(
            enc,
            "etl_records_rejected",
            "Records transforms sent to the dead-letter path.",
            one(self.rejected),
        )?;
        single(
            enc,
            "etl_records_unrouted",
            "Records no sink's route took and no unmatched sink received.",
            one(self.unrouted),
        )?;
        family(
            enc,
            "etl_partition_fetched_position",
            "Next offset the source will read.",
            src.iter()
                .filter_map(|(id, s)| Some((part(id), ConstGauge::new(s.position?.0)))),
        )?;
        family(
            enc,
            "etl_partition_watermark",
            "Delivered watermark: every offset below was delivered.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstGauge::new(m.watermark.0))),
        )?;
        family(
            enc,
            "etl_partition_high_watermark",
            "Offset after the partition's last record, as the broker last reported it.",
            src.iter()
                .filter_map(|(id, s)| Some((part(id), ConstGauge::new(s.high_watermark?.0)))),
        )?;
        family(
            enc,
            "etl_partition_lag",
            "Records the broker holds past the delivered watermark.",
            src.iter().filter_map(|(id, s)| {
                let lag = s.high_watermark?.0.saturating_sub(cp.get(id)?.watermark.0);
                Some((part(id), ConstGauge::new(lag.max(0))))
            }),
        )?;
        // The source's own figures, each a gauge of its own name; a name
        // Prometheus would refuse, or one seen before, is left out.
        let mut seen = std::collections::BTreeSet::new();
        for gauge in &self.source.gauges {
            if gauge.has_valid_name() && seen.insert(gauge.name) {
                single(
                    enc,
                    &format!("etl_source_{}", gauge.name),
                    gauge.help,
                    ConstGauge::new(gauge.value),
                )?;
            }
        }
        family(
            enc,
            "etl_partition_committed_offset",
            "Last committed offset.",
            cp.iter()
                .filter_map(|(id, m)| Some((part(id), ConstGauge::new(m.committed?.0)))),
        )?;
        family(
            enc,
            "etl_partition_in_flight_batches",
            "Batches opened and not yet resolved.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstGauge::new(m.in_flight_batches))),
        )?;
        family(
            enc,
            "etl_partition_in_flight_bytes",
            "Payload bytes in flight.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstGauge::new(m.in_flight_bytes))),
        )?;
        family(
            enc,
            "etl_partition_oldest_unresolved_seconds",
            "Age of the oldest unresolved batch.",
            cp.iter().map(|(id, m)| {
                let age = m.oldest_unresolved_age.map_or(0.0, |d| d.as_secs_f64());
                (part(id), ConstGauge::new(age))
            }),
        )?;
        family(
            enc,
            "etl_partition_failed_batches",
            "Batches that failed.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstCounter::new(m.failed_batches))),
        )?;
        family(
            enc,
            "etl_partition_replays",
            "Replays requested.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstCounter::new(m.replays))),
        )?;
        family(
            enc,
            "etl_partition_stale_acks",
            "Acknowledgements of ended epochs discarded.",
            cp.iter()
                .map(|(id, m)| (part(id), ConstCounter::new(m.stale_acks))),
        )?;
        single(
            enc,
            "etl_commits",
            "Successful offset commits.",
            one(self.checkpoint.commits),
        )?;
        single(
            enc,
            "etl_commit_errors",
            "Failed offset commits.",
            one(self.checkpoint.commit_errors),
        )?;
        let mut sinks: Vec<(&str, &SinkMetrics)> =
            self.sinks.iter().map(|(n, m)| (n.as_str(), m)).collect();
        if let Some(d) = &self.dead_letter {
            sinks.push(("dead_letter", d));
        }
        let sink = |name: &str| [("sink", name.to_owned())];
        type Count = fn(&SinkMetrics) -> u64;
        let counters: [(&str, &str, Count); 5] = [
            (
                "etl_sink_records_written",
                "Records durably written.",
                |m| m.records_written,
            ),
            ("etl_sink_bytes_written", "Bytes durably written.", |m| {
                m.bytes_written
            }),
            ("etl_sink_retries", "Write retries.", |m| m.retries),
            (
                "etl_sink_batches_fenced",
                "Source batches not written: their partition was being handed over.",
                |m| m.batches_fenced,
            ),
            (
                "etl_sink_dead_lettered",
                "Records sent to the dead-letter sink.",
                |m| m.dead_lettered,
            ),
        ];
        for (name, help, field) in counters {
            family(
                enc,
                name,
                help,
                sinks
                    .iter()
                    .map(|(n, m)| (sink(n), ConstCounter::new(field(m)))),
            )?;
        }
        family(
            enc,
            "etl_sink_write_latency_mean_seconds",
            "Mean write latency.",
            sinks.iter().map(|(n, m)| {
                (
                    sink(n),
                    ConstGauge::new(m.write_latency_mean().as_secs_f64()),
                )
            }),
        )?;
        family(
            enc,
            "etl_sink_write_latency_max_seconds",
            "Longest write.",
            sinks
                .iter()
                .map(|(n, m)| (sink(n), ConstGauge::new(m.write_latency_max.as_secs_f64()))),
        )
    }
}

/// Reads the hub on every scrape.
#[derive(Debug)]
struct HubCollector(MetricsHub);

impl Collector for HubCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.0.snapshot().encode(&mut encoder)
    }
}

#[cfg(test)]
mod tests {
    use etl_checkpoint::PartitionMetrics;
    use etl_record::{Offset, PartitionId};
    use etl_source::PartitionSourceMetrics;

    use super::*;

    #[derive(Debug)]
    struct Fixed(PipelineSnapshot);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
            self.0.encode(&mut encoder)
        }
    }

    /// The progress totals summed in place are those of a full snapshot:
    /// in-flight figures and committed offsets from the checkpointer.
    #[tokio::test]
    async fn totals_in_place_are_the_snapshot_totals() {
        use etl_ack::{BatchId, BatchMeta};
        use etl_checkpoint::{CheckpointConfig, Checkpointer, MemoryStore};

        let (acker, acks) = etl_ack::channel();
        let (checkpoint, _replays) = Checkpointer::spawn(
            CheckpointConfig::default(),
            Box::new(MemoryStore::new()),
            acks,
        )
        .expect("spawn");
        let hub = MetricsHub::default();
        hub.set_checkpoint(checkpoint.clone());
        hub.set_source(SourceMetricsHandle::default());
        let assigned = checkpoint
            .assign(vec![(PartitionId(0), None), (PartitionId(1), None)])
            .await
            .expect("assign");
        let mut acks = Vec::new();
        for a in &assigned {
            checkpoint.budget().acquire(a.partition, 64).await;
            let id = BatchId {
                partition: a.partition,
                epoch: a.epoch,
                seq: 0,
            };
            let meta = BatchMeta {
                id,
                first_offset: Offset(0),
                last_offset: Offset(9),
                records: 10,
                bytes: 64,
            };
            acks.push(acker.open(meta).expect("open"));
        }
        // Partition 0 delivers and commits; partition 1 stays in flight.
        drop(acks.remove(0));
        checkpoint.commit().await.expect("commit");
        let totals = hub.totals();
        assert_eq!(totals, hub.snapshot().totals());
        assert_eq!((totals.in_flight_batches, totals.in_flight_bytes), (1, 64));
        assert_eq!(
            totals.committed,
            CommittedTotals {
                partitions: 1,
                sum: 10,
                first: vec![(PartitionId(0), Offset(10))],
            }
        );
        drop(acks);
        checkpoint.shutdown().await.expect("shutdown");
    }

    /// The lag of a partition whose source reports the broker's high
    /// watermark is what the broker holds past the delivered watermark;
    /// a partition without a reported high watermark has no lag sample.
    #[test]
    fn partition_lag_is_high_watermark_minus_delivered_watermark() {
        let mut snapshot = PipelineSnapshot::default();
        for (id, high, watermark) in [(1, Some(10), 7), (2, None, 3)] {
            snapshot.source.partitions.insert(
                PartitionId(id),
                PartitionSourceMetrics {
                    high_watermark: high.map(Offset),
                    ..PartitionSourceMetrics::default()
                },
            );
            snapshot.checkpoint.partitions.insert(
                PartitionId(id),
                PartitionMetrics {
                    watermark: Offset(watermark),
                    ..PartitionMetrics::default()
                },
            );
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(snapshot)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("etl_partition_lag{partition=\"1\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("etl_partition_high_watermark{partition=\"1\"} 10\n"),
            "{text}"
        );
        assert!(
            !text.contains("etl_partition_lag{partition=\"2\"}"),
            "{text}"
        );
    }

    /// A source's own figures are gauges of their own names; a name
    /// Prometheus would refuse, and the second of two alike, are left out.
    #[test]
    fn a_sources_own_gauges_are_exported_under_their_names() {
        use etl_source::SourceGauge;

        let mut snapshot = PipelineSnapshot::default();
        snapshot.source.gauges = vec![
            SourceGauge::new("retained_wal_bytes", "WAL the slot retains.", 4096),
            SourceGauge::new("Bad Name", "Refused.", 1),
            SourceGauge::new("retained_wal_bytes", "Twice.", 7),
        ];
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(snapshot.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains(
                "# HELP etl_source_retained_wal_bytes WAL the slot retains.\n\
                 # TYPE etl_source_retained_wal_bytes gauge\n\
                 etl_source_retained_wal_bytes 4096\n"
            ),
            "{text}"
        );
        assert_eq!(text.matches("etl_source_").count(), 3, "{text}");
        assert!(!text.contains("Bad"), "{text}");
        assert_eq!(snapshot.totals().source_gauges, snapshot.source.gauges);
    }
}
