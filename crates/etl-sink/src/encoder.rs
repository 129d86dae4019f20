//! Encoders: how a record becomes bytes on the way to a sink.

use std::fmt;

use bytes::{BufMut, BytesMut};
use etl_record::Record;
use serde::de::IgnoredAny;

use crate::{BatchEncoding, SinkError};

/// Turns a record into bytes, appending to a buffer the driver reuses
/// from batch to batch (so encoding does not allocate per record).
///
/// A record that cannot be encoded is refused with
/// [`SinkError::Encode`]; the driver sends it to the dead-letter path.
/// Bytes appended before refusing are discarded by the caller.
///
/// The driver encodes each batch it receives with
/// [`encode_batch`](Encoder::encode_batch), which by default calls
/// [`encode`](Encoder::encode) on every record in order: an encoder that
/// can do better with the whole batch at once (check its records on
/// several threads, keep what it read of them for its sink) overrides it.
pub trait Encoder: Send + Sync + fmt::Debug {
    /// Append `record`'s encoding to `out`.
    ///
    /// # Errors
    ///
    /// [`SinkError::Encode`] when the record cannot be encoded.
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError>;

    /// Encode `records`, in order, into `out`: one
    /// [`BatchEncoding::push`] a record, which appends its encoding or
    /// refuses it. What the batch then holds, and what is refused, is
    /// exactly what [`encode`](Encoder::encode) on each record in turn
    /// would give: the accepted records in their order, each with its
    /// bytes, and the refused ones sent to the dead-letter path in their
    /// order, with the batch (before its write, under an exactly-once
    /// driver).
    /// A record given no `push` is refused (never dropped), and a `push`
    /// past the last record does nothing.
    ///
    /// An override may also [`attach`](BatchEncoding::attach) what it
    /// learnt of the records it accepted, for its sink to read from the
    /// [`EncodedBatch`](crate::EncodedBatch) instead of working it out
    /// again.
    ///
    /// The default calls [`encode`](Encoder::encode) on each record.
    fn encode_batch(&self, records: &[Record], out: &mut BatchEncoding<'_>) {
        for record in records {
            out.push(|buf| self.encode(record, buf));
        }
    }
}

// Compile-time check that `Encoder` stays object safe.
const _: Option<&dyn Encoder> = None;

impl<E: Encoder + ?Sized> Encoder for Box<E> {
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
        (**self).encode(record, out)
    }

    fn encode_batch(&self, records: &[Record], out: &mut BatchEncoding<'_>) {
        (**self).encode_batch(records, out);
    }
}

/// One JSON document per line: the record's value, which must be valid
/// JSON, followed by `\n`.
///
/// A value that is not JSON is refused (dead-letter path). Line breaks in
/// the value can only be insignificant whitespace (JSON strings cannot hold
/// raw line breaks), so they are written as spaces to keep one document per
/// line.
///
/// [`NdjsonEncoder::trusted`] skips the check, for pipelines whose values
/// were already validated as JSON upstream (an NDJSON source that checks
/// every line, a JSON transform that just wrote them): the check costs
/// about as much as parsing the value again.
#[derive(Clone, Copy, Debug, Default)]
pub struct NdjsonEncoder {
    trusted: bool,
}

impl NdjsonEncoder {
    /// The encoder, checking every value.
    #[must_use]
    pub fn new() -> Self {
        NdjsonEncoder { trusted: false }
    }

    /// An encoder that trusts every value to be valid JSON and writes it
    /// without checking (line breaks are still flattened). Use it only
    /// where that is guaranteed: a value that is not JSON would be written
    /// as it is instead of going to the dead-letter path.
    #[must_use]
    pub fn trusted() -> Self {
        NdjsonEncoder { trusted: true }
    }

    /// Whether this encoder skips the JSON check.
    #[must_use]
    pub fn is_trusted(&self) -> bool {
        self.trusted
    }
}

impl Encoder for NdjsonEncoder {
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
        let value = &record.value[..];
        if !self.trusted {
            // `IgnoredAny` validates without building a value: no allocation.
            serde_json::from_slice::<IgnoredAny>(value).map_err(|e| SinkError::Encode {
                key: record.idempotency_key(),
                reason: format!("value is not valid JSON: {e}"),
            })?;
        }
        if memchr::memchr2(b'\n', b'\r', value).is_some() {
            out.reserve(value.len() + 1);
            for &b in value {
                out.put_u8(if b == b'\n' || b == b'\r' { b' ' } else { b });
            }
        } else {
            out.extend_from_slice(value);
        }
        out.put_u8(b'\n');
        Ok(())
    }
}

/// The value's bytes as they are, followed by `\n`. A value that itself
/// contains line breaks becomes several lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawLinesEncoder {
    _private: (),
}

impl RawLinesEncoder {
    /// The encoder.
    #[must_use]
    pub fn new() -> Self {
        RawLinesEncoder { _private: () }
    }
}

impl Encoder for RawLinesEncoder {
    fn encode(&self, record: &Record, out: &mut BytesMut) -> Result<(), SinkError> {
        out.extend_from_slice(&record.value);
        out.put_u8(b'\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::Position;

    fn encode(encoder: &dyn Encoder, value: &'static [u8]) -> Result<BytesMut, SinkError> {
        let mut out = BytesMut::new();
        encoder
            .encode(&Record::new(Position::default(), value), &mut out)
            .map(|()| out)
    }

    #[test]
    fn ndjson_accepts_json_and_flattens_whitespace_line_breaks() {
        let enc = NdjsonEncoder::new();
        assert_eq!(&encode(&enc, b"{\"a\":1}").unwrap()[..], b"{\"a\":1}\n");
        assert_eq!(
            &encode(&enc, b"{\n\"a\":\r\n1}").unwrap()[..],
            b"{ \"a\":  1}\n"
        );
    }

    #[test]
    fn ndjson_refuses_non_json_without_panicking() {
        let enc = NdjsonEncoder::new();
        for bad in [&b""[..], b"{", b"nope", b"\xff\xfe", b"{} {}"] {
            let err = encode(&enc, bad).unwrap_err();
            assert!(matches!(err, SinkError::Encode { .. }), "{err}");
        }
    }

    #[test]
    fn trusted_ndjson_skips_the_check_but_keeps_one_line_per_value() {
        let enc = NdjsonEncoder::trusted();
        assert!(enc.is_trusted() && !NdjsonEncoder::new().is_trusted());
        assert_eq!(&encode(&enc, b"{\"a\":1}").unwrap()[..], b"{\"a\":1}\n");
        assert_eq!(&encode(&enc, b"{\n\"a\":1}").unwrap()[..], b"{ \"a\":1}\n");
        // Not checked: written as given.
        assert_eq!(&encode(&enc, b"nope").unwrap()[..], b"nope\n");
    }

    #[test]
    fn raw_lines_appends_a_newline() {
        let enc = RawLinesEncoder::new();
        assert_eq!(&encode(&enc, b"\xffraw").unwrap()[..], b"\xffraw\n");
    }
}
