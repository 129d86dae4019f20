//! Benchmarks: acknowledgement handling with 1, 100 and 10,000 pending
//! batches (the cost per ack must not grow with them), and `FileStore`
//! commit latency (dominated by two fsyncs).
//!
//! Run with `cargo bench -p etl-checkpoint`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use etl_ack::{AckMsg, AckStatus, BatchId, BatchMeta};
use etl_checkpoint::{FileStore, OffsetStore, PartitionTracker};
use etl_record::{Offset, PartitionId};

const P: PartitionId = PartitionId(0);

fn meta(seq: u64) -> BatchMeta {
    let first = seq as i64 * 10;
    BatchMeta {
        id: BatchId {
            partition: P,
            epoch: 1,
            seq,
        },
        first_offset: Offset(first),
        last_offset: Offset(first + 9),
        records: 10,
        bytes: 100,
    }
}

fn delivered(m: &BatchMeta) -> AckMsg {
    AckMsg {
        id: m.id,
        last_offset: m.last_offset,
        status: AckStatus::Delivered,
    }
}

/// Each iteration opens one batch and resolves one, keeping `pending`
/// batches outstanding. Two shapes: the oldest resolves (the watermark
/// moves), or one in the middle resolves while the oldest pins the
/// watermark (the worst case for a tracker that scans).
fn ack_handling(c: &mut Criterion) {
    let mut group = c.benchmark_group("ack_handling");
    group.throughput(Throughput::Elements(1));
    for pending in [1u64, 100, 10_000] {
        group.bench_with_input(BenchmarkId::new("in_order", pending), &pending, |b, &n| {
            let now = Instant::now();
            let mut t = PartitionTracker::new(P, 1, Offset(0));
            for seq in 0..n {
                t.opened(&meta(seq), now);
            }
            let mut next = n;
            b.iter(|| {
                t.opened(&meta(next), now);
                black_box(t.resolved(&delivered(&meta(next - n))));
                next += 1;
            });
        });
        group.bench_with_input(BenchmarkId::new("pinned", pending), &pending, |b, &n| {
            let now = Instant::now();
            let mut t = PartitionTracker::new(P, 1, Offset(0));
            t.opened(&meta(0), now); // never resolves: pins the watermark
            let mut open = 1;
            let mut resolve = 1;
            b.iter(|| {
                // Keep `n` batches pending behind the pinned one, then
                // resolve the oldest of them; restart when the ring gets
                // large so memory stays bounded.
                while open - resolve < n {
                    t.opened(&meta(open), now);
                    open += 1;
                }
                black_box(t.resolved(&delivered(&meta(resolve))));
                resolve += 1;
                if open > 200_000 {
                    t = PartitionTracker::new(P, 1, Offset(0));
                    t.opened(&meta(0), now);
                    (open, resolve) = (1, 1);
                }
            });
        });
    }
    group.finish();
}

fn file_store_commit(c: &mut Criterion) {
    let mut group = c.benchmark_group("file_store_commit");
    group.sample_size(20);
    for partitions in [1u32, 100] {
        group.bench_with_input(
            BenchmarkId::from_parameter(partitions),
            &partitions,
            |b, &n| {
                let dir = tempfile::tempdir().expect("temp dir");
                let mut store = FileStore::open(dir.path()).expect("store");
                let mut offset = 0;
                b.iter(|| {
                    offset += 1;
                    let offsets: BTreeMap<_, _> =
                        (0..n).map(|p| (PartitionId(p), Offset(offset))).collect();
                    store.commit(&offsets).expect("commit");
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, ack_handling, file_store_commit);
criterion_main!(benches);
