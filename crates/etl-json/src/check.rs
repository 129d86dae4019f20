//! Reading a record's top-level entries while checking, in the same pass,
//! that the whole value is JSON.
//!
//! The fast paths need a record's top-level entries and the knowledge that
//! the record is valid JSON (a record that is not goes to the stage's own
//! reading, which refuses it with its error). Reading the entries with
//! serde_json checked the value, but cost more than the rest of a small
//! record's work: a `String` per key and a visitor call per value. This
//! reader checks the grammar serde_json accepts and records where each
//! value is, nothing else. Where SSE2 is compiled (x86 and x86_64
//! with `target_feature = "sse2"`), strings and runs of whitespace are
//! crossed a block of 16 bytes at a time ([`crate::block`] finds the
//! quotes, backslashes and control characters, or the end of the run, in
//! it), the last bytes of the text with the scalar code; elsewhere only
//! the scalar code runs (eight bytes at a time in strings, a byte at a
//! time in whitespace), as it did before blocks. The tests hold the pass to the one it replaced (`check/oracle.rs`, the
//! same grammar a byte at a time) on generated text, valid and not.
//!
//! Invariant: what it accepts, serde_json accepts when reading a value (a
//! differential property test holds it to that). It may leave alone what
//! serde_json would accept (`None`: "not decided here"): besides invalid
//! text, a `\u` escape of a UTF-16 surrogate, a number with an exponent of
//! three digits or more, a run of 309 digits, or 10^308 and more (near or
//! past an `f64`, which serde_json's and VRL's readings refuse), and
//! nesting as deep as serde_json's limit of 128 (see [`MAX_DEPTH`]).

use std::ops::Range;

#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
use crate::block;
use crate::scan::{self, Entries, Entry, RawKey};

use scan::MAX_DEPTH;

/// Digits in a row from which a number may be past an `f64`.
const LONG_DIGITS: usize = 309;

/// The entries of the object `text` in written order, in `out` (emptied
/// first), when `text` is a JSON object the fast paths can take.
pub(crate) fn entries_in<'a>(text: &'a str, out: Entries<'a>) -> Option<Entries<'a>> {
    read(text, out, &mut NoKeep)
}

/// Where [`entries_keeping`] keeps the entries of the nested objects it
/// walks.
pub(crate) struct Nested<'a, 'v> {
    /// Objects nested deeper are not kept: the top-level object is at
    /// depth 1, an object that is a top-level value at depth 2.
    pub(crate) max_depth: usize,
    /// The kept objects.
    pub(crate) objects: &'v mut Vec<Object>,
    /// The kept objects' entries, a vector per depth (its slot): objects
    /// of one depth never nest, so each object's entries are together in
    /// its depth's vector as they are read, with no moving.
    pub(crate) entries: &'v mut Vec<Entries<'a>>,
}

/// A nested object whose entries were read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Object {
    /// Where it starts in the record's text.
    pub(crate) at: usize,
    /// Where it ends (just past its closing brace); 0 when not known.
    pub(crate) end: usize,
    /// Which of the entry vectors holds its entries, and where.
    pub(crate) slot: usize,
    pub(crate) entries: Range<usize>,
}

/// The nested objects a keeping read kept of `doc`, looked up by the text
/// of a value of it.
pub(crate) struct Kept<'a, 'v> {
    pub(crate) doc: &'a str,
    pub(crate) objects: &'v [Object],
    pub(crate) entries: &'v [Entries<'a>],
}

impl<'a, 'v> Kept<'a, 'v> {
    /// The entries of the object whose text is `text` (a slice of the
    /// document), when it was kept.
    pub(crate) fn get(&self, text: &str) -> Option<&'v [Entry<'a>]> {
        let start = text.as_ptr().addr().wrapping_sub(self.doc.as_ptr().addr());
        if start.saturating_add(text.len()) > self.doc.len() {
            return None;
        }
        let object = self.objects.iter().find(|o| o.at == start)?;
        self.entries.get(object.slot)?.get(object.entries.clone())
    }

    /// Where the object starting at `at` in the document ends (just past
    /// its closing brace), when it was kept.
    #[cfg(feature = "remap")]
    pub(crate) fn end(&self, at: usize) -> Option<usize> {
        let object = self.objects.iter().find(|o| o.at == at)?;
        (object.end > at).then_some(object.end)
    }
}

/// How many nested objects [`Nested`] keeps per record: past that, the
/// rest are read when asked for (a lookup goes through the kept ones).
const KEPT_OBJECTS: usize = 32;

/// [`entries_in`], also keeping the entries of the nested objects it
/// walks in `nested`, so that reading them later needs no second pass.
pub(crate) fn entries_keeping<'a>(
    text: &'a str,
    out: Entries<'a>,
    mut nested: Nested<'a, '_>,
) -> Option<Entries<'a>> {
    read(text, out, &mut nested)
}

/// What the reading does with nested objects: nothing ([`NoKeep`]), or
/// keep their entries ([`Nested`]). A type parameter, so that the plain
/// reading has no cost of it.
trait Keep<'a> {
    /// An object starts, `depth` containers deep: a mark to give back to
    /// [`Keep::close`], `None` when this one is not kept.
    fn open(&mut self, depth: usize) -> Option<usize>;
    /// An entry of a kept object `depth` containers deep: its key's text
    /// is `text[key]` (quotes included; `escaped` when it has escapes),
    /// its value `text[value]`.
    fn entry(
        &mut self,
        text: &'a str,
        depth: usize,
        key: Range<usize>,
        escaped: bool,
        value: Range<usize>,
    ) -> Option<()>;
    /// The kept object `text[at..end]`, `depth` deep, opened with `mark`,
    /// ends.
    fn close(&mut self, at: usize, end: usize, depth: usize, mark: usize);
}

/// Keeps nothing.
struct NoKeep;

impl Keep<'_> for NoKeep {
    fn open(&mut self, _: usize) -> Option<usize> {
        None
    }

    fn entry(
        &mut self,
        _: &str,
        _: usize,
        _: Range<usize>,
        _: bool,
        _: Range<usize>,
    ) -> Option<()> {
        Some(())
    }

    fn close(&mut self, _: usize, _: usize, _: usize, _: usize) {}
}

impl<'a> Keep<'a> for Nested<'a, '_> {
    #[inline]
    fn open(&mut self, depth: usize) -> Option<usize> {
        if depth > self.max_depth || self.objects.len() >= KEPT_OBJECTS {
            return None;
        }
        if self.entries.len() <= depth {
            self.entries.resize_with(depth + 1, Vec::new);
        }
        Some(self.entries[depth].len())
    }

    #[inline(always)]
    fn entry(
        &mut self,
        text: &'a str,
        depth: usize,
        key: Range<usize>,
        escaped: bool,
        value: Range<usize>,
    ) -> Option<()> {
        let name = self::key(text, key.start, key.end, escaped)?;
        self.entries.get_mut(depth)?.push((name, text.get(value)?));
        Some(())
    }

    fn close(&mut self, at: usize, end: usize, depth: usize, mark: usize) {
        // Objects end inner first: the bound is kept here, where they
        // are counted (their entries, read already, stay unused).
        if self.objects.len() >= KEPT_OBJECTS {
            return;
        }
        let last = self.entries.get(depth).map_or(mark, Vec::len);
        self.objects.push(Object {
            at,
            end,
            slot: depth,
            entries: mark..last,
        });
    }
}

fn read<'a, K: Keep<'a>>(text: &'a str, mut out: Entries<'a>, keep: &mut K) -> Option<Entries<'a>> {
    out.clear();
    let r = &mut Reader { text, keep };
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = string(b, i)?;
        let key = key(text, i, end, escaped)?;
        i = skip_ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let end = value(r, b, start, 1)?;
        out.push((key, text.get(start..end)?));
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return (skip_ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

/// The key whose text (quotes included) is `text[start..end]`, a string
/// [`string`] took (its escapes are ones serde_json decodes), with
/// escapes when `escaped`: not decoded. Without escapes, [`string`]
/// stopped at the first quote after the opening one: none is between.
#[inline(always)]
fn key(text: &str, start: usize, end: usize, escaped: bool) -> Option<RawKey<'_>> {
    if escaped {
        RawKey::with_escapes(text.get(start..end)?)
    } else {
        Some(RawKey::between_quotes(text.get(start + 1..end - 1)?))
    }
}

/// The text being read, and what is done with nested objects.
struct Reader<'a, 'k, K> {
    text: &'a str,
    keep: &'k mut K,
}

/// The index of the first byte from `i` that is not whitespace. Records
/// are mostly written without any: that case costs one comparison.
#[inline(always)]
fn skip_ws(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c <= b' ' => skip_ws_run(b, i),
        _ => i,
    }
}

/// The first byte from `i` that is not whitespace, and where it is: the
/// next token's first byte, read once for the grammar's test and its
/// dispatch.
#[inline(always)]
fn token(b: &[u8], i: usize) -> Option<(usize, u8)> {
    let c = *b.get(i)?;
    if c > b' ' {
        return Some((i, c));
    }
    let i = skip_ws_run(b, i);
    Some((i, *b.get(i)?))
}

/// Whether `c` is JSON whitespace.
#[inline(always)]
fn is_ws(c: Option<&u8>) -> bool {
    matches!(c, Some(b' ' | b'\t' | b'\n' | b'\r'))
}

/// [`skip_ws`] past its first byte: one whitespace byte before a token
/// (`": "`, `", "`) is looked at alone; a longer run (indentation) a
/// block at a time, its last bytes one by one ([`skip_ws_bytes`]).
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
#[inline(never)]
fn skip_ws_run(b: &[u8], mut i: usize) -> usize {
    if !is_ws(b.get(i)) {
        return i;
    }
    if !is_ws(b.get(i + 1)) {
        return i + 1;
    }
    while let Some(bytes) = b.get(i..i + block::BLOCK) {
        let Ok(bytes) = <&[u8; block::BLOCK]>::try_from(bytes) else {
            break;
        };
        let found = block::not_whitespace(bytes);
        if found != 0 {
            return i + found.trailing_zeros() as usize;
        }
        i += block::BLOCK;
    }
    skip_ws_bytes(b, i)
}

/// [`skip_ws`] past its first byte, where SSE2 is not compiled: the byte
/// loop alone, as before blocks.
#[cfg(not(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
)))]
#[inline(never)]
fn skip_ws_run(b: &[u8], i: usize) -> usize {
    skip_ws_bytes(b, i)
}

/// The first byte from `i` that is not whitespace, a byte at a time.
#[inline(always)]
fn skip_ws_bytes(b: &[u8], mut i: usize) -> usize {
    while is_ws(b.get(i)) {
        i += 1;
    }
    i
}

/// The index just past the value starting at `i`, `depth` containers deep.
#[inline(always)]
fn value<'a, K: Keep<'a>>(
    r: &mut Reader<'a, '_, K>,
    b: &[u8],
    i: usize,
    depth: usize,
) -> Option<usize> {
    value_of(r, b, i, *b.get(i)?, depth)
}

/// [`value`], whose first byte `c` was read already.
#[inline(always)]
fn value_of<'a, K: Keep<'a>>(
    r: &mut Reader<'a, '_, K>,
    b: &[u8],
    i: usize,
    c: u8,
    depth: usize,
) -> Option<usize> {
    match c {
        b'"' => string(b, i).map(|(end, _)| end),
        b'{' => object(r, b, i, depth + 1),
        b'[' => array(r, b, i, depth + 1),
        b't' => literal(b, i, b"true"),
        b'f' => literal(b, i, b"false"),
        b'n' => literal(b, i, b"null"),
        b'-' | b'0'..=b'9' => number(b, i),
        _ => None,
    }
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    let end = i + word.len();
    (b.get(i..end)? == word).then_some(end)
}

#[inline(never)]
fn object<'a, K: Keep<'a>>(
    r: &mut Reader<'a, '_, K>,
    b: &[u8],
    at: usize,
    depth: usize,
) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mark = r.keep.open(depth);
    let (mut i, mut c) = token(b, at + 1)?;
    if c != b'}' {
        loop {
            if c != b'"' {
                return None;
            }
            let (end, escaped) = string(b, i)?;
            let name = (i, end, escaped);
            let (colon, after_key) = token(b, end)?;
            if after_key != b':' {
                return None;
            }
            let (start, first) = token(b, colon + 1)?;
            let end = value_of(r, b, start, first, depth)?;
            if mark.is_some() {
                let (from, to, escaped) = name;
                r.keep.entry(r.text, depth, from..to, escaped, start..end)?;
            }
            (i, c) = token(b, end)?;
            match c {
                b',' => (i, c) = token(b, i + 1)?,
                b'}' => break,
                _ => return None,
            }
        }
    }
    if let Some(mark) = mark {
        r.keep.close(at, i + 1, depth, mark);
    }
    Some(i + 1)
}

#[inline(never)]
fn array<'a, K: Keep<'a>>(
    r: &mut Reader<'a, '_, K>,
    b: &[u8],
    i: usize,
    depth: usize,
) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (mut i, mut c) = token(b, i + 1)?;
    if c == b']' {
        return Some(i + 1);
    }
    loop {
        let (after, next) = token(b, value_of(r, b, i, c, depth)?)?;
        match next {
            b',' => (i, c) = token(b, after + 1)?,
            b']' => return Some(after + 1),
            _ => return None,
        }
    }
}

/// The index just past the string starting (with its quote) at `i`, and
/// whether it has escapes. Refuses control characters, unknown escapes and
/// `\u` escapes of surrogates.
#[inline(always)]
fn string(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    loop {
        j = next_special(b, j);
        match *b.get(j)? {
            b'"' => return Some((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                match *b.get(j + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                    b'u' => {
                        let hex = b.get(j + 2..j + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit)
                            || matches!(hex[0], b'd' | b'D')
                                && matches!(hex[1], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
                        {
                            return None;
                        }
                        j += 6;
                    }
                    _ => return None,
                }
            }
            0..=0x1f => return None,
            _ => j += 1,
        }
    }
}

/// The index of the first byte from `j` that is a quote, a backslash or a
/// control character: a block ([`block::BLOCK`] bytes) at a time while
/// none is, then as [`next_special_words`] does.
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
#[inline(always)]
fn next_special(b: &[u8], mut j: usize) -> usize {
    while let Some(bytes) = b.get(j..j + block::BLOCK) {
        let Ok(bytes) = <&[u8; block::BLOCK]>::try_from(bytes) else {
            break;
        };
        let found = block::string_stops(bytes);
        if found != 0 {
            return j + found.trailing_zeros() as usize;
        }
        j += block::BLOCK;
    }
    next_special_words(b, j)
}

/// [`next_special_words`], where SSE2 is not compiled: the word scan
/// alone, as before blocks.
#[cfg(not(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
)))]
#[inline(always)]
fn next_special(b: &[u8], j: usize) -> usize {
    next_special_words(b, j)
}

/// The index of the first byte from `j` that is a quote, a backslash or a
/// control character, eight bytes at a time; or where fewer than eight
/// bytes are left, from which the caller looks at each.
#[inline(always)]
fn next_special_words(b: &[u8], mut j: usize) -> usize {
    while let Some(word) = b.get(j..j + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        let found = special(u64::from_le_bytes(word));
        if found != 0 {
            return j + (found.trailing_zeros() / 8) as usize;
        }
        j += 8;
    }
    j
}

/// The bytes of `word` (little-endian) that are a quote, a backslash or
/// a control character: the classic "has a zero byte" and "has a byte
/// less than" tests, whose lowest flag is exact (borrows only run up).
fn special(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    scan::quote_or_backslash(word) | control
}

/// The index just past the number starting at `i`:
/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, small enough to be an
/// `f64`: no run of [`LONG_DIGITS`] digits, an exponent of at most two
/// digits, and below 10^308 (integer digits plus a positive exponent at
/// most 308: serde_json refuses a number that rounds past `f64::MAX`,
/// about 1.8 x 10^308, so the numbers between are left alone too).
#[inline(always)]
fn number(b: &[u8], i: usize) -> Option<usize> {
    let digits = |from: usize| {
        let mut j = from;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        (j > from && j - from < LONG_DIGITS).then_some(j)
    };
    let mut j = i;
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    let integer = j;
    j = match b.get(j)? {
        b'0' => j + 1,
        b'1'..=b'9' => digits(j)?,
        _ => return None,
    };
    // Digits before the point, leading zero aside: 10^(n - 1) <= value.
    let magnitude = if b[integer] == b'0' { 0 } else { j - integer };
    if b.get(j) == Some(&b'.') {
        j = digits(j + 1)?;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        let negative = b.get(j) == Some(&b'-');
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let end = digits(j)?;
        if end - j >= 3 {
            return None;
        }
        let exponent = b[j..end]
            .iter()
            .fold(0, |e, d| e * 10 + usize::from(d - b'0'));
        if !negative && magnitude + exponent > 308 {
            return None;
        }
        j = end;
    }
    Some(j)
}

#[cfg(test)]
mod oracle;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Whether serde_json reads `text` as a JSON object, as the stages'
    /// own reading does (into a value: numbers in range).
    fn serde_accepts(text: &str) -> bool {
        text.trim_start().starts_with('{')
            && serde_json::from_str::<serde_json::Value>(text).is_ok()
    }

    fn read(text: &str) -> Option<Vec<(String, String)>> {
        entries_in(text, Vec::new()).map(|e| {
            e.into_iter()
                .map(|(k, v)| (k.decoded().unwrap().into_owned(), v.to_owned()))
                .collect()
        })
    }

    #[test]
    fn a_word_is_special_when_any_byte_is() {
        for byte in 0..=255u8 {
            let looked_at = byte == b'"' || byte == b'\\' || byte < 0x20;
            for at in 0..8 {
                let mut word = *b"abcdefgh";
                word[at] = byte;
                let found = special(u64::from_le_bytes(word));
                assert_eq!(found != 0, looked_at, "{byte} at {at}");
                if looked_at {
                    assert_eq!(found.trailing_zeros() / 8, at as u32, "{byte} at {at}");
                }
            }
        }
        // The first of several is the one found.
        for first in 0..8 {
            for second in first + 1..8 {
                for (x, y) in [(b'"', 1u8), (0x1f, b'\\'), (b'\\', b'"')] {
                    let mut word = *b"abcdefgh";
                    (word[first], word[second]) = (x, y);
                    let found = special(u64::from_le_bytes(word));
                    assert_eq!(found.trailing_zeros() / 8, first as u32);
                }
            }
        }
        // Bytes of multi-byte characters are never looked at.
        for w in "Zürich 山田 Renée".as_bytes().windows(8) {
            assert_eq!(special(u64::from_le_bytes(w.try_into().unwrap())), 0);
        }
    }

    /// Holds the string scans and the whitespace skips to the bytes of
    /// `b`, from every start. The string scans ([`next_special`], and the
    /// word scan alone, which is all of it where SSE2 is not compiled)
    /// stop at the first quote, backslash or control byte, or before it
    /// where fewer than eight bytes are left with none of those before
    /// them; the skips ([`skip_ws_run`], and the byte loop alone) at the
    /// first byte that is not whitespace.
    fn scans_stop_where_the_bytes_say(b: &[u8]) -> Result<(), TestCaseError> {
        for from in 0..=b.len() {
            let first = |class: &dyn Fn(u8) -> bool| {
                b[from..]
                    .iter()
                    .position(|&c| class(c))
                    .map_or(b.len(), |n| from + n)
            };
            let stop = first(&|c| c == b'"' || c == b'\\' || c < 0x20);
            for (scan, found) in [
                ("next_special", next_special(b, from)),
                ("next_special_words", next_special_words(b, from)),
            ] {
                prop_assert!(
                    from <= found && found <= stop && (found == stop || b.len() - found < 8),
                    "{} from {}: {}, the first stop is at {}: {:?}",
                    scan,
                    from,
                    found,
                    stop,
                    b
                );
            }
            let token = first(&|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'));
            prop_assert_eq!(skip_ws_run(b, from), token, "from {}: {:?}", from, b);
            prop_assert_eq!(skip_ws_bytes(b, from), token, "from {}: {:?}", from, b);
        }
        Ok(())
    }

    #[test]
    fn the_scans_stop_at_every_byte_they_look_for_at_every_place() {
        for len in 0..=70 {
            for at in 0..=len {
                for byte in [
                    b'"', b'\\', 0, b'\t', b'\n', 0x0b, 0x0c, 0x1f, b' ', 0x7f, 0xc3, b'a',
                ] {
                    for fill in [b'a', b' ', b'\t', b'\n', b'\r'] {
                        let mut b = vec![fill; len];
                        if let Some(c) = b.get_mut(at) {
                            *c = byte;
                        }
                        scans_stop_where_the_bytes_say(&b).unwrap();
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn prop_the_scans_stop_where_the_bytes_say(
            runs in prop::collection::vec(
                (
                    prop_oneof![
                        Just(b'a'), Just(b' '), Just(b'\t'), Just(b'\n'), Just(b'\r'),
                        Just(b'"'), Just(b'\\'), 0u8..0x20, Just(0x7f), 0x80u8..=0xff,
                    ],
                    0usize..40,
                ),
                0..8,
            ),
        ) {
            let b: Vec<u8> = runs.iter().flat_map(|&(c, n)| std::iter::repeat_n(c, n)).collect();
            scans_stop_where_the_bytes_say(&b)?;
        }
    }

    #[test]
    fn reads_the_entries_serde_json_reads() {
        let text = " {\"a\" : [1, {\"b\":\"]}\\\"\\\\\"}, true, null, -0.5e-3] ,\"k\\\"ey\\u00e9\":-1.5E+30,\"a\":{ }}\n";
        assert_eq!(
            read(text).unwrap(),
            vec![
                (
                    "a".to_owned(),
                    "[1, {\"b\":\"]}\\\"\\\\\"}, true, null, -0.5e-3]".to_owned()
                ),
                ("k\"eyé".to_owned(), "-1.5E+30".to_owned()),
                ("a".to_owned(), "{ }".to_owned()),
            ]
        );
        assert_eq!(read("{}").unwrap(), vec![]);
    }

    #[test]
    fn refuses_what_serde_json_refuses_and_leaves_what_it_cannot_take() {
        for bad in [
            "",
            "{",
            "[]",
            "1",
            "{}x",
            "{} {}",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":"x"#,
            "{\"a\":\"\t\"}",
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12"}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1 2]}"#,
            r#"{"a":{"b"}}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{a:1}"#,
            r#"{"a":+1}"#,
            r#"{"a":NaN}"#,
        ] {
            assert!(read(bad).is_none(), "{bad:?}");
            assert!(!serde_accepts(bad), "{bad:?} is valid: the list is wrong");
        }
        // Valid, left to the slow path.
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(130), "]".repeat(130));
        for valid in [
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"a":1e308}"#,
            &format!("{{\"a\":{}}}", "9".repeat(400)),
        ] {
            assert!(read(valid).is_none(), "{valid:?}");
        }
        assert!(read(&deep).is_none());
    }

    #[test]
    fn nesting_is_read_exactly_as_deep_as_serde_json_reads_it() {
        // `levels` containers, the record's object the first: objects
        // inside objects, or arrays inside the record.
        let objects =
            |levels: usize| format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels));
        let arrays = |levels: usize| {
            let inner = levels - 1;
            format!("{{\"a\":{}1{}}}", "[".repeat(inner), "]".repeat(inner))
        };
        for levels in [126, 127, 128, 129] {
            for text in [objects(levels), arrays(levels)] {
                assert_eq!(
                    serde_accepts(&text),
                    levels <= 127,
                    "{levels}: the limit moved"
                );
                assert_eq!(read(&text).is_some(), levels <= 127, "{levels} levels");
                // The scanner, for text known to be valid JSON, refuses
                // it too.
                assert_eq!(
                    scan::entries(&text).is_some(),
                    levels <= 127,
                    "{levels} levels"
                );
            }
        }
    }

    #[test]
    fn the_kept_objects_stay_within_their_bound() {
        let inner: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{{\"v\":{i}}}")).collect();
        let doc = format!("{{\"x\":{{{}}}}}", inner.join(","));
        let (mut objects, mut entries) = (Vec::new(), Vec::new());
        let nested = Nested {
            max_depth: usize::MAX,
            objects: &mut objects,
            entries: &mut entries,
        };
        assert!(entries_keeping(&doc, Vec::new(), nested).is_some());
        assert_eq!(objects.len(), KEPT_OBJECTS);
        // The first ones to end are kept, and read back as they are.
        let kept = Kept {
            doc: &doc,
            objects: &objects,
            entries: &entries,
        };
        let k0 = doc.find("{\"v\":0}").unwrap();
        assert_eq!(
            kept.get(&doc[k0..]).unwrap(),
            &[(RawKey::unescaped("v").unwrap(), "0")]
        );
        let k39 = doc.find("{\"v\":39}").unwrap();
        assert!(kept.get(&doc[k39..]).is_none());
    }

    #[test]
    fn numbers_past_an_f64_are_left_alone_whatever_their_spelling() {
        let zeros = |n: usize| "0".repeat(n);
        // serde_json reads each of these as a number out of range.
        for past in [
            format!("1{}e99", zeros(210)),
            format!("-1{}e99", zeros(210)),
            format!("9{}.5e9", zeros(299)),
            format!("1{}E+10", zeros(300)),
            format!("1{}e1", zeros(308)),
        ] {
            let text = format!("{{\"a\":{past}}}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_err(),
                "{past}"
            );
            assert!(read(&text).is_none(), "{past}");
        }
        // Near it, in range: read, or left alone; never accepted wrongly.
        for near in [
            format!("1{}e99", zeros(200)),
            format!("1{}e-99", zeros(300)),
            format!("0.{}1e99", zeros(300)),
            format!("1{}", zeros(307)),
            "1e99".to_owned(),
        ] {
            let text = format!("{{\"a\":{near}}}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                "{near}"
            );
            if let Some(entries) = read(&text) {
                assert_eq!(entries, vec![("a".to_owned(), near.clone())]);
            }
        }
        assert!(read(&format!("{{\"a\":1{}e-99}}", zeros(300))).is_some());
    }

    /// Whether `text` has a number with an exponent of 3 digits or more.
    fn big_exponent(text: &str) -> bool {
        let b = text.as_bytes();
        b.iter().enumerate().any(|(i, c)| {
            matches!(c, b'e' | b'E')
                && i > 0
                && b[i - 1].is_ascii_digit()
                && b[i + 1..]
                    .iter()
                    .skip_while(|c| matches!(c, b'+' | b'-'))
                    .take_while(|c| c.is_ascii_digit())
                    .count()
                    >= 3
        })
    }

    /// Text that is often JSON and often almost JSON.
    fn almost_json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("fals".to_owned()),
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{0,2})?([eE][+-]?[0-9]{0,3})?",
            "\"([a-z\u{e9}\\\\\"/\t]|\\\\[nu\"bx]|\\\\u[0-9a-fA-F]{4}){0,6}\"",
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("\"[a-c\\\\\"]{0,2}\"", inner, "[ ,:]?"), 0..4).prop_map(
                    |v| {
                        let fields: Vec<String> = v
                            .into_iter()
                            .map(|(k, v, sep)| format!("{k}:{v}{sep}"))
                            .collect();
                        format!("{{{}}}", fields.join(","))
                    }
                ),
            ]
        })
    }

    // The case count is the run's (`PROPTEST_CASES`, which `cargo xtask
    // prop` sets), like every other property's.
    proptest! {
        #[test]
        fn prop_accepts_only_what_serde_json_accepts(text in almost_json(), cut in 0usize..64) {
            let object = format!("{{\"x\":{text}}}");
            let cut_short = object.get(..object.len().saturating_sub(cut)).unwrap_or("");
            if let Some(ours) = read(&object) {
                prop_assert!(serde_accepts(&object), "accepted {:?}", object);
                prop_assert_eq!(ours, vec![("x".to_owned(), text.clone())]);
            }
            for t in [text.as_str(), cut_short] {
                if read(t).is_some() {
                    prop_assert!(serde_accepts(t), "accepted {:?}", t);
                }
            }
        }

        #[test]
        fn prop_kept_objects_are_the_ones_the_scanner_reads(text in almost_json()) {
            let doc = format!("{{\"x\":{text},\"y\":[{text}]}}");
            let (mut objects, mut entries) = (Vec::new(), Vec::new());
            let nested = Nested {
                max_depth: usize::MAX,
                objects: &mut objects,
                entries: &mut entries,
            };
            if entries_keeping(&doc, Vec::new(), nested).is_some() {
                // Kept to depth 2: only `x`'s value, if it is an object.
                let (mut shallow, mut kept) = (Vec::new(), Vec::new());
                let nested = Nested {
                    max_depth: 2,
                    objects: &mut shallow,
                    entries: &mut kept,
                };
                prop_assert!(entries_keeping(&doc, Vec::new(), nested).is_some());
                let x_is_object = text.trim_start().starts_with('{');
                let at = doc.find(':').unwrap() + 1 + (text.len() - text.trim_start().len());
                prop_assert_eq!(shallow.iter().map(|o| o.at).collect::<Vec<_>>(), if x_is_object { vec![at] } else { vec![] });
                if let [object] = &shallow[..] {
                    let scanned = scan::entries(&doc[at..]).unwrap();
                    prop_assert_eq!(object.slot, 2);
                    prop_assert_eq!(&kept[2][object.entries.clone()], &scanned[..]);
                }
                // Every kept object reads back as the scanner reads it,
                // looked up by its text.
                let kept = Kept { doc: &doc, objects: &objects, entries: &entries };
                for object in &objects {
                    prop_assert_eq!(doc.as_bytes()[object.at], b'{');
                    // It ends just past its own closing brace: the text
                    // between is the object, whole.
                    let whole = &doc[object.at..object.end];
                    prop_assert!(whole.ends_with('}'), "{}", whole);
                    prop_assert!(serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(whole).is_ok(), "{}", whole);
                    let scanned = scan::entries(&doc[object.at..]).unwrap();
                    prop_assert_eq!(&entries[object.slot][object.entries.clone()], &scanned[..]);
                    prop_assert_eq!(kept.get(&doc[object.at..]).unwrap(), &scanned[..]);
                }
                // Every nested object is kept, up to the limit.
                fn objects_in(v: &serde_json::Value) -> usize {
                    match v {
                        serde_json::Value::Object(m) => 1 + m.values().map(objects_in).sum::<usize>(),
                        serde_json::Value::Array(a) => a.iter().map(objects_in).sum(),
                        _ => 0,
                    }
                }
                let value: serde_json::Value = serde_json::from_str(&doc).unwrap();
                let nested = objects_in(&value) - 1;
                // serde_json's map keeps one of duplicate keys; the text
                // has at least as many objects as it shows.
                prop_assert!(objects.len() >= nested.min(KEPT_OBJECTS));
                prop_assert!(objects.len() <= KEPT_OBJECTS);
            }
        }

        #[test]
        fn prop_reads_every_object_serde_json_writes(value in almost_json()) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&value) {
                let text = serde_json::to_string(&serde_json::json!({"x": v, "y": [v]})).unwrap();
                let left_alone = text.contains("\\ud") || text.contains("\\uD") || big_exponent(&text);
                prop_assert!(read(&text).is_some() || left_alone, "refused {:?}", text);
            }
        }
    }

    /// Holds the checking pass to the one it replaced ([`oracle`]) on
    /// `text`: the same verdict, the same top-level entries, and, kept
    /// to depth 2 and to any depth, the same nested objects.
    fn same_as_before(text: &str) -> Result<(), TestCaseError> {
        prop_assert_eq!(
            entries_in(text, Vec::new()),
            oracle::entries_in(text, Vec::new()),
            "{:?}",
            text
        );
        for max_depth in [2, usize::MAX] {
            let (mut objects, mut entries) = (Vec::new(), Vec::new());
            let nested = Nested {
                max_depth,
                objects: &mut objects,
                entries: &mut entries,
            };
            let top = entries_keeping(text, Vec::new(), nested);
            let (mut was_objects, mut was_entries) = (Vec::new(), Vec::new());
            let nested = Nested {
                max_depth,
                objects: &mut was_objects,
                entries: &mut was_entries,
            };
            let was = oracle::entries_keeping(text, Vec::new(), nested);
            prop_assert_eq!(top, was, "{:?}", text);
            prop_assert_eq!(objects, was_objects, "{:?}", text);
            prop_assert_eq!(entries, was_entries, "{:?}", text);
        }
        Ok(())
    }

    /// A string's content: plain runs of every length, every escape,
    /// non-ASCII characters; now and then what a string cannot hold
    /// (surrogate, short and unknown escapes, a quote or a backslash
    /// alone, control bytes).
    fn string_body() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            8 => "[a-zA-Z0-9 ,:{}\\[\\]]{0,40}",
            2 => "[a-z]{60,140}",
            4 => "\\\\[\"\\\\/bfnrt]",
            2 => "\\\\u[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}",
            4 => "[\u{e9}\u{5c71}\u{1f600}\u{2019}\u{80}-\u{ff}\u{7f}]{1,4}",
            1 => prop_oneof![
                "\\\\u[dD][89abAB][0-9a-fA-F]{2}",
                "\\\\u[0-9a-fA-F]{0,3}",
                "\\\\[^\"\\\\/bfnrtu]",
                Just("\\".to_owned()),
                Just("\"".to_owned()),
                "[\u{0}-\u{1f}]",
            ],
        ];
        prop::collection::vec(piece, 0..6).prop_map(|p| p.concat())
    }

    /// A value: strings of [`string_body`], numbers, literals,
    /// containers, with whitespace around; now and then a number or a
    /// literal that is not one.
    fn value_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            8 => string_body().prop_map(|s| format!("\"{s}\"")),
            4 => "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            3 => "(true|false|null)",
            1 => "-?(0[0-9]|[0-9]{1,3}\\.|[0-9]{1,3}[eE][+-]?[0-9]{0,4}|tru|nul|fals|truex|\\+1|NaN)",
        ];
        // Short runs, long runs of spaces (indentation), and long runs
        // of every whitespace byte mixed, across a block and more.
        let ws = prop_oneof!["[ \t\r\n]{0,2}", "[ ]{0,70}", "[ \t\r\n]{16,40}"];
        let leaf = (ws.clone(), leaf, ws).prop_map(|(a, v, b)| format!("{a}{v}{b}"));
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                (prop::collection::vec(inner.clone(), 0..6), "[ \n]{0,2}")
                    .prop_map(|(v, ws)| format!("[{ws}{}]", v.join(","))),
                (
                    prop::collection::vec((string_body(), "[ \t]{0,2}", inner), 0..6),
                    "[ \n]{0,2}",
                )
                    .prop_map(|(v, ws)| {
                        let fields: Vec<String> = v
                            .into_iter()
                            .map(|(k, sep, v)| format!("\"{k}\"{sep}:{v}"))
                            .collect();
                        format!("{{{ws}{}}}", fields.join(","))
                    }),
            ]
        })
    }

    /// Cuts `text` to at most `len` bytes, at a character boundary.
    fn cut(text: &str, len: usize) -> &str {
        let mut len = len.min(text.len());
        while !text.is_char_boundary(len) {
            len -= 1;
        }
        &text[..len]
    }

    #[test]
    fn strings_of_every_length_at_every_place_in_a_block_read_as_before() {
        // A string whose content is `len` plain bytes, then one byte of
        // each kind the scan stops at (or none), starting at places
        // around a block's and a word's size; and the same text cut
        // short before its end.
        for len in 0..=130 {
            for pad in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64] {
                for stop in [
                    "", "\\n", "\\u00e9", "\\ud800", "\\x", "\t", "\u{1f}", "\"", "\\", "é",
                ] {
                    let text = format!(
                        "{{\"k\":{}\"{}{stop}{}\"}}",
                        " ".repeat(pad),
                        "a".repeat(len),
                        "b".repeat(len % 7)
                    );
                    same_as_before(&text).unwrap();
                    for short in [1, 2, 3, 17, 65] {
                        same_as_before(cut(&text, text.len().saturating_sub(short))).unwrap();
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn prop_the_checking_pass_reads_as_the_one_it_replaced(
            value in value_text(),
            pad in 0usize..=64,
            second in value_text(),
            len in 0usize..=130,
            at in any::<prop::sample::Index>(),
            byte in prop_oneof![
                Just('"'), Just('\\'), Just('\u{1}'), Just(' '), Just('}'), Just(','), Just('é'),
                // Control bytes at both ends of the range, the two just
                // past whitespace's, a tab (whitespace outside strings),
                // and DEL (not a control byte to JSON).
                Just('\u{0}'), Just('\u{b}'), Just('\u{c}'), Just('\t'), Just('\u{7f}'),
            ],
        ) {
            let text = format!("{}{{\"x\":{value},\"y\":{second}}}", " ".repeat(pad));
            same_as_before(&text)?;
            // Records of the lengths around every multiple of a block.
            same_as_before(cut(&text, len))?;
            same_as_before(cut(&text, text.len().saturating_sub(len)))?;
            // One byte more, anywhere.
            let mut changed = text.clone();
            let mut place = at.index(changed.len() + 1);
            while !changed.is_char_boundary(place) {
                place -= 1;
            }
            changed.insert(place, byte);
            same_as_before(&changed)?;
            // Each value as a record of its own, when it is an object.
            same_as_before(&value)?;
        }
    }
}
