//! `cargo xtask bench`: the performance budgets, each measured against a
//! baseline in the same run, printed as one table.
//!
//! Whole-pipeline figures run the release `etl` binary (peak RSS from
//! `/usr/bin/time -v`, or `VmHWM` polled from `/proc` without it) or the
//! `pipeline` bench harness of the `etl` crate; the checkpointer figure is
//! a criterion bench of `etl-checkpoint`; the Kafka figure runs the
//! `kafka` bench harness of `etl-tests` against a Tansu broker of its
//! own. Nothing here asserts a timing: the table says whether each budget
//! was met. `docs/benchmarks.md` records the results.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;
use crate::cmd::{Cmd, root};

/// Records in the file-to-file input.
const FILE_RECORDS: u64 = 2_000_000;
/// Records per run of the acknowledgement comparison.
const ACK_RECORDS: u64 = 2_000_000;
/// Records per callgrind run (about 20 s each under valgrind).
const CALLGRIND_RECORDS: u64 = 200_000;

/// Records of the routing row's tiny runs under callgrind, whose counts
/// (the process's fixed cost) are taken off the `CALLGRIND_RECORDS` runs'.
const ROUTING_TINY_RECORDS: u64 = 1_000;
/// Input files of the many-files runs (the file-to-file records, split):
/// one row each. Memory must not grow with the number of files, so both
/// have the same budget.
const MANY_FILES: [u64; 2] = [10_000, 100_000];
/// How much slower than the source the memory run's sink is.
const SLOW_FACTOR: u64 = 100;
/// Payload bytes in flight in the memory run, in MiB.
const IN_FLIGHT_MIB: u64 = 8;
/// Records in the Kafka topic. The broker is not the bottleneck at this
/// size (measured on 2 cores: Tansu takes them in about 1 s and serves a
/// raw consumer about 2M rec/s), so each consumer run is a few seconds,
/// most of it joining the group.
const KAFKA_RECORDS: u64 = 1_000_000;
/// Partitions of the Kafka topic.
const KAFKA_PARTITIONS: u64 = 4;
/// Runs of each Kafka consumer, alternated; the best of each counts.
const KAFKA_ROUNDS: usize = 3;

mod cdc;
mod lake;
mod shapes;

/// One row of the table.
struct Row {
    name: String,
    figure: String,
    baseline: String,
    ratio: f64,
    budget: String,
    met: Option<bool>,
}

/// Run the suite; `--full` uses the issue's sizes for the memory run
/// (1 and 10 million records; about half an hour at a 100x slower sink);
/// `--only many-files` runs the many-files rows alone, `--only kafka` the
/// Kafka rows alone, `--only transform` the transform rows, `--only
/// file-to-file` the file-to-file rows (rate and peak RSS), `--only lake`
/// the object-store rows (NDJSON -> Parquet against pyarrow).
pub(crate) fn run(args: &[String]) -> Result {
    let full = args.iter().any(|a| a == "--full");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    if let Some(other) = only.filter(|o| {
        ![
            "many-files",
            "kafka",
            "transform",
            "routing",
            "http",
            "file-to-file",
            "lake",
            "cdc",
        ]
        .contains(o)
    }) {
        return Err(format!(
            "--only takes many-files, kafka, transform, routing, http, file-to-file or lake, not {other:?}"
        ));
    }
    let started = Instant::now();
    if only == Some("kafka") {
        let harness = build_harness("etl-tests", "kafka")?;
        let rows = kafka(&harness)?;
        print!("{}", table(&rows));
        eprintln!("xtask: bench finished in {:.0?}", started.elapsed());
        return Ok(());
    }
    let work = root().join("target").join("bench");
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;

    Cmd::cargo(&["build", "--release", "-p", "etl-cli", "--bin", "etl"]).run()?;
    // Where `cargo build` put it: `CARGO_TARGET_DIR` when it is set.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let etl = target.join("release").join("etl");
    if let Some(only) = only {
        let rows = match only {
            "transform" => transform_rows(&etl, &work)?,
            "routing" => routing_rows(&etl, &work)?,
            "http" => http_rows(&etl, &work)?,
            "lake" => lake::rows(&etl, &work)?,
            "cdc" => cdc::rows(&etl, &work)?,
            "file-to-file" => {
                file_to_file(&etl, &build_harness("etl-cli", "pipeline")?, &work)?.rows
            }
            _ => many_files(&etl, &build_harness("etl-cli", "pipeline")?, &work)?,
        };
        print!("{}", table(&rows));
        eprintln!("xtask: bench finished in {:.0?}", started.elapsed());
        return Ok(());
    }
    let harness = build_harness("etl-cli", "pipeline")?;
    let kafka_harness = build_harness("etl-tests", "kafka")?;
    let mut rows = Vec::new();

    // 1. Acknowledgements on versus off.
    let out = capture(Command::new(&harness).args([
        "ack",
        "--records",
        &ACK_RECORDS.to_string(),
        "--rounds",
        "3",
    ]))?;
    let (on, off) = (field(&out, "ack_on_rps")?, field(&out, "ack_off_rps")?);
    let pool = field(&out, "ack_on_pool_rps")?;
    rows.push(Row {
        name: "ack overhead: generator -> json -> blackhole".into(),
        figure: format!("{} rec/s acks on", si(on)),
        baseline: format!("{} rec/s acks off", si(off)),
        ratio: on / off,
        budget: "on/off >= 0.95".into(),
        met: Some(on / off >= 0.95),
    });
    // Times on a shared machine move by more than the 5% budget; the
    // instructions each side executes (callgrind) do not.
    match (
        instructions(&harness, "ack-on", CALLGRIND_RECORDS)?,
        instructions(&harness, "ack-off", CALLGRIND_RECORDS)?,
    ) {
        (Some(on), Some(off)) => rows.push(Row {
            name: format!(
                "ack overhead, instructions ({}k records, callgrind)",
                CALLGRIND_RECORDS / 1000
            ),
            figure: format!("{:.0} instr/record acks on", on / CALLGRIND_RECORDS as f64),
            baseline: format!("{:.0} acks off", off / CALLGRIND_RECORDS as f64),
            ratio: off / on,
            budget: "off/on >= 0.95".into(),
            met: Some(off / on >= 0.95),
        }),
        _ => rows.push(Row {
            name: "ack overhead, instructions (callgrind)".into(),
            figure: "not measured: no valgrind".into(),
            baseline: "-".into(),
            ratio: f64::NAN,
            budget: "off/on >= 0.95".into(),
            met: None,
        }),
    }
    rows.push(Row {
        name: "ack on, default transform pool (reference)".into(),
        figure: format!("{} rec/s", si(pool)),
        baseline: format!("{} rec/s acks off, one task", si(off)),
        ratio: pool / off,
        budget: "-".into(),
        met: None,
    });

    // 2. File to file.
    let FileToFile {
        rows: f2f_rows,
        dir: f2f,
        config,
    } = file_to_file(&etl, &harness, &work)?;
    rows.extend(f2f_rows);

    // 2b. The same records in 10,000 files.
    rows.extend(many_files(&etl, &harness, &work)?);

    // 2c. Transforms against a single-threaded Python + orjson script.
    rows.extend(transform_rows(&etl, &work)?);
    rows.extend(routing_rows(&etl, &work)?);
    rows.extend(http_rows(&etl, &work)?);

    // 3. Checkpointer: per-ack cost against pending batches.
    let report = capture(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())).args([
            "bench",
            "-p",
            "etl-checkpoint",
            "--bench",
            "checkpoint",
            "--",
            "ack_handling",
            "--warm-up-time",
            "1",
            "--measurement-time",
            "3",
        ]),
    )?;
    eprint!("{report}");
    for shape in ["in_order", "pinned"] {
        let one = acks_per_sec(shape, 1)?;
        for pending in [100, 10_000] {
            let rate = acks_per_sec(shape, pending)?;
            rows.push(Row {
                name: format!("checkpointer acks ({shape}), {pending} pending"),
                figure: format!("{} acks/s", si(rate)),
                baseline: format!("{} acks/s, 1 pending", si(one)),
                ratio: rate / one,
                budget: "flat (>= 0.8)".into(),
                met: Some(rate / one >= 0.8),
            });
        }
    }

    // 4. Memory with a sink 100x slower than the source.
    let source_rate = field(&capture(Command::new(&harness).args(["rate"]))?, "rate_rps")?;
    let sink_rate = (source_rate as u64 / SLOW_FACTOR).max(1);
    let sizes: [u64; 2] = if full {
        [1_000_000, 10_000_000]
    } else {
        [200_000, 1_000_000]
    };
    let mut peaks = Vec::new();
    for n in sizes {
        let out = capture(Command::new(&harness).args([
            "memory",
            "--records",
            &n.to_string(),
            "--sink-rate",
            &sink_rate.to_string(),
            "--in-flight-mib",
            &IN_FLIGHT_MIB.to_string(),
        ]))?;
        peaks.push(field(&out, "peak_rss_kib")? / 1024.0);
    }
    rows.push(Row {
        name: format!(
            "memory, sink {SLOW_FACTOR}x slower ({} rec/s): {} vs {} records",
            si(sink_rate as f64),
            si(sizes[1] as f64),
            si(sizes[0] as f64)
        ),
        figure: format!("{:.1} MiB", peaks[1]),
        baseline: format!("{:.1} MiB", peaks[0]),
        ratio: peaks[1] / peaks[0],
        budget: "flat (<= 1.1)".into(),
        met: Some(peaks[1] / peaks[0] <= 1.1),
    });
    // What the in-flight bound costs: the same run with 4x the bound.
    let wide = IN_FLIGHT_MIB * 4;
    let out = capture(Command::new(&harness).args([
        "memory",
        "--records",
        &sizes[0].to_string(),
        "--sink-rate",
        &sink_rate.to_string(),
        "--in-flight-mib",
        &wide.to_string(),
    ]))?;
    let peak_wide = field(&out, "peak_rss_kib")? / 1024.0;
    let per_mib = (peak_wide - peaks[0]) / (wide - IN_FLIGHT_MIB) as f64;
    rows.push(Row {
        name: format!(
            "memory, sink {SLOW_FACTOR}x slower: {wide} vs {IN_FLIGHT_MIB} MiB in flight ({} records)",
            si(sizes[0] as f64)
        ),
        figure: format!("{peak_wide:.1} MiB"),
        baseline: format!(
            "{:.1} MiB (fixed ~{:.1} MiB)",
            peaks[0],
            peaks[0] - per_mib * IN_FLIGHT_MIB as f64
        ),
        ratio: per_mib,
        budget: "RSS per in-flight MiB <= 1.5".into(),
        met: Some(per_mib <= 1.5),
    });

    // 5. Restart after kill -9: time to the first delivered record.
    let (cold, warm) = restart(&etl, &f2f, &config)?;
    rows.push(Row {
        name: "restart after kill -9: first record".into(),
        figure: format!("{:.0} ms", warm * 1e3),
        baseline: format!("{:.0} ms cold start", cold * 1e3),
        ratio: warm / cold,
        budget: "< 1 s".into(),
        met: Some(warm < 1.0),
    });

    // 6. Kafka against a raw librdkafka consumer.
    rows.extend(kafka(&kafka_harness)?);

    print!("{}", table(&rows));
    eprintln!("xtask: bench finished in {:.0?}", started.elapsed());
    Ok(())
}

/// The file-to-file rows, with the directory and configuration the
/// restart row reuses.
struct FileToFile {
    rows: Vec<Row>,
    dir: PathBuf,
    config: PathBuf,
}

/// 2M NDJSON records, filter, add a field, file sink with fsync per batch:
/// the rate against `cat`, and the peak RSS.
fn file_to_file(etl: &Path, harness: &Path, work: &Path) -> Result<FileToFile> {
    let mut rows = Vec::new();
    let f2f = work.join("file-to-file");
    let input = f2f.join("input").join("data.ndjson");
    let expected = field(
        &capture(
            Command::new(harness)
                .args([
                    "write-input",
                    "--records",
                    &FILE_RECORDS.to_string(),
                    "--path",
                ])
                .arg(&input),
        )?,
        "kept",
    )? as u64;
    let cat = best_of(3, || {
        let t = Instant::now();
        let status = Command::new("cat")
            .arg(&input)
            .stdout(std::fs::File::create(f2f.join("cat.out")).map_err(|e| e.to_string())?)
            .status()
            .map_err(|e| format!("cannot run cat: {e}"))?;
        if !status.success() {
            return Err(format!("cat failed: {status}"));
        }
        Ok(FILE_RECORDS as f64 / t.elapsed().as_secs_f64())
    })?;
    let _ = std::fs::remove_file(f2f.join("cat.out"));
    let config = write_file_config(&f2f)?;
    let mut rss_kib = 0;
    let rate = best_of(3, || {
        reset(&f2f)?;
        let (secs, rss) = timed_run(etl, &config)?;
        rss_kib = rss_kib.max(rss);
        let lines = count_lines(&f2f.join("output").join("out.ndjson"))?;
        if lines != expected {
            return Err(format!(
                "file to file wrote {lines} lines, expected {expected}"
            ));
        }
        Ok(FILE_RECORDS as f64 / secs)
    })?;
    rows.push(Row {
        name: "file to file: 2M NDJSON, filter, add, fsync".into(),
        figure: format!("{} rec/s", si(rate)),
        baseline: format!("{} rec/s cat", si(cat)),
        ratio: rate / cat,
        budget: ">= 2M rec/s".into(),
        met: Some(rate >= 2e6),
    });
    rows.push(Row {
        name: "file to file: peak RSS".into(),
        figure: format!("{:.1} MiB", rss_kib as f64 / 1024.0),
        baseline: "64 MiB".into(),
        ratio: rss_kib as f64 / 1024.0 / 64.0,
        budget: "< 64 MiB".into(),
        met: Some(rss_kib < 64 * 1024),
    });

    Ok(FileToFile {
        rows,
        dir: f2f,
        config,
    })
}

/// The file-to-file records split into each of [`MANY_FILES`] files,
/// through the same pipeline: a row each.
fn many_files(etl: &Path, harness: &Path, work: &Path) -> Result<Vec<Row>> {
    MANY_FILES
        .iter()
        .map(|&files| many_files_row(etl, harness, work, files))
        .collect()
}

/// The file-to-file records split into `files` files: peak RSS of a run,
/// and of a rerun with nothing left to read (every file opened, checked
/// and found read to its end).
fn many_files_row(etl: &Path, harness: &Path, work: &Path, files: u64) -> Result<Row> {
    let dir = work.join("many-files");
    let input = dir.join("input");
    let _ = std::fs::remove_dir_all(&input);
    std::fs::create_dir_all(&input)
        .map_err(|e| format!("cannot create {}: {e}", input.display()))?;
    let whole = dir.join("whole.ndjson");
    let expected = field(
        &capture(
            Command::new(harness)
                .args([
                    "write-input",
                    "--records",
                    &FILE_RECORDS.to_string(),
                    "--path",
                ])
                .arg(&whole),
        )?,
        "kept",
    )? as u64;
    let bytes =
        std::fs::read(&whole).map_err(|e| format!("cannot read {}: {e}", whole.display()))?;
    let _ = std::fs::remove_file(&whole);
    let per_file = FILE_RECORDS.div_ceil(files) as usize;
    let mut lines = bytes.split_inclusive(|&b| b == b'\n');
    for n in 0..files {
        let chunk: Vec<u8> = lines.by_ref().take(per_file).flatten().copied().collect();
        let path = input.join(format!("{n:06}.ndjson"));
        std::fs::write(&path, chunk)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let config = write_file_config(&dir)?;
    reset(&dir)?;
    let (secs, first) = timed_run(etl, &config)?;
    let written = count_lines(&dir.join("output").join("out.ndjson"))?;
    if written != expected {
        return Err(format!(
            "many files wrote {written} lines, expected {expected}"
        ));
    }
    let (_, rerun) = timed_run(etl, &config)?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let peak = first.max(rerun);
    Ok(Row {
        name: format!(
            "{}k files of {per_file} records: peak RSS (run, rerun)",
            files / 1000
        ),
        figure: format!("{:.1} MiB, {:.1} MiB", mib(first), mib(rerun)),
        baseline: format!("{} rec/s", si(FILE_RECORDS as f64 / secs)),
        ratio: mib(peak) / 64.0,
        budget: "< 64 MiB".into(),
        met: Some(peak < 64 * 1024),
    })
}

/// Build the bench harness `name` of `package`; its path.
fn build_harness(package: &str, name: &str) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args = [
        "bench",
        "-p",
        package,
        "--bench",
        name,
        "--no-run",
        "--message-format=json",
    ];
    eprintln!("$ cargo {}", args.join(" "));
    let out = Command::new(cargo)
        .args(args)
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the bench harness {name} failed: {}",
            out.status
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("cargo did not report the bench harness executable {name}"))
}

/// Kafka -> blackhole and Kafka -> JSON filter -> file through the etl
/// pipeline against a raw librdkafka consumer, on one topic of a broker
/// started for these rows only: the `kafka` harness fills the topic, then
/// the three consumers alternate, each run in a new group reading the
/// whole topic.
fn kafka(harness: &Path) -> Result<Vec<Row>> {
    let broker = crate::kafka::start(crate::kafka::free_port()?)?;
    let brokers = broker.addr();
    let records = KAFKA_RECORDS.to_string();
    let common = [
        "--brokers",
        &brokers,
        "--topic",
        "bench",
        "--records",
        &records,
    ];
    capture(
        Command::new(harness)
            .arg("produce")
            .args(common)
            .args(["--partitions", &KAFKA_PARTITIONS.to_string()]),
    )?;
    let (mut raw, mut etl, mut filter) = (0f64, 0f64, 0f64);
    let (mut rss, mut filter_rss) = (0f64, 0f64);
    for round in 1..=KAFKA_ROUNDS {
        let out = capture(Command::new(harness).arg("raw").args(common))?;
        let r = field(&out, "raw_rps")?;
        let out = capture(Command::new(harness).arg("etl").args(common))?;
        let e = field(&out, "etl_rps")?;
        rss = rss.max(field(&out, "etl_peak_rss_kib")?);
        let out = capture(Command::new(harness).arg("etl-filter").args(common))?;
        let f = field(&out, "etl_filter_rps")?;
        filter_rss = filter_rss.max(field(&out, "etl_filter_peak_rss_kib")?);
        eprintln!(
            "xtask: kafka round {round}: raw {} rec/s, etl {} rec/s ({:.2}), \
             etl filter -> file {} rec/s ({:.2})",
            si(r),
            si(e),
            e / r,
            si(f),
            f / r
        );
        raw = raw.max(r);
        etl = etl.max(e);
        filter = filter.max(f);
    }
    drop(broker);
    Ok(vec![
        Row {
            name: "kafka -> blackhole vs raw librdkafka".into(),
            figure: format!("{} rec/s etl, peak RSS {:.0} MiB", si(etl), rss / 1024.0),
            baseline: format!("{} rec/s raw librdkafka", si(raw)),
            ratio: etl / raw,
            budget: ">= 0.9".into(),
            met: Some(etl / raw >= 0.9),
        },
        Row {
            name: "kafka -> JSON filter -> file vs raw librdkafka".into(),
            figure: format!(
                "{} rec/s etl, peak RSS {:.0} MiB",
                si(filter),
                filter_rss / 1024.0
            ),
            baseline: format!("{} rec/s raw librdkafka", si(raw)),
            ratio: filter / raw,
            budget: ">= 0.8".into(),
            met: Some(filter / raw >= 0.8),
        },
    ])
}

/// Instructions `harness mode --records n` executes under callgrind;
/// `None` without valgrind.
fn instructions(harness: &Path, mode: &str, records: u64) -> Result<Option<f64>> {
    let records = records.to_string();
    callgrind(
        harness,
        &[mode.as_ref(), "--records".as_ref(), records.as_ref()],
    )
}

/// Instructions `program args` executes under callgrind (run from the
/// repository root); `None` without valgrind.
fn callgrind(program: &Path, args: &[&std::ffi::OsStr]) -> Result<Option<f64>> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        return Ok(None);
    }
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(program)
        .args(args);
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("$ {shown}");
    let out = cmd
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .find_map(|l| {
            l.split_once("Collected :")
                .map(|(_, n)| n.trim().to_owned())
        })
        .and_then(|n| n.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("{shown}: no instruction count in its output:\n{stderr}"))
}

/// Print, run, and return standard output (standard error passes through).
fn capture(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("$ {shown}");
    let out = cmd
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{shown} failed: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `key=value` from a `RESULT` line.
fn field(out: &str, key: &str) -> Result<f64> {
    out.lines()
        .filter(|l| l.starts_with("RESULT "))
        .flat_map(str::split_whitespace)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .ok_or_else(|| format!("no {key} in output:\n{out}"))
}

fn best_of(n: usize, mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = 0f64;
    for _ in 0..n {
        best = best.max(f()?);
    }
    Ok(best)
}

/// Acks per second of the criterion bench `ack_handling/<shape>/<pending>`.
fn acks_per_sec(shape: &str, pending: u64) -> Result<f64> {
    let path = root()
        .join("target")
        .join("criterion")
        .join("ack_handling")
        .join(shape)
        .join(pending.to_string())
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let ns = v["mean"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| format!("{}: no mean estimate", path.display()))?;
    Ok(1e9 / ns)
}

fn write_file_config(dir: &Path) -> Result<PathBuf> {
    let config = r#"# Written by `cargo xtask bench`.
[source]
type = "file"
paths = ["input/*.ndjson"]

[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 100

[[transforms]]
type = "add_field"
field = "pipeline"
value = "bench"

[[sinks]]
name = "out"
type = "file"
path = "output/out.ndjson"

[checkpoint]
commit_interval = "500ms"
store = { type = "file", path = "state" }
"#;
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, config).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Remove the output and the offsets of a previous run.
fn reset(dir: &Path) -> Result {
    for sub in ["output", "state"] {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p)
                .map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
        }
    }
    Ok(())
}

fn count_lines(path: &Path) -> Result<u64> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// Run `etl run config` to completion: seconds and peak RSS in KiB.
fn timed_run(etl: &Path, config: &Path) -> Result<(f64, u64)> {
    timed(etl, &["run".as_ref(), config.as_os_str()], None)
}

/// Run `program args` (in `dir`, or the repository root) to completion:
/// seconds and peak RSS in KiB.
fn timed(program: &Path, args: &[&std::ffi::OsStr], dir: Option<&Path>) -> Result<(f64, u64)> {
    timed_cpu(program, args, dir).map(|t| (t.secs, t.peak_kib))
}

/// What a timed run took.
struct Timed {
    /// Wall-clock seconds.
    secs: f64,
    /// Peak RSS in KiB.
    peak_kib: u64,
    /// User plus system CPU seconds of the process and its threads, when
    /// `/usr/bin/time` reported them.
    cpu_secs: Option<f64>,
}

/// [`timed`], with the CPU time `/usr/bin/time -v` reports.
fn timed_cpu(program: &Path, args: &[&std::ffi::OsStr], dir: Option<&Path>) -> Result<Timed> {
    let time = Path::new("/usr/bin/time");
    let mut cmd = if time.exists() {
        let mut c = Command::new(time);
        c.arg("-v").arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    eprintln!("$ {}", format!("{cmd:?}").replace('"', ""));
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let mut polled = 0;
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    });
    let status = loop {
        polled = polled.max(vm_hwm(&child).unwrap_or(0));
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let secs = started.elapsed().as_secs_f64();
    let log = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("{} failed: {status}\n{log}", program.display()));
    }
    let reported = |name: &str| {
        log.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let peak = reported("Maximum resident set size (kbytes):");
    let cpu = reported("User time (seconds):")
        .zip(reported("System time (seconds):"))
        .map(|(user, system)| user + system);
    Ok(Timed {
        secs,
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        peak_kib: peak.map_or(polled, |kib| kib as u64),
        cpu_secs: cpu,
    })
}

/// `VmHWM` of a running child (of `/usr/bin/time`'s child when wrapped,
/// which this does not see; the wrapper's own report is used then).
fn vm_hwm(child: &Child) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Seconds from process start to the first byte in the output file: on a
/// cold start, and on a restart after `kill -9` mid-run (median of three
/// each).
fn restart(etl: &Path, dir: &Path, config: &Path) -> Result<(f64, f64)> {
    let output = dir.join("output").join("out.ndjson");
    let start = |wait_for_commit: bool| -> Result<(f64, Child)> {
        let _ = std::fs::remove_file(&output);
        let started = Instant::now();
        let child = Command::new(etl)
            .arg("run")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start etl: {e}"))?;
        let deadline = started + Duration::from_secs(20);
        while std::fs::metadata(&output).map_or(true, |m| m.len() == 0) {
            if Instant::now() > deadline {
                return Err("no output within 20 s".into());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let first = started.elapsed().as_secs_f64();
        if wait_for_commit {
            // Past the first commit (interval 500 ms), mid-input.
            std::thread::sleep(Duration::from_millis(700));
        }
        Ok((first, child))
    };
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        reset(dir)?;
        let (first, mut child) = start(true)?;
        cold.push(first);
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let (first, mut child) = start(false)?;
        warm.push(first);
        let _ = child.kill();
        let _ = child.wait();
    }
    reset(dir)?;
    Ok((median(&mut cold), median(&mut warm)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `1.23M`, `456k`.
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn table(rows: &[Row]) -> String {
    let head = ["benchmark", "figure", "baseline", "ratio", "budget", "met"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.figure.clone(),
                r.baseline.clone(),
                if r.ratio.is_finite() {
                    format!("{:.2}", r.ratio)
                } else {
                    "-".into()
                },
                r.budget.clone(),
                match r.met {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "n/a".into(),
                },
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cols: &[String]| {
        let cols: Vec<String> = cols
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    };
    line(&mut out, &head.map(str::to_owned));
    let _ = writeln!(out, "|{}|", width.map(|w| "-".repeat(w + 2)).join("|"));
    for row in &cells {
        line(&mut out, row);
    }
    out
}

/// Records of the W1-shaped transform row.
const W1_RECORDS: u64 = 2_000_000;
/// Records of the nested transform rows, and the files they are split
/// over.
const NESTED_RECORDS: u64 = 600_000;
const NESTED_FILES: u64 = 3;
/// Alternated runs of each side of a transform row; the best of each
/// counts. Five, not three: on this shared 2-core machine a round of
/// either side can lose a third of its rate to other tenants, and the two
/// sides do not lose it together; the best of five is near each side's
/// unloaded rate more often.
const TRANSFORM_ROUNDS: usize = 5;

/// The baseline of the transform rows: the same job in Python with orjson,
/// one thread, with the pipeline's checkpoint discipline: output written
/// and fsync'd per 4096 lines read, the input offsets written to a file
/// (fsync'd, then renamed over the last) every 500 ms and at the end.
const ORJSON_SCRIPT: &str = r#"# Written by `cargo xtask bench`.
import os, sys, time
import orjson

job, out_path, offsets_path = sys.argv[1:4]
inputs = sys.argv[4:]
BATCH = 4096

def commit(offsets):
    tmp = offsets_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(offsets))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, offsets_path)

def w1(r):
    a = r.get("amount")
    if not isinstance(a, (int, float)) or isinstance(a, bool) or a < 1:
        return None
    r["amount_cents"] = int(round(float(a) * 100))
    return r

def paid(r):
    o = r.get("order")
    return isinstance(o, dict) and o.get("status") == "paid"

def drop_email(r):
    c = r.get("customer")
    if isinstance(c, dict):
        c.pop("email", None)

def nested_remap(r):
    if not paid(r):
        return None
    drop_email(r)
    total = 0.0
    for item in r["order"]["items"]:
        total += float(item["qty"]) * float(item["price"])
    r["total_cents"] = int(round(total * 100))
    return r

def nested_declarative(r):
    if not paid(r):
        return None
    drop_email(r)
    return r

step = {"w1": w1, "nested-remap": nested_remap, "nested-declarative": nested_declarative}[job]
loads, dumps = orjson.loads, orjson.dumps
offsets = {}
last = time.monotonic()
with open(out_path, "wb") as out:
    for path in inputs:
        pos = 0
        with open(path, "rb") as f:
            while True:
                lines = f.readlines(BATCH * 512)
                if not lines:
                    break
                kept = []
                for line in lines:
                    pos += len(line)
                    r = step(loads(line))
                    if r is not None:
                        kept.append(dumps(r))
                if kept:
                    kept.append(b"")
                    out.write(b"\n".join(kept))
                    out.flush()
                    os.fsync(out.fileno())
                offsets[path] = pos
                if time.monotonic() - last >= 0.5:
                    commit(offsets)
                    last = time.monotonic()
commit(offsets)
"#;

/// One transform job: the pipeline's steps in TOML, the script's job name.
struct TransformJob {
    name: &'static str,
    script_job: &'static str,
    steps: &'static str,
    budget: f64,
    /// The least rate against `cat` of the same input, if any.
    cat_budget: Option<f64>,
}

/// The transform rows: `etl run` against [`ORJSON_SCRIPT`] on the same
/// input, alternated, with peak RSS.
fn transform_rows(etl: &Path, work: &Path) -> Result<Vec<Row>> {
    let python = orjson_python(work)?;
    let dir = work.join("transform");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let script = dir.join("orjson_job.py");
    std::fs::write(&script, ORJSON_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let input = |shape: &str, records: u64, files: u64| -> Result<(PathBuf, u64)> {
        let input = dir.join(format!("input-{shape}"));
        let kept = write_transform_input(shape, records, files, &input)?;
        Ok((input, kept))
    };
    let w1 = input("w1", W1_RECORDS, 1)?;
    let nested = input("nested", NESTED_RECORDS, NESTED_FILES)?;
    let jobs = [
        (
            TransformJob {
                name: "W1: 2M x ~90 B, filter amount >= 1, remap amount_cents",
                script_job: "w1",
                steps: r#"[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 1

[[transforms]]
type = "remap"
source = '.amount_cents = to_int(round(to_float!(.amount) * 100))'
"#,
                budget: 6.0,
                cat_budget: Some(0.15),
            },
            &w1,
            W1_RECORDS,
        ),
        (
            TransformJob {
                name: "nested: 600k in 8 shapes, 3 files, remap (paid, del email, total_cents)",
                script_job: "nested-remap",
                steps: r#"[[transforms]]
type = "filter"
condition = '.order.status == "paid"'

[[transforms]]
type = "remap"
source = '''
del(.customer.email)
total = 0.0
for_each(array!(.order.items)) -> |_index, item| {
    total = total + to_float!(item.qty) * to_float!(item.price)
}
.total_cents = to_int(round(total * 100))
'''
"#,
                budget: 5.0,
                cat_budget: None,
            },
            &nested,
            NESTED_RECORDS,
        ),
        (
            TransformJob {
                name: "nested (8 shapes): declarative (filter order.status, drop customer.email)",
                script_job: "nested-declarative",
                steps: r#"[[transforms]]
type = "filter"
field = "order.status"
op = "=="
value = "paid"

[[transforms]]
type = "drop_field"
field = "customer.email"
"#,
                budget: 10.0,
                cat_budget: None,
            },
            &nested,
            NESTED_RECORDS,
        ),
    ];
    let mut rows = Vec::new();
    for (n, (job, (input, kept), records)) in jobs.iter().enumerate() {
        let run = dir.join(format!("job{}", n + 1));
        std::fs::create_dir_all(&run)
            .map_err(|e| format!("cannot create {}: {e}", run.display()))?;
        let config = run.join("pipeline.toml");
        let text = format!(
            "# Written by `cargo xtask bench`.\n[source]\ntype = \"file\"\npaths = [\"{}/*.ndjson\"]\n\n{}\n\
             [[sinks]]\nname = \"out\"\ntype = \"file\"\npath = \"output/out.ndjson\"\n\n\
             [checkpoint]\ncommit_interval = \"500ms\"\nstore = {{ type = \"file\", path = \"state\" }}\n",
            input.display(),
            job.steps
        );
        std::fs::write(&config, text)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(input)
            .map_err(|e| format!("cannot read {}: {e}", input.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
            .collect();
        files.sort();
        let (mut etl_best, mut py_best, mut rss, mut py_rss) = (0f64, 0f64, 0u64, 0u64);
        // `cat` of the same input into a file, as the file-to-file row
        // takes it: what copying the bytes costs at the least.
        let mut cat_best = 0f64;
        let cat_out = run.join("cat.out");
        // The least CPU seconds a round took, each side.
        let (mut etl_cpu, mut py_cpu) = (f64::INFINITY, f64::INFINITY);
        for round in 1..=TRANSFORM_ROUNDS {
            reset(&run)?;
            let t = timed_cpu(etl, &["run".as_ref(), config.as_os_str()], None)?;
            let (secs, peak) = (t.secs, t.peak_kib);
            etl_cpu = etl_cpu.min(t.cpu_secs.unwrap_or(f64::INFINITY));
            let etl_rate = *records as f64 / secs;
            let lines = count_lines(&run.join("output").join("out.ndjson"))?;
            if lines != *kept {
                return Err(format!(
                    "{}: etl wrote {lines} lines, expected {kept}",
                    job.name
                ));
            }
            etl_best = etl_best.max(*records as f64 / secs);
            rss = rss.max(peak);

            let out = run.join("orjson.out.ndjson");
            let offsets = run.join("orjson.offsets.json");
            let mut args: Vec<&std::ffi::OsStr> = vec![
                script.as_os_str(),
                job.script_job.as_ref(),
                out.as_os_str(),
                offsets.as_os_str(),
            ];
            args.extend(files.iter().map(|f| f.as_os_str()));
            let t = timed_cpu(&python, &args, None)?;
            let (secs, peak) = (t.secs, t.peak_kib);
            py_cpu = py_cpu.min(t.cpu_secs.unwrap_or(f64::INFINITY));
            let lines = count_lines(&out)?;
            if lines != *kept {
                return Err(format!(
                    "{}: orjson wrote {lines} lines, expected {kept}",
                    job.name
                ));
            }
            if round == 1 {
                shapes::same_records(&run.join("output").join("out.ndjson"), &out)
                    .map_err(|e| format!("{}: {e}", job.name))?;
            }
            let _ = std::fs::remove_file(&out);
            let py_rate = *records as f64 / secs;
            let t = Instant::now();
            let status = Command::new("cat")
                .args(&files)
                .stdout(std::fs::File::create(&cat_out).map_err(|e| e.to_string())?)
                .status()
                .map_err(|e| format!("cannot run cat: {e}"))?;
            if !status.success() {
                return Err(format!("cat failed: {status}"));
            }
            cat_best = cat_best.max(*records as f64 / t.elapsed().as_secs_f64());
            let _ = std::fs::remove_file(&cat_out);
            eprintln!(
                "xtask: {} round {round}: etl {} rec/s, python+orjson {} rec/s ({:.2})",
                job.script_job,
                si(etl_rate),
                si(py_rate),
                etl_rate / py_rate
            );
            py_best = py_best.max(py_rate);
            py_rss = py_rss.max(peak);
        }
        reset(&run)?;
        rows.push(Row {
            name: job.name.into(),
            figure: format!("{} rec/s", si(etl_best)),
            baseline: format!("{} rec/s python+orjson", si(py_best)),
            ratio: etl_best / py_best,
            budget: format!(">= {:.0}x", job.budget),
            met: Some(etl_best / py_best >= job.budget),
        });
        rows.push(Row {
            name: format!("  against cat ({})", job.script_job),
            figure: format!("{} rec/s", si(etl_best)),
            baseline: format!("{} rec/s cat", si(cat_best)),
            ratio: etl_best / cat_best,
            budget: job
                .cat_budget
                .map_or_else(|| "-".into(), |b| format!(">= {b:.2}")),
            met: job.cat_budget.map(|b| etl_best / cat_best >= b),
        });
        rows.push(Row {
            name: format!("  peak RSS ({})", job.script_job),
            figure: format!("{:.1} MiB", rss as f64 / 1024.0),
            baseline: format!("{:.1} MiB python+orjson", py_rss as f64 / 1024.0),
            ratio: rss as f64 / 1024.0 / 64.0,
            budget: "< 64 MiB".into(),
            met: Some(rss < 64 * 1024),
        });
        // CPU seconds (user + system, every thread) per record read, the
        // least of the rounds on each side.
        let measured = etl_cpu.is_finite() && py_cpu.is_finite();
        let per_record = |cpu: f64| cpu / *records as f64 * 1e6;
        rows.push(Row {
            name: format!("  CPU per record ({})", job.script_job),
            figure: if measured {
                format!("{:.2} us", per_record(etl_cpu))
            } else {
                "not measured (no /usr/bin/time)".into()
            },
            baseline: format!("{:.2} us python+orjson", per_record(py_cpu)),
            ratio: if measured { etl_cpu / py_cpu } else { f64::NAN },
            budget: "<= 0.25".into(),
            met: measured.then_some(etl_cpu <= 0.25 * py_cpu),
        });
    }
    Ok(rows)
}

/// Rounds of the routing row, each side.
const ROUTING_ROUNDS: usize = 3;

/// The W1 job routed three ways (exclusive routes by amount, the rest to
/// an unmatched sink) against the same job into one sink, alternated in
/// the same run: what the routes cost; and, with valgrind, the
/// instructions both jobs execute over the first [`CALLGRIND_RECORDS`]
/// records (the figure the budget is judged by).
fn routing_rows(etl: &Path, work: &Path) -> Result<Vec<Row>> {
    let dir = work.join("routing");
    let input = work.join("transform").join("input-w1");
    let kept = write_transform_input("w1", W1_RECORDS, 1, &input)?;
    let steps = r#"[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 1

[[transforms]]
type = "remap"
source = '.amount_cents = to_int(round(to_float!(.amount) * 100))'
"#;
    let sink = |name: &str, when: &str| {
        format!(
            "[[sinks]]\nname = \"{name}\"\ntype = \"file\"\npath = \"output/{name}.ndjson\"\n{when}\n"
        )
    };
    let plain = sink("out", "");
    let routed = format!(
        "[routing]\nmode = \"exclusive\"\nunmatched = \"large\"\n\n{}{}{}",
        sink(
            "small",
            "when = { field = \"amount\", op = \"<\", value = 100 }"
        ),
        sink(
            "medium",
            "when = { field = \"amount\", op = \"<\", value = 500 }"
        ),
        sink("large", ""),
    );
    // The same job over the first records of the input, for callgrind,
    // and over a tiny input: its count is the process's fixed cost
    // (start-up, compiling the programs, idle threads), taken off.
    let short = work.join("transform").join("input-w1-callgrind");
    let kept_short = write_transform_input("w1", CALLGRIND_RECORDS, 1, &short)?;
    let tiny = work.join("transform").join("input-w1-callgrind-tiny");
    let kept_tiny = write_transform_input("w1", ROUTING_TINY_RECORDS, 1, &tiny)?;
    let mut configs = Vec::new();
    let mut short_configs = Vec::new();
    let mut tiny_configs = Vec::new();
    for (name, sinks) in [("plain", &plain), ("routed", &routed)] {
        for (run, input, into) in [
            (dir.join(name), &input, &mut configs),
            (
                dir.join(format!("{name}-callgrind")),
                &short,
                &mut short_configs,
            ),
            (
                dir.join(format!("{name}-callgrind-tiny")),
                &tiny,
                &mut tiny_configs,
            ),
        ] {
            std::fs::create_dir_all(&run)
                .map_err(|e| format!("cannot create {}: {e}", run.display()))?;
            let config = run.join("pipeline.toml");
            let text = format!(
                "# Written by `cargo xtask bench`.\n[source]\ntype = \"file\"\npaths = [\"{}/*.ndjson\"]\n\n{steps}\n{sinks}\n\
                 [checkpoint]\ncommit_interval = \"500ms\"\nstore = {{ type = \"file\", path = \"state\" }}\n",
                input.display(),
            );
            std::fs::write(&config, text)
                .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
            into.push((run, config));
        }
    }
    let (mut best_plain, mut best_routed) = (0f64, 0f64);
    for round in 1..=ROUTING_ROUNDS {
        let mut rates = [0f64; 2];
        for (i, (run, config)) in configs.iter().enumerate() {
            reset(run)?;
            let t = timed_cpu(etl, &["run".as_ref(), config.as_os_str()], None)?;
            check_routing_output(run, kept)?;
            rates[i] = W1_RECORDS as f64 / t.secs;
        }
        eprintln!(
            "xtask: routing round {round}: one sink {} rec/s, routed three ways {} rec/s ({:.2})",
            si(rates[0]),
            si(rates[1]),
            rates[1] / rates[0]
        );
        best_plain = best_plain.max(rates[0]);
        best_routed = best_routed.max(rates[1]);
    }
    for (run, _) in &configs {
        reset(run)?;
    }
    let mut rows = vec![Row {
        name: "routing: W1 routed 3 ways (exclusive, by amount, unmatched)".into(),
        figure: format!("{} rec/s", si(best_routed)),
        baseline: format!("{} rec/s the same job into one sink", si(best_plain)),
        ratio: best_routed / best_plain,
        // Wall rates on a shared machine move by more than the budget's
        // margin: the budget is judged by the counts below.
        budget: "informational".into(),
        met: None,
    }];
    // The instructions each job executes (callgrind) do not move with
    // the machine's load. Each count less the same job's on the tiny
    // input is what the records cost, without the fixed cost spread
    // over them (which would pull the ratio toward 1).
    let mut counts = [None; 2];
    for (i, count) in counts.iter_mut().enumerate() {
        let mut each = [0f64; 2];
        for (n, (configs, kept)) in each
            .iter_mut()
            .zip([(&short_configs, kept_short), (&tiny_configs, kept_tiny)])
        {
            let (run, config) = &configs[i];
            reset(run)?;
            let counted = callgrind(etl, &["run".as_ref(), config.as_os_str()])?;
            if counted.is_some() {
                check_routing_output(run, kept)?;
            }
            reset(run)?;
            let Some(counted) = counted else {
                break;
            };
            *n = counted;
        }
        if each[1] > 0.0 {
            *count = Some(each[0] - each[1]);
        }
    }
    let per_record = |n: f64| n / (CALLGRIND_RECORDS - ROUTING_TINY_RECORDS) as f64;
    rows.push(match counts {
        [Some(plain), Some(routed)] => Row {
            name: format!(
                "routing, instructions ({}k W1 records less {}k, callgrind)",
                CALLGRIND_RECORDS / 1000,
                ROUTING_TINY_RECORDS / 1000
            ),
            figure: format!("{:.0} instr/record routed", per_record(routed)),
            baseline: format!("{:.0} instr/record into one sink", per_record(plain)),
            ratio: plain / routed,
            budget: ">= 0.9".into(),
            met: Some(plain / routed >= 0.9),
        },
        _ => Row {
            name: "routing, instructions (callgrind)".into(),
            figure: "not measured: no valgrind".into(),
            baseline: "-".into(),
            ratio: f64::NAN,
            budget: ">= 0.9".into(),
            met: None,
        },
    });
    Ok(rows)
}

/// Check that a routing run wrote `kept` lines over its outputs.
fn check_routing_output(run: &Path, kept: u64) -> Result {
    let mut lines = 0;
    for entry in std::fs::read_dir(run.join("output"))
        .map_err(|e| format!("cannot read {}: {e}", run.display()))?
        .filter_map(std::result::Result::ok)
        // The outputs, not their side files (recovery points).
        .filter(|e| e.path().extension().is_some_and(|x| x == "ndjson"))
    {
        lines += count_lines(&entry.path())?;
    }
    if lines != kept {
        return Err(format!(
            "routing row: {} wrote {lines} lines, expected {kept}",
            run.display()
        ));
    }
    Ok(())
}

/// Records of the HTTP row.
const HTTP_RECORDS: u64 = 1_000_000;

/// File -> HTTP sink -> a real ClickHouse (Debian's, started on loopback
/// for the row), against `clickhouse-client` inserting the same NDJSON
/// file over its native protocol, alternated in the same run; each round
/// starts from an empty table and counts the rows back.
fn http_rows(etl: &Path, work: &Path) -> Result<Vec<Row>> {
    let server = etl_test_support::clickhouse::start().map_err(|e| e.to_string())?;
    let client = Path::new("/usr/bin/clickhouse-client");
    if !client.exists() {
        Cmd::new("apt-get", &["install", "-y", "-q", "clickhouse-client"]).run()?;
    }
    let dir = work.join("http");
    let input = dir.join("input");
    write_transform_input("w1", HTTP_RECORDS, 1, &input)?;
    let file = input.join("00.ndjson");
    server
        .query(
            "CREATE TABLE bench (id Int64, user String, amount Float64, timestamp Int64, \
             tags Array(String)) ENGINE = MergeTree ORDER BY id",
        )
        .map_err(|e| e.to_string())?;
    let run = dir.join("run");
    std::fs::create_dir_all(&run).map_err(|e| format!("cannot create {}: {e}", run.display()))?;
    let config = run.join("pipeline.toml");
    let text = format!(
        "# Written by `cargo xtask bench`.\n[source]\ntype = \"file\"\npaths = [\"{}\"]\n\n\
         [[sinks]]\nname = \"clickhouse\"\ntype = \"http\"\n\
         uri = \"{}/?query=INSERT%20INTO%20bench%20FORMAT%20JSONEachRow\"\n\
         timeout = \"60s\"\nbatch_max_records = 50000\nbatch_max_bytes = 16777216\nlinger = \"1s\"\n\n\
         [checkpoint]\ncommit_interval = \"500ms\"\nstore = {{ type = \"file\", path = \"state\" }}\n",
        file.display(),
        server.url(),
    );
    std::fs::write(&config, text).map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let count = || -> Result<u64> {
        let n = server
            .query("SELECT count() FROM bench")
            .map_err(|e| e.to_string())?;
        n.trim()
            .parse()
            .map_err(|e| format!("count() answered {n:?}: {e}"))
    };
    let insert = format!(
        "{} --host 127.0.0.1 --port {} --query 'INSERT INTO bench FORMAT JSONEachRow' < {}",
        client.display(),
        server.tcp_port(),
        file.display()
    );
    let (mut best_etl, mut best_client) = (0f64, 0f64);
    for round in 1..=ROUTING_ROUNDS {
        server
            .query("TRUNCATE TABLE bench")
            .map_err(|e| e.to_string())?;
        reset(&run)?;
        let t = timed_cpu(etl, &["run".as_ref(), config.as_os_str()], None)?;
        let rows = count()?;
        if rows != HTTP_RECORDS {
            return Err(format!(
                "http row: etl inserted {rows} rows, expected {HTTP_RECORDS}"
            ));
        }
        let etl_rate = HTTP_RECORDS as f64 / t.secs;
        server
            .query("TRUNCATE TABLE bench")
            .map_err(|e| e.to_string())?;
        let t = timed_cpu(Path::new("sh"), &["-c".as_ref(), insert.as_ref()], None)?;
        let rows = count()?;
        if rows != HTTP_RECORDS {
            return Err(format!(
                "http row: clickhouse-client inserted {rows} rows, expected {HTTP_RECORDS}"
            ));
        }
        let client_rate = HTTP_RECORDS as f64 / t.secs;
        eprintln!(
            "xtask: http round {round}: etl {} rec/s, clickhouse-client {} rec/s ({:.2})",
            si(etl_rate),
            si(client_rate),
            etl_rate / client_rate
        );
        best_etl = best_etl.max(etl_rate);
        best_client = best_client.max(client_rate);
    }
    reset(&run)?;
    Ok(vec![Row {
        name: "http: 1M x ~90 B file -> HTTP sink -> ClickHouse (JSONEachRow)".into(),
        figure: format!("{} rec/s", si(best_etl)),
        baseline: format!("{} rec/s clickhouse-client, same file", si(best_client)),
        ratio: best_etl / best_client,
        budget: "for reference".into(),
        met: None,
    }])
}

/// The records of the bench harnesses (`crates/etl/benches/common`), so
/// the transform rows need no harness build.
#[path = "../../crates/etl/benches/common/mod.rs"]
mod records;

/// The inputs of the transform rows: `records` records of `shape` (`w1`,
/// the file-to-file records; `nested`, orders in the shapes of
/// [`shapes::SHAPES`], about 705 bytes on average) split
/// over `files` files `dir/NN.ndjson` (rewritten only when their size
/// differs). How many the row's filter keeps (`amount >= 1`, or
/// `order.status == "paid"`).
fn write_transform_input(shape: &str, records: u64, files: u64, dir: &Path) -> Result<u64> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let per_file = records.div_ceil(files.max(1));
    let mut kept = 0;
    for f in 0..files.max(1) {
        let mut text = String::new();
        for id in f * per_file..((f + 1) * per_file).min(records) {
            kept += u64::from(if shape == "w1" {
                records::record(id, &mut text);
                records::amount_cents(id) >= 100
            } else {
                shapes::record(id, &mut text)
            });
            text.push('\n');
        }
        let path = dir.join(format!("{f:02}.ndjson"));
        if std::fs::metadata(&path).map_or(true, |m| m.len() != text.len() as u64) {
            std::fs::write(&path, text)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(kept)
}

/// The Python of a virtual environment under `target/bench/venv` with
/// orjson installed from PyPI; creates it (installing Debian's
/// `python3-venv` first when `venv` is missing and this runs as root).
fn orjson_python(work: &Path) -> Result<PathBuf> {
    let venv = work.join("venv");
    let python = venv.join("bin").join("python");
    let works = |args: &[&str]| {
        Command::new(&python)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works(&["-c", "import orjson"]) {
        return Ok(python);
    }
    let create = || {
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !python.exists() && !create() {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        if !root {
            return Err("python3 -m venv failed; install python3 and python3-venv".into());
        }
        for args in [
            &["update"][..],
            &[
                "install",
                "-y",
                "--no-install-recommends",
                "python3",
                "python3-venv",
            ][..],
        ] {
            capture(
                Command::new("apt-get")
                    .args(args)
                    .env("DEBIAN_FRONTEND", "noninteractive"),
            )?;
        }
        if !create() {
            return Err("python3 -m venv failed after installing python3-venv".into());
        }
    }
    capture(Command::new(&python).args(["-m", "pip", "install", "--quiet", "orjson"]))?;
    if !works(&["-c", "import orjson"]) {
        return Err(format!(
            "{} cannot import orjson after pip install",
            python.display()
        ));
    }
    Ok(python)
}
