//! The encoder an object-store sink is driven with.

use bytes::BytesMut;
use etl_record::Record;
use etl_sink::{Encoder, NdjsonEncoder, SinkError};

use crate::ObjectStoreSink;

/// NDJSON, refusing a record its sink could not store (a value that does
/// not fit the Parquet schema, a field the key needs that the record
/// lacks). The sink driver sends a refused record to the dead-letter path
/// before the write, so an exactly-once sink never stores progress past a
/// record whose dead letter is not durable. From
/// [`ObjectStoreSink::encoder`].
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
}
