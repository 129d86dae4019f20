//! Whole-pipeline measurements in one process, printed as `RESULT` lines
//! for `cargo xtask bench` (which runs this binary directly, so its own
//! peak memory is what `VmHWM` reports).
//!
//! * `ack [--records N] [--rounds R]`: generator -> JSON transform ->
//!   blackhole, with acknowledgements (the real [`Pipeline`]: source
//!   driver, checkpointer, sink driver, the transforms on one worker
//!   thread: `transform_workers(1)`) and
//!   without (the same source, transforms, encoder and sink in the same
//!   three tasks, but no handles, no tracking, no in-flight budget): the
//!   same shape, so the difference is the acknowledgement machinery. The
//!   real pipeline with its default transform pool is measured too
//!   (`ack_on_pool_rps`), for reference. Rounds alternate; the best of
//!   each is reported.
//! * `ack-on [--records N]`, `ack-off [--records N]`: one run of either
//!   side (default 200k records), for instruction counts under
//!   `valgrind --tool=callgrind`, which do not move with the machine's
//!   load as times do.
//! * `write-input --path FILE [--records N]`: write the file-to-file
//!   input (unless FILE already holds it): `N` NDJSON records of about 100
//!   bytes; reports how many the bench filter keeps (`kept`).
//! * `rate [--records N]`: records per second of the acknowledged pipeline
//!   into a blackhole (the source side's speed, to size a slow sink).
//! * `memory --records N --sink-rate R [--in-flight-mib M]`: the
//!   acknowledged pipeline into a sink that writes at most `R` records per
//!   second ([`etl_sink::testing::Slow`]), with `M` MiB of payload in
//!   flight at most (default 8); reports peak RSS.
//!
//! Run by hand with `cargo bench -p etl-cli --bench pipeline -- ack`.

// A bench binary: failures end the run with a message, like a test.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

// The bench records, shared with the `etl` crate's `hot_path` bench.
#[path = "../../etl/benches/common/mod.rs"]
mod common;

use etl::{CompareOp, JsonOp, JsonStage, Pipeline, TransformChain};
use etl_checkpoint::{CheckpointConfig, InFlightLimits};
use etl_record::{Record, SourceId};
use etl_sink::testing::Slow;
use etl_sink::{BlackholeSink, EncodedBatch, NdjsonEncoder, Sink, SinkDriver, SinkDriverConfig};
use etl_source::{GeneratorConfig, GeneratorSource, Source, SourceEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Records per source poll, as a configuration file's default.
const POLL_RECORDS: usize = 4096;
/// Records per sink write, as the sink driver's default.
const SINK_RECORDS: usize = 8192;

fn main() {
    // The allocator setting the `etl` binary runs with (its memory use is
    // part of what the rows measure).
    etl_cli::keep_large_buffers_out_of_the_heap();
    // `cargo bench` passes `--bench`; flags of our own come in pairs.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let flag = |name: &str, default: u64| -> u64 {
        args.windows(2)
            .find(|w| w[0] == name)
            .and_then(|w| w[1].parse().ok())
            .unwrap_or(default)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("ack") | None => {
            let records = flag("--records", 2_000_000);
            let rounds = flag("--rounds", 3).max(1);
            let (mut on, mut off, mut pool) = (0f64, 0f64, 0f64);
            for _ in 0..rounds {
                off = off.max(runtime.block_on(acks_off(records)));
                on = on.max(runtime.block_on(acks_on(records, None, None, Some(1))));
                pool = pool.max(runtime.block_on(acks_on(records, None, None, None)));
            }
            println!("RESULT ack_on_rps={on:.0} ack_off_rps={off:.0} ack_on_pool_rps={pool:.0}");
        }
        // One run of one side, for instruction counts under callgrind.
        Some("ack-on") => {
            let records = flag("--records", 200_000);
            let rate = runtime.block_on(acks_on(records, None, None, Some(1)));
            println!("RESULT ack_on_rps={rate:.0}");
        }
        Some("ack-off") => {
            let records = flag("--records", 200_000);
            let rate = runtime.block_on(acks_off(records));
            println!("RESULT ack_off_rps={rate:.0}");
        }
        // The file-to-file input, so every harness and xtask write the
        // same records.
        Some("write-input") => {
            let records = flag("--records", 2_000_000);
            let Some(path) = args.windows(2).find(|w| w[0] == "--path").map(|w| &w[1]) else {
                eprintln!("write-input needs --path FILE");
                std::process::exit(2);
            };
            let (mut text, mut kept) = (String::new(), 0u64);
            for id in 0..records {
                kept += u64::from(common::record(id, &mut text));
                text.push('\n');
            }
            let unchanged = std::fs::metadata(path).is_ok_and(|m| m.len() == text.len() as u64);
            if !unchanged {
                if let Some(dir) = std::path::Path::new(path).parent() {
                    std::fs::create_dir_all(dir).unwrap();
                }
                std::fs::write(path, text).unwrap();
            }
            println!("RESULT kept={kept}");
        }
        Some("rate") => {
            let records = flag("--records", 1_000_000);
            let rate = runtime.block_on(acks_on(records, None, None, None));
            println!("RESULT rate_rps={rate:.0}");
        }
        Some("memory") => {
            let records = flag("--records", 1_000_000);
            let sink_rate = flag("--sink-rate", 10_000).max(1);
            let in_flight = flag("--in-flight-mib", 8) << 20;
            let rate = runtime.block_on(acks_on(records, Some(sink_rate), Some(in_flight), None));
            println!(
                "RESULT records={records} rps={rate:.0} peak_rss_kib={}",
                peak_rss_kib()
            );
        }
        Some(other) => {
            eprintln!(
                "unknown mode {other:?}: ack | ack-on | ack-off | write-input | rate | memory"
            );
            std::process::exit(2);
        }
    }
}

fn generator(records: u64) -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        name: SourceId::new("bench"),
        partitions: 1,
        records_per_partition: Some(records),
        max_batch_records: POLL_RECORDS,
        rate: None,
        seed: 1,
    })
    .unwrap()
}

/// Drop about 10% (amounts are uniform below 1000), add a field.
fn transforms() -> TransformChain {
    let mut chain = TransformChain::new();
    chain.push(Box::new(JsonStage::new(
        "json",
        vec![
            JsonOp::Filter {
                path: JsonOp::path("amount"),
                op: CompareOp::Ge,
                value: serde_json::json!(100),
            },
            JsonOp::Add {
                path: JsonOp::path("pipeline"),
                value: serde_json::json!("bench"),
            },
        ],
    )));
    chain
}

/// The real pipeline; with `sink_rate`, the sink waits so that it writes
/// at most that many records per second; `in_flight` bounds payload bytes
/// in flight (the default limits otherwise); `workers` sets the transform
/// threads (the default pool otherwise).
async fn acks_on(
    records: u64,
    sink_rate: Option<u64>,
    in_flight: Option<u64>,
    workers: Option<usize>,
) -> f64 {
    let sink: Box<dyn Sink> = match sink_rate {
        None => Box::new(BlackholeSink::new()),
        Some(rate) => {
            let per_write = Duration::from_secs_f64(SINK_RECORDS as f64 / rate as f64);
            Box::new(Slow::new(BlackholeSink::new(), per_write))
        }
    };
    let driver = SinkDriver::new(sink, NdjsonEncoder::new()).config(SinkDriverConfig {
        batch_max_records: SINK_RECORDS,
        ..SinkDriverConfig::default()
    });
    let mut builder = Pipeline::builder();
    if let Some(workers) = workers {
        builder = builder.transform_workers(workers);
    }
    let pipeline = builder
        .source(generator(records))
        .transforms(transforms())
        .sink("out", driver)
        .checkpoint(CheckpointConfig {
            limits: match in_flight {
                Some(bytes) => InFlightLimits {
                    max_in_flight_bytes: bytes,
                    max_in_flight_bytes_per_partition: bytes,
                    ..InFlightLimits::default()
                },
                None => InFlightLimits::default(),
            },
            ..CheckpointConfig::default()
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(summary.read, records);
    records as f64 / started.elapsed().as_secs_f64()
}

/// The same source, transforms, encoder and sink on three tasks joined by
/// bounded channels, without acknowledgement handles.
async fn acks_off(records: u64) -> f64 {
    let started = Instant::now();
    let (poll_tx, mut poll_rx) = mpsc::channel::<Vec<Record>>(16);
    let (kept_tx, mut kept_rx) = mpsc::channel::<Vec<Record>>(16);
    let source = tokio::spawn(async move {
        let mut source = generator(records);
        loop {
            match source.next().await.unwrap() {
                SourceEvent::Batch(batch) => {
                    if poll_tx.send(batch.records).await.is_err() {
                        return;
                    }
                }
                SourceEvent::End => return,
                SourceEvent::Assigned(_) | SourceEvent::Revoked(_) | SourceEvent::Idle => {}
            }
        }
    });
    let stage = tokio::spawn(async move {
        let mut chain = transforms();
        let mut out = etl::ChainOutput::default();
        let mut read = 0u64;
        while let Some(batch) = poll_rx.recv().await {
            read += batch.len() as u64;
            out.clear();
            chain.apply(batch, &mut out);
            if kept_tx.send(std::mem::take(&mut out.kept)).await.is_err() {
                break;
            }
        }
        read
    });
    let sink = tokio::spawn(async move {
        let sink = BlackholeSink::new();
        let encoder = NdjsonEncoder::new();
        let mut pending: Vec<Record> = Vec::with_capacity(SINK_RECORDS);
        loop {
            let next = kept_rx.recv().await;
            let done = next.is_none();
            if let Some(batch) = next {
                pending.extend(batch);
            }
            if pending.len() >= SINK_RECORDS || (done && !pending.is_empty()) {
                let (encoded, refused) =
                    EncodedBatch::encode(std::mem::take(&mut pending), &encoder);
                assert!(refused.is_empty());
                sink.write(&encoded).await.unwrap();
            }
            if done {
                return sink.records();
            }
        }
    });
    source.await.unwrap();
    let read = stage.await.unwrap();
    let written = sink.await.unwrap();
    assert_eq!(read, records);
    assert!(written > 0);
    records as f64 / started.elapsed().as_secs_f64()
}

/// Peak resident set size of this process, in KiB (0 where unknown).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
