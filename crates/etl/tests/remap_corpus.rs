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

#![cfg(feature = "remap")]
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

fn run_case(path: &Path) -> Result<(), String> {
    let case = parse(&std::fs::read_to_string(path).unwrap());
    let compiled = match (&case.remap, &case.condition) {
        (Some(p), None) => VrlProgram::remap(p),
        (None, Some(c)) => VrlProgram::condition(c),
        _ => return Err("a case needs one `--- remap` or `--- condition`".into()),
    };
    let program = match (compiled, &case.compile_error) {
        (Err(e), Some(expected)) if e.message.contains(expected.as_str()) => return Ok(()),
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
    let mut chain = TransformChain::new();
    if case.remap.is_some() {
        chain.push(Box::new(Remap::new("remap", program)));
    } else {
        chain.push(Box::new(VrlFilter::new("filter", program)));
    }
    // Every case runs on a fork too, as the worker pool would.
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
                    "line {}:\n  input    {input}\n  expected {expected}\n  got      {got}",
                    i + 1
                ));
            }
        }
    }
    Ok(())
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
    let failures: Vec<String> = paths
        .iter()
        .filter_map(|p| {
            run_case(p)
                .err()
                .map(|e| format!("{}: {e}", p.file_name().unwrap().to_string_lossy()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
