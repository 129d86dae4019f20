//! A request's body: the encodings of its records, framed and compressed.

use std::io::Write as _;

use bytes::Bytes;
use etl_sink::EncodedBatch;

use crate::bulk::Bulk;
use crate::{BodyEncoding, Compression};

/// The action lines of a bulk body: the sink's [`Bulk`] and each batch
/// row's `_id` (a JSON string; empty when no id field is set).
#[derive(Clone, Copy)]
pub(crate) struct Actions<'a> {
    pub(crate) bulk: &'a Bulk,
    pub(crate) ids: &'a [Option<String>],
}

/// The body of the records at `rows` of `batch` (each encoded as one
/// NDJSON line by the driver's encoder), framed by `encoding` (the bulk
/// encoding writes `actions`' line before each record's) and compressed
/// by `compression`.
pub(crate) fn build(
    batch: &EncodedBatch,
    rows: &[usize],
    encoding: BodyEncoding,
    actions: Option<Actions<'_>>,
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
        BodyEncoding::ElasticsearchBulk => {
            let mut out = Vec::with_capacity(batch.bytes().len() + rows.len() * 16);
            for &i in rows {
                if let Some(actions) = actions {
                    let id = actions.ids.get(i).and_then(Option::as_deref);
                    actions.bulk.action_line(id, &mut out);
                }
                out.extend_from_slice(batch.encoded(i).unwrap_or_default());
            }
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
        BodyEncoding::Ndjson | BodyEncoding::ElasticsearchBulk => "application/x-ndjson",
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
        let all = build(
            &batch,
            &[0, 1, 2],
            BodyEncoding::Ndjson,
            None,
            Compression::None,
        )
        .unwrap();
        assert_eq!(&all[..], b"{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n");
        let some = build(
            &batch,
            &[0, 2],
            BodyEncoding::JsonArray,
            None,
            Compression::None,
        )
        .unwrap();
        assert_eq!(&some[..], b"[{\"n\":0},{\"n\":2}]");
        let gz = build(&batch, &[1], BodyEncoding::Ndjson, None, Compression::Gzip).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"n\":1}\n");
        let zst = build(&batch, &[2], BodyEncoding::Ndjson, None, Compression::Zstd).unwrap();
        assert_eq!(zstd::decode_all(&zst[..]).unwrap(), b"{\"n\":2}\n");
    }

    #[test]
    fn a_bulk_body_puts_each_records_action_line_before_its_unchanged_line() {
        // Documents byte for byte as the records hold them: spaces, key
        // order and escapes kept.
        let records = [r#"{ "b":1, "a":"x\u0041" }"#, r#"{"id":"q\"1"}"#, "7"]
            .iter()
            .enumerate()
            .map(|(o, v)| {
                let at = Position::new(SourceId::new("s"), PartitionId(0), Offset(o as i64));
                Record::new(at, (*v).to_owned())
            })
            .collect();
        let batch = EncodedBatch::encode(records, &NdjsonEncoder::new()).0;
        let bulk = Bulk {
            action: crate::BulkAction::Index,
            id: Some(etl_record::FieldPath::parse("id").unwrap()),
        };
        let ids = [None, Some(r#""q\"1""#.to_owned()), None];
        let actions = Actions {
            bulk: &bulk,
            ids: &ids,
        };
        let body = build(
            &batch,
            &[0, 1, 2],
            BodyEncoding::ElasticsearchBulk,
            Some(actions),
            Compression::None,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "{\"index\":{}}\n{ \"b\":1, \"a\":\"x\\u0041\" }\n\
             {\"index\":{\"_id\":\"q\\\"1\"}}\n{\"id\":\"q\\\"1\"}\n\
             {\"index\":{}}\n7\n"
        );
        let zst = build(
            &batch,
            &[1],
            BodyEncoding::ElasticsearchBulk,
            Some(actions),
            Compression::Zstd,
        )
        .unwrap();
        assert_eq!(
            zstd::decode_all(&zst[..]).unwrap(),
            b"{\"index\":{\"_id\":\"q\\\"1\"}}\n{\"id\":\"q\\\"1\"}\n"
        );
        assert_eq!(
            content_type(BodyEncoding::ElasticsearchBulk),
            "application/x-ndjson"
        );
    }
}
