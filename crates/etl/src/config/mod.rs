//! The TOML pipeline configuration: its schema, loading, and validation
//! that reports every error with its place in the file.

mod interpolate;
mod load;
mod programs;
mod schema;
mod units;

pub use load::{ConfigError, ConfigProblem, load_config, parse_config, parse_config_with_env};
pub use schema::*;
pub use units::ByteSize;
