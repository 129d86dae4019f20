//! Micro benchmarks of the per-record hot path of a file-to-file NDJSON
//! pipeline: validating a line (the file source), the fused JSON
//! transform (parse, filter, add a field, serialize) and the NDJSON
//! encoder (the sink side). Per-record costs, in a batch of 4096.
//!
//! Run with `cargo bench -p etl --bench hot_path`.

// `criterion_group!` generates an undocumented public function; a bench
// fails loudly on bad setup.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use etl::{ChainOutput, CompareOp, JsonOp, JsonStage, TransformChain};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{Encoder, NdjsonEncoder};
use etl_source::GeneratorSource;

const BATCH: usize = 4096;

fn records() -> Vec<Record> {
    let source = SourceId::new("bench");
    (0..BATCH as u64)
        .map(|o| {
            let value = GeneratorSource::value(1, 1, PartitionId(0), o);
            let at = Position::new(source.clone(), PartitionId(0), Offset(o as i64));
            Record::new(at, value)
        })
        .collect()
}

fn chain() -> TransformChain {
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

fn hot_path(c: &mut Criterion) {
    let input = records();
    let mut group = c.benchmark_group("hot_path");
    group.throughput(Throughput::Elements(BATCH as u64));

    group.bench_function("validate_line", |b| {
        b.iter(|| {
            for r in &input {
                black_box(serde_json::from_slice::<serde::de::IgnoredAny>(&r.value).is_ok());
            }
        });
    });

    let mut transforms = chain();
    let mut out = ChainOutput::default();
    group.bench_function("json_transform", |b| {
        b.iter_batched(
            || input.clone(),
            |batch| {
                out.clear();
                transforms.apply(batch, &mut out);
                black_box(out.kept.len());
            },
            BatchSize::LargeInput,
        );
    });

    let encoder = NdjsonEncoder::new();
    let mut buf = BytesMut::with_capacity(BATCH * 128);
    group.bench_function("ndjson_encode", |b| {
        b.iter(|| {
            buf.clear();
            for r in &input {
                encoder.encode(r, &mut buf).unwrap();
            }
            black_box(buf.len());
        });
    });
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
