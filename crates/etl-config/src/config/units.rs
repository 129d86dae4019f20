//! Human-friendly units in the configuration: sizes ("64MiB") and
//! durations ("1s", "250ms"), read by `etl-units` as in every crate.

pub use etl_units::ByteSize;

/// Durations, read as every crate reads them (`"1s"`, `"250ms"`, `"2m
/// 30s"`, at most a year): see [`etl_units::duration`].
pub(crate) use etl_units::duration::{deserialize as duration, deserialize_option as opt_duration};
