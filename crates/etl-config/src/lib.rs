//! The TOML configuration language of the `etl` pipelines: its schema
//! ([`config`]), loading with `${VAR}` interpolation and units
//! ([`Registry::loader`], [`ConfigLoader`]: every problem reported at its
//! line and column), and the [`Registry`] every source, sink and transform
//! type plugs into, the built-ins included.
//!
//! This crate knows no runtime: `etl::pipeline_from_config` (crate `etl`)
//! builds a pipeline from a [`Config`], and the connectors with heavy
//! dependencies (`kafka`, `postgres`) register from their glue in `etl`
//! (`etl::registry()`).
//!
//! # Example
//!
//! ```
//! let config = etl_config::Registry::new().loader().text(
//!     r#"
//!     [source]
//!     type = "generator"
//!     records_per_partition = 10
//!
//!     [[sinks]]
//!     type = "blackhole"
//!     batch_max_records = 0
//!     "#,
//!     ".".as_ref(),
//! );
//! // Every problem with its place.
//! let problems = config.unwrap_err();
//! assert_eq!((problems[0].line, problems[0].column), (8, 5));
//! assert_eq!(problems[0].message, "batch_max_records must be at least 1");
//! ```

pub mod config;
mod connectors;
mod registry;

// The transform interface and the engine's programs, by the names the
// modules use.
#[cfg(feature = "remap")]
use etl_json::{VrlError, VrlProgram};
use etl_transform::Transform;

pub use config::{CompareOp, Config, ConfigError, ConfigProblem, FailurePolicy, RouteMode};
pub use registry::{
    BoxError, BoxFuture, BoxedProgressSink, BuildError, BuiltSink, BuiltSource, CheckReport,
    Component, ComponentContext, ConfigLoader, ContextParts, ErrorKind, ErrorKindFn, ProgressCheck,
    RedactedError, Registry, SinkHold, SinkPlugin, SourcePlugin, SourceStart, StartWithHandle,
};
