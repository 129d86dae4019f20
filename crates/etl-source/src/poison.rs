//! Finding poison records: count failures per range, narrow a range that
//! keeps failing to single-record batches, give up on a record that fails
//! alone.

use std::collections::{BTreeSet, HashMap, VecDeque};

use etl_ack::BatchId;
use etl_record::{Offset, PartitionId};

/// What happens to a record that failed alone `max_replays` times
/// (`[delivery] poison` in a configuration file: `"dead_letter"` or
/// `"halt"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonPolicy {
    /// Send it downstream as a dead letter naming partition, offset and
    /// replay count; writing the dead letter counts as its delivery.
    #[default]
    DeadLetter,
    /// Stop the driver with [`SourceError::Poison`](crate::SourceError::Poison).
    Halt,
}

/// Batches remembered, over all partitions, to map a failed batch back to
/// its offsets. Far more than can be in flight under any sane limit
/// (`max_in_flight_batches` bounds the batches of every partition
/// together); a batch forgotten all the same is handled as unknown.
const RECENT_BATCHES: usize = 4096;

/// The verdict on a failed batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Replay the partition (possibly narrowed).
    Replay,
    /// The record at `offset` failed alone `replays` times.
    Poison { offset: Offset, replays: u32 },
}

/// What a batch opened lately covered.
#[derive(Clone, Copy, Debug)]
struct Opened {
    id: BatchId,
    first: Offset,
    last: Offset,
    items: usize,
}

/// The failures of one partition; only a partition that failed has one,
/// so a source of many partitions (many files) pays nothing for those
/// that never fail.
#[derive(Debug, Default)]
struct PartitionPoison {
    /// The range that failed lately, narrowed to the overlap of every
    /// failure since, and how often it failed.
    suspect: Option<(Offset, Offset, u32)>,
    /// Records in this range are emitted one per batch.
    narrow: Option<(Offset, Offset)>,
    /// Failures of single-record batches, by offset.
    singles: HashMap<Offset, u32>,
    /// Offsets given up on: dead-lettered when read again.
    poison: BTreeSet<Offset>,
}

/// Per-partition failure bookkeeping of the source driver.
#[derive(Debug)]
pub(crate) struct PoisonTracker {
    max_replays: u32,
    /// Batches opened lately, of every partition, oldest first.
    recent: VecDeque<Opened>,
    partitions: HashMap<PartitionId, PartitionPoison>,
}

impl PoisonTracker {
    pub(crate) fn new(max_replays: u32) -> Self {
        PoisonTracker {
            max_replays: max_replays.max(1),
            recent: VecDeque::new(),
            partitions: HashMap::new(),
        }
    }

    /// Forget a partition (assigned afresh or revoked).
    pub(crate) fn reset(&mut self, partition: PartitionId) {
        self.partitions.remove(&partition);
        self.recent.retain(|o| o.id.partition != partition);
    }

    /// A batch was opened.
    pub(crate) fn opened(&mut self, id: BatchId, first: Offset, last: Offset, items: usize) {
        if self.recent.len() == RECENT_BATCHES {
            self.recent.pop_front();
        }
        self.recent.push_back(Opened {
            id,
            first,
            last,
            items,
        });
    }

    /// A batch failed and its partition replays from `from`.
    pub(crate) fn failed(&mut self, failed: BatchId, from: Offset) -> Verdict {
        let max = self.max_replays;
        let found = self
            .recent
            .iter()
            .find(|o| o.id == failed)
            .map(|o| (o.first, o.last, o.items));
        // The failed batch's epoch is over: nothing else of it can fail.
        self.recent.retain(|o| o.id.partition != failed.partition);
        let p = self.partitions.entry(failed.partition).or_default();
        // Unknown batch (never expected): suspect everything from the
        // watermark on; narrowing then still finds the record.
        let (first, last, items) = found.unwrap_or((from, Offset(i64::MAX), usize::MAX));
        if items == 1 {
            let count = p.singles.entry(first).or_insert(0);
            *count += 1;
            if *count >= max {
                let replays = *count;
                p.singles.remove(&first);
                p.poison.insert(first);
                if p.narrow.is_some_and(|(a, b)| a <= first && first <= b) {
                    p.narrow = None;
                }
                return Verdict::Poison {
                    offset: first,
                    replays,
                };
            }
            return Verdict::Replay;
        }
        let suspect = match p.suspect {
            Some((a, b, n)) if a <= last && first <= b => (a.max(first), b.min(last), n + 1),
            _ => (first, last, 1),
        };
        if suspect.2 >= max {
            p.narrow = Some((suspect.0, suspect.1));
            p.suspect = None;
        } else {
            p.suspect = Some(suspect);
        }
        Verdict::Replay
    }

    /// Whether the record at `offset` must travel in a batch of its own.
    pub(crate) fn isolate(&self, partition: PartitionId, offset: Offset) -> bool {
        self.partitions.get(&partition).is_some_and(|p| {
            p.poison.contains(&offset) || p.narrow.is_some_and(|(a, b)| a <= offset && offset <= b)
        })
    }

    /// Whether any record in `first..=last` must travel alone or was
    /// given up on: `false` lets a batch of that range skip the checks of
    /// every record.
    pub(crate) fn affects(&self, partition: PartitionId, first: Offset, last: Offset) -> bool {
        self.partitions.get(&partition).is_some_and(|p| {
            p.poison.range(first..=last).next().is_some()
                || p.narrow.is_some_and(|(a, b)| a <= last && first <= b)
        })
    }

    /// Whether the record at `offset` was given up on.
    pub(crate) fn is_poison(&self, partition: PartitionId, offset: Offset) -> bool {
        self.partitions
            .get(&partition)
            .is_some_and(|p| p.poison.contains(&offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PartitionId = PartitionId(1);

    fn id(epoch: u32, seq: u64) -> BatchId {
        BatchId {
            partition: P,
            epoch,
            seq,
        }
    }

    #[test]
    fn a_range_failing_max_times_is_narrowed_then_its_record_is_poison() {
        let mut t = PoisonTracker::new(2);
        // Offsets 0..=9 in one batch, failing twice.
        t.opened(id(1, 0), Offset(0), Offset(9), 10);
        assert_eq!(t.failed(id(1, 0), Offset(0)), Verdict::Replay);
        assert!(!t.isolate(P, Offset(5)));
        t.opened(id(2, 0), Offset(0), Offset(9), 10);
        assert_eq!(t.failed(id(2, 0), Offset(0)), Verdict::Replay);
        assert!(t.isolate(P, Offset(0)) && t.isolate(P, Offset(9)));
        assert!(!t.isolate(P, Offset(10)));
        // Singles now; offset 5 fails alone twice.
        t.opened(id(3, 5), Offset(5), Offset(5), 1);
        assert_eq!(t.failed(id(3, 5), Offset(5)), Verdict::Replay);
        t.opened(id(4, 0), Offset(5), Offset(5), 1);
        assert_eq!(
            t.failed(id(4, 0), Offset(5)),
            Verdict::Poison {
                offset: Offset(5),
                replays: 2
            }
        );
        assert!(t.is_poison(P, Offset(5)) && t.isolate(P, Offset(5)));
        assert!(
            !t.isolate(P, Offset(6)),
            "narrowing ends with the poison found"
        );
        t.reset(P);
        assert!(!t.is_poison(P, Offset(5)));
    }

    #[test]
    fn overlapping_failures_narrow_the_suspect_and_disjoint_ones_restart_it() {
        let mut t = PoisonTracker::new(3);
        t.opened(id(1, 0), Offset(0), Offset(9), 10);
        t.failed(id(1, 0), Offset(0));
        t.opened(id(2, 0), Offset(5), Offset(14), 10);
        t.failed(id(2, 0), Offset(5));
        // Disjoint: starts over, so no narrowing after the third failure.
        t.opened(id(3, 0), Offset(20), Offset(29), 10);
        t.failed(id(3, 0), Offset(20));
        assert!(!t.isolate(P, Offset(7)) && !t.isolate(P, Offset(25)));
        t.opened(id(4, 0), Offset(20), Offset(29), 10);
        t.failed(id(4, 0), Offset(20));
        t.opened(id(5, 0), Offset(22), Offset(40), 10);
        t.failed(id(5, 0), Offset(22));
        assert!(t.isolate(P, Offset(22)) && t.isolate(P, Offset(29)));
        assert!(!t.isolate(P, Offset(21)) && !t.isolate(P, Offset(30)));
    }

    #[test]
    fn partitions_that_never_failed_hold_nothing_and_the_recent_batches_are_bounded() {
        let mut t = PoisonTracker::new(2);
        for p in 0..10_000 {
            let id = BatchId {
                partition: PartitionId(p),
                epoch: 1,
                seq: 0,
            };
            t.opened(id, Offset(0), Offset(9), 10);
        }
        assert!(t.partitions.is_empty());
        assert_eq!(t.recent.len(), RECENT_BATCHES);
        // A recent batch of another partition is still found.
        let last = BatchId {
            partition: PartitionId(9_999),
            epoch: 1,
            seq: 0,
        };
        t.opened(id(1, 0), Offset(0), Offset(9), 10);
        assert_eq!(t.failed(last, Offset(0)), Verdict::Replay);
        assert!(!t.isolate(PartitionId(9_999), Offset(10)), "known: 0..=9");
        assert_eq!(t.partitions.len(), 1);
    }

    #[test]
    fn an_unknown_batch_suspects_everything_from_the_watermark() {
        let mut t = PoisonTracker::new(1);
        assert_eq!(t.failed(id(9, 9), Offset(100)), Verdict::Replay);
        assert!(t.isolate(P, Offset(100)) && t.isolate(P, Offset(1 << 40)));
        assert!(!t.isolate(P, Offset(99)));
    }
}
