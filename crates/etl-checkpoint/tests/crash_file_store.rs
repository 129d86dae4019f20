//! `FileStore` against SIGKILL: a child process commits in a loop and
//! reports each commit after it returns; the parent kills it at arbitrary
//! moments, many times. Every restart must load a valid commit at least as
//! new as the last one the child reported, with both partitions of one
//! commit together.
//!
//! This binary runs without the libtest harness: the same `main` is the
//! parent, or the child when `ETL_CHECKPOINT_CRASH_CHILD` names a folder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use etl_checkpoint::{FileStore, OffsetStore, PartitionOffsets};
use etl_record::{Offset, PartitionId};

const NAME: &str = "file_store_survives_sigkill";
const CHILD_ENV: &str = "ETL_CHECKPOINT_CRASH_CHILD";
const ROUNDS: u64 = 25;
const P0: PartitionId = PartitionId(0);
const P1: PartitionId = PartitionId(1);

fn main() -> ExitCode {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        return child(Path::new(&dir));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    if !selected(&args) {
        println!("\nrunning 0 tests (filtered out: {NAME})\n");
        return ExitCode::SUCCESS;
    }
    println!("\nrunning 1 test");
    parent();
    println!("test {NAME} ... ok\n");
    ExitCode::SUCCESS
}

/// libtest's filter rules, as far as `cargo test` and `cargo xtask` use
/// them: positional substrings select, `--skip` substrings deselect.
fn selected(args: &[String]) -> bool {
    let mut filters = Vec::new();
    let mut skips = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--skip" {
            skips.extend(it.next().cloned());
        } else if !a.starts_with('-') {
            filters.push(a.clone());
        }
    }
    (filters.is_empty() || filters.iter().any(|f| NAME.contains(f.as_str())))
        && !skips.iter().any(|s| NAME.contains(s.as_str()))
}

/// Commit `{P0: n, P1: n}` for n = 1, 2, ... and report each commit.
fn child(dir: &Path) -> ExitCode {
    let mut store = FileStore::open(dir).expect("the store opens");
    let mut n = store
        .load()
        .expect("the store loads")
        .get(&P0)
        .map_or(0, |o| o.0);
    let mut out = std::io::stdout().lock();
    loop {
        n += 1;
        let offsets: PartitionOffsets = [(P0, Offset(n)), (P1, Offset(n))].into();
        store.commit(&offsets).expect("commit");
        writeln!(out, "{n}")
            .and_then(|()| out.flush())
            .expect("report");
    }
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut reported = 0i64;
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Let it commit a varying number of times, then kill it mid-flight.
        let wait_for = 1 + (round * 7) % 11;
        for _ in 0..wait_for {
            match lines.next() {
                Some(Ok(line)) => reported = line.parse().unwrap(),
                other => panic!("round {round}: the child stopped early: {other:?}"),
            }
        }
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        // Reports already written before the kill count too.
        for line in lines.map_while(Result::ok) {
            if let Ok(n) = line.parse() {
                reported = n;
            }
        }
        let loaded = FileStore::open(dir.path())
            .and_then(|mut s| s.load())
            .unwrap_or_else(|e| panic!("round {round}: no valid commit after SIGKILL: {e}"));
        let (p0, p1) = (loaded[&P0].0, loaded[&P1].0);
        assert_eq!(p0, p1, "round {round}: one commit, both partitions");
        assert!(
            p0 >= reported,
            "round {round}: loaded {p0}, but {reported} was reported committed"
        );
        // At most the commit in progress at the kill is newer.
        assert!(
            p0 <= reported + 1,
            "round {round}: loaded {p0} > {reported} + 1"
        );
        reported = p0;
    }
}
