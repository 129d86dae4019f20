//! Rows read together: the cells of a chunk of records in one vector,
//! their text in one string, shared by the chunk's rows, so that reading
//! a record allocates nothing of its own and freeing a batch's rows frees
//! a few buffers a chunk.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

/// Where the cells of rows are read to: every row's cells, then each
/// list's items, in one vector, and the text of their strings in one
/// string, addressed by [`Span`]s.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    cells: Vec<Cell>,
    /// UTF-8: every piece pushed is (checked by whoever pushes it).
    text: Vec<u8>,
    /// The items of the lists being read, until each closes: a list's
    /// items then go to `cells` together, whatever lists nest in it.
    pending: Vec<Cell>,
    /// Where its buffers go when it is dropped, for the next arena.
    spares: Option<Arc<Spares>>,
}

/// The buffers of dropped arenas, emptied, kept for the next ones: a
/// batch's chunks then read into memory the previous batch's chunks
/// already had, rather than into buffers grown from empty (each growth a
/// copy, and each new buffer's pages faulted in afresh once the freed
/// ones went back to the system). At most [`SPARES`] are kept, each of at
/// most [`MAX_SPARE_BYTES`], [`MAX_KEPT_BYTES`] in all; a new arena takes
/// the smallest that holds the cells it is asked for, so that a small
/// chunk does not take (and a large one grow) buffers another chunk
/// needs: what is kept is what the chunks read at once held.
#[derive(Debug, Default)]
pub(crate) struct Spares(Mutex<Vec<(Vec<Cell>, Vec<u8>)>>);

/// How many arenas' buffers are kept: a batch being written and one
/// being checked, a chunk per core each, on machines of up to 8 cores.
const SPARES: usize = 16;

/// The largest arena whose buffers are kept (its cells and text).
const MAX_SPARE_BYTES: usize = 16 << 20;

/// The most bytes of buffers kept in all, for one schema.
const MAX_KEPT_BYTES: usize = 32 << 20;

/// The smallest arena whose buffers are kept: smaller ones (a record read
/// alone) cost little to grow again.
const MIN_SPARE_BYTES: usize = 64 << 10;

/// The bytes `cells` and `text` hold.
fn held_bytes(cells: &Vec<Cell>, text: &Vec<u8>) -> usize {
    cells.capacity() * std::mem::size_of::<Cell>() + text.capacity()
}

impl Spares {
    /// An empty arena for about `cells` cells, on the buffers of one
    /// dropped earlier when one is kept (the smallest that holds them,
    /// else the largest); its own buffers come back here when it is
    /// dropped.
    pub(crate) fn arena(self: &Arc<Self>, cells: usize) -> Arena {
        let spare = {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let fitting = kept
                .iter()
                .enumerate()
                .filter(|(_, (c, _))| c.capacity() >= cells)
                .min_by_key(|(_, (c, _))| c.capacity())
                .or_else(|| {
                    kept.iter()
                        .enumerate()
                        .max_by_key(|(_, (c, _))| c.capacity())
                })
                .map(|(i, _)| i);
            fitting.map(|i| kept.swap_remove(i))
        };
        let (cells, text) = spare.unwrap_or_default();
        Arena {
            cells,
            text,
            pending: Vec::new(),
            spares: Some(self.clone()),
        }
    }

    /// How many arenas' buffers are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let Some(spares) = self.spares.take() else {
            return;
        };
        let bytes = held_bytes(&self.cells, &self.text);
        if !(MIN_SPARE_BYTES..=MAX_SPARE_BYTES).contains(&bytes) {
            return;
        }
        let mut cells = std::mem::take(&mut self.cells);
        let mut text = std::mem::take(&mut self.text);
        cells.clear();
        text.clear();
        let mut kept = spares.0.lock().unwrap_or_else(PoisonError::into_inner);
        let in_all: usize = kept.iter().map(|(c, t)| held_bytes(c, t)).sum();
        if kept.len() < SPARES && in_all + bytes <= MAX_KEPT_BYTES {
            kept.push((cells, text));
        }
    }
}

/// A range of an [`Arena`]'s text or cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    end: u32,
}

impl Span {
    fn new(range: Range<usize>) -> Option<Span> {
        Some(Span {
            start: u32::try_from(range.start).ok()?,
            end: u32::try_from(range.end).ok()?,
        })
    }

    fn range(self) -> Range<usize> {
        // u32 to usize: no loss on the targets the crate builds for.
        self.start as usize..self.end as usize
    }
}

/// One column's value in a [`Row`], in its [`Arena`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    /// Missing or null.
    Null,
    /// A boolean column's.
    Bool(bool),
    /// An integer column's, a timestamp's microseconds or a date's days.
    Int(i64),
    /// A float column's.
    Float(f64),
    /// A string column's: its text in the arena's.
    Text(Span),
    /// A struct's, as JSON.
    Nested(Box<Value>),
    /// A list's items, each as the list's item column stores it: cells
    /// of the arena.
    List(Span),
}

/// How far an [`Arena`] was filled, to go back to when a row is not
/// read after all.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    cells: usize,
    text: usize,
}

impl Arena {
    /// The most cells, and bytes of text, one arena takes: its spans
    /// count them in `u32`.
    pub(crate) const ROOM: usize = u32::MAX as usize;

    /// Whether `cells` more cells and `text` more bytes of text fit in
    /// `room` (at most [`ROOM`](Self::ROOM)); an empty arena always
    /// answers yes, as a new one would not take more.
    pub(crate) fn has_room(&self, cells: usize, text: usize, room: usize) -> bool {
        let room = room.min(Self::ROOM);
        let fits = |held: usize, more: usize| held.checked_add(more).is_some_and(|n| n <= room);
        (self.cells.is_empty() && self.text.is_empty())
            || (fits(self.cells.len(), cells) && fits(self.text.len(), text))
    }

    /// The text of `span`, UTF-8.
    pub(crate) fn text(&self, span: Span) -> Option<&[u8]> {
        self.text.get(span.range())
    }

    /// The cells of `span`: a list's items.
    pub(crate) fn items(&self, span: Span) -> Option<&[Cell]> {
        self.cells.get(span.range())
    }

    /// `text`, UTF-8, kept, and the cell of it; `None` past 4 GiB of
    /// text.
    pub(crate) fn push_text(&mut self, text: &[u8]) -> Option<Cell> {
        let start = self.text.len();
        self.text.extend_from_slice(text);
        Span::new(start..self.text.len()).map(Cell::Text)
    }

    /// How far it is filled.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            cells: self.cells.len(),
            text: self.text.len(),
        }
    }

    /// Back to `mark`: what was read since is dropped.
    pub(crate) fn roll_back(&mut self, mark: Mark) {
        self.cells.truncate(mark.cells);
        self.text.truncate(mark.text);
        self.pending.clear();
    }

    /// A new row of `n` null cells: the index of its first.
    pub(crate) fn start_row(&mut self, n: usize) -> usize {
        let start = self.cells.len();
        self.cells.resize(start + n, Cell::Null);
        start
    }

    /// Cell `at` of a row started here set to `cell`.
    pub(crate) fn set(&mut self, at: usize, cell: Cell) -> Option<()> {
        *self.cells.get_mut(at)? = cell;
        Some(())
    }

    /// A list opened: what [`close_list`](Self::close_list) takes.
    pub(crate) fn open_list(&self) -> usize {
        self.pending.len()
    }

    /// The next item of the innermost open list.
    pub(crate) fn push_item(&mut self, cell: Cell) {
        self.pending.push(cell);
    }

    /// The list opened at `opened` closed: its items moved to the cells,
    /// together, and its cell.
    pub(crate) fn close_list(&mut self, opened: usize) -> Option<Cell> {
        if opened > self.pending.len() {
            return None;
        }
        let start = self.cells.len();
        self.cells.extend(self.pending.drain(opened..));
        Span::new(start..self.cells.len()).map(Cell::List)
    }
}

/// One record's value as its columns store it, one [`Cell`] per column of
/// the schema, read from a value that fits it: cells of an [`Arena`]
/// shared with the other rows read with it.
#[derive(Clone)]
pub(crate) struct Row {
    arena: Arc<Arena>,
    start: usize,
    len: usize,
}

impl Row {
    /// The row of `len` cells from `start` in `arena`.
    pub(crate) fn new(arena: Arc<Arena>, start: usize, len: usize) -> Self {
        Row { arena, start, len }
    }

    /// Cell `i`, with the arena its text and items are in.
    pub(crate) fn cell(&self, i: usize) -> Option<(&Arena, &Cell)> {
        if i >= self.len {
            return None;
        }
        let cell = self.arena.cells.get(self.start + i)?;
        Some((&self.arena, cell))
    }

    /// What the arena holds: cells, bytes of text, items of lists not
    /// closed.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize, usize) {
        (
            self.arena.cells.len(),
            self.arena.text.len(),
            self.arena.pending.len(),
        )
    }

    /// The cells, taken out of the arena (to compare and show rows).
    pub(crate) fn plain(&self) -> Vec<Plain> {
        (0..self.len)
            .map(|i| match self.cell(i) {
                Some((arena, cell)) => Plain::of(arena, cell),
                None => Plain::Missing,
            })
            .collect()
    }
}

/// Rows are equal when their cells are, wherever they are kept.
impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        self.plain() == other.plain()
    }
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.plain()).finish()
    }
}

/// A [`Cell`] taken out of its arena. Equal to another when it holds the
/// same: floats by their bits (`-0.0` is not `0.0`, a NaN is itself), as
/// the columns written of them differ.
#[derive(Clone, Debug)]
pub(crate) enum Plain {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Nested(Value),
    List(Vec<Plain>),
    /// A span past its arena's end (never made by a read).
    Missing,
}

impl PartialEq for Plain {
    fn eq(&self, other: &Plain) -> bool {
        match (self, other) {
            (Plain::Null, Plain::Null) | (Plain::Missing, Plain::Missing) => true,
            (Plain::Bool(a), Plain::Bool(b)) => a == b,
            (Plain::Int(a), Plain::Int(b)) => a == b,
            (Plain::Float(a), Plain::Float(b)) => a.to_bits() == b.to_bits(),
            (Plain::Text(a), Plain::Text(b)) => a == b,
            (Plain::Nested(a), Plain::Nested(b)) => a == b,
            (Plain::List(a), Plain::List(b)) => a == b,
            _ => false,
        }
    }
}

impl Plain {
    fn of(arena: &Arena, cell: &Cell) -> Plain {
        match cell {
            Cell::Null => Plain::Null,
            Cell::Bool(b) => Plain::Bool(*b),
            Cell::Int(n) => Plain::Int(*n),
            Cell::Float(f) => Plain::Float(*f),
            Cell::Text(span) => arena
                .text(*span)
                .and_then(|t| String::from_utf8(t.to_vec()).ok())
                .map_or(Plain::Missing, Plain::Text),
            Cell::Nested(value) => Plain::Nested((**value).clone()),
            Cell::List(span) => arena.items(*span).map_or(Plain::Missing, |items| {
                Plain::List(items.iter().map(|c| Plain::of(arena, c)).collect())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ColumnConfig, RowSchema};
    use super::*;

    /// Rows compare their floats by their bits.
    #[test]
    fn plain_cells_compare_floats_by_their_bits() {
        assert_ne!(Plain::Float(0.0), Plain::Float(-0.0));
        assert_eq!(Plain::Float(f64::NAN), Plain::Float(f64::NAN));
        assert_eq!(Plain::Float(1.5), Plain::Float(1.5));
        assert_ne!(
            Plain::List(vec![Plain::Float(0.0)]),
            Plain::List(vec![Plain::Float(-0.0)])
        );
        assert_ne!(Plain::Int(0), Plain::Float(0.0));
        assert_eq!(Plain::Missing, Plain::Missing);
    }

    fn schema() -> RowSchema {
        #[derive(serde::Deserialize)]
        struct Columns {
            columns: Vec<ColumnConfig>,
        }
        let c: Columns = toml::from_str(
            r#"columns = [
                { name = "user", type = "string" },
                { name = "tags", type = "list", item = { name = "tag", type = "string" } },
            ]"#,
        )
        .unwrap();
        RowSchema::new(&c.columns).unwrap()
    }

    /// An arena that holds 4 GiB of text (a batch of a few GiB of strings
    /// read on one thread) has no room for one more byte: its spans
    /// count in `u32`. An empty one always has room.
    #[test]
    fn an_arena_holding_4_gib_of_text_has_no_room_for_more() {
        // Zeroed pages, never touched: no memory is used.
        let mut full = Arena::default();
        full.text = vec![0; Arena::ROOM];
        assert!(!full.has_room(1, 1, Arena::ROOM));
        assert!(!full.has_room(0, 1, usize::MAX));
        assert!(full.has_room(1, 0, Arena::ROOM));
        assert!(Arena::default().has_room(usize::MAX, usize::MAX, 0));
    }

    /// A chunk whose records' text passes what one arena takes goes on
    /// in a new arena: every record that fits gets its row, the one it
    /// gets read alone, and none is refused.
    #[test]
    fn a_chunk_past_one_arenas_room_goes_on_in_another() {
        let schema = schema();
        let texts: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"user":"user-{i:04}","tags":["a\u00e9{i}","b"]}}"#))
            .collect();
        let bytes = || texts.iter().map(|t| t.as_bytes());
        for room in [40, 64, 100, 200] {
            let rows = schema.rows_of_chunk_in(bytes(), room);
            assert_eq!(rows.len(), texts.len());
            let mut arenas = Vec::new();
            for (row, text) in rows.iter().zip(&texts) {
                let row = row.as_ref().unwrap_or_else(|e| panic!("{text}: {e}"));
                let alone = schema.rows_of_chunk(std::iter::once(text.as_bytes()));
                assert_eq!(Some(row), alone.first().and_then(|r| r.as_ref().ok()));
                if !arenas.iter().any(|a| Arc::ptr_eq(a, &row.arena)) {
                    arenas.push(row.arena.clone());
                }
            }
            assert!(arenas.len() > 1, "room {room}: one arena");
            for arena in &arenas {
                assert!(arena.text.len() <= room && arena.cells.len() <= room);
            }
        }
    }

    fn bytes(arena: &Arena) -> usize {
        arena.cells.capacity() * std::mem::size_of::<Cell>() + arena.text.capacity()
    }

    /// Buffers kept for the next chunks hold no more than the chunks
    /// alive at once needed: a big and a small chunk read side by side
    /// (a batch's chunks, a check's and a write's, batches of different
    /// sizes), round after round, must not leave two big chunks' buffers
    /// kept (each round the big chunk takes the small chunk's buffers
    /// and grows them: with 16 sets every one ratchets to the largest
    /// chunk ever read, up to 16 x 64 MiB kept for good).
    #[test]
    fn the_kept_buffers_hold_no_more_than_the_chunks_alive_at_once_needed() {
        let text = "x".repeat(500);
        let values = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!(r#"{{"user":"{i}{text}"}}"#))
                .collect()
        };
        let (big, small) = (values(2000), values(200));
        let read = |s: &RowSchema, v: &[String]| s.rows_of_chunk(v.iter().map(String::as_bytes));
        let arena_bytes = |rows: &[Result<Row, String>]| bytes(&rows[0].as_ref().unwrap().arena);
        // Without kept buffers: what a round holds at its peak.
        let fresh = schema();
        let (b, s) = (read(&fresh, &big), read(&fresh, &small));
        let needed = arena_bytes(&b) + arena_bytes(&s);
        let s_schema = schema();
        for round in 0..4 {
            let b = read(&s_schema, &big);
            let s = read(&s_schema, &small);
            drop(b);
            drop(s);
            let kept: usize = s_schema
                .spares
                .0
                .lock()
                .unwrap()
                .iter()
                .map(|(c, t)| c.capacity() * std::mem::size_of::<Cell>() + t.capacity())
                .sum();
            assert!(
                kept <= needed,
                "round {round}: {kept} bytes kept for chunks that needed {needed} at once"
            );
        }
    }
}
