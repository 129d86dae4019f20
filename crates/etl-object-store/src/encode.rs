//! An object's bytes: NDJSON (plain, gzip, zstd) or Parquet.

use std::io::Write;

use std::ops::Range;

use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use bytes::Bytes;
use etl_sink::EncodedBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, compute_leaves};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use std::sync::OnceLock;

use crate::schema::{Row, RowSchema, infer};
use crate::workers::Workers;
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
pub(crate) enum Read<'b> {
    /// Nothing read: NDJSON objects whose keys need no field.
    Nothing,
    /// Each record's JSON value, `None` where it is not JSON.
    Values(Vec<Option<Value>>),
    /// Each record's row of a declared Parquet schema, or why it does not
    /// fit.
    Rows(Vec<Result<Held<'b>, String>>),
}

/// A record's row: read by the write, or by the sink's encoder and held
/// by the batch.
#[derive(Debug)]
pub(crate) enum Held<'b> {
    Read(Row),
    Checked(&'b Row),
}

impl Held<'_> {
    pub(crate) fn row(&self) -> &Row {
        match self {
            Held::Read(row) => row,
            Held::Checked(row) => row,
        }
    }
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
        read: &Read<'_>,
        workers: Workers,
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
                match read {
                    Read::Rows(read) => {
                        let refs: Vec<&Row> = rows
                            .iter()
                            .filter_map(|&i| {
                                read.get(i).and_then(|row| row.as_ref().ok()).map(Held::row)
                            })
                            .collect();
                        if refs.len() != rows.len() {
                            return Err(not_read());
                        }
                        let schema = schema.get(None)?;
                        parquet_of(schema, properties, workers, refs.len(), |i, range| {
                            schema.column_of_rows(i, refs.get(range).unwrap_or_default())
                        })
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
                        parquet_of(schema, properties, workers, refs.len(), |i, range| {
                            schema.column_of_values(i, refs.get(range).unwrap_or_default())
                        })
                    }
                    Read::Nothing => Err(not_read()),
                }
            }
        }
    }
}

/// One column of one row group, to be built and encoded: its rows, and
/// the writers of its leaves (one for a scalar, one per leaf of a struct
/// or a list).
struct ColumnTask {
    column: usize,
    rows: Range<usize>,
    writers: Vec<ArrowColumnWriter>,
}

/// Bytes a row a column chunk's dictionary may hold before the writer
/// falls back to plain encoding for the rest of the chunk. A dictionary
/// of mostly distinct values costs more than it saves, and objects cut
/// from a stream are often small: in 12k-row objects of the lake bench's
/// records (ids, user names and amounts nearly all distinct), the
/// writer's fixed 1 MiB limit kept every dictionary, and the objects held
/// 28.7 MB where they hold 21.5 MB at 2 bytes a row (19.7 at 1, 25.1 at
/// 4; docs/benchmarks.md). The limit counts rows, not the values' width:
/// a few long values in a small object, 64-bit values a quarter to three
/// quarters distinct, or a list's items (several a row) lose a
/// dictionary that would still have paid.
const DICTIONARY_BYTES_PER_ROW: usize = 2;

/// The smallest dictionary limit a column chunk is given.
const DICTIONARY_MIN_BYTES: usize = 4 << 10;

/// `properties` for an object of `rows` rows: a column chunk's
/// dictionary limit is [`DICTIONARY_BYTES_PER_ROW`] a row of its row
/// group, at least [`DICTIONARY_MIN_BYTES`] and at most `properties`' own.
/// The same rows always give the same limit, so the same bytes.
fn object_properties(properties: &WriterProperties, rows: usize) -> WriterProperties {
    let per_group = properties
        .max_row_group_row_count()
        .unwrap_or(rows)
        .min(rows)
        .max(1);
    let most = properties.dictionary_page_size_limit();
    let limit = per_group
        .saturating_mul(DICTIONARY_BYTES_PER_ROW)
        .clamp(DICTIONARY_MIN_BYTES.min(most), most);
    properties
        .clone()
        .into_builder()
        .set_dictionary_page_size_limit(limit)
        .build()
}

/// The Parquet file of `n` rows whose column `i` over a range of rows is
/// `column(i, range)`: the bytes [`ArrowWriter`] writes of the same
/// columns with `properties`, each column of each row group built and
/// encoded as a task of its own on `workers`, the chunks appended in the
/// columns' order.
fn parquet_of<F>(
    schema: &RowSchema,
    properties: &WriterProperties,
    workers: Workers,
    n: usize,
    column: F,
) -> Result<Bytes, String>
where
    F: Fn(usize, Range<usize>) -> Result<ArrayRef, String> + Sync,
{
    let arrow = schema.arrow();
    let properties = &object_properties(properties, n);
    let writer = ArrowWriter::try_new(Vec::new(), arrow.clone(), Some(properties.clone()))
        .map_err(|e| format!("cannot start the Parquet file: {e}"))?;
    let (mut file, factory) = writer
        .into_serialized_writer()
        .map_err(|e| format!("cannot start the Parquet file: {e}"))?;
    // As `ArrowWriter::write` cuts one batch of `n` rows into row groups.
    let per_group = properties.max_row_group_row_count().unwrap_or(n).max(1);
    let fields = arrow.fields();
    // One row group at a time, as `ArrowWriter` writes them: only one
    // group's column writers and chunks are held at once.
    for (group, start) in (0..n).step_by(per_group).enumerate() {
        let rows = start..n.min(start + per_group);
        let mut writers = factory
            .create_column_writers(group)
            .map_err(|e| format!("cannot start row group {group}: {e}"))?
            .into_iter();
        let mut tasks = Vec::with_capacity(fields.len());
        for (i, field) in fields.iter().enumerate() {
            let leaves = leaf_count(field.data_type());
            let writers: Vec<ArrowColumnWriter> = writers.by_ref().take(leaves).collect();
            if writers.len() != leaves {
                return Err(format!(
                    "column `{}` lacks writers for its leaves",
                    field.name()
                ));
            }
            tasks.push(ColumnTask {
                column: i,
                rows: rows.clone(),
                writers,
            });
        }
        // The costliest columns first: nested ones, then text, then the
        // rest.
        let mut first: Vec<usize> = (0..tasks.len()).collect();
        first.sort_by_key(|&t| {
            std::cmp::Reverse(fields.get(t).map_or(0, |f| cost_rank(f.data_type())))
        });
        let chunks = workers
            .for_size(rows.len().saturating_mul(fields.len()))
            .run(tasks, &first, |task| encode_column(&column, fields, task))?;
        let mut row_group = file
            .next_row_group()
            .map_err(|e| format!("cannot start row group {group}: {e}"))?;
        for chunk in chunks.into_iter().flatten() {
            chunk
                .append_to_row_group(&mut row_group)
                .map_err(|e| format!("cannot write the Parquet rows: {e}"))?;
        }
        row_group
            .close()
            .map_err(|e| format!("cannot write the Parquet rows: {e}"))?;
    }
    file.into_inner()
        .map(Bytes::from)
        .map_err(|e| format!("cannot finish the Parquet file: {e}"))
}

/// The chunks of `task`'s column: built by `column`, checked as
/// `RecordBatch::try_new` checks a column, and encoded by the task's
/// writers.
fn encode_column<F>(
    column: &F,
    fields: &arrow_schema::Fields,
    task: ColumnTask,
) -> Result<Vec<ArrowColumnChunk>, String>
where
    F: Fn(usize, Range<usize>) -> Result<ArrayRef, String>,
{
    let field = fields
        .get(task.column)
        .ok_or_else(|| format!("the schema has no column {}", task.column))?;
    let array = column(task.column, task.rows.clone())?;
    if array.len() != task.rows.len() || array.data_type() != field.data_type() {
        return Err(format!(
            "cannot build the rows: column `{}` was built as {} rows of {}",
            field.name(),
            array.len(),
            array.data_type()
        ));
    }
    if !field.is_nullable() && array.null_count() > 0 {
        return Err(format!(
            "cannot build the rows: column `{}` may not be null and holds nulls",
            field.name()
        ));
    }
    let leaves =
        compute_leaves(field, &array).map_err(|e| format!("cannot write the Parquet rows: {e}"))?;
    if leaves.len() != task.writers.len() {
        return Err(format!(
            "cannot write the Parquet rows: column `{}` has {} leaves, not {}",
            field.name(),
            leaves.len(),
            task.writers.len()
        ));
    }
    task.writers
        .into_iter()
        .zip(&leaves)
        .map(|(mut writer, leaf)| {
            writer.write(leaf)?;
            writer.close()
        })
        .collect::<Result<Vec<ArrowColumnChunk>, _>>()
        .map_err(|e| format!("cannot write the Parquet rows: {e}"))
}

/// The Parquet leaf columns of an Arrow column of `data_type`.
fn leaf_count(data_type: &DataType) -> usize {
    match data_type {
        DataType::Struct(fields) => fields.iter().map(|f| leaf_count(f.data_type())).sum(),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            leaf_count(item.data_type())
        }
        DataType::Map(entries, _) => leaf_count(entries.data_type()),
        _ => 1,
    }
}

/// How costly a column of `data_type` is to build and encode, roughly: a
/// larger rank is started first.
fn cost_rank(data_type: &DataType) -> u8 {
    match data_type {
        DataType::Struct(_) | DataType::List(_) => 2,
        DataType::Utf8 => 1,
        _ => 0,
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

    /// The bytes `ArrowWriter` writes of `columns` in one batch, with the
    /// properties of an object of that many rows: what every Parquet
    /// object was before its columns were encoded apart.
    /// Each record of `b` read as `schema`'s row, as the sink's encoder
    /// leaves them on a batch for its write.
    fn held_rows<'b>(schema: &RowSchema, b: &'b EncodedBatch) -> Vec<Result<Held<'b>, String>> {
        b.records()
            .iter()
            .map(|r| {
                schema
                    .read_row(&r.value)
                    .map(Held::Read)
                    .ok_or_else(|| "unsure".to_owned())
            })
            .collect()
    }

    fn written_whole(format: &ObjectFormat, schema: &RowSchema, columns: Vec<ArrayRef>) -> Vec<u8> {
        written_with(format, schema, columns, object_properties)
    }

    /// The bytes `ArrowWriter` writes of `columns` in one batch, with
    /// what `properties` makes of the format's properties and the rows.
    fn written_with(
        format: &ObjectFormat,
        schema: &RowSchema,
        columns: Vec<ArrayRef>,
        properties: impl Fn(&WriterProperties, usize) -> WriterProperties,
    ) -> Vec<u8> {
        let ObjectFormat::Parquet {
            properties: own, ..
        } = format
        else {
            panic!("not Parquet");
        };
        let batch = arrow_array::RecordBatch::try_new(schema.arrow(), columns).unwrap();
        let properties = properties(own, batch.num_rows());
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, schema.arrow(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        out
    }

    /// In an object of a few thousand rows, a column of distinct values
    /// is written plain (a dictionary of them would cost more than it
    /// saves), a column of a few values keeps its dictionary, and the
    /// object is smaller than with the writer's 1 MiB dictionary limit;
    /// its values read back the same.
    #[test]
    fn distinct_values_in_a_small_row_group_go_plain_and_repeated_ones_keep_their_dictionary() {
        #[derive(serde::Deserialize)]
        struct Columns {
            columns: Vec<crate::ColumnConfig>,
        }
        let c: Columns = toml::from_str(
            r#"columns = [
                { name = "user", type = "string", nullable = false },
                { name = "tag", type = "string", nullable = false },
            ]"#,
        )
        .unwrap();
        let lines: Vec<String> = (0..4_000)
            .map(|i| format!(r#"{{"user":"user-{:08}","tag":"t{}"}}"#, i * 7919, i % 5))
            .collect();
        let b = batch(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let schema = RowSchema::new(&c.columns).unwrap();
        let format = ObjectFormat::parquet(
            SchemaSource::Declared(schema.clone()),
            ParquetCompression::Zstd,
            122_880,
            1 << 20,
        );
        let all: Vec<usize> = (0..lines.len()).collect();
        let rows = held_rows(&schema, &b);
        let bytes = format
            .encode(&b, &all, &super::Read::Rows(rows), Workers::new(2))
            .unwrap();
        // The same rows with the writer's own dictionary limit.
        let refs: Vec<Row> = b
            .records()
            .iter()
            .map(|r| schema.read_row(&r.value).unwrap())
            .collect();
        let refs: Vec<&Row> = refs.iter().collect();
        let whole = written_with(
            &format,
            &schema,
            schema.columns_of_rows(&refs).unwrap(),
            |own, _| own.clone(),
        );
        use parquet::file::reader::FileReader;
        let sizes = |bytes: Bytes| {
            let file = parquet::file::serialized_reader::SerializedFileReader::new(bytes).unwrap();
            let group = file.metadata().row_group(0).clone();
            (
                group.column(0).compressed_size(),
                group.column(1).compressed_size(),
            )
        };
        let ((users, tags), (all_users, all_tags)) = (sizes(bytes.clone()), sizes(whole.into()));
        assert!(
            users < all_users,
            "the distinct users take {users} bytes, {all_users} in a dictionary"
        );
        assert_eq!(tags, all_tags, "the five tags keep their dictionary");
        let read: Vec<arrow_array::RecordBatch> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 1 << 20)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        let users = read[0]
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        assert_eq!(users.len(), 4_000);
        assert_eq!(users.value(3_999), format!("user-{:08}", 3_999 * 7919));
    }

    const COLUMNS: &str = r#"columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "user", type = "string" },
        { name = "amount", type = "float64" },
        { name = "at", type = "timestamp" },
        { name = "who", type = "struct", field = "customer", fields = [
            { name = "name", type = "string", nullable = false },
            { name = "tags", type = "list", item = { name = "t", type = "int32" } },
        ] },
        { name = "tags", type = "list", item = { name = "tag", type = "string" } },
    ]"#;

    fn lines(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| match i % 4 {
                0 => format!(
                    r#"{{"id":{i},"user":"u{}","amount":{}.5,"at":{},"customer":{{"name":"c{i}","tags":[{i},null]}},"tags":["a","b{}"]}}"#,
                    i % 13,
                    i * 7,
                    1_733_500_000_000_u64 + i as u64,
                    i % 5
                ),
                1 => format!(r#"{{"id":{i},"user":null,"tags":[]}}"#),
                2 => format!(r#"{{"id":{i},"customer":{{"name":"x"}},"tags":[null,"z"],"at":"2026-12-06T10:00:00Z"}}"#),
                _ => format!(r#"{{"id":{i},"user":"\u00e9t\u00e9 {i}","amount":-{i}}}"#),
            })
            .collect()
    }

    /// Whatever the threads and the row groups, an object's bytes are the
    /// ones `ArrowWriter` writes of the same rows in one batch: a replay
    /// writes the same key with the same bytes as before.
    #[test]
    fn columns_encoded_on_several_threads_give_the_bytes_of_one_writer() {
        #[derive(serde::Deserialize)]
        struct Columns {
            columns: Vec<crate::ColumnConfig>,
        }
        let c: Columns = toml::from_str(COLUMNS).unwrap();
        let lines = lines(2_000);
        let b = batch(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        for (row_group_rows, page_bytes, compression) in [
            (122_880, 1 << 20, ParquetCompression::Zstd),
            (300, 1 << 20, ParquetCompression::Zstd),
            (7, 64, ParquetCompression::Snappy),
            (1, 1 << 20, ParquetCompression::None),
        ] {
            let schema = RowSchema::new(&c.columns).unwrap();
            let format = ObjectFormat::parquet(
                SchemaSource::Declared(schema.clone()),
                compression,
                row_group_rows,
                page_bytes,
            );
            let rows = held_rows(&schema, &b);
            // Every other record, so that the rows are not the batch's.
            let picked: Vec<usize> = (0..lines.len()).filter(|i| i % 3 != 1).collect();
            let refs: Vec<&Row> = picked
                .iter()
                .map(|&i| rows[i].as_ref().unwrap().row())
                .collect();
            let whole = written_whole(&format, &schema, schema.columns_of_rows(&refs).unwrap());
            let read = super::Read::Rows(rows);
            for threads in [1, 2, 3, 8] {
                let bytes = format
                    .encode(&b, &picked, &read, Workers::new(threads))
                    .unwrap();
                assert!(
                    bytes[..] == whole[..],
                    "{threads} threads, row groups of {row_group_rows}: other bytes"
                );
            }
            // Values read by a write whose key reads fields: the same.
            let values: Vec<Option<Value>> = b
                .records()
                .iter()
                .map(|r| serde_json::from_slice(&r.value).ok())
                .collect();
            let read = super::Read::Values(values);
            let bytes = format.encode(&b, &picked, &read, Workers::new(2)).unwrap();
            assert!(
                bytes[..] == whole[..],
                "values, row groups of {row_group_rows}"
            );
        }
    }

    /// A schema inferred from the first record is inferred once, whichever
    /// thread builds a column first.
    #[test]
    fn an_inferred_schema_encodes_as_one_writer_does() {
        // Without the records whose time is a string: the first one's is
        // a number, inferred as an integer column.
        let lines: Vec<String> = lines(100)
            .into_iter()
            .enumerate()
            .filter_map(|(i, l)| (i % 4 != 2).then_some(l))
            .collect();
        let b = batch(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let format = ObjectFormat::parquet(
            SchemaSource::Inferred(OnceLock::new()),
            ParquetCompression::Zstd,
            16,
            1 << 20,
        );
        let values: Vec<Option<Value>> = b
            .records()
            .iter()
            .map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        let all: Vec<usize> = (0..lines.len()).collect();
        let read = super::Read::Values(values);
        let bytes = format.encode(&b, &all, &read, Workers::new(4)).unwrap();
        let ObjectFormat::Parquet { schema, .. } = &format else {
            unreachable!()
        };
        let schema = schema.get(None).unwrap();
        let super::Read::Values(values) = &read else {
            unreachable!()
        };
        let refs: Vec<&Value> = values.iter().map(|v| v.as_ref().unwrap()).collect();
        let whole = written_whole(&format, schema, schema.columns(&refs).unwrap());
        assert!(bytes[..] == whole[..]);
    }

    #[test]
    fn gzip_and_zstd_decompress_to_the_lines_and_repeat_byte_for_byte() {
        let b = batch(&["{\"a\":1}", "{\"a\":2}"]);
        let gz = ObjectFormat::Ndjson(NdjsonCompression::Gzip)
            .encode(&b, &[0, 1], &super::Read::Nothing, Workers::new(1))
            .unwrap();
        let again = ObjectFormat::Ndjson(NdjsonCompression::Gzip)
            .encode(&b, &[0, 1], &super::Read::Nothing, Workers::new(1))
            .unwrap();
        assert_eq!(gz, again);
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n");
        let zst = ObjectFormat::Ndjson(NdjsonCompression::Zstd)
            .encode(&b, &[1], &super::Read::Nothing, Workers::new(1))
            .unwrap();
        assert_eq!(zstd::stream::decode_all(&zst[..]).unwrap(), b"{\"a\":2}\n");
    }
}
