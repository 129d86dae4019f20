//! Writing a rewritten JSON document so that what the steps did not
//! change leaves byte for byte as it came.
//!
//! The rule: a value equal to what was read at the same place is written
//! from the original text (its number spelling, string escapes and inner
//! whitespace kept). An object that changed is written key by key in the
//! original order, each kept key by the same rule, then the keys the
//! steps added, in the map's order (sorted, as VRL's maps and serde_json's
//! without `preserve_order` are). An array that changed is written element
//! by element, each by the same rule against the element read at its
//! index. Anything else is written by serde_json: integers as integers,
//! floats as the shortest text that reads back as the same `f64` (always
//! with a `.` or an exponent: `1250.0`), strings with serde_json's escapes.
//!
//! Duplicate keys: the parser keeps the last, and it is written once, at
//! the place of its last occurrence.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::Serialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// A parsed JSON document the writer can compare and walk: a VRL value or
/// a serde_json one.
pub(crate) trait Tree: PartialEq + Serialize + Sized {
    /// The field `key`, when this is an object that has it.
    fn field(&self, key: &str) -> Option<&Self>;
    /// The object's entries in the map's order, when this is an object.
    fn entries(&self) -> Option<Vec<(&str, &Self)>>;
    /// The elements, when this is an array.
    fn items(&self) -> Option<&[Self]>;
}

/// Write `new` to `out`, given the original text `raw` of the value `old`
/// that stood at the same place.
pub(crate) fn write<T: Tree>(
    raw: &str,
    old: &T,
    new: &T,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    if old == new {
        out.extend_from_slice(raw.trim().as_bytes());
        return Ok(());
    }
    if let (Some(_), Some(new_entries)) = (old.entries(), new.entries()) {
        let entries = object_entries(raw)?;
        out.push(b'{');
        let mut first = true;
        for (i, (key, raw_value)) in entries.iter().enumerate() {
            // Only the last of duplicate keys is live.
            if entries[i + 1..].iter().any(|(k, _)| k == key) {
                continue;
            }
            let (Some(new_value), Some(old_value)) = (new.field(key), old.field(key)) else {
                continue;
            };
            comma(out, &mut first);
            serde_json::to_writer(&mut *out, key.as_ref())?;
            out.push(b':');
            write(raw_value.get(), old_value, new_value, out)?;
        }
        for (key, value) in new_entries {
            if old.field(key).is_some() {
                continue;
            }
            comma(out, &mut first);
            serde_json::to_writer(&mut *out, key)?;
            out.push(b':');
            serde_json::to_writer(&mut *out, value)?;
        }
        out.push(b'}');
        return Ok(());
    }
    if let (Some(old_items), Some(new_items)) = (old.items(), new.items()) {
        let raws: Vec<&RawValue> = serde_json::from_str(raw)?;
        if raws.len() == old_items.len() {
            out.push(b'[');
            let mut first = true;
            for (i, new_item) in new_items.iter().enumerate() {
                comma(out, &mut first);
                match (raws.get(i), old_items.get(i)) {
                    (Some(raw_item), Some(old_item)) => {
                        write(raw_item.get(), old_item, new_item, out)?;
                    }
                    _ => serde_json::to_writer(&mut *out, new_item)?,
                }
            }
            out.push(b']');
            return Ok(());
        }
    }
    serde_json::to_writer(&mut *out, new)
}

#[cfg(feature = "remap")]
impl Tree for vrl::value::Value {
    fn field(&self, key: &str) -> Option<&Self> {
        match self {
            Self::Object(map) => map.get(key),
            _ => None,
        }
    }

    fn entries(&self) -> Option<Vec<(&str, &Self)>> {
        match self {
            Self::Object(map) => Some(map.iter().map(|(k, v)| (k.as_str(), v)).collect()),
            _ => None,
        }
    }

    fn items(&self) -> Option<&[Self]> {
        match self {
            Self::Array(items) => Some(items),
            _ => None,
        }
    }
}

impl Tree for serde_json::Value {
    fn field(&self, key: &str) -> Option<&Self> {
        self.as_object()?.get(key)
    }

    fn entries(&self) -> Option<Vec<(&str, &Self)>> {
        Some(
            self.as_object()?
                .iter()
                .map(|(k, v)| (k.as_str(), v))
                .collect(),
        )
    }

    fn items(&self) -> Option<&[Self]> {
        self.as_array().map(Vec::as_slice)
    }
}

fn comma(out: &mut Vec<u8>, first: &mut bool) {
    if !std::mem::take(first) {
        out.push(b',');
    }
}

type Entries<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

/// The entries of a JSON object in written order, duplicates included.
fn object_entries(raw: &str) -> serde_json::Result<Entries<'_>> {
    let mut de = serde_json::Deserializer::from_str(raw);
    let entries = de.deserialize_map(EntriesVisitor)?;
    de.end()?;
    Ok(entries)
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(crate::scan::Key(key)) = map.next_key()? {
            let value: &'de RawValue = map.next_value()?;
            entries.push((key, value));
        }
        Ok(entries)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(serde::de::Error::custom("expected a JSON object"))
    }
}

/// Entries written as they stand in an object's text, one after the
/// other, copied in one piece: `"a":1,"b":2` is the text the entries
/// write one by one when each is written as it stands and they are
/// separated by a lone comma.
pub(crate) struct Verbatim<'d> {
    text: &'d str,
    /// The part of `text` not yet written.
    pending: Option<Range<usize>>,
}

impl<'d> Verbatim<'d> {
    pub(crate) fn new(text: &'d str) -> Self {
        Verbatim {
            text,
            pending: None,
        }
    }

    /// Where the entry `key`/`value`, as the checking pass reads them,
    /// starts in `text` when its text is what writing it writes: a key
    /// without escapes, borrowed from `text` (written as it is), then a
    /// colon, then the value, with no space between. (A key with escapes
    /// is written as serde_json writes its value, never as it stands:
    /// callers do not ask for one.)
    #[inline]
    pub(crate) fn start(text: &str, key: &str, value: &str) -> Option<usize> {
        let base = text.as_ptr().addr();
        let quote = key.as_ptr().addr().checked_sub(base)?.checked_sub(1)?;
        let colon = quote + key.len() + 2;
        let b = text.as_bytes();
        let written_so = b.get(quote) == Some(&b'"')
            && b.get(colon - 1) == Some(&b'"')
            && b.get(colon) == Some(&b':')
            && value.as_ptr().addr().checked_sub(base) == Some(colon + 1)
            && !value.as_bytes().last().is_some_and(u8::is_ascii_whitespace);
        written_so.then_some(quote)
    }

    /// The entry at `text[start..end]` is written next: added to the
    /// pending text when it follows it after a comma.
    pub(crate) fn take(&mut self, start: usize, end: usize, out: &mut Vec<u8>, first: &mut bool) {
        if let Some(pending) = &mut self.pending
            && pending.end + 1 == start
            && self.text.as_bytes().get(pending.end) == Some(&b',')
        {
            pending.end = end;
            return;
        }
        self.flush(out, first);
        self.pending = Some(start..end);
    }

    /// Write the pending text, after a comma unless it is `first`.
    pub(crate) fn flush(&mut self, out: &mut Vec<u8>, first: &mut bool) {
        if let Some(pending) = self.pending.take() {
            if !std::mem::take(first) {
                out.push(b',');
            }
            out.extend_from_slice(self.text.as_bytes().get(pending).unwrap_or_default());
        }
    }
}

#[cfg(all(test, feature = "remap"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use vrl::value::Value;

    use super::*;

    fn rewrite(raw: &str, change: impl FnOnce(&mut Value)) -> String {
        let old: Value = serde_json::from_str(raw).unwrap();
        let mut new = old.clone();
        change(&mut new);
        let mut out = Vec::new();
        write(raw, &old, &new, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn untouched_values_keep_their_text_and_keys_their_order() {
        let raw = r#"{"z":123456789012345678901234567890,"m":-0,"a":1.5e3,"s":"caf\u00e9","o":{"y":1,"x":[1, 2]}}"#;
        let out = rewrite(raw, |v| {
            v.insert(
                vrl::path!("new"),
                Value::from(vrl::prelude::NotNan::new(1250.0).unwrap()),
            );
            v.insert(vrl::path!("o", "x", 1), Value::from(3));
        });
        assert_eq!(
            out,
            r#"{"z":123456789012345678901234567890,"m":-0,"a":1.5e3,"s":"caf\u00e9","o":{"y":1,"x":[1,3]},"new":1250.0}"#
        );
    }

    #[test]
    fn an_unchanged_document_is_written_as_it_came() {
        let raw = r#"{ "b" : 1e0, "a" : [ 1 ] }"#;
        assert_eq!(rewrite(raw, |_| {}), raw);
    }

    #[test]
    fn deleted_keys_go_and_the_last_duplicate_wins() {
        let out = rewrite(r#"{"a":1,"b":2,"a":3,"c":4}"#, |v| {
            v.remove(vrl::path!("c"), false);
            v.insert(vrl::path!("b"), Value::from("x"));
        });
        assert_eq!(out, r#"{"b":"x","a":3}"#);
    }
}

/// The writer's round trip on serde_json's documents: what it writes reads
/// back as the new value, and every value the change did not touch is
/// written as the text it came as.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod round_trip {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::super::scan;
    use super::*;

    /// Values as users write them: spacing, escapes, number spellings
    /// serde_json would write otherwise, duplicate keys, nesting.
    fn raw_value() -> impl Strategy<Value = String> {
        let leaf = prop::sample::select(vec![
            "1",
            "-0",
            "2.50",
            "1e2",
            "1E+2",
            "-3e-7",
            "0.1",
            "18446744073709551616",
            "true",
            "null",
            r#""x""#,
            r#""caf\u00e9 \/ \"q\"""#,
            r#""山田""#,
            "{ }",
            "[ ]",
            r#"{"b":1,"b":2}"#,
        ])
        .prop_map(str::to_owned);
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec((inner.clone(), any::<bool>()), 0..4).prop_map(|v| {
                    let items: Vec<String> = v
                        .into_iter()
                        .map(|(v, spaced)| if spaced { format!(" {v} ") } else { v })
                        .collect();
                    format!("[{}]", items.join(","))
                }),
                object(inner),
            ]
        })
    }

    /// An object of `values`, its keys spelled plainly, escaped or
    /// spaced.
    fn object(values: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
        prop::collection::vec(("[a-d]", values, 0..3u8), 0..5).prop_map(|entries| {
            let body: Vec<String> = entries
                .iter()
                .map(|(k, v, style)| match style {
                    0 => format!("\"{k}\":{v}"),
                    1 => format!("\"\\u00{:02x}\":{v}", k.as_bytes()[0]),
                    _ => format!(" \"{k}\" : {v} "),
                })
                .collect();
            format!("{{{}}}", body.join(","))
        })
    }

    /// One change to a document: the value at a path set, or deleted.
    #[derive(Debug, Clone)]
    enum Change {
        Set(Vec<Segment>, Value),
        Delete(Vec<Segment>),
    }

    #[derive(Debug, Clone)]
    enum Segment {
        Key(String),
        Index(usize),
    }

    fn change() -> impl Strategy<Value = Change> {
        let segment = prop_oneof![
            3 => "[a-d]".prop_map(Segment::Key),
            1 => (0usize..3).prop_map(Segment::Index),
        ];
        let value = prop_oneof![
            any::<i64>().prop_map(Value::from),
            (-1e3f64..1e3).prop_map(Value::from),
            "[a-z\u{e9}\"\\\\]{0,4}".prop_map(Value::from),
            Just(serde_json::json!({"z": [1, {"y": null}], "a": "b"})),
            Just(Value::Null),
        ];
        let path = prop::collection::vec(segment, 1..4);
        prop_oneof![
            (path.clone(), value).prop_map(|(p, v)| Change::Set(p, v)),
            path.prop_map(Change::Delete),
        ]
    }

    /// Apply `change` where its path leads through what `doc` has.
    fn apply(doc: &mut Value, change: &Change) {
        let (path, set) = match change {
            Change::Set(p, v) => (p, Some(v)),
            Change::Delete(p) => (p, None),
        };
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut at = doc;
        for segment in parents {
            let next = match (segment, at) {
                (Segment::Key(k), Value::Object(m)) => m.get_mut(k),
                (Segment::Index(i), Value::Array(a)) => a.get_mut(*i),
                _ => None,
            };
            match next {
                Some(v) => at = v,
                None => return,
            }
        }
        match (last, at, set) {
            (Segment::Key(k), Value::Object(m), Some(v)) => {
                m.insert(k.clone(), v.clone());
            }
            (Segment::Key(k), Value::Object(m), None) => {
                m.remove(k);
            }
            (Segment::Index(i), Value::Array(a), Some(v)) if *i < a.len() => a[*i] = v.clone(),
            (Segment::Index(i), Value::Array(a), None) if *i < a.len() => {
                a.remove(*i);
            }
            _ => {}
        }
    }

    /// Every value of `new` equal to the one read at the same place of
    /// `old` is in `out` as its text in `raw`, byte for byte.
    fn untouched_spans_are_kept(
        raw: &str,
        out: &str,
        old: &Value,
        new: &Value,
    ) -> Result<(), String> {
        if old == new {
            return if out == raw.trim() {
                Ok(())
            } else {
                Err(format!("{raw:?} was written as {out:?}"))
            };
        }
        match (old, new) {
            (Value::Object(_), Value::Object(n)) => {
                let (raws, outs) = (scan::entries(raw).unwrap(), scan::entries(out).unwrap());
                fn last<'a>(entries: &[scan::Entry<'a>], key: &str) -> Option<&'a str> {
                    entries
                        .iter()
                        .rev()
                        .find(|(k, _)| k.is(key).unwrap())
                        .map(|(_, v)| *v)
                }
                for key in n.keys() {
                    if let (Some(o), Some(r), Some(w)) =
                        (old.get(key), last(&raws, key), last(&outs, key))
                    {
                        untouched_spans_are_kept(r, w, o, &n[key])?;
                    }
                }
                Ok(())
            }
            (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
                let (raws, outs) = (scan::items(raw).unwrap(), scan::items(out).unwrap());
                for i in 0..n.len() {
                    untouched_spans_are_kept(raws[i], outs[i], &o[i], &n[i])?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    proptest! {
        #[test]
        fn prop_written_documents_read_back_and_keep_untouched_text(
            raw in object(raw_value()),
            changes in prop::collection::vec(change(), 0..4),
        ) {
            let old: Value = serde_json::from_str(&raw).unwrap();
            let mut new = old.clone();
            for c in &changes {
                apply(&mut new, c);
            }
            let mut out = Vec::new();
            write(&raw, &old, &new, &mut out).unwrap();
            let out = String::from_utf8(out).unwrap();
            let read: Value = serde_json::from_str(&out).unwrap();
            // New values are written by serde_json, whose reading (without
            // its `float_roundtrip` feature) may give a float back one
            // unit in the last place away: the same drift as new's own
            // text read back.
            let expected: Value = serde_json::from_str(&new.to_string()).unwrap();
            prop_assert_eq!(&read, &expected, "{} written as {}", raw, out);
            if let Err(why) = untouched_spans_are_kept(&raw, &out, &old, &new) {
                prop_assert!(false, "{} written as {}: {}", raw, out, why);
            }
        }
    }
}
