//! A batch of records together with their encoded bytes.

use bytes::{Bytes, BytesMut};
use etl_record::Record;

use crate::{Encoder, SinkError};

/// Records and their encoding, as a sink receives them.
///
/// `bytes()` is the concatenation of every record's encoding, in order;
/// [`encoded`](EncodedBatch::encoded) gives one record's slice. A sink that
/// writes bytes (a file, a socket) writes `bytes()` in one call; a sink that
/// writes rows (a database) reads `records()`. Cloning shares the bytes.
#[derive(Clone, Debug, Default)]
pub struct EncodedBatch {
    records: Vec<Record>,
    bytes: Bytes,
    /// `ends[i]` is the end of record `i`'s encoding in `bytes`.
    ends: Vec<usize>,
}

impl EncodedBatch {
    /// Encode `records` with `encoder`. Records the encoder refuses are
    /// returned apart, each with its error, instead of failing the batch.
    pub fn encode(records: Vec<Record>, encoder: &dyn Encoder) -> (Self, Vec<(Record, SinkError)>) {
        let mut builder = BatchBuilder::default();
        let refused = builder.extend(records, encoder, |_| false);
        (builder.finish(), refused)
    }

    /// The records, in order.
    #[must_use]
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Every record's encoding, concatenated in order.
    #[must_use]
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Record `index`'s encoding, or `None` past the end.
    #[must_use]
    pub fn encoded(&self, index: usize) -> Option<&[u8]> {
        let end = *self.ends.get(index)?;
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        self.bytes.get(start..end)
    }

    /// Byte range of record `index`'s encoding within [`bytes`](Self::bytes).
    #[must_use]
    pub fn range(&self, index: usize) -> Option<std::ops::Range<usize>> {
        let end = *self.ends.get(index)?;
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        Some(start..end)
    }

    /// Number of records.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch holds no records.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// A new batch of the records for which `keep(index)` is true (copies
    /// their bytes). Used to pass on the part of a batch a sink accepted.
    #[must_use]
    pub fn select(&self, mut keep: impl FnMut(usize) -> bool) -> EncodedBatch {
        let mut bytes = BytesMut::new();
        let mut records = Vec::new();
        let mut ends = Vec::new();
        for (i, record) in self.records.iter().enumerate() {
            if keep(i)
                && let Some(slice) = self.encoded(i)
            {
                bytes.extend_from_slice(slice);
                ends.push(bytes.len());
                records.push(record.clone());
            }
        }
        EncodedBatch {
            records,
            bytes: bytes.freeze(),
            ends,
        }
    }

    /// Take the records back out.
    #[must_use]
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }
}

/// Builds an [`EncodedBatch`] into a reusable buffer: after `finish`, the
/// buffer's spare capacity is reused by the next batch, so encoding does
/// not allocate per record.
#[derive(Debug, Default)]
pub(crate) struct BatchBuilder {
    records: Vec<Record>,
    buf: BytesMut,
    ends: Vec<usize>,
}

impl BatchBuilder {
    /// Encode and add `records` in order, leaving out those `skip` names;
    /// returns the records the encoder refused, with its error. The
    /// vector itself becomes the batch's when the batch is empty (the
    /// common case: one upstream batch per sink batch), so its records
    /// are neither moved one by one nor copied into a new allocation.
    pub(crate) fn extend(
        &mut self,
        mut records: Vec<Record>,
        encoder: &dyn Encoder,
        mut skip: impl FnMut(&Record) -> bool,
    ) -> Vec<(Record, SinkError)> {
        // Records to leave out, by index, with the encoder's error for a
        // refused one; empty unless something is left out.
        let mut out: Vec<(usize, Option<SinkError>)> = Vec::new();
        self.ends.reserve(records.len());
        // Room for the batch's encoding at once (a value and a separator
        // a record, what the line encoders write), rather than growing
        // the buffer, and copying what it holds, again and again.
        let bytes: usize = records.iter().map(|r| r.value.len() + 1).sum();
        self.buf.reserve(bytes);
        for (i, record) in records.iter().enumerate() {
            if skip(record) {
                out.push((i, None));
                continue;
            }
            let before = self.buf.len();
            match encoder.encode(record, &mut self.buf) {
                Ok(()) => self.ends.push(self.buf.len()),
                Err(err) => {
                    // Whatever the encoder appended before refusing is dropped.
                    self.buf.truncate(before);
                    out.push((i, Some(err)));
                }
            }
        }
        let mut refused = Vec::new();
        if !out.is_empty() {
            let mut out = out.into_iter().peekable();
            let all = std::mem::take(&mut records);
            for (i, record) in all.into_iter().enumerate() {
                match out.next_if(|(at, _)| *at == i) {
                    Some((_, Some(err))) => refused.push((record, err)),
                    Some((_, None)) => {}
                    None => records.push(record),
                }
            }
        }
        if self.records.is_empty() {
            // The empty one goes back for a source's next batch.
            etl_record::reuse::give_back(std::mem::replace(&mut self.records, records));
        } else {
            self.records.append(&mut records);
            etl_record::reuse::give_back(records);
        }
        refused
    }

    /// Append a record whose encoding `write` appends itself (it cannot
    /// fail).
    pub(crate) fn push_with(&mut self, record: Record, write: impl FnOnce(&mut BytesMut)) {
        if self.records.capacity() == 0 {
            // As large as the last batch, as `ends` is (see `finish`).
            self.records.reserve(self.ends.capacity());
        }
        write(&mut self.buf);
        self.ends.push(self.buf.len());
        self.records.push(record);
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The batch built so far; the builder starts over, keeping its buffer.
    pub(crate) fn finish(&mut self) -> EncodedBatch {
        // The next batch is likely as large as this one: size its ends
        // up front rather than growing them record by record. Its records
        // are mostly an upstream batch's own vector (see `extend`).
        let ends = Vec::with_capacity(self.ends.capacity());
        EncodedBatch {
            records: std::mem::take(&mut self.records),
            bytes: self.buf.split().freeze(),
            ends: std::mem::replace(&mut self.ends, ends),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NdjsonEncoder, RawLinesEncoder};
    use etl_record::{Offset, PartitionId, Position, SourceId};

    fn rec(offset: i64, value: &'static str) -> Record {
        Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
            value.as_bytes(),
        )
    }

    #[test]
    fn slices_follow_records_and_refused_records_leave_no_bytes() {
        let (batch, refused) = EncodedBatch::encode(
            vec![rec(0, "{\"a\":1}"), rec(1, "not json"), rec(2, "[2]")],
            &NdjsonEncoder::new(),
        );
        assert_eq!(batch.len(), 2);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0.position.offset, Offset(1));
        assert_eq!(&batch.bytes()[..], b"{\"a\":1}\n[2]\n");
        assert_eq!(batch.encoded(1), Some(&b"[2]\n"[..]));
        assert_eq!(batch.encoded(2), None);
        let only_second = batch.select(|i| i == 1);
        assert_eq!(&only_second.bytes()[..], b"[2]\n");
        assert_eq!(only_second.records()[0].position.offset, Offset(2));
    }

    #[test]
    fn extend_keeps_order_leaves_out_skipped_and_refused_and_adopts_the_vector() {
        let mut builder = BatchBuilder::default();
        let first: Vec<Record> = vec![rec(0, "[0]"), rec(1, "[1]")];
        assert!(
            builder
                .extend(first, &NdjsonEncoder::new(), |_| false)
                .is_empty()
        );
        let second = vec![
            rec(2, "[2]"),
            rec(3, "not json"),
            rec(4, "[4]"),
            rec(5, "[5]"),
            rec(6, "{}"),
        ];
        let refused = builder.extend(second, &NdjsonEncoder::new(), |r| {
            r.position.offset == Offset(4)
        });
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0.position.offset, Offset(3));
        let batch = builder.finish();
        let offsets: Vec<i64> = batch
            .records()
            .iter()
            .map(|r| r.position.offset.0)
            .collect();
        assert_eq!(offsets, [0, 1, 2, 5, 6]);
        assert_eq!(&batch.bytes()[..], b"[0]\n[1]\n[2]\n[5]\n{}\n");
        assert_eq!(batch.encoded(3), Some(&b"[5]\n"[..]));
        // An empty builder took the first vector as it was.
        let mut builder = BatchBuilder::default();
        let records: Vec<Record> = vec![rec(7, "[7]")];
        let at_again = records.as_ptr();
        builder.extend(records, &NdjsonEncoder::new(), |_| false);
        assert_eq!(builder.finish().records().as_ptr(), at_again);
    }

    #[test]
    fn builder_reuses_its_buffer() {
        let mut builder = BatchBuilder::default();
        for round in 0..3 {
            let records = (0..4).map(|i| rec(i, "line")).collect();
            let refused = builder.extend(records, &RawLinesEncoder::new(), |_| false);
            assert!(refused.is_empty());
            let batch = builder.finish();
            assert_eq!(batch.len(), 4, "round {round}");
            assert_eq!(batch.bytes().len(), 20);
            drop(batch);
        }
    }
}
