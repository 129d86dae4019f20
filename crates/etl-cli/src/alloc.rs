//! The allocator setting the `etl` binary starts with.

/// Keep large buffers out of glibc's heap, as the `etl` binary does first
/// in its `main`: a program that runs pipelines in its own binary calls it
/// first in its `main` for the same memory use.
///
/// glibc's allocator gives an allocation of 128 KiB or more a mapping of
/// its own, returned to the system when freed, but only until the first
/// such block is freed: it then raises that threshold to the size freed
/// (up to 32 MiB), so the file source's 256 KiB read buffers and the
/// batches' vectors come from the heap from then on, and what is freed
/// there stays resident among blocks still in use (a record's value is a
/// slice of a read buffer or of a transform's output block, freed when
/// the record is written). Fixing the threshold at 128 KiB keeps those
/// buffers in mappings of their own. Measured on the transform benchmark's
/// nested jobs (docs/benchmarks.md): peak RSS 61-72 MiB with the moving
/// threshold, 40-44 MiB with it fixed, the same run time.
///
/// It also caps glibc's arenas at two (`M_ARENA_MAX`). glibc gives each
/// thread that allocates an arena of its own, up to eight per core, and
/// memory freed in one arena serves only the threads of that arena: with
/// a file source of many input files (a partition each, whose state is
/// allocated at start by a few threads and freed by others), every arena
/// keeps its own freed blocks resident. Measured on 100,000 input files
/// (docs/benchmarks.md, "Many files"): peak RSS of a rerun 75.2 MiB with
/// the default arenas, 61.9 MiB with four, 58.7 MiB with two (one rerun
/// each; with two, some runs still reach about 70 MiB, with how the
/// threads share them), and the file-to-file row's rate unchanged. On
/// a machine of more cores the cap is one arena per core (glibc's default
/// is eight), so threads allocating at once on every core do not queue
/// on one arena's lock.
///
/// ```
/// // First in `main`, then build and run pipelines.
/// etl_cli::keep_large_buffers_out_of_the_heap();
/// ```
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // mallopt: the measured need above.
pub fn keep_large_buffers_out_of_the_heap() {
    use std::ffi::c_int;

    /// `M_MMAP_THRESHOLD` in glibc's `malloc.h`.
    const M_MMAP_THRESHOLD: c_int = -3;
    /// `M_ARENA_MAX` in glibc's `malloc.h`.
    const M_ARENA_MAX: c_int = -8;

    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: `mallopt` sets a parameter of glibc's allocator and takes
    // no pointers; glibc takes its own locks, so any thread may call it.
    // A refusal (0) leaves the default, which is only a memory cost.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        mallopt(M_ARENA_MAX, arenas());
    }
}

/// glibc's arenas: one per core the process may run on, two at least.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn arenas() -> std::ffi::c_int {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    std::ffi::c_int::try_from(cores.max(2)).unwrap_or(std::ffi::c_int::MAX)
}

/// Does nothing: only glibc's allocator needs it (see the Linux build's
/// documentation).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_buffers_out_of_the_heap() {}
