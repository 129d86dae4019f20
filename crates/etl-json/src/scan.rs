//! Finding values in JSON text known to be valid, without checking it
//! again: strings are skipped eight bytes at a time (a word-at-a-time
//! search for a quote or a backslash), containers by counting
//! brackets. Every function gives `None` on text that is not what it
//! expects (it never panics), which callers treat as "not decided here".
//!
//! Value texts are what serde_json's `RawValue` holds for the same value:
//! from its first byte to its last, without surrounding whitespace.

use std::borrow::Cow;

/// An object's entries in written order, duplicates included: each key
/// (unescaped) and its value's text.
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
pub(crate) type Entries<'a> = Vec<(Cow<'a, str>, &'a str)>;

/// The deepest nesting the fast paths read, the record's own object
/// counting as 1: serde_json (and so VRL, and the JSON stage's general
/// path) refuses a value whose 128th container opens inside 127 others
/// with "recursion limit exceeded", so 127 is the most it reads. The
/// checking pass refuses deeper text and so does [`skip_value`], for text
/// known to be valid JSON that serde_json cannot read all the same.
pub(crate) const MAX_DEPTH: usize = 127;

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    i
}

/// The index just past the string starting (with its quote) at `i`,
/// eight bytes at a time.
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        while let Some(word) = b.get(j..j + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            let found = quote_or_backslash(u64::from_le_bytes(word));
            if found != 0 {
                j += (found.trailing_zeros() / 8) as usize;
                break;
            }
            j += 8;
        }
        match *b.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The bytes of `word` (little-endian) that are a quote or a backslash:
/// the classic "has a zero byte" test, whose lowest flag is exact (borrows
/// only run up).
pub(crate) fn quote_or_backslash(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')))
}

/// The index just past the value starting at `i`; `None` for a
/// container nested [`MAX_DEPTH`] deep inside it (a value of an object is
/// at least one container deep: the one it is in).
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => {
                        depth += 1;
                        if depth >= MAX_DEPTH {
                            return None;
                        }
                    }
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b
                .get(j)
                .is_some_and(|&c| !is_ws(c) && !matches!(c, b',' | b'}' | b']'))
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// A key's text (quotes included) as the string it stands for.
fn key(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.get(1..text.len().checked_sub(1)?)?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(text).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// Call `f` with each entry of the object `text`, in written order.
fn each_entry<'a>(text: &'a str, mut f: impl FnMut(&'a str, &'a str)) -> Option<()> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(());
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let end = skip_string(b, i)?;
        let k = text.get(i..end)?;
        i = skip_ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let end = skip_value(b, start)?;
        f(k, text.get(start..end)?);
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

/// The entries of the object `text`.
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
pub(crate) fn entries(text: &str) -> Option<Entries<'_>> {
    entries_in(text, Vec::new())
}

/// The entries of the object `text`, in `out` (emptied first: a vector
/// kept to reuse its allocation).
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
pub(crate) fn entries_in<'a>(text: &'a str, mut out: Entries<'a>) -> Option<Entries<'a>> {
    out.clear();
    append_entries(text, &mut out)?;
    Some(out)
}

/// The entries of the object `text`, appended to `out` (left as it was
/// when the text is not one).
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
pub(crate) fn append_entries<'a>(text: &'a str, out: &mut Entries<'a>) -> Option<()> {
    let from = out.len();
    let mut ok = true;
    let read = each_entry(text, |k, v| match key(k) {
        Some(k) => out.push((k, v)),
        None => ok = false,
    });
    if read.is_none() || !ok {
        out.truncate(from);
        return None;
    }
    Some(())
}

/// An empty vector with `spare`'s allocation, of another type of the same
/// layout (entries of another record's text): a vector kept across
/// records costs no allocation per record. Collecting an emptied vector's
/// iterator into one of the same layout reuses its allocation; one of
/// another layout gets a new one, which is only slower.
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
#[inline(always)]
pub(crate) fn recycle<T, U>(mut spare: Vec<T>) -> Vec<U> {
    spare.clear();
    spare.into_iter().filter_map(|_| None).collect()
}

/// [`recycle`] for each vector of `spare`, which keeps its own allocation
/// (vectors of vectors have one layout whatever they hold).
pub(crate) fn recycle_each<T, U>(spare: Vec<Vec<T>>) -> Vec<Vec<U>> {
    spare.into_iter().map(recycle).collect()
}

/// A key as serde_json reads it, borrowed from the text unless it has
/// escapes. (`Cow<str>`'s own `Deserialize` always copies.)
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string key")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The text of the last value of `wanted` in the object `text`
/// (`Some(None)`: the object has no such key).
pub(crate) fn find<'a>(text: &'a str, wanted: &str) -> Option<Option<&'a str>> {
    let mut found = None;
    let mut ok = true;
    each_entry(text, |k, v| {
        let inner = &k[1..k.len() - 1];
        let same = if inner.contains('\\') {
            match key(k) {
                Some(k) => k == wanted,
                None => {
                    ok = false;
                    false
                }
            }
        } else {
            inner == wanted
        };
        if same {
            found = Some(v);
        }
    })?;
    ok.then_some(found)
}

/// The texts of the elements of the array `text`.
pub(crate) fn items(text: &str) -> Option<Vec<&str>> {
    items_with(text, |_| None)
}

/// [`items`], where `known(i)` may give the end of the item starting at
/// `text[i..]` (just past it) without walking it.
#[inline]
pub(crate) fn items_with(text: &str, known: impl Fn(usize) -> Option<usize>) -> Option<Vec<&str>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(out);
    }
    loop {
        let end = match known(i) {
            Some(end) => end,
            None => skip_value(b, i)?,
        };
        out.push(text.get(i..end)?);
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => return Some(out),
            _ => return None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;
    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    use super::*;

    /// What serde_json reads: the reference.
    fn serde_entries(text: &str) -> Vec<(String, String)> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<(String, String)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    let v: &RawValue = m.next_value()?;
                    out.push((k, v.get().to_owned()));
                }
                Ok(out)
            }
        }
        serde_json::Deserializer::from_str(text)
            .deserialize_map(V)
            .unwrap()
    }

    #[test]
    fn reads_what_serde_json_reads() {
        let text =
            r#" { "a" : [1, {"b":"]}\"\\"}] , "k\"ey\u00e9":-1.5e3,"s":"x\\","a":{ },"n":null } "#;
        let ours: Vec<(String, String)> = entries(text)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.to_owned()))
            .collect();
        assert_eq!(ours, serde_entries(text));
        assert_eq!(find(text, "a"), Some(Some("{ }")));
        assert_eq!(find(text, "k\"eyé"), Some(Some("-1.5e3")));
        assert_eq!(find(text, "zz"), Some(None));
        assert_eq!(
            items(r#"[ 1,"a\"]",[2,[3]] ,{"x":[]}]"#).unwrap(),
            vec!["1", r#""a\"]""#, "[2,[3]]", r#"{"x":[]}"#]
        );
        assert_eq!(items("[]").unwrap(), Vec::<&str>::new());
        for bad in ["", "[", "{", r#"{"a"}"#, r#"{"a":1"#, "[1,", "{]"] {
            assert!(entries(bad).is_none() || items(bad).is_none(), "{bad}");
        }
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1e9f64..1e9).prop_map(serde_json::Value::from),
            "[a\"\\\\\u{e9}\n\\]{} ]{0,5}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-c\"\\\\]{1,2}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn prop_entries_match_serde_json(
            fields in prop::collection::vec(("[a-c\"\\\\]{1,2}", json()), 0..5),
            pretty in any::<bool>(),
        ) {
            let obj = serde_json::Value::Object(fields.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&obj).unwrap()
            } else {
                serde_json::to_string(&obj).unwrap()
            };
            let ours: Vec<(String, String)> = entries(&text)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.into_owned(), v.to_owned()))
                .collect();
            prop_assert_eq!(ours, serde_entries(&text));
        }
    }
}
