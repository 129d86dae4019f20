//! The complete program of `docs/using-the-crates.md`: keep the lines of
//! a web server's access logs that record a server error (status 5xx) in
//! one file, durably, resuming where the last run stopped, and stop
//! cleanly on Ctrl-C.
//!
//! It needs only the `etl` crate without its default features (no
//! librdkafka, no VRL), `etl-source`, `etl-sink`, `etl-checkpoint`,
//! `etl-record`, `tokio` and `tokio-util`.
//!
//! Run it with `cargo run -p etl --example log_errors -- 'LOGS/*.log' OUT_DIR`.

use std::path::Path;

use etl::{Pipeline, Summary, filter};
use etl_checkpoint::FileStore;
use etl_record::Record;
use etl_sink::{FileSink, FileSinkConfig, RawLinesEncoder, SinkDriver};
use etl_source::{FileSource, FileSourceConfig, LineFormat};
use tokio_util::sync::CancellationToken;

/// Whether an access-log line (`... "GET / HTTP/1.1" 503 512`) records a
/// server error: its next-to-last field is a 5xx status.
fn is_server_error(record: &Record) -> bool {
    let line = String::from_utf8_lossy(&record.value);
    let mut fields = line.split_whitespace().rev();
    let _size = fields.next();
    fields
        .next()
        .is_some_and(|status| status.len() == 3 && status.starts_with('5'))
}

/// Copy the server errors of the files `inputs` matches (a path or a glob)
/// to `out_dir/errors.log` until they are read to their end or `shutdown`
/// is cancelled. Offsets are kept in `out_dir/.etl-state`, so a second run
/// reads only what was appended since.
pub(crate) async fn run(
    inputs: &str,
    out_dir: &Path,
    shutdown: CancellationToken,
) -> Result<Summary, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out_dir)?;
    let state = out_dir.join(".etl-state");
    let source = FileSource::open(FileSourceConfig {
        paths: vec![inputs.to_owned()],
        format: LineFormat::Lines,
        state_dir: Some(state.clone()),
        ..FileSourceConfig::default()
    })?;
    // `Ok` from the file sink means fsync'd: only then are offsets committed.
    let errors = FileSink::open(out_dir.join("errors.log"), FileSinkConfig::default()).await?;
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(filter("server-errors", is_server_error))
        .sink("errors", SinkDriver::new(errors, RawLinesEncoder::new()))
        .offset_store(FileStore::open(&state)?)
        .build()?;
    Ok(pipeline.run(shutdown).await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(inputs), Some(out_dir)) = (args.next(), args.next()) else {
        return Err("usage: log_errors 'LOGS/*.log' OUT_DIR".into());
    };
    // First Ctrl-C: drain, flush, commit and return. Second: exit 130.
    let shutdown = etl::shutdown_signal()?;
    let summary = run(&inputs, Path::new(&out_dir), shutdown).await?;
    println!(
        "read {} lines, kept {} server errors{}",
        summary.read,
        summary.written(),
        if summary.stopped {
            " (stopped early)"
        } else {
            ""
        }
    );
    Ok(())
}
