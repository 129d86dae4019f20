//! Micro benchmarks of the per-record hot path of a file-to-file NDJSON
//! pipeline: validating a line (the file source), the fused JSON
//! transform (parse, filter, add a field, serialize) and the NDJSON
//! encoder (the sink side); and the transform rows' steps on their own
//! records (`transform_*`: the W1 remap, the nested condition and remap
//! on the fast path and on VRL's runtime alone, the nested declarative
//! steps). Per-record costs, in a batch of 4096.
//!
//! Run with `cargo bench -p etl --bench hot_path`, or one group with
//! `cargo bench -p etl --bench hot_path -- transform`.

// `criterion_group!` generates an undocumented public function; a bench
// fails loudly on bad setup.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use etl::{ChainOutput, CompareOp, JsonOp, JsonStage, TransformChain};
#[cfg(feature = "remap")]
use etl::{Remap, VrlFilter, VrlProgram};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{Encoder, NdjsonEncoder};
use etl_source::GeneratorSource;

#[cfg(feature = "remap")]
mod common;

const BATCH: usize = 4096;

/// The nested remap of the transform rows (`cargo xtask bench`).
#[cfg(feature = "remap")]
const ORDERS: &str = r#"
del(.customer.email)
total = 0.0
for_each(array!(.order.items)) -> |_index, item| {
    total = total + to_float!(item.qty) * to_float!(item.price)
}
.total_cents = to_int(round(total * 100))
"#;

#[cfg(feature = "remap")]
fn nested_records() -> Vec<Record> {
    let source = SourceId::new("bench");
    (0..BATCH as u64)
        .map(|o| {
            let mut value = String::new();
            common::nested_record(o, &mut value);
            let at = Position::new(source.clone(), PartitionId(0), Offset(o as i64));
            Record::new(at, value)
        })
        .collect()
}

#[cfg(feature = "remap")]
fn transforms(c: &mut Criterion) {
    let w1 = records();
    let nested = nested_records();
    let mut group = c.benchmark_group("transform");
    group.throughput(Throughput::Elements(BATCH as u64));
    let remap = |source: &str, fast: bool| {
        let program = VrlProgram::remap(source).unwrap();
        let program = if fast {
            program
        } else {
            program.runtime_only()
        };
        Box::new(Remap::new("remap", program))
    };
    let paid = |fast: bool| {
        let program = VrlProgram::condition(r#".order.status == "paid""#).unwrap();
        let program = if fast {
            program
        } else {
            program.runtime_only()
        };
        Box::new(VrlFilter::new("filter", program))
    };
    let mut cases: Vec<(&str, &[Record], TransformChain)> = Vec::new();
    for (fast, w1_name, nested_name) in [
        (true, "w1_remap_fast", "nested_remap_fast"),
        (false, "w1_remap_vrl", "nested_remap_vrl"),
    ] {
        let mut chain = TransformChain::new();
        chain.push(remap(
            ".amount_cents = to_int(round(to_float!(.amount) * 100))",
            fast,
        ));
        cases.push((w1_name, &w1, chain));
        let mut chain = TransformChain::new();
        chain.push(paid(fast));
        chain.push(remap(ORDERS, fast));
        cases.push((nested_name, &nested, chain));
    }
    // The same condition and program as configured steps: the chain then
    // reads each record once for both.
    let config = format!(
        "[source]\ntype = \"generator\"\n\
         [[transforms]]\ntype = \"filter\"\ncondition = '.order.status == \"paid\"'\n\
         [[transforms]]\ntype = \"remap\"\nsource = \"\"\"{ORDERS}\"\"\"\n\
         [[sinks]]\ntype = \"blackhole\"\n"
    );
    let config = etl::registry()
        .loader()
        .text(&config, std::path::Path::new("."))
        .unwrap();
    let chain = etl::try_chain_from_config(&config.transforms).unwrap();
    cases.push(("nested_remap_run", &nested, chain));
    let mut chain = TransformChain::new();
    chain.push(Box::new(JsonStage::new(
        "json",
        vec![
            JsonOp::Filter {
                path: JsonOp::path("order.status"),
                op: CompareOp::Eq,
                value: serde_json::json!("paid"),
            },
            JsonOp::Drop {
                path: JsonOp::path("customer.email"),
            },
        ],
    )));
    cases.push(("nested_declarative", &nested, chain));
    let mut out = ChainOutput::default();
    for (name, input, mut chain) in cases {
        group.bench_function(name, |b| {
            b.iter_batched(
                || input.to_vec(),
                |batch| {
                    out.clear();
                    chain.apply(batch, &mut out);
                    black_box(out.kept.len());
                },
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

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

#[cfg(feature = "remap")]
criterion_group!(benches, hot_path, transforms);
#[cfg(not(feature = "remap"))]
criterion_group!(benches, hot_path);
criterion_main!(benches);
