//! The units of the configuration file, one form for every crate:
//! durations ([`duration`]) and sizes ([`ByteSize`]).
//!
//! A duration is written as text with its unit (`"500ms"`, `"30s"`,
//! `"2m 30s"`, parsed by `humantime`), never as a bare integer whose unit
//! is in the key's name (`timeout_ms = 500`). The configuration language
//! (`etl-config`) and the connector crates that read their own tables
//! (Kafka, PostgreSQL) all deserialize durations through
//! [`duration::deserialize`], so a value means the same and a mistake
//! reads the same everywhere.
//!
//! ```
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Options {
//!     #[serde(deserialize_with = "etl_units::duration::deserialize")]
//!     connect_timeout: Duration,
//! }
//!
//! let options: Options = serde::Deserialize::deserialize(
//!     serde::de::value::MapDeserializer::<_, serde::de::value::Error>::new(
//!         [("connect_timeout", "10s")].into_iter(),
//!     ),
//! )
//! .unwrap();
//! assert_eq!(options.connect_timeout, Duration::from_secs(10));
//! ```

#![forbid(unsafe_code)]

pub mod duration;
pub mod size;

pub use duration::{DurationError, MAX_DURATION};
pub use size::{ByteSize, SizeError};
