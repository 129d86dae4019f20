//! The integration tests of `etl-source`, one binary: each module is a
//! suite. Run one with `cargo test -p etl-source --test it <module>::`.
//!
//! `file_source_memory` stays a binary of its own: it measures the heap
//! with a global allocator, which cannot be scoped to one test and would
//! count what the other suites allocate meanwhile.

mod driver;
mod driver_abort;
mod file_source;
mod memory_log;
