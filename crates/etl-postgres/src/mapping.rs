//! From a record's JSON value to a row of text values, one per column.
//!
//! Every value travels as text and the server converts it to the column's
//! type (`$1::text::bigint`, or `COPY` into text columns then a cast), so
//! a value the type does not accept is refused by the database with its
//! own reason, and any PostgreSQL type can be mapped.

use etl_record::Record;
use serde_json::Value;

use crate::PostgresSinkConfig;

/// One column of a row: its quoted name, its type, and where its value
/// comes from.
#[derive(Clone, Debug)]
pub(crate) struct Column {
    /// The name, quoted for SQL.
    pub(crate) quoted: String,
    /// The type, as configured.
    pub(crate) pg_type: String,
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    /// The record's idempotency key, `source/partition/offset`.
    IdempotencyKey,
    /// A JSON field; `json` columns get JSON text, others the scalar.
    Field { path: Vec<String>, json: bool },
}

/// The columns of the target table in insert order, and which one is the
/// upsert key.
#[derive(Clone, Debug)]
pub(crate) struct Mapping {
    pub(crate) columns: Vec<Column>,
    pub(crate) key: usize,
}

/// A rendered row: one optional text per column (`None` is SQL `NULL`).
pub(crate) type Row = Vec<Option<String>>;

impl Mapping {
    pub(crate) fn new(config: &PostgresSinkConfig) -> Mapping {
        let mut columns = Vec::with_capacity(config.columns.len() + 1);
        // A configured column named as the key is the key; otherwise the
        // idempotency key gets its own first column.
        let key = match config
            .columns
            .iter()
            .position(|c| c.name == config.key_column)
        {
            Some(i) => i,
            None => {
                columns.push(Column {
                    quoted: quote_ident(&config.key_column),
                    pg_type: "text".to_owned(),
                    source: Source::IdempotencyKey,
                });
                0
            }
        };
        for c in &config.columns {
            let pg_type = c.pg_type.trim().to_owned();
            let lower = pg_type.to_ascii_lowercase();
            let path = c.json_path();
            columns.push(Column {
                quoted: quote_ident(&c.name),
                source: Source::Field {
                    path: if path.is_empty() {
                        Vec::new()
                    } else {
                        path.split('.').map(str::to_owned).collect()
                    },
                    json: lower == "json" || lower == "jsonb",
                },
                pg_type,
            });
        }
        Mapping { columns, key }
    }

    /// The row for `record`, or why it cannot be one (its value is not a
    /// JSON document).
    pub(crate) fn render(&self, record: &Record) -> Result<Row, String> {
        let needs_json = self
            .columns
            .iter()
            .any(|c| matches!(c.source, Source::Field { .. }));
        let doc: Value = if needs_json {
            serde_json::from_slice(&record.value)
                .map_err(|e| format!("value is not valid JSON: {e}"))?
        } else {
            Value::Null
        };
        Ok(self
            .columns
            .iter()
            .map(|c| match &c.source {
                Source::IdempotencyKey => Some(record.idempotency_key().to_string()),
                Source::Field { path, json } => lookup(&doc, path).and_then(|v| text(v, *json)),
            })
            .collect())
    }
}

/// The value at `path` ([`etl_record::FieldPath`]'s reading).
fn lookup<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    etl_record::json_field(doc, path)
}

/// A JSON value as column text: `null` and missing fields are `NULL`;
/// strings are their content (JSON text for `json` columns); numbers and
/// booleans their literal; objects and arrays their JSON text.
fn text(value: &Value, json: bool) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) if !json => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

/// `name` as a quoted SQL identifier; `schema.table` quotes each part.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A possibly schema-qualified table name, quoted part by part.
pub(crate) fn quote_table(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// Append `row` as one line of `COPY ... FROM STDIN` text format, after a
/// leading sequence number.
pub(crate) fn copy_line(seq: usize, row: &Row, out: &mut Vec<u8>) {
    out.extend_from_slice(seq.to_string().as_bytes());
    for value in row {
        out.push(b'\t');
        match value {
            None => out.extend_from_slice(b"\\N"),
            Some(s) => {
                for &b in s.as_bytes() {
                    match b {
                        b'\\' => out.extend_from_slice(b"\\\\"),
                        b'\t' => out.extend_from_slice(b"\\t"),
                        b'\n' => out.extend_from_slice(b"\\n"),
                        b'\r' => out.extend_from_slice(b"\\r"),
                        other => out.push(other),
                    }
                }
            }
        }
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId, Position, SourceId};

    fn record(value: &'static str) -> Record {
        Record::new(
            Position::new(SourceId::new("src"), PartitionId(2), Offset(7)),
            value,
        )
    }

    #[test]
    fn a_column_path_reads_array_indexes_as_a_filter_does() {
        let doc: Value = serde_json::from_str(r#"{"items":[1,2]}"#).unwrap();
        let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(lookup(&doc, &path("items.1")), Some(&Value::from(2)));
        assert_eq!(lookup(&doc, &path("items.+1")), None);
    }

    #[test]
    fn renders_paths_types_and_the_idempotency_key() {
        let config = PostgresSinkConfig::new("postgres://h/db", "t")
            .column("id", "id", "bigint")
            .column("name", "customer.name", "text")
            .column("sku", "items.1.sku", "text")
            .column("doc", "", "jsonb")
            .column("tag", "tag", "jsonb");
        let mapping = Mapping::new(&config);
        assert_eq!(mapping.key, 0);
        assert_eq!(mapping.columns[0].quoted, "\"etl_key\"");
        let row = mapping
            .render(&record(
                r#"{"id": 5, "customer": {"name": "Ann"}, "items": [{}, {"sku": "x"}], "tag": "t"}"#,
            ))
            .unwrap();
        assert_eq!(row[0].as_deref(), Some("src/2/7"));
        assert_eq!(row[1].as_deref(), Some("5"));
        assert_eq!(row[2].as_deref(), Some("Ann"));
        assert_eq!(row[3].as_deref(), Some("x"));
        assert!(row[4].as_deref().is_some_and(|d| d.starts_with('{')));
        assert_eq!(row[5].as_deref(), Some("\"t\""));
        assert!(mapping.render(&record("not json")).is_err());
        let missing = mapping.render(&record("{}")).unwrap();
        assert_eq!(missing[1], None);
    }

    #[test]
    fn a_mapped_key_column_is_the_key() {
        let config = PostgresSinkConfig::new("postgres://h/db", "t")
            .column("name", "name", "text")
            .column("id", "id", "bigint")
            .key_column("id");
        let mapping = Mapping::new(&config);
        assert_eq!(mapping.columns.len(), 2);
        assert_eq!(mapping.key, 1);
    }

    #[test]
    fn quoting_and_copy_escapes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_table("s.t"), "\"s\".\"t\"");
        let mut out = Vec::new();
        copy_line(3, &vec![Some("a\tb\\c\nd".into()), None], &mut out);
        assert_eq!(out, b"3\ta\\tb\\\\c\\nd\t\\N\n");
    }
}
