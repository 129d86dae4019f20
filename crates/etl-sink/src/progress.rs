//! Progress stored with the data: the mechanism behind exactly-once sinks.

use etl_record::{Offset, PartitionId, PartitionOffsets, Record};

use crate::{Sink, SinkError};

/// For each partition, the offset of the next record the sink has not
/// stored: every record of the partition below it is in the sink's data.
///
/// A [`ProgressSink`] reports it on start; the pipeline resumes each listed
/// partition from it (instead of from the offset store), and the sink
/// driver skips, and delivers, any record below it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress(PartitionOffsets);

impl Progress {
    /// No progress: nothing stored yet.
    #[must_use]
    pub fn new() -> Self {
        Progress::default()
    }

    /// The next offset to store for `partition`, if any is recorded.
    #[must_use]
    pub fn get(&self, partition: PartitionId) -> Option<Offset> {
        self.0.get(&partition).copied()
    }

    /// Record that everything of `partition` below `next` is stored. Never
    /// moves a partition backwards.
    pub fn advance(&mut self, partition: PartitionId, next: Offset) {
        let entry = self.0.entry(partition).or_insert(next);
        if *entry < next {
            *entry = next;
        }
    }

    /// Advance past every record in `records`.
    pub fn advance_past<'a>(&mut self, records: impl IntoIterator<Item = &'a Record>) {
        for r in records {
            self.advance(r.position.partition, r.position.offset.next());
        }
    }

    /// Whether `record` is already stored (its offset is below its
    /// partition's progress).
    #[must_use]
    pub fn covers(&self, record: &Record) -> bool {
        self.get(record.position.partition)
            .is_some_and(|next| record.position.offset < next)
    }

    /// Partitions and their next offsets, in partition order.
    pub fn iter(&self) -> impl Iterator<Item = (PartitionId, Offset)> + '_ {
        self.0.iter().map(|(p, o)| (*p, *o))
    }

    /// Whether no partition is recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(PartitionId, Offset)> for Progress {
    fn from_iter<I: IntoIterator<Item = (PartitionId, Offset)>>(iter: I) -> Self {
        let mut p = Progress::new();
        for (partition, next) in iter {
            p.advance(partition, next);
        }
        p
    }
}

/// A sink that stores its [`Progress`] atomically with its data (the file
/// sink's progress file, a progress table written in the same database
/// transaction as the rows).
///
/// Contract: when `write` returns `Ok`, the data of the batch and the
/// progress past its records are durable *together*: a crash leaves both
/// or neither. `progress` returns what is stored, and after a restart
/// (re-open) exactly what survived the crash. A write of records the
/// stored progress already covers MUST NOT store them again.
///
/// This gives exactly-once output when the sink is the only sink of its
/// pipeline: the pipeline starts the source at [`ProgressSink::progress`],
/// so nothing below it is read again and nothing above it was stored. With
/// several sinks, one sink's progress says nothing about the others, so
/// the offset store stays in charge and delivery is at-least-once.
#[async_trait::async_trait]
pub trait ProgressSink: Sink {
    /// The progress stored with the data.
    fn progress(&self) -> Progress;

    /// Read the stored progress again from where it is stored, and from
    /// then on report it in [`progress`](ProgressSink::progress) too.
    /// Called whenever the pipeline is assigned partitions: with several
    /// processes writing one store (members of a Kafka consumer group
    /// sharing a PostgreSQL progress table), another may have advanced a
    /// partition since this one last looked, and the partition must
    /// resume there, not at what this process saw. The default returns
    /// [`progress`](ProgressSink::progress), right for a store only this
    /// process writes.
    ///
    /// # Errors
    ///
    /// The stored progress could not be read; the assignment fails (a
    /// partition is never started at a position that may be stale).
    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        Ok(self.progress())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Position, SourceId};

    #[test]
    fn advances_never_go_back_and_cover_below() {
        let mut p = Progress::new();
        p.advance(PartitionId(1), Offset(10));
        p.advance(PartitionId(1), Offset(5));
        assert_eq!(p.get(PartitionId(1)), Some(Offset(10)));
        let at = |o| {
            Record::new(
                Position::new(SourceId::new("s"), PartitionId(1), Offset(o)),
                "",
            )
        };
        assert!(p.covers(&at(9)));
        assert!(!p.covers(&at(10)));
        p.advance_past([&at(12)]);
        assert_eq!(p.get(PartitionId(1)), Some(Offset(13)));
        assert!(!p.covers(&Record::default()));
    }
}
