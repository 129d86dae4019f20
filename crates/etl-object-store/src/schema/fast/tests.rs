//! The one-pass reader held to the `Value` path: properties over
//! generated records, and the edges by name.

use arrow_array::Array;
use proptest::prelude::*;

use super::super::ColumnConfig;
use super::super::Row;
use super::super::rows::Plain;
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
    /// A string whose characters are escaped in every way JSON has,
    /// or written as they are, as the seed picks.
    Escaped(String, u64),
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
            Node::Escaped(s, seed) => escape_every_way(s, *seed, out),
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

/// `text` as a JSON string, each character written as it is (where
/// JSON allows it), as its short escape (where it has one), or as
/// `\u` escapes in lower or upper case (a pair of surrogates past the
/// BMP), as `seed` picks.
fn escape_every_way(text: &str, seed: u64, out: &mut String) {
    let mut state = seed;
    out.push('"');
    for c in text.chars() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let may_be_raw = c >= ' ' && c != '"' && c != '\\';
        match ((state >> 33) % 4, short) {
            (0, Some(short)) => out.push_str(short),
            (3, _) if may_be_raw => out.push(c),
            (pick, _) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    if pick == 2 {
                        out.push_str(&format!("\\u{unit:04X}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
        }
    }
    out.push('"');
}

/// Numbers in every form JSON has (and some it has not): integers at
/// the edges of `i64` and `u64`, fractions and exponents of any
/// length, `-0`, subnormals, the largest doubles, and doubles written
/// as Rust and serde_json write them.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,21})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
        prop::sample::select(vec![
            "-0",
            "-0.0",
            "0e0",
            "-0e-5",
            "1E5",
            "1e+5",
            "0.1e-3",
            "1e22",
            "1e23",
            "1e-22",
            "1e-23",
            "9007199254740991",
            "9007199254740992.0",
            "9007199254740993.0",
            "5e-324",
            "4.9e-324",
            "2.2250738585072014e-308",
            "1.7976931348623157e308",
            "1.7976931348623159e308",
            "-9223372036854775808",
            "-9223372036854775809",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "0.30000000000000004",
            "123456789012345.678",
            "3.141592653589793238462643383279",
            "1.5e-7",
            "-1.25E+2",
            "1e99999999999",
            "0e99999999999",
            "1e-99999999999",
            "1733500000000",
            "2147483647",
            "2147483648",
            "-2147483648",
            "-2147483649",
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "1e+",
            "-",
            "--1",
            "1.e5",
            "0x10",
            "1_000",
            "Infinity",
            "NaN",
            "-Infinity",
            "00",
            "-01",
            "1.5.5",
            "1e5e5",
        ])
        .prop_map(str::to_owned),
        (any::<f64>(), 0..6usize).prop_map(|(f, form)| match form {
            0 => format!("{f}"),
            1 => format!("{f:e}"),
            2 => format!("{f:E}"),
            3 => format!("{f:.3}"),
            4 => format!("{f:.17e}"),
            _ => serde_json::to_string(&f).unwrap_or_default(),
        }),
    ]
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
            // Around the reader's depth and the `Value` parse's.
            format!("{}{}", "[".repeat(98), "]".repeat(98)),
            format!("{}{}", "[".repeat(99), "]".repeat(99)),
            format!("{}{}", "[{\"a\":".repeat(63), "}]".repeat(63)),
            format!("{}{}", "[".repeat(126), "]".repeat(126)),
            format!("{}{}", "[".repeat(127), "]".repeat(127)),
            // Escapes serde_json refuses, raw control characters.
            r#""\x""#.to_owned(),
            r#""\u12""#.to_owned(),
            r#""\uZZZZ""#.to_owned(),
            r#""\ud83d\u0041""#.to_owned(),
            r#""\ude00\ud83d""#.to_owned(),
            r#""\ud83d\ud83d\ude00""#.to_owned(),
            r#""\ud83d\n""#.to_owned(),
            "\"a\tb\"".to_owned(),
            "\"a\u{0}b\"".to_owned(),
            "\"\u{7f}\"".to_owned(),
            r#""\"#.to_owned(),
        ])
        .prop_map(Node::Raw),
        number_text().prop_map(Node::Raw),
        (
            "[ a-z\u{e9}\u{1F600}\\\\\"/\\x00-\\x1f\\x7f\u{2028}\u{FFFF}\u{10FFFF}]{0,8}",
            any::<u64>()
        )
            .prop_map(|(s, seed)| Node::Escaped(s, seed)),
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
            .prop_map(move |(present, escaped, v)| present.then(|| (name.to_owned(), escaped, v)))
    };
    let or_any = |good: BoxedStrategy<Node>| prop_oneof![12 => good, 1 => node()].boxed();
    // Any short text: spaces, escapes, line breaks, non-ASCII.
    let any_text = || {
        prop_oneof![
            "[ a-z\u{e9}\u{1F600}\\\"\n\t/]{0,8}".prop_map(Node::Text),
            (
                "[ a-z\u{e9}\u{1F600}\\\\\"/\\x00-\\x1f\u{2028}]{0,8}",
                any::<u64>()
            )
                .prop_map(|(s, seed)| Node::Escaped(s, seed)),
        ]
        .boxed()
    };
    // A number of any form, most often a right one.
    let number = |good: BoxedStrategy<Node>| {
        prop_oneof![4 => good, 1 => number_text().prop_map(Node::Raw)].boxed()
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
            field("id", or_any(number(int(1)))),
            field("user", or_any(any_text())),
            field("amount", or_any(number(Just(Node::Float(2.5)).boxed()))),
            field("ts", or_any(text("2026-12-06T10:00:00Z"))),
            field("d", or_any(text("2026-12-06"))),
            field("flag", or_any(Just(Node::Bool(true)).boxed())),
        ),
        (
            field("small", or_any(number(int(3)))),
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

/// Whether `a` and `b` are the same cells, floats to the bit (`-0.0`
/// is not `0.0`).
fn same_bits(a: &Plain, b: &Plain) -> bool {
    match (a, b) {
        (Plain::Float(x), Plain::Float(y)) => x.to_bits() == y.to_bits(),
        (Plain::List(x), Plain::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_bits(a, b))
        }
        _ => a == b,
    }
}

fn same_row_bits(a: &Row, b: &Row) -> bool {
    let (a, b) = (a.plain(), b.plain());
    a.len() == b.len() && a.iter().zip(&b).all(|(a, b)| same_bits(a, b))
}

/// What the one-pass reader gives of `text` is what the `Value` path
/// gives, floats to the bit, or nothing: nothing where the `Value`
/// parse or check refuses it. `true` where it read the row.
fn read_as_the_value_path(schema: &RowSchema, text: &str) -> Result<bool, TestCaseError> {
    let row = schema.read_row(text.as_bytes());
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        prop_assert!(row.is_none(), "not JSON, read: {}", text);
        return Ok(false);
    };
    if schema.check(&value).is_err() {
        prop_assert!(row.is_none(), "does not fit, read: {}", text);
        return Ok(false);
    }
    let of_value = schema.row_of(&value).map_err(TestCaseError::fail)?;
    match row {
        Some(row) => {
            prop_assert!(
                same_row_bits(&row, &of_value),
                "{}: {:?} against {:?}",
                text,
                row,
                of_value
            );
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Columns of every numeric type reading one number each, nullable.
const NUMBERS: &str = r#"columns = [
    { name = "f", type = "float64" },
    { name = "i", type = "int64" },
    { name = "s", type = "int32" },
    { name = "ts", type = "timestamp" },
    { name = "l", type = "list", item = { name = "x", type = "float64" } },
]"#;

fn numbers_record(n: &str) -> String {
    format!(r#"{{"f":{n},"i":{n},"s":{n},"ts":{n},"l":[{n},{n}],"x":{n}}}"#)
}

/// `n` in the float columns of [`NUMBERS`] and a field none reads.
fn floats_record(n: &str) -> String {
    format!(r#"{{"f":{n},"l":[{n},{n}],"x":{n}}}"#)
}

/// `text` with whitespace around its structural characters (outside
/// strings) and at its ends, the kinds picked in turn from `picks`:
/// JSON's four, and where `foreign` is given, one of those JSON does
/// not allow at the place it names.
fn spaced(text: &str, picks: &[u8], foreign: Option<(usize, usize)>) -> String {
    const JSON: [&str; 8] = ["", "", " ", "\n", "\t", "\r", "\r\n  ", " \t"];
    const NOT_JSON: [&str; 6] = ["\u{c}", "\u{b}", "\u{a0}", "\u{2028}", "\u{feff}", "\u{0}"];
    let mut places = 0;
    let mut pick = |out: &mut String| {
        let at = places;
        places += 1;
        if let Some((place, kind)) = foreign
            && place == at
        {
            out.push_str(NOT_JSON[kind % NOT_JSON.len()]);
        }
        let p = picks.get(at % picks.len().max(1)).copied().unwrap_or(0);
        out.push_str(JSON[usize::from(p) % JSON.len()]);
    };
    let mut out = String::new();
    pick(&mut out);
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        let structural = !in_string && matches!(c, '{' | '}' | '[' | ']' | ',' | ':');
        if structural {
            pick(&mut out);
        }
        out.push(c);
        if structural {
            pick(&mut out);
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        }
    }
    pick(&mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Numbers of every form read in one pass give the cells the
    /// `Value` path gives, floats to the bit, in columns of every
    /// numeric type and in a field no column reads.
    #[test]
    fn numbers_of_every_form_read_as_the_value_parse_reads_them(n in number_text()) {
        let schema = schema(NUMBERS);
        read_as_the_value_path(&schema, &numbers_record(&n))?;
        read_as_the_value_path(&schema, &floats_record(&n))?;
        let deep = format!(r#"{{"x":[{{"y":{n}}}],"f":1.5}}"#);
        read_as_the_value_path(&schema, &deep)?;
    }

    /// JSON's whitespace anywhere between tokens reads as the compact
    /// text does; whitespace JSON does not allow is never read.
    #[test]
    fn whitespace_between_tokens_reads_as_the_compact_text(
        node in prop_oneof![3 => record(), 1 => node()],
        loose_schema in any::<bool>(),
        picks in prop::collection::vec(any::<u8>(), 1..16),
        foreign in prop::option::weighted(0.2, (0..64usize, 0..6usize)),
    ) {
        let schema = if loose_schema { schema(&loose()) } else { schema(WIDE) };
        let compact = text(&node);
        let spaced = spaced(&compact, &picks, foreign);
        let read = read_as_the_value_path(&schema, &spaced)?;
        if foreign.is_none() {
            let compact_read = read_as_the_value_path(&schema, &compact)?;
            prop_assert_eq!(read, compact_read, "{:?} against {:?}", spaced, compact);
        }
    }
}

/// The row `text` gives alone: read through its `Value`, or why not.
fn row_alone(schema: &RowSchema, text: &str) -> Result<Row, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => schema.check(&value).and_then(|()| schema.row_of(&value)),
        Err(_) => Err("the value is not JSON".to_owned()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Records read together into one arena (in one pass, through their
    /// `Value`, or refused after part of their row was read) each give
    /// the row, or the refusal, they give alone, and the columns built
    /// of those rows are the ones built of their values.
    #[test]
    fn rows_read_together_are_the_rows_read_alone(
        nodes in prop::collection::vec(prop_oneof![6 => record(), 1 => node()], 1..24),
        loose_schema in any::<bool>(),
    ) {
        let schema = if loose_schema { schema(&loose()) } else { schema(WIDE) };
        let texts: Vec<String> = nodes.iter().map(text).collect();
        let together = schema.rows_of_chunk(texts.iter().map(|t| t.as_bytes()));
        prop_assert_eq!(together.len(), texts.len());
        let mut rows = Vec::new();
        let mut values = Vec::new();
        for (t, row) in texts.iter().zip(&together) {
            match (row, row_alone(&schema, t)) {
                (Ok(row), Ok(alone)) => {
                    prop_assert!(same_row_bits(row, &alone), "{}: {:?} against {:?}", t, row, alone);
                    rows.push(row);
                    values.push(serde_json::from_str::<Value>(t).map_err(|e| TestCaseError::fail(e.to_string()))?);
                }
                (Err(why), Err(alone)) => prop_assert_eq!(why, &alone, "{}", t),
                (row, alone) => prop_assert!(false, "{}: {:?} together, {:?} alone", t, row, alone),
            }
        }
        let by_value = schema.columns(&values.iter().collect::<Vec<_>>()).map_err(TestCaseError::fail)?;
        let by_row = schema.columns_of_rows(&rows).map_err(TestCaseError::fail)?;
        for (a, b) in by_value.iter().zip(&by_row) {
            prop_assert_eq!(a.to_data(), b.to_data());
        }
    }
}

/// A record the reader gives up on after part of its row was read (a
/// list's items, text) leaves nothing in the arena: the next record's
/// row, and its list, are its own.
#[test]
fn a_row_given_up_part_way_leaves_nothing_behind() {
    let wide = schema(&loose());
    let texts = [
        r#"{"id":1,"user":"ann","tags":["a","b"]}"#,
        // Given up on at its list's second item, and at its end.
        r#"{"id":2,"user":"bob","tags":["c",5,"d"]}"#,
        r#"{"id":3,"user":"cy","tags":["e","f"]} x"#,
        // Nested lists of a struct's items read as its `Value`.
        r#"{"id":4,"tags":["g"],"items":[{"sku":"s","qty":1}]}"#,
        r#"{"id":5,"user":"dee","tags":[]}"#,
    ];
    let together = wide.rows_of_chunk(texts.iter().map(|t| t.as_bytes()));
    for (t, row) in texts.iter().zip(&together) {
        match (row, row_alone(&wide, t)) {
            (Ok(row), Ok(alone)) => assert!(same_row_bits(row, &alone), "{t}"),
            (Err(a), Err(b)) => assert_eq!(a, &b, "{t}"),
            (row, alone) => panic!("{t}: {row:?} together, {alone:?} alone"),
        }
    }
    assert!(together[1].is_err() && together[2].is_err());
    // The kept rows' 11 cells each, their lists' 2 + 2 + 0 items, their
    // text ("ann", "a", "b", "g", "dee"): nothing of the others.
    assert_eq!(together[0].as_ref().unwrap().held(), (3 * 11 + 4, 9, 0));
    assert_eq!(
        together[4].as_ref().unwrap().plain()[9],
        Plain::List(Vec::new())
    );
}

/// Floats of the common forms are read in one pass, each the double
/// the `Value` parse gives, to the bit; the others may be left to it.
#[test]
fn floats_read_in_one_pass_are_the_bits_the_value_parse_gives() {
    let schema = schema(NUMBERS);
    for n in [
        "931.71",
        "0.1",
        "-0",
        "-0.0",
        "0.0",
        "0e0",
        "1E5",
        "1e+5",
        "1e-5",
        "0.1e-3",
        "-1.25E+2",
        "1e22",
        "-1e-22",
        "123456789012345.6",
        "900719925474099.1",
        "9007199254740991",
        "2.5",
        "1.5e-7",
        "0.000001",
        "-0.5e0",
        // Below `i64::MIN`: a float, as serde_json converts it.
        "-9223372036854775809",
        "-18446744073709551615",
    ] {
        let record = floats_record(n);
        let read = read_as_the_value_path(&schema, &record).unwrap();
        assert!(read, "{n}: not read in one pass");
    }
    // Past an exact significand or power of ten: the `Value` parse's
    // rounding decides, the reader leaves them to it.
    for n in [
        "3.141592653589793238462643383279",
        "9007199254740993.0",
        "1e23",
        "1e-23",
        "0.30000000000000004",
        "9007199254740991.0",
        "4503599627370497.5",
        "5e-324",
        "4.9e-324",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "123456789012345678901234567890",
        "18446744073709551616",
    ] {
        let record = floats_record(n);
        assert!(!read_as_the_value_path(&schema, &record).unwrap(), "{n}");
    }
    // `-0` is a float in serde_json: not an integer column's.
    let Some(row) = schema.read_row(br#"{"f":-0}"#) else {
        panic!("-0 not read");
    };
    assert!(matches!(row.plain()[0], Plain::Float(f) if f.to_bits() == (-0.0f64).to_bits()));
    assert!(schema.read_row(br#"{"i":-0}"#).is_none());
    assert!(schema.read_row(br#"{"i":1E5}"#).is_none());
    let Some(row) =
        schema.read_row(br#"{"i":-9223372036854775808,"s":-2147483648,"ts":-9223372036854775}"#)
    else {
        panic!("the edges of the ranges not read");
    };
    assert_eq!(
        row.plain()[..4],
        [
            Plain::Null,
            Plain::Int(i64::MIN),
            Plain::Int(i64::from(i32::MIN)),
            Plain::Int(-9_223_372_036_854_775_000)
        ]
    );
    for past in [
        r#"{"s":2147483648}"#,
        r#"{"i":9223372036854775808}"#,
        r#"{"ts":9223372036854776}"#,
    ] {
        assert!(schema.read_row(past.as_bytes()).is_none(), "{past}");
    }
}

/// Strings with escapes of every kind read as the `Value` parse reads
/// them, keys included; escapes it refuses are left to it.
#[test]
fn escapes_of_every_kind_read_as_the_value_parse_reads_them() {
    let wide = schema(WIDE);
    let read = wide
        .read_row(
            br#"{"\u0069d":1,"user":"\"\\\/\b\f\n\r\t\u00e9\u00E9\uD83D\uDE00\u0041 \u2028","meta":{"inner":{"v":7}},"tags":["\u0000","a\/b"]}"#,
        )
        .unwrap();
    assert_eq!(
        read.plain()[1],
        Plain::Text("\"\\/\u{8}\u{c}\n\r\t\u{e9}\u{e9}\u{1F600}A \u{2028}".to_owned())
    );
    assert_eq!(
        read.plain()[9],
        Plain::List(vec![
            Plain::Text("\u{0}".to_owned()),
            Plain::Text("a/b".to_owned())
        ])
    );
    for (string, why) in [
        (r#""\ud83d""#, "a lone leading surrogate"),
        (r#""\ude00""#, "a lone trailing surrogate"),
        (
            r#""\ud83d\u0041""#,
            "a leading surrogate before another character",
        ),
        (r#""\ud83d\n""#, "a leading surrogate before a short escape"),
        (r#""\x""#, "an escape JSON has not"),
        (r#""\u00g0""#, "a hex escape of no hex"),
        (r#""\u00e""#, "a hex escape cut short"),
        ("\"a\tb\"", "a raw control character"),
        ("\"a\u{1f}b\"", "a raw control character"),
    ] {
        for record in [
            format!(r#"{{"id":1,"user":{string},"meta":{{"inner":{{"v":7}}}}}}"#),
            format!(r#"{{"id":1,"x":{string},"meta":{{"inner":{{"v":7}}}}}}"#),
            format!(r#"{{"id":1,{string}:1,"meta":{{"inner":{{"v":7}}}}}}"#),
        ] {
            assert!(
                serde_json::from_str::<Value>(&record).is_err(),
                "{why}: {record}"
            );
            assert!(
                wide.read_row(record.as_bytes()).is_none(),
                "{why}: {record}"
            );
        }
    }
    // Bytes that are not UTF-8, raw or next to an escape.
    for bytes in [
        &b"{\"id\":1,\"x\":\"\xc3\",\"meta\":{\"inner\":{\"v\":7}}}"[..],
        b"{\"id\":1,\"user\":\"\xc3\\u00a9\",\"meta\":{\"inner\":{\"v\":7}}}",
        b"{\"id\":1,\"user\":\"\\u00a9\xa9\",\"meta\":{\"inner\":{\"v\":7}}}",
        b"{\"id\":1,\"\xff\":1,\"meta\":{\"inner\":{\"v\":7}}}",
    ] {
        assert!(serde_json::from_slice::<Value>(bytes).is_err());
        assert!(
            wide.read_row(bytes).is_none(),
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// A string's end, an escape, a control character and a byte past
/// ASCII are each found at every place of strings of up to 24 bytes
/// (the lengths a scan of several bytes at a time would cross), in a
/// column's value, in a
/// key and in a field no column reads.
#[test]
fn every_byte_a_strings_scan_stops_at_is_found_at_every_place() {
    let wide = schema(WIDE);
    for len in 0..24 {
        for at in 0..=len {
            for stop in [
                "\"",
                "\\n",
                "\\u00e9",
                "\u{e9}",
                "\u{1F600}",
                "\t",
                "\u{1f}",
                "\\",
            ] {
                let text = format!("{}{stop}{}", "a".repeat(at), "b".repeat(len - at));
                for record in [
                    format!(r#"{{"id":1,"user":"{text}","meta":{{"inner":{{"v":7}}}}}}"#),
                    format!(r#"{{"id":1,"x":"{text}","meta":{{"inner":{{"v":7}}}}}}"#),
                    format!(r#"{{"id":1,"{text}":1,"meta":{{"inner":{{"v":7}}}}}}"#),
                ] {
                    let read = read_as_the_value_path(&wide, &record).unwrap();
                    let json = serde_json::from_str::<Value>(&record).is_ok();
                    // Every string JSON takes here is read in one pass.
                    assert_eq!(read, json, "{record:?}");
                }
            }
        }
    }
}

/// Nesting is followed to [`DEEPEST`] levels, the record's object
/// counting one; deeper is left to the `Value` parse, which takes up
/// to 127 and refuses 128.
#[test]
fn nesting_past_the_readers_depth_is_left_to_the_value_parse() {
    let wide = schema(WIDE);
    let nested = |levels: usize| {
        format!(
            r#"{{"id":1,"meta":{{"inner":{{"v":7}}}},"x":{}{}}}"#,
            "[".repeat(levels - 1),
            "]".repeat(levels - 1)
        )
    };
    assert!(wide.read_row(nested(DEEPEST).as_bytes()).is_some());
    for levels in [DEEPEST + 1, 127] {
        let record = nested(levels);
        assert!(serde_json::from_str::<Value>(&record).is_ok(), "{levels}");
        assert!(wide.read_row(record.as_bytes()).is_none(), "{levels}");
    }
    let record = nested(128);
    assert!(serde_json::from_str::<Value>(&record).is_err());
    assert!(wide.read_row(record.as_bytes()).is_none());
}

/// Whitespace: JSON's four kinds anywhere between tokens; none other.
#[test]
fn only_jsons_whitespace_is_read_between_tokens() {
    let wide = schema(WIDE);
    let compact = r#"{"id":1,"user":"a b","tags":["x"],"meta":{"inner":{"v":7}}}"#;
    let expected = wide.read_row(compact.as_bytes()).unwrap();
    let spaced = " \r\n{ \"id\" :\t1 ,\n\"user\"\r: \"a b\" , \"tags\" : [ \"x\" ] , \"meta\" : { \"inner\" : { \"v\" : 7 } } }\n\t ";
    assert_eq!(wide.read_row(spaced.as_bytes()), Some(expected));
    for foreign in ["\u{c}", "\u{b}", "\u{a0}", "\u{feff}", "\u{2028}"] {
        for record in [
            format!("{foreign}{compact}"),
            format!("{compact}{foreign}"),
            compact.replacen(':', &format!(":{foreign}"), 1),
        ] {
            assert!(
                serde_json::from_str::<Value>(&record).is_err(),
                "{record:?}"
            );
            assert!(wide.read_row(record.as_bytes()).is_none(), "{record:?}");
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
        RowSchema::inferred(&super::super::infer(&serde_json::json!({"a": 1})).unwrap()).unwrap();
    assert!(
        !inferred.surely_fits(br#"{"a":1}"#),
        "an inferred schema is strict"
    );
}
