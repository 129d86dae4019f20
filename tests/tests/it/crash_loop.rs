//! SIGKILL crash loops on the real `etl` binary: a million NDJSON records
//! file to file through a filter, killed at seeded random moments at least
//! twenty times and restarted until done; then every record that passes
//! the filter is in the output, and duplicates stay within the in-flight
//! bound per kill (none at all with the exactly-once file sink).

use etl_tests::{CrashLoop, SinkMode};

const RECORDS: u64 = 1_000_000;
const KILLS: u32 = 20;

fn crash_loop(name: &str, mode: SinkMode, seed: u64) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut crash = CrashLoop::new(name, mode, RECORDS, KILLS, seed);
    // Two partitions, so the kills also land between partitions' commits.
    crash.files = 2;
    let tally = crash
        .run(dir.path())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    println!("{tally}");
    if let Err(broken) = tally.check() {
        panic!("{broken}");
    }
    assert_eq!(tally.distinct, tally.expected, "{tally}");
}

#[test]
fn at_least_once_file_sink_survives_kills_without_loss() {
    crash_loop("at-least-once file sink", SinkMode::AtLeastOnce, 11);
}

#[test]
fn exactly_once_file_sink_survives_kills_without_duplicates() {
    crash_loop("exactly-once file sink", SinkMode::ExactlyOnce, 12);
}

#[test]
fn fault_injecting_sink_survives_kills_without_loss() {
    crash_loop("fault-injecting sink", SinkMode::Faulty, 13);
}
