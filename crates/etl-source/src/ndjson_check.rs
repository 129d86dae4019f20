//! A quick check that an NDJSON line is one JSON value, ahead of
//! serde_json's.
//!
//! [`check_line`] answers "surely one JSON value" for the shapes lines
//! have (objects, arrays, strings with the usual escapes, numbers,
//! literals, JSON whitespace) in one pass over the bytes, and "not sure"
//! for anything else; only a line it is not sure of goes to
//! `serde_json::from_slice::<IgnoredAny>`, which decides it and words the
//! reason of a dead letter. The invariant: it never says "surely" of a
//! line serde_json's `IgnoredAny` check refuses. It also tells whether
//! every byte of the line is ASCII, which makes the line's UTF-8 check
//! needless. The tests beside it, and the `ndjson_line` fuzz target in
//! `fuzz/` on any bytes (through the `fuzzing` feature), hold it to
//! serde_json.
//!
//! What that check accepts (serde_json's `Deserializer::ignore_value` and
//! `end`): RFC 8259's grammar, with whitespace `' '`, `\t`, `\n`, `\r`
//! only; strings without a raw byte below 0x20, escapes `\" \\ \/ \b \f
//! \n \r \t` and `\u` with four hex digits, whatever code unit they name
//! (a lone surrogate included); numbers `-?(0|[1-9][0-9]*)(.[0-9]+)?
//! ([eE][+-]?[0-9]+)?` of any length; nesting of any depth (it keeps its
//! own stack, without the recursion limit of a typed value); nothing but
//! whitespace after the value. What is rare is left to serde_json rather
//! than copied: a `\u` escape of a surrogate that is not the first half
//! of a high-then-low pair, and nesting deeper than
//! [`MAX_DEPTH`].

/// The deepest nesting answered here; deeper lines go to serde_json.
const MAX_DEPTH: u32 = 64;

/// Bytes that end a run of plain string content: the closing quote, an
/// escape, or a control byte (which serde_json refuses raw in a string).
const STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// What [`check_line`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Surely one JSON value, and every byte ASCII (so UTF-8 too).
    AsciiValue,
    /// Surely one JSON value, once the line is known to be UTF-8 (a
    /// string holds bytes above 0x7F).
    Value,
    /// Not sure, never "invalid": serde_json decides.
    NotSure,
}

/// Whether `line` is surely one JSON value, as serde_json's `IgnoredAny`
/// check would find it, and whether it is all ASCII.
pub(crate) fn check_line(line: &[u8]) -> Verdict {
    // Outside strings only ASCII is taken, so the strings' bytes, ORed
    // together here, say whether the line is ASCII.
    let mut high = 0u64;
    match check(line, &mut high) {
        None => Verdict::NotSure,
        Some(()) if high & (LANES << 7) == 0 => Verdict::AsciiValue,
        Some(()) => Verdict::Value,
    }
}

/// The check, with `None` for "not sure" so that `?` leaves early;
/// `high` gathers the strings' bytes.
fn check(b: &[u8], high: &mut u64) -> Option<()> {
    // One bit a level of nesting, 1 for an object, 0 for an array.
    let mut stack: u64 = 0;
    let mut depth: u32 = 0;
    let mut i = whitespace_end(b, 0);
    loop {
        // A value starts at `i`.
        i = match *b.get(i)? {
            b'"' => string_end(b, i + 1, high)?,
            b'-' | b'0'..=b'9' => number_end(b, i)?,
            b't' => literal_end(b, i, b"true")?,
            b'f' => literal_end(b, i, b"false")?,
            b'n' => literal_end(b, i, b"null")?,
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                let j = whitespace_end(b, i + 1);
                if b.get(j) == Some(&close) {
                    j + 1
                } else {
                    if depth == MAX_DEPTH {
                        return None;
                    }
                    depth += 1;
                    stack = stack << 1 | u64::from(open == b'{');
                    i = if open == b'{' {
                        key_end(b, j, high)?
                    } else {
                        j
                    };
                    continue;
                }
            }
            _ => return None,
        };
        // A value ended at `i`: close what it ends, up to the next one.
        loop {
            i = whitespace_end(b, i);
            if depth == 0 {
                return (i == b.len()).then_some(());
            }
            let in_object = stack & 1 == 1;
            match *b.get(i)? {
                b',' => {
                    let j = whitespace_end(b, i + 1);
                    i = if in_object { key_end(b, j, high)? } else { j };
                    break;
                }
                b'}' if in_object => {}
                b']' if !in_object => {}
                _ => return None,
            }
            i += 1;
            depth -= 1;
            stack >>= 1;
        }
    }
}

/// Past a key and its colon, and the whitespace after it: `i` is where
/// the key's opening quote must be.
#[inline(always)]
fn key_end(b: &[u8], i: usize, high: &mut u64) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let i = whitespace_end(b, string_end(b, i + 1, high)?);
    if b.get(i) != Some(&b':') {
        return None;
    }
    Some(whitespace_end(b, i + 1))
}

/// The first byte at or after `i` that is not JSON whitespace.
#[inline]
fn whitespace_end(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// Past the closing quote of a string whose content starts at `i`; its
/// bytes are ORed into `high`.
#[inline(always)]
fn string_end(b: &[u8], mut i: usize, high: &mut u64) -> Option<usize> {
    loop {
        i = plain_run_end(b, i, high)?;
        match b[i] {
            b'"' => return Some(i + 1),
            b'\\' => i = escape_end(b, i + 1)?,
            // A raw control byte.
            _ => return None,
        }
    }
}

/// Eight bytes of 0x01: a byte's value in every lane of a word.
const LANES: u64 = u64::MAX / 0xFF;

/// The first byte at or after `i` that ends a run of plain string
/// content (a quote, a backslash or a control byte), `None` if the line
/// ends first. Eight bytes at a time while eight are left: strings are
/// most of a line's bytes. Every byte crossed is ORed into `high` (some
/// after the stop too: they are the line's all the same).
#[inline(always)]
fn plain_run_end(b: &[u8], mut i: usize, high: &mut u64) -> Option<usize> {
    while let Some(&word) = b.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        let word = u64::from_le_bytes(word);
        *high |= word;
        // A lane's high bit is set where its byte is below 0x20, a quote
        // or a backslash. A borrow can set a lane above a true one, never
        // below it, so the lowest set lane is the first such byte.
        let quote = word ^ (LANES * u64::from(b'"'));
        let backslash = word ^ (LANES * u64::from(b'\\'));
        let stops = (word.wrapping_sub(LANES * 0x20) & !word
            | quote.wrapping_sub(LANES) & !quote
            | backslash.wrapping_sub(LANES) & !backslash)
            & (LANES << 7);
        if stops != 0 {
            return Some(i + (stops.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    let rest = b.get(i..)?;
    let run = rest.iter().position(|&c| {
        *high |= u64::from(c);
        STRING_STOP[usize::from(c)]
    })?;
    Some(i + run)
}

/// Past an escape whose letter is at `i` (just after the backslash).
#[cold]
fn escape_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(i + 1),
        b'u' => match hex_unit(b, i + 1)? {
            // A high surrogate answered for only as the first half of a
            // pair (what writers escaping everything past ASCII write);
            // a lone one is rare, and left to serde_json.
            0xD800..=0xDBFF => {
                if b.get(i + 5..i + 7)? != b"\\u" {
                    return None;
                }
                matches!(hex_unit(b, i + 7)?, 0xDC00..=0xDFFF).then_some(i + 11)
            }
            0xDC00..=0xDFFF => None,
            _ => Some(i + 5),
        },
        _ => None,
    }
}

/// The code unit of the four hex digits at `i` (after a `\\u`).
fn hex_unit(b: &[u8], i: usize) -> Option<u32> {
    let mut unit = 0u32;
    for &h in b.get(i..i + 4)? {
        unit = unit << 4 | char::from(h).to_digit(16)?;
    }
    Some(unit)
}

/// Past a number starting at `i` (at its sign or first digit).
fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match *b.get(i)? {
        // One leading zero only: a digit after it ends the number, and
        // the check after the value refuses it.
        b'0' => i += 1,
        b'1'..=b'9' => i = digits_end(b, i + 1),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        let j = digits_end(b, i + 1);
        if j == i + 1 {
            return None;
        }
        i = j;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let j = digits_end(b, i);
        if j == i {
            return None;
        }
        i = j;
    }
    Some(i)
}

/// The first byte at or after `i` that is not an ASCII digit, eight
/// bytes at a time while eight are left (a timestamp has 13).
#[inline(always)]
fn digits_end(b: &[u8], mut i: usize) -> usize {
    while let Some(&word) = b.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        // A digit's lane is 0..=9 once 0x30 is taken off; 0x76 more sets
        // the high bit of any lane above 9 (a carry out of a lane at or
        // above 0x8A only reaches lanes above a true one).
        let lanes = u64::from_le_bytes(word) ^ (LANES * u64::from(b'0'));
        let others = (lanes.wrapping_add(LANES * 0x76) | lanes) & (LANES << 7);
        if others != 0 {
            return i + (others.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// Past `word` (`true`, `false`, `null`) if it is at `i`.
#[inline]
fn literal_end(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    let end = i + word.len();
    (b.get(i..end)? == word).then_some(end)
}

#[cfg(test)]
mod tests;
