//! The integration tests of `etl-cli`, one binary: each module runs the
//! `etl` binary end to end, through `support` (the binary and the usual
//! ways of running it). Run one suite with
//! `cargo test -p etl-cli --test it <module>::`.

mod support;

mod cli;
mod file_inputs;
#[cfg(all(feature = "http", feature = "remap"))]
mod http_examples;
#[cfg(feature = "http")]
mod http_refusals;
#[cfg(feature = "kafka")]
mod kafka_validate;
#[cfg(all(feature = "kafka", feature = "postgres"))]
mod secrets_never_print;
