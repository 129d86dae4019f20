//! An object's bytes: NDJSON (plain, gzip, zstd) or Parquet.

use std::io::Write;

use arrow_array::RecordBatch;
use bytes::Bytes;
use etl_sink::EncodedBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use std::sync::OnceLock;

use crate::schema::{Row, RowSchema, infer};
use crate::{NdjsonCompression, ParquetCompression};

/// How records become an object's bytes. Every form is deterministic: the
/// same records give the same bytes (gzip with no name and a zero time,
/// Parquet without timestamps in its metadata), so an object written again
/// on a replay is identical.
/// A declared schema, or one inferred from the first record checked.
#[derive(Debug)]
pub(crate) enum SchemaSource {
    Declared(RowSchema),
    Inferred(OnceLock<RowSchema>),
}

impl SchemaSource {
    /// The schema, inferring it from `value` if there is none yet.
    fn get(&self, value: Option<&Value>) -> Result<&RowSchema, String> {
        match self {
            SchemaSource::Declared(schema) => Ok(schema),
            SchemaSource::Inferred(cell) => {
                if let Some(schema) = cell.get() {
                    return Ok(schema);
                }
                let value = value.ok_or_else(|| "the value is not JSON".to_owned())?;
                let schema = RowSchema::inferred(&infer(value)?).map_err(|e| e.to_string())?;
                // Another write may have inferred it meanwhile: the first
                // one stays.
                let _ = cell.set(schema);
                cell.get()
                    .ok_or_else(|| "the inferred schema was not kept".to_owned())
            }
        }
    }

    pub(crate) fn is_inferred(&self) -> bool {
        matches!(self, SchemaSource::Inferred(_))
    }
}

/// A batch's records as a write read them, by their place in the batch.
#[derive(Debug)]
pub(crate) enum Read {
    /// Nothing read: NDJSON objects whose keys need no field.
    Nothing,
    /// Each record's JSON value, `None` where it is not JSON.
    Values(Vec<Option<Value>>),
    /// Each record's row of a declared Parquet schema, or why it does not
    /// fit.
    Rows(Vec<Result<Row, String>>),
}

#[derive(Debug)]
pub(crate) enum ObjectFormat {
    Ndjson(NdjsonCompression),
    Parquet {
        schema: SchemaSource,
        // Boxed: the properties are large and the NDJSON variant tiny.
        properties: Box<WriterProperties>,
    },
}

impl ObjectFormat {
    pub(crate) fn parquet(
        schema: SchemaSource,
        compression: ParquetCompression,
        row_group_rows: usize,
        page_bytes: usize,
    ) -> Self {
        let compression = match compression {
            ParquetCompression::None => Compression::UNCOMPRESSED,
            ParquetCompression::Snappy => Compression::SNAPPY,
            ParquetCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
        };
        let properties = WriterProperties::builder()
            .set_compression(compression)
            .set_max_row_group_row_count(Some(row_group_rows.max(1)))
            .set_data_page_size_limit(page_bytes.max(1))
            .build();
        ObjectFormat::Parquet {
            schema,
            properties: Box::new(properties),
        }
    }

    /// Whether the Parquet schema is inferred.
    pub(crate) fn infers(&self) -> bool {
        matches!(self, ObjectFormat::Parquet { schema, .. } if schema.is_inferred())
    }

    /// Whether the records' JSON values are needed (Parquet columns).
    pub(crate) fn reads_values(&self) -> bool {
        matches!(self, ObjectFormat::Parquet { .. })
    }

    /// Whether a record's value surely fits a declared Parquet schema,
    /// judged on its bytes in one pass (`false`: read it into a `Value`
    /// and [`check`](Self::check) it).
    pub(crate) fn surely_fits(&self, bytes: &[u8]) -> bool {
        match self {
            ObjectFormat::Parquet {
                schema: SchemaSource::Declared(schema),
                ..
            } => schema.surely_fits(bytes),
            _ => false,
        }
    }

    /// The declared Parquet schema, if this is one.
    pub(crate) fn declared(&self) -> Option<&RowSchema> {
        match self {
            ObjectFormat::Parquet {
                schema: SchemaSource::Declared(schema),
                ..
            } => Some(schema),
            _ => None,
        }
    }

    /// Check one record's value against the schema.
    pub(crate) fn check(&self, value: Option<&Value>) -> Result<(), String> {
        match self {
            ObjectFormat::Ndjson(_) => Ok(()),
            ObjectFormat::Parquet { schema, .. } => match value {
                Some(v) => schema.get(value)?.check(v),
                None => Err("the value is not JSON".to_owned()),
            },
        }
    }

    /// The bytes of an object of records `rows` of `batch` (each checked
    /// already), `read` what the write read of them for Parquet.
    pub(crate) fn encode(
        &self,
        batch: &EncodedBatch,
        rows: &[usize],
        read: &Read,
    ) -> Result<Bytes, String> {
        match self {
            ObjectFormat::Ndjson(compression) => {
                let size: usize = rows
                    .iter()
                    .filter_map(|&i| batch.encoded(i).map(<[u8]>::len))
                    .sum();
                let mut plain = Vec::with_capacity(size);
                for &i in rows {
                    plain.extend_from_slice(batch.encoded(i).unwrap_or_default());
                }
                compress(*compression, plain).map_err(|e| format!("cannot compress: {e}"))
            }
            ObjectFormat::Parquet { schema, properties } => {
                let not_read = || "a record's value was not read".to_owned();
                let (schema, columns) = match read {
                    Read::Rows(read) => {
                        let refs: Vec<&Row> = rows
                            .iter()
                            .filter_map(|&i| read.get(i).and_then(|row| row.as_ref().ok()))
                            .collect();
                        if refs.len() != rows.len() {
                            return Err(not_read());
                        }
                        let schema = schema.get(None)?;
                        (schema, schema.columns_of_rows(&refs)?)
                    }
                    Read::Values(values) => {
                        let refs: Vec<&Value> = rows
                            .iter()
                            .filter_map(|&i| values.get(i).and_then(Option::as_ref))
                            .collect();
                        if refs.len() != rows.len() {
                            return Err(not_read());
                        }
                        let schema = schema.get(refs.first().copied())?;
                        (schema, schema.columns(&refs)?)
                    }
                    Read::Nothing => return Err(not_read()),
                };
                let batch = RecordBatch::try_new(schema.arrow(), columns)
                    .map_err(|e| format!("cannot build the rows: {e}"))?;
                let mut out = Vec::new();
                let mut writer =
                    ArrowWriter::try_new(&mut out, schema.arrow(), Some((**properties).clone()))
                        .map_err(|e| format!("cannot start the Parquet file: {e}"))?;
                writer
                    .write(&batch)
                    .map_err(|e| format!("cannot write the Parquet rows: {e}"))?;
                writer
                    .close()
                    .map_err(|e| format!("cannot finish the Parquet file: {e}"))?;
                Ok(Bytes::from(out))
            }
        }
    }
}

fn compress(compression: NdjsonCompression, plain: Vec<u8>) -> std::io::Result<Bytes> {
    Ok(Bytes::from(match compression {
        NdjsonCompression::None => plain,
        NdjsonCompression::Gzip => {
            // No name and a zero modification time: the same lines give
            // the same bytes.
            let mut gz = flate2::GzBuilder::new()
                .mtime(0)
                .write(Vec::new(), flate2::Compression::default());
            gz.write_all(&plain)?;
            gz.finish()?
        }
        NdjsonCompression::Zstd => zstd::bulk::compress(&plain, 3)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Position, Record};
    use etl_sink::NdjsonEncoder;
    use std::io::Read;

    fn batch(lines: &[&str]) -> EncodedBatch {
        let records = lines
            .iter()
            .map(|l| Record::new(Position::default(), l.to_string()))
            .collect();
        EncodedBatch::encode(records, &NdjsonEncoder::new()).0
    }

    #[test]
    fn gzip_and_zstd_decompress_to_the_lines_and_repeat_byte_for_byte() {
        let b = batch(&["{\"a\":1}", "{\"a\":2}"]);
        let gz = ObjectFormat::Ndjson(NdjsonCompression::Gzip)
            .encode(&b, &[0, 1], &super::Read::Nothing)
            .unwrap();
        let again = ObjectFormat::Ndjson(NdjsonCompression::Gzip)
            .encode(&b, &[0, 1], &super::Read::Nothing)
            .unwrap();
        assert_eq!(gz, again);
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n");
        let zst = ObjectFormat::Ndjson(NdjsonCompression::Zstd)
            .encode(&b, &[1], &super::Read::Nothing)
            .unwrap();
        assert_eq!(zstd::stream::decode_all(&zst[..]).unwrap(), b"{\"a\":2}\n");
    }
}
