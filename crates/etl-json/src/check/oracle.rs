//! The checking pass as it was before it classified blocks of text
//! ([`crate::block`]): a byte (or, in strings, eight bytes) at a time.
//! Kept for the tests only, as the oracle the block-classifying pass is
//! held to: both must take and refuse the same texts and find the same
//! entries and objects.

use super::{Entries, Keep, LONG_DIGITS, Nested, NoKeep, Reader, key};
use crate::scan::{self, MAX_DEPTH};

/// [`super::entries_in`], as it was.
pub(super) fn entries_in<'a>(text: &'a str, out: Entries<'a>) -> Option<Entries<'a>> {
    read(text, out, &mut NoKeep)
}

/// [`super::entries_keeping`], as it was.
pub(super) fn entries_keeping<'a>(
    text: &'a str,
    out: Entries<'a>,
    mut nested: Nested<'a, '_>,
) -> Option<Entries<'a>> {
    read(text, out, &mut nested)
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

/// The index of the first byte from `i` that is not whitespace. Records
/// are mostly written without any: that case costs one comparison.
#[inline(always)]
fn skip_ws(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c <= b' ' => skip_ws_run(b, i),
        _ => i,
    }
}

#[inline(never)]
fn skip_ws_run(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
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
    match *b.get(i)? {
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
    let mut i = skip_ws(b, at + 1);
    if b.get(i) != Some(&b'}') {
        loop {
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let (end, escaped) = string(b, i)?;
            let name = (i, end, escaped);
            i = skip_ws(b, end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            let start = skip_ws(b, i + 1);
            let end = value(r, b, start, depth)?;
            if mark.is_some() {
                let (from, to, escaped) = name;
                r.keep.entry(r.text, depth, from..to, escaped, start..end)?;
            }
            i = skip_ws(b, end);
            match b.get(i)? {
                b',' => i = skip_ws(b, i + 1),
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
    let mut i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        i = skip_ws(b, value(r, b, i, depth)?);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => return Some(i + 1),
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
        // Eight bytes at a time while none is one to look at.
        while let Some(word) = b.get(j..j + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            let found = special(u64::from_le_bytes(word));
            if found != 0 {
                j += (found.trailing_zeros() / 8) as usize;
                break;
            }
            j += 8;
        }
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
