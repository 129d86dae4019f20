//! Finding values in JSON text known to be valid, without checking it
//! again: strings are skipped eight bytes at a time (a word-at-a-time
//! search for a quote or a backslash), containers by counting
//! brackets. Every function gives `None` on text that is not what it
//! expects (it never panics), which callers treat as "not decided here".
//!
//! Value texts are what serde_json's `RawValue` holds for the same value:
//! from its first byte to its last, without surrounding whitespace.

use std::borrow::Cow;

/// An object's entry: its key as written and its value's text.
pub(crate) type Entry<'a> = (RawKey<'a>, &'a str);

/// An object's entries in written order, duplicates included. An entry
/// borrows all it holds from the text: emptying a vector of them drops
/// nothing, whatever its length.
#[cfg_attr(not(feature = "remap"), allow(dead_code))]
pub(crate) type Entries<'a> = Vec<Entry<'a>>;

/// An object's key as it is written in the object's text, decoded only
/// where its value is needed: compared with another key, written, or
/// handed to a reader of its own.
///
/// A key without escapes is the text between its quotes, which is its
/// value as it stands. A key with escapes is its whole quoted text,
/// escapes and all (what serde_json decodes). The two never meet: a key
/// without escapes has no quote between its quotes, so its text never
/// starts with one, and a key with escapes always does.
///
/// Keys have no `PartialEq` outside the tests, where two keys are the
/// same text as written: `"a\u0062"` and `"ab"` are one key, which only
/// [`RawKey::same`] and [`RawKey::is`] say.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawKey<'a>(&'a str);

impl<'a> RawKey<'a> {
    /// The key without escapes whose text between its quotes is `inner`;
    /// `None` when `inner` starts with a quote (a key without escapes has
    /// none).
    #[inline(always)]
    pub(crate) fn unescaped(inner: &'a str) -> Option<Self> {
        (!inner.starts_with('"')).then_some(RawKey(inner))
    }

    /// The key without escapes whose text between its quotes is `inner`,
    /// read by a reader that stopped at the first quote after the
    /// opening one (so `inner` has none), and saw no backslash: not
    /// checked again.
    #[inline(always)]
    pub(crate) fn between_quotes(inner: &'a str) -> Self {
        RawKey(inner)
    }

    /// The key with escapes whose text, quotes included, is `quoted`;
    /// `None` when `quoted` is not quoted or has no backslash.
    pub(crate) fn with_escapes(quoted: &'a str) -> Option<Self> {
        let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
        inner.contains('\\').then_some(RawKey(quoted))
    }

    /// Whether the key has escapes.
    #[inline(always)]
    pub(crate) fn escaped(self) -> bool {
        self.0.as_bytes().first() == Some(&b'"')
    }

    /// The key, when it has no escapes: its text as written is its value.
    #[inline(always)]
    pub(crate) fn plain(self) -> Option<&'a str> {
        (!self.escaped()).then_some(self.0)
    }

    /// The key's text as it is held: between its quotes without escapes,
    /// quotes included with them.
    #[cfg_attr(not(any(feature = "remap", feature = "fuzzing")), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn held(self) -> &'a str {
        self.0
    }

    /// The key's value: borrowed from the text without escapes, decoded
    /// by serde_json with them. `None` when serde_json refuses the
    /// escapes (a lone surrogate), which the readers refuse before.
    pub(crate) fn decoded(self) -> Option<Cow<'a, str>> {
        match self.plain() {
            Some(key) => Some(Cow::Borrowed(key)),
            None => {
                #[cfg(test)]
                DECODED.with(|n| n.set(n.get() + 1));
                serde_json::from_str::<String>(self.0).ok().map(Cow::Owned)
            }
        }
    }

    /// Whether the key is `wanted`. A key without escapes is compared as
    /// it stands, without decoding; one with escapes is decoded (see
    /// [`RawKey::is_decoded`]). `None` when it does not decode.
    #[inline(always)]
    pub(crate) fn is(self, wanted: &str) -> Option<bool> {
        if self.0 == wanted {
            // A key with escapes decodes shorter than its quoted text.
            Some(!self.escaped())
        } else if !self.escaped() {
            Some(false)
        } else {
            self.is_decoded(wanted)
        }
    }

    /// [`RawKey::is`] for a key with escapes: decoded when its value can
    /// be as long as `wanted` (each escape decodes to fewer bytes than it
    /// is written with, so a key with escapes is shorter than the text
    /// between its quotes).
    #[cold]
    #[inline(never)]
    fn is_decoded(self, wanted: &str) -> Option<bool> {
        if wanted.len() + 2 >= self.0.len() {
            return Some(false);
        }
        Some(self.decoded()? == wanted)
    }

    /// Whether two keys are one (the same value, however written): two
    /// keys written alike are, two without escapes written otherwise are
    /// not, and the rest are decoded. `None` when one does not decode.
    #[inline(always)]
    pub(crate) fn same(self, other: RawKey<'_>) -> Option<bool> {
        if self.0 == other.0 {
            Some(true)
        } else if !self.escaped() && !other.escaped() {
            Some(false)
        } else {
            self.same_decoded(other)
        }
    }

    /// Whether two keys are written alike (then they are one key; keys
    /// without escapes are one key only so).
    #[cfg_attr(not(feature = "remap"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn alike(self, other: RawKey<'_>) -> bool {
        self.0 == other.0
    }

    /// [`RawKey::same`] for keys written otherwise, one with escapes.
    #[cold]
    #[inline(never)]
    fn same_decoded(self, other: RawKey<'_>) -> Option<bool> {
        match (self.plain(), other.plain()) {
            (Some(a), _) => other.is(a),
            (None, Some(b)) => self.is(b),
            (None, None) => Some(self.decoded()? == other.decoded()?),
        }
    }
}

/// The value of the last entry of `key` among `entries` (`Some(None)`:
/// there is none); `None` when a key after it does not decode. Keys
/// without escapes are compared as they stand; from the last key with
/// escapes that may be `key` (one longer than it, with its quotes, by
/// more than two bytes: see [`RawKey::is_decoded`]) on, the keys are
/// decoded.
#[inline(always)]
pub(crate) fn last<'a>(entries: &[Entry<'a>], key: &str) -> Option<Option<&'a str>> {
    let mut i = entries.len();
    while i > 0 {
        i -= 1;
        let (k, v) = entries[i];
        if k.0 == key {
            // Written as `key`, a key with escapes is shorter than it.
            if !k.escaped() {
                return Some(Some(v));
            }
        } else if k.0.len() > key.len() + 2 && k.escaped() {
            return last_decoding(&entries[..=i], key);
        }
    }
    Some(None)
}

/// [`last`], each key compared by [`RawKey::is`].
#[cold]
#[inline(never)]
fn last_decoding<'a>(entries: &[Entry<'a>], key: &str) -> Option<Option<&'a str>> {
    for &(k, v) in entries.iter().rev() {
        if k.is(key)? {
            return Some(Some(v));
        }
    }
    Some(None)
}

/// Whether `key` is the key of one of `entries`; `None` when a key does
/// not decode. Two keys written alike are one; when neither has escapes,
/// two keys written otherwise are not, and the rest are decoded.
#[inline(always)]
pub(crate) fn has_key(entries: &[Entry<'_>], key: RawKey<'_>) -> Option<bool> {
    if key.escaped() {
        return has_key_decoding(entries, key);
    }
    for (i, &(k, _)) in entries.iter().enumerate() {
        if k.0 == key.0 {
            return Some(true);
        }
        if k.0.len() > key.0.len() + 2 && k.escaped() {
            return has_key_decoding(&entries[i..], key);
        }
    }
    Some(false)
}

/// [`has_key`], each key compared by [`RawKey::same`].
#[cold]
#[inline(never)]
fn has_key_decoding(entries: &[Entry<'_>], key: RawKey<'_>) -> Option<bool> {
    for &(k, _) in entries {
        if k.same(key)? {
            return Some(true);
        }
    }
    Some(false)
}

/// For each of `entries`, whether a later entry has its key (of
/// duplicate keys only the last is live), each key with escapes decoded
/// once; `None` when one does not decode. For objects with keys with
/// escapes: comparing each entry's key with every later one decodes a
/// pair of such keys at each comparison.
pub(crate) fn shadowed(entries: &[Entry<'_>]) -> Option<Vec<bool>> {
    let keys = entries
        .iter()
        .map(|(k, _)| k.decoded())
        .collect::<Option<Vec<_>>>()?;
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    let mut shadowed = vec![false; keys.len()];
    for (i, key) in keys.iter().enumerate().rev() {
        shadowed[i] = !seen.insert(key.as_ref());
    }
    Some(shadowed)
}

// How many keys with escapes this thread decoded (tests bound the work).
#[cfg(test)]
thread_local! {
    pub(crate) static DECODED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Two keys are the same text as written (the readers' tests compare
/// what they read; the code compares keys with [`RawKey::same`]).
#[cfg(test)]
impl PartialEq for RawKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

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

/// The key whose text is `text` (quotes included). A key with escapes
/// is decoded once, and refused when serde_json refuses it, as the
/// readers of its value would.
fn key(text: &str) -> Option<RawKey<'_>> {
    let inner = text.get(1..text.len().checked_sub(1)?)?;
    if !inner.contains('\\') {
        return RawKey::unescaped(inner);
    }
    let key = RawKey::with_escapes(text)?;
    key.decoded()?;
    Some(key)
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
    each_entry(text, |k, v| match key(k).and_then(|k| k.is(wanted)) {
        Some(true) => found = Some(v),
        Some(false) => {}
        None => ok = false,
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
            .map(|(k, v)| (k.decoded().unwrap().into_owned(), v.to_owned()))
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

    #[test]
    fn a_key_is_the_key_it_decodes_to_however_written() {
        let text = r#"{"ab":1,"a\u0062":2,"a\\b":3,"\u00e9":4,"é":5,"":6,"\"":7}"#;
        let read = entries(text).unwrap();
        let keys: Vec<RawKey<'_>> = read.iter().map(|(k, _)| *k).collect();
        let values: Vec<Cow<'_, str>> = keys.iter().map(|k| k.decoded().unwrap()).collect();
        assert_eq!(values, ["ab", "ab", "a\\b", "é", "é", "", "\""]);
        let escaped: Vec<bool> = keys.iter().map(|k| k.escaped()).collect();
        assert_eq!(escaped, [false, true, true, true, false, false, true]);
        for (a, value_a) in keys.iter().zip(&values) {
            for (b, value_b) in keys.iter().zip(&values) {
                assert_eq!(a.same(*b), Some(value_a == value_b), "{a:?} {b:?}");
                assert_eq!(a.is(value_b), Some(value_a == value_b), "{a:?} {b:?}");
            }
        }
        // The last of duplicates, however written; a key's escapes as
        // written are not its value.
        assert_eq!(last(&read, "ab"), Some(Some("2")));
        assert_eq!(last(&read, "é"), Some(Some("5")));
        assert_eq!(last(&read, "a\\u0062"), Some(None));
        assert_eq!(last(&read, "\"a\\u0062\""), Some(None));
        assert_eq!(has_key(&read[1..], keys[0]), Some(true));
        assert_eq!(has_key(&read[2..], keys[1]), Some(false));
        assert_eq!(has_key(&read[4..], keys[3]), Some(true));
        assert_eq!(find(text, "ab"), Some(Some("2")));
        // A key serde_json does not decode is not read.
        assert!(entries(r#"{"\ud800":1}"#).is_none());
        assert_eq!(find(r#"{"\ud800":1}"#, "a"), None);
    }

    /// A key over a small alphabet, each character written as it is or
    /// escaped (every way JSON escapes it), so that keys written
    /// otherwise are often one key.
    fn spelled() -> impl Strategy<Value = String> {
        let chars = prop::sample::select(vec!['a', 'b', '"', '\\', '/', '\u{e9}', '\n']);
        prop::collection::vec((chars, 0..3u8), 0..4).prop_map(|cs| {
            cs.into_iter()
                .map(|(c, how)| match (c, how) {
                    ('"' | '\\' | '\n', 0 | 1) => {
                        serde_json::to_string(&c.to_string()).unwrap()[1..3].to_owned()
                    }
                    ('/', 1) => "\\/".to_owned(),
                    (c, 0 | 1) => c.to_string(),
                    (c, _) => format!("\\u{:04x}", u32::from(c)),
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn prop_keys_compare_as_the_values_they_decode_to(a in spelled(), b in spelled()) {
            let text = format!("{{\"{a}\":1,\"{b}\":2}}");
            let read = entries(&text).unwrap();
            let (key_a, key_b) = (read[0].0, read[1].0);
            let value_a: String = serde_json::from_str(&format!("\"{a}\"")).unwrap();
            let value_b: String = serde_json::from_str(&format!("\"{b}\"")).unwrap();
            let one = value_a == value_b;
            prop_assert_eq!(key_a.decoded().unwrap(), value_a.as_str());
            prop_assert_eq!(key_a.escaped(), a.contains('\\'));
            prop_assert_eq!(key_a.same(key_b), Some(one));
            prop_assert_eq!(key_b.same(key_a), Some(one));
            prop_assert_eq!(key_a.is(&value_b), Some(one));
            for longer in [format!("{value_b}a"), format!("{value_b}\u{e9}\u{e9}")] {
                prop_assert_eq!(key_a.is(&longer), Some(value_a == longer));
            }
            prop_assert_eq!(last(&read, &value_a), Some(Some(if one { "2" } else { "1" })));
            prop_assert_eq!(has_key(&read[1..], key_a), Some(one));
            prop_assert_eq!(find(&text, &value_a), Some(Some(if one { "2" } else { "1" })));
            // The checking pass reads the same keys.
            prop_assert_eq!(crate::check::entries_in(&text, Vec::new()), Some(read));
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
                .map(|(k, v)| (k.decoded().unwrap().into_owned(), v.to_owned()))
                .collect();
            prop_assert_eq!(ours, serde_entries(&text));
        }
    }
}
