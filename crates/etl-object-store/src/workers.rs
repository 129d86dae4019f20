//! A write's work shared between threads: the records' rows read in
//! chunks, and a Parquet object's columns built and encoded one column per
//! task, on the write's own thread and on helper threads that every write
//! of the process shares (started by the first write with work to share,
//! then kept: starting and joining threads for every call cost a
//! thread's creation, its stack's first pages and a memory arena of its
//! own each time).
//!
//! Each task's result is kept at the task's place, so what comes out does
//! not depend on which thread ran what, or when.

use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use rayon_core::{ThreadPool, ThreadPoolBuilder};

/// How many threads a write's work is shared between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Workers {
    threads: NonZeroUsize,
    /// Work smaller than this (in the caller's unit: cells of a row
    /// group) runs on the calling thread alone: starting and joining
    /// helpers would cost more than they save.
    min_shared: usize,
}

/// The helper threads every write shares: one fewer than the cores the
/// process may use (the write's own thread is the last), at least one.
/// `None` when they cannot be started: each write then runs on its own
/// thread alone.
fn helpers() -> Option<&'static ThreadPool> {
    static HELPERS: OnceLock<Option<ThreadPool>> = OnceLock::new();
    HELPERS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
            let threads = cores.saturating_sub(1).max(1);
            IDLE.store(threads, Ordering::Release);
            ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|_| "etl-object-encode".to_owned())
                .build()
                .map_err(|e| tracing::warn!(error = %e, "no helper threads for the object-store sink's writes; each runs on its own thread"))
                .ok()
        })
        .as_ref()
}

/// How many helper threads no write has a share on now. A write hands
/// shares only to helpers it claimed here, so it never queues behind
/// another write's shares (waiting, on a tokio worker, for work that is
/// not its own): a helper busy elsewhere leaves the write its share.
static IDLE: AtomicUsize = AtomicUsize::new(0);

/// Up to `want` idle helpers, claimed: how many.
fn claim_idle(want: usize) -> usize {
    let mut idle = IDLE.load(Ordering::Acquire);
    loop {
        let take = want.min(idle);
        if take == 0 {
            return 0;
        }
        match IDLE.compare_exchange_weak(idle, idle - take, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return take,
            Err(now) => idle = now,
        }
    }
}

/// A claimed helper, given back when its share ends (or unwinds).
struct Claimed;

impl Drop for Claimed {
    fn drop(&mut self) {
        IDLE.fetch_add(1, Ordering::AcqRel);
    }
}

/// Below this many cells (rows times columns) a row group is encoded on
/// the write's thread alone.
const MIN_SHARED_CELLS: usize = 16_384;

impl Workers {
    /// One per core the process may use, for work of at least
    /// [`MIN_SHARED_CELLS`].
    pub(crate) fn per_core() -> Self {
        Workers {
            threads: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            min_shared: MIN_SHARED_CELLS,
        }
    }

    /// `n` threads (at least one), whatever the size of the work.
    #[cfg(test)]
    pub(crate) fn new(n: usize) -> Self {
        Workers {
            threads: NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN),
            min_shared: 0,
        }
    }

    /// The number of threads.
    pub(crate) fn count(self) -> usize {
        self.threads.get()
    }

    /// These workers for work of `size`: one thread when it is too small
    /// to share.
    pub(crate) fn for_size(self, size: usize) -> Self {
        if size < self.min_shared {
            Workers {
                threads: NonZeroUsize::MIN,
                ..self
            }
        } else {
            self
        }
    }

    /// `work` of every one of `tasks`, each result at its task's place.
    /// Tasks are started in the order `first` gives (the costliest first
    /// keeps the threads evenly busy), on this thread and on up to
    /// `count - 1` of the shared helpers (fewer when the process has
    /// fewer: the tasks are then shared between those); when there are
    /// none, this thread runs them all. Returns once every task ended. A
    /// task that fails or panics fails the whole.
    pub(crate) fn run<T, R, F>(
        self,
        tasks: Vec<T>,
        first: &[usize],
        work: F,
    ) -> Result<Vec<R>, String>
    where
        T: Send,
        R: Send,
        F: Fn(T) -> Result<R, String> + Sync,
    {
        let n = tasks.len();
        let order: Vec<usize> = if first.len() == n {
            first.to_vec()
        } else {
            (0..n).collect()
        };
        let slots: Vec<Mutex<Option<T>>> = tasks.into_iter().map(|t| Mutex::new(Some(t))).collect();
        let done: Vec<Mutex<Option<Result<R, String>>>> =
            (0..n).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let worker = || {
            while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                let task = slots
                    .get(i)
                    .and_then(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner).take());
                let Some(task) = task else { continue };
                let out = catch_unwind(AssertUnwindSafe(|| work(task))).unwrap_or_else(|panic| {
                    let text = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".to_owned());
                    Err(format!("the encoding panicked: {text}"))
                });
                let failed = out.is_err();
                if let Some(slot) = done.get(i) {
                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(out);
                }
                if failed {
                    // The whole fails: start no further task.
                    next.store(n, Ordering::Relaxed);
                }
            }
        };
        let wanted = self.count().min(n).saturating_sub(1);
        let pool = helpers().filter(|_| wanted > 0);
        let shares = if pool.is_some() {
            claim_idle(wanted)
        } else {
            0
        };
        // Each claimed helper is given back when its share ends, or here
        // if its share never starts.
        let claimed: Vec<Claimed> = (0..shares).map(|_| Claimed).collect();
        match pool.filter(|_| shares > 0) {
            Some(pool) => {
                // The worker catches its tasks' panics; a panic outside
                // them leaves its task's result missing, refused below.
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    pool.in_place_scope(|scope| {
                        for claimed in claimed {
                            scope.spawn(move |_| {
                                let _claimed = claimed;
                                worker();
                            });
                        }
                        worker();
                    });
                }));
            }
            None => worker(),
        }
        let mut results = Vec::with_capacity(n);
        let mut not_run = false;
        for slot in done {
            match slot.into_inner().unwrap_or_else(PoisonError::into_inner) {
                Some(Ok(r)) => results.push(r),
                // The reason of a task that failed, not that others were
                // not started after it.
                Some(Err(e)) => return Err(e),
                None => not_run = true,
            }
        }
        if not_run {
            return Err("a task was not run".to_owned());
        }
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_result_is_at_its_tasks_place_whatever_finishes_first() {
        // The first tasks started take longest: they finish last.
        let tasks: Vec<u64> = (0..16).collect();
        let first: Vec<usize> = (0..16).rev().collect();
        for threads in [1, 2, 5, 32] {
            let out = Workers::new(threads)
                .run(tasks.clone(), &first, |t| {
                    std::thread::sleep(Duration::from_millis(t));
                    Ok(t * 10)
                })
                .unwrap();
            assert_eq!(
                out,
                (0..16).map(|t| t * 10).collect::<Vec<_>>(),
                "{threads}"
            );
        }
    }

    #[test]
    fn a_task_that_fails_or_panics_fails_the_whole_with_its_reason() {
        for threads in [1, 3] {
            let err = Workers::new(threads)
                .run(vec![1, 2, 3], &[2, 1, 0], |t| {
                    if t == 2 {
                        Err(format!("task {t}"))
                    } else {
                        Ok(t)
                    }
                })
                .unwrap_err();
            assert_eq!(err, "task 2");
            let err = Workers::new(threads)
                .run(vec![1, 2, 3], &[], |t: i32| {
                    assert!(t != 3, "boom");
                    Ok(t)
                })
                .unwrap_err();
            assert!(err.contains("panicked: boom"), "{err}");
        }
    }

    #[test]
    fn work_too_small_to_share_runs_on_the_calling_thread() {
        let workers = Workers::per_core();
        let caller = std::thread::current().id();
        for (size, shared) in [(MIN_SHARED_CELLS - 1, false), (MIN_SHARED_CELLS, true)] {
            let threads = workers
                .for_size(size)
                .run((0..8).collect(), &[], |_: i32| {
                    Ok(std::thread::current().id())
                })
                .unwrap();
            let others = threads.iter().filter(|&&t| t != caller).count();
            if !shared || workers.count() == 1 {
                assert_eq!(others, 0, "{size}");
            }
        }
    }

    /// The tests that use the shared helpers' pool whole, one at a time.
    static WHOLE_POOL: Mutex<()> = Mutex::new(());

    #[test]
    fn the_helpers_are_threads_kept_from_one_call_to_the_next() {
        let _whole = WHOLE_POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let caller = std::thread::current().id();
        let mut helpers = std::collections::HashSet::new();
        for _ in 0..20 {
            // Two tasks long enough for an idle helper to take one (a
            // helper another test holds leaves both to the caller).
            let ids = Workers::new(2)
                .run(vec![0, 1], &[], |_: i32| {
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(std::thread::current().id())
                })
                .unwrap();
            helpers.extend(ids.into_iter().filter(|&t| t != caller));
        }
        // Twenty calls: the same few threads, not twenty started for them.
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert!(
            !helpers.is_empty() && helpers.len() <= cores.saturating_sub(1).max(1),
            "{} helper threads on {cores} cores",
            helpers.len()
        );
    }

    /// A write whose tasks are all done returns at once, even while
    /// another write (another sink, or a check and a write, each from a
    /// tokio worker) has every shared helper busy: it must not block its
    /// thread until a helper is free to run its now empty share.
    #[test]
    fn a_write_does_not_wait_for_another_writes_tasks_on_the_shared_helpers() {
        let _whole = WHOLE_POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let pool = std::thread::available_parallelism()
            .map_or(1, NonZeroUsize::get)
            .saturating_sub(1)
            .max(1);
        let started = std::sync::Arc::new(AtomicUsize::new(0));
        let busy = {
            let started = started.clone();
            std::thread::spawn(move || {
                Workers::new(pool + 1).run((0..pool + 1).collect(), &[], |t: usize| {
                    started.fetch_add(1, Ordering::SeqCst);
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while started.load(Ordering::SeqCst) < pool + 1
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    // Every helper now holds one of this write's tasks.
                    std::thread::sleep(Duration::from_secs(3));
                    Ok(t)
                })
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) < pool + 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let at = std::time::Instant::now();
        let out = Workers::new(2).run(vec![1, 2], &[], Ok).unwrap();
        let took = at.elapsed();
        assert_eq!(out, vec![1, 2]);
        assert!(busy.join().unwrap().is_ok());
        assert!(
            took < Duration::from_millis(500),
            "two trivial tasks took {took:?}: the caller waited for another write's helpers"
        );
    }

    #[test]
    fn no_tasks_give_no_results() {
        let out: Vec<u8> = Workers::new(4).run(Vec::<u8>::new(), &[], Ok).unwrap();
        assert!(out.is_empty());
    }
}
