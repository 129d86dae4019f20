//! A Parquet schema declared in the configuration, and records checked
//! against it and turned into Arrow columns.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, ListArray, StringArray, StructArray};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use chrono::{DateTime, NaiveDate};
use serde::Deserialize;
use serde_json::Value;

use crate::ObjectStoreSinkError;
use crate::key::lookup;

mod fast;
mod rows;

pub(crate) use rows::Row;
use rows::{Arena, Cell, Spares};

/// One column of a declared Parquet schema.
///
/// ```toml
/// columns = [
///     { name = "id", type = "int64", nullable = false },
///     { name = "customer", type = "struct", fields = [
///         { name = "name", type = "string" },
///     ] },
///     { name = "tags", type = "list", item = { name = "item", type = "string" } },
///     { name = "at", type = "timestamp", field = "meta.created_at" },
/// ]
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// The column's name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub column_type: ColumnType,
    /// Whether it may be null (default `true`). A record with the field
    /// missing or null for a column that may not be is refused (dead
    /// letter), never written with a made-up value.
    #[serde(default = "yes")]
    pub nullable: bool,
    /// The record field it comes from, a dotted path within the record's
    /// JSON value (within the parent's value for a struct's field);
    /// default: the column's name.
    #[serde(default)]
    pub field: Option<String>,
    /// A struct's fields.
    #[serde(default)]
    pub fields: Vec<ColumnConfig>,
    /// A list's item (its `name` and `field` are not used).
    #[serde(default)]
    pub item: Option<Box<ColumnConfig>>,
}

fn yes() -> bool {
    true
}

/// The type of a column. A JSON value is taken as it is, never coerced
/// from another type (a string `"1"` does not fit an `int64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// `true` or `false`.
    Boolean,
    /// An integer in the 32-bit range.
    Int32,
    /// An integer in the 64-bit range.
    Int64,
    /// Any JSON number, as a double.
    Float64,
    /// A JSON string.
    String,
    /// An RFC 3339 string, or milliseconds since the Unix epoch; stored as
    /// microseconds in UTC.
    Timestamp,
    /// A `YYYY-MM-DD` string.
    Date,
    /// A JSON object, with `fields`.
    Struct,
    /// A JSON array, of `item`.
    List,
}

/// A checked schema: the Arrow schema and how each column is read.
#[derive(Clone, Debug)]
pub(crate) struct RowSchema {
    columns: Vec<Column>,
    arrow: Arc<Schema>,
    /// Inferred: a record holding data in a field no column names does
    /// not fit (it would be written without it). A declared schema leaves
    /// such fields out by design.
    strict: bool,
    /// The columns by their paths, for the one-pass check
    /// ([`surely_fits`](Self::surely_fits)); `None` where it cannot tell.
    trie: Option<fast::Trie>,
    /// The buffers of the arenas of chunks already written, for the next
    /// chunks (shared by the schema's clones).
    spares: Arc<Spares>,
}

#[derive(Clone, Debug)]
struct Column {
    name: String,
    path: Vec<String>,
    kind: ColumnType,
    nullable: bool,
    children: Vec<Column>,
    field: Arc<Field>,
}

impl RowSchema {
    /// Check `columns` and build the Arrow schema.
    pub(crate) fn new(columns: &[ColumnConfig]) -> Result<Self, ObjectStoreSinkError> {
        if columns.is_empty() {
            return Err(ObjectStoreSinkError::Config(
                "a Parquet encoding needs at least one column".to_owned(),
            ));
        }
        let columns = columns
            .iter()
            .map(|c| Column::new(c, ""))
            .collect::<Result<Vec<_>, _>>()?;
        check_unique(&columns, "")?;
        let arrow = Arc::new(Schema::new(
            columns.iter().map(|c| c.field.clone()).collect::<Fields>(),
        ));
        Ok(RowSchema {
            trie: fast::Trie::of(&columns),
            columns,
            arrow,
            strict: false,
            spares: Arc::default(),
        })
    }

    /// [`new`](Self::new) for columns inferred from a record: a later
    /// record with data in a field they lack does not fit.
    pub(crate) fn inferred(columns: &[ColumnConfig]) -> Result<Self, ObjectStoreSinkError> {
        Ok(RowSchema {
            strict: true,
            ..RowSchema::new(columns)?
        })
    }

    /// The Arrow schema.
    pub(crate) fn arrow(&self) -> Arc<Schema> {
        self.arrow.clone()
    }

    /// Whether `value` fits every column; `Err` says which does not and
    /// why.
    pub(crate) fn check(&self, value: &Value) -> Result<(), String> {
        for column in &self.columns {
            column.check(lookup(value, &column.path))?;
        }
        if self.strict
            && let Some(field) = unnamed_field(value, &self.columns, "")
        {
            return Err(format!(
                "field `{field}` holds data and the schema inferred from the first record has \
                 no column for it: declare `columns` to keep it or to leave it out"
            ));
        }
        Ok(())
    }

    /// The columns of `rows`, each of which passed [`check`](Self::check).
    #[cfg(test)]
    pub(crate) fn columns(&self, rows: &[&Value]) -> Result<Vec<ArrayRef>, String> {
        (0..self.columns.len())
            .map(|i| self.column_of_values(i, rows))
            .collect()
    }

    /// Column `i` of `rows`, values that passed [`check`](Self::check).
    pub(crate) fn column_of_values(&self, i: usize, rows: &[&Value]) -> Result<ArrayRef, String> {
        let column = self
            .columns
            .get(i)
            .ok_or_else(|| format!("the schema has no column {i}"))?;
        let values: Vec<Option<&Value>> =
            rows.iter().map(|row| lookup(row, &column.path)).collect();
        column.build(&values)
    }

    /// The [`Row`] of `value`, which passed [`check`](Self::check).
    #[cfg(test)]
    pub(crate) fn row_of(&self, value: &Value) -> Result<Row, String> {
        let mut arena = Arena::default();
        let start = self.row_into(value, &mut arena)?;
        Ok(Row::new(Arc::new(arena), start, self.columns.len()))
    }

    /// The cells of `value`, which passed [`check`](Self::check), read
    /// into `arena`: the index of the row's first.
    fn row_into(&self, value: &Value, arena: &mut Arena) -> Result<usize, String> {
        let mark = arena.mark();
        let start = arena.start_row(self.columns.len());
        for (i, c) in self.columns.iter().enumerate() {
            let set = c
                .cell_into(lookup(value, &c.path), arena)
                .and_then(|cell| arena.set(start + i, cell).ok_or_else(|| c.changed()));
            if let Err(why) = set {
                arena.roll_back(mark);
                return Err(why);
            }
        }
        Ok(start)
    }

    /// The rows of `values`, records' values read together (one arena
    /// for all, or a new one each time the last is full, each on the
    /// buffers of a dropped chunk's when the schema kept one), or why
    /// each does not fit, in their order: read in one pass over the bytes
    /// where the record surely fits, and through its `Value` otherwise.
    pub(crate) fn rows_of_chunk<'v>(
        &self,
        values: impl ExactSizeIterator<Item = &'v [u8]>,
    ) -> Vec<Result<Row, String>> {
        self.rows_of_chunk_in(values, Arena::ROOM)
    }

    /// [`rows_of_chunk`](Self::rows_of_chunk) with arenas that each take
    /// `room` cells and bytes of text.
    fn rows_of_chunk_in<'v>(
        &self,
        values: impl ExactSizeIterator<Item = &'v [u8]>,
        room: usize,
    ) -> Vec<Result<Row, String>> {
        let n = self.columns.len();
        let mut rows = Vec::with_capacity(values.len());
        let want = n.saturating_mul(values.len());
        let mut arena = self.spares.arena(want);
        // Rows of the current arena: their place in `rows` and their start.
        let mut started: Vec<(usize, usize)> = Vec::new();
        let mut unescaped = Vec::new();
        let seal = |arena: Arena, started: &mut Vec<(usize, usize)>, rows: &mut Vec<_>| {
            let arena = Arc::new(arena);
            for (at, start) in started.drain(..) {
                if let Some(row) = rows.get_mut(at) {
                    *row = Ok(Row::new(arena.clone(), start, n));
                }
            }
        };
        for bytes in values {
            // A record's text is never longer than its bytes, and its
            // cells are at most one a column and one a byte (a list's
            // items): an arena that might not take it all is full.
            if !arena.has_room(n + bytes.len(), bytes.len(), room) {
                seal(
                    std::mem::replace(&mut arena, self.spares.arena(want)),
                    &mut started,
                    &mut rows,
                );
            }
            let start = match self.read_into(bytes, &mut arena, &mut unescaped) {
                Some(start) => Ok(start),
                None => match serde_json::from_slice::<Value>(bytes) {
                    Ok(value) => self
                        .check(&value)
                        .and_then(|()| self.row_into(&value, &mut arena)),
                    Err(_) => Err("the value is not JSON".to_owned()),
                },
            };
            match start {
                Ok(start) => {
                    started.push((rows.len(), start));
                    // In its place until its arena is sealed.
                    rows.push(Err(String::new()));
                }
                Err(why) => rows.push(Err(why)),
            }
        }
        seal(arena, &mut started, &mut rows);
        rows
    }

    /// The columns of `rows`: the same arrays [`columns`](Self::columns)
    /// builds of the values they were read from.
    #[cfg(test)]
    pub(crate) fn columns_of_rows(&self, rows: &[&Row]) -> Result<Vec<ArrayRef>, String> {
        (0..self.columns.len())
            .map(|i| self.column_of_rows(i, rows))
            .collect()
    }

    /// Column `i` of `rows` ([`Row`]s of values that passed
    /// [`check`](Self::check)): the array [`column_of_values`](Self::column_of_values)
    /// builds of the values they were read from. One column at a time, so
    /// that columns can be built on several threads.
    pub(crate) fn column_of_rows(&self, i: usize, rows: &[&Row]) -> Result<ArrayRef, String> {
        let column = self
            .columns
            .get(i)
            .ok_or_else(|| format!("the schema has no column {i}"))?;
        let cells = rows
            .iter()
            .map(|row| row.cell(i).ok_or_else(|| column.changed()))
            .collect::<Result<Vec<(&Arena, &Cell)>, String>>()?;
        column.build_cells(&cells)
    }
}

/// The first field of the object `value` that holds data (not null, `[]`
/// or `{}`) and that no column of `columns` reads, nested ones included,
/// as a dotted name under `within`.
fn unnamed_field(value: &Value, columns: &[Column], within: &str) -> Option<String> {
    let Value::Object(fields) = value else {
        return None;
    };
    for (name, field) in fields {
        let holds_data = match field {
            Value::Null => false,
            Value::Array(items) => !items.is_empty(),
            Value::Object(map) => !map.is_empty(),
            _ => true,
        };
        if !holds_data {
            continue;
        }
        let Some(column) = columns.iter().find(|c| c.path == [name.as_str()]) else {
            return Some(format!("{within}{name}"));
        };
        let found = unnamed_within(column, field, &format!("{within}{name}."));
        if found.is_some() {
            return found;
        }
    }
    None
}

/// [`unnamed_field`] inside `value`, which `column` reads: a struct's
/// fields, and every item of a list, however deep the lists nest.
fn unnamed_within(column: &Column, value: &Value, within: &str) -> Option<String> {
    match (column.kind, value) {
        (ColumnType::Struct, _) => unnamed_field(value, &column.children, within),
        (ColumnType::List, Value::Array(items)) => {
            let item = column.children.first()?;
            items
                .iter()
                .find_map(|value| unnamed_within(item, value, within))
        }
        _ => None,
    }
}

fn check_unique(columns: &[Column], within: &str) -> Result<(), ObjectStoreSinkError> {
    for (i, c) in columns.iter().enumerate() {
        if columns[..i].iter().any(|d| d.name == c.name) {
            return Err(ObjectStoreSinkError::Config(format!(
                "column `{within}{}` is declared twice",
                c.name
            )));
        }
    }
    Ok(())
}

impl Column {
    fn new(config: &ColumnConfig, within: &str) -> Result<Self, ObjectStoreSinkError> {
        let full = format!("{within}{}", config.name);
        let bad = |why: &str| ObjectStoreSinkError::Config(format!("column `{full}`: {why}"));
        if config.name.is_empty() {
            return Err(bad("its name is empty"));
        }
        let source = config.field.as_deref().unwrap_or(&config.name);
        let path: Vec<String> = source.split('.').map(str::to_owned).collect();
        if path.iter().any(String::is_empty) {
            return Err(bad("its `field` is not a dotted path"));
        }
        let mut children = Vec::new();
        let data_type = match config.column_type {
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::String => DataType::Utf8,
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ColumnType::Date => DataType::Date32,
            ColumnType::Struct => {
                if config.fields.is_empty() {
                    return Err(bad("a struct needs `fields`"));
                }
                let prefix = format!("{full}.");
                children = config
                    .fields
                    .iter()
                    .map(|c| Column::new(c, &prefix))
                    .collect::<Result<Vec<_>, _>>()?;
                check_unique(&children, &prefix)?;
                DataType::Struct(children.iter().map(|c| c.field.clone()).collect())
            }
            ColumnType::List => {
                let Some(item) = &config.item else {
                    return Err(bad("a list needs an `item`"));
                };
                let mut item = (**item).clone();
                item.name = "item".to_owned();
                item.field = Some("item".to_owned());
                let item = Column::new(&item, &format!("{full}."))?;
                let field = item.field.clone();
                children.push(item);
                DataType::List(field)
            }
        };
        if config.column_type != ColumnType::Struct && !config.fields.is_empty() {
            return Err(bad("only a struct has `fields`"));
        }
        if config.column_type != ColumnType::List && config.item.is_some() {
            return Err(bad("only a list has an `item`"));
        }
        Ok(Column {
            name: config.name.clone(),
            path,
            kind: config.column_type,
            nullable: config.nullable,
            field: Arc::new(Field::new(&config.name, data_type, config.nullable)),
            children,
        })
    }

    fn check(&self, value: Option<&Value>) -> Result<(), String> {
        let value = match value {
            None | Some(Value::Null) if self.nullable => return Ok(()),
            None | Some(Value::Null) => {
                return Err(format!(
                    "column `{}` may not be null and field `{}` is {}",
                    self.name,
                    self.path.join("."),
                    if value.is_none() { "missing" } else { "null" }
                ));
            }
            Some(v) => v,
        };
        let fits = match self.kind {
            ColumnType::Boolean => value.is_boolean(),
            ColumnType::Int32 => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            ColumnType::Int64 => value.as_i64().is_some(),
            ColumnType::Float64 => value.is_number(),
            ColumnType::String => value.is_string(),
            ColumnType::Timestamp => timestamp_micros(value).is_some(),
            ColumnType::Date => date_days(value).is_some(),
            ColumnType::Struct => {
                let Value::Object(_) = value else {
                    return Err(self.mismatch(value));
                };
                for child in &self.children {
                    child.check(lookup(value, &child.path))?;
                }
                true
            }
            ColumnType::List => {
                let Value::Array(items) = value else {
                    return Err(self.mismatch(value));
                };
                if let Some(item) = self.children.first() {
                    for v in items {
                        item.check(Some(v))?;
                    }
                }
                true
            }
        };
        if fits {
            Ok(())
        } else {
            Err(self.mismatch(value))
        }
    }

    /// What a value that passed [`check`](Self::check) stores as, its
    /// text and items kept in `arena`.
    fn cell_into(&self, value: Option<&Value>, arena: &mut Arena) -> Result<Cell, String> {
        let value = match value {
            None | Some(Value::Null) => return Ok(Cell::Null),
            Some(value) => value,
        };
        let cell = match self.kind {
            ColumnType::Boolean => value.as_bool().map(Cell::Bool),
            ColumnType::Int32 => value
                .as_i64()
                .filter(|n| i32::try_from(*n).is_ok())
                .map(Cell::Int),
            ColumnType::Int64 => value.as_i64().map(Cell::Int),
            ColumnType::Float64 => value.as_f64().map(Cell::Float),
            ColumnType::Date => date_days(value).map(|d| Cell::Int(i64::from(d))),
            ColumnType::Timestamp => timestamp_micros(value).map(Cell::Int),
            ColumnType::String => value.as_str().and_then(|s| arena.push_text(s.as_bytes())),
            ColumnType::Struct => Some(Cell::Nested(Box::new(value.clone()))),
            ColumnType::List => {
                let (Value::Array(items), Some(item)) = (value, self.children.first()) else {
                    return Err(self.changed());
                };
                let opened = arena.open_list();
                for v in items {
                    let cell = item.cell_into(Some(v), arena)?;
                    arena.push_item(cell);
                }
                arena.close_list(opened)
            }
        };
        cell.ok_or_else(|| self.changed())
    }

    fn changed(&self) -> String {
        format!(
            "column `{}`: a value changed type after its check",
            self.name
        )
    }

    /// The column of `cells` ([`cell_into`](Self::cell_into)s of this
    /// column, each with the arena it is in): the array
    /// [`build`](Self::build) makes of the values they were read from.
    fn build_cells(&self, cells: &[(&Arena, &Cell)]) -> Result<ArrayRef, String> {
        macro_rules! scalar {
            ($builder:expr, $variant:ident, $get:expr) => {{
                let mut b = $builder;
                for (_, cell) in cells {
                    match cell {
                        Cell::Null => b.append_null(),
                        Cell::$variant(v) => b.append_value($get(v).ok_or_else(|| self.changed())?),
                        _ => return Err(self.changed()),
                    }
                }
                Arc::new(b.finish()) as ArrayRef
            }};
        }
        let n = cells.len();
        Ok(match self.kind {
            ColumnType::Boolean => {
                scalar!(BooleanBuilder::with_capacity(n), Bool, |v: &bool| Some(*v))
            }
            ColumnType::Int32 => scalar!(Int32Builder::with_capacity(n), Int, |v: &i64| {
                i32::try_from(*v).ok()
            }),
            ColumnType::Int64 => scalar!(Int64Builder::with_capacity(n), Int, |v: &i64| Some(*v)),
            ColumnType::Float64 => {
                scalar!(Float64Builder::with_capacity(n), Float, |v: &f64| Some(*v))
            }
            ColumnType::Date => scalar!(Date32Builder::with_capacity(n), Int, |v: &i64| {
                i32::try_from(*v).ok()
            }),
            ColumnType::Timestamp => scalar!(
                TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC"),
                Int,
                |v: &i64| Some(*v)
            ),
            // The texts copied into one buffer, as `StringBuilder` lays
            // them out (no null buffer where none is null), checked as
            // UTF-8 once, by `StringArray::try_new`.
            ColumnType::String => {
                let mut offsets = Vec::with_capacity(n + 1);
                offsets.push(0i32);
                let mut valid = Vec::with_capacity(n);
                let mut values = Vec::new();
                for (arena, cell) in cells {
                    match cell {
                        Cell::Null => valid.push(false),
                        Cell::Text(span) => {
                            values.extend_from_slice(
                                arena.text(*span).ok_or_else(|| self.changed())?,
                            );
                            valid.push(true);
                        }
                        _ => return Err(self.changed()),
                    }
                    offsets.push(
                        i32::try_from(values.len()).map_err(|_| {
                            format!("column `{}`: more than 2 GiB of text", self.name)
                        })?,
                    );
                }
                let nulls = Some(NullBuffer::from(valid)).filter(|n| n.null_count() > 0);
                Arc::new(
                    StringArray::try_new(
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        Buffer::from_vec(values),
                        nulls,
                    )
                    .map_err(|e| format!("column `{}`: {e}", self.name))?,
                )
            }
            ColumnType::Struct => {
                let values = cells
                    .iter()
                    .map(|(_, cell)| match cell {
                        Cell::Null => Ok(None),
                        Cell::Nested(v) => Ok(Some(&**v)),
                        _ => Err(self.changed()),
                    })
                    .collect::<Result<Vec<Option<&Value>>, String>>()?;
                self.build(&values)?
            }
            // As `build` makes a list of values: a null where the record
            // has none, the items' column built of every item in turn.
            ColumnType::List => {
                let item = self.children.first().ok_or_else(|| self.changed())?;
                let mut lengths = Vec::with_capacity(n);
                let mut valid = Vec::with_capacity(n);
                let mut items: Vec<(&Arena, &Cell)> = Vec::new();
                for (arena, cell) in cells {
                    match cell {
                        Cell::Null => {
                            lengths.push(0);
                            valid.push(false);
                        }
                        Cell::List(span) => {
                            let list = arena.items(*span).ok_or_else(|| self.changed())?;
                            lengths.push(list.len());
                            valid.push(true);
                            items.extend(list.iter().map(|c| (*arena, c)));
                        }
                        _ => return Err(self.changed()),
                    }
                }
                let child = item.build_cells(&items)?;
                Arc::new(
                    ListArray::try_new(
                        item.field.clone(),
                        OffsetBuffer::from_lengths(lengths),
                        child,
                        Some(NullBuffer::from(valid)),
                    )
                    .map_err(|e| format!("column `{}`: {e}", self.name))?,
                )
            }
        })
    }

    fn mismatch(&self, value: &Value) -> String {
        let mut shown = value.to_string();
        if shown.len() > 64 {
            let mut cut = 61;
            while !shown.is_char_boundary(cut) {
                cut -= 1;
            }
            shown.truncate(cut);
            shown.push_str("...");
        }
        format!(
            "field `{}` does not fit column `{}` ({:?}): {shown}",
            self.path.join("."),
            self.name,
            self.kind
        )
    }

    /// The column of `values` (checked already: a value that does not fit
    /// is an error, never a null).
    fn build(&self, values: &[Option<&Value>]) -> Result<ArrayRef, String> {
        fn present<'v>(v: &Option<&'v Value>) -> Option<&'v Value> {
            v.filter(|v| !v.is_null())
        }
        let wrong = || {
            format!(
                "column `{}`: a value changed type after its check",
                self.name
            )
        };
        macro_rules! scalar {
            ($builder:ty, $get:expr) => {{
                let mut b = <$builder>::with_capacity(values.len());
                for v in values {
                    match present(v) {
                        None => b.append_null(),
                        Some(v) => b.append_value($get(v).ok_or_else(wrong)?),
                    }
                }
                Arc::new(b.finish()) as ArrayRef
            }};
        }
        Ok(match self.kind {
            ColumnType::Boolean => scalar!(BooleanBuilder, |v: &Value| v.as_bool()),
            ColumnType::Int32 => scalar!(Int32Builder, |v: &Value| v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())),
            ColumnType::Int64 => scalar!(Int64Builder, |v: &Value| v.as_i64()),
            ColumnType::Float64 => scalar!(Float64Builder, |v: &Value| v.as_f64()),
            ColumnType::Date => scalar!(Date32Builder, date_days),
            ColumnType::String => {
                let mut b = StringBuilder::with_capacity(values.len(), values.len() * 16);
                for v in values {
                    match present(v) {
                        None => b.append_null(),
                        Some(v) => b.append_value(v.as_str().ok_or_else(wrong)?),
                    }
                }
                Arc::new(b.finish())
            }
            ColumnType::Timestamp => {
                let mut b =
                    TimestampMicrosecondBuilder::with_capacity(values.len()).with_timezone("UTC");
                for v in values {
                    match present(v) {
                        None => b.append_null(),
                        Some(v) => b.append_value(timestamp_micros(v).ok_or_else(wrong)?),
                    }
                }
                Arc::new(b.finish())
            }
            ColumnType::Struct => {
                let nulls = NullBuffer::from(
                    values
                        .iter()
                        .map(|v| present(v).is_some())
                        .collect::<Vec<_>>(),
                );
                let children = self
                    .children
                    .iter()
                    .map(|c| {
                        let vs: Vec<Option<&Value>> = values
                            .iter()
                            .map(|v| present(v).and_then(|v| lookup(v, &c.path)))
                            .collect();
                        c.build(&vs)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let fields: Fields = self.children.iter().map(|c| c.field.clone()).collect();
                Arc::new(
                    StructArray::try_new(fields, children, Some(nulls))
                        .map_err(|e| format!("column `{}`: {e}", self.name))?,
                )
            }
            ColumnType::List => {
                let item = self.children.first().ok_or_else(wrong)?;
                let mut lengths = Vec::with_capacity(values.len());
                let mut items: Vec<Option<&Value>> = Vec::new();
                for v in values {
                    match present(v).and_then(Value::as_array) {
                        Some(array) => {
                            lengths.push(array.len());
                            items.extend(array.iter().map(Some));
                        }
                        None => lengths.push(0),
                    }
                }
                let nulls = NullBuffer::from(
                    values
                        .iter()
                        .map(|v| present(v).is_some())
                        .collect::<Vec<_>>(),
                );
                let child = item.build(&items)?;
                Arc::new(
                    ListArray::try_new(
                        item.field.clone(),
                        OffsetBuffer::from_lengths(lengths),
                        child,
                        Some(nulls),
                    )
                    .map_err(|e| format!("column `{}`: {e}", self.name))?,
                )
            }
        })
    }
}

/// The columns of `record`'s fields, as the `columns` option describes
/// the inference (`Err` when the record is not an object with at least one
/// usable field).
pub(crate) fn infer(record: &Value) -> Result<Vec<ColumnConfig>, String> {
    let Value::Object(fields) = record else {
        return Err(
            "the schema is inferred from a JSON object, and the first record is not one".to_owned(),
        );
    };
    let columns: Vec<ColumnConfig> = fields
        .iter()
        .filter(|(name, _)| !name.is_empty() && !name.contains('.'))
        .filter_map(|(name, value)| infer_column(name, value))
        .collect();
    if columns.is_empty() {
        return Err("the first record has no field a column can be inferred from".to_owned());
    }
    Ok(columns)
}

fn infer_column(name: &str, value: &Value) -> Option<ColumnConfig> {
    let column = |column_type| ColumnConfig {
        name: name.to_owned(),
        column_type,
        nullable: true,
        field: None,
        fields: Vec::new(),
        item: None,
    };
    Some(match value {
        Value::Bool(_) => column(ColumnType::Boolean),
        Value::Number(n) if n.as_i64().is_some() => column(ColumnType::Int64),
        Value::Number(_) => column(ColumnType::Float64),
        Value::String(_) | Value::Null => column(ColumnType::String),
        Value::Object(_) => {
            let fields = infer(value).ok()?;
            ColumnConfig {
                fields,
                ..column(ColumnType::Struct)
            }
        }
        Value::Array(items) => {
            let item = items
                .iter()
                .find(|v| !v.is_null())
                .and_then(|v| infer_column("item", v))?;
            ColumnConfig {
                item: Some(Box::new(item)),
                ..column(ColumnType::List)
            }
        }
    })
}

/// Microseconds since the Unix epoch of an RFC 3339 string or an integer
/// of milliseconds.
pub(crate) fn timestamp_micros(value: &Value) -> Option<i64> {
    match value {
        Value::String(s) => rfc3339_micros(s),
        Value::Number(n) => n.as_i64().and_then(millis_micros),
        _ => None,
    }
}

/// Microseconds since the Unix epoch of an RFC 3339 string.
fn rfc3339_micros(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_micros())
}

/// Microseconds of milliseconds since the Unix epoch.
fn millis_micros(ms: i64) -> Option<i64> {
    ms.checked_mul(1000)
}

/// Days since the Unix epoch of a `YYYY-MM-DD` string.
fn date_days(value: &Value) -> Option<i32> {
    days_of(value.as_str()?)
}

/// Days since the Unix epoch of `YYYY-MM-DD`.
fn days_of(text: &str) -> Option<i32> {
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((date - epoch).num_days()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    fn schema(toml_columns: &str) -> RowSchema {
        #[derive(Deserialize)]
        struct Columns {
            columns: Vec<ColumnConfig>,
        }
        let c: Columns = toml::from_str(toml_columns).unwrap();
        RowSchema::new(&c.columns).unwrap()
    }

    const NESTED: &str = r#"columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "who", type = "struct", field = "customer", fields = [
            { name = "name", type = "string", nullable = false },
        ] },
        { name = "tags", type = "list", item = { name = "x", type = "int32" } },
        { name = "at", type = "timestamp" },
    ]"#;

    #[test]
    fn a_chunk_reads_into_the_buffers_of_a_chunk_dropped_before_and_gives_the_same_rows() {
        let s = schema(
            r#"columns = [
                { name = "id", type = "int64", nullable = false },
                { name = "user", type = "string" },
                { name = "tags", type = "list", item = { name = "tag", type = "string" } },
            ]"#,
        );
        let values: Vec<String> = (0..5000)
            .map(|i| format!(r#"{{"id":{i},"user":"user-{i}","tags":["a{i}","b"]}}"#))
            .collect();
        let read = |s: &RowSchema| s.rows_of_chunk(values.iter().map(String::as_bytes));
        let first = read(&s);
        assert_eq!(s.spares.kept(), 0);
        let plain: Vec<_> = first.iter().map(|r| r.as_ref().unwrap().plain()).collect();
        drop(first);
        // The chunk's arena went back with the last of its rows.
        assert_eq!(s.spares.kept(), 1);
        let second = read(&s);
        assert_eq!(s.spares.kept(), 0, "the second chunk took the buffers");
        let again: Vec<_> = second.iter().map(|r| r.as_ref().unwrap().plain()).collect();
        assert_eq!(again, plain);
        // A small chunk takes them too, and gives them back.
        drop(second);
        let small = s.rows_of_chunk(values.iter().take(3).map(String::as_bytes));
        drop(small);
        assert_eq!(s.spares.kept(), 1);
    }

    #[test]
    fn values_that_do_not_fit_are_refused_with_the_column_never_nulled() {
        let s = schema(NESTED);
        let ok = serde_json::json!({"id": 1, "customer": {"name": "a"}, "tags": [1, null], "at": "2026-01-01T00:00:00Z"});
        s.check(&ok).unwrap();
        for (bad, column) in [
            (serde_json::json!({"customer": null}), "`id`"),
            (serde_json::json!({"id": "1"}), "`id`"),
            (serde_json::json!({"id": 1.5}), "`id`"),
            (serde_json::json!({"id": 1, "customer": {}}), "`name`"),
            (serde_json::json!({"id": 1, "tags": [1, "2"]}), "`item`"),
            (
                serde_json::json!({"id": 1, "tags": [4_000_000_000_i64]}),
                "`item`",
            ),
            (serde_json::json!({"id": 1, "at": "yesterday"}), "`at`"),
        ] {
            let err = s.check(&bad).unwrap_err();
            assert!(err.contains(column), "{bad}: {err}");
        }
    }

    #[test]
    fn nested_columns_build_with_nulls_where_the_record_has_none() {
        let s = schema(NESTED);
        let rows = [
            serde_json::json!({"id": 1, "customer": {"name": "a"}, "tags": [1, 2], "at": 1000}),
            serde_json::json!({"id": 2}),
        ];
        let refs: Vec<&Value> = rows.iter().collect();
        let columns = s.columns(&refs).unwrap();
        assert_eq!(columns.len(), 4);
        assert_eq!(columns[1].null_count(), 1);
        assert_eq!(columns[2].null_count(), 1);
        let batch = arrow_array::RecordBatch::try_new(s.arrow(), columns).unwrap();
        assert_eq!(batch.num_rows(), 2);
    }

    #[test]
    fn an_inferred_schema_takes_every_usable_field_of_the_first_record() {
        let first = serde_json::json!({
            "id": 1, "price": 2.5, "ok": true, "name": "a", "note": null,
            "who": {"n": "x", "tags": [null, 3]}, "empty": [], "a.b": 1,
        });
        let s = RowSchema::inferred(&infer(&first).unwrap()).unwrap();
        let shown = s.arrow().to_string();
        for column in [
            r#""id": nullable Int64"#,
            r#""price": nullable Float64"#,
            r#""ok": nullable Boolean"#,
            r#""name": nullable Utf8"#,
            r#""note": nullable Utf8"#,
            r#""who": nullable Struct("n": Utf8, "tags": List(Int64))"#,
        ] {
            assert!(shown.contains(column), "{column} in {shown}");
        }
        assert!(
            !shown.contains("empty") && !shown.contains("a.b"),
            "{shown}"
        );
        // `a.b` holds data no inferred column can: the record does not
        // fit (dead-lettered), never written without it.
        assert!(s.check(&first).unwrap_err().contains("`a.b`"));
        let mut fits = first.clone();
        fits.as_object_mut().unwrap().remove("a.b");
        s.check(&fits).unwrap();
        // A later record of another type does not fit: never nulled.
        assert!(s.check(&serde_json::json!({"id": "one"})).is_err());
        assert!(infer(&serde_json::json!([1])).is_err());
        assert!(infer(&serde_json::json!({"e": {}})).is_err());
    }

    #[test]
    fn a_later_record_with_a_field_the_inferred_schema_lacks_does_not_fit() {
        let first = serde_json::json!({"id": 1, "who": {"n": "x"}, "items": [{"sku": "a"}]});
        let s = RowSchema::inferred(&infer(&first).unwrap()).unwrap();
        s.check(&first).unwrap();
        for (later, field) in [
            (serde_json::json!({"id": 2, "extra": 5}), "extra"),
            (
                serde_json::json!({"id": 2, "who": {"n": "y", "age": 3}}),
                "who.age",
            ),
            (
                serde_json::json!({"id": 2, "items": [{"sku": "b", "qty": 2}]}),
                "items.qty",
            ),
        ] {
            let why = s.check(&later).unwrap_err();
            assert!(why.contains(&format!("`{field}`")), "{later}: {why}");
        }
        // Lists of lists of objects are read to the bottom.
        let deep =
            RowSchema::inferred(&infer(&serde_json::json!({"m": [[{"a": 1}]]})).unwrap()).unwrap();
        let why = deep
            .check(&serde_json::json!({"m": [[{"a": 1, "b": 2}]]}))
            .unwrap_err();
        assert!(why.contains("`m.b`"), "{why}");
        // Fields that hold nothing (null, [], {}) lose nothing.
        s.check(&serde_json::json!({"id": 3, "gone": null, "none": [], "nil": {}}))
            .unwrap();
        // A declared schema leaves what it does not name out, by design.
        let declared = RowSchema::new(&infer(&first).unwrap()).unwrap();
        declared
            .check(&serde_json::json!({"id": 2, "extra": 5}))
            .unwrap();
    }

    #[test]
    fn malformed_declarations_are_refused() {
        #[derive(Deserialize)]
        struct Columns {
            columns: Vec<ColumnConfig>,
        }
        for bad in [
            "columns = []",
            "columns = [{ name = \"s\", type = \"struct\" }]",
            "columns = [{ name = \"l\", type = \"list\" }]",
            "columns = [{ name = \"a\", type = \"int64\" }, { name = \"a\", type = \"string\" }]",
            "columns = [{ name = \"a\", type = \"int64\", item = { name = \"i\", type = \"int64\" } }]",
        ] {
            let c: Columns = toml::from_str(bad).unwrap();
            assert!(RowSchema::new(&c.columns).is_err(), "{bad}");
        }
    }
}
