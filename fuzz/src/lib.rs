//! The fuzz targets' checks, one function per target (`fuzz_targets/`
//! calls them): each panics when an invariant of the project does not
//! hold, which libFuzzer reports with the input. The workspace's tests
//! run the same functions on the seeds, the saved failures and
//! mutations of the seeds (`tests/tests/it/fuzz_seeds.rs`), so this file
//! compiles without libFuzzer too.

use std::path::Path;

use arbitrary::{Result, Unstructured};
use etl::fuzzing::{
    checked_entries, checked_objects, json_stage_without_fast_path, scanned_entries,
};
use etl::{CompareOp, JsonOp, JsonStage, Outcome, Remap, Transform, VrlFilter, VrlProgram};
use etl_record::{Position, Record};
use etl_source::fuzzing::{LineVerdict, check_line};
use serde_json::{Map, Value};

/// The checking pass takes only what serde_json reads as an object, with
/// the entries the scanner reads.
pub fn json_check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let entries = checked_entries(text);
    let kept = checked_objects(text);
    assert_eq!(
        entries.is_some(),
        kept.is_some(),
        "the two readings differ on {text:?}"
    );
    let (Some(entries), Some((top, objects))) = (entries, kept) else {
        return;
    };
    assert_eq!(top, entries, "{text:?}");
    let map: Map<String, Value> = match serde_json::from_str(text) {
        Ok(map) => map,
        Err(e) => panic!("the checking pass took {text:?}, which serde_json refuses: {e}"),
    };
    assert_eq!(scanned_entries(text).as_ref(), Some(&entries), "{text:?}");
    for (i, (key, raw)) in entries.iter().enumerate() {
        let value: Value = serde_json::from_str(raw).expect("an entry's text is a value");
        // Only the last of duplicate keys is in serde_json's map.
        if !entries[i + 1..].iter().any(|(k, _)| k == key) {
            assert_eq!(map.get(key), Some(&value), "{key:?} in {text:?}");
        }
    }
    for object in objects {
        let whole = text
            .get(object.at..object.end)
            .expect("a kept object is within the text");
        assert!(
            serde_json::from_str::<Map<String, Value>>(whole).is_ok(),
            "kept {whole:?} of {text:?}"
        );
        assert_eq!(scanned_entries(whole), Some(object.entries), "{whole:?}");
    }
}

/// The file source's NDJSON line check on any bytes: it says "surely one
/// value" only of a line serde_json's `IgnoredAny` check takes (for
/// [`LineVerdict::Value`], of a line that is UTF-8: the reader refuses
/// any other before it trusts the verdict), and "ASCII" exactly when it
/// is sure and every byte is.
pub fn ndjson_line(data: &[u8]) {
    let verdict = check_line(data);
    let sure = verdict != LineVerdict::NotSure;
    let shown = String::from_utf8_lossy(data);
    assert_eq!(
        verdict == LineVerdict::AsciiValue,
        sure && data.is_ascii(),
        "{verdict:?} of {shown:?}"
    );
    let trusted = match verdict {
        LineVerdict::AsciiValue => true,
        LineVerdict::Value => std::str::from_utf8(data).is_ok(),
        LineVerdict::NotSure => false,
    };
    if trusted && let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(data) {
        panic!("{verdict:?} of {shown:?}, which serde_json refuses: {e}");
    }
}

/// An outcome as text, to compare two paths' outcomes byte for byte.
fn shown(outcome: Outcome) -> String {
    match outcome {
        Outcome::Keep(r) => format!("keep {:?}", r.value),
        Outcome::Filtered => "filtered".to_owned(),
        Outcome::Many(rs) => format!("many {:?}", rs.iter().map(|r| &r.value).collect::<Vec<_>>()),
        Outcome::Reject(r, why) => format!("reject {:?} {why}", r.value),
        Outcome::Halt(r, why) => format!("halt {:?} {why}", r.value),
    }
}

/// The bytes that choose the program; the rest is the record.
const PROGRAM_BYTES: usize = 32;

/// A `remap` program, a condition and JSON steps made from the first
/// bytes, run on the rest as a record by the fast paths and by the
/// general ones.
pub fn fast_paths(data: &[u8]) {
    let (choice, value) = data.split_at(data.len().min(PROGRAM_BYTES));
    let mut u = Unstructured::new(choice);
    let (Ok(program), Ok(condition), Ok(ops)) =
        (program(&mut u), boolean(&mut u, 2), json_ops(&mut u))
    else {
        return;
    };
    let record = || Record::new(Position::default(), value.to_vec());
    // A step told its input is checked may take only valid JSON (the
    // NDJSON source and the steps before it make sure of that).
    let valid = serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok();
    if let Ok(compiled) = VrlProgram::remap(&program) {
        let vrl = shown(Remap::new("r", compiled.clone().runtime_only()).apply(record()));
        for checked in [false, valid] {
            let fast = shown(
                Remap::new("r", compiled.clone())
                    .checked_input(checked)
                    .apply(record()),
            );
            assert_eq!(fast, vrl, "{program}\n(checked {checked})");
        }
    }
    if let Ok(compiled) = VrlProgram::condition(&condition) {
        let vrl = shown(VrlFilter::new("f", compiled.clone().runtime_only()).apply(record()));
        for checked in [false, valid] {
            let fast = shown(
                VrlFilter::new("f", compiled.clone())
                    .checked_input(checked)
                    .apply(record()),
            );
            assert_eq!(fast, vrl, "{condition}\n(checked {checked})");
        }
    }
    let fast = shown(JsonStage::new("j", ops.clone()).apply(record()));
    let tree = shown(json_stage_without_fast_path("j", ops.clone()).apply(record()));
    assert_eq!(fast, tree, "{ops:?}");
}

fn key(u: &mut Unstructured<'_>) -> Result<&'static str> {
    u.choose(&["a", "b", "c", "d"]).copied()
}

/// `.a`, `.a.b`, `.a.b.c`.
fn field_path(u: &mut Unstructured<'_>) -> Result<String> {
    let mut path = format!(".{}", key(u)?);
    for _ in 0..u.int_in_range(0..=2)? {
        path.push('.');
        path.push_str(key(u)?);
    }
    Ok(path)
}

fn read_path(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=3)? {
        0 => format!(".{}[{}]", key(u)?, u.int_in_range(-2..=2)?),
        _ => field_path(u)?,
    })
}

fn literal(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(u.choose(&[
        "0",
        "1",
        "-3",
        "100",
        "9223372036854775807",
        "0.5",
        "-2.25",
        "0.1",
        "\"x\"",
        "\"\"",
        "\"山田\"",
        "\"a\\\"b\"",
        "true",
        "false",
        "null",
    ])?
    .to_string())
}

fn number(u: &mut Unstructured<'_>, depth: u32) -> Result<String> {
    let pick = if depth == 0 {
        0
    } else {
        u.int_in_range(0..=3)?
    };
    Ok(match pick {
        0 => match u.int_in_range(0..=2)? {
            0 => u
                .choose(&["0", "1", "-3", "100", "9223372036854775807", "0.5", "-2.25"])?
                .to_string(),
            _ => {
                let f = u.choose(&["int!", "float!", "to_float!", "to_int!"])?;
                format!("{f}({})", read_path(u)?)
            }
        },
        1 => {
            let op = u.choose(&["+", "-", "*"])?;
            format!("({} {op} {})", number(u, depth - 1)?, number(u, depth - 1)?)
        }
        2 => format!(
            "({} / {})",
            number(u, depth - 1)?,
            u.choose(&["2", "0.5", "-4"])?
        ),
        _ => {
            let f = u.choose(&["round", "floor", "ceil", "to_int", "to_float"])?;
            format!("{f}({})", number(u, depth - 1)?)
        }
    })
}

fn boolean(u: &mut Unstructured<'_>, depth: u32) -> Result<String> {
    let pick = if depth == 0 {
        u.int_in_range(0..=2)?
    } else {
        u.int_in_range(0..=4)?
    };
    Ok(match pick {
        0 => format!("bool!({})", read_path(u)?),
        1 => {
            let op = u.choose(&["==", "!="])?;
            format!("{} {op} {}", read_path(u)?, literal(u)?)
        }
        2 => {
            let op = u.choose(&["<", "<=", ">", ">="])?;
            format!("{} {op} {}", number(u, 1)?, number(u, 1)?)
        }
        3 => format!("!({})", boolean(u, depth - 1)?),
        _ => {
            let op = u.choose(&["&&", "||"])?;
            format!(
                "({}) {op} ({})",
                boolean(u, depth - 1)?,
                boolean(u, depth - 1)?
            )
        }
    })
}

fn any_value(u: &mut Unstructured<'_>) -> Result<String> {
    match u.int_in_range(0..=4)? {
        0 | 1 => read_path(u),
        2 => literal(u),
        3 => number(u, 2),
        _ => boolean(u, 1),
    }
}

fn statement(u: &mut Unstructured<'_>, depth: u32) -> Result<String> {
    let pick = if depth == 0 {
        u.int_in_range(0..=4)?
    } else {
        u.int_in_range(0..=5)?
    };
    Ok(match pick {
        0 | 1 => format!("{} = {}", field_path(u)?, any_value(u)?),
        2 => format!("x = {}", any_value(u)?),
        3 => format!("del({})", field_path(u)?),
        4 => format!("if {} {{ abort }}", boolean(u, 1)?),
        _ => format!(
            "if {} {{ {} }} else {{ {} }}",
            boolean(u, 1)?,
            statement(u, depth - 1)?,
            statement(u, depth - 1)?
        ),
    })
}

fn program(u: &mut Unstructured<'_>) -> Result<String> {
    let mut lines = vec![format!("x = {}", any_value(u)?)];
    for _ in 0..u.int_in_range(1..=4)? {
        lines.push(statement(u, 1)?);
    }
    Ok(lines.join("\n"))
}

fn json_ops(u: &mut Unstructured<'_>) -> Result<Vec<JsonOp>> {
    let path = |u: &mut Unstructured<'_>| -> Result<Vec<String>> {
        Ok(JsonOp::path(&field_path(u)?[1..]))
    };
    let constant = |u: &mut Unstructured<'_>| -> Result<Value> {
        Ok(serde_json::from_str(&literal(u)?).unwrap_or(Value::Null))
    };
    let mut ops = Vec::new();
    for _ in 0..u.int_in_range(1..=3)? {
        ops.push(match u.int_in_range(0..=3)? {
            0 => JsonOp::Filter {
                path: path(u)?,
                op: *u.choose(&[
                    CompareOp::Eq,
                    CompareOp::Ne,
                    CompareOp::Lt,
                    CompareOp::Le,
                    CompareOp::Gt,
                    CompareOp::Ge,
                ])?,
                value: constant(u)?,
            },
            1 => JsonOp::Add {
                path: path(u)?,
                value: constant(u)?,
            },
            2 => JsonOp::Rename {
                from: path(u)?,
                to: path(u)?,
            },
            _ => JsonOp::Drop { path: path(u)? },
        });
    }
    Ok(ops)
}

/// The configuration loader gives a configuration or problems, never a
/// panic.
pub fn toml_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name == "SET").then(|| "value".to_owned());
    let _ = etl::registry()
        .loader()
        .env(env)
        .text(text, Path::new("/nonexistent/etl-fuzz"));
}

/// The connection-string parser: what it hands tokio-postgres reads back
/// as the same parameters, and no secret it read is left in the redacted
/// text.
pub fn conninfo(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = etl_postgres::fuzzing::parse_conninfo(text) else {
        return;
    };
    match etl_postgres::fuzzing::parse_conninfo(&parsed.key_value) {
        Ok(again) => assert_eq!(
            again.params, parsed.params,
            "{text:?} as {:?}",
            parsed.key_value
        ),
        Err(e) => panic!("{text:?} as {:?} does not read back: {e}", parsed.key_value),
    }
    for (_, value) in &parsed.params {
        // Any value may be a secret, whatever its key: `Debug` shows none.
        // `Debug` is made of option names (lower-case letters and `_`) and
        // its own frame (`ConnInfo { params: [Some("host"), None] }`): a
        // value with any other character cannot stand in it by chance.
        let in_any_debug = |c: char| c.is_ascii_lowercase() || " _{}[]()\":,\\CINS".contains(c);
        if value.len() >= 4 && value.chars().any(|c| !in_any_debug(c)) {
            assert!(
                !parsed.debug.contains(value.as_str()),
                "a value of {text:?} in {:?}",
                parsed.debug
            );
        }
    }
}
