//! VRL programs against expected outputs, one case per file in
//! `tests/remap_corpus/`. A case has sections:
//!
//! ```text
//! --- remap            (or `--- condition` for a filter condition)
//! <program>
//! --- input
//! <one JSON record per line>
//! --- output
//! <per input line: the record written, byte for byte; `filtered`;
//!  or `dead letter: <part of the reason>`>
//! ```
//!
//! or, for a program that must not compile, `--- compile error` with a
//! part of VRL's diagnostic instead of input and output.
//!
//! Every program runs both ways: as built (the fast path when the program
//! is in its subset) and on VRL's runtime alone
//! ([`VrlProgram::runtime_only`]); the two must write the same bytes.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use etl::{ChainOutput, Remap, TransformChain, VrlFilter, VrlProgram};
use etl_record::{Offset, PartitionId, Position, Record, SourceId, Timestamp};

#[derive(Debug, Default)]
struct Case {
    remap: Option<String>,
    condition: Option<String>,
    input: Vec<String>,
    output: Vec<String>,
    compile_error: Option<String>,
}

fn parse(text: &str) -> Case {
    let mut case = Case::default();
    let mut section = String::new();
    let mut body = String::new();
    let flush = |section: &str, body: &mut String, case: &mut Case| {
        let text = std::mem::take(body);
        let lines = || {
            text.lines()
                .map(str::to_owned)
                .filter(|l| !l.is_empty())
                .collect()
        };
        match section {
            "" => {}
            "remap" => case.remap = Some(text),
            "condition" => case.condition = Some(text.trim().to_owned()),
            "input" => case.input = lines(),
            "output" => case.output = lines(),
            "compile error" => case.compile_error = Some(text.trim().to_owned()),
            other => panic!("unknown section {other:?}"),
        }
    };
    for line in text.split_inclusive('\n') {
        if let Some(name) = line.strip_prefix("--- ") {
            flush(&section, &mut body, &mut case);
            section = name.trim().to_owned();
        } else {
            body.push_str(line);
        }
    }
    flush(&section, &mut body, &mut case);
    case
}

fn record(i: usize, json: &str) -> Record {
    Record::new(
        Position::new(
            SourceId::new("orders"),
            PartitionId(3),
            Offset(i as i64 + 40),
        ),
        json.as_bytes().to_vec(),
    )
    .with_key(b"k-1".to_vec())
    .with_header("trace", b"t-9".to_vec())
    .with_timestamp(Timestamp(1_767_225_600_000))
}

/// Run a case; whether its program takes the fast path.
fn run_case(path: &Path) -> Result<bool, String> {
    let case = parse(&std::fs::read_to_string(path).unwrap());
    let compiled = match (&case.remap, &case.condition) {
        (Some(p), None) => VrlProgram::remap(p),
        (None, Some(c)) => VrlProgram::condition(c),
        _ => return Err("a case needs one `--- remap` or `--- condition`".into()),
    };
    let program = match (compiled, &case.compile_error) {
        (Err(e), Some(expected)) if e.message.contains(expected.as_str()) => return Ok(false),
        (Err(e), Some(expected)) => {
            return Err(format!(
                "expected a compile error with {expected:?}, got:\n{e}"
            ));
        }
        (Ok(_), Some(expected)) => {
            return Err(format!("compiled, expected an error with {expected:?}"));
        }
        (Err(e), None) => return Err(format!("does not compile:\n{e}")),
        (Ok(p), None) => p,
    };
    if case.input.len() != case.output.len() {
        return Err("one output line per input line".into());
    }
    let fast = program.is_fast();
    let build = |program: VrlProgram| {
        let mut chain = TransformChain::new();
        if case.remap.is_some() {
            chain.push(Box::new(Remap::new("remap", program)));
        } else {
            chain.push(Box::new(VrlFilter::new("filter", program)));
        }
        chain
    };
    let mut runtime = build(program.clone().runtime_only());
    let mut chain = build(program);
    // Every case runs on a fork too, as the worker pool would.
    let mut fork = chain.fork().ok_or("the chain does not fork")?;
    for (i, (input, expected)) in case.input.iter().zip(&case.output).enumerate() {
        let mut outputs = Vec::new();
        for chain in [&mut runtime, &mut chain, &mut fork] {
            let mut out = ChainOutput::default();
            chain.apply(vec![record(i, input)], &mut out);
            let got = if out.filtered == 1 {
                "filtered".to_owned()
            } else if let Some(letter) = out.rejected.first() {
                if letter.record.value != input.as_bytes() {
                    return Err(format!(
                        "line {}: a dead letter must hold the record as it came",
                        i + 1
                    ));
                }
                format!("dead letter: {}", letter.reason)
            } else {
                out.kept
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.value).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let matches = match expected.strip_prefix("dead letter: ") {
                Some(part) => got.starts_with("dead letter: ") && got.contains(part),
                None => &got == expected,
            };
            if !matches {
                return Err(format!(
                    "line {}:\n  input    {input}\n  expected {expected}\n  got      {got}",
                    i + 1
                ));
            }
            outputs.push(got);
        }
        if outputs.iter().any(|o| *o != outputs[0]) {
            return Err(format!(
                "line {}: the fast path and VRL's runtime differ:\n  input   {input}\n  runtime {}\n  fast    {}",
                i + 1,
                outputs[0],
                outputs[1]
            ));
        }
    }
    Ok(fast)
}

/// Run a `remap` case behind a step that keeps every record (`before`,
/// TOML), as a chain built from a configuration: the two read each
/// record once between them when both have a fast form. The outputs must
/// be the case's, byte for byte.
fn run_case_behind(path: &Path, before: &str) -> Result<(), String> {
    let case = parse(&std::fs::read_to_string(path).unwrap());
    let Some(program) = case.remap.as_ref().filter(|_| case.compile_error.is_none()) else {
        return Ok(());
    };
    let config = format!(
        "[source]\ntype = \"generator\"\n{before}\n[[transforms]]\ntype = \"remap\"\n\
         source = '''\n{program}'''\n[[sinks]]\ntype = \"blackhole\"\n"
    );
    let config = etl::registry()
        .loader()
        .text(&config, Path::new("."))
        .map_err(|e| format!("the configuration does not parse: {e:?}"))?;
    let mut chain = etl::try_chain_from_config(&config.transforms).map_err(|e| e.to_string())?;
    let mut fork = chain.fork().ok_or("the chain does not fork")?;
    for (i, (input, expected)) in case.input.iter().zip(&case.output).enumerate() {
        for chain in [&mut chain, &mut fork] {
            let mut out = ChainOutput::default();
            chain.apply(vec![record(i, input)], &mut out);
            let got = if out.filtered == 1 {
                "filtered".to_owned()
            } else if let Some(letter) = out.rejected.first() {
                if letter.record.value != input.as_bytes() {
                    return Err(format!(
                        "line {}: a dead letter must hold the record as it came",
                        i + 1
                    ));
                }
                format!("dead letter: {}", letter.reason)
            } else {
                out.kept
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.value).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let matches = match expected.strip_prefix("dead letter: ") {
                Some(part) => got.starts_with("dead letter: ") && got.contains(part),
                None => &got == expected,
            };
            if !matches {
                return Err(format!(
                    "line {} behind {before:?}:\n  input    {input}\n  expected {expected}\n  got      {got}",
                    i + 1
                ));
            }
        }
    }
    Ok(())
}

/// Every `remap` case behind a filter condition and behind a declarative
/// filter, both keeping every record: the chain then reads each record
/// once for the two steps (a run of the fast path), and must write what
/// the `remap` step alone writes.
#[test]
fn every_corpus_remap_behind_a_filter_gives_its_expected_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/remap_corpus");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    paths.sort();
    let mut failures = Vec::new();
    for before in [
        "[[transforms]]\ntype = \"filter\"\ncondition = '.absent_field == null'\n",
        "[[transforms]]\ntype = \"filter\"\nfield = \"absent.field\"\nop = \"!=\"\nvalue = 1\n",
    ] {
        for p in &paths {
            if let Err(e) = run_case_behind(p, before) {
                failures.push(format!("{}: {e}", p.file_name().unwrap().to_string_lossy()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_corpus_program_gives_its_expected_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/remap_corpus");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 30, "the corpus has {} cases", paths.len());
    let (mut failures, mut fast) = (Vec::new(), 0);
    for p in &paths {
        match run_case(p) {
            Ok(f) => fast += usize::from(f),
            Err(e) => failures.push(format!("{}: {e}", p.file_name().unwrap().to_string_lossy())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{fast} of {} programs take the fast path", paths.len());
    assert!(
        fast >= 20,
        "only {fast} of {} programs take the fast path",
        paths.len()
    );
}

#[test]
fn the_everyday_programs_take_the_fast_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let orders = std::fs::read_to_string(root.join("examples/remap_orders/orders.vrl")).unwrap();
    for program in [
        ".amount_cents = to_int(round(to_float!(.amount) * 100))",
        orders.as_str(),
        "if to_float!(.amount) < 1 { abort }\n.y = .x",
    ] {
        assert!(VrlProgram::remap(program).unwrap().is_fast(), "{program}");
    }
    assert!(
        VrlProgram::condition(r#".order.status == "paid""#)
            .unwrap()
            .is_fast()
    );
    for program in [".k = %key", r#".u = upcase(string!(.name))"#] {
        assert!(!VrlProgram::remap(program).unwrap().is_fast(), "{program}");
    }
}
