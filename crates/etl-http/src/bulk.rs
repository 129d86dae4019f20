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

/// Why a record gives no action line: its `_id` field is missing or
/// holds what cannot be an `_id`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the bulk action's `_id` needs field `{0}`: a string of 1 to {MAX_ID_BYTES} bytes, an \
     integer or a boolean (a decimal or an integer past 64 bits may not keep its digits: make \
     it a string)"
)]
pub(crate) struct MissingId(FieldPath);

/// Elasticsearch refuses an `_id` longer than this, failing the whole
/// request.
pub(crate) const MAX_ID_BYTES: usize = 512;

impl Bulk {
    /// The `_id` of a record whose value is `value` (`None`: not JSON),
    /// as a JSON string (quoted and escaped), when an id field is set.
    pub(crate) fn id_of(&self, value: Option<&Value>) -> Result<Option<String>, MissingId> {
        let Some(path) = &self.id else {
            return Ok(None);
        };
        let text = value
            .and_then(|v| path.get(v))
            // A number read as a float may have lost digits: two records
            // would share an `_id`, and one replace the other.
            .filter(|v| !v.as_number().is_some_and(|n| n.is_f64()))
            .and_then(etl_record::scalar_text)
            .filter(|text| (1..=MAX_ID_BYTES).contains(&text.len()))
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

/// The items of a bulk answer, counted by status as its body streams in
/// (every chunk, not only the kept start): each `"status":` key outside
/// a string is one item's.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Items stored (2xx).
    pub(crate) stored: usize,
    /// Items refused because their `_id` exists (409).
    pub(crate) conflicts: usize,
    /// Items refused for now (429, 5xx): the request may be sent again.
    pub(crate) retryable: usize,
    /// Items refused otherwise (another 4xx).
    pub(crate) refused: usize,
    /// The end of the last chunk that may hold the start of a key or
    /// status cut by the chunk's end (with the byte before it), carried
    /// into the next chunk.
    carry: Vec<u8>,
}

const STATUS_KEY: &[u8] = b"\"status\":";

impl Tally {
    /// The items answered.
    pub(crate) fn items(&self) -> usize {
        self.stored + self.conflicts + self.retryable + self.refused
    }

    /// Read one more chunk of the answer.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        let mut text = std::mem::take(&mut self.carry);
        // The carried bytes start with the byte before them (or none).
        let first = usize::from(!text.is_empty());
        text.extend_from_slice(chunk);
        let mut from = first;
        while let Some(at) = memchr::memmem::find(&text[from..], STATUS_KEY).map(|i| from + i) {
            let mut i = at + STATUS_KEY.len();
            while text.get(i).is_some_and(u8::is_ascii_whitespace) {
                i += 1;
            }
            let digits = text[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if i + digits == text.len() {
                // The status may go on in the next chunk.
                self.carry = text[at.saturating_sub(1)..].to_vec();
                if at == 0 {
                    self.carry.insert(0, b' ');
                }
                return;
            }
            // A quote escaped inside a string (`\"status\":`) is no key.
            let in_string = at > 0 && text[at - 1] == b'\\';
            if !in_string && digits > 0 {
                let status = std::str::from_utf8(&text[i..i + digits])
                    .ok()
                    .and_then(|d| d.parse::<u32>().ok())
                    .unwrap_or(0);
                match status {
                    200..=299 => self.stored += 1,
                    409 => self.conflicts += 1,
                    429 | 500..=599 => self.retryable += 1,
                    _ => self.refused += 1,
                }
            }
            from = i + digits;
        }
        // Keep what could be the start of a key cut by the chunk's end,
        // with the byte before it; nothing already counted.
        let start = from.max(text.len().saturating_sub(STATUS_KEY.len() - 1));
        self.carry = if start == 0 {
            std::iter::once(b' ').chain(text.iter().copied()).collect()
        } else {
            text[start - 1..].to_vec()
        };
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
        let big: Value =
            serde_json::from_str(r#"{"order": {"id": 18446744073709551615}}"#).unwrap();
        assert_eq!(
            bulk.id_of(Some(&big)).unwrap().as_deref(),
            Some("\"18446744073709551615\"")
        );
        // Past 64 bits, or a decimal, a number is read as a float and
        // may lose digits: two ids would become one.
        for text in [
            r#"{"order": {"id": 12345678901234567890123}}"#,
            r#"{"order": {"id": 12345678901234567890124}}"#,
            r#"{"order": {"id": 7.5}}"#,
            r#"{"order": {"id": ""}}"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert!(bulk.id_of(Some(&value)).is_err(), "{text}");
        }
        let long = serde_json::json!({"order": {"id": "x".repeat(MAX_ID_BYTES + 1)}});
        assert!(bulk.id_of(Some(&long)).is_err());
        let longest = serde_json::json!({"order": {"id": "x".repeat(MAX_ID_BYTES)}});
        assert!(bulk.id_of(Some(&longest)).is_ok());
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
    fn items_are_counted_by_status_across_chunks_and_never_inside_strings() {
        let answer = br#"{"took":3,"errors":true,"items":[{"index":{"_id":"1","status":201}},{"index":{"status": 429,"error":{"reason":"saw \"status\":500 \\"}}},{"create":{"status":409}},{"index":{"status":400}},{"index":{"status":503}}]}"#;
        let whole = {
            let mut t = Tally::default();
            t.feed(answer);
            t
        };
        assert_eq!(
            (
                whole.stored,
                whole.retryable,
                whole.conflicts,
                whole.refused
            ),
            (1, 2, 1, 1)
        );
        // Cut anywhere, even byte by byte, the count is the same.
        for size in 1..answer.len() {
            let mut t = Tally::default();
            for chunk in answer.chunks(size) {
                t.feed(chunk);
            }
            assert_eq!(
                (t.stored, t.retryable, t.conflicts, t.refused),
                (1, 2, 1, 1),
                "chunks of {size}"
            );
        }
        let mut none = Tally::default();
        none.feed(b"{\"errors\":false,\"items\":[]}");
        assert_eq!(none.items(), 0);
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
