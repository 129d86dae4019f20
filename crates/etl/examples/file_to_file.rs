//! File to file from Rust: NDJSON in, the built-in JSON transforms, an
//! fsync'd file sink, offsets in the crash-safe file store. The same
//! pipeline as `examples/quickstart/pipeline.toml`, built in code.
//!
//! Run it with `cargo run -p etl --example file_to_file -- IN.ndjson OUT_DIR`.

use std::path::Path;

use etl::{CompareOp, JsonOp, JsonStage, Pipeline};
use etl_checkpoint::FileStore;
use etl_sink::{FileSink, FileSinkConfig, NdjsonEncoder, SinkDriver};
use etl_source::{FileSource, FileSourceConfig};
use tokio_util::sync::CancellationToken;

/// Copy the orders worth at least 10 from `input` to `out_dir/orders.ndjson`,
/// tagged; returns (read, written).
pub(crate) async fn run(
    input: &Path,
    out_dir: &Path,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out_dir)?;
    let state = out_dir.join(".etl-state");
    let source = FileSource::open(FileSourceConfig {
        inputs: vec![input.to_string_lossy().into_owned()],
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
                    value: "rust".into(),
                },
            ],
        ))
        .sink("orders", SinkDriver::new(sink, NdjsonEncoder::new()))
        .dead_letter(dead)
        .offset_store(FileStore::open(&state)?)
        .build()?;
    let summary = pipeline.run(CancellationToken::new()).await?;
    Ok((summary.read, summary.written()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let input = args
        .next()
        .unwrap_or_else(|| "examples/quickstart/input/orders-0.ndjson".to_owned());
    let out_dir = args
        .next()
        .unwrap_or_else(|| "target/file_to_file".to_owned());
    let (read, written) = run(Path::new(&input), Path::new(&out_dir)).await?;
    println!("read {read}, wrote {written} to {out_dir}/orders.ndjson");
    Ok(())
}
