//! What the source side holds per input file, counted by this test
//! binary's global allocator. It counts only the heap of a thread that
//! asked for it (other unit tests run on other threads at the same
//! time), so what is measured runs on the test's own thread: a
//! current-thread runtime. Heap bytes are counted, not timed: the counts
//! are the same on every run.
#![allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; this one only counts and calls `System`"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::{CheckpointConfig, Checkpointer, MemoryStore};
use etl_fs::{Fs, SimFs};
use etl_record::{Offset, PartitionId};
use tokio_util::sync::CancellationToken;

use crate::file_identity::{FileIdentity, Registry};
use crate::file_tail::Tail;
use crate::{DriverExit, Source, SourceDriver, SourceDriverConfig, SourceError, SourceEvent};

/// Counts the bytes allocated and not yet freed by threads that count.
struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated and not freed by this thread while counting (a
    /// block freed here that another thread allocated counts too, as
    /// less).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The most `LIVE` was since counting started.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: isize) {
    // `try_with`: the allocator also runs while a thread's locals are
    // torn down. None of these has a destructor, but never panic here.
    let counting = COUNTING.try_with(Cell::get).unwrap_or(false);
    if counting {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + by;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }
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
        grew(-(layout.size() as isize));
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

/// Heap bytes `f` left allocated on this thread, and the most it held at
/// once, with its result.
fn counted<R>(f: impl FnOnce() -> R) -> (R, isize, isize) {
    LIVE.set(0);
    PEAK.set(0);
    COUNTING.set(true);
    let result = f();
    COUNTING.set(false);
    (result, LIVE.get(), PEAK.get())
}

const FILES: u32 = 20_000;

/// The record of inputs, as a rerun loads it, costs little more than its
/// entries: read back in path order, one by one, a B-tree's nodes stay
/// about half full (about 170 bytes a file, where the entry and its key
/// are about 90); packed, 136 bytes, and 120 since an entry keeps its
/// tail's two fields without an `Option` around them.
#[test]
fn a_reloaded_record_of_inputs_costs_under_125_heap_bytes_per_file() {
    let sim = SimFs::new(1);
    let state = Path::new("/state");
    sim.create_dir_all(state).unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut registry = Registry::load(Arc::clone(&fs), Some(state)).unwrap();
    for n in 0..u64::from(FILES) {
        let identity = FileIdentity {
            dev: 1,
            ino: 100 + n,
            fp_len: 1024,
            fp_crc: 7,
        };
        let tail = Tail { end: 1900, crc: 9 };
        let path = format!("/input/{n:06}.ndjson");
        registry.assign_new(Path::new(&path), identity, tail);
    }
    registry.save().unwrap();
    drop(registry);
    let (registry, live, peak) = counted(|| Registry::load(fs, Some(state)).unwrap());
    let per_file = live / isize::try_from(FILES).unwrap();
    eprintln!(
        "record of inputs reloaded: {per_file} heap bytes per file, {} at the peak",
        peak / isize::try_from(FILES).unwrap()
    );
    assert!(per_file < 125, "{per_file} heap bytes per file");
    drop(registry);
}

/// A source of many partitions that reads nothing: it assigns them and
/// ends, as a rerun over files read to their end does.
#[derive(Debug)]
struct AssignsThenEnds {
    partitions: u32,
    assigned: bool,
}

#[async_trait]
impl Source for AssignsThenEnds {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if self.assigned {
            return Ok(SourceEvent::End);
        }
        self.assigned = true;
        Ok(SourceEvent::Assigned(
            (0..self.partitions).map(PartitionId).collect(),
        ))
    }

    async fn seek(&mut self, _: PartitionId, _: Offset) -> Result<(), SourceError> {
        Ok(())
    }
}

/// The driver's own state per partition (its epochs and counters), and
/// what it holds at once while it checks that everything it emitted is
/// delivered: no copy of the checkpointer's metrics of every partition.
/// 148 bytes while the counters were a B-tree of every partition's
/// `PartitionSourceMetrics`; 102 with a compact row each.
#[test]
fn the_source_driver_holds_under_110_heap_bytes_per_idle_partition_at_its_peak() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (acker, acks) = etl_ack::channel();
    let (checkpoint, replays) = Checkpointer::spawn(
        CheckpointConfig::default(),
        Box::new(MemoryStore::default()),
        acks,
    )
    .unwrap();
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let driver = SourceDriver::new(
        AssignsThenEnds {
            partitions: FILES,
            assigned: false,
        },
        acker,
        checkpoint.clone(),
        replays,
        tx,
        SourceDriverConfig {
            end_check_interval: Duration::from_millis(5),
            ..SourceDriverConfig::default()
        },
    );
    let (exit, _, peak) = counted(|| rt.block_on(driver.run(CancellationToken::new())));
    assert_eq!(exit.unwrap(), DriverExit::Ended);
    let per_partition = peak / isize::try_from(FILES).unwrap();
    eprintln!("source driver: {per_partition} heap bytes per partition at its peak");
    assert!(
        per_partition < 110,
        "{per_partition} heap bytes per partition at the peak"
    );
    drop(rt.block_on(checkpoint.shutdown()));
}
