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
/// It also keeps every thread in one arena of glibc's (`M_ARENA_MAX` 1),
/// unless the environment sets glibc's arenas (`MALLOC_ARENA_MAX`, or
/// `glibc.malloc.arena_max` in `GLIBC_TUNABLES`), which then stand.
/// glibc gives each thread that allocates an arena of its own, up to
/// eight per core, and memory freed in one arena serves only the threads
/// of that arena. With a file source of many input files (a partition
/// each, whose state is built at start by several threads), blocks freed
/// in the arena of the thread that opened the source stayed resident
/// there while the threads that built the rest of the state took new
/// memory in another arena, or not, by how the threads happened to be
/// spread over the arenas. Measured on 100,000 input files
/// (docs/benchmarks.md, "Many files"): peak RSS of a rerun 75.2 MiB with
/// the default arenas, 61.9 MiB with four; with two, most runs 55-60 MiB
/// but about one in four 68-71 MiB (the second arena held about 6 MiB
/// more in one sampled, the first the same); with one, every run and rerun measured
/// 55.4-58.8 MiB. glibc serves most small allocations from a cache of
/// each thread's without taking the arena's lock, and the large buffers
/// are mappings of their own (above): the file-to-file and transform
/// runs took the same time and CPU within the machine's noise (see
/// docs/benchmarks-history.md, "Many files, one copy of each path at
/// open and one arena").
///
/// Fixing the threshold also fixes the size of free memory glibc leaves
/// at the top of its heap before it gives it back to the system at 128
/// KiB (it moves with the threshold otherwise): the heap then shrank and
/// grew again many times a second under a sink writing Parquet, each
/// time faulting its pages in anew. So the trim threshold is set to 4
/// MiB, unless the environment sets it (`MALLOC_TRIM_THRESHOLD_`, or
/// `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`): at most 4 MiB
/// more stays resident. Measured on the lake benchmark's job by hand
/// (docs/benchmarks.md, "The heap's trim threshold"): system time
/// 0.15-0.26 s against 0.39-0.55 s, wall 1.36-1.41 s against 1.48-1.56
/// s, peak RSS the same (58-61 MiB).
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
    /// `M_TRIM_THRESHOLD` in glibc's `malloc.h`.
    const M_TRIM_THRESHOLD: c_int = -1;

    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: `mallopt` sets a parameter of glibc's allocator and takes
    // no pointers; glibc takes its own locks, so any thread may call it.
    // A refusal (0) leaves the default, which is only a memory cost.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        if let Some(bytes) = trim_threshold(
            std::env::var_os("MALLOC_TRIM_THRESHOLD_").as_deref(),
            std::env::var_os("GLIBC_TUNABLES").as_deref(),
        ) {
            mallopt(M_TRIM_THRESHOLD, bytes);
        }
        if let Some(arenas) = arenas(
            std::env::var_os("MALLOC_ARENA_MAX").as_deref(),
            std::env::var_os("GLIBC_TUNABLES").as_deref(),
        ) {
            mallopt(M_ARENA_MAX, arenas);
        }
    }
}

/// The arenas to ask glibc for: one, unless the environment sets them,
/// as `MALLOC_ARENA_MAX` or in `GLIBC_TUNABLES` (`glibc.malloc.arena_max`),
/// which glibc has read then: an operator's choice (more arenas on a
/// machine of many cores, where threads allocating at once would queue on
/// one arena's lock) stands.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn arenas(
    malloc_arena_max: Option<&std::ffi::OsStr>,
    tunables: Option<&std::ffi::OsStr>,
) -> Option<std::ffi::c_int> {
    let tuned = tunables.is_some_and(|t| t.to_string_lossy().contains("glibc.malloc.arena_max"));
    if malloc_arena_max.is_some() || tuned {
        None
    } else {
        Some(1)
    }
}

/// The trim threshold to ask glibc for: 4 MiB, unless the environment
/// sets it, as `MALLOC_TRIM_THRESHOLD_` or in `GLIBC_TUNABLES`
/// (`glibc.malloc.trim_threshold`), which glibc has read then and which
/// stands.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_threshold(
    malloc_trim_threshold: Option<&std::ffi::OsStr>,
    tunables: Option<&std::ffi::OsStr>,
) -> Option<std::ffi::c_int> {
    let tuned =
        tunables.is_some_and(|t| t.to_string_lossy().contains("glibc.malloc.trim_threshold"));
    if malloc_trim_threshold.is_some() || tuned {
        None
    } else {
        Some(4 << 20)
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use std::ffi::OsStr;

    #[test]
    fn one_arena_unless_the_environment_sets_glibcs_arenas() {
        assert_eq!(super::arenas(None, None), Some(1));
        assert_eq!(super::arenas(Some(OsStr::new("8")), None), None);
        let tuned = OsStr::new("glibc.malloc.tcache_count=0:glibc.malloc.arena_max=4");
        assert_eq!(super::arenas(None, Some(tuned)), None);
        let other = OsStr::new("glibc.malloc.tcache_count=0");
        assert_eq!(super::arenas(None, Some(other)), Some(1));
    }

    #[test]
    fn a_trim_threshold_of_4_mib_unless_the_environment_sets_one() {
        assert_eq!(super::trim_threshold(None, None), Some(4 << 20));
        assert_eq!(
            super::trim_threshold(Some(OsStr::new("131072")), None),
            None
        );
        let tuned = OsStr::new("glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1");
        assert_eq!(super::trim_threshold(None, Some(tuned)), None);
        let other = OsStr::new("glibc.malloc.arena_max=2");
        assert_eq!(super::trim_threshold(None, Some(other)), Some(4 << 20));
    }
}

/// Does nothing: only glibc's allocator needs it (see the Linux build's
/// documentation).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_buffers_out_of_the_heap() {}
