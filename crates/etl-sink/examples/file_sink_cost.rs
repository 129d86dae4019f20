//! What the file sink's writes and its open cost on this disk: appends
//! with an `fsync` per batch, then opening the finished output again after
//! a stop (a flush) and after a kill (the check of its tail). For comparing versions of the sink; see
//! docs/benchmarks.md, "The file sink's recovery point".
//!
//! ```sh
//! cargo run --release -p etl-sink --example file_sink_cost -- DIR [MIB] [ROUNDS]
//! ```
//!
//! `DIR` must be on the disk to measure (not a tmpfs, where `fsync` does
//! nothing). Writes `MIB` MiB (default 256) of NDJSON lines of about 100
//! bytes in batches of 8192 records, and the same in raw lines holding a
//! NUL byte; prints one line per content and round.

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{
    EncodedBatch, Encoder, FileSink, FileSinkConfig, NdjsonEncoder, RawLinesEncoder, Sink,
};

const BATCH: i64 = 8192;

fn batch(first: i64, nul: bool, encoder: &dyn Encoder) -> EncodedBatch {
    let records = (first..first + BATCH)
        .map(|o| {
            let position = Position::new(SourceId::new("bench"), PartitionId(0), Offset(o));
            let value = format!(
                "{{\"id\":{o},\"user\":\"u{}\",\"amount\":{},\"tags\":[\"a\",\"b\"]}}{}",
                o % 977,
                o % 1000,
                if nul { "\0" } else { "" }
            );
            Record::new(position, format!("{value:<96}"))
        })
        .collect();
    EncodedBatch::encode(records, encoder).0
}

async fn round(dir: &Path, mib: u64, nul: bool) -> Result<(), Box<dyn Error>> {
    let name = if nul { "raw-nul" } else { "ndjson" };
    let path = dir.join(format!("{name}.out"));
    for leftover in ["", ".lock", ".recovery", ".progress"] {
        let _ = std::fs::remove_file(format!("{}{leftover}", path.display()));
    }
    let encoder: Box<dyn Encoder> = if nul {
        Box::new(RawLinesEncoder::new())
    } else {
        Box::new(NdjsonEncoder::trusted())
    };
    let sink = FileSink::open(&path, FileSinkConfig::default()).await?;
    let started = Instant::now();
    let mut written = 0u64;
    let mut first = 0;
    while written < mib << 20 {
        let b = batch(first, nul, &*encoder);
        written += b.bytes().len() as u64;
        sink.write(&b).await?;
        first += BATCH;
    }
    let secs = started.elapsed().as_secs_f64();
    // As a pipeline's stop does.
    sink.flush().await?;
    drop(sink);
    let started = Instant::now();
    let sink = FileSink::open(&path, FileSinkConfig::default()).await?;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    // And after a crash: nothing flushed, the newest bytes not fsynced.
    let b = batch(first, nul, &*encoder);
    sink.write(&b).await?;
    drop(sink);
    let started = Instant::now();
    let sink = FileSink::open(&path, FileSinkConfig::default()).await?;
    let crash_ms = started.elapsed().as_secs_f64() * 1e3;
    drop(sink);
    println!(
        "{name}: {:.0} MiB/s ({} batches, fsync each), reopen after a stop {open_ms:.1} ms, \
         after a kill {crash_ms:.1} ms",
        written as f64 / (1 << 20) as f64 / secs,
        first / BATCH
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: file_sink_cost DIR [MIB] [ROUNDS]")?;
    let mib = args.next().map_or(Ok(256), |m| m.parse())?;
    let rounds = args.next().map_or(Ok(3), |r| r.parse())?;
    std::fs::create_dir_all(&dir)?;
    for _ in 0..rounds {
        for nul in [false, true] {
            round(Path::new(&dir), mib, nul).await?;
        }
    }
    Ok(())
}
