//! The integration tests of `etl-checkpoint`, one binary: each module is a
//! suite. Run one with `cargo test -p etl-checkpoint --test it <module>::`.
//!
//! Two suites stay binaries of their own. `checkpointer_memory` counts
//! the heap with a global allocator, which cannot be scoped to one test
//! and would count what the other suites allocate meanwhile.
//! `crash_file_store` starts child processes over and over: a child holds
//! a copy of every open file of this process until it runs its program,
//! and with it the `flock` of a store another suite just dropped, so that
//! suite's next open of the store was refused as held by this process
//! (seen in `prop_file_store` when they shared this binary).

mod checkpointer;
mod prop_file_store;
mod prop_tracker;
mod send_sync;
