//! A poll batch: records and rejected input of one partition.

use etl_record::{DeadLetter, Offset, PartitionId, Record};

/// What a source read from one partition in one poll: records, and input
/// it rejected (invalid UTF-8, an oversized line, malformed JSON) as dead
/// letters with the reason.
///
/// Both lists are in offset order and their offsets interleave into one
/// strictly increasing sequence. The batch covers every offset of both:
/// the driver opens one acknowledgement handle for all of them, and the
/// dead letters reach the dead-letter sink under it, so rejected input
/// counts as delivered only once it is written there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollBatch {
    /// The partition every record and dead letter belongs to.
    pub partition: PartitionId,
    /// Records, in offset order.
    pub records: Vec<Record>,
    /// Rejected input, in offset order.
    pub rejected: Vec<DeadLetter>,
}

impl PollBatch {
    /// An empty batch of `partition`.
    #[must_use]
    pub fn new(partition: PartitionId) -> Self {
        PollBatch {
            partition,
            records: Vec::new(),
            rejected: Vec::new(),
        }
    }

    /// A batch of records only.
    #[must_use]
    pub fn from_records(partition: PartitionId, records: Vec<Record>) -> Self {
        PollBatch {
            partition,
            records,
            rejected: Vec::new(),
        }
    }

    /// Number of records plus rejected entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len() + self.rejected.len()
    }

    /// Whether the batch holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.rejected.is_empty()
    }

    /// The lowest offset covered, if any.
    #[must_use]
    pub fn first_offset(&self) -> Option<Offset> {
        let r = self.records.first().map(|r| r.position.offset);
        let d = self.rejected.first().map(|d| d.record.position.offset);
        match (r, d) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The highest offset covered, if any.
    #[must_use]
    pub fn last_offset(&self) -> Option<Offset> {
        let r = self.records.last().map(|r| r.position.offset);
        let d = self.rejected.last().map(|d| d.record.position.offset);
        r.max(d)
    }

    /// Payload bytes of records and rejected input, for in-flight limits.
    #[must_use]
    pub fn byte_len(&self) -> u64 {
        let records: usize = self.records.iter().map(Record::byte_len).sum();
        let rejected: usize = self.rejected.iter().map(|d| d.record.byte_len()).sum();
        (records + rejected) as u64
    }

    /// Check what a source promises about a batch: one partition, offsets
    /// strictly increasing over records and rejected input together.
    /// Returns the reason of the first violation.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut offsets: Vec<(Offset, PartitionId)> = self
            .records
            .iter()
            .map(|r| (r.position.offset, r.position.partition))
            .chain(
                self.rejected
                    .iter()
                    .map(|d| (d.record.position.offset, d.record.position.partition)),
            )
            .collect();
        if let Some((_, p)) = offsets.iter().find(|(_, p)| *p != self.partition) {
            return Err(format!(
                "a batch of partition {} holds a record of partition {p}",
                self.partition
            ));
        }
        for list in [
            &self
                .records
                .iter()
                .map(|r| r.position.offset)
                .collect::<Vec<_>>(),
            &self
                .rejected
                .iter()
                .map(|d| d.record.position.offset)
                .collect::<Vec<_>>(),
        ] {
            if let Some(w) = list.windows(2).find(|w| w[0] >= w[1]) {
                return Err(format!("offsets go from {} to {}", w[0], w[1]));
            }
        }
        offsets.sort_unstable();
        if let Some(w) = offsets.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("offset {} appears twice", w[0].0));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use etl_record::{Position, SourceId};

    use super::*;

    fn rec(p: u32, o: i64, v: &'static [u8]) -> Record {
        Record::new(
            Position::new(SourceId::new("t"), PartitionId(p), Offset(o)),
            Bytes::from_static(v),
        )
    }

    #[test]
    fn offsets_and_sizes_span_records_and_rejected() {
        let mut b =
            PollBatch::from_records(PartitionId(1), vec![rec(1, 10, b"ab"), rec(1, 30, b"c")]);
        b.rejected.push(DeadLetter::new(rec(1, 5, b"xyz"), "bad"));
        b.rejected.push(DeadLetter::new(rec(1, 40, b"q"), "bad"));
        assert_eq!(b.first_offset(), Some(Offset(5)));
        assert_eq!(b.last_offset(), Some(Offset(40)));
        assert_eq!(b.len(), 4);
        assert_eq!(b.byte_len(), 2 + 1 + 3 + 1);
        assert_eq!(b.check(), Ok(()));
        assert_eq!(PollBatch::new(PartitionId(0)).first_offset(), None);
    }

    #[test]
    fn check_names_the_violation() {
        let b = PollBatch::from_records(PartitionId(1), vec![rec(1, 2, b""), rec(1, 2, b"")]);
        assert!(b.check().unwrap_err().contains("from 2 to 2"));
        let b = PollBatch::from_records(PartitionId(1), vec![rec(2, 2, b"")]);
        assert!(b.check().unwrap_err().contains("partition 2"));
        let mut b = PollBatch::from_records(PartitionId(1), vec![rec(1, 2, b"")]);
        b.rejected.push(DeadLetter::new(rec(1, 2, b""), "dup"));
        assert!(b.check().unwrap_err().contains("twice"));
    }
}
