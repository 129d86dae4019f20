//! Bad input on the real `etl` binary: the checked-in corpus in
//! `tests/corpus/` (malformed JSON, invalid UTF-8, a truncated last line,
//! an oversized line, an empty file, a binary file) and generated cases (a
//! missing file, an unreadable file, a torn and a corrupted offset store,
//! invalid configuration values, a full disk). Each ends in a dead-letter
//! entry or a clear error naming the thing, with the exit code
//! `docs/operations.md` documents; nothing panics, and the counts add up.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use etl_tests::{Etl, PipelineToml, RunLog, read_output, workspace_root, write_records};

fn corpus(name: &str) -> PathBuf {
    workspace_root().join("tests").join("corpus").join(name)
}

/// A pipeline over `inputs` with `parse_json`, the filter, dead letters
/// and short lines (1 KiB); an unterminated last line is a dead letter.
fn pipeline(dir: &Path, inputs: Vec<PathBuf>) -> PipelineToml {
    let mut p = PipelineToml::new(dir, inputs);
    p.source_extra = "max_line_bytes = \"1KiB\"\neof = \"dead_letter\"\n".to_owned();
    p.commit_interval_ms = 20;
    p
}

fn run(dir: &Path, toml: &str) -> RunLog {
    let config = dir.join("pipeline.toml");
    std::fs::write(&config, toml).unwrap();
    let log = Etl::binary(&dir.join("logs"))
        .run(&[Path::new("run"), &config])
        .unwrap();
    assert!(!log.panicked(), "{}", log.stderr);
    log
}

/// Lines in a file: newline-terminated ones plus an unterminated tail.
fn lines_in(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let full = bytes.iter().filter(|b| **b == b'\n').count() as u64;
    full + u64::from(bytes.last().is_some_and(|b| *b != b'\n'))
}

/// Run a corpus file through the pipeline: exit 0, and every input line
/// is written, filtered or dead-lettered, by the `pipeline finished`
/// counts and by the files.
fn corpus_case(name: &str, dead_reason: &str) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), vec![corpus(name)]);
    let log = run(dir.path(), &p.render());
    assert_eq!(log.code, Some(0), "{name}: {}", log.stderr);
    let (written, filtered, dead) = (
        log.finished_count("written"),
        log.finished_count("filtered"),
        log.finished_count("dead_lettered"),
    );
    let lines = lines_in(&corpus(name));
    assert_eq!(
        lines,
        written + filtered + dead,
        "{name}: in = out + filtered + dead-lettered\n{}",
        log.stderr
    );
    assert_eq!(read_output(&p.output).unwrap().lines, written, "{name}");
    let letters = std::fs::read_to_string(&p.dead_letter).unwrap_or_default();
    assert_eq!(letters.lines().count() as u64, dead, "{name}");
    for letter in letters.lines() {
        let v: serde_json::Value = serde_json::from_str(letter).unwrap();
        assert!(v["key"].as_str().is_some_and(|k| !k.is_empty()), "{letter}");
        assert!(
            v["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{letter}"
        );
    }
    if !dead_reason.is_empty() {
        assert!(letters.contains(dead_reason), "{name}: {letters}");
    }
    (written, dead)
}

#[test]
fn malformed_json_goes_to_dead_letters_and_counts_add_up() {
    let (written, dead) = corpus_case("malformed.ndjson", "invalid JSON");
    assert_eq!((written, dead), (3, 5));
}

#[test]
fn invalid_utf8_goes_to_dead_letters() {
    let (written, dead) = corpus_case("invalid_utf8.ndjson", "invalid UTF-8");
    assert_eq!((written, dead), (2, 2));
}

#[test]
fn a_truncated_last_line_goes_to_dead_letters() {
    let (written, dead) = corpus_case("truncated.ndjson", "");
    assert_eq!((written, dead), (2, 1));
}

#[test]
fn an_oversized_line_goes_to_dead_letters() {
    let (written, dead) = corpus_case("oversized.ndjson", "longer than the maximum");
    assert_eq!((written, dead), (2, 1));
}

#[test]
fn an_empty_file_is_a_run_of_nothing() {
    assert_eq!(corpus_case("empty.ndjson", ""), (0, 0));
}

#[test]
fn a_binary_file_goes_to_dead_letters() {
    let (written, dead) = corpus_case("binary.bin", "");
    assert_eq!(written, 0);
    assert_eq!(dead, lines_in(&corpus("binary.bin")));
}

#[test]
fn a_truncated_last_line_waits_by_default_and_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = pipeline(dir.path(), vec![corpus("truncated.ndjson")]);
    p.source_extra = String::new();
    let log = run(dir.path(), &p.render());
    assert_eq!(log.code, Some(0), "{}", log.stderr);
    assert_eq!(log.finished_count("written"), 2);
    assert_eq!(log.finished_count("dead_lettered"), 0);
    // Offsets are line starts; the commit covers the two full lines only.
    let committed = log.finished().unwrap()["committed"]
        .as_str()
        .unwrap()
        .to_owned();
    let second_line_start = "{\"id\":1,\"amount\":50}\n".len();
    assert!(
        committed.ends_with(&format!("={}", second_line_start + 1)),
        "{committed}"
    );
}

fn expect_error(log: &RunLog, code: i32, names: &[&str]) {
    assert_eq!(log.code, Some(code), "{}", log.stderr);
    let error = log.error();
    for name in names {
        assert!(error.contains(name), "{name:?} not in: {error}");
    }
}

/// A run that halted announces no replay anywhere in its log: a halting
/// run replays nothing (the next run reads again from the last commit).
/// A "not replaying" line (a revocation's) announces none.
fn expect_no_replay_announced(log: &RunLog) {
    let replaying: Vec<&str> = log
        .stderr
        .lines()
        .filter(|line| line.contains("replaying") && !line.contains("not replaying"))
        .collect();
    assert!(replaying.is_empty(), "{replaying:#?}\nin:\n{}", log.stderr);
}

#[test]
fn a_missing_input_exits_66_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), vec![dir.path().join("missing.ndjson")]);
    expect_error(&run(dir.path(), &p.render()), 66, &["missing.ndjson"]);
}

#[test]
fn an_unreadable_input_exits_66_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("locked.ndjson");
    write_records(&input, 0..10, 1, 0).unwrap();
    std::fs::set_permissions(&input, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    // Permissions do not stop root (CI runs as root): then a folder where
    // a file is expected stands in, which nobody can read as lines.
    let input = if std::fs::File::open(&input).is_ok() {
        let folder = dir.path().join("folder.ndjson");
        std::fs::create_dir(&folder).unwrap();
        folder
    } else {
        input
    };
    let name = input.file_name().unwrap().to_string_lossy().into_owned();
    let p = pipeline(dir.path(), vec![input]);
    expect_error(&run(dir.path(), &p.render()), 66, &[&name]);
}

/// A finished run with two commits in the store (both slots written).
fn committed_run(dir: &Path) -> PipelineToml {
    let input = dir.join("in.ndjson");
    write_records(&input, 0..2000, 1, 0).unwrap();
    let mut p = pipeline(dir, vec![input]);
    p.max_batch_records = 100;
    p.commit_interval_ms = 1;
    let log = run(dir, &p.render());
    assert_eq!(log.code, Some(0), "{}", log.stderr);
    p
}

#[test]
fn a_torn_newest_store_slot_falls_back_to_the_previous_commit() {
    let dir = tempfile::tempdir().unwrap();
    let p = committed_run(dir.path());
    let newest = ["offsets.0", "offsets.1"]
        .iter()
        .map(|s| p.store.join(s))
        .max_by_key(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .unwrap();
    let text = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &text[..text.len() / 2]).unwrap();

    let log = run(dir.path(), &p.render());
    assert_eq!(log.code, Some(0), "{}", log.stderr);
    // Replay starts at the older commit: more duplicates, nothing lost.
    let out = read_output(&p.output).unwrap();
    assert_eq!(out.distinct(), 1800);
}

#[test]
fn a_corrupted_store_exits_74_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = committed_run(dir.path());
    for slot in ["offsets.0", "offsets.1"] {
        let path = p.store.join(slot);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        std::fs::write(&path, bytes).unwrap();
    }
    let log = run(dir.path(), &p.render());
    expect_error(&log, 74, &["offset store", "state", "no valid generation"]);
    let shown = Etl::binary(&dir.path().join("logs"))
        .run(&[
            Path::new("offsets"),
            Path::new("show"),
            &dir.path().join("pipeline.toml"),
        ])
        .unwrap();
    expect_error(&shown, 74, &["no valid generation"]);
}

#[test]
fn invalid_configuration_values_exit_78_listing_each_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), vec![corpus("malformed.ndjson")]);
    let toml = p
        .render()
        .replace("max_batch_records = 1000", "max_batch_records = \"many\"")
        .replace("commit_interval = \"20ms\"", "commit_interval = \"0s\"")
        .replace("[dead_letter]", "[dead_letter]\nbogus = 1");
    let log = run(dir.path(), &toml);
    expect_error(
        &log,
        78,
        &[
            "3 problems",
            "pipeline.toml:4:",
            "\"many\"",
            "commit_interval",
            "bogus",
        ],
    );
}

#[test]
fn a_full_disk_halts_with_exit_74_and_a_rerun_writes_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_records(&input, 0..200, 1, 0).unwrap();
    let mut p = pipeline(dir.path(), vec![input]);
    let output = p.output.clone();
    // `/dev/full` fails every write with ENOSPC, as a full disk does: no
    // record is at fault, so none is replayed into the dead-letter sink.
    p.output = PathBuf::from("/dev/full");
    p.sink_extra = "retry = { max_elapsed = \"50ms\" }\n".to_owned();
    p.extra = "[delivery]\nmax_replays = 1\n".to_owned();
    let log = run(dir.path(), &p.render());
    expect_error(
        &log,
        74,
        &["\"out\"", "/dev/full", "No space left on device"],
    );
    expect_no_replay_announced(&log);
    assert!(!log.stderr.contains("poison"), "{}", log.stderr);
    let dead = etl_tests::read_dead_letter_ids(&p.dead_letter).unwrap_or_default();
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");

    // Space again: the rerun starts at the last commit, which covers no
    // record the full disk refused.
    p.output = output;
    let log = run(dir.path(), &p.render());
    assert_eq!(log.code, Some(0), "{}", log.stderr);
    let written = etl_tests::read_output(&p.output).unwrap();
    let expected = (0..200).filter(|id| etl_tests::passes_filter(*id)).count() as u64;
    assert_eq!(written.distinct(), expected, "every record written");
    let dead = etl_tests::read_dead_letter_ids(&p.dead_letter).unwrap_or_default();
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
}

#[test]
fn a_full_disk_with_on_failure_halt_exits_74_naming_the_sink() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_records(&input, 0..200, 1, 0).unwrap();
    let mut p = pipeline(dir.path(), vec![input]);
    p.output = PathBuf::from("/dev/full");
    p.sink_extra = "retry = { max_elapsed = \"50ms\" }\n".to_owned();
    p.extra = "[delivery]\non_failure = \"halt\"\n".to_owned();
    let log = run(dir.path(), &p.render());
    // The sink's own error is the cause reported, whichever stop came
    // first.
    expect_error(&log, 74, &["\"out\"", "/dev/full"]);
    assert!(
        log.stderr.contains("No space left on device"),
        "{}",
        log.stderr
    );
    expect_no_replay_announced(&log);
}
