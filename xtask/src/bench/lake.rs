//! `cargo xtask bench --only lake`: NDJSON -> Parquet through the
//! `object_store` sink, to a local folder and to Garage (a real S3 server
//! on loopback), against pyarrow converting the same file to the same
//! columns and compression in the same run.

use std::path::Path;

use super::{Row, Timed, capture, si, timed_cpu, write_transform_input};
use crate::Result;

/// Records of the lake rows (the file-to-file records).
const LAKE_RECORDS: u64 = 2_000_000;
/// Records per object: the sink driver's batches.
const OBJECT_RECORDS: u64 = 100_000;
/// Runs of each side, alternated; the best of each counts.
const LAKE_ROUNDS: usize = 2;
/// Writes in flight at once to Garage (at least once).
const GARAGE_CONCURRENCY: usize = 4;
/// The budget's peak resident memory, in MiB.
const RSS_BUDGET_MIB: u64 = 128;

/// The columns of both writers, in the sink's TOML.
const COLUMNS: &str = r#"columns = [
    { name = "id", type = "int64", nullable = false },
    { name = "user", type = "string" },
    { name = "amount", type = "float64" },
    { name = "timestamp", type = "int64" },
    { name = "tags", type = "list", item = { name = "tag", type = "string" } },
]"#;

/// pyarrow's side: read the NDJSON file with the same columns, write one
/// Parquet file (zstd) to a folder or to an S3 bucket; print its rows.
const PYARROW_SCRIPT: &str = r#"
import json, sys
import pyarrow as pa, pyarrow.json as pj, pyarrow.parquet as pq, pyarrow.fs as pafs
src, dest = sys.argv[1], json.load(open(sys.argv[2]))
schema = pa.schema([
    pa.field("id", pa.int64()), pa.field("user", pa.string()),
    pa.field("amount", pa.float64()), pa.field("timestamp", pa.int64()),
    pa.field("tags", pa.list_(pa.string())),
])
table = pj.read_json(src, parse_options=pj.ParseOptions(explicit_schema=schema))
if dest["kind"] == "folder":
    fs, path = pafs.LocalFileSystem(), dest["path"]
else:
    scheme, host = dest["endpoint"].split("://", 1)
    fs = pafs.S3FileSystem(access_key=dest["access_key"], secret_key=dest["secret_key"],
        endpoint_override=host, scheme=scheme, region=dest["region"], force_virtual_addressing=False)
    path = dest["bucket"] + "/pyarrow/bench.parquet"
pq.write_table(table, path, filesystem=fs, compression="zstd")
print(table.num_rows)
"#;

/// Rows of the Parquet objects under `prefix` of `dest` (a folder's path
/// or a bucket), from their footers.
const COUNT_SCRIPT: &str = r#"
import json, sys
import pyarrow.parquet as pq, pyarrow.fs as pafs
dest, prefix = json.load(open(sys.argv[1])), sys.argv[2]
if dest["kind"] == "folder":
    fs, base = pafs.LocalFileSystem(), dest["root"] + "/" + prefix
else:
    scheme, host = dest["endpoint"].split("://", 1)
    fs = pafs.S3FileSystem(access_key=dest["access_key"], secret_key=dest["secret_key"],
        endpoint_override=host, scheme=scheme, region=dest["region"], force_virtual_addressing=False)
    base = dest["bucket"] + "/" + prefix
rows = 0
for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
    if info.type == pafs.FileType.File:
        with fs.open_input_file(info.path) as f:
            rows += pq.ParquetFile(f).metadata.num_rows
print(rows)
"#;

/// The rows: to a local folder, and to Garage.
pub(super) fn rows(etl: &Path, work: &Path) -> Result<Vec<Row>> {
    let dir = work.join("lake");
    let input = dir.join("input");
    write_transform_input("w1", LAKE_RECORDS, 1, &input)?;
    let file = input.join("00.ndjson");
    let python = etl_test_support::pyarrow::python().map_err(|e| e.to_string())?;
    let mut rows = Vec::new();

    let local = dir.join("local");
    let store = "kind = \"local\"\npath = \"lake\"".to_owned();
    let folder = serde_json::json!({
        "kind": "folder", "path": local.join("pyarrow.parquet"), "root": local.join("lake"),
    });
    rows.push(row(
        "local folder",
        etl,
        &python,
        &file,
        &local,
        &store,
        "",
        &folder,
    )?);

    // The server built with its dependencies optimised, as a production
    // one is: the tests' dev build hashes every byte unoptimised.
    let garage =
        etl_test_support::garage::Garage::start_build(&etl_test_support::garage::Build::BENCH)
            .map_err(|e| e.to_string())?;
    garage.create_bucket("bench").map_err(|e| e.to_string())?;
    let store = format!(
        "kind = \"s3\"\nbucket = \"bench\"\nregion = \"{}\"\nendpoint = \"{}\"\n\
         access_key_id = \"{}\"\nsecret_access_key = \"{}\"",
        etl_test_support::garage::REGION,
        garage.endpoint(),
        garage.key_id(),
        garage.secret()
    );
    let bucket = serde_json::json!({
        "kind": "s3", "endpoint": garage.endpoint(), "bucket": "bench",
        "access_key": garage.key_id(), "secret_key": garage.secret(),
        "region": etl_test_support::garage::REGION,
    });
    // At least once, several writes in flight hide the store's time per
    // request (each object is a PUT of its own, where pyarrow writes one).
    rows.push(row(
        "Garage (S3)",
        etl,
        &python,
        &file,
        &dir.join("garage"),
        &store,
        &format!("concurrency = {GARAGE_CONCURRENCY}\n"),
        &bucket,
    )?);
    Ok(rows)
}

/// One row: `etl` from `file` into the store `store` (the lines of its
/// `[sinks.store]` table; `options`, more lines of the sink's table),
/// against pyarrow writing to `dest`, alternated `LAKE_ROUNDS` times; the
/// best rate of each counts, and etl's highest peak RSS.
#[allow(clippy::too_many_arguments)]
fn row(
    name: &str,
    etl: &Path,
    python: &Path,
    file: &Path,
    run: &Path,
    store: &str,
    options: &str,
    dest: &serde_json::Value,
) -> Result<Row> {
    let (mut best_etl, mut best_pyarrow, mut peak_kib) = (0f64, 0f64, 0u64);
    for round in 1..=LAKE_ROUNDS {
        if run.exists() {
            std::fs::remove_dir_all(run)
                .map_err(|e| format!("cannot remove {}: {e}", run.display()))?;
        }
        std::fs::create_dir_all(run)
            .map_err(|e| format!("cannot create {}: {e}", run.display()))?;
        let config = run.join("pipeline.toml");
        // Each round its own key prefix: objects of an earlier round in
        // the bucket are not overwritten but left beside.
        let text = format!(
            "# Written by `cargo xtask bench`.\n[source]\ntype = \"file\"\npaths = [\"{}\"]\n\n\
             [[sinks]]\nname = \"lake\"\ntype = \"object_store\"\n\
             key = \"round-{round}/{{partition}}-{{first_offset}}.parquet\"\n\
             batch_max_records = {OBJECT_RECORDS}\nbatch_max_bytes = 16777216\nlinger = \"1s\"\n{options}\n\
             [sinks.store]\n{store}\n\n\
             [sinks.encoding]\nformat = \"parquet\"\ncompression = \"zstd\"\n{COLUMNS}\n\n\
             [dead_letter]\ntype = \"file\"\npath = \"dead.ndjson\"\n\n\
             [checkpoint]\ncommit_interval = \"500ms\"\nstore = {{ type = \"file\", path = \"state\" }}\n",
            file.display(),
        );
        std::fs::write(&config, text)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let t: Timed = timed_cpu(etl, &["run".as_ref(), config.as_os_str()], Some(run))?;
        // The destination in a file, not in the printed command line: it
        // holds the store's secret.
        let dest_file = run.join("dest.json");
        std::fs::write(&dest_file, dest.to_string())
            .map_err(|e| format!("cannot write {}: {e}", dest_file.display()))?;
        let counted = capture(std::process::Command::new(python).args([
            "-c",
            COUNT_SCRIPT,
            &dest_file.to_string_lossy(),
            &format!("round-{round}"),
        ]))?;
        // A lake job keeps a dead-letter sink, as one in production
        // would (and the sink then checks each line, the source not);
        // every line of the bench's input fits.
        let dead = std::fs::metadata(run.join("dead.ndjson")).map_or(0, |m| m.len());
        if dead > 0 {
            return Err(format!("lake {name} row: {dead} bytes of dead letters"));
        }
        if counted.trim() != LAKE_RECORDS.to_string() {
            return Err(format!(
                "lake {name} row: the objects hold {} rows, expected {LAKE_RECORDS}",
                counted.trim()
            ));
        }
        let etl_rate = LAKE_RECORDS as f64 / t.secs;
        peak_kib = peak_kib.max(t.peak_kib);
        let t = timed_cpu(
            python,
            &[
                "-c".as_ref(),
                PYARROW_SCRIPT.as_ref(),
                file.as_os_str(),
                dest_file.as_os_str(),
            ],
            Some(run),
        )?;
        let pyarrow_rate = LAKE_RECORDS as f64 / t.secs;
        eprintln!(
            "xtask: lake {name} round {round}: etl {} rec/s (peak {} MiB), pyarrow {} rec/s ({:.2})",
            si(etl_rate),
            peak_kib / 1024,
            si(pyarrow_rate),
            etl_rate / pyarrow_rate
        );
        best_etl = best_etl.max(etl_rate);
        best_pyarrow = best_pyarrow.max(pyarrow_rate);
    }
    let ratio = best_etl / best_pyarrow;
    let peak_mib = peak_kib / 1024;
    Ok(Row {
        name: format!("lake: 2M x ~90 B NDJSON file -> Parquet (zstd, ~12k-row objects) -> {name}"),
        figure: format!("{} rec/s, peak RSS {peak_mib} MiB", si(best_etl)),
        baseline: format!("{} rec/s pyarrow, same file and columns", si(best_pyarrow)),
        ratio,
        budget: format!(">= 1.0 and peak RSS < {RSS_BUDGET_MIB} MiB"),
        met: Some(ratio >= 1.0 && peak_mib < RSS_BUDGET_MIB),
    })
}
