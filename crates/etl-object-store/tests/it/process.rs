//! The `etl` command itself writing an exactly-once Parquet lake, killed
//! with SIGKILL again and again at random points: after every kill, the
//! progress the store holds covers only records its objects hold, no
//! record is in two objects and every object reads; at the end, every
//! record is in exactly one object.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

pub(crate) use etl_test_support::etl_binary;
use etl_test_support::garage::Garage;
use etl_test_support::pyarrow::{Location, read_objects};
use etl_test_support::{run_stderr, start_run, wait_exit};

use crate::garage::garage_location;

/// Partitions of the generator.
pub(crate) const PARTITIONS: i64 = 2;
/// Records per partition.
pub(crate) const PER_PARTITION: i64 = 8_000;

/// A pipeline from the generator (`rate` records a second) into the
/// exactly-once sink `lake` on `store` (the lines of a `[sinks.store]`
/// table), with `sink` lines in the sink's table and `requests` in its
/// `[sinks.requests]`, written to `dir/pipeline.toml`.
pub(crate) fn write_pipeline(
    dir: &Path,
    store: &str,
    rate: u64,
    sink: &str,
    requests: &str,
) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[source]
type = "generator"
partitions = {PARTITIONS}
records_per_partition = {PER_PARTITION}
rate = {rate}
max_batch_records = 50

[[sinks]]
type = "object_store"
name = "lake"
exactly_once = true
key = "gen/{{partition}}-{{first_offset}}.parquet"
batch_max_records = 200
{sink}

[sinks.store]
{store}

[sinks.requests]
{requests}

[sinks.encoding]
format = "parquet"
columns = [
    {{ name = "id", type = "int64", nullable = false }},
    {{ name = "user", type = "string", nullable = false }},
    {{ name = "amount", type = "float64" }},
]

[checkpoint]
commit_interval = "200ms"
store = {{ type = "file", path = "state" }}
"#
        ),
    )
    .unwrap();
    path
}

/// `etl run CONFIG` in `dir`, its output in `run-N.out`/`run-N.err`.
pub(crate) fn start(dir: &Path, config: &Path, run: u32) -> Child {
    start_run(dir, &[], config, run).unwrap()
}

/// How many objects hold each generated id, and each partition's stored
/// progress (its next offset), as pyarrow reads the store.
pub(crate) fn tally(location: &Location) -> (BTreeMap<i64, usize>, BTreeMap<i64, i64>) {
    let mut counts = BTreeMap::new();
    for (key, _, rows) in read_objects(location, "gen").unwrap() {
        assert!(
            key.ends_with(".parquet"),
            "not an object of the sink: {key}"
        );
        for row in rows {
            *counts.entry(row["id"].as_i64().unwrap()).or_default() += 1;
        }
    }
    let mut progress = BTreeMap::new();
    for (_, _, rows) in read_objects(location, "_etl_progress").unwrap() {
        for row in rows {
            progress.insert(
                row["partition"].as_i64().unwrap(),
                row["next_offset"].as_i64().unwrap(),
            );
        }
    }
    (counts, progress)
}

/// The contract after any kill: no id twice, and every record below a
/// partition's stored progress in an object.
pub(crate) fn assert_progress_covered(
    counts: &BTreeMap<i64, usize>,
    progress: &BTreeMap<i64, i64>,
    when: &str,
) {
    assert_once(counts, when);
    for (&partition, &next) in progress {
        let ids = (0..next).map(|offset| offset * PARTITIONS + partition);
        assert_held(
            counts,
            ids,
            &format!("{when}: partition {partition}'s progress {next}"),
        );
    }
}

/// No id in two objects.
fn assert_once(counts: &BTreeMap<i64, usize>, when: &str) {
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{when}: ids in two objects: {twice:?}");
}

/// Every id of `ids` (those a stored progress covers, `what`) in an
/// object.
fn assert_held(counts: &BTreeMap<i64, usize>, ids: impl Iterator<Item = i64>, what: &str) {
    let missing: Vec<i64> = ids.filter(|id| !counts.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "{what} covers ids no object holds: {:?}",
        &missing[..missing.len().min(10)]
    );
}

/// The files under `folder` a killed local write left (`KEY#N`).
fn partial_writes(folder: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![folder.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().unwrap().is_dir() {
                folders.push(entry.path());
            } else if name
                .rsplit_once('#')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            {
                found.push(entry.path());
            }
        }
    }
    found
}

/// What the store holds as objects, right after a kill: for a folder, a
/// copy of it (under `dir`) without the partial write the kill may have
/// left, which the store does not list and the next run removes; an S3
/// bucket holds objects only.
fn objects_only(location: &Location, dir: &Path) -> Location {
    let Location::Folder(folder) = location else {
        return location.clone();
    };
    let copy = dir.join("objects-only");
    let _ = std::fs::remove_dir_all(&copy);
    let partial = partial_writes(folder);
    let mut folders = vec![folder.clone()];
    while let Some(from) = folders.pop() {
        let to = copy.join(from.strip_prefix(folder).unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                folders.push(entry.path());
            } else if !partial.contains(&entry.path()) {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }
    Location::Folder(copy)
}

/// A small deterministic generator of kill delays, seeded from the clock
/// (printed, so a failing run can be told apart).
struct Delays(u64);

impl Delays {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        eprintln!("kill delays seeded with {seed}");
        Delays(seed)
    }

    /// Between `from` and `to` milliseconds.
    fn next(&mut self, from: u64, to: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(from + self.0 % (to - from))
    }
}

/// What a pipeline reads, for the checks of [`kill_loop`]: which records
/// each partition's stored progress covers, and how many there are.
pub(crate) enum Input {
    /// The generator of [`write_pipeline`]: partition `p`'s record at
    /// offset `o` has id `o * PARTITIONS + p`.
    Generated,
    /// One file of lines whose ids are 0, 1, ... in order, `starts[i]`
    /// the byte offset of id `i`'s line (the file source's offsets).
    File { starts: Vec<i64> },
}

impl Input {
    /// The contract after any kill (see [`assert_progress_covered`]).
    fn assert_covered(
        &self,
        counts: &BTreeMap<i64, usize>,
        progress: &BTreeMap<i64, i64>,
        when: &str,
    ) {
        match self {
            Input::Generated => assert_progress_covered(counts, progress, when),
            Input::File { starts } => {
                assert_once(counts, when);
                assert!(progress.len() <= 1, "{when}: one file, {progress:?}");
                for &next in progress.values() {
                    let ids = (0..)
                        .zip(starts)
                        .take_while(|&(_, &start)| start < next)
                        .map(|(id, _)| id);
                    assert_held(counts, ids, &format!("{when}: the stored progress {next}"));
                }
            }
        }
    }

    /// When to kill a run, in milliseconds from its start: a file is
    /// read as fast as the store takes its objects, so its runs are
    /// killed sooner for the input to outlast the kills.
    fn kill_window(&self) -> (u64, u64) {
        match self {
            Input::Generated => (150, 1_200),
            Input::File { .. } => (100, 500),
        }
    }

    fn records(&self) -> i64 {
        match self {
            Input::Generated => PARTITIONS * PER_PARTITION,
            Input::File { starts } => starts.len() as i64,
        }
    }

    /// The stored progress once every record is in.
    fn assert_complete(&self, progress: &BTreeMap<i64, i64>) {
        match self {
            Input::Generated => {
                for p in 0..PARTITIONS {
                    assert_eq!(progress.get(&p), Some(&PER_PARTITION), "{progress:?}");
                }
            }
            Input::File { starts } => {
                let end = starts.last().map_or(0, |s| s + 1);
                assert!(
                    progress.len() == 1 && progress.values().all(|&next| next > end - 1),
                    "{progress:?}"
                );
            }
        }
    }
}

/// Start `etl` on `config` and SIGKILL it at a random point until it was
/// killed `kills` times while running, checking the store after each
/// kill; then run it to its end, and check every record is in exactly
/// one object.
fn kill_loop(dir: &Path, config: &Path, location: &Location, kills: u32, input: &Input) {
    let mut delays = Delays::new();
    let (mut killed, mut run) = (0, 0);
    let mut ended = String::new();
    while killed < kills {
        run += 1;
        assert!(
            run < kills * 3,
            "the runs end before they can be killed; the last: {ended}"
        );
        let mut child = start(dir, config, run);
        let (from, to) = input.kill_window();
        std::thread::sleep(delays.next(from, to));
        match child.try_wait().unwrap() {
            None => {
                child.kill().unwrap();
                killed += 1;
            }
            Some(status) => ended = format!("run {run}: {status}: {}", run_stderr(dir, run)),
        }
        child.wait().unwrap();
        let (counts, progress) = tally(&objects_only(location, dir));
        input.assert_covered(&counts, &progress, &format!("after run {run}"));
    }
    run += 1;
    let mut child = start(dir, config, run);
    let status = wait_exit(&mut child, Duration::from_secs(120)).unwrap();
    let err = run_stderr(dir, run);
    assert!(status.success(), "the last run: {status}: {err}");
    if let Location::Folder(folder) = location {
        // The partial writes of the killed runs were removed when the
        // sink opened; the last run, not killed, left none.
        let partial = partial_writes(folder);
        assert!(partial.is_empty(), "partial writes left: {partial:?}");
    }
    let (counts, progress) = tally(location);
    input.assert_covered(&counts, &progress, "at the end");
    assert_eq!(
        counts.len() as i64,
        input.records(),
        "every record in an object"
    );
    assert!(
        counts.values().all(|&n| n == 1),
        "every record in one object"
    );
    input.assert_complete(&progress);
}

#[test]
fn the_etl_process_killed_ten_times_into_a_local_folder_stores_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_pipeline(
        dir.path(),
        "kind = \"local\"\npath = \"lake\"",
        1_000,
        "",
        "",
    );
    // The binary built before the clock of the first kill starts.
    assert!(etl_binary().is_file());
    kill_loop(
        dir.path(),
        &config,
        &Location::Folder(dir.path().join("lake")),
        10,
        &Input::Generated,
    );
}

/// The `[sinks.store]` lines of `bucket` on `server`.
pub(crate) fn garage_store(server: &Garage, bucket: &str) -> String {
    format!(
        "kind = \"s3\"\nbucket = \"{bucket}\"\nregion = \"{}\"\nendpoint = \"{}\"\n\
         access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
        etl_test_support::garage::REGION,
        server.endpoint(),
        server.key_id(),
        server.secret()
    )
}

/// Garage with its bucket `lake`, the pipeline `write` writes into a
/// folder for it (given the folder and the `[sinks.store]` lines), and
/// [`kill_loop`] with 20 kills over what it reads.
fn garage_kill_loop(write: impl FnOnce(&Path, &str) -> (PathBuf, Input)) {
    let server = Garage::start().unwrap();
    server.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (config, input) = write(dir.path(), &garage_store(&server, "lake"));
    assert!(etl_binary().is_file());
    kill_loop(
        dir.path(),
        &config,
        &garage_location(&server, "lake"),
        20,
        &input,
    );
}

#[test]
fn the_etl_process_killed_twenty_times_into_garage_stores_every_record_once() {
    garage_kill_loop(|dir, store| (write_pipeline(dir, store, 1_000, "", ""), Input::Generated));
}

/// `lines` NDJSON records (ids 0, 1, ...) in `dir/input.ndjson`, and the
/// pipeline reading that file into the exactly-once sink `lake` on
/// `store`, as [`write_pipeline`] writes it with the generator; the byte
/// offset of each line.
fn write_file_pipeline(dir: &Path, store: &str, lines: i64) -> (PathBuf, Vec<i64>) {
    let mut text = String::new();
    let mut starts = Vec::new();
    for id in 0..lines {
        starts.push(text.len() as i64);
        text.push_str(&format!(
            "{{\"id\":{id},\"user\":\"user-{}\",\"amount\":{}.25}}\n",
            id % 97,
            id % 1_000
        ));
    }
    std::fs::write(dir.join("input.ndjson"), text).unwrap();
    let config = write_pipeline(dir, store, 1, "", "");
    let generated = std::fs::read_to_string(&config).unwrap();
    let start = generated.find("[source]").unwrap();
    let end = generated.find("[[sinks]]").unwrap();
    let file = "[source]\ntype = \"file\"\npaths = [\"input.ndjson\"]\nmax_batch_records = 50\n\n";
    // Objects of 50 lines: the file is read as fast as the store takes
    // them, so more objects keep the run long enough for the kills.
    let sinks = &generated[end..];
    assert!(sinks.contains("batch_max_records = 200"), "{sinks}");
    let text = format!("{}{file}{}", &generated[..start], sinks)
        .replace("batch_max_records = 200", "batch_max_records = 50");
    std::fs::write(&config, text).unwrap();
    (config, starts)
}

#[test]
fn the_etl_process_reading_a_file_killed_twenty_times_into_garage_stores_every_line_once() {
    garage_kill_loop(|dir, store| {
        let (config, starts) = write_file_pipeline(dir, store, 64_000);
        (config, Input::File { starts })
    });
}

#[test]
fn the_etl_process_killed_five_times_into_moto_stores_every_record_once() {
    // A second S3 implementation, moto's (its listing, multipart and
    // conditional-write answers are its own), for the fast cases: the
    // same contract after every kill as on Garage.
    let server = etl_test_support::s3::S3Server::start().unwrap();
    server.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "kind = \"s3\"\nbucket = \"lake\"\nregion = \"us-east-1\"\nendpoint = \"{}\"\n\
         access_key_id = \"etl-test\"\nsecret_access_key = \"etl-test\"\n",
        server.endpoint()
    );
    let config = write_pipeline(dir.path(), &store, 1_000, "", "");
    assert!(etl_binary().is_file());
    let location = Location::S3 {
        endpoint: server.endpoint(),
        bucket: "lake".to_owned(),
        access_key: "etl-test".to_owned(),
        secret_key: "etl-test".to_owned(),
        region: "us-east-1".to_owned(),
    };
    kill_loop(dir.path(), &config, &location, 5, &Input::Generated);
}
