//! A record's fit to a declared schema, judged in one pass over its bytes
//! without building a [`Value`]: the check a sink's own encoder makes of
//! every record before the write, which reads the record's [`Row`] on the
//! way.
//!
//! It only ever says "fits" where [`RowSchema::check`] would, and the row
//! it reads is the one [`RowSchema::row_of`] makes of the record's
//! `Value`. A record it is not sure of (a wrong type, a null or missing
//! value for a column that is not nullable, a key given twice on the way
//! to a column, a path through an array, a number past `i64`/`u64` or
//! outside the floats it reads exactly, a lone surrogate, nesting deeper
//! than [`DEEPEST`], bytes that are not JSON or not UTF-8) is left to the
//! check over `Value`, which also words the reason.
//!
//! The reader is written by hand over the bytes: keys are matched against
//! the [`Trie`] of the columns' paths, scalars are parsed straight into
//! their cells, and a string is copied once, unescaped only when it holds
//! a backslash. It follows the grammar and the limits of serde_json's
//! parse into a `Value`, which is what decides a record it is not sure of.

use serde_json::Value;

use super::{Arena, Cell, Column, ColumnType, RowSchema, days_of, millis_micros, rfc3339_micros};

/// The columns of one object (the record, or a struct's value), by the
/// path segments that lead to them.
#[derive(Clone, Debug, Default)]
pub(super) struct Trie {
    entries: Vec<(String, Slot)>,
}

#[derive(Clone, Debug)]
enum Slot {
    /// The value of this key is the column's, by its index.
    Column(usize),
    /// The value of this key is an object holding columns further down.
    Inner(Trie),
}

/// The most columns, and the most keys of one object, the one-pass check
/// takes (its bookkeeping is a bit mask).
const MOST: usize = 64;

/// The deepest nesting of arrays and objects (the record's own object
/// counting one) the reader follows; deeper is left to the `Value` parse,
/// which refuses 128 levels.
pub(super) const DEEPEST: usize = 100;

impl Trie {
    /// The trie of `columns`' paths; `None` when one path leads through
    /// another column's value, two columns read one field, or there are
    /// too many to track.
    pub(super) fn of(columns: &[Column]) -> Option<Trie> {
        if columns.len() > MOST {
            return None;
        }
        let mut root = Trie::default();
        for (i, column) in columns.iter().enumerate() {
            let (last, inner) = column.path.split_last()?;
            let mut at = &mut root;
            for segment in inner {
                let k = match at.entries.iter().position(|(s, _)| s == segment) {
                    Some(k) => k,
                    None => {
                        at.entries
                            .push((segment.clone(), Slot::Inner(Trie::default())));
                        at.entries.len() - 1
                    }
                };
                at = match &mut at.entries.get_mut(k)?.1 {
                    Slot::Inner(trie) => trie,
                    Slot::Column(_) => return None,
                };
            }
            if at.entries.iter().any(|(s, _)| s == last) {
                return None;
            }
            at.entries.push((last.clone(), Slot::Column(i)));
        }
        root.fits_mask().then_some(root)
    }

    fn fits_mask(&self) -> bool {
        self.entries.len() <= MOST
            && self.entries.iter().all(|(_, slot)| match slot {
                Slot::Column(_) => true,
                Slot::Inner(trie) => trie.fits_mask(),
            })
    }

    /// The index of the entry named `key`, tried at `guess` first
    /// (records of one source mostly give their keys in one order).
    fn find(&self, key: &[u8], guess: usize) -> Option<usize> {
        if let Some((s, _)) = self.entries.get(guess)
            && s.as_bytes() == key
        {
            return Some(guess);
        }
        self.entries.iter().position(|(s, _)| s.as_bytes() == key)
    }
}

impl RowSchema {
    /// Whether `bytes`, a record's value, surely fits: `true` only where
    /// [`check`](Self::check) of its [`Value`] says it does. `false`
    /// says nothing: ask `check`.
    pub(crate) fn surely_fits(&self, bytes: &[u8]) -> bool {
        self.read_into(bytes, &mut Arena::default(), &mut Vec::new())
            .is_some()
    }

    /// The [`Row`] of `bytes` when they surely fit (see
    /// [`surely_fits`](Self::surely_fits)): the row
    /// [`row_of`](Self::row_of) makes of their [`Value`]. `None` says
    /// nothing: read the `Value`, check it, and take its row.
    #[cfg(test)]
    pub(crate) fn read_row(&self, bytes: &[u8]) -> Option<super::Row> {
        let mut arena = Arena::default();
        let start = self.read_into(bytes, &mut arena, &mut Vec::new())?;
        Some(super::Row::new(
            std::sync::Arc::new(arena),
            start,
            self.columns.len(),
        ))
    }

    /// [`read_row`](Self::read_row) into `arena`: the index of the row's
    /// first cell, or `None` with `arena` as it was. `unescaped` is the
    /// reader's room for strings that hold escapes.
    pub(super) fn read_into(
        &self,
        bytes: &[u8],
        arena: &mut Arena,
        unescaped: &mut Vec<u8>,
    ) -> Option<usize> {
        let trie = self.trie.as_ref()?;
        if self.strict {
            return None;
        }
        let mark = arena.mark();
        let start = arena.start_row(self.columns.len());
        let mut reader = Reader::new(bytes, unescaped);
        let read = reader.record(trie, &self.columns, arena, start);
        if read.is_none() {
            arena.roll_back(mark);
        }
        read.map(|()| start)
    }
}

/// Whether every one of `columns` not marked in `seen` may be null; else
/// not sure (the check over `Value` names the one missing).
fn missing_ones_nullable(columns: &[Column], seen: u64) -> Option<()> {
    columns
        .iter()
        .enumerate()
        .all(|(i, c)| seen & (1 << i) != 0 || c.nullable)
        .then_some(())
}

/// A JSON number as serde_json's parse reads it.
#[derive(Clone, Copy, Debug)]
enum Number {
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Signed(i64),
    /// A number with a fraction or an exponent, `-0`, or a negative
    /// integer below `i64::MIN`.
    Float(f64),
}

impl Number {
    /// As `serde_json::Number::as_i64`.
    fn as_i64(self) -> Option<i64> {
        match self {
            Number::Unsigned(n) => i64::try_from(n).ok(),
            Number::Signed(n) => Some(n),
            Number::Float(_) => None,
        }
    }

    /// As `serde_json::Number::as_f64`.
    #[allow(clippy::cast_precision_loss)] // As serde_json converts.
    fn as_f64(self) -> f64 {
        match self {
            Number::Unsigned(n) => n as f64,
            Number::Signed(n) => n as f64,
            Number::Float(f) => f,
        }
    }
}

/// Powers of ten a double holds exactly: a significand below 2^53 times
/// or over one of them is one correctly rounded operation on exact
/// operands, the double nearest the decimal's value, which is what
/// serde_json computes (with or without its `float_roundtrip` feature)
/// and what `str::parse::<f64>` gives.
const EXACT_POWERS: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The largest significand a double holds exactly, plus one.
const EXACT_SIGNIFICAND: u64 = 1 << 53;

/// Bytes a string's scan stops at: its end, an escape, the control
/// characters JSON does not allow in a string, and bytes past ASCII
/// (whose text is then checked as UTF-8).
const STOPS: [bool; 256] = {
    let mut stops = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        stops[b] = true;
        b += 1;
    }
    b = 0x80;
    while b < 0x100 {
        stops[b] = true;
        b += 1;
    }
    stops[b'"' as usize] = true;
    stops[b'\\' as usize] = true;
    stops
};

/// One record's bytes, read forward. Every method returns `None` where
/// the reader is not sure, and the record is then left to the `Value`
/// parse.
struct Reader<'b, 's> {
    bytes: &'b [u8],
    at: usize,
    /// Arrays and objects open.
    depth: usize,
    /// The text of a string that holds an escape.
    scratch: &'s mut Vec<u8>,
}

impl<'b, 's> Reader<'b, 's> {
    fn new(bytes: &'b [u8], scratch: &'s mut Vec<u8>) -> Self {
        Reader {
            bytes,
            at: 0,
            depth: 0,
            scratch,
        }
    }

    /// The whole record: an object holding `columns`, whose cells go to
    /// the row started at `start` in `arena`, and nothing after it.
    fn record(
        &mut self,
        trie: &Trie,
        columns: &[Column],
        arena: &mut Arena,
        start: usize,
    ) -> Option<()> {
        self.space();
        let mut seen = 0u64;
        self.object(trie, columns, arena, start, &mut seen)?;
        missing_ones_nullable(columns, seen)?;
        self.space();
        self.at_end().then_some(())
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// Past JSON's whitespace (only the four kinds serde_json skips).
    fn space(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Past `byte`, which must be next.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Past `word` (`true`, `false`, `null`), which must be next.
    fn word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// Into an array or an object, at its opening byte.
    fn open(&mut self, byte: u8) -> Option<()> {
        self.eat(byte)?;
        self.depth += 1;
        (self.depth <= DEEPEST).then_some(())
    }

    /// After an item or a field: past the comma and the whitespace after
    /// it (`true`: another follows) or past `close` (`false`).
    fn more(&mut self, close: u8) -> Option<bool> {
        self.space();
        match self.peek()? {
            b',' => {
                self.at += 1;
                self.space();
                Some(true)
            }
            b if b == close => {
                self.at += 1;
                self.depth -= 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// Just inside an array or an object: past the whitespace, and past
    /// `close` if it is empty (`false`).
    fn any(&mut self, close: u8) -> Option<bool> {
        self.space();
        if self.peek()? == close {
            self.at += 1;
            self.depth -= 1;
            Some(false)
        } else {
            Some(true)
        }
    }

    /// A key (at its opening quote) and the colon after it; the index of
    /// its entry in `trie`, if any, tried at `guess` first.
    fn key(&mut self, trie: Option<&Trie>, guess: usize) -> Option<Option<usize>> {
        let key = self.string()?;
        let k = trie.and_then(|trie| trie.find(key, guess));
        self.space();
        self.eat(b':')?;
        self.space();
        Some(k)
    }

    /// The fields of an object (at its `{`) on the way to `columns`, as
    /// `trie` leads to them: each column found is read into its cell of
    /// the row at `start` in `arena` and marked in `seen`; other fields
    /// are read through.
    fn object(
        &mut self,
        trie: &Trie,
        columns: &[Column],
        arena: &mut Arena,
        start: usize,
        seen: &mut u64,
    ) -> Option<()> {
        self.open(b'{')?;
        // The entries of this object met so far: a key given twice is
        // left to the check over `Value` (where the last one counts).
        let mut met = 0u64;
        let mut guess = 0;
        let mut more = self.any(b'}')?;
        while more {
            match self.key(Some(trie), guess)? {
                None => self.skip()?,
                Some(k) => {
                    guess = k + 1;
                    if met & (1 << k) != 0 {
                        return None;
                    }
                    met |= 1 << k;
                    match &trie.entries.get(k)?.1 {
                        Slot::Column(i) => {
                            let cell = self.column(columns.get(*i)?, arena)?;
                            arena.set(start + i, cell)?;
                            *seen |= 1 << i;
                        }
                        Slot::Inner(inner) => self.object(inner, columns, arena, start, seen)?,
                    }
                }
            }
            more = self.more(b'}')?;
        }
        Some(())
    }

    /// One column's cell, as [`Column::cell_into`] stores it (its text
    /// and items in `arena`), where [`Column::check`] takes it: a scalar
    /// parsed straight into its cell, a list item by item, a struct's
    /// value read through and then parsed as the `Value` its cell holds.
    fn column(&mut self, column: &Column, arena: &mut Arena) -> Option<Cell> {
        Some(match self.peek()? {
            b'n' => {
                self.word(b"null")?;
                if !column.nullable {
                    return None;
                }
                Cell::Null
            }
            b't' | b'f' if column.kind == ColumnType::Boolean => {
                Cell::Bool(if self.peek()? == b't' {
                    self.word(b"true")?;
                    true
                } else {
                    self.word(b"false")?;
                    false
                })
            }
            b'"' => {
                let kind = column.kind;
                let text = self.string()?;
                match kind {
                    ColumnType::String => arena.push_text(text)?,
                    ColumnType::Timestamp => {
                        Cell::Int(rfc3339_micros(std::str::from_utf8(text).ok()?)?)
                    }
                    ColumnType::Date => {
                        Cell::Int(i64::from(days_of(std::str::from_utf8(text).ok()?)?))
                    }
                    _ => return None,
                }
            }
            b'[' => {
                let (ColumnType::List, Some(item)) = (column.kind, column.children.first()) else {
                    return None;
                };
                self.open(b'[')?;
                let opened = arena.open_list();
                let mut more = self.any(b']')?;
                while more {
                    let cell = self.column(item, arena)?;
                    arena.push_item(cell);
                    more = self.more(b']')?;
                }
                arena.close_list(opened)?
            }
            b'{' if column.kind == ColumnType::Struct => {
                let start = self.at;
                self.skip()?;
                let value: Value = serde_json::from_slice(self.bytes.get(start..self.at)?).ok()?;
                column.check(Some(&value)).ok()?;
                Cell::Nested(Box::new(value))
            }
            b'-' | b'0'..=b'9' => {
                let number = self.number()?;
                match column.kind {
                    ColumnType::Int32 => {
                        let n = number.as_i64()?;
                        i32::try_from(n).ok()?;
                        Cell::Int(n)
                    }
                    ColumnType::Int64 => Cell::Int(number.as_i64()?),
                    ColumnType::Float64 => Cell::Float(number.as_f64()),
                    ColumnType::Timestamp => Cell::Int(millis_micros(number.as_i64()?)?),
                    _ => return None,
                }
            }
            _ => return None,
        })
    }

    /// A value no column reads, read through as the `Value` parse reads
    /// it (string escapes, numbers' range, the nesting depth) but not
    /// kept: a value that parse refuses makes the record one the reader
    /// is not sure of.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' => {
                self.open(b'{')?;
                let mut more = self.any(b'}')?;
                while more {
                    self.key(None, 0)?;
                    self.skip()?;
                    more = self.more(b'}')?;
                }
            }
            b'[' => {
                self.open(b'[')?;
                let mut more = self.any(b']')?;
                while more {
                    self.skip()?;
                    more = self.more(b']')?;
                }
            }
            b't' => self.word(b"true")?,
            b'f' => self.word(b"false")?,
            b'n' => self.word(b"null")?,
            _ => {
                self.number()?;
            }
        }
        Some(())
    }

    /// A string (at its opening quote) and its text, valid UTF-8: the
    /// bytes between the quotes where they hold no escape, else unescaped
    /// into `scratch`. Not sure of a control character, an escape
    /// serde_json refuses (a lone surrogate among them), or bytes that
    /// are not UTF-8. Text of ASCII alone is not checked again.
    fn string(&mut self) -> Option<&[u8]> {
        self.eat(b'"')?;
        let start = self.at;
        let mut at = start;
        let mut ascii = true;
        loop {
            let byte = *self.bytes.get(at)?;
            if !STOPS[usize::from(byte)] {
                at += 1;
                continue;
            }
            match byte {
                b'"' => {
                    self.at = at + 1;
                    let text = self.bytes.get(start..at)?;
                    return (ascii || std::str::from_utf8(text).is_ok()).then_some(text);
                }
                b'\\' => return self.escaped(start, at, ascii),
                0x80.. => {
                    ascii = false;
                    at += 1;
                }
                _ => return None,
            }
        }
    }

    /// The rest of a string whose text starts at `start` and holds an
    /// escape at `at` (`ascii`: no byte before it is past ASCII): its
    /// text unescaped into `scratch`.
    fn escaped(&mut self, start: usize, mut at: usize, mut ascii: bool) -> Option<&[u8]> {
        self.scratch.clear();
        let mut from = start;
        loop {
            let byte = *self.bytes.get(at)?;
            if !STOPS[usize::from(byte)] {
                at += 1;
                continue;
            }
            if byte >= 0x80 {
                ascii = false;
                at += 1;
                continue;
            }
            self.scratch.extend_from_slice(self.bytes.get(from..at)?);
            match byte {
                b'"' => {
                    self.at = at + 1;
                    // The raw runs and the escapes' characters are valid
                    // UTF-8 together only if each run is: an escape
                    // gives whole characters, never a continuation byte.
                    // Runs of ASCII alone are.
                    return (ascii || std::str::from_utf8(self.scratch).is_ok())
                        .then_some(&self.scratch[..]);
                }
                b'\\' => {
                    at = self.escape(at + 1)?;
                    from = at;
                }
                _ => return None,
            }
        }
    }

    /// The escape whose letter is at `at`, unescaped onto `scratch`; the
    /// index after it.
    fn escape(&mut self, at: usize) -> Option<usize> {
        let byte = match *self.bytes.get(at)? {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => b'\x08',
            b'f' => b'\x0c',
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let n = self.hex(at + 1)?;
                let (c, end) = match n {
                    0xD800..=0xDBFF => {
                        // A leading surrogate: its trailing one must
                        // follow, as a `\u` escape.
                        if self.bytes.get(at + 5..at + 7)? != b"\\u" {
                            return None;
                        }
                        let low = self.hex(at + 7)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        let c = 0x1_0000 + ((n - 0xD800) << 10) + (low - 0xDC00);
                        (char::from_u32(c)?, at + 11)
                    }
                    _ => (char::from_u32(n)?, at + 5),
                };
                let mut utf8 = [0; 4];
                self.scratch
                    .extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                return Some(end);
            }
            _ => return None,
        };
        self.scratch.push(byte);
        Some(at + 1)
    }

    /// The four hex digits at `at`.
    fn hex(&self, at: usize) -> Option<u32> {
        self.bytes.get(at..at + 4)?.iter().try_fold(0, |n, &b| {
            let digit = char::from(b).to_digit(16)?;
            Some(n << 4 | digit)
        })
    }

    /// A number, as serde_json parses it: an integer of `u64` or `i64`
    /// (`-0` and a negative integer below `i64::MIN` as floats), a float
    /// only where its significand is below 2^53 and its decimal exponent
    /// within 22 (see [`EXACT_POWERS`]). Not sure of any other.
    fn number(&mut self) -> Option<Number> {
        let negative = self.peek()? == b'-';
        if negative {
            self.at += 1;
        }
        let mut significand: u64 = 0;
        match self.peek()? {
            b'0' => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => significand = self.digits(0)?.0,
            _ => return None,
        }
        let mut exponent: i32 = 0;
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            float = true;
            let (with_fraction, count) = self.digits(significand)?;
            if count == 0 {
                return None;
            }
            significand = with_fraction;
            exponent = -count;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            float = true;
            let negative_exponent = match self.peek()? {
                b'-' => {
                    self.at += 1;
                    true
                }
                b'+' => {
                    self.at += 1;
                    false
                }
                _ => false,
            };
            let mut written: i32 = 0;
            let mut any = false;
            while let Some(d @ b'0'..=b'9') = self.peek() {
                self.at += 1;
                any = true;
                written = written
                    .saturating_mul(10)
                    .saturating_add(i32::from(d - b'0'));
            }
            if !any {
                return None;
            }
            exponent = if negative_exponent {
                exponent.saturating_sub(written)
            } else {
                exponent.saturating_add(written)
            };
        }
        if !float {
            return Some(if !negative {
                Number::Unsigned(significand)
            } else {
                // As serde_json: `-0` and below `i64::MIN` are floats.
                #[allow(clippy::cast_possible_wrap, clippy::cast_precision_loss)]
                let (negated, float) = ((significand as i64).wrapping_neg(), significand as f64);
                if negated >= 0 {
                    Number::Float(-float)
                } else {
                    Number::Signed(negated)
                }
            });
        }
        if significand >= EXACT_SIGNIFICAND {
            return None;
        }
        #[allow(clippy::cast_precision_loss)] // Below 2^53: exact.
        let exact = significand as f64;
        let power = *EXACT_POWERS.get(usize::try_from(exponent.unsigned_abs()).ok()?)?;
        let f = if exponent >= 0 {
            exact * power
        } else {
            exact / power
        };
        Some(Number::Float(if negative { -f } else { f }))
    }

    /// Decimal digits onto `significand`, and how many there were; not
    /// sure past `u64`.
    fn digits(&mut self, mut significand: u64) -> Option<(u64, i32)> {
        let mut count: i32 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            self.at += 1;
            significand = significand
                .checked_mul(10)?
                .checked_add(u64::from(d - b'0'))?;
            count = count.saturating_add(1);
        }
        Some((significand, count))
    }
}

#[cfg(test)]
mod tests;
