//! The `etl` binary against input files that change between runs, that
//! are many, or that are not files: replaced and rewritten inputs are read
//! again rather than resumed at a foreign offset, a line emitted without
//! its newline keeps what is appended to it, open files stay under a cap,
//! and a FIFO is refused at once.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test, not lost data.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BINARY, etl, run};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "{}", stderr(out));
    assert!(!stderr(out).contains("panicked"), "{}", stderr(out));
}

/// How many times each id is in the output.
fn ids(path: &Path) -> BTreeMap<u64, u32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("every output line parses");
        *seen.entry(v["id"].as_u64().expect("an id")).or_default() += 1;
    }
    seen
}

fn records(ids: std::ops::Range<u64>) -> String {
    ids.map(|id| format!("{{\"id\":{id},\"pad\":\"{:040}\"}}\n", id))
        .collect()
}

fn config(dir: &Path, source_extra: &str) -> PathBuf {
    config_with(dir, source_extra, "")
}

fn config_with(dir: &Path, source_extra: &str, sink_extra: &str) -> PathBuf {
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
type = "file"
paths = ["in/*.ndjson"]
{source_extra}

[[sinks]]
name = "out"
type = "file"
path = "out/out.ndjson"
{sink_extra}

[dead_letter]
type = "file"
path = "out/dead.ndjson"

[checkpoint]
commit_interval = "100ms"
"#
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("in")).unwrap();
    config
}

/// Every id of `expected` exactly once, and nothing else.
fn assert_each_once(out: &Path, expected: impl Iterator<Item = u64>) {
    let seen = ids(out);
    let expected: BTreeMap<u64, u32> = expected.map(|id| (id, 1)).collect();
    let missing: Vec<_> = expected
        .keys()
        .filter(|id| !seen.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids missing, first {:?}",
        missing.len(),
        missing.first()
    );
    assert_eq!(seen, expected);
}

/// Replace `path` by a new file (a new inode), as `mv new path` does.
fn replace(path: &Path, content: &str) {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, content).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

#[test]
fn a_file_rewritten_shorter_in_place_is_read_again_from_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, records(0..1000)).unwrap();
    assert_ok(&run(&config));
    // Same inode, new content (what a copy-truncate rotation leaves).
    std::fs::write(&input, records(1000..1300)).unwrap();
    let out = run(&config);
    assert_ok(&out);
    assert!(stderr(&out).contains("changed"), "{}", stderr(&out));
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..1300);
}

#[test]
fn a_file_replaced_by_a_bigger_one_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, records(0..1000)).unwrap();
    assert_ok(&run(&config));
    replace(&input, &records(1000..3000));
    assert_ok(&run(&config));
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..3000);
}

#[test]
fn a_file_replaced_by_a_shorter_one_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, records(0..1000)).unwrap();
    assert_ok(&run(&config));
    replace(&input, &records(1000..1300));
    assert_ok(&run(&config));
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..1300);
}

#[test]
fn a_file_that_only_grew_is_resumed_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, records(0..1000)).unwrap();
    assert_ok(&run(&config));
    let mut text = records(0..1000);
    text.push_str(&records(1000..1500));
    std::fs::write(&input, text).unwrap();
    assert_ok(&run(&config));
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..1500);
}

#[test]
fn a_log_rotated_by_renaming_between_runs_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let input = dir.path().join("in/app.ndjson");
    std::fs::write(&input, records(0..1000)).unwrap();
    assert_ok(&run(&config));
    // The writer appends, then logrotate renames the file and a new one
    // takes its name; the glob matches both.
    append(&input, &records(1000..1200));
    std::fs::rename(&input, dir.path().join("in/app.1.ndjson")).unwrap();
    std::fs::write(&input, records(1200..1500)).unwrap();
    assert_ok(&run(&config));
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..1500);
}

#[test]
fn a_replaced_file_is_an_error_when_configured_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "on_replaced = \"fail\"");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, records(0..100)).unwrap();
    assert_ok(&run(&config));
    replace(&input, &records(100..200));
    let out = run(&config);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a.ndjson") && stderr(&out).contains("changed"),
        "{}",
        stderr(&out)
    );
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..100);
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn append(path: &Path, bytes: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes.as_bytes())
        .unwrap();
}

#[test]
fn the_rest_of_a_line_emitted_unterminated_is_read_once_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(
        dir.path(),
        "format = \"lines\"\neof = \"emit\"",
        "encoding = \"lines\"",
    );
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, "one\ntw").unwrap();
    assert_ok(&run(&config));
    let out = dir.path().join("out/out.ndjson");
    assert_eq!(lines(&out), ["one", "tw"]);
    append(&input, "o\nthree\n");
    assert_ok(&run(&config));
    assert_eq!(lines(&out), ["one", "tw", "o", "three"]);
    // Nothing more to read: the cut line is not read again.
    assert_ok(&run(&config));
    assert_eq!(lines(&out).len(), 4);
}

#[test]
fn the_rest_of_a_line_dead_lettered_unterminated_is_read_once_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "eof = \"dead_letter\"");
    let input = dir.path().join("in/a.ndjson");
    std::fs::write(&input, "{\"id\":1}\n{\"id\":").unwrap();
    assert_ok(&run(&config));
    let dead = dir.path().join("out/dead.ndjson");
    assert_eq!(lines(&dead).len(), 1);
    append(&input, "2}\n{\"id\":3}\n");
    assert_ok(&run(&config));
    // `2}` is not JSON: a dead letter, not a silently skipped byte.
    let dead = lines(&dead);
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead[1].contains("2}"), "{dead:?}");
    assert_each_once(&dir.path().join("out/out.ndjson"), [1, 3].into_iter());
}

/// Run `etl` with at most `limit` open file descriptors.
fn run_with_fd_limit(config: &Path, limit: u32) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n {limit} && exec \"$0\" --log-format json run \"$1\""
        ))
        .arg(BINARY)
        .arg(config)
        .output()
        .expect("sh runs")
}

#[test]
fn many_input_files_are_read_under_a_low_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let files = 120u64;
    for f in 0..files {
        let name = dir.path().join(format!("in/{f:03}.ndjson"));
        std::fs::write(name, records(f * 50..(f + 1) * 50)).unwrap();
    }
    let out = run_with_fd_limit(&config, 32);
    assert_ok(&out);
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..files * 50);
    // A rerun opens every file again only to find nothing left.
    let out = run_with_fd_limit(&config, 32);
    assert_ok(&out);
    assert_each_once(&dir.path().join("out/out.ndjson"), 0..files * 50);
}

#[test]
fn a_fifo_input_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let fifo = dir.path().join("in/pipe.ndjson");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let config_text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("in/*.ndjson", "in/pipe.ndjson");
    std::fs::write(&config, config_text).unwrap();
    let mut child = etl()
        .arg("run")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Not a timing assertion: a run blocked on the FIFO never ends, and
    // the test must fail rather than hang.
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("etl is still blocked opening a FIFO after a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(66), "{}", stderr(&out));
    assert!(stderr(&out).contains("FIFO"), "{}", stderr(&out));
}
