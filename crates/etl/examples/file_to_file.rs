//! File to file from Rust: NDJSON in, the built-in JSON transforms, an
//! fsync'd file sink, offsets in the crash-safe file store.
//!
//! It is `examples/quickstart/pipeline.toml` built in code: the same
//! steps in the same order (keep `amount >= 10`, add
//! `pipeline = "quickstart"`, rename `user` to `customer`), the same sink,
//! dead-letter file and commit interval (500 ms), and a first Ctrl-C stops
//! it gracefully as it does `etl run`. What differs:
//!
//! * paths: the input (a path or a glob) and the output folder are
//!   arguments; `etl run` resolves the TOML's `input/*.ndjson`,
//!   `output/…` and `.etl-state/` against the config file's folder. Here
//!   the output is `OUT_DIR/orders.ndjson`, `OUT_DIR/dead-letter.ndjson`
//!   and the state `OUT_DIR/.etl-state`;
//! * tuning: none is set here, and none needs to be: the Rust types'
//!   defaults (`FileSourceConfig`, `SinkDriverConfig`, `CheckpointConfig`)
//!   are the defaults of the TOML options of the same names;
//! * no metrics endpoint and no progress line, which are the command's.
//!
//! Run it with
//! `cargo run -p etl --example file_to_file -- 'examples/quickstart/input/*.ndjson' OUT_DIR`.

use std::path::Path;
use std::time::Duration;

use etl::{CompareOp, JsonOp, JsonStage, Pipeline};
use etl_checkpoint::{CheckpointConfig, FileStore};
use etl_sink::{FileSink, FileSinkConfig, NdjsonEncoder, SinkDriver};
use etl_source::{FileSource, FileSourceConfig};
use tokio_util::sync::CancellationToken;

/// Copy the orders worth at least 10 from `input` (a path or a glob) to
/// `out_dir/orders.ndjson`, tagged, until the input is read or `shutdown`
/// is cancelled; returns (read, written).
pub(crate) async fn run(
    input: &str,
    out_dir: &Path,
    shutdown: CancellationToken,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out_dir)?;
    let state = out_dir.join(".etl-state");
    let source = FileSource::open(FileSourceConfig {
        paths: vec![input.to_owned()],
        // Which file each partition is, next to the offsets: a replaced
        // input is then read again rather than resumed at a foreign offset.
        state_dir: Some(state.clone()),
        ..FileSourceConfig::default()
    })?;
    let sink = FileSink::open(out_dir.join("orders.ndjson"), FileSinkConfig::default()).await?;
    let dead = FileSink::open(
        out_dir.join("dead-letter.ndjson"),
        FileSinkConfig::default(),
    )
    .await?;
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(JsonStage::new(
            "orders",
            vec![
                JsonOp::Filter {
                    path: JsonOp::path("amount"),
                    op: CompareOp::Ge,
                    value: 10.into(),
                },
                JsonOp::Add {
                    path: JsonOp::path("pipeline"),
                    value: "quickstart".into(),
                },
                JsonOp::Rename {
                    from: JsonOp::path("user"),
                    to: JsonOp::path("customer"),
                },
            ],
        ))
        .sink("orders", SinkDriver::new(sink, NdjsonEncoder::new()))
        .dead_letter(dead)
        .offset_store(FileStore::open(&state)?)
        .checkpoint(CheckpointConfig {
            commit_interval: Duration::from_millis(500),
            ..CheckpointConfig::default()
        })
        .build()?;
    let summary = pipeline.run(shutdown).await?;
    Ok((summary.read, summary.written()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let input = args
        .next()
        .unwrap_or_else(|| "examples/quickstart/input/*.ndjson".to_owned());
    let out_dir = args
        .next()
        .unwrap_or_else(|| "target/file_to_file".to_owned());
    let shutdown = etl::shutdown_signal()?;
    let (read, written) = run(&input, Path::new(&out_dir), shutdown).await?;
    println!("read {read}, wrote {written} to {out_dir}/orders.ndjson");
    Ok(())
}
