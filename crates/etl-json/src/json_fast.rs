//! The fast path of the fused JSON steps: no document tree. The record's
//! top-level entries are read into buffers reused from record to record,
//! each value kept as its original text; the only allocation per kept
//! record is its new value. `add_field` and `rename_field` take it on
//! top-level fields; `filter` and `drop_field` at any depth: a filter
//! reads its field by scanning the text down its path, and a nested
//! `drop_field` builds only the top-level value it is in.
//!
//! Invariant: the output is byte for byte what the tree path writes (see
//! [`faithful`](crate::faithful): an unchanged record as it came; else
//! each live key in its original place with its original text unless a
//! step changed its value, new keys after them in `serde_json::Map` order,
//! which is sorted without `preserve_order`), and filters compare the same
//! parsed values. Anything the fast path does not handle (invalid JSON, a
//! non-object) is left to the tree path, so error messages do not change
//! either.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use crate::check;
use crate::faithful::{self, Verbatim};
use crate::ops::{CompareOp, JsonOp, child, compare, decide, index, remove};
use crate::scan::{self, Entries};

/// One step on a top-level field.
#[derive(Debug)]
enum FastOp {
    Filter {
        path: Vec<String>,
        op: CompareOp,
        value: Value,
    },
    Add {
        field: String,
        /// Index into [`FastStage::constants`].
        constant: usize,
    },
    Rename {
        from: String,
        to: String,
    },
    Drop {
        path: Vec<String>,
    },
}

/// What the fast path made of a record.
#[derive(Debug, PartialEq)]
pub(crate) enum Fast {
    /// Keep it: with a new value, or unchanged (`None`).
    Keep(Option<Bytes>),
    /// A filter dropped it.
    Filtered,
    /// Not handled here (not a JSON object, invalid JSON): use the tree.
    Fallback,
}

/// Where an entry's value stands after the steps so far.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// As read.
    Original,
    /// Set by a step to a value other than the one read.
    Set(Value),
    /// Set by an `add_field` to its constant (an index into
    /// [`FastStage::constants`]), other than the value read.
    Const(usize),
    /// A field below it dropped: the value as written, a range of
    /// [`Scratch::edited`].
    Text(Range<usize>),
    /// Dropped or moved away.
    Gone,
}

/// A field of the record being processed: ranges into [`Scratch`].
#[derive(Debug, Clone)]
struct Entry {
    key: Range<usize>,
    /// Where the value's original text is in the record's text (empty
    /// for a key a step added).
    raw: Range<usize>,
    /// Where the entry's text starts in the record's text when it is
    /// written as it stands there, `"key":value` ([`Verbatim::start`]).
    span: Option<usize>,
    /// Whether the record had this entry (rather than a step adding it).
    read: bool,
    state: State,
}

#[derive(Debug, Default)]
struct Scratch {
    keys: String,
    entries: Vec<Entry>,
    /// Values rewritten as text ([`State::Text`]).
    edited: Vec<u8>,
    out: Vec<u8>,
    /// Indexes of the entries steps added, in writing order.
    added: Vec<usize>,
    /// New values are cut from shared blocks: no allocation per record,
    /// and no allocator overhead per record while they are in flight.
    arena: BytesMut,
    /// Which read entries are the last of their key, for the last layout.
    layout: Layout,
    /// The vector the record's entries are read into, kept empty.
    read: Entries<'static>,
    /// The vectors the nested objects on the steps' paths are kept in
    /// by the reading ([`check::Nested`]), kept empty.
    objects: Vec<check::Object>,
    kept: Vec<Entries<'static>>,
}

/// The keys of a record and which of its entries are the last of their
/// key (the live one among duplicates).
#[derive(Debug, Default)]
struct Layout {
    keys: String,
    ranges: Vec<Range<usize>>,
    last: Vec<bool>,
}

/// Size of an arena block; a block is freed once its records are gone.
const ARENA_BLOCK: usize = 64 * 1024;

/// An `add_field` constant, and its text as serde_json writes it.
#[derive(Debug)]
struct Constant {
    value: Value,
    json: Vec<u8>,
}

/// The fused steps, run without a document tree.
#[derive(Debug)]
pub(crate) struct FastStage {
    ops: Vec<FastOp>,
    constants: Vec<Constant>,
    mutates: bool,
    /// How deep the reading keeps nested objects: as deep as the longest
    /// path a filter or a drop reaches into (0: none).
    keep_depth: usize,
    scratch: Scratch,
}

impl FastStage {
    /// The fast path for `ops`, if every `add_field` and `rename_field` is
    /// on a top-level field and this build's `serde_json::Map` keeps keys
    /// sorted.
    pub(crate) fn new(ops: &[JsonOp]) -> Option<Self> {
        if !map_is_sorted() {
            return None;
        }
        let one = |path: &[String]| match path {
            [field] => Some(field.clone()),
            _ => None,
        };
        let mut constants = Vec::new();
        let mut fast = Vec::with_capacity(ops.len());
        for op in ops {
            fast.push(match op {
                JsonOp::Filter { path, op, value } if !path.is_empty() => FastOp::Filter {
                    path: path.clone(),
                    op: *op,
                    value: value.clone(),
                },
                JsonOp::Add { path, value } => {
                    constants.push(Constant {
                        value: value.clone(),
                        json: serde_json::to_vec(value).ok()?,
                    });
                    FastOp::Add {
                        field: one(path)?,
                        constant: constants.len() - 1,
                    }
                }
                JsonOp::Rename { from, to } => FastOp::Rename {
                    from: one(from)?,
                    to: one(to)?,
                },
                JsonOp::Drop { path } if !path.is_empty() => FastOp::Drop { path: path.clone() },
                JsonOp::Filter { .. } | JsonOp::Drop { .. } => return None,
            });
        }
        let ops = fast;
        let mutates = ops.iter().any(|op| !matches!(op, FastOp::Filter { .. }));
        let keep_depth = ops
            .iter()
            .map(|op| match op {
                FastOp::Filter { path, .. } | FastOp::Drop { path } if path.len() > 1 => path.len(),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        Some(FastStage {
            ops,
            constants,
            mutates,
            keep_depth,
            scratch: Scratch::default(),
        })
    }

    /// Run the steps on one JSON value.
    pub(crate) fn apply(&mut self, input: &[u8]) -> Fast {
        // One UTF-8 check for the whole value; the parser then borrows
        // strings without checking each again.
        let Ok(text) = simdutf8::basic::from_utf8(input) else {
            return Fast::Fallback;
        };
        let s = &mut self.scratch;
        let mut objects = std::mem::take(&mut s.objects);
        objects.clear();
        let mut kept = scan::recycle_each(std::mem::take(&mut s.kept));
        let out = scan::recycle(std::mem::take(&mut s.read));
        // The reading checks the whole value, and keeps the nested objects
        // on the steps' paths; numbers are parsed when a step reads them.
        let read = if self.keep_depth > 0 {
            let nested = check::Nested {
                max_depth: self.keep_depth,
                objects: &mut objects,
                entries: &mut kept,
            };
            check::entries_keeping(text, out, nested)
        } else {
            check::entries_in(text, out)
        };
        let fast = match read {
            None => Fast::Fallback,
            Some(read) => {
                let nested = check::Kept {
                    doc: text,
                    objects: &objects,
                    entries: &kept,
                };
                let fast = self.run(text, &read, &nested);
                self.scratch.read = scan::recycle(read);
                fast
            }
        };
        let s = &mut self.scratch;
        s.objects = objects;
        s.kept = scan::recycle_each(kept);
        fast
    }

    /// The steps on a record whose top-level entries are `read`.
    fn run(&mut self, text: &str, read: &Entries<'_>, nested: &check::Kept<'_, '_>) -> Fast {
        let s = &mut self.scratch;
        let constants = &self.constants[..];
        s.keys.clear();
        s.entries.clear();
        s.edited.clear();
        for &(key, value) in read {
            let start = s.keys.len();
            // A key with escapes is decoded here, where its value is
            // needed (the reading refused what does not decode).
            let plain = key.plain();
            match plain {
                Some(plain) => s.keys.push_str(plain),
                None => match key.decoded() {
                    Some(decoded) => s.keys.push_str(&decoded),
                    None => return Fast::Fallback,
                },
            }
            let at = value.as_ptr().addr() - text.as_ptr().addr();
            s.entries.push(Entry {
                key: start..s.keys.len(),
                raw: at..at + value.len(),
                span: plain.and_then(|key| Verbatim::start(text, key, value)),
                read: true,
                state: State::Original,
            });
        }
        for op in &self.ops {
            match op {
                FastOp::Filter { path, op, value } => {
                    let keep = match s.find(&path[0]) {
                        None => compare(None, *op, value),
                        // As read: the field's text, when it is there.
                        Some(i) if s.entries[i].state == State::Original => {
                            match s.text_at(i, &path[1..], text, nested) {
                                // A plain string against a string, say, is
                                // decided on the text.
                                Some(found) => match compare_text(found, *op, value) {
                                    Some(keep) => keep,
                                    None => compare(
                                        serde_json::from_str(found).ok().as_ref(),
                                        *op,
                                        value,
                                    ),
                                },
                                None => compare(None, *op, value),
                            }
                        }
                        Some(i) if path.len() == 1 => {
                            compare(Some(&s.value_of(i, constants, text)), *op, value)
                        }
                        Some(i) => compare(
                            s.nested(i, &path[1..], constants, text).as_ref(),
                            *op,
                            value,
                        ),
                    };
                    if !keep {
                        return Fast::Filtered;
                    }
                }
                FastOp::Add { field, constant } => {
                    s.set(field, State::Const(*constant), constants, text);
                }
                FastOp::Rename { from, to } => {
                    if let Some(i) = s.find(from) {
                        let moved = s.value_of(i, constants, text);
                        s.entries[i].state = State::Gone;
                        s.set(to, State::Set(moved), constants, text);
                    }
                }
                FastOp::Drop { path } => {
                    if let Some(i) = s.find(&path[0]) {
                        if path.len() == 1 {
                            s.entries[i].state = State::Gone;
                        } else if s.entries[i].state == State::Original
                            && let Some(dropped) = s.drop_text(i, &path[1..], text, nested)
                        {
                            // Written from the text, as the tree path
                            // writes it (`None`: nothing to drop).
                            if let Some(range) = dropped {
                                s.entries[i].state = State::Text(range);
                            }
                        } else {
                            // The tree path's removal, on the one
                            // top-level value the field is in.
                            let mut top = Map::new();
                            top.insert(path[0].clone(), s.value_of(i, constants, text));
                            if remove(&mut top, path).is_some() {
                                // Something was removed. The value may be
                                // the one read all the same (what an
                                // earlier step added, taken out again):
                                // `set` keeps such a value as read.
                                let changed = top.remove(&path[0]).unwrap_or(Value::Null);
                                s.set(&path[0], State::Set(changed), constants, text);
                            }
                        }
                    }
                }
            }
        }
        if !self.mutates || s.unchanged() {
            return Fast::Keep(None);
        }
        match s.write(constants, text) {
            Ok(bytes) => Fast::Keep(Some(bytes)),
            Err(_) => Fast::Fallback,
        }
    }
}

impl Scratch {
    fn key(&self, i: usize) -> &str {
        &self.keys[self.entries[i].key.clone()]
    }

    /// The last entry of `field`, whatever its state.
    fn last(&self, field: &str) -> Option<usize> {
        (0..self.entries.len())
            .rev()
            .find(|&i| self.key(i) == field)
    }

    /// The index of the field's live entry (the last of duplicates).
    fn find(&self, field: &str) -> Option<usize> {
        self.last(field)
            .filter(|&i| self.entries[i].state != State::Gone)
    }

    /// The value read at entry `i`.
    fn original(&self, i: usize, doc: &str) -> Value {
        doc.get(self.entries[i].raw.clone())
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null)
    }

    /// The value at `path` below entry `i`, as the tree path reads it,
    /// from the entry's value now (an entry still as read is looked up by
    /// its text instead, [`Scratch::text_at`]).
    fn nested(
        &self,
        i: usize,
        path: &[String],
        constants: &[Constant],
        doc: &str,
    ) -> Option<Value> {
        let top = self.value_of(i, constants, doc);
        path.iter().try_fold(&top, |v, s| child(v, s)).cloned()
    }

    /// The text of the value at `path` below entry `i` while the entry is
    /// as read (`None` when it is not, or there is no such value): looked
    /// up in the record's text (`doc`) through the objects the reading
    /// kept, or scanned for.
    fn text_at<'d>(
        &self,
        i: usize,
        path: &[String],
        doc: &'d str,
        kept: &check::Kept<'d, '_>,
    ) -> Option<&'d str> {
        let e = &self.entries[i];
        if e.state != State::Original {
            return None;
        }
        let mut text = doc.get(e.raw.clone())?;
        for segment in path {
            text = match text.as_bytes().first() {
                // The record was read (and checked) whole above.
                Some(b'{') => match kept.get(text) {
                    Some(entries) => scan::last(entries, segment)??,
                    None => scan::find(text, segment)??,
                },
                Some(b'[') => scan::items(text)?.get(index(segment)?)?,
                _ => return None,
            };
        }
        Some(text)
    }

    /// The read value of entry `i` without the field at `path` below it,
    /// written to [`Scratch::edited`] as the tree path writes it: `None`
    /// when the text is not one handled here (an array on the way), else
    /// where it was written, or `None` when there is no such field.
    fn drop_text(
        &mut self,
        i: usize,
        path: &[String],
        doc: &str,
        kept: &check::Kept<'_, '_>,
    ) -> Option<Option<Range<usize>>> {
        let e = &self.entries[i];
        let text = doc.get(e.raw.clone())?;
        let start = self.edited.len();
        let dropped = drop_in(text, path, &mut self.edited, kept);
        if dropped != Some(true) {
            self.edited.truncate(start);
        }
        dropped.map(|d| d.then_some(start..self.edited.len()))
    }

    /// The entry's value as the tree path would hold it now.
    fn value_of(&self, i: usize, constants: &[Constant], doc: &str) -> Value {
        match &self.entries[i].state {
            State::Set(v) => v.clone(),
            State::Const(c) => constants[*c].value.clone(),
            State::Text(r) => {
                serde_json::from_slice(&self.edited[r.clone()]).unwrap_or(Value::Null)
            }
            State::Original | State::Gone => self.original(i, doc),
        }
    }

    /// Set `field` to `value`: in place when the record has the key (its
    /// original text kept when the value is the one read), else as a new
    /// key.
    fn set(&mut self, field: &str, value: State, constants: &[Constant], doc: &str) {
        match self.last(field) {
            Some(i) if self.entries[i].read => {
                let original = self.original(i, doc);
                let same = match &value {
                    State::Set(v) => *v == original,
                    State::Const(c) => constants[*c].value == original,
                    State::Original | State::Gone | State::Text(_) => false,
                };
                self.entries[i].state = if same { State::Original } else { value };
            }
            Some(i) => self.entries[i].state = value,
            None => {
                let start = self.keys.len();
                self.keys.push_str(field);
                self.entries.push(Entry {
                    key: start..self.keys.len(),
                    raw: 0..0,
                    span: None,
                    read: false,
                    state: value,
                });
            }
        }
    }

    /// Whether the document is the one read: every live read entry as it
    /// was, nothing added, nothing gone.
    fn unchanged(&self) -> bool {
        self.entries.iter().all(|e| {
            if e.read {
                e.state == State::Original
            } else {
                e.state == State::Gone
            }
        })
    }

    /// Mark which read entries are the last of their key. Records of one
    /// stream mostly share their keys and key order, so the marks of the
    /// previous record are reused when its keys were the same, in the
    /// same places.
    fn plan(&mut self) {
        let read = self.entries.iter().take_while(|e| e.read).count();
        let layout = &mut self.layout;
        if layout.ranges.len() == read
            && layout
                .ranges
                .iter()
                .zip(&self.entries)
                .all(|(r, e)| *r == e.key && layout.keys[r.clone()] == self.keys[e.key.clone()])
        {
            return;
        }
        let keys = &self.keys;
        let entries = &self.entries[..read];
        layout.last.clear();
        layout.last.extend((0..read).map(|i| {
            let key = &keys[entries[i].key.clone()];
            !entries[i + 1..].iter().any(|e| &keys[e.key.clone()] == key)
        }));
        layout.keys.clone_from(keys);
        layout.ranges.clear();
        layout.ranges.extend(entries.iter().map(|e| e.key.clone()));
    }

    /// The rewritten object, as [`faithful::write`] writes it.
    fn write(&mut self, constants: &[Constant], doc: &str) -> serde_json::Result<Bytes> {
        self.plan();
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.push(b'{');
        let mut first = true;
        let mut added = std::mem::take(&mut self.added);
        added.clear();
        let mut run = Verbatim::new(doc);
        for (i, e) in self.entries.iter().enumerate() {
            if !e.read {
                if e.state != State::Gone {
                    added.push(i);
                }
                continue;
            }
            if !self.layout.last[i] || e.state == State::Gone {
                continue;
            }
            if let (State::Original, Some(start)) = (&e.state, e.span) {
                run.take(start, e.raw.end, &mut out, &mut first);
                continue;
            }
            run.flush(&mut out, &mut first);
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            write_key(&mut out, &self.keys[e.key.clone()]);
            out.push(b':');
            let raw = doc.get(e.raw.clone()).unwrap_or_default();
            let value = match &e.state {
                State::Set(value) => value,
                State::Const(c) => &constants[*c].value,
                State::Text(r) => {
                    out.extend_from_slice(&self.edited[r.clone()]);
                    continue;
                }
                State::Original | State::Gone => {
                    out.extend_from_slice(raw.as_bytes());
                    continue;
                }
            };
            faithful::write(raw, &self.original(i, doc), value, &mut out)?;
        }
        run.flush(&mut out, &mut first);
        added.sort_by(|&a, &b| self.key(a).cmp(self.key(b)));
        for &i in &added {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            let e = &self.entries[i];
            write_key(&mut out, &self.keys[e.key.clone()]);
            out.push(b':');
            match &e.state {
                State::Set(value) => serde_json::to_writer(&mut out, value)?,
                State::Const(c) => out.extend_from_slice(&constants[*c].json),
                State::Original | State::Gone | State::Text(_) => {}
            }
        }
        out.push(b'}');
        if self.arena.capacity() - self.arena.len() < out.len() {
            self.arena.reserve(out.len().max(ARENA_BLOCK));
        }
        self.arena.extend_from_slice(&out);
        self.out = out;
        self.added = added;
        Ok(self.arena.split().freeze())
    }
}

/// [`compare`] on the text of a checked JSON value, when the text alone
/// decides it (`None`: parse it and compare): a string without escapes
/// against a string constant, any other value against one, and most
/// numbers against a whole-number constant ([`compare_number`]).
fn compare_text(text: &str, op: CompareOp, constant: &Value) -> Option<bool> {
    let constant = match constant {
        Value::String(constant) => constant,
        Value::Number(number) => return compare_number(text, op, number.as_i64()?),
        _ => return None,
    };
    if op == CompareOp::Exists {
        return Some(true);
    }
    let ordering = match text.strip_prefix('"') {
        // A checked string: its last byte is the closing quote, and
        // without a backslash the text between is the string.
        Some(inner) if !inner.contains('\\') => {
            Some(inner.strip_suffix('"')?.cmp(constant.as_str()))
        }
        Some(_) => return None,
        // A number, a literal, an object or an array: not comparable.
        None => None,
    };
    Some(decide(op, ordering))
}

/// [`compare`] of a number's text against a whole-number constant,
/// without parsing it into a [`Value`]: `None` for any other text, left
/// to the parse.
///
/// * An integer (a checked value that is `-` and digits) that fits an
///   `i64` is the `i64` serde_json reads, compared as `compare` compares
///   two; `-0`, which serde_json reads as the float -0.0, orders against
///   every constant as 0 does. Wider integers go to the parse.
/// * A decimal without an exponent, of at most 15 digits in all, against
///   a constant of at most 15 digits, orders as its exact value does:
///   two different decimals of at most 15 significant digits are more
///   than a few units in the last place of an `f64` apart, so serde_json's
///   float (the parse rounds each to the nearest `f64`, or next to it)
///   orders as they do, and an exact value is read exactly. Longer ones
///   and exponents go to the parse.
fn compare_number(text: &str, op: CompareOp, constant: i64) -> Option<bool> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match unsigned.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !fraction.is_none_or(digits) {
        return None;
    }
    let ordering = match fraction {
        None => text.parse::<i64>().ok()?.cmp(&constant),
        Some(fraction) => {
            const MAX: i64 = 999_999_999_999_999;
            if whole.len() + fraction.len() > 15 || !(-MAX..=MAX).contains(&constant) {
                return None;
            }
            // |value| = whole + f, 0 <= f < 1; ordered against the
            // constant with the sign taken off.
            let whole: i64 = whole.parse().ok()?;
            let above = fraction.bytes().any(|b| b != b'0');
            let against = if negative { -constant } else { constant };
            let magnitude = whole.cmp(&against).then(if above {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            });
            if negative {
                magnitude.reverse()
            } else {
                magnitude
            }
        }
    };
    if op == CompareOp::Exists {
        return Some(true);
    }
    Some(decide(op, Some(ordering)))
}

/// Write the value `text` without the field at `path` (not empty) below
/// it, as [`faithful::write`] writes the value the tree path leaves:
/// each object on the way written key by key in its original order (the
/// last of duplicate keys), every other value from its original text.
/// `Some(false)`: there is no such field (nothing written); `None`: an
/// array on the way (an index shifts the elements after it, which the
/// tree path then writes from their values), or text that is not what it
/// should be.
fn drop_in(
    text: &str,
    path: &[String],
    out: &mut Vec<u8>,
    kept: &check::Kept<'_, '_>,
) -> Option<bool> {
    let (wanted, rest) = path.split_first()?;
    match text.as_bytes().first() {
        Some(b'{') => {}
        Some(b'[') => return None,
        _ => return Some(false),
    }
    let scanned;
    let entries = match kept.get(text) {
        Some(entries) => entries,
        None => {
            scanned = scan::entries(text)?;
            &scanned[..]
        }
    };
    let mut last = None;
    for (i, (k, _)) in entries.iter().enumerate().rev() {
        if k.is(wanted)? {
            last = Some(i);
            break;
        }
    }
    let Some(last) = last else {
        return Some(false);
    };
    // Only the last of duplicate keys is live; with keys with escapes,
    // each key is decoded once for the object.
    let shadowed = if entries.iter().any(|(k, _)| k.escaped()) {
        Some(scan::shadowed(entries)?)
    } else {
        None
    };
    let start = out.len();
    out.push(b'{');
    let mut first = true;
    let mut run = Verbatim::new(text);
    for (i, &(key, value)) in entries.iter().enumerate() {
        let duplicate = match &shadowed {
            Some(shadowed) => shadowed.get(i).copied().unwrap_or(false),
            None => scan::has_key(&entries[i + 1..], key)?,
        };
        if duplicate {
            continue;
        }
        if i == last && rest.is_empty() {
            continue;
        }
        if i != last
            && let Some(plain) = key.plain()
            && let Some(from) = Verbatim::start(text, plain, value)
        {
            let end = value.as_ptr().addr() - text.as_ptr().addr() + value.len();
            run.take(from, end, out, &mut first);
            continue;
        }
        run.flush(out, &mut first);
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        write_key(out, &key.decoded()?);
        out.push(b':');
        if i == last {
            match drop_in(value, rest, out, kept) {
                Some(true) => {}
                other => {
                    out.truncate(start);
                    return other;
                }
            }
        } else {
            out.extend_from_slice(value.as_bytes());
        }
    }
    run.flush(out, &mut first);
    out.push(b'}');
    Some(true)
}

/// A key as serde_json writes it: quoted, escaped where needed.
fn write_key(out: &mut Vec<u8>, key: &str) {
    if key.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        // Writing a string to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, key);
    } else {
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
    }
}

/// `serde_json::Map` is a `BTreeMap` unless a crate in the build enables
/// `preserve_order`; the fast path writes new keys sorted, so it checks.
fn map_is_sorted() -> bool {
    serde_json::from_str::<Map<String, Value>>(r#"{"b":0,"a":0}"#)
        .ok()
        .and_then(|m| m.keys().next().map(|k| k == "a"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use etl_record::{Position, Record};
    use proptest::prelude::*;

    use super::*;
    use etl_transform::{Outcome, Transform};

    use crate::JsonStage;

    fn ops() -> Vec<JsonOp> {
        vec![
            JsonOp::Filter {
                path: JsonOp::path("amount"),
                op: CompareOp::Ge,
                value: Value::from(10),
            },
            JsonOp::Add {
                path: JsonOp::path("tag"),
                value: serde_json::json!({"z": 1, "a": [true, null]}),
            },
            JsonOp::Rename {
                from: JsonOp::path("user"),
                to: JsonOp::path("customer"),
            },
            JsonOp::Drop {
                path: JsonOp::path("gone"),
            },
        ]
    }

    /// What the tree path makes of `input`.
    fn tree(ops: &[JsonOp], input: &str) -> Fast {
        let mut stage = JsonStage::new("json", ops.to_vec());
        stage.fast = None;
        match stage.apply(Record::new(Position::default(), input.to_owned())) {
            Outcome::Keep(r) => Fast::Keep(Some(r.value)),
            Outcome::Filtered => Fast::Filtered,
            _ => Fast::Fallback,
        }
    }

    /// What the fast path makes of `input` ("unchanged" spelled out).
    fn fast(ops: &[JsonOp], input: &str) -> Fast {
        match FastStage::new(ops)
            .expect("top-level steps take the fast path")
            .apply(input.as_bytes())
        {
            Fast::Keep(None) => Fast::Keep(Some(Bytes::copy_from_slice(input.as_bytes()))),
            other => other,
        }
    }

    #[test]
    fn a_record_nested_128_deep_is_left_to_the_tree_path_which_refuses_it() {
        // The record is `levels` containers deep, itself the first.
        let nested = |levels: usize| {
            format!(
                "{}1{}",
                "{\"amount\":12,\"a\":".repeat(levels),
                "}".repeat(levels)
            )
        };
        for levels in [127, 128, 129] {
            let input = nested(levels);
            let mut stage = JsonStage::new("json", ops());
            stage.fast = None;
            let refused = match stage.apply(Record::new(Position::default(), input.clone())) {
                Outcome::Reject(_, why) => why.contains("recursion limit exceeded"),
                _ => false,
            };
            // serde_json refuses the 128th container.
            assert_eq!(refused, levels >= 128, "{levels} levels");
            let fast = fast(&ops(), &input);
            assert_eq!(fast == Fast::Fallback, levels >= 128, "{levels} levels");
            if levels < 128 {
                assert_eq!(fast, tree(&ops(), &input), "{levels} levels");
            }
        }
    }

    #[test]
    fn writes_what_the_tree_path_writes() {
        for input in [
            r#"{"user":"u1","amount":12.50,"gone":1,"b":[1, 2.0e1,"\u00e9\n"],"a":{"y":1,"x":2}}"#,
            r#"{"amount":1e3,"amount":3}"#,
            r#"{"amount":10,"customer":"old","user":"new","tag":0}"#,
            r#" { "amount" : 18446744073709551616 } "#,
            r#"{"amount":-5}"#,
            r#"{"k\"ey":true,"amount":99}"#,
            r#"{}"#,
        ] {
            assert_eq!(fast(&ops(), input), tree(&ops(), input), "{input}");
        }
    }

    #[test]
    fn keys_with_escapes_are_the_keys_they_decode_to() {
        let ops = vec![
            JsonOp::Filter {
                path: JsonOp::path("a.b"),
                op: CompareOp::Eq,
                value: Value::from(1),
            },
            JsonOp::Drop {
                path: JsonOp::path("a.c"),
            },
            JsonOp::Rename {
                from: JsonOp::path("ab"),
                to: JsonOp::path("z"),
            },
        ];
        for input in [
            // `"\u0062"` is `"b"`, `"\u0063"` is `"c"`: of duplicates, the
            // last is live, however written.
            r#"{"a":{"\u0062":1,"c":2,"\u0063":3},"k\"q":0}"#,
            r#"{"\u0061":{"b":1,"c":2},"a":{"b":1,"\u0063":2,"d":4}}"#,
            r#"{"a":{"b":2,"\u0062":1}}"#,
            r#"{"a":{"\u0062":1},"a\u0062":5,"ab":6,"caf\u00e9":7}"#,
            r#"{"a":{"b\\":1}}"#,
        ] {
            let fast = fast(&ops, input);
            assert!(!matches!(fast, Fast::Fallback), "{input}");
            assert_eq!(fast, tree(&ops, input), "{input}");
        }
    }

    #[test]
    fn dropping_in_an_object_of_many_keys_with_escapes_decodes_each_key_a_bounded_number_of_times()
    {
        let ops = vec![JsonOp::Drop {
            path: JsonOp::path("a.b"),
        }];
        let keys = 300;
        let fields: Vec<String> = (0..keys)
            .map(|i| format!("\"k\\u00fc{i:04}\":{i}"))
            .collect();
        let input = format!("{{\"a\":{{{},\"b\":1}}}}", fields.join(","));
        scan::DECODED.with(|n| n.set(0));
        let got = fast(&ops, &input);
        let decoded = scan::DECODED.with(std::cell::Cell::get);
        assert!(!matches!(got, Fast::Fallback));
        assert_eq!(got, tree(&ops, &input));
        assert!(decoded <= 4 * keys, "{decoded} decodes for {keys} keys");
    }

    #[test]
    fn leaves_errors_and_non_objects_to_the_tree_path() {
        for input in ["not json", "[1]", r#"{"a":1} x"#, r#"{"a":}"#, ""] {
            assert_eq!(fast(&ops(), input), Fast::Fallback, "{input}");
        }
    }

    #[test]
    fn nested_adds_and_renames_take_the_tree_path() {
        let ops = vec![JsonOp::Add {
            path: JsonOp::path("a.b"),
            value: Value::Null,
        }];
        assert!(FastStage::new(&ops).is_none());
        let ops = vec![JsonOp::Rename {
            from: JsonOp::path("a"),
            to: JsonOp::path("b.c"),
        }];
        assert!(FastStage::new(&ops).is_none());
    }

    #[test]
    fn nested_filters_and_drops_write_what_the_tree_path_writes() {
        let ops = vec![
            JsonOp::Filter {
                path: JsonOp::path("order.status"),
                op: CompareOp::Eq,
                value: Value::from("paid"),
            },
            JsonOp::Filter {
                path: JsonOp::path("order.items.1.qty"),
                op: CompareOp::Ge,
                value: Value::from(2),
            },
            JsonOp::Drop {
                path: JsonOp::path("customer.email"),
            },
            JsonOp::Drop {
                path: JsonOp::path("order.items.0"),
            },
        ];
        for input in [
            r#"{"id":1,"order":{"status":"paid","items":[{"q":1},{"qty":2.0}]},"customer":{"name":"Zoë","email":"a@b","email":"c@d","tier":1.50}}"#,
            r#"{"order":{"status":"paid","status":"paid","items":[1,{"qty":3}]},"customer":5}"#,
            r#"{"order":{"status":"pending","items":[{},{"qty":9}]}}"#,
            r#"{"order":{"status":"paid","items":{"1":{"qty":9},"0":1}},"customer":{}}"#,
            r#"{"order":{"status":"paid","items":[{"qty":9}]}}"#,
        ] {
            assert_eq!(fast(&ops, input), tree(&ops, input), "{input}");
        }
    }

    #[test]
    fn entries_copied_in_runs_write_what_the_tree_path_writes() {
        let ops = vec![
            JsonOp::Drop {
                path: JsonOp::path("gone"),
            },
            JsonOp::Drop {
                path: JsonOp::path("c.email"),
            },
        ];
        for input in [
            // Runs broken by a dropped entry, spacing, an escaped key, a
            // duplicate key, and joined again.
            r#"{"a":1,"b":[2,{"x":"y"}],"gone":0,"d":"\u00e9","k\u00e9":2,"e" :3,"f": 4 , "g":5,"h":6}"#,
            r#"{"a":1,"a":2,"b":3,"gone":0}"#,
            r#"{"gone":0,"a":1}"#,
            r#"{"a":1,"gone":0}"#,
            r#"{ "a":1 ,"gone":0 }"#,
            r#"{"c":{"name":"Zoë","email":"x","tier":1,"address":{"city":"Zürich"}},"gone":1}"#,
            r#"{"c":{"email":"x","name":"a"}}"#,
            r#"{"c":{"name":"a","email":"x"}}"#,
            r#"{"c":{"n\"ame":"a","email":"x","t":1, "u":2,"t":3}}"#,
        ] {
            let fast = fast(&ops, input);
            assert!(matches!(fast, Fast::Keep(Some(_))), "{input}");
            assert_eq!(fast, tree(&ops, input), "{input}");
        }
    }

    #[test]
    fn a_number_past_an_f64_is_refused_as_the_tree_path_refuses_it() {
        let ops = vec![JsonOp::Filter {
            path: JsonOp::path("b"),
            op: CompareOp::Exists,
            value: Value::Null,
        }];
        let input = format!(r#"{{"a":1{}e99,"b":1}}"#, "0".repeat(210));
        assert_eq!(tree(&ops, &input), Fast::Fallback);
        assert_eq!(fast(&ops, &input), Fast::Fallback);
    }

    #[test]
    fn filters_alone_keep_the_bytes() {
        let ops = vec![JsonOp::Filter {
            path: JsonOp::path("a"),
            op: CompareOp::Exists,
            value: Value::Null,
        }];
        let mut stage = FastStage::new(&ops).expect("fast path");
        assert_eq!(stage.apply(br#"{ "a" : 1 }"#), Fast::Keep(None));
        assert_eq!(stage.apply(br#"{"b":1}"#), Fast::Filtered);
    }

    #[test]
    fn a_filter_decided_on_the_text_decides_as_the_parsed_value() {
        let ops = [
            CompareOp::Eq,
            CompareOp::Ne,
            CompareOp::Lt,
            CompareOp::Le,
            CompareOp::Gt,
            CompareOp::Ge,
            CompareOp::Exists,
        ];
        let texts = [
            r#""paid""#,
            r#""pai""#,
            r#""paidx""#,
            r#""""#,
            r#""Zürich""#,
            r#""pa\u0069d""#,
            r#""p\"d""#,
            "1",
            "-0.5e3",
            "true",
            "null",
            r#"{"a":"paid"}"#,
            r#"["paid"]"#,
        ];
        for constant in ["paid", "", "Zürich", "z", "p\"d"] {
            let constant = Value::from(constant);
            for text in texts {
                let parsed: Value = serde_json::from_str(text).unwrap();
                for op in ops {
                    let decided = compare_text(text, op, &constant);
                    if let Some(decided) = decided {
                        assert_eq!(
                            decided,
                            compare(Some(&parsed), op, &constant),
                            "{text} {op:?} {constant}"
                        );
                    } else {
                        // Only a string with escapes is left to the parse.
                        assert!(text.contains('\\'), "{text} {op:?} {constant}");
                    }
                }
            }
        }
        // Text that is not a whole string is left to the parse (never
        // given here, never a panic).
        for cut in ["\"", "\"paid"] {
            assert_eq!(compare_text(cut, CompareOp::Eq, &Value::from("paid")), None);
        }
    }

    #[test]
    fn a_filter_on_a_number_is_decided_on_its_text_as_on_the_parsed_value() {
        let ops = [
            CompareOp::Eq,
            CompareOp::Ne,
            CompareOp::Lt,
            CompareOp::Le,
            CompareOp::Gt,
            CompareOp::Ge,
            CompareOp::Exists,
        ];
        let texts = [
            "100",
            "99",
            "101",
            "0",
            "-0",
            "-1",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "100.0",
            "100.00",
            "99.99",
            "100.01",
            "123.45",
            "-0.5",
            "-100.5",
            "-99.5",
            "0.000000000000001",
            "99.999999999999999",
            "99999999999999.9",
            "999999999999999.9",
            "1e2",
            "-0.0",
            r#""100""#,
            "true",
            "null",
            "[100]",
        ];
        let constants = [
            Value::from(100),
            Value::from(0),
            Value::from(-1),
            Value::from(i64::MAX),
            Value::from(i64::MIN),
            Value::from(u64::MAX),
            Value::from(100.5),
        ];
        for constant in &constants {
            for text in texts {
                let parsed: Value = serde_json::from_str(text).unwrap();
                for op in ops {
                    if let Some(decided) = compare_text(text, op, constant) {
                        assert_eq!(
                            decided,
                            compare(Some(&parsed), op, constant),
                            "{text} {op:?} {constant}"
                        );
                    }
                }
            }
        }
        // Integers, and decimals of up to 15 digits, against a whole-number
        // constant are decided on the text; exponents, longer decimals,
        // integers past i64 and constants that are not whole numbers of
        // i64 go to the parse.
        let ge = |text, constant: &Value| compare_text(text, CompareOp::Ge, constant);
        assert_eq!(ge("100", &Value::from(100)), Some(true));
        assert_eq!(ge("99", &Value::from(100)), Some(false));
        assert_eq!(ge("-0", &Value::from(0)), Some(true));
        assert_eq!(
            ge("-9223372036854775808", &Value::from(i64::MIN)),
            Some(true)
        );
        assert_eq!(ge("123.45", &Value::from(100)), Some(true));
        assert_eq!(ge("99.99", &Value::from(100)), Some(false));
        assert_eq!(ge("100.00", &Value::from(100)), Some(true));
        assert_eq!(ge("-99.5", &Value::from(-100)), Some(true));
        assert_eq!(ge("-100.5", &Value::from(-100)), Some(false));
        for text in [
            "1e2",
            "9223372036854775808",
            "99.999999999999999",
            "0.000000000000001",
            r#""100""#,
            "null",
        ] {
            assert_eq!(ge(text, &Value::from(100)), None, "{text}");
        }
        assert_eq!(ge("100.5", &Value::from(1_000_000_000_000_000_i64)), None);
        assert_eq!(ge("100", &Value::from(u64::MAX)), None);
        assert_eq!(ge("100", &Value::from(100.5)), None);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-c\"\\\\\u{e9}\n ]{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-c]", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn op() -> impl Strategy<Value = JsonOp> {
        let field = "[a-d]";
        let nested = "[a-d](\\.([a-d]|[0-2])){0,2}";
        let cmp = prop_oneof![
            Just(CompareOp::Eq),
            Just(CompareOp::Ne),
            Just(CompareOp::Lt),
            Just(CompareOp::Ge),
            Just(CompareOp::Exists),
        ];
        prop_oneof![
            (nested, cmp, json_value()).prop_map(|(f, op, value)| JsonOp::Filter {
                path: JsonOp::path(&f),
                op,
                value,
            }),
            (field, json_value()).prop_map(|(f, value)| JsonOp::Add {
                path: JsonOp::path(&f),
                value,
            }),
            (field, field).prop_map(|(a, b)| JsonOp::Rename {
                from: JsonOp::path(&a),
                to: JsonOp::path(&b),
            }),
            nested.prop_map(|f| JsonOp::Drop {
                path: JsonOp::path(&f),
            }),
        ]
    }

    /// A value as users write it, often not as serde_json writes it:
    /// spacing, escapes, `-0`, exponents, trailing zeros, integers past
    /// 64 bits, unsorted objects, next to serde_json's own output.
    fn raw_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            json_value().prop_map(|v| v.to_string()),
            prop::sample::select(vec![
                "-0",
                "0",
                "-0.0",
                "1.50",
                "100.0",
                "1e2",
                "1E+2",
                "-3e-7",
                "0.1",
                "123456789012345678",
                "-123456789012345678",
                "1234567890123456789",
                "-9223372036854775808",
                "18446744073709551615",
                "18446744073709551616",
                r#""\u0041\n""#,
                r#""\/""#,
                r#""caf\u00e9 é""#,
                r#""""#,
                "true",
                "false",
                "null",
                r#"{"b":1,"a":2}"#,
                r#"{"a":1,"a":2}"#,
                "{ }",
                "[ ]",
            ])
            .prop_map(str::to_owned),
            (-1e6f64..1e6).prop_map(|f| f.to_string()),
            any::<i64>().prop_map(|i| i.to_string()),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop::collection::vec((inner, any::<bool>()), 0..3).prop_map(|items| {
                let items: Vec<String> = items
                    .into_iter()
                    .map(|(v, spaced)| if spaced { format!(" {v} ") } else { v })
                    .collect();
                format!("[{}]", items.join(","))
            })
        })
    }

    /// An object as text, with duplicate keys and spacing the tree path
    /// normalizes away.
    fn object_text() -> impl Strategy<Value = String> {
        prop::collection::vec(("[a-d]", raw_value(), any::<bool>()), 0..6).prop_map(|fields| {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v, spaced)| {
                    let sep = if *spaced { " : " } else { ":" };
                    format!("{}{sep}{}", Value::from(k.as_str()), v)
                })
                .collect();
            format!("{{{}}}", body.join(", "))
        })
    }

    /// Objects of one shape (the same keys in the same order, values
    /// differing), with objects of other shapes among them.
    fn stream() -> impl Strategy<Value = Vec<String>> {
        let shaped = prop::collection::vec("[a-d]", 0..6).prop_flat_map(|keys| {
            let n = keys.len();
            prop::collection::vec(prop::collection::vec(raw_value(), n), 1..5).prop_map(
                move |rows| {
                    rows.iter()
                        .map(|values| {
                            let body: Vec<String> = keys
                                .iter()
                                .zip(values)
                                .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
                                .collect();
                            format!("{{{}}}", body.join(","))
                        })
                        .collect::<Vec<_>>()
                },
            )
        });
        prop::collection::vec(
            prop_oneof![shaped, object_text().prop_map(|t| vec![t])],
            1..4,
        )
        .prop_map(|runs| runs.concat())
    }

    proptest! {
        #[test]
        fn prop_one_stage_over_a_stream_matches_tree_path(
            ops in prop::collection::vec(op(), 1..5),
            inputs in stream(),
        ) {
            let mut stage = FastStage::new(&ops).expect("top-level steps take the fast path");
            for input in &inputs {
                let fast = match stage.apply(input.as_bytes()) {
                    Fast::Keep(None) => Fast::Keep(Some(Bytes::copy_from_slice(input.as_bytes()))),
                    other => other,
                };
                prop_assert_eq!(fast, tree(&ops, input), "{}", input);
            }
        }

        #[test]
        fn prop_a_whole_number_filter_decided_on_the_text_decides_as_the_parsed_value(
            field in any::<i64>(),
            near in -2i64..=2,
            constant in prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), Just(0)],
            op in prop::sample::select(vec![
                CompareOp::Eq,
                CompareOp::Ne,
                CompareOp::Lt,
                CompareOp::Le,
                CompareOp::Gt,
                CompareOp::Ge,
                CompareOp::Exists,
            ]),
        ) {
            // Half the fields next to the constant, where the order flips.
            for field in [field, constant.saturating_add(near)] {
                let text = field.to_string();
                let constant = Value::from(constant);
                let parsed: Value = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(
                    compare_text(&text, op, &constant),
                    Some(compare(Some(&parsed), op, &constant)),
                    "{} {:?} {}", text, op, constant
                );
            }
        }

        #[test]
        fn prop_a_decimal_filter_decided_on_the_text_decides_as_the_parsed_value(
            negative in any::<bool>(),
            whole in prop_oneof![0i64..1_000, 0i64..10_000_000, 0i64..1_000_000_000_000_000],
            fraction in "[0-9]{1,15}",
            near in -2i64..=2,
            constant in prop_oneof![-1_000i64..1_000, any::<i64>()],
            op in prop::sample::select(vec![
                CompareOp::Eq,
                CompareOp::Ne,
                CompareOp::Lt,
                CompareOp::Le,
                CompareOp::Gt,
                CompareOp::Ge,
                CompareOp::Exists,
            ]),
        ) {
            let sign = if negative { "-" } else { "" };
            let text = format!("{sign}{whole}.{fraction}");
            let signed = if negative { -whole } else { whole };
            // Half the constants next to the field, where the order flips.
            for constant in [constant, signed.saturating_add(near)] {
                let constant = Value::from(constant);
                let parsed: Value = serde_json::from_str(&text).unwrap();
                let decided = compare_text(&text, op, &constant);
                if let Some(decided) = decided {
                    prop_assert_eq!(
                        decided,
                        compare(Some(&parsed), op, &constant),
                        "{} {:?} {}", text, op, constant
                    );
                }
                // Taken whenever the digits and the constant are short.
                let short = text.trim_start_matches('-').len() <= 16
                    && constant.as_i64().is_some_and(|c| c.unsigned_abs() < 1_000_000_000_000_000);
                prop_assert_eq!(decided.is_some(), short, "{} {}", text, constant);
            }
        }

        #[test]
        fn prop_fast_path_matches_tree_path(
            ops in prop::collection::vec(op(), 1..5),
            input in object_text(),
        ) {
            prop_assert_eq!(fast(&ops, &input), tree(&ops, &input));
        }
    }
}
