//! A batch of records together with their encoded bytes.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use etl_record::Record;

use crate::{Encoder, SinkError};

/// Records and their encoding, as a sink receives them.
///
/// `bytes()` is the concatenation of every record's encoding, in order;
/// [`encoded`](EncodedBatch::encoded) gives one record's slice. A sink that
/// writes bytes (a file, a socket) writes `bytes()` in one call; a sink that
/// writes rows (a database) reads `records()`. Cloning shares the bytes.
///
/// What the encoder [attached](BatchEncoding::attach) to runs of records
/// is in [`attachments`](EncodedBatch::attachments).
#[derive(Clone, Debug, Default)]
pub struct EncodedBatch {
    records: Vec<Record>,
    bytes: Bytes,
    /// `ends[i]` is the end of record `i`'s encoding in `bytes`.
    ends: Vec<usize>,
    /// What the encoder attached, each with the records it describes.
    attachments: Vec<(Range<usize>, Attachment)>,
}

/// What an encoder attached to the records of one
/// [`Encoder::encode_batch`] call it accepted.
type Attachment = Arc<dyn Any + Send + Sync>;

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

    /// What the encoder [attached](BatchEncoding::attach), in the
    /// records' order, each with the range of records it describes: the
    /// records one [`Encoder::encode_batch`] call accepted. Records of
    /// a call that attached nothing are in no range. A sink that finds
    /// no attachment of its own for a record works out what it needs
    /// itself (a batch made by [`select`](Self::select) has none).
    pub fn attachments(&self) -> impl Iterator<Item = (Range<usize>, &(dyn Any + Send + Sync))> {
        self.attachments
            .iter()
            .map(|(range, attached)| (range.clone(), &**attached))
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
    /// It holds no [`attachments`](Self::attachments).
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
            attachments: Vec::new(),
        }
    }

    /// Take the records back out.
    #[must_use]
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }

    /// The records and the encoded bytes, apart.
    pub(crate) fn into_parts(self) -> (Vec<Record>, Bytes) {
        (self.records, self.bytes)
    }
}

/// The byte buffer of a batch written, kept for the driver's next batch to
/// fill: a batch's buffer is large (up to `batch_max_bytes`), and one
/// allocated anew for every batch is a mapping of its own whose every
/// page faults in again, then is unmapped once the batch is written.
/// Two buffers are kept at most (`SPARE_BUFFERS`), and only ones no
/// larger than the bound they are given.
#[derive(Debug, Default)]
pub(crate) struct SpareBuffer(Mutex<Vec<BytesMut>>);

/// Buffers a driver keeps: the one of the batch being written and the one
/// of the batch before it, so the batch built beside a write finds one.
const SPARE_BUFFERS: usize = 2;

impl SpareBuffer {
    /// Keep `bytes`' buffer, emptied, when nothing else holds it and it
    /// holds at most `at_most` bytes; otherwise it is dropped. Of more
    /// than two, the smallest is dropped.
    pub(crate) fn keep(&self, bytes: Bytes, at_most: usize) {
        if let Ok(mut buf) = bytes.try_into_mut()
            && buf.capacity() <= at_most
        {
            buf.clear();
            // The smallest of three is freed outside the lock (it can be a
            // mapping of megabytes to unmap).
            let evicted = {
                let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                spare.push(buf);
                if spare.len() > SPARE_BUFFERS {
                    spare.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
                    spare.pop()
                } else {
                    None
                }
            };
            drop(evicted);
        }
    }

    /// The largest buffer kept.
    fn take(&self) -> Option<BytesMut> {
        let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let largest = (0..spare.len()).max_by_key(|&i| spare[i].capacity())?;
        Some(spare.swap_remove(largest))
    }
}

/// The record vector of a batch written, kept for the driver's next batch
/// to gather its records into. A sink batch merges several upstream
/// batches into a vector larger than any of theirs; one allocated anew
/// for every batch is a mapping of its own whose every page faults in as
/// the records are moved in. Given back to the shared pool instead
/// (`etl_record::reuse`), it was dropped whenever that pool was full of
/// the source's smaller vectors, which a throttled source leaves there:
/// kept here, a driver's vector serves its own next batch. One is kept at
/// most, the larger.
#[derive(Debug, Default)]
pub(crate) struct SpareRecords(Mutex<Option<Vec<Record>>>);

impl SpareRecords {
    /// Keep `records`' vector, emptied, when it has room for at most
    /// `at_most` records; of it and the one kept, the smaller goes to the
    /// shared pool (which frees what it has no room for). A vector a
    /// burst grew far beyond the driver's batches is not kept idle.
    pub(crate) fn keep(&self, mut records: Vec<Record>, at_most: usize) {
        // Dropped outside the lock: a record can hold the last reference
        // to a buffer.
        records.clear();
        let other = if records.capacity() > at_most {
            Some(records)
        } else {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match kept.as_ref() {
                Some(k) if k.capacity() >= records.capacity() => Some(records),
                _ => kept.replace(records),
            }
        };
        if let Some(other) = other {
            etl_record::reuse::give_back(other);
        }
    }

    fn take(&self) -> Option<Vec<Record>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Where [`Encoder::encode_batch`] puts the encoding of its records: each
/// [`push`](Self::push) encodes the next record, or refuses it.
#[derive(Debug)]
pub struct BatchEncoding<'a> {
    buf: &'a mut BytesMut,
    ends: &'a mut Vec<usize>,
    /// How many records the call was given.
    records: usize,
    /// The next record's index among them.
    next: usize,
    /// The refused records' indices, ascending, with their errors.
    refused: Vec<(usize, SinkError)>,
    attached: Option<Attachment>,
}

impl BatchEncoding<'_> {
    /// Encode the next record: `encode` appends its encoding to the
    /// buffer, or refuses it with an error (whatever it appended is then
    /// dropped, and the record goes to the dead-letter path). Returns
    /// `false`, without calling `encode`, when every record of the call
    /// was pushed already.
    pub fn push(&mut self, encode: impl FnOnce(&mut BytesMut) -> Result<(), SinkError>) -> bool {
        if self.next >= self.records {
            return false;
        }
        let before = self.buf.len();
        match encode(self.buf) {
            Ok(()) => self.ends.push(self.buf.len()),
            Err(err) => {
                self.buf.truncate(before);
                self.refused.push((self.next, err));
            }
        }
        self.next += 1;
        true
    }

    /// How many records were pushed so far.
    #[must_use]
    pub fn pushed(&self) -> usize {
        self.next
    }

    /// Attach `value` to the records this call accepts: the batch shows
    /// it in [`EncodedBatch::attachments`] with their range (nothing when
    /// the call accepts none). A second call replaces the first.
    pub fn attach(&mut self, value: impl Any + Send + Sync) {
        self.attached = Some(Arc::new(value));
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
    attachments: Vec<(Range<usize>, Attachment)>,
    /// How many records the last finished batch held.
    last: usize,
    /// The driver's spare record vector, taken by [`adopt`](Self::adopt)
    /// for the batch about to start.
    kept: Option<Vec<Record>>,
}

/// Batches of fewer bytes share a buffer (see [`BatchBuilder::finish`]);
/// a larger one takes its buffer whole, so that it comes back once
/// written (see [`SpareBuffer`]).
const SHARED_BELOW: usize = 64 << 10;

/// Room for a batch's records when `needed` are about to be in it: as
/// many as the last batch held (`last`), so that a batch as large as the
/// last takes its room at once rather than doubling its vector, and
/// moving every record, each time it fills; but never more than four
/// times what is needed (or 1024, for a small batch), so that one large
/// batch does not make every later one hold its room: the in-flight
/// limits count records, not the vectors around them (as
/// `etl_record::reuse` caps the vectors it hands out).
fn room_for(needed: usize, last: usize) -> usize {
    needed.max(last.min(needed.max(1024).saturating_mul(4)))
}

/// The largest driver's spare vector a batch with `room` takes: twice the
/// room rounded up to a power of two. A driver's batches of one job mostly
/// differ by an upstream batch or so (two or three of 4 Ki records: room
/// for 8 Ki or 12 Ki), and a vector grown for the larger one serves the
/// smaller too, rather than being given up for a new mapping whose every
/// page faults in. A batch may so hold up to about four times the room
/// its records need (the shared pool hands out at most a quarter over),
/// which the in-flight limits do not count: one such vector a driver at
/// a time, as a driver keeps one.
pub(crate) fn kept_at_most(room: usize) -> usize {
    room.checked_next_power_of_two()
        .map_or(usize::MAX, |p| p.saturating_mul(2))
}

impl BatchBuilder {
    /// Encode and add `records` in order, leaving out those `skip` names
    /// (asked once a record, in order); returns the records the encoder
    /// refused, with its error, in order. The vector itself becomes the
    /// batch's when the batch is empty (the common case: one upstream
    /// batch per sink batch), so its records are neither moved one by
    /// one nor copied into a new allocation.
    pub(crate) fn extend(
        &mut self,
        mut records: Vec<Record>,
        encoder: &dyn Encoder,
        mut skip: impl FnMut(&Record) -> bool,
    ) -> Vec<(Record, SinkError)> {
        // Nothing moves when nothing is left out.
        records.retain(|record| !skip(record));
        self.ends.reserve(records.len());
        // Room for the batch's encoding at once (a value and a separator
        // a record, what the line encoders write), rather than growing
        // the buffer, and copying what it holds, again and again.
        let bytes: usize = records.iter().map(|r| r.value.len() + 1).sum();
        self.buf.reserve(bytes);
        let mut out = BatchEncoding {
            buf: &mut self.buf,
            ends: &mut self.ends,
            records: records.len(),
            next: 0,
            refused: Vec::new(),
            attached: None,
        };
        encoder.encode_batch(&records, &mut out);
        let BatchEncoding {
            next,
            refused: mut out,
            attached,
            ..
        } = out;
        // A record the encoder gave no encoding is refused, not dropped.
        for (i, record) in records.iter().enumerate().skip(next) {
            out.push((
                i,
                SinkError::Encode {
                    key: record.idempotency_key(),
                    reason: "the encoder gave the record no encoding".to_owned(),
                },
            ));
        }
        let mut refused = Vec::new();
        if !out.is_empty() {
            let mut out = out.into_iter().peekable();
            let all = std::mem::take(&mut records);
            for (i, record) in all.into_iter().enumerate() {
                match out.next_if(|(at, _)| *at == i) {
                    Some((_, err)) => refused.push((record, err)),
                    None => records.push(record),
                }
            }
        }
        let start = self.records.len();
        if let Some(attached) = attached
            && !records.is_empty()
        {
            self.attachments
                .push((start..start + records.len(), attached));
        }
        if self.records.is_empty() {
            let room = room_for(records.len(), self.last);
            let records = if records.capacity() >= room {
                records
            } else {
                // Too small to grow into the last batch's size without a
                // new allocation (and every record moved) later: one with
                // that room now, the small one kept for a source.
                // At most a quarter more than that room: the room is
                // already up to four times what the records need.
                let at_most = room + room / 4;
                let mut roomy = match self.kept.take() {
                    // The driver's own, from a batch of about this size.
                    Some(kept) if (room..=kept_at_most(room)).contains(&kept.capacity()) => kept,
                    other => {
                        if let Some(other) = other {
                            etl_record::reuse::give_back(other);
                        }
                        etl_record::reuse::records_within(room, at_most)
                    }
                };
                roomy.append(&mut records);
                etl_record::reuse::give_back(records);
                roomy
            };
            // The empty one goes back for a source's next batch.
            etl_record::reuse::give_back(std::mem::replace(&mut self.records, records));
        } else {
            let room = room_for(self.records.len() + records.len(), self.last);
            if room > self.records.capacity() {
                // A quarter more than it has at least (so a batch built
                // of many small ones moves its records a bounded number
                // of times), which is under a quarter over the room, as
                // it has less than the room: `Vec`'s own growth would
                // double it, and a vector of twice the room is not handed
                // back to the next batch (`etl_record::reuse::
                // records_within`), which then takes a new mapping and
                // faults in every page of it.
                let capacity = self.records.capacity();
                let grown = room.max(capacity + capacity / 4);
                self.records.reserve_exact(grown - self.records.len());
            }
            self.records.append(&mut records);
            etl_record::reuse::give_back(records);
        }
        refused
    }

    /// Append a record whose encoding `write` appends itself (it cannot
    /// fail).
    pub(crate) fn push_with(&mut self, record: Record, write: impl FnOnce(&mut BytesMut)) {
        if self.records.capacity() == 0 {
            self.records.reserve(room_for(1, self.last));
        }
        write(&mut self.buf);
        self.ends.push(self.buf.len());
        self.records.push(record);
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Before a batch's first record: fill `spare`'s buffer, if it has one
    /// with more room than what this builder has left, and gather the
    /// records into `records`' vector if they need more room than their
    /// own.
    pub(crate) fn adopt(&mut self, spare: &SpareBuffer, records: &SpareRecords) {
        if !self.buf.is_empty() || !self.records.is_empty() {
            return;
        }
        if let Some(vector) = records.take()
            && let Some(old) = self.kept.replace(vector)
        {
            etl_record::reuse::give_back(old);
        }
        if let Some(buf) = spare.take()
            && buf.capacity() > self.buf.capacity()
        {
            self.buf = buf;
        }
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The batch built so far; the builder starts over, keeping what its
    /// buffer has left when that could hold another batch as large.
    pub(crate) fn finish(&mut self) -> EncodedBatch {
        // The next batch is likely as large as this one: size its ends
        // up front rather than growing them record by record (and no
        // larger: a large batch's room is not kept for every later one).
        // Its records are mostly an upstream batch's own vector (see
        // `extend`).
        self.last = self.records.len();
        // A spare vector this batch did not need goes to the shared pool
        // rather than sit here idle beside the one the driver keeps.
        if let Some(unused) = self.kept.take() {
            etl_record::reuse::give_back(unused);
        }
        let ends = Vec::with_capacity(self.last);
        // Small batches share one buffer, each the part the last left. A
        // buffer that cannot hold another batch as large goes whole with
        // this one, so that once it is written nothing else holds it and
        // it comes back (see `SpareBuffer`).
        let bytes = if self.buf.len() >= SHARED_BELOW
            || self.buf.capacity() - self.buf.len() < self.buf.len()
        {
            std::mem::take(&mut self.buf)
        } else {
            self.buf.split()
        };
        EncodedBatch {
            records: std::mem::take(&mut self.records),
            bytes: bytes.freeze(),
            ends: std::mem::replace(&mut self.ends, ends),
            attachments: std::mem::take(&mut self.attachments),
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

    /// An upstream batch of `n` records from `from`, in a vector of room
    /// for exactly those.
    fn upstream(from: i64, n: i64) -> Vec<Record> {
        let mut records = Vec::with_capacity(usize::try_from(n).unwrap());
        records.extend((from..from + n).map(|o| rec(o, "[0]")));
        records
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
    fn a_batch_begun_with_a_small_vector_has_the_last_batchs_room_from_its_first_records() {
        let upstream = |from: i64| upstream(from, 3);
        let mut builder = BatchBuilder::default();
        for from in [0, 3, 6, 9] {
            builder.extend(upstream(from), &NdjsonEncoder::new(), |_| false);
        }
        assert_eq!(builder.finish().len(), 12);
        // Not grown later (a new allocation, every record moved): the
        // room is taken with the first records.
        builder.extend(upstream(12), &NdjsonEncoder::new(), |_| false);
        assert!(
            builder.records.capacity() >= 12,
            "room for {} records",
            builder.records.capacity()
        );
        let offsets: Vec<i64> = builder
            .finish()
            .records()
            .iter()
            .map(|r| r.position.offset.0)
            .collect();
        assert_eq!(offsets, vec![12, 13, 14]);
    }

    #[test]
    fn a_batch_appended_to_takes_room_for_one_as_large_as_the_last_at_once() {
        let upstream = |from: i64| upstream(from, 3);
        let mut builder = BatchBuilder::default();
        for from in [0, 3, 6, 9] {
            builder.extend(upstream(from), &NdjsonEncoder::new(), |_| false);
        }
        let last = builder.finish();
        assert_eq!(last.len(), 12);
        // The next batch adopts its first vector (room for 3), then grows
        // once to the last batch's size rather than doubling as it fills.
        builder.extend(upstream(12), &NdjsonEncoder::new(), |_| false);
        builder.extend(upstream(15), &NdjsonEncoder::new(), |_| false);
        assert!(
            builder.records.capacity() >= 12,
            "room for {} records",
            builder.records.capacity()
        );
        let room = builder.records.capacity();
        builder.extend(upstream(18), &NdjsonEncoder::new(), |_| false);
        builder.extend(upstream(21), &NdjsonEncoder::new(), |_| false);
        assert_eq!(
            builder.records.capacity(),
            room,
            "no growth up to the last size"
        );
        let offsets: Vec<i64> = builder
            .finish()
            .records()
            .iter()
            .map(|r| r.position.offset.0)
            .collect();
        assert_eq!(offsets, (12..24).collect::<Vec<_>>());
    }

    /// One large batch (a burst of small records under `batch_max_bytes`)
    /// must not make every later batch, however small, reserve room for
    /// as many records: the in-flight limits count records, not the
    /// vectors around them (see `etl_record::reuse`), and `ends`' capacity
    /// only ever grows, so the room asked is the largest batch ever.
    #[test]
    fn a_small_batch_after_a_large_one_does_not_reserve_the_large_ones_room() {
        let mut builder = BatchBuilder::default();
        builder.extend(upstream(0, 50_000), &NdjsonEncoder::new(), |_| false);
        builder.extend(upstream(50_000, 50_000), &NdjsonEncoder::new(), |_| false);
        assert_eq!(builder.finish().len(), 100_000);
        for round in 0..3 {
            let from = 100_000 + round * 6;
            builder.extend(upstream(from, 3), &NdjsonEncoder::new(), |_| false);
            builder.extend(upstream(from + 3, 3), &NdjsonEncoder::new(), |_| false);
            let capacity = builder.records.capacity();
            let batch = builder.finish();
            assert_eq!(batch.len(), 6);
            assert!(
                capacity <= 4 * 1024,
                "a batch of 6 records holds room for {capacity} ({} bytes)",
                capacity * std::mem::size_of::<Record>()
            );
        }
    }

    /// `room_for` caps the room a small batch takes after a large one at
    /// four times what it needs (or 1024 records); the vector
    /// `etl_record::reuse::records` hands out for that room may itself
    /// hold four times the room, so the two caps compound: a batch of 3
    /// records sits in flight in a vector of 16 Ki records (2.6 MB), none
    /// of it counted by the in-flight limits.
    #[test]
    fn a_small_batch_after_a_large_one_is_not_handed_a_spare_vector_beyond_its_room() {
        let mut builder = BatchBuilder::default();
        builder.extend(upstream(0, 5_000), &NdjsonEncoder::new(), |_| false);
        assert_eq!(builder.finish().len(), 5_000);
        // A vector a sink grew, given back (as `settle` gives back every
        // written batch's).
        etl_record::reuse::give_back(Vec::with_capacity(16 * 1024));
        builder.extend(upstream(5_000, 3), &NdjsonEncoder::new(), |_| false);
        let capacity = builder.records.capacity();
        // The room (4 Ki records), and at most a quarter more for a spare
        // vector of about that size.
        assert!(
            capacity <= 5 * 1024,
            "a batch of 3 records holds room for {capacity} ({} bytes)",
            capacity * std::mem::size_of::<Record>()
        );
    }

    /// A driver's batch merges upstream batches into a vector larger than
    /// theirs. Given back to the shared pool once written, that vector was
    /// dropped whenever the pool was full of a source's smaller vectors,
    /// and every next batch took a new mapping and faulted in each of its
    /// pages (the transform benchmark's W1: half of its page faults). The
    /// driver keeps it for its next batch, whether that batch has the
    /// room of the last or less.
    #[test]
    fn the_next_batch_gathers_its_records_into_the_vector_of_the_batch_written_last() {
        let (bytes, kept) = (SpareBuffer::default(), SpareRecords::default());
        let mut builder = BatchBuilder::default();
        builder.extend(upstream(0, 8 * 1024), &NdjsonEncoder::new(), |_| false);
        let (records, _) = builder.finish().into_parts();
        // The last batch written, of twelve thousand records, grown to 16
        // Ki: more than the shared pool would hand a batch with room for
        // 8 Ki (at most a quarter over).
        drop(records);
        let mut written = Vec::with_capacity(16 * 1024);
        written.extend(upstream(8 * 1024, 12 * 1024));
        kept.keep(written, usize::MAX);
        builder.adopt(&bytes, &kept);
        builder.extend(upstream(20 * 1024, 4096), &NdjsonEncoder::new(), |_| false);
        assert_eq!(builder.records.len(), 4096);
        assert_eq!(
            builder.records.capacity(),
            16 * 1024,
            "the batch took another vector than the driver's"
        );
        assert!(kept.take().is_none(), "taken once");
        // Written, it is kept again for the batch after.
        let (records, _) = builder.finish().into_parts();
        kept.keep(records, usize::MAX);
        assert_eq!(kept.take().map(|v| v.capacity()), Some(16 * 1024));
    }

    #[test]
    fn a_driver_keeps_the_larger_of_two_vectors_and_never_one_far_beyond_a_batchs_room() {
        let kept = SpareRecords::default();
        kept.keep(Vec::with_capacity(8 * 1024), usize::MAX);
        kept.keep(Vec::with_capacity(4 * 1024), usize::MAX);
        assert_eq!(kept.take().map(|v| v.capacity()), Some(8 * 1024));
        // After a batch of 8 Ki records a batch of 3 has room for 4 Ki (see
        // `room_for`), and takes no kept vector of 32 Ki.
        let (bytes, kept) = (SpareBuffer::default(), SpareRecords::default());
        let mut builder = BatchBuilder::default();
        builder.extend(upstream(0, 8 * 1024), &NdjsonEncoder::new(), |_| false);
        drop(builder.finish());
        kept.keep(Vec::with_capacity(32 * 1024), usize::MAX);
        builder.adopt(&bytes, &kept);
        builder.extend(upstream(8 * 1024, 3), &NdjsonEncoder::new(), |_| false);
        let capacity = builder.records.capacity();
        assert!((4 * 1024..32 * 1024).contains(&capacity), "{capacity}");
        // Nor is a vector beyond the driver's bound kept at all.
        let kept = SpareRecords::default();
        kept.keep(Vec::with_capacity(64 * 1024), 32 * 1024);
        assert!(kept.take().is_none());
        // Up to twice the room rounded up to a power of two.
        assert_eq!(kept_at_most(8 * 1024), 16 * 1024);
        assert_eq!(kept_at_most(12 * 1024), 32 * 1024);
        assert_eq!(kept_at_most(1024), 2 * 1024);
    }

    /// A batch a few records larger than the last one grows its vector to
    /// at most a quarter over its room, not to twice its capacity as
    /// `Vec`'s growth would: a vector of twice the room is too large for
    /// the next batch to take back (at most a quarter over the room), so
    /// each such batch took a new mapping and faulted in every page of
    /// it.
    #[test]
    fn a_batch_a_little_larger_than_the_last_grows_to_a_quarter_over_its_room_not_twice() {
        let mut builder = BatchBuilder::default();
        builder.extend(upstream(0, 8_000), &NdjsonEncoder::new(), |_| false);
        assert_eq!(builder.finish().len(), 8_000);
        // Room for the last batch's 8,000 exactly: taken as it is, so no
        // spare vector of another test comes into it.
        let first = upstream(8_000, 8_000);
        assert_eq!(first.capacity(), 8_000);
        builder.extend(first, &NdjsonEncoder::new(), |_| false);
        builder.extend(upstream(16_000, 10), &NdjsonEncoder::new(), |_| false);
        let capacity = builder.records.capacity();
        assert!(
            (8_010..=8_010 + 8_010 / 4).contains(&capacity),
            "a batch of 8,010 records holds room for {capacity} ({} bytes)",
            capacity * std::mem::size_of::<Record>()
        );
    }

    /// Grown a quarter at least each time, a batch built of many small
    /// upstream batches moves its records a bounded number of times.
    #[test]
    fn a_batch_of_many_small_ones_grows_its_vector_a_bounded_number_of_times() {
        let mut builder = BatchBuilder::default();
        let mut grown = 0;
        let mut capacity = 0;
        for i in 0..1_000 {
            let mut small = upstream(i * 10, 10);
            small.shrink_to_fit();
            builder.extend(small, &NdjsonEncoder::new(), |_| false);
            if builder.records.capacity() != capacity {
                grown += 1;
                capacity = builder.records.capacity();
            }
        }
        assert_eq!(builder.records.len(), 10_000);
        // 1.25^33 > 10,000 / 10.
        assert!(
            grown <= 40,
            "the vector grew {grown} times for 1,000 appends"
        );
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

    /// Encodes a batch at once: refuses `bad`, attaches the values it
    /// accepted, and with `short` gives the last record no encoding and
    /// pushes nothing past the end.
    #[derive(Debug)]
    struct Whole {
        short: bool,
    }

    impl Encoder for Whole {
        fn encode(&self, _: &Record, _: &mut BytesMut) -> Result<(), SinkError> {
            unreachable!("only whole batches are encoded")
        }

        fn encode_batch(&self, records: &[Record], out: &mut BatchEncoding<'_>) {
            let mut accepted = Vec::new();
            let given = if self.short {
                records.len().saturating_sub(1)
            } else {
                records.len()
            };
            for record in &records[..given] {
                let value = String::from_utf8(record.value.to_vec()).unwrap();
                let fits = value != "bad";
                out.push(|buf| {
                    if fits {
                        buf.extend_from_slice(value.as_bytes());
                        buf.extend_from_slice(b";");
                        Ok(())
                    } else {
                        buf.extend_from_slice(b"dropped");
                        Err(SinkError::Encode {
                            key: record.idempotency_key(),
                            reason: "bad".to_owned(),
                        })
                    }
                });
                if fits {
                    accepted.push(value);
                }
            }
            assert_eq!(out.pushed(), given);
            if !self.short {
                assert!(!out.push(|_| panic!("past the end")));
            }
            out.attach(accepted);
        }
    }

    fn attached(batch: &EncodedBatch) -> Vec<(Range<usize>, Vec<String>)> {
        batch
            .attachments()
            .map(|(range, a)| (range, a.downcast_ref::<Vec<String>>().unwrap().clone()))
            .collect()
    }

    #[test]
    fn a_whole_batch_encoder_attaches_to_the_records_it_accepted_in_order() {
        let mut builder = BatchBuilder::default();
        // Behind a box, as the driver holds it.
        let encoder: Box<dyn Encoder> = Box::new(Whole { short: false });
        let refused = builder.extend(
            vec![rec(0, "a"), rec(1, "bad"), rec(2, "b")],
            &encoder,
            |_| false,
        );
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0.position.offset, Offset(1));
        // Nothing of a call that accepts nothing is attached.
        let refused = builder.extend(vec![rec(3, "bad")], &encoder, |_| false);
        assert_eq!(refused.len(), 1);
        let refused = builder.extend(
            vec![
                rec(4, "c"),
                rec(5, "skip"),
                rec(6, "bad"),
                rec(7, "bad"),
                rec(8, "d"),
            ],
            &encoder,
            |r| r.position.offset == Offset(5),
        );
        let offsets: Vec<i64> = refused.iter().map(|(r, _)| r.position.offset.0).collect();
        assert_eq!(offsets, [6, 7]);
        let batch = builder.finish();
        assert_eq!(&batch.bytes()[..], b"a;b;c;d;");
        assert_eq!(
            attached(&batch),
            [
                (0..2, vec!["a".to_owned(), "b".to_owned()]),
                (2..4, vec!["c".to_owned(), "d".to_owned()]),
            ]
        );
        let offsets: Vec<i64> = batch
            .records()
            .iter()
            .map(|r| r.position.offset.0)
            .collect();
        assert_eq!(offsets, [0, 2, 4, 8]);
        // A batch selected from it works its records out again.
        assert_eq!(batch.select(|_| true).attachments().count(), 0);
        // The next batch starts with none.
        builder.extend(vec![rec(9, "e")], &RawLinesEncoder::new(), |_| false);
        assert_eq!(builder.finish().attachments().count(), 0);
    }

    #[test]
    fn a_record_the_encoder_gives_no_encoding_is_refused_not_dropped() {
        let (batch, refused) = EncodedBatch::encode(
            vec![rec(0, "a"), rec(1, "bad"), rec(2, "b"), rec(3, "c")],
            &Whole { short: true },
        );
        assert_eq!(&batch.bytes()[..], b"a;b;");
        let refused: Vec<(i64, String)> = refused
            .into_iter()
            .map(|(r, e)| (r.position.offset.0, e.to_string()))
            .collect();
        assert_eq!(refused.len(), 2);
        assert_eq!(refused[0].0, 1);
        assert_eq!(refused[1].0, 3);
        assert!(refused[1].1.contains("no encoding"), "{}", refused[1].1);
        assert_eq!(
            attached(&batch),
            [(0..2, vec!["a".to_owned(), "b".to_owned()])]
        );
    }

    /// A batch of 64 KiB or more takes its buffer whole: a part of a
    /// buffer shared with the next batch could not come back once
    /// written (it is not the only holder), and the next batch built in
    /// the rest grew it into a new allocation whose pages all fault in.
    #[test]
    fn a_large_batch_takes_its_buffer_whole_so_it_comes_back_once_written() {
        let spare = (SpareBuffer::default(), SpareRecords::default());
        spare.0.keep(Bytes::from(vec![0u8; 1 << 20]), usize::MAX);
        let mut builder = BatchBuilder::default();
        builder.adopt(&spare.0, &spare.1);
        let line: &'static str = "x".repeat(1000).leak();
        let records = (0..100).map(|i| rec(i, line)).collect();
        builder.extend(records, &RawLinesEncoder::new(), |_| false);
        let (_, bytes) = builder.finish().into_parts();
        assert!(bytes.len() >= 64 << 10);
        assert!(bytes.is_unique(), "the batch's buffer is shared");
        spare.0.keep(bytes, usize::MAX);
        assert_eq!(spare.0.take().map(|b| b.capacity()), Some(1 << 20));
    }

    /// With a batch being written and the next one built beside it, a
    /// driver keeps two buffers, and hands out the larger first.
    #[test]
    fn a_driver_keeps_two_spare_buffers_and_hands_out_the_larger_first() {
        let spare = SpareBuffer::default();
        for size in [100, 300, 200] {
            spare.keep(Bytes::from(vec![0u8; size]), usize::MAX);
        }
        let sizes = [spare.take(), spare.take(), spare.take()].map(|b| b.map(|b| b.capacity()));
        assert_eq!(sizes, [Some(300), Some(200), None]);
        spare.keep(Bytes::from(vec![0u8; 100]), 99);
        assert!(spare.take().is_none(), "larger than the bound");
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
