//! The `etl` binary end to end on real files: a full run, resume, a
//! graceful stop on SIGTERM, offsets reset, and configuration errors with
//! their exit codes.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test, not lost data.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BINARY, etl, run};

/// The fields of the `pipeline finished` log line.
fn finished(out: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "pipeline finished")
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"))
}

fn ids(path: &Path) -> HashMap<u64, u32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = HashMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("every output line parses");
        *seen.entry(v["id"].as_u64().expect("an id")).or_default() += 1;
    }
    seen
}

fn write_input(dir: &Path, records: u64) -> PathBuf {
    let input = dir.join("in.ndjson");
    let mut text = String::new();
    for id in 0..records {
        text.push_str(&format!("{{\"id\":{id},\"amount\":{}}}\n", id % 100));
    }
    text.push_str("not json\n");
    std::fs::write(&input, text).unwrap();
    input
}

fn file_config(dir: &Path) -> PathBuf {
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 10

[[transforms]]
type = "add_field"
field = "seen"
value = true

[[sinks]]
name = "out"
type = "file"
path = "out/out.ndjson"

[dead_letter]
type = "file"
path = "out/dead.ndjson"

[checkpoint]
commit_interval = "100ms"
"#,
    )
    .unwrap();
    config
}

#[test]
fn runs_then_resumes_without_redoing_work() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path(), 1000);
    let config = file_config(dir.path());

    let first = run(&config);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let summary = finished(&first);
    // The line that is not JSON reaches the JSON steps, which reject it.
    assert_eq!(summary["read"], 1001);
    assert_eq!(summary["filtered"], 100);
    assert_eq!(summary["written"], 900);
    assert_eq!(summary["dead_lettered"], 1, "the line that is not JSON");
    let out = ids(&dir.path().join("out/out.ndjson"));
    assert_eq!(out.len(), 900);
    assert!(out.values().all(|n| *n == 1));
    let dead = std::fs::read_to_string(dir.path().join("out/dead.ndjson")).unwrap();
    assert!(
        dead.contains("not json") && dead.contains("invalid JSON"),
        "{dead}"
    );

    let second = run(&config);
    assert!(second.status.success());
    assert_eq!(finished(&second)["read"], 0, "everything was committed");
    assert_eq!(ids(&dir.path().join("out/out.ndjson")).len(), 900);

    let shown = etl()
        .args(["offsets", "show", "--json"])
        .arg(&config)
        .output()
        .unwrap();
    let offsets: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    // Offsets are byte positions of line starts; the commit is one past
    // the last line's start.
    let input_len = std::fs::metadata(dir.path().join("in.ndjson"))
        .unwrap()
        .len();
    let last_line_start = input_len - "not json\n".len() as u64;
    let committed = &offsets["partitions"][0]["committed"];
    assert_eq!(
        committed.as_u64(),
        Some(last_line_start + 1),
        "committed past the last line"
    );
}

#[test]
fn offsets_reset_replays_from_the_reset_point() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path(), 200);
    let config = file_config(dir.path());
    assert!(run(&config).status.success());

    let reset = etl()
        .args(["offsets", "reset", "--to", "0"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    assert!(String::from_utf8_lossy(&reset.stdout).contains("-> 0"));

    let again = run(&config);
    assert!(again.status.success());
    assert_eq!(finished(&again)["read"], 201, "replayed from offset 0");
    let out = ids(&dir.path().join("out/out.ndjson"));
    assert!(
        out.values().all(|n| *n == 2),
        "every record written twice: at-least-once replay"
    );
}

fn wait_for_lines(path: &Path, at_least: usize, limit: Duration) {
    let started = Instant::now();
    while started.elapsed() < limit {
        let n = std::fs::read_to_string(path).map_or(0, |t| t.lines().count());
        if n >= at_least {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} did not reach {at_least} lines", path.display());
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[test]
fn sigterm_stops_gracefully_and_a_restart_loses_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gen.toml");
    let total = 40_000u64;
    std::fs::write(
        &config,
        format!(
            r#"
[source]
type = "generator"
partitions = 2
records_per_partition = {}
rate = 20000
max_batch_records = 100

[[sinks]]
type = "file"
path = "out.ndjson"
linger = "5ms"

[checkpoint]
commit_interval = "50ms"
"#,
            total / 2
        ),
    )
    .unwrap();
    let output = dir.path().join("out.ndjson");

    let child = etl()
        .arg("run")
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lines(&output, 2000, Duration::from_secs(60));
    signal(&child, "TERM");
    let stopped = child.wait_with_output().unwrap();
    assert!(
        stopped.status.success(),
        "exit {:?}: {}",
        stopped.status,
        String::from_utf8_lossy(&stopped.stderr)
    );
    let summary = finished(&stopped);
    assert_eq!(summary["stopped_by_signal"], true);
    let written_before = ids(&output).len() as u64;
    assert!(written_before < total, "stopped early");

    let rest = etl().arg("run").arg(&config).output().unwrap();
    assert!(rest.status.success());
    let out = ids(&output);
    assert_eq!(out.len() as u64, total, "nothing lost");
    let repeated: Vec<_> = out.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "a clean stop commits what it wrote: {} repeated",
        repeated.len()
    );
    assert_eq!(
        finished(&rest)["read"].as_u64(),
        Some(total - written_before)
    );
}

#[test]
fn invalid_config_exits_78_with_every_problem_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[source]\ntype = \"file\"\npaths = []\n\n[[sinks]]\ntype = \"file\"\npath = \"o\"\nlinger = \"soon\"\n",
    )
    .unwrap();
    for command in ["validate", "run"] {
        let out = etl().arg(command).arg(&config).output().unwrap();
        assert_eq!(out.status.code(), Some(78), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("bad.toml:3:1: [source]: paths is empty"),
            "{stderr}"
        );
        assert!(stderr.contains("bad.toml:8:"), "{stderr}");
    }
    let missing = etl()
        .arg("run")
        .arg(dir.path().join("nope.toml"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(66));
}

#[test]
fn a_missing_input_file_exits_66_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = file_config(dir.path());
    let out = run(&config);
    assert_eq!(out.status.code(), Some(66));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in.ndjson"));
}

#[test]
fn help_explains_exit_codes() {
    let out = Command::new(BINARY).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("EXIT CODES") && text.contains("78"), "{text}");
}

#[test]
fn serves_prometheus_metrics_and_logs_progress_while_running() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gen.toml");
    std::fs::write(
        &config,
        r#"
[source]
type = "generator"
partitions = 2
records_per_partition = 1000000
rate = 5000

[[sinks]]
name = "nowhere"
type = "blackhole"

[checkpoint]
commit_interval = "50ms"
store = { type = "memory" }
"#,
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = etl()
        .arg("run")
        .arg(&config)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--progress-interval", "0.1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let page = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no metrics page"
        );
        std::thread::sleep(Duration::from_millis(100));
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut page = String::new();
        s.read_to_string(&mut page).unwrap();
        if page.contains("etl_partition_committed_offset{partition=\"1\"}") {
            break page;
        }
    };
    // Let a few progress reports follow the first commit.
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    for family in [
        "etl_records_read_total",
        "etl_partition_watermark{partition=\"0\"}",
        "etl_partition_in_flight_batches",
        "etl_partition_oldest_unresolved_seconds",
        "etl_partition_stale_acks_total",
        "etl_sink_records_written_total{sink=\"nowhere\"}",
        "etl_sink_batches_fenced_total{sink=\"nowhere\"} 0",
        "etl_sink_write_latency_max_seconds",
    ] {
        assert!(page.contains(family), "{family} missing from:\n{page}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let progress = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "progress" && v["read"].as_u64() > Some(0))
        // The first lines may come before the first commit.
        .find(|v| v["committed"].as_str().is_some_and(|c| c.contains('=')))
        .unwrap_or_else(|| panic!("no progress line with commits in:\n{stderr}"));
    assert!(progress["records_per_sec"].is_u64());
}

#[test]
fn validate_checks_connector_tables_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("connectors.toml");
    std::fs::write(
        &config,
        r#"
[source]
type = "generator"

[[sinks]]
name = "db"
type = "postgres"
url = "postgres://etl@127.0.0.1:1/nowhere"

[[sinks]]
name = "topic"
type = "kafka"
brokers = "127.0.0.1:1"
topic = "out"
colour = "blue"
"#,
    )
    .unwrap();
    // Kafka tables are read with the rest of the file: a problem has its
    // line, and `etl run` finds it before anything starts.
    for command in ["validate", "run"] {
        let out = etl().arg(command).arg(&config).output().unwrap();
        assert_eq!(out.status.code(), Some(78), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("connectors.toml:15:1: [[sinks]] #2: kafka: unknown field `colour`"),
            "{stderr}"
        );
    }
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("colour = \"blue\"\n", "")).unwrap();
    let out = etl().arg("validate").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sink \"db\" (postgres)") && stderr.contains("table"),
        "{stderr}"
    );
}

/// A generator pipeline (2 partitions of 20,000 records, 500 a second:
/// still running when the test acts on it) writing `out.ndjson`, with its
/// offset store at `state`.
fn slow_config(dir: &Path, name: &str, state: &str, extra: &str) -> PathBuf {
    let config = dir.join(name);
    std::fs::write(
        &config,
        format!(
            r#"
[source]
type = "generator"
partitions = 2
records_per_partition = 20000
rate = 500
max_batch_records = 100

[[sinks]]
type = "file"
path = "out.ndjson"
linger = "5ms"
{extra}

[checkpoint]
commit_interval = "50ms"
store = {{ type = "file", path = "{state}" }}
"#
        ),
    )
    .unwrap();
    config
}

/// The committed offset of each partition, from `etl offsets show`.
fn committed(config: &Path) -> HashMap<u64, u64> {
    let show = etl()
        .args(["offsets", "show", "--json"])
        .arg(config)
        .output()
        .unwrap();
    assert!(show.status.success(), "{show:?}");
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    json["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["partition"].as_u64().unwrap(),
                row["committed"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_second_run_on_the_same_state_exits_75_naming_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let config = slow_config(dir.path(), "gen.toml", ".etl-state", "exactly_once = true");
    // Same output, another store: the output's own lock refuses it.
    let other = slow_config(
        dir.path(),
        "other.toml",
        "other-state",
        "exactly_once = true",
    );
    let output = dir.path().join("out.ndjson");
    let mut holder = etl()
        .arg("run")
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_lines(&output, 200, Duration::from_secs(60));
    let pid = holder.id().to_string();
    for (config, lock) in [(&config, ".etl-state/lock"), (&other, "out.ndjson.lock")] {
        let second = run(config);
        let stderr = String::from_utf8_lossy(&second.stderr);
        assert_eq!(second.status.code(), Some(75), "{stderr}");
        assert!(
            stderr.contains(&format!("pid {pid}")) && stderr.contains(lock),
            "{stderr}"
        );
    }
    // `offsets show` reads without the lock; `offsets reset` needs it.
    committed(&config);
    let reset = etl()
        .args(["offsets", "reset", "--to", "0"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(reset.status.code(), Some(75), "{reset:?}");
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the holder was still running through all of the above"
    );

    // kill -9: the kernel releases the locks; the stale pid in the lock
    // files does not block the next run, which finishes the work once.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let fast = dir.path().join("fast.toml");
    std::fs::write(
        &fast,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("rate = 500\n", ""),
    )
    .unwrap();
    let rest = run(&fast);
    assert!(
        rest.status.success(),
        "{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    let out = ids(&output);
    assert_eq!(out.len(), 40_000, "nothing lost");
    assert!(out.values().all(|n| *n == 1), "exactly once");
}

#[test]
fn an_offset_store_that_cannot_be_opened_exits_74_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // These fail for root too: a folder under a regular file (ENOTDIR), a
    // folder /proc refuses, and a lock file that is a folder (EISDIR).
    std::fs::write(dir.path().join("a-file"), "").unwrap();
    std::fs::create_dir_all(dir.path().join("locked-by-a-folder/lock")).unwrap();
    for (state, named) in [
        ("a-file/state", "a-file/state"),
        ("/proc/etl-state", "/proc/etl-state"),
        ("locked-by-a-folder", "locked-by-a-folder/lock"),
    ] {
        let config = slow_config(dir.path(), "gen.toml", state, "");
        let out = run(&config);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{state}: {stderr}");
        assert!(
            stderr.contains("offset store") && stderr.contains(named),
            "{state}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_deleted_output_file_stops_the_run_instead_of_exiting_0() {
    let dir = tempfile::tempdir().unwrap();
    // The default retry budget: a lost output is not retried at all, so
    // the run stops at once rather than after minutes of retries.
    let config = slow_config(dir.path(), "gen.toml", ".etl-state", "");
    let output = dir.path().join("out.ndjson");
    let child = etl()
        .arg("run")
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lines(&output, 200, Duration::from_secs(60));
    // A second name keeps the deleted file's content for the checks below;
    // the output's own path is gone all the same.
    let kept = dir.path().join("kept.ndjson");
    std::fs::hard_link(&output, &kept).unwrap();
    std::fs::remove_file(&output).unwrap();
    let stopped = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(
        stopped.status.code(),
        Some(74),
        "an output lost is an I/O error of the output: {stderr}"
    );
    assert!(
        stderr.contains("out.ndjson") && stderr.contains("deleted"),
        "{stderr}"
    );
    assert!(!output.exists(), "the sink does not recreate the file");
    // Nothing was committed past what the lost file holds: every record
    // below each partition's committed offset is in it (the generator's
    // id is offset * partitions + partition).
    let written = ids(&kept);
    let committed = committed(&config);
    let total: u64 = committed.values().sum();
    assert!(total < 40_000, "committed {committed:?}");
    for (partition, end) in committed {
        for offset in 0..end {
            assert!(
                written.contains_key(&(offset * 2 + partition)),
                "partition {partition} committed {end}, but offset {offset} is not in the file"
            );
        }
    }
}

/// 20 NDJSON lines, the tenth of which (offset 9 in line numbers) is not
/// JSON, and an exactly-once file sink; `[dead_letter]` only when asked.
fn exactly_once_config(dir: &Path, dead_letter: bool) -> PathBuf {
    let mut input = String::new();
    for id in 0..20 {
        if id == 9 {
            input.push_str("not json\n");
        } else {
            input.push_str(&format!("{{\"id\":{id}}}\n"));
        }
    }
    std::fs::write(dir.join("in.ndjson"), input).unwrap();
    let config = dir.join("exactly_once.toml");
    let mut text = r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[sinks]]
name = "out"
type = "file"
path = "out.ndjson"
exactly_once = true

[checkpoint]
commit_interval = "50ms"
"#
    .to_owned();
    if dead_letter {
        text.push_str("\n[dead_letter]\ntype = \"file\"\npath = \"dead.ndjson\"\n");
    }
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn exactly_once_progress_never_skips_a_dead_letter_that_was_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let halted = run(&exactly_once_config(dir.path(), false));
    assert_eq!(
        halted.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&halted.stderr)
    );
    // The sink did store the good lines around the bad one: its progress
    // is past the line that went nowhere.
    assert_eq!(ids(&dir.path().join("out.ndjson")).len(), 19);

    let rerun = run(&exactly_once_config(dir.path(), true));
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let dead = std::fs::read_to_string(dir.path().join("dead.ndjson")).unwrap_or_default();
    assert!(
        dead.contains("not json"),
        "the bad line was never dead-lettered: {dead:?}"
    );
    let out = ids(&dir.path().join("out.ndjson"));
    assert_eq!(out.len(), 19);
    assert!(
        out.values().all(|n| *n == 1),
        "the exactly-once sink wrote a line twice: {out:?}"
    );
}

#[test]
fn a_zero_batch_size_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("zero.toml");
    std::fs::write(
        &config,
        "[source]\ntype = \"generator\"\n\n[[sinks]]\ntype = \"file\"\npath = \"o\"\n\
         batch_max_bytes = \"0B\"\n\n[checkpoint]\nshutdown_timeout = \"0s\"\n",
    )
    .unwrap();
    for command in ["validate", "run"] {
        let out = etl().arg(command).arg(&config).output().unwrap();
        assert_eq!(out.status.code(), Some(78), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for key in [
            "zero.toml:7:1: [[sinks]] #1: batch_max_bytes must be at least 1",
            "zero.toml:10:1: [checkpoint]: shutdown_timeout must be above zero",
        ] {
            assert!(stderr.contains(key), "{command}: {key} missing in {stderr}");
        }
    }
}

#[test]
fn stdout_into_a_closed_pipe_exits_74_naming_the_sink_and_dead_letters_nothing() {
    // `etl run ... | head -1`: the reader goes away. That is no bad
    // record: the run halts, it does not replay and dead-letter for ever.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pipeline.toml");
    std::fs::write(
        &config,
        r#"
[source]
type = "generator"
partitions = 2
records_per_partition = 200000

[[sinks]]
name = "console"
type = "stdout"
on_permanent_error = "dead_letter"

[dead_letter]
type = "file"
path = "dead.ndjson"

[checkpoint]
store = { type = "file", path = "state" }
"#,
    )
    .unwrap();
    let mut child = etl()
        .arg("run")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before anything is read.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("console"), "{stderr}");
    assert!(stderr.to_lowercase().contains("broken pipe"), "{stderr}");
    assert!(!stderr.contains("poison"), "{stderr}");
    // A halting run replays nothing, so its log announces no replay
    // ("not replaying" lines, of a revocation, announce none).
    let replaying: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("replaying") && !l.contains("not replaying"))
        .collect();
    assert!(replaying.is_empty(), "{replaying:#?}\nin:\n{stderr}");
    let dead = std::fs::read_to_string(dir.path().join("dead.ndjson")).unwrap_or_default();
    assert!(dead.is_empty(), "nothing dead-lettered: {dead}");
}

/// Where standard error goes is the environment's business: a full
/// device or a closed descriptor loses the log lines, never the run.
#[test]
fn a_full_or_closed_standard_error_neither_kills_nor_changes_the_run() {
    for redirect in ["2>/dev/full", "2>&-"] {
        let dir = tempfile::tempdir().unwrap();
        let mut input = String::new();
        for id in 0..1000 {
            input.push_str(&format!("{{\"id\":{id}}}\n"));
        }
        std::fs::write(dir.path().join("in.ndjson"), &input).unwrap();
        let config = dir.path().join("p.toml");
        std::fs::write(
            &config,
            r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[sinks]]
type = "file"
path = "out.ndjson"

[checkpoint]
store = { type = "file", path = ".etl-state" }
"#,
        )
        .unwrap();
        let script = format!("exec {redirect}; ETL_LOG=trace exec \"$0\" run \"$1\"; ",);
        let status = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(BINARY)
            .arg(&config)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0), "{redirect}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap(),
            input,
            "{redirect}"
        );
        // Standard output full: the command's output is lost, an I/O
        // error (74), not a panic.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec {redirect}; exec \"$0\" validate \"$1\" >/dev/full"
            ))
            .arg(BINARY)
            .arg(&config)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(74), "{redirect}, validate >/dev/full");
        // A failing run keeps its documented exit code.
        std::fs::write(&config, "[source]\ntype = \"nope\"\n").unwrap();
        let status = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(BINARY)
            .arg(&config)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(78), "{redirect}");
    }
}

#[test]
fn offsets_show_names_each_partition_and_says_what_the_value_means() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path(), 100);
    let config = file_config(dir.path());
    assert!(run(&config).status.success());
    let table = etl()
        .args(["offsets", "show"])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(text.contains("in.ndjson"), "{text}");
    assert!(text.contains("byte position"), "{text}");
    let json = etl()
        .args(["offsets", "show", "--json"])
        .arg(&config)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let row = &json["partitions"][0];
    assert!(
        row["input"].as_str().unwrap().ends_with("in.ndjson"),
        "{json}"
    );
    assert!(
        json["committed_means"].as_str().unwrap().contains("byte"),
        "{json}"
    );
}

#[test]
fn offsets_reset_refuses_negative_offsets_unknown_partitions_and_offsets_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 100);
    let config = file_config(dir.path());
    assert!(run(&config).status.success());
    let before = committed(&config);
    let partition = before.keys().next().unwrap().to_string();
    let len = std::fs::metadata(&input).unwrap().len();
    for (args, says) in [
        (vec!["--to=-1"], "negative"),
        (vec!["--partition", "12345", "--to", "0"], "12345"),
        (
            vec!["--partition", &partition, "--to", &(len + 1).to_string()],
            "past the end",
        ),
    ] {
        let out = etl()
            .args(["offsets", "reset"])
            .args(&args)
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(committed(&config), before, "nothing was reset");
    // The end of the file itself is a valid place to start.
    let out = etl()
        .args(["offsets", "reset", "--partition", &partition, "--to"])
        .arg(len.to_string())
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_corrupted_store_is_repaired_by_the_reset_its_error_suggests() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path(), 100);
    let config = file_config(dir.path());
    assert!(run(&config).status.success());
    let partition = committed(&config).keys().next().unwrap().to_string();
    let store = dir.path().join(".etl-state");
    for slot in ["offsets.0", "offsets.1"] {
        let path = store.join(slot);
        if let Ok(mut bytes) = std::fs::read(&path) {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x55;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let failed = run(&config);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(failed.status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("etl offsets reset"), "{stderr}");
    // Without a partition there is nothing to say what to write.
    let refused = etl()
        .args(["offsets", "reset", "--to", "0"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(74));
    let repaired = etl()
        .args(["offsets", "reset", "--partition", &partition, "--to", "0"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(repaired.status.success(), "{repaired:?}");
    let again = run(&config);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(finished(&again)["read"], 101, "read again from the start");
}

#[test]
fn an_output_that_cannot_be_opened_exits_74_naming_the_sink_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.ndjson"), "{\"a\":1}\n").unwrap();
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    let immutable = dir.path().join("immutable");
    std::fs::write(&immutable, "").unwrap();
    // EPERM even for root, where the file system has the attribute; the
    // guard takes it off again, or the folder could not be removed.
    struct Mutable<'a>(&'a Path);
    impl Drop for Mutable<'_> {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(self.0).status();
        }
    }
    let _mutable = Mutable(&immutable);
    let chattr = Command::new("chattr").arg("+i").arg(&immutable).status();
    // An output path that is a folder is a configuration problem, found
    // before the run (see
    // `validate_and_run_refuse_the_same_unusable_settings_at_their_line`).
    let mut cases = vec![("a-file/out.ndjson", "File exists")];
    if chattr.is_ok_and(|s| s.success()) {
        cases.push(("immutable", "Operation not permitted"));
    }
    for (output, reason) in cases {
        let config = dir.path().join("p.toml");
        std::fs::write(
            &config,
            format!(
                "[source]\ntype = \"file\"\npaths = [\"in.ndjson\"]\n\
                 [[sinks]]\nname = \"out\"\ntype = \"file\"\npath = \"{output}\"\n\
                 [checkpoint]\nstore = {{ type = \"memory\" }}\n"
            ),
        )
        .unwrap();
        let out = run(&config);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{output}: {stderr}");
        assert!(
            stderr.contains("sink \"out\"") && stderr.contains(reason),
            "{output}: {stderr}"
        );
    }
}

/// A Kafka source whose broker refuses connections says so once, then at
/// most every 10 s, instead of librdkafka's error and a consumer warning
/// for every reconnection attempt (hundreds in a few seconds before).
#[cfg(feature = "kafka")]
#[test]
fn an_unreachable_broker_is_reported_once_not_for_every_reconnection() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = dir.path().join("down.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:{port}\"\ngroup_id = \"g\"\n\
             topics = [\"t\"]\n[[sinks]]\ntype = \"blackhole\"\n\
             [checkpoint]\nstore = {{ type = \"source\" }}\nshutdown_timeout = \"2s\"\n"
        ),
    )
    .unwrap();
    let child = etl()
        .arg("run")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let unreachable = stderr
        .lines()
        .filter(|l| l.contains("Kafka brokers unreachable"))
        .count();
    assert_eq!(unreachable, 1, "{stderr}");
    let warnings_and_errors = stderr
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .count();
    assert!(
        warnings_and_errors <= 3,
        "the outage, the stop, perhaps a commit that timed out: {stderr}"
    );
}

/// A stdout pipeline over 1,000 input lines with its offset store at
/// `state`; `extra` goes into the sink's table.
fn stdout_config(dir: &Path, extra: &str) -> PathBuf {
    let mut input = String::new();
    for id in 0..1000 {
        input.push_str(&format!("{{\"id\":{id}}}\n"));
    }
    std::fs::write(dir.join("in.ndjson"), input).unwrap();
    let config = dir.join("stdout.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[sinks]]
name = "console"
type = "stdout"
{extra}

[checkpoint]
store = {{ type = "file", path = "state" }}
"#
        ),
    )
    .unwrap();
    config
}

/// `etl run` with standard output set up by `redirect` in a shell.
fn run_redirected(config: &Path, redirect: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec \"$0\" --log-format json run \"$1\" {redirect}"
        ))
        .arg(BINARY)
        .arg(config)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// A standard output that is closed (`>&-`, which the process finds as
/// the null device: Rust's runtime opens `/dev/null` on a closed
/// descriptor 0-2), open for reading only (`1</dev/null`, whose writes
/// fail with EBADF, which `std::io::stdout` takes for success), or the
/// null device, keeps no record: the run must not count them written.
#[test]
fn a_closed_read_only_or_null_standard_output_exits_74_and_commits_nothing() {
    for redirect in [">&-", "1</dev/null", ">/dev/null"] {
        let dir = tempfile::tempdir().unwrap();
        let config = stdout_config(dir.path(), "");
        let out = run_redirected(&config, redirect);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{redirect}: {stderr}");
        assert!(stderr.contains("console"), "{redirect}: {stderr}");
        assert!(stderr.contains("standard output"), "{redirect}: {stderr}");
        assert!(!stderr.contains("panicked"), "{redirect}: {stderr}");
        let committed = committed(&config);
        assert!(
            committed.values().all(|c| *c == 0),
            "{redirect}: committed {committed:?} with nowhere to write"
        );
    }
}

/// Discarding the output on purpose is said in the file.
#[test]
fn a_stdout_sink_allowed_the_null_device_writes_into_it_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let config = stdout_config(dir.path(), "allow_null_device = true");
    let out = run_redirected(&config, ">/dev/null");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(finished(&out)["written"].as_u64(), Some(1000));
}

/// What `etl run` would refuse, or could not do right, `etl validate`
/// refuses too, both with exit 78 and the problem at its line: one check
/// serves both. Each case is a configuration, the text on the line the
/// problem must point at, and a word its message must hold.
#[test]
fn validate_and_run_refuse_the_same_unusable_settings_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.ndjson"), "{\"id\":1}\n").unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/a.ndjson"), "{\"id\":1}\n").unwrap();
    std::fs::create_dir(dir.path().join("outdir")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("in.ndjson"), dir.path().join("link.ndjson"))
        .unwrap();
    let source = "[source]\ntype = \"file\"\npaths = [\"in.ndjson\"]\n";
    let sink =
        |path: &str| format!("\n[[sinks]]\nname = \"out\"\ntype = \"file\"\npath = \"{path}\"\n");
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("{source}max_open_files = 0\n{}", sink("out.ndjson")),
            "max_open_files",
            "max_open_files",
        ),
        (
            format!(
                "[source]\ntype = \"file\"\npaths = [\"data/[.ndjson\"]\n{}",
                sink("out.ndjson")
            ),
            "paths",
            "glob",
        ),
        (
            format!(
                "{source}{}\n[dead_letter]\ntype = \"file\"\npath = \"./out.ndjson\"\n",
                sink("out.ndjson")
            ),
            "path = \"./out.ndjson\"",
            "out.ndjson",
        ),
        (format!("{source}{}", sink("")), "path = \"\"", "empty"),
        (
            format!("{source}{}", sink("outdir")),
            "path = \"outdir\"",
            "folder",
        ),
        (
            format!("{source}{}", sink("out/")),
            "path = \"out/\"",
            "folder",
        ),
        (
            format!(
                "{source}{}\n[checkpoint]\nshutdown_timeout = \"1ns\"\n",
                sink("out.ndjson")
            ),
            "shutdown_timeout",
            "shutdown_timeout",
        ),
        // Its own input: the same name, another spelling of it, a link to
        // it, a name an input glob matches (the file does not exist yet),
        // and the dead-letter file.
        (
            format!("{source}{}", sink("in.ndjson")),
            "path = \"in.ndjson\"",
            "input",
        ),
        (
            format!("{source}{}", sink("./in.ndjson")),
            "path = \"./in.ndjson\"",
            "input",
        ),
        (
            format!("{source}{}", sink("link.ndjson")),
            "path = \"link.ndjson\"",
            "input",
        ),
        (
            format!(
                "[source]\ntype = \"file\"\npaths = [\"data/*.ndjson\"]\n{}",
                sink("data/out.ndjson")
            ),
            "path = \"data/out.ndjson\"",
            "input",
        ),
        (
            format!(
                "{source}{}\n[dead_letter]\ntype = \"file\"\npath = \"in.ndjson\"\n",
                sink("out.ndjson")
            ),
            "path = \"in.ndjson\"",
            "input",
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (text, marker, word)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&config, text).unwrap();
        let line = text
            .lines()
            .position(|l| l.contains(marker))
            .map(|n| n + 1)
            .unwrap();
        for command in ["validate", "run"] {
            let out = etl().arg(command).arg(&config).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let place = format!("case{i}.toml:{line}:");
            if out.status.code() != Some(78)
                || !stderr
                    .lines()
                    .any(|l| l.contains(&place) && l.contains(word))
            {
                wrong.push(format!(
                    "case {i} {command}: exit {:?}, no problem at {place} naming {word}:\n{text}\n{stderr}",
                    out.status.code()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("in.ndjson")).unwrap(),
        "{\"id\":1}\n",
        "no input was written to"
    );
}

/// VRL's compiler warnings are shown by `etl validate`, at the program's
/// line, and do not fail it.
#[test]
fn validate_shows_vrl_warnings_and_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("warn.toml");
    std::fs::write(
        &config,
        "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n\
         [[transforms]]\ntype = \"remap\"\nsource = '''\nunseen = 1\n.seen = true\n'''\n\n\
         [[sinks]]\ntype = \"blackhole\"\n",
    )
    .unwrap();
    let out = etl().arg("validate").arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("warning: ") && l.contains("warn.toml:7:")),
        "no warning at the program's line: {stderr}"
    );
    assert!(stderr.contains("unused"), "{stderr}");
    assert!(
        stdout.contains("ok") && stdout.contains("1 warning"),
        "{stdout}"
    );
}

/// `etl validate` whose standard output is open for reading only cannot
/// say its result: an I/O error, not a silent success.
#[test]
fn validate_into_a_read_only_standard_output_exits_74() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ok.toml");
    std::fs::write(
        &config,
        "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n\
         [[sinks]]\ntype = \"blackhole\"\n",
    )
    .unwrap();
    let out = etl()
        .arg("validate")
        .arg(&config)
        .stdout(std::fs::File::open("/dev/null").unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("standard output"), "{stderr}");
}

/// `${VAR}` in the configuration: an unset variable fails `etl validate`
/// and `etl run` with 78 and creates nothing (moved from the `etl` crate's
/// `config_env` test, where the rest of the interpolation is tested).
mod config_env {
    use std::path::Path;
    use std::process::{Command, Output};

    fn etl(command: &str, config: &Path, env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(crate::support::BINARY);
        cmd.arg(command).arg(config).env_remove("EDIR");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    #[test]
    fn validate_and_run_exit_78_on_an_unset_variable_and_create_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pipeline.toml");
        std::fs::write(
            &config,
            "[source]\ntype = \"generator\"\nrecords_per_partition = 2\n\n\
             [[sinks]]\ntype = \"file\"\npath = \"${EDIR}/out.ndjson\"\n\n\
             [checkpoint]\nstore = { type = \"memory\" }\n",
        )
        .unwrap();
        for command in ["validate", "run"] {
            let out = etl(command, &config, &[]);
            assert_eq!(out.status.code(), Some(78), "{command}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(
                    "pipeline.toml:7:8: [[sinks]] #1: path: environment variable EDIR is not set"
                ),
                "{command}: {stderr}"
            );
        }
        let made: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(made, ["pipeline.toml"], "nothing but the configuration");

        // Set, the same file runs and writes where the variable says.
        let out_dir = dir.path().join("given");
        let out = etl("run", &config, &[("EDIR", out_dir.to_str().unwrap())]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = std::fs::read_to_string(out_dir.join("out.ndjson")).unwrap();
        assert_eq!(written.lines().count(), 2);
    }
}

/// `etl validate` on a VRL program that does not compile (moved from the
/// `etl` crate's `remap_config` test, where the rest of the VRL
/// configuration is tested).
#[cfg(feature = "remap")]
mod remap_config {
    fn with_transforms(transforms: &str) -> String {
        format!(
            "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n{transforms}\n[[sinks]]\ntype = \"blackhole\"\n"
        )
    }

    #[test]
    fn etl_validate_reports_a_vrl_error_with_its_place_and_exits_78() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pipeline.toml");
        std::fs::write(
            &config,
            with_transforms(
                "[[transforms]]\ntype = \"remap\"\nsource = '''\n.a = 1\n.b = upcasee(.a)\n'''\n",
            ),
        )
        .unwrap();
        let out = std::process::Command::new(crate::support::BINARY)
            .arg("validate")
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(stderr.contains("pipeline.toml:9:6"), "{stderr}");
        assert!(stderr.contains("call to undefined function"), "{stderr}");
    }
}
