//! The integration tests of `etl-sink`, one binary: each module is a
//! suite, and `support` holds what they share (a source of acked batches
//! and a tally of their resolutions). Run one suite with
//! `cargo test -p etl-sink --test it <module>::`.

mod support;

mod driver;
mod example;
mod failure_kinds;
mod file_sink;
mod prop_driver;
mod send_sync;
mod writing_a_sink;
