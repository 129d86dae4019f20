//! The TOML pipeline configuration: its schema, loading, and validation
//! that reports every error with its place in the file.
//!
//! The types here mirror the file's sections; [`pipeline_from_config`]
//! turns them into the library's own configurations
//! (`etl_source::FileSourceConfig`, `etl_sink::SinkDriverConfig`, ...),
//! whose option names and defaults they share. docs/operations.md
//! ("Configuration") is the reference for the file.
//!
//! [`pipeline_from_config`]: https://docs.rs/etl/latest/etl/fn.pipeline_from_config.html

mod checker;
mod interpolate;
mod load;
mod outputs;
mod programs;
mod routes;
mod schema;
mod units;

pub(crate) use interpolate::Secrets;
pub use load::{ConfigError, ConfigProblem};
pub(crate) use load::{parse_with_env, parse_with_process_env};
pub use schema::*;
pub(crate) use schema::{FileSinkTable, FsyncKey, INTERVAL_NEEDS_ITS_LENGTH};
pub use units::ByteSize;
