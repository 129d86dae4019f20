//! The integration tests of `etl-sink`, one binary: each module is a
//! suite. The batches they hand the sinks, and what became of each, come
//! from `etl_test_support::acks`, shared with the connectors' tests. Run
//! one suite with `cargo test -p etl-sink --test it <module>::`.

mod driver;
mod example;
mod failure_kinds;
mod fence;
mod file_sink;
mod prop_driver;
mod send_sync;
mod settle;
mod testing_wrappers;
mod writing_a_sink;
