//! What the checkpointer holds per partition once the partition is idle
//! and committed, counted by a global allocator of this test binary's own
//! (a global allocator cannot be scoped to one test, hence the binary of
//! its own). Heap bytes are counted, not timed: the counts are the same
//! on every run.
#![allow(clippy::unwrap_used)]
#![allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; this one only counts and calls `System`"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use etl_ack::{BatchId, BatchMeta};
use etl_checkpoint::{
    CheckpointConfig, CheckpointError, Checkpointer, FileStore, InFlightLimits, OffsetStore,
    PartitionOffsets,
};
use etl_record::{Offset, PartitionId};

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The most bytes live at once since the last [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed to the system allocator unchanged; the
// counter only adds up the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Start measuring the peak from the bytes live now.
fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Held by each test while it counts: the counters are the process's,
/// and the test harness runs tests on threads of their own at once. Each
/// test builds and drops its runtime while it holds it, so another test's
/// runtime is not counted either.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run `test` alone on a runtime of its own, made and dropped while no
/// other test counts.
fn alone<F: std::future::Future>(test: F) -> F::Output {
    let _alone = COUNTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(test)
}

/// A store that keeps nothing, so only the checkpointer's own bytes are
/// counted.
struct Forgetful;

impl OffsetStore for Forgetful {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(PartitionOffsets::new())
    }

    fn commit(&mut self, _offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// Heap bytes per partition once each of `partitions` partitions had a
/// batch delivered and committed, and nothing is in flight: the tracking
/// state and the published metrics of an idle, committed partition.
async fn bytes_per_idle_partition(partitions: u32) -> isize {
    let config = CheckpointConfig {
        commit_interval: Duration::from_secs(3600),
        limits: InFlightLimits {
            max_in_flight_batches_per_partition: 1,
            max_in_flight_bytes_per_partition: 1 << 20,
            max_in_flight_batches: 256,
            max_in_flight_bytes: 1 << 20,
        },
        ..CheckpointConfig::default()
    };
    let (acker, acks) = etl_ack::channel();
    let (handle, _replays) = Checkpointer::spawn(config, Box::new(Forgetful), acks).unwrap();
    // Settle the channels and the metrics snapshot before counting.
    handle.commit().await.unwrap();
    let before = live();
    let assigned = handle
        .assign((0..partitions).map(|p| (PartitionId(p), None)).collect())
        .await
        .unwrap();
    for a in &assigned {
        handle.budget().acquire(a.partition, 100).await;
        let id = BatchId {
            partition: a.partition,
            epoch: a.epoch,
            seq: 0,
        };
        let ack = acker
            .open(BatchMeta {
                id,
                first_offset: Offset(0),
                last_offset: Offset(9),
                records: 10,
                bytes: 100,
            })
            .unwrap();
        // Dropped unfailed: delivered.
        drop(ack);
    }
    drop(assigned);
    let committed = handle.commit().await.unwrap();
    assert_eq!(
        committed.len(),
        partitions as usize,
        "every partition moved"
    );
    assert_eq!(handle.budget().in_flight().batches, 0, "nothing in flight");
    drop(committed);
    let held = live() - before;
    let metrics = handle.metrics();
    assert_eq!(metrics.partitions.len(), partitions as usize);
    assert!(
        metrics
            .partitions
            .values()
            .all(|m| m.committed == Some(Offset(10)) && m.in_flight_batches == 0)
    );
    drop(metrics);
    handle.shutdown().await.unwrap();
    held / isize::try_from(partitions).unwrap()
}

/// 191 bytes while the published metrics were a B-tree of every
/// partition's `PartitionMetrics`; 129 with a compact row each; 121 once
/// the partition's state keeps its committed offset without an `Option`.
#[test]
fn an_idle_committed_partition_costs_the_checkpointer_under_130_bytes() {
    let per_partition = alone(bytes_per_idle_partition(20_000));
    eprintln!("heap bytes per idle, committed partition: {per_partition}");
    assert!(
        per_partition < 130,
        "{per_partition} bytes per idle, committed partition"
    );
}

/// The most heap bytes per partition held at once while `partitions`
/// partitions, each with an offset committed in a file store by an
/// earlier run, are assigned at once (as a file source's are when a run
/// starts again over the same input files): the store read back, the
/// request and the reply, the checkpointer's state. The store's own
/// offsets, loaded when it was opened, are counted before.
async fn peak_bytes_per_partition_assigned_from_a_file_store(partitions: u32) -> isize {
    let dir = tempfile::tempdir().unwrap();
    let all: PartitionOffsets = (0..partitions)
        .map(|p| (PartitionId(p), Offset(i64::from(p) * 100)))
        .collect();
    {
        let mut store = FileStore::open(dir.path()).unwrap();
        // Two commits: both of the store's files hold every offset.
        store.commit(&all).unwrap();
        store.commit(&all).unwrap();
    }
    drop(all);
    let store = FileStore::open(dir.path()).unwrap();
    let (_acker, acks) = etl_ack::channel();
    let config = CheckpointConfig {
        commit_interval: Duration::from_secs(3600),
        ..CheckpointConfig::default()
    };
    let (handle, _replays) = Checkpointer::spawn(config, Box::new(store), acks).unwrap();
    handle.commit().await.unwrap();
    let request: Vec<(PartitionId, Option<Offset>)> =
        (0..partitions).map(|p| (PartitionId(p), None)).collect();
    let before = live();
    reset_peak();
    let assigned = handle.assign(request).await.unwrap();
    let most = peak() - before;
    assert_eq!(assigned.len(), partitions as usize);
    assert!(
        assigned
            .iter()
            .all(|a| a.start == Offset(i64::from(a.partition.0) * 100)),
        "every partition starts at its committed offset"
    );
    drop(assigned);
    handle.shutdown().await.unwrap();
    most / isize::try_from(partitions).unwrap()
}

/// 130 bytes while the checkpointer looked the committed offsets up in a
/// copy of the store's; 120 once it reads the store's own (the store now
/// also builds its map once, from the newest valid file, and packed). The
/// rest is the partitions' state, the request and the reply.
#[test]
fn assigning_partitions_committed_in_a_file_store_peaks_under_125_bytes_each() {
    let per_partition = alone(peak_bytes_per_partition_assigned_from_a_file_store(20_000));
    eprintln!("heap bytes per partition at the peak of the assignment: {per_partition}");
    assert!(
        per_partition < 125,
        "{per_partition} bytes per partition at the peak of the assignment"
    );
}
