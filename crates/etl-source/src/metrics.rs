//! What the source driver counts, per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use etl_checkpoint::sparse;
use etl_record::{Offset, PartitionId};

use crate::SourceGauge;

/// Counters of one partition, since the driver started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionSourceMetrics {
    /// Whether the partition is currently assigned.
    pub assigned: bool,
    /// The epoch batches are currently opened under.
    pub epoch: u32,
    /// Highest offset emitted in the current epoch (the fetched position).
    pub position: Option<Offset>,
    /// Batches opened.
    pub batches: u64,
    /// Records emitted.
    pub records: u64,
    /// Bad input emitted as dead letters by the source.
    pub rejected: u64,
    /// Replays served (seeks back to the watermark).
    pub replays: u64,
    /// Records given up on as poison.
    pub poison_records: u64,
    /// The offset after the partition's last record, where the source
    /// knows it ([`Source::high_watermark`](crate::Source::high_watermark)).
    pub high_watermark: Option<Offset>,
}

/// A snapshot of the driver's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMetrics {
    /// Per partition, every partition ever assigned.
    pub partitions: BTreeMap<PartitionId, PartitionSourceMetrics>,
    /// The source's own figures, as it last reported them
    /// ([`Source::gauges`](crate::Source::gauges)).
    pub gauges: Vec<SourceGauge>,
}

impl SourceMetrics {
    /// The sum of a counter over all partitions.
    #[must_use]
    pub fn total(&self, counter: impl Fn(&PartitionSourceMetrics) -> u64) -> u64 {
        self.partitions.values().map(counter).sum()
    }
}

/// Reads the driver's counters from anywhere; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SourceMetricsHandle(Arc<Mutex<PublishedSourceMetrics>>);

/// The driver's counters as it keeps them, read in place through
/// [`SourceMetricsHandle::with_metrics`];
/// [`to_metrics`](Self::to_metrics) makes the [`SourceMetrics`] snapshot
/// of them.
///
/// A file source has a partition per input file, so the counters are
/// kept compactly: a small row per partition (assignment, epoch,
/// position, batches, records), and the counters that stay zero on a
/// healthy partition (rejected input, replays, poison) and the high
/// watermark only for the partitions that have them. Every figure of
/// [`PartitionSourceMetrics`] reads the same either way.
#[derive(Clone, Debug, Default)]
pub struct PublishedSourceMetrics {
    /// One row per partition ever assigned, sorted by partition.
    rows: Vec<Row>,
    /// The rarer figures of the rows marked `more`, sorted by partition.
    more: Vec<(PartitionId, More)>,
    /// The source's own figures, as it last reported them
    /// ([`Source::gauges`](crate::Source::gauges)).
    pub gauges: Vec<SourceGauge>,
}

/// One partition's counters that every partition has.
#[derive(Clone, Copy, Debug)]
struct Row {
    partition: PartitionId,
    epoch: u32,
    /// Meaningful when `has_position`.
    position: Offset,
    batches: u64,
    records: u64,
    assigned: bool,
    has_position: bool,
    /// Its other figures are in `more`.
    more: bool,
}

/// The figures most partitions never have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct More {
    rejected: u64,
    replays: u64,
    poison_records: u64,
    high_watermark: Option<Offset>,
}

impl sparse::DenseRow for Row {
    fn partition(&self) -> PartitionId {
        self.partition
    }

    fn has_extra(&self) -> bool {
        self.more
    }
}

impl Row {
    fn new(partition: PartitionId) -> Self {
        Row {
            partition,
            epoch: 0,
            position: Offset(0),
            batches: 0,
            records: 0,
            assigned: false,
            has_position: false,
            more: false,
        }
    }

    fn metrics(&self, more: More) -> PartitionSourceMetrics {
        PartitionSourceMetrics {
            assigned: self.assigned,
            epoch: self.epoch,
            position: self.has_position.then_some(self.position),
            batches: self.batches,
            records: self.records,
            rejected: more.rejected,
            replays: more.replays,
            poison_records: more.poison_records,
            high_watermark: more.high_watermark,
        }
    }
}

impl PublishedSourceMetrics {
    /// Partitions ever assigned.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no partition was ever assigned.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The counters of `partition`, if it was ever assigned.
    #[must_use]
    pub fn partition(&self, partition: PartitionId) -> Option<PartitionSourceMetrics> {
        let row = &self.rows[self.find(partition).ok()?];
        Some(row.metrics(sparse::extra_of(row, &self.more)))
    }

    /// Every partition ever assigned with its counters, in partition
    /// order.
    pub fn partitions(&self) -> impl Iterator<Item = (PartitionId, PartitionSourceMetrics)> + '_ {
        sparse::with_extras(&self.rows, &self.more)
            .map(|(row, more)| (row.partition, row.metrics(more)))
    }

    /// The sum of a counter over all partitions.
    #[must_use]
    pub fn total(&self, counter: impl Fn(&PartitionSourceMetrics) -> u64) -> u64 {
        self.partitions().map(|(_, m)| counter(&m)).sum()
    }

    /// The snapshot of these counters.
    #[must_use]
    pub fn to_metrics(&self) -> SourceMetrics {
        SourceMetrics {
            partitions: self.partitions().collect(),
            gauges: self.gauges.clone(),
        }
    }

    fn find(&self, partition: PartitionId) -> Result<usize, usize> {
        sparse::find(&self.rows, partition)
    }

    /// Apply `f` to the counters of `partition` (zero if it has none yet)
    /// and keep what it leaves.
    fn update(&mut self, partition: PartitionId, f: impl FnOnce(&mut PartitionSourceMetrics)) {
        let i = match self.find(partition) {
            Ok(i) => i,
            Err(i) => {
                self.rows.insert(i, Row::new(partition));
                i
            }
        };
        let row = self.rows[i];
        let mut m = row.metrics(sparse::extra_of(&row, &self.more));
        f(&mut m);
        let more = More {
            rejected: m.rejected,
            replays: m.replays,
            poison_records: m.poison_records,
            high_watermark: m.high_watermark,
        };
        let has_more = more != More::default();
        self.rows[i] = Row {
            partition,
            epoch: m.epoch,
            position: m.position.unwrap_or_default(),
            batches: m.batches,
            records: m.records,
            assigned: m.assigned,
            has_position: m.position.is_some(),
            more: has_more,
        };
        match (
            self.more.binary_search_by_key(&partition, |(p, _)| *p),
            has_more,
        ) {
            (Ok(j), true) => self.more[j].1 = more,
            (Ok(j), false) => {
                self.more.remove(j);
            }
            (Err(j), true) => self.more.insert(j, (partition, more)),
            (Err(_), false) => {}
        }
    }
}

impl SourceMetricsHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, PublishedSourceMetrics> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters now.
    #[must_use]
    pub fn snapshot(&self) -> SourceMetrics {
        self.lock().to_metrics()
    }

    /// Read the counters in place: `f` sees them under their lock, so a
    /// figure summed over many partitions needs no copy of them all.
    /// Keep `f` short: the driver waits for it to count.
    pub fn with_metrics<R>(&self, f: impl FnOnce(&PublishedSourceMetrics) -> R) -> R {
        f(&self.lock())
    }

    /// Mark partitions assigned under their epochs, with no position
    /// yet. Partitions new to the counters get a row each, in a vector
    /// grown once by their number (a file source assigns a partition
    /// per input file, at once and in order).
    pub(crate) fn assigned(&self, partitions: impl ExactSizeIterator<Item = (PartitionId, u32)>) {
        let mut guard = self.lock();
        let counters = &mut *guard;
        let before = counters.rows.len();
        counters.rows.reserve_exact(partitions.len());
        for (partition, epoch) in partitions {
            let row =
                match counters.rows[..before].binary_search_by_key(&partition, |r| r.partition) {
                    Ok(i) => &mut counters.rows[i],
                    Err(_) => {
                        counters.rows.push(Row::new(partition));
                        counters.rows.last_mut().unwrap_or_else(|| unreachable!())
                    }
                };
            row.assigned = true;
            row.epoch = epoch;
            row.has_position = false;
        }
        let new = &counters.rows[before.saturating_sub(1)..];
        if !new.windows(2).all(|w| w[0].partition < w[1].partition) {
            // Stable, so a partition listed twice keeps its last row.
            counters.rows.sort_by_key(|r| r.partition);
            counters.rows.dedup_by(|later, earlier| {
                let same = later.partition == earlier.partition;
                if same {
                    *earlier = *later;
                }
                same
            });
        }
    }

    /// The source's own figures now; nothing to do for a source that
    /// has none.
    pub(crate) fn set_gauges(&self, gauges: Vec<SourceGauge>) {
        let mut guard = self.lock();
        if !(gauges.is_empty() && guard.gauges.is_empty()) {
            guard.gauges = gauges;
        }
    }

    pub(crate) fn update(
        &self,
        partition: PartitionId,
        f: impl FnOnce(&mut PartitionSourceMetrics),
    ) {
        self.lock().update(partition, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigning_marks_every_partition_and_keeps_earlier_counters() {
        let handle = SourceMetricsHandle::default();
        handle.update(PartitionId(3), |m| {
            m.records = 7;
            m.position = Some(Offset(70));
        });
        // More partitions than one merged run, not in order.
        let ids = (0..10_000u32).rev().map(|p| (PartitionId(p), p % 5));
        handle.assigned(ids);
        handle.with_metrics(|s| {
            assert_eq!(s.len(), 10_000);
            assert!(
                s.partitions()
                    .all(|(p, m)| m.assigned && m.epoch == p.0 % 5 && m.position.is_none())
            );
            assert_eq!(s.partition(PartitionId(3)).unwrap().records, 7, "kept");
        });
    }

    /// The counters as a map of every partition's, updated the same way,
    /// would hold them.
    #[test]
    fn counters_read_back_as_a_map_of_every_partitions_would_hold_them() {
        let handle = SourceMetricsHandle::default();
        let mut expected: BTreeMap<PartitionId, PartitionSourceMetrics> = BTreeMap::new();
        let mut both = |p: u32, f: &dyn Fn(&mut PartitionSourceMetrics)| {
            handle.update(PartitionId(p), f);
            f(expected.entry(PartitionId(p)).or_default());
        };
        both(9, &|m| m.replays += 1);
        both(2, &|m| {
            m.batches += 1;
            m.records += 20;
            m.rejected += 1;
            m.position = Some(Offset(90));
        });
        both(4, &|m| m.high_watermark = Some(Offset(50)));
        both(6, &|m| m.poison_records += 2);
        both(2, &|m| m.rejected = 0);
        both(1, &|m| m.epoch = 3);
        handle.assigned(
            [
                (PartitionId(2), 4),
                (PartitionId(0), 1),
                (PartitionId(2), 5),
            ]
            .into_iter(),
        );
        for (p, epoch) in [(2, 5), (0, 1)] {
            let m = expected.entry(PartitionId(p)).or_default();
            m.assigned = true;
            m.epoch = epoch;
            m.position = None;
        }
        let snapshot = handle.snapshot();
        assert_eq!(snapshot.partitions, expected);
        handle.with_metrics(|s| {
            assert!(s.partitions().eq(expected.iter().map(|(p, m)| (*p, *m))));
            for (p, m) in &expected {
                assert_eq!(s.partition(*p).as_ref(), Some(m));
            }
            assert_eq!(s.partition(PartitionId(3)), None);
            assert_eq!(s.total(|m| m.replays), 1);
        });
    }
}
