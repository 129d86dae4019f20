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
        let mut refused = Vec::new();
        for record in records {
            if let Some((record, err)) = builder.push(record, encoder) {
                refused.push((record, err));
            }
        }
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
    /// Encode and append one record; a refused record is handed back with
    /// the reason.
    pub(crate) fn push(
        &mut self,
        record: Record,
        encoder: &dyn Encoder,
    ) -> Option<(Record, SinkError)> {
        let before = self.buf.len();
        match encoder.encode(&record, &mut self.buf) {
            Ok(()) => {
                self.ends.push(self.buf.len());
                self.records.push(record);
                None
            }
            Err(err) => {
                // Whatever the encoder appended before refusing is dropped.
                self.buf.truncate(before);
                Some((record, err))
            }
        }
    }

    /// Append a record whose encoding `write` appends itself (it cannot
    /// fail).
    pub(crate) fn push_with(&mut self, record: Record, write: impl FnOnce(&mut BytesMut)) {
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
        // The next batch is likely as large as this one: size its vectors
        // up front rather than growing them record by record.
        let records = Vec::with_capacity(self.records.capacity());
        let ends = Vec::with_capacity(self.ends.capacity());
        EncodedBatch {
            records: std::mem::replace(&mut self.records, records),
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
    fn builder_reuses_its_buffer() {
        let mut builder = BatchBuilder::default();
        for round in 0..3 {
            for i in 0..4 {
                assert!(
                    builder
                        .push(rec(i, "line"), &RawLinesEncoder::new())
                        .is_none()
                );
            }
            let batch = builder.finish();
            assert_eq!(batch.len(), 4, "round {round}");
            assert_eq!(batch.bytes().len(), 20);
            drop(batch);
        }
    }
}
