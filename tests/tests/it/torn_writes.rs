//! Kills during sink writes and offset commits: large records make writes
//! long and a 1 ms commit interval keeps the offset store busy, so seeded
//! kills land inside both. After every kill the offset store must load; at
//! the end every output line parses (torn tails were cut on restart) and
//! nothing is lost. A SIGKILL rarely interrupts a write system call, so
//! after every kill the suite also leaves what power loss would: half a
//! record at the end of the output and a half-written temporary file in
//! the offset store.

use etl_tests::{CrashLoop, SinkMode};

fn torn_writes(name: &str, mode: SinkMode, seed: u64) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut crash = CrashLoop::new(name, mode, 60_000, 40, seed);
    crash.pad = 2000;
    crash.kill_after_ms = (5, 60);
    crash.inspect_after_kill = true;
    crash.tear_after_kill = true;
    crash.pipeline.max_batch_records = 100;
    crash.pipeline.sink_batch_records = 100;
    crash.pipeline.commit_interval_ms = 1;
    let tally = crash
        .run(dir.path())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    println!("{tally}");
    if let Err(broken) = tally.check() {
        panic!("{broken}");
    }
    assert_eq!(tally.store_loads, tally.kills, "{tally}");
    assert!(tally.torn_tails >= tally.kills, "{tally}");
    assert_eq!(tally.distinct, tally.expected, "{tally}");
}

#[test]
fn kills_inside_writes_and_commits_leave_no_torn_record_and_a_loadable_store() {
    torn_writes("torn writes, at-least-once", SinkMode::AtLeastOnce, 21);
}

#[test]
fn kills_inside_exactly_once_writes_leave_every_record_once() {
    torn_writes("torn writes, exactly-once", SinkMode::ExactlyOnce, 22);
}
