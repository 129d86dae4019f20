//! Object keys from a template: where each object of records goes.

use chrono::{DateTime, Utc};
use etl_record::{FieldPath, Record, Template, TemplatePart};
use serde_json::Value;

use crate::ObjectStoreSinkError;

/// An object key template, such as
/// `orders/dt={date}/{partition}-{first_offset}.parquet`.
///
/// Placeholders:
///
/// * `{partition}`: the records' source partition;
/// * `{first_offset}`: the offset of the object's first record, zero-padded
///   to 20 digits so keys sort by offset;
/// * `{topic}`: the record's topic, or the source's name when it has none;
/// * `{date}` (`YYYY-MM-DD`) and `{hour}` (`HH`), in UTC, from the
///   configured `date_field`, else the record's timestamp, else the time
///   the object is written;
/// * anything else, such as `{customer.region}`: that field of the record's
///   JSON value (a dotted path). A string is used as it is, a number or a
///   boolean as its JSON text; a record without the field (or with a null,
///   an object or an array there) cannot be placed and goes to the
///   dead-letter path.
///
/// Characters other than ASCII letters, digits and `-_.=` in a value are
/// written as `%XX`, so a value never adds a `/` level or an invalid key.
/// Records whose key parts other than `{first_offset}` differ go to
/// different objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Partition,
    FirstOffset,
    Topic,
    Date,
    Hour,
    Field(FieldPath),
}

/// The record-dependent parts of a record's key (all but the offset): two
/// records with equal `KeyParts` may share an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyParts(Vec<String>);

impl KeyParts {
    /// Parts of a made-up record, to check that a template's keys are
    /// valid object paths.
    pub(crate) fn sample(template: &KeyTemplate) -> KeyParts {
        KeyParts(
            template
                .parts
                .iter()
                .filter(|p| !matches!(p, Part::Literal(_) | Part::FirstOffset))
                .map(|_| "x".to_owned())
                .collect(),
        )
    }
}

impl KeyTemplate {
    /// Parse `template` (an [`etl_record::Template`]: `{{` and `}}` are
    /// literal braces).
    ///
    /// # Errors
    ///
    /// [`ObjectStoreSinkError::Config`] for an empty template, an
    /// unclosed `{`, a placeholder that is no field path, or a template
    /// without `{partition}` and `{first_offset}` (two objects would share
    /// a key, the later overwriting the earlier).
    pub fn parse(template: &str) -> Result<Self, ObjectStoreSinkError> {
        let bad = |why: String| ObjectStoreSinkError::Config(format!("key {template:?}: {why}"));
        if template.trim().is_empty() {
            return Err(bad("empty".to_owned()));
        }
        let parsed = Template::parse(template).map_err(|e| bad(e.to_string()))?;
        let parts: Vec<Part> = parsed
            .parts()
            .iter()
            .map(|part| match part {
                TemplatePart::Text(text) => Part::Literal(text.clone()),
                TemplatePart::Field(path) => match path.to_string().as_str() {
                    "partition" => Part::Partition,
                    "first_offset" => Part::FirstOffset,
                    "topic" => Part::Topic,
                    "date" => Part::Date,
                    "hour" => Part::Hour,
                    _ => Part::Field(path.clone()),
                },
            })
            .collect();
        for (needed, why) in [
            (Part::FirstOffset, "two objects of a partition"),
            (
                Part::Partition,
                "two partitions' objects at the same offset",
            ),
        ] {
            if !parts.contains(&needed) {
                let name = if needed == Part::Partition {
                    "partition"
                } else {
                    "first_offset"
                };
                return Err(bad(format!(
                    "it must hold `{{{name}}}`: without it, {why} get the same key and the later \
                     overwrites the earlier"
                )));
            }
        }
        Ok(KeyTemplate { parts })
    }

    /// Whether the template holds `{date}` or `{hour}`.
    #[must_use]
    pub fn uses_time(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Date | Part::Hour))
    }

    /// Whether the template reads fields of the record's value.
    pub(crate) fn reads_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The record-dependent parts of `record`'s key. `time` is the
    /// record's time for `{date}`/`{hour}`.
    pub(crate) fn parts_of(
        &self,
        record: &Record,
        json: Option<&Value>,
        time: DateTime<Utc>,
    ) -> Result<KeyParts, String> {
        let mut out = Vec::new();
        for part in &self.parts {
            match part {
                Part::Literal(_) | Part::FirstOffset => {}
                Part::Partition => out.push(record.position.partition.0.to_string()),
                Part::Topic => out.push(escape(
                    record
                        .topic
                        .as_deref()
                        .unwrap_or(record.position.source.as_str()),
                )),
                Part::Date => out.push(time.format("%Y-%m-%d").to_string()),
                Part::Hour => out.push(time.format("%H").to_string()),
                Part::Field(path) => {
                    let value = json.and_then(|v| path.get(v));
                    let text = match value {
                        Some(Value::String(s)) if !s.is_empty() => escape(s),
                        Some(v @ (Value::Number(_) | Value::Bool(_))) => escape(&v.to_string()),
                        _ => {
                            return Err(format!(
                                "the key needs field `{path}`, a non-empty string, a number or a boolean, and the record has none"
                            ));
                        }
                    };
                    out.push(text);
                }
            }
        }
        Ok(KeyParts(out))
    }

    /// The key of an object whose first record is at `first_offset` and
    /// whose records have `parts`.
    pub(crate) fn render(&self, parts: &KeyParts, first_offset: i64) -> String {
        let mut key = String::new();
        let mut values = parts.0.iter();
        for part in &self.parts {
            match part {
                Part::Literal(text) => key.push_str(text),
                Part::FirstOffset => key.push_str(&format!("{first_offset:020}")),
                _ => key.push_str(values.next().map_or("", String::as_str)),
            }
        }
        key
    }
}

/// The value at a dotted `path` of `value` ([`etl_record::FieldPath`]'s
/// reading: digits index arrays).
pub(crate) fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    etl_record::json_field(value, path)
}

/// `text` with every byte outside `[A-Za-z0-9._=-]` as `%XX`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'=') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // A key segment of only dots would be `.` or `..`.
    if out.bytes().all(|b| b == b'.') {
        return out.replace('.', "%2E");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId, Position, SourceId};

    fn record(value: &str) -> Record {
        Record::new(
            Position::new(SourceId::new("orders"), PartitionId(3), Offset(42)),
            value.to_owned(),
        )
    }

    #[test]
    fn renders_every_placeholder_and_escapes_field_values() {
        let t = KeyTemplate::parse(
            "{topic}/dt={date}/h={hour}/r={customer.region}/{partition}-{first_offset}.parquet",
        )
        .unwrap();
        let json: Value = serde_json::json!({"customer": {"region": "eu/west 1"}});
        let time = DateTime::parse_from_rfc3339("2026-12-06T02:45:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let r = record("{}");
        let parts = t.parts_of(&r, Some(&json), time).unwrap();
        assert_eq!(
            t.render(&parts, 42),
            "orders/dt=2026-12-06/h=02/r=eu%2Fwest%201/3-00000000000000000042.parquet"
        );
    }

    #[test]
    fn a_record_without_the_key_field_cannot_be_placed() {
        let t = KeyTemplate::parse("{region}/{partition}-{first_offset}").unwrap();
        let json: Value = serde_json::json!({"region": null});
        let err = t
            .parts_of(&record("{}"), Some(&json), Utc::now())
            .unwrap_err();
        assert!(err.contains("`region`"), "{err}");
        assert!(t.parts_of(&record("{}"), None, Utc::now()).is_err());
    }

    #[test]
    fn malformed_templates_and_templates_without_the_offset_are_refused() {
        for bad in [
            "",
            "{partition}.json",
            "{first_offset",
            "a}{first_offset}",
            "{}{first_offset}",
            "{a..b}{first_offset}",
            "{items[0]}{partition}{first_offset}",
        ] {
            assert!(KeyTemplate::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(escape(".."), "%2E%2E");
    }

    #[test]
    fn a_key_without_the_partition_is_refused_in_every_mode() {
        // Two partitions' objects at the same first offset would share a
        // key, the later overwriting the earlier: at least once too.
        let error = KeyTemplate::parse("orders/{first_offset}.ndjson").unwrap_err();
        assert!(error.to_string().contains("{partition}"), "{error}");
        assert!(KeyTemplate::parse("orders/{partition}/{first_offset}.ndjson").is_ok());
    }
}
