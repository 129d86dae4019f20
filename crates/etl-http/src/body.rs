//! A request's body: the encodings of its records, framed and compressed.

use std::io::Write as _;

use bytes::Bytes;
use etl_sink::EncodedBatch;

use crate::{BodyEncoding, Compression};

/// The body of the records at `rows` of `batch` (each encoded as one
/// NDJSON line by the driver's encoder), framed by `encoding` and
/// compressed by `compression`.
pub(crate) fn build(
    batch: &EncodedBatch,
    rows: &[usize],
    encoding: BodyEncoding,
    compression: Compression,
) -> std::io::Result<Bytes> {
    let whole = rows.len() == batch.len();
    let raw: Bytes = match encoding {
        // The batch's own bytes when the request carries all of it.
        BodyEncoding::Ndjson if whole => batch.bytes().clone(),
        BodyEncoding::Ndjson => {
            let mut out = Vec::new();
            for &i in rows {
                out.extend_from_slice(batch.encoded(i).unwrap_or_default());
            }
            out.into()
        }
        BodyEncoding::JsonArray => {
            let mut out = Vec::with_capacity(batch.bytes().len() + 2);
            out.push(b'[');
            for (n, &i) in rows.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                let line = batch.encoded(i).unwrap_or_default();
                out.extend_from_slice(line.strip_suffix(b"\n").unwrap_or(line));
            }
            out.push(b']');
            out.into()
        }
    };
    Ok(match compression {
        Compression::None => raw,
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&raw)?;
            encoder.finish()?.into()
        }
        Compression::Zstd => zstd::bulk::compress(&raw, 3)?.into(),
    })
}

/// The `Content-Type` of a body of `encoding`.
pub(crate) fn content_type(encoding: BodyEncoding) -> &'static str {
    match encoding {
        BodyEncoding::Ndjson => "application/x-ndjson",
        BodyEncoding::JsonArray => "application/json",
    }
}

/// The `Content-Encoding` of a body compressed by `compression`.
pub(crate) fn content_encoding(compression: Compression) -> Option<&'static str> {
    match compression {
        Compression::None => None,
        Compression::Gzip => Some("gzip"),
        Compression::Zstd => Some("zstd"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId, Position, Record, SourceId};
    use etl_sink::NdjsonEncoder;
    use std::io::Read as _;

    fn batch() -> EncodedBatch {
        let records = (0..3)
            .map(|o| {
                let at = Position::new(SourceId::new("s"), PartitionId(0), Offset(o));
                Record::new(at, format!("{{\"n\":{o}}}"))
            })
            .collect();
        EncodedBatch::encode(records, &NdjsonEncoder::new()).0
    }

    #[test]
    fn bodies_frame_the_chosen_records_and_decompress_to_them() {
        let batch = batch();
        let all = build(&batch, &[0, 1, 2], BodyEncoding::Ndjson, Compression::None).unwrap();
        assert_eq!(&all[..], b"{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n");
        let some = build(&batch, &[0, 2], BodyEncoding::JsonArray, Compression::None).unwrap();
        assert_eq!(&some[..], b"[{\"n\":0},{\"n\":2}]");
        let gz = build(&batch, &[1], BodyEncoding::Ndjson, Compression::Gzip).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"n\":1}\n");
        let zst = build(&batch, &[2], BodyEncoding::Ndjson, Compression::Zstd).unwrap();
        assert_eq!(zstd::decode_all(&zst[..]).unwrap(), b"{\"n\":2}\n");
    }
}
