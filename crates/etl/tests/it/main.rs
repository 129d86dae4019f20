//! The integration tests of `etl`, one binary: each module is a suite of
//! the runtime, the configuration it is built from, or the examples. Run
//! one with `cargo test -p etl --test it <module>::`.
//!
//! Three suites stay binaries of their own. The two simulations
//! (`tests/sim.rs`, `tests/storage_sim.rs`): `cargo xtask sim` runs them by
//! name with a case count of their own. `tests/shutdown_signal.rs` sends
//! its own process signals and starts itself as a child: a child holds a
//! copy of every open file of this process until it runs its program, and
//! with it the `flock` of an offset store or output another suite has just
//! dropped and is opening again, which would then be refused as held.

mod builder_from_config;
mod config;
mod config_env;
mod exactly_once_assignment;
mod examples;
mod ownership;
mod registry;
mod remap_config;
#[cfg(feature = "remap")]
mod remap_corpus;
#[cfg(feature = "remap")]
mod remap_examples;
#[cfg(feature = "remap")]
mod remap_metadata;
mod revoke_fence;
mod runtime;
mod send_sync;
mod sink_batches;
mod sink_failures;
