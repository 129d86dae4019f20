//! The encoder an object-store sink is driven with.

use bytes::BytesMut;
use etl_record::Record;
use etl_sink::{BatchEncoding, Encoder, NdjsonEncoder, SinkError};

use crate::ObjectStoreSink;
use crate::sink::CheckedRows;

/// NDJSON, refusing a record its sink could not store (a value that does
/// not fit the Parquet schema, a field the key needs that the record
/// lacks). The sink driver sends a refused record to the dead-letter path
/// before the write, so an exactly-once sink never stores progress past a
/// record whose dead letter is not durable. From
/// [`ObjectStoreSink::encoder`].
///
/// Where the sink's objects need nothing of a record but its Parquet row
/// (declared `columns`, a key that reads no field and no `date_field`), a
/// batch's records are checked in chunks on the sink's threads, and the
/// rows read by the check are attached to the batch for the write,
/// which then does not read the records again. Refusals and bytes are
/// the ones of [`Encoder::encode`] on each record in turn.
#[derive(Debug)]
pub struct ValueEncoder {
    sink: ObjectStoreSink,
    ndjson: NdjsonEncoder,
    /// For a value the check already read as JSON: it is not read again.
    read: NdjsonEncoder,
}

impl ValueEncoder {
    pub(crate) fn new(sink: ObjectStoreSink) -> Self {
        ValueEncoder {
            sink,
            ndjson: NdjsonEncoder::new(),
            read: NdjsonEncoder::trusted(),
        }
    }
}

impl Encoder for ValueEncoder {
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
        match self.sink.fits(record) {
            Ok(true) => self.read.encode(record, out),
            Ok(false) => self.ndjson.encode(record, out),
            Err(reason) => Err(SinkError::Encode {
                key: record.idempotency_key(),
                reason,
            }),
        }
    }

    fn encode_batch(&self, records: &[Record], out: &mut BatchEncoding<'_>) {
        let read = self.sink.rows_of(records);
        let Some(read) = read.filter(|read| read.len() == records.len()) else {
            for record in records {
                out.push(|buf| self.encode(record, buf));
            }
            return;
        };
        let mut rows = Vec::with_capacity(read.len());
        for (record, row) in records.iter().zip(read) {
            let mut kept = None;
            out.push(|buf| match row {
                Ok(row) => {
                    // Read as JSON by the check: not checked again.
                    self.read.encode(record, buf)?;
                    kept = Some(row);
                    Ok(())
                }
                Err(reason) => Err(SinkError::Encode {
                    key: record.idempotency_key(),
                    reason,
                }),
            });
            rows.extend(kept);
        }
        out.attach(CheckedRows::new(&self.sink, rows));
    }
}
