//! Programs of the fast subset generated from its grammar, and the
//! properties that hold the fast path to VRL's runtime on them: what a
//! step writes (or why it refuses) is the same byte for byte whether the
//! fast path decided it or the runtime did.
//!
//! The grammar is typed as VRL checks types, so that most programs
//! compile: a number (`N`) is a literal, `int!`/`float!`/`to_float!`/
//! `to_int!` of a field, arithmetic of numbers or `round`, `floor`,
//! `ceil`, `to_int`, `to_float` of one; a boolean (`B`) is a literal,
//! `bool!` of a field, `==`/`!=` of any two values, an ordering of two
//! numbers, `!`, `&&`, `||`; any value (`A`) is a field read (with
//! indexes), a variable read, a literal, `N` or `B`. Statements assign
//! `A` to a field path or a variable, delete a field path, branch on `B`
//! (`if`/`else`, `abort`) or walk an array with `for_each`. A program
//! that does not compile is skipped; one that compiles must be in the
//! fast subset.

use etl_record::{Position, Record};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::{record_text, shown};
use etl_transform::Transform;

use crate::{Remap, VrlFilter, VrlProgram};

/// A key of the records [`record_text`] makes.
const KEY: &str = "[a-d]";

/// A path of fields to assign or delete: `.a`, `.a.b`, `.a.b.c`.
fn field_path() -> impl Strategy<Value = String> {
    prop::collection::vec(KEY, 1..4).prop_map(|keys| format!(".{}", keys.join(".")))
}

/// A path to read: fields, and indexes into arrays (negative ones
/// count from the end).
fn read_path() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => field_path(),
        1 => (KEY, -2i64..3).prop_map(|(k, i)| format!(".{k}[{i}]")),
        1 => (KEY, -1i64..2, KEY).prop_map(|(k, i, j)| format!(".{k}[{i}].{j}")),
    ]
}

/// A variable read: the two variables every program sets first, or a
/// path into one.
fn variable() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec!["x", "y"]).prop_map(str::to_owned),
        1 => (prop::sample::select(vec!["x", "y"]), KEY).prop_map(|(v, k)| format!("{v}.{k}")),
    ]
}

fn integer() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (-3i64..101).prop_map(|i| i.to_string()),
        1 => prop::sample::select(vec!["9223372036854775807", "-9223372036854775807", "4611686018427387904"])
            .prop_map(str::to_owned),
    ]
}

fn float() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "0.0",
        "0.5",
        "1.5",
        "-2.25",
        "0.1",
        "100.0",
        "2.5",
        "1000000.125",
    ])
    .prop_map(str::to_owned)
}

fn string() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        r#""x""#,
        r#""""#,
        r#""山田""#,
        r#""café""#,
        r#""a\"b""#,
        r#""1""#,
        r#""\n""#,
    ])
    .prop_map(str::to_owned)
}

fn literal() -> impl Strategy<Value = String> {
    prop_oneof![
        integer(),
        float(),
        string(),
        prop::sample::select(vec!["true", "false", "null"]).prop_map(str::to_owned),
    ]
}

/// A number, as VRL types it: the arithmetic on it compiles.
fn number() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        2 => integer(),
        2 => float(),
        2 => (
            prop::sample::select(vec!["int!", "float!", "to_float!", "to_int!"]),
            read_path()
        )
            .prop_map(|(f, p)| format!("{f}({p})")),
    ];
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            3 => (
                inner.clone(),
                prop::sample::select(vec!["+", "-", "*"]),
                inner.clone()
            )
                .prop_map(|(l, op, r)| format!("({l} {op} {r})")),
            // A divisor VRL knows is not zero: the division cannot fail.
            1 => (inner.clone(), prop::sample::select(vec!["2", "0.5", "-4", "3.0"]))
                .prop_map(|(l, r)| format!("({l} / {r})")),
            2 => (
                prop::sample::select(vec!["round", "floor", "ceil", "to_int", "to_float"]),
                inner
            )
                .prop_map(|(f, n)| format!("{f}({n})")),
        ]
    })
}

/// Any value: what a field or a variable is given.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => read_path(),
        2 => variable(),
        2 => literal(),
        2 => number(),
        1 => boolean(),
    ]
}

/// A boolean, as VRL types it: a predicate that compiles.
fn boolean() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        1 => prop::sample::select(vec!["true", "false"]).prop_map(str::to_owned),
        1 => read_path().prop_map(|p| format!("bool!({p})")),
        3 => (
            prop_oneof![read_path(), variable(), literal()],
            prop::sample::select(vec!["==", "!="]),
            prop_oneof![read_path(), literal(), number()]
        )
            .prop_map(|(l, op, r)| format!("{l} {op} {r}")),
        2 => (
            number(),
            prop::sample::select(vec!["<", "<=", ">", ">="]),
            number()
        )
            .prop_map(|(l, op, r)| format!("{l} {op} {r}")),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            1 => inner.clone().prop_map(|b| format!("!({b})")),
            2 => (inner.clone(), prop::sample::select(vec!["&&", "||"]), inner)
                .prop_map(|(l, op, r)| format!("({l}) {op} ({r})")),
        ]
    })
}

/// One statement.
fn statement() -> impl Strategy<Value = String> {
    let simple = prop_oneof![
        4 => (field_path(), any_value()).prop_map(|(p, v)| format!("{p} = {v}")),
        1 => (field_path(), field_path()).prop_map(|(p, q)| format!("{p} = del({q})")),
        2 => (prop::sample::select(vec!["x", "y"]), any_value())
            .prop_map(|(v, e)| format!("{v} = {e}")),
        2 => field_path().prop_map(|p| format!("del({p})")),
        1 => boolean().prop_map(|b| format!("if {b} {{ abort }}")),
        1 => (
            read_path(),
            prop::sample::select(vec![
                "x = it",
                ".n = i",
                "if it == 1 { .m = i }",
                "y = to_float!(it.a) * 2",
                "x = it.b",
            ])
        )
            .prop_map(|(p, body)| format!("for_each(array!({p})) -> |i, it| {{ {body} }}")),
    ];
    simple.prop_recursive(2, 12, 3, |inner| {
        (
            boolean(),
            prop::collection::vec(inner.clone(), 1..3),
            prop::option::of(prop::collection::vec(inner, 1..3)),
        )
            .prop_map(|(b, then, otherwise)| match otherwise {
                Some(e) => format!(
                    "if {b} {{\n{}\n}} else {{\n{}\n}}",
                    then.join("\n"),
                    e.join("\n")
                ),
                None => format!("if {b} {{\n{}\n}}", then.join("\n")),
            })
    })
}

/// A program: its two variables set, then statements.
fn program() -> impl Strategy<Value = String> {
    (
        any_value(),
        any_value(),
        prop::collection::vec(statement(), 1..6),
    )
        .prop_map(|(x, y, body)| format!("x = {x}\ny = {y}\n{}", body.join("\n")))
}

#[test]
fn most_generated_programs_compile_and_all_of_those_are_fast() {
    // The grammar is typed so that the property below tests programs,
    // not compile errors: most of what it makes compiles.
    let mut runner = TestRunner::deterministic();
    let (mut remaps, mut conditions) = (0, 0);
    for _ in 0..400 {
        let source = program().new_tree(&mut runner).unwrap().current();
        if let Ok(compiled) = VrlProgram::remap(&source) {
            assert!(compiled.is_fast(), "{source}");
            remaps += 1;
        }
        let source = boolean().new_tree(&mut runner).unwrap().current();
        if let Ok(compiled) = VrlProgram::condition(&source) {
            assert!(compiled.is_fast(), "{source}");
            conditions += 1;
        }
    }
    assert!(remaps >= 200, "{remaps} of 400 programs compile");
    assert!(conditions >= 250, "{conditions} of 400 conditions compile");
}

proptest! {
    #[test]
    fn prop_generated_programs_write_what_vrl_writes(
        source in program(),
        input in record_text(),
    ) {
        let Ok(compiled) = VrlProgram::remap(&source) else {
            return Ok(());
        };
        prop_assert!(compiled.is_fast(), "not in the fast subset: {}", source);
        let record = || Record::new(Position::default(), input.clone());
        let vrl = shown(Remap::new("r", compiled.clone().runtime_only()).apply(record()));
        for checked in [false, true] {
            let fast = shown(Remap::new("r", compiled.clone()).checked_input(checked).apply(record()));
            prop_assert_eq!(&fast, &vrl, "checked {}: {}\non {}", checked, source, input);
        }
    }

    #[test]
    fn prop_generated_conditions_decide_as_vrl_decides(
        source in boolean(),
        input in record_text(),
    ) {
        let Ok(compiled) = VrlProgram::condition(&source) else {
            return Ok(());
        };
        prop_assert!(compiled.is_fast(), "not in the fast subset: {}", source);
        let record = || Record::new(Position::default(), input.clone());
        let vrl = shown(VrlFilter::new("f", compiled.clone().runtime_only()).apply(record()));
        for checked in [false, true] {
            let fast = shown(VrlFilter::new("f", compiled.clone()).checked_input(checked).apply(record()));
            prop_assert_eq!(&fast, &vrl, "checked {}: {}\non {}", checked, source, input);
        }
    }
}
