//! A record's fit to a declared schema, judged in one pass over its bytes
//! without building a [`Value`]: the check a sink's own encoder makes of
//! every record before the write.
//!
//! It only ever says "fits" where [`RowSchema::check`] would: a record it
//! is not sure of (a wrong type, a null or missing value for a column
//! that is not nullable, a key given twice on the way to a column, a
//! path through an array, bytes that are not JSON) is left to the check
//! over [`Value`], which also words the reason.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use super::{Cell, Column, ColumnType, Row, RowSchema};

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
}

impl RowSchema {
    /// Whether `bytes`, a record's value, surely fits: `true` only where
    /// [`check`](Self::check) of its [`Value`] says it does. `false`
    /// says nothing: ask `check`.
    pub(crate) fn surely_fits(&self, bytes: &[u8]) -> bool {
        self.one_pass(bytes, None)
    }

    /// The [`Row`] of `bytes` when they surely fit (see
    /// [`surely_fits`](Self::surely_fits)): the row
    /// [`row_of`](Self::row_of) makes of their [`Value`]. `None` says
    /// nothing: read the `Value`, check it, and take its row.
    pub(crate) fn read_row(&self, bytes: &[u8]) -> Option<Row> {
        let mut cells = vec![Cell::Null; self.columns.len()];
        self.one_pass(bytes, Some(&mut cells)).then_some(Row(cells))
    }

    /// Judge `bytes` in one pass, storing each column's cell in `cells`
    /// (in the columns' order) if given.
    fn one_pass(&self, bytes: &[u8], cells: Option<&mut Vec<Cell>>) -> bool {
        let Some(trie) = &self.trie else {
            return false;
        };
        if self.strict || std::str::from_utf8(bytes).is_err() {
            return false;
        }
        let mut reader = serde_json::Deserializer::from_slice(bytes);
        let seed = ObjectSeed {
            trie,
            columns: &self.columns,
            cells,
        };
        seed.deserialize(&mut reader).is_ok() && reader.end().is_ok()
    }
}

/// Not sure: the one-pass check stops, and the check over [`Value`]
/// decides.
fn unsure<E: de::Error>() -> E {
    E::custom("")
}

/// An object whose fields hold `columns` (as `trie` leads to them); its
/// columns it lacks must be nullable. Each column's cell goes to `cells`,
/// if given.
struct ObjectSeed<'s, 'm> {
    trie: &'s Trie,
    columns: &'s [Column],
    cells: Option<&'m mut Vec<Cell>>,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let mut seen = 0u64;
        d.deserialize_any(InnerVisitor {
            trie: self.trie,
            columns: self.columns,
            seen: &mut seen,
            cells: self.cells,
        })?;
        missing_ones_nullable(self.columns, seen)
    }
}

/// Whether every one of `columns` not marked in `seen` may be null;
/// else not sure (the check over `Value` names the one missing).
fn missing_ones_nullable<E: de::Error>(columns: &[Column], seen: u64) -> Result<(), E> {
    if columns
        .iter()
        .enumerate()
        .all(|(i, c)| seen & (1 << i) != 0 || c.nullable)
    {
        Ok(())
    } else {
        Err(unsure())
    }
}

/// The fields of one object on the way to columns: each column found is
/// checked and marked in `seen`, and its cell stored in `cells` if given.
struct InnerVisitor<'s, 'm> {
    trie: &'s Trie,
    columns: &'s [Column],
    seen: &'m mut u64,
    cells: Option<&'m mut Vec<Cell>>,
}

impl<'de> Visitor<'de> for InnerVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        // The entries of this object met so far: a key given twice is
        // left to the check over `Value` (where the last one counts).
        let mut met = 0u64;
        while let Some(at) = map.next_key_seed(KeySeed { trie: self.trie })? {
            let Some(k) = at else {
                map.next_value_seed(Skip)?;
                continue;
            };
            if met & (1 << k) != 0 {
                return Err(unsure());
            }
            met |= 1 << k;
            match self.trie.entries.get(k).map(|(_, slot)| slot) {
                Some(Slot::Column(i)) => {
                    let column = self.columns.get(*i).ok_or_else(unsure)?;
                    let out = match self.cells.as_deref_mut() {
                        Some(cells) => Some(cells.get_mut(*i).ok_or_else(unsure)?),
                        None => None,
                    };
                    map.next_value_seed(ColumnSeed { column, out })?;
                    *self.seen |= 1 << i;
                }
                Some(Slot::Inner(trie)) => map.next_value_seed(InnerVisitor {
                    trie,
                    columns: self.columns,
                    seen: &mut *self.seen,
                    cells: self.cells.as_deref_mut(),
                })?,
                None => return Err(unsure()),
            }
        }
        Ok(())
    }
}

/// An object further down a path, whose columns count in the outer
/// object's `seen`.
impl<'de> DeserializeSeed<'de> for InnerVisitor<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// A value no column reads, read through as the `Value` parse reads it
/// (string escapes, numbers' range, the nesting depth) but not kept.
/// `IgnoredAny` would not do: serde_json skips it without those checks.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

/// A key: the index of its entry in `trie`, or `None` for a field no
/// column reads.
struct KeySeed<'s> {
    trie: &'s Trie,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.trie.entries.iter().position(|(s, _)| s == key))
    }
}

/// One column's value: judged by [`Column::check`] on the scalar itself,
/// field by field for a struct, item by item for a list; its cell stored
/// in `out`, if given (a struct's read whole, as JSON; a list's item by
/// item).
struct ColumnSeed<'s, 'm> {
    column: &'s Column,
    out: Option<&'m mut Cell>,
}

impl<'de> DeserializeSeed<'de> for ColumnSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match (self.out, self.column.kind) {
            (Some(out), ColumnType::Struct) => {
                let value = Value::deserialize(d)?;
                self.column.check(Some(&value)).map_err(|_| unsure())?;
                *out = self.column.cell(Some(value)).map_err(|_| unsure())?;
                Ok(())
            }
            (out, _) => d.deserialize_any(ColumnSeed {
                column: self.column,
                out,
            }),
        }
    }
}

impl ColumnSeed<'_, '_> {
    fn scalar<E: de::Error>(self, value: Value) -> Result<(), E> {
        self.column.check(Some(&value)).map_err(|_| unsure())?;
        if let Some(out) = self.out {
            *out = self.column.cell(Some(value)).map_err(|_| unsure())?;
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for ColumnSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a column's value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(Value::Number(Number::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(Value::Number(Number::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.scalar(Value::Number(Number::from_f64(v).ok_or_else(unsure)?))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match self.column.kind {
            // Any string is one: no copy to tell.
            ColumnType::String => {
                if let Some(out) = self.out {
                    *out = Cell::Text(v.to_owned());
                }
                Ok(())
            }
            _ => self.scalar(Value::String(v.to_owned())),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let (ColumnType::Struct, Some(trie)) = (self.column.kind, &self.column.trie) else {
            return Err(unsure());
        };
        let mut seen = 0u64;
        InnerVisitor {
            trie,
            columns: &self.column.children,
            seen: &mut seen,
            cells: None,
        }
        .visit_map(map)?;
        missing_ones_nullable(&self.column.children, seen)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (ColumnType::List, Some(item)) = (self.column.kind, self.column.children.first())
        else {
            return Err(unsure());
        };
        let Some(out) = self.out else {
            while seq
                .next_element_seed(ColumnSeed {
                    column: item,
                    out: None,
                })?
                .is_some()
            {}
            return Ok(());
        };
        // Each item read as its column stores it: no `Value` of the list.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            let mut cell = Cell::Null;
            let read = seq.next_element_seed(ColumnSeed {
                column: item,
                out: Some(&mut cell),
            })?;
            if read.is_none() {
                break;
            }
            items.push(cell);
        }
        *out = Cell::List(items);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use proptest::prelude::*;

    use super::super::ColumnConfig;
    use super::*;

    fn schema(toml_columns: &str) -> RowSchema {
        #[derive(serde::Deserialize)]
        struct Columns {
            columns: Vec<ColumnConfig>,
        }
        let c: Columns = toml::from_str(toml_columns).unwrap();
        RowSchema::new(&c.columns).unwrap()
    }

    /// Every column type, nested structs and lists, paths of several
    /// segments inside and outside a struct, nullable and not.
    const WIDE: &str = r#"columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "user", type = "string" },
        { name = "amount", type = "float64" },
        { name = "ts", type = "timestamp" },
        { name = "d", type = "date" },
        { name = "flag", type = "boolean" },
        { name = "small", type = "int32" },
        { name = "deep", type = "int64", field = "meta.inner.v", nullable = false },
        { name = "customer", type = "struct", fields = [
            { name = "name", type = "string", nullable = false },
            { name = "region", type = "string", field = "address.region" },
        ] },
        { name = "tags", type = "list", item = { name = "tag", type = "string" } },
        { name = "items", type = "list", item = { name = "item", type = "struct", nullable = false, fields = [
            { name = "sku", type = "string", nullable = false },
            { name = "qty", type = "int32" },
        ] } },
    ]"#;

    /// The same columns, every one nullable.
    fn loose() -> String {
        WIDE.replace("nullable = false", "nullable = true")
    }

    /// A JSON text whose objects may give a key twice or escape it.
    #[derive(Clone, Debug)]
    enum Node {
        Null,
        Bool(bool),
        Int(i64),
        Big(u64),
        Float(f64),
        Text(String),
        /// JSON-looking text as it is: what only a full parse refuses.
        Raw(String),
        List(Vec<Node>),
        Object(Vec<(String, bool, Node)>),
    }

    impl Node {
        fn write(&self, out: &mut String) {
            match self {
                Node::Null => out.push_str("null"),
                Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Node::Int(n) => out.push_str(&n.to_string()),
                Node::Big(n) => out.push_str(&n.to_string()),
                Node::Float(f) => out.push_str(&serde_json::to_string(f).unwrap()),
                Node::Text(s) => out.push_str(&serde_json::to_string(s).unwrap()),
                Node::Raw(s) => out.push_str(s),
                Node::List(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        item.write(out);
                    }
                    out.push(']');
                }
                Node::Object(fields) => {
                    out.push('{');
                    for (i, (key, escaped, value)) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        if *escaped {
                            // The same key, its first character escaped.
                            let mut chars = key.chars();
                            let first = chars.next().map_or(0, u32::from);
                            out.push_str(&format!("\"\\u{first:04x}{}\"", chars.as_str()));
                        } else {
                            out.push_str(&serde_json::to_string(key).unwrap());
                        }
                        out.push(':');
                        value.write(out);
                    }
                    out.push('}');
                }
            }
        }
    }

    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "id", "user", "amount", "ts", "d", "flag", "small", "meta", "inner", "v", "customer",
            "name", "address", "region", "tags", "items", "sku", "qty", "0", "other",
        ])
        .prop_map(str::to_owned)
    }

    fn scalar() -> impl Strategy<Value = Node> {
        prop_oneof![
            prop::sample::select(vec![
                r#""\ud800""#.to_owned(),
                r#""a\udc00""#.to_owned(),
                r#""\ud83d\ude00""#.to_owned(),
                "1e400".to_owned(),
                "-1e400".to_owned(),
                "18446744073709551616".to_owned(),
                "1E-400".to_owned(),
                format!("{}{}", "[".repeat(130), "]".repeat(130)),
            ])
            .prop_map(Node::Raw),
            Just(Node::Null),
            any::<bool>().prop_map(Node::Bool),
            prop_oneof![
                Just(0i64),
                Just(-1),
                Just(i64::from(i32::MAX)),
                Just(i64::from(i32::MAX) + 1),
                Just(i64::from(i32::MIN) - 1),
                Just(i64::MAX),
                Just(1_733_500_000_000),
                any::<i64>(),
            ]
            .prop_map(Node::Int),
            prop_oneof![Just(u64::MAX), Just(1u64 << 63)].prop_map(Node::Big),
            prop_oneof![Just(1.5f64), Just(-0.0), Just(1e300), any::<f64>()]
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Node::Float),
            prop::sample::select(vec![
                "",
                "x",
                "2026-12-06T10:00:00Z",
                "2026-12-06T10:00:00.123+02:00",
                "2026-13-06T10:00:00Z",
                "2026-12-06",
                "2026-02-30",
                "\u{e9}t\u{e9}",
                "line\nbreak \"quoted\"",
                " padded ",
            ])
            .prop_map(|s| Node::Text(s.to_owned())),
        ]
    }

    fn node() -> impl Strategy<Value = Node> {
        scalar().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Node::List),
                prop::collection::vec((key(), prop::bool::weighted(0.1), inner), 0..7)
                    .prop_map(Node::Object),
            ]
        })
    }

    /// A record shaped like the schema's, most fields right, some not.
    fn record() -> impl Strategy<Value = Node> {
        let field = |name: &'static str, value: BoxedStrategy<Node>| {
            (
                prop::bool::weighted(0.93),
                prop::bool::weighted(0.05),
                value,
            )
                .prop_map(move |(present, escaped, v)| {
                    present.then(|| (name.to_owned(), escaped, v))
                })
        };
        let or_any = |good: BoxedStrategy<Node>| prop_oneof![12 => good, 1 => node()].boxed();
        // Any short text: spaces, escapes, line breaks, non-ASCII.
        let any_text = || {
            "[ a-z\u{e9}\u{1F600}\\\"\n\t/]{0,8}"
                .prop_map(Node::Text)
                .boxed()
        };
        let text = |s: &'static str| Just(Node::Text(s.to_owned())).boxed();
        let int = |n: i64| Just(Node::Int(n)).boxed();
        let customer = prop::collection::vec(
            prop_oneof![
                any_text().prop_map(|t| ("name".to_owned(), false, t)),
                any_text().prop_map(|t| ("name".to_owned(), false, t)),
                Just((
                    "address".to_owned(),
                    false,
                    Node::Object(vec![(
                        "region".to_owned(),
                        false,
                        Node::Text("eu".to_owned())
                    )])
                )),
                (key(), Just(false), node()),
            ],
            0..4,
        )
        .prop_map(Node::Object)
        .boxed();
        let items = prop::collection::vec(
            or_any(
                Just(Node::Object(vec![
                    ("sku".to_owned(), false, Node::Text("a".to_owned())),
                    ("qty".to_owned(), false, Node::Int(2)),
                ]))
                .boxed(),
            ),
            0..3,
        )
        .prop_map(Node::List)
        .boxed();
        let deep = Just(Node::Object(vec![(
            "inner".to_owned(),
            false,
            Node::Object(vec![("v".to_owned(), false, Node::Int(7))]),
        )]))
        .boxed();
        (
            (
                field("id", or_any(int(1))),
                field("user", or_any(any_text())),
                field("amount", or_any(Just(Node::Float(2.5)).boxed())),
                field("ts", or_any(text("2026-12-06T10:00:00Z"))),
                field("d", or_any(text("2026-12-06"))),
                field("flag", or_any(Just(Node::Bool(true)).boxed())),
            ),
            (
                field("small", or_any(int(3))),
                field("meta", or_any(deep)),
                field("customer", or_any(customer)),
                field(
                    "tags",
                    or_any(Just(Node::List(vec![Node::Text("t".to_owned())])).boxed()),
                ),
                field("items", items),
                prop::collection::vec((key(), prop::bool::weighted(0.1), node()), 0..2),
            ),
            // A field given again, later, with another value (`{}` often).
            prop::option::weighted(
                0.3,
                (
                    any::<prop::sample::Index>(),
                    prop_oneof![Just(Node::Object(Vec::new())), node()],
                ),
            ),
        )
            .prop_map(|((a, b, c, d, e, f), (g, h, i, j, k, extra), again)| {
                let mut fields: Vec<_> = [a, b, c, d, e, f, g, h, i, j, k]
                    .into_iter()
                    .flatten()
                    .collect();
                fields.extend(extra);
                if let Some((at, value)) = again
                    && !fields.is_empty()
                {
                    let key = fields[at.index(fields.len())].0.clone();
                    fields.push((key, false, value));
                }
                Node::Object(fields)
            })
    }

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2000)
    }

    fn text(node: &Node) -> String {
        let mut out = String::new();
        node.write(&mut out);
        out
    }

    proptest! {
        // A connector's property tests run in the test step (the prop
        // step builds no connector): 2,000 cases there, or `PROPTEST_CASES`.
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// The one-pass check never says "fits" of a record the check over
        /// `Value` refuses, or of bytes that are not JSON.
        #[test]
        fn what_the_one_pass_check_lets_through_the_value_check_lets_through(
            node in prop_oneof![3 => record(), 1 => node()],
            loose_schema in any::<bool>(),
            cut in prop::option::weighted(0.05, any::<prop::sample::Index>()),
        ) {
            let schema = if loose_schema { schema(&loose()) } else { schema(WIDE) };
            let mut bytes = text(&node).into_bytes();
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            if schema.surely_fits(&bytes) {
                let value: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
                prop_assert_eq!(schema.check(&value), Ok(()), "{}", String::from_utf8_lossy(&bytes));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Records read in one pass build the columns their values build
        /// (each of which fits), and a record's row is the row of its
        /// value.
        #[test]
        fn rows_read_in_one_pass_build_the_columns_their_values_build(
            nodes in prop::collection::vec(prop_oneof![6 => record(), 1 => node()], 1..12),
            loose_schema in any::<bool>(),
        ) {
            let schema = if loose_schema { schema(&loose()) } else { schema(WIDE) };
            let mut values = Vec::new();
            let mut rows = Vec::new();
            for node in &nodes {
                let bytes = text(node);
                let Ok(value) = serde_json::from_str::<Value>(&bytes) else { continue };
                let row = schema.read_row(bytes.as_bytes());
                if schema.check(&value).is_err() {
                    prop_assert!(row.is_none(), "{}", bytes);
                    continue;
                }
                let of_value = schema.row_of(&value).map_err(TestCaseError::fail)?;
                if let Some(row) = row {
                    prop_assert_eq!(&row, &of_value, "{}", bytes);
                }
                values.push(value);
                rows.push(of_value);
            }
            let by_value = schema.columns(&values.iter().collect::<Vec<_>>()).map_err(TestCaseError::fail)?;
            let by_row = schema.columns_of_rows(&rows.iter().collect::<Vec<_>>()).map_err(TestCaseError::fail)?;
            prop_assert_eq!(by_value.len(), by_row.len());
            for (a, b) in by_value.iter().zip(&by_row) {
                prop_assert_eq!(a.to_data(), b.to_data());
            }
        }
    }

    #[test]
    fn records_that_fit_are_known_to_in_one_pass() {
        let wide = schema(WIDE);
        assert!(wide.trie.is_some());
        for record in [
            r#"{"id":1,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":-3,"user":"b\u00f6b","amount":2,"ts":"2026-12-06T10:00:00Z","d":"2026-12-06","flag":false,"small":-2147483648,"meta":{"inner":{"v":7,"w":[1]},"x":{}},"customer":{"name":"ann","address":{"region":null}},"tags":["a",null],"items":[{"sku":"a"},{"sku":"b","qty":null}],"other":{"deep":[[]]}}"#,
            r#" {"id":1,"ts":1733500000000,"meta":{"inner":{"v":0}},"customer":null} "#,
        ] {
            let value: Value = serde_json::from_str(record).unwrap();
            assert_eq!(wide.check(&value), Ok(()), "{record}");
            assert!(wide.surely_fits(record.as_bytes()), "{record}");
            assert_eq!(
                wide.read_row(record.as_bytes()),
                Some(wide.row_of(&value).unwrap())
            );
        }
    }

    #[test]
    fn records_the_one_pass_check_is_not_sure_of_are_left_to_the_value_check() {
        let wide = schema(WIDE);
        for record in [
            // Missing or null where the column may not be.
            r#"{"meta":{"inner":{"v":7}}}"#,
            r#"{"id":null,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":1}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"customer":{}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"items":[null]}"#,
            // Of another type, or out of range.
            r#"{"id":"1","meta":{"inner":{"v":7}}}"#,
            r#"{"id":1.0,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":18446744073709551615,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"small":2147483648,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"ts":"yesterday","meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"d":"2026-02-30","meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"tags":"a","meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"meta":[{"inner":{"v":7}}]}"#,
            // A key given twice on the way to a column: the last counts.
            r#"{"id":1,"id":null,"meta":{"inner":{"v":7}}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"meta":{}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"customer":{"name":"a","name":null}}"#,
            // Not an object, not JSON, not UTF-8.
            r#"[1]"#,
            r#"{"id":1,"meta":{"inner":{"v":7}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}}} x"#,
        ] {
            assert!(!wide.surely_fits(record.as_bytes()), "{record}");
        }
        assert!(!wide.surely_fits(b"{\"id\":1,\"user\":\"\xff\",\"meta\":{\"inner\":{\"v\":7}}}"));
        // Bytes the `Value` parse refuses in a field no column reads, or
        // in one inside a struct column or a list item: a lone surrogate
        // (valid UTF-8 text, not a valid JSON string), a number out of
        // range, nesting past the parser's depth.
        let deep = format!(
            r#"{{"id":1,"meta":{{"inner":{{"v":7}}}},"x":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        for record in [
            r#"{"id":1,"meta":{"inner":{"v":7}},"x":"\ud800"}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"x":{"\udc00":1}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"x":1e400}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"customer":{"name":"a","zz":1e400}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7},"w":-1e400}}"#,
            r#"{"id":1,"meta":{"inner":{"v":7}},"items":[{"sku":"a","zz":"\udfff"}]}"#,
            &deep,
        ] {
            assert!(serde_json::from_str::<Value>(record).is_err(), "{record}");
            assert!(!wide.surely_fits(record.as_bytes()), "{record}");
            assert_eq!(wide.read_row(record.as_bytes()), None, "{record}");
        }
        // A duplicate key the check over `Value` takes (the last counts and
        // fits) is still left to it.
        let twice = r#"{"id":null,"id":1,"meta":{"inner":{"v":7}}}"#;
        assert!(!wide.surely_fits(twice.as_bytes()));
        assert_eq!(wide.check(&serde_json::from_str(twice).unwrap()), Ok(()));
    }

    #[test]
    fn schemas_whose_paths_cross_are_left_to_the_value_check() {
        for columns in [
            // One column's path leads through another's value.
            r#"columns = [
                { name = "a", type = "struct", fields = [{ name = "b", type = "int64" }] },
                { name = "ab", type = "int64", field = "a.b" },
            ]"#,
            // Two columns read one field.
            r#"columns = [
                { name = "x", type = "int64" },
                { name = "y", type = "int64", field = "x" },
            ]"#,
        ] {
            let s = schema(columns);
            assert!(s.trie.is_none(), "{columns}");
            assert!(!s.surely_fits(br#"{"a":{"b":1},"x":1}"#));
        }
        let inferred =
            RowSchema::inferred(&super::super::infer(&serde_json::json!({"a": 1})).unwrap())
                .unwrap();
        assert!(
            !inferred.surely_fits(br#"{"a":1}"#),
            "an inferred schema is strict"
        );
    }
}
