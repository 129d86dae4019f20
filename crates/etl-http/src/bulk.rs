//! Elasticsearch's bulk API: the action line before each record, and the
//! reading of a 2xx answer that reports failed items inside its body.

use std::fmt;

use etl_record::FieldPath;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::BulkAction;

/// The action lines of a sink with the bulk encoding.
#[derive(Clone, Debug)]
pub(crate) struct Bulk {
    pub(crate) action: BulkAction,
    /// The field whose value is each document's `_id`.
    pub(crate) id: Option<FieldPath>,
}

/// Why a record gives no action line: it lacks the `_id` field.
#[derive(Debug, thiserror::Error)]
#[error("the bulk action's `_id` needs field `{0}`, a string, a number or a boolean")]
pub(crate) struct MissingId(FieldPath);

impl Bulk {
    /// The `_id` of a record whose value is `value` (`None`: not JSON),
    /// as a JSON string (quoted and escaped), when an id field is set.
    pub(crate) fn id_of(&self, value: Option<&Value>) -> Result<Option<String>, MissingId> {
        let Some(path) = &self.id else {
            return Ok(None);
        };
        let text = value
            .and_then(|v| path.get(v))
            .and_then(etl_record::scalar_text)
            .ok_or_else(|| MissingId(path.clone()))?;
        // Serialising a string cannot fail.
        Ok(Some(
            serde_json::to_string(text.as_ref()).unwrap_or_else(|_| "\"\"".to_owned()),
        ))
    }

    /// Append the action line of a record whose `_id` is `id` (a JSON
    /// string, as [`id_of`](Self::id_of) makes it).
    pub(crate) fn action_line(&self, id: Option<&str>, out: &mut Vec<u8>) {
        out.extend_from_slice(match self.action {
            BulkAction::Index => b"{\"index\":{",
            BulkAction::Create => b"{\"create\":{",
        });
        if let Some(id) = id {
            out.extend_from_slice(b"\"_id\":");
            out.extend_from_slice(id.as_bytes());
        }
        out.extend_from_slice(b"}}\n");
    }
}

/// What the kept start of a 2xx bulk answer says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `"errors": false`: every item was stored.
    Clean,
    /// `"errors": true`: some item failed; the first item's status, when
    /// the kept start shows it.
    Failed {
        /// The `status` of the answer's first item.
        first_item_status: Option<u16>,
    },
    /// No `errors` field in the kept start: not a bulk answer.
    Unknown,
}

/// Read the start of a bulk answer (perhaps cut short: only its first
/// bytes are kept). `errors` comes before `items` in Elasticsearch's and
/// OpenSearch's answers.
pub(crate) fn read(kept: &[u8]) -> Answer {
    let mut scan = Scan::default();
    let mut reader = serde_json::Deserializer::from_slice(kept);
    // A cut-off answer ends in an error; what was read before it stays.
    let _ = de::Deserializer::deserialize_map(&mut reader, &mut scan);
    match scan.errors {
        Some(false) => Answer::Clean,
        Some(true) => Answer::Failed {
            first_item_status: scan.first_item_status,
        },
        None => Answer::Unknown,
    }
}

#[derive(Default)]
struct Scan {
    errors: Option<bool>,
    first_item_status: Option<u16>,
}

impl<'de> Visitor<'de> for &mut Scan {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a bulk answer")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "errors" => self.errors = Some(map.next_value()?),
                "items" => map.next_value_seed(Items(&mut self.first_item_status))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `items`: the first item's status, the others skipped.
struct Items<'a>(&'a mut Option<u16>);

impl<'de> DeserializeSeed<'de> for Items<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bulk items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if seq.next_element_seed(Item(self.0))?.is_some() {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
        }
        Ok(())
    }
}

/// One item, `{"index": {..., "status": 201, ...}}`: its status, kept as
/// soon as it is read (an answer cut off after it still tells it).
struct Item<'a>(&'a mut Option<u16>);

impl<'de> DeserializeSeed<'de> for Item<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Item<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a bulk item")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // One key, the action; its value holds the status.
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Outcome(&mut *self.0))?;
        }
        Ok(())
    }
}

/// An item's outcome; only its status is read.
struct Outcome<'a>(&'a mut Option<u16>);

impl<'de> DeserializeSeed<'de> for Outcome<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Outcome<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a bulk item's outcome")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "status" && self.0.is_none() {
                *self.0 = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(id: Option<&str>) -> Bulk {
        Bulk {
            action: BulkAction::Index,
            id: id.map(|p| FieldPath::parse(p).unwrap()),
        }
    }

    #[test]
    fn the_id_is_taken_from_the_field_and_json_escaped() {
        let bulk = bulk(Some("order.id"));
        let value = serde_json::json!({"order": {"id": "a\"b\\c\n\u{1}é"}});
        let id = bulk.id_of(Some(&value)).unwrap();
        assert_eq!(id.as_deref(), Some(r#""a\"b\\c\n\u0001é""#));
        let mut line = Vec::new();
        bulk.action_line(id.as_deref(), &mut line);
        assert_eq!(
            line,
            b"{\"index\":{\"_id\":\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"}}\n"
        );
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed["index"]["_id"], "a\"b\\c\n\u{1}é");
        let number = serde_json::json!({"order": {"id": 42}});
        assert_eq!(
            bulk.id_of(Some(&number)).unwrap().as_deref(),
            Some("\"42\"")
        );
        let err = bulk
            .id_of(Some(&serde_json::json!({"order": {}})))
            .unwrap_err();
        assert!(err.to_string().contains("`order.id`"), "{err}");
        assert!(
            bulk.id_of(Some(&serde_json::json!({"order": {"id": [1]}})))
                .is_err()
        );
        assert!(bulk.id_of(None).is_err());
    }

    #[test]
    fn without_an_id_field_the_action_line_is_bare() {
        let mut line = Vec::new();
        bulk(None).action_line(None, &mut line);
        let create = Bulk {
            action: BulkAction::Create,
            id: None,
        };
        create.action_line(None, &mut line);
        assert_eq!(line, b"{\"index\":{}}\n{\"create\":{}}\n");
    }

    #[test]
    fn an_answer_is_read_for_errors_and_its_first_items_status_even_cut_short() {
        assert_eq!(
            read(br#"{"took":3,"errors":false,"items":[{"index":{"status":201}}]}"#),
            Answer::Clean
        );
        assert_eq!(
            read(br#"{"errors":false,"took":3,"items":[{"ind"#),
            Answer::Clean
        );
        let failed = br#"{"took":3,"errors":true,"items":[{"index":{"_index":"x","_id":"1","status":429,"error":{"type":"es_rejected_execution_exception"}}},{"index":{"status":201}}]}"#;
        assert_eq!(
            read(failed),
            Answer::Failed {
                first_item_status: Some(429)
            }
        );
        assert_eq!(
            read(&failed[..60]),
            Answer::Failed {
                first_item_status: None
            }
        );
        // Cut off inside the item's error, after its status.
        assert_eq!(
            read(&failed[..100]),
            Answer::Failed {
                first_item_status: Some(429)
            }
        );
        assert_eq!(read(b"ok"), Answer::Unknown);
        assert_eq!(read(b""), Answer::Unknown);
        assert_eq!(read(br#"{"took":3,"#), Answer::Unknown);
        assert_eq!(read(br#"{"errors":"no"}"#), Answer::Unknown);
        assert_eq!(read(br#"[1,2]"#), Answer::Unknown);
    }
}
